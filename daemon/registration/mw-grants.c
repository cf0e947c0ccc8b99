/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "macro.h"
#include "provider/provider.h"
#include "registration/mw-grants.h"
#include "registration/reg-allocation.h"
#include "registration/reg-base.h"

void mw_grants_init(struct mw_grants *g, struct reg_base *reg)
{
	*g = (struct mw_grants){ .reg = reg };
	LIST_INIT(&g->bound);
	LIST_INIT(&g->pool);
	LIST_INIT(&g->stuck);
	LIST_INIT(&g->busy);
	LIST_INIT(&g->dying);
}

static struct mw_grant_list *list_of(struct mw_grants *g, enum mw_place where, unsigned **count)
{
	switch (where) {
	case MW_POOL:
		*count = &g->n_pool;
		return &g->pool;
	case MW_BOUND:
		*count = &g->n_bound;
		return &g->bound;
	case MW_BUSY:
		*count = &g->n_busy;
		return &g->busy;
	case MW_STUCK:
		*count = &g->n_stuck;
		return &g->stuck;
	case MW_DYING:
		*count = &g->n_dying;
		return &g->dying;
	default:
		return NULL;
	}
}

/* w off its list (counted out) and onto where's (counted in). */
static void place(struct mw_grant *w, enum mw_place where)
{
	struct mw_grant_list *l;
	unsigned *n;

	if (list_of(w->grants, w->place, &n)) {
		LIST_REMOVE(w, link);
		(*n)--;
	}
	w->place = where;
	l = list_of(w->grants, where, &n);
	if (l) {
		LIST_INSERT_HEAD(l, w, link);
		(*n)++;
	}
}

/* 0 when the window is deallocated (its rkey dead with it), else the dealloc's failure: then
 * it is kept on the stuck list, live as it is on the device. */
static int grant_free(struct mw_grant *w)
{
	int k;

	mr_cache_unlisten_gone(&w->gone);
	place(w, MW_NOWHERE);
	k = provider_mw_dealloc(w->mw);
	if (k < 0) {
		log_warning_errno(k, "domain %s: cannot deallocate the memory window of rkey 0x%" PRIx32
				  " (its key may still work): tried again at the next grant or "
				  "revoke: %m", w->grants->reg->name, w->rkey);
		w->owner = NULL;
		place(w, MW_STUCK);
		return k;
	}
	free(w);
	return 0;
}

/* The stuck windows' deallocs, again, and the dying ones' (on the loop, where nothing holds
 * the provider). */
static void retry_stuck(struct mw_grants *g)
{
	struct mw_grant *w, *next;

	for (w = LIST_FIRST(&g->stuck); w; w = next) {
		next = LIST_NEXT(w, link);
		if (provider_mw_dealloc(w->mw) == 0) {
			place(w, MW_NOWHERE);
			free(w);
		}
	}
	while ((w = LIST_FIRST(&g->dying)))
		(void)grant_free(w); /* a failure puts it on the stuck list */
}

void mw_grants_done(struct mw_grants *g)
{
	if (!g->reg)
		return;
	/* Nothing is busy: a job holds the domain open until it is done. */
	while (!LIST_EMPTY(&g->bound))
		(void)grant_free(LIST_FIRST(&g->bound));
	while (!LIST_EMPTY(&g->pool))
		(void)grant_free(LIST_FIRST(&g->pool));
	retry_stuck(g); /* the dying ones too */
	while (!LIST_EMPTY(&g->stuck)) { /* the device keeps them with its context */
		struct mw_grant *w = LIST_FIRST(&g->stuck);

		log_error("domain %s: the memory window of rkey 0x%" PRIx32 " could not be "
			  "deallocated: left to the device", g->reg->name, w->rkey);
		place(w, MW_NOWHERE);
		free(w);
	}
}

/* Windows handed to freed memory's MRs (provider_mw_doom) and not deallocated yet: their keys
 * live until then, and where the dealloc fails they stay (the run quarantined). */
static unsigned doomed(const struct mw_grants *g)
{
	return g->reg->pd ? provider_pd_doomed(g->reg->pd) : 0;
}

unsigned mw_grants_live(const struct mw_grants *g)
{
	return g->reg ? g->n_bound + g->n_busy + g->n_stuck + doomed(g) : 0;
}

/* Whether w's next bind could give an rkey it gave before (mw-grants.h, binds). */
static bool worn_out(const struct mw_grant *w)
{
	unsigned fresh = w->grants->reg->provider->caps.mw_fresh_binds;

	return fresh > 0 && w->binds >= fresh;
}

/* Whether w, unbound now, is kept for the pool (else deallocated): not past MW_POOL_MAX with
 * the kills under way that keep theirs, nor worn out. */
static bool for_the_pool(const struct mw_grant *w)
{
	const struct mw_grants *g = w->grants;

	return g->n_pool + g->to_pool < MW_POOL_MAX && !worn_out(w);
}

/* w unbound (its rkey dead): into the pool, or deallocated. Where a worker may hold the
 * provider (a job's end: here false), a window past MW_POOL_MAX stays in the pool (the pool
 * then holds at most the windows on workers more), and a worn-out one waits on the dying
 * list for a dealloc where nothing holds the provider (retry_stuck). */
static void unbound(struct mw_grant *w, bool here)
{
	bool keep = for_the_pool(w) || (!here && !worn_out(w));

	w->owner = NULL;
	w->mr = NULL;
	w->allocation = NULL;
	place(w, keep || here ? MW_POOL : MW_DYING);
	if (!keep && here)
		(void)grant_free(w);
}

/* Invalidates w (bound) here: 0 once its rkey is dead. A failed invalidate deallocates it
 * instead (which kills the rkey too: rxe_dealloc_mw drops the window, whose cleanup erases its
 * index and marks it invalid, Linux rxe_mw.c rxe_mw_cleanup; mlx5 destroys its mkey): 0, or
 * the dealloc's failure. */
static int invalidate(struct mw_grant *w)
{
	int k;

	mr_cache_unlisten_gone(&w->gone);
	k = provider_mw_invalidate(w->mw);
	w->grants->invalidations++;
	if (k < 0) {
		log_warning_errno(k, "domain %s: cannot invalidate the memory window of rkey 0x%" PRIx32
				  ": deallocated instead: %m", w->grants->reg->name, w->rkey);
		return grant_free(w);
	}
	unbound(w, true);
	return 0;
}

/* Whether the loop's provider work could wait now, for a worker that holds the provider: the
 * offload rule for bytes (reg_offload), with none. */
static bool off_loop(const struct mw_grants *g)
{
	return reg_offload(g->reg, 0);
}

/* Whether there are workers to take work at all. */
static bool workers_up(const struct mw_grants *g)
{
	return *g->reg->workers && !__atomic_load_n(g->reg->stopping, __ATOMIC_ACQUIRE);
}

/* Whether a failed bind may have reached the device (all but -EAGAIN: the pair needed mending,
 * and nothing was posted). Such a window is deallocated, never pooled: a bind whose work
 * request completed after mrd stopped waiting (verbs: PART_TIMEOUT_USEC) moved its key where
 * mrd does not know it, and every later bind of it would fail (rxe_bind_mw refuses a stale
 * mw_rkey), at the head of the pool, for every grant of the domain. */
static bool bind_poisons(int k)
{
	return k != -EAGAIN;
}

static void bind_why(const struct mw_grant *w, int k, bool allocated, char *why,
		     size_t why_size)
{
	const char *device = w->grants->reg->provider->caps.device;

	if (k == -EAGAIN)
		snprintf(why, why_size, "device %s: the queue pairs windows are bound on need "
			 "mending after a failure, and a Dma is using them: try again", device);
	else if (!allocated)
		snprintf(why, why_size, "cannot allocate a memory window on %s", device);
	else
		snprintf(why, why_size, "the bind of a window over [0x%" PRIx64 ", +0x%" PRIx64
			 ") failed on %s", w->addr, w->length, device);
}

/* A bind or a kill of one window on a worker; the window is busy meanwhile, and the free of
 * the allocation it is bound over waits for it (bound_jobs): its MR stays. */
struct mw_job {
	struct registrar_work base;
	struct mw_grant *w;
	struct mw_wait *wait; /* NULL: nobody waits (a client's exit) */
	bool bind;            /* else a kill: invalidate, or dealloc */
	bool dealloc;         /* a kill by dealloc: not kept for the pool */
	/* Written by the worker, read on the loop after it. */
	struct {
		int result;
		uint32_t rkey;
		int invalidated; /* a kill's invalidate: 0, or why it failed */
		bool allocated;  /* a bind's window exists */
		bool deallocated;
	} rt;
};

static void mw_job_run(struct registrar_work *work)
{
	struct mw_job *j = (struct mw_job *)work;
	struct mw_grant *w = j->w;
	int k;

	if (j->bind) {
		k = w->mw ? 0 : provider_mw_alloc(work->reg->pd, &w->mw);
		j->rt.allocated = k == 0;
		if (k == 0)
			k = provider_mw_bind(w->mw, w->mr, w->addr, w->length, w->access,
					     &j->rt.rkey);
		j->rt.result = k;
		if (k < 0 && j->rt.allocated && bind_poisons(k))
			j->rt.deallocated = provider_mw_dealloc(w->mw) == 0;
		return;
	}
	if (!j->dealloc) {
		k = j->rt.invalidated = provider_mw_invalidate(w->mw);
		if (k == 0)
			return;
	}
	k = provider_mw_dealloc(w->mw); /* kills the key too (invalidate) */
	j->rt.deallocated = k == 0;
	j->rt.result = k;
}

/* w, not bound, back: to the pool if it has a window, else freed; here as unbound's. */
static void give_back(struct mw_grant *w, bool here)
{
	mr_cache_unlisten_gone(&w->gone);
	if (w->mw) {
		unbound(w, here);
	} else {
		place(w, MW_NOWHERE);
		free(w);
	}
}

/* w bound (rkey): counted, and its grant's. */
static void bound(struct mw_grant *w, uint32_t rkey)
{
	w->binds++;
	w->rkey = rkey;
	w->grants->binds++;
	place(w, MW_BOUND);
}

static int kill(struct mw_grant *w, struct mw_wait *wait, bool on_worker);

static void bind_done(struct mw_job *j)
{
	struct mw_grant *w = j->w;
	char why[200] = "";

	if (j->rt.result < 0) {
		bind_why(w, j->rt.result, j->rt.allocated, why, sizeof(why));
		mr_cache_unlisten_gone(&w->gone);
		if (j->rt.deallocated) {
			place(w, MW_NOWHERE);
			free(w);
		} else if (j->rt.allocated && bind_poisons(j->rt.result)) {
			log_warning("domain %s: cannot deallocate a memory window whose bind failed: "
				    "tried again at the next grant or revoke", w->grants->reg->name);
			w->owner = NULL;
			place(w, MW_STUCK);
		} else {
			give_back(w, false);
		}
		(void)j->wait->done(j->wait, j->rt.result, 0, why);
	} else if (w->freed) {
		/* Its MR left with the memory meanwhile: the window dies with the MR's dereg, which
		 * waits for this job (bound_jobs). */
		provider_mw_doom(w->mw, w->mr);
		place(w, MW_NOWHERE);
		(void)j->wait->done(j->wait, -ENOENT, 0, "the memory was freed while its window "
				    "was bound");
		free(w);
	} else {
		bound(w, j->rt.rkey);
		if (!j->wait->done(j->wait, 0, w->rkey, ""))
			(void)kill(w, NULL, workers_up(w->grants)); /* its client went */
	}
}

static void kill_done(struct mw_job *j)
{
	struct mw_grant *w = j->w;
	struct mw_grants *g = w->grants;
	int k = j->rt.result;

	g->invalidations++;
	if (!j->dealloc)
		g->to_pool--;
	if (j->rt.invalidated < 0)
		log_warning_errno(j->rt.invalidated, "domain %s: cannot invalidate the memory window "
				  "of rkey 0x%" PRIx32 ": deallocated instead: %m", g->reg->name,
				  w->rkey);
	if (j->rt.deallocated) {
		place(w, MW_NOWHERE);
		free(w);
	} else if (k == 0) {
		unbound(w, false);
	} else {
		log_warning_errno(k, "domain %s: cannot invalidate nor deallocate the memory window "
				  "of rkey 0x%" PRIx32 " (its key may still work): tried again at "
				  "the next grant or revoke: %m", g->reg->name, w->rkey);
		w->owner = NULL;
		place(w, MW_STUCK);
	}
	if (j->wait)
		(void)j->wait->done(j->wait, k, 0, k < 0 ? "the window could be neither "
				    "invalidated nor deallocated: its key may still work" : "");
}

static void mw_job_done(struct registrar_work *work)
{
	struct mw_job *j = (struct mw_job *)work;
	struct reg_allocation *ra = j->w->allocation;
	struct reg_base *reg = work->reg;

	if (j->bind)
		bind_done(j);
	else
		kill_done(j);
	free(j);
	/* Then its free, if it waited: a window bound meanwhile over freed memory is doomed
	 * with the MR already. */
	ra->bound_jobs--;
	reg->resume_free(reg, ra);
}

/* w (bound over its MR, or to be bound: its range set, listening) to a worker: 0, or -ENOMEM
 * (nothing changed). */
static int start(struct mw_grant *w, struct mw_wait *wait, bool bind)
{
	struct mw_grants *g = w->grants;
	struct mw_job *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->w = w;
	j->wait = wait;
	j->bind = bind;
	if (!bind) {
		mr_cache_unlisten_gone(&w->gone); /* its free waits for the kill instead */
		j->dealloc = !for_the_pool(w);
		if (!j->dealloc)
			g->to_pool++;
	}
	w->freed = false;
	place(w, MW_BUSY);
	w->allocation->bound_jobs++;
	reg_start(g->reg, &j->base, mw_job_run, mw_job_done, true);
	return 0;
}

/* Kills w (bound): 0 when its rkey is dead now, -EINPROGRESS when a worker kills it (wait,
 * if any, hears), or invalidate's failure. */
static int kill(struct mw_grant *w, struct mw_wait *wait, bool on_worker)
{
	if (on_worker && start(w, wait, false) == 0)
		return -EINPROGRESS;
	return invalidate(w);
}

/* Its MR leaves the cache (its allocation is freed): the window dies before the MR does, by
 * the MR's dereg (provider_mw_doom), which runs where it cannot stall the loop. One a worker
 * binds dies the same way once bound (bind_done). */
static void mr_gone(struct mr_gone_listener *l, const struct mr_entry *mr)
{
	struct mw_grant *w = container_of(l, struct mw_grant, gone);

	(void)mr;
	if (w->place == MW_BUSY) {
		w->freed = true;
		return;
	}
	provider_mw_doom(w->mw, w->mr);
	w->grants->invalidations++;
	place(w, MW_NOWHERE);
	free(w);
}

int mw_grants_grant(struct mw_grants *g, struct mr_cache *c, const struct mem_owner *owner,
		    const struct mr_entry *e, uint64_t addr, uint64_t len, unsigned access,
		    uint32_t *ret_rkey, char *why, size_t why_size, struct mw_wait *wait)
{
	const struct provider_caps *caps = &g->reg->provider->caps;
	bool on_worker = off_loop(g);
	struct cached_mr *mr;
	struct mw_grant *w;
	uint32_t rkey = 0;
	unsigned live;
	int k;

	if (!caps->mw) {
		snprintf(why, why_size, "device %s: %s", caps->device,
			 caps->no_mw ? caps->no_mw : "no memory windows");
		return -EOPNOTSUPP;
	}
	if (!on_worker)
		retry_stuck(g);
	live = mw_grants_live(g);
	if (live >= g->reg->quota->memory_windows)
		return config_quota_refusal(g->reg->config, g->reg->quota, QUOTA_MEMORY_WINDOWS,
					    g->reg->name, live, 1, why, why_size);
	if (live >= mw_grants_limit(g)) {
		snprintf(why, why_size, "domain %s holds %u memory windows, its share of device %s "
			 "(max_mw %" PRIu32 " / %u): a user's domains together hold a few percent of "
			 "the device's windows", g->reg->name, live, caps->device, caps->max_mw,
			 MW_DEVICE_SHARE);
		return -EDQUOT;
	}
	w = LIST_FIRST(&g->pool);
	if (!w) {
		w = calloc(1, sizeof(*w));
		if (!w)
			return -ENOMEM;
		w->grants = g;
		w->gone.gone = mr_gone;
	}
	place(w, MW_NOWHERE);
	k = mr_cache_listen_entry(c, e, &w->gone, &mr);
	if (k < 0) {
		snprintf(why, why_size, "[0x%" PRIx64 ", +0x%" PRIx64 ") is registered by a mempool "
			 "or on demand: windows are bound over the domain's cache's MRs alone",
			 addr, len);
		give_back(w, true);
		return -EOPNOTSUPP;
	}
	w->mr = mr->pmr;
	w->allocation = mr->allocation;
	w->owner = owner;
	w->addr = addr;
	w->length = len;
	w->access = access;
	if (on_worker && start(w, wait, true) == 0)
		return -EINPROGRESS;
	k = w->mw ? 0 : provider_mw_alloc(g->reg->pd, &w->mw);
	if (k == 0)
		k = provider_mw_bind(w->mw, w->mr, addr, len, access, &rkey);
	if (k < 0) {
		bind_why(w, k, w->mw != NULL, why, why_size);
		if (w->mw && bind_poisons(k))
			(void)grant_free(w); /* on the loop: nothing holds the provider */
		else
			give_back(w, true);
		return k;
	}
	bound(w, rkey);
	*ret_rkey = rkey;
	return 0;
}

unsigned mw_grants_limit(const struct mw_grants *g)
{
	unsigned quota = g->reg->quota->memory_windows;
	uint32_t max_mw = g->reg->provider->caps.max_mw;
	unsigned share = max_mw / MW_DEVICE_SHARE > 0 ? max_mw / MW_DEVICE_SHARE : 1;

	return max_mw == 0 || quota < share ? quota : share;
}

static struct mw_grant *find(struct mw_grants *g, const struct mem_owner *owner, uint32_t rkey)
{
	struct mw_grant *w;

	LIST_FOREACH(w, &g->bound, link)
		if (w->rkey == rkey && w->owner == owner)
			return w;
	return NULL;
}

int mw_grants_revoke(struct mw_grants *g, const struct mem_owner *owner, uint32_t rkey,
		     struct mw_wait *wait)
{
	bool on_worker;
	struct mw_grant *w;

	if (!g->reg)
		return -ENOENT;
	on_worker = off_loop(g);
	if (!on_worker)
		retry_stuck(g);
	w = find(g, owner, rkey);
	return w ? kill(w, wait, on_worker) : -ENOENT;
}

unsigned mw_grants_drop_owner(struct mw_grants *g, const struct mem_owner *owner)
{
	struct mw_grant *w, *next;
	unsigned n = 0, here = 0;
	bool on_worker;

	if (!g->reg)
		return 0;
	on_worker = off_loop(g);
	for (w = LIST_FIRST(&g->bound); w; w = next) {
		next = LIST_NEXT(w, link);
		if (w->owner != owner)
			continue;
		n++;
		/* The loop's share, as registrations' (reg_loop_may): many clients leaving in one
		 * turn take no more of it than one does. */
		if (!on_worker && reg_loop_may(g->reg, here, 0)) {
			(void)invalidate(w);
			reg_loop_did(g->reg, 0);
			here++;
		} else {
			(void)kill(w, NULL, workers_up(g));
		}
	}
	return n;
}
