// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* A guest capture without Python (gcap.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <regex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nestrace_records.h"
#include "agent.h"
#include "gcap.h"
#include "guest.h"
#include "output.h"

volatile pid_t child_pid;		/* the traced command */
volatile sig_atomic_t child_done, child_signalled;
char cpus_json[256] = "null";
static struct guest_stack guests[GUEST_MAX];	/* the file systems traced: those of --guest, */
static int nguests;				/* an overlay's base before it */
static cpu_set_t cpus_before;		/* the command runs where the agent could */
static mode_t user_umask = 022;		/* the command's */

static void sigchld_handler(int sig)
{
	child_done = 1;
	exiting = 1;
}

static struct {
	FILE *extents;			/* DIR/extents.jsonl */
	char start_wall[64], end_wall[64];
	int files_start, files_end;
	bool files_start_truncated;	/* the start snapshot stopped at GUEST_MAX_FILES */
	bool made_dir;
	const char *traced_at;	/* where the stack sees the directory: "vfs", "vdisk" or NULL */
	char out_path[PATH_MAX];
} gcap;

static void wall__iso(char *buf, size_t len)
{
	struct timespec ts;
	struct tm tm;
	size_t n;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, len - n, ".%06ld+00:00", ts.tv_nsec / 1000);
}

/* DIR/guest.json, written whole and renamed into place: at the start,
 * and again with the end's facts (command_exit < -1: not ended yet). */
static int gcap__facts(int command_exit)
{
	char tmp[PATH_MAX], path[PATH_MAX], cmd[4096] = "";
	struct utsname u;
	size_t n = 0;
	FILE *f;

	uname(&u);
	for (char **a = env.cmd; a && *a && n < sizeof(cmd); a++)
		n += snprintf(cmd + n, sizeof(cmd) - n, "%s%s", a == env.cmd ? "" : " ", *a);
	snprintf(tmp, sizeof(tmp), "%s/guest.json.tmp", env.guest_dir);
	snprintf(path, sizeof(path), "%s/guest.json", env.guest_dir);
	f = fopen(tmp, "we");
	if (!f)
		goto fail;
	fprintf(f, "{\"format\":\"%s\",\"version\":%d,\"agent_version\":\"%s\",\"machine\":",
		GUEST_FORMAT, GUEST_FORMAT_VERSION, NT_AGENT_VERSION);
	guest__json_str(f, u.nodename);
	fprintf(f, ",\"kernel\":");
	guest__json_str(f, u.release);
	fprintf(f, ",\"start_wall\":\"%s\",\"command\":", gcap.start_wall);
	guest__json_str(f, cmd);
	fprintf(f, ",\"stack\":");
	guest__stack_json(f, guests, nguests);
	fprintf(f, ",\"files_start\":%d,\"files_start_truncated\":%s,\"agent_cpus\":%s",
		gcap.files_start, gcap.files_start_truncated ? "true" : "false", cpus_json);
	if (gcap.traced_at)
		fprintf(f, ",\"store_traced_at\":\"%s\"", gcap.traced_at);
	if (env.target_tgid)
		fprintf(f, ",\"pid\":%u", env.target_tgid);
	if (env.cgroup_fd >= 0) {
		fprintf(f, ",\"cgroup\":");
		guest__json_str(f, env.cgroup_path);
	}
	if (command_exit >= -1) {
		fprintf(f, ",\"end_wall\":\"%s\",\"files_end\":%d,\"command_exit\":",
			gcap.end_wall, gcap.files_end);
		if (command_exit >= 0)
			fprintf(f, "%d", command_exit);
		else
			fprintf(f, "null");
	}
	fprintf(f, "}\n");
	if (fclose(f))
		goto fail;
	if (!rename(tmp, path))
		return 0;
fail:
	fprintf(stderr, "nestrace-agent: cannot write %s: %s\n", path, strerror(errno));
	return -1;
}

/* A guest capture that could not begin leaves nothing behind. */
void gcap__undo(void)
{
	const char *made[] = { "extents.jsonl", "guest.json", "guest.json.tmp" };
	char path[PATH_MAX];

	if (gcap.extents)
		fclose(gcap.extents);
	for (size_t i = 0; gcap.made_dir && i < sizeof(made) / sizeof(made[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", env.guest_dir, made[i]);
		unlink(path);
	}
	if (gcap.made_dir)
		rmdir(env.guest_dir);
}

/* One more file system traced: checked against those before it. */
static int guests__put(const struct guest_stack *g)
{
	for (int k = 0; k < nguests; k++)
		if (g->fs_major == guests[k].fs_major && g->fs_minor == guests[k].fs_minor) {
			if (guests[k].implied && !g->implied) {
				guests[k].implied = false;	/* named after its overlay */
				return 0;
			}
			fprintf(stderr, "nestrace-agent: --guest %s: the file system of --guest %s "
				"again\n", g->mount, guests[k].mount);
			return -1;
		}
	if (nguests == GUEST_MAX) {
		fprintf(stderr, "nestrace-agent: --guest %s: more than %d file systems (overlays' "
			"bases counted)\n", g->mount, GUEST_MAX);
		return -1;
	}
	/* (another disk is another image: a capture of its own) */
	if (nguests && (g->disk_major != guests[0].disk_major ||
			g->disk_minor != guests[0].disk_minor)) {
		fprintf(stderr, "nestrace-agent: --guest %s: on %s, not on %s, the disk of "
			"--guest %s: more than one --guest traces file systems on "
			"partitions of one disk\n", g->mount, g->disk_name,
			guests[0].disk_name, guests[0].mount);
		return -1;
	}
	guests[nguests] = *g;
	guests[nguests].index = nguests;
	nguests++;
	return 0;
}

/* The file system of one --guest; an overlay's base first, unless traced
 * already. */
static int guests__add(const char *mount)
{
	static struct guest_stack g, base;

	if (guest__discover(mount, &g))
		return -1;
	if (g.base_major || g.base_minor) {
		bool have = false;

		for (int k = 0; k < nguests; k++)
			have |= guests[k].fs_major == g.base_major && guests[k].fs_minor == g.base_minor;
		if (!have) {
			if (guest__discover(g.base_mount, &base))
				return -1;
			base.implied = true;
			if (guests__put(&base))
				return -1;
		}
	}
	return guests__put(&g);
}

/* The inode numbers on stdin, the files an end snapshot takes. */
static int facts__touched(void)
{
	unsigned long long ino;
	int n;

	while ((n = scanf("%llu", &ino)) == 1)
		touched__add(ino);
	if (n != EOF || ferror(stdin)) {
		fprintf(stderr, "nestrace-agent: --facts end: stdin: not a list of inode numbers\n");
		return -1;
	}
	return 0;
}

/* --facts: the file systems' facts on stdout, no tracing (0, or the exit
 * code). */
int facts__run(void)
{
	bool start = !strcmp(env.facts, "start"), end = !strcmp(env.facts, "end");
	bool truncated = false;
	int files = 0;

	for (int i = 0; i < env.nguests; i++)
		if (guests__add(env.guest_mounts[i]))
			return 2;
	if (!strcmp(env.facts, "stack")) {
		guest__stack_json(stdout, guests, nguests);
		fputc('\n', stdout);
		return fflush(stdout) ? 1 : 0;
	}
	if (end && facts__touched())
		return 2;
	for (int i = 0; i < nguests; i++) {
		if (start || end) {
			int n = guest__snapshot(&guests[i], env.facts, stdout,
						end ? touched__has : NULL);

			if (n < 0)
				return 1;
			files += n;
			truncated |= guest__snapshot_truncated();
		}
		if (!end && guest__journal(&guests[i], stdout))
			return 1;
	}
	if (start || end)
		printf("{\"snapshot\":\"%s\",\"files\":%d,\"truncated\":%s}\n", env.facts, files,
		       truncated ? "true" : "false");
	return fflush(stdout) ? 1 : 0;
}

/* Before tracing: the stack, the filters, the start snapshot. */
int gcap__begin(void)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d;

	/* the capture's files are its owner's alone, whatever the umask (they
	 * hold command lines and file names); the command runs with the
	 * user's */
	user_umask = umask(077);
	if (!mkdir(env.guest_dir, 0700))
		gcap.made_dir = true;
	else if (errno != EEXIST) {
		fprintf(stderr, "nestrace-agent: --guest-capture %s: %s\n", env.guest_dir,
			strerror(errno));
		return -1;
	}
	d = opendir(env.guest_dir);
	if (!d) {
		fprintf(stderr, "nestrace-agent: --guest-capture %s: %s\n", env.guest_dir,
			strerror(errno));
		return -1;
	}
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			fprintf(stderr, "nestrace-agent: --guest-capture %s: not empty (%s): a capture "
				"goes into a new or empty directory\n", env.guest_dir, de->d_name);
			closedir(d);
			return -1;
		}
	closedir(d);
	for (int i = 0; i < env.nguests; i++)
		if (guests__add(env.guest_mounts[i]))
			return -1;
	guest__warn_untraced(guests, nguests);
	gcap.traced_at = guest__traced_at(guests, nguests, env.guest_dir);
	if (gcap.traced_at)
		fprintf(stderr, "nestrace-agent: warning: --guest-capture %s is on the traced stack: "
			"the agent's own writes to it are traced %s; a directory off the stack "
			"(another disk, a tmpfs) leaves them out\n", env.guest_dir,
			strcmp(gcap.traced_at, "vfs") ? "from the virtual disk down" : "at every level");
	/* as `nestrace record --side guest`: file calls, page cache and
	 * mappings on the file system (the hostfs family, without its hooks
	 * of accesses to an image, which a guest has none of), block events
	 * on its disk */
	env.families = "vfs,block,hostfs";
	if (env.skip_hooks) {
		static char skip[1024];

		snprintf(skip, sizeof(skip), "%s,%s", env.skip_hooks, NT_HOSTFS_SOURCE_NAMES);
		env.skip_hooks = skip;
	} else {
		env.skip_hooks = NT_HOSTFS_SOURCE_NAMES;
	}
	for (int i = 0; i < nguests; i++)
		env__add_dev(guests[i].fs_major << 20 | guests[i].fs_minor,
			     NT_ROLE_VFS | NT_ROLE_CACHE | NT_ROLE_MAP);
	env__add_dev(guests[0].disk_major << 20 | guests[0].disk_minor, NT_ROLE_BLOCK);
	env.arrow_dir = env.guest_dir;
	snprintf(gcap.out_path, sizeof(gcap.out_path), "%s/agent.stream", env.guest_dir);
	env.output = gcap.out_path;
	snprintf(path, sizeof(path), "%s/extents.jsonl", env.guest_dir);
	gcap.extents = fopen(path, "we");
	if (!gcap.extents) {
		fprintf(stderr, "nestrace-agent: cannot create %s: %s\n", path, strerror(errno));
		return -1;
	}
	wall__iso(gcap.start_wall, sizeof(gcap.start_wall));
	for (int i = 0; i < nguests; i++) {
		int n = guest__snapshot(&guests[i], "start", gcap.extents, NULL);

		gcap.files_start_truncated |= guest__snapshot_truncated();
		if (n < 0 || guest__journal(&guests[i], gcap.extents)) {
			fprintf(stderr, "nestrace-agent: cannot write %s: %s\n", path, strerror(errno));
			return -1;
		}
		gcap.files_start += n;
	}
	return gcap__facts(-2);
}

/* --agent-cpus auto in a guest capture: the
 * CPUs of `allowed` that take under 1 % of the block devices' interrupts
 * (virtio-blk queues, NVMe queues, AHCI), from /proc/interrupts; false
 * when there is no such split. */
static bool cpus__quiet(const cpu_set_t *allowed, cpu_set_t *quiet)
{
	static unsigned long long per_cpu[CPU_SETSIZE];
	int cols[CPU_SETSIZE], ncols = 0, nquiet = 0, nallowed = 0;
	unsigned long long total = 0;
	char *line = NULL, *tok, *save;
	size_t cap = 0;
	regex_t re;
	FILE *f = fopen("/proc/interrupts", "re");

	if (!f)
		return false;
	if (getline(&line, &cap, f) > 0)
		for (tok = strtok_r(line, " \t\n", &save); tok && ncols < CPU_SETSIZE;
		     tok = strtok_r(NULL, " \t\n", &save))
			if (!strncmp(tok, "CPU", 3))
				cols[ncols++] = atoi(tok + 3);
	regcomp(&re, "virtio[0-9]+-req|(^|[^a-z0-9])nvme[0-9]+q[0-9]+|(^|[^a-z0-9])ahci",
		REG_EXTENDED | REG_NOSUB);
	while (getline(&line, &cap, f) > 0) {
		char *p = strchr(line, ':');

		if (!p || regexec(&re, line, 0, NULL, 0))
			continue;
		p++;
		for (int i = 0; i < ncols; i++) {
			char *end;
			unsigned long long n = strtoull(p, &end, 10);

			if (end == p)
				break;
			if (cols[i] < CPU_SETSIZE)
				per_cpu[cols[i]] += n;
			p = end;
		}
	}
	regfree(&re);
	free(line);
	fclose(f);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, allowed))
			total += per_cpu[c], nallowed++;
	if (nallowed < 2 || !total)
		return false;
	CPU_ZERO(quiet);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, allowed) && per_cpu[c] <= total / 100)
			CPU_SET(c, quiet), nquiet++;
	return nquiet && nquiet < nallowed;
}


/* Pin the agent away from the disk interrupts (a guest capture). */
void cpus__pin(void)
{
	cpu_set_t quiet;
	char list[256] = "";
	size_t n = 0;

	if (sched_getaffinity(0, sizeof(cpus_before), &cpus_before))
		return;
	if (env.cpus_all || !cpus__quiet(&cpus_before, &quiet))
		return;
	if (sched_setaffinity(0, sizeof(quiet), &quiet)) {
		fprintf(stderr, "nestrace-agent: cannot pin to the quiet CPUs: %s\n", strerror(errno));
		return;
	}
	for (int c = 0; c < CPU_SETSIZE && n < sizeof(list) - 8; c++)
		if (CPU_ISSET(c, &quiet))
			n += snprintf(list + n, sizeof(list) - n, "%s%d", n ? "," : "", c);
	snprintf(cpus_json, sizeof(cpus_json), "[%s]", list);
}

int command__start(void)
{
	pid_t pid;

	signal(SIGCHLD, sigchld_handler);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "nestrace-agent: cannot start %s: %s\n", env.cmd[0], strerror(errno));
		return -1;
	}
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		signal(SIGCHLD, SIG_DFL);
		sched_setaffinity(0, sizeof(cpus_before), &cpus_before);
		umask(user_umask);
		execvp(env.cmd[0], env.cmd);
		fprintf(stderr, "nestrace-agent: %s: %s\n", env.cmd[0], strerror(errno));
		_exit(127);
	}
	child_pid = pid;
	return 0;
}

/* The command's exit status as a shell gives it (128 + N for signal N);
 * one still running when the capture ends gets SIGTERM, 5 s, SIGKILL. */
static int command__finish(void)
{
	int status;

	if (!child_pid)
		return -1;
	if (!child_done) {
		kill(child_pid, SIGTERM);
		for (int i = 0; i < 50 && !waitpid(child_pid, &status, WNOHANG); i++)
			usleep(100000);
		kill(child_pid, SIGKILL);
	}
	while (waitpid(child_pid, &status, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* After tracing: the end snapshot of the files touched, the end facts. */
int gcap__end(void)
{
	int rc = command__finish();

	wall__iso(gcap.end_wall, sizeof(gcap.end_wall));
	for (int i = 0; i < nguests && gcap.files_end >= 0; i++) {
		int n = guest__snapshot(&guests[i], "end", gcap.extents, touched__has);

		gcap.files_end = n < 0 ? -1 : gcap.files_end + n;
	}
	if (fclose(gcap.extents) || gcap.files_end < 0) {
		fprintf(stderr, "nestrace-agent: cannot write %s/extents.jsonl: %s\n",
			env.guest_dir, strerror(errno));
		return -1;
	}
	if (gcap__facts(rc))
		return -1;
	if (rc >= 0)
		fprintf(stderr, "nestrace-agent: %s exited %d\n", env.cmd[0], rc);
	fprintf(stderr, "nestrace-agent: guest capture in %s (%llu records): "
		"`nestrace import %s -o STORE` makes a store of it\n", env.guest_dir,
		(unsigned long long)out.records, env.guest_dir);
	return 0;
}

