"""Diff tests of how unattributed requests are classed (journal,
metadata, other) and of read-modify-write: hand-built stacks, exact rows."""
from __future__ import annotations

import pytest
from rows import (
    CAP,
    DISK,
    GUEST,
    VDISK,
    capture_meta,
    device_map,
    extents,
    request,
    vfs,
)
from views_helpers import MiB, session

from nestrace.query.session import Session


def test_journal_write_nobody_asked_for_is_classified_by_its_flags():
    t = dict(block_events=request(10, 11, 20, DISK, 50 * MiB, 4096, rq=1, bio=1, op=1, flags=1 | 16 | 8))
    s = session(**t)
    assert s.rows("SELECT lower_level, kind, bytes FROM links") == [
        {"lower_level": "disk", "kind": "journal", "bytes": 4096}]


def test_journal_blocks_are_journal_by_the_flags_jbd2_and_the_xfs_log_write_them_with():
    # SYNC|META|IDLE: a journal block (a commit block whose FUA the flush
    # machinery took away too); META alone: metadata; SYNC alone: journal
    t = dict(block_events=request(10, 11, 20, DISK, 50 * MiB, 4096, rq=1, bio=1, op=1, flags=1 | 2 | 256)
             + request(30, 31, 40, DISK, 60 * MiB, 4096, rq=2, bio=2, op=1, flags=2)
             + request(50, 51, 60, DISK, 70 * MiB, 4096, rq=3, bio=3, op=1, flags=1 | 2)
             + request(70, 71, 80, DISK, 80 * MiB, 4096, rq=4, bio=4, op=1, flags=1 | 256))
    s = session(**t)
    got = s.rows("SELECT b.sector * 512 // MiB AS mib, l.kind FROM links l "
                 "JOIN block_requests b ON b.io_id = l.lower_id ORDER BY mib".replace("MiB", str(MiB)))
    assert got == [{"mib": 50, "kind": "journal"}, {"mib": 60, "kind": "metadata"},
                   {"mib": 70, "kind": "metadata"}, {"mib": 80, "kind": "journal"}]


def placed(role, dev, lo, length, ino=8):
    """An extent_maps row of a place on a disk (fs_journal, nestrace_store)."""
    return {"capture_id": CAP, "phase": "start", "role": role, "path": "", "dev": dev, "ino": ino,
            "logical_bytes": 0, "physical_bytes": lo, "length_bytes": length, "flags": 0,
            "physical_dev": dev}


def test_where_the_journal_is_known_its_writes_are_journal_by_place_and_the_rest_are_not():
    """The guest's journal at 1 MiB on the virtual disk (128 KiB) and the
    host's at 10 MiB on the disk, the store's file at 30 MiB on the disk:
    a REQ_SYNC write is journal inside the journal and write-back outside
    it (jbd2's checkpoint), a FUA|PREFLUSH one outside it write-back too,
    REQ_META metadata; a write into the store's file is nestrace's."""
    sync, meta, fua_flush = 1, 2, 8 | 16
    ev = (request(100, 110, 120, VDISK, 1 * MiB, 4096, rq=1, bio=1, op=1, flags=sync)
          + request(130, 140, 150, VDISK, 1 * MiB + 65536, 4096, rq=2, bio=2, op=1,
                    flags=sync | fua_flush)
          + request(160, 170, 180, VDISK, 2 * MiB, 4096, rq=3, bio=3, op=1, flags=sync)
          + request(190, 200, 210, VDISK, 3 * MiB, 4096, rq=4, bio=4, op=1, flags=sync | meta)
          + request(220, 230, 240, VDISK, 3 * MiB + 8192, 4096, rq=5, bio=5, op=1,
                    flags=sync | fua_flush)
          + request(250, 260, 270, DISK, 10 * MiB + 4096, 8192, rq=6, bio=6, op=1, flags=sync)
          + request(280, 290, 300, DISK, 20 * MiB, 4096, rq=7, bio=7, op=1, flags=sync)
          + request(310, 320, 330, DISK, 30 * MiB, 4096, rq=8, bio=8, op=1))
    ext = extents() + [placed("fs_journal", VDISK, 1 * MiB, 131072),
                       placed("fs_journal", DISK, 10 * MiB, 1 * MiB, ino=0),
                       placed("nestrace_store", DISK, 30 * MiB, 65536, ino=77)]
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": ext, "block_events": ev})
    got = s.rows("SELECT b.level, b.offset_bytes // 4096 AS blk, l.kind, l.bytes FROM links l "
                 "JOIN block_requests b ON b.io_id = l.lower_id ORDER BY b.level DESC, blk")
    assert got == [
        {"level": "vdisk", "blk": 256, "kind": "journal", "bytes": 4096},
        {"level": "vdisk", "blk": 272, "kind": "journal", "bytes": 4096},
        {"level": "vdisk", "blk": 512, "kind": "writeback", "bytes": 4096},
        {"level": "vdisk", "blk": 768, "kind": "metadata", "bytes": 4096},
        {"level": "vdisk", "blk": 770, "kind": "writeback", "bytes": 4096},
        {"level": "disk", "blk": 2561, "kind": "journal", "bytes": 8192},
        {"level": "disk", "blk": 5120, "kind": "writeback", "bytes": 4096},
        {"level": "disk", "blk": 7680, "kind": "nestrace", "bytes": 4096}]


def test_requests_outside_the_guest_file_systems_partition_are_classified_by_their_flags_alone():
    """The guest FS on a partition of the virtual disk, [1 MiB, 65 MiB),
    its journal known: another file system, on the next partition, writes
    with O_DIRECT (REQ_SYNC|REQ_IDLE): 'other', not the journal or
    write-back the guest's own writes would be; its metadata and
    readahead by their flags, a discard; the partition table's read
    (block 0) 'other'.  Inside the partition a write no call explains
    stays write-back.  A store that does not say the partition's size
    (size_sectors 0, written before) classifies as before."""
    sync_idle, meta, ra = 1 | 256, 2, 32
    ev = (request(100, 110, 120, VDISK, 80 * MiB, 4096, rq=1, bio=1, op=1, flags=sync_idle)
          + request(130, 140, 150, VDISK, 81 * MiB, 4096, rq=2, bio=2, op=1, flags=meta)
          + request(160, 170, 180, VDISK, 82 * MiB, 8192, rq=3, bio=3, op=0, flags=ra)
          + request(190, 200, 210, VDISK, 90 * MiB, 65536, rq=4, bio=4, op=3)
          + request(220, 230, 240, VDISK, 0, 4096, rq=5, bio=5, op=0)
          + request(250, 260, 270, VDISK, 6 * MiB, 4096, rq=6, bio=6, op=1, flags=sync_idle))
    ext = extents() + [placed("fs_journal", VDISK, 2 * MiB, 131072)]

    def kinds(size_sectors):
        dm = [r | ({"part_start_bytes": 1 * MiB, "size_sectors": size_sectors}
                   if r["level"] == "vfs" else {}) for r in device_map()]
        s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                                 "extent_maps": ext, "block_events": ev})
        return {r["mib"]: (r["kind"], r["bytes"]) for r in s.rows(
            f"SELECT b.offset_bytes // {MiB} AS mib, l.kind, l.bytes FROM links l "
            "JOIN block_requests b ON b.io_id = l.lower_id WHERE b.level = 'vdisk' "
            "AND l.upper_id IS NULL")}
    assert kinds(64 * MiB // 512) == {80: ("other", 4096), 81: ("metadata", 4096),
                                      82: ("readahead", 8192), 90: ("discard", 65536),
                                      0: ("other", 4096), 6: ("writeback", 4096)}
    assert kinds(0) == {80: ("writeback", 4096), 81: ("metadata", 4096),
                        82: ("readahead", 8192), 90: ("discard", 65536),
                        0: ("other", 4096), 6: ("writeback", 4096)}
    # report --json counts the requests wholly outside the partition
    from nestrace.report.document import build
    dm = [r | ({"part_start_bytes": 1 * MiB, "size_sectors": 64 * MiB // 512}
               if r["level"] == "vfs" else {}) for r in device_map()]
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                             "extent_maps": ext, "block_events": ev})
    assert build(s, CAP)["partitions"] == [
        {"level": "vdisk", "fs_level": "vfs", "part_start_bytes": 1 * MiB,
         "part_bytes": 64 * MiB, "outside_requests": 5,
         "outside_bytes": 4096 + 4096 + 8192 + 65536 + 4096}]


def test_two_guest_file_systems_of_one_virtual_disk_each_map_through_their_own_partition():
    """`record --stack A --stack B`: two guest file systems on partitions
    of one virtual disk, [1, 65) and [81, 97) MiB, the second with 1 KiB
    blocks, each with a file of inode 12 (each file system numbers its
    own).  A 4 KiB write in the first and a 1 KiB write in the second are
    each tied to their own call, through their own partition's start (the
    second's is aligned to its block: no partial write); a write in the
    second's partition no call explains is write-back, one between the
    partitions (another file system's, not traced) 'other', as is the
    partition table's read.  The report counts the requests outside both
    partitions on each row."""
    g2, sync_idle = GUEST + 100, 1 | 256
    dm = device_map()
    dm = [r | ({"part_start_bytes": 1 * MiB, "size_sectors": 64 * MiB // 512}
               if r["level"] == "vfs" else {}) for r in dm]
    dm += [r | {"dev": g2, "name": "/g2", "block_size_bytes": 1024, "part_start_bytes": 81 * MiB,
                "size_sectors": 16 * MiB // 512} for r in dm if r["level"] == "vfs"]
    ext = extents() + [r | {"dev": g2, "physical_bytes": 2 * MiB}
                       for r in extents() if r["role"] == "guest_file"]
    ext += [placed("fs_journal", VDISK, 2 * MiB, 131072)]
    ev = (request(1100, 1110, 1400, VDISK, 5 * MiB, 4096, rq=1, bio=1, op=1, flags=sync_idle)
          + request(2100, 2110, 2400, VDISK, 83 * MiB, 1024, rq=2, bio=2, op=1, flags=sync_idle)
          + request(3000, 3010, 3020, VDISK, 85 * MiB, 4096, rq=3, bio=3, op=1, flags=sync_idle)
          + request(3100, 3110, 3120, VDISK, 70 * MiB, 4096, rq=4, bio=4, op=1, flags=sync_idle)
          + request(3200, 3210, 3220, VDISK, 0, 4096, rq=5, bio=5, op=0))
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                             "extent_maps": ext, "block_events": ev,
                             "vfs_events": [vfs(1000, 500, syscall=4, f_flags=0o40000),
                                            vfs(2000, 500, req=1024, ret=1024, syscall=4,
                                                f_flags=0o40000, dev=g2)]})
    assert s.rows(f"SELECT b.offset_bytes // {MiB} AS mib, l.kind, l.bytes, v.dev "
                  "FROM links l JOIN block_requests b ON b.io_id = l.lower_id "
                  "LEFT JOIN vfs_io v ON v.io_id = l.upper_id WHERE b.level = 'vdisk' "
                  "ORDER BY 1") == [
        {"mib": 0, "kind": "other", "bytes": 4096, "dev": None},
        {"mib": 5, "kind": "sync", "bytes": 4096, "dev": GUEST},
        {"mib": 70, "kind": "other", "bytes": 4096, "dev": None},
        {"mib": 83, "kind": "sync", "bytes": 1024, "dev": g2},
        {"mib": 85, "kind": "writeback", "bytes": 4096, "dev": None}]
    assert s.rows("SELECT hop, partial_writes FROM rmw_summary WHERE hop = 'guest'") == []
    from nestrace.report.document import build
    assert build(s, CAP)["partitions"] == [
        {"level": "vdisk", "fs_level": "vfs", "part_start_bytes": lo * MiB, "part_bytes": n * MiB,
         "outside_requests": 2, "outside_bytes": 8192} for lo, n in ((1, 64), (81, 16))]


def test_requests_outside_the_host_file_systems_partition_are_classified_by_their_flags_alone():
    """The same on the host disk: the host FS on [2 MiB, 202 MiB) of it,
    its journal known, the image at 100 MiB; the host's root FS on the
    next partition writes with O_DIRECT: 'other', not write-back; its
    metadata by its flag; inside the partition, write-back.  A host FS on
    two disks (btrfs RAID: one partition size said for both) classifies
    as before."""
    sync_idle, meta = 1 | 256, 2
    ev = (request(100, 110, 120, DISK, 300 * MiB, 4096, rq=1, bio=1, op=1, flags=sync_idle)
          + request(130, 140, 150, DISK, 301 * MiB, 4096, rq=2, bio=2, op=1, flags=meta)
          + request(160, 170, 180, DISK, 20 * MiB, 4096, rq=3, bio=3, op=1, flags=sync_idle))
    ext = extents() + [placed("fs_journal", DISK, 10 * MiB, 1 * MiB, ino=0)]

    def kinds(disks):
        dm = [r | ({"part_start_bytes": 2 * MiB, "size_sectors": 200 * MiB // 512}
                   if r["level"] == "hostfs" else {}) for r in device_map()]
        dm += [r | {"dev": DISK + 1, "name": "loop9"} for r in dm if r["level"] == "disk"][:disks - 1]
        s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                                 "extent_maps": ext, "block_events": ev})
        return {r["mib"]: r["kind"] for r in s.rows(
            f"SELECT b.offset_bytes // {MiB} AS mib, l.kind FROM links l "
            "JOIN block_requests b ON b.io_id = l.lower_id WHERE b.level = 'disk'")}
    assert kinds(1) == {300: "other", 301: "metadata", 20: "writeback"}
    assert kinds(2) == {300: "writeback", 301: "metadata", 20: "writeback"}


def test_a_host_disk_write_into_another_vms_image_is_other_not_write_back():
    """The host's journal known (at 10 MiB), another virtual disk's image
    on the host FS at 300 MiB (extent_maps role neighbor_image): a REQ_SYNC
    write there that no traced request explains is another VM's, 'other';
    one elsewhere outside the journal stays write-back (jbd2's checkpoint)."""
    sync_idle = 1 | 256
    ev = (request(100, 110, 120, DISK, 300 * MiB + 8192, 4096, rq=1, bio=1, op=1, flags=sync_idle)
          + request(130, 140, 150, DISK, 400 * MiB, 4096, rq=2, bio=2, op=1, flags=sync_idle))
    ext = extents() + [placed("fs_journal", DISK, 10 * MiB, 1 * MiB, ino=0),
                       placed("neighbor_image", DISK, 300 * MiB, 16 * MiB, ino=140)]
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": ext, "block_events": ev})
    assert s.rows(f"SELECT b.offset_bytes // {MiB} AS mib, l.kind, l.bytes FROM links l "
                  "JOIN block_requests b ON b.io_id = l.lower_id ORDER BY 1") == [
        {"mib": 300, "kind": "other", "bytes": 4096},
        {"mib": 400, "kind": "writeback", "bytes": 4096}]


def test_unaligned_guest_write_through_host_page_cache_is_read_modify_write():
    # a 512 B virtual-disk write into the middle of a host page, and the
    # host reading that page from disk while the write is in flight
    t = dict(block_events=request(100, 110, 500, VDISK, 4 * MiB + 512, 512, rq=1, bio=11, op=1)
             + request(150, 160, 300, DISK, 104 * MiB, 4096, rq=2, bio=12, op=0))
    s = session(**t)
    assert s.rows("SELECT hop, partial_writes, rmw_writes, reads, read_bytes, write_bytes, "
                  "extra_ns FROM rmw_summary") == [
        {"hop": "host", "partial_writes": 1, "rmw_writes": 1, "reads": 1, "read_bytes": 4096,
         "write_bytes": 512, "extra_ns": 150}]
    assert s.rows("SELECT kind FROM links WHERE lower_level = 'disk'") == [{"kind": "rmw"}]


def test_rmw_read_of_where_a_copy_on_write_host_had_the_block_before_it_moved():
    # the image's first 64 MiB were at host-disk 100 MiB at the start; the
    # write moved the page of image offset 4 MiB to 300 MiB (end snapshot).
    # The host reads the page's old place while the 512 B write is out.
    ext = extents(image=((0, 100 * MiB, 4 * MiB), (4 * MiB, 304 * MiB, 4096),
                         (4 * MiB + 4096, 104 * MiB + 4096, 60 * MiB - 4096)))
    ext += [r | {"phase": "start"} for r in extents(image=((0, 100 * MiB, 64 * MiB),))
            if r["role"] == "image"]
    t = dict(extent_maps=ext,
             block_events=request(100, 110, 500, VDISK, 4 * MiB + 512, 512, rq=1, bio=11, op=1)
             + request(150, 160, 300, DISK, 104 * MiB, 4096, rq=2, bio=12, op=0)
             + request(600, 610, 700, DISK, 304 * MiB, 4096, rq=3, bio=13, op=1))
    s = session(**t)
    assert s.rows("SELECT hop, rmw_writes, reads, read_bytes FROM rmw_summary") == [
        {"hop": "host", "rmw_writes": 1, "reads": 1, "read_bytes": 4096}]
    assert s.rows("SELECT disk_offset_bytes // 1048576 AS mib, image_offset_bytes, bytes "
                  "FROM map_disk ORDER BY 1") == [
        {"mib": 104, "image_offset_bytes": 4 * MiB, "bytes": 4096},
        {"mib": 304, "image_offset_bytes": 4 * MiB, "bytes": 4096}]
    got = s.rows("SELECT l.kind, l.upper_id IS NOT NULL AS tied, l.bytes, b.op FROM links l "
                 "JOIN block_requests b ON b.io_id = l.lower_id WHERE l.lower_level = 'disk' "
                 "ORDER BY b.d_ns, l.bytes")
    # (the page the 512 B write dirtied is written back whole, to its new
    # place: a host FS of 4 KiB blocks, the whole block is the write's)
    assert got == [{"kind": "rmw", "tied": True, "bytes": 4096, "op": "read"},
                   {"kind": "writeback", "tied": True, "bytes": 4096, "op": "write"}]


@pytest.mark.parametrize("n", [20, 60])   # (a plain join up to 32 rows of b a key, else ASOF)
def test_overlaps_finds_every_overlapping_range_also_past_a_long_one(n):
    # b: under key 1 a long range, ranges nested in it, a copy of one, and
    # one far off; under key 2 one range.  Every pair is checked against
    # comparing each a with each b.
    b = [(1, 0, 10 * n)] + [(1, 10 * i, 10 * i + 5) for i in range(1, n)] + [(1, 20, 25)]
    b += [(1, 50 * n, 50 * n + 7), (2, 3, 9)]
    a = [(1, 12, 13), (1, 14, 16), (1, 15, 31), (1, 10 * n - 1, 10 * n + 1), (1, 10 * n, 50 * n),
         (1, -5, 0), (1, 50 * n + 6, 50 * n + 9), (2, 0, 4), (2, 9, 10), (3, 0, 100)]
    rows = lambda t: ", ".join(f"('c', {k}::UBIGINT, 0::UBIGINT, {lo}::BIGINT, {hi}::BIGINT, {i})"
                               for i, (k, lo, hi) in enumerate(t))
    s = session()
    got = s.rows(f"""WITH a AS (SELECT * FROM (VALUES {rows(a)}) t(k0, k1, k2, lo, hi, ai)),
                          b AS (SELECT * FROM (VALUES {rows(b)}) t(k0, k1, k2, lo, hi, bi))
                     SELECT ai, o.bi AS bi FROM _overlaps('a', 'b') ORDER BY 1, 2""")
    want = [{"ai": i, "bi": j} for i, (k, lo, hi) in enumerate(a)
            for j, (kb, blo, bhi) in enumerate(b) if k == kb and blo < hi and lo < bhi]
    assert got == want
    assert {r["ai"] for r in got} == {0, 1, 2, 3, 6, 7}
    # keep: the rows of a that overlap nothing too, once each, with no b
    got = s.rows(f"""WITH a AS (SELECT * FROM (VALUES {rows(a)}) t(k0, k1, k2, lo, hi, ai)),
                          b AS (SELECT * FROM (VALUES {rows(b)}) t(k0, k1, k2, lo, hi, bi))
                     SELECT ai, o.bi AS bi FROM _overlaps('a', 'b', keep := true)
                     ORDER BY 1, 2""")
    assert got == sorted(want + [{"ai": i, "bi": None} for i in (4, 5, 8, 9)],
                         key=lambda r: (r["ai"], r["bi"] if r["bi"] is not None else 1 << 30))


def test_a_fragmented_image_that_moved_maps_each_piece_where_it_is_and_was():
    """An image in 64 extents of 64 KiB laid out backwards on the host
    disk (more than a plain join is used for), which were all at 300 MiB
    at the start (a copy-on-write host moved them).  A read across two
    extents is cut in two, each at its place; a host-disk read at a new
    place and one at an old place both find their image bytes."""
    k = 65536
    img = [(4 * MiB + i * k, 100 * MiB + (63 - i) * k, k) for i in range(64)]
    ext = extents(image=img)
    ext += [r | {"phase": "start"} for r in extents(image=((4 * MiB, 300 * MiB, 4 * MiB),))
            if r["role"] == "image"]
    t = dict(extent_maps=ext, vfs_events=[vfs(100, 900, off=k - 2048, f_flags=0o40000)],
             block_events=request(200, 210, 900, VDISK, 4 * MiB + k - 2048, 4096, rq=1, bio=11)
             + request(300, 310, 800, DISK, 100 * MiB + 58 * k, 4096, rq=2, bio=12)
             + request(320, 330, 820, DISK, 300 * MiB + 7 * k, 4096, rq=3, bio=13))
    s = session(**t)
    pieces = [{"image_offset_bytes": 4 * MiB + k - 2048, "bytes": 2048,
               "disk_offset_bytes": 100 * MiB + 63 * k + k - 2048},
              {"image_offset_bytes": 4 * MiB + k, "bytes": 2048,
               "disk_offset_bytes": 100 * MiB + 62 * k}]
    assert s.rows("SELECT image_offset_bytes, bytes, disk_offset_bytes FROM map_vfs "
                  "ORDER BY 1") == pieces
    assert s.rows("SELECT image_offset_bytes, bytes, disk_offset_bytes FROM map_vdisk "
                  "ORDER BY 1") == pieces
    assert s.rows("SELECT disk_offset_bytes, image_offset_bytes, bytes FROM map_disk "
                  "ORDER BY 1") == [
        {"disk_offset_bytes": 100 * MiB + 58 * k, "image_offset_bytes": 4 * MiB + 5 * k,
         "bytes": 4096},
        {"disk_offset_bytes": 300 * MiB + 7 * k, "image_offset_bytes": 4 * MiB + 7 * k,
         "bytes": 4096}]
    assert s.rows("SELECT count(*) AS n, sum(hi - lo) AS b FROM _map_image_moved") == [
        {"n": 64, "b": 4 * MiB}]


def test_a_host_on_two_disks_maps_each_request_through_its_own_disk():
    """A mirrored btrfs host: the image's bytes are at 100 MiB on one disk
    and at 200 MiB on the other.  A write reaches both copies; a write at
    the second disk's 104 MiB is not the image's (on the first disk it
    would be), and must not be tied to it."""
    disk2 = DISK + 2
    dm = device_map() + [r | {"dev": disk2, "name": "loop9"}
                         for r in device_map() if r["level"] == "disk"]
    ext = [r | {"physical_dev": VDISK} for r in extents() if r["role"] == "guest_file"]
    img = [r for r in extents() if r["role"] == "image"]
    ext += [r | {"physical_dev": DISK} for r in img]
    ext += [r | {"physical_dev": disk2, "physical_bytes": 200 * MiB} for r in img]
    t = dict(device_map=dm, extent_maps=ext,
             block_events=request(100, 110, 200, VDISK, 4 * MiB, 4096, rq=1, bio=11, op=1)
             + request(300, 310, 400, DISK, 104 * MiB, 4096, rq=2, bio=12, op=1)
             + request(300, 311, 401, disk2, 204 * MiB, 4096, rq=3, bio=13, op=1)
             + request(500, 510, 600, disk2, 104 * MiB, 4096, rq=4, bio=14, op=1))
    s = session(**t)
    assert s.rows("SELECT disk_dev, disk_offset_bytes // 1048576 AS mib, bytes FROM map_vdisk "
                  "ORDER BY 1") == [{"disk_dev": DISK, "mib": 104, "bytes": 4096},
                                    {"disk_dev": disk2, "mib": 204, "bytes": 4096}]
    assert s.rows("SELECT b.dev, m.disk_offset_bytes // 1048576 AS mib, m.image_offset_bytes "
                  "FROM map_disk m JOIN block_requests b USING (io_id) ORDER BY 1") == [
        {"dev": DISK, "mib": 104, "image_offset_bytes": 4 * MiB},
        {"dev": disk2, "mib": 204, "image_offset_bytes": 4 * MiB}]
    got = s.rows("SELECT b.dev, b.offset_bytes // 1048576 AS mib, l.kind, l.upper_id IS NOT NULL "
                 "AS tied, l.bytes FROM links l JOIN block_requests b ON b.io_id = l.lower_id "
                 "WHERE l.lower_level = 'disk' ORDER BY b.d_ns")
    assert got == [{"dev": DISK, "mib": 104, "kind": "writeback", "tied": True, "bytes": 4096},
                   {"dev": disk2, "mib": 204, "kind": "writeback", "tied": True, "bytes": 4096},
                   {"dev": disk2, "mib": 104, "kind": "writeback", "tied": False, "bytes": 4096}]
    assert s.rows("SELECT requests, bytes FROM amplification "
                  "WHERE level = 'disk' AND op = 'write'") == [{"requests": 3, "bytes": 3 * 4096}]


def test_unaligned_app_write_reads_the_guest_block():
    t = dict(vfs_events=[vfs(100, 800, off=1024, req=512, ret=512, syscall=4)],
             block_events=request(200, 210, 400, VDISK, 4 * MiB, 4096, rq=1, bio=11))
    s = session(**t)
    assert s.rows("SELECT hop, partial_writes, reads, read_bytes FROM rmw_summary") == [
        {"hop": "guest", "partial_writes": 1, "reads": 1, "read_bytes": 4096}]


def test_an_overlays_unaligned_write_is_one_rmw_and_its_file_system_one_partition():
    """A container's root: an overlay whose layers are on the guest FS, a
    vfs row of its own (backing_dev: the guest FS) whose file's extents
    are the layer file's.  Its row is no second file system on the disk."""
    ovl = (0 << 20) | 40
    dm = device_map()
    dm[0] |= {"size_sectors": 1 << 19, "part_start_bytes": 0}   # (on a partition of the disk)
    dm.append(dm[0] | {"dev": ovl, "name": "/c", "fs_type": "overlay", "backing_dev": GUEST})
    ext = [r | {"dev": ovl} if r["role"] == "guest_file" else r for r in extents()]
    t = dict(vfs_events=[vfs(100, 800, off=1024, req=512, ret=512, syscall=4, dev=ovl)],
             block_events=request(200, 210, 400, VDISK, 4 * MiB, 4096, rq=1, bio=11))
    s = session(**t, device_map=dm, extent_maps=ext)
    assert s.rows("SELECT hop, partial_writes, reads, read_bytes FROM rmw_summary") == [
        {"hop": "guest", "partial_writes": 1, "reads": 1, "read_bytes": 4096}]
    assert s.rows("SELECT level, fs_level, lo, hi FROM _base_fs_partitions") == [
        {"level": "vdisk", "fs_level": "vfs", "lo": 0, "hi": 1 << 28}]


def test_rmw_pairs_reads_with_writes_in_flight_over_many_milliseconds():
    """Writes and reads are paired within ~1 ms spans of time: a write in
    flight for 5 ms is paired with a read in its fourth millisecond, one
    that crosses a span boundary with a read just past it, and neither
    with a read after it ended.  Both hops."""
    ms = 1 << 20   # (a span)
    ev = [vfs(100, 5 * ms, off=1024, req=512, ret=512, syscall=4),            # guest block 0
          vfs(2 * ms - 10, 20, off=8192 + 1024, req=512, ret=512, syscall=4)]  # block 2
    blk = (request(3 * ms + 5, 3 * ms + 6, 3 * ms + 99, VDISK, 4 * MiB, 4096, rq=1, bio=1)
           + request(2 * ms + 5, 2 * ms + 6, 2 * ms + 9, VDISK, 4 * MiB + 8192, 4096, rq=2, bio=2)
           + request(6 * ms, 6 * ms + 1, 6 * ms + 9, VDISK, 4 * MiB, 4096, rq=3, bio=3)
           # host hop: a 512 B vdisk write in flight 4 ms, the host page read in it and after
           + request(10 * ms, 10 * ms + 1, 14 * ms, VDISK, 8 * MiB + 512, 512, rq=4, bio=4, op=1)
           + request(13 * ms, 13 * ms + 1, 13 * ms + 50, DISK, 108 * MiB, 4096, rq=5, bio=5)
           + request(15 * ms, 15 * ms + 1, 15 * ms + 50, DISK, 108 * MiB, 4096, rq=6, bio=6))
    s = session(vfs_events=ev, block_events=blk)
    assert s.rows("SELECT hop, partial_writes, rmw_writes, reads, read_bytes FROM rmw_summary "
                  "ORDER BY hop") == [
        {"hop": "guest", "partial_writes": 2, "rmw_writes": 2, "reads": 2, "read_bytes": 8192},
        {"hop": "host", "partial_writes": 1, "rmw_writes": 1, "reads": 1, "read_bytes": 4096}]


def test_aligned_write_is_no_rmw():
    t = dict(vfs_events=[vfs(100, 800, off=4096, syscall=4)],
             block_events=request(200, 210, 400, VDISK, 4 * MiB, 4096, rq=1, bio=11))
    s = session(**t)
    assert s.rows("SELECT count(*) AS n FROM rmw") == [{"n": 0}]
