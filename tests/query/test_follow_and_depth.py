"""Diff tests of follow_io, the rate timeline and queue depths: hand-built
stacks, exact rows."""
from __future__ import annotations

import pytest
from rows import (
    CAP,
    DISK,
    HOSTFS,
    VDISK,
    blk,
    extents,
    hostfs,
    pagecache,
    request,
    vfs,
)
from views_helpers import MiB, direct_read_stack, session

# ---- chain_levels, chain_io: the stack as one chain ------------------------

def test_chain_levels_and_chain_io_give_every_level_in_one_shape():
    """The four levels in chain order, each naming the one below; each
    level's I/O once in chain_io with the same columns, from the
    per-level views (a call's offset in its file, a request's on its
    disk, an fsync's none)."""
    t = direct_read_stack()
    t["vfs_events"] = t["vfs_events"] + [vfs(2000, 50, off=-1, req=0, syscall=11, ret=0)]
    s = session(**t)
    assert s.rows("SELECT position, level, below FROM chain_levels") == [
        dict(position=1, level="vfs", below="vdisk"), dict(position=2, level="vdisk", below="hostfs"),
        dict(position=4, level="hostfs", below="disk"), dict(position=5, level="disk", below=None)]
    got = s.rows("SELECT position, level, op, offset_bytes, bytes, start_ns, end_ns, latency_ns "
                 "FROM chain_io ORDER BY position, start_ns")
    assert got == [
        dict(position=1, level="vfs", op="read", offset_bytes=8192, bytes=4096, start_ns=100,
             end_ns=1000, latency_ns=900),
        dict(position=1, level="vfs", op="sync", offset_bytes=None, bytes=0, start_ns=2000,
             end_ns=2050, latency_ns=50),
        dict(position=2, level="vdisk", op="read", offset_bytes=4 * MiB + 8192, bytes=4096,
             start_ns=200, end_ns=900, latency_ns=700),
        dict(position=4, level="hostfs", op="read", offset_bytes=4 * MiB + 8192, bytes=4096,
             start_ns=300, end_ns=None, latency_ns=None),
        dict(position=5, level="disk", op="read", offset_bytes=104 * MiB + 8192, bytes=4096,
             start_ns=310, end_ns=800, latency_ns=490)]
    # the same rows as the level's own view, by io_id
    for lv in ("vfs", "vdisk", "hostfs", "disk"):
        assert s.rows("SELECT io_id FROM chain_io WHERE level = ? ORDER BY io_id", [lv]) == \
            s.rows(f"SELECT io_id FROM {lv}_io ORDER BY io_id"), lv


# ---- follow_io: one I/O up and down through links -----------------------

FOLLOW_COLS = "depth, level, via_level, kind, link_bytes, lag_ns, start_ns, latency_ns, op, offset_bytes, bytes"


def test_follow_io_goes_from_a_read_call_to_every_level_below_and_back_up():
    s = session(**direct_read_stack())
    cid = s.capture()
    ids = {lv: s.rows(f"SELECT io_id FROM {lv}_io")[0]["io_id"] for lv in ("vfs", "vdisk", "hostfs", "disk")}
    down = s.rows(f"SELECT io_id, via_id, {FOLLOW_COLS} FROM follow_io(?, 'vfs', ?)", [cid, ids["vfs"]])
    row = dict(op="read", bytes=4096)
    assert down == [
        dict(io_id=ids["vfs"], via_id=None, depth=0, level="vfs", via_level=None, kind=None,
             link_bytes=None, lag_ns=None, start_ns=100, latency_ns=900, offset_bytes=8192, **row),
        dict(io_id=ids["vdisk"], via_id=ids["vfs"], depth=1, level="vdisk", via_level="vfs", kind="sync",
             link_bytes=4096, lag_ns=100, start_ns=200, latency_ns=700, offset_bytes=4 * MiB + 8192, **row),
        dict(io_id=ids["hostfs"], via_id=ids["vdisk"], depth=2, level="hostfs", via_level="vdisk",
             kind="sync", link_bytes=4096, lag_ns=100, start_ns=300, latency_ns=None,
             offset_bytes=4 * MiB + 8192, **row),
        dict(io_id=ids["disk"], via_id=ids["vdisk"], depth=2, level="disk", via_level="vdisk",
             kind="sync", link_bytes=4096, lag_ns=110, start_ns=310, latency_ns=490,
             offset_bytes=104 * MiB + 8192, **row)]
    # from the host disk up: its virtual-disk request, then the call
    up = s.rows("SELECT depth, level, io_id, via_id FROM follow_io(?, 'disk', ?)", [cid, ids["disk"]])
    assert [r["in_flight"] for r in s.rows("SELECT in_flight FROM follow_io(?, 'vfs', ?)",
                                           [cid, ids["vfs"]])] == [1, 1, None, 1]
    assert up == [dict(depth=-2, level="vfs", io_id=ids["vfs"], via_id=ids["vdisk"]),
                  dict(depth=-1, level="vdisk", io_id=ids["vdisk"], via_id=ids["disk"]),
                  dict(depth=0, level="disk", io_id=ids["disk"], via_id=None)]
    # the session method and the CLI's helper give the same rows
    assert s.follow_io("disk", ids["disk"]).to_pylist() == \
        s.rows("SELECT * FROM follow_io(?, 'disk', ?)", [cid, ids["disk"]])
    from nestrace.report.follow import follow
    assert follow(s, "vfs")[1:] == ("the slowest vfs read or write", s.follow_io("vfs", ids["vfs"]))
    with pytest.raises(ValueError, match="no vdisk I/O with io_id 12345"):
        follow(s, "vdisk", 12345)
    with pytest.raises(ValueError, match="hostfs accesses have no end time"):
        follow(s, "hostfs")


def test_follow_io_of_a_write_back_shows_the_writes_it_carried_not_their_siblings():
    """Buffered writes at file offsets 0 and 4096 (at 100, 200 ns) go down
    in one 8 KiB virtual-disk write at 5000 and its host-disk write; a
    third write (offset 64 KiB) goes down in another request.  From the
    first write: its write-back and the host write below that, not the
    other write the write-back also carried."""
    t = dict(vfs_events=[vfs(100, 10, off=0, syscall=4), vfs(200, 10, off=4096, syscall=4),
                         vfs(300, 10, off=65536, syscall=4)],
             block_events=request(5000, 5010, 6000, VDISK, 4 * MiB, 8192, rq=1, bio=11, op=1)
             + request(5100, 5110, 5900, DISK, 104 * MiB, 8192, rq=2, bio=12, op=1)
             + request(7000, 7010, 8000, VDISK, 4 * MiB + 65536, 4096, rq=3, bio=13, op=1))
    s = session(**t)
    cid = s.capture()
    first, second, third = (r["io_id"] for r in s.rows("SELECT io_id FROM vfs_io ORDER BY ts_ns"))
    wb = s.rows("SELECT io_id FROM vdisk_io WHERE ts_ns = 5010")[0]["io_id"]
    got = s.rows(f"SELECT io_id, via_id, {FOLLOW_COLS} FROM follow_io(?, 'vfs', ?)", [cid, first])
    assert [(r["depth"], r["level"], r["kind"], r["link_bytes"], r["lag_ns"], r["bytes"]) for r in got] == [
        (0, "vfs", None, None, None, 4096),
        (1, "vdisk", "writeback", 4096, 4890, 8192),
        (2, "disk", "sync", 8192, 100, 8192)]
    assert got[1]["io_id"] == wb and got[1]["via_id"] == first
    # from the write-back: both writes above it, the host write below
    got = s.rows("SELECT depth, level, io_id, kind, link_bytes FROM follow_io(?, 'vdisk', ?)", [cid, wb])
    assert [(r["depth"], r["level"], r["io_id"], r["kind"], r["link_bytes"]) for r in got] == [
        (-1, "vfs", first, "writeback", 4096), (-1, "vfs", second, "writeback", 4096),
        (0, "vdisk", wb, None, None), (1, "disk", got[3]["io_id"], "sync", 8192)]
    assert third not in {r["io_id"] for r in got}


def test_rate_timeline_counts_each_level_in_its_time_bucket():
    """Two reads (at 100 and 1100 ns) and a write (at 1500), seen at the
    virtual disk at dispatch (210, 1210, 1610), in buckets of 1000 ns from
    the capture's start (0): the rates are per second of a bucket; a flush
    is not a read or a write."""
    t = dict(vfs_events=[vfs(100, 900, off=8192, f_flags=0o40000),
                         vfs(1100, 50, off=0, f_flags=0o40000, req=8192, ret=8192),
                         vfs(1500, 50, off=0, syscall=4, f_flags=0o40000)],
             block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
             + request(1200, 1210, 1300, VDISK, 4 * MiB, 8192, rq=2, bio=12)
             + request(1600, 1610, 1700, VDISK, 4 * MiB, 4096, rq=3, bio=13, op=1)
             + request(1800, 1810, 1900, VDISK, 0, 0, rq=4, bio=14, op=2))
    s = session(**t)
    got = s.rows("SELECT level, op, bucket, t_s, ios, bytes, iops, mib_per_s FROM rate_timeline(1000)")
    per_s = 1e9 / 1000
    assert got == [
        {"level": lv, "op": op, "bucket": b, "t_s": b * 1e-6, "ios": n, "bytes": nb,
         "iops": n * per_s, "mib_per_s": nb / MiB * per_s}
        for lv in ("vdisk", "vfs")
        for op, b, n, nb in (("read", 0, 1, 4096), ("read", 1, 1, 8192), ("write", 1, 1, 4096))]


def depth_stack():
    """Four file calls on the guest FS (µs): A 100-500, B 200-300, C 300-400
    (arriving as B ends), D 1000-1100; three virtual-disk requests: r1
    dispatched at 210 and done at 900, r2 dispatched at 300 and never seen
    to complete, r3 950-960.  The guest FS and the virtual disk share a
    dev_t: their queues must not mix."""
    us = 1000
    return dict(
        vfs_events=[vfs(100 * us, 400 * us), vfs(200 * us, 100 * us, off=4096),
                    vfs(300 * us, 100 * us, off=8192), vfs(1000 * us, 100 * us, off=12288)],
        block_events=request(200 * us, 210 * us, 900 * us, VDISK, 4 * MiB, 4096, rq=1, bio=11)
        + [blk("Q", 290 * us, dev=VDISK, sector=8200, bio=12),
           blk("G", 291 * us, dev=VDISK, sector=8200, bio=12),
           blk("D", 300 * us, dev=VDISK, sector=8200, rq=2, bio=12)]
        + request(940 * us, 950 * us, 960 * us, VDISK, 4 * MiB + 8192, 4096, rq=3, bio=13))


def test_depth_arrivals_count_what_is_in_flight_per_level_and_device():
    """An I/O ending at the instant another arrives is no longer in flight;
    a request whose completion was not seen is in no I/O's depth (its own
    is NULL): a burst of lost completions once kept a disk 26 deep for a
    whole capture it served one request at a time."""
    s = session(**depth_stack())
    got = s.rows("SELECT level, ts_ns // 1000 AS t_us, depth, interarrival_ns // 1000 AS gap_us, "
                 "latency_ns // 1000 AS lat_us, end_ns // 1000 AS end_us "
                 "FROM depth_arrivals ORDER BY level, ts_ns")
    assert got == [
        {"level": "vdisk", "t_us": 210, "depth": 1, "gap_us": None, "lat_us": 690, "end_us": 900},
        {"level": "vdisk", "t_us": 300, "depth": None, "gap_us": 90, "lat_us": None,
         "end_us": None},
        {"level": "vdisk", "t_us": 950, "depth": 1, "gap_us": 650, "lat_us": 10, "end_us": 960},
        {"level": "vfs", "t_us": 100, "depth": 1, "gap_us": None, "lat_us": 400, "end_us": 500},
        {"level": "vfs", "t_us": 200, "depth": 2, "gap_us": 100, "lat_us": 100, "end_us": 300},
        {"level": "vfs", "t_us": 300, "depth": 2, "gap_us": 100, "lat_us": 100, "end_us": 400},
        {"level": "vfs", "t_us": 1000, "depth": 1, "gap_us": 700, "lat_us": 100, "end_us": 1100}]
    # follow_io counts the same for the one I/O it follows (a call arriving
    # as another ends, the request never seen to complete, the one after it;
    # each follow_io is planned anew: ~2 s on a store this small)
    for r in s.rows("SELECT level, io_id, depth FROM depth_arrivals "
                    "WHERE ts_ns IN (300000, 950000)"):
        (me,) = s.rows("SELECT in_flight FROM follow_io(?, ?, ?) WHERE depth = 0",
                       [CAP, r["level"], r["io_id"]])
        assert me["in_flight"] == r["depth"], r


def test_depth_summary_is_iostats_aqu_sz_and_util_over_the_busy_span():
    """vfs: in flight 1x100 + 2x100 + 2x100 + 1x100 + 1x100 µs over
    100-1100: 0.7 on average, busy 500 of 1000 µs.  vdisk: 1x690 + 1x10
    over 210-960 (its last event): r2, whose completion was not seen, is
    an arrival but in no depth."""
    s = session(**depth_stack())
    got = {r.pop("level"): r for r in s.rows(
        "SELECT level, ios, ios_unended, mean_depth, median_depth, p99_depth, max_depth, "
        "avg_in_flight, busy_fraction, span_ns, interarrival_median_ns, latency_median_ns, "
        "latency_p99_ns FROM depth_summary")}
    # latencies: vfs 400, 100, 100, 100 µs; vdisk 690 and 10 (r2 has none)
    assert got == {
        "vfs": {"ios": 4, "ios_unended": 0, "mean_depth": 1.5, "median_depth": 1, "p99_depth": 2, "max_depth": 2,
                "avg_in_flight": 0.7, "busy_fraction": 0.5, "span_ns": 1_000_000,
                "interarrival_median_ns": 100_000.0, "latency_median_ns": 100_000.0,
                "latency_p99_ns": pytest.approx(100_000 + 0.97 * 300_000)},
        "vdisk": {"ios": 3, "ios_unended": 1, "mean_depth": 1.0, "median_depth": 1,
                  "p99_depth": 1, "max_depth": 1, "avg_in_flight": 700_000 / 750_000,
                  "busy_fraction": 700_000 / 750_000,
                  "span_ns": 750_000, "interarrival_median_ns": 370_000.0,
                  "latency_median_ns": 350_000.0,
                  "latency_p99_ns": pytest.approx(10_000 + 0.99 * 680_000)}}


def test_depth_histogram_uses_vscsistats_bins():
    s = session(**depth_stack())
    got = s.rows("SELECT level, metric, bin, bin_max, n FROM depth_histogram "
                 "ORDER BY level, metric, bin_max")
    assert got == [
        {"level": "vdisk", "metric": "interarrival", "bin": "100", "bin_max": 100, "n": 1},
        {"level": "vdisk", "metric": "interarrival", "bin": "1000", "bin_max": 1000, "n": 1},
        {"level": "vdisk", "metric": "latency", "bin": "10", "bin_max": 10, "n": 1},
        {"level": "vdisk", "metric": "latency", "bin": "1000", "bin_max": 1000, "n": 1},
        {"level": "vdisk", "metric": "outstanding", "bin": "1", "bin_max": 1, "n": 2},
        {"level": "vfs", "metric": "interarrival", "bin": "100", "bin_max": 100, "n": 2},
        {"level": "vfs", "metric": "interarrival", "bin": "1000", "bin_max": 1000, "n": 1},
        {"level": "vfs", "metric": "latency", "bin": "100", "bin_max": 100, "n": 3},
        {"level": "vfs", "metric": "latency", "bin": "500", "bin_max": 500, "n": 1},
        {"level": "vfs", "metric": "outstanding", "bin": "1", "bin_max": 1, "n": 2},
        {"level": "vfs", "metric": "outstanding", "bin": "2", "bin_max": 2, "n": 2}]
    bins = s.rows("SELECT list(_depth_bin(n) ORDER BY n) AS b FROM range(1, 66) t(n) "
                  "WHERE n IN (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 29, 32, 33, 64, 65)")[0]["b"]
    assert bins == [1, 2, 4, 4, 6, 8, 8, 12, 12, 16, 32, 32, 64, 64, None]
    times = s.rows("SELECT list(_depth_time_bin(ns) ORDER BY ns) AS b FROM (VALUES (1000), (1001), "
                   "(100000000), (100000001)) t(ns)")[0]["b"]
    assert times == [1, 10, 100000, None]


def test_a_compressed_image_extent_is_read_whole_from_its_compressed_data():
    """A btrfs host compressing the image: image bytes [4 MiB, 4 MiB + 128
    KiB) are 8 KiB of compressed data at 200 MiB on the disk
    (extent_maps.disk_length_bytes), and any byte of them is read by
    reading all 8 KiB.  A 4 KiB read of the guest file inside it maps to
    those 8 KiB (map_vdisk.disk_bytes) and the disk read of them is tied
    to it whole; a host-disk read there no virtual-disk request explains,
    without REQ_RAHEAD (btrfs's compressed-read bio drops it), is
    readahead when the host FS's readahead of the image covered those
    bytes just before, else other."""
    ext = extents(image=((0, 100 * MiB, 4 * MiB), (4 * MiB + 128 * 1024, 104 * MiB + 128 * 1024,
                                                    60 * MiB - 128 * 1024)))
    ext.append(ext[-1] | {"logical_bytes": 4 * MiB, "physical_bytes": 200 * MiB,
                          "length_bytes": 128 * 1024, "flags": 8, "disk_length_bytes": 8192})
    s = session(extent_maps=ext,
                vfs_events=[vfs(100, 900, off=8192, f_flags=0o40000)],
                block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
                + request(310, 320, 800, DISK, 200 * MiB, 8192, rq=2, bio=12)
                + request(5000, 5010, 5100, DISK, 200 * MiB, 8192, rq=3, bio=13)
                + request(10**8, 10**8 + 10, 10**8 + 100, DISK, 200 * MiB, 8192, rq=4, bio=14),
                hostfs_events=[hostfs(300, 4 * MiB + 8192, 4096, source=3, flags=1)],
                pagecache_events=[pagecache(4900, (4 * MiB) // 4096, 32, 5, ino=131, dev=HOSTFS)])
    assert s.rows("SELECT image_offset_bytes, bytes, disk_offset_bytes, disk_bytes FROM map_vdisk") \
        == [{"image_offset_bytes": 4 * MiB + 8192, "bytes": 4096, "disk_offset_bytes": 200 * MiB,
             "disk_bytes": 8192}]
    assert s.rows("SELECT disk_offset_bytes, bytes, image_offset_bytes, image_bytes FROM map_disk "
                  "ORDER BY start_ns") == [
        {"disk_offset_bytes": 200 * MiB, "bytes": 8192, "image_offset_bytes": 4 * MiB,
         "image_bytes": 128 * 1024}] * 3
    assert s.rows("SELECT d.start_ns, l.kind, l.bytes, l.upper_id IS NOT NULL AS tied FROM links l "
                  "JOIN disk_io d ON d.io_id = l.lower_id WHERE l.lower_level = 'disk' "
                  "ORDER BY d.start_ns") == [
        {"start_ns": 310, "kind": "sync", "bytes": 8192, "tied": True},
        {"start_ns": 5000, "kind": "readahead", "bytes": 8192, "tied": False},
        {"start_ns": 10**8, "kind": "other", "bytes": 8192, "tied": False}]
