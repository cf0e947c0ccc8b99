/* SPDX-License-Identifier: MIT */
/* The memory-window family: WindowGrant (a window over the caller's own memory, bound on the
 * domain's PD; or, for the client-PD model, the MR of the client's own PD it binds over) and
 * WindowRevoke; WindowTrack, the client-PD model's windows mrd deallocates when the client goes. */
#include <errno.h>
#include <inttypes.h>

#include "macro.h"
#include "provider/provider.h"
#include "registration/bound-pd.h"
#include "core/domain.h"
#include "control/client.h"
#include "control/dispatch.h"

/* The wire's bits (mrd.h MRD_WINDOW_*), to the provider's. */
#define WIRE_READ 0x1u
#define WIRE_WRITE 0x2u
#define WIRE_ATOMIC 0x4u

int request_window_grant_check(const Mrd__Request *req, struct reply *r)
{
	const Mrd__WindowGrantRequest *q = req->window_grant;

	if (q->length == 0 || q->address + q->length < q->address || q->access == 0 ||
	    (q->access & ~(WIRE_READ | WIRE_WRITE | WIRE_ATOMIC))) {
		reply_set_message(r, "WindowGrant: a non-empty range and access of remote read (1), "
				  "write (2), atomic (4)");
		return -EINVAL;
	}
	return 0;
}

/* A grant waits, whole, while a worker registers the MR it binds over; and while a worker
 * binds the window. */
struct pending_grant {
	struct pending_request base; /* first */
	struct mw_wait bound;
	uint64_t address, length;
	unsigned access;
	bool client_pd; /* the client binds: answered with its own PD's MR */
};

/* The client-PD model's answer: the MR of the connection's own PD and the allocation. */
static int grant_mr(struct pending_grant *p, struct reply *r)
{
	struct client *c = p->base.client;
	Mrd__WindowGrantResponse *body;
	uint64_t alloc_start, alloc_end;
	Mrd__MrEntry **mr;
	struct mr_entry e;
	int k;

	if (!c->bound || c->bound_lost) {
		reply_set_message(r, "WindowGrant for the client's own QP: this connection has no "
				  "PD of its own bound (mrd_client_bind_pd)%s",
				  c->bound_lost ? ", or it was let go: connect again" : "");
		return -ENXIO;
	}
	k = domain_window_mr(c->domain, c->bound, &c->owner.mem, p->address, p->length, &e,
			     &alloc_start, &alloc_end, r->message, sizeof(r->message),
			     &p->base.waiter);
	if (k < 0)
		return k;
	mr = fill_mr_entries(r, &e, 1);
	if (!mr)
		return -ENOMEM;
	body = reply_body(r, MRD__RESPONSE__BODY_WINDOW_GRANT);
	body->mr = mr[0];
	body->allocation_start = alloc_start;
	body->allocation_end = alloc_end;
	return 0;
}

/* The grant of p: answered in r (0), refused, or -EINPROGRESS (waits for the MR). */
static int grant_run(struct pending_grant *p, struct reply *r)
{
	struct client *c = p->base.client;
	Mrd__WindowGrantResponse *body;
	uint32_t rkey;
	int k;

	if (p->client_pd)
		return grant_mr(p, r);
	k = domain_window_grant(c->domain, &c->owner.mem, p->address, p->length, p->access, &rkey,
				r->message, sizeof(r->message), &p->base.waiter, &p->bound);
	if (k < 0)
		return k;
	body = reply_body(r, MRD__RESPONSE__BODY_WINDOW_GRANT);
	body->rkey = rkey;
	return 0;
}

/* A worker bound the window (or failed to): answered, unless the client went. */
static bool grant_bound(struct mw_wait *wait, int result, uint32_t rkey, const char *why)
{
	struct pending_grant *p = container_of(wait, struct pending_grant, bound);
	bool taken = p->base.client != NULL;
	struct reply r;

	if (taken) {
		reply_init(&r, p->base.id);
		if (result < 0)
			reply_set_message(&r, "%s", why);
		else
			((Mrd__WindowGrantResponse *)reply_body(&r, MRD__RESPONSE__BODY_WINDOW_GRANT))
				->rkey = rkey;
		request_answer(&p->base, &r, result);
	}
	free(p);
	return taken;
}

static void grant_resume(struct waiter *w, int result, const struct mr_entry *entry,
			 const char *why)
{
	struct pending_grant *p = (struct pending_grant *)w;
	struct reply r;
	int k = result;

	(void)entry;
	if (!p->base.client) {
		free(p);
		return;
	}
	reply_init(&r, p->base.id);
	/* The MR is made: the grant again, from the start (the memory may be gone meanwhile). */
	if (k >= 0) {
		k = grant_run(p, &r);
		if (k == -EINPROGRESS)
			return;
	} else
		reply_set_message(&r, "%s", why);
	request_answer(&p->base, &r, k);
	free(p);
}

int request_window_grant(struct client *c, struct domain *d, const Mrd__Request *req,
			 struct wire_packet *pkt, struct reply *r)
{
	const Mrd__WindowGrantRequest *q = req->window_grant;
	struct pending_grant *p;
	int k;

	(void)pkt;
	(void)d;
	p = request_pending_new(sizeof(*p), req->id, grant_resume);
	if (!p)
		return -ENOMEM;
	p->base.client = c;
	p->bound.done = grant_bound;
	p->address = q->address;
	p->length = q->length;
	p->client_pd = q->client_pd;
	p->access = (q->access & WIRE_READ ? MRD_ACCESS_REMOTE_READ : 0) |
		    (q->access & WIRE_WRITE ? MRD_ACCESS_REMOTE_WRITE : 0) |
		    (q->access & WIRE_ATOMIC ? MRD_ACCESS_REMOTE_ATOMIC : 0);
	k = grant_run(p, r);
	if (k == -EINPROGRESS) {
		request_wait(c, &p->base); /* answered by grant_resume */
		return k;
	}
	free(p);
	return k;
}

/* A revoke a worker does. */
struct pending_revoke {
	struct pending_request base; /* first */
	struct mw_wait killed;
};

static bool revoke_killed(struct mw_wait *wait, int result, uint32_t rkey, const char *why)
{
	struct pending_revoke *p = container_of(wait, struct pending_revoke, killed);
	struct reply r;

	(void)rkey;
	if (p->base.client) {
		reply_init(&r, p->base.id);
		if (result < 0)
			reply_set_message(&r, "%s", why);
		else
			(void)reply_body(&r, MRD__RESPONSE__BODY_WINDOW_REVOKE);
		request_answer(&p->base, &r, result);
	}
	free(p);
	return true;
}

/* Never resumed as a waiter: only its mw_wait is handed out. */
static void revoke_resume(struct waiter *w, int result, const struct mr_entry *entry,
			  const char *why)
{
	(void)result;
	(void)entry;
	(void)why;
	free(w);
}

int request_window_revoke(struct client *c, struct domain *d, const Mrd__Request *req,
			  struct wire_packet *pkt, struct reply *r)
{
	struct pending_revoke *p;
	int k;

	(void)pkt;
	p = request_pending_new(sizeof(*p), req->id, revoke_resume);
	if (!p)
		return -ENOMEM;
	p->base.client = c;
	p->killed.done = revoke_killed;
	k = domain_window_revoke(d, &c->owner.mem, req->window_revoke->rkey, r->message,
				 sizeof(r->message), &p->killed);
	if (k == -EINPROGRESS) {
		request_wait(c, &p->base); /* answered by revoke_killed */
		return k;
	}
	free(p);
	if (k < 0)
		return k;
	(void)reply_body(r, MRD__RESPONSE__BODY_WINDOW_REVOKE);
	return 0;
}

int request_window_track(struct client *c, struct domain *d, const Mrd__Request *req,
			 struct wire_packet *pkt, struct reply *r)
{
	const Mrd__WindowTrackRequest *q = req->window_track;
	Mrd__WindowTrackResponse *body;
	int k;

	(void)d, (void)pkt;
	if (!c->bound || c->bound_lost) {
		reply_set_message(r, "WindowTrack: this connection has no PD of its own bound "
				  "(mrd_client_bind_pd)%s", c->bound_lost ?
				  ", or it was let go: connect again" : "");
		return -ENXIO;
	}
	k = bound_pd_track(c->bound, q->clear, q->add, q->n_add, q->remove, q->n_remove);
	if (k == -ENOSPC) {
		reply_set_message(r, "WindowTrack: a connection tracks %u windows at most; it has "
				  "%u", BOUND_PD_WINDOWS_MAX, c->bound->n_windows);
		return k;
	}
	if (k < 0)
		return k;
	body = reply_body(r, MRD__RESPONSE__BODY_WINDOW_TRACK);
	body->tracked = (uint32_t)k;
	return 0;
}
