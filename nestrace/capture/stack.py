"""Discover a nested storage stack from a mount point.

mount point -> its block device (the virtual disk: a loop device here, vdX
in a VM) -> the loop's backing image file -> the host file system holding
the image -> that file system's device (the disk), recursively while the
devices are loop devices.  The guest side (the file system's disk and
partition, an overlay's base, the disk's other mounts) is the agent's to
find (capture.guestfacts); the host side is found here.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace

from nestrace.capture.devices import (
    BlockDev,
    Mount,
    block_dev,
    block_dev_of_path,
    btrfs_devices,
    file_id,
    mount_block_dev,
    mount_containing,
)
from nestrace.capture.guestfacts import agent_facts, stack_fields
from nestrace.capture.netmount import is_network, net_hop
from nestrace.errors import StackError
from nestrace.images.chain import image_format

# host_fs of a stack whose virtual disk is a host block device (the raw
# baseline): no host file system, no hostfs level
RAW_HOST = "none"


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
    # a guest btrfs: its one device's id (0: not a btrfs)
    guest_btrfs_devid: int = 0
    # the other file systems mounted from the virtual disk's partitions,
    # [mount point, partition]: their requests are on the traced disk,
    # their files are not traced
    untraced_mounts: list[list[str]] = field(default_factory=list)
    # the image on a network mount (netmount.NetHop's fields): the netfs
    # level, its client's requests; image_path and the host_* fields are
    # then the server's (its export on this machine's file system)
    net: dict = field(default_factory=dict)

    @property
    def has_guest(self) -> bool:
        return self.side in ("both", "guest")

    @property
    def has_host(self) -> bool:
        return self.side in ("both", "host")

    @property
    def raw_host(self) -> bool:
        """The virtual disk is a host block device: no host FS, no image file."""
        return self.has_host and self.host_fs == RAW_HOST

    @property
    def gateway(self) -> bool:
        """The guest's files on a network mount, no virtual disk: vfs on
        the mount, its requests (netfs), the server's file system on the
        exported files (hostfs: every file of it) and its disk."""
        return bool(self.net) and self.has_guest and self.vdisk is None

    @property
    def disks(self) -> list[BlockDev]:
        return [self.disk, *self.more_disks] if self.disk else []

    def to_json(self) -> dict:
        return asdict(self)


GUEST_FIELDS = ("guest_mount", "guest_fs", "guest_kdev", "guest_block_bytes",
                "guest_part_start_bytes", "guest_part_size_bytes", "guest_base_kdev",
                "guest_btrfs_devid")
# what host_side finds that a stack of both sides takes (a loop device
# reads its image as raw: no format, no backing chain)
HOST_FIELDS = ("image_path", "image_ino", "host_mount", "host_fs", "host_kdev", "disk",
               "more_disks", "below", "host_block_bytes", "host_part_start_bytes",
               "host_part_size_bytes", "net")


def guests(stack: Stack) -> list[Stack]:
    """The stack once per traced guest file system (the first, then
    more_guests), each with that one's guest_* fields and no more_guests:
    what is done per guest file system (its files' extents, its journal,
    its device_map row) is done on each."""
    return [stack] + [replace(stack, more_guests=[], **g) for g in stack.more_guests]


def guest_side(mounts: str | list[str], vdisk_path: str | None = None) -> Stack:
    """The guest's half of a stack: the file systems at `mounts` (the
    first's, then those on other partitions of its disk; an overlay with
    the file system of its layers before it) and the virtual disk under
    them (or the block device `vdisk_path`), as the agent finds them."""
    mounts = [mounts] if isinstance(mounts, str) else list(mounts)
    text = agent_facts(mounts, "stack")
    try:
        g = json.loads(text)
    except ValueError:
        raise StackError(f"--stack {mounts[0]}: the agent's stack is not JSON: "
                         f"{text[:80]!r}") from None
    f = stack_fields(g, f"--stack {mounts[0]}")
    found = f.pop("vdisk")
    if vdisk_path:
        vdisk = block_dev_of_path(vdisk_path)
    else:
        vdisk = block_dev(found.major, found.minor)
        vdisk.part_name, vdisk.part_start_bytes = found.part_name, found.part_start_bytes
        vdisk.part_size_sectors = found.part_size_sectors
    return Stack(vdisk=vdisk, side="guest", **f)


def discover(mounts: str | list[str]) -> Stack:
    """Walk mount -> loop -> image -> host FS -> disk (a network mount:
    mount -> its server's file system -> disk, the gateway)."""
    first = mounts if isinstance(mounts, str) else mounts[0]
    m = mount_containing(first)
    if m is not None and is_network(m):
        if not isinstance(mounts, str) and len(mounts) > 1:
            raise StackError(f"--stack {first}: a network mount is traced alone (one --stack)")
        try:
            return _gateway(m)
        except RemoteServer as e:  # (traced down to the client's requests)
            return Stack(guest_mount=m.mount_point, guest_fs=m.fs_type, guest_kdev=m.kdev,
                         guest_block_bytes=os.statvfs(m.mount_point).f_bsize, side="guest",
                         net=asdict(e.hop))
    stack = guest_side(mounts)
    if not stack.vdisk.is_loop:
        raise StackError(
            f"{stack.guest_mount}: on {stack.vdisk.name}, which is not a loop device: not a "
            "nested stack on this machine (in a VM: `nestrace record --side guest` here, "
            "`--side host --image FILE` on the host, then `nestrace merge`)")
    try:
        return with_host(stack)
    except RemoteServer as e:      # (traced down to the client's requests)
        return replace(stack, net=asdict(e.hop))


class RemoteServer(StackError):
    """The image is on a network mount whose server is not this machine."""

    def __init__(self, msg: str, hop):
        super().__init__(msg)
        self.hop = hop


def with_host(stack: Stack, image: str | None = None, disk_path: str | None = None) -> Stack:
    """A guest side and the host side under it: `image` (default: the
    virtual disk's loop backing file) on its file system and disk."""
    host = host_side(image or stack.vdisk.backing_file, disk_path)
    return replace(stack, side="both", **{f: getattr(host, f) for f in HOST_FIELDS})


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


def host_side(image: str, disk_path: str | None = None) -> Stack:
    """The host's half: the disk image file, the file system it is on and
    that file system's disk."""
    try:
        st = os.stat(image)
    except OSError as e:
        raise StackError(f"{image}: {e.strerror}") from None
    import stat as _stat
    if _stat.S_ISBLK(st.st_mode):
        return _raw_host(image, st)
    if not _stat.S_ISREG(st.st_mode):
        raise StackError(f"{image}: not a regular file (the disk image) or a block device")
    hm = mount_containing(image)
    if hm is None:
        raise StackError(f"{image}: its file system is not mounted")
    if is_network(hm):
        return _server_side(image, hm, disk_path)
    fmt = image_format(image)
    return Stack(image_path=os.path.realpath(image), image_ino=st.st_ino, side="host",
                 image_format=fmt, backing_files=_backing_files(image, fmt, hm.kdev),
                 **_host_fs(hm, f"{image}: the disk image", disk_path))


def _host_fs(hm: Mount, what: str, disk_path: str | None = None) -> dict:
    """The host_* fields and the disks of the host file system at `hm`;
    StackError, naming `what` is on it, when it has no disk under it."""
    if disk_path:
        disk = block_dev_of_path(disk_path)
    else:
        try:
            disk = mount_block_dev(hm)
        except StackError:
            raise StackError(
                f"{what} is on {hm.fs_type} at {hm.mount_point} "
                f"({hm.major}:{hm.minor}), which has no block device under it: nestrace "
                "traces a host file system on a disk (put the image on one, or trace "
                "the guest's half alone with `record --side guest`)") from None
    more = _more_disks(hm, disk) if hm.fs_type == "btrfs" and not disk_path else []
    return dict(host_mount=hm.mount_point, host_fs=hm.fs_type, host_kdev=hm.kdev, disk=disk,
                more_disks=more, below=_host_below(disk),
                host_block_bytes=os.statvfs(hm.mount_point).f_bsize,
                host_part_start_bytes=_part_start(hm), host_part_size_bytes=_part_size(hm))


def _local_hop(m: Mount, what: str):
    """The network hop of `m`; RemoteServer when its server is not this
    machine (its side cannot be traced)."""
    hop = net_hop(m)
    if not hop.local:
        raise RemoteServer(
            f"{what}: on {m.fs_type} from {hop.source}, a server that is not this machine: "
            "nestrace traces its server's side when it is this machine (127.0.0.1, ::1, "
            "localhost or its own name)", hop)
    return hop


def _gateway(m: Mount) -> Stack:
    """The gateway: the guest's files on the network mount `m` itself,
    served from this machine's file system at the export."""
    hop = _local_hop(m, m.mount_point)
    hm = mount_containing(hop.export)
    if hm is None or not os.path.isdir(hop.export):
        raise StackError(f"{m.mount_point}: on {m.fs_type} from {hop.source}: the export "
                         f"{hop.export} is not a directory here")
    if is_network(hm):
        raise StackError(f"{m.mount_point}: its export {hop.export} is itself on {hm.fs_type}: "
                         "nestrace traces one network hop, onto a file system on a disk")
    return Stack(guest_mount=m.mount_point, guest_fs=m.fs_type, guest_kdev=m.kdev,
                 guest_block_bytes=os.statvfs(m.mount_point).f_bsize, side="both",
                 net=asdict(hop), **_host_fs(hm, f"{m.mount_point}: the export {hop.export}"))


def _server_side(image: str, m, disk_path: str | None) -> Stack:
    """The host's half when the image is on a network mount served from
    this machine: the server's file (its export's) on its file system and
    disk, with the hop between."""
    hop = _local_hop(m, image)
    server = hop.server_path(image)
    if not os.path.isfile(server):
        raise StackError(f"{image}: on {m.fs_type} from {hop.source}: the server's file "
                         f"{server} is not there")
    host = host_side(server, disk_path)
    if host.net or host.raw_host:
        raise StackError(f"{image}: its server's file {server} is itself on {host.host_fs}: "
                         "nestrace traces one network hop, onto a file system on a disk")
    return replace(host, net=asdict(hop))


def _raw_host(part: str, st: os.stat_result) -> Stack:
    """The host's half of the raw baseline: the virtual disk on a host
    block device (a partition, or a whole disk), no host file system
    between (host_fs "none", no hostfs level): the partition is the
    "image", at its start on the disk below."""
    disk = block_dev(os.major(st.st_rdev), os.minor(st.st_rdev))
    size = disk.part_size_sectors * 512 if disk.part_name else disk.size_sectors * 512
    return Stack(image_path=part, image_ino=st.st_ino, host_fs=RAW_HOST, disk=disk,
                 below=_host_below(disk), host_block_bytes=disk.logical_block_bytes,
                 host_part_start_bytes=disk.part_start_bytes, host_part_size_bytes=size,
                 side="host")


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
