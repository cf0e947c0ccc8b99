/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


#include "handover.pb-c.h"
#include "log.h"
#include "macro.h"
#include "time-util.h"
#include "base/fd-list.h"
#include "base/process.h"
#include "core/domain-handover.h"
#include "core/domain.h"
#include "control/handover.h"
#include "control/manager.h"

#define HANDOVER_VERSION 1
#define STATE_MAX (64u << 20)

typedef Mrd__Handover__State State;
typedef Mrd__Handover__Domain SavedDomain;
typedef Mrd__Handover__Arena SavedArena;
typedef Mrd__Handover__Allocation SavedAllocation;
typedef Mrd__Handover__OldContext SavedOldContext;
typedef Mrd__Handover__ContextHolder SavedHolder;

static const SavedDomain domain_init = MRD__HANDOVER__DOMAIN__INIT;
static const SavedArena arena_init = MRD__HANDOVER__ARENA__INIT;
static const SavedAllocation allocation_init = MRD__HANDOVER__ALLOCATION__INIT;
static const SavedOldContext old_context_init = MRD__HANDOVER__OLD_CONTEXT__INIT;
static const SavedHolder holder_init = MRD__HANDOVER__CONTEXT_HOLDER__INIT;

bool handover_fd_name(const char *name)
{
	return name && (strcmp(name, HANDOVER_STATE_NAME) == 0 ||
			strncmp(name, HANDOVER_ARENA_PREFIX, strlen(HANDOVER_ARENA_PREFIX)) == 0);
}

/* ---- saving ---- */

/* n messages like init (size bytes each) and the n pointers to them, in one block: one free().
 * The state this file packs is built of these; strings in it are borrowed. */
static void *messages(size_t n, const void *init, size_t size)
{
	void **p = n <= SIZE_MAX / 2 / (sizeof(*p) + size) ? calloc(n ? n : 1, sizeof(*p) + size) :
							     NULL;

	for (size_t i = 0; p && i < n; i++)
		p[i] = memcpy((char *)(p + n) + i * size, init, size);
	return p;
}

static void state_free(State *st)
{
	for (size_t i = 0; i < st->n_old_contexts; i++)
		free(st->old_contexts[i]->holders);
	free(st->old_contexts);
	for (size_t i = 0; i < st->n_domains; i++) {
		for (size_t j = 0; j < st->domains[i]->n_arenas; j++)
			free(st->domains[i]->arenas[j]->allocations);
		free(st->domains[i]->arenas);
	}
	free(st->domains);
}

/* A saved arena into sa, its memfd into fds under the arena's name. */
static int encode_arena(struct saved_arena *a, SavedArena *sa, struct fd_list *fds)
{
	SavedAllocation **allocations;
	char name[64];
	int r;

	snprintf(name, sizeof(name), HANDOVER_ARENA_PREFIX "%" PRIu64, a->place.serial);
	r = fd_list_add(fds, TAKE_FD(a->memfd), name);
	if (r < 0)
		return r;
	allocations = messages(a->n_allocations, &allocation_init, sizeof(allocation_init));
	if (!allocations)
		return -ENOMEM;
	*sa = (SavedArena){
		.base = arena_init.base, .fd_name = fds->names[fds->n - 1], .slot = a->place.slot,
		.size = a->place.size, .page_size = a->place.page_size, .hugetlb = a->place.hugetlb,
		.external = a->place.external, .file_offset = a->place.file_offset,
		.serial = a->place.serial, .allocations = allocations,
		.n_allocations = a->n_allocations,
	};
	for (size_t i = 0; i < a->n_allocations; i++) {
		const struct adopted_allocation *al = &a->allocations[i];

		*allocations[i] = (SavedAllocation){
			.base = allocation_init.base, .offset = al->offset, .length = al->length,
			.serial = al->serial, .odp = al->odp, .read_only = al->read_only,
			.alias = al->alias, .alias_access = al->alias_access,
			.span_offset = al->span_offset, .span_length = al->span_length,
			.n_more_spans = 2 * al->n_more_spans,
			.more_spans = (uint64_t *)(uintptr_t)al->more_spans,
			.session = al->session, .pid = (uint32_t)al->pid, .uid = (uint32_t)al->uid,
			.start_time = al->start_time,
		};
	}
	return 0;
}

static int encode_domains(State *st, struct saved_domain *saved, size_t n, struct fd_list *fds)
{
	int r;

	st->domains = messages(n, &domain_init, sizeof(domain_init));
	if (!st->domains)
		return -ENOMEM;
	st->n_domains = n;
	for (size_t i = 0; i < n; i++) {
		SavedDomain *sd = st->domains[i];

		*sd = (SavedDomain){
			.base = domain_init.base, .name = (char *)saved[i].name,
			.generation = saved[i].generation, .frees = saved[i].frees,
			.allocation_serial = saved[i].allocation_serial,
			.arenas = messages(saved[i].n_arenas, &arena_init, sizeof(arena_init)),
		};
		if (!sd->arenas)
			return -ENOMEM;
		sd->n_arenas = saved[i].n_arenas;
		for (size_t j = 0; j < sd->n_arenas; j++)
			if ((r = encode_arena(&saved[i].arenas[j], sd->arenas[j], fds)) < 0)
				return r;
	}
	return 0;
}

/* A context clients hold (o: its figures; strings borrowed until st is packed) into st, with
 * its holders still running; none: nothing. st->old_contexts has room. */
static int save_old_context(State *st, const SavedOldContext *o, const struct context_holder *h,
			    size_t n)
{
	SavedOldContext *so = st->old_contexts[st->n_old_contexts];

	*so = *o;
	so->holders = messages(n, &holder_init, sizeof(holder_init));
	if (!so->holders)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (!process_gone(h[i].pid, h[i].uid, h[i].start_time))
			*so->holders[so->n_holders++] = (SavedHolder){
				.base = holder_init.base, .pid = (uint32_t)h[i].pid,
				.uid = (uint32_t)h[i].uid, .start_time = h[i].start_time,
				.session = h[i].session,
			};
	if (so->n_holders > 0)
		st->n_old_contexts++;
	else
		free(so->holders);
	return 0;
}

/* Contexts exported to clients outlive this mrd with what it registered in them (the kernel
 * keeps a context while any descriptor of it is open): the next mrd shows them, those of
 * earlier mrds still held too. */
static int save_old_contexts(struct manager *m, State *st, const struct saved_domain *saved,
			     size_t n)
{
	const struct old_context *o;
	size_t n_all = n;
	uint64_t now = now_usec(CLOCK_REALTIME);
	int r = 0;

	LIST_FOREACH(o, &m->old_contexts, link)
		n_all++;
	st->old_contexts = messages(n_all, &old_context_init, sizeof(old_context_init));
	if (!st->old_contexts)
		return -ENOMEM;
	LIST_FOREACH(o, &m->old_contexts, link) {
		SavedOldContext so = {
			.base = old_context_init.base, .domain = (char *)o->domain,
			.device = (char *)o->device, .pinned_bytes = o->pinned_bytes, .mrs = o->mrs,
			.handed_over_usec = o->handed_over_usec,
		};

		if ((r = save_old_context(st, &so, o->holders, o->n_holders)) < 0)
			return r;
	}
	for (size_t i = 0; i < n; i++) {
		const struct saved_domain *d = &saved[i];
		SavedOldContext so = {
			.base = old_context_init.base, .domain = (char *)d->name,
			.device = (char *)d->device, .pinned_bytes = d->pinned_bytes, .mrs = d->mrs,
			.handed_over_usec = now,
		};
		size_t before = st->n_old_contexts;

		if (d->n_exported_to == 0)
			continue;
		r = save_old_context(st, &so, d->exported_to, d->n_exported_to);
		if (r < 0)
			return r;
		if (st->n_old_contexts > before)
			log_notice("domain %s: its device context was exported to %zu running "
				   "process(es); it outlives this mrd with its %" PRIu32 " MR(s) and "
				   "%" PRIu64 " pinned bytes until they close it (mrd cannot revoke it)",
				   d->name, st->old_contexts[before]->n_holders, d->mrs,
				   d->pinned_bytes);
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

int handover_save(struct manager *m, struct fd_list *ret, unsigned *ret_allocations)
{
	State st = MRD__HANDOVER__STATE__INIT;
	struct saved_domain *saved = NULL;
	struct fd_list fds = {};
	size_t n = 0;
	int fd = -1, r;

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
	/* The state goes first; its slot is filled in once it is packed. */
	r = fd_list_add(&fds, -1, HANDOVER_STATE_NAME);
	if (r >= 0)
		r = domains_save(&m->core, &saved, &n);
	if (r >= 0)
		r = encode_domains(&st, saved, n, &fds);
	if (r >= 0)
		r = save_old_contexts(m, &st, saved, n);
	for (size_t i = 0; r >= 0 && i < st.n_domains; i++)
		for (size_t j = 0; j < st.domains[i]->n_arenas; j++)
			*ret_allocations += (unsigned)st.domains[i]->arenas[j]->n_allocations;
	if (r >= 0)
		r = state_memfd(&st, &fd);
	state_free(&st);
	saved_domains_free(saved, n);
	if (r < 0) {
		fd_list_done(&fds);
		return r;
	}
	fds.fds[0] = fd;
	*ret = fds;
	return 0;
}

/* ---- adopting ---- */

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

/* A saved arena of the state in plain C into a, its memfd taken from passed. */
static int decode_arena(const SavedArena *sa, struct saved_arena *a, struct fd_list *passed)
{
	a->memfd = sa->fd_name && handover_fd_name(sa->fd_name) ? fd_list_take(passed, sa->fd_name) :
								 -ENOENT;
	a->label = sa->fd_name;
	a->place = (struct arena_place){
		.slot = sa->slot, .size = sa->size, .file_offset = sa->file_offset,
		.serial = sa->serial, .page_size = sa->page_size, .hugetlb = sa->hugetlb,
		.external = sa->external,
	};
	a->allocations = calloc(sa->n_allocations ? sa->n_allocations : 1, sizeof(*a->allocations));
	if (!a->allocations)
		return -ENOMEM;
	a->n_allocations = sa->n_allocations;
	for (size_t i = 0; i < sa->n_allocations; i++) {
		const SavedAllocation *s = sa->allocations[i];

		a->allocations[i] = (struct adopted_allocation){
			.offset = s->offset, .length = s->length, .serial = s->serial, .odp = s->odp,
			.read_only = s->read_only, .alias = s->alias, .alias_access = s->alias_access,
			.span_offset = s->span_offset, .span_length = s->span_length,
			.session = s->session, .pid = (pid_t)s->pid, .uid = (uid_t)s->uid,
			.start_time = s->start_time,
		};
		/* A span past what an allocation holds: the state is not one mrd wrote. */
		if (s->n_more_spans % 2 || s->n_more_spans > 2 * (ALLOCATION_SPANS_MAX - 1))
			return -EINVAL;
		if (s->n_more_spans) /* else more_spans is NULL */
			memcpy(a->allocations[i].more_spans, s->more_spans,
			       s->n_more_spans * sizeof(*s->more_spans));
		a->allocations[i].n_more_spans = (unsigned)s->n_more_spans / 2;
	}
	return 0;
}

/* The state's domains in plain C (st->n_domains of them, borrowing its strings). */
/* What each saved domain is: its name and counters (nothing allocated, so that its floor can be
 * recorded before anything else can fail). */
static void name_domains(const State *st, struct saved_domain *saved)
{
	for (size_t i = 0; i < st->n_domains; i++) {
		const SavedDomain *sd = st->domains[i];

		saved[i] = (struct saved_domain){ .name = sd->name, .generation = sd->generation,
						   .frees = sd->frees,
						   .allocation_serial = sd->allocation_serial };
	}
}

static int decode_domains(const State *st, struct fd_list *passed, struct saved_domain *saved)
{
	int r;

	for (size_t i = 0; i < st->n_domains; i++) {
		const SavedDomain *sd = st->domains[i];
		struct saved_domain *d = &saved[i];

		d->arenas = calloc(sd->n_arenas ? sd->n_arenas : 1, sizeof(*d->arenas));
		if (!d->arenas)
			return -ENOMEM;
		for (size_t j = 0; j < sd->n_arenas; j++) {
			d->arenas[d->n_arenas] = (struct saved_arena){ .memfd = -1 };
			r = decode_arena(sd->arenas[j], &d->arenas[d->n_arenas++], passed);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

/* Undoes a partial adoption: nothing is freed from the memfds, clients still map them. */
static void adoption_undo(struct manager *m, uint64_t instance)
{
	bool keep = window_keep_content(&m->core.window, true);

	handover_end_grace(m);
	window_keep_content(&m->core.window, keep);
	m->instance = instance;
}

static int adopt_state(struct manager *m, const State *st, struct fd_list *passed,
		       unsigned *ret_allocations, char *why, size_t why_size)
{
	struct saved_domain *saved;
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
	saved = calloc(st->n_domains ? st->n_domains : 1, sizeof(*saved));
	if (!saved) {
		snprintf(why, why_size, "%s", strerror(ENOMEM));
		return -ENOMEM;
	}
	/* First, before anything else can fail: the previous mrd's clients cached keys under
	 * these generations, whether or not the rest can be taken over. */
	name_domains(st, saved);
	r = domains_record_floors(&m->core, saved, st->n_domains);
	if (r >= 0)
		r = decode_domains(st, passed, saved);
	if (r < 0)
		snprintf(why, why_size, "%s", strerror(-r));
	else
		r = domains_adopt(&m->core, saved, st->n_domains, ret_allocations, why, why_size);
	saved_domains_free(saved, st->n_domains);
	return r;
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

int handover_adopt(struct manager *m, struct fd_list *passed)
{
	uint64_t instance = m->instance;
	unsigned n_allocations;
	State *st = NULL;
	char why[256] = "";
	int fd, r;

	fd = fd_list_take(passed, HANDOVER_STATE_NAME);
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
	if (m->core.n_domains == 0)
		return 0;
	r = handover_start_grace(m);
	if (r < 0) {
		adoption_undo(m, instance);
		return log_error_errno(r, "cannot start the reconnect grace timer");
	}
	log_notice("took over %u allocation(s) of %u domain(s) from the previous mrd; they wait "
		   "for their processes to reconnect (those of processes gone are freed, checked "
		   "every %u s)", n_allocations, m->core.n_domains,
		   m->core.config.reconnect_grace_s);
	return 0;
}
