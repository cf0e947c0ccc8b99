/* SPDX-License-Identifier: MIT */
/* A domain's global MR cache (DPDK's algorithm, in the daemon): a list of MRs and a sorted
 * table that maps an address to its keys. A miss registers by policy — contig: the whole run
 * of the allocation around the address, minus what other MRs cover; page: the page alone —
 * through the provider ops. An MR never spans two allocations, so freeing an allocation
 * retires exactly its MRs: out of the table first, deregistered after — on a worker when
 * they are big. Mempool MRs count as covered: a lookup inside one gets it, and no MR of the
 * cache overlaps one made before it, nor a run a worker is registering (a lookup inside one
 * waits for it). Pinned bytes are the union of what is registered: a page counts once however
 * many MRs (the cache's, the pools') cover it, from when mrd starts registering it until the
 * device lets go of its last MR over it. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "mr-table.h"
#include "u64-map.h"
#include "base/config.h"
#include "provider/pin-map.h"
#include "registration/waiter.h"

struct provider_mr;
struct provider_pd;
struct reg_allocation;
struct reg_base;


/* Access of every MR the cache makes: whatever a peer may do to a client's buffers. */
#define MR_CACHE_ACCESS \
	(MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ | \
	 MRD_ACCESS_REMOTE_ATOMIC)

/* Something bound to an MR of a cache (a memory window, a mempool MR over it) hears through
 * this, once, when the MR leaves its cache: its allocation freed (mr_cache_retire), its client
 * PD let go of it (mr_cache_drop_share), or the cache closed (mr_cache_done). */
struct mr_gone_listener {
	LIST_ENTRY(mr_gone_listener) link; /* its MR's */
	/* mr: the range and keys it had, which no lookup hands out from here on. */
	void (*gone)(struct mr_gone_listener *l, const struct mr_entry *mr);
};

struct cached_mr {
	struct mr_cache *cache;           /* whose table holds it: its domain's, or a client PD's */
	LIST_ENTRY(cached_mr) link;       /* the cache's */
	LIST_ENTRY(cached_mr) alloc_link; /* its allocation's */
	struct reg_allocation *allocation;
	uint64_t start, end;
	struct provider_mr *pmr;
	uint64_t by_lkey; /* its key in its cache's by_lkey (lkey + 1 when listed), 0: none */
	bool pins; /* charged: all but a client PD's on-demand MR */
	bool range; /* a range lookup's (mr_cache_miss_range): on the range list, in no table */
	bool in_cache; /* in its cache's list and table: not once its client PD let go of it, nor
			* a registration that came too late to serve (mr_cache_drop_share) */
	LIST_HEAD(, mr_gone_listener) listeners; /* told when it leaves its cache */
};

/* A lookup waiting for a mempool MR that a worker is making (struct pool_mr's lookups). */
struct mr_wait {
	struct mr_wait *next;
	struct waiter *waiter;
	uint64_t addr;
};

struct reg_job;

/* mr_cache_find and others' cover: not the cache's, nor refused — look further. */
#define MR_CACHE_MISS 1

/* Registrations beside the domain's cache over the same memory (its registrar's mempool MRs),
 * which the cache knows only through these: it answers a lookup inside one with it, never
 * registers over one, and keeps no MR that one made meanwhile overlaps. */
struct mr_cache_others {
	/* The lookup at addr in a: answered with another's MR (0), waiting for one a worker
	 * makes (-EINPROGRESS; -EAGAIN without a waiter), or MR_CACHE_MISS. */
	int (*cover)(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
		     struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter);
	/* The range of the next live one of a after *cursor (NULL: the first); false: none. */
	bool (*next)(const struct reg_allocation *a, const void **cursor, uint64_t *start,
		     uint64_t *end);
};

/* The domain's own is embedded in its registrar (registration/registrar.h); a client's own
 * PD has one more (registration/bound-pd.h) over the same memory. Each allocation lists the MRs
 * of every cache over it, so its free deregisters them all before its pages go back. */
struct mr_cache {
	struct reg_base *reg; /* whose memory, workers, quotas and pinned pages */
	/* Where pinned pages are counted: the domain's cache, for a client PD's too — the pages
	 * are the same, whichever PD's MR pins them. */
	struct mr_cache *home;
	/* NULL: the domain's PD, through its FRMR pools, with its mempools' MRs and on-demand
	 * children. Else a PD of a client's own context: MRs of this cache alone, registered
	 * whole (no pools), their pinned pages counted in the domain's charges. */
	struct provider_pd *own_pd;
	/* A client PD's cache lives while its MRs and jobs hold it (NULL for the domain's). */
	void (*hold)(struct mr_cache *c);
	void (*unhold)(struct mr_cache *c);
	pid_t pid;    /* a client PD's: its client's process, whose aliased memory it registers */
	bool closing; /* a client PD's whose client left (mr_cache_drop_share): nothing is made */
	const struct mr_cache_others *others; /* the domain's: its registrar's; NULL: none */
	LIST_ENTRY(mr_cache) bound_link; /* a client PD's, on its home's bound list */
	LIST_HEAD(, mr_cache) bound; /* the domain's: the client PDs' caches counting here */
	enum mr_policy policy;
	uint64_t pending_bytes; /* registrations under way on workers */
	LIST_HEAD(, reg_job) reg_jobs; /* those registrations */
	struct pin_map charges; /* the domain's cache's (a client PD's counts there): how many of its MRs, pool MRs and registrations under way
				 * cover each page (counts only: the provider pins); its
				 * pinned_bytes, the pages they cover each once, is the quota's
				 * measure, read on the loop without asking a provider a worker
				 * may hold */
	LIST_HEAD(, cached_mr) mrs;
	/* Range lookups' MRs, which may overlap the table's (MR_CACHE_RANGES_MAX at most). */
	LIST_HEAD(, cached_mr) range_mrs;
	unsigned n_mrs; /* both lists' */
	unsigned n_range_mrs;
	struct mr_table table;
	/* Both lists' MRs by lkey + 1 (a window's grant, a Dma's check of its local key), made
	 * anew when a device's return may have changed keys (rebuild); partial: a put ran out of
	 * memory, and a key it lacks is looked for on the lists. */
	struct u64_map by_lkey;
	bool by_lkey_partial;
	uint64_t lookups, misses, registrations, deregistrations;
	uint64_t loop_registrations; /* of registrations, those made on the loop */
	/* The device failed (registrar_device_lost): the table's keys, and those of an MR a
	 * worker made meanwhile, are the failed device's until its return commits
	 * (registrar_device_back). A lookup that waited is refused then, never answered from the table. */
	bool keys_stale;
};

/* own_pd NULL: the domain's cache over r's memory (home NULL); else a client PD's, counting
 * its pinned pages in home, the domain's. */
int mr_cache_init(struct mr_cache *c, struct reg_base *r, struct mr_cache *home,
		  struct provider_pd *own_pd, enum mr_policy policy);
/* The bytes c's MRs cover, each MR whole (the views': a walk). */
uint64_t mr_cache_bytes(const struct mr_cache *c);
/* Deregisters every MR (the domain's cache, at close). */
void mr_cache_done(struct mr_cache *c);
/* A client PD's cache, when its client goes: it serves no lookup from here on. */
void mr_cache_close(struct mr_cache *c);
/* Then (closed) a share of its MRs (all with all; else while the loop's budget allows,
 * reg_loop_may, *made counting what this share made already, at least one) leaves its
 * allocation, deregistered here or (big, or while the PD is busy) on a worker, uncharged once
 * the device let go. Registrations under way are dropped when they end. Whether none is
 * left. */
bool mr_cache_drop_share(struct mr_cache *c, bool all, unsigned *made);

/* How many of a's MRs are out of every table: kept by their device (a memory window bound
 * to them) or on a worker's way out. */
unsigned mr_cache_out_of_tables(const struct reg_allocation *a);
/* a's span [start, end) goes (allocation_drop_span), its MRs out of every cache with it and
 * deregistered: here (0), or — big, or while a worker holds their PD, as a free's — on a
 * worker (-EINPROGRESS: waiter hears once they are gone; a's free waits for it). -EBUSY (why
 * says why), the span and its other MRs gone all the same: the device kept one (it stays
 * pinned on a until its free), or one was out of the tables before (its PD went: on a
 * worker's way out, or kept). A registration of the span under way is let go when it ends. */
int mr_cache_drop_span(struct reg_allocation *a, uint64_t start, uint64_t end, char *why,
		       size_t why_size, struct waiter *waiter);

/* The keys for addr, registering on a miss — unless another's MR (c->others) holds addr: then
 * that MR's (one a worker is still making is waited for, as is a run of the cache's a worker is
 * registering around addr). -ENOENT (why says so) when addr is not in a
 * live allocation of the domain; -EDQUOT when registering would pass quota.pinned_bytes.
 * With a waiter, a registration of [cache] async_bytes or more — or any, while a registration
 * or deregistration of the domain's is under way, since it would wait for the provider — runs
 * on a worker thread:
 * -EINPROGRESS, and waiter->resume says how it went, later, on the loop. Without a waiter,
 * an address inside an MR or run being made is -EAGAIN. The domain's lookup is
 * registrar_lookup (on-demand memory's children first); a client PD's is this. */
int mr_cache_lookup(struct mr_cache *c, uint64_t addr, struct mr_entry *ret, char *why,
		    size_t why_size, struct waiter *waiter);
/* Its two halves. The table: 0 with ret, -errno refused (closing, the device failed, an alias
 * another PD may not register), or MR_CACHE_MISS with *a the allocation holding addr (NULL:
 * none). */
int mr_cache_find(struct mr_cache *c, uint64_t addr, struct mr_entry *ret, char *why,
		  size_t why_size, struct reg_allocation **a);
/* Then the miss, counted: another's MR, or a registration. */
int mr_cache_miss(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
		  struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter);
/* A lookup at addr waits on *lookups for an MR a worker makes (-EINPROGRESS; its resume
 * comes through mr_cache_resume_waits); without a waiter, -EAGAIN and why says what. */
int mr_cache_wait(struct mr_wait **lookups, uint64_t addr, struct waiter *waiter,
		  const char *what, char *why, size_t why_size);

/* A range lookup: one MR covering [addr, addr + len), len >= 1. mr_cache_find_range first
 * (the table's MR at addr, or a range MR, when it covers the whole range; MR_CACHE_MISS with
 * *a as mr_cache_find), then mr_cache_miss_range: -ERANGE (why says why) when the range
 * leaves a's memory (or a program's registered span), or crosses another's MR (a mempool's);
 * another's MR covering it; else, under a policy other than page where nothing holds addr, the
 * policy's registration when it covers the range; else an MR of the page-rounded range of its
 * own, beside the table (it may overlap the table's MRs: the pages count once as pinned),
 * kept until a's free — on a worker as mr_cache_lookup's (-EINPROGRESS; the waiter's entry
 * may cover less when a wait for another's MR or the policy's run ended: ask again).
 * At most MR_CACHE_RANGES_MAX per cache: -ENOSPC past it. */
#define MR_CACHE_RANGES_MAX 1024
int mr_cache_find_range(struct mr_cache *c, uint64_t addr, uint64_t len, struct mr_entry *ret,
			char *why, size_t why_size, struct reg_allocation **a);
int mr_cache_miss_range(struct mr_cache *c, struct reg_allocation *a, uint64_t addr,
			uint64_t len, struct mr_entry *ret, char *why, size_t why_size,
			struct waiter *waiter);
int mr_cache_lookup_range(struct mr_cache *c, uint64_t addr, uint64_t len, struct mr_entry *ret,
			  char *why, size_t why_size, struct waiter *waiter);
/* Whether e covers [addr, addr + len). */
static inline bool mr_entry_covers(const struct mr_entry *e, uint64_t addr, uint64_t len)
{
	return e->start <= addr && len <= e->end - addr && addr < e->end;
}

/* Hangs l (zeroed, or hung: it leaves that MR) on the MR of c's table holding addr: -ENOENT
 * when there is none (another's MR, an on-demand child, an address nothing registered yet). */
int mr_cache_listen_gone(struct mr_cache *c, uint64_t addr, struct mr_gone_listener *l);
/* mr_cache_listen_gone on the MR of c (its table's or a range lookup's) whose keys and range
 * e has (a lookup's answer), that MR in *ret: -ENOENT when it is none of c's (another's MR, an
 * on-demand child). */
int mr_cache_listen_entry(struct mr_cache *c, const struct mr_entry *e, struct mr_gone_listener *l,
			  struct cached_mr **ret);
/* The MR of c's lists whose lkey is lkey, NULL when none. */
struct cached_mr *mr_cache_by_lkey(const struct mr_cache *c, uint32_t lkey);
/* l (hung, or zeroed) no longer hears: before its MR went; after, it is off already. */
void mr_cache_unlisten_gone(struct mr_gone_listener *l);

/* Counts [start, end) as pinned by one more registration (pages already counted stay counted
 * once), in the domain's charges and the host-wide sum; -ENOMEM. Uncharging a range charged so needs no memory. */
int mr_cache_charge(struct mr_cache *c, uint64_t start, uint64_t end);
void mr_cache_uncharge(struct mr_cache *c, uint64_t start, uint64_t end);
/* The bytes of [start, end) that charging would add: the pages no registration covers. */
uint64_t mr_cache_uncharged(const struct mr_cache *c, uint64_t start, uint64_t end);

/* On the loop, once the MR they waited for (a pool's, or a run a worker registered) is made,
 * or has failed and gone: each lookup
 * runs again (answered now, or later again through its waiter). Frees the list. */
void mr_cache_resume_waits(struct mr_cache *c, struct mr_wait *waits);

/* Freeing an allocation takes three steps. Retire, on the loop: its MRs leave the table, so
 * no key for its memory is handed out from here on; returns the bytes they cover, which stay
 * counted as pinned. Deregister, on the loop or on a worker (it touches only those MRs and the
 * provider, which locks itself): the device lets go of the pages. Release, on the loop: the
 * MRs are counted gone and freed. */
uint64_t mr_cache_retire(struct mr_cache *c, struct reg_allocation *a);
/* Rebuilds the table from the MR list (clearing an overflow when it fits); on-demand children
 * come back at their next miss. */
void mr_cache_flush(struct mr_cache *c);
/* An MR whose dereg fails stays in a->mrs with its handle, charged (the device still pins
 * its pages), and a->dereg_error says why; deregister again tries only those. */
void mr_cache_deregister(const struct mr_cache *c, struct reg_allocation *a);
void mr_cache_release(struct mr_cache *c, struct reg_allocation *a);
/* At close: forgets the MRs the device kept of a (their handles go with the context). */
void mr_cache_drop_kept(struct mr_cache *c, struct reg_allocation *a);
