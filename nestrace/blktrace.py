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

`import_files` writes the records into a store as block_events (CLI
`nestrace import`), with request and bio ids given the way btt pairs
events, so that block_requests, phases, seek distances, sizes and the
report work on traces recorded elsewhere.
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


def _problem(path: Path, data, off: int) -> str | None:
    """Why the record at off is not whole, or None."""
    end = len(data)
    if end - off < HEADER.size:
        return f"{path}: byte {off}: record cut short ({end - off} of {HEADER.size} header bytes)"
    magic = HEADER.unpack_from(data, off)[0]
    if magic & 0xFFFFFF00 != MAGIC:
        return f"{path}: byte {off}: bad magic 0x{magic:08x} (not a blktrace record)"
    if magic & 0xFF != VERSION:
        return f"{path}: byte {off}: blktrace version {magic & 0xFF} (this reader knows {VERSION})"
    pdu_len = HEADER.unpack_from(data, off)[-1]
    if off + HEADER.size + pdu_len > end:
        return (f"{path}: byte {off}: payload cut short "
                f"({end - off - HEADER.size} of {pdu_len} bytes)")
    return None


def _resync(data, off: int) -> int | None:
    """The next offset after off where a whole record starts."""
    pat = struct.pack("=I", MAGIC | VERSION)
    at = data.find(pat, off + 1)
    while at != -1 and _problem(Path(), data, at):
        at = data.find(pat, at + 1)
    return None if at == -1 else at


def _records(path: Path, data: bytes, cols: dict[str, list], resync: bool) -> list[str]:
    """Append path's records to cols; the problems met (without resync,
    the first one stops the file)."""
    off, end, name, problems = 0, len(data), str(path), []
    while off < end:
        problem = _problem(path, data, off)
        if problem:
            nxt = _resync(data, off) if resync else None
            problems.append(problem + ("" if nxt is None else f"; resumed at byte {nxt}"))
            if nxt is None:
                break
            off = nxt
            continue
        (_, seq, t, sector, nbytes, action, pid, dev, cpu, err,
         pdu_len) = HEADER.unpack_from(data, off)
        body = off + HEADER.size
        pdu = data[body:body + pdu_len]
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
    return problems


def read(*paths: str | os.PathLike) -> pa.Table:
    """The records of blktrace binary files (or a saved trace_pipe of the
    ftrace blk tracer in bin mode), file after file.  The first record
    that is not whole raises BlktraceError (the records before it on
    `.good`)."""
    cols: dict[str, list] = {f.name: [] for f in SCHEMA}
    for p in map(Path, paths):
        problems = _records(p, p.read_bytes(), cols, resync=False)
        if problems:
            raise BlktraceError(problems[0], pa.Table.from_pydict(cols, schema=SCHEMA))
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def read_tolerant(*paths: str | os.PathLike) -> tuple[pa.Table, list[str]]:
    """Like read, but past damage: a record that is not whole is named (file
    and byte offset) in the problems returned, and reading resumes at the
    next whole record, so that no good record is lost."""
    cols: dict[str, list] = {f.name: [] for f in SCHEMA}
    problems: list[str] = []
    for p in map(Path, paths):
        problems += _records(p, p.read_bytes(), cols, resync=True)
    return pa.Table.from_pydict(cols, schema=SCHEMA), problems


# ---- import into a store ------------------------------------------------------

# blktrace's letter -> nestrace's block_events action
NT_ACTIONS = {"Q": 1, "M": 2, "F": 3, "G": 4, "I": 5, "D": 6, "C": 7, "X": 8, "R": 10}
TC_NOTIFY = 0x400
TN_PROCESS = 0          # notify record: pdu = the task's comm


def _nt_op(cats: int, nbytes: int) -> int:
    """The kernel REQ_OP nestrace stores, from blktrace's categories."""
    return {"read": 0, "write": 1, "flush": 2, "discard": 3}.get(op_name(cats, nbytes), 0)


def _nt_flags(cats: int) -> int:
    """nestrace's flag bits (1 SYNC 2 META 8 FUA 16 PREFLUSH 32 RAHEAD)."""
    f = 0
    for tc, nt in ((TC_SYNC, 1), (TC_META, 2), (TC_FUA, 8), (TC_FLUSH, 16), (TC_AHEAD, 32)):
        if cats & tc:
            f |= nt
    return f


def dev_name(dev: int) -> str:
    return f"{dev >> 20}:{dev & 0xFFFFF}"


def block_events(t: pa.Table) -> tuple[pa.Table, dict]:
    """blktrace records as nestrace block_events rows (without capture_id),
    and counts of what was left out.

    blktrace has no request or bio addresses; they are given the way btt
    pairs events, by device and sector in time order: a Q starts a bio,
    the G, M/F, X and D at its sector carry it; an I or D starts a
    request at its sector unless one is open there, and the C at that
    sector closes it.  A requeued request (R, then I and D again) keeps
    its id."""
    schema = pa.schema([f for f in _record_schema() if f.name != "capture_id"])
    order = sorted(range(t.num_rows), key=t.column("time_ns").to_pylist().__getitem__)
    recs = t.to_pylist()
    comms = {r["pid"]: r["pdu"].split(b"\0", 1)[0].decode(errors="replace") for r in recs
             if r["categories"] & TC_NOTIFY and r["action_code"] == TN_PROCESS}
    bio_at: dict[tuple[int, int], int] = {}
    rq_at: dict[tuple[int, int], int] = {}
    seq: dict[int, int] = {}
    ids = iter(range(1, 1 << 62))
    rows = {f.name: [] for f in schema}
    skipped: dict[str, int] = {}
    for i in order:
        r = recs[i]
        if r["categories"] & TC_NOTIFY:
            continue
        a = NT_ACTIONS.get(r["action"])
        if a is None:
            skipped[r["action"]] = skipped.get(r["action"], 0) + 1
            continue
        at = (r["dev"], r["sector"])
        bio = rq = aux = 0
        if r["action"] == "Q":
            bio = bio_at[at] = next(ids)
        elif r["action"] in "GMFX":
            bio = bio_at.get(at, 0)
            if r["action"] == "X" and len(r["pdu"]) >= 8:
                aux = int.from_bytes(r["pdu"][:8], "big")
        elif r["action"] in "ID":
            rq = rq_at.get(at) or rq_at.setdefault(at, next(ids))
            bio = bio_at.get(at, 0)
        else:   # C, R
            rq = rq_at.pop(at, 0) if r["action"] == "C" else rq_at.get(at, 0)
        seq[r["cpu"]] = seq.get(r["cpu"], 0) + 1
        for k, v in (("kind", 2), ("version", 1), ("cpu", r["cpu"]), ("seq", seq[r["cpu"]]),
                     ("ts_ns", r["time_ns"]), ("sector", r["sector"]), ("rq_id", rq),
                     ("bio_id", bio), ("aux_sector", aux), ("dev", r["dev"]),
                     ("nr_sectors", r["bytes"] >> 9), ("pid", r["pid"]), ("error", r["error"]),
                     ("action", a), ("req_op", _nt_op(r["categories"], r["bytes"])),
                     ("req_flags", _nt_flags(r["categories"])),
                     ("comm", comms.get(r["pid"], ""))):
            rows[k].append(v)
    return pa.Table.from_pydict(rows, schema=schema), skipped


def _record_schema() -> pa.Schema:
    from .schema import record_schema
    return record_schema("block_event")


def import_files(paths: list[str | os.PathLike], store: str | os.PathLike,
                 levels: dict[int, str], capture_id: str, machine: str = "") -> dict:
    """Write blktrace files as capture `capture_id` of `store`: block_events,
    a device_map naming each device's level (`levels`: dev -> vdisk or
    disk; devices not named are disk), capture_meta, and empty tables for
    the levels blktrace does not see.  Damaged records are skipped, named
    in the result's problems (reading resumes at the next whole record).
    Returns what was imported."""
    import json

    from . import __version__
    from .schema import RECORDS, kernel_tables, record_schema, table_schema
    from .store import StoreError, _with_capture, _write_parquet, captures, init_store

    t, problems = read_tolerant(*paths)
    ev, skipped = block_events(t)
    if not ev.num_rows:
        raise StoreError(problems[0] if problems else
                         f"{', '.join(map(str, paths))}: no block request events to import")
    p = init_store(store)
    if capture_id in captures(p):
        raise StoreError(f"{p}: already holds a capture {capture_id!r}")
    for table, rec in kernel_tables().items():
        out = ev if table == "block_events" else record_schema(rec).empty_table()
        _write_parquet(p, table, capture_id, _with_capture(out, capture_id))
    devs = sorted(set(ev.column("dev").to_pylist()))
    dm = [{"capture_id": capture_id, "level": levels.get(d, "disk"), "dev": d,
           "name": dev_name(d), "size_sectors": 0, "block_size_bytes": 512} for d in devs]
    _write_parquet(p, "device_map", capture_id, pa.Table.from_pylist(dm, schema=table_schema("device_map")))
    _write_parquet(p, "extent_maps", capture_id, table_schema("extent_maps").empty_table())
    # relay blktrace numbers each device's records per CPU from 1 (the ftrace
    # blk tracer writes 0): a number missing is a record lost
    per: dict[tuple[int, int], list[int]] = {}
    for d, c, n in zip(t.column("dev").to_pylist(), t.column("cpu").to_pylist(),
                       t.column("sequence").to_pylist()):
        if n:
            x = per.setdefault((d, c), [0, 0])
            x[0], x[1] = x[0] + 1, max(x[1], n)
    by_cpu: dict[int, list[int]] = {}
    for (_, c), (cnt, mx) in per.items():
        x = by_cpu.setdefault(c, [0, 0])
        x[0], x[1] = x[0] + cnt, x[1] + mx
    lost = [{"capture_id": capture_id, "cpu": c, "emitted": mx, "received": cnt,
             "ringbuf_drops": 0, "seq_gaps": mx - cnt} for c, (cnt, mx) in sorted(by_cpu.items())]
    _write_parquet(p, "lost_events", capture_id, pa.Table.from_pylist(lost, schema=table_schema("lost_events")))
    ts = ev.column("ts_ns").to_pylist()
    meta = {"capture_id": capture_id, "machine": machine or "unknown", "kernel": "unknown",
            "clock": "blktrace",
            "start_ns": min(ts), "end_ns": max(ts), "start_wall": "",
            "command": "nestrace import " + " ".join(map(str, paths)), "hooks_json": "{}",
            "stack_json": json.dumps({"source": "blktrace", "files": [str(x) for x in paths],
                                      "levels": {dev_name(d["dev"]): d["level"] for d in dm},
                                      "not_imported": skipped,
                                      "sequence_numbers": bool(per)}),
            "lost_total": sum(r["seq_gaps"] for r in lost), "records_total": ev.num_rows,
            "tool_version": __version__,
            "schema_version": json.dumps({n: s["version"] for n, s in RECORDS.items()})}
    _write_parquet(p, "capture_meta", capture_id,
                   pa.Table.from_pylist([meta], schema=table_schema("capture_meta")))
    return {"capture_id": capture_id, "problems": problems, "records": t.num_rows, "block_events": ev.num_rows,
            "devices": {dev_name(d["dev"]): d["level"] for d in dm}, "not_imported": skipped,
            "lost": meta["lost_total"], "sequence_numbers": bool(per)}
