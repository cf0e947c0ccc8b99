/* SPDX-License-Identifier: MIT */
/* The continuation of a request whose answer waits: for a registration a worker makes, a
 * mempool MR, prefetch work or a free. Nothing of the cache, so that the requests' layer
 * (control/dispatch.h) embeds it without knowing how registration works. */
#pragma once

#include "mr-table.h"

struct waiter {
	/* On the loop, once: result 0 with entry, or -errno with why. */
	void (*resume)(struct waiter *w, int result, const struct mr_entry *entry,
		       const char *why);
	unsigned loop_registrations; /* its request's made on the loop (registrar_loop_may) */
};
