"""Where an image in QEMU's first qcow format (version 1, QEMU's `qcow`)
keeps each guest byte: its two levels of tables, read from the file as it
is on disk.

A qcow image starts with a 48-byte header (magic "QFI\\xfb", version 1,
big-endian fields): the disk's size, the cluster size (2^cluster_bits
bytes), the number of entries of an L2 table (2^l2_bits), where the L1
table is, and the backing file's name, if any.  An L1 entry is where an
L2 table is in the file (0: none); an L2 entry is where a cluster of the
disk is (0: unallocated, read from the backing file or as zeros; the top
bit set: a compressed cluster, with no place a guest byte can be read
from directly).  QEMU allocates an L2 table (on a sector boundary) and a
cluster (on a cluster boundary) where the file ends, the first time the
guest writes there.  Unlike qcow2 there are no refcounts, no zero
clusters and no header extensions: the backing file's format is found
by its first bytes."""
from __future__ import annotations

import struct

from nestrace.images.base import (
    ClusterMap,
    ImageMapError,
    coalesce,
    read_exact,
    read_file,
)
from nestrace.images.qcow2 import walk_tables

MAGIC = b"QFI\xfb"
HEADER = struct.Struct(">4sIQIIQBBHIQ")     # magic .. l1_table_offset: 48 bytes
COMPRESSED = 1 << 63
CRYPT_NONE = 0


class QcowError(ImageMapError):
    pass


def table_map(path: str) -> ClusterMap:
    """Read the L1 and L2 tables of the qcow (version 1) image at `path`."""
    return read_file(path, _table_map, QcowError)


def _read(fd: int, path: str, offset: int, n: int) -> bytes:
    return read_exact(fd, path, offset, n, QcowError)


def _table_map(fd: int, path: str) -> ClusterMap:
    (magic, version, backing_off, backing_len, _mtime, size, cluster_bits, l2_bits, _pad, crypt,
     l1_off) = HEADER.unpack(_read(fd, path, 0, HEADER.size))
    if magic != MAGIC:
        raise QcowError(f"{path}: offset 0: not a qcow image (magic {magic.hex()})")
    if version != 1:
        raise QcowError(f"{path}: offset 4: qcow version {version} (1 is read here; 2 and 3 "
                        "are qcow2)")
    # (QEMU's own limits)
    if not 9 <= cluster_bits <= 16:
        raise QcowError(f"{path}: offset 32: cluster_bits {cluster_bits} out of 9..16")
    if not 6 <= l2_bits <= 16:
        raise QcowError(f"{path}: offset 33: l2_bits {l2_bits} out of 6..16")
    if crypt != CRYPT_NONE:
        raise QcowError(f"{path}: offset 36: encrypted (method {crypt}): its clusters are not "
                        "the guest's bytes")
    if backing_len > 1023:
        raise QcowError(f"{path}: offset 16: a backing file name of {backing_len} bytes "
                        "(QEMU reads up to 1023)")
    cs, l2_entries = 1 << cluster_bits, 1 << l2_bits
    backing = _read(fd, path, backing_off, backing_len).decode(errors="replace") \
        if backing_off and backing_len else ""
    l1_size = -(-size // (cs * l2_entries))
    l1 = struct.unpack(f">{l1_size}Q", _read(fd, path, l1_off, 8 * l1_size)) if l1_size else ()
    # (L2 tables on a sector boundary: QEMU puts a new one where the file ends)
    t = walk_tables(fd, path, l1, l1_off, l2_entries, cs, size, QcowError, l1_mask=~0,
                    l1_align=512, l2_mask=~COMPRESSED, compressed=COMPRESSED, zero=0)
    meta = [(0, HEADER.size), (backing_off, backing_len), (l1_off, 8 * l1_size), *t.tables]
    return ClusterMap(path=path, version=version, cluster_bytes=cs, virtual_bytes=size,
                      extents=t.extents, compressed_clusters=t.compressed,
                      backing_file=backing, metadata=coalesce(meta), fmt="qcow",
                      opaque=coalesce(t.opaque))
