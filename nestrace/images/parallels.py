"""Where a Parallels expandable image (QEMU's `parallels`; Parallels
Desktop's and Virtuozzo's .hdd/.hds) keeps each guest byte: its block
allocation table, read from the file as it is on disk.

A Parallels image is a 64-byte header (magic "WithoutFreeSpace" or
"WithouFreSpacExt", little-endian fields), the block allocation table
(BAT) right after it, then the data area.  The disk is cut in clusters
(`tracks` sectors; 1 MiB by QEMU's default); a BAT entry is where the
cluster is in the file, in sectors ("WithoutFreeSpace") or in clusters
("WithouFreSpacExt"), or 0 for a cluster never written (read as zeros).
A cluster is allocated where the data area ends, in the order the guest
first writes the clusters.  QEMU writes a new cluster's BAT entry when
the guest flushes (and when it closes the image), so a map read while
the image is open can lack the clusters allocated since the guest's last
flush; an image open for writing, or not closed cleanly, has `in_use`
set (the map's `dirty`)."""
from __future__ import annotations

import os
import struct

from nestrace.images.base import (
    ClusterMap,
    ImageMapError,
    add_run,
    coalesce,
    read_exact,
    read_file,
)

HEADER = struct.Struct("<16sIIIIIQIIIQ")   # magic .. ext_off: 64 bytes
MAGIC_SECTORS, MAGIC_CLUSTERS = b"WithoutFreeSpace", b"WithouFreSpacExt"
IN_USE = 0x746F6E59


class ParallelsError(ImageMapError):
    pass


def bat_map(path: str) -> ClusterMap:
    """Read the block allocation table of the Parallels image at `path`."""
    return read_file(path, _bat_map, ParallelsError)


def _bat_map(fd: int, path: str) -> ClusterMap:
    file_bytes = os.fstat(fd).st_size
    # (flags: bit 0 says "take the image as empty"; QEMU reads the BAT as it is, and so
    # does this)
    (magic, version, _heads, _cyls, tracks, entries, sectors, in_use, data_off, _flags,
     ext_off) = HEADER.unpack(read_exact(fd, path, 0, HEADER.size, ParallelsError))
    if magic not in (MAGIC_SECTORS, MAGIC_CLUSTERS):
        raise ParallelsError(f"{path}: offset 0: not a Parallels image (magic {magic!r})")
    if version != 2:
        raise ParallelsError(f"{path}: offset 16: Parallels version {version} (2 is read)")
    if not tracks:
        raise ParallelsError(f"{path}: offset 28: a cluster of 0 sectors")
    cluster = tracks * 512
    unit = 512 if magic == MAGIC_SECTORS else cluster
    # (the old magic keeps the disk's size in the low 4 bytes only, as QEMU reads it)
    size = (sectors & 0xFFFFFFFF if magic == MAGIC_SECTORS else sectors) * 512
    bat_off = HEADER.size
    bat = struct.unpack(f"<{entries}I",
                        read_exact(fd, path, bat_off, 4 * entries, ParallelsError))
    # the data area starts at data_off sectors, or (0, the old magic only) after the BAT
    data_start = data_off * 512 or -(-(bat_off + 4 * entries) // 512) * 512
    extents: list[list[int]] = []
    seen: dict[int, int] = {}
    # (a cluster past the BAT's end, or past the disk's, is read as zeros)
    for i, e in enumerate(bat[:-(-size // cluster)]):
        if not e:
            continue
        at = e * unit
        where = bat_off + 4 * i
        if at < data_start or at >= file_bytes:
            raise ParallelsError(f"{path}: offset {where}: cluster {i} at byte {at}, outside "
                                 f"the data area (bytes {data_start} to {file_bytes})")
        if at in seen:
            raise ParallelsError(f"{path}: offset {where}: cluster {i} at byte {at}, where "
                                 f"cluster {seen[at]} is too")
        seen[at] = i
        add_run(extents, i * cluster, at, min(cluster, size - i * cluster))
    # the header, the BAT and the padding up to the data area (QEMU writes the
    # BAT back in pieces of up to 16 KiB from the file's start)
    metadata = [(0, max(data_start, bat_off + 4 * entries))]
    if ext_off:
        metadata.append((ext_off * 512, cluster))
    return ClusterMap(path=path, version=version, cluster_bytes=cluster, virtual_bytes=size,
                      extents=[tuple(x) for x in extents], dirty=in_use == IN_USE,
                      metadata=coalesce(metadata), fmt="parallels")
