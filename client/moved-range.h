/* SPDX-License-Identifier: MIT */
/* A program's buffer moved onto mrd's memory at its own address: the pages [start, end) are
 * copied into an allocation of mrd's (AllocRequest.alias) and that allocation is mapped over
 * them, so the program sees the same bytes at the same address while mrd pins and registers
 * them in the program's own PD (the keys use the program's addresses). Moved ranges never
 * overlap; the registry keeps them sorted. Moving back copies the pages onto private memory
 * again before mrd's memory goes. Callers hold the shim's lock.
 * A heap neighbour (another buffer whose pages hold part of a moved one) is served by the same
 * allocation: it has room around the moved pages, so the range grows onto the neighbour's
 * other pages, and the neighbour's bytes become one more span of it (AliasSpanRequest), whose
 * MRs cover that buffer alone. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mrd/mrd.h>

/* The keys one PD has for a span of a range (a PD's MR over all of it). */
struct range_keys {
	struct range_keys *next;
	const void *pd;
	unsigned span;
	uint32_t lkey, rkey;
};

/* Most buffers one range serves (mrd's spans of an allocation). */
#define RANGE_SPANS_MAX 8

/* The bytes an MR covers: a buffer of the program's; start == end: a free slot. */
struct range_span {
	uintptr_t start, end;
	unsigned users; /* the program's registrations of it, live or kept (the shim's count) */
	bool dead;      /* mrd would not drop it: no buffer gets its keys, nor its bytes */
};

struct moved_range {
	uintptr_t start, end; /* the program's pages */
	/* The buffers on them: each the bytes MRs of their own cover. The first moved it. */
	struct range_span spans[RANGE_SPANS_MAX];
	unsigned n_spans;
	uintptr_t window;     /* the same pages at mrd's address (this process maps both) */
	uintptr_t base;       /* where mrd's allocation starts (in this process): what is freed */
	uintptr_t room_start, room_end; /* the program's addresses the allocation spans: start
					 * and end may grow to them */
	unsigned access;      /* what its MRs grant: the ibv_access_flags of the registration
			       * that moved it */
	unsigned live;        /* the program's registrations over it */
	unsigned kept;        /* those it deregistered that the shim keeps for a hit */
	uintptr_t brk_seen;   /* the program break when its pages were last seen whole */
	bool gone;            /* out of the registry (unmapped under live registrations): freed
			       * with its last one */
	struct range_keys *keys;
};

struct moved_ranges {
	struct moved_range **v;
	size_t n, cap;
	/* The bytes any range covers lie in [lo, hi): free() and munmap() of memory outside
	 * look no further, without the lock. Written under it. */
	uintptr_t lo, hi;
};

/* The only range overlapping [start, end), or NULL; *n how many overlap it. */
struct moved_range *moved_ranges_overlapping(struct moved_ranges *m, uintptr_t start,
					     uintptr_t end, unsigned *n);
/* Each range overlapping [start, end), in address order: fn may drop it. */
void moved_ranges_each_overlapping(struct moved_ranges *m, uintptr_t start, uintptr_t end,
				   void (*fn)(struct moved_range *r, void *arg), void *arg);

/* Moves the pages around [span_start, span_end) (the buffer, whose bytes alone its MRs will
 * cover) onto mrd's memory of mem; writes to them wait while they move (write-hold.h). 0;
 * -EOPNOTSUPP when they are no plain private memory or their writers cannot be held off (why
 * says what), -ENOMEM, or what mrd answered. */
int moved_range_move(struct moved_ranges *m, mrd_client *mem, uintptr_t span_start,
		     uintptr_t span_end, unsigned access, struct moved_range **ret, char *why,
		     size_t why_size);
/* Serves the buffer [span_start, span_end) whose pages overlap r's (a heap neighbour) from r:
 * its pages outside r are moved onto the room of r's allocation (writes to them wait, as in a
 * move) and r grows over them, and its bytes become a span of r. 0 with *span its index;
 * -EOPNOTSUPP (why says why) when it overlaps a span of r, its pages reach past r's room, r has
 * RANGE_SPANS_MAX spans, or its new pages cannot move; -ENOMEM, or what mrd answered. The
 * caller checked that no other range overlaps its pages and that r is intact. */
int moved_range_add_span(struct moved_ranges *m, mrd_client *mem, struct moved_range *r,
			 uintptr_t span_start, uintptr_t span_end, unsigned *span, char *why,
			 size_t why_size);
/* The span of r no registration uses any more (its buffer freed) goes, in mrd (its MRs) and
 * in r (its cached keys): a later buffer inside its bytes is a span of its own, its keys
 * reaching that buffer alone. Failing (why says why), it stays dead: no buffer there is
 * served from r. Not r's last span: r moves back then. */
int moved_range_drop_span(mrd_client *mem, struct moved_range *r, unsigned span, char *why,
			  size_t why_size);
/* The span of r holding all of [start, end), or -1. */
int moved_range_span_of(const struct moved_range *r, uintptr_t start, uintptr_t end);
/* Whether the program still sees mrd's pages over all of [start, end) of r. It is looked at
 * each time, whatever the shim saw: the allocator's own munmap and brk, and libraries that
 * call the kernel's munmap themselves (libfabric's memhooks), change memory behind its back.
 * With the program break where it was, the first page's entry in the page map tells (one
 * syscall); a moved break means every page is looked at again. */
bool moved_range_intact(struct moved_range *r, uintptr_t start, uintptr_t end);
/* Copies what of r the program still maps onto private memory again, then frees mrd's
 * memory (its MRs and keys go with it). r leaves the registry; it is freed unless live
 * registrations still point at it (then it is gone). */
void moved_range_move_back(struct moved_ranges *m, mrd_client *mem, struct moved_range *r);
/* The same where the program mapped none of it any more: no copy. */
void moved_range_forget(struct moved_ranges *m, mrd_client *mem, struct moved_range *r);
/* In a child of fork(), first of all: every range's pages become the child's private copy
 * (the parent keeps mrd's). */
void moved_ranges_fork_copy(struct moved_ranges *m);
/* Then: the registry forgets them without a word to mrd. */
void moved_ranges_fork_forget(struct moved_ranges *m);
/* Registers the shim's fork handlers around libmrd's (handle.h libmrd_init_once): copy, the
 * child's copy of the moved pages, before them, so that it runs first in the child, before
 * anything (libmrd's handler) writes pages that are still the parent's; prepare, parent and
 * child after them, so that fork() takes the shim's lock first, then libmrd's, as a
 * registration does. */
int moved_ranges_atfork(void (*copy)(void), void (*prepare)(void), void (*parent)(void),
			void (*child)(void));
/* Frees r once gone with no registration left. */
void moved_range_put(struct moved_range *r);
