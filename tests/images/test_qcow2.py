"""The qcow2 cluster map nestrace reads, against QEMU's own (`qemu-img map`)
on images QEMU wrote."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess

import pytest

from nestrace.images.base import ImageMapError
from nestrace.images.chain import backing_chain, chain_extents
from nestrace.images.qcow2 import Qcow2Error, cluster_map

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(autouse=True)
def _qemu_img():
    if not shutil.which("qemu-img"):
        pytest.fail("no qemu-img (Debian package qemu-utils; ci/setup installs it)")


def qemu_map(path) -> list[tuple[int, int, int]]:
    """QEMU's map: the data extents, coalesced where contiguous in both."""
    out = json.loads(subprocess.run(["qemu-img", "map", "--output=json", str(path)],
                                    check=True, capture_output=True, text=True).stdout)
    ext: list[list[int]] = []
    for e in out:
        if not e["data"] or "offset" not in e:
            continue
        if ext and ext[-1][0] + ext[-1][2] == e["start"] and ext[-1][1] + ext[-1][2] == e["offset"]:
            ext[-1][2] += e["length"]
        else:
            ext.append([e["start"], e["offset"], e["length"]])
    return [tuple(x) for x in ext]


def patch_file(path, offset: int, fmt: str, *values, base: bytes | None = None) -> None:
    """Write struct-packed values into the file at offset (after writing
    `base` over the whole file first, when given): a damaged image."""
    if base is not None:
        path.write_bytes(base)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, *values))


def qemu_io(path, *cmds: str, fmt="qcow2") -> None:
    args = ["qemu-io", "-f", fmt]
    for c in cmds:
        args += ["-c", c]
    subprocess.run(args + [str(path)], check=True, capture_output=True)


def test_the_cluster_map_is_qemus_for_writes_out_of_order(tmp_path):
    """Clusters are placed in the file in the order the guest first wrote
    them, not in disk order; an all-zero cluster has no place."""
    img = tmp_path / "a.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(img), "300M"], check=True)
    qemu_io(img, "write -P 1 200M 64k", "write -P 2 0 4k", "write -P 3 5M 200k",
            "write -P 4 64k 64k", "write -P 5 270M 1M", "write -z 100M 128k")
    m = cluster_map(str(img))
    assert m.cluster_bytes == 64 * KiB and m.virtual_bytes == 300 * MiB and m.version == 3
    assert m.extents == qemu_map(img)
    assert len(m.extents) >= 4 and m.extents[0][0] == 0 and m.extents[0][1] > 0
    assert m.zero_clusters == 2 and m.compressed_clusters == 0 and not m.backing_file
    # the L1, an L2 and the refcount structures are metadata, apart from the data
    assert all(not (mo < ph + ln and ph < mo + ml)
               for ph, ln in ((p, n) for _, p, n in m.extents) for mo, ml in m.metadata)


def test_small_clusters_version_2_and_compressed_clusters(tmp_path):
    raw, img = tmp_path / "d.raw", tmp_path / "c.qcow2"
    subprocess.run(["truncate", "-s", "8M", str(raw)], check=True)
    qemu_io(raw, "write -P 7 0 1M", "write -P 9 3M 512k", fmt="raw")
    subprocess.run(["qemu-img", "convert", "-c", "-O", "qcow2", "-o", "compat=0.10",
                    str(raw), str(img)], check=True)
    m = cluster_map(str(img))
    assert m.version == 2 and m.compressed_clusters > 0 and m.extents == qemu_map(img) == []
    small = tmp_path / "s.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", "-o", "cluster_size=4096",
                    str(raw), str(small)], check=True)
    m = cluster_map(str(small))
    assert m.cluster_bytes == 4096 and m.extents == qemu_map(small)
    assert sum(n for *_, n in m.extents) == 1536 * KiB


def test_a_backing_file_is_named(tmp_path):
    base, top = tmp_path / "base.qcow2", tmp_path / "top.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "16M"], check=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2",
                    str(top)], check=True)
    m = cluster_map(str(top))
    assert m.backing_file == str(base) and m.backing_format == "qcow2"


def qemu_chain_map(path) -> list[tuple[int, int, int, int]]:
    """QEMU's map through the backing chain: (disk offset, depth, file
    offset, length) of every extent read from a file (a raw file's holes
    too: they are read from it), coalesced where contiguous."""
    out = json.loads(subprocess.run(["qemu-img", "map", "--output=json", str(path)],
                                    check=True, capture_output=True, text=True).stdout)
    ext: list[list[int]] = []
    for e in out:
        if "offset" not in e or (e["zero"] and not e["data"] and e["depth"] < 2):
            continue   # (depth 0 and 1 are qcow2 here: an all-zero cluster, no read)
        last = ext[-1] if ext else None
        if last and last[1] == e["depth"] and last[0] + last[3] == e["start"] \
                and last[2] + last[3] == e["offset"]:
            last[3] += e["length"]
        else:
            ext.append([e["start"], e["depth"], e["offset"], e["length"]])
    return [tuple(x) for x in ext]


def coalesced(ext):
    out: list[list[int]] = []
    for g, i, f, n in ext:
        if out and out[-1][1] == i and out[-1][0] + out[-1][3] == g and out[-1][2] + out[-1][3] == f:
            out[-1][3] += n
        else:
            out.append([g, i, f, n])
    return [tuple(x) for x in out]


def test_a_backing_chain_is_read_as_qemu_reads_it(tmp_path):
    """Three files: a raw base shorter than the disk, a qcow2 over it, a
    qcow2 overlay on top (the base named relative to the middle file).
    Each disk byte is read from the file QEMU's map says, at its offset;
    a zero cluster on top hides the layers below; past the base's end
    there is no file."""
    base, mid, top = tmp_path / "base.raw", tmp_path / "mid.qcow2", tmp_path / "top.qcow2"
    subprocess.run(["truncate", "-s", "6M", str(base)], check=True)
    qemu_io(base, "write -P 1 0 6M", fmt="raw")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw",
                    str(mid), "8M"], cwd=tmp_path, check=True)
    qemu_io(mid, "write -P 2 1M 512k", "write -P 3 7M 64k")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(mid), "-F", "qcow2",
                    str(top)], check=True)
    qemu_io(top, "write -P 4 1200k 8k", "write -P 5 0 4k", "write -z 3M 128k",
            "write -P 6 7M 4k")
    chain = backing_chain(str(top), "qcow2")
    assert [(c.path, c.fmt) for c in chain] == [(str(top), "qcow2"), (str(mid), "qcow2"),
                                                (str(base), "raw")]
    got = coalesced(chain_extents(chain))
    assert got == qemu_chain_map(top)
    assert {i for _, i, _, _ in got} == {0, 1, 2}
    # the zero cluster and the disk past the base's end are read from no file
    assert not any(g < 3 * MiB + 128 * KiB and 3 * MiB < g + n for g, _, _, n in got)
    assert not any(g < 7 * MiB and 6 * MiB < g + n for g, i, _, n in got if i == 2)
    # a copy-on-write of a partial cluster: the overlay holds the whole cluster
    assert (1152 * KiB, 0) in {(g, i) for g, i, _, _ in got}


def test_a_backing_chain_that_loops_or_leaves_the_file_system_is_refused(tmp_path):
    a, b = tmp_path / "a.qcow2", tmp_path / "b.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(a), "1M"], check=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(a), "-F", "qcow2",
                    str(b)], check=True)
    subprocess.run(["qemu-img", "rebase", "-u", "-f", "qcow2", "-b", str(b), "-F", "qcow2",
                    str(a)], check=True)
    with pytest.raises(ImageMapError, match=rf"{b}: its backing chain loops"):
        backing_chain(str(b), "qcow2")
    n = tmp_path / "n.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", "nbd://x:1/e",
                    "-F", "raw", str(n), "1M"], check=True)
    with pytest.raises(ImageMapError, match=rf"{n}: backing file 'nbd://x:1/e' is not a file"):
        backing_chain(str(n), "qcow2")


def test_bad_images_name_the_file_and_the_offset(tmp_path):
    bad = tmp_path / "x.qcow2"
    bad.write_bytes(b"QFI\xfa" + bytes(100))
    with pytest.raises(Qcow2Error, match=rf"{bad}: offset 0: not a qcow2 image"):
        cluster_map(str(bad))
    ext = tmp_path / "e.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "extended_l2=on", str(ext),
                    "16M"], check=True)
    with pytest.raises(Qcow2Error, match=rf"{ext}: offset 72: extended L2"):
        cluster_map(str(ext))
    # an L1 entry pointing past the end of the file
    img = tmp_path / "t.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(img), "16M"], check=True)
    qemu_io(img, "write -P 1 0 4k")
    head = img.read_bytes()[:72]
    l1_off, = struct.unpack(">Q", head[40:48])
    patch_file(img, l1_off, ">Q", (1 << 63) | (1 << 40))
    with pytest.raises(Qcow2Error, match=rf"{img}: offset {1 << 40}: 65536 bytes expected"):
        cluster_map(str(img))
