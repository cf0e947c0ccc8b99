/* SPDX-License-Identifier: MIT */
/* An arena: a memfd (hugetlb 2 MiB pages where the host has them, else 4 KiB pages), sealed
 * against growing and shrinking, mapped MAP_SHARED at a fixed place in the window, with a
 * buddy allocator over its pages. External arenas wrap a client's own memfd instead. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "memory/buddy.h"

struct allocation;
struct memory;

struct arena {
	struct memory *mem; /* its domain's */
	LIST_ENTRY(arena) link;
	uint32_t id;        /* its first window slot: unique while it lives */
	uint64_t serial;    /* unique for the life of mrd: ids are reused, serials never */
	uint32_t n_slots;
	int memfd;
	uint8_t *base;
	uint64_t size;
	uint64_t file_offset; /* external: where the mapping starts in the memfd */
	uint32_t page_size;
	bool hugetlb;
	bool external;      /* a client's memfd, attached whole */
	struct buddy buddy; /* pages of mrd-made arenas */
	unsigned n_allocations;
	struct allocation **runs; /* its live allocations, by offset */
	size_t n_runs, runs_cap;
};

/* A new arena of at least min_size bytes in m's part of the window. Like arena_new_external,
 * -EDQUOT when m's arenas would take more than config_window_bytes of the window. */
int arena_new(struct memory *m, uint64_t min_size, bool hugetlb, struct arena **ret);

/* Maps [offset, offset + length) of a client's memfd (consumed on success) into the window.
 * The memfd must be sealed against shrinking so it can never vanish under a mapping (-EPERM),
 * and not against writes (-EROFS: the mapping is writable); -EACCES when it was opened
 * read-only. */
int arena_new_external(struct memory *m, int memfd, uint64_t offset, uint64_t length,
		       struct arena **ret);

/* Where an arena of the previous mrd was, and what it was (warm restart). */
struct arena_place {
	uint32_t slot;
	uint64_t size, file_offset, serial;
	uint32_t page_size;
	bool hugetlb, external;
};

/* Maps the previous mrd's arena memfd (consumed on success) back at its slots, all its pages
 * in use until arena_adopt_finish. -EINVAL when the memfd is not what place says, -EEXIST when
 * its slots are taken, -EPERM when it is sealed against writes (an attached memfd's owner may
 * add F_SEAL_FUTURE_WRITE at any time: mmap refuses a writable mapping). */
int arena_adopt(struct memory *m, int memfd, const struct arena_place *place, struct arena **ret);
/* Its adopted allocations are all recorded: the pages between them become free. -EINVAL for
 * an attached memfd that is not one whole allocation. */
int arena_adopt_finish(struct arena *a);

/* Unmaps it, gives its slots back and closes the memfd. NULL-safe; returns NULL. */
struct arena *arena_free(struct arena *a);

/* A page run for size bytes aligned to align (both rounded up to pages); the pages are backed
 * before the run is handed out (hugetlb: -ENOMEM when the host has no free huge page). */
int arena_alloc(struct arena *a, uint64_t size, uint64_t align, uint64_t *ret_offset,
		uint64_t *ret_length);

/* Returns a run to the allocator and its pages to the kernel (arena_punch, arena_return). */
void arena_release(struct arena *a, uint64_t offset, uint64_t length);
/* Gives the pages of a run out of the allocator back to the kernel, so the next owner starts
 * from zeros: it touches nothing else of a, so a worker may do it while the loop goes on. */
void arena_punch(const struct arena *a, uint64_t offset, uint64_t length);
/* Returns a run, punched or kept, to the allocator. */
void arena_return(struct arena *a, uint64_t offset, uint64_t length);

/* The huge pages of hugetlb arenas: 2 MiB. */
#define HUGE_PAGE_SIZE (2u << 20)

/* Free huge pages of the default size on this host, 0 when none (or unknown). */
uint64_t hugepages_free(void);
