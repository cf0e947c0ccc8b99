/* SPDX-License-Identifier: MIT */
/* One connection to mrd, shared by libmrd and mrctl: connect, Hello, blocking calls, which
 * several threads may make at once: each sends under a short lock; waiters read what comes, one
 * reply at a time, handing each (with its descriptors) to the thread whose request id it
 * carries (conn_wait_locked says which waiter reads). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "macro.h"
#include "mrd/mrd.h" /* MRD_SOCKET_DEFAULT */
#include "wire.h"

#define CONN_TIMEOUT_MS 30000
/* A call sent this recently has a thread that is likely on a CPU, or soon: it reads the
 * socket for others (conn_wait_locked). Far above a round trip, far below a big pin. */
#define CONN_FRESH_NS 200000ull
/* A thread that called this recently calls again soon, as a rule: a long call leaves the
 * socket to it. */
#define CONN_LONG_NS 10000000ull
/* A waiter in recv() this long has stalled: CONN_FRESH_NS rounded up to a jiffy (10 ms at
 * HZ=100), and then some. */
#define CONN_STALLED_NS 25000000ull

struct conn_waiter;

struct conn {
	int fd;
	uint32_t version;
	uint64_t capabilities;
	bool admin;
	char server_version[64];
	char path[108];
	bool broken; /* mrd hung up: nothing more goes over it (atomic) */
	pthread_mutex_t send_lock; /* one request on the socket at a time */
	pthread_mutex_t lock;      /* guards what follows */
	uint64_t next_id;
	uint64_t last_sent_ns; /* when the newest call was sent */
	struct conn_waiter *waiters;  /* calls sent and not answered yet, newest first */
	struct conn_waiter *blocking; /* one of them sleeps in recv(), into buf */
	uint64_t blocking_since_ns;   /* since when */
	bool reading;                 /* one of them reads one reply, without waiting, into poll_buf */
	uint8_t *buf;
	uint8_t *poll_buf; /* made at the first such read */
	size_t buf_size;
};

/* The socket path a client uses: path, else $MRD_SOCKET, else the default. */
const char *conn_socket_path(const char *path);

/* Connects and negotiates. On failure *ret is untouched and, when error is not NULL, a
 * human-readable reason is written there (the daemon's own words when it refused). */
int conn_open(const char *path, const char *client_name, uint64_t capabilities, struct conn **ret,
	      char *error, size_t error_size);
struct conn *conn_free(struct conn *c);
DEFINE_CLEANUP(struct conn, conn_free)

/* Descriptors that came with a reply; the caller owns them. */
struct conn_fds {
	int fds[WIRE_FDS_MAX];
	size_t n;
};

/* Sends req (its id is assigned here) and waits for the matching response, while other
 * threads' calls on c may be in flight (up to CONN_TIMEOUT_MS each). Returns 0 with
 * *ret (free with mrd__response__free_unpacked) even when the daemon answered an error, or a
 * transport error as -errno (-ECONNRESET at once once mrd has hung up: c->broken). Descriptors of the reply go to ret_fds, or are closed when it is
 * NULL. */
int conn_call(struct conn *c, Mrd__Request *req, Mrd__Response **ret, struct conn_fds *ret_fds);
/* The same, with n_fds descriptors (not consumed) sent along with the request. */
int conn_call_with_fds(struct conn *c, Mrd__Request *req, const int *fds, size_t n_fds,
		       Mrd__Response **ret, struct conn_fds *ret_fds);

/* The daemon's status converted to -errno, 0 on success. */
static inline int response_error(const Mrd__Response *resp)
{
	return resp->status > 0 ? -resp->status : 0;
}
