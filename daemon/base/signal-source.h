/* SPDX-License-Identifier: MIT */
/* The loop's signals read from a signalfd, as an ordinary event: they stay blocked in every
 * thread, so no handler runs wherever a thread happens to be, and none waits on a runtime
 * that defers handlers (ThreadSanitizer runs one only at its next intercepted call, and lost
 * mrd's SIGTERM that way now and then: 5 of 80 test runs hung at their first stop). */
#pragma once

#include <signal.h>

struct event_base;
struct signal_source;

typedef void (*signal_source_fn)(int sig, void *userdata);

/* Blocks set in the calling thread (threads it starts later inherit the mask; those started
 * before must block it themselves) and calls fn in base's loop for each signal of set. The
 * free gives the thread its mask back (a pending signal of set then acts as it would have). */
int signal_source_new(struct event_base *base, const sigset_t *set, signal_source_fn fn,
		      void *userdata, struct signal_source **ret);
struct signal_source *signal_source_free(struct signal_source *s);
