/* SPDX-License-Identifier: MIT */
#include <sys/queue.h>

#include "memory/arena.h"
#include "registration/mempool.h"
#include "registration/reg-allocation.h"
#include "core/domain-stats.h"
#include "core/domain.h"

void domain_stats(struct domain *d, struct domain_stats *ret)
{
	const struct mr_cache *cache = &d->reg.cache;
	struct domain_stats s = {
		.clients = d->n_users,
		.allocated_bytes = d->mem.allocated_bytes,
		.allocations = d->mem.allocations.n,
		.waiting = d->mem.n_orphans,
		.arenas = d->mem.n_arenas,
		.generation = domain_generation(d),
		.pinned_bytes = cache->charges.pinned_bytes,
		.mrs = cache->n_mrs,
		.lookups = cache->lookups,
		.misses = cache->misses,
		.registrations = cache->registrations,
		.deregistrations = cache->deregistrations,
		.table_overflow = cache->table.overflow,
		/* Less its sentinel. */
		.table_entries = cache->table.overflow ? 0 : (uint32_t)(cache->table.n - 1),
		.table_capacity = (uint32_t)cache->table.cap,
		.odp = d->reg.odp.stats,
		.odp_children = d->reg.odp.children,
		.quarantined_bytes = d->reg.quarantine.bytes,
		.quarantined_runs = d->reg.quarantine.n,
		.pools_off = d->reg.base.pools.off ? d->reg.base.pools.off : "",
		.n_pools = domain_pool_stats(d, NULL, 0),
	};
	const struct mr_cache *bound;

	LIST_FOREACH(bound, &cache->bound, bound_link) {
		s.client_pd_mrs += bound->n_mrs;
		s.client_pd_mr_bytes += mr_cache_bytes(bound);
	}
	frmr_pools_summary(&d->reg.base.pools, &s.pools_config, &s.pools_queued);
	key_quarantine_counts(&d->reg.base.pools.quarantine, &s.keys_quarantine_on, &s.keys_held,
			      &s.keys_unparked);
	*ret = s;
}

size_t domain_pool_stats(struct domain *d, struct frmr_pool_stats *ret, size_t max)
{
	return frmr_pools_stats(&d->reg.base.pools, ret, max);
}

const struct arena *domain_next_arena(const struct domain *d, const struct arena *prev)
{
	return prev ? LIST_NEXT(prev, link) : LIST_FIRST(&d->mem.arenas);
}

struct pool_reg *domain_next_mempool(const struct domain *d, const struct pool_reg *prev)
{
	return prev ? LIST_NEXT(prev, link) : LIST_FIRST(&d->reg.mempools.regs);
}

void domain_walk_mrs(struct domain *d, bool client_pds, domain_mr_fn fn, void *data)
{
	const struct arena *arena;
	const struct pool_mr *pm;

	LIST_FOREACH(arena, &d->mem.arenas, link)
		for (size_t i = 0; i < arena->n_runs; i++) {
			const struct reg_allocation *a = reg_allocation_of(arena->runs[i]);
			const struct cached_mr *mr;
			const struct odp_child *ch;

			LIST_FOREACH(mr, &a->mrs, alloc_link)
				if (mr->cache == &d->reg.cache)
					fn(data, mr->start, mr->end, mr->pmr, DOMAIN_MR_CACHE, &a->mem,
					   0);
				else if (client_pds)
					fn(data, mr->start, mr->end, mr->pmr, DOMAIN_MR_CLIENT_PD,
					   &a->mem, 0);
			LIST_FOREACH(ch, &a->odp_children, link)
				fn(data, ch->start, ch->end, ch->pmr, DOMAIN_MR_ODP, &a->mem, 0);
		}
	/* A worker may be writing a pending one's pmr. */
	LIST_FOREACH(pm, &d->reg.mempools.mrs, link)
		fn(data, pm->start, pm->end, pm->pending ? NULL : pm->pmr, DOMAIN_MR_MEMPOOL,
		   &pm->allocation->mem, pm->sharers);
}

static void count_mr(void *data, uint64_t start, uint64_t end, const struct provider_mr *pmr,
		     enum domain_mr_kind kind, const struct allocation *a, uint32_t sharers)
{
	(*(unsigned *)data)++;
}

unsigned domain_pd_mrs(struct domain *d)
{
	unsigned n = 0;

	domain_walk_mrs(d, false, count_mr, &n);
	return n;
}
