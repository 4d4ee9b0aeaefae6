// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* nestrace-agent: load the nestrace BPF program families, attach them to
 * tracepoints (tp_btf, or raw_tp twins where tp_btf does not work), and
 * stream their fixed-width records as frames to stdout or a file.
 *
 * The stream is a sequence of frames (struct nt_frame + payload):
 *   kind 0: UTF-8 JSON metadata (hooks used, ring buffer size, end reason)
 *   kind N: `count` records of `rec_size` bytes of record kind N
 * Records are batched per kind and flushed every --flush-ms, so a reader
 * sees data within that time and a killed agent loses at most one batch.
 */
#define _GNU_SOURCE
#include <argp.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <regex.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "nestrace_records.h"
#include "nestrace_bpf.h"
#include "nestrace_arrow.h"
#include "agent.h"
#include "gcap.h"
#include "programs.h"
#include "requests.h"
#include "guest.h"
#include "output.h"

struct env env = {
	.mode = "auto",
	.families = "vfs,block,hostfs",
	.ringbuf_bytes = 16 << 20,
	.flush_ms = 200,
	.cgroup_fd = -1,
};

volatile sig_atomic_t exiting;
const char *exit_reason = "signal";

const char *argp_program_version = "nestrace-agent " NT_AGENT_VERSION " build " NT_BUILD_ID;
static const char doc[] =
"nestrace-agent: stream nestrace BPF records for a nested storage stack.\n"
"\n"
"ROLES is a comma list of vfs, block, file, cache, map, net.\n"
"\n"
"EXAMPLES:\n"
"  nestrace-agent --dev 7:0=vfs,cache,map --dev 7:0=block --dev 7:1=block \\\n"
"                 --ino 7:1:131=file,cache,map -o trace.ntr\n"
"      trace a guest FS on loop0 whose image (inode 131) lives on loop1\n"
"  nestrace-agent --families block --dev 253:0=block -d 10 > blk.ntr\n"
"      only block events of one disk, for 10 seconds\n"
"  nestrace-agent --guest /data --guest-capture /tmp/g -- fio job.fio\n"
"      in a VM without nestrace's Python: the file system at /data and its\n"
"      disk while fio runs, into /tmp/g (then `nestrace import /tmp/g -o\n"
"      guest.store` wherever nestrace is installed)\n";

enum { OPT_DIE = 1000, OPT_MODE, OPT_FLUSH, OPT_WAKEUP, OPT_SKIP, OPT_ARROW, OPT_TEE, OPT_GUEST,
       OPT_GUEST_DIR, OPT_FACTS, OPT_CPUS, OPT_STATUS, OPT_CGROUP, OPT_EMPTY, OPT_FLOOR,
       OPT_REQUEST_FLOOR, OPT_PER_REQUEST, OPT_FROM_COMPLETIONS };

static const struct argp_option opts[] = {
	{ "dev", 'D', "MAJ:MIN=ROLES", 0, "Trace this device for ROLES (repeatable)" },
	{ "ino", 'I', "MAJ:MIN:INO=ROLES", 0, "Trace this inode for ROLES (repeatable)" },
	{ "pid", 'p', "TGID", 0, "vfs: only this process" },
	{ "cgroup", OPT_CGROUP, "DIR", 0, "vfs: only the tasks of this cgroup (a cgroup v2 directory) and of the cgroups below it" },
	{ "families", 'f', "LIST", 0, "Program families to load: vfs, block, hostfs, netfs (default vfs,block,hostfs)" },
	{ "skip-hooks", OPT_SKIP, "LIST", 0, "Tracepoints not to attach (comma list; those the host FS never yields)" },
	{ "output", 'o', "FILE", 0, "Write the stream here (default stdout)" },
	{ "arrow-dir", OPT_ARROW, "DIR", 0, "Write the records as Arrow IPC streams DIR/<table>.arrows, one batch per flush; the stream keeps the metadata frames" },
	{ "tee", OPT_TEE, NULL, 0, "With --arrow-dir: keep the records in the stream too" },
	{ "guest", OPT_GUEST, "MOUNT", 0, "Guest capture without Python: the file system at MOUNT (ext2/3/4, xfs, btrfs; an overlay on one of the first four, with it) and its disk, the filters found here; again for another file system on a partition of the same disk (a VM's / and /home)" },
	{ "agent-cpus", OPT_CPUS, "auto|all", 0, "With --guest-capture: auto (default) runs the agent on the CPUs that take no block-device interrupts, when some do and others not; all: anywhere" },
	{ "guest-capture", OPT_GUEST_DIR, "DIR", 0, "With --guest: write the capture into DIR (new or empty): records, metadata, extent maps; run the command after -- and stop when it exits" },
	{ "facts", OPT_FACTS, "WHAT", 0, "With --guest, no tracing: print the file systems' facts on stdout and exit. stack: one JSON object (their disk, partitions, the other mounts of it); start: the start snapshot of their files' extents and where their journals are, a JSON line each (as a guest capture's extents.jsonl), then {\"snapshot\":...} with the count; end: the snapshot of the files whose inode numbers are on stdin; journal: where their journals are. `nestrace record` takes the guest side's facts from here" },
	{ "duration", 'd', "SECONDS", 0, "Stop after this long (default: until SIGINT/SIGTERM)" },
	{ "ringbuf-kb", 'r', "KB", 0, "Ring buffer size in KiB, a power of two from 4 to 2097152 (default 16384)" },
	{ "wakeup-kb", OPT_WAKEUP, "KB", 0, "Wake the agent when this much waits (default ringbuf/4)" },
	{ "flush-ms", OPT_FLUSH, "MS", 0, "Flush batches at least this often (default 200)" },
	{ "status-ms", OPT_STATUS, "MS", 0, "Print a status line on stderr this often: records taken in so far per family and per traced disk, and events lost (default 0: none)" },
	{ "mode", OPT_MODE, "MODE", 0, "auto (probe), tp_btf or raw_tp" },
	{ "empty-programs", OPT_EMPTY, NULL, 0, "Attach every program, each returning at once: nothing is recorded (what the hooks alone cost; bench/overhead's (e))" },
	{ "floor-records", OPT_FLOOR, NULL, 0, "Each program filters as it does, then records its record's header alone: what a record per event costs at the least (bench/overhead's (f)); the records are no capture's" },
	{ "per-request", OPT_PER_REQUEST, NULL, 0, "block: one record per request (block_request), written at its completion or requeue with the phase times kept in the kernel from its first bio's queue, and one per bio merged into a request, instead of a record per tracepoint hit" },
	{ "from-completions", OPT_FROM_COMPLETIONS, NULL, 0, "As --per-request, but each request's record is written from its completion or requeue alone, its times read from struct request (allocation, dispatch; its first bio's queue where the kernel keeps it): no program on its way down, no insert time, no merged bio's own record" },
	{ "request-floor", OPT_REQUEST_FLOOR, NULL, 0, "As --floor-records, but the block programs keep each request's phase times as --per-request does and record one header at its end: what a record per request costs at the least (bench/overhead's (g))" },
	{ "die-with-parent", OPT_DIE, NULL, 0, "Exit when the parent process dies" },
	{ "verbose", 'v', NULL, 0, "Show libbpf debug output" },
	{},
};

static __u32 roles__parse(const char *s)
{
	__u32 r = 0;
	char buf[128], *tok, *save;

	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcmp(tok, "vfs")) r |= NT_ROLE_VFS;
		else if (!strcmp(tok, "block")) r |= NT_ROLE_BLOCK;
		else if (!strcmp(tok, "file")) r |= NT_ROLE_FILE;
		else if (!strcmp(tok, "cache")) r |= NT_ROLE_CACHE;
		else if (!strcmp(tok, "map")) r |= NT_ROLE_MAP;
		else if (!strcmp(tok, "net")) r |= NT_ROLE_NET;
		else return 0;
	}
	return r;
}

/* The same device may be given several times: roles add up. */
bool env__add_dev(__u32 dev, __u32 roles)
{
	for (int i = 0; i < env.ndevs; i++)
		if (env.devs[i].dev == dev) {
			env.devs[i].roles |= roles;
			return true;
		}
	if (env.ndevs >= NT_MAX_DEVS)
		return false;
	env.devs[env.ndevs].dev = dev;
	env.devs[env.ndevs++].roles = roles;
	return true;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	unsigned int maj, min;
	unsigned long long ino;
	char roles[128];

	switch (key) {
	case 'D':
		if (sscanf(arg, "%u:%u=%127s", &maj, &min, roles) != 3 || !roles__parse(roles) ||
		    !env__add_dev((maj << 20) | min, roles__parse(roles)))	/* kernel dev_t */
			argp_error(state, "bad --dev '%s' (want MAJ:MIN=ROLES)", arg);
		break;
	case 'I':
		if (env.ninos >= NT_MAX_INOS ||
		    sscanf(arg, "%u:%u:%llu=%127s", &maj, &min, &ino, roles) != 4 ||
		    !roles__parse(roles))
			argp_error(state, "bad --ino '%s' (want MAJ:MIN:INO=ROLES)", arg);
		env.inos[env.ninos].key.dev = (maj << 20) | min;
		env.inos[env.ninos].key.ino = ino;
		env.inos[env.ninos++].roles = roles__parse(roles);
		break;
	case 'p': env.target_tgid = strtoul(arg, NULL, 10); break;
	case OPT_CGROUP: env.cgroup = arg; break;
	case OPT_EMPTY: env.empty_programs = true; break;
	case OPT_FLOOR: env.floor_records = true; break;
	case OPT_REQUEST_FLOOR: env.floor_records = env.request_floor = env.per_request = true; break;
	case OPT_PER_REQUEST: env.per_request = true; break;
	case OPT_FROM_COMPLETIONS: env.per_request = env.from_completions = true; break;
	case 'f': env.families = arg; break;
	case 'o': env.output = arg; break;
	case 'd': env.duration_s = strtol(arg, NULL, 10); break;
	case 'r': {
		unsigned long kb = strtoul(arg, NULL, 10);

		/* (a ring buffer's size is a u32 of bytes: 2 GiB at most) */
		if (kb < 4 || (kb & (kb - 1)) || kb > (1UL << 21))
			argp_error(state, "--ringbuf-kb must be a power of two from 4 to 2097152 (2 GiB)");
		env.ringbuf_bytes = (__u64)kb << 10;
		break;
	}
	case OPT_WAKEUP: env.wakeup_bytes = strtoull(arg, NULL, 10) << 10; break;
	case OPT_SKIP: env.skip_hooks = arg; break;
	case OPT_ARROW: env.arrow_dir = arg; break;
	case OPT_TEE: env.tee = true; break;
	case OPT_FLUSH: env.flush_ms = strtol(arg, NULL, 10); break;
	case OPT_STATUS:
		env.status_ms = strtol(arg, NULL, 10);
		if (env.status_ms < 0)
			argp_error(state, "--status-ms must be >= 0");
		break;
	case OPT_MODE:
		if (strcmp(arg, "auto") && strcmp(arg, "tp_btf") && strcmp(arg, "raw_tp"))
			argp_error(state, "--mode is auto, tp_btf or raw_tp");
		env.mode = arg;
		break;
	case OPT_DIE: env.die_with_parent = true; break;
	case 'v': env.verbose = true; break;
	case OPT_GUEST:
		if (env.nguests == GUEST_MAX)
			argp_error(state, "--guest: %d file systems at most", GUEST_MAX);
		env.guest_mounts[env.nguests++] = arg;
		break;
	case OPT_GUEST_DIR: env.guest_dir = arg; break;
	case OPT_FACTS:
		if (strcmp(arg, "stack") && strcmp(arg, "start") && strcmp(arg, "end") &&
		    strcmp(arg, "journal"))
			argp_error(state, "--facts is stack, start, end or journal");
		env.facts = arg;
		break;
	case OPT_CPUS:
		if (strcmp(arg, "auto") && strcmp(arg, "all"))
			argp_error(state, "--agent-cpus is auto or all");
		env.cpus_all = !strcmp(arg, "all");
		break;
	case ARGP_KEY_ARGS: env.cmd = state->argv + state->next; break;
	case ARGP_KEY_END:
		if (env.facts && (!env.nguests || env.guest_dir || env.cmd))
			argp_error(state, "--facts takes --guest, and no --guest-capture or command");
		if (!env.facts && !env.nguests != !env.guest_dir)
			argp_error(state, "--guest and --guest-capture go together");
		if (env.cmd && !env.guest_dir)
			argp_error(state, "a command (after --) runs only in a --guest-capture");
		break;
	default: return ARGP_ERR_UNKNOWN;
	}
	return 0;
}


#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

/* --cgroup: the directory of a cgroup v2 (the BPF helper that tells
 * whether a task is under it knows the v2 hierarchy only). */
static int cgroup__open(void)
{
	struct statfs sf;

	env.cgroup_fd = open(env.cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (env.cgroup_fd < 0) {
		fprintf(stderr, "nestrace-agent: --cgroup %s: %s\n", env.cgroup, strerror(errno));
		return -1;
	}
	if (!realpath(env.cgroup, env.cgroup_path))
		snprintf(env.cgroup_path, sizeof(env.cgroup_path), "%s", env.cgroup);
	if (fstatfs(env.cgroup_fd, &sf) || sf.f_type != CGROUP2_SUPER_MAGIC) {
		fprintf(stderr, "nestrace-agent: --cgroup %s: not a cgroup v2 directory (a directory "
			"of a cgroup2 file system; cgroup v1 is not followed)\n", env.cgroup);
		close(env.cgroup_fd);
		env.cgroup_fd = -1;
		return -1;
	}
	return 0;
}

static int libbpf_print_fn(enum libbpf_print_level level, const char *fmt, va_list args)
{
	if (level == LIBBPF_DEBUG && !env.verbose)
		return 0;
	if (quiet_libbpf && !env.verbose)
		return 0;
	return vfprintf(stderr, fmt, args);
}

static void sig_handler(int sig)
{
	/* A traced command ends the capture: SIGTERM is passed on to it, and
	 * it has 5 s to exit; Ctrl-C reaches it from the terminal already. */
	if (child_pid > 0 && !child_done && !child_signalled) {
		child_signalled = 1;
		if (sig == SIGTERM)
			kill(child_pid, sig);
		return;
	}
	exiting = 1;
}

_Static_assert(sizeof(struct nt_vfs_event) <= NT_REC_MAX, "NT_REC_MAX");
_Static_assert(sizeof(struct nt_block_event) <= NT_REC_MAX, "NT_REC_MAX");
_Static_assert(sizeof(struct nt_hostfs_event) <= NT_REC_MAX, "NT_REC_MAX");
_Static_assert(sizeof(struct nt_pagecache_event) <= NT_REC_MAX, "NT_REC_MAX");
_Static_assert(sizeof(struct nt_mapping_event) <= NT_REC_MAX, "NT_REC_MAX");
_Static_assert(sizeof(struct nt_netfs_event) <= NT_REC_MAX, "NT_REC_MAX");
_Static_assert(sizeof(struct nt_block_request) <= NT_REC_MAX, "NT_REC_MAX");

/* What the status lines count (--status-ms): records taken in so far, the
 * calls and dispatches with their bytes.  Counted only when asked for. */
static struct {
	__u64 vfs_calls, vfs_bytes, hostfs, cache;
	__u64 blk_d[NT_MAX_DEVS], blk_bytes[NT_MAX_DEVS];	/* by env.devs index */
} tally;

static void tally__dispatch(__u32 dev, __u32 nr_sectors)
{
	for (int i = 0; i < env.ndevs; i++)
		if (env.devs[i].dev == dev) {
			tally.blk_d[i]++;
			tally.blk_bytes[i] += (__u64)nr_sectors << 9;
			return;
		}
}

static void tally__add(const void *p, __u16 kind)
{
	if (kind == NT_KIND_VFS_EVENT) {
		const struct nt_vfs_event *e = p;

		tally.vfs_calls++;
		if (e->ret > 0)
			tally.vfs_bytes += e->ret;
	} else if (kind == NT_KIND_BLOCK_EVENT) {
		const struct nt_block_event *e = p;

		if (e->action == NT_BLOCK_ACTION_D)	/* a request dispatched to the disk */
			tally__dispatch(e->dev, e->nr_sectors);
	} else if (kind == NT_KIND_BLOCK_REQUEST) {	/* (--per-request: at its end) */
		const struct nt_block_request *r = p;

		if (r->action == NT_BLOCK_ACTION_C || r->action == NT_BLOCK_ACTION_REQUEUE)
			tally__dispatch(r->dev, r->nr_sectors);
	} else if (kind == NT_KIND_HOSTFS_EVENT) {
		tally.hostfs++;
	} else if (kind == NT_KIND_PAGECACHE_EVENT) {
		tally.cache++;
	}
}

/* A ring buffer sample is one CPU stage: records back to back. */
static int on_record(void *ctx, void *data, size_t size)
{
	const char *p = data, *end = p + size;

	while (p < end) {
		const struct nt_header *h = (const void *)p;

		if ((size_t)(end - p) < sizeof(*h) || h->kind == 0 || h->kind >= MAX_KIND ||
		    !rec_sizes[h->kind] || rec_sizes[h->kind] > (size_t)(end - p)) {
			out.bad_records++;	/* reported in the end frame, never silent */
			return 0;
		}
		out__append(p, h->kind);
		if (env.status_ms)
			tally__add(p, h->kind);
		/* a guest capture snapshots the files it touched at the end */
		if (env.guest_dir && h->kind == NT_KIND_VFS_EVENT)
			touched__add(((const struct nt_vfs_event *)p)->ino);
		else if (env.guest_dir && h->kind == NT_KIND_PAGECACHE_EVENT)
			touched__add(((const struct nt_pagecache_event *)p)->ino);
		p += rec_sizes[h->kind];
	}
	return 0;
}

/* One status line (--status-ms): what was taken in so far, for the
 * caller to turn into rates; printed after a flush, at most --flush-ms
 * later than asked. */
static void status__print(__u64 elapsed_ns, long long drops)
{
	char blk[NT_MAX_DEVS * 64] = "";
	size_t n = 0;

	for (int i = 0; i < env.ndevs && n < sizeof(blk); i++)
		if (env.devs[i].roles & NT_ROLE_BLOCK)
			n += snprintf(blk + n, sizeof(blk) - n, "%s%u:%u:%llu:%llu", n ? "," : "",
				      env.devs[i].dev >> 20, env.devs[i].dev & 0xfffff,
				      (unsigned long long)tally.blk_d[i],
				      (unsigned long long)tally.blk_bytes[i]);
	fprintf(stderr, "nestrace-agent: status ms=%llu records=%llu drops=%lld vfs=%llu:%llu "
		"hostfs=%llu cache=%llu blk=%s\n", (unsigned long long)(elapsed_ns / 1000000),
		(unsigned long long)out.records, drops, (unsigned long long)tally.vfs_calls,
		(unsigned long long)tally.vfs_bytes, (unsigned long long)tally.hostfs,
		(unsigned long long)tally.cache, blk);
}

/* Poll the ring buffer until a signal, --duration, the command's end or a
 * poll error; flush every --flush-ms, saying losses and status lines. */
static void capture__loop(struct ring_buffer *rb, struct family *first, __u64 start)
{
	__u64 last_flush = start, last_status = start, last_warn = 0, signal_ns = 0;
	long long warned = 0, now_drops;
	int err;

	while (!exiting) {
		__u64 t;

		err = ring_buffer__poll(rb, env.flush_ms > 50 ? 50 : env.flush_ms);
		if (err < 0 && err != -EINTR) {
			fprintf(stderr, "nestrace-agent: poll: %s\n", strerror(-err));
			exit_reason = "poll error";
			break;
		}
		t = now_ns();
		if (t - last_flush >= (__u64)env.flush_ms * 1000000ULL) {
			/* records wait in the stages and the ring without a
			 * wake-up: fetch them so the store is never far behind */
			stages__flush(first);
			ring_buffer__consume(rb);
			out__flush();
			last_flush = t;
			/* losses said while they happen, not only at the end:
			 * when the count grew, once a second at most */
			now_drops = drops__now(first);
			if (now_drops > warned && t - last_warn >= 1000000000ULL) {
				fprintf(stderr, "nestrace-agent: WARNING: %lld events lost so far (ring "
					"buffer full); raise --ringbuf-kb\n", now_drops);
				warned = now_drops;
				last_warn = t;
			}
			/* (right after a flush: the counts are as of t, give or
			 * take the records the kernel is still writing) */
			if (env.status_ms && t - last_status >= (__u64)env.status_ms * 1000000ULL) {
				status__print(t - start, now_drops);
				last_status = t;
			}
		}
		if (env.duration_s && !env.cmd &&
		    t - start >= (__u64)env.duration_s * 1000000000ULL) {
			exit_reason = "duration";
			break;
		}
		if (child_signalled && !signal_ns)
			signal_ns = t;
		if (signal_ns && !child_done && t - signal_ns >= 5000000000ULL)
			break;		/* the command did not exit: it is killed */
	}
	if (child_done)
		exit_reason = "command";
}

/* End the capture at end_ns: detach, drain, the counters and the end
 * frame, the warnings.  0, or 1 when the guest capture's end failed. */
static int capture__end(struct ring_buffer *rb, struct family *first, __u64 end)
{
	static char misses_json[4096];
	char per_request[128] = "";
	__u64 drops = 0, misses = 0, rq_lost, rq_expired, rq_in_flight, rq_dispatched, rq_ended;
	int err;

	/* detach first, then drain what is left, so nothing is cut in half;
	 * the misses are read between the two: all counted, none to come.
	 * The hooks that end what others begin go last, as they came first:
	 * what was in flight at end_ns completes on the record. */
	completions__window(0, end);
	families__detach(misses_json, sizeof(misses_json), &misses);
	ring_buffer__consume(rb);
	err = stages__drain(first, on_record);
	if (err)
		fprintf(stderr, "nestrace-agent: WARNING: cannot read the staged records: %s\n",
			strerror(-err));
	out__flush();
	requests__end(first, end, &rq_lost, &rq_expired, &rq_in_flight);
	stats__emit(first, &drops);
	arrow__close();		/* before the end frame: it reports a failed write */
	completions__count(&rq_dispatched, &rq_ended);
	if (env.from_completions)
		snprintf(per_request, sizeof(per_request), ",\"requests_dispatched\":%llu,"
			 "\"requests_ended\":%llu", (unsigned long long)rq_dispatched,
			 (unsigned long long)rq_ended);
	else if (env.per_request)
		snprintf(per_request, sizeof(per_request), ",\"requests_lost\":%llu,"
			 "\"requests_expired\":%llu,\"requests_in_flight\":%llu",
			 (unsigned long long)rq_lost, (unsigned long long)rq_expired,
			 (unsigned long long)rq_in_flight);
	out__json("{\"type\":\"end\",\"end_ns\":%llu,\"reason\":\"%s\",\"records\":%llu,"
		  "\"bad_records\":%llu,\"ringbuf_drops\":%llu,\"hook_misses\":%llu,"
		  "\"hook_misses_by_hook\":%s%s}",
		  (unsigned long long)end, exit_reason,
		  (unsigned long long)out.records, (unsigned long long)out.bad_records,
		  (unsigned long long)drops, (unsigned long long)misses, misses_json, per_request);
	if (rq_lost)
		fprintf(stderr, "nestrace-agent: WARNING: %llu block requests lost (--per-request: "
			"its %d slots were full)\n", (unsigned long long)rq_lost,
			NT_TIMES_SLOTS);
	if (misses)
		fprintf(stderr, "nestrace-agent: WARNING: %llu tracepoint hits missed (a program "
			"interrupted by its own tracepoint is not re-entered): %s\n",
			(unsigned long long)misses, misses_json);
	if (drops)
		fprintf(stderr, "nestrace-agent: WARNING: %llu events lost (ring buffer full); "
			"raise --ringbuf-kb\n", (unsigned long long)drops);
	return env.guest_dir && gcap__end() ? 1 : 0;
}

/* The stream's start frame, and the line that says tracing began. */
static void start__frame(__u64 start, __u64 attach_ns, __u64 ends_ns, int nloaded)
{
	static char hooks_json[4096];

	hooks__json(hooks_json, sizeof(hooks_json));
	out__json("{\"type\":\"start\",\"agent_version\":\"%s\",\"start_ns\":%llu,"
		  "\"attach_ns\":%llu,\"ends_attached_ns\":%llu,"
		  "\"ringbuf_bytes\":%llu,\"wakeup_bytes\":%llu,\"flush_ms\":%ld,\"ncpu\":%d,"
		  "\"families\":\"%s\",\"mode\":\"%s\",\"block_records\":\"%s\",\"hooks\":%s}",
		  NT_AGENT_VERSION, (unsigned long long)start,
		  (unsigned long long)attach_ns, (unsigned long long)ends_ns,
		  (unsigned long long)env.ringbuf_bytes, (unsigned long long)env.wakeup_bytes,
		  env.flush_ms, libbpf_num_possible_cpus(), env.families, env.mode,
		  env.from_completions ? "completions" : env.per_request ? "requests" : "events",
		  hooks_json);
	fprintf(stderr, "nestrace-agent: tracing (%d families, ring buffer %llu KiB%s)\n",
		nloaded, (unsigned long long)env.ringbuf_bytes >> 10,
		env.empty_programs ? "; empty programs: nothing is recorded" :
		env.request_floor ? "; request floor: a header per block request, no capture's" :
		env.floor_records ? "; floor records: headers alone, no capture's" : "");
}

int main(int argc, char **argv)
{
	static const struct argp argp = { .options = opts, .parser = parse_arg, .doc = doc };
	struct family *first = NULL;
	struct ring_buffer *rb = NULL;
	__u64 start, attach_ns, ends_ns = 0;
	int err, nloaded = 0;

	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return 2;
	if (env.die_with_parent)
		prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (env.cgroup && cgroup__open())
		return 2;
	if (!env.wakeup_bytes || env.wakeup_bytes > env.ringbuf_bytes)
		env.wakeup_bytes = env.ringbuf_bytes / 4;
	libbpf_set_print(libbpf_print_fn);
	signal(SIGINT, sig_handler);
	signal(SIGTERM, sig_handler);
	signal(SIGPIPE, SIG_IGN);
	if (env.facts)
		return facts__run();
	if (env.guest_dir)
		cpus__pin();
	if (env.guest_dir && gcap__begin()) {
		gcap__undo();
		return 2;
	}
	if (env.guest_dir && strcmp(cpus_json, "null"))
		fprintf(stderr, "nestrace-agent: on CPU %.*s, away from the disk interrupts "
			"(--agent-cpus all: anywhere)\n", (int)strlen(cpus_json) - 2, cpus_json + 1);
	err = outputs__open(env.output, env.arrow_dir, env.tee);
	if (err)
		return err;
	btf__load_all();
	if (!vmlinux_btf) {
		fprintf(stderr, "nestrace-agent: no kernel BTF (/sys/kernel/btf/vmlinux): "
			"CO-RE programs cannot be loaded\n");
		return 2;
	}
	err = families__load(&first, &nloaded);
	if (err)
		goto cleanup;
	if (env.cgroup_fd >= 0 && cgroup__set()) {
		err = 2;
		goto cleanup;
	}
	rb = ring_buffer__new(bpf_map__fd(bpf_object__find_map_by_name(first->obj, "events")),
			      on_record, NULL, NULL);
	if (!rb) {
		err = -errno;
		fprintf(stderr, "nestrace-agent: ring buffer: %s\n", strerror(errno));
		goto cleanup;
	}
	attach_ns = families__attach(&ends_ns);

	start = now_ns();
	completions__window(start, 0);
	start__frame(start, attach_ns, ends_ns, nloaded);
	if (env.cmd && command__start())
		exiting = 1, exit_reason = "command failed to start";
	capture__loop(rb, first, start);
	/* The capture ends now, while every hook is still attached: an event
	 * before end_ns was seen by all of them.  (Taken after the detach
	 * loop, a request completing during it would fall inside the capture
	 * with its C missing.) */
	err = capture__end(rb, first, now_ns());

cleanup:
	ring_buffer__free(rb);
	families__destroy();
	outputs__close();
	return err ? 1 : 0;
}
