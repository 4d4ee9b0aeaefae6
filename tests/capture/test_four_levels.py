"""Real captures: each kind of file I/O (sync, AIO, io_uring, copies, hints)
found at all four levels of a loop-device stack."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import (
    assert_losses_counted,
    drop_caches,
    prog_ids,
    requests_without_completion,
    run_cli,
    sync_lab,
)

import nestrace

pytestmark = pytest.mark.root
from tracethrough import (
    FIO_RANDREAD,
    assert_each_record_once,
    assert_traced_through,
    record_fio,
    record_python,
)


def test_concurrent_capture_with_a_1ms_flush_timer_stores_each_record_once(lab_factory, tmp_path):
    """The agent's flush runs on every CPU while programs fill the stages
    (QD32 on both CPUs): no record is lost or handed over twice."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--flush-ms", "1",
                "--", "fio", "--name=t", f"--directory={lab.mount}", "--rw=randwrite",
                "--bs=4k", "--direct=1", "--size=64M", "--time_based", "--runtime=6",
                "--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--output=/dev/null")
    assert "duplicated" not in r.stderr
    s = nestrace.open(tmp_path / "s")
    # The load must be real: records from both CPUs, and more than one per
    # 1 ms flush on average over the 6 s.  (Not an IOPS target: this host
    # did 19k to 80k+ requests here, depending on its own load.)
    per_cpu = s.rows("SELECT cpu, count(*) AS n FROM block_events GROUP BY cpu ORDER BY cpu")
    assert len(per_cpu) == 2 and min(r["n"] for r in per_cpu) > 1_000, per_cpu
    assert s.rows("SELECT count(*) AS n FROM disk_io")[0]["n"] > 6_000
    assert_each_record_once(s)
    lost = s.rows("SELECT sum(ringbuf_drops) AS drops, sum(seq_gaps) AS gaps FROM lost_events")[0]
    assert lost == {"drops": 0, "gaps": 0}


def test_ext4_on_xfs_every_fio_read_is_seen_at_all_four_levels(lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    s, offsets, r = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD)
    assert_traced_through(s, offsets)
    assert_losses_counted(s, r.stdout)
    hooks = json.loads(s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])
    assert hooks["block_rq_issue"] == "tp_btf"
    # on an xfs host the generic access hooks hostfs_io ignores are not attached
    assert hooks["xfs_file_direct_read"] == "tp_btf"
    assert hooks["iomap_dio_rw_begin"] == hooks["mm_filemap_get_pages"] == "skipped"


def test_unaligned_direct_writes_into_a_sparse_xfs_image_are_one_access_each(lab_factory, tmp_path):
    """Guest ext4 with 1 KiB blocks on a sparse image on xfs (4 KiB blocks),
    the guest's loop writing the image with O_DIRECT: its writes are not
    aligned to xfs's block, and where the image has holes xfs tries each
    twice (shared iolock, then exclusive).  The capture must show both
    tries, and hostfs_io one access per vdisk write, at its image offset."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on", guest_block_size=1024)
    store = tmp_path / "s"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "fio", "--name=w",
            f"--directory={lab.mount}", "--rw=randwrite", "--bs=4k", "--size=16M",
            "--io_size=4M", "--direct=1", "--output=/dev/null")
    s = nestrace.open(store)
    tries = s.rows("SELECT iocb_flags & 32 <> 0 AS excl, count(*) AS n FROM hostfs_events "
                   "WHERE source = 4 GROUP BY ALL ORDER BY ALL")
    retried = {r["excl"]: r["n"] for r in tries}
    assert retried.get(True, 0) >= 100, tries       # the kernel did retry: the case is real
    # (a write whose C the kernel ran no program for has no window: counted apart)
    assert_losses_counted(s)
    no_c = requests_without_completion(s, "vdisk", "write")
    writes = s.rows("""
        SELECT count(*) AS vdisk,
               count(*) FILTER (WHERE (SELECT count(*) FROM hostfs_io h WHERE h.op = 'write'
                   AND h.offset_bytes = v.offset_bytes AND h.bytes = v.bytes
                   AND h.ts_ns BETWEEN v.d_ns AND v.c_ns) = 1) AS one_access
        FROM vdisk_io v WHERE v.op = 'write' AND v.c_ns IS NOT NULL""")[0]
    assert writes["vdisk"] + no_c >= 1024 and writes["one_access"] == writes["vdisk"], (writes, no_c)
    n = s.rows("SELECT count(*) AS n FROM hostfs_io WHERE op = 'write'")[0]["n"]
    assert n == s.rows("SELECT count(*) AS n FROM vdisk_io WHERE op = 'write'")[0]["n"]


@pytest.mark.parametrize("host_fs", ["ext4", "btrfs"])
def test_direct_reads_and_writes_of_the_image_keep_their_direction_at_hostfs(lab_factory, tmp_path, host_fs):
    """The loop device reads and writes the image with iocbs that carry no
    IOCB_WRITE: iomap_dio_rw_begin's direction must come from the iov_iter
    (it once came from the iocb, and every write on an ext2/3/4 host was a
    hostfs read).  Each vdisk read and write has one hostfs access of the
    same direction at its image offset, made while the request was out.
    btrfs takes direct reads the iomap way but writes them through its page
    cache, so its writes are the folios they dirty, with op write too."""
    lab = lab_factory("ext4", host_fs, guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=32M")
    store = tmp_path / "s"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "fio", "--name=t",
            f"--directory={lab.mount}", "--rw=randrw", "--bs=4k", "--size=32M",
            "--io_size=4M", "--direct=1", "--output=/dev/null")
    s = nestrace.open(store)
    got = s.rows("""
        SELECT v.op, count(*) AS vdisk,
               count(*) FILTER (WHERE (SELECT count(*) FROM hostfs_io h WHERE h.op = v.op
                   AND h.offset_bytes = v.offset_bytes AND h.bytes = v.bytes
                   AND h.ts_ns BETWEEN v.d_ns AND v.c_ns) = 1) AS same_access
        FROM vdisk_io v WHERE v.op IN ('read', 'write') AND v.c_ns IS NOT NULL
        GROUP BY ALL ORDER BY ALL""")
    assert [r["op"] for r in got] == ["read", "write"], got
    for r in got:
        assert r["vdisk"] >= 400, got
        if host_fs == "ext4" or r["op"] == "read":
            assert r["same_access"] == r["vdisk"], got
    ops = {r["op"]: r["n"] for r in s.rows("SELECT op, count(*) AS n FROM hostfs_io GROUP BY ALL")}
    # all of them, also a request whose completion the kernel ran no program for
    vd = {r["op"]: r["n"] for r in s.rows("SELECT op, count(*) AS n FROM vdisk_io GROUP BY ALL")}
    assert ops["read"] == vd["read"], (ops, vd)
    if host_fs == "ext4":
        assert ops["write"] == vd["write"], (ops, vd)
    else:   # a folio dirtied again before write-back is not seen again
        assert 0.5 * vd["write"] <= ops["write"] <= vd["write"], (ops, vd)
    assert_losses_counted(s)


@pytest.mark.parametrize("per_request", [False, True], ids=["events", "per-request"])
def test_pieces_of_bios_split_at_the_virtual_disk_keep_their_q(lab_factory, tmp_path, per_request):
    """256 KiB O_DIRECT writes on a virtual disk that takes at most 64 KiB
    per request: each bio is cut into four pieces (three X events and the
    remainder), four requests that all have the write's Q, so Q2G and Q2C
    exist for every data request and sum up per write.  --per-request:
    the kernel gives each piece its parent's Q, and counts the Q once."""
    lab = lab_factory("ext4", "xfs", guest_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=8M")
    vdisk = Path(subprocess.run(["findmnt", "-no", "SOURCE", lab.mount], check=True,
                                capture_output=True, text=True).stdout.strip()).name
    limit = Path(f"/sys/block/{vdisk}/queue/max_sectors_kb")
    before = limit.read_text()
    limit.write_text("64\n")
    store = tmp_path / "s"
    try:
        run_cli("record", "-o", str(store), "--stack", lab.mount,
                *(["--per-request"] if per_request else []), "--", "fio", "--name=t",
                f"--directory={lab.mount}", "--ioengine=psync", "--output=/dev/null",
                "--rw=write", "--bs=256k", "--direct=1", "--size=8M")
    finally:
        limit.write_text(before)    # (the loop device keeps it after it is detached)
    s = nestrace.open(store)
    assert_losses_counted(s)
    splits = s.rows("SELECT count(*) AS n FROM block_events e JOIN device_map m "
                    "ON m.dev = e.dev AND m.level = 'vdisk' WHERE e.action = 8")[0]["n"]
    assert splits >= 3 * 32 or per_request
    data = s.rows("SELECT count(*) AS n, count(q_ns) AS q, count(q2g_ns) AS q2g, "
                  "max(bytes) AS most FROM vdisk_io WHERE op IN ('read', 'write')")[0]
    assert data["n"] >= 4 * 32 and data["q"] == data["n"] == data["q2g"], data
    assert data["most"] == 64 << 10
    # the fio writes: groups of four 64 KiB requests sharing one Q, in order
    whole = s.rows("SELECT count(*) AS n FROM (SELECT q_ns FROM vdisk_io WHERE op = 'write' "
                   "GROUP BY q_ns HAVING count(*) = 4 AND sum(bytes) = 256 * 1024 "
                   "AND max(sector) - min(sector) = 3 * 128 AND bool_and(g_ns >= q_ns))")[0]["n"]
    assert whole == 32
    # a bio's Q counted once (size_merge_ratio.queued), not once per piece:
    # the Q events of the 256 KiB writes, or what their pieces' rows count
    vdisk_dev = "(SELECT dev FROM device_map WHERE level = 'vdisk')"
    queued = s.rows(f"SELECT (SELECT count(*) FROM block_events WHERE action = 1 "
                    f"AND nr_sectors = 512 AND dev = {vdisk_dev}) AS events, "
                    f"(SELECT coalesce(sum(queued), 0) FROM block_request_records WHERE action = 7 "
                    f"AND nr_sectors = 128 AND req_op = 1 AND dev = {vdisk_dev}) AS requests")[0]
    assert queued == ({"events": 0, "requests": 32} if per_request else
                      {"events": 32, "requests": 0}), queued


@pytest.mark.parametrize("mode", ["tp_btf", "raw_tp"])
def test_libaio_reads_at_queue_depth_16_are_seen_at_all_four_levels(lab_factory, tmp_path, mode):
    """Linux AIO: one vfs_io row per iocb (io_submit to the io_getevents
    that reaped it), at fio's offset, and each traced down the stack.
    (io_getevents' events pointer is read from the registers at its exit,
    on both kinds of program.)"""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    s, offsets, _ = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD,
                               "--ioengine=libaio", "--iodepth=16", extra=["--mode", mode])
    hooks = json.loads(s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])
    assert hooks["sys_enter"] == hooks["sys_exit"] == mode
    assert_traced_through(s, offsets, syscall="aio_pread")
    assert s.rows("SELECT count(*) AS n FROM vfs_io WHERE syscall NOT LIKE 'aio_%' "
                  "AND op = 'read'") == [{"n": 0}]
    # up to 16 in flight at once: the rows overlap in time
    in_flight = s.rows("SELECT max(n) AS n FROM (SELECT count(*) AS n FROM vfs_io a JOIN vfs_io b "
                       "ON b.ts_ns <= a.ts_ns AND a.ts_ns < b.end_ns GROUP BY a.io_id)")[0]["n"]
    assert 2 <= in_flight <= 16, in_flight
    assert s.rows("SELECT fraction FROM links_to_vfs ORDER BY level") == [
        {"fraction": 1.0}, {"fraction": 1.0}]


def kernel_has_kfunc(name: str) -> bool:
    out = subprocess.run(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux"],
                         check=True, capture_output=True, text=True).stdout
    return f"FUNC '{name}' " in out


@pytest.mark.parametrize("mode", ["tp_btf", "raw_tp"])
def test_open_files_fields_are_plain_loads_where_the_kernel_has_bpf_rdonly_cast(lab_factory, mode):
    """The syscall programs read the open file behind an fd (its inode,
    device, flags, position) through bpf_rdonly_cast, a load each, where
    the kernel has that kfunc (Linux 6.2+) and the programs are tp_btf;
    elsewhere a probe read each, the cast's path dead code the verifier
    removed.  Which one the kernel kept shows in the loaded program's line
    info.  (The libaio test above checks the rows both ways give.)"""
    from nestrace.capture.agent import agent_args, side_families
    from nestrace.capture.stack import discover
    lab = lab_factory("ext4", "xfs")
    stack = discover(lab.mount)
    agent = subprocess.Popen(agent_args(stack, None, mode, side_families(stack))
                             + ["-o", "/dev/null"], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        for line in agent.stderr:
            if line.startswith("nestrace-agent: tracing"):
                break
        assert line.startswith("nestrace-agent: tracing"), line
        ours = prog_ids(agent.pid)
        progs = json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], check=True,
                                          capture_output=True, text=True).stdout)
        name = {"tp_btf": "sys_enter_btf", "raw_tp": "sys_enter_raw"}[mode]
        ids = [p["id"] for p in progs if p["id"] in ours and p.get("name") == name]
        assert len(ids) == 1, [(p["id"], p.get("name")) for p in progs if p["id"] in ours]
        xlated = subprocess.run(["bpftool", "prog", "dump", "xlated", "id", str(ids[0])],
                                check=True, capture_output=True, text=True).stdout
    finally:
        agent.send_signal(signal.SIGINT)
        err = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, err
    assert "inode = RD1(cast, f, f_inode);" in xlated     # the lookup, either way
    cast = "f = bpf_rdonly_cast(f, bpf_core_type_id_kernel(struct file));" in xlated
    assert cast == (mode == "tp_btf" and kernel_has_kfunc("bpf_rdonly_cast")), mode


def test_io_uring_reads_are_seen_at_all_four_levels(lab_factory, tmp_path):
    """io_uring: one vfs_io row per request, from submission to its CQE."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    s, offsets, _ = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD,
                               "--ioengine=io_uring", "--iodepth=16")
    assert_traced_through(s, offsets, syscall="uring_read")


def test_io_uring_sqpoll_with_registered_files_and_fsyncs(lab_factory, tmp_path):
    """SQPOLL (fio registers the files for it): requests are submitted by
    the ring's kernel thread and name their file by index; fsyncs too."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=16M")
    out = tmp_path / "fio.json"
    run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--", "fio", "--name=t",
            f"--directory={lab.mount}", "--rw=randwrite", "--bs=4k", "--direct=1", "--size=16M",
            "--io_size=4M", "--ioengine=io_uring", "--iodepth=16", "--sqthread_poll=1",
            "--fsync=16", "--output-format=json", f"--output={out}")
    syncs = json.loads(out.read_text())["jobs"][0]["sync"]["total_ios"]
    s = nestrace.open(tmp_path / "s")
    got = {r["syscall"]: r for r in s.rows(
        "SELECT syscall, count(*) AS n, sum(ret_bytes) AS bytes, min(offset_bytes) AS min_off, "
        "bool_and(comm LIKE 'iou-sqp-%') AS by_sq_thread FROM vfs_io GROUP BY ALL")}
    assert set(got) == {"uring_write", "uring_fsync"}
    assert got["uring_write"]["n"] == 1024 and got["uring_write"]["bytes"] == 4 * 1024 * 1024
    assert got["uring_fsync"]["n"] == syncs > 0 and got["uring_fsync"]["min_off"] == -1
    assert got["uring_write"]["by_sq_thread"]
    assert s.rows("SELECT flushes FROM sync_transform WHERE level = 'vfs'") == [{"flushes": syncs}]
    lost = s.rows("SELECT sum(ringbuf_drops) AS drops, sum(seq_gaps) AS gaps FROM lost_events")[0]
    assert lost == {"drops": 0, "gaps": 0}


# Linux AIO without libaio: one iocb of each kind, submitted and reaped
# one at a time (fio sends its fsyncs as plain fsync calls)
AIO_EACH_KIND = r"""
import ctypes, os, sys
from ctypes import POINTER, addressof, byref, c_int16, c_int32, c_int64, c_uint16, c_uint32, c_uint64
libc = ctypes.CDLL(None, use_errno=True)
SETUP, SUBMIT, GETEVENTS = {"x86_64": (206, 209, 208), "aarch64": (0, 2, 4)}[os.uname().machine]
class Iocb(ctypes.Structure):
    _fields_ = [("data", c_uint64), ("key", c_uint32), ("rw_flags", c_int32), ("opcode", c_uint16),
                ("reqprio", c_int16), ("fildes", c_uint32), ("buf", c_uint64), ("nbytes", c_uint64),
                ("offset", c_int64), ("reserved2", c_uint64), ("flags", c_uint32), ("resfd", c_uint32)]
class Event(ctypes.Structure):
    _fields_ = [("data", c_uint64), ("obj", c_uint64), ("res", c_int64), ("res2", c_int64)]
class Iovec(ctypes.Structure):
    _fields_ = [("base", c_uint64), ("len", c_uint64)]
ctx = ctypes.c_ulong(0)
assert libc.syscall(SETUP, 8, byref(ctx)) == 0, ctypes.get_errno()
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
buf = ctypes.create_string_buffer(b"x" * 8192)
iov = (Iovec * 2)(Iovec(addressof(buf), 1024), Iovec(addressof(buf) + 4096, 3072))
for op, b, n, off in [(1, addressof(buf), 4096, 8192),       # IOCB_CMD_PWRITE
                      (7, addressof(iov), 2, 8192),         # IOCB_CMD_PREADV, two iovecs
                      (2, 0, 0, 0), (3, 0, 0, 0)]:          # FSYNC, FDSYNC
    cb = Iocb(opcode=op, fildes=fd, buf=b, nbytes=n, offset=off)
    arr = (POINTER(Iocb) * 1)(ctypes.pointer(cb))
    assert libc.syscall(SUBMIT, ctx, ctypes.c_long(1), arr) == 1, ctypes.get_errno()
    ev = (Event * 1)()
    assert libc.syscall(GETEVENTS, ctx, ctypes.c_long(1), ctypes.c_long(1), ev, None) == 1
    assert ev[0].res >= 0, ev[0].res
"""


def test_each_kind_of_aio_iocb_is_one_row(lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--", sys.executable,
            "-c", AIO_EACH_KIND, f"{lab.mount}/aio")
    s = nestrace.open(tmp_path / "s")
    got = s.rows("SELECT syscall, op, offset_bytes, req_bytes, ret_bytes, end_ns > ts_ns AS timed "
                 "FROM vfs_io WHERE syscall LIKE 'aio_%' ORDER BY ts_ns")
    assert got == [
        {"syscall": "aio_pwrite", "op": "write", "offset_bytes": 8192, "req_bytes": 4096,
         "ret_bytes": 4096, "timed": True},
        {"syscall": "aio_preadv", "op": "read", "offset_bytes": 8192, "req_bytes": 4096,
         "ret_bytes": 4096, "timed": True},
        {"syscall": "aio_fsync", "op": "sync", "offset_bytes": -1, "req_bytes": 0, "ret_bytes": 0,
         "timed": True},
        {"syscall": "aio_fdsync", "op": "sync", "offset_bytes": -1, "req_bytes": 0, "ret_bytes": 0,
         "timed": True}]
    assert s.rows("SELECT flushes FROM sync_transform WHERE level = 'vfs'") == [{"flushes": 2}]


# Linux AIO with a fresh iocb for every write, none reused: 40,000 of
# them, 128 per io_submit, each batch reaped before the next
AIO_NEVER_REUSED = AIO_EACH_KIND.split("ctx = ctypes")[0] + r"""
N, BATCH = 40000, 128
ctx = ctypes.c_ulong(0)
assert libc.syscall(SETUP, BATCH, byref(ctx)) == 0, ctypes.get_errno()
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
buf = ctypes.create_string_buffer(b"y" * 4096)
cbs = (Iocb * N)()
evs = (Event * BATCH)()
for i in range(N):
    cbs[i] = Iocb(opcode=1, fildes=fd, buf=addressof(buf), nbytes=4096, offset=(i % 256) * 4096)
for first in range(0, N, BATCH):
    n = min(BATCH, N - first)
    arr = (POINTER(Iocb) * n)(*[ctypes.pointer(cbs[i]) for i in range(first, first + n)])
    assert libc.syscall(SUBMIT, ctx, ctypes.c_long(n), arr) == n, ctypes.get_errno()
    got = 0
    while got < n:
        r = libc.syscall(GETEVENTS, ctx, ctypes.c_long(1), ctypes.c_long(BATCH), evs, None)
        assert r > 0, ctypes.get_errno()
        assert all(evs[k].res == 4096 for k in range(r))
        got += r
"""


def test_aio_iocbs_never_reused_past_the_in_flight_map_are_all_rows(lab_factory, tmp_path):
    """A reaped iocb's element is kept for its next submission while the
    in-flight map is at most half full, and deleted past that: 40,000
    iocbs at distinct addresses (the map holds 32,768) are 40,000 rows,
    none lost."""
    lab = lab_factory("ext4", "xfs")
    run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--", sys.executable,
            "-c", AIO_NEVER_REUSED, f"{lab.mount}/aio")
    s = nestrace.open(tmp_path / "s")
    assert s.rows("SELECT count(*) AS n, count(DISTINCT offset_bytes) AS offsets, "
                  "sum(ret_bytes) AS bytes, bool_and(req_bytes = 4096) AS sized "
                  "FROM vfs_io WHERE syscall = 'aio_pwrite'") == [
        {"n": 40000, "offsets": 256, "bytes": 40000 * 4096, "sized": True}]
    lost = s.rows("SELECT sum(ringbuf_drops) AS drops, sum(seq_gaps) AS gaps FROM lost_events")[0]
    assert lost == {"drops": 0, "gaps": 0}



# io_uring without liburing: a ring, and run() to submit one request and
# reap it (sqe_flags 1: IOSQE_FIXED_FILE, 32: IOSQE_BUFFER_SELECT; group:
# the SQE's buf_group; fd_in: its splice_fd_in)
URING_RING = r"""
import ctypes, mmap, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
SETUP, ENTER, REGISTER = 425, 426, 427  # the same on x86_64 and aarch64
params = ctypes.create_string_buffer(120)
ring = libc.syscall(SETUP, 4, params)
assert ring >= 0, ctypes.get_errno()
sq_entries, = struct.unpack_from("I", params, 0)
sq_off = struct.unpack_from("7I", params, 40)       # head tail mask entries flags dropped array
cq_off = struct.unpack_from("6I", params, 80)       # head tail mask entries overflow cqes
sq = mmap.mmap(ring, sq_off[6] + 4 * sq_entries, offset=0)
sqes = mmap.mmap(ring, 64 * sq_entries, offset=0x10000000)
cq = mmap.mmap(ring, cq_off[5] + 16 * 2 * sq_entries, offset=0x8000000)
def run(opcode, off, addr, length, op_flags=0, fd=None, fd_in=0, sqe_flags=0, group=0):
    tail, = struct.unpack_from("I", sq, sq_off[1])
    i = tail & struct.unpack_from("I", sq, sq_off[2])[0]
    struct.pack_into("BBHiqqIIQHHi", sqes, 64 * i, opcode, sqe_flags, 0,
                     FD if fd is None else fd, off, addr, length, op_flags, 0, group, 0, fd_in)
    struct.pack_into("I", sq, sq_off[6] + 4 * i, i)
    struct.pack_into("I", sq, sq_off[1], tail + 1)
    assert libc.syscall(ENTER, ring, 1, 1, 1, None, 0) == 1, ctypes.get_errno()
    head, = struct.unpack_from("I", cq, cq_off[0])
    _, res, _ = struct.unpack_from("QiI", cq, cq_off[5] + 16 * (head & struct.unpack_from(
        "I", cq, cq_off[2])[0]))
    struct.pack_into("I", cq, cq_off[0], head + 1)
    assert res >= 0, (opcode, res)
    return res
"""

# a buffered write, sync_file_range of it, a hole punched further on, each
# submitted and reaped one at a time; then syncfs
URING_EACH_KIND = URING_RING + r"""
fd = FD = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
buf = ctypes.create_string_buffer(b"x" * 16384)
run(23, 0, ctypes.addressof(buf), 16384)         # IORING_OP_WRITE, 16 KiB at 0
run(8, 0, 0, 16384, 7)                           # SYNC_FILE_RANGE, WAIT_BEFORE|WRITE|WAIT_AFTER
run(17, 32768, 8192, 3)                          # FALLOCATE 8 KiB at 32 KiB, PUNCH_HOLE|KEEP_SIZE
assert libc.syncfs(fd) == 0                      # the guest FS commits: its discards go down
run(24, 0, 0, 65536, 4)                          # FADVISE DONTNEED [0, 64K): the clean pages go
run(24, 0, 0, 65536, 3)                          # FADVISE WILLNEED: read back in (not the hole)
run(55, 49152, 0, 0)                             # FTRUNCATE to 48 KiB: 16 KiB cut off
"""


def test_io_uring_sync_file_range_fallocate_fadvise_and_ftruncate_are_followed_down(
        lab_factory, tmp_path):
    # a buffered io_uring write over a file's blocks, its sync_file_range,
    # which writes it to the virtual disk while it runs, and a hole punched
    # further on in the file, which the guest FS (online discard) discards
    # at its commit, tied to the request; then fadvise DONTNEED and
    # WILLNEED, which reads the file back in, and an ftruncate
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on", guest_discard=True)
    f = f"{lab.mount}/u"
    subprocess.run(["dd", "if=/dev/urandom", f"of={f}", "bs=64k", "count=1", "status=none"],
                   check=True)
    sync_lab(lab)
    s = record_python(lab, tmp_path / "s", URING_EACH_KIND, f)
    got = {r.pop("syscall"): r for r in s.rows(
        "SELECT syscall, io_id, ts_ns, end_ns, op, offset_bytes, req_bytes, bytes, falloc_mode "
        "FROM vfs_io WHERE syscall LIKE 'uring_%'")}
    assert set(got) == {"uring_write", "uring_sync_file_range", "uring_fallocate",
                        "uring_ftruncate"}, got
    pick = ("op", "offset_bytes", "req_bytes", "bytes", "falloc_mode")
    assert {k: {c: r[c] for c in pick} for k, r in got.items()} == {
        "uring_write": dict(zip(pick, ("write", 0, 16384, 16384, None))),
        "uring_sync_file_range": dict(zip(pick, ("sync", 0, 16384, 0, None))),
        "uring_fallocate": dict(zip(pick, ("discard", 32768, 8192, 8192, 3))),
        "uring_ftruncate": dict(zip(pick, ("discard", 49152, 65536, 16384, None)))}
    # the fadvise requests are hints; WILLNEED's reads (the file's 64 KiB
    # but the 8 KiB hole) are tied to it
    hints = s.rows("SELECT syscall, advice, offset_bytes, req_bytes, ret, tied_bytes "
                   "FROM vfs_hints LEFT JOIN (SELECT upper_id AS io_id, sum(bytes) AS tied_bytes "
                   "FROM links WHERE kind = 'hint' GROUP BY ALL) USING (io_id) ORDER BY ts_ns")
    assert hints == [{"syscall": "uring_fadvise", "advice": a, "offset_bytes": 0,
                      "req_bytes": 65536, "ret": 0, "tied_bytes": n}
                     for a, n in (("dontneed", None), ("willneed", 57344))], hints
    # the write's 16 KiB reached the virtual disk inside the sync_file_range
    sfr = got["uring_sync_file_range"]
    wb = s.rows("SELECT sum(l.bytes) AS bytes, bool_and(v.start_ns BETWEEN ? AND ?) AS inside "
                "FROM links l JOIN vdisk_io v ON v.io_id = l.lower_id "
                "WHERE l.lower_level = 'vdisk' AND l.upper_id = ? AND l.kind = 'writeback'",
                [sfr["ts_ns"], sfr["end_ns"], got["uring_write"]["io_id"]])
    assert wb == [{"bytes": 16384, "inside": True}], wb
    st = {r.pop("level"): r for r in s.rows(
        "SELECT level, range_syncs, range_sync_bound_writes FROM sync_transform "
        "WHERE level IN ('vfs', 'vdisk')")}
    assert st["vfs"] == {"range_syncs": 1, "range_sync_bound_writes": 0}, st
    assert st["vdisk"]["range_syncs"] == 0 and st["vdisk"]["range_sync_bound_writes"] >= 1, st
    # the hole's 8 KiB discarded on the virtual disk, tied to the request
    d = s.rows("SELECT sum(bytes) AS bytes FROM links WHERE lower_level = 'vdisk' "
               "AND upper_id = ? AND kind IN ('discard', 'sync')",
               [got["uring_fallocate"]["io_id"]])
    assert d == [{"bytes": 8192}], d
    assert_losses_counted(s)


# madvise requests on a read-only shared mapping of a file (argv[1], 4
# MiB), then splice requests through a pipe: the file's [0, 320K) into
# file argv[2], 64 KiB at a time, by offsets and by file positions, the
# last through registered files (SPLICE_F_FD_IN_FIXED, IOSQE_FIXED_FILE);
# then a read of 4 KiB at 2 MiB into a buffer the kernel picks from a
# group the ring was given (IORING_OP_PROVIDE_BUFFERS, IOSQE_BUFFER_SELECT)
URING_MADVISE_SPLICE = URING_RING + r"""
MiB, K64 = 1 << 20, 1 << 16
FD = a = os.open(sys.argv[1], os.O_RDONLY)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
base = libc.mmap(None, 4 * MiB, 1, 1, a, 0)          # PROT_READ, MAP_SHARED
assert base not in (None, 2 ** 64 - 1), ctypes.get_errno()
run(25, 0, base, 4 * MiB, 1)                        # IORING_OP_MADVISE: RANDOM
run(25, 0, base + MiB, MiB, 3)                      # WILLNEED [1M, 2M)
run(25, 0, base + 3 * MiB, MiB, 22)                 # POPULATE_READ [3M, 4M)
e = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
r, w = os.pipe()
files = (ctypes.c_int32 * 2)(a, e)
assert libc.syscall(REGISTER, ring, 2, files, 2) == 0, ctypes.get_errno()   # REGISTER_FILES
for i in range(5):
    # IORING_OP_SPLICE: a into the pipe (off: the pipe's, -1; addr: a's
    # offset), then the pipe into e (off: e's offset, -1 its position)
    if i < 3:
        assert run(30, -1, i * K64, K64, fd=w, fd_in=a) == K64
        assert run(30, -1, -1, K64, fd=e, fd_in=r) == K64
    elif i == 3:
        os.lseek(a, i * K64, os.SEEK_SET)
        assert run(30, -1, -1, K64, fd=w, fd_in=a) == K64
        assert run(30, i * K64, -1, K64, fd=e, fd_in=r) == K64
    else:
        assert run(30, -1, i * K64, K64, 1 << 31, fd=w, fd_in=0) == K64    # a registered
        assert run(30, i * K64, -1, K64, fd=1, fd_in=r, sqe_flags=1) == K64  # e registered
os.fsync(e)
bufs = ctypes.create_string_buffer(4 * 4096)
assert run(31, 0, ctypes.addressof(bufs), 4096, fd=4, group=7) >= 0   # 4 buffers, group 7
assert run(22, 2 * MiB, 0, 4096, sqe_flags=32, group=7) == 4096
"""


@pytest.mark.parametrize("mode", ["tp_btf", "raw_tp"])
def test_io_uring_madvise_is_a_hint_and_splice_a_read_and_a_write_followed_down(
        lab_factory, tmp_path, mode):
    """io_uring's madvise (no fd: the mapping at its address) is a hint like
    madvise(2), and what WILLNEED and POPULATE_READ read is tied to it;
    its splice, like splice(2), a row for the side that is a file, the
    read's virtual-disk reads and the write's write-back tied to them."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    path = uncached_file(lab, 4)
    s = record_python(lab, tmp_path / "s", URING_MADVISE_SPLICE, path, f"{lab.mount}/e",
                      extra=["--mode", mode])
    MiB, K64 = 1 << 20, 1 << 16
    ino = {"f": os.stat(path).st_ino, "e": os.stat(f"{lab.mount}/e").st_ino}
    got = s.rows("SELECT syscall, advice, offset_bytes, req_bytes, ret, fd, ino, reads "
                 "FROM vfs_hints ORDER BY ts_ns")
    assert got == [{"syscall": "uring_madvise", "advice": a, "offset_bytes": o, "req_bytes": n,
                    "ret": 0, "fd": -1, "ino": ino["f"], "reads": a != "random"}
                   for a, o, n in (("random", 0, 4 * MiB), ("willneed", MiB, MiB),
                                   ("populate_read", 3 * MiB, MiB))], got
    tied = s.rows("SELECT syscall, advice, tied_bytes FROM hints_summary ORDER BY advice")
    assert tied == [{"syscall": "uring_madvise", "advice": a, "tied_bytes": n}
                    for a, n in (("populate_read", MiB), ("random", 0), ("willneed", MiB))], tied
    sp = s.rows("SELECT op, ino, offset_bytes, req_bytes, bytes, fd FROM vfs_io "
                "WHERE syscall = 'uring_splice' ORDER BY ts_ns, op")
    assert [(r["op"], r["ino"], r["offset_bytes"], r["req_bytes"], r["bytes"]) for r in sp] == [
        (op, ino[f], i * K64, K64, K64) for i in range(5) for op, f in (("read", "f"),
                                                                      ("write", "e"))], sp
    assert [r["fd"] for r in sp if r["op"] == "write"][4] == 1, sp   # the registered file's index
    assert s.rows("SELECT syscall, op, ino, offset_bytes, req_bytes, bytes FROM vfs_io "
                  "WHERE syscall = 'uring_read'") == [
        {"syscall": "uring_read", "op": "read", "ino": ino["f"], "offset_bytes": 2 * MiB,
         "req_bytes": 4096, "bytes": 4096}]
    # below: the virtual-disk reads of the splices' range are theirs (kind
    # sync; some read ahead of them), and the 320 KiB written to e is
    # written back for them at the fsync
    tied = {(r["op"], r["kind"]): r["bytes"] for r in s.rows(
        "SELECT f.op, l.kind, sum(l.bytes) AS bytes FROM links l "
        "JOIN vfs_io f ON f.io_id = l.upper_id AND l.upper_level = 'vfs' "
        "WHERE l.lower_level = 'vdisk' AND f.syscall = 'uring_splice' GROUP BY ALL")}
    assert tied.get(("read", "sync"), 0) >= K64 and tied.get(("write", "writeback")) == 5 * K64, \
        tied
    assert_losses_counted(s)


COPY_EACH_WAY = r"""
import os, sys
d = sys.argv[1]
MiB = 1 << 20
a = os.open(f"{d}/a", os.O_RDONLY)
b = os.open(f"{d}/b", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
c = os.open(f"{d}/c", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
null = os.open("/dev/null", os.O_WRONLY)

def whole(call, n):     # a call may move fewer bytes than asked
    done = 0
    while done < n:
        k = call(done, n - done)
        assert k > 0, k
        done += k

# copy_file_range through its offset pointers: a[1M, 2M) -> b[0, 1M)
whole(lambda k, n: os.copy_file_range(a, b, n, MiB + k, k), MiB)
# and from the file positions: a[2M, 3M) -> b[1M, 2M)
os.lseek(a, 2 * MiB, os.SEEK_SET)
os.lseek(b, MiB, os.SEEK_SET)
whole(lambda k, n: os.copy_file_range(a, b, n), MiB)
# sendfile into a file: a[3M, 3.5M) -> c[0, 0.5M)
whole(lambda k, n: os.sendfile(c, a, 3 * MiB + k, n), MiB // 2)
# and into /dev/null, on no traced file system: the read side alone
whole(lambda k, n: os.sendfile(null, a, 3 * MiB + MiB // 2 + k, n), MiB // 2)
os.fsync(b)
os.fsync(c)
# and coreutils' own cp (copy_file_range from the file positions, asking
# for 2^63 bytes), written back at a sync
import subprocess
subprocess.run(["cp", f"{d}/a", f"{d}/d"], check=True)
# splice through a pipe (a is in the page cache by now): a[0, 1M) by its
# offset pointer into the pipe, and out of it into e from e's position
e = os.open(f"{d}/e", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
r, w = os.pipe()
done = 0
while done < MiB:
    k = os.splice(a, w, min(MiB - done, 1 << 16), offset_src=done)
    assert k > 0, k
    whole(lambda _, n: os.splice(r, e, n), k)
    done += k
os.sync()
"""


def test_copy_file_range_sendfile_and_splice_are_a_read_and_a_write_followed_down(lab_factory,
                                                                                 tmp_path):
    # coreutils' cp copies with copy_file_range; on a guest ext4 the kernel
    # does it through the page cache: the source read from the virtual
    # disk, the copy written back at the fsync.  splice has a pipe on one
    # side: a row for its other side alone
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    subprocess.run(["dd", "if=/dev/urandom", f"of={lab.mount}/a", "bs=1M", "count=4",
                    "oflag=direct", "status=none"], check=True)
    drop_caches(lab)
    s = record_python(lab, tmp_path / "s", COPY_EACH_WAY, lab.mount)
    ino = {n: os.stat(f"{lab.mount}/{n}").st_ino for n in "abcde"}
    MiB = 1 << 20
    got = s.rows("SELECT syscall, op, ino, sum(bytes) AS bytes, min(offset_bytes) AS lo, "
                 "max(offset_bytes + bytes) AS hi FROM vfs_io "
                 "WHERE syscall IN ('copy_file_range', 'sendfile') AND comm <> 'cp' "
                 "GROUP BY ALL ORDER BY ALL")
    assert got == sorted([
        {"syscall": "copy_file_range", "op": "read", "ino": ino["a"], "bytes": 2 * MiB,
         "lo": MiB, "hi": 3 * MiB},
        {"syscall": "copy_file_range", "op": "write", "ino": ino["b"], "bytes": 2 * MiB,
         "lo": 0, "hi": 2 * MiB},
        {"syscall": "sendfile", "op": "read", "ino": ino["a"], "bytes": MiB, "lo": 3 * MiB,
         "hi": 4 * MiB},
        {"syscall": "sendfile", "op": "write", "ino": ino["c"], "bytes": MiB // 2, "lo": 0,
         "hi": MiB // 2}], key=lambda r: tuple(r.values())), got
    # a call's two rows: the same times and return; a write for each call
    # into c or b, none for /dev/null
    calls = s.rows("SELECT syscall, ts_ns, count(*) AS sides, count(DISTINCT end_ns) AS ends, "
                   "count(DISTINCT ret) AS rets, count(*) FILTER (WHERE op = 'read') AS reads "
                   "FROM vfs_io WHERE syscall IN ('copy_file_range', 'sendfile') AND comm <> 'cp' "
                   "GROUP BY ALL")
    assert all(c["ends"] == 1 and c["rets"] == 1 and c["reads"] == 1 for c in calls), calls
    per = {(c["syscall"], c["sides"]) for c in calls}
    assert per == {("copy_file_range", 2), ("sendfile", 2), ("sendfile", 1)}, calls
    cp = s.rows("SELECT op, ino, sum(bytes) AS bytes, min(offset_bytes) AS lo, "
                "max(offset_bytes + bytes) AS hi, max(req_bytes) AS asked FROM vfs_io "
                "WHERE comm = 'cp' AND syscall = 'copy_file_range' GROUP BY ALL ORDER BY op")
    assert [{k: r[k] for k in ("op", "ino", "bytes", "lo", "hi")} for r in cp] == [
        {"op": "read", "ino": ino["a"], "bytes": 4 * MiB, "lo": 0, "hi": 4 * MiB},
        {"op": "write", "ino": ino["d"], "bytes": 4 * MiB, "lo": 0, "hi": 4 * MiB}], cp
    assert all(r["asked"] > 1 << 62 for r in cp), cp
    # splice: a row per call, for the file side (the pipe is not traced),
    # each 64 KiB call at its place in a and then in e
    sp = s.rows("SELECT op, ino, sum(bytes) AS bytes, min(offset_bytes) AS lo, "
                "max(offset_bytes + bytes) AS hi, count(*) AS n, count(DISTINCT ts_ns) AS calls, "
                "count(DISTINCT offset_bytes) AS places FROM vfs_io WHERE syscall = 'splice' "
                "GROUP BY ALL ORDER BY op")
    assert [{k: r[k] for k in ("op", "ino", "bytes", "lo", "hi")} for r in sp] == [
        {"op": "read", "ino": ino["a"], "bytes": MiB, "lo": 0, "hi": MiB},
        {"op": "write", "ino": ino["e"], "bytes": MiB, "lo": 0, "hi": MiB}], sp
    assert all(r["n"] == r["calls"] == r["places"] for r in sp), sp
    # followed down: what the virtual disk read of a is the copies' reads';
    # what it wrote of b and c, their writes' (written back at the fsync)
    tied = {(r["cp"], r["op"], r["kind"]): r["bytes"] for r in s.rows(
        "SELECT f.comm = 'cp' AS cp, f.op, l.kind, sum(l.bytes) AS bytes FROM links l "
        "JOIN vfs_io f ON f.io_id = l.upper_id AND l.upper_level = 'vfs' "
        "WHERE l.lower_level = 'vdisk' AND f.syscall IN ('copy_file_range', 'sendfile') "
        "GROUP BY ALL")}
    assert tied.get((False, "write", "writeback")) == 2 * MiB + MiB // 2, tied
    assert tied.get((True, "write", "writeback")) == 4 * MiB, tied
    spliced = s.rows("SELECT sum(l.bytes) AS bytes FROM links l JOIN vfs_io f "
                     "ON f.io_id = l.upper_id AND l.upper_level = 'vfs' "
                     "WHERE l.lower_level = 'vdisk' AND f.syscall = 'splice' AND f.op = 'write' "
                     "AND l.kind = 'writeback'")
    assert spliced == [{"bytes": MiB}], spliced
    # a read once from the virtual disk: [1M, 4M) by the calls, in part
    # read ahead of them, and [0, 1M) by cp (the rest was cached); every
    # page read ahead was used
    ahead = s.rows("SELECT coalesce(sum(l.bytes), 0) AS n FROM links l JOIN vdisk_io v "
                   "ON v.io_id = l.lower_id WHERE l.lower_level = 'vdisk' AND v.op = 'read' "
                   "AND l.kind = 'readahead'")[0]["n"]
    assert tied.get((False, "read", "sync"), 0) >= 64 << 10, tied
    assert tied.get((True, "read", "sync")) == MiB, tied
    assert tied[(False, "read", "sync")] + tied[(True, "read", "sync")] + ahead == 4 * MiB, \
        (tied, ahead)
    ra = s.rows("SELECT readahead_bytes, used_bytes FROM readahead_summary WHERE level = 'guest'")
    assert ra[0]["readahead_bytes"] == ra[0]["used_bytes"], ra
    assert_losses_counted(s)


HINTS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDONLY)
assert libc.readahead(fd, ctypes.c_int64(0), ctypes.c_size_t(1 << 20)) == 0
os.posix_fadvise(fd, 2 << 20, 1 << 20, os.POSIX_FADV_WILLNEED)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
os.pread(fd, 4096, 0)
os.pread(fd, 4096, 2 << 20)
"""


def uncached_file(lab, mib: int) -> str:
    """A file of `mib` MiB of random bytes on the lab's guest FS, on its
    disk and in no page cache; its path."""
    path = f"{lab.mount}/f"
    subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"count={mib}",
                    "oflag=direct", "status=none"], check=True)
    drop_caches(lab)
    return path


def test_readahead_and_fadvise_are_vfs_hints_and_the_reads_they_ask_for_are_tied_to_them(
        lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    path = uncached_file(lab, 4)
    store = tmp_path / "s"
    s = record_python(lab, store, HINTS, path)
    MiB = 1 << 20
    ino = os.stat(path).st_ino
    got = s.rows("SELECT syscall, advice, offset_bytes, req_bytes, ret, ino FROM vfs_hints "
                 "ORDER BY ts_ns")
    assert got == [dict(zip(("syscall", "advice", "offset_bytes", "req_bytes", "ret", "ino"),
                            r + (ino,))) for r in [
        ("readahead", None, 0, MiB, 0), ("fadvise64", "willneed", 2 * MiB, MiB, 0),
        ("fadvise64", "sequential", 0, 0, 0)]], got
    reads = s.rows("SELECT syscall, offset_bytes, bytes FROM vfs_io ORDER BY ts_ns")
    assert reads == [{"syscall": "pread64", "offset_bytes": o, "bytes": 4096}
                     for o in (0, 2 * MiB)], reads
    # the kernel queues what a readahead or a willneed asks for before the
    # call returns: those virtual-disk reads are tied to the call, kind
    # hint, each MiB to its own call (the preads then found the pages
    # cached or in flight); the host disk's reads to those requests
    tied = s.rows("SELECT h.syscall, sum(l.bytes) AS n, count(DISTINCT l.lower_id) AS reqs "
                  "FROM links l JOIN vfs_hints h ON h.io_id = l.upper_id "
                  "WHERE l.lower_level = 'vdisk' AND l.kind = 'hint' GROUP BY ALL ORDER BY 1")
    assert [(r["syscall"], r["n"]) for r in tied] == [("fadvise64", MiB), ("readahead", MiB)], tied
    below = s.rows("SELECT sum(d.bytes) AS n FROM links d JOIN links v "
                   "ON v.lower_level = 'vdisk' AND v.lower_id = d.upper_id AND v.kind = 'hint' "
                   "WHERE d.lower_level = 'disk' AND d.upper_id IS NOT NULL")[0]["n"]
    assert below == 2 * MiB, below
    hint = s.rows("SELECT io_id FROM vfs_hints WHERE syscall = 'readahead'")[0]["io_id"]
    rows = json.loads(run_cli("follow", str(store), "vfs", str(hint), "--json").stdout)
    down = Counter()
    for r in rows:
        if r["depth"] == 1:
            down[(r["level"], r["kind"])] += r["link_bytes"]
    assert down == {("vdisk", "hint"): MiB}, rows
    # the report: a row per call and advice, what each asked for and read
    rep = json.loads(run_cli("report", str(store), "--json").stdout)["hints"]
    assert [(r["syscall"], r["advice"], r["calls"], r["range_bytes"], r["to_end_calls"],
             r["tied_bytes"]) for r in rep] == [
        ("fadvise64", "sequential", 1, 0, 1, 0), ("fadvise64", "willneed", 1, MiB, 0, MiB),
        ("readahead", None, 1, MiB, 0, MiB)], rep
    out = run_cli("report", str(store)).stdout
    assert "hint fadvise64 willneed    1 call, 1.0 MiB asked, 1.0 MiB read at vdisk" in out, out
    assert_losses_counted(s)


MAPPED_HINTS = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 4 << 20, prot=mmap.PROT_READ)
m.madvise(mmap.MADV_RANDOM)
m.madvise(mmap.MADV_WILLNEED, 1 << 20, 1 << 20)
m.madvise(22, 3 << 20, 1 << 20)     # MADV_POPULATE_READ (Linux 5.14)
assert m[1 << 20] is not None
"""


def test_madvise_of_a_mapped_file_is_a_hint_and_what_it_reads_is_tied_to_it(lab_factory,
                                                                           tmp_path):
    """madvise on a mapping of a guest file: RANDOM reads nothing;
    WILLNEED and POPULATE_READ read their MiB while the call runs."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    path = uncached_file(lab, 4)
    s = record_python(lab, tmp_path / "s", MAPPED_HINTS, path)
    MiB = 1 << 20
    got = s.rows("SELECT syscall, advice, offset_bytes, req_bytes, ret, fd, ino FROM vfs_hints "
                 "ORDER BY ts_ns")
    assert got == [{"syscall": "madvise", "advice": a, "offset_bytes": o, "req_bytes": n, "ret": 0,
                    "fd": -1, "ino": os.stat(path).st_ino}
                   for a, o, n in (("random", 0, 4 * MiB), ("willneed", MiB, MiB),
                                   ("populate_read", 3 * MiB, MiB))], got
    tied = s.rows("SELECT advice, tied_bytes FROM hints_summary ORDER BY advice")
    assert tied == [{"advice": "populate_read", "tied_bytes": MiB},
                    {"advice": "random", "tied_bytes": 0},
                    {"advice": "willneed", "tied_bytes": MiB}], tied
    assert_losses_counted(s)
