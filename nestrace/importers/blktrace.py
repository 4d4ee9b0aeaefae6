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
offset; the good records before it ride on the error (`.good`).
`read_tolerant` names each damaged stretch and resumes at the next whole
record, so no good record is lost.

`nestrace.importers.blkimport` writes them into a store as block_events
(CLI `nestrace import`), with request and bio ids given the way btt pairs
events, so that block_requests, phases, seek distances, sizes and the
report work on traces recorded elsewhere.
"""
from __future__ import annotations

import os
import re
import stat
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from nestrace.importers import compiled

MAGIC = 0x65617400
VERSION = 7
HEADER = struct.Struct("=IIQQIIIIIHH")
assert HEADER.size == 48
DTYPE = np.dtype([("magic", "=u4"), ("sequence", "=u4"), ("time", "=u8"), ("sector", "=u8"),
                  ("bytes", "=u4"), ("action", "=u4"), ("pid", "=u4"), ("device", "=u4"),
                  ("cpu", "=u4"), ("error", "=u2"), ("pdu_len", "=u2")])
assert DTYPE.itemsize == HEADER.size
_MAGIC_PDU = struct.Struct("=I42xH")        # magic and pdu_len of a header
_PAT = struct.pack("=I", MAGIC | VERSION)   # a record's first bytes
# What ftrace writes into trace_pipe, before the next record it has, where
# its ring buffer overwrote events the reader had not read (no count:
# "[LOST EVENTS]"; kernel/trace/trace.c, print_trace_line)
_FTRACE_LOST = re.compile(rb"CPU:(\d+) \[LOST (?:(\d+) )?EVENTS\]\n")

# __BLK_TA_* (the action's low 16 bits) -> blkparse's letter
ACTIONS = {1: "Q", 2: "M", 3: "F", 4: "G", 5: "S", 6: "R", 7: "D", 8: "C", 9: "P", 10: "U",
           11: "T", 12: "I", 13: "X", 14: "B", 15: "A", 16: "abort", 17: "drv_data"}
TA_CGROUP = 0x100      # __BLK_TA_CGROUP: a cgroup id leads the payload

# BLK_TC_* categories (the action's high 16 bits)
TC_WRITE, TC_FLUSH, TC_SYNC = 0x2, 0x4, 0x8
TC_AHEAD, TC_META, TC_DISCARD, TC_FUA = 0x800, 0x1000, 0x2000, 0x8000

# (a few names over millions of rows: each kept once)
_NAMES = pa.dictionary(pa.int32(), pa.string())
SCHEMA = pa.schema([
    ("file", pa.dictionary(pa.int32(), pa.string())),
    ("file_offset", pa.uint64()),
    ("sequence", pa.uint32()),
    ("time_ns", pa.uint64()),
    ("sector", pa.uint64()),
    ("bytes", pa.uint32()),
    ("action", _NAMES),
    ("action_code", pa.uint16()),
    ("categories", pa.uint16()),
    ("rwbs", _NAMES),
    ("op", _NAMES),
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


# the longest payload a kernel writes: a message (BLK_TN_MAX_MSG, 128
# bytes) after a cgroup id (8); a longer pdu_len is damage, which would
# swallow the records after it
MAX_PDU = 8 + 128


def _problem(path: Path, data, off: int, base: int = 0) -> str | None:
    """Why the record at off is not whole, or None (base: the file's
    offset of data[0], for the message)."""
    end, at = len(data), base + off
    if end - off < HEADER.size:
        return f"{path}: byte {at}: record cut short ({end - off} of {HEADER.size} header bytes)"
    magic, pdu_len = _MAGIC_PDU.unpack_from(data, off)
    if magic & 0xFFFFFF00 != MAGIC:
        return f"{path}: byte {at}: bad magic 0x{magic:08x} (not a blktrace record)"
    if magic & 0xFF != VERSION:
        return f"{path}: byte {at}: blktrace version {magic & 0xFF} (this reader knows {VERSION})"
    if pdu_len > MAX_PDU:
        return (f"{path}: byte {at}: a payload of {pdu_len} bytes (a kernel's is at most "
                f"{MAX_PDU})")
    if off + HEADER.size + pdu_len > end:
        return (f"{path}: byte {at}: payload cut short "
                f"({end - off - HEADER.size} of {pdu_len} bytes)")
    if _swallows(data, off, pdu_len):
        return (f"{path}: byte {at}: a payload of {pdu_len} bytes over the record at byte "
                f"{base + _swallows(data, off, pdu_len)} (its length damaged)")
    return None


def cut_at_end(path: Path, data, off: int, base: int = 0) -> str | None:
    """The problem of data[off:], the last bytes of a file, where they are
    a record the file's end cut short and hold no whole record (as a
    trace_pipe reader stopped mid-record leaves it); else None."""
    problem = _problem(path, data, off, base)
    if problem and " cut short (" in problem and _resync(data, off) is None:
        return problem
    return None


def _swallows(data, off: int, pdu_len: int) -> int | None:
    """Where a whole record starts inside the payload of the record at
    off (its length is damage: no payload a kernel writes holds a record's
    first bytes)."""
    nxt, pat = off + HEADER.size + pdu_len, _PAT
    if not pdu_len:
        return None
    # (one starting in the payload and going on past it too)
    at = data.find(pat, off + HEADER.size, nxt + len(pat) - 1)
    while at != -1:
        if len(data) - at >= HEADER.size and \
                _MAGIC_PDU.unpack_from(data, at)[1] <= MAX_PDU and \
                at + HEADER.size + _MAGIC_PDU.unpack_from(data, at)[1] <= len(data):
            return at
        at = data.find(pat, at + 1, nxt + len(pat) - 1)
    return None


def _resync(data, off: int) -> int | None:
    """The next offset after off where a whole record starts."""
    pat = _PAT
    at = data.find(pat, off + 1)
    while at != -1 and _problem(Path(), data, at):
        at = data.find(pat, at + 1)
    return None if at == -1 else at


# the most CPUs a kernel numbers (CONFIG_NR_CPUS is at most 8192): a
# record from a higher one is damage (nestrace's sort keys take 16 bits)
MAX_CPUS = 1 << 16
# a time past 2^63 ns (292 years) is damage too (the phases are signed),
# and data past 2^54 sectors (2^63 bytes: no device is larger)
MAX_TIME, MAX_SECTOR = 1 << 63, 1 << 54


def _headers(buf: np.ndarray, offs: np.ndarray) -> np.ndarray:
    """The headers of the records at offs, as DTYPE rows."""
    n = len(offs)
    if n and offs[-1] == (n - 1) * HEADER.size and len(buf) >= n * HEADER.size and \
            np.array_equal(offs, np.arange(n) * HEADER.size):     # (no payloads: a plain array)
        return buf[:n * HEADER.size].view(DTYPE).copy()
    if n and not (offs % 8).any():      # (8-byte aligned: six words a header,
        words = buf[:len(buf) // 8 * 8].view(np.uint64)     # gathered a word at a time:
        h = np.empty(n, dtype=DTYPE)                        # no n x 6 index array)
        hw = h.view(np.uint64).reshape(n, HEADER.size // 8)
        w0 = offs // 8
        for j in range(HEADER.size // 8):
            hw[:, j] = words[w0 + j]
        return h
    h = np.empty(n, dtype=DTYPE)
    lanes = np.arange(HEADER.size)
    for i in range(0, len(offs), 1 << 18):
        h[i:i + (1 << 18)] = buf[offs[i:i + (1 << 18), None] + lanes].view(DTYPE).ravel()
    return h


def _implausible(path: Path, h: dict[str, np.ndarray], offs: np.ndarray) -> list[tuple[int, str]]:
    """(offset, problem) of the whole records (headers h) whose fields no
    kernel writes."""
    if not len(offs):
        return []
    cpu, t, sec, nb = h["cpu"], h["time"], h["sector"], h["bytes"]
    far = (nb > 0) & (sec >= np.uint64(MAX_SECTOR) - (nb >> 9).astype(np.uint64))
    out = []
    for j in np.flatnonzero((cpu >= MAX_CPUS) | (t >= MAX_TIME) | far):
        what = (f"cpu {int(cpu[j])} (no kernel numbers CPUs past {MAX_CPUS - 1}"
                if cpu[j] >= MAX_CPUS else f"time {int(t[j])} ns (past 2^63"
                if t[j] >= MAX_TIME else
                f"{int(nb[j])} bytes at sector {int(sec[j])} (past 2^54 sectors, 2^63 bytes")
        out.append((int(offs[j]), f"{path}: byte {int(offs[j])}: {what}: a damaged record)"))
    return out


@dataclass
class Damage:
    """What a file's damage cost: the places skipped, their bytes, and the
    records lost there (each place at least one: a record whose length
    is damaged hides how many it covered).  And, apart from damage, the
    events ftrace's notes in a saved trace_pipe say its buffer lost, per
    CPU (a note without a count: one)."""
    places: int = 0
    bytes: int = 0
    records: int = 0
    ftrace_lost: dict[int, int] = field(default_factory=dict)

    def add(self, other: "Damage") -> None:
        self.places += other.places
        self.bytes += other.bytes
        self.records += other.records
        for cpu, n in other.ftrace_lost.items():
            self.ftrace_lost[cpu] = self.ftrace_lost.get(cpu, 0) + n


def _said(path: Path, problems: list[str], dmg: Damage) -> list[str]:
    """A file's problems as said: its damage once (the first place, and
    how many more), and the events ftrace's notes say were lost."""
    if len(problems) > 1:
        problems = [f"{problems[0]}; and {len(problems) - 1} more damaged place(s): "
                    f"{dmg.bytes} bytes, at least {dmg.records} records skipped in all"]
    if dmg.ftrace_lost:
        per_cpu = ", ".join(f"CPU {c}: {n}" for c, n in sorted(dmg.ftrace_lost.items()))
        problems = problems + [
            f"{path}: ftrace's buffer lost {sum(dmg.ftrace_lost.values())} events before they "
            f"were read from trace_pipe ({per_cpu}; its notes say so): counted as lost"]
    return problems


def _foreign(path: Path, h: dict[str, np.ndarray], offs: np.ndarray) -> list[tuple[int, str]]:
    """(offset, problem) of the records of a blktrace file (one device's,
    its records numbered per CPU) whose device is damage: one seen once or
    twice, its sequence number between two of the file's device's on its
    CPU."""
    if len(offs) < 8:
        return []
    if not h["sequence"].any():
        return []
    devs, counts = np.unique(h["device"], return_counts=True)
    main = devs[np.argmax(counts)]
    odd = np.flatnonzero(np.isin(h["device"], devs[counts <= 2]) & (h["device"] != main))
    if not len(odd):
        return []
    mine = h["device"] == main
    known = set(zip(h["cpu"][mine].tolist(), h["sequence"][mine].tolist()))
    out = []
    for j in odd:
        c, q = int(h["cpu"][j]), int(h["sequence"][j])
        if (c, q - 1) in known and (c, q + 1) in known:
            d = int(h["device"][j])
            out.append((int(offs[j]), f"{path}: byte {int(offs[j])}: device {dev_name(d)} "
                                      f"between two records of {dev_name(int(main))} on CPU "
                                      f"{c}: a damaged record"))
    return out


def _keep(h: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    return {name: col[keep] for name, col in h.items()}


def _walk(path: Path, data, resync: bool, into: dict[str, np.ndarray] | None = None,
          start: int = 0) -> tuple[dict[str, np.ndarray], list[str], Damage]:
    """path's whole and plausible records as columns ("offset": where each
    starts, and its header's fields by DTYPE's names), the problems met
    in file order (without resync, the first one ends the file), and what
    the damage cost.  into: columns (compiled.blk_columns) to fill from
    row start, where they can be."""
    h = compiled.blk_index(data, into, start)      # (an undamaged file: in C)
    problems, lost = [], {}
    if h is None:
        offs, problems, lost = _walk_whole(path, data, resync)
        rows = _headers(np.frombuffer(data, dtype=np.uint8), offs)
        h = {"offset": offs} | {name: rows[name] for name in DTYPE.names if name != "magic"}
    offs = h["offset"]
    bad = sorted(_implausible(path, h, offs) + _foreign(path, h, offs))
    if bad and not resync:      # the first bad record ends the file: before any problem met
        return _keep(h, offs < bad[0][0]), [bad[0][1]], Damage(1, 0, 1, lost)
    dmg = Damage(len(problems) + len(bad), sum(n for _, _, n in problems), len(problems) + len(bad),
                 lost)
    if bad:
        drop = np.array([o for o, _ in bad], np.int64)
        dmg.bytes += sum(HEADER.size + _MAGIC_PDU.unpack_from(data, o)[1] for o, _ in bad)
        h = _keep(h, ~np.isin(offs, drop))
    return h, [p for _, p in sorted([(o, p) for o, p, _ in problems] + bad)], dmg


def _walk_whole(path: Path, data: bytes, resync: bool
                ) -> tuple[np.ndarray, list[tuple[int, str, int]], dict[int, int]]:
    """The byte offsets of path's whole records, (offset, problem, bytes
    skipped) of the damage met (without resync, the first one ends the
    file), and the events ftrace's notes say were lost, per CPU."""
    offs, problems, lost = array("q"), [], {}
    off, end, want = 0, len(data), MAGIC | VERSION
    unpack, size = _MAGIC_PDU.unpack_from, HEADER.size
    while off < end:
        if end - off >= size:
            magic, pdu_len = unpack(data, off)
            if magic == want and pdu_len <= MAX_PDU and off + size + pdu_len <= end and \
                    (not pdu_len or not _swallows(data, off, pdu_len)):
                offs.append(off)
                off += size + pdu_len
                continue
        note = _FTRACE_LOST.match(data, off) if data[off:off + 4] == b"CPU:" else None
        if note:
            cpu = int(note[1])
            lost[cpu] = lost.get(cpu, 0) + (int(note[2]) if note[2] else 1)
            off = note.end()
            continue
        problem = _problem(path, data, off)
        nxt = _resync(data, off) if resync else None
        problems.append((off, problem + ("" if nxt is None else f"; resumed at byte {nxt}"),
                         (end if nxt is None else nxt) - off))
        if nxt is None:
            break
        off = nxt
    return np.frombuffer(offs, dtype=np.int64) if offs else np.zeros(0, np.int64), problems, lost


def _strings(values: np.ndarray, name, dictionary: bool = False) -> pa.Array:
    """A string column from small integer keys, naming each distinct key
    once (dictionary: as a dictionary column, the names not repeated)."""
    if len(values) and values.dtype.kind in "ui" and values.min() >= 0 and \
            values.max() < (1 << 20):      # (small keys: a table, no sort)
        present = np.flatnonzero(np.bincount(values.astype(np.int64)))
        lut = np.zeros(int(present[-1]) + 1, np.int32)
        lut[present] = np.arange(len(present), dtype=np.int32)
        keys, inverse = present, lut[values]
    else:
        keys, inverse = np.unique(values, return_inverse=True)
    d = pa.array([name(int(k)) for k in keys], pa.string())
    names = pa.DictionaryArray.from_arrays(pa.array(inverse.astype(np.int32)), d)
    return names if dictionary else names.cast(pa.string())


def _table(path: Path, data, h: dict[str, np.ndarray]) -> pa.Table:
    """The records h (_walk's columns), as a table (no Python work per
    record)."""
    offs = h["offset"]
    n = len(offs)
    if not n:
        return SCHEMA.empty_table()
    buf = np.frombuffer(data, dtype=np.uint8)
    code, cats, nbytes = h["action"] & 0xFFFF, (h["action"] >> 16).astype(np.uint16), h["bytes"]
    cgroup = (code & TA_CGROUP) != 0
    code = (code & ~np.uint32(TA_CGROUP)).astype(np.uint16)
    # payloads, without the cgroup id that leads them when TA_CGROUP is set
    starts = offs + HEADER.size + np.where(cgroup, 8, 0)
    lens = np.maximum(h["pdu_len"].astype(np.int64) - np.where(cgroup, 8, 0), 0)
    ends = np.cumsum(lens)
    pos = np.zeros(n + 1, np.int32)
    pos[1:] = ends
    total = int(ends[-1])
    if total:
        body = buf[np.repeat(starts - pos[:-1], lens) + np.arange(total)]
    else:
        body = np.zeros(0, np.uint8)
    pdu = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(pos), pa.py_buffer(body)])
    kind = cats.astype(np.int64) * 2 + (nbytes > 0)      # what rwbs and op depend on
    cols = {
        "file": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([str(path)])),
        "file_offset": pa.array(offs.view(np.uint64)), "sequence": pa.array(h["sequence"]),
        "time_ns": pa.array(h["time"]), "sector": pa.array(h["sector"]), "bytes": pa.array(nbytes),
        "action": _strings(code, lambda c: ACTIONS.get(c, f"0x{c:x}"), True),
        "action_code": pa.array(code), "categories": pa.array(cats),
        "rwbs": _strings(kind, lambda k: rwbs(k >> 1, k & 1), True),
        "op": _strings(kind, lambda k: op_name(k >> 1, k & 1), True),
        "pid": pa.array(h["pid"]), "dev": pa.array(h["device"]), "cpu": pa.array(h["cpu"]),
        "error": pa.array(h["error"]), "pdu": pdu,
    }
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def _concat(parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(parts) if parts else SCHEMA.empty_table()


def _mapped(path: Path):
    """path's bytes, mapped (the page cache's pages, not a copy), or read
    when it is empty or cannot be mapped (a pipe)."""
    import mmap
    with open(path, "rb") as f:
        try:
            return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        except (ValueError, OSError):       # (empty, or not a regular file)
            return f.read()


def _unmap(data) -> None:
    """Let a mapped file's pages go now (nothing may still view them)."""
    if hasattr(data, "close"):
        try:
            data.close()
        except BufferError:     # (a view left: its pages go with it)
            pass


def _read(paths, resync: bool) -> tuple[list[pa.Table], list[str], Damage]:
    parts, problems, damage = [], [], Damage()
    for p in map(Path, paths):
        try:
            data = _mapped(p)
        except OSError as e:
            raise BlktraceError(f"{p}: cannot read: {e.strerror}", _concat(parts)) from None
        h, pr, dmg = _walk(p, data, resync)
        parts.append(_table(p, data, h))
        damage.add(dmg)
        said = _said(p, pr, dmg)
        problems += said
        if said and not resync:
            break
    return parts, problems, damage


def read(*paths: str | os.PathLike) -> pa.Table:
    """The records of blktrace binary files (or a saved trace_pipe of the
    ftrace blk tracer in bin mode), file after file.  The first record
    that is not whole raises BlktraceError (the records before it on
    `.good`); so do ftrace's notes of events its buffer lost (the file's
    records on `.good`)."""
    parts, problems, _ = _read(paths, resync=False)
    if problems:
        raise BlktraceError(problems[0], _concat(parts))
    return _concat(parts)


def read_tolerant(*paths: str | os.PathLike) -> tuple[pa.Table, list[str]]:
    """Like read, but past damage: a record that is not whole is named (file
    and byte offset) in the problems returned, once per file, and reading
    resumes at the next whole record, so that no good record is lost."""
    t, problems, _ = read_damaged(*paths)
    return t, problems


def read_damaged(*paths: str | os.PathLike) -> tuple[pa.Table, list[str], Damage]:
    """read_tolerant, and what the damage cost."""
    parts, problems, damage = _read(paths, resync=True)
    return _concat(parts), problems, damage


TC_NOTIFY = 0x400       # BLK_TC_NOTIFY: a message, not an I/O event
TN_PROCESS = 0          # notify record: pdu = the task's comm
X_CODE = 13             # __BLK_TA_SPLIT: pdu = the sector split at, big-endian


def read_columns(*paths: str | os.PathLike
                 ) -> tuple[dict[str, np.ndarray], dict[int, str], list[str], Damage]:
    """read_damaged's records as the columns an import reads, with no table
    (a column an array, the files' records one after the other):
    sequence, time_ns, sector, bytes, pid, dev, cpu, error, action_code
    and categories, as read_damaged's table names them, and aux: a split's
    (X) sector, else 0.  With the task names of the notify records (pid
    -> comm), the problems and what the damage cost, as read_damaged."""
    files = []      # (path, its bytes if not a regular file: read now, else its size)
    for p in map(Path, paths):
        try:
            st = os.stat(p)
            files.append((p, None, st.st_size) if stat.S_ISREG(st.st_mode) else
                         (p, (data := _mapped(p)), len(data)))
        except OSError as e:
            raise BlktraceError(f"{p}: cannot read: {e.strerror}", SCHEMA.empty_table()) from None
    out = compiled.blk_columns(sum(size for _, _, size in files) // HEADER.size)
    n, problems, damage, comms = 0, [], Damage(), {}
    aux = np.zeros(len(out["offset"]), np.uint64)
    for p, data, size in files:
        if data is None:        # (mapped a file at a time: its pages leave with it)
            try:
                data = _mapped(p)
            except OSError as e:
                raise BlktraceError(f"{p}: cannot read: {e.strerror}",
                                    SCHEMA.empty_table()) from None
            if len(data) > size:
                raise BlktraceError(f"{p}: grew while read ({size} bytes, then {len(data)})",
                                    SCHEMA.empty_table())
        h, pr, dmg = _walk(p, data, True, out, n)
        k = len(h["offset"])
        for name, col in out.items():
            if not np.may_share_memory(h[name], col):     # (a damaged file's, not in place)
                col[n:n + k] = h[name]
        _payloads(data, h, aux[n:n + k], comms)
        del h
        _unmap(data)
        n += k
        damage.add(dmg)
        problems += _said(p, pr, dmg)
    action = out["action"][:n]
    cols = {"sequence": out["sequence"][:n], "time_ns": out["time"][:n],
            "sector": out["sector"][:n], "bytes": out["bytes"][:n], "pid": out["pid"][:n],
            "dev": out["device"][:n], "cpu": out["cpu"][:n], "error": out["error"][:n],
            "action_code": (action & 0xFFFF & ~np.uint32(TA_CGROUP)).astype(np.uint16),
            "categories": (action >> 16).astype(np.uint16), "aux": aux[:n]}
    return cols, comms, problems, damage


def _payloads(data, h: dict[str, np.ndarray], aux: np.ndarray, comms: dict[int, str]) -> None:
    """From the payloads of the records h (a few: splits and notify
    records), the split sectors (into aux) and the task names (comms)."""
    code = h["action"] & 0xFFFF
    cats = h["action"] >> 16
    base = code & ~np.uint32(TA_CGROUP)
    rows = np.flatnonzero((base == X_CODE) | ((cats & TC_NOTIFY != 0) & (base == TN_PROCESS)))
    for i in rows.tolist():
        lead = 8 if code[i] & TA_CGROUP else 0
        at = int(h["offset"][i]) + HEADER.size
        b = bytes(data[at + lead:at + int(h["pdu_len"][i])])
        if cats[i] & TC_NOTIFY:
            comms[int(h["pid"][i])] = b.split(b"\0", 1)[0].decode(errors="replace")
        elif len(b) >= 8:
            aux[i] = int.from_bytes(b[:8], "big")


def dev_name(dev: int) -> str:
    return f"{dev >> 20}:{dev & 0xFFFFF}"


def split_by_cpu(path: str | os.PathLike, prefix: str | os.PathLike
                 ) -> tuple[list[Path], int, list[str]]:
    """The records of a saved trace_pipe of the ftrace blk tracer (bin
    mode) written a file per CPU, as blktrace writes them
    (PREFIX.blktrace.N, one for every CPU up to the last one with a
    record, and at least os.cpu_count(): blkparse stops at the first CPU
    without a file), so that blkparse and btt read them.  What is not a
    whole record (a record cut short where the reader stopped, the text
    ftrace writes where its buffer lost events) is left out and named, as
    read_tolerant names it: every whole record is kept.  Returns the
    files, the records written and the problems."""
    import pyarrow.compute as pc
    data = np.fromfile(path, dtype=np.uint8)
    t, problems = read_tolerant(path)
    offs = t.column("file_offset").to_numpy().astype(np.int64)
    lens = HEADER.size + pc.binary_length(t.column("pdu")).to_numpy(zero_copy_only=False)
    cpu = t.column("cpu").to_numpy()
    files = []
    for c in range(max(int(cpu.max()) + 1 if len(cpu) else 0, os.cpu_count() or 1)):
        sel = cpu == c
        n = lens[sel].astype(np.int64)
        ends = np.cumsum(n)
        # (each byte of the CPU's records: its record's start, plus its
        # place in the record)
        at = np.repeat(offs[sel] - (ends - n), n) + np.arange(int(ends[-1]) if len(n) else 0)
        f = Path(f"{prefix}.blktrace.{c}")
        data[at].tofile(f)
        files.append(f)
    return files, t.num_rows, problems
