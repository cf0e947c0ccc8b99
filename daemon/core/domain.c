/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "log.h"
#include "macro.h"
#include "base/process.h"
#include "provider/provider.h"
#include "memory/arena.h"
#include "registration/bound-pd.h"
#include "core/core.h"
#include "core/domain.h"

static struct domain *domain_free(struct domain *d)
{
	if (!d)
		return NULL;
	/* Clients are gone by now, and with them their allocations and MRs. */
	if (d->aging_timer)
		event_free(d->aging_timer);
	if (d->leave_event)
		event_free(d->leave_event);
	device_unwatch_domain(d);
	free(d->exported_to);
	registrar_close(&d->reg);
	memory_done(&d->mem);
	LIST_REMOVE(d, link);
	d->core->n_domains--;
	free(d);
	return NULL;
}

static void on_aging_tick(evutil_socket_t fd, short what, void *data)
{
	struct domain *d = data;
	struct provider_mr **handles;
	size_t n;

	if (d->reg.base.destroy_jobs > 0)
		return; /* one round at a time */
	n = frmr_pools_age(&d->reg.base.pools, &handles);
	registrar_destroy_handles(&d->reg, handles, n);
}

size_t domain_flush(struct domain *d, bool pools, bool gc, unsigned *ret_pools_removed)
{
	struct provider_mr **handles = NULL;
	size_t n = 0;

	*ret_pools_removed = 0;
	/* The device may take back now what it kept of freed runs (registrar.h). */
	(void)registrar_retry_quarantine(&d->reg);
	mr_cache_flush(&d->reg.cache);
	domain_bump_generation(d);
	domain_update_status(d);
	if (pools || gc)
		n = frmr_pools_drain(&d->reg.base.pools, gc, &handles, ret_pools_removed);
	registrar_destroy_handles(&d->reg, handles, n);
	return n;
}

int domains_flush(struct core *core, const char *name, bool pools, bool gc,
		  struct flush_counts *ret)
{
	struct domain *d;

	*ret = (struct flush_counts){ 0 };
	LIST_FOREACH(d, &core->domains, link) {
		unsigned removed;

		if (name && strcmp(name, d->name) != 0)
			continue;
		ret->handles += domain_flush(d, pools, gc, &removed);
		ret->pools_removed += removed;
		ret->domains++;
	}
	return name && ret->domains == 0 ? -ENOENT : 0;
}

int domains_set_pools(struct core *core, const char *name, const struct frmr_match *match,
		      int64_t aging_s, int64_t pinned, unsigned *ret_changed)
{
	bool every = !name || !*name;
	struct domain *d;

	*ret_changed = 0;
	/* Checked here too: with no domain open nothing else would, and the defaults change. */
	if (frmr_pools_check_settings(aging_s, pinned) < 0)
		return -EINVAL;
	LIST_FOREACH(d, &core->domains, link) {
		int n;

		if (!every && strcmp(name, d->name) != 0)
			continue;
		n = frmr_pools_set(&d->reg.base.pools, match, aging_s, pinned);
		if (n < 0)
			return n;
		*ret_changed += (unsigned)n;
		if (!every)
			return 0;
	}
	if (!every)
		return -ENOENT;
	if (memcmp(match, &FRMR_MATCH_ANY, sizeof(*match)) == 0) {
		/* Every pool: domains opened later start with it too. */
		if (aging_s >= 0)
			core->config.pools.aging_s = (unsigned)aging_s;
		if (pinned >= 0)
			core->config.pools.pinned = (unsigned)pinned;
	}
	return 0;
}

/* Once a second: aging is in whole seconds, and a tick that finds nothing costs a lock. */
static int aging_start(struct domain *d)
{
	static const struct timeval second = { 1, 0 };

	d->aging_timer = event_new(d->core->base, -1, EV_PERSIST, on_aging_tick, d);
	if (!d->aging_timer)
		return -ENOMEM;
	return event_add(d->aging_timer, &second) < 0 ? -ENOMEM : 0;
}

static struct domain *domain_find(struct core *core, const char *name)
{
	struct domain *d;

	LIST_FOREACH(d, &core->domains, link)
		if (strcmp(d->name, name) == 0)
			return d;
	return NULL;
}

/* The registrar's news (registration/registrar.h). */
static void on_hold(void *data)
{
	domain_ref(data);
}

static void on_unhold(void *data)
{
	domain_unref(data);
}

static void on_changed(void *data)
{
	domain_update_status(data);
}

/* The last pool MR over ra went: it goes too once its owner left before the pools did (one
 * waiting for its owner after a warm restart stays). */
static void on_allocation_idle(void *data, struct reg_allocation *ra)
{
	if (!ra->mem.owner && !ra->mem.orphan)
		(void)domain_free_allocation(data, &ra->mem, NULL);
}

/* A big run is back from the worker that punched it: the free is answered now, so the quota
 * the client sees is exact when it hears. */
struct punched {
	struct domain *domain;
	struct waiter *waiter;
};

static void on_punched(void *arg)
{
	struct punched p = *(struct punched *)arg;

	free(arg);
	domain_update_status(p.domain);
	p.waiter->resume(p.waiter, 0, NULL, "");
	domain_unref(p.domain); /* the job's hold: d may close here */
}

/* Where every free ends, whichever way it went: the device let go of the pages, so they go
 * back, and the free is answered. A client's Free (a waiter) of a big run has a worker punch
 * it, holding the domain; frees nobody waits for (a client or an orphan gone) stay here, as
 * whoever counts on them being done at once (the domain closing) expects. */
static int on_released(void *data, struct reg_allocation *ra, struct waiter *waiter)
{
	struct domain *d = data;
	struct punched *p = waiter ? malloc(sizeof(*p)) : NULL;
	int k;

	if (p) {
		*p = (struct punched){ .domain = d, .waiter = waiter };
		domain_ref(d);
	}
	k = allocation_release(&d->mem, &ra->mem, p ? on_punched : NULL, p);
	free(ra);
	if (k == -EINPROGRESS)
		return k;
	if (p) {
		d->n_job_refs--; /* no job took the hold: d stays as its caller holds it */
		free(p);
	}
	domain_update_status(d);
	return 0;
}

/* Above what the previous mrd's domain of that name reached (warm restart). */
static uint64_t first_generation(const struct core *core, const char *name)
{
	uint64_t generation = 1;

	for (size_t i = 0; i < core->n_floors; i++)
		if (strcmp(core->floors[i].name, name) == 0)
			generation = core->floors[i].generation + 1;
	return generation;
}

/* Its id is free again: the core's owner forgets it. */
static void on_arena_gone(void *data, uint32_t arena_id)
{
	struct domain *d = data;

	if (d->core->arena_gone)
		d->core->arena_gone(d->core, arena_id);
}

static void on_leave_turn(evutil_socket_t fd, short what, void *data);

/* A new domain, held by nobody yet. */
static int domain_open(struct core *core, const char *name, struct domain **ret)
{
	struct domain *d;
	int r;

	if (core->device.failed)
		return -ENODEV; /* its context would be on a device mrd let go of */
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	snprintf(d->name, sizeof(d->name), "%s", name);
	d->core = core;
	LIST_INSERT_HEAD(&core->domains, d, link);
	core->n_domains++;
	config_quota_for(&core->config, d->name, &d->quota);
	memory_init(&d->mem, &core->config, &d->quota, &core->window, d->name);
	d->mem.arena_gone = on_arena_gone;
	d->mem.data = d;
	d->mem.workers = &core->workers;
	d->mem.stopping = &core->stopping;
	d->mem.closer = &core->closer;
	reg_owner_init(&d->leaving, 0, 0, 0);
	d->reg = (struct registrar){ .base = {
		.config = &core->config, .quota = &d->quota, .name = d->name, .mem = &d->mem,
		.workers = &core->workers, .stopping = &core->stopping,
		.host_pinned = &core->pinned_bytes,
		.events = { .hold = on_hold, .unhold = on_unhold,
			    .allocation_idle = on_allocation_idle, .released = on_released,
			    .changed = on_changed },
		.data = d,
	} };

	/* Its own context on the device mrd opened at start. */
	r = registrar_open(&d->reg, core->provider, config_policy_for(&core->config, name),
			   (uintptr_t)core->window.base);
	if (r >= 0) {
		d->leave_event = evtimer_new(core->base, on_leave_turn, d);
		r = d->leave_event ? 0 : -ENOMEM;
	}
	if (r >= 0 && !d->reg.base.pools.off)
		r = aging_start(d);
	if (r >= 0)
		r = device_watch_domain(d);
	if (r >= 0)
		r = status_page_open(&d->mem.status, d->name, first_generation(core, name));
	if (r < 0) {
		log_warning_errno(r, "cannot open domain %s on %s: %m", name,
				  core->provider->caps.device);
		domain_free(d);
		return r;
	}
	log_debug("domain %s opened on %s", name, core->provider->caps.device);
	*ret = d;
	return 0;
}

int domain_acquire(struct core *core, const char *name, struct domain **ret, char *why,
		   size_t why_size)
{
	struct domain *d = domain_find(core, name);
	int r;

	if (d && d->n_users >= d->quota.clients)
		return config_quota_refusal(&core->config, &d->quota, QUOTA_CLIENTS, name,
					    d->n_users, 1, why, why_size);
	if (!d) {
		r = domain_open(core, name, &d);
		if (r < 0)
			return r;
	}
	d->n_users++;
	domain_update_status(d);
	*ret = d;
	return 0;
}

int domain_adopt(struct core *core, const char *name, uint64_t allocation_serial,
		 uint64_t frees, struct domain **ret)
{
	struct domain *d;
	int r;

	if (domain_find(core, name))
		return -EEXIST;
	r = domain_open(core, name, &d);
	if (r < 0)
		return r;
	memory_adopt(&d->mem, allocation_serial, frees);
	d->adopted = true;
	domain_ref(d);
	*ret = d;
	return 0;
}

void domains_resolve_quotas(struct core *core)
{
	struct domain *d;

	LIST_FOREACH(d, &core->domains, link)
		config_quota_for(&core->config, d->name, &d->quota);
}

static struct domain *close_when_unheld(struct domain *d)
{
	if (d->n_users == 0 && d->n_job_refs == 0) {
		log_debug("domain %s closed", d->name);
		domain_free(d);
	} else
		domain_update_status(d);
	return NULL;
}

struct domain *domain_release(struct domain *d)
{
	if (!d)
		return NULL;
	d->n_users--;
	return close_when_unheld(d);
}

struct domain *domain_unref(struct domain *d)
{
	d->n_job_refs--;
	return close_when_unheld(d);
}

/* Forgets the holders whose process is gone: only running ones can hold the context. */
static void forget_gone_holders(struct domain *d)
{
	size_t kept = 0;

	for (size_t i = 0; i < d->n_exported_to; i++) {
		const struct context_holder *h = &d->exported_to[i];

		if (!process_gone((pid_t)h->pid, h->uid, h->start_time))
			d->exported_to[kept++] = *h;
	}
	d->n_exported_to = kept;
}

int domain_note_export(struct domain *d, const struct context_holder *h)
{
	struct context_holder *to;

	for (size_t i = 0; i < d->n_exported_to; i++)
		if (d->exported_to[i].pid == h->pid && d->exported_to[i].start_time == h->start_time)
			return 0;
	/* Each process that asks once would stay: the gone ones go whenever the list doubled
	 * since the last look (a /proc read each, amortized over the asks), and at the bound. */
	if (d->n_exported_to >= d->exported_check_at || d->n_exported_to >= DOMAIN_HOLDERS_MAX) {
		forget_gone_holders(d);
		d->exported_check_at = d->n_exported_to < 8 ? 16 : 2 * d->n_exported_to;
	}
	if (d->n_exported_to >= DOMAIN_HOLDERS_MAX)
		return -EUSERS;
	to = reallocarray(d->exported_to, d->n_exported_to + 1, sizeof(*to));
	if (!to)
		return -ENOMEM;
	d->exported_to = to;
	d->exported_to[d->n_exported_to++] = *h;
	return 0;
}

void domain_pd_replaced(struct domain *d)
{
	/* They hold the failed context, which no hand-over has to keep alive for them. */
	d->n_exported_to = 0;
	status_page_bump_pd_epoch(&d->mem.status);
}

void domain_update_status(struct domain *d)
{
	struct mrd_status_page *s = d->mem.status.page;

	if (!s)
		return;
	memory_update_status(&d->mem);
	s->pinned_bytes = d->reg.cache.charges.pinned_bytes;
	s->clients = d->n_users;
}

/* A fresh allocation record, with registration's part ready. */
static struct reg_allocation *reg_allocation_new(void)
{
	struct reg_allocation *ra = calloc(1, sizeof(*ra));

	if (ra)
		reg_allocation_init(ra);
	return ra;
}

int domain_alloc(struct domain *d, struct reg_owner *owner, uint64_t size, uint64_t align,
		 enum page_pick pick, bool odp, bool read_only, struct allocation **ret, char *why,
		 size_t why_size)
{
	struct reg_allocation *ra = reg_allocation_new();
	int r;

	if (!ra)
		return -ENOMEM;
	r = allocation_alloc(&d->mem, &ra->mem, &owner->mem, size, align, pick, why,
			     why_size);
	if (r < 0) {
		free(ra);
		return r;
	}
	/* On demand where the device pages on demand over RC for all the memory takes; elsewhere as
	 * the policy says. */
	allocation_set_kind(&ra->mem,
			    registrar_on_demand(&d->reg, odp || d->reg.cache.policy == MR_POLICY_ODP,
						read_only),
			    read_only);
	domain_update_status(d);
	*ret = &ra->mem;
	return 0;
}

int domain_attach_external(struct domain *d, struct reg_owner *owner, int fd, uint64_t offset,
			   uint64_t length, struct allocation **ret, char *why, size_t why_size)
{
	struct reg_allocation *ra = reg_allocation_new();
	int r;

	if (!ra)
		return -ENOMEM;
	r = allocation_attach(&d->mem, &ra->mem, &owner->mem, fd, offset, length, why, why_size);
	if (r < 0) {
		free(ra);
		return r;
	}
	allocation_set_kind(&ra->mem, registrar_on_demand(&d->reg,
							  d->reg.cache.policy == MR_POLICY_ODP, false),
			    false);
	domain_update_status(d);
	*ret = &ra->mem;
	return 0;
}

int domain_adopt_allocation(struct domain *d, struct arena *arena,
			    const struct adopted_allocation *saved)
{
	struct reg_allocation *ra = reg_allocation_new();
	int r;

	if (!ra)
		return -ENOMEM;
	r = allocation_adopt(&d->mem, &ra->mem, arena, saved);
	if (r < 0) {
		free(ra);
		return r;
	}
	allocation_set_kind(&ra->mem, registrar_on_demand(&d->reg, saved->odp, saved->read_only),
			    saved->read_only);
	domain_update_status(d);
	return 0;
}

unsigned domain_reap_orphans(struct domain *d, bool all)
{
	struct allocation *a, *next;
	unsigned freed = 0;

	if (!d->adopted)
		return 0;
	for (a = LIST_FIRST(&d->mem.orphans); a; a = next) {
		next = LIST_NEXT(a, owner_link);
		/* While its process lives it still maps the memory: freeing it would hand pages it
		 * may write to somebody else. */
		if (!all && !process_gone(a->claim_pid, a->claim_uid, a->claim_start_time))
			continue;
		allocation_unorphan(&d->mem, a);
		if (reg_allocation_of(a)->pool_refs > 0)
			continue; /* others' mempools hold it: it goes with the last of them */
		(void)domain_free_allocation(d, a, NULL);
		freed++;
	}
	if (freed && !all)
		log_info("domain %s: freed %u allocation(s) of the previous mrd whose process is gone",
			 d->name, freed);
	if (d->mem.n_orphans > 0)
		return d->mem.n_orphans;
	d->adopted = false;
	domain_unref(d);
	return 0;
}

int domain_free_allocation(struct domain *d, struct allocation *a, struct waiter *waiter)
{
	/* From here on no lookup finds it. */
	allocation_retire(&d->mem, a);
	/* Then its keys die (the generation moves when it had any) and the device lets go:
	 * on_released ends it. */
	return registrar_retire(&d->reg, reg_allocation_of(a), waiter);
}

void domain_drop_allocation(struct domain *d, struct allocation *a)
{
	if (reg_allocation_of(a)->pool_refs == 0) {
		(void)domain_free_allocation(d, a, NULL);
		return;
	}
	allocation_disown(a);
}

static bool leaving_none(const struct domain *d)
{
	return !bound_pds_leaving(&d->reg.cache) && LIST_EMPTY(&d->leaving.pools) &&
	       LIST_EMPTY(&d->leaving.mem.allocations) && !d->retry_quarantine;
}

/* A share of what clients that left own goes (all of it with all): the MRs of their own PDs
 * (each PD let go after its last), their mempools' MRs (they hold the allocations they cover),
 * then the allocations, while the loop's budget (registrar_loop_may) allows, and at least one
 * of them, so that the leaving ends however busy the loop is. The rest waits for the next
 * turn. Once none is left, the hold goes (d may close). */
static void leave_share(struct domain *d, bool all)
{
	static const struct timeval next_turn = { 0, 0 }, worker_turn = { 0, 10000 };
	const struct timeval *turn = &next_turn;
	unsigned made = 0, dropped = 0;
	struct allocation *a;
	bool bound_done;

	if (leaving_none(d))
		return; /* no hold either */
	bound_done = bound_pds_leave_share(&d->reg.cache, all, &made, &dropped);
	d->retry_quarantine |= dropped > 0;
	if (!bound_done) {
		if (bound_pds_wait_worker(&d->reg.cache))
			turn = &worker_turn; /* a registration may take seconds */
		goto wait;
	}
	/* A window a client left bound may have made a free of its process's other connection
	 * (the preload shim's memory) quarantine the run: the device lets go of it now, once
	 * no worker holds the providers (registrar_retry_quarantine() would not wait); the
	 * leave goes on meanwhile, and ends only after it. */
	if (d->retry_quarantine && (all || !registrar_busy(&d->reg))) {
		d->retry_quarantine = false;
		(void)registrar_retry_quarantine(&d->reg);
	}
	if (!mempool_leave_share(&d->reg.mempools, &d->leaving, all, &made))
		goto wait;
	while ((a = LIST_FIRST(&d->leaving.mem.allocations))) {
		if (!all && made > 0 && !registrar_loop_may(&d->reg, made, a->length))
			goto wait;
		registrar_loop_did(&d->reg, a->length);
		domain_drop_allocation(d, a);
		made++;
	}
	if (d->retry_quarantine) {
		turn = &worker_turn;
		goto wait;
	}
	event_del(d->leave_event);
	domain_unref(d);
	return;
wait:
	if (event_add(d->leave_event, turn) < 0)
		leave_share(d, true); /* cannot wait: all of it now */
}

static void on_leave_turn(evutil_socket_t fd, short what, void *data)
{
	leave_share(data, false);
}

void domain_leave(struct domain *d, struct reg_owner *owner, struct bound_pd *bound)
{
	struct allocation *a;

	odp_forget_owner(&d->reg.odp, owner);
	if (!bound && LIST_EMPTY(&owner->pools) && LIST_EMPTY(&owner->mem.allocations))
		return;
	if (leaving_none(d))
		domain_ref(d);
	if (bound)
		bound_pd_leave(bound);
	mempool_give_all(&d->reg.mempools, owner, &d->leaving);
	while ((a = LIST_FIRST(&owner->mem.allocations)))
		allocation_give(a, &d->leaving.mem);
	leave_share(d, false);
}

void domains_finish_leaving(struct core *core)
{
	struct domain *d, *next;

	for (d = LIST_FIRST(&core->domains); d; d = next) {
		next = LIST_NEXT(d, link);
		/* No window is handed over: a context kept after this mrd (a holder's) would keep
		 * its rkeys alive with nobody left to revoke them. */
		mw_grants_done(&d->reg.windows);
		leave_share(d, true); /* may close d */
	}
}

/* -EACCES when address is a program's buffer moved onto mrd's memory (an alias) and asker is
 * not that program: its MRs use that process's addresses alone (bound PDs check their own). */
static int check_asker(struct domain *d, struct bound_pd *bound, pid_t asker, uint64_t address,
		       char *why, size_t why_size)
{
	const struct allocation *a = bound ? NULL : domain_allocation_containing(d, address);

	if (a && a->alias && (!a->owner || a->owner->pid != asker)) {
		snprintf(why, why_size, "0x%" PRIx64 " is memory process %d maps at 0x%" PRIx64
			 " (mrd_mem_adopt): only that process gets its keys", address,
			 a->owner ? a->owner->pid : 0, a->alias + (address - allocation_address(a)));
		return -EACCES;
	}
	return 0;
}

int domain_dma_check(struct domain *d, pid_t asker, uint32_t lkey, char *why, size_t why_size)
{
	const struct cached_mr *mr = mr_cache_by_lkey(&d->reg.cache, lkey);
	const struct allocation *a = mr && mr->allocation ? &mr->allocation->mem : NULL;

	/* As check_asker: an adopted buffer's keys are its process's alone. */
	if (a && a->alias && (!a->owner || a->owner->pid != asker)) {
		snprintf(why, why_size, "lkey 0x%" PRIx32 " is of a buffer process %d adopted "
			 "(mrd_mem_adopt): only that process moves its bytes", lkey,
			 a->owner ? a->owner->pid : 0);
		return -EACCES;
	}
	return 0;
}

int domain_lookup(struct domain *d, struct bound_pd *bound, pid_t asker, uint64_t address,
		  struct mr_entry *ret, char *why, size_t why_size, struct waiter *waiter)
{
	int k = check_asker(d, bound, asker, address, why, why_size);

	if (k < 0)
		return k;
	if (bound)
		return bound_pd_lookup(bound, address, ret, why, why_size, waiter);
	return registrar_lookup(&d->reg, address, ret, why, why_size, waiter);
}

int domain_lookup_range(struct domain *d, struct bound_pd *bound, pid_t asker, uint64_t address,
			uint64_t length, struct mr_entry *ret, char *why, size_t why_size,
			struct waiter *waiter)
{
	int k = check_asker(d, bound, asker, address, why, why_size);

	if (k < 0)
		return k;
	if (bound)
		return bound_pd_lookup_range(bound, address, length, ret, why, why_size, waiter);
	return registrar_lookup_range(&d->reg, address, length, ret, why, why_size, waiter);
}

int domain_register_now(struct domain *d, struct bound_pd *bound, const struct allocation *a,
			struct mr_entry *ret, char *why, size_t why_size)
{
	if (registrar_offload(&d->reg, a->length) || (bound && bound->cache.pending_bytes > 0))
		return -EAGAIN;
	return domain_lookup(d, bound, a->owner ? a->owner->pid : 0, allocation_address(a), ret, why,
			     why_size, NULL);
}

int domain_dma(struct domain *d, enum provider_dma_op op, uint32_t lkey, uint64_t laddr,
	       uint32_t rkey, uint64_t raddr, uint64_t length)
{
	return provider_dma(d->reg.base.pd, op, lkey, laddr, rkey, raddr, length);
}
