/* SPDX-License-Identifier: MIT */
/*
 * libmrd: the client library of mrd, the memory-registration daemon for RDMA.
 *
 * Every function returns 0 (or a non-negative value) on success and a negative errno value on
 * failure. Handles are opaque. Destructors accept NULL and return NULL. See libmrd(3).
 */
#ifndef MRD_MRD_H
#define MRD_MRD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where clients look for mrd when neither an argument nor $MRD_SOCKET names a socket. */
#define MRD_SOCKET_DEFAULT "/run/mrd/mrd.sock"

/* A connection to mrd. One handle may be shared by threads; calls on it are serialised. */
typedef struct mrd_client mrd_client;

/*
 * Connects to mrd at path (NULL or "": $MRD_SOCKET, else MRD_SOCKET_DEFAULT) and negotiates the
 * protocol version. On success *ret is a new handle; on failure *ret is untouched.
 * Errors: -ENOENT or -ECONNREFUSED when mrd is not running, -EPROTONOSUPPORT when no protocol
 * version is shared, -EUSERS when mrd serves its limit of clients, -ETIMEDOUT, -ENOMEM.
 */
int mrd_client_connect(const char *path, mrd_client **ret);

/* Closes the connection and frees the handle. Returns NULL. */
mrd_client *mrd_client_close(mrd_client *client);

/* One round trip to mrd; the echoed payload is checked. -ECONNRESET when mrd went away. */
int mrd_client_ping(mrd_client *client);

/*
 * The device context and protection domain of the caller's domain, for a client that creates
 * its own QPs: *ret_cmd_fd is a new O_CLOEXEC descriptor (the caller's, for
 * ibv_import_device()) and *ret_pd_handle the PD's handle (for ibv_import_pd()).
 * <mrd/mrd-verbs.h> does both. -EOPNOTSUPP on the soft provider, which has no device.
 */
int mrd_client_get_pd(mrd_client *client, int *ret_cmd_fd, uint32_t *ret_pd_handle);

/* The negotiated protocol version (positive), or -EINVAL for a NULL handle. */
int mrd_client_protocol_version(const mrd_client *client);

/* mrd's package version, e.g. "0.1.0"; valid while the handle lives. NULL for NULL. */
const char *mrd_client_server_version(const mrd_client *client);

/* libmrd's own package version. */
const char *mrd_version(void);

#ifdef __cplusplus
}
#endif

#endif
