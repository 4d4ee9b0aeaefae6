/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The guest side of a capture (--guest MOUNT): find the file system's
 * disk, snapshot its files' extents, find its journal; for a guest
 * capture without Python (--guest-capture DIR), what `nestrace import DIR`
 * needs to make a store of it, and for `nestrace record` (--facts) the
 * same on stdout.  --guest again traces another file system on a
 * partition of the same disk (a VM's / and /home). */
#ifndef __NESTRACE_GUEST_H
#define __NESTRACE_GUEST_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <linux/types.h>

#define GUEST_FORMAT "nestrace-guest-capture"
#define GUEST_FORMAT_VERSION 1
/* files the start snapshot takes at most, the first found (as `nestrace
 * record`: which files a capture will touch is not known yet, and FIEMAP
 * takes ~0.1 ms a file); the end snapshot takes every file touched */
#define GUEST_MAX_FILES 4096
/* guest file systems one capture traces at most (--guest given again) */
#define GUEST_MAX 8

struct guest_stack {
	char mount[PATH_MAX];
	char fs[32];
	unsigned int fs_major, fs_minor;	/* the file system's device */
	unsigned int disk_major, disk_minor;	/* its whole disk */
	char disk_name[64];
	char part_name[64];			/* "" unless on a partition */
	unsigned long long size_sectors;
	unsigned long long part_start_bytes;
	unsigned long long part_size_bytes;	/* 0: the file system is on the whole disk */
	unsigned int logical_block_bytes;
	unsigned int fs_block_bytes;
	unsigned long long btrfs_devid;		/* btrfs: its one device's id */
	/* an overlay (a container's root; fs "overlay"): the file system its
	 * layers are on, whose files hold its files' bytes (its disk fields
	 * are that one's); 0:0 for any other */
	unsigned int base_major, base_minor;
	char base_mount[PATH_MAX];
	bool implied;				/* an overlay's base no --guest named */
	int index;				/* which --guest: 0 the first; its
						 * lines of extents.jsonl say "fs":index
						 * when above 0 */
};

/* Fill g from the mount point; on error print one line and return -1.
 * An overlay whose layers are on one ext2/3/4 or xfs file system is
 * taken, with base_* naming that one (to be traced too). */
int guest__discover(const char *mount, struct guest_stack *g);
/* Append one JSON line per regular file of the file system (those whose
 * inode `want` accepts, if given) with its FIEMAP extents; returns the
 * number of files, -1 on a write error. */
int guest__snapshot(const struct guest_stack *g, const char *phase, FILE *f,
		    bool (*want)(__u64 ino));
/* whether the last snapshot stopped at GUEST_MAX_FILES with files left */
bool guest__snapshot_truncated(void);
/* One JSON line: where the file system's journal is on its own device
 * (ext3/ext4 journal inode, xfs internal log), or why that is unknown;
 * nothing for ext2 and btrfs.  -1 on a write error. */
int guest__journal(const struct guest_stack *g, FILE *f);
/* The highest level of the stack gs[0..n) (file systems of one disk)
 * that sees writes to `path` (the capture directory): "vfs" on one of the
 * file systems, "vdisk" on another file system of their disk, NULL when
 * neither. */
const char *guest__traced_at(const struct guest_stack *gs, int n, const char *path);
/* Warn (stderr) about each other file system mounted from a partition of
 * the disk of gs[0..n): its requests are on the traced disk, its files
 * untraced. */
void guest__warn_untraced(const struct guest_stack *gs, int n);
/* The stack as the JSON object `nestrace import` reads: the first file
 * system's fields, those mounts ("untraced_mounts": [[mount point,
 * partition], ...]), and with more than one the others' own fields
 * ("more_guests": [{...}, ...]). */
void guest__stack_json(FILE *f, const struct guest_stack *gs, int n);
/* s as a JSON string (quoted, escaped). */
void guest__json_str(FILE *f, const char *s);

/* The set of inodes the capture touched (vfs and page-cache records). */
void touched__add(__u64 ino);
bool touched__has(__u64 ino);

#endif /* __NESTRACE_GUEST_H */
