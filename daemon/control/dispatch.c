/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "escape.h"
#include "log.h"
#include "base/fd-closer.h"
#include "registration/bound-pd.h"
#include "core/device.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

static const struct request_type request_types[] = {
	[MRD__REQUEST__BODY_HELLO] = { "Hello", request_hello, .before_hello = true },
	[MRD__REQUEST__BODY_PING] = { "Ping", request_ping },
	/* Read-only views: anyone, who sees its own domain alone (access_view). */
	[MRD__REQUEST__BODY_STATUS] = { "Status", request_status },
	[MRD__REQUEST__BODY_EXPORT_PD] = { "ExportPd", request_export_pd, .needs_domain = true,
					   .needs_device = true, .domain_pd = true },
	[MRD__REQUEST__BODY_JOIN_DOMAIN] = { "JoinDomain", request_join_domain,
					     .needs_domain = true, .alone = true },
	[MRD__REQUEST__BODY_ALLOC] = { "Alloc", request_alloc, .check = request_alloc_check,
				       .needs_domain = true, .needs_device = true },
	[MRD__REQUEST__BODY_FREE] = { "Free", request_free, .needs_domain = true },
	[MRD__REQUEST__BODY_ALIAS_SPAN] = { "AliasSpan", request_alias_span, .needs_domain = true },
	[MRD__REQUEST__BODY_MAP] = { "Map", request_map, .needs_domain = true },
	[MRD__REQUEST__BODY_EXTMEM_ATTACH] = { "ExtmemAttach", request_extmem_attach,
					       .needs_domain = true, .needs_device = true, .n_fds = 1 },
	[MRD__REQUEST__BODY_EXTMEM_DETACH] = { "ExtmemDetach", request_extmem_detach,
					       .needs_domain = true },
	[MRD__REQUEST__BODY_CLIENTS] = { "Clients", request_clients },
	[MRD__REQUEST__BODY_MR_LOOKUP] = { "MrLookup", request_mr_lookup,
					   .check = request_mr_lookup_check, .needs_domain = true, .needs_device = true },
	[MRD__REQUEST__BODY_DMA] = { "Dma", request_dma, .check = request_dma_check,
				     .needs_domain = true, .needs_device = true, .domain_pd = true },
	[MRD__REQUEST__BODY_MEMPOOL_REGISTER] = { "MempoolRegister", request_mempool_register,
						  .check = request_mempool_register_check,
						  .needs_domain = true, .needs_device = true,
						  .domain_pd = true },
	[MRD__REQUEST__BODY_MEMPOOL_UNREGISTER] = { "MempoolUnregister",
						    request_mempool_unregister,
						    .check = request_mempool_unregister_check,
						    .needs_domain = true },
	[MRD__REQUEST__BODY_MEMPOOLS] = { "Mempools", request_mempools },
	[MRD__REQUEST__BODY_PREFETCH] = { "Prefetch", request_prefetch,
					  .check = request_prefetch_check, .needs_domain = true,
					  .needs_device = true, .domain_pd = true },
	[MRD__REQUEST__BODY_FRMR_POOLS] = { "FrmrPools", request_frmr_pools },
	[MRD__REQUEST__BODY_FRMR_POOLS_SET] = { "FrmrPoolsSet", request_frmr_pools_set,
						.admin = true },
	[MRD__REQUEST__BODY_FLUSH] = { "Flush", request_flush, .admin = true },
	[MRD__REQUEST__BODY_DOMAIN_DUMP] = { "DomainDump", request_domain_dump },
	[MRD__REQUEST__BODY_BIND_PD] = { "BindPd", request_bind_pd, .needs_domain = true,
					 .needs_device = true, .n_fds = 1 },
	/* mrctl shutdown and reload, for hosts without systemd (mrd(8)). */
	[MRD__REQUEST__BODY_SHUTDOWN] = { "Shutdown", request_shutdown, .admin = true },
	[MRD__REQUEST__BODY_RELOAD] = { "Reload", request_reload, .admin = true },
	[MRD__REQUEST__BODY_WINDOW_GRANT] = { "WindowGrant", request_window_grant,
					      .check = request_window_grant_check,
					      .needs_domain = true, .needs_device = true,
					      .domain_pd = true },
	[MRD__REQUEST__BODY_WINDOW_REVOKE] = { "WindowRevoke", request_window_revoke,
					       .needs_domain = true },
	[MRD__REQUEST__BODY_WINDOW_TRACK] = { "WindowTrack", request_window_track,
					      .needs_domain = true },
};

/* The request whose handler runs now (the loop is single-threaded): one that waits for a
 * worker takes it along for its answer (request_wait). */
static const struct request_type *running;

/* What a user calls to make each request: what messages name (a user never sees the wire). */
static const char *const request_apis[] = {
	[MRD__REQUEST__BODY_HELLO] = "mrd_client_connect()",
	[MRD__REQUEST__BODY_PING] = "mrd_client_ping()",
	[MRD__REQUEST__BODY_STATUS] = "mrctl status",
	[MRD__REQUEST__BODY_EXPORT_PD] = "mrd_client_get_pd()",
	[MRD__REQUEST__BODY_JOIN_DOMAIN] = "mrd_client_connect()",
	[MRD__REQUEST__BODY_ALLOC] = "mrd_mem_alloc()",
	[MRD__REQUEST__BODY_FREE] = "mrd_mem_free()",
	[MRD__REQUEST__BODY_ALIAS_SPAN] = "libmrd-preload's registration",
	[MRD__REQUEST__BODY_MAP] = "mrd_mem_map()",
	[MRD__REQUEST__BODY_EXTMEM_ATTACH] = "mrd_extmem_attach()",
	[MRD__REQUEST__BODY_EXTMEM_DETACH] = "mrd_extmem_detach()",
	[MRD__REQUEST__BODY_CLIENTS] = "mrctl clients",
	[MRD__REQUEST__BODY_MR_LOOKUP] = "mrd_keys_query()",
	[MRD__REQUEST__BODY_DMA] = "mrd_dma()",
	[MRD__REQUEST__BODY_MEMPOOL_REGISTER] = "mrd_mempool_register()",
	[MRD__REQUEST__BODY_MEMPOOL_UNREGISTER] = "mrd_mempool_unregister()",
	[MRD__REQUEST__BODY_MEMPOOLS] = "mrctl mempools",
	[MRD__REQUEST__BODY_PREFETCH] = "mrd_prefetch()",
	[MRD__REQUEST__BODY_FRMR_POOLS] = "mrctl pools",
	[MRD__REQUEST__BODY_FRMR_POOLS_SET] = "mrctl pools set",
	[MRD__REQUEST__BODY_FLUSH] = "mrctl flush",
	[MRD__REQUEST__BODY_DOMAIN_DUMP] = "mrctl dump",
	[MRD__REQUEST__BODY_BIND_PD] = "mrd_client_bind_pd()",
	[MRD__REQUEST__BODY_SHUTDOWN] = "mrctl shutdown",
	[MRD__REQUEST__BODY_RELOAD] = "mrctl reload",
	[MRD__REQUEST__BODY_WINDOW_GRANT] = "mrd_window_grant()",
	[MRD__REQUEST__BODY_WINDOW_REVOKE] = "mrd_window_revoke()",
	[MRD__REQUEST__BODY_WINDOW_TRACK] = "mrd_window_track()",
};

/* The call behind a request, for messages; its wire name where none is listed. */
static const char *request_api(int body_case, const struct request_type *type)
{
	if (body_case > 0 && (size_t)body_case < ELEMENTSOF(request_apis) &&
	    request_apis[body_case])
		return request_apis[body_case];
	return type->name;
}

const struct request_type *request_type_lookup(int body_case)
{
	if (body_case <= 0 || (size_t)body_case >= ELEMENTSOF(request_types))
		return NULL;
	if (!request_types[body_case].handler)
		return NULL;
	return &request_types[body_case];
}

void reply_set_message(struct reply *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->message, sizeof(r->message), fmt, ap);
	va_end(ap);
}

static void reply_close_fds(struct reply *r)
{
	for (size_t i = 0; i < r->n_fds; i++)
		safe_close(r->fds[i]);
	r->n_fds = 0;
}

void reply_init(struct reply *r, uint64_t id)
{
	memset(r, 0, sizeof(*r));
	mrd__response__init(&r->resp);
	r->resp.id = id;
}

/* Below the smallest send buffer the kernel allows (SOCK_MIN_SNDBUF, some 4.6 KB): no need to
 * ask the socket. */
#define REPLY_ALWAYS_FITS 4096u
/* Room for a reply's envelope: id, status, message. */
#define REPLY_ENVELOPE 512u

/* The largest reply c's socket takes in one packet: its send buffer, at most WIRE_FRAME_MAX. */
static size_t reply_max(const struct client *c)
{
	int sndbuf = 0;
	socklen_t len = sizeof(sndbuf);

	/* A SEQPACKET send of more than the send buffer less 32 bytes fails (EMSGSIZE). */
	if (getsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) < 0 || sndbuf <= 32 ||
	    (size_t)sndbuf - 32 > WIRE_FRAME_MAX)
		return WIRE_FRAME_MAX;
	return (size_t)sndbuf - 32;
}

size_t reply_budget(const struct client *c)
{
	size_t max = reply_max(c);

	max = max > REPLY_ENVELOPE ? max - REPLY_ENVELOPE : 0;
	return max < REPLY_PAGE_BYTES ? max : REPLY_PAGE_BYTES;
}

size_t reply_repeated_size(const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m), n = 1;

	for (size_t v = len; v >= 0x80; v >>= 7)
		n++;
	return 1 + n + len; /* the tag (fields 1..15), the length, the message */
}

/* An error reply carries no body, only status and reason. */
static void reply_set_error(struct reply *r, int error)
{
	r->resp.body_case = MRD__RESPONSE__BODY__NOT_SET;
	r->resp.status = -error;
	if (!r->message[0])
		snprintf(r->message, sizeof(r->message), "%s", strerror(-error));
	reply_close_fds(r);
}

/* r packed, or, when it would not go through c's socket, an error reply that says so: a
 * client is never left waiting for an answer that cannot be sent. */
static int reply_pack(struct client *c, struct reply *r, uint8_t **buf, size_t *len)
{
	char escaped[sizeof(r->message)];
	size_t want, max = WIRE_FRAME_MAX;
	int k;

	/* A proto3 string must be UTF-8, and what a request held (a name) is echoed in it. */
	memcpy(r->message, text_escape(r->message, 0, escaped, sizeof(escaped)), sizeof(escaped));
	r->resp.message = r->message;
	k = wire_pack(&r->resp.base, max, buf, len);
	if (k == 0 && *len > REPLY_ALWAYS_FITS && *len > (max = reply_max(c))) {
		free(*buf);
		*buf = NULL;
		k = -EMSGSIZE;
	}
	if (k != -EMSGSIZE)
		return k;
	want = protobuf_c_message_get_packed_size(&r->resp.base);
	log_debug("client %" PRIu64 ": a reply of %zu bytes does not fit in %zu", c->id, want, max);
	reply_set_message(r, "the reply (%zu bytes) does not fit in one packet of this connection "
			  "(%zu bytes); what the request did stays done", want, max);
	reply_set_error(r, -EMSGSIZE);
	return wire_pack(&r->resp.base, max, buf, len);
}

/* Packs and sends r; error (negative errno or 0) becomes the status. */
void reply_send(struct client *c, struct reply *r, int error)
{
	_cleanup_free_ uint8_t *buf = NULL;
	size_t len;
	int k;

	if (error < 0) {
		reply_set_error(r, error);
		if (r->type)
			refusal_log(c, (unsigned)(r->type - request_types), r->type->name, error,
				    r->message);
	}
	k = reply_pack(c, r, &buf, &len);
	if (k >= 0)
		k = client_send_frame(c, buf, len, r->fds, r->n_fds);
	if (k < 0)
		log_debug_errno(k, "client %" PRIu64 ": cannot send reply: %m", c->id);
	reply_close_fds(r); /* the kernel (or the send queue) holds its own copies */
	for (size_t i = 0; i < r->n_owned; i++)
		free(r->owned[i]);
	r->n_owned = 0;
}

int take_request_fd(struct wire_packet *pkt, size_t i)
{
	int fd = pkt->fds[i];

	pkt->fds[i] = -1;
	return fd;
}

/* A frame that breaks the protocol: answer it, count it, and drop the client that keeps on. */
static int protocol_error(struct client *c, struct reply *r, int error)
{
	struct manager *m = c->manager;
	char reason[sizeof(r->message) + 64];

	m->n_protocol_errors++;
	c->protocol_errors++;
	log_debug("client %" PRIu64 " (pid %d, uid %u): %s", c->id, (int)c->owner.mem.pid,
		  (unsigned)c->owner.mem.uid, r->message);
	if (c->protocol_errors > m->core.config.max_protocol_errors) {
		snprintf(reason, sizeof(reason), "%u malformed requests, last: %s", c->protocol_errors,
			 r->message);
		client_drop(c, reason);
		return -ECONNRESET;
	}
	reply_send(c, r, error);
	return 0;
}

/* The client's domain, joined on first use; a refusal says why in r. */
static int request_domain(struct client *c, struct reply *r, struct domain **ret)
{
	int k = client_get_domain(c, ret, r->message, sizeof(r->message));

	if (k == -EDQUOT)
		; /* the message names the quota (config_quota_refusal) */
	else if (k == -ENODEV && device_check(&c->manager->core, r->message, sizeof(r->message)) < 0)
		; /* the device failed: the message says so */
	else if (k < 0)
		reply_set_message(r, "cannot open domain %s", c->domain_name);
	return k;
}

/* A request that passed the table's checks: its own check, its domain, then its handler. */
static int run_handler(struct client *c, const struct request_type *type,
		       const Mrd__Request *req, struct wire_packet *pkt, struct reply *r)
{
	/* A WindowGrant for the client's own QP asks for its own PD's MR, not the domain's. */
	bool domain_pd = type->domain_pd && !(req->body_case == MRD__REQUEST__BODY_WINDOW_GRANT &&
					      req->window_grant->client_pd);
	struct domain *d = NULL;
	int k;

	if (type->check) {
		k = type->check(req, r);
		if (k < 0)
			return k;
	}
	if (type->needs_device) {
		k = device_check(&c->manager->core, r->message, sizeof(r->message));
		if (k < 0)
			return k;
	}
	if (domain_pd && (c->bound || c->bound_lost)) {
		reply_set_message(r, "%s works on the domain's PD, and this handle is bound to a PD "
				  "of its own context (mrd_client_bind_pd()): use a handle of its own "
				  "for it", request_api(req->body_case, type));
		return -EOPNOTSUPP;
	}
	if (type->needs_domain) {
		k = request_domain(c, r, &d);
		if (k < 0)
			return k;
	}
	k = type->handler(c, d, req, pkt, r);
	if (domain_pd && (k >= 0 || k == -EINPROGRESS))
		c->keys_out = true; /* of the domain's PD: too late to bind */
	return k;
}

int dispatch_packet(struct client *c, struct wire_packet *pkt)
{
	struct manager *m = c->manager;
	uid_t owner = c->owner_uid; /* a protocol error frees c */
	const struct request_type *type;
	Mrd__Request *req;
	struct reply r;
	int k;

	reply_init(&r, 0);

	/* Descriptors mrd does not keep wait in their user's lane of the closers; a client whose
	 * user has too many of them waiting goes before it adds more. Other users' lanes and
	 * connections never wait for this one's. */
	if (pkt->n_fds > 0) {
		unsigned mine = fd_closer_waiting(m->closer, owner);

		if (mine >= FD_CLOSER_UID_MAX) {
			char reason[128];

			fd_closer_consume_packet(m->closer, pkt, owner);
			snprintf(reason, sizeof(reason),
				 "%u descriptors of its user still being closed (limit %u)", mine,
				 FD_CLOSER_UID_MAX);
			reply_set_message(&r, "mrd is still closing descriptors sent to it: %s",
					  reason);
			reply_send(c, &r, -ETOOMANYREFS);
			client_drop(c, reason);
			return -ECONNRESET;
		}
	}

	/* Everything about the frame is checked before a byte of it is decoded. */
	if (pkt->truncated || pkt->len > m->core.config.max_frame) {
		fd_closer_consume_packet(m->closer, pkt, owner);
		reply_set_message(&r, "frame of %zu bytes exceeds the limit of %u", pkt->len,
				  m->core.config.max_frame);
		return protocol_error(c, &r, -EMSGSIZE);
	}
	if (pkt->fds_truncated || pkt->n_fds > m->core.config.max_fds) {
		fd_closer_consume_packet(m->closer, pkt, owner);
		reply_set_message(&r, "too many file descriptors in one frame (limit %u)",
				  m->core.config.max_fds);
		return protocol_error(c, &r, -EBADMSG);
	}

	req = mrd__request__unpack(NULL, pkt->len, pkt->data);
	if (!req) {
		fd_closer_consume_packet(m->closer, pkt, owner);
		reply_set_message(&r, "undecodable frame of %zu bytes", pkt->len);
		return protocol_error(c, &r, -EBADMSG);
	}
	r.resp.id = req->id;

	type = request_type_lookup(req->body_case);
	if (!type) {
		reply_set_message(&r, "unknown request (body case %d)", (int)req->body_case);
		k = protocol_error(c, &r, -EOPNOTSUPP);
	} else if (pkt->n_fds != type->n_fds) {
		reply_set_message(&r, "%s takes %u file descriptors, got %zu", type->name,
				  type->n_fds, pkt->n_fds);
		k = protocol_error(c, &r, -EBADMSG);
	} else if (!type->before_hello && !c->hello_done) {
		reply_set_message(&r, "%s before Hello", type->name);
		k = protocol_error(c, &r, -EPROTO);
	} else if (type->admin && !c->admin) {
		/* Not a protocol error: a well-formed request this peer may not make. */
		r.type = type;
		reply_set_message(&r, "%s needs root or the admin group",
				  request_api(req->body_case, type));
		reply_send(c, &r, -EPERM);
		k = 0;
	} else if (type->alone && c->n_pending > 0) {
		r.type = type;
		reply_set_message(&r, "%s is answered only when no other request of this connection "
				  "waits, and %u still do: ask again once they are answered",
				  request_api(req->body_case, type), c->n_pending);
		reply_send(c, &r, -EBUSY);
		k = 0;
	} else {
		m->n_requests++;
		r.type = running = type;
		k = run_handler(c, type, req, pkt, &r);
		running = NULL;
		if (k != -EINPROGRESS) /* else the handler answers later, itself */
			reply_send(c, &r, k);
		k = 0;
	}

	/* Handlers take what they keep. */
	fd_closer_consume_packet(m->closer, pkt, owner);
	mrd__request__free_unpacked(req, NULL);
	return k;
}

void *request_pending_new(size_t size, uint64_t id,
			  void (*resume)(struct waiter *w, int result,
					 const struct mr_entry *entry, const char *why))
{
	struct pending_request *p = calloc(1, size);

	if (p) {
		p->waiter.resume = resume;
		p->id = id;
	}
	return p;
}

void request_wait(struct client *c, struct pending_request *p)
{
	p->client = c;
	p->type = running;
	LIST_INSERT_HEAD(&c->pending, p, link);
	c->n_pending++;
	if (client_full(c))
		client_pause(c); /* until one is answered */
}

void request_answer(struct pending_request *p, struct reply *r, int error)
{
	struct client *c = p->client;

	LIST_REMOVE(p, link);
	c->n_pending--;
	p->client = NULL;
	r->type = p->type;
	reply_send(c, r, error);
	client_resume(c);
}

void request_abandon(struct client *c)
{
	struct pending_request *p;

	while ((p = LIST_FIRST(&c->pending))) {
		LIST_REMOVE(p, link);
		p->client = NULL;
	}
	c->n_pending = 0;
}

void *reply_body(struct reply *r, Mrd__Response__BodyCase body_case)
{
	/* A oneof's case is its field's number; the field says which message it is, and where
	 * the response keeps the pointer to it. */
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field(&mrd__response__descriptor,
							(unsigned)body_case);

	assert(f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
	       ((const ProtobufCMessageDescriptor *)f->descriptor)->sizeof_message <=
		       sizeof(r->body));
	protobuf_c_message_init(f->descriptor, &r->body);
	*(void **)((char *)&r->resp + f->offset) = &r->body;
	r->resp.body_case = body_case;
	return &r->body;
}

Mrd__MrEntry **fill_mr_entries(struct reply *r, const struct mr_entry *entries, size_t n)
{
	Mrd__MrEntry *msgs = calloc(n, sizeof(*msgs));
	Mrd__MrEntry **ptrs = calloc(n, sizeof(*ptrs));

	r->owned[r->n_owned++] = msgs;
	r->owned[r->n_owned++] = ptrs;
	if (!msgs || !ptrs)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		mrd__mr_entry__init(&msgs[i]);
		msgs[i].start = entries[i].start;
		msgs[i].end = entries[i].end;
		msgs[i].lkey = entries[i].lkey;
		msgs[i].rkey = entries[i].rkey;
		ptrs[i] = &msgs[i];
	}
	return ptrs;
}
