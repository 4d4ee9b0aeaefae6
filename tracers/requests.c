// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* What the block family keeps of the requests, read by the agent at the
 * end: --per-request's slots, --from-completions' counts. */
#include <unistd.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "nestrace_records.h"
#include "nestrace_bpf.h"
#include "agent.h"
#include "programs.h"
#include "requests.h"
#include "block.skel.h"

/* --per-request, after the programs are detached: the requests and merged
 * bios whose times were lost for want of a slot (*lost), the slots given
 * up after 10 s without an end (*expired), and the requests dispatched
 * and not ended (*in_flight: in flight at the end, or their end unseen). */
void requests__count(__u64 *lost, __u64 *expired, __u64 *in_flight)
{
	struct block_bpf *s = families__block();
	struct nt_rq_times t;
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
