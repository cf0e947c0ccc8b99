/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mr-table.h"

#define DIR_MAX_BITS 24 /* 16 M buckets: past 8 M entries they get crowded, not wrong */

static unsigned log2_ceil(uint64_t x)
{
	unsigned b = 0;

	while (b < 63 && ((uint64_t)1 << b) < x)
		b++;
	return b;
}

/* The index for up to cap entries, allocated with them so that building it never fails:
 * starts needs n + 2^steps <= 3n slots, the directory 2^(log2(n) + 1) buckets at most. */
static int index_reserve(struct mr_table *t, size_t cap)
{
	unsigned bits = log2_ceil(cap) + 1;
	size_t n_starts = 3 * cap + 1;
	size_t n_dir = (size_t)1 << (bits > DIR_MAX_BITS ? DIR_MAX_BITS : bits);

	if (n_starts > t->index_cap) {
		uint64_t *s = realloc(t->starts, n_starts * sizeof(*s));

		if (!s)
			return -ENOMEM;
		t->starts = s;
		t->index_cap = n_starts;
	}
	if (n_dir > t->dir_cap) {
		uint32_t *d = realloc(t->dir, n_dir * sizeof(*d));

		if (!d)
			return -ENOMEM;
		t->dir = d;
		t->dir_cap = n_dir;
	}
	return 0;
}

/* Rebuilds the directory and the starts from the entries, in the room index_reserve() made. */
static void index_build(struct mr_table *t)
{
	size_t n = t->n, real = n - 1, i, longest = 1;
	unsigned bits = real > 0 ? log2_ceil(real) + 1 : 0, shift, steps;
	uint64_t base = real > 0 ? t->e[1].start : UINT64_MAX, span;
	size_t buckets;

	if (bits > DIR_MAX_BITS)
		bits = DIR_MAX_BITS;
	buckets = (size_t)1 << bits;
	span = real > 0 ? t->e[n - 1].end - base : 1;
	shift = log2_ceil(span) > bits ? log2_ceil(span) - bits : 0;

	/* The directory: for each bucket, the last entry starting at or below its first byte
	 * (a merge walk: buckets and entries both ascend). */
	i = real > 0 ? 1 : 0;
	for (size_t b = 0; b < buckets; b++) {
		uint64_t first = base + ((uint64_t)b << shift);

		if ((uint64_t)b << shift >> shift != b || first < base)
			first = UINT64_MAX; /* past the address space */
		while (i + 1 < n && t->e[i + 1].start <= first)
			i++;
		t->dir[b] = (uint32_t)i;
	}
	/* The longest stretch a bisection must cover: from a bucket's index to the next's
	 * (the last bucket's runs to the last entry). */
	for (size_t b = 0; b < buckets; b++) {
		size_t next = b + 1 < buckets ? t->dir[b + 1] : n - 1;

		if (next - t->dir[b] + 1 > longest)
			longest = next - t->dir[b] + 1;
	}
	steps = log2_ceil(longest);
	for (i = 0; i < n; i++)
		t->starts[i] = t->e[i].start;
	for (; i < n + ((size_t)1 << steps); i++)
		t->starts[i] = UINT64_MAX;
	t->base = base;
	t->shift = shift;
	t->dir_last = (uint32_t)(buckets - 1);
	t->steps = steps;
	t->dir_off = 0;
	t->changes = 0;
	t->builds++;
}

/* Adds delta to each of [d, end), 32 bytes at a time: the pass is as long as the entries'
 * memmove, and -O2 leaves a plain loop scalar. */
static void dir_add(uint32_t *d, uint32_t *end, uint32_t delta)
{
	typedef uint32_t u32x4 __attribute__((vector_size(16)));

	for (; end - d >= 8; d += 8) {
		u32x4 v[2];

		memcpy(v, d, sizeof(v));
		v[0] += delta;
		v[1] += delta;
		memcpy(d, v, sizeof(v));
	}
	for (; d < end; d++)
		*d += delta;
}

/* The index after entry at was inserted (delta 1) or removed (-1), the entries moved already:
 * the starts follow them, each bucket whose first byte is at or past start points one on (or
 * back), and the stretch start falls in (below base: from the sentinel to bucket 0's index)
 * may need one more step. */
static void index_update(struct mr_table *t, size_t at, uint64_t start, int delta)
{
	size_t n = t->n, b0, lo, hi, pad = (size_t)1 << t->steps;

	if (delta > 0) {
		/* the padding moves along; one more of it at the end */
		memmove(&t->starts[at + 1], &t->starts[at], (n - 1 - at) * sizeof(*t->starts));
		t->starts[at] = start;
		t->starts[n - 1 + pad] = UINT64_MAX;
	} else {
		memmove(&t->starts[at], &t->starts[at + 1], (n - at) * sizeof(*t->starts));
		t->starts[n] = UINT64_MAX;
	}
	/* Bucket b begins at base + (b << shift): the first at or past start. */
	b0 = start <= t->base ? 0 : ((start - t->base - 1) >> t->shift) + 1;
	if (b0 > (size_t)t->dir_last + 1)
		b0 = (size_t)t->dir_last + 1; /* past the last bucket's first byte */
	/* The buckets from b0 on move by delta: these, or the others back and all with them
	 * (dir_off), whichever are fewer. */
	if (t->dir_last + 1 - b0 <= b0) {
		dir_add(&t->dir[b0], &t->dir[t->dir_last + 1], (uint32_t)delta);
	} else {
		dir_add(&t->dir[0], &t->dir[b0], (uint32_t)-delta);
		t->dir_off += (uint32_t)delta;
	}
	if (delta < 0)
		return; /* stretches only shrank */
	/* The stretch that grew: the bucket before b0's, or below base. */
	lo = b0 == 0 ? 0 : (uint32_t)(t->dir[b0 - 1] + t->dir_off);
	hi = b0 <= t->dir_last ? (uint32_t)(t->dir[b0] + t->dir_off) : n - 1;
	if (hi - lo + 1 > pad) {
		t->steps++;
		for (size_t i = n; i < n + 2 * pad; i++)
			t->starts[i] = UINT64_MAX;
	}
}

/* After a change: in place, or rebuilt once the changes since the last rebuild are many
 * enough to pay for it. */
static void index_changed(struct mr_table *t, size_t at, uint64_t start, int delta)
{
	if (++t->changes > t->n / 16 + 16)
		index_build(t);
	else
		index_update(t, at, start, delta);
}

int mr_table_init(struct mr_table *t, size_t cap, size_t max_cap)
{
	*t = (struct mr_table){ .cap = cap < 2 ? 2 : cap, .max_cap = max_cap };
	t->e = calloc(t->cap, sizeof(*t->e));
	if (!t->e || index_reserve(t, t->cap) < 0) {
		mr_table_done(t);
		return -ENOMEM;
	}
	t->n = 1; /* the sentinel: [0, 0) holds nothing */
	index_build(t);
	return 0;
}

void mr_table_done(struct mr_table *t)
{
	free(t->e);
	free(t->starts);
	free(t->dir);
	*t = (struct mr_table){};
}

void mr_table_clear(struct mr_table *t)
{
	t->n = 1;
	t->overflow = false;
	index_build(t);
}

/* Index of the last entry with start <= addr, by bisecting the entries themselves: for
 * inserts, which may run while the index is behind. */
static size_t floor_plain(const struct mr_table *t, uint64_t addr)
{
	size_t lo = 0, n = t->n;

	while (n > 1) {
		size_t half = n / 2;

		lo = t->e[lo + half].start <= addr ? lo + half : lo;
		n -= half;
	}
	return lo;
}

/* The entry in place, the index not yet: 0 (its index in *ret_at) or -errno. */
static int insert_entry(struct mr_table *t, const struct mr_entry *entry, size_t *ret_at)
{
	size_t at;

	if (t->n == t->cap) {
		size_t cap = t->cap * 2;
		struct mr_entry *e;

		if (t->max_cap && cap > t->max_cap)
			cap = t->max_cap;
		/* The index's room first: entries without it could not be searched. */
		e = cap > t->cap && index_reserve(t, cap) == 0 ? realloc(t->e, cap * sizeof(*e)) :
								  NULL;
		if (!e) {
			t->overflow = true;
			return -ENOSPC;
		}
		t->e = e;
		t->cap = cap;
	}
	at = floor_plain(t, entry->start);
	if (at > 0 && t->e[at].start == entry->start)
		return -EEXIST;
	at++;
	memmove(&t->e[at + 1], &t->e[at], (t->n - at) * sizeof(*t->e));
	t->e[at] = *entry;
	t->n++;
	*ret_at = at;
	return 0;
}

int mr_table_insert(struct mr_table *t, const struct mr_entry *entry)
{
	size_t at;
	int r = insert_entry(t, entry, &at);

	if (r == 0)
		index_changed(t, at, entry->start, 1);
	return r;
}

int mr_table_insert_many(struct mr_table *t, const struct mr_entry *entries, size_t n)
{
	size_t done, at;
	int r = 0;

	if (n == 1)
		return mr_table_insert(t, entries);
	for (done = 0; done < n && r == 0; done++)
		r = insert_entry(t, &entries[done], &at);
	index_build(t);
	return r;
}

int mr_table_remove(struct mr_table *t, uint64_t start)
{
	size_t at = mr_table_floor(t, start);

	if (at == 0 || t->e[at].start != start)
		return -ENOENT;
	memmove(&t->e[at], &t->e[at + 1], (t->n - at - 1) * sizeof(*t->e));
	t->n--;
	index_changed(t, at, start, -1);
	return 0;
}

size_t mr_table_remove_range(struct mr_table *t, uint64_t start, uint64_t end)
{
	size_t first = mr_table_floor(t, start), last;

	/* The entry holding start overlaps; the sentinel and one ending at or below start do not. */
	if (first == 0 || t->e[first].end <= start)
		first++;
	for (last = first; last < t->n && t->e[last].start < end; last++)
		;
	if (last - first == 1)
		(void)mr_table_remove(t, t->e[first].start);
	else if (last > first) {
		/* Several: one move, and the index built once. */
		memmove(&t->e[first], &t->e[last], (t->n - last) * sizeof(*t->e));
		t->n -= last - first;
		index_build(t);
	}
	return last - first;
}
