/* SPDX-License-Identifier: MIT */
/* The memory family: JoinDomain, Alloc, Free, Map, ExtmemAttach, ExtmemDetach. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <inttypes.h>

#include "log.h"
#include "status-page.h"
#include "base/fd-closer.h"
#include "memory/arena.h"
#include "registration/mr-cache.h"
#include "core/domain.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

/* Requests of this family need the caller's domain. */
/* Describes arena in r, attaching a dup of its memfd the first time c meets it. */
static int describe_arena(struct client *c, struct arena *a, bool force_fd, struct reply *r)
{
	Mrd__ArenaInfo *info = &r->arena;
	int fd;

	mrd__arena_info__init(info);
	info->id = a->id;
	info->address = (uint64_t)(uintptr_t)a->base;
	info->size = a->size;
	info->page_size = a->page_size;
	info->hugetlb = a->hugetlb;
	info->external = a->external;
	info->file_offset = a->file_offset;
	info->serial = a->serial;
	if (force_fd || !client_has_arena(c, a->id)) {
		fd = fcntl(a->memfd, F_DUPFD_CLOEXEC, 3);
		if (fd < 0)
			return -errno;
		if (!client_has_arena(c, a->id) && client_add_arena(c, a->id) < 0) {
			close(fd);
			return -ENOMEM;
		}
		r->fds[r->n_fds++] = fd;
		info->fd_attached = true;
	}
	return 0;
}

int request_join_domain(struct client *c, struct domain *d, const Mrd__Request *req,
			struct wire_packet *pkt, struct reply *r)
{
	const Mrd__JoinDomainRequest *q = req->join_domain;
	const struct manager *m = c->manager;
	Mrd__JoinDomainResponse *body;
	unsigned resumed = 0;
	int fd;

	/* After a warm restart: what this process held under that session comes back to it. */
	if (!c->joined && q->resume_instance == m->instance) {
		resumed = domain_claim(d, &c->owner, q->resume_session);
		if (resumed)
			log_info("client %" PRIu64 " (pid %d) took back %u allocation(s) of session %"
				 PRIu64, c->id, (int)c->owner.mem.pid, resumed, q->resume_session);
	}
	fd = domain_status_fd(d);
	if (fd < 0)
		return fd;
	r->fds[r->n_fds++] = fd;
	body = reply_body(r, MRD__RESPONSE__BODY_JOIN_DOMAIN);
	body->domain = d->name;
	body->window_base = m->core.config.window_base;
	body->window_size = m->core.config.window_size;
	body->status_page_size = MRD_STATUS_PAGE_SIZE;
	body->instance = m->instance;
	body->session = c->id;
	c->joined = true;
	body->resumed = resumed;
	return 0;
}

int request_alloc_check(const Mrd__Request *req, struct reply *r)
{
	const Mrd__AllocRequest *q = req->alloc;

	if (q->flags & ~(uint32_t)(MRD__ALLOC_FLAGS__ALLOC_HUGEPAGE | MRD__ALLOC_FLAGS__ALLOC_ODP |
				   MRD__ALLOC_FLAGS__ALLOC_READ_ONLY |
				   MRD__ALLOC_FLAGS__ALLOC_REGISTER)) {
		reply_set_message(r, "unknown allocation flags 0x%x", q->flags);
		return -EINVAL;
	}
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	/* The pages it takes: the size rounded up, as the allocation will be. */
	if (q->size > UINT64_MAX - (page - 1)) {
		/* No memory can be that large: -ENOMEM, as malloc() and mmap() say. */
		reply_set_message(r, "a size of %" PRIu64 " bytes: rounded up to whole pages it "
				  "passes 2^64", q->size);
		return -ENOMEM;
	}
	if (q->alias % page) {
		reply_set_message(r, "alias 0x%" PRIx64 " is not page-aligned (pages of %" PRIu64
				  " bytes)", q->alias, page);
		return -EINVAL;
	}
	if (q->alias > UINT64_MAX - (q->size + page - 1) / page * page) {
		reply_set_message(r, "%" PRIu64 " bytes at alias 0x%" PRIx64 " pass the end of the "
				  "address space", q->size, q->alias);
		return -EINVAL;
	}
	if (q->alias &&
	    (q->flags & (MRD__ALLOC_FLAGS__ALLOC_HUGEPAGE | MRD__ALLOC_FLAGS__ALLOC_ODP))) {
		reply_set_message(r, "an alias takes neither huge pages nor on-demand memory: it is "
				  "a program's own buffer");
		return -EINVAL;
	}
	if ((q->span_offset || q->span_length) &&
	    (!q->alias || !q->span_length || q->span_offset > q->size ||
	     q->span_length > q->size - q->span_offset)) {
		reply_set_message(r, "span [%" PRIu64 ", +%" PRIu64 "): without an alias, empty, or "
				  "past the %" PRIu64 " bytes", q->span_offset, q->span_length,
				  q->size);
		return -EINVAL;
	}
	if ((q->alias_access && !q->alias) || (q->alias_access & ~(uint32_t)0xf) ||
	    ((q->alias_access & (MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_ATOMIC)) &&
	     !(q->alias_access & MRD_ACCESS_LOCAL_WRITE))) {
		reply_set_message(r, "alias access 0x%x: without an alias, unknown bits, or remote "
				  "write or atomics without local write", q->alias_access);
		return -EINVAL;
	}
	return 0;
}

/* ALLOC_REGISTER: the keys of a fresh allocation, registered here in the connection's PD when
 * that cannot stall the loop (no waiter: the provider must be free and the run under
 * [cache] async_bytes); NULL otherwise, or when it fails, and a lookup does it later. */
static Mrd__MrEntry *register_now(struct client *c, struct domain *d, const struct allocation *a,
				  struct reply *r)
{
	struct mr_entry e;
	Mrd__MrEntry **ptrs;
	char why[256];

	if (c->bound_lost || domain_register_now(d, c->bound, a, &e, why, sizeof(why)) < 0 ||
	    !(ptrs = fill_mr_entries(r, &e, 1)))
		return NULL;
	if (!c->bound)
		c->keys_out = true; /* a key of the domain's PD: too late to bind */
	return ptrs[0];
}

int request_alloc(struct client *c, struct domain *d, const Mrd__Request *req,
		  struct wire_packet *pkt, struct reply *r)
{
	const Mrd__AllocRequest *q = req->alloc;
	Mrd__AllocResponse *body;
	struct allocation *a;
	int k;

	k = domain_alloc(d, &c->owner, q->size, q->align,
			 q->alias ? PAGES_SMALL :
			 q->flags & MRD__ALLOC_FLAGS__ALLOC_HUGEPAGE ? PAGES_HUGE : PAGES_AUTO,
			 q->flags & MRD__ALLOC_FLAGS__ALLOC_ODP,
			 q->flags & MRD__ALLOC_FLAGS__ALLOC_READ_ONLY, &a, r->message,
			 sizeof(r->message));
	if (k < 0)
		return k;
	/* Before any registration. */
	allocation_set_alias(a, q->alias, q->alias_access, q->span_offset, q->span_length);
	k = describe_arena(c, a->arena, false, r);
	if (k < 0) {
		(void)domain_free_allocation(d, a, NULL);
		return k;
	}
	body = reply_body(r, MRD__RESPONSE__BODY_ALLOC);
	body->address = allocation_address(a);
	body->length = a->length;
	body->arena = &r->arena;
	if (q->flags & MRD__ALLOC_FLAGS__ALLOC_REGISTER)
		body->keys = register_now(c, d, a, r);
	return 0;
}

/* The caller's allocation at address, or an error that says why not. */
static int owned_allocation(struct client *c, struct domain *d, uint64_t address, bool external,
			    struct reply *r, struct allocation **ret)
{
	struct allocation *a;

	a = domain_find_allocation(d, address);
	if (!a) {
		reply_set_message(r, "0x%" PRIx64 " is not the start of an allocation of domain %s",
				  address, d->name);
		return -ENOENT;
	}
	if (a->owner != &c->owner.mem) {
		if (a->owner == &d->leaving.mem)
			reply_set_message(r, "0x%" PRIx64 " belongs to a client that left; it is being "
					  "freed", address);
		else if (a->owner)
			reply_set_message(r, "0x%" PRIx64 " belongs to another client (pid %d)",
					  address, (int)a->owner->pid);
		else if (a->orphan)
			reply_set_message(r, "0x%" PRIx64 " waits for its owner (pid %d) to reconnect "
					  "after mrd restarted", address, (int)a->claim_pid);
		else
			reply_set_message(r, "0x%" PRIx64 " belongs to a client that left; it stays "
					  "while mempools of others are registered in it", address);
		return -EPERM;
	}
	if (a->arena->external != external) {
		reply_set_message(r, "0x%" PRIx64 " is %s: use %s", address,
				  external ? "allocated memory" : "attached memory",
				  external ? "mrd_mem_free()" : "mrd_extmem_detach()");
		return -EINVAL;
	}
	*ret = a;
	return 0;
}

static void set_free_body(struct reply *r, bool external)
{
	(void)reply_body(r, external ? MRD__RESPONSE__BODY_EXTMEM_DETACH : MRD__RESPONSE__BODY_FREE);
}

/* A Free or ExtmemDetach whose MRs a worker deregisters: answered once the pages are back, so
 * that when it returns no key for the memory works any more. */
struct pending_free {
	struct pending_request base; /* first */
	bool external;
};

static void free_resume(struct waiter *w, int result, const struct mr_entry *entry,
			const char *why)
{
	struct pending_free *p = (struct pending_free *)w;
	struct reply r;

	if (p->base.client) {
		reply_init(&r, p->base.id);
		set_free_body(&r, p->external);
		request_answer(&p->base, &r, 0);
	}
	free(p);
}

static int free_owned(struct client *c, struct domain *d, uint64_t id, uint64_t address,
		      bool external, struct reply *r)
{
	struct pending_free *p;
	struct allocation *a;
	unsigned pool_refs;
	int k;

	k = owned_allocation(c, d, address, external, r, &a);
	if (k < 0)
		return k;
	pool_refs = reg_allocation_of(a)->pool_refs;
	if (pool_refs > 0) {
		reply_set_message(r, "0x%" PRIx64 " holds %u mempool MR%s: unregister its pools "
				  "first", address, pool_refs, pool_refs == 1 ? "" : "s");
		return -EBUSY;
	}
	p = request_pending_new(sizeof(*p), id, free_resume);
	if (!p)
		return -ENOMEM;
	p->external = external;
	k = domain_free_allocation(d, a, &p->base.waiter);
	if (k == -EINPROGRESS) {
		request_wait(c, &p->base);
		return k;
	}
	free(p);
	set_free_body(r, external);
	return 0;
}

int request_free(struct client *c, struct domain *d, const Mrd__Request *req,
		 struct wire_packet *pkt, struct reply *r)
{
	return free_owned(c, d, req->id, req->free->address, false, r);
}

/* An AliasSpan drop whose MRs a worker deregisters: answered once they are gone. */
static void drop_resume(struct waiter *w, int result, const struct mr_entry *entry,
			const char *why)
{
	struct pending_request *p = (struct pending_request *)w;
	struct reply r;

	(void)entry;
	if (p->client) {
		reply_init(&r, p->id);
		if (result < 0)
			reply_set_message(&r, "%s", why);
		else
			(void)reply_body(&r, MRD__RESPONSE__BODY_ALIAS_SPAN);
		request_answer(p, &r, result);
	}
	free(p);
}

/* The span [offset, offset + length) of a goes, answered once its MRs are gone. */
static int drop_span(struct client *c, uint64_t id, struct allocation *a, uint64_t offset,
		     uint64_t length, struct reply *r)
{
	uint64_t base = allocation_address(a);
	struct pending_request *p;
	int k;

	k = allocation_span_droppable(a, offset, length, r->message, sizeof(r->message));
	if (k < 0)
		return k;
	p = request_pending_new(sizeof(*p), id, drop_resume);
	if (!p)
		return -ENOMEM;
	k = mr_cache_drop_span(reg_allocation_of(a), base + offset, base + offset + length,
			       r->message, sizeof(r->message), &p->waiter);
	if (k == -EINPROGRESS) {
		request_wait(c, p);
		return k;
	}
	free(p);
	return k;
}

int request_alias_span(struct client *c, struct domain *d, const Mrd__Request *req,
		       struct wire_packet *pkt, struct reply *r)
{
	const Mrd__AliasSpanRequest *q = req->alias_span;
	struct allocation *a;
	unsigned n;
	int k;

	k = owned_allocation(c, d, q->address, false, r, &a);
	if (k < 0)
		return k;
	if (q->drop)
		k = drop_span(c, req->id, a, q->span_offset, q->span_length, r);
	else if ((n = mr_cache_out_of_tables(reg_allocation_of(a))) >= ALLOCATION_SPANS_MAX) {
		/* Each drop its device refuses leaves one: the spans' cap must bound them too. */
		snprintf(r->message, sizeof(r->message), "%u MRs of this allocation are kept by "
			 "their device (memory windows bound to them) or being deregistered: no new "
			 "span until they go or it is freed", n);
		k = -EBUSY;
	} else
		k = allocation_add_span(a, q->span_offset, q->span_length, r->message,
					sizeof(r->message));
	if (k < 0)
		return k;
	(void)reply_body(r, MRD__RESPONSE__BODY_ALIAS_SPAN);
	return 0;
}

int request_map(struct client *c, struct domain *d, const Mrd__Request *req,
		struct wire_packet *pkt, struct reply *r)
{
	Mrd__MapResponse *body;
	struct arena *a;
	int k;

	a = domain_find_arena(d, req->map->address);
	if (!a) {
		/* Another domain's memory looks exactly like no memory at all. */
		reply_set_message(r, "0x%" PRIx64 " is not memory of domain %s", req->map->address,
				  d->name);
		return -ENOENT;
	}
	k = describe_arena(c, a, true, r);
	if (k < 0)
		return k;
	body = reply_body(r, MRD__RESPONSE__BODY_MAP);
	body->arena = &r->arena;
	return 0;
}

int request_extmem_attach(struct client *c, struct domain *d, const Mrd__Request *req,
			  struct wire_packet *pkt, struct reply *r)
{
	const Mrd__ExtmemAttachRequest *q = req->extmem_attach;
	Mrd__ExtmemAttachResponse *body;
	struct allocation *a;
	int k, fd;

	fd = take_request_fd(pkt, 0);
	k = domain_attach_external(d, &c->owner, fd, q->offset, q->length, &a, r->message,
				   sizeof(r->message));
	if (k < 0) {
		fd_closer_consume(c->manager->closer, fd, c->owner_uid);
		return k;
	}
	/* The client has the memfd already; it maps it itself. */
	k = client_add_arena(c, a->arena->id);
	if (k >= 0)
		k = describe_arena(c, a->arena, false, r);
	if (k < 0) {
		(void)domain_free_allocation(d, a, NULL);
		return k;
	}
	body = reply_body(r, MRD__RESPONSE__BODY_EXTMEM_ATTACH);
	body->address = allocation_address(a);
	body->arena = &r->arena;
	return 0;
}

int request_extmem_detach(struct client *c, struct domain *d, const Mrd__Request *req,
			  struct wire_packet *pkt, struct reply *r)
{
	return free_owned(c, d, req->id, req->extmem_detach->address, true, r);
}
