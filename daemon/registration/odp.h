/* SPDX-License-Identifier: MIT */
/* ODP-style lazy registration: the kernel's implicit-ODP design (seed 002), in the daemon. A
 * domain's on-demand memory is registered in children: on-demand MRs over fixed chunks of the
 * window (cache.odp_chunk, at most the device's largest MR), each cut to one allocation — mrd's
 * address space holds every domain's memory, so a child must never reach past its own. Children
 * live in a radix index keyed by chunk number, one list per chunk, shared by the children of
 * every allocation in that chunk; a fault (a lookup miss, or a prefetch on a worker) makes the
 * missing ones and installs each with a compare-and-exchange (the loser frees its own), then
 * enters all of them in the domain's table at once. Prefetch work counts on its allocation;
 * only it uses that allocation's children's MRs, but walking a chunk's list it reads every
 * child there. Freeing memory zaps its children and takes them out of the table and the index:
 * they become zombies. A zombie's MR is deregistered once no work on its allocation remains
 * (while registrar_busy() — a soft Dma may copy through it — not zapped, and deregistered on a
 * worker, which counts as work on the allocation), and the Free answers then (no key of the memory works and no work touches its pages after
 * they went back). Its memory waits longer, for a grace period over all the domain's prefetch
 * work, as SRCU would: the domain's epoch moves each time a child leaves the index, each job is
 * stamped with it at submission and kept in submission order, and a zombie is freed once the
 * oldest job still running was submitted after it left (later jobs cannot reach it, so a stream
 * of prefetches from others never holds it). Only the loop removes or destroys children. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

struct mr_entry;
struct mr_waiter;
struct provider_mr;
struct reg_allocation;
struct reg_owner;
struct registrar;

struct odp_child {
	uint64_t start, end;        /* its chunk cut to its allocation */
	uint64_t allocation_serial; /* which allocation: immutable, read by workers */
	struct reg_allocation *allocation; /* its allocation: set at birth; NULL once its MR went */
	struct provider_mr *pmr;    /* NULL once deregistered (a zombie whose allocation went) */
	struct odp_child *next;     /* in its index slot (atomic) */
	LIST_ENTRY(odp_child) link; /* loop: its allocation's children (zombies once it retired) */
	TAILQ_ENTRY(odp_child) grace; /* loop: the domain's zombies, in the order they left */
	uint64_t gone;              /* loop: the domain's epoch when it left the index */
	bool linked;                /* loop: live, in the table and its allocation's list */
	bool zombie;                /* loop: out of the index */
};

struct odp_stats {
	uint64_t faults, children_created, children_destroyed, prefetch_requests, prefetch_pages,
		invalidations;
};

/* Chunk slots per leaf of the index. */
#define ODP_LEAF 512

struct odp {
	uint64_t base;          /* the window's */
	unsigned chunk_shift;
	size_t n_leaves;        /* top-level slots: chunks / ODP_LEAF */
	struct odp_child ***leaves; /* leaves[i][j]: chunk i * ODP_LEAF + j's list */
	TAILQ_HEAD(, odp_child) zombies;     /* out of the index, oldest first */
	TAILQ_HEAD(, prefetch_job) running;  /* submitted, oldest first: the grace period */
	TAILQ_HEAD(, prefetch_job) waiting;  /* flushes waiting for room, oldest first */
	uint64_t epoch;         /* moves each time a child leaves the index */
	unsigned jobs;          /* prefetch work queued or running */
	unsigned children;      /* live */
	struct odp_stats stats;
};

/* Prefetch work a client may have queued at once, and a domain (its clients' that left
 * included); chunks one prefetch may span. */
#define ODP_PREFETCH_IN_FLIGHT 16
#define ODP_DOMAIN_JOBS_MAX 256
#define ODP_PREFETCH_CHUNKS_MAX 4096

enum odp_advice { ODP_PREFETCH, ODP_PREFETCH_WRITE, ODP_PREFETCH_NO_FAULT };

/* The index over the window [window_base, +window_size). */
int odp_init(struct registrar *r, uint64_t window_base, uint64_t window_size);
/* At domain teardown: no work is left (jobs hold the domain); destroys what remains. */
void odp_done(struct registrar *r);

/* A lookup miss at addr in on-demand allocation a: its child, made when missing — with a
 * waiter, while the provider is busy (registrar_offload), on a worker: then -EINPROGRESS, and
 * the waiter hears once it is made. */
int odp_fault(struct registrar *r, struct reg_allocation *a, uint64_t addr, struct mr_entry *ret,
	      char *why, size_t why_size, struct mr_waiter *waiter);

/* Queues prefetch advice over [addr, addr + length), which lies in a. With a waiter (a flush)
 * it answers through it once done (-EINPROGRESS); without, 0 once queued. owner's queued work is
 * bounded by ODP_PREFETCH_IN_FLIGHT, the domain's by ODP_DOMAIN_JOBS_MAX: past either, a flush
 * waits for room (its client, paused, has no other), anything else is -EAGAIN. */
int odp_prefetch(struct registrar *r, struct reg_owner *owner, struct reg_allocation *a,
		 uint64_t addr, uint64_t length, enum odp_advice advice, struct mr_waiter *waiter,
		 char *why, size_t why_size);

/* a is being freed: its children are zapped and leave the table and the index. Returns
 * nonzero when prefetch work on a remains (its children's MRs wait for it): then
 * registrar_release() runs once that is over. */
unsigned odp_retire(struct registrar *r, struct reg_allocation *a);

/* The owner is going: its queued work answers nobody and counts for nobody; a flush of its
 * still waiting for room is dropped. */
void odp_forget_owner(struct registrar *r, struct reg_owner *owner);
