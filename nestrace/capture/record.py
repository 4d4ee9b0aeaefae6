"""Record a capture of a nested stack: run the agent, stream its records
into the store, snapshot extent maps at start and end, seal."""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from nestrace.capture import memlimit, netmount
from nestrace.capture.agent import agent_args, agent_cpus, cgroup_dir, side_families
from nestrace.capture.devices import queue_kb
from nestrace.capture.snapshots import (
    btrfs_placed_extents,
    btrfs_placed_rows,
    host_journal_rows,
    neighbor_images,
    neighbor_rows,
    snapshot_extents,
    store_extents,
)
from nestrace.capture.stack import Stack, guests, traced_at
from nestrace.capture.status import StatusLines
from nestrace.capture.workload import check_command, run_workload, wait_for_stop, workload_line
from nestrace.errors import RecordError
from nestrace.schema import table_schema
from nestrace.store.files import LiveCapture, StoreError, init_store
from nestrace.store.seal import SealResult, seal
from nestrace.store.stream import DecodeState, StreamError, iter_frames


def new_capture_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)


def device_map_rows(stack: Stack, capture_id: str, machine: str) -> list[dict]:
    """The levels this machine sees of the stack (all four, or one side's two)."""
    def row(level, dev, name, size=0, bd=None, fs="", bs=0, part=0):
        return {"capture_id": capture_id, "level": level, "dev": dev, "name": name,
                "size_sectors": size,
                "backing_dev": bd.backing_kdev if bd else 0,
                "backing_ino": bd.backing_ino if bd else 0,
                "backing_path": bd.backing_file if bd else "",
                "backing_offset_bytes": bd.backing_offset_bytes if bd else 0,
                "dio": bd.dio if bd else False,
                # a loop device reads its backing file as a raw image
                "backing_format": "raw" if bd and level == "vdisk" else None,
                "fs_type": fs, "block_size_bytes": bs, "part_start_bytes": part,
                "machine": machine}
    v = stack.vdisk
    rows = []
    if stack.has_guest:
        # a guest's loop device is the lab's virtual disk: its backing file
        # is the image only when this kernel also sees the host side
        vb = v if v and v.is_loop and stack.has_host else None
        # (an overlay: the file system of its layers as its backing_dev)
        rows += [row("vfs", g.guest_kdev, g.guest_mount,
                     g.guest_part_size_bytes // 512, fs=g.guest_fs,
                     bs=g.guest_block_bytes, part=g.guest_part_start_bytes)
                 | ({"backing_dev": g.guest_base_kdev} if g.guest_base_kdev else {})
                 for g in guests(stack)]
        if v:           # (a gateway has none: the guest's files are on the network mount)
            rows += [row("vdisk", v.kdev, v.name, v.size_sectors, vb, bs=v.logical_block_bytes)]
        if vb and stack.net:     # (its bytes are the server's file: the one traced)
            rows[-1].update(backing_dev=stack.host_kdev, backing_ino=stack.image_ino)
    if stack.net:       # (a guest side: its server not this machine, the chain stops there)
        n = stack.net
        rows += [row("netfs", n["kdev"], n["mount_point"], fs=n["fs_type"])
                 | {"backing_path": n["source"]}]
    if stack.has_host and not stack.raw_host:   # (raw: no host FS, the disk right below)
        rows += [row("hostfs", stack.host_kdev, stack.host_mount,
                     stack.host_part_size_bytes // 512, fs=stack.host_fs,
                     bs=stack.host_block_bytes, part=stack.host_part_start_bytes)]
    if stack.has_host:
        rows += [row("disk", d.kdev, d.name, d.size_sectors, d if d.is_loop else None,
                     bs=d.logical_block_bytes) for d in stack.disks]
    return rows


@dataclass
class Capture:
    store: Path
    capture_id: str
    seal: SealResult | None = None
    agent_stderr: list[str] = field(default_factory=list)
    stream_problems: list[str] = field(default_factory=list)
    command_rc: int | None = None
    # the agent's last status line (record(status=...)): counts since the
    # start, as StatusLines.parse gives them
    status_last: dict | None = None
    max_size_reached: bool = False
    # why the network hop went away during the capture (it ended there)
    net_lost: str | None = None


def _warn_stack(stack: Stack, store_p: Path, store_level: str | None, log) -> None:
    """Say what of the capture is not the workload's: the store's own
    writes, the other file systems of the virtual disk."""
    if store_level:
        where = {"vfs": "at every level", "vdisk": "from the virtual disk down"}.get(
            store_level, "at the host disk")
        log(f"nestrace: warning: the store {store_p} is on the traced stack: nestrace's own "
            f"writes to it (the agent's batches, comm nestrace-agent) are traced {where}"
            "; a store off the stack (another disk, a tmpfs) leaves them out")
    others = stack.untraced_mounts if stack.has_guest else []
    if others:
        one = len(others) == 1
        log(f"nestrace: warning: the virtual disk {stack.vdisk.name} also holds "
            + ", ".join(f"{mp} ({part})" for mp, part in others)
            + f", not traced: {'its' if one else 'their'} requests are in "
            f"vdisk_io, unattributed (links kind "
            f"'other', or 'metadata', 'readahead' by their flags); give --stack for "
            f"{'it' if one else 'each'} too to trace {'it' if one else 'them'} as well")


def _start_facts(live: LiveCapture, stack: Stack, cid: str, settings: dict,
                 command_line: str, log) -> list[str]:
    """The capture's facts and snapshots at its start: machine, stack,
    device map, extent maps, journals, neighbor images (returned)."""
    machine = socket.gethostname()
    start_extents, start_truncated = snapshot_extents(stack, cid, "start")
    settings["start_snapshot_truncated"] = start_truncated
    live.update_facts(machine=machine, kernel=platform.release(),
                      start_wall=_dt.datetime.now(_dt.timezone.utc).isoformat(),
                      command=command_line, stack=stack.to_json(), settings=settings)
    live.write_table("device_map", pa.Table.from_pylist(device_map_rows(stack, cid, machine),
                                                         schema=table_schema("device_map")))
    live.write_table("extent_maps", start_extents)
    live.write_table("extent_maps", pa.Table.from_pylist(
        host_journal_rows(stack, cid, log), schema=table_schema("extent_maps")))
    neighbors = neighbor_images(stack)
    if neighbors:
        log(f"nestrace: the host FS also holds {len(neighbors)} other virtual disk image(s) "
            f"in use ({', '.join(neighbors[:3])}{', ...' if len(neighbors) > 3 else ''}): "
            "host-disk writes into them are classed other")
        live.write_table("extent_maps", pa.Table.from_pylist(
            neighbor_rows(stack, neighbors, "start", cid), schema=table_schema("extent_maps")))
    return neighbors


def _end_facts(live: LiveCapture, stack: Stack, cid: str, neighbors: list[str],
               store_level: str | None) -> None:
    """The snapshots at the capture's end: the files it touched, the
    neighbor images, where btrfs placed bytes, the store's own files."""
    # files read or written by system calls, and by memory (page faults
    # and dirtied pages of mapped files: page-cache events)
    touched = live.unique_values("vfs_events", "ino") | live.unique_values("pagecache_events", "ino")
    # (a gateway: the exported files the server touched)
    served = live.unique_values("hostfs_events", "ino") if stack.gateway else None
    end, _ = snapshot_extents(stack, cid, "end", touched, btrfs_placed_extents(live), served)
    live.write_table("extent_maps", end)
    if neighbors:
        live.write_table("extent_maps", pa.Table.from_pylist(
            neighbor_rows(stack, neighbors, "end", cid), schema=table_schema("extent_maps")))
    live.write_table("extent_maps", pa.Table.from_pylist(
        btrfs_placed_rows(stack, cid, live), schema=table_schema("extent_maps")))
    if store_level in ("vdisk", "disk"):    # (on the guest FS: guest files, tied at vfs)
        live.write_table("extent_maps", pa.Table.from_pylist(
            store_extents(live.dir, cid), schema=table_schema("extent_maps")))


class _AgentRun:
    """The agent writing the record tables into the live directory itself
    (Arrow IPC, one batch per flush), its stdout carrying the start and end
    metadata and its stderr the status lines: no Python touches a record
    while the workload runs."""

    def __init__(self, args: list[str], live: LiveCapture, cap: Capture, stack: Stack,
                 pin: set[int] | None, log):
        self.live, self.cap, self.log = live, cap, log
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     pass_fds=(live.lock_fd,),   # it holds the capture's lock too
                                     preexec_fn=(lambda: os.sched_setaffinity(0, pin))
                                     if pin else None)
        self.started = threading.Event()
        self.began = False     # (the agent's start frame came: it traces)
        self.state = DecodeState("agent stream")
        self.reader_error: list[BaseException] = []
        self.reached: list[int] = []
        self.net_lost: list[tuple[int, str]] = []     # (CLOCK_MONOTONIC ns, why)
        self.lines = StatusLines(stack)
        self.threads = [threading.Thread(target=self._read_stream, daemon=True),
                        threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self.threads:
            t.start()
        self.started.wait(60)

    def _read_stream(self) -> None:
        try:
            for fr in iter_frames(self.proc.stdout, "agent stream", self.state):
                if fr.meta is not None:
                    kind = fr.meta.get("type")
                    if kind == "start":
                        self.live.update_facts(agent_start=fr.meta, start_ns=fr.meta["start_ns"])
                        self.began = True
                        self.started.set()
                    elif kind == "end":
                        if fr.meta.get("reason") not in ("signal", "duration"):
                            self.state.problems.append(StreamError(
                                "agent stream", fr.offset, "the agent stopped early: "
                                f"{fr.meta.get('reason')}; the capture ends there"))
                        self.live.update_facts(agent_end=fr.meta, end_ns=fr.meta["end_ns"])
                    continue
                self.state.problems.append(StreamError(
                    "agent stream", fr.offset, f"unexpected {fr.table} records on the "
                    "metadata stream (records go to the live directory); not stored"))
        except BaseException as e:  # surfaced by the main thread
            self.reader_error.append(e)
        finally:
            self.started.set()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            text = line.decode(errors="replace").rstrip()
            shown = self.lines.text(text)
            if shown is not None:        # (not kept: one a second over a long run)
                self.cap.status_last = self.lines.last
                self.log(shown)
                continue
            self.cap.agent_stderr.append(text)
            if "WARNING" in text or "failed" in text or "cannot" in text:
                self.log(text)

    def watch_size(self, max_bytes: int, command: bool) -> None:
        """SIGINT the agent once the live records hold max_bytes."""
        def watch() -> None:
            while self.proc.poll() is None:
                n = live_bytes(self.live.dir)
                if n >= max_bytes:
                    self.reached.append(n)
                    self.log(f"nestrace: the capture reached --max-size "
                             f"{max_bytes / (1 << 20):.1f} MiB ({n / (1 << 20):.1f} MiB of "
                             "records): tracing stopped"
                             + ("; the workload goes on" if command else ""))
                    self.proc.send_signal(signal.SIGINT)
                    return
                time.sleep(0.2)
        self.threads.append(threading.Thread(target=watch, daemon=True))
        self.threads[-1].start()

    def watch_net(self, net: dict) -> None:
        """SIGINT the agent once the network hop `net` is gone: the
        capture ends there (its records, those of the hop's last
        requests with them, are kept), and the workload goes on to its
        own end, its calls on the mount failing."""
        def watch() -> None:
            while self.proc.poll() is None and not self.net_check(net):
                time.sleep(0.2)
        self.threads.append(threading.Thread(target=watch, daemon=True))
        self.threads[-1].start()

    def net_check(self, net: dict) -> bool:
        """Whether the network hop `net` is gone (said once, and the agent
        stopped)."""
        why = netmount.gone(net)
        if why and not self.net_lost:
            self.net_lost.append((time.monotonic_ns(), why))
            self.log(f"nestrace: the network mount went away during the capture: {why} "
                     f"(from {net['source']}): tracing stopped; the capture ends there and "
                     "is sealed")
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
        return bool(why)

    def exited_early(self) -> bool:
        """The agent ended before tracing (its stream read without error).
        Its stream can end before the process is reaped: a stream that
        ended with no start frame waits for its exit."""
        if self.reader_error:
            return False
        if not self.began:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        if self.proc.poll() is None:
            return False
        self.threads[1].join(5)
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self.threads:
            t.join(60)


def _discard(live: LiveCapture) -> None:
    """A capture that recorded nothing worth keeping: its live directory goes."""
    try:
        live.close()
    finally:
        shutil.rmtree(live.dir, ignore_errors=True)
        try:
            live.dir.parent.rmdir()
        except OSError:
            pass


def record(store: str | os.PathLike, stack: Stack, *, duration: float | None = None,
           command: list[str] | None = None, ringbuf_kb: int | None = None,
           flush_ms: int | None = None, all_hooks: bool = False,
           mode: str = "auto", families: str | None = None, cpus: str = "auto",
           pid: int | None = None, cgroup: str | None = None, cwd: str | None = None,
           env: dict[str, str] | None = None, status: float = 0, max_bytes: int | None = None,
           workload=None, redact: bool = False, before_tracing=None,
           memory: int | None = None, per_request: bool | str = False,
           log=lambda msg: print(msg, file=sys.stderr)) -> Capture:
    """Trace `stack` while `command` runs (or for `duration` seconds, or
    until SIGINT), into a new capture of `store`.  `pid`: the vfs level
    sees only that process (its threads included); `cgroup`: only the
    tasks of that cgroup v2 directory and of those below it (with `pid`:
    that process, while it is in the cgroup); the lower levels see every
    I/O on the stack.  `cwd`, `env`: the command's.  `status`: log
    a line of rates per level this often, in seconds (0: none; see
    StatusLines).  `max_bytes`: stop tracing once the live record files
    hold this many bytes (checked every 0.2 s); a command goes on to its
    end.  `workload`: one disk's recorder of record_disks, which runs the
    command: a stream of JSON lines from it, the command's at the start,
    its exit status's once the recorder is stopped.  `before_tracing`:
    called once the stack's facts are read, before tracing starts.
    `memory`: run the command in a memory cgroup of that many bytes
    (memlimit); its limit, peak and the times it was reached go into
    settings_json's `memory`.  `per_request`: the block levels as a record
    per request, written at its end (block_request_records), not a record
    per tracepoint hit; "completions": that record read from the kernel's
    request at its completion alone (--from-completions)."""
    if memory is not None:
        if not command:
            raise RecordError("--memory holds CMD's memory: give CMD")
        memlimit.check(memory)
    if pid is not None and not Path(f"/proc/{pid}").is_dir():
        raise RecordError(f"--pid {pid}: no such process")
    if cgroup is not None:
        if not stack.has_guest:
            raise RecordError("--cgroup chooses whose calls the vfs level records: a host "
                              "side has no vfs level")
        cgroup = cgroup_dir(cgroup)
    if command:
        check_command(command[0], cwd, env)
    pin = agent_cpus(cpus)
    if pin and cpus == "auto":
        log(f"nestrace: agent on CPU {','.join(map(str, sorted(pin)))}, away from the disk "
            "interrupts (--agent-cpus all: anywhere)")
    store_p = init_store(store)
    store_level = traced_at(stack, str(store_p))
    _warn_stack(stack, store_p, store_level, log)
    cid = new_capture_id()
    live = LiveCapture(store_p, cid, recording=True)
    try:
        cap = Capture(store_p, cid)
        settings = {"agent_cpus": sorted(pin) if pin else None, "all_hooks": all_hooks,
                    **({"redact": True} if redact else {}),
                    "pid": pid, "cgroup": cgroup, "store_traced_at": store_level,
                    "max_size_bytes": max_bytes,
                    **({"memory": {"limit": memory}} if memory else {}),
                    "read_ahead_kb": _queue_kb(stack, "read_ahead_kb"),
                    "max_sectors_kb": _queue_kb(stack, "max_sectors_kb")}
        neighbors = _start_facts(live, stack, cid, settings, " ".join(command or [])
                                 if workload is None
                                 else workload_line(workload).get("command", ""), log)
        if before_tracing:
            before_tracing()
        args = agent_args(stack, ringbuf_kb, mode, families or side_families(stack), flush_ms,
                          all_hooks, arrow_dir=live.dir, pid=pid,
                          status_ms=round(status * 1000), cgroup=cgroup,
                          per_request=per_request)
        run = _AgentRun(args, live, cap, stack, pin, log)
        if max_bytes:
            run.watch_size(max_bytes, bool(command))
        if stack.net:
            run.watch_net(stack.net)
        if run.exited_early():
            _discard(live)     # (nothing was recorded)
            raise RecordError("the agent exited before tracing: " + (
                " | ".join(cap.agent_stderr[-3:]) or f"exit code {run.proc.returncode}"))
        no_workload = _trace(run, cap, stack, settings, command, duration, cwd, env, memory,
                             log)
        if no_workload:
            _discard(live)
            raise RecordError(f"{command[0]}: could not start: "
                              f"{no_workload[0].strerror or no_workload[0]} (nothing recorded)")
        return _finish(live, run, cap, stack, cid, neighbors, store_level, settings,
                       workload, store_p)
    finally:
        live.release()


def _queue_kb(stack: Stack, what: str) -> dict:
    """A queue setting (KiB) of each traced block level at the start: the
    virtual disk's and the host disk's.  read_ahead_kb: the readahead
    window (the guest FS reads ahead by the virtual disk's, the host FS by
    the host disk's); max_sectors_kb: the largest request."""
    devs = ([("vdisk", stack.vdisk)] if stack.has_guest and stack.vdisk else []) + \
        ([("disk", stack.disk)] if stack.has_host and stack.disk else [])
    return {level: queue_kb(bd, what) for level, bd in devs}


def _trace(run: _AgentRun, cap: Capture, stack: Stack, settings: dict,
           command: list[str] | None, duration: float | None, cwd: str | None,
           env: dict[str, str] | None, memory: int | None, log) -> list[OSError]:
    """Trace while the workload runs (or for `duration`, or until
    stopped), then stop the agent; the error of a workload that could not
    start (nothing worth keeping), in a list.  A network hop's CPU and the
    workload's memory cgroup's facts go into `settings`."""
    no_workload: list[OSError] = []
    hop_cpu = netmount.HopCpu(stack.net) if stack.net else None
    try:
        if command:
            try:
                if memory:
                    with memlimit.limited(memory) as mc:
                        cap.command_rc = run_workload(mc.wrap(command), cwd, env)
                    settings["memory"] = mc.facts()
                    for why in (mc.left, mc.words()):
                        if why:
                            log(f"nestrace: {why}")
                else:
                    cap.command_rc = run_workload(command, cwd, env)
            except OSError as e:    # (it never ran: nothing worth keeping)
                no_workload.append(e)
            except RecordError as e:    # (its cgroup could not be made)
                no_workload.append(OSError(0, str(e)))
        else:
            wait_for_stop(duration, lambda: run.proc.poll() is None, log)
    finally:
        if stack.net and cap.command_rc:    # (a workload failed: its mount gone?)
            for _ in range(10):
                if run.net_check(stack.net):
                    break
                time.sleep(0.05)
        run.stop()
        if hop_cpu:
            settings["net_cpu"] = hop_cpu.done()
    return no_workload


def _finish(live: LiveCapture, run: _AgentRun, cap: Capture, stack: Stack, cid: str,
            neighbors: list[str], store_level: str | None, settings: dict, workload,
            store_p: Path) -> Capture:
    """After tracing: the end facts and snapshots, then seal; a problem
    reading the agent's stream or writing the store is one RecordError
    that says where the live batches are kept."""
    keep = (f"the capture's live batches are kept in {live.dir}: make room, then run "
            f"`nestrace seal {store_p}`")
    if run.reader_error:
        try:
            live.close()
        except StoreError:
            pass                      # the reader's error says it first
        if isinstance(run.reader_error[0], StoreError):
            raise RecordError("; ".join([str(run.reader_error[0])] +
                                        [str(p) for p in run.state.problems] + [keep]))
        raise RecordError(f"reading the agent stream failed: {run.reader_error[0]}")
    cap.stream_problems = [str(p) for p in run.state.problems]
    try:
        try:
            end = {} if workload is None else workload_line(workload)
            rc = cap.command_rc if workload is None else end.get("exit")
            if "memory" in end:
                settings["memory"] = end["memory"]
            if rc is not None:
                live.update_facts(command_exit=rc)
            if run.reached:
                cap.max_size_reached = True
                settings["max_size_reached"] = True
            if run.net_lost:
                cap.net_lost = run.net_lost[0][1]
                settings["net_lost"] = {"ns": run.net_lost[0][0], "why": run.net_lost[0][1]}
            if run.reached or run.net_lost or "net_cpu" in settings or "memory" in settings:
                live.update_facts(settings=settings)
            _end_facts(live, stack, cid, neighbors, store_level)
        finally:
            live.close()
        cap.seal = seal(store_p, cid)
    except StoreError as e:
        raise RecordError("; ".join([str(e)] + cap.stream_problems + [keep])) from None
    return cap


def live_bytes(d: Path) -> int:
    """Bytes of record files in a live capture directory so far."""
    n = 0
    with os.scandir(d) as it:
        for e in it:
            if e.name.endswith(".arrows"):
                try:
                    n += e.stat().st_size
                except FileNotFoundError:
                    pass
    return n
