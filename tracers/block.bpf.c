// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* block: bio and request lifecycle on the traced disks (levels vdisk and
 * disk).  One record per tracepoint hit; the store's views pair them into
 * requests (Q, M/F, G, I, D, C; X for splits) by request and bio id.  Or
 * (--per-request) one record per request, at its end: its times kept
 * here from each hit, or (--from-completions) read at its end from the
 * kernel's own fields. */
#include "common.bpf.h"
#include "core_fixes.bpf.h"

/* Keep the record types in BTF: tests check their layout against schemas/. */
struct nt_block_event *unused_block_event __attribute__((unused));
struct nt_block_request *unused_block_request __attribute__((unused));

/* block_event.action values are NT_BLOCK_ACTION_<NAME>, from schemas/ */

/* A record per request (the agent's --per-request): a request's phase
 * times kept in the kernel and one record written at its end, as
 * biosnoop keeps its start times.  A bio's Q and G times wait in its slot
 * of bio_times, a request's I and D times (and what D saw: its first
 * bio's Q and G, sector, size, op, dispatcher) in rq_times; C or a
 * requeue writes the request's block_request, a merge the merged bio's.
 * A piece split off a bio (X) takes its parent's Q: bio_chain() made the
 * parent its bi_private before the tracepoint.
 * With --request-floor (bench/overhead's (g)) the same times are kept
 * but each record is its header alone: what keeping them costs, no
 * capture's.  The other families stay as in --floor-records then. */
const volatile __u32 per_request = 0;
const volatile __u32 times_mask = 0;	/* slots - 1, set with them by the agent */

/* A slot per bio or request address, in a neighbourhood of NT_TIMES_WAYS
 * slots chosen by a multiplicative hash of it: arrays (the verifier
 * inlines their lookups: a few instructions, where a hash map's update
 * took ~100 ns and a lock).  A slot holds the address it serves (key; 0:
 * free), taken by compare-and-swap, so two CPUs never take one slot.  A
 * full neighbourhood gives up its stalest slot: one written in the last
 * NT_TIMES_STALE_NS was a bio or request in flight, and its times are
 * lost (times_lost, the end frame's requests_lost, in lost_total); an
 * older one was most likely a bio that never had a request of its own
 * (an empty flush, a failed bio) and is counted in times_expired.  Each
 * address's events happen one after another (the block layer orders
 * them), so no two CPUs write one request's slot at once.  (struct
 * nt_rq_times: nestrace_bpf.h) */
#define NT_TIMES_WAYS 4
#define NT_TIMES_STALE_NS 10000000000ULL

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);		/* the agent sizes both in --per-request */
	__type(key, __u32);
	__type(value, struct nt_rq_times);
} bio_times SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nt_rq_times);
} rq_times SEC(".maps");

/* read by the agent at the end (see above) */
__u64 times_lost = 0;
__u64 times_expired = 0;

/* The slot neighbourhood of an address.  On tp_btf the verifier holds
 * the address a pointer and forbids the hash's arithmetic on it; a copy
 * through the helper is a plain number.  (A per-CPU scratch map would do
 * it without a call, but another program may run between its write and
 * its read on this CPU: a preempted program, an interrupt's completion.) */
static __always_inline __u32 times__home(__u64 addr)
{
	__u64 a = 0;

	bpf_probe_read_kernel(&a, sizeof(a), &addr);
	return (__u32)((a * 0x9E3779B97F4A7C15ULL) >> 40);
}

/* addr's slot, or NULL when it holds none (home: times__home(addr)). */
static __always_inline struct nt_rq_times *times__find(void *map, __u64 addr, __u32 home)
{
	__u32 i;
	struct nt_rq_times *t;

#pragma unroll
	for (int w = 0; w < NT_TIMES_WAYS; w++) {
		i = (home + w) & times_mask;
		t = bpf_map_lookup_elem(map, &i);
		if (t && t->key == addr)
			return t;
	}
	return NULL;
}

static __always_inline void times__clear(struct nt_rq_times *t, __u64 now)
{
	t->q_ns = t->g_ns = t->i_ns = t->d_ns = 0;
	t->queued = 0;
	t->last_ns = now;
}

/* A slot for addr, cleared: its own, a free one, or the stalest of its
 * neighbourhood. */
static __always_inline struct nt_rq_times *times__take(void *map, __u64 addr, __u32 home,
						       __u64 now)
{
	__u32 i;
	struct nt_rq_times *t, *free = NULL, *old = NULL;
	__u64 key;

#pragma unroll
	for (int w = 0; w < NT_TIMES_WAYS; w++) {
		i = (home + w) & times_mask;
		t = bpf_map_lookup_elem(map, &i);
		if (!t)
			continue;
		key = t->key;
		if (key == addr) {
			times__clear(t, now);
			return t;
		}
		if (!key) {
			if (!free)
				free = t;
		} else if (!old || t->last_ns < old->last_ns) {
			old = t;
		}
	}
	if (free && !__sync_val_compare_and_swap(&free->key, 0, addr)) {
		times__clear(free, now);
		return free;
	}
	if (!old) {			/* (the free one taken meanwhile) */
		__sync_fetch_and_add(&times_lost, 1);
		return NULL;
	}
	key = old->key;
	if (__sync_val_compare_and_swap(&old->key, key, addr) != key) {
		__sync_fetch_and_add(&times_lost, 1);	/* (taken meanwhile: addr's lost) */
		return NULL;
	}
	if (now - old->last_ns < NT_TIMES_STALE_NS)
		__sync_fetch_and_add(&times_lost, 1);
	else
		__sync_fetch_and_add(&times_expired, 1);
	times__clear(old, now);
	return old;
}

/* A hit on a traced disk: its time, or 0 when the disk is not traced. */
static __always_inline __u64 times__hit(__u32 dev)
{
	if (!dev__has(dev, NT_ROLE_BLOCK)) {
		counters__filtered();
		return 0;
	}
	return bpf_ktime_get_ns();
}

/* A request's record, at its end: the times and what its dispatch saw. */
static __always_inline void request__emit(struct nt_rq_times *t, __u32 dev, __u64 rq,
					  __u16 action, int error, __u64 now)
{
	struct nt_block_request *r;

	r = record__reserve(sizeof(*r), NT_KIND_BLOCK_REQUEST, NT_VERSION_BLOCK_REQUEST, now);
	if (!r)
		return;
	if (floor_records) {		/* (--request-floor: the header alone) */
		record__submit(r);
		return;
	}
	r->sector = t->sector;
	r->rq_id = rq;
	r->bio_id = t->bio;
	r->q_ns = t->q_ns;
	r->g_ns = t->g_ns;
	r->i_ns = t->i_ns;
	r->d_ns = t->d_ns;
	r->dev = dev;
	r->nr_sectors = t->nr_sectors;
	r->pid = t->pid;
	r->error = error;
	r->action = action;
	r->req_op = t->req_op;
	r->req_flags = t->req_flags;
	r->queued = t->queued;
	__builtin_memcpy(r->comm, t->comm, sizeof(r->comm));
	record__submit(r);
}

static __always_inline int bio__times(struct bio *bio, __u16 action, const bool btf)
{
	__u64 key = (__u64)bio, now = times__hit(bio__dev(bio, btf)), parent;
	struct nt_rq_times *t, *p;
	struct nt_block_request *r;
	__u32 opf, home;

	if (!now)
		return 0;
	home = times__home(key);
	if (action == NT_BLOCK_ACTION_BACKMERGE || action == NT_BLOCK_ACTION_FRONTMERGE) {
		/* merged: its request's first bio carries the request's times */
		t = times__find(&bio_times, key, home);
		r = record__reserve(sizeof(*r), NT_KIND_BLOCK_REQUEST, NT_VERSION_BLOCK_REQUEST, now);
		if (r && floor_records) {
			record__submit(r);
		} else if (r) {
			r->sector = RD1(btf, bio, bi_iter.bi_sector);
			r->nr_sectors = RD1(btf, bio, bi_iter.bi_size) >> 9;
			r->rq_id = r->g_ns = r->i_ns = r->d_ns = 0;
			r->bio_id = key;
			r->q_ns = t ? t->q_ns : 0;
			r->queued = t ? t->queued : 0;
			r->dev = bio__dev(bio, btf);
			r->error = 0;
			r->action = action;
			opf = RD1(btf, bio, bi_opf);
			r->req_op = opf & NT_REQ_OP_MASK;
			r->req_flags = opf__nt_flags(opf);
			r->pid = task__tgid();
			task__comm(r->comm, btf);
			record__submit(r);
		}
		if (t)
			t->key = 0;
		return 0;
	}
	if (action == NT_BLOCK_ACTION_G) {
		t = times__find(&bio_times, key, home);
		if (!t)				/* (no Q seen: before tracing) */
			t = times__take(&bio_times, key, home, now);
		if (t)
			t->g_ns = t->last_ns = now;
		return 0;
	}
	t = times__take(&bio_times, key, home, now);
	if (!t)
		return 0;
	if (action == NT_BLOCK_ACTION_Q) {
		t->q_ns = now;
		t->queued = 1;
	} else {				/* X: the piece cut off, its parent's Q */
		parent = (__u64)RD1(btf, bio, bi_private);
		p = times__find(&bio_times, parent, times__home(parent));
		if (p)
			t->q_ns = p->q_ns;
	}
	return 0;
}

static __always_inline int rq__times(struct request *rq, __u16 action, int error, const bool btf)
{
	__u64 key = (__u64)rq, bio, now;
	__u32 dev = rq__dev(rq, btf);
	struct nt_rq_times *t, *b;
	__u32 home, opf;

	now = times__hit(dev);
	if (!now)
		return 0;
	home = times__home(key);
	if (action == NT_BLOCK_ACTION_RQ_MERGE) {	/* merged into another request */
		t = times__find(&rq_times, key, home);
		if (t)
			t->key = 0;
		return 0;
	}
	if (action == NT_BLOCK_ACTION_C || action == NT_BLOCK_ACTION_REQUEUE) {
		/* (a request dispatched before tracing has no record) */
		t = times__find(&rq_times, key, home);
		if (!t || !t->d_ns)
			return 0;
		request__emit(t, dev, key, action, error, now);
		if (action == NT_BLOCK_ACTION_C)
			t->key = 0;
		else		/* that dispatch is over; the next has no Q or G */
			times__clear(t, now);
		return 0;
	}
	/* I or D.  A dispatch still held was never seen to end: its C was
	 * missed (the kernel ran no program for it).  Its record goes now,
	 * as action d, ended by this (as block_requests.done_by_ns). */
	t = times__find(&rq_times, key, home);
	if (t && t->d_ns) {
		request__emit(t, dev, key, NT_BLOCK_ACTION_D, 0, now);
		times__clear(t, now);
	}
	if (action == NT_BLOCK_ACTION_I) {
		if (t)
			times__clear(t, now);
		else
			t = times__take(&rq_times, key, home, now);
		if (t)
			t->i_ns = now;
		return 0;
	}
	/* D: the insert's slot, or a new one; the first bio's times */
	if (!t)
		t = times__take(&rq_times, key, home, now);
	if (!t)
		return 0;
	t->d_ns = t->last_ns = now;
	t->dev = dev;
	bio = (__u64)RD1(btf, rq, bio);
	t->bio = bio;
	t->sector = RD1(btf, rq, __sector);
	t->nr_sectors = RD1(btf, rq, __data_len) >> 9;
	opf = RD1(btf, rq, cmd_flags);
	t->req_op = opf & NT_REQ_OP_MASK;
	t->req_flags = opf__nt_flags(opf);
	t->pid = task__tgid();
	task__comm(t->comm, btf);
	b = times__find(&bio_times, bio, times__home(bio));
	if (b) {
		t->q_ns = b->q_ns;
		t->g_ns = b->g_ns;
		t->queued = b->queued;
		b->key = 0;
	}
	return 0;
}

/* --from-completions: a request's record from its completion (or requeue)
 * alone, no program on its way down.  Its times are the kernel's own, in
 * struct request where the block layer keeps them (blk_time_get_ns: the
 * submitter's plug may cache the clock): start_time_ns, when it got its
 * tag (G; 0 when the queue keeps no time stamps), and
 * io_start_time_ns, its dispatch (D; 0 without the queue's statistics:
 * writeback throttling or a blk-stat user).  Its first bio's
 * issue_time_ns, where the kernel keeps one (blk-iolatency), is its Q.
 * No I, no submitter or dispatcher (a completion runs in whatever task
 * the interrupt found), and its merges only as the bios it carries
 * (queued), not one row each.  A request completed in parts has its row
 * at its last part.  The dispatch hook stays, to count. */
const volatile bool from_completion = false;

#define NT_MAX_RQ_BIOS 64

/* Its accounting, with no state per request: the requests on the traced
 * disks whose start_time_ns (set when each got its tag, before its
 * dispatch) falls in [count_from_ns, count_to_ns) (the capture's start,
 * set by the agent once every hook is attached, and its end), counted at
 * each dispatch, and at each end a program saw.  Both hooks pick the same
 * requests by the kernel's own time stamp, and both stay attached until
 * the agent has waited for those in flight to end, so the difference is
 * the completions no program ran for.  (io_start_time_ns would not do:
 * the kernel sets it after the dispatch tracepoint.) */
__u64 count_from_ns = 0;
__u64 count_to_ns = 0;
__u64 rq_dispatched = 0;
__u64 rq_ended = 0;

/* Is a request whose start_time_ns is t counted? */
static __always_inline bool rq__counted(__u64 t)
{
	__u64 from = count_from_ns, to = count_to_ns;

	return from && t >= from && (!to || t < to);
}

struct bio___issue {
	__u64 issue_time_ns;
} __attribute__((preserve_access_index));

static __always_inline int rq__ended(struct request *rq, __u16 action, int error,
				     __u32 nr_bytes, const bool btf)
{
	__u32 dev = rq__dev(rq, btf), len, opf, n = 0;
	__u64 now, start = RD1(btf, rq, start_time_ns);
	struct nt_block_request *r;
	struct bio *bio, *b;

	if (action == NT_BLOCK_ACTION_D) {	/* counted, no record */
		if (dev__has(dev, NT_ROLE_BLOCK) && rq__counted(start))
			__sync_fetch_and_add(&rq_dispatched, 1);
		return 0;
	}
	/* a part of the request done, the rest to come: its end is later */
	len = RD1(btf, rq, __data_len);
	if (action == NT_BLOCK_ACTION_C && nr_bytes < len)
		return 0;
	now = times__hit(dev);
	if (!now)
		return 0;
	if (rq__counted(start))
		__sync_fetch_and_add(&rq_ended, 1);
	r = record__reserve(sizeof(*r), NT_KIND_BLOCK_REQUEST, NT_VERSION_BLOCK_REQUEST, now);
	if (!r)
		return 0;
	if (floor_records) {
		record__submit(r);
		return 0;
	}
	bio = RD1(btf, rq, bio);
	r->sector = RD1(btf, rq, __sector);
	r->nr_sectors = len >> 9;
	r->rq_id = (__u64)rq;
	r->bio_id = (__u64)bio;
	r->q_ns = 0;
	if (bio && bpf_core_field_exists(((struct bio___issue *)bio)->issue_time_ns))
		r->q_ns = BPF_CORE_READ((struct bio___issue *)bio, issue_time_ns);
	r->g_ns = start;
	r->i_ns = 0;
	r->d_ns = RD1(btf, rq, io_start_time_ns);
	r->dev = dev;
	r->pid = 0;
	r->error = error;
	r->action = action;
	opf = RD1(btf, rq, cmd_flags);
	r->req_op = opf & NT_REQ_OP_MASK;
	r->req_flags = opf__nt_flags(opf);
	for (b = bio; b && n < NT_MAX_RQ_BIOS; n++)
		b = BPF_CORE_READ(b, bi_next);
	r->queued = n;
	__builtin_memset(r->comm, 0, sizeof(r->comm));
	record__submit(r);
	return 0;
}

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

/* (--per-request: the times kept, bio__times and rq__times) */
#define BIO(action, aux) (per_request ? bio__times(ARG(0, struct bio *), action, btf) : \
			  bio__emit(ARG(0, struct bio *), action, aux, btf))
#define RQ(action, error, nr_bytes) (from_completion ? rq__ended(ARG(0, struct request *), action, error, nr_bytes, btf) : \
				     per_request ? rq__times(ARG(0, struct request *), action, error, btf) : \
				     rq__emit(ARG(0, struct request *), action, error, nr_bytes, btf))

NT_TWIN(block_bio_queue) { return BIO(NT_BLOCK_ACTION_Q, 0); }
NT_TWIN(block_bio_backmerge) { return BIO(NT_BLOCK_ACTION_BACKMERGE, 0); }
NT_TWIN(block_bio_frontmerge) { return BIO(NT_BLOCK_ACTION_FRONTMERGE, 0); }
NT_TWIN(block_getrq) { return BIO(NT_BLOCK_ACTION_G, 0); }
NT_TWIN(block_split) { return BIO(NT_BLOCK_ACTION_X, (__u32)ctx[1]); }
NT_TWIN(block_rq_insert) { return RQ(NT_BLOCK_ACTION_I, 0, 0); }
NT_TWIN(block_rq_issue) { return RQ(NT_BLOCK_ACTION_D, 0, 0); }
NT_TWIN(block_rq_merge) { return RQ(NT_BLOCK_ACTION_RQ_MERGE, 0, 0); }
NT_TWIN(block_rq_requeue) { return RQ(NT_BLOCK_ACTION_REQUEUE, 0, 0); }
NT_TWIN(block_rq_complete) { return RQ(NT_BLOCK_ACTION_C, (__u8)ctx[1], (__u32)ctx[2]); }
