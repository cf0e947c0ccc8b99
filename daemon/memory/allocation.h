/* SPDX-License-Identifier: MIT */
/* One run of pages handed to a client (or a client's attached memfd), as memory knows it:
 * where it lies, whose it is. Registration keeps its own state beside it
 * (registration/reg-allocation.h wraps it), so the caller provides the struct, zeroed, and
 * frees it after allocation_release. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

struct arena;
struct mem_owner;
struct memory;

/* Most spans an aliased allocation holds: its first, and those AliasSpan adds. */
#define ALLOCATION_SPANS_MAX 8

struct alias_span {
	uint64_t offset, length;
};

struct allocation {
	struct arena *arena;
	uint64_t offset, length;
	struct mem_owner *owner; /* NULL once it left while pool MRs still cover the memory */
	LIST_ENTRY(allocation) owner_link;
	uint64_t serial;    /* tells it from a later allocation at the same address */
	bool odp;           /* registered on demand, by ODP children (registration/odp.h) */
	bool read_only;     /* its registrations grant reads only */
	/* Where its owner's process maps it too (libmrd-preload.so moves a program's buffer onto
	 * it there), 0: nowhere. MRs of that process's client PDs over it take their addresses
	 * there; no other cache registers it. They grant alias_access (MRD_ACCESS_* bits: what
	 * the program asked of its own registration), nothing more. */
	uint64_t alias;
	unsigned alias_access;
	uint64_t span_offset, span_length; /* with an alias: the bytes its MRs cover (0: all) */
	/* Other buffers of the program on the same pages (AliasSpan, heap neighbours): each the
	 * bytes of MRs of its own, apart from each other and from the first span. */
	struct alias_span more_spans[ALLOCATION_SPANS_MAX - 1];
	unsigned n_more_spans;
	/* Adopted across a warm restart and not yet taken back (allocation_claim): on the
	 * memory's orphan list through owner_link, owner NULL. Only the process it belonged to,
	 * with the session it had, takes it back. */
	bool orphan;
	uint64_t claim_session; /* 0: nobody's (kept for others' mempools) */
	pid_t claim_pid;
	uid_t claim_uid;
	uint64_t claim_start_time;
};

/* What the previous mrd knew of an allocation (warm restart, core/domain-handover.h). */
struct adopted_allocation {
	uint64_t offset, length, serial;
	bool odp, read_only;
	uint64_t alias;
	unsigned alias_access;
	uint64_t span_offset, span_length;
	uint64_t more_spans[2 * (ALLOCATION_SPANS_MAX - 1)]; /* offset, length pairs */
	unsigned n_more_spans;
	uint64_t session;
	pid_t pid;
	uid_t uid;
	uint64_t start_time;
};

/* The address of an allocation, as clients see it. */
uint64_t allocation_address(const struct allocation *a);

/* Which pages an allocation takes: as [memory] hugepages says, 2 MiB ones only (-ENOMEM rather
 * than 4 KiB pages), or 4 KiB ones only (an alias maps it at 4 KiB-aligned addresses). */
enum page_pick { PAGES_AUTO, PAGES_HUGE, PAGES_SMALL };

/* Allocates size bytes aligned to align into a, for owner: an existing arena with room, else a
 * new one, of the pages pick says. Quota refusals are -EDQUOT with the reason written to why. */
int allocation_alloc(struct memory *m, struct allocation *a, struct mem_owner *owner,
		     uint64_t size, uint64_t align, enum page_pick pick, char *why, size_t why_size);

/* Maps a client's memfd into the window as a, owner's (fd consumed on success). */
int allocation_attach(struct memory *m, struct allocation *a, struct mem_owner *owner, int fd,
		      uint64_t offset, uint64_t length, char *why, size_t why_size);

/* Records a, an allocation of arena that the previous mrd knew (saved), as an orphan, owned by
 * nobody. -EINVAL when it is not page runs inside the arena, -EEXIST when it overlaps another. */
int allocation_adopt(struct memory *m, struct allocation *a, struct arena *arena,
		     const struct adopted_allocation *saved);
/* Hands owner the orphans that were its process's under session (a later process may have
 * its pid): how many. */
unsigned allocation_claim(struct memory *m, struct mem_owner *owner, uint64_t session);
/* The orphan a waits no more: nobody's, and no longer on the orphan list. */
void allocation_unorphan(struct memory *m, struct allocation *a);
/* Its owner lets go of it: it stays, nobody's. */
void allocation_disown(struct allocation *a);
/* Its owner hands it to to. */
void allocation_give(struct allocation *a, struct mem_owner *to);

/* How a's memory is registered: on demand, or pinned; for reads alone, or for all access. */
static inline void allocation_set_kind(struct allocation *a, bool odp, bool read_only)
{
	a->odp = odp;
	a->read_only = read_only;
}

static inline void allocation_set_alias(struct allocation *a, uint64_t alias, unsigned access,
					uint64_t span_offset, uint64_t span_length)
{
	a->alias = alias;
	a->alias_access = alias ? access : 0;
	a->span_offset = alias ? span_offset : 0;
	a->span_length = alias ? span_length : 0;
	a->n_more_spans = 0;
}

/* Adds [offset, offset + length) as a span of a: -EINVAL unless a is aliased with a first span
 * and the bytes lie inside it apart from every span it has, -ENOSPC when it has
 * ALLOCATION_SPANS_MAX; why says which. */
int allocation_add_span(struct allocation *a, uint64_t offset, uint64_t length, char *why,
			size_t why_size);
/* Whether a may drop its span [offset, offset + length): exactly one it has (the first among
 * them), not its only one; else -EINVAL, why says which. */
int allocation_span_droppable(const struct allocation *a, uint64_t offset, uint64_t length,
			      char *why, size_t why_size);
/* Drops it (when allocation_span_droppable allows; the last span takes its place). */
int allocation_drop_span(struct allocation *a, uint64_t offset, uint64_t length, char *why,
			 size_t why_size);
/* The span of aliased a holding the byte at offset: true with its bounds (offsets in a); the
 * whole allocation when a has no span. */
bool allocation_span_at(const struct allocation *a, uint64_t offset, uint64_t *lo,
			uint64_t *hi);

/* The address [start, ...) of a has for its registrations: start itself, or, aliased, start's
 * place in the alias. */
static inline uint64_t allocation_iova(const struct allocation *a, uint64_t start)
{
	return a->alias ? start - allocation_address(a) + a->alias : start;
}

struct allocation *allocation_find(struct memory *m, uint64_t address);
/* The live allocation whose pages hold address, NULL when none does. */
struct allocation *allocation_containing(struct memory *m, uint64_t address);

/* The first step of a free, on the loop: no lookup finds a any more, its owner has it no more,
 * and the status page counts the free. */
void allocation_retire(struct memory *m, struct allocation *a);
/* The last step, once the device let go of its pages: they go back (and an emptied arena with
 * them, but one kept for the next allocation). The caller frees a (now: the job copied what
 * it needs). Punching a run of [cache] async_bytes or more takes ~100 ms a GiB, so a worker
 * does it (memory.workers) and the run goes back on the loop after: then -EINPROGRESS, and
 * done(arg) runs on the loop once it is back (allocated_bytes counts it until then); with
 * done NULL, or on the loop, 0 once it is back. */
int allocation_release(struct memory *m, struct allocation *a, void (*done)(void *arg),
		       void *arg);
