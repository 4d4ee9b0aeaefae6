"""The guest side's facts, which the agent alone finds (tracers/guest.c):
a file system's disk and partition, its files' extents at the start and
end of a capture, btrfs's chunk tree, where its journal is.  `record`
asks the agent for them (`nestrace-agent --guest MOUNT --facts WHAT`);
a guest capture the agent made alone holds the same lines (its
extents.jsonl) and `import` reads them here too.  The host file system's
journal comes the same way."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field

from nestrace._paths import agent_path
from nestrace.capture.devices import BlockDev, kdev
from nestrace.capture.extents import BtrfsFileExtent, Chunk, map_extent_rows, placed_extent_rows
from nestrace.errors import StackError

# btrfs block-group type bits -> the profile names extents.btrfs_pieces reads
BTRFS_PROFILES = ((1 << 3, "RAID0"), (1 << 4, "RAID1"), (1 << 5, "DUP"), (1 << 6, "RAID10"),
                  (1 << 7, "RAID5"), (1 << 8, "RAID6"), (1 << 9, "RAID1C3"),
                  (1 << 10, "RAID1C4"))


def agent_facts(mounts: list[str], what: str, inodes: set[int] | None = None) -> bytes:
    """What `nestrace-agent --guest M... --facts WHAT` prints: stack, start,
    end (the files whose inodes are given) or journal.  The agent's error
    is a StackError of its one line."""
    args = [str(agent_path())]
    for m in mounts:
        args += ["--guest", m]
    stdin = "\n".join(map(str, sorted(inodes or ()))) if what == "end" else ""
    try:
        p = subprocess.run(args + ["--facts", what], input=stdin.encode(), capture_output=True,
                           timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StackError(f"{args[0]} --facts {what}: {e}") from None
    lines = p.stderr.decode(errors="replace").splitlines()
    for line in lines:
        if "warning:" in line and p.returncode == 0:
            print(line.replace("nestrace-agent: ", "nestrace: ", 1), file=sys.stderr)
    if p.returncode:
        why = next((x for x in reversed(lines) if "warning:" not in x),
                   f"exit code {p.returncode}")
        raise StackError(why.removeprefix("nestrace-agent: ").removeprefix("--guest "))
    return p.stdout


def guest_fields(g: dict) -> dict:
    """One guest file system's Stack fields from the agent's object."""
    return {"guest_mount": g["mount"], "guest_fs": g["fs"],
            "guest_kdev": kdev(g["fs_major"], g["fs_minor"]),
            "guest_block_bytes": g["fs_block_bytes"],
            "guest_part_start_bytes": g["part_start_bytes"],
            "guest_part_size_bytes": g.get("part_size_bytes", 0),
            "guest_base_kdev": kdev(g.get("base_major", 0), g.get("base_minor", 0)),
            "guest_btrfs_devid": int(g.get("btrfs_devid") or 0)}


def stack_fields(g: dict, where: str) -> dict:
    """The Stack fields of the agent's stack object (--facts stack, or a
    guest capture's guest.json "stack"): the first file system's, its disk
    (vdisk), the others (more_guests), the disk's untraced mounts."""
    try:
        vdisk = BlockDev(g["disk_name"], g["disk_major"], g["disk_minor"], g["size_sectors"],
                         g["logical_block_bytes"], part_name=g["part_name"],
                         part_start_bytes=g["part_start_bytes"],
                         part_size_sectors=g.get("part_size_bytes", 0) // 512)
        more = g.get("more_guests") or []
        if not (isinstance(more, list) and all(isinstance(m, dict) for m in more)):
            raise StackError(f"{where}: stack.more_guests is not a list of file systems")
        untraced = g.get("untraced_mounts") or []
        if not (isinstance(untraced, list) and all(
                isinstance(x, list) and len(x) == 2 and all(isinstance(s, str) for s in x)
                for x in untraced)):
            raise StackError(f"{where}: stack.untraced_mounts is not a list of "
                             "[mount point, partition]")
        return {"vdisk": vdisk, **guest_fields(g), "more_guests": [guest_fields(m) for m in more],
                "untraced_mounts": [list(x) for x in untraced]}
    except (KeyError, TypeError) as e:
        raise StackError(f"{where}: the stack lacks {e}") from None


def _chunk(c: list) -> Chunk:
    logical, length, typ, stripe_len, sub_stripes, stripes = c
    profile = next((name for bit, name in BTRFS_PROFILES if int(typ) & bit), "single")
    return Chunk(int(logical), int(length), profile, int(stripe_len), max(1, int(sub_stripes)),
                 [(int(devid), int(off)) for devid, off in stripes])


@dataclass
class Lines:
    """The agent's fact lines, read: files' extents (file system index,
    phase, inode, path, FIEMAP extents, btrfs compressed extents), chunk
    trees by (file system, phase), journals by file system, the snapshot
    counts, and each line that did not parse (named by offset)."""
    files: list[tuple] = field(default_factory=list)
    chunks: dict[tuple[int, str], list[Chunk]] = field(default_factory=dict)
    journals: list[tuple[int, dict]] = field(default_factory=list)
    journal_errors: list[tuple[int, str, str]] = field(default_factory=list)
    truncated: bool = False
    problems: list[str] = field(default_factory=list)


def read_lines(data: bytes, where: str, nfs: int) -> Lines:
    """Parse the agent's fact lines (`where`: their file, for the problems
    said); `nfs`: how many file systems the stack has."""
    out = Lines()
    off = 0
    for line in data.splitlines(keepends=True):
        at, off = off, off + len(line)
        if not line.strip():
            continue
        try:
            f = json.loads(line.decode("utf-8", errors="replace"))
            if "snapshot" in f:
                out.truncated |= bool(f.get("truncated"))
                continue
            phase = f["phase"]
            if phase not in ("start", "end"):
                raise ValueError(f"phase {phase!r}")
            k = f.get("fs", 0)
            if not (isinstance(k, int) and 0 <= k < nfs):
                raise ValueError(f"fs {k!r}: the stack names {nfs} file system(s)")
            if "btrfs_chunks" in f:
                out.chunks[k, phase] = sorted((_chunk(c) for c in f["btrfs_chunks"]),
                                              key=lambda c: c.logical)
            elif "journal_error" in f:
                out.journal_errors.append((k, str(f.get("journal_dev", "")),
                                           str(f["journal_error"])))
            elif "journal" in f:
                j = f["journal"]
                out.journals.append((k, {"ino": int(j["ino"]), "extents": [
                    (int(lo), int(ph), int(n)) for lo, ph, n in j["extents"]]}))
            else:
                # (a btrfs file's compressed extents: their disk length,
                # from the extent items)
                z = {int(o): BtrfsFileExtent(int(o), int(n), int(b), int(dn), 0, 1)
                     for o, n, b, dn in f.get("compressed", [])}
                out.files.append((k, phase, int(f["ino"]), str(f["path"]), [
                    (int(lo), int(ph), int(ln), int(fl)) for lo, ph, ln, fl in f["extents"]], z))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            out.problems.append(f"{where}: offset {at}: not a file's extents ({e}): left out")
    return out


def journal_rows(mount_point: str, fs_type: str, ino: int, ext, fs_dev: int, disk_dev: int,
                 part_start: int, capture_id: str) -> list[dict]:
    """extent_maps rows (role fs_journal, phase start) of a journal's
    extents on its file system's device: physical_bytes on the whole disk
    below, a partition's start added."""
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


def guest_rows(lines: Lines, gs: list, vdisk_kdev: int, capture_id: str,
               touched: set[int] | None, placed: list[dict] = (),
               where: str = "") -> tuple[list[dict], list[str]]:
    """extent_maps rows of the guest file systems from the agent's lines,
    and the problems met: each file's extents (role guest_file; on btrfs
    mapped through its phase's chunk tree onto the virtual disk), where
    the journals are (role fs_journal; a warning when the agent could not
    tell), and placed: a btrfs's ordered and looked-up extents
    (snapshots.btrfs_placed_extents), mapped through the end snapshot's
    chunk tree into rows of phase `events`.  An end snapshot keeps the
    files in `touched` (None: all).  gs: the stack's file systems
    (stack.guests), vdisk_kdev: their disk."""
    rows: list[dict] = []
    problems = list(lines.problems)
    for k, dev, why in lines.journal_errors:
        problems.append(unknown_warning(gs[k].guest_mount, dev, why))
    for k, j in lines.journals:
        g = gs[k]
        rows += journal_rows(g.guest_mount, g.guest_fs, j["ino"], j["extents"], g.guest_kdev,
                             vdisk_kdev, g.guest_part_start_bytes, capture_id)
    vdisk = BlockDev("", vdisk_kdev >> 20, vdisk_kdev & 0xFFFFF, 0, 512)
    for k, g in enumerate(gs):
        devices = {g.guest_btrfs_devid: vdisk} if g.guest_btrfs_devid else None
        for fk, phase, ino, path, exts, z in lines.files:
            if fk != k or phase == "end" and touched is not None and ino not in touched:
                continue
            if devices and (k, phase) not in lines.chunks:
                problems.append(f"{where}: no btrfs chunk tree for the {phase} snapshot: "
                                f"{path}'s extents left out")
                continue
            rows += map_extent_rows(exts, path, g.guest_kdev, ino, "guest_file", phase,
                                    capture_id, vdisk_kdev, lines.chunks.get((k, phase)),
                                    devices, z)
        mine = [r for r in placed if r["dev"] == g.guest_kdev] if devices else []
        tree = lines.chunks.get((k, "end")) or lines.chunks.get((k, "start"))
        if mine and not tree:
            problems.append(f"{where}: no btrfs chunk tree: the {len(mine)} places btrfs gave "
                            f"{g.guest_mount}'s file data during the capture left out")
            mine = []
        paths = {ino: path for fk, phase, ino, path, *_ in lines.files if fk == k}
        rows += placed_extent_rows(
            [(r, paths.get(r["ino"], f"{g.guest_mount} (inode {r['ino']})")) for r in mine],
            "guest_file", capture_id, vdisk_kdev, tree, devices)
    return rows, problems
