/* SPDX-License-Identifier: MIT */
/* A PD's window binder (libmrd-preload.so): the type-1 memory windows whose rkeys the shim
 * hands an unmodified program in place of its MRs' own, and the QP it binds them on.
 *
 * The program expects an rkey to die with ibv_dereg_mr, but the shim keeps mrd's
 * registration for the next ibv_reg_mr of the buffer, and mrd keeps its MR until the memory
 * goes. So the program's peers get a window's rkey: bound over the buffer's bytes when the
 * program registers, unbound (a bind of length 0, under a new key byte) when it deregisters,
 * the call returning only once the device completed either. A type-1 window, because any QP
 * of the PD must answer to it, as to an MR's rkey (a type-2 window answers on its QP alone,
 * Linux rxe_mw.c rxe_lookup_mw); bound by ibv_bind_mw, a work request on a QP of the PD: the
 * binder's own, an RC QP connected to itself, which carries nothing but binds.
 *
 * A window is bound at most BINDER_BINDS times (each bind, unbinds included, advances its key
 * byte: ibv_inc_rkey in librxe's and mlx5's bind_mw), so none of its rkeys comes back; then it
 * is retired, unbound and kept allocated (a deallocated window's index goes back to the
 * device with its key), up to BINDER_RETIRED per PD, the oldest deallocated beyond.
 *
 * libmrd-preload.so links no libibverbs (a program may dlopen it): the verbs calls that are
 * not inline come in binder_verbs, resolved by the shim. Not thread-safe: the shim's lock. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#define BINDER_BINDS 254
#define BINDER_RETIRED 1024
#define BINDER_REMAKES 3

struct binder_verbs {
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
				    int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
};

/* mrd's record of the windows that may be bound (mrd_window_track(3)): it deallocates them
 * should the program die, before it deregisters its MRs under them (rxe refuses a dereg under a
 * bound window). A window is tracked from its allocation until it is retired (unbound for good)
 * or deallocated; one mrd does not track is not used. Negative errno. */
struct binder_tracking {
	int (*track)(void *data, uint32_t mw_handle);
	int (*untrack)(void *data, uint32_t mw_handle);
	void *data;
};

struct window_binder;

/* A binder for pd, its QP connected: 0, or -EOPNOTSUPP with why (no type-1 windows, no RC QP
 * that loops back, no active port) or another negative errno. t is copied. */
int window_binder_new(const struct binder_verbs *v, const struct binder_tracking *t,
		      struct ibv_pd *pd, struct window_binder **ret, char *why, size_t why_size);
/* A window over [addr, addr + length) of the MR with lkey, with access's remote rights,
 * bound once this returns 0 (*ret, its rkey in (*ret)->rkey). */
int window_binder_bind(struct window_binder *b, uint32_t lkey, void *addr, size_t length,
		       unsigned access, struct ibv_mw **ret, char *why, size_t why_size);
/* mw's rkey is dead once this returns 0, and mw back in the pool; failing, mw is deallocated
 * (the kernel kills its key then): -errno. After a failed bind or unbind the binder's QP is in
 * the error state: the next bind makes a new one, BINDER_REMAKES times in all; then it serves
 * no more. */
int window_binder_unbind(struct window_binder *b, struct ibv_mw *mw);
/* Windows bound now, pooled, and retired (mrctl-like counts for the shim's log). */
void window_binder_counts(const struct window_binder *b, unsigned *bound, unsigned *pooled,
			  unsigned *retired);
/* Deallocates every window (none may be bound: each MR unbinds first) and the QP. */
void window_binder_free(struct window_binder *b);
