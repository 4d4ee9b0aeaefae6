-- Module size.histogram: request sizes per level (vscsiStats bins) and the
-- merge ratio.
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE disk.io
-- INCLUDE codes.tables
-- INCLUDE hostfs.io
-- INCLUDE phases.phases

-- Upper bound of the vscsiStats bin holding a size (bytes); NULL above 512K.
CREATE OR REPLACE MACRO _size_bin(b) AS
  CASE WHEN b <= 512 THEN 512 WHEN b <= 1024 THEN 1024 WHEN b <= 2048 THEN 2048
       WHEN b <= 4096 THEN 4096 WHEN b <= 8192 THEN 8192 WHEN b <= 16384 THEN 16384
       WHEN b <= 32768 THEN 32768 WHEN b <= 65536 THEN 65536 WHEN b <= 131072 THEN 131072
       WHEN b <= 262144 THEN 262144 WHEN b <= 524288 THEN 524288 END;

-- The bin's name: 512, 1K, 2K, ... 512K, >512K.
CREATE OR REPLACE MACRO _size_label(b) AS
  CASE WHEN _size_bin(b) IS NULL THEN '>512K'
       WHEN _size_bin(b) < 1024 THEN _size_bin(b)::VARCHAR
       ELSE (_size_bin(b) // 1024)::VARCHAR || 'K' END;

-- Number of I/Os and bytes per level, op and size bin.
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vfs, vdisk, hostfs or disk
-- @column op VARCHAR           read or write
-- @column bin VARCHAR          512, 1K, 2K, ... 512K, >512K
-- @column bin_max_bytes BIGINT the bin's upper bound (NULL for >512K)
-- @column n BIGINT             I/Os in the bin
-- @column bytes BIGINT         their bytes
CREATE OR REPLACE VIEW size_histogram AS
WITH s AS (
  SELECT capture_id, level, op, ret_bytes AS b FROM vfs_io WHERE op IN ('read', 'write') AND ret_bytes > 0
  UNION ALL SELECT capture_id, level, op, bytes FROM vdisk_io WHERE op IN ('read', 'write') AND bytes > 0
  UNION ALL SELECT capture_id, level, op, bytes FROM hostfs_io WHERE op IN ('read', 'write') AND bytes > 0
  UNION ALL SELECT capture_id, level, op, bytes FROM disk_io WHERE op IN ('read', 'write') AND bytes > 0)
SELECT capture_id, level, op, _size_label(b) AS bin,
       _size_bin(b)::BIGINT AS bin_max_bytes, count(*) AS n, sum(b)::BIGINT AS bytes
FROM s GROUP BY ALL;

-- btt's merge ratio per device: bios queued (Q) per request dispatched (D).
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vdisk or disk
-- @column dev UINTEGER         kernel dev_t
-- @column queued BIGINT        Q events (bios)
-- @column merged BIGINT        bios merged into a request (M, F)
-- @column dispatched BIGINT    D events (requests)
-- @column merge_ratio DOUBLE   queued / dispatched
CREATE OR REPLACE VIEW size_merge_ratio AS
WITH n AS (
  SELECT capture_id, dev,
         count(*) FILTER (WHERE action = _block_action('q')) AS queued,
         count(*) FILTER (WHERE action IN (_block_action('backmerge'), _block_action('frontmerge')))
           AS merged,
         count(*) FILTER (WHERE action = _block_action('d')) AS dispatched
  FROM block_events GROUP BY ALL
  UNION ALL   -- --per-request: the Qs each record stands for, its merges (a row each;
              -- --from-completions: a request's bios but its first) and dispatches
  SELECT capture_id, dev, sum(queued),
         count(*) FILTER (WHERE action IN (_block_action('backmerge'), _block_action('frontmerge')))
           + coalesce(sum(queued - 1) FILTER (WHERE queued > 1), 0),
         count(*) FILTER (WHERE action IN (_block_action('c'), _block_action('requeue'),
                                           _block_action('d'), _block_action('unfinished')))
  FROM block_request_records GROUP BY ALL)
SELECT n.capture_id, l.level, n.dev, sum(n.queued)::BIGINT AS queued,
       sum(n.merged)::BIGINT AS merged, sum(n.dispatched)::BIGINT AS dispatched,
       (sum(n.queued) / nullif(sum(n.dispatched), 0))::DOUBLE AS merge_ratio
FROM n
JOIN base_levels l ON l.capture_id = n.capture_id AND l.dev = n.dev AND l.level IN ('vdisk', 'disk')
GROUP BY ALL;
