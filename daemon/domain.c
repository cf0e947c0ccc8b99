/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "domain.h"
#include "log.h"
#include "manager.h"
#include "provider.h"

static struct domain *domain_free(struct domain *d)
{
	int r;

	if (!d)
		return NULL;
	if (d->pd) {
		r = provider_pd_free(d->pd);
		if (r < 0)
			log_warning_errno(r, "domain of uid %u: cannot free its PD: %m", (unsigned)d->uid);
	}
	provider_close(d->provider);
	if (d->manager) {
		LIST_REMOVE(d, link);
		d->manager->n_domains--;
	}
	free(d);
	return NULL;
}

int domain_acquire(struct manager *m, uid_t uid, struct domain **ret)
{
	struct domain *d;
	int r;

	LIST_FOREACH(d, &m->domains, link)
		if (d->uid == uid) {
			d->n_users++;
			*ret = d;
			return 0;
		}

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->uid = uid;
	d->manager = m;
	LIST_INSERT_HEAD(&m->domains, d, link);
	m->n_domains++;

	/* Its own context on the device mrd opened at start. */
	r = m->provider->ops->open(m->provider->caps.device, &d->provider);
	if (r >= 0)
		r = provider_pd_alloc(d->provider, &d->pd);
	if (r < 0) {
		log_warning_errno(r, "cannot open a %s domain for uid %u: %m",
				  provider_name(m->provider), (unsigned)uid);
		domain_free(d);
		return r;
	}
	log_debug("domain of uid %u opened on %s", (unsigned)uid, m->provider->caps.device);
	d->n_users = 1;
	*ret = d;
	return 0;
}

struct domain *domain_release(struct domain *d)
{
	if (d && --d->n_users == 0) {
		log_debug("domain of uid %u closed", (unsigned)d->uid);
		domain_free(d);
	}
	return NULL;
}
