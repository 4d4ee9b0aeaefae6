// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* nestrace-agent's BPF program families (programs.h): opened with the
 * options' filters and settings as constants, loaded as tp_btf or their
 * raw_tp twins, attached hook by hook (their shared maps: shared.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "nestrace_records.h"
#include "nestrace_bpf.h"
#include "agent.h"
#include "output.h"
#include "programs.h"
#include "requests.h"
#include "vfs.skel.h"
#include "block.skel.h"
#include "hostfs.skel.h"
#include "netfs.skel.h"

#define MAX_HOOKS 128

bool quiet_libbpf;

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

struct btf *vmlinux_btf;

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
	s->rodata->from_completion = env.from_completions;
	if (env.per_request && !env.from_completions) {
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
int cgroup__set(void)
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

void btf__load_all(void)
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

/* The block tracepoints on a request's way down: --from-completions
 * attaches none of them but the dispatch, which counts the requests. */
#define BLOCK_BEGINNINGS "block_bio_queue,block_bio_backmerge,block_bio_frontmerge,block_getrq," \
	"block_split,block_rq_insert,block_rq_merge"

/* A hook not to attach: --skip-hooks, or one --from-completions leaves. */
static bool hook__skipped(const char *tp)
{
	return list__has(env.skip_hooks, tp) ||
	       (env.from_completions && list__has(BLOCK_BEGINNINGS, tp));
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
						  !hook__skipped(tp));
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

/* A tracepoint that ends what others begin (a request, a system call).
 * With --from-completions the dispatch counts what the completions end:
 * it is attached and detached with them. */
static bool hook__ends(const char *tp)
{
	static const char *const ends[] = {
		"block_rq_complete", "block_rq_requeue", "io_uring_complete", "sys_exit",
	};

	for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++)
		if (!strcmp(tp, ends[i]))
			return true;
	return env.from_completions && !strcmp(tp, "block_rq_issue");
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
			if (is_btf && hook__skipped(tp)) {
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

/* The block family's skeleton (it comes first), NULL when not loaded. */
struct block_bpf *families__block(void)
{
	return families[0].skel;
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

void hooks__json(char *buf, size_t len)
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
int families__load(struct family **first, int *nloaded)
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
__u64 families__attach(__u64 *ends_ns)
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

/* Detach every hook: the ones that end what others begin last, as they
 * came first, so what was in flight completes on the record; the misses
 * read between the detach and the drain (all counted, none to come). */
void families__detach(char *misses_json, size_t len, __u64 *misses)
{
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < nhooks; i++)
			if (hook__ends(hooks[i].name) == pass)
				bpf_link__destroy(hooks[i].link);
		if (!pass)
			completions__wait();
	}
	hooks__misses_json(misses_json, len, misses);
	for (int i = 0; i < nhooks; i++)
		hooks[i].link = NULL;
}

void families__destroy(void)
{
	for (int i = 0; i < nhooks; i++)
		bpf_link__destroy(hooks[i].link);
	for (size_t i = 0; i < NFAMILIES; i++)
		if (families[i].skel)
			families[i].destroy(families[i].skel);
}
