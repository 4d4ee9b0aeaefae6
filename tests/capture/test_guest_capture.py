"""The agent alone in a guest (`nestrace-agent --guest MOUNT --guest-capture
DIR -- CMD`, for a VM without nestrace's Python) and `nestrace import DIR`.
Two-machine merges of such a capture are in test_merge.py."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401
import pytest
from conftest import assert_losses_counted, kill_fio_jobs, run_cli

import nestrace
from nestrace._paths import agent_path
from nestrace.capture.agent import quiet_cpus

pytestmark = pytest.mark.root


def agent(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(agent_path()), *args], capture_output=True, text=True, **kw)


def test_the_agent_alone_refuses_what_it_cannot_capture_and_leaves_nothing(lab_factory, tmp_path):
    """One line and exit 2 for a path that is no mount point, a file system
    whose extents it cannot map, a capture directory in use (a btrfs on
    two disks: test_cli); and no directory left behind by a capture that
    never began."""
    lab = lab_factory("ext4", "xfs")
    d = tmp_path / "g"
    cases = [
        (["--guest", str(tmp_path)], "not a mount point"),
        (["--guest", "/proc"], "a proc file system"),
    ]
    for args, want in cases:
        r = agent(*args, "--guest-capture", str(d), "--", "true")
        assert r.returncode == 2 and want in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not d.exists(), "a capture that never began left its directory"
    d.mkdir()
    (d / "other").write_text("x")
    r = agent("--guest", lab.mount, "--guest-capture", str(d), "--", "true")
    assert r.returncode == 2 and "not empty (other)" in r.stderr, r.stderr
    assert sorted(p.name for p in d.iterdir()) == ["other"]
    # the two options go together, and a command needs them
    r = agent("--guest", lab.mount, "--", "true")
    assert r.returncode != 0 and "go together" in r.stderr, r.stderr
    r = agent("--dev", "7:0=block", "--", "true")
    assert r.returncode != 0 and "runs only in a --guest-capture" in r.stderr, r.stderr


def test_a_guest_capture_directory_imports_once_and_bad_parts_are_named(lab_factory, tmp_path):
    """A capture the agent made alone imports as a guest-side capture
    (vfs and vdisk) with the command's exit code; importing it again into
    the same store is refused.  A guest.json that does not parse, or an
    agent stream with no start, is one error line naming the file and the
    offset; an extents line that does not parse is left out with a warning
    naming its offset, and the other files' extents are kept."""
    lab = lab_factory("ext4", "xfs")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=8M")
    for name in ("a", "b"):
        Path(lab.mount, name).write_bytes(b"x" * 8192)
    d = tmp_path / "g"
    r = agent("--guest", lab.mount, "--guest-capture", str(d), "--", "sh", "-c",
              "grep Cpus_allowed_list /proc/self/status; "
              f"cat {lab.mount}/a {lab.mount}/b > /dev/null; "
              f"dd if={lab.mount}/t.0.0 of=/dev/null bs=4k count=16 iflag=direct status=none; "
              "exit 3")
    assert r.returncode == 0, r.stderr
    assert "sh exited 3" in r.stderr
    # the agent runs away from the disk interrupts, as record's would, and
    # the command where the agent could have
    quiet = quiet_cpus(Path("/proc/interrupts").read_text(), os.sched_getaffinity(0))
    own = subprocess.run(["grep", "Cpus_allowed_list", "/proc/self/status"],
                         capture_output=True, text=True).stdout
    assert r.stdout == own, (r.stdout, own)
    facts = json.loads((d / "guest.json").read_text())
    assert (facts["command_exit"], facts["stack"]["fs"], facts["files_start"]) == (3, "ext4", 3)
    assert facts["agent_cpus"] == (sorted(quiet) if quiet else None)
    assert facts["files_end"] == 3          # the three were read

    store = tmp_path / "s"
    out = run_cli("import", str(d), "-o", str(store))
    with nestrace.open(store) as s:
        assert_losses_counted(s, out.stdout)
        meta = s.rows("SELECT command_exit, lost_total, settings_json FROM capture_meta")[0]
        assert (meta["command_exit"], meta["lost_total"]) == (3, 0)
        assert json.loads(meta["settings_json"])["agent_cpus"] == facts["agent_cpus"]
        assert {r["level"] for r in s.rows("SELECT level FROM device_map")} == {"vfs", "vdisk"}
        assert s.rows("SELECT count(*) AS n FROM vfs_io WHERE op = 'read' AND ino = "
                      f"{os.stat(Path(lab.mount, 't.0.0')).st_ino}")[0]["n"] == 16
        # the direct reads are at the places the imported map gives
        got = s.rows("""SELECT count(*) AS n, count(*) FILTER (WHERE EXISTS (
                            SELECT 1 FROM vdisk_io v WHERE v.op = 'read'
                            AND v.offset_bytes <= m.vdisk_offset_bytes
                            AND m.vdisk_offset_bytes + m.bytes <= v.offset_bytes + v.bytes))
                            AS found
                        FROM map_vfs m JOIN vfs_io f USING (capture_id, io_id)
                        WHERE f.syscall = 'pread64' OR f.req_bytes = 4096""")
        assert got[0]["n"] >= 16 and got[0]["found"] == got[0]["n"], got
        phases = s.rows("SELECT phase, count(DISTINCT ino) AS files FROM extent_maps "
                        "WHERE role = 'guest_file' GROUP BY 1 ORDER BY 1")
        # and where its journal is (test_the_agent_alone_finds_the_journal_where_record_does)
        assert s.rows("SELECT DISTINCT phase, ino FROM extent_maps WHERE role = 'fs_journal'") \
            == [{"phase": "start", "ino": 8}]
        assert phases == [{"phase": "end", "files": 3}, {"phase": "start", "files": 3}]
    again = run_cli("import", str(d), "-o", str(store), check=False)
    assert again.returncode == 2 and "already holds capture" in again.stderr

    # damaged copies
    def copy(name: str) -> Path:
        c = tmp_path / name
        shutil.copytree(d, c)
        return c

    bad = copy("badjson")
    (bad / "guest.json").write_text('{"format": "nestrace-guest-capture", "version": 1,')
    r = run_cli("import", str(bad), "-o", str(tmp_path / "x1"), check=False)
    assert r.returncode == 2 and f"{bad}/guest.json: offset 50: not JSON" in r.stderr, r.stderr
    assert facts["stack"]["untraced_mounts"] == []     # (the lab's guest has its disk alone)
    odd = copy("badmounts")
    facts["stack"]["untraced_mounts"] = [["/boot"]]
    (odd / "guest.json").write_text(json.dumps(facts))
    r = run_cli("import", str(odd), "-o", str(tmp_path / "x0"), check=False)
    assert r.returncode == 2 and f"{odd}/guest.json: offset 0: stack.untraced_mounts is not " \
        "a list of [mount point, partition]" in r.stderr, r.stderr
    facts["stack"]["untraced_mounts"] = []
    odd = copy("badguests")
    (odd / "guest.json").write_text(json.dumps(facts | {"stack": facts["stack"] | {
        "more_guests": ["/home"]}}))
    r = run_cli("import", str(odd), "-o", str(tmp_path / "x4"), check=False)
    assert r.returncode == 2 and f"{odd}/guest.json: offset 0: stack.more_guests is not " \
        "a list of file systems" in r.stderr, r.stderr
    # (a line of a file system guest.json does not name: left out, named)
    odd = copy("badfs")
    lines = (odd / "extents.jsonl").read_bytes().splitlines(keepends=True)
    (odd / "extents.jsonl").write_bytes(lines[0].replace(b'{"phase":"start",',
                                                         b'{"phase":"start","fs":1,', 1)
                                        + b"".join(lines[1:]))
    r = run_cli("import", str(odd), "-o", str(tmp_path / "x5"))
    assert f"{odd}/extents.jsonl: offset 0: not a file's extents (fs 1: the stack names 1 " \
        "file system(s)): left out" in r.stderr, r.stderr
    nostart = copy("nostart")
    (nostart / "agent.stream").write_bytes(b"")
    r = run_cli("import", str(nostart), "-o", str(tmp_path / "x2"), check=False)
    assert r.returncode == 2 and "agent.stream: offset 0: no start frame" in r.stderr, r.stderr
    assert not any((tmp_path / "x2").glob("*/capture=*")), "a refused import stored something"
    torn = copy("torn")
    lines = (torn / "extents.jsonl").read_bytes().splitlines(keepends=True)
    at = len(lines[0])
    (torn / "extents.jsonl").write_bytes(lines[0] + lines[1][:20] + b"\n" + b"".join(lines[2:]))
    r = run_cli("import", str(torn), "-o", str(tmp_path / "x3"))
    assert f"extents.jsonl: offset {at}: not a file's extents" in r.stderr, r.stderr
    with nestrace.open(tmp_path / "x3") as s:
        kept = s.rows("SELECT count(*) AS n FROM (SELECT DISTINCT phase, ino FROM extent_maps "
                      "WHERE role = 'guest_file')")
    assert kept == [{"n": 5}]


def test_a_guest_capture_killed_mid_run_imports_what_it_wrote(lab_factory, tmp_path):
    """The agent and its command killed with SIGKILL while tracing: the
    import keeps every batch written so far and says the end is missing."""
    lab = lab_factory("ext4", "xfs")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=32M")
    d = tmp_path / "g"
    p = subprocess.Popen([str(agent_path()), "--guest", lab.mount, "--guest-capture", str(d),
                          "--flush-ms", "50", "--", "fio", "--name=t", f"--directory={lab.mount}",
                          "--rw=randread", "--bs=4k", "--direct=1", "--size=32M",
                          "--time_based", "--runtime=60", "--output=/dev/null"],
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in p.stderr:
            if "tracing" in line:
                break
        time.sleep(1.5)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        kill_fio_jobs(lab.mount)
    r = run_cli("import", str(d), "-o", str(tmp_path / "s"))
    assert "no end frame" in r.stderr and "no agent_stats" in r.stderr, r.stderr
    with nestrace.open(tmp_path / "s") as s:
        n = s.rows("SELECT count(*) AS n FROM vfs_io WHERE op = 'read'")[0]["n"]
        v = s.rows("SELECT count(*) AS n FROM vdisk_io WHERE op = 'read'")[0]["n"]
        assert n > 100 and v > 100, (n, v)
        assert s.rows("SELECT count(*) AS n FROM extent_maps WHERE phase = 'start'")[0]["n"] > 0


def test_a_store_on_the_traced_stack_is_named_where_its_writes_are_seen(lab_factory, tmp_path):
    """nestrace's own writes to a store (or a guest capture directory) on
    the stack it traces are traced too: `record` and the agent alone say
    so, at which level, and the capture's settings keep it."""
    from nestrace.capture.stack import discover, traced_at
    lab = lab_factory("ext4", "xfs")
    st = discover(lab.mount)
    host = str(Path(st.image_path).parent)
    assert [traced_at(st, p) for p in (lab.mount, host, str(tmp_path))] == ["vfs", "disk", None]

    where = {}
    for name, d in (("guest", Path(lab.mount) / "s"), ("host", Path(host) / "s"), ("off", tmp_path / "s")):
        r = run_cli("record", "-o", str(d), "--stack", lab.mount, "--", "true")
        where[name] = nestrace.open(d).rows("SELECT settings_json FROM capture_meta")[0]["settings_json"]
        warned = "is on the traced stack: nestrace's own writes to it" in r.stderr
        assert warned == (name != "off"), r.stderr
        if name == "guest":
            assert "are traced at every level" in r.stderr
    assert [json.loads(where[n])["store_traced_at"] for n in ("guest", "host", "off")] == ["vfs", "disk", None]
    rep = json.loads(run_cli("report", "--json", str(Path(lab.mount) / "s")).stdout)
    assert rep["store_traced_at"] == "vfs" and rep["max_size_reached"] is False

    g = Path(lab.mount) / "g"
    r = agent("--guest", lab.mount, "--guest-capture", str(g), "--", "true")
    assert f"--guest-capture {g} is on the traced stack: the agent's own writes to it are " \
           "traced at every level" in r.stderr
    assert json.loads((g / "guest.json").read_text())["store_traced_at"] == "vfs"
    run_cli("import", str(g), "-o", str(tmp_path / "gs"))
    settings = nestrace.open(tmp_path / "gs").rows("SELECT settings_json FROM capture_meta")[0]
    assert json.loads(settings["settings_json"])["store_traced_at"] == "vfs"
    r = agent("--guest", lab.mount, "--guest-capture", str(tmp_path / "g2"), "--", "true")
    assert "on the traced stack" not in r.stderr
    assert "store_traced_at" not in json.loads((tmp_path / "g2" / "guest.json").read_text())


MANY_FILES = r"""
import os, sys
d = sys.argv[1]
os.makedirs(d)
for i in range(int(sys.argv[2])):
    with open(f"{d}/f{i}", "wb") as f:
        f.write(os.urandom(4096))
os.sync()
"""


@pytest.mark.parametrize("by", ["record", "agent"])
def test_every_file_touched_gets_an_end_snapshot_and_a_start_snapshot_cut_short_is_said(
        lab_factory, tmp_path, by):
    """An xfs guest with 4100 files before the capture, and 4200 files of 4
    KiB written during it.  The start snapshot takes the first 4096 files
    found, and says so (a warning, settings_json, report --json); the end
    snapshot has every file the capture touched (xfs's write-back
    allocations make no mapping event: a file missing from it would leave
    its write-back unattributed)."""
    lab = lab_factory("xfs", "xfs", guest_dio="on", host_dio="on")
    import sys
    subprocess.run([sys.executable, "-c", MANY_FILES, f"{lab.mount}/old", "4100"], check=True)
    cmd = [sys.executable, "-c", MANY_FILES, f"{lab.mount}/new", "4200"]
    if by == "record":
        r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--", *cmd)
    else:
        r = agent("--guest", lab.mount, "--guest-capture", str(tmp_path / "g"), "--", *cmd)
        assert json.loads((tmp_path / "g" / "guest.json").read_text())["files_start_truncated"]
        run_cli("import", str(tmp_path / "g"), "-o", str(tmp_path / "s"))
    assert f"{lab.mount} has more than 4096 regular files: the start snapshot has the first " \
           "4096 found" in r.stderr, r.stderr
    s = nestrace.open(tmp_path / "s")
    settings = json.loads(s.rows("SELECT settings_json FROM capture_meta")[0]["settings_json"])
    assert settings["start_snapshot_truncated"] is True
    assert json.loads(run_cli("report", "--json", str(tmp_path / "s")).stdout)[
        "start_snapshot_truncated"] is True
    files = {r["phase"]: set(r["inos"]) for r in s.rows(
        "SELECT phase, list(DISTINCT ino) AS inos FROM extent_maps WHERE role = 'guest_file' "
        "GROUP BY ALL")}
    new = {p.stat().st_ino for p in Path(lab.mount, "new").iterdir()}
    assert len(files["start"]) == 4096 and len(new) == 4200 and new <= files["end"], \
        {k: len(v) for k, v in files.items()}
    # and any other file in the end snapshot was touched too (an old
    # file with page-cache events during the capture: its pages evicted,
    # say)
    touched = {r["ino"] for r in s.rows("SELECT DISTINCT ino FROM vfs_events UNION "
                                        "SELECT DISTINCT ino FROM pagecache_events")}
    assert files["end"] - new <= touched, len(files["end"] - new)
    kinds = {(r["kind"], r["tied"]): r["b"] for r in s.rows(
        "SELECT l.kind, l.upper_id IS NOT NULL AS tied, sum(l.bytes) AS b FROM links l "
        "JOIN vdisk_io v ON v.capture_id = l.capture_id AND v.io_id = l.lower_id "
        "WHERE l.lower_level = 'vdisk' AND l.upper_level = 'vfs' AND v.op = 'write' GROUP BY ALL")}
    assert {k for k, tied in kinds if not tied} <= {"metadata", "journal"}, kinds
    assert kinds.get(("writeback", True), 0) == 4200 * 4096, kinds
    assert_losses_counted(s)


def _first_files(top: str, limit: int) -> list[str]:
    """The oracle: a file system's first `limit` regular files, depth
    first, a directory's files (in directory order) before its
    subdirectories, none from lost+found or another file system."""
    out, todo, dev = [], [top], os.stat(top).st_dev
    while todo:
        d = todo.pop()
        subdirs = []
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "lost+found" and e.stat(follow_symlinks=False).st_dev == dev:
                        subdirs.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    if len(out) == limit:
                        return out
                    out.append(e.path)
        todo.extend(reversed(subdirs))
    return out


def test_a_start_snapshot_cut_short_takes_the_first_files_depth_first(lab_factory, tmp_path):
    """A start snapshot cut short (the agent's, which `record` takes too)
    takes the first 4096 files depth first, a directory's files before its
    subdirectories, none from lost+found or from a file system mounted
    inside the guest's, no symlink, no fifo.  (A walk that goes into a
    subdirectory where it meets it would take fewer than the 2000
    top-level files here, ext4 listing a directory in hash order, and more
    of d0's 3000.)"""
    from nestrace.capture.snapshots import snapshot_extents
    from nestrace.capture.stack import guest_side
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    top = Path(lab.mount)
    for d, n in ((top, 2000), (top / "d0", 3000)):
        d.mkdir(exist_ok=True)
        for i in range(n):
            (d / f"f{i}").write_bytes(b"x")
    (top / "lost+found" / "found").touch()
    (top / "link").symlink_to(top / "d0" / "f0")
    os.mkfifo(top / "fifo")
    (top / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(top / "mnt")], check=True)
    try:
        (top / "mnt" / "other").touch()
        r = agent("--guest", lab.mount, "--guest-capture", str(tmp_path / "g"), "--", "true")
        assert r.returncode == 0 and "has more than 4096 regular files" in r.stderr, r.stderr
        want = _first_files(lab.mount, 4096)
        table, cut = snapshot_extents(guest_side(lab.mount), "x", "start")
    finally:
        subprocess.run(["umount", str(top / "mnt")], check=True)
    lines = map(json.loads, (tmp_path / "g" / "extents.jsonl").read_text().splitlines())
    got = [x["path"] for x in lines if x["phase"] == "start" and "path" in x]  # (not the journal's)
    assert len(want) == 4096 and got == want, \
        (len(got), next((a, b) for a, b in zip(got, want) if a != b))
    assert sum(Path(p).parent == top for p in got) == 2000 and \
        sum(Path(p).parent == top / "d0" for p in got) == 4096 - 2000, got[:5]
    # record's start snapshot: the same files, an extent each
    rows = table.filter(pa.compute.equal(table.column("role"), "guest_file"))
    assert cut and sorted(rows.column("path").to_pylist()) == sorted(want)


def test_the_stores_own_writes_on_a_traced_disk_are_their_own_class(lab_factory, tmp_path):
    """A store on the host file system (the image's, on the traced disk):
    the host-disk writes into its own files (the agent's batches, written
    back by the sync at the end of the workload) are kind nestrace in
    links, not write-back or journal, and the report glosses the class."""
    lab = lab_factory("ext4", "xfs", guest_dio="off")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    from nestrace.capture.stack import discover
    store = Path(discover(lab.mount).image_path).parent / "s"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "sh", "-c",
            f"fio --name=t --directory={lab.mount} --rw=randread --bs=4k --direct=1 --size=64M "
            "--io_size=16M --output=/dev/null; sync")
    s = nestrace.open(store)
    own = s.rows("SELECT count(*) AS files, sum(length_bytes) AS bytes FROM extent_maps "
                 "WHERE role = 'nestrace_store'")[0]
    assert own["files"] > 0
    got = {r["kind"]: r for r in s.rows(
        "SELECT kind, attributed, bytes FROM links_summary WHERE lower_level = 'disk'")}
    written = s.rows("SELECT sum(bytes) AS b FROM disk_io WHERE op = 'write'")[0]["b"]
    assert got["nestrace"]["attributed"] is False
    # the agent's batches are among the host disk's writes, within its
    # files (how much of them the sync catches depends on when the agent's
    # last batch lands: 24 of 76 KiB in a run beside the other tests)
    assert 0 < got["nestrace"]["bytes"] <= min(own["bytes"], written)
    assert "nestrace: nestrace's own writes to its store, on a traced disk" in \
        " ".join(run_cli("report", str(store)).stdout.split())


def _runs(exts) -> list[tuple[int, int, int]]:
    """(logical, physical, bytes) runs with the ones that follow on joined:
    debugfs prints a long extent as several."""
    out: list[list[int]] = []
    for lo, ph, n in sorted(exts):
        if out and out[-1][0] + out[-1][2] == lo and out[-1][1] + out[-1][2] == ph:
            out[-1][2] += n
        else:
            out.append([lo, ph, n])
    return [tuple(r) for r in out]


# file systems made so that the agent's reading of the journal takes each
# path: (mkfs, image MiB, on a partition); ext4 with small block groups and
# no flex_bg has a journal of many extents (an extent tree a level deep),
# ext3 with 1 KiB blocks one that needs double indirect blocks, xfs on a
# partition a log whose place gets the partition's start added, ext2 none
JOURNAL_CASES = {
    "ext4-extent-tree": (["mkfs.ext4", "-F", "-q", "-b", "1024", "-g", "256", "-N", "512",
                          "-O", "^flex_bg,^resize_inode", "-J", "size=4"], 64, False),
    "ext4": (["mkfs.ext4", "-F", "-q"], 256, False),
    "ext3-1k-blocks": (["mkfs.ext3", "-F", "-q", "-b", "1024", "-J", "size=8"], 64, False),
    "xfs-on-a-partition": (["mkfs.xfs", "-f", "-q"], 400, True),
    "ext2": (["mkfs.ext2", "-F", "-q"], 64, False),
}


@pytest.mark.parametrize("case", list(JOURNAL_CASES))
def test_the_agent_alone_finds_the_journal_where_record_does(case, tmp_path):
    """The agent reads where the guest's journal is from the device itself
    (no dumpe2fs, debugfs or xfs_db in a bare guest): the same blocks as
    dumpe2fs, debugfs and xfs_db say (fstools), and `nestrace import` stores
    them as record does (role fs_journal, on the whole disk).  A journal
    the agent could not read is a warning naming the device, and no rows."""
    from fstools import journal_by_tools

    from nestrace.capture.devices import kdev_of, mount_of
    from nestrace.capture.loops import PART_START, partition, write_mbr
    mkfs, mib, part = JOURNAL_CASES[case]
    img, mnt = tmp_path / "fs.img", tmp_path / "m"
    subprocess.run(["truncate", "-s", f"{mib}M", str(img)], check=True)
    if part:
        write_mbr(img, PART_START, (mib << 20) - PART_START)
    mnt.mkdir()
    loop = subprocess.run(["losetup", "-f", "--show", *(["-P"] if part else []), str(img)],
                          check=True, capture_output=True, text=True).stdout.strip()
    mounted = False
    try:
        dev = partition(loop, mib << 20) if part else loop   # (the lab's own way)
        subprocess.run([*mkfs, dev], check=True, capture_output=True)
        subprocess.run(["mount", dev, str(mnt)], check=True)
        mounted = True
        d = tmp_path / "g"
        r = agent("--guest", str(mnt), "--guest-capture", str(d), "--", "true")
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in (d / "extents.jsonl").read_text().splitlines()
                 if '"journal' in x]
        want_ino, want = journal_by_tools(mount_of(str(mnt)).fs_type, dev)
        if case == "ext2":
            assert lines == [] and want == []
            return
        assert len(lines) == 1 and lines[0]["journal_dev"] == dev, lines
        got = lines[0]["journal"]
        assert got["ino"] == want_ino and want_ino == (0 if case.startswith("xfs") else 8)
        assert _runs(got["extents"]) == _runs(want), (got, want)
        assert sum(n for _, _, n in want) >= 4 << 20
        if case == "ext4-extent-tree":      # over the four extents an inode holds
            assert len(_runs(want)) > 4, want
        if case == "ext3-1k-blocks":        # past the 12 + 256 blocks of IND
            assert sum(n for _, _, n in want) > (12 + 256) * 1024
        start = PART_START if part else 0
        disk = os.stat(loop).st_rdev
        store = tmp_path / "s"
        out = run_cli("import", str(d), "-o", str(store))
        assert "journal" not in out.stderr, out.stderr
        with nestrace.open(store) as s:
            rows = s.rows("SELECT logical_bytes, physical_bytes, length_bytes, ino, physical_dev "
                          "FROM extent_maps WHERE role = 'fs_journal' ORDER BY 1")
        assert _runs((r["logical_bytes"], r["physical_bytes"] - start, r["length_bytes"])
                     for r in rows) == _runs(want)
        assert {(r["ino"], r["physical_dev"]) for r in rows} == \
            {(want_ino, kdev_of(disk))}
        # a journal the agent could not read
        ext = d / "extents.jsonl"
        ext.write_text("".join(x + "\n" for x in ext.read_text().splitlines()
                               if '"journal' not in x) +
                       json.dumps({"phase": "start", "journal_dev": dev,
                                   "journal_error": "cannot open it: Permission denied"}) + "\n")
        out = run_cli("import", str(d), "-o", str(tmp_path / "s2"))
        assert f"nestrace: warning: {mnt} on {dev}: where its journal is stays unknown " \
               "(cannot open it: Permission denied)" in out.stderr, out.stderr
        with nestrace.open(tmp_path / "s2") as s:
            assert s.rows("SELECT count(*) AS n FROM extent_maps WHERE role = 'fs_journal'") == \
                [{"n": 0}]
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=True)
        subprocess.run(["losetup", "-d", loop], check=True)


def test_the_agent_alone_traces_an_overlay_and_the_file_system_of_its_layers(lab_factory,
                                                                              tmp_path):
    """A container's root in a VM with only the agent: `--guest` on an
    overlay whose layers are on the guest FS traces the overlay and that
    file system (named first, as `record` does), and snapshots the
    overlay's files through it as `record`'s Python does; each O_DIRECT
    read through the overlay is found at the virtual disk where its
    extents say.  An overlay with layers on two file systems is refused
    by name; the base named again after its overlay is no error."""
    from tracethrough import (
        assert_overlay_and_base_traced,
        fio_log_offsets,
        two_overlays,
    )

    from nestrace.capture.snapshots import snapshot_extents
    from nestrace.capture.stack import guest_side
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    with two_overlays(lab, tmp_path) as (ov, merged, other, _):
        log, gdir = tmp_path / "fio.iolog", tmp_path / "g"
        r = agent("--guest", str(merged), "--guest-capture", str(gdir), "--", "fio", "--name=t",
                  f"--filename={merged / 'f'}", "--rw=randread", "--bs=4k", "--direct=1",
                  "--io_size=2M", "--ioengine=psync", f"--write_iolog={log}", "--output=/dev/null")
        assert r.returncode == 0 and "fio exited 0" in r.stderr, r.stderr
        st = json.loads((gdir / "guest.json").read_text())["stack"]
        guest, ovdev = os.stat(lab.mount).st_dev, os.stat(merged).st_dev
        assert (st["mount"], st["fs"], st["base_major"]) == (lab.mount, "ext4", 0), st
        assert [(g["mount"], g["fs"], g["fs_major"], g["fs_minor"], g["base_major"],
                 g["base_minor"]) for g in st["more_guests"]] == [
            (str(merged), "overlay", os.major(ovdev), os.minor(ovdev), os.major(guest),
             os.minor(guest))], st
        imp = run_cli("import", str(gdir), "-o", str(tmp_path / "s"))
        s = nestrace.open(tmp_path / "s")
        assert_losses_counted(s, imp.stdout)
        assert_overlay_and_base_traced(s, lab.mount, merged)
        # the start snapshot is record's, row for row (the file is only read)
        cols = ["phase", "role", "path", "dev", "ino", "logical_bytes", "physical_bytes",
                "length_bytes", "flags", "physical_dev"]
        py = [r for r in snapshot_extents(guest_side(str(merged)), "x", "start")[0]
              .select(cols).to_pylist() if r["role"] == "guest_file"]
        got = s.rows(f"SELECT {', '.join(cols)} FROM extent_maps WHERE phase = 'start' "
                     "AND role = 'guest_file'")
        assert {r["path"] for r in py} == {str(ov / "lower" / "f"), str(merged / "f")}, py
        assert sorted(got, key=str) == sorted(py, key=str)
        # every fio read, on the overlay's file, at the virtual disk where
        # its layer file's extents put it
        offsets = fio_log_offsets(log)
        assert len(offsets) == 512 and sorted(r["offset_bytes"] for r in s.rows(
            "SELECT offset_bytes FROM vfs_io WHERE syscall = 'pread64' AND dev = ?",
            [(os.major(ovdev) << 20) | os.minor(ovdev)])) == sorted(offsets)
        linked = s.rows("SELECT (SELECT sum(l.bytes) FROM links l WHERE l.upper_level = 'vfs' "
                        "AND l.lower_level = 'vdisk' AND l.kind = 'sync' "
                        "AND l.upper_id = v.io_id) AS n, count(*) AS calls FROM vfs_io v "
                        "WHERE v.syscall = 'pread64' GROUP BY ALL")
        assert linked == [{"n": 4096, "calls": 512}], linked
        # refused: layers on two file systems; no error: the base again
        r = agent("--guest", str(other), "--guest-capture", str(tmp_path / "g2"), "--", "true")
        assert r.returncode == 2 and f"--guest {other}: an overlay with layers on several " \
            "file systems" in r.stderr and not (tmp_path / "g2").exists(), r.stderr
        r = agent("--guest", str(merged), "--guest", lab.mount, "--guest-capture",
                  str(tmp_path / "g3"), "--", "true")
        assert r.returncode == 0, r.stderr
        st = json.loads((tmp_path / "g3" / "guest.json").read_text())["stack"]
        assert [st["mount"]] + [g["mount"] for g in st["more_guests"]] == [lab.mount, str(merged)]
