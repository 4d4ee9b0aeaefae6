"""Diff tests of the image maps (sparse, qcow2 clusters, backing chains)
and the latency breakdown: hand-built stacks, exact rows."""
from __future__ import annotations

import pytest
from rows import (
    CAP,
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

from nestrace.query.session import Session

SPARSE_IMAGE = extents(image=((0, 100 * MiB, 1 * MiB), (2 * MiB, 300 * MiB, 1 * MiB)))


def test_map_vdisk_cuts_requests_at_extents_and_keeps_the_holes():
    # image: [0, 1M) at disk 100M, a hole [1M, 2M), [2M, 3M) at disk 300M, a hole after
    ev = (request(10, 11, 12, VDISK, 4096, 8192, rq=1, bio=1, op=1)               # inside one extent
          + request(20, 21, 22, VDISK, 1 * MiB - 4096, 8192, rq=2, bio=2, op=1)   # extent, then hole
          + request(30, 31, 32, VDISK, 2 * MiB - 4096, 8192, rq=3, bio=3)         # hole, then extent
          + request(40, 41, 42, VDISK, 1 * MiB - 4096, MiB + 8192, rq=4, bio=4)   # extent, hole, extent
          + request(50, 51, 52, VDISK, 5 * MiB, 4096, rq=5, bio=5))               # all hole
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": SPARSE_IMAGE, "block_events": ev})
    got = [(r["start_ns"], r["op"], r["image_offset_bytes"], r["bytes"], r["disk_offset_bytes"])
           for r in s.rows("SELECT * FROM map_vdisk ORDER BY start_ns, image_offset_bytes")]
    assert got == [
        (10, "write", 4096, 8192, 100 * MiB + 4096),
        (20, "write", MiB - 4096, 4096, 101 * MiB - 4096), (20, "write", MiB, 4096, None),
        (30, "read", 2 * MiB - 4096, 4096, None), (30, "read", 2 * MiB, 4096, 300 * MiB),
        (40, "read", MiB - 4096, 4096, 101 * MiB - 4096), (40, "read", MiB, MiB, None),
        (40, "read", 2 * MiB, 4096, 300 * MiB),
        (50, "read", 5 * MiB, 4096, None)]


def test_map_vdisk_adds_the_loop_offset():
    dm = device_map()
    dm[1]["backing_offset_bytes"] = 1 * MiB
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                             "extent_maps": SPARSE_IMAGE,
                             "block_events": request(10, 11, 12, VDISK, 4096, 4096, rq=1, bio=1)})
    assert s.rows("SELECT image_offset_bytes, bytes, disk_offset_bytes FROM map_vdisk") == [
        {"image_offset_bytes": MiB + 4096, "bytes": 4096, "disk_offset_bytes": None}]


KiB = 1 << 10


def qcow2_stack(fmt="qcow2", **tables):
    """The virtual disk in a qcow2 image (or a sparse vmdk or a vdi: the same
    map, of grains or blocks) with 64 KiB clusters: its cluster map at capture end (and an
    older one at start, which the end one beats)."""
    dm = device_map()
    dm[1]["backing_format"] = fmt
    base = {"capture_id": CAP, "role": "vdisk_image", "path": "", "dev": HOSTFS, "ino": 131,
            "flags": 0}
    clusters = [base | {"phase": "end", "logical_bytes": lo, "physical_bytes": ph,
                        "length_bytes": ln}
                for lo, ph, ln in ((4 * MiB, 1 * MiB, 64 * KiB),
                                   (4 * MiB + 64 * KiB, 3 * MiB, 64 * KiB),
                                   (16 * MiB - 64 * KiB, 5 * MiB, 128 * KiB))]
    clusters.append(base | {"phase": "start", "logical_bytes": 4 * MiB, "physical_bytes": 1 * MiB,
                            "length_bytes": 64 * KiB})
    # its header, L1, refcount and L2 tables in the first 256 KiB
    clusters.append(base | {"phase": "end", "role": "image_metadata", "logical_bytes": 0,
                            "physical_bytes": 0, "length_bytes": 256 * KiB})
    return Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                                "extent_maps": extents() + clusters} | tables)


@pytest.mark.parametrize("fmt", ["qcow2", "qcow", "vmdk", "vdi", "vhdx", "vpc", "parallels"])
def test_map_vdisk_image_of_a_mapped_image_is_its_cluster_map_and_the_gaps(fmt):
    s = qcow2_stack(fmt)
    got = [tuple(r.values()) for r in s.rows(
        "SELECT vdisk_offset_bytes, image_offset_bytes, length_bytes, source FROM map_vdisk_image "
        "ORDER BY 1")]
    end = f"{fmt}_end"
    assert got == [(0, None, 4 * MiB, end),
                   (4 * MiB, 1 * MiB, 64 * KiB, end),
                   (4 * MiB + 64 * KiB, 3 * MiB, 64 * KiB, end),
                   (4 * MiB + 128 * KiB, None, 12 * MiB - 192 * KiB, end),
                   (16 * MiB - 64 * KiB, 5 * MiB, 128 * KiB, end),
                   (16 * MiB + 64 * KiB, None, 512 * MiB - 16 * MiB - 64 * KiB, end)]
    raw = session()
    assert raw.rows("SELECT * FROM map_vdisk_image") == [
        {"capture_id": CAP, "vdisk_offset_bytes": 0, "image_offset_bytes": 0,
         "length_bytes": 512 * MiB, "source": "raw", "image_ino": 131}]


def test_qcow2_clusters_split_a_file_range_and_carry_it_into_the_image():
    """A read across two clusters that are apart in the image is two pieces
    at every level below the guest; one in an unallocated cluster keeps its
    virtual-disk offset and has no place in the image."""
    s = qcow2_stack(vfs_events=[vfs(1, 2, off=60 * KiB, req=8192, ret=8192),
                                vfs(3, 4, off=200 * KiB)])
    got = [tuple(r.values()) for r in s.rows(
        "SELECT file_offset_bytes, bytes, vdisk_offset_bytes, image_offset_bytes, disk_offset_bytes "
        "FROM map_vfs ORDER BY 1")]
    assert got == [(60 * KiB, 4096, 4 * MiB + 60 * KiB, 1 * MiB + 60 * KiB, 101 * MiB + 60 * KiB),
                   (64 * KiB, 4096, 4 * MiB + 64 * KiB, 3 * MiB, 103 * MiB),
                   (200 * KiB, 4096, 4 * MiB + 200 * KiB, None, None)]


def test_map_vdisk_and_links_follow_a_request_through_qcow2_clusters():
    ev = (request(10, 11, 40, VDISK, 4 * MiB + 60 * KiB, 8192, rq=1, bio=1)   # two clusters apart
          + request(20, 21, 50, VDISK, 16 * MiB - 4096, 8192, rq=2, bio=2)    # one run, two buckets
          + request(30, 31, 60, VDISK, 8 * MiB, 4096, rq=3, bio=3))           # unallocated
    s = qcow2_stack(block_events=ev,
                    hostfs_events=[hostfs(15, 1 * MiB + 60 * KiB, 4096, source=3),
                                   hostfs(16, 3 * MiB, 4096, source=3),
                                   hostfs(25, 5 * MiB + 60 * KiB, 8192, source=3),
                                   # the hypervisor updating an L2 table
                                   hostfs(26, 192 * KiB, 4096, source=4, op=1)])
    got = [(r["start_ns"], r["image_offset_bytes"], r["bytes"], r["disk_offset_bytes"])
           for r in s.rows("SELECT * FROM map_vdisk ORDER BY start_ns, image_offset_bytes")]
    assert got == [(10, 1 * MiB + 60 * KiB, 4096, 101 * MiB + 60 * KiB),
                   (10, 3 * MiB, 4096, 103 * MiB),
                   (20, 5 * MiB + 60 * KiB, 8192, 105 * MiB + 60 * KiB)]
    links = s.rows("SELECT l.kind, l.bytes, v.start_ns FROM links l JOIN vdisk_io v "
                   "ON v.io_id = l.upper_id WHERE l.lower_level = 'hostfs' ORDER BY 3, 2")
    assert [tuple(r.values()) for r in links] == [("sync", 4096, 10), ("sync", 4096, 10),
                                                  ("sync", 8192, 20)]
    assert s.rows("SELECT kind, bytes FROM links WHERE lower_level = 'hostfs' "
                  "AND upper_id IS NULL") == [{"kind": "metadata", "bytes": 4096}]


def chain_stack(maps=None, **tables):
    """A qcow2 overlay (inode 131, on the host disk at 100 MiB) over a raw
    base image (inode 140, at 400 MiB): the overlay has one 64 KiB
    cluster of the disk, at 4 MiB (in its file at 1 MiB); the rest of the
    disk is read from the base, at the same offset, up to its 16 MiB end
    (or the vdisk_image rows `maps`)."""
    dm = device_map()
    dm[1]["backing_format"] = "qcow2"
    base = {"capture_id": CAP, "phase": "end", "path": "", "dev": HOSTFS, "flags": 0}
    rows = extents()   # (the overlay's file: one extent, at 100 MiB on the disk)
    rows += [base | {"role": "image", "ino": 140, "logical_bytes": 0,
                     "physical_bytes": 400 * MiB, "length_bytes": 16 * MiB}]
    rows += maps or [base | {"role": "vdisk_image", "ino": ino, "logical_bytes": lo,
                             "physical_bytes": ph, "length_bytes": ln}
                     for ino, lo, ph, ln in ((140, 0, 0, 4 * MiB),
                                             (131, 4 * MiB, 1 * MiB, 64 * KiB),
                                             (140, 4 * MiB + 64 * KiB, 4 * MiB + 64 * KiB,
                                              12 * MiB - 64 * KiB))]
    rows.append(base | {"role": "image_metadata", "ino": 131, "logical_bytes": 0,
                        "physical_bytes": 0, "length_bytes": 256 * KiB})
    return Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                                "extent_maps": rows} | tables)


def test_a_backing_file_serves_what_the_overlay_has_not_allocated():
    """Reads of clusters the overlay has are its file's; the others are
    the base's: at the host FS (an access to the base's inode at the same
    offset as on the virtual disk) and on the host disk (through the base's
    extents), each tied to the virtual-disk read.  An access to the base at
    the offset of the overlay's metadata is not the overlay's metadata."""
    ev = (request(10, 11, 40, VDISK, 4 * MiB, 4096, rq=1, bio=1)              # the overlay's cluster
          + request(20, 21, 50, VDISK, 2 * MiB, 8192, rq=2, bio=2)            # the base's
          + request(30, 31, 60, VDISK, 4 * MiB + 60 * KiB, 8192, rq=3, bio=3)  # half and half
          + request(70, 71, 80, VDISK, 20 * MiB, 4096, rq=4, bio=4)           # past the base's end
          + request(13, 14, 15, DISK, 101 * MiB, 4096, rq=11, bio=11)
          + request(23, 24, 25, DISK, 402 * MiB, 8192, rq=12, bio=12)
          + request(33, 34, 35, DISK, 101 * MiB + 60 * KiB, 4096, rq=13, bio=13)
          + request(36, 37, 38, DISK, 404 * MiB + 64 * KiB, 4096, rq=14, bio=14))
    hfs = [hostfs(12, 1 * MiB, 4096, source=3),
           hostfs(22, 2 * MiB, 8192, source=3, ino=140),
           hostfs(32, 1 * MiB + 60 * KiB, 4096, source=3),
           hostfs(33, 4 * MiB + 64 * KiB, 4096, source=3, ino=140),
           hostfs(90, 64 * KiB, 4096, source=3, ino=140),              # no request: other
           hostfs(91, 64 * KiB, 4096, source=3)]                       # the overlay's L2: metadata
    s = chain_stack(block_events=ev, hostfs_events=hfs)
    assert [tuple(r.values()) for r in s.rows(
        "SELECT vdisk_offset_bytes, image_offset_bytes, length_bytes, image_ino "
        "FROM map_vdisk_image ORDER BY 1")] == [
        (0, 0, 4 * MiB, 140), (4 * MiB, 1 * MiB, 64 * KiB, 131),
        (4 * MiB + 64 * KiB, 4 * MiB + 64 * KiB, 12 * MiB - 64 * KiB, 140),
        (16 * MiB, None, 496 * MiB, None)]
    got = [tuple(r.values()) for r in s.rows(
        "SELECT start_ns, image_ino, image_offset_bytes, bytes, disk_offset_bytes FROM map_vdisk "
        "ORDER BY 1, 3")]
    assert got == [(10, 131, 1 * MiB, 4096, 101 * MiB),
                   (20, 140, 2 * MiB, 8192, 402 * MiB),
                   (30, 131, 1 * MiB + 60 * KiB, 4096, 101 * MiB + 60 * KiB),
                   (30, 140, 4 * MiB + 64 * KiB, 4096, 404 * MiB + 64 * KiB)]
    assert [tuple(r.values()) for r in s.rows(
        "SELECT start_ns, image_ino, image_offset_bytes FROM map_disk ORDER BY 1")] == [
        (13, 131, 1 * MiB), (23, 140, 2 * MiB), (33, 131, 1 * MiB + 60 * KiB),
        (36, 140, 4 * MiB + 64 * KiB)]
    links = s.rows("""
        SELECT l.lower_level, v.start_ns AS vdisk, l.kind, sum(l.bytes) AS bytes FROM links l
        JOIN vdisk_io v ON v.io_id = l.upper_id WHERE l.lower_level IN ('hostfs', 'disk')
        GROUP BY ALL ORDER BY 1, 2""")
    assert [tuple(r.values()) for r in links] == [
        ("disk", 10, "sync", 4096), ("disk", 20, "sync", 8192), ("disk", 30, "sync", 8192),
        ("hostfs", 10, "sync", 4096), ("hostfs", 20, "sync", 8192), ("hostfs", 30, "sync", 8192)]
    assert [tuple(r.values()) for r in s.rows(
        "SELECT h.ts_ns, l.kind FROM links l JOIN hostfs_io h ON h.io_id = l.lower_id "
        "WHERE l.upper_id IS NULL ORDER BY 1")] == [(90, "other"), (91, "metadata")]


def test_a_write_that_allocates_a_cluster_is_tied_to_the_copy_on_write_it_makes():
    """The overlay of chain_stack, with 64 KiB clusters, mapped at the
    capture's start and end: two clusters allocated in between.  A 4 KiB
    write into the one at 8 MiB (the base's at the start): QEMU reads the
    rest of the cluster from the base (rmw) and writes the whole cluster
    into the overlay (sync).  A 4 KiB write into the one at 20 MiB (past
    the base's end: zeros): QEMU zeroes the new cluster (fallocate, op
    discard) and writes the data.  A write into the cluster the overlay
    had at the start is itself only: the rest of a write of that cluster
    is not its.  The same holds on the host disk, through each file's
    extents."""
    base = {"capture_id": CAP, "path": "", "dev": HOSTFS, "flags": 0, "role": "vdisk_image",
            "cluster_bytes": 64 * KiB}
    start = [(140, 0, 0, 4 * MiB), (131, 4 * MiB, 1 * MiB, 64 * KiB),
             (140, 4 * MiB + 64 * KiB, 4 * MiB + 64 * KiB, 12 * MiB - 64 * KiB)]
    end = [(140, 0, 0, 4 * MiB), (131, 4 * MiB, 1 * MiB, 64 * KiB),
           (140, 4 * MiB + 64 * KiB, 4 * MiB + 64 * KiB, 4 * MiB - 64 * KiB),
           (131, 8 * MiB, 2 * MiB, 64 * KiB),
           (140, 8 * MiB + 64 * KiB, 8 * MiB + 64 * KiB, 8 * MiB - 64 * KiB),
           (131, 20 * MiB, 2 * MiB + 64 * KiB, 64 * KiB)]
    maps = [base | {"phase": ph, "ino": ino, "logical_bytes": lo, "physical_bytes": p,
                    "length_bytes": n}
            for ph, rows in (("start", start), ("end", end)) for ino, lo, p, n in rows]
    ev = (request(10, 11, 40, VDISK, 8 * MiB + 8 * KiB, 4096, rq=1, bio=1, op=1)
          + request(50, 51, 80, VDISK, 20 * MiB, 4096, rq=2, bio=2, op=1)
          + request(90, 91, 99, VDISK, 4 * MiB, 4096, rq=3, bio=3, op=1)
          # the host disk: the base's reads and the overlay's cluster write
          + request(14, 15, 16, DISK, 408 * MiB, 8 * KiB, rq=11, bio=11)
          + request(17, 18, 19, DISK, 408 * MiB + 12 * KiB, 52 * KiB, rq=12, bio=12)
          + request(21, 22, 23, DISK, 102 * MiB, 64 * KiB, rq=13, bio=13, op=1))
    hfs = [hostfs(12, 8 * MiB, 8 * KiB, source=3, ino=140),                 # the head, and
           hostfs(13, 8 * MiB + 12 * KiB, 52 * KiB, source=3, ino=140),     # the tail, from the base
           hostfs(20, 2 * MiB, 64 * KiB, source=4, op=1),                   # the whole cluster
           hostfs(52, 2 * MiB + 64 * KiB, 64 * KiB, source=9, op=3),        # zeroed
           hostfs(53, 2 * MiB + 64 * KiB, 4096, source=4, op=1),
           hostfs(92, 1 * MiB, 8192, source=4, op=1)]                       # 4 KiB more: not its
    s = chain_stack(maps, block_events=ev, hostfs_events=hfs)
    got = s.rows("""
        SELECT h.ts_ns, h.op, l.kind, l.bytes, v.start_ns AS vdisk FROM links l
        JOIN hostfs_io h ON h.io_id = l.lower_id LEFT JOIN vdisk_io v ON v.io_id = l.upper_id
        WHERE l.lower_level = 'hostfs' ORDER BY 1, 3""")
    assert [tuple(r.values()) for r in got] == [
        (12, "read", "rmw", 8192, 10), (13, "read", "rmw", 53248, 10),
        (20, "write", "sync", 65536, 10),
        (52, "discard", "sync", 65536, 50), (53, "write", "sync", 4096, 50),
        (92, "write", "other", 4096, None), (92, "write", "sync", 4096, 90)]
    got = s.rows("""
        SELECT d.start_ns, l.kind, l.bytes, v.start_ns AS vdisk FROM links l
        JOIN disk_io d ON d.io_id = l.lower_id JOIN vdisk_io v ON v.io_id = l.upper_id
        WHERE l.lower_level = 'disk' ORDER BY 1""")
    assert [tuple(r.values()) for r in got] == [
        (14, "rmw", 8192, 10), (17, "rmw", 53248, 10), (21, "sync", 65536, 10)]


def test_a_cluster_allocated_over_a_base_in_many_clusters_is_copied_from_its_place_there():
    """A base (inode 140) in 40 clusters of 64 KiB, scattered in its file
    (more than _overlaps compares one by one): a 4 KiB write into disk
    cluster 5, which the overlay allocates, is tied to QEMU's reads of the
    rest of that cluster where the base holds it, and not to the base's
    other clusters."""
    k = 64 * KiB
    base = {"capture_id": CAP, "path": "", "dev": HOSTFS, "flags": 0, "role": "vdisk_image",
            "cluster_bytes": k}
    place = {i: (i * 17 % 40) * k for i in range(40)}
    start = [(140, i * k, place[i]) for i in range(40)]
    end = [(131, i * k, 1 * MiB) if i == 5 else (140, i * k, place[i]) for i in range(40)]
    maps = [base | {"phase": ph, "ino": ino, "logical_bytes": lo, "physical_bytes": p,
                    "length_bytes": k}
            for ph, rows in (("start", start), ("end", end)) for ino, lo, p in rows]
    ev = request(10, 11, 40, VDISK, 5 * k + 8 * KiB, 4096, rq=1, bio=1, op=1)
    hfs = [hostfs(12, place[5], 8 * KiB, source=3, ino=140),                # the head, and
           hostfs(13, place[5] + 12 * KiB, 52 * KiB, source=3, ino=140),    # the tail, from the base
           hostfs(14, place[6], 4 * KiB, source=3, ino=140),                # another cluster's
           hostfs(20, 1 * MiB, 64 * KiB, source=4, op=1)]                   # the whole cluster
    s = chain_stack(maps, block_events=ev, hostfs_events=hfs)
    got = s.rows("""
        SELECT h.ts_ns, l.kind, l.bytes, v.start_ns AS vdisk FROM links l
        JOIN hostfs_io h ON h.io_id = l.lower_id LEFT JOIN vdisk_io v ON v.io_id = l.upper_id
        WHERE l.lower_level = 'hostfs' ORDER BY 1, 2""")
    assert [tuple(r.values()) for r in got] == [
        (12, "rmw", 8192, 10), (13, "rmw", 53248, 10), (14, "other", 4096, None),
        (20, "sync", 65536, 10)]


def test_map_disk_carries_disk_requests_back_into_the_image():
    ev = (request(10, 11, 12, DISK, 100 * MiB + 4096, 4096, rq=1, bio=1)        # in the first extent
          + request(20, 21, 22, DISK, 300 * MiB - 4096, 8192, rq=2, bio=2)      # half before the second
          + request(30, 31, 32, DISK, 50 * MiB, 4096, rq=3, bio=3))             # not the image's
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": SPARSE_IMAGE, "block_events": ev})
    got = s.rows("SELECT start_ns, d_ns, c_ns, disk_offset_bytes, bytes, image_offset_bytes "
                 "FROM map_disk ORDER BY start_ns")
    assert got == [
        {"start_ns": 10, "d_ns": 11, "c_ns": 12, "disk_offset_bytes": 100 * MiB + 4096, "bytes": 4096,
         "image_offset_bytes": 4096},
        {"start_ns": 20, "d_ns": 21, "c_ns": 22, "disk_offset_bytes": 300 * MiB, "bytes": 4096,
         "image_offset_bytes": 2 * MiB}]


def test_latency_breakdown_parts_add_up_to_the_syscall():
    # direct read: syscall 100..1000; vdisk Q 200 D 210 C 900; disk Q 310 D 320 C 800
    s = session(**direct_read_stack())
    got = s.rows("SELECT op, class, total_ns, guest_service_ns, guest_queue_ns, host_fs_ns, "
                 "host_queue_ns, device_ns FROM latency_breakdown")
    assert got == [{"op": "read", "class": "read 4K", "total_ns": 900, "guest_service_ns": 200,
                    "guest_queue_ns": 10, "host_fs_ns": 200, "host_queue_ns": 10, "device_ns": 480}]


def test_latency_breakdown_of_a_cached_read_is_all_guest_and_summary_averages():
    t = direct_read_stack()
    t["vfs_events"] = t["vfs_events"] + [vfs(2000, 100, off=8192)]      # served from the page cache
    s = session(**t)
    assert s.rows("SELECT total_ns, guest_service_ns, guest_queue_ns, host_fs_ns, host_queue_ns, "
                  "device_ns FROM latency_breakdown WHERE total_ns = 100") == [
        {"total_ns": 100, "guest_service_ns": 100, "guest_queue_ns": 0, "host_fs_ns": 0,
         "host_queue_ns": 0, "device_ns": 0}]
    assert s.rows("SELECT class, n, n_unended, total_ns, guest_service_ns, guest_queue_ns, "
                  "host_fs_ns, host_queue_ns, device_ns FROM latency_breakdown_summary") == [
        {"class": "read 4K", "n": 2, "n_unended": 0, "total_ns": 500.0, "guest_service_ns": 150.0,
         "guest_queue_ns": 5.0, "host_fs_ns": 100.0, "host_queue_ns": 5.0, "device_ns": 240.0}]


def test_latency_breakdown_has_no_parts_for_a_call_whose_request_was_not_seen_to_end():
    # a second direct read whose virtual-disk completion was lost (the
    # kernel ran no program for it): its parts would be the queue time
    # counted on top of the whole (a CI run's merged capture lost 44 in a
    # burst, and the mean parts came to 26 ns more than the mean total)
    t = direct_read_stack()
    t["vfs_events"] = t["vfs_events"] + [vfs(2000, 900, off=12288, f_flags=0o40000)]
    t["block_events"] = t["block_events"] + request(
        2100, 2110, 2800, VDISK, 4 * MiB + 12288, 4096, rq=3, bio=13)[:3] + request(
        2210, 2220, 2700, DISK, 100 * MiB + 4 * MiB + 12288, 4096, rq=4, bio=14)
    t["hostfs_events"] = t["hostfs_events"] + [hostfs(2200, 4 * MiB + 12288, 4096, source=3,
                                                      flags=1)]
    s = session(**t)
    assert s.rows("SELECT total_ns, ended, guest_service_ns, guest_queue_ns, host_fs_ns, "
                  "host_queue_ns, device_ns FROM latency_breakdown ORDER BY ended DESC") == [
        {"total_ns": 900, "ended": True, "guest_service_ns": 200, "guest_queue_ns": 10,
         "host_fs_ns": 200, "host_queue_ns": 10, "device_ns": 480},
        {"total_ns": 900, "ended": False, "guest_service_ns": None, "guest_queue_ns": None,
         "host_fs_ns": None, "host_queue_ns": None, "device_ns": None}]
    assert s.rows("SELECT n, n_unended, total_ns, guest_service_ns, guest_queue_ns, host_fs_ns, "
                  "host_queue_ns, device_ns FROM latency_breakdown_summary") == [
        {"n": 1, "n_unended": 1, "total_ns": 900.0, "guest_service_ns": 200.0,
         "guest_queue_ns": 10.0, "host_fs_ns": 200.0, "host_queue_ns": 10.0, "device_ns": 480.0}]
    # the report's table says how many it left out
    from rich.console import Console

    from nestrace.report.document import build
    from nestrace.report.terminal import render
    s.store = None
    rep = build(s, "c1")
    assert [(r["calls"], r["calls_unended"]) for r in rep["latency"]] == [(1, 1)]
    con = Console(record=True, width=200)
    render(rep, console=con)
    assert "Calls left out, a request they caused not seen to end (a lost completion): 1" \
        in " ".join(con.export_text().split())
    # and follow says it does not know where that call's time went
    from nestrace.report import follow
    io_id = s.rows("SELECT io_id FROM latency_breakdown WHERE NOT ended")[0]["io_id"]
    tree = s.follow_io("vfs", io_id, "c1")
    con = Console(record=True, width=200)
    follow.render("c1", "a read", tree, split=follow.breakdown(s, "c1", tree), console=con)
    assert "where the call's time went is not known" in con.export_text()


def test_report_says_where_an_app_ios_time_goes_by_class_in_size_order():
    from nestrace.report.document import build
    t = direct_read_stack()
    # calls served from the page cache, one per class, in no order (the
    # class names sort otherwise as strings: "read 64K" before "read 4K")
    t["vfs_events"] = t["vfs_events"] + [
        vfs(2000, 100, off=8192), vfs(3000, 10, ret=1024, req=1024, syscall=4),
        vfs(4000, 20, ret=1 << 20, req=1 << 20), vfs(5000, 30, ret=65536, req=65536),
        vfs(6000, 40, ret=512, req=512), vfs(7000, 50, syscall=4)]
    s = session(**t)
    s.store = None
    got = build(s, "c1")["latency"]
    assert [r["class"] for r in got] == ["read 512", "read 4K", "read 64K", "read >512K",
                                         "write 1K", "write 4K"]
    assert got[1] == {"class": "read 4K", "calls": 2, "calls_unended": 0, "total_ns": 500.0,
                      "guest_service_ns": 150.0,
                      "guest_queue_ns": 5.0, "host_fs_ns": 100.0, "host_queue_ns": 5.0,
                      "device_ns": 240.0}
    assert [(r["calls"], r["total_ns"]) for r in got] == [
        (1, 40.0), (2, 500.0), (1, 30.0), (1, 20.0), (1, 10.0), (1, 50.0)]


def test_base_levels_names_each_traced_device_with_its_machine():
    s = session()
    got = s.rows("SELECT level, dev, fs_type, size_sectors, machine FROM base_levels ORDER BY level")
    assert got == [
        {"level": "disk", "dev": DISK, "fs_type": "", "size_sectors": 1 << 21, "machine": "m1"},
        {"level": "hostfs", "dev": HOSTFS, "fs_type": "xfs", "size_sectors": 0, "machine": "m1"},
        {"level": "vdisk", "dev": VDISK, "fs_type": "", "size_sectors": 1 << 20, "machine": "m1"},
        {"level": "vfs", "dev": GUEST, "fs_type": "ext4", "size_sectors": 0, "machine": "m1"}]
