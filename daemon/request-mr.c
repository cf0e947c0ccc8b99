/* SPDX-License-Identifier: MIT */
/* The MR family: MrLookup (keys for addresses, registering on a miss) and Dma (the soft
 * provider's emulated DMA, driven by keys alone). */
#include <errno.h>
#include <stdlib.h>

#include "client.h"
#include "dispatch.h"
#include "domain.h"
#include "provider.h"

static int joined_domain(struct client *c, struct reply *r, struct domain **ret)
{
	int k = client_get_domain(c, ret);

	if (k < 0)
		reply_set_message(r, "cannot open domain %s", c->domain_name);
	return k;
}

int request_mr_lookup(struct client *c, const Mrd__Request *req, struct wire_packet *pkt,
		      struct reply *r)
{
	const Mrd__MrLookupRequest *q = req->mr_lookup;
	Mrd__MrEntry *entries, **ptrs;
	struct domain *d;
	int k;

	if (q->n_addresses == 0 || q->n_addresses > MRD_LOOKUP_BATCH_MAX) {
		reply_set_message(r, "MrLookup takes 1 to %u addresses, got %zu",
				  MRD_LOOKUP_BATCH_MAX, q->n_addresses);
		return -EINVAL;
	}
	k = joined_domain(c, r, &d);
	if (k < 0)
		return k;
	entries = calloc(q->n_addresses, sizeof(*entries));
	ptrs = calloc(q->n_addresses, sizeof(*ptrs));
	r->owned[r->n_owned++] = entries;
	r->owned[r->n_owned++] = ptrs;
	if (!entries || !ptrs)
		return -ENOMEM;

	for (size_t i = 0; i < q->n_addresses; i++) {
		struct mr_entry e;

		k = mr_cache_lookup(&d->cache, q->addresses[i], &e, r->message, sizeof(r->message));
		if (k < 0)
			return k;
		mrd__mr_entry__init(&entries[i]);
		entries[i].start = e.start;
		entries[i].end = e.end;
		entries[i].lkey = e.lkey;
		entries[i].rkey = e.rkey;
		ptrs[i] = &entries[i];
	}
	mrd__mr_lookup_response__init(&r->body.mr_lookup);
	r->body.mr_lookup.n_entries = q->n_addresses;
	r->body.mr_lookup.entries = ptrs;
	r->resp.body_case = MRD__RESPONSE__BODY_MR_LOOKUP;
	r->resp.mr_lookup = &r->body.mr_lookup;
	return 0;
}

int request_dma(struct client *c, const Mrd__Request *req, struct wire_packet *pkt,
		struct reply *r)
{
	const Mrd__DmaRequest *q = req->dma;
	struct domain *d;
	int k;

	if (q->op > PROVIDER_DMA_READ || q->length > MRD_DMA_MAX) {
		reply_set_message(r, "Dma: op must be 0 (write) or 1 (read), length at most %u",
				  MRD_DMA_MAX);
		return -EINVAL;
	}
	k = joined_domain(c, r, &d);
	if (k < 0)
		return k;
	k = provider_dma(d->pd, (enum provider_dma_op)q->op, q->lkey, q->laddr, q->rkey, q->raddr,
			 q->length);
	if (k == -EOPNOTSUPP)
		reply_set_message(r, "the %s provider does no emulated DMA", provider_name(d->provider));
	else if (k == -ENOKEY)
		reply_set_message(r, "a key is not valid: never handed out, or its memory was freed");
	else if (k == -EACCES)
		reply_set_message(r, "the keys do not grant this access");
	else if (k == -EFAULT)
		reply_set_message(r, "the range lies outside a key's registration");
	if (k < 0)
		return k;
	mrd__dma_response__init(&r->body.dma);
	r->resp.body_case = MRD__RESPONSE__BODY_DMA;
	r->resp.dma = &r->body.dma;
	return 0;
}
