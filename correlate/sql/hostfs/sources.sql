-- Module hostfs.sources: GENERATED from schemas/records.toml by
-- nestrace.schema.gen: do not edit.

-- The host-FS tracepoint a hostfs_event comes from, and the host file
-- systems whose image accesses it reports.
-- One row per (hook, host file system it is the access source for);
-- fs_type '*' stands for any file system without rows of its own.
-- `nestrace record` attaches no access hook unused for the stack's host
-- FS by the same table (nestrace.capture.agent.unused_hooks).
CREATE OR REPLACE VIEW _hostfs_sources AS
SELECT * FROM (VALUES
  (1, 'xfs_file_buffered_read', 'xfs'),
  (2, 'xfs_file_buffered_write', 'xfs'),
  (3, 'xfs_file_direct_read', 'xfs'),
  (4, 'xfs_file_direct_write', 'xfs'),
  (5, 'iomap_dio_rw_begin', 'ext2'),
  (5, 'iomap_dio_rw_begin', 'ext3'),
  (5, 'iomap_dio_rw_begin', 'ext4'),
  (5, 'iomap_dio_rw_begin', 'btrfs'),
  (5, 'iomap_dio_rw_begin', '*'),
  (6, 'mm_filemap_get_pages', 'ext2'),
  (6, 'mm_filemap_get_pages', 'ext3'),
  (6, 'mm_filemap_get_pages', 'ext4'),
  (6, 'mm_filemap_get_pages', 'btrfs'),
  (6, 'mm_filemap_get_pages', '*'),
  (7, 'ext4_write_begin', 'ext2'),
  (7, 'ext4_write_begin', 'ext3'),
  (7, 'ext4_write_begin', 'ext4'),
  (8, 'ext4_da_write_begin', 'ext2'),
  (8, 'ext4_da_write_begin', 'ext3'),
  (8, 'ext4_da_write_begin', 'ext4'),
  (9, 'xfs_bunmap', 'xfs'),
  (10, 'ext4_punch_hole', 'ext2'),
  (10, 'ext4_punch_hole', 'ext3'),
  (10, 'ext4_punch_hole', 'ext4'),
  (11, 'ext4_zero_range', 'ext2'),
  (11, 'ext4_zero_range', 'ext3'),
  (11, 'ext4_zero_range', 'ext4')
) AS t(source, hook, fs_type);
