/* SPDX-License-Identifier: MIT */
/* The one way mrd lets go of a descriptor a client gave it. Closing one can block for as long
 * as the client likes (a TCP socket lingering over unsent data, one in flight inside a Unix
 * socket, a file whose FUSE server never answers FLUSH), so all but memfds are closed on
 * threads of their own, never on the loop. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

#include "wire.h"

struct fd_closer;

/* Descriptors waiting to be closed (queued or in a close() that has not returned). Past
 * FD_CLOSER_UID_MAX of one uid, that uid's clients that send more (but memfds) are dropped;
 * past FD_CLOSER_MAX in all, so is anyone's, and mrd accepts no connection until the closers
 * catch up. */
#define FD_CLOSER_UID_MAX 64u
#define FD_CLOSER_MAX 1024u
/* Closer threads, started as needed: one close that never returns holds up only its own. */
#define FD_CLOSER_THREADS 4u

int fd_closer_new(struct fd_closer **ret);
/* Lets the threads close what waits, for at most a second or two; threads still stuck in a
 * close() then are left to the process's exit (with what they use). NULL-safe. */
struct fd_closer *fd_closer_free(struct fd_closer *fc);

/* Whether fd closes at once, without a thread (a memfd), so it counts against no bound. */
bool fd_closer_quick(int fd);

/* Takes fd, which came from a client of uid, and closes it without blocking the caller: a
 * memfd at once, anything else on a closer thread. Never fails. fd < 0: nothing. */
void fd_closer_consume(struct fd_closer *fc, int fd, uid_t uid);
/* The same for every descriptor left in pkt (handlers take what they keep). */
void fd_closer_consume_packet(struct fd_closer *fc, struct wire_packet *pkt, uid_t uid);

/* Descriptors of uid waiting to be closed; (uid_t)-1: of everyone. */
unsigned fd_closer_waiting(struct fd_closer *fc, uid_t uid);
