"""Discover a nested storage stack from a mount point, and map files.

mount point -> its block device (the virtual disk: a loop device here, vdX
in a VM) -> the loop's backing image file -> the host file system holding
the image -> that file system's device (the disk), recursively while the
devices are loop devices.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass, field, replace

from nestrace.capture.devices import (
    BlockDev,
    Mount,
    block_dev_of_path,
    kdev_of,
    mount_block_dev,
    mount_containing,
    mount_of,
    mounts,
)
from nestrace.errors import StackError
from nestrace.images.chain import image_format


@dataclass
class Stack:
    """One nested stack: guest FS (vfs) on vdisk, whose image is a file on
    the host FS (hostfs) on disk.  `side` is what one machine sees of it:
    both (one kernel, the lab), guest (vfs and vdisk, in a VM) or host
    (hostfs and disk: the hypervisor's accesses to the image); the other
    side's fields are empty."""
    guest_mount: str = ""
    guest_fs: str = ""
    guest_kdev: int = 0
    vdisk: BlockDev | None = None
    image_path: str = ""
    image_ino: int = 0
    host_mount: str = ""
    host_fs: str = ""
    host_kdev: int = 0
    disk: BlockDev | None = None
    # a host file system on several devices (btrfs RAID): the others, each
    # a `disk` level device of its own
    more_disks: list[BlockDev] = field(default_factory=list)
    below: list[dict] = field(default_factory=list)   # further loop levels under disk
    guest_block_bytes: int = 0
    host_block_bytes: int = 0
    # where each file system starts on its disk: a partition's start, else 0
    guest_part_start_bytes: int = 0
    host_part_start_bytes: int = 0
    # how long that partition is (0: the file system is on the whole disk)
    guest_part_size_bytes: int = 0
    host_part_size_bytes: int = 0
    side: str = "both"
    # the image file's format, by its first bytes (a loop device reads any
    # file as raw; a hypervisor reads the format it is told)
    image_format: str = "raw"
    # the files a qcow2 or vmdk image reads through (its backing chain, top
    # first), those on the image's own file system: {path, fmt, ino}
    backing_files: list[dict] = field(default_factory=list)
    # more guest file systems traced on other partitions of the same
    # virtual disk (a VM's / and /home; `record --stack A --stack B`): the
    # guest_* fields of each, as guests() gives them
    more_guests: list[dict] = field(default_factory=list)
    # a guest overlay (a container's root: `record --stack` on an overlay
    # mount): the dev_t of the file system its layers are on, traced with
    # it (its files' bytes are that file system's); 0 for any other
    guest_base_kdev: int = 0

    @property
    def has_guest(self) -> bool:
        return self.side in ("both", "guest")

    @property
    def has_host(self) -> bool:
        return self.side in ("both", "host")

    @property
    def disks(self) -> list[BlockDev]:
        return [self.disk, *self.more_disks] if self.disk else []

    def to_json(self) -> dict:
        return asdict(self)


GUEST_FIELDS = ("guest_mount", "guest_fs", "guest_kdev", "guest_block_bytes",
                "guest_part_start_bytes", "guest_part_size_bytes", "guest_base_kdev")


def guests(stack: Stack) -> list[Stack]:
    """The stack once per traced guest file system (the first, then
    more_guests), each with that one's guest_* fields and no more_guests:
    what is done per guest file system (its files' extents, its journal,
    its device_map row) is done on each."""
    return [stack] + [replace(stack, more_guests=[], **g) for g in stack.more_guests]


def _overlay_lower_split(s: str) -> list[str]:
    """An overlay's lower layers as its lowerdir option gives them: joined
    by colons, a backslash escaping the character after it (a colon or
    a backslash in a name), as the kernel splits and unescapes them."""
    dirs, cur, esc = [], [], False
    for c in s:
        if esc:
            cur.append(c)
            esc = False
        elif c == "\\":
            esc = True
        elif c == ":":
            dirs.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    return dirs + ["".join(cur)]


def _octal_unescaped(s: str) -> str:
    """A mount option's value as mountinfo shows it, with the characters
    it escapes (space, tab, newline, comma, backslash: \\040 ...) back."""
    return re.sub(r"\\([0-7]{3})", lambda x: chr(int(x.group(1), 8)), s)


def overlay_dirs(m: Mount) -> list[str]:
    """An overlay mount's layers: its upper, work and lower directories.
    mountinfo shows each option's value as given, octal-escaping a space,
    comma or backslash (\\040); lower ones are joined by a colon, one in
    a name escaped by a backslash (so shown as \\134:)."""
    dirs = []
    for opt in m.options.split(","):
        key, _, val = opt.partition("=")
        if key in ("upperdir", "workdir"):
            dirs.append(_octal_unescaped(val))
        elif key in ("lowerdir", "lowerdir+", "datadir+"):
            dirs += [d for d in _overlay_lower_split(_octal_unescaped(val)) if d]
    return dirs


def overlay_base(m: Mount) -> Mount:
    """The file system an overlay mount's layers are on (its upper, work
    and lower directories): one, whose files' bytes the overlay's files
    are.  Layers on several file systems, or on btrfs (whose extent
    lookups an overlay does not pass on), are refused."""
    dirs = overlay_dirs(m)
    bases = {(b.major, b.minor): b for d in dirs if (b := mount_containing(d)) is not None}
    if not bases:
        raise StackError(f"{m.mount_point}: an overlay whose layers were not found "
                         f"(options {m.options!r})")
    if len(bases) > 1:
        raise StackError(f"{m.mount_point}: an overlay with layers on several file systems ("
                         + ", ".join(sorted(b.mount_point for b in bases.values()))
                         + "): nestrace follows an overlay whose layers are on one")
    base = next(iter(bases.values()))
    if base.fs_type in ("overlay", "btrfs"):
        raise StackError(f"{m.mount_point}: an overlay on {base.fs_type} ({base.mount_point}): "
                         "nestrace follows an overlay on ext2/3/4 or xfs")
    return base


def _overlay_guest(m: Mount, base: Stack) -> dict:
    """The more_guests entry of an overlay whose layers are on `base` (a
    traced guest file system): its files' bytes are base's."""
    return {"guest_mount": m.mount_point, "guest_fs": "overlay", "guest_kdev": m.kdev,
            "guest_block_bytes": base.guest_block_bytes,
            "guest_part_start_bytes": base.guest_part_start_bytes,
            "guest_part_size_bytes": base.guest_part_size_bytes,
            "guest_base_kdev": base.guest_kdev}


def add_overlay(stack: Stack, m: Mount) -> None:
    """Trace an overlay mount too, and the file system of its layers."""
    base = overlay_base(m)
    if not any(g.guest_kdev == base.kdev for g in guests(stack)):
        add_guest(stack, base.mount_point)
    if any(g.guest_kdev == m.kdev for g in guests(stack)):
        raise StackError(f"--stack {m.mount_point}: this overlay is traced already")
    stack.more_guests.append(_overlay_guest(
        m, next(g for g in guests(stack) if g.guest_kdev == base.kdev)))


def add_guest(stack: Stack, mount_point: str) -> None:
    """Trace one more guest file system: one on another partition of the
    stack's virtual disk (not another disk: that is another image), or an
    overlay whose layers are on one."""
    gm = mount_of(mount_point)
    if gm.fs_type == "overlay":
        return add_overlay(stack, gm)
    try:
        bd = mount_block_dev(gm)
    except StackError as e:
        raise StackError(f"--stack {mount_point}: {e}") from None
    if stack.vdisk is None or bd.kdev != stack.vdisk.kdev:
        raise StackError(
            f"--stack {mount_point}: on {bd.name}, not on the virtual disk {stack.vdisk.name if stack.vdisk else '?'} "
            f"of --stack {stack.guest_mount}: more than one --stack traces file systems on "
            "partitions of one virtual disk (another disk is another image: `nestrace record` "
            "takes both and makes a capture of each)")
    if any(g.guest_kdev == gm.kdev for g in guests(stack)):
        raise StackError(f"--stack {mount_point}: its file system ({bd.part_name or bd.name}) "
                         "is traced already")
    _one_device(gm)
    stack.more_guests.append({
        "guest_mount": gm.mount_point, "guest_fs": gm.fs_type, "guest_kdev": gm.kdev,
        "guest_block_bytes": os.statvfs(gm.mount_point).f_bsize,
        "guest_part_start_bytes": _part_start(gm), "guest_part_size_bytes": _part_size(gm)})


def traced_at(stack: Stack, path: str) -> str | None:
    """The highest level of `stack` that sees what is written to `path`
    (a store, say): vfs on the guest file system, vdisk on another file
    system of the virtual disk, disk on the host file system or another
    file system of a traced disk; None when the stack sees none of it."""
    m = mount_containing(path)
    if m is None:
        return None
    if stack.has_guest and stack.guest_kdev and m.kdev in {g.guest_kdev for g in guests(stack)}:
        return "vfs"
    try:
        dev = mount_block_dev(m)       # (a partition's whole disk)
    except (OSError, StackError):
        return None                    # not on a block device (tmpfs, NFS)
    if stack.has_guest and stack.vdisk and (dev.major, dev.minor) == (stack.vdisk.major, stack.vdisk.minor):
        return "vdisk"
    if stack.has_host and (m.kdev == stack.host_kdev or
                           any((dev.major, dev.minor) == (d.major, d.minor) for d in stack.disks)):
        return "disk"
    return None


def discover(mount_point: str) -> Stack:
    """Walk mount -> loop -> image -> host FS -> disk (an overlay: the
    stack of the file system its layers are on, and the overlay too)."""
    gm = mount_of(mount_point)
    if gm.fs_type == "overlay":
        stack = discover(overlay_base(gm).mount_point)
        add_overlay(stack, gm)
        return stack
    vdisk = mount_block_dev(gm)
    if not vdisk.is_loop:
        raise StackError(
            f"{mount_point}: on {vdisk.name}, which is not a loop device: not a nested "
            "stack on this machine (in a VM: `nestrace record --side guest` here, "
            "`--side host --image FILE` on the host, then `nestrace merge`)")
    _one_device(gm)
    return from_devices(gm, vdisk)


def _part_start(m: Mount) -> int:
    """Byte offset of a mount's file system on its disk (a partition's start)."""
    try:
        return mount_block_dev(m).part_start_bytes
    except StackError:
        return 0


def _part_size(m: Mount) -> int:
    """Bytes of the partition a mount's file system is on (0: a whole disk)."""
    try:
        return mount_block_dev(m).part_size_sectors * 512
    except StackError:
        return 0


def untraced_mounts(stack: Stack) -> list[tuple[str, str]]:
    """The other file systems mounted from the virtual disk's partitions,
    as (mount point, partition): their requests are on the traced virtual
    disk, their files are not traced."""
    if stack.vdisk is None or not stack.guest_mount:
        return []
    mine = set()
    for g in guests(stack):
        try:
            mine.add(mount_block_dev(mount_of(g.guest_mount)).part_name)
        except StackError:
            mine.add("")
    out: dict[str, str] = {}
    for m in mounts():
        try:
            bd = mount_block_dev(m)
        except StackError:
            continue
        if bd.kdev == stack.vdisk.kdev and bd.part_name not in mine:
            out.setdefault(bd.part_name or bd.name, m.mount_point)
    return sorted((mp, part) for part, mp in out.items())


def _host_below(disk: BlockDev) -> list[dict]:
    """Further loop levels under the host disk (the lab's own backing files)."""
    below = []
    cur = disk
    while cur.is_loop and len(below) < 8:
        below.append({"name": cur.name, "backing_file": cur.backing_file, "dio": cur.dio})
        bm = mount_containing(cur.backing_file)
        if bm is None:
            break
        try:
            cur = mount_block_dev(bm)
        except StackError:
            break
        below[-1]["fs"] = bm.fs_type
        below[-1]["dev"] = cur.name
    return below


def guest_side(mount_point: str, vdisk_path: str | None = None) -> Stack:
    """The guest's half of a stack in a VM: the file system at `mount_point`
    and the virtual disk under it (a virtio disk, or any block device)."""
    gm = mount_of(mount_point)
    if gm.fs_type == "overlay":
        stack = guest_side(overlay_base(gm).mount_point, vdisk_path)
        add_overlay(stack, gm)
        return stack
    vdisk = block_dev_of_path(vdisk_path) if vdisk_path else mount_block_dev(gm)
    _one_device(gm)
    return Stack(guest_mount=gm.mount_point, guest_fs=gm.fs_type, guest_kdev=gm.kdev,
                 vdisk=vdisk, guest_block_bytes=os.statvfs(gm.mount_point).f_bsize,
                 guest_part_start_bytes=_part_start(gm), guest_part_size_bytes=_part_size(gm),
                 side="guest")


def _more_disks(m: Mount, disk: BlockDev) -> list[BlockDev]:
    """The other devices of a btrfs on several (RAID profiles): all of
    them are the disk level.  Their file system addresses are the same
    offsets on each device, so their partitions must start alike."""
    devs = sorted(btrfs_devices(m.mount_point).items())
    starts = {bd.part_start_bytes for _, bd in devs} | {disk.part_start_bytes}
    if len(starts) > 1:
        raise StackError(
            f"{m.mount_point}: btrfs on " + ", ".join(bd.part_name or bd.name for _, bd in devs)
            + ": partitions starting at different offsets; nestrace maps a file system on "
            "several devices only when they start alike (whole disks, or partitions at "
            "the same offset)")
    return [bd for _, bd in devs if bd.kdev != disk.kdev]


def _one_device(m: Mount) -> None:
    """A guest btrfs on several virtual disks is refused: only the one
    under the mount is traced, the others' bytes would be lost."""
    if m.fs_type == "btrfs":
        devs = btrfs_devices(m.mount_point)
        if len({bd.kdev for bd in devs.values()}) > 1:
            raise StackError(
                f"{m.mount_point}: a guest btrfs on {len(devs)} devices ("
                + ", ".join(bd.part_name or bd.name for bd in devs.values())
                + "): nestrace traces one virtual disk under the guest file system")


def host_side(image: str, disk_path: str | None = None) -> Stack:
    """The host's half: the disk image file, the file system it is on and
    that file system's disk."""
    try:
        st = os.stat(image)
    except OSError as e:
        raise StackError(f"{image}: {e.strerror}") from None
    import stat as _stat
    if not _stat.S_ISREG(st.st_mode):
        raise StackError(f"{image}: not a regular file (the disk image)")
    hm = mount_containing(image)
    if hm is None:
        raise StackError(f"{image}: its file system is not mounted")
    if disk_path:
        disk = block_dev_of_path(disk_path)
    else:
        try:
            disk = mount_block_dev(hm)
        except StackError:
            raise StackError(
                f"{image}: the disk image is on {hm.fs_type} at {hm.mount_point} "
                f"({hm.major}:{hm.minor}), which has no block device under it: nestrace "
                "traces a host file system on a disk (put the image on one, or trace "
                "the guest's half alone with `record --side guest`)") from None
    more = _more_disks(hm, disk) if hm.fs_type == "btrfs" and not disk_path else []
    fmt = image_format(image)
    return Stack(image_path=os.path.realpath(image), image_ino=st.st_ino,
                 host_mount=hm.mount_point, host_fs=hm.fs_type, host_kdev=hm.kdev, disk=disk,
                 more_disks=more, below=_host_below(disk),
                 host_block_bytes=os.statvfs(hm.mount_point).f_bsize,
                 host_part_start_bytes=_part_start(hm), host_part_size_bytes=_part_size(hm),
                 side="host",
                 image_format=fmt, backing_files=_backing_files(image, fmt, hm.kdev))


def _backing_files(image: str, fmt: str, host_kdev: int) -> list[dict]:
    """The files of `image`'s backing chain (but itself; a split vmdk's
    extent files with `extent`) on the file system it is on (`record`
    warns about the others, and about a chain it cannot read)."""
    from nestrace.images.base import MAPPED, ImageMapError
    from nestrace.images.chain import backing_chain
    if fmt not in MAPPED:
        return []
    try:
        chain = backing_chain(image, fmt)[1:]
    except ImageMapError:
        return []
    out = []
    for layer in chain:
        dev, ino = file_id(layer.path)
        if dev == host_kdev:
            out.append({"path": layer.path, "fmt": layer.fmt, "ino": ino}
                       | ({"extent": True} if layer.extent else {}))
    return out


def from_devices(gm: Mount, vdisk: BlockDev, image: str | None = None,
                 disk_path: str | None = None) -> Stack:
    image_path = image or vdisk.backing_file
    host = host_side(image_path, disk_path)
    return Stack(
        guest_mount=gm.mount_point, guest_fs=gm.fs_type, guest_kdev=gm.kdev, vdisk=vdisk,
        image_path=image_path, image_ino=host.image_ino, host_mount=host.host_mount,
        host_fs=host.host_fs, host_kdev=host.host_kdev, disk=host.disk,
        more_disks=host.more_disks, below=host.below,
        guest_block_bytes=os.statvfs(gm.mount_point).f_bsize,
        host_block_bytes=host.host_block_bytes,
        guest_part_start_bytes=_part_start(gm), host_part_start_bytes=host.host_part_start_bytes,
        guest_part_size_bytes=_part_size(gm), host_part_size_bytes=host.host_part_size_bytes)


# ---- devices and file ids (the extent maps are in nestrace.capture.extents) ----------

def btrfs_devices(mount_point: str) -> dict[int, BlockDev]:
    """devid -> block device (a partition's whole disk, with its start) of
    a mounted btrfs."""
    out = subprocess.run(["btrfs", "filesystem", "show", "--raw", mount_point],
                         capture_output=True, text=True)
    if out.returncode:
        raise StackError(f"{mount_point}: btrfs filesystem show failed: {out.stderr.strip()}")
    devs = {}
    for m in re.finditer(r"devid\s+(\d+) size \d+ used \d+ path (\S+)", out.stdout):
        if m.group(2) == "<missing":
            raise StackError(f"{mount_point}: btrfs devid {m.group(1)} is missing")
        devs[int(m.group(1))] = block_dev_of_path(m.group(2))
    if not devs:
        raise StackError(f"{mount_point}: no devices in `btrfs filesystem show`")
    return devs


def fs_device(mount_point: str) -> str:
    """The block device a file system is on, as the kernel names it: its
    mount's source (a partition, when it is on one)."""
    bd = mount_block_dev(mount_of(mount_point))
    return bd.part_name or bd.name


def file_id(path: str) -> tuple[int, int]:
    """(dev, ino) of a file as the kernel's tracepoints name it: the dev_t
    of its mount's device (btrfs's stat gives an anonymous one)."""
    st = os.stat(path)
    m = mount_containing(path)
    return (m.kdev if m else kdev_of(st.st_dev)), st.st_ino
