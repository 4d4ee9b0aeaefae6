-- Module netfs.causes: each request a network file system's client sent,
-- joined to what above it asked for it, by offset and time.
-- INCLUDE netfs.io
-- INCLUDE vfs.io
-- INCLUDE block.requests
-- INCLUDE base.levels

-- Each read and write at netfs, with the request or call above it that it
-- serves: with the image on the mount, the virtual disk's request of the
-- same direction that covers its first byte (virtual-disk offset +
-- lo_offset = image offset: a raw image on a loop device) while it was
-- in flight; on a gateway (the guest's files on the mount), the
-- application's call of the same direction, on the mount, of the process
-- the request is for, that covers its first byte while it was in flight.
-- A request with none is classed by what it is: meta (lookups,
-- attributes, opens: the metadata traffic seed 003 counts), sync (fsync,
-- flush), writeback (a write from the client's page cache), readahead (a
-- read no call or request was waiting for: the client's page cache
-- reading ahead), or other.  Ranges are matched in 1 MiB buckets: a
-- request's first byte, and every bucket of the upper range.
-- @column capture_id VARCHAR   capture
-- @column io_id UBIGINT        the netfs_io row
-- @column opcode VARCHAR       its operation
-- @column op VARCHAR           read, write, sync or meta
-- @column offset_bytes BIGINT  its file offset (NULL but for reads and writes)
-- @column bytes UBIGINT        its bytes
-- @column cause VARCHAR        vdisk or app (joined to the row named), or meta, sync, writeback, readahead, other
-- @column upper_level VARCHAR  vdisk or vfs: the level of the row it serves (NULL: none)
-- @column upper_id UBIGINT     that row's io_id in vdisk_io or vfs_io
CREATE OR REPLACE VIEW netfs_causes AS
WITH n AS (
  SELECT capture_id, io_id, opcode, op, offset_bytes, bytes, start_ns, pid, cached_write,
         (offset_bytes >> 20) AS bucket
  FROM netfs_io),
up AS (   -- the rows above, a row per 1 MiB bucket they touch
  SELECT r.capture_id, 'vdisk' AS level, r.io_id, r.op, NULL::UINTEGER AS pid,
         (r.offset_bytes + coalesce(d.backing_offset_bytes, 0))::BIGINT AS lo,
         (r.offset_bytes + r.bytes + coalesce(d.backing_offset_bytes, 0))::BIGINT AS hi,
         r.start_ns AS t0, coalesce(r.c_ns, r.done_by_ns) AS t1
  FROM block_requests r
  JOIN device_map d ON d.capture_id = r.capture_id AND d.dev = r.dev AND d.level = 'vdisk'
  WHERE r.level = 'vdisk' AND r.op IN ('read', 'write')
    AND r.capture_id IN (SELECT capture_id FROM device_map WHERE level = 'netfs')
  UNION ALL
  SELECT v.capture_id, 'vfs', v.io_id, v.op, v.pid, v.offset_bytes, v.offset_bytes + v.ret_bytes,
         v.ts_ns, v.end_ns
  FROM vfs_io v
  JOIN device_map d ON d.capture_id = v.capture_id AND d.dev = v.dev AND d.level = 'netfs'
  WHERE v.op IN ('read', 'write') AND v.offset_bytes >= 0 AND v.ret_bytes > 0),
ub AS (
  SELECT *, unnest(range(lo >> 20, ((hi - 1) >> 20) + 1)) AS bucket FROM up WHERE hi > lo),
hit AS (
  SELECT n.capture_id, n.io_id, arg_min(ub.level, n.start_ns - ub.t0) AS upper_level,
         arg_min(ub.io_id, n.start_ns - ub.t0) AS upper_id
  FROM n JOIN ub ON ub.capture_id = n.capture_id AND ub.bucket = n.bucket AND ub.op = n.op
   AND ub.lo <= n.offset_bytes AND n.offset_bytes < ub.hi
   AND n.start_ns >= ub.t0 AND (ub.t1 IS NULL OR n.start_ns <= ub.t1)
   AND (ub.level = 'vdisk' OR ub.pid = n.pid)
  WHERE n.op IN ('read', 'write')
  GROUP BY n.capture_id, n.io_id)
SELECT n.capture_id, n.io_id, n.opcode, n.op, n.offset_bytes, n.bytes,
       CASE WHEN h.upper_level = 'vdisk' THEN 'vdisk' WHEN h.upper_level = 'vfs' THEN 'app'
            WHEN n.op IN ('meta', 'sync') THEN n.op
            WHEN n.op = 'write' AND n.cached_write THEN 'writeback'
            WHEN n.op = 'read' THEN 'readahead' ELSE 'other' END AS cause,
       h.upper_level, h.upper_id
FROM n LEFT JOIN hit h USING (capture_id, io_id);
