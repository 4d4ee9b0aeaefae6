"""trace-cmd's trace.dat (nestrace.importers.tracecmd): real files, recorded here from
the kernel's block tracepoints and written by trace-cmd itself in its
three layouts (version 7 zstd-compressed, its default; version 7
uncompressed; version 6), read event for event as `trace-cmd report`
reads them, imported, and damaged."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import loop_devices, run_cli

import nestrace
from nestrace.importers import blktrace as bt
from nestrace.importers import datfile, datimport, tracecmd

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
        extract(tmp / "before.dat")
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
    extract(v7z)
    files = {"v7 zstd": v7z, "v7": tmp / "v7.dat", "v6": tmp / "v6.dat"}
    subprocess.run(["trace-cmd", "convert", "-i", str(v7z), "-o", str(files["v7"]),
                    "--compression", "none"], check=True, capture_output=True)
    subprocess.run(["trace-cmd", "convert", "-i", str(v7z), "-o", str(files["v6"]),
                    "--file-version", "6", "--compression", "none"], check=True,
                   capture_output=True)
    return files, dev, loop


def extract(out: Path) -> None:
    """`trace-cmd extract -o out`.  It turns tracing off while it reads
    and, when it fails, leaves it off (every later ftrace test then
    records nothing): tracing is turned back on, and a failure (once in
    CI, EINVAL with the other run's tests beside it) is tried once more,
    then raised with trace-cmd's own words."""
    for attempt in (1, 2):
        r = subprocess.run(["trace-cmd", "extract", "-o", str(out)], capture_output=True,
                           text=True)
        (TRACING / "tracing_on").write_text("1\n")
        if r.returncode == 0:
            return
        if attempt == 2:
            raise AssertionError(f"trace-cmd extract -o {out}: exit {r.returncode}: "
                                 f"{(r.stderr or r.stdout).strip()[-500:]}")
        time.sleep(1)


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
             blkparse_rwbs(rwbs), sector, sectors, int(split[2]) if split else None)] += 1
    return got


def blkparse_rwbs(kernel: str) -> str:
    """The kernel's rwbs letters (what trace-cmd prints) as blkparse's,
    which the store keeps: a flush request is F (a preflush) then F (the
    flush op) in the kernel's, F then N (no data) in blkparse's."""
    if kernel.startswith("FF"):
        return "FN" + kernel[2:]
    if kernel[:1] == "F" and (len(kernel) == 1 or kernel[1] not in "RWDN"):
        return "FN" + kernel[1:]
    return kernel


def our_events(path: Path) -> Counter:
    t = tracecmd.read(path).table.to_pylist()
    # (a split's new sector is its pdu, big-endian, as in blktrace)
    return Counter((r["cpu"], r["time_ns"], NAMES[r["action_code"]], r["dev"], r["rwbs"],
                    r["sector"], r["bytes"] // 512,
                    int.from_bytes(r["pdu"], "big") if NAMES[r["action_code"]] == "block_split"
                    else None) for r in t)


@pytest.mark.root
@pytest.mark.parametrize("layout", ["v7 zstd", "v7", "v6"])
@pytest.mark.parametrize("window", [tracecmd.WINDOW, 4096])
def test_every_block_event_is_read_as_trace_cmd_reads_it(dats, layout, window, monkeypatch):
    """Read as the file is, and a page at a time (windows of one page)."""
    monkeypatch.setattr(tracecmd, "WINDOW", window)
    files, dev, _ = dats
    path = files[layout]
    r = tracecmd.read(path)
    assert r.dat.version == (6 if layout == "v6" else 7)
    assert r.dat.compression == ("zstd" if layout == "v7 zstd" else "none")
    assert r.problems == [] and r.lost == {} and r.other == {}
    ours, theirs = our_events(path), report_events(path)
    assert sum(theirs.values()) == r.table.num_rows > 0
    if ours != theirs:
        pytest.fail(mismatch(path, r, ours, theirs))
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
    # (the import stored them: the SQL pairs the events the same way)
    from test_requests import assert_stored_as_computed
    assert assert_stored_as_computed(store) >= READS + reqs["write"]["n"]   # (and other disks)
    # the same events from the version 6 file: the same requests (a
    # session reads the captures published when it was opened)
    run_cli("import", str(files["v6"]), "-o", str(store), "--capture-id", "v6")
    s = nestrace.open(store)
    assert s.rows("SELECT count(*) AS n FROM block_requests WHERE capture_id = 'v6' "
                  "AND dev = ?", [dev]) == [{"n": READS + reqs["write"]["n"]}]


@pytest.mark.root
@pytest.mark.parametrize("layout", ["v7 zstd", "v7", "v6"])
def test_a_streamed_import_stores_what_the_whole_read_stores(dats, tmp_path, monkeypatch,
                                                             layout):
    """Windows of one page, and small row groups and request parts: every
    seam of the stream is crossed, the CPUs' pages merged by time."""
    from test_blkstream import assert_same_stores

    from nestrace.importers import blkimport, requests
    monkeypatch.setattr(tracecmd, "WINDOW", 4096)
    monkeypatch.setattr(blkimport, "ROW_GROUP", 97)
    monkeypatch.setattr(requests.RequestStream, "PART", 41)
    files, dev, _ = dats
    r = datimport.import_file(files[layout], tmp_path / "s", {dev: "vdisk"}, "imp")
    assert r.pop("read") == "streamed"
    w = datimport._import_whole(files[layout], tmp_path / "w", {dev: "vdisk"}, "imp", "")
    assert r == w and r["block_events"] > 3 * (READS + WRITES)
    assert_same_stores(tmp_path / "s", tmp_path / "w")


@pytest.mark.root
@pytest.mark.parametrize("window", [tracecmd.WINDOW, 4096])
def test_a_damaged_page_is_named_and_the_other_pages_are_read(dats, tmp_path, window,
                                                              monkeypatch):
    """Read as the file is, and a page at a time: the same page named."""
    monkeypatch.setattr(tracecmd, "WINDOW", window)
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
    # (the page's data skipped: its size less its time and commit words)
    data_size = r.dat.page_size - 8 - r.dat.long_size
    assert r.damage == bt.Damage(places=1, bytes=data_size, records=1), r.damage
    rc = run_cli("import", str(bad), "-o", str(tmp_path / "s"), check=False)
    assert rc.returncode == 0 and "commit 1048576 runs past the page" in rc.stderr
    # (the stream leaves damage to the whole read, and says so)
    assert re.search(r"note: read whole, not streamed \(.*commit 1048576 runs past the page",
                     rc.stderr), rc.stderr
    # in the store: the damage, and the record it hid among the lost
    [m] = nestrace.open(tmp_path / "s").rows("SELECT lost_total, stack_json FROM capture_meta")
    assert json.loads(m["stack_json"])["damaged"] == {
        "places": 1, "bytes": data_size, "records_at_least": 1}, m
    assert m["lost_total"] == sum(clean.lost.values()) + 1, m


def raw_records(data: bytes, page: int, long_size: int) -> list[tuple[int, int, int, int]]:
    """(byte in the page, type_len, time delta, length in bytes) of every
    record of the page at `page` (a v6 or uncompressed v7 file's: a page
    header of 8 bytes of time and a commit word, then the records), with
    the kernel's sizes (ring_buffer.c, rb_event_length): a discarded event
    (padding with a delta) is 4 bytes and its array[0]."""
    commit_off = 8
    data_off = commit_off + long_size
    used = int.from_bytes(data[page + commit_off:page + data_off], "little") & tracecmd.COMMIT_MASK
    out, p, end = [], page + data_off, page + data_off + used
    while p < end:
        h = int.from_bytes(data[p:p + 4], "little")
        tl, delta = h & 0x1F, h >> 5
        if tl == tracecmd.TYPE_PADDING and delta == 0:
            break
        word = int.from_bytes(data[p + 4:p + 8], "little")
        length = (4 + word if tl in (0, tracecmd.TYPE_PADDING) else
                  8 if tl in (tracecmd.TYPE_TIME_EXTEND, tracecmd.TYPE_TIME_STAMP) else 4 + 4 * tl)
        out.append((p - page, tl, delta, length))
        p += (length + 3) & ~3
    return out


def page_records(dat, data: bytes, page: int) -> list[tuple[int, int, int]]:
    """(byte in the page, event id, where its fields start) of each event
    record of the page at `page`."""
    out = []
    for at, tl, _, _ in raw_records(data, page, dat.long_size):
        if tl < tracecmd.TYPE_PADDING:
            ev = page + at + (8 if tl == 0 else 4)
            out.append((at, int.from_bytes(data[ev:ev + 2], "little"), ev))
    return out


def mismatch(path: Path, r, ours: Counter, theirs: Counter) -> str:
    """What differs, short enough to be read in a CI log's tail: the
    first events only one side read, by CPU, and the records (type, delta,
    length) of the page of the first event only we read (a CI run at
    ef832df, beside another run's load, read CPU 0's last events at
    other times than trace-cmd: its whole Counter diff did not show ours)."""
    only_ours, only_theirs = ours - theirs, theirs - ours
    lines = [f"{path}: {sum(only_ours.values())} events only we read, "
             f"{sum(only_theirs.values())} only trace-cmd report did"]
    for name, side in [("only ours", only_ours), ("only trace-cmd's", only_theirs)]:
        by_cpu = Counter(k[0] for k in side.elements())
        lines.append(f"{name} by cpu: {dict(by_cpu)}; first: ")
        lines += [f"  {k}" for k in sorted(side)[:6]]
    if only_ours and r.dat.compression == "none":
        first = min(only_ours)
        rows = r.table.to_pylist()
        page = next(row["file_offset"] for row in rows
                    if (row["cpu"], row["time_ns"], row["sector"]) == (first[0], first[1], first[5]))
        data = path.read_bytes()
        recs = raw_records(data, page, r.dat.long_size)
        lines.append(f"the page at file offset {page} (time "
                     f"{int.from_bytes(data[page:page + 8], 'little')}): {len(recs)} records, "
                     "those not events (at, type_len, delta, length): "
                     + str([rec for rec in recs if rec[1] >= tracecmd.TYPE_PADDING]))
    return "\n".join(lines)


def read_as_trace_cmd(bad: Path, data: bytes, rows: int):
    """Write the made file, read it: no problem, `rows` block events, and
    each the one `trace-cmd report` reads."""
    bad.write_bytes(bytes(data))
    r = tracecmd.read(bad)
    assert r.problems == [] and r.other == {}
    assert r.table.num_rows == rows
    ours, theirs = our_events(bad), report_events(bad)
    assert sum(theirs.values()) == r.table.num_rows
    if ours != theirs:
        pytest.fail(mismatch(bad, r, ours, theirs))
    return r


@pytest.mark.root
def test_discarded_events_are_passed_over_as_trace_cmd_does(dats, tmp_path):
    """The kernel leaves an event it discards (a filter said no, after the
    record was written) in place as padding with a time delta, its array[0]
    the length less the header (rb_event_discard); its delta stands.  Made
    here from a real file: a discard in the middle of a page and as its
    last record, on every CPU."""
    files, _, _ = dats
    src = files["v6"]
    dat, _ = datfile.open_dat(src)
    clean = tracecmd.read(src)
    data = bytearray(src.read_bytes())
    discarded = 0
    for page in sorted(set(clean.table.column("file_offset").to_pylist())):
        recs = [(at, tl, delta, n) for at, tl, delta, n in raw_records(data, page, dat.long_size)
                if tl < tracecmd.TYPE_PADDING and delta > 0]
        # the middle one and the last (one record, when a page has one alone)
        for at, tl, delta, n in sorted(set(recs[len(recs) // 2:len(recs) // 2 + 1] + recs[-1:])):
            data[page + at:page + at + 8] = (((delta << 5) | tracecmd.TYPE_PADDING).to_bytes(4, "little")
                                             + (n - 4).to_bytes(4, "little"))
            discarded += 1
    assert discarded > 4
    read_as_trace_cmd(tmp_path / "discards.dat", data, clean.table.num_rows - discarded)


@pytest.mark.root
def test_absolute_time_stamps_are_read_as_trace_cmd_reads_them(dats, tmp_path):
    """A writer that finds its time stamps out of step (an interrupt wrote
    between its reads of the clock) writes the full time in a TIME_STAMP
    record (type_len 31: the low 27 bits in the header, the rest in
    array[0]; ring_buffer.c rb_add_timestamp).  Made here from a real file:
    in the middle of every page an event becomes a TIME_STAMP of a time
    before it, then a discard whose delta brings the clock back to the
    event's time, so the events after it keep theirs only when both records
    are read as the kernel wrote them.  (A reader that took the stamp for a
    delta, or passed over it, would put the rest of the page elsewhere.)"""
    files, _, _ = dats
    src = files["v6"]
    dat, _ = datfile.open_dat(src)
    clean = tracecmd.read(src)
    data = bytearray(src.read_bytes())
    rows = clean.table.select(["file_offset", "time_ns"]).to_pylist()
    stamped = 0
    for page in sorted({r["file_offset"] for r in rows}):
        recs = raw_records(data, page, dat.long_size)
        ts = int.from_bytes(data[page:page + 8], "little")
        times = []
        for at, tl, delta, n in recs:
            word = int.from_bytes(data[page + at + 4:page + at + 8], "little")
            if tl == tracecmd.TYPE_TIME_EXTEND:
                ts += (word << tracecmd.TS_SHIFT) + delta
            elif tl == tracecmd.TYPE_TIME_STAMP:    # the kernel's own (rb_fix_abs_ts)
                ts = ts & ~((1 << 59) - 1) | word << tracecmd.TS_SHIFT | delta
            elif tl <= tracecmd.TYPE_PADDING:      # an event, or a discard's delta
                ts += delta
            times.append(ts)
        events = [i for i, (_, tl, _, n) in enumerate(recs) if tl < tracecmd.TYPE_PADDING and n >= 16]
        if len(events) < 3:
            continue
        i = events[len(events) // 2]
        at, _, _, n = recs[i]
        stamp = times[i] - 1000
        low, high = stamp & ((1 << tracecmd.TS_SHIFT) - 1), stamp >> tracecmd.TS_SHIFT
        data[page + at:page + at + 8] = ((low << 5 | tracecmd.TYPE_TIME_STAMP).to_bytes(4, "little")
                                         + high.to_bytes(4, "little"))
        data[page + at + 8:page + at + 16] = (((1000 << 5) | tracecmd.TYPE_PADDING).to_bytes(4, "little")
                                              + (n - 12).to_bytes(4, "little"))
        stamped += 1
    assert stamped > 4
    r = read_as_trace_cmd(tmp_path / "stamps.dat", data, clean.table.num_rows - stamped)
    # the clean file's times, less the events that became stamps
    assert set(r.table.column("time_ns").to_pylist()) <= {x["time_ns"] for x in rows}


@pytest.mark.root
def test_fields_no_kernel_writes_leave_the_record_out_and_name_it(dats, tmp_path):
    """A block event whose nr_sector is 2^31 - 1 (found by fuzzing: it
    failed the whole read with numpy's OverflowError), and a page whose
    time is 2^64 - 1 (so were the times after it): named, left out, the
    rest read."""
    files, _, _ = dats
    src = files["v6"]
    clean = tracecmd.read(src)
    offs = Counter(clean.table.column("file_offset").to_pylist())
    page, n_page = max(offs.items(), key=lambda kv: kv[1])
    data = bytearray(src.read_bytes())
    dat, _ = datfile.open_dat(src)
    at, eid, ev = next((at, eid, ev) for at, eid, ev in page_records(dat, data, page)
                       if dat.formats.get(eid) and dat.formats[eid].name in tracecmd.BLOCK_ACTIONS
                       and "nr_sector" in dat.formats[eid].fields)
    name, nr = dat.formats[eid].name, dat.formats[eid].fields["nr_sector"]
    bad = tmp_path / "nr.dat"
    data[ev + nr.offset:ev + nr.offset + nr.size] = (2**31 - 1).to_bytes(nr.size, "little")
    bad.write_bytes(bytes(data))
    r = tracecmd.read(bad)
    assert len(r.problems) == 1 and re.fullmatch(
        rf"{bad}: cpu \d+, page at byte \d+ of its data \(file offset {page}\): a {name} "
        rf"record at byte {at}: nr_sector 2147483647 \(a request holds under 4 GiB\): a damaged "
        "record, left out", r.problems[0]), r.problems
    assert r.table.num_rows == clean.table.num_rows - 1
    data = bytearray(src.read_bytes())
    data[page:page + 8] = (2**64 - 1).to_bytes(8, "little")
    late = tmp_path / "time.dat"
    late.write_bytes(bytes(data))
    r = tracecmd.read(late)
    first = next(at for at, eid, _ in page_records(dat, data, page) if eid in
                 {e for e, f in dat.formats.items() if f.name in tracecmd.BLOCK_ACTIONS})
    assert len(r.problems) == 1 and re.search(
        rf"\(file offset {page}\): a block_\w+ record at byte {first}: time 1844674407370\d+ "
        r"\(past 2\^63\): the page's times are damaged, rest of the page skipped$",
        r.problems[0]), r.problems
    assert r.table.num_rows == clean.table.num_rows - n_page
    rc = run_cli("import", str(late), "-o", str(tmp_path / "s"), check=False)
    assert rc.returncode == 0 and "the page's times are damaged" in rc.stderr, rc.stderr


@pytest.mark.root
def test_an_offset_option_that_is_no_number_is_named(dats, tmp_path):
    """Before, an OFFSET option that did not parse was passed over: every
    time would have been off by it, unsaid.  (The uname option made an
    OFFSET option: its text is no number.)"""
    files, _, _ = dats
    src = files["v6"]
    dat, _ = datfile.open_dat(src)
    data = bytearray(src.read_bytes())
    at = data.find(dat.uname.encode() + b"\0") - 6
    assert int.from_bytes(data[at:at + 2], "little") == datfile.OPT_UNAME
    data[at:at + 2] = datfile.OPT_OFFSET.to_bytes(2, "little")
    bad = tmp_path / "offset.dat"
    bad.write_bytes(bytes(data))
    with pytest.raises(datfile.TraceCmdError,
                       match=rf"^{bad}: offset {at + 6}: OFFSET option 'Linux .*' is not a number "
                             "of nanoseconds$"):
        tracecmd.read(bad)


@pytest.mark.root
@pytest.mark.parametrize("kind", ["v7 zstd", "v7", "v6"])
def test_damaged_copies_are_read_or_named(dats, tmp_path, kind):
    """2,000 mutants of each version (tests/fuzzer.py: found a field with
    no name in a format, a damaged chunk size allocated whole before zstd
    read the chunk, a missed-events count past any ring buffer's)"""
    from test_fuzz import fuzz
    base = tmp_path / "base.dat"
    shutil.copy(dats[0][kind], base)
    fuzz("dat", base, 2000)


@pytest.mark.root
def test_bad_files_name_the_file_and_the_offset(dats, tmp_path):
    files, _, _ = dats
    whole = files["v7 zstd"].read_bytes()
    cut = tmp_path / "cut.dat"
    cut.write_bytes(whole[:200])
    with pytest.raises(datfile.TraceCmdError, match=rf"{cut}: offset \d+: .*bytes needed"):
        tracecmd.read(cut)
    v9 = tmp_path / "v9.dat"
    v9.write_bytes(datfile.MAGIC + b"9\0" + whole[len(datfile.MAGIC) + 2:])
    with pytest.raises(datfile.TraceCmdError, match=rf"{v9}: offset 10: trace-cmd file version '9'"):
        tracecmd.read(v9)
    r = run_cli("import", str(cut), "-o", str(tmp_path / "s"), check=False)
    assert r.returncode == 2 and f"{cut}: offset" in r.stderr
    assert not (tmp_path / "s").exists()
    # a damaged zstd frame (zstandard's own error is no ValueError: it escaped)
    frame = whole.find(b"\x28\xb5\x2f\xfd")
    assert frame > 0
    z = tmp_path / "z.dat"
    z.write_bytes(whole[:frame + 12] + bytes([whole[frame + 12] ^ 0xFF]) + whole[frame + 13:])
    with pytest.raises(datfile.TraceCmdError,
                       match=rf"{z}: offset \d+: zstd data does not decompress: .*corruption"):
        tracecmd.read(z)
    # a chunk's uncompressed size damaged: too small, or 4 GiB (once allocated
    # whole before zstd read a byte: a MemoryError under a 2 GiB limit)
    cpu, at, _ = datfile.open_dat(files["v7 zstd"])[0].cpus[-1]
    frame = at + 12                                            # the last cpu's 1st chunk
    intact = tracecmd.read(files["v7 zstd"]).table.column("cpu").to_pylist()
    others = len(intact) - intact.count(cpu)   # (all events may be that CPU's: the others' 0)
    assert whole[frame:frame + 4] == b"\x28\xb5\x2f\xfd"
    size = int.from_bytes(whole[frame - 4:frame], "little")
    for usize, msg in [(size - 1, f"decompresses past the {size - 1} bytes expected"),
                       (2**32 - 1, rf"\d+ bytes decompressed, {2**32 - 1} expected")]:
        z.write_bytes(whole[:frame - 4] + usize.to_bytes(4, "little") + whole[frame:])
        r = subprocess.run([sys.executable, "-c", READ_UNDER_2G, str(z)], capture_output=True,
                           text=True, timeout=120)
        # (that CPU's events left out, the others' read)
        assert r.returncode == 0 and re.fullmatch(
            rf"{z}: offset {frame - 8} \(a chunk of cpu {cpu}'s data\): {msg}: cpu {cpu}'s "
            rf"events left out\nevents {others}\n", r.stdout), r
    # a format's field with no name (an IndexError escaped)
    v6 = files["v6"].read_bytes()
    decl = b"field:unsigned short common_type;"
    at = v6.find(decl, v6.find(b"name: block_rq_issue"))   # (ftrace's own formats: not read)
    assert at > 0
    nameless = tmp_path / "nameless.dat"
    nameless.write_bytes(v6[:at + 6] + b" " * (len(decl) - 7) + v6[at + len(decl) - 1:])
    with pytest.raises(datfile.TraceCmdError, match=rf"{nameless}: offset \d+: a \w+ event "
                       r"format: a field with no name at character \d+ of the format"):
        tracecmd.read(nameless)


READ_UNDER_2G = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from nestrace.importers import datfile, tracecmd
try:
    r = tracecmd.read(sys.argv[1])
    print("\\n".join(r.problems))
    print("events", r.table.num_rows)
except datfile.TraceCmdError as e:
    print(e)
"""


def test_rwbs_letters_become_blktrace_categories():
    for rwbs, cats in [("R", 0), ("RA", bt.TC_AHEAD), ("WS", bt.TC_WRITE | bt.TC_SYNC),
                       ("FWFS", bt.TC_FLUSH | bt.TC_WRITE | bt.TC_FUA | bt.TC_SYNC),
                       ("F", bt.TC_FLUSH), ("FF", bt.TC_FLUSH), ("D", bt.TC_DISCARD),
                       ("DE", bt.TC_DISCARD), ("N", 0), ("RM", bt.TC_META)]:
        assert tracecmd.rwbs_categories(rwbs) == cats, rwbs
