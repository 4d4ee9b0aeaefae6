"""A host file system on several disks (btrfs RAID profiles): where the
chunk tree puts each byte, checked on the raw devices, and captures where
the disk level is two devices."""
from __future__ import annotations

import mmap
import os
import subprocess
from pathlib import Path

import pytest
from conftest import drop_caches, loop_devices, run_cli

import nestrace
from nestrace.capture.extents import btrfs_chunks, btrfs_pieces, fiemap
from nestrace.capture.stack import btrfs_devices

pytestmark = pytest.mark.root


def _tag(block: int) -> bytes:
    """4 KiB naming its own block number."""
    return (b"blk%08d" % block) * 372 + b"\0" * 4


def _fio_capture(lab, tmp_path, *fio_args: str):
    """A session on a capture of one fio job (name t, in the lab's guest
    mount) on the lab stack."""
    store = tmp_path / "s"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "fio", "--name=t",
            f"--directory={lab.mount}", "--output=/dev/null", *fio_args)
    return nestrace.open(store)


@pytest.mark.parametrize("profile,disks", [("single", 1), ("dup", 1), ("raid0", 2), ("raid1", 2),
                                           ("raid10", 4), ("raid5", 3), ("raid6", 4),
                                           ("raid1c3", 3)])
def test_every_block_of_a_file_is_where_the_chunk_map_says_on_the_raw_disks(tmp_path, profile,
                                                                            disks):
    """32 MiB written block by block, each block naming itself; every piece
    btrfs_pieces gives (each copy, each stripe) is read back from its raw
    device with O_DIRECT and must hold the file's block there."""
    loops: list[str] = []
    mnt = tmp_path / "m"
    mnt.mkdir()
    before = loop_devices()
    try:
        for i in range(disks):
            f = tmp_path / f"d{i}"
            with open(f, "wb") as fh:
                fh.truncate(400 << 20)
            loops.append(subprocess.run(["losetup", "-f", "--show", str(f)], check=True,
                                        capture_output=True, text=True).stdout.strip())
        subprocess.run(["mkfs.btrfs", "-q", "-f", "-d", profile,
                        "-m", "raid1" if disks > 1 else "dup", *loops],
                       check=True, capture_output=True)
        subprocess.run(["mount", loops[0], str(mnt)], check=True)
        path = mnt / "f"
        blocks = 8192
        with open(path, "wb") as fh:
            for b in range(blocks):
                fh.write(_tag(b))
        chunks, devs = btrfs_chunks(loops[0], str(mnt)), btrfs_devices(str(mnt))
        assert sorted(bd.name for bd in devs.values()) == sorted(Path(x).name for x in loops)
        copies = {"single": 1, "dup": 2, "raid0": 1, "raid1": 2, "raid10": 2, "raid5": 1,
                  "raid6": 1, "raid1c3": 3}[profile]
        seen: dict[int, int] = {}
        per_dev: dict[int, int] = {}
        buf = mmap.mmap(-1, 4096)
        for lo, ph, ln, _fl in fiemap(str(path)):
            pieces = btrfs_pieces(chunks, ph, ln)
            assert pieces is not None, (lo, ph, ln)
            for plog, devid, poff, plen in pieces:
                per_dev[devid] = per_dev.get(devid, 0) + plen
                fd = os.open(f"/dev/{devs[devid].name}", os.O_RDONLY | os.O_DIRECT)
                try:
                    for off in range(0, plen, 4096):
                        block = (lo + plog - ph + off) // 4096
                        assert os.preadv(fd, [buf], poff + off) == 4096
                        assert buf[:] == _tag(block), (profile, devid, poff + off, block)
                        seen[block] = seen.get(block, 0) + 1
                finally:
                    os.close(fd)
        assert seen == {b: copies for b in range(blocks)}
        # striped and mirrored profiles spread the file over every disk
        assert len(per_dev) == disks, per_dev
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        for dev in loops:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
    assert loop_devices() <= before


@pytest.mark.parametrize("profile", ["raid1", "raid0"])
def test_a_host_on_two_disks_traces_both_and_ties_their_bytes_to_the_app(lab_factory, tmp_path,
                                                                         profile):
    """fio 4k randrw O_DIRECT in the guest, the image through the host page
    cache (--guest-dio off), the host btrfs on two disks.  Both disks are
    the disk level; raid1 writes every byte on each (2x the virtual disk's
    writes), raid0 once, spread over the two; links tie every disk byte
    but btrfs's own metadata and readahead to the virtual disk's requests."""
    lab = lab_factory("ext4", "btrfs", guest_dio="off", host_dio="on", host_disks=2,
                      host_profile=profile)
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    drop_caches(lab)
    s = _fio_capture(lab, tmp_path, "--ioengine=psync",
                      "--size=64M", "--rw=randrw", "--bs=4k", "--direct=1",
                      "--io_size=8M", "--end_fsync=1")
    disks = [r["dev"] for r in s.rows("SELECT dev FROM device_map WHERE level = 'disk' ORDER BY dev")]
    assert len(disks) == 2
    by_dev = {r["dev"]: r for r in s.rows(
        "SELECT dev, count(*) FILTER (WHERE op = 'write') AS writes, "
        "sum(bytes) FILTER (WHERE op = 'write') AS wbytes FROM disk_io GROUP BY dev")}
    assert set(by_dev) == set(disks) and all(r["writes"] > 50 for r in by_dev.values()), by_dev
    vdisk_w = s.rows("SELECT sum(bytes) AS b FROM vdisk_io WHERE op = 'write'")[0]["b"]
    disk_w = sum(r["wbytes"] for r in by_dev.values())
    # the disks' writes tied to the virtual disk's: each byte once per copy
    tied_w = s.rows("SELECT sum(l.bytes) AS b FROM links l JOIN disk_io d "
                    "ON d.capture_id = l.capture_id AND d.io_id = l.lower_id "
                    "WHERE l.lower_level = 'disk' AND l.upper_id IS NOT NULL "
                    "AND d.op = 'write'")[0]["b"]
    want = 2 if profile == "raid1" else 1
    assert want * 0.9 <= tied_w / vdisk_w <= want * 1.1, (tied_w, vdisk_w, disk_w)
    if profile == "raid1":   # each copy is the whole of what was written
        a, b = (by_dev[d]["wbytes"] for d in disks)
        assert 0.9 <= a / b <= 1.1, by_dev
    got = {r["level"]: r["fraction"] for r in s.rows("SELECT level, fraction FROM links_to_vfs")}
    assert got["vdisk"] >= 0.99, got
    # at the disks, btrfs's own metadata (mirrored too) and its readahead
    # are classified; every other byte is tied to the virtual disk's request
    kinds = {(r["kind"], r["tied"]): r["b"] for r in s.rows(
        "SELECT kind, upper_id IS NOT NULL AS tied, sum(bytes) AS b FROM links "
        "WHERE lower_level = 'disk' GROUP BY ALL")}
    untied = {k: b for (k, tied), b in kinds.items() if not tied}
    assert set(untied) <= {"metadata", "readahead", "journal"}, kinds
    tied = sum(b for (_, t), b in kinds.items() if t)
    assert tied >= 0.9 * disk_w, (kinds, disk_w)
    # every mapped piece of a disk request is on that request's own disk
    assert s.rows("SELECT count(*) AS n FROM map_disk m JOIN disk_io d USING (capture_id, io_id) "
                  "JOIN map_extents e ON e.capture_id = m.capture_id AND e.role = 'image' "
                  " AND m.image_offset_bytes >= e.logical_bytes "
                  " AND m.image_offset_bytes < e.logical_bytes + e.length_bytes "
                  " AND m.disk_offset_bytes::BIGINT - m.image_offset_bytes::BIGINT "
                  "     = e.physical_bytes::BIGINT - e.logical_bytes::BIGINT "
                  "WHERE e.disk_dev <> d.dev")[0]["n"] == 0


def _disk_writes_by_kind_only_metadata_untied(s) -> dict:
    """Host-disk write bytes by (links kind, tied to a vdisk request);
    asserts the only ones tied to none are btrfs's metadata."""
    kinds = {(r["kind"], r["tied"]): r["b"] for r in s.rows(
        "SELECT l.kind, l.upper_id IS NOT NULL AS tied, sum(l.bytes) AS b FROM links l "
        "JOIN disk_io d ON d.capture_id = l.capture_id AND d.io_id = l.lower_id "
        "WHERE l.lower_level = 'disk' AND d.op = 'write' GROUP BY ALL")}
    untied = {k for (k, tied) in kinds if not tied}
    assert untied <= {"metadata"}, kinds
    return kinds


def test_image_bytes_a_btrfs_host_placed_and_moved_during_the_capture_are_tied(lab_factory,
                                                                               tmp_path):
    """fio lays its file out and rewrites 16 KiB of it at random, all
    O_DIRECT and all traced, on a btrfs host mirrored on two disks: the
    layout's bytes reach the image's new extents, and each rewrite moves
    its 16 KiB to a new place (copy-on-write), so neither snapshot has the
    layout's first place of those.  btrfs's ordered extents (mapping
    events, mapped through the chunk tree: extent_maps phase events) do,
    and the disk writes there are tied to the virtual-disk write in flight.
    Before, 11 % of the disks' bytes were unattributed ('journal' by their
    flags: btrfs has none)."""
    lab = lab_factory("ext4", "btrfs", guest_dio="on", host_dio="on", host_disks=2,
                      host_profile="raid1")
    s = _fio_capture(lab, tmp_path, "--ioengine=psync",
                      "--size=32M", "--rw=randrw", "--bs=16k", "--direct=1",
                      "--io_size=8M")
    placed = {r["physical_dev"]: r["n"] for r in s.rows(
        "SELECT physical_dev, count(*) AS n FROM extent_maps WHERE role = 'image' "
        "AND phase = 'events' GROUP BY ALL")}
    disks = [r["dev"] for r in s.rows("SELECT dev FROM device_map WHERE level = 'disk'")]
    assert set(placed) == set(disks) and min(placed.values()) > 10, placed
    kinds = _disk_writes_by_kind_only_metadata_untied(s)
    tied = sum(b for (_, t), b in kinds.items() if t)
    assert tied >= 0.97 * sum(kinds.values()), kinds


def test_guest_file_bytes_a_btrfs_guest_placed_and_moved_during_the_capture_are_tied(lab_factory,
                                                                                   tmp_path):
    """The guest side of the same: on a btrfs guest, all traced, fio lays
    a file out (buffered, then fsync), the page cache is dropped, and fio
    writes 2 KiB at random with an fsync every 16 writes.  Each write
    first reads its 4 KiB page from where the layout (or the last rewrite)
    put it, and the write-back then moves the page (copy-on-write): the
    end snapshot has the new place only.  The guest's ordered extents,
    mapped through the guest's chunk tree (extent_maps role guest_file,
    phase events), give the old places: the page reads are
    read-modify-write of the write in flight.  Before, they were 'other'
    (9.6 % of the virtual disk's bytes in a `lab run` of fio randrw)."""
    lab = lab_factory("btrfs", "xfs", guest_dio="off", host_dio="on")
    store = tmp_path / "s"
    fio = f"fio --name=t --directory={lab.mount} --output=/dev/null --size=8M"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "sh", "-c",
            f"{fio} --rw=write --bs=1M --end_fsync=1 && echo 1 > /proc/sys/vm/drop_caches && "
            f"{fio} --ioengine=psync --rw=randwrite --bs=2k --io_size=2M --fsync=16")
    s = nestrace.open(store)
    assert s.rows("SELECT count(*) AS n FROM extent_maps WHERE role = 'guest_file' "
                  "AND phase = 'events'")[0]["n"] > 10
    kinds = _vdisk_kinds(s)
    reads = {k: b for k, b in kinds.items() if k[2] == "read"}
    assert reads.get(("rmw", True, "read"), 0) >= 0.95 * sum(reads.values()), kinds
    assert reads.get(("rmw", True, "read"), 0) >= 1 << 20, kinds
    untied_writes = {k: b for k, b in kinds.items() if k[2] == "write" and not k[1]}
    assert set(k[0] for k in untied_writes) <= {"metadata", "journal"}, kinds
    # btrfs's own metadata and its log tree (fsync) are the only writes no call explains
    data = sum(b for k, b in kinds.items() if k[2] == "write" and k[1])
    assert data >= 2 << 20, kinds


def _vdisk_kinds(s) -> dict:
    """Virtual-disk bytes by (links kind, tied, op), reads and writes."""
    return {(r["kind"], r["tied"], r["op"]): r["b"] for r in s.rows(
        "SELECT l.kind, l.upper_id IS NOT NULL AS tied, v.op, sum(l.bytes) AS b FROM links l "
        "JOIN vdisk_io v ON v.capture_id = l.capture_id AND v.io_id = l.lower_id "
        "WHERE l.lower_level = 'vdisk' AND v.op IN ('read', 'write') GROUP BY ALL")}


@pytest.mark.parametrize("how", ["record", "side-guest", "agent"])
def test_a_btrfs_guest_file_laid_out_before_the_capture_is_read_where_it_was_until_rewritten(
        lab_factory, tmp_path, how):
    """A btrfs guest, fio's file laid out before the capture (untraced), the
    page cache dropped; traced: 2 KiB randrw with an fsync every 16 writes.
    A read, or the page read of a 2 KiB write, before a rewrite moved its
    block reads where the start snapshot had it; the end snapshot has the
    new place.  Those places are carried too (_map_guest_freed): every
    virtual-disk read is tied, to its call (sync) or to a write (rmw).
    Before, 1.8 MiB of reads (17 % of the virtual disk's bytes) were
    'other'.  The same recorded three ways: `record` (both sides), `record
    --side guest` and the static agent's --guest-capture, imported: the
    guest side loads the page-cache and mapping hooks too (before, it
    recorded neither: no btrfs ordered extents, so the places a rewrite
    placed and moved again were lost, and write-back there was 'journal')."""
    lab = lab_factory("btrfs", "xfs", guest_dio="off", host_dio="on")
    fio = ["fio", "--name=t", f"--directory={lab.mount}", "--output=/dev/null", "--size=8M"]
    subprocess.run([*fio, "--rw=write", "--bs=1M", "--end_fsync=1"], check=True)
    drop_caches(lab)
    job = [*fio, "--ioengine=psync", "--rw=randrw", "--bs=2k", "--io_size=2M", "--fsync=16"]
    store = tmp_path / "s"
    if how == "agent":
        from nestrace._paths import agent_path
        d = tmp_path / "g"
        subprocess.run([str(agent_path()), "--guest", lab.mount, "--guest-capture", str(d), "--",
                        *job], check=True, capture_output=True)
        run_cli("import", str(d), "-o", str(store))
    else:
        run_cli("record", "-o", str(store), "--stack", lab.mount,
                *(["--side", "guest"] if how == "side-guest" else []), "--", *job)
    s = nestrace.open(store)
    n = s.rows("SELECT (SELECT count(*) FROM pagecache_events) AS pages, (SELECT count(*) FROM "
               "extent_maps WHERE role = 'guest_file' AND phase = 'events') AS placed")[0]
    assert n["pages"] > 100 and n["placed"] > 10, n
    kinds = _vdisk_kinds(s)
    reads = {k: b for k, b in kinds.items() if k[2] == "read"}
    assert sum(reads.values()) >= 1 << 20, kinds
    assert all(k[1] for k in reads), kinds
    assert reads.get(("rmw", True, "read"), 0) >= 1 << 20, kinds
    untied_writes = {k: b for k, b in kinds.items() if k[2] == "write" and not k[1]}
    assert set(k[0] for k in untied_writes) <= {"metadata"}, kinds
    # (fio wrote 1 MiB in 2 KiB writes: each page written back whole)
    assert sum(b for k, b in kinds.items() if k[2] == "write" and k[1]) >= 1 << 20, kinds


def test_write_back_a_btrfs_host_placed_and_moved_again_during_the_capture_is_tied(lab_factory,
                                                                                 tmp_path):
    """The image through the host's page cache on a btrfs host: fio lays a
    file out and reads and rewrites 2 KiB of it at random with an fsync
    every 16 writes, all traced.  The host writes each dirty page back to a new
    place (an ordered extent: a mapping event), and a later rewrite
    moves it on, so the end snapshot lacks the first place: the disk write
    there is the write-back of the virtual-disk writes of those bytes.
    Before, it was tied only while in flight with one (never, through the
    page cache): unattributed, and 'journal' by its REQ_SYNC (8.6 % of the
    disk's bytes in a `lab run` of fio 2 KiB randrw on an ext4 guest)."""
    lab = lab_factory("ext4", "btrfs", guest_dio="off", host_dio="on")
    s = _fio_capture(lab, tmp_path, "--ioengine=psync",
                      "--size=8M", "--rw=randrw", "--bs=2k", "--io_size=2M",
                      "--fsync=16")
    kinds = _disk_writes_by_kind_only_metadata_untied(s)
    assert kinds.get(("writeback", True), 0) >= 8 << 20, kinds   # (the layout, at least)


def test_pages_a_btrfs_guest_faults_in_from_where_a_rewrite_moved_them_are_the_faults(lab_factory,
                                                                                      tmp_path):
    """fio through a shared mapping on a btrfs guest (its layout, then 4
    KiB random loads and stores, an msync every 32), all traced.  A page
    is faulted in from where the layout or the last write-back put it,
    which the end snapshot no longer has once a later write-back moved
    it: the page-fault reads are carried there too (the guest's mapping
    events), and are `fault`, not `other` (half of them were, before)."""
    lab = lab_factory("btrfs", "xfs", guest_dio="off", host_dio="on")
    s = _fio_capture(lab, tmp_path, "--ioengine=mmap",
                      "--size=16M", "--rw=randrw", "--bs=4k", "--io_size=4M",
                      "--fsync=32")
    reads = {r["kind"]: r["b"] for r in s.rows(
        "SELECT l.kind, sum(l.bytes) AS b FROM links l "
        "JOIN vdisk_io v ON v.capture_id = l.capture_id AND v.io_id = l.lower_id "
        "WHERE l.lower_level = 'vdisk' AND v.op = 'read' GROUP BY ALL")}
    assert set(reads) <= {"fault", "metadata", "readahead"}, reads
    assert reads.get("fault", 0) >= 2 << 20, reads
