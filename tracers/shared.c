// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* What the program families share, read by the agent (programs.h): the
 * per-CPU stages of records, flushed and drained, and the per-CPU
 * counters (sequence numbers, drops, records filtered out). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "nestrace_records.h"
#include "nestrace_bpf.h"
#include "agent.h"
#include "output.h"
#include "programs.h"

/* Push every CPU's staged records into the ring buffer (nt_flush run on
 * each CPU), so that a quiet CPU's records are not held back.  A CPU that
 * cannot run it keeps them until the next try, or the final drain. */
void stages__flush(struct family *first)
{
	struct bpf_program *p = bpf_object__find_program_by_name(first->obj, "nt_flush");
	int ncpu = libbpf_num_possible_cpus();

	for (int cpu = 0; cpu < ncpu; cpu++) {
		LIBBPF_OPTS(bpf_test_run_opts, o, .flags = BPF_F_TEST_RUN_ON_CPU, .cpu = cpu);

		bpf_prog_test_run_opts(bpf_program__fd(p), &o);
	}
}

/* After detaching: read what is still staged straight from the map. */
int stages__drain(struct family *first, ring_buffer_sample_fn sink)
{
	int fd = bpf_map__fd(bpf_object__find_map_by_name(first->obj, "stage"));
	int ncpu = libbpf_num_possible_cpus();
	struct nt_stage *vals = calloc(ncpu, sizeof(*vals));

	if (!vals)
		return -ENOMEM;
	for (__u32 level = 0; level < NT_STAGE_LEVELS; level++) {
		if (bpf_map_lookup_elem(fd, &level, vals)) {
			free(vals);
			return -errno;
		}
		for (int cpu = 0; cpu < ncpu; cpu++)
			if (vals[cpu].len <= NT_STAGE_BYTES)
				sink(NULL, vals[cpu].data, vals[cpu].len);
			else
				out.bad_records += vals[cpu].count;
	}
	free(vals);
	return 0;
}

/* The shared counters map, one entry per CPU, in a buffer kept for the
 * next read (it is read at every flush); NULL on error, said once. */
static struct nt_cpu_counters *counters__read(struct family *first)
{
	static struct nt_cpu_counters *vals;
	static bool said;
	int fd = bpf_map__fd(bpf_object__find_map_by_name(first->obj, "counters"));
	__u32 zero = 0;

	if (!vals)
		vals = calloc(libbpf_num_possible_cpus(), sizeof(*vals));
	if (!vals || bpf_map_lookup_elem(fd, &zero, vals)) {
		if (!said)
			fprintf(stderr, "nestrace-agent: cannot read counters: %s\n", strerror(errno));
		said = true;
		return NULL;
	}
	return vals;
}

/* Records dropped in BPF so far, over all CPUs; -1 when unreadable. */
long long drops__now(struct family *first)
{
	struct nt_cpu_counters *vals = counters__read(first);
	long long sum = 0;

	if (!vals)
		return -1;
	for (int cpu = 0; cpu < libbpf_num_possible_cpus(); cpu++)
		sum += vals[cpu].ringbuf_drops;
	return sum;
}

/* n sequence numbers of CPU cpu for records the agent writes itself once
 * the programs are off (the first in *first_seq), taken in the counters
 * map, so that cpu_stats counts them as emitted: -1 when unreadable. */
int counters__take(struct family *first, int cpu, __u64 n, __u64 *first_seq)
{
	struct nt_cpu_counters *vals = counters__read(first);
	int fd = bpf_map__fd(bpf_object__find_map_by_name(first->obj, "counters"));
	__u32 zero = 0;

	if (!vals)
		return -1;
	*first_seq = vals[cpu].seq + 1;
	vals[cpu].seq += n;
	return bpf_map_update_elem(fd, &zero, vals, BPF_ANY) ? -1 : 0;
}

/* Emit one cpu_stats record per CPU from the shared counters map. */
void stats__emit(struct family *first, __u64 *drops_total)
{
	int ncpu = libbpf_num_possible_cpus();
	struct nt_cpu_counters *vals = counters__read(first);
	__u64 ts = now_ns();

	*drops_total = 0;
	if (!vals)
		return;
	for (int cpu = 0; cpu < ncpu; cpu++) {
		struct nt_cpu_stats s = {
			.hdr = { .kind = NT_KIND_CPU_STATS, .version = NT_VERSION_CPU_STATS,
				 .cpu = cpu, .seq = 0, .ts_ns = ts },
			.emitted = vals[cpu].seq - vals[cpu].ringbuf_drops,
			.ringbuf_drops = vals[cpu].ringbuf_drops,
			.filtered = vals[cpu].filtered,
		};

		*drops_total += s.ringbuf_drops;
		out__append(&s, NT_KIND_CPU_STATS);
	}
	out__flush_kind(NT_KIND_CPU_STATS);
}
