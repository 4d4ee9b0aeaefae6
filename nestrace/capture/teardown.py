"""Taking a lab stack down: what stands on its file systems unmounted
first, a busy unmount retried, a loop device detached and waited for
until the kernel lets go of its file, and what holds a mount or a device
named when it will not go."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from nestrace.capture.devices import mounts, overlay_dirs
from nestrace.capture.loops import LabError
from nestrace.capture.loops import run as _run


def unmount_on_top(roots: list[str], own: list[str]) -> list[str]:
    """Unmount what stands on the lab's file systems (the lab's mounts
    `own`, and the directories they are in, `roots`), deepest first:
    mounts inside them, and overlays whose layers are in them (a
    container's root made on the lab: an overlay keeps its layers' file
    system alive after that one's own mount is gone, and with it the loop
    devices under it).  What was unmounted, said."""
    roots = [os.path.realpath(r).rstrip("/") + "/" for r in roots]

    def inside(path: str) -> bool:
        return any((os.path.realpath(path) + "/").startswith(r) for r in roots)

    lab = {os.path.realpath(mp) for mp in own}
    on_top = [m.mount_point for m in mounts() if m.mount_point not in lab
              and (inside(m.mount_point)
                   or (m.fs_type == "overlay" and any(map(inside, overlay_dirs(m)))))]
    undone = []
    for mp in sorted(set(on_top), key=len, reverse=True):
        umount(mp)
        undone.append(f"unmounted {mp} (on the lab's file system)")
    return undone


def umount(path: str, tries: int = 60) -> None:
    """Unmount; a process that was just killed, or a loop device detached
    while something still had it open (the kernel lets go of its file when
    the last opener closes it), may hold the mount for a moment, so retry
    a busy unmount for up to ~15 s; then name what holds it."""
    for i in range(tries):
        r = subprocess.run(["umount", path], capture_output=True, text=True)
        if r.returncode == 0 or not is_mounted(path):
            return
        if "busy" not in r.stderr:
            raise LabError(f"unmount failed: umount {path}: {r.stderr.strip()}")
        time.sleep(0.25)
    held = _holders(path)
    raise LabError(f"unmount failed: umount {path}: {r.stderr.strip()}"
                   + (f" (held by {', '.join(held)})" if held else ""))


def detach(dev: str, tries: int = 240) -> None:
    """Detach a loop device and wait (up to ~60 s: a loaded machine's udev
    probe has taken more than 5, and in one CI run here a device no
    process held took more than 20) until the kernel has let go of its file:
    `losetup -d` of a device something still has open (a udev probe, say)
    only marks it to go when that one closes it.  Then name what holds it."""
    _run(["losetup", "-d", dev], "detach")
    for _ in range(tries):
        if not loop_attached(dev):
            return
        time.sleep(0.25)
    held = _dev_holders(dev)
    raise LabError(f"detach failed: {dev} still reads its file {tries // 4} s after "
                   "`losetup -d`" + (f" (held open by {', '.join(held)})" if held else ""))


def _processes(hit) -> list[str]:
    """"comm (pid N)" of the processes with a cwd, root or open file whose
    path hit(path) accepts.  (The links are read, not followed: a stat
    could hang on a network mount.)"""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = [proc / "cwd", proc / "root", *(proc / "fd").iterdir()]
            if any(hit(os.readlink(link)) for link in links):
                found.append(f"{(proc / 'comm').read_text().strip()} (pid {proc.name})")
        except OSError:      # (gone, or a kernel thread)
            continue
    return found


def _dev_holders(dev: str) -> list[str]:
    """What has a block device open, as far as /proc and /sys tell:
    devices stacked on it, and processes with a file descriptor on it."""
    name = Path(dev).name
    return [f"/dev/{h.name}" for h in Path(f"/sys/block/{name}/holders").glob("*")] + \
        _processes(lambda p: p == f"/dev/{name}")


def _holders(path: str) -> list[str]:
    """What keeps the file system at path busy, as far as /proc and /sys
    tell: loop devices reading a file on it, and processes with a file,
    cwd or root under it."""
    root = os.path.realpath(path).rstrip("/") + "/"
    held = []
    for b in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if b.read_text().strip().startswith(root):
                held.append(f"/dev/{b.parent.parent.name}")
        except OSError:
            continue
    return held + _processes(lambda p: (p + "/").startswith(root))


def is_mounted(path: str) -> bool:
    rp = os.path.realpath(path)
    return any(line.split()[4] == rp for line in
               Path("/proc/self/mountinfo").read_text().splitlines())


def loop_attached(dev: str) -> bool:
    return Path(f"/sys/block/{Path(dev).name}/loop/backing_file").exists()
