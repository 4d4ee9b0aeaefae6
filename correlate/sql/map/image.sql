-- Module map.image: where each virtual-disk byte is in the disk image file.
-- INCLUDE vdisk.io
-- INCLUDE hostfs.io
-- INCLUDE util.blocks

-- The virtual disk in its image file, as extents.  A raw image holds
-- byte b of the disk at b + lo_offset (one extent, the loop device's
-- offset or 0); a qcow2, qcow, sparse vmdk, vdi, vhdx, vpc, qed, parallels or luks image where its cluster map
-- (of grains, of blocks) says, as read by `record --side host` (the map at
-- capture end, else the one at start), and between its extents the
-- stretches with no place in the file (image_offset_bytes NULL):
-- unallocated, all-zero or compressed clusters, which the hypervisor
-- answers without reading the file there.
-- A qcow2 image with a backing file (or a vmdk snapshot, with its parent)
-- reads the clusters it has not allocated from that file (raw, or an image
-- of its own, with its own backing file): those extents are in that file
-- (image_ino).  A vmdk whose descriptor is a file of its own holds no byte
-- of the disk: its extents are in its extent files.
-- @column capture_id VARCHAR          capture
-- @column vdisk_offset_bytes UBIGINT  byte offset on the virtual disk where the extent starts
-- @column image_offset_bytes UBIGINT  byte offset in the image file where it starts (NULL: none)
-- @column length_bytes UBIGINT        extent length
-- @column source VARCHAR              raw, or the format and the map's snapshot: qcow2_end, qcow2_start, vmdk_end, vdi_start, ...
-- @column image_ino UBIGINT           inode of the file the extent is in: the image, or a file of its backing chain (NULL: none)
CREATE OR REPLACE VIEW map_vdisk_image AS
WITH vd AS (
  SELECT capture_id, coalesce(backing_format, 'raw') AS fmt, backing_offset_bytes,
         size_sectors * 512 AS size_bytes, backing_ino
  FROM device_map WHERE level = 'vdisk'),
q AS (
  SELECT e.capture_id, e.phase, e.logical_bytes, e.physical_bytes, e.length_bytes, e.ino
  FROM extent_maps e SEMI JOIN vd ON vd.capture_id = e.capture_id AND vd.fmt <> 'raw'
  WHERE e.role = 'vdisk_image'),
best AS (
  SELECT capture_id, CASE WHEN bool_or(phase = 'end') THEN 'end' ELSE 'start' END AS phase
  FROM q GROUP BY capture_id),
x AS (
  SELECT vd.capture_id, q.logical_bytes, q.physical_bytes, q.length_bytes, q.ino,
         vd.fmt || '_' || coalesce(best.phase, 'start') AS source, vd.size_bytes
  FROM vd LEFT JOIN best USING (capture_id)
  LEFT JOIN q ON q.capture_id = vd.capture_id AND q.phase = best.phase
  WHERE vd.fmt <> 'raw'),
gaps AS (   -- before each extent, and after the last one to the disk's end
  SELECT capture_id, source,
         coalesce(lag(logical_bytes + length_bytes) OVER w, 0) AS gs, logical_bytes AS ge
  FROM x WHERE logical_bytes IS NOT NULL
  WINDOW w AS (PARTITION BY capture_id ORDER BY logical_bytes)
  UNION ALL
  SELECT capture_id, any_value(source), coalesce(max(logical_bytes + length_bytes), 0),
         greatest(any_value(size_bytes), coalesce(max(logical_bytes + length_bytes), 0))
  FROM x GROUP BY capture_id)
SELECT capture_id, logical_bytes AS vdisk_offset_bytes, physical_bytes AS image_offset_bytes,
       length_bytes, source, ino AS image_ino
FROM x WHERE logical_bytes IS NOT NULL
UNION ALL
SELECT capture_id, gs::UBIGINT, NULL::UBIGINT, (ge - gs)::UBIGINT, source, NULL::UBIGINT
FROM gaps WHERE ge > gs
UNION ALL
SELECT capture_id, 0::UBIGINT, coalesce(backing_offset_bytes, 0),
       CASE WHEN size_bytes > 0 THEN size_bytes ELSE 1::UBIGINT << 62 END, 'raw', backing_ino
FROM vd WHERE fmt = 'raw';

-- Mapped images split into 16 MiB buckets, so that a range finds its
-- extents by an equi-join on the bucket, not by comparing every extent.
-- (delta: into image bytes, _base_image_files' space)
CREATE OR REPLACE VIEW _map_image_buckets AS
SELECT m.capture_id, m.vdisk_offset_bytes::BIGINT AS lo,
       (m.vdisk_offset_bytes + m.length_bytes)::BIGINT AS hi,
       m.image_offset_bytes::BIGINT + f.shift - m.vdisk_offset_bytes::BIGINT AS delta,
       unnest(range((m.vdisk_offset_bytes >> 24)::BIGINT,
                    (((m.vdisk_offset_bytes + m.length_bytes - 1) >> 24) + 1)::BIGINT)) AS bkt
FROM map_vdisk_image m
LEFT JOIN _base_image_files f ON f.capture_id = m.capture_id AND f.ino = m.image_ino
WHERE m.source <> 'raw';

CREATE OR REPLACE VIEW _map_image_raw AS
SELECT capture_id, vdisk_offset_bytes::BIGINT AS lo,
       (vdisk_offset_bytes + length_bytes)::BIGINT AS hi,
       image_offset_bytes::BIGINT - vdisk_offset_bytes::BIGINT AS delta
FROM map_vdisk_image WHERE source = 'raw';   -- (the image itself: at 0)

-- 16 MiB buckets a byte range [s, t) touches.
CREATE OR REPLACE MACRO _map_buckets(s, t) AS range((s >> 24)::BIGINT, (((t - 1) >> 24) + 1)::BIGINT);

-- The rows of view `t` (capture_id, and a virtual-disk byte range
-- [vs, vt), plus any columns) carried into the image file, in pieces: one
-- for a raw image, one per run of contiguous clusters for the others.
-- Each row gains [ps, pt), the piece on the virtual disk, and
-- idelta, what carries it into the image (NULL where the image has no
-- place for it).
CREATE OR REPLACE MACRO _map_into_image(t) AS TABLE
SELECT r.*, greatest(r.vs, m.lo) AS ps, least(r.vt, m.hi) AS pt, m.delta AS idelta
FROM query_table(t) r
JOIN _map_image_raw m ON m.capture_id = r.capture_id AND m.lo < r.vt AND r.vs < m.hi
UNION ALL
SELECT r.* EXCLUDE (bkt), greatest(r.vs, b.lo), least(r.vt, b.hi), b.delta
FROM (SELECT *, unnest(_map_buckets(vs, vt)) AS bkt FROM query_table(t)
      WHERE capture_id NOT IN (SELECT capture_id FROM _map_image_raw)) r
JOIN _map_image_buckets b ON b.capture_id = r.capture_id AND b.bkt = r.bkt
 AND b.lo < r.vt AND r.vs < b.hi
 AND greatest(r.vs, b.lo) >> 24 = b.bkt;   -- once, in the bucket the piece starts in

-- (req_op: a write-zeroes request, 9, is op write, and the loop device
-- turns it into an fallocate of the image: links needs to know)
CREATE OR REPLACE VIEW _map_vdisk_ranges AS
SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, req_op, offset_bytes::BIGINT AS vs,
       (offset_bytes + bytes)::BIGINT AS vt
FROM vdisk_io WHERE bytes > 0;

-- Each virtual-disk request's byte range in the image file, in pieces.
-- vdisk_s is where the piece starts on the virtual disk, s and t where it
-- starts and ends in the image (image bytes: a backing file's at its
-- shift, _base_image_files).
CREATE OR REPLACE VIEW _map_vdisk_pieces AS
SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, req_op, ps AS vdisk_s, ps + idelta AS s,
       pt + idelta AS t
FROM _map_into_image('_map_vdisk_ranges');

-- The image's cluster size, for captures with its cluster map at start
-- and at end (`record --side host` reads both).
CREATE OR REPLACE VIEW _map_image_cluster AS
SELECT capture_id, max(cluster_bytes)::BIGINT AS cs FROM extent_maps
WHERE role = 'vdisk_image' AND cluster_bytes > 0 GROUP BY capture_id
HAVING bool_or(phase = 'start') AND bool_or(phase = 'end');

-- The cluster map at the start of those captures: [lo, hi) on the
-- virtual disk, delta into image bytes (_base_image_files).
CREATE OR REPLACE VIEW _map_image_start AS
SELECT e.capture_id, e.logical_bytes::BIGINT AS lo, (e.logical_bytes + e.length_bytes)::BIGINT AS hi,
       e.physical_bytes::BIGINT + coalesce(f.shift, 0) - e.logical_bytes::BIGINT AS delta
FROM extent_maps e
LEFT JOIN _base_image_files f ON f.capture_id = e.capture_id AND f.ino = e.ino
WHERE e.role = 'vdisk_image' AND e.phase = 'start'
  AND e.capture_id IN (SELECT capture_id FROM _map_image_cluster);

-- The virtual-disk write pieces of relation `pieces` (as
-- _map_vdisk_pieces, plus cs: the image's cluster size, NULL where the
-- cluster map is not known at start and end) cut at the image's clusters:
-- c the cluster's start, [vs, vt) the write's part of it, idelta into
-- image bytes through the map at the end; allocated: the cluster was not
-- there at the start (this write allocated it, or one before it in the
-- capture): it was in a backing file, or nowhere.
CREATE OR REPLACE MACRO _map_write_clusters(pieces) AS TABLE
WITH k AS (
  SELECT capture_id, io_id, start_ns, done_by_ns, cs, vdisk_s AS vs, vdisk_s + (t - s) AS vt,
         s - vdisk_s AS idelta,
         unnest(range(vdisk_s // cs, (vdisk_s + (t - s) + cs - 1) // cs)) * cs AS c
  FROM query_table(pieces) WHERE op = 'write' AND cs IS NOT NULL),
kept AS (   -- clusters in the same place at the start
  SELECT DISTINCT k.capture_id, k.c, k.idelta FROM k JOIN _map_image_start m
    ON m.capture_id = k.capture_id AND m.lo <= k.c AND k.c + k.cs <= m.hi AND m.delta = k.idelta)
SELECT k.capture_id, k.io_id, k.start_ns, k.done_by_ns, k.cs, k.c, greatest(k.vs, k.c) AS vs,
       least(k.vt, k.c + k.cs) AS vt, k.idelta, kept.c IS NULL AS allocated
FROM k LEFT JOIN kept USING (capture_id, c, idelta);

-- Where a qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks image keeps its own tables (header, L1, L2,
-- refcounts; grain directories and tables; block map; BAT), at capture start
-- or end: the hypervisor's accesses there serve no guest request byte for
-- byte.
CREATE OR REPLACE VIEW _map_image_metadata AS
SELECT DISTINCT e.capture_id, e.logical_bytes::BIGINT + coalesce(f.shift, 0) AS lo,
       (e.logical_bytes + e.length_bytes)::BIGINT + coalesce(f.shift, 0) AS hi
FROM extent_maps e LEFT JOIN _base_image_files f ON f.capture_id = e.capture_id AND f.ino = e.ino
WHERE e.role = 'image_metadata';

-- Host-FS accesses in image bytes (_base_image_files): off, stop.
CREATE OR REPLACE VIEW _map_hostfs_io AS
SELECT h.*, h.offset_bytes + coalesce(f.shift, 0) AS off,
       h.offset_bytes + coalesce(f.shift, 0) + h.bytes::BIGINT AS stop
FROM hostfs_io h LEFT JOIN _base_image_files f ON f.capture_id = h.capture_id AND f.ino = h.ino;

-- Host-FS accesses to the image that touch those tables.
CREATE OR REPLACE VIEW _map_image_metadata_io AS
WITH h AS NOT MATERIALIZED (SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, off AS lo, stop AS hi,
                  capture_id, io_id FROM _map_hostfs_io),
m AS (SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, lo, hi FROM _map_image_metadata)
SELECT DISTINCT capture_id, io_id FROM _overlaps('h', 'm');
