/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "memory/allocation.h"
#include "memory/arena.h"
#include "memory/memory.h"
#include "provider/provider.h"
#include "registration/mempool.h"
#include "registration/mr-cache.h"
#include "registration/reg-allocation.h"
#include "registration/registrar.h"

#define MR_TABLE_FIRST 256
#define MR_TABLE_MAX (1u << 20)

/* The charge map counts pages; the provider pins them. */
static int count_only(uintptr_t start, size_t len)
{
	(void)start;
	(void)len;
	return 0;
}

int mr_cache_init(struct mr_cache *c, enum mr_policy policy)
{
	*c = (struct mr_cache){ .policy = policy };
	LIST_INIT(&c->mrs);
	LIST_INIT(&c->reg_jobs);
	pin_map_init(&c->charges);
	c->charges.lock = c->charges.unlock = count_only;
	return mr_table_init(&c->table, MR_TABLE_FIRST, MR_TABLE_MAX);
}

static struct registrar *registrar_of(const struct mr_cache *c)
{
	return container_of(c, struct registrar, cache);
}

/* The host-wide sum moves with every change of the domain's own. */
static void count_host(const struct mr_cache *c, uint64_t before)
{
	*registrar_of(c)->host_pinned += c->charges.pinned_bytes - before;
}

int mr_cache_charge(struct mr_cache *c, uint64_t start, uint64_t end)
{
	uint64_t before = c->charges.pinned_bytes;
	int k = pin_map_pin(&c->charges, (uintptr_t)start, (uintptr_t)end);

	count_host(c, before);
	return k;
}

void mr_cache_uncharge(struct mr_cache *c, uint64_t start, uint64_t end)
{
	uint64_t before = c->charges.pinned_bytes;
	int k = pin_map_unpin(&c->charges, (uintptr_t)start, (uintptr_t)end);

	count_host(c, before);
	if (k < 0)
		log_error_errno(k, "domain %s: uncharging [0x%" PRIx64 ", 0x%" PRIx64 "): %m",
				registrar_of(c)->name, start, end);
}

uint64_t mr_cache_uncharged(const struct mr_cache *c, uint64_t start, uint64_t end)
{
	return pin_map_unpinned_bytes(&c->charges, (uintptr_t)start, (uintptr_t)end);
}

void mr_cache_done(struct mr_cache *c)
{
	struct cached_mr *mr;

	/* Allocations go before their domain, so what is left here belongs to none of them. */
	while ((mr = LIST_FIRST(&c->mrs))) {
		LIST_REMOVE(mr, link);
		LIST_REMOVE(mr, alloc_link);
		(void)frmr_pools_dereg(&registrar_of(c)->pools, mr->pmr);
		free(mr);
	}
	c->n_mrs = 0;
	mr_table_done(&c->table);
	if (c->charges.pinned_bytes)
		*registrar_of(c)->host_pinned -= c->charges.pinned_bytes;
	pin_map_done(&c->charges);
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

/* A registration on a worker thread, for one waiting lookup. */
struct reg_job {
	struct registrar_work base;
	LIST_ENTRY(reg_job) link; /* the cache's */
	struct mr_waiter *waiter;
	struct mr_wait *lookups; /* other lookups inside the run, waiting for it */
	uint64_t addr, start, end, allocation_serial;
	unsigned access;
	/* Written by the worker, read on the loop after it. */
	struct {
		struct provider_mr *pmr;
		int result;
	} rt;
};

/* Cuts the run [*start, *end) around addr at an MR [s, e) beside addr. */
static void cut(uint64_t s, uint64_t e, uint64_t addr, uint64_t *start, uint64_t *end)
{
	if (e <= addr && e > *start)
		*start = e;
	if (s > addr && s < *end)
		*end = s;
}

/* The registration a worker is making of a's pages around addr, if any. */
static struct reg_job *pending_run(const struct mr_cache *c, const struct reg_allocation *a,
				   uint64_t addr)
{
	struct reg_job *j;

	LIST_FOREACH(j, &c->reg_jobs, link)
		if (j->allocation_serial == a->mem.serial && addr >= j->start && addr < j->end)
			return j;
	return NULL;
}

/* The part of a's pages around addr that no MR covers yet, nor a registration under way
 * (contig), or addr's page. */
static void pick_range(const struct mr_cache *c, const struct reg_allocation *a, uint64_t addr,
		       uint64_t *ret_start, uint64_t *ret_end)
{
	uint64_t ps = a->mem.arena->page_size, start = allocation_address(&a->mem);
	uint64_t end = start + a->mem.length, max = registrar_of(c)->provider->caps.max_mr_size;
	const struct cached_mr *mr;
	const struct pool_mr *pm;
	const struct reg_job *j;

	if (c->policy == MR_POLICY_PAGE) {
		*ret_start = addr - (addr - start) % ps;
		*ret_end = *ret_start + ps;
		return;
	}
	/* MRs never cross allocations, so only a's own MRs (the cache's and its pools') and
	 * runs being registered can bound the run. */
	LIST_FOREACH(mr, &a->mrs, alloc_link)
		cut(mr->start, mr->end, addr, &start, &end);
	LIST_FOREACH(pm, &a->pool_mrs, alloc_link)
		if (pool_mr_live(pm))
			cut(pm->start, pm->end, addr, &start, &end);
	LIST_FOREACH(j, &c->reg_jobs, link)
		if (j->allocation_serial == a->mem.serial)
			cut(j->start, j->end, addr, &start, &end);
	/* No more than the device takes in one MR: the part that starts at addr's page. */
	if (end - start > max) {
		start = addr - (addr - start) % ps;
		if (end - start > max)
			end = start + max / ps * ps;
	}
	*ret_start = start;
	*ret_end = end;
}

/* Whether an MR of a — the cache's, or a pool's — covers part of [start, end). */
static bool covered(const struct reg_allocation *a, uint64_t start, uint64_t end)
{
	const struct cached_mr *mr;
	const struct pool_mr *pm;

	LIST_FOREACH(mr, &a->mrs, alloc_link)
		if (mr->start < end && start < mr->end)
			return true;
	LIST_FOREACH(pm, &a->pool_mrs, alloc_link)
		if (pool_mr_live(pm) && pm->start < end && start < pm->end)
			return true;
	return false;
}

/* Takes a fresh registration, charged already, into the cache. */
static struct cached_mr *adopt(struct mr_cache *c, struct reg_allocation *a,
			       struct provider_mr *pmr, uint64_t start, uint64_t end)
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
	e = entry_of(mr);
	if (!c->table.overflow)
		(void)mr_table_insert(&c->table, &e); /* on overflow the list serves */
	registrar_of(c)->events.changed(registrar_of(c)->data);
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

static void reg_job_run(struct registrar_work *w)
{
	struct reg_job *j = (struct reg_job *)w;

	j->rt.result = frmr_pools_reg(&w->reg->pools, (void *)(uintptr_t)j->start,
				   j->end - j->start, j->access, false, &j->rt.pmr);
}

static void reg_job_done(struct registrar_work *w);

/* A lookup waiting on the loop for an MR a worker is making; without a waiter, -EAGAIN. */
static int wait_for(struct mr_wait **lookups, uint64_t addr, struct mr_waiter *waiter,
		    const char *what, char *why, size_t why_size)
{
	struct mr_wait *w;

	if (!waiter) {
		snprintf(why, why_size, "0x%" PRIx64 " is being registered%s%s", addr,
			 *what ? " " : "", what);
		return -EAGAIN;
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	*w = (struct mr_wait){ .next = *lookups, .waiter = waiter, .addr = addr };
	*lookups = w;
	return -EINPROGRESS;
}

/* Not in the table: the pool MR holding addr, else a registration of the uncovered run. */
static int miss(struct mr_cache *c, struct reg_allocation *a, uint64_t addr, struct mr_entry *ret,
		char *why, size_t why_size, struct mr_waiter *waiter)
{
	struct registrar *r = registrar_of(c);
	struct pool_mr *pm = mempool_mr_containing(a, addr);
	struct reg_job *job;
	struct provider_mr *pmr;
	uint64_t start, end;
	int k;

	if (pm && !pm->pending) {
		/* Registered for a pool already: pinning the pages again would count them twice. */
		*ret = (struct mr_entry){ pm->start, pm->end, pm->pmr->lkey, pm->pmr->rkey };
		return 0;
	}
	if (pm)
		/* A worker is making that MR: the lookup takes it once it is made. */
		return wait_for(&pm->lookups, addr, waiter, "for a mempool", why, why_size);
	job = pending_run(c, a, addr);
	if (job)
		/* Registering the run again would pin and count its pages twice. */
		return wait_for(&job->lookups, addr, waiter, "", why, why_size);
	pick_range(c, a, addr, &start, &end);

	k = registrar_check_pinned(r, mr_cache_uncharged(c, start, end), why, why_size);
	if (k < 0)
		return k;
	/* Counted from now: a lookup or pool meanwhile sees these pages taken. */
	k = mr_cache_charge(c, start, end);
	if (k < 0)
		return k;

	if (waiter && registrar_offload(r, end - start)) {
		/* Pinning this much takes long: a worker does it, and nobody waits but the asker. */
		struct reg_job *j = calloc(1, sizeof(*j));

		if (!j) {
			mr_cache_uncharge(c, start, end);
			return -ENOMEM;
		}
		j->waiter = waiter;
		j->addr = addr;
		j->start = start;
		j->end = end;
		j->allocation_serial = a->mem.serial;
		j->access = reg_allocation_access(a, &r->provider->caps);
		c->pending_bytes += end - start;
		LIST_INSERT_HEAD(&c->reg_jobs, j, link);
		registrar_start(r, &j->base, reg_job_run, reg_job_done, false);
		return -EINPROGRESS;
	}

	k = frmr_pools_reg(&r->pools, (void *)(uintptr_t)start, end - start,
			   reg_allocation_access(a, &r->provider->caps), false, &pmr);
	if (k < 0) {
		mr_cache_uncharge(c, start, end);
		snprintf(why, why_size, "registering [0x%" PRIx64 ", 0x%" PRIx64 ") failed: %s", start,
			 end, provider_strerror(r->provider, k));
		return k;
	}
	if (!adopt(c, a, pmr, start, end)) {
		(void)frmr_pools_dereg(&r->pools, pmr);
		mr_cache_uncharge(c, start, end);
		return -ENOMEM;
	}
	*ret = (struct mr_entry){ start, end, pmr->lkey, pmr->rkey };
	return 0;
}

struct dropped {
	uint64_t start, end;
};

static void dropped_gone(struct registrar *r, void *arg, int result)
{
	struct dropped *g = arg;

	mr_cache_uncharge(&r->cache, g->start, g->end);
	free(g);
}

/* A registration nobody takes over [start, end): deregistered where it cannot stall the
 * loop, and uncharged once the device has let go of it. */
static void drop(struct mr_cache *c, struct provider_mr *pmr, uint64_t start, uint64_t end)
{
	struct registrar *r = registrar_of(c);
	struct dropped *g;

	if (registrar_offload(r, end - start) && (g = malloc(sizeof(*g)))) {
		*g = (struct dropped){ start, end };
		if (registrar_dereg_on_worker(r, pmr, dropped_gone, g) == 0)
			return;
		free(g);
	}
	(void)frmr_pools_dereg(&r->pools, pmr);
	mr_cache_uncharge(c, start, end);
}

/* A lookup that waited, run again now that what it waited for is settled: answered now, or
 * through waiter once more later. */
static void retry(struct mr_cache *c, uint64_t addr, struct mr_waiter *waiter)
{
	struct reg_allocation *a =
		reg_allocation_of(allocation_containing(registrar_of(c)->mem, addr));
	struct mr_entry e;
	char why[160] = "";
	int k;

	if (c->keys_stale || provider_lost(registrar_of(c)->provider)) {
		snprintf(why, sizeof(why), "device %s failed while 0x%" PRIx64 " waited for its "
			 "registration; mrd reopens it when it returns",
			 registrar_of(c)->provider->caps.device, addr);
		k = -ENODEV;
	} else if (cached(c, addr, &e))
		k = 0;
	else if (!a) {
		snprintf(why, sizeof(why), "0x%" PRIx64 " was freed while it was being registered",
			 addr);
		k = -ENOENT;
	} else
		k = miss(c, a, addr, &e, why, sizeof(why), waiter);
	if (k != -EINPROGRESS)
		waiter->resume(waiter, k, k < 0 ? NULL : &e, why);
}

static void reg_job_done(struct registrar_work *w)
{
	struct reg_job *j = (struct reg_job *)w;
	struct registrar *r = w->reg;
	struct mr_cache *c = &r->cache;
	struct reg_allocation *a = reg_allocation_of(allocation_containing(r->mem, j->addr));
	struct mr_entry e;
	char why[160] = "";
	int k = j->rt.result;

	c->pending_bytes -= j->end - j->start;
	LIST_REMOVE(j, link);
	if (k < 0) {
		mr_cache_uncharge(c, j->start, j->end);
		snprintf(why, sizeof(why), "registering [0x%" PRIx64 ", 0x%" PRIx64 ") failed: %s",
			 j->start, j->end, provider_strerror(r->provider, k));
	} else if (!a || a->mem.serial != j->allocation_serial) {
		/* Freed while the worker pinned it: the registration covers nobody's memory. */
		drop(c, j->rt.pmr, j->start, j->end);
		snprintf(why, sizeof(why), "0x%" PRIx64 " was freed while it was being registered",
			 j->addr);
		k = -ENOENT;
	} else if (covered(a, j->start, j->end)) {
		/* An MR made meanwhile (another lookup's, a pool's) has pages of the run: the first
		 * creator wins, this one goes, and the lookup runs again — for the winner's keys, or
		 * for what is still uncovered — so that no page is pinned and counted twice. */
		drop(c, j->rt.pmr, j->start, j->end);
		retry(c, j->addr, j->waiter);
		goto out;
	} else if (!adopt(c, a, j->rt.pmr, j->start, j->end)) {
		drop(c, j->rt.pmr, j->start, j->end);
		k = -ENOMEM;
	} else if (c->keys_stale || provider_lost(r->provider)) {
		/* The device failed while the worker registered: the MR is the cache's (the device's
		 * return makes it again), but its keys are of the failed device. */
		snprintf(why, sizeof(why), "device %s failed while [0x%" PRIx64 ", 0x%" PRIx64
			 ") was being registered; mrd reopens it when it returns",
			 r->provider->caps.device, j->start, j->end);
		k = -ENODEV;
	} else
		e = (struct mr_entry){ j->start, j->end, j->rt.pmr->lkey, j->rt.pmr->rkey };
	j->waiter->resume(j->waiter, k, k < 0 ? NULL : &e, why);
out:
	/* Lookups inside the run get its keys now, or register what is left. */
	mr_cache_resume_waits(c, j->lookups);
	free(j);
}

void mr_cache_resume_waits(struct mr_cache *c, struct mr_wait *waits)
{
	while (waits) {
		struct mr_wait *w = waits;

		waits = w->next;
		retry(c, w->addr, w->waiter);
		free(w);
	}
}

int mr_cache_lookup(struct mr_cache *c, uint64_t addr, struct mr_entry *ret, char *why,
		    size_t why_size, struct mr_waiter *waiter)
{
	struct registrar *r = registrar_of(c);
	struct reg_allocation *a;

	c->lookups++;
	if (c->keys_stale) { /* a batch's next address, after a wait the failure ended */
		snprintf(why, why_size, "device %s failed; mrd reopens it when it returns",
			 r->provider->caps.device);
		return -ENODEV;
	}
	if (cached(c, addr, ret))
		return 0;

	a = reg_allocation_of(allocation_containing(r->mem, addr));
	/* On-demand memory's children are found through their allocation, in no table. */
	if (a && a->mem.odp)
		return odp_fault(r, a, addr, ret, why, why_size, waiter);
	c->misses++;
	if (!a) {
		snprintf(why, why_size, "0x%" PRIx64 " is not in memory allocated in domain %s",
			 addr, r->name);
		return -ENOENT;
	}
	return miss(c, a, addr, ret, why, why_size, waiter);
}

void mr_cache_flush(struct mr_cache *c)
{
	rebuild(c);
}

uint64_t mr_cache_retire(struct mr_cache *c, struct reg_allocation *a)
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

void mr_cache_deregister(const struct mr_cache *c, struct reg_allocation *a)
{
	struct cached_mr *mr;

	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		int k = mr->pmr ? frmr_pools_dereg(&registrar_of(c)->pools, mr->pmr) : 0;

		/* The device keeps a live MR (its keys work, its pages pinned): so does a. */
		if (k < 0 && !a->dereg_error)
			a->dereg_error = k;
		if (k == 0)
			mr->pmr = NULL;
	}
}

void mr_cache_release(struct mr_cache *c, struct reg_allocation *a)
{
	struct cached_mr *mr, *next;

	for (mr = LIST_FIRST(&a->mrs); mr; mr = next) {
		next = LIST_NEXT(mr, alloc_link);
		if (mr->pmr)
			continue; /* the device kept it: its pages stay charged, a quarantined */
		LIST_REMOVE(mr, alloc_link);
		mr_cache_uncharge(c, mr->start, mr->end);
		c->deregistrations++;
		free(mr);
	}
}

void mr_cache_drop_kept(struct mr_cache *c, struct reg_allocation *a)
{
	struct cached_mr *mr;

	while ((mr = LIST_FIRST(&a->mrs))) {
		LIST_REMOVE(mr, alloc_link);
		mr_cache_uncharge(c, mr->start, mr->end);
		free(mr);
	}
}
