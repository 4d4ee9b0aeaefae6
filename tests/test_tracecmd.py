"""trace-cmd's trace.dat (nestrace.tracecmd): real files, recorded here from
the kernel's block tracepoints and written by trace-cmd itself in its
three layouts (version 7 zstd-compressed, its default; version 7
uncompressed; version 6), read event for event as `trace-cmd report`
reads them, imported, and damaged."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import nestrace
from conftest import loop_devices, run_cli
from nestrace import tracecmd

TRACING = Path("/sys/kernel/tracing")
EVENTS = ("block_bio_queue", "block_bio_backmerge", "block_bio_frontmerge", "block_getrq",
          "block_split", "block_rq_insert", "block_rq_issue", "block_rq_requeue",
          "block_rq_complete")
READS, WRITES = 512, 64
NAMES = {v: k for k, v in tracecmd.BLOCK_ACTIONS.items()}


@pytest.fixture(scope="module")
def dats(tmp_path_factory):
    """O_DIRECT reads and writes on a loop device with the block tracepoints
    enabled by hand (trace-cmd record cannot enable ftrace on this kernel),
    the buffer saved by `trace-cmd extract`, and the file converted.  The
    events are disabled and the loop device detached whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("needs root: enables kernel tracepoints and attaches a loop device")
    if not shutil.which("trace-cmd"):
        pytest.fail("no trace-cmd (Debian package trace-cmd; ci/setup installs it)")
    if (TRACING / "tracing_on").read_text().strip() != "1":
        pytest.fail(f"{TRACING}/tracing_on is 0: no event would be recorded")
    tmp = tmp_path_factory.mktemp("tracecmd")
    img = tmp / "disk.img"
    subprocess.run(["truncate", "-s", "64M", str(img)], check=True)
    before = loop_devices()
    loop, enabled = None, []
    try:
        loop = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(img)],
                              check=True, capture_output=True, text=True).stdout.strip()
        rdev = os.stat(loop).st_rdev
        dev = (os.major(rdev) << 20) | os.minor(rdev)
        # empty the buffer of what other tracers left (nothing is enabled now)
        subprocess.run(["trace-cmd", "extract", "-o", str(tmp / "before.dat")],
                       check=True, capture_output=True)
        for e in EVENTS:
            f = TRACING / "events" / "block" / e / "enable"
            f.write_text("1\n")
            enabled.append(f)
        subprocess.run(["dd", f"if={loop}", "of=/dev/null", "bs=4k", f"count={READS}",
                        "iflag=direct"], check=True, capture_output=True)
        subprocess.run(["dd", "if=/dev/zero", f"of={loop}", "bs=64k", f"count={WRITES}",
                        "oflag=direct"], check=True, capture_output=True)
    finally:
        for f in enabled:
            f.write_text("0\n")
        if loop:
            subprocess.run(["losetup", "-d", loop], check=True)
        assert loop_devices() <= before, "a loop device was left attached"
    v7z = tmp / "trace.dat"
    subprocess.run(["trace-cmd", "extract", "-o", str(v7z)], check=True, capture_output=True)
    files = {"v7 zstd": v7z, "v7": tmp / "v7.dat", "v6": tmp / "v6.dat"}
    subprocess.run(["trace-cmd", "convert", "-i", str(v7z), "-o", str(files["v7"]),
                    "--compression", "none"], check=True, capture_output=True)
    subprocess.run(["trace-cmd", "convert", "-i", str(v7z), "-o", str(files["v6"]),
                    "--file-version", "6", "--compression", "none"], check=True,
                   capture_output=True)
    return files, dev, loop


_LINE = re.compile(r"\[(\d+)\]\s+(\d+)\.(\d+):\s+(block_\w+):\s+(\d+),(\d+)\s+(\S+)\s+(.*)")


def report_events(path: Path) -> Counter:
    """What `trace-cmd report -t` (full-precision times) reads: (cpu, ns,
    event, dev, rwbs, sector, sectors, new sector) per block event; a split
    prints "sector / new sector", with no size (0 sectors)."""
    out = subprocess.run(["trace-cmd", "report", "-t", "-i", str(path)], check=True,
                         capture_output=True, text=True).stdout
    got = Counter()
    for line in out.splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        cpu, sec, frac, ev, major, minor, rwbs, rest = m.groups()
        pos = re.search(r"(\d+) \+ (\d+)", rest)
        split = re.match(r"(\d+) / (\d+)", rest) if ev == "block_split" else None
        sector, sectors = (int(pos[1]), int(pos[2])) if pos else \
            (int(split[1]), 0) if split else (None, None)
        got[(int(cpu), int(sec) * 10**9 + int(frac.ljust(9, "0")), ev, (int(major) << 20) | int(minor),
             rwbs, sector, sectors, int(split[2]) if split else None)] += 1
    return got


def our_events(path: Path) -> Counter:
    t = tracecmd.read(path).table.to_pylist()
    # (a split's new sector is its pdu, big-endian, as in blktrace)
    return Counter((r["cpu"], r["time_ns"], NAMES[r["action_code"]], r["dev"], r["rwbs"],
                    r["sector"], r["bytes"] // 512,
                    int.from_bytes(r["pdu"], "big") if NAMES[r["action_code"]] == "block_split"
                    else None) for r in t)


@pytest.mark.root
@pytest.mark.parametrize("layout", ["v7 zstd", "v7", "v6"])
def test_every_block_event_is_read_as_trace_cmd_reads_it(dats, layout):
    files, dev, _ = dats
    path = files[layout]
    r = tracecmd.read(path)
    assert r.dat.version == (6 if layout == "v6" else 7)
    assert r.dat.compression == ("zstd" if layout == "v7 zstd" else "none")
    assert r.problems == [] and r.lost == {} and r.other == {}
    ours, theirs = our_events(path), report_events(path)
    assert sum(theirs.values()) == r.table.num_rows > 0
    assert ours == theirs
    on_loop = Counter(k[2] for k in ours.elements() if k[3] == dev)
    assert on_loop["block_bio_queue"] >= READS + WRITES
    assert on_loop["block_rq_issue"] >= READS + WRITES
    assert on_loop["block_rq_complete"] >= READS + WRITES


@pytest.mark.root
def test_an_imported_trace_pairs_into_requests(dats, tmp_path):
    files, dev, _ = dats
    store = tmp_path / "s"
    r = run_cli("import", str(files["v7 zstd"]), "-o", str(store),
                "--vdisk", f"{dev >> 20}:{dev & 0xFFFFF}")
    assert re.search(r"capture tracecmd-trace: \d+ block events", r.stdout)
    s = nestrace.open(store)
    reqs = {row["op"]: row for row in s.rows(
        "SELECT op, count(*) AS n, sum(bytes) AS b, count(q2c_ns) AS q2c, count(d2c_ns) AS d2c "
        "FROM block_requests WHERE level = 'vdisk' GROUP BY op")}
    assert reqs["read"] == {"op": "read", "n": READS, "b": READS * 4096, "q2c": READS,
                            "d2c": READS}
    assert reqs["write"]["b"] == WRITES * 65536 and reqs["write"]["d2c"] == reqs["write"]["n"]
    meta = s.rows("SELECT clock, lost_total, kernel FROM capture_meta")[0]
    assert meta["clock"] == "ftrace local" and meta["lost_total"] == 0
    assert meta["kernel"] == os.uname().release
    assert run_cli("report", "--json", str(store)).returncode == 0
    # the same events from the version 6 file: the same requests
    run_cli("import", str(files["v6"]), "-o", str(store), "--capture-id", "v6")
    assert s.rows("SELECT count(*) AS n FROM block_requests WHERE capture_id = 'v6' "
                  "AND dev = ?", [dev]) == [{"n": READS + reqs["write"]["n"]}]


@pytest.mark.root
def test_a_damaged_page_is_named_and_the_other_pages_are_read(dats, tmp_path):
    files, _, _ = dats
    src = files["v6"]
    clean = tracecmd.read(src)
    offs = Counter(clean.table.column("file_offset").to_pylist())
    page, n_page = max(offs.items(), key=lambda kv: kv[1])
    bad = tmp_path / "bad.dat"
    data = bytearray(src.read_bytes())
    data[page + 8:page + 16] = (1 << 20).to_bytes(8, "little")     # commit past the page
    bad.write_bytes(bytes(data))
    r = tracecmd.read(bad)
    assert len(r.problems) == 1
    assert re.search(rf"{bad}: cpu \d+, page at byte \d+ of its data \(file offset {page}\): "
                     r"commit 1048576 runs past the page", r.problems[0]), r.problems
    assert r.table.num_rows == clean.table.num_rows - n_page
    rc = run_cli("import", str(bad), "-o", str(tmp_path / "s"), check=False)
    assert rc.returncode == 0 and "commit 1048576 runs past the page" in rc.stderr


@pytest.mark.root
def test_bad_files_name_the_file_and_the_offset(dats, tmp_path):
    files, _, _ = dats
    whole = files["v7 zstd"].read_bytes()
    cut = tmp_path / "cut.dat"
    cut.write_bytes(whole[:200])
    with pytest.raises(tracecmd.TraceCmdError, match=rf"{cut}: offset \d+: .*bytes needed"):
        tracecmd.read(cut)
    v9 = tmp_path / "v9.dat"
    v9.write_bytes(tracecmd.MAGIC + b"9\0" + whole[len(tracecmd.MAGIC) + 2:])
    with pytest.raises(tracecmd.TraceCmdError, match=rf"{v9}: offset 10: trace-cmd file version '9'"):
        tracecmd.read(v9)
    r = run_cli("import", str(cut), "-o", str(tmp_path / "s"), check=False)
    assert r.returncode == 2 and f"{cut}: offset" in r.stderr
    assert not (tmp_path / "s").exists()
    # a damaged zstd frame (zstandard's own error is no ValueError: it escaped)
    frame = whole.find(b"\x28\xb5\x2f\xfd")
    assert frame > 0
    z = tmp_path / "z.dat"
    z.write_bytes(whole[:frame + 12] + bytes([whole[frame + 12] ^ 0xFF]) + whole[frame + 13:])
    with pytest.raises(tracecmd.TraceCmdError,
                       match=rf"{z}: offset \d+: zstd data does not decompress: .*corruption"):
        tracecmd.read(z)


def test_rwbs_letters_become_blktrace_categories():
    from nestrace import blktrace as bt
    for rwbs, cats in [("R", 0), ("RA", bt.TC_AHEAD), ("WS", bt.TC_WRITE | bt.TC_SYNC),
                       ("FWFS", bt.TC_FLUSH | bt.TC_WRITE | bt.TC_FUA | bt.TC_SYNC),
                       ("F", bt.TC_FLUSH), ("FF", bt.TC_FLUSH), ("D", bt.TC_DISCARD),
                       ("DE", bt.TC_DISCARD), ("N", 0), ("RM", bt.TC_META)]:
        assert tracecmd.rwbs_categories(rwbs) == cats, rwbs
