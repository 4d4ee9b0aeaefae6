"""The block allocation table nestrace reads from a vhdx, against the
bytes QEMU reads for the guest: `qemu-img map` gives no file offsets for
vhdx, so the oracle is the disk QEMU reads out (`qemu-img convert -O
raw`), which must equal the image file at every mapped extent and be
zeros everywhere else."""
from __future__ import annotations

import struct
import subprocess

import pytest
from test_qcow2 import _qemu_img, patch_file, qemu_io  # noqa: F401  (_qemu_img: fixture)

from nestrace.images.chain import cluster_map, image_format
from nestrace.images.vhdx import REGIONS_AT, VhdxError, bat_map, crc32c

KiB, MiB = 1 << 10, 1 << 20


def assert_map_reads_as_qemu(img, tmp_path, m) -> None:
    raw = tmp_path / "out.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(img), str(raw)], check=True)
    disk, data = raw.read_bytes(), img.read_bytes()
    assert len(disk) == m.virtual_bytes
    covered = 0
    for lo, ph, n in m.extents:
        assert disk[lo:lo + n] == data[ph:ph + n], (lo, ph, n)
        covered += n
    rest = bytearray(disk)
    for lo, _, n in m.extents:
        rest[lo:lo + n] = bytes(n)
    assert not any(rest), "QEMU reads data where the map has no place in the file"
    assert covered


def test_the_block_map_carries_every_guest_byte_to_where_qemu_reads_it(tmp_path):
    img = tmp_path / "a.vhdx"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vhdx", "-o", "block_size=1M", str(img),
                    "64M"], check=True)
    qemu_io(img, "write -P 1 40M 64k", "write -P 2 0 4k", "write -P 3 5M 3M",
            "write -P 5 63M 1M", fmt="vhdx")
    assert image_format(str(img)) == "vhdx"
    m = bat_map(str(img))
    assert (m.fmt, m.version, m.cluster_bytes, m.virtual_bytes) == ("vhdx", 1, MiB, 64 * MiB)
    # 40M was written first: its block is the first in the file after the tables
    first = min(m.extents, key=lambda e: e[1])
    assert first[0] == 40 * MiB and [e[0] for e in m.extents] == [0, 5 * MiB, 40 * MiB, 63 * MiB]
    assert sum(n for *_, n in m.extents) == 6 * MiB and not m.dirty and not m.backing_file
    assert m.zero_clusters == 64 - 6   # QEMU creates every block as a ZERO block
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)
    assert_map_reads_as_qemu(img, tmp_path, m)
    assert cluster_map(str(img), "vhdx") == m
    # a bigger disk, QEMU's default block size for it (8 MiB here)
    big = tmp_path / "b.vhdx"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vhdx", str(big), "300M"], check=True)
    qemu_io(big, "write -P 7 200M 64k", "write -P 8 0 4k", "write -P 9 270M 1M", fmt="vhdx")
    m = bat_map(str(big))
    assert m.cluster_bytes == 8 * MiB and len(m.extents) == 3
    assert_map_reads_as_qemu(big, tmp_path, m)


def test_crc32c_is_castagnolis():
    assert crc32c(b"123456789") == 0xE3069283


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = tmp_path / "b.vhdx"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vhdx", "-o", "block_size=1M", str(img),
                    "16M"], check=True)
    good = img.read_bytes()
    bad = bytearray(good)
    bad[:8] = b"vhdxfilx"
    img.write_bytes(bad)
    with pytest.raises(VhdxError, match=rf"{img}: offset 0: not a vhdx image"):
        bat_map(str(img))
    # both region tables damaged: their checksums fail
    bad = bytearray(good)
    for at in REGIONS_AT:
        bad[at + 20] ^= 0xFF
    img.write_bytes(bad)
    with pytest.raises(VhdxError, match=rf"{img}: offset {REGIONS_AT[0]}: neither region table"):
        bat_map(str(img))
    # one damaged: the other is used
    bad = bytearray(good)
    bad[REGIONS_AT[0] + 20] ^= 0xFF
    img.write_bytes(bad)
    assert bat_map(str(img)).virtual_bytes == 16 * MiB
    # a metadata item past its region's end: the offset of the entry
    # that says so
    meta_off, = struct.unpack_from("<Q", good, REGIONS_AT[0] + 16 + 32 + 16)   # entry 1
    patch_file(img, meta_off + 32 + 16, "<I", 1 << 30, base=good)
    with pytest.raises(VhdxError, match=rf"{img}: offset {meta_off + 48}: metadata item"):
        bat_map(str(img))
