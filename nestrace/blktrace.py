"""blktrace's binary format, read into Arrow.

The records are `struct blk_io_trace` (48 bytes, host byte order, magic
0x65617400 | version 7) each followed by `pdu_len` bytes of payload.  Two
producers write them:

- blktrace itself, one file per CPU (`DEV.blktrace.N`), what blkparse and
  btt read;
- the kernel's ftrace `blk` tracer with `options/bin` = 1 and
  `options/context-info` = 0, read from `trace_pipe` (on kernels where
  blktrace's relay files are not readable, as on the machine nestrace is
  developed on).

`read(*paths)` returns one row per record, in file order.  A record that
is not whole (bad magic, an unknown version, a payload cut short) stops
the read with a BlktraceError naming the file and the record's byte
offset; the good records before it ride on the error (`.good`), so none
is lost.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pyarrow as pa

MAGIC = 0x65617400
VERSION = 7
HEADER = struct.Struct("=IIQQIIIIIHH")
assert HEADER.size == 48

# __BLK_TA_* (the action's low 16 bits) -> blkparse's letter
ACTIONS = {1: "Q", 2: "M", 3: "F", 4: "G", 5: "S", 6: "R", 7: "D", 8: "C", 9: "P", 10: "U",
           11: "T", 12: "I", 13: "X", 14: "B", 15: "A", 16: "abort", 17: "drv_data"}
TA_CGROUP = 0x100      # __BLK_TA_CGROUP: a cgroup id leads the payload

# BLK_TC_* categories (the action's high 16 bits)
TC_WRITE, TC_FLUSH, TC_SYNC = 0x2, 0x4, 0x8
TC_AHEAD, TC_META, TC_DISCARD, TC_FUA = 0x800, 0x1000, 0x2000, 0x8000

SCHEMA = pa.schema([
    ("file", pa.string()),
    ("file_offset", pa.uint64()),
    ("sequence", pa.uint32()),
    ("time_ns", pa.uint64()),
    ("sector", pa.uint64()),
    ("bytes", pa.uint32()),
    ("action", pa.string()),
    ("action_code", pa.uint16()),
    ("categories", pa.uint16()),
    ("rwbs", pa.string()),
    ("op", pa.string()),
    ("pid", pa.uint32()),
    ("dev", pa.uint32()),
    ("cpu", pa.uint32()),
    ("error", pa.uint16()),
    ("pdu", pa.binary()),
])
"""One row per record.  file, file_offset: where the record starts.
time_ns: as the producer wrote it (blktrace: ktime_get(); the ftrace blk
tracer: its trace_clock).  action: blkparse's letter (Q M F G S R D C P U
T I X B A).  categories: the BLK_TC_* bits.  rwbs: blkparse's flags (F
for a preflush, R/W/D/N, F for FUA, A readahead, S sync, M meta).  op:
read, write, flush, discard or other, as nestrace's views name it.  dev:
the kernel's dev_t (major << 20 | minor), as nestrace stores it.  pdu: the
payload (X: the split sector, A: the remap), without a cgroup id."""


class BlktraceError(ValueError):
    """A record that is not whole; `.good` holds the records before it."""

    def __init__(self, msg: str, good: pa.Table):
        super().__init__(msg)
        self.good = good


def rwbs(categories: int, nbytes: int) -> str:
    """blkparse's RWBS string for a record's categories."""
    s = "F" if categories & TC_FLUSH else ""
    if categories & TC_DISCARD:
        s += "D"
    elif categories & TC_WRITE:
        s += "W"
    else:
        s += "R" if nbytes else "N"
    if categories & TC_FUA:
        s += "F"
    if categories & TC_AHEAD:
        s += "A"
    if categories & TC_SYNC:
        s += "S"
    if categories & TC_META:
        s += "M"
    return s


def op_name(categories: int, nbytes: int) -> str:
    if categories & TC_DISCARD:
        return "discard"
    if categories & TC_WRITE:
        return "write"
    if categories & TC_FLUSH and not nbytes:
        return "flush"
    return "read" if nbytes else "other"


def _records(path: Path, data: bytes | memoryview, cols: dict[str, list]) -> str | None:
    """Append path's records to cols; the problem that stopped it, if any."""
    off, end, name = 0, len(data), str(path)
    while off < end:
        if end - off < HEADER.size:
            return f"{path}: byte {off}: record cut short ({end - off} of {HEADER.size} header bytes)"
        (magic, seq, t, sector, nbytes, action, pid, dev, cpu, err,
         pdu_len) = HEADER.unpack_from(data, off)
        if magic & 0xFFFFFF00 != MAGIC:
            return f"{path}: byte {off}: bad magic 0x{magic:08x} (not a blktrace record)"
        if magic & 0xFF != VERSION:
            return (f"{path}: byte {off}: blktrace version {magic & 0xFF} "
                    f"(this reader knows {VERSION})")
        body = off + HEADER.size
        if body + pdu_len > end:
            return (f"{path}: byte {off}: payload cut short ({end - body} of {pdu_len} bytes)")
        pdu = bytes(data[body:body + pdu_len])
        code, cats = action & 0xFFFF, action >> 16
        if code & TA_CGROUP:
            pdu = pdu[8:]
            code &= ~TA_CGROUP
        for k, v in (("file", name), ("file_offset", off), ("sequence", seq), ("time_ns", t),
                     ("sector", sector), ("bytes", nbytes),
                     ("action", ACTIONS.get(code, f"0x{code:x}")), ("action_code", code),
                     ("categories", cats), ("rwbs", rwbs(cats, nbytes)),
                     ("op", op_name(cats, nbytes)), ("pid", pid), ("dev", dev), ("cpu", cpu),
                     ("error", err), ("pdu", pdu)):
            cols[k].append(v)
        off = body + pdu_len
    return None


def read(*paths: str | os.PathLike) -> pa.Table:
    """The records of blktrace binary files (or a saved trace_pipe of the
    ftrace blk tracer in bin mode), file after file."""
    cols: dict[str, list] = {f.name: [] for f in SCHEMA}
    for p in map(Path, paths):
        problem = _records(p, p.read_bytes(), cols)
        if problem:
            raise BlktraceError(problem, pa.Table.from_pydict(cols, schema=SCHEMA))
    return pa.Table.from_pydict(cols, schema=SCHEMA)
