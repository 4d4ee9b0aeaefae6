"""Which I/O to follow: one given by level and io_id (checked to exist), or
the slowest read or write of its level."""
from __future__ import annotations

from typing import Protocol


class Rows(Protocol):
    """What pick asks of a session (nestrace.query.session.Session): its
    rows, by SQL and parameters.  (A protocol, not the class: the session
    imports pick.)"""

    def rows(self, sql: str, params: list | None = None) -> list[dict]: ...

LEVELS = ("vfs", "vdisk", "hostfs", "disk")

# the slowest I/O of a level: the longest from start to end (a block
# request: first seen to completion); host-FS accesses have no end
_BLOCK_SLOWEST = ("SELECT io_id, c_ns::BIGINT - start_ns::BIGINT AS latency_ns FROM {}_io "
                  "WHERE capture_id = ? AND op IN ('read', 'write') AND c_ns IS NOT NULL "
                  "ORDER BY latency_ns DESC, io_id LIMIT 1")
_SLOWEST = {
    "vfs": "SELECT io_id, duration_ns AS latency_ns FROM vfs_io WHERE capture_id = ? "
           "AND op IN ('read', 'write') ORDER BY duration_ns DESC, io_id LIMIT 1",
    "vdisk": _BLOCK_SLOWEST.format("vdisk"),
    "disk": _BLOCK_SLOWEST.format("disk"),
}


def pick(s: Rows, cid: str, level: str, io_id: int | None) -> tuple[int, str]:
    """(io_id, how it was chosen); ValueError when there is no such I/O."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r}: one of {', '.join(LEVELS)}")
    if io_id is None:
        if level not in _SLOWEST:
            raise ValueError("hostfs accesses have no end time, so no slowest one: give an io_id")
        rows = s.rows(_SLOWEST[level], [cid])
        if not rows:
            raise ValueError(f"capture {cid} has no completed {level} read or write")
        return rows[0]["io_id"], f"the slowest {level} read or write"
    view = {"hostfs": "hostfs_io",
            "vfs": "(SELECT capture_id, io_id FROM vfs_io UNION ALL "
                   "SELECT capture_id, io_id FROM vfs_hints)"}.get(level, f"{level}_io")
    if not s.rows(f"SELECT 1 FROM {view} WHERE capture_id = ? AND io_id = ? LIMIT 1", [cid, io_id]):
        raise ValueError(f"capture {cid} has no {level} I/O with io_id {io_id}")
    return io_id, f"{level} io_id {io_id}"
