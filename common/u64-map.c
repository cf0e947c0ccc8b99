/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "u64-map.h"

static size_t slot_of(const struct u64_map *m, uint64_t key)
{
	key ^= key >> 33; /* murmur3's finaliser: spreads page-aligned addresses */
	key *= 0xff51afd7ed558ccdULL;
	key ^= key >> 33;
	return (size_t)key & (m->cap - 1);
}

void u64_map_done(struct u64_map *m)
{
	free(m->keys);
	free(m->values);
	*m = (struct u64_map){};
}

static int grow(struct u64_map *m)
{
	struct u64_map bigger = { .cap = m->cap ? m->cap * 2 : 16 };

	bigger.keys = calloc(bigger.cap, sizeof(uint64_t));
	bigger.values = calloc(bigger.cap, sizeof(void *));
	if (!bigger.keys || !bigger.values) {
		u64_map_done(&bigger);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->cap; i++)
		if (m->keys[i])
			(void)u64_map_put(&bigger, m->keys[i], m->values[i]);
	u64_map_done(m);
	*m = bigger;
	return 0;
}

int u64_map_put(struct u64_map *m, uint64_t key, void *value)
{
	size_t i;

	if (key == 0)
		return -EINVAL;
	if ((m->n + 1) * 2 > m->cap) {
		int r = grow(m);
		if (r < 0)
			return r;
	}
	for (i = slot_of(m, key); m->keys[i]; i = (i + 1) & (m->cap - 1))
		if (m->keys[i] == key)
			return -EEXIST;
	m->keys[i] = key;
	m->values[i] = value;
	m->n++;
	return 0;
}

void *u64_map_get(const struct u64_map *m, uint64_t key)
{
	if (!m->cap || key == 0)
		return NULL;
	for (size_t i = slot_of(m, key); m->keys[i]; i = (i + 1) & (m->cap - 1))
		if (m->keys[i] == key)
			return m->values[i];
	return NULL;
}

void *u64_map_remove(struct u64_map *m, uint64_t key)
{
	size_t i, j;
	void *value;

	if (!m->cap || key == 0)
		return NULL;
	for (i = slot_of(m, key); m->keys[i] != key; i = (i + 1) & (m->cap - 1))
		if (!m->keys[i])
			return NULL;
	value = m->values[i];
	m->n--;
	/* Shift later members of the probe run back so lookups never stop at a hole. */
	for (j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
		size_t home = slot_of(m, m->keys[j]);

		/* Move j to i when its home lies cyclically outside (i, j]. */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			m->keys[i] = m->keys[j];
			m->values[i] = m->values[j];
			i = j;
		}
	}
	m->keys[i] = 0;
	m->values[i] = NULL;
	return value;
}
