"""record --memory: the workload in a memory cgroup of its own, so that
its page cache (and all else it allocates) is held to a size.  A file
then reads against memory as a file that many times bigger does on a
machine that small: seed 003 read 2 GB of a 4 GB file on a 500 MB
machine, and the ratio of file to memory is what decides what stays
cached.

The cgroup v1 memory controller is used where it is mounted (a hybrid
machine binds the controller there), else cgroup v2's.  Only the
workload's own charges count: page cache that a daemon (sftp-server, a
loop device's worker) brings in is charged to the daemon's cgroup."""

from __future__ import annotations

import errno
import os
import time
from contextlib import contextmanager
from pathlib import Path

from nestrace.capture.devices import mounts
from nestrace.errors import RecordError

# (the least that lets sh and a small workload start and page)
MIN_BYTES = 4 << 20


def _where() -> tuple[str, Path]:
    """("v1" or "v2", the hierarchy's root directory) holding the memory controller."""
    for m in mounts():
        if m.fs_type == "cgroup" and "memory" in m.options.split(","):
            return "v1", Path(m.mount_point)
    for m in mounts():
        ctl = Path(m.mount_point, "cgroup.controllers")
        if m.fs_type == "cgroup2" and ctl.exists() and "memory" in ctl.read_text().split():
            return "v2", Path(m.mount_point)
    raise RecordError("--memory: no memory cgroup controller is mounted (neither a cgroup v1 "
                      "hierarchy with memory nor a cgroup2 one whose cgroup.controllers "
                      "lists it)")


class MemoryCgroup:
    """One cgroup, made by `limited`: `wrap` a command to run it inside;
    `peak` and `hits` once it has run."""

    def __init__(self, version: str, path: Path, limit: int) -> None:
        self.version, self.path, self.limit = version, path, limit
        self.peak: int | None = None
        self.hits: int | None = None
        self.oom_kills: int | None = None
        self.left: str | None = None     # (why the cgroup could not be removed)

    def wrap(self, command: list[str]) -> list[str]:
        """`command`, made to join the cgroup first (by the shell that
        then becomes it), so that nothing of it runs outside."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"),
                *command]

    def _read(self) -> None:
        names = (("memory.max_usage_in_bytes", "memory.failcnt") if self.version == "v1"
                 else ("memory.peak", "memory.events"))
        try:
            self.peak = int((self.path / names[0]).read_text())
        except (OSError, ValueError):
            pass                      # (memory.peak is from Linux 5.19)
        try:
            text = (self.path / names[1]).read_text()
            if self.version == "v1":
                self.hits = int(text)
            else:
                self.hits = dict(x.split() for x in text.splitlines()).get("max")
                self.hits = None if self.hits is None else int(self.hits)
        except (OSError, ValueError):
            pass
        try:
            text = (self.path / ("memory.oom_control" if self.version == "v1"
                                 else "memory.events")).read_text()
            kills = dict(x.split() for x in text.splitlines()).get("oom_kill")
            self.oom_kills = None if kills is None else int(kills)
        except (OSError, ValueError):
            pass

    def facts(self) -> dict:
        """For the capture's settings_json."""
        return {"limit": self.limit, "peak": self.peak, "hits": self.hits,
                "oom_kills": self.oom_kills, "cgroup": self.version}

    def words(self) -> str | None:
        """What to tell when the limit killed a process of the workload."""
        if not self.oom_kills:
            return None
        return (f"--memory {self.limit >> 20}M: the kernel killed {self.oom_kills} process(es) "
                "of the workload for want of memory: give it more")


def _write(path: Path, text: str, what: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise RecordError(f"--memory: {path}: cannot set {what}: {e.strerror}") from None


def check(limit: int) -> None:
    """RecordError now, before tracing, if `limited` cannot be."""
    if limit < MIN_BYTES:
        raise RecordError(f"--memory {limit}: less than {MIN_BYTES >> 20} MiB, which a "
                          "workload needs to start")
    _where()


@contextmanager
def limited(limit: int):
    """A new memory cgroup of `limit` bytes, removed at the end (its page
    cache charges go up to its parent)."""
    check(limit)
    version, root = _where()
    if version == "v2" and "memory" not in (root / "cgroup.subtree_control").read_text().split():
        _write(root / "cgroup.subtree_control", "+memory", "+memory for the cgroups below")
    path = root / f"nestrace-{os.getpid()}-{time.monotonic_ns()}"
    try:
        path.mkdir()
    except OSError as e:
        raise RecordError(f"--memory: {path}: cannot make the cgroup: {e.strerror}") from None
    cg = MemoryCgroup(version, path, limit)
    try:
        _write(path / ("memory.limit_in_bytes" if version == "v1" else "memory.max"),
               str(limit), "the limit")
        yield cg
        cg._read()
    finally:
        cg.left = _remove(path)


def _remove(path: Path) -> str | None:
    """rmdir, waiting up to 5 s for the workload's last processes to
    leave; why it could not, if not (the capture is kept all the same)."""
    for _ in range(50):
        try:
            path.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno != errno.EBUSY:
                return f"--memory: {path}: cannot remove the cgroup: {e.strerror}"
            time.sleep(0.1)
    procs = (path / "cgroup.procs").read_text().split()
    return (f"--memory: {path}: cannot remove the cgroup: processes {', '.join(procs)} "
            "are still in it")
