/* SPDX-License-Identifier: MIT */
/* The mempool family: MempoolRegister, MempoolUnregister, and the admin's Pools. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mrd/mrd.h"
#include "provider/provider.h"
#include "registration/mempool.h"
#include "core/domain-stats.h"
#include "core/domain.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

/* Names end up in root's mrctl output and in logs: printable ASCII alone, refused at the door
 * (mrctl escapes what it prints besides). */
static int check_name(const char *name, struct reply *r)
{
	size_t len = strnlen(name, MRD_MEMPOOL_NAME_MAX);

	if (len == 0 || len >= MRD_MEMPOOL_NAME_MAX) {
		reply_set_message(r, "a mempool name is 1 to %u bytes of printable ASCII",
				  MRD_MEMPOOL_NAME_MAX - 1);
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e) {
			reply_set_message(r, "a mempool name is printable ASCII: byte %zu is 0x%02x",
					  i, (unsigned)(unsigned char)name[i]);
			return -EINVAL;
		}
	return 0;
}

/* The reply: the registration's MRs, by address. */
static int fill_register_reply(const struct pool_reg *reg, struct reply *r)
{
	_cleanup_free_ struct mr_entry *e = calloc(reg->n_mrs, sizeof(*e));
	Mrd__MempoolRegisterResponse *body;
	Mrd__MrEntry **ptrs;

	if (!e)
		return -ENOMEM;
	for (size_t i = 0; i < reg->n_mrs; i++)
		e[i] = (struct mr_entry){ .start = reg->mrs[i]->start, .end = reg->mrs[i]->end,
					  .lkey = reg->mrs[i]->pmr->lkey,
					  .rkey = reg->mrs[i]->pmr->rkey };
	ptrs = fill_mr_entries(r, e, reg->n_mrs);
	if (!ptrs)
		return -ENOMEM;
	body = reply_body(r, MRD__RESPONSE__BODY_MEMPOOL_REGISTER);
	body->n_entries = reg->n_mrs;
	body->entries = ptrs;
	return 0;
}

/* The reply to a registration made (here or by a worker): its MRs' keys. A client that hears
 * of a failure has nothing registered. */
static int register_answer(struct client *c, const struct pool_reg *reg, struct reply *r)
{
	char name[sizeof(reg->name)];
	int k = fill_register_reply(reg, r);

	if (k < 0) {
		snprintf(name, sizeof(name), "%s", reg->name); /* reg goes with it */
		(void)mempool_unregister(&c->domain->reg.mempools, &c->owner, name, NULL, r->message,
					 sizeof(r->message));
		reply_set_message(r, "out of memory for the reply to MempoolRegister");
	}
	return k;
}

/* A registration a worker makes: answered when it is made. */
struct pending_register {
	struct pending_request base; /* first */
	struct pool_reg *reg;
};

static void register_resume(struct waiter *w, int result, const struct mr_entry *entry,
			    const char *why)
{
	struct pending_register *p = (struct pending_register *)w;
	struct reply r;
	int k = result;

	if (p->base.client) {
		reply_init(&r, p->base.id);
		if (k < 0)
			reply_set_message(&r, "%s", why);
		else
			k = register_answer(p->base.client, p->reg, &r);
		request_answer(&p->base, &r, k);
	}
	free(p);
}

int request_mempool_register_check(const Mrd__Request *req, struct reply *r)
{
	const Mrd__MempoolRegisterRequest *q = req->mempool_register;
	int k;

	k = check_name(q->name, r);
	if (k < 0)
		return k;
	if (q->n_starts == 0 || q->n_starts > MRD_MEMPOOL_RANGES_MAX ||
	    q->n_starts != q->n_lengths) {
		reply_set_message(r, "MempoolRegister takes 1 to %u ranges, as many starts as "
				  "lengths", MRD_MEMPOOL_RANGES_MAX);
		return -EINVAL;
	}
	return 0;
}

int request_mempool_register(struct client *c, struct domain *d, const Mrd__Request *req,
			     struct wire_packet *pkt, struct reply *r)
{
	const Mrd__MempoolRegisterRequest *q = req->mempool_register;
	struct pending_register *p;
	int k;

	p = request_pending_new(sizeof(*p), req->id, register_resume);
	if (!p)
		return -ENOMEM;
	k = mempool_register(&d->reg.mempools, &c->owner, q->name, q->starts, q->lengths,
			     q->n_starts, q->extmem, &p->base.waiter, &p->reg, r->message,
			     sizeof(r->message));
	if (k == -EINPROGRESS) {
		request_wait(c, &p->base);
		return k;
	}
	if (k >= 0)
		k = register_answer(c, p->reg, r);
	free(p);
	return k;
}

/* An unregistration whose MRs workers deregister: answered once their keys are dead. */
static void unregister_resume(struct waiter *w, int result, const struct mr_entry *entry,
			      const char *why)
{
	struct pending_request *p = (struct pending_request *)w;
	struct reply r;

	if (p->client) {
		reply_init(&r, p->id);
		(void)reply_body(&r, MRD__RESPONSE__BODY_MEMPOOL_UNREGISTER);
		request_answer(p, &r, 0);
	}
	free(p);
}

int request_mempool_unregister_check(const Mrd__Request *req, struct reply *r)
{
	return check_name(req->mempool_unregister->name, r);
}

int request_mempool_unregister(struct client *c, struct domain *d, const Mrd__Request *req,
			       struct wire_packet *pkt, struct reply *r)
{
	const char *name = req->mempool_unregister->name;
	struct pending_request *p;
	int k;

	p = request_pending_new(sizeof(*p), req->id, unregister_resume);
	if (!p)
		return -ENOMEM;
	k = mempool_unregister(&d->reg.mempools, &c->owner, name, &p->waiter, r->message,
			       sizeof(r->message));
	if (k == -EINPROGRESS) {
		request_wait(c, p);
		return k;
	}
	free(p);
	if (k < 0)
		return k;
	(void)reply_body(r, MRD__RESPONSE__BODY_MEMPOOL_UNREGISTER);
	return 0;
}

static void mempool_info(Mrd__MempoolInfo *pi, const struct domain *d, const struct pool_reg *reg)
{
	const struct client *owner;

	mrd__mempool_info__init(pi);
	pi->domain = (char *)d->name;
	if (reg->owner == &d->leaving) { /* its client left: it goes a share a turn */
		pi->pid = 0;
		pi->client_name = (char *)"(left)";
	} else {
		owner = container_of(reg->owner, struct client, owner);
		pi->pid = (int32_t)owner->owner.mem.pid;
		pi->client_name = (char *)owner->name;
	}
	pi->name = (char *)reg->name;
	pi->extmem = reg->extmem;
}

static void mempool_mr_info(Mrd__MempoolMrInfo *mi, const struct pool_mr *mr)
{
	mrd__mempool_mr_info__init(mi);
	mi->start = mr->start;
	mi->end = mr->end;
	/* A worker may be writing pmr: only a settled MR has keys. */
	mi->lkey = !mr->pending && mr->pmr ? mr->pmr->lkey : MRD_KEY_INVALID;
	mi->rkey = !mr->pending && mr->pmr ? mr->pmr->rkey : MRD_KEY_INVALID;
	mi->pending = mr->pending;
	mi->sharers = mr->sharers;
	mi->hugepage = mr->hugepage;
}

/* What reg takes in a Mempools reply. */
static size_t mempool_size(const struct domain *d, const struct pool_reg *reg)
{
	Mrd__MempoolInfo pi;
	size_t mrs = 0, len, n = 1;

	mempool_info(&pi, d, reg);
	for (size_t k = 0; k < reg->n_mrs; k++) {
		Mrd__MempoolMrInfo mi;

		mempool_mr_info(&mi, reg->mrs[k]);
		mrs += reply_repeated_size(&mi.base);
	}
	len = protobuf_c_message_get_packed_size(&pi.base) + mrs;
	for (size_t v = len; v >= 0x80; v >>= 7)
		n++;
	return 1 + n + len;
}

/* A page: the pools the caller may see from q->first on, as many as fit in a reply (one at
 * least, so that every page moves on). */
int request_mempools(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		     struct wire_packet *pkt, struct reply *r)
{
	const struct manager *m = c->manager;
	const uint32_t first = req->mempools->first;
	const char *view = client_view(c);
	size_t budget = reply_budget(c), bytes = 0;
	size_t n_pools = 0, n_mrs = 0, i = 0, j = 0;
	Mrd__MempoolInfo *pi, **pip;
	Mrd__MempoolMrInfo *mi, **mip;
	Mrd__MempoolsResponse *body;
	uint32_t total = 0;
	struct pool_reg *reg;
	struct domain *d;
	bool full = false;

	/* First the page's extent, then the page. */
	LIST_FOREACH(d, &m->core.domains, link)
		for (reg = domain_next_mempool(d, NULL); reg; reg = domain_next_mempool(d, reg)) {
			if (!access_view_shows(view, d->name))
				continue;
			if (total++ < first || full)
				continue;
			bytes += mempool_size(d, reg);
			if (n_pools > 0 && bytes > budget) {
				full = true;
				continue;
			}
			n_pools++;
			n_mrs += reg->n_mrs;
		}
	/* One block per array, freed with the reply. */
	pi = calloc(n_pools, sizeof(*pi));
	pip = calloc(n_pools, sizeof(*pip));
	mi = calloc(n_mrs, sizeof(*mi));
	mip = calloc(n_mrs, sizeof(*mip));
	r->owned[r->n_owned++] = pi;
	r->owned[r->n_owned++] = pip;
	r->owned[r->n_owned++] = mi;
	r->owned[r->n_owned++] = mip;
	if ((n_pools && (!pi || !pip)) || (n_mrs && (!mi || !mip)))
		return -ENOMEM;

	total = 0;
	LIST_FOREACH(d, &m->core.domains, link)
		for (reg = domain_next_mempool(d, NULL); reg; reg = domain_next_mempool(d, reg)) {
			if (!access_view_shows(view, d->name))
				continue;
			if (total++ < first || i == n_pools)
				continue;
			mempool_info(&pi[i], d, reg);
			pi[i].mrs = &mip[j];
			pi[i].n_mrs = reg->n_mrs;
			for (size_t k = 0; k < reg->n_mrs; k++, j++) {
				mempool_mr_info(&mi[j], reg->mrs[k]);
				mip[j] = &mi[j];
			}
			pip[i] = &pi[i];
			i++;
		}
	body = reply_body(r, MRD__RESPONSE__BODY_MEMPOOLS);
	body->n_mempools = n_pools;
	body->mempools = pip;
	body->total = total;
	body->next = first + n_pools < total ? first + (uint32_t)n_pools : 0;
	return 0;
}
