"""The block allocation table nestrace reads from a Parallels image, against
QEMU's own (`qemu-img map`) on images QEMU wrote, in both of the format's
flavours, and how one is told from a raw image."""
from __future__ import annotations

import struct
import subprocess

import pytest
from test_qcow2 import _qemu_img, patch_file, qemu_io, qemu_map  # noqa: F401  (_qemu_img: fixture)

from nestrace.images.chain import cluster_map, image_format
from nestrace.images.parallels import ParallelsError, bat_map

KiB, MiB = 1 << 10, 1 << 20


def _written(tmp_path, name="d.hds", size="100M", opts=()):
    img = tmp_path / name
    subprocess.run(["qemu-img", "create", "-q", "-f", "parallels", *opts, str(img), size],
                   check=True)
    qemu_io(img, "write -P 1 50M 64k", "write -P 2 0 4k", "write -P 3 3M 2M",
            "write -P 4 99M 1M", fmt="parallels")
    return img


def test_the_bat_is_qemus_for_writes_out_of_order(tmp_path):
    """Clusters (1 MiB) are placed in the file in the order the guest first
    wrote them, after the header and BAT's own first cluster."""
    img = _written(tmp_path)
    assert image_format(str(img)) == "parallels"
    m = bat_map(str(img))
    assert (m.fmt, m.version, m.cluster_bytes, m.virtual_bytes) == ("parallels", 2, MiB, 100 * MiB)
    assert m.extents == qemu_map(img)
    assert [e[0] for e in sorted(m.extents, key=lambda e: e[1])] == [50 * MiB, 0, 3 * MiB, 99 * MiB]
    # the header, the BAT and the padding to the data area are the image's own
    assert m.metadata == [(0, MiB)] and not m.dirty
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)
    assert cluster_map(str(img), "parallels") == m
    # another cluster size, and a disk that ends inside its last cluster
    odd = _written(tmp_path, "odd.hds", "100M", ("-o", "cluster_size=192k"))
    m = bat_map(str(odd))
    assert m.cluster_bytes == 192 * KiB and m.extents == qemu_map(odd)
    assert m.extents[-1][0] + m.extents[-1][2] == m.virtual_bytes == 100 * MiB


def test_the_first_flavour_counts_in_sectors(tmp_path):
    """A "WithoutFreeSpace" image keeps its BAT entries in sectors, and its
    disk size in 4 bytes, the 4 above them not read.  Made here from a
    QEMU image (magic, entries and size rewritten) and checked against
    QEMU's map of it, which holds the same data."""
    img = _written(tmp_path)
    new = bat_map(str(img))
    good = bytearray(img.read_bytes())
    entries, = struct.unpack_from("<I", good, 32)
    bat = struct.unpack_from(f"<{entries}I", good, 64)
    good[0:16] = b"WithoutFreeSpace"
    struct.pack_into(f"<{entries}I", good, 64, *(e * 2048 for e in bat))
    good[40:44] = b"\xff\xff\xff\xff"       # high bytes of nb_sectors: not read
    img.write_bytes(bytes(good))
    old = bat_map(str(img))
    assert old.extents == new.extents == qemu_map(img)
    assert old.virtual_bytes == 100 * MiB
    out = subprocess.run(["qemu-io", "-f", "parallels", "-c", "read -P 4 99M 1M", str(img)],
                         check=True, capture_output=True, text=True).stdout
    assert "read 1048576/1048576" in out


def test_an_image_left_open_is_dirty(tmp_path):
    img = _written(tmp_path)
    patch_file(img, 44, "<I", 0x746F6E59)
    assert bat_map(str(img)).dirty


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = _written(tmp_path)
    good = img.read_bytes()
    first, = struct.unpack_from("<I", good, 64)       # where cluster 0 is, in clusters
    for off, value, want in (
            (16, 3, r"offset 16: Parallels version 3"),
            (28, 0, r"offset 28: a cluster of 0 sectors"),
            (64 + 4 * 7, 1000, r"offset 92: cluster 7 at byte 1048576000, outside the "
                               r"data area \(bytes 1048576 to \d+\)"),
            (64 + 4 * 9, first, rf"offset 100: cluster 9 at byte {first * MiB}, where "
                                r"cluster 0 is too")):
        patch_file(img, off, "<I", value, base=good)
        with pytest.raises(ParallelsError, match=rf"{img}: {want}"):
            bat_map(str(img))
    img.write_bytes(good[:300])
    with pytest.raises(ParallelsError, match=rf"{img}: offset 64: 400 bytes expected"):
        bat_map(str(img))
    img.write_bytes(b"WithoutFreeSpacX" + good[16:])
    with pytest.raises(ParallelsError, match=rf"{img}: offset 0: not a Parallels image"):
        bat_map(str(img))
