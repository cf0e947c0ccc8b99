/* SPDX-License-Identifier: MIT */
/* A connection to mrd: its socket, frames in and out, the requests it has in flight, and its
 * owner record (reg_owner embeds memory's mem_owner) that lower layers take instead of it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "macro.h"
#include "wire.h"
#include "registration/reg-owner.h"
#include "core/access.h"
#include "control/refusal-log.h"

struct bound_pd;
struct served_device;
struct manager;
struct pending_request;
struct user_share;
struct event;

struct out_frame {
	STAILQ_ENTRY(out_frame) link;
	int fds[WIRE_FDS_MAX]; /* owned dups, sent with the frame */
	size_t n_fds;
	size_t len;
	uint8_t data[];
};

/* One connection. Identity comes from SO_PEERCRED and never changes. */
struct client {
	struct manager *manager;
	LIST_ENTRY(client) link;
	uint64_t id;

	int fd;
	struct event *read_event, *write_event;
	struct event *drain_event; /* retries replies held back by the descriptor budget */
	struct event *hangup_event; /* while paused: notices the client leaving */
	unsigned fds_in_flight;    /* sent in replies the client may not have read yet */
	bool reading;

	/* What memory and registration keep of it: its pid, uid, allocations, mempools and
	 * prefetches (lower layers see this alone). */
	struct reg_owner owner;
	gid_t gid;
	bool admin;
	uid_t owner_uid;           /* who answers for it: uid, or its user namespace's owner */
	struct user_share *share;  /* owner_uid's, holding one of its connections */
	bool nested_pidns;         /* in a container: no admin (core/access.h) */
	bool user_container;       /* counts in share->containers (a user-made container's) */
	bool other_userns;         /* in another user namespace: no admin either */

	bool hello_done;
	uint32_t version;
	char name[65];

	char domain_name[64];  /* from uid/gid, cgroup and [domains], fixed at connect */
	bool joined;           /* JoinDomain answered once: resuming is for the first one */
	struct domain *domain; /* acquired on first use */
	struct bound_pd *bound; /* BindPd: its lookups' keys are of its own PD's MRs */
	struct served_device *bound_device; /* ... on this device (core/served-devices.h) */
	bool keys_out;          /* it got keys (or the context) of the domain's PD: too late
				 * to bind */
	bool bound_lost;        /* its bound PD was let go for a re-exec that failed: no keys */
	uint32_t *arenas_sent; /* arenas whose memfd this client has received */
	size_t n_arenas_sent, arenas_sent_cap;

	/* Requests whose answers wait for a worker, answered in any order (each reply carries
	 * its id): other requests are read and answered meanwhile. */
	LIST_HEAD(, pending_request) pending;
	unsigned n_pending;

	unsigned protocol_errors;
	struct refusal_memory refusals; /* requests refused, and which were logged */
	/* Replies not yet taken by the client. With n_pending, bounded by
	 * limits.requests_in_flight: at the bound mrd reads no more of its requests. */
	STAILQ_HEAD(, out_frame) out;
	unsigned n_out;
	size_t out_bytes; /* of out, bounded too: CLIENT_OUT_BYTES_MAX, USER_OUT_BYTES_MAX */
};

/* Bytes of replies held for clients that do not read them: per connection, and per user
 * across its connections (a user has up to [limits] clients_per_user of them). At either
 * bound mrd reads no more requests of that connection, or of any of that user's, until they
 * are read: what one user makes mrd hold is bounded whatever its frames. */
#define CLIENT_OUT_BYTES_MAX (1u << 20)
#define USER_OUT_BYTES_MAX (8u << 20)

/* Descriptors travelling in replies the client has not read yet count against mrd's own
 * open-file limit (the kernel charges them to the sender): a client that never reads its
 * replies holds no more than this many hostage. */
#define CLIENT_FDS_IN_FLIGHT 16

/* Takes fd on success. */
/* What the read-only views show this client (access_view). */
static inline const char *client_view(const struct client *c)
{
	return access_view(c->admin, c->domain_name);
}

int client_new(struct manager *m, int fd, pid_t pid, uid_t uid, gid_t gid, bool admin,
	       const char *domain_name, struct client **ret);
struct client *client_free(struct client *c);
DEFINE_CLEANUP(struct client, client_free)

/* Sends one packed reply with n_fds descriptors (not consumed), or queues it while the client
 * is not reading; queueing the requests_in_flight-th reply pauses reading from the client. */
int client_send_frame(struct client *c, const uint8_t *data, size_t len, const int *fds,
		      size_t n_fds);

/* The client's domain, acquired on first use; why says why not. */
int client_get_domain(struct client *c, struct domain **ret, char *why, size_t why_size);

/* Whether c has limits.requests_in_flight requests pending or replies unread: mrd reads no
 * more of its requests until one is answered or read. */
bool client_full(const struct client *c);
/* Stops (and restarts, unless c is full) reading requests from c. */
void client_pause(struct client *c);
void client_resume(struct client *c);

/* Which arenas' memfds a client holds, so each is sent once. */
bool client_has_arena(const struct client *c, uint32_t arena_id);
int client_add_arena(struct client *c, uint32_t arena_id);
/* An arena went away: nobody holds its id any more (ids are reused). */
void client_forget_arena_all(struct manager *m, uint32_t arena_id);

/* Drops a misbehaving client: one warning naming pid, uid and reason, then frees it. */
void client_drop(struct client *c, const char *reason);
