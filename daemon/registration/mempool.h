/* SPDX-License-Identifier: MIT */
/* Mempool registrations (DPDK's mempool registration, in the daemon): a client names a pool and
 * the ranges of its memory; mrd rounds them out to pages, merges the ones that touch inside one
 * allocation and registers each. A pool inside one huge page gets that huge page's MR, shared
 * and counted by every pool of the domain inside it. These MRs live beside the MR cache, not in
 * it: they belong to pool registrations, not to addresses, and last until their last pool goes
 * (a cache lookup inside one answers with it rather than pin its pages again).
 * An allocation under a pool MR cannot be freed; when its owner dies it stays, ownerless, until
 * the last pool MR over it goes. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

struct mr_cache_others;
struct mr_wait;
struct waiter;
struct provider_mr;
struct reg_allocation;
struct mr_cache;
struct reg_base;
struct reg_owner;
struct unreg_ticket;

/* One registered range, shared by the pools whose memory lies in it. */
struct pool_mr {
	struct mempools *set;           /* the domain's */
	LIST_ENTRY(pool_mr) link;       /* the domain's */
	LIST_ENTRY(pool_mr) alloc_link; /* its allocation's */
	struct reg_allocation *allocation; /* holds it: allocation->pool_refs */
	uint64_t start, end;
	struct provider_mr *pmr; /* NULL until registered */
	unsigned sharers; /* pool registrations using it */
	bool hugepage;    /* exactly one huge page: other pools inside it share it */
	bool pending;     /* a worker is registering it */
	int error;        /* how the worker's registration failed */
	unsigned access;  /* its allocation's */
	struct mr_wait *lookups; /* lookups inside it, waiting while it is pending */
	struct unreg_ticket *ticket; /* counts its deregistration on a worker, when not NULL */
};

/* Whether it counts: registered, or being registered (one that failed is about to go).
 * pending first: a worker writes pmr until the loop clears it. */
static inline bool pool_mr_live(const struct pool_mr *mr)
{
	return mr->pending || mr->pmr;
}

struct pool_reg {
	LIST_ENTRY(pool_reg) link;       /* the domain's (mempools.regs) */
	LIST_ENTRY(pool_reg) owner_link; /* its client's */
	struct reg_owner *owner;
	char name[64];
	bool extmem;
	unsigned pending;          /* its MRs that workers still register */
	int error;                 /* the first of them that failed */
	struct waiter *waiter;  /* told once none is pending */
	struct pool_reg *replaces; /* an older registration of the name, dropped once made */
	struct unreg_ticket *ticket; /* with replaces: answers once the dropped MRs are gone */
	struct unreg_ticket *answer; /* that ticket, once it waits for them */
	struct pool_reg *settle_next; /* on a worker's completion: those to settle */
	size_t n_mrs;
	struct pool_mr *mrs[]; /* by address */
};

/* A domain's mempool registrations and their MRs (in its registrar). */
struct mempools {
	struct reg_base *reg;   /* its registrar's */
	struct mr_cache *cache; /* the domain's: its charges count the pool MRs' pages */
	LIST_HEAD(, pool_reg) regs;
	LIST_HEAD(, pool_mr) mrs;
	unsigned n_regs;
};

void mempools_init(struct mempools *p, struct reg_base *r, struct mr_cache *cache);

/* The live pool MR of a that holds addr, if any: lookups answer with it. */
struct pool_mr *mempool_mr_containing(const struct reg_allocation *a, uint64_t addr);
/* The domain's cache's others (mr-cache.h): a lookup inside a pool MR gets it (pinning its
 * pages again would count them twice), or waits for the worker making it; the cache's MRs
 * never overlap a live one. */
extern const struct mr_cache_others mempool_others;

/* Registers the owner's pool name over n ranges ([starts[i], starts[i] + lengths[i])). EEXIST
 * when the owner has it registered already, unless extmem replaces a registration that was
 * not; EFAULT for a range outside one live allocation of the domain; EDQUOT past
 * quota.mempools or quota.pinned_bytes. why says what went wrong.
 * Like the cache, it registers [cache] async_bytes or more (or anything while a worker holds
 * the provider) on a worker, and a pool sharing a huge page MR that a worker is still making
 * waits for it, and a registration that replaces one is answered once the MRs it drops are
 * deregistered (here, or on a worker): then -EINPROGRESS, *ret is set, and waiter->resume
 * (result, no entry) runs on the loop once it is made — or has failed, and is gone — or once
 * its owner left. waiter must not be NULL. */
int mempool_register(struct mempools *p, struct reg_owner *owner, const char *name,
		     const uint64_t *starts, const uint64_t *lengths, size_t n, bool extmem,
		     struct waiter *waiter, struct pool_reg **ret, char *why, size_t why_size);

/* ENOENT when the owner has no pool of that name. An MR whose last sharer leaves is
 * deregistered — on a worker when it covers [cache] async_bytes or more: then, with a waiter,
 * -EINPROGRESS, and waiter->resume (result 0) runs once every such MR is gone. */
int mempool_unregister(struct mempools *p, struct reg_owner *owner, const char *name,
		       struct waiter *waiter, char *why, size_t why_size);

/* The owner is going: its registrations are to's now (to is no client: it registers nothing),
 * and whoever waited for them hears ECANCELED. They go with mempool_leave_share(). */
void mempool_give_all(struct mempools *p, struct reg_owner *owner, struct reg_owner *to);
/* A share of leaving's registrations goes (all of them with all), MR by MR while the loop's
 * budget allows (reg_loop_may, *made of them made already in this share, at least one):
 * shared MRs stay while others use them, each MR's death is published before it dies. Whether
 * none is left. */
bool mempool_leave_share(struct mempools *p, struct reg_owner *leaving, bool all,
			 unsigned *made);
/* The pool MRs the device kept over the retired a (their dereg failed), tried again: whether
 * none is left. */
bool mempool_retry_stuck(struct mempools *p, struct reg_allocation *a);
/* At close: forgets them, uncharged (their handles go with the context). */
void mempool_drop_stuck(struct mempools *p, struct reg_allocation *a);
