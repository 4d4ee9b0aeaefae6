"""Where a VirtualBox vdi image keeps each guest byte: its block map, read
from the file as it is on disk.

A vdi starts with a text line, the signature 0xbeda107f at byte 64 and a
header (little-endian) that says where the block map and the data are.
The disk is cut in blocks (1 MiB by default); the block map holds, per
block, its index among the data blocks in the file, which a dynamic image
allocates in the order the guest first writes them, where the file ends
then.  A block never written, or discarded (read as zeros), has no place
in the file and is left out (counted as zero for a discarded one)."""
from __future__ import annotations

import struct

from nestrace.images.base import (
    ClusterMap,
    ImageMapError,
    add_run,
    coalesce,
    read_exact,
    read_file,
)

SIGNATURE = 0xBEDA107F
SIGNATURE_AT = 0x40
HEADER = struct.Struct("<IIIII256sIIIIIIIQIIII")   # from the signature to blocks_allocated
UNALLOCATED, DISCARDED = 0xFFFFFFFF, 0xFFFFFFFE


class VdiError(ImageMapError):
    pass


def is_vdi(head: bytes) -> bool:
    """Whether a file's first bytes (at least 68) are a vdi's."""
    return len(head) >= SIGNATURE_AT + 4 and struct.unpack_from(
        "<I", head, SIGNATURE_AT)[0] == SIGNATURE


def block_map(path: str) -> ClusterMap:
    """Read the block map of the vdi image at `path`."""
    return read_file(path, _block_map, VdiError)


def _block_map(fd: int, path: str) -> ClusterMap:
    h = read_exact(fd, path, SIGNATURE_AT, HEADER.size, VdiError)
    (sig, version, _hsize, image_type, _flags, _desc, bmap_off, data_off, _cyl, _heads, _secs,
     sector_size, _unused, size, block, extra, n_blocks, _allocated) = HEADER.unpack(h)
    if sig != SIGNATURE:
        raise VdiError(f"{path}: offset {SIGNATURE_AT}: not a vdi image (signature {sig:#x})")
    if version >> 16 != 1:
        raise VdiError(f"{path}: offset {SIGNATURE_AT + 4}: vdi version {version >> 16}."
                       f"{version & 0xFFFF} (1.x is read)")
    if image_type not in (1, 2):
        raise VdiError(f"{path}: offset {SIGNATURE_AT + 12}: vdi image type {image_type} "
                       "(1 dynamic and 2 static are read)")
    if not block or block % 512 or extra:
        raise VdiError(f"{path}: offset 376: block size {block} with {extra} extra bytes "
                       "(a multiple of 512 with none extra is read)")
    if n_blocks * block < size:
        raise VdiError(f"{path}: offset 384: {n_blocks} blocks of {block} bytes for a "
                       f"{size}-byte disk")
    bmap = struct.unpack(f"<{n_blocks}I", read_exact(fd, path, bmap_off, 4 * n_blocks, VdiError))
    extents: list[list[int]] = []
    zeros = 0
    for i, e in enumerate(bmap):
        guest = i * block
        if guest >= size or e == UNALLOCATED:
            continue
        if e == DISCARDED:
            zeros += 1
            continue
        if e >= n_blocks:
            raise VdiError(f"{path}: offset {bmap_off + 4 * i}: block {i} is data block {e} "
                           f"of {n_blocks}")
        add_run(extents, guest, data_off + e * block, min(block, size - guest))
    return ClusterMap(path=path, version=version >> 16, cluster_bytes=block, virtual_bytes=size,
                      extents=[tuple(x) for x in extents], zero_clusters=zeros,
                      metadata=coalesce([(0, SIGNATURE_AT + HEADER.size),
                                         (bmap_off, 4 * n_blocks)]), fmt="vdi")
