/* SPDX-License-Identifier: MIT */
/* A domain's memory: its arenas in the address window, the allocations in them, the quotas
 * that bound both, and its status page. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "u64-map.h"
#include "base/config.h"
#include "memory/status.h"

struct fd_closer;

struct arena;
struct window;
struct worker_pool;

struct memory {
	const struct config *config;
	const struct quota *quota; /* its domain's */
	struct window *window;
	const char *name; /* its domain's, for messages */
	LIST_HEAD(, arena) arenas;
	unsigned n_arenas;
	uint64_t window_bytes; /* of the address window, its arenas' slots (quota.window_bytes) */
	struct u64_map allocations; /* address -> struct allocation */
	uint64_t allocated_bytes;
	uint64_t allocation_serial; /* last serial given to an allocation */
	LIST_HEAD(, allocation) orphans; /* adopted across a warm restart, waiting for owners */
	unsigned n_orphans;
	struct status_page status;
	/* An emptied arena went back to the window: whoever handed its id out forgets it. */
	void (*arena_gone)(void *data, uint32_t arena_id);
	void *data;
	/* The daemon's pool, where big runs are punched (allocation_release), and its flag set
	 * before the pool drains; NULL (or a NULL pool): everything on the loop. */
	struct worker_pool *const *workers;
	const bool *stopping;
	/* Where an arena's memfd goes when it does: the last close of GiBs of pages takes
	 * seconds, never the loop's. NULL (or a NULL closer): closed at once. */
	struct fd_closer *const *closer;
};

/* Empty: no arena, no status page yet (status_page_open). */
void memory_init(struct memory *m, const struct config *config, const struct quota *quota,
		 struct window *window, const char *name);
/* What the previous mrd's memory of this domain reached (warm restart): serials go on above
 * allocation_serial, so no allocation looks like one of before; the status page counts frees
 * on from frees. */
void memory_adopt(struct memory *m, uint64_t allocation_serial, uint64_t frees);
/* Frees every arena and the status page; the allocations went before. */
void memory_done(struct memory *m);

/* Whether bytes more (in a new arena, with new_arena) stay inside quota.allocations,
 * quota.allocated_bytes and quota.arenas: 0, or -EDQUOT with the reason in why. */
int memory_check_quota(const struct memory *m, uint64_t bytes, bool new_arena, char *why,
		       size_t why_size);
/* arena_new and arena_new_external refuse past the domain's share of the window: why, for a
 * new arena of length bytes. */
int memory_window_quota(const struct memory *m, uint64_t length, char *why, size_t why_size);

/* The arena holding address, NULL when it is not this memory. */
struct arena *memory_find_arena(struct memory *m, uint64_t address);

/* The status page's counters of memory: allocated bytes, allocations, arenas. */
void memory_update_status(struct memory *m);
