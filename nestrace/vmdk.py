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

Not read: a disk whose descriptor is a file of its own (monolithicFlat,
twoGbMaxExtent*, vmfs): the descriptor names the extent files, and a flat
extent is a raw image that `record --image` takes as it is."""
from __future__ import annotations

import os
import re
import struct

from .imagemap import ClusterMap, ImageMapError, add_run, coalesce, read_exact, read_file

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


class VmdkError(ImageMapError):
    pass


def _read(fd: int, path: str, offset: int, n: int) -> bytes:
    return read_exact(fd, path, offset, n, VmdkError)


def grain_map(path: str) -> ClusterMap:
    """Read the grain map of the one-file sparse vmdk at `path`."""
    return read_file(path, _grain_map, VmdkError)


def descriptor_extents(text: str) -> list[tuple[str, int, str, str, int]]:
    """The extent lines of a vmdk descriptor: (access, sectors, type, file,
    offset in sectors)."""
    return [(a, int(n), t, f or "", int(o or 0)) for a, n, t, f, o in EXTENT_LINE.findall(text)]


def _descriptor_file(fd: int, path: str) -> VmdkError:
    """The error for a descriptor given as the image: what it names."""
    text = os.pread(fd, 64 << 10, 0).decode(errors="replace")
    ext = descriptor_extents(text)
    flat = [f"{f} (FLAT, raw from its byte {o * SECTOR}: give it as the image)" if t == "FLAT"
            else f"{f} ({t})" for _, _, t, f, o in ext]
    return VmdkError(f"{path}: offset 0: a vmdk descriptor file, not a disk: the disk's bytes "
                     f"are in its extent files: {'; '.join(flat) or 'none named'}")


def _grain_map(fd: int, path: str) -> ClusterMap:
    h = _read(fd, path, 0, HEADER.size)
    if h.startswith(DESCRIPTOR_MAGIC[:4]) and os.pread(fd, len(DESCRIPTOR_MAGIC), 0) == \
            DESCRIPTOR_MAGIC:
        raise _descriptor_file(fd, path)
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
    if not ext:
        raise VmdkError(f"{path}: offset 28: no descriptor in the file: an extent of a disk "
                        "whose descriptor is a file of its own (which says where on the disk "
                        "this extent starts)")
    if len(ext) != 1 or ext[0][2] not in ("SPARSE", "VMFSSPARSE"):
        raise VmdkError(f"{path}: offset {desc_off * SECTOR}: the descriptor names "
                        f"{len(ext)} extents ({', '.join(e[2] for e in ext)}): a one-file "
                        "sparse disk has one SPARSE extent")
    parent = re.search(r'^\s*parentFileNameHint\s*=\s*"([^"]*)"', text, re.M)
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
