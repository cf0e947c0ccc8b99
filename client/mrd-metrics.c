/* SPDX-License-Identifier: MIT */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "macro.h"
#include "mrd-metrics.h"

/* A per-domain family: its field of DomainInfo, read as uint32 or uint64. */
struct domain_family {
	const char *name;
	enum metric_type type;
	const char *unit;
	const char *help;
	size_t offset;
	bool u32;
};

#define D64(n, t, u, h, f) { n, t, u, h, offsetof(Mrd__DomainInfo, f), false }
#define D32(n, t, u, h, f) { n, t, u, h, offsetof(Mrd__DomainInfo, f), true }

static const struct domain_family domain_families[] = {
	D32("mrd_domain_clients", METRIC_GAUGE, NULL, "Clients connected in the domain.", clients),
	D32("mrd_domain_quota_clients", METRIC_GAUGE, NULL, "The domain's quota of clients.",
	    quota_clients),
	D64("mrd_domain_allocated_bytes", METRIC_GAUGE, "bytes",
	    "Shared memory the domain's clients allocated.", allocated_bytes),
	D64("mrd_domain_quota_allocated_bytes", METRIC_GAUGE, "bytes",
	    "The domain's quota of allocated memory.", quota_allocated_bytes),
	D64("mrd_domain_pinned_bytes", METRIC_GAUGE, "bytes",
	    "Memory registered and pinned for the domain.", pinned_bytes),
	D64("mrd_domain_quota_pinned_bytes", METRIC_GAUGE, "bytes",
	    "The domain's quota of pinned memory.", quota_pinned_bytes),
	D32("mrd_domain_allocations", METRIC_GAUGE, NULL, "Allocations live in the domain.",
	    allocations),
	D32("mrd_domain_quota_allocations", METRIC_GAUGE, NULL,
	    "The domain's quota of allocations.", quota_allocations),
	D32("mrd_domain_arenas", METRIC_GAUGE, NULL, "Arenas (memfds) of the domain.", arenas),
	D32("mrd_domain_quota_arenas", METRIC_GAUGE, NULL, "The domain's quota of arenas.",
	    quota_arenas),
	D32("mrd_domain_mrs", METRIC_GAUGE, NULL,
	    "MRs mrd holds in the domain's PD: its cache's, ODP children and mempools'.", mrs),
	D32("mrd_domain_client_pd_mrs", METRIC_GAUGE, NULL,
	    "Registrations in the domain's clients' own PDs (BindPd).", client_pd_mrs),
	D64("mrd_domain_client_pd_mr_bytes", METRIC_GAUGE, "bytes",
	    "Bytes the registrations in the domain's clients' own PDs cover.", client_pd_mr_bytes),
	D64("mrd_domain_lookups", METRIC_COUNTER, NULL, "Addresses MR lookups answered.", lookups),
	D64("mrd_domain_lookup_misses", METRIC_COUNTER, NULL,
	    "Lookups the MR table did not hold (registered or refused then).", misses),
	D64("mrd_domain_registrations", METRIC_COUNTER, NULL, "MRs registered.", registrations),
	D64("mrd_domain_deregistrations", METRIC_COUNTER, NULL, "MRs deregistered.",
	    deregistrations),
	D64("mrd_domain_odp_faults", METRIC_COUNTER, NULL,
	    "Lookups and prefetches of on-demand memory that needed a child MR.", odp_faults),
	D32("mrd_domain_odp_children", METRIC_GAUGE, NULL, "Child MRs of on-demand memory live.",
	    odp_children),
	D64("mrd_domain_odp_invalidations", METRIC_COUNTER, NULL,
	    "Child MRs destroyed because their memory was freed.", odp_invalidations),
	D64("mrd_domain_quarantined_bytes", METRIC_GAUGE, "bytes",
	    "Freed memory kept back because its deregistration failed.", quarantined_bytes),
	D32("mrd_domain_waiting", METRIC_GAUGE, NULL,
	    "Allocations a warm restart took over, not yet back with their owners.", waiting),
};

static uint64_t domain_value(const Mrd__DomainInfo *d, const struct domain_family *f)
{
	const char *p = (const char *)d + f->offset;

	return f->u32 ? *(const uint32_t *)p : *(const uint64_t *)p;
}

static void write_daemon(struct metrics *m, const Mrd__StatusResponse *s)
{
	metrics_family(m, "mrd_build", METRIC_INFO, NULL, "The version of mrd and its device.");
	metrics_label(m, "version", s->server_version);
	metrics_label(m, "provider", s->provider);
	metrics_label(m, "device", s->device);
	metrics_value(m, 1);
	metrics_family(m, "mrd_uptime_seconds", METRIC_GAUGE, "seconds", "Time since mrd started.");
	metrics_value_double(m, (double)s->uptime_usec / 1e6);
	metrics_family(m, "mrd_device_up", METRIC_GAUGE, NULL,
		       "1 while the device works, 0 while mrd reopens it after a failure.");
	metrics_value(m, strcmp(s->device_state, "failed") != 0);
	metrics_family(m, "mrd_port_active", METRIC_GAUGE, NULL, "1 while the port is active.");
	metrics_value(m, s->port_active);
	metrics_family(m, "mrd_domains", METRIC_GAUGE, NULL, "Protection domains open.");
	metrics_value(m, s->domains);
	metrics_family(m, "mrd_clients", METRIC_GAUGE, NULL, "Clients connected.");
	metrics_value(m, s->clients);
	metrics_family(m, "mrd_max_clients", METRIC_GAUGE, NULL, "Clients mrd accepts at most.");
	metrics_value(m, s->max_clients);
	metrics_family(m, "mrd_quarantined_bytes", METRIC_GAUGE, "bytes",
		       "Freed memory kept back because its deregistration failed.");
	metrics_value(m, s->quarantined_bytes);
	metrics_family(m, "mrd_device_failures", METRIC_COUNTER, NULL,
		       "Times the device failed (fatal event or removal).");
	metrics_value(m, s->device_failures);
	if (*s->view) /* not an administrator: the daemon-wide counters are not its to see */
		return;
	metrics_family(m, "mrd_requests", METRIC_COUNTER, NULL, "Requests dispatched.");
	metrics_value(m, s->requests);
	metrics_family(m, "mrd_protocol_errors", METRIC_COUNTER, NULL,
		       "Malformed or refused frames.");
	metrics_value(m, s->protocol_errors);
	metrics_family(m, "mrd_clients_dropped", METRIC_COUNTER, NULL,
		       "Connections mrd closed for misbehaviour.");
	metrics_value(m, s->clients_dropped);
}

static void write_domains(struct metrics *m, const Mrd__ClientsResponse *c)
{
	for (size_t k = 0; k < ELEMENTSOF(domain_families); k++) {
		const struct domain_family *f = &domain_families[k];

		metrics_family(m, f->name, f->type, f->unit, f->help);
		for (size_t i = 0; i < c->n_domains; i++) {
			metrics_label(m, "domain", c->domains[i]->name);
			metrics_value(m, domain_value(c->domains[i], f));
		}
	}
	metrics_family(m, "mrd_domains_omitted", METRIC_GAUGE, NULL,
		       "Domains the reply had no room for: their figures are missing here.");
	metrics_value(m, c->domains_omitted);
}

/* A pool's key, as labels. */
static void pool_labels(struct metrics *m, const char *domain, const Mrd__FrmrPoolInfo *p)
{
	char access[16], vendor[16], pages[24];

	snprintf(access, sizeof(access), "%" PRIu32, p->access);
	snprintf(vendor, sizeof(vendor), "%" PRIu32, p->vendor);
	snprintf(pages, sizeof(pages), "%" PRIu64, p->pages);
	metrics_label(m, "domain", domain);
	metrics_label(m, "access", access);
	metrics_label(m, "odp", p->odp ? "1" : "0");
	metrics_label(m, "internal", p->internal ? "1" : "0");
	metrics_label(m, "vendor", vendor);
	metrics_label(m, "pages", pages);
}

static void write_pools(struct metrics *m, const Mrd__FrmrPoolsResponse *r)
{
	static const struct {
		const char *name;
		enum metric_type type;
		const char *help;
		size_t offset;
	} families[] = {
		{ "mrd_pool_hits", METRIC_COUNTER, "Registrations a parked MR handle served.",
		  offsetof(Mrd__FrmrPoolInfo, hits) },
		{ "mrd_pool_misses", METRIC_COUNTER, "Registrations the pool had no handle for.",
		  offsetof(Mrd__FrmrPoolInfo, misses) },
		{ "mrd_pool_queued", METRIC_GAUGE, "MR handles parked in the pool.",
		  offsetof(Mrd__FrmrPoolInfo, queued) },
		{ "mrd_pool_in_use", METRIC_GAUGE, "MR handles of the pool in use.",
		  offsetof(Mrd__FrmrPoolInfo, in_use) },
		{ "mrd_pool_aged", METRIC_COUNTER, "Parked MR handles destroyed after idling.",
		  offsetof(Mrd__FrmrPoolInfo, aged) },
	};

	/* Pools are per key; a series ends with its pool (flush --gc). */
	for (size_t k = 0; k < ELEMENTSOF(families); k++) {
		metrics_family(m, families[k].name, families[k].type, NULL, families[k].help);
		for (size_t i = 0; i < r->n_domains; i++)
			for (size_t j = 0; j < r->domains[i]->n_pools; j++) {
				const Mrd__FrmrPoolInfo *p = r->domains[i]->pools[j];

				pool_labels(m, r->domains[i]->domain, p);
				metrics_value(m, *(const uint64_t *)((const char *)p +
								     families[k].offset));
			}
	}
	metrics_family(m, "mrd_domain_pools_on", METRIC_GAUGE, NULL,
		       "1 where the domain's MR handle pools are on.");
	for (size_t i = 0; i < r->n_domains; i++) {
		metrics_label(m, "domain", r->domains[i]->domain);
		metrics_value(m, !*r->domains[i]->off);
	}
	metrics_family(m, "mrd_domain_key_quarantine", METRIC_GAUGE, NULL,
		       "Released MRs parked so that their keys stay dead.");
	for (size_t i = 0; i < r->n_domains; i++) {
		metrics_label(m, "domain", r->domains[i]->domain);
		metrics_value(m, r->domains[i]->quarantined);
	}
	metrics_family(m, "mrd_pools_omitted", METRIC_GAUGE, NULL,
		       "Pools the reply had no room for: their figures are missing here.");
	metrics_value(m, r->pools_omitted);
}

void mrd_metrics_write(struct metrics *m, const Mrd__StatusResponse *status,
		       const Mrd__ClientsResponse *clients, const Mrd__FrmrPoolsResponse *pools)
{
	write_daemon(m, status);
	write_domains(m, clients);
	write_pools(m, pools);
	metrics_end(m);
}
