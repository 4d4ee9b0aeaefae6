-- Module map.extents: where each traced file's bytes live on its device.
-- INCLUDE base.levels

-- Every known extent of the traced files, from each source (FIEMAP at
-- start and at end, mapping events), the partition start added; prio 1
-- end snapshot, 2 start snapshot, 3 mapping events; shared: FIEMAP said
-- another file shares its blocks (a reflink: rewritten, it moves).  disk_dev: the disk
-- the bytes are on (a btrfs on several devices names it per piece;
-- mapping events and stores written before: the one device below).  A
-- btrfs's mapping events (a host's, a guest's) are in btrfs logical
-- bytes: record maps them through the chunk tree into extent_maps rows of
-- phase events.  disk_length_bytes: a compressed extent's (btrfs), whose
-- bytes are not on the disk byte for byte: physical_bytes is where its
-- compressed data starts, and any byte of the extent is read from all of
-- it (an encoded extent without it, from a store written before or the
-- agent's snapshot in a VM guest, is left out: it has no place links can
-- use).
CREATE OR REPLACE VIEW _map_extents_all AS
WITH snap AS (
  SELECT capture_id, role, dev, ino, logical_bytes, physical_bytes, length_bytes,
         physical_dev AS disk_dev,
         CASE phase WHEN 'events' THEN 'mapping_events' ELSE 'fiemap_' || phase END AS source,
         CASE phase WHEN 'end' THEN 1 WHEN 'start' THEN 2 ELSE 3 END AS prio,
         (flags & 8192) <> 0 AS shared,           -- FIEMAP_EXTENT_SHARED
         disk_length_bytes
  FROM extent_maps
  WHERE (flags & 6) = 0                           -- FIEMAP_EXTENT_UNKNOWN | DELALLOC
    AND ((flags & 8) = 0 OR disk_length_bytes IS NOT NULL)   -- FIEMAP_EXTENT_ENCODED
    AND role IN ('image', 'guest_file')           -- (vdisk_image: see map_vdisk_image)
),
ev AS (
  SELECT DISTINCT m.capture_id,
         CASE l.level WHEN 'vfs' THEN 'guest_file' ELSE 'image' END AS role,
         m.dev, m.ino, m.file_offset_bytes AS logical_bytes, m.disk_bytes AS physical_bytes,
         m.length_bytes, NULL::UINTEGER AS disk_dev, 'mapping_events' AS source, 3 AS prio,
         false AS shared, NULL::UBIGINT AS disk_length_bytes
  FROM mapping_events m
  JOIN base_levels l ON l.capture_id = m.capture_id AND l.dev = m.dev
                    AND l.level IN ('vfs', 'hostfs')
  WHERE m.map_type IN (2, 3) AND m.disk_bytes <> 18446744073709551615
    AND l.fs_type <> 'btrfs'                      -- btrfs reports logical addresses
),
allx AS (SELECT * FROM snap UNION ALL SELECT * FROM ev),
below AS (
  SELECT capture_id, CASE level WHEN 'vdisk' THEN 'guest_file' ELSE 'image' END AS role,
         min(dev) AS dev
  FROM device_map WHERE level IN ('vdisk', 'disk') GROUP BY ALL)
SELECT a.capture_id, a.role, a.dev, a.ino, a.logical_bytes,
       a.physical_bytes + coalesce(p.part_start_bytes, 0) AS physical_bytes,
       a.length_bytes, coalesce(a.disk_dev, b.dev) AS disk_dev, a.source, a.prio, a.shared,
       a.disk_length_bytes
FROM allx a
LEFT JOIN below b ON b.capture_id = a.capture_id AND b.role = a.role
-- FIEMAP and iomap give addresses on the file system's own device: on a
-- partition, its start carries them to the disk the requests are on
LEFT JOIN device_map p ON p.capture_id = a.capture_id AND p.dev = a.dev
                      AND p.level = CASE a.role WHEN 'guest_file' THEN 'vfs' ELSE 'hostfs' END;

-- File extents of every traced file (guest files on the virtual disk, the
-- image on the host disk).  Per file the best source wins: the FIEMAP
-- snapshot at capture end, else the one at start, else the mapping events
-- seen during the capture (files created and deleted while tracing).
-- Delayed-allocation and unknown extents (no address yet) are left out.
-- @column capture_id VARCHAR      capture
-- @column role VARCHAR            guest_file or image
-- @column dev UINTEGER            kernel dev_t of the file system holding the file
-- @column ino UBIGINT             inode number
-- @column logical_bytes UBIGINT   file offset where the extent starts
-- @column physical_bytes UBIGINT  byte offset on the disk below where it starts (a partition's start added)
-- @column length_bytes UBIGINT    extent length
-- @column disk_dev UINTEGER       kernel dev_t of the disk the bytes are on (a file system on several devices, btrfs RAID: one row per copy and per stripe)
-- @column source VARCHAR          fiemap_end, fiemap_start or mapping_events
-- @column disk_length_bytes UBIGINT a compressed extent (btrfs): the bytes from physical_bytes that hold all of it, compressed; NULL where the extent is on the disk byte for byte
CREATE OR REPLACE VIEW map_extents AS
WITH best AS (SELECT capture_id, dev, ino, min(prio) AS prio FROM _map_extents_all GROUP BY ALL)
SELECT a.capture_id, a.role, a.dev, a.ino, a.logical_bytes, a.physical_bytes, a.length_bytes,
       a.disk_dev, a.source, a.disk_length_bytes
FROM _map_extents_all a JOIN best b USING (capture_id, dev, ino, prio);
