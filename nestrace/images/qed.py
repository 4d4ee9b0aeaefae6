"""Where a QED image (QEMU Enhanced Disk) keeps each guest byte: its L1 and
L2 tables, read from the file as it is on disk.

A QED file is cut in clusters (64 KiB by default).  The header
(little-endian) says the cluster size, the size of a table in clusters
(4 by default), where the L1 table is and how big the disk is; an L1
entry points to an L2 table, an L2 entry to the cluster that holds that
part of the disk.  QEMU allocates a cluster (and an L2 table) where the
file ends the first time the guest writes there.  An L2 entry of 0 is
unallocated (the backing file's, or zeros), 1 a zero cluster (zeros: the
backing file is not read there).  A backing file is named in the header;
a header bit says it is raw, else QEMU probes its format."""
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

MAGIC = b"QED\0"
HEADER = struct.Struct("<4sIIIQQQQQII")
F_BACKING_FILE, F_NEED_CHECK, F_BACKING_FORMAT_NO_PROBE = 1, 2, 4
KNOWN_FEATURES = F_BACKING_FILE | F_NEED_CHECK | F_BACKING_FORMAT_NO_PROBE
ZERO = 1                                 # an L2 entry: the cluster reads as zeros


class QedError(ImageMapError):
    pass


def table_map(path: str) -> ClusterMap:
    """Read the cluster map of the QED image at `path`."""
    return read_file(path, _table_map, QedError)


def _power_of_2(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def _table_map(fd: int, path: str) -> ClusterMap:
    def read(offset: int, n: int) -> bytes:
        return read_exact(fd, path, offset, n, QedError)

    (magic, cs, table_clusters, header_clusters, features, _compat, _autoclear, l1_off, size,
     backing_off, backing_len) = HEADER.unpack(read(0, HEADER.size))
    if magic != MAGIC:
        raise QedError(f"{path}: offset 0: not a qed image (magic {magic.hex()})")
    if not _power_of_2(cs) or not 1 << 12 <= cs <= 1 << 26:
        raise QedError(f"{path}: offset 4: cluster size {cs} (a power of 2 from 4 KiB to "
                       "64 MiB is read)")
    if not _power_of_2(table_clusters) or table_clusters > 16:
        raise QedError(f"{path}: offset 8: table size {table_clusters} clusters (a power "
                       "of 2 up to 16 is read)")
    if features & ~KNOWN_FEATURES:
        raise QedError(f"{path}: offset 16: unknown feature bits "
                       f"{features & ~KNOWN_FEATURES:#x}: the image must not be opened")
    if l1_off % cs or not l1_off:
        raise QedError(f"{path}: offset 40: L1 table at {l1_off}, not a cluster boundary")
    entries = table_clusters * cs // 8
    if size % 512 or size > entries * entries * cs:
        raise QedError(f"{path}: offset 48: a {size}-byte disk (a multiple of 512 the "
                       f"tables can hold, {entries * entries * cs} bytes at most)")
    backing = ""
    if features & F_BACKING_FILE:
        if backing_off + backing_len > max(header_clusters, 1) * cs:
            raise QedError(f"{path}: offset 56: backing file name at {backing_off} "
                           f"({backing_len} bytes) is past the header's "
                           f"{header_clusters} clusters")
        backing = read(backing_off, backing_len).decode(errors="replace")
    table = table_clusters * cs
    l1 = struct.unpack(f"<{entries}Q", read(l1_off, table))
    meta = [(0, max(header_clusters, 1) * cs), (l1_off, table)]
    extents: list[list[int]] = []
    opaque: list[tuple[int, int]] = []    # zero clusters
    zeros = 0
    span = entries * cs                   # disk bytes under one L2 table
    for i, l2_off in enumerate(l1):
        if not l2_off or i * span >= size:
            continue
        if l2_off % cs:
            raise QedError(f"{path}: offset {l1_off + 8 * i}: L1 entry {i} points to "
                           f"{l2_off}, not a cluster boundary")
        meta.append((l2_off, table))
        l2 = struct.unpack(f"<{entries}Q", read(l2_off, table))
        for j, e in enumerate(l2):
            if not e:
                continue
            guest = i * span + j * cs
            if guest >= size:
                break
            n = min(cs, size - guest)
            if e == ZERO:
                zeros += 1
                opaque.append((guest, n))
            elif e % cs:
                raise QedError(f"{path}: offset {l2_off + 8 * j}: L2 entry for guest offset "
                               f"{guest} points to {e}, not a cluster boundary")
            else:
                add_run(extents, guest, e, n)
    return ClusterMap(path=path, version=1, cluster_bytes=cs, virtual_bytes=size,
                      extents=[tuple(x) for x in extents], zero_clusters=zeros,
                      backing_file=backing,
                      backing_format="raw" if features & F_BACKING_FORMAT_NO_PROBE and backing
                      else "",
                      dirty=bool(features & F_NEED_CHECK), metadata=coalesce(meta), fmt="qed",
                      opaque=coalesce(opaque))
