/* SPDX-License-Identifier: MIT */
/* The page-run allocator of one arena: a binary buddy system over page numbers. A request
 * takes the smallest block that fits (and meets the alignment), then gives the unused tail
 * back, so a run costs exactly its pages; freeing coalesces with free buddies. O(log n) per
 * block; the bookkeeping lives in mrd's own memory, never in the shared pages. */
#pragma once

#include <stdint.h>

struct buddy {
	uint32_t n_pages;   /* a power of two */
	unsigned max_order; /* log2(n_pages) */
	uint32_t free_pages;
	uint32_t *next, *prev;  /* free-list links, valid at free block heads */
	uint8_t *head_order;    /* order + 1 at a free block's first page, else 0 */
	uint32_t heads[33];     /* first free block of each order; UINT32_MAX: none */
};

#define BUDDY_NONE UINT32_MAX

/* n_pages must be a power of two (1 .. 2^31). All pages start free. */
int buddy_init(struct buddy *b, uint32_t n_pages);
/* The same with every page in use: a warm restart rebuilds an arena's allocator by freeing
 * the gaps between the runs it adopted (buddy_free takes any run). */
int buddy_init_used(struct buddy *b, uint32_t n_pages);
void buddy_done(struct buddy *b);

/* A run of n pages whose first page is a multiple of align (a power of two, in pages).
 * Returns the first page, or -ENOMEM when no such run is free. */
int64_t buddy_alloc(struct buddy *b, uint32_t n, uint32_t align);

/* Returns [first, first + n) to the free pool: a run from buddy_alloc, or pages in use since
 * buddy_init_used. */
void buddy_free(struct buddy *b, uint32_t first, uint32_t n);
