"""Where a VMware hosted sparse vmdk keeps each guest byte: its grain map
(the grain directory and grain tables), read from the file as it is on
disk.

A one-file sparse vmdk (createType monolithicSparse, what `qemu-img create
-f vmdk` makes and VMware Workstation's default) starts with a header
(magic KDMV, little-endian), holds its text descriptor, a grain directory
(and a redundant copy), and grain tables; a grain (64 KiB by default) of
the file is allocated the first time the guest writes that grain of its
disk, where the file ends then.  Grains never written, zeroed grains
(read as zeros without the file) and compressed grains (streamOptimized)
have no place a guest byte can be read from directly, and are left out
(counted).  A disk may name a parent (`parentFileNameHint`: a VMware
snapshot, or `qemu-img create -f vmdk -b`): grains never written are read
from it, but zeroed and compressed grains hide it (`ClusterMap.opaque`).

A disk whose descriptor is a file of its own (monolithicFlat,
twoGbMaxExtentSparse and twoGbMaxExtentFlat: VMware Workstation's "split
into 2 GB files") is read through it (`split_disk`): the descriptor names
the extent files in disk order, each holding the next stretch of the disk:
a SPARSE extent is a sparse extent file of its own (header and grain
tables, no descriptor), a FLAT one a raw file from a given offset, a ZERO
one reads as zeros.  Not read: ESX's VMFSSPARSE and SESPARSE extents."""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

from nestrace.images.base import (
    ClusterMap,
    ImageMapError,
    add_run,
    coalesce,
    open_noatime,
    read_exact,
    read_file,
)

MAGIC = b"KDMV"
DESCRIPTOR_MAGIC = b"# Disk DescriptorFile"
HEADER = struct.Struct("<4sIIQQQQIQQQ?4sH")     # SparseExtentHeader, 79 bytes
FLAG_RGD, FLAG_ZERO_GRAIN, FLAG_COMPRESSED = 1 << 1, 1 << 2, 1 << 16
GD_AT_END = (1 << 64) - 1
GTE_ZEROED = 1
SECTOR = 512
# an extent line of a descriptor: access, size in sectors, type, "file", offset
EXTENT_LINE = re.compile(r'^\s*(RW|RDONLY|NOACCESS)\s+(\d+)\s+(\w+)(?:\s+"([^"]*)"(?:\s+(\d+))?)?',
                         re.M)
PARENT = re.compile(r'^\s*parentFileNameHint\s*=\s*"([^"]*)"', re.M)


class VmdkError(ImageMapError):
    pass


def _read(fd: int, path: str, offset: int, n: int) -> bytes:
    return read_exact(fd, path, offset, n, VmdkError)


def grain_map(path: str) -> ClusterMap:
    """Read the grain map of the one-file sparse vmdk at `path`."""
    return read_file(path, _grain_map, VmdkError)


def is_descriptor(path: str) -> bool:
    """Whether the file at `path` is a vmdk descriptor of its own."""
    try:
        with open(open_noatime(path), "rb") as f:
            return f.read(len(DESCRIPTOR_MAGIC)) == DESCRIPTOR_MAGIC
    except OSError:
        return False


@dataclass
class Part:
    """One extent file of a disk whose descriptor is a file of its own:
    its map in disk offsets (the disk's stretch it holds)."""
    path: str
    fmt: str                  # "vmdk": a sparse extent; "raw": a flat one
    map: ClusterMap


MAX_DESCRIPTOR = 1 << 20


def split_disk(path: str) -> tuple[ClusterMap, list[Part]]:
    """The disk described by the descriptor file at `path`: its own map
    (no extents: every byte is in an extent file; ZERO extents opaque; the
    whole file metadata; the parent it names) and its extent files, each
    with its map carried to disk offsets.  Extent files are named relative
    to the descriptor, as VMware and QEMU take them."""
    def read(fd: int, path: str) -> bytes:
        return os.pread(fd, MAX_DESCRIPTOR + 1, 0)
    raw = read_file(path, read, VmdkError)
    if len(raw) > MAX_DESCRIPTOR:
        raise VmdkError(f"{path}: offset {MAX_DESCRIPTOR}: a descriptor file longer than "
                        f"{MAX_DESCRIPTOR} bytes")
    text = raw.split(b"\0")[0].decode(errors="replace")
    ext = list(EXTENT_LINE.finditer(text))
    if not ext:
        raise VmdkError(f"{path}: offset 0: a vmdk descriptor that names no extent")
    parent = PARENT.search(text)
    size = sum(int(x.group(2)) for x in ext) * SECTOR
    parts: list[Part] = []
    zeros: list[tuple[int, int]] = []
    grain = 0
    at = 0
    for x in ext:   # (access, sectors, type, "file", offset in sectors)
        n, kind, name, off = int(x.group(2)) * SECTOR, x.group(3), x.group(4) or "", \
            int(x.group(5) or 0)
        where = f"{path}: offset {len(text[:x.start(1)].encode())}"
        f = name if os.path.isabs(name) else os.path.join(os.path.dirname(path), name)
        if kind == "ZERO":
            zeros.append((at, n))
        elif kind in ("FLAT", "VMFS"):
            parts.append(Part(f, "raw", ClusterMap(
                path=f, version=0, cluster_bytes=0, virtual_bytes=size,
                extents=[(at, off * SECTOR, n)], fmt="raw")))
        elif kind == "SPARSE":
            gm = read_file(f, lambda fd, p: _grain_map(fd, p, extent=True), VmdkError)
            if gm.virtual_bytes != n:
                raise VmdkError(f"{where}: extent {name} holds {gm.virtual_bytes} bytes, the "
                                f"descriptor gives it {n}")
            grain = grain or gm.cluster_bytes
            gm.extents = [(g + at, h, ln) for g, h, ln in gm.extents]
            gm.opaque = [(g + at, ln) for g, ln in gm.opaque]
            gm.virtual_bytes = size
            parts.append(Part(f, "vmdk", gm))
        else:
            raise VmdkError(f"{where}: a {kind} extent ({name}): nestrace reads SPARSE, FLAT "
                            "and ZERO extents")
        at += n
    desc = ClusterMap(path=path, version=1, cluster_bytes=grain, virtual_bytes=size, extents=[],
                      backing_file=parent.group(1) if parent else "",
                      metadata=[(0, len(raw))], fmt="vmdk", opaque=coalesce(zeros))
    return desc, parts


def descriptor_extents(text: str) -> list[tuple[str, int, str, str, int]]:
    """The extent lines of a vmdk descriptor: (access, sectors, type, file,
    offset in sectors)."""
    return [(a, int(n), t, f or "", int(o or 0)) for a, n, t, f, o in EXTENT_LINE.findall(text)]


def _grain_map(fd: int, path: str, extent: bool = False) -> ClusterMap:
    """extent: a SPARSE extent file of a disk whose descriptor is a file
    of its own (no descriptor inside; its parent is the descriptor's)."""
    h = _read(fd, path, 0, HEADER.size)
    if h.startswith(DESCRIPTOR_MAGIC[:4]) and os.pread(fd, len(DESCRIPTOR_MAGIC), 0) == \
            DESCRIPTOR_MAGIC:
        raise VmdkError(f"{path}: offset 0: a vmdk descriptor file, not a sparse extent: the "
                        "disk it describes is read through it (split_disk)")
    (magic, version, flags, capacity, grain, desc_off, desc_len, n_gtes, rgd_off, gd_off,
     _overhead, unclean, _nl, _compress_alg) = HEADER.unpack(h)
    if magic != MAGIC:
        raise VmdkError(f"{path}: offset 0: not a sparse vmdk (magic {magic.hex()})")
    if version not in (1, 2, 3):
        raise VmdkError(f"{path}: offset 4: vmdk sparse extent version {version} "
                        "(1 to 3 are read)")
    if not 1 <= grain <= 1 << 21:
        raise VmdkError(f"{path}: offset 20: grain of {grain} sectors out of 1..{1 << 21}")
    if not 1 <= n_gtes <= 512:
        raise VmdkError(f"{path}: offset 44: {n_gtes} entries per grain table out of 1..512")
    if gd_off == GD_AT_END:
        raise VmdkError(f"{path}: offset 56: the grain directory is at the file's end "
                        "(streamOptimized): its grains are compressed, with no place in the "
                        "file a guest byte is read from")
    text = _read(fd, path, desc_off * SECTOR, desc_len * SECTOR).split(b"\0")[0].decode(
        errors="replace") if desc_off and desc_len else ""
    ext = descriptor_extents(text)
    if not ext and not extent:
        raise VmdkError(f"{path}: offset 28: no descriptor in the file: an extent of a disk "
                        "whose descriptor is a file of its own (which says where on the disk "
                        "this extent starts): give the descriptor")
    if not extent and (len(ext) != 1 or ext[0][2] not in ("SPARSE", "VMFSSPARSE")):
        raise VmdkError(f"{path}: offset {desc_off * SECTOR}: the descriptor names "
                        f"{len(ext)} extents ({', '.join(e[2] for e in ext)}): a one-file "
                        "sparse disk has one SPARSE extent")
    parent = None if extent else PARENT.search(text)
    gs = grain * SECTOR
    size = capacity * SECTOR
    n_gd = -(-capacity // (n_gtes * grain))
    gd = struct.unpack(f"<{n_gd}I", _read(fd, path, gd_off * SECTOR, 4 * n_gd))
    meta = [(0, SECTOR), (desc_off * SECTOR, desc_len * SECTOR), (gd_off * SECTOR, 4 * n_gd)]
    if flags & FLAG_RGD and rgd_off:
        rgd = struct.unpack(f"<{n_gd}I", _read(fd, path, rgd_off * SECTOR, 4 * n_gd))
        meta.append((rgd_off * SECTOR, 4 * n_gd))
        meta += [(e * SECTOR, 4 * n_gtes) for e in rgd if e]
    extents: list[list[int]] = []
    opaque: list[tuple[int, int]] = []   # zeroed and compressed grains: the parent is not read
    zeros = compressed = 0
    for i, gt_sector in enumerate(gd):
        if not gt_sector:
            continue
        gt_at = gt_sector * SECTOR
        meta.append((gt_at, 4 * n_gtes))
        gt = struct.unpack(f"<{n_gtes}I", _read(fd, path, gt_at, 4 * n_gtes))
        for j, e in enumerate(gt):
            guest = (i * n_gtes + j) * gs
            if guest >= size or not e:
                continue
            if e == GTE_ZEROED and flags & FLAG_ZERO_GRAIN:
                zeros += 1
                opaque.append((guest, min(gs, size - guest)))
            elif flags & FLAG_COMPRESSED:
                compressed += 1
                opaque.append((guest, min(gs, size - guest)))
            else:
                add_run(extents, guest, e * SECTOR, min(gs, size - guest))
    return ClusterMap(path=path, version=version, cluster_bytes=gs, virtual_bytes=size,
                      extents=[tuple(x) for x in extents], zero_clusters=zeros,
                      compressed_clusters=compressed,
                      backing_file=parent.group(1) if parent else "", dirty=unclean,
                      metadata=coalesce(meta), fmt="vmdk", opaque=coalesce(opaque))
