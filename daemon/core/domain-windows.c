/* SPDX-License-Identifier: MIT */
/* Memory windows in the domain-PD model: who may grant remote access to which bytes (the
 * process that owns the allocation), and over which MR (the domain's, made on a miss). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "registration/mw-grants.h"
#include "core/domain.h"

int domain_window_grant(struct domain *d, const struct mem_owner *owner, uint64_t address,
			uint64_t length, unsigned access, uint32_t *ret_rkey, char *why,
			size_t why_size, struct waiter *waiter, struct mw_wait *wait)
{
	const struct allocation *a = domain_allocation_containing(d, address);
	struct mr_entry e;
	int k;

	if (!domain_provider(d)->caps.mw) {
		snprintf(why, why_size, "device %s: %s", domain_provider(d)->caps.device,
			 domain_provider(d)->caps.no_mw ? domain_provider(d)->caps.no_mw :
			 "no memory windows");
		return -EOPNOTSUPP;
	}
	if (!a) {
		snprintf(why, why_size, "0x%" PRIx64 " is not in an allocation of domain %s",
			 address, d->name);
		return -ENOENT;
	}
	/* As an adopted buffer's keys (check_asker): the memory's own process alone. */
	if (!a->owner || a->owner->pid != owner->pid) {
		snprintf(why, why_size, "0x%" PRIx64 " is memory of process %d: only it grants "
			 "remote access to it", address, a->owner ? a->owner->pid : 0);
		return -EACCES;
	}
	if (a->alias || a->odp) {
		snprintf(why, why_size, "0x%" PRIx64 " is %s memory: windows are bound over pinned "
			 "mrd memory alone", address, a->alias ? "adopted" : "on-demand");
		return -EOPNOTSUPP;
	}
	k = domain_lookup_range(d, NULL, owner->pid, address, length, &e, why, why_size, waiter);
	if (k < 0)
		return k;
	return mw_grants_grant(&d->reg.windows, &d->reg.cache, owner, &e, address, length, access,
			       ret_rkey, why, why_size, wait);
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
