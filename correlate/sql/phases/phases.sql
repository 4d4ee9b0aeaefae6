-- Module phases.phases: btt request phases per device.
-- INCLUDE block.requests
-- INCLUDE codes.tables

-- Bios merged into an existing request (back or front merge): Q2M, and
-- never counted as requests of their own.
-- @column capture_id VARCHAR  capture
-- @column level VARCHAR       vdisk or disk
-- @column dev UINTEGER        kernel dev_t
-- @column bio_id UBIGINT      merged bio
-- @column q_ns UBIGINT        queue time
-- @column m_ns UBIGINT        merge time
-- @column q2m_ns BIGINT       M - Q
-- @column bytes UBIGINT       bio size
-- @column front BOOLEAN       front merge (else back merge)
CREATE OR REPLACE VIEW phases_merges AS
WITH m AS (SELECT capture_id, dev, bio_id, ts_ns AS m_ns, nr_sectors, action
           FROM block_events
           WHERE action IN (_block_action('backmerge'), _block_action('frontmerge'))),
     -- only the Qs of merged bios: the ASOF join then sorts a few rows,
     -- not every Q of the capture
     q AS (SELECT capture_id, dev, bio_id, ts_ns AS q_ns FROM block_events
           WHERE action = _block_action('q') AND bio_id IN (SELECT bio_id FROM m))
SELECT m.capture_id, l.level, m.dev, m.bio_id, q.q_ns, m.m_ns,
       m.m_ns::BIGINT - q.q_ns::BIGINT AS q2m_ns, m.nr_sectors::UBIGINT * 512 AS bytes,
       m.action = _block_action('frontmerge') AS front
FROM m ASOF LEFT JOIN q ON q.capture_id = m.capture_id AND q.dev = m.dev
                       AND q.bio_id = m.bio_id AND m.m_ns >= q.q_ns
JOIN base_levels l ON l.capture_id = m.capture_id AND l.dev = m.dev
                  AND l.level IN ('vdisk', 'disk')
UNION ALL   -- --per-request: each merged bio's record carries its Q
SELECT r.capture_id, l.level, r.dev, r.bio_id, nullif(r.q_ns, 0), r.ts_ns,
       r.ts_ns::BIGINT - nullif(r.q_ns, 0)::BIGINT, r.nr_sectors::UBIGINT * 512,
       r.action = _block_action('frontmerge')
FROM block_request_records r
JOIN base_levels l ON l.capture_id = r.capture_id AND l.dev = r.dev
                  AND l.level IN ('vdisk', 'disk')
WHERE r.action IN (_block_action('backmerge'), _block_action('frontmerge'));

-- Each request's phases, one row per phase it has, and each merged bio's Q2M.
CREATE OR REPLACE VIEW _phases_long AS
UNPIVOT (SELECT capture_id, level, dev, q2g_ns AS q2g, g2i_ns AS g2i, i2d_ns AS i2d,
                d2c_ns AS d2c, q2c_ns AS q2c FROM block_requests)
ON q2g, g2i, i2d, d2c, q2c INTO NAME phase VALUE ns
UNION ALL
SELECT capture_id, level, dev, 'q2m', q2m_ns FROM phases_merges WHERE q2m_ns IS NOT NULL;

-- min/avg/median/p99/max of each btt phase per device (one row per phase).
-- Where btt counts otherwise: it counts a bio merged into a request in
-- D2C and Q2C too (the request's D and C, the bio's own Q), and leaves
-- out requests of no data (flushes); here D2C and Q2C are the requests',
-- flushes included.  On a file without merges or flushes the two agree
-- to the ns (tests/importers/test_btt.py, with btt on real files).
-- @column capture_id VARCHAR  capture
-- @column level VARCHAR       vdisk or disk
-- @column dev UINTEGER        kernel dev_t
-- @column phase VARCHAR       q2g, g2i, i2d, d2c, q2c or q2m
-- @column n BIGINT            requests (bios for q2m) with this phase
-- @column min_ns BIGINT       minimum
-- @column avg_ns DOUBLE       mean
-- @column median_ns DOUBLE    median
-- @column p99_ns DOUBLE       99th percentile
-- @column max_ns BIGINT       maximum
CREATE OR REPLACE VIEW phases_stats AS
WITH agg AS (   -- both quantiles from one sort
  SELECT capture_id, level, dev, phase, count(*) AS n, min(ns)::BIGINT AS min_ns,
         avg(ns)::DOUBLE AS avg_ns, quantile_cont(ns, [0.5, 0.99]) AS q, max(ns)::BIGINT AS max_ns
  FROM _phases_long GROUP BY ALL)
SELECT capture_id, level, dev, phase, n, min_ns, avg_ns, q[1]::DOUBLE AS median_ns,
       q[2]::DOUBLE AS p99_ns, max_ns
FROM agg;

-- The same per level: all the level's devices together (a btrfs host on
-- several disks; `nestrace report` gives these).
-- @column capture_id VARCHAR  capture
-- @column level VARCHAR       vdisk or disk
-- @column devices BIGINT      devices of the level with this phase
-- @column phase VARCHAR       q2g, g2i, i2d, d2c, q2c or q2m
-- @column n BIGINT            requests (bios for q2m) with this phase
-- @column min_ns BIGINT       minimum
-- @column avg_ns DOUBLE       mean
-- @column median_ns DOUBLE    median
-- @column p99_ns DOUBLE       99th percentile
-- @column max_ns BIGINT       maximum
CREATE OR REPLACE VIEW phases_level_stats AS
WITH agg AS (
  SELECT capture_id, level, phase, count(DISTINCT dev) AS devices, count(*) AS n,
         min(ns)::BIGINT AS min_ns, avg(ns)::DOUBLE AS avg_ns, quantile_cont(ns, [0.5, 0.99]) AS q,
         max(ns)::BIGINT AS max_ns
  FROM _phases_long GROUP BY ALL)
SELECT capture_id, level, devices, phase, n, min_ns, avg_ns, q[1]::DOUBLE AS median_ns,
       q[2]::DOUBLE AS p99_ns, max_ns
FROM agg;
