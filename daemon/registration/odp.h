/* SPDX-License-Identifier: MIT */
/* ODP-style lazy registration: the kernel's implicit-ODP design (seed 002), in the daemon. A
 * domain's on-demand memory is registered in children: on-demand MRs over fixed chunks of the
 * window (cache.odp_chunk, at most the device's largest MR), each cut to one allocation — mrd's
 * address space holds every domain's memory, so a child must never reach past its own. Each
 * allocation keeps its children in slots of its own, one per chunk it touches, and lookups
 * find them there (never in the domain's table, whose inserts cost more the more entries it
 * has), so finding or making one costs the same however many allocations share the chunk. A
 * fault (a lookup that finds no child, or a prefetch on a worker) makes the missing one and
 * installs it with a compare-and-exchange (the loser frees its own); the loop links it. Work on
 * a worker counts on its allocation and reads that allocation's slots alone, never another's.
 * Freeing memory zaps its children: they become zombies. A zombie's MR is deregistered once no
 * work on its allocation remains (while reg_busy() — a soft Dma may copy through it — not
 * zapped, and deregistered on a worker, which counts as work on the allocation), and the Free
 * answers then (no key of the memory works and no work touches its pages after they went
 * back); its memory goes with its MR, since no work can reach it then.
 * Only the loop links, zombifies or destroys children. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

struct mr_entry;
struct waiter;
struct provider_mr;
struct reg_allocation;
struct reg_base;
struct reg_owner;

struct odp_child {
	struct odp *odp;
	uint64_t start, end;        /* its chunk cut to its allocation */
	struct reg_allocation *allocation; /* its allocation: set at birth, never read by workers */
	struct provider_mr *pmr;
	LIST_ENTRY(odp_child) link; /* loop: its allocation's children (zombies once it retired) */
	LIST_ENTRY(odp_child) all;  /* loop: the domain's, while on its allocation's list */
	bool linked;                /* loop: live, on its allocation's list */
	bool zombie;                /* loop: its allocation retired; it waits for its work */
};

/* An allocation's slots: one per chunk it touches, NULL or its child there (atomic: workers of
 * its own work install). Made on the loop before any work on it; freed with the allocation. */
struct odp_slots {
	size_t n;
	struct odp_child *child[];
};

struct odp_stats {
	uint64_t faults, children_created, children_destroyed, prefetch_requests, prefetch_pages,
		invalidations;
};

struct odp {
	struct reg_base *reg;   /* its registrar's */
	uint64_t base;          /* the window's */
	unsigned chunk_shift;
	TAILQ_HEAD(, prefetch_job) waiting;  /* flushes waiting for room, oldest first */
	LIST_HEAD(, odp_child) all;          /* every child on an allocation's list */
	unsigned jobs;          /* prefetch work queued or running */
	unsigned children;      /* live */
	unsigned zombies;       /* of retired allocations, waiting for work on them */
	struct odp_stats stats;
};

/* Prefetch work a client may have queued at once, and a domain (its clients' that left
 * included); chunks one prefetch may span. */
#define ODP_PREFETCH_IN_FLIGHT 16
#define ODP_DOMAIN_JOBS_MAX 256
#define ODP_PREFETCH_CHUNKS_MAX 4096

enum odp_advice { ODP_PREFETCH, ODP_PREFETCH_WRITE, ODP_PREFETCH_NO_FAULT };

/* Chunks of the window from window_base, for r's memory. */
int odp_init(struct odp *o, struct reg_base *r, uint64_t window_base);
/* At domain teardown: no work is left (jobs hold the domain); destroys what remains. */
void odp_done(struct odp *o);
/* a goes: its slots with it (no work on it remains). */
void odp_forget_allocation(struct reg_allocation *a);
/* The children the device kept of the retired a (their dereg failed), tried again: whether
 * none is left. */
bool odp_retry_stuck(struct odp *o, struct reg_allocation *a);
/* At close: forgets them (their handles go with the context). */
void odp_drop_stuck(struct reg_allocation *a);

/* A lookup at addr in on-demand allocation a: its child, made when missing (a fault) — with a
 * waiter, while the provider is busy (reg_offload), on a worker: then -EINPROGRESS, and
 * the waiter hears once it is made. */
int odp_fault(struct odp *o, struct reg_allocation *a, uint64_t addr, struct mr_entry *ret,
	      char *why, size_t why_size, struct waiter *waiter);

/* Queues prefetch advice over [addr, addr + length), which lies in a. With a waiter (a flush)
 * it answers through it once done (-EINPROGRESS); without, 0 once queued. owner's queued work is
 * bounded by ODP_PREFETCH_IN_FLIGHT, the domain's by ODP_DOMAIN_JOBS_MAX: past either, a flush
 * waits for room (its client, paused, has no other), anything else is -EAGAIN. */
int odp_prefetch(struct odp *o, struct reg_owner *owner, struct reg_allocation *a,
		 uint64_t addr, uint64_t length, enum odp_advice advice, struct waiter *waiter,
		 char *why, size_t why_size);

/* a is being freed: its children are zapped. Returns
 * nonzero when prefetch work on a remains (its children's MRs wait for it): then
 * its registrar's free goes on once that is over. */
unsigned odp_retire(struct odp *o, struct reg_allocation *a);

/* The owner is going: its queued work answers nobody and counts for nobody; a flush of its
 * still waiting for room is dropped. */
void odp_forget_owner(struct odp *o, struct reg_owner *owner);
