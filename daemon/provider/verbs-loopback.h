/* SPDX-License-Identifier: MIT */
/* Two RC QPs of one PD, connected to each other through the device's own port. They let mrd
 * carry out an RDMA WRITE or READ through keys a client holds (the Dma request) on a real
 * device, so that the device, not mrd, judges the keys, their access and their bounds.
 * Two threads may use it at once, one for transfers and one for windows (the owner serialises
 * each kind): a transfer posts on the first QP and waits on its own CQ, a window's work request
 * on the second QP and waits on another, so a grant on mrd's loop never waits for a transfer
 * of the Dma thread (up to 64 MiB on a device). Whatever replaces, makes or frees the pair,
 * and has_windows, run with neither kind under way (the owner holds both of its locks). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

struct ibv_pd;
struct verbs_loopback;

/* Why two QPs of a device of this node and transport type cannot connect on loopback, or
 * NULL where they can: caps.dma is false on such a device, with this reason. */
const char *verbs_loopback_unsupported(enum ibv_node_type node, enum ibv_transport_type transport);

/* -ENETDOWN when no port of the device is active. */
int verbs_loopback_new(struct ibv_pd *pd, struct verbs_loopback **ret);
void verbs_loopback_free(struct verbs_loopback *lb);
/* The lock the owner holds while it compares an event's element against lb's (owns): held from
 * now on whenever lb replaces or destroys QPs (verbs_loopback_new and _free run under it
 * already, the owner's own calls). */
void verbs_loopback_set_elements_lock(struct verbs_loopback *lb, pthread_mutex_t *lock);
/* Whether element, an async event's QP or CQ, is one of lb's (NULL-safe): compared, never
 * read, since a pointer that is not mrd's may be anything. */
bool verbs_loopback_owns(const struct verbs_loopback *lb, const void *element);

/* An RDMA WRITE (local -> remote) or READ (remote -> local) of length bytes, posted on one QP
 * to the other, split at the port's largest message, each part awaited. -EKEYREJECTED when
 * the device refused a key (not valid, not granting the access, or the range outside it: a
 * completion does not say which), -ETIMEDOUT when a part did not complete in time, -EIO for
 * any other failed completion, -ENOTCONN when the last replace failed. After a refused key the
 * QPs are in the error state: replace them; after any other failure the loopback is of no
 * further use (its port or address may be gone): free it, or, while windows are bound through
 * it, replace its QPs. */
int verbs_loopback_transfer(struct verbs_loopback *lb, bool read, uint32_t lkey, uint64_t laddr,
			    uint32_t rkey, uint64_t raddr, uint64_t length);
/* A fresh pair of QPs for the current one (retired while windows are bound on it). After a
 * failure to make one, ready() is false and every transfer or window op says -ENOTCONN until
 * a replace succeeds. */
int verbs_loopback_replace(struct verbs_loopback *lb);
/* After a failure on the pair: while windows are bound on it, the same QPs reset and connected
 * again, so that the windows stay reachable (on rxe: rxe_qp_reset leaves mw->qp, and
 * rxe_lookup_mw compares QPs), once each QP that reported the failure is in the error state
 * (verbs_loopback_settle). Replaced where it has no windows, where a QP does not settle, or
 * where the reset fails. */
int verbs_loopback_mend(struct verbs_loopback *lb);
/* Waits (100 ms at most each) for the QPs that reported failures to enter the error state,
 * which they do on the device's own time: 0, or -ETIMEDOUT. Needs the pair not to change
 * (the Dma lock), not the window lock: the Dma thread settles before it takes that. */
int verbs_loopback_settle(struct verbs_loopback *lb);
bool verbs_loopback_ready(const struct verbs_loopback *lb);
/* Counts the pairs made: a window op that failed asks whether its pair is still the current
 * one (replace it) or was replaced meanwhile by the other thread (try once more). */
unsigned verbs_loopback_generation(const struct verbs_loopback *lb);

/* Type-2 memory windows. A window is bound on the answering QP, the one the transfers reach:
 * rxe lets a type-2 window be used only through the QP it was bound on (Linux rxe_mw.c
 * rxe_lookup_mw: mw->qp != qp). Each is one work request, awaited; after a failed one (-EIO,
 * or -ETIMEDOUT) the QPs are in the error state: replace them (a transfer's refused key puts
 * the answering QP there too, so a window op under way fails with it). *ret_pair: the pair
 * bound on, for invalidate and unbound.
 * When the QPs are replaced (after a refused key), windows bound on the old pair reach nothing
 * from then on (on rxe), and the old pair is kept until each is invalidated (posted on the new
 * pair: rxe_invalidate_mw checks no QP) or deallocated (then verbs_loopback_unbound). Every
 * window must be deallocated before verbs_loopback_free. rkey: the key the bind gives, the
 * window's last one with its key byte advanced (ibv_inc_rkey). */
struct ibv_mw;
struct ibv_mr;
struct verbs_loopback_pair;
int verbs_loopback_bind(struct verbs_loopback *lb, struct ibv_mw *mw, struct ibv_mr *mr,
			uint64_t addr, uint64_t length, unsigned ibv_access, uint32_t rkey,
			struct verbs_loopback_pair **ret_pair);
int verbs_loopback_invalidate(struct verbs_loopback *lb, uint32_t rkey,
			      struct verbs_loopback_pair *pair);
void verbs_loopback_unbound(struct verbs_loopback *lb, struct verbs_loopback_pair *pair);
/* Whether windows are bound through lb (on any pair): it must not be freed. */
bool verbs_loopback_has_windows(const struct verbs_loopback *lb);
