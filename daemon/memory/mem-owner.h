/* SPDX-License-Identifier: MIT */
/* Whoever holds allocations, as memory sees it: a client (control/client.h embeds it, through
 * registration/reg-owner.h), known by its process and the memory it owns. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

struct allocation;

struct mem_owner {
	LIST_HEAD(, allocation) allocations; /* owned: freed when the owner goes */
	uint64_t allocated_bytes;
	uint64_t session; /* what a warm restart gives its memory back under (its client's id) */
	pid_t pid;
	uid_t uid;
	uint64_t start_time; /* of its process (mem_owner_start_time): 0 until asked */
};

static inline void mem_owner_init(struct mem_owner *o, uint64_t session, pid_t pid, uid_t uid)
{
	*o = (struct mem_owner){ .session = session, .pid = pid, .uid = uid };
	LIST_INIT(&o->allocations);
}

/* When the owner's process started (/proc), read once: it tells the process from a later one
 * that got its pid. 0 when /proc does not say. */
uint64_t mem_owner_start_time(struct mem_owner *o);
