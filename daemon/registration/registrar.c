/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "macro.h"
#include "provider/provider.h"
#include "memory/memory.h"
#include "registration/reg-allocation.h"
#include "registration/registrar.h"

static void resume_free(struct reg_base *b, struct reg_allocation *ra)
{
	registrar_resume_free(container_of(b, struct registrar, base), ra);
}

int registrar_open(struct registrar *r, struct provider *device, enum mr_policy policy,
		   uint64_t window_base)
{
	struct reg_base *b = &r->base;
	int k;

	b->pending_bytes = &r->cache.pending_bytes;
	b->pinned_bytes = &r->cache.charges.pinned_bytes;
	b->resume_free = resume_free;
	mempools_init(&r->mempools, b, &r->cache);
	k = device->ops->open(device->caps.device, &b->provider);
	if (k >= 0)
		k = provider_pd_alloc(b->provider, &b->pd);
	if (k >= 0)
		k = frmr_pools_init(&b->pools, b->pd, &b->config->pools);
	if (k >= 0)
		k = mr_cache_init(&r->cache, b, NULL, NULL, policy);
	r->cache.others = &mempool_others;
	if (k >= 0)
		k = odp_init(&r->odp, b, window_base);
	if (k >= 0)
		mw_grants_init(&r->windows, b);
	return k;
}

/* At close, what the device still keeps goes with the context (the kernel destroys a
 * context's objects when its file closes: Linux 6.12 drivers/infiniband/core/rdma_core.c,
 * uverbs_destroy_ufile_hw), and the arenas after it. */
static void quarantine_drop(struct registrar *r)
{
	struct reg_allocation *ra;

	while ((ra = LIST_FIRST(&r->quarantine.runs))) {
		LIST_REMOVE(ra, quarantine_link);
		log_warning("domain %s: closing with [0x%" PRIx64 ", 0x%" PRIx64 ") still "
			    "registered on the device: its MRs go with the context",
			    r->base.name, allocation_address(&ra->mem),
			    allocation_address(&ra->mem) + ra->mem.length);
		mr_cache_drop_kept(&r->cache, ra);
		odp_drop_stuck(ra);
		mempool_drop_stuck(&r->mempools, ra);
		odp_forget_allocation(ra);
		free(ra);
	}
	r->quarantine.n = 0;
	r->quarantine.bytes = 0;
}

void registrar_close(struct registrar *r)
{
	int k;

	if (r->quarantine.n > 0) {
		(void)registrar_retry_quarantine(r);
		quarantine_drop(r);
	}
	mw_grants_done(&r->windows); /* windows before their MRs (a bound one keeps its MR) */
	odp_done(&r->odp);
	mr_cache_done(&r->cache);
	frmr_pools_done(&r->base.pools); /* parked handles go before their PD */
	if (r->base.pd) {
		k = provider_pd_free(r->base.pd);
		if (k < 0)
			log_warning_errno(k, "domain %s: cannot free its PD: %m", r->base.name);
	}
	provider_close(r->base.provider);
}

void registrar_device_lost(struct registrar *r, const char *device)
{
	struct mr_cache *c;

	provider_mark_lost(r->base.provider);
	r->cache.keys_stale = true;
	LIST_FOREACH(c, &r->cache.bound, bound_link)
		if (strcmp(c->own_pd->provider->caps.device, device) == 0)
			provider_mark_lost(c->own_pd->provider);
}

void registrar_device_back(struct registrar *r)
{
	mr_cache_flush(&r->cache);
	r->cache.keys_stale = false;
}

int registrar_lookup(struct registrar *r, uint64_t addr, struct mr_entry *ret, char *why,
		     size_t why_size, struct waiter *waiter)
{
	struct reg_allocation *a = NULL;
	int k = mr_cache_find(&r->cache, addr, ret, why, why_size, &a);

	if (k != MR_CACHE_MISS)
		return k;
	/* On-demand memory's children are found through their allocation, in no table. */
	if (a && reg_kind_of(a) == REG_KIND_ON_DEMAND)
		return odp_fault(&r->odp, a, addr, ret, why, why_size, waiter);
	return mr_cache_miss(&r->cache, a, addr, ret, why, why_size, waiter);
}

int registrar_lookup_range(struct registrar *r, uint64_t addr, uint64_t len, struct mr_entry *ret,
			   char *why, size_t why_size, struct waiter *waiter)
{
	struct reg_allocation *a = NULL;
	int k = mr_cache_find_range(&r->cache, addr, len, ret, why, why_size, &a);

	if (k != MR_CACHE_MISS)
		return k;
	if (a && reg_kind_of(a) == REG_KIND_ON_DEMAND) {
		struct mr_entry e;

		/* Its child, when that covers the range; else an on-demand MR of the range. */
		k = odp_fault(&r->odp, a, addr, &e, why, why_size, waiter);
		if (k != 0 || mr_entry_covers(&e, addr, len)) {
			if (k == 0)
				*ret = e;
			return k;
		}
	}
	return mr_cache_miss_range(&r->cache, a, addr, len, ret, why, why_size, waiter);
}

bool registrar_on_demand(const struct registrar *r, bool asked, bool read_only)
{
	const struct provider_caps *caps = &r->base.provider->caps;

	return asked && provider_odp_covers(caps, registration_access(read_only, caps));
}

/* Handles aged or flushed out of the pools, destroyed on a worker (a device command each on
 * verbs). */
struct destroy_job {
	struct registrar_work base;
	struct provider_mr **handles;
	size_t n;
};

static void destroy_job_run(struct registrar_work *w)
{
	struct destroy_job *j = (struct destroy_job *)w;

	frmr_pools_destroy(j->handles, j->n);
}

static void destroy_job_done(struct registrar_work *w)
{
	w->reg->destroy_jobs--;
	free(w);
}

void registrar_destroy_handles(struct registrar *r, struct provider_mr **handles, size_t n)
{
	struct destroy_job *j;

	if (n == 0)
		return;
	/* As big as provider work gets: a device command each. */
	j = registrar_offload(r, UINT64_MAX) ? calloc(1, sizeof(*j)) : NULL;
	if (!j) {
		frmr_pools_destroy(handles, n);
		return;
	}
	j->handles = handles;
	j->n = n;
	r->base.destroy_jobs++;
	registrar_start(r, &j->base, destroy_job_run, destroy_job_done, true);
}

/* Deregistering big MRs unpins GiBs: a worker does it, so the loop serves everyone else. */
struct free_job {
	struct registrar_work base;
	struct registrar *reg;
	struct reg_allocation *allocation;
	struct waiter *waiter;
};

static void free_job_run(struct registrar_work *w)
{
	struct free_job *j = (struct free_job *)w;

	mr_cache_deregister(&j->reg->cache, j->allocation);
}

static void free_job_done(struct registrar_work *w)
{
	struct free_job *j = (struct free_job *)w;

	registrar_release(j->reg, j->allocation, j->waiter);
	free(j);
}

/* Whether a client may hold a key of ra's memory: one of the cache's MRs, a mempool MR or an
 * on-demand child of it was handed out. Each of those lies inside its one allocation (the
 * cache's and the pools' never span two, children are cut to theirs), so a client's cached
 * entry, an MR's range, is of one allocation alone: memory that never had any is in no
 * cache. Registrations a worker is still making hand out no key once ra is retired, nor do
 * children a prefetch makes meanwhile. */
static bool keys_handed_out(const struct reg_allocation *ra)
{
	return !LIST_EMPTY(&ra->mrs) || ra->pool_refs > 0 || !LIST_EMPTY(&ra->pool_mrs) ||
	       !LIST_EMPTY(&ra->odp_children);
}

/* The device kept an MR, child or pool MR over ra (mr_cache_deregister, odp.c, mempool.c
 * keep them): ra is quarantined, not given back. */
static bool device_keeps(const struct reg_allocation *ra)
{
	return !LIST_EMPTY(&ra->mrs) || !LIST_EMPTY(&ra->odp_stuck) ||
	       !LIST_EMPTY(&ra->pool_stuck);
}

static void quarantine(struct registrar *r, struct reg_allocation *ra)
{
	uint64_t at = allocation_address(&ra->mem);

	LIST_INSERT_HEAD(&r->quarantine.runs, ra, quarantine_link);
	r->quarantine.n++;
	r->quarantine.bytes += ra->mem.length;
	log_warning_errno(ra->dereg_error, "domain %s: the device kept an MR over [0x%" PRIx64
			  ", 0x%" PRIx64 ") when it was freed (dereg: %m): the run is quarantined, "
			  "neither emptied nor handed out again, until a dereg succeeds (tried at "
			  "each flush)", r->base.name, at, at + ra->mem.length);
	r->base.events.changed(r->base.data);
}

/* ra's registrations are all gone: the domain takes it back (0, or -EINPROGRESS: it answers
 * waiter itself once the pages went back). One the device kept is quarantined instead: 0, the
 * free is done for its client all the same. */
static int release(struct registrar *r, struct reg_allocation *ra, struct waiter *waiter)
{
	mr_cache_release(&r->cache, ra);
	if (device_keeps(ra)) {
		quarantine(r, ra);
		return 0;
	}
	odp_forget_allocation(ra);
	return r->base.events.released(r->base.data, ra, waiter);
}

unsigned registrar_retry_quarantine(struct registrar *r)
{
	struct reg_allocation *ra, *next;
	unsigned n = 0;

	/* A dereg would wait on the loop for the provider a worker holds (a client's own PD's
	 * too, whose registrations the client can make last): the next flush tries. */
	if (registrar_busy(r))
		return 0;
	for (ra = LIST_FIRST(&r->quarantine.runs); ra; ra = next) {
		uint64_t at = allocation_address(&ra->mem);

		next = LIST_NEXT(ra, quarantine_link);
		mr_cache_deregister(&r->cache, ra);
		mr_cache_release(&r->cache, ra);
		(void)odp_retry_stuck(&r->odp, ra);
		(void)mempool_retry_stuck(&r->mempools, ra);
		if (device_keeps(ra))
			continue;
		LIST_REMOVE(ra, quarantine_link);
		r->quarantine.n--;
		r->quarantine.bytes -= ra->mem.length;
		log_info("domain %s: the device let go of [0x%" PRIx64 ", 0x%" PRIx64 "): the "
			 "quarantined run goes back", r->base.name, at, at + ra->mem.length);
		odp_forget_allocation(ra);
		(void)r->base.events.released(r->base.data, ra, NULL);
		n++;
	}
	if (n)
		r->base.events.changed(r->base.data);
	return n;
}

/* Then the device lets go of ra's MRs (pinned bytes of them), and only then do its pages go
 * back. A soft Dma copying through its MRs holds them (their dereg waits for it): a worker
 * waits then, not the loop. 0: done, or -EINPROGRESS: waiter hears later. */
static int deregister(struct registrar *r, struct reg_allocation *ra, uint64_t pinned,
		      struct waiter *waiter)
{
	struct free_job *j = pinned > 0 && registrar_offload(r, pinned) ? calloc(1, sizeof(*j)) : NULL;

	if (!j) {
		int k;

		mr_cache_deregister(&r->cache, ra);
		k = release(r, ra, waiter);
		return waiter ? k : 0;
	}
	j->reg = r;
	j->allocation = ra;
	j->waiter = waiter;
	registrar_start(r, &j->base, free_job_run, free_job_done, true);
	return waiter ? -EINPROGRESS : 0;
}

int registrar_retire(struct registrar *r, struct reg_allocation *ra, struct waiter *waiter)
{
	uint64_t pinned;
	unsigned zombies;

	/* Clients learn of its keys dying by the generation, before they die, and drop what
	 * they cached of its range alone (every key of it lies inside it). A free that touched
	 * no registration leaves every client's lookup cache as it was (DPDK's rule). */
	if (keys_handed_out(ra))
		status_page_bump_range(&r->base.mem->status, allocation_address(&ra->mem),
				       allocation_address(&ra->mem) + ra->mem.length);
	/* Retired first: from here on no key for it is handed out. */
	ra->retired = true;
	pinned = mr_cache_retire(&r->cache, ra);
	zombies = odp_retire(&r->odp, ra);
	if (zombies > 0 || ra->bound_jobs > 0) {
		/* Prefetch work on it is queued or running, or holds its children, or a worker
		 * makes or lets go of a client PD's MR over it: the pages go back, and the Free
		 * answers, once that is done (registrar_resume_free). */
		ra->free_waits = true;
		ra->free_waiter = waiter;
		return waiter ? -EINPROGRESS : 0;
	}
	return deregister(r, ra, pinned, waiter);
}

void registrar_resume_free(struct registrar *r, struct reg_allocation *ra)
{
	struct waiter *waiter = ra->free_waiter;
	const struct cached_mr *mr;
	uint64_t pinned = 0;

	if (!ra->free_waits || ra->odp_jobs > 0 || !LIST_EMPTY(&ra->odp_children) ||
	    ra->bound_jobs > 0)
		return;
	ra->free_waits = false;
	LIST_FOREACH(mr, &ra->mrs, alloc_link)
		pinned += mr->end - mr->start;
	if (deregister(r, ra, pinned, waiter) == 0 && waiter)
		waiter->resume(waiter, 0, NULL, "");
}

void registrar_release(struct registrar *r, struct reg_allocation *ra, struct waiter *waiter)
{
	if (release(r, ra, waiter) == 0 && waiter)
		waiter->resume(waiter, 0, NULL, "");
}
