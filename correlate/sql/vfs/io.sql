-- Module vfs.io: application file syscalls (level 1).
-- INCLUDE base.levels
-- INCLUDE codes.tables

-- One row per completed file syscall on the guest file system, one per
-- Linux AIO iocb (io_submit ... io_getevents: ts_ns is the submission,
-- end_ns the io_getevents call that reaped it, when the application learnt
-- of the completion, which may be after the I/O ended), and one per
-- io_uring request (ts_ns its submission, end_ns the posting of its CQE).
-- fallocate(2), and io_uring's, is op discard when it punches a hole or
-- zeroes a range (its bytes: the range, on success), else other;
-- sync_file_range(2), and io_uring's, is op sync with its range.
-- (io_uring's fsync: the whole file, as fsync(2).)
-- copy_file_range(2) and sendfile(2) read one file and write another: a
-- row per side on the traced file system (op read for the file read, op
-- write for the file written), both with the call's times and return;
-- splice(2) the same, for its one side that is not a pipe (io_uring's,
-- uring_splice, too).
-- ftruncate(2), and io_uring's, is op discard when it cuts the file short
-- (offset_bytes the new size, its bytes those cut off, on success), else other.
-- msync(2) of a file mapped from the guest file system is op sync with
-- MS_SYNC (the kernel then fsyncs the range), else other (MS_ASYNC does
-- nothing): no fd (-1), its address as a file offset, the length within
-- that one mapping (a range over several is recorded for its first).
-- syncfs(2) is op sync on the file system of its fd (ino: the fd's
-- file); sync(2), which syncs every file system, is one row on the
-- first traced guest file system (ino 0, fd -1).
-- The hints posix_fadvise(2), readahead(2) and madvise(2) (and io_uring's
-- fadvise and madvise) are in vfs_hints, not here.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        always 'vfs'
-- @column io_id UBIGINT        row id, unique in a capture (cpu << 48 | seq)
-- @column ts_ns UBIGINT        syscall entry (AIO, io_uring: submission), CLOCK_MONOTONIC ns
-- @column end_ns UBIGINT       syscall exit (AIO: the io_getevents that reaped it; io_uring: its CQE)
-- @column duration_ns UBIGINT  exit - entry
-- @column dev UINTEGER         kernel dev_t of the guest file system
-- @column ino UBIGINT          inode number (0 for sync)
-- @column offset_bytes BIGINT  file offset (-1 for fsync/fdatasync; sync_file_range, msync: where its range starts; ftruncate: the new size)
-- @column req_bytes UBIGINT    bytes asked for (fallocate, sync_file_range, msync: the range's length; 0 for sync_file_range: to the file's end; ftruncate: the file's size before)
-- @column ret_bytes BIGINT     bytes done (0 on error; fallocate: the range, on success; ftruncate: the bytes cut off, on success)
-- @column ret BIGINT           raw return value (bytes, or -errno)
-- @column bytes BIGINT         alias of ret_bytes, for cross-level queries
-- @column syscall VARCHAR      read, write, pread64, pwrite64, readv, ... fsync, sync_file_range, fallocate; aio_pread, aio_pwrite, ... for AIO iocbs; uring_read, uring_write, ..., uring_fsync, uring_sync_file_range, uring_fallocate, uring_ftruncate, uring_splice for io_uring requests; copy_file_range, sendfile, splice, uring_splice (a row per side); ftruncate; msync; syncfs, sync
-- @column op VARCHAR           read, write, sync, discard (fallocate punching a hole or zeroing a range; ftruncate cutting the file short) or other (other fallocate and ftruncate; msync without MS_SYNC)
-- @column falloc_mode USMALLINT fallocate's and uring_fallocate's mode (FALLOC_FL_* bits: 1 KEEP_SIZE, 2 PUNCH_HOLE, 16 ZERO_RANGE, ...); NULL for the other syscalls
-- @column direct BOOLEAN       file opened with O_DIRECT
-- @column sync BOOLEAN         file opened with O_SYNC or O_DSYNC
-- @column pid UINTEGER         process id
-- @column tid UINTEGER         thread id
-- @column fd INTEGER           file descriptor (-1 for msync and sync)
-- @column comm VARCHAR         task command name
CREATE OR REPLACE VIEW vfs_io AS
SELECT e.capture_id, c.machine, 'vfs' AS level, (e.cpu::UBIGINT << 48) | e.seq AS io_id, e.ts_ns, e.ts_ns + e.duration_ns AS end_ns,
       e.duration_ns, e.dev, e.ino, e.offset_bytes, e.req_bytes,
       CASE WHEN e.sc_op = 'fallocate' AND e.ret = 0 THEN e.req_bytes::BIGINT
            WHEN e.sc_op = 'ftruncate' AND e.ret = 0
              THEN greatest(e.req_bytes::BIGINT - e.offset_bytes, 0)
            ELSE greatest(e.ret, 0) END AS ret_bytes,
       e.ret, ret_bytes AS bytes, _vfs_syscall_call(e.syscall) AS syscall,
       CASE WHEN e.sc_op IN ('read', 'write', 'sync') THEN e.sc_op
            WHEN e.sc_op = 'fallocate' AND e.iov_count & (2 | 16) <> 0 THEN 'discard'
            WHEN e.sc_op = 'ftruncate' AND e.req_bytes::BIGINT > e.offset_bytes THEN 'discard'
            WHEN e.sc_op = 'msync' AND e.iov_count & 4 <> 0 THEN 'sync'   -- MS_SYNC
            ELSE 'other' END AS op,
       CASE WHEN e.sc_op = 'fallocate' THEN e.iov_count END AS falloc_mode,
       (e.f_flags & 16384) <> 0 AS direct,          -- O_DIRECT (x86 040000)
       (e.f_flags & 1052672) <> 0 AS sync,          -- O_SYNC | O_DSYNC
       e.pid, e.tid, e.fd, e.comm
FROM (SELECT *, _vfs_syscall_op(syscall) AS sc_op FROM vfs_events) e
JOIN capture_meta c USING (capture_id)
WHERE e.sc_op IS DISTINCT FROM 'hint';

-- One row per posix_fadvise(2) (fadvise64; io_uring's, uring_fadvise, from
-- its submission to its CQE) or readahead(2) call on a file of the guest
-- file system, and per madvise(2) (io_uring's: uring_madvise) of a
-- mapping of one with advice about its I/O (normal, random, sequential,
-- willneed, remove, cold, pageout, populate_read, populate_write: not the
-- memory management ones, dontneed, free, hugepage, ...; as msync in
-- vfs_io: no fd, its address as a file offset, the length within that
-- one mapping): the hints an application gives about its I/O, with
-- their ranges.  Not I/O, so not in vfs_io: the virtual-disk reads a
-- readahead, a willneed or a madvise populate_read queues while it runs
-- are links' kind hint, tied to its row here (upper_id).  (fio's
-- fadvise_hint and invalidate show as random and dontneed.)
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        always 'vfs'
-- @column io_id UBIGINT        row id, unique in a capture (cpu << 48 | seq)
-- @column ts_ns UBIGINT        syscall entry, CLOCK_MONOTONIC ns
-- @column end_ns UBIGINT       syscall exit
-- @column duration_ns UBIGINT  exit - entry
-- @column dev UINTEGER         kernel dev_t of the guest file system
-- @column ino UBIGINT          inode number
-- @column offset_bytes BIGINT  where the range starts
-- @column req_bytes UBIGINT    the range's length (fadvise64, uring_fadvise: 0 to the file's end)
-- @column ret BIGINT           raw return value (0, or -errno)
-- @column syscall VARCHAR      fadvise64, uring_fadvise, readahead, madvise or uring_madvise
-- @column advice VARCHAR       fadvise64's and uring_fadvise's advice: normal, random, sequential, willneed, dontneed or noreuse (POSIX_FADV_*); madvise's and uring_madvise's: normal, random, sequential, willneed, remove, cold, pageout, populate_read or populate_write (MADV_*); NULL for readahead
-- @column reads BOOLEAN        the kernel reads the range in before the call returns: readahead, willneed, madvise's and uring_madvise's populate_read
-- @column to_end BOOLEAN       the range runs to the file's end (fadvise64, uring_fadvise with length 0)
-- @column pid UINTEGER         process id
-- @column tid UINTEGER         thread id
-- @column fd INTEGER           file descriptor (-1 for madvise and uring_madvise)
-- @column comm VARCHAR         task command name
CREATE OR REPLACE VIEW vfs_hints AS
SELECT e.capture_id, c.machine, 'vfs' AS level, (e.cpu::UBIGINT << 48) | e.seq AS io_id, e.ts_ns,
       e.ts_ns + e.duration_ns AS end_ns, e.duration_ns, e.dev, e.ino, e.offset_bytes, e.req_bytes,
       e.ret, _vfs_syscall_call(e.syscall) AS syscall,
       CASE WHEN e.syscall IN (_vfs_syscall('fadvise'), _vfs_syscall('uring_fadvise'))
              THEN ['normal', 'random', 'sequential', 'willneed', 'dontneed',
                    'noreuse'][e.iov_count + 1]
            WHEN e.syscall IN (_vfs_syscall('madvise'), _vfs_syscall('uring_madvise')) THEN coalesce(
              ['normal', 'random', 'sequential', 'willneed', 'dontneed', NULL, NULL, NULL, 'free',
               'remove', 'dontfork', 'dofork', 'mergeable', 'unmergeable', 'hugepage',
               'nohugepage', 'dontdump', 'dodump', 'wipeonfork', 'keeponfork', 'cold', 'pageout',
               'populate_read', 'populate_write', 'dontneed_locked', 'collapse'][e.iov_count + 1],
              e.iov_count::VARCHAR) END AS advice,
       e.syscall = _vfs_syscall('readahead') OR advice IN ('willneed', 'populate_read') AS reads,
       e.syscall IN (_vfs_syscall('fadvise'), _vfs_syscall('uring_fadvise')) AND e.req_bytes = 0
         AS to_end,
       e.pid, e.tid, e.fd, e.comm
FROM vfs_events e JOIN capture_meta c USING (capture_id)
WHERE _vfs_syscall_op(e.syscall) = 'hint';
