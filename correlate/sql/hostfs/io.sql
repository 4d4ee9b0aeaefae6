-- Module hostfs.io: the host file system's accesses to the image (level 3).
-- INCLUDE base.levels
-- INCLUDE hostfs.sources
-- INCLUDE codes.tables

-- One row per access of the image file through the host file system.
-- On xfs the exact xfs_file_* read/write events are used; on other file
-- systems iomap direct I/O, filemap page lookups (buffered reads, in
-- batches of pages) and ext4 write_begin (buffered writes, per folio):
-- the hostfs_source table in schemas/records.toml (_hostfs_sources).
-- btrfs has no buffered-write tracepoint: its writes are the image pages
-- it dirties (one row per folio, source writeback_dirty_folio); see
-- docs/design/hostfs-hooks.md.
-- An xfs direct write not aligned to the FS block is tried first under the
-- shared inode lock, for overwrites only; where it needs allocation, xfs
-- tries it again under the exclusive lock, and the tracepoint fires twice.
-- The failed try (shared lock, then the same process's same range under
-- the exclusive lock within 10 ms) is left out: it did no I/O.
-- filemap_read asks for pages in batches (31 at a time), and each ask's
-- event carries what is left of the read, to its end: the first ask of a
-- read is the whole read, and the asks that continue it (the same task's
-- next ask on the file, ending where it ends, starting further on) are
-- left out, so that a buffered read is one row, as on xfs. ext4's
-- write_begin events do the same with large folios (ext2/3/4 on 6.16 and
-- later): each folio's event carries what is left of the write, up to the
-- page cache's largest folio, and a buffered write is one row too.
-- Holes punched in the image (the loop device's discards, and its
-- write-zeroes) and ranges zeroed in it (write-zeroes that must not
-- unmap) are op discard: ext4_punch_hole and ext4_zero_range on
-- ext2/3/4, and on xfs the unmaps
-- (xfs_bunmap) its hole punching makes, each repeated for every
-- transaction the range takes (the repeats, the same task's same range
-- within 10 ms, are left out). btrfs has no such tracepoint.
-- A discard row is cut at the file's end then (its size rounded up to
-- the FS block), and one wholly past it is left out: a truncate of the
-- image, xfs trimming the blocks it preallocated past the end, and a
-- zero-range that grows the file (a hypervisor preallocating) unmap or
-- zero no byte the file held.  They stay in table hostfs_events.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        always 'hostfs'
-- @column io_id UBIGINT        row id, unique in a capture (cpu << 48 | seq)
-- @column ts_ns UBIGINT        time of the access, CLOCK_MONOTONIC ns
-- @column dev UINTEGER         kernel dev_t of the host file system
-- @column ino UBIGINT          inode of the image file (or of a file of its backing chain)
-- @column offset_bytes BIGINT  image file offset
-- @column bytes UBIGINT        length
-- @column op VARCHAR           read, write, discard or sync
-- @column direct BOOLEAN       O_DIRECT access (bypasses the host page cache)
-- @column source VARCHAR       tracepoint the row comes from
-- @column fs_type VARCHAR      host file system type
-- @column pid UINTEGER         process (the loop worker, or the hypervisor)
-- @column comm VARCHAR         task command name
CREATE OR REPLACE VIEW hostfs_io AS
WITH ev AS (
  SELECT e.*, l.machine, l.fs_type, s.hook,
         -- the file's end at the time, in whole FS blocks
         (ceil(e.isize_bytes / coalesce(l.block_size_bytes, 1)) * coalesce(l.block_size_bytes, 1))::BIGINT
           AS file_end
  FROM hostfs_events e
  JOIN base_levels l ON l.capture_id = e.capture_id AND l.dev = e.dev AND l.level = 'hostfs'
  -- the hooks listed for this FS, or for '*' if it has no list of its own
  JOIN _hostfs_sources s ON s.source = e.source
   AND s.fs_type = CASE WHEN l.fs_type IN (SELECT fs_type FROM _hostfs_sources)
                        THEN l.fs_type ELSE '*' END),
unaligned AS (   -- xfs direct writes not aligned to the FS block, with the
                 -- process's next write of the same range (read apart from
                 -- ev: only these rows, and ev is not scanned twice)
  SELECT e.capture_id, e.cpu, e.seq, e.ts_ns, e.iocb_flags,
         lead(e.ts_ns) OVER w AS next_ns, lead(e.iocb_flags) OVER w AS next_flags
  FROM hostfs_events e
  JOIN base_levels l ON l.capture_id = e.capture_id AND l.dev = e.dev AND l.level = 'hostfs'
  WHERE e.source = _hostfs_source('xfs_file_direct_write') AND l.fs_type = 'xfs'
    AND (e.offset_bytes % l.block_size_bytes <> 0 OR e.bytes % l.block_size_bytes <> 0)
  WINDOW w AS (PARTITION BY e.offset_bytes, e.ino, e.pid, e.bytes, e.dev, e.capture_id
               ORDER BY e.ts_ns, e.cpu, e.seq)),
asks AS (   -- buffered reads' page lookups and buffered writes' per-folio
            -- begins, with the task's previous one of the same direction
  SELECT capture_id, cpu, seq, offset_bytes, offset_bytes + bytes AS end_bytes,
         lag(offset_bytes) OVER w AS prev_offset, lag(offset_bytes + bytes) OVER w AS prev_end
  FROM hostfs_events
  WHERE source IN (_hostfs_source('mm_filemap_get_pages'), _hostfs_source('ext4_write_begin'),
                   _hostfs_source('ext4_da_write_begin'))
  WINDOW w AS (PARTITION BY ino, pid, op, dev, capture_id ORDER BY ts_ns, cpu, seq)),
unmaps AS (   -- xfs unmaps with the task's previous one
  SELECT capture_id, cpu, seq, ts_ns, offset_bytes, bytes,
         lag(ts_ns) OVER w AS prev_ns, lag(offset_bytes) OVER w AS prev_offset,
         lag(bytes) OVER w AS prev_bytes
  FROM hostfs_events
  WHERE source = _hostfs_source('xfs_bunmap')
  WINDOW w AS (PARTITION BY ino, pid, dev, capture_id ORDER BY ts_ns, cpu, seq)),
dropped AS (
  -- a try under the shared iolock (overwrites only) that xfs gave up and
  -- made again under the exclusive one
  SELECT capture_id, cpu, seq FROM unaligned
  WHERE iocb_flags & 32 = 0 AND next_flags & 32 <> 0 AND next_ns - ts_ns < 10000000
  UNION ALL   -- the rest of a buffered read or write the task's previous ask covered
  SELECT capture_id, cpu, seq FROM asks
  WHERE end_bytes = prev_end AND offset_bytes > prev_offset AND offset_bytes < prev_end
  UNION ALL   -- the same unmap again, in the range's next transaction
  SELECT capture_id, cpu, seq FROM unmaps
  WHERE offset_bytes = prev_offset AND bytes = prev_bytes AND ts_ns - prev_ns < 10000000)
SELECT e.capture_id, e.machine, 'hostfs' AS level, (e.cpu::UBIGINT << 48) | e.seq AS io_id, e.ts_ns,
       e.dev, e.ino, e.offset_bytes,
       CASE WHEN e.op = _hostfs_op('discard') THEN least(e.offset_bytes + e.bytes, e.file_end) - e.offset_bytes
            ELSE e.bytes END::UBIGINT AS bytes,
       coalesce(_hostfs_op_name(e.op), 'sync') AS op,
       (e.iocb_flags & 1) <> 0 AS direct, e.hook AS source,
       e.fs_type, e.pid, e.comm
FROM ev e ANTI JOIN dropped f ON f.capture_id = e.capture_id AND f.cpu = e.cpu AND f.seq = e.seq
WHERE e.op <> _hostfs_op('discard') OR e.offset_bytes < e.file_end
UNION ALL
SELECT p.capture_id, l.machine, 'hostfs', (p.cpu::UBIGINT << 48) | p.seq, p.ts_ns, p.dev, p.ino,
       (p.index * 4096)::BIGINT, p.nr_pages * 4096, 'write', false, 'writeback_dirty_folio',
       l.fs_type, p.pid, p.comm
FROM pagecache_events p
JOIN base_levels l ON l.capture_id = p.capture_id AND l.dev = p.dev AND l.level = 'hostfs'
SEMI JOIN _base_image_files f ON f.capture_id = p.capture_id AND f.ino = p.ino
WHERE l.fs_type = 'btrfs' AND p.event = _pagecache_event('dirty');
