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

from nestrace.capture.guestfacts import guest_rows, read_lines, stack_fields
from nestrace.capture.record import device_map_rows
from nestrace.capture.snapshots import btrfs_placed_extents
from nestrace.capture.stack import Stack, guests
from nestrace.errors import StackError
from nestrace.schema import table_schema
from nestrace.store.files import LiveCapture, StoreError, captures, init_store
from nestrace.store.seal import SealResult, seal
from nestrace.store.stream import DecodeState, iter_frames

FORMAT = "nestrace-guest-capture"
VERSION = 1
# how the agent's capture may end without anything having gone wrong
CLEAN_ENDS = ("signal", "duration", "command")


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


def _stack(facts: dict, p: Path) -> Stack:
    """The stack guest.json names: its file system, and those of more
    --guest (more_guests, on partitions of the same disk)."""
    try:
        return Stack(side="guest", **stack_fields(facts["stack"], f"{p}: offset 0"))
    except KeyError:
        raise GuestDirError(f"{p}: offset 0: no stack") from None
    except StackError as e:
        raise GuestDirError(str(e)) from None


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


def _extent_rows(d: Path, stack: Stack, capture_id: str, touched: set[int],
                 problems: list[str], placed: list[dict] = ()) -> list[dict]:
    """extent_maps rows from extents.jsonl, as `record` makes them from
    the same lines (guestfacts.guest_rows); a line that does not parse is
    left out and named (file, offset)."""
    p = d / "extents.jsonl"
    try:
        data = p.read_bytes()
    except OSError as e:
        problems.append(f"{p}: cannot read: {e.strerror}: no extent maps stored")
        return []
    gs = guests(stack)
    rows, more = guest_rows(read_lines(data, str(p), len(gs)), gs, stack.vdisk.kdev,
                            capture_id, touched, placed, str(p))
    problems += more
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
    for mp, part in stack.untraced_mounts:
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
                _extent_rows(d, stack, cid, touched, problems, btrfs_placed_extents(live)),
                schema=table_schema("extent_maps")))
            live.close()
        except (OSError, StoreError) as e:
            live.close()
            shutil.rmtree(live.dir, ignore_errors=True)
            raise GuestDirError(f"{d}: cannot import into {store_p}: {e}") from None
        sealed = seal(store_p, cid)
        # (damage is named in the guest directory's files, not in their copies)
        sealed.problems = [m.replace(str(live.dir), str(d)) for m in sealed.problems]
        return Imported(cid, sealed, problems, facts.get("command_exit"))
    finally:
        live.release()
