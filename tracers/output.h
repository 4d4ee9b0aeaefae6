/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* nestrace-agent's output (output.c): records batched per kind and
 * written as frames of the record stream, and as Arrow IPC streams
 * (--arrow-dir). */
#ifndef __NESTRACE_OUTPUT_H
#define __NESTRACE_OUTPUT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <linux/types.h>

#define MAX_KIND 9
#define BATCH_BYTES (1 << 20)

/* the agent's: set to stop the capture when the output fails */
extern volatile sig_atomic_t exiting;
extern const char *exit_reason;

/* bytes of a record of each kind (0: no such kind) */
extern const __u32 rec_sizes[MAX_KIND];

extern struct out {
	int fd;
	bool broken;		/* the reader went away */
	char *buf[MAX_KIND];
	__u32 count[MAX_KIND];
	__u64 records;
	__u64 bad_records;	/* reported in the end frame, never silent */
} out;

/* The record stream's file (output: NULL or "-" for stdout), its batches,
 * and the Arrow directory (dir: NULL for none; frames: the records
 * in the stream too, --tee): 0, or the exit code (2: a bad option, 1: no
 * memory). */
int outputs__open(const char *output, const char *dir, bool frames);
/* Write kind's batch (one kind), every kind's (all). */
void out__flush_kind(int kind);
void out__flush(void);
/* A metadata frame (kind 0) of JSON. */
void out__json(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Close the Arrow streams, each with its end-of-stream marker. */
void arrow__close(void);
void outputs__close(void);

/* (inline: a call per record) */
static inline void out__append(const void *rec, __u16 kind)
{
	__u32 sz = rec_sizes[kind];

	if ((out.count[kind] + 1) * sz > BATCH_BYTES)
		out__flush_kind(kind);
	memcpy(out.buf[kind] + (size_t)out.count[kind] * sz, rec, sz);
	out.count[kind]++;
	out.records++;
}

#endif /* __NESTRACE_OUTPUT_H */
