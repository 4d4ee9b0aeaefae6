"""The grain map nestrace reads from a sparse vmdk, against QEMU's own
(`qemu-img map`) on images QEMU wrote; and the vmdk files it refuses to
map, with what it says instead."""
from __future__ import annotations

import struct
import subprocess

import pytest

from nestrace.imagemap import cluster_map
from nestrace.vmdk import VmdkError, grain_map
from nestrace.imagemap import backing_chain, chain_extents
from test_qcow2 import _qemu_img, coalesced, qemu_chain_map, qemu_io, qemu_map  # noqa: F401  (_qemu_img: fixture)

KiB, MiB = 1 << 10, 1 << 20


def create(path, size, *opts: str) -> None:
    args = ["qemu-img", "create", "-q", "-f", "vmdk"]
    for o in opts:
        args += ["-o", o]
    subprocess.run(args + [str(path), size], check=True)


def test_the_grain_map_is_qemus_for_writes_out_of_order(tmp_path):
    """Grains are placed in the file in the order the guest first wrote
    them, not in disk order; the header, descriptor, grain directories and
    tables are metadata, apart from the data."""
    img = tmp_path / "a.vmdk"
    create(img, "300M")
    qemu_io(img, "write -P 1 200M 64k", "write -P 2 0 4k", "write -P 3 5M 200k",
            "write -P 4 64k 64k", "write -P 5 270M 1M", fmt="vmdk")
    m = grain_map(str(img))
    assert (m.fmt, m.version, m.cluster_bytes, m.virtual_bytes) == ("vmdk", 1, 64 * KiB, 300 * MiB)
    assert m.extents == qemu_map(img)
    assert len(m.extents) >= 4 and m.extents[0][0] == 0 and m.extents[0][1] > 0
    # 200M was written first: its grain is the file's first
    assert min(m.extents, key=lambda e: e[1])[0] == 200 * MiB
    assert m.zero_clusters == m.compressed_clusters == 0 and not m.backing_file and not m.dirty
    assert m.metadata and m.metadata[0][0] == 0
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)
    assert cluster_map(str(img), "vmdk") == m


def test_zeroed_grains_compressed_grains_and_a_parent_are_told_apart(tmp_path):
    z = tmp_path / "z.vmdk"
    create(z, "100M", "zeroed_grain=on")
    qemu_io(z, "write -P 1 0 64k", "write -z 1M 128k", "write -P 3 5M 4k", fmt="vmdk")
    m = grain_map(str(z))
    assert m.version == 2 and m.zero_clusters == 2 and m.extents == qemu_map(z)
    assert sum(n for *_, n in m.extents) == 128 * KiB
    # streamOptimized: every grain compressed, none with a place in the file
    s = tmp_path / "s.vmdk"
    subprocess.run(["qemu-img", "convert", "-O", "vmdk", "-o", "subformat=streamOptimized",
                    str(z), str(s)], check=True)
    m = grain_map(str(s))
    assert m.compressed_clusters == 2 and m.extents == qemu_map(s) == []
    top = tmp_path / "top.vmdk"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", "-b", str(z), "-F", "vmdk",
                    str(top)], check=True)
    assert grain_map(str(top)).backing_file == str(z)


def test_a_vmdk_snapshot_is_read_through_its_parent_as_qemu_reads_it(tmp_path):
    """A vmdk over a vmdk parent (named relative to it, as VMware's
    snapshots are), with zeroed grains: each disk byte is read from the
    file QEMU's map says; a zeroed grain hides the parent; a partial write
    of a grain made the snapshot hold the whole grain."""
    base, top = tmp_path / "base.vmdk", tmp_path / "snap.vmdk"
    create(base, "8M")
    qemu_io(base, "write -P 1 0 1M", "write -P 2 4M 256k", fmt="vmdk")
    subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", "-o", "zeroed_grain=on", "-b",
                    "base.vmdk", "-F", "vmdk", str(top)], cwd=tmp_path, check=True)
    qemu_io(top, "write -P 3 520k 4k", "write -z 4M 128k", "write -P 4 7M 64k", fmt="vmdk")
    chain = backing_chain(str(top), "vmdk")
    assert [(c.path, c.fmt) for c in chain] == [(str(top), "vmdk"), (str(base), "vmdk")]
    assert chain[0].map.opaque == [(4 * MiB, 128 * KiB)]
    got = coalesced(chain_extents(chain))
    assert got == qemu_chain_map(top)
    assert (512 * KiB, 0) in {(g, i) for g, i, _, _ in got}        # the whole grain
    assert not any(g < 4 * MiB + 128 * KiB and 4 * MiB < g + n for g, _, _, n in got)
    assert (4 * MiB + 128 * KiB, 1) in {(g, i) for g, i, _, _ in got}


def test_a_disk_whose_descriptor_is_its_own_file_is_refused_naming_its_extents(tmp_path):
    flat = tmp_path / "f.vmdk"
    create(flat, "10M", "subformat=monolithicFlat")
    with pytest.raises(VmdkError, match=rf"{flat}: offset 0: a vmdk descriptor file, not a disk: "
                       r".*f-flat\.vmdk \(FLAT, raw from its byte 0: give it as the image\)"):
        grain_map(str(flat))
    split = tmp_path / "t.vmdk"
    create(split, "3G", "subformat=twoGbMaxExtentSparse")
    with pytest.raises(VmdkError, match=r"t-s001\.vmdk \(SPARSE\); .*t-s002\.vmdk \(SPARSE\)"):
        grain_map(str(split))
    part = tmp_path / "t-s002.vmdk"
    with pytest.raises(VmdkError, match=rf"{part}: offset 28: no descriptor in the file"):
        grain_map(str(part))


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = tmp_path / "b.vmdk"
    create(img, "16M")
    qemu_io(img, "write -P 1 0 4k", fmt="vmdk")
    good = img.read_bytes()
    for off, value, fmt, want in ((0, b"KDMW", "4s", r"offset 0: not a sparse vmdk"),
                                  (4, 9, "<I", r"offset 4: vmdk sparse extent version 9"),
                                  (44, 4096, "<I", r"offset 44: 4096 entries per grain table")):
        img.write_bytes(good)
        with open(img, "r+b") as f:
            f.seek(off)
            f.write(struct.pack(fmt, value))
        with pytest.raises(VmdkError, match=rf"{img}: {want}"):
            grain_map(str(img))
    # a grain directory entry pointing past the end of the file
    img.write_bytes(good)
    gd_sector, = struct.unpack("<Q", good[56:64])
    with open(img, "r+b") as f:
        f.seek(gd_sector * 512)
        f.write(struct.pack("<I", 1 << 30))
    with pytest.raises(VmdkError, match=rf"{img}: offset {(1 << 30) * 512}: 2048 bytes expected"):
        grain_map(str(img))
    short = tmp_path / "s.vmdk"
    short.write_bytes(b"KDMV" + bytes(20))
    with pytest.raises(VmdkError, match=rf"{short}: offset 0: 79 bytes expected"):
        grain_map(str(short))
