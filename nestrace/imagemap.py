"""Where a disk image keeps each guest byte, for the formats that do not
keep it at the same offset: qcow2 (`nestrace.qcow2`) and QEMU's first
qcow (version 1, `nestrace.qcow`), VMware's hosted
sparse vmdk (`nestrace.vmdk`), VirtualBox's vdi (`nestrace.vdi`),
Hyper-V's vhdx (`nestrace.vhdx`), the dynamic VHD (`nestrace.vpc`),
QEMU's qed (`nestrace.qed`), Parallels' expandable image
(`nestrace.parallels`) and LUKS (`nestrace.luks`).  All but LUKS
(the disk after a header, encrypted in place) allocate a cluster (a
grain, in VMware's words; a block, in the others') of the file the first
time the guest writes that part of its disk, where the file ends then,
and find it again through a table (two levels of them for qcow2, qcow,
vmdk and qed).  Their maps are read into one shape, `ClusterMap`, that
`record` stores as extent rows and `merge` and the views carry offsets
through."""
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


def cluster_map(path: str, fmt: str) -> ClusterMap:
    """The map of the `fmt` image at `path` (one of MAPPED)."""
    if fmt == "qcow2":
        from .qcow2 import cluster_map as read
    elif fmt == "qcow":
        from .qcow import table_map as read
    elif fmt == "vmdk":
        from .vmdk import grain_map as read
    elif fmt == "vdi":
        from .vdi import block_map as read
    elif fmt == "vhdx":
        from .vhdx import bat_map as read
    elif fmt == "vpc":
        from .vpc import bat_map as read
    elif fmt == "qed":
        from .qed import table_map as read
    elif fmt == "parallels":
        from .parallels import bat_map as read
    elif fmt == "luks":
        from .luks import header_map as read
    else:
        raise ImageMapError(f"{path}: a {fmt} image: nestrace follows guest offsets into "
                            f"{FOLLOWED} images only")
    return read(path)


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


# ---- backing chains ---------------------------------------------------------

MAX_CHAIN = 16


@dataclass
class Layer:
    """One file of an image's backing chain: the image itself first."""
    path: str
    fmt: str
    map: ClusterMap | None           # None: a raw file (disk byte b at file byte b)
    virtual_bytes: int
    # an extent file of the layer before it (a vmdk whose descriptor is a
    # file of its own: the descriptor's layer has no bytes, its extent
    # files follow it, each with the stretch of the disk it holds)
    extent: bool = False


def backing_chain(path: str, fmt: str) -> list[Layer]:
    """The image at `path` and the files it reads through, top first: a
    qcow2 (or qcow) image's backing file (relative to the image's directory, as QEMU
    takes it; of the format the image names, else by its first bytes),
    that file's backing file, and so on.  A vmdk whose descriptor is a file
    of its own is the descriptor, then its extent files (Layer.extent),
    then its parent."""
    from . import vmdk
    from .stack import StackError, image_format
    chain: list[Layer] = []
    seen: set[str] = set()
    while True:
        real = os.path.realpath(path)
        if real in seen or len(chain) >= MAX_CHAIN:
            raise ImageMapError(f"{chain[0].path}: its backing chain loops or is longer than "
                                f"{MAX_CHAIN} files (at {path})")
        seen.add(real)
        if fmt == "raw":
            try:
                size = os.stat(path).st_size
            except OSError as e:
                raise ImageMapError(f"{path}: {e.strerror}") from None
            chain.append(Layer(real, "raw", None, size))
            return chain
        if fmt == "vmdk" and vmdk.is_descriptor(path):
            m, parts = vmdk.split_disk(path)
            chain.append(Layer(real, fmt, m, m.virtual_bytes))
            for p in parts:
                chain.append(Layer(os.path.realpath(p.path), p.fmt, p.map, m.virtual_bytes,
                                   extent=True))
                if chain[-1].path in seen:
                    raise ImageMapError(f"{chain[0].path}: {p.path} is in its chain twice")
                seen.add(chain[-1].path)
        else:
            m = cluster_map(path, fmt)
            chain.append(Layer(real, fmt, m, m.virtual_bytes))
        if not m.backing_file:
            return chain
        name = m.backing_file
        if ":" in name.split("/")[0]:
            raise ImageMapError(f"{path}: backing file {name!r} is not a file (a protocol or "
                                "json: name): nestrace follows backing files on a file system")
        nxt = name if os.path.isabs(name) else os.path.join(os.path.dirname(path), name)
        try:
            bfmt = m.backing_format or image_format(nxt)
        except StackError as e:
            raise ImageMapError(f"{path}: backing file {name!r}: {e}") from None
        if bfmt != "raw" and bfmt not in MAPPED:
            raise ImageMapError(f"{path}: backing file {nxt} is a {bfmt} image: nestrace "
                                f"follows {FOLLOWED} images only")
        path, fmt = nxt, bfmt


def _minus(ranges: list[tuple[int, int]], cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[lo, hi) ranges (sorted, disjoint) without the cuts (sorted, disjoint)."""
    out, j = [], 0
    for lo, hi in ranges:
        while j < len(cuts) and cuts[j][1] <= lo:
            j += 1
        k = j
        while lo < hi and k < len(cuts) and cuts[k][0] < hi:
            if cuts[k][0] > lo:
                out.append((lo, cuts[k][0]))
            lo = max(lo, cuts[k][1])
            k += 1
        if lo < hi:
            out.append((lo, hi))
    return out


def chain_extents(chain: list[Layer]) -> list[tuple[int, int, int, int]]:
    """Where each disk byte of the top image is read from, through its
    backing chain: (disk offset, layer, offset in that layer's file,
    length), sorted by disk offset.  A layer serves what the layers above
    it leave (unallocated clusters); a zero or compressed cluster ends the
    search there with no place in a file, and so does the end of a
    backing file shorter than the disk (QEMU reads zeros)."""
    todo = [(0, chain[0].virtual_bytes)]
    out: list[tuple[int, int, int, int]] = []
    for i, layer in enumerate(chain):
        todo = _minus(todo, [(layer.virtual_bytes, 1 << 63)])
        if layer.map is None:
            out += [(lo, i, lo, hi - lo) for lo, hi in todo]
            break
        ext = sorted((g, g + n, f) for g, f, n in layer.map.extents)
        j = 0
        for lo, hi in todo:   # the parts of todo this layer has a place for
            while j < len(ext) and ext[j][1] <= lo:
                j += 1
            k = j
            while k < len(ext) and ext[k][0] < hi:
                s, t = max(lo, ext[k][0]), min(hi, ext[k][1])
                out.append((s, i, ext[k][2] + s - ext[k][0], t - s))
                k += 1
        todo = _minus(todo, [(g, t) for g, t, _ in ext])
        todo = _minus(todo, sorted((g, g + n) for g, n in layer.map.opaque))
        if not todo:
            break
    out.sort()
    return out
