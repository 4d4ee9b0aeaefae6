/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* A guest capture without Python (--guest MOUNT --guest-capture DIR --
 * CMD): the file systems and their disk found, the start and end
 * snapshots and facts written to DIR, the command run and waited for;
 * and --facts, the same facts on stdout for `nestrace record`. */
#ifndef __NESTRACE_GCAP_H
#define __NESTRACE_GCAP_H

#include <signal.h>
#include <sys/types.h>

/* the traced command, for the agent's signal handlers and loop */
extern volatile pid_t child_pid;
extern volatile sig_atomic_t child_done, child_signalled;
/* where the agent was pinned (JSON list), or "null" */
extern char cpus_json[256];

/* --facts: the file systems' facts on stdout, no tracing (0, or the exit
 * code). */
int facts__run(void);
/* Before tracing: the stack, the filters, the start snapshot (0, or -1
 * said); gcap__undo removes what a failed one made. */
int gcap__begin(void);
void gcap__undo(void);
/* Pin the agent away from the disk interrupts. */
void cpus__pin(void);
/* Start env.cmd, where the agent could run and with the user's umask. */
int command__start(void);
/* After tracing: the command's end, the end snapshot, the end facts. */
int gcap__end(void);

#endif /* __NESTRACE_GCAP_H */
