// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* block: bio and request lifecycle on the traced disks (levels vdisk and
 * disk).  One record per tracepoint hit; the store's views pair them into
 * requests (Q, M/F, G, I, D, C; X for splits) by request and bio id. */
#include "common.bpf.h"
#include "core_fixes.bpf.h"

/* Keep the record types in BTF: tests check their layout against schemas/. */
struct nt_block_event *unused_block_event __attribute__((unused));

/* block_event.action values are NT_BLOCK_ACTION_<NAME>, from schemas/ */

static __always_inline struct nt_block_event *block__reserve(__u32 dev)
{
	if (!dev__has(dev, NT_ROLE_BLOCK)) {
		counters__filtered();
		return NULL;
	}
	return RESERVE(block_event, BLOCK_EVENT, bpf_ktime_get_ns());
}

/* The task is recorded where it means something: the submitter (bio
 * events) and the dispatcher (D).  Inserts and completions leave pid 0
 * and an empty comm: a completion runs in whatever task the interrupt
 * found, and skipping the pid and name there saved a tenth of a block
 * event (when both were helper calls; the name is two loads on tp_btf now). */
static __always_inline int block__submit(struct nt_block_event *e, __u32 dev,
					 __u16 action, __u32 opf, const bool btf)
{
	e->dev = dev;
	e->action = action;
	e->req_op = opf & NT_REQ_OP_MASK;
	e->req_flags = opf__nt_flags(opf);
	e->_pad0 = 0;
	if (action == NT_BLOCK_ACTION_C || action == NT_BLOCK_ACTION_I) {
		e->pid = 0;
		__builtin_memset(e->comm, 0, sizeof(e->comm));
	} else {
		e->pid = task__tgid();
		task__comm(e->comm, btf);
	}
	record__submit(e);
	return 0;
}

static __always_inline int bio__emit(struct bio *bio, __u16 action, __u64 aux, const bool btf)
{
	__u32 dev = bio__dev(bio, btf);
	struct nt_block_event *e = block__reserve(dev);

	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->sector = RD1(btf, bio, bi_iter.bi_sector);
	e->nr_sectors = RD1(btf, bio, bi_iter.bi_size) >> 9;
	e->rq_id = 0;
	e->bio_id = (__u64)bio;
	e->aux_sector = aux;
	e->error = 0;
	return block__submit(e, dev, action, RD1(btf, bio, bi_opf), btf);
}

static __always_inline int rq__emit(struct request *rq, __u16 action,
				    int error, __u32 nr_bytes, const bool btf)
{
	__u32 dev = rq__dev(rq, btf);
	struct nt_block_event *e = block__reserve(dev);

	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->sector = RD1(btf, rq, __sector);
	/* like the kernel's own trace: completion reports the bytes done */
	e->nr_sectors = (action == NT_BLOCK_ACTION_C ? nr_bytes : RD1(btf, rq, __data_len)) >> 9;
	e->rq_id = (__u64)rq;
	e->bio_id = (__u64)RD1(btf, rq, bio);
	e->aux_sector = 0;
	e->error = error;
	return block__submit(e, dev, action, RD1(btf, rq, cmd_flags), btf);
}

NT_TWIN(block_bio_queue) { return bio__emit(ARG(0, struct bio *), NT_BLOCK_ACTION_Q, 0, btf); }
NT_TWIN(block_bio_backmerge) { return bio__emit(ARG(0, struct bio *), NT_BLOCK_ACTION_BACKMERGE, 0, btf); }
NT_TWIN(block_bio_frontmerge) { return bio__emit(ARG(0, struct bio *), NT_BLOCK_ACTION_FRONTMERGE, 0, btf); }
NT_TWIN(block_getrq) { return bio__emit(ARG(0, struct bio *), NT_BLOCK_ACTION_G, 0, btf); }
NT_TWIN(block_split) { return bio__emit(ARG(0, struct bio *), NT_BLOCK_ACTION_X, (__u32)ctx[1], btf); }
NT_TWIN(block_rq_insert) { return rq__emit(ARG(0, struct request *), NT_BLOCK_ACTION_I, 0, 0, btf); }
NT_TWIN(block_rq_issue) { return rq__emit(ARG(0, struct request *), NT_BLOCK_ACTION_D, 0, 0, btf); }
NT_TWIN(block_rq_merge) { return rq__emit(ARG(0, struct request *), NT_BLOCK_ACTION_RQ_MERGE, 0, 0, btf); }
NT_TWIN(block_rq_requeue) { return rq__emit(ARG(0, struct request *), NT_BLOCK_ACTION_REQUEUE, 0, 0, btf); }
NT_TWIN(block_rq_complete)
{
	return rq__emit(ARG(0, struct request *), NT_BLOCK_ACTION_C, (__u8)ctx[1], (__u32)ctx[2], btf);
}
