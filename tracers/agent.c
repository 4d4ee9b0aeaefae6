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
#include "guest.h"
#include "output.h"
#include "vfs.skel.h"
#include "block.skel.h"
#include "hostfs.skel.h"
#include "netfs.skel.h"

#define MAX_HOOKS 128

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
       OPT_REQUEST_FLOOR, OPT_PER_REQUEST };

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

static bool quiet_libbpf;

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

static __u64 now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (__u64)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
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

/* ---- program families ------------------------------------------------- */

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

/* Stages go to the ring buffer whole: keep each under an eighth of it. */
static __u32 stage__limit(void)
{
	__u64 lim = env.ringbuf_bytes / 8;

	return lim < NT_STAGE_BYTES - NT_REC_MAX ? (__u32)lim : NT_STAGE_BYTES - NT_REC_MAX;
}

/* Small filter sets go into .rodata as constants; large ones use the maps. */
static void filters__rodata(volatile __u32 *use_maps, volatile __u32 *ndevs, __u32 *devs,
			    __u32 *dev_roles, volatile __u32 *ninos, __u32 *ino_devs,
			    __u64 *inos, __u32 *ino_roles)
{
	if (env.ndevs > NT_FAST_FILTER || env.ninos > NT_FAST_FILTER) {
		*use_maps = 1;
		return;
	}
	*ndevs = env.ndevs;
	for (int i = 0; i < env.ndevs; i++) {
		devs[i] = env.devs[i].dev;
		dev_roles[i] = env.devs[i].roles;
	}
	*ninos = env.ninos;
	for (int i = 0; i < env.ninos; i++) {
		ino_devs[i] = env.inos[i].key.dev;
		inos[i] = env.inos[i].key.ino;
		ino_roles[i] = env.inos[i].roles;
	}
}

#define FAMILY(fam)							\
	static void *fam##__open(void) { return fam##_bpf__open(); }	\
	static int fam##__load(void *s) { return fam##_bpf__load(s); }	\
	static void fam##__destroy(void *s) { fam##_bpf__destroy(s); }	\
	static struct bpf_object *fam##__object(void *s)		\
	{ return ((struct fam##_bpf *)s)->obj; }			\
	static void fam##__set_rodata(void *p)				\
	{								\
		struct fam##_bpf *s = p;				\
		s->rodata->wakeup_bytes = env.wakeup_bytes;		\
		s->rodata->empty_programs = env.empty_programs;		\
		s->rodata->floor_records = env.floor_records;		\
		s->rodata->stage_limit = stage__limit();		\
		filters__rodata(&s->rodata->filter_maps,		\
				&s->rodata->fast_ndevs,			\
				(__u32 *)s->rodata->fast_devs,		\
				(__u32 *)s->rodata->fast_dev_roles,	\
				&s->rodata->fast_ninos,			\
				(__u32 *)s->rodata->fast_ino_devs,	\
				(__u64 *)s->rodata->fast_inos,		\
				(__u32 *)s->rodata->fast_ino_roles);	\
		fam##__extra_rodata(s);					\
	}

static struct btf *vmlinux_btf;

static void vfs__extra_rodata(struct vfs_bpf *s)
{
	/* the open file's fields by plain loads where the kernel has the
	 * kfunc that allows it (Linux 6.2+), a probe read each elsewhere */
	s->rodata->have_rdonly_cast = vmlinux_btf &&
		btf__find_by_name_kind(vmlinux_btf, "bpf_rdonly_cast", BTF_KIND_FUNC) > 0;
	s->rodata->target_tgid = env.target_tgid;
	s->rodata->target_cgroup = env.cgroup_fd >= 0;
	for (int i = 0; i < env.ndevs; i++)	/* sync(2) is recorded on the first vfs device */
		if (env.devs[i].roles & NT_ROLE_VFS) {
			s->rodata->sync_dev = env.devs[i].dev;
			break;
		}
}
/* (--per-request's maps: a slot each for the bios and requests in flight
 * on the traced disks; one entry each otherwise) */
static void block__extra_rodata(struct block_bpf *s)
{
	s->rodata->per_request = env.per_request;
	if (env.per_request) {
		s->rodata->times_mask = NT_TIMES_SLOTS - 1;
		bpf_map__set_max_entries(s->maps.bio_times, NT_TIMES_SLOTS);
		bpf_map__set_max_entries(s->maps.rq_times, NT_TIMES_SLOTS);
	}
}
static void hostfs__extra_rodata(struct hostfs_bpf *s) {}
static void netfs__extra_rodata(struct netfs_bpf *s) {}
FAMILY(vfs)
FAMILY(block)
FAMILY(hostfs)
FAMILY(netfs)

#define FAMILY_ENTRY(fam) { #fam, NULL, NULL, fam##__open, fam##__load, \
	fam##__destroy, fam##__object, fam##__set_rodata }

static struct family families[] = {
	FAMILY_ENTRY(block), FAMILY_ENTRY(vfs), FAMILY_ENTRY(hostfs), FAMILY_ENTRY(netfs),
};
#define NFAMILIES (sizeof(families) / sizeof(families[0]))

/* The --cgroup directory put in the vfs programs' map, before they attach. */
static int cgroup__set(void)
{
	__u32 key = 0;
	int fd = env.cgroup_fd;
	struct bpf_map *m = NULL;

	for (size_t i = 0; i < NFAMILIES; i++)
		if (families[i].skel && !strcmp(families[i].name, "vfs"))
			m = bpf_object__find_map_by_name(families[i].obj, "target_cgroups");
	if (!m) {
		fprintf(stderr, "nestrace-agent: --cgroup: the vfs programs are not loaded "
			"(--families)\n");
		return -1;
	}
	if (bpf_map__update_elem(m, &key, sizeof(key), &fd, sizeof(fd), BPF_ANY)) {
		fprintf(stderr, "nestrace-agent: --cgroup %s: %s\n", env.cgroup, strerror(errno));
		return -1;
	}
	return 0;
}

static struct hook {
	char name[64];
	const char *how;	/* tp_btf, raw_tp, missing, attach-failed */
	struct bpf_link *link;
	struct bpf_program *prog;
} hooks[MAX_HOOKS];
static int nhooks;

static struct btf *module_btfs[64];
static int nmodule_btfs;

static void btf__load_all(void)
{
	DIR *d;
	struct dirent *de;
	char path[PATH_MAX];

	vmlinux_btf = btf__load_vmlinux_btf();
	if (!vmlinux_btf)
		return;
	d = opendir("/sys/kernel/btf");
	if (!d)
		return;
	while ((de = readdir(d)) && nmodule_btfs < 64) {
		if (de->d_name[0] == '.' || !strcmp(de->d_name, "vmlinux"))
			continue;
		snprintf(path, sizeof(path), "/sys/kernel/btf/%s", de->d_name);
		module_btfs[nmodule_btfs] = btf__parse_split(path, vmlinux_btf);
		if (module_btfs[nmodule_btfs])
			nmodule_btfs++;
	}
	closedir(d);
}

/* A tracepoint exists if the kernel (or a module) has its btf_trace_ type. */
static bool tracepoint__exists(const char *tp)
{
	char name[128];

	snprintf(name, sizeof(name), "btf_trace_%s", tp);
	if (vmlinux_btf && btf__find_by_name_kind(vmlinux_btf, name, BTF_KIND_TYPEDEF) > 0)
		return true;
	for (int i = 0; i < nmodule_btfs; i++)
		if (btf__find_by_name_kind(module_btfs[i], name, BTF_KIND_TYPEDEF) > 0)
			return true;
	return false;
}

static const char *program__tracepoint(struct bpf_program *p, bool *is_btf)
{
	const char *sec = bpf_program__section_name(p);

	*is_btf = !strncmp(sec, "tp_btf/", 7);
	return strchr(sec, '/') ? strchr(sec, '/') + 1 : "";
}

static bool list__has(const char *list, const char *name)
{
	char buf[1024], *tok, *save;

	if (!list)
		return false;
	snprintf(buf, sizeof(buf), "%s", list);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		if (!strcmp(tok, name))
			return true;
	return false;
}

static bool family__wanted(const char *name)
{
	return list__has(env.families, name);
}

/* Open a family and keep one program of each twin pair: the tp_btf one
 * when use_btf, the raw_tp one otherwise; neither when the tracepoint is
 * absent from this kernel.  Maps are shared with `first`, if loaded. */
static int family__open(struct family *f, bool use_btf, struct family *first)
{
	struct bpf_program *p;
	bool is_btf;

	f->skel = f->open();
	if (!f->skel)
		return -errno;
	f->obj = f->object(f->skel);
	f->set_rodata(f->skel);
	bpf_object__for_each_program(p, f->obj) {
		const char *tp = program__tracepoint(p, &is_btf);

		if (!*tp)	/* nt_flush: run by the agent, from the first family */
			bpf_program__set_autoload(p, !first);
		else
			bpf_program__set_autoload(p, tracepoint__exists(tp) && is_btf == use_btf &&
						  !list__has(env.skip_hooks, tp));
	}
	if (first) {
		static const char *shared[] = { "events", "counters", "stage", "devs", "inos" };

		for (size_t i = 0; i < sizeof(shared) / sizeof(shared[0]); i++) {
			struct bpf_map *m = bpf_object__find_map_by_name(f->obj, shared[i]);
			struct bpf_map *fm = bpf_object__find_map_by_name(first->obj, shared[i]);
			int err = bpf_map__reuse_fd(m, bpf_map__fd(fm));

			if (err)
				return err;
		}
	} else {
		bpf_map__set_max_entries(bpf_object__find_map_by_name(f->obj, "events"),
					 env.ringbuf_bytes);
	}
	return 0;
}

static int family__load(struct family *f, struct family *first)
{
	bool try_btf = strcmp(env.mode, "raw_tp") != 0;
	int err;

	err = family__open(f, try_btf, first);
	if (!err) {
		quiet_libbpf = !strcmp(env.mode, "auto");
		err = f->load(f->skel);
		quiet_libbpf = false;
	}
	if (err && try_btf && !strcmp(env.mode, "auto")) {
		/* tp_btf refused (no BTF-typed tracepoints, or not permitted):
		 * load the raw_tp twins instead, and say so (they read each
		 * field through a helper: slower; --mode tp_btf -v shows why) */
		fprintf(stderr, "nestrace-agent: the %s programs as raw_tp: tp_btf refused (%s)\n",
			f->name, strerror(-err));
		f->destroy(f->skel);
		err = family__open(f, false, first);
		if (!err)
			err = f->load(f->skel);
	}
	if (err) {
		fprintf(stderr, "nestrace-agent: failed to load the %s programs: %s\n",
			f->name, strerror(-err));
		f->destroy(f->skel);
		f->skel = NULL;
	}
	return err;
}

/* A tracepoint that ends what others begin (a request, a system call). */
static bool hook__ends(const char *tp)
{
	static const char *const ends[] = {
		"block_rq_complete", "block_rq_requeue", "io_uring_complete", "sys_exit",
	};

	for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++)
		if (!strcmp(tp, ends[i]))
			return true;
	return false;
}

/* Attach a family's programs on the tracepoints that end what others
 * begin (ends) or on the others.  The ends go first, so that a request
 * or call seen to begin is also seen to end. */
static void family__attach(struct family *f, bool ends)
{
	struct bpf_program *p;
	bool is_btf;

	bpf_object__for_each_program(p, f->obj) {
		const char *tp = program__tracepoint(p, &is_btf);
		struct hook *h;

		if (!*tp || hook__ends(tp) != ends)
			continue;
		if (nhooks >= MAX_HOOKS) {	/* (never silently: a hook not attached is said) */
			fprintf(stderr, "nestrace-agent: WARNING: more than %d hooks: %s and the "
				"ones after it are not attached\n", MAX_HOOKS, tp);
			break;
		}
		if (!bpf_program__autoload(p)) {
			/* record a tracepoint skipped or the kernel lacks, once */
			if (is_btf && list__has(env.skip_hooks, tp)) {
				h = &hooks[nhooks++];
				snprintf(h->name, sizeof(h->name), "%s", tp);
				h->how = "skipped";
			} else if (!tracepoint__exists(tp) && is_btf) {
				h = &hooks[nhooks++];
				snprintf(h->name, sizeof(h->name), "%s", tp);
				h->how = "missing";
			}
			continue;
		}
		h = &hooks[nhooks++];
		snprintf(h->name, sizeof(h->name), "%s", tp);
		h->prog = p;
		h->link = bpf_program__attach(p);
		h->how = h->link ? (is_btf ? "tp_btf" : "raw_tp") : "attach-failed";
		if (!h->link)
			fprintf(stderr, "nestrace-agent: cannot attach %s: %s\n", tp, strerror(errno));
	}
}

static int filters__fill(struct family *first)
{
	int devs_fd = bpf_map__fd(bpf_object__find_map_by_name(first->obj, "devs"));
	int inos_fd = bpf_map__fd(bpf_object__find_map_by_name(first->obj, "inos"));

	for (int i = 0; i < env.ndevs; i++)
		if (bpf_map_update_elem(devs_fd, &env.devs[i].dev, &env.devs[i].roles, BPF_ANY))
			return -errno;
	for (int i = 0; i < env.ninos; i++)
		if (bpf_map_update_elem(inos_fd, &env.inos[i].key, &env.inos[i].roles, BPF_ANY))
			return -errno;
	return 0;
}

/* Push every CPU's staged records into the ring buffer (nt_flush run on
 * each CPU), so that a quiet CPU's records are not held back.  A CPU that
 * cannot run it keeps them until the next try, or the final drain. */
static void stages__flush(struct family *first)
{
	struct bpf_program *p = bpf_object__find_program_by_name(first->obj, "nt_flush");
	int ncpu = libbpf_num_possible_cpus();

	for (int cpu = 0; cpu < ncpu; cpu++) {
		LIBBPF_OPTS(bpf_test_run_opts, o, .flags = BPF_F_TEST_RUN_ON_CPU, .cpu = cpu);

		bpf_prog_test_run_opts(bpf_program__fd(p), &o);
	}
}

/* After detaching: read what is still staged straight from the map. */
static int stages__drain(struct family *first)
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
				on_record(NULL, vals[cpu].data, vals[cpu].len);
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
static long long drops__now(struct family *first)
{
	struct nt_cpu_counters *vals = counters__read(first);
	long long sum = 0;

	if (!vals)
		return -1;
	for (int cpu = 0; cpu < libbpf_num_possible_cpus(); cpu++)
		sum += vals[cpu].ringbuf_drops;
	return sum;
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

/* Emit one cpu_stats record per CPU from the shared counters map. */
static void stats__emit(struct family *first, __u64 *drops_total)
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

/* --per-request, after the programs are detached: the requests and merged
 * bios whose times were lost for want of a slot (*lost), the slots given
 * up after 10 s without an end (*expired), and the requests dispatched
 * and not ended (*in_flight: in flight at the end, or their end unseen). */
static void requests__count(__u64 *lost, __u64 *expired, __u64 *in_flight)
{
	struct block_bpf *s = families[0].skel;	/* (block comes first) */
	struct nt_rq_times t;
	int fd;

	*lost = *expired = *in_flight = 0;
	if (!env.per_request || !s)
		return;
	*lost = s->bss->times_lost;
	*expired = s->bss->times_expired;
	fd = bpf_map__fd(s->maps.rq_times);
	for (__u32 i = 0; i < NT_TIMES_SLOTS; i++)
		if (!bpf_map_lookup_elem(fd, &i, &t) && t.key && t.d_ns)
			(*in_flight)++;
}

/* Tracepoint hits the kernel did not run a program for: a program is
 * not re-entered on its CPU, so a hit from an interrupt that lands while
 * the same program runs there (a softirq completion inside a completion)
 * is skipped, and only counted in the program's recursion_misses.  They
 * are lost events like the others.  JSON "tracepoint":misses for the
 * hooks that missed any; the sum in *total. */
static void hooks__misses_json(char *buf, size_t len, __u64 *total)
{
	size_t n = 0;

	*total = 0;
	n += snprintf(buf + n, len - n, "{");
	for (int i = 0; i < nhooks && n < len; i++) {
		struct bpf_prog_info info = {};
		__u32 info_len = sizeof(info);

		if (!hooks[i].link || bpf_obj_get_info_by_fd(bpf_program__fd(hooks[i].prog),
							      &info, &info_len))
			continue;
		if (!info.recursion_misses)
			continue;
		n += snprintf(buf + n, len - n, "%s\"%s\":%llu", *total ? "," : "",
			      hooks[i].name, (unsigned long long)info.recursion_misses);
		*total += info.recursion_misses;
	}
	if (n < len)
		snprintf(buf + n, len - n, "}");
}

static void hooks__json(char *buf, size_t len)
{
	size_t n = 0;

	n += snprintf(buf + n, len - n, "{");
	for (int i = 0; i < nhooks && n < len; i++)
		n += snprintf(buf + n, len - n, "%s\"%s\":\"%s\"", i ? "," : "",
			      hooks[i].name, hooks[i].how);
	if (n < len)
		snprintf(buf + n, len - n, "}");
}

/* Load every family asked for; the first one's maps are shared and hold
 * the filters.  0, or a negative errno or 2 (nothing selected). */
static int families__load(struct family **first, int *nloaded)
{
	int err;

	for (size_t i = 0; i < NFAMILIES; i++) {
		struct family *f = &families[i];

		if (!family__wanted(f->name))
			continue;
		err = family__load(f, *first);
		if (err)	/* (an agent that traces less than asked fails) */
			return err;
		if (!*first) {
			*first = f;
			err = filters__fill(f);
			if (err) {
				fprintf(stderr, "nestrace-agent: cannot fill filters: %s\n", strerror(-err));
				return err;
			}
		}
		(*nloaded)++;
	}
	if (!*first) {
		fprintf(stderr, "nestrace-agent: no program family selected (--families)\n");
		return 2;
	}
	return 0;
}

/* Attach every program; *ends_ns: every program that ends what others
 * begin is attached by then (they go first), so a begin recorded at all
 * has its end seen. */
static __u64 families__attach(__u64 *ends_ns)
{
	__u64 attach_ns = now_ns();

	for (int ends = 1; ends >= 0; ends--) {
		for (size_t i = 0; i < NFAMILIES; i++)
			if (families[i].skel)
				family__attach(&families[i], ends);
		if (ends)
			*ends_ns = now_ns();
	}
	return attach_ns;
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
	__u64 drops = 0, misses = 0, rq_lost, rq_expired, rq_in_flight;
	int err;

	/* detach first, then drain what is left, so nothing is cut in half;
	 * the misses are read between the two: all counted, none to come.
	 * The hooks that end what others begin go last, as they came first:
	 * what was in flight at end_ns completes on the record. */
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < nhooks; i++)
			if (hook__ends(hooks[i].name) == pass)
				bpf_link__destroy(hooks[i].link);
	hooks__misses_json(misses_json, sizeof(misses_json), &misses);
	for (int i = 0; i < nhooks; i++)
		hooks[i].link = NULL;
	ring_buffer__consume(rb);
	err = stages__drain(first);
	if (err)
		fprintf(stderr, "nestrace-agent: WARNING: cannot read the staged records: %s\n",
			strerror(-err));
	out__flush();
	stats__emit(first, &drops);
	requests__count(&rq_lost, &rq_expired, &rq_in_flight);
	arrow__close();		/* before the end frame: it reports a failed write */
	if (env.per_request)
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
		  env.per_request ? "requests" : "events", hooks_json);
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
	for (int i = 0; i < nhooks; i++)
		bpf_link__destroy(hooks[i].link);
	for (size_t i = 0; i < NFAMILIES; i++)
		if (families[i].skel)
			families[i].destroy(families[i].skel);
	outputs__close();
	return err ? 1 : 0;
}
