"""Where a dynamic VHD (Virtual PC's and Hyper-V's first format; QEMU's
`vpc`) keeps each guest byte: its block allocation table, read from the
file as it is on disk.

A dynamic VHD starts with a copy of its 512-byte footer (cookie
"conectix", big-endian fields), which points at a 1 KiB dynamic disk
header ("cxsparse"), which points at the block allocation table (BAT).
The disk is cut in blocks (2 MiB by default); a BAT entry is the sector
where the block's sector bitmap starts, its data right after the bitmap,
or 0xFFFFFFFF for a block never written (read as zeros).  A block is
allocated where the file ends, and the footer written again after it.
QEMU sets every bit of a new block's bitmap and reads an allocated block
whole, so the map does not look at the bitmaps' bits.  A fixed VHD is a
raw image with a footer at its end (no copy at its start): not this."""
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

FOOTER = struct.Struct(">8sIIQI4sI4sQQHBBII16sB")     # to saved_state; 427 bytes reserved
DYNAMIC = struct.Struct(">8sQQIIII")                  # to its checksum; parent fields follow
FOOTER_BYTES, DYNAMIC_BYTES = 512, 1024
UNALLOCATED = 0xFFFFFFFF
FIXED, DYNAMIC_DISK, DIFFERENCING = 2, 3, 4
# creators whose disk size is the footer's current size, not its geometry
# (QEMU's vpc driver reads the sizes the same way)
SIZE_FROM_FOOTER = (b"win ", b"qem2", b"d2v ", b"CTXS", b"tap\0")
MAX_GEOMETRY = 65535 * 16 * 255


class VpcError(ImageMapError):
    pass


def checksum(block: bytes, at: int) -> int:
    """The one's complement of the sum of a footer's or header's bytes,
    its own 4-byte checksum field (at `at`) left out."""
    return ~(sum(block) - sum(block[at:at + 4])) & 0xFFFFFFFF


def bat_map(path: str) -> ClusterMap:
    """Read the block allocation table of the dynamic VHD at `path`."""
    return read_file(path, _bat_map, VpcError)


def _bat_map(fd: int, path: str) -> ClusterMap:
    file_bytes = os.fstat(fd).st_size
    raw = read_exact(fd, path, 0, FOOTER_BYTES, VpcError)
    (cookie, _features, _version, dyn_off, _ts, creator, _cver, _os, _orig, current, cyls,
     heads, secs, disk_type, csum, _uuid, _saved) = FOOTER.unpack_from(raw)
    if cookie != b"conectix":
        raise VpcError(f"{path}: offset 0: not a dynamic VHD (cookie {cookie!r}; a fixed VHD "
                       "keeps its footer only at its end and is a raw image)")
    if checksum(raw, 64) != csum:
        raise VpcError(f"{path}: offset 64: footer checksum {csum:#x}, its bytes sum to "
                       f"{checksum(raw, 64):#x}")
    if disk_type != DYNAMIC_DISK:
        what = {FIXED: "fixed", DIFFERENCING: "differencing"}.get(disk_type, "unknown")
        raise VpcError(f"{path}: offset 60: disk type {disk_type} ({what}; 3, dynamic, is read)")
    hdr = read_exact(fd, path, dyn_off, DYNAMIC_BYTES, VpcError)
    cookie, _data_off, bat_off, hversion, entries, block, hcsum = DYNAMIC.unpack_from(hdr)
    if cookie != b"cxsparse":
        raise VpcError(f"{path}: offset {dyn_off}: no dynamic disk header (cookie {cookie!r})")
    if checksum(hdr, 36) != hcsum:
        raise VpcError(f"{path}: offset {dyn_off + 36}: dynamic disk header checksum "
                       f"{hcsum:#x}, its bytes sum to {checksum(hdr, 36):#x}")
    if hversion >> 16 != 1:
        raise VpcError(f"{path}: offset {dyn_off + 24}: dynamic disk header version "
                       f"{hversion >> 16}.{hversion & 0xFFFF} (1.x is read)")
    if not block or block % 512:
        raise VpcError(f"{path}: offset {dyn_off + 32}: block size {block} (a multiple of 512 "
                       "is read)")
    # the disk's size as QEMU takes it: from the geometry, but for the
    # creators that write the footer's size (and a disk at the largest geometry)
    size = cyls * heads * secs * 512
    if creator in SIZE_FROM_FOOTER or cyls * heads * secs == MAX_GEOMETRY:
        size = current
    if entries * block < size:
        raise VpcError(f"{path}: offset {dyn_off + 28}: {entries} blocks of {block} bytes for "
                       f"a {size}-byte disk")
    bitmap = (block // (8 * 512) + 511) & ~511
    bat = struct.unpack(f">{entries}I", read_exact(fd, path, bat_off, 4 * entries, VpcError))
    extents: list[list[int]] = []
    metadata = [(0, FOOTER_BYTES), (dyn_off, DYNAMIC_BYTES), (bat_off, 4 * entries),
                (file_bytes - FOOTER_BYTES, FOOTER_BYTES)]
    for i, e in enumerate(bat):
        guest = i * block
        if e == UNALLOCATED or guest >= size:
            continue
        at = e * 512
        if at + bitmap + block > file_bytes:
            raise VpcError(f"{path}: offset {bat_off + 4 * i}: block {i} at byte {at} ends "
                           f"past the file's {file_bytes} bytes")
        metadata.append((at, bitmap))
        add_run(extents, guest, at + bitmap, min(block, size - guest))
    return ClusterMap(path=path, version=hversion >> 16, cluster_bytes=block, virtual_bytes=size,
                      extents=[tuple(x) for x in extents], metadata=coalesce(metadata), fmt="vpc")
