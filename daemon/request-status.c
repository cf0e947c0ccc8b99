/* SPDX-License-Identifier: MIT */
/* The admin family: Status. */
#include <unistd.h>

#include "client.h"
#include "dispatch.h"
#include "manager.h"
#include "provider.h"

int request_status(struct client *c, const Mrd__Request *req, const struct wire_packet *pkt,
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
