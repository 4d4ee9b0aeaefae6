-- Module chain.io: every level of a capture's stack as one chain, and
-- every level's I/Os in one shape.
-- INCLUDE vfs.io
-- INCLUDE block.requests
-- INCLUDE hostfs.io
-- INCLUDE netfs.io
-- INCLUDE base.levels
-- INCLUDE codes.tables

-- A capture's levels in chain order, top (the application's calls) to
-- bottom (the disk under the host file system): a row per device or file
-- system of a level (several at one position: the file systems given
-- several --stack, a host btrfs on several disks).  The positions are the
-- level code table's (schemas/records.toml, enum level).
-- @column capture_id VARCHAR  capture
-- @column position UTINYINT   place in the chain, 1 at the top
-- @column level VARCHAR       the level's name, as in the per-level views
-- @column what VARCHAR        what the level sees
-- @column dev UINTEGER        kernel dev_t (file system, or disk)
-- @column name VARCHAR        device name or mount point
-- @column fs_type VARCHAR     file system type (file-system levels)
-- @column machine VARCHAR     machine that recorded the level
-- @column below VARCHAR       the next level down the chain in this capture (NULL at the bottom: where the chain stops)
CREATE OR REPLACE VIEW chain_levels AS
WITH l AS (
  SELECT b.capture_id, c.code::UTINYINT AS position, b.level, c.what, b.dev, b.name, b.fs_type,
         b.machine
  FROM base_levels b JOIN _code_level c ON c.name = b.level)
SELECT l.*, (SELECT n.level FROM l n WHERE n.capture_id = l.capture_id
             AND n.position > l.position ORDER BY n.position LIMIT 1) AS below
FROM l ORDER BY capture_id, position, dev;

-- Every level's I/Os in one shape, the same columns for each: a row of
-- vfs_io, block_requests (vdisk_io and disk_io are its rows), netfs_io
-- or hostfs_io.  Offsets are each level's own: a file's (vfs; netfs and
-- hostfs: the image file, the same offsets on both sides of the network)
-- or a device's (vdisk, disk); map_vfs, map_vdisk and links carry them
-- from one level to the next.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column position UTINYINT    the level's place in the chain (chain_levels)
-- @column level VARCHAR        vfs, vdisk, netfs, hostfs or disk
-- @column io_id UBIGINT        the row's io_id in its level's view
-- @column op VARCHAR           read, write, sync, discard, flush, meta (netfs: metadata and attribute requests) or other
-- @column offset_bytes BIGINT  file offset (vfs, netfs, hostfs) or device offset (vdisk, disk); NULL where there is none (fsync, a flush, a netfs metadata request)
-- @column bytes BIGINT         vfs: bytes done; block: the request's size; netfs: the bytes asked for; hostfs: the access's length
-- @column start_ns UBIGINT     vfs: entry (AIO, io_uring: submission); block: first seen (Q, else G, else D); netfs: sent; hostfs: the access
-- @column end_ns UBIGINT       vfs: exit (AIO, io_uring: completion reaped or posted); block: completion (or done_by_ns); netfs: answered; hostfs: NULL (one time only)
-- @column latency_ns BIGINT    end_ns - start_ns
-- @column dev UINTEGER         kernel dev_t: the file system (vfs, hostfs), the network mount (netfs) or the disk (vdisk, disk)
-- @column ino UBIGINT          the file (vfs, hostfs; netfs: the FUSE node id); NULL at the block levels
-- @column pid UINTEGER         process
-- @column comm VARCHAR         task command name
CREATE OR REPLACE VIEW chain_io AS
SELECT capture_id, machine, _level('vfs')::UTINYINT AS position, level, io_id, op,
       CASE WHEN offset_bytes >= 0 THEN offset_bytes END AS offset_bytes, ret_bytes AS bytes,
       ts_ns AS start_ns, end_ns, duration_ns::BIGINT AS latency_ns, dev, ino, pid, comm
FROM vfs_io
UNION ALL
SELECT capture_id, machine, _level(level)::UTINYINT, level, io_id, op, offset_bytes::BIGINT,
       bytes::BIGINT, start_ns, coalesce(c_ns, done_by_ns),
       coalesce(c_ns, done_by_ns)::BIGINT - start_ns::BIGINT, dev, NULL::UBIGINT, pid, comm
FROM block_requests
UNION ALL
SELECT capture_id, machine, _level('hostfs')::UTINYINT, level, io_id, op, offset_bytes,
       bytes::BIGINT, ts_ns, NULL::UBIGINT, NULL::BIGINT, dev, ino, pid, comm
FROM hostfs_io
UNION ALL
SELECT capture_id, machine, _level('netfs')::UTINYINT, level, io_id, op, offset_bytes,
       bytes::BIGINT, start_ns, end_ns, latency_ns, dev, nodeid, pid, comm
FROM netfs_io;
