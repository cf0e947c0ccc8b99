/* SPDX-License-Identifier: MIT */
/* A domain's memory windows (the domain-PD model, mrd_window_grant): each bound over an MR of
 * the domain's cache for the client that owns the memory, with its range, access and rkey; and
 * a pool of allocated, unbound windows of the domain's PD, reused after a revoke (the provider
 * advances the key byte on every bind, so a reused window never answers to an old rkey). A
 * window hangs on its MR (mr_gone_listener): when the MR leaves the cache (its allocation
 * freed, by the client, its death or a flush of orphans) the window is invalidated there and
 * then, before the MR is deregistered and its pages go back. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "registration/mr-cache.h"

struct mem_owner;
struct provider_mw;
struct reg_base;

struct mw_grant {
	struct mr_gone_listener gone; /* on its MR while bound */
	LIST_ENTRY(mw_grant) link;    /* its grants' bound list, or their pool */
	struct mw_grants *grants;
	struct provider_mw *mw;
	const struct mem_owner *owner; /* who granted it; NULL in the pool */
	uint64_t addr, length;
	unsigned access; /* MRD_ACCESS_MW_GRANTS bits */
	uint32_t rkey;
	/* Binds of this window so far. A device changes only the key byte at each bind (verbs:
	 * ibv_inc_rkey), so its 257th bind would give its first rkey again: the window is
	 * deallocated after caps.mw_fresh_binds binds, never bound once more. */
	unsigned binds;
	bool stuck; /* on the stuck list (mw_grants) */
};

struct mw_grants {
	struct reg_base *reg;
	LIST_HEAD(, mw_grant) bound;
	LIST_HEAD(, mw_grant) pool;
	/* Windows whose invalidate and dealloc both failed: still bound on the device, their
	 * keys live, so counted (quota, mrctl) and deallocated again at each grant and revoke. */
	LIST_HEAD(, mw_grant) stuck;
	unsigned n_bound, n_pool, n_stuck;
	uint64_t binds, invalidations; /* counters */
};

/* Unbound windows kept for reuse at most; more are deallocated. */
#define MW_POOL_MAX 64

void mw_grants_init(struct mw_grants *g, struct reg_base *reg);
/* Every window deallocated (bound ones unbound with it): before the MRs and the PD go. */
void mw_grants_done(struct mw_grants *g);

/* Binds a window over [addr, addr + len) of the domain cache c's MR that e names (a lookup's
 * answer covering the range) with access (MRD_ACCESS_MW_GRANTS bits), for owner: its rkey.
 * -EOPNOTSUPP where the device has no windows or e is not an MR of c (why says so), -EDQUOT
 * past quota.memory_windows (why names the key), the bind's rules as provider_mw_bind. */
int mw_grants_grant(struct mw_grants *g, struct mr_cache *c, const struct mem_owner *owner,
		    const struct mr_entry *e, uint64_t addr, uint64_t len, unsigned access,
		    uint32_t *ret_rkey, char *why, size_t why_size);
/* Invalidates owner's window of rkey: refused from the return on. -ENOENT when owner has none
 * of that rkey bound; an invalidate's failure (the window deallocated: dead all the same). */
int mw_grants_revoke(struct mw_grants *g, const struct mem_owner *owner, uint32_t rkey);
/* owner goes: its windows are revoked. Returns how many. */
unsigned mw_grants_drop_owner(struct mw_grants *g, const struct mem_owner *owner);
