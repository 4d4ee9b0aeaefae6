"""Each claim of studies/nested-fs.toml, its query run by the report on
captures where it must hold and on captures where it must not.

The captures are the rows the report keeps of each (study_cells, the
levels' sizes, merge_potential), made by hand: ext4 on xfs, on btrfs and
on the raw baseline, a read, a write and a sequential-read workload, two
rounds."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from nestrace.query.session import Session
from nestrace.study import report, spec

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = [{"id": c.id, "words": c.words, "query": c.query, "op": c.op, "threshold": c.threshold}
          for c in spec.load(ROOT / "studies" / "nested-fs.toml").claims]
WORKLOADS = {"randread-8k": "read", "randwrite-8k": "write", "seqread-8k": "read"}
HOSTS = ["xfs", "btrfs", "none"]


def captures(mib_s, p50_us, disk_read_kib, merge_ratio, rounds=(1, 2)):
    """The report's tables for every (round, workload, host): mib_s[w][h]
    and p50_us[h] per round (a callable of the round may change them),
    the host disk's median read (KiB) per host for the sequential reads
    (the virtual disk's: 8 KiB), and the writes' write-back merge ratio
    at the virtual disk."""
    cells, level_io, levels, merge = [], [], [], []
    for r in rounds:
        for w, kind in WORKLOADS.items():
            for h in HOSTS:
                cid = f"{r}-{w}-{h}"
                cells.append({"round": r, "workload": w, "kind": kind, "stack": f"ext4 on {h}",
                              "base": "ext4 on none", "guest_fs": "ext4", "host_fs": h,
                              "capture_id": cid, "mib_s": mib_s(r)[w][h],
                              "p50_us": p50_us(r)[h]})
                chain = ["vfs", "vdisk", "disk"] if h == "none" else ["vfs", "vdisk", "hostfs",
                                                                    "disk"]
                for pos, lvl in enumerate(chain, 1):
                    levels.append({"capture_id": cid, "position": pos, "level": lvl})
                    size = disk_read_kib[h] * 1024 if lvl == "disk" else 8192
                    level_io.append({"capture_id": cid, "level": lvl, "ios": 100, "reads": 100,
                                     "writes": 0, "meta": 0, "read_bytes": 100 * size,
                                     "write_bytes": 0, "median_bytes": float(size),
                                     "median_read_bytes": float(size)})
                merge.append({"capture_id": cid, "level": "vdisk", "class": "writeback",
                              "ratio": merge_ratio if h != "none" else 1.0})
    return pa.Table.from_pylist(cells), {
        "_study_level_io": pa.Table.from_pylist(level_io),
        "_study_chain_levels": pa.Table.from_pylist(levels),
        # (no network hop: none of its requests)
        "_study_netfs": pa.table({"capture_id": pa.array([], pa.string()),
                                  "level": pa.array([], pa.string()),
                                  **{k: pa.array([], pa.int64())
                                     for k in ("getattrs", "stable_writes", "commits")}}),
        "merge_potential": pa.Table.from_pylist(merge)}


def verdicts(cells, got, rounds=(1, 2)):
    s = Session.from_tables({})
    try:
        report.register(s, cells, got)
        return {c["id"]: report.claim(s, c, list(rounds)) for c in CLAIMS}
    finally:
        s.close()


# As the seed found it: reads near the baseline, writes far below, the
# host's choice matters, latency up 20%, the host disk reading 128 KiB
# where the raw partition reads 8, write-back sent as 3 requests where
# one would do.
SEED = dict(
    mib_s=lambda r: {"randread-8k": {"xfs": 95, "btrfs": 90, "none": 100},
                     "randwrite-8k": {"xfs": 50, "btrfs": 30, "none": 100},
                     "seqread-8k": {"xfs": 90, "btrfs": 70, "none": 100}},
    p50_us=lambda r: {"xfs": 120, "btrfs": 125, "none": 100},
    disk_read_kib={"xfs": 128, "btrfs": 128, "none": 8}, merge_ratio=3.0)
# The opposite: reads halved, writes untouched, every host the same,
# latency, readahead and merging as on the raw partition.
OPPOSITE = dict(
    mib_s=lambda r: {"randread-8k": {"xfs": 50, "btrfs": 50, "none": 100},
                     "randwrite-8k": {"xfs": 100, "btrfs": 100, "none": 100},
                     "seqread-8k": {"xfs": 50, "btrfs": 50, "none": 100}},
    p50_us=lambda r: {"xfs": 100, "btrfs": 100, "none": 100},
    disk_read_kib={"xfs": 8, "btrfs": 8, "none": 8}, merge_ratio=1.0)


def test_every_claim_holds_where_the_seed_saw_it():
    got = verdicts(*captures(**SEED))
    assert {k: v["verdict"] for k, v in got.items()} == {c["id"]: "holds" for c in CLAIMS}
    assert got["hypervisor-readahead"]["value"] == pytest.approx(16.0)
    assert got["merge-potential"]["value"] == pytest.approx(3.0)
    assert got["latency-up"]["value"] == pytest.approx(1.225)   # (1.2 and 1.25)


def test_no_claim_holds_where_nesting_does_the_opposite():
    got = verdicts(*captures(**OPPOSITE))
    assert {k: v["verdict"] for k, v in got.items()} == \
        {c["id"]: "does not hold" for c in CLAIMS}
    assert got["reads-barely-affected"]["value"] == pytest.approx(0.5)
    assert got["host-matters"]["value"] == pytest.approx(1.0)


def test_rounds_that_disagree_are_not_told_apart():
    """Round 1 as the seed saw it, round 2 the opposite: a claim whose
    rounds disagree is neither held nor refuted."""
    def mib_s(r):
        return (SEED if r == 1 else OPPOSITE)["mib_s"](r)
    got = verdicts(*captures(mib_s, SEED["p50_us"], SEED["disk_read_kib"], 3.0))
    assert got["writes-hurt"]["verdict"] == "not told apart"
    assert got["writes-hurt"]["rounds"] == {"1": pytest.approx(0.4), "2": pytest.approx(1.0)}
    assert got["latency-up"]["verdict"] == "holds"


def test_a_claim_whose_study_has_one_host_has_no_data():
    """--quick's one host file system cannot show that the host matters."""
    cells, got = captures(**SEED)
    keep = pa.compute.not_equal(cells["host_fs"], "btrfs")
    assert verdicts(cells.filter(keep), got)["host-matters"]["verdict"] == "no data"
