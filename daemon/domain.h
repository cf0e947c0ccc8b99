/* SPDX-License-Identifier: MIT */
/* A domain: clients that trust each other (one uid for now). Each has its own provider context
 * and PD, because whoever holds a context can act on every object in it. */
#pragma once

#include <sys/queue.h>
#include <sys/types.h>

struct manager;
struct provider;
struct provider_pd;

struct domain {
	struct manager *manager;
	LIST_ENTRY(domain) link;
	uid_t uid;
	unsigned n_users; /* clients holding it */
	struct provider *provider;
	struct provider_pd *pd;
};

/* The domain of uid, opened on first use; the caller holds a reference. */
int domain_acquire(struct manager *m, uid_t uid, struct domain **ret);
/* Drops a reference; the last one closes the domain. NULL-safe; returns NULL. */
struct domain *domain_release(struct domain *d);
