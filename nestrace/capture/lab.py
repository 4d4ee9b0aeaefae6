"""Build and tear down a lab nested stack on loop devices.

    disk file (on the machine's disk) -> loop "disk" [--host-dio]
      -> host FS, mounted -> image file -> loop "vdisk" [--guest-dio]
      -> guest FS, mounted  (the mount point printed by `lab up`)

With --net (capture.netlab) the host FS is served over sshfs on the
loopback address and mounted back, and the virtual disk reads the image
through that mount: a VM's image on a NAS.

The raw baseline (`--host-fs none`) has no host file system: the virtual
disk is a loop device on a partition of the host disk, as a VM's disk
on a raw host partition ("BD" in the nested-file-system studies).

Every step is written to a state file before the next one starts, so `lab
down` undoes exactly what was made, also after a crash half way up.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from nestrace.capture import netlab
from nestrace.capture.devices import mounts
from nestrace.capture.loops import (
    PART_START,
    LabError,
    check_dio,
    default_request_limit,
    partition,
    write_mbr,
)
from nestrace.capture.loops import run as _run
from nestrace.capture.netlab import NETS
from nestrace.capture.stack import RAW_HOST
from nestrace.capture.teardown import detach, is_mounted, loop_attached, umount, unmount_on_top
from nestrace.errors import json_object

FILESYSTEMS = ("ext2", "ext3", "ext4", "xfs", "btrfs")
# the host "file system" of the raw baseline: the virtual disk on a host
# partition, no file system between
RAW = RAW_HOST
HOST_FILESYSTEMS = FILESYSTEMS + (RAW,)
BTRFS_PROFILES = ("single", "dup", "raid0", "raid1", "raid1c3", "raid1c4", "raid10", "raid5", "raid6")
STATE_ROOT = Path(os.environ.get("NESTRACE_LAB_STATE", "/run/nestrace/labs"))
DATA_ROOT = Path(os.environ.get("NESTRACE_LAB_DATA", "/var/tmp/nestrace-labs"))
# mkfs.xfs refuses file systems under 300 MiB
MIN_FS_BYTES = {"xfs": 300 << 20, "btrfs": 128 << 20}
# the smallest block each mkfs takes (xfs: with its default CRCs; btrfs:
# its sector, at least 4 KiB)
MIN_BLOCK_BYTES = {"ext2": 1024, "ext3": 1024, "ext4": 1024, "xfs": 1024, "btrfs": 4096}


def stack_paths(st: dict) -> list[str]:
    """A lab's file systems top down, each by a path on it: the guest FS,
    the host FS, the one holding the host disk's file."""
    return [st[k] for k in ("guest_mount", "host_mount", "disk_file") if st.get(k)]


def sync_stack(st: dict) -> None:
    """Write back a lab's own file systems, top down (the guest's writes
    reach the image before the host FS is synced): syncfs(2) on each, not
    sync(2), which would make every file system on the machine commit its
    journal and flush its disk, in the middle of other stacks' captures."""
    _run(["sync", "-f", *stack_paths(st)], "sync")


def _sparse_file(path: Path, size: int, what: str) -> None:
    """A sparse file of `size` bytes, or LabError saying why not (a size the
    file system under it cannot hold: EFBIG on ext4 past 16 TiB)."""
    try:
        with open(path, "wb") as f:
            f.truncate(size)
    except (OSError, OverflowError) as e:     # (OverflowError: past 2**63 bytes)
        why = e.strerror if isinstance(e, OSError) else "File too large"
        raise LabError(f"{path}: cannot make the {what} ({size} bytes): {why}") from None


def parse_size(s: str | int) -> int:
    if isinstance(s, int):
        return s
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = s.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except (ValueError, OverflowError):     # (OverflowError: "infG")
        raise LabError(f"bad size {s!r} (want e.g. 512M, 2G)") from None


def mount_cmd(fs: str, dev: str, mount_point, discard: bool = False,
              compress: bool = False) -> list[str]:
    """ext2/3/4 (the ext4 driver) prefetch block bitmaps in the background
    after mounting (the ext4lazyinit thread, seconds on a small file system
    with 1 KiB blocks): metadata reads in the middle of a trace, so the lab
    turns it off like lazy init.  `discard`: online discard, the FS sends
    its disk a discard for the blocks it frees (at its journal commit).
    `compress` (btrfs): every data write compressed with zstd, where it
    makes the data smaller (compress-force: no giving up on a file after
    one incompressible write)."""
    opts = ["no_prefetch_block_bitmaps"] if fs in ("ext2", "ext3", "ext4") else []
    opts += ["discard"] if discard else []
    opts += ["compress-force=zstd"] if compress else []
    return ["mount", "-t", fs, *(["-o", ",".join(opts)] if opts else []), dev, str(mount_point)]


def mkfs_cmd(fs: str, dev: str, block_size: int | None, more: list[str] = (),
             profile: str = "") -> list[str]:
    """mkfs of `fs` on `dev` (btrfs: and on the `more` devices, data laid
    out by `profile`, metadata mirrored)."""
    if fs in ("ext2", "ext3", "ext4"):
        # no lazy init: background zeroing would pollute every trace; no
        # discard: on a loop device it punches holes in the image (undoing
        # --fragment-image and changing its layout)
        cmd = [f"mkfs.{fs}", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"]
        if block_size:
            cmd += ["-b", str(block_size)]
        return cmd + [dev]
    if fs == "xfs":
        cmd = ["mkfs.xfs", "-q", "-f", "-K"]
        if block_size:
            cmd += ["-b", f"size={block_size}"]
        return cmd + [dev]
    if fs == "btrfs":
        cmd = ["mkfs.btrfs", "-q", "-f", "-K"]
        if block_size:
            cmd += ["-s", str(block_size)]
        if profile:
            cmd += ["-d", profile, "-m", "raid1" if more else "dup"]
        return cmd + [dev, *more]
    raise LabError(f"unknown file system {fs!r} (choose from {', '.join(FILESYSTEMS)})")


@dataclass
class LabConfig:
    guest_fs: str = "ext4"
    host_fs: str = "xfs"
    image_size: int = 512 << 20
    disk_size: int = 0              # 0: image size + 256 MiB (and the FS minimum)
    guest_dio: bool = True
    host_dio: bool = True
    guest_block_size: int | None = None
    host_block_size: int | None = None
    fragment_image: bool = False    # fill the image with random 64 KiB writes before mkfs
    partitions: bool = False        # each file system on a partition at PART_START, not a whole disk
    host_disks: int = 1             # a btrfs host on this many disks
    host_profile: str = ""          # btrfs data profile (single, dup, raid0, raid1, raid10, raid5, ...)
    host_discard: bool = False      # mount the host FS with online discard
    host_compress: bool = False     # a btrfs host compressing the image's data (zstd)
    guest_compress: bool = False    # a btrfs guest compressing its files' data (zstd)
    guest_discard: bool = False     # mount the guest FS with online discard
    net: str = ""                   # the image reached over a network hop (netlab.NETS)
    gateway: bool = False           # with net: the guest's files on the network mount itself
    net_address: str = "127.0.0.1"  # where its server listens (another: a NAS nestrace cannot see)
    name: str = "default"

    def validate(self) -> None:
        for role, fs, known in (("guest", self.guest_fs, FILESYSTEMS),
                                ("host", self.host_fs, HOST_FILESYSTEMS)):
            if fs not in known:
                raise LabError(f"unknown {role} file system {fs!r} "
                               f"(choose from {', '.join(known)})")
        if self.host_fs == RAW:
            for flag, on in (("--host-block-size", self.host_block_size is not None),
                             ("--host-disks", self.host_disks != 1), ("--host-profile", self.host_profile),
                             ("--host-discard", self.host_discard), ("--host-compress", self.host_compress),
                             ("--fragment-image", self.fragment_image), ("--partitions", self.partitions)):
                if on:
                    raise LabError(f"{flag} and --host-fs none: the raw baseline has no host file "
                                   "system or image file (its virtual disk is a host partition)")
        if self.net and self.net not in NETS:
            raise LabError(f"--net {self.net}: unknown (choose from {', '.join(NETS)})")
        if self.gateway and not self.net:
            raise LabError("--gateway puts the guest's files on a network mount: give --net")
        if self.gateway and (self.partitions or self.fragment_image or self.guest_compress
                             or self.guest_discard or self.guest_block_size):
            raise LabError("--gateway has no guest file system or image: --partitions, "
                           "--fragment-image and the --guest-* options do not apply")
        if not re.fullmatch(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}", self.net_address):
            raise LabError(f"--net-address {self.net_address}: a loopback IPv4 address "
                           "(127.x.y.z)")
        if self.net and self.host_fs == RAW:
            raise LabError(f"--net {self.net} and --host-fs none: a network hop serves the "
                           "image from a host file system")
        least = MIN_FS_BYTES.get(self.guest_fs, 16 << 20)
        if self.image_size < least:
            raise LabError(f"--image-size {self.image_size} bytes is below the "
                           f"{self.guest_fs} minimum of {least >> 20} MiB")
        if self.host_disks < 1 or self.host_disks > 8:
            raise LabError(f"--host-disks {self.host_disks}: from 1 to 8")
        if (self.host_disks > 1 or self.host_profile) and self.host_fs != "btrfs":
            raise LabError("--host-disks and --host-profile lay out a btrfs host (--host-fs btrfs)")
        if self.host_compress and self.host_fs != "btrfs":
            raise LabError("--host-compress is btrfs's compression (--host-fs btrfs)")
        if self.guest_compress and self.guest_fs != "btrfs":
            raise LabError("--guest-compress is btrfs's compression (--guest-fs btrfs)")
        if self.host_compress and self.fragment_image:
            raise LabError("--host-compress and --fragment-image: the image is written "
                           "whole either way; choose one")
        if self.host_profile and self.host_profile not in BTRFS_PROFILES:
            raise LabError(f"unknown btrfs profile {self.host_profile!r} "
                           f"(choose from {', '.join(BTRFS_PROFILES)})")
        if not self.name.replace("-", "").replace("_", "").isalnum():
            raise LabError(f"bad lab name {self.name!r}")
        for flag, fs, bs in (("--guest-block-size", self.guest_fs, self.guest_block_size),
                             ("--host-block-size", self.host_fs, self.host_block_size)):
            if fs == RAW:
                continue
            # (mkfs.ext4 -b 3000 makes 2 KiB blocks without a word)
            if bs is not None and (bs <= 0 or bs & (bs - 1)):
                raise LabError(f"{flag} {bs}: not a power of two")
            # (refused here, not by mkfs on each stack of a lab run matrix)
            if bs is not None and bs < MIN_BLOCK_BYTES[fs]:
                raise LabError(f"{flag} {bs}: below the {fs} minimum of {MIN_BLOCK_BYTES[fs]} bytes")


class Lab:
    def __init__(self, name: str = "default"):
        self.name = name
        self.state_dir = STATE_ROOT / name
        self.state_file = self.state_dir / "state.json"
        self.data_dir = DATA_ROOT / name

    # -- state ------------------------------------------------------------
    def state(self) -> dict:
        """The lab's state file; LabError naming the file and the offset
        when it does not parse (`down` then tears down what it finds)."""
        if not self.state_file.exists():
            return {}
        st, problem = json_object(self.state_file.read_bytes())
        if st is None:
            raise LabError(f"{self.state_file}: {problem}")
        return st

    def _save(self, st: dict) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, self.state_file)

    def _step(self, st: dict, kind: str, **info) -> None:
        st.setdefault("made", []).append({"kind": kind, **info})
        self._save(st)

    @property
    def guest_mount(self) -> Path:
        return self.state_dir / "guest"

    @property
    def host_mount(self) -> Path:
        return self.state_dir / "host"

    @property
    def net_mount(self) -> Path:
        return self.state_dir / "net"

    # -- up / down --------------------------------------------------------
    def up(self, cfg: LabConfig) -> dict:
        cfg.validate()
        if self.state().get("made"):
            raise LabError(f"lab {self.name!r} is already up (nestrace lab down --name {self.name})")
        disk_size = cfg.disk_size or max(cfg.image_size + (256 << 20),
                                         MIN_FS_BYTES.get(cfg.host_fs, 0) + cfg.image_size)
        if cfg.host_fs == RAW:      # (the partition: the virtual disk's size, 1 MiB in)
            disk_size = max(cfg.disk_size, PART_START + cfg.image_size)
        st = {"name": self.name, "config": cfg.__dict__ | {"disk_size": disk_size}, "made": []}
        self._save(st)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._step(st, "dir", path=str(self.data_dir))
            disk_file = self.data_dir / "disk.raw"
            _sparse_file(disk_file, disk_size, "host disk")
            self._step(st, "file", path=str(disk_file))
            if cfg.gateway:
                return self._gateway(st, cfg, disk_file, disk_size)
            if cfg.host_fs == RAW:
                disk, vdisk, image = self._raw_disks(st, cfg, disk_file)
                guest_dev = vdisk
            else:
                disk, vdisk, image = self._host_fs_disks(st, cfg, disk_file, disk_size)
                guest_dev = partition(vdisk, cfg.image_size) if cfg.partitions else vdisk
            if not cfg.host_compress:
                _run(mkfs_cmd(cfg.guest_fs, guest_dev, cfg.guest_block_size),
                     f"mkfs.{cfg.guest_fs} (guest)")
            self.guest_mount.mkdir(parents=True, exist_ok=True)
            _run(mount_cmd(cfg.guest_fs, guest_dev, self.guest_mount, cfg.guest_discard,
                           cfg.guest_compress), "mounting the guest FS")
            self._step(st, "mount", path=str(self.guest_mount), role="guest")
            st.update(guest_mount=str(self.guest_mount), vdisk=vdisk, disk=disk, image=str(image),
                      disk_file=str(disk_file))
            if cfg.host_fs != RAW:
                st["host_mount"] = str(self.host_mount)
            self._save(st)
            sync_stack(st)
            return st
        except BaseException:
            self.down()
            raise

    def _gateway(self, st: dict, cfg: LabConfig, disk_file: Path, disk_size: int) -> dict:
        """The gateway: the host FS served over `cfg.net` and mounted as
        the guest's file system (no image, no virtual disk)."""
        disk = self._host_fs(st, cfg, disk_file, disk_size)
        self._net_hop(st, cfg, self.guest_mount)
        st.update(guest_mount=str(self.guest_mount), disk=disk, disk_file=str(disk_file),
                  host_mount=str(self.host_mount))
        self._save(st)
        sync_stack(st)
        return st

    def _host_fs_disks(self, st: dict, cfg: LabConfig, disk_file: Path,
                       disk_size: int) -> tuple[str, str, Path]:
        """The host disk(s), the host FS on them, the image file on it and
        the virtual disk on the image: (disk, vdisk, image)."""
        disk = self._host_fs(st, cfg, disk_file, disk_size)
        image = self.host_mount / "image.raw"
        _sparse_file(image, cfg.image_size, "disk image")
        if cfg.fragment_image:
            # random 64 KiB direct writes, no preallocation: each write
            # allocates when it is made (no delayed allocation to tidy
            # up), so the image's extents lie in write order, not file order
            _run(["fio", "--name=fragment", f"--filename={image}", "--rw=randwrite",
                  "--bs=64k", f"--size={cfg.image_size}", "--fallocate=none", "--direct=1",
                  "--ioengine=psync", "--output=/dev/null"], "fragmenting the image")
        if cfg.host_compress:
            self._compressed_image(st, cfg, image)
        if cfg.net:
            image = self._net_hop(st, cfg, self.net_mount) / "image.raw"
        vdisk = self._attach(st, image, cfg.guest_dio, "vdisk", "--guest-dio", cfg.partitions)
        return disk, vdisk, image

    def _host_fs(self, st: dict, cfg: LabConfig, disk_file: Path, disk_size: int) -> str:
        """The host disk(s) and the host FS on them, mounted: the disk."""
        disk = self._attach(st, disk_file, cfg.host_dio, "disk", "--host-dio", cfg.partitions)
        host_dev = partition(disk, disk_size) if cfg.partitions else disk
        more = []
        for i in range(2, cfg.host_disks + 1):
            f = self.data_dir / f"disk{i}.raw"
            _sparse_file(f, disk_size, "host disk")
            self._step(st, "file", path=str(f))
            d = self._attach(st, f, cfg.host_dio, "disk", "--host-dio", cfg.partitions)
            more.append(partition(d, disk_size) if cfg.partitions else d)
        _run(mkfs_cmd(cfg.host_fs, host_dev, cfg.host_block_size, more, cfg.host_profile),
             f"mkfs.{cfg.host_fs} (host)")
        self.host_mount.mkdir(parents=True, exist_ok=True)
        _run(mount_cmd(cfg.host_fs, host_dev, self.host_mount, cfg.host_discard,
                       cfg.host_compress), "mounting the host FS")
        self._step(st, "mount", path=str(self.host_mount), role="host")
        return disk

    def _net_hop(self, st: dict, cfg: LabConfig, mount_point: Path) -> Path:
        """The host FS served over `cfg.net` and mounted back at
        `mount_point` (returned)."""
        try:
            if cfg.net in netlab.NFS:
                started, undo = netlab.export_nfs(cfg.net, self.host_mount, self.data_dir)
                for what, pid in started:
                    self._step(st, "daemon", pid=pid, what=what)
                self._step(st, "export", **undo)
                netlab.mount_nfs(cfg.net, cfg.net_address, self.host_mount, mount_point)
            else:
                pid, args = netlab.serve(cfg.net, self.host_mount, self.data_dir, cfg.net_address)
                self._step(st, "daemon", pid=pid, what=cfg.net)
                netlab.mount(args, mount_point)
        except netlab.NetLabError as e:
            raise LabError(f"--net {cfg.net}: {e}") from None
        self._step(st, "mount", path=str(mount_point), role="net")
        st["net_mount"] = str(mount_point)
        return mount_point

    def _raw_disks(self, st: dict, cfg: LabConfig, disk_file: Path) -> tuple[str, str, str]:
        """The raw baseline: the host disk with one partition (at
        PART_START, the virtual disk's size) and the virtual disk a loop
        device on that partition: (disk, vdisk, the partition)."""
        write_mbr(disk_file, PART_START, cfg.image_size)
        disk = self._attach(st, disk_file, cfg.host_dio, "disk", "--host-dio", partscan=True)
        part = partition(disk, PART_START + cfg.image_size)
        return disk, self._attach(st, Path(part), cfg.guest_dio, "vdisk", "--guest-dio"), part

    def _compressed_image(self, st: dict, cfg: LabConfig, image: Path) -> None:
        """The guest FS made in a file beside the host disk, then written
        into the image with plain writes, its zeros left as holes.  mkfs on
        the image's own loop device zeroes ranges (BLKZEROOUT: the loop
        device makes it an fallocate of the image), and btrfs never
        compresses a file with preallocated extents (its write-back takes
        the no-copy-on-write path, uncompressed)."""
        build = self.data_dir / "image.build"
        _sparse_file(build, cfg.image_size, "guest FS image")
        self._step(st, "file", path=str(build))
        dev = self._attach(st, build, False, "guest build", "--guest-dio", cfg.partitions)
        part = partition(dev, cfg.image_size) if cfg.partitions else dev
        _run(mkfs_cmd(cfg.guest_fs, part, cfg.guest_block_size), f"mkfs.{cfg.guest_fs} (guest)")
        _run(["losetup", "-d", dev], "detaching the guest build loop device")
        chunk = 1 << 20
        with open(build, "rb") as src, open(image, "r+b") as dst:
            while data := src.read(chunk):
                if data.count(0) != len(data):
                    dst.seek(src.tell() - len(data))
                    dst.write(data)
        build.unlink()
        _run(["sync", "-f", str(image)], "sync")

    def _attach(self, st: dict, backing: Path, dio: bool, role: str, flag: str,
                partitioned: bool = False, partscan: bool = False) -> str:
        """Attach a loop device to `backing`, record it, check its dio mode.
        partitioned: first write a partition table with one partition at
        PART_START, and have the kernel scan it (partscan: the table is
        there already)."""
        if partitioned:
            write_mbr(backing, PART_START, backing.stat().st_size - PART_START)
        dev = _run(["losetup", "--find", "--show", f"--direct-io={'on' if dio else 'off'}",
                    *(["--partscan"] if partitioned or partscan else []), str(backing)],
                   f"attaching the {role} loop device")
        self._step(st, "loop", dev=dev, role=role)
        check_dio(dev, dio, flag)
        default_request_limit(dev)
        return dev

    def down(self) -> list[str]:
        """Undo every recorded step, newest first; returns what was undone.
        Steps whose object is already gone are skipped quietly.  On the
        first step that cannot be undone (a busy mount, say) stop, keep the
        remaining steps in the state file, and raise: nothing under a live
        mount is ever deleted, and `lab down` can simply be run again."""
        try:
            st = self.state()
        except LabError as e:
            return [f"lab {self.name!r}: {e}: tearing down what it finds"] + self._down_found()
        made = st.get("made", [])
        own = [s["path"] for s in made if s["kind"] == "mount"]
        undone = unmount_on_top(own + [str(self.state_dir), str(self.data_dir)], own)
        while made:
            step = made[-1]
            try:
                if step["kind"] == "mount":
                    if is_mounted(step["path"]):
                        umount(step["path"])
                        undone.append(f"unmounted {step['path']}")
                    if step.get("role") == "net":
                        netlab.wait_unmounted(step["path"])
                elif step["kind"] == "loop":
                    if loop_attached(step["dev"]):
                        detach(step["dev"])
                        undone.append(f"detached {step['dev']}")
                elif step["kind"] == "daemon":
                    if netlab.stop(step["pid"]):
                        undone.append(f"stopped {step['what']} (pid {step['pid']})")
                elif step["kind"] == "export":
                    try:
                        if netlab.unexport_nfs(step):
                            undone.append(f"unexported {step['path']} ({step['net']})")
                    except netlab.NetLabError as e:
                        raise LabError(str(e)) from None
                elif step["kind"] == "file":
                    Path(step["path"]).unlink(missing_ok=True)
                elif step["kind"] == "dir":
                    shutil.rmtree(step["path"], ignore_errors=True)
            except LabError as e:
                self._save(st)
                raise LabError(f"lab {self.name!r}: {e} (fix that, then run lab down again)") from None
            made.pop()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return undone

    def _down_found(self) -> list[str]:
        """Tear down without the state file: the mounts under the lab's
        state directory, upper ones first (a guest's loop device reads a
        file on the host's mount), the loop devices reading files in the
        lab's directories, then the directories."""
        roots = [str(self.state_dir.resolve()), str(self.data_dir.resolve())]

        def ours(path: str) -> bool:
            return any(path == r or path.startswith(r + "/") for r in roots)

        undone = unmount_on_top(roots, [m.mount_point for m in mounts() if ours(m.mount_point)])
        for _ in range(8):       # each round frees the level above the next
            mounted = [(m.mount_point, re.sub(r"^(/dev/loop\d+)p\d+$", r"\1", m.source))  # (a partition's loop)
                       for m in mounts()]
            sources = {src for _, src in mounted}
            loops = {}
            for b in Path("/sys/block").glob("loop*/loop/backing_file"):
                dev = f"/dev/{b.parent.parent.name}"
                f = b.read_text().strip().removesuffix(" (deleted)")
                if not ours(f):
                    continue
                if dev in sources:
                    loops[dev] = f
                else:            # its file system is unmounted: let go of the file
                    detach(dev)
                    undone.append(f"detached {dev}")
            lab_mounts = [mp for mp, _ in mounted if ours(mp)]
            if not lab_mounts:
                break
            for mp in lab_mounts:
                # an upper one first: no loop device still reads a file under it
                if not any(f.startswith(mp + "/") for f in loops.values()):
                    umount(mp)
                    undone.append(f"unmounted {mp}")
        else:
            raise LabError(f"lab {self.name!r}: mounts left under {self.state_dir} after 8 rounds")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return undone


def labs() -> list[str]:
    return sorted(p.name for p in STATE_ROOT.iterdir()) if STATE_ROOT.is_dir() else []
