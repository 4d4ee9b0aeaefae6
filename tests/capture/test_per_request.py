"""record --per-request: each block request recorded once, at its end,
with the phase times the kernel kept (bench/overhead's (b) with fewer
records per I/O).  Checked against the same workload recorded a record
per event: the same requests, every fio read traced through all four
levels, merges and their Q2M, and every loss counted."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import assert_losses_counted, run_cli
from tracethrough import FIO_RANDREAD, assert_traced_through, record_fio

import nestrace

pytestmark = pytest.mark.root

REQUESTS = ("SELECT level, op, sector, nr_sectors FROM block_requests "
            "WHERE op IN ('read', 'write')")


def test_per_request_capture_holds_the_requests_a_capture_of_every_event_does(
        lab_factory, tmp_path):
    """The same fio reads (O_DIRECT at both levels: the same sectors each
    run) recorded both ways: the same requests at both block levels, each
    with Q, G, D and C; each read traced through the four levels; fewer
    records per I/O."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    for d in ("ev", "rq"):
        (tmp_path / d).mkdir()
    ev, _, _ = record_fio(lab, tmp_path / "ev" / "s", tmp_path / "ev", *FIO_RANDREAD)
    rq, offsets, r = record_fio(lab, tmp_path / "rq" / "s", tmp_path / "rq", *FIO_RANDREAD,
                                extra=["--per-request"])
    assert_traced_through(rq, offsets)
    assert_losses_counted(rq, r.stdout)
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
    assert phases["n"] == phases["q"] == phases["g"] == phases["c"] == phases["ids"] \
        == phases["ordered"], phases
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
