/* SPDX-License-Identifier: MIT */
/* In-process daemon for tests: a manager without a listener, clients on socketpairs with
 * chosen credentials, and helpers that send requests and wait for replies. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

struct client;
struct manager;

extern struct manager *td_manager;

/* Starts td_manager with the given "section.key=value" settings (NULL-terminated list). */
void td_start(const char *const *settings);
void td_stop(void);

/* A client of td_manager with this identity; returns the test's end of the socketpair. */
int td_add_client(uid_t uid, gid_t gid, struct client **ret);
/* td_add_client plus a successful Hello. */
int td_hello_client(uid_t uid, struct client **ret);

void td_pump(void);

void td_send_frame(int fd, const void *data, size_t len, const int *fds, size_t n_fds);
void td_send_request(int fd, Mrd__Request *req, const int *fds, size_t n_fds);

/* Runs the loop until a reply arrives; NULL at end of stream. Descriptors that came with it go
 * to fds (closed when fds is NULL); *n_fds says how many. */
Mrd__Response *td_recv_reply(int fd, int *fds, size_t *n_fds);

/* The next reply must have this id and status (a positive errno, 0 for success). */
Mrd__Response *td_expect(int fd, uint64_t id, int error);
Mrd__Response *td_expect_fds(int fd, uint64_t id, int error, int *fds, size_t *n_fds);
void td_expect_free(int fd, uint64_t id, int error);

/* Alloc of size bytes that must succeed; returns the address (any memfd is closed). */
uint64_t td_alloc(int fd, uint64_t id, uint64_t size);
/* The same with AllocFlags. */
uint64_t td_alloc_flags(int fd, uint64_t id, uint64_t size, uint32_t flags);
/* Free of addr; its reply must carry error (a positive errno, 0 for success). */
void td_free(int fd, uint64_t id, uint64_t addr, int error);
