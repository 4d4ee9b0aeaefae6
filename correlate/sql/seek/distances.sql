-- Module seek.distances: seek distances per level, in issue order.
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE disk.io
-- INCLUDE hostfs.io

-- One row per I/O after the first of its stream: the distance from the end
-- of the previous I/O to the start of this one.  Block levels: the
-- dispatch (D) stream of each device, in sectors, normalized by the device
-- size.  vfs: per file, hostfs: per image file, in bytes, normalized by the
-- file's largest offset seen.
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vfs, vdisk, hostfs or disk
-- @column dev UINTEGER         kernel dev_t
-- @column ino UBIGINT          file (vfs, hostfs); 0 for block levels
-- @column io_id UBIGINT        the I/O (row of the level's view)
-- @column ts_ns UBIGINT        issue time
-- @column op VARCHAR           read, write
-- @column distance BIGINT      start - previous end: sectors (block levels) or bytes (vfs, hostfs)
-- @column abs_distance BIGINT  |distance|
-- @column normalized DOUBLE    |distance| / stream size (device sectors, or file bytes)
-- @column sequential BOOLEAN   distance = 0
CREATE OR REPLACE VIEW seek_distances AS
WITH b AS (   -- each branch orders its own streams: a lag per branch sorts
              -- only its own rows (1.5x faster than one over their union)
  -- (by the device's number: a short sort key, _base_block_devs)
  SELECT b.capture_id, b.level, b.dev, 0::UBIGINT AS ino, b.io_id, b.ts_ns, b.op,
         b.sector::BIGINT - lag((b.sector + b.nr_sectors)::BIGINT)
           OVER (PARTITION BY l.dk ORDER BY b.ts_ns, b.io_id) AS distance,
         l.size_sectors::DOUBLE AS size
  FROM block_requests b
  JOIN _base_block_devs l ON l.capture_id = b.capture_id AND l.dev = b.dev AND l.level = b.level
  WHERE b.op IN ('read', 'write') AND b.nr_sectors > 0),
v AS (
  SELECT capture_id, 'vfs' AS level, dev, ino, io_id, ts_ns, op,
         offset_bytes - lag(offset_bytes + ret_bytes) OVER w AS distance,
         max(offset_bytes + ret_bytes) OVER (PARTITION BY ino, dev, capture_id)::DOUBLE AS size
  FROM vfs_io WHERE op IN ('read', 'write') AND offset_bytes >= 0 AND ret_bytes > 0
  WINDOW w AS (PARTITION BY ino, dev, capture_id ORDER BY ts_ns, io_id)),
h AS (
  SELECT capture_id, 'hostfs' AS level, dev, ino, io_id, ts_ns, op,
         offset_bytes - lag(offset_bytes + bytes::BIGINT) OVER w AS distance,
         max(offset_bytes + bytes) OVER (PARTITION BY ino, dev, capture_id)::DOUBLE AS size
  FROM hostfs_io WHERE op IN ('read', 'write') AND bytes > 0
  WINDOW w AS (PARTITION BY ino, dev, capture_id ORDER BY ts_ns, io_id)),
d AS (SELECT * FROM b UNION ALL SELECT * FROM v UNION ALL SELECT * FROM h)
SELECT capture_id, level, dev, ino, io_id, ts_ns, op, distance, abs(distance) AS abs_distance,
       abs(distance) / nullif(size, 0) AS normalized, distance = 0 AS sequential
FROM d WHERE distance IS NOT NULL;

-- Per level: sequential fraction and seek quantiles.
-- @column capture_id VARCHAR      capture
-- @column level VARCHAR           vfs, vdisk, hostfs or disk
-- @column n BIGINT                distances
-- @column sequential_fraction DOUBLE share with distance 0
-- @column median_abs BIGINT       median |distance| (sectors or bytes)
-- @column p90_abs BIGINT          90th percentile |distance|
-- @column median_normalized DOUBLE median normalized distance
CREATE OR REPLACE VIEW seek_summary AS
SELECT capture_id, level, count(*) AS n, avg(sequential::INTEGER)::DOUBLE AS sequential_fraction,
       quantile_disc(abs_distance, 0.5)::BIGINT AS median_abs,
       quantile_disc(abs_distance, 0.9)::BIGINT AS p90_abs,
       quantile_cont(normalized, 0.5)::DOUBLE AS median_normalized
FROM seek_distances GROUP BY ALL;
