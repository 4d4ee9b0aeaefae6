"""The grain map nestrace reads from a sparse vmdk, against QEMU's own
(`qemu-img map`) on images QEMU wrote; and the vmdk files it refuses to
map, with what it says instead."""
from __future__ import annotations

import struct
import subprocess

import pytest
from test_qcow2 import (  # noqa: F401
    _qemu_img,
    coalesced,
    patch_file,
    qemu_chain_map,
    qemu_io,
    qemu_map,
)

from nestrace.images.chain import backing_chain, chain_extents, cluster_map
from nestrace.images.vmdk import VmdkError, grain_map

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


def qemu_file_map(path) -> list[tuple[int, int, int, str]]:
    """QEMU's map with the file each extent is read from (the human form
    of `qemu-img map`: its JSON names no file): (disk offset, file offset,
    length, file name without its directory)."""
    out = subprocess.run(["qemu-img", "map", "-f", "vmdk", str(path)], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    return [(int(a, 16), int(c, 16), int(b, 16), f.rsplit("/", 1)[-1]) for a, b, c, f in
            (line.split(None, 3) for line in out[1:] if line.strip())]


def file_map(chain) -> list[tuple[int, int, int, str]]:
    """chain_extents as qemu_file_map gives it."""
    return [(g, f, n, chain[i].path.rsplit("/", 1)[1]) for g, i, f, n in coalesced(
        chain_extents(chain))]


def test_a_split_disk_is_read_through_its_descriptor_as_qemu_reads_it(tmp_path):
    """VMware Workstation's "split into 2 GB files" (twoGbMaxExtentSparse):
    a descriptor file names the extent files, each a sparse extent of 2
    GiB of the disk.  Each disk byte is read from the extent file QEMU's
    map says, at its offset, also a write across two of them; the
    descriptor holds no byte; a split snapshot over a split parent is read
    through the parent's extents."""
    base, snap = tmp_path / "base.vmdk", tmp_path / "snap.vmdk"
    create(base, "5G", "subformat=twoGbMaxExtentSparse")
    qemu_io(base, "write -P 1 0 1M", "write -P 2 2047M 2M", "write -P 3 4100M 4k", fmt="vmdk")
    chain = backing_chain(str(base), "vmdk")
    assert [(c.path.rsplit("/", 1)[1], c.fmt, c.extent) for c in chain] == [
        ("base.vmdk", "vmdk", False), ("base-s001.vmdk", "vmdk", True),
        ("base-s002.vmdk", "vmdk", True), ("base-s003.vmdk", "vmdk", True)]
    assert chain[0].map.extents == [] and chain[0].map.cluster_bytes == 64 * KiB
    assert chain[0].map.metadata == [(0, base.stat().st_size)]
    assert all(c.virtual_bytes == 5 << 30 for c in chain)
    got = file_map(chain)
    assert got == qemu_file_map(base)
    assert {f for *_, f in got} == {"base-s001.vmdk", "base-s002.vmdk", "base-s003.vmdk"}
    # (each extent file's own header and grain tables are its metadata)
    assert all(c.map.metadata and c.map.metadata[0][0] == 0 for c in chain[1:])

    subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", "-o", "subformat=twoGbMaxExtentSparse",
                    "-b", "base.vmdk", "-F", "vmdk", str(snap)], cwd=tmp_path, check=True)
    qemu_io(snap, "write -P 4 512k 4k", "write -P 5 2048M 64k", fmt="vmdk")
    chain = backing_chain(str(snap), "vmdk")
    assert [(c.path.rsplit("/", 1)[1], c.extent) for c in chain] == [
        ("snap.vmdk", False), ("snap-s001.vmdk", True), ("snap-s002.vmdk", True),
        ("snap-s003.vmdk", True), ("base.vmdk", False), ("base-s001.vmdk", True),
        ("base-s002.vmdk", True), ("base-s003.vmdk", True)]
    got = file_map(chain)
    assert got == qemu_file_map(snap)
    assert {f for *_, f in got} == {"snap-s001.vmdk", "snap-s002.vmdk", "base-s001.vmdk",
                                    "base-s002.vmdk", "base-s003.vmdk"}


def test_flat_and_zero_extents_and_a_mix_are_read_as_qemu_reads_them(tmp_path):
    """monolithicFlat (one raw extent file), and a descriptor written by
    hand as VMware allows: a sparse extent, a flat one from an offset into
    its file, a ZERO extent (no file: it reads zeros, the parent is not
    read there)."""
    flat = tmp_path / "f.vmdk"
    create(flat, "10M", "subformat=monolithicFlat")
    chain = backing_chain(str(flat), "vmdk")
    assert [(c.path.rsplit("/", 1)[1], c.fmt, c.extent) for c in chain] == [
        ("f.vmdk", "vmdk", False), ("f-flat.vmdk", "raw", True)]
    assert chain[0].map.cluster_bytes == 0
    assert file_map(chain) == [(0, 0, 10 * MiB, "f-flat.vmdk")]

    create(tmp_path / "p.vmdk", "4M", "subformat=twoGbMaxExtentSparse")
    # (not sparse: QEMU's map leaves a flat file's holes out, which QEMU reads)
    (tmp_path / "raw.bin").write_bytes(b"\1" * (8 * MiB))
    mix = tmp_path / "mix.vmdk"
    # (QEMU wants the comment lines, and leaves a ZERO extent out of the
    # disk: it is the last one here, and QEMU's writes stay before it)
    mix.write_text('# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\n'
                   'createType="twoGbMaxExtentSparse"\n\n# Extent description\n'
                   'RW 8192 SPARSE "p-s001.vmdk"\n'
                   'RW 4096 FLAT "raw.bin" 2048\n'
                   'RW 4096 ZERO\n\n# The Disk Data Base\n#DDB\n\n'
                   'ddb.adapterType = "ide"\n')
    qemu_io(mix, "write -P 1 0 64k", "write -P 2 4M 1M", "write -P 3 1M 4k", fmt="vmdk")
    chain = backing_chain(str(mix), "vmdk")
    assert [(c.path.rsplit("/", 1)[1], c.fmt) for c in chain] == [
        ("mix.vmdk", "vmdk"), ("p-s001.vmdk", "vmdk"), ("raw.bin", "raw")]
    assert chain[0].map.opaque == [(6 * MiB, 2 * MiB)] and chain[0].map.virtual_bytes == 8 * MiB
    got = file_map(chain)
    assert got == qemu_file_map(mix)
    assert got[-1] == (4 * MiB, 1 * MiB, 2 * MiB, "raw.bin")


def test_a_split_disk_that_cannot_be_read_is_refused_naming_the_file_and_offset(tmp_path):
    d = tmp_path / "t.vmdk"
    create(d, "3G", "subformat=twoGbMaxExtentSparse")
    text = d.read_text()
    part = tmp_path / "t-s002.vmdk"
    # an extent file on its own: it does not say where on the disk it is
    with pytest.raises(VmdkError, match=rf"{part}: offset 28: no descriptor in the file.*give "
                       "the descriptor"):
        grain_map(str(part))
    with pytest.raises(VmdkError, match=rf"{d}: offset 0: a vmdk descriptor file, not a sparse "
                       "extent"):
        grain_map(str(d))
    # the descriptor's size for an extent is not the extent file's
    d.write_text(text.replace("RW 2097152 SPARSE", "RW 2097160 SPARSE"))
    at = text.index("RW 2097152")
    with pytest.raises(VmdkError, match=rf"{d}: offset {at}: extent "
                       r"t-s002\.vmdk holds 1073741824 bytes, the descriptor gives it 1073745920"):
        backing_chain(str(d), "vmdk")
    # an extent kind not read, and a missing extent file
    d.write_text(text.replace("RW 2097152 SPARSE", "RW 2097152 SESPARSE"))
    with pytest.raises(VmdkError, match=rf"{d}: offset {at}: a SESPARSE "
                       "extent"):
        backing_chain(str(d), "vmdk")
    part.unlink()
    d.write_text(text)
    with pytest.raises(VmdkError, match=rf"{part}: No such file"):
        backing_chain(str(d), "vmdk")


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = tmp_path / "b.vmdk"
    create(img, "16M")
    qemu_io(img, "write -P 1 0 4k", fmt="vmdk")
    good = img.read_bytes()
    for off, value, fmt, want in ((0, b"KDMW", "4s", r"offset 0: not a sparse vmdk"),
                                  (4, 9, "<I", r"offset 4: vmdk sparse extent version 9"),
                                  (44, 4096, "<I", r"offset 44: 4096 entries per grain table")):
        patch_file(img, off, fmt, value, base=good)
        with pytest.raises(VmdkError, match=rf"{img}: {want}"):
            grain_map(str(img))
    # a grain directory entry pointing past the end of the file
    gd_sector, = struct.unpack("<Q", good[56:64])
    patch_file(img, gd_sector * 512, "<I", 1 << 30, base=good)
    with pytest.raises(VmdkError, match=rf"{img}: offset {(1 << 30) * 512}: 2048 bytes expected"):
        grain_map(str(img))
    short = tmp_path / "s.vmdk"
    short.write_bytes(b"KDMV" + bytes(20))
    with pytest.raises(VmdkError, match=rf"{short}: offset 0: 79 bytes expected"):
        grain_map(str(short))
