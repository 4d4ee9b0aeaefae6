"""Real captures: Linux AIO and io_uring, each kind of request found at
all four levels of a loop-device stack."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import (
    assert_losses_counted,
    run_cli,
    sync_lab,
)

import nestrace

pytestmark = pytest.mark.root
from tracethrough import (
    FIO_RANDREAD,
    assert_traced_through,
    record_fio,
    record_python,
    uncached_file,
)


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
