/* SPDX-License-Identifier: MIT */
/* The layout of a domain's status page: a small memfd mrd writes and its clients map
 * read-only. Clients compare generation with the value they cached on every lookup: one load.
 * Fields only ever get appended; layout_version says how many a reader may trust. */
#pragma once

#include <stdint.h>

#define MRD_STATUS_MAGIC 0x315441545344524dULL /* "MRDSTAT1", little-endian */
#define MRD_STATUS_LAYOUT 1
#define MRD_STATUS_PAGE_SIZE 4096u

struct mrd_status_page {
	uint64_t magic;
	uint32_t layout_version;
	uint32_t size;
	uint64_t generation; /* bumped whenever keys of the domain die (registered memory freed) */
	uint64_t allocated_bytes;
	uint64_t pinned_bytes;
	uint64_t allocations;
	uint64_t arenas;
	uint64_t clients;
	uint64_t frees; /* free events since the domain opened */
};

_Static_assert(sizeof(struct mrd_status_page) <= MRD_STATUS_PAGE_SIZE, "status page too big");
