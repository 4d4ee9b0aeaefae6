-- Module vfs.processes: the processes that made the application's calls,
-- one row each: what each did, and what that cost down the stack (iotop's
-- table, down to the host disk).
-- INCLUDE amplification.amplification

-- Per capture and process: the calls, bytes and time it spent in them,
-- with none of the other levels (what report lists, cheaply).
CREATE OR REPLACE VIEW _vfs_processes_app AS
SELECT capture_id, pid, mode(comm) AS comm, count(DISTINCT tid) AS threads,
       count(DISTINCT (dev, ino)) FILTER (WHERE ino <> 0) AS files, count(*) AS calls,
       count(*) FILTER (WHERE op = 'read') AS reads,
       count(*) FILTER (WHERE op = 'write') AS writes,
       count(*) FILTER (WHERE op = 'sync') AS syncs,
       coalesce(sum(ret_bytes) FILTER (WHERE op = 'read'), 0)::BIGINT AS read_bytes,
       coalesce(sum(ret_bytes) FILTER (WHERE op = 'write'), 0)::BIGINT AS write_bytes,
       sum(duration_ns)::BIGINT AS busy_ns
FROM vfs_io GROUP BY capture_id, pid;

-- Per capture and process that made calls on a traced guest file system:
-- its name, threads and files, the calls, the bytes they read and wrote
-- and the time they took, and the bytes the links put down to its reads
-- and writes at the virtual disk and at the host disk.
-- @column capture_id VARCHAR   capture
-- @column pid UINTEGER         process id
-- @column comm VARCHAR         its task name on most of its calls (a process that exec'd has had two)
-- @column threads BIGINT       distinct threads that made the calls
-- @column files BIGINT         distinct files they were on (a sync(2) is on none)
-- @column calls BIGINT         its rows in vfs_io
-- @column reads BIGINT         of them, op read
-- @column writes BIGINT        of them, op write
-- @column syncs BIGINT         of them, op sync
-- @column read_bytes BIGINT    bytes read (ret_bytes)
-- @column write_bytes BIGINT   bytes written (ret_bytes)
-- @column busy_ns BIGINT       the calls' durations added up (calls in flight together each count)
-- @column vdisk_bytes BIGINT   virtual-disk bytes the links put down to its reads and writes (amplification_per_io: in flight with a read or write, or its write-back)
-- @column disk_bytes DOUBLE    host-disk bytes put down to them (through the virtual-disk requests they caused)
CREATE OR REPLACE VIEW vfs_processes AS
WITH down AS (
  SELECT capture_id, pid, sum(vdisk_bytes)::BIGINT AS vdisk_bytes,
         sum(disk_bytes)::DOUBLE AS disk_bytes
  FROM amplification_per_io GROUP BY ALL)
SELECT p.*, coalesce(d.vdisk_bytes, 0) AS vdisk_bytes, coalesce(d.disk_bytes, 0) AS disk_bytes
FROM _vfs_processes_app p LEFT JOIN down d USING (capture_id, pid);
