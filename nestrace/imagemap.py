"""Where a disk image keeps each guest byte, for the formats that do not
keep it at the same offset: qcow2 (`nestrace.qcow2`), VMware's hosted
sparse vmdk (`nestrace.vmdk`), VirtualBox's vdi (`nestrace.vdi`),
Hyper-V's vhdx (`nestrace.vhdx`) and the dynamic VHD (`nestrace.vpc`).  All allocate a cluster (a grain, in
VMware's words; a block, in the others') of the file the first time the
guest writes that part of its disk, where the file ends then, and find it
again through a table (two levels of them for qcow2 and vmdk).  Their maps are read into one shape, `ClusterMap`, that `record`
stores as extent rows and `merge` and the views carry offsets through."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

# image formats whose map nestrace reads (stack.image_format's names)
MAPPED = ("qcow2", "vmdk", "vdi", "vhdx", "vpc")
# the formats whose guest offsets nestrace can follow, for messages
FOLLOWED = "raw, " + ", ".join(MAPPED[:-1]) + " and " + MAPPED[-1]


class ImageMapError(ValueError):
    """An image whose map cannot be read: the message names the file and
    the offset of what is wrong."""


@dataclass
class ClusterMap:
    path: str
    version: int
    cluster_bytes: int
    virtual_bytes: int
    extents: list[tuple[int, int, int]]       # (guest offset, image offset, length)
    zero_clusters: int = 0
    compressed_clusters: int = 0
    backing_file: str = ""
    dirty: bool = False
    # the image's own tables (header, L1, L2, refcount table and blocks;
    # vmdk: header, descriptor, grain directories and tables), coalesced:
    # (image offset, length)
    metadata: list[tuple[int, int]] = field(default_factory=list)
    fmt: str = "qcow2"


def cluster_map(path: str, fmt: str) -> ClusterMap:
    """The map of the `fmt` image at `path` (one of MAPPED)."""
    if fmt == "qcow2":
        from .qcow2 import cluster_map as read
    elif fmt == "vmdk":
        from .vmdk import grain_map as read
    elif fmt == "vdi":
        from .vdi import block_map as read
    elif fmt == "vhdx":
        from .vhdx import bat_map as read
    elif fmt == "vpc":
        from .vpc import bat_map as read
    else:
        raise ImageMapError(f"{path}: a {fmt} image: nestrace follows guest offsets into "
                            f"{FOLLOWED} images only")
    return read(path)


def read_file(path: str, read, error=ImageMapError) -> ClusterMap:
    """read(fd, path) on the file at path, opened read-only; a file that
    cannot be opened is `error`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise error(f"{path}: {e.strerror}") from None
    try:
        return read(fd, path)
    finally:
        os.close(fd)


def read_exact(fd: int, path: str, offset: int, n: int, error=ImageMapError) -> bytes:
    """n bytes at offset, or `error` naming the file and the offset."""
    b = os.pread(fd, n, offset)
    if len(b) != n:
        raise error(f"{path}: offset {offset}: {n} bytes expected, the file ends "
                    f"after {len(b)}")
    return b


def add_run(extents: list[list[int]], guest: int, host: int, n: int) -> None:
    """Append a cluster to the extents, joined to the last one where it is
    contiguous with it both on the disk and in the file."""
    last = extents[-1] if extents else None
    if last and last[0] + last[2] == guest and last[1] + last[2] == host:
        last[2] += n
    else:
        extents.append([guest, host, n])


def coalesce(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges sorted, overlapping and touching ones joined,
    empty ones dropped."""
    merged: list[list[int]] = []
    for off, n in sorted(r for r in ranges if r[1]):
        if merged and off <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], off + n - merged[-1][0])
        else:
            merged.append([off, n])
    return [tuple(x) for x in merged]
