"""The agent's command line for a capture: which program families and hooks,
which CPUs, which cgroup; the agent's own options are in its --help."""
from __future__ import annotations

import os
import re
from pathlib import Path

from nestrace._paths import agent_path
from nestrace.capture.devices import kdev_str
from nestrace.capture.stack import Stack, guests
from nestrace.errors import RecordError
from nestrace.schema import ENUMS


def side_families(stack: Stack) -> str:
    """The BPF program families a side needs."""
    # (the guest's page cache and mappings are hostfs-family hooks too;
    # netfs only with a network hop: its tracepoints are FUSE's, a module)
    return {"both": "vfs,block,hostfs", "guest": "vfs,block,hostfs",
            "host": "block,hostfs"}[stack.side] + (",netfs" if stack.net else "")


def access_hooks() -> tuple[str, ...]:
    """Every hook of a host FS's accesses to the image (the hostfs_source
    enum in schemas/)."""
    return tuple(hook for _, hook, _ in ENUMS["hostfs_source"]["values"])


def unused_hooks(host_fs: str) -> tuple[str, ...]:
    """Access hooks whose events hostfs_io never uses for this host FS, so
    they are not attached (iomap_dio_rw_begin alone fires on every direct
    I/O of every file system on the machine, about 3 times per guest I/O).
    One table decides for both: the hostfs_source enum in schemas/, which
    the view reads as _hostfs_sources.  A file system without a hook list
    of its own gets the "*" list."""
    values = ENUMS["hostfs_source"]["values"]
    named = {fs for _, _, fss in values for fs in fss if fs != "*"}
    fs = host_fs if host_fs in named else "*"
    return tuple(hook for _, hook, fss in values if fs not in fss)


# interrupt lines of block devices in /proc/interrupts: virtio-blk queues
# (virtioN-req.M), NVMe queues, AHCI
_BLOCK_IRQ = re.compile(r"virtio\d+-req|\bnvme\d+q\d+|\bahci")


def quiet_cpus(interrupts: str, cpus: set[int]) -> set[int] | None:
    """CPUs of `cpus` that take (almost) no block-device interrupts, from
    the text of /proc/interrupts; None when there is no such split (one
    CPU, no block interrupts seen, or every CPU takes them)."""
    lines = interrupts.splitlines()
    if not lines:
        return None
    cols = [int(c[3:]) for c in lines[0].split() if c.startswith("CPU")]
    per_cpu = dict.fromkeys(cols, 0)
    for line in lines[1:]:
        if not _BLOCK_IRQ.search(line):
            continue
        counts = line.split(":", 1)[1].split()[:len(cols)]
        for cpu, n in zip(cols, counts):
            if n.isdigit():
                per_cpu[cpu] += int(n)
    total = sum(per_cpu.get(c, 0) for c in cpus)
    if len(cpus) < 2 or total == 0:
        return None
    quiet = {c for c in cpus if per_cpu.get(c, 0) <= total // 100}   # under 1 % of them
    return quiet if quiet and quiet != cpus else None


def parse_cpus(spec: str) -> set[int]:
    """'0,2-3' -> {0, 2, 3}."""
    out: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise RecordError(f"--agent-cpus: {spec!r} is not a CPU list like 0,2-3") from None
    return out


def agent_cpus(spec: str) -> set[int] | None:
    """Where the agent may run: `all` (anywhere), a CPU list, or `auto`: the
    CPUs that take no block-device interrupts, when there are such.  On a
    small VM one CPU takes the disk's interrupts and runs the completions;
    the agent's work there is taken from the workload's I/O path."""
    allowed = os.sched_getaffinity(0)
    if spec == "all":
        return None
    if spec == "auto":
        try:
            return quiet_cpus(Path("/proc/interrupts").read_text(), allowed)
        except OSError:
            return None
    cpus = parse_cpus(spec)
    if not cpus <= allowed:
        raise RecordError(f"--agent-cpus {spec}: CPUs {sorted(cpus - allowed)} are not online "
                          f"(online: {sorted(allowed)})")
    return cpus


def cgroup_dir(path: str) -> str:
    """record --cgroup: the real path of a cgroup v2 directory (the BPF
    helper that tells whether a task is under a cgroup knows the v2
    hierarchy only; on a machine with both, v2 is the `cgroup2` mount,
    /sys/fs/cgroup/unified on a hybrid one)."""
    from nestrace.capture.devices import mount_containing, mounts
    rp = os.path.realpath(path)
    if not os.path.isdir(rp):
        raise RecordError(f"--cgroup {path}: no such directory")
    m = mount_containing(rp)
    if m is None or m.fs_type != "cgroup2":
        v2 = [x.mount_point for x in mounts() if x.fs_type == "cgroup2"]
        raise RecordError(f"--cgroup {path}: not a cgroup v2 directory (it is on "
                          f"{m.fs_type if m else 'no mount'}); " +
                          (f"cgroup2 is mounted at {', '.join(v2)}" if v2 else
                           "no cgroup2 file system is mounted"))
    return rp


def agent_args(stack: Stack, ringbuf_kb: int | None, mode: str, families: str,
               flush_ms: int | None = None, all_hooks: bool = False,
               arrow_dir: Path | None = None, pid: int | None = None,
               status_ms: int = 0, cgroup: str | None = None,
               per_request: bool | str = False) -> list[str]:
    """The agent's command line.  `per_request`: true for --per-request,
    "completions" for --from-completions."""
    args = [str(agent_path()), "--die-with-parent", "--mode", mode, "--families", families]
    if per_request:
        args.append("--from-completions" if per_request == "completions" else "--per-request")
    if stack.has_guest:
        args += [a for g in guests(stack) for a in ("--dev", f"{kdev_str(g.guest_kdev)}=vfs,cache,map")]
        if stack.vdisk:     # (none in a gateway: the files are on the network mount)
            args += ["--dev", f"{kdev_str(stack.vdisk.kdev)}=block"]
    if stack.net:       # (the client's requests: on either side's stack)
        args += ["--dev", f"{kdev_str(stack.net['kdev'])}=net"]
    if stack.has_host:
        args += [a for d in stack.disks for a in ("--dev", f"{kdev_str(d.kdev)}=block")]
        if stack.gateway:   # (the exported files: every file of the server's FS)
            args += ["--dev", f"{kdev_str(stack.host_kdev)}=file,cache,map"]
        elif not stack.raw_host:
            args += [a for ino in [stack.image_ino, *(b["ino"] for b in stack.backing_files)]
                     for a in ("--ino", f"{kdev_str(stack.host_kdev)}:{ino}=file,cache,map")]
    # (a guest side, and the raw baseline, have no image file: none of the
    # image-access hooks)
    skip = access_hooks() if not stack.has_host or stack.raw_host else \
        () if all_hooks else unused_hooks(stack.host_fs)
    if skip:
        args += ["--skip-hooks", ",".join(skip)]
    if ringbuf_kb:
        args += ["--ringbuf-kb", str(ringbuf_kb)]
    if flush_ms:
        args += ["--flush-ms", str(flush_ms)]
    if arrow_dir:
        args += ["--arrow-dir", str(arrow_dir)]
    if pid:
        args += ["--pid", str(pid)]
    if cgroup:
        args += ["--cgroup", cgroup]
    if status_ms:
        args += ["--status-ms", str(status_ms)]
    return args
