"""What a capture snapshots of its stack besides the records: the extent
maps of the image and of the guest files (FIEMAP, btrfs chunk trees, an
image format's cluster map) at start and end, where btrfs placed bytes
during the capture, where the file systems' journals are, and where the
neighbor images and the store's own files lie on a traced disk."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from stat import S_ISREG

import pyarrow as pa
import pyarrow.compute as pc

from nestrace.capture.devices import file_id, mount_block_dev, mount_containing
from nestrace.capture.extents import btrfs_layout, extent_rows, placed_extent_rows
from nestrace.capture.guestfacts import (
    agent_facts,
    guest_rows,
    journal_rows,
    read_lines,
    unknown_warning,
)
from nestrace.capture.stack import Stack, guests
from nestrace.errors import StackError
from nestrace.images.base import MAPPED
from nestrace.schema import table_schema
from nestrace.store.files import LiveCapture


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


def snapshot_extents(stack: Stack, capture_id: str, phase: str, inos: set[int] | None = None,
                     placed: list[dict] = (), served: set[int] | None = None
                     ) -> tuple[pa.Table, bool]:
    """The image's extents (FIEMAP; btrfs addresses mapped through the
    chunk tree to devices and their offsets) and its cluster map, and the
    guest side's snapshot (guest_snapshot): of the files in `inos`, or
    without it of the first files found.  Also whether files were left
    out for that limit (the agent warns).  A gateway's: the exported
    files' (served_rows; those of `served`, the server's inodes)."""
    rows = []
    if stack.gateway:           # (its server's files: when the server is this machine)
        rows += served_rows(stack, capture_id, phase, served) if stack.has_host else []
        return pa.Table.from_pylist(rows, schema=table_schema("extent_maps")), False
    if stack.raw_host:
        rows += raw_host_rows(stack, phase, capture_id)
    elif stack.has_host:
        chunks, devices = btrfs_layout(stack.host_mount, stack.host_fs)
        for path in [stack.image_path, *(b["path"] for b in stack.backing_files)]:
            rows += extent_rows(path, "image", phase, capture_id, stack.disk.kdev, chunks,
                                devices)
        if stack.image_format in MAPPED:
            rows += cluster_rows(stack, phase, capture_id)
    truncated = False
    if stack.has_guest:
        more, truncated = guest_snapshot(stack, capture_id, phase, inos, placed)
        rows += more
    return pa.Table.from_pylist(rows, schema=table_schema("extent_maps")), truncated


SERVED_FILES = 1024


def served_rows(stack: Stack, capture_id: str, phase: str, inos: set[int] | None = None
                ) -> list[dict]:
    """A gateway's exported files on the server's file system, as rows of
    role image (each its own "image": the maps and links carry hostfs
    accesses to the disk as for an image): those whose inode is in
    `inos`, or without it the first SERVED_FILES found."""
    chunks, devices = btrfs_layout(stack.host_mount, stack.host_fs)
    rows, n = [], 0
    for top, _, files in os.walk(stack.net["export"]):
        for f in sorted(files):
            p = os.path.join(top, f)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not S_ISREG(st.st_mode) or (inos is not None and st.st_ino not in inos):
                continue
            with contextlib.suppress(OSError):       # (gone meanwhile)
                rows += extent_rows(p, "image", phase, capture_id, stack.disk.kdev, chunks,
                                    devices, fs_dev=stack.host_kdev)
            n += 1
            if inos is None and n >= SERVED_FILES:
                return rows
    return rows


def raw_host_rows(stack: Stack, phase: str, capture_id: str) -> list[dict]:
    """The raw baseline's "image", the host partition under the virtual
    disk, as one image extent: its bytes at the partition's start on the
    disk (physical_bytes on the whole disk, as no host FS row adds it),
    so that the maps and links carry virtual-disk bytes to the disk as
    through an image file."""
    return [{"capture_id": capture_id, "phase": phase, "path": stack.image_path,
             "dev": stack.vdisk.backing_kdev if stack.vdisk else 0, "ino": stack.image_ino,
             "flags": 0, "role": "image", "logical_bytes": 0,
             "physical_bytes": stack.host_part_start_bytes,
             "length_bytes": stack.host_part_size_bytes, "physical_dev": stack.disk.kdev}]


def guest_snapshot(stack: Stack, capture_id: str, phase: str, inos: set[int] | None = None,
                   placed: list[dict] = ()) -> tuple[list[dict], bool]:
    """The guest file systems' snapshot, which the agent takes
    (guestfacts): their files' extents (at the start the first files
    found, at the end those in `inos`), at the start where their journals
    are, at the end where btrfs placed the `placed` extents; and whether
    the start left files out.  A problem is a warning on stderr."""
    where = f"nestrace-agent --facts {phase}"
    gs = guests(stack)
    lines = read_lines(agent_facts([g.guest_mount for g in gs], phase, inos), where, len(gs))
    rows, problems = guest_rows(lines, gs, stack.vdisk.kdev, capture_id, inos, placed, where)
    for p in problems:
        print(f"nestrace: warning: {p}", file=sys.stderr)
    return rows, lines.truncated


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


def btrfs_placed_rows(stack: Stack, capture_id: str, live: LiveCapture) -> list[dict]:
    """Where a btrfs host placed the image's bytes during the capture: its
    ordered extents (each write-back or direct write of copy-on-write data
    goes to a new place), mapped through its chunk tree at the end like
    the snapshots: extent_maps rows of phase `events`, one per copy and
    per stripe.  Bytes placed and moved again before the end (a block
    rewritten) are found through these: no snapshot has their first
    place, which a read-modify-write, say, reads.  (A btrfs guest's come
    with the agent's end snapshot: guest_snapshot.)"""
    if not (stack.has_host and stack.host_fs == "btrfs"):
        return []
    files = {}
    for path in [stack.image_path, *(b["path"] for b in stack.backing_files)]:
        with contextlib.suppress(OSError):
            files[file_id(path)] = path
    mine = [(r, p) for r in btrfs_placed_extents(live) if (p := files.get((r["dev"], r["ino"])))]
    if not mine:
        return []
    return placed_extent_rows(mine, "image", capture_id, stack.disk.kdev,
                              *btrfs_layout(stack.host_mount, "btrfs"))


def host_journal_rows(stack: Stack, capture_id: str, log) -> list[dict]:
    """Where the host file system's journal is on its disk, which the
    agent finds as a guest's (guestfacts).  One that cannot be read is
    logged, and links classes the writes there by their flags."""
    if not (stack.has_host and stack.disk and not stack.more_disks
            and stack.host_fs in ("ext3", "ext4", "xfs")):
        return []
    where = "nestrace-agent --facts journal"
    try:
        lines = read_lines(agent_facts([stack.host_mount], "journal"), where, 1)
    except StackError as e:
        log("nestrace: warning: " + unknown_warning(stack.host_mount, "", str(e)))
        return []
    for _, dev, why in lines.journal_errors:
        log("nestrace: warning: " + unknown_warning(stack.host_mount, dev, why))
    return [r for _, j in lines.journals
            for r in journal_rows(stack.host_mount, stack.host_fs, j["ino"], j["extents"],
                                  stack.host_kdev, stack.disk.kdev,
                                  stack.host_part_start_bytes, capture_id)]


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
