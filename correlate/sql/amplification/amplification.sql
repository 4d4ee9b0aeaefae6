-- Module amplification.amplification: bytes per level, and the ratio of
-- each level to the level above (the seed's "app reads / file reads /
-- block reads" table).
-- INCLUDE links.links
-- INCLUDE chain.io

-- Bytes read and written per level over a capture, with the ratio to the
-- level above in the capture's chain (vdisk/vfs, hostfs/vdisk,
-- disk/hostfs; disk/vdisk in the raw baseline, which has no host FS) and
-- to the application (level/vfs).  A row per level the capture traced
-- (chain_levels).
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vfs, vdisk, hostfs or disk
-- @column depth INTEGER        the level's place in the chain: 1 (vfs) to 4 (disk)
-- @column op VARCHAR           read or write
-- @column requests BIGINT      I/Os at this level
-- @column bytes BIGINT         bytes at this level
-- @column ratio_to_above DOUBLE bytes / bytes of the level above (NULL for the top one)
-- @column ratio_to_app DOUBLE  bytes / vfs bytes (NULL where vfs was not traced)
CREATE OR REPLACE VIEW amplification AS
WITH b AS (
  SELECT capture_id, level, op, count(*) AS requests, sum(bytes) AS bytes
  FROM chain_io WHERE op IN ('read', 'write') GROUP BY ALL),
levels AS (SELECT DISTINCT capture_id, level, position::INTEGER AS depth FROM chain_levels),
ops AS (SELECT * FROM (VALUES ('read'), ('write')) o(op)),
grid AS (
  SELECT l.capture_id, l.level, l.depth, o.op, coalesce(b.requests, 0) AS requests,
         coalesce(b.bytes, 0)::BIGINT AS bytes
  FROM levels l CROSS JOIN ops o
  LEFT JOIN b ON b.capture_id = l.capture_id AND b.level = l.level AND b.op = o.op)
SELECT capture_id, level, depth, op, requests, bytes,
       bytes / nullif(lag(bytes) OVER (PARTITION BY capture_id, op ORDER BY depth), 0) AS ratio_to_above,
       CASE WHEN first_value(level) OVER w = 'vfs'
            THEN bytes / nullif(first_value(bytes) OVER w, 0) END AS ratio_to_app
FROM grid
WINDOW w AS (PARTITION BY capture_id, op ORDER BY depth);

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
