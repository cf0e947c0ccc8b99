/* SPDX-License-Identifier: MIT */
/* Warm restart: what one mrd hands the next so that clients' memory outlives it. The arenas'
 * memfds travel with a sealed memfd describing them (proto/handover.proto): into systemd's FD
 * store at SIGTERM, or across mrd's own re-exec at SIGUSR2; either way they come back the way
 * systemd passes descriptors (LISTEN_FDS, LISTEN_FDNAMES). The next mrd maps every arena at
 * the same address, holds each allocation for the process that owned it until it reconnects
 * ([memory] reconnect_grace), and starts every domain's generation above the old one, so
 * clients refetch their keys. Registrations do not survive: keys belong to the old PDs —
 * except in a context a client imported (ExportPd), which lives on with them while it holds the
 * descriptor: the state names those (control/old-context.h) and the next mrd shows them.
 * What a domain saves and adopts is core's (core/domain-handover.h), the list of descriptors
 * base's (base/fd-list.h); here the state is packed and read (control/handover.c) and passed on
 * (control/handover-pass.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "base/fd-list.h"

struct manager;

#define HANDOVER_STATE_NAME "mrd-state"
#define HANDOVER_ARENA_PREFIX "mrd-arena-"
/* The listening socket across a re-exec: bound by mrd (unlinked at exit), or passed to it. */
#define HANDOVER_BOUND_SOCKET_NAME "mrd-bound-socket"
#define HANDOVER_SOCKET_NAME "mrd-socket"

/* Whether a descriptor passed under name is part of a hand-over. */
bool handover_fd_name(const char *name);

/* Every domain and the arenas worth keeping: the state memfd first, then dups of the arenas'
 * memfds, in ret; *ret_allocations says how many allocations it holds. Bumps every domain's
 * generation: clients stop trusting cached keys. */
int handover_save(struct manager *m, struct fd_list *ret, unsigned *ret_allocations);

/* Takes over what the previous mrd handed over in passed (each descriptor used is set to -1).
 * Nothing there: 0. A state mrd cannot trust whole is dropped whole, logged, and mrd starts
 * cold (still 0): clients keep their mappings, but not through mrd. */
int handover_adopt(struct manager *m, struct fd_list *passed);

/* After an adoption: every [memory] reconnect_grace, the allocations whose processes are gone
 * are freed (handover-pass.c). -ENOMEM: no timer. */
int handover_start_grace(struct manager *m);
/* At exit (or an adoption undone): every allocation still waiting for its owner is freed. */
void handover_end_grace(struct manager *m);

/* How many descriptors systemd keeps for mrd ($FDSTORE, FileDescriptorStoreMax=); 0: none. */
unsigned handover_fd_store_max(void);
/* At exit: every domain's arenas into systemd's FD store. */
int handover_to_fd_store(struct manager *m);
/* Before a hand-over (re-exec, FD store): MRs in clients' own contexts (BindPd) pin this
 * mrd's pages and would outlive it there, their keys working, unknown to the next mrd. Every
 * job of the workers ends (a registration under way lands first; the workers are gone after),
 * then each bound PD is let go, on the loop, its connection getting no key from then on.
 * Returns how many client PDs still keep MRs the device would not let go of (now, or in
 * quarantined runs): then no hand-over may happen. */
unsigned handover_unbind_clients(struct manager *m);
/* SIGUSR2: execs mrd again, passing the arenas and the listening socket. Returns only when it
 * could not (negative errno; mrd goes on serving), or exits when the exec itself failed. */
int handover_reexec(struct manager *m);
