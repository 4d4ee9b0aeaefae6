-- Module rmw.rmw: read-modify-write — partial writes that force a read of
-- the enclosing block below them.
-- INCLUDE map.ranges
-- INCLUDE links.links

-- (rmw as computed: `rmw` reads the rows `nestrace correlate` stored,
-- where it has been run, as for links)
CREATE OR REPLACE VIEW _rmw_computed AS
WITH gb AS (   -- each guest file system's block size, and its partition's
              -- bytes on the virtual disk (a capture may trace several; an
              -- overlay is the file system of its layers again)
  SELECT capture_id, block_size_bytes AS bs, coalesce(part_start_bytes, 0)::BIGINT AS lo,
         CASE WHEN size_sectors > 0 THEN (part_start_bytes + size_sectors * 512)::BIGINT
              ELSE 9223372036854775807 END AS hi,
         count(*) OVER (PARTITION BY capture_id) AS n
  FROM device_map WHERE level = 'vfs' AND coalesce(fs_type, '') <> 'overlay'),
-- guest hop: pieces of app writes on the virtual disk
gw AS (   -- (through the guest file's extents only: where the pieces
          -- lie in the image and on the host disk does not matter here)
  SELECT p.capture_id, p.io_id, p.ts_ns, p.end_ns, p.vs AS s, p.vt AS t, gb.bs
  FROM _map_vfs_ranges p JOIN gb ON gb.capture_id = p.capture_id
   -- (one file system: every write is its, as in stores that kept no partition)
   AND (gb.n = 1 OR p.vs >= gb.lo AND p.vs < gb.hi)
  WHERE p.op = 'write'),
gw_partial AS (   -- the partial head and tail blocks, in vdisk bytes
  SELECT capture_id, io_id, ts_ns, end_ns, bs, (s // bs) * bs AS blk_s FROM gw WHERE s % bs <> 0
  UNION
  SELECT capture_id, io_id, ts_ns, end_ns, bs, ((t - 1) // bs) * bs FROM gw WHERE t % bs <> 0),
-- each read of a partial block while the write was in flight, once per
-- write (a read of both partial blocks is one read).  Both sides cut into
-- 4 KiB blocks and ~1 ms spans (_ns_spans), so that the join pairs a write
-- only with the reads of its own blocks near it in time (on range and
-- time alone it paired every partial write with every read: 26 s for 128k
-- of each; on blocks alone, every write of a block with every read of it)
gw_blocks AS (   -- (two unnests in one list would be zipped, not crossed)
  SELECT *, unnest(_ns_spans(ts_ns, end_ns)) AS span
  FROM (SELECT capture_id, io_id, ts_ns, end_ns, bs, blk_s, unnest(_blocks(blk_s, bs)) AS blk
        FROM gw_partial)),
gr_blocks AS (
  SELECT capture_id, io_id, start_ns, c_ns, offset_bytes::BIGINT AS off, bytes::BIGINT AS bytes,
         unnest(_blocks(offset_bytes, bytes)) AS blk, (start_ns >> 20)::BIGINT AS span
  FROM vdisk_io WHERE op = 'read' AND bytes > 0),
g_reads AS (
  SELECT DISTINCT w.capture_id, w.io_id AS write_id, r.io_id AS read_id,
         r.bytes AS read_bytes, (r.c_ns - r.start_ns)::BIGINT AS read_ns
  FROM gr_blocks r JOIN gw_blocks w
    ON w.capture_id = r.capture_id AND w.blk = r.blk AND w.span = r.span
   AND r.off < w.blk_s + w.bs AND w.blk_s < r.off + r.bytes
   AND r.start_ns BETWEEN w.ts_ns AND w.end_ns),
g AS (
  SELECT w.capture_id, 'guest' AS hop, w.io_id AS write_id, w.bs, count(r.read_id) AS reads,
         coalesce(sum(r.read_bytes), 0) AS read_bytes, coalesce(sum(r.read_ns), 0) AS read_ns
  FROM (SELECT DISTINCT capture_id, io_id, bs FROM gw_partial) w
  LEFT JOIN g_reads r ON r.capture_id = w.capture_id AND r.write_id = w.io_id
  GROUP BY ALL),
-- host hop: virtual-disk writes on the image, 4 KiB host pages
hw AS (   -- (the image's pages are what counts, not its extents on disk)
  SELECT capture_id, io_id, start_ns, c_ns, s, t
  FROM _map_vdisk_pieces WHERE op = 'write' AND c_ns IS NOT NULL AND s IS NOT NULL),
hw_partial AS (
  SELECT capture_id, io_id, start_ns, c_ns, (s // 4096) * 4096 AS blk_s FROM hw WHERE s % 4096 <> 0
  UNION
  SELECT capture_id, io_id, start_ns, c_ns, ((t - 1) // 4096) * 4096 FROM hw WHERE t % 4096 <> 0),
-- the same for the host hop; a disk read is cut into pieces by the image's
-- extents: its bytes are the pieces' within the image, its time counted once
-- (joined on the image's 4 KiB pages, as the guest hop; a piece of a
-- compressed extent's data is a read of every page of the extent)
hr_pages AS (
  SELECT capture_id, io_id, start_ns, c_ns, image_offset_bytes, bytes::BIGINT AS bytes,
         unnest(_blocks(image_offset_bytes, image_bytes)) AS blk, (start_ns >> 20)::BIGINT AS span
  FROM _map_disk WHERE op = 'read' AND bytes > 0),
hw_spans AS (
  SELECT capture_id, io_id, start_ns, c_ns, blk_s // 4096 AS blk,
         unnest(_ns_spans(start_ns, c_ns)) AS span
  FROM hw_partial),
h_pieces AS (
  SELECT DISTINCT w.capture_id, w.io_id AS write_id, r.io_id AS read_id,
         r.image_offset_bytes, r.bytes, (r.c_ns - r.start_ns)::BIGINT AS ns
  FROM hr_pages r JOIN hw_spans w
    ON w.capture_id = r.capture_id AND w.blk = r.blk AND w.span = r.span
   AND r.start_ns BETWEEN w.start_ns AND w.c_ns),
h_reads AS (
  SELECT capture_id, write_id, read_id, sum(bytes) AS read_bytes, any_value(ns) AS read_ns
  FROM h_pieces GROUP BY ALL),
h AS (
  SELECT w.capture_id, 'host' AS hop, w.io_id AS write_id, 4096 AS bs, count(r.read_id) AS reads,
         coalesce(sum(r.read_bytes), 0) AS read_bytes, coalesce(sum(r.read_ns), 0) AS read_ns
  FROM (SELECT DISTINCT capture_id, io_id FROM hw_partial) w
  LEFT JOIN h_reads r ON r.capture_id = w.capture_id AND r.write_id = w.io_id
  GROUP BY ALL),
sizes AS (
  SELECT capture_id, 'guest' AS hop, io_id AS write_id, ret_bytes::BIGINT AS write_bytes FROM vfs_io
  UNION ALL SELECT capture_id, 'host', io_id, bytes::BIGINT FROM vdisk_io)
SELECT x.capture_id, x.hop, x.write_id, s.write_bytes, x.bs::INTEGER AS block_bytes,
       x.reads, x.read_bytes::BIGINT AS read_bytes, x.read_ns::BIGINT AS read_ns
FROM (SELECT * FROM g UNION ALL SELECT * FROM h) x
JOIN sizes s USING (capture_id, hop, write_id);

-- Writes at one level whose range, mapped to the level below, is not
-- aligned to that level's block, with the reads of the same aligned
-- blocks the level below did while the write was in flight.
--   hop guest: application writes -> guest FS block (vfs -> vdisk reads)
--   hop host:  virtual-disk writes -> host page (4 KiB) of the image
--              (vdisk -> disk reads, through the image's extents)
-- @column capture_id VARCHAR   capture
-- @column hop VARCHAR          guest or host
-- @column write_id UBIGINT     the partial write (vfs_io or vdisk_io row)
-- @column write_bytes BIGINT   its bytes
-- @column block_bytes INTEGER  block size it is not aligned to
-- @column reads BIGINT         reads below of its partial blocks while it was in flight
-- @column read_bytes BIGINT    bytes of those reads
-- @column read_ns BIGINT       time the reads took (sum of Q to C)
CREATE OR REPLACE VIEW rmw AS SELECT * FROM _rmw_computed;

-- RMW per hop: partial writes, how many caused reads, and what they cost.
-- @column capture_id VARCHAR   capture
-- @column hop VARCHAR          guest or host
-- @column partial_writes BIGINT writes not aligned to the block below
-- @column rmw_writes BIGINT    of those, writes that caused at least one read
-- @column reads BIGINT         reads caused
-- @column read_bytes BIGINT    bytes read
-- @column write_bytes BIGINT   bytes of the partial writes
-- @column read_per_write DOUBLE reads / partial writes
-- @column extra_ns BIGINT      total time of the reads (extra latency)
CREATE OR REPLACE VIEW rmw_summary AS
SELECT capture_id, hop, count(*) AS partial_writes, count(*) FILTER (WHERE reads > 0) AS rmw_writes,
       sum(reads)::BIGINT AS reads, sum(read_bytes)::BIGINT AS read_bytes,
       sum(write_bytes)::BIGINT AS write_bytes, sum(reads) / count(*) AS read_per_write,
       sum(read_ns)::BIGINT AS extra_ns
FROM rmw GROUP BY ALL;
