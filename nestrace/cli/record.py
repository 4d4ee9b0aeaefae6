"""nestrace record: a capture of a stack, or of each virtual disk of several,
while a command runs or until stopped."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from nestrace.capture.lab import LabError, parse_size
from nestrace.capture.stack import StackError
from nestrace.cli.common import (
    UserError,
    capture_options,
    cli,
    group_given,
    group_option,
    needs_btf,
    needs_root,
    report_capture,
    share_store,
    user_errors,
)
from nestrace.images.base import MAPPED, ImageMapError
from nestrace.images.chain import backing_chain


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("-o", "--output", "store", required=True, type=click.Path(), help="Store directory.")
@click.option("--stack", "mount", type=click.Path(), multiple=True,
              help="Guest mount point: discover the stack.  Again for another file system on "
                   "another partition of the same virtual disk (a VM's / and /home): all are "
                   "traced.  On another virtual disk (a VM's vdb, another VM): each disk's "
                   "stack is recorded as a capture of its own, side by side.")
@click.option("--vdisk", type=click.Path(),
              help="Virtual disk device (with --stack, overrides; without it, the guest FS "
                   "is the one mounted from this device).")
@click.option("--image", type=click.Path(), multiple=True,
              help="Disk image file (with --stack, overrides).  With --side host, again for "
                   "another image (a VM's second disk, another VM): each is recorded as a "
                   "capture of its own, side by side.")
@click.option("--disk", type=click.Path(), help="Host disk device (with --stack, overrides).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds to record (without CMD).")
@click.option("--max-size", default=None, metavar="SIZE",
              help="Stop tracing once the capture's live record files hold SIZE (e.g. 512M, "
                   "4G; checked every 0.2 s); CMD goes on to its end.")
@click.option("--memory", default=None, metavar="SIZE",
              help="Run CMD in a memory cgroup of SIZE (e.g. 64M): its page cache held to "
                   "that, as on a machine with that much memory, so a small file reads "
                   "against memory as a big one does.  The capture's settings keep the "
                   "limit, the peak and how often it was reached.")
@capture_options
@click.option("--pid", type=int, default=None,
              help="vfs level: only this process (and its threads); lower levels: all I/O.")
@click.option("--cgroup", type=click.Path(), default=None,
              help="vfs level: only the tasks of this cgroup v2 directory (a container's, a "
                   "service's, a VM's scope) and of the cgroups below it; lower levels: all "
                   "I/O.")
@click.option("--status", type=click.FloatRange(0), default=None,
              help="Print a line of rates per level (calls or dispatches/s, MiB/s) and events "
                   "lost this often, in seconds; 0: never.  Default: every second when there is "
                   "no CMD and stderr is a terminal, else never.")
@click.option("--side", type=click.Choice(["both", "guest", "host"]), default="both",
              show_default=True,
              help="both: all four levels on this kernel (the lab).  In a VM: guest (vfs and "
                   "vdisk: --stack MOUNT [--vdisk DEV]) in the guest, host (hostfs and disk: "
                   "--image FILE [--disk DEV]) on the host; then `nestrace merge`.")
@click.option("--redact", is_flag=True,
              help="Store hashes instead of file paths, mount points, process names and the "
                   "command line (one name, one hash within the store: joins and counts "
                   "still work).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@group_option
@user_errors
@needs_root
@needs_btf
def record(store, mount, vdisk, image, disk, duration, max_size, memory, ringbuf_kb, flush_ms,
           mode, all_hooks, per_request, from_completions, agent_cpus, pid, cgroup, status, side,
           redact, command) -> None:
    """Trace a nested stack while CMD runs (or for --duration, or until
    Ctrl-C or SIGTERM; a SIGTERM while CMD runs is passed on to CMD)."""
    per_request = "completions" if from_completions else per_request
    from nestrace.capture import disks
    from nestrace.capture import record as rec
    from nestrace.capture.workload import recorder_signals
    workload = None
    if os.environ.get(disks.RECORDER_ENV):     # (one disk's, of record_disks)
        sys.stdout, sys.stderr = _Orphanable(sys.stdout), _Orphanable(sys.stderr)
        workload = sys.stdin
        recorder_signals()
    mount, more = (mount[0], mount[1:]) if mount else (None, ())
    images, image = image, (image[0] if image else None)
    if status is None:
        status = 1.0 if not command and sys.stderr.isatty() else 0
    if duration is not None and command:    # (it was ignored)
        raise UserError("--duration is for recording without CMD: with CMD the recording "
                        "ends when CMD does")
    max_bytes = _size("--max-size", max_size)
    memory_bytes = _size("--memory", memory)
    if memory is not None and not command:
        raise UserError("--memory holds CMD's memory: give CMD")
    if cgroup is not None and side == "host":
        raise UserError("--cgroup chooses whose calls the vfs level records: a host side has "
                        "no vfs level")
    if len(images) > 1 and side != "host":
        raise UserError("--image again is for --side host (the host's side of several "
                        "images): with --stack, --image names the one stack's image")
    share_store(store)
    groups = _disk_groups(side, mount, more) if more and side != "host" else \
        _image_groups(images, disk) if len(images) > 1 else []
    if len(groups) > 1:
        if side != "host" and (vdisk or image or disk):
            raise UserError("--vdisk, --image and --disk name the devices of one stack: with "
                            "--stack on several virtual disks, give none of them")
        _record_disks(store, groups, duration, command, max_size, memory_bytes, ringbuf_kb,
                      flush_ms, mode, all_hooks, per_request, agent_cpus, pid, cgroup, status,
                      side, redact)
        return
    stack = _stack(side, [mount, *more] if mount else [], vdisk, image, disk)
    cap = rec.record(store, stack, duration=duration, command=list(command) or None,
                     ringbuf_kb=ringbuf_kb, flush_ms=flush_ms, mode=mode,
                     all_hooks=all_hooks, per_request=per_request, cpus=agent_cpus,
                     pid=pid, cgroup=cgroup,
                     status=status, max_bytes=max_bytes, workload=workload, redact=redact,
                     memory=memory_bytes)
    report_capture(cap.store, cap.capture_id, cap.seal, cap.stream_problems)
    if cap.command_rc:
        click.echo(f"nestrace: the workload exited with code {cap.command_rc}", err=True)
        sys.exit(cap.command_rc)
    if cap.net_lost:            # (a capture cut short: not a clean exit)
        click.echo(f"nestrace: the capture ended early: {cap.net_lost}", err=True)
        sys.exit(1)


def _size(option: str, text: str | None) -> int | None:
    """A size option's bytes (None when not given); one above 0."""
    if text is None:
        return None
    try:
        n = parse_size(text)
    except LabError as e:
        raise UserError(f"{option}: {e}") from None
    if n <= 0:
        raise UserError(f"{option} {text}: give a size above 0")
    return n


def _record_disks(store, groups, duration, command, max_size, memory, ringbuf_kb, flush_ms,
                  mode, all_hooks, per_request, agent_cpus, pid, cgroup, status, side,
                  redact) -> None:
    """One recorder per virtual disk (or image), each given the options as
    they were given here."""
    from nestrace.capture import disks
    opts = [*(("--max-size", max_size) if max_size else ()),
            *(("--ringbuf-kb", str(ringbuf_kb)) if ringbuf_kb is not None else ()),
            *(("--flush-ms", str(flush_ms)) if flush_ms is not None else ()),
            "--mode", mode, *(("--all-hooks",) if all_hooks else ()),
            *(("--per-request",) if per_request else ()),
            *(("--from-completions",) if per_request == "completions" else ()),
            "--agent-cpus", agent_cpus, *(("--pid", str(pid)) if pid is not None else ()),
            *(("--cgroup", cgroup) if cgroup is not None else ()),
            "--status", str(status), "--side", side, *(("--redact",) if redact else ()),
            *(("--group", group_given()) if group_given() else ())]
    rc = disks.record_disks(store, groups, opts, duration=duration,
                            command=list(command) or None, memory=memory,
                            log=lambda m: click.echo(m, err=True),
                            out=click.echo)
    if rc:
        click.echo(f"nestrace: the workload exited with code {rc}", err=True)
        sys.exit(rc)


def _stack(side, mounts, vdisk, image, disk):
    """The stack to trace: one side's, the devices given, or discovered
    from the guest mounts."""
    from nestrace.capture.devices import block_dev_of_path, mounts_on
    from nestrace.capture.stack import discover, guest_side, with_host
    if side != "both":
        return _side_stack(side, mounts, vdisk, image, disk)
    if not mounts and not vdisk:
        raise UserError("--stack MOUNTPOINT is required (the guest file system), "
                        "or --vdisk DEV with it mounted")
    if not (vdisk or image or disk):
        return discover(mounts)
    if not mounts:   # the guest file system: the one mounted from the virtual disk
        on = mounts_on(block_dev_of_path(vdisk))
        if len({(m.major, m.minor) for m in on}) != 1:   # (one file system, maybe bound twice)
            raise UserError(f"--vdisk {vdisk}: " + (
                "no file system of it is mounted" if not on else
                "file systems of it are mounted at " + ", ".join(sorted({m.mount_point for m in on}))
            ) + ": give --stack MOUNTPOINT (the guest file system)")
        mounts = [on[0].mount_point]
    stack = guest_side(mounts, vdisk)
    if not (image or stack.vdisk.is_loop):
        raise UserError(f"{stack.vdisk.name} is not a loop device: give --image")
    return with_host(stack, image, disk)


class _Orphanable:
    """A disk's recorder's stdout or stderr: a pipe to the `record` that
    runs it.  Once that one is gone (killed: the recorder is told to stop
    then), what is written is dropped, not raised as a BrokenPipeError
    that would end the recorder before it seals its capture."""

    def __init__(self, f):
        self._f = f

    def write(self, text: str) -> int:
        try:
            return self._f.write(text)
        except (BrokenPipeError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self._f.flush()
        except (BrokenPipeError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._f, name)


def _disk_groups(side: str, first: str, more) -> list[tuple[str, list[str]]]:
    """The --stack mount points grouped by the virtual disk they are on
    (in the order given), each group checked as one stack now, before
    anything is traced: (disk name, its recorder's --stack options)."""
    from nestrace.capture.stack import discover, guest_side
    groups: dict[int, tuple[str, list[str]]] = {}
    for mp in (first, *more):
        try:
            bd = guest_side(mp).vdisk
        except StackError:
            return []       # (said as for one stack, below)
        groups.setdefault(bd.kdev, (bd.name, []))[1].append(mp)
    if len(groups) > 1:
        for _, mps in groups.values():
            discover(mps) if side == "both" else guest_side(mps)
    return [(name, [a for mp in mps for a in ("--stack", mp)]) for name, mps in groups.values()]


def _image_groups(images, disk) -> list[tuple[str, list[str]]]:
    """`--side host --image A --image B`: each image checked as the host's
    side of one stack now, before anything is traced: (image file name,
    its recorder's options)."""
    from nestrace.capture.stack import host_side
    seen: dict[str, str] = {}
    for image in images:
        real = os.path.realpath(image)
        if real in seen:
            raise UserError(f"--image {image}: given twice (as {seen[real]})")
        seen[real] = image
        host_side(image, disk)
    return [(Path(image).name, ["--image", image, *(("--disk", disk) if disk else ())])
            for image in images]


def _side_stack(side: str, mounts, vdisk, image, disk):
    """One side of a VM's stack, from the options that side takes."""
    from nestrace.capture.stack import guest_side, host_side
    usage, foreign, foreign_names, needed, what = {
        "guest": ("--stack MOUNT [--vdisk DEV]", (image, disk), "--image or --disk", mounts,
                  "--stack MOUNTPOINT (the guest file system)"),
        "host": ("--image FILE [--disk DEV]", (mounts, vdisk), "--stack or --vdisk", image,
                 "--image FILE (the VM's disk image)")}[side]
    if any(foreign):
        raise UserError(f"--side {side} traces the {side}'s side: give {usage}, not {foreign_names}")
    if not needed:
        raise UserError(f"--side {side} needs {what}")
    if side == "guest":
        return guest_side(mounts, vdisk)
    stack = host_side(image, disk)
    if stack.image_format in MAPPED:
        try:
            chain = backing_chain(stack.image_path, stack.image_format)
        except ImageMapError as e:
            click.secho(f"nestrace: warning: {e}: the host's levels are recorded, but `merge` "
                        "cannot map guest offsets into this image", err=True, fg="yellow")
            return stack
        traced = {b["path"] for b in stack.backing_files}
        for layer in chain[1:]:
            if layer.path not in traced:
                what = "extent" if layer.extent else "backing"
                click.secho(f"nestrace: warning: {image}'s {what} file {layer.path} is not on "
                            f"{stack.host_mount}: guest reads that go to it are not traced",
                            err=True, fg="yellow")
    return stack


