"""Damaged copies of real files, read by nestrace's readers (tests/fuzzer.py,
in a child process, fixed seeds): each is read, or refused naming the
file and an offset; no other exception, hang or crash."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from test_luks import create_luks
from test_seal import block_batch

from nestrace.images.base import MAPPED
from nestrace.schema import RECORDS
from nestrace.store.files import LIVE, LiveCapture, init_store

FUZZER = [sys.executable, str(ROOT / "tests" / "fuzzer.py")]


def fuzz(kind: str, base, n: int, seed: int = 1) -> None:
    r = subprocess.run(FUZZER + [kind, str(base), str(n), str(seed)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (f"{kind}: exit {r.returncode} (a negative one: killed by that "
                               f"signal; the mutant is {base}.mutant)\n{r.stdout}{r.stderr[-2000:]}")
    print(r.stderr.strip().splitlines()[-1])      # (its count per class: seen with -s)


def test_a_live_captures_damaged_ipc_streams_are_read_or_named(tmp_path):
    """(pyarrow 26 crashed on a first message of an unknown type read as a
    schema: 1 of the first 2,000 mutants of a real stream)"""
    store = init_store(tmp_path / "s")
    live = LiveCapture(store, "c1")
    for i in range(8):
        live.write(RECORDS["block_event"]["table"], block_batch(1 + i * 100))
    live.close()
    fuzz("ipc", store / LIVE / "c1" / f"{RECORDS['block_event']['table']}.arrows", 2000)


@pytest.mark.parametrize("fmt", MAPPED)
def test_damaged_images_maps_are_read_or_named(tmp_path, fmt):
    if not shutil.which("qemu-img"):
        pytest.fail("no qemu-img (Debian package qemu-utils; ci/setup installs it)")
    img = tmp_path / f"d.{fmt}"
    if fmt == "luks":
        create_luks(img, "64M")
    else:
        opts = {"vmdk": ["-o", "subformat=monolithicSparse"]}.get(fmt, [])
        subprocess.run(["qemu-img", "create", "-q", "-f", fmt, *opts, str(img), "64M"], check=True)
    if fmt != "luks":   # (clusters allocated here and there: tables with entries)
        for off in (0, 1 << 20, 5 << 20, 33 << 20, 63 << 20):
            subprocess.run(["qemu-io", "-f", fmt, "-c", f"write -P 0x5a {off} 64k", str(img)],
                           check=True, capture_output=True)
    # (a luks header is 16 MiB and a vhdx 64M is written whole: fewer of those)
    fuzz(f"image:{fmt}", img, {"luks": 60, "vhdx": 100}.get(fmt, 300))


def test_a_stores_damaged_files_and_manifest_are_named(tmp_path):
    """A sealed capture's table files and its manifest, damaged: opening
    the store names the file (a table file not the one written, or one its
    damaged manifest does not describe); what the manifest passes reads
    whole.  500 mutants of each of four files."""
    from test_seal import live_store
    store, _ = live_store(tmp_path, 4)
    assert subprocess.run([sys.executable, "-m", "nestrace", "seal", str(store)],
                          capture_output=True, cwd=ROOT).returncode == 0
    for i, table in enumerate(("block_events", "capture_meta", "device_map")):
        fuzz(f"store:{table}", next(store.glob(f"{table}/capture=*/data.parquet")), 500, seed=i)
    fuzz("store:manifest", next(store.glob("_manifests/c1.json")), 500, seed=9)


@pytest.mark.root
def test_damaged_blktrace_files_keep_every_intact_record(tmp_path):
    """A blktrace file the kernel wrote (the ftrace blk tracer, bin mode,
    on a loop device under O_DIRECT reads and writes), and the same
    records numbered per CPU as relay blktrace numbers them: 2,000
    mutants of each are read (each record the mutation left intact kept),
    or refused naming the file and the byte; every 10th imported."""
    import struct

    from test_blk_oracle import blk_tracer

    from nestrace.importers import blktrace
    img, out = tmp_path / "disk.img", tmp_path / "trace.blktrace.0"
    subprocess.run(["truncate", "-s", "64M", str(img)], check=True)
    loop = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(img)],
                          check=True, capture_output=True, text=True).stdout.strip()
    try:
        with blk_tracer([loop], out):
            subprocess.run(["dd", f"if={loop}", "of=/dev/null", "bs=4k", "count=400",
                            "iflag=direct"], check=True, capture_output=True)
            subprocess.run(["dd", "if=/dev/zero", f"of={loop}", "bs=64k", "count=40",
                            "oflag=direct"], check=True, capture_output=True)
    finally:
        subprocess.run(["losetup", "-d", loop], check=True)
    t = blktrace.read(out)
    assert t.num_rows > 1000, t.num_rows
    fuzz("blktrace", out, 2000, seed=1)
    # (relay blktrace's numbers: per CPU from 1)
    data = bytearray(out.read_bytes())
    n: dict[int, int] = {}
    for off, cpu in zip(t.column("file_offset").to_pylist(), t.column("cpu").to_pylist()):
        n[cpu] = n.get(cpu, 0) + 1
        struct.pack_into("=I", data, off + 4, n[cpu])
    numbered = tmp_path / "numbered.blktrace.0"
    numbered.write_bytes(bytes(data))
    fuzz("blktrace", numbered, 2000, seed=2)


@pytest.mark.root
def test_a_guest_captures_damaged_files_are_imported_or_named(lab_factory, tmp_path):
    """A guest capture the agent made alone: its frame stream (2,000
    mutants, read), and its guest.json, extents.jsonl, agent.stream and
    block events, damaged (500 each, imported into a store): imported, or
    refused naming the damaged file and the offset."""
    from nestrace._paths import agent_path
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    g = tmp_path / "g"
    r = subprocess.run([str(agent_path()), "--guest", lab.mount, "--guest-capture", str(g),
                        "--", "dd", "if=/dev/zero", f"of={lab.mount}/f", "bs=64k", "count=64",
                        "oflag=direct"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    fuzz("frames", g / "agent.stream", 2000)
    for i, name in enumerate(("guest.json", "extents.jsonl", "agent.stream",
                              "block_events.arrows")):
        fuzz(f"guest:{name}", g / name, 500, seed=i)
