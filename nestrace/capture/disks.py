"""A capture per virtual disk: record --stack A --stack B on two disks starts
one recorder per disk, runs the command once while all trace, then stops
and seals each."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from nestrace.capture import memlimit
from nestrace.capture.workload import RECORDING, check_command, run_workload, wait_for_stop
from nestrace.errors import RecordError


def _die_with_parent() -> None:
    """(preexec) SIGINT this child when its parent dies: a recorder whose
    `record` was killed stops and seals its capture."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)   # PR_SET_PDEATHSIG


# set for the `nestrace record` of one disk that record_disks runs; its
# stdin gives the workload record_disks runs, in JSON lines: the command,
# then once over its exit status (no line: there was none, or record_disks
# is gone)
RECORDER_ENV = "NESTRACE_DISK_RECORDER"


@dataclass
class DiskRecorder:
    """One `nestrace record` of one virtual disk's stack, run by
    record_disks."""
    name: str
    proc: subprocess.Popen
    ready: threading.Event = field(default_factory=threading.Event)
    err: list[str] = field(default_factory=list)
    out: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, name: str, argv: list[str], log) -> DiskRecorder:
        # (a session of its own: a Ctrl-C at the terminal reaches the
        # command, and record stops the recorders after it)
        r = cls(name, subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=_die_with_parent,
            env={**os.environ, RECORDER_ENV: "1"}))
        r.threads = [threading.Thread(target=r._follow, args=(log,), daemon=True),
                     threading.Thread(target=lambda: r.out.extend(
                         line.decode(errors="replace").rstrip() for line in r.proc.stdout),
                         daemon=True)]
        for t in r.threads:
            t.start()
        return r

    def _follow(self, log) -> None:
        for line in self.proc.stderr:
            text = line.decode(errors="replace").rstrip()
            if text == RECORDING:
                self.ready.set()
                continue
            self.err.append(text)
            log(f"[{self.name}] {text}")

    def failed(self) -> RecordError:
        return RecordError(f"recording {self.name} failed (exit code {self.proc.returncode}): "
                           + (" | ".join(self.err[-3:]) or "no message"))

    def tell(self, fact: dict | None) -> None:
        """A line of the workload stream to it (None: its end)."""
        try:
            if fact is not None:
                self.proc.stdin.write((json.dumps(fact) + "\n").encode())
                self.proc.stdin.flush()
            else:
                self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass                        # (gone: it says why on its stderr)


def _stop_all(rec: list[DiskRecorder]) -> None:
    for r in rec:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGINT)
    for r in rec:
        try:
            r.proc.wait(600)     # (it seals its capture first)
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()
        for t in r.threads:
            t.join(60)


def _wait_ready(rec: list[DiskRecorder], seconds: float = 120) -> None:
    """Until every recorder traces; RecordError when one fails first."""
    deadline = time.monotonic() + seconds
    while not all(r.ready.is_set() for r in rec):
        for r in rec:
            if r.proc.poll() is not None and not r.ready.is_set():
                r.threads[0].join(5)
                raise r.failed()
        if time.monotonic() > deadline:
            raise RecordError("the recorders of " + ", ".join(r.name for r in rec
                                                              if not r.ready.is_set())
                              + f" did not start tracing within {seconds:.0f} s")
        time.sleep(0.05)


def record_disks(store: str | os.PathLike, groups: list[tuple[str, list[str]]],
                 options: list[str], *, duration: float | None = None,
                 command: list[str] | None = None, cwd: str | None = None,
                 env: dict[str, str] | None = None, memory: int | None = None,
                 log=lambda msg: print(msg, file=sys.stderr),
                 out=lambda msg: print(msg)) -> int | None:
    """Record the stacks of several virtual disks (a VM's vda and vdb, two
    VMs), each as a capture of its own in `store`, side by side: one
    `nestrace record` per disk (groups: its name and the options that name
    its stack, --stack or --image; `options`: the other options of each),
    started first, then `command` run once (or `duration` seconds, or
    until SIGINT or SIGTERM), then each stopped and sealed.  Each capture is a whole stack: the host
    disk they share is in each, and each calls the host-disk writes into
    the other images `other` (record names them: neighbor_image).  Each
    recorder's lines are logged with its disk's name; its summary is given
    to `out` at the end.  `memory`: the command runs in a memory cgroup
    of that many bytes (memlimit), whose facts each capture keeps.  The
    command's exit code (None without one)."""
    if command:
        check_command(command[0], cwd, env)
    if memory is not None:
        if not command:
            raise RecordError("--memory holds CMD's memory: give CMD")
        memlimit.check(memory)
    rec: list[DiskRecorder] = []
    rc = None
    try:
        for name, which in groups:
            r = DiskRecorder.start(name, [sys.executable, "-m", "nestrace", "record", "-o",
                                          str(store), *which, *options], log)
            r.tell({"command": " ".join(command or [])})
            rec.append(r)
        _wait_ready(rec)
        log(f"nestrace: tracing {len(rec)} virtual disks, a capture each: "
            + ", ".join(r.name for r in rec))
        if command and memory:
            with memlimit.limited(memory) as mc:
                rc = run_workload(mc.wrap(command), cwd, env)
            for why in (mc.left, mc.words()):
                if why:
                    log(f"nestrace: {why}")
            for r in rec:
                r.tell({"exit": rc, "memory": mc.facts()})
        elif command:
            rc = run_workload(command, cwd, env)
            for r in rec:
                r.tell({"exit": rc})
        else:
            # (until the last ends: one may stop early, at its --max-size)
            wait_for_stop(duration, lambda: any(r.proc.poll() is None for r in rec), log)
    finally:
        for r in rec:
            r.tell(None)
        _stop_all(rec)
    for r in rec:
        for line in r.out:
            out(line)
    bad = [r for r in rec if r.proc.returncode]
    if bad:
        raise bad[0].failed()
    return rc
