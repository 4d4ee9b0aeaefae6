/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* nestrace-agent's options (agent.c), which the guest capture (gcap.c)
 * reads and adds its file systems' filters to. */
#ifndef __NESTRACE_AGENT_H
#define __NESTRACE_AGENT_H

#include <limits.h>
#include <stdbool.h>
#include <time.h>
#include <linux/types.h>

#include "nestrace_bpf.h"
#include "guest.h"

struct env {
	bool verbose;
	bool die_with_parent;
	const char *output;
	const char *arrow_dir;		/* records as Arrow IPC streams here */
	bool tee;			/* ... and in the frame stream too */
	const char *mode;		/* auto, tp_btf, raw_tp */
	const char *families;		/* comma list */
	const char *skip_hooks;		/* comma list of tracepoints */
	__u64 ringbuf_bytes;
	__u64 wakeup_bytes;
	long duration_s;
	long flush_ms;
	long status_ms;			/* a status line this often (0: none) */
	__u32 target_tgid;
	const char *cgroup;		/* vfs: only this cgroup (v2) and below */
	int cgroup_fd;
	char cgroup_path[PATH_MAX];	/* ... its real path */
	const char *guest_mounts[GUEST_MAX];	/* a guest capture without Python: */
	int nguests;			/* ... its file systems (--guest, again) */
	const char *guest_dir;		/* ... its directory */
	const char *facts;		/* --facts: stack, start, end or journal */
	bool cpus_all;			/* ... the agent not pinned (--agent-cpus all) */
	bool empty_programs;		/* every program returns at once (--empty-programs) */
	bool floor_records;		/* headers alone, after each filter (--floor-records) */
	bool per_request;		/* block: a record per request, at its end (--per-request) */
	bool from_completions;		/* ... read from struct request at its end (--from-completions) */
	bool request_floor;		/* ... its header alone, as --floor-records (--request-floor) */
	char **cmd;			/* ... the command it traces */
	int ndevs, ninos;
	struct { __u32 dev; __u32 roles; } devs[NT_MAX_DEVS];
	struct { struct nt_ino_key key; __u32 roles; } inos[NT_MAX_INOS];
};

extern struct env env;

static inline __u64 now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (__u64)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* Trace dev for roles too (a device given again adds roles); false when
 * NT_MAX_DEVS are taken. */
bool env__add_dev(__u32 dev, __u32 roles);

#endif /* __NESTRACE_AGENT_H */
