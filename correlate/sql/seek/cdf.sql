-- Module seek.cdf: seek-distance CDFs and offsets over time, for plots.
-- INCLUDE seek.distances
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE hostfs.io
-- INCLUDE disk.io
-- LATE: table macros, bound when created (~40 ms): a session creates them
-- when a query first names one.

-- CDF of normalized seek distance for one level: x = normalized distance,
-- y = share of I/Os with distance <= x (the seed figure's axes).
CREATE OR REPLACE MACRO seek_cdf(lvl) AS TABLE
  SELECT capture_id, level, normalized AS x,
         cume_dist() OVER (PARTITION BY capture_id, level ORDER BY normalized) AS y
  FROM seek_distances WHERE level = lvl;

-- The same CDF thinned to at most n points per capture (for plotting).
CREATE OR REPLACE MACRO seek_cdf_points(lvl, n) AS TABLE
  WITH c AS (SELECT capture_id, level, x, max(y) AS y FROM seek_cdf(lvl) GROUP BY ALL),
  r AS (SELECT *, row_number() OVER (PARTITION BY capture_id ORDER BY x) AS i,
               count(*) OVER (PARTITION BY capture_id) AS m FROM c)
  SELECT capture_id, level, x, y FROM r
  WHERE m <= n OR i % ceil(m / n)::BIGINT = 0 OR i = m ORDER BY capture_id, x;

-- Offsets over time per level (the blktrace "seekwatcher" view), sampled
-- to at most n I/Os per level and capture.
CREATE OR REPLACE MACRO seek_offsets_sample(n) AS TABLE
  WITH s AS (
    SELECT capture_id, level, ts_ns, offset_bytes::BIGINT AS offset_bytes, op FROM vfs_io
    WHERE op IN ('read', 'write') AND offset_bytes >= 0
    UNION ALL SELECT capture_id, level, ts_ns, offset_bytes::BIGINT, op FROM vdisk_io WHERE op IN ('read', 'write')
    UNION ALL SELECT capture_id, level, ts_ns, offset_bytes::BIGINT, op FROM hostfs_io WHERE op IN ('read', 'write')
    UNION ALL SELECT capture_id, level, ts_ns, offset_bytes::BIGINT, op FROM disk_io WHERE op IN ('read', 'write')),
  r AS (SELECT *, row_number() OVER (PARTITION BY capture_id, level ORDER BY hash(ts_ns, offset_bytes)) AS i
        FROM s)
  SELECT capture_id, level, ts_ns, offset_bytes, op FROM r WHERE i <= n ORDER BY level, ts_ns;
