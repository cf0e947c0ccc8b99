/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "provider/provider.h"
#include "memory/allocation.h"
#include "registration/odp.h"
#include "registration/reg-allocation.h"
#include "registration/reg-base.h"
#include "registration/reg-owner.h"

static size_t chunk_of(const struct odp *o, uint64_t addr)
{
	return (size_t)((addr - o->base) >> o->chunk_shift);
}

/* a's slot for addr's chunk; the slots exist (ensure_slots() ran on the loop first). */
static struct odp_child **slot_of(const struct odp *o, const struct reg_allocation *a,
				  uint64_t addr)
{
	return &a->odp_slots->child[chunk_of(o, addr) - chunk_of(o, allocation_address(&a->mem))];
}

/* On the loop, before any work on a may look in its slots. */
static int ensure_slots(const struct odp *o, struct reg_allocation *a)
{
	uint64_t start = allocation_address(&a->mem);
	size_t n;

	if (a->odp_slots)
		return 0;
	n = chunk_of(o, start + a->mem.length - 1) - chunk_of(o, start) + 1;
	a->odp_slots = calloc(1, sizeof(*a->odp_slots) + n * sizeof(a->odp_slots->child[0]));
	if (!a->odp_slots)
		return -ENOMEM;
	a->odp_slots->n = n;
	return 0;
}

/* The piece of a in addr's chunk. */
static void piece_of(const struct odp *o, const struct reg_allocation *a, uint64_t addr,
		     uint64_t *ret_start, uint64_t *ret_end)
{
	uint64_t chunk = o->base + ((uint64_t)chunk_of(o, addr) << o->chunk_shift);
	uint64_t start = allocation_address(&a->mem), end = start + a->mem.length;

	*ret_start = chunk > start ? chunk : start;
	*ret_end = chunk + ((uint64_t)1 << o->chunk_shift) < end ?
			   chunk + ((uint64_t)1 << o->chunk_shift) :
			   end;
}

/* An on-demand MR over [start, end): on the loop or on a worker. */
static struct odp_child *child_new(struct odp *o, struct reg_allocation *a, uint64_t start,
				   uint64_t end, unsigned access, int *ret_error)
{
	struct odp_child *c = calloc(1, sizeof(*c));
	int k;

	if (!c) {
		*ret_error = -ENOMEM;
		return NULL;
	}
	k = frmr_pools_reg(&o->reg->pools, (void *)(uintptr_t)start, end - start,
			   access | MRD_ACCESS_ON_DEMAND, false, &c->pmr);
	if (k < 0) {
		free(c);
		*ret_error = k;
		return NULL;
	}
	c->odp = o;
	c->start = start;
	c->end = end;
	c->allocation = a; /* only stored here: a worker never reads the allocation */
	return c;
}

/* A child no walker can reach: one that lost the race to be installed, or at teardown. */
static void child_free(struct odp *o, struct odp_child *c)
{
	if (c->pmr)
		(void)frmr_pools_dereg(&o->reg->pools, c->pmr);
	free(c);
}

/* Installs c in its (empty) slot with a compare-and-exchange, unless a child is there already:
 * returns the one that stays (the caller frees c when it is not c). */
static struct odp_child *install(struct odp_child **slot, struct odp_child *c)
{
	struct odp_child *have = NULL;

	if (__atomic_compare_exchange_n(slot, &have, c, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return c;
	return have;
}

static struct mr_entry entry_of(const struct odp_child *c)
{
	return (struct mr_entry){ c->start, c->end, c->pmr->lkey, c->pmr->rkey };
}

/* Into its allocation's list: live. */
static void link_child(struct odp *o, struct odp_child *c)
{
	c->linked = true;
	LIST_INSERT_HEAD(&c->allocation->odp_children, c, link);
	LIST_INSERT_HEAD(&o->all, c, all);
	o->children++;
}

/* One chunk's part of a prefetch. */
struct odp_piece {
	uint64_t start, end;     /* the child's range */
	uint64_t addr, length;   /* the advice's */
	struct odp_child **slot; /* its allocation's, for this chunk */
	struct odp_child *child; /* its allocation's: the job's count keeps it */
	bool created;            /* this job installed it */
};

struct prefetch_job {
	struct registrar_work base;
	struct odp *odp;
	struct reg_owner *owner; /* NULL once it left */
	LIST_ENTRY(prefetch_job) owner_link;
	TAILQ_ENTRY(prefetch_job) queue; /* the domain's waiting ones */
	bool waiting;          /* a flush waiting for room, not submitted yet */
	struct waiter *waiter;
	struct reg_allocation *allocation; /* counts the job: it stays until the job is done */
	enum odp_advice advice;
	bool lookup;           /* a lookup's child, made here while the provider was busy */
	unsigned access;
	/* Written by the worker (with pieces[].child and .created), read on the loop after it. */
	struct {
		int result;
		uint64_t pages, created;
	} rt;
	size_t n;
	struct odp_piece pieces[];
};

/* Out of use: a zombie, on its retired allocation's list still. Its MR goes once no work on
 * the allocation remains (kill_zombies), and its memory with it. */
static void make_zombie(struct odp *o, struct odp_child *c)
{
	c->zombie = true;
	o->zombies++;
}

static void maybe_finish(struct odp *o, struct reg_allocation *a);

/* Its MR went: nothing can reach it any more (no work on its allocation remains). */
static void zombie_dead(struct odp *o, struct odp_child *c)
{
	o->zombies--;
	o->stats.children_destroyed++;
	LIST_REMOVE(c, all);
	free(c);
}

/* Its dereg failed: the device keeps an on-demand MR whose keys may fault the allocation's
 * pages in again, so it stays on the allocation's odp_stuck (which quarantines the run) until
 * a dereg succeeds (odp_retry_stuck). */
static void zombie_stuck(struct odp *o, struct odp_child *c, int result)
{
	struct reg_allocation *a = c->allocation;

	o->zombies--;
	LIST_REMOVE(c, all);
	LIST_INSERT_HEAD(&a->odp_stuck, c, link);
	if (!a->dereg_error)
		a->dereg_error = result;
}

/* A zombie's MR gone (or kept by the device) on a worker: it counted as work on its
 * allocation until now. */
static void zombie_gone(struct reg_base *b, void *arg, int result)
{
	struct odp_child *c = arg;
	struct odp *o = c->odp;
	struct reg_allocation *a = c->allocation;

	(void)b;
	if (result < 0)
		zombie_stuck(o, c, result);
	else
		zombie_dead(o, c);
	a->odp_jobs--;
	maybe_finish(o, a);
}

/* a is retired and no work on it remains: its zombies' MRs go (their keys die), so its pages
 * may go back. While a soft Dma may copy through them (reg_busy) workers deregister them,
 * each counted as work on a (so a's Free waits), and the loop goes on. */
static void kill_zombies(struct odp *o, struct reg_allocation *a)
{
	struct odp_child *c;
	int k;

	if (!a->retired || a->odp_jobs > 0)
		return;
	while ((c = LIST_FIRST(&a->odp_children))) {
		LIST_REMOVE(c, link);
		if (reg_offload(o->reg, 0) &&
		    reg_dereg_on_worker(o->reg, c->pmr, zombie_gone, c) == 0) {
			a->odp_jobs++;
			continue;
		}
		k = frmr_pools_dereg(&o->reg->pools, c->pmr);
		if (k < 0)
			zombie_stuck(o, c, k);
		else
			zombie_dead(o, c);
	}
}

bool odp_retry_stuck(struct odp *o, struct reg_allocation *a)
{
	struct odp_child *c, *next;

	for (c = LIST_FIRST(&a->odp_stuck); c; c = next) {
		next = LIST_NEXT(c, link);
		if (frmr_pools_dereg(&o->reg->pools, c->pmr) < 0)
			continue;
		LIST_REMOVE(c, link);
		o->stats.children_destroyed++;
		free(c);
	}
	return LIST_EMPTY(&a->odp_stuck);
}

void odp_drop_stuck(struct reg_allocation *a)
{
	struct odp_child *c;

	while ((c = LIST_FIRST(&a->odp_stuck))) {
		LIST_REMOVE(c, link);
		free(c);
	}
}

/* A freed allocation whose Free waited: done once no work and no MR of it remains. */
static void maybe_finish(struct odp *o, struct reg_allocation *a)
{
	o->reg->resume_free(o->reg, a);
}

int odp_init(struct odp *o, struct reg_base *r, uint64_t window_base)
{
	*o = (struct odp){ .reg = r, .base = window_base };
	/* A child must fit the device: chunks no larger than its largest MR. */
	while (((uint64_t)1 << o->chunk_shift) < o->reg->config->odp_chunk &&
	       ((uint64_t)2 << o->chunk_shift) <= o->reg->provider->caps.max_mr_size)
		o->chunk_shift++;
	TAILQ_INIT(&o->waiting);
	LIST_INIT(&o->all);
	return 0;
}

void odp_done(struct odp *o)
{
	struct odp_child *c;

	/* Jobs hold the domain, and allocations go before it: none should be left. */
	while ((c = LIST_FIRST(&o->all))) {
		LIST_REMOVE(c, all);
		child_free(o, c);
	}
}

void odp_forget_allocation(struct reg_allocation *a)
{
	free(a->odp_slots);
	a->odp_slots = NULL;
}

static int fault_on_worker(struct odp *o, struct reg_allocation *a, uint64_t addr,
			   uint64_t start, uint64_t end, struct waiter *waiter);

int odp_fault(struct odp *o, struct reg_allocation *a, uint64_t addr, struct mr_entry *ret,
	      char *why, size_t why_size, struct waiter *waiter)
{
	struct odp_child **slot, *c, *got;
	uint64_t start, end;
	int k;

	piece_of(o, a, addr, &start, &end);
	k = ensure_slots(o, a);
	if (k < 0)
		return k;
	slot = slot_of(o, a, addr);
	c = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	/* A child pins nothing, so it is quick to make, unless a worker holds the provider (a
	 * big registration) or a Dma faults pages in: then the loop would wait for the
	 * provider's lock, or for mrd's mmap_lock (reg_busy). */
	if (!c && waiter && reg_offload(o->reg, 0))
		return fault_on_worker(o, a, addr, start, end, waiter);
	if (!c) {
		o->stats.faults++;
		c = child_new(o, a, start, end, reg_allocation_access(a, &o->reg->provider->caps),
			      &k);
		if (!c) {
			snprintf(why, why_size, "registering [0x%" PRIx64 ", 0x%" PRIx64 ") on demand "
				 "failed: %s", start, end, provider_strerror(o->reg->provider, k));
			return k;
		}
		got = install(slot, c);
		if (got != c)
			child_free(o, c); /* a worker's prefetch made it first */
		else
			o->stats.children_created++;
		c = got;
	}
	*ret = entry_of(c);
	if (!c->linked)
		link_child(o, c);
	return 0;
}

static enum provider_advice advice_of(enum odp_advice advice)
{
	return advice == ODP_PREFETCH_WRITE	? PROVIDER_ADVISE_PREFETCH_WRITE :
	       advice == ODP_PREFETCH_NO_FAULT ? PROVIDER_ADVISE_PREFETCH_NO_FAULT :
						  PROVIDER_ADVISE_PREFETCH;
}

static void prefetch_run(struct registrar_work *w)
{
	struct prefetch_job *j = (struct prefetch_job *)w;
	struct odp *o = j->odp;
	long page = o->reg->provider->caps.page_size ? o->reg->provider->caps.page_size : 4096;

	for (size_t i = 0; i < j->n; i++) {
		struct odp_piece *p = &j->pieces[i];
		struct odp_child *c = p->child, *got;
		int k = 0;

		if (!c) {
			c = child_new(o, j->allocation, p->start, p->end, j->access, &k);
			if (!c) {
				j->rt.result = k;
				continue;
			}
			got = install(p->slot, c);
			if (got != c)
				child_free(o, c); /* the loop or another job made it first */
			else {
				p->created = true;
				j->rt.created++;
			}
			p->child = c = got;
		}
		if (j->lookup)
			continue; /* the child is all it asked for */
		k = provider_advise(c->pmr, advice_of(j->advice), p->addr, p->length);
		if (k < 0)
			j->rt.result = k;
		else if (j->advice != ODP_PREFETCH_NO_FAULT) /* it faults nothing in */
			j->rt.pages += (p->addr + p->length + page - 1) / page - p->addr / page;
	}
}

static bool room_for(const struct odp *o, const struct reg_owner *owner)
{
	return owner->n_prefetches < ODP_PREFETCH_IN_FLIGHT && o->jobs < ODP_DOMAIN_JOBS_MAX;
}

/* To the workers. */
static void submit(struct odp *o, struct prefetch_job *j)
{

	j->waiting = false;
	if (j->owner)
		j->owner->n_prefetches++;
	o->jobs++;
	registrar_submit(&j->base);
}

/* A lookup's answer from its job: the child, linked from now (a prefetch may have made it
 * first, not yet linked), unless the memory went meanwhile. */
static int lookup_answer(struct odp *o, struct prefetch_job *j, struct mr_entry *ret,
			 char *why, size_t why_size)
{
	const struct odp_piece *p = &j->pieces[0];
	struct odp_child *c = p->child;

	if (j->rt.result < 0) {
		snprintf(why, why_size, "registering [0x%" PRIx64 ", 0x%" PRIx64 ") on demand "
			 "failed: %s", p->start, p->end,
			 provider_strerror(o->reg->provider, j->rt.result));
		return j->rt.result;
	}
	if (j->allocation->retired || !c || c->zombie) {
		snprintf(why, why_size, "0x%" PRIx64 " was freed while it was being registered",
			 p->addr);
		return -ENOENT;
	}
	*ret = entry_of(c);
	if (!c->linked)
		link_child(o, c);
	return 0;
}

/* The end of a job, done or never submitted: the counts, the answer, the allocation. */
static void job_end(struct odp *o, struct prefetch_job *j)
{
	struct reg_allocation *a = j->allocation;
	char why[256] = "";

	if (j->lookup) {
		struct mr_entry e;
		int k = lookup_answer(o, j, &e, why, sizeof(why));

		a->odp_jobs--;
		j->waiter->resume(j->waiter, k, k < 0 ? NULL : &e, why);
		free(j);
		kill_zombies(o, a);
		maybe_finish(o, a);
		return;
	}
	a->odp_jobs--;
	if (j->owner)
		LIST_REMOVE(j, owner_link);
	if (j->waiter) {
		if (j->rt.result == -EOPNOTSUPP && j->advice == ODP_PREFETCH_NO_FAULT)
			snprintf(why, sizeof(why), "prefetch failed: the device cannot prefetch "
				 "without faulting pages in (PREFETCH_NO_FAULT; use PREFETCH)");
		else if (j->rt.result < 0)
			snprintf(why, sizeof(why), "prefetch failed: %s", strerror(-j->rt.result));
		j->waiter->resume(j->waiter, j->rt.result, NULL, why);
	}
	free(j);
	kill_zombies(o, a);
	maybe_finish(o, a);
}

/* Flushes that waited for room, in the order they came (not while the workers drain: a client
 * that goes cancels its own). */
static void start_waiting(struct odp *o)
{
	struct prefetch_job *j, *next;

	if (__atomic_load_n(o->reg->stopping, __ATOMIC_ACQUIRE))
		return;
	for (j = TAILQ_FIRST(&o->waiting); j && o->jobs < ODP_DOMAIN_JOBS_MAX; j = next) {
		next = TAILQ_NEXT(j, queue);
		if (!room_for(o, j->owner))
			continue;
		TAILQ_REMOVE(&o->waiting, j, queue);
		submit(o, j);
	}
}

static void prefetch_done(struct registrar_work *w)
{
	struct prefetch_job *j = (struct prefetch_job *)w;
	struct odp *o = j->odp;
	struct reg_allocation *a = j->allocation;

	o->jobs--;
	if (j->owner)
		j->owner->n_prefetches--;
	o->stats.children_created += j->rt.created;
	o->stats.prefetch_pages += j->rt.pages;
	for (size_t i = 0; i < j->n; i++) {
		struct odp_child *c = j->pieces[i].child;

		/* Workers only make children; the loop links them (or a lookup did already). */
		if (!c || !j->pieces[i].created || c->linked || c->zombie)
			continue;
		if (!a->retired) {
			link_child(o, c);
		} else { /* freed while it was made: nobody gets its key */
			make_zombie(o, c);
			LIST_INSERT_HEAD(&a->odp_children, c, link);
			LIST_INSERT_HEAD(&o->all, c, all);
		}
	}
	job_end(o, j);
	start_waiting(o);
}

/* Work of n pieces on a, for the caller to fill in, then hold (job_hold). */
static struct prefetch_job *job_new(struct odp *o, struct reg_allocation *a, size_t n,
				    enum odp_advice advice, struct waiter *waiter)
{
	struct prefetch_job *j = calloc(1, sizeof(*j) + n * sizeof(j->pieces[0]));

	if (!j)
		return NULL;
	j->odp = o;
	j->waiter = waiter;
	j->allocation = a;
	j->advice = advice;
	j->access = reg_allocation_access(a, &o->reg->provider->caps);
	j->n = n;
	return j;
}

/* From now on it holds the domain and counts on its allocation, queued or waiting for room. A
 * lookup's job is busy (reg_busy): it was made because the provider was, and waits for
 * its lock to register; a prefetch's advice runs without the lock. */
static void job_hold(struct odp *o, struct prefetch_job *j)
{
	reg_job_init(o->reg, &j->base, prefetch_run, prefetch_done, j->lookup);
	j->allocation->odp_jobs++;
}

/* Makes a lookup's child on a worker, and no advice (prefetch_run), and answers the lookup
 * when done (job_end). */
static int fault_on_worker(struct odp *o, struct reg_allocation *a, uint64_t addr,
			   uint64_t start, uint64_t end, struct waiter *waiter)
{
	struct prefetch_job *j = job_new(o, a, 1, ODP_PREFETCH_NO_FAULT, waiter);

	if (!j)
		return -ENOMEM;
	o->stats.faults++;
	j->pieces[0] = (struct odp_piece){ .start = start, .end = end, .addr = addr, .length = 1,
					   .slot = slot_of(o, a, addr) };
	j->lookup = true;
	job_hold(o, j);
	submit(o, j);
	return -EINPROGRESS;
}

int odp_prefetch(struct odp *o, struct reg_owner *owner, struct reg_allocation *a,
		 uint64_t addr, uint64_t length, enum odp_advice advice, struct waiter *waiter,
		 char *why, size_t why_size)
{
	struct prefetch_job *j;
	size_t n;

	if (!*o->reg->workers)
		return -ESHUTDOWN;
	if (!room_for(o, owner) && !waiter) {
		snprintf(why, why_size, "%u prefetches are queued already: wait for one, or prefetch "
			 "with flush (it waits for room)",
			 o->jobs >= ODP_DOMAIN_JOBS_MAX ? o->jobs : owner->n_prefetches);
		return -EAGAIN;
	}
	n = chunk_of(o, addr + length - 1) - chunk_of(o, addr) + 1;
	if (n > ODP_PREFETCH_CHUNKS_MAX) {
		snprintf(why, why_size, "a prefetch spans at most %u chunks of %" PRIu64 " bytes",
			 ODP_PREFETCH_CHUNKS_MAX, (uint64_t)1 << o->chunk_shift);
		return -EINVAL;
	}
	if (ensure_slots(o, a) < 0)
		return -ENOMEM;
	j = job_new(o, a, n, advice, waiter);
	if (!j)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		struct odp_piece *p = &j->pieces[i];
		uint64_t at = i == 0 ? addr : o->base + ((uint64_t)(chunk_of(o, addr) + i)
							 << o->chunk_shift);

		piece_of(o, a, at, &p->start, &p->end);
		p->addr = at;
		p->length = (addr + length < p->end ? addr + length : p->end) - at;
		/* Its allocation's children stay while the job counts on it. */
		p->slot = slot_of(o, a, at);
		p->child = __atomic_load_n(p->slot, __ATOMIC_ACQUIRE);
	}
	job_hold(o, j);
	j->owner = owner;
	LIST_INSERT_HEAD(&owner->prefetches, j, owner_link);
	o->stats.prefetch_requests++;
	if (room_for(o, owner))
		submit(o, j);
	else {
		/* A flush waits for room: as many of a client's as it may have requests pending
		 * ([limits] requests_in_flight). */
		j->waiting = true;
		TAILQ_INSERT_TAIL(&o->waiting, j, queue);
	}
	return waiter ? -EINPROGRESS : 0;
}

unsigned odp_retire(struct odp *o, struct reg_allocation *a)
{
	struct odp_child *c;

	/* Its children become its zombies, on the same list. */
	LIST_FOREACH(c, &a->odp_children, link) {
		c->linked = false;
		o->children--;
		/* Zapped first, as an MMU notifier would: the device faults no page of it in. Not
		 * while a Dma may copy through it, nor while a's own work may advise it (the zap
		 * would wait for either, on the loop): its MR goes once that is done, on a worker
		 * while a Dma may copy, and its pages stay a's until then. */
		if (!reg_busy(o->reg) && a->odp_jobs == 0) {
			(void)provider_invalidate(c->pmr, c->start, c->end - c->start);
			o->stats.invalidations++;
		}
		make_zombie(o, c);
	}
	/* Work on a not yet done may still use its children, make more and fault its pages in:
	 * the pages wait for it (prefetch_done() finishes the free). */
	kill_zombies(o, a);
	return a->odp_jobs + !LIST_EMPTY(&a->odp_children);
}

void odp_forget_owner(struct odp *o, struct reg_owner *owner)
{
	struct prefetch_job *j;

	while ((j = LIST_FIRST(&owner->prefetches))) {
		LIST_REMOVE(j, owner_link);
		j->owner = NULL;
		if (!j->waiting)
			continue;
		/* Never submitted: it ends here, answering nobody. */
		TAILQ_REMOVE(&o->waiting, j, queue);
		job_end(o, j);
		reg_unhold(o->reg);
	}
	owner->n_prefetches = 0;
}
