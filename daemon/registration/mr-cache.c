/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "provider/provider.h"
#include "memory/allocation.h"
#include "memory/arena.h"
#include "memory/mem-owner.h"
#include "memory/memory.h"
#include "registration/mr-cache.h"
#include "registration/reg-allocation.h"
#include "registration/reg-base.h"

#define MR_TABLE_FIRST 256
#define MR_TABLE_MAX (1u << 20)

/* The charge map counts pages; the provider pins them. */
static int count_only(uintptr_t start, size_t len)
{
	(void)start;
	(void)len;
	return 0;
}

int mr_cache_init(struct mr_cache *c, struct reg_base *r, struct mr_cache *home,
		  struct provider_pd *own_pd, enum mr_policy policy)
{
	*c = (struct mr_cache){ .reg = r, .home = home ? home : c, .own_pd = own_pd,
				.policy = policy };
	LIST_INIT(&c->mrs);
	LIST_INIT(&c->range_mrs);
	LIST_INIT(&c->reg_jobs);
	LIST_INIT(&c->bound);
	pin_map_init(&c->charges);
	c->charges.lock = c->charges.unlock = count_only;
	return mr_table_init(&c->table, MR_TABLE_FIRST, MR_TABLE_MAX);
}

static struct reg_base *base_of(const struct mr_cache *c)
{
	return c->reg;
}

/* Where pinned pages are counted: the domain's cache, for a client PD's too — the pages are
 * the same, whichever PD's MR pins them. */
static struct mr_cache *home(const struct mr_cache *c)
{
	return c->home;
}

static struct provider *provider_of(const struct mr_cache *c)
{
	return c->own_pd ? c->own_pd->provider : c->reg->provider;
}

static void hold(struct mr_cache *c)
{
	if (c->hold)
		c->hold(c);
}

/* A client PD's cache may go here: nothing of c is touched after. */
static void unhold(struct mr_cache *c)
{
	if (c->unhold)
		c->unhold(c);
}

/* The host-wide sum moves with every change of the domain's own. */
static void count_host(const struct mr_cache *h, uint64_t before)
{
	*base_of(h)->host_pinned += h->charges.pinned_bytes - before;
}

/* Charges are of whole pages: an MR over a program's buffer (an aliased span) covers its bytes
 * alone, and the device pins its pages all the same. Every other range is whole pages
 * already. */
static uintptr_t page_floor(uint64_t a)
{
	return (uintptr_t)(a & ~(uint64_t)(sysconf(_SC_PAGESIZE) - 1));
}

static uintptr_t page_ceil(uint64_t a)
{
	return page_floor(a + (uint64_t)sysconf(_SC_PAGESIZE) - 1);
}

int mr_cache_charge(struct mr_cache *c, uint64_t start, uint64_t end)
{
	struct mr_cache *h = home(c);
	uint64_t before = h->charges.pinned_bytes;
	int k = pin_map_pin(&h->charges, page_floor(start), page_ceil(end));

	count_host(h, before);
	return k;
}

void mr_cache_uncharge(struct mr_cache *c, uint64_t start, uint64_t end)
{
	struct mr_cache *h = home(c);
	uint64_t before = h->charges.pinned_bytes;
	int k = pin_map_unpin(&h->charges, page_floor(start), page_ceil(end));

	count_host(h, before);
	if (k < 0)
		log_error_errno(k, "domain %s: uncharging [0x%" PRIx64 ", 0x%" PRIx64 "): %m",
				base_of(c)->name, start, end);
}

uint64_t mr_cache_uncharged(const struct mr_cache *c, uint64_t start, uint64_t end)
{
	return pin_map_unpinned_bytes(&home(c)->charges, page_floor(start), page_ceil(end));
}

/* An MR of c's PD: the domain's through its FRMR pools, a client PD's directly, at iova
 * (start, or its place in an alias). */
static int reg_mr(const struct mr_cache *c, uint64_t start, uint64_t end, uint64_t iova,
		  unsigned access, struct provider_mr **ret)
{
	if (c->own_pd)
		return provider_reg(c->own_pd, (void *)(uintptr_t)start, end - start, iova, access,
				    ret);
	if (iova != start) /* an adopted buffer's, at the program's address: no pool's */
		return provider_reg(base_of(c)->pools.pd, (void *)(uintptr_t)start, end - start,
				    iova, access, ret);
	return frmr_pools_reg(&base_of(c)->pools, (void *)(uintptr_t)start, end - start,
			      access, false, ret);
}

/* What an MR of c over a grants. A client PD's over on-demand memory is on demand itself (one
 * MR over the run, whose pages the device faults in: no children there) where that device's
 * on-demand paging covers the access, else pinned; the domain's are made by odp.c. */
static unsigned access_of(const struct mr_cache *c, const struct reg_allocation *a)
{
	const struct provider_caps *caps = &provider_of(c)->caps;
	unsigned access = reg_allocation_access(a, caps);

	if (c->own_pd && reg_kind_of(a) == REG_KIND_ON_DEMAND &&
	    provider_odp_covers(caps, access))
		access |= MRD_ACCESS_ON_DEMAND;
	/* Pinned MRs take windows where the device has them: the domain's (mw-grants.h), and a
	 * client PD's, which the client binds on its own QPs (libmrd's own-windows.c); window-only,
	 * their own rkey grants nothing remote (without windows, no remote access at all). A
	 * program's buffer (libmrd-preload.so) takes windows too (window-binder.h), but keeps the
	 * rights the program asked: the shim hands out the MR's rkey where it binds no window. */
	if (reg_kind_of(a) == REG_KIND_PINNED) {
		if (caps->mw)
			access |= MRD_ACCESS_MW_BIND;
		if (base_of(c)->config->window_only)
			access &= ~MRD_ACCESS_MW_GRANTS;
	} else if (reg_kind_of(a) == REG_KIND_ALIAS && caps->mw) {
		access |= MRD_ACCESS_MW_BIND;
	}
	return access;
}

/* Whether c's keys are of a failed device: the domain's until its return commits; a client
 * PD's for good once its device failed (registrar_device_lost), and only then — a client PD on
 * another device serves on while the domains' fails. */
static bool stale(const struct mr_cache *c)
{
	return (!c->own_pd && c->keys_stale) || provider_lost(provider_of(c));
}

/* Whether an MR of access pins its pages (and is charged for them). */
static bool pins(unsigned access)
{
	return !(access & MRD_ACCESS_ON_DEMAND);
}

/* Provider work of c would wait, so it goes to a worker: the domain's rule, and for a client
 * PD also while a worker registers in it (its provider's lock is held meanwhile). */
static bool offload(const struct mr_cache *c, uint64_t bytes)
{
	const struct reg_base *r = base_of(c);

	return reg_offload(r, bytes) ||
	       (c->own_pd && reg_offload(r, UINT64_MAX) && c->pending_bytes > 0);
}

static struct mr_entry entry_of(const struct cached_mr *mr)
{
	return (struct mr_entry){ mr->start, mr->end, mr->pmr->lkey, mr->pmr->rkey };
}

/* The first MR of c's lists (the table's, then the range lookups'), NULL when none. */
static struct cached_mr *first_mr(const struct mr_cache *c)
{
	return LIST_FIRST(&c->mrs) ? LIST_FIRST(&c->mrs) : LIST_FIRST(&c->range_mrs);
}

/* mr off its cache's list, counted. */
static void unlink_mr(struct cached_mr *mr)
{
	if (mr->by_lkey && u64_map_get(&mr->cache->by_lkey, mr->by_lkey) == mr)
		(void)u64_map_remove(&mr->cache->by_lkey, mr->by_lkey);
	mr->by_lkey = 0;
	LIST_REMOVE(mr, link);
	mr->cache->n_mrs--;
	if (mr->range)
		mr->cache->n_range_mrs--;
}

/* mr is out of its cache's list (and table): whatever hangs on it hears, once. */
static void leave(struct cached_mr *mr)
{
	struct mr_entry e = entry_of(mr);
	struct mr_gone_listener *l;

	mr->in_cache = false;
	while ((l = LIST_FIRST(&mr->listeners))) {
		mr_cache_unlisten_gone(l);
		l->gone(l, &e);
	}
}

void mr_cache_done(struct mr_cache *c)
{
	struct cached_mr *mr;

	/* Allocations go before their domain, so what is left here belongs to none of them. */
	while ((mr = first_mr(c))) {
		unlink_mr(mr);
		LIST_REMOVE(mr, alloc_link);
		leave(mr);
		(void)reg_dereg(base_of(c), mr->pmr);
		free(mr);
	}
	mr_table_done(&c->table);
	u64_map_done(&c->by_lkey);
	if (c->charges.pinned_bytes)
		*base_of(c)->host_pinned -= c->charges.pinned_bytes;
	pin_map_done(&c->charges);
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

/* mr (on a list) into by_lkey under its lkey; where memory runs out, lookups by key walk. */
static void by_lkey_put(struct mr_cache *c, struct cached_mr *mr)
{
	uint64_t key = (uint64_t)mr->pmr->lkey + 1;
	struct cached_mr *other = u64_map_remove(&c->by_lkey, key);

	if (other) /* listed under a key that changed since: this one takes it */
		other->by_lkey = 0;
	mr->by_lkey = u64_map_put(&c->by_lkey, key, mr) == 0 ? key : 0;
	if (!mr->by_lkey)
		c->by_lkey_partial = true;
}

/* Rebuilds the table from the list, which clears an overflow when it fits again, and by_lkey
 * (a device's return may have changed the keys). */
static void rebuild(struct mr_cache *c)
{
	struct cached_mr *mr;

	mr_table_clear(&c->table);
	LIST_FOREACH(mr, &c->mrs, link) {
		struct mr_entry e = entry_of(mr);

		if (mr_table_insert(&c->table, &e) < 0)
			break; /* overflow again: lookups keep walking the list */
	}
	u64_map_done(&c->by_lkey);
	c->by_lkey_partial = false;
	for (mr = first_mr(c); mr; mr = LIST_NEXT(mr, link) ? LIST_NEXT(mr, link) :
	     (mr->range ? NULL : LIST_FIRST(&c->range_mrs))) {
		mr->by_lkey = 0;
		by_lkey_put(c, mr);
	}
}

struct cached_mr *mr_cache_by_lkey(const struct mr_cache *c, uint32_t lkey)
{
	struct cached_mr *mr = u64_map_get(&c->by_lkey, (uint64_t)lkey + 1);

	if (mr || !c->by_lkey_partial)
		return mr;
	for (mr = first_mr(c); mr; mr = LIST_NEXT(mr, link) ? LIST_NEXT(mr, link) :
	     (mr->range ? NULL : LIST_FIRST(&c->range_mrs)))
		if (mr->pmr->lkey == lkey)
			return mr;
	return NULL;
}

/* A registration on a worker thread, for one waiting lookup. */
struct reg_job {
	struct registrar_work base;
	struct mr_cache *cache;   /* held until done */
	LIST_ENTRY(reg_job) link; /* the cache's */
	struct waiter *waiter;
	struct mr_wait *lookups; /* other lookups inside the run, waiting for it */
	struct reg_allocation *allocation; /* a client PD's job: its free waits for it */
	struct cached_mr *spare; /* ... and the record of what it makes */
	uint64_t addr, start, end, iova, allocation_serial;
	unsigned access;
	bool range; /* a range lookup's MR: nobody else waits for it, it may overlap others */
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
		if (!j->range && j->allocation_serial == a->mem.serial && addr >= j->start &&
		    addr < j->end)
			return j;
	return NULL;
}

/* The part of a's pages around addr that no MR covers yet, nor a registration under way
 * (contig), or addr's page. */
static void pick_range(const struct mr_cache *c, const struct reg_allocation *a, uint64_t addr,
		       uint64_t *ret_start, uint64_t *ret_end)
{
	uint64_t ps = a->mem.arena->page_size, start = allocation_address(&a->mem);
	uint64_t end = start + a->mem.length, max = provider_of(c)->caps.max_mr_size;
	const struct cached_mr *mr;
	const struct reg_job *j;
	const void *other = NULL;
	uint64_t s, e;

	if (c->policy == MR_POLICY_PAGE) {
		*ret_start = addr - (addr - start) % ps;
		*ret_end = *ret_start + ps;
		return;
	}
	/* MRs never cross allocations, so only a's own MRs (the cache's and, for the domain's
	 * PD, its pools') and runs being registered can bound the run. */
	LIST_FOREACH(mr, &a->mrs, alloc_link)
		if (mr->cache == c && !mr->range)
			cut(mr->start, mr->end, addr, &start, &end);
	while (c->others && c->others->next(a, &other, &s, &e))
		cut(s, e, addr, &start, &end);
	LIST_FOREACH(j, &c->reg_jobs, link)
		if (j->allocation_serial == a->mem.serial && !j->range)
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

/* Whether an MR of a in c's PD — the table's, or a pool's — covers part of [start, end). */
static bool covered(const struct mr_cache *c, const struct reg_allocation *a, uint64_t start,
		    uint64_t end)
{
	const struct cached_mr *mr;
	const void *other = NULL;
	uint64_t s, e;

	LIST_FOREACH(mr, &a->mrs, alloc_link)
		if (mr->cache == c && !mr->range && mr->start < end && start < mr->end)
			return true;
	while (c->others && c->others->next(a, &other, &s, &e))
		if (s < end && start < e)
			return true;
	return false;
}

/* Takes a fresh registration, charged already, into the cache. */
/* spare: the record, allocated before the registration (a client PD's: once its MR exists,
 * nothing may fail that would lose track of it); NULL: allocated here. */
static struct cached_mr *adopt(struct mr_cache *c, struct reg_allocation *a,
			       struct provider_mr *pmr, uint64_t start, uint64_t end,
			       struct cached_mr *spare, bool range)
{
	struct cached_mr *mr = spare ? spare : calloc(1, sizeof(*mr));
	struct mr_entry e;

	if (!mr)
		return NULL;
	*mr = (struct cached_mr){ 0 };
	hold(c);
	mr->cache = c;
	mr->pmr = pmr;
	mr->pins = pins(pmr->access);
	mr->in_cache = true;
	mr->allocation = a;
	mr->start = start;
	mr->end = end;
	mr->range = range;
	LIST_INSERT_HEAD(&a->mrs, mr, alloc_link);
	c->n_mrs++;
	c->registrations++;
	by_lkey_put(c, mr);
	if (range) {
		LIST_INSERT_HEAD(&c->range_mrs, mr, link);
		c->n_range_mrs++;
		base_of(c)->events.changed(base_of(c)->data);
		return mr;
	}
	LIST_INSERT_HEAD(&c->mrs, mr, link);
	e = entry_of(mr);
	if (!c->table.overflow)
		(void)mr_table_insert(&c->table, &e); /* on overflow the list serves */
	base_of(c)->events.changed(base_of(c)->data);
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

	j->rt.result = reg_mr(j->cache, j->start, j->end, j->iova, j->access, &j->rt.pmr);
}

static void reg_job_done(struct registrar_work *w);

int mr_cache_wait(struct mr_wait **lookups, uint64_t addr, struct waiter *waiter,
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

/* A registration of [start, end) on a worker, for waiter: -EINPROGRESS, or -ENOMEM (nothing
 * started; spare stays the caller's). */
static int start_job(struct mr_cache *c, struct reg_allocation *a, uint64_t addr, uint64_t start,
		     uint64_t end, unsigned access, bool range, struct cached_mr *spare,
		     struct waiter *waiter)
{
	struct reg_job *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->spare = spare;
	j->cache = c;
	hold(c);
	j->waiter = waiter;
	j->addr = addr;
	j->start = start;
	j->end = end;
	j->iova = allocation_iova(&a->mem, start);
	j->allocation_serial = a->mem.serial;
	j->access = access;
	j->range = range;
	c->pending_bytes += end - start;
	LIST_INSERT_HEAD(&c->reg_jobs, j, link);
	/* A client PD's MR is made where the free cannot see it: the free waits, so that
	 * what the worker makes is let go before the pages go back (a client may make its
	 * dereg fail). Busy: the loop must not wait for the client provider's lock. */
	if (c->own_pd) {
		j->allocation = a;
		a->bound_jobs++;
	}
	reg_start(base_of(c), &j->base, reg_job_run, reg_job_done, c->own_pd != NULL);
	return -EINPROGRESS;
}

static int register_run(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
			uint64_t start, uint64_t end, unsigned access, bool range,
			struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter);

/* Not in the table, nor another's (c->others): a registration of the uncovered run. */
static int miss(struct mr_cache *c, struct reg_allocation *a, uint64_t addr, struct mr_entry *ret,
		char *why, size_t why_size, struct waiter *waiter)
{
	struct reg_job *job;
	uint64_t start, end;

	job = pending_run(c, a, addr);
	if (job)
		/* Registering the run again would pin and count its pages twice. */
		return mr_cache_wait(&job->lookups, addr, waiter, "", why, why_size);
	pick_range(c, a, addr, &start, &end);
	if (reg_kind_of(a) == REG_KIND_ALIAS && a->mem.span_length) {
		/* A program's buffer: its bytes alone, whatever else its pages hold (another
		 * buffer's span among them: an MR of its own). */
		uint64_t base = allocation_address(&a->mem), lo, hi;

		if (!allocation_span_at(&a->mem, addr - base, &lo, &hi)) {
			snprintf(why, why_size, "0x%" PRIx64 " is outside the registered bytes of "
				 "[0x%" PRIx64 ", 0x%" PRIx64 ")", addr, base, base + a->mem.length);
			return -ENOENT;
		}
		lo += base;
		hi += base;
		start = start > lo ? start : lo;
		end = end < hi ? end : hi;
	}
	return register_run(c, a, addr, start, end, access_of(c, a), false, ret, why, why_size,
			    waiter);
}

/* Registers [start, end) of a for the lookup at addr: a table MR, or a range lookup's. */
static int register_run(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
			uint64_t start, uint64_t end, unsigned access, bool range,
			struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter)
{
	struct reg_base *r = base_of(c);
	struct provider_mr *pmr;
	struct cached_mr *spare;
	int k;

	if (pins(access)) {
		k = reg_check_pinned(r, mr_cache_uncharged(c, start, end), why, why_size);
		if (k < 0)
			return k;
		/* Counted from now: a lookup or pool meanwhile sees these pages taken. */
		k = mr_cache_charge(c, start, end);
		if (k < 0)
			return k;
	}

	k = -ENOMEM;
	spare = c->own_pd ? calloc(1, sizeof(*spare)) : NULL;
	if (c->own_pd && !spare)
		goto uncharge;
	if (waiter && (offload(c, end - start) ||
		       !reg_loop_may(r, waiter->loop_registrations, end - start))) {
		/* Pinning this much takes long, or the loop did its share: a worker does it, and
		 * nobody waits but the asker. */
		k = start_job(c, a, addr, start, end, access, range, spare, waiter);
		if (k != -EINPROGRESS)
			goto uncharge;
		return k;
	}

	k = reg_mr(c, start, end, allocation_iova(&a->mem, start), access, &pmr);
	if (k < 0) {
		snprintf(why, why_size, "registering [0x%" PRIx64 ", 0x%" PRIx64 ") failed: %s", start,
			 end, provider_strerror(provider_of(c), k));
		goto uncharge;
	}
	if (!adopt(c, a, pmr, start, end, spare, range)) { /* the domain's alone: spare never fails */
		(void)reg_dereg(r, pmr);
		k = -ENOMEM;
		goto uncharge;
	}
	c->loop_registrations++;
	if (waiter)
		waiter->loop_registrations++;
	reg_loop_did(r, end - start);
	*ret = (struct mr_entry){ start, end, pmr->lkey, pmr->rkey };
	return 0;

uncharge: /* nothing made: what was charged for it goes */
	free(spare);
	if (pins(access))
		mr_cache_uncharge(c, start, end);
	return k;
}

/* Another's MR holding addr (c->others), else the cache's registration of the uncovered run. */
static int cover_or_miss(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
			 struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter)
{
	int k = c->others ? c->others->cover(c, a, addr, ret, why, why_size, waiter) :
			    MR_CACHE_MISS;

	return k == MR_CACHE_MISS ? miss(c, a, addr, ret, why, why_size, waiter) : k;
}

struct dropped {
	struct mr_cache *cache; /* held: a client PD's provider must outlive the dereg */
	uint64_t start, end;
	bool pins;
};

static void dropped_gone(struct reg_base *r, void *arg, int result)
{
	struct dropped *g = arg;

	(void)r;
	(void)result;
	if (g->pins)
		mr_cache_uncharge(g->cache, g->start, g->end);
	unhold(g->cache);
	free(g);
}

/* A registration nobody takes over [start, end): deregistered where it cannot stall the
 * loop, and uncharged once the device has let go of it. */
static void drop(struct mr_cache *c, struct provider_mr *pmr, uint64_t start, uint64_t end)
{
	struct reg_base *r = base_of(c);
	bool charged = pins(pmr->access);
	struct dropped *g;

	if (offload(c, end - start) && (g = malloc(sizeof(*g)))) {
		*g = (struct dropped){ c, start, end, charged };
		hold(c);
		if (reg_dereg_on_worker(r, pmr, dropped_gone, g) == 0)
			return;
		unhold(c);
		free(g);
	}
	(void)reg_dereg(r, pmr);
	if (charged)
		mr_cache_uncharge(c, start, end);
}

/* A client PD's MR over a that no lookup finds (its client went, or it came too late): on
 * a's list alone, so that a's free sees it. */
static struct cached_mr *detached(struct mr_cache *c, struct reg_allocation *a,
				  struct provider_mr *pmr, uint64_t start, uint64_t end,
				  struct cached_mr *mr)
{
	hold(c);
	*mr = (struct cached_mr){ .cache = c, .allocation = a, .start = start, .end = end,
				  .pmr = pmr, .pins = pins(pmr->access) };
	LIST_INSERT_HEAD(&a->mrs, mr, alloc_link);
	return mr;
}

/* Whether [start, end) of a lies inside one span of it (all of it, when a has no spans). */
static bool in_a_span(const struct reg_allocation *a, uint64_t start, uint64_t end)
{
	uint64_t base = allocation_address(&a->mem), lo, hi;

	if (reg_kind_of(a) != REG_KIND_ALIAS || !a->mem.span_length)
		return true;
	return allocation_span_at(&a->mem, start - base, &lo, &hi) && end - base <= hi;
}

/* The end of letting go of mr: gone (uncharged, freed), or kept by the device — the client
 * made its dereg fail (a memory window bound to it), or the device failed — and then left on
 * its allocation, charged, so that the run's free tries again and quarantines it. */
static void let_go_end(struct cached_mr *mr, int k)
{
	struct mr_cache *c = mr->cache;

	if (k < 0) {
		log_warning_errno(k, "domain %s: a client PD kept its MR over [0x%" PRIx64 ", 0x%"
				  PRIx64 ") (dereg: %m): the run stays pinned, and is quarantined "
				  "when freed", base_of(c)->name, mr->start, mr->end);
		return;
	}
	LIST_REMOVE(mr, alloc_link);
	if (mr->pins)
		mr_cache_uncharge(c, mr->start, mr->end);
	c->deregistrations++;
	free(mr);
	unhold(c);
}

static void let_go_done(struct reg_base *r, void *arg, int result)
{
	struct cached_mr *mr = arg;
	struct reg_allocation *a = mr->allocation;

	mr->pmr = result < 0 ? mr->pmr : NULL;
	let_go_end(mr, result);
	a->bound_jobs--;
	r->resume_free(r, a);
}

/* A client PD's MR, out of every table, deregistered now or (big, or while its PD is busy)
 * on a worker: a's free waits for that. */
static void let_go(struct cached_mr *mr)
{
	struct mr_cache *c = mr->cache;
	struct reg_base *r = base_of(c);
	int k;

	if (offload(c, mr->end - mr->start) &&
	    reg_dereg_on_worker(r, mr->pmr, let_go_done, mr) == 0) {
		mr->allocation->bound_jobs++;
		return;
	}
	k = reg_dereg(r, mr->pmr);
	if (k == 0)
		mr->pmr = NULL;
	let_go_end(mr, k);
}

/* A lookup that waited, run again now that what it waited for is settled: answered now, or
 * through waiter once more later. */
static void retry(struct mr_cache *c, uint64_t addr, struct waiter *waiter)
{
	struct reg_allocation *a =
		reg_allocation_of(allocation_containing(base_of(c)->mem, addr));
	struct mr_entry e;
	char why[256] = "";
	int k;

	if (stale(c)) {
		snprintf(why, sizeof(why), "device %s failed while 0x%" PRIx64 " waited for its "
			 "registration; mrd reopens it when it returns",
			 provider_of(c)->caps.device, addr);
		k = -ENODEV;
	} else if (c->closing) {
		snprintf(why, sizeof(why), "the client's PD was let go while 0x%" PRIx64 " waited",
			 addr);
		k = -ECONNRESET;
	} else if (cached(c, addr, &e))
		k = 0;
	else if (!a) {
		snprintf(why, sizeof(why), "0x%" PRIx64 " was freed while it was being registered",
			 addr);
		k = -ENOENT;
	} else
		k = cover_or_miss(c, a, addr, &e, why, sizeof(why), waiter);
	if (k != -EINPROGRESS)
		waiter->resume(waiter, k, k < 0 ? NULL : &e, why);
}

static void reg_job_done(struct registrar_work *w)
{
	struct reg_job *j = (struct reg_job *)w;
	struct reg_base *r = w->reg;
	struct mr_cache *c = j->cache;
	struct reg_allocation *a = reg_allocation_of(allocation_containing(r->mem, j->addr));
	struct mr_entry e;
	char why[256] = "";
	int k = j->rt.result;

	c->pending_bytes -= j->end - j->start;
	LIST_REMOVE(j, link);
	if (j->allocation) {
		/* A client PD's: its allocation waited (freed or not), and what was made is
		 * let go through it when nobody can take it. */
		struct reg_allocation *ja = j->allocation;
		struct cached_mr *late;

		ja->bound_jobs--;
		/* Its span dropped meanwhile (mr_cache_drop_span): nobody's bytes either. */
		if (k >= 0 && (ja->retired || c->closing ||
			       (!j->range && covered(c, ja, j->start, j->end)) ||
			       !in_a_span(ja, j->start, j->end))) {
			late = detached(c, ja, j->rt.pmr, j->start, j->end, j->spare);
			j->spare = NULL;
			if (!ja->retired)
				let_go(late); /* a retired one's free deregisters it */
			if (ja->retired || c->closing) {
				snprintf(why, sizeof(why), "0x%" PRIx64 " was freed, or its PD let go, "
					 "while it was being registered", j->addr);
				k = ja->retired ? -ENOENT : -ECONNRESET;
				j->waiter->resume(j->waiter, k, NULL, why);
				mr_cache_resume_waits(c, j->lookups);
			} else {
				retry(c, j->addr, j->waiter);
				mr_cache_resume_waits(c, j->lookups);
			}
			r->resume_free(r, ja);
			free(j);
			unhold(c);
			return;
		}
		if (ja->retired)
			a = NULL; /* a failed registration: answered as for the domain's */
		r->resume_free(r, ja);
		if (k < 0) {
			free(j->spare);
			j->spare = NULL;
		}
	}
	if (k < 0) {
		if (pins(j->access))
			mr_cache_uncharge(c, j->start, j->end);
		snprintf(why, sizeof(why), "registering [0x%" PRIx64 ", 0x%" PRIx64 ") failed: %s",
			 j->start, j->end, provider_strerror(provider_of(c), k));
	} else if (!a || a->mem.serial != j->allocation_serial) {
		/* Freed while the worker pinned it: the registration covers nobody's memory. */
		drop(c, j->rt.pmr, j->start, j->end);
		snprintf(why, sizeof(why), "0x%" PRIx64 " was freed while it was being registered",
			 j->addr);
		k = -ENOENT;
	} else if (!j->range && covered(c, a, j->start, j->end)) {
		/* An MR made meanwhile (another lookup's, a pool's) has pages of the run: the first
		 * creator wins, this one goes, and the lookup runs again — for the winner's keys, or
		 * for what is still uncovered — so that no page is pinned and counted twice. */
		drop(c, j->rt.pmr, j->start, j->end);
		retry(c, j->addr, j->waiter);
		goto out;
	} else if (!adopt(c, a, j->rt.pmr, j->start, j->end, j->spare, j->range)) {
		drop(c, j->rt.pmr, j->start, j->end);
		k = -ENOMEM;
	} else if (stale(c)) {
		/* The device failed while the worker registered: the MR is the cache's (the device's
		 * return makes it again), but its keys are of the failed device. */
		snprintf(why, sizeof(why), "device %s failed while [0x%" PRIx64 ", 0x%" PRIx64
			 ") was being registered; mrd reopens it when it returns",
			 provider_of(c)->caps.device, j->start, j->end);
		k = -ENODEV;
	} else
		e = (struct mr_entry){ j->start, j->end, j->rt.pmr->lkey, j->rt.pmr->rkey };
	j->waiter->resume(j->waiter, k, k < 0 ? NULL : &e, why);
out:
	/* Lookups inside the run get its keys now, or register what is left. */
	mr_cache_resume_waits(c, j->lookups);
	free(j);
	unhold(c);
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

int mr_cache_find(struct mr_cache *c, uint64_t addr, struct mr_entry *ret, char *why,
		  size_t why_size, struct reg_allocation **ret_a)
{
	struct reg_base *r = base_of(c);
	struct reg_allocation *a;

	c->lookups++;
	if (c->closing) {
		snprintf(why, why_size, "the client's PD was let go");
		return -ECONNRESET;
	}
	if (c->own_pd && provider_lost(provider_of(c))) {
		snprintf(why, why_size, "device %s failed: the client's context on it is gone with "
			 "its MRs; bind a new one (mrd_client_bind_pd) once the device is back",
			 provider_of(c)->caps.device);
		return -ENODEV;
	}
	if (!c->own_pd && c->keys_stale) { /* a batch's next address, after a wait the failure ended */
		snprintf(why, why_size, "device %s failed; mrd reopens it when it returns",
			 r->provider->caps.device);
		return -ENODEV;
	}
	if (cached(c, addr, ret))
		return 0;

	a = reg_allocation_of(allocation_containing(r->mem, addr));
	/* The domain's: domain_lookup checked the asker. */
	if (a && reg_kind_of(a) == REG_KIND_ALIAS && c->own_pd &&
	    (!a->mem.owner || a->mem.owner->pid != c->pid)) {
		/* Its pages are a program's buffer at the alias: an MR anywhere else would hand
		 * another PD keys to that program's memory, at an address nobody else maps. */
		c->misses++;
		snprintf(why, why_size, "0x%" PRIx64 " is memory process %d maps at 0x%" PRIx64
			 " (libmrd-preload.so): only its own PDs register it", addr,
			 a->mem.owner ? a->mem.owner->pid : 0, allocation_iova(&a->mem, addr));
		return -EACCES;
	}
	*ret_a = a;
	return MR_CACHE_MISS;
}

int mr_cache_miss(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
		  struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter)
{
	if (a && a->mem.read_only && c->own_pd) {
		/* The MR would be the client's object, and a rereg that only adds write access
		 * checks nothing of the pages (Linux 6.12 ib_uverbs_rereg_mr, rxe_rereg_user_mr):
		 * a client could write what it may only read (a memfd sealed against writes). */
		c->misses++;
		snprintf(why, why_size, "0x%" PRIx64 " is read-only memory: mrd registers it in the "
			 "domain's PD alone (a client could rereg its own PD's MR to add write)",
			 addr);
		return -EOPNOTSUPP;
	}
	c->misses++;
	if (!a) {
		snprintf(why, why_size, "0x%" PRIx64 " is not in memory allocated in domain %s",
			 addr, base_of(c)->name);
		return -ENOENT;
	}
	return cover_or_miss(c, a, addr, ret, why, why_size, waiter);
}

int mr_cache_lookup(struct mr_cache *c, uint64_t addr, struct mr_entry *ret, char *why,
		    size_t why_size, struct waiter *waiter)
{
	struct reg_allocation *a = NULL;
	int k = mr_cache_find(c, addr, ret, why, why_size, &a);

	return k == MR_CACHE_MISS ? mr_cache_miss(c, a, addr, ret, why, why_size, waiter) : k;
}

/* A range MR of c covering [addr, addr + len), if any. */
static bool range_cached(const struct mr_cache *c, uint64_t addr, uint64_t len,
			 struct mr_entry *ret)
{
	const struct cached_mr *mr;

	LIST_FOREACH(mr, &c->range_mrs, link) {
		struct mr_entry e = entry_of(mr);

		if (mr_entry_covers(&e, addr, len)) {
			*ret = e;
			return true;
		}
	}
	return false;
}

int mr_cache_find_range(struct mr_cache *c, uint64_t addr, uint64_t len, struct mr_entry *ret,
			char *why, size_t why_size, struct reg_allocation **ret_a)
{
	struct mr_entry e;
	int k = mr_cache_find(c, addr, &e, why, why_size, ret_a);

	if (k < 0)
		return k;
	if (k == 0 && mr_entry_covers(&e, addr, len)) {
		*ret = e;
		return 0;
	}
	if (range_cached(c, addr, len, ret))
		return 0;
	if (k == 0) /* the table's MR covers less: the allocation is the one holding addr */
		*ret_a = reg_allocation_of(allocation_containing(base_of(c)->mem, addr));
	return MR_CACHE_MISS;
}

/* The range's refusals before anything is registered: 0, or -ERANGE with why. */
static int range_check(const struct mr_cache *c, const struct reg_allocation *a, uint64_t addr,
		       uint64_t len, char *why, size_t why_size)
{
	uint64_t base = allocation_address(&a->mem), end = base + a->mem.length, lo, hi, s, e;
	const void *other = NULL;

	if (len > end - addr) {
		snprintf(why, why_size, "[0x%" PRIx64 ", +0x%" PRIx64 ") crosses the end of its "
			 "allocation [0x%" PRIx64 ", 0x%" PRIx64 ")", addr, len, base, end);
		return -ERANGE;
	}
	if (reg_kind_of(a) == REG_KIND_ALIAS && a->mem.span_length &&
	    (!allocation_span_at(&a->mem, addr - base, &lo, &hi) || len > base + hi - addr)) {
		snprintf(why, why_size, "[0x%" PRIx64 ", +0x%" PRIx64 ") is not inside one "
			 "registered span of [0x%" PRIx64 ", 0x%" PRIx64 ")", addr, len, base, end);
		return -ERANGE;
	}
	while (c->others && c->others->next(a, &other, &s, &e))
		if (s < addr + len && addr < e) {
			snprintf(why, why_size, "[0x%" PRIx64 ", +0x%" PRIx64 ") crosses the "
				 "mempool MR [0x%" PRIx64 ", 0x%" PRIx64 "): look up inside it",
				 addr, len, s, e);
			return -ERANGE;
		}
	return 0;
}

int mr_cache_miss_range(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
			uint64_t len, struct mr_entry *ret, char *why, size_t why_size,
			struct waiter *waiter)
{
	const struct provider_caps *caps = &provider_of(c)->caps;
	uint64_t ps, base, start, end;
	struct mr_entry e;
	unsigned access;
	int k;

	if (!a || (a->mem.read_only && c->own_pd))
		return mr_cache_miss(c, a, addr, ret, why, why_size, waiter); /* its refusal */
	/* Inside another's MR (a mempool's): that one, when it covers the range. */
	k = c->others ? c->others->cover(c, a, addr, &e, why, why_size, waiter) : MR_CACHE_MISS;
	if (k != MR_CACHE_MISS) {
		if (k == 0 && !mr_entry_covers(&e, addr, len)) {
			snprintf(why, why_size, "[0x%" PRIx64 ", +0x%" PRIx64 ") crosses the end of "
				 "the mempool MR [0x%" PRIx64 ", 0x%" PRIx64 ")", addr, len,
				 e.start, e.end);
			return -ERANGE;
		}
		if (k == 0)
			*ret = e;
		return k;
	}
	k = range_check(c, a, addr, len, why, why_size);
	if (k < 0)
		return k;
	/* Nothing at addr yet: the policy's registration, when it covers the range (contig). */
	if (c->policy != MR_POLICY_PAGE && !cached(c, addr, &e) && !pending_run(c, a, addr)) {
		k = mr_cache_miss(c, a, addr, &e, why, why_size, waiter);
		if (k != 0 || mr_entry_covers(&e, addr, len)) {
			if (k == 0)
				*ret = e;
			return k;
		}
	}
	if (c->n_range_mrs >= MR_CACHE_RANGES_MAX) {
		snprintf(why, why_size, "domain %s holds %u range lookups' MRs already: free "
			 "memory, or use [cache] policy = contig", base_of(c)->name,
			 MR_CACHE_RANGES_MAX);
		return -ENOSPC;
	}
	/* An MR of the range's pages alone, beside the table's (which it may overlap). */
	ps = a->mem.arena->page_size;
	base = allocation_address(&a->mem);
	start = addr - (addr - base) % ps;
	end = (addr + len - base + ps - 1) / ps * ps; /* range_check: at most a's length */
	end = base + (end < a->mem.length ? end : a->mem.length);
	if (end - start > caps->max_mr_size) {
		snprintf(why, why_size, "[0x%" PRIx64 ", +0x%" PRIx64 ") is more than the device's "
			 "largest MR (%" PRIu64 " bytes)", addr, len, (uint64_t)caps->max_mr_size);
		return -ERANGE;
	}
	access = access_of(c, a);
	if (reg_kind_of(a) == REG_KIND_ON_DEMAND && provider_odp_covers(caps, access))
		access |= MRD_ACCESS_ON_DEMAND; /* on-demand memory stays unpinned */
	c->misses++;
	return register_run(c, a, addr, start, end, access, true, ret, why, why_size, waiter);
}

int mr_cache_lookup_range(struct mr_cache *c, uint64_t addr, uint64_t len, struct mr_entry *ret,
			  char *why, size_t why_size, struct waiter *waiter)
{
	struct reg_allocation *a = NULL;
	int k = mr_cache_find_range(c, addr, len, ret, why, why_size, &a);

	return k == MR_CACHE_MISS ?
	       mr_cache_miss_range(c, a, addr, len, ret, why, why_size, waiter) : k;
}

int mr_cache_listen_gone(struct mr_cache *c, uint64_t addr, struct mr_gone_listener *l)
{
	struct cached_mr *mr;

	LIST_FOREACH(mr, &c->mrs, link)
		if (addr >= mr->start && addr < mr->end) {
			/* Hung already (again, or bound anew): on one list alone, or the list loops. */
			mr_cache_unlisten_gone(l);
			LIST_INSERT_HEAD(&mr->listeners, l, link);
			return 0;
		}
	return -ENOENT;
}

int mr_cache_listen_entry(struct mr_cache *c, const struct mr_entry *e, struct mr_gone_listener *l,
			  struct cached_mr **ret)
{
	struct cached_mr *mr = mr_cache_by_lkey(c, e->lkey);

	if (!mr || !mr->in_cache || mr->start != e->start || mr->end != e->end)
		return -ENOENT;
	mr_cache_unlisten_gone(l);
	LIST_INSERT_HEAD(&mr->listeners, l, link);
	*ret = mr;
	return 0;
}

void mr_cache_unlisten_gone(struct mr_gone_listener *l)
{
	if (l->link.le_prev)
		LIST_REMOVE(l, link);
	l->link.le_prev = NULL;
}

void mr_cache_flush(struct mr_cache *c)
{
	rebuild(c);
}

/* mr out of its cache's table and list, on its way to deregistration (leave()); an overflown
 * table is left for the caller to rebuild, once for many. */
static void out_of_tables(struct cached_mr *mr)
{
	struct mr_cache *o = mr->cache;

	if (!o->table.overflow && !mr->range)
		(void)mr_table_remove(&o->table, mr->start);
	unlink_mr(mr);
	leave(mr);
}

/* a's MRs are of every cache over it: each leaves its own. */
uint64_t mr_cache_retire(struct mr_cache *c, struct reg_allocation *a)
{
	struct cached_mr *mr;
	uint64_t bytes = 0;

	(void)c;
	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		bytes += mr->end - mr->start;
		if (mr->in_cache) /* else let go of by its client PD already */
			out_of_tables(mr);
	}
	LIST_FOREACH(mr, &a->mrs, alloc_link)
		if (mr->cache->table.overflow)
			rebuild(mr->cache);
	return bytes;
}

/* A dropped span's MRs, deregistered on a worker as a free's are (big, or their PD busy):
 * the drop is answered once they are gone. */
struct span_drop_job {
	struct registrar_work base;
	struct reg_allocation *allocation;
	struct waiter *waiter;
	uint64_t start, end;
	/* An MR over the span already out of the tables ([out_start, out_end), empty if none):
	 * its range, as it may be gone by the time the job ends. */
	uint64_t out_start, out_end;
	unsigned n;
	struct span_dereg {
		struct cached_mr *mr;
		int result; /* written by the worker, read on the loop after it */
	} mrs[];
};

static void span_drop_run(struct registrar_work *w)
{
	struct span_drop_job *j = (struct span_drop_job *)w;

	for (unsigned i = 0; i < j->n; i++)
		j->mrs[i].result = reg_dereg(w->reg, j->mrs[i].mr->pmr);
}

/* The end of deregistering the span's MRs (each with its dereg's result): 0, or -EBUSY
 * with why when the device kept one (it stays on a, pinned, until a's free). */
static int span_dereg_end(struct span_dereg *mrs, unsigned n, uint64_t start, uint64_t end,
			  char *why, size_t why_size)
{
	int failed = 0;

	for (unsigned i = 0; i < n; i++) {
		if (mrs[i].result == 0)
			mrs[i].mr->pmr = NULL;
		else if (!failed)
			failed = mrs[i].result;
		let_go_end(mrs[i].mr, mrs[i].result);
	}
	if (failed < 0)
		snprintf(why, why_size, "the device kept an MR over [0x%" PRIx64 ", 0x%" PRIx64
			 ") (a memory window bound to it?): %s; it stays pinned until the "
			 "allocation is freed", start, end, strerror(-failed));
	return failed < 0 ? -EBUSY : 0;
}

/* The drop's answer once its own MRs are gone: EBUSY when one over the span was out of the
 * tables before it (another PD's, on a worker's way out or kept by the device): its keys may
 * work until it goes; asking again changes nothing, the rest is gone. */
static int span_drop_result(int k, uint64_t out_start, uint64_t out_end, char *why,
			    size_t why_size)
{
	if (k < 0 || out_start == out_end)
		return k;
	snprintf(why, why_size, "an MR over [0x%" PRIx64 ", 0x%" PRIx64 ") was let go of before "
		 "(its PD went) and is being deregistered or kept by its device (a memory window "
		 "bound to it): its keys may work until it goes; the span's other MRs are gone",
		 out_start, out_end);
	return -EBUSY;
}

static void span_drop_done(struct registrar_work *w)
{
	struct span_drop_job *j = (struct span_drop_job *)w;
	struct reg_allocation *a = j->allocation;
	char why[256] = "";
	int k = span_dereg_end(j->mrs, j->n, j->start, j->end, why, sizeof(why));

	k = span_drop_result(k, j->out_start, j->out_end, why, sizeof(why));
	j->waiter->resume(j->waiter, k, NULL, why);
	a->bound_jobs--;
	w->reg->resume_free(w->reg, a); /* a free that waited for it */
	free(j);
}

unsigned mr_cache_out_of_tables(const struct reg_allocation *a)
{
	const struct cached_mr *mr;
	unsigned n = 0;

	LIST_FOREACH(mr, &a->mrs, alloc_link)
		n += !mr->in_cache;
	return n;
}

int mr_cache_drop_span(struct reg_allocation *a, uint64_t start, uint64_t end, char *why,
		       size_t why_size, struct waiter *waiter)
{
	uint64_t base = allocation_address(&a->mem), bytes = 0;
	struct span_drop_job *j;
	uint64_t out_start = 0, out_end = 0;
	struct reg_base *r = NULL;
	struct cached_mr *mr;
	bool busy = false;
	unsigned n = 0;
	int k;

	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		if (mr->end <= start || end <= mr->start)
			continue;
		if (!mr->in_cache) {
			/* Out of the tables already: nothing this drop can do for it, all the
			 * others go (the drop is the shim's last word on the span). */
			if (out_start == out_end) {
				out_start = mr->start;
				out_end = mr->end;
			}
			continue;
		}
		r = base_of(mr->cache);
		bytes += mr->end - mr->start;
		busy = busy || offload(mr->cache, mr->end - mr->start);
		n++;
	}
	j = calloc(1, sizeof(*j) + n * sizeof(j->mrs[0]));
	if (!j) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	/* The span first: from here on no lookup registers in it. */
	k = allocation_drop_span(&a->mem, start - base, end - start, why, why_size);
	if (k < 0 || n == 0) {
		free(j);
		return span_drop_result(k, out_start, out_end, why, why_size);
	}
	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		if (mr->end <= start || end <= mr->start || !mr->in_cache)
			continue;
		out_of_tables(mr);
		if (mr->cache->table.overflow)
			rebuild(mr->cache);
		j->mrs[j->n++].mr = mr;
	}
	/* The loop's share as for registrations: many small MRs (policy page) take no more of
	 * it than one big one would. */
	if (busy || reg_offload(r, bytes) || !reg_loop_may(r, j->n - 1, bytes)) {
		j->allocation = a;
		j->waiter = waiter;
		j->start = start;
		j->end = end;
		j->out_start = out_start;
		j->out_end = out_end;
		a->bound_jobs++; /* a free of a waits for it */
		reg_start(r, &j->base, span_drop_run, span_drop_done, true);
		return -EINPROGRESS;
	}
	/* Small, and nothing holds its PD: on the loop, answered now. */
	for (unsigned i = 0; i < j->n; i++) {
		j->mrs[i].result = reg_dereg(r, j->mrs[i].mr->pmr);
		reg_loop_did(r, j->mrs[i].mr->end - j->mrs[i].mr->start);
	}
	k = span_dereg_end(j->mrs, j->n, start, end, why, why_size);
	free(j);
	return span_drop_result(k, out_start, out_end, why, why_size);
}

void mr_cache_deregister(const struct mr_cache *c, struct reg_allocation *a)
{
	struct cached_mr *mr;

	LIST_FOREACH(mr, &a->mrs, alloc_link) {
		int k = mr->pmr ? reg_dereg(base_of(c), mr->pmr) : 0;

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
		if (mr->pins)
			mr_cache_uncharge(c, mr->start, mr->end);
		mr->cache->deregistrations++;
		unhold(mr->cache);
		free(mr);
	}
}

void mr_cache_drop_kept(struct mr_cache *c, struct reg_allocation *a)
{
	struct cached_mr *mr;

	while ((mr = LIST_FIRST(&a->mrs))) {
		LIST_REMOVE(mr, alloc_link);
		if (mr->pins)
			mr_cache_uncharge(c, mr->start, mr->end);
		unhold(mr->cache);
		free(mr);
	}
}

void mr_cache_close(struct mr_cache *c)
{
	/* Nothing looks it up any more (mr_cache_lookup, retry): the table goes at once, the
	 * list a share at a time. */
	c->closing = true;
	mr_table_clear(&c->table);
}

bool mr_cache_drop_share(struct mr_cache *c, bool all, unsigned *made)
{
	struct reg_base *r = base_of(c);
	struct cached_mr *mr;
	bool done = true;

	hold(c); /* the last MR's unhold must not free c under the loop */
	while ((mr = first_mr(c))) {
		if (!all && *made > 0 && !reg_loop_may(r, *made, mr->end - mr->start)) {
			done = false;
			break;
		}
		reg_loop_did(r, mr->end - mr->start);
		unlink_mr(mr);
		leave(mr);
		let_go(mr);
		(*made)++;
	}
	unhold(c);
	return done;
}

uint64_t mr_cache_bytes(const struct mr_cache *c)
{
	const struct cached_mr *mr;
	uint64_t bytes = 0;

	LIST_FOREACH(mr, &c->mrs, link)
		bytes += mr->end - mr->start;
	LIST_FOREACH(mr, &c->range_mrs, link)
		bytes += mr->end - mr->start;
	return bytes;
}
