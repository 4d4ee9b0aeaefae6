"""Where nestrace puts a LUKS image's disk bytes, against the file bytes
QEMU's encrypted writes change, and how a bad header is refused."""
from __future__ import annotations

import subprocess

import pytest
from test_qcow2 import _qemu_img, patch_file  # noqa: F401  (_qemu_img: fixture)

from nestrace.images.chain import cluster_map, image_format
from nestrace.images.luks import LuksError, header_map

KiB, MiB = 1 << 10, 1 << 20
SECRET = ["--object", "secret,id=s0,data=nestrace"]


def luks_io(path, *cmds: str) -> None:
    args = ["qemu-io", *SECRET, "--image-opts"]
    for c in cmds:
        args += ["-c", c]
    subprocess.run(args + [f"driver=luks,key-secret=s0,file.filename={path}"], check=True,
                   capture_output=True)


def create_luks(img, size: str) -> None:
    """A LUKS image as QEMU creates it.  QEMU calibrates its key
    derivation on the CPU time its first 2^15 iterations take, and fails
    ("Unable to get accurate CPU usage") when that measures 0 ms: on this
    VM they often take under a millisecond, and up to 16 creations in 20
    have failed so: a failed creation is tried again, up to 200 times."""
    for _ in range(200):
        r = subprocess.run(["qemu-img", "create", "-q", "-f", "luks", *SECRET, "-o",
                            "key-secret=s0,iter-time=250", str(img), size],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return
        assert "Unable to get accurate CPU usage" in r.stderr, r.stderr
    pytest.fail(f"qemu-img could not create a LUKS image in 200 tries: {r.stderr}")


@pytest.fixture(scope="module")
def luks_bytes(tmp_path_factory) -> bytes:
    """A 16 MiB LUKS image as QEMU creates it, once."""
    img = tmp_path_factory.mktemp("luks") / "d.luks"
    create_luks(img, "16M")
    return img.read_bytes()


def changed_sectors(a: bytes, b: bytes) -> set[int]:
    return {i // 512 for i in range(0, len(a), 512) if a[i:i + 512] != b[i:i + 512]}


def test_each_disk_byte_is_where_qemus_writes_land(tmp_path, luks_bytes):
    """QEMU encrypts each 512-byte sector in place: the sectors a write
    changes in the file are the map's place for the disk bytes written,
    and no others."""
    img = tmp_path / "d.luks"
    img.write_bytes(luks_bytes)
    assert image_format(str(img)) == "luks"
    m = header_map(str(img))
    assert (m.fmt, m.version, m.virtual_bytes, m.cluster_bytes) == ("luks", 1, 16 * MiB, 0)
    (g, payload, n), = m.extents
    assert g == 0 and n == 16 * MiB and payload == img.stat().st_size - 16 * MiB
    assert m.metadata == [(0, payload)] and cluster_map(str(img), "luks") == m
    writes = [(0, 4 * KiB), (5 * MiB + 512, 3 * KiB), (16 * MiB - 64 * KiB, 64 * KiB)]
    before = img.read_bytes()
    luks_io(img, *(f"write -P 7 {off} {ln}" for off, ln in writes))
    want = {(payload + s) // 512 for off, ln in writes for s in range(off, off + ln, 512)}
    assert changed_sectors(before, img.read_bytes()) == want


def test_bad_headers_name_the_file_and_the_offset(tmp_path, luks_bytes):
    img = tmp_path / "b.luks"
    good = luks_bytes
    for off, fmt, value, want in ((0, "6s", b"LUKS\0\0", r"offset 0: not a LUKS image"),
                                  (6, ">H", 2, r"offset 6: LUKS version 2 \(1 is read\)"),
                                  (104, ">I", 1 << 20, r"offset 104: payload at 536870912")):
        patch_file(img, off, fmt, value, base=good)
        with pytest.raises(LuksError, match=rf"{img}: {want}"):
            header_map(str(img))
    img.write_bytes(good[:100])
    with pytest.raises(LuksError, match=rf"{img}: offset 0: 592 bytes expected"):
        header_map(str(img))
