"""What the capture tests (and the merge and VM tests) share: fio
workloads, the queries that trace each read through every level, overlays."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from conftest import (
    drop_caches,
    run_cli,
)

import nestrace

FIO_RANDREAD = ["--rw=randread", "--bs=4k", "--direct=1", "--size=64M", "--io_size=16M"]

# Every fio read followed down independently of the correlator's views
# (file offset -> guest extent -> virtual disk -> image -> image extent ->
# host disk), and whether each level shows a request covering it while the
# read was in flight ($err: a merged two-machine capture's clock error, for
# the host's levels).  {image_map}: (lo, ph, len, ino) rows carrying a virtual
# disk offset into the file it is read from (ino: the image, or a file of
# its backing chain): one identity row for a raw image (TRACE_THROUGH),
# QEMU's own map for a qcow2 or vmdk one.
TRACE_THROUGH_VIA = """
WITH r AS (SELECT * FROM vfs_io WHERE syscall = $syscall AND op = 'read'),
gm AS (SELECT * FROM extent_maps WHERE role = 'guest_file' AND phase = 'end'),
im AS (SELECT * FROM extent_maps WHERE role = 'image' AND phase = 'end'),
qm AS ({image_map}),
p0 AS (SELECT r.io_id, r.ts_ns, r.end_ns, r.bytes,
              gm.physical_bytes + (r.offset_bytes - gm.logical_bytes) AS vdisk_off
       FROM r JOIN gm ON gm.ino = r.ino AND r.offset_bytes >= gm.logical_bytes
                     AND r.offset_bytes < gm.logical_bytes + gm.length_bytes),
-- pieces in the image, and on the host disk (a read may span two clusters
-- or two image extents that are apart)
p1 AS (SELECT p0.*, qm.ino, qm.ph + (greatest(p0.vdisk_off, qm.lo) - qm.lo) AS image_off,
              least(p0.vdisk_off + p0.bytes, qm.lo + qm.len) - greatest(p0.vdisk_off, qm.lo) AS n
       FROM p0 JOIN qm ON qm.lo < p0.vdisk_off + p0.bytes AND p0.vdisk_off < qm.lo + qm.len),
p AS (SELECT p1.*, im.physical_bytes + (greatest(p1.image_off, im.logical_bytes)
                                         - im.logical_bytes) AS disk_off,
             least(p1.image_off + p1.n, im.logical_bytes + im.length_bytes)
               - greatest(p1.image_off, im.logical_bytes) AS dn
      FROM p1 JOIN im ON im.ino = p1.ino AND im.logical_bytes < p1.image_off + p1.n
                     AND p1.image_off < im.logical_bytes + im.length_bytes),
v AS (SELECT io_id, EXISTS (SELECT 1 FROM vdisk_io v WHERE v.op = 'read'
        AND v.offset_bytes <= p0.vdisk_off AND p0.vdisk_off + p0.bytes <= v.offset_bytes + v.bytes
        AND v.ts_ns BETWEEN p0.ts_ns AND p0.end_ns) AS ok FROM p0),
-- below the guest, each 512-byte sector of a piece read in flight (QEMU
-- cuts a vmdk read at each grain's end even where the next grain follows
-- in the file: two accesses then cover one piece)
h AS (SELECT io_id, EXISTS (SELECT 1 FROM hostfs_io h WHERE h.op = 'read' AND h.ino = p1.ino
        AND h.offset_bytes <= p1.s AND p1.s + 512 <= h.offset_bytes + h.bytes
        AND h.ts_ns BETWEEN p1.ts_ns - $err AND p1.end_ns + $err) AS ok
      FROM (SELECT io_id, ts_ns, end_ns, ino,
                   unnest(range(image_off::BIGINT, (image_off + n)::BIGINT, 512)) AS s
            FROM p1) p1),
d AS (SELECT io_id, EXISTS (SELECT 1 FROM disk_io d WHERE d.op = 'read'
        AND d.offset_bytes <= p.s AND p.s + 512 <= d.offset_bytes + d.bytes
        AND d.ts_ns BETWEEN p.ts_ns - $err AND p.end_ns + $err) AS ok
      FROM (SELECT io_id, ts_ns, end_ns, unnest(range(disk_off::BIGINT, (disk_off + dn)::BIGINT, 512)) AS s
            FROM p) p)
SELECT (SELECT count(DISTINCT io_id) FROM p) AS mapped,
       (SELECT count(*) FROM (SELECT io_id FROM v GROUP BY 1 HAVING bool_and(ok))) AS vdisk,
       (SELECT count(*) FROM (SELECT io_id FROM h GROUP BY 1 HAVING bool_and(ok))) AS hostfs,
       (SELECT count(*) FROM (SELECT io_id FROM d GROUP BY 1 HAVING bool_and(ok))) AS disk
"""
TRACE_THROUGH = TRACE_THROUGH_VIA.replace(
    "{image_map}", "SELECT 0::UBIGINT AS lo, 0::UBIGINT AS ph, 1::UBIGINT << 62 AS len, "
                   "(SELECT any_value(backing_ino) FROM device_map WHERE level = 'vdisk') AS ino")
# The same through the correlator's own map (map_vfs, which adds
# partition starts): each read's pieces (a read crossing an extent's end
# is two) and those a request or access of each level covers in flight.
TRACE_THROUGH_MAPPED = """
SELECT count(DISTINCT io_id) AS reads, count(*) AS pieces,
  count(*) FILTER (WHERE EXISTS (SELECT 1 FROM vdisk_io v WHERE v.op = 'read'
    AND v.offset_bytes <= m.vdisk_offset_bytes
    AND m.vdisk_offset_bytes + m.bytes <= v.offset_bytes + v.bytes
    AND v.ts_ns BETWEEN m.ts_ns AND m.end_ns)) AS vdisk,
  count(*) FILTER (WHERE EXISTS (SELECT 1 FROM hostfs_io h WHERE h.op = 'read'
    AND h.offset_bytes <= m.image_offset_bytes
    AND m.image_offset_bytes + m.bytes <= h.offset_bytes + h.bytes
    AND h.ts_ns BETWEEN m.ts_ns - $err AND m.end_ns + $err)) AS hostfs,
  count(*) FILTER (WHERE EXISTS (SELECT 1 FROM disk_io d WHERE d.op = 'read'
    AND d.offset_bytes <= m.disk_offset_bytes
    AND m.disk_offset_bytes + m.bytes <= d.offset_bytes + d.bytes
    AND d.ts_ns BETWEEN m.ts_ns - $err AND m.end_ns + $err)) AS disk
FROM map_vfs m WHERE m.op = 'read'"""


def fio_log_offsets(path: Path, op: str = "read") -> list[int]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()   # iolog v3: time file action offset length
        if len(parts) >= 4 and parts[-3] == op:
            out.append(int(parts[-2]))
    return out


def record_fio(lab, store: Path, tmp_path: Path, *fio_args: str, extra=(),
               log_op: str = "read") -> tuple:
    """Lay the file out, then record the fio job; return (session, the
    offsets of its `log_op`s, cli result)."""
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    drop_caches(lab)
    log = tmp_path / "fio.iolog"
    cmd = ["fio", "--name=t", f"--directory={lab.mount}", "--ioengine=psync",
           "--output=/dev/null", f"--write_iolog={log}", *fio_args]
    r = run_cli("record", "-o", str(store), "--stack", lab.mount, *extra, "--", *cmd)
    return nestrace.open(store), fio_log_offsets(log, log_op), r


def record_python(lab, store: Path, prog: str, *args: str, extra=()):
    """Record a Python program (run with args) on the lab's stack; return a
    session on the store."""
    run_cli("record", "-o", str(store), "--stack", lab.mount, *extra, "--", sys.executable, "-c",
            prog, *args)
    return nestrace.open(store)


def assert_traced_through(s, offsets: list[int], syscall: str = "pread64") -> None:
    assert len(offsets) == 4096
    vfs = s.rows("SELECT offset_bytes, ret_bytes FROM vfs_io WHERE syscall = ?", [syscall])
    assert sorted(r["offset_bytes"] for r in vfs) == sorted(offsets)
    assert all(r["ret_bytes"] == 4096 for r in vfs)
    got = s.con.execute(TRACE_THROUGH, {"syscall": syscall, "err": 0}).fetchone()
    got = dict(zip(("mapped", "vdisk", "hostfs", "disk"), got))
    assert got == {"mapped": 4096, "vdisk": 4096, "hostfs": 4096, "disk": 4096}, got
    lost = s.rows("SELECT sum(ringbuf_drops) AS drops, sum(seq_gaps) AS gaps FROM lost_events")[0]
    assert lost == {"drops": 0, "gaps": 0}
    assert_each_record_once(s)
    assert_chain(s)


KERNEL_TABLES = ("vfs_events", "block_events", "hostfs_events", "pagecache_events",
                 "mapping_events")


def assert_each_record_once(s) -> None:
    """Every (cpu, seq) is stored once: staged records are never handed over twice."""
    union = " UNION ALL ".join(f"SELECT cpu, seq FROM {t}" for t in KERNEL_TABLES)
    dup = s.rows(f"SELECT count(*) AS n FROM (SELECT cpu, seq FROM ({union}) "
                 "GROUP BY cpu, seq HAVING count(*) > 1)")[0]["n"]
    assert dup == 0


def _tied_to_vdisk_by_cause(s, lower_level):
    """Bytes of `lower_level` (hostfs or disk) tied 'sync' to a virtual-disk
    request, by that request's cause: 'app' (tied to a call) or the guest
    FS's own kind (journal, metadata: a `sync` anywhere on the machine, such
    as the other CI run's, commits the guest's journal mid-capture)."""
    return {r["cause"]: r["b"] for r in s.rows(
        "WITH up AS (SELECT lower_id, CASE WHEN bool_or(upper_id IS NOT NULL) THEN 'app' "
        "  ELSE string_agg(DISTINCT kind, ',') END AS cause FROM links "
        "  WHERE upper_level = 'vfs' AND lower_level = 'vdisk' GROUP BY ALL) "
        "SELECT up.cause, sum(l.bytes)::BIGINT AS b FROM links l JOIN up ON up.lower_id = l.upper_id "
        "WHERE l.upper_level = 'vdisk' AND l.lower_level = ? AND l.kind = 'sync' GROUP BY ALL",
        [lower_level])}


def assert_overlay_and_base_traced(s, base: str, overlay: Path) -> None:
    """The overlay and the ext4 file system of its layers, both traced:
    a device_map vfs row each, the overlay's backing_dev the other's."""
    b, o = (os.stat(p).st_dev for p in (base, overlay))
    assert s.rows("SELECT name, fs_type, dev, backing_dev FROM device_map "
                  "WHERE level = 'vfs' ORDER BY name") == [
        {"name": base, "fs_type": "ext4", "dev": (os.major(b) << 20) | os.minor(b),
         "backing_dev": 0},
        {"name": str(overlay), "fs_type": "overlay", "dev": (os.major(o) << 20) | os.minor(o),
         "backing_dev": (os.major(b) << 20) | os.minor(b)}]


@contextlib.contextmanager
def two_overlays(lab, tmp_path: Path):
    """Two overlays with their upper layers on the lab's guest FS: `merged`
    over ov/lower, which holds a 16 MiB file `f` (upper ov/u0), and `other`
    over a directory on another file system (upper ov/u1).  Yields (ov,
    merged, other, [their mount points]); unmounts what is still mounted."""
    ov = Path(lab.mount) / "ov"
    for d in ("lower", "u0", "w0", "u1", "w1"):
        (ov / d).mkdir(parents=True)
    subprocess.run(["fio", "--name=l", f"--filename={ov / 'lower' / 'f'}", "--rw=write",
                    "--bs=1M", "--size=16M", "--direct=1", "--output=/dev/null"], check=True)
    merged, other = tmp_path / "merged", tmp_path / "other"
    made = []
    try:
        for i, (mp, lower) in enumerate(((merged, ov / "lower"), (other, tmp_path / "l"))):
            mp.mkdir()
            lower.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={lower},upperdir={ov / f'u{i}'},workdir={ov / f'w{i}'}",
                            str(mp)], check=True)
            made.append(mp)
        yield ov, merged, other, made
    finally:
        for mp in reversed(made):
            if os.path.ismount(mp):
                subprocess.run(["umount", str(mp)], check=True)


def assert_chain(s) -> None:
    """The capture's four levels in chain order, and chain_io holding each
    level's I/Os once: the rows of its own view."""
    assert s.rows("SELECT DISTINCT position, level, below FROM chain_levels ORDER BY position") == [
        dict(position=1, level="vfs", below="vdisk"), dict(position=2, level="vdisk", below="hostfs"),
        dict(position=4, level="hostfs", below="disk"), dict(position=5, level="disk", below=None)]
    got = {r["level"]: r["n"] for r in s.rows("SELECT level, count(*) AS n FROM chain_io GROUP BY level")}
    assert got == {lv: s.rows(f"SELECT count(*) AS n FROM {lv}_io")[0]["n"]
                   for lv in ("vfs", "vdisk", "hostfs", "disk")}


def uncached_file(lab, mib: int) -> str:
    """A file of `mib` MiB of random bytes on the lab's guest FS, on its
    disk and in no page cache; its path."""
    path = f"{lab.mount}/f"
    subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"count={mib}",
                    "oflag=direct", "status=none"], check=True)
    drop_caches(lab)
    return path
