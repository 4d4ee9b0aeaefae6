-- Module compare.captures: captures of one store side by side (the
-- guest FS x host FS matrix that `nestrace lab run` records).
-- INCLUDE amplification.amplification
-- INCLUDE seek.distances
-- INCLUDE phases.phases
-- INCLUDE depth.outstanding

-- One row per capture: the stack it ran on, the workload's outcome, and
-- the numbers that tell two stacks apart (bytes per level, amplification
-- to the host disk, sequentiality, latency).  Block-level medians take the
-- level's busiest device when a level has several.
-- @column capture_id VARCHAR          capture
-- @column start_wall VARCHAR          capture start, UTC wall clock (ISO 8601)
-- @column guest_fs VARCHAR            guest file system (vfs level; the types joined by + when the capture traced several of different types, as ext4+xfs); NULL when not traced
-- @column host_fs VARCHAR             host file system holding the image (hostfs level); none: the raw baseline (the virtual disk a host block device); NULL when not traced
-- @column guest_block_bytes UINTEGER  guest file system block size (the largest of several)
-- @column host_block_bytes UINTEGER   host file system block size
-- @column guest_dio BOOLEAN           the virtual disk (a loop device) reads and writes the image with O_DIRECT; NULL when it is not a loop device
-- @column host_dio BOOLEAN            the host disk (a loop device) bypasses its backing file's page cache; NULL when it is not a loop device
-- @column command VARCHAR             workload command
-- @column command_exit INTEGER        its exit status (NULL: no command, or a store written before it was kept)
-- @column seconds DOUBLE              capture length (end_ns - start_ns)
-- @column app_read_bytes BIGINT       bytes the application read (vfs)
-- @column app_write_bytes BIGINT      bytes the application wrote (vfs)
-- @column app_mib_per_s DOUBLE        (app_read_bytes + app_write_bytes) in MiB per second of the application's I/O (first read or write entered to last one done)
-- @column app_median_ns DOUBLE        median duration of the application's reads and writes
-- @column app_p99_ns DOUBLE           99th percentile of the same
-- @column vdisk_read_bytes BIGINT     bytes read at the virtual disk
-- @column vdisk_write_bytes BIGINT    bytes written at the virtual disk
-- @column hostfs_read_bytes BIGINT    bytes the virtual disk read from the image (hostfs)
-- @column hostfs_write_bytes BIGINT   bytes it wrote to the image
-- @column disk_read_bytes BIGINT      bytes read at the host disk
-- @column disk_write_bytes BIGINT     bytes written at the host disk
-- @column disk_read_x_app DOUBLE      disk_read_bytes / app_read_bytes (NULL when the app read nothing)
-- @column disk_write_x_app DOUBLE     disk_write_bytes / app_write_bytes (NULL when the app wrote nothing)
-- @column vdisk_requests BIGINT       read and write requests at the virtual disk
-- @column disk_requests BIGINT        read and write requests at the host disk
-- @column vdisk_sequential DOUBLE     share of virtual-disk requests with seek distance 0
-- @column disk_sequential DOUBLE      share of host-disk requests with seek distance 0
-- @column disk_seek_median_sectors BIGINT median |seek distance| at the host disk, sectors
-- @column vdisk_q2c_median_ns DOUBLE  median Q2C at the virtual disk
-- @column disk_q2c_median_ns DOUBLE   median Q2C at the host disk
-- @column vdisk_in_flight DOUBLE virtual-disk requests in flight on average from its first dispatch to its last event (iostat aqu-sz: every request, the flushes and writes a `sync` anywhere makes included; depth_summary.avg_in_flight, summed over the level's devices)
-- @column disk_in_flight DOUBLE the same at the host disk
-- @column lost_total UBIGINT          events lost (capture_meta.lost_total)
CREATE OR REPLACE VIEW compare_captures AS
WITH dm AS (
  SELECT capture_id,
         string_agg(DISTINCT fs_type, '+' ORDER BY fs_type) FILTER (WHERE level = 'vfs') AS guest_fs,
         -- (the raw baseline: the calls and the host disk, nothing between)
         coalesce(max(fs_type) FILTER (WHERE level = 'hostfs'),
                  CASE WHEN bool_or(level = 'vfs') AND bool_or(level = 'disk') THEN 'none' END)
           AS host_fs,
         max(block_size_bytes) FILTER (WHERE level = 'vfs') AS guest_block_bytes,
         max(block_size_bytes) FILTER (WHERE level = 'hostfs') AS host_block_bytes,
         bool_or(dio) FILTER (WHERE level = 'vdisk' AND backing_path <> '') AS guest_dio,
         bool_or(dio) FILTER (WHERE level = 'disk' AND backing_path <> '') AS host_dio
  FROM device_map GROUP BY ALL),
amp AS (
  SELECT capture_id,
         max(bytes) FILTER (WHERE level = 'vfs' AND op = 'read') AS app_read_bytes,
         max(bytes) FILTER (WHERE level = 'vfs' AND op = 'write') AS app_write_bytes,
         max(bytes) FILTER (WHERE level = 'vdisk' AND op = 'read') AS vdisk_read_bytes,
         max(bytes) FILTER (WHERE level = 'vdisk' AND op = 'write') AS vdisk_write_bytes,
         max(bytes) FILTER (WHERE level = 'hostfs' AND op = 'read') AS hostfs_read_bytes,
         max(bytes) FILTER (WHERE level = 'hostfs' AND op = 'write') AS hostfs_write_bytes,
         max(bytes) FILTER (WHERE level = 'disk' AND op = 'read') AS disk_read_bytes,
         max(bytes) FILTER (WHERE level = 'disk' AND op = 'write') AS disk_write_bytes,
         max(ratio_to_app) FILTER (WHERE level = 'disk' AND op = 'read') AS disk_read_x_app,
         max(ratio_to_app) FILTER (WHERE level = 'disk' AND op = 'write') AS disk_write_x_app,
         sum(requests) FILTER (WHERE level = 'vdisk')::BIGINT AS vdisk_requests,
         sum(requests) FILTER (WHERE level = 'disk')::BIGINT AS disk_requests
  FROM amplification GROUP BY ALL),
app AS (
  SELECT capture_id, quantile_cont(duration_ns, [0.5, 0.99]) AS q,
         (max(end_ns) - min(ts_ns))::BIGINT AS span_ns
  FROM vfs_io WHERE op IN ('read', 'write') GROUP BY ALL),
seek AS (
  SELECT capture_id,
         max(sequential_fraction) FILTER (WHERE level = 'vdisk') AS vdisk_sequential,
         max(sequential_fraction) FILTER (WHERE level = 'disk') AS disk_sequential,
         max(median_abs) FILTER (WHERE level = 'disk') AS disk_seek_median_sectors
  FROM seek_summary GROUP BY ALL),
q2c AS (
  SELECT capture_id,
         max(median_ns) FILTER (WHERE level = 'vdisk') AS vdisk_q2c_median_ns,
         max(median_ns) FILTER (WHERE level = 'disk') AS disk_q2c_median_ns
  FROM phases_level_stats WHERE phase = 'q2c' GROUP BY ALL),
qd AS (
  SELECT capture_id,
         sum(avg_in_flight) FILTER (WHERE level = 'vdisk') AS vdisk_in_flight,
         sum(avg_in_flight) FILTER (WHERE level = 'disk') AS disk_in_flight
  FROM depth_summary GROUP BY ALL)
SELECT c.capture_id, c.start_wall, dm.guest_fs, dm.host_fs, dm.guest_block_bytes,
       dm.host_block_bytes, dm.guest_dio, dm.host_dio, c.command, c.command_exit,
       (c.end_ns::BIGINT - c.start_ns::BIGINT) / 1e9 AS seconds,
       a.app_read_bytes, a.app_write_bytes,
       (a.app_read_bytes + a.app_write_bytes) / 1048576 / nullif(app.span_ns / 1e9, 0)
         AS app_mib_per_s,
       app.q[1]::DOUBLE AS app_median_ns, app.q[2]::DOUBLE AS app_p99_ns,
       a.vdisk_read_bytes, a.vdisk_write_bytes, a.hostfs_read_bytes, a.hostfs_write_bytes,
       a.disk_read_bytes, a.disk_write_bytes, a.disk_read_x_app, a.disk_write_x_app,
       a.vdisk_requests, a.disk_requests,
       s.vdisk_sequential, s.disk_sequential, s.disk_seek_median_sectors,
       q.vdisk_q2c_median_ns, q.disk_q2c_median_ns, qd.vdisk_in_flight, qd.disk_in_flight,
       c.lost_total
FROM capture_meta c
LEFT JOIN dm USING (capture_id)
LEFT JOIN amp a USING (capture_id)
LEFT JOIN app USING (capture_id)
LEFT JOIN seek s USING (capture_id)
LEFT JOIN q2c q USING (capture_id)
LEFT JOIN qd USING (capture_id);

-- One row per stack of a store whose captures repeat stacks (`lab run
-- --repeat N`): the rounds' medians, and the spread of the throughput.
-- A stack is the same file systems, block sizes, dio modes and command.
-- Rounds whose workload exited non-zero are counted in failed_rounds and
-- left out of every number.
-- @column guest_fs VARCHAR            guest file system
-- @column host_fs VARCHAR             host file system
-- @column guest_block_bytes UINTEGER  guest file system block size (the largest of several)
-- @column host_block_bytes UINTEGER   host file system block size
-- @column guest_dio BOOLEAN           the virtual disk's O_DIRECT on the image
-- @column host_dio BOOLEAN            the host disk bypasses its backing file's page cache
-- @column command VARCHAR             workload command
-- @column rounds BIGINT               captures of this stack whose workload exited 0 (or ran no command)
-- @column failed_rounds BIGINT        captures of this stack whose workload exited non-zero
-- @column app_mib_per_s DOUBLE        median over the rounds of compare_captures.app_mib_per_s
-- @column app_mib_per_s_min DOUBLE    lowest round
-- @column app_mib_per_s_max DOUBLE    highest round
-- @column app_median_ns DOUBLE        median over the rounds of the application's median latency
-- @column app_p99_ns DOUBLE           median over the rounds of its 99th percentile
-- @column disk_read_x_app DOUBLE      median over the rounds of host-disk bytes read per application byte read
-- @column disk_write_x_app DOUBLE     median over the rounds of host-disk bytes written per application byte written
-- @column vdisk_sequential DOUBLE     median over the rounds of the share of sequential virtual-disk requests
-- @column disk_sequential DOUBLE      median over the rounds of the share of sequential host-disk requests
-- @column disk_q2c_median_ns DOUBLE   median over the rounds of the host disk's median Q2C
-- @column lost_total UBIGINT          events lost over all the stack's captures
-- @column capture_ids VARCHAR[]       the captures, in order
CREATE OR REPLACE VIEW compare_stacks AS
SELECT guest_fs, host_fs, guest_block_bytes, host_block_bytes, guest_dio, host_dio, command,
       count(*) FILTER (WHERE coalesce(command_exit, 0) = 0) AS rounds,
       count(*) FILTER (WHERE command_exit <> 0) AS failed_rounds,
       median(app_mib_per_s) FILTER (WHERE coalesce(command_exit, 0) = 0) AS app_mib_per_s,
       min(app_mib_per_s) FILTER (WHERE coalesce(command_exit, 0) = 0) AS app_mib_per_s_min,
       max(app_mib_per_s) FILTER (WHERE coalesce(command_exit, 0) = 0) AS app_mib_per_s_max,
       median(app_median_ns) FILTER (WHERE coalesce(command_exit, 0) = 0) AS app_median_ns,
       median(app_p99_ns) FILTER (WHERE coalesce(command_exit, 0) = 0) AS app_p99_ns,
       median(disk_read_x_app) FILTER (WHERE coalesce(command_exit, 0) = 0) AS disk_read_x_app,
       median(disk_write_x_app) FILTER (WHERE coalesce(command_exit, 0) = 0) AS disk_write_x_app,
       median(vdisk_sequential) FILTER (WHERE coalesce(command_exit, 0) = 0) AS vdisk_sequential,
       median(disk_sequential) FILTER (WHERE coalesce(command_exit, 0) = 0) AS disk_sequential,
       median(disk_q2c_median_ns) FILTER (WHERE coalesce(command_exit, 0) = 0)
         AS disk_q2c_median_ns,
       sum(lost_total)::UBIGINT AS lost_total,
       list(capture_id ORDER BY capture_id) AS capture_ids
FROM compare_captures
GROUP BY guest_fs, host_fs, guest_block_bytes, host_block_bytes, guest_dio, host_dio, command;
