"""What a capture snapshots of its stack besides the records: the extent
maps of the image and of the guest files (FIEMAP, btrfs chunk trees, an
image format's cluster map) at start and end, where btrfs placed bytes
during the capture, where the file systems' journals are, and where the
neighbor images and the store's own files lie on a traced disk."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from nestrace.capture.devices import mount_block_dev, mount_containing
from nestrace.capture.extents import (
    FIEMAP_EXTENT_ENCODED,
    BtrfsFileExtent,
    btrfs_layout,
    extent_rows,
    map_extent_rows,
)
from nestrace.capture.fsjournal import JournalError, journal_rows, unknown_warning
from nestrace.capture.stack import Stack, StackError, file_id, guests
from nestrace.images.base import MAPPED, open_noatime
from nestrace.schema import table_schema
from nestrace.store.files import LiveCapture

# files the start snapshot takes at most, the first found: which files a
# capture will touch is not known yet, and FIEMAP takes ~0.1 ms a file
# (4550 files: 0.54 s).  The end snapshot takes every file touched.
MAX_GUEST_FILES = 4096


def guest_files(stack: Stack, inos: set[int] | None = None,
                limit: int | None = None) -> tuple[list[str], bool]:
    """Regular files of the guest FS (those with inode in `inos`, if
    given), at most `limit` of them: the paths, and whether files were left
    out for the limit.  The walk reads each directory once and stats only
    the directories (to stay on this file system): a file's type and inode
    come from the directory entry (d_ino is st_ino on ext2/3/4, xfs and
    btrfs).  (os.walk with a stat, an lstat and an
    islink per file took 6-12 s at the end of a capture of a root file
    system of 400k files, this machine's own; this walk ~1 s.)  Directories
    are read with O_NOATIME (open_noatime)."""
    out = []
    top = os.stat(stack.guest_mount).st_dev
    todo = [stack.guest_mount]
    while todo:
        d = todo.pop()
        try:
            fd = open_noatime(d, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue                    # removed or unreadable while we looked
        subdirs = []
        try:
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            # this file system only: not the ones mounted on
                            # it (a root file system's /proc, /sys, /run, ...)
                            # nor a btrfs subvolume (a device of its own)
                            if e.name != "lost+found" and \
                                    e.stat(follow_symlinks=False).st_dev == top:
                                subdirs.append(os.path.join(d, e.name))
                            continue
                        if not e.is_file(follow_symlinks=False):
                            continue
                        if inos is not None and e.inode() not in inos:
                            continue
                    except OSError:
                        continue
                    if limit is not None and len(out) >= limit:
                        return out, True
                    out.append(os.path.join(d, e.name))
        except OSError:
            pass                        # (a directory gone while read)
        finally:
            os.close(fd)
        todo.extend(reversed(subdirs))    # (depth first, in directory order)
    return out, False


def cluster_rows(stack: Stack, phase: str, capture_id: str) -> list[dict]:
    """A qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks image's cluster map as extent rows of
    role vdisk_image (logical: virtual-disk offset; physical: offset in the
    file the byte is read from, named by the row's dev and ino: the image,
    or a file of its backing chain; cluster_bytes: the image's), and where
    each file's own tables are as rows of role image_metadata (both offsets
    in that file).  Bytes in a backing file off the image's file system are
    left out (not traced).  An image whose map cannot be read gives none,
    with a warning: `merge` then refuses to map it."""
    from nestrace.images.base import ImageMapError
    from nestrace.images.chain import backing_chain, chain_extents
    try:
        chain = backing_chain(stack.image_path, stack.image_format)
    except ImageMapError as e:
        print(f"nestrace: warning: {e}: its cluster map is not stored, and `merge` will not "
              "map guest offsets into it", file=sys.stderr)
        return []
    traced = {os.path.realpath(stack.image_path), *(b["path"] for b in stack.backing_files)}
    ids = [file_id(layer.path) if layer.path in traced else None for layer in chain]
    rows = []
    for g, i, off, n in chain_extents(chain):
        if ids[i]:
            rows.append({"capture_id": capture_id, "phase": phase, "path": chain[i].path,
                         "dev": ids[i][0], "ino": ids[i][1], "flags": 0, "role": "vdisk_image",
                         "logical_bytes": g, "physical_bytes": off, "length_bytes": n,
                         "cluster_bytes": chain[0].map.cluster_bytes})
    for layer, fid in zip(chain, ids):
        if fid and layer.map:
            rows += [{"capture_id": capture_id, "phase": phase, "path": layer.path,
                      "dev": fid[0], "ino": fid[1], "flags": 0, "role": "image_metadata",
                      "logical_bytes": off, "physical_bytes": off, "length_bytes": ln}
                     for off, ln in layer.map.metadata]
    return rows


def snapshot_extents(stack: Stack, capture_id: str, phase: str,
                     inos: set[int] | None = None) -> tuple[pa.Table, bool]:
    """FIEMAP of the image and of the guest files (btrfs addresses mapped
    through the chunk tree to devices and their offsets): of the files in
    `inos`, or without it of the first MAX_GUEST_FILES found.  Also
    whether files were left out for that limit (with a warning)."""
    rows = []
    if stack.has_host:
        chunks, devices = btrfs_layout(stack.host_mount, stack.host_fs)
        for path in [stack.image_path, *(b["path"] for b in stack.backing_files)]:
            rows += extent_rows(path, "image", phase, capture_id, stack.disk.kdev, chunks,
                                devices)
        if stack.image_format in MAPPED:
            rows += cluster_rows(stack, phase, capture_id)
    if not stack.has_guest:
        return pa.Table.from_pylist(rows, schema=table_schema("extent_maps")), False
    truncated = False
    for g in guests(stack):
        subprocess.run(["sync", "-f", g.guest_mount], check=False)
        chunks, devices = btrfs_layout(g.guest_mount, g.guest_fs)
        paths, cut = guest_files(g, inos, None if inos is not None else MAX_GUEST_FILES)
        if cut:
            print(f"nestrace: warning: {g.guest_mount} has more than {MAX_GUEST_FILES} regular "
                  f"files: the {phase} snapshot has the first {MAX_GUEST_FILES} found (a file past "
                  f"them read or written before a rewrite moved it is mapped where the end "
                  f"snapshot has it)", file=sys.stderr)
        truncated |= cut
        for p in paths:
            try:
                rows += extent_rows(p, "guest_file", phase, capture_id, stack.vdisk.kdev,
                                    chunks, devices, g.guest_kdev)
            except OSError:
                continue   # removed while we looked
    return pa.Table.from_pylist(rows, schema=table_schema("extent_maps")), truncated


# mapping_event sources in btrfs logical bytes (schemas/): its ordered
# extents, and the extents btrfs_get_extent looked up
BTRFS_LOGICAL_SOURCES = [6, 9]


def btrfs_placed_extents(live: LiveCapture) -> list[dict]:
    """The btrfs ordered extents and looked-up extents among a capture's
    mapping events, each once (dev, ino, file_offset_bytes, disk_bytes:
    btrfs logical bytes, length_bytes, disk_length_bytes: a compressed
    extent's compressed length, else 0), sorted."""
    cols = ["dev", "ino", "file_offset_bytes", "disk_bytes", "length_bytes", "disk_length_bytes"]
    parts = [b.filter(pc.is_in(b.column("source"), pa.array(BTRFS_LOGICAL_SOURCES, pa.uint16())))
             .select(cols)
             for b in live.batches("mapping_events")]
    if not parts or not (seen := pa.Table.from_batches(parts).group_by(cols).aggregate([])).num_rows:
        return []
    return seen.sort_by([(c, "ascending") for c in cols]).to_pylist()


def btrfs_placed_rows(stack: Stack, capture_id: str, live: LiveCapture,
                      guest_paths: dict[int, str] | None = None) -> list[dict]:
    """Where a btrfs placed the image's bytes (a btrfs host) or the guest
    files' bytes (a btrfs guest) during the capture: its ordered extents
    (each write-back or direct write of copy-on-write data goes to a new
    place), mapped through that file system's chunk tree at the end like
    the snapshots: extent_maps rows of phase `events`, one per copy and
    per stripe.  Bytes placed and moved again before the end (a block
    rewritten) are found through these: no snapshot has their first
    place, which a read-modify-write, say, reads.  guest_paths: (dev,
    inode) -> path of the guest files (a file deleted since is named by
    inode)."""
    sides = []   # (role, mount, fs device, the disk below, (dev, ino) -> path or None)
    if stack.has_host and stack.host_fs == "btrfs":
        files = {}
        for path in [stack.image_path, *(b["path"] for b in stack.backing_files)]:
            with contextlib.suppress(OSError):
                files[file_id(path)] = path
        sides.append(("image", stack.host_mount, stack.disk.kdev,
                      lambda dev, ino: files.get((dev, ino))))
    for g in guests(stack) if stack.has_guest and stack.vdisk else []:
        if g.guest_fs == "btrfs":
            paths = guest_paths or {}
            sides.append(("guest_file", g.guest_mount, stack.vdisk.kdev,
                          lambda dev, ino, g=g: (paths.get((dev, ino), f"{g.guest_mount} (inode {ino})")
                                                 if dev == g.guest_kdev else None)))
    if not sides or not (seen := btrfs_placed_extents(live)):
        return []
    rows = []
    for role, mount, disk_kdev, path_of in sides:
        mine = [(r, p) for r in seen if (p := path_of(r["dev"], r["ino"]))]
        if not mine:
            continue
        rows += placed_extent_rows(mine, role, capture_id, disk_kdev,
                                   *btrfs_layout(mount, "btrfs"))
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


def stack_journal_rows(stack: Stack, capture_id: str, log) -> list[dict]:
    """Where the journals of the stack's file systems are (fsjournal): the
    guest's on the virtual disk, the host's on its disk.  One that cannot
    be read is logged, and links classes the writes there by their flags."""
    sides = []
    if stack.has_guest and stack.vdisk:
        sides += [(g.guest_mount, g.guest_kdev, stack.vdisk.kdev, g.guest_part_start_bytes)
                  for g in guests(stack) if not g.guest_base_kdev]   # (an overlay has none)
    if stack.has_host and stack.disk and not stack.more_disks:
        sides.append((stack.host_mount, stack.host_kdev, stack.disk.kdev,
                      stack.host_part_start_bytes))
    rows = []
    for mp, fs_dev, disk_dev, part in sides:
        try:
            rows += journal_rows(mp, fs_dev, disk_dev, part, capture_id)
        except (JournalError, StackError) as e:
            log("nestrace: warning: " + unknown_warning(mp, getattr(e, "dev", ""), str(e)))
    return rows


# neighbor images a snapshot maps at most (the first found)
MAX_NEIGHBORS = 64


def neighbor_images(stack: Stack) -> list[str]:
    """Other virtual disks' images on the host FS, in use: the backing
    files of the other loop devices, and the regular files QEMU processes
    hold open there (another VM's disk), the traced image and its backing
    files left out.  Their host-disk requests have no traced cause."""
    if not stack.has_host or not stack.host_mount:
        return []
    mine = {os.path.realpath(p) for p in [stack.image_path,
                                          *(b["path"] for b in stack.backing_files)]}
    found: dict[str, None] = {}
    for f in sorted(Path("/sys/block").glob("loop*/loop/backing_file")):
        try:
            found[f.read_text().strip().removesuffix(" (deleted)")] = None
        except OSError:
            continue
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or \
                    not (proc / "comm").read_text().startswith("qemu"):
                continue
            for fd in (proc / "fd").iterdir():
                found[os.readlink(fd)] = None
        except OSError:
            continue
    out = []
    for p in found:
        try:
            if os.path.realpath(p) in mine or not os.path.isfile(p):
                continue
            m = mount_containing(p)
        except OSError:
            continue
        if m is not None and m.kdev == stack.host_kdev:
            out.append(p)
    return out[:MAX_NEIGHBORS]


def neighbor_rows(stack: Stack, paths: list[str], phase: str, capture_id: str) -> list[dict]:
    """Where the neighbor images are on the host disk (role
    neighbor_image, physical_bytes on the whole disk: a partition's start
    added): `links` classes the unexplained host-disk writes there as
    other, not the host's write-back."""
    chunks, devices = btrfs_layout(stack.host_mount, stack.host_fs)
    rows = []
    for p in paths:
        try:
            rows += extent_rows(p, "neighbor_image", phase, capture_id, stack.disk.kdev, chunks,
                                devices)
        except OSError:
            continue    # gone
    for r in rows:
        r["physical_bytes"] += stack.host_part_start_bytes
    return rows


def store_extents(d: Path, capture_id: str) -> list[dict]:
    """Where a live capture's own files are on their disk (role
    nestrace_store, physical_bytes on the whole disk: a partition's start
    added), for a store on a traced disk: `links` classes the writes there
    as nestrace's own.  Written-back extents only: the rest (delayed
    allocation) reached no disk during the capture."""
    m = mount_containing(str(d))
    bd = mount_block_dev(m)
    chunks, devices = btrfs_layout(m.mount_point, m.fs_type)
    rows = []
    for p in sorted(d.iterdir()):
        try:
            if p.is_file():
                rows += extent_rows(str(p), "nestrace_store", "end", capture_id, bd.kdev, chunks,
                                    devices)
        except OSError:
            continue
    for r in rows:
        r["physical_bytes"] += bd.part_start_bytes
    return rows
