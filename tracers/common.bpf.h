/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Maps and helpers shared by every nestrace BPF program family.
 *
 * Every family (vfs, block, hostfs) declares these maps; the agent loads the
 * first family and hands the same map fds to the others (bpf_map__reuse_fd),
 * so all records share one ring buffer, one per-CPU sequence and one filter.
 */
#ifndef NESTRACE_COMMON_BPF_H
#define NESTRACE_COMMON_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "nestrace_records.h"
#include "nestrace_bpf.h"

/* Twin programs: one body, attached as tp_btf where BTF-typed tracepoints
 * work and as raw_tp otherwise.  The agent keeps one of each pair by
 * probe (bpf_program__set_autoload).  The body gets `btf` as a compile-time
 * constant: tp_btf pointers are trusted, so fields are loaded directly
 * (cheap); raw_tp bodies read them with BPF_CORE_READ (a helper call per
 * field).  RDn(btf, p, f...) picks one; both are CO-RE relocated. */
#define NT_TWIN(tp)							\
	static __always_inline int tp##__body(unsigned long long *ctx,	\
					      const bool btf);		\
	SEC("tp_btf/" #tp) int tp##_btf(unsigned long long *ctx)	\
	{ return empty_programs ? 0 : tp##__body(ctx, true); }		\
	SEC("raw_tp/" #tp) int tp##_raw(unsigned long long *ctx)	\
	{ return empty_programs ? 0 : tp##__body(ctx, false); }	\
	static __always_inline int tp##__body(unsigned long long *ctx,	\
					      const bool btf)

#define RD1(btf, p, a) ((btf) ? (p)->a : BPF_CORE_READ(p, a))
#define RD2(btf, p, a, b) ((btf) ? (p)->a->b : BPF_CORE_READ(p, a, b))
#define RD3(btf, p, a, b, c) ((btf) ? (p)->a->b->c : BPF_CORE_READ(p, a, b, c))


/* Every program returns at once (the agent's --empty-programs; the
 * verifier drops the rest of each, the constant known at load): what
 * the hooks alone cost, for bench/overhead's (e).  Nothing is recorded. */
const volatile __u32 empty_programs = 0;

/* Every program filters as it does, then writes its record's header alone
 * (kind, version, cpu, seq and the one clock read) and no field (the
 * agent's --floor-records, bench/overhead's (f)).  Each hit does no more
 * work than a capture's, and each I/O gets no more records: the floor of
 * any capture that writes a record per event.  The records are no
 * capture's: their fields hold whatever the stage held. */
const volatile __u32 floor_records = 0;

/* After a reserve that succeeded: in --floor-records, hand the record
 * over with its header alone and leave the program. */
#define FLOOR_SUBMIT(e)							\
	do {								\
		if (floor_records) {					\
			record__submit(e);				\
			return 0;					\
		}							\
	} while (0)

/* Wake the agent only once this many bytes wait in the ring buffer; the
 * agent polls on a timer anyway.  A wake-up per record costs 40-70 % of
 * IOPS on a small VM. */
const volatile __u64 wakeup_bytes = 0;
/* A stage is handed over once it holds more than this; the agent lowers it
 * for small ring buffers, so that a stage always fits. */
const volatile __u32 stage_limit = NT_STAGE_BYTES - NT_REC_MAX;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);	/* resized by the agent before load */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nt_cpu_counters);
} counters SEC(".maps");

/* Records are staged per CPU and reach the ring buffer NT_STAGE_BYTES at a
 * time: one ring reservation per ~80 records instead of one each (the
 * reservation, its lock and the cold ring memory were half of nestrace's
 * cost per I/O).  One stage per nesting level (task, softirq, hardirq,
 * NMI), so a program interrupting another on the same CPU never touches
 * a half-written record.  A stage is flushed when full, when its oldest
 * record is NT_STAGE_MAX_AGE_NS old, and by the agent, which runs
 * nt_flush on every CPU on a timer, and reads what is left at the end.
 * Only for programs that run with preemption off (RESERVE_DIRECT below
 * is for the others). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NT_STAGE_LEVELS);
	__type(key, __u32);
	__type(value, struct nt_stage);
} stage SEC(".maps");

/* dev_t -> NT_ROLE_* bits */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NT_MAX_DEVS);
	__type(key, __u32);
	__type(value, __u32);
} devs SEC(".maps");

/* (dev, ino) -> NT_ROLE_* bits */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NT_MAX_INOS);
	__type(key, struct nt_ino_key);
	__type(value, __u32);
} inos SEC(".maps");

static __always_inline struct nt_cpu_counters *counters__get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&counters, &zero);
}

static __always_inline void counters__filtered(void)
{
	struct nt_cpu_counters *c = counters__get();

	if (c)
		c->filtered++;	/* a statistic: a lost increment under preemption is harmless */
}

/* Hand a stage's records to the ring buffer as one sample; the agent
 * splits it by record kind.  A full ring loses the whole stage, counted. */
static __always_inline void stage__flush(struct nt_stage *st, struct nt_cpu_counters *c)
{
	__u32 len = st->len;
	__u64 flags = BPF_RB_NO_WAKEUP;

	if (len == 0 || len > NT_STAGE_BYTES)
		return;
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) + len >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&events, st->data, len, flags))
		__sync_fetch_and_add(&c->ringbuf_drops, st->count);
	st->len = 0;
	st->count = 0;
}

static __always_inline void header__fill(struct nt_header *h, __u16 kind, __u16 version,
					 __u64 seq, __u64 ts)
{
	h->kind = kind;
	h->version = version;
	h->cpu = bpf_get_smp_processor_id();
	h->seq = seq;
	h->ts_ns = ts;
}

/* Reserve a record in this CPU's stage for the current nesting level and
 * fill its header.  Every attempt takes a sequence number, so a drop leaves
 * a gap the reader can see as well as a count.  The caller fills the
 * record and calls record__submit (always: there is no discard). */
static __always_inline void *record__reserve(__u32 size, __u16 kind, __u16 version, __u64 ts)
{
	struct nt_cpu_counters *c = counters__get();
	struct nt_header *h;
	struct nt_stage *st;
	__u32 level, len;
	__u64 seq;

	if (!c)
		return NULL;
	seq = __sync_fetch_and_add(&c->seq, 1) + 1;
	/* Claim the level before looking at its stage: a program (or the
	 * agent's nt_flush) interrupting us from here on sees the stage busy.
	 * One interrupting between these two lines completes before we touch
	 * the stage, and leaves depth as it found it. */
	level = c->depth;
	c->depth = level + 1;
	if (level >= NT_STAGE_LEVELS) {
		c->depth = level;
		__sync_fetch_and_add(&c->ringbuf_drops, 1);
		return NULL;
	}
	st = bpf_map_lookup_elem(&stage, &level);
	if (!st) {
		c->depth = level;
		__sync_fetch_and_add(&c->ringbuf_drops, 1);
		return NULL;
	}
	len = st->len;
	if (len > NT_STAGE_BYTES - NT_REC_MAX) {	/* cannot happen: flushed at submit */
		stage__flush(st, c);
		len = 0;
	}
	if (!st->count)
		st->first_ts = ts;
	st->pending = size;
	h = (void *)st->data + len;
	header__fill(h, kind, version, seq, ts);
	return h;
}

static __always_inline void record__submit(void *rec)
{
	struct nt_cpu_counters *c = counters__get();
	struct nt_stage *st;
	__u32 level;

	if (!c || !c->depth)
		return;
	level = c->depth - 1;
	st = bpf_map_lookup_elem(&stage, &level);
	if (!st)
		return;
	st->len += st->pending;
	st->count++;
	if (st->len > stage_limit ||
	    ((struct nt_header *)rec)->ts_ns - st->first_ts > NT_STAGE_MAX_AGE_NS)
		stage__flush(st, c);
	c->depth = level;
}

/* Run by the agent on each CPU (BPF_PROG_TEST_RUN with a CPU): flush the
 * task-level stage, unless it interrupted a program that is filling one.
 * It claims level 0 while it works: on the agent's own CPU it runs with
 * interrupts on, and a program in an interrupt then stages at level 1
 * instead of appending to what is being handed over.  Deeper levels hold
 * only the rare nested records; they flush by size or age, and the agent
 * reads what is left at the end. */
SEC("raw_tp")
int nt_flush(void *ctx)
{
	struct nt_cpu_counters *c = counters__get();
	struct nt_stage *st;
	__u32 level = 0;

	if (!c || c->depth)
		return 0;
	c->depth = 1;
	st = bpf_map_lookup_elem(&stage, &level);
	if (st && st->count)
		stage__flush(st, c);
	c->depth = 0;
	return 0;
}

#define RESERVE(type, KIND, ts) \
	((struct nt_##type *)record__reserve(sizeof(struct nt_##type), \
		NT_KIND_##KIND, NT_VERSION_##KIND, (ts)))

/* Straight to the ring buffer, for programs that may be preempted: the
 * system call tracepoints are faultable since Linux 6.14, and a preempting
 * task's programs would break the stages' strict nesting. */
static __always_inline void *record__reserve_direct(__u32 size, __u16 kind, __u16 version,
						    __u64 ts)
{
	struct nt_cpu_counters *c = counters__get();
	struct nt_header *h;
	__u64 seq;

	if (!c)
		return NULL;
	seq = __sync_fetch_and_add(&c->seq, 1) + 1;
	h = bpf_ringbuf_reserve(&events, size, 0);
	if (!h) {
		__sync_fetch_and_add(&c->ringbuf_drops, 1);
		return NULL;
	}
	header__fill(h, kind, version, seq, ts);
	return h;
}

static __always_inline void record__submit_direct(void *rec)
{
	__u64 flags = BPF_RB_NO_WAKEUP;

	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(rec, flags);
}

#define RESERVE_DIRECT(type, KIND, ts) \
	((struct nt_##type *)record__reserve_direct(sizeof(struct nt_##type), \
		NT_KIND_##KIND, NT_VERSION_##KIND, (ts)))

/* The filters, as constants: the agent writes up to NT_FAST_FILTER
 * devices and inodes into .rodata before loading, so a lookup is a few
 * compares the verifier can see, not a hash lookup per event (there are
 * ~20 per I/O, most of them misses).  With more, it sets filter_maps and
 * the hash maps above are used. */
const volatile __u32 filter_maps = 0;
const volatile __u32 fast_ndevs = 0;
const volatile __u32 fast_devs[NT_FAST_FILTER] = {};
const volatile __u32 fast_dev_roles[NT_FAST_FILTER] = {};
const volatile __u32 fast_ninos = 0;
const volatile __u32 fast_ino_devs[NT_FAST_FILTER] = {};
const volatile __u64 fast_inos[NT_FAST_FILTER] = {};
const volatile __u32 fast_ino_roles[NT_FAST_FILTER] = {};

static __always_inline bool dev__has(__u32 dev, __u32 role)
{
	if (filter_maps) {
		__u32 *r = bpf_map_lookup_elem(&devs, &dev);

		return r && (*r & role);
	}
	for (__u32 i = 0; i < NT_FAST_FILTER; i++) {
		if (i >= fast_ndevs)
			break;
		if (fast_devs[i] == dev)
			return fast_dev_roles[i] & role;
	}
	return false;
}

static __always_inline bool ino__has(__u32 dev, __u64 ino, __u32 role)
{
	if (filter_maps) {
		struct nt_ino_key k = { .dev = dev, .ino = ino };
		__u32 *r = bpf_map_lookup_elem(&inos, &k);

		return r && (*r & role);
	}
	for (__u32 i = 0; i < NT_FAST_FILTER; i++) {
		if (i >= fast_ninos)
			break;
		if (fast_inos[i] == ino && fast_ino_devs[i] == dev)
			return fast_ino_roles[i] & role;
	}
	return false;
}

/* A file is traced for `role` if its inode is in the inode set, or its
 * whole file system device is. */
static __always_inline bool inode__wanted(struct inode *inode, __u32 role,
					  __u32 *dev, __u64 *ino, const bool btf)
{
	*dev = RD2(btf, inode, i_sb, s_dev);
	*ino = RD1(btf, inode, i_ino);
	if (ino__has(*dev, *ino, role) || dev__has(*dev, role))
		return true;
	counters__filtered();
	return false;
}

static __always_inline __u32 task__tgid(void)
{
	return bpf_get_current_pid_tgid() >> 32;
}

/* The current task's name, 16 bytes, into dst.  On tp_btf two plain loads
 * of task->comm: the kernel keeps it NUL-padded (every writer of a task
 * name copies with strscpy_pad), so this is what bpf_get_current_comm
 * copies, without the helper call and its string copy (~40 ns, up to 7 of
 * them per guest I/O).  On raw_tp, the helper. */
static __always_inline void task__comm(char *dst, const bool btf)
{
	if (btf) {
		struct task_struct *t = bpf_get_current_task_btf();

		((__u64 *)dst)[0] = *(__u64 *)&t->comm[0];
		((__u64 *)dst)[1] = *(__u64 *)&t->comm[8];
	} else {
		bpf_get_current_comm(dst, TASK_COMM_LEN);
	}
}

#define ARG(i, type) ((type)ctx[i])

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#endif /* NESTRACE_COMMON_BPF_H */
