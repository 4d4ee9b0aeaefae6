/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Every kernel difference nestrace's BPF programs care about, in one place.
 * Choose by CO-RE feature test (bpf_core_field_exists / enum value), never
 * by kernel version. */
#ifndef NESTRACE_CORE_FIXES_BPF_H
#define NESTRACE_CORE_FIXES_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>

/* v5.12 (309dca309fc3) moved the disk from bio->bi_disk to bio->bi_bdev. */
struct bio___old {
	struct gendisk *bi_disk;
	u8 bi_partno;
} __attribute__((preserve_access_index));

/* v5.16 (f3fa33acca9f) dropped request->rq_disk for request->q->disk. */
struct request___old {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline __u32 disk__devt(struct gendisk *disk, const bool btf)
{
	__u32 major = RD1(btf, disk, major);
	__u32 minor = RD1(btf, disk, first_minor);

	return (major << 20) | minor;	/* kernel MKDEV */
}

/* The whole disk a bio is queued on: a bio submitted to a partition keeps
 * the partition in bi_bdev, with its sector already remapped to the whole
 * disk, and its request is the whole disk's.  So the bio events of a
 * partition carry the disk's dev_t, like its requests (and blktrace). */
static __always_inline __u32 bio__dev(struct bio *bio, const bool btf)
{
	if (bpf_core_field_exists(bio->bi_bdev))
		return disk__devt(RD2(btf, bio, bi_bdev, bd_disk), btf);
	/* flavour structs are not BTF-typed: always probe-read them */
	return disk__devt(BPF_CORE_READ((struct bio___old *)bio, bi_disk), false);
}

static __always_inline __u32 rq__dev(struct request *rq, const bool btf)
{
	struct request___old *old = (void *)rq;

	if (bpf_core_field_exists(old->rq_disk))
		return disk__devt(BPF_CORE_READ(old, rq_disk), false);
	return disk__devt(RD2(btf, rq, q, disk), btf);
}

/* REQ_* flag bit positions moved several times (v4.10, v5.19, v6.0);
 * read them from the running kernel's enum and map to nestrace's bits. */
#define NT_REQ_OP_MASK 0xff
static __always_inline __u16 opf__nt_flags(__u32 opf)
{
	__u16 f = 0;

#define NT_FLAG(bit, nt) \
	if (bpf_core_enum_value_exists(enum req_flag_bits, bit) && \
	    (opf & (1U << bpf_core_enum_value(enum req_flag_bits, bit)))) \
		f |= (nt);
	NT_FLAG(__REQ_SYNC, 1)
	NT_FLAG(__REQ_META, 2)
	NT_FLAG(__REQ_PRIO, 4)
	NT_FLAG(__REQ_FUA, 8)
	NT_FLAG(__REQ_PREFLUSH, 16)
	NT_FLAG(__REQ_RAHEAD, 32)
	NT_FLAG(__REQ_BACKGROUND, 64)
	NT_FLAG(__REQ_NOMERGE, 128)
	NT_FLAG(__REQ_IDLE, 256)
#undef NT_FLAG
	return f;
}

/* "iov_iter: separate direction from flavour" (v5.14) moved an iov_iter's
 * direction from bit 0 of ->type (WRITE) to ->data_source. */
struct iov_iter___old {
	unsigned int type;
} __attribute__((preserve_access_index));

/* True when the iter's data goes into the file (a write).  The iter is the
 * one witness every caller sets: iomap_dio_rw itself goes by it, and the
 * loop device's iocbs carry no IOCB_WRITE. */
static __always_inline bool iter__is_source(struct iov_iter *iter, const bool btf)
{
	if (bpf_core_field_exists(iter->data_source))
		return RD1(btf, iter, data_source);
	return BPF_CORE_READ((struct iov_iter___old *)iter, type) & 1;
}

/* IOCB_* kiocb flags: IOCB_DIRECT etc. are stable since v4.12 (they are the
 * RWF_* bits plus kernel bits at 1 << 17). */
#define NT_IOCB_DIRECT	(1 << 17)
#define NT_RWF_DSYNC	0x2
#define NT_RWF_SYNC	0x4
#define NT_RWF_NOWAIT	0x8
#define NT_RWF_APPEND	0x10
static __always_inline __u32 iocb__nt_flags(int ki_flags)
{
	__u32 f = 0;

	if (ki_flags & NT_IOCB_DIRECT)
		f |= 1;
	if (ki_flags & NT_RWF_DSYNC)
		f |= 2;
	if (ki_flags & NT_RWF_SYNC)
		f |= 4;
	if (ki_flags & NT_RWF_NOWAIT)
		f |= 8;
	if (ki_flags & NT_RWF_APPEND)
		f |= 16;
	return f;
}

/* Whether the inode's i_rwsem is write-locked (its count's writer bit,
 * RWSEM_WRITER_LOCKED, since v5.3).  PREEMPT_RT kernels build rwsems
 * differently (no count): false there. */
static __always_inline bool inode__write_locked(struct inode *inode)
{
	long count = 0;

	if (!bpf_core_field_exists(inode->i_rwsem.count))
		return false;
	bpf_core_read(&count, sizeof(count), &inode->i_rwsem.count.counter);
	return count & 1;
}

/* Before v6.6 a large folio's order was a byte of its own (page[1]'s
 * compound_order). */
struct folio___v61 {
	unsigned char _folio_order;
} __attribute__((preserve_access_index));

/* v6.0 introduced large folios in the page cache: a folio's page count is
 * 1 << order when PG_head is set: the order in _folio_order (v6.0-v6.5),
 * else in the low byte of _flags_1 (v6.4+ also keeps _nr_pages on 64-bit).
 * v6.18 wrapped folio->flags in memdesc_flags_t, a type no CO-RE
 * relocation of the older unsigned long matches (a 6.1 kernel refused the
 * program): both are one unsigned long, the folio's first, so read the
 * bytes there. */
static __always_inline __u64 folio__nr_pages(struct folio *folio)
{
	unsigned long flags = 0;
	int head;

	bpf_probe_read_kernel(&flags, sizeof(flags), folio);
	head = bpf_core_enum_value(enum pageflags, PG_head);

	if (!(flags & (1UL << head)))
		return 1;
	if (bpf_core_field_exists(folio->_nr_pages))
		return BPF_CORE_READ(folio, _nr_pages);
	if (bpf_core_field_exists(((struct folio___v61 *)folio)->_folio_order))
		return 1UL << BPF_CORE_READ((struct folio___v61 *)folio, _folio_order);
	return 1UL << (BPF_CORE_READ(folio, _flags_1) & 0xff);
}

static __always_inline struct inode *folio__inode(struct folio *folio, const bool btf)
{
	return RD2(btf, folio, mapping, host);
}

#endif /* NESTRACE_CORE_FIXES_BPF_H */
