/* SPDX-License-Identifier: MIT */
/* Memory windows in the domain-PD model: who may grant remote access to which bytes (the
 * process that owns the allocation), and over which MR (the domain's, made on a miss). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "registration/bound-pd.h"
#include "registration/mw-grants.h"
#include "core/domain.h"

/* What both models check: windows on the device, over pinned memory of owner's own. */
static const struct allocation *window_memory(struct domain *d, const struct provider_caps *caps,
					      const struct mem_owner *owner, uint64_t address,
					      char *why, size_t why_size, int *ret)
{
	const struct allocation *a = domain_allocation_containing(d, address);

	*ret = 0;
	if (!caps->mw) {
		snprintf(why, why_size, "device %s: %s", caps->device,
			 caps->no_mw ? caps->no_mw : "no memory windows");
		*ret = -EOPNOTSUPP;
		return NULL;
	}
	if (!a) {
		snprintf(why, why_size, "0x%" PRIx64 " is not in an allocation of domain %s",
			 address, d->name);
		*ret = -ENOENT;
	} else if (!a->owner || a->owner->pid != owner->pid) {
		/* As an adopted buffer's keys (check_asker): the memory's own process alone. */
		snprintf(why, why_size, "0x%" PRIx64 " is memory of process %d: only it grants "
			 "remote access to it", address, a->owner ? a->owner->pid : 0);
		*ret = -EACCES;
	} else if (a->alias || a->odp) {
		snprintf(why, why_size, "0x%" PRIx64 " is %s memory: windows are bound over pinned "
			 "mrd memory alone", address, a->alias ? "adopted" : "on-demand");
		*ret = -EOPNOTSUPP;
	}
	return *ret < 0 ? NULL : a;
}

int domain_window_grant(struct domain *d, const struct mem_owner *owner, uint64_t address,
			uint64_t length, unsigned access, uint32_t *ret_rkey, char *why,
			size_t why_size, struct waiter *waiter, struct mw_wait *wait)
{
	struct mr_entry e;
	int k;

	if (!window_memory(d, &domain_provider(d)->caps, owner, address, why, why_size, &k))
		return k;
	k = domain_lookup_range(d, NULL, owner->pid, address, length, &e, why, why_size, waiter);
	if (k < 0)
		return k;
	return mw_grants_grant(&d->reg.windows, &d->reg.cache, owner, &e, address, length, access,
			       ret_rkey, why, why_size, wait);
}

int domain_window_mr(struct domain *d, struct bound_pd *bound, const struct mem_owner *owner,
		     uint64_t address, uint64_t length, struct mr_entry *ret,
		     uint64_t *ret_alloc_start, uint64_t *ret_alloc_end, char *why, size_t why_size,
		     struct waiter *waiter)
{
	const struct allocation *a;
	int k;

	a = window_memory(d, &bound->provider->caps, owner, address, why, why_size, &k);
	if (!a)
		return k;
	/* libmrd kills a handle's windows at that handle's frees and close alone. */
	if (a->owner != owner) {
		snprintf(why, why_size, "0x%" PRIx64 " is memory of another handle of this process: "
			 "grant on the handle that allocated it", address);
		return -EPERM;
	}
	k = domain_lookup_range(d, bound, owner->pid, address, length, ret, why, why_size, waiter);
	if (k < 0)
		return k;
	*ret_alloc_start = allocation_address(a);
	*ret_alloc_end = *ret_alloc_start + a->length;
	return 0;
}

int domain_window_revoke(struct domain *d, const struct mem_owner *owner, uint32_t rkey,
			 char *why, size_t why_size, struct mw_wait *wait)
{
	int k = mw_grants_revoke(&d->reg.windows, owner, rkey, wait);

	if (k == -ENOENT)
		snprintf(why, why_size, "rkey 0x%" PRIx32 " is no window this connection granted "
			 "(revoked already, or its memory freed)", rkey);
	return k;
}
