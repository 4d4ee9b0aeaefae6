"""The streamed blktrace import (nestrace.importers.blkstream, and the
compiled pairing it keeps between chunks) stores what the whole read
stores, table for table and row for row; files it cannot stream exactly
are read whole, and the result says why."""
from __future__ import annotations

import random
import struct
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from nestrace.importers import blkimport, blkstream, blktrace, requests

DEV = (7 << 20) | 1
Q, M, G, D, C, I, X, R = 1, 2, 4, 7, 8, 12, 13, 6       # __BLK_TA_*
TC_READ, TC_WRITE, TC_NOTIFY = 0x1, 0x2, 0x400


def rec(action, sector, nbytes, t, cpu, pid=100, seq=0, pdu=b"", cats=TC_WRITE, dev=DEV):
    return blktrace.HEADER.pack(blktrace.MAGIC | blktrace.VERSION, seq, t, sector, nbytes,
                                (cats << 16) | action, pid, dev, cpu, 0, len(pdu)) + pdu


def notify(t, cpu, pid, comm: str):
    return rec(0, 0, 0, t, cpu, pid, cats=TC_NOTIFY, pdu=comm.encode().ljust(16, b"\0"))


def workload(n: int, seed: int = 1, collide: bool = True) -> list[tuple[int, int, bytes]]:
    """(time, cpu, record) of n requests' lives, as the block layer logs
    them across 2 CPUs: Q G I D C, some split (X: two pieces, each its own
    request), some merged into the one before (M), some requeued (R, then
    I and D again), completions often on the other CPU, times that tie
    across CPUs, and the task names (notify records) before their events.
    collide: sectors drawn at random, some reused while a request there is
    open (the pairing's hard cases), else each request its own."""
    rnd = random.Random(seed)
    out: list[tuple[int, int, bytes]] = []
    for pid, comm in ((100, "fio"), (200, "kworker/1:1")):
        out.append((0, pid // 100 - 1, notify(0, pid // 100 - 1, pid, comm)))
    t = 10
    for i in range(n):
        cpu, pid = rnd.randrange(2), rnd.choice((100, 200))
        done = cpu if rnd.random() < 0.5 else 1 - cpu
        s = 8 * rnd.randrange(4096) if collide else 64 * i
        cats = rnd.choice((TC_READ, TC_WRITE))

        def ev(action, sector, nbytes, dt, c=cpu, pdu=b""):
            out.append((t + dt, c, rec(action, sector, nbytes, t + dt, c, pid, pdu=pdu,
                                       cats=cats)))

        kind = rnd.random()
        ev(Q, s, 16384 if kind < 0.2 else 4096, 0)
        if kind < 0.2:                                  # split: two pieces
            ev(X, s, 16384, 1, pdu=struct.pack(">Q", s + 16))
            for piece, dt in ((s, 2), (s + 16, 3)):
                ev(G, piece, 8192, dt)
                ev(I, piece, 8192, dt + 2)
                ev(D, piece, 8192, dt + 4)
                ev(C, piece, 8192, dt + 30 + rnd.randrange(20), c=done)
        else:
            ev(G, s, 4096, 1)
            if kind < 0.3:                              # the next bio merged into it
                ev(Q, s + 8, 4096, 2)
                ev(M, s + 8, 4096, 2)                   # (a tie)
            ev(I, s, 4096, 3)
            ev(D, s, 4096, 4)
            if kind > 0.95:                             # requeued, issued again
                ev(R, s, 4096, 6)
                ev(I, s, 4096, 7)
                ev(D, s, 4096, 8)
            ev(C, s, 4096, 25 + rnd.randrange(30), c=done)
        t += rnd.choice((0, 3, 7, 12))                  # (overlapping lives, ties)
    return out


def write_per_cpu(events, tmp: Path, numbered: bool = False, gap_at: int | None = None
                  ) -> list[Path]:
    """The records split per CPU, in time order, as blktrace writes them
    (numbered from 1 per CPU, one number skipped at gap_at, if numbered)."""
    files = []
    for cpu in (0, 1):
        mine = sorted((e for e in events if e[1] == cpu), key=lambda e: e[0])
        data = bytearray()
        k = 0
        for j, (_, _, r) in enumerate(mine):
            b = bytearray(r)
            if numbered:
                k += 2 if j == gap_at else 1
                struct.pack_into("=I", b, 4, k)
            data += b
        f = tmp / f"loop1.blktrace.{cpu}"
        f.write_bytes(bytes(data))
        files.append(f)
    return files


def tables(store: Path) -> dict[str, object]:
    out = {}
    for d in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith("_")):
        for f in d.glob("capture=*/data.parquet"):
            t = pq.read_table(f)
            if d.name == "block_requests":      # (written as they finish: another order)
                t = t.sort_by([("dev", "ascending"), ("rq_id", "ascending"),
                               ("ts_ns", "ascending")])
            out[d.name] = t
    return out


def assert_same_stores(a: Path, b: Path) -> None:
    ta, tb = tables(a), tables(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].schema.equals(tb[name].schema), name
        for col in ta[name].column_names:
            assert ta[name].column(col).equals(tb[name].column(col)), (name, col)


@pytest.fixture
def small_parts(monkeypatch):
    """Windows of a few records (cut mid-record), chunks, row groups and
    request parts small: every seam the streamed import has is crossed."""
    monkeypatch.setattr(blkstream, "WINDOW", 1000)
    monkeypatch.setattr(blkimport, "ROW_GROUP", 97)
    monkeypatch.setattr(requests.RequestStream, "PART", 41)


@pytest.mark.parametrize("numbered, collide", [(False, True), (True, True), (False, False)])
def test_a_streamed_import_stores_what_the_whole_read_stores(tmp_path, small_parts, numbered,
                                                             collide):
    files = write_per_cpu(workload(600, collide=collide), tmp_path, numbered,
                          gap_at=50 if numbered else None)
    r = blkimport.import_files(files, tmp_path / "s", {}, "imp", "m1")
    assert r["read"] == "streamed"
    w = blkimport._import_whole(files, tmp_path / "w", {}, "imp", "m1")
    assert {k: v for k, v in r.items() if k != "read"} == w
    # (a number skipped in each CPU's file)
    assert r["lost"] == (2 if numbered else 0) and r["block_events"] > 3000
    assert_same_stores(tmp_path / "s", tmp_path / "w")
    got = tables(tmp_path / "s")
    assert got["block_requests"].num_rows > 600
    assert set(got["block_events"].column("comm").to_pylist()) == {"fio", "kworker/1:1"}
    if not collide:
        # (every request has its Q, a split piece the one of the bio it was cut
        # from, but a requeued one's second issue: no Q since its first D)
        rq, ev = got["block_requests"], got["block_events"]
        requeued = ev.filter(pc.equal(ev.column("action"), 10)).num_rows
        assert requeued and rq.filter(rq.column("q_ns").is_null()).num_rows == requeued


@pytest.mark.parametrize("numbered", [False, True])
@pytest.mark.parametrize("cut", ["header", "payload"])
def test_a_last_record_cut_short_is_streamed_named_and_counted_as_the_whole_read_does(
        tmp_path, small_parts, numbered, cut):
    # (a trace_pipe reader stopped mid-record: the file ends inside a record)
    files = write_per_cpu(workload(300), tmp_path, numbered)
    last = rec(C, 8, 4096, 10 ** 9, 1, seq=10 ** 4) if cut == "header" else \
        notify(10 ** 9, 1, 300, "late")
    keep = 30 if cut == "header" else blktrace.HEADER.size + 5
    at = files[1].stat().st_size
    files[1].write_bytes(files[1].read_bytes() + last[:keep])
    r = blkimport.import_files(files, tmp_path / "s", {}, "imp", "m1")
    assert r["read"] == "streamed"
    w = blkimport._import_whole(files, tmp_path / "w", {}, "imp", "m1")
    assert {k: v for k, v in r.items() if k != "read"} == w
    assert r["problems"] == [f"{files[1]}: byte {at}: " + (
        "record cut short (30 of 48 header bytes)" if cut == "header" else
        "payload cut short (5 of 16 bytes)")]
    assert (r["damage"].places, r["damage"].bytes, r["damage"].records) == (1, keep, 1)
    # (without sequence numbers, the cut record is the count of what was lost)
    assert r["lost"] == (0 if numbered else 1)
    assert_same_stores(tmp_path / "s", tmp_path / "w")


def _offset(f: Path, k: int) -> int:
    return blktrace.read(f).column("file_offset")[k].as_py()


def _earlier(files):
    at = _offset(files[0], 40)
    data = bytearray(files[0].read_bytes())
    struct.pack_into("=Q", data, at + 8, 1)             # a time going back
    files[0].write_bytes(bytes(data))
    return f"{files[0]}: byte {at}: a record earlier than the one before it"


def _damaged(files):
    at = _offset(files[1], 30)
    data = bytearray(files[1].read_bytes())
    data[at:at + 4] = b"\0\0\0\0"
    files[1].write_bytes(bytes(data))
    return f"{files[1]}: byte {at}: not a whole record"


def _named_late(files):
    files[0].write_bytes(files[0].read_bytes() + notify(10 ** 9, 0, 100, "renamed"))
    return "task 100 named by a notify record after its events"


def _one_cpu_in_two(files):
    files[1].write_bytes(files[1].read_bytes() + rec(C, 8, 4096, 10 ** 9, 0, seq=10 ** 5))
    return f"{files[1]}: records of CPU 0 of device 7:1, which {files[0]} has too"


def _garbage_at_end(files):
    at = files[0].stat().st_size
    files[0].write_bytes(files[0].read_bytes() + b"\xff" * 200)    # (no record cut short)
    return f"{files[0]}: byte {at}: not a whole record"


@pytest.mark.parametrize("spoil", [_earlier, _damaged, _named_late, _one_cpu_in_two,
                                   _garbage_at_end])
def test_files_it_cannot_stream_are_read_whole_and_it_says_why(tmp_path, small_parts, spoil):
    files = write_per_cpu(workload(200), tmp_path, numbered=spoil is _one_cpu_in_two)
    why = spoil(files)
    r = blkimport.import_files(files, tmp_path / "s", {}, "imp", "m1")
    assert r["read"].startswith("whole: ") and why in r["read"], r["read"]
    assert "\n" not in r["read"]
    w = blkimport._import_whole(files, tmp_path / "w", {}, "imp", "m1")
    assert {k: v for k, v in r.items() if k != "read"} == w
    assert_same_stores(tmp_path / "s", tmp_path / "w")


def test_a_refused_streamed_import_leaves_no_store_and_no_capture(tmp_path, small_parts):
    from nestrace.store.files import StoreError
    files = write_per_cpu(workload(50), tmp_path)
    with pytest.raises(StoreError, match=r"^7:5: no request events of this device"):
        blkimport.import_files(files, tmp_path / "s", {(7 << 20) | 5: "vdisk"}, "imp")
    assert not (tmp_path / "s").exists()
    blkimport.import_files(files, tmp_path / "s", {}, "one")
    with pytest.raises(StoreError, match=r"^7:5: no request events of this device"):
        blkimport.import_files(files, tmp_path / "s", {(7 << 20) | 5: "vdisk"}, "two")
    assert sorted(p.name for p in (tmp_path / "s" / "block_events").iterdir()) == \
        ["capture=one"]
