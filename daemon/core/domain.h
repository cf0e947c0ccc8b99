/* SPDX-License-Identifier: MIT */
/* A domain: clients that trust each other (one uid by default; [domains] in mrd.conf groups
 * uids and gids). Each has its own provider context and PD — whoever holds a context can act
 * on every object in it — its own arenas, allocations, quotas and status page. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "registration/frmr-pool.h"
#include "registration/mempool.h"
#include "registration/mr-cache.h"
#include "registration/odp.h"
#include "provider/provider.h"
#include "u64-map.h"

struct arena;
struct client;
struct event;
struct core;
struct manager;
struct mrd_status_page;
struct provider;
struct provider_pd;

/* One run of pages handed to a client (or a client's attached memfd). */
struct allocation {
	struct arena *arena;
	uint64_t offset, length;
	struct client *owner; /* NULL once it left while pool MRs still cover the memory */
	LIST_ENTRY(allocation) owner_link;
	unsigned pool_refs;         /* mempool MRs inside it: it cannot be freed while any are */
	LIST_HEAD(, pool_mr) pool_mrs; /* the live ones of those (not yet being deregistered) */
	bool odp;                   /* registered on demand, by ODP children (daemon/odp.h) */
	bool read_only;             /* its registrations grant reads only */
	LIST_HEAD(, odp_child) odp_children; /* in the domain's table; once retired, its zombies
					      * whose MRs wait for odp_jobs */
	unsigned odp_jobs;          /* prefetch work waiting, queued or running on it, and
				     * its children's MRs going on workers */
	bool retired;               /* being freed: nobody finds it any more */
	bool free_waits;            /* its free waits for odp_jobs and odp_children to go */
	struct mr_waiter *free_waiter;
	LIST_HEAD(, cached_mr) mrs; /* registrations inside it */
	uint64_t serial;            /* tells it from a later allocation at the same address */
	/* Adopted across a warm restart and not yet taken back (domain_claim): on the domain's
	 * orphan list through owner_link, owner NULL. Only the process it belonged to, with the
	 * session it had, takes it back. */
	bool orphan;
	uint64_t claim_session; /* 0: nobody's (kept for others' mempools) */
	pid_t claim_pid;
	uid_t claim_uid;
	uint64_t claim_start_time;
};

/* What the previous mrd knew of an allocation (warm restart, daemon/handover.c). */
struct adopted_allocation {
	uint64_t offset, length, serial;
	bool odp, read_only;
	uint64_t session;
	pid_t pid;
	uid_t uid;
	uint64_t start_time;
};

struct domain {
	struct core *core;
	LIST_ENTRY(domain) link;
	char name[64];
	unsigned n_users; /* clients holding it (quota.clients counts these) */
	unsigned n_job_refs; /* jobs on workers holding it (domain_ref) */

	struct provider *provider;
	struct provider_pd *pd;

	LIST_HEAD(, arena) arenas;
	unsigned n_arenas;
	uint64_t window_bytes; /* of the address window, its arenas' slots (quota.window_bytes) */
	struct u64_map allocations; /* address -> struct allocation */
	uint64_t allocated_bytes;
	struct mr_cache cache;
	uint64_t allocation_serial;
	LIST_HEAD(, pool_reg) pool_regs;
	LIST_HEAD(, pool_mr) pool_mrs;
	unsigned n_pool_regs;
	struct odp odp;
	struct frmr_pools pools;    /* every registration of the domain goes through them */
	struct event *aging_timer;  /* ages the pools, while they are on */
	unsigned destroy_jobs;      /* workers destroying handles taken out of the pools */
	unsigned dma_jobs;          /* Dma requests queued or running on the Dma thread */
	LIST_HEAD(, allocation) orphans; /* adopted, waiting for their owners */
	unsigned n_orphans;
	bool adopted; /* held open (domain_ref) while orphans wait */

	int status_fd; /* memfd; clients map it read-only */
	struct mrd_status_page *status;
};

/* The domain a peer with these credentials belongs to (its name), in buf. */
const char *domain_name_for(const struct manager *m, uid_t uid, gid_t gid, int fd, char *buf,
			    size_t size);
/* The same for an identity known by its supplementary groups (a D-Bus caller's). */
const char *domain_name_for_groups(const struct manager *m, uid_t uid, gid_t gid,
				   const gid_t *groups, size_t n_groups, char *buf, size_t size);

/* The domain named name, opened on first use; the caller holds a reference. Fails with
 * -EDQUOT when it already serves quota.clients clients. */
int domain_acquire(struct core *m, const char *name, struct domain **ret);
/* A domain the previous mrd had open (warm restart): no client yet, held open while its
 * orphans wait (domain_reap_orphans). -EEXIST when it is open already. Its status page, as
 * that of any domain opened later under a name the previous mrd had, starts above the old
 * generation (core.floors): every cached key is refetched. */
int domain_adopt(struct core *m, const char *name, uint64_t allocation_serial,
		 struct domain **ret);
/* Records an allocation of arena (adopted into d) as an orphan. -EINVAL when it is not page
 * runs inside the arena, -EEXIST when it overlaps another. */
int domain_adopt_allocation(struct domain *d, struct arena *arena,
			    const struct adopted_allocation *saved);
/* Hands c the orphans that were its process's under session: how many. */
unsigned domain_claim(struct domain *d, struct client *c, uint64_t session);
/* Lets go of the orphans whose process is gone (all: every orphan): freed, or kept without an
 * owner while mempools of other clients cover them. Once none is left, the hold of
 * domain_adopt goes (the domain closes when nobody else holds it). Returns how many wait on. */
unsigned domain_reap_orphans(struct domain *d, bool all);

/* A job working for the domain holds it open; it counts as no client. */
static inline struct domain *domain_ref(struct domain *d)
{
	d->n_job_refs++;
	return d;
}
/* Drops a job's reference (domain_ref); the last holder closes the domain. Returns NULL. */
struct domain *domain_unref(struct domain *d);
/* Drops a client's reference (domain_acquire); the last holder closes the domain. NULL-safe;
 * returns NULL. */
struct domain *domain_release(struct domain *d);

/* Allocates size bytes aligned to align for owner: an existing arena with room, else a new
 * one. hugepage_only: fail rather than fall back to 4 KiB pages. Quota refusals are -EDQUOT
 * with the reason written to why. */
int domain_alloc(struct domain *d, struct client *owner, uint64_t size, uint64_t align,
		 bool hugepage_only, struct allocation **ret, char *why, size_t why_size);

/* Whether the domain may pin more bytes: -EDQUOT, with the reason in why, when that would
 * pass quota.pinned_bytes or, all domains together, limits.pinned_bytes. */
int domain_check_pinned(struct domain *d, uint64_t more, char *why, size_t why_size);

/* Maps a client's memfd into the window as an allocation of owner (fd consumed on success). */
int domain_attach_external(struct domain *d, struct client *owner, int fd, uint64_t offset,
			   uint64_t length, struct allocation **ret, char *why, size_t why_size);

/* Whether a provider op on the loop could wait: a worker's job may hold the provider, or a
 * soft Dma may be copying through the domain's MRs (a dereg, park or invalidate of those
 * waits for the copy, up to MRD_DMA_MAX bytes). dma_jobs counts every Dma not yet answered,
 * and only the loop starts one, so at 0 no copy runs. */
static inline bool domain_busy(const struct domain *d)
{
	return mr_cache_busy(&d->cache) || d->dma_jobs > 0;
}
/* Whether deregistering bytes of the domain must go to a worker, not stall the loop. */
bool domain_dereg_waits(const struct domain *d, uint64_t bytes);
/* Deregisters pmr on a worker; then, on the loop, gone(d, arg, result) (gone may be NULL).
 * The job counts in the cache's jobs (domain_busy) until then. -ENOMEM: not submitted. */
int domain_dereg_on_worker(struct domain *d, struct provider_mr *pmr,
			   void (*gone)(struct domain *d, void *arg, int result), void *arg);

/* Frees one allocation. At once: no lookup finds it, its keys leave the cache, the generation
 * bumps. Its MRs are deregistered and its pages go back to the kernel right away — or, when
 * the MRs cover [cache] async_bytes or more (or domain_busy()), on a worker: then, with a
 * waiter, -EINPROGRESS and waiter->resume (result 0, no entry) runs on the loop once the
 * pages are back. */
int domain_free_allocation(struct domain *d, struct allocation *a, struct mr_waiter *waiter);
/* Its owner is going: freed, or — while mempool MRs of other clients cover it — kept without
 * an owner until the last of them goes. */
void domain_drop_allocation(struct domain *d, struct allocation *a);

struct allocation *domain_find_allocation(struct domain *d, uint64_t address);
/* The live allocation whose pages hold address, NULL when none does. */
struct allocation *domain_allocation_containing(struct domain *d, uint64_t address);
/* The arena holding address, NULL when it is not this domain's memory. */
struct arena *domain_find_arena(struct domain *d, uint64_t address);

/* Every client of the domain learns of memory (or keys) going away by one load of this. */
void domain_bump_generation(struct domain *d);

/* Refreshes the status page counters (after any change of usage). */
void domain_update_status(struct domain *d);

/* A new read-only descriptor of the status page, for a client. */
int domain_status_fd(const struct domain *d);

/* The address of an allocation, as clients see it. */
uint64_t allocation_address(const struct allocation *a);

/* What its registrations may grant: everything, or reads alone. */
static inline unsigned allocation_access(const struct allocation *a)
{
	return a->read_only ? MRD_ACCESS_REMOTE_READ : MR_CACHE_ACCESS;
}

/* mrctl flush: the MR table rebuilt from the MR list and the generation bumped, so every
 * client's caches start over; with pools the idle parked handles go (above each pool's pinned
 * minimum), with gc all of them and the pools left empty. Returns the handles destroyed. */
size_t domain_flush(struct domain *d, bool pools, bool gc, unsigned *ret_pools_removed);

/* domain_flush of the domain named name (NULL: of every domain); -ENOENT when it is not open. */
struct flush_counts {
	unsigned domains, pools_removed;
	uint64_t handles;
};
int domains_flush(struct core *m, const char *name, bool pools, bool gc,
		  struct flush_counts *ret);

/* frmr_pools_set in the domain named name ("" or NULL: every domain; matching every pool there
 * also sets what domains opened later get). -ENOENT when it is not open, -EINVAL for a bad
 * value; *ret_changed counts the pools. */
int domains_set_pools(struct core *m, const char *name, const struct frmr_match *match,
		      int64_t aging_s, int64_t pinned, unsigned *ret_changed);

/* The last ODP child of a freed allocation went (daemon/odp.c): its pages go back now. */
void domain_finish_free(struct domain *d, struct allocation *a);
