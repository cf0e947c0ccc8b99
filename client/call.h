/* SPDX-License-Identifier: MIT */
/* How a libmrd call reaches mrd: the handle's lock (shared by calls in flight at once, held
 * alone by a reconnect), one request and its reply, the thread's
 * last error, and what a call that finds mrd gone does to the handle. Every other file of
 * libmrd sits above this one; it includes none of them. */
#pragma once

#include "handle.h"

/* Records a reason for mrd_last_error() and returns error. */
int set_last_error(int error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for a call that got no answer (error: conn_call's): says what a lost mrd means. */
int set_call_error(int error);
/* -ECHILD, saying why: the handle is a fork() child's copy of its parent's. */
int client_forked_error(const struct mrd_client *client);

/* Takes the handle's lock, shared, for a call on client->conn: -ECHILD in a fork() child (before any
 * lock: one held at the fork stays held there), -ECONNRESET when the connection is gone
 * (nothing is sent), both with their reason for mrd_last_error() and the lock not held. */
int client_lock(struct mrd_client *client);
/* Drops it; a call that found mrd gone marks the handle gone and poisons its status page. */
void client_unlock(struct mrd_client *client);
/* Whether cached keys may be handed out, with no lock: 0, or the error client_lock gives. */
int client_usable(const struct mrd_client *client);

/* Maps over the status page a private copy whose generation no lookup can have cached, so
 * that every thread's next lookup through the handle leaves the inline hit and asks libmrd
 * (which refuses). Undone by memory_remap_status(). */
void client_poison_status(struct mrd_client *client);

/* One request/response on conn, with no lock; otherwise as client_call. */
int conn_request(struct conn *conn, Mrd__Request *req, Mrd__Response **ret,
		 struct conn_fds *ret_fds);
/* The same, with n_send_fds descriptors (not consumed) sent along. */
int conn_request_with_fds(struct conn *conn, Mrd__Request *req, const int *send_fds,
			  size_t n_send_fds, Mrd__Response **ret, struct conn_fds *ret_fds);
/* One request/response under the handle's lock (other threads' calls on the handle run
 * meanwhile: see struct conn); daemon errors become -errno and their reason
 * becomes mrd_last_error(). Descriptors of a successful reply go to ret_fds (closed when NULL
 * or on error). */
int client_call(struct mrd_client *client, Mrd__Request *req, Mrd__Response **ret,
		struct conn_fds *ret_fds);

/* -ESTALE, saying why, when the handle imported its PD before mrd restarted or before the
 * device came back (the status page's pd_epoch moved): mrd's keys are for another PD; else 0. */
int client_pd_stale(struct mrd_client *client);
/* The domain's PD replacements so far (the device came back); 0 from an mrd that does not say
 * (a status page before layout 3). */
uint64_t client_device_epoch(const struct mrd_client *client);
