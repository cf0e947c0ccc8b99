/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "memory/arena.h"
#include "memory/memory.h"
#include "memory/window.h"

void memory_init(struct memory *m, const struct config *config, const struct quota *quota,
		 struct window *window, const char *name)
{
	*m = (struct memory){ .config = config, .quota = quota, .window = window, .name = name,
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

int memory_window_quota(const struct memory *m, uint64_t length, char *why, size_t why_size)
{
	uint64_t slot = m->window->slot_size;

	/* An arena takes whole slots. */
	return config_quota_refusal(m->config, m->quota, QUOTA_WINDOW_BYTES, m->name,
				    m->window_bytes,
				    (length + slot - 1) / slot * slot, why, why_size);
}

int memory_check_quota(const struct memory *m, uint64_t bytes, bool new_arena, char *why,
		       size_t why_size)
{
	const struct config *c = m->config;
	const struct quota *q = m->quota;

	if (m->allocations.n >= q->allocations)
		return config_quota_refusal(c, q, QUOTA_ALLOCATIONS, m->name, m->allocations.n, 1,
					    why, why_size);
	if (bytes > q->allocated_bytes - m->allocated_bytes ||
	    m->allocated_bytes > q->allocated_bytes)
		return config_quota_refusal(c, q, QUOTA_ALLOCATED_BYTES, m->name,
					    m->allocated_bytes, bytes, why, why_size);
	if (new_arena && m->n_arenas >= q->arenas)
		return config_quota_refusal(c, q, QUOTA_ARENAS, m->name, m->n_arenas, 1, why,
					    why_size);
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
