// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* nestrace-agent's output: records batched per kind, each batch written
 * as a frame of the record stream (stdout or -o FILE) and, with
 * --arrow-dir, as a RecordBatch of its table's Arrow IPC stream. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <linux/types.h>

#include "nestrace_records.h"
#include "nestrace_arrow.h"
#include "output.h"

const __u32 rec_sizes[MAX_KIND] = {
	[NT_KIND_VFS_EVENT] = sizeof(struct nt_vfs_event),
	[NT_KIND_BLOCK_EVENT] = sizeof(struct nt_block_event),
	[NT_KIND_HOSTFS_EVENT] = sizeof(struct nt_hostfs_event),
	[NT_KIND_PAGECACHE_EVENT] = sizeof(struct nt_pagecache_event),
	[NT_KIND_MAPPING_EVENT] = sizeof(struct nt_mapping_event),
	[NT_KIND_NETFS_EVENT] = sizeof(struct nt_netfs_event),
	[NT_KIND_CPU_STATS] = sizeof(struct nt_cpu_stats),
	[NT_KIND_BLOCK_REQUEST] = sizeof(struct nt_block_request),
};
static const __u16 rec_versions[MAX_KIND] = {
	[NT_KIND_VFS_EVENT] = NT_VERSION_VFS_EVENT,
	[NT_KIND_BLOCK_EVENT] = NT_VERSION_BLOCK_EVENT,
	[NT_KIND_HOSTFS_EVENT] = NT_VERSION_HOSTFS_EVENT,
	[NT_KIND_PAGECACHE_EVENT] = NT_VERSION_PAGECACHE_EVENT,
	[NT_KIND_MAPPING_EVENT] = NT_VERSION_MAPPING_EVENT,
	[NT_KIND_NETFS_EVENT] = NT_VERSION_NETFS_EVENT,
	[NT_KIND_CPU_STATS] = NT_VERSION_CPU_STATS,
	[NT_KIND_BLOCK_REQUEST] = NT_VERSION_BLOCK_REQUEST,
};

struct out out;
static const char *arrow_dir;	/* records as Arrow IPC streams here, or NULL */
static bool also_frames;	/* ... and in the frame stream too (--tee) */

static void out__write(const void *p, size_t n)
{
	const char *c = p;

	while (n && !out.broken) {
		ssize_t w = write(out.fd, c, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			out.broken = true;	/* reader went away */
			exit_reason = "output closed";
			exiting = 1;
			return;
		}
		c += w;
		n -= w;
	}
}

static void out__frame(__u16 kind, __u16 version, __u32 rec_size, __u32 count,
		       const void *payload, size_t len)
{
	struct nt_frame f = {
		.magic = NT_STREAM_MAGIC, .kind = kind, .version = version,
		.rec_size = rec_size, .count = count,
	};

	out__write(&f, sizeof(f));
	out__write(payload, len);
}

/* ---- output: Arrow IPC streams (--arrow-dir) --------------------------
 * One stream per record table, in the layout schemas/ generates
 * (nestrace_arrow.h): the Schema message when the first batch comes, then
 * a RecordBatch message per flush, written with one writev, so a reader
 * of a killed agent's file finds whole batches and at most a torn tail.
 * Columns are the records' fields transposed; comm becomes Utf8. */

_Static_assert(NT_ARROW_MAX_KIND <= MAX_KIND, "MAX_KIND");

static struct arrow_out {
	int fd[MAX_KIND];
	bool failed[MAX_KIND];		/* a write failed: stop, say so at the end */
	char *body;
	unsigned char meta[4096];
} arrow;

#define ARROW_BODY_BYTES (2 * BATCH_BYTES + 4096)
#define PAD8(n) (((n) + 7) & ~(size_t)7)

/* Say which file failed and stop tracing; the end frame gives the reason. */
static bool arrow__fail(int kind, const char *what)
{
	fprintf(stderr, "nestrace-agent: cannot %s %s/%s.arrows: %s\n", what,
		arrow_dir, nt_arrow_tables[kind].table, strerror(errno));
	arrow.failed[kind] = true;
	exit_reason = "arrow output failed";
	exiting = 1;
	return false;
}

static bool arrow__write(int kind, struct iovec *iov, int n)
{
	while (n) {
		ssize_t w = writev(arrow.fd[kind], iov, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return arrow__fail(kind, "write");
		}
		while (n && (size_t)w >= iov->iov_len) {
			w -= iov->iov_len;
			iov++, n--;
		}
		if (n) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= w;
		}
	}
	return true;
}

static bool arrow__open(int kind)
{
	const struct nt_arrow_table *t = &nt_arrow_tables[kind];
	struct iovec iov = { (void *)t->schema, t->schema_len };
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s.arrows", arrow_dir, t->table);
	arrow.fd[kind] = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (arrow.fd[kind] < 0) {
		return arrow__fail(kind, "create");
	}
	return arrow__write(kind, &iov, 1);
}

static void put64(unsigned char *p, __s64 v)
{
	memcpy(p, &v, 8);
}

/* Kernel task names are bytes: keep well-formed UTF-8 (RFC 3629: no
 * overlong forms, surrogates or code points past U+10FFFF) and turn every
 * other byte into '?', as the Python decoder does (stream.py). */
static void utf8__fix(unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned char c = s[i], lo = 0x80, hi = 0xbf;
		size_t len = 0;

		if (c < 0x80)
			len = 1;
		else if (c >= 0xc2 && c <= 0xdf)
			len = 2;
		else if (c >= 0xe0 && c <= 0xef)
			len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
		else if (c >= 0xf0 && c <= 0xf4)
			len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
		bool ok = len && i + len <= n;

		for (size_t k = 1; ok && k < len; k++)
			ok = s[i + k] >= (k == 1 ? lo : 0x80) && s[i + k] <= (k == 1 ? hi : 0xbf);
		if (!ok) {
			s[i++] = '?';
			continue;
		}
		i += len;
	}
}

/* Copy rows [i, end) of one column out of the records into its buffer. */
static void arrow__copy(const struct nt_arrow_col *col, const char *recs, size_t rs,
			char *dst, const __s32 *offs, __u32 i, __u32 end)
{
	const char *src = recs + (size_t)i * rs + col->offset;

	if (col->is_string) {
		unsigned char *d = (unsigned char *)dst;

		for (; i < end; i++, src += rs) {
			size_t l = offs[i + 1] - offs[i];

			memcpy(d + offs[i], src, l);
			for (size_t k = 0; k < l; k++)
				if (d[offs[i] + k] & 0x80) {
					utf8__fix(d + offs[i], l);
					break;
				}
		}
		return;
	}
	switch (col->width) {
	case 8: for (__u64 *o = (__u64 *)dst; i < end; i++, src += rs) o[i] = *(const __u64 *)src;
		break;
	case 4: for (__u32 *o = (__u32 *)dst; i < end; i++, src += rs) o[i] = *(const __u32 *)src;
		break;
	case 2: for (__u16 *o = (__u16 *)dst; i < end; i++, src += rs) o[i] = *(const __u16 *)src;
		break;
	default: for (; i < end; i++, src += rs)
			memcpy(dst + (size_t)i * col->width, src, col->width);
	}
}

#define ARROW_MAX_COLS 32
#define ARROW_BLOCK 128		/* rows per pass: the block's records stay in L1 */

static void arrow__batch(int kind, const char *recs, __u32 n)
{
	const struct nt_arrow_table *t = &nt_arrow_tables[kind];
	unsigned char *meta = arrow.meta;
	unsigned char *bufs = meta + t->buffers_pos;
	char *body = arrow.body, *dst[ARROW_MAX_COLS];
	const __s32 *offs[ARROW_MAX_COLS];
	size_t pos = 0, rs = t->rec_size, len;
	unsigned b = 0;

	if (arrow.failed[kind] || (arrow.fd[kind] < 0 && !arrow__open(kind)))
		return;
	memcpy(meta, t->batch, t->batch_len);
	/* lay the buffers out; string offsets first, they size the data */
	for (unsigned c = 0; c < t->ncols; c++) {
		const struct nt_arrow_col *col = &t->cols[c];

		put64(meta + t->nodes_pos + 16 * c, n);		/* null_count stays 0 */
		put64(bufs + 16 * b, pos), put64(bufs + 16 * b + 8, 0), b++;	/* no validity */
		offs[c] = NULL;
		if (col->is_string) {
			__s32 *o = (__s32 *)(body + pos), total = 0;
			const char *src = recs + col->offset;

			o[0] = 0;
			for (__u32 i = 0; i < n; i++, src += rs)
				o[i + 1] = total += strnlen(src, col->width);
			len = 4 * ((size_t)n + 1);
			memset(body + pos + len, 0, PAD8(len) - len);
			put64(bufs + 16 * b, pos), put64(bufs + 16 * b + 8, len), b++;
			pos += PAD8(len);
			offs[c] = o;
			len = total;
		} else {
			len = (size_t)n * col->width;
		}
		dst[c] = body + pos;
		memset(body + pos + len, 0, PAD8(len) - len);
		put64(bufs + 16 * b, pos), put64(bufs + 16 * b + 8, len), b++;
		pos += PAD8(len);
	}
	for (__u32 i = 0; i < n; i += ARROW_BLOCK) {
		__u32 end = n - i < ARROW_BLOCK ? n : i + ARROW_BLOCK;

		for (unsigned c = 0; c < t->ncols; c++)
			arrow__copy(&t->cols[c], recs, rs, dst[c], offs[c], i, end);
	}
	put64(meta + t->length_pos, n);
	put64(meta + t->body_length_pos, pos);
	arrow__write(kind, (struct iovec[]){ { meta, t->batch_len }, { body, pos } }, 2);
}

/* Close every stream with the end-of-stream marker. */
void arrow__close(void)
{
	static const __u32 eos[2] = { 0xffffffffU, 0 };

	for (int k = 0; k < MAX_KIND; k++) {
		if (arrow.fd[k] < 0)
			continue;
		if (!arrow.failed[k])
			arrow__write(k, (struct iovec[]){ { (void *)eos, sizeof(eos) } }, 1);
		close(arrow.fd[k]);
		arrow.fd[k] = -1;
	}
}

void out__flush_kind(int kind)
{
	if (!out.count[kind])
		return;
	if (arrow_dir)
		arrow__batch(kind, out.buf[kind], out.count[kind]);
	if (!arrow_dir || also_frames)
		out__frame(kind, rec_versions[kind], rec_sizes[kind], out.count[kind],
			   out.buf[kind], (size_t)out.count[kind] * rec_sizes[kind]);
	out.count[kind] = 0;
}

void out__flush(void)
{
	for (int k = 1; k < MAX_KIND; k++)
		out__flush_kind(k);
}

void out__json(const char *fmt, ...)
{
	char buf[8192];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n >= (int)sizeof(buf))
		n = sizeof(buf) - 1;
	out__frame(0, NT_STREAM_VERSION, 1, n, buf, n);
}

/* The record stream's file and buffers, and the Arrow directory: 0, or
 * the exit code (2: a bad option, 1: no memory). */
int outputs__open(const char *output, const char *dir, bool frames)
{
	arrow_dir = dir, also_frames = frames;
	out.fd = STDOUT_FILENO;
	if (output && strcmp(output, "-")) {
		out.fd = open(output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (out.fd < 0) {
			fprintf(stderr, "nestrace-agent: %s: %s\n", output, strerror(errno));
			return 2;
		}
	}
	for (int k = 1; k < MAX_KIND; k++) {
		out.buf[k] = malloc(BATCH_BYTES);
		if (!out.buf[k])
			return 1;
	}
	for (int k = 0; k < MAX_KIND; k++) {
		arrow.fd[k] = -1;
		if (k < NT_ARROW_MAX_KIND && (nt_arrow_tables[k].batch_len > sizeof(arrow.meta) ||
					      nt_arrow_tables[k].ncols > ARROW_MAX_COLS))
			return 1;	/* cannot happen with the generated tables */
	}
	if (arrow_dir) {
		struct stat st;

		if (stat(arrow_dir, &st) || !S_ISDIR(st.st_mode)) {
			fprintf(stderr, "nestrace-agent: --arrow-dir %s: not a directory\n",
				arrow_dir);
			return 2;
		}
		arrow.body = malloc(ARROW_BODY_BYTES);
		if (!arrow.body)
			return 1;
		/* Reserve room for the final per-CPU counters now: with the
		 * store's disk full they still land, and the seal can count
		 * every record the agent took but could not write as lost. */
		if (!arrow__open(NT_KIND_CPU_STATS))
			return 2;
		if (fallocate(arrow.fd[NT_KIND_CPU_STATS], FALLOC_FL_KEEP_SIZE, 0, 256 << 10))
			fprintf(stderr, "nestrace-agent: cannot reserve room for the counters in %s: %s\n",
				arrow_dir, strerror(errno));
	}
	return 0;
}

/* Close the Arrow streams (each with its end marker) and the stream's file. */
void outputs__close(void)
{
	arrow__close();
	if (out.fd != STDOUT_FILENO)
		close(out.fd);
}
