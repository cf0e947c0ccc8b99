/* SPDX-License-Identifier: MIT */
/* A domain's registrar: the owner of everything that makes or drops an MR over its memory —
 * the MR cache, on-demand children, mempools and the client PDs' caches — which opens and
 * closes them, answers the domain's lookups in order (registrar_lookup) and takes a freed
 * allocation through retire, release and quarantine. What they all share, and the rules they
 * follow (offload, busy, the loop's share, the pinned check, jobs), is its base, the leaf
 * below them (reg-base.h); news goes up to the domain through events alone.
 *
 * Who includes and calls whom in registration/ (arrows point down only; the registrar also
 * calls its base directly):
 *
 *     bound-pd          registrar (owner) --+
 *        |           /        |             |
 *        |          v         |             v
 *        |      mempool       |            odp
 *        |       |     \      |             |
 *        |       |      v     v             |
 *        +-------|----> mr-cache            |
 *                |          |               |
 *                v          v               v
 *     reg-base: rules and shared state (offload, busy, loop share, pinned check, jobs)
 *        |
 *        v
 *     frmr-pool --> key-quarantine
 *
 *   mw-grants (memory windows) sits beside mempool: registrar -> mw-grants -> mr-cache.
 *   Headers every module may include: reg-allocation.h -> mr-cache.h -> waiter.h; reg-owner.h.
 *   Up only through pointers the owner sets: the cache's others (mempool MRs), the base's
 *   resume_free (a freed allocation's work ended), and the events to the domain. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registration/mempool.h"
#include "registration/mr-cache.h"
#include "registration/mw-grants.h"
#include "registration/odp.h"
#include "registration/reg-base.h"

struct memory;
struct provider;
struct provider_pd;
struct reg_allocation;
struct waiter;

struct registrar {
	/* Its links, context, PD and pools, jobs and events, which its parts share. */
	struct reg_base base;
	struct mr_cache cache;
	struct odp odp;
	struct mempools mempools;
	struct mw_grants windows; /* memory windows granted (mrd_window_grant) */
	/* Freed runs the device may still reach: a dereg of an MR or on-demand child over them
	 * failed, so the device keeps a live MR there (keys working, pages pinned). They are
	 * neither punched (the NIC would DMA into pages the memfd no longer has) nor given back
	 * (it would DMA into the next owner's memory); their memory counts as allocated, their
	 * kept MRs as pinned. The deregs are tried again at each flush and at close. */
	struct {
		LIST_HEAD(, reg_allocation) runs;
		unsigned n;
		uint64_t bytes;
	} quarantine;
};

/* With the links of its base filled in (config, name, mem, workers, stopping, host_pinned,
 * events, data): its own context on device, a PD and the pools, the cache and on-demand children in
 * chunks of the window from window_base. On failure the caller still calls registrar_close. */
int registrar_open(struct registrar *r, struct provider *device, enum mr_policy policy,
		   uint64_t window_base);
/* Everything left goes (no job is: jobs hold the domain). Safe on a zeroed registrar. */
void registrar_close(struct registrar *r);

/* The domain's lookup: the cache's table, then on-demand memory's child (odp_fault), then a
 * mempool MR (the cache's others), then the cache registers (mr_cache_lookup says how). */
int registrar_lookup(struct registrar *r, uint64_t addr, struct mr_entry *ret, char *why,
		     size_t why_size, struct waiter *waiter);
/* registrar_lookup of the range [addr, addr + len): one MR covering it whole
 * (mr_cache_lookup_range), an on-demand child when one covers it. */
int registrar_lookup_range(struct registrar *r, uint64_t addr, uint64_t len, struct mr_entry *ret,
			   char *why, size_t why_size, struct waiter *waiter);

/* The base's rules (reg-base.h), for the domain. */
static inline bool registrar_busy(const struct registrar *r)
{
	return reg_busy(&r->base);
}
static inline bool registrar_offload(const struct registrar *r, uint64_t bytes)
{
	return reg_offload(&r->base, bytes);
}
static inline bool registrar_loop_may(const struct registrar *r, unsigned made, uint64_t bytes)
{
	return reg_loop_may(&r->base, made, bytes);
}
static inline void registrar_loop_did(struct registrar *r, uint64_t bytes)
{
	reg_loop_did(&r->base, bytes);
}
static inline void registrar_job(struct registrar *r, struct registrar_work *w,
				 void (*run)(struct registrar_work *w),
				 void (*done)(struct registrar_work *w), bool busy)
{
	reg_job_init(&r->base, w, run, done, busy);
}
static inline void registrar_start(struct registrar *r, struct registrar_work *w,
				   void (*run)(struct registrar_work *w),
				   void (*done)(struct registrar_work *w), bool busy)
{
	reg_start(&r->base, w, run, done, busy);
}

/* Destroys handles taken out of the pools: on a worker, since each may be a device command. */
void registrar_destroy_handles(struct registrar *r, struct provider_mr **handles, size_t n);

/* Freeing ra, after memory retired it (no lookup finds it): the generation moves when a key
 * of it may be cached (an MR, a pool MR or a child of it was handed out), its MRs leave the
 * table and its children are zapped; then the device lets go — here, or when the MRs cover
 * [cache] async_bytes or more (or registrar_busy) on a worker, or once prefetch work on it is
 * done — and events.released tells the domain. With a waiter that is not here: -EINPROGRESS. */
int registrar_retire(struct registrar *r, struct reg_allocation *ra, struct waiter *waiter);

/* Work that ra's free waited for ended (prefetches, children, client PDs' MRs on workers):
 * once none is left, the free goes on — its MRs deregistered, its pages back, its waiter
 * answered. Nothing when its free does not wait, or still waits for more. */
void registrar_resume_free(struct registrar *r, struct reg_allocation *ra);

/* The end of a retired allocation's registrations (a worker's deregistration, or the last ODP
 * child gone): its MRs are counted gone, and events.released tells the domain; waiter, which
 * waits already, hears once the pages are back. */
void registrar_release(struct registrar *r, struct reg_allocation *ra, struct waiter *waiter);

/* Tries the failed deregs over each quarantined run again, unless a worker's job may hold a
 * provider (registrar_busy: then at the next try); a run the device let go of goes back
 * (events.released). How many did. */
unsigned registrar_retry_quarantine(struct registrar *r);

/* The device named device failed: every op of the domain's context fails fast from now on,
 * the cache's keys are of the failed device until registrar_device_back (a lookup that waited
 * is refused, never answered from the table), and the client PDs' caches on it answer no key
 * from now on (their contexts died with it; their clients bind new ones). */
void registrar_device_lost(struct registrar *r, const char *device);
/* Its context is made again on the returned device: the table's old keys go. */
void registrar_device_back(struct registrar *r);

/* Whether memory asked to be registered on demand (read-only or not) is: the device's RC
 * on-demand paging must cover every operation its access allows (provider_odp_covers), else
 * it is pinned. */
bool registrar_on_demand(const struct registrar *r, bool asked, bool read_only);

/* A Dma request of the domain's starts, or is answered (registrar_busy counts them). */
static inline void registrar_dma_start(struct registrar *r)
{
	r->base.dma_jobs++;
}
static inline void registrar_dma_end(struct registrar *r)
{
	r->base.dma_jobs--;
}
