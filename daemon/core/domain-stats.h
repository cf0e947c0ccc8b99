/* SPDX-License-Identifier: MIT */
/* What the views (control's Status, Clients, FrmrPools, DomainDump and the bus's Dump) show of
 * a domain, read here once: a snapshot of its figures, its pools' figures, and walks over its
 * arenas, MRs and mempools. The views encode them; none reads the domain's parts itself. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "registration/frmr-pool.h"
#include "registration/odp.h"

struct allocation;
struct arena;
struct domain;
struct pool_reg;
struct provider_mr;

/* A domain's figures at one moment of the loop. */
struct domain_stats {
	/* Its memory. */
	unsigned clients;
	uint64_t allocated_bytes;
	size_t allocations;
	unsigned waiting; /* allocations of the previous mrd waiting for their owners */
	unsigned arenas;
	uint64_t generation;
	/* Its registrations (the domain's PD; a client PD's are the client's). */
	uint64_t pinned_bytes;
	unsigned mrs; /* in its cache (domain_pd_mrs counts them all) */
	unsigned client_pd_mrs; /* live in its clients' own PDs (BindPd) */
	uint64_t client_pd_mr_bytes;
	uint64_t lookups, misses, registrations, deregistrations;
	bool table_overflow;
	uint32_t table_entries; /* 0 while it overflows */
	uint32_t table_capacity;
	struct odp_stats odp;
	unsigned odp_children; /* live */
	uint64_t quarantined_bytes; /* freed runs the device may still reach */
	unsigned quarantined_runs;
	/* Its handle pools. */
	const char *pools_off; /* why they are off, "" when on */
	size_t n_pools;
	struct frmr_pools_config pools_config;
	uint64_t pools_queued;
	bool keys_quarantine_on; /* released keys kept dead for a while */
	uint64_t keys_held, keys_unparked; /* held now, and let go of so far */
};

void domain_stats(struct domain *d, struct domain_stats *ret);
/* Copies the stats of up to max of d's pools, in key order; returns how many pools there are. */
size_t domain_pool_stats(struct domain *d, struct frmr_pool_stats *ret, size_t max);

/* The arena after prev (NULL: the first), NULL after the last. */
const struct arena *domain_next_arena(const struct domain *d, const struct arena *prev);
/* The mempool registration after prev (NULL: the first), NULL after the last. */
struct pool_reg *domain_next_mempool(const struct domain *d, const struct pool_reg *prev);

/* Where an MR of the domain's memory is. */
enum domain_mr_kind {
	DOMAIN_MR_CACHE,     /* the domain's PD's cache */
	DOMAIN_MR_CLIENT_PD, /* a client's own PD (BindPd) */
	DOMAIN_MR_ODP,       /* an on-demand child */
	DOMAIN_MR_MEMPOOL,
};
/* One MR: pmr NULL while a worker still makes it; sharers for a mempool MR, else 0. */
typedef void (*domain_mr_fn)(void *data, uint64_t start, uint64_t end,
			     const struct provider_mr *pmr, enum domain_mr_kind kind,
			     const struct allocation *a, uint32_t sharers);
/* Every MR of d: by arena, by allocation (its cache MRs, then its on-demand children), then
 * the mempools'. Client PDs' MRs only with client_pds. */
void domain_walk_mrs(struct domain *d, bool client_pds, domain_mr_fn fn, void *data);
/* The MRs mrd holds in d's PD, as domain_walk_mrs lists them without client_pds: the cache's,
 * on-demand children, mempools'. What views call a domain's MRs (one count, one meaning). */
unsigned domain_pd_mrs(struct domain *d);
