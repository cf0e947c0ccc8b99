/* SPDX-License-Identifier: MIT */
/* What every registration module shares of its domain, and the rules over it: the links the
 * domain fills in, its context, PD and FRMR pools (every registration goes through them), the
 * work on workers; when provider work goes to a worker rather than stall the loop
 * (reg_offload), the loop's share of registrations (reg_loop_may), how much may be pinned
 * (reg_check_pinned), and how a job on a worker holds the domain (reg_job_init). The leaf of
 * registration/: the cache, on-demand children, mempools and client PDs include it and
 * lower; their owner, the registrar (registrar.h), embeds it and includes them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "base/worker-pool.h"
#include "registration/frmr-pool.h"

struct memory;
struct waiter;
struct provider;
struct provider_mr;
struct provider_pd;
struct reg_allocation;
struct reg_base;

/* What the registrar tells its domain; data is reg_base.data. */
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
	int (*released)(void *data, struct reg_allocation *ra, struct waiter *waiter);
	/* Counters changed (pinned bytes, MRs): the status page shows them. */
	void (*changed)(void *data);
};

struct reg_base {
	const struct config *config;
	const struct quota *quota; /* its domain's */
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
	/* The domain's cache's (its owner points them there): its registrations under way on
	 * workers, and the bytes it counts pinned (mr-cache.h: the pools' MRs' too). */
	const uint64_t *pending_bytes, *pinned_bytes;
	unsigned jobs;         /* work on workers that may hold the provider (reg_busy) */
	unsigned destroy_jobs; /* of those, destroying handles taken out of the pools */
	unsigned dma_jobs;     /* Dma requests queued or running on the Dma thread */
	/* Work that ra's free waited for ended (its owner's registrar_resume_free). */
	void (*resume_free)(struct reg_base *b, struct reg_allocation *ra);
	struct registrar_events events;
	void *data;
};

/* Provider work makes MRs, or drops (deregisters, parks, invalidates) them. */
/* Whether a provider op on the loop could wait: a worker's job may hold the provider, or a
 * soft Dma is under way. A drop waits for its copy through the domain's MRs (a dereg, park or
 * invalidate of those waits for it, up to MRD_DMA_MAX bytes); a make waits for its page
 * faults, which hold mrd's mmap_lock for reading, page by page: the new MR's page table (malloc:
 * brk, mmap) waits for it, for as long as the Dma thread is off its CPU with the lock held
 * (bench-lookup's hol-odp-fault row: 12 ms). dma_jobs counts every Dma not yet answered, and
 * only the loop starts one, so at 0 no copy and no fault runs. */
static inline bool reg_busy(const struct reg_base *b)
{
	return *b->pending_bytes > 0 || b->jobs > 0 || b->dma_jobs > 0;
}

/* The one offload rule: provider work over bytes goes to a worker, so that the loop serves
 * everyone else, when it is [cache] async_bytes or more, or while the op would wait
 * (reg_busy). Never without workers, nor once they drain at shutdown (work submitted
 * then would never run, and hold its domain for good). */
static inline bool reg_offload(const struct reg_base *b, uint64_t bytes)
{
	return *b->workers && !__atomic_load_n(b->stopping, __ATOMIC_ACQUIRE) &&
	       (bytes >= b->config->async_bytes || reg_busy(b));
}

/* The loop's share of the registrations misses make: a request makes at most
 * REGISTRAR_LOOP_PER_REQUEST MRs on the loop, and all requests of a turn of the loop together
 * at most REGISTRAR_LOOP_PER_TURN MRs and async_bytes; past that a worker registers, so that
 * many small misses take no more of the loop than one big one would. */
#define REGISTRAR_LOOP_PER_REQUEST 4
#define REGISTRAR_LOOP_PER_TURN 8

/* Whether a registration of bytes may be made on the loop, for a request that made `made`
 * there already; always without workers (nothing else would make it). */
static inline bool reg_loop_may(const struct reg_base *b, unsigned made, uint64_t bytes)
{
	const struct loop_turn *t;

	if (!*b->workers || __atomic_load_n(b->stopping, __ATOMIC_ACQUIRE))
		return true;
	t = worker_pool_turn(*b->workers);
	return made < REGISTRAR_LOOP_PER_REQUEST && t->ops < REGISTRAR_LOOP_PER_TURN &&
	       t->bytes + bytes < b->config->async_bytes;
}

/* A registration of bytes was made on the loop: it counts in this turn's share. */
static inline void reg_loop_did(struct reg_base *b, uint64_t bytes)
{
	if (*b->workers)
		worker_pool_turn_add(*b->workers, bytes);
}

/* Whether the domain may pin more bytes: -EDQUOT, with the reason in why, when that would
 * pass quota.pinned_bytes or, all domains together, limits.pinned_bytes. Registrations under
 * way are charged already (mr-cache.h). */
int reg_check_pinned(const struct reg_base *b, uint64_t more, char *why, size_t why_size);

/* Work on a worker for the registrar: embed it first in a job. */
struct registrar_work {
	struct work work;
	struct reg_base *reg;
	void (*run)(struct registrar_work *w);  /* on a worker */
	void (*done)(struct registrar_work *w); /* on the loop; frees the job */
	bool busy; /* counts in jobs: it may hold the provider */
	/* Whose turn on the workers (worker_pool_submit): the domain's, its memory
	 * (reg_job_init), or the job's own for the device's work on the domain's context,
	 * which must not wait behind the domain's queue. */
	const void *key;
};

static inline void reg_hold(struct reg_base *b)
{
	b->events.hold(b->data);
}
/* The domain may close here: the caller touches nothing of b after. */
static inline void reg_unhold(struct reg_base *b)
{
	b->events.unhold(b->data);
}

/* A job from now on: it holds the domain (events.hold) and, when busy, counts in jobs. After
 * done, on the loop, jobs goes down and the hold goes. A job never submitted ends with its
 * own cleanup and reg_unhold. */
void reg_job_init(struct reg_base *b, struct registrar_work *w,
		  void (*run)(struct registrar_work *w),
		  void (*done)(struct registrar_work *w), bool busy);
/* To the workers (which must exist), under w->key: the domain's memory, whose punches
 * (memory/allocation.c) take their turns with its registrations. */
void registrar_submit(struct registrar_work *w);
/* Both at once. */
static inline void reg_start(struct reg_base *b, struct registrar_work *w,
			     void (*run)(struct registrar_work *w),
			     void (*done)(struct registrar_work *w), bool busy)
{
	reg_job_init(b, w, run, done, busy);
	registrar_submit(w);
}

/* Lets go of pmr: one of the domain's PD goes back through its FRMR pools (and key
 * quarantine), one of a client's own PD is deregistered there. Thread-safe, as both are. */
int reg_dereg(struct reg_base *b, struct provider_mr *pmr);
/* Deregisters pmr (reg_dereg) on a worker; then, on the loop, gone(b, arg, result) (gone may
 * be NULL). The job counts in jobs until then. -ENOMEM: not submitted. */
int reg_dereg_on_worker(struct reg_base *b, struct provider_mr *pmr,
			void (*gone)(struct reg_base *b, void *arg, int result), void *arg);
