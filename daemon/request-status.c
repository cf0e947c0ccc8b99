/* SPDX-License-Identifier: MIT */
/* The admin family: Status. */
#include <stdlib.h>
#include <unistd.h>

#include "client.h"
#include "dispatch.h"
#include "domain.h"
#include "status-page.h"
#include "manager.h"
#include "provider.h"

int request_status(struct client *c, const Mrd__Request *req, struct wire_packet *pkt,
		   struct reply *r)
{
	const struct manager *m = c->manager;
	Mrd__StatusResponse *s = &r->body.status;

	mrd__status_response__init(s);
	s->server_version = (char *)PACKAGE_VERSION;
	s->uptime_usec = manager_uptime_usec(m);
	s->provider = (char *)provider_name(m->provider);
	s->device = (char *)m->provider->caps.device;
	s->max_mr_size = m->provider->caps.max_mr_size;
	s->odp = m->provider->caps.odp;
	s->odp_implicit = m->provider->caps.odp_implicit;
	s->rereg_translation = m->provider->caps.rereg_translation;
	s->dma = m->provider->caps.dma;
	s->domains = m->n_domains;
	s->clients = m->n_clients;
	s->max_clients = m->config.max_clients;
	s->pid = (uint32_t)getpid();
	s->requests = m->n_requests;
	s->protocol_errors = m->n_protocol_errors;
	s->clients_dropped = m->n_clients_dropped;
	r->resp.body_case = MRD__RESPONSE__BODY_STATUS_REPLY;
	r->resp.status_reply = s;
	return 0;
}

int request_clients(struct client *c, const Mrd__Request *req, struct wire_packet *pkt,
		    struct reply *r)
{
	const struct manager *m = c->manager;
	const struct config *cfg = &m->config;
	Mrd__ClientsResponse *body = &r->body.clients;
	Mrd__ClientInfo *ci, **cip;
	Mrd__DomainInfo *di, **dip;
	const char *view = client_view(c);
	struct client *it;
	struct domain *d;
	size_t i;

	/* One block per array, freed with the reply. */
	ci = calloc(m->n_clients, sizeof(*ci));
	cip = calloc(m->n_clients, sizeof(*cip));
	di = calloc(m->n_domains, sizeof(*di));
	dip = calloc(m->n_domains, sizeof(*dip));
	r->owned[r->n_owned++] = ci;
	r->owned[r->n_owned++] = cip;
	r->owned[r->n_owned++] = di;
	r->owned[r->n_owned++] = dip;
	if ((m->n_clients && (!ci || !cip)) || (m->n_domains && (!di || !dip)))
		return -ENOMEM;

	mrd__clients_response__init(body);
	i = 0;
	LIST_FOREACH(it, &m->clients, link) {
		if (!view_shows(view, it->domain_name))
			continue;
		mrd__client_info__init(&ci[i]);
		ci[i].id = it->id;
		ci[i].pid = (uint32_t)it->pid;
		ci[i].uid = it->uid;
		ci[i].gid = it->gid;
		ci[i].name = it->name;
		ci[i].domain = it->domain ? it->domain->name : (char *)"";
		ci[i].allocated_bytes = it->allocated_bytes;
		for (struct allocation *a = LIST_FIRST(&it->allocations); a;
		     a = LIST_NEXT(a, owner_link))
			ci[i].allocations++;
		ci[i].admin = it->admin;
		cip[i] = &ci[i];
		i++;
	}
	body->n_clients = i;
	body->clients = cip;

	i = 0;
	LIST_FOREACH(d, &m->domains, link) {
		if (!view_shows(view, d->name))
			continue;
		mrd__domain_info__init(&di[i]);
		di[i].name = d->name;
		di[i].clients = d->n_users;
		di[i].allocated_bytes = d->allocated_bytes;
		di[i].allocations = (uint32_t)d->allocations.n;
		di[i].arenas = d->n_arenas;
		di[i].pinned_bytes = d->cache.pinned_bytes;
		di[i].generation = __atomic_load_n(&d->status->generation, __ATOMIC_ACQUIRE);
		di[i].quota_allocated_bytes = cfg->quota_allocated_bytes;
		di[i].quota_pinned_bytes = cfg->quota_pinned_bytes;
		di[i].quota_arenas = cfg->quota_arenas;
		di[i].quota_allocations = cfg->quota_allocations;
		di[i].quota_clients = cfg->quota_clients;
		di[i].mrs = d->cache.n_mrs;
		di[i].lookups = d->cache.lookups;
		di[i].misses = d->cache.misses;
		di[i].table_overflow = d->cache.table.overflow;
		di[i].registrations = d->cache.registrations;
		di[i].deregistrations = d->cache.deregistrations;
		di[i].odp_faults = d->odp.stats.faults;
		di[i].odp_children_created = d->odp.stats.children_created;
		di[i].odp_children_destroyed = d->odp.stats.children_destroyed;
		di[i].odp_prefetch_requests = d->odp.stats.prefetch_requests;
		di[i].odp_prefetch_pages = d->odp.stats.prefetch_pages;
		di[i].odp_invalidations = d->odp.stats.invalidations;
		di[i].odp_children = d->odp.children;
		dip[i] = &di[i];
		i++;
	}
	body->n_domains = i;
	body->domains = dip;
	r->resp.body_case = MRD__RESPONSE__BODY_CLIENTS;
	r->resp.clients = body;
	return 0;
}
