/* SPDX-License-Identifier: MIT */
/* A sorted table of registered ranges, searched by address: DPDK's MR "btree". Entry 0 is a
 * sentinel below every address, so a search always lands on a valid slot; inserts memmove;
 * the table doubles up to a ceiling, past which it marks itself overflowed and its owner falls
 * back to a slower search until a rebuild. Used by mrd's global cache and by libmrd's bottom
 * half.
 *
 * A directory in front of the search narrows it: the span from the first start to the last
 * end is cut into 2^k equal buckets (about two per entry) and each bucket keeps the index of
 * the entry holding its first byte, so an address's entry lies between its bucket's index and
 * the next bucket's. The search then bisects only that stretch, in a fixed number of steps —
 * the longest stretch of the table, rounded up to a power of two — over a dense array of the
 * starts. Spread-out entries take one or two steps instead of log2(n); entries crowded into
 * one bucket take as many as a plain bisection. Addresses below the first start bisect from
 * the sentinel to bucket 0's index, where entries inserted below it since land.
 *
 * An insert or remove updates the directory in place: the buckets past the entry shift their
 * index by one (or, when fewer, those before it shift back and an offset moves them all), and
 * the stretch it lands in may need one more step. Its shape (base, buckets, span) stays until
 * a rebuild, made once the changes since the last pass a sixteenth of the entries (amortised
 * O(1) an entry), so that the buckets keep fitting the entries and crowding does not build up.
 * All of it happens in room allocated with the entries, so that it never fails; lookups only
 * read. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mr_entry {
	uint64_t start, end; /* [start, end) */
	uint32_t lkey, rkey;
};

struct mr_table {
	struct mr_entry *e; /* e[0] is the sentinel */
	size_t n;           /* entries, sentinel included */
	size_t cap, max_cap;
	bool overflow;
	/* The search index (see above). */
	uint64_t *starts;   /* e[i].start, then UINT64_MAX up to n + 2^steps */
	uint32_t *dir;      /* dir_last + 1 buckets, each plus dir_off (mod 2^32) */
	uint64_t base;      /* e[1].start when rebuilt */
	unsigned shift;     /* bucket = (addr - base) >> shift, capped at the last */
	uint32_t dir_last;  /* buckets - 1, a power of two less one */
	unsigned steps;     /* bisection steps in a bucket's stretch */
	uint32_t dir_off;   /* added to every bucket: an update moves the fewer buckets */
	size_t index_cap;   /* starts allocated (with the entries: 3 cap + 1) */
	size_t dir_cap;     /* dir allocated */
	size_t changes;     /* inserts and removes since the index was last rebuilt */
	size_t builds;      /* rebuilds so far (tests count them) */
};

/* max_cap: the most entries it may grow to (0: no ceiling). */
int mr_table_init(struct mr_table *t, size_t cap, size_t max_cap);
void mr_table_done(struct mr_table *t);
/* Back to the sentinel alone; overflow cleared. */
void mr_table_clear(struct mr_table *t);

/* Index of the last entry with start <= addr (0: the sentinel). */
static inline size_t mr_table_floor(const struct mr_table *t, uint64_t addr)
{
	uint64_t bucket;
	size_t i;

	if (addr < t->base) {
		i = 0; /* what was inserted below base since the last rebuild */
	} else {
		bucket = (addr - t->base) >> t->shift;
		if (bucket > t->dir_last)
			bucket = t->dir_last;
		i = (uint32_t)(t->dir[bucket] + t->dir_off);
	}
	/* The answer is in [i, i + 2^steps): the next bucket's index is at most that far on,
	 * and every start past the answer is above addr (the padding too). */
	for (size_t half = (size_t)1 << t->steps >> 1; half > 0; half >>= 1)
		i = t->starts[i + half] <= addr ? i + half : i;
	/* The padding is UINT64_MAX: only addr UINT64_MAX walks into it. */
	return i < t->n ? i : t->n - 1;
}

/* The entry holding addr, NULL when none does. */
static inline const struct mr_entry *mr_table_lookup(const struct mr_table *t, uint64_t addr)
{
	const struct mr_entry *e = &t->e[mr_table_floor(t, addr)];

	return addr < e->end ? e : NULL;
}

/* Inserts an entry that overlaps none. -EEXIST when its start is there already; -ENOSPC (and
 * overflow set) when the table is full. */
int mr_table_insert(struct mr_table *t, const struct mr_entry *entry);

/* Inserts n entries that overlap none, rebuilding the index once (n > 1). Stops at the first
 * failure (as mr_table_insert) and returns it; the ones before it are in. */
int mr_table_insert_many(struct mr_table *t, const struct mr_entry *entries, size_t n);

/* Removes the entry starting at start; -ENOENT when there is none. */
int mr_table_remove(struct mr_table *t, uint64_t start);

/* Removes every entry overlapping [start, end) (start < end); returns how many. */
size_t mr_table_remove_range(struct mr_table *t, uint64_t start, uint64_t end);
