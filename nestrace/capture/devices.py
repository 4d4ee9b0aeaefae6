"""Mounts and block devices as the kernel shows them (/proc/self/mountinfo,
sysfs): a path's mount, a mount's device, a device's partition, loop
backing file and size.  dev_t is the kernel's (MKDEV) throughout."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nestrace.errors import StackError


def kdev(major: int, minor: int) -> int:
    """Kernel-internal dev_t (MKDEV), as the tracepoints report it."""
    return (major << 20) | minor


def kdev_of(st_dev: int) -> int:
    return kdev(os.major(st_dev), os.minor(st_dev))


def kdev_str(d: int) -> str:
    return f"{d >> 20}:{d & 0xFFFFF}"


@dataclass
class Mount:
    mount_point: str
    major: int
    minor: int
    fs_type: str
    source: str
    options: str = ""     # the super block's options (mountinfo's last field)

    @property
    def kdev(self) -> int:
        return kdev(self.major, self.minor)


def mounts() -> list[Mount]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        f = left.split()
        r = right.split()
        maj, mnr = f[2].split(":")
        mp = f[4].encode().decode("unicode_escape")
        out.append(Mount(mp, int(maj), int(mnr), r[0], r[1], r[2] if len(r) > 2 else ""))
    return out


def mount_of(path: str) -> Mount:
    """The mount whose mount point is exactly `path`."""
    rp = os.path.realpath(path)
    if not os.path.isdir(rp):
        raise StackError(f"{path}: not a directory")
    found = [m for m in mounts() if m.mount_point == rp]
    if not found:
        raise StackError(f"{path}: not a mount point")
    return found[-1]


def mounts_on(dev: "BlockDev") -> list[Mount]:
    """The mounts of a block device's file systems: on the device itself,
    or on one of its partitions (sysfs puts a partition under its disk)."""
    out = []
    for m in mounts():
        if (m.major, m.minor) == (dev.major, dev.minor):
            out.append(m)
            continue
        sys_dev = Path(f"/sys/dev/block/{m.major}:{m.minor}")
        if (sys_dev / "partition").exists() and \
                sys_dev.resolve().parent.name == dev.name:
            out.append(m)
    return out


def mount_containing(path: str) -> Mount | None:
    """The mount a file lives on (longest mount point prefix of its real
    path).  Its major:minor is the super block's s_dev, which is what the
    kernel reports in events; stat's st_dev differs on btrfs (one anonymous
    device per subvolume)."""
    rp = os.path.realpath(path)
    best = None
    for m in mounts():
        mp = m.mount_point.rstrip("/") + "/"
        if (rp + "/").startswith(mp) and (best is None or len(m.mount_point) >= len(best.mount_point)):
            best = m
    return best


def mount_block_dev(m: Mount) -> "BlockDev":
    """The block device under a mount: its source when that is a block
    device (btrfs mounts show an anonymous major:minor), else major:minor."""
    import stat as _stat
    try:
        st = os.stat(m.source)
        if _stat.S_ISBLK(st.st_mode):
            return block_dev(os.major(st.st_rdev), os.minor(st.st_rdev))
    except OSError:
        pass
    return block_dev(m.major, m.minor)


@dataclass
class BlockDev:
    name: str
    major: int
    minor: int
    size_sectors: int
    logical_block_bytes: int
    backing_file: str = ""
    backing_offset_bytes: int = 0
    dio: bool = False
    backing_kdev: int = 0
    backing_ino: int = 0
    # the partition a file system was found on, when it is on one: the disk
    # above is the whole disk, where the requests are
    part_name: str = ""
    part_start_bytes: int = 0
    part_size_sectors: int = 0      # the partition's size (0: on the whole disk)

    @property
    def kdev(self) -> int:
        return kdev(self.major, self.minor)

    @property
    def is_loop(self) -> bool:
        return bool(self.backing_file)


def queue_kb(bd: BlockDev, what: str = "read_ahead_kb") -> int | None:
    """A queue setting of the whole disk, in KiB: read_ahead_kb (the
    readahead window the kernel gives the device's file systems) or
    max_sectors_kb (its largest request); None when not readable."""
    try:
        return int(Path(f"/sys/block/{bd.name}/queue/{what}").read_text())
    except (OSError, ValueError):
        return None


def _sysfs(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def block_dev(major: int, minor: int) -> BlockDev:
    """The block device major:minor; for a partition, its whole disk, with
    the partition's name and start."""
    sys = Path(f"/sys/dev/block/{major}:{minor}")
    if not sys.exists():
        raise StackError(f"{major}:{minor}: not a block device")
    if (sys / "partition").exists():
        disk = sys.resolve().parent
        dmaj, dmin = (int(x) for x in _sysfs(disk / "dev").split(":"))
        bd = block_dev(dmaj, dmin)
        bd.part_name = sys.resolve().name
        bd.part_start_bytes = int(_sysfs(sys / "start", "0")) * 512
        bd.part_size_sectors = int(_sysfs(sys / "size", "0"))
        return bd
    name = sys.resolve().name
    queue = sys / "queue" if (sys / "queue").exists() else sys / ".." / "queue"
    bd = BlockDev(name, major, minor, int(_sysfs(sys / "size", "0")),
                  int(_sysfs(queue / "logical_block_size", "512")))
    loop = sys / "loop"
    if loop.exists():
        bf = _sysfs(loop / "backing_file")
        if bf:
            bd.backing_file = bf.removesuffix(" (deleted)")
            bd.backing_offset_bytes = int(_sysfs(loop / "offset", "0"))
            bd.dio = _sysfs(loop / "dio", "0") == "1"
            st = os.stat(bd.backing_file)
            bm = mount_containing(bd.backing_file)
            bd.backing_kdev = bm.kdev if bm else kdev_of(st.st_dev)
            bd.backing_ino = st.st_ino
    return bd


def block_dev_of_path(dev_path: str) -> BlockDev:
    st = os.stat(dev_path)
    import stat as _stat
    if not _stat.S_ISBLK(st.st_mode):
        raise StackError(f"{dev_path}: not a block device")
    return block_dev(os.major(st.st_rdev), os.minor(st.st_rdev))


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
