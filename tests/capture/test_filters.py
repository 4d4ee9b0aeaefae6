"""Real captures: what the vfs level keeps by cgroup, overlays traced through,
and an idle capture that writes nothing itself."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    assert_losses_counted,
    drop_caches,
    lab_state,
    loop_devices,
    run_cli,
    sync_lab,
)

import nestrace
from nestrace._paths import agent_path

pytestmark = pytest.mark.root
from tracethrough import (
    TRACE_THROUGH_MAPPED,
    assert_overlay_and_base_traced,
    fio_log_offsets,
    two_overlays,
)


@pytest.fixture
def cgroup():
    """A cgroup v2 directory for the test, with a cgroup below it
    (`inner`); both removed after, their tasks killed first."""
    v2 = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
          if line.split()[2] == "cgroup2"]
    if not v2:
        pytest.fail("no cgroup2 file system is mounted (systemd mounts one at /sys/fs/cgroup, "
                    "or /sys/fs/cgroup/unified beside cgroup v1)")
    top = Path(v2[0]) / f"nestrace-test-{os.getpid()}-{time.monotonic_ns()}"
    (top / "inner").mkdir(parents=True)
    try:
        yield top
    finally:
        for d in (top / "inner", top):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except OSError:     # (busy until its killed tasks are gone)
                    time.sleep(0.05)
        assert not top.exists(), f"{top} left behind"


# three fio jobs reading with O_DIRECT: 4 KiB reads from the cgroup and
# 16 KiB from the cgroup below it, of one 16 MiB file, and 8 KiB from
# outside, of another (so that no virtual-disk request merges a traced
# read with an untraced one)
FIO_JOB = ("fio --name=j{bs} --filename={f} --rw=randread --bs={bs} --direct=1 --io_size=1M "
           "--output=/dev/null")
IN_CGROUP = """sh -c 'echo $$ > {cg}/cgroup.procs; exec {job4}' &
sh -c 'echo $$ > {cg}/inner/cgroup.procs; exec {job16}' &
{job8}
wait
"""
# (lays a file out)
FIO_WRITE = "fio --name=w --filename={f} --rw=write --bs=1M --size=16M --direct=1 --output=/dev/null"


@pytest.mark.parametrize("mode", ["auto", "raw_tp"])
def test_cgroup_filter_keeps_the_tasks_of_a_cgroup_and_below_at_the_vfs_level(
        lab_factory, tmp_path, cgroup, mode):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    f, g = f"{lab.mount}/t.0.0", f"{lab.mount}/other"
    for x in (f, g):
        subprocess.run(FIO_WRITE.format(f=x).split(), check=True)
    script = IN_CGROUP.format(cg=cgroup, **{
        f"job{k}": FIO_JOB.format(bs=f"{k}k", f=g if k == 8 else f) for k in (4, 8, 16)})
    r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--mode", mode,
                "--cgroup", str(cgroup), "--", "sh", "-c", script)
    s = nestrace.open(tmp_path / "s")
    assert json.loads(s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])[
        "sys_enter"] == ("raw_tp" if mode == "raw_tp" else "tp_btf")
    # the cgroup's calls and those of the cgroup below it, not the others'
    got = s.rows("SELECT req_bytes, count(*) AS n FROM vfs_io WHERE op = 'read' GROUP BY ALL "
                 "ORDER BY 1")
    assert got == [{"req_bytes": 4096, "n": 256}, {"req_bytes": 16384, "n": 64}], got
    # ... while the levels below see all three jobs' reads (the two traced
    # jobs' adjacent reads may merge into one request: the bytes add up)
    vd = {r["bytes"]: r["n"] for r in s.rows(
        "SELECT bytes, count(*) AS n FROM vdisk_io WHERE op = 'read' GROUP BY ALL")}
    assert sum(b * n for b, n in vd.items()) == 3 << 20 and vd.get(8192, 0) >= 120, vd
    st = json.loads(s.rows("SELECT settings_json FROM capture_meta")[0]["settings_json"])
    assert st["cgroup"] == str(cgroup), st
    rep = json.loads(run_cli("report", "--json", str(tmp_path / "s")).stdout)
    assert rep["vfs_only"] == {"pid": None, "cgroup": str(cgroup)}, rep["vfs_only"]
    # the one file, named, with the two jobs' reads, each tied down to the host disk
    assert rep["files_total"] == 1 and [
        (x["path"], x["reads"], x["read_bytes"], x["processes"]) for x in rep["files"]] == \
        [(f, 320, 2 << 20, 2)], rep["files"]
    fr = s.rows("SELECT path, calls, vdisk_bytes, disk_bytes FROM vfs_files")
    assert fr == [{"path": f, "calls": 320, "vdisk_bytes": 2 << 20, "disk_bytes": 2 << 20}], fr
    # ... and the two processes that read it, each with its reads
    assert rep["processes_total"] == 2 and sorted(
        (x["comm"], x["reads"], x["read_bytes"], x["files"]) for x in rep["processes"]) == \
        [("fio", 64, 1 << 20, 1), ("fio", 256, 1 << 20, 1)], rep["processes"]
    # (two jobs' adjacent reads merged into one request share its bytes by
    # overlap: a page may move between them, never out of the sum)
    got = [r["vdisk_bytes"] for r in s.rows("SELECT vdisk_bytes FROM vfs_processes")]
    assert sum(got) == 2 << 20 and all(abs(b - (1 << 20)) <= 64 << 10 for b in got), got
    assert f"only the calls of the tasks of cgroup {cgroup} (and below)" in " ".join(
        run_cli("report", str(tmp_path / "s")).stdout.split())
    if mode == "raw_tp":
        return
    # the agent alone (a guest without Python): the same, said in its guest.json
    gdir = tmp_path / "g"
    a = subprocess.run([str(agent_path()), "--guest", lab.mount, "--guest-capture", str(gdir),
                        "--cgroup", str(cgroup), "--", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120)
    assert a.returncode == 0, a.stderr
    assert json.loads((gdir / "guest.json").read_text())["cgroup"] == str(cgroup)
    run_cli("import", str(gdir), "-o", str(tmp_path / "g.store"))
    g = nestrace.open(tmp_path / "g.store")
    assert g.rows("SELECT req_bytes, count(*) AS n FROM vfs_io WHERE op = 'read' GROUP BY ALL "
                  "ORDER BY 1") == [{"req_bytes": 4096, "n": 256}, {"req_bytes": 16384, "n": 64}]
    assert json.loads(run_cli("report", "--json", str(tmp_path / "g.store")).stdout)[
        "vfs_only"] == {"pid": None, "cgroup": str(cgroup)}
    # what is not a cgroup v2 directory: one line, exit 2, nothing recorded
    v1 = next((line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
               if line.split()[2] == "cgroup"), None)
    for bad, said in ((tmp_path, "not a cgroup v2 directory (it is on "),
                      (tmp_path / "none", "no such directory"),
                      *(((v1, "not a cgroup v2 directory (it is on cgroup)"),) if v1 else ())):
        r = run_cli("record", "-o", str(tmp_path / "s3"), "--stack", lab.mount, "--cgroup",
                    str(bad), "--duration", "1", check=False)
        assert r.returncode == 2 and said in r.stderr.splitlines()[-1], r.stderr
        assert not list((tmp_path / "s3").glob("*/capture=*"))
        a = subprocess.run([str(agent_path()), "--families", "vfs", "--cgroup", str(bad),
                            "-d", "1", "-o", "/dev/null"], capture_output=True, text=True)
        assert a.returncode == 2 and f"--cgroup {bad}: " in a.stderr, a.stderr
    r = run_cli("record", "-o", str(tmp_path / "s4"), "--side", "host", "--image",
                str(Path(lab.mount).parent / "host" / "image.raw"),
                "--cgroup", str(cgroup), "--duration", "1", check=False)
    assert r.returncode == 2 and "a host side has no vfs level" in r.stderr, r.stderr


def test_an_overlay_on_the_guest_fs_is_traced_through_to_the_host_disk(lab_factory, tmp_path):
    """A container's root in a VM: an overlay whose layers are on the guest
    FS.  `record --stack` on the overlay traces it and the file system
    under it; its calls are followed down to the host disk through its
    files' extents (FIEMAP through the overlay gives the layer file's)."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    with two_overlays(lab, tmp_path) as (ov, merged, other, made):
        log = tmp_path / "fio.iolog"
        run_cli("record", "-o", str(tmp_path / "s"), "--stack", str(merged), "--", "fio",
                "--name=t", f"--filename={merged / 'f'}", "--rw=randread", "--bs=4k",
                "--direct=1", "--io_size=2M", "--ioengine=psync", f"--write_iolog={log}",
                "--output=/dev/null")
        s = nestrace.open(tmp_path / "s")
        assert_overlay_and_base_traced(s, lab.mount, merged)
        # every fio read, on the overlay's file, at each level below
        offsets = fio_log_offsets(log)
        assert len(offsets) == 512 and sorted(r["offset_bytes"] for r in s.rows(
            "SELECT offset_bytes FROM vfs_io WHERE syscall = 'pread64'")) == sorted(offsets)
        got = s.con.execute(TRACE_THROUGH_MAPPED, {"err": 0}).fetchone()
        assert got[0] == 512 and got[1] >= 512 and got[1:] == (got[1],) * 4, got
        assert s.rows("SELECT path FROM vfs_files") == [{"path": str(merged / "f")}]
        # buffered, the overlay named after the file system under it: a
        # read through the guest's page cache (the layer file's), and a
        # new file written and fsynced
        drop_caches(lab)
        run_cli("record", "-o", str(tmp_path / "b"), "--stack", lab.mount, "--stack",
                str(merged), "--", "sh", "-c", f"cat {merged / 'f'} > /dev/null; "
                f"dd if=/dev/zero of={merged / 'new'} bs=64k count=16 conv=fsync status=none")
        b = nestrace.open(tmp_path / "b")
        ra = b.rows("SELECT readahead_bytes, unused_bytes, read_filled_bytes FROM "
                    "readahead_summary WHERE level = 'guest'")[0]
        # (the overlay's reads used the pages readahead brought into the
        # layer file's cache: none unused)
        assert ra["readahead_bytes"] + ra["read_filled_bytes"] >= 16 << 20 and \
            ra["unused_bytes"] == 0, ra
        assert b.rows("SELECT f.path, sum(l.bytes) AS bytes FROM links l JOIN vfs_io v "
                      "ON v.io_id = l.upper_id JOIN vfs_files f ON f.dev = v.dev AND f.ino = v.ino "
                      "WHERE l.upper_level = 'vfs' AND l.kind = 'writeback' GROUP BY ALL") == [
            {"path": str(merged / "new"), "bytes": 1 << 20}]
        # the file copied up (a write through the overlay): the overlay
        # keeps the lower file's inode number, the page cache is the upper
        # file's; a read of it through the overlay uses its readahead
        subprocess.run(["dd", "if=/dev/zero", f"of={merged / 'f'}", "bs=4k", "count=1",
                        "conv=notrunc,fsync", "status=none"], check=True)
        lower, upper = ((ov / d / "f").stat().st_ino for d in ("lower", "u0"))
        assert os.stat(merged / "f").st_ino == lower != upper
        drop_caches(lab)
        run_cli("record", "-o", str(tmp_path / "c"), "--stack", str(merged), "--", "sh", "-c",
                f"cat {merged / 'f'} > /dev/null")
        c = nestrace.open(tmp_path / "c")
        ra = c.rows("SELECT ino, count(*) FILTER (WHERE readahead) AS ra, count(*) FILTER "
                    "(WHERE cause = 'read') AS filled, count(*) FILTER (WHERE readahead AND NOT "
                    "used) AS unused FROM readahead_pages WHERE level = 'guest' GROUP BY ALL")
        assert [r["ino"] for r in ra] == [upper] and ra[0]["ra"] + ra[0]["filled"] >= 4096 \
            and ra[0]["unused"] == 0, ra     # (pages: the 16 MiB file)
        # an overlay with layers on two file systems is refused by name
        r = run_cli("record", "-o", str(tmp_path / "s2"), "--stack", str(other),
                    "--duration", "1", check=False)
        assert r.returncode == 2 and f"{other}: an overlay with layers on several file " \
            "systems" in r.stderr, r.stderr
        # lab down takes the overlays on the lab's file system down first
        # (an overlay keeps its layers' file system, and the loop devices
        # under it, alive after that one's own mount is gone)
        before = loop_devices()
        down = run_cli("lab", "down", "--name", lab.name)
        assert all(f"unmounted {mp} (on the lab's file system)" in down.stderr for mp in made), \
            down.stderr
        assert not any(os.path.ismount(mp) for mp in made) and len(loop_devices()) == len(before) - 2


@pytest.mark.parametrize("by", ["record", "agent"])
def test_an_idle_capture_writes_nothing_to_the_guest_fs_it_walks(lab_factory, tmp_path, by):
    """nestrace's snapshots read every directory of the traced guest FS.
    Reading a directory for the first time since it changed sets its atime
    (relatime), and ext4's journal would commit the inodes 5 s later,
    inside the capture: writes and flushes at every level, all nestrace's
    own doing.  The walks (record's and the agent's) open directories
    with O_NOATIME, and record reads the image's header (its
    format) and map with it too: with atime set, the host FS would log
    the image's inode.  (Reads are allowed: a drop of the caches
    by the other CI run makes the end snapshot read directories again.)"""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    sub = Path(lab.mount) / "d"
    sub.mkdir()
    (sub / "f").write_bytes(b"x" * 4096)
    sync_lab(lab)                   # (the image, written, is newer than its atime)
    image = lab_state(lab)["image"]
    before = {p: os.stat(p).st_atime_ns for p in (lab.mount, sub, image)}
    assert os.stat(image).st_mtime_ns >= before[image]
    store = tmp_path / "s"
    if by == "record":
        run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "sleep", "6")
    else:
        a = subprocess.run([str(agent_path()), "--guest", lab.mount, "--guest-capture",
                            str(tmp_path / "g"), "--", "sleep", "6"],
                           capture_output=True, text=True, timeout=120)
        assert a.returncode == 0, a.stderr
        run_cli("import", str(tmp_path / "g"), "-o", str(store))
    assert {p: os.stat(p).st_atime_ns for p in (lab.mount, sub, image)} == before
    s = nestrace.open(store)
    assert s.rows("SELECT op, count(*) AS n FROM vdisk_io WHERE op <> 'read' GROUP BY ALL") == []
    # (the image's writes are the virtual disk's; the host disk may see
    # xfs covering its idle log, which is not the guest FS's)
    if by == "record":
        assert s.rows("SELECT count(*) AS n FROM hostfs_io WHERE op = 'write'") == [{"n": 0}]
    # the snapshot found the file all the same
    assert s.rows("SELECT count(*) AS n FROM extent_maps WHERE role = 'guest_file' "
                  "AND phase = 'start'")[0]["n"] >= 1
    assert_losses_counted(s)
