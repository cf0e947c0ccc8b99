/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "macro.h"
#include "provider/client-context.h"
#include "provider/provider-client.h"
#include "provider/provider.h"
#include "registration/bound-pd.h"
#include "registration/reg-base.h"

static void bound_hold(struct mr_cache *c)
{
	container_of(c, struct bound_pd, cache)->holds++;
}

static void bound_unhold(struct mr_cache *c)
{
	struct bound_pd *b = container_of(c, struct bound_pd, cache);
	int k;

	if (--b->holds > 0)
		return;
	LIST_REMOVE(&b->cache, bound_link);
	k = provider_pd_free(b->pd);
	if (k < 0) /* an MR the device kept went with its quarantined run: the context keeps it */
		log_warning_errno(k, "client PD %u (%s): MRs left at close: %m", b->pd_handle,
				  b->driver);
	free(b->windows);
	mr_table_done(&b->cache.table);
	u64_map_done(&b->cache.by_lkey);
	provider_close(b->provider); /* closes mrd's copy of the command fd */
	free(b);
}

int bound_pd_adopt(struct mr_cache *home, struct provider *provider, struct provider_pd *pd,
		   const char *driver, uint32_t pd_handle, pid_t pid, struct bound_pd **ret)
{
	struct bound_pd *b = calloc(1, sizeof(*b));
	int k;

	if (!b) {
		provider_close(provider);
		return -ENOMEM;
	}
	/* The domain's policy, but on-demand memory is refused: no child MRs here (mr-cache.c). */
	k = mr_cache_init(&b->cache, home->reg, home, pd, home->policy == MR_POLICY_ODP ?
			  MR_POLICY_CONTIG : home->policy);
	if (k < 0) {
		provider_close(provider);
		free(b);
		return k;
	}
	b->cache.pid = pid;
	b->cache.hold = bound_hold;
	b->cache.unhold = bound_unhold;
	LIST_INSERT_HEAD(&home->bound, &b->cache, bound_link);
	b->provider = provider;
	b->pd = pd;
	b->pd_handle = pd_handle;
	snprintf(b->driver, sizeof(b->driver), "%s", driver);
	b->holds = 1;
	*ret = b;
	return 0;
}

int bound_pd_open(struct mr_cache *home, struct client_context *ctx, uint32_t pd_handle,
		  const struct provider_caps *caps, pid_t pid, struct bound_pd **ret)
{
	char driver[16];
	struct provider *p;
	struct provider_pd *pd;
	int k;

	snprintf(driver, sizeof(driver), "%s", client_context_driver(ctx));
	k = client_provider_open(ctx, pd_handle, caps, &p, &pd);
	if (k < 0) {
		client_context_close(ctx);
		return k;
	}
	return bound_pd_adopt(home, p, pd, driver, pd_handle, pid, ret);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int bound_pd_track(struct bound_pd *b, bool clear, const uint32_t *add, size_t n_add,
		   const uint32_t *remove, size_t n_remove)
{
	uint32_t *next, *gone;
	size_t n = 0;

	if (n_add > BOUND_PD_WINDOWS_MAX || n_remove > BOUND_PD_WINDOWS_MAX)
		return -ENOSPC;
	/* What it would hold, made aside: a refusal changes nothing. */
	next = malloc((b->n_windows + n_add + n_remove) * sizeof(*next) + 1);
	if (!next)
		return -ENOMEM;
	gone = next + b->n_windows + n_add;
	if (n_remove > 0) { /* protobuf-c leaves an empty repeated field NULL */
		memcpy(gone, remove, n_remove * sizeof(*gone));
		qsort(gone, n_remove, sizeof(*gone), cmp_u32);
	}
	for (unsigned i = 0; !clear && i < b->n_windows; i++)
		if (!n_remove || !bsearch(&b->windows[i], gone, n_remove, sizeof(*gone), cmp_u32))
			next[n++] = b->windows[i];
	if (n_add > 0)
		memcpy(next + n, add, n_add * sizeof(*next));
	n += n_add;
	qsort(next, n, sizeof(*next), cmp_u32);
	if (n > 0) {
		size_t u = 1;

		for (size_t i = 1; i < n; i++)
			if (next[i] != next[u - 1])
				next[u++] = next[i];
		n = u;
	}
	if (n > BOUND_PD_WINDOWS_MAX) {
		free(next);
		return -ENOSPC;
	}
	free(b->windows);
	b->windows = next;
	b->n_windows = (unsigned)n;
	return (int)n;
}

void bound_pd_leave(struct bound_pd *b)
{
	mr_cache_close(&b->cache);
	b->leaving = true;
}

/* Its windows wait for a worker that registers in the PD, holding its provider for the whole
 * registration (seconds for GiBs): the loop comes back rather than wait for it. */
static bool windows_wait_worker(const struct bound_pd *b)
{
	return b->n_windows > 0 && b->cache.pending_bytes > 0;
}

/* A share of the windows the client tracked, deallocated in its context, each counted as a
 * registration on the loop (a client may leave 1,024, and a user 256 such connections): the
 * dealloc fails harmlessly for a handle that is no window now. Whether none is left. */
static bool drop_windows_share(struct bound_pd *b, bool all, unsigned *made, unsigned *dropped)
{
	if (!all && windows_wait_worker(b))
		return false;
	while (b->n_windows > 0) {
		if (!all && *made > 0 && !reg_loop_may(b->cache.reg, *made, 0))
			return false;
		reg_loop_did(b->cache.reg, 0);
		(*made)++;
		if (provider_client_mw_dealloc(b->provider, b->windows[--b->n_windows]) == 0) {
			b->windows_gone++;
			(*dropped)++;
		}
	}
	if (b->windows_gone > 0)
		log_info("client PD %u (%s): deallocated %u window(s) its client left", b->pd_handle,
			 b->driver, b->windows_gone);
	b->windows_gone = 0;
	return true;
}

/* A share of b's MRs; once none is left, its client's hold goes (and with the last hold, the
 * context). */
static bool leave_share(struct bound_pd *b, bool all, unsigned *made, unsigned *dropped)
{
	if (!drop_windows_share(b, all, made, dropped) ||
	    !mr_cache_drop_share(&b->cache, all, made))
		return false;
	b->leaving = false;
	bound_unhold(&b->cache);
	return true;
}

bool bound_pds_leave_share(struct mr_cache *home, bool all, unsigned *made, unsigned *dropped)
{
	struct mr_cache *c, *next;

	for (c = LIST_FIRST(&home->bound); c; c = next) {
		struct bound_pd *b = container_of(c, struct bound_pd, cache);

		next = LIST_NEXT(c, bound_link);
		if (b->leaving && !leave_share(b, all, made, dropped))
			return false;
	}
	return true;
}

bool bound_pds_wait_worker(const struct mr_cache *home)
{
	const struct mr_cache *c;

	LIST_FOREACH(c, &home->bound, bound_link) {
		const struct bound_pd *b = container_of(c, const struct bound_pd, cache);

		if (b->leaving && windows_wait_worker(b))
			return true;
	}
	return false;
}

bool bound_pds_leaving(const struct mr_cache *home)
{
	const struct mr_cache *c;

	LIST_FOREACH(c, &home->bound, bound_link)
		if (container_of(c, struct bound_pd, cache)->leaving)
			return true;
	return false;
}

struct bound_pd *bound_pd_close(struct bound_pd *b)
{
	unsigned made = 0, dropped = 0;

	if (!b)
		return NULL;
	/* Its client lives on (a hand-over): its windows are its own. One bound over an MR here
	 * keeps that MR (rxe), and the hand-over is refused, as for any MR the device keeps. */
	b->n_windows = 0;
	bound_pd_leave(b);
	(void)leave_share(b, true, &made, &dropped);
	return NULL;
}
