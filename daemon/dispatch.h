/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "macro.h"
#include "wire.h"

struct client;

/* A reply under construction: the envelope plus storage for whichever body it carries. */
struct reply {
	Mrd__Response resp;
	union {
		Mrd__HelloResponse hello;
		Mrd__PingResponse ping;
		Mrd__StatusResponse status;
		Mrd__ExportPdResponse export_pd;
	} body;
	char message[256];
	int fds[WIRE_FDS_MAX]; /* owned; sent with the reply, then closed */
	size_t n_fds;
};

void reply_set_message(struct reply *r, const char *fmt, ...) _printf_(2, 3);

typedef int (*request_handler_fn)(struct client *c, const Mrd__Request *req,
				  const struct wire_packet *pkt, struct reply *r);

/* What the dispatcher checks before a handler runs. */
struct request_type {
	const char *name;
	request_handler_fn handler;
	bool before_hello; /* allowed before Hello (only Hello itself) */
	bool admin;        /* needs root or the admin group */
	unsigned n_fds;    /* exact number of descriptors the request carries */
};

/* NULL for a body case mrd does not know. */
const struct request_type *request_type_lookup(int body_case);

/* Decodes, checks and answers one packet. Descriptors in pkt are consumed. Returns 0, or
 * -ECONNRESET after the client was dropped and freed: the caller must not touch it again. */
int dispatch_packet(struct client *c, struct wire_packet *pkt);

/* Handlers, one file per request family (request-*.c). */
int request_hello(struct client *c, const Mrd__Request *req, const struct wire_packet *pkt,
		  struct reply *r);
int request_ping(struct client *c, const Mrd__Request *req, const struct wire_packet *pkt,
		 struct reply *r);
int request_status(struct client *c, const Mrd__Request *req, const struct wire_packet *pkt,
		   struct reply *r);
int request_export_pd(struct client *c, const Mrd__Request *req, const struct wire_packet *pkt,
		      struct reply *r);
