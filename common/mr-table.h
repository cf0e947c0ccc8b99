/* SPDX-License-Identifier: MIT */
/* A sorted table of registered ranges, searched by address: DPDK's MR "btree". Entry 0 is a
 * sentinel below every address, so a binary search always lands on a valid slot; inserts
 * memmove; the table doubles up to a ceiling, past which it marks itself overflowed and its
 * owner falls back to a slower search until a rebuild. Used by mrd's global cache and by
 * libmrd's bottom half. */
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
};

/* max_cap: the most entries it may grow to (0: no ceiling). */
int mr_table_init(struct mr_table *t, size_t cap, size_t max_cap);
void mr_table_done(struct mr_table *t);
/* Back to the sentinel alone; overflow cleared. */
void mr_table_clear(struct mr_table *t);

/* The entry holding addr, NULL when none does. */
const struct mr_entry *mr_table_lookup(const struct mr_table *t, uint64_t addr);
/* Index of the last entry with start <= addr (0: the sentinel). */
size_t mr_table_floor(const struct mr_table *t, uint64_t addr);

/* Inserts an entry that overlaps none. -EEXIST when its start is there already; -ENOSPC (and
 * overflow set) when the table is full. */
int mr_table_insert(struct mr_table *t, const struct mr_entry *entry);

/* Removes the entry starting at start; -ENOENT when there is none. */
int mr_table_remove(struct mr_table *t, uint64_t start);
