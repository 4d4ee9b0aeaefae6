"""What every image format's reader shares: the map's shape (`ClusterMap`),
its error, and reading a file's bytes by offset with every length checked
against the file."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

# image formats whose map nestrace reads (stack.image_format's names)
MAPPED = ("qcow2", "qcow", "vmdk", "vdi", "vhdx", "vpc", "qed", "parallels", "luks")
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
    backing_format: str = ""                  # as the image names it ("": not named)
    dirty: bool = False
    # the image's own tables (header, L1, L2, refcount table and blocks;
    # vmdk: header, descriptor, grain directories and tables), coalesced:
    # (image offset, length)
    metadata: list[tuple[int, int]] = field(default_factory=list)
    fmt: str = "qcow2"
    # disk ranges the image answers itself with no place in the file
    # (qcow2's zero and compressed clusters): its backing file is not read there
    opaque: list[tuple[int, int]] = field(default_factory=list)


def open_noatime(path: str, flags: int = os.O_RDONLY) -> int:
    """os.open without touching the file's access time (O_NOATIME: root's
    by CAP_FOWNER; without it where refused, EPERM).  A read of a file
    changed since it was last read sets its atime (relatime), and its file
    system writes the inode back later, inside the capture: nestrace reads
    the traced stack's directories and image headers at each snapshot."""
    flags |= os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_NOATIME)
    except PermissionError:
        return os.open(path, flags)


def read_file(path: str, read, error=ImageMapError) -> ClusterMap:
    """read(fd, path) on the file at path, opened read-only (atime left
    alone); a file that cannot be opened is `error`."""
    try:
        fd = open_noatime(path)
    except OSError as e:
        raise error(f"{path}: {e.strerror}") from None
    try:
        return read(fd, path)
    finally:
        os.close(fd)


def read_exact(fd: int, path: str, offset: int, n: int, error=ImageMapError) -> bytes:
    """n bytes at offset, or `error` naming the file and the offset.  (A
    damaged table can give any offset or length: they are checked against
    the file's size first, not handed to pread, which overflows past 2**63
    and allocates n bytes before reading.)"""
    size = os.fstat(fd).st_size
    if offset < 0 or n < 0 or offset + n > size:
        raise error(f"{path}: offset {offset}: {n} bytes expected, the file ends "
                    f"after {max(0, min(n, size - offset))}")
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
