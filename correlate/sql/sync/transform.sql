-- Module sync.transform: how durability requests change down the stack.
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE disk.io

-- Per level: writes, how many are synchronous at this level (O_SYNC/O_DSYNC
-- at vfs; FUA or PREFLUSH at block levels), explicit flushes (fsync and
-- fdatasync at vfs, also through AIO and io_uring, flush requests at block levels), and how many writes
-- below fall inside an fsync of the level above ("fsync-bound").
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vfs, vdisk or disk
-- @column writes BIGINT        write I/Os
-- @column stable_writes BIGINT writes that must be durable on completion (O_SYNC/O_DSYNC, FUA, PREFLUSH)
-- @column flushes BIGINT       fsync/fdatasync calls, or flush requests
-- @column fsync_bound_writes BIGINT writes issued while an application fsync/fdatasync was in progress
-- @column stable_fraction DOUBLE stable_writes / writes
CREATE OR REPLACE VIEW sync_transform AS
WITH f AS (SELECT capture_id, ts_ns, end_ns FROM vfs_io WHERE syscall IN ('fsync', 'fdatasync', 'aio_fsync', 'aio_fdsync', 'uring_fsync')),
blk AS (
  SELECT capture_id, level, op, start_ns AS ts, req_flags FROM vdisk_io
  UNION ALL SELECT capture_id, level, op, start_ns, req_flags FROM disk_io),
b AS (
  SELECT b.capture_id, b.level,
         count(*) FILTER (WHERE b.op = 'write') AS writes,
         count(*) FILTER (WHERE b.op = 'write' AND b.req_flags & (8 | 16) <> 0) AS stable_writes,
         count(*) FILTER (WHERE b.op = 'flush') AS flushes,
         count(*) FILTER (WHERE b.op = 'write' AND EXISTS (
            SELECT 1 FROM f WHERE f.capture_id = b.capture_id AND b.ts BETWEEN f.ts_ns AND f.end_ns))
           AS fsync_bound_writes
  FROM blk b GROUP BY ALL),
v AS (
  SELECT capture_id, 'vfs' AS level,
         count(*) FILTER (WHERE op = 'write') AS writes,
         count(*) FILTER (WHERE op = 'write' AND sync) AS stable_writes,
         count(*) FILTER (WHERE syscall IN ('fsync', 'fdatasync', 'aio_fsync', 'aio_fdsync', 'uring_fsync')) AS flushes,
         0::BIGINT AS fsync_bound_writes
  FROM vfs_io GROUP BY ALL)
SELECT capture_id, level, writes, stable_writes, flushes, fsync_bound_writes,
       stable_writes / nullif(writes, 0) AS stable_fraction
FROM (SELECT * FROM v UNION ALL SELECT * FROM b);
