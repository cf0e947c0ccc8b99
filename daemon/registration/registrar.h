/* SPDX-License-Identifier: MIT */
/* A domain's registrar: everything that makes or drops an MR over its memory — the provider
 * context and PD, the FRMR pools every registration goes through, the MR cache, on-demand
 * children and mempools — with the rules they share: when provider work goes to a worker
 * rather than stall the loop (registrar_offload), how much may be pinned
 * (registrar_check_pinned), and how a job on a worker holds the domain
 * (registrar_submit). News goes up to the domain through events alone. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "base/worker-pool.h"
#include "registration/frmr-pool.h"
#include "registration/mempool.h"
#include "registration/mr-cache.h"
#include "registration/odp.h"

struct memory;
struct mr_waiter;
struct provider;
struct provider_pd;
struct reg_allocation;

/* What the registrar tells its domain; data is registrar.data. */
struct registrar_events {
	/* A job on a worker holds the domain open (it counts as no client), until unhold. */
	void (*hold)(void *data);
	/* The last holder may close the domain: nothing of the registrar is touched after. */
	void (*unhold)(void *data);
	/* The last mempool MR over ra went. */
	void (*allocation_idle)(void *data, struct reg_allocation *ra);
	/* The device let go of the retired ra (registrar_retire): its pages may go back. 0: they
	 * did, and the caller answers waiter; -EINPROGRESS: a worker gives them back, and waiter
	 * (if any) hears once they are. */
	int (*released)(void *data, struct reg_allocation *ra, struct mr_waiter *waiter);
	/* Counters changed (pinned bytes, MRs): the status page shows them. */
	void (*changed)(void *data);
};

struct registrar {
	const struct config *config;
	const char *name;     /* its domain's, for messages */
	struct memory *mem;   /* its domain's: where lookups find allocations */
	struct provider *provider;
	struct provider_pd *pd;
	/* The daemon's pool: NULL when there is none, and once it drained at shutdown (then
	 * everything runs on the loop). */
	struct worker_pool *const *workers;
	const bool *stopping; /* the daemon's: set before the workers drain */
	uint64_t *host_pinned; /* what every domain pins, together (limits.pinned_bytes) */
	struct frmr_pools pools; /* every registration goes through them */
	struct mr_cache cache;
	LIST_HEAD(, mr_cache) bound; /* the client PDs' caches over its memory (bound-pd.h) */
	struct odp odp;
	struct mempools mempools;
	unsigned jobs;         /* work on workers that may hold the provider (registrar_busy) */
	unsigned destroy_jobs; /* of those, destroying handles taken out of the pools */
	unsigned dma_jobs;     /* Dma requests queued or running on the Dma thread */
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
	struct registrar_events events;
	void *data;
};

/* With the links above filled in (config, name, mem, workers, stopping, host_pinned, events,
 * data): its own context on device, a PD and the pools, the cache and on-demand children in
 * chunks of the window from window_base. On failure the caller still calls registrar_close. */
int registrar_open(struct registrar *r, struct provider *device, enum mr_policy policy,
		   uint64_t window_base);
/* Everything left goes (no job is: jobs hold the domain). Safe on a zeroed registrar. */
void registrar_close(struct registrar *r);

/* The domain's lookup: the cache's table, then on-demand memory's child (odp_fault), then a
 * mempool MR (the cache's others), then the cache registers (mr_cache_lookup says how). */
int registrar_lookup(struct registrar *r, uint64_t addr, struct mr_entry *ret, char *why,
		     size_t why_size, struct mr_waiter *waiter);

/* Provider work makes MRs, or drops (deregisters, parks, invalidates) them. */
/* Whether a provider op on the loop could wait: a worker's job may hold the provider, or a
 * soft Dma is under way. A drop waits for its copy through the domain's MRs (a dereg, park or
 * invalidate of those waits for it, up to MRD_DMA_MAX bytes); a make waits for its page
 * faults, which hold mrd's mmap_lock for reading, page by page: the new MR's page table (malloc:
 * brk, mmap) waits for it, for as long as the Dma thread is off its CPU with the lock held
 * (bench-lookup's hol-odp-fault row: 12 ms). dma_jobs counts every Dma not yet answered, and
 * only the loop starts one, so at 0 no copy and no fault runs. */
static inline bool registrar_busy(const struct registrar *r)
{
	return r->cache.pending_bytes > 0 || r->jobs > 0 || r->dma_jobs > 0;
}

/* The one offload rule: provider work over bytes goes to a worker, so that the loop serves
 * everyone else, when it is [cache] async_bytes or more, or while the op would wait
 * (registrar_busy). Never without workers, nor once they drain at shutdown (work submitted
 * then would never run, and hold its domain for good). */
static inline bool registrar_offload(const struct registrar *r, uint64_t bytes)
{
	return *r->workers && !__atomic_load_n(r->stopping, __ATOMIC_ACQUIRE) &&
	       (bytes >= r->config->async_bytes || registrar_busy(r));
}

/* The loop's share of the registrations misses make: a request makes at most
 * REGISTRAR_LOOP_PER_REQUEST MRs on the loop, and all requests of a turn of the loop together
 * at most REGISTRAR_LOOP_PER_TURN MRs and async_bytes; past that a worker registers, so that
 * many small misses take no more of the loop than one big one would. */
#define REGISTRAR_LOOP_PER_REQUEST 4
#define REGISTRAR_LOOP_PER_TURN 8

/* Whether a registration of bytes may be made on the loop, for a request that made `made`
 * there already; always without workers (nothing else would make it). */
static inline bool registrar_loop_may(const struct registrar *r, unsigned made, uint64_t bytes)
{
	const struct loop_turn *t;

	if (!*r->workers || __atomic_load_n(r->stopping, __ATOMIC_ACQUIRE))
		return true;
	t = worker_pool_turn(*r->workers);
	return made < REGISTRAR_LOOP_PER_REQUEST && t->ops < REGISTRAR_LOOP_PER_TURN &&
	       t->bytes + bytes < r->config->async_bytes;
}

/* A registration of bytes was made on the loop: it counts in this turn's share. */
static inline void registrar_loop_did(struct registrar *r, uint64_t bytes)
{
	if (*r->workers)
		worker_pool_turn_add(*r->workers, bytes);
}

/* Whether the domain may pin more bytes: -EDQUOT, with the reason in why, when that would
 * pass quota.pinned_bytes or, all domains together, limits.pinned_bytes. Registrations under
 * way are charged already (mr-cache.h). */
int registrar_check_pinned(const struct registrar *r, uint64_t more, char *why, size_t why_size);

/* Work on a worker for the registrar: embed it first in a job. */
struct registrar_work {
	struct work work;
	struct registrar *reg;
	void (*run)(struct registrar_work *w);  /* on a worker */
	void (*done)(struct registrar_work *w); /* on the loop; frees the job */
	bool busy; /* counts in jobs: it may hold the provider */
	/* Whose turn on the workers (worker_pool_submit): the domain's, its memory
	 * (registrar_job), or the job's own for the device's work on the domain's context,
	 * which must not wait behind the domain's queue. */
	const void *key;
};

static inline void registrar_hold(struct registrar *r)
{
	r->events.hold(r->data);
}
/* The domain may close here: the caller touches nothing of r after. */
static inline void registrar_unhold(struct registrar *r)
{
	r->events.unhold(r->data);
}

/* A job from now on: it holds the domain (events.hold) and, when busy, counts in jobs. After
 * done, on the loop, jobs goes down and the hold goes. A job never submitted ends with its
 * own cleanup and registrar_unhold. */
void registrar_job(struct registrar *r, struct registrar_work *w,
		   void (*run)(struct registrar_work *w), void (*done)(struct registrar_work *w),
		   bool busy);
/* To the workers (which must exist), under w->key: the domain's memory, whose punches
 * (memory/allocation.c) take their turns with its registrations. */
void registrar_submit(struct registrar_work *w);
/* Both at once. */
static inline void registrar_start(struct registrar *r, struct registrar_work *w,
				   void (*run)(struct registrar_work *w),
				   void (*done)(struct registrar_work *w), bool busy)
{
	registrar_job(r, w, run, done, busy);
	registrar_submit(w);
}

/* Lets go of pmr: one of the domain's PD goes back through its FRMR pools (and key
 * quarantine), one of a client's own PD is deregistered there. Thread-safe, as both are. */
int registrar_dereg(struct registrar *r, struct provider_mr *pmr);
/* Deregisters pmr (registrar_dereg) on a worker; then, on the loop, gone(r, arg, result) (gone may be NULL). The
 * job counts in jobs until then. -ENOMEM: not submitted. */
int registrar_dereg_on_worker(struct registrar *r, struct provider_mr *pmr,
			      void (*gone)(struct registrar *r, void *arg, int result), void *arg);

/* Destroys handles taken out of the pools: on a worker, since each may be a device command. */
void registrar_destroy_handles(struct registrar *r, struct provider_mr **handles, size_t n);

/* Freeing ra, after memory retired it (no lookup finds it): the generation moves when a key
 * of it may be cached (an MR, a pool MR or a child of it was handed out), its MRs leave the
 * table and its children are zapped; then the device lets go — here, or when the MRs cover
 * [cache] async_bytes or more (or registrar_busy) on a worker, or once prefetch work on it is
 * done — and events.released tells the domain. With a waiter that is not here: -EINPROGRESS. */
int registrar_retire(struct registrar *r, struct reg_allocation *ra, struct mr_waiter *waiter);

/* Work that ra's free waited for ended (prefetches, children, client PDs' MRs on workers):
 * once none is left, the free goes on — its MRs deregistered, its pages back, its waiter
 * answered. Nothing when its free does not wait, or still waits for more. */
void registrar_resume_free(struct registrar *r, struct reg_allocation *ra);

/* The end of a retired allocation's registrations (a worker's deregistration, or the last ODP
 * child gone): its MRs are counted gone, and events.released tells the domain; waiter, which
 * waits already, hears once the pages are back. */
void registrar_release(struct registrar *r, struct reg_allocation *ra, struct mr_waiter *waiter);

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
	r->dma_jobs++;
}
static inline void registrar_dma_end(struct registrar *r)
{
	r->dma_jobs--;
}
