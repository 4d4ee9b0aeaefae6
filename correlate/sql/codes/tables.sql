-- Module codes.tables: GENERATED from schemas/records.toml by
-- nestrace.schema.gen: do not edit.

-- The code tables of the record fields, for the modules to name codes
-- instead of writing numbers: _<enum>('name') is the code (folded to a
-- constant), _<enum>_<column>(code) the column's value for a code.

-- hostfs_event.source: The host-FS tracepoint a hostfs_event comes from,
-- and the host file systems whose image accesses it reports.
CREATE OR REPLACE VIEW _code_hostfs_source AS
SELECT * FROM (VALUES
  (1, 'xfs_file_buffered_read', ['xfs']),
  (2, 'xfs_file_buffered_write', ['xfs']),
  (3, 'xfs_file_direct_read', ['xfs']),
  (4, 'xfs_file_direct_write', ['xfs']),
  (5, 'iomap_dio_rw_begin', ['ext2', 'ext3', 'ext4', 'btrfs', '*']),
  (6, 'mm_filemap_get_pages', ['ext2', 'ext3', 'ext4', 'btrfs', '*']),
  (7, 'ext4_write_begin', ['ext2', 'ext3', 'ext4']),
  (8, 'ext4_da_write_begin', ['ext2', 'ext3', 'ext4']),
  (9, 'xfs_bunmap', ['xfs']),
  (10, 'ext4_punch_hole', ['ext2', 'ext3', 'ext4']),
  (11, 'ext4_zero_range', ['ext2', 'ext3', 'ext4'])
) AS t(code, name, fs_types);
CREATE OR REPLACE MACRO _hostfs_source(n) AS CASE n WHEN 'xfs_file_buffered_read' THEN 1 WHEN 'xfs_file_buffered_write' THEN 2 WHEN 'xfs_file_direct_read' THEN 3 WHEN 'xfs_file_direct_write' THEN 4 WHEN 'iomap_dio_rw_begin' THEN 5 WHEN 'mm_filemap_get_pages' THEN 6 WHEN 'ext4_write_begin' THEN 7 WHEN 'ext4_da_write_begin' THEN 8 WHEN 'xfs_bunmap' THEN 9 WHEN 'ext4_punch_hole' THEN 10 WHEN 'ext4_zero_range' THEN 11 END;
CREATE OR REPLACE MACRO _hostfs_source_name(code) AS ([NULL, 'xfs_file_buffered_read', 'xfs_file_buffered_write', 'xfs_file_direct_read', 'xfs_file_direct_write', 'iomap_dio_rw_begin', 'mm_filemap_get_pages', 'ext4_write_begin', 'ext4_da_write_begin', 'xfs_bunmap', 'ext4_punch_hole', 'ext4_zero_range']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _hostfs_source_fs_types(code) AS ([NULL, ['xfs'], ['xfs'], ['xfs'], ['xfs'], ['ext2', 'ext3', 'ext4', 'btrfs', '*'], ['ext2', 'ext3', 'ext4', 'btrfs', '*'], ['ext2', 'ext3', 'ext4'], ['ext2', 'ext3', 'ext4'], ['xfs'], ['ext2', 'ext3', 'ext4'], ['ext2', 'ext3', 'ext4']]::VARCHAR[][])[code + 1];

-- device_map.level: The levels of a traced stack in chain order, top to
-- bottom: the code is the level's place in the chain
-- (chain_levels.position). A capture holds the levels its stack has; the
-- chain stops at the lowest one traced.
CREATE OR REPLACE VIEW _code_level AS
SELECT * FROM (VALUES
  (1, 'vfs', 'the application''s file calls on the guest file system'),
  (2, 'vdisk', 'the requests on the virtual disk under the guest file system (a loop device; virtio-blk in a guest)'),
  (3, 'netfs', 'the requests a network file system''s client sends for the image (or the guest''s files) to its server: sshfs''s FUSE requests'),
  (4, 'hostfs', 'the accesses of the disk image through the host file system (on a network mount: the server''s file system, the file it exports)'),
  (5, 'disk', 'the requests on the disk under the host file system')
) AS t(code, name, what);
CREATE OR REPLACE MACRO _level(n) AS CASE n WHEN 'vfs' THEN 1 WHEN 'vdisk' THEN 2 WHEN 'netfs' THEN 3 WHEN 'hostfs' THEN 4 WHEN 'disk' THEN 5 END;
CREATE OR REPLACE MACRO _level_name(code) AS ([NULL, 'vfs', 'vdisk', 'netfs', 'hostfs', 'disk']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _level_what(code) AS ([NULL, 'the application''s file calls on the guest file system', 'the requests on the virtual disk under the guest file system (a loop device; virtio-blk in a guest)', 'the requests a network file system''s client sends for the image (or the guest''s files) to its server: sshfs''s FUSE requests', 'the accesses of the disk image through the host file system (on a network mount: the server''s file system, the file it exports)', 'the requests on the disk under the host file system']::VARCHAR[])[code + 1];

-- vfs_event.syscall: The call a vfs_event records. Linux AIO: one record
-- per iocb, from io_submit to the io_getevents that reaped it. io_uring:
-- one record per request, from submission to its CQE. copy_file_range,
-- sendfile and splice: a record per side on a traced file system (the file
-- read: _in, the file written: _out, always _in + 1), both with the call's
-- return.
CREATE OR REPLACE VIEW _code_vfs_syscall AS
SELECT * FROM (VALUES
  (1, 'read', 'read', 'read'),
  (2, 'write', 'write', 'write'),
  (3, 'pread64', 'pread64', 'read'),
  (4, 'pwrite64', 'pwrite64', 'write'),
  (5, 'readv', 'readv', 'read'),
  (6, 'writev', 'writev', 'write'),
  (7, 'preadv', 'preadv', 'read'),
  (8, 'pwritev', 'pwritev', 'write'),
  (9, 'preadv2', 'preadv2', 'read'),
  (10, 'pwritev2', 'pwritev2', 'write'),
  (11, 'fsync', 'fsync', 'sync'),
  (12, 'fdatasync', 'fdatasync', 'sync'),
  (13, 'sync_file_range', 'sync_file_range', 'sync'),
  (14, 'aio_pread', 'aio_pread', 'read'),
  (15, 'aio_pwrite', 'aio_pwrite', 'write'),
  (16, 'aio_fsync', 'aio_fsync', 'sync'),
  (17, 'aio_fdsync', 'aio_fdsync', 'sync'),
  (18, 'aio_preadv', 'aio_preadv', 'read'),
  (19, 'aio_pwritev', 'aio_pwritev', 'write'),
  (20, 'uring_read', 'uring_read', 'read'),
  (21, 'uring_write', 'uring_write', 'write'),
  (22, 'uring_readv', 'uring_readv', 'read'),
  (23, 'uring_writev', 'uring_writev', 'write'),
  (24, 'uring_fsync', 'uring_fsync', 'sync'),
  (25, 'fallocate', 'fallocate', 'fallocate'),
  (26, 'uring_sync_file_range', 'uring_sync_file_range', 'sync'),
  (27, 'uring_fallocate', 'uring_fallocate', 'fallocate'),
  (28, 'copy_file_range_in', 'copy_file_range', 'read'),
  (29, 'copy_file_range_out', 'copy_file_range', 'write'),
  (30, 'sendfile_in', 'sendfile', 'read'),
  (31, 'sendfile_out', 'sendfile', 'write'),
  (32, 'ftruncate', 'ftruncate', 'ftruncate'),
  (33, 'splice_in', 'splice', 'read'),
  (34, 'splice_out', 'splice', 'write'),
  (35, 'fadvise', 'fadvise64', 'hint'),
  (36, 'readahead', 'readahead', 'hint'),
  (37, 'msync', 'msync', 'msync'),
  (38, 'syncfs', 'syncfs', 'sync'),
  (39, 'sync', 'sync', 'sync'),
  (40, 'madvise', 'madvise', 'hint'),
  (41, 'uring_fadvise', 'uring_fadvise', 'hint'),
  (42, 'uring_ftruncate', 'uring_ftruncate', 'ftruncate'),
  (43, 'uring_madvise', 'uring_madvise', 'hint'),
  (44, 'uring_splice_in', 'uring_splice', 'read'),
  (45, 'uring_splice_out', 'uring_splice', 'write')
) AS t(code, name, call, op);
CREATE OR REPLACE MACRO _vfs_syscall(n) AS CASE n WHEN 'read' THEN 1 WHEN 'write' THEN 2 WHEN 'pread64' THEN 3 WHEN 'pwrite64' THEN 4 WHEN 'readv' THEN 5 WHEN 'writev' THEN 6 WHEN 'preadv' THEN 7 WHEN 'pwritev' THEN 8 WHEN 'preadv2' THEN 9 WHEN 'pwritev2' THEN 10 WHEN 'fsync' THEN 11 WHEN 'fdatasync' THEN 12 WHEN 'sync_file_range' THEN 13 WHEN 'aio_pread' THEN 14 WHEN 'aio_pwrite' THEN 15 WHEN 'aio_fsync' THEN 16 WHEN 'aio_fdsync' THEN 17 WHEN 'aio_preadv' THEN 18 WHEN 'aio_pwritev' THEN 19 WHEN 'uring_read' THEN 20 WHEN 'uring_write' THEN 21 WHEN 'uring_readv' THEN 22 WHEN 'uring_writev' THEN 23 WHEN 'uring_fsync' THEN 24 WHEN 'fallocate' THEN 25 WHEN 'uring_sync_file_range' THEN 26 WHEN 'uring_fallocate' THEN 27 WHEN 'copy_file_range_in' THEN 28 WHEN 'copy_file_range_out' THEN 29 WHEN 'sendfile_in' THEN 30 WHEN 'sendfile_out' THEN 31 WHEN 'ftruncate' THEN 32 WHEN 'splice_in' THEN 33 WHEN 'splice_out' THEN 34 WHEN 'fadvise' THEN 35 WHEN 'readahead' THEN 36 WHEN 'msync' THEN 37 WHEN 'syncfs' THEN 38 WHEN 'sync' THEN 39 WHEN 'madvise' THEN 40 WHEN 'uring_fadvise' THEN 41 WHEN 'uring_ftruncate' THEN 42 WHEN 'uring_madvise' THEN 43 WHEN 'uring_splice_in' THEN 44 WHEN 'uring_splice_out' THEN 45 END;
CREATE OR REPLACE MACRO _vfs_syscall_name(code) AS ([NULL, 'read', 'write', 'pread64', 'pwrite64', 'readv', 'writev', 'preadv', 'pwritev', 'preadv2', 'pwritev2', 'fsync', 'fdatasync', 'sync_file_range', 'aio_pread', 'aio_pwrite', 'aio_fsync', 'aio_fdsync', 'aio_preadv', 'aio_pwritev', 'uring_read', 'uring_write', 'uring_readv', 'uring_writev', 'uring_fsync', 'fallocate', 'uring_sync_file_range', 'uring_fallocate', 'copy_file_range_in', 'copy_file_range_out', 'sendfile_in', 'sendfile_out', 'ftruncate', 'splice_in', 'splice_out', 'fadvise', 'readahead', 'msync', 'syncfs', 'sync', 'madvise', 'uring_fadvise', 'uring_ftruncate', 'uring_madvise', 'uring_splice_in', 'uring_splice_out']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _vfs_syscall_call(code) AS ([NULL, 'read', 'write', 'pread64', 'pwrite64', 'readv', 'writev', 'preadv', 'pwritev', 'preadv2', 'pwritev2', 'fsync', 'fdatasync', 'sync_file_range', 'aio_pread', 'aio_pwrite', 'aio_fsync', 'aio_fdsync', 'aio_preadv', 'aio_pwritev', 'uring_read', 'uring_write', 'uring_readv', 'uring_writev', 'uring_fsync', 'fallocate', 'uring_sync_file_range', 'uring_fallocate', 'copy_file_range', 'copy_file_range', 'sendfile', 'sendfile', 'ftruncate', 'splice', 'splice', 'fadvise64', 'readahead', 'msync', 'syncfs', 'sync', 'madvise', 'uring_fadvise', 'uring_ftruncate', 'uring_madvise', 'uring_splice', 'uring_splice']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _vfs_syscall_op(code) AS ([NULL, 'read', 'write', 'read', 'write', 'read', 'write', 'read', 'write', 'read', 'write', 'sync', 'sync', 'sync', 'read', 'write', 'sync', 'sync', 'read', 'write', 'read', 'write', 'read', 'write', 'sync', 'fallocate', 'sync', 'fallocate', 'read', 'write', 'read', 'write', 'ftruncate', 'read', 'write', 'hint', 'hint', 'msync', 'sync', 'sync', 'hint', 'hint', 'ftruncate', 'hint', 'read', 'write']::VARCHAR[])[code + 1];

-- block_event.action: The block-layer tracepoint a block_event comes from,
-- with blkparse's letter for it; unfinished is no tracepoint: a --per-
-- request row the agent wrote for a request still dispatched at the end, D
-- its last event seen.
CREATE OR REPLACE VIEW _code_block_action AS
SELECT * FROM (VALUES
  (1, 'q', 'Q'),
  (2, 'backmerge', 'M'),
  (3, 'frontmerge', 'F'),
  (4, 'g', 'G'),
  (5, 'i', 'I'),
  (6, 'd', 'D'),
  (7, 'c', 'C'),
  (8, 'x', 'X'),
  (9, 'rq_merge', 'M'),
  (10, 'requeue', 'R'),
  (11, 'unfinished', 'D')
) AS t(code, name, letter);
CREATE OR REPLACE MACRO _block_action(n) AS CASE n WHEN 'q' THEN 1 WHEN 'backmerge' THEN 2 WHEN 'frontmerge' THEN 3 WHEN 'g' THEN 4 WHEN 'i' THEN 5 WHEN 'd' THEN 6 WHEN 'c' THEN 7 WHEN 'x' THEN 8 WHEN 'rq_merge' THEN 9 WHEN 'requeue' THEN 10 WHEN 'unfinished' THEN 11 END;
CREATE OR REPLACE MACRO _block_action_name(code) AS ([NULL, 'q', 'backmerge', 'frontmerge', 'g', 'i', 'd', 'c', 'x', 'rq_merge', 'requeue', 'unfinished']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _block_action_letter(code) AS ([NULL, 'Q', 'M', 'F', 'G', 'I', 'D', 'C', 'X', 'M', 'R', 'D']::VARCHAR[])[code + 1];

-- hostfs_event.op: What a host-FS access does to the image file: discard is
-- blocks of the file unmapped or zeroed (a hole punched, a range zeroed).
CREATE OR REPLACE VIEW _code_hostfs_op AS
SELECT * FROM (VALUES
  (0, 'read'),
  (1, 'write'),
  (2, 'sync'),
  (3, 'discard')
) AS t(code, name);
CREATE OR REPLACE MACRO _hostfs_op(n) AS CASE n WHEN 'read' THEN 0 WHEN 'write' THEN 1 WHEN 'sync' THEN 2 WHEN 'discard' THEN 3 END;
CREATE OR REPLACE MACRO _hostfs_op_name(code) AS (['read', 'write', 'sync', 'discard']::VARCHAR[])[code + 1];

-- pagecache_event.event: The page-cache tracepoint a pagecache_event comes
-- from.
CREATE OR REPLACE VIEW _code_pagecache_event AS
SELECT * FROM (VALUES
  (1, 'add', 'added to the page cache'),
  (2, 'delete', 'deleted from the page cache'),
  (3, 'sync_ra', 'sync readahead'),
  (4, 'async_ra', 'async readahead'),
  (5, 'ra_unbounded', 'readahead unbounded (the actual read)'),
  (6, 'ra_order', 'readahead order'),
  (7, 'dirty', 'folio dirtied'),
  (8, 'writeback', 'iomap writeback folio'),
  (9, 'fault', 'page fault on a mapped file that found the page unmapped (filemap_fault; it reads the page if it is not cached)'),
  (10, 'map_pages', 'fault-around: the cached pages index..index+nr_pages-1 mapped around a faulting one (filemap_map_pages)')
) AS t(code, name, what);
CREATE OR REPLACE MACRO _pagecache_event(n) AS CASE n WHEN 'add' THEN 1 WHEN 'delete' THEN 2 WHEN 'sync_ra' THEN 3 WHEN 'async_ra' THEN 4 WHEN 'ra_unbounded' THEN 5 WHEN 'ra_order' THEN 6 WHEN 'dirty' THEN 7 WHEN 'writeback' THEN 8 WHEN 'fault' THEN 9 WHEN 'map_pages' THEN 10 END;
CREATE OR REPLACE MACRO _pagecache_event_name(code) AS ([NULL, 'add', 'delete', 'sync_ra', 'async_ra', 'ra_unbounded', 'ra_order', 'dirty', 'writeback', 'fault', 'map_pages']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _pagecache_event_what(code) AS ([NULL, 'added to the page cache', 'deleted from the page cache', 'sync readahead', 'async readahead', 'readahead unbounded (the actual read)', 'readahead order', 'folio dirtied', 'iomap writeback folio', 'page fault on a mapped file that found the page unmapped (filemap_fault; it reads the page if it is not cached)', 'fault-around: the cached pages index..index+nr_pages-1 mapped around a faulting one (filemap_map_pages)']::VARCHAR[])[code + 1];

-- mapping_event.source: The hook that saw a mapping_event.
CREATE OR REPLACE VIEW _code_mapping_source AS
SELECT * FROM (VALUES
  (1, 'iter_dstmap', 'iomap_iter_dstmap'),
  (2, 'iter_srcmap', 'iomap_iter_srcmap'),
  (3, 'ext4_map_blocks', 'ext4_ext_map_blocks_exit'),
  (4, 'xfs_iomap_found', 'xfs_iomap_found'),
  (5, 'xfs_iomap_alloc', 'xfs_iomap_alloc'),
  (6, 'btrfs_ordered_extent', 'btrfs_ordered_extent_add (disk_bytes in btrfs logical bytes: record maps the image''s, on a btrfs host, and the guest files'', on a btrfs guest, through that file system''s chunk tree into extent_maps rows of phase events)'),
  (7, 'ext4_ind_map_blocks', 'ext4_ind_map_blocks_exit (a file with indirect blocks: ext2, ext3)'),
  (8, 'xfs_reflink_remap', 'xfs_reflink_remap_extent_dest (an xfs reflink: a clone''s range given its source''s blocks, from xfs_reflink_remap_extent_src just before on the task)'),
  (9, 'btrfs_get_extent', 'btrfs_get_extent (where a btrfs file''s extent is when btrfs looks it up, each once: a btrfs clone''s range before it is rewritten; disk_bytenr + offset in btrfs logical bytes, mapped as 6; Linux 6.11 on)'),
  (10, 'xfs_cow_remap', 'xfs_reflink_cow_remap_from (an xfs copy-on-write write''s new blocks, put in the file when it ends)')
) AS t(code, name, hook);
CREATE OR REPLACE MACRO _mapping_source(n) AS CASE n WHEN 'iter_dstmap' THEN 1 WHEN 'iter_srcmap' THEN 2 WHEN 'ext4_map_blocks' THEN 3 WHEN 'xfs_iomap_found' THEN 4 WHEN 'xfs_iomap_alloc' THEN 5 WHEN 'btrfs_ordered_extent' THEN 6 WHEN 'ext4_ind_map_blocks' THEN 7 WHEN 'xfs_reflink_remap' THEN 8 WHEN 'btrfs_get_extent' THEN 9 WHEN 'xfs_cow_remap' THEN 10 END;
CREATE OR REPLACE MACRO _mapping_source_name(code) AS ([NULL, 'iter_dstmap', 'iter_srcmap', 'ext4_map_blocks', 'xfs_iomap_found', 'xfs_iomap_alloc', 'btrfs_ordered_extent', 'ext4_ind_map_blocks', 'xfs_reflink_remap', 'btrfs_get_extent', 'xfs_cow_remap']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _mapping_source_hook(code) AS ([NULL, 'iomap_iter_dstmap', 'iomap_iter_srcmap', 'ext4_ext_map_blocks_exit', 'xfs_iomap_found', 'xfs_iomap_alloc', 'btrfs_ordered_extent_add (disk_bytes in btrfs logical bytes: record maps the image''s, on a btrfs host, and the guest files'', on a btrfs guest, through that file system''s chunk tree into extent_maps rows of phase events)', 'ext4_ind_map_blocks_exit (a file with indirect blocks: ext2, ext3)', 'xfs_reflink_remap_extent_dest (an xfs reflink: a clone''s range given its source''s blocks, from xfs_reflink_remap_extent_src just before on the task)', 'btrfs_get_extent (where a btrfs file''s extent is when btrfs looks it up, each once: a btrfs clone''s range before it is rewritten; disk_bytenr + offset in btrfs logical bytes, mapped as 6; Linux 6.11 on)', 'xfs_reflink_cow_remap_from (an xfs copy-on-write write''s new blocks, put in the file when it ends)']::VARCHAR[])[code + 1];

-- netfs_event.opcode: A FUSE request's operation
-- (include/uapi/linux/fuse.h), with what it does to the file's bytes: read,
-- write, sync, or meta (metadata and attribute traffic: lookups,
-- attributes, opens).
CREATE OR REPLACE VIEW _code_fuse_opcode AS
SELECT * FROM (VALUES
  (1, 'lookup', 'meta'),
  (2, 'forget', 'meta'),
  (3, 'getattr', 'meta'),
  (4, 'setattr', 'meta'),
  (5, 'readlink', 'meta'),
  (6, 'symlink', 'meta'),
  (8, 'mknod', 'meta'),
  (9, 'mkdir', 'meta'),
  (10, 'unlink', 'meta'),
  (11, 'rmdir', 'meta'),
  (12, 'rename', 'meta'),
  (13, 'link', 'meta'),
  (14, 'open', 'meta'),
  (15, 'read', 'read'),
  (16, 'write', 'write'),
  (17, 'statfs', 'meta'),
  (18, 'release', 'meta'),
  (20, 'fsync', 'sync'),
  (21, 'setxattr', 'meta'),
  (22, 'getxattr', 'meta'),
  (23, 'listxattr', 'meta'),
  (24, 'removexattr', 'meta'),
  (25, 'flush', 'sync'),
  (26, 'init', 'meta'),
  (27, 'opendir', 'meta'),
  (28, 'readdir', 'meta'),
  (29, 'releasedir', 'meta'),
  (30, 'fsyncdir', 'sync'),
  (31, 'getlk', 'meta'),
  (32, 'setlk', 'meta'),
  (33, 'setlkw', 'meta'),
  (34, 'access', 'meta'),
  (35, 'create', 'meta'),
  (36, 'interrupt', 'meta'),
  (37, 'bmap', 'meta'),
  (38, 'destroy', 'meta'),
  (39, 'ioctl', 'meta'),
  (40, 'poll', 'meta'),
  (41, 'notify_reply', 'meta'),
  (42, 'batch_forget', 'meta'),
  (43, 'fallocate', 'write'),
  (44, 'readdirplus', 'meta'),
  (45, 'rename2', 'meta'),
  (46, 'lseek', 'meta'),
  (47, 'copy_file_range', 'write'),
  (48, 'setupmapping', 'meta'),
  (49, 'removemapping', 'meta'),
  (50, 'syncfs', 'sync'),
  (51, 'tmpfile', 'meta'),
  (52, 'statx', 'meta')
) AS t(code, name, op);
CREATE OR REPLACE MACRO _fuse_opcode(n) AS CASE n WHEN 'lookup' THEN 1 WHEN 'forget' THEN 2 WHEN 'getattr' THEN 3 WHEN 'setattr' THEN 4 WHEN 'readlink' THEN 5 WHEN 'symlink' THEN 6 WHEN 'mknod' THEN 8 WHEN 'mkdir' THEN 9 WHEN 'unlink' THEN 10 WHEN 'rmdir' THEN 11 WHEN 'rename' THEN 12 WHEN 'link' THEN 13 WHEN 'open' THEN 14 WHEN 'read' THEN 15 WHEN 'write' THEN 16 WHEN 'statfs' THEN 17 WHEN 'release' THEN 18 WHEN 'fsync' THEN 20 WHEN 'setxattr' THEN 21 WHEN 'getxattr' THEN 22 WHEN 'listxattr' THEN 23 WHEN 'removexattr' THEN 24 WHEN 'flush' THEN 25 WHEN 'init' THEN 26 WHEN 'opendir' THEN 27 WHEN 'readdir' THEN 28 WHEN 'releasedir' THEN 29 WHEN 'fsyncdir' THEN 30 WHEN 'getlk' THEN 31 WHEN 'setlk' THEN 32 WHEN 'setlkw' THEN 33 WHEN 'access' THEN 34 WHEN 'create' THEN 35 WHEN 'interrupt' THEN 36 WHEN 'bmap' THEN 37 WHEN 'destroy' THEN 38 WHEN 'ioctl' THEN 39 WHEN 'poll' THEN 40 WHEN 'notify_reply' THEN 41 WHEN 'batch_forget' THEN 42 WHEN 'fallocate' THEN 43 WHEN 'readdirplus' THEN 44 WHEN 'rename2' THEN 45 WHEN 'lseek' THEN 46 WHEN 'copy_file_range' THEN 47 WHEN 'setupmapping' THEN 48 WHEN 'removemapping' THEN 49 WHEN 'syncfs' THEN 50 WHEN 'tmpfile' THEN 51 WHEN 'statx' THEN 52 END;
CREATE OR REPLACE MACRO _fuse_opcode_name(code) AS ([NULL, 'lookup', 'forget', 'getattr', 'setattr', 'readlink', 'symlink', NULL, 'mknod', 'mkdir', 'unlink', 'rmdir', 'rename', 'link', 'open', 'read', 'write', 'statfs', 'release', NULL, 'fsync', 'setxattr', 'getxattr', 'listxattr', 'removexattr', 'flush', 'init', 'opendir', 'readdir', 'releasedir', 'fsyncdir', 'getlk', 'setlk', 'setlkw', 'access', 'create', 'interrupt', 'bmap', 'destroy', 'ioctl', 'poll', 'notify_reply', 'batch_forget', 'fallocate', 'readdirplus', 'rename2', 'lseek', 'copy_file_range', 'setupmapping', 'removemapping', 'syncfs', 'tmpfile', 'statx']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _fuse_opcode_op(code) AS ([NULL, 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', NULL, 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'read', 'write', 'meta', 'meta', NULL, 'sync', 'meta', 'meta', 'meta', 'meta', 'sync', 'meta', 'meta', 'meta', 'meta', 'sync', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'meta', 'write', 'meta', 'meta', 'meta', 'write', 'meta', 'meta', 'sync', 'meta', 'meta']::VARCHAR[])[code + 1];

-- netfs_event.opcode: An NFS call's procedure (RFC 1813's NFSv3 numbers;
-- NFSv4's operations are recorded under the same codes, and its OPEN by
-- name, which creates a file where NFSv3 sends CREATE, as 22), for proto 2
-- (the client) and 3 (nfsd), with what it does to the file's bytes.
CREATE OR REPLACE VIEW _code_nfs_proc AS
SELECT * FROM (VALUES
  (1, 'getattr', 'meta'),
  (2, 'setattr', 'meta'),
  (3, 'lookup', 'meta'),
  (4, 'access', 'meta'),
  (6, 'read', 'read'),
  (7, 'write', 'write'),
  (8, 'create', 'meta'),
  (12, 'remove', 'meta'),
  (21, 'commit', 'sync'),
  (22, 'open', 'meta')
) AS t(code, name, op);
CREATE OR REPLACE MACRO _nfs_proc(n) AS CASE n WHEN 'getattr' THEN 1 WHEN 'setattr' THEN 2 WHEN 'lookup' THEN 3 WHEN 'access' THEN 4 WHEN 'read' THEN 6 WHEN 'write' THEN 7 WHEN 'create' THEN 8 WHEN 'remove' THEN 12 WHEN 'commit' THEN 21 WHEN 'open' THEN 22 END;
CREATE OR REPLACE MACRO _nfs_proc_name(code) AS ([NULL, 'getattr', 'setattr', 'lookup', 'access', NULL, 'read', 'write', 'create', NULL, NULL, NULL, 'remove', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'commit', 'open']::VARCHAR[])[code + 1];
CREATE OR REPLACE MACRO _nfs_proc_op(code) AS ([NULL, 'meta', 'meta', 'meta', 'meta', NULL, 'read', 'write', 'meta', NULL, NULL, NULL, 'meta', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'sync', 'meta']::VARCHAR[])[code + 1];
