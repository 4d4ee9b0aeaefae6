"""The cluster map nestrace reads from a QED image, against QEMU's own
(`qemu-img map`) on images QEMU wrote, through backing chains too."""
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

from nestrace.images.chain import (
    backing_chain,
    chain_extents,
    cluster_map,
    image_format,
)
from nestrace.images.qed import QedError, table_map

KiB, MiB = 1 << 10, 1 << 20


def test_the_cluster_map_is_qemus_for_writes_out_of_order(tmp_path):
    """Clusters are placed in the file in the order the guest first wrote
    them; a zero cluster has no place; a disk past one L2 table's reach
    (16 KiB clusters, tables of two: 64 MiB of disk each) has several."""
    img = tmp_path / "a.qed"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qed", "-o",
                    "cluster_size=16384,table_size=2", str(img), "100M"], check=True)
    qemu_io(img, "write -P 1 70M 64k", "write -P 2 0 4k", "write -P 3 5M 200k",
            "write -P 4 40M 16k", "write -P 5 99M 1M", "write -z 20M 32k", fmt="qed")
    assert image_format(str(img)) == "qed"
    m = table_map(str(img))
    assert (m.fmt, m.cluster_bytes, m.virtual_bytes) == ("qed", 16 * KiB, 100 * MiB)
    assert m.extents == qemu_map(img)
    assert [e[0] for e in sorted(m.extents, key=lambda e: e[1])][:4] == [70 * MiB, 0, 5 * MiB,
                                                                      40 * MiB]
    assert m.zero_clusters == 2 and m.opaque == [(20 * MiB, 32 * KiB)]
    assert not m.backing_file and not m.dirty
    # the header, the L1 and the two L2 tables are metadata, apart from the data
    header_clusters, = struct.unpack("<I", img.read_bytes()[12:16])
    assert sum(n for _, n in m.metadata) == 16 * KiB * (header_clusters + 2 + 2 * 2)
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)
    assert cluster_map(str(img), "qed") == m


def test_a_backing_chain_is_read_as_qemu_reads_it(tmp_path):
    """A qed over a raw base shorter than the disk (the raw format named in
    the header's no-probe bit), a qcow2 overlay on the qed.  Each disk byte
    is read from the file QEMU's map says; a qed zero cluster hides the
    base."""
    base, mid, top = tmp_path / "base.raw", tmp_path / "mid.qed", tmp_path / "top.qcow2"
    subprocess.run(["truncate", "-s", "6M", str(base)], check=True)
    qemu_io(base, "write -P 1 0 6M", fmt="raw")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qed", "-b", "base.raw", "-F", "raw",
                    str(mid), "8M"], cwd=tmp_path, check=True)
    qemu_io(mid, "write -P 2 1M 512k", "write -P 3 7M 64k", "write -z 2M 128k", fmt="qed")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(mid), "-F", "qed",
                    str(top)], check=True)
    qemu_io(top, "write -P 4 1200k 8k", "write -P 6 7M 4k")
    m = table_map(str(mid))
    assert (m.backing_file, m.backing_format) == ("base.raw", "raw")
    chain = backing_chain(str(top), "qcow2")
    assert [(c.path, c.fmt) for c in chain] == [(str(top), "qcow2"), (str(mid), "qed"),
                                                (str(base), "raw")]
    got = coalesced(chain_extents(chain))
    assert got == qemu_chain_map(top)
    assert {i for _, i, _, _ in got} == {0, 1, 2}
    assert not any(g < 2 * MiB + 128 * KiB and 2 * MiB < g + n for g, _, _, n in got)
    # a qed whose backing file is probed: a qcow2 base
    over = tmp_path / "over.qed"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qed", "-b", str(top), "-F", "qcow2",
                    str(over)], check=True)
    qemu_io(over, "write -P 7 3M 4k", fmt="qed")
    m = table_map(str(over))
    assert (m.backing_file, m.backing_format) == (str(top), "")
    chain = backing_chain(str(over), "qed")
    assert [c.fmt for c in chain] == ["qed", "qcow2", "qed", "raw"]
    assert coalesced(chain_extents(chain)) == qemu_chain_map(over)


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = tmp_path / "b.qed"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qed", str(img), "16M"], check=True)
    qemu_io(img, "write -P 1 0 4k", fmt="qed")
    good = img.read_bytes()
    l1_off, = struct.unpack("<Q", good[40:48])
    for off, fmt, value, want in (
            (0, "<4s", b"QEF\0", r"offset 0: not a qed image"),
            (4, "<I", 5000, r"offset 4: cluster size 5000"),
            (8, "<I", 3, r"offset 8: table size 3 clusters"),
            (16, "<Q", 0x10, r"offset 16: unknown feature bits 0x10"),
            (40, "<Q", l1_off + 512, rf"offset 40: L1 table at {l1_off + 512}"),
            (48, "<Q", 16 * MiB + 100, r"offset 48: a 16777316-byte disk"),
            (l1_off, "<Q", 4096 + 8, rf"offset {l1_off}: L1 entry 0 points to 4104")):
        patch_file(img, off, fmt, value, base=good)
        with pytest.raises(QedError, match=rf"{img}: {want}"):
            table_map(str(img))
    # an L2 entry off a cluster boundary
    l2_off, = struct.unpack("<Q", good[l1_off:l1_off + 8])
    patch_file(img, l2_off, "<Q", 3 * 65536 + 4096, base=good)
    with pytest.raises(QedError, match=rf"{img}: offset {l2_off}: L2 entry for guest offset 0 "
                       rf"points to {3 * 65536 + 4096}, not a cluster boundary"):
        table_map(str(img))
    img.write_bytes(good[:30])
    with pytest.raises(QedError, match=rf"{img}: offset 0: 64 bytes expected"):
        table_map(str(img))
