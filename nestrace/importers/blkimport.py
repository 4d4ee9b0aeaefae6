"""blktrace records into a store: nestrace block_events rows, paired the
way btt pairs them (`block_events`), and the capture written and
published (`import_files` for blktrace files, streamed a chunk at a time
where the files are as the kernel writes them, else read whole;
`write_import` for any source of block events: trace-cmd's too)."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nestrace.importers import compiled
from nestrace.importers.blktrace import (
    ACTIONS,
    TC_AHEAD,
    TC_FLUSH,
    TC_FUA,
    TC_META,
    TC_NOTIFY,
    TC_SYNC,
    Damage,
    _strings,
    dev_name,
    op_name,
    read_columns,
)
from nestrace.schema import code
from nestrace.store.seqs import seq_gaps

# blktrace's letter -> nestrace's block_events action
NT_ACTIONS = {letter: code("block_action", name) for letter, name in (
    ("Q", "q"), ("M", "backmerge"), ("F", "frontmerge"), ("G", "g"), ("I", "i"), ("D", "d"),
    ("C", "c"), ("X", "x"), ("R", "requeue"))}


# nestrace's req_op per op name, and its flag bits per BLK_TC_* category
NT_OPS = {"read": 0, "write": 1, "flush": 2, "discard": 3}
NT_FLAGS = ((TC_SYNC, 1), (TC_META, 2), (TC_FUA, 8), (TC_FLUSH, 16), (TC_AHEAD, 32))


def few_values(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(x, return_inverse=True) for a column of few distinct
    values (devices, flags, a field's texts): found in a sample, checked
    against all, without sorting them all (else sorted)."""
    if not len(x):
        return np.zeros(0, x.dtype), np.zeros(0, np.int64)
    u = np.unique(x[::max(1, len(x) // 4096)])
    r = np.searchsorted(u, x)
    if not np.array_equal(u[np.minimum(r, len(u) - 1)], x):
        u = np.unique(x)
        r = np.searchsorted(u, x)
    return u, r


def _ranks(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's rank among the distinct values of x (few: devices), and
    how many there are."""
    u, r = few_values(x)
    return r, len(u)


def _counts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of x (few) and how many times each comes."""
    u, r = few_values(x)
    return u, np.bincount(r, minlength=len(u))


def block_events(col: dict[str, np.ndarray], comms: dict[int, str]
                 ) -> tuple[pa.Table, dict]:
    """blktrace records as nestrace block_events rows (without capture_id),
    in time order, and counts of what was left out.

    blktrace has no request or bio addresses; they are given the way btt
    pairs events, by device and sector in time order: a Q starts a bio,
    the G, M/F, I and D at its sector carry it; an X starts the piece it
    cut off at its sector, and the bio it was cut from goes on at the
    remainder's sector (the kernel's split: the piece is a new bio, the
    remainder keeps the old one); an I or D starts a
    request at its sector unless one is open there, and the C at that
    sector closes it.  A requeued request (R, then I and D again) keeps
    its id.  A sector with no request open forgets its bio STALE_NS
    (nestrace.importers.requests) after its last event: a G, I or D
    there later, with no Q of its own, has no bio (so the memory held
    is bounded by the sectors of the last STALE_NS).  col:
    blktrace.read_columns' columns, taken out of it as they are read (the
    records' memory goes to the events as they are made); comms: pid ->
    task name, beside blktrace's notify records."""
    rows, nt, skipped = _kept(col)
    # time order, file order within a tie: every column below is in it
    ts = col.pop("time_ns")[rows]
    order = np.argsort(ts, kind="stable")
    rows, ts = rows[order], ts[order]
    del order
    a = nt[rows]
    del nt
    out = _event_columns(col, rows, a, ts, compiled.blk_pair)
    return _events_table(out, lambda p: comms.get(p, "")), _letters(skipped)


def _letters(skipped: dict[int, int]) -> dict[str, int]:
    """Counts by action code as counts by blkparse's letter, in code order."""
    return {ACTIONS.get(c, f"0x{c:x}"): k for c, k in sorted(skipped.items())}


def _kept(col: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict]:
    """The rows of the records col that are block events (col's actions
    taken out of it), every record's block_action code (0: none), and
    counts of the records left out by their action code."""
    notify = (col["categories"] & TC_NOTIFY) != 0
    lut = np.zeros(1 << 16, np.uint16)
    for letter, a in NT_ACTIONS.items():
        lut[next(c for c, x in ACTIONS.items() if x == letter)] = a
    code = col.pop("action_code")
    nt = np.where(notify, 0, lut[code])
    keep = nt > 0
    skipped = {int(c): int(k) for c, k in zip(*_counts(code[~keep & ~notify]))}
    return np.flatnonzero(keep), nt, skipped


def _event_columns(col: dict[str, np.ndarray], rows: np.ndarray, a: np.ndarray,
                   ts: np.ndarray, pair) -> dict[str, np.ndarray]:
    """block_events columns (but comm) of the records col's rows, in time
    order (their actions a, times ts), the columns taken out of col as
    they are read; pair(a, ts, dev, sector, aux, cpu): their bio ids,
    request ids and sequence numbers (compiled.blk_pair, or a Pairing's
    step)."""
    def take(name: str) -> np.ndarray:
        return col.pop(name)[rows]

    m = len(rows)
    sec, dev, cpu, aux = take("sector"), take("dev"), take("cpu"), take("aux")
    # bio and request ids by (dev, sector) stream, per-CPU sequence numbers
    bio, rq, seq = pair(a, ts, dev, sec, aux, cpu)
    cats, nbytes = take("categories"), take("bytes")
    # req_op by op_name, once per distinct (categories, has bytes)
    kinds, inverse = few_values(cats.astype(np.int64) * 2 + (nbytes > 0))
    op = np.array([NT_OPS.get(op_name(int(k) >> 1, int(k) & 1), 0) for k in kinds],
                  np.uint16)[inverse] if m else np.zeros(0, np.uint16)
    del inverse
    flags = np.zeros(m, np.uint16)
    for tc, f in NT_FLAGS:
        flags |= np.where(cats & tc != 0, f, 0).astype(np.uint16)
    del cats
    out = {"kind": np.full(m, 2, np.uint16), "version": np.ones(m, np.uint16), "cpu": cpu,
           "seq": seq, "ts_ns": ts, "sector": sec, "rq_id": rq, "bio_id": bio,
           "aux_sector": aux, "dev": dev, "nr_sectors": (nbytes >> 9).astype(np.uint32),
           "pid": take("pid"), "error": take("error").astype(np.int32), "action": a,
           "req_op": op, "req_flags": flags}
    col.clear()
    return out


def _events_table(out: dict[str, np.ndarray], name) -> pa.Table:
    """_event_columns' columns as block_events rows (without capture_id),
    comm named by name(pid)."""
    from nestrace.schema import record_schema
    arrays = {n: pa.array(v) for n, v in out.items()}
    arrays["comm"] = _strings(out["pid"], name)
    return pa.Table.from_pydict(arrays, schema=record_schema("block_event"))


def import_files(paths: list[str | os.PathLike], store: str | os.PathLike,
                 levels: dict[int, str], capture_id: str, machine: str = "") -> dict:
    """Write blktrace files as capture `capture_id` of `store`: block_events,
    a device_map naming each device's level (`levels`: dev -> vdisk or
    disk; devices not named are disk), capture_meta, and empty tables for
    the levels blktrace does not see.  Files as blktrace and the kernel
    write them are streamed: read a window at a time, in memory that does
    not grow with them (blkstream); others are read whole, and damaged
    records skipped, named in the result's problems (reading resumes at
    the next whole record).  Returns what was imported, and how the files
    were read ("read": streamed, or why whole)."""
    from nestrace.importers.blkstream import NotStreamable
    try:
        return _import_streamed(paths, store, levels, capture_id, machine) | {"read": "streamed"}
    except NotStreamable as e:
        why = str(e)
    return _import_whole(paths, store, levels, capture_id, machine) | {"read": f"whole: {why}"}


def _import_whole(paths, store, levels: dict[int, str], capture_id: str, machine: str) -> dict:
    """import_files, every record held at once."""
    col, comms, problems, damage = read_columns(*paths)
    col, dups = _without_duplicates(col)
    if dups:
        problems.append(f"{', '.join(map(str, paths))}: {dups} record(s) a second time (the same "
                        "device, CPU and sequence number): left out")
    lost = _lost_by_sequence(col, capture_id)
    numbered = bool(lost)
    if damage.ftrace_lost and not numbered:     # (a saved trace_pipe: ftrace's notes count)
        lost = _lost_by_notes(col, damage.ftrace_lost, capture_id)
    records = len(col["time_ns"])
    ev, skipped = block_events(col, comms)
    del col       # (the records, not needed again: memory for the pairing)
    # (without sequence numbers the damaged places and ftrace's notes are
    # the only count of what was lost; with them, the gaps count those
    # records already)
    lost_total = sum(r["seq_gaps"] for r in lost) if numbered else \
        damage.records + sum(damage.ftrace_lost.values())
    r = write_import(ev, skipped, problems, paths, store, levels, capture_id, machine,
                     source="blktrace", clock="blktrace", lost=lost, records=records,
                     lost_total=lost_total, extra=_blktrace_facts(numbered, damage, dups))
    return r | {"sequence_numbers": numbered, "damage": damage, "duplicates": dups}


def _blktrace_facts(numbered: bool, damage: Damage, dups: int) -> dict:
    return {"sequence_numbers": numbered,
            "damaged": {"places": damage.places, "bytes": damage.bytes,
                        "records_at_least": damage.records, "duplicates": dups},
            "ftrace_lost": sum(damage.ftrace_lost.values())}


# block events written a row group at a time, of at least this many (as
# small as DuckDB's own: the last one's write is the import's tail)
ROW_GROUP = 1 << 18


def _import_streamed(paths, store, levels: dict[int, str], capture_id: str,
                     machine: str) -> dict:
    """import_files a chunk of records at a time (blkstream.Records).
    Raises NotStreamable where the files are not as the kernel writes
    them."""
    from nestrace.importers.blkstream import Records
    recs = Records(paths)

    def facts(s: _Streamed) -> tuple[dict, dict]:
        lost, damage = recs.lost(capture_id), recs.damage()
        # (as _import_whole counts them: a cut record is lost where no
        # sequence numbers count it)
        lost_total = sum(r["seq_gaps"] for r in lost) + (0 if lost else damage.records)
        return ({"lost": lost, "lost_total": lost_total,
                 "kernel": "unknown", "clock": "blktrace", "source": "blktrace",
                 "skipped": _letters(s.skipped),
                 "extra": _blktrace_facts(bool(lost), damage, 0)},
                {"sequence_numbers": bool(lost), "damage": damage, "duplicates": 0,
                 "problems": recs.problems()})
    return stream_import(recs, paths, store, levels, capture_id, machine, facts)


def stream_import(recs, paths, store, levels: dict[int, str], capture_id: str, machine: str,
                  facts) -> dict:
    """Write the block events of records that come a chunk at a time, in
    time order (recs: chunks() of read_columns' columns, comms()), as a
    capture, as write_import writes them: the events made, written and
    paired into requests as they come, so that what is held is a few
    chunks and what is still open.  facts(streamed): (the capture's other
    facts, as _write_rest takes them: lost, lost_total, kernel, clock,
    source, skipped, extra; and more of the result).  Raises NotStreamable
    where a task's name would differ from the whole read's (a notify
    record after its task's events), or recs does."""
    import shutil

    from nestrace.importers.blkstream import NotStreamable
    from nestrace.store.files import StoreError, captures, init_store, writing
    from nestrace.store.manifest import publishing

    s = _Streamed(recs, paths, capture_id, machine or "unknown", levels)
    new = not os.path.exists(store)
    p = init_store(store)
    with writing(p, f"nestrace import {capture_id}"):
        if capture_id in captures(p):
            raise StoreError(f"{p}: already holds a capture {capture_id!r}")
        refused = False
        try:
            with publishing(p, capture_id):
                s.write(p)
                refused = True
                s.check()
                refused = False
                _write_empty(p, capture_id)
                f, more = facts(s)
                meta = _write_rest(p, capture_id, levels, f["lost"], sorted(s.devs), paths,
                                   machine, f["kernel"], f["clock"], f["source"], f["skipped"],
                                   f["extra"], f["lost_total"], s.span, s.events)
        except BaseException as e:
            # (a store made for an import the whole read refuses before it makes
            # one, or that it reads instead, is not left behind; one a write
            # failed in stays, empty, as the whole read leaves it)
            if new and (refused or isinstance(e, NotStreamable)):
                shutil.rmtree(p, ignore_errors=True)
            raise
    return {"capture_id": capture_id, "problems": [], "records": s.records,
            "block_events": s.events,
            "devices": {dev_name(d): levels.get(d, "disk") for d in sorted(s.devs)},
            "not_imported": f["skipped"], "lost": meta["lost_total"]} | more


class _Streamed:
    """The block events and requests of blktrace files, streamed into a
    capture's tables, and what the capture's other tables say of them."""

    def __init__(self, recs, paths, capture_id: str, machine: str, levels: dict[int, str]):
        self.paths, self.capture_id, self.machine, self.levels = paths, capture_id, machine, levels
        self.recs = recs
        self.records = self.events = 0
        self.skipped: dict[int, int] = {}       # by action code
        self.devs: set[int] = set()
        self.span: list[int] = []               # the first and last event's times
        self.used: dict[int, str] = {}          # pid -> the task name its events were given

    def write(self, p) -> None:
        """block_events and block_requests of capture_id in store p."""
        import collections
        from concurrent.futures import ThreadPoolExecutor

        from nestrace.importers.requests import SCHEMA as REQUESTS
        from nestrace.importers.requests import RequestStream
        from nestrace.schema import record_schema
        from nestrace.store.files import capture_table_parts, with_capture_id

        cid = self.capture_id
        schema = with_capture_id(record_schema("block_event").empty_table(), cid).schema
        with ThreadPoolExecutor(1) as pool, \
                capture_table_parts(p, "block_events", cid, schema) as write, \
                capture_table_parts(p, "block_requests", cid, REQUESTS) as write_rq:
            # (the second core writes, in order; this one reads, makes events
            # and pairs requests: a few parts ahead at most)
            queue: collections.deque = collections.deque()

            def later(fn, *args) -> None:
                queue.append(pool.submit(fn, *args))
                while len(queue) > 4:
                    queue.popleft().result()

            try:
                reqs = RequestStream(lambda t: later(write_rq, t), cid, self.machine,
                                     self.levels, self._name)
                held: list[pa.Table] = []
                for ev in self._events(reqs):
                    held.append(with_capture_id(ev, cid))
                    if sum(t.num_rows for t in held) >= ROW_GROUP:
                        later(write, pa.concat_tables(held))
                        held = []
                if held:
                    later(write, pa.concat_tables(held))
                reqs.close()
                while queue:
                    queue.popleft().result()
            finally:
                # (no part still being written when its file closes, on a
                # way out by an exception too: NotStreamable late in a file)
                for f in queue:
                    f.exception()

    def _events(self, reqs):
        """Each chunk's block events (a table), its requests given to reqs."""
        pairing = compiled.Pairing()
        self._names = self.recs.comms()
        for col in self.recs.chunks():
            self.records += len(col["time_ns"])
            rows, nt, skipped = _kept(col)
            for k, v in skipped.items():
                self.skipped[k] = self.skipped.get(k, 0) + v
            if not len(rows):
                continue
            ts = col.pop("time_ns")[rows]
            out = _event_columns(col, rows, nt[rows], ts, pairing.step)
            del nt, rows
            reqs.add(out)
            self.devs.update(few_values(out["dev"])[0].tolist())
            self.span = [self.span[0] if self.span else int(ts[0]), int(ts[-1])]
            self._names = self.recs.comms()
            ev = _events_table(out, self._name)
            self.events += ev.num_rows
            yield ev

    def _name(self, pid: int) -> str:
        return self.used.setdefault(pid, self._names.get(pid, ""))

    def check(self) -> None:
        """What the whole read would refuse, or name otherwise."""
        from nestrace.importers.blkstream import NotStreamable
        from nestrace.store.files import StoreError
        files = ", ".join(map(str, self.paths))
        comms = self.recs.comms()
        renamed = [pid for pid, n in self.used.items() if comms.get(pid, "") != n]
        if renamed:
            raise NotStreamable(f"{files}: task {renamed[0]} named by a notify record after "
                                "its events")
        if not self.events:
            problems = self.recs.problems() if hasattr(self.recs, "problems") else []
            raise StoreError(problems[0] if problems else
                             f"{files}: no block request events to import")
        unknown = sorted(set(self.levels) - self.devs)
        if unknown:
            raise StoreError(f"{', '.join(dev_name(d) for d in unknown)}: no request events of "
                             f"this device in {files} (it has "
                             f"{', '.join(dev_name(d) for d in sorted(self.devs))})")


def _without_duplicates(col: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """The records (read_columns' columns) but a second one of a device,
    CPU and sequence number (not 0: the ftrace blk tracer numbers none),
    and how many there were."""
    seq = col["sequence"]
    if not len(seq) or not seq.any():
        return col, 0
    rank, nrank = _ranks(col["dev"])
    cpu = col["cpu"]
    if nrank < (1 << 16) and int(cpu.max()) < (1 << 16):     # (one key: dev, cpu, seq)
        key = (rank.astype(np.uint64) << np.uint64(48)) | \
            (cpu.astype(np.uint64) << np.uint64(32)) | seq.astype(np.uint64)
        _, first = np.unique(key, return_index=True)
    else:
        _, first = np.unique(np.stack([rank.astype(np.uint64), cpu.astype(np.uint64),
                                       seq.astype(np.uint64)], axis=1), axis=0,
                             return_index=True)
    keep = np.zeros(len(seq), bool)
    keep[first] = True
    keep |= seq == 0
    n = int((~keep).sum())
    return ({c: v[keep] for c, v in col.items()} if n else col), n


def _lost_by_notes(col: dict[str, np.ndarray], lost: dict[int, int], capture_id: str
                   ) -> list[dict]:
    """lost_events rows (per CPU) of a saved trace_pipe: the records read
    from each CPU, and the events ftrace's notes say its buffer lost
    there (`lost`: CPU -> events), as ring-buffer drops."""
    cpus, counts = np.unique(col["cpu"], return_counts=True)
    got = dict(zip(cpus.tolist(), counts.tolist()))
    return [{"capture_id": capture_id, "cpu": c, "emitted": got.get(c, 0) + lost.get(c, 0),
             "received": got.get(c, 0), "ringbuf_drops": lost.get(c, 0), "seq_gaps": 0}
            for c in sorted(set(got) | set(lost))]


def _lost_by_sequence(col: dict[str, np.ndarray], capture_id: str) -> list[dict]:
    """lost_events rows (per CPU) of records missing by blktrace's sequence
    numbers: relay blktrace numbers each device's records per CPU from 1
    (the ftrace blk tracer writes 0: none)."""
    seq = col["sequence"]
    if not seq.any():
        return []
    dev, cpu = col["dev"], col["cpu"]
    by_cpu: dict[int, list[int]] = {}
    numbered = seq != 0
    keys = np.stack([dev[numbered], cpu[numbered]], axis=1)
    qs = seq[numbered]
    for d, c in np.unique(keys, axis=0):
        sel = (keys[:, 0] == d) & (keys[:, 1] == c)
        gaps, _ = seq_gaps(qs[sel])
        x = by_cpu.setdefault(int(c), [0, 0])
        x[0], x[1] = x[0] + int(sel.sum()), x[1] + gaps
    return [{"capture_id": capture_id, "cpu": c, "emitted": cnt + gaps, "received": cnt,
             "ringbuf_drops": 0, "seq_gaps": gaps} for c, (cnt, gaps) in sorted(by_cpu.items())]


def write_import(ev: pa.Table, skipped: dict, problems: list[str], paths, store,
                 levels: dict[int, str], capture_id: str, machine: str, *, source: str,
                 clock: str, lost: list[dict], records: int, kernel: str = "unknown",
                 extra: dict | None = None, lost_total: int | None = None) -> dict:
    """Write imported block events (block_events rows) as a capture: the
    device map (`levels`: dev -> vdisk or disk, else disk), the lost
    events per CPU (lost_events rows), capture_meta, and empty tables for
    what the source does not see."""
    from nestrace.store.files import StoreError, captures, init_store, writing
    from nestrace.store.manifest import publishing

    if not ev.num_rows:
        raise StoreError(problems[0] if problems else
                         f"{', '.join(map(str, paths))}: no block request events to import")
    devs = sorted(pc.unique(ev.column("dev")).to_pylist())   # (not a Python int per event)
    unknown = sorted(set(levels) - set(devs))
    if unknown:
        raise StoreError(f"{', '.join(dev_name(d) for d in unknown)}: no request events of this "
                         f"device in {', '.join(map(str, paths))} (it has "
                         f"{', '.join(dev_name(d) for d in devs)})")
    p = init_store(store)
    with writing(p, f"nestrace import {capture_id}"):
        if capture_id in captures(p):
            raise StoreError(f"{p}: already holds a capture {capture_id!r}")
        with publishing(p, capture_id):
            meta = _write_tables(p, ev, capture_id, levels, lost, devs, paths, machine, kernel,
                                 clock, source, skipped, extra, lost_total)
    return {"capture_id": capture_id, "problems": problems, "records": records,
            "block_events": ev.num_rows,
            "devices": {dev_name(d): levels.get(d, "disk") for d in devs},
            "not_imported": skipped, "lost": meta["lost_total"]}


def _write_tables(p, ev, capture_id, levels, lost, devs, paths, machine, kernel, clock, source,
                 skipped, extra, lost_total) -> dict:
    """write_import's tables, capture_meta last."""
    from concurrent.futures import ThreadPoolExecutor

    from nestrace.importers.requests import block_requests
    from nestrace.store.files import with_capture_id, write_capture_table
    # (the events written on a second core while the requests are paired
    # here, and stored as `correlate` stores them: what reads the capture
    # then reads them, not sorting the events again)
    with ThreadPoolExecutor(1) as pool:
        events = pool.submit(write_capture_table, p, "block_events", capture_id,
                             with_capture_id(ev, capture_id))
        _write_empty(p, capture_id)
        write_capture_table(p, "block_requests", capture_id,
                            block_requests(ev, capture_id, machine or "unknown", levels))
        events.result()
    ts = pc.min_max(ev.column("ts_ns")).as_py()
    return _write_rest(p, capture_id, levels, lost, devs, paths, machine, kernel, clock, source,
                       skipped, extra, lost_total, [ts["min"], ts["max"]], ev.num_rows)


def _write_empty(p, capture_id: str) -> None:
    """The kernel tables an import of block events has nothing for."""
    from nestrace.schema import kernel_tables, record_schema
    from nestrace.store.files import with_capture_id, write_capture_table
    for table, rec in kernel_tables().items():
        if table != "block_events":
            write_capture_table(p, table, capture_id,
                                with_capture_id(record_schema(rec).empty_table(), capture_id))


def _write_rest(p, capture_id, levels, lost, devs, paths, machine, kernel, clock, source,
                skipped, extra, lost_total, span, rows) -> dict:
    """An import's tables but its events, requests and empty ones:
    device_map, extent_maps, lost_events, and capture_meta last (span: the
    first and last event's times; rows: how many)."""
    import json

    from nestrace._version import __version__
    from nestrace.schema import RECORDS, table_schema
    from nestrace.store.files import write_capture_table
    dm = [{"capture_id": capture_id, "level": levels.get(d, "disk"), "dev": d,
           "name": dev_name(d), "size_sectors": 0, "block_size_bytes": 512} for d in devs]
    write_capture_table(p, "device_map", capture_id, pa.Table.from_pylist(dm, schema=table_schema("device_map")))
    write_capture_table(p, "extent_maps", capture_id, table_schema("extent_maps").empty_table())
    write_capture_table(p, "lost_events", capture_id, pa.Table.from_pylist(lost, schema=table_schema("lost_events")))
    meta = {"capture_id": capture_id, "machine": machine or "unknown", "kernel": kernel,
            "clock": clock,
            "start_ns": span[0], "end_ns": span[1], "start_wall": "",
            "command": "nestrace import " + " ".join(map(str, paths)), "hooks_json": "{}",
            "stack_json": json.dumps({"source": source, "files": [str(x) for x in paths],
                                      "levels": {dev_name(d["dev"]): d["level"] for d in dm},
                                      "not_imported": skipped, **(extra or {})}),
            "lost_total": sum(r["seq_gaps"] for r in lost) if lost_total is None
            else lost_total, "records_total": rows,
            "tool_version": __version__,
            "schema_version": json.dumps({n: s["version"] for n, s in RECORDS.items()})}
    write_capture_table(p, "capture_meta", capture_id,
                   pa.Table.from_pylist([meta], schema=table_schema("capture_meta")))
    return meta
