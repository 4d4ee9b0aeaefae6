"""Stores are their owner's alone by default, whatever the umask; --group
shares one with a group."""
from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
from pathlib import Path

from nestrace.importers import blktrace

ROOT = Path(__file__).resolve().parents[2]


def _trace(path: Path) -> Path:
    """A blktrace file of one write request, Q D C."""
    path.write_bytes(b"".join(
        blktrace.HEADER.pack(blktrace.MAGIC | 7, 0, t, 2048, 4096, (0x2 << 16) | action, 123,
                             (7 << 20) | 1, 1, 0, 0)
        for action, t in ((1, 100), (7, 150), (8, 300))))
    return path


def _import(tmp_path: Path, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nestrace", "import",
                           str(_trace(tmp_path / "vda.blktrace.0")), "-o", str(tmp_path / "s"),
                           *more], capture_output=True, text=True, cwd=ROOT, umask=0o022)


def _modes(store: Path) -> dict[str, int]:
    out = {".": store.stat().st_mode}
    for d, dirs, files in os.walk(store):
        for n in dirs + files:
            p = Path(d) / n
            out[str(p.relative_to(store))] = p.lstat().st_mode
    return out


def test_a_store_made_with_umask_022_is_its_owners_alone(tmp_path):
    r = _import(tmp_path)
    assert r.returncode == 0, r.stderr
    modes = _modes(tmp_path / "s")
    assert len(modes) > 4, modes
    bad = {p: oct(m) for p, m in modes.items()
           if stat.S_IMODE(m) != (0o700 if stat.S_ISDIR(m) else 0o600)}
    assert not bad, bad


def test_group_shares_the_store_with_a_group_and_an_unknown_one_is_named(tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    r = _import(tmp_path, "--group", group)
    assert r.returncode == 0, r.stderr
    modes = _modes(tmp_path / "s")
    bad = {p: oct(m) for p, m in modes.items()
           if stat.S_IMODE(m) & 0o7077 != (0o2050 if stat.S_ISDIR(m) else 0o040)}
    assert not bad, bad
    assert {(tmp_path / "s" / p).lstat().st_gid for p in modes} == {os.getgid()}
    (tmp_path / "x").mkdir()
    r = _import(tmp_path / "x", "--group", "no-such-group-here")
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "nestrace: error: --group no-such-group-here: no such group"], r.stderr
    assert not (tmp_path / "x" / "s").exists()
