"""Diff tests of the metrics views (seek, size, phases, amplification,
readahead, sync) and the report's keys: hand-built stacks, exact rows."""
from __future__ import annotations

import re

import pytest
from conftest import ROOT
from rows import (
    CAP,
    DISK,
    GUEST,
    VDISK,
    blk,
    capture_meta,
    device_map,
    extents,
    pagecache,
    request,
    vfs,
)
from views_helpers import MiB, direct_read_stack, session

from nestrace.query.session import Session


def test_seek_distances_over_the_dispatch_stream():
    ev = (request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1) + request(4, 5, 6, DISK, 4096, 4096, rq=2, bio=2)
          + request(7, 8, 9, DISK, 100 * 512, 4096, rq=3, bio=3))
    s = session(block_events=ev)
    got = s.rows("SELECT distance, abs_distance, normalized, sequential FROM seek_distances "
                 "WHERE level = 'disk' ORDER BY ts_ns")
    size = float(1 << 21)
    assert got == [{"distance": 0, "abs_distance": 0, "normalized": 0.0, "sequential": True},
                   {"distance": 84, "abs_distance": 84, "normalized": 84 / size, "sequential": False}]
    cdf = s.rows("SELECT x, y FROM seek_cdf('disk') ORDER BY x")
    assert cdf == [{"x": 0.0, "y": 0.5}, {"x": 84 / size, "y": 1.0}]


def test_size_histogram_uses_vscsistats_bins():
    ev = [vfs(1, 1, ret=512, req=512), vfs(2, 1, ret=4096), vfs(3, 1, ret=4097, req=4097),
          vfs(4, 1, ret=1 << 20, req=1 << 20)]
    s = session(vfs_events=ev)
    got = s.rows("SELECT bin, n FROM size_histogram ORDER BY bin_max_bytes NULLS LAST")
    assert got == [{"bin": "512", "n": 1}, {"bin": "4K", "n": 1}, {"bin": "8K", "n": 1},
                   {"bin": ">512K", "n": 1}]


def test_merged_bio_gets_q2m_and_merge_ratio_counts_it():
    ev = request(10, 20, 30, DISK, 0, 4096, rq=1, bio=1) + [
        blk("Q", 12, dev=DISK, sector=8, nr=8, bio=2), blk("M", 15, dev=DISK, sector=8, nr=8, bio=2)]
    s = session(block_events=ev)
    assert s.rows("SELECT q2m_ns, bytes, front FROM phases_merges") == [
        {"q2m_ns": 3, "bytes": 4096, "front": False}]
    assert s.rows("SELECT queued, merged, dispatched, merge_ratio FROM size_merge_ratio") == [
        {"queued": 2, "merged": 1, "dispatched": 1, "merge_ratio": 2.0}]
    q2c = s.rows("SELECT n, min_ns FROM phases_stats WHERE phase = 'q2c'")
    assert q2c == [{"n": 1, "min_ns": 20}]


def test_the_report_gives_a_levels_phases_over_all_its_devices():
    """A btrfs host on two disks: the disk level's phases are over both
    (the report keyed phases_stats' rows by level and phase, and the
    second device's overwrote the first's: one disk's numbers, either),
    and the JSON lists phases in btt's order at every run."""
    from nestrace.report.document import build
    dm = device_map()
    dm.append(dict(dm[-1], dev=DISK + 2, name="loop2"))
    ev = (request(10, 20, 30, DISK, 0, 4096, rq=1, bio=1)
          + request(40, 50, 70, DISK, 8192, 4096, rq=2, bio=2)
          + request(15, 25, 115, DISK + 2, 0, 4096, rq=3, bio=3))
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                             "extent_maps": extents(), "block_events": ev})
    assert s.rows("SELECT level, devices, phase, n, min_ns, median_ns, max_ns FROM phases_level_stats "
                  "WHERE phase IN ('q2g', 'q2c') ORDER BY phase") == [
        {"level": "disk", "devices": 2, "phase": "q2c", "n": 3, "min_ns": 20, "median_ns": 30.0,
         "max_ns": 100},
        {"level": "disk", "devices": 2, "phase": "q2g", "n": 3, "min_ns": 1, "median_ns": 1.0,
         "max_ns": 1}]
    assert s.rows("SELECT dev, n FROM phases_stats WHERE phase = 'q2c' ORDER BY dev") == [
        {"dev": DISK, "n": 2}, {"dev": DISK + 2, "n": 1}]
    disk = next(lv for lv in build(s, CAP)["levels"] if lv["level"] == "disk")
    assert list(disk["phases"]) == ["q2g", "d2c", "q2c"]
    assert disk["phases"]["q2c"] | {"avg_ns": None, "p99_ns": None} == {
        "n": 3, "min_ns": 20, "avg_ns": None, "median_ns": 30.0, "p99_ns": None, "max_ns": 100}


def test_pieces_split_off_a_bio_have_the_q_of_the_bio_they_were_cut_from():
    """A 12 KiB bio queued at 10 is cut twice from its front (X: the piece,
    with the remainder's sector); the pieces and the remainder are three
    requests.  An older bio at the second piece's sector (Q at 1) and a
    later one elsewhere (Q at 11) are not the pieces' Q."""
    ev = (request(1, 3, 5, DISK, 4096, 4096, rq=7, bio=9)
          + [blk("Q", 10, sector=0, nr=24, bio=1), blk("Q", 11, sector=800, nr=8, bio=5),
             blk("X", 12, sector=0, nr=8, bio=2, aux=8), blk("G", 13, sector=0, nr=8, bio=2),
             blk("D", 14, sector=0, nr=8, rq=1, bio=2),
             blk("X", 15, sector=8, nr=8, bio=3, aux=16), blk("G", 16, sector=8, nr=8, bio=3),
             blk("D", 17, sector=8, nr=8, rq=2, bio=3),
             blk("G", 18, sector=16, nr=8, bio=1), blk("D", 19, sector=16, nr=8, rq=3, bio=1),
             blk("C", 40, sector=0, nr=8, rq=1), blk("C", 41, sector=8, nr=8, rq=2),
             blk("C", 42, sector=16, nr=8, rq=3)])
    s = session(block_events=ev)
    assert s.rows("SELECT sector, q_ns, g_ns, q2g_ns, q2c_ns FROM block_requests ORDER BY d_ns") == [
        {"sector": 8, "q_ns": 1, "g_ns": 2, "q2g_ns": 1, "q2c_ns": 4},
        {"sector": 0, "q_ns": 10, "g_ns": 13, "q2g_ns": 3, "q2c_ns": 30},
        {"sector": 8, "q_ns": 10, "g_ns": 16, "q2g_ns": 6, "q2c_ns": 31},
        {"sector": 16, "q_ns": 10, "g_ns": 18, "q2g_ns": 8, "q2c_ns": 32}]


def test_amplification_ratios_per_level():
    t = direct_read_stack()
    t["block_events"] = (request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
                         + request(310, 320, 800, DISK, 104 * MiB, 32768, rq=2, bio=12))
    s = session(**t)
    got = s.rows("SELECT level, bytes, ratio_to_above, ratio_to_app FROM amplification "
                 "WHERE op = 'read' ORDER BY depth")
    assert got == [{"level": "vfs", "bytes": 4096, "ratio_to_above": None, "ratio_to_app": 1.0},
                   {"level": "vdisk", "bytes": 4096, "ratio_to_above": 1.0, "ratio_to_app": 1.0},
                   {"level": "hostfs", "bytes": 4096, "ratio_to_above": 1.0, "ratio_to_app": 1.0},
                   {"level": "disk", "bytes": 32768, "ratio_to_above": 8.0, "ratio_to_app": 8.0}]


def test_readahead_page_never_read_is_unused():
    # the read of page 0 starts a readahead of pages 0-3; page 3 is evicted unread
    t = dict(vfs_events=[vfs(100, 200, off=0), vfs(400, 10, off=4096)],
             pagecache_events=[pagecache(140, 0, 4, 5), pagecache(150, 0, 4, 1), pagecache(1000, 3, 1, 2)])
    s = session(**t)
    pages = s.rows("SELECT page, cause, readahead, used FROM readahead_pages ORDER BY page")
    assert pages == [{"page": 0, "cause": "read", "readahead": False, "used": True},
                     {"page": 1, "cause": "readahead", "readahead": True, "used": True},
                     {"page": 2, "cause": "readahead", "readahead": True, "used": False},
                     {"page": 3, "cause": "readahead", "readahead": True, "used": False}]
    assert s.rows("SELECT readahead_bytes, used_bytes, unused_bytes, read_filled_bytes FROM readahead_summary") \
        == [{"readahead_bytes": 12288, "used_bytes": 4096, "unused_bytes": 8192, "read_filled_bytes": 4096}]


def test_an_overlay_files_reads_use_the_pages_of_the_file_it_was_copied_up_to():
    """A container's file copied up: the overlay keeps the lower file's
    inode number (12), its calls carry it, and its extents are the upper
    file's (inode 20 under it, at 8 MiB on the virtual disk); the page
    cache is inode 20's.  Its reads use the pages readahead brought in."""
    ovl = (0 << 20) | 40
    dm = device_map()
    dm.append(dm[0] | {"dev": ovl, "name": "/c", "fs_type": "overlay", "backing_dev": GUEST})
    ext = extents() + [r | {"ino": 20, "physical_bytes": 8 * MiB}
                       for r in extents() if r["role"] == "guest_file"]
    ext += [r | {"dev": ovl, "physical_bytes": 8 * MiB} for r in extents() if r["role"] == "guest_file"]
    t = dict(vfs_events=[vfs(100, 200, off=0, dev=ovl), vfs(400, 10, off=4096, dev=ovl)],
             pagecache_events=[pagecache(140, 0, 4, 5, ino=20), pagecache(150, 0, 4, 1, ino=20)])
    s = session(**t, device_map=dm, extent_maps=ext)
    assert s.rows("SELECT dev, ino, real_ino FROM _overlay_copies ORDER BY real_ino") == [
        {"dev": ovl, "ino": 12, "real_ino": 12}, {"dev": ovl, "ino": 12, "real_ino": 20}]
    assert s.rows("SELECT ino, page, cause, used FROM readahead_pages ORDER BY page") == [
        {"ino": 20, "page": 0, "cause": "read", "used": True},
        {"ino": 20, "page": 1, "cause": "readahead", "used": True},
        {"ino": 20, "page": 2, "cause": "readahead", "used": False},
        {"ino": 20, "page": 3, "cause": "readahead", "used": False}]


def test_page_cache_fills_by_writes_and_metadata_are_not_readahead():
    ms = 1_000_000
    other_task = pagecache(30, 23, 1, 1) | {"pid": 2}
    t = dict(vfs_events=[vfs(100, 100, off=8192, syscall=4)],     # a pwrite of page 2
             pagecache_events=[
                 pagecache(150, 2, 1, 1),                  # added by the write
                 pagecache(160, 9, 1, 1),                  # nothing asked for it
                 pagecache(170, 0, 1, 1, ino=1),           # the file system's own page
                 pagecache(10, 20, 4, 5),                  # a readahead of pages 20-23 ...
                 pagecache(20, 22, 1, 1),                  # ... adds page 22 at once
                 other_task,                               # another task's page 23 is not it
                 pagecache(10 + 60 * ms, 21, 1, 1)])       # 60 ms on: not that readahead
    s = session(**t)
    got = s.rows("SELECT ino, page, cause FROM readahead_pages ORDER BY ino, page")
    assert got == [{"ino": 1, "page": 0, "cause": "other"}, {"ino": 12, "page": 2, "cause": "write"},
                   {"ino": 12, "page": 9, "cause": "other"}, {"ino": 12, "page": 21, "cause": "other"},
                   {"ino": 12, "page": 22, "cause": "readahead"}, {"ino": 12, "page": 23, "cause": "other"}]
    assert s.rows("SELECT filled_bytes, readahead_bytes, unused_bytes, read_filled_bytes, write_filled_bytes, "
                  "other_filled_bytes FROM readahead_summary") == [
        {"filled_bytes": 6 * 4096, "readahead_bytes": 4096, "unused_bytes": 4096, "read_filled_bytes": 0,
         "write_filled_bytes": 4096, "other_filled_bytes": 4 * 4096}]


def test_pages_of_a_memory_mapped_file_are_faulted_in_and_used_by_mapping():
    """Reads of a mapped file make no system call: a page fault (9) asks
    for a page, and fault-around (10) maps cached pages near it.  A page
    added for a fault is put down to it; readahead pages a process mapped
    were used, the whole folio when a mapping touches one page of it; a
    page mapped only after its eviction, or never, was not."""
    ms = 1_000_000
    ev = [pagecache(100, 5, 1, 9),                          # fault on page 5 ...
          pagecache(110, 5, 1, 1),                          # ... which it reads in
          pagecache(200, 30, 8, 5),                         # readahead of pages 30-37
          pagecache(210, 30, 4, 1),                         # a 4-page folio at 30
          pagecache(211, 34, 1, 1), pagecache(212, 35, 1, 1),
          pagecache(213, 36, 1, 1), pagecache(214, 37, 1, 1),
          pagecache(300, 31, 1, 10),                        # fault-around maps page 31 (folio 30-33)
          pagecache(301, 34, 2, 10),                        # ... and pages 34-35
          pagecache(400, 36, 1, 2),                         # page 36 evicted ...
          pagecache(500, 36, 1, 10),                        # ... before it was mapped
          pagecache(600, 50, 1, 9), pagecache(600 + 60 * ms, 50, 1, 1)]   # 60 ms on: not that fault
    s = session(pagecache_events=ev)
    got = s.rows("SELECT page, cause, used FROM readahead_pages ORDER BY page")
    assert got == [{"page": 5, "cause": "fault", "used": True},
                   {"page": 30, "cause": "readahead", "used": True},
                   {"page": 31, "cause": "readahead", "used": True},
                   {"page": 32, "cause": "readahead", "used": True},
                   {"page": 33, "cause": "readahead", "used": True},
                   {"page": 34, "cause": "readahead", "used": True},
                   {"page": 35, "cause": "readahead", "used": True},
                   {"page": 36, "cause": "readahead", "used": False},
                   {"page": 37, "cause": "readahead", "used": False},
                   {"page": 50, "cause": "other", "used": False}]
    assert s.rows("SELECT readahead_bytes, unused_bytes, fault_filled_bytes, other_filled_bytes "
                  "FROM readahead_summary") == [
        {"readahead_bytes": 8 * 4096, "unused_bytes": 2 * 4096, "fault_filled_bytes": 4096,
         "other_filled_bytes": 4096}]


def test_write_absorbed_by_the_page_cache_reaches_no_lower_level():
    t = dict(vfs_events=[vfs(100, 10, off=0, syscall=2)])
    s = session(**t)
    assert s.rows("SELECT level, bytes FROM amplification WHERE op = 'write' ORDER BY depth") == [
        {"level": "vfs", "bytes": 4096}, {"level": "vdisk", "bytes": 0},
        {"level": "hostfs", "bytes": 0}, {"level": "disk", "bytes": 0}]
    assert s.rows("SELECT app_bytes, vdisk_bytes FROM amplification_per_io") == [
        {"app_bytes": 4096, "vdisk_bytes": 0}]


def test_fua_and_fsync_bound_writes_are_counted():
    t = dict(vfs_events=[vfs(100, 10, off=0, syscall=4), vfs(200, 500, off=-1, req=0, ret=0, syscall=11)],
             block_events=request(300, 310, 400, VDISK, 4 * MiB, 4096, rq=1, bio=1, op=1)
             + request(450, 460, 600, VDISK, 8 * MiB, 4096, rq=2, bio=2, op=1, flags=1 | 8))
    s = session(**t)
    got = s.rows("SELECT level, writes, stable_writes, flushes, fsync_bound_writes FROM sync_transform "
                 "WHERE level IN ('vfs', 'vdisk') ORDER BY level")
    assert got == [{"level": "vdisk", "writes": 2, "stable_writes": 1, "flushes": 0, "fsync_bound_writes": 2},
                   {"level": "vfs", "writes": 1, "stable_writes": 0, "flushes": 1, "fsync_bound_writes": 0}]


def test_writes_forced_out_by_sync_file_range_are_counted_apart_from_fsyncs():
    # a buffered write, sync_file_range over it (writeback of the range, no
    # cache flush: not a flush, not fsync-bound), its write below inside
    # it, and a later write below outside it
    t = dict(vfs_events=[vfs(100, 10, off=0, syscall=2), vfs(200, 500, off=0, req=4096, ret=0, syscall=13)],
             block_events=request(300, 310, 400, VDISK, 4 * MiB, 4096, rq=1, bio=1, op=1)
             + request(900, 910, 950, VDISK, 8 * MiB, 4096, rq=2, bio=2, op=1))
    s = session(**t)
    got = s.rows("SELECT level, writes, flushes, fsync_bound_writes, range_syncs, range_sync_bound_writes "
                 "FROM sync_transform WHERE level IN ('vfs', 'vdisk') ORDER BY level")
    assert got == [{"level": "vdisk", "writes": 2, "flushes": 0, "fsync_bound_writes": 0,
                    "range_syncs": 0, "range_sync_bound_writes": 1},
                   {"level": "vfs", "writes": 1, "flushes": 0, "fsync_bound_writes": 0,
                    "range_syncs": 1, "range_sync_bound_writes": 0}]


def test_a_write_inside_a_long_fsync_is_bound_after_a_shorter_one_ends():
    # two threads' fsyncs: a long one (1000-3000) and a short one that
    # starts later and ends first (1100-1200); writes below at 1500 (inside
    # the long one only), 1150 (both), 3500 (neither) and 900 (before both)
    t = dict(vfs_events=[vfs(1000, 2000, off=-1, req=0, ret=0, syscall=11),
                         vfs(1100, 100, off=-1, req=0, ret=0, syscall=12)],
             block_events=[e for i, q in enumerate((1500, 1150, 3500, 900))
                           for e in request(q, q + 10, q + 50, VDISK, (4 + i) * MiB, 4096, rq=i + 1,
                                            bio=i + 1, op=1)])
    s = session(**t)
    assert s.rows("SELECT writes, flushes, fsync_bound_writes, range_sync_bound_writes "
                  "FROM sync_transform WHERE level = 'vdisk'") == [
        {"writes": 4, "flushes": 0, "fsync_bound_writes": 2, "range_sync_bound_writes": 0}]


def test_cached_intermediates_give_the_same_numbers():
    from nestrace.query.session import LINKS_CACHE
    t = direct_read_stack()
    t["block_events"] += request(2000, 2010, 2500, VDISK, 4 * MiB + 512, 512, rq=3, bio=13, op=1)
    t["block_events"] += request(2100, 2110, 2300, DISK, 104 * MiB, 4096, rq=4, bio=14)
    views = ["seek_summary", "phases_stats", "amplification", "links_summary", "links_to_vfs",
             "rmw_summary", "sync_transform", "size_histogram"]
    base = {"capture_meta": capture_meta(), "device_map": device_map(), "extent_maps": extents()}
    plain = Session.from_tables(base | t, cache_links=False)
    cached = Session.from_tables(base | t, cache_links=False)
    cached.cache(LINKS_CACHE)
    for v in views:
        q = f"SELECT * FROM {v} ORDER BY ALL"
        assert plain.rows(q) == cached.rows(q), v
    assert plain.rows("SELECT count(*) AS n FROM rmw_summary") == [{"n": 1}]


def test_links_summary_shares_add_up_per_hop():
    t = dict(vfs_events=[vfs(100, 900, off=0)],
             block_events=request(200, 210, 800, VDISK, 4 * MiB, 16384, rq=1, bio=11, flags=32))
    s = session(**t)
    got = s.rows("SELECT kind, attributed, requests, bytes, fraction FROM links_summary ORDER BY kind")
    assert got == [{"kind": "readahead", "attributed": False, "requests": 1, "bytes": 12288, "fraction": 0.75},
                   {"kind": "sync", "attributed": True, "requests": 1, "bytes": 4096, "fraction": 0.25}]


def test_seek_summary_per_level():
    ev = (request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1) + request(4, 5, 6, DISK, 4096, 4096, rq=2, bio=2)
          + request(7, 8, 9, DISK, 8192, 4096, rq=3, bio=3) + request(10, 11, 12, DISK, 1 * MiB, 4096, rq=4, bio=4))
    s = session(block_events=ev)
    got = s.rows("SELECT n, sequential_fraction, median_abs, p90_abs FROM seek_summary WHERE level = 'disk'")
    assert got == [{"n": 3, "sequential_fraction": pytest.approx(2 / 3), "median_abs": 0,
                    "p90_abs": (1 * MiB - 12288) // 512}]


def test_map_extents_prefers_the_end_snapshot_then_start_then_mapping_events():
    from rows import _hdr
    ext = extents()
    start = [dict(r, phase="start", physical_bytes=r["physical_bytes"] + 4096) for r in ext]
    late = _hdr(5, 50) | {"ino": 99, "file_offset_bytes": 0, "disk_bytes": 7 * MiB,
                          "length_bytes": 8192, "dev": GUEST, "map_type": 2, "source": 1, "flags": 1}
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": ext + start, "mapping_events": [late]})
    got = s.rows("SELECT role, ino, physical_bytes, source FROM map_extents ORDER BY role, ino")
    assert got == [{"role": "guest_file", "ino": 12, "physical_bytes": 4 * MiB, "source": "fiemap_end"},
                   {"role": "guest_file", "ino": 99, "physical_bytes": 7 * MiB, "source": "mapping_events"},
                   {"role": "image", "ino": 131, "physical_bytes": 100 * MiB, "source": "fiemap_end"}]


def _keys(obj, prefix=""):
    """Documented key paths: dict keys, list items as []."""
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            out |= _keys(v, p)
    elif isinstance(obj, list) and obj and isinstance(obj[0], dict):
        for item in obj:
            out |= _keys(item, prefix + "[]")
    return out


def test_every_report_json_key_is_documented():

    from nestrace.report.document import build
    t = direct_read_stack()
    t["block_events"] += request(2000, 2010, 2500, VDISK, 4 * MiB + 512, 512, rq=3, bio=13, op=1)
    # (the guest FS on a partition: the report's partitions row)
    t["device_map"] = [r | ({"part_start_bytes": 0, "size_sectors": 1 << 19}
                            if r["level"] == "vfs" else {}) for r in device_map()]
    s = session(**t)
    s.store = None
    rep = build(s, "c1")
    assert rep["partitions"], rep["partitions"]
    doc = (ROOT / "docs" / "reference" / "report.md").read_text()
    documented = set(re.findall(r"`([a-z_\[\].0-9]+)`", doc))
    missing = []
    for k in sorted(_keys(rep)):
        leaf = k.split(".")[-1].replace("[]", "")
        parent = k.rsplit(".", 1)[0] if "." in k else ""
        if k in documented or leaf in documented or (parent.startswith("levels[].phases")):
            continue
        missing.append(k)
    assert missing == []


def test_write_straddling_two_host_pages_counts_both_reads():
    # a 4 KiB virtual-disk write at image offset 1 KiB covers parts of two
    # host pages; the host reads both (4 KiB each, different durations)
    t = dict(block_events=request(100, 110, 900, VDISK, 4 * MiB + 1024, 4096, rq=1, bio=11, op=1)
             + request(150, 160, 300, DISK, 104 * MiB, 4096, rq=2, bio=12)
             + request(200, 210, 500, DISK, 104 * MiB + 4096, 4096, rq=3, bio=13))
    s = session(**t)
    assert s.rows("SELECT hop, write_bytes, reads, read_bytes, read_ns FROM rmw") == [
        {"hop": "host", "write_bytes": 4096, "reads": 2, "read_bytes": 8192, "read_ns": 450}]


def test_two_reads_of_equal_length_and_duration_are_both_counted():
    # an app write of 1 KiB at 3584 straddles two 4 KiB guest blocks; the
    # guest FS reads each block, in the same time
    t = dict(vfs_events=[vfs(100, 800, off=3584, req=1024, ret=1024, syscall=4)],
             block_events=request(200, 210, 400, VDISK, 4 * MiB, 4096, rq=1, bio=11)
             + request(300, 310, 500, VDISK, 4 * MiB + 4096, 4096, rq=2, bio=12))
    s = session(**t)
    assert s.rows("SELECT hop, reads, read_bytes, read_ns FROM rmw") == [
        {"hop": "guest", "reads": 2, "read_bytes": 8192, "read_ns": 400}]
    assert s.rows("SELECT reads, read_bytes, extra_ns FROM rmw_summary") == [
        {"reads": 2, "read_bytes": 8192, "extra_ns": 400}]
