"""`nestrace import DIR`: a guest capture the agent made alone
(`nestrace-agent --guest MOUNT --guest-capture DIR -- CMD`), in a VM
without nestrace's Python, turned into a capture of a store, the same as
`nestrace record --side guest` makes.

DIR holds what the agent wrote: the record tables as Arrow IPC streams
(`<table>.arrows`), its start and end metadata frames (`agent.stream`),
the file system's extent snapshots (`extents.jsonl`, a line per file and
phase, and one for where its journal is) and the stack and the run's facts
(`guest.json`)."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from nestrace.capture.devices import BlockDev, kdev
from nestrace.capture.extents import BtrfsFileExtent, Chunk, map_extent_rows
from nestrace.capture.fsjournal import extents_rows, unknown_warning
from nestrace.capture.record import device_map_rows
from nestrace.capture.snapshots import btrfs_placed_extents, placed_extent_rows
from nestrace.capture.stack import Stack, guests
from nestrace.schema import table_schema
from nestrace.store.files import LiveCapture, StoreError, captures, init_store
from nestrace.store.seal import SealResult, seal
from nestrace.store.stream import DecodeState, iter_frames

FORMAT = "nestrace-guest-capture"
VERSION = 1
# how the agent's capture may end without anything having gone wrong
CLEAN_ENDS = ("signal", "duration", "command")
# btrfs block-group type bits -> the profile names extents.btrfs_pieces reads
BTRFS_PROFILES = ((1 << 3, "RAID0"), (1 << 4, "RAID1"), (1 << 5, "DUP"), (1 << 6, "RAID10"),
                  (1 << 7, "RAID5"), (1 << 8, "RAID6"), (1 << 9, "RAID1C3"),
                  (1 << 10, "RAID1C4"))


class GuestDirError(ValueError):
    pass


@dataclass
class Imported:
    capture_id: str
    seal: SealResult
    problems: list[str] = field(default_factory=list)
    command_exit: int | None = None


def is_guest_dir(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "guest.json").is_file()


def _facts(d: Path) -> dict:
    p = d / "guest.json"
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
        facts = json.loads(text)
    except OSError as e:
        raise GuestDirError(f"{p}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise GuestDirError(f"{p}: offset {e.pos}: not JSON: {e.msg}") from None
    if not isinstance(facts, dict) or facts.get("format") != FORMAT:
        raise GuestDirError(f"{p}: offset 0: not a guest capture of nestrace-agent "
                            f"(format {facts.get('format') if isinstance(facts, dict) else None!r})")
    if facts.get("version") != VERSION:
        raise GuestDirError(f"{p}: offset 0: guest capture version {facts.get('version')!r}; "
                            f"this nestrace reads version {VERSION}")
    return facts


def _guest_fields(g: dict) -> dict:
    """One guest file system's Stack fields from its guest.json object."""
    return {"guest_mount": g["mount"], "guest_fs": g["fs"],
            "guest_kdev": kdev(g["fs_major"], g["fs_minor"]),
            "guest_block_bytes": g["fs_block_bytes"],
            "guest_part_start_bytes": g["part_start_bytes"],
            # (not said by older agents: 0)
            "guest_part_size_bytes": g.get("part_size_bytes", 0),
            # an overlay: the file system of its layers (older agents
            # refused an overlay and do not say it)
            "guest_base_kdev": kdev(g.get("base_major", 0), g.get("base_minor", 0))}


def _stack(facts: dict, p: Path) -> Stack:
    """The stack guest.json names: its file system, and those of more
    --guest (more_guests, on partitions of the same disk)."""
    try:
        g = facts["stack"]
        vdisk = BlockDev(g["disk_name"], g["disk_major"], g["disk_minor"], g["size_sectors"],
                         g["logical_block_bytes"], part_name=g["part_name"],
                         part_start_bytes=g["part_start_bytes"])
        more = g.get("more_guests") or []
        if not (isinstance(more, list) and all(isinstance(m, dict) for m in more)):
            raise GuestDirError(f"{p}: offset 0: stack.more_guests is not a list of file "
                                "systems")
        return Stack(vdisk=vdisk, side="guest", **_guest_fields(g),
                     more_guests=[_guest_fields(m) for m in more])
    except (KeyError, TypeError) as e:
        raise GuestDirError(f"{p}: offset 0: the stack lacks {e}") from None


def _devids(facts: dict) -> list[int]:
    """Each guest file system's btrfs device id (0: not a btrfs)."""
    g = facts["stack"]
    return [int(x.get("btrfs_devid") or 0) for x in [g, *(g.get("more_guests") or [])]]


def _agent_meta(d: Path) -> tuple[dict, dict | None, list[str]]:
    """The agent's start and end frames (the end is missing when the agent
    was killed), and the problems met reading them."""
    p = d / "agent.stream"
    state = DecodeState(str(p))
    start = end = None
    try:
        with open(p, "rb") as f:
            for fr in iter_frames(f, str(p), state):
                if fr.meta is None:
                    continue
                if fr.meta.get("type") == "start":
                    start = fr.meta
                elif fr.meta.get("type") == "end":
                    end = fr.meta
                    if end.get("reason") not in CLEAN_ENDS:
                        state.problems.append(f"{p}: offset {fr.offset}: the agent stopped "
                                              f"early: {end.get('reason')}; the capture ends there")
    except OSError as e:
        raise GuestDirError(f"{p}: cannot read: {e.strerror}") from None
    if start is None:
        raise GuestDirError(f"{p}: offset 0: no start frame: the agent never began tracing "
                            "(its error is on the terminal it ran on)")
    if end is None:
        state.problems.append(f"{p}: offset {p.stat().st_size}: no end frame: the agent did "
                              "not end cleanly (killed?); its records so far are kept")
    return start, end, [str(x) for x in state.problems]


def _chunk(c: list) -> Chunk:
    logical, length, typ, stripe_len, sub_stripes, stripes = c
    profile = next((name for bit, name in BTRFS_PROFILES if int(typ) & bit), "single")
    return Chunk(int(logical), int(length), profile, int(stripe_len), max(1, int(sub_stripes)),
                 [(int(devid), int(off)) for devid, off in stripes])


def _extent_rows(d: Path, stack: Stack, devids: list[int], capture_id: str, touched: set[int],
                 problems: list[str], placed: list[dict] = ()) -> list[dict]:
    """extent_maps rows from extents.jsonl (on btrfs, mapped through the
    phase's chunk tree, as `record` maps them), and where the file
    system's journal is (as `record` finds it; a warning when the agent
    could not).  A line that does not
    parse is left out and named (file, offset); the end snapshot keeps the
    files the capture touched (as `record` does).  placed: a btrfs's
    ordered and looked-up extents (record.btrfs_placed_extents), mapped through the end
    snapshot's chunk tree into rows of phase `events`, as `record` does
    (btrfs_placed_rows).  Each line is of the file system its "fs" says
    (the index of its --guest; 0 when not said), devids[k] its btrfs
    device id (0: not a btrfs)."""
    gs = guests(stack)
    p = d / "extents.jsonl"
    rows: list[dict] = []
    try:
        data = p.read_bytes()
    except OSError as e:
        problems.append(f"{p}: cannot read: {e.strerror}: no extent maps stored")
        return rows
    files, chunks = [], {}
    off = 0
    for line in data.splitlines(keepends=True):
        at, off = off, off + len(line)
        if not line.strip():
            continue
        try:
            f = json.loads(line.decode("utf-8", errors="replace"))
            phase = f["phase"]
            if phase not in ("start", "end"):
                raise ValueError(f"phase {phase!r}")
            k = f.get("fs", 0)
            if not (isinstance(k, int) and 0 <= k < len(gs)):
                raise ValueError(f"fs {k!r}: guest.json names {len(gs)} file system(s)")
            g = gs[k]
            if "btrfs_chunks" in f:
                chunks[k, phase] = sorted((_chunk(c) for c in f["btrfs_chunks"]),
                                          key=lambda c: c.logical)
                continue
            if "journal_error" in f:
                problems.append(unknown_warning(g.guest_mount, str(f.get("journal_dev", "")),
                                                str(f["journal_error"])))
                continue
            if "journal" in f:
                j = f["journal"]
                rows += extents_rows(g.guest_mount, g.guest_fs, int(j["ino"]),
                                     [(int(lo), int(ph), int(n)) for lo, ph, n in j["extents"]],
                                     g.guest_kdev, stack.vdisk.kdev,
                                     g.guest_part_start_bytes, capture_id)
                continue
            # (a btrfs file's compressed extents: their disk length, from the
            # extent items, as `record` takes it)
            z = {int(o): BtrfsFileExtent(int(o), int(n), int(b), int(dn), 0, 1)
                 for o, n, b, dn in f.get("compressed", [])}
            files.append((k, phase, int(f["ino"]), str(f["path"]),
                          [(int(lo), int(ph), int(ln), int(fl)) for lo, ph, ln, fl in f["extents"]],
                          z))
        except (ValueError, KeyError, TypeError) as e:
            problems.append(f"{p}: offset {at}: not a file's extents ({e}): left out")
    for k, g in enumerate(gs):
        devid = devids[k] if k < len(devids) else 0
        devices = {devid: stack.vdisk} if devid else None
        for fk, phase, ino, path, exts, z in files:
            if fk != k or phase == "end" and ino not in touched:
                continue
            if devid and (k, phase) not in chunks:
                problems.append(f"{p}: no btrfs chunk tree for the {phase} snapshot: "
                                f"{path}'s extents left out")
                continue
            rows += map_extent_rows(exts, path, g.guest_kdev, ino, "guest_file", phase,
                                    capture_id, stack.vdisk.kdev, chunks.get((k, phase)),
                                    devices, z)
        mine = [r for r in placed if r["dev"] == g.guest_kdev] if devid else []
        tree = chunks.get((k, "end")) or chunks.get((k, "start"))
        if mine and not tree:
            problems.append(f"{p}: no btrfs chunk tree: the {len(mine)} places btrfs gave "
                            f"{g.guest_mount}'s file data during the capture left out")
            mine = []
        paths = {ino: path for fk, phase, ino, path, *_ in files if fk == k}
        rows += placed_extent_rows(
            [(r, paths.get(r["ino"], f"{g.guest_mount} (inode {r['ino']})")) for r in mine],
            "guest_file", capture_id, stack.vdisk.kdev, tree, devices)
    return rows


def capture_id_of(facts: dict) -> str:
    """The same id each time DIR is imported: its start time and a hash of
    the machine and that time."""
    start = facts.get("start_wall") or ""
    try:
        t = _dt.datetime.fromisoformat(start).astimezone(_dt.timezone.utc)
        stamp = t.strftime("%Y%m%dT%H%M%S")
    except ValueError:
        stamp = "guest"
    h = hashlib.sha256(f"{facts.get('machine')}|{start}".encode()).hexdigest()[:4]
    return f"{stamp}-{h}"


def import_guest_dir(d: str | Path, store: str | Path, capture_id: str | None = None) -> Imported:
    d = Path(d)
    facts = _facts(d)
    stack = _stack(facts, d / "guest.json")
    start, end, problems = _agent_meta(d)
    # (older agents do not say)
    untraced = facts["stack"].get("untraced_mounts") or []
    if not (isinstance(untraced, list) and all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(s, str) for s in x)
            for x in untraced)):
        raise GuestDirError(f"{d / 'guest.json'}: offset 0: stack.untraced_mounts is not a "
                            "list of [mount point, partition]")
    for mp, part in untraced:
        problems.append(f"{d / 'guest.json'}: the virtual disk {stack.vdisk.name} also held "
                        f"{mp} ({part}), not traced: its requests are in vdisk_io, "
                        "unattributed (links kind 'other', or 'metadata', 'readahead' by "
                        "their flags)")
    cid = capture_id or capture_id_of(facts)
    store_p = init_store(store)
    if cid in captures(store_p):
        raise GuestDirError(f"{store_p}: already holds capture {cid} (imported before?)")
    live = LiveCapture(store_p, cid, recording=True)   # (nestrace seal leaves it alone)
    try:
        try:
            for src in sorted(d.glob("*.arrows")):
                shutil.copyfile(src, live.dir / src.name)
            machine = facts.get("machine") or ""
            live.update_facts(
                machine=machine, kernel=facts.get("kernel", ""), start_wall=facts.get("start_wall", ""),
                command=facts.get("command", ""), stack=stack.to_json(),
                settings={"agent_only": True, "guest_capture": str(d.resolve()),
                          "agent_cpus": facts.get("agent_cpus"),
                          "store_traced_at": facts.get("store_traced_at"),
                          "start_snapshot_truncated": facts.get("files_start_truncated"),
                          "pid": facts.get("pid"), "cgroup": facts.get("cgroup")},
                agent_start=start, start_ns=start.get("start_ns", 0),
                **({"agent_end": end, "end_ns": end.get("end_ns", 0)} if end else {}),
                **({"command_exit": facts["command_exit"]}
                   if facts.get("command_exit") is not None else {}))
            live.write_table("device_map", pa.Table.from_pylist(
                device_map_rows(stack, cid, machine), schema=table_schema("device_map")))
            touched = live.unique_values("vfs_events", "ino") | \
                live.unique_values("pagecache_events", "ino")
            live.write_table("extent_maps", pa.Table.from_pylist(
                _extent_rows(d, stack, _devids(facts), cid, touched, problems,
                             btrfs_placed_extents(live)),
                schema=table_schema("extent_maps")))
            live.close()
        except (OSError, StoreError) as e:
            live.close()
            shutil.rmtree(live.dir, ignore_errors=True)
            raise GuestDirError(f"{d}: cannot import into {store_p}: {e}") from None
        return Imported(cid, seal(store_p, cid), problems, facts.get("command_exit"))
    finally:
        live.release()
