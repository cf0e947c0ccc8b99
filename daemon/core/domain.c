/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "memory/arena.h"
#include "control/client.h"
#include "core/domain.h"
#include "log.h"
#include "macro.h"
#include "control/manager.h" /* domain_name_for: moves to core/access.c */
#include "core/core.h"
#include "base/process.h"
#include "provider/provider.h"
#include "status-page.h"
#include "base/worker-pool.h"

int domain_status_fd(const struct domain *d)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", d->status_fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd < 0 ? negative_errno() : fd;
}

uint64_t allocation_address(const struct allocation *a)
{
	return (uint64_t)(uintptr_t)a->arena->base + a->offset;
}

static bool in_list(const void *ids, size_t n, unsigned id, size_t width)
{
	for (size_t i = 0; i < n; i++) {
		unsigned v = width == sizeof(uid_t) ? ((const uid_t *)ids)[i] : ((const gid_t *)ids)[i];
		if (v == id)
			return true;
	}
	return false;
}

/* Supplementary groups: the socket peer's (fd >= 0), else the list. */
static const char *name_for(const struct manager *m, uid_t uid, gid_t gid, int fd,
			    const gid_t *groups, size_t n_groups, char *buf, size_t size)
{
	for (size_t i = 0; i < m->core.config.n_groups; i++) {
		const struct domain_group *g = &m->core.config.groups[i];

		if (in_list(g->uids, g->n_uids, uid, sizeof(uid_t)) ||
		    in_list(g->gids, g->n_gids, gid, sizeof(gid_t)))
			return snprintf(buf, size, "%s", g->name), buf;
		for (size_t j = 0; j < g->n_gids; j++)
			if (fd >= 0 ? peer_in_group(fd, g->gids[j]) :
				      in_list(groups, n_groups, g->gids[j], sizeof(gid_t)))
				return snprintf(buf, size, "%s", g->name), buf;
	}
	snprintf(buf, size, "uid-%u", (unsigned)uid);
	return buf;
}

const char *domain_name_for(const struct manager *m, uid_t uid, gid_t gid, int fd, char *buf,
			    size_t size)
{
	return name_for(m, uid, gid, fd, NULL, 0, buf, size);
}

const char *domain_name_for_groups(const struct manager *m, uid_t uid, gid_t gid,
				   const gid_t *groups, size_t n_groups, char *buf, size_t size)
{
	return name_for(m, uid, gid, -1, groups, n_groups, buf, size);
}

static struct domain *domain_free(struct domain *d)
{
	int r;

	if (!d)
		return NULL;
	/* Clients are gone by now, and with them their allocations and MRs. */
	if (d->aging_timer)
		event_free(d->aging_timer);
	odp_done(d);
	mr_cache_done(&d->cache);
	frmr_pools_done(&d->pools); /* parked handles go before their PD */
	while (!LIST_EMPTY(&d->arenas))
		arena_free(LIST_FIRST(&d->arenas));
	u64_map_done(&d->allocations);
	if (d->pd) {
		r = provider_pd_free(d->pd);
		if (r < 0)
			log_warning_errno(r, "domain %s: cannot free its PD: %m", d->name);
	}
	provider_close(d->provider);
	if (d->status)
		munmap(d->status, MRD_STATUS_PAGE_SIZE);
	safe_close(d->status_fd);
	if (d->core) {
		LIST_REMOVE(d, link);
		d->core->n_domains--;
	}
	free(d);
	return NULL;
}

/* The status page: written here, read-only for everyone else (F_SEAL_FUTURE_WRITE lets our
 * own writable mapping stay while refusing any new one). */
static int status_page_new(struct domain *d)
{
	char name[80];

	snprintf(name, sizeof(name), "mrd-status-%s", d->name);
	d->status_fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (d->status_fd < 0)
		return negative_errno();
	if (ftruncate(d->status_fd, MRD_STATUS_PAGE_SIZE) < 0)
		return negative_errno();
	d->status = mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
			 d->status_fd, 0);
	if (d->status == MAP_FAILED) {
		d->status = NULL;
		return negative_errno();
	}
	/* Every client of the domain trusts what it reads here, so no client may write it, by
	 * any path: clients get a read-only reopen (domain_status_fd), and the file's mode keeps
	 * them from reopening it read-write through /proc/self/fd (a memfd is born 0777; the
	 * mode is all that stops that on kernels before FUTURE_WRITE). FUTURE_WRITE (Linux 5.1)
	 * keeps this writable mapping of ours and refuses any new one, write(), and punching
	 * holes, to everyone, root included; SEAL keeps anyone from adding seals of their own. */
	if (fchmod(d->status_fd, 0444) < 0)
		return negative_errno();
	if (fcntl(d->status_fd, F_ADD_SEALS,
		  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0 &&
	    fcntl(d->status_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return negative_errno();
	d->status->magic = MRD_STATUS_MAGIC;
	d->status->layout_version = MRD_STATUS_LAYOUT;
	d->status->size = sizeof(*d->status);
	d->status->generation = 1;
	/* Above what the previous mrd's domain of that name reached (warm restart). */
	for (size_t i = 0; i < d->core->n_floors; i++)
		if (strcmp(d->core->floors[i].name, d->name) == 0)
			d->status->generation = d->core->floors[i].generation + 1;
	return 0;
}


/* Handles aged or flushed out of the pools, destroyed on a worker (a device command each on
 * verbs). */
struct destroy_job {
	struct work work;
	struct domain *domain; /* held while the job lives */
	struct provider_mr **handles;
	size_t n;
};

static void destroy_job_run(struct work *w)
{
	struct destroy_job *j = (struct destroy_job *)w;

	frmr_pools_destroy(j->handles, j->n);
}

static void destroy_job_done(struct work *w)
{
	struct destroy_job *j = (struct destroy_job *)w;

	j->domain->cache.jobs--;
	j->domain->destroy_jobs--;
	domain_unref(j->domain);
	free(j);
}

/* Destroys handles taken out of the pools: on a worker, since each may be a device command. */
static void destroy_handles(struct domain *d, struct provider_mr **handles, size_t n)
{
	struct destroy_job *j;

	if (n == 0)
		return;
	j = d->core->workers ? calloc(1, sizeof(*j)) : NULL;
	if (!j) {
		frmr_pools_destroy(handles, n);
		return;
	}
	j->work.run = destroy_job_run;
	j->work.done = destroy_job_done;
	j->domain = domain_ref(d);
	j->handles = handles;
	j->n = n;
	d->destroy_jobs++;
	d->cache.jobs++;
	worker_pool_submit(d->core->workers, &j->work);
}

static void on_aging_tick(evutil_socket_t fd, short what, void *data)
{
	struct domain *d = data;
	struct provider_mr **handles;
	size_t n;

	if (d->destroy_jobs > 0)
		return; /* one round at a time */
	n = frmr_pools_age(&d->pools, &handles);
	destroy_handles(d, handles, n);
}

size_t domain_flush(struct domain *d, bool pools, bool gc, unsigned *ret_pools_removed)
{
	struct provider_mr **handles = NULL;
	size_t n = 0;

	*ret_pools_removed = 0;
	mr_cache_flush(&d->cache);
	domain_bump_generation(d);
	domain_update_status(d);
	if (pools || gc)
		n = frmr_pools_drain(&d->pools, gc, &handles, ret_pools_removed);
	destroy_handles(d, handles, n);
	return n;
}

int domains_flush(struct core *m, const char *name, bool pools, bool gc,
		  struct flush_counts *ret)
{
	struct domain *d;

	*ret = (struct flush_counts){ 0 };
	LIST_FOREACH(d, &m->domains, link) {
		unsigned removed;

		if (name && strcmp(name, d->name) != 0)
			continue;
		ret->handles += domain_flush(d, pools, gc, &removed);
		ret->pools_removed += removed;
		ret->domains++;
	}
	return name && ret->domains == 0 ? -ENOENT : 0;
}

int domains_set_pools(struct core *m, const char *name, const struct frmr_match *match,
		      int64_t aging_s, int64_t pinned, unsigned *ret_changed)
{
	bool every = !name || !*name;
	struct domain *d;

	*ret_changed = 0;
	/* Checked here too: with no domain open nothing else would, and the defaults change. */
	if (frmr_pools_check_settings(aging_s, pinned) < 0)
		return -EINVAL;
	LIST_FOREACH(d, &m->domains, link) {
		int n;

		if (!every && strcmp(name, d->name) != 0)
			continue;
		n = frmr_pools_set(&d->pools, match, aging_s, pinned);
		if (n < 0)
			return n;
		*ret_changed += (unsigned)n;
		if (!every)
			return 0;
	}
	if (!every)
		return -ENOENT;
	if (memcmp(match, &FRMR_MATCH_ANY, sizeof(*match)) == 0) {
		/* Every pool: domains opened later start with it too. */
		if (aging_s >= 0)
			m->config.pools.aging_s = (unsigned)aging_s;
		if (pinned >= 0)
			m->config.pools.pinned = (unsigned)pinned;
	}
	return 0;
}

/* Once a second: aging is in whole seconds, and a tick that finds nothing costs a lock. */
static int aging_start(struct domain *d)
{
	static const struct timeval second = { 1, 0 };

	d->aging_timer = event_new(d->core->base, -1, EV_PERSIST, on_aging_tick, d);
	if (!d->aging_timer)
		return -ENOMEM;
	return event_add(d->aging_timer, &second) < 0 ? -ENOMEM : 0;
}

static struct domain *domain_find(struct core *m, const char *name)
{
	struct domain *d;

	LIST_FOREACH(d, &m->domains, link)
		if (strcmp(d->name, name) == 0)
			return d;
	return NULL;
}

/* A new domain, held by nobody yet. */
static int domain_open(struct core *m, const char *name, struct domain **ret)
{
	struct domain *d;
	int r;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	snprintf(d->name, sizeof(d->name), "%s", name);
	d->status_fd = -1;
	d->core = m;
	LIST_INIT(&d->arenas);
	LIST_INIT(&d->pool_regs);
	LIST_INIT(&d->pool_mrs);
	LIST_INIT(&d->orphans);
	LIST_INSERT_HEAD(&m->domains, d, link);
	m->n_domains++;

	/* Its own context on the device mrd opened at start. */
	r = m->provider->ops->open(m->provider->caps.device, &d->provider);
	if (r >= 0)
		r = provider_pd_alloc(d->provider, &d->pd);
	if (r >= 0)
		r = frmr_pools_init(&d->pools, d->pd, &m->config.pools);
	if (r >= 0 && !d->pools.off)
		r = aging_start(d);
	if (r >= 0)
		r = status_page_new(d);
	if (r >= 0)
		r = mr_cache_init(&d->cache, d, config_policy_for(&m->config, name));
	if (r >= 0)
		r = odp_init(d);
	if (r < 0) {
		log_warning_errno(r, "cannot open domain %s on %s: %m", name,
				  m->provider->caps.device);
		domain_free(d);
		return r;
	}
	log_debug("domain %s opened on %s", name, m->provider->caps.device);
	*ret = d;
	return 0;
}

int domain_acquire(struct core *m, const char *name, struct domain **ret)
{
	struct domain *d = domain_find(m, name);
	int r;

	if (d && d->n_users >= m->config.quota_clients)
		return -EDQUOT;
	if (!d) {
		r = domain_open(m, name, &d);
		if (r < 0)
			return r;
	}
	d->n_users++;
	domain_update_status(d);
	*ret = d;
	return 0;
}

int domain_adopt(struct core *m, const char *name, uint64_t allocation_serial,
		 struct domain **ret)
{
	struct domain *d;
	int r;

	if (domain_find(m, name))
		return -EEXIST;
	r = domain_open(m, name, &d);
	if (r < 0)
		return r;
	d->allocation_serial = allocation_serial;
	d->adopted = true;
	domain_ref(d);
	*ret = d;
	return 0;
}

static struct domain *close_when_unheld(struct domain *d)
{
	if (d->n_users == 0 && d->n_job_refs == 0) {
		log_debug("domain %s closed", d->name);
		domain_free(d);
	} else
		domain_update_status(d);
	return NULL;
}

struct domain *domain_release(struct domain *d)
{
	if (!d)
		return NULL;
	d->n_users--;
	return close_when_unheld(d);
}

struct domain *domain_unref(struct domain *d)
{
	d->n_job_refs--;
	return close_when_unheld(d);
}

void domain_update_status(struct domain *d)
{
	struct mrd_status_page *s = d->status;

	if (!s)
		return;
	s->allocated_bytes = d->allocated_bytes;
	s->pinned_bytes = d->cache.charges.pinned_bytes;
	s->allocations = d->allocations.n;
	s->arenas = d->n_arenas;
	s->clients = d->n_users;
}

void domain_bump_generation(struct domain *d)
{
	__atomic_add_fetch(&d->status->generation, 1, __ATOMIC_RELEASE);
}

static void trim_arenas(struct domain *d, struct arena *emptied);

/* arena_new and arena_new_external refuse past the domain's share of the window: why. */
static int window_quota(struct domain *d, char *why, size_t why_size)
{
	snprintf(why, why_size, "quota.window_bytes (%" PRIu64 ") reached for domain %s: its %u "
		 "arenas take %" PRIu64 " bytes of the address window",
		 config_window_bytes(&d->core->config), d->name, d->n_arenas, d->window_bytes);
	return -EDQUOT;
}

static int check_quota(struct domain *d, uint64_t bytes, bool new_arena, char *why,
		       size_t why_size)
{
	const struct config *c = &d->core->config;

	if (d->allocations.n >= c->quota_allocations) {
		snprintf(why, why_size, "quota.allocations (%u) reached for domain %s",
			 c->quota_allocations, d->name);
		return -EDQUOT;
	}
	if (bytes > c->quota_allocated_bytes - d->allocated_bytes ||
	    d->allocated_bytes > c->quota_allocated_bytes) {
		snprintf(why, why_size,
			 "quota.allocated_bytes (%" PRIu64 ") would be exceeded in domain %s: %" PRIu64
			 " allocated, %" PRIu64 " asked",
			 c->quota_allocated_bytes, d->name, d->allocated_bytes, bytes);
		return -EDQUOT;
	}
	if (new_arena && d->n_arenas >= c->quota_arenas) {
		snprintf(why, why_size, "quota.arenas (%u) reached for domain %s", c->quota_arenas,
			 d->name);
		return -EDQUOT;
	}
	return 0;
}

int domain_check_pinned(struct domain *d, uint64_t more, char *why, size_t why_size)
{
	const struct config *c = &d->core->config;
	uint64_t mine = d->cache.charges.pinned_bytes, all = 0;
	struct domain *o;

	/* Registrations under way are charged already (mr-cache.h). */
	if (mine + more > c->quota_pinned_bytes) {
		snprintf(why, why_size, "quota.pinned_bytes (%" PRIu64 ") would be exceeded in domain "
			 "%s: %" PRIu64 " pinned or being pinned, %" PRIu64 " more asked",
			 c->quota_pinned_bytes, d->name, mine, more);
		return -EDQUOT;
	}
	/* A walk over the domains: a registration costs far more, and there are few. */
	LIST_FOREACH(o, &d->core->domains, link)
		all += o->cache.charges.pinned_bytes;
	if (all + more > c->max_pinned_bytes) {
		snprintf(why, why_size, "limits.pinned_bytes (%" PRIu64 ") would be exceeded: all "
			 "domains pin or are pinning %" PRIu64 ", %" PRIu64 " more asked",
			 c->max_pinned_bytes, all, more);
		return -EDQUOT;
	}
	return 0;
}

/* Index of the first run of arena at or after offset. */
static size_t run_index(const struct arena *arena, uint64_t offset)
{
	size_t lo = 0, hi = arena->n_runs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (arena->runs[mid]->offset < offset)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int runs_add(struct arena *arena, struct allocation *a)
{
	size_t at;

	if (arena->n_runs == arena->runs_cap) {
		size_t cap = arena->runs_cap ? arena->runs_cap * 2 : 16;
		struct allocation **runs = realloc(arena->runs, cap * sizeof(*runs));

		if (!runs)
			return -ENOMEM;
		arena->runs = runs;
		arena->runs_cap = cap;
	}
	at = run_index(arena, a->offset);
	memmove(&arena->runs[at + 1], &arena->runs[at], (arena->n_runs - at) * sizeof(*arena->runs));
	arena->runs[at] = a;
	arena->n_runs++;
	return 0;
}

static void runs_remove(struct arena *arena, struct allocation *a)
{
	size_t at = run_index(arena, a->offset);

	memmove(&arena->runs[at], &arena->runs[at + 1], (arena->n_runs - at - 1) * sizeof(*arena->runs));
	arena->n_runs--;
}

struct allocation *domain_allocation_containing(struct domain *d, uint64_t address)
{
	struct arena *arena = domain_find_arena(d, address);
	uint64_t offset;
	size_t at;

	if (!arena)
		return NULL;
	offset = address - (uintptr_t)arena->base;
	at = run_index(arena, offset + 1); /* first run starting after offset */
	if (at == 0)
		return NULL;
	if (offset >= arena->runs[at - 1]->offset + arena->runs[at - 1]->length)
		return NULL;
	return arena->runs[at - 1];
}

/* Puts a (whose other fields are set) where lookups find it: the domain's map and its arena's
 * runs. Frees a on failure. */
static int allocation_index(struct domain *d, struct arena *arena, uint64_t offset,
			    uint64_t length, struct allocation *a)
{
	int r;

	a->arena = arena;
	a->offset = offset;
	a->length = length;
	LIST_INIT(&a->mrs);
	LIST_INIT(&a->pool_mrs);
	LIST_INIT(&a->odp_children);
	r = u64_map_put(&d->allocations, allocation_address(a), a);
	if (r < 0) {
		free(a);
		return r;
	}
	r = runs_add(arena, a);
	if (r < 0) {
		u64_map_remove(&d->allocations, allocation_address(a));
		free(a);
		return r;
	}
	return 0;
}

static int record(struct domain *d, struct client *owner, struct arena *arena, uint64_t offset,
		  uint64_t length, struct allocation **ret)
{
	struct allocation *a = calloc(1, sizeof(*a));
	int r;

	if (!a)
		return -ENOMEM;
	a->owner = owner;
	a->serial = ++d->allocation_serial;
	r = allocation_index(d, arena, offset, length, a);
	if (r < 0)
		return r;
	LIST_INSERT_HEAD(&owner->allocations, a, owner_link);
	owner->allocated_bytes += length;
	d->allocated_bytes += length;
	domain_update_status(d);
	*ret = a;
	return 0;
}

/* auto: huge pages only for a run that fills at least one, while the host has free ones. A
 * smaller run would take a whole huge page (charged for it, and gone for everyone else). */
static bool want_hugetlb(const struct domain *d, uint64_t size)
{
	switch (d->core->config.hugepages) {
	case HUGEPAGES_NO:
		return false;
	case HUGEPAGES_YES:
		return true;
	default:
		return size >= HUGE_PAGE_SIZE && hugepages_free() > 0;
	}
}

/* A run in an existing arena of the given page size; -ENOSPC when none has room. */
static int first_fit(struct domain *d, bool hugetlb, uint64_t size, uint64_t align,
		     struct arena **ret, uint64_t *offset, uint64_t *length)
{
	struct arena *a;
	int r;

	LIST_FOREACH(a, &d->arenas, link) {
		if (a->external || a->hugetlb != hugetlb)
			continue;
		r = arena_alloc(a, size, align, offset, length);
		if (r != -ENOSPC && r != -ENOMEM) {
			*ret = a;
			return r;
		}
	}
	return -ENOSPC;
}

/* A run in a new arena; the arena goes again when the run cannot be had. */
static int new_arena_alloc(struct domain *d, bool hugetlb, uint64_t size, uint64_t align,
			   struct arena **ret, uint64_t *offset, uint64_t *length)
{
	struct arena *a;
	int r;

	r = arena_new(d, size, hugetlb, &a);
	if (r < 0)
		return r;
	r = arena_alloc(a, size, align, offset, length);
	if (r < 0) {
		arena_free(a);
		return r;
	}
	*ret = a;
	return 0;
}

int domain_alloc(struct domain *d, struct client *owner, uint64_t size, uint64_t align,
		 bool hugepage_only, struct allocation **ret, char *why, size_t why_size)
{
	bool hugetlb = hugepage_only || want_hugetlb(d, size);
	uint64_t offset, length;
	struct arena *arena;
	int r;

	if (size == 0 || (align & (align - 1)) || align > d->core->config.arena_size) {
		snprintf(why, why_size, "size must be > 0 and align a power of two up to the "
					"arena size");
		return -EINVAL;
	}
	if (size > d->core->config.window_size / 2) {
		snprintf(why, why_size, "%" PRIu64 " bytes do not fit the address window "
			 "([memory] window_size)", size);
		return -ENOMEM;
	}
	r = check_quota(d, size, false, why, why_size);
	if (r < 0)
		return r;

	r = first_fit(d, hugetlb, size, align, &arena, &offset, &length);
	if (r != -ENOSPC)
		goto done;
	r = check_quota(d, size, true, why, why_size);
	if (r < 0)
		return r;
	r = new_arena_alloc(d, hugetlb, size, align, &arena, &offset, &length);
	if (r < 0 && hugetlb && !hugepage_only && d->core->config.hugepages == HUGEPAGES_AUTO) {
		/* No huge page left (or no room for a new arena of them): 4 KiB pages serve as
		 * well, only slower to register. */
		log_debug("domain %s: no huge page for %" PRIu64 " bytes, using 4 KiB pages",
			  d->name, size);
		hugetlb = false;
		r = first_fit(d, false, size, align, &arena, &offset, &length);
		if (r == -ENOSPC) {
			r = check_quota(d, size, true, why, why_size);
			if (r < 0)
				return r;
			r = new_arena_alloc(d, false, size, align, &arena, &offset, &length);
		}
	}
done:
	if (r == -EDQUOT)
		return window_quota(d, why, why_size);
	if (r < 0) {
		snprintf(why, why_size, "no memory for %" PRIu64 " bytes (%s pages): %s", size,
			 hugetlb ? "2 MiB" : "4 KiB", strerror(-r));
		/* Whatever the kernel said (no huge pages, no hugetlbfs): out of memory. */
		return -ENOMEM;
	}
	if (d->allocated_bytes + length > d->core->config.quota_allocated_bytes) {
		/* Rounding to pages crossed the quota. */
		arena_release(arena, offset, length);
		if (arena->n_allocations == 0)
			trim_arenas(d, arena);
		snprintf(why, why_size, "quota.allocated_bytes (%" PRIu64 ") would be exceeded in "
			 "domain %s", d->core->config.quota_allocated_bytes, d->name);
		return -EDQUOT;
	}
	r = record(d, owner, arena, offset, length, ret);
	if (r < 0) {
		arena_release(arena, offset, length);
		if (arena->n_allocations == 0)
			trim_arenas(d, arena);
	}
	return r;
}

int domain_attach_external(struct domain *d, struct client *owner, int fd, uint64_t offset,
			   uint64_t length, struct allocation **ret, char *why, size_t why_size)
{
	struct arena *arena;
	int r;

	r = check_quota(d, length, true, why, why_size);
	if (r < 0)
		return r;
	r = arena_new_external(d, fd, offset, length, &arena);
	if (r == -EBADF)
		snprintf(why, why_size, "only memfds (tmpfs or hugetlbfs) can be attached");
	else if (r == -EPERM)
		snprintf(why, why_size, "the memfd must be sealed against shrinking "
					"(F_ADD_SEALS with F_SEAL_SHRINK)");
	else if (r == -EINVAL)
		snprintf(why, why_size, "offset and length must be page-aligned and inside the file");
	else if (r == -ENOSPC) {
		snprintf(why, why_size, "no room for %" PRIu64 " bytes in the address window "
			 "([memory] window_size)", length);
		r = -ENOMEM;
	} else if (r == -EDQUOT)
		r = window_quota(d, why, why_size);
	if (r < 0)
		return r;
	arena->n_allocations = 1;
	r = record(d, owner, arena, 0, length, ret);
	if (r < 0) {
		arena->memfd = -1; /* still the caller's to close */
		arena_free(arena);
	}
	return r;
}

int domain_adopt_allocation(struct domain *d, struct arena *arena,
			    const struct adopted_allocation *saved)
{
	struct allocation *a;
	size_t at;
	int r;

	if (saved->length == 0 || saved->offset % arena->page_size ||
	    saved->length % arena->page_size || saved->offset > arena->size ||
	    saved->length > arena->size - saved->offset)
		return -EINVAL;
	at = run_index(arena, saved->offset);
	if ((at > 0 && arena->runs[at - 1]->offset + arena->runs[at - 1]->length > saved->offset) ||
	    (at < arena->n_runs && arena->runs[at]->offset < saved->offset + saved->length))
		return -EEXIST;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->serial = saved->serial;
	a->odp = saved->odp && d->provider->caps.odp && d->provider->caps.odp_rc_caps;
	a->read_only = saved->read_only;
	a->orphan = true;
	a->claim_session = saved->session;
	a->claim_pid = saved->pid;
	a->claim_uid = saved->uid;
	a->claim_start_time = saved->start_time;
	r = allocation_index(d, arena, saved->offset, saved->length, a);
	if (r < 0)
		return r;
	LIST_INSERT_HEAD(&d->orphans, a, owner_link);
	d->n_orphans++;
	arena->n_allocations++;
	d->allocated_bytes += a->length;
	domain_update_status(d);
	return 0;
}

unsigned domain_claim(struct domain *d, struct client *c, uint64_t session)
{
	struct allocation *a, *next;
	unsigned n = 0;

	if (session == 0)
		return 0;
	for (a = LIST_FIRST(&d->orphans); a; a = next) {
		next = LIST_NEXT(a, owner_link);
		if (a->claim_session != session || a->claim_pid != c->pid || a->claim_uid != c->uid ||
		    (a->claim_start_time && client_start_time(c) &&
		     a->claim_start_time != client_start_time(c)))
			continue; /* not that process (a later one may have its pid) */
		LIST_REMOVE(a, owner_link);
		d->n_orphans--;
		a->orphan = false;
		a->owner = c;
		LIST_INSERT_HEAD(&c->allocations, a, owner_link);
		c->allocated_bytes += a->length;
		n++;
	}
	return n;
}

unsigned domain_reap_orphans(struct domain *d, bool all)
{
	struct allocation *a, *next;
	unsigned freed = 0;

	if (!d->adopted)
		return 0;
	for (a = LIST_FIRST(&d->orphans); a; a = next) {
		next = LIST_NEXT(a, owner_link);
		/* While its process lives it still maps the memory: freeing it would hand pages it
		 * may write to somebody else. */
		if (!all && !process_gone(a->claim_pid, a->claim_uid, a->claim_start_time))
			continue;
		LIST_REMOVE(a, owner_link);
		d->n_orphans--;
		a->orphan = false;
		if (a->pool_refs > 0)
			continue; /* others' mempools hold it: it goes with the last of them */
		(void)domain_free_allocation(d, a, NULL);
		freed++;
	}
	if (freed && !all)
		log_info("domain %s: freed %u allocation(s) of the previous mrd whose process is gone",
			 d->name, freed);
	if (d->n_orphans > 0)
		return d->n_orphans;
	d->adopted = false;
	domain_unref(d);
	return 0;
}

struct allocation *domain_find_allocation(struct domain *d, uint64_t address)
{
	return u64_map_get(&d->allocations, address);
}

struct arena *domain_find_arena(struct domain *d, uint64_t address)
{
	struct arena *a;

	LIST_FOREACH(a, &d->arenas, link)
		if (address >= (uintptr_t)a->base && address < (uintptr_t)a->base + a->size)
			return a;
	return NULL;
}

/* Its id is free again: whoever handed the arena out forgets it. */
static void forget_arena(struct domain *d, struct arena *arena)
{
	if (d->core->arena_gone)
		d->core->arena_gone(d->core, arena->id);
	arena_free(arena);
}

/* Keeps one empty arena of the usual size for the next allocation; other empty ones (and
 * oversized ones, made for one big allocation) go back to the window. */
static void trim_arenas(struct domain *d, struct arena *emptied)
{
	struct arena *a;

	if (emptied->external || emptied->size > d->core->config.arena_size) {
		forget_arena(d, emptied);
		return;
	}
	LIST_FOREACH(a, &d->arenas, link)
		if (a != emptied && !a->external && a->n_allocations == 0) {
			forget_arena(d, emptied);
			return;
		}
	/* Kept: clients map whole arenas, so give back pages touched outside their runs too. */
	if (!d->core->window.keep_content)
		(void)fallocate(emptied->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
				(off_t)emptied->size);
}

/* Back on the loop with the device done with a retired allocation: its pages go back. */
static void release(struct domain *d, struct allocation *a)
{
	struct arena *arena = a->arena;

	mr_cache_release(&d->cache, a);
	d->allocated_bytes -= a->length;
	arena_release(arena, a->offset, a->length);
	free(a);
	if (arena->n_allocations == 0)
		trim_arenas(d, arena);
	domain_update_status(d);
}

/* Deregistering big MRs unpins GiBs: a worker does it, so the loop serves everyone else. */
struct free_job {
	struct work work;
	struct domain *domain; /* held while the job lives */
	struct allocation *allocation;
	struct mr_waiter *waiter;
};

static void free_job_run(struct work *w)
{
	struct free_job *j = (struct free_job *)w;

	mr_cache_deregister(&j->domain->cache, j->allocation);
}

static void free_job_done(struct work *w)
{
	struct free_job *j = (struct free_job *)w;
	struct domain *d = j->domain;

	d->cache.jobs--;
	release(d, j->allocation);
	if (j->waiter)
		j->waiter->resume(j->waiter, 0, NULL, "");
	free(j);
	domain_unref(d);
}

bool domain_dereg_waits(const struct domain *d, uint64_t bytes)
{
	return d->core->workers && (bytes >= d->core->config.async_bytes || domain_busy(d));
}

/* One MR on a worker: a mempool's, a registration that lost a race, an on-demand child. */
struct dereg_job {
	struct work work;
	struct domain *domain; /* held while the job lives */
	struct provider_mr *pmr;
	void (*gone)(struct domain *d, void *arg, int result);
	void *arg;
	int result;
};

static void dereg_job_run(struct work *w)
{
	struct dereg_job *j = (struct dereg_job *)w;

	j->result = frmr_pools_dereg(&j->domain->pools, j->pmr);
}

static void dereg_job_done(struct work *w)
{
	struct dereg_job *j = (struct dereg_job *)w;
	struct domain *d = j->domain;

	d->cache.jobs--;
	if (j->gone)
		j->gone(d, j->arg, j->result);
	free(j);
	domain_unref(d);
}

int domain_dereg_on_worker(struct domain *d, struct provider_mr *pmr,
			   void (*gone)(struct domain *d, void *arg, int result), void *arg)
{
	struct dereg_job *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->work.run = dereg_job_run;
	j->work.done = dereg_job_done;
	j->domain = domain_ref(d);
	j->pmr = pmr;
	j->gone = gone;
	j->arg = arg;
	d->cache.jobs++;
	worker_pool_submit(d->core->workers, &j->work);
	return 0;
}

int domain_free_allocation(struct domain *d, struct allocation *a, struct mr_waiter *waiter)
{
	struct worker_pool *workers = d->core->workers;
	uint64_t pinned;
	unsigned zombies;
	struct free_job *j;

	/* Retired first: from here on no lookup finds it and no key for it is handed out. */
	a->retired = true;
	pinned = mr_cache_retire(&d->cache, a);
	zombies = odp_retire(d, a);
	u64_map_remove(&d->allocations, allocation_address(a));
	runs_remove(a->arena, a);
	if (a->owner) {
		LIST_REMOVE(a, owner_link);
		a->owner->allocated_bytes -= a->length;
		a->owner = NULL;
	}
	d->status->frees++;
	domain_bump_generation(d);

	if (zombies > 0) {
		/* Prefetch work on it is queued or running, or holds its children: the pages go
		 * back, and the Free answers, once that is done (domain_finish_free). */
		a->free_waits = true;
		a->free_waiter = waiter;
		return waiter ? -EINPROGRESS : 0;
	}
	/* Then the device lets go, and only then do its pages go back. A soft Dma copying
	 * through its MRs holds them (their dereg waits for it): a worker waits then, not the
	 * loop. */
	j = pinned > 0 && domain_dereg_waits(d, pinned) ? calloc(1, sizeof(*j)) : NULL;
	if (!j) {
		mr_cache_deregister(&d->cache, a);
		release(d, a);
		return 0;
	}
	j->work.run = free_job_run;
	j->work.done = free_job_done;
	j->domain = domain_ref(d);
	j->allocation = a;
	j->waiter = waiter;
	d->cache.jobs++;
	worker_pool_submit(workers, &j->work);
	return waiter ? -EINPROGRESS : 0;
}

void domain_finish_free(struct domain *d, struct allocation *a)
{
	struct mr_waiter *w = a->free_waiter;

	release(d, a);
	if (w)
		w->resume(w, 0, NULL, "");
}

void domain_drop_allocation(struct domain *d, struct allocation *a)
{
	if (a->pool_refs == 0) {
		(void)domain_free_allocation(d, a, NULL);
		return;
	}
	LIST_REMOVE(a, owner_link);
	a->owner->allocated_bytes -= a->length;
	a->owner = NULL;
}
