-- Module vfs.files: the application's files, one row each: what was done
-- to each, and what that cost down the stack.
-- INCLUDE amplification.amplification
-- INCLUDE seek.distances

-- Per capture and file: the calls on it and its path, with none of the
-- other levels (what report lists, cheaply).
CREATE OR REPLACE VIEW _vfs_files_app AS
WITH f AS (
  SELECT capture_id, dev, ino, count(*) AS calls,
         count(*) FILTER (WHERE op = 'read') AS reads,
         count(*) FILTER (WHERE op = 'write') AS writes,
         count(*) FILTER (WHERE op = 'sync') AS syncs,
         coalesce(sum(ret_bytes) FILTER (WHERE op = 'read'), 0)::BIGINT AS read_bytes,
         coalesce(sum(ret_bytes) FILTER (WHERE op = 'write'), 0)::BIGINT AS write_bytes,
         sum(duration_ns)::BIGINT AS busy_ns, count(DISTINCT pid) AS processes
  FROM vfs_io WHERE ino <> 0 GROUP BY ALL),
names AS (
  SELECT capture_id, dev, ino,
         max_by(path, CASE phase WHEN 'end' THEN 2 WHEN 'start' THEN 1 ELSE 0 END) AS path
  FROM extent_maps WHERE role = 'guest_file' AND path <> '' GROUP BY ALL)
SELECT f.*, n.path FROM f LEFT JOIN names n USING (capture_id, dev, ino);

-- Per capture and file of a traced guest file system: its path, the calls
-- on it, the bytes they read and wrote and the time they took, how
-- sequential its reads and writes were, and the bytes the links put down
-- to its reads and writes at the virtual disk and at the host disk.
-- @column capture_id VARCHAR   capture
-- @column dev UINTEGER         kernel dev_t of the guest file system
-- @column ino UBIGINT          inode number
-- @column path VARCHAR         the file's path, from the capture's file snapshots (extent_maps rows of role guest_file, the end one first); NULL for a file in none (deleted before the capture ended, say)
-- @column calls BIGINT         its rows in vfs_io
-- @column reads BIGINT         of them, op read
-- @column writes BIGINT        of them, op write
-- @column syncs BIGINT         of them, op sync (fsync, fdatasync, sync_file_range, msync with MS_SYNC, syncfs on it)
-- @column read_bytes BIGINT    bytes read (ret_bytes)
-- @column write_bytes BIGINT   bytes written (ret_bytes)
-- @column busy_ns BIGINT       the calls' durations added up (calls in flight together each count)
-- @column sequential_fraction DOUBLE share of its reads and writes after the first that began where the one before on the file ended (seek_distances); NULL with fewer than two
-- @column vdisk_bytes BIGINT   virtual-disk bytes the links put down to its reads and writes (amplification_per_io: in flight with a read or write, or its write-back)
-- @column disk_bytes DOUBLE    host-disk bytes put down to them (through the virtual-disk requests they caused)
-- @column processes BIGINT     distinct processes that made the calls
CREATE OR REPLACE VIEW vfs_files AS
WITH seq AS (
  SELECT capture_id, dev, ino, avg(sequential::INTEGER)::DOUBLE AS sequential_fraction
  FROM seek_distances WHERE level = 'vfs' GROUP BY ALL),
down AS (
  SELECT capture_id, dev, ino, sum(vdisk_bytes)::BIGINT AS vdisk_bytes,
         sum(disk_bytes)::DOUBLE AS disk_bytes
  FROM amplification_per_io GROUP BY ALL)
SELECT f.capture_id, f.dev, f.ino, f.path, f.calls, f.reads, f.writes, f.syncs, f.read_bytes,
       f.write_bytes, f.busy_ns, s.sequential_fraction, coalesce(d.vdisk_bytes, 0) AS vdisk_bytes,
       coalesce(d.disk_bytes, 0) AS disk_bytes, f.processes
FROM _vfs_files_app f
LEFT JOIN seq s USING (capture_id, dev, ino)
LEFT JOIN down d USING (capture_id, dev, ino);
