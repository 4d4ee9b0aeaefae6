"""nestrace lab: build, list, tear down and run a workload on nested lab
stacks (the `lab` group of nestrace.cli.main)."""
from __future__ import annotations

import sys

import click

from nestrace.capture.lab import (
    FILESYSTEMS,
    HOST_FILESYSTEMS,
    Lab,
    LabConfig,
    LabError,
    labs,
    parse_size,
)
from nestrace.capture.netlab import NETS
from nestrace.cli.common import (
    UserError,
    capture_options,
    cli,
    lab_name_option,
    needs_btf,
    needs_root,
    user_errors,
)


@cli.group()
def lab() -> None:
    """Build and tear down nested lab stacks on loop devices."""


def _onoff(_ctx, _param, value: str) -> bool:
    return value == "on"


def stack_options(f):
    """The options that say how a lab stack is built, shared by lab up and
    lab run (each a LabConfig field: stack_config)."""
    for opt in reversed((
        click.option("--image-size", default="512M", show_default=True, help="Disk image size."),
        click.option("--disk-size", default=None, help="Host disk size (default image + 256M)."),
        click.option("--guest-block-size", type=int, default=None,
                     help="Guest FS block size in bytes."),
        click.option("--host-block-size", type=int, default=None,
                     help="Host FS block size in bytes."),
        click.option("--fragment-image", is_flag=True,
                     help="Write the image in random 64 KiB pieces (no preallocation) before "
                          "the guest mkfs, so its extents are scattered."),
        click.option("--partitions", is_flag=True,
                     help="Put both file systems on a partition (one per disk, 1 MiB in), as "
                          "in a real VM image, not on the whole disk."),
        click.option("--host-disks", type=int, default=1, show_default=True,
                     help="A btrfs host on this many disks (each one a loop device like the "
                          "first)."),
        click.option("--host-profile", default="",
                     help="btrfs host data profile: single, dup, raid0, raid1, raid1c3, "
                          "raid1c4, raid10, raid5, raid6 (metadata: raid1 on several disks, "
                          "dup on one); default mkfs.btrfs's."),
        click.option("--host-discard", is_flag=True,
                     help="Mount the host FS with online discard: blocks of the image it frees "
                          "(holes the virtual disk's discards punch) are discarded on the host "
                          "disk."),
        click.option("--guest-discard", is_flag=True,
                     help="Mount the guest FS with online discard: the blocks it frees (a file "
                          "deleted) are discarded on the virtual disk, which punches them out "
                          "of the image, without an fstrim."),
        click.option("--host-compress", is_flag=True,
                     help="A btrfs host compressing what it writes (compress-force=zstd), the "
                          "image made without preallocated extents so that its data written "
                          "through the host page cache is compressed."),
        click.option("--guest-compress", is_flag=True,
                     help="A btrfs guest compressing what it writes (compress-force=zstd; "
                          "Fedora's btrfs default is compress=zstd:1)."),
        click.option("--net", type=click.Choice(["", *NETS]), default="",
                     help="The image on a network mount, a VM's image on a NAS: the host FS "
                          "served on 127.0.0.1 and mounted back, the virtual disk "
                          "reading the image through it. sshfs-socat: sftp over plain TCP "
                          "(socat, no encryption); sshfs-ssh: over ssh to an sshd of the "
                          "lab's own; nfs3, nfs4: exported by this machine's nfsd, "
                          "mounted with NFSv3 or NFSv4.2 (a kernel with NFS: not this "
                          "project's CI machine's, the VM test's guest's)."),
        click.option("--gateway", is_flag=True,
                     help="With --net: the guest's files on the network mount itself (the "
                          "mount point printed), no image or virtual disk: a guest behind a "
                          "gateway on its hypervisor."),
        click.option("--net-address", default="127.0.0.1", show_default=True,
                     help="The loopback address the --net server listens on. nestrace "
                          "traces the server's side of a hop from 127.0.0.1 (this machine); "
                          "another, such as 127.0.0.2, stands for a NAS it cannot see into: "
                          "the chain stops at netfs."),
    )):
        f = opt(f)
    return f


def stack_config(**kw) -> LabConfig:
    """A LabConfig from the options of stack_options (and any other
    LabConfig fields given)."""
    kw["image_size"] = parse_size(kw["image_size"])
    kw["disk_size"] = parse_size(kw["disk_size"]) if kw["disk_size"] else 0
    return LabConfig(**kw)


@lab.command("up")
@lab_name_option
@click.option("--guest-fs", default="ext4", show_default=True, help=f"One of {', '.join(FILESYSTEMS)}.")
@click.option("--host-fs", default="xfs", show_default=True,
              help=f"One of {', '.join(HOST_FILESYSTEMS)} (none: the raw baseline, the virtual "
                   "disk on a host partition).")
@click.option("--guest-dio", type=click.Choice(["on", "off"]), default="on", show_default=True,
              callback=_onoff, help="Virtual disk reads/writes the image with O_DIRECT "
              "(QEMU cache=none); off = through the host page cache (cache=writeback).")
@click.option("--host-dio", type=click.Choice(["on", "off"]), default="on", show_default=True,
              callback=_onoff, help="The host disk bypasses the page cache of its own backing "
              "file, so the host FS sees an uncached disk.")
@stack_options
@user_errors
@needs_root
def lab_up(name, guest_fs, host_fs, guest_dio, host_dio, **stack) -> None:
    """Build a nested stack; print the guest mount point."""
    cfg = stack_config(guest_fs=guest_fs, host_fs=host_fs, guest_dio=guest_dio,
                       host_dio=host_dio, name=name, **stack)
    st = Lab(name).up(cfg)
    click.echo(st["guest_mount"])


@lab.command("down")
@lab_name_option
@click.option("--all", "all_", is_flag=True, help="Tear down every lab.")
@user_errors
@needs_root
def lab_down(name, all_) -> None:
    """Tear a lab down (also one left half-built by a crash)."""
    for n in (labs() if all_ else [name]):
        for line in Lab(n).down():
            click.echo(line, err=True)


@lab.command("list")
def lab_list() -> None:
    """List labs that are up, with their guest mount points."""
    for n in labs():
        try:
            st = Lab(n).state()
        except LabError as e:
            click.echo(f"{n}\t(state damaged: {e}; `nestrace lab down --name {n}` tears down what "
                       "it finds)")
            continue
        click.echo(f"{n}\t{st.get('guest_mount', '(half built)')}\t"
                   f"{st.get('config', {}).get('guest_fs')} on {st.get('config', {}).get('host_fs')}")


@lab.command("run", context_settings={"ignore_unknown_options": True})
@click.option("-o", "--output", "store", required=True, type=click.Path(),
              help="Store directory: one capture per stack.")
@click.option("--guest-fs", default="ext4", show_default=True,
              help=f"Guest file systems, comma-separated, or all ({', '.join(FILESYSTEMS)}).")
@click.option("--host-fs", default="xfs", show_default=True,
              help="Host file systems, comma-separated, or all.")
@click.option("--guest-dio", default="on", show_default=True,
              help="on, off or on,off: the virtual disk's O_DIRECT on the image (cache=none).")
@click.option("--host-dio", default="on", show_default=True,
              help="on, off or on,off: the host disk bypasses its backing file's page cache.")
@stack_options
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Rounds of the whole matrix.")
@click.option("--prepare", default=None, help="Shell command run on each stack before "
              "recording, untraced (in the guest mount, also {guest}; caches are dropped after it).")
@capture_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@user_errors
@needs_root
@needs_btf
def lab_run(store, guest_fs, host_fs, guest_dio, host_dio, repeat, prepare, ringbuf_kb, flush_ms,
            mode, all_hooks, per_request, from_completions, agent_cpus, command, **stack) -> None:
    """Run CMD on every stack of a guest FS x host FS (x dio modes) matrix,
    each built fresh, recorded into STORE and torn down; then print them
    side by side.  CMD runs in the guest mount ({guest} in an argument is
    replaced by it; NESTRACE_GUEST, NESTRACE_GUEST_FS, NESTRACE_HOST_FS,
    NESTRACE_GUEST_DIO and NESTRACE_HOST_DIO are set).  Exit code 1 when a
    stack failed or a workload exited non-zero."""
    from nestrace.capture import matrix
    from nestrace.query.session import Session
    per_request = "completions" if from_completions else per_request
    # (unknown options pass through to CMD, so that its own need no `--`:
    # one before CMD is a mistyped option of ours, not a command)
    if command[0].startswith("-"):
        raise UserError(f"lab run has no option {command[0]} (nestrace lab run --help; "
                        "the command to run comes after the options)")
    onoff = ("on", "off")
    base = stack_config(**stack)
    todo = matrix.cells(matrix.parse_list(guest_fs, FILESYSTEMS, "--guest-fs"),
                        matrix.parse_list(host_fs, HOST_FILESYSTEMS, "--host-fs"),
                        [v == "on" for v in matrix.parse_list(guest_dio, onoff, "--guest-dio")],
                        [v == "on" for v in matrix.parse_list(host_dio, onoff, "--host-dio")],
                        base, repeat)
    for cell in todo:
        cell.config.validate()
    from nestrace.capture.agent import agent_cpus as check_cpus
    check_cpus(agent_cpus)      # a bad CPU list is refused before anything is built
    done = matrix.run_matrix(store, todo, list(command), prepare=prepare, ringbuf_kb=ringbuf_kb,
                             flush_ms=flush_ms, mode=mode, all_hooks=all_hooks,
                             per_request=per_request, cpus=agent_cpus)
    ids = [c.capture_id for c in done if c.capture_id]
    if ids:
        from nestrace.store.files import check_store
        with Session(check_store(store)) as s:
            matrix.render(matrix.compare(s, ids))
            if repeat > 1:
                stacks = s.compare_stacks()
                mine = [any(c in ids for c in r) for r in stacks.column("capture_ids").to_pylist()]
                matrix.render_stacks(stacks.filter(mine))
    failed = [c for c in done if c.failed]
    for c in failed:
        click.echo(f"nestrace: failed: {c.label}: "
                   f"{c.error or f'the workload exited with code {c.command_rc}'}", err=True)
    lost = sum(c.lost for c in done)
    if lost:
        click.secho(f"nestrace: WARNING: {lost} events lost over the run (column lost)",
                    err=True, fg="red")
    click.echo(f"nestrace: {len(ids)} captures in {store} (nestrace compare {store})", err=True)
    if failed or len(done) < len(todo):
        sys.exit(1)
