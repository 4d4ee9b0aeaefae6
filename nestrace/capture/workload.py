"""The traced command's side of a recording: start it, pass signals on,
wait for it or for a stop, and refuse one that cannot start."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from nestrace.errors import RecordError
from nestrace.store.modes import user_umask


@contextlib.contextmanager
def handling(signum: int, handler):
    """`handler` for `signum` meanwhile (where Python lets us: in the main
    thread)."""
    try:
        prev = signal.signal(signum, handler)
    except ValueError:                       # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signum, prev)


def run_workload(command: list[str], cwd: str | None = None,
                  env: dict[str, str] | None = None) -> int:
    """Run the traced command; the capture ends when it does.  A SIGTERM
    to nestrace is passed on to it, and after a Ctrl-C (which the terminal
    sends it too) it has 5 s to exit before it is killed.  Its exit code,
    128 + N for signal N.  The handlers only note the signal (an exception
    raised inside Popen.wait can leave its lock taken: see record), and a
    handler that was in place, a caller's noting one, still hears it."""
    child = subprocess.Popen(command, cwd=cwd, env=env, umask=user_umask())
    pending: list[int] = []
    handlers = {}

    def note(signum, frame):
        pending.append(signum)
        prev = handlers[signum]
        if callable(prev) and prev is not signal.default_int_handler:
            prev(signum, frame)

    for signum in (signal.SIGINT, signal.SIGTERM):
        handlers[signum] = signal.getsignal(signum)
    interrupted_at = None
    with handling(signal.SIGTERM, note), handling(signal.SIGINT, note):
        while True:
            while pending:
                signum = pending.pop(0)
                if signum == signal.SIGTERM and child.returncode is None:
                    os.kill(child.pid, signum)
                elif signum == signal.SIGINT and interrupted_at is None:
                    interrupted_at = time.monotonic()
            if interrupted_at is not None and time.monotonic() - interrupted_at > 5:
                child.kill()
            try:
                rc = child.wait(0.5)
                break
            except subprocess.TimeoutExpired:
                pass
    return 128 - rc if rc < 0 else rc


# the line `record` logs once tracing, when it records until stopped (no
# CMD, no --duration): what a caller waits for before starting its load
RECORDING = "nestrace: recording; Ctrl-C to stop (or SIGTERM)"


# the SIGINTs and SIGTERMs a disk's recorder of record_disks got outside
# wait_for_stop (recorder_signals)
_stops: list[int] = []


def recorder_signals() -> None:
    """For a disk's recorder of record_disks: a SIGINT or SIGTERM before
    it traces, or after it was told to stop, is noted, not raised as a
    KeyboardInterrupt: it stops at once once tracing, and always seals its
    capture.  (The parent-death signal comes once per thread of a killed
    `record` that the recorder is handed on to as it dies: twice or more.
    The second, landing while the recorder sealed, left its capture
    unsealed.)"""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: _stops.append(signum))


def wait_for_stop(duration: float | None, running, log) -> None:
    """Until SIGINT or SIGTERM, `duration` seconds, or running() is false.
    SIGINT too, even when started with it ignored (a shell's background
    job): like blktrace and perf record, Ctrl-C or kill -INT always ends
    the recording.  The handlers only note the signal (no lock: not an
    Event, whose lock the handler could find taken by the very code it
    interrupted).  An exception raised inside Popen.poll(), between its
    taking the Popen's wait lock and the try that gives it back, left the
    lock taken, and the wait for the agent after it hung for good (seen
    once in CI: the agent exited at once and stayed a zombie)."""
    stopped: list[int] = []
    with handling(signal.SIGTERM, lambda signum, frame: stopped.append(signum)), \
            handling(signal.SIGINT, lambda signum, frame: stopped.append(signum)):
        if not duration:
            log(RECORDING)
        end = time.monotonic() + duration if duration else None
        while not stopped and not _stops and running():
            left = end - time.monotonic() if end is not None else 0.2
            if left <= 0:
                break
            time.sleep(min(left, 0.2))


def workload_line(stream) -> dict:
    """The next line of record_disks' workload stream ({} at its end, or
    for a line that does not parse: the capture names no command or exit
    status)."""
    try:
        got = json.loads(stream.readline() or "{}")
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def check_command(prog: str, cwd: str | None, env: dict[str, str] | None) -> None:
    """RecordError, before anything is traced or written, for a workload
    that cannot be started: no such program, or not executable."""
    if "/" in prog:
        path = Path(cwd or ".") / prog
        if not path.is_file():
            raise RecordError(f"{prog}: no such file (the command to record)")
        if not os.access(path, os.X_OK):
            raise RecordError(f"{prog}: not executable (the command to record)")
    elif shutil.which(prog, path=(env or os.environ).get("PATH", os.defpath)) is None:
        raise RecordError(f"{prog}: command not found (the command to record)")
