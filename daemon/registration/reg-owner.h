/* SPDX-License-Identifier: MIT */
/* Whoever holds allocations, as registration sees it: memory's owner record and the
 * registration work it has under way. control/client.h embeds it. */
#pragma once

#include <sys/queue.h>

#include "memory/mem-owner.h"

struct reg_owner {
	struct mem_owner mem;
	LIST_HEAD(, pool_reg) pools;          /* its mempool registrations */
	LIST_HEAD(, prefetch_job) prefetches; /* its ODP prefetch work, and a flush waiting */
	unsigned n_prefetches;                /* of those, queued or running */
};

static inline void reg_owner_init(struct reg_owner *o, uint64_t session, pid_t pid, uid_t uid)
{
	mem_owner_init(&o->mem, session, pid, uid);
	LIST_INIT(&o->pools);
	LIST_INIT(&o->prefetches);
	o->n_prefetches = 0;
}
