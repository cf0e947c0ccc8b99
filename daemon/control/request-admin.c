/* SPDX-License-Identifier: MIT */
/* FrmrPools, FrmrPoolsSet and Flush: the admin's view and control of the handle pools and
 * of the domains' tables. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "registration/frmr-pool.h"
#include "core/access.h"
#include "core/domain-stats.h"
#include "core/domain.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

static void pool_info(Mrd__FrmrPoolInfo *pi, const struct frmr_pool_stats *s)
{
	mrd__frmr_pool_info__init(pi);
	pi->access = s->key.access;
	pi->odp = s->key.odp;
	pi->internal = s->key.internal;
	pi->vendor = s->key.vendor;
	pi->pages = s->key.pages;
	pi->queued = s->queued;
	pi->in_use = s->in_use;
	pi->max_in_use = s->max_in_use;
	pi->hits = s->hits;
	pi->misses = s->misses;
	pi->aged = s->aged;
	pi->aging_s = s->aging_s;
	pi->pinned = s->pinned;
}

int request_frmr_pools(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		       struct wire_packet *pkt, struct reply *r)
{
	const struct manager *m = c->manager;
	_cleanup_free_ struct frmr_pool_stats *stats = NULL;
	Mrd__FrmrPoolsResponse *body;
	Mrd__FrmrDomainInfo *di, **dip;
	Mrd__FrmrPoolInfo *pi, **pip;
	size_t n_domains = 0, n_pools = 0, i = 0, j = 0, budget = reply_budget(c), bytes = 0;
	struct domain *d;

	LIST_FOREACH(d, &m->core.domains, link) {
		if (!access_view_shows(client_view(c), d->name))
			continue;
		n_domains++;
		n_pools += domain_pool_stats(d, NULL, 0);
	}
	/* One block per array, freed with the reply. Workers may add pools meanwhile: those
	 * beyond this count wait for the next request. */
	di = calloc(n_domains, sizeof(*di));
	dip = calloc(n_domains, sizeof(*dip));
	pi = calloc(n_pools, sizeof(*pi));
	pip = calloc(n_pools, sizeof(*pip));
	stats = calloc(n_pools, sizeof(*stats));
	r->owned[r->n_owned++] = di;
	r->owned[r->n_owned++] = dip;
	r->owned[r->n_owned++] = pi;
	r->owned[r->n_owned++] = pip;
	if ((n_domains && (!di || !dip)) || (n_pools && (!pi || !pip || !stats)))
		return -ENOMEM;

	body = reply_body(r, MRD__RESPONSE__BODY_FRMR_POOLS);
	LIST_FOREACH(d, &m->core.domains, link) {
		struct domain_stats ds;
		size_t got;

		if (!access_view_shows(client_view(c), d->name))
			continue;
		got = domain_pool_stats(d, stats + j, n_pools - j);
		got = got < n_pools - j ? got : n_pools - j;
		if (bytes > budget) { /* what does not fit is counted */
			body->domains_omitted++;
			body->pools_omitted += (uint32_t)got;
			continue;
		}
		domain_stats(d, &ds);
		mrd__frmr_domain_info__init(&di[i]);
		di[i].domain = d->name;
		di[i].off = (char *)ds.pools_off;
		di[i].queued = ds.pools_queued;
		di[i].max_queued = ds.pools_config.max_queued;
		di[i].aging_s = ds.pools_config.aging_s;
		di[i].pinned = ds.pools_config.pinned;
		di[i].quarantined = ds.keys_held;
		di[i].unparked = ds.keys_unparked;
		di[i].quarantine_on = ds.keys_quarantine_on;
		di[i].pools = &pip[j];
		bytes += reply_repeated_size(&di[i].base) + 4; /* its length grows with its pools */
		for (size_t k = 0; k < got; k++) {
			pool_info(&pi[j + k], &stats[j + k]);
			bytes += reply_repeated_size(&pi[j + k].base);
			if (bytes > budget) {
				body->pools_omitted += (uint32_t)(got - k);
				break;
			}
			pip[j + k] = &pi[j + k];
			di[i].n_pools++;
		}
		j += got;
		dip[i] = &di[i];
		i++;
	}
	body->n_domains = i;
	body->domains = dip;
	return 0;
}

int request_frmr_pools_set(struct client *c, struct domain *no_domain, const Mrd__Request *req,
			   struct wire_packet *pkt, struct reply *r)
{
	const Mrd__FrmrPoolsSetRequest *q = req->frmr_pools_set;
	Mrd__FrmrPoolsSetResponse *body;
	struct frmr_match match = FRMR_MATCH_ANY;
	uint32_t given = q->given;
	int64_t aging = given & MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_AGING ? (int64_t)q->aging_s : -1;
	int64_t pinned = given & MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_PINNED ? (int64_t)q->pinned : -1;
	unsigned changed = 0;
	int r2;

	if (aging < 0 && pinned < 0) {
		reply_set_message(r, "nothing to set: give aging or pinned");
		return -EINVAL;
	}
	if (aging == 0) {
		reply_set_message(r, "aging must be at least 1 second");
		return -EINVAL;
	}
	if (given & MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_ACCESS)
		match.access = q->access;
	if (given & MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_ODP)
		match.odp = q->odp;
	if (given & MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_INTERNAL)
		match.internal = q->internal;
	if (given & MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_VENDOR)
		match.vendor = q->vendor;
	if (given & MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_PAGES)
		match.pages = q->pages > INT64_MAX ? INT64_MAX : (int64_t)q->pages;

	r2 = domains_set_pools(&c->manager->core, q->domain, &match, aging, pinned, &changed);
	if (r2 == -ENOENT) {
		reply_set_message(r, "no domain %s is open", q->domain);
		return r2;
	}
	if (r2 < 0)
		return r2;
	body = reply_body(r, MRD__RESPONSE__BODY_FRMR_POOLS_SET);
	body->changed = changed;
	return 0;
}

int request_flush(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		  struct wire_packet *pkt, struct reply *r)
{
	const Mrd__FlushRequest *q = req->flush;
	struct manager *m = c->manager;
	Mrd__FlushResponse *body;
	struct flush_counts counts;
	char name[64];
	const char *want = NULL;
	int k;

	if (*q->domain && q->by_uid) {
		reply_set_message(r, "give a domain or a uid, not both");
		return -EINVAL;
	}
	if (*q->domain)
		want = q->domain;
	else if (q->by_uid) /* the domain the uid's clients join, by uid alone */
		want = access_domain_name(&m->core.config, &ACCESS_PEER_UID((uid_t)q->uid), name,
					  sizeof(name));
	k = domains_flush(&m->core, want, q->pools, q->gc, &counts);
	if (k == -ENOENT) {
		reply_set_message(r, "no domain %s is open", want);
		return k;
	}
	body = reply_body(r, MRD__RESPONSE__BODY_FLUSH);
	body->domains = counts.domains;
	body->handles = counts.handles;
	body->pools_removed = counts.pools_removed;
	return 0;
}
