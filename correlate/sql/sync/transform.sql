-- Module sync.transform: how durability requests change down the stack.
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE disk.io

-- Per level: writes, how many are synchronous at this level (O_SYNC/O_DSYNC
-- at vfs; FUA or PREFLUSH at block levels), explicit flushes (fsync and
-- fdatasync at vfs, also through AIO and io_uring, msync with MS_SYNC,
-- an fsync of its range, syncfs and sync; flush requests at block levels), and how many writes
-- below fall inside an fsync of the level above ("fsync-bound").  sync_file_range
-- (and io_uring's) starts writeback of a range without a flush of the disk's
-- cache: it is counted apart (range_syncs), with the writes below issued
-- while one is in progress (range_sync_bound_writes).
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vfs, vdisk or disk
-- @column writes BIGINT        write I/Os
-- @column stable_writes BIGINT writes that must be durable on completion (O_SYNC/O_DSYNC, FUA, PREFLUSH)
-- @column flushes BIGINT       fsync/fdatasync calls (and msync with MS_SYNC, syncfs, sync), or flush requests
-- @column fsync_bound_writes BIGINT writes issued while an application fsync/fdatasync (or msync with MS_SYNC, syncfs, sync) was in progress
-- @column stable_fraction DOUBLE stable_writes / writes
-- @column range_syncs BIGINT   sync_file_range calls (vfs; 0 at block levels)
-- @column range_sync_bound_writes BIGINT writes issued while an application sync_file_range was in progress (block levels; 0 at vfs)
CREATE OR REPLACE VIEW sync_transform AS
WITH w AS MATERIALIZED (   -- the application's sync calls (usually few), read once
  SELECT c.ck, v.ts_ns, v.end_ns,
         v.syscall IN ('sync_file_range', 'uring_sync_file_range') AS ranged
  FROM vfs_io v JOIN _base_captures c USING (capture_id) WHERE v.op = 'sync'),
blk AS (
  SELECT capture_id, level, io_id, op, start_ns AS ts, req_flags FROM vdisk_io
  UNION ALL SELECT capture_id, level, io_id, op, start_ns, req_flags FROM disk_io),
-- a write below is inside some sync call of a kind iff, of the calls that
-- started before it, the latest end is after it: an ASOF join on the calls'
-- running maximum end (an inequality join would pair every write with every
-- call: 23 s for 100k writes and 100k fsyncs; keyed by the capture's
-- number, not its name: a short sort key)
cover AS (
  SELECT ck, ranged, ts_ns,
         max(end_ns) OVER (PARTITION BY ck, ranged ORDER BY ts_ns
                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cover_end
  FROM w),
fc AS (SELECT * FROM cover WHERE NOT ranged),
rc AS (SELECT * FROM cover WHERE ranged),
bound AS (
  SELECT b.capture_id, b.level, f.cover_end >= b.ts AS in_fsync, r.cover_end >= b.ts AS in_range
  FROM (SELECT x.*, c.ck FROM blk x JOIN _base_captures c USING (capture_id)
        -- (none when there are no sync calls)
        WHERE x.op = 'write'
          AND x.ts BETWEEN (SELECT min(ts_ns) FROM w) AND (SELECT max(end_ns) FROM w)) b
  ASOF LEFT JOIN fc f ON f.ck = b.ck AND b.ts >= f.ts_ns
  ASOF LEFT JOIN rc r ON r.ck = b.ck AND b.ts >= r.ts_ns),
b AS (
  SELECT capture_id, level,
         count(*) FILTER (WHERE op = 'write') AS writes,
         count(*) FILTER (WHERE op = 'write' AND req_flags & (8 | 16) <> 0) AS stable_writes,
         count(*) FILTER (WHERE op = 'flush') AS flushes
  FROM blk GROUP BY ALL),
bb AS (
  SELECT capture_id, level, count(*) FILTER (WHERE in_fsync) AS fsync_bound_writes,
         count(*) FILTER (WHERE in_range) AS range_sync_bound_writes
  FROM bound GROUP BY ALL),
v AS (
  SELECT capture_id, 'vfs' AS level,
         count(*) FILTER (WHERE op = 'write') AS writes,
         count(*) FILTER (WHERE op = 'write' AND sync) AS stable_writes,
         count(*) FILTER (WHERE syscall IN ('fsync', 'fdatasync', 'aio_fsync', 'aio_fdsync', 'uring_fsync',
                                            'syncfs', 'sync')
                          OR (syscall = 'msync' AND op = 'sync')) AS flushes,
         0::BIGINT AS fsync_bound_writes,
         count(*) FILTER (WHERE syscall IN ('sync_file_range', 'uring_sync_file_range')) AS range_syncs,
         0::BIGINT AS range_sync_bound_writes
  FROM vfs_io GROUP BY ALL)
SELECT capture_id, level, writes, stable_writes, flushes, fsync_bound_writes,
       stable_writes / nullif(writes, 0) AS stable_fraction, range_syncs, range_sync_bound_writes
FROM (SELECT * FROM v
      UNION ALL
      SELECT b.capture_id, b.level, b.writes, b.stable_writes, b.flushes,
             coalesce(bb.fsync_bound_writes, 0), 0::BIGINT, coalesce(bb.range_sync_bound_writes, 0)
      FROM b LEFT JOIN bb ON bb.capture_id = b.capture_id AND bb.level = b.level);
