"""Diff tests of bytes moved, freed and discarded during a capture, and of
compare: hand-built stacks, exact rows."""
from __future__ import annotations

import re

import pytest
from rows import (
    DISK,
    GUEST,
    HOSTFS,
    VDISK,
    capture_meta,
    device_map,
    extents,
    hostfs,
    request,
    vfs,
)
from views_helpers import MiB, direct_read_stack, session


def test_writeback_is_tied_to_the_write_even_when_a_read_of_the_range_came_between():
    # write (buffered), read back from the page cache, then the writeback
    t = dict(vfs_events=[vfs(100, 10, off=0, syscall=4), vfs(200, 5, off=0, syscall=3)],
             block_events=request(5000, 5010, 6000, VDISK, 4 * MiB, 4096, rq=1, bio=11, op=1))
    s = session(**t)
    writes = s.rows("SELECT io_id FROM vfs_io WHERE op = 'write'")
    assert s.rows("SELECT upper_id, kind, bytes, lag_ns FROM links") == [
        {"upper_id": writes[0]["io_id"], "kind": "writeback", "bytes": 4096, "lag_ns": 4890}]


def test_a_read_is_tied_to_the_read_waiting_for_it_not_to_a_later_write_of_the_block():
    # app read 100..1000 in flight; an app write of the same block starts at
    # 150 (also in flight); the virtual-disk read at 200 serves the read
    t = dict(vfs_events=[vfs(100, 900, off=0), vfs(150, 900, off=0, syscall=4)],
             block_events=request(200, 210, 800, VDISK, 4 * MiB, 4096, rq=1, bio=11))
    s = session(**t)
    reads = s.rows("SELECT io_id FROM vfs_io WHERE op = 'read'")
    assert s.rows("SELECT upper_id, kind, bytes FROM links") == [
        {"upper_id": reads[0]["io_id"], "kind": "sync", "bytes": 4096}]


def test_a_discard_punched_into_the_image_is_tied_to_the_virtual_disk_discard():
    """A guest discard (fstrim: no file call) is unattributed, of its own
    kind; the hole the loop device punches for it in the image is tied to
    it.  32 MiB is 8192 blocks a side: planned as a nested loop (the
    planner sees 2 requests), links took seconds; the ASOF join is kept.
    No join of the plan is a nested loop: DuckDB 2.0.1 made one of the
    range join of unattributed blocks to guest-file extents."""
    t = dict(block_events=request(100, 110, 900, VDISK, 8 * MiB, 32 * MiB, rq=1, bio=11, op=3),
             hostfs_events=[hostfs(200, 8 * MiB, 32 * MiB, source=9, op=3)])
    s = session(**t)
    vd = s.rows("SELECT io_id FROM vdisk_io")[0]["io_id"]
    got = s.rows("SELECT lower_level, upper_id, kind, bytes FROM links ORDER BY lower_level")
    assert got == [{"lower_level": "hostfs", "upper_id": vd, "kind": "sync", "bytes": 32 * MiB},
                   {"lower_level": "vdisk", "upper_id": None, "kind": "discard", "bytes": 32 * MiB}]
    plan = s.con.execute("EXPLAIN (FORMAT json) SELECT * FROM _links_blocks").fetchall()[0][1]
    joins = set(re.findall(r'"name": "([A-Z_]*JOIN)"', plan))
    assert "ASOF_JOIN" in joins and "NESTED_LOOP_JOIN" not in joins, joins


def test_a_write_zeroes_made_into_a_hole_or_a_zeroed_range_is_tied_to_its_virtual_disk_request():
    """A write-zeroes request (REQ_OP_WRITE_ZEROES, op write at the block
    level) that the loop device makes a hole punched in the image (ext4's
    punch_hole, 10) or a range zeroed (ext4's zero_range, 11) is tied to
    its virtual-disk request, like a discard; a hypervisor writing the
    zeroes instead is tied as a write.  A host-FS discard before the
    request started is not."""
    t = dict(device_map=device_map(host_fs="ext4"),
             block_events=request(100, 110, 900, VDISK, 8 * MiB, 1 * MiB, rq=1, bio=11, op=9)
             + request(1000, 1010, 1900, VDISK, 12 * MiB, 8192, rq=2, bio=12, op=9),
             hostfs_events=[hostfs(200, 8 * MiB, 512 * 1024, source=10, op=3),
                            hostfs(300, 8 * MiB + 512 * 1024, 512 * 1024, source=11, op=3),
                            hostfs(1100, 12 * MiB, 4096, source=5, op=1, flags=1),
                            hostfs(1200, 12 * MiB + 4096, 4096, source=10, op=3),
                            hostfs(50, 16 * MiB, 4096, source=10, op=3)])
    s = session(**t)
    vd = {r["offset_bytes"]: r["io_id"] for r in s.rows("SELECT offset_bytes, io_id FROM vdisk_io")}
    assert s.rows("SELECT DISTINCT op FROM vdisk_io") == [{"op": "write"}]
    got = s.rows("SELECT h.offset_bytes, h.source, l.upper_id, l.kind, l.bytes FROM links l "
                 "JOIN hostfs_io h ON h.io_id = l.lower_id WHERE l.lower_level = 'hostfs' "
                 "ORDER BY h.offset_bytes")
    assert got == [
        {"offset_bytes": 8 * MiB, "source": "ext4_punch_hole", "upper_id": vd[8 * MiB],
         "kind": "sync", "bytes": 512 * 1024},
        {"offset_bytes": 8 * MiB + 512 * 1024, "source": "ext4_zero_range", "upper_id": vd[8 * MiB],
         "kind": "sync", "bytes": 512 * 1024},
        {"offset_bytes": 12 * MiB, "source": "iomap_dio_rw_begin", "upper_id": vd[12 * MiB],
         "kind": "sync", "bytes": 4096},
        {"offset_bytes": 12 * MiB + 4096, "source": "ext4_punch_hole", "upper_id": vd[12 * MiB],
         "kind": "sync", "bytes": 4096},
        {"offset_bytes": 16 * MiB, "source": "ext4_punch_hole", "upper_id": None,
         "kind": "discard", "bytes": 4096}]


def punched_holes_discarded_on_the_host_disk():
    """The image's blocks were at host-disk 100 MiB (image 0-64 MiB) and
    300 MiB (image 64-65 MiB) at the start; at the end image 8-9 MiB,
    63-64 MiB and 64-65 MiB are holes: a virtual-disk discard punched the
    first, write-zeroes the others; the host disk sees discards of the old
    places (one before any request, one of blocks still in the image)."""
    ext = extents(image=((0, 100 * MiB, 8 * MiB), (9 * MiB, 109 * MiB, 54 * MiB)))
    ext += [r | {"phase": "start"} for r in extents(image=((0, 100 * MiB, 64 * MiB),
                                                          (64 * MiB, 300 * MiB, 1 * MiB)))
            if r["role"] == "image"]
    return dict(device_map=device_map(host_fs="ext4"), extent_maps=ext,
                block_events=request(50, 51, 60, DISK, 108 * MiB, 4096, rq=9, bio=19, op=3)
                + request(100, 110, 900, VDISK, 8 * MiB, 1 * MiB, rq=1, bio=11, op=3)
                + request(2000, 2010, 2100, DISK, 108 * MiB, 1 * MiB, rq=2, bio=12, op=3)
                + request(3000, 3010, 3500, VDISK, 63 * MiB, 1 * MiB, rq=3, bio=13, op=9)
                + request(3100, 3110, 3200, DISK, 163 * MiB, 1 * MiB, rq=4, bio=14, op=3)
                + request(4000, 4010, 4500, VDISK, 64 * MiB, 1 * MiB, rq=5, bio=15, op=9)
                + request(5000, 5010, 5100, DISK, 300 * MiB, 1 * MiB, rq=6, bio=16, op=3)
                + request(6000, 6010, 6100, DISK, 120 * MiB, 1 * MiB, rq=7, bio=17, op=3),
                hostfs_events=[hostfs(200, 8 * MiB, 1 * MiB, source=10, op=3),
                               hostfs(3200, 63 * MiB, 1 * MiB, source=10, op=3),
                               hostfs(4100, 64 * MiB, 1 * MiB, source=10, op=3)])


def test_a_host_disk_discard_of_blocks_a_punched_hole_freed_is_tied_to_the_virtual_disk_request():
    """A host FS with online discard discards, at its commit, the blocks a
    hole punched in the image freed.  The image's blocks were at host-disk
    100 MiB (image 0-64 MiB) and 300 MiB (image 64-65 MiB) at the start; at
    the end image 8-9 MiB, 63-64 MiB and 64-65 MiB are holes.  The host-disk
    discards of those old places are tied to the virtual-disk discard or
    write-zeroes that punched them: kind discard after it ended (lag from
    its end), sync while it was in flight.  A discard of the old place
    before the request started, and one of blocks still in the image, are
    not; a write-zeroes nobody above explains is kind zeroes."""
    s = session(**punched_holes_discarded_on_the_host_disk())
    assert s.rows("SELECT lo // 1048576 AS lo, hi // 1048576 AS hi, (lo + delta) // 1048576 AS disk "
                  "FROM _map_image_moved ORDER BY lo") == [
        {"lo": 8, "hi": 9, "disk": 108}, {"lo": 63, "hi": 64, "disk": 163},
        {"lo": 64, "hi": 65, "disk": 300}]
    vd = {r["offset_bytes"] // MiB: r["io_id"]
          for r in s.rows("SELECT offset_bytes, io_id FROM vdisk_io")}
    got = s.rows("SELECT d.offset_bytes // 1048576 AS mib, d.start_ns, l.upper_id, l.kind, "
                 "l.bytes, l.lag_ns FROM links l JOIN disk_io d ON d.io_id = l.lower_id "
                 "WHERE l.lower_level = 'disk' ORDER BY d.start_ns")
    assert got == [
        {"mib": 108, "start_ns": 50, "upper_id": None, "kind": "discard", "bytes": 4096,
         "lag_ns": None},
        {"mib": 108, "start_ns": 2000, "upper_id": vd[8], "kind": "discard", "bytes": MiB,
         "lag_ns": 2000 - 900},
        {"mib": 163, "start_ns": 3100, "upper_id": vd[63], "kind": "sync", "bytes": MiB,
         "lag_ns": 100},
        {"mib": 300, "start_ns": 5000, "upper_id": vd[64], "kind": "discard", "bytes": MiB,
         "lag_ns": 500},
        {"mib": 120, "start_ns": 6000, "upper_id": None, "kind": "discard", "bytes": MiB,
         "lag_ns": None}]
    assert s.rows("SELECT d.offset_bytes // 1048576 AS mib, m.image_offset_bytes // 1048576 AS "
                  "image_mib FROM map_disk m JOIN disk_io d USING (io_id) ORDER BY d.start_ns") == [
        {"mib": 108, "image_mib": 8}, {"mib": 108, "image_mib": 8}, {"mib": 163, "image_mib": 63},
        {"mib": 300, "image_mib": 64}, {"mib": 120, "image_mib": 20}]
    assert s.rows("SELECT v.offset_bytes // 1048576 AS mib, l.kind FROM links l "
                  "JOIN vdisk_io v ON v.io_id = l.lower_id WHERE l.lower_level = 'vdisk' "
                  "ORDER BY 1") == [{"mib": 8, "kind": "discard"}, {"mib": 63, "kind": "zeroes"},
                                    {"mib": 64, "kind": "zeroes"}]


def test_a_read_of_bytes_the_file_loses_later_maps_through_the_start_snapshot():
    """A 1 MiB guest file (at virtual-disk 4 MiB) cut to 512 KiB at 1000 ns:
    the end snapshot has only its first half.  A pread of 4 KiB at 768 KiB
    before that, and the virtual-disk read it waited for, are still tied
    (kind sync), through where the start snapshot had the bytes."""
    ext = extents(guest=((0, 4 * MiB, MiB // 2),))
    ext += [r | {"phase": "start"} for r in extents()]
    t = dict(extent_maps=ext,
             vfs_events=[vfs(100, 300, off=3 * MiB // 4), vfs(1000, 50, off=MiB // 2, req=MiB,
                                                              ret=0, syscall=32)],
             block_events=request(150, 160, 350, VDISK, 4 * MiB + 3 * MiB // 4, 4096, rq=1, bio=11))
    s = session(**t)
    read = s.rows("SELECT io_id FROM vfs_io WHERE syscall = 'pread64'")[0]["io_id"]
    assert s.rows("SELECT upper_id, kind, bytes FROM links WHERE lower_level = 'vdisk'") == [
        {"upper_id": read, "kind": "sync", "bytes": 4096}]


def test_bytes_allocated_and_freed_during_the_capture_map_through_the_mapping_events():
    """A guest file of 512 KiB at virtual-disk 4 MiB at start and at end
    grew during the capture: its mapping events put file bytes [512K, 1M)
    at virtual-disk 20 MiB; it was cut back to 512 KiB at 1000 ns.  A
    direct pwrite of 64 KiB at 512K before that, and the virtual-disk write
    it waited for at 20 MiB, are tied (kind sync), through the mapping
    events.  A mapping event of bytes the start snapshot has at the same
    place (an unwritten extent written) maps nothing twice."""
    from rows import _hdr
    ext = extents(guest=((0, 4 * MiB, MiB // 2),))
    ext += [r | {"phase": "start"} for r in ext]
    grown = _hdr(5, 50) | {"ino": 12, "file_offset_bytes": MiB // 2, "disk_bytes": 20 * MiB,
                           "length_bytes": MiB // 2, "dev": GUEST, "map_type": 2, "source": 3,
                           "flags": 48}
    written = grown | _hdr(5, 60) | {"file_offset_bytes": 0, "disk_bytes": 4 * MiB,
                                     "length_bytes": 65536}
    t = dict(extent_maps=ext, mapping_events=[grown, written],
             vfs_events=[vfs(100, 300, off=MiB // 2, req=65536, ret=65536, syscall=4,
                             f_flags=16384),
                         vfs(500, 50, off=0, req=4096, ret=4096, syscall=3),
                         vfs(1000, 50, off=MiB // 2, req=MiB, ret=0, syscall=32)],
             block_events=request(150, 160, 350, VDISK, 20 * MiB, 65536, rq=1, bio=11, op=1)
             + request(510, 520, 540, VDISK, 4 * MiB, 4096, rq=2, bio=12))
    s = session(**t)
    calls = {r["syscall"]: r["io_id"] for r in s.rows("SELECT io_id, syscall FROM vfs_io")}
    got = s.rows("SELECT upper_id, kind, bytes FROM links WHERE lower_level = 'vdisk' "
                 "ORDER BY upper_id")
    assert got == sorted([{"upper_id": calls["pwrite64"], "kind": "sync", "bytes": 65536},
                          {"upper_id": calls["pread64"], "kind": "sync", "bytes": 4096}],
                         key=lambda r: r["upper_id"]), got
    assert s.rows("SELECT vdisk_offset_bytes, bytes FROM map_vfs WHERE io_id = ?",
                  [calls["pread64"]]) == [{"vdisk_offset_bytes": 4 * MiB, "bytes": 4096}]
    # the call that freed them is carried there too: the 512 KiB cut off
    assert s.rows("SELECT vdisk_offset_bytes, bytes FROM map_vfs WHERE io_id = ?",
                  [calls["ftruncate"]]) == [{"vdisk_offset_bytes": 20 * MiB, "bytes": MiB // 2}]


def test_a_metadata_write_to_a_block_a_file_gets_later_is_metadata_not_writeback():
    """A block at virtual-disk 20 MiB is written with REQ_META (ext2's
    indirect block of a file deleted since) and later given to file 13 as
    data (its mapping event at 2000 ns); no call explains either write.
    The metadata write is metadata; the plain write to the same block
    after the file got it is write-back: a block that held data at some
    time of the capture is not write-back whatever its flags (ext2's
    indirect blocks are metadata)."""
    from rows import _hdr
    later = _hdr(5, 2000) | {"ino": 13, "file_offset_bytes": 0, "disk_bytes": 20 * MiB,
                             "length_bytes": 4096, "dev": GUEST, "map_type": 2, "source": 7,
                             "flags": 48}
    s = session(mapping_events=[later],
                block_events=request(1000, 1010, 1050, VDISK, 20 * MiB, 4096, rq=1, bio=11,
                                     op=1, flags=1 | 2)
                + request(3000, 3010, 3050, VDISK, 20 * MiB, 4096, rq=2, bio=12, op=1))
    assert s.rows("SELECT v.start_ns, l.kind, l.bytes FROM links l JOIN vdisk_io v "
                  "ON v.io_id = l.lower_id WHERE l.lower_level = 'vdisk' AND l.upper_id IS NULL "
                  "ORDER BY 1") == [{"start_ns": 1000, "kind": "metadata", "bytes": 4096},
                                    {"start_ns": 3000, "kind": "writeback", "bytes": 4096}]


@pytest.mark.parametrize("guest_fs,shared", [("btrfs", False), ("ext4", False), ("xfs", True),
                                             ("xfs", False)])
def test_a_read_of_a_block_moved_later_is_tied_where_the_start_snapshot_had_it_on_a_cow_guest_or_a_shared_extent(
        guest_fs, shared):
    """A guest file of 1 MiB at virtual-disk 4 MiB at start; at the end its
    first 4 KiB are at 30 MiB (rewritten: btrfs writes it elsewhere; so
    does xfs when the block was shared with another file, a reflink, which
    FIEMAP flags), the rest where it was.  A pread of those 4 KiB before
    the rewrite read 4 MiB: on a btrfs guest, or where the start snapshot
    flagged the extent shared, the old place is carried (kind sync), and so
    is the rewrite, whose page read there is its read-modify-write.  On
    ext4, or xfs with the extent not shared, which write in place, a file's
    bytes at another place at the end are another file's (its inode number
    taken again): nothing is carried."""
    ext = extents(guest=((0, 30 * MiB, 4096), (4096, 4 * MiB + 4096, MiB - 4096)))
    ext += [r | {"phase": "start", "flags": 8192 if shared else 0}
            for r in extents(guest=((0, 4 * MiB, MiB),)) if r["role"] == "guest_file"]
    s = session(device_map=device_map(guest_fs=guest_fs), extent_maps=ext,
                vfs_events=[vfs(100, 300, off=0, req=4096, ret=4096, syscall=3),
                            vfs(1000, 300, off=1024, req=2048, ret=2048, syscall=4)],
                block_events=request(150, 160, 350, VDISK, 4 * MiB, 4096, rq=1, bio=11)
                + request(1050, 1060, 1200, VDISK, 4 * MiB, 4096, rq=2, bio=12))
    calls = {r["syscall"]: r["io_id"] for r in s.rows("SELECT io_id, syscall FROM vfs_io")}
    got = s.rows("SELECT upper_id, kind, bytes FROM links WHERE lower_level = 'vdisk' "
                 "ORDER BY lower_id")
    if guest_fs != "btrfs" and not shared:
        assert got == [{"upper_id": None, "kind": "other", "bytes": 4096}] * 2, got
        return
    assert got == [{"upper_id": calls["pread64"], "kind": "sync", "bytes": 4096},
                   {"upper_id": calls["pwrite64"], "kind": "rmw", "bytes": 4096}], got
    assert s.rows("SELECT vdisk_offset_bytes, bytes FROM map_vfs WHERE io_id = ? ORDER BY 1",
                  [calls["pread64"]]) == [{"vdisk_offset_bytes": 4 * MiB, "bytes": 4096},
                                          {"vdisk_offset_bytes": 30 * MiB, "bytes": 4096}]


def _disk_links_are(s, want) -> dict:
    """Assert links at the disk level are `want`: (the disk request's Q
    time, the virtual-disk request's Q time or None, kind, bytes) each.
    Returns the requests' io_ids by (level, Q time)."""
    ids = {(r["level"], r["ts_ns"]): r["io_id"]
           for r in s.rows("SELECT level, start_ns AS ts_ns, io_id FROM block_requests")}
    got = s.rows("SELECT lower_id, upper_id, kind, bytes FROM links WHERE lower_level = 'disk' "
                 "ORDER BY lower_id")
    assert got == sorted([{"lower_id": ids["disk", d], "kind": k, "bytes": n,
                           "upper_id": None if v is None else ids["vdisk", v]}
                          for d, v, k, n in want], key=lambda r: r["lower_id"]), got
    return ids


def test_image_bytes_allocated_and_freed_during_the_capture_tie_the_disk_writes_in_flight():
    """The image had a 1 MiB hole at 32 MiB at start and at end; during the
    capture the host FS allocated it at disk 200 MiB (a mapping event: xfs
    filling the hole for a virtual-disk write), and the guest's discard
    punched it out again before the end.  A 64 KiB virtual-disk write
    there and the host-disk write at 200 MiB in flight with it are tied
    (kind sync), and map_disk carries that write back into the image; so
    is a 4 KiB read of it.  A host-disk write at the next 64 KiB of that
    place after the virtual-disk write of those bytes ended is not tied:
    the place may hold other data once freed (it is left unattributed)."""
    from rows import _hdr
    image = ((0, 100 * MiB, 32 * MiB), (33 * MiB, 133 * MiB, 31 * MiB))
    ext = extents(image=image)
    ext += [r | {"phase": "start"} for r in extents(image=image)]
    alloc = _hdr(5, 50) | {"ino": 131, "file_offset_bytes": 32 * MiB, "disk_bytes": 200 * MiB,
                           "length_bytes": MiB, "dev": HOSTFS, "map_type": 2, "source": 5,
                           "flags": 0}
    s = session(extent_maps=ext, mapping_events=[alloc],
                block_events=request(100, 110, 400, VDISK, 32 * MiB, 65536, rq=1, bio=11, op=1)
                + request(150, 160, 350, DISK, 200 * MiB, 65536, rq=2, bio=12, op=1, flags=1)
                + request(500, 510, 600, VDISK, 32 * MiB + 65536, 65536, rq=3, bio=13, op=1)
                + request(1000, 1010, 1100, DISK, 200 * MiB + 65536, 65536, rq=4, bio=14, op=1)
                + request(2000, 2010, 2300, VDISK, 32 * MiB, 4096, rq=5, bio=15)
                + request(2100, 2110, 2200, DISK, 200 * MiB, 4096, rq=6, bio=16))
    ids = _disk_links_are(s, [(150, 100, "sync", 65536), (1000, None, "writeback", 65536),
                              (2100, 2000, "sync", 4096)])
    assert s.rows("SELECT io_id, image_offset_bytes, bytes FROM map_disk ORDER BY io_id") == sorted([
        {"io_id": ids["disk", 150], "image_offset_bytes": 32 * MiB, "bytes": 65536},
        {"io_id": ids["disk", 1000], "image_offset_bytes": 32 * MiB + 65536, "bytes": 65536},
        {"io_id": ids["disk", 2100], "image_offset_bytes": 32 * MiB, "bytes": 4096}],
        key=lambda r: r["io_id"])


def test_a_disk_write_where_freed_image_bytes_were_is_tied_in_flight_and_a_moved_ones_not():
    """Image [40M, 41M) was at disk 140 MiB at the start and is nowhere at
    the end (a hole punched); [48M, 49M) was at disk 148 MiB and is at
    300 MiB at the end (a copy-on-write host moved it).  A 64 KiB virtual-
    disk write at 40 MiB, and the host-disk write at 140 MiB in flight with
    it, are tied (sync): the place held those bytes until the punch.  A
    virtual-disk write at 48 MiB ties the host-disk write at 300 MiB, not
    one at 148 MiB in flight with it: copy on write never writes the old
    place."""
    start = ((0, 100 * MiB, 64 * MiB),)
    end = ((0, 100 * MiB, 40 * MiB), (41 * MiB, 141 * MiB, 7 * MiB), (48 * MiB, 300 * MiB, MiB),
           (49 * MiB, 149 * MiB, 15 * MiB))
    ext = extents(image=end) + [r | {"phase": "start"} for r in extents(image=start)]
    s = session(extent_maps=ext,
                block_events=request(100, 110, 400, VDISK, 40 * MiB, 65536, rq=1, bio=11, op=1)
                + request(150, 160, 350, DISK, 140 * MiB, 65536, rq=2, bio=12, op=1, flags=1)
                + request(1000, 1010, 1400, VDISK, 48 * MiB, 65536, rq=3, bio=13, op=1)
                + request(1100, 1110, 1200, DISK, 148 * MiB, 65536, rq=4, bio=14, op=1, flags=1)
                + request(1150, 1160, 1300, DISK, 300 * MiB, 65536, rq=5, bio=15, op=1, flags=1))
    _disk_links_are(s, [(150, 100, "sync", 65536), (1100, None, "journal", 65536),
                        (1150, 1000, "sync", 65536)])


# the two calls of the test below: a hole punched, or the file cut short,
# freeing [512K, 1M); then a call that frees nothing (a plain fallocate of
# 1 MiB, op other; the file grown to 2 MiB, op other, no bytes)
FREEING_CALLS = {
    "fallocate": ([vfs(100, 100, off=MiB // 2, req=MiB // 2, ret=0, syscall=25) | {"iov_count": 3},
                   vfs(300, 50, off=2 * MiB, req=MiB, ret=0, syscall=25) | {"iov_count": 0}],
                  [{"syscall": "fallocate", "op": "discard", "falloc_mode": 3, "bytes": MiB // 2},
                   {"syscall": "fallocate", "op": "other", "falloc_mode": 0, "bytes": MiB}]),
    # (offset: the new size; req: the size before)
    "ftruncate": ([vfs(100, 100, off=MiB // 2, req=MiB, ret=0, syscall=32),
                   vfs(300, 50, off=2 * MiB, req=MiB // 2, ret=0, syscall=32)],
                  [{"syscall": "ftruncate", "op": "discard", "falloc_mode": None, "bytes": MiB // 2},
                   {"syscall": "ftruncate", "op": "other", "falloc_mode": None, "bytes": 0}]),
    "uring_ftruncate": ([vfs(100, 100, off=MiB // 2, req=MiB, ret=0, syscall=42),
                         vfs(300, 50, off=2 * MiB, req=MiB // 2, ret=0, syscall=42)],
                        [{"syscall": "uring_ftruncate", "op": "discard", "falloc_mode": None,
                          "bytes": MiB // 2},
                         {"syscall": "uring_ftruncate", "op": "other", "falloc_mode": None,
                          "bytes": 0}])}


@pytest.mark.parametrize("call", sorted(FREEING_CALLS))
def test_a_hole_an_application_punches_in_a_guest_file_is_followed_down_to_the_host_disk(call):
    """fallocate(PUNCH_HOLE | KEEP_SIZE) of the second half of a 1 MiB guest
    file (at virtual-disk 4 MiB at the start; only its first half mapped at
    the end).  The guest FS, with online discard, discards the freed blocks
    at its commit, after the call returned; the loop device punches them out
    of the image, and the host FS discards them on its disk.  Each is tied
    to the one above: kind discard, the lag from the upper one's end.  A
    plain fallocate (mode 0) is op other and ties nothing.  The same for
    ftruncate cutting the file to 512 KiB (then growing it)."""
    ext = extents(guest=((0, 4 * MiB, MiB // 2),),
                  image=((0, 100 * MiB, 4 * MiB + MiB // 2), (5 * MiB, 105 * MiB, 59 * MiB)))
    ext += [r | {"phase": "start"} for r in extents(image=((0, 100 * MiB, 64 * MiB),))]
    t = dict(extent_maps=ext,
             vfs_events=FREEING_CALLS[call][0],
             block_events=request(1000, 1010, 1100, VDISK, 4 * MiB + MiB // 2, MiB // 2,
                                  rq=1, bio=11, op=3)
             + request(2000, 2010, 2100, DISK, 104 * MiB + MiB // 2, MiB // 2, rq=2, bio=12, op=3))
    s = session(**t)
    calls = s.rows("SELECT io_id, syscall, op, falloc_mode, bytes FROM vfs_io ORDER BY ts_ns")
    assert [{k: v for k, v in r.items() if k != "io_id"} for r in calls] == FREEING_CALLS[call][1]
    assert s.rows("SELECT vdisk_offset_bytes, bytes FROM map_vfs") == [
        {"vdisk_offset_bytes": 4 * MiB + MiB // 2, "bytes": MiB // 2}]
    vd = s.rows("SELECT io_id FROM vdisk_io")[0]["io_id"]
    got = s.rows("SELECT lower_level, upper_id, kind, bytes, lag_ns FROM links ORDER BY lower_level DESC")
    assert got == [
        {"lower_level": "vdisk", "upper_id": calls[0]["io_id"], "kind": "discard",
         "bytes": MiB // 2, "lag_ns": 1000 - 200},
        {"lower_level": "disk", "upper_id": vd, "kind": "discard", "bytes": MiB // 2,
         "lag_ns": 2000 - 1100}]


def test_discard_summary_follows_discards_and_write_zeroes_down_to_the_host_disk():
    """Per level: the discard and write-zeroes requests, and the bytes tied
    to the level above (hostfs: the holes, each tied to the request that
    punched it, 100, 200 and 100 ns after its start; disk: 3 of 4 MiB +
    4 KiB, the lags 1100 after a request's end, 100 from a start while in
    flight, 500 after an end)."""
    s = session(**punched_holes_discarded_on_the_host_disk())
    got = s.rows("SELECT * EXCLUDE (capture_id) FROM discard_summary ORDER BY requests, level")
    assert got == [
        {"level": "hostfs", "requests": 3, "discard_bytes": 3 * MiB, "zeroes_bytes": 0,
         "tied_bytes": 3 * MiB, "tied_fraction": 1.0, "lag_median_ns": 100.0},
        {"level": "vdisk", "requests": 3, "discard_bytes": MiB, "zeroes_bytes": 2 * MiB,
         "tied_bytes": 0, "tied_fraction": 0.0, "lag_median_ns": None},
        {"level": "disk", "requests": 5, "discard_bytes": 4 * MiB + 4096, "zeroes_bytes": 0,
         "tied_bytes": 3 * MiB, "tied_fraction": 3 * MiB / (4 * MiB + 4096),
         "lag_median_ns": 500.0}]


def test_the_report_and_its_html_tables_list_discards_only_where_there_are_some():
    from nestrace.report import document as report
    from nestrace.report import plots
    rep = report.build(session(**punched_holes_discarded_on_the_host_disk()))
    assert [(r["level"], r["requests"]) for r in rep["discard"]] == [
        ("vdisk", 3), ("hostfs", 3), ("disk", 5)]
    page = plots._tables_html(rep)
    assert "<h3>Discards and write-zeroes</h3>" in page
    assert f"<tr><td>disk</td><td>5</td><td>{4 * MiB + 4096}</td>" in page
    none = report.build(session(**direct_read_stack()))
    assert none["discard"] == [] and "Discards" not in plots._tables_html(none)


def test_compare_captures_names_every_guest_file_system_of_a_capture_that_traced_several():
    """`record --stack A --stack B` on an xfs and an ext4 partition of one
    virtual disk: the capture's guest_fs is both, not one of them."""
    dm = device_map(guest_fs="xfs")
    dm += [r | {"dev": GUEST + 100, "name": "/g2", "fs_type": "ext4", "block_size_bytes": 1024}
           for r in dm if r["level"] == "vfs"]
    s = session(device_map=dm)
    assert s.rows("SELECT guest_fs, guest_block_bytes, host_fs FROM compare_captures") == [
        {"guest_fs": "ext4+xfs", "guest_block_bytes": 4096, "host_fs": "xfs"}]


def test_compare_captures_puts_each_capture_s_stack_and_numbers_in_one_row():
    """Two captures: c1 a 4 KiB direct read that became 32 KiB at the disk,
    on ext4 over xfs with an O_DIRECT loop vdisk; c2 two 4 KiB writes on xfs
    over ext4 whose workload failed, each write 8 KiB at the disk, with no
    loop device under the host FS (host_dio unknown)."""
    c1 = direct_read_stack()
    c1["block_events"] = (request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
                          + request(310, 320, 800, DISK, 104 * MiB, 32768, rq=2, bio=12))
    dm1 = [r | ({"dio": True, "backing_path": "/h/image.raw"} if r["level"] in ("vdisk", "disk")
                else {}) for r in device_map()]
    dm2 = [r | {"capture_id": "c2"} | ({"dio": True, "backing_path": "/h/image.raw"}
                                       if r["level"] == "vdisk" else {})
           for r in device_map(guest_fs="xfs", host_fs="ext4")]
    c2_vfs = [vfs(5000, 1000, off=0, syscall=4), vfs(7000, 3000, off=4096, syscall=4)]
    c2_blk = (request(5100, 5110, 5900, VDISK, 4 * MiB, 4096, rq=3, bio=13, op=1)
              + request(5200, 5210, 5800, DISK, 104 * MiB, 8192, rq=4, bio=14, op=1)
              + request(7100, 7110, 9900, VDISK, 4 * MiB + 4096, 4096, rq=5, bio=15, op=1)
              + request(7200, 7210, 7400, DISK, 104 * MiB + 8192, 8192, rq=6, bio=16, op=1))
    two = lambda rows: [r | {"capture_id": "c2"} for r in rows]   # noqa: E731
    s = session(capture_meta=capture_meta(command="fio a", command_exit=0)
                + two(capture_meta(command="fio b", command_exit=1, end_ns=2 * 10**9)),
                device_map=dm1 + dm2,
                extent_maps=extents() + two(extents()),
                vfs_events=c1["vfs_events"] + two(c2_vfs),
                block_events=c1["block_events"] + two(c2_blk),
                hostfs_events=c1["hostfs_events"])
    got = s.rows("SELECT * EXCLUDE (start_wall, guest_block_bytes, host_block_bytes, "
                 "app_p99_ns, vdisk_q2c_median_ns) FROM compare_captures ORDER BY capture_id")
    mib_s = lambda nbytes, ns: nbytes / MiB / (ns / 1e9)   # noqa: E731
    assert got == [
        {"capture_id": "c1", "guest_fs": "ext4", "host_fs": "xfs", "guest_dio": True,
         "host_dio": True, "command": "fio a", "command_exit": 0, "seconds": 1.0,
         "app_read_bytes": 4096, "app_write_bytes": 0, "app_mib_per_s": pytest.approx(mib_s(4096, 900)),
         "app_median_ns": 900.0,
         "vdisk_read_bytes": 4096, "vdisk_write_bytes": 0, "hostfs_read_bytes": 4096,
         "hostfs_write_bytes": 0, "disk_read_bytes": 32768, "disk_write_bytes": 0,
         "disk_read_x_app": 8.0, "disk_write_x_app": None, "vdisk_requests": 1,
         "disk_requests": 1, "vdisk_sequential": None, "disk_sequential": None,
         "disk_seek_median_sectors": None, "disk_q2c_median_ns": 490.0,
         "vdisk_in_flight": 1.0, "disk_in_flight": 1.0, "lost_total": 0},
        {"capture_id": "c2", "guest_fs": "xfs", "host_fs": "ext4", "guest_dio": True,
         "host_dio": None, "command": "fio b", "command_exit": 1, "seconds": 2.0,
         "app_read_bytes": 0, "app_write_bytes": 8192,
         "app_mib_per_s": pytest.approx(mib_s(8192, 10000 - 5000)), "app_median_ns": 2000.0,
         "vdisk_read_bytes": 0, "vdisk_write_bytes": 8192, "hostfs_read_bytes": 0,
         "hostfs_write_bytes": 0, "disk_read_bytes": 0, "disk_write_bytes": 16384,
         "disk_read_x_app": None, "disk_write_x_app": 2.0, "vdisk_requests": 2,
         "disk_requests": 2, "vdisk_sequential": 1.0, "disk_sequential": 1.0,
         "disk_seek_median_sectors": 0, "disk_q2c_median_ns": 400.0,
         # in flight 790 + 2790 ns of 5110..9900; at the disk 590 + 190 of 5210..7400
         "vdisk_in_flight": pytest.approx(3580 / 4790), "disk_in_flight": pytest.approx(780 / 2190),
         "lost_total": 0}]


def test_compare_stacks_takes_the_median_of_a_stack_s_rounds_and_leaves_failed_ones_out():
    """ext4 on xfs three times (reads of 900 and 1800 ns, 8x and 4x at the
    disk; a third round whose workload failed, 16x), xfs on xfs once."""
    def one(cid, dur, disk_bytes, exit_, guest_fs="ext4"):
        tag = lambda rows: [r | {"capture_id": cid} for r in rows]   # noqa: E731
        return dict(capture_meta=tag(capture_meta(command="fio r", command_exit=exit_)),
                    device_map=tag(device_map(guest_fs=guest_fs)), extent_maps=tag(extents()),
                    vfs_events=tag([vfs(100, dur, off=8192)]),
                    block_events=tag(request(200, 210, 300, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
                                     + request(310, 320, 400, DISK, 104 * MiB, disk_bytes, rq=2, bio=12)))
    caps = [one("a", 900, 32768, 0), one("b", 1800, 16384, 0), one("c", 700, 65536, 3),
            one("d", 1000, 4096, 0, guest_fs="xfs")]
    s = session(**{t: sum((c[t] for c in caps), []) for t in caps[0]})
    got = s.compare_stacks().to_pylist()
    mib_s = lambda ns: 4096 / MiB / (ns / 1e9)   # noqa: E731
    keep = ("guest_fs", "host_fs", "command", "rounds", "failed_rounds", "app_mib_per_s",
            "app_mib_per_s_min", "app_mib_per_s_max", "app_median_ns", "disk_read_x_app",
            "disk_write_x_app", "lost_total", "capture_ids")
    assert [{k: r[k] for k in keep} for r in got] == [
        {"guest_fs": "ext4", "host_fs": "xfs", "command": "fio r", "rounds": 2, "failed_rounds": 1,
         "app_mib_per_s": pytest.approx((mib_s(900) + mib_s(1800)) / 2),
         "app_mib_per_s_min": pytest.approx(mib_s(1800)), "app_mib_per_s_max": pytest.approx(mib_s(900)),
         "app_median_ns": 1350.0, "disk_read_x_app": 6.0, "disk_write_x_app": None,
         "lost_total": 0, "capture_ids": ["a", "b", "c"]},
        {"guest_fs": "xfs", "host_fs": "xfs", "command": "fio r", "rounds": 1, "failed_rounds": 0,
         "app_mib_per_s": pytest.approx(mib_s(1000)), "app_mib_per_s_min": pytest.approx(mib_s(1000)),
         "app_mib_per_s_max": pytest.approx(mib_s(1000)), "app_median_ns": 1000.0,
         "disk_read_x_app": 1.0, "disk_write_x_app": None, "lost_total": 0, "capture_ids": ["d"]}]


def test_a_call_cut_by_an_image_extent_inside_one_block_is_tied_whole():
    """A 4 KiB read whose virtual-disk block the image's extents cut in two
    (map_vfs has two pieces in one block): its virtual-disk request is tied
    to it for all 4096 bytes, not for the one piece the block was matched
    to (found in a QEMU guest on a vpc image: half of such a read was
    left unattributed, kind other)."""
    s = session(extent_maps=extents(image=((0, 100 * MiB, 4 * MiB + 2048),
                                           (4 * MiB + 2048, 200 * MiB, 60 * MiB))),
                vfs_events=[vfs(100, 900, off=0, f_flags=0o40000)],
                block_events=request(200, 210, 900, VDISK, 4 * MiB, 4096, rq=1, bio=11))
    assert [r["bytes"] for r in s.rows(
        "SELECT bytes FROM map_vfs ORDER BY file_offset_bytes")] == [2048, 2048]
    assert s.rows("SELECT upper_level, kind, bytes FROM links WHERE lower_level = 'vdisk'") == [
        {"upper_level": "vfs", "kind": "sync", "bytes": 4096}]
