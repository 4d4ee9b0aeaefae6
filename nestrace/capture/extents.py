"""Extent maps of files: FIEMAP, btrfs's own extent items and chunk tree,
and the extent_maps rows made from them (a file's bytes -> where they are
on the disk below, through btrfs's chunks onto its devices)."""
from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
from dataclasses import dataclass, field

from nestrace.capture.devices import BlockDev, btrfs_devices, file_id, fs_device
from nestrace.errors import StackError

# ---- FIEMAP ----------------------------------------------------------------

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNKNOWN = 0x2
FIEMAP_EXTENT_DATA_INLINE = 0x200
_FM = struct.Struct("=QQIIII")
_FE = struct.Struct("=QQQQQI3I")
BATCH = 512


def fiemap(path: str) -> list[tuple[int, int, int, int]]:
    """(logical, physical, length, flags) per extent, without FIEMAP_FLAG_SYNC
    (delayed-allocation extents show as such, with physical 0)."""
    out: list[tuple[int, int, int, int]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        start = 0
        while True:
            buf = bytearray(_FM.size + BATCH * _FE.size)
            _FM.pack_into(buf, 0, start, 2**64 - 1 - start, 0, 0, BATCH, 0)
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf, True)
            n = _FM.unpack_from(buf, 0)[3]
            if n == 0:
                break
            last = False
            for i in range(n):
                lo, ph, ln, _, _, fl, *_ = _FE.unpack_from(buf, _FM.size + i * _FE.size)
                out.append((lo, ph, ln, fl))
                last = bool(fl & FIEMAP_EXTENT_LAST)
            if last:
                break
            start = out[-1][0] + out[-1][2]
    finally:
        os.close(fd)
    return out


# ---- btrfs: a file's extent items --------------------------------------------

# BTRFS_IOC_TREE_SEARCH: _IOWR(0x94, 17, struct btrfs_ioctl_search_args), 4096 bytes
BTRFS_IOC_TREE_SEARCH = 0xD0009411
BTRFS_EXTENT_DATA_KEY = 108
_SK = struct.Struct("=7Q4I4Q")        # btrfs_ioctl_search_key
_SH = struct.Struct("=3Q2I")          # btrfs_ioctl_search_header
_FX = struct.Struct("<QQBBHBQQQQ")    # btrfs_file_extent_item (packed), regular or prealloc
FIEMAP_EXTENT_ENCODED = 0x8


@dataclass
class BtrfsFileExtent:
    """One EXTENT_DATA item of a btrfs file: file bytes [file_offset,
    file_offset + num_bytes) are bytes [offset, offset + num_bytes) of the
    extent that disk_num_bytes logical bytes at disk_bytenr hold
    (compressed when compression is not 0)."""
    file_offset: int
    num_bytes: int
    disk_bytenr: int
    disk_num_bytes: int
    offset: int
    compression: int


def btrfs_file_extents(path: str) -> list[BtrfsFileExtent]:
    """The regular and preallocated extent items of a btrfs file, by file
    offset (BTRFS_IOC_TREE_SEARCH in the file's subvolume, as compsize
    does; needs CAP_SYS_ADMIN).  FIEMAP gives a compressed extent's
    logical length and where its compressed data starts, not how long that
    is on the disk: the item's disk_num_bytes does."""
    out: list[BtrfsFileExtent] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        ino = os.fstat(fd).st_ino
        min_off = 0
        while True:
            buf = bytearray(4096)
            _SK.pack_into(buf, 0, 0, ino, ino, min_off, 2**64 - 1, 0, 2**64 - 1,
                          BTRFS_EXTENT_DATA_KEY, BTRFS_EXTENT_DATA_KEY, 4096, 0, 0, 0, 0, 0)
            fcntl.ioctl(fd, BTRFS_IOC_TREE_SEARCH, buf, True)
            n = _SK.unpack_from(buf, 0)[9]
            pos, last = _SK.size, None
            for _ in range(n):
                _, objectid, key_off, typ, ln = _SH.unpack_from(buf, pos)
                pos += _SH.size
                if objectid == ino and typ == BTRFS_EXTENT_DATA_KEY and ln >= _FX.size:
                    (_, _, comp, _, _, kind, bytenr, disk_n, off, num) = _FX.unpack_from(buf, pos)
                    if kind in (1, 2) and bytenr:    # regular, prealloc; not a hole
                        out.append(BtrfsFileExtent(key_off, num, bytenr, disk_n, off, comp))
                pos += ln
                last = key_off
            if n == 0 or last is None or last == 2**64 - 1:
                break
            min_off = last + 1
    finally:
        os.close(fd)
    return out


# ---- btrfs: logical -> device address --------------------------------------

# Block-group profiles whose every stripe holds a full copy of the chunk
MIRRORED = frozenset({"single", "DUP", "RAID1", "RAID1C3", "RAID1C4"})
# Striped profiles, with their parity stripes
STRIPED = {"RAID0": 0, "RAID10": 0, "RAID5": 1, "RAID6": 2}


@dataclass
class Chunk:
    """One btrfs chunk: `length` logical bytes from `logical`, laid out by
    `profile` over `stripes` ((devid, device offset), in stripe order)."""
    logical: int
    length: int
    profile: str = "single"
    stripe_len: int = 65536
    sub_stripes: int = 1
    stripes: list[tuple[int, int]] = field(default_factory=list)


def btrfs_chunks(device: str, mount_point: str) -> list[Chunk]:
    """Chunk map of a btrfs (any number of devices), from its chunk tree on
    `device`, once the btrfs mounted at `mount_point` has committed (syncfs:
    a sync(2) would make every file system on the machine commit and flush)."""
    subprocess.run(["sync", "-f", mount_point], check=False)
    out = subprocess.run(["btrfs", "inspect-internal", "dump-tree", "-t", "chunk", device],
                         capture_output=True, text=True)
    if out.returncode:
        raise StackError(f"{device}: btrfs dump-tree failed: {out.stderr.strip()}")
    chunks: list[Chunk] = []
    cur: Chunk | None = None
    for line in out.stdout.splitlines():
        if m := re.search(r"CHUNK_ITEM (\d+)\)", line):
            cur = Chunk(int(m.group(1)), 0)
            chunks.append(cur)
        elif cur is None:
            continue
        elif m := re.search(r"^\s*length (\d+) owner \d+ stripe_len (\d+) type (\S+)", line):
            cur.length, cur.stripe_len = int(m.group(1)), int(m.group(2))
            prof = [t for t in m.group(3).split("|") if t in MIRRORED or t in STRIPED]
            cur.profile = prof[0] if prof else "single"
        elif m := re.search(r"num_stripes \d+ sub_stripes (\d+)", line):
            cur.sub_stripes = max(1, int(m.group(1)))
        elif m := re.search(r"stripe \d+ devid (\d+) offset (\d+)", line):
            cur.stripes.append((int(m.group(1)), int(m.group(2))))
    for c in chunks:
        if not c.length or not c.stripes:
            raise StackError(f"{device}: chunk at logical {c.logical}: no length or stripes "
                             "in `btrfs inspect-internal dump-tree -t chunk`")
    chunks.sort(key=lambda c: c.logical)
    return chunks


def btrfs_pieces(chunks: list[Chunk], logical: int, length: int
                 ) -> list[tuple[int, int, int, int]] | None:
    """Where btrfs keeps the logical bytes [logical, logical + length):
    (logical, devid, device offset, length) per piece, every copy of a
    mirrored profile, the data stripes of a striped one (as the kernel's
    btrfs_map_block: RAID5/6 data rotate by full stripe; parity is not
    file data).  None if some byte is in no chunk."""
    import bisect
    out = []
    pos, end = logical, logical + length
    while pos < end:
        i = bisect.bisect_right(chunks, pos, key=lambda c: c.logical) - 1
        if i < 0 or pos >= chunks[i].logical + chunks[i].length:
            return None
        c = chunks[i]
        off = pos - c.logical
        n = min(end, c.logical + c.length) - pos
        if c.profile in MIRRORED:
            out += [(pos, devid, doff + off, n) for devid, doff in c.stripes]
        else:
            sl, ns = c.stripe_len, len(c.stripes)
            nr, within = divmod(off, sl)
            n = min(n, sl - within)
            if c.profile == "RAID0":
                row, first, copies = nr // ns, nr % ns, 1
            elif c.profile == "RAID10":
                factor = ns // c.sub_stripes
                row, first, copies = nr // factor, (nr % factor) * c.sub_stripes, c.sub_stripes
            else:   # RAID5, RAID6
                data = ns - STRIPED[c.profile]
                row = nr // data
                first, copies = (row + nr % data) % ns, 1
            for k in range(first, first + copies):
                devid, doff = c.stripes[k]
                out.append((pos, devid, doff + row * sl + within, n))
        pos += n
    return out


def btrfs_layout(mount_point: str, fs_type: str
                 ) -> tuple[list[Chunk] | None, dict[int, BlockDev] | None]:
    """A btrfs's chunk map and devices (extent_rows maps through them);
    (None, None) for any other file system."""
    if fs_type != "btrfs":
        return None, None
    return (btrfs_chunks(f"/dev/{fs_device(mount_point)}", mount_point),
            btrfs_devices(mount_point))


def extent_rows(path: str, role: str, phase: str, capture_id: str, disk_dev: int,
                chunks: list[Chunk] | None = None,
                devices: dict[int, BlockDev] | None = None,
                fs_dev: int | None = None) -> list[dict]:
    """The FIEMAP extents of `path`, one row per piece on a device: on
    ext2/3/4 and xfs one per extent, on `disk_dev`; on btrfs (`chunks`,
    `devices`: devid -> disk) one per copy and per stripe, on the disk of
    the device that holds it.  physical_bytes are on the file system's
    own device (its partition, when on one: map_extents adds its start;
    host_side refuses a btrfs whose devices' partitions start apart).
    fs_dev: the dev_t of the file system `path` is on, when the caller
    knows it (file_id otherwise reads the mount table for each file)."""
    dev, ino = (fs_dev, os.stat(path).st_ino) if fs_dev else file_id(path)
    extents = fiemap(path)
    compressed = None
    if chunks is not None and any(fl & FIEMAP_EXTENT_ENCODED for *_, fl in extents):
        try:
            compressed = {x.file_offset: x for x in btrfs_file_extents(path) if x.compression}
        except OSError as e:
            print(f"nestrace: warning: {path}: btrfs extent items unreadable ({e.strerror}): "
                  "its compressed extents are left out of the map", file=sys.stderr)
            compressed = {}
    return map_extent_rows(extents, path, dev, ino, role, phase, capture_id, disk_dev,
                           chunks, devices, compressed)


def map_extent_rows(extents: list[tuple[int, int, int, int]], path: str, dev: int, ino: int,
                    role: str, phase: str, capture_id: str, disk_dev: int,
                    chunks: list[Chunk] | None = None,
                    devices: dict[int, BlockDev] | None = None,
                    compressed: dict[int, BtrfsFileExtent] | None = None) -> list[dict]:
    """extent_rows of a file's FIEMAP extents (logical, physical, length,
    flags) taken elsewhere (the agent's own snapshot in a guest).
    compressed: a btrfs file's compressed extent items by file offset
    (btrfs_file_extents): an encoded extent found there gets rows of its
    compressed data (disk_length_bytes), one per piece on a device; one
    not found stays without, and links leaves it out.  A btrfs inline
    extent (its data in the metadata tree, physical 0) gets
    FIEMAP_EXTENT_UNKNOWN added: it has no place the maps can use."""
    rows = []

    def row(lo, ph, ln, fl, pdev, dlen=None):
        rows.append({"capture_id": capture_id, "phase": phase, "role": role, "path": path,
                     "dev": dev, "ino": ino, "logical_bytes": lo, "physical_bytes": ph,
                     "length_bytes": ln, "flags": fl, "physical_dev": pdev,
                     "disk_length_bytes": dlen})

    for lo, ph, ln, fl in extents:
        if chunks is not None and fl & FIEMAP_EXTENT_DATA_INLINE:
            fl |= FIEMAP_EXTENT_UNKNOWN
        if chunks is None or fl & 6:    # (no address yet: kept as it is, left out in SQL)
            row(lo, ph, ln, fl, disk_dev)
            continue
        if fl & FIEMAP_EXTENT_ENCODED and compressed is not None:
            x = compressed.get(lo)
            pieces = btrfs_pieces(chunks, x.disk_bytenr, x.disk_num_bytes) if x else None
            if not x or x.num_bytes != ln or pieces is None:
                row(lo, ph, ln, fl, disk_dev)    # (left out in SQL)
                continue
            for _, devid, poff, plen in pieces:
                if (bd := (devices or {}).get(devid)) is not None:
                    row(lo, poff, ln, fl, bd.kdev, plen)
            continue
        pieces = btrfs_pieces(chunks, ph, ln)
        if pieces is None:
            print(f"nestrace: warning: {path}: btrfs logical bytes {ph}+{ln} (file offset {lo}) are "
                  "in no chunk of the chunk tree: extent left out of the map", file=sys.stderr)
            continue
        for plog, devid, poff, plen in pieces:
            bd = (devices or {}).get(devid)
            if bd is None:
                print(f"nestrace: warning: {path}: btrfs devid {devid} (file offset {lo}) is not among "
                      "the file system's devices: piece left out of the map", file=sys.stderr)
                continue
            row(lo + plog - ph, poff, plen, fl, bd.kdev)
    return rows


def placed_extent_rows(placed: list[tuple[dict, str]], role: str, capture_id: str,
                       disk_kdev: int, chunks, devices) -> list[dict]:
    """extent_maps rows of phase `events` for btrfs ordered and looked-up
    extents (btrfs_placed_extents rows, each with its file's path), mapped through
    the chunk tree onto the disks below: one per copy and per stripe.  A
    compressed one is flagged FIEMAP_EXTENT_ENCODED, as FIEMAP has it,
    with its compressed data's length (disk_length_bytes)."""
    rows = []
    for r, path in placed:
        off, disk, ln, zlen = (r["file_offset_bytes"], r["disk_bytes"], r["length_bytes"],
                               r.get("disk_length_bytes") or 0)
        z = {off: BtrfsFileExtent(off, ln, disk, zlen, 0, 1)} if zlen else None
        rows += map_extent_rows([(off, disk, ln, FIEMAP_EXTENT_ENCODED if zlen else 0)],
                                path, r["dev"], r["ino"], role, "events", capture_id,
                                disk_kdev, chunks, devices, z)
    return rows
