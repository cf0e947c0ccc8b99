/* SPDX-License-Identifier: MIT */
/* What every domain shares: the configuration, the loop, the device, the address window, the
 * worker threads and the list of open domains. The manager (control/) embeds it; core and the
 * layers below see nothing else of the daemon. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "base/config.h"
#include "memory/window.h"
#include "core/device.h"
#include "core/served-devices.h"

struct fd_closer;

struct domain;
struct event_base;
struct provider;
struct worker_pool;

/* The previous mrd's generation of a domain it had: a domain opened again starts above it, so
 * no client's cached keys can look current. */
struct generation_floor {
	char name[64];
	uint64_t generation;
};

struct core {
	struct config config;
	struct event_base *base;
	/* Opened at start to check the configuration and answer Status; each domain opens its
	 * own context on the same device. */
	struct provider *provider;
	struct device_watch device; /* its lifecycle (core/device.h) */
	struct served_devices served; /* what clients may bind (core/served-devices.h) */
	struct window window; /* every arena of every domain lives here */
	struct worker_pool *workers; /* slow registrations */
	/* One thread for Dma on a device (request-mr.c), made on first use: a transfer waits for
	 * the device, and Dma must never hold up the registrations of every domain. */
	struct worker_pool *dma_worker;
	bool stopping; /* set before the workers drain: queued Dma is cancelled, not done */
	struct generation_floor *floors;
	size_t n_floors;
	LIST_HEAD(, domain) domains;
	unsigned n_domains;
	uint64_t pinned_bytes; /* what every domain pins, together (limits.pinned_bytes) */
	/* An arena went away: whoever hands arenas out (the manager's clients) forgets its id,
	 * since ids are reused. NULL: nobody to tell. */
	void (*arena_gone)(struct core *core, uint32_t arena_id);
	/* The manager's (every descriptor from a client, and every arena's memfd): NULL before
	 * it starts and after it stopped. */
	struct fd_closer *closer;
};
