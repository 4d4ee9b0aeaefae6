"""What the query diff tests share: a session on hand-built rows and a
direct-read stack."""
from __future__ import annotations

from rows import (
    DISK,
    VDISK,
    capture_meta,
    device_map,
    extents,
    hostfs,
    request,
    vfs,
)

from nestrace.query.session import Session

MiB = 1 << 20


def session(**tables) -> Session:
    base = {"capture_meta": capture_meta(), "device_map": device_map(), "extent_maps": extents()}
    return Session.from_tables(base | tables)


def direct_read_stack():
    """One 4 KiB O_DIRECT pread at file offset 8192, seen at all four levels."""
    return dict(
        vfs_events=[vfs(100, 900, off=8192, f_flags=0o40000)],
        block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
        + request(310, 320, 800, DISK, 100 * MiB + 4 * MiB + 8192, 4096, rq=2, bio=12),
        hostfs_events=[hostfs(300, 4 * MiB + 8192, 4096, source=3, flags=1)])
