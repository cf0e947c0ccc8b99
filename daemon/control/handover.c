/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <unistd.h>

#include <event2/event.h>
#include <systemd/sd-daemon.h>

#include "base/fd-closer.h"
#include "base/process.h"
#include "memory/arena.h"
#include "control/client.h"
#include "core/domain.h"
#include "control/handover.h"
#include "registration/bound-pd.h"
#include "handover.pb-c.h"
#include "log.h"
#include "macro.h"
#include "control/manager.h"
#include "status-page.h"
#include "time-util.h"

#define HANDOVER_VERSION 1
#define STATE_MAX (64u << 20)
#define BARRIER_TIMEOUT_USEC (5 * USEC_PER_SEC)

typedef Mrd__Handover__State State;
typedef Mrd__Handover__Domain SavedDomain;
typedef Mrd__Handover__Arena SavedArena;
typedef Mrd__Handover__Allocation SavedAllocation;
typedef Mrd__Handover__OldContext SavedOldContext;
typedef Mrd__Handover__ContextHolder SavedHolder;

bool handover_fd_name(const char *name)
{
	return name && (strcmp(name, HANDOVER_STATE_NAME) == 0 ||
			strncmp(name, HANDOVER_ARENA_PREFIX, strlen(HANDOVER_ARENA_PREFIX)) == 0);
}

void handover_fds_done(struct handover_fds *f)
{
	for (size_t i = 0; i < f->n; i++) {
		safe_close(f->fds[i]);
		free(f->names[i]);
	}
	free(f->fds);
	free(f->names);
	*f = (struct handover_fds){};
}

int handover_fds_add(struct handover_fds *f, int fd, const char *name)
{
	int *fds = realloc(f->fds, (f->n + 1) * sizeof(*fds));
	char **names;

	if (fds)
		f->fds = fds;
	names = fds ? realloc(f->names, (f->n + 1) * sizeof(*names)) : NULL;
	if (names)
		f->names = names;
	if (!fds || !names || !(f->names[f->n] = strdup(name))) {
		safe_close(fd);
		return -ENOMEM;
	}
	f->fds[f->n++] = fd;
	return 0;
}

/* ---- saving ---- */

/* Who may take an allocation back: its owner's process and session, or, for one still
 * waiting from an earlier hand-over, the same as then. */
static void claim_of(const struct allocation *a, SavedAllocation *s)
{
	if (a->owner) {
		s->session = a->owner->session;
		s->pid = (uint32_t)a->owner->pid;
		s->uid = (uint32_t)a->owner->uid;
		s->start_time = mem_owner_start_time(a->owner);
	} else if (a->orphan) {
		s->session = a->claim_session;
		s->pid = (uint32_t)a->claim_pid;
		s->uid = (uint32_t)a->claim_uid;
		s->start_time = a->claim_start_time;
	}
	/* else nobody's: its owner left while other clients' mempools cover it. It waits one
	 * check for them to register those mempools again. */
}

static void saved_arena_free(SavedArena *sa)
{
	if (!sa)
		return;
	for (size_t i = 0; i < sa->n_allocations; i++)
		free(sa->allocations[i]);
	free(sa->allocations);
	free(sa->fd_name);
	free(sa);
}

static void saved_old_context_free(SavedOldContext *so)
{
	if (!so)
		return;
	for (size_t i = 0; i < so->n_holders; i++)
		free(so->holders[i]);
	free(so->holders);
	free(so->domain);
	free(so->device);
	free(so);
}

static void state_free(State *st)
{
	for (size_t i = 0; i < st->n_old_contexts; i++)
		saved_old_context_free(st->old_contexts[i]);
	free(st->old_contexts);
	for (size_t i = 0; i < st->n_domains; i++) {
		SavedDomain *sd = st->domains[i];

		for (size_t j = 0; j < sd->n_arenas; j++)
			saved_arena_free(sd->arenas[j]);
		free(sd->arenas);
		free(sd->name);
		free(sd);
	}
	free(st->domains);
}

/* The arena's live allocations; NULL when there are none. */
static int save_arena(struct arena *a, SavedArena **ret)
{
	SavedArena *sa = calloc(1, sizeof(*sa));
	char name[64];

	*ret = NULL;
	if (!sa)
		return -ENOMEM;
	mrd__handover__arena__init(sa);
	sa->allocations = calloc(a->n_runs ? a->n_runs : 1, sizeof(*sa->allocations));
	snprintf(name, sizeof(name), HANDOVER_ARENA_PREFIX "%" PRIu64, a->serial);
	sa->fd_name = strdup(name);
	if (!sa->allocations || !sa->fd_name) {
		saved_arena_free(sa);
		return -ENOMEM;
	}
	for (size_t i = 0; i < a->n_runs; i++) {
		const struct allocation *al = a->runs[i];
		SavedAllocation *s = calloc(1, sizeof(*s));

		if (!s) {
			saved_arena_free(sa);
			return -ENOMEM;
		}
		mrd__handover__allocation__init(s);
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
		sa->allocations[sa->n_allocations++] = s;
	}
	if (sa->n_allocations == 0) {
		saved_arena_free(sa);
		return 0;
	}
	sa->slot = a->id;
	sa->size = a->size;
	sa->page_size = a->page_size;
	sa->hugetlb = a->hugetlb;
	sa->external = a->external;
	sa->file_offset = a->file_offset;
	sa->serial = a->serial;
	*ret = sa;
	return 0;
}

static int save_domain(struct domain *d, SavedDomain **ret, struct handover_fds *fds)
{
	SavedDomain *sd = calloc(1, sizeof(*sd));
	struct arena *a;
	int r;

	if (sd)
		mrd__handover__domain__init(sd);
	if (!sd || !(sd->name = strdup(d->name)) ||
	    !(sd->arenas = calloc(d->mem.n_arenas ? d->mem.n_arenas : 1, sizeof(*sd->arenas)))) {
		if (sd)
			free(sd->name);
		free(sd);
		return -ENOMEM;
	}
	/* Clients still on this mrd stop trusting their cached keys now; the next mrd starts
	 * above this. */
	domain_bump_generation(d);
	sd->generation = d->mem.status.page->generation;
	sd->allocation_serial = d->mem.allocation_serial;
	sd->frees = d->mem.status.page->frees;
	*ret = sd; /* from here on freed with the state */
	LIST_FOREACH(a, &d->mem.arenas, link) {
		SavedArena *sa;
		int fd;

		r = save_arena(a, &sa);
		if (r < 0)
			return r;
		if (!sa)
			continue;
		fd = fcntl(a->memfd, F_DUPFD_CLOEXEC, 3);
		if (fd < 0) {
			r = negative_errno();
			saved_arena_free(sa);
			return r;
		}
		r = handover_fds_add(fds, fd, sa->fd_name);
		if (r < 0) {
			saved_arena_free(sa);
			return r;
		}
		sd->arenas[sd->n_arenas++] = sa;
	}
	return 0;
}

/* A context clients hold (o: its figures and holders) into st, with the holders still running;
 * none: nothing. st->old_contexts has room. */
static int save_old_context(State *st, const struct old_context *o)
{
	SavedOldContext *so = calloc(1, sizeof(*so));

	if (!so)
		return -ENOMEM;
	mrd__handover__old_context__init(so);
	so->domain = strdup(o->domain);
	so->device = strdup(o->device);
	so->holders = calloc(o->n_holders ? o->n_holders : 1, sizeof(*so->holders));
	if (!so->domain || !so->device || !so->holders) {
		saved_old_context_free(so);
		return -ENOMEM;
	}
	so->pinned_bytes = o->pinned_bytes;
	so->mrs = o->mrs;
	so->handed_over_usec = o->handed_over_usec;
	for (size_t i = 0; i < o->n_holders; i++) {
		const struct context_holder *h = &o->holders[i];
		SavedHolder *sh;

		if (process_gone(h->pid, h->uid, h->start_time))
			continue;
		sh = calloc(1, sizeof(*sh));
		if (!sh) {
			saved_old_context_free(so);
			return -ENOMEM;
		}
		mrd__handover__context_holder__init(sh);
		sh->pid = (uint32_t)h->pid;
		sh->uid = (uint32_t)h->uid;
		sh->start_time = h->start_time;
		sh->session = h->session;
		so->holders[so->n_holders++] = sh;
	}
	if (so->n_holders == 0) {
		saved_old_context_free(so);
		return 0;
	}
	st->old_contexts[st->n_old_contexts++] = so;
	return 0;
}

/* Contexts exported to clients outlive this mrd with what it registered in them (the kernel
 * keeps a context while any descriptor of it is open): the next mrd shows them, those of
 * earlier mrds still held too. */
static int save_old_contexts(struct manager *m, State *st)
{
	const struct old_context *o;
	struct domain *d;
	size_t n = m->core.n_domains;
	uint64_t now = now_usec(CLOCK_REALTIME);
	int r = 0;

	LIST_FOREACH(o, &m->old_contexts, link)
		n++;
	st->old_contexts = calloc(n ? n : 1, sizeof(*st->old_contexts));
	if (!st->old_contexts)
		return -ENOMEM;
	LIST_FOREACH(o, &m->old_contexts, link)
		if ((r = save_old_context(st, o)) < 0)
			return r;
	LIST_FOREACH(d, &m->core.domains, link) {
		struct old_context mine = {
			.pinned_bytes = d->reg.cache.charges.pinned_bytes,
			.mrs = d->reg.cache.n_mrs + d->reg.odp.children,
			.handed_over_usec = now,
			.holders = d->exported_to,
			.n_holders = d->n_exported_to,
		};
		size_t before = st->n_old_contexts;

		if (d->n_exported_to == 0)
			continue;
		snprintf(mine.domain, sizeof(mine.domain), "%s", d->name);
		snprintf(mine.device, sizeof(mine.device), "%s", d->reg.base.provider->caps.device);
		r = save_old_context(st, &mine);
		if (r < 0)
			return r;
		if (st->n_old_contexts > before)
			log_notice("domain %s: its device context was exported to %zu running "
				   "process(es); it outlives this mrd with its %" PRIu32 " MR(s) and "
				   "%" PRIu64 " pinned bytes until they close it (mrd cannot revoke it)",
				   d->name, st->old_contexts[before]->n_holders, mine.mrs,
				   mine.pinned_bytes);
	}
	return 0;
}

/* The state packed into a sealed memfd. */
static int state_memfd(const State *st, int *ret)
{
	_cleanup_close_ int fd = -1;
	_cleanup_free_ uint8_t *buf = NULL;
	size_t len = mrd__handover__state__get_packed_size(st);

	if (len > STATE_MAX)
		return -E2BIG;
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	mrd__handover__state__pack(st, buf);
	fd = memfd_create(HANDOVER_STATE_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return negative_errno();
	if (write(fd, buf, len) != (ssize_t)len)
		return errno ? negative_errno() : -EIO;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return negative_errno();
	*ret = TAKE_FD(fd);
	return 0;
}

int handover_save(struct manager *m, struct handover_fds *ret, unsigned *ret_allocations)
{
	State st = MRD__HANDOVER__STATE__INIT;
	struct handover_fds fds = {};
	struct domain *d;
	int fd = -1, r = 0;

	*ret_allocations = 0;
	/* What clients that left still own is nobody's to take back: it goes first. */
	domains_finish_leaving(&m->core);
	st.version = HANDOVER_VERSION;
	st.instance = m->instance;
	st.arena_serial = m->core.window.arena_serial;
	st.next_client_id = m->next_client_id;
	st.window_base = (uintptr_t)m->core.window.base;
	st.window_size = m->core.window.size;
	st.slot_size = m->core.window.slot_size;
	st.domains = calloc(m->core.n_domains ? m->core.n_domains : 1, sizeof(*st.domains));
	if (!st.domains)
		return -ENOMEM;
	/* The state goes first; its slot is filled in once it is packed. */
	r = handover_fds_add(&fds, -1, HANDOVER_STATE_NAME);
	LIST_FOREACH(d, &m->core.domains, link) {
		if (r < 0)
			break;
		r = save_domain(d, &st.domains[st.n_domains], &fds);
		if (st.domains[st.n_domains])
			st.n_domains++;
	}
	if (r >= 0)
		r = save_old_contexts(m, &st);
	for (size_t i = 0; r >= 0 && i < st.n_domains; i++)
		for (size_t j = 0; j < st.domains[i]->n_arenas; j++)
			*ret_allocations += (unsigned)st.domains[i]->arenas[j]->n_allocations;
	if (r >= 0)
		r = state_memfd(&st, &fd);
	state_free(&st);
	if (r < 0) {
		handover_fds_done(&fds);
		return r;
	}
	fds.fds[0] = fd;
	*ret = fds;
	return 0;
}

unsigned handover_fd_store_max(void)
{
	const char *e = getenv("FDSTORE");
	unsigned long v;
	char *end;

	if (!e || !getenv("NOTIFY_SOCKET"))
		return 0;
	errno = 0;
	v = strtoul(e, &end, 10);
	return errno || end == e || *end || v > UINT32_MAX ? 0 : (unsigned)v;
}

int handover_to_fd_store(struct manager *m)
{
	struct handover_fds f;
	unsigned n_allocations, max = handover_fd_store_max();
	int r;

	r = handover_save(m, &f, &n_allocations);
	if (r < 0)
		return log_error_errno(r, "cannot save the state for the next mrd: %m; its clients' "
					  "memory is not handed over");
	if (m->core.n_domains == 0 && LIST_EMPTY(&m->old_contexts)) {
		handover_fds_done(&f);
		return 0; /* nothing to keep */
	}
	if (f.n > max) {
		log_error("%zu descriptors to hand over, but systemd keeps %u "
			  "(FileDescriptorStoreMax=): clients' memory is not handed over", f.n, max);
		handover_fds_done(&f);
		return -E2BIG;
	}
	/* The arenas first, the state last: a state in the store names only stored arenas. */
	for (size_t i = f.n; i-- > 0;) {
		char msg[320];

		/* FDPOLL=0: a memfd never hangs up, systemd need not watch it. */
		snprintf(msg, sizeof(msg), "FDSTORE=1\nFDPOLL=0\nFDNAME=%s", f.names[i]);
		r = sd_pid_notify_with_fds(0, 0, msg, &f.fds[i], 1);
		if (r <= 0) {
			log_error_errno(r < 0 ? r : -ENOTCONN, "cannot store %s with systemd: %m",
					f.names[i]);
			handover_fds_done(&f);
			return r < 0 ? r : -ENOTCONN;
		}
	}
	/* Only once systemd holds them may the pages stop being ours to free. */
	r = sd_notify_barrier(0, BARRIER_TIMEOUT_USEC);
	if (r < 0)
		log_warning_errno(r, "systemd did not confirm the FD store: %m");
	window_keep_content(&m->core.window, true);
	log_notice("handed %u allocation(s) in %zu arena(s) to systemd's FD store for the next mrd",
		   n_allocations, f.n - 1);
	handover_fds_done(&f);
	return 0;
}

/* First above every target of fds_to_listen_positions, so no move there overwrites a
 * descriptor still to be moved. The only step that can fail (out of descriptors). */
static int fds_above_listen_positions(struct handover_fds *f)
{
	for (size_t i = 0; i < f->n; i++) {
		int high = fcntl(f->fds[i], F_DUPFD_CLOEXEC, (int)(SD_LISTEN_FDS_START + f->n));

		if (high < 0)
			return negative_errno();
		close(f->fds[i]);
		f->fds[i] = high;
	}
	return 0;
}

/* Moves f's descriptors to 3, 4, ... (without close-on-exec), the way systemd passes them. */
static void fds_to_listen_positions(struct handover_fds *f)
{
	for (size_t i = 0; i < f->n; i++) {
		(void)dup2(f->fds[i], (int)(SD_LISTEN_FDS_START + i));
		close(f->fds[i]);
		f->fds[i] = -1;
	}
}

unsigned handover_unbind_clients(struct manager *m)
{
	const struct mr_cache *bc;
	const struct domain *d;
	struct client *c;
	unsigned live = 0;

	__atomic_store_n(&m->core.stopping, true, __ATOMIC_RELEASE);
	m->core.workers = worker_pool_free(m->core.workers);
	LIST_FOREACH(c, &m->clients, link)
		if (c->bound) {
			c->bound = bound_pd_close(c->bound);
			c->bound_lost = true; /* no key of the domain's PD for it, ever */
		}
	domains_finish_leaving(&m->core); /* and those of clients that left */
	/* What is left holds MRs the device kept (a failed dereg, now or before). */
	LIST_FOREACH(d, &m->core.domains, link)
		LIST_FOREACH(bc, &d->reg.cache.bound, bound_link)
			live++;
	return live;
}

/* The workers again, after an unbind for a hand-over that did not happen. */
static void restart_workers(struct manager *m)
{
	int r;

	__atomic_store_n(&m->core.stopping, false, __ATOMIC_RELEASE);
	r = worker_pool_new(m->core.base, m->core.config.workers, &m->core.workers);
	if (r < 0)
		log_error_errno(r, "cannot start worker threads again: %m; big registrations run on "
				"the loop");
}

static int reexec(struct manager *m);

/* How long a re-exec waits for the closers to empty: descriptors mrd just let go of close
 * in well under this; one a client holds up does not close at all. */
#define REEXEC_CLOSER_WAIT_USEC (2 * USEC_PER_SEC)

int handover_reexec(struct manager *m)
{
	unsigned live, stuck;
	uid_t stuck_uid;
	bool stuck_own;
	int r;

	if (!m->exe_path || !m->argv || access(m->exe_path, X_OK) < 0)
		return log_error_errno(m->exe_path ? -errno : -ENOENT,
				       "SIGUSR2: cannot re-execute %s: %m; mrd goes on as it is",
				       m->exe_path ? m->exe_path : "mrd");
	/* exec closes what waits at the closers itself, on this thread, and cannot end while a
	 * closer is stuck in a close(): let them finish, or stay. */
	r = fd_closer_quiesce(m->closer, REEXEC_CLOSER_WAIT_USEC, &stuck_own, &stuck_uid, &stuck);
	if (r < 0) {
		char who[32] = "mrd's own memory";

		if (!stuck_own)
			snprintf(who, sizeof(who), "uid %u", (unsigned)stuck_uid);
		return log_error_errno(r, "SIGUSR2: %u descriptor(s) of %s are still being "
				       "closed (a close that does not return: a FUSE file whose "
				       "server does not answer? /sys/fs/fuse/connections/*/abort "
				       "ends it); exec would wait for them; mrd goes on as it is",
				       stuck, who);
	}
	/* First, while nothing is saved: a client PD's MR the device keeps would outlive this mrd
	 * in the client's context, over pages the next one hands out again. */
	live = handover_unbind_clients(m);
	if (live > 0) {
		restart_workers(m);
		return log_error_errno(-EBUSY, "SIGUSR2: %u client PD(s) keep MRs mrd could not "
				       "deregister (quarantined runs, mrctl status): they would "
				       "outlive mrd over memory the next one reuses; mrd goes on as "
				       "it is", live);
	}
	r = reexec(m); /* returns only when it could not */
	restart_workers(m);
	return r;
}

static int reexec(struct manager *m)
{
	_cleanup_free_ char *names = NULL;
	struct handover_fds f;
	unsigned n_allocations;
	char num[32];
	size_t len = 1;
	int r, sock;

	r = handover_save(m, &f, &n_allocations);
	if (r < 0)
		return log_error_errno(r, "SIGUSR2: cannot save the state: %m; mrd goes on as it is");
	/* The socket too: connections made meanwhile wait in its backlog. */
	sock = fcntl(m->listen_fd, F_DUPFD_CLOEXEC, 3);
	r = sock < 0 ? negative_errno() :
		       handover_fds_add(&f, sock, m->bound_path ? HANDOVER_BOUND_SOCKET_NAME : HANDOVER_SOCKET_NAME);
	for (size_t i = 0; r >= 0 && i < f.n; i++)
		len += strlen(f.names[i]) + 1;
	names = r >= 0 ? calloc(1, len) : NULL;
	if (names)
		r = fds_above_listen_positions(&f);
	if (!names || r < 0) {
		handover_fds_done(&f);
		return log_error_errno(r < 0 ? r : -ENOMEM, "SIGUSR2: %m; mrd goes on as it is");
	}
	for (size_t i = 0; i < f.n; i++) {
		if (i)
			strcat(names, ":");
		strcat(names, f.names[i]);
	}
	log_notice("SIGUSR2: re-executing %s with %u allocation(s) in %zu arena(s)", m->exe_path,
		   n_allocations, f.n - 2);
	(void)sd_notifyf(0, "RELOADING=1\nSTATUS=re-executing\nMONOTONIC_USEC=%" PRIu64,
			 now_usec(CLOCK_MONOTONIC));
	snprintf(num, sizeof(num), "%zu", f.n);
	setenv("LISTEN_FDS", num, 1);
	setenv("LISTEN_FDNAMES", names, 1);
	snprintf(num, sizeof(num), "%d", (int)getpid());
	setenv("LISTEN_PID", num, 1);
	if (m->detached)
		setenv(MANAGER_DETACHED_ENV, "1", 1);
	/* From here there is no way back: descriptors 3 and up are the hand-over's. */
	fds_to_listen_positions(&f);
	handover_fds_done(&f);
	execv(m->exe_path, m->argv);
	log_error_errno(-errno, "SIGUSR2: exec %s: %m; exiting", m->exe_path);
	_exit(EXIT_FAILURE);
}

/* ---- adopting ---- */

static int take_fd(struct handover_fds *passed, const char *name)
{
	for (size_t i = 0; i < passed->n; i++)
		if (passed->fds[i] >= 0 && strcmp(passed->names[i], name) == 0) {
			int fd = passed->fds[i];

			passed->fds[i] = -1;
			return fd;
		}
	return -ENOENT;
}

static int read_state(int fd, State **ret)
{
	_cleanup_free_ uint8_t *buf = NULL;
	struct stat st;
	ssize_t n;

	if (fstat(fd, &st) < 0)
		return negative_errno();
	if (st.st_size <= 0 || st.st_size > STATE_MAX)
		return -EBADMSG;
	buf = malloc((size_t)st.st_size);
	if (!buf)
		return -ENOMEM;
	n = pread(fd, buf, (size_t)st.st_size, 0);
	if (n != st.st_size)
		return n < 0 ? negative_errno() : -EBADMSG;
	*ret = mrd__handover__state__unpack(NULL, (size_t)n, buf);
	return *ret ? 0 : -EBADMSG;
}

/* Returns how many allocations it took over: none of an attachment its owner sealed. */
static int adopt_arena(struct domain *d, const SavedArena *sa, struct handover_fds *passed,
		       char *why, size_t why_size)
{
	struct arena_place place = {
		.slot = sa->slot, .size = sa->size, .file_offset = sa->file_offset,
		.serial = sa->serial, .page_size = sa->page_size, .hugetlb = sa->hugetlb,
		.external = sa->external,
	};
	struct arena *a;
	int fd, r;

	fd = sa->fd_name && handover_fd_name(sa->fd_name) ? take_fd(passed, sa->fd_name) : -ENOENT;
	if (fd < 0) {
		snprintf(why, why_size, "domain %s: arena %s was not passed", d->name, sa->fd_name);
		return fd;
	}
	r = arena_adopt(&d->mem, fd, &place, &a);
	if (r == -EPERM && sa->external) {
		/* The client sealed its own memfd: its attachment is lost, nobody else's. */
		close(fd);
		log_warning("domain %s: attached memory at slot %u was sealed against writes by its "
			    "owner and is not taken over (%zu allocation(s) dropped; the owner's "
			    "mrd_client_reconnect() says so)", d->name, sa->slot, sa->n_allocations);
		return 0;
	}
	if (r < 0) {
		close(fd);
		snprintf(why, why_size, "domain %s: arena %s at slot %u: %s", d->name, sa->fd_name,
			 sa->slot, strerror(-r));
		return r;
	}
	for (size_t i = 0; i < sa->n_allocations; i++) {
		const SavedAllocation *s = sa->allocations[i];
		struct adopted_allocation al = {
			.offset = s->offset, .length = s->length, .serial = s->serial, .odp = s->odp,
			.read_only = s->read_only, .alias = s->alias, .alias_access = s->alias_access,
			.span_offset = s->span_offset, .span_length = s->span_length, .session = s->session, .pid = (pid_t)s->pid,
			.uid = (uid_t)s->uid, .start_time = s->start_time,
		};

		r = domain_adopt_allocation(d, a, &al);
		if (r < 0) {
			snprintf(why, why_size, "domain %s: arena %s: allocation at +0x%" PRIx64
				 " of %" PRIu64 " bytes: %s", d->name, sa->fd_name, s->offset,
				 s->length, strerror(-r));
			return r;
		}
	}
	r = arena_adopt_finish(a);
	if (r < 0) {
		snprintf(why, why_size, "domain %s: attached arena %s is not one whole allocation",
			 d->name, sa->fd_name);
		return r;
	}
	return (int)sa->n_allocations;
}

static void on_grace_tick(evutil_socket_t fd, short what, void *userdata)
{
	struct manager *m = userdata;
	struct domain *d, *next;
	unsigned waiting = 0;

	for (d = LIST_FIRST(&m->core.domains); d; d = next) {
		next = LIST_NEXT(d, link);
		waiting += domain_reap_orphans(d, false); /* may close d */
	}
	if (waiting == 0) {
		event_free(m->grace_timer);
		m->grace_timer = NULL;
	} else
		log_debug("%u allocation(s) still wait for live processes to reconnect", waiting);
}

void handover_end_grace(struct manager *m)
{
	struct domain *d, *next;

	if (m->grace_timer) {
		event_free(m->grace_timer);
		m->grace_timer = NULL;
	}
	for (d = LIST_FIRST(&m->core.domains); d; d = next) {
		next = LIST_NEXT(d, link);
		(void)domain_reap_orphans(d, true); /* may close d */
	}
}

/* Undoes a partial adoption: nothing is freed from the memfds, clients still map them. */
static void adoption_undo(struct manager *m, uint64_t instance)
{
	bool keep = window_keep_content(&m->core.window, true);

	handover_end_grace(m);
	window_keep_content(&m->core.window, keep);
	m->instance = instance;
}

/* Every saved domain's generation, kept whether or not the rest can be taken over: clients
 * of the previous mrd cached keys under them. */
static int record_floors(struct manager *m, const State *st)
{
	struct generation_floor *f;

	if (st->n_domains == 0 || st->n_domains > SIZE_MAX / sizeof(*f))
		return 0;
	f = reallocarray(m->core.floors, m->core.n_floors + st->n_domains, sizeof(*f));
	if (!f)
		return -ENOMEM;
	m->core.floors = f;
	for (size_t i = 0; i < st->n_domains; i++) {
		struct generation_floor *g = &m->core.floors[m->core.n_floors];

		if (!st->domains[i]->name)
			continue;
		snprintf(g->name, sizeof(g->name), "%s", st->domains[i]->name);
		g->generation = st->domains[i]->generation;
		m->core.n_floors++;
	}
	return 0;
}

static int adopt_state(struct manager *m, const State *st, struct handover_fds *passed,
		       unsigned *ret_allocations, char *why, size_t why_size)
{
	int r;

	*ret_allocations = 0;
	if (st->version != HANDOVER_VERSION) {
		snprintf(why, why_size, "state version %u, this mrd reads %u", st->version,
			 HANDOVER_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (st->window_base != (uintptr_t)m->core.window.base ||
	    st->window_size != m->core.window.size || st->slot_size != m->core.window.slot_size) {
		snprintf(why, why_size, "its window 0x%" PRIx64 "+0x%" PRIx64 " (arenas of 0x%" PRIx64
			 ") differs from [memory] now", st->window_base, st->window_size,
			 st->slot_size);
		return -EINVAL;
	}
	m->instance = st->instance;
	window_adopt_serial(&m->core.window, st->arena_serial);
	if (st->next_client_id > m->next_client_id)
		m->next_client_id = st->next_client_id;
	r = record_floors(m, st);
	if (r < 0) {
		snprintf(why, why_size, "%s", strerror(-r));
		return r;
	}
	for (size_t i = 0; i < st->n_domains; i++) {
		const SavedDomain *sd = st->domains[i];
		struct domain *d;

		r = sd->name && *sd->name && strlen(sd->name) < sizeof(d->name) ?
			    domain_adopt(&m->core, sd->name, sd->allocation_serial, sd->frees,
					 &d) : -EINVAL;
		if (r < 0) {
			snprintf(why, why_size, "domain '%s': %s", sd->name ? sd->name : "",
				 strerror(-r));
			return r;
		}
		for (size_t j = 0; j < sd->n_arenas; j++) {
			r = adopt_arena(d, sd->arenas[j], passed, why, why_size);
			if (r < 0)
				return r;
			*ret_allocations += (unsigned)r;
		}
		domain_update_status(d);
	}
	return 0;
}

/* The contexts the previous mrd says clients still hold, kept whether or not the rest can be
 * taken over: they live on either way. */
static void adopt_old_contexts(struct manager *m, const State *st)
{
	for (size_t i = 0; i < st->n_old_contexts; i++) {
		const SavedOldContext *so = st->old_contexts[i];
		struct context_holder *h = calloc(so->n_holders ? so->n_holders : 1, sizeof(*h));
		int r;

		if (!h) {
			log_error("cannot record the previous mrd's old contexts: out of memory");
			return;
		}
		for (size_t j = 0; j < so->n_holders; j++)
			h[j] = (struct context_holder){ .pid = (pid_t)so->holders[j]->pid,
							.uid = (uid_t)so->holders[j]->uid,
							.start_time = so->holders[j]->start_time,
							.session = so->holders[j]->session };
		r = old_context_add(&m->old_contexts, so->domain, so->device, so->pinned_bytes,
				    so->mrs, so->handed_over_usec, h, so->n_holders);
		free(h);
		if (r < 0)
			log_warning_errno(r, "an old context of the previous mrd is not recorded: %m");
	}
	if (!LIST_EMPTY(&m->old_contexts))
		log_notice("%zu device context(s) of earlier mrds are still held by clients that "
			   "imported them: their MRs, pins and keys live until those close them "
			   "(mrctl status)", old_contexts_prune(&m->old_contexts));
}

int handover_adopt(struct manager *m, struct handover_fds *passed)
{
	uint64_t instance = m->instance;
	struct timeval grace = { 0, 0 };
	unsigned n_allocations;
	State *st = NULL;
	char why[256] = "";
	int fd, r;

	fd = take_fd(passed, HANDOVER_STATE_NAME);
	if (fd < 0)
		return 0;
	r = read_state(fd, &st);
	close(fd);
	if (r < 0) {
		log_error_errno(r, "the previous mrd's state cannot be read (%m): starting without it");
		return 0;
	}
	if (st->version == HANDOVER_VERSION)
		adopt_old_contexts(m, st);
	r = adopt_state(m, st, passed, &n_allocations, why, sizeof(why));
	mrd__handover__state__free_unpacked(st, NULL);
	if (r < 0) {
		adoption_undo(m, instance);
		log_error("the previous mrd's state cannot be taken over (%s): starting without it; "
			  "its clients keep their mappings but must connect anew", why);
		return 0;
	}
	/* Domains where nothing waits need no hold. */
	for (struct domain *d = LIST_FIRST(&m->core.domains), *next; d; d = next) {
		next = LIST_NEXT(d, link);
		if (d->mem.n_orphans == 0)
			(void)domain_reap_orphans(d, true);
	}
	if (m->core.n_domains == 0)
		return 0;
	/* Every so often, what waits for a process that is gone goes. */
	grace.tv_sec = m->core.config.reconnect_grace_s;
	m->grace_timer = event_new(m->core.base, -1, EV_PERSIST, on_grace_tick, m);
	if (!m->grace_timer || event_add(m->grace_timer, &grace) < 0) {
		adoption_undo(m, instance);
		return log_error_errno(-ENOMEM, "cannot start the reconnect grace timer");
	}
	log_notice("took over %u allocation(s) of %u domain(s) from the previous mrd; they wait "
		   "for their processes to reconnect (those of processes gone are freed, checked "
		   "every %u s)", n_allocations, m->core.n_domains,
		   m->core.config.reconnect_grace_s);
	return 0;
}
