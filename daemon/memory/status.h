/* SPDX-License-Identifier: MIT */
/* A domain's status page (its layout: common/status-page.h): a memfd written here alone,
 * mapped read-only by every client of the domain. */
#pragma once

#include <stdint.h>

#include "status-page.h"

struct status_page {
	int fd; /* memfd; clients map it read-only */
	struct mrd_status_page *page;
};

/* A sealed page named after the domain, at generation (1, or above what a previous mrd's
 * domain of that name reached). */
int status_page_open(struct status_page *s, const char *name, uint64_t generation);
void status_page_close(struct status_page *s);

/* A new read-only descriptor of the page, for a client. */
int status_page_fd(const struct status_page *s);

/* Every client of the domain learns of memory (or keys) going away by one load of this: the
 * only place the generation moves. Keys of [start, end) died: clients drop what they cached of
 * it (the ring of status-page.h). One writer: the loop (the ring's record and the generation
 * are written apart, not by one atomic step). */
void status_page_bump_range(struct status_page *s, uint64_t start, uint64_t end);
/* Keys of anything may have died (a flush, a restart): clients drop everything. */
void status_page_bump(struct status_page *s);

/* The domain's PD was replaced (common/status-page.h, layout 3). */
static inline void status_page_bump_pd_epoch(struct status_page *s)
{
	__atomic_store_n(&s->page->pd_epoch, s->page->pd_epoch + 1, __ATOMIC_RELEASE);
}

static inline uint64_t status_page_generation(const struct status_page *s)
{
	return __atomic_load_n(&s->page->generation, __ATOMIC_ACQUIRE);
}
