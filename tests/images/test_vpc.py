"""The block allocation table nestrace reads from a dynamic VHD, against
QEMU's own (`qemu-img map`, `qemu-img info`) on images QEMU wrote, and how a
dynamic VHD is told from a fixed one (a raw image)."""
from __future__ import annotations

import json
import struct
import subprocess

import pytest
from test_qcow2 import _qemu_img, qemu_io, qemu_map  # noqa: F401  (_qemu_img: fixture)

from nestrace.images.chain import cluster_map, image_format
from nestrace.images.vpc import VpcError, bat_map, checksum

KiB, MiB = 1 << 10, 1 << 20


def qemu_size(path) -> int:
    return json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(path)], check=True,
                                     capture_output=True, text=True).stdout)["virtual-size"]


def test_the_block_map_is_qemus_for_writes_out_of_order(tmp_path):
    """Blocks (2 MiB) are placed in the file in the order the guest first
    wrote them, each after its sector bitmap; the disk's size is the
    geometry's, as QEMU reads it (more than asked for)."""
    img = tmp_path / "d.vhd"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vpc", str(img), "100M"], check=True)
    qemu_io(img, "write -P 1 50M 64k", "write -P 2 0 4k", "write -P 3 5M 3M",
            "write -P 4 99M 1M", fmt="vpc")
    assert image_format(str(img)) == "vpc"
    m = bat_map(str(img))
    assert (m.fmt, m.version, m.cluster_bytes) == ("vpc", 1, 2 * MiB)
    assert m.virtual_bytes == qemu_size(img) > 100 * MiB
    assert m.extents == qemu_map(img)
    assert [e[0] for e in sorted(m.extents, key=lambda e: e[1])] == [
        50 * MiB, 0, 4 * MiB, 6 * MiB, 98 * MiB]
    # the footer (both copies), the dynamic header, the BAT and each block's
    # bitmap are metadata, apart from the data
    assert len(m.metadata) == 2 + 5 and m.metadata[-1][0] == img.stat().st_size - 512
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)
    assert cluster_map(str(img), "vpc") == m
    # a disk whose size is the footer's (QEMU's force_size: creator "qem2")
    sz = tmp_path / "s.vhd"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vpc", "-o", "force_size=on", str(sz),
                    "100M"], check=True)
    qemu_io(sz, "write -P 5 99M 1M", fmt="vpc")
    m = bat_map(str(sz))
    assert m.virtual_bytes == qemu_size(sz) == 100 * MiB
    assert m.extents == qemu_map(sz) and len(m.extents) == 1
    # a fixed VHD is a raw image with a footer at its end
    fixed = tmp_path / "f.vhd"
    subprocess.run(["qemu-img", "convert", "-O", "vpc", "-o", "subformat=fixed", str(img),
                    str(fixed)], check=True)
    assert image_format(str(fixed)) == "raw"


def _patched(good: bytes, at: int, fmt: str, value, csum_at: int | None = None,
             block: int = 0) -> bytes:
    """good with `value` packed at `at`, the checksum of the 512-byte footer
    (or the 1 KiB header at `block`) made right again."""
    b = bytearray(good)
    struct.pack_into(fmt, b, at, value)
    if csum_at is not None:
        n = 512 if block == 0 else 1024
        struct.pack_into(">I", b, block + csum_at, checksum(bytes(b[block:block + n]), csum_at))
    return bytes(b)


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = tmp_path / "b.vhd"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vpc", str(img), "16M"], check=True)
    qemu_io(img, "write -P 1 0 4k", fmt="vpc")
    good = img.read_bytes()
    dyn, = struct.unpack_from(">Q", good, 16)
    bat, = struct.unpack_from(">Q", good, dyn + 16)
    for bad, want in (
            (_patched(good, 0, "8s", b"conectiy"), r"offset 0: not a dynamic VHD"),
            (_patched(good, 60, ">I", 5), r"offset 64: footer checksum"),
            (_patched(good, 60, ">I", 4, 64), r"offset 60: disk type 4 \(differencing"),
            (_patched(good, dyn + 24, ">I", 0x00020000, 36, dyn),
             rf"offset {dyn + 24}: dynamic disk header version 2\.0"),
            (_patched(good, dyn + 32, ">I", 1000, 36, dyn), rf"offset {dyn + 32}: block size 1000"),
            (_patched(good, dyn + 32, ">I", 4096), rf"offset {dyn + 36}: dynamic disk header "
             "checksum"),
            (_patched(good, dyn + 28, ">I", 1, 36, dyn),
             rf"offset {dyn + 28}: 1 blocks of 2097152 bytes for a \d+-byte disk"),
            (_patched(good, bat, ">I", 1 << 20), rf"offset {bat}: block 0 at byte 536870912 "
             r"ends past the file's \d+ bytes"),
            (good[:300], r"offset 0: 512 bytes expected")):
        img.write_bytes(bad)
        with pytest.raises(VpcError, match=rf"{img}: {want}"):
            bat_map(str(img))
    img.write_bytes(good)
    assert bat_map(str(img)).extents == qemu_map(img)
