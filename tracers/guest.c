// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The guest side of a capture, found here alone: a file system's disk and
 * partition, its files' extents, where its journal is.  A guest capture
 * without Python (--guest-capture) writes them into its directory;
 * `nestrace record` asks for them (--facts) and stores what it is told. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <endian.h>
#include <stddef.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/fiemap.h>
#include <linux/fs.h>

#include "guest.h"

/* file systems whose extents the agent maps: FIEMAP addresses on their
 * own device, or (btrfs) logical ones, with the chunk tree to map them */
static const char *const mapped_fs[] = { "ext2", "ext3", "ext4", "xfs", "btrfs" };

static void unescape(char *s)
{
	char *w = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*w++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 | (s[3] - '0'));
			s += 3;
		} else {
			*w++ = *s;
		}
	}
	*w = 0;
}

static int read_sysfs(const char *dir, const char *name, char *buf, size_t len)
{
	char path[PATH_MAX];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

static unsigned long long sysfs_ull(const char *dir, const char *name, unsigned long long dflt)
{
	char buf[64];

	return read_sysfs(dir, name, buf, sizeof(buf)) ? dflt : strtoull(buf, NULL, 10);
}

/* A guest btrfs on several disks is refused (only the one under the
 * mount is traced: the others' bytes would be lost), as by record. */
static int btrfs__one_device(const char *mount, struct guest_stack *g)
{
	struct btrfs_ioctl_fs_info_args fi = {};
	char names[256] = "";
	size_t n = 0;
	int fd = open(mount, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0 || ioctl(fd, BTRFS_IOC_FS_INFO, &fi)) {
		fprintf(stderr, "nestrace-agent: --guest %s: btrfs FS_INFO: %s\n", mount,
			strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	for (__u64 id = 1; id <= fi.max_id; id++) {
		struct btrfs_ioctl_dev_info_args di = { .devid = id };

		if (ioctl(fd, BTRFS_IOC_DEV_INFO, &di))
			continue;
		if (!g->btrfs_devid)
			g->btrfs_devid = id;
		if (n < sizeof(names))
			n += snprintf(names + n, sizeof(names) - n, "%s%s", n ? ", " : "",
				      basename((char *)di.path));
	}
	close(fd);
	if (fi.num_devices != 1) {
		fprintf(stderr, "nestrace-agent: --guest %s: a btrfs on %llu devices (%s): nestrace "
			"traces one virtual disk under the guest file system\n", mount,
			(unsigned long long)fi.num_devices, names);
		return -1;
	}
	if (!g->btrfs_devid) {
		fprintf(stderr, "nestrace-agent: --guest %s: btrfs DEV_INFO found no device\n",
			mount);
		return -1;
	}
	return 0;
}

/* The chunk tree as one JSON line: a chunk is [logical, length, type,
 * stripe_len, sub_stripes, [[devid, offset], ...]]; `nestrace import`
 * maps btrfs's logical extent addresses through it as `record` does. */
static int btrfs__chunks(const char *mount, const char *phase, int index, FILE *f)
{
	struct btrfs_ioctl_search_args args;
	struct btrfs_ioctl_search_key *sk = &args.key;
	bool first = true;
	int fd = open(mount, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	memset(&args, 0, sizeof(args));
	sk->tree_id = BTRFS_CHUNK_TREE_OBJECTID;
	sk->min_objectid = sk->max_objectid = BTRFS_FIRST_CHUNK_TREE_OBJECTID;
	sk->min_type = sk->max_type = BTRFS_CHUNK_ITEM_KEY;
	sk->max_offset = sk->max_transid = ~0ULL;
	fprintf(f, "{\"phase\":\"%s\",", phase);
	if (index)
		fprintf(f, "\"fs\":%d,", index);
	fprintf(f, "\"btrfs_chunks\":[");
	for (;;) {
		size_t off = 0;
		__u32 n;

		sk->nr_items = 4096;
		if (ioctl(fd, BTRFS_IOC_TREE_SEARCH, &args)) {
			int e = errno;

			close(fd);
			errno = e;
			return -1;
		}
		n = sk->nr_items;
		if (!n)
			break;
		for (__u32 i = 0; i < n; i++) {
			struct btrfs_ioctl_search_header sh;
			struct btrfs_chunk c;
			const char *item;

			memcpy(&sh, args.buf + off, sizeof(sh));
			item = args.buf + off + sizeof(sh);
			off += sizeof(sh) + sh.len;
			sk->min_offset = sh.offset + 1;
			if (sh.type != BTRFS_CHUNK_ITEM_KEY || sh.len < sizeof(c))
				continue;
			memcpy(&c, item, sizeof(c));
			fprintf(f, "%s[%llu,%llu,%llu,%llu,%u,[", first ? "" : ",",
				(unsigned long long)sh.offset, (unsigned long long)le64toh(c.length),
				(unsigned long long)le64toh(c.type),
				(unsigned long long)le64toh(c.stripe_len), le16toh(c.sub_stripes));
			first = false;
			for (__u16 k = 0; k < le16toh(c.num_stripes); k++) {
				struct btrfs_stripe st;
				size_t at = offsetof(struct btrfs_chunk, stripe) + k * sizeof(st);

				if (at + sizeof(st) > sh.len)
					break;
				memcpy(&st, item + at, sizeof(st));
				fprintf(f, "%s[%llu,%llu]", k ? "," : "",
					(unsigned long long)le64toh(st.devid),
					(unsigned long long)le64toh(st.offset));
			}
			fprintf(f, "]]");
		}
		if (sk->min_offset == 0)	/* wrapped past the last key */
			break;
	}
	close(fd);
	fprintf(f, "]}\n");
	return 0;
}

/* The mount a path (real, resolved) is on: the longest mount point over
 * it, the last of equals (the mount on top). */
struct mount_of {
	char mp[PATH_MAX], fs[32], src[PATH_MAX];
	unsigned int major, minor;
};

static bool mount__of(const char *real, struct mount_of *m)
{
	char line[4 * PATH_MAX], mp[PATH_MAX], fs[32], src[PATH_MAX];
	size_t best = 0;
	FILE *mi = fopen("/proc/self/mountinfo", "re");

	if (!mi)
		return false;
	while (fgets(line, sizeof(line), mi)) {
		char *sep = strstr(line, " - ");
		unsigned int a, b;
		size_t n;

		if (!sep || sscanf(line, "%*u %*u %u:%u %*s %4095s", &a, &b, mp) != 3 ||
		    sscanf(sep + 3, "%31s %4095s", fs, src) != 2)
			continue;
		unescape(mp);
		n = strlen(mp);
		if (strcmp(mp, "/") && (strncmp(real, mp, n) || (real[n] && real[n] != '/')))
			continue;
		if (n >= best) {
			best = n;
			m->major = a, m->minor = b;
			unescape(src);
			snprintf(m->mp, sizeof(m->mp), "%s", mp);
			snprintf(m->fs, sizeof(m->fs), "%s", fs);
			snprintf(m->src, sizeof(m->src), "%s", src);
		}
	}
	fclose(mi);
	return best > 0;
}

/* ---- overlays (a container's root) -------------------------------------- */

/* An overlay's layer directories, from its super options as mountinfo
 * shows them: upperdir, workdir, and
 * the lower ones (lowerdir, lowerdir+, datadir+).  mountinfo shows each
 * value as given with a space, comma or backslash octal-escaped (\040);
 * lower ones are joined by colons, a backslash escaping the character
 * after it (a colon or backslash in a name, so shown as \134:).  fn is
 * called on each; a nonzero return stops the walk and is returned. */
static int overlay__layers(const char *opts, int (*fn)(const char *dir, void *arg), void *arg)
{
	static char buf[4 * PATH_MAX], dir[PATH_MAX];
	char *save, *opt;
	int rc;

	snprintf(buf, sizeof(buf), "%s", opts);
	for (opt = strtok_r(buf, ",", &save); opt; opt = strtok_r(NULL, ",", &save)) {
		char *val = strchr(opt, '=');
		bool lower;

		if (!val)
			continue;
		*val++ = 0;
		lower = !strcmp(opt, "lowerdir") || !strcmp(opt, "lowerdir+") ||
			!strcmp(opt, "datadir+");
		if (!lower && strcmp(opt, "upperdir") && strcmp(opt, "workdir"))
			continue;
		unescape(val);
		while (*val) {
			char *w = dir;

			/* one name: to a colon no backslash escapes (lower), or the end */
			for (; *val && !(lower && *val == ':'); val++) {
				if (lower && val[0] == '\\' && val[1])
					val++;
				if (w < dir + sizeof(dir) - 1)
					*w++ = *val;
			}
			*w = 0;
			if (*val)
				val++;		/* the colon */
			if (*dir && (rc = fn(dir, arg)))
				return rc;
		}
	}
	return 0;
}

struct overlay_base {
	struct mount_of base;	/* the mount of the layers found so far */
	int n;			/* layers found */
	char other[PATH_MAX];	/* the mount point of a layer on another one */
};

static int overlay__layer(const char *dir, void *arg)
{
	static struct mount_of m;
	struct overlay_base *b = arg;
	char real[PATH_MAX];

	if (!realpath(dir, real) || !mount__of(real, &m))
		return 0;		/* (gone: a layer not found) */
	if (b->n++ && (m.major != b->base.major || m.minor != b->base.minor)) {
		snprintf(b->other, sizeof(b->other), "%s", m.mp);
		return 1;
	}
	b->base = m;
	return 0;
}

/* g, an overlay mounted at real with super options opts: its base (the
 * file system of its layers) discovered into g, then g made the overlay
 * again, its base in base_*. */
static int overlay__discover(const char *real, const char *opts, struct guest_stack *g)
{
	static struct overlay_base b;
	unsigned int maj = g->fs_major, min = g->fs_minor;

	memset(&b, 0, sizeof(b));
	if (overlay__layers(opts, overlay__layer, &b)) {
		fprintf(stderr, "nestrace-agent: --guest %s: an overlay with layers on several file "
			"systems (%s, %s): nestrace follows an overlay whose layers are on one\n",
			real, b.base.mp, b.other);
		return -1;
	}
	if (!b.n) {
		fprintf(stderr, "nestrace-agent: --guest %s: an overlay whose layers were not found "
			"(options %s)\n", real, opts);
		return -1;
	}
	if (!strcmp(b.base.fs, "overlay") || !strcmp(b.base.fs, "btrfs")) {
		fprintf(stderr, "nestrace-agent: --guest %s: an overlay on %s (%s): nestrace follows "
			"an overlay on ext2/3/4 or xfs\n", real, b.base.fs, b.base.mp);
		return -1;
	}
	if (guest__discover(b.base.mp, g))
		return -1;
	g->base_major = g->fs_major, g->base_minor = g->fs_minor;
	snprintf(g->base_mount, sizeof(g->base_mount), "%s", g->mount);
	g->fs_major = maj, g->fs_minor = min;
	snprintf(g->mount, sizeof(g->mount), "%s", real);
	snprintf(g->fs, sizeof(g->fs), "overlay");
	return 0;
}

/* The disk under the file system at `real` (block device blk_major:
 * blk_minor: a partition's whole disk, with the partition's name, start
 * and size), and its block size. */
static int disk__of(const char *real, unsigned int blk_major, unsigned int blk_minor,
		    struct guest_stack *g)
{
	char sys[PATH_MAX], dev[PATH_MAX], buf[64];
	struct statvfs sv;

	snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u", blk_major, blk_minor);
	if (!realpath(sys, dev)) {
		fprintf(stderr, "nestrace-agent: --guest %s: on %u:%u, not a block device\n", real,
			blk_major, blk_minor);
		return -1;
	}
	if (!read_sysfs(dev, "partition", buf, sizeof(buf))) {
		snprintf(g->part_name, sizeof(g->part_name), "%s", basename(dev));
		g->part_start_bytes = sysfs_ull(dev, "start", 0) * 512;
		g->part_size_bytes = sysfs_ull(dev, "size", 0) * 512;
		*strrchr(dev, '/') = 0;		/* the whole disk's directory */
	}
	if (read_sysfs(dev, "dev", buf, sizeof(buf)) ||
	    sscanf(buf, "%u:%u", &g->disk_major, &g->disk_minor) != 2) {
		fprintf(stderr, "nestrace-agent: %s/dev: cannot read the disk's number\n", dev);
		return -1;
	}
	snprintf(g->disk_name, sizeof(g->disk_name), "%s", basename(dev));
	g->size_sectors = sysfs_ull(dev, "size", 0);
	g->logical_block_bytes = sysfs_ull(dev, "queue/logical_block_size", 512);
	if (statvfs(real, &sv)) {
		fprintf(stderr, "nestrace-agent: statvfs %s: %s\n", real, strerror(errno));
		return -1;
	}
	g->fs_block_bytes = sv.f_bsize;
	return 0;
}

int guest__discover(const char *mount, struct guest_stack *g)
{
	char real[PATH_MAX], line[4 * PATH_MAX];
	static char src[PATH_MAX], opts[4 * PATH_MAX];
	unsigned int blk_major = 0, blk_minor = 0;
	bool found = false, mapped = false;
	FILE *mi;

	memset(g, 0, sizeof(*g));
	if (!realpath(mount, real)) {
		fprintf(stderr, "nestrace-agent: --guest %s: %s\n", mount, strerror(errno));
		return -1;
	}
	mi = fopen("/proc/self/mountinfo", "re");
	if (!mi) {
		fprintf(stderr, "nestrace-agent: /proc/self/mountinfo: %s\n", strerror(errno));
		return -1;
	}
	/* the last line of a mount point is the mount on top */
	while (fgets(line, sizeof(line), mi)) {
		char mp[PATH_MAX], fs[32], *sep = strstr(line, " - ");
		struct stat st;
		unsigned int maj, min;
		int k = 0;

		if (!sep || sscanf(line, "%*u %*u %u:%u %*s %4095s", &maj, &min, mp) != 3 ||
		    sscanf(sep + 3, "%31s %4095s %n", fs, src, &k) != 2)
			continue;
		unescape(mp);
		if (strcmp(mp, real))
			continue;
		found = true;
		/* the super options (an overlay's layers) */
		snprintf(opts, sizeof(opts), "%s", k ? sep + 3 + k : "");
		opts[strcspn(opts, "\n")] = 0;
		g->fs_major = maj;
		g->fs_minor = min;
		snprintf(g->fs, sizeof(g->fs), "%s", fs);
		/* the disk: the mount's source when that is a block device (a
		 * btrfs's major:minor is an anonymous one), else major:minor */
		unescape(src);
		if (!stat(src, &st) && S_ISBLK(st.st_mode))
			blk_major = major(st.st_rdev), blk_minor = minor(st.st_rdev);
		else
			blk_major = maj, blk_minor = min;
	}
	fclose(mi);
	if (!found) {
		fprintf(stderr, "nestrace-agent: --guest %s: not a mount point\n", real);
		return -1;
	}
	snprintf(g->mount, sizeof(g->mount), "%s", real);
	if (!strcmp(g->fs, "overlay"))
		return overlay__discover(real, opts, g);
	for (size_t i = 0; i < sizeof(mapped_fs) / sizeof(mapped_fs[0]); i++)
		mapped |= !strcmp(g->fs, mapped_fs[i]);
	if (!mapped) {
		fprintf(stderr, "nestrace-agent: --guest %s: a %s file system: the agent maps "
			"the extents of ext2/3/4, xfs and btrfs\n", real, g->fs);
		return -1;
	}
	if (!strcmp(g->fs, "btrfs") && btrfs__one_device(real, g))
		return -1;
	return disk__of(real, blk_major, blk_minor, g);
}

const char *guest__traced_at(const struct guest_stack *gs, int ng, const char *path)
{
	const struct guest_stack *g = &gs[0];	/* (all on its disk) */
	char real[PATH_MAX], sys[PATH_MAX], dev[PATH_MAX], buf[64];
	unsigned int maj, min, dmaj, dmin;
	static struct mount_of m;
	struct stat st;

	if (!realpath(path, real) || !mount__of(real, &m))
		return NULL;
	maj = m.major, min = m.minor;
	for (int i = 0; i < ng; i++)
		if (maj == gs[i].fs_major && min == gs[i].fs_minor)
			return "vfs";
	if (!stat(m.src, &st) && S_ISBLK(st.st_mode))
		maj = major(st.st_rdev), min = minor(st.st_rdev);
	snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u", maj, min);
	if (!realpath(sys, dev))
		return NULL;			/* not on a block device */
	if (!read_sysfs(dev, "partition", buf, sizeof(buf)))
		*strrchr(dev, '/') = 0;		/* the whole disk's directory */
	if (read_sysfs(dev, "dev", buf, sizeof(buf)) || sscanf(buf, "%u:%u", &dmaj, &dmin) != 2)
		return NULL;
	return dmaj == g->disk_major && dmin == g->disk_minor ? "vdisk" : NULL;
}

/* Call fn(mount point, partition, arg) once per partition of the disk
 * of gs[0..ng) other than theirs that has a file system mounted (its
 * first mount point): their requests are on the traced disk, their files
 * are not traced. */
static void untraced__each(const struct guest_stack *gs, int ng,
			   void (*fn)(const char *mp, const char *part, void *arg), void *arg)
{
	const struct guest_stack *g = &gs[0];
	char line[4 * PATH_MAX], sys[PATH_MAX], dev[PATH_MAX], buf[64], seen[16][64];
	static char src[PATH_MAX];
	int nseen = 0;
	FILE *mi;

	if (!(mi = fopen("/proc/self/mountinfo", "re")))
		return;
	while (fgets(line, sizeof(line), mi)) {
		char mp[PATH_MAX], *sep = strstr(line, " - "), *part;
		unsigned int maj, min, dmaj, dmin;
		struct stat st;
		int i;

		if (!sep || sscanf(line, "%*u %*u %u:%u %*s %4095s", &maj, &min, mp) != 3 ||
		    sscanf(sep + 3, "%*s %4095s", src) != 1)
			continue;
		unescape(mp);
		unescape(src);
		if (!stat(src, &st) && S_ISBLK(st.st_mode))
			maj = major(st.st_rdev), min = minor(st.st_rdev);
		snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u", maj, min);
		if (!realpath(sys, dev) || read_sysfs(dev, "partition", buf, sizeof(buf)))
			continue;		/* not a partition */
		part = strrchr(dev, '/') + 1;
		for (i = 0; i < ng && strcmp(part, gs[i].part_name); i++)
			;
		if (i < ng)
			continue;		/* a traced one */
		for (i = 0; i < nseen && strcmp(seen[i], part); i++)
			;
		if (i < nseen)
			continue;
		*(part - 1) = 0;		/* the whole disk's directory */
		if (read_sysfs(dev, "dev", buf, sizeof(buf)) ||
		    sscanf(buf, "%u:%u", &dmaj, &dmin) != 2 ||
		    dmaj != g->disk_major || dmin != g->disk_minor)
			continue;
		if (nseen < 16)
			snprintf(seen[nseen++], sizeof(seen[0]), "%s", part);
		fn(mp, part, arg);
	}
	fclose(mi);
}

static void untraced__warn(const char *mp, const char *part, void *arg)
{
	const struct guest_stack *g = arg;

	fprintf(stderr, "nestrace-agent: warning: the virtual disk %s also holds %s (%s), not "
		"traced: its requests are traced, unattributed (links kind 'other', or "
		"'metadata', 'readahead' by their flags); give --guest for it too to "
		"trace it as well\n", g->disk_name, mp, part);
}

void guest__warn_untraced(const struct guest_stack *gs, int n)
{
	untraced__each(gs, n, untraced__warn, (void *)gs);
}

struct untraced_json {
	FILE *f;
	int n;
};

static void untraced__json(const char *mp, const char *part, void *arg)
{
	struct untraced_json *j = arg;

	fprintf(j->f, j->n++ ? ",[" : "[");
	guest__json_str(j->f, mp);
	fputc(',', j->f);
	guest__json_str(j->f, part);
	fputc(']', j->f);
}

void guest__json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = *s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* One file system's own fields, the members after "{" */
static void stack__fs_json(FILE *f, const struct guest_stack *g)
{
	fprintf(f, "\"mount\":");
	guest__json_str(f, g->mount);
	fprintf(f, ",\"fs\":");
	guest__json_str(f, g->fs);
	fprintf(f, ",\"fs_major\":%u,\"fs_minor\":%u,\"part_name\":", g->fs_major, g->fs_minor);
	guest__json_str(f, g->part_name);
	fprintf(f, ",\"part_start_bytes\":%llu,\"part_size_bytes\":%llu,\"fs_block_bytes\":%u,"
		"\"btrfs_devid\":%llu,\"base_major\":%u,\"base_minor\":%u", g->part_start_bytes,
		g->part_size_bytes, g->fs_block_bytes, g->btrfs_devid, g->base_major, g->base_minor);
}

void guest__stack_json(FILE *f, const struct guest_stack *gs, int n)
{
	const struct guest_stack *g = &gs[0];
	struct untraced_json j = { f, 0 };

	fputc('{', f);
	stack__fs_json(f, g);
	fprintf(f, ",\"disk_major\":%u,\"disk_minor\":%u,\"disk_name\":",
		g->disk_major, g->disk_minor);
	guest__json_str(f, g->disk_name);
	fprintf(f, ",\"size_sectors\":%llu,\"logical_block_bytes\":%u,\"untraced_mounts\":[",
		g->size_sectors, g->logical_block_bytes);
	untraced__each(gs, n, untraced__json, &j);
	fputc(']', f);
	if (n > 1) {
		fprintf(f, ",\"more_guests\":[");
		for (int i = 1; i < n; i++) {
			fprintf(f, "%s{", i > 1 ? "," : "");
			stack__fs_json(f, &gs[i]);
			fputc('}', f);
		}
		fputc(']', f);
	}
	fputc('}', f);
}

/* ---- extent snapshots ------------------------------------------------- */

#define FIEMAP_BATCH 512

static struct {
	FILE *f;
	const char *phase;
	bool (*want)(__u64 ino);
	int nfiles;
	int index;		/* the file system's --guest index ("fs" above 0) */
	bool failed;
	bool truncated;		/* the start snapshot stopped at GUEST_MAX_FILES */
	bool btrfs;		/* a compressed extent's length is in its extent item */
	struct fiemap *fm;
} snap;

/* A btrfs file's compressed extents as `,"compressed":[[file offset,
 * bytes, disk_bytenr, disk_num_bytes], ...]`: FIEMAP gives a compressed
 * extent's logical length and where its compressed data starts, not how
 * long that is (its EXTENT_DATA item does; `record` reads the same). */
static void snapshot__compressed(int fd, __u64 ino)
{
	struct btrfs_ioctl_search_args args;
	struct btrfs_ioctl_search_key *sk = &args.key;
	bool first = true;

	memset(&args, 0, sizeof(args));
	sk->tree_id = 0;	/* the file's own subvolume */
	sk->min_objectid = sk->max_objectid = ino;
	sk->min_type = sk->max_type = BTRFS_EXTENT_DATA_KEY;
	sk->max_offset = sk->max_transid = ~0ULL;
	fprintf(snap.f, ",\"compressed\":[");
	for (;;) {
		size_t off = 0;
		__u32 n;

		sk->nr_items = 4096;
		if (ioctl(fd, BTRFS_IOC_TREE_SEARCH, &args) || !(n = sk->nr_items))
			break;
		for (__u32 i = 0; i < n; i++) {
			struct btrfs_ioctl_search_header sh;
			struct btrfs_file_extent_item x;

			memcpy(&sh, args.buf + off, sizeof(sh));
			if (sh.objectid == ino && sh.type == BTRFS_EXTENT_DATA_KEY &&
			    sh.len >= sizeof(x)) {
				memcpy(&x, args.buf + off + sizeof(sh), sizeof(x));
				if (x.type == BTRFS_FILE_EXTENT_REG && x.compression && x.disk_bytenr) {
					fprintf(snap.f, "%s[%llu,%llu,%llu,%llu]", first ? "" : ",",
						(unsigned long long)sh.offset,
						(unsigned long long)le64toh(x.num_bytes),
						(unsigned long long)le64toh(x.disk_bytenr),
						(unsigned long long)le64toh(x.disk_num_bytes));
					first = false;
				}
			}
			off += sizeof(sh) + sh.len;
			sk->min_offset = sh.offset + 1;
		}
		if (sk->min_offset == 0)	/* wrapped past the last key */
			break;
	}
	fprintf(snap.f, "]");
}

/* A directory opened to be read without touching its access time
 * (O_NOATIME; without it where refused): reading a directory whose atime
 * is older than its mtime, or a day old, updates it (relatime), and the
 * guest FS's journal commits that inside the capture. */
static int dir__open(const char *dir)
{
	int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
	int fd = open(dir, flags | O_NOATIME);

	if (fd < 0 && errno == EPERM)
		fd = open(dir, flags);
	return fd;
}

/* One file's extents as a JSON line (the file `name` in the directory
 * open as dfd, at `path`); false if it could not be read (gone). */
static bool snapshot__file(int dfd, const char *name, const char *path, __u64 ino)
{
	struct fiemap *fm = snap.fm;
	__u64 start = 0;
	bool first = true, last = false, encoded = false;
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

	if (fd < 0)
		return false;
	fprintf(snap.f, "{\"phase\":\"%s\",", snap.phase);
	if (snap.index)
		fprintf(snap.f, "\"fs\":%d,", snap.index);
	fprintf(snap.f, "\"ino\":%llu,\"path\":", (unsigned long long)ino);
	guest__json_str(snap.f, path);
	fprintf(snap.f, ",\"extents\":[");
	while (!last) {
		memset(fm, 0, sizeof(*fm));
		fm->fm_start = start;
		fm->fm_length = ~0ULL - start;
		fm->fm_flags = 0;	/* no FIEMAP_FLAG_SYNC: delayed allocations show as such */
		fm->fm_extent_count = FIEMAP_BATCH;
		if (ioctl(fd, FS_IOC_FIEMAP, fm) || fm->fm_mapped_extents == 0)
			break;
		for (__u32 i = 0; i < fm->fm_mapped_extents; i++) {
			struct fiemap_extent *e = &fm->fm_extents[i];

			fprintf(snap.f, "%s[%llu,%llu,%llu,%u]", first ? "" : ",",
				(unsigned long long)e->fe_logical, (unsigned long long)e->fe_physical,
				(unsigned long long)e->fe_length, e->fe_flags);
			first = false;
			last = e->fe_flags & FIEMAP_EXTENT_LAST;
			encoded |= e->fe_flags & FIEMAP_EXTENT_ENCODED;
			start = e->fe_logical + e->fe_length;
		}
	}
	fprintf(snap.f, "]");
	if (encoded && snap.btrfs)
		snapshot__compressed(fd, ino);
	close(fd);
	fprintf(snap.f, "}\n");
	return true;
}

static char *path__join(const char *dir, const char *name);

/* false: stop the walk */
static bool snapshot__visit(int dfd, const char *dir, const char *name, __u64 ino)
{
	char *path;

	if (snap.want && !snap.want(ino))
		return true;
	if (!snap.want && snap.nfiles >= GUEST_MAX_FILES) {	/* one more file: stop */
		snap.truncated = true;
		return false;
	}
	if (!(path = path__join(dir, name))) {
		snap.failed = true;
		return false;
	}
	if (snapshot__file(dfd, name, path, ino))
		snap.nfiles++;
	free(path);
	if (ferror(snap.f)) {
		snap.failed = true;
		return false;
	}
	return true;
}

/* The directories still to read, as paths (malloc'ed). */
static struct {
	char **v;
	size_t n, cap;
	char buf[64 << 10] __attribute__((aligned(8)));	/* getdents64's */
} todo;

static int todo__push(char *path)
{
	if (todo.n == todo.cap) {
		size_t cap = todo.cap ? todo.cap * 2 : 256;
		char **v = realloc(todo.v, cap * sizeof(*v));

		if (!v)
			return -1;
		todo.v = v;
		todo.cap = cap;
	}
	todo.v[todo.n++] = path;
	return 0;
}

static char *path__join(const char *dir, const char *name)
{
	size_t n = strlen(dir);
	char *p = malloc(n + strlen(name) + 2);

	if (p)
		sprintf(p, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
	return p;
}

/* Each regular file of the file system mounted at top, to visit(dir fd,
 * dir path, name, inode) until it returns false; -1 if out of memory.  This
 * file system only: not the ones mounted on it (a root file system's
 * /proc, /sys, ...) nor a btrfs subvolume (a device of its own), and no
 * lost+found.  Depth first, a directory's files before its
 * subdirectories, in directory order.  Only directories are stat'ed: a file's type and
 * inode come from its directory entry (d_ino is st_ino on ext2/3/4, xfs,
 * btrfs and an overlay on one file system): about half the system time
 * of nftw, which stats every file. */
static int files__walk(const char *top,
		       bool (*visit)(int, const char *, const char *, __u64))
{
	struct stat st;
	bool go = true;
	char *first;
	dev_t dev;
	int err = 0;

	if (stat(top, &st))
		return 0;	/* gone: no files */
	if (!(first = strdup(top)))
		return -1;
	dev = st.st_dev;
	todo.n = 0;
	if (todo__push(first)) {
		free(first);
		return -1;
	}
	while (todo.n) {
		char *dir = todo.v[--todo.n];
		size_t below = todo.n;	/* its subdirectories go above this */
		int dfd = dir__open(dir);
		ssize_t len = 0, off = 0;

		if (dfd < 0) {		/* removed or unreadable while we looked */
			free(dir);
			continue;
		}
		while (go && !err) {
			struct dirent64 *e;
			unsigned char type;
			char *path;

			if (off >= len) {
				len = getdents64(dfd, todo.buf, sizeof(todo.buf));
				off = 0;
				if (len <= 0)
					break;
			}
			e = (struct dirent64 *)(todo.buf + off);
			off += e->d_reclen;
			type = e->d_type;
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			if (type == DT_UNKNOWN) {
				if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT))
					continue;
				type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
			}
			if (type == DT_DIR) {
				if (!strcmp(e->d_name, "lost+found") ||
				    fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT) ||
				    st.st_dev != dev)
					continue;
				if (!(path = path__join(dir, e->d_name)) || todo__push(path)) {
					free(path);
					err = -1;
				}
				continue;
			}
			if (type == DT_REG)
				go = visit(dfd, dir, e->d_name, e->d_ino);
		}
		close(dfd);
		free(dir);
		/* depth first, in directory order: the first subdirectory on top */
		for (size_t i = below, j = todo.n; j > i + 1; i++, j--) {
			char *t = todo.v[i];

			todo.v[i] = todo.v[j - 1];
			todo.v[j - 1] = t;
		}
		if (!go || err)
			break;
	}
	while (todo.n)
		free(todo.v[--todo.n]);
	return err;
}

int guest__snapshot(const struct guest_stack *g, const char *phase, FILE *f,
		    bool (*want)(__u64 ino))
{
	int fd = open(g->mount, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	/* what is written but not yet allocated has no address yet */
	if (fd >= 0) {
		syncfs(fd);
		close(fd);
	}
	if (g->btrfs_devid && btrfs__chunks(g->mount, phase, g->index, f)) {
		fprintf(stderr, "nestrace-agent: %s: btrfs chunk tree: %s\n", g->mount,
			strerror(errno));
		return -1;
	}
	snap.f = f;
	snap.phase = phase;
	snap.want = want;
	snap.nfiles = 0;
	snap.index = g->index;
	snap.failed = false;
	snap.truncated = false;
	snap.btrfs = g->btrfs_devid != 0;
	snap.fm = calloc(1, sizeof(struct fiemap) + FIEMAP_BATCH * sizeof(struct fiemap_extent));
	if (!snap.fm)
		return -1;
	if (files__walk(g->mount, snapshot__visit)) {
		fprintf(stderr, "nestrace-agent: %s: the %s snapshot: out of memory\n", g->mount, phase);
		snap.failed = true;
	}
	free(snap.fm);
	if (fflush(f) || snap.failed)
		return -1;
	if (snap.truncated)
		fprintf(stderr, "nestrace-agent: warning: %s has more than %d regular files: the %s "
			"snapshot has the first %d found (a file past them read or written before "
			"a rewrite moved it is mapped where the end snapshot has it)\n",
			g->mount, GUEST_MAX_FILES, phase, GUEST_MAX_FILES);
	return snap.nfiles;
}

bool guest__snapshot_truncated(void)
{
	return snap.truncated;
}

/* ---- the inodes a capture touched -------------------------------------- */

static struct {
	__u64 *slots;		/* open addressing; ino + 1, 0 = empty */
	size_t cap, n;
	bool all;		/* out of memory: take every file */
} touched;

static void touched__put(__u64 key)
{
	size_t i = (key * 0x9E3779B97F4A7C15ULL) & (touched.cap - 1);

	while (touched.slots[i] && touched.slots[i] != key)
		i = (i + 1) & (touched.cap - 1);
	if (!touched.slots[i]) {
		touched.slots[i] = key;
		touched.n++;
	}
}

void touched__add(__u64 ino)
{
	if (touched.all)
		return;
	if (touched.n * 2 >= touched.cap) {
		__u64 *old = touched.slots;
		size_t ocap = touched.cap;
		__u64 *grown = calloc(ocap ? ocap * 2 : 1024, sizeof(__u64));

		if (!grown) {
			touched.all = true;
			return;
		}
		touched.slots = grown;
		touched.cap = ocap ? ocap * 2 : 1024;
		touched.n = 0;
		for (size_t i = 0; i < ocap; i++)
			if (old[i])
				touched__put(old[i]);
		free(old);
	}
	touched__put(ino + 1);
}

bool touched__has(__u64 ino)
{
	size_t i;

	if (touched.all)
		return true;
	if (!touched.cap)
		return false;
	for (i = ((ino + 1) * 0x9E3779B97F4A7C15ULL) & (touched.cap - 1); touched.slots[i];
	     i = (i + 1) & (touched.cap - 1))
		if (touched.slots[i] == ino + 1)
			return true;
	return false;
}

/* ---- where the journal is ---------------------------------------------- */

/* Without dumpe2fs, debugfs or xfs_db (a bare guest has none): read from
 * the file system's own device.  ext3/ext4: the superblock's journal
 * inode, its inode from the inode table, its blocks (extent tree, or
 * direct and indirect blocks; the indirect blocks themselves left out).
 * xfs: the superblock's internal log. */

#define JNL_MAX_RUNS 4096
#define JNL_MAX_DEPTH 5

static struct {
	int fd;
	__u64 bs, nblocks;
	__u64 runs[JNL_MAX_RUNS][3];	/* logical bytes, physical bytes, bytes */
	int n;
	char err[200];
} jnl;

static __u16 le16_at(const unsigned char *p) { return p[0] | p[1] << 8; }
static __u32 le32_at(const unsigned char *p) { return le16_at(p) | (__u32)le16_at(p + 2) << 16; }
static __u32 be32_at(const unsigned char *p)
{
	return (__u32)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3];
}
static __u64 be64_at(const unsigned char *p) { return (__u64)be32_at(p) << 32 | be32_at(p + 4); }

static int jnl__fail(const char *fmt, unsigned long long a)
{
	snprintf(jnl.err, sizeof(jnl.err), fmt, a);
	return -1;
}

static int jnl__read(__u64 off, void *buf, size_t len)
{
	ssize_t n = pread(jnl.fd, buf, len, off);

	if (n < 0) {
		snprintf(jnl.err, sizeof(jnl.err), "cannot read at offset %llu: %s",
			 (unsigned long long)off, strerror(errno));
		return -1;
	}
	if ((size_t)n != len)
		return jnl__fail("short read at offset %llu", off);
	return 0;
}

/* one block, or a run; joined to the run before when both follow on */
static int jnl__add(__u64 lblk, __u64 pblk, __u64 nblk)
{
	__u64 lo = lblk * jnl.bs, ph = pblk * jnl.bs, len = nblk * jnl.bs;

	if (jnl.n && jnl.runs[jnl.n - 1][0] + jnl.runs[jnl.n - 1][2] == lo &&
	    jnl.runs[jnl.n - 1][1] + jnl.runs[jnl.n - 1][2] == ph) {
		jnl.runs[jnl.n - 1][2] += len;
		return 0;
	}
	if (jnl.n == JNL_MAX_RUNS)
		return jnl__fail("over %llu runs of blocks", JNL_MAX_RUNS);
	jnl.runs[jnl.n][0] = lo;
	jnl.runs[jnl.n][1] = ph;
	jnl.runs[jnl.n][2] = len;
	jnl.n++;
	return 0;
}

/* an extent tree node (the inode's i_block, or a block of the tree) */
static int jnl__extents(const unsigned char *node, size_t len, int depth_left)
{
	__u16 entries = le16_at(node + 2), depth = le16_at(node + 6);
	unsigned char *blk = NULL;
	int rc = 0;

	if (le16_at(node) != 0xF30A)
		return jnl__fail("the journal inode's extent tree: no extent header (depth %llu left)",
				 depth_left);
	/* the root may be at most 5 deep, and each child one less than its parent */
	if (depth > depth_left)
		return jnl__fail("the journal inode's extent tree: a node claims depth %llu, more than its place allows",
				 depth);
	if (12 + 12 * (size_t)entries > len)
		return jnl__fail("the journal inode's extent tree: a node of %llu entries too many",
				 entries);
	if (depth > 0) {	/* one buffer for this node's children, read in turn */
		blk = malloc(jnl.bs);
		if (!blk)
			return jnl__fail("out of memory (%llu bytes)", jnl.bs);
	}
	for (__u16 i = 0; i < entries && !rc; i++) {
		const unsigned char *e = node + 12 + 12 * i;

		if (depth == 0) {
			__u32 elen = le16_at(e + 4);

			if (elen > 32768)	/* unwritten */
				elen -= 32768;
			rc = jnl__add(le32_at(e), (__u64)le16_at(e + 6) << 32 | le32_at(e + 8), elen);
			continue;
		}
		rc = jnl__read(((__u64)le16_at(e + 8) << 32 | le32_at(e + 4)) * jnl.bs, blk, jnl.bs) ||
		     jnl__extents(blk, jnl.bs, depth - 1);
	}
	free(blk);
	return rc;
}

/* an indirect block `level` levels above the data blocks; *lblk counts the
 * logical blocks passed, holes included */
static int jnl__indirect(__u32 pblk, int level, __u64 *lblk)
{
	__u64 per = jnl.bs / 4, span = 1;
	unsigned char *blk;
	int rc = 0;

	for (int i = 1; i < level; i++)
		span *= per;
	if (!pblk) {
		*lblk += span * per;
		return 0;
	}
	blk = malloc(jnl.bs);
	if (!blk)
		return jnl__fail("out of memory (%llu bytes)", jnl.bs);
	if (jnl__read((__u64)pblk * jnl.bs, blk, jnl.bs)) {
		free(blk);
		return -1;
	}
	for (__u64 i = 0; i < per && *lblk < jnl.nblocks && !rc; i++) {
		__u32 p = le32_at(blk + 4 * i);

		if (level > 1) {
			rc = jnl__indirect(p, level - 1, lblk);
		} else {
			if (p)
				rc = jnl__add(*lblk, p, 1);
			(*lblk)++;
		}
	}
	free(blk);
	return rc;
}

/* ext3/ext4: 0 and *ino 0 when there is no internal journal */
static int jnl__ext(__u64 *ino)
{
	unsigned char sb[1024], gd[64], in[128];
	__u32 ipg, isz = 128, desc = 32, group, idx;
	__u64 itab, size, lblk = 0;

	if (jnl__read(1024, sb, sizeof(sb)))
		return -1;
	if (le16_at(sb + 0x38) != 0xEF53)
		return jnl__fail("no ext2/3/4 superblock at offset %llu", 1024);
	*ino = 0;
	if (!(le32_at(sb + 0x5C) & 0x4))	/* has_journal */
		return 0;
	*ino = le32_at(sb + 0xE0);
	if (!*ino)				/* an external journal */
		return 0;
	if (le32_at(sb + 0x18) > 6)
		return jnl__fail("a block size of 1024 << %llu", le32_at(sb + 0x18));
	jnl.bs = 1024ULL << le32_at(sb + 0x18);
	ipg = le32_at(sb + 0x28);
	if (le32_at(sb + 0x4C))			/* dynamic revision */
		isz = le16_at(sb + 0x58);
	if (le32_at(sb + 0x60) & 0x80)		/* 64bit */
		desc = le16_at(sb + 0xFE);
	if (!ipg || isz < 128 || desc < 32 || desc > sizeof(gd))
		return jnl__fail("a superblock of %llu inodes per group and odd sizes", ipg);
	group = (*ino - 1) / ipg;
	idx = (*ino - 1) % ipg;
	if (jnl__read((le32_at(sb + 0x14) + 1) * jnl.bs + (__u64)group * desc, gd, desc))
		return -1;
	itab = le32_at(gd + 8) | (desc >= 64 ? (__u64)le32_at(gd + 0x28) << 32 : 0);
	if (jnl__read(itab * jnl.bs + (__u64)idx * isz, in, sizeof(in)))
		return -1;
	size = le32_at(in + 4) | (__u64)le32_at(in + 0x6C) << 32;
	jnl.nblocks = (size + jnl.bs - 1) / jnl.bs;
	if (le32_at(in + 0x20) & 0x80000)	/* EXT4_EXTENTS_FL */
		return jnl__extents(in + 0x28, 60, JNL_MAX_DEPTH);
	for (int i = 0; i < 12 && lblk < jnl.nblocks; i++, lblk++)
		if (le32_at(in + 0x28 + 4 * i) && jnl__add(lblk, le32_at(in + 0x28 + 4 * i), 1))
			return -1;
	for (int level = 1; level <= 3 && lblk < jnl.nblocks; level++)
		if (jnl__indirect(le32_at(in + 0x28 + 4 * (11 + level)), level, &lblk))
			return -1;
	return 0;
}

/* xfs: the internal log (none when it is external) */
static int jnl__xfs(void)
{
	unsigned char sb[512];
	__u64 logstart, agno, agbno;
	__u8 agblklog;

	if (jnl__read(0, sb, sizeof(sb)))
		return -1;
	if (memcmp(sb, "XFSB", 4))
		return jnl__fail("no xfs superblock at offset %llu", 0);
	jnl.bs = be32_at(sb + 4);
	logstart = be64_at(sb + 48);
	agblklog = sb[124];
	if (!logstart)
		return 0;
	if (agblklog > 31)
		return jnl__fail("an agblklog of %llu", agblklog);
	agno = logstart >> agblklog;
	agbno = logstart & ((1ULL << agblklog) - 1);
	return jnl__add(0, agno * be32_at(sb + 84) + agbno, be32_at(sb + 96));
}

int guest__journal(const struct guest_stack *g, FILE *f)
{
	char dev[80];
	__u64 ino = 0;
	int rc;

	if (strcmp(g->fs, "ext3") && strcmp(g->fs, "ext4") && strcmp(g->fs, "xfs"))
		return 0;
	memset(&jnl, 0, sizeof(jnl));
	snprintf(dev, sizeof(dev), "/dev/%s", g->part_name[0] ? g->part_name : g->disk_name);
	jnl.fd = open(dev, O_RDONLY | O_CLOEXEC);
	if (jnl.fd < 0) {
		snprintf(jnl.err, sizeof(jnl.err), "cannot open it: %s", strerror(errno));
		rc = -1;
	} else {
		rc = strcmp(g->fs, "xfs") ? jnl__ext(&ino) : jnl__xfs();
		close(jnl.fd);
	}
	fprintf(f, "{\"phase\":\"start\",");
	if (g->index)
		fprintf(f, "\"fs\":%d,", g->index);
	fprintf(f, "\"journal_dev\":");
	guest__json_str(f, dev);
	if (rc) {
		fprintf(f, ",\"journal_error\":");
		guest__json_str(f, jnl.err);
		fprintf(f, "}\n");
	} else {
		fprintf(f, ",\"journal\":{\"ino\":%llu,\"extents\":[", (unsigned long long)ino);
		for (int i = 0; i < jnl.n; i++)
			fprintf(f, "%s[%llu,%llu,%llu]", i ? "," : "", jnl.runs[i][0],
				jnl.runs[i][1], jnl.runs[i][2]);
		fprintf(f, "]}}\n");
	}
	return fflush(f) ? -1 : 0;
}
