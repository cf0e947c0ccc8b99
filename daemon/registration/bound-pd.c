/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "macro.h"
#include "provider/client-context.h"
#include "provider/provider-client.h"
#include "registration/bound-pd.h"

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

void bound_pd_leave(struct bound_pd *b)
{
	mr_cache_close(&b->cache);
	b->leaving = true;
}

/* A share of b's MRs; once none is left, its client's hold goes (and with the last hold, the
 * context). */
static bool leave_share(struct bound_pd *b, bool all, unsigned *made)
{
	if (!mr_cache_drop_share(&b->cache, all, made))
		return false;
	b->leaving = false;
	bound_unhold(&b->cache);
	return true;
}

bool bound_pds_leave_share(struct mr_cache *home, bool all, unsigned *made)
{
	struct mr_cache *c, *next;

	for (c = LIST_FIRST(&home->bound); c; c = next) {
		struct bound_pd *b = container_of(c, struct bound_pd, cache);

		next = LIST_NEXT(c, bound_link);
		if (b->leaving && !leave_share(b, all, made))
			return false;
	}
	return true;
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
	unsigned made = 0;

	if (!b)
		return NULL;
	bound_pd_leave(b);
	(void)leave_share(b, true, &made);
	return NULL;
}
