/* SPDX-License-Identifier: MIT */
/* From a request to its reply: the dispatch table (what each request needs: a domain, root,
 * its fds), the reply under construction, and the continuations of replies that wait. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/queue.h>

#include "macro.h"
#include "wire.h"
#include "registration/waiter.h"

struct client;
struct domain;

/* A reply under construction: the envelope plus storage for whichever body it carries. */
struct reply {
	Mrd__Response resp;
	union {
		Mrd__HelloResponse hello;
		Mrd__PingResponse ping;
		Mrd__StatusResponse status;
		Mrd__ExportPdResponse export_pd;
		Mrd__JoinDomainResponse join_domain;
		Mrd__AllocResponse alloc;
		Mrd__FreeResponse free;
		Mrd__MapResponse map;
		Mrd__ExtmemAttachResponse extmem_attach;
		Mrd__ExtmemDetachResponse extmem_detach;
		Mrd__ClientsResponse clients;
		Mrd__MrLookupResponse mr_lookup;
		Mrd__DmaResponse dma;
		Mrd__MempoolRegisterResponse mempool_register;
		Mrd__MempoolUnregisterResponse mempool_unregister;
		Mrd__MempoolsResponse mempools;
		Mrd__PrefetchResponse prefetch;
		Mrd__FrmrPoolsResponse frmr_pools;
		Mrd__FrmrPoolsSetResponse frmr_pools_set;
		Mrd__FlushResponse flush;
		Mrd__DomainDumpResponse domain_dump;
		Mrd__BindPdResponse bind_pd;
		Mrd__ShutdownResponse shutdown;
		Mrd__ReloadResponse reload;
	} body;
	Mrd__ArenaInfo arena;   /* for bodies that describe an arena */
	void *owned[8];         /* freed after the reply is sent (repeated fields) */
	size_t n_owned;
	char message[256];
	const struct request_type *type; /* the request answered: an error is logged (refusal-log.h) */
	int fds[WIRE_FDS_MAX]; /* owned; sent with the reply, then closed */
	size_t n_fds;
};

void reply_set_message(struct reply *r, const char *fmt, ...) _printf_(2, 3);

/* What a view puts in one reply to c: REPLY_PAGE_BYTES, less when c's socket (its send
 * buffer) takes less. Views page (Mempools, DomainDump) or cut and count what they leave out
 * (Clients, FrmrPools); any other reply the socket cannot take is answered with EMSGSIZE and a
 * message instead (reply_send). */
#define REPLY_PAGE_BYTES (128u * 1024u)
size_t reply_budget(const struct client *c);
/* What m adds to its parent as one element of a repeated field. */
size_t reply_repeated_size(const ProtobufCMessage *m);
void reply_init(struct reply *r, uint64_t id);
/* Packs and sends r; error (negative errno or 0) becomes the status. Frees what r owns. */
void reply_send(struct client *c, struct reply *r, int error);

/* A request whose answer waits for a worker. Its handler returns -EINPROGRESS after
 * request_wait(); request_answer() sends the reply, with its id, whenever the worker is done.
 * Meanwhile the client's further requests are read and answered (up to
 * limits.requests_in_flight of them in flight), so answers may come out of order. */
struct pending_request {
	struct waiter waiter; /* first: the worker's completion hands it back */
	struct client *client;   /* NULL once the client left: nobody to answer */
	LIST_ENTRY(pending_request) link; /* in client->pending while client is set */
	uint64_t id;
	const struct request_type *type; /* what it answers */
};

/* A request that may wait for a worker: size zeroed bytes (a struct that starts with its
 * struct pending_request) answering id, resumed through resume. NULL when out of memory. */
void *request_pending_new(size_t size, uint64_t id,
			  void (*resume)(struct waiter *w, int result,
					 const struct mr_entry *entry, const char *why));
void request_wait(struct client *c, struct pending_request *p);
/* Sends r for p (error as for reply_send) and lets the client read again. */
void request_answer(struct pending_request *p, struct reply *r, int error);
/* The client is going: each request of its that waits for a worker will answer nobody (its
 * resume still frees it, once). */
void request_abandon(struct client *c);

/* r's body: the message body_case names, initialised and set as the reply's, for the handler
 * to fill in (an error reply still carries none: reply_send). */
void *reply_body(struct reply *r, Mrd__Response__BodyCase body_case);

/* n MrEntry messages for r's body, copies of entries, pointed to by the returned array (which
 * r owns, like the messages); NULL when out of memory. */
Mrd__MrEntry **fill_mr_entries(struct reply *r, const struct mr_entry *entries, size_t n);

/* Takes ownership of a descriptor the request carried (so dispatch does not close it). */
int take_request_fd(struct wire_packet *pkt, size_t i);

/* Handlers return 0 or -errno for their reply, or -EINPROGRESS when they answer later
 * themselves (a lookup waiting for a worker; see struct pending_request). d is the
 * client's domain for a type that needs_domain, else NULL. */
typedef int (*request_handler_fn)(struct client *c, struct domain *d, const Mrd__Request *req,
				  struct wire_packet *pkt, struct reply *r);
/* Checks what a request says by itself, before its domain is acquired: 0, or -errno with r's
 * message saying why not. */
typedef int (*request_check_fn)(const Mrd__Request *req, struct reply *r);

/* What the dispatcher checks and provides before a handler runs. */
struct request_type {
	const char *name;
	request_handler_fn handler;
	request_check_fn check; /* NULL: nothing to check but what this table says */
	bool before_hello; /* allowed before Hello (only Hello itself) */
	bool admin;        /* needs root or the admin group */
	/* The handler works in the client's domain: the dispatcher acquires it (joining it on
	 * first use) after check, and answers a refusal itself (quota.clients, or that it cannot
	 * be opened). */
	bool needs_domain;
	/* ... and a device that serves: while it failed, -ENODEV and a message that says so
	 * (core/device.h). */
	bool needs_device;
	/* It works on the domain's PD (its MRs, QPs or context): refused, EOPNOTSUPP, for a
	 * connection bound to its own PD (BindPd), whose keys those are not. */
	bool domain_pd;
	unsigned n_fds;    /* exact number of descriptors the request carries */
	/* Answered only while no other request of the connection is pending (a session's
	 * JoinDomain, which may resume what an earlier mrd held): else EBUSY, not done. */
	bool alone;
};

/* NULL for a body case mrd does not know. */
const struct request_type *request_type_lookup(int body_case);

/* Decodes, checks and answers one packet. Descriptors in pkt are consumed. Returns 0, or
 * -ECONNRESET after the client was dropped and freed: the caller must not touch it again. */
int dispatch_packet(struct client *c, struct wire_packet *pkt);

/* Handlers, one file per request family (request-*.c). */
int request_hello(struct client *c, struct domain *d, const Mrd__Request *req,
		  struct wire_packet *pkt, struct reply *r);
int request_ping(struct client *c, struct domain *d, const Mrd__Request *req,
		 struct wire_packet *pkt, struct reply *r);
int request_status(struct client *c, struct domain *d, const Mrd__Request *req,
		   struct wire_packet *pkt, struct reply *r);
int request_export_pd(struct client *c, struct domain *d, const Mrd__Request *req,
		      struct wire_packet *pkt, struct reply *r);
int request_bind_pd(struct client *c, struct domain *d, const Mrd__Request *req,
		    struct wire_packet *pkt, struct reply *r);
int request_join_domain(struct client *c, struct domain *d, const Mrd__Request *req,
			struct wire_packet *pkt, struct reply *r);
int request_alloc(struct client *c, struct domain *d, const Mrd__Request *req,
		  struct wire_packet *pkt, struct reply *r);
int request_alias_span(struct client *c, struct domain *d, const Mrd__Request *req,
		       struct wire_packet *pkt, struct reply *r);
int request_free(struct client *c, struct domain *d, const Mrd__Request *req,
		 struct wire_packet *pkt, struct reply *r);
int request_map(struct client *c, struct domain *d, const Mrd__Request *req,
		struct wire_packet *pkt, struct reply *r);
int request_extmem_attach(struct client *c, struct domain *d, const Mrd__Request *req,
			  struct wire_packet *pkt, struct reply *r);
int request_extmem_detach(struct client *c, struct domain *d, const Mrd__Request *req,
			  struct wire_packet *pkt, struct reply *r);
int request_clients(struct client *c, struct domain *d, const Mrd__Request *req,
		    struct wire_packet *pkt, struct reply *r);
int request_mr_lookup(struct client *c, struct domain *d, const Mrd__Request *req,
		      struct wire_packet *pkt, struct reply *r);
int request_dma(struct client *c, struct domain *d, const Mrd__Request *req,
		struct wire_packet *pkt, struct reply *r);
int request_mempool_register(struct client *c, struct domain *d, const Mrd__Request *req,
			     struct wire_packet *pkt, struct reply *r);
int request_mempool_unregister(struct client *c, struct domain *d, const Mrd__Request *req,
			       struct wire_packet *pkt, struct reply *r);
int request_mempools(struct client *c, struct domain *d, const Mrd__Request *req,
		     struct wire_packet *pkt, struct reply *r);
int request_prefetch(struct client *c, struct domain *d, const Mrd__Request *req,
		     struct wire_packet *pkt, struct reply *r);
int request_frmr_pools(struct client *c, struct domain *d, const Mrd__Request *req,
		       struct wire_packet *pkt, struct reply *r);
int request_frmr_pools_set(struct client *c, struct domain *d, const Mrd__Request *req,
			   struct wire_packet *pkt, struct reply *r);
int request_flush(struct client *c, struct domain *d, const Mrd__Request *req,
		  struct wire_packet *pkt, struct reply *r);
int request_domain_dump(struct client *c, struct domain *d, const Mrd__Request *req,
			struct wire_packet *pkt, struct reply *r);
int request_shutdown(struct client *c, struct domain *d, const Mrd__Request *req,
		     struct wire_packet *pkt, struct reply *r);
int request_reload(struct client *c, struct domain *d, const Mrd__Request *req,
		   struct wire_packet *pkt, struct reply *r);
int request_window_grant(struct client *c, struct domain *d, const Mrd__Request *req,
			 struct wire_packet *pkt, struct reply *r);
int request_window_revoke(struct client *c, struct domain *d, const Mrd__Request *req,
			  struct wire_packet *pkt, struct reply *r);
/* Windows of the bound PD's context to deallocate when the client goes (bound-pd.h). */
int request_window_track(struct client *c, struct domain *d, const Mrd__Request *req,
			 struct wire_packet *pkt, struct reply *r);

/* The checks of the requests that have one (request_check_fn). */
int request_alloc_check(const Mrd__Request *req, struct reply *r);
int request_mempool_register_check(const Mrd__Request *req, struct reply *r);
int request_mempool_unregister_check(const Mrd__Request *req, struct reply *r);
int request_mr_lookup_check(const Mrd__Request *req, struct reply *r);
int request_dma_check(const Mrd__Request *req, struct reply *r);
int request_prefetch_check(const Mrd__Request *req, struct reply *r);
int request_window_grant_check(const Mrd__Request *req, struct reply *r);
