"""Where a disk image keeps each guest byte, for the formats that do not
keep it at the same offset: qcow2 (`nestrace.images.qcow2`) and QEMU's first
qcow (version 1, `nestrace.images.qcow`), VMware's hosted
sparse vmdk (`nestrace.images.vmdk`), VirtualBox's vdi (`nestrace.images.vdi`),
Hyper-V's vhdx (`nestrace.images.vhdx`), the dynamic VHD (`nestrace.images.vpc`),
QEMU's qed (`nestrace.images.qed`), Parallels' expandable image
(`nestrace.images.parallels`) and LUKS (`nestrace.images.luks`).  All but LUKS
(the disk after a header, encrypted in place) allocate a cluster (a
grain, in VMware's words; a block, in the others') of the file the first
time the guest writes that part of its disk, where the file ends then,
and find it again through a table (two levels of them for qcow2, qcow,
vmdk and qed).  Their maps are read into one shape, `ClusterMap`, that
`record` stores as extent rows and `merge` and the views carry offsets
through."""
from __future__ import annotations

import os
from dataclasses import dataclass

from nestrace.errors import StackError
from nestrace.images import luks, parallels, qcow, qcow2, qed, vdi, vhdx, vmdk, vpc
from nestrace.images.base import (
    FOLLOWED,
    MAPPED,
    ClusterMap,
    ImageMapError,
    open_noatime,
)

# each mapped format's reader: the file's map, from its own tables
READERS = {"qcow2": qcow2.cluster_map, "qcow": qcow.table_map, "vmdk": vmdk.grain_map,
           "vdi": vdi.block_map, "vhdx": vhdx.bat_map, "vpc": vpc.bat_map,
           "qed": qed.table_map, "parallels": parallels.bat_map, "luks": luks.header_map}


def cluster_map(path: str, fmt: str) -> ClusterMap:
    """The map of the `fmt` image at `path` (one of MAPPED)."""
    read = READERS.get(fmt)
    if read is None:
        raise ImageMapError(f"{path}: a {fmt} image: nestrace follows guest offsets into "
                            f"{FOLLOWED} images only")
    return read(path)


# image formats a hypervisor maps guest offsets through, by their first
# bytes (a vdi by its signature at byte 64: its first line varies, QEMU
# writes "<<< QEMU VM Virtual Disk Image >>>"); a file starting otherwise
# is taken for a raw image (a fixed VHD too: raw, with a footer at its end).
# QEMU's first qcow (version 1: "QFI\xfb" then 1) is told from a qcow2.
IMAGE_MAGIC = ((b"QFI\xfb\0\0\0\1", "qcow"), (b"QFI\xfb", "qcow2"), (b"KDMV", "vmdk"),
               (b"# Disk DescriptorFile", "vmdk"), (b"vhdxfile", "vhdx"), (b"conectix", "vpc"),
               (b"QED\0", "qed"), (b"WithoutFreeSpace", "parallels"),
               (b"WithouFreSpacExt", "parallels"), (b"LUKS\xba\xbe", "luks"))


def image_format(path: str) -> str:
    """The disk image format of a file, from its first bytes."""
    try:
        with open(open_noatime(path), "rb") as f:
            head = f.read(72)
    except OSError as e:
        raise StackError(f"{path}: {e.strerror}") from None
    if vdi.is_vdi(head):
        return "vdi"
    return next((fmt for magic, fmt in IMAGE_MAGIC if head.startswith(magic)), "raw")


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
