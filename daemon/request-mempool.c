/* SPDX-License-Identifier: MIT */
/* The mempool family: MempoolRegister, MempoolUnregister, and the admin's Pools. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "dispatch.h"
#include "domain.h"
#include "manager.h"
#include "mempool.h"
#include "mrd/mrd.h"
#include "provider.h"

static int check_name(const char *name, struct reply *r)
{
	size_t len = strnlen(name, MRD_MEMPOOL_NAME_MAX);

	if (len == 0 || len >= MRD_MEMPOOL_NAME_MAX) {
		reply_set_message(r, "a mempool name is 1 to %u bytes", MRD_MEMPOOL_NAME_MAX - 1);
		return -EINVAL;
	}
	return 0;
}

/* The reply: the registration's MRs, by address. */
static int fill_register_reply(const struct pool_reg *reg, struct reply *r)
{
	Mrd__MrEntry **ptrs = reply_mr_entries(r, reg->n_mrs);

	if (!ptrs)
		return -ENOMEM;
	for (size_t i = 0; i < reg->n_mrs; i++) {
		ptrs[i]->start = reg->mrs[i]->start;
		ptrs[i]->end = reg->mrs[i]->end;
		ptrs[i]->lkey = reg->mrs[i]->pmr->lkey;
		ptrs[i]->rkey = reg->mrs[i]->pmr->rkey;
	}
	mrd__mempool_register_response__init(&r->body.mempool_register);
	r->body.mempool_register.n_entries = reg->n_mrs;
	r->body.mempool_register.entries = ptrs;
	r->resp.body_case = MRD__RESPONSE__BODY_MEMPOOL_REGISTER;
	r->resp.mempool_register = &r->body.mempool_register;
	return 0;
}

/* A registration a worker makes: answered when it is made. */
struct pending_register {
	struct pending_request base; /* first */
	struct pool_reg *reg;
};

static void register_resume(struct mr_waiter *w, int result, const struct mr_entry *entry,
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
			k = fill_register_reply(p->reg, &r);
		request_answer(&p->base, &r, k);
	}
	free(p);
}

int request_mempool_register(struct client *c, const Mrd__Request *req,
			     struct wire_packet *pkt, struct reply *r)
{
	const Mrd__MempoolRegisterRequest *q = req->mempool_register;
	struct pending_register *p;
	struct domain *d;
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
	k = request_domain(c, r, &d);
	if (k < 0)
		return k;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->base.waiter.resume = register_resume;
	p->base.id = req->id;
	k = mempool_register(d, c, q->name, q->starts, q->lengths, q->n_starts, q->extmem,
			     &p->base.waiter, &p->reg, r->message, sizeof(r->message));
	if (k == -EINPROGRESS) {
		request_wait(c, &p->base);
		return k;
	}
	if (k >= 0) {
		k = fill_register_reply(p->reg, r);
		if (k < 0) /* the client hears of a failure: nothing may stay registered */
			(void)mempool_unregister(d, c, q->name, NULL, r->message,
						 sizeof(r->message));
	}
	free(p);
	return k;
}

static void set_unregister_body(struct reply *r)
{
	mrd__mempool_unregister_response__init(&r->body.mempool_unregister);
	r->resp.body_case = MRD__RESPONSE__BODY_MEMPOOL_UNREGISTER;
	r->resp.mempool_unregister = &r->body.mempool_unregister;
}

/* An unregistration whose MRs workers deregister: answered once their keys are dead. */
static void unregister_resume(struct mr_waiter *w, int result, const struct mr_entry *entry,
			      const char *why)
{
	struct pending_request *p = (struct pending_request *)w;
	struct reply r;

	if (p->client) {
		reply_init(&r, p->id);
		set_unregister_body(&r);
		request_answer(p, &r, 0);
	}
	free(p);
}

int request_mempool_unregister(struct client *c, const Mrd__Request *req,
			       struct wire_packet *pkt, struct reply *r)
{
	const char *name = req->mempool_unregister->name;
	struct pending_request *p;
	struct domain *d;
	int k;

	k = check_name(name, r);
	if (k < 0)
		return k;
	k = request_domain(c, r, &d);
	if (k < 0)
		return k;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->waiter.resume = unregister_resume;
	p->id = req->id;
	k = mempool_unregister(d, c, name, &p->waiter, r->message, sizeof(r->message));
	if (k == -EINPROGRESS) {
		request_wait(c, p);
		return k;
	}
	free(p);
	if (k < 0)
		return k;
	set_unregister_body(r);
	return 0;
}

int request_mempools(struct client *c, const Mrd__Request *req, struct wire_packet *pkt,
		     struct reply *r)
{
	const struct manager *m = c->manager;
	Mrd__MempoolInfo *pi, **pip;
	Mrd__MempoolMrInfo *mi, **mip;
	size_t n_pools = 0, n_mrs = 0, i = 0, j = 0;
	struct pool_reg *reg;
	struct domain *d;

	LIST_FOREACH(d, &m->domains, link)
		LIST_FOREACH(reg, &d->pool_regs, link) {
			if (!view_shows(client_view(c), d->name))
				continue;
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

	LIST_FOREACH(d, &m->domains, link)
		LIST_FOREACH(reg, &d->pool_regs, link) {
			if (!view_shows(client_view(c), d->name))
				continue;
			mrd__mempool_info__init(&pi[i]);
			pi[i].domain = d->name;
			pi[i].pid = (int32_t)reg->owner->pid;
			pi[i].client_name = reg->owner->name;
			pi[i].name = reg->name;
			pi[i].extmem = reg->extmem;
			pi[i].mrs = &mip[j];
			pi[i].n_mrs = reg->n_mrs;
			for (size_t k = 0; k < reg->n_mrs; k++, j++) {
				const struct pool_mr *mr = reg->mrs[k];

				mrd__mempool_mr_info__init(&mi[j]);
				mi[j].start = mr->start;
				mi[j].end = mr->end;
				/* A worker may be writing pmr: only a settled MR has keys. */
				mi[j].lkey = !mr->pending && mr->pmr ? mr->pmr->lkey :
								       MRD_KEY_INVALID;
				mi[j].rkey = !mr->pending && mr->pmr ? mr->pmr->rkey :
								       MRD_KEY_INVALID;
				mi[j].pending = mr->pending;
				mi[j].sharers = mr->sharers;
				mi[j].hugepage = mr->hugepage;
				mip[j] = &mi[j];
			}
			pip[i] = &pi[i];
			i++;
		}
	mrd__mempools_response__init(&r->body.mempools);
	r->body.mempools.n_mempools = n_pools;
	r->body.mempools.mempools = pip;
	r->resp.body_case = MRD__RESPONSE__BODY_MEMPOOLS;
	r->resp.mempools = &r->body.mempools;
	return 0;
}
