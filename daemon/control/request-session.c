/* SPDX-License-Identifier: MIT */
/* The session family: Hello (version negotiation) and Ping. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "control/client.h"
#include "control/dispatch.h"
#include "log.h"
#include "control/manager.h"

/* Names end up in logs and mrctl output: keep printable ASCII only. */
static void copy_name(char *dst, size_t size, const char *src)
{
	size_t i = 0;

	for (; src && *src && i + 1 < size; src++)
		dst[i++] = isprint((unsigned char)*src) ? *src : '?';
	dst[i] = '\0';
}

int request_hello(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		  struct wire_packet *pkt, struct reply *r)
{
	const Mrd__HelloRequest *h = req->hello;
	uint32_t lo, hi;

	if (c->hello_done) {
		reply_set_message(r, "Hello was already negotiated (version %u)", c->version);
		return -EALREADY;
	}
	lo = h->min_version > MRD_PROTOCOL_VERSION_MIN ? h->min_version : MRD_PROTOCOL_VERSION_MIN;
	hi = h->max_version < MRD_PROTOCOL_VERSION_MAX ? h->max_version : MRD_PROTOCOL_VERSION_MAX;
	if (h->min_version > h->max_version || lo > hi) {
		reply_set_message(r, "client speaks protocol %u..%u, mrd speaks %u..%u",
				  h->min_version, h->max_version, MRD_PROTOCOL_VERSION_MIN,
				  MRD_PROTOCOL_VERSION_MAX);
		return -EPROTONOSUPPORT;
	}

	c->hello_done = true;
	c->version = hi;
	copy_name(c->name, sizeof(c->name), h->client_name);
	log_debug("client %" PRIu64 " (pid %d, uid %u, \"%s\") speaks version %u%s", c->id,
		  (int)c->owner.mem.pid, (unsigned)c->owner.mem.uid, c->name, c->version,
		  c->admin ? ", admin" : "");

	mrd__hello_response__init(&r->body.hello);
	r->body.hello.version = c->version;
	r->body.hello.capabilities = h->capabilities & MRD_CAPS_SERVED;
	r->body.hello.server_version = (char *)PACKAGE_VERSION;
	r->body.hello.max_frame = c->manager->core.config.max_frame;
	r->body.hello.admin = c->admin;
	r->resp.body_case = MRD__RESPONSE__BODY_HELLO;
	r->resp.hello = &r->body.hello;
	return 0;
}

int request_ping(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		 struct wire_packet *pkt, struct reply *r)
{
	mrd__ping_response__init(&r->body.ping);
	r->body.ping.payload = req->ping->payload; /* req outlives the packed reply */
	r->resp.body_case = MRD__RESPONSE__BODY_PING;
	r->resp.ping = &r->body.ping;
	return 0;
}
