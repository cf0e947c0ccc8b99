/* SPDX-License-Identifier: MIT */
/* A domain: clients that trust each other (one uid by default; [domains] in mrd.conf groups
 * uids and gids). Each has its own memory (arenas, allocations, quotas, status page) and its
 * own registrar (provider context and PD — whoever holds a context can act on every object in
 * it — pools, MR cache, on-demand children, mempools). The domain decides what happens to its
 * memory: it opens and closes, hands allocations out and frees them, and keeps what a previous
 * mrd left until its owners come back. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "memory/allocation.h"
#include "memory/memory.h"
#include "registration/reg-allocation.h"
#include "registration/reg-owner.h"
#include "registration/registrar.h"

struct arena;
struct bound_pd;
struct core;
struct event;
struct mr_entry;
struct served_device;

/* A process that got the domain's device context (ExportPd): while it holds the descriptor,
 * the context outlives mrd (control/old-context.h). */
struct context_holder {
	pid_t pid;
	uid_t uid;
	uint64_t start_time; /* 0: unknown */
	uint64_t session;
};

struct domain {
	struct core *core;
	LIST_ENTRY(domain) link;
	char name[64];
	unsigned n_users; /* clients holding it (quota.clients counts these) */
	struct quota quota; /* its own (config_quota_for), read by mem and reg */
	unsigned n_job_refs; /* jobs on workers holding it (domain_ref) */
	struct memory mem;
	struct registrar reg;
	struct event *aging_timer;  /* ages the pools, while they are on */
	struct event *device_event; /* its context's async fd (core/device.h) */
	bool adopted; /* held open (domain_ref) while orphans (mem.orphans) wait */
	/* What clients that left still own (mempools, allocations; their own PDs stay in
	 * reg.cache.bound, marked leaving), freed a few MRs and allocations per turn of the loop
	 * (domain_leave); while there is any it holds the domain open (domain_ref). */
	struct reg_owner leaving;
	struct event *leave_event; /* the next turn's share of leaving */
	/* A leaving client's windows went: runs quarantined under them (its process's other
	 * connection freed them first) go back once its PD is done and no worker holds on. */
	bool retry_quarantine;
	struct context_holder *exported_to; /* each process once (domain_note_export) */
	size_t n_exported_to;
	size_t exported_check_at; /* the next look for gone holders, at this many */
};

/* Running processes a domain's device context is recorded as exported to, at most. */
#define DOMAIN_HOLDERS_MAX 4096

/* h got the domain's device context: a hand-over names it (control/handover.c). Forgets
 * holders whose process is gone; -EUSERS when DOMAIN_HOLDERS_MAX running ones hold it. */
int domain_note_export(struct domain *d, const struct context_holder *h);
/* ExportPd: a descriptor of d's device context (its command fd) and its PD's handle, for
 * holder, who is recorded for the hand-over (domain_note_export). -EOPNOTSUPP when the
 * provider has no device to share, -EUSERS as domain_note_export; why says so. */
int domain_export_pd(struct domain *d, const struct context_holder *holder, int *ret_fd,
		     uint32_t *ret_handle, char *why, size_t why_size);
/* BindPd: mrd registers d's memory into PD pd_handle of the client's device context fd (a
 * uverbs fd; mrd keeps a copy of its own, fd stays the caller's), for the client's process
 * pid. The device must be one mrd serves: -EXDEV otherwise, -EOPNOTSUPP when mrd is on no
 * RDMA device; the context's checks fail as client_context_open's and
 * client_context_check_pd's (-EINVAL for a PD it does not have). On success the device
 * counts the binding until served_device_unbind. */
int domain_bind_pd(struct domain *d, int fd, uint32_t pd_handle, pid_t pid,
		   struct bound_pd **ret, struct served_device **ret_device, char *why,
		   size_t why_size);

/* The device came back (core/device.c): the domain's context and PD are new ones. Nobody
 * holds the new context yet; clients that imported the old PD see the status page's pd_epoch
 * move and must import again. */
void domain_pd_replaced(struct domain *d);

/* The domain named name, opened on first use; the caller holds a reference. Fails with
 * -EDQUOT, why saying so, when it already serves quota.clients clients. */
int domain_acquire(struct core *core, const char *name, struct domain **ret, char *why,
		   size_t why_size);
/* A domain the previous mrd had open (warm restart): no client yet, held open while its
 * orphans wait (domain_reap_orphans). -EEXIST when it is open already. Its status page, as
 * that of any domain opened later under a name the previous mrd had, starts above the old
 * generation (core.floors): every cached key is refetched. Allocation serials go on above
 * allocation_serial, and the page's count of frees from frees. */
int domain_adopt(struct core *core, const char *name, uint64_t allocation_serial,
		 uint64_t frees, struct domain **ret);
/* Records an allocation of arena (adopted into d) as an orphan. -EINVAL when it is not page
 * runs inside the arena, -EEXIST when it overlaps another. */
int domain_adopt_allocation(struct domain *d, struct arena *arena,
			    const struct adopted_allocation *saved);
/* Hands owner the orphans that were its process's under session: how many. */
static inline unsigned domain_claim(struct domain *d, struct reg_owner *owner, uint64_t session)
{
	return allocation_claim(&d->mem, &owner->mem, session);
}
/* Lets go of the orphans whose process is gone (all: every orphan): freed, or kept without an
 * owner while mempools of other clients cover them. Once none is left, the hold of
 * domain_adopt goes (the domain closes when nobody else holds it). Returns how many wait on. */
unsigned domain_reap_orphans(struct domain *d, bool all);

/* Each open domain takes its quotas from the configuration again (after a reload). Usage
 * above a lowered quota stays; what would add to it is refused. */
void domains_resolve_quotas(struct core *core);

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
 * one. hugepage_only: fail rather than fall back to 4 KiB pages. odp: registered on demand
 * where the device pages on demand over RC (and always so under the odp policy); read_only:
 * its registrations grant reads alone. Quota refusals are -EDQUOT with the reason in why. */
int domain_alloc(struct domain *d, struct reg_owner *owner, uint64_t size, uint64_t align,
		 enum page_pick pick, bool odp, bool read_only, struct allocation **ret, char *why,
		 size_t why_size);

/* Maps a client's memfd into the window as an allocation of owner (fd consumed on success). */
int domain_attach_external(struct domain *d, struct reg_owner *owner, int fd, uint64_t offset,
			   uint64_t length, struct allocation **ret, char *why, size_t why_size);

/* Frees one allocation. At once: no lookup finds it, its keys leave the cache, the generation
 * bumps when it had any (a free of memory never registered empties no client's cache). Its MRs are
 * deregistered and its pages go back to the kernel right away — or, when the MRs cover [cache]
 * async_bytes or more (or the registrar is busy), on a worker, and with a waiter a run of
 * async_bytes or more is punched on a worker too: then, with a waiter, -EINPROGRESS and
 * waiter->resume (result 0, no entry) runs on the loop once the pages are back. */
int domain_free_allocation(struct domain *d, struct allocation *a, struct waiter *waiter);
/* Its owner is going: freed, or — while mempool MRs of other clients cover it — kept without
 * an owner until the last of them goes. */
void domain_drop_allocation(struct domain *d, struct allocation *a);
/* owner is going: its prefetches answer nobody, the MRs of its own PD (bound, when not NULL:
 * it is the domain's now, and its context closes after its last MR) go, so do its mempools,
 * and its memory (but what other clients' mempools still cover). They go in shares
 * of the loop's registration budget (registrar_loop_may: a request's share now, then one share
 * each turn of the loop after, at least one MR or allocation each), so that a client leaving
 * with thousands of MRs holds nobody else up; meanwhile they are still there (quotas count
 * them), nobody's to free or unregister, and their keys work. At shutdown (no workers) all of
 * it goes at once. */
void domain_leave(struct domain *d, struct reg_owner *owner, struct bound_pd *bound);
/* What clients that left still own goes now, in every domain (may close them): before a
 * hand-over saves the domains, and at shutdown. Every window granted goes too (its clients'
 * rkeys are dead; their revokes are -ENOENT). */
void domains_finish_leaving(struct core *core);

static inline struct allocation *domain_find_allocation(struct domain *d, uint64_t address)
{
	return allocation_find(&d->mem, address);
}
/* The live allocation whose pages hold address, NULL when none does. */
static inline struct allocation *domain_allocation_containing(struct domain *d, uint64_t address)
{
	return allocation_containing(&d->mem, address);
}
/* The arena holding address, NULL when it is not this domain's memory. */
static inline struct arena *domain_find_arena(struct domain *d, uint64_t address)
{
	return memory_find_arena(&d->mem, address);
}

/* Every client of the domain learns of memory (or keys) going away by one load of this. */
static inline void domain_bump_generation(struct domain *d)
{
	status_page_bump(&d->mem.status);
}

/* What domain_bump_generation moves: every key a client cached before it may be dead. */
static inline uint64_t domain_generation(const struct domain *d)
{
	return status_page_generation(&d->mem.status);
}

/* The domain's own context on the device (its name and caps, for what a client is told). */
static inline const struct provider *domain_provider(const struct domain *d)
{
	return d->reg.base.provider;
}

/* The keys of the MR over address: in bound's PD (a connection's own, BindPd) when not NULL,
 * else in the domain's; registered on a miss, as registrar_lookup (waiter, -EINPROGRESS).
 * A program's buffer moved onto mrd's memory (an alias: mrd_mem_adopt, libmrd-preload.so)
 * gets keys for asker, the process that moved it, alone: they use its addresses. */
int domain_lookup(struct domain *d, struct bound_pd *bound, pid_t asker, uint64_t address,
		  struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter);
/* domain_lookup of [address, address + length): one MR covering it whole (-ERANGE when the
 * range leaves its allocation; registrar_lookup_range). */
int domain_lookup_range(struct domain *d, struct bound_pd *bound, pid_t asker, uint64_t address,
			uint64_t length, struct mr_entry *ret, char *why, size_t why_size,
			struct waiter *waiter);
/* domain_lookup of a's start, made now on the loop without waiting: -EAGAIN when that could
 * stall the loop (the run goes to a worker, or the provider is busy: a lookup does it later). */
int domain_register_now(struct domain *d, struct bound_pd *bound, const struct allocation *a,
			struct mr_entry *ret, char *why, size_t why_size);

/* Dma requests of the domain queued or running on the Dma thread. */
static inline unsigned domain_dma_jobs(const struct domain *d)
{
	return d->reg.base.dma_jobs;
}
/* One transfer through keys of the domain's PD (provider_dma), on the Dma thread. */
int domain_dma(struct domain *d, enum provider_dma_op op, uint32_t lkey, uint64_t laddr,
	       uint32_t rkey, uint64_t raddr, uint64_t length);

/* Whether asker may use lkey as a Dma's local key: -EACCES (why says so) where it is an MR of
 * a buffer another process adopted (mrd_mem_adopt: private to it, as check_asker keeps its
 * keys). Checked when the Dma is asked for; a key freed and handed to such an MR before the
 * Dma runs is not caught (mrd_dma(3)). */
int domain_dma_check(struct domain *d, pid_t asker, uint32_t lkey, char *why, size_t why_size);

/* Memory windows (the domain-PD model, registration/mw-grants.h). A window over [address,
 * address + length) of an allocation owner's process owns (-EACCES otherwise, -ENOENT when no
 * allocation holds address), pinned memory alone, bound over the domain's MR covering it
 * (registered on a miss as domain_lookup_range: -EINPROGRESS, waiter resumed once the MR is
 * made; then ask again), with access (MRD_ACCESS_MW_GRANTS bits); its rkey. -EOPNOTSUPP where
 * the device has none (caps.no_mw); -EINPROGRESS with wait when a worker binds it (the
 * provider may be held by one): wait hears the rkey. The window dies when its memory is freed,
 * before its MR and pages go. */
int domain_window_grant(struct domain *d, const struct mem_owner *owner, uint64_t address,
			uint64_t length, unsigned access, uint32_t *ret_rkey, char *why,
			size_t why_size, struct waiter *waiter, struct mw_wait *wait);
/* The client-PD model: after domain_window_grant's checks (with the device of bound's
 * context), the MR of bound's PD covering [address, address + length) (waiting as
 * domain_lookup_range does) and the allocation holding it, [*ret_alloc_start,
 * *ret_alloc_end): the client binds a window over it itself (a client PD registers no
 * read-only memory: -EOPNOTSUPP, as its lookups). */
int domain_window_mr(struct domain *d, struct bound_pd *bound, const struct mem_owner *owner,
		     uint64_t address, uint64_t length, struct mr_entry *ret,
		     uint64_t *ret_alloc_start, uint64_t *ret_alloc_end, char *why, size_t why_size,
		     struct waiter *waiter);
/* Invalidates owner's window of rkey: -ENOENT when owner has none bound; -EINPROGRESS when a
 * worker does it (wait hears). */
int domain_window_revoke(struct domain *d, const struct mem_owner *owner, uint32_t rkey,
			 char *why, size_t why_size, struct mw_wait *wait);
/* owner goes: its windows are revoked. */
static inline void domain_windows_drop_owner(struct domain *d, const struct mem_owner *owner)
{
	(void)mw_grants_drop_owner(&d->reg.windows, owner);
}

/* Refreshes the status page counters (after any change of usage). */
void domain_update_status(struct domain *d);

/* A new read-only descriptor of the status page, for a client. */
static inline int domain_status_fd(const struct domain *d)
{
	return status_page_fd(&d->mem.status);
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
int domains_flush(struct core *core, const char *name, bool pools, bool gc,
		  struct flush_counts *ret);

/* frmr_pools_set in the domain named name ("" or NULL: every domain; matching every pool there
 * also sets what domains opened later get). -ENOENT when it is not open, -EINVAL for a bad
 * value; *ret_changed counts the pools. */
int domains_set_pools(struct core *core, const char *name, const struct frmr_match *match,
		      int64_t aging_s, int64_t pinned, unsigned *ret_changed);
