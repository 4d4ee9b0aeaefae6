"""The L1 and L2 tables nestrace reads from an image in QEMU's first qcow
format (version 1), against QEMU's own map (`qemu-img map`) on images QEMU
wrote, alone and over a backing file, and how one is told from a qcow2."""
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
from nestrace.images.qcow import QcowError, table_map

KiB, MiB = 1 << 10, 1 << 20


def test_the_table_map_is_qemus_for_writes_out_of_order(tmp_path):
    """Clusters (4 KiB by QEMU's default) are placed in the file in the
    order the guest first wrote them, each L2 table where the file ended
    when its first cluster was written; a compressed cluster has no place."""
    img = tmp_path / "d.qcow"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow", str(img), "300M"], check=True)
    qemu_io(img, "write -P 1 200M 64k", "write -P 2 0 4k", "write -P 3 5M 200k",
            "write -P 4 299M 1M", fmt="qcow")
    assert image_format(str(img)) == "qcow"
    m = table_map(str(img))
    assert (m.fmt, m.version, m.cluster_bytes, m.virtual_bytes) == ("qcow", 1, 4 * KiB, 300 * MiB)
    assert m.extents == qemu_map(img)
    assert [e[0] for e in sorted(m.extents, key=lambda e: e[1])][:3] == [200 * MiB, 0, 5 * MiB]
    # the header, the L1 table and the L2 tables are the image's own, apart from the data
    assert len(m.metadata) >= 4
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)
    assert cluster_map(str(img), "qcow") == m
    # a compressed cluster has no place a guest byte is read from
    z = tmp_path / "z.qcow"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow", str(z), "16M"], check=True)
    qemu_io(z, "write -c -P 5 0 4k", "write -P 6 8k 4k", fmt="qcow")
    m = table_map(str(z))
    assert m.extents == qemu_map(z) and [e[0] for e in m.extents] == [8 * KiB]
    assert (m.compressed_clusters, m.opaque) == (1, [(0, 4 * KiB)])
    # a qcow2 is still a qcow2
    q2 = tmp_path / "d.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(q2), "1M"], check=True)
    assert image_format(str(q2)) == "qcow2"


def test_a_qcow_over_a_backing_file_is_read_as_qemu_reads_it(tmp_path):
    """A qcow overlay (no backing format in the header: the base's is found
    by its first bytes) on a raw base: each disk byte is read from the file
    QEMU's map says."""
    base, top = tmp_path / "base.raw", tmp_path / "top.qcow"
    subprocess.run(["truncate", "-s", "8M", str(base)], check=True)
    qemu_io(base, "write -P 1 0 8M", fmt="raw")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow", "-b", "base.raw", "-F", "raw",
                    str(top)], cwd=tmp_path, check=True)
    qemu_io(top, "write -P 2 1M 512k", "write -P 3 7M 4k", fmt="qcow")
    m = table_map(str(top))
    assert m.backing_file == "base.raw" and m.backing_format == ""
    chain = backing_chain(str(top), "qcow")
    assert [(c.path, c.fmt) for c in chain] == [(str(top), "qcow"), (str(base), "raw")]
    got = coalesced(chain_extents(chain))
    assert got == qemu_chain_map(top)
    assert {i for _, i, _, _ in got} == {0, 1}


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    img = tmp_path / "b.qcow"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow", str(img), "16M"], check=True)
    qemu_io(img, "write -P 1 0 4k", fmt="qcow")
    good = img.read_bytes()
    for off, fmt, value, want in ((32, ">B", 20, r"offset 32: cluster_bits 20 out of 9\.\.16"),
                                  (33, ">B", 2, r"offset 33: l2_bits 2 out of 6\.\.16"),
                                  (36, ">I", 1, r"offset 36: encrypted \(method 1\)"),
                                  (16, ">I", 5000, r"offset 16: a backing file name of 5000")):
        patch_file(img, off, fmt, value, base=good)
        with pytest.raises(QcowError, match=rf"{img}: {want}"):
            table_map(str(img))
    # an L2 entry off a cluster boundary
    l1_off, = struct.unpack_from(">Q", good, 40)
    l2_off, = struct.unpack_from(">Q", good, l1_off)
    e, = struct.unpack_from(">Q", good, l2_off)
    patch_file(img, l2_off, ">Q", e + 512, base=good)
    with pytest.raises(QcowError, match=rf"{img}: offset {l2_off}: L2 entry for guest offset 0 "
                       rf"points to {e + 512}, not a cluster boundary"):
        table_map(str(img))
    patch_file(img, l1_off, ">Q", l2_off + 1, base=good)
    with pytest.raises(QcowError, match=rf"{img}: offset {l1_off}: L1 entry 0 points to "
                       rf"{l2_off + 1}, not a sector boundary"):
        table_map(str(img))
    img.write_bytes(good[:40])
    with pytest.raises(QcowError, match=rf"{img}: offset 0: 48 bytes expected"):
        table_map(str(img))
    # an L1 table offset past what pread takes (2**63: it raised OverflowError)
    patch_file(img, 40, ">Q", 1 << 63, base=good)
    with pytest.raises(QcowError, match=rf"{img}: offset {1 << 63}: \d+ bytes expected, the "
                       "file ends after 0"):
        table_map(str(img))
