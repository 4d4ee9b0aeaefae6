"""record --memory: the workload in a memory cgroup, its page cache held
to a size (a file against memory as on a smaller machine)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import drop_caches, run_cli

from nestrace.query.session import Session

pytestmark = pytest.mark.root

FILE_MIB = 48
# (reads the file twice through the page cache)
TWICE = "cat {f} > /dev/null; cat {f} > /dev/null"


def _memory_cgroups() -> set[str]:
    from nestrace.capture.memlimit import _where
    _, root = _where()
    return {p.name for p in root.iterdir() if p.name.startswith("nestrace-")}


def _record_twice(lab, store: Path, *memory: str) -> dict:
    """Read the file twice, cold, recorded (with `memory`: --memory and its
    size); the capture's settings and the bytes each level read."""
    drop_caches(lab)
    f = f"{lab.mount}/f"
    run_cli("record", "--stack", lab.mount, "-o", str(store), *memory, "--",
            "sh", "-c", TWICE.format(f=f))
    with Session(store) as s:
        cid = s.rows("SELECT capture_id FROM capture_meta ORDER BY start_ns DESC LIMIT 1")[0][
            "capture_id"]
        settings = json.loads(s.rows("SELECT settings_json FROM capture_meta WHERE "
                                     "capture_id = ?", [cid])[0]["settings_json"])
        read = {r["level"]: r["b"] for r in s.rows(
            "SELECT level, sum(bytes) AS b FROM chain_io WHERE capture_id = ? AND op = 'read' "
            "GROUP BY level", [cid])}
    return {"settings": settings, "read": read}


def test_a_workload_held_to_less_memory_than_its_file_reads_it_from_disk_again(
        lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--filename=f", "--rw=write", "--bs=1M", f"--size={FILE_MIB}M", "--direct=1")
    before = _memory_cgroups()
    store = tmp_path / "s"
    held = _record_twice(lab, store, "--memory", "12M")
    free = _record_twice(lab, store)
    mib = 1 << 20
    # both reads of the file at the application, whatever the memory
    assert held["read"]["vfs"] == free["read"]["vfs"] == 2 * FILE_MIB * mib
    # held to 12 MiB, the second read finds little of the 48 MiB file
    # cached and reads it from the virtual disk again; with memory to
    # spare it finds all of it
    assert held["read"]["vdisk"] >= 1.8 * FILE_MIB * mib, held
    assert free["read"]["vdisk"] <= 1.2 * FILE_MIB * mib, free
    m = held["settings"]["memory"]
    assert m["limit"] == 12 * mib and m["hits"] > 0, m
    assert m["peak"] is None or m["peak"] <= 12 * mib, m
    assert "memory" not in free["settings"]
    assert _memory_cgroups() == before, "a memory cgroup was left behind"


@pytest.mark.parametrize("args, says", [
    (["--memory", "1M", "--", "true"], "--memory 1048576: less than 4 MiB"),
    (["--memory", "lots", "--", "true"], "--memory: bad size 'lots'"),
    (["--memory", "64M"], "--memory holds CMD's memory: give CMD"),
])
def test_a_bad_memory_size_is_named(lab_factory, tmp_path, args, says):
    lab = lab_factory("ext4", "xfs")
    r = run_cli("record", "--stack", lab.mount, "-o", str(tmp_path / "s"), *args, check=False)
    assert r.returncode != 0 and says in r.stderr, r.stderr
    # (refused before the store is made)
    assert not (tmp_path / "s" / "capture_meta").exists() or \
        not list((tmp_path / "s" / "capture_meta").iterdir())


def test_a_workload_the_limit_kills_is_told_of(lab_factory, tmp_path):
    """Out of memory in its cgroup, the kernel kills the workload: the
    capture is kept, and record says why it died."""
    lab = lab_factory("ext4", "xfs")
    r = run_cli("record", "--stack", lab.mount, "-o", str(tmp_path / "s"), "--memory", "8M",
                "--", "python3", "-c", "b = bytearray(64 << 20)", check=False)
    assert r.returncode == 137, r.stderr
    assert "--memory 8M: the kernel killed 1 process(es) of the workload" in r.stderr, r.stderr
    with Session(tmp_path / "s") as s:
        got = s.rows("SELECT settings_json FROM capture_meta")
    assert len(got) == 1 and json.loads(got[0]["settings_json"])["memory"]["oom_kills"] == 1
