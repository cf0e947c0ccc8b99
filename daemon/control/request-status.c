/* SPDX-License-Identifier: MIT */
/* The views: Status, Clients and DomainDump. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "status-page.h"
#include "provider/provider.h"
#include "memory/arena.h"
#include "registration/bound-pd.h"
#include "core/domain-stats.h"
#include "core/domain.h"
#include "core/served-devices.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

/* The old contexts in view (control/old-context.h), those whose holders are all gone dropped
 * first: in one block that r owns. */
static int old_contexts_info(struct manager *m, const char *view, struct reply *r,
			     Mrd__OldContextInfo ***ret, size_t *ret_n)
{
	const struct old_context *o;
	Mrd__OldContextInfo **ptrs, *info;
	size_t n = 0, pids = 0, i = 0;
	uint32_t *pid;
	void *block;

	*ret = NULL;
	*ret_n = 0;
	old_contexts_prune(&m->old_contexts);
	LIST_FOREACH(o, &m->old_contexts, link)
		if (access_view_shows(view, o->domain)) {
			n++;
			pids += o->n_holders;
		}
	if (n == 0)
		return 0;
	block = calloc(1, n * (sizeof(*ptrs) + sizeof(*info)) + pids * sizeof(*pid));
	if (!block)
		return -ENOMEM;
	r->owned[r->n_owned++] = block;
	ptrs = block;
	info = (Mrd__OldContextInfo *)(ptrs + n);
	pid = (uint32_t *)(info + n);
	LIST_FOREACH(o, &m->old_contexts, link) {
		if (!access_view_shows(view, o->domain))
			continue;
		mrd__old_context_info__init(&info[i]);
		info[i].domain = (char *)o->domain;
		info[i].device = (char *)o->device;
		info[i].pinned_bytes = o->pinned_bytes;
		info[i].mrs = o->mrs;
		info[i].handed_over_usec = o->handed_over_usec;
		info[i].holder_pids = pid;
		for (size_t k = 0; k < o->n_holders; k++)
			pid[info[i].n_holder_pids++] = (uint32_t)o->holders[k].pid;
		pid += o->n_holders;
		ptrs[i] = &info[i];
		i++;
	}
	*ret = ptrs;
	*ret_n = n;
	return 0;
}

/* The devices clients may bind; how many are bound is no business of a one-domain view. */
static int devices_info(const struct manager *m, const char *view, struct reply *r,
			Mrd__StatusResponse *s)
{
	const struct served_devices *sd = &m->core.served;
	Mrd__DeviceInfo *di, **ptrs;

	if (sd->n == 0)
		return 0;
	di = calloc(sd->n, sizeof(*di));
	ptrs = calloc(sd->n, sizeof(*ptrs));
	if (!di || !ptrs || r->n_owned + 2 > ELEMENTSOF(r->owned)) {
		free(di);
		free(ptrs);
		return -ENOMEM;
	}
	r->owned[r->n_owned++] = di;
	r->owned[r->n_owned++] = ptrs;
	for (size_t i = 0; i < sd->n; i++) {
		const struct served_device *d = &sd->v[i];

		mrd__device_info__init(&di[i]);
		di[i].name = (char *)d->name;
		di[i].domains = strcmp(d->name, m->core.provider->caps.device) == 0;
		di[i].max_mr_size = d->caps.max_mr_size;
		di[i].odp = d->caps.odp;
		di[i].atomic = d->caps.atomic;
		di[i].port_active = d->caps.port_active;
		di[i].bound = view ? 0 : d->bound;
		ptrs[i] = &di[i];
	}
	s->devices = ptrs;
	s->n_devices = sd->n;
	return 0;
}

int request_status(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		   struct wire_packet *pkt, struct reply *r)
{
	const struct manager *m = c->manager;
	Mrd__StatusResponse *s = reply_body(r, MRD__RESPONSE__BODY_STATUS_REPLY);
	const char *view = client_view(c);
	struct view_totals t;
	/* The loop's alone, and the reply is packed before the next request. */
	static char odp_rc[64], odp_pinned[160];

	s->server_version = (char *)PACKAGE_VERSION;
	s->uptime_usec = manager_uptime_usec(m);
	s->provider = (char *)provider_name(m->core.provider);
	s->device = (char *)m->core.provider->caps.device;
	s->max_mr_size = m->core.provider->caps.max_mr_size;
	s->odp = m->core.provider->caps.odp;
	s->odp_implicit = m->core.provider->caps.odp_implicit;
	s->rereg_translation = m->core.provider->caps.rereg_translation;
	s->dma = m->core.provider->caps.dma;
	s->no_dma = (char *)(m->core.provider->caps.no_dma ? m->core.provider->caps.no_dma : "");
	s->atomic = m->core.provider->caps.atomic;
	s->mw = m->core.provider->caps.mw;
	s->no_mw = (char *)(m->core.provider->caps.no_mw ? m->core.provider->caps.no_mw : "");
	s->mw_wide = (char *)(m->core.provider->caps.mw_wide ? m->core.provider->caps.mw_wide : "");
	s->odp_rc = (char *)provider_odp_bits_name(m->core.provider->caps.odp_rc_caps, odp_rc,
						   sizeof(odp_rc));
	s->odp_pinned = (char *)provider_odp_gap(&m->core.provider->caps,
						 registration_access(false, &m->core.provider->caps),
						 odp_pinned, sizeof(odp_pinned));
	s->device_state = (char *)(m->core.device.failed ? "failed" : "ok");
	s->device_failed_since = m->core.device.failed ? m->core.device.since : 0;
	s->device_failure = (char *)(m->core.device.failed ? m->core.device.reason : "");
	s->port_active = m->core.device.port_active;
	s->device_failures = m->core.device.failures;
	s->device_returns = m->core.device.returns;
	s->foreign_events = m->core.device.foreign_events;
	s->pid = (uint32_t)getpid();
	/* Which users use mrd, and how much, is no one else's business: a user sees its own
	 * domain's figures and no daemon-wide count. */
	manager_view_totals(m, view, &t);
	s->domains = t.domains;
	s->clients = t.clients;
	s->quarantined_bytes = t.quarantined_bytes;
	s->quarantined_runs = t.quarantined_runs;
	if (old_contexts_info(c->manager, view, r, &s->old_contexts, &s->n_old_contexts) < 0)
		return -ENOMEM;
	if (devices_info(c->manager, view, r, s) < 0)
		return -ENOMEM;
	if (view) {
		struct quota q;

		config_quota_for(&m->core.config, view, &q); /* its domain's, open or not */
		s->view = (char *)view;
		s->max_clients = q.clients;
	} else {
		s->view = (char *)"";
		s->max_clients = m->core.config.max_clients;
		s->requests = m->n_requests;
		s->protocol_errors = m->n_protocol_errors;
		s->clients_dropped = m->n_clients_dropped;
	}
	return 0;
}

static void domain_info(Mrd__DomainInfo *di, struct domain *d)
{
	struct domain_stats s;

	domain_stats(d, &s);
	mrd__domain_info__init(di);
	di->name = (char *)d->name;
	di->clients = s.clients;
	di->allocated_bytes = s.allocated_bytes;
	di->allocations = (uint32_t)s.allocations;
	di->waiting = s.waiting;
	di->arenas = s.arenas;
	di->pinned_bytes = s.pinned_bytes;
	di->generation = s.generation;
	di->quota_allocated_bytes = d->quota.allocated_bytes;
	di->quota_pinned_bytes = d->quota.pinned_bytes;
	di->quota_arenas = d->quota.arenas;
	di->quota_allocations = d->quota.allocations;
	di->quota_clients = d->quota.clients;
	di->mrs = domain_pd_mrs(d); /* as DomainDump counts them */
	di->client_pd_mrs = s.client_pd_mrs;
	di->client_pd_mr_bytes = s.client_pd_mr_bytes;
	di->lookups = s.lookups;
	di->misses = s.misses;
	di->table_overflow = s.table_overflow;
	di->registrations = s.registrations;
	di->deregistrations = s.deregistrations;
	di->odp_faults = s.odp.faults;
	di->odp_children_created = s.odp.children_created;
	di->odp_children_destroyed = s.odp.children_destroyed;
	di->odp_prefetch_requests = s.odp.prefetch_requests;
	di->odp_prefetch_pages = s.odp.prefetch_pages;
	di->odp_invalidations = s.odp.invalidations;
	di->odp_children = s.odp_children;
	di->quarantined_bytes = s.quarantined_bytes;
	di->quarantined_runs = s.quarantined_runs;
	di->memory_windows = mw_grants_live(&d->reg.windows); /* live keys, or soon */
	di->quota_memory_windows = mw_grants_limit(&d->reg.windows); /* the device's share too */
}

int request_clients(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		    struct wire_packet *pkt, struct reply *r)
{
	const struct manager *m = c->manager;
	Mrd__ClientsResponse *body;
	Mrd__ClientInfo *ci, **cip;
	Mrd__DomainInfo *di, **dip;
	const char *view = client_view(c);
	size_t budget = reply_budget(c), bytes = 0, i;
	struct client *it;
	struct domain *d;

	/* One block per array, freed with the reply. */
	ci = calloc(m->n_clients, sizeof(*ci));
	cip = calloc(m->n_clients, sizeof(*cip));
	di = calloc(m->core.n_domains, sizeof(*di));
	dip = calloc(m->core.n_domains, sizeof(*dip));
	r->owned[r->n_owned++] = ci;
	r->owned[r->n_owned++] = cip;
	r->owned[r->n_owned++] = di;
	r->owned[r->n_owned++] = dip;
	if ((m->n_clients && (!ci || !cip)) || (m->core.n_domains && (!di || !dip)))
		return -ENOMEM;

	/* What fits in one reply, domains first (stats and dump go by them); the rest is
	 * counted. */
	body = reply_body(r, MRD__RESPONSE__BODY_CLIENTS);
	i = 0;
	LIST_FOREACH(d, &m->core.domains, link) {
		if (!access_view_shows(view, d->name))
			continue;
		if (bytes > budget) {
			body->domains_omitted++;
			continue;
		}
		domain_info(&di[i], d);
		bytes += reply_repeated_size(&di[i].base);
		if (bytes > budget) {
			body->domains_omitted++;
			continue;
		}
		dip[i] = &di[i];
		i++;
	}
	body->n_domains = i;
	body->domains = dip;

	i = 0;
	LIST_FOREACH(it, &m->clients, link) {
		if (!access_view_shows(view, it->domain_name) || (it == c && req->clients->skip_caller))
			continue;
		if (bytes > budget) {
			body->clients_omitted++;
			continue;
		}
		mrd__client_info__init(&ci[i]);
		ci[i].id = it->id;
		ci[i].pid = (uint32_t)it->owner.mem.pid;
		ci[i].uid = it->owner.mem.uid;
		ci[i].gid = it->gid;
		ci[i].name = it->name;
		ci[i].domain = it->domain ? it->domain->name : (char *)"";
		ci[i].allocated_bytes = it->owner.mem.allocated_bytes;
		for (struct allocation *a = LIST_FIRST(&it->owner.mem.allocations); a;
		     a = LIST_NEXT(a, owner_link))
			ci[i].allocations++;
		ci[i].admin = it->admin;
		ci[i].bound_driver = it->bound ? it->bound->driver : (char *)"";
		if (it->bound) {
			ci[i].bound_pd = it->bound->pd_handle;
			ci[i].bound_mrs = it->bound->cache.n_mrs;
			ci[i].bound_registrations = it->bound->cache.registrations;
			ci[i].bound_mr_bytes = mr_cache_bytes(&it->bound->cache);
		}
		bytes += reply_repeated_size(&ci[i].base);
		if (bytes > budget) {
			body->clients_omitted++;
			continue;
		}
		cip[i] = &ci[i];
		i++;
	}
	body->n_clients = i;
	body->clients = cip;
	if (old_contexts_info(c->manager, view, r, &body->old_contexts, &body->n_old_contexts) < 0)
		return -ENOMEM;
	return 0;
}

#define DUMP_MRS_MAX 512 /* a reply's worth: ~40 bytes each */

/* A page of the domain's MRs in dump order (dump_walk): index counts them all, the page is
 * first .. first + n, at most DUMP_MRS_MAX and what fits in budget bytes. */
struct dump_walk {
	uint32_t index, first, n;
	uint32_t domain_pd; /* of index, not a client PD's */
	bool full;
	bool admin; /* sees the client PDs' MRs too, and every adopted buffer's keys */
	pid_t viewer; /* sees the keys of the buffers it adopted (mrd_mem_adopt) */
	size_t bytes, budget;
	Mrd__DumpMr *mrs;
};

/* What DumpMrKind calls each of core's kinds. */
static const uint32_t dump_kinds[] = {
	[DOMAIN_MR_CACHE] = MRD__DUMP_MR_KIND__DUMP_MR_CACHE,
	[DOMAIN_MR_CLIENT_PD] = MRD__DUMP_MR_KIND__DUMP_MR_CLIENT_PD,
	[DOMAIN_MR_ODP] = MRD__DUMP_MR_KIND__DUMP_MR_ODP,
	[DOMAIN_MR_MEMPOOL] = MRD__DUMP_MR_KIND__DUMP_MR_MEMPOOL,
};

/* domain_walk_mrs's visit of one MR. */
static void dump_mr(void *data, uint64_t start, uint64_t end, const struct provider_mr *pmr,
		    enum domain_mr_kind kind, const struct allocation *a, uint32_t sharers)
{
	struct dump_walk *w = data;
	Mrd__DumpMr *e;

	if (kind != DOMAIN_MR_CLIENT_PD)
		w->domain_pd++;
	if (w->index++ < w->first || w->full)
		return;
	e = &w->mrs[w->n];
	mrd__dump_mr__init(e);
	e->start = start;
	e->end = end;
	e->lkey = pmr ? pmr->lkey : MRD_KEY_INVALID;
	e->rkey = pmr ? pmr->rkey : MRD_KEY_INVALID;
	if (a->alias && !w->admin && (!a->owner || a->owner->pid != w->viewer))
		/* A program's buffer: its keys are that process's alone, as MrLookup's are. */
		e->lkey = e->rkey = MRD_KEY_INVALID;
	e->kind = dump_kinds[kind];
	e->pages = (end - start + a->arena->page_size - 1) / a->arena->page_size;
	e->owner_pid = a->owner ? (int32_t)a->owner->pid : 0;
	e->sharers = sharers;
	w->bytes += reply_repeated_size(&e->base);
	if (w->n > 0 && w->bytes > w->budget) {
		w->full = true; /* the next page starts with this one */
		return;
	}
	w->full = ++w->n == DUMP_MRS_MAX;
}

int request_domain_dump(struct client *c, struct domain *no_domain, const Mrd__Request *req,
			struct wire_packet *pkt, struct reply *r)
{
	const Mrd__DomainDumpRequest *q = req->domain_dump;
	Mrd__DomainDumpResponse *body;
	Mrd__DumpArena *ai, **aip;
	Mrd__DumpMr **mip;
	struct dump_walk w = { .first = q->first_mr, .budget = reply_budget(c),
			       .admin = !client_view(c), .viewer = c->owner.mem.pid };
	const struct arena *arena = NULL;
	struct domain_stats s;
	struct domain *d;
	size_t i = 0;

	LIST_FOREACH(d, &c->manager->core.domains, link)
		if (strcmp(d->name, q->domain) == 0)
			break;
	if (!d || !access_view_shows(client_view(c), d->name)) {
		/* The same words either way: a refusal must not tell that the domain exists. */
		reply_set_message(r, "no domain %s is open, or it is not yours", q->domain);
		return -ENOENT;
	}
	domain_stats(d, &s);
	ai = calloc(s.arenas, sizeof(*ai));
	aip = calloc(s.arenas, sizeof(*aip));
	w.mrs = calloc(DUMP_MRS_MAX, sizeof(*w.mrs));
	mip = calloc(DUMP_MRS_MAX, sizeof(*mip));
	r->owned[r->n_owned++] = ai;
	r->owned[r->n_owned++] = aip;
	r->owned[r->n_owned++] = w.mrs;
	r->owned[r->n_owned++] = mip;
	if ((s.arenas && (!ai || !aip)) || !w.mrs || !mip)
		return -ENOMEM;

	body = reply_body(r, MRD__RESPONSE__BODY_DOMAIN_DUMP);
	body->domain = d->name;
	while ((arena = domain_next_arena(d, arena))) {
		mrd__dump_arena__init(&ai[i]);
		ai[i].address = (uint64_t)(uintptr_t)arena->base;
		ai[i].size = arena->size;
		ai[i].page_size = arena->page_size;
		ai[i].hugetlb = arena->hugetlb;
		ai[i].external = arena->external;
		ai[i].allocations = arena->n_allocations;
		w.bytes += reply_repeated_size(&ai[i].base);
		aip[i] = &ai[i];
		i++;
	}
	body->n_arenas = i;
	body->arenas = aip;
	body->table_overflow = s.table_overflow;
	body->table_entries = s.table_entries;
	body->table_capacity = s.table_capacity;
	/* By arena, by allocation, then the mempools'; a client PD's keys are its own. */
	domain_walk_mrs(d, w.admin, dump_mr, &w);
	for (uint32_t k = 0; k < w.n; k++)
		mip[k] = &w.mrs[k];
	body->n_mrs = w.n;
	body->mrs = mip;
	body->mrs_total = w.index;
	body->domain_pd_mrs = w.domain_pd;
	body->next_mr = w.first + w.n < w.index ? w.first + w.n : 0;
	return 0;
}
