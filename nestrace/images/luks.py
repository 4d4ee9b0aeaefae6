"""Where a LUKS image (QEMU's `luks` format: a disk encrypted sector by
sector) keeps each guest byte: after its header and key material, in
disk order.

A LUKS (version 1) header (big-endian) says where the encrypted payload
starts, in 512-byte sectors; the disk is the rest of the file, each of
its bytes at its offset plus that start.  Nothing is allocated: the map
never changes.  The header and the key slots before the payload are the
image's own (QEMU reads them when it opens the image)."""
from __future__ import annotations

import os
import struct

from nestrace.images.base import ClusterMap, ImageMapError, read_exact, read_file

MAGIC = b"LUKS\xba\xbe"
PAYLOAD_AT = 104            # payload offset (sectors), after magic, version, cipher, mode, hash
HEADER_BYTES = 592          # through the eight key slots


class LuksError(ImageMapError):
    pass


def header_map(path: str) -> ClusterMap:
    """Read where the payload of the LUKS image at `path` is."""
    return read_file(path, _header_map, LuksError)


def _header_map(fd: int, path: str) -> ClusterMap:
    h = read_exact(fd, path, 0, HEADER_BYTES, LuksError)
    if h[:6] != MAGIC:
        raise LuksError(f"{path}: offset 0: not a LUKS image (magic {h[:6].hex()})")
    version, = struct.unpack_from(">H", h, 6)
    if version != 1:
        raise LuksError(f"{path}: offset 6: LUKS version {version} (1 is read)")
    payload = struct.unpack_from(">I", h, PAYLOAD_AT)[0] * 512
    size = os.fstat(fd).st_size
    if payload < HEADER_BYTES or payload > size:
        raise LuksError(f"{path}: offset {PAYLOAD_AT}: payload at {payload} bytes, outside "
                        f"the {size}-byte file past its header")
    disk = (size - payload) // 512 * 512
    # (cluster_bytes 0: nothing is ever allocated, no write is cut in clusters)
    return ClusterMap(path=path, version=version, cluster_bytes=0, virtual_bytes=disk,
                      extents=[(0, payload, disk)] if disk else [],
                      metadata=[(0, payload)], fmt="luks")
