"""Real captures: mappings and syncs, devices given or discovered, the
agent's streams, a full disk, CPU pinning, pid filters, partitions."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    NESTRACE,
    ROOT,
    assert_losses_counted,
    run_cli,
)

import nestrace

pytestmark = pytest.mark.root
from tracethrough import FIO_RANDREAD, TRACE_THROUGH_MAPPED, record_fio, record_python


def test_a_file_written_only_through_a_mapping_has_its_end_extent_map(lab_factory, tmp_path):
    # no read or write system call touches it (only the ftruncate that
    # sizes it, op other: it frees nothing): its page-cache events do
    lab = lab_factory("ext4", "xfs")
    path = f"{lab.mount}/mapped"
    prog = ("import mmap, os\n"
            f"fd = os.open({path!r}, os.O_RDWR | os.O_CREAT)\n"
            "os.ftruncate(fd, 1 << 20)\n"
            "m = mmap.mmap(fd, 1 << 20)\n"
            "m[:] = b'x' * (1 << 20)\n"
            "m.flush()\n")
    s = record_python(lab, tmp_path / "s", prog)
    assert s.rows("SELECT syscall, op, offset_bytes, req_bytes, bytes FROM vfs_io "
                  "ORDER BY ts_ns") == [
        {"syscall": "ftruncate", "op": "other", "offset_bytes": 1 << 20, "req_bytes": 0,
         "bytes": 0},
        {"syscall": "msync", "op": "sync", "offset_bytes": 0, "req_bytes": 1 << 20, "bytes": 0}]
    got = s.rows("SELECT sum(length_bytes) AS n FROM extent_maps WHERE phase = 'end' AND path = ?",
                 [path])
    assert got == [{"n": 1 << 20}]


@pytest.mark.parametrize("mode", ["tp_btf", "raw_tp"])
def test_msync_is_a_sync_of_the_file_range_mapped_at_its_address(lab_factory, tmp_path, mode):
    """A mapping of file bytes [256 KiB, 768 KiB): msync of its second
    page is a sync of file bytes [260 KiB, 264 KiB), and of the whole
    mapping one of [256 KiB, 768 KiB); each writes back the page a store
    dirtied (links' kind store) while it runs (sync_transform)."""
    lab = lab_factory("ext4", "xfs")
    path = f"{lab.mount}/mapped"
    KiB = 1024
    prog = ("import mmap, os\n"
            f"fd = os.open({path!r}, os.O_RDWR | os.O_CREAT)\n"
            "os.ftruncate(fd, 1 << 20)\n"
            "m = mmap.mmap(fd, 512 << 10, offset=256 << 10)\n"
            "m[4096:8192] = b'y' * 4096\n"
            "m.flush(4096, 4096)\n"
            "m[65536:69632] = b'z' * 4096\n"
            "m.flush()\n")
    s = record_python(lab, tmp_path / "s", prog, extra=("--mode", mode))
    assert f'"sys_enter": "{mode}"' in s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"]
    ino = os.stat(path).st_ino
    got = s.rows("SELECT op, offset_bytes, req_bytes, ret, fd, ino FROM vfs_io "
                 "WHERE syscall = 'msync' ORDER BY ts_ns")
    assert got == [{"op": "sync", "offset_bytes": o, "req_bytes": n, "ret": 0, "fd": -1, "ino": ino}
                   for o, n in ((260 * KiB, 4 * KiB), (256 * KiB, 512 * KiB))], got
    sync = {r["level"]: r for r in s.rows("SELECT * FROM sync_transform")}
    assert sync["vfs"]["flushes"] == 2, sync
    assert sync["vdisk"]["fsync_bound_writes"] >= 2, sync
    stored = s.rows("SELECT coalesce(sum(bytes), 0) AS n FROM links "
                    "WHERE lower_level = 'vdisk' AND kind = 'store'")[0]["n"]
    assert stored >= 8 * KiB, stored
    assert_losses_counted(s)


def test_syncfs_and_sync_are_syncs_that_bound_the_write_back(lab_factory, tmp_path):
    """Two buffered 64 KiB writes, each written back by a sync call:
    syncfs(fd) on the file system of its fd, and sync(2), one row on the
    guest file system with no file."""
    lab = lab_factory("ext4", "xfs")
    path = f"{lab.mount}/f"
    prog = ("import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"fd = os.open({path!r}, os.O_WRONLY | os.O_CREAT)\n"
            "os.pwrite(fd, b'a' * 65536, 0)\n"
            "assert libc.syncfs(fd) == 0\n"
            "os.pwrite(fd, b'b' * 65536, 65536)\n"
            "os.sync()\n")
    s = record_python(lab, tmp_path / "s", prog)
    ino = os.stat(path).st_ino
    guest = s.rows("SELECT dev FROM device_map WHERE level = 'vfs'")[0]["dev"]
    got = s.rows("SELECT syscall, op, ino, fd >= 0 AS has_fd, dev, ret FROM vfs_io ORDER BY ts_ns")
    assert [(r["syscall"], r["op"], r["ino"], r["has_fd"], r["dev"], r["ret"]) for r in got] == [
        ("pwrite64", "write", ino, True, guest, 65536), ("syncfs", "sync", ino, True, guest, 0),
        ("pwrite64", "write", ino, True, guest, 65536), ("sync", "sync", 0, False, guest, 0)], got
    sync = {r["level"]: r for r in s.rows("SELECT * FROM sync_transform")}
    assert sync["vfs"]["flushes"] == 2, sync
    assert sync["vdisk"]["fsync_bound_writes"] >= 2, sync
    # each write is written back (links' writeback), while the sync after it runs
    wb = s.rows("SELECT w.offset_bytes, min(v.start_ns) AS at FROM links l "
                "JOIN vfs_io w ON w.io_id = l.upper_id JOIN vdisk_io v ON v.io_id = l.lower_id "
                "WHERE l.lower_level = 'vdisk' AND l.kind = 'writeback' GROUP BY ALL ORDER BY 1")
    calls = s.rows("SELECT ts_ns, end_ns FROM vfs_io WHERE op = 'sync' ORDER BY ts_ns")
    assert [r["offset_bytes"] for r in wb] == [0, 65536], wb
    for w, c in zip(wb, calls):
        assert c["ts_ns"] <= w["at"] <= c["end_ns"], (wb, calls)
    assert_losses_counted(s)


def test_explicit_devices_give_the_same_stack_as_discovery(lab_factory, tmp_path):
    import json
    lab = lab_factory("ext4", "xfs")
    st = json.loads(Path(f"/run/nestrace/labs/{lab.name}/state.json").read_text())
    a, b = tmp_path / "a", tmp_path / "b"
    run_cli("record", "-o", str(a), "--stack", lab.mount, "--duration", "0.5")
    run_cli("record", "-o", str(b), "--stack", lab.mount, "--vdisk", st["vdisk"],
            "--image", st["image"], "--disk", st["disk"], "--duration", "0.5")
    # the devices alone: the guest FS is the one mounted from the virtual disk
    c = tmp_path / "c"
    run_cli("record", "-o", str(c), "--vdisk", st["vdisk"], "--image", st["image"],
            "--disk", st["disk"], "--duration", "0.5")
    q = "SELECT level, dev, name, backing_ino, dio, fs_type FROM device_map ORDER BY level"
    assert nestrace.open(a).rows(q) == nestrace.open(b).rows(q) == nestrace.open(c).rows(q)
    assert [r["level"] for r in nestrace.open(c).rows(q)] == ["disk", "hostfs", "vdisk", "vfs"]
    # a virtual disk with nothing mounted from it: say so, record nothing
    free = subprocess.run(["losetup", "-f", "--show", st["image"], "-r"], check=True,
                          capture_output=True, text=True).stdout.strip()
    try:
        r = run_cli("record", "-o", str(tmp_path / "d"), "--vdisk", free, "--duration", "0.5",
                    check=False)
    finally:
        subprocess.run(["losetup", "-d", free], check=True)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"nestrace: error: --vdisk {free}: no file system of it is mounted: give --stack "
        "MOUNTPOINT (the guest file system)"), r.stderr
    assert not (tmp_path / "d").exists()


def test_more_devices_than_the_constant_filter_holds_use_the_filter_maps(lab_factory, tmp_path):
    """With more than NT_FAST_FILTER devices the programs filter through the
    hash maps: the traced disks are still seen, the decoys never."""
    import pyarrow as pa

    from nestrace.capture.agent import agent_args
    from nestrace.capture.stack import discover
    from nestrace.store.stream import iter_frames
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=16M")
    st = discover(lab.mount)
    decoys = [a for i in range(8) for a in ("--dev", f"7:{200 + i}=block")]
    out = tmp_path / "agent.ntr"
    with open(out, "wb") as f:
        agent = subprocess.Popen(agent_args(st, None, "auto", "block") + decoys, stdout=f,
                                 stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.5)
            lab.fio("--rw=randread", "--bs=4k", "--direct=1", "--size=16M", "--io_size=4M")
        finally:
            agent.send_signal(signal.SIGINT)
            err = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, err
    batches = []
    with open(out, "rb") as f:
        batches = [fr.batch for fr in iter_frames(f, str(out)) if fr.table == "block_events"]
    ev = pa.Table.from_batches(batches)
    devs = set(ev.column("dev").to_pylist())
    assert devs <= {st.vdisk.kdev, st.disk.kdev}
    issued = [d for d, a in zip(ev.column("dev").to_pylist(), ev.column("action").to_pylist())
              if a == 6]
    assert issued.count(st.vdisk.kdev) >= 1024   # 4M / 4k reads
    assert issued.count(st.disk.kdev) >= 1024


BAD_COMM_WRITER = r"""
import ctypes, os, sys
ctypes.CDLL("libc.so.6").prctl(15, b"nt\xff\xc3\xa9\xe2\x82w\xc0\x80", 0, 0, 0)  # PR_SET_NAME
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
for i in range(64):
    os.pwrite(fd, b"x" * 4096, i * 4096)
os.fsync(fd)
os.close(fd)
"""


def test_agent_arrow_streams_equal_the_decoded_frame_stream(lab_factory, tmp_path):
    """The agent's own Arrow IPC writer (what `record` stores live) and the
    Python decoder of its frame stream agree on every record of a real
    capture, task names that are not UTF-8 included."""
    import pyarrow as pa

    from nestrace.capture.agent import agent_args
    from nestrace.capture.stack import discover
    from nestrace.store.files import read_ipc_tolerant
    from nestrace.store.stream import iter_frames
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="off")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=16M")
    st = discover(lab.mount)
    adir, frames = tmp_path / "arrow", tmp_path / "agent.ntr"
    adir.mkdir()
    agent = subprocess.Popen(agent_args(st, None, "auto", "vfs,block,hostfs", arrow_dir=adir)
                             + ["--tee", "-o", str(frames)],
                             stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        lab.fio("--rw=randrw", "--bs=4k", "--direct=1", "--size=16M", "--io_size=4M")
        subprocess.run([sys.executable, "-c", BAD_COMM_WRITER, f"{lab.mount}/badcomm"],
                       check=True)
    finally:
        agent.send_signal(signal.SIGINT)
        err = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, err
    decoded: dict[str, list] = {}
    with open(frames, "rb") as f:
        for fr in iter_frames(f, str(frames)):
            if fr.table:
                decoded.setdefault(fr.table, []).append(fr.batch)
    assert {"vfs_events", "block_events", "hostfs_events", "agent_stats"} <= set(decoded)
    assert sorted(p.stem for p in adir.glob("*.arrows")) == sorted(decoded)
    for table, batches in decoded.items():
        got, problem = read_ipc_tolerant(adir / f"{table}.arrows")
        assert problem is None
        want = pa.Table.from_batches(batches)
        have = pa.Table.from_batches(got)
        have.validate(full=True)
        assert have.schema.equals(want.schema, check_metadata=True), table
        assert have.equals(want), table
    vfs = pa.Table.from_batches(decoded["vfs_events"])
    comms = set(vfs.column("comm").to_pylist())
    assert "nt?é??w??" in comms, comms


def test_a_store_on_a_full_disk_fails_with_one_clear_error_and_keeps_the_batches(lab_factory, tmp_path):
    """The agent's Arrow writer and the seal hit ENOSPC: `record` exits 2
    naming the file, says the agent stopped early, leaves no traceback,
    and keeps the live batches for `nestrace seal`."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        store = small / "st"
        r = run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "fio", "--name=t",
                    f"--directory={lab.mount}", "--ioengine=psync", "--output=/dev/null",
                    "--rw=randwrite", "--bs=4k", "--direct=1", "--size=64M", "--io_size=32M",
                    check=False)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert "No space left on device" in r.stderr, r.stderr
        assert ".arrows" in r.stderr, r.stderr            # the agent names its file
        assert "the agent stopped early: arrow output failed" in r.stderr, r.stderr
        assert "nestrace seal" in r.stderr, r.stderr
        live = list((store / "_live").iterdir())
        assert len(live) == 1 and (live[0] / "block_events.arrows").stat().st_size > 0
        # room made: the seal finishes, and what the agent could not write
        # is counted as lost, loudly
        subprocess.run(["mount", "-o", "remount,size=256m", str(small)], check=True)
        r = run_cli("seal", str(store))
        assert "EVENTS LOST" in r.stderr, r.stderr
        assert "no agent_stats" not in r.stderr, r.stderr   # its room was reserved
        s = nestrace.open(store)
        lost = s.rows("SELECT lost_total, records_total FROM capture_meta")[0]
        assert lost["lost_total"] > 0 and lost["records_total"] > 0
        s.close()
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_agent_cpus_pins_the_agent(lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    p = subprocess.Popen(NESTRACE + ["record", "-o", str(tmp_path / "s"), "--stack", lab.mount,
                                     "--agent-cpus", "0", "--duration", "4"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        allowed = None
        for _ in range(60):
            pids = subprocess.run(["pgrep", "-f", f"nestrace-agent.*{tmp_path}"],
                                  capture_output=True, text=True).stdout.split()
            if pids:
                status = Path(f"/proc/{pids[0]}/status").read_text()
                allowed = [l.split()[1] for l in status.splitlines()
                           if l.startswith("Cpus_allowed_list")][0]
                break
            time.sleep(0.1)
    finally:
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert allowed == "0"
    # the store says how it was recorded
    settings = json.loads(nestrace.open(tmp_path / "s").rows(
        "SELECT settings_json FROM capture_meta")[0]["settings_json"])
    assert settings["agent_cpus"] == [0] and settings["flush_ms"] == 200, settings
    assert settings["all_hooks"] is False and settings["pid"] is None, settings
    assert settings["ringbuf_bytes"] > 0 and settings["mode"] in ("auto", "tp_btf", "raw_tp")
    r = run_cli("record", "-o", str(tmp_path / "s2"), "--stack", lab.mount, "--agent-cpus", "x",
                "--duration", "1", check=False)
    assert r.returncode == 2 and "--agent-cpus: 'x' is not a CPU list" in r.stderr


# reads 100 x 4 KiB once the go file exists
PREADER = r"""
import os, sys, time
path, go = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.05)
fd = os.open(path, os.O_RDONLY)
for i in range(100):
    os.pread(fd, 4096, i * 8192)
"""


def test_pid_filter_keeps_one_process_at_the_vfs_level(lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=16M")
    target = f"{lab.mount}/t.0.0"
    go = tmp_path / "go"
    reader = subprocess.Popen([sys.executable, "-c", PREADER, target, str(go)])
    rec = subprocess.Popen(NESTRACE + ["record", "-o", str(tmp_path / "s"), "--stack", lab.mount,
                                       "--pid", str(reader.pid), "--duration", "4"],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(100):       # the agent is up
            if subprocess.run(["pgrep", "-f", f"nestrace-agent.*{tmp_path}"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        time.sleep(1)
        lab.fio("--rw=randread", "--bs=4k", "--direct=1", "--size=16M", "--io_size=2M")
        go.touch()
        assert reader.wait(timeout=30) == 0
    finally:
        reader.kill()
        out, err = rec.communicate(timeout=60)
    assert rec.returncode == 0, err
    s = nestrace.open(tmp_path / "s")
    assert s.rows("SELECT pid, count(*) AS n FROM vfs_io WHERE op = 'read' GROUP BY pid") == [
        {"pid": reader.pid, "n": 100}]
    # fio's 512 O_DIRECT reads still reach the disk, untraced at the vfs level
    assert s.rows("SELECT count(*) AS n FROM disk_io WHERE op = 'read'")[0]["n"] > 512
    assert json.loads(run_cli("report", "--json", str(tmp_path / "s")).stdout)["vfs_only"] == \
        {"pid": reader.pid, "cgroup": None}
    r = run_cli("record", "-o", str(tmp_path / "s2"), "--stack", lab.mount, "--pid", "999999999",
                "--duration", "1", check=False)
    assert r.returncode == 2 and "--pid 999999999: no such process" in r.stderr
    # a workload that cannot start: one line, and no store or capture left
    (tmp_path / "plain.sh").write_text("echo hi\n")
    elf = tmp_path / "bad.elf"
    elf.write_bytes(b"\x7fELF junk")
    elf.chmod(0o755)
    for cmd, said in ((["no-such-command-nt"], "no-such-command-nt: command not found"),
                      ([str(tmp_path / "plain.sh")], f"{tmp_path / 'plain.sh'}: not executable"),
                      ([str(elf)], f"{elf}: could not start: Exec format error (nothing recorded)")):
        r = run_cli("record", "-o", str(tmp_path / "s3"), "--stack", lab.mount, "--", *cmd,
                    check=False)
        assert r.returncode == 2 and said in r.stderr.splitlines()[-1], r.stderr
        assert not list((tmp_path / "s3").glob("*/capture=*"))
        assert not list((tmp_path / "s3").glob("_live/*"))


def test_file_systems_on_partitions_trace_through_to_the_whole_disks(lab_factory, tmp_path):
    """Both file systems on a partition 1 MiB into their disk (the lab's
    --partitions; a real VM image is partitioned): bio events of a
    partition carry the whole disk's dev like its requests, and the offset
    maps add each partition's start, so every fio read is followed to a
    vdisk and a disk request at the right place."""
    from nestrace.capture.lab import PART_START
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on", partitions=True)
    src = {l.split()[1]: l.split()[0] for l in Path("/proc/mounts").read_text().splitlines()}
    assert src[lab.mount].endswith("p1")
    s, offsets, _ = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD)
    assert sorted(r["offset_bytes"] for r in s.rows("SELECT offset_bytes FROM vfs_io")) == sorted(offsets)
    dm = {r["level"]: r for r in s.rows("SELECT level, dev, part_start_bytes, size_sectors "
                                        "FROM device_map")}
    assert dm["vfs"]["part_start_bytes"] == dm["hostfs"]["part_start_bytes"] == PART_START
    # and how long each partition is
    host = str(Path(lab.mount).parent / "host")
    for level, mp in (("vfs", lab.mount), ("hostfs", host)):
        size = Path(f"/sys/class/block/{Path(src[mp]).name}/size").read_text()
        assert dm[level]["size_sectors"] == int(size) > 0, (level, dm)
    assert {r["dev"] for r in s.rows("SELECT DISTINCT dev FROM block_events")} == \
        {dm["vdisk"]["dev"], dm["disk"]["dev"]}
    # each read's mapped pieces (a read crossing the end of an image extent
    # is two: mke2fs gives a file system this small 1 KiB blocks) fall in a
    # request of that level in flight with it
    reads, n, vdisk, hostfs, disk = s.con.execute(TRACE_THROUGH_MAPPED, {"err": 0}).fetchone()
    assert reads == 4096 and n == vdisk == hostfs == disk, (reads, n, vdisk, hostfs, disk)
    to_app = {r["level"]: r["fraction"] for r in s.rows("SELECT level, fraction FROM links_to_vfs")}
    # (a vdisk request whose C was lost still ties its disk requests:
    # block_requests.done_by_ns)
    assert_losses_counted(s)
    assert to_app["vdisk"] == 1.0 and to_app["disk"] == 1.0, to_app
