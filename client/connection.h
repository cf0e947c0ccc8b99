/* SPDX-License-Identifier: MIT */
/* One connection to mrd, shared by libmrd and mrctl: connect, Hello, blocking calls. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "macro.h"
#include "mrd/mrd.h" /* MRD_SOCKET_DEFAULT */
#include "wire.h"

#define CONN_TIMEOUT_MS 30000

struct conn {
	int fd;
	uint64_t next_id;
	uint32_t version;
	uint64_t capabilities;
	bool admin;
	char server_version[64];
	uint8_t *buf; /* one reply at a time */
	size_t buf_size;
	char path[108];
	bool broken; /* mrd hung up: nothing more goes over it */
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

/* Sends req (its id is assigned here) and waits for the matching response. Returns 0 with
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
