"""Where a file system's journal lies on its disk, so that `links` can class
the writes there as journal by their place instead of by their flags
(extent_maps role fs_journal).

ext3 and ext4 keep an internal journal in a file (the superblock's journal
inode, usually 8): debugfs lists its blocks.  xfs keeps an internal log in
a fixed run of blocks: the superblock's logstart (a file-system block
number: allocation group and block within it) and logblocks.  ext2 has no
journal, btrfs a log tree allocated anywhere, and an external journal or
log is on another device: those give no rows, and links falls back to the
flags (unattributed SYNC-only writes count as journal there).
"""
from __future__ import annotations

import os
import re
import subprocess

from nestrace.capture.devices import Mount, mount_block_dev, mount_of

# "(lo-hi):ph-ph_end" or "(lo):ph", a run of blocks in debugfs' stat output
_RUN = re.compile(r"\((\d+)(?:-(\d+))?\):(\d+)(?:-(\d+))?")


class JournalError(RuntimeError):
    dev = ""    # the device whose journal could not be read


def _run(args: list[str]) -> str:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JournalError(f"{' '.join(args)}: {e}") from None
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        raise JournalError(f"{' '.join(args)}: {err}")
    return p.stdout


def ext_journal(dev: str) -> tuple[int, list[tuple[int, int, int]]]:
    """(inode, [(logical bytes, physical bytes, length bytes)]) of an ext3 or
    ext4 file system's internal journal; inode 0 and no extents when its
    journal is external or it has none."""
    head = _run(["dumpe2fs", "-h", dev])
    fields = dict(re.findall(r"^([A-Za-z ]+):\s+(.*)$", head, re.M))
    if "has_journal" not in fields.get("Filesystem features", "").split():
        return 0, []
    ino = int(fields.get("Journal inode", "0") or 0)
    if not ino:             # an external journal: on another device
        return 0, []
    try:
        bs = int(fields["Block size"])
    except (KeyError, ValueError):
        raise JournalError(f"dumpe2fs -h {dev}: no block size in its output") from None
    text = _run(["debugfs", "-R", f"stat <{ino}>", dev])
    # "(0-11):553-564, (IND):565, (12-1035):566-1589" (a block-mapped
    # journal: its indirect blocks, written only by mkfs, are left out) or
    # "(0-4095):65536-69631" (extents; "(ETB0):n", an index block, too)
    body = text.split("BLOCKS:", 1)[-1].split("EXTENTS:", 1)[-1]
    out = []
    for lo, lo_end, ph, ph_end in _RUN.findall(body):
        n = int(lo_end or lo) - int(lo) + 1
        if ph_end and int(ph_end) - int(ph) + 1 != n:
            raise JournalError(f"debugfs -R 'stat <{ino}>' {dev}: a run of {n} logical blocks "
                               f"at {ph}-{ph_end}")
        out.append((int(lo) * bs, int(ph) * bs, n * bs))
    if not out:
        raise JournalError(f"debugfs -R 'stat <{ino}>' {dev}: no blocks in its output: "
                           f"{text[-120:]!r}")
    return ino, out


def xfs_log(dev: str) -> list[tuple[int, int, int]]:
    """[(0, physical bytes, length bytes)] of an xfs internal log; none
    when the log is external."""
    text = _run(["xfs_db", "-r", "-c", "sb 0", "-c",
                 "print logstart logblocks blocksize agblocks agblklog", dev])
    v = {k: int(n) for k, n in re.findall(r"^(\w+) = (\d+)$", text, re.M)}
    need = ("logstart", "logblocks", "blocksize", "agblocks", "agblklog")
    if any(k not in v for k in need):
        raise JournalError(f"xfs_db -r {dev}: no {', '.join(k for k in need if k not in v)} "
                           f"in its output: {text[:120]!r}")
    if v["logstart"] == 0:  # an external log
        return []
    agno, agbno = v["logstart"] >> v["agblklog"], v["logstart"] & ((1 << v["agblklog"]) - 1)
    return [(0, (agno * v["agblocks"] + agbno) * v["blocksize"], v["logblocks"] * v["blocksize"])]


def journal_extents(mount: Mount) -> tuple[int, list[tuple[int, int, int]]]:
    """(journal inode or 0, extents on the file system's own device) of the
    file system mounted at `mount`."""
    bd = mount_block_dev(mount)
    dev = "/dev/" + (bd.part_name or bd.name)
    if not os.path.exists(dev):
        raise JournalError(f"{mount.mount_point}: no device node {dev}")
    try:
        if mount.fs_type in ("ext3", "ext4"):
            return ext_journal(dev)
        if mount.fs_type == "xfs":
            return 0, xfs_log(dev)
    except JournalError as e:
        e.dev = dev
        raise
    return 0, []


def journal_rows(mount_point: str, fs_dev: int, disk_dev: int, part_start: int,
                 capture_id: str) -> list[dict]:
    """extent_maps rows (role fs_journal, phase start) of the journal of the
    file system at mount_point: physical_bytes on the whole disk below, a
    partition's start added, as for nestrace_store rows."""
    m = mount_of(mount_point)
    ino, ext = journal_extents(m)
    return extents_rows(mount_point, m.fs_type, ino, ext, fs_dev, disk_dev, part_start,
                        capture_id)


def extents_rows(mount_point: str, fs_type: str, ino: int, ext, fs_dev: int, disk_dev: int,
                 part_start: int, capture_id: str) -> list[dict]:
    """extent_maps rows of a journal's extents on its file system's device
    (journal_extents, or the agent's guest capture)."""
    return [{"capture_id": capture_id, "phase": "start", "role": "fs_journal",
             "path": f"{mount_point} ({fs_type} {'journal inode %d' % ino if ino else 'log'})",
             "dev": fs_dev, "ino": ino, "logical_bytes": lo, "physical_bytes": ph + part_start,
             "length_bytes": n, "flags": 0, "physical_dev": disk_dev, "cluster_bytes": None}
            for lo, ph, n in ext]


def unknown_warning(mount_point: str, dev: str, why: str) -> str:
    """The warning (without "nestrace: warning: ") for a journal not found."""
    on = f" on {dev}" if dev else ""
    return (f"{mount_point}{on}: where its journal is stays unknown ({why}); "
            "links classes the writes there by their flags")
