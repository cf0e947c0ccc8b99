/* SPDX-License-Identifier: MIT */
/* The memory-window family: WindowGrant (a window over the caller's own memory, bound on the
 * domain's PD) and WindowRevoke. */
#include <errno.h>
#include <inttypes.h>

#include "provider/provider.h"
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

/* A grant waits, whole, while a worker registers the MR it binds over. */
struct pending_grant {
	struct pending_request base; /* first */
	uint64_t address, length;
	unsigned access;
};

/* The grant of p: answered in r (0), refused, or -EINPROGRESS (waits for the MR). */
static int grant_run(struct pending_grant *p, struct reply *r)
{
	struct client *c = p->base.client;
	Mrd__WindowGrantResponse *body;
	uint32_t rkey;
	int k;

	k = domain_window_grant(c->domain, &c->owner.mem, p->address, p->length, p->access, &rkey,
				r->message, sizeof(r->message), &p->base.waiter);
	if (k < 0)
		return k;
	body = reply_body(r, MRD__RESPONSE__BODY_WINDOW_GRANT);
	body->rkey = rkey;
	return 0;
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
	p->address = q->address;
	p->length = q->length;
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

int request_window_revoke(struct client *c, struct domain *d, const Mrd__Request *req,
			  struct wire_packet *pkt, struct reply *r)
{
	int k;

	(void)pkt;
	k = domain_window_revoke(d, &c->owner.mem, req->window_revoke->rkey, r->message,
				 sizeof(r->message));
	if (k < 0)
		return k;
	(void)reply_body(r, MRD__RESPONSE__BODY_WINDOW_REVOKE);
	return 0;
}
