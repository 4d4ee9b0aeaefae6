"""`lab down`'s loop devices: a detach waits for the kernel to let go of
the file, and one something keeps open is named with what holds it, not
taken for done."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
from conftest import loop_devices

from nestrace.capture import teardown
from nestrace.capture.loops import LabError


@pytest.mark.root
def test_a_loop_device_held_open_is_named_with_its_holder_then_lets_go(tmp_path):
    img = tmp_path / "x.img"
    subprocess.run(["truncate", "-s", "8M", str(img)], check=True)
    before = loop_devices()
    dev = subprocess.run(["losetup", "--find", "--show", str(img)], check=True,
                         capture_output=True, text=True).stdout.strip()
    fd = os.open(dev, os.O_RDONLY)
    try:
        # (losetup -d only marks a device still open: it goes when closed)
        with pytest.raises(LabError, match=rf"^detach failed: {dev} still reads its file 1 s "
                           rf"after `losetup -d` \(held open by python[\d.]* \(pid {os.getpid()}\)\)$"):
            teardown.detach(dev, tries=4)
        assert teardown.loop_attached(dev)
    finally:
        os.close(fd)
        for _ in range(40):
            if not teardown.loop_attached(dev):
                break
            time.sleep(0.25)
        else:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
    assert loop_devices() <= before, "the device did not let go of its file once closed"


@pytest.mark.root
def test_a_busy_mount_is_named_with_what_holds_it(tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], check=True)
    holder = subprocess.Popen(["sleep", "60"], cwd=mnt)
    try:
        with pytest.raises(LabError, match=rf"^unmount failed: umount {mnt}: .*busy.* "
                           rf"\(held by sleep \(pid {holder.pid}\)\)$"):
            teardown.umount(str(mnt), tries=2)
        assert teardown.is_mounted(str(mnt))
    finally:
        holder.kill()
        holder.wait()
        teardown.umount(str(mnt))
    assert not teardown.is_mounted(str(mnt))
