/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* What the block family keeps of the requests (requests.c). */
#ifndef __NESTRACE_REQUESTS_H
#define __NESTRACE_REQUESTS_H

#include <linux/types.h>

struct block_bpf;

/* The block family's skeleton, NULL when not loaded (programs.c). */
struct block_bpf *families__block(void);
struct family;
/* --per-request, the programs off: requests lost for want of a slot, slots
 * expired, and requests still dispatched at end, each written as a row. */
void requests__end(struct family *first, __u64 end, __u64 *lost, __u64 *expired,
		   __u64 *in_flight);
/* --from-completions: the window in which the requests are counted (from
 * the capture's start; to its end, 0: unchanged), the wait for those in
 * flight before the last hooks come off, and the counts: the requests
 * dispatched in it and of them those whose end was seen. */
void completions__window(__u64 from, __u64 to);
void completions__wait(void);
void completions__count(__u64 *dispatched, __u64 *ended);

#endif /* __NESTRACE_REQUESTS_H */
