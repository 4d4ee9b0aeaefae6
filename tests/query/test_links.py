"""Diff tests of the offset maps and links: hand-built stacks, exact rows."""
from __future__ import annotations

from rows import (
    CAP,
    DISK,
    HOSTFS,
    VDISK,
    blk,
    capture_meta,
    device_map,
    extents,
    hostfs,
    pagecache,
    request,
    vfs,
)
from views_helpers import MiB, direct_read_stack, session

from nestrace.query.session import Session


def test_map_vfs_carries_a_file_offset_to_vdisk_image_and_disk():
    s = session(**direct_read_stack())
    got = s.rows("SELECT file_offset_bytes, bytes, vdisk_offset_bytes, image_offset_bytes, "
                 "disk_offset_bytes FROM map_vfs")
    assert got == [{"file_offset_bytes": 8192, "bytes": 4096, "vdisk_offset_bytes": 4 * MiB + 8192,
                    "image_offset_bytes": 4 * MiB + 8192,
                    "disk_offset_bytes": 104 * MiB + 8192}]


def test_a_host_fs_write_no_virtual_disk_request_explains_is_other_not_writeback():
    """(a hypervisor's write of the image from before a guest's capture
    began, in a merged capture, was called write-back)"""
    t = direct_read_stack()
    t["hostfs_events"] = t["hostfs_events"] + [hostfs(5000, 8 * MiB, 65536, source=4, op=1,
                                                      flags=1)]
    s = session(**t)
    assert s.rows("SELECT kind, bytes FROM links WHERE lower_level = 'hostfs' "
                  "AND upper_id IS NULL") == [{"kind": "other", "bytes": 65536}]


def test_a_host_page_cache_access_counts_whole_for_the_request_that_touched_part_of_its_page():
    """The host page cache reads and dirties whole 4 KiB pages: a 2 KiB
    virtual-disk write dirties (btrfs: writeback_dirty_folio) the whole
    page, a 512-byte read reads it whole (filemap page lookup); the page
    counts whole for the request, not half for it and half "other".  A
    host-FS access with the request's own range (xfs' buffered read
    event) keeps the exact overlap."""
    def links(host_fs, **t):
        s = Session.from_tables({"capture_meta": capture_meta(), "extent_maps": extents(),
                                 "device_map": device_map(host_fs=host_fs)} | t)
        return s.rows("SELECT l.kind, l.bytes, v.start_ns AS vdisk FROM links l "
                      "LEFT JOIN vdisk_io v ON v.io_id = l.upper_id "
                      "WHERE l.lower_level = 'hostfs' ORDER BY ALL")
    ev = (request(100, 110, 200, VDISK, 4 * MiB + 1024, 2048, rq=1, bio=1, op=1)
          + request(300, 310, 400, VDISK, 8 * MiB + 512, 512, rq=2, bio=2))
    # btrfs: the write's page dirtied while it is in flight, and again
    # (btrfs redirtying it) after it ended: write-back of the whole page
    dirty = [pagecache(150, 4 * MiB // 4096, 1, 7, ino=131, dev=HOSTFS),
             pagecache(5000, 4 * MiB // 4096, 1, 7, ino=131, dev=HOSTFS)]
    assert links("btrfs", block_events=ev, pagecache_events=dirty) == [
        {"kind": "sync", "bytes": 4096, "vdisk": 100},
        {"kind": "writeback", "bytes": 4096, "vdisk": 100}]
    # ext4: the read's page looked up whole
    assert links("ext4", block_events=ev, hostfs_events=[hostfs(350, 8 * MiB, 4096, source=6)]) == [
        {"kind": "sync", "bytes": 4096, "vdisk": 300}]
    # xfs' own read event: its range is the request's; more is not the request's
    assert links("xfs", block_events=ev, hostfs_events=[hostfs(350, 8 * MiB, 4096, source=1)]) == [
        {"kind": "other", "bytes": 3584, "vdisk": None}, {"kind": "sync", "bytes": 512, "vdisk": 300}]


def test_a_page_two_split_pieces_touch_goes_to_the_piece_still_in_flight():
    """Both pieces of a split bio start at its Q.  A host page lookup after
    the first piece completed, of the page it shares with the remainder,
    serves the remainder (in flight): sync for it.  The join used to take
    either piece (ties in start time were not ordered), and with the
    first the page was "other": 0.3-0.4 MiB of a 1 KiB-block guest's
    readahead on a btrfs host, a different amount at each query."""
    s0 = 4 * MiB // 512 + 2                     # 4 MiB + 1 KiB
    ev = [blk("Q", 10, dev=VDISK, sector=s0, nr=16, bio=1),
          blk("X", 12, dev=VDISK, sector=s0, nr=8, bio=2, aux=s0 + 8),
          blk("G", 13, dev=VDISK, sector=s0, nr=8, bio=2),
          blk("D", 14, dev=VDISK, sector=s0, nr=8, rq=1, bio=2),
          blk("G", 16, dev=VDISK, sector=s0 + 8, nr=8, bio=1),
          blk("D", 17, dev=VDISK, sector=s0 + 8, nr=8, rq=2, bio=1),
          blk("C", 40, dev=VDISK, sector=s0, nr=8, rq=1),
          blk("C", 60, dev=VDISK, sector=s0 + 8, nr=8, rq=2)]
    s = Session.from_tables({"capture_meta": capture_meta(), "extent_maps": extents(),
                             "device_map": device_map(host_fs="ext4"), "block_events": ev,
                             "hostfs_events": [hostfs(45, 4 * MiB + 4096, 4096, source=6)]})
    assert s.rows("SELECT start_ns, d_ns, c_ns FROM vdisk_io ORDER BY d_ns") == [
        {"start_ns": 10, "d_ns": 14, "c_ns": 40}, {"start_ns": 10, "d_ns": 17, "c_ns": 60}]
    assert s.rows("SELECT l.kind, l.bytes, v.d_ns FROM links l LEFT JOIN vdisk_io v "
                  "ON v.io_id = l.upper_id WHERE l.lower_level = 'hostfs'") == [
        {"kind": "sync", "bytes": 4096, "d_ns": 17}]


def test_map_vfs_splits_a_piece_at_the_end_of_an_image_extent():
    """1 KiB guest blocks: a 4 KiB read can cross an image extent's end,
    and its two parts lie in different places on the disk."""
    ext = extents(image=((0, 100 * MiB, 4 * MiB + 1024), (4 * MiB + 1024, 200 * MiB, 60 * MiB)))
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": ext, "vfs_events": [vfs(1, 2, off=0)]})
    got = s.rows("SELECT file_offset_bytes, bytes, vdisk_offset_bytes, image_offset_bytes, "
                 "disk_offset_bytes FROM map_vfs ORDER BY 1")
    assert got == [{"file_offset_bytes": 0, "bytes": 1024, "vdisk_offset_bytes": 4 * MiB,
                    "image_offset_bytes": 4 * MiB, "disk_offset_bytes": 104 * MiB},
                   {"file_offset_bytes": 1024, "bytes": 3072, "vdisk_offset_bytes": 4 * MiB + 1024,
                    "image_offset_bytes": 4 * MiB + 1024, "disk_offset_bytes": 200 * MiB}]


def test_file_systems_on_partitions_map_through_the_partition_starts():
    """FIEMAP gives addresses on the file system's own (partition) device;
    the partition's start carries them to the whole disk."""
    dm = device_map()
    for r in dm:
        r["part_start_bytes"] = {"vfs": 1 * MiB, "hostfs": 2 * MiB}.get(r["level"], 0)
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                             "extent_maps": extents(), "vfs_events": [vfs(1, 2, off=8192)]})
    assert s.rows("SELECT role, physical_bytes FROM map_extents ORDER BY role") == [
        {"role": "guest_file", "physical_bytes": 5 * MiB}, {"role": "image", "physical_bytes": 102 * MiB}]
    assert s.rows("SELECT vdisk_offset_bytes, disk_offset_bytes FROM map_vfs") == [
        {"vdisk_offset_bytes": 5 * MiB + 8192, "disk_offset_bytes": 107 * MiB + 8192}]


def test_map_vfs_splits_a_range_that_spans_two_extents():
    ext = extents(guest=((0, 4 * MiB, 4096), (4096, 9 * MiB, 4096)))
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": ext, "vfs_events": [vfs(1, 2, off=2048, req=4096, ret=4096)]})
    got = s.rows("SELECT file_offset_bytes, bytes, vdisk_offset_bytes FROM map_vfs ORDER BY 1")
    assert got == [{"file_offset_bytes": 2048, "bytes": 2048, "vdisk_offset_bytes": 4 * MiB + 2048},
                   {"file_offset_bytes": 4096, "bytes": 2048, "vdisk_offset_bytes": 9 * MiB}]


def test_links_tie_each_level_to_the_read_that_caused_it():
    s = session(**direct_read_stack())
    got = s.rows("SELECT upper_level, lower_level, kind, bytes, upper_id IS NOT NULL AS has_upper "
                 "FROM links ORDER BY lower_level")
    assert got == [
        {"upper_level": "vdisk", "lower_level": "disk", "kind": "sync", "bytes": 4096, "has_upper": True},
        {"upper_level": "vdisk", "lower_level": "hostfs", "kind": "sync", "bytes": 4096, "has_upper": True},
        {"upper_level": "vfs", "lower_level": "vdisk", "kind": "sync", "bytes": 4096, "has_upper": True}]
    assert s.rows("SELECT level, fraction FROM links_to_vfs ORDER BY level") == [
        {"level": "disk", "fraction": 1.0}, {"level": "vdisk", "fraction": 1.0}]


def test_vfs_files_sums_each_files_calls_and_what_they_cost_below():
    """A file read twice, back to back (the first read reaching the host
    disk, the second served from the guest's cache), named by its end
    snapshot; a file in no snapshot, written once and fsynced; a sync(2),
    which is no file's."""
    t = direct_read_stack()
    t["vfs_events"] += [vfs(1000, 50, off=12288),
                        vfs(2000, 10, ino=13, off=0, syscall=4),
                        vfs(2100, 500, ino=13, off=-1, req=0, ret=0, syscall=11),
                        vfs(2700, 30, ino=0, off=-1, req=0, ret=0, syscall=11)]
    rows = [r | {"path": "/g/a"} if r["role"] == "guest_file" else r for r in extents()]
    s = session(**t, extent_maps=rows + [r | {"phase": "start", "path": "/g/old"} for r in rows
                                         if r["role"] == "guest_file"])
    assert s.rows("SELECT * EXCLUDE (capture_id, dev) FROM vfs_files ORDER BY ino") == [
        {"ino": 12, "path": "/g/a", "calls": 2, "reads": 2, "writes": 0, "syncs": 0,
         "read_bytes": 8192, "write_bytes": 0, "busy_ns": 950, "sequential_fraction": 1.0,
         "vdisk_bytes": 4096, "disk_bytes": 4096.0, "processes": 1},
        {"ino": 13, "path": None, "calls": 2, "reads": 0, "writes": 1, "syncs": 1,
         "read_bytes": 0, "write_bytes": 4096, "busy_ns": 510, "sequential_fraction": None,
         "vdisk_bytes": 0, "disk_bytes": 0.0, "processes": 1}]


def test_vfs_processes_sums_each_processs_calls_and_what_they_cost_below():
    """Process 1 reads a file (reaching the host disk) from two threads,
    under two task names (it exec'd); process 2 writes another and syncs
    every file system."""
    t = direct_read_stack()
    t["vfs_events"] += [vfs(1000, 50, off=12288) | {"tid": 2},
                        vfs(1100, 50, off=16384) | {"comm": "sh"},
                        vfs(2000, 10, ino=13, off=0, syscall=4) | {"pid": 2, "tid": 3},
                        vfs(2700, 30, ino=0, off=-1, req=0, ret=0, syscall=39) | {"pid": 2, "tid": 3}]
    s = session(**t)
    assert s.rows("SELECT * EXCLUDE (capture_id) FROM vfs_processes ORDER BY pid") == [
        {"pid": 1, "comm": "fio", "threads": 2, "files": 1, "calls": 3, "reads": 3, "writes": 0,
         "syncs": 0, "read_bytes": 12288, "write_bytes": 0, "busy_ns": 1000,
         "vdisk_bytes": 4096, "disk_bytes": 4096.0},
        {"pid": 2, "comm": "fio", "threads": 1, "files": 1, "calls": 2, "reads": 0, "writes": 1,
         "syncs": 1, "read_bytes": 0, "write_bytes": 4096, "busy_ns": 40,
         "vdisk_bytes": 0, "disk_bytes": 0.0}]


def test_a_calls_disk_bytes_are_its_share_of_the_whole_virtual_disk_request():
    """A traced 4 KiB O_DIRECT read at file offset 8192 merged into one
    8 KiB virtual-disk request with the untraced 4 KiB after it (another
    process's, with --pid or --cgroup): the host disk reads 8 KiB for that
    request, and the call is given half of it, not all."""
    t = dict(vfs_events=[vfs(100, 900, off=8192, f_flags=0o40000)],
             block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 8192, rq=1, bio=11)
             + request(310, 320, 800, DISK, 100 * MiB + 4 * MiB + 8192, 8192, rq=2, bio=12),
             hostfs_events=[hostfs(300, 4 * MiB + 8192, 8192, source=3, flags=1)])
    s = session(**t)
    assert s.rows("SELECT kind, upper_id IS NULL AS unattributed, bytes FROM links "
                  "WHERE lower_level = 'vdisk' ORDER BY kind") == [
        {"kind": "other", "unattributed": True, "bytes": 4096},
        {"kind": "sync", "unattributed": False, "bytes": 4096}]
    assert s.rows("SELECT app_bytes, vdisk_bytes, disk_bytes FROM amplification_per_io") == [
        {"app_bytes": 4096, "vdisk_bytes": 4096, "disk_bytes": 4096.0}]


def test_a_request_whose_completion_was_lost_serves_until_its_id_is_used_again():
    # the vdisk read's C was not recorded; its request id is dispatched
    # again at 5000 (so it had completed by then): the host access and
    # disk read at 300 are its, a disk read of the block at 6000 is not
    t = direct_read_stack()
    t["block_events"] = ([e for e in t["block_events"] if not (e["dev"] == VDISK and e["action"] == 7)]
                         + [blk("D", 5000, dev=VDISK, sector=(4 * MiB + 65536) // 512, rq=1, bio=13)]
                         + request(6000, 6010, 6500, DISK, 100 * MiB + 4 * MiB + 8192, 4096,
                                   rq=3, bio=14))
    s = session(**t)
    assert s.rows("SELECT c_ns, done_by_ns FROM vdisk_io ORDER BY d_ns") == [
        {"c_ns": None, "done_by_ns": 5000}, {"c_ns": None, "done_by_ns": None}]
    lost = s.rows("SELECT io_id FROM vdisk_io WHERE d_ns = 210")[0]["io_id"]
    got = s.rows("SELECT l.lower_level, d.start_ns, l.upper_id, l.kind, l.bytes FROM links l "
                 "LEFT JOIN disk_io d ON l.lower_level = 'disk' AND d.io_id = l.lower_id "
                 "WHERE l.upper_level = 'vdisk' ORDER BY ALL")
    assert got == [
        {"lower_level": "disk", "start_ns": 310, "upper_id": lost, "kind": "sync", "bytes": 4096},
        {"lower_level": "disk", "start_ns": 6000, "upper_id": None, "kind": "other", "bytes": 4096},
        {"lower_level": "hostfs", "start_ns": None, "upper_id": lost, "kind": "sync",
         "bytes": 4096}]


def test_readahead_beyond_the_read_is_classified_not_attributed():
    t = dict(vfs_events=[vfs(100, 900, off=0)],
             block_events=request(200, 210, 800, VDISK, 4 * MiB, 16384, rq=1, bio=11, flags=32))
    s = session(**t)
    got = s.rows("SELECT kind, bytes, upper_id IS NULL AS unattributed FROM links ORDER BY kind")
    assert got == [{"kind": "readahead", "bytes": 12288, "unattributed": True},
                   {"kind": "sync", "bytes": 4096, "unattributed": False}]


def test_reads_of_a_memory_mapped_file_are_put_down_to_its_page_faults():
    """A read of a mapped file is a page fault, not a system call: a
    virtual-disk read of the block a fault asked for (file page 1 is 4 MiB
    + 4 KiB on the virtual disk) is kind fault; the readahead around it,
    a block no fault asked for, and a read 60 ms after the fault are not."""
    ms = 1_000_000
    t = dict(pagecache_events=[pagecache(100, 1, 1, 9), pagecache(1000, 8, 1, 9)],
             block_events=request(200, 210, 800, VDISK, 4 * MiB, 16384, rq=1, bio=11, flags=32)
             + request(300, 310, 900, VDISK, 4 * MiB + 40960, 4096, rq=2, bio=12)
             + request(1000 + 60 * ms, 1000 + 60 * ms + 10, 1000 + 61 * ms, VDISK,
                       4 * MiB + 32768, 4096, rq=3, bio=13))
    s = session(**t)
    got = s.rows("SELECT lower_id, kind, bytes, upper_id IS NULL AS unattributed FROM links "
                 "ORDER BY lower_id, kind")
    ids = sorted({r["lower_id"] for r in got})
    assert [{k: v for k, v in r.items() if k != "lower_id"} for r in got] == [
        {"kind": "fault", "bytes": 4096, "unattributed": True},
        {"kind": "readahead", "bytes": 12288, "unattributed": True},
        {"kind": "other", "bytes": 4096, "unattributed": True},
        {"kind": "other", "bytes": 4096, "unattributed": True}]
    assert [r["lower_id"] for r in got] == [ids[0], ids[0], ids[1], ids[2]]


def test_reads_a_readahead_or_willneed_call_queued_are_tied_to_it():
    """readahead(2) of file bytes [0, 16 KiB) at 100-1000 ns, and
    fadvise(WILLNEED) from 64 KiB to the file's end at 2000-2500 (length
    0), both through the guest extent at 4 MiB on the virtual disk.  Tied
    to their call, kind hint: the 16 KiB read queued at 200, and the 8 KiB
    read at 64 KiB queued at 2100.  Not tied: a read in the willneed's
    range queued after the call returned (3000), one in a dontneed's range
    (5050), and one in the readahead's range by a failed readahead
    (6050): the kernel's readahead flag makes them kind readahead."""
    hint = dict(syscall=36, ret=0)
    t = dict(vfs_events=[vfs(100, 900, off=0, req=16384, **hint),
                         vfs(2000, 500, off=65536, req=0, syscall=35, ret=0) | {"iov_count": 3},
                         vfs(5000, 100, off=131072, syscall=35, ret=0) | {"iov_count": 4},
                         vfs(6000, 100, off=0, req=4096, syscall=36, ret=-9)],
             block_events=request(200, 210, 800, VDISK, 4 * MiB, 16384, rq=1, bio=11, flags=32)
             + request(2100, 2110, 2800, VDISK, 4 * MiB + 65536, 8192, rq=2, bio=12, flags=32)
             + request(3000, 3010, 3800, VDISK, 4 * MiB + 73728, 4096, rq=3, bio=13, flags=32)
             + request(5050, 5060, 5800, VDISK, 4 * MiB + 131072, 4096, rq=4, bio=14, flags=32)
             + request(6050, 6060, 6800, VDISK, 4 * MiB, 4096, rq=5, bio=15, flags=32))
    s = session(**t)
    hints = [r["io_id"] for r in s.rows("SELECT io_id FROM vfs_hints ORDER BY ts_ns")]
    got = s.rows("SELECT v.start_ns, l.upper_level, l.upper_id, l.kind, l.bytes, l.lag_ns "
                 "FROM links l JOIN vdisk_io v ON v.io_id = l.lower_id "
                 "WHERE l.lower_level = 'vdisk' ORDER BY v.start_ns")
    assert got == [
        {"start_ns": 200, "upper_level": "vfs", "upper_id": hints[0], "kind": "hint",
         "bytes": 16384, "lag_ns": 100},
        {"start_ns": 2100, "upper_level": "vfs", "upper_id": hints[1], "kind": "hint",
         "bytes": 8192, "lag_ns": 100},
        {"start_ns": 3000, "upper_level": "vfs", "upper_id": None, "kind": "readahead",
         "bytes": 4096, "lag_ns": None},
        {"start_ns": 5050, "upper_level": "vfs", "upper_id": None, "kind": "readahead",
         "bytes": 4096, "lag_ns": None},
        {"start_ns": 6050, "upper_level": "vfs", "upper_id": None, "kind": "readahead",
         "bytes": 4096, "lag_ns": None}], got
    # nothing in vfs_io, and followed from the call down
    assert s.rows("SELECT count(*) AS n FROM vfs_io") == [{"n": 0}]
    down = s.rows(f"SELECT depth, level, op, bytes, kind FROM follow_io('{CAP}', 'vfs', "
                  f"{hints[1]}) ORDER BY depth")
    assert down == [{"depth": 0, "level": "vfs", "op": "other", "bytes": 0, "kind": None},
                    {"depth": 1, "level": "vdisk", "op": "read", "bytes": 8192,
                     "kind": "hint"}], down


def test_hints_summary_counts_calls_per_advice_and_the_reads_tied_to_them():
    """Two readahead(2) calls, one of which queued a 16 KiB read, a failed
    one, and fadvise RANDOM twice (one to the file's end)."""
    t = dict(vfs_events=[vfs(100, 900, off=0, req=16384, syscall=36, ret=0),
                         vfs(3000, 10, off=65536, req=8192, syscall=36, ret=0),
                         vfs(4000, 10, off=0, req=4096, syscall=36, ret=-9),
                         vfs(5000, 1, off=0, req=0, syscall=35, ret=0) | {"iov_count": 1},
                         vfs(6000, 1, off=4096, req=4096, syscall=35, ret=0) | {"iov_count": 1}],
             block_events=request(200, 210, 800, VDISK, 4 * MiB, 16384, rq=1, bio=11, flags=32))
    s = session(**t)
    got = s.rows("SELECT * EXCLUDE (capture_id) FROM hints_summary ORDER BY syscall")
    assert got == [
        {"syscall": "fadvise64", "advice": "random", "reads": False, "calls": 2, "failed": 0, "range_bytes": 4096,
         "to_end_calls": 1, "tied_requests": 0, "tied_bytes": 0},
        {"syscall": "readahead", "advice": None, "reads": True, "calls": 3, "failed": 1, "range_bytes": 28672,
         "to_end_calls": 0, "tied_requests": 1, "tied_bytes": 16384}], got
    assert s.hints().num_rows == 2


def test_io_uring_splice_sides_are_a_read_and_a_write_and_its_madvise_a_hint():
    """io_uring's splice (codes 44 and 45: the file read, the file written)
    is a vfs_io row per side, op read and op write, as splice(2); its
    madvise (43) a vfs_hints row with madvise's advice names, whose
    POPULATE_READ ties the virtual-disk read it queued (400 ns)."""
    t = dict(vfs_events=[vfs(100, 50, off=0, req=65536, ret=65536, syscall=44),
                         vfs(200, 50, off=8192, req=65536, ret=65536, syscall=45),
                         vfs(300, 900, off=0, req=16384, ret=0, syscall=43)
                         | {"iov_count": 22, "fd": -1},
                         vfs(2000, 10, off=0, req=16384, ret=0, syscall=43)
                         | {"iov_count": 1, "fd": -1}],
             block_events=request(400, 410, 800, VDISK, 4 * MiB, 16384, rq=1, bio=11, flags=32))
    s = session(**t)
    assert s.rows("SELECT syscall, op, offset_bytes, bytes FROM vfs_io ORDER BY ts_ns") == [
        {"syscall": "uring_splice", "op": "read", "offset_bytes": 0, "bytes": 65536},
        {"syscall": "uring_splice", "op": "write", "offset_bytes": 8192, "bytes": 65536}]
    hints = s.rows("SELECT io_id, syscall, advice, reads, fd FROM vfs_hints ORDER BY ts_ns")
    assert [{k: v for k, v in r.items() if k != "io_id"} for r in hints] == [
        {"syscall": "uring_madvise", "advice": "populate_read", "reads": True, "fd": -1},
        {"syscall": "uring_madvise", "advice": "random", "reads": False, "fd": -1}]
    assert s.rows("SELECT upper_id, kind, bytes FROM links WHERE lower_level = 'vdisk'") == [
        {"upper_id": hints[0]["io_id"], "kind": "hint", "bytes": 16384}]


def test_buffered_write_is_tied_to_its_writeback_with_the_lag():
    t = dict(vfs_events=[vfs(100, 10, off=0, syscall=4)],
             block_events=request(5000, 5010, 6000, VDISK, 4 * MiB, 4096, rq=1, bio=11, op=1))
    s = session(**t)
    assert s.rows("SELECT kind, bytes, lag_ns FROM links") == [
        {"kind": "writeback", "bytes": 4096, "lag_ns": 4890}]


def test_a_block_written_in_parts_is_written_back_for_each_parts_last_write():
    """Small buffered writes share a 4 KiB block of the virtual disk: a
    1 KiB-block guest FS whose file starts 1 KiB into a block, or an app
    writing 512-byte records.  One write-back request carries them all:
    each sector is put down to the last write of it, not the block's
    bytes to the block's last write alone.  Here: 1 KiB at 0 (sector 0-1),
    2 KiB at 1024, 512 B at 3072 and again at 3072 (the later one
    counts), and nothing wrote the last 512 B.  On a guest FS of 4 KiB
    blocks the block is one page of the file, written back whole because
    the last write dirtied it: that 512 B is the last write's too.  On a
    1 KiB-block FS the block may hold another file's blocks: it is left
    unattributed."""
    t = dict(vfs_events=[vfs(100, 10, off=0, req=1024, ret=1024, syscall=4),
                         vfs(200, 10, off=1024, req=2048, ret=2048, syscall=4),
                         vfs(300, 10, off=3072, req=512, ret=512, syscall=4),
                         vfs(400, 10, off=3072, req=512, ret=512, syscall=4)],
             block_events=request(5000, 5010, 6000, VDISK, 4 * MiB, 4096, rq=1, bio=11, op=1))
    for bs, last, rest in ((4096, 1024, []), (1024, 512, [(None, 512, None)])):
        dm = [r | {"block_size_bytes": bs} if r["level"] == "vfs" else r for r in device_map()]
        s = session(device_map=dm, **t)
        ids = {r["ts_ns"]: r["io_id"] for r in s.rows("SELECT ts_ns, io_id FROM vfs_io")}
        got = s.rows("SELECT kind, upper_id, bytes, lag_ns FROM links "
                     "ORDER BY upper_id NULLS FIRST")
        assert got == [{"kind": "writeback", "upper_id": u, "bytes": b, "lag_ns": lag}
                       for u, b, lag in rest + [(ids[100], 1024, 4890), (ids[200], 2048, 4790),
                                                (ids[400], last, 4590)]], bs


def test_a_write_back_request_across_blocks_of_a_file_not_aligned_to_them_is_tied_whole():
    """A 1 KiB-block guest FS puts the file 1 KiB into a 4 KiB block of
    the virtual disk: 16 KiB writes at file offsets 0 and 16 KiB share a
    block, and one 32 KiB write-back request is tied whole, 16 KiB to
    each (before, 1 KiB of each went unattributed)."""
    t = dict(extent_maps=extents(guest=((0, 4 * MiB + 1024, 1 * MiB),)),
             vfs_events=[vfs(100, 10, off=0, req=16384, ret=16384, syscall=4),
                         vfs(200, 10, off=16384, req=16384, ret=16384, syscall=4)],
             block_events=request(5000, 5010, 6000, VDISK, 4 * MiB + 1024, 32768, rq=1, bio=11,
                                  op=1))
    s = session(**t)
    assert s.rows("SELECT kind, upper_id IS NULL AS unattributed, bytes FROM links "
                  "ORDER BY bytes") == [
        {"kind": "writeback", "unattributed": False, "bytes": 16384},
        {"kind": "writeback", "unattributed": False, "bytes": 16384}]


def test_write_back_of_a_store_through_a_mapping_is_put_down_to_the_store():
    """Four file pages written back in one virtual-disk write at 5000 ns.
    Page 0: a store through a mapping (a folio dirtied in a user page
    fault, aux 1) at 100.  Page 1: a write call at 200, then a store at
    300: the store's.  Page 2: a store at 100, then a write call at 400:
    the call's.  Page 3: dirtied by something else (aux 0): write-back of
    no known cause."""
    t = dict(vfs_events=[vfs(200, 10, off=4096, syscall=4), vfs(400, 10, off=8192, syscall=4)],
             pagecache_events=[pagecache(100, 0, 1, 7, aux=1), pagecache(300, 1, 1, 7, aux=1),
                               pagecache(100, 2, 1, 7, aux=1), pagecache(150, 3, 1, 7)],
             block_events=request(5000, 5010, 6000, VDISK, 4 * MiB, 16384, rq=1, bio=11, op=1))
    s = session(**t)
    later = s.rows("SELECT io_id FROM vfs_io WHERE ts_ns = 400")[0]["io_id"]
    assert s.rows("SELECT kind, upper_id, bytes, lag_ns FROM links ORDER BY kind, upper_id") == [
        {"kind": "store", "upper_id": None, "bytes": 8192, "lag_ns": 4700},
        {"kind": "writeback", "upper_id": later, "bytes": 4096, "lag_ns": 4590},
        {"kind": "writeback", "upper_id": None, "bytes": 4096, "lag_ns": None}]


def test_a_sync_write_nobody_asked_for_is_write_back_in_a_file_and_journal_elsewhere():
    """Two REQ_SYNC virtual-disk writes no write call explains (data an
    fsync wrote back, dirtied before the capture): one in the guest
    file's extent (4 MiB on), one outside every file (1 MiB)."""
    t = dict(block_events=request(100, 110, 200, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11, op=1,
                                  flags=1)
             + request(300, 310, 400, VDISK, 1 * MiB, 4096, rq=2, bio=12, op=1, flags=1))
    s = session(**t)
    assert s.rows("SELECT v.offset_bytes, l.kind, l.bytes FROM links l JOIN vdisk_io v "
                  "ON v.io_id = l.lower_id ORDER BY 1") == [
        {"offset_bytes": 1 * MiB, "kind": "journal", "bytes": 4096},
        {"offset_bytes": 4 * MiB + 8192, "kind": "writeback", "bytes": 4096}]


def test_a_sync_host_disk_write_nobody_asked_for_is_write_back_in_the_image_and_journal_elsewhere():
    """The same on the host disk: a REQ_SYNC write no virtual-disk request
    explains, of blocks the image holds (its pages dirtied before the
    capture, written back by a flusher for a sync: seen at a capture's
    start), is write-back; one outside the image (at 10 MiB) is the host
    FS's journal by its flags."""
    t = dict(block_events=request(100, 110, 200, DISK, 104 * MiB, 8192, rq=1, bio=11, op=1, flags=1)
             + request(300, 310, 400, DISK, 10 * MiB, 4096, rq=2, bio=12, op=1, flags=1))
    s = session(**t)
    assert s.rows("SELECT d.offset_bytes, l.kind, l.bytes, l.upper_id FROM links l JOIN disk_io d "
                  "ON d.io_id = l.lower_id ORDER BY 1") == [
        {"offset_bytes": 10 * MiB, "kind": "journal", "bytes": 4096, "upper_id": None},
        {"offset_bytes": 104 * MiB, "kind": "writeback", "bytes": 8192, "upper_id": None}]
