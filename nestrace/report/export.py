"""A capture as a Chrome/Perfetto JSON timeline (open it in ui.perfetto.dev
or chrome://tracing).

One process per level (vfs, vdisk, hostfs, disk, in stack order), one
slice per I/O (and per readahead(2), posix_fadvise or madvise call, vfs_hints: links
ties the reads they ask for to them), and a flow arrow for every link:
from the upper event to
the lower request or access it caused.  I/Os in flight together are laid
out on lanes ("slot N": the first lane free when the I/O starts), since a
JSON timeline needs the slices on one thread to nest, and concurrent
requests do not.  Block requests run from their first event (Q, else G,
else D) to their completion, with the btt phases in their arguments;
host-FS accesses are instants (nestrace records when they start).  Times
are microseconds from the capture's start.  A counter track per level
(vfs, vdisk, disk; per device where a level has several) follows how
many I/Os are in flight (view depth_arrivals: calls from entry to exit,
block requests from dispatch to completion).
"""
from __future__ import annotations

import heapq
import json
import os
from pathlib import Path

LEVELS = ("vfs", "vdisk", "hostfs", "disk")
PID = {lv: i + 1 for i, lv in enumerate(LEVELS)}

QUERIES = {
    "vfs": """SELECT io_id, ts_ns AS t0, end_ns AS t1, op, syscall, bytes, offset_bytes, ino,
                     pid, tid, comm FROM vfs_io WHERE capture_id = $c
              UNION ALL   -- the hints, which links ties the reads they ask for to
              SELECT io_id, ts_ns, end_ns, 'other', concat_ws(' ', syscall, advice),
                     req_bytes, offset_bytes, ino, pid, tid, comm
              FROM vfs_hints WHERE capture_id = $c""",
    "vdisk": """SELECT io_id, start_ns AS t0, coalesce(c_ns, d_ns) AS t1, op, rwbs, bytes,
                       offset_bytes, sector, q2g_ns, g2i_ns, i2d_ns, d2c_ns, q2c_ns
                FROM vdisk_io WHERE capture_id = $c""",
    "hostfs": """SELECT io_id, ts_ns AS t0, ts_ns AS t1, op, source, bytes, offset_bytes, ino
                 FROM hostfs_io WHERE capture_id = $c""",
    "disk": """SELECT io_id, start_ns AS t0, coalesce(c_ns, d_ns) AS t1, op, rwbs, bytes,
                      offset_bytes, sector, q2g_ns, g2i_ns, i2d_ns, d2c_ns, q2c_ns
               FROM disk_io WHERE capture_id = $c""",
}


class ExportError(ValueError):
    pass


def _lanes(rows: list[dict]) -> None:
    """Give each row (sorted by t0) a lane: the lowest one whose last slice
    ended strictly before this one starts."""
    busy: list[tuple[int, int]] = []     # (end, lane)
    free: list[int] = []
    n = 0
    for r in rows:
        while busy and busy[0][0] < r["t0"]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            n += 1
            lane = n
        r["lane"] = lane
        heapq.heappush(busy, (r["t1"], lane))


def _us(ns: int) -> float:
    return ns / 1000.0


def _size(b) -> str:
    if b is None:
        return ""
    if b < 1024:
        return f"{b} B"
    if b < 1 << 20:
        return f"{b / 1024:g} KiB"
    return f"{b / (1 << 20):g} MiB"


def timeline(session, capture_id: str | None = None, window: tuple[float, float] | None = None,
             max_slices: int = 2_000_000) -> dict:
    """The timeline of one capture as a Chrome JSON trace (a dict).
    window: (from, to) in seconds from the capture's start."""
    try:
        cid = session.capture(capture_id)
    except ValueError as e:
        raise ExportError(str(e)) from None
    meta = session.rows("SELECT machine, start_ns, end_ns FROM capture_meta WHERE capture_id = ?",
                        [cid])[0]
    base = meta["start_ns"] or 0
    if window and meta["end_ns"]:
        length = (meta["end_ns"] - base) / 1e9
        if window[0] >= length or window[1] <= 0:
            raise ExportError(f"--window {window[0]:g}:{window[1]:g} is outside capture {cid}, "
                              f"which lasts {length:.3f} s (from 0)")
    lo, hi = (base + int(window[0] * 1e9), base + int(window[1] * 1e9)) if window else (0, 1 << 63)
    events: list[dict] = []
    where: dict[tuple[str, int], tuple[int, int]] = {}     # (level, io_id) -> (lane, mid ns)
    slices = 0
    for lv in LEVELS:
        rows = session.rows(f"SELECT * FROM ({QUERIES[lv]}) WHERE t1 >= $lo AND t0 <= $hi "
                            "ORDER BY t0, io_id", {"c": cid, "lo": lo, "hi": hi})
        slices += len(rows)
        if slices > max_slices:
            raise ExportError(f"more than {max_slices} I/Os: give a --window (seconds from the "
                              "capture's start) to export part of the capture")
        events.append({"ph": "M", "name": "process_name", "pid": PID[lv],
                       "args": {"name": f"{PID[lv]} {lv}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": PID[lv],
                       "args": {"sort_index": PID[lv]}})
        for r in rows:
            r["t1"] = max(r["t1"] if r["t1"] is not None else r["t0"], r["t0"])
        _lanes(rows)
        lanes = max((r["lane"] for r in rows), default=0)
        for lane in range(1, lanes + 1):
            events.append({"ph": "M", "name": "thread_name", "pid": PID[lv], "tid": lane,
                           "args": {"name": f"slot {lane}"}})
        for r in rows:
            io_id, t0, t1, lane = r.pop("io_id"), r.pop("t0"), r.pop("t1"), r.pop("lane")
            label = r.get("syscall") or r.get("rwbs") or r.get("source") or r["op"]
            events.append({"ph": "X", "name": f"{label} {_size(r['bytes'])}".strip(),
                           "cat": lv, "pid": PID[lv], "tid": lane, "ts": _us(t0 - base),
                           "dur": _us(t1 - t0),
                           "args": {"io_id": io_id, **{k: v for k, v in r.items() if v is not None}}})
            where[(lv, io_id)] = (lane, (t0 + t1) // 2)
    counters = _in_flight(session, cid, base, lo, hi, events)
    flows = 0
    for ln in session.rows("SELECT DISTINCT upper_level, upper_id, lower_level, lower_id, kind "
                           "FROM links WHERE capture_id = ? AND upper_id IS NOT NULL "
                           "ORDER BY lower_level, lower_id, upper_id", [cid]):
        up = where.get((ln["upper_level"], ln["upper_id"]))
        down = where.get((ln["lower_level"], ln["lower_id"]))
        if not up or not down:
            continue                  # one end outside the window
        flows += 1
        events.append({"ph": "s", "id": flows, "name": ln["kind"], "cat": "link",
                       "pid": PID[ln["upper_level"]], "tid": up[0], "ts": _us(up[1] - base)})
        events.append({"ph": "f", "bp": "e", "id": flows, "name": ln["kind"], "cat": "link",
                       "pid": PID[ln["lower_level"]], "tid": down[0], "ts": _us(down[1] - base)})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"capture_id": cid, "machine": meta["machine"], "slices": slices,
                          "flows": flows, "counters": counters, "start_ns": base}}


def _in_flight(session, cid: str, base: int, lo: int, hi: int, events: list[dict]) -> int:
    """Counter events (I/Os in flight after each arrival and end in the
    window) on each level's process; returns how many.  Several steps at
    one instant give one value, the last."""
    rows = session.rows("""
        SELECT d.level, d.dev, s.t, last(s.depth ORDER BY s.delta, s.io_id) AS depth,
               count(*) OVER (PARTITION BY d.level) > count(*) OVER (PARTITION BY d.level, d.dev)
                 AS several
        FROM _depth_steps s JOIN _depth_devs d USING (k)
        WHERE d.capture_id = ? AND s.t BETWEEN ? AND ?
        GROUP BY d.level, d.dev, s.t
        ORDER BY list_position(['vfs', 'vdisk', 'disk'], d.level), d.dev, s.t""", [cid, lo, hi])
    for r in rows:
        name = "in flight" + (f" {r['dev'] >> 20}:{r['dev'] & 0xfffff}" if r["several"] else "")
        events.append({"ph": "C", "name": name, "pid": PID[r["level"]], "ts": _us(r["t"] - base),
                       "args": {"in flight": r["depth"]}})
    return len(rows)


def export(store: str | os.PathLike, output: str | os.PathLike, capture_id: str | None = None,
           window: tuple[float, float] | None = None) -> dict:
    """Write the timeline of a capture of store to output; returns its otherData."""
    from nestrace.query.session import Session
    from nestrace.store.files import check_store
    with Session(check_store(store)) as s:
        t = timeline(s, capture_id, window)
    out = Path(output)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            # (dumps, not dump: only the one-shot encoder is in C; the demo's
            # 16k I/Os took 2.4 s to encode under cProfile, now 0.09 s)
            f.write(json.dumps(t, separators=(",", ":")))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)     # (a failed write leaves nothing)
    return t["otherData"]
