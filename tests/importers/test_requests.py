"""The requests an import stores (nestrace.importers.requests, numpy) are
the requests the SQL module block.requests computes from the same events:
on a real blk tracer file with splits, row for row."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import loop_devices
from test_blk_oracle import blk_tracer
from test_blkstream import assert_same_stores

from nestrace.importers import blkimport, blktrace
from nestrace.query.session import Session

pytestmark = pytest.mark.root


def assert_stored_as_computed(store: Path) -> int:
    """The capture's stored requests are read, and equal what the SQL
    computes from its events; their number."""
    with Session(store) as s:
        assert "block_requests" in s.stored_views
        n = s.rows("SELECT count(*) AS n FROM _block_requests_core")[0]["n"]
        for a, b in (("_block_requests_core", "_block_requests_computed"),
                     ("_block_requests_computed", "_block_requests_core")):
            extra = s.rows(f"SELECT * FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}) "
                           "LIMIT 3")
            assert not extra, f"in {a}, not in {b}: {extra}"
    return n


def test_the_requests_an_import_stores_are_those_the_sql_pairs(tmp_path):
    """4 KiB to 64 KiB direct reads and writes, 8 in flight, on a loop
    device that takes 8 KiB a request: the kernel splits the bigger bios
    (X), requests wait for tags (G after a sleep), some merge."""
    img = tmp_path / "disk.img"
    subprocess.run(["truncate", "-s", "64M", str(img)], check=True)
    before = loop_devices()
    loop = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(img)],
                          check=True, capture_output=True, text=True).stdout.strip()
    trace = tmp_path / "loop.blktrace.0"
    try:
        Path(f"/sys/block/{Path(loop).name}/queue/max_sectors_kb").write_text("8\n")
        with blk_tracer([loop], trace):
            subprocess.run(["fio", "--name=t", f"--filename={loop}", "--rw=randrw",
                            "--bsrange=4k-64k", "--direct=1", "--ioengine=libaio",
                            "--iodepth=8", "--io_size=16M", "--output=/dev/null"], check=True)
    finally:
        subprocess.run(["losetup", "-d", loop], check=True)
    assert loop_devices() <= before, "a loop device was left attached"
    r = blkimport.import_files([trace], tmp_path / "s", {}, "imp", "m1")
    # (streamed; read whole when the reader was stopped mid-record, on a busy
    # machine: the last record cut short, named)
    assert r["block_events"] > 0
    assert r["read"] == "streamed" or r["read"].endswith(": not a whole record"), r["read"]
    with Session(tmp_path / "s") as s:
        splits = s.rows("SELECT count(*) AS n FROM block_events WHERE action = 8")[0]["n"]
    assert splits > 100, "no bio was split: the test would not check the split pieces' Q"
    assert assert_stored_as_computed(tmp_path / "s") > 1000
    # the same records split per CPU, as blktrace writes them: streamed
    # through the merge, they store what the whole read stores
    per_cpu = split_per_cpu(trace, tmp_path)
    assert len(per_cpu) == 2
    r = blkimport.import_files(per_cpu, tmp_path / "streamed", {}, "imp", "m1")
    assert r["read"] == "streamed"
    blkimport._import_whole(per_cpu, tmp_path / "whole", {}, "imp", "m1")
    assert_same_stores(tmp_path / "streamed", tmp_path / "whole")


def split_per_cpu(trace: Path, out: Path) -> list[Path]:
    """trace's whole records in a file per CPU (DEV.blktrace.N), file order
    kept (a last record cut short left out).  When the machine ran them
    all on one CPU, two files all the same, the records dealt in turn:
    each file in time order, as the merge needs."""
    t, _ = blktrace.read_tolerant(trace)
    data = trace.read_bytes()
    cpus = t.column("cpu").to_pylist()
    if len(set(cpus)) == 1:
        cpus = [k % 2 for k in range(len(cpus))]
    files: dict[int, bytearray] = {}
    for o, cpu in zip(t.column("file_offset").to_pylist(), cpus):
        size = blktrace.HEADER.size + int.from_bytes(data[o + 46:o + 48], "little")
        files.setdefault(cpu, bytearray()).extend(data[o:o + size])
    paths = []
    for cpu in sorted(files):
        paths.append(out / f"loop.blktrace.{cpu}")
        paths[-1].write_bytes(bytes(files[cpu]))
    return paths
