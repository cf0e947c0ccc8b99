/* SPDX-License-Identifier: MIT */
/* What libmrd's files share about a client handle. */
#pragma once

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "connection.h"
#include "status-page.h"

struct mrd_client {
	struct conn *conn;
	pthread_mutex_t lock; /* one call on the socket at a time */
	int fd;		      /* conn's descriptor, one number for the handle's life (a reconnect
			       * moves the new connection onto it): what mrd_client_fd() gives */
	bool gone;   /* conn is dead (atomic): calls fail at once, the status page is poisoned */
	bool forked; /* this process is a fork() child of the one that opened the handle */
	pid_t pid;   /* the one that opened it */
	struct mrd_client *prev, *next; /* the process's open handles, which fork() marks */
	char domain[64];
	const struct mrd_status_page *status; /* the domain's, read-only */
	uint32_t status_size;
	bool holds_window;
	uint64_t session; /* mrd's id for this connection: what a reconnect resumes */
	unsigned epoch;   /* reconnects so far: what was registered before one is gone */
	unsigned long n_held; /* allocations and attachments mrd holds for it: a reconnect must
			       * get them all back */
	pthread_mutex_t reconnect_lock; /* one mrd_client_reconnect() at a time */
	/* Free and ExtmemDetach that got no answer (mrd went away): done or not, the next mrd
	 * tells (memory_settle_lost_frees). */
	struct lost_free {
		uint64_t address;
		int body_case;
	} lost_frees[64];
	size_t n_lost_frees;
	bool lost_frees_dropped; /* more than lost_frees holds */
	uint32_t *arenas; /* ids of arenas this handle mapped */
	size_t n_arenas, arenas_cap;
};

/* Takes the handle's lock for a call on client->conn: -ECHILD in a fork() child (before any
 * lock: one held at the fork stays held there), -ECONNRESET when the connection is gone
 * (nothing is sent), both with their reason for mrd_last_error() and the lock not held. */
int client_lock(struct mrd_client *client);
/* Drops it; a call that found mrd gone marks the handle gone (client_gone). */
void client_unlock(struct mrd_client *client);
/* Whether cached keys may be handed out, with no lock: 0, or the error client_lock gives. */
int client_usable(const struct mrd_client *client);

/* One request/response on conn, with no lock; otherwise as client_call. */
int conn_request(struct conn *conn, Mrd__Request *req, Mrd__Response **ret,
		 struct conn_fds *ret_fds);
/* One request/response under the handle's lock; daemon errors become -errno and their reason
 * becomes mrd_last_error(). Descriptors of a successful reply go to ret_fds (closed when NULL
 * or on error). */
int client_call(struct mrd_client *client, Mrd__Request *req, Mrd__Response **ret,
		struct conn_fds *ret_fds);

/* Records a reason for mrd_last_error() and returns error. */
int set_last_error(int error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for a call that got no answer (error: conn_call's): says what a lost mrd means. */
int set_call_error(int error);

/* memory.c: joins the domain (window, status page) on connect; undoes it on close. */
int memory_join(struct mrd_client *client);
/* JoinDomain on conn, a new connection to an mrd that took over from the one this handle had
 * (warm restart): the allocations it handed back, with the new status page's descriptor in
 * *ret_status_fd; -ESTALE when conn's mrd does not hold this memory (nothing handed back). */
int memory_rejoin(struct mrd_client *client, struct conn *conn, int *ret_status_fd);
/* Maps the new status page where the old one was. */
int memory_remap_status(struct mrd_client *client, int fd);
/* Maps over the status page a private copy whose generation no lookup can have cached, so
 * that every thread's next lookup through the handle leaves the inline hit and asks libmrd
 * (which refuses). Undone by memory_remap_status(). */
void memory_poison_status(struct mrd_client *client);
/* Holds (lock) and releases the window's lock across fork(): the child gets it unlocked. */
void memory_fork_lock(bool lock);
/* A Free or ExtmemDetach of address got no answer: remembered for the next reconnect. */
void memory_note_lost_free(struct mrd_client *client, int body_case, uint64_t address);
/* After a reconnect, asks again on conn what got no answer, with the handle's lock held: each
 * one done now takes one off *resumed and n_held; each one the old mrd had done, off n_held.
 * Too many to have kept: *resumed becomes UINT_MAX (nothing can be told). -ECONNRESET or
 * -ETIMEDOUT: conn failed too; what is left stays for the next try. */
int memory_settle_lost_frees(struct mrd_client *client, struct conn *conn, unsigned *resumed);
void memory_leave(struct mrd_client *client);

struct mrd_lookup;
struct mrd_mr;
/* lookup.c: the cached part of a lookup (generation check, top half, bottom half, which
 * refills the top); -ENOENT when nothing cached holds a. */
int lookup_cached(struct mrd_lookup *l, uintptr_t a, struct mrd_mr *ret);
/* Into the bottom half (emptied first when full at its ceiling), and the top half too. */
void lookup_insert(struct mrd_lookup *l, const struct mrd_mr *mr, bool top);
