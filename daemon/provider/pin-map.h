/* SPDX-License-Identifier: MIT */
/* Counts how many registrations pin each page of the process, so that overlapping
 * registrations lock a page once and unlock it only when the last one goes (mlock does not
 * count). Ranges are page-aligned [start, end). */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct pin_seg {
	uintptr_t start, end;
	unsigned count;
};

struct pin_map {
	struct pin_seg *segs; /* sorted, disjoint; adjacent segments differ in count */
	size_t n, cap;
	struct pin_seg *spare, *changed; /* cap each: room for the next change */
	size_t pins;                     /* ranges pinned and not unpinned */
	uint64_t pinned_bytes;
	/* mlock/munlock by default; tests inject their own. Return 0 or -errno. */
	int (*lock)(uintptr_t start, size_t len);
	int (*unlock)(uintptr_t start, size_t len);
};

void pin_map_init(struct pin_map *m);
/* Unlocks everything still pinned. */
void pin_map_done(struct pin_map *m);

/* Pins [start, end): locks the pages nobody pinned yet. On failure nothing changes. */
int pin_map_pin(struct pin_map *m, uintptr_t start, uintptr_t end);

/* Undoes one pin of [start, end); unlocks pages whose count drops to zero. Needs no memory
 * when [start, end) was pinned as one range. -EINVAL when part of the range is not pinned
 * (nothing changes then). */
int pin_map_unpin(struct pin_map *m, uintptr_t start, uintptr_t end);

/* The bytes of [start, end) that no pin covers. */
uint64_t pin_map_unpinned_bytes(const struct pin_map *m, uintptr_t start, uintptr_t end);

/* How many times addr's page is pinned. */
unsigned pin_map_count(const struct pin_map *m, uintptr_t addr);
