/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "macro.h"
#include "base/worker-pool.h"
#include "memory/allocation.h"
#include "memory/arena.h"
#include "memory/mem-owner.h"
#include "memory/memory.h"
#include "memory/window.h"

uint64_t allocation_address(const struct allocation *a)
{
	return (uint64_t)(uintptr_t)a->arena->base + a->offset;
}

/* Index of the first run of arena at or after offset. */
static size_t run_index(const struct arena *arena, uint64_t offset)
{
	size_t lo = 0, hi = arena->n_runs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (arena->runs[mid]->offset < offset)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int runs_add(struct arena *arena, struct allocation *a)
{
	size_t at;

	if (arena->n_runs == arena->runs_cap) {
		size_t cap = arena->runs_cap ? arena->runs_cap * 2 : 16;
		struct allocation **runs = realloc(arena->runs, cap * sizeof(*runs));

		if (!runs)
			return -ENOMEM;
		arena->runs = runs;
		arena->runs_cap = cap;
	}
	at = run_index(arena, a->offset);
	memmove(&arena->runs[at + 1], &arena->runs[at], (arena->n_runs - at) * sizeof(*arena->runs));
	arena->runs[at] = a;
	arena->n_runs++;
	return 0;
}

static void runs_remove(struct arena *arena, struct allocation *a)
{
	size_t at = run_index(arena, a->offset);

	memmove(&arena->runs[at], &arena->runs[at + 1], (arena->n_runs - at - 1) * sizeof(*arena->runs));
	arena->n_runs--;
}

struct allocation *allocation_containing(struct memory *m, uint64_t address)
{
	struct arena *arena = memory_find_arena(m, address);
	uint64_t offset;
	size_t at;

	if (!arena)
		return NULL;
	offset = address - (uintptr_t)arena->base;
	at = run_index(arena, offset + 1); /* first run starting after offset */
	if (at == 0)
		return NULL;
	if (offset >= arena->runs[at - 1]->offset + arena->runs[at - 1]->length)
		return NULL;
	return arena->runs[at - 1];
}

struct allocation *allocation_find(struct memory *m, uint64_t address)
{
	return u64_map_get(&m->allocations, address);
}

/* Puts a (whose other fields are set) where lookups find it: the map and its arena's runs. */
static int allocation_index(struct memory *m, struct arena *arena, uint64_t offset,
			    uint64_t length, struct allocation *a)
{
	int r;

	a->arena = arena;
	a->offset = offset;
	a->length = length;
	r = u64_map_put(&m->allocations, allocation_address(a), a);
	if (r < 0)
		return r;
	r = runs_add(arena, a);
	if (r < 0) {
		u64_map_remove(&m->allocations, allocation_address(a));
		return r;
	}
	return 0;
}

static int record(struct memory *m, struct allocation *a, struct mem_owner *owner,
		  struct arena *arena, uint64_t offset, uint64_t length)
{
	int r;

	a->owner = owner;
	a->serial = ++m->allocation_serial;
	r = allocation_index(m, arena, offset, length, a);
	if (r < 0)
		return r;
	LIST_INSERT_HEAD(&owner->allocations, a, owner_link);
	owner->allocated_bytes += length;
	m->allocated_bytes += length;
	return 0;
}

/* Its id is free again: whoever handed the arena out forgets it. */
static void forget_arena(struct memory *m, struct arena *arena)
{
	if (m->arena_gone)
		m->arena_gone(m->data, arena->id);
	arena_free(arena);
}

/* Keeps one empty arena of the usual size for the next allocation; other empty ones (and
 * oversized ones, made for one big allocation) go back to the window. The run at offset,
 * length was the last to go, its pages punched already. */
static void trim_arenas(struct memory *m, struct arena *emptied, uint64_t offset,
			uint64_t length)
{
	struct arena *a;

	if (emptied->external || emptied->size > m->config->arena_size) {
		forget_arena(m, emptied);
		return;
	}
	LIST_FOREACH(a, &m->arenas, link)
		if (a != emptied && !a->external && a->n_allocations == 0) {
			forget_arena(m, emptied);
			return;
		}
	/* Kept: clients map whole arenas, so give back pages touched outside their runs too.
	 * Not the run's again: punching 1 GiB, however empty, takes the loop 0.3 ms. */
	if (m->window->keep_content)
		return;
	if (offset > 0)
		arena_punch(emptied, 0, offset);
	if (offset + length < emptied->size)
		arena_punch(emptied, offset + length, emptied->size - offset - length);
}

/* A run handed back before anybody had it. */
static void unrun(struct memory *m, struct arena *arena, uint64_t offset, uint64_t length)
{
	arena_release(arena, offset, length);
	if (arena->n_allocations == 0)
		trim_arenas(m, arena, offset, length);
}

/* auto: huge pages only for a run that fills at least one, while the host has free ones. A
 * smaller run would take a whole huge page (charged for it, and gone for everyone else). */
static bool want_hugetlb(const struct memory *m, uint64_t size)
{
	switch (m->config->hugepages) {
	case HUGEPAGES_NO:
		return false;
	case HUGEPAGES_YES:
		return true;
	default:
		return size >= HUGE_PAGE_SIZE && hugepages_free() > 0;
	}
}

/* A run in an existing arena of the given page size; -ENOSPC when none has room. */
static int first_fit(struct memory *m, bool hugetlb, uint64_t size, uint64_t align,
		     struct arena **ret, uint64_t *offset, uint64_t *length)
{
	struct arena *a;
	int r;

	LIST_FOREACH(a, &m->arenas, link) {
		if (a->external || a->hugetlb != hugetlb)
			continue;
		r = arena_alloc(a, size, align, offset, length);
		if (r != -ENOSPC && r != -ENOMEM) {
			*ret = a;
			return r;
		}
	}
	return -ENOSPC;
}

/* A run in a new arena; the arena goes again when the run cannot be had. */
static int new_arena_alloc(struct memory *m, bool hugetlb, uint64_t size, uint64_t align,
			   struct arena **ret, uint64_t *offset, uint64_t *length)
{
	struct arena *a;
	int r;

	r = arena_new(m, size, hugetlb, &a);
	if (r < 0)
		return r;
	r = arena_alloc(a, size, align, offset, length);
	if (r < 0) {
		arena_free(a);
		return r;
	}
	*ret = a;
	return 0;
}

int allocation_alloc(struct memory *m, struct allocation *a, struct mem_owner *owner,
		     uint64_t size, uint64_t align, enum page_pick pick, char *why, size_t why_size)
{
	const struct config *c = m->config;
	bool hugepage_only = pick == PAGES_HUGE;
	bool hugetlb = hugepage_only || (pick == PAGES_AUTO && want_hugetlb(m, size));
	uint64_t offset, length;
	struct arena *arena;
	int r;

	if (size == 0 || (align & (align - 1)) || align > c->arena_size) {
		snprintf(why, why_size, "size must be > 0 and align a power of two up to the "
					"arena size");
		return -EINVAL;
	}
	if (size > c->window_size / 2) {
		snprintf(why, why_size, "%" PRIu64 " bytes do not fit the address window "
			 "([memory] window_size)", size);
		return -ENOMEM;
	}
	r = memory_check_quota(m, size, false, why, why_size);
	if (r < 0)
		return r;

	r = first_fit(m, hugetlb, size, align, &arena, &offset, &length);
	if (r != -ENOSPC)
		goto done;
	r = memory_check_quota(m, size, true, why, why_size);
	if (r < 0)
		return r;
	r = new_arena_alloc(m, hugetlb, size, align, &arena, &offset, &length);
	if (r < 0 && hugetlb && !hugepage_only && c->hugepages == HUGEPAGES_AUTO) {
		/* No huge page left (or no room for a new arena of them): 4 KiB pages serve as
		 * well, only slower to register. */
		log_debug("domain %s: no huge page for %" PRIu64 " bytes, using 4 KiB pages",
			  m->name, size);
		hugetlb = false;
		r = first_fit(m, false, size, align, &arena, &offset, &length);
		if (r == -ENOSPC) {
			r = memory_check_quota(m, size, true, why, why_size);
			if (r < 0)
				return r;
			r = new_arena_alloc(m, false, size, align, &arena, &offset, &length);
		}
	}
done:
	if (r == -EDQUOT)
		return memory_window_quota(m, size, why, why_size);
	if (r < 0) {
		snprintf(why, why_size, "no memory for %" PRIu64 " bytes (%s pages): %s", size,
			 hugetlb ? "2 MiB" : "4 KiB", strerror(-r));
		/* Whatever the kernel said (no huge pages, no hugetlbfs): out of memory. */
		return -ENOMEM;
	}
	if (m->allocated_bytes + length > m->quota->allocated_bytes) {
		/* Rounding to pages crossed the quota. */
		unrun(m, arena, offset, length);
		return config_quota_refusal(c, m->quota, QUOTA_ALLOCATED_BYTES, m->name,
					    m->allocated_bytes, length, why, why_size);
	}
	r = record(m, a, owner, arena, offset, length);
	if (r < 0)
		unrun(m, arena, offset, length);
	return r;
}

int allocation_attach(struct memory *m, struct allocation *a, struct mem_owner *owner, int fd,
		      uint64_t offset, uint64_t length, char *why, size_t why_size)
{
	struct arena *arena;
	int r;

	r = memory_check_quota(m, length, true, why, why_size);
	if (r < 0)
		return r;
	r = arena_new_external(m, fd, offset, length, &arena);
	if (r == -EBADF)
		snprintf(why, why_size, "only memfds (tmpfs or hugetlbfs) can be attached");
	else if (r == -EPERM)
		snprintf(why, why_size, "only a memfd sealed against shrinking (F_ADD_SEALS with "
					"F_SEAL_SHRINK) can be attached: a file that could shrink "
					"under mrd (/dev/shm, hugetlbfs) is not taken");
	else if (r == -EROFS) {
		snprintf(why, why_size, "the memfd is sealed against writes (F_SEAL_WRITE or "
					"F_SEAL_FUTURE_WRITE): mrd maps attached memory writable");
		r = -EPERM;
	} else if (r == -EACCES)
		snprintf(why, why_size, "the memfd was opened read-only: mrd maps attached memory "
					"writable (send a descriptor opened O_RDWR)");
	else if (r == -EINVAL)
		snprintf(why, why_size, "offset and length must be page-aligned and inside the file");
	else if (r == -ENOSPC) {
		snprintf(why, why_size, "no room for %" PRIu64 " bytes in the address window "
			 "([memory] window_size)", length);
		r = -ENOMEM;
	} else if (r == -EDQUOT)
		r = memory_window_quota(m, length, why, why_size);
	if (r < 0)
		return r;
	arena->n_allocations = 1;
	r = record(m, a, owner, arena, 0, length);
	if (r < 0) {
		arena->memfd = -1; /* still the caller's to close */
		arena_free(arena);
	}
	return r;
}

int allocation_adopt(struct memory *m, struct allocation *a, struct arena *arena,
		     const struct adopted_allocation *saved)
{
	char why[128];
	size_t at;
	int r;

	if (saved->length == 0 || saved->offset % arena->page_size ||
	    saved->length % arena->page_size || saved->offset > arena->size ||
	    saved->length > arena->size - saved->offset)
		return -EINVAL;
	at = run_index(arena, saved->offset);
	if ((at > 0 && arena->runs[at - 1]->offset + arena->runs[at - 1]->length > saved->offset) ||
	    (at < arena->n_runs && arena->runs[at]->offset < saved->offset + saved->length))
		return -EEXIST;
	a->serial = saved->serial;
	if (saved->span_offset > saved->length ||
	    saved->span_length > saved->length - saved->span_offset)
		return -EINVAL;
	allocation_set_alias(a, saved->alias, saved->alias_access, saved->span_offset,
			     saved->span_length);
	a->length = saved->length; /* what its spans are checked against */
	for (unsigned i = 0; i < saved->n_more_spans; i++)
		if (allocation_add_span(a, saved->more_spans[2 * i], saved->more_spans[2 * i + 1],
					why, sizeof(why)) < 0)
			return -EINVAL;
	a->orphan = true;
	a->claim_session = saved->session;
	a->claim_pid = saved->pid;
	a->claim_uid = saved->uid;
	a->claim_start_time = saved->start_time;
	r = allocation_index(m, arena, saved->offset, saved->length, a);
	if (r < 0)
		return r;
	LIST_INSERT_HEAD(&m->orphans, a, owner_link);
	m->n_orphans++;
	arena->n_allocations++;
	m->allocated_bytes += a->length;
	return 0;
}

unsigned allocation_claim(struct memory *m, struct mem_owner *owner, uint64_t session)
{
	struct allocation *a, *next;
	unsigned n = 0;

	if (session == 0)
		return 0;
	for (a = LIST_FIRST(&m->orphans); a; a = next) {
		next = LIST_NEXT(a, owner_link);
		if (a->claim_session != session || a->claim_pid != owner->pid ||
		    a->claim_uid != owner->uid ||
		    (a->claim_start_time && mem_owner_start_time(owner) &&
		     a->claim_start_time != mem_owner_start_time(owner)))
			continue; /* not that process (a later one may have its pid) */
		allocation_unorphan(m, a);
		a->owner = owner;
		LIST_INSERT_HEAD(&owner->allocations, a, owner_link);
		owner->allocated_bytes += a->length;
		n++;
	}
	return n;
}

void allocation_unorphan(struct memory *m, struct allocation *a)
{
	LIST_REMOVE(a, owner_link);
	m->n_orphans--;
	a->orphan = false;
}

void allocation_disown(struct allocation *a)
{
	LIST_REMOVE(a, owner_link);
	a->owner->allocated_bytes -= a->length;
	a->owner = NULL;
}

void allocation_give(struct allocation *a, struct mem_owner *to)
{
	LIST_REMOVE(a, owner_link);
	a->owner->allocated_bytes -= a->length;
	a->owner = to;
	LIST_INSERT_HEAD(&to->allocations, a, owner_link);
	to->allocated_bytes += a->length;
}

void allocation_retire(struct memory *m, struct allocation *a)
{
	u64_map_remove(&m->allocations, allocation_address(a));
	runs_remove(a->arena, a);
	if (a->owner)
		allocation_disown(a);
	m->status.page->frees++;
}

/* A big run punched on a worker; it goes back to the buddy on the loop after. */
struct punch_job {
	struct work work;
	struct memory *m;
	struct arena *arena;
	uint64_t offset, length;
	void (*done)(void *arg);
	void *arg;
};

static void punch_job_run(struct work *w)
{
	struct punch_job *j = container_of(w, struct punch_job, work);

	arena_punch(j->arena, j->offset, j->length);
}

static void punch_job_done(struct work *w)
{
	struct punch_job j = *container_of(w, struct punch_job, work);

	free(container_of(w, struct punch_job, work));
	j.m->allocated_bytes -= j.length;
	arena_return(j.arena, j.offset, j.length);
	if (j.arena->n_allocations == 0)
		trim_arenas(j.m, j.arena, j.offset, j.length);
	j.done(j.arg);
}

/* The registrar's rule (registrar_offload) for pages: what takes as long as registering
 * async_bytes goes to a worker, never without one nor once the pool drains. */
static bool memory_offload(const struct memory *m, uint64_t bytes)
{
	return m->workers && *m->workers && !__atomic_load_n(m->stopping, __ATOMIC_ACQUIRE) &&
	       bytes >= m->config->async_bytes;
}

int allocation_release(struct memory *m, struct allocation *a, void (*done)(void *arg),
		       void *arg)
{
	struct punch_job *j;

	/* Kept content (a hand-over) is not punched: nothing slow is left to do. */
	j = done && !a->arena->external && !m->window->keep_content &&
			    memory_offload(m, a->length) ?
		    malloc(sizeof(*j)) :
		    NULL;
	if (!j) {
		m->allocated_bytes -= a->length;
		unrun(m, a->arena, a->offset, a->length);
		return 0;
	}
	*j = (struct punch_job){ .work = { .run = punch_job_run, .done = punch_job_done },
				 .m = m, .arena = a->arena, .offset = a->offset,
				 .length = a->length, .done = done, .arg = arg };
	worker_pool_submit(*m->workers, &j->work, m);
	return -EINPROGRESS;
}

static bool spans_meet(uint64_t o1, uint64_t l1, uint64_t o2, uint64_t l2)
{
	return o1 < o2 + l2 && o2 < o1 + l1;
}

int allocation_add_span(struct allocation *a, uint64_t offset, uint64_t length, char *why,
			size_t why_size)
{
	if (!a->alias || !a->span_length) {
		snprintf(why, why_size, "%s", a->alias ? "its MRs cover all of it already" :
			 "it is no program's buffer (no alias)");
		return -EINVAL;
	}
	if (!length || offset > a->length || length > a->length - offset) {
		snprintf(why, why_size, "span [%" PRIu64 ", +%" PRIu64 "): empty, or past its %"
			 PRIu64 " bytes", offset, length, a->length);
		return -EINVAL;
	}
	if (spans_meet(offset, length, a->span_offset, a->span_length))
		goto overlap;
	for (unsigned i = 0; i < a->n_more_spans; i++)
		if (spans_meet(offset, length, a->more_spans[i].offset, a->more_spans[i].length))
			goto overlap;
	if (a->n_more_spans == ALLOCATION_SPANS_MAX - 1) {
		snprintf(why, why_size, "it has %d spans, the most it may", ALLOCATION_SPANS_MAX);
		return -ENOSPC;
	}
	a->more_spans[a->n_more_spans++] = (struct alias_span){ offset, length };
	return 0;
overlap:
	/* Two MRs over one byte: the cache holds one MR an address. */
	snprintf(why, why_size, "span [%" PRIu64 ", +%" PRIu64 ") overlaps one it has", offset,
		 length);
	return -EINVAL;
}

/* The index of a's span [offset, offset + length): 0 the first, i + 1 more_spans[i]. */
static int span_index(const struct allocation *a, uint64_t offset, uint64_t length)
{
	if (a->span_offset == offset && a->span_length == length)
		return 0;
	for (unsigned i = 0; i < a->n_more_spans; i++)
		if (a->more_spans[i].offset == offset && a->more_spans[i].length == length)
			return (int)i + 1;
	return -1;
}

int allocation_span_droppable(const struct allocation *a, uint64_t offset, uint64_t length,
			      char *why, size_t why_size)
{
	if (!a->alias || !a->span_length) {
		snprintf(why, why_size, "%s", a->alias ? "it has no spans: its MRs cover all of it" :
			 "it is no program's buffer (no alias)");
		return -EINVAL;
	}
	if (span_index(a, offset, length) < 0) {
		snprintf(why, why_size, "it has no span [%" PRIu64 ", +%" PRIu64 ") (a span goes "
			 "whole, as it was added)", offset, length);
		return -EINVAL;
	}
	if (!a->n_more_spans) {
		snprintf(why, why_size, "[%" PRIu64 ", +%" PRIu64 ") is its only span: free the "
			 "allocation instead", offset, length);
		return -EINVAL;
	}
	return 0;
}

int allocation_drop_span(struct allocation *a, uint64_t offset, uint64_t length, char *why,
			 size_t why_size)
{
	int k = allocation_span_droppable(a, offset, length, why, why_size), i;

	if (k < 0)
		return k;
	i = span_index(a, offset, length);
	/* The last span takes its place: a first span of 0 bytes would mean all of it. */
	if (i == 0) {
		a->span_offset = a->more_spans[a->n_more_spans - 1].offset;
		a->span_length = a->more_spans[a->n_more_spans - 1].length;
	} else
		a->more_spans[i - 1] = a->more_spans[a->n_more_spans - 1];
	a->n_more_spans--;
	return 0;
}

bool allocation_span_at(const struct allocation *a, uint64_t offset, uint64_t *lo,
			uint64_t *hi)
{
	if (!a->span_length) {
		*lo = 0;
		*hi = a->length;
		return true;
	}
	if (offset >= a->span_offset && offset - a->span_offset < a->span_length) {
		*lo = a->span_offset;
		*hi = a->span_offset + a->span_length;
		return true;
	}
	for (unsigned i = 0; i < a->n_more_spans; i++)
		if (offset >= a->more_spans[i].offset &&
		    offset - a->more_spans[i].offset < a->more_spans[i].length) {
			*lo = a->more_spans[i].offset;
			*hi = *lo + a->more_spans[i].length;
			return true;
		}
	return false;
}
