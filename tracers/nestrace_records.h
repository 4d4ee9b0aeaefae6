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
	__u16 syscall; /* nestrace syscall code (enum vfs_syscall) */
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
	__u16 action; /* block-layer tracepoint (enum block_action) */
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
	__u16 op; /* what the access does (enum hostfs_op) */
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
	__u16 event; /* page-cache tracepoint (enum pagecache_event) */
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
	__u16 source; /* hook that saw the mapping (enum mapping_source) */
	__u32 flags; /* source-specific flags (iomap flags, ext4 map flags) */
	__u32 disk_length_bytes; /* a compressed extent (btrfs, sources 6 and 9): the bytes at disk_bytes that hold all of its length_bytes compressed; 0 for every other mapping (and in older stores, where compressed extents made no event) */
};

#define NT_KIND_NETFS_EVENT 7
#define NT_VERSION_NETFS_EVENT 1
/* One request a network file system's client sent to its server, or its answer (FUSE: fuse_request_send, fuse_request_end; NFS: nfs_initiate_read/write/commit, nfs_readpage_done, nfs_writeback_done, nfs_commit_done, and the metadata calls' nfs_getattr/setattr/lookup/access/create/remove/atomic_open_enter and _exit): the netfs level, between the virtual disk (or the guest's files) and the server's file system.  Also the NFS server's file operations on a traced file (proto 3: nfsd_read_splice or nfsd_read_vector and nfsd_read_io_done, nfsd_write_opened and nfsd_write_io_done). (96 bytes) */
struct nt_netfs_event {
	struct nt_header hdr;
	__u64 unique; /* the request's id, which its send and end share (FUSE: unique on its connection; NFS client: the call's kernel address, for a metadata call its task; nfsd: the call's xid) */
	__u64 nodeid; /* the file the request is on (FUSE: node id, 0 at end; NFS client: the file's inode number on the mount; nfsd: its inode number on the server's file system) */
	__s64 offset_bytes; /* read and write: the file offset asked for (NFS COMMIT: the start of the range); -1 for any other request, and at end (nfsd: at end too) */
	__u64 bytes; /* read and write: the bytes asked for; any other FUSE request: its length on the wire; FUSE end: the answer's length on the wire; NFS end: the bytes the server read or wrote; COMMIT: the range's length (0: to the end of the file) */
	__u32 dev; /* kernel dev_t of the network mount (FUSE: the connection); nfsd: of the server's file system */
	__u32 pid; /* send: the process the request is for (FUSE: in.h.pid; NFS: the task that sent it); end, nfsd: 0 */
	__s32 error; /* end: the answer's status (negative errno; NFS: the RPC task's status); send: 0 */
	__u32 flags; /* write: the request's write flags (FUSE: 1 WRITE_CACHE, writeback from the client's page cache; 2 WRITE_LOCKOWNER; 4 WRITE_KILL_SUIDGID); NFS WRITE: the stable how asked at send, and the server's at end, and a COMMIT's at end (0 UNSTABLE, 1 DATA_SYNC, 2 FILE_SYNC), and at a READ's or WRITE's send 0x100 when it is the client's page cache's (no O_DIRECT request: readahead, writeback); 0 otherwise */
	__u16 event; /* 1 send, 2 end */
	__u16 proto; /* 1 FUSE, 2 NFS (the client's calls), 3 nfsd (the NFS server's file operations) */
	__u16 opcode; /* the request's operation (FUSE: enum fuse_opcode; NFS, nfsd: enum nfs_proc) */
	__u16 _pad0;
	char comm[16]; /* send: the task that sent it (the process itself, or a kernel worker for writeback and readahead; nfsd: the nfsd thread); end: empty */
};

#define NT_KIND_BLOCK_REQUEST 8
#define NT_VERSION_BLOCK_REQUEST 1
/* One block request on a traced device, written once at its end (`record --per-request`): the phase times its events would carry, kept in the kernel from Q to C as biosnoop keeps its start times.  A row ends a dispatch (action c: completed at ts_ns; requeue: sent back at ts_ns, its next dispatch is another row; d: its completion was not seen, and the request's next insert or dispatch at ts_ns ended it, as capture_meta.completions_missed counts) or is a bio merged into a request (backmerge, frontmerge: at ts_ns).  A request still dispatched when the capture ends (in flight, or its completion unseen) has a row the agent writes once the programs are off (action unfinished: its times to D, ts_ns the capture's end, no C; capture_meta.requests_unfinished counts it).  The views read these rows as they read block_events' (block_requests, phases_merges, size_merge_ratio); a capture has one or the other.  With `record --from-completions` each row is written at a completion or requeue alone, from the kernel's struct request (settings_json.block_records = completions): no merged bio's row and no action d, as the fields say. (120 bytes) */
struct nt_block_request {
	struct nt_header hdr;
	__u64 sector; /* start sector at dispatch (a merged bio: its own) */
	__u64 rq_id; /* request id (struct request address); 0 for a merged bio */
	__u64 bio_id; /* the request's first bio at dispatch (struct bio address; the merged bio) */
	__u64 q_ns; /* bio queue (Q) time of the first bio (of the bio it was split from, for a piece split off); 0: not seen (--from-completions: the first bio's issue_time_ns, kept by the kernel only for blk-iolatency) */
	__u64 g_ns; /* get-request (G) time of the first bio; 0: not seen (--from-completions: the request's start_time_ns, when it got its tag; 0 when the queue keeps no time stamps) */
	__u64 i_ns; /* insert (I) time; 0: not seen (always, --from-completions) */
	__u64 d_ns; /* dispatch (D) time; 0 for a merged bio (--from-completions: the request's io_start_time_ns, 0 when the queue keeps no statistics) */
	__u32 dev; /* kernel dev_t of the disk */
	__u32 nr_sectors; /* size in 512-byte sectors at dispatch (a merged bio: its own) */
	__u32 pid; /* process id (tgid) current at dispatch (a merged bio: at the merge, its submitter); 0 with --from-completions */
	__s32 error; /* completion status (negative errno); 0 otherwise */
	__u16 action; /* what ended the row (enum block_action): c, requeue, d (no completion seen), unfinished (still dispatched at the capture's end), backmerge or frontmerge */
	__u16 req_op; /* kernel REQ_OP, as block_event.req_op */
	__u16 req_flags; /* nestrace flag bits, as block_event.req_flags */
	__u16 queued; /* the Q events the row stands for: 1 when its first bio's own Q was seen (not for a piece split off, whose Q is its parent's, nor a requeued request's next dispatch), else 0; a merged bio: 1 when its Q was seen; --from-completions: the bios the request carries at its end (up to 64), its merges one fewer */
	char comm[16]; /* task command name current at dispatch (a merged bio: at the merge); empty with --from-completions */
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

/* vfs_event.syscall: The call a vfs_event records. Linux AIO: one record per iocb, from io_submit to the io_getevents that reaped it. io_uring: one record per request, from submission to its CQE. copy_file_range, sendfile and splice: a record per side on a traced file system (the file read: _in, the file written: _out, always _in + 1), both with the call's return. */
#define NT_VFS_SYSCALL_READ 1
#define NT_VFS_SYSCALL_WRITE 2
#define NT_VFS_SYSCALL_PREAD64 3
#define NT_VFS_SYSCALL_PWRITE64 4
#define NT_VFS_SYSCALL_READV 5
#define NT_VFS_SYSCALL_WRITEV 6
#define NT_VFS_SYSCALL_PREADV 7
#define NT_VFS_SYSCALL_PWRITEV 8
#define NT_VFS_SYSCALL_PREADV2 9
#define NT_VFS_SYSCALL_PWRITEV2 10
#define NT_VFS_SYSCALL_FSYNC 11
#define NT_VFS_SYSCALL_FDATASYNC 12
#define NT_VFS_SYSCALL_SYNC_FILE_RANGE 13
#define NT_VFS_SYSCALL_AIO_PREAD 14
#define NT_VFS_SYSCALL_AIO_PWRITE 15
#define NT_VFS_SYSCALL_AIO_FSYNC 16
#define NT_VFS_SYSCALL_AIO_FDSYNC 17
#define NT_VFS_SYSCALL_AIO_PREADV 18
#define NT_VFS_SYSCALL_AIO_PWRITEV 19
#define NT_VFS_SYSCALL_URING_READ 20
#define NT_VFS_SYSCALL_URING_WRITE 21
#define NT_VFS_SYSCALL_URING_READV 22
#define NT_VFS_SYSCALL_URING_WRITEV 23
#define NT_VFS_SYSCALL_URING_FSYNC 24
#define NT_VFS_SYSCALL_FALLOCATE 25
#define NT_VFS_SYSCALL_URING_SYNC_FILE_RANGE 26
#define NT_VFS_SYSCALL_URING_FALLOCATE 27
#define NT_VFS_SYSCALL_COPY_FILE_RANGE_IN 28
#define NT_VFS_SYSCALL_COPY_FILE_RANGE_OUT 29
#define NT_VFS_SYSCALL_SENDFILE_IN 30
#define NT_VFS_SYSCALL_SENDFILE_OUT 31
#define NT_VFS_SYSCALL_FTRUNCATE 32
#define NT_VFS_SYSCALL_SPLICE_IN 33
#define NT_VFS_SYSCALL_SPLICE_OUT 34
#define NT_VFS_SYSCALL_FADVISE 35
#define NT_VFS_SYSCALL_READAHEAD 36
#define NT_VFS_SYSCALL_MSYNC 37
#define NT_VFS_SYSCALL_SYNCFS 38
#define NT_VFS_SYSCALL_SYNC 39
#define NT_VFS_SYSCALL_MADVISE 40
#define NT_VFS_SYSCALL_URING_FADVISE 41
#define NT_VFS_SYSCALL_URING_FTRUNCATE 42
#define NT_VFS_SYSCALL_URING_MADVISE 43
#define NT_VFS_SYSCALL_URING_SPLICE_IN 44
#define NT_VFS_SYSCALL_URING_SPLICE_OUT 45
#define NT_VFS_SYSCALL_NAMES "read,write,pread64,pwrite64,readv,writev,preadv,pwritev,preadv2,pwritev2,fsync,fdatasync,sync_file_range,aio_pread,aio_pwrite,aio_fsync,aio_fdsync,aio_preadv,aio_pwritev,uring_read,uring_write,uring_readv,uring_writev,uring_fsync,fallocate,uring_sync_file_range,uring_fallocate,copy_file_range_in,copy_file_range_out,sendfile_in,sendfile_out,ftruncate,splice_in,splice_out,fadvise,readahead,msync,syncfs,sync,madvise,uring_fadvise,uring_ftruncate,uring_madvise,uring_splice_in,uring_splice_out"

/* block_event.action: The block-layer tracepoint a block_event comes from, with blkparse's letter for it; unfinished is no tracepoint: a --per-request row the agent wrote for a request still dispatched at the end, D its last event seen. */
#define NT_BLOCK_ACTION_Q 1
#define NT_BLOCK_ACTION_BACKMERGE 2
#define NT_BLOCK_ACTION_FRONTMERGE 3
#define NT_BLOCK_ACTION_G 4
#define NT_BLOCK_ACTION_I 5
#define NT_BLOCK_ACTION_D 6
#define NT_BLOCK_ACTION_C 7
#define NT_BLOCK_ACTION_X 8
#define NT_BLOCK_ACTION_RQ_MERGE 9
#define NT_BLOCK_ACTION_REQUEUE 10
#define NT_BLOCK_ACTION_UNFINISHED 11
#define NT_BLOCK_ACTION_NAMES "q,backmerge,frontmerge,g,i,d,c,x,rq_merge,requeue,unfinished"

/* hostfs_event.op: What a host-FS access does to the image file: discard is blocks of the file unmapped or zeroed (a hole punched, a range zeroed). */
#define NT_HOSTFS_OP_READ 0
#define NT_HOSTFS_OP_WRITE 1
#define NT_HOSTFS_OP_SYNC 2
#define NT_HOSTFS_OP_DISCARD 3
#define NT_HOSTFS_OP_NAMES "read,write,sync,discard"

/* pagecache_event.event: The page-cache tracepoint a pagecache_event comes from. */
#define NT_PAGECACHE_EVENT_ADD 1
#define NT_PAGECACHE_EVENT_DELETE 2
#define NT_PAGECACHE_EVENT_SYNC_RA 3
#define NT_PAGECACHE_EVENT_ASYNC_RA 4
#define NT_PAGECACHE_EVENT_RA_UNBOUNDED 5
#define NT_PAGECACHE_EVENT_RA_ORDER 6
#define NT_PAGECACHE_EVENT_DIRTY 7
#define NT_PAGECACHE_EVENT_WRITEBACK 8
#define NT_PAGECACHE_EVENT_FAULT 9
#define NT_PAGECACHE_EVENT_MAP_PAGES 10
#define NT_PAGECACHE_EVENT_NAMES "add,delete,sync_ra,async_ra,ra_unbounded,ra_order,dirty,writeback,fault,map_pages"

/* mapping_event.source: The hook that saw a mapping_event. */
#define NT_MAPPING_SOURCE_ITER_DSTMAP 1
#define NT_MAPPING_SOURCE_ITER_SRCMAP 2
#define NT_MAPPING_SOURCE_EXT4_MAP_BLOCKS 3
#define NT_MAPPING_SOURCE_XFS_IOMAP_FOUND 4
#define NT_MAPPING_SOURCE_XFS_IOMAP_ALLOC 5
#define NT_MAPPING_SOURCE_BTRFS_ORDERED_EXTENT 6
#define NT_MAPPING_SOURCE_EXT4_IND_MAP_BLOCKS 7
#define NT_MAPPING_SOURCE_XFS_REFLINK_REMAP 8
#define NT_MAPPING_SOURCE_BTRFS_GET_EXTENT 9
#define NT_MAPPING_SOURCE_XFS_COW_REMAP 10
#define NT_MAPPING_SOURCE_NAMES "iter_dstmap,iter_srcmap,ext4_map_blocks,xfs_iomap_found,xfs_iomap_alloc,btrfs_ordered_extent,ext4_ind_map_blocks,xfs_reflink_remap,btrfs_get_extent,xfs_cow_remap"

/* netfs_event.opcode: A FUSE request's operation (include/uapi/linux/fuse.h), with what it does to the file's bytes: read, write, sync, or meta (metadata and attribute traffic: lookups, attributes, opens). */
#define NT_FUSE_OPCODE_LOOKUP 1
#define NT_FUSE_OPCODE_FORGET 2
#define NT_FUSE_OPCODE_GETATTR 3
#define NT_FUSE_OPCODE_SETATTR 4
#define NT_FUSE_OPCODE_READLINK 5
#define NT_FUSE_OPCODE_SYMLINK 6
#define NT_FUSE_OPCODE_MKNOD 8
#define NT_FUSE_OPCODE_MKDIR 9
#define NT_FUSE_OPCODE_UNLINK 10
#define NT_FUSE_OPCODE_RMDIR 11
#define NT_FUSE_OPCODE_RENAME 12
#define NT_FUSE_OPCODE_LINK 13
#define NT_FUSE_OPCODE_OPEN 14
#define NT_FUSE_OPCODE_READ 15
#define NT_FUSE_OPCODE_WRITE 16
#define NT_FUSE_OPCODE_STATFS 17
#define NT_FUSE_OPCODE_RELEASE 18
#define NT_FUSE_OPCODE_FSYNC 20
#define NT_FUSE_OPCODE_SETXATTR 21
#define NT_FUSE_OPCODE_GETXATTR 22
#define NT_FUSE_OPCODE_LISTXATTR 23
#define NT_FUSE_OPCODE_REMOVEXATTR 24
#define NT_FUSE_OPCODE_FLUSH 25
#define NT_FUSE_OPCODE_INIT 26
#define NT_FUSE_OPCODE_OPENDIR 27
#define NT_FUSE_OPCODE_READDIR 28
#define NT_FUSE_OPCODE_RELEASEDIR 29
#define NT_FUSE_OPCODE_FSYNCDIR 30
#define NT_FUSE_OPCODE_GETLK 31
#define NT_FUSE_OPCODE_SETLK 32
#define NT_FUSE_OPCODE_SETLKW 33
#define NT_FUSE_OPCODE_ACCESS 34
#define NT_FUSE_OPCODE_CREATE 35
#define NT_FUSE_OPCODE_INTERRUPT 36
#define NT_FUSE_OPCODE_BMAP 37
#define NT_FUSE_OPCODE_DESTROY 38
#define NT_FUSE_OPCODE_IOCTL 39
#define NT_FUSE_OPCODE_POLL 40
#define NT_FUSE_OPCODE_NOTIFY_REPLY 41
#define NT_FUSE_OPCODE_BATCH_FORGET 42
#define NT_FUSE_OPCODE_FALLOCATE 43
#define NT_FUSE_OPCODE_READDIRPLUS 44
#define NT_FUSE_OPCODE_RENAME2 45
#define NT_FUSE_OPCODE_LSEEK 46
#define NT_FUSE_OPCODE_COPY_FILE_RANGE 47
#define NT_FUSE_OPCODE_SETUPMAPPING 48
#define NT_FUSE_OPCODE_REMOVEMAPPING 49
#define NT_FUSE_OPCODE_SYNCFS 50
#define NT_FUSE_OPCODE_TMPFILE 51
#define NT_FUSE_OPCODE_STATX 52
#define NT_FUSE_OPCODE_NAMES "lookup,forget,getattr,setattr,readlink,symlink,mknod,mkdir,unlink,rmdir,rename,link,open,read,write,statfs,release,fsync,setxattr,getxattr,listxattr,removexattr,flush,init,opendir,readdir,releasedir,fsyncdir,getlk,setlk,setlkw,access,create,interrupt,bmap,destroy,ioctl,poll,notify_reply,batch_forget,fallocate,readdirplus,rename2,lseek,copy_file_range,setupmapping,removemapping,syncfs,tmpfile,statx"

/* netfs_event.opcode: An NFS call's procedure (RFC 1813's NFSv3 numbers; NFSv4's operations are recorded under the same codes, and its OPEN by name, which creates a file where NFSv3 sends CREATE, as 22), for proto 2 (the client) and 3 (nfsd), with what it does to the file's bytes. */
#define NT_NFS_PROC_GETATTR 1
#define NT_NFS_PROC_SETATTR 2
#define NT_NFS_PROC_LOOKUP 3
#define NT_NFS_PROC_ACCESS 4
#define NT_NFS_PROC_READ 6
#define NT_NFS_PROC_WRITE 7
#define NT_NFS_PROC_CREATE 8
#define NT_NFS_PROC_REMOVE 12
#define NT_NFS_PROC_COMMIT 21
#define NT_NFS_PROC_OPEN 22
#define NT_NFS_PROC_NAMES "getattr,setattr,lookup,access,read,write,create,remove,commit,open"

#endif /* NESTRACE_RECORDS_H */
