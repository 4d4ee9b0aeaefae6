"""Real captures: copies (copy_file_range, sendfile, splice) and hints
(readahead, fadvise, madvise) followed down a loop-device stack."""
from __future__ import annotations

import json
import os
import subprocess
from collections import Counter

import pytest
from conftest import (
    assert_losses_counted,
    drop_caches,
    run_cli,
)

pytestmark = pytest.mark.root
from tracethrough import record_python, uncached_file

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
