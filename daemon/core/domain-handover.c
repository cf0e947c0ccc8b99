/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "macro.h"
#include "provider/provider.h"
#include "memory/arena.h"
#include "core/core.h"
#include "core/domain-handover.h"
#include "core/domain.h"

/* ---- saving ---- */

/* Who may take an allocation back: its owner's process and session, or, for one still
 * waiting from an earlier hand-over, the same as then. */
static void claim_of(const struct allocation *a, struct adopted_allocation *s)
{
	if (a->owner) {
		s->session = a->owner->session;
		s->pid = a->owner->pid;
		s->uid = a->owner->uid;
		s->start_time = mem_owner_start_time(a->owner);
	} else if (a->orphan) {
		s->session = a->claim_session;
		s->pid = a->claim_pid;
		s->uid = a->claim_uid;
		s->start_time = a->claim_start_time;
	}
	/* else nobody's: its owner left while other clients' mempools cover it. It waits one
	 * check for them to register those mempools again. */
}

/* An arena with live allocations: them, where it is, and a dup of its memfd. */
static int save_arena(const struct arena *a, struct saved_arena *sa)
{
	sa->allocations = calloc(a->n_runs, sizeof(*sa->allocations));
	if (!sa->allocations)
		return -ENOMEM;
	for (size_t i = 0; i < a->n_runs; i++) {
		const struct allocation *al = a->runs[i];
		struct adopted_allocation *s = &sa->allocations[i];

		claim_of(al, s);
		s->offset = al->offset;
		s->length = al->length;
		s->serial = al->serial;
		s->odp = al->odp;
		s->read_only = al->read_only;
		s->alias = al->alias;
		s->alias_access = al->alias_access;
		s->span_offset = al->span_offset;
		s->span_length = al->span_length;
		for (unsigned j = 0; j < al->n_more_spans; j++) {
			s->more_spans[2 * j] = al->more_spans[j].offset;
			s->more_spans[2 * j + 1] = al->more_spans[j].length;
		}
		s->n_more_spans = al->n_more_spans;
	}
	sa->n_allocations = a->n_runs;
	sa->place = (struct arena_place){
		.slot = a->id, .size = a->size, .file_offset = a->file_offset, .serial = a->serial,
		.page_size = a->page_size, .hugetlb = a->hugetlb, .external = a->external,
	};
	sa->memfd = fcntl(a->memfd, F_DUPFD_CLOEXEC, 3);
	return sa->memfd < 0 ? negative_errno() : 0;
}

static int save_domain(struct domain *d, struct saved_domain *sd)
{
	struct arena *a;
	int r;

	sd->name = d->name;
	sd->arenas = calloc(d->mem.n_arenas ? d->mem.n_arenas : 1, sizeof(*sd->arenas));
	if (!sd->arenas)
		return -ENOMEM;
	domain_bump_generation(d);
	sd->generation = d->mem.status.page->generation;
	sd->allocation_serial = d->mem.allocation_serial;
	sd->frees = d->mem.status.page->frees;
	sd->exported_to = d->exported_to;
	sd->n_exported_to = d->n_exported_to;
	sd->pinned_bytes = d->reg.cache.charges.pinned_bytes;
	sd->mrs = d->reg.cache.n_mrs + d->reg.odp.children;
	sd->device = d->reg.base.provider->caps.device;
	LIST_FOREACH(a, &d->mem.arenas, link) {
		struct saved_arena *sa = &sd->arenas[sd->n_arenas];

		if (a->n_runs == 0)
			continue;
		*sa = (struct saved_arena){ .memfd = -1 };
		sd->n_arenas++;
		r = save_arena(a, sa);
		if (r < 0)
			return r;
	}
	return 0;
}

int domains_save(struct core *core, struct saved_domain **ret, size_t *ret_n)
{
	struct saved_domain *saved = calloc(core->n_domains ? core->n_domains : 1, sizeof(*saved));
	struct domain *d;
	size_t n = 0;
	int r = 0;

	if (!saved)
		return -ENOMEM;
	LIST_FOREACH(d, &core->domains, link)
		if ((r = save_domain(d, &saved[n++])) < 0)
			break;
	if (r < 0) {
		saved_domains_free(saved, n);
		return r;
	}
	*ret = saved;
	*ret_n = n;
	return 0;
}

void saved_domains_free(struct saved_domain *saved, size_t n)
{
	for (size_t i = 0; saved && i < n; i++) {
		for (size_t j = 0; j < saved[i].n_arenas; j++) {
			safe_close(saved[i].arenas[j].memfd);
			free(saved[i].arenas[j].allocations);
		}
		free(saved[i].arenas);
	}
	free(saved);
}

/* ---- adopting ---- */

/* Returns how many allocations it took over: none of an attachment its owner sealed. */
static int adopt_arena(struct domain *d, struct saved_arena *sa, char *why, size_t why_size)
{
	struct arena *a;
	int r;

	if (sa->memfd < 0) {
		snprintf(why, why_size, "domain %s: arena %s was not passed", d->name, sa->label);
		return sa->memfd;
	}
	r = arena_adopt(&d->mem, sa->memfd, &sa->place, &a);
	if (r == -EPERM && sa->place.external) {
		/* The client sealed its own memfd: its attachment is lost, nobody else's. */
		sa->memfd = safe_close(sa->memfd);
		log_warning("domain %s: attached memory at slot %u was sealed against writes by its "
			    "owner and is not taken over (%zu allocation(s) dropped; the owner's "
			    "mrd_client_reconnect() says so)", d->name, sa->place.slot,
			    sa->n_allocations);
		return 0;
	}
	if (r < 0) {
		sa->memfd = safe_close(sa->memfd);
		snprintf(why, why_size, "domain %s: arena %s at slot %u: %s", d->name, sa->label,
			 sa->place.slot, strerror(-r));
		return r;
	}
	sa->memfd = -1; /* the arena's */
	for (size_t i = 0; i < sa->n_allocations; i++) {
		const struct adopted_allocation *s = &sa->allocations[i];

		r = domain_adopt_allocation(d, a, s);
		if (r < 0) {
			snprintf(why, why_size, "domain %s: arena %s: allocation at +0x%" PRIx64
				 " of %" PRIu64 " bytes: %s", d->name, sa->label, s->offset,
				 s->length, strerror(-r));
			return r;
		}
	}
	r = arena_adopt_finish(a);
	if (r < 0) {
		snprintf(why, why_size, "domain %s: attached arena %s is not one whole allocation",
			 d->name, sa->label);
		return r;
	}
	return (int)sa->n_allocations;
}

int domains_record_floors(struct core *core, const struct saved_domain *saved, size_t n)
{
	struct generation_floor *f;

	if (n == 0 || n > SIZE_MAX / sizeof(*f))
		return 0;
	f = reallocarray(core->floors, core->n_floors + n, sizeof(*f));
	if (!f)
		return -ENOMEM;
	core->floors = f;
	for (size_t i = 0; i < n; i++) {
		struct generation_floor *g = &core->floors[core->n_floors];

		if (!saved[i].name)
			continue;
		snprintf(g->name, sizeof(g->name), "%s", saved[i].name);
		g->generation = saved[i].generation;
		core->n_floors++;
	}
	return 0;
}

int domains_adopt(struct core *core, struct saved_domain *saved, size_t n,
		  unsigned *ret_allocations, char *why, size_t why_size)
{
	int r;

	*ret_allocations = 0;
	for (size_t i = 0; i < n; i++) {
		const char *name = saved[i].name;
		struct domain *d;

		r = name && *name && strlen(name) < sizeof(d->name) ?
			    domain_adopt(core, name, saved[i].allocation_serial, saved[i].frees,
					 &d) : -EINVAL;
		if (r < 0) {
			snprintf(why, why_size, "domain '%s': %s", name ? name : "", strerror(-r));
			return r;
		}
		for (size_t j = 0; j < saved[i].n_arenas; j++) {
			r = adopt_arena(d, &saved[i].arenas[j], why, why_size);
			if (r < 0)
				return r;
			*ret_allocations += (unsigned)r;
		}
		domain_update_status(d);
	}
	/* Domains where nothing waits need no hold. */
	for (struct domain *d = LIST_FIRST(&core->domains), *next; d; d = next) {
		next = LIST_NEXT(d, link);
		if (d->mem.n_orphans == 0)
			(void)domain_reap_orphans(d, true);
	}
	return 0;
}

unsigned domains_reap_orphans(struct core *core, bool all)
{
	struct domain *d, *next;
	unsigned waiting = 0;

	for (d = LIST_FIRST(&core->domains); d; d = next) {
		next = LIST_NEXT(d, link);
		waiting += domain_reap_orphans(d, all); /* may close d */
	}
	return waiting;
}

unsigned domains_client_pds_left(const struct core *core)
{
	const struct mr_cache *bc;
	const struct domain *d;
	unsigned left = 0;

	LIST_FOREACH(d, &core->domains, link)
		LIST_FOREACH(bc, &d->reg.cache.bound, bound_link)
			left++;
	return left;
}
