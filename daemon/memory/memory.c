/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "memory/arena.h"
#include "memory/memory.h"

void memory_init(struct memory *m, const struct config *config, struct window *window,
		 const char *name)
{
	*m = (struct memory){ .config = config, .window = window, .name = name,
			      .status = { .fd = -1 } };
	LIST_INIT(&m->arenas);
	LIST_INIT(&m->orphans);
}

void memory_adopt(struct memory *m, uint64_t allocation_serial, uint64_t frees)
{
	m->allocation_serial = allocation_serial;
	m->status.page->frees = frees;
}

void memory_done(struct memory *m)
{
	while (!LIST_EMPTY(&m->arenas))
		arena_free(LIST_FIRST(&m->arenas));
	u64_map_done(&m->allocations);
	status_page_close(&m->status);
}

int memory_window_quota(const struct memory *m, char *why, size_t why_size)
{
	snprintf(why, why_size, "quota.window_bytes (%" PRIu64 ") reached for domain %s: its %u "
		 "arenas take %" PRIu64 " bytes of the address window",
		 config_window_bytes(m->config), m->name, m->n_arenas, m->window_bytes);
	return -EDQUOT;
}

int memory_check_quota(const struct memory *m, uint64_t bytes, bool new_arena, char *why,
		       size_t why_size)
{
	const struct config *c = m->config;

	if (m->allocations.n >= c->quota_allocations) {
		snprintf(why, why_size, "quota.allocations (%u) reached for domain %s",
			 c->quota_allocations, m->name);
		return -EDQUOT;
	}
	if (bytes > c->quota_allocated_bytes - m->allocated_bytes ||
	    m->allocated_bytes > c->quota_allocated_bytes) {
		snprintf(why, why_size,
			 "quota.allocated_bytes (%" PRIu64 ") would be exceeded in domain %s: %" PRIu64
			 " allocated, %" PRIu64 " asked",
			 c->quota_allocated_bytes, m->name, m->allocated_bytes, bytes);
		return -EDQUOT;
	}
	if (new_arena && m->n_arenas >= c->quota_arenas) {
		snprintf(why, why_size, "quota.arenas (%u) reached for domain %s", c->quota_arenas,
			 m->name);
		return -EDQUOT;
	}
	return 0;
}

struct arena *memory_find_arena(struct memory *m, uint64_t address)
{
	struct arena *a;

	LIST_FOREACH(a, &m->arenas, link)
		if (address >= (uintptr_t)a->base && address < (uintptr_t)a->base + a->size)
			return a;
	return NULL;
}

void memory_update_status(struct memory *m)
{
	struct mrd_status_page *s = m->status.page;

	if (!s)
		return;
	s->allocated_bytes = m->allocated_bytes;
	s->allocations = m->allocations.n;
	s->arenas = m->n_arenas;
}
