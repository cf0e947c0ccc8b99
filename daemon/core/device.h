/* SPDX-License-Identifier: MIT */
/* The device's lifecycle (mrd(8), DEVICES): every context mrd opened on it — the core's, and
 * each domain's — has its async event fd on the loop. DEVICE_FATAL (or the device found gone:
 * a removal on rxe, siw or efa sends nothing) fails the device at once: every context is
 * marked lost (each op on it fails fast with -ENODEV), every domain's generation moves, and
 * requests that need the device are refused with -ENODEV and a message that says so; each
 * domain's context lets go of its MRs and is closed (so that a removal can end) on a worker,
 * once the op it may be in ends, for the loop never waits for one (the core's, which no
 * worker uses, at once). Events are read under the provider's event_lock, never its lock,
 * for the same reason. A timer tries to open the device again by name each second (once every
 * context let go); once it is back every context is made again, with its PDs and MRs (new
 * keys): the core's at once (it holds no client's MR), each domain's on a worker (registering
 * every MR again takes seconds for GiBs), the device failed until the last is done; then all
 * serve and the generations move again, or all let go again (on workers) for the next tick. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct core;
struct domain;
struct event;

struct device_watch {
	struct event *event; /* the core's context's async fd */
	struct event *timer; /* each second: found gone? back? */
	bool failed;
	char reason[32];     /* "DEVICE_FATAL", "removed" */
	uint64_t since;      /* realtime seconds */
	bool port_active;
	bool waiting_logged;
	/* Domains' contexts marked lost whose lose job (on a worker, behind the op in progress)
	 * has not ended: the device's return waits for them. */
	unsigned losing;
	/* Domains' contexts being made again on a worker (with their MRs): until the last is
	 * done, the device stays failed; then all of them serve, or all let go again. */
	unsigned reviving;
	uint64_t failures, returns, events, foreign_events;
	uint64_t foreign_log_usec;
};

/* On the core's provider and its loop. */
int device_watch_start(struct core *core);
void device_watch_stop(struct core *core);
/* d's context on the loop, and off it (NULL-safe on a domain never watched). */
int device_watch_domain(struct domain *d);
void device_unwatch_domain(struct domain *d);

/* 0 while the device serves; -ENODEV, with why, while it failed. */
int device_check(const struct core *core, char *why, size_t why_size);
