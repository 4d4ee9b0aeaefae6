-- Module depth.outstanding: how many I/Os are in flight at each level
-- (vscsiStats' outstandingIOs, iostat's aqu-sz and %util), the time
-- between arrivals and the latency, per device.  Nesting changes queue
-- depth: a virtual disk kept 32 deep by the guest can reach the host disk
-- one request at a time, when the image is read through the host's page
-- cache.
-- INCLUDE vfs.io
-- INCLUDE block.requests

-- The devices whose queues are measured, each numbered (k: a short window
-- key, as _base_block_devs.dk): the guest file system (vfs) and the block
-- devices.  hostfs accesses have no end time: no depth there.
CREATE OR REPLACE VIEW _depth_devs AS
SELECT capture_id, level, dev,
       row_number() OVER (ORDER BY capture_id, level, dev)::UINTEGER AS k
FROM (SELECT DISTINCT capture_id, level, dev FROM base_levels
      WHERE level IN ('vfs', 'vdisk', 'disk'));

-- The I/Os of each measured device: when each arrived and was done.  vfs:
-- every file call, from entry (AIO, io_uring: submission) to exit (the
-- reaping io_getevents, the CQE).  Block levels: every dispatched request,
-- from dispatch (D) to completion (C); the device's queue, as vscsiStats
-- sees it.  ended: its end was seen.  An I/O whose end was not seen (a
-- call or request still in flight when the capture stopped, or a
-- completion lost: a burst of them, the kernel running no program,
-- once kept one disk 26 deep for a whole capture it served one at a
-- time) is counted in no I/O's depth; its end_ns is done_by_ns, if any
-- (the next use of its request id: when it was over at the latest).
CREATE OR REPLACE VIEW _depth_io AS
SELECT d.k, v.capture_id, v.level, v.dev, v.io_id, v.op, v.ts_ns AS arrive_ns,
       v.end_ns AS end_ns, v.duration_ns::BIGINT AS latency_ns, v.end_ns IS NOT NULL AS ended
FROM vfs_io v JOIN _depth_devs d USING (capture_id, level, dev)
UNION ALL
SELECT d.k, b.capture_id, b.level, b.dev, b.io_id, b.op, b.d_ns,
       coalesce(b.c_ns, b.done_by_ns), b.d2c_ns, b.c_ns IS NOT NULL
FROM block_requests b JOIN _depth_devs d USING (capture_id, level, dev)
WHERE b.d_ns IS NOT NULL;

-- Arrivals (+1; 0 for an I/O whose end was not seen), with the time
-- since the device's previous arrival, and ends (-1) of each device.
-- (The windows of this module run over all devices in k's order, not
-- PARTITION BY k: DuckDB 2.0's partitioned windows took 2 to 10 times as
-- long with 6 to 44 devices; see depth_summary.)
CREATE OR REPLACE VIEW _depth_ev AS
SELECT k, io_id, arrive_ns AS t, ended::TINYINT AS delta, op, end_ns, latency_ns,
       CASE WHEN lag(k) OVER w = k THEN arrive_ns - lag(arrive_ns) OVER w END AS gap_ns
FROM _depth_io
WINDOW w AS (ORDER BY k, arrive_ns, io_id)
UNION ALL
SELECT k, io_id, end_ns, -1::TINYINT, NULL, NULL, NULL, NULL FROM _depth_io
WHERE ended;

-- The steps of each device in time order (an end before an arrival at the
-- same instant; arrivals at one instant by io_id), with the number in
-- flight after each.  (A device's deltas add up to 0, an end for each
-- arrival counted: the running sum over all devices starts each at 0.)
CREATE OR REPLACE VIEW _depth_steps AS
SELECT k, io_id, t, delta, op, end_ns, latency_ns, gap_ns,
       sum(delta) OVER (ORDER BY k, t, delta, io_id ROWS UNBOUNDED PRECEDING) AS depth
FROM _depth_ev;

-- One row per I/O at the vfs, vdisk and disk levels: how many I/Os of its
-- device were in flight when it arrived (itself included), the time since
-- the device's previous arrival, and its latency.
-- @column capture_id VARCHAR    capture
-- @column level VARCHAR         vfs, vdisk or disk
-- @column dev UINTEGER          kernel dev_t (vfs: the guest file system)
-- @column io_id UBIGINT         the I/O (row of the level's view)
-- @column op VARCHAR            read, write, flush, sync, discard or other
-- @column ts_ns UBIGINT         arrival: vfs entry (AIO, io_uring: submission); block dispatch (D)
-- @column end_ns UBIGINT        vfs exit (AIO: reaped; io_uring: CQE); block completion (C), or with none seen done_by_ns; NULL: in flight at the capture's end as far as seen
-- @column depth BIGINT          I/Os of the device in flight at the arrival, this one included; NULL for an I/O whose end (vfs exit, block C) was not seen, which is counted in no I/O's depth
-- @column interarrival_ns UBIGINT time since the device's previous arrival (NULL for its first)
-- @column latency_ns BIGINT     vfs duration; block D2C (NULL without a completion)
CREATE OR REPLACE VIEW depth_arrivals AS
SELECT d.capture_id, d.level, d.dev, s.io_id, s.op, s.t AS ts_ns, s.end_ns,
       CASE WHEN s.delta = 1 THEN s.depth END::BIGINT AS depth,
       s.gap_ns::UBIGINT AS interarrival_ns, s.latency_ns
FROM _depth_steps s JOIN _depth_devs d USING (k)
WHERE s.delta >= 0;

-- Upper bound of the vscsiStats outstandingIOs bin holding a depth; NULL above 64.
CREATE OR REPLACE MACRO _depth_bin(n) AS
  CASE WHEN n <= 2 THEN n WHEN n <= 8 THEN (n + 1) // 2 * 2
       WHEN n <= 32 THEN (n + 3) // 4 * 4 WHEN n <= 64 THEN 64 END;

-- Upper bound (µs) of the vscsiStats latency and interarrival bin holding a
-- time in ns; NULL above 100 ms.
CREATE OR REPLACE MACRO _depth_time_bin(ns) AS
  CASE WHEN ns <= 1000 THEN 1 WHEN ns <= 10000 THEN 10 WHEN ns <= 100000 THEN 100
       WHEN ns <= 500000 THEN 500 WHEN ns <= 1000000 THEN 1000 WHEN ns <= 5000000 THEN 5000
       WHEN ns <= 15000000 THEN 15000 WHEN ns <= 30000000 THEN 30000
       WHEN ns <= 50000000 THEN 50000 WHEN ns <= 100000000 THEN 100000 END;

-- vscsiStats' histograms per level, device and op: outstanding I/Os at
-- arrival (bins 1, 2, 4, 6, 8, 12, ... 32, 64, >64), interarrival time and
-- latency (bins in µs: 1, 10, 100, 500, 1000, 5000, 15000, 30000, 50000,
-- 100000, >100000).  Bins with no I/O have no row.
-- @column capture_id VARCHAR    capture
-- @column level VARCHAR         vfs, vdisk or disk
-- @column dev UINTEGER          kernel dev_t
-- @column op VARCHAR            the arriving I/O's op
-- @column metric VARCHAR        outstanding, interarrival or latency
-- @column bin VARCHAR           the bin's label: its upper bound (outstanding: I/Os; the others: µs), or '>64', '>100000'
-- @column bin_max BIGINT        the bin's upper bound (NULL for the last bin)
-- @column n BIGINT              I/Os in the bin
CREATE OR REPLACE VIEW depth_histogram AS
WITH a AS MATERIALIZED (   -- the window once, not once per metric
  SELECT capture_id, level, dev, op, depth, interarrival_ns, latency_ns FROM depth_arrivals),
b AS (
  SELECT capture_id, level, dev, op, 'outstanding' AS metric, _depth_bin(depth)::BIGINT AS bin_max,
         '>64' AS last FROM a WHERE depth IS NOT NULL
  UNION ALL
  SELECT capture_id, level, dev, op, 'interarrival', _depth_time_bin(interarrival_ns), '>100000'
  FROM a WHERE interarrival_ns IS NOT NULL
  UNION ALL
  SELECT capture_id, level, dev, op, 'latency', _depth_time_bin(latency_ns), '>100000'
  FROM a WHERE latency_ns IS NOT NULL)
SELECT capture_id, level, dev, op, metric, coalesce(bin_max::VARCHAR, last) AS bin, bin_max,
       count(*) AS n
FROM b GROUP BY ALL;

-- Per level and device: the depth each I/O found (mean, median, p99, max),
-- the time-weighted mean number in flight over the device's busy span
-- (iostat's aqu-sz) and the share of it with at least one I/O in flight
-- (%util), and the latency over which each I/O was counted (Little's law:
-- aqu-sz = arrivals per second x mean latency).  The span runs from the
-- device's first arrival to its last event.
-- @column capture_id VARCHAR    capture
-- @column level VARCHAR         vfs, vdisk or disk
-- @column dev UINTEGER          kernel dev_t
-- @column ios BIGINT            I/Os (arrivals)
-- @column ios_unended BIGINT    of them, those whose end (vfs exit, block C) was not seen: in flight at the capture's end, or their completion lost (capture_meta.completions_missed and requests_unfinished); counted in no depth below
-- @column mean_depth DOUBLE     mean depth at arrival (this I/O included)
-- @column median_depth BIGINT   median depth at arrival
-- @column p99_depth BIGINT      99th percentile
-- @column max_depth BIGINT      deepest it went
-- @column avg_in_flight DOUBLE  time-weighted mean in flight over the span (aqu-sz)
-- @column busy_fraction DOUBLE  share of the span with at least one I/O in flight (%util)
-- @column span_ns UBIGINT       first arrival to last event
-- @column interarrival_median_ns DOUBLE median time between arrivals
-- @column latency_median_ns DOUBLE median latency: the time each I/O was counted in flight (vfs: entry to exit; block: D2C)
-- @column latency_p99_ns DOUBLE 99th percentile of it
CREATE OR REPLACE VIEW depth_summary AS
WITH ev AS (   -- (_depth_ev without its window: the one below gives the gaps)
  SELECT k, arrive_ns AS t, ended::TINYINT AS delta, latency_ns FROM _depth_io
  UNION ALL
  SELECT k, end_ns, -1::TINYINT, NULL FROM _depth_io WHERE ended),
st AS (   -- which of the arrivals at one instant comes first changes no
          -- aggregate: ordered by time alone (a shorter sort key); the time
          -- since the previous arrival from the same sort.  One window over
          -- all devices in k's order, not one PARTITION BY k: DuckDB 2.0's
          -- partitioned window took 3 to 10 times as long with 6 to 44
          -- devices (a study's 16 captures: 14.2 M steps, 10.9 s against
          -- 3.9 s).  The running sum starts each device at 0 (see
          -- _depth_steps); the last arrival before each, as a 128-bit (k,
          -- t), says by its k whether it was the same device's.
  SELECT k, t, delta, latency_ns, depth, dt,
         CASE WHEN prev >> 64 = k THEN t - (prev & 18446744073709551615::HUGEINT) END AS gap_ns
  FROM (
    SELECT k, t, delta, latency_ns,
           sum(delta) OVER (w ROWS UNBOUNDED PRECEDING) AS depth,
           CASE WHEN lead(k) OVER w = k THEN lead(t) OVER w - t END AS dt,
           CASE WHEN delta >= 0
                THEN max(CASE WHEN delta >= 0 THEN (k::HUGEINT << 64) + t END)
                       OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) END AS prev
    FROM ev
    WINDOW w AS (ORDER BY k, t, delta))),
-- per device and depth: the arrivals that found it, and the time spent at
-- it.  The depth quantiles come from this short histogram: a quantile
-- aggregate holds every value of its group in memory (a million per
-- device), which DuckDB cannot spill
h AS (
  SELECT k, depth, count(*) FILTER (WHERE delta = 1) AS n, sum(depth * dt) AS in_flight_ns,
         sum(dt) FILTER (WHERE depth > 0) AS busy_ns, min(t) AS t0, max(t) AS t1
  FROM st GROUP BY k, depth),
c AS (
  SELECT *, sum(n) OVER (PARTITION BY k ORDER BY depth) AS below,
         sum(n) OVER (PARTITION BY k) AS total
  FROM h),
s AS (   -- quantile_disc's pick (as percentile_disc): the first value whose
         -- place in the order reaches q n
  SELECT k, sum(n * depth) / nullif(sum(n), 0) AS mean_depth,
         min(depth) FILTER (WHERE below >= greatest(ceil(0.5 * total), 1)) AS median_depth,
         min(depth) FILTER (WHERE below >= greatest(ceil(0.99 * total), 1)) AS p99_depth,
         max(depth) AS max_depth, sum(in_flight_ns) AS in_flight_ns, sum(busy_ns) AS busy_ns,
         max(t1) - min(t0) AS span_ns
  FROM c GROUP BY k),
-- the time between arrivals and the latencies, from the arrivals
io AS (
  SELECT k, count(*) AS ios, count(*) FILTER (WHERE delta = 0) AS ios_unended,
         median(gap_ns) AS interarrival_median_ns,
         quantile_cont(latency_ns, [0.5, 0.99]) AS latency_q
  FROM st WHERE delta >= 0 GROUP BY k)
SELECT d.capture_id, d.level, d.dev, io.ios, io.ios_unended, s.mean_depth::DOUBLE AS mean_depth,
       s.median_depth::BIGINT AS median_depth, s.p99_depth::BIGINT AS p99_depth,
       s.max_depth::BIGINT AS max_depth,
       s.in_flight_ns / nullif(s.span_ns, 0) AS avg_in_flight,
       coalesce(s.busy_ns, 0) / nullif(s.span_ns, 0) AS busy_fraction,
       s.span_ns::UBIGINT AS span_ns, io.interarrival_median_ns::DOUBLE AS interarrival_median_ns,
       io.latency_q[1]::DOUBLE AS latency_median_ns, io.latency_q[2]::DOUBLE AS latency_p99_ns
FROM io LEFT JOIN s USING (k) JOIN _depth_devs d USING (k);
