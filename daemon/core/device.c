/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "log.h"
#include "time-util.h"
#include "provider/provider.h"
#include "registration/registrar.h"
#include "core/core.h"
#include "core/device.h"
#include "core/domain.h"

static void device_fail(struct core *core, const char *reason);

/* Events of one context: all of what is pending. */
static void on_events(struct core *core, struct provider *p)
{
	struct device_watch *w = &core->device;
	struct provider_event ev;

	while (!w->failed && provider_read_event(p, &ev) == 0) {
		w->events++;
		switch (ev.kind) {
		case PROVIDER_EVENT_DEVICE_FATAL:
			device_fail(core, "DEVICE_FATAL");
			break;
		case PROVIDER_EVENT_PORT_ACTIVE:
		case PROVIDER_EVENT_PORT_DOWN:
			if (w->port_active != (ev.kind == PROVIDER_EVENT_PORT_ACTIVE))
				log_info("device %s: port %u %s", core->provider->caps.device,
					 ev.port, ev.kind == PROVIDER_EVENT_PORT_ACTIVE ?
					 "active" : "down");
			w->port_active = ev.kind == PROVIDER_EVENT_PORT_ACTIVE;
			break;
		case PROVIDER_EVENT_FOREIGN: {
			uint64_t now = now_usec(CLOCK_MONOTONIC);

			w->foreign_events++;
			if (now - w->foreign_log_usec >= 10 * USEC_PER_SEC) {
				w->foreign_log_usec = now;
				log_info("device %s: %s for an object that is not mrd's (a client "
					 "that imported a context); not acknowledged (%llu so far)",
					 core->provider->caps.device, ev.name,
					 (unsigned long long)w->foreign_events);
			}
			break;
		}
		case PROVIDER_EVENT_OTHER:
			log_debug("device %s: %s", core->provider->caps.device, ev.name);
			break;
		}
	}
}

static void on_core_events(evutil_socket_t fd, short what, void *data)
{
	struct core *core = data;

	on_events(core, core->provider);
}

static void on_domain_events(evutil_socket_t fd, short what, void *data)
{
	struct domain *d = data;

	on_events(d->core, d->reg.base.provider);
}

static int watch(struct core *core, struct provider *p, struct event **ret,
		 event_callback_fn cb, void *data)
{
	int fd = provider_event_fd(p);

	*ret = NULL;
	if (fd < 0)
		return 0;
	*ret = event_new(core->base, fd, EV_READ | EV_PERSIST, cb, data);
	if (!*ret || event_add(*ret, NULL) < 0)
		return -ENOMEM;
	return 0;
}

static void unwatch(struct event **e)
{
	if (*e)
		event_free(*e);
	*e = NULL;
}

int device_watch_domain(struct domain *d)
{
	return watch(d->core, d->reg.base.provider, &d->device_event, on_domain_events, d);
}

void device_unwatch_domain(struct domain *d)
{
	unwatch(&d->device_event);
}

/* A domain's context let go on a worker: lose waits for the op in progress there (a
 * registration holds the provider's lock for seconds, a verbs prefetch or Dma their own). The
 * job holds the domain until done. */
struct lose_job {
	struct registrar_work base;
	struct core *core;
};

static void lose_run(struct registrar_work *w)
{
	provider_lose(w->reg->provider);
}

static void lose_done(struct registrar_work *w)
{
	struct lose_job *j = (struct lose_job *)w;

	j->core->device.losing--;
	log_debug("domain %s: its context let go of the failed device", w->reg->name);
	free(j);
}

static void lose_domain(struct core *core, struct domain *d)
{
	struct lose_job *j;

	registrar_device_lost(&d->reg, core->provider->caps.device); /* until revive_commit */
	j = *d->reg.base.workers ? calloc(1, sizeof(*j)) : NULL;
	if (!j) { /* no worker (or no memory): here, as it was */
		provider_lose(d->reg.base.provider);
		return;
	}
	j->core = core;
	core->device.losing++;
	registrar_job(&d->reg, &j->base, lose_run, lose_done, true);
	j->base.key = j; /* the device's work: it waits for the op in progress, not the queue */
	registrar_submit(&j->base);
}

/* Every context lets go, before anything else: a removal waits for the last to close. Never
 * waits: each domain's provider is marked lost at once, and let go on a worker (lose_domain);
 * the core's context, which no worker uses, here. */
static void device_fail(struct core *core, const char *reason)
{
	struct device_watch *w = &core->device;
	struct domain *d;

	if (w->failed)
		return;
	w->failed = true;
	w->failures++;
	w->waiting_logged = false;
	w->since = (uint64_t)time(NULL);
	snprintf(w->reason, sizeof(w->reason), "%s", reason);
	log_warning("device %s failed (%s): its MRs are dropped and mrd's contexts on it closed; "
		    "mrd reopens it when it returns", core->provider->caps.device, reason);
	LIST_FOREACH(d, &core->domains, link) {
		/* Published before the keys die here (what the device took already, it took). */
		domain_bump_generation(d);
		device_unwatch_domain(d);
		lose_domain(core, d);
		domain_update_status(d);
	}
	unwatch(&w->event);
	provider_lose(core->provider);
}

/* Every domain's context came back (none still lost): clients refetch every key. Else all or
 * none: those made again let go (on workers again), so the next tick (or the device's removal,
 * which waits for every context) finds each as the failure left it. */
static void revive_commit(struct core *core)
{
	struct device_watch *w = &core->device;
	struct domain *d, *e;

	LIST_FOREACH(d, &core->domains, link)
		if (provider_lost(d->reg.base.provider)) {
			LIST_FOREACH(e, &core->domains, link)
				lose_domain(core, e);
			provider_lose(core->provider);
			return;
		}
	LIST_FOREACH(d, &core->domains, link) {
		registrar_device_back(&d->reg);
		domain_pd_replaced(d);
		domain_bump_generation(d);
		domain_update_status(d);
		if (device_watch_domain(d) < 0)
			log_warning("domain %s: cannot watch device events", d->name);
	}
	if (watch(core, core->provider, &w->event, on_core_events, core) < 0)
		log_warning("cannot watch device events");
	w->failed = false;
	w->returns++;
	w->port_active = core->provider->caps.port_active;
	log_info("device %s is back: every domain serves again", core->provider->caps.device);
}

/* A domain's context made again on a worker: verbs registers each of its MRs again (one
 * ibv_reg_mr_iova2 each, pinning anew: seconds for GiBs), which the loop must not wait for.
 * The job holds the domain until done; the last one done commits (revive_commit). */
struct revive_job {
	struct registrar_work base;
	struct core *core;
	/* Written by the worker, read on the loop after it. */
	struct {
		int result;
	} rt;
};

static void revive_log(struct core *core, const char *domain, int r)
{
	if (r < 0)
		log_warning_errno(r, "device %s: domain %s cannot open it again: %m",
				  core->provider->caps.device, domain);
}

static void revive_run(struct registrar_work *w)
{
	struct revive_job *j = (struct revive_job *)w;

	j->rt.result = provider_revive(w->reg->provider);
}

static void revive_ended(struct core *core)
{
	/* mrd stops: the pool runs the last jobs to their end, and no more may start */
	if (--core->device.reviving == 0 && !__atomic_load_n(&core->stopping, __ATOMIC_ACQUIRE))
		revive_commit(core);
}

static void revive_done(struct registrar_work *w)
{
	struct revive_job *j = (struct revive_job *)w;
	struct core *core = j->core;

	revive_log(core, w->reg->name, j->rt.result);
	free(j);
	revive_ended(core);
}

static void revive_domain(struct core *core, struct domain *d)
{
	struct revive_job *j = *d->reg.base.workers ? calloc(1, sizeof(*j)) : NULL;

	if (!j) { /* no worker (or no memory): here, as it was */
		revive_log(core, d->name, provider_revive(d->reg.base.provider));
		return;
	}
	j->core = core;
	core->device.reviving++;
	registrar_job(&d->reg, &j->base, revive_run, revive_done, true);
	j->base.key = j; /* the device's work: clients wait for every domain's */
	registrar_submit(&j->base);
}

/* The device is back: each context made again (the core's here: it holds no client's MR;
 * each domain's on a worker), and once all are, clients refetch every key. */
static void device_return(struct core *core)
{
	struct device_watch *w = &core->device;
	struct domain *d;
	int r;

	if (w->losing > 0 || w->reviving > 0)
		return; /* a context still lets go, or is being made again */
	/* Runs quarantined because their dereg failed go back first: a lost MR's dereg succeeds
	 * (the kernel freed it), and one revived would pin the freed run again with a live key. */
	LIST_FOREACH(d, &core->domains, link)
		(void)registrar_retry_quarantine(&d->reg);
	r = provider_revive(core->provider);
	if (r < 0) {
		if (!w->waiting_logged)
			log_info("device %s: not back yet (%s); trying again each second",
				 core->provider->caps.device, strerror(-r));
		w->waiting_logged = true;
		return;
	}
	w->reviving++; /* none commits before every job started */
	LIST_FOREACH(d, &core->domains, link)
		revive_domain(core, d);
	revive_ended(core);
}

static void on_tick(evutil_socket_t fd, short what, void *data)
{
	struct core *core = data;

	if (!core->device.failed && provider_gone(core->provider))
		device_fail(core, "removed");
	else if (core->device.failed)
		device_return(core);
}

int device_watch_start(struct core *core)
{
	static const struct timeval second = { 1, 0 };
	struct device_watch *w = &core->device;

	w->port_active = core->provider->caps.port_active;
	w->timer = event_new(core->base, -1, EV_PERSIST, on_tick, core);
	if (!w->timer || event_add(w->timer, &second) < 0)
		return -ENOMEM;
	return watch(core, core->provider, &w->event, on_core_events, core);
}

void device_watch_stop(struct core *core)
{
	unwatch(&core->device.event);
	unwatch(&core->device.timer);
}

int device_check(const struct core *core, char *why, size_t why_size)
{
	if (!core->device.failed)
		return 0;
	snprintf(why, why_size, "device %s failed (%s); mrd reopens it when it returns",
		 core->provider->caps.device, core->device.reason);
	return -ENODEV;
}
