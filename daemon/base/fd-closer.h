/* SPDX-License-Identifier: MIT */
/* The one way mrd lets go of a descriptor a client gave it. Closing one can block for as long
 * as the client likes (a TCP socket lingering over unsent data, one in flight inside a Unix
 * socket, a file whose FUSE server never answers FLUSH), and the last close of a filled memfd
 * frees its pages (seconds for GiBs), so none is closed on the loop: each user's descriptors
 * wait in a lane of their own, and closer threads serve the lanes in turn, one descriptor of a
 * lane at a time. A close that never returns holds its own user's lane and one thread, never
 * another user's descriptors. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

struct fd_closer;

/* Descriptors of one uid waiting to be closed (queued or in a close() that has not returned)
 * past which that uid's clients that send more are dropped and its new connections refused;
 * the closers themselves take no more out of that uid's Unix sockets past it. As many as
 * [limits] clients_per_user's default: a user's whole job leaving at once stays under it. */
#define FD_CLOSER_UID_MAX 256u
/* Closer threads that are not stuck, at most, started as lanes need them. */
#define FD_CLOSER_THREADS 64u
/* Threads at most, stuck ones too: a close that has not returned after the stuck time no
 * longer counts against FD_CLOSER_THREADS, so users whose closes hang (one thread each: a
 * lane has one close in flight) never leave the next user without a thread — until this
 * many distinct users hang one each (a stuck thread costs its small stack, little else). */
#define FD_CLOSER_THREADS_MAX 1024u
/* stuck_usec: how long a close runs before it counts as stuck. */
int fd_closer_new(uint64_t stuck_usec, struct fd_closer **ret);
/* Lets the threads close what waits, for at most a second or two; threads still stuck in a
 * close() then are left to the process's exit (with what they use). NULL-safe. */
struct fd_closer *fd_closer_free(struct fd_closer *fc);

/* Takes fd, which came from a client of uid, and closes it without blocking the caller, on a
 * closer thread. Never fails. fd < 0: nothing. */
void fd_closer_consume(struct fd_closer *fc, int fd, uid_t uid);
/* The same for a descriptor of mrd's own memory (an arena's memfd): its close blocks on no
 * one, but frees pages for as long as that takes. Its lane is no user's. */
void fd_closer_consume_own(struct fd_closer *fc, int fd);
/* The same for a connection's own socket (AF_UNIX, SOCK_SEQPACKET), which it shuts down first.
 * One that holds no descriptor in flight (nothing queued, or bytes alone) closes here at once:
 * its close releases no file. One that does waits in uid's lane, full or not: what it holds
 * stays charged by the kernel to the user who sent it (RLIMIT_NOFILE of its in-flight
 * descriptors), which bounds how many such sockets one user can leave mrd. */
void fd_closer_consume_socket(struct fd_closer *fc, int fd, uid_t uid);
/* The same for every descriptor left in pkt (handlers take what they keep). */
void fd_closer_consume_packet(struct fd_closer *fc, struct wire_packet *pkt, uid_t uid);

/* Descriptors of uid waiting to be closed. */
unsigned fd_closer_waiting(struct fd_closer *fc, uid_t uid);
/* Whether uid's lane holds FD_CLOSER_UID_MAX: that uid adds no more (callers exempt root where
 * an administrator must get in). */
bool fd_closer_lane_full(struct fd_closer *fc, uid_t uid);

/* Waits at most timeout_usec for every lane to empty (before an exec, which would close what
 * waits itself, on the loop's thread, and cannot finish while a thread is stuck in a close).
 * -EBUSY when one did not, with its uid (or *ret_own: mrd's own memory) and how many of its
 * descriptors wait. */
int fd_closer_quiesce(struct fd_closer *fc, uint64_t timeout_usec, bool *ret_own,
		      uid_t *ret_uid, unsigned *ret_waiting);
