"""A write that fails leaves no capture a reader counts, and nothing the
next write trips on."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_private import _trace

ROOT = Path(__file__).resolve().parents[2]


def _nt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nestrace", *args], capture_output=True,
                          text=True, cwd=ROOT)


@pytest.mark.root
def test_a_full_disk_leaves_no_half_capture_and_the_next_import_works(tmp_path):
    """An import into a store on a 24 KiB tmpfs runs out of room: one line
    naming the file, no capture, no leftover table; the same import again
    once there is room publishes the capture whole."""
    trace = _trace(tmp_path / "vda.blktrace.0")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(mnt)], check=True)
    try:
        r = _nt("import", str(trace), "-o", str(mnt / "s"))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and \
            "No space left on device" in r.stderr, r.stderr
        assert not list((mnt / "s").glob("*/capture=*")), list((mnt / "s").rglob("*"))
        assert _nt("verify", str(mnt / "s")).returncode == 0
        subprocess.run(["mount", "-o", "remount,size=8m", str(mnt)], check=True)
        r = _nt("import", str(trace), "-o", str(mnt / "s"))
        assert r.returncode == 0, r.stderr
        assert _nt("verify", str(mnt / "s")).returncode == 0
        assert "1 block events" not in _nt("summary", str(mnt / "s")).stderr
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_leftovers_of_an_unfinished_write_are_not_read_and_the_next_write_removes_them(tmp_path):
    """A capture's tables without a manifest (a writer killed before it)
    are no capture: not listed, not read, named by verify; importing it
    again removes them and says so."""
    trace = _trace(tmp_path / "vda.blktrace.0")
    store = tmp_path / "s"
    assert _nt("import", str(trace), "-o", str(store)).returncode == 0
    tables = len(list(store.glob("*/capture=blktrace-vda")))     # (every table, empty or not)
    assert tables >= 10
    (store / "_manifests" / "blktrace-vda.json").unlink()
    r = _nt("summary", str(store))
    assert r.returncode == 2 and "holds no capture" in r.stderr, r.stderr
    r = _nt("verify", str(store))
    assert r.returncode == 2 and "which no manifest publishes (a write that did not finish)" \
        in r.stdout, r.stdout
    r = _nt("import", str(trace), "-o", str(store))
    assert r.returncode == 0 and f"removed {tables} table(s) of capture blktrace-vda left by a " \
        "write that did not finish" in r.stderr, r.stderr
    assert _nt("verify", str(store)).returncode == 0
