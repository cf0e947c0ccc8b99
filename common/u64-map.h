/* SPDX-License-Identifier: MIT */
/* A hash map from non-zero 64-bit keys to pointers: open addressing, linear probing,
 * backward-shift deletion (no tombstones), grows at 50% load. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct u64_map {
	uint64_t *keys; /* 0: empty slot */
	void **values;
	size_t cap;     /* a power of two, or 0 */
	size_t n;
};

void u64_map_done(struct u64_map *m);
/* -EEXIST when key is there already; -EINVAL for key 0. */
int u64_map_put(struct u64_map *m, uint64_t key, void *value);
void *u64_map_get(const struct u64_map *m, uint64_t key);
/* Removes and returns the value, NULL when absent. */
void *u64_map_remove(struct u64_map *m, uint64_t key);
