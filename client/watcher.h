/* SPDX-License-Identifier: MIT */
/* libmrd's watcher: one thread per process, blocked in poll() on every open handle's
 * connection, that marks a handle gone (and poisons its status page, so no thread's cached
 * lookup hands out a key) as soon as mrd hangs up, whether or not the program ever polls
 * mrd_client_fd(). It starts with the first watched handle and is joined when the last one
 * closes; a fork() child has none until it connects a handle of its own. MRD_WATCH=0 in the
 * environment of a connect leaves that handle unwatched. */
#pragma once

#include "handle.h"

/* Watches client (its descriptor number is the handle's for life). 0, or -errno when the
 * thread cannot start (the reason is set). */
int watcher_add(struct mrd_client *client);
/* Stops watching client; when it was the last, stops the thread and joins it. No-op for a
 * handle not watched. Never called with client->lock held. */
void watcher_remove(struct mrd_client *client);
/* After a reconnect put a live connection under the handle's descriptor: watch it again. */
void watcher_rearm(struct mrd_client *client);

/* fork(): the parent's state held across it; the child forgets the parent's thread. */
void watcher_fork_prepare(void);
void watcher_fork_parent(void);
void watcher_fork_child(void);
