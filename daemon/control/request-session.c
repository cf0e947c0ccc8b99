/* SPDX-License-Identifier: MIT */
/* The session family: Hello (version negotiation) and Ping. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "log.h"
#include "control/client.h"
#include "control/dispatch.h"
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
	Mrd__HelloResponse *body;
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

	body = reply_body(r, MRD__RESPONSE__BODY_HELLO);
	body->version = c->version;
	body->capabilities = h->capabilities & MRD_CAPS_SERVED;
	body->server_version = (char *)PACKAGE_VERSION;
	body->max_frame = c->manager->core.config.max_frame;
	body->admin = c->admin;
	return 0;
}

int request_ping(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		 struct wire_packet *pkt, struct reply *r)
{
	Mrd__PingResponse *body = reply_body(r, MRD__RESPONSE__BODY_PING);

	body->payload = req->ping->payload; /* req outlives the packed reply */
	return 0;
}
