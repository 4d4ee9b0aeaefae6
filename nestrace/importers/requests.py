"""An imported capture's block requests, paired in numpy as the SQL
module block.requests pairs them (`_block_requests_computed`), and stored
as `nestrace correlate` stores them: a report on the import then reads
them instead of sorting the events again.  The importers have the events
in memory, in time order; two sorts by key here take a fraction of the
two window sorts DuckDB would run on the stored events.

Each step mirrors the SQL's (tests/importers/test_requests.py checks them
equal on real kernel files):
- by bio, in time order: each D with the bio's Q, G or X just before it
  (Q G D, Q D, X G D, X D);
- by request, in time order: each D with the I right before it and the
  event right after it (a C, whose time and error are the request's;
  any other: done_by_ns);
- a split-off piece (X) has no Q of its own: it takes the Q of the bio
  it was cut from, found as `_block_split_q` finds it (the latest Q or X
  remainder at its sector, followed back to a Q);
- a Q, G or X more than STALE_NS before the D is not its, nor a start
  more than SPLIT_NS before the X (`_block_stale_ns()`,
  `_block_split_ns()`; tracers/readers_pairing.c says why, and forgets
  them)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

Q, G, I, D, C, X = 1, 4, 5, 6, 7, 8
# the kernel's REQ_OP -> op (codes of base.levels' _req_op_name)
OPS = {0: "read", 1: "write", 2: "flush", 3: "discard", 5: "discard", 9: "write"}
SCHEMA = pa.schema([
    ("capture_id", pa.string()), ("machine", pa.string()), ("level", pa.string()),
    ("dev", pa.uint32()), ("io_id", pa.uint64()), ("rq_id", pa.uint64()),
    ("ts_ns", pa.uint64()), ("q_ns", pa.uint64()), ("g_ns", pa.uint64()),
    ("i_ns", pa.uint64()), ("c_ns", pa.uint64()), ("done_by_ns", pa.uint64()),
    ("sector", pa.uint64()), ("nr_sectors", pa.uint32()), ("op", pa.string()),
    ("req_op", pa.uint16()), ("req_flags", pa.uint16()), ("error", pa.int32()),
    ("pid", pa.uint32()), ("comm", pa.string())])
NONE = -1       # (no such event: NULL)
# how long a bio's Q, G or X is kept for its D, and a start at a sector for
# an X there, ns (STALE_NS and SPLIT_NS of tracers/readers_pairing.c,
# _block_stale_ns() and _block_split_ns() of block.requests)
STALE_NS = 30_000_000_000
SPLIT_NS = 1_000_000_000


def _time_order(ts: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    """Every row by time, then CPU (the windows' ORDER BY): the importers
    give the events in time order, so mostly a check."""
    n = len(ts)
    if n < 2 or bool(np.all((ts[1:] > ts[:-1]) | ((ts[1:] == ts[:-1]) & (cpu[1:] >= cpu[:-1])))):
        return np.arange(n)
    return np.lexsort((cpu, ts))


def _order(rows: np.ndarray, part: np.ndarray, dev: np.ndarray) -> np.ndarray:
    """`rows` (in time order) sorted by (dev, part), time order kept within:
    a window's partitions.  One stable sort of one key where dev's rank
    and part fit in 64 bits (the blktrace importer's small ids; not the
    kernel's addresses, which trace.dat gives)."""
    p, d = part[rows], dev[rows]
    if not len(rows):
        return rows
    udev = np.unique(d)
    if len(udev) == 1:
        return rows[np.argsort(p, kind="stable")]
    if int(p.max()) < (1 << 54) and len(udev) <= 1024:
        key = (np.searchsorted(udev, d).astype(np.uint64) << np.uint64(54)) | p.astype(np.uint64)
        return rows[np.argsort(key, kind="stable")]
    return rows[np.lexsort((p, d))]


def _neighbors(o: np.ndarray, part: np.ndarray, dev: np.ndarray, step: int) -> np.ndarray:
    """For each row of the order `o`, the row `step` before it (negative:
    after it) in the same partition, or NONE."""
    n = len(o)
    out = np.full(n, NONE, np.int64)
    k = abs(step)
    if n <= k:
        return out
    p, d = part[o], dev[o]
    if step > 0:
        same = (p[k:] == p[:-k]) & (d[k:] == d[:-k])
        out[k:] = np.where(same, o[:-k], NONE)
    else:
        same = (p[:-k] == p[k:]) & (d[:-k] == d[k:])
        out[:-k] = np.where(same, o[k:], NONE)
    return out


def _split_q(a, ts, sec, aux, dev, bio, cpu, seq) -> dict[tuple[int, int, int], int]:
    """(dev, bio_id, X's time) -> the Q time of the bio each X cut from."""
    xs = np.flatnonzero(a == X)
    if not len(xs):
        return {}
    x_keys = set(zip(dev[xs].tolist(), sec[xs].tolist()))
    qs = np.flatnonzero(a == Q)
    qs = qs[[k in x_keys for k in zip(dev[qs].tolist(), sec[qs].tolist())]] if len(qs) else qs
    rem = xs[aux[xs] > sec[xs]]
    # starts: (dev, key, time, is_x, row)
    s_dev = np.concatenate([dev[qs], dev[rem]])
    s_key = np.concatenate([sec[qs], aux[rem]])
    s_ts = np.concatenate([ts[qs], ts[rem]])
    s_row = np.concatenate([qs, rem])
    s_x = np.concatenate([np.zeros(len(qs), bool), np.ones(len(rem), bool)])
    pred = np.full(len(xs), NONE, np.int64)      # the start's index, per X
    if len(s_row):
        so = np.lexsort((s_ts, s_key, s_dev))
        # (a piece's start: the last start at its (dev, sector) at or before its time)
        keys = np.rec.fromarrays([s_dev[so], s_key[so], s_ts[so]])
        want = np.rec.fromarrays([dev[xs], sec[xs], ts[xs]], dtype=keys.dtype)
        at = np.searchsorted(keys, want, side="right") - 1
        ok = (at >= 0)
        at_c = np.maximum(at, 0)
        ok &= (keys.f0[at_c] == want.f0) & (keys.f1[at_c] == want.f1)
        ok &= ts[xs].astype(np.int64) - keys.f2[at_c].astype(np.int64) <= SPLIT_NS
        pred = np.where(ok, so[at_c], NONE)
    q_of = np.full(len(xs), NONE, np.int64)      # the Q time, per X
    x_index = {int(r): i for i, r in enumerate(xs)}
    via = np.full(len(xs), NONE, np.int64)       # the X it came from, per X
    for i, p in enumerate(pred.tolist()):
        if p == NONE:
            continue
        if s_x[p]:
            via[i] = x_index[int(s_row[p])]
        else:
            q_of[i] = int(s_ts[p])
    # (followed back to a Q: a chain of remainders, each one cut further)
    for _ in range(len(xs)):
        follow = (q_of == NONE) & (via != NONE)
        if not follow.any():
            break
        got = q_of[via[follow]]
        idx = np.flatnonzero(follow)
        q_of[idx] = got
        via[idx] = np.where(got == NONE, via[via[idx]], NONE)
    out = {}
    for i in np.flatnonzero(q_of != NONE).tolist():
        r = xs[i]
        out.setdefault((int(dev[r]), int(bio[r]), int(ts[r])), int(q_of[i]))
    return out


def block_requests(ev: pa.Table, capture_id: str, machine: str,
                   levels: dict[int, str]) -> pa.Table:
    """The requests of block_events rows `ev` (one capture), in the
    columns and types of `_block_requests_computed`."""
    col = {c: ev.column(c).to_numpy() for c in (
        "action", "ts_ns", "cpu", "seq", "dev", "bio_id", "rq_id", "sector", "aux_sector",
        "nr_sectors", "req_op", "req_flags", "pid", "error")}
    a, ts, cpu, dev = col["action"], col["ts_ns"], col["cpu"], col["dev"]
    bio, rq = col["bio_id"], col["rq_id"]
    base = _time_order(ts, cpu)
    ab = a[base]

    def of(*actions: int) -> np.ndarray:     # (those rows, in time order)
        lut = np.zeros(max(int(a.max(initial=0)), X) + 1, bool)
        lut[list(actions)] = True
        return base[lut[ab]]

    # by bio: each D with the two events before it
    o = _order(of(Q, G, D, X), bio, dev)
    p1, p2 = _neighbors(o, bio, dev, 1), _neighbors(o, bio, dev, 2)
    dsel = a[o] == D
    ds, p1, p2 = o[dsel], p1[dsel], p2[dsel]
    t1 = ts[np.maximum(p1, 0)].astype(np.int64)
    t2 = ts[np.maximum(p2, 0)].astype(np.int64)
    td = ts[ds].astype(np.int64)
    a1 = np.where((p1 != NONE) & (td - t1 <= STALE_NS), a[np.maximum(p1, 0)], 0)
    a2 = np.where((p2 != NONE) & (td - t2 <= STALE_NS), a[np.maximum(p2, 0)], 0)
    bq = np.where(a1 == Q, t1, np.where((a1 == G) & (a2 == Q), t2, NONE))
    xn = np.where(a1 == X, t1, np.where((a1 == G) & (a2 == X), t2, NONE))
    gn = np.where(a1 == G, t1, NONE)
    split = _split_q(a, ts, col["sector"], col["aux_sector"], dev, bio, cpu, col["seq"])
    if split:
        for i in np.flatnonzero((bq == NONE) & (xn != NONE)).tolist():
            q = split.get((int(dev[ds[i]]), int(bio[ds[i]]), int(xn[i])))
            if q is not None:
                bq[i] = q
    # by request: the Ds among the Is and Cs
    o = _order(of(D, I, C), rq, dev)
    prev, nxt = _neighbors(o, rq, dev, 1), _neighbors(o, rq, dev, -1)
    dsel = a[o] == D
    r, prev, nxt = o[dsel], prev[dsel], nxt[dsel]
    pa_ = np.where(prev != NONE, a[np.maximum(prev, 0)], 0)
    na = np.where(nxt != NONE, a[np.maximum(nxt, 0)], 0)
    i_ns = np.where(pa_ == I, ts[np.maximum(prev, 0)].astype(np.int64), NONE)
    c_ns = np.where(na == C, ts[np.maximum(nxt, 0)].astype(np.int64), NONE)
    done = np.where(nxt != NONE, ts[np.maximum(nxt, 0)].astype(np.int64), NONE)
    err = np.where(na == C, col["error"][np.maximum(nxt, 0)], 0).astype(np.int32)
    # (the D's own columns: by request order r, its by-bio facts looked up)
    at = np.empty(len(a), np.int64)
    at[ds] = np.arange(len(ds))
    k = at[r]
    c = {"q": bq[k], "g": gn[k], "i": i_ns, "c": c_ns, "done": done, "error": err}
    for name in ("dev", "cpu", "seq", "rq_id", "ts_ns", "sector", "nr_sectors", "req_op",
                 "req_flags", "pid"):
        c[name] = col[name][r]
    return _table(c, capture_id, machine, levels, ev.column("comm").take(pa.array(r)))


def _table(c: dict[str, np.ndarray], capture_id: str, machine: str, levels: dict[int, str],
           comm: pa.Array) -> pa.Table:
    """block_requests rows of requests' columns c (dev, cpu, seq, rq_id,
    ts_ns, sector, nr_sectors, req_op, req_flags, pid, error, and the
    times q, g, i, c and done: NONE where there is none)."""
    ops = c["req_op"]

    def u64(v: np.ndarray) -> pa.Array:
        return pa.array(v.astype(np.uint64), pa.uint64(), mask=v == NONE)

    names = np.array([OPS.get(int(x), "other") for x in range(max(int(ops.max(initial=0)), 9) + 1)],
                     dtype=object)
    devs = c["dev"]
    n = len(devs)
    udev = np.unique(devs)
    lv = pa.array([levels.get(d, "disk") for d in udev.tolist()], pa.string())
    cols = {
        "capture_id": pa.repeat(pa.scalar(capture_id, pa.string()), n),
        "machine": pa.repeat(pa.scalar(machine, pa.string()), n),
        "level": lv.take(pa.array(np.searchsorted(udev, devs))),
        "dev": pa.array(devs, pa.uint32()),
        "io_id": pa.array((c["cpu"].astype(np.uint64) << np.uint64(48)) | c["seq"], pa.uint64()),
        "rq_id": pa.array(c["rq_id"], pa.uint64()), "ts_ns": pa.array(c["ts_ns"], pa.uint64()),
        "q_ns": u64(c["q"]), "g_ns": u64(c["g"]), "i_ns": u64(c["i"]), "c_ns": u64(c["c"]),
        "done_by_ns": u64(c["done"]), "sector": pa.array(c["sector"], pa.uint64()),
        "nr_sectors": pa.array(c["nr_sectors"], pa.uint32()),
        "op": pa.array(names[ops].tolist() if n else [], pa.string()),
        "req_op": pa.array(ops, pa.uint16()),
        "req_flags": pa.array(c["req_flags"], pa.uint16()),
        "error": pa.array(c["error"], pa.int32()), "pid": pa.array(c["pid"], pa.uint32()),
        "comm": comm if isinstance(comm, pa.Array) else comm.combine_chunks(),
    }
    return pa.Table.from_pydict(cols, schema=SCHEMA)


class RequestStream:
    """block_requests a chunk of events at a time: each chunk's events in
    time order and after the chunk before's (blkimport's streamed import),
    paired in one pass of compiled.Requests, which keeps only what is
    still open between chunks.  A request is written (a part at a time,
    `write`) once the event after its D has come, or at the end: what is
    held is the requests still open and a part not yet written.  The rows
    are block_requests' (in another order); comm is name(pid)."""
    _EVENT = ("dev", "cpu", "seq", "rq_id", "ts_ns", "sector", "nr_sectors", "req_op",
              "req_flags", "pid")
    PART = 1 << 18      # requests a part (a row group)

    def __init__(self, write, capture_id: str, machine: str, levels: dict[int, str], name):
        from nestrace.importers import compiled
        self._pair = compiled.Requests()
        self._write, self._name = write, name
        self._meta = (capture_id, machine, levels)
        self._done: list[dict[str, np.ndarray]] = []      # finished, not yet written
        self._last: dict[str, np.ndarray] | None = None   # the last chunk's, "n": numbers
        self._open: dict[str, np.ndarray] | None = None   # older ones still waiting
        self.made = self.written = 0

    def add(self, ev: dict[str, np.ndarray]) -> None:
        """A chunk's events (block_events columns by name)."""
        ts, cpu = ev["ts_ns"], ev["cpu"]
        o = _time_order(ts, cpu)
        if len(o) and not np.array_equal(o, np.arange(len(o))):
            pick = {n: ev[n][o] for n in ("action", "ts_ns", "dev", "bio_id", "rq_id",
                                          "sector", "aux_sector", "error")}
        else:
            o, pick = None, ev
        out, fix = self._pair.step(pick["action"], pick["ts_ns"], pick["dev"], pick["bio_id"],
                                   pick["rq_id"], pick["sector"], pick["aux_sector"],
                                   pick["error"])
        rows = out.pop("row")
        if o is not None:
            rows = o[rows]
        new = out | {n: ev[n][rows] for n in self._EVENT}
        new["n"] = np.arange(self.made, self.made + len(rows))
        self.made += len(rows)
        # (the requests of earlier chunks finished now: most of the last
        # chunk's, and a few older ones)
        last, old = self._last, self._open
        if len(fix["row"]):
            first = int(last["n"][0]) if last is not None and len(last["n"]) else self.made
            for held, sel in ((last, fix["row"] >= first), (old, fix["row"] < first)):
                if held is None or not sel.any():
                    continue
                at = np.searchsorted(held["n"], fix["row"][sel])
                for c in ("c", "done", "error"):
                    held[c][at] = fix[c][sel]
        if old is not None:
            waiting = old["done"] == NONE
            if not waiting.all():
                self._done.append({c: v[~waiting] for c, v in old.items()})
                old = {c: v[waiting] for c, v in old.items()}
        if last is not None:
            waiting = last["done"] == NONE
            if waiting.any():       # (still open: kept apart, the rest written)
                more = {c: v[waiting] for c, v in last.items()}
                old = more if old is None else \
                    {c: np.concatenate([old[c], more[c]]) for c in more}
                last = {c: v[~waiting] for c, v in last.items()}
            self._done.append(last)
        self._open, self._last = old, new
        if sum(len(d["n"]) for d in self._done) >= self.PART:
            self._flush()

    def _flush(self) -> None:
        parts = [d for d in self._done if len(d["n"])]
        self._done = []
        if not parts:
            return
        c = {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}
        from nestrace.importers.blktrace import _strings
        self._write(_table(c, *self._meta, _strings(c["pid"], self._name)))
        self.written += len(c["n"])

    def close(self) -> int:
        """Write what is left (requests without an event after their D as
        they are); how many requests there were."""
        self._done += [x for x in (self._open, self._last) if x is not None]
        self._open = self._last = None
        self._flush()
        assert self.written == self.made, (self.written, self.made)
        return self.made
