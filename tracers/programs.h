/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* nestrace-agent's BPF program families (programs.c) and the maps they
 * share (shared.c). */
#ifndef __NESTRACE_PROGRAMS_H
#define __NESTRACE_PROGRAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <linux/types.h>
#include <bpf/libbpf.h>

struct family {
	const char *name;
	void *skel;
	struct bpf_object *obj;
	void *(*open)(void);
	int (*load)(void *skel);
	void (*destroy)(void *skel);
	struct bpf_object *(*object)(void *skel);
	void (*set_rodata)(void *skel);
};

/* libbpf's messages held back while a tp_btf load may fall back to raw_tp */
extern bool quiet_libbpf;
/* the kernel's BTF (NULL: none, and no program can be loaded) */
extern struct btf *vmlinux_btf;

void btf__load_all(void);
/* Load every family asked for; the first one's maps are shared and hold
 * the filters.  0, or a negative errno or 2 (nothing selected). */
int families__load(struct family **first, int *nloaded);
/* The --cgroup directory put in the vfs programs' map (0, or -1 said). */
int cgroup__set(void);
/* Attach every program (the ones that end what others begin first); when
 * attaching began, and in *ends_ns when the ends were all attached. */
__u64 families__attach(__u64 *ends_ns);
/* Detach every hook; the recursion misses as JSON and their sum. */
void families__detach(char *misses_json, size_t len, __u64 *misses);
void families__destroy(void);

/* The maps the families share (shared.c).  Push every CPU's staged
 * records into the ring buffer. */
void stages__flush(struct family *first);
/* After detaching: what is still staged, handed to sink. */
int stages__drain(struct family *first, ring_buffer_sample_fn sink);
/* Records dropped in BPF so far, over all CPUs; -1 when unreadable. */
long long drops__now(struct family *first);
/* One cpu_stats record per CPU; the drops' sum. */
void stats__emit(struct family *first, __u64 *drops_total);
/* n sequence numbers of a CPU for the agent's own records; the first. */
int counters__take(struct family *first, int cpu, __u64 n, __u64 *first_seq);
/* The hooks and how each was attached, as JSON. */
void hooks__json(char *buf, size_t len);

#endif /* __NESTRACE_PROGRAMS_H */
