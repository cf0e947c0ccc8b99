/* SPDX-License-Identifier: MIT */
/* An allocation with what registration keeps of it: its MRs, the mempool MRs that hold it, its
 * on-demand children and the work on them, and how its free goes. Core allocates these (so
 * memory/allocation.h never names registration's structs); registration reaches the wrapper
 * from memory's allocation by reg_allocation_of. */
#pragma once

#include <stdbool.h>
#include <sys/queue.h>

#include "macro.h"
#include "provider/provider.h"
#include "memory/allocation.h"
#include "registration/mr-cache.h"

struct waiter;

struct reg_allocation {
	struct allocation mem;
	LIST_HEAD(, cached_mr) mrs; /* the cache's registrations inside it */
	unsigned pool_refs;         /* mempool MRs inside it: it cannot be freed while any are */
	LIST_HEAD(, pool_mr) pool_mrs; /* the live ones of those (not yet being deregistered) */
	LIST_HEAD(, pool_mr) pool_stuck; /* gone from their pools, kept by the device (a failed
					  * dereg): it is quarantined once freed */
	LIST_HEAD(, odp_child) odp_children; /* in the domain's table; once retired, its zombies
					      * whose MRs wait for odp_jobs */
	struct odp_slots *odp_slots; /* its children by chunk, once it had any (odp.h) */
	unsigned odp_jobs;          /* prefetch work waiting, queued or running on it, and
				     * its children's MRs going on workers */
	LIST_HEAD(, odp_child) odp_stuck; /* retired children the device kept (a failed dereg) */
	int dereg_error;            /* the first dereg over it that failed, once retired: then
				     * mrs holds the MRs the device kept, and the run is
				     * quarantined (registrar.h) */
	LIST_ENTRY(reg_allocation) quarantine_link; /* its registrar's quarantined runs */
	bool retired;               /* being freed: nobody finds it any more */
	unsigned bound_jobs;        /* client PDs' MRs over it that workers make or let go of */
	bool free_waits;            /* its free waits for odp_jobs, odp_children and bound_jobs */
	struct waiter *free_waiter;
};

static inline void reg_allocation_init(struct reg_allocation *ra)
{
	LIST_INIT(&ra->mrs);
	LIST_INIT(&ra->pool_mrs);
	LIST_INIT(&ra->odp_children);
	LIST_INIT(&ra->odp_stuck);
	LIST_INIT(&ra->pool_stuck);
}

static inline struct reg_allocation *reg_allocation_of(struct allocation *a)
{
	return a ? container_of(a, struct reg_allocation, mem) : NULL;
}

/* What registrations of memory may grant on a device with caps: all it grants (no remote
 * atomics where it has none), or reads alone. */
static inline unsigned registration_access(bool read_only, const struct provider_caps *caps)
{
	return read_only ? MRD_ACCESS_REMOTE_READ : provider_grantable_access(caps, MR_CACHE_ACCESS);
}

/* How registration treats an allocation's memory, read from memory's fields here alone.
 * Read-only is not a kind but a limit on access, which pinned and on-demand memory may both
 * have (reg_allocation_access); arenas attached from a client's memfd and orphans are
 * registered as any other memory. */
enum reg_kind {
	REG_KIND_PINNED,    /* MRs over runs of it, which pin their pages */
	REG_KIND_ON_DEMAND, /* the domain's: children the device faults in (odp.h); a client PD's:
			     * one on-demand MR where its device covers the access */
	REG_KIND_ALIAS,     /* a program's buffer (libmrd-preload.so): its process's PDs alone
			     * register it, over its span alone, with the access it asked */
};

static inline enum reg_kind reg_kind_of(const struct reg_allocation *ra)
{
	if (ra->mem.alias) /* never on demand: request_alloc refuses both */
		return REG_KIND_ALIAS;
	return ra->mem.odp ? REG_KIND_ON_DEMAND : REG_KIND_PINNED;
}

static inline unsigned reg_allocation_access(const struct reg_allocation *ra,
					     const struct provider_caps *caps)
{
	switch (reg_kind_of(ra)) {
	case REG_KIND_ALIAS: /* what it asked, no more */
		return provider_grantable_access(caps, ra->mem.alias_access);
	case REG_KIND_PINNED:
	case REG_KIND_ON_DEMAND:
		break;
	}
	return registration_access(ra->mem.read_only, caps);
}
