/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "macro.h"
#include "provider/provider.h"
#include "registration/mw-grants.h"
#include "registration/reg-base.h"

void mw_grants_init(struct mw_grants *g, struct reg_base *reg)
{
	*g = (struct mw_grants){ .reg = reg };
	LIST_INIT(&g->bound);
	LIST_INIT(&g->pool);
	LIST_INIT(&g->stuck);
}

/* 0 when the window is deallocated (its rkey dead with it), else the dealloc's failure: then
 * it is kept on the stuck list, live as it is on the device. */
static int grant_free(struct mw_grant *w)
{
	struct mw_grants *g = w->grants;
	int k;

	mr_cache_unlisten_gone(&w->gone);
	LIST_REMOVE(w, link);
	if (w->stuck)
		g->n_stuck--;
	else if (w->owner)
		g->n_bound--;
	else
		g->n_pool--;
	k = provider_mw_dealloc(w->mw);
	if (k < 0) {
		log_warning_errno(k, "domain %s: cannot deallocate the memory window of rkey 0x%" PRIx32
				  " (its key may still work): tried again at the next grant or "
				  "revoke: %m", g->reg->name, w->rkey);
		w->owner = NULL;
		w->stuck = true;
		LIST_INSERT_HEAD(&g->stuck, w, link);
		g->n_stuck++;
		return k;
	}
	free(w);
	return 0;
}

/* The stuck windows' deallocs, again. */
static void retry_stuck(struct mw_grants *g)
{
	struct mw_grant *w, *next;

	for (w = LIST_FIRST(&g->stuck); w; w = next) {
		next = LIST_NEXT(w, link);
		if (provider_mw_dealloc(w->mw) == 0) {
			LIST_REMOVE(w, link);
			g->n_stuck--;
			free(w);
		}
	}
}

void mw_grants_done(struct mw_grants *g)
{
	if (!g->reg)
		return;
	while (!LIST_EMPTY(&g->bound))
		(void)grant_free(LIST_FIRST(&g->bound));
	while (!LIST_EMPTY(&g->pool))
		(void)grant_free(LIST_FIRST(&g->pool));
	retry_stuck(g);
	while (!LIST_EMPTY(&g->stuck)) { /* the device keeps them with its context */
		struct mw_grant *w = LIST_FIRST(&g->stuck);

		log_error("domain %s: the memory window of rkey 0x%" PRIx32 " could not be "
			  "deallocated: left to the device", g->reg->name, w->rkey);
		LIST_REMOVE(w, link);
		g->n_stuck--;
		free(w);
	}
}

/* Whether w's next bind could give an rkey it gave before (mw-grants.h, binds). */
static bool worn_out(const struct mw_grant *w)
{
	unsigned fresh = w->grants->reg->provider->caps.mw_fresh_binds;

	return fresh > 0 && w->binds >= fresh;
}

/* w unbound (its rkey dead): into the pool, or deallocated past MW_POOL_MAX or once worn out. */
static void unbound(struct mw_grant *w)
{
	struct mw_grants *g = w->grants;

	LIST_REMOVE(w, link);
	g->n_bound--;
	w->owner = NULL;
	LIST_INSERT_HEAD(&g->pool, w, link);
	g->n_pool++;
	if (g->n_pool > MW_POOL_MAX || worn_out(w))
		(void)grant_free(w);
}

/* Invalidates w, bound: 0 once its rkey is dead. A failed invalidate deallocates it instead
 * (which kills the rkey too: rxe_dealloc_mw drops the window, whose cleanup erases its index
 * and marks it invalid, Linux rxe_mw.c rxe_mw_cleanup; mlx5 destroys its mkey): 0, or the
 * dealloc's failure. */
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
	unbound(w);
	return 0;
}

/* Its MR leaves the cache (its allocation is freed): the window dies before the MR does. */
static void mr_gone(struct mr_gone_listener *l, const struct mr_entry *mr)
{
	(void)mr;
	(void)invalidate(container_of(l, struct mw_grant, gone));
}

int mw_grants_grant(struct mw_grants *g, struct mr_cache *c, const struct mem_owner *owner,
		    const struct mr_entry *e, uint64_t addr, uint64_t len, unsigned access,
		    uint32_t *ret_rkey, char *why, size_t why_size)
{
	const struct provider_caps *caps = &g->reg->provider->caps;
	struct provider_mr *pmr;
	struct mw_grant *w;
	uint32_t rkey;
	int k;

	if (!caps->mw) {
		snprintf(why, why_size, "device %s: %s", caps->device,
			 caps->no_mw ? caps->no_mw : "no memory windows");
		return -EOPNOTSUPP;
	}
	retry_stuck(g);
	if (g->n_bound + g->n_stuck >= g->reg->quota->memory_windows)
		return config_quota_refusal(g->reg->config, g->reg->quota, QUOTA_MEMORY_WINDOWS,
					    g->reg->name, g->n_bound + g->n_stuck, 1, why,
					    why_size);
	w = LIST_FIRST(&g->pool);
	if (w) {
		LIST_REMOVE(w, link);
		g->n_pool--;
	} else {
		w = calloc(1, sizeof(*w));
		if (!w)
			return -ENOMEM;
		w->grants = g;
		w->gone.gone = mr_gone;
		k = provider_mw_alloc(g->reg->pd, &w->mw);
		if (k < 0) {
			free(w);
			snprintf(why, why_size, "cannot allocate a memory window on %s", caps->device);
			return k;
		}
	}
	/* Bound (an owner) only once the bind is: a failed one goes back to the pool. */
	LIST_INSERT_HEAD(&g->pool, w, link);
	g->n_pool++;
	k = mr_cache_listen_entry(c, e, &w->gone, &pmr);
	if (k < 0) {
		snprintf(why, why_size, "[0x%" PRIx64 ", +0x%" PRIx64 ") is registered by a mempool "
			 "or on demand: windows are bound over the domain's cache's MRs alone",
			 addr, len);
		return -EOPNOTSUPP;
	}
	k = provider_mw_bind(w->mw, pmr, addr, len, access, &rkey);
	if (k == -EAGAIN) {
		mr_cache_unlisten_gone(&w->gone);
		snprintf(why, why_size, "device %s: the queue pairs windows are bound on need mending "
			 "after a failure, and a Dma is using them: try again", caps->device);
		return k;
	}
	if (k < 0) {
		mr_cache_unlisten_gone(&w->gone);
		snprintf(why, why_size, "the bind of a window over [0x%" PRIx64 ", +0x%" PRIx64 ") "
			 "failed", addr, len);
		return k;
	}
	LIST_REMOVE(w, link);
	g->n_pool--;
	*w = (struct mw_grant){ .gone = w->gone, .grants = g, .mw = w->mw, .owner = owner,
				.addr = addr, .length = len, .access = access, .rkey = rkey,
				.binds = w->binds + 1 };
	LIST_INSERT_HEAD(&g->bound, w, link);
	g->n_bound++;
	g->binds++;
	*ret_rkey = rkey;
	return 0;
}

static struct mw_grant *find(struct mw_grants *g, const struct mem_owner *owner, uint32_t rkey)
{
	struct mw_grant *w;

	LIST_FOREACH(w, &g->bound, link)
		if (w->rkey == rkey && w->owner == owner)
			return w;
	return NULL;
}

int mw_grants_revoke(struct mw_grants *g, const struct mem_owner *owner, uint32_t rkey)
{
	struct mw_grant *w = g->reg ? find(g, owner, rkey) : NULL;

	if (g->reg)
		retry_stuck(g);
	return w ? invalidate(w) : -ENOENT;
}

unsigned mw_grants_drop_owner(struct mw_grants *g, const struct mem_owner *owner)
{
	struct mw_grant *w, *next;
	unsigned n = 0;

	if (!g->reg)
		return 0;
	for (w = LIST_FIRST(&g->bound); w; w = next) {
		next = LIST_NEXT(w, link);
		if (w->owner == owner) {
			(void)invalidate(w);
			n++;
		}
	}
	return n;
}
