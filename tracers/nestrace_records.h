/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* GENERATED from schemas/records.toml by nestrace.schema.gen: do not edit. */
#ifndef NESTRACE_RECORDS_H
#define NESTRACE_RECORDS_H

#define NT_STREAM_MAGIC 0x4652544eU
#define NT_STREAM_VERSION 1

/* Stream frame: a frame header, then count records of rec_size bytes
 * (kind 0: count bytes of UTF-8 JSON). */
struct nt_frame {
	__u32 magic;
	__u16 kind;
	__u16 version;
	__u32 rec_size;
	__u32 count;
};

/* Common prefix of every kernel record. */
struct nt_header {
	__u16 kind; /* record kind (see each record) */
	__u16 version; /* record layout version */
	__u32 cpu; /* CPU that emitted the record */
	__u64 seq; /* per-CPU sequence number, starts at 1; gaps are lost events */
	__u64 ts_ns; /* CLOCK_MONOTONIC time of the event (syscall entry for vfs) */
};

#define NT_KIND_VFS_EVENT 1
#define NT_VERSION_VFS_EVENT 1
/* One completed file syscall (entry + exit) on a traced guest file system. (104 bytes) */
struct nt_vfs_event {
	struct nt_header hdr;
	__u64 duration_ns; /* syscall exit time minus entry time (AIO: reaped minus submitted; io_uring: CQE posted minus submitted) */
	__u64 ino; /* inode number of the file (0 for sync) */
	__s64 offset_bytes; /* file offset of the I/O (f_pos at entry, or the pread/pwrite offset); -1 when none */
	__u64 req_bytes; /* bytes asked for (count, or the sum of the iovec lengths) */
	__s64 ret; /* syscall return value: bytes done, or -errno (AIO: the io_event's res; io_uring: the CQE's res) */
	__u32 dev; /* kernel dev_t of the file's super block */
	__u32 pid; /* process id (tgid) */
	__u32 tid; /* thread id */
	__u32 f_flags; /* open flags of the file (O_DIRECT, O_SYNC, ...) */
	__u16 syscall; /* nestrace syscall code: 1 read 2 write 3 pread64 4 pwrite64 5 readv 6 writev 7 preadv 8 pwritev 9 preadv2 10 pwritev2 11 fsync 12 fdatasync 13 sync_file_range 14 aio_pread 15 aio_pwrite 16 aio_fsync 17 aio_fdsync 18 aio_preadv 19 aio_pwritev (Linux AIO: one record per iocb, from io_submit to the io_getevents that reaped it) 20 uring_read 21 uring_write 22 uring_readv 23 uring_writev 24 uring_fsync (io_uring: one record per request, from submission to its CQE) 25 fallocate (its mode in iov_count) 26 uring_sync_file_range 27 uring_fallocate (its mode in iov_count) 28 copy_file_range, the file read 29 copy_file_range, the file written 30 sendfile, the file read 31 sendfile, the file written (a record per side on a traced file system, both with the call's return) 32 ftruncate (offset_bytes: the new size; req_bytes: the size before) 33 splice, the file read 34 splice, the file written (the other side is a pipe) 35 fadvise64 (posix_fadvise: its advice in iov_count) 36 readahead 37 msync (the file mapped at its address, fd -1: offset_bytes the address as a file offset, req_bytes the length within that mapping, its flags in iov_count) 38 syncfs (the file system of its fd) 39 sync (every file system: one record, on the first traced vfs device, ino 0, fd -1) 40 madvise (as msync: the file mapped at its address, fd -1; its advice in iov_count; only normal, random, sequential, willneed, remove, cold, pageout, populate_read, populate_write) 41 uring_fadvise (io_uring's fadvise: its advice in iov_count) 42 uring_ftruncate (as ftruncate) 43 uring_madvise (io_uring's madvise, as madvise) 44 uring_splice, the file read 45 uring_splice, the file written (io_uring's splice, as splice) */
	__u16 iov_count; /* number of iovecs (1 for plain read/write); fallocate, uring_fallocate: its mode (FALLOC_FL_* bits: 1 KEEP_SIZE, 2 PUNCH_HOLE, 16 ZERO_RANGE, ...); fadvise64, uring_fadvise, madvise, uring_madvise: its advice; msync: its flags (1 MS_ASYNC, 2 MS_INVALIDATE, 4 MS_SYNC) */
	__s32 fd; /* file descriptor (-1 for msync, madvise and sync) */
	char comm[16]; /* task command name */
};

#define NT_KIND_BLOCK_EVENT 2
#define NT_VERSION_BLOCK_EVENT 1
/* One block-layer tracepoint hit on a traced device (bio or request event). (96 bytes) */
struct nt_block_event {
	struct nt_header hdr;
	__u64 sector; /* start sector (512 B) of the bio or request */
	__u64 rq_id; /* request id (struct request address); 0 for bio events */
	__u64 bio_id; /* bio id (struct bio address); for request events the request's first bio */
	__u64 aux_sector; /* split: the sector where the bio was split; otherwise 0 */
	__u32 dev; /* kernel dev_t of the disk */
	__u32 nr_sectors; /* size in 512-byte sectors */
	__u32 pid; /* process id (tgid) current at the event; 0 for I and C (not recorded) */
	__s32 error; /* completion status (negative errno), 0 otherwise */
	__u16 action; /* 1 Q bio_queue 2 M backmerge 3 F frontmerge 4 G getrq 5 I rq_insert 6 D rq_issue 7 C rq_complete 8 X split 9 rq_merge 10 R rq_requeue */
	__u16 req_op; /* kernel REQ_OP: 0 read 1 write 2 flush 3 discard 5 secure erase 9 write zeroes */
	__u16 req_flags; /* nestrace flag bits: 1 SYNC 2 META 4 PRIO 8 FUA 16 PREFLUSH 32 RAHEAD 64 BACKGROUND 128 NOMERGE 256 IDLE */
	__u16 _pad0;
	char comm[16]; /* task command name current at the event; empty for I and C */
};

#define NT_KIND_HOSTFS_EVENT 3
#define NT_VERSION_HOSTFS_EVENT 1
/* One access of a traced file (the disk image) through the host file system. (88 bytes) */
struct nt_hostfs_event {
	struct nt_header hdr;
	__u64 ino; /* inode number of the file */
	__s64 offset_bytes; /* file offset of the access */
	__u64 bytes; /* length of the access */
	__u64 isize_bytes; /* file size at the access */
	__u32 dev; /* kernel dev_t of the host file system */
	__u32 pid; /* process id (tgid) current at the event */
	__u32 iocb_flags; /* nestrace flag bits: 1 DIRECT 2 DSYNC 4 SYNC 8 NOWAIT 16 APPEND 32 IOLOCK_EXCL (xfs direct write under the exclusive inode lock) */
	__u16 source; /* tracepoint that produced the record (enum hostfs_source) */
	__u16 op; /* 0 read 1 write 2 sync 3 discard (blocks of the file unmapped or zeroed: a hole punched, a range zeroed) */
	char comm[16]; /* task command name */
};

#define NT_KIND_PAGECACHE_EVENT 4
#define NT_VERSION_PAGECACHE_EVENT 1
/* Page cache, readahead and writeback activity on a traced file or device. (88 bytes) */
struct nt_pagecache_event {
	struct nt_header hdr;
	__u64 ino; /* inode number */
	__u64 index; /* first page index (offset / 4096) */
	__u64 nr_pages; /* pages concerned (folio size, readahead size, writeback length, fault-around range) */
	__u64 aux; /* readahead: pages asked for by the caller (req_count); async_size for ra_order; folio dirtied: 1 when a store through a shared mapping dirtied it (in a page fault taken in user mode, not a system call); otherwise 0 */
	__u32 dev; /* kernel dev_t of the file system */
	__u32 pid; /* process id (tgid) current at the event */
	__u16 event; /* 1 add to page cache 2 delete from page cache 3 sync readahead 4 async readahead 5 readahead unbounded (the actual read) 6 readahead order 7 folio dirtied 8 iomap writeback folio 9 page fault on a mapped file that found the page unmapped (filemap_fault; it reads the page if it is not cached) 10 fault-around: the cached pages index..index+nr_pages-1 mapped around a faulting one (filemap_map_pages) */
	__u16 _pad0;
	__u32 _pad1;
	char comm[16]; /* task command name */
};

#define NT_KIND_MAPPING_EVENT 5
#define NT_VERSION_MAPPING_EVENT 1
/* A file-offset to disk-address mapping seen while the file system did I/O. (72 bytes) */
struct nt_mapping_event {
	struct nt_header hdr;
	__u64 ino; /* inode number */
	__u64 file_offset_bytes; /* file offset the mapping starts at */
	__u64 disk_bytes; /* address on the file system's device (btrfs: logical address); U64 max for a hole or delayed allocation */
	__u64 length_bytes; /* length of the mapping */
	__u32 dev; /* kernel dev_t of the file system */
	__u16 map_type; /* 0 hole 1 delalloc 2 mapped 3 unwritten 4 inline */
	__u16 source; /* hook: 1 iomap_iter_dstmap 2 iomap_iter_srcmap 3 ext4_ext_map_blocks_exit 4 xfs_iomap_found 5 xfs_iomap_alloc 6 btrfs_ordered_extent_add (disk_bytes in btrfs logical bytes: record maps the image's, on a btrfs host, and the guest files', on a btrfs guest, through that file system's chunk tree into extent_maps rows of phase events) 7 ext4_ind_map_blocks_exit (a file with indirect blocks: ext2, ext3) 8 xfs_reflink_remap_extent_dest (an xfs reflink: a clone's range given its source's blocks, from xfs_reflink_remap_extent_src just before on the task) 9 btrfs_get_extent (where a btrfs file's extent is when btrfs looks it up, each once: a btrfs clone's range before it is rewritten; disk_bytenr + offset in btrfs logical bytes, mapped as 6; Linux 6.11 on) 10 xfs_reflink_cow_remap_from (an xfs copy-on-write write's new blocks, put in the file when it ends) */
	__u32 flags; /* source-specific flags (iomap flags, ext4 map flags) */
	__u32 disk_length_bytes; /* a compressed extent (btrfs, sources 6 and 9): the bytes at disk_bytes that hold all of its length_bytes compressed; 0 for every other mapping (and in older stores, where compressed extents made no event) */
};

#define NT_KIND_CPU_STATS 6
#define NT_VERSION_CPU_STATS 1
/* Per-CPU counters the agent reads from the BPF maps at the end of a capture (header ts_ns = read time, seq = 0). (48 bytes) */
struct nt_cpu_stats {
	struct nt_header hdr;
	__u64 emitted; /* records this CPU handed to the ring buffer */
	__u64 ringbuf_drops; /* records lost in BPF: the ring buffer was full, or Linux AIO iocbs beyond 65536 in one io_submit or io_getevents (not followed) */
	__u64 filtered; /* events rejected by the in-kernel filters */
};

/* hostfs_event.source: The host-FS tracepoint a hostfs_event comes from, and the host file systems whose image accesses it reports. */
#define NT_HOSTFS_SOURCE_XFS_FILE_BUFFERED_READ 1
#define NT_HOSTFS_SOURCE_XFS_FILE_BUFFERED_WRITE 2
#define NT_HOSTFS_SOURCE_XFS_FILE_DIRECT_READ 3
#define NT_HOSTFS_SOURCE_XFS_FILE_DIRECT_WRITE 4
#define NT_HOSTFS_SOURCE_IOMAP_DIO_RW_BEGIN 5
#define NT_HOSTFS_SOURCE_MM_FILEMAP_GET_PAGES 6
#define NT_HOSTFS_SOURCE_EXT4_WRITE_BEGIN 7
#define NT_HOSTFS_SOURCE_EXT4_DA_WRITE_BEGIN 8
#define NT_HOSTFS_SOURCE_XFS_BUNMAP 9
#define NT_HOSTFS_SOURCE_EXT4_PUNCH_HOLE 10
#define NT_HOSTFS_SOURCE_EXT4_ZERO_RANGE 11
#define NT_HOSTFS_SOURCE_NAMES "xfs_file_buffered_read,xfs_file_buffered_write,xfs_file_direct_read,xfs_file_direct_write,iomap_dio_rw_begin,mm_filemap_get_pages,ext4_write_begin,ext4_da_write_begin,xfs_bunmap,ext4_punch_hole,ext4_zero_range"

#endif /* NESTRACE_RECORDS_H */
