/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Types shared by the BPF programs and the agent that are not records. */
#ifndef NESTRACE_BPF_H
#define NESTRACE_BPF_H

#define NT_MAX_DEVS 64
#define NT_MAX_INOS 1024
#define NT_MAX_TASKS 16384
#define NT_MAX_AIO 32768	/* Linux AIO iocbs in flight */
#define NT_FAST_FILTER 8	/* devices and inodes held as constants */

/* Filter roles: which record families a device or inode is traced for. */
#define NT_ROLE_VFS	1	/* file syscalls on this file system */
#define NT_ROLE_BLOCK	2	/* block events on this disk */
#define NT_ROLE_FILE	4	/* host-FS accesses of this file (the image) */
#define NT_ROLE_CACHE	8	/* page cache / readahead / writeback */
#define NT_ROLE_MAP	16	/* mapping events */
#define NT_ROLE_NET	32	/* requests this network mount sends its server */

struct nt_ino_key {
	__u32 dev;
	__u32 _pad;
	__u64 ino;
};

/* Every record attempt takes a sequence number; each one not delivered is
 * counted in ringbuf_drops, so the agent reports seq - ringbuf_drops as
 * emitted (one atomic add per record fewer than counting both). */
struct nt_cpu_counters {
	__u64 seq;
	__u64 ringbuf_drops;
	__u64 filtered;
	__u32 depth;		/* stages in use on this CPU (nesting level) */
	__u32 _pad;
};

/* A bio's or request's times in flight (block.bpf.c, --per-request): its
 * slot of bio_times or rq_times, held by its address (key; 0: free;
 * last_ns: when it was last written; dev: a request's disk, set at its
 * dispatch).  The agent writes a row for each request still dispatched
 * at the end (requests.c). */
#define NT_TIMES_SLOTS 65536
struct nt_rq_times {
	__u64 key, last_ns, q_ns, g_ns, i_ns, d_ns, sector, bio;
	__u32 nr_sectors, pid, dev;
	__u16 req_op, req_flags, queued, _pad;
	char comm[16];
};

/* Per-CPU staging of records (see common.bpf.h). */
#define NT_STAGE_BYTES 8192
#define NT_STAGE_LEVELS 4
#define NT_REC_MAX 256		/* no record is larger (checked at build) */
#define NT_STAGE_MAX_AGE_NS 100000000ULL

struct nt_stage {
	__u32 len;		/* bytes of records in data */
	__u32 count;		/* records in data */
	__u32 pending;		/* size of the record being filled */
	__u32 _pad;
	__u64 first_ts;		/* ts_ns of the oldest record in data */
	__u8 data[NT_STAGE_BYTES];
};

#endif /* NESTRACE_BPF_H */
