// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* What the block family keeps of the requests, read by the agent at the
 * end: --per-request's slots, --from-completions' counts. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "nestrace_records.h"
#include "nestrace_bpf.h"
#include "agent.h"
#include "output.h"
#include "programs.h"
#include "requests.h"
#include "block.skel.h"

/* --per-request, after the programs are detached: the requests and merged
 * bios whose times were lost for want of a slot (*lost), the slots given
 * up after 10 s without an end (*expired), and the requests dispatched
 * and not ended (*in_flight: in flight at end, or their end unseen).
 * Each of those gets its row here, action unfinished at end: its times to
 * D are known, and a completion the kernel ran no program for must not
 * take the request's row with it.  The rows are numbered on CPU 0 after
 * the programs' records, so cpu_stats counts them and no number is a gap. */
void requests__end(struct family *first, __u64 end, __u64 *lost, __u64 *expired,
		   __u64 *in_flight)
{
	struct block_bpf *s = families__block();
	struct nt_block_request r;
	struct nt_rq_times t;
	__u64 seq = 0;
	int fd;

	*lost = *expired = *in_flight = 0;
	if (!env.per_request || env.from_completions || !s)
		return;
	*lost = s->bss->times_lost;
	*expired = s->bss->times_expired;
	fd = bpf_map__fd(s->maps.rq_times);
	for (__u32 i = 0; i < NT_TIMES_SLOTS; i++)
		if (!bpf_map_lookup_elem(fd, &i, &t) && t.key && t.d_ns)
			(*in_flight)++;
	if (!*in_flight || env.floor_records)
		return;
	if (counters__take(first, 0, *in_flight, &seq)) {
		fprintf(stderr, "nestrace-agent: WARNING: %llu block requests still dispatched at the "
			"end have no row: cannot number them\n", (unsigned long long)*in_flight);
		return;
	}
	for (__u32 i = 0; i < NT_TIMES_SLOTS; i++) {
		if (bpf_map_lookup_elem(fd, &i, &t) || !t.key || !t.d_ns)
			continue;
		r = (struct nt_block_request){
			.hdr = { .kind = NT_KIND_BLOCK_REQUEST, .version = NT_VERSION_BLOCK_REQUEST,
				 .cpu = 0, .seq = seq++, .ts_ns = end },
			.sector = t.sector, .rq_id = t.key, .bio_id = t.bio,
			.q_ns = t.q_ns, .g_ns = t.g_ns, .i_ns = t.i_ns, .d_ns = t.d_ns,
			.dev = t.dev, .nr_sectors = t.nr_sectors, .pid = t.pid,
			.action = NT_BLOCK_ACTION_UNFINISHED, .req_op = t.req_op,
			.req_flags = t.req_flags, .queued = t.queued,
		};
		memcpy(r.comm, t.comm, sizeof(r.comm));
		out__append(&r, NT_KIND_BLOCK_REQUEST);
	}
	out__flush_kind(NT_KIND_BLOCK_REQUEST);
}

/* --from-completions: the capture's window for counting requests (its
 * start, then its end: the requests that got their tag from start and
 * before end). */
void completions__window(__u64 from, __u64 to)
{
	struct block_bpf *s = families__block();

	if (env.from_completions && s) {
		if (from)
			s->bss->count_from_ns = from;
		if (to)
			s->bss->count_to_ns = to;
	}
}

/* ... after the other hooks came off: the counted requests still in
 * flight get up to 200 ms to end, before the dispatch and completion
 * hooks come off. */
void completions__wait(void)
{
	struct block_bpf *s = families__block();

	if (!env.from_completions || !s)
		return;
	for (int ms = 0; ms < 200; ms++) {
		if (__atomic_load_n(&s->bss->rq_ended, __ATOMIC_RELAXED) >=
		    __atomic_load_n(&s->bss->rq_dispatched, __ATOMIC_RELAXED))
			return;
		usleep(1000);
	}
}

void completions__count(__u64 *dispatched, __u64 *ended)
{
	struct block_bpf *s = families__block();

	*dispatched = *ended = 0;
	if (env.from_completions && s) {
		*dispatched = s->bss->rq_dispatched;
		*ended = s->bss->rq_ended;
	}
}
