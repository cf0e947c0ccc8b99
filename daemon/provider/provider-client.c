/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "macro.h"
#include "provider/client-context.h"
#include "provider/provider-client.h"

struct client_provider {
	struct provider base;
	struct provider_pd pd;
	struct client_context *ctx;
	uint32_t pd_handle;
	uint64_t mrs, registrations;
};

struct client_provider_mr {
	struct provider_mr base;
	uint32_t handle;
};

static struct client_provider *to_client(struct provider *p)
{
	return container_of(p, struct client_provider, base);
}

static unsigned ib_access(unsigned access)
{
	return (access & MRD_ACCESS_LOCAL_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0) |
	       (access & MRD_ACCESS_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (access & MRD_ACCESS_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (access & MRD_ACCESS_REMOTE_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0) |
	       (access & MRD_ACCESS_ON_DEMAND ? IBV_ACCESS_ON_DEMAND : 0) |
	       (access & MRD_ACCESS_MW_BIND ? IBV_ACCESS_MW_BIND : 0);
}

static int client_reg(struct provider_pd *pd, void *addr, size_t length, uint64_t iova,
		      unsigned access, struct provider_mr **ret)
{
	struct client_provider *cp = to_client(pd->provider);
	struct client_provider_mr *mr = calloc(1, sizeof(*mr));
	struct client_mr keys;
	int r;

	if (!mr)
		return -ENOMEM;
	r = client_context_reg(cp->ctx, cp->pd_handle, addr, length, iova, ib_access(access),
			       &keys);
	if (r < 0) {
		free(mr);
		return r;
	}
	mr->base = (struct provider_mr){ .pd = pd, .addr = (uintptr_t)addr, .length = length,
					 .iova = iova, .lkey = keys.lkey, .rkey = keys.rkey,
					 .access = access };
	mr->handle = keys.handle;
	pd->n_mrs++;
	cp->mrs++;
	cp->registrations++;
	*ret = &mr->base;
	return 0;
}

static int client_dereg(struct provider_mr *base)
{
	struct client_provider_mr *mr = container_of(base, struct client_provider_mr, base);
	struct client_provider *cp = to_client(base->pd->provider);
	int r = client_context_dereg(cp->ctx, mr->handle);

	/* The handle is the client's object: it may have destroyed the MR itself (DEREG_MR of a
	 * handle it guessed): ENOENT, no such object (Linux 6.12 rdma_core.c,
	 * lookup_get_idr_uobject), and its pages went with it. EIO: the context was disassociated
	 * (the device went: uverbs_destroy_ufile_hw destroyed its objects). EINVAL is no proof:
	 * the handle may be another object of the client's now, or rxe refuses while a memory
	 * window is bound to the MR (rxe_dereg_mr): the MR is kept, its run quarantined. */
	if (r == -ENOENT || r == -EIO)
		r = 0;
	if (r < 0)
		return r; /* still the client's MR over mrd's pages (a memory window bound to it) */
	base->pd->n_mrs--;
	cp->mrs--;
	free(mr);
	return 0;
}

/* The kernel checks the handle's type (Linux 6.1 uverbs_cmd.c ib_uverbs_dealloc_mw,
 * uobj_perform_destroy(UVERBS_OBJECT_MW, ...)): a handle that is another object's now is
 * refused (-EINVAL), not destroyed. */
static int client_mw_dealloc(struct provider *p, uint32_t handle)
{
	return client_context_dealloc_mw(to_client(p)->ctx, handle);
}

static int client_pd_free(struct provider_pd *pd)
{
	return pd->n_mrs ? -EBUSY : 0;
}

static void client_stats(const struct provider *p, struct provider_stats *ret)
{
	const struct client_provider *cp = container_of(p, const struct client_provider, base);

	*ret = (struct provider_stats){ .mrs = cp->mrs, .registrations = cp->registrations };
}

static void client_close(struct provider *p)
{
	struct client_provider *cp = to_client(p);

	client_context_close(cp->ctx);
	pthread_mutex_destroy(&p->lock);
	pthread_mutex_destroy(&p->event_lock);
	free(cp);
}

static const struct provider_ops client_ops = {
	.name = "client",
	.close = client_close,
	.pd_free = client_pd_free,
	.reg = client_reg,
	.dereg = client_dereg,
	.client_mw_dealloc = client_mw_dealloc,
	.stats = client_stats,
};

int client_provider_open(struct client_context *ctx, uint32_t pd_handle,
			 const struct provider_caps *device_caps, struct provider **ret,
			 struct provider_pd **ret_pd)
{
	struct client_provider *cp = calloc(1, sizeof(*cp));

	if (!cp)
		return -ENOMEM;
	cp->base.ops = &client_ops;
	pthread_mutex_init(&cp->base.lock, NULL);
	pthread_mutex_init(&cp->base.event_lock, NULL);
	cp->base.caps = *device_caps;
	cp->base.caps.rereg_translation = false;
	cp->base.caps.rereg_new_keys = false;
	cp->base.caps.dma = false;
	cp->base.caps.no_dma = "a client's own PD: the client posts on its own QPs";
	cp->base.caps.dma_emulated = false;
	cp->base.caps.export_pd = false;
	cp->base.caps.max_keys = 0;
	/* caps.mw stays the device's: its MRs may take MW_BIND, and the client binds windows
	 * on its own QPs; mrd has none to bind them on (no mw_* ops). */
	cp->ctx = ctx;
	cp->pd_handle = pd_handle;
	cp->pd.provider = &cp->base;
	*ret = &cp->base;
	*ret_pd = &cp->pd;
	return 0;
}
