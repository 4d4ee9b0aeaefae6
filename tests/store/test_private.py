"""Stores are their owner's alone by default, whatever the umask; --group
shares one with a group."""
from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.root
def test_record_redact_stores_hashes_one_per_name_and_the_report_says_so(lab_factory, tmp_path):
    """Two fio runs into one store with --redact: no file path, mount point,
    process name or command line in it, each the same hash in both captures
    (so joins and counts still work); device names are kept; the report says
    the store is redacted; the salt is the store owner's alone."""
    import json

    from conftest import run_cli

    import nestrace
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    store = tmp_path / "s"
    job = ["fio", "--name=secretjob", f"--filename={lab.mount}/secret.dat", "--rw=write",
           "--bs=64k", "--size=1M", "--direct=1", "--output=/dev/null"]
    for _ in range(2):
        run_cli("record", "-o", str(store), "--stack", lab.mount, "--redact", "--", *job)
    text = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    for secret in (b"secret.dat", b"secretjob", lab.mount.encode(), b"fio"):
        assert secret not in text, secret
    s = nestrace.open(store)
    comms = s.rows("SELECT capture_id, comm, count(*) AS n FROM vfs_events GROUP BY ALL "
                   "ORDER BY n DESC")
    assert all(r["comm"].startswith("h:") and len(r["comm"]) == 18 for r in comms), comms
    top = {r["capture_id"]: r["comm"] for r in comms[::-1]}      # (each capture's busiest)
    assert len(set(top.values())) == 1 and len(top) == 2, comms
    paths = s.rows("SELECT DISTINCT capture_id, path FROM extent_maps WHERE role = 'guest_file'")
    assert len({r["path"] for r in paths}) == 1 and len(paths) == 2, paths
    assert paths[0]["path"].startswith("h:")
    meta = s.rows("SELECT command, stack_json FROM capture_meta")
    assert {m["command"] for m in meta} == {meta[0]["command"]} and \
        meta[0]["command"].startswith("h:")
    stack = json.loads(meta[0]["stack_json"])
    assert stack["guest_mount"].startswith("h:") and stack["vdisk"]["name"].startswith("loop")
    disks = s.rows("SELECT DISTINCT name FROM device_map WHERE level IN ('vdisk', 'disk')")
    assert disks and all(r["name"].startswith("loop") for r in disks), disks      # (kept)
    r = run_cli("report", str(store))
    assert "redacted (record --redact)" in r.stdout, r.stdout[:600]
    assert stat.S_IMODE((store / "_redact_salt").stat().st_mode) == 0o600
