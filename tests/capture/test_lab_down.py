"""`lab down`'s loop devices: a detach waits for the kernel to let go of
the file, and one something keeps open is named with what holds it, not
taken for done."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
from conftest import loop_devices

from nestrace.capture import lab


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
        with pytest.raises(lab.LabError, match=rf"^detach failed: {dev} still reads its file 1 s "
                           rf"after `losetup -d` \(held open by python[\d.]* \(pid {os.getpid()}\)\)$"):
            lab._detach(dev, tries=4)
        assert lab._loop_attached(dev)
    finally:
        os.close(fd)
        for _ in range(40):
            if not lab._loop_attached(dev):
                break
            time.sleep(0.25)
        else:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
    assert loop_devices() <= before, "the device did not let go of its file once closed"
