/* SPDX-License-Identifier: MIT */
/* A domain across a warm restart, in plain C: what one mrd saves of each domain (its generation
 * and counters, each arena that holds live allocations with a dup of its memfd, who may take
 * each allocation back, what lives on in the device context it exported) and what the next
 * mrd adopts from that: the arenas back in place, the allocations waiting as orphans for their
 * owners. control/handover.c carries it between the two (proto/handover.proto). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memory/allocation.h"
#include "memory/arena.h"
#include "core/domain.h"

struct core;

struct saved_arena {
	struct arena_place place;
	int memfd; /* saved: a dup; to adopt: the one passed (negative: not passed) */
	const char *label; /* to adopt: its name in messages */
	struct adopted_allocation *allocations;
	size_t n_allocations;
};

struct saved_domain {
	const char *name; /* borrowed (the domain's, or the state's); NULL: none given */
	uint64_t generation, allocation_serial, frees;
	struct saved_arena *arenas;
	size_t n_arenas;
	/* Saved only: its device context, which outlives mrd while these processes hold it
	 * (borrowed from the domain), with mrd's MRs in it. */
	const struct context_holder *exported_to;
	size_t n_exported_to;
	uint64_t pinned_bytes;
	uint32_t mrs; /* and on-demand children */
	const char *device;
};

/* Every domain, in the core's order, into *ret (n of them): saved_domains_free frees them.
 * Bumps each domain's generation: its clients stop trusting cached keys, and the next mrd
 * starts above it. What it borrows lives while the domains stay open. */
int domains_save(struct core *core, struct saved_domain **ret, size_t *ret_n);
/* Closes the memfds still there. NULL-safe. */
void saved_domains_free(struct saved_domain *saved, size_t n);

/* Records every saved domain's generation as its floor: a domain of that name opens above it
 * from now on. Called first, before anything else of the state can fail: the previous mrd's
 * clients cached keys under those generations, whether or not the rest is taken over. */
int domains_record_floors(struct core *core, const struct saved_domain *saved, size_t n);
/* Opens each saved domain (domain_adopt; its floor recorded already) with its arenas
 * (their memfds taken) and their allocations as orphans. An arena whose attached memfd its
 * owner sealed against writes is left out alone. Then the domains where nothing waits let go
 * of their hold. *ret_allocations: how many allocations wait. On failure why says what was
 * wrong, and what was adopted stays (domains_reap_orphans with all undoes it). */
int domains_adopt(struct core *core, struct saved_domain *saved, size_t n,
		  unsigned *ret_allocations, char *why, size_t why_size);
/* domain_reap_orphans in every domain (may close them): how many allocations wait on. */
unsigned domains_reap_orphans(struct core *core, bool all);

/* How many client PDs (BindPd) still keep MRs the device would not let go of. */
unsigned domains_client_pds_left(const struct core *core);
