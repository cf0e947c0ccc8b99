/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "domain.h"
#include "log.h"
#include "manager.h"
#include "mr-cache.h"
#include "provider.h"
#include "worker-pool.h"

#define MR_TABLE_FIRST 256
#define MR_TABLE_MAX (1u << 20)

int mr_cache_init(struct mr_cache *c, struct domain *d, enum mr_policy policy)
{
	*c = (struct mr_cache){ .domain = d, .policy = policy };
	LIST_INIT(&c->mrs);
	return mr_table_init(&c->table, MR_TABLE_FIRST, MR_TABLE_MAX);
}

void mr_cache_done(struct mr_cache *c)
{
	struct cached_mr *mr;

	/* Allocations go before their domain, so what is left here belongs to none of them. */
	while ((mr = LIST_FIRST(&c->mrs))) {
		LIST_REMOVE(mr, link);
		LIST_REMOVE(mr, alloc_link);
		(void)frmr_pools_dereg(&c->domain->pools, mr->pmr);
		free(mr);
	}
	c->n_mrs = 0;
	mr_table_done(&c->table);
}

static struct mr_entry entry_of(const struct cached_mr *mr)
{
	return (struct mr_entry){ mr->start, mr->end, mr->pmr->lkey, mr->pmr->rkey };
}

/* With the table overflowed, the list is the truth. */
static const struct cached_mr *list_lookup(const struct mr_cache *c, uint64_t addr)
{
	const struct cached_mr *mr;

	LIST_FOREACH(mr, &c->mrs, link)
		if (addr >= mr->start && addr < mr->end)
			return mr;
	return NULL;
}

/* Rebuilds the table from the list, which clears an overflow when it fits again. */
static void rebuild(struct mr_cache *c)
{
	const struct cached_mr *mr;

	mr_table_clear(&c->table);
	LIST_FOREACH(mr, &c->mrs, link) {
		struct mr_entry e = entry_of(mr);

		if (mr_table_insert(&c->table, &e) < 0)
			break; /* overflow again: lookups keep walking the list */
	}
}

/* The part of a's pages around addr that no MR covers yet (contig), or addr's page. */
static void pick_range(const struct mr_cache *c, const struct allocation *a, uint64_t addr,
		       uint64_t *ret_start, uint64_t *ret_end)
{
	uint64_t ps = a->arena->page_size, start = allocation_address(a), end = start + a->length;
	const struct cached_mr *mr;

	if (c->policy == MR_POLICY_PAGE) {
		*ret_start = addr - (addr - start) % ps;
		*ret_end = *ret_start + ps;
		return;
	}
	/* MRs never cross allocations, so only a's own MRs can bound the run. */
	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		if (mr->end <= addr && mr->end > start)
			start = mr->end;
		if (mr->start > addr && mr->start < end)
			end = mr->start;
	}
	/* No more than the device takes in one MR: the part that starts at addr's page. */
	if (end - start > c->domain->provider->caps.max_mr_size) {
		start = addr - (addr - start) % ps;
		if (end - start > c->domain->provider->caps.max_mr_size)
			end = start + c->domain->provider->caps.max_mr_size / ps * ps;
	}
	*ret_start = start;
	*ret_end = end;
}

/* Takes a fresh registration into the cache; keeps the first when two raced. */
static struct cached_mr *adopt(struct mr_cache *c, struct allocation *a, struct provider_mr *pmr,
			       uint64_t start, uint64_t end)
{
	struct cached_mr *mr = calloc(1, sizeof(*mr));
	struct mr_entry e;

	if (!mr)
		return NULL;
	mr->pmr = pmr;
	mr->allocation = a;
	mr->start = start;
	mr->end = end;
	LIST_INSERT_HEAD(&c->mrs, mr, link);
	LIST_INSERT_HEAD(&a->mrs, mr, alloc_link);
	c->n_mrs++;
	c->registrations++;
	c->pinned_bytes += end - start;
	e = entry_of(mr);
	if (!c->table.overflow)
		(void)mr_table_insert(&c->table, &e); /* on overflow the list serves */
	domain_update_status(c->domain);
	return mr;
}

/* The cached entry for addr, if any. */
static bool cached(const struct mr_cache *c, uint64_t addr, struct mr_entry *ret)
{
	if (!c->table.overflow) {
		const struct mr_entry *e = mr_table_lookup(&c->table, addr);

		if (e)
			*ret = *e;
		return e != NULL;
	} else {
		const struct cached_mr *hit = list_lookup(c, addr);

		if (hit)
			*ret = entry_of(hit);
		return hit != NULL;
	}
}

/* A registration on a worker thread, for one waiting lookup. */
struct reg_job {
	struct work work;
	struct domain *domain; /* held while the job lives */
	struct mr_waiter *waiter;
	uint64_t addr, start, end, allocation_serial;
	unsigned access;
	struct provider_mr *pmr;
	int result;
};

static void reg_job_run(struct work *w)
{
	struct reg_job *j = (struct reg_job *)w;

	j->result = frmr_pools_reg(&j->domain->pools, (void *)(uintptr_t)j->start,
				   j->end - j->start, j->access, false, &j->pmr);
}

static void reg_job_done(struct work *w)
{
	struct reg_job *j = (struct reg_job *)w;
	struct domain *d = j->domain;
	struct mr_cache *c = &d->cache;
	struct allocation *a = domain_allocation_containing(d, j->addr);
	struct mr_entry e;
	char why[160] = "";
	int r = j->result;

	c->pending_bytes -= j->end - j->start;
	if (r < 0)
		snprintf(why, sizeof(why), "registering [0x%" PRIx64 ", 0x%" PRIx64 ") failed: %s",
			 j->start, j->end, strerror(-r));
	else if (!a || a->serial != j->allocation_serial) {
		/* Freed while the worker pinned it: the registration covers nobody's memory. */
		(void)frmr_pools_dereg(&d->pools, j->pmr);
		snprintf(why, sizeof(why), "0x%" PRIx64 " was freed while it was being registered",
			 j->addr);
		r = -ENOENT;
	} else if (cached(c, j->addr, &e)) {
		(void)frmr_pools_dereg(&d->pools, j->pmr); /* another lookup got there first: its MR wins */
	} else if (!adopt(c, a, j->pmr, j->start, j->end)) {
		(void)frmr_pools_dereg(&d->pools, j->pmr);
		r = -ENOMEM;
	} else
		e = (struct mr_entry){ j->start, j->end, j->pmr->lkey, j->pmr->rkey };
	j->waiter->resume(j->waiter, r, r < 0 ? NULL : &e, why);
	free(j);
	domain_unref(d);
}

int mr_cache_lookup(struct mr_cache *c, uint64_t addr, struct mr_entry *ret, char *why,
		    size_t why_size, struct mr_waiter *waiter)
{
	struct domain *d = c->domain;
	const struct config *cfg = &d->manager->config;
	struct provider_mr *pmr;
	struct allocation *a;
	uint64_t start, end;
	int r;

	c->lookups++;
	if (cached(c, addr, ret))
		return 0;

	c->misses++;
	a = domain_allocation_containing(d, addr);
	if (!a) {
		snprintf(why, why_size, "0x%" PRIx64 " is not in memory allocated in domain %s",
			 addr, d->name);
		return -ENOENT;
	}
	if (a->odp)
		return odp_fault(d, a, addr, ret, why, why_size);
	pick_range(c, a, addr, &start, &end);

	r = domain_check_pinned(d, end - start, why, why_size);
	if (r < 0)
		return r;

	if (waiter && d->manager->workers &&
	    (end - start >= cfg->async_bytes || mr_cache_busy(c))) {
		/* Pinning this much takes long: a worker does it, and nobody waits but the asker. */
		struct reg_job *j = calloc(1, sizeof(*j));

		if (!j)
			return -ENOMEM;
		j->work.run = reg_job_run;
		j->work.done = reg_job_done;
		j->domain = domain_ref(d);
		j->waiter = waiter;
		j->addr = addr;
		j->start = start;
		j->end = end;
		j->allocation_serial = a->serial;
		j->access = allocation_access(a);
		c->pending_bytes += end - start;
		worker_pool_submit(d->manager->workers, &j->work);
		return -EINPROGRESS;
	}

	r = frmr_pools_reg(&d->pools, (void *)(uintptr_t)start, end - start, allocation_access(a),
			   false, &pmr);
	if (r < 0) {
		snprintf(why, why_size, "registering [0x%" PRIx64 ", 0x%" PRIx64 ") failed: %s", start,
			 end, strerror(-r));
		return r;
	}
	if (!adopt(c, a, pmr, start, end)) {
		(void)frmr_pools_dereg(&d->pools, pmr);
		return -ENOMEM;
	}
	*ret = (struct mr_entry){ start, end, pmr->lkey, pmr->rkey };
	return 0;
}

void mr_cache_flush(struct mr_cache *c)
{
	rebuild(c);
}

uint64_t mr_cache_retire(struct mr_cache *c, struct allocation *a)
{
	struct cached_mr *mr;
	uint64_t bytes = 0;

	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		if (!c->table.overflow)
			(void)mr_table_remove(&c->table, mr->start);
		LIST_REMOVE(mr, link);
		c->n_mrs--;
		bytes += mr->end - mr->start;
	}
	if (bytes && c->table.overflow)
		rebuild(c);
	return bytes;
}

void mr_cache_deregister(const struct mr_cache *c, struct allocation *a)
{
	struct cached_mr *mr;

	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		int r = frmr_pools_dereg(&c->domain->pools, mr->pmr);

		if (r < 0)
			log_warning_errno(r, "domain %s: cannot deregister [0x%" PRIx64 ", 0x%" PRIx64
					  "): %m", c->domain->name, mr->start, mr->end);
		mr->pmr = NULL;
	}
}

void mr_cache_release(struct mr_cache *c, struct allocation *a)
{
	struct cached_mr *mr;

	while ((mr = LIST_FIRST(&a->mrs))) {
		LIST_REMOVE(mr, alloc_link);
		c->pinned_bytes -= mr->end - mr->start;
		c->deregistrations++;
		free(mr);
	}
}
