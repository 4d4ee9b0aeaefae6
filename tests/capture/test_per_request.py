"""record --per-request: each block request recorded once, at its end,
with the phase times the kernel kept (bench/overhead's (b) with fewer
records per I/O).  Checked against the same workload recorded a record
per event: the same requests, every fio read traced through all four
levels, merges and their Q2M, and every loss counted.  And record
--from-completions, checked against a record per event of the same I/O."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from conftest import assert_losses_counted, run_cli
from tracethrough import (
    FIO_RANDREAD,
    TRACE_THROUGH,
    assert_traced_through,
    fio_log_offsets,
    record_fio,
)

import nestrace
from nestrace.schema import code

pytestmark = pytest.mark.root

REQUESTS = ("SELECT level, op, sector, nr_sectors FROM block_requests "
            "WHERE op IN ('read', 'write')")


def test_per_request_capture_holds_the_requests_a_capture_of_every_event_does(
        lab_factory, tmp_path):
    """The same fio reads (O_DIRECT at both levels: the same sectors each
    run) recorded both ways: the same requests at both block levels, each
    with Q, G, D and C (but a completion the kernel ran no program for,
    counted); each read traced through the four levels; fewer records per
    I/O."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    for d in ("ev", "rq"):
        (tmp_path / d).mkdir()
    ev, _, _ = record_fio(lab, tmp_path / "ev" / "s", tmp_path / "ev", *FIO_RANDREAD)
    rq, offsets, r = record_fio(lab, tmp_path / "rq" / "s", tmp_path / "rq", *FIO_RANDREAD,
                                extra=["--per-request"])
    assert_traced_through(rq, offsets)
    missed = assert_losses_counted(rq, r.stdout)
    assert rq.rows("SELECT count(*) AS n FROM block_events") == [{"n": 0}]
    assert [json.loads(s.rows("SELECT settings_json FROM capture_meta")[0]["settings_json"])
            ["block_records"] for s in (ev, rq)] == ["events", "requests"]
    got, want = (Counter(tuple(x.values()) for x in s.rows(REQUESTS)) for s in (rq, ev))
    reads = {lvl: sum(n for (lv, op, *_), n in got.items() if (lv, op) == (lvl, "read"))
             for lvl in ("vdisk", "disk")}
    assert min(reads.values()) >= 4096, reads
    # (each capture's own writes aside: a journal commit may fall in one run)
    assert {k: n for k, n in got.items() if k[1] == "read"} == \
        {k: n for k, n in want.items() if k[1] == "read"}
    phases = rq.rows("SELECT count(*) AS n, count(q_ns) AS q, count(g_ns) AS g, "
                     "count(c_ns) AS c, count(DISTINCT io_id) AS ids, "
                     "count(*) FILTER (WHERE q_ns <= g_ns AND g_ns <= d_ns AND d_ns < c_ns) AS ordered, "
                     "count(*) FILTER (WHERE comm = '') AS no_comm "
                     "FROM block_requests WHERE op = 'read'")[0]
    # each with a C but those the kernel ran no program for (counted above:
    # conftest.assert_losses_counted)
    assert phases["n"] == phases["q"] == phases["g"] == phases["ids"], phases
    assert phases["n"] - missed <= phases["c"] == phases["ordered"] <= phases["n"], (phases, missed)
    assert phases["no_comm"] == 0, phases
    per_io = [s.rows("SELECT records_total AS n FROM capture_meta")[0]["n"] for s in (ev, rq)]
    assert per_io[1] < per_io[0] / 2, per_io


def test_per_request_records_bios_merged_into_a_request_with_their_q(lab_factory, tmp_path):
    """Sequential 4 KiB O_DIRECT writes submitted 32 at a time: the block
    layer merges neighbours in the plug, and each merged bio's record
    carries its Q, so every Q2M is known and btt's identity holds: each
    bio queued either became a request or was merged into one."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=32M")
    store = tmp_path / "s"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--per-request", "--",
            "fio", "--name=t", f"--directory={lab.mount}", "--output=/dev/null",
            "--rw=write", "--bs=4k", "--direct=1", "--size=32M", "--io_size=8M",
            "--ioengine=libaio", "--iodepth=32", "--iodepth_batch_submit=32")
    s = nestrace.open(store)
    assert_losses_counted(s)
    m = s.rows("SELECT level, count(*) AS n, count(q_ns) AS q, min(q2m_ns) AS least "
               "FROM phases_merges GROUP BY level")
    assert m and all(r["n"] == r["q"] > 0 and r["least"] >= 0 for r in m), m
    for r in s.rows("SELECT level, queued, merged, dispatched FROM size_merge_ratio"):
        assert r["queued"] == r["merged"] + r["dispatched"], r
    # the merged bios' bytes went out in the requests: 8 MiB of fio writes
    (w,) = s.rows("SELECT sum(bytes) AS b FROM vdisk_io WHERE op = 'write' AND comm = 'fio'")
    assert w["b"] == 8 << 20, w


def test_a_request_still_dispatched_at_the_end_keeps_its_row(lab_factory, tmp_path):
    """A guest O_DIRECT write held in the virtual disk's queue by a frozen
    host FS when the capture ends (the completion hooks come off last, so
    only such a request, or one whose completion the kernel ran no program
    for, is still dispatched then): the agent writes its row (action
    unfinished: its Q, G and D, no C, no done_by), counted in
    requests_unfinished, numbered with no sequence gap."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    host, f = Path(lab.mount).parent / "host", Path(lab.mount) / "f"
    f.write_bytes(b"x" * 4096)
    os.sync()
    st = os.stat(lab.mount).st_dev
    inflight = f"/sys/dev/block/{os.major(st)}:{os.minor(st)}/inflight"   # (reads, writes)
    # the capture ends once the write is dispatched on the virtual disk;
    # its end snapshot of the guest FS waits for the thaw
    cmd = (f"fsfreeze -f {host}; "
           f"dd if=/dev/zero of={f} bs=4k count=1 oflag=direct conv=notrunc 2>/dev/null & "
           f"(sleep 8; fsfreeze -u {host}) & "
           f"for i in $(seq 200); do grep -q ' [1-9]' {inflight} && break; sleep 0.05; done")
    try:
        r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--per-request",
                    "--", "sh", "-c", cmd)
    finally:
        subprocess.run(["fsfreeze", "-u", str(host)], capture_output=True)
    s = nestrace.open(tmp_path / "s")
    assert_losses_counted(s, r.stdout)
    (m,) = s.rows("SELECT end_ns, requests_unfinished AS unfinished, settings_json "
                  "FROM capture_meta")
    assert json.loads(m["settings_json"])["requests_in_flight"] == m["unfinished"] == 1, m
    rows = s.rows("SELECT r.ts_ns, r.cpu, l.level, r.req_op FROM block_request_records r "
                  "JOIN device_map l USING (capture_id, dev) "
                  "WHERE l.level IN ('vdisk', 'disk') AND r.action = ?",
                  [code("block_action", "unfinished")])
    assert rows == [{"ts_ns": m["end_ns"], "cpu": 0, "level": "vdisk", "req_op": 1}], rows
    (w,) = s.rows("SELECT op, bytes, q_ns < g_ns AND g_ns <= d_ns AS ordered, c_ns, done_by_ns "
                  "FROM vdisk_io WHERE comm = 'dd'")
    assert w == {"op": "write", "bytes": 4096, "ordered": True, "c_ns": None,
                 "done_by_ns": None}, w


def test_requests_read_at_completion_are_the_ones_the_tracepoints_see(lab_factory, tmp_path):
    """fio reads recorded two ways at once: a record per event around a
    record --from-completions around fio.  Every read request either saw
    has its row in the other, on the same request, with the kernel's own
    dispatch time and allocation time (when the request got its tag) near
    the tracepoints' (the submitter's plug may cache the clock); each read
    traced through the four levels; no I, submitter, or loss, and the
    kernel's count of dispatches ended."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    log = tmp_path / "fio.iolog"
    fio = ["fio", "--name=t", f"--directory={lab.mount}", "--output=/dev/null",
           f"--write_iolog={log}", *FIO_RANDREAD, "--ioengine=libaio", "--iodepth=8"]
    inner = run_cli("record", "-o", str(tmp_path / "ev"), "--stack", lab.mount, "--",
                    sys.executable, "-m", "nestrace", "record", "-o", str(tmp_path / "rq"),
                    "--stack", lab.mount, "--from-completions", "--", *fio)
    ev, rq = nestrace.open(tmp_path / "ev"), nestrace.open(tmp_path / "rq")
    missed = assert_losses_counted(rq, inner.stdout)
    assert_losses_counted(ev)
    settings = json.loads(rq.rows("SELECT settings_json FROM capture_meta")[0]["settings_json"])
    assert settings["block_records"] == "completions", settings
    assert settings["requests_dispatched"] >= 2 * 4096, settings
    # Each read traced through the four levels, as the record per event
    # traces it.  (This kernel now and then runs no program at all for a
    # burst of completions, conftest.assert_losses_counted: both captures
    # then count the same requests lost.)
    reads = sorted(fio_log_offsets(log, "read"))
    assert sorted(r["offset_bytes"] for r in rq.rows(
        "SELECT offset_bytes FROM vfs_io WHERE syscall = 'aio_pread'")) == reads
    got = [s.con.execute(TRACE_THROUGH, {"syscall": "aio_pread", "err": 0}).fetchone()
           for s in (rq, ev)]
    # (a request whose completion was missed: a row per event, none here)
    assert got[0][0] == got[1][0] == 4096 and \
        all(4096 - missed <= a <= b for a, b in zip(got[0][1:], got[1][1:])), (got, missed)
    assert rq.rows("SELECT count(*) AS n FROM block_events") == [{"n": 0}]
    q = ("SELECT level, rq_id::VARCHAR AS rq, sector, nr_sectors, g_ns::BIGINT AS g, "
         "i_ns, ts_ns::BIGINT AS d, c_ns::BIGINT AS c, pid, comm FROM block_requests "
         "WHERE op = 'read'")
    (w,) = rq.rows("SELECT start_ns, end_ns FROM capture_meta")
    con = duckdb.connect()
    for name, s in (("ev", ev), ("rq", rq)):
        # (the outer capture's, while the inner one ran)
        con.register(name, pa.Table.from_pylist(
            s.rows(q + " AND c_ns BETWEEN $s AND $e", {"s": w["start_ns"], "e": w["end_ns"]})))
    # Both programs run for the same completion, one after the other (94 ns
    # apart by hand), but this machine's vCPU can be taken away between the
    # two: one CI run had a pair more than 100 us apart.  So each row of rq
    # is paired with the row of ev of the same request and sectors whose C
    # is nearest, within 10 ms, and no row of ev may be paired twice.
    both = con.execute(
        "WITH ev AS (SELECT row_number() OVER () AS e, * FROM ev), "
        "p AS (SELECT rq.*, ev.e, ev.d AS ev_d, ev.g AS ev_g, abs(rq.c - ev.c) AS dc "
        "  FROM rq JOIN ev ON rq.level = ev.level AND rq.rq = ev.rq AND rq.sector = ev.sector "
        "  AND rq.nr_sectors = ev.nr_sectors AND abs(rq.c - ev.c) < 10000000 "
        "  QUALIFY row_number() OVER (PARTITION BY rq.level, rq.rq, rq.c ORDER BY dc) = 1) "
        "SELECT count(DISTINCT e), median(abs(d - ev_d)), median(abs(g - ev_g)), count(i_ns), "
        "count(*) FILTER (WHERE pid = 0 AND comm = ''), count(*), max(dc) FROM p").fetchone()
    n_ev, n_rq = (con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("ev", "rq"))
    # fio's 4096 reads of 4 KiB at two levels: their sectors, whether two
    # reads the block layer merged make one request (one CI run: 8176
    # requests) or not, less those of requests whose completion the kernel
    # ran no program for (without a C they are in neither table here)
    sectors = con.execute("SELECT sum(nr_sectors) FROM rq").fetchone()[0]
    assert n_ev == n_rq == both[0] == both[5] and sectors >= 2 * 4096 * 8 - 8 * missed, \
        (n_ev, n_rq, both, sectors, missed)
    assert both[1] < 5000 and both[2] < 5000, both
    assert both[3] == 0 and both[4] == both[0], both


def test_merges_read_at_completion_are_the_ones_the_tracepoints_see(lab_factory, tmp_path):
    """Sequential 4 KiB O_DIRECT writes submitted 32 at a time, merged in
    the plug, recorded two ways at once (a record per event around record
    --from-completions): the bios each request carries at its end are the
    bios queued and merged into it, so the two give the same merge counts
    at both levels."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=32M")
    run_cli("record", "-o", str(tmp_path / "ev"), "--stack", lab.mount, "--",
            sys.executable, "-m", "nestrace", "record", "-o", str(tmp_path / "rq"),
            "--stack", lab.mount, "--from-completions", "--",
            "fio", "--name=t", f"--directory={lab.mount}", "--output=/dev/null",
            "--rw=write", "--bs=4k", "--direct=1", "--size=32M", "--io_size=8M",
            "--ioengine=libaio", "--iodepth=32", "--iodepth_batch_submit=32")
    ev, rq = nestrace.open(tmp_path / "ev"), nestrace.open(tmp_path / "rq")
    missed = assert_losses_counted(rq)
    got = rq.rows("SELECT level, merged, dispatched FROM size_merge_ratio ORDER BY level")
    # the outer capture's, while the inner one ran (its rows are written at C)
    (w,) = rq.rows("SELECT start_ns, end_ns FROM capture_meta")
    want = ev.rows("SELECT level, (SELECT count(*) FROM phases_merges m WHERE m.level = r.level "
                   "AND m.m_ns BETWEEN $s AND $e) AS merged, count(*) AS dispatched "
                   "FROM block_requests r WHERE c_ns BETWEEN $s AND $e GROUP BY level ORDER BY level",
                   {"s": w["start_ns"], "e": w["end_ns"]})
    assert [(r["level"], r["dispatched"]) for r in got] == \
        [(r["level"], r["dispatched"]) for r in want], (got, want)
    # (a request whose completion no program ran for takes its bios along:
    # the record per event counts its merges, up to 63 a request)
    assert all(w["merged"] - 63 * missed <= g["merged"] <= w["merged"]
               for g, w in zip(got, want)) and sum(r["merged"] for r in got) > 0, (got, want, missed)
