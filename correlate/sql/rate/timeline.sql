-- Module rate.timeline: I/O rates over time per level (the throughput
-- graph of seekwatcher and iostat's intervals, at every level at once).
-- INCLUDE vfs.io
-- INCLUDE block.requests
-- INCLUDE hostfs.io
-- LATE: a table macro, bound when created (~12 ms): a session creates it
-- when a query first names it.

-- Reads and writes per level, op and time bucket of `bucket_ns`
-- nanoseconds from the capture's start: file calls at entry (bytes done),
-- block requests at dispatch (D), host-FS accesses when made.  Buckets
-- with no I/O have no row.  Use: SELECT * FROM rate_timeline(100000000)
-- for 100 ms buckets.
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vfs, vdisk, hostfs or disk
-- @column op VARCHAR           read or write
-- @column bucket BIGINT        bucket number: its I/Os started in [bucket, bucket + 1) x bucket_ns from the capture's start
-- @column t_s DOUBLE           the bucket's start, seconds from the capture's start
-- @column ios BIGINT           I/Os
-- @column bytes BIGINT         their bytes
-- @column iops DOUBLE          ios per second of the bucket
-- @column mib_per_s DOUBLE     MiB per second of the bucket
CREATE OR REPLACE MACRO rate_timeline(bucket_ns) AS TABLE
WITH io AS (
  SELECT capture_id, level, op, ts_ns, ret_bytes AS bytes FROM vfs_io
  WHERE op IN ('read', 'write')
  UNION ALL
  SELECT capture_id, level, op, ts_ns, bytes::BIGINT FROM block_requests
  WHERE op IN ('read', 'write')
  UNION ALL
  SELECT capture_id, level, op, ts_ns, bytes::BIGINT FROM hostfs_io
  WHERE op IN ('read', 'write')),
c AS (SELECT capture_id, min(start_ns)::BIGINT AS start_ns FROM capture_meta GROUP BY ALL),
b AS (
  SELECT io.capture_id, io.level, io.op,
         floor((io.ts_ns::BIGINT - c.start_ns) / bucket_ns)::BIGINT AS bucket, io.bytes
  FROM io JOIN c USING (capture_id))
SELECT capture_id, level, op, bucket, bucket * bucket_ns / 1e9 AS t_s, count(*) AS ios,
       sum(bytes)::BIGINT AS bytes, count(*) / (bucket_ns / 1e9) AS iops,
       sum(bytes) / 1048576 / (bucket_ns / 1e9) AS mib_per_s
FROM b GROUP BY capture_id, level, op, bucket ORDER BY capture_id, level, op, bucket;
