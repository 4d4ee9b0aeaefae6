"""`nestrace follow`: one I/O down (and up) the stack.

The I/O is given by level and io_id, or is the slowest read or write of
its level; the rows come from the `follow_io` macro (correlate/sql/follow).
"""
from __future__ import annotations

import pyarrow as pa

from nestrace.query.pick import pick
from nestrace.query.session import FOLLOW_SQL, Session


def follow(s: Session, level: str, io_id: int | None = None,
           capture_id: str | None = None) -> tuple[str, str, pa.Table]:
    """(capture, what was followed, the follow_io rows)."""
    cid = s.capture(capture_id)
    io_id, what = pick(s, cid, level, io_id)
    # (not s.follow_io, which would check the I/O again: ~0.05 s at 10 M events)
    return cid, what, s.query(FOLLOW_SQL, [cid, level, io_id])


def breakdown(s: Session, cid: str, rows: pa.Table) -> dict | None:
    """Where the time of the tree's application call went (its
    latency_breakdown row), when the tree holds exactly one vfs call."""
    calls = [r["io_id"] for r in rows.to_pylist() if r["level"] == "vfs" and r["depth"] <= 0]
    if len(calls) != 1:
        return None
    got = s.rows("SELECT * FROM latency_breakdown WHERE capture_id = ? AND io_id = ?",
                 [cid, calls[0]])
    return got[0] if got else None


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:.1f}"


def timed_rows(rows: pa.Table) -> list[dict]:
    """The rows as dicts, with start_us (from the followed I/O's start)
    and latency_us as text (µs, one decimal; "-" where unknown)."""
    r = rows.to_pylist()
    t0 = next((x["start_ns"] for x in r if x["depth"] == 0), None)
    for x in r:
        x["start_us"] = _us(None if x["start_ns"] is None or t0 is None else x["start_ns"] - t0)
        x["latency_us"] = _us(x["latency_ns"])
    return r


# latency_breakdown's parts, as the terminal names them
PARTS = (("guest_service_ns", "in the guest above its disk"), ("guest_queue_ns", "virtual-disk queue"),
         ("host_fs_ns", "host FS and loop"), ("host_queue_ns", "host-disk queue"),
         ("device_ns", "device"))


def render(cid: str, what: str, rows: pa.Table, split: dict | None = None, console=None) -> None:
    """The rows as a tree: each level indented by its depth, times in µs
    from the followed I/O's start; then where the call's time went
    (`split`: its latency_breakdown row)."""
    from rich.console import Console

    from nestrace.report.terminal import _fmt_bytes, _table
    # a row is ~110 characters (io_ids are 15 digits), and an io_id cut
    # short is no use: never narrower than that (a narrower terminal wraps
    # the lines, and keeps every digit)
    con = console or Console()
    con.width = max(con.width, 120)
    r = timed_rows(rows)
    top = min((x["depth"] for x in r), default=0)
    con.print(f"capture {cid}: {what}")
    t = _table("Followed through links", ("level", "io_id", "op", "offset", "bytes", "start us",
                                           "took us", "in\nflight", "kind", "linked", "task"),
               left=("level", "op", "kind", "task"),
               caption="start us: from the followed I/O's start; in flight: I/Os of its device "
                       "in flight when it arrived, itself included; linked: bytes of the lower "
                       "I/O of the pair that the link accounts for")
    for x in r:
        t.add_row(" " * (x["depth"] - top) + x["level"], str(x["io_id"]),
                  x["op"] or "-", "-" if x["offset_bytes"] is None else str(x["offset_bytes"]),
                  _fmt_bytes(x["bytes"]), x["start_us"], x["latency_us"],
                  "-" if x["in_flight"] is None else str(x["in_flight"]), x["kind"] or "",
                  "" if x["link_bytes"] is None else _fmt_bytes(x["link_bytes"]), x["comm"] or "")
    con.print(t)
    if split and split["total_ns"] and not split["ended"]:
        con.print("where the call's time went is not known: a request it caused was not seen "
                  "to end (capture_meta.completions_missed)")
    elif split and split["total_ns"]:
        con.print(f"where the call's {_us(split['total_ns'])} us went (latency_breakdown):")
        for k, name in PARTS:
            con.print(f"  {name:<28} {_us(split[k]):>10} us {100 * (split[k] or 0) / split['total_ns']:4.0f} %")
    if len(r) == 1:
        con.print("links ties nothing to it (unattributed, or a level with no other traced "
                  "level next to it)")
