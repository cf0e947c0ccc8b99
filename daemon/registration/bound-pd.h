/* SPDX-License-Identifier: MIT */
/* A client's own PD, bound to mrd (BindPd): the client's lookups get keys of MRs mrd makes
 * there, over its domain's memory, with the domain's policy, quotas and pinned accounting
 * (an MR cache of its own, registration/mr-cache.h). The MRs are the client's objects (its
 * QPs use them), registered by mrd through its copy of the client's command fd. Every
 * allocation lists them beside the domain's MRs, so a free deregisters them before its pages
 * go back; when the client goes, mrd deregisters what is left and drops its copy of the fd. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "registration/mr-cache.h"

struct client_context;
struct provider_caps;
struct provider;
struct provider_pd;

struct bound_pd {
	struct mr_cache cache;
	struct provider *provider; /* provider/provider-client.h: the client's context */
	struct provider_pd *pd;
	unsigned holds;            /* its client's, each MR's, each job's */
	bool leaving;              /* its client left: its MRs go a share a turn (core/domain.h) */
	uint32_t pd_handle;
	char driver[16];
	/* Windows of the client's context it tracked (WindowTrack), sorted: mrd deallocates
	 * them when the client goes, before any MR of the PD (bound_pds_leave_share). */
	uint32_t *windows;
	unsigned n_windows;
	unsigned windows_gone; /* deallocated since its client left, for the log */
};

/* A connection tracks this many windows at most: 12 KiB of mrd's memory, and as many
 * deallocations on the loop when it ends. */
#define BOUND_PD_WINDOWS_MAX 1024u

/* A cache for PD pd_handle of ctx (taken, also on failure) over the memory of home, the
 * domain's cache (whose charges count its pages); caps are of the context's device (any mrd
 * serves, not only the domain's). pid is the client's process: memory it aliased
 * (allocation.h) is registered at the alias here. */
int bound_pd_open(struct mr_cache *home, struct client_context *ctx, uint32_t pd_handle,
		  const struct provider_caps *caps, pid_t pid, struct bound_pd **ret);
/* The same over any provider's PD (taken, also on failure: pd goes with provider): mrd's is
 * the client's context (provider/provider-client.h); tests bind a soft PD, whose keys soft
 * DMA checks. driver and pd_handle are for mrctl. */
int bound_pd_adopt(struct mr_cache *home, struct provider *provider, struct provider_pd *pd,
		   const char *driver, uint32_t pd_handle, pid_t pid, struct bound_pd **ret);
/* Forgets every window (clear), removes, then adds window handles (WindowTrack): the number
 * tracked, or -ENOSPC (past BOUND_PD_WINDOWS_MAX) or -ENOMEM with nothing changed. A handle
 * already tracked, or not tracked, is no error. */
int bound_pd_track(struct bound_pd *b, bool clear, const uint32_t *add, size_t n_add,
		   const uint32_t *remove, size_t n_remove);
/* mrd lets go of a live client's PD (a hand-over): every MR of the PD is deregistered (on
 * workers when big) and its pages uncharged; mrd's copy of the fd closes once the last of them
 * and of the jobs is done. The windows it tracked are forgotten, not deallocated: they are the
 * live client's. NULL is fine. Returns NULL. */
struct bound_pd *bound_pd_close(struct bound_pd *b);
/* The same, a share at a time: b serves no lookup any more and is its domain's to let go,
 * with bound_pds_leave_share(). */
void bound_pd_leave(struct bound_pd *b);
/* A share of the MRs of home's client PDs whose clients left (all with all; else as
 * mr_cache_drop_share() budgets, *made counting this share's); a PD whose last MR went is let
 * go as bound_pd_close() does. The windows a client tracked go first, in the same shares: a
 * bound one would keep its MR (rxe refuses the dereg, rxe_mr.c num_mw) and the run its pages
 * are of quarantined; *dropped counts those deallocated (a run quarantined already because of
 * one, its memory's other connection having left first, may go back now). Whether none is
 * left. */
bool bound_pds_leave_share(struct mr_cache *home, bool all, unsigned *made, unsigned *dropped);
/* Whether a client PD's leave waits for a worker that registers in it (its windows go once
 * the worker let go of the provider): the next share need not come at once. */
bool bound_pds_wait_worker(const struct mr_cache *home);
/* Whether any of home's client PDs still leaves. */
bool bound_pds_leaving(const struct mr_cache *home);

static inline int bound_pd_lookup(struct bound_pd *b, uint64_t addr, struct mr_entry *ret,
				  char *why, size_t why_size, struct waiter *waiter)
{
	return mr_cache_lookup(&b->cache, addr, ret, why, why_size, waiter);
}

static inline int bound_pd_lookup_range(struct bound_pd *b, uint64_t addr, uint64_t len,
					struct mr_entry *ret, char *why, size_t why_size,
					struct waiter *waiter)
{
	return mr_cache_lookup_range(&b->cache, addr, len, ret, why, why_size, waiter);
}
