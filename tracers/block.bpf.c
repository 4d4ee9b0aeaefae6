// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* block: bio and request lifecycle on the traced disks (levels vdisk and
 * disk).  One record per tracepoint hit; the store's views pair them into
 * requests (Q, M/F, G, I, D, C; X for splits) by request and bio id. */
#include "common.bpf.h"
#include "core_fixes.bpf.h"

/* Keep the record types in BTF: tests check their layout against schemas/. */
struct nt_block_event *unused_block_event __attribute__((unused));

/* block_event.action values are NT_BLOCK_ACTION_<NAME>, from schemas/ */

/* The floor of a record per request (the agent's --request-floor,
 * bench/overhead's (g)), the design #75 asks about: a request's phase
 * times kept in the kernel and one record written at its completion, as
 * biosnoop keeps its start times.  Each hit filters as a capture's does;
 * a bio's Q and G times wait in its slot of bio_times (a merged bio's are
 * let go), a request's I and D times in rq_times, where D also takes its
 * first bio's; C writes one record's header alone and lets the request
 * go (a requeue writes one too: that dispatch is over).  No field is
 * filled: what keeping the times costs, not a capture.  The other
 * families stay as in --floor-records. */
const volatile __u32 request_floor = 0;
const volatile __u32 times_mask = 0;	/* slots - 1, set with them by the agent */

/* A slot per bio or request address, chosen by a multiplicative hash of
 * it: an array (the verifier inlines its lookup: a few instructions,
 * where a hash map's update took ~100 ns and a lock).  The slot holds the
 * address it serves; a slot still held by another address in flight is a
 * collision, and that one's times are lost, counted as a drop.  Each
 * address's events happen one after another (the block layer orders
 * them), so no two CPUs write one request's slot at once. */
struct nt_rq_times {
	__u64 key, q_ns, g_ns, i_ns, d_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);		/* the agent sizes both in --request-floor */
	__type(key, __u32);
	__type(value, struct nt_rq_times);
} bio_times SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nt_rq_times);
} rq_times SEC(".maps");

static __always_inline void times__dropped(void)
{
	struct nt_cpu_counters *c = counters__get();

	if (c)
		__sync_fetch_and_add(&c->ringbuf_drops, 1);
}

/* An address as a number: on tp_btf the verifier holds it a pointer, and
 * forbids the hash's arithmetic on it; a copy through map memory is a
 * plain number. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} times_addr SEC(".maps");

static __always_inline struct nt_rq_times *times__slot(void *map, __u64 addr)
{
	__u32 zero = 0, i;
	__u64 *a = bpf_map_lookup_elem(&times_addr, &zero);

	if (!a)
		return NULL;
	*a = addr;
	i = (__u32)((*(volatile __u64 *)a * 0x9E3779B97F4A7C15ULL) >> 40) & times_mask;
	return bpf_map_lookup_elem(map, &i);
}

/* Take a slot for addr: one held by another address is a collision. */
static __always_inline void times__claim(struct nt_rq_times *t, __u64 addr)
{
	if (t->key && t->key != addr)
		times__dropped();
	t->key = addr;
	t->q_ns = t->g_ns = t->i_ns = t->d_ns = 0;
}

/* A hit on a traced disk: the slot of addr in map, and the time. */
static __always_inline struct nt_rq_times *times__hit(__u32 dev, void *map, __u64 addr, __u64 *now)
{
	if (!dev__has(dev, NT_ROLE_BLOCK)) {
		counters__filtered();
		return NULL;
	}
	*now = bpf_ktime_get_ns();
	return times__slot(map, addr);
}

static __always_inline int bio__times(struct bio *bio, __u16 action, const bool btf)
{
	__u64 key = (__u64)bio, now;
	struct nt_rq_times *t = times__hit(bio__dev(bio, btf), &bio_times, key, &now);

	if (!t)
		return 0;
	if (action == NT_BLOCK_ACTION_BACKMERGE || action == NT_BLOCK_ACTION_FRONTMERGE) {
		if (t->key == key)	/* merged: its request's first bio carries the times */
			t->key = 0;
		return 0;
	}
	if (action == NT_BLOCK_ACTION_G && t->key == key) {
		t->g_ns = now;
		return 0;
	}
	times__claim(t, key);
	if (action == NT_BLOCK_ACTION_G)	/* (a split-off piece: no Q of its own) */
		t->g_ns = now;
	else					/* Q, or X: the piece cut off */
		t->q_ns = now;
	return 0;
}

static __always_inline int rq__times(struct request *rq, __u16 action, const bool btf)
{
	__u64 key = (__u64)rq, bio, now;
	struct nt_rq_times *t = times__hit(rq__dev(rq, btf), &rq_times, key, &now), *b;
	struct nt_header *h;

	if (!t)
		return 0;
	if (action == NT_BLOCK_ACTION_RQ_MERGE) {	/* merged into another request */
		if (t->key == key)
			t->key = 0;
		return 0;
	}
	if (action == NT_BLOCK_ACTION_C || action == NT_BLOCK_ACTION_REQUEUE) {
		h = record__reserve(sizeof(struct nt_block_event), NT_KIND_BLOCK_EVENT,
				    NT_VERSION_BLOCK_EVENT, now);
		if (h)
			record__submit(h);
		if (action == NT_BLOCK_ACTION_C && t->key == key)
			t->key = 0;
		return 0;
	}
	if (action == NT_BLOCK_ACTION_I) {
		times__claim(t, key);
		t->i_ns = now;
		return 0;
	}
	/* D: the insert's slot, or a new one; the first bio's times */
	if (t->key != key)
		times__claim(t, key);
	t->d_ns = now;
	bio = (__u64)RD1(btf, rq, bio);
	b = times__slot(&bio_times, bio);
	if (b && b->key == bio) {
		t->q_ns = b->q_ns;
		t->g_ns = b->g_ns;
		b->key = 0;
	}
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

/* (--request-floor: the times kept, bio__times and rq__times) */
#define BIO(action, aux) (request_floor ? bio__times(ARG(0, struct bio *), action, btf) : \
			  bio__emit(ARG(0, struct bio *), action, aux, btf))
#define RQ(action, error, nr_bytes) (request_floor ? rq__times(ARG(0, struct request *), action, btf) : \
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
