/* SPDX-License-Identifier: MIT */
/* A domain's memory windows (the domain-PD model, mrd_window_grant): each bound over an MR of
 * the domain's cache for the client that owns the memory, with its range, access and rkey; and
 * a pool of allocated, unbound windows of the domain's PD, reused after a revoke (the provider
 * advances the key byte on every bind, so a reused window never answers to an old rkey). A
 * window hangs on its MR (mr_gone_listener): when the MR leaves the cache (its allocation
 * freed, by the client, its death or a flush of orphans) the window is handed to the MR
 * (provider_mw_doom), whose dereg deallocates it first: dead before the pages go back.
 * The loop never waits for the provider: while a worker may hold it (reg_offload), a bind or
 * an invalidate runs on a worker, and the allocation's free waits for it (bound_jobs). */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "registration/mr-cache.h"

struct mem_owner;
struct provider_mr;
struct provider_mw;
struct reg_allocation;
struct reg_base;

struct mw_grant {
	struct mr_gone_listener gone; /* on its MR while bound, and while a worker binds it */
	LIST_ENTRY(mw_grant) link;    /* its grants' bound, pool, stuck or busy list */
	struct mw_grants *grants;
	struct provider_mw *mw; /* NULL until a worker allocates it */
	/* While bound, and while a worker works on it: the MR it is bound over, and that MR's
	 * allocation, whose free waits for the worker (bound_jobs). */
	struct provider_mr *mr;
	struct reg_allocation *allocation;
	const struct mem_owner *owner; /* who granted it; NULL in the pool */
	uint64_t addr, length;
	unsigned access; /* MRD_ACCESS_MW_GRANTS bits */
	uint32_t rkey;
	/* Binds of this window so far. A device changes only the key byte at each bind (verbs:
	 * ibv_inc_rkey), so its 257th bind would give its first rkey again: the window is
	 * deallocated after caps.mw_fresh_binds binds, never bound once more. */
	unsigned binds;
	enum mw_place {
		MW_NOWHERE,
		MW_POOL,
		MW_BOUND,
		MW_BUSY,  /* a worker binds or kills it */
		MW_STUCK, /* its invalidate and dealloc failed (mw_grants) */
		MW_DYING, /* unbound, its key dead, to be deallocated where nothing holds the provider */
	} place;
	bool freed; /* its memory was freed while a worker bound it */
};

/* A request that waits for a worker's bind or kill of its window. */
struct mw_wait {
	/* On the loop: result (0, or the failure and why), and a grant's rkey. A grant's returns
	 * false when its client is gone: the window is revoked then. */
	bool (*done)(struct mw_wait *wait, int result, uint32_t rkey, const char *why);
};

struct mw_grants {
	struct reg_base *reg;
	LIST_HEAD(mw_grant_list, mw_grant) bound;
	struct mw_grant_list pool;
	/* Windows whose invalidate and dealloc both failed: still bound on the device, their
	 * keys live, so counted (quota, mrctl) and deallocated again at each grant and revoke. */
	struct mw_grant_list stuck;
	struct mw_grant_list busy; /* on workers: counted as bound */
	struct mw_grant_list dying; /* worn out at a job's end: not counted, never bound again */
	unsigned n_bound, n_pool, n_stuck, n_busy, n_dying;
	unsigned to_pool; /* kills on workers whose window goes to the pool after */
	uint64_t binds, invalidations; /* counters */
};

/* Unbound windows kept for reuse at most; more are deallocated. */
#define MW_POOL_MAX 64
/* A domain holds at most this fraction of the device's windows (caps.max_mw), whatever its
 * quota: a user has several domains (its own, container domains, groups), and the device's
 * windows are every user's (and programs' own ibv_alloc_mw), so one user holds a few percent
 * (Linux 6.1 rxe: 4095 per domain; older rxe kernels had 4096 in all). */
#define MW_DEVICE_SHARE 128

void mw_grants_init(struct mw_grants *g, struct reg_base *reg);
/* Every window deallocated (bound ones unbound with it): before the MRs and the PD go. */
void mw_grants_done(struct mw_grants *g);

/* Binds a window over [addr, addr + len) of the domain cache c's MR that e names (a lookup's
 * answer covering the range) with access (MRD_ACCESS_MW_GRANTS bits), for owner: its rkey.
 * -EINPROGRESS: a worker binds it, and wait hears. -EOPNOTSUPP where the device has no
 * windows or e is not an MR of c (why says so), -EDQUOT past quota.memory_windows (why names
 * the key), the bind's rules as provider_mw_bind. */
int mw_grants_grant(struct mw_grants *g, struct mr_cache *c, const struct mem_owner *owner,
		    const struct mr_entry *e, uint64_t addr, uint64_t len, unsigned access,
		    uint32_t *ret_rkey, char *why, size_t why_size, struct mw_wait *wait);
/* Invalidates owner's window of rkey: refused from the return on (from wait's done on, after
 * -EINPROGRESS). -ENOENT when owner has none of that rkey bound; an invalidate's failure
 * deallocates the window, dead all the same: 0, or the dealloc's failure too. */
int mw_grants_revoke(struct mw_grants *g, const struct mem_owner *owner, uint32_t rkey,
		     struct mw_wait *wait);
/* Windows whose keys may work: bound, on workers, stuck, or handed to freed memory's MRs and
 * not deallocated yet (what memory_windows shows and the quota counts). */
unsigned mw_grants_live(const struct mw_grants *g);
/* How many windows the domain may hold: [quota] memory_windows, at most its share of the
 * device (MW_DEVICE_SHARE). */
unsigned mw_grants_limit(const struct mw_grants *g);
/* owner goes: its windows are revoked (on workers, but for a few while none holds the
 * provider). Returns how many. */
unsigned mw_grants_drop_owner(struct mw_grants *g, const struct mem_owner *owner);
