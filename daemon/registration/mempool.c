/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "macro.h"
#include "provider/provider.h"
#include "memory/allocation.h"
#include "memory/arena.h"
#include "memory/memory.h"
#include "registration/mempool.h"
#include "registration/mr-cache.h"
#include "registration/reg-allocation.h"
#include "registration/reg-base.h"
#include "registration/reg-owner.h"

/* A range to register, rounded out to the pages of the allocation holding it. */
struct span {
	uint64_t start, end;
	struct reg_allocation *allocation;
};

void mempools_init(struct mempools *p, struct reg_base *r, struct mr_cache *cache)
{
	*p = (struct mempools){ .reg = r, .cache = cache };
	LIST_INIT(&p->regs);
	LIST_INIT(&p->mrs);
}

static struct pool_reg *find(const struct mempools *p, const struct reg_owner *owner,
			     const char *name)
{
	struct pool_reg *reg;

	LIST_FOREACH(reg, &p->regs, link)
		if (reg->owner == owner && strcmp(reg->name, name) == 0)
			return reg;
	return NULL;
}

static int span_compare(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/* Rounds the ranges out to pages and merges the ones that touch in one allocation (an MR that
 * spanned two would outlive the first one freed). Returns how many spans are left. */
static int analyze(struct mempools *p, const uint64_t *starts, const uint64_t *lengths, size_t n,
		   struct span *spans, char *why, size_t why_size)
{
	size_t m = 0;

	for (size_t i = 0; i < n; i++) {
		struct reg_allocation *a =
			reg_allocation_of(allocation_containing(p->reg->mem, starts[i]));
		uint64_t ps, base, end = starts[i] + lengths[i];

		if (lengths[i] == 0 || end < starts[i] || !a ||
		    end > allocation_address(&a->mem) + a->mem.length) {
			snprintf(why, why_size, "range [0x%" PRIx64 ", +0x%" PRIx64 ") is not inside "
				 "one allocation of domain %s", starts[i], lengths[i],
				 p->reg->name);
			return -EFAULT;
		}
		if (reg_kind_of(a) == REG_KIND_ALIAS) { /* its process's PDs alone register it */
			snprintf(why, why_size, "range [0x%" PRIx64 ", +0x%" PRIx64 ") is a program's "
				 "buffer (libmrd-preload.so): no pool registers it", starts[i],
				 lengths[i]);
			return -EACCES;
		}
		ps = a->mem.arena->page_size;
		base = allocation_address(&a->mem);
		spans[i].start = starts[i] - (starts[i] - base) % ps;
		spans[i].end = end + (ps - (end - base) % ps) % ps;
		spans[i].allocation = a;
	}
	qsort(spans, n, sizeof(*spans), span_compare);
	for (size_t i = 0; i < n; i++) {
		if (m > 0 && spans[m - 1].allocation == spans[i].allocation &&
		    spans[i].start <= spans[m - 1].end) {
			if (spans[i].end > spans[m - 1].end)
				spans[m - 1].end = spans[i].end;
			continue;
		}
		spans[m++] = spans[i];
	}
	return (int)m;
}

/* The huge page MR an earlier pool made for exactly this span, if any. */
static struct pool_mr *shared_hugepage(const struct mempools *p, const struct span *s)
{
	const struct arena *arena = s->allocation->mem.arena;
	struct pool_mr *mr;

	if (!arena->hugetlb || s->end - s->start != arena->page_size)
		return NULL;
	LIST_FOREACH(mr, &p->mrs, link)
		if (mr->hugepage && mr->start == s->start && (mr->pending || mr->pmr))
			return mr; /* one whose registration failed is nobody's to share */
	return NULL;
}

struct pool_mr *mempool_mr_containing(const struct reg_allocation *a, uint64_t addr)
{
	struct pool_mr *mr;

	LIST_FOREACH(mr, &a->pool_mrs, alloc_link)
		if (pool_mr_live(mr) && addr >= mr->start && addr < mr->end)
			return mr;
	return NULL;
}

static int cover(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
		 struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter)
{
	struct pool_mr *pm = mempool_mr_containing(a, addr);

	(void)c;
	if (!pm)
		return MR_CACHE_MISS;
	if (pm->pending) /* a worker is making it: the lookup takes it once it is made */
		return mr_cache_wait(&pm->lookups, addr, waiter, "for a mempool", why, why_size);
	*ret = (struct mr_entry){ pm->start, pm->end, pm->pmr->lkey, pm->pmr->rkey };
	return 0;
}

static bool next_live(const struct reg_allocation *a, const void **cursor, uint64_t *start,
		      uint64_t *end)
{
	const struct pool_mr *mr = *cursor ? LIST_NEXT((const struct pool_mr *)*cursor, alloc_link) :
					     LIST_FIRST(&a->pool_mrs);

	while (mr && !pool_mr_live(mr))
		mr = LIST_NEXT(mr, alloc_link);
	if (!mr)
		return false;
	*cursor = mr;
	*start = mr->start;
	*end = mr->end;
	return true;
}

const struct mr_cache_others mempool_others = { .cover = cover, .next = next_live };

/* An unregistration (or a replacement) whose MRs workers deregister: answered when the last
 * is done. */
struct unreg_ticket {
	struct waiter *waiter; /* NULL once answered otherwise (reg_free) */
	unsigned remaining;
	struct pool_reg *reg; /* a replacement's: its answer reads it */
};

/* The MR is gone from the device: its keys are dead, its pages may go. One the device kept
 * (k < 0) stays on its allocation's pool_stuck, charged: the allocation is quarantined when
 * it is freed (registrar.h), and no key of it is handed out from here on. */
static void pool_mr_gone(struct mempools *p, struct pool_mr *mr, int k)
{
	struct reg_allocation *a = mr->allocation;

	if (mr->pmr && k == 0)
		p->cache->deregistrations++;
	if (mr->pmr && k < 0) {
		log_warning_errno(k, "domain %s: the device kept mempool MR [0x%" PRIx64 ", 0x%" PRIx64
				  ") (dereg: %m): its memory is quarantined once freed",
				  p->reg->name, mr->start, mr->end);
		LIST_INSERT_HEAD(&a->pool_stuck, mr, alloc_link);
		if (!a->dereg_error)
			a->dereg_error = k;
	} else {
		mr_cache_uncharge(p->cache, mr->start, mr->end);
		free(mr);
	}
	/* Its owner may have left before the pools did. */
	if (--a->pool_refs == 0)
		p->reg->events.allocation_idle(p->reg->data, a);
	p->reg->events.changed(p->reg->data);
}

bool mempool_retry_stuck(struct mempools *p, struct reg_allocation *a)
{
	struct pool_mr *mr, *next;

	for (mr = LIST_FIRST(&a->pool_stuck); mr; mr = next) {
		next = LIST_NEXT(mr, alloc_link);
		if (frmr_pools_dereg(&p->reg->pools, mr->pmr) < 0)
			continue;
		LIST_REMOVE(mr, alloc_link);
		p->cache->deregistrations++;
		mr_cache_uncharge(p->cache, mr->start, mr->end);
		free(mr);
	}
	return LIST_EMPTY(&a->pool_stuck);
}

void mempool_drop_stuck(struct mempools *p, struct reg_allocation *a)
{
	struct pool_mr *mr;

	while ((mr = LIST_FIRST(&a->pool_stuck))) {
		LIST_REMOVE(mr, alloc_link);
		mr_cache_uncharge(p->cache, mr->start, mr->end);
		free(mr);
	}
}

/* Deregistered on a worker (reg_offload): gone now, and its ticket counts it. */
static void pool_mr_dereged(struct reg_base *b, void *arg, int result)
{
	struct pool_mr *mr = arg;
	struct unreg_ticket *t = mr->ticket;

	(void)b;
	pool_mr_gone(mr->set, mr, result);
	if (t && --t->remaining == 0) {
		if (t->reg)
			t->reg->answer = NULL;
		if (t->waiter)
			t->waiter->resume(t->waiter, 0, NULL, "");
		free(t);
	}
}

/* Out of the domain; deregistered (when it was registered) here or — GiBs to unpin, or a soft
 * Dma that may hold it — on a worker, when ticket, if not NULL, counts it; only then is its
 * allocation let go. */
static void pool_mr_destroy(struct mempools *p, struct pool_mr *mr, struct unreg_ticket *ticket)
{
	LIST_REMOVE(mr, link);
	LIST_REMOVE(mr, alloc_link); /* lookups no longer answer with it */
	/* Its death is published before it dies, wherever the dereg runs: a client that still
	 * finds the generation it cached at sees a live key (status-page.h). No lookup hands the
	 * key out after this (it left alloc_link above), so nothing is cached under the new
	 * generation. */
	if (mr->pmr)
		status_page_bump_range(&p->reg->mem->status, mr->start, mr->end);
	if (mr->pmr && reg_offload(p->reg, mr->end - mr->start)) {
		mr->ticket = ticket;
		if (reg_dereg_on_worker(p->reg, mr->pmr, pool_mr_dereged, mr) == 0) {
			if (ticket)
				ticket->remaining++;
			return;
		}
	}
	pool_mr_gone(p, mr, mr->pmr ? frmr_pools_dereg(&p->reg->pools, mr->pmr) : 0);
}

static void pool_mr_put(struct mempools *p, struct pool_mr *mr, struct unreg_ticket *ticket)
{
	if (--mr->sharers == 0 && !mr->pending)
		pool_mr_destroy(p, mr, ticket); /* a pending one goes when its worker is done */
}

/* Not registered yet: a place in the domain (so that pools in its huge page find it), its
 * pages charged (once, with those other MRs cover), its allocation held. */
static struct pool_mr *pool_mr_new(struct mempools *p, const struct span *s)
{
	struct pool_mr *mr = calloc(1, sizeof(*mr));

	if (!mr)
		return NULL;
	if (mr_cache_charge(p->cache, s->start, s->end) < 0) {
		free(mr);
		return NULL;
	}
	mr->set = p;
	mr->allocation = s->allocation;
	mr->start = s->start;
	mr->end = s->end;
	mr->hugepage = s->allocation->mem.arena->hugetlb &&
		       s->end - s->start == s->allocation->mem.arena->page_size;
	mr->pending = true;
	mr->access = reg_allocation_access(s->allocation, &p->reg->provider->caps);
	s->allocation->pool_refs++;
	LIST_INSERT_HEAD(&p->mrs, mr, link);
	LIST_INSERT_HEAD(&s->allocation->pool_mrs, mr, alloc_link);
	return mr;
}

/* On the loop or on a worker: touches only the MR and the provider. */
static int pool_mr_register(struct mempools *p, struct pool_mr *mr)
{
	return frmr_pools_reg(&p->reg->pools, (void *)(uintptr_t)mr->start, mr->end - mr->start,
			      mr->access, false, &mr->pmr);
}

/* Its answer waits for the MRs it replaced: it is answered now, not with what it no longer is,
 * and their last dereg answers nobody. */
static void reg_cancel_answer(struct pool_reg *reg)
{
	struct waiter *aw;

	if (!reg->answer)
		return;
	aw = TAKE_PTR(reg->answer->waiter);
	TAKE_PTR(reg->answer)->reg = NULL;
	aw->resume(aw, -ECANCELED, NULL, "the mempool was unregistered before its replacement was "
		   "answered");
}

static void reg_free(struct mempools *p, struct pool_reg *reg, struct unreg_ticket *ticket)
{
	struct waiter *w = reg->waiter;

	reg_cancel_answer(reg);
	LIST_REMOVE(reg, link);
	LIST_REMOVE(reg, owner_link);
	p->n_regs--;
	for (size_t i = 0; i < reg->n_mrs; i++)
		pool_mr_put(p, reg->mrs[i], ticket);
	free(reg->ticket);
	free(reg);
	if (w)
		w->resume(w, -ECANCELED, NULL, "the mempool's client left");
}

/* None of its MRs is pending any more: it takes over from the one it replaces, or fails.
 * Returns 0, -errno (why says so), or -EINPROGRESS while workers deregister the MRs it
 * dropped: its waiter hears once they are gone, so that no answer counts them as pinned. */
static int reg_settle(struct mempools *p, struct pool_reg *reg, char *why, size_t why_size)
{
	struct unreg_ticket *t = TAKE_PTR(reg->ticket);
	struct waiter *w = TAKE_PTR(reg->waiter);
	int error = reg->error;

	if (error < 0) {
		snprintf(why, why_size, "registering mempool '%s' failed: %s", reg->name,
			 provider_strerror(p->reg->provider, error));
		reg_free(p, reg, NULL);
	} else if (reg->replaces) {
		/* Its old MRs cannot be in use for the objects any more: the pool says they live
		 * in attached memory now. */
		t->waiter = w;
		reg_free(p, TAKE_PTR(reg->replaces), t);
		if (t->remaining > 0) {
			error = -EINPROGRESS; /* the last pool_mr_dereged() answers, and frees t */
			t->reg = reg;
			reg->answer = t;
		} else
			free(t);
		t = NULL;
	}
	free(t);
	p->reg->events.changed(p->reg->data);
	return error;
}

/* A worker registering the MRs one registration made. */
struct pool_job {
	struct registrar_work base;
	struct mempools *set;
	size_t n;
	struct pool_mr *mrs[]; /* their pmr and error: written by the worker, read after it */
};

static void pool_job_run(struct registrar_work *w)
{
	struct pool_job *j = (struct pool_job *)w;

	for (size_t i = 0; i < j->n; i++) {
		j->mrs[i]->error = pool_mr_register(j->set, j->mrs[i]);
		if (j->mrs[i]->error < 0)
			j->mrs[i]->pmr = NULL;
	}
}

static bool in_job(const struct pool_job *j, const struct pool_mr *mr)
{
	for (size_t i = 0; i < j->n; i++)
		if (j->mrs[i] == mr)
			return true;
	return false;
}

static void pool_job_done(struct registrar_work *w)
{
	struct pool_job *j = (struct pool_job *)w;
	struct mempools *p = j->set;
	struct pool_reg *reg, *settle = NULL;
	struct mr_wait *lookups = NULL;
	size_t kept = 0;

	for (size_t i = 0; i < j->n; i++) {
		struct pool_mr *mr = j->mrs[i];

		mr->pending = false;
		while (mr->lookups) {
			struct mr_wait *lw = mr->lookups;

			mr->lookups = lw->next;
			lw->next = lookups;
			lookups = lw;
		}
		if (mr->pmr)
			p->cache->registrations++;
		else
			mr->hugepage = false; /* failed: no later pool may share it */
		if (mr->sharers == 0)
			pool_mr_destroy(p, mr, NULL); /* every pool that wanted it left meanwhile */
		else
			j->mrs[kept++] = mr;
	}
	j->n = kept;
	/* Every registration waiting for these MRs hears of them; those with nothing left to
	 * wait for settle after the walk, since settling drops the registrations they replace. */
	LIST_FOREACH(reg, &p->regs, link) {
		for (size_t k = 0; reg->pending && k < reg->n_mrs; k++)
			if (in_job(j, reg->mrs[k])) {
				reg->pending--;
				if (reg->mrs[k]->error < 0 && reg->error == 0)
					reg->error = reg->mrs[k]->error;
			}
		if (reg->pending == 0 && reg->waiter) {
			reg->settle_next = settle;
			settle = reg;
		}
	}
	while (settle) {
		struct waiter *waiter;
		char why[256];
		int k;

		reg = settle;
		settle = reg->settle_next;
		waiter = reg->waiter;
		k = reg_settle(p, reg, why, sizeof(why));
		if (k != -EINPROGRESS)
			waiter->resume(waiter, k, NULL, k < 0 ? why : "");
	}
	/* Lookups inside these MRs get them now, or register what a failed one left. */
	mr_cache_resume_waits(p->cache, lookups);
	free(j);
}

int mempool_register(struct mempools *p, struct reg_owner *owner, const char *name,
		     const uint64_t *starts, const uint64_t *lengths, size_t n, bool extmem,
		     struct waiter *waiter, struct pool_reg **ret, char *why, size_t why_size)
{
	const struct config *cfg = p->reg->config;
	struct pool_reg *old = find(p, owner, name), *reg;
	struct pool_job *job;
	struct span *spans;
	uint64_t new_bytes = 0, more_pinned = 0;
	size_t n_fresh = 0;
	int m, k = 0;

	if (old && (!extmem || old->extmem)) {
		snprintf(why, why_size, "mempool '%s' is registered already", name);
		return -EEXIST;
	}
	if (!old && p->n_regs >= p->reg->quota->mempools)
		return config_quota_refusal(cfg, p->reg->quota, QUOTA_MEMPOOLS, p->reg->name,
					    p->n_regs, 1, why, why_size);
	spans = calloc(n, sizeof(*spans));
	if (!spans)
		return -ENOMEM;
	m = analyze(p, starts, lengths, n, spans, why, why_size);
	if (m < 0) {
		free(spans);
		return m;
	}
	/* Spans are disjoint: only the pages no MR covers yet pin more (a shared huge page's
	 * none). */
	for (int i = 0; i < m; i++) {
		if (!shared_hugepage(p, &spans[i]))
			new_bytes += spans[i].end - spans[i].start;
		more_pinned += mr_cache_uncharged(p->cache, spans[i].start, spans[i].end);
	}
	k = reg_check_pinned(p->reg, more_pinned, why, why_size);
	if (k < 0) {
		free(spans);
		return k;
	}
	reg = calloc(1, sizeof(*reg) + (size_t)m * sizeof(reg->mrs[0]));
	job = calloc(1, sizeof(*job) + (size_t)m * sizeof(job->mrs[0]));
	if (reg && old)
		reg->ticket = calloc(1, sizeof(*reg->ticket));
	if (!reg || !job || (old && !reg->ticket)) {
		if (reg)
			free(reg->ticket);
		free(reg);
		free(job);
		free(spans);
		return -ENOMEM;
	}
	snprintf(reg->name, sizeof(reg->name), "%s", name);
	reg->owner = owner;
	reg->extmem = extmem;
	reg->replaces = old;
	LIST_INSERT_HEAD(&p->regs, reg, link);
	LIST_INSERT_HEAD(&owner->pools, reg, owner_link);
	p->n_regs++;
	for (int i = 0; i < m; i++) {
		struct pool_mr *mr = shared_hugepage(p, &spans[i]);

		if (!mr) {
			mr = pool_mr_new(p, &spans[i]);
			if (!mr) {
				k = -ENOMEM;
				break;
			}
			job->mrs[n_fresh++] = mr;
		}
		mr->sharers++;
		reg->mrs[reg->n_mrs++] = mr;
		if (mr->pending)
			reg->pending++;
	}
	free(spans);
	*ret = reg;

	if (k == 0 && n_fresh > 0 && reg_offload(p->reg, new_bytes)) {
		/* Pinning this much takes long: a worker does it, and only the asker waits. */
		job->n = n_fresh;
		job->set = p;
		reg_start(p->reg, &job->base, pool_job_run, pool_job_done, true);
		reg->waiter = waiter;
		return -EINPROGRESS;
	}
	/* Small: registered here and now. */
	for (size_t i = 0; i < n_fresh; i++) {
		struct pool_mr *mr = job->mrs[i];

		mr->pending = false;
		reg->pending--;
		if (k == 0) {
			k = pool_mr_register(p, mr);
			if (k < 0) {
				mr->pmr = NULL;
				mr->error = k;
				snprintf(why, why_size, "registering [0x%" PRIx64 ", 0x%" PRIx64
					 ") failed: %s", mr->start, mr->end,
					 provider_strerror(p->reg->provider, k));
			} else
				p->cache->registrations++;
		}
	}
	free(job);
	if (k < 0) {
		reg_free(p, reg, NULL); /* what it made goes again */
		return k;
	}
	reg->waiter = waiter;
	if (reg->pending > 0)
		return -EINPROGRESS; /* it shares a huge page MR a worker is still making */
	return reg_settle(p, reg, why, why_size);
}

int mempool_unregister(struct mempools *p, struct reg_owner *owner, const char *name,
		       struct waiter *waiter, char *why, size_t why_size)
{
	struct pool_reg *reg = find(p, owner, name);
	struct unreg_ticket *t;

	if (!reg) {
		snprintf(why, why_size, "no mempool '%s' is registered", name);
		return -ENOENT;
	}
	t = waiter ? calloc(1, sizeof(*t)) : NULL;
	if (waiter && !t)
		return -ENOMEM;
	if (t)
		t->waiter = waiter;
	reg_free(p, reg, t);
	if (!t || t->remaining == 0) {
		free(t);
		return 0;
	}
	return -EINPROGRESS; /* the last pool_mr_dereged() answers, and frees t */
}

void mempool_give_all(struct mempools *p, struct reg_owner *owner, struct reg_owner *to)
{
	struct pool_reg *reg;

	while ((reg = LIST_FIRST(&owner->pools))) {
		struct waiter *w = TAKE_PTR(reg->waiter);

		/* Nobody waits for it any more; its MRs work until their share comes. */
		reg_cancel_answer(reg);
		if (w)
			w->resume(w, -ECANCELED, NULL, "the mempool's client left");
		LIST_REMOVE(reg, owner_link);
		reg->owner = to;
		LIST_INSERT_HEAD(&to->pools, reg, owner_link);
	}
}

bool mempool_leave_share(struct mempools *p, struct reg_owner *leaving, bool all,
			 unsigned *made)
{
	struct pool_reg *reg;

	while ((reg = LIST_FIRST(&leaving->pools))) {
		/* MR by MR from the last: a pool of 1,024 is no share. */
		while (reg->n_mrs > 0) {
			struct pool_mr *mr = reg->mrs[reg->n_mrs - 1];

			if (!all && *made > 0 && !reg_loop_may(p->reg, *made, mr->end - mr->start))
				return false;
			reg_loop_did(p->reg, mr->end - mr->start);
			reg->n_mrs--;
			pool_mr_put(p, mr, NULL);
			(*made)++;
		}
		reg_free(p, reg, NULL);
	}
	return true;
}
