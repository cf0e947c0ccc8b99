/* SPDX-License-Identifier: MIT */
/* A client that speaks mrd's wire by hand, for suites that send what libmrd never would (more
 * descriptors than a request takes, requests left unread, Hello-less connections). Nothing
 * here asserts: forked children use it too, where a failed check would run on as a second
 * copy of the suite. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mrd.pb-c.h"

/* Sends req with n_fds descriptors (blocking): 0 or -errno. */
int raw_send(int fd, Mrd__Request *req, const int *fds, size_t n_fds);
/* The next reply's status (a positive errno) within timeout_ms (-1: no limit): -ETIMEDOUT
 * when none came, -1 at the end of the stream, -EBADMSG when it does not decode. Descriptors
 * it carried are closed. */
int raw_reply_within(int fd, int timeout_ms);
/* The next reply, whole, within timeout_ms (-1: no limit); NULL when none came or it does not
 * decode. Descriptors it carried are closed. The caller frees it (mrd__response__free_unpacked). */
Mrd__Response *raw_response_within(int fd, int timeout_ms);
/* Sends a Hello as a served client named name (its reply is the caller's to read). */
int raw_send_hello(int fd, const char *name);
/* A Ping with n_fds descriptors (a Ping takes none: mrd refuses it) and payload bytes of echo
 * (at most 60 KiB). */
int raw_send_ping(int fd, uint64_t id, const int *fds, size_t n_fds, size_t payload);
/* One byte with n descriptors (up to 253, more than any request takes): 0 or -errno. */
int raw_send_refs(int fd, const int *refs, size_t n);
