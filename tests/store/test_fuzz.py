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


def test_a_live_captures_damaged_ipc_streams_are_read_or_named(tmp_path):
    """(pyarrow 26 crashed on a first message of an unknown type read as a
    schema: 1 of the first 2,000 mutants of a real stream)"""
    store = init_store(tmp_path / "s")
    live = LiveCapture(store, "c1")
    for i in range(8):
        live.write(RECORDS["block_event"]["table"], block_batch(1 + i * 100))
    live.close()
    fuzz("ipc", store / LIVE / "c1" / f"{RECORDS['block_event']['table']}.arrows", 1500)


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
