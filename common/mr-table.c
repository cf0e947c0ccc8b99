/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mr-table.h"

int mr_table_init(struct mr_table *t, size_t cap, size_t max_cap)
{
	*t = (struct mr_table){ .cap = cap < 2 ? 2 : cap, .max_cap = max_cap };
	t->e = calloc(t->cap, sizeof(*t->e));
	if (!t->e)
		return -ENOMEM;
	t->n = 1; /* the sentinel: [0, 0) holds nothing */
	return 0;
}

void mr_table_done(struct mr_table *t)
{
	free(t->e);
	*t = (struct mr_table){};
}

void mr_table_clear(struct mr_table *t)
{
	t->n = 1;
	t->overflow = false;
}

size_t mr_table_floor(const struct mr_table *t, uint64_t addr)
{
	const struct mr_entry *base = t->e;
	size_t n = t->n;

	/* base->start <= addr always (the sentinel's 0 is), and the answer is in [base, base + n).
	 * The step depends on n alone, so each level is a load, a compare and a conditional
	 * move, with no index arithmetic waiting on the previous level. */
	while (n > 1) {
		size_t half = n / 2;

		base = base[half].start <= addr ? base + half : base;
		n -= half;
	}
	return (size_t)(base - t->e);
}

const struct mr_entry *mr_table_lookup(const struct mr_table *t, uint64_t addr)
{
	const struct mr_entry *e = &t->e[mr_table_floor(t, addr)];

	return addr < e->end ? e : NULL;
}

int mr_table_insert(struct mr_table *t, const struct mr_entry *entry)
{
	size_t at;

	if (t->n == t->cap) {
		size_t cap = t->cap * 2;
		struct mr_entry *e;

		if (t->max_cap && cap > t->max_cap)
			cap = t->max_cap;
		e = cap > t->cap ? realloc(t->e, cap * sizeof(*e)) : NULL;
		if (!e) {
			t->overflow = true;
			return -ENOSPC;
		}
		t->e = e;
		t->cap = cap;
	}
	at = mr_table_floor(t, entry->start);
	if (at > 0 && t->e[at].start == entry->start)
		return -EEXIST;
	at++;
	memmove(&t->e[at + 1], &t->e[at], (t->n - at) * sizeof(*t->e));
	t->e[at] = *entry;
	t->n++;
	return 0;
}

int mr_table_remove(struct mr_table *t, uint64_t start)
{
	size_t at = mr_table_floor(t, start);

	if (at == 0 || t->e[at].start != start)
		return -ENOENT;
	memmove(&t->e[at], &t->e[at + 1], (t->n - at - 1) * sizeof(*t->e));
	t->n--;
	return 0;
}
