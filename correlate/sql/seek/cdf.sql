-- Module seek.cdf: seek-distance CDFs and offsets over time, for plots.
-- INCLUDE seek.distances
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE hostfs.io
-- INCLUDE disk.io
-- LATE: table macros, bound when created (~40 ms): a session creates them
-- when a query first names one.

-- CDF of seek distance for one level: x = the distance, normalized (|d| /
-- the device's or file's size: the seed figure's axis; NULL where the
-- size is unknown, as in an imported blktrace) or, with absolute, |d| in
-- bytes (block levels: sectors * 512); y = share of I/Os with distance <= x.
CREATE OR REPLACE MACRO seek_cdf_of(lvl, absolute) AS TABLE
  WITH d AS (
    SELECT capture_id, level,
           CASE WHEN NOT absolute THEN normalized
                WHEN level IN ('vdisk', 'disk') THEN abs_distance * 512.0
                ELSE abs_distance::DOUBLE END AS x
    FROM seek_distances WHERE level = lvl)
  SELECT capture_id, level, x, cume_dist() OVER (PARTITION BY capture_id, level ORDER BY x) AS y
  FROM d;

-- The normalized CDF (seek_cdf_of(lvl, false)).
CREATE OR REPLACE MACRO seek_cdf(lvl) AS TABLE SELECT * FROM seek_cdf_of(lvl, false);

-- A CDF thinned to at most n points per capture (for plotting).
CREATE OR REPLACE MACRO seek_cdf_points_of(lvl, n, absolute) AS TABLE
  WITH c AS (SELECT capture_id, level, x, max(y) AS y FROM seek_cdf_of(lvl, absolute) GROUP BY ALL),
  r AS (SELECT *, row_number() OVER (PARTITION BY capture_id ORDER BY x) AS i,
               count(*) OVER (PARTITION BY capture_id) AS m FROM c)
  SELECT capture_id, level, x, y FROM r
  WHERE m <= n OR i % ceil(m / n)::BIGINT = 0 OR i = m ORDER BY capture_id, x;

-- The normalized CDF thinned (seek_cdf_points_of(lvl, n, false)).
CREATE OR REPLACE MACRO seek_cdf_points(lvl, n) AS TABLE
  SELECT * FROM seek_cdf_points_of(lvl, n, false);

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
