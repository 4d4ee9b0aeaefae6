-- Module map.image: where each virtual-disk byte is in the disk image file.
-- INCLUDE vdisk.io
-- INCLUDE hostfs.io

-- The virtual disk in its image file, as extents.  A raw image holds
-- byte b of the disk at b + lo_offset (one extent, the loop device's
-- offset or 0); a qcow2, sparse vmdk, vdi, vhdx or vpc image where its cluster map
-- (of grains, of blocks) says, as read by `record --side host` (the map at
-- capture end, else the one at start), and between its extents the
-- stretches with no place in the file (image_offset_bytes NULL):
-- unallocated, all-zero or compressed clusters, which the hypervisor
-- answers without reading the file there.
-- @column capture_id VARCHAR          capture
-- @column vdisk_offset_bytes UBIGINT  byte offset on the virtual disk where the extent starts
-- @column image_offset_bytes UBIGINT  byte offset in the image file where it starts (NULL: none)
-- @column length_bytes UBIGINT        extent length
-- @column source VARCHAR              raw, or the format and the map's snapshot: qcow2_end, qcow2_start, vmdk_end, vdi_start, ...
CREATE OR REPLACE VIEW map_vdisk_image AS
WITH vd AS (
  SELECT capture_id, coalesce(backing_format, 'raw') AS fmt, backing_offset_bytes,
         size_sectors * 512 AS size_bytes
  FROM device_map WHERE level = 'vdisk'),
q AS (
  SELECT e.capture_id, e.phase, e.logical_bytes, e.physical_bytes, e.length_bytes
  FROM extent_maps e SEMI JOIN vd ON vd.capture_id = e.capture_id AND vd.fmt <> 'raw'
  WHERE e.role = 'vdisk_image'),
best AS (
  SELECT capture_id, CASE WHEN bool_or(phase = 'end') THEN 'end' ELSE 'start' END AS phase
  FROM q GROUP BY capture_id),
x AS (
  SELECT vd.capture_id, q.logical_bytes, q.physical_bytes, q.length_bytes,
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
       length_bytes, source
FROM x WHERE logical_bytes IS NOT NULL
UNION ALL
SELECT capture_id, gs::UBIGINT, NULL::UBIGINT, (ge - gs)::UBIGINT, source FROM gaps WHERE ge > gs
UNION ALL
SELECT capture_id, 0::UBIGINT, coalesce(backing_offset_bytes, 0),
       CASE WHEN size_bytes > 0 THEN size_bytes ELSE 1::UBIGINT << 62 END, 'raw'
FROM vd WHERE fmt = 'raw';

-- Mapped images split into 16 MiB buckets, so that a range finds its
-- extents by an equi-join on the bucket, not by comparing every extent.
CREATE OR REPLACE VIEW _map_image_buckets AS
SELECT capture_id, vdisk_offset_bytes::BIGINT AS lo,
       (vdisk_offset_bytes + length_bytes)::BIGINT AS hi,
       image_offset_bytes::BIGINT - vdisk_offset_bytes::BIGINT AS delta,
       unnest(range((vdisk_offset_bytes >> 24)::BIGINT,
                    (((vdisk_offset_bytes + length_bytes - 1) >> 24) + 1)::BIGINT)) AS bkt
FROM map_vdisk_image WHERE source <> 'raw';

CREATE OR REPLACE VIEW _map_image_raw AS
SELECT capture_id, vdisk_offset_bytes::BIGINT AS lo,
       (vdisk_offset_bytes + length_bytes)::BIGINT AS hi,
       image_offset_bytes::BIGINT - vdisk_offset_bytes::BIGINT AS delta
FROM map_vdisk_image WHERE source = 'raw';

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
-- starts and ends in the image.
CREATE OR REPLACE VIEW _map_vdisk_pieces AS
SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, req_op, ps AS vdisk_s, ps + idelta AS s,
       pt + idelta AS t
FROM _map_into_image('_map_vdisk_ranges');

-- Where a qcow2, vmdk, vdi, vhdx or vpc image keeps its own tables (header, L1, L2,
-- refcounts; grain directories and tables; block map; BAT), at capture start
-- or end: the hypervisor's accesses there serve no guest request byte for
-- byte.
CREATE OR REPLACE VIEW _map_image_metadata AS
SELECT DISTINCT capture_id, logical_bytes::BIGINT AS lo, (logical_bytes + length_bytes)::BIGINT AS hi
FROM extent_maps WHERE role = 'image_metadata';

-- Host-FS accesses to the image that touch those tables.
CREATE OR REPLACE VIEW _map_image_metadata_io AS
SELECT DISTINCT h.capture_id, h.io_id
FROM hostfs_io h JOIN _map_image_metadata m
  ON m.capture_id = h.capture_id AND m.lo < h.offset_bytes + h.bytes AND h.offset_bytes < m.hi;
