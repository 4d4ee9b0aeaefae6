-- Module amplification.amplification: bytes per level, and the ratio of
-- each level to the level above (the seed's "app reads / file reads /
-- block reads" table).
-- INCLUDE links.links

-- Bytes read and written per level over a capture, with the ratio to the
-- level above (vdisk/vfs, hostfs/vdisk, disk/hostfs) and to the
-- application (level/vfs).
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vfs, vdisk, hostfs or disk
-- @column depth INTEGER        1 (vfs) to 4 (disk)
-- @column op VARCHAR           read or write
-- @column requests BIGINT      I/Os at this level
-- @column bytes BIGINT         bytes at this level
-- @column ratio_to_above DOUBLE bytes / bytes of the level above (NULL for vfs)
-- @column ratio_to_app DOUBLE  bytes / vfs bytes
CREATE OR REPLACE VIEW amplification AS
WITH b AS (
  SELECT capture_id, 'vfs' AS level, 1 AS depth, op, count(*) AS requests, sum(ret_bytes) AS bytes
  FROM vfs_io WHERE op IN ('read', 'write') GROUP BY ALL
  UNION ALL SELECT capture_id, 'vdisk', 2, op, count(*), sum(bytes) FROM vdisk_io
  WHERE op IN ('read', 'write') GROUP BY ALL
  UNION ALL SELECT capture_id, 'hostfs', 3, op, count(*), sum(bytes) FROM hostfs_io
  WHERE op IN ('read', 'write') GROUP BY ALL
  UNION ALL SELECT capture_id, 'disk', 4, op, count(*), sum(bytes) FROM disk_io
  WHERE op IN ('read', 'write') GROUP BY ALL),
levels AS (SELECT * FROM (VALUES ('vfs', 1), ('vdisk', 2), ('hostfs', 3), ('disk', 4)) v(level, depth)),
caps AS (SELECT DISTINCT capture_id FROM capture_meta),
ops AS (SELECT * FROM (VALUES ('read'), ('write')) o(op)),
grid AS (
  SELECT c.capture_id, l.level, l.depth, o.op, coalesce(b.requests, 0) AS requests,
         coalesce(b.bytes, 0)::BIGINT AS bytes
  FROM caps c CROSS JOIN levels l CROSS JOIN ops o
  LEFT JOIN b ON b.capture_id = c.capture_id AND b.level = l.level AND b.op = o.op)
SELECT capture_id, level, depth, op, requests, bytes,
       bytes / nullif(lag(bytes) OVER (PARTITION BY capture_id, op ORDER BY depth), 0) AS ratio_to_above,
       bytes / nullif(first_value(bytes) OVER (PARTITION BY capture_id, op ORDER BY depth), 0) AS ratio_to_app
FROM grid;

-- Per application I/O: the bytes it caused at the virtual disk and at the
-- host disk (through the links; disk bytes via the vdisk request they
-- served: of each, the call's share of that request's bytes, so the part
-- of a request no traced call caused (another process's read merged into
-- it, readahead) gives its disk bytes to none).
-- @column capture_id VARCHAR   capture
-- @column io_id UBIGINT        vfs_io row
-- @column op VARCHAR           read or write
-- @column app_bytes BIGINT     bytes the syscall moved
-- @column vdisk_bytes BIGINT   virtual-disk bytes attributed to it
-- @column disk_bytes DOUBLE    host-disk bytes attributed to it: of each virtual-disk request it caused part of, the host-disk bytes linked to that request times its part of the request
-- @column dev UINTEGER         its file's file system (vfs_io.dev)
-- @column ino UBIGINT          its file (vfs_io.ino)
-- @column pid UINTEGER         the process that made it (vfs_io.pid)
CREATE OR REPLACE VIEW amplification_per_io AS
WITH l AS MATERIALIZED (   -- (links planned and computed once, not twice)
  SELECT capture_id, lower_level, lower_id, upper_id, bytes FROM links
  WHERE lower_level IN ('vdisk', 'disk')),
v AS (
  SELECT capture_id, upper_id AS vfs_id, lower_id AS vdisk_id, sum(bytes) AS bytes
  FROM l WHERE lower_level = 'vdisk' GROUP BY ALL),
-- (shares of all the request's bytes: the unattributed rows' too)
vshare AS (
  SELECT * FROM (
    SELECT capture_id, vdisk_id, vfs_id,
           bytes / sum(bytes) OVER (PARTITION BY capture_id, vdisk_id) AS share
    FROM v)
  WHERE vfs_id IS NOT NULL),
d AS (
  SELECT l.capture_id, s.vfs_id, sum(l.bytes * s.share) AS bytes
  FROM l JOIN vshare s ON s.capture_id = l.capture_id AND s.vdisk_id = l.upper_id
  WHERE l.lower_level = 'disk' GROUP BY ALL),
vv AS (SELECT capture_id, vfs_id, sum(bytes) AS bytes FROM v WHERE vfs_id IS NOT NULL GROUP BY ALL)
SELECT f.capture_id, f.io_id, f.op, f.ret_bytes AS app_bytes,
       coalesce(vv.bytes, 0)::BIGINT AS vdisk_bytes, coalesce(d.bytes, 0)::DOUBLE AS disk_bytes,
       f.dev, f.ino, f.pid
FROM vfs_io f
LEFT JOIN vv ON vv.capture_id = f.capture_id AND vv.vfs_id = f.io_id
LEFT JOIN d ON d.capture_id = f.capture_id AND d.vfs_id = f.io_id
WHERE f.op IN ('read', 'write');
