"""The Chrome/Perfetto JSON timeline: exact events for a hand-built stack,
and a real capture laid out so that a JSON trace viewer can load it
(slices on a lane never overlap, every flow end sits inside a slice)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
from conftest import run_cli
from rows import DISK, VDISK, capture_meta, device_map, extents, hostfs, request, vfs
from test_cli import one_error_line

import nestrace
from nestrace.query.session import Session
from nestrace.report import export

MiB = 1 << 20


def stack() -> Session:
    """A 4 KiB O_DIRECT pread seen at all four levels, a second read in
    flight with it, and a third after both."""
    t = dict(vfs_events=[vfs(100, 900, off=8192, f_flags=0o40000),
                         vfs(150, 100, off=0, f_flags=0o40000),
                         vfs(1000, 50, off=4096, f_flags=0o40000)],
             block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
             + request(310, 320, 800, DISK, 104 * MiB + 8192, 4096, rq=2, bio=12),
             hostfs_events=[hostfs(300, 4 * MiB + 8192, 4096, source=3, flags=1)])
    return Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                                "extent_maps": extents()} | t)


def test_timeline_of_a_hand_built_stack():
    tl = export.timeline(stack())
    ev = tl["traceEvents"]
    slices = [(e["pid"], e["tid"], e["name"], e["ts"], e["dur"], e["args"]["offset_bytes"])
              for e in ev if e["ph"] == "X"]
    assert slices == [
        (1, 1, "pread64 4 KiB", 0.1, 0.9, 8192),
        (1, 2, "pread64 4 KiB", 0.15, 0.1, 0),      # in flight with the first: a lane of its own
        (1, 2, "pread64 4 KiB", 1.0, 0.05, 4096),   # lane 1 ends at 1.0 itself: not free yet
        (2, 1, "R 4 KiB", 0.2, 0.7, 4 * MiB + 8192),                    # Q to C
        (3, 1, "xfs_file_direct_read 4 KiB", 0.3, 0.0, 4 * MiB + 8192),
        (4, 1, "R 4 KiB", 0.31, 0.49, 104 * MiB + 8192),
    ]
    vd = next(e for e in ev if e["ph"] == "X" and e["pid"] == 2)
    assert vd["args"] | {"io_id": 0} == {"io_id": 0, "op": "read", "rwbs": "R", "bytes": 4096,
                               "offset_bytes": 4 * MiB + 8192, "sector": (4 * MiB + 8192) // 512,
                               "q2g_ns": 1, "d2c_ns": 690, "q2c_ns": 700}
    # a flow per link, from the middle of the upper slice to the lower one
    flows = [(e["ph"], e["pid"], e["tid"], e["ts"]) for e in ev if e["ph"] in "sf"]
    assert flows == [("s", 2, 1, 0.55), ("f", 4, 1, 0.555),     # vdisk -> disk
                     ("s", 2, 1, 0.55), ("f", 3, 1, 0.3),       # vdisk -> hostfs
                     ("s", 1, 1, 0.55), ("f", 2, 1, 0.55)]      # vfs -> vdisk
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    assert names[(1, None)] == "1 vfs" and names[(4, None)] == "4 disk"
    assert names[(1, 2)] == "slot 2"
    # I/Os in flight per level: calls from entry to exit, block requests
    # from dispatch to completion; the host FS has no counter
    counters = [(e["pid"], e["name"], e["ts"], e["args"]["in flight"]) for e in ev if e["ph"] == "C"]
    assert counters == [
        (1, "in flight", 0.1, 1), (1, "in flight", 0.15, 2), (1, "in flight", 0.25, 1),
        (1, "in flight", 1.0, 1),       # the first ends as the third arrives: one value, 1
        (1, "in flight", 1.05, 0),
        (2, "in flight", 0.21, 1), (2, "in flight", 0.9, 0),
        (4, "in flight", 0.32, 1), (4, "in flight", 0.8, 0)]
    assert tl["otherData"] | {} == {"capture_id": "c1", "machine": "m1", "slices": 6, "flows": 3,
                                    "counters": 9, "start_ns": 0}


def test_a_hint_is_a_vfs_slice_with_a_flow_to_the_reads_it_asked_for():
    """fadvise(WILLNEED) of file bytes [8 KiB, 16 KiB) at 100-1000 ns, and
    the 8 KiB virtual-disk read it queued at 200 (links' kind hint)."""
    tl = export.timeline(Session.from_tables({
        "capture_meta": capture_meta(), "device_map": device_map(), "extent_maps": extents(),
        "vfs_events": [vfs(100, 900, off=8192, req=8192, ret=0, syscall=35) | {"iov_count": 3}],
        "block_events": request(200, 210, 900, VDISK, 4 * MiB + 8192, 8192, rq=1, bio=11,
                                flags=32)}))
    ev = tl["traceEvents"]
    assert [(e["pid"], e["name"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X"] == [
        (1, "fadvise64 willneed 8 KiB", 0.1, 0.9), (2, "RA 8 KiB", 0.2, 0.7)]
    assert [(e["ph"], e["name"], e["pid"], e["ts"]) for e in ev if e["ph"] in "sf"] == [
        ("s", "hint", 1, 0.55), ("f", "hint", 2, 0.55)]


def test_window_keeps_the_ios_that_overlap_it_and_their_links():
    tl = export.timeline(stack(), window=(900e-9, 2000e-9))
    got = [(e["pid"], e["args"]["offset_bytes"]) for e in tl["traceEvents"] if e["ph"] == "X"]
    assert got == [(1, 8192), (1, 4096), (2, 4 * MiB + 8192)]
    assert tl["otherData"]["flows"] == 1     # vfs -> vdisk; disk and hostfs are outside
    # the counters' steps in the window, each with the count from the capture's start
    assert [(e["pid"], e["ts"], e["args"]["in flight"]) for e in tl["traceEvents"]
            if e["ph"] == "C"] == [(1, 1.0, 1), (1, 1.05, 0), (2, 0.9, 0)]


def test_export_errors_are_one_line(tmp_path):
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    line = one_error_line(run_cli("export", str(tmp_path / "s"), "-o", str(tmp_path / "t.json"),
                                  check=False))
    assert line == f"nestrace: error: {tmp_path / 's'}: the store holds no capture"
    line = one_error_line(run_cli("export", str(tmp_path / "s"), "-o", str(tmp_path / "t.json"),
                                  "--window", "2:1", check=False))
    assert line == "nestrace: error: --window '2:1': TO must be after FROM"


@pytest.mark.root
def test_real_capture_exports_a_loadable_timeline(lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=32M")
    store, out = tmp_path / "s", tmp_path / "t.json"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "fio", "--name=t",
            f"--directory={lab.mount}", "--rw=randrw", "--bs=4k", "--direct=1", "--size=32M",
            "--io_size=2M", "--ioengine=libaio", "--iodepth=8", "--output=/dev/null")
    r = run_cli("export", str(store), "-o", str(out))
    ev = json.loads(out.read_text())["traceEvents"]
    s = nestrace.open(store)
    per_level = Counter(e["cat"] for e in ev if e["ph"] == "X")
    for lv in ("vfs", "vdisk", "hostfs", "disk"):
        assert per_level[lv] == s.rows(f"SELECT count(*) AS n FROM {lv}_io")[0]["n"] + (
            s.rows("SELECT count(*) AS n FROM vfs_hints")[0]["n"] if lv == "vfs" else 0), lv
    # fio's 512 I/Os, and its fadvise calls (RANDOM, and DONTNEED at the end)
    names = Counter(e["name"].split()[0] for e in ev if e["ph"] == "X" and e["cat"] == "vfs")
    assert names["fadvise64"] >= 1 and sum(names.values()) - names["fadvise64"] == 512, names
    assert per_level["disk"] >= 512
    # a JSON trace viewer needs the slices of one thread to nest: on a lane they never overlap
    lanes = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for sl in lanes.values():
        sl.sort()
        assert all(b[0] > a[1] for a, b in zip(sl, sl[1:]))
    assert max(tid for _, tid in lanes) >= 2          # QD8: requests in flight together

    def inside(e):
        return any(t0 <= e["ts"] <= t1 for t0, t1 in lanes[(e["pid"], e["tid"])])
    ends = defaultdict(list)
    for e in ev:
        if e["ph"] in "sf":
            assert inside(e), e
            ends[e["id"]].append(e["ph"])
    assert all(sorted(v) == ["f", "s"] for v in ends.values())
    links = s.rows("SELECT count(*) AS n FROM (SELECT DISTINCT upper_level, upper_id, lower_level, "
                   "lower_id, kind FROM links WHERE upper_id IS NOT NULL)")[0]["n"]
    assert len(ends) == links >= 3 * 512
    assert f"{len(ends)} links" in r.stdout
    # the in-flight counters: QD8 in the guest, never below 0, back to 0 at
    # the end of vfs (every call returned)
    c = defaultdict(list)
    for e in ev:
        if e["ph"] == "C":
            c[e["pid"]].append(e["args"]["in flight"])
    assert set(c) == {1, 2, 4} and min(min(v) for v in c.values()) >= 0
    assert max(c[1]) == 8 and c[1][-1] == 0, c[1][-5:]
    assert f"{sum(map(len, c.values()))} in-flight counter values" in r.stdout


def test_a_window_outside_the_capture_is_refused_with_its_length():
    with pytest.raises(export.ExportError,
                       match="--window 5:6 is outside capture c1, which lasts 1.000 s"):
        export.timeline(stack(), window=(5, 6))
    assert export.timeline(stack(), window=(0, 0.5))["traceEvents"]
