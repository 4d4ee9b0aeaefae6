"""The block map nestrace reads from a vdi, against QEMU's own (`qemu-img
map`) on images QEMU wrote, and how a vdi is told from a raw image."""
from __future__ import annotations

import struct
import subprocess

import pytest
from test_qcow2 import _qemu_img, patch_file, qemu_io, qemu_map  # noqa: F401  (_qemu_img: fixture)

from nestrace.images.chain import cluster_map, image_format
from nestrace.images.vdi import VdiError, block_map

KiB, MiB = 1 << 10, 1 << 20


def test_the_block_map_is_qemus_for_writes_out_of_order(tmp_path):
    """Blocks (1 MiB) are placed in the file in the order the guest first
    wrote them; QEMU's first line is not VirtualBox's, the signature is."""
    img = tmp_path / "d.vdi"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vdi", str(img), "100M"], check=True)
    qemu_io(img, "write -P 1 50M 64k", "write -P 2 0 4k", "write -P 3 3M 2M",
            "write -P 4 99M 1M", fmt="vdi")
    assert not img.read_bytes().startswith(b"<<< Oracle VM VirtualBox")
    assert image_format(str(img)) == "vdi"
    m = block_map(str(img))
    assert (m.fmt, m.version, m.cluster_bytes, m.virtual_bytes) == ("vdi", 1, MiB, 100 * MiB)
    assert m.extents == qemu_map(img)
    assert [e[0] for e in sorted(m.extents, key=lambda e: e[1])] == [50 * MiB, 0, 3 * MiB, 99 * MiB]
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)
    assert cluster_map(str(img), "vdi") == m
    # a static image: every block allocated, in disk order
    st = tmp_path / "s.vdi"
    subprocess.run(["qemu-img", "convert", "-O", "vdi", "-o", "static=on", str(img), str(st)],
                   check=True)
    m = block_map(str(st))
    assert m.extents == qemu_map(st) and len(m.extents) == 1 and m.extents[0][2] == 100 * MiB


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = tmp_path / "b.vdi"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vdi", str(img), "16M"], check=True)
    qemu_io(img, "write -P 1 0 4k", fmt="vdi")
    good = img.read_bytes()
    for off, value, want in ((0x44, 0x00020000, r"offset 68: vdi version 2\.0"),
                             (0x4C, 7, r"offset 76: vdi image type 7"),
                             (0x178, 1000, r"offset 376: block size 1000")):
        patch_file(img, off, "<I", value, base=good)
        with pytest.raises(VdiError, match=rf"{img}: {want}"):
            block_map(str(img))
    # a block map entry past the image's blocks
    bmap_off, = struct.unpack("<I", good[0x154:0x158])
    patch_file(img, bmap_off + 4 * 3, "<I", 1000, base=good)
    with pytest.raises(VdiError, match=rf"{img}: offset {bmap_off + 12}: block 3 is data block "
                       r"1000 of 16"):
        block_map(str(img))
    img.write_bytes(good[:300])
    with pytest.raises(VdiError, match=rf"{img}: offset 64: .* bytes expected"):
        block_map(str(img))
