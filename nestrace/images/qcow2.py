"""Where a qcow2 image keeps each guest byte: its cluster map (the L1 and
L2 tables), read from the file as it is on disk.

A qcow2 image is not laid out like the disk it holds: the hypervisor
allocates a cluster of the file the first time the guest writes to a
cluster of its disk, wherever the file ends then.  The map read here is
what carries a virtual-disk offset to an image-file offset; extents are
runs of clusters contiguous in both.  Clusters that are unallocated, all
zeros (read as zeros, with no access to the file) or compressed have no
place a guest byte can be read from directly, and are left out (counted)."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from nestrace.images.base import (
    ClusterMap,
    ImageMapError,
    add_run,
    coalesce,
    read_exact,
    read_file,
)

MAGIC = b"QFI\xfb"
OFFSET_MASK = 0x00FF_FFFF_FFFF_FE00      # bits 9-55 of an L1 or L2 entry
COMPRESSED = 1 << 62
ZERO = 1                                 # version 3: the cluster reads as zeros
INCOMPAT_DIRTY, INCOMPAT_CORRUPT, INCOMPAT_DATA_FILE, INCOMPAT_EXTL2 = 1, 2, 4, 16
EXT_END, EXT_BACKING_FORMAT = 0, 0xE2792ACA   # header extension types


class Qcow2Error(ImageMapError):
    pass


def _read(fd: int, path: str, offset: int, n: int) -> bytes:
    return read_exact(fd, path, offset, n, Qcow2Error)


def cluster_map(path: str) -> ClusterMap:
    """Read the cluster map of the qcow2 image at `path`."""
    return read_file(path, _cluster_map, Qcow2Error)


def _cluster_map(fd: int, path: str) -> ClusterMap:
    h = _read(fd, path, 0, 72)
    if h[:4] != MAGIC:
        raise Qcow2Error(f"{path}: offset 0: not a qcow2 image (magic {h[:4].hex()})")
    (version, backing_off, backing_len, cluster_bits, size, _crypt, l1_size, l1_off,
     rc_off, rc_clusters) = struct.unpack(">IQIIQIIQQI", h[4:60])
    if version not in (2, 3):
        raise Qcow2Error(f"{path}: offset 4: qcow2 version {version} (2 and 3 are read)")
    if not 9 <= cluster_bits <= 21:
        raise Qcow2Error(f"{path}: offset 20: cluster_bits {cluster_bits} out of 9..21")
    incompat, header_bytes = 0, 72
    if version == 3:
        incompat, = struct.unpack(">Q", _read(fd, path, 72, 8))
        header_bytes, = struct.unpack(">I", _read(fd, path, 100, 4))
    if incompat & INCOMPAT_DATA_FILE:
        raise Qcow2Error(f"{path}: offset 72: the guest's data is in an external data file, "
                         "not in this image")
    if incompat & INCOMPAT_EXTL2:
        raise Qcow2Error(f"{path}: offset 72: extended L2 entries (subclusters) are not read")
    cs = 1 << cluster_bits
    backing = _read(fd, path, backing_off, backing_len).decode(errors="replace") \
        if backing_off and backing_len else ""
    backing_fmt = _backing_format(fd, path, header_bytes, cs) if backing else ""
    l2_entries = cs // 8
    need = -(-size // (cs * l2_entries))
    if l1_size < need:
        raise Qcow2Error(f"{path}: offset 36: L1 table of {l1_size} entries for a "
                         f"{size}-byte disk (needs {need})")
    l1 = struct.unpack(f">{l1_size}Q", _read(fd, path, l1_off, 8 * l1_size)) if l1_size else ()
    t = walk_tables(fd, path, l1, l1_off, l2_entries, cs, size, Qcow2Error, l1_mask=OFFSET_MASK,
                    l1_align=cs, l2_mask=OFFSET_MASK, compressed=COMPRESSED,
                    zero=ZERO if version == 3 else 0)
    meta = [(0, cs), (l1_off, 8 * l1_size), (rc_off, rc_clusters * cs), *t.tables]
    # the refcount blocks the refcount table points to are metadata too
    if rc_clusters:
        rct = struct.unpack(f">{rc_clusters * cs // 8}Q", _read(fd, path, rc_off, rc_clusters * cs))
        meta += [(o & ~(cs - 1), cs) for o in rct if o]
    return ClusterMap(path=path, version=version, cluster_bytes=cs, virtual_bytes=size,
                      extents=t.extents, zero_clusters=t.zeros,
                      compressed_clusters=t.compressed, backing_file=backing,
                      backing_format=backing_fmt, dirty=bool(incompat & INCOMPAT_DIRTY),
                      metadata=coalesce(meta), opaque=coalesce(t.opaque))


@dataclass
class Tables:
    """What an L1 table and its L2 tables say: the disk's clusters with a
    place in the file (extents), the zero and compressed ones (opaque,
    counted) and where the L2 tables are (tables: offset, length)."""
    extents: list[tuple[int, int, int]] = field(default_factory=list)
    opaque: list[tuple[int, int]] = field(default_factory=list)
    tables: list[tuple[int, int]] = field(default_factory=list)
    zeros: int = 0
    compressed: int = 0


def walk_tables(fd: int, path: str, l1: tuple[int, ...], l1_off: int, l2_entries: int, cs: int,
                size: int, error, *, l1_mask: int, l1_align: int, l2_mask: int,
                compressed: int, zero: int) -> Tables:
    """Follow the L1 entries (an L2 table's offset under l1_mask, 0: none,
    on an l1_align boundary) to their L2 tables (l2_entries entries: a
    cluster's offset under l2_mask, on a cluster boundary; 0 unallocated;
    the `compressed` and `zero` bits, where the format has them)."""
    t = Tables()
    extents: list[list[int]] = []
    for i, e1 in enumerate(l1):
        l2_off = e1 & l1_mask
        if not l2_off:
            continue
        if l2_off % l1_align:
            raise error(f"{path}: offset {l1_off + 8 * i}: L1 entry {i} points to "
                        f"{l2_off}, not a {'cluster' if l1_align == cs else 'sector'} boundary")
        t.tables.append((l2_off, 8 * l2_entries))
        l2 = struct.unpack(f">{l2_entries}Q", read_exact(fd, path, l2_off, 8 * l2_entries, error))
        for j, e2 in enumerate(l2):
            guest = (i * l2_entries + j) * cs
            if guest >= size or not e2:
                continue
            n = min(cs, size - guest)
            if e2 & compressed:
                t.compressed += 1
                t.opaque.append((guest, n))
                continue
            if e2 & zero:
                t.zeros += 1
                t.opaque.append((guest, n))
                continue
            host = e2 & l2_mask
            if not host:
                continue
            if host % cs:
                raise error(f"{path}: offset {l2_off + 8 * j}: L2 entry for guest "
                            f"offset {guest} points to {host}, not a cluster boundary")
            add_run(extents, guest, host, n)
    t.extents = [tuple(x) for x in extents]
    return t


def _backing_format(fd: int, path: str, offset: int, cs: int) -> str:
    """The backing file's format from the header extensions (after the
    header, in its first cluster); "" when the image does not say."""
    while offset + 8 <= cs:
        kind, n = struct.unpack(">II", _read(fd, path, offset, 8))
        if kind == EXT_END:
            return ""
        if kind == EXT_BACKING_FORMAT:
            return _read(fd, path, offset + 8, n).decode(errors="replace").rstrip("\0")
        offset += 8 + (n + 7) // 8 * 8
    return ""
