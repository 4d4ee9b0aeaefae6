"""Hand-built rows for diff tests: each helper fills every column with a
default so a test names only what it is about."""
from __future__ import annotations

from nestrace.importers.blkimport import NT_ACTIONS

CAP = "c1"
GUEST, VDISK, HOSTFS, DISK = (7 << 20) | 1, (7 << 20) | 1, (7 << 20) | 0, (7 << 20) | 0
# (in the lab the guest FS is on the vdisk and the host FS on the disk: same dev_t)


def capture_meta(**kw):
    return [{"capture_id": CAP, "machine": "m1", "kernel": "6.x", "clock": "CLOCK_MONOTONIC",
             "start_ns": 0, "end_ns": 10**9, "start_wall": "", "command": "", "hooks_json": "{}",
             "stack_json": "{}", "lost_total": 0, "records_total": 0, "tool_version": "t",
             "schema_version": "{}", **kw}]


def device_map(guest_fs="ext4", host_fs="xfs"):
    base = {"capture_id": CAP, "size_sectors": 0, "backing_dev": 0, "backing_ino": 0,
            "backing_path": "", "backing_offset_bytes": 0, "dio": False, "fs_type": "",
            "block_size_bytes": 4096}
    return [base | {"level": "vfs", "dev": GUEST, "name": "/g", "fs_type": guest_fs},
            base | {"level": "vdisk", "dev": VDISK, "name": "loop1", "size_sectors": 1 << 20,
                    "backing_dev": HOSTFS, "backing_ino": 131},
            base | {"level": "hostfs", "dev": HOSTFS, "name": "/h", "fs_type": host_fs},
            base | {"level": "disk", "dev": DISK, "name": "loop0", "size_sectors": 1 << 21}]


_seq = iter(range(1, 1 << 30))


def _hdr(kind, ts):
    return {"kind": kind, "version": 1, "cpu": 0, "seq": next(_seq), "ts_ns": ts, "capture_id": CAP}


def blk(action, ts, dev=DISK, sector=0, nr=8, rq=0, bio=0, op=0, flags=0, error=0, aux=0):
    return _hdr(2, ts) | {"sector": sector, "rq_id": rq, "bio_id": bio, "aux_sector": aux,
                          "dev": dev, "nr_sectors": nr, "pid": 1, "error": error,
                          "action": NT_ACTIONS[action], "req_op": op, "req_flags": flags,
                          "comm": "t"}


def vfs(ts, dur, ino=12, off=0, req=4096, ret=4096, syscall=3, f_flags=0, dev=GUEST):
    return _hdr(1, ts) | {"duration_ns": dur, "ino": ino, "offset_bytes": off, "req_bytes": req,
                          "ret": ret, "dev": dev, "pid": 1, "tid": 1, "f_flags": f_flags,
                          "syscall": syscall, "iov_count": 1, "fd": 3, "comm": "fio"}


def hostfs(ts, off, nbytes, source, op=0, flags=0, ino=131, dev=HOSTFS):
    return _hdr(3, ts) | {"ino": ino, "offset_bytes": off, "bytes": nbytes, "isize_bytes": 1 << 29,
                          "dev": dev, "pid": 1, "iocb_flags": flags, "source": source, "op": op,
                          "comm": "loop1"}


def extents(guest=((0, 4 << 20, 1 << 20),), image=((0, 100 << 20, 64 << 20),), ino=12):
    """Extent rows: guest file (logical, physical on vdisk, length), image
    (logical, physical on disk, length); end snapshots."""
    base = {"capture_id": CAP, "phase": "end", "path": "", "flags": 0}
    rows = [base | {"role": "guest_file", "dev": GUEST, "ino": ino, "logical_bytes": lo,
                    "physical_bytes": ph, "length_bytes": ln} for lo, ph, ln in guest]
    rows += [base | {"role": "image", "dev": HOSTFS, "ino": 131, "logical_bytes": lo,
                     "physical_bytes": ph, "length_bytes": ln} for lo, ph, ln in image]
    return rows


def request(q, d, c, dev, offset, nbytes, rq, bio, op=0, flags=0):
    """Q, G, D, C events of one request at a byte offset."""
    sec = offset // 512
    nr = nbytes // 512
    return [blk("Q", q, dev=dev, sector=sec, nr=nr, bio=bio, op=op, flags=flags),
            blk("G", q + 1, dev=dev, sector=sec, nr=nr, bio=bio, op=op, flags=flags),
            blk("D", d, dev=dev, sector=sec, nr=nr, rq=rq, bio=bio, op=op, flags=flags),
            blk("C", c, dev=dev, sector=sec, nr=nr, rq=rq, bio=bio, op=op, flags=flags)]


def pagecache(ts, index, nr_pages, event, ino=12, dev=GUEST, aux=0):
    return _hdr(4, ts) | {"ino": ino, "index": index, "nr_pages": nr_pages, "aux": aux, "dev": dev,
                          "pid": 1, "event": event, "comm": "t"}
