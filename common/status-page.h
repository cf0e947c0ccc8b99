/* SPDX-License-Identifier: MIT */
/* The layout of a domain's status page: a small memfd mrd writes and its clients map
 * read-only. Clients compare generation with the value they cached on every lookup: one load.
 * Fields only ever get appended; layout_version says how many a reader may trust.
 *
 * Layout 2 adds a ring of what each of the last MRD_STATUS_FREED generations made stale: the
 * record of generation g, in freed[g % MRD_STATUS_FREED], is written before generation moves
 * to g (release), its own generation last (a sequence: 0 while the range is written). A client
 * that cached at c and now sees g drops only the entries overlapping the records c+1..g when
 * each reads back with its own generation before and after; otherwise (the ring lapped, an
 * older page, a reconnect) it drops everything. A change that is no range of memory (a flush,
 * a restart) records [0, UINT64_MAX).
 *
 * Layout 3 adds pd_epoch: bumped when the domain's device context and PD are replaced (the
 * device came back after a failure). A client that imported the PD (ExportPd) at another
 * pd_epoch holds the failed context: mrd's keys are not for its PD. */
#pragma once

#include <stdint.h>

#define MRD_STATUS_MAGIC 0x315441545344524dULL /* "MRDSTAT1", little-endian */
#define MRD_STATUS_LAYOUT 3
#define MRD_STATUS_PAGE_SIZE 4096u
#define MRD_STATUS_FREED 64 /* records in the ring: frees a client may miss yet still keep the rest */

/* What generation made stale: keys of [start, end). */
struct mrd_status_freed {
	uint64_t generation; /* whose record this is; 0 while being written */
	uint64_t start, end;
};

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
	/* layout 2 */
	struct mrd_status_freed freed[MRD_STATUS_FREED];
	/* layout 3 */
	uint64_t pd_epoch; /* PD replacements since the domain opened (release; the loop writes) */
};

_Static_assert(sizeof(struct mrd_status_page) <= MRD_STATUS_PAGE_SIZE, "status page too big");
