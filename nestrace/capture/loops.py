"""The lab's loop devices: a partition table with one partition, the
partition's device, and each device's settings checked (its direct I/O,
its request size limit)."""
from __future__ import annotations

import struct
import subprocess
import time
from pathlib import Path

# where --partitions puts each file system: 1 MiB in, as partitioning tools do
PART_START = 1 << 20


class LabError(RuntimeError):
    pass


def run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise LabError(f"{what} failed: {' '.join(cmd)}: {msg[0] if msg else r.returncode}")
    return r.stdout.strip()


def write_mbr(path: Path, start: int, length: int) -> None:
    """A DOS partition table with one Linux partition (type 0x83) of
    `length` bytes at byte `start` (both multiples of 512)."""
    entry = struct.pack("<B3sB3sII", 0, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff",
                        start // 512, length // 512)
    with open(path, "r+b") as f:
        f.seek(446)
        f.write(entry + bytes(48) + b"\x55\xaa")


def partition(disk: str, size: int) -> str:
    """The first partition of a loop device attached with --partscan: the
    kernel's own scan of the table write_mbr wrote, or, on a kernel built
    without partition table parsers, one added by BLKPG (addpart)."""
    part = f"{disk}p1"
    for i in range(100):
        if Path(part).exists():
            return part
        if i == 5:
            run(["addpart", disk, "1", str(PART_START // 512), str((size - PART_START) // 512)],
                 f"adding partition 1 to {disk}")
        time.sleep(0.02)
    raise LabError(f"{part}: the partition did not appear")


def default_request_limit(dev: str) -> None:
    """A loop device keeps the request size limit set on it (its queue's
    max_sectors_kb) after it is detached, and the next lab given its
    number inherited it: 8 KiB left on loop0 by a hand-made test split
    btrfs's 16 KiB metadata reads at the host disk and made fio's 128 KiB
    reads look sequential on a fragmented image.  Set it to a new device's: max_hw_sectors_kb, at most
    1280 (the block layer's BLK_DEF_MAX_SECTORS_CAP)."""
    q = Path("/sys/block") / Path(dev).name / "queue"
    try:
        want = min(int((q / "max_hw_sectors_kb").read_text()), 1280)
        if int((q / "max_sectors_kb").read_text()) != want:
            (q / "max_sectors_kb").write_text(f"{want}\n")
    except (OSError, ValueError) as e:
        raise LabError(f"{dev}: setting its request size limit (max_sectors_kb) to a new "
                       f"device's: {e}") from e


def check_dio(dev: str, want: bool, flag: str) -> None:
    got = Path(f"/sys/block/{Path(dev).name}/loop/dio").read_text().strip() == "1"
    if got != want:
        raise LabError(f"{flag} {'on' if want else 'off'}: the kernel set direct I/O "
                       f"{'on' if got else 'off'} for {dev} (backing file system cannot do it)")
