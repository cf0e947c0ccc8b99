/* SPDX-License-Identifier: MIT */
/* Old contexts: device contexts an earlier mrd exported to clients (ExportPd) and handed over
 * (control/handover.c) while they still held them. A dup of a context's command descriptor
 * keeps the kernel's context alive after the mrd that opened it — its PD, that mrd's MRs, their
 * pins and working keys — until the last holder closes it; no mrd can revoke them. mrd shows
 * them (mrctl status, clients) until none of the processes that asked for one runs any more.
 * Only the asker is known: a descriptor it passed on (SCM_RIGHTS, fork) is not seen. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "core/domain.h"

struct old_context {
	LIST_ENTRY(old_context) link;
	char domain[64], device[64];
	uint64_t pinned_bytes;     /* what mrd had pinned in it at the hand-over */
	uint32_t mrs;              /* mrd's MRs and on-demand children in it then */
	uint64_t handed_over_usec; /* CLOCK_REALTIME */
	struct context_holder *holders;
	size_t n_holders;
};

LIST_HEAD(old_contexts, old_context);

/* Records one, with those of holders[0 .. n) still running; none: nothing is recorded (0).
 * -EINVAL for names too long, -ENOMEM. */
int old_context_add(struct old_contexts *list, const char *domain, const char *device,
		    uint64_t pinned_bytes, uint32_t mrs, uint64_t handed_over_usec,
		    const struct context_holder *holders, size_t n);
/* Forgets the holders whose process is gone, and the contexts left without any (logged):
 * how many are left. */
size_t old_contexts_prune(struct old_contexts *list);
void old_contexts_free(struct old_contexts *list);
