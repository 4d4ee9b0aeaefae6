-- Module base.levels: shared helpers every level uses.

-- The traced devices of each capture and the level each one plays.
-- @column capture_id VARCHAR  capture
-- @column level VARCHAR       vfs, vdisk, netfs, hostfs or disk
-- @column dev UINTEGER        kernel dev_t
-- @column name VARCHAR        device name or mount point
-- @column size_sectors UBIGINT device size in 512-byte sectors (block levels); vfs, hostfs: the size of the partition the file system is on (0: the whole disk, or not said)
-- @column fs_type VARCHAR     file system type (vfs, hostfs)
-- @column block_size_bytes UINTEGER file system block size, or the disk's logical block size
-- @column machine VARCHAR     machine that recorded the level (guest or host in a merged capture)
CREATE OR REPLACE VIEW base_levels AS
SELECT m.capture_id, m.level, m.dev, m.name, m.size_sectors, m.fs_type,
       m.block_size_bytes, coalesce(m.machine, c.machine) AS machine
FROM device_map m JOIN capture_meta c USING (capture_id);

-- The traced file systems on a partition of the disk below whose size the
-- capture kept (older stores kept none), with the
-- partition's bytes [lo, hi) on that disk (level): the guest FS on the
-- virtual disk, the host FS on its disk when on one disk (a btrfs on
-- several has one size said for all).  The rest of the disk holds other
-- file systems, not traced.  (An overlay's row is the file system of its
-- layers again, no partition of its own.)
CREATE OR REPLACE VIEW _base_fs_partitions AS
SELECT f.capture_id, f.level AS fs_level,
       CASE f.level WHEN 'vfs' THEN 'vdisk' ELSE 'disk' END AS level,
       f.part_start_bytes::BIGINT AS lo, (f.part_start_bytes + f.size_sectors * 512)::BIGINT AS hi
FROM device_map f
WHERE f.size_sectors > 0 AND coalesce(f.fs_type, '') <> 'overlay'
  AND (f.level = 'vfs' OR f.level = 'hostfs' AND f.capture_id IN (
       SELECT capture_id FROM device_map WHERE level = 'disk'
       GROUP BY capture_id HAVING count(DISTINCT dev) = 1));

-- The block-level devices (vdisk, disk) of all captures, each numbered:
-- dk.  A window partitioned by dk instead of (capture_id, dev) sorts on a
-- key of a few bytes; DuckDB sorts keys of up to 24 bytes fastest, and a
-- capture's name (a string) in the key made the block windows ~2x slower.
CREATE OR REPLACE VIEW _base_block_devs AS
SELECT capture_id, dev, level, machine, size_sectors,
       CASE WHEN _dk <= 65535 THEN _dk::USMALLINT
            ELSE error('more than 65535 block devices in one store') END AS dk
FROM (SELECT *, row_number() OVER (ORDER BY capture_id, dev, level) AS _dk
      FROM base_levels WHERE level IN ('vdisk', 'disk'));

-- The captures of the store, numbered: ck (a short key for sorts and
-- ASOF joins, where a capture's name is a string of any length).
CREATE OR REPLACE VIEW _base_captures AS
SELECT capture_id, row_number() OVER (ORDER BY capture_id)::UINTEGER AS ck
FROM (SELECT DISTINCT capture_id FROM capture_meta);

-- op name of a block request from the kernel's REQ_OP.
CREATE OR REPLACE MACRO _req_op_name(req_op) AS
  CASE req_op WHEN 0 THEN 'read' WHEN 1 THEN 'write' WHEN 2 THEN 'flush'
              WHEN 3 THEN 'discard' WHEN 5 THEN 'discard' WHEN 9 THEN 'write'
              ELSE 'other' END;

-- blktrace-style RWBS string from REQ_OP and nestrace's flag bits.
CREATE OR REPLACE MACRO _rwbs(req_op, req_flags) AS
  concat(
    CASE WHEN req_flags & 16 <> 0 THEN 'F' ELSE '' END,
    CASE req_op WHEN 0 THEN 'R' WHEN 1 THEN 'W' WHEN 2 THEN 'F' WHEN 3 THEN 'D'
                WHEN 5 THEN 'DE' WHEN 9 THEN 'WZ' ELSE 'N' END,
    CASE WHEN req_flags & 8 <> 0 THEN 'F' ELSE '' END,
    CASE WHEN req_flags & 32 <> 0 THEN 'A' ELSE '' END,
    CASE WHEN req_flags & 1 <> 0 THEN 'S' ELSE '' END,
    CASE WHEN req_flags & 2 <> 0 THEN 'M' ELSE '' END);

-- The disk image behind each capture's virtual disk and the files it
-- reads through (a qcow2 image's backing chain), each with a stretch of
-- "image bytes" of its own: the image's at 0, the k-th other file's at
-- k << 50 (1 PiB each).  The views that carry virtual-disk bytes into the
-- image work in that space; their public columns name the file
-- (image_ino) and the offset in it.
CREATE OR REPLACE VIEW _base_image_files AS
WITH f AS (
  SELECT capture_id, backing_ino AS ino, 0 AS top FROM device_map
  WHERE level = 'vdisk' AND backing_ino IS NOT NULL
  UNION ALL
  SELECT DISTINCT capture_id, ino, 1 FROM extent_maps
  WHERE role IN ('image', 'vdisk_image', 'image_metadata'))
SELECT capture_id, ino,
       ((row_number() OVER (PARTITION BY capture_id ORDER BY min(top), ino) - 1) << 50)::BIGINT
         AS shift
FROM f GROUP BY capture_id, ino;
