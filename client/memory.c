/* SPDX-License-Identifier: MIT */
/* The client half of mrd's memory model: the process reserves mrd's window at the same
 * address, maps each arena it meets at the address mrd gave it, and maps the domain's status
 * page read-only. Several handles of one process share the window and the mappings
 * (refcounted), as long as they talk to the same mrd. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "call.h"
#include "log.h"
#include "memory.h"
#include "own-windows.h"
#include "mrd/mrd.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

struct mapped_arena {
	uint32_t id;
	uint64_t serial; /* which arena of that id is mapped */
	uint64_t base, size;
	unsigned refs;
};

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/* ThreadSanitizer's runtime, when the program was built with -fsanitize=thread. */
extern void __tsan_init(void) __attribute__((weak));

/* Process-wide: one window per process. */
static pthread_mutex_t window_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	uint64_t base, size, instance;
	unsigned refs;
	/* Nothing reserved: each arena is mapped where it goes with MAP_FIXED_NOREPLACE, and
	 * unmapped when done (MRD_WINDOW=lazy; by default under valgrind and TSan, where a
	 * multi-TiB reservation costs valgrind half a minute or falls on TSan's shadow). */
	bool lazy;
	struct mapped_arena *arenas;
	size_t n, cap;
} window;

/* MRD_WINDOW=reserve|lazy, else lazy under valgrind and TSan only. */
static bool window_lazy(void)
{
	const char *s = getenv("MRD_WINDOW");

	if (s && strcmp(s, "lazy") == 0)
		return true;
	if (s && strcmp(s, "reserve") == 0)
		return false;
	return RUNNING_ON_VALGRIND || __tsan_init;
}

static int window_hold(uint64_t base, uint64_t size, uint64_t instance)
{
	void *p;

	if (window.refs > 0) {
		if (window.instance != instance || window.base != base || window.size != size)
			return set_last_error(-EADDRINUSE, "this process already holds the window "
				"of another mrd; one process talks to one mrd at a time");
		window.refs++;
		return 0;
	}
	if (window_lazy()) {
		window = (typeof(window)){ .base = base, .size = size, .instance = instance,
					   .refs = 1, .lazy = true };
		return 0;
	}
	p = mmap((void *)(uintptr_t)base, size, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	if (p != MAP_FAILED && p != (void *)(uintptr_t)base) {
		munmap(p, size); /* an old kernel took NOREPLACE as a hint */
		p = MAP_FAILED;
		errno = EEXIST;
	}
	if (p == MAP_FAILED)
		return set_last_error(errno == EEXIST ? -EADDRINUSE : -errno,
				      "the address window 0x%" PRIx64 "+0x%" PRIx64 " of mrd is in use "
				      "in this process; move it with [memory] window_base in mrd.conf, "
				      "or reserve only the arenas mapped with MRD_WINDOW=lazy "
				      "(libmrd(3))", base, size);
	window.base = base;
	window.size = size;
	window.instance = instance;
	window.refs = 1;
	return 0;
}

bool memory_in_window(uintptr_t start, uintptr_t end)
{
	bool in;

	pthread_mutex_lock(&window_lock);
	in = window.refs > 0 && start < window.base + window.size && window.base < end;
	pthread_mutex_unlock(&window_lock);
	return in;
}

static void window_drop(void)
{
	if (--window.refs > 0)
		return;
	if (!window.lazy) /* lazily, the arenas went one by one */
		munmap((void *)(uintptr_t)window.base, window.size);
	free(window.arenas);
	memset(&window, 0, sizeof(window));
}

static struct mapped_arena *find_mapped(uint32_t id)
{
	for (size_t i = 0; i < window.n; i++)
		if (window.arenas[i].id == id)
			return &window.arenas[i];
	return NULL;
}

/* Back to the reservation: the window keeps its shape (lazily: just gone). */
static void unmap_range(uint64_t base, uint64_t size)
{
	if (window.lazy) {
		munmap((void *)(uintptr_t)base, size);
		return;
	}
	(void)mmap((void *)(uintptr_t)base, size, PROT_NONE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* MRD_WINDOW=lazy: reserves the arena's range, where only the process's own arenas may be,
 * and nothing else. The raw system call: TSan's mmap() aborts the program at an address outside
 * its application ranges, where the kernel answers EEXIST (TSan keeps them mapped). */
static int lazy_reserve(const Mrd__ArenaInfo *info)
{
	void *want = (void *)(uintptr_t)info->address, *p;

	/* Arenas recorded there are gone in mrd: their ranges are ours to take back. */
	for (size_t i = 0; i < window.n; i++) {
		struct mapped_arena *o = &window.arenas[i];

		if (o->base < info->address + info->size && info->address < o->base + o->size)
			munmap((void *)(uintptr_t)o->base, o->size);
	}
	p = (void *)syscall(SYS_mmap, want, (size_t)info->size, PROT_NONE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1,
			    (off_t)0);
	if (p != MAP_FAILED && p != want) {
		munmap(p, info->size); /* an old kernel took NOREPLACE as a hint */
		p = MAP_FAILED;
		errno = EEXIST;
	}
	if (p != MAP_FAILED)
		return 0;
	if (errno != EEXIST)
		return set_last_error(-errno, "cannot map arena %u: %s", info->id, strerror(errno));
	return set_last_error(-EADDRINUSE, "arena %u at 0x%" PRIx64 "+0x%" PRIx64 " of mrd's window "
			      "cannot be mapped in this process: something else is there "
			      "(MRD_WINDOW=lazy reserves nothing in advance; under TSan, its "
			      "shadow); move the window with [memory] window_base in mrd.conf "
			      "(for TSan: window_base = 0x4000000000, window_size = 64G; libmrd(3))",
			      info->id, info->address, info->size);
}

static int handle_add_arena(mrd_client *client, uint32_t id)
{
	for (size_t i = 0; i < client->n_arenas; i++)
		if (client->arenas[i] == id)
			return 0;
	if (client->n_arenas == client->arenas_cap) {
		size_t cap = client->arenas_cap ? client->arenas_cap * 2 : 8;
		uint32_t *ids = realloc(client->arenas, cap * sizeof(*ids));

		if (!ids)
			return -ENOMEM;
		client->arenas = ids;
		client->arenas_cap = cap;
	}
	client->arenas[client->n_arenas++] = id;
	return 1;
}

/* Maps the arena an answer describes (its memfd in fds when attached), once per handle.
 * -ENODATA: mrd sent no memfd for an arena this process does not have (a reply carrying it
 * was lost); the caller asks for it with Map. */
static int map_arena(mrd_client *client, const Mrd__ArenaInfo *info, struct conn_fds *fds)
{
	struct mapped_arena *ma;
	int fd = fds->n > 0 ? fds->fds[0] : -1, r = 0;
	void *p;

	if (!info || info->address < window.base || info->size > window.size ||
	    info->address - window.base > window.size - info->size)
		return set_last_error(-EBADMSG, "mrd described an arena outside its window");

	pthread_mutex_lock(&window_lock);
	ma = find_mapped(info->id);
	if (fd >= 0 && ma && ma->serial >= info->serial)
		fd = -1; /* mapped already, or a late reply about an arena since replaced */
	else if (fd < 0 && (!ma || ma->serial != info->serial)) {
		r = -ENODATA;
		goto out;
	}
	if (fd >= 0) {
		/* A fresh memfd: map it (again, if mrd reused the id for a new arena). */
		if (window.lazy) {
			r = lazy_reserve(info);
			if (r < 0)
				goto out;
		}
		/* NORESERVE: mrd backs each run before handing it out (huge pages too). */
		p = mmap((void *)(uintptr_t)info->address, info->size, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, (off_t)info->file_offset);
		if (p == MAP_FAILED) {
			r = set_last_error(-errno, "cannot map arena %u: %s", info->id,
					   strerror(errno));
			if (window.lazy)
				munmap((void *)(uintptr_t)info->address, info->size);
			goto out;
		}
		/* Arenas recorded over this range are gone in mrd (their slots were reused):
		 * forget them so closing an old handle never unmaps the new arena. */
		for (size_t i = 0; i < window.n;) {
			struct mapped_arena *o = &window.arenas[i];

			if (o != ma && o->base < info->address + info->size &&
			    info->address < o->base + o->size) {
				*o = window.arenas[--window.n];
				if (ma == &window.arenas[window.n])
					ma = o;
			} else
				i++;
		}
		if (!ma) {
			if (window.n == window.cap) {
				size_t cap = window.cap ? window.cap * 2 : 8;
				struct mapped_arena *a = realloc(window.arenas, cap * sizeof(*a));

				if (!a) {
					unmap_range(info->address, info->size);
					r = set_last_error(-ENOMEM, "out of memory");
					goto out;
				}
				window.arenas = a;
				window.cap = cap;
			}
			ma = &window.arenas[window.n++];
			*ma = (struct mapped_arena){ .id = info->id };
		}
		ma->base = info->address;
		ma->size = info->size;
		ma->serial = info->serial;
	}
	r = handle_add_arena(client, info->id);
	if (r > 0)
		ma->refs++;
	r = r < 0 ? set_last_error(r, "out of memory") : 0;
out:
	pthread_mutex_unlock(&window_lock);
	for (size_t i = 0; i < fds->n; i++)
		close(fds->fds[i]);
	fds->n = 0;
	return r;
}

/* JoinDomain on conn: the reply and its status page descriptor. */
static int join_domain(struct conn *conn, uint64_t resume_instance, uint64_t resume_session,
		       Mrd__Response **ret, int *ret_status_fd)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__JoinDomainRequest join = MRD__JOIN_DOMAIN_REQUEST__INIT;
	Mrd__Response *resp;
	struct conn_fds fds;
	int r;

	join.resume_instance = resume_instance;
	join.resume_session = resume_session;
	req.body_case = MRD__REQUEST__BODY_JOIN_DOMAIN;
	req.join_domain = &join;
	r = conn_request(conn, &req, &resp, &fds);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_JOIN_DOMAIN || fds.n != 1 ||
	    resp->join_domain->status_page_size < sizeof(struct mrd_status_page)) {
		for (size_t i = 0; i < fds.n; i++)
			close(fds.fds[i]);
		mrd__response__free_unpacked(resp, NULL);
		return set_last_error(-EBADMSG, "malformed JoinDomain reply");
	}
	*ret = resp;
	*ret_status_fd = fds.fds[0];
	return 0;
}

/* Maps the status page at hint (MAP_FIXED when not NULL: lookups hold pointers into it). */
static int map_status(int fd, uint32_t size, void *hint, const struct mrd_status_page **ret)
{
	void *page = mmap(hint, size, PROT_READ, MAP_SHARED | (hint ? MAP_FIXED : 0), fd, 0);

	if (page == MAP_FAILED)
		return set_last_error(-errno, "cannot map the status page: %s", strerror(errno));
	*ret = page;
	if ((*ret)->magic != MRD_STATUS_MAGIC)
		return set_last_error(-EBADMSG, "the status page has the wrong magic");
	return 0;
}

int memory_join(mrd_client *client)
{
	const Mrd__JoinDomainResponse *j;
	Mrd__Response *resp;
	int fd, r;

	r = join_domain(client->conn, 0, 0, &resp, &fd);
	if (r < 0)
		return r;
	j = resp->join_domain;
	client->status_size = j->status_page_size;
	r = map_status(fd, j->status_page_size, NULL, &client->status);
	if (r < 0)
		goto out;
	snprintf(client->domain, sizeof(client->domain), "%s", j->domain);
	client->session = j->session;

	pthread_mutex_lock(&window_lock);
	r = window_hold(j->window_base, j->window_size, j->instance);
	pthread_mutex_unlock(&window_lock);
	client->holds_window = r >= 0;
	if (r >= 0)
		log_debug("joined domain %s: window 0x%" PRIx64 "+0x%" PRIx64 ", generation %" PRIu64,
			  client->domain, j->window_base, j->window_size,
			  client->status->generation);
out:
	close(fd);
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

static int address_request(struct conn *conn, int body_case, uint64_t address,
			   Mrd__Response **ret);

int memory_rejoin(mrd_client *client, struct conn *conn, int *ret_status_fd)
{
	const Mrd__JoinDomainResponse *j;
	Mrd__Response *resp;
	uint64_t instance, base, size;
	int fd, r;

	pthread_mutex_lock(&window_lock);
	instance = window.instance;
	base = window.base;
	size = window.size;
	pthread_mutex_unlock(&window_lock);
	r = join_domain(conn, instance, client->session, &resp, &fd);
	if (r < 0)
		return r;
	j = resp->join_domain;
	if (j->instance != instance || j->window_base != base || j->window_size != size ||
	    strcmp(j->domain, client->domain) != 0) {
		r = set_last_error(-ESTALE, "mrd started without the memory of the one this handle "
				   "knew (no warm restart; or another domain or window): close every "
				   "handle of this process, which unmaps that memory, and connect anew");
		close(fd);
	} else if (j->status_page_size != client->status_size) {
		r = set_last_error(-EBADMSG, "the new mrd's status page has another size");
		close(fd);
	} else {
		client->session = j->session;
		*ret_status_fd = fd;
		r = (int)j->resumed;
	}
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

int memory_remap_status(mrd_client *client, int fd)
{
	/* In place: lookups hold a pointer into it, and the new page's generation is above
	 * anything they cached. */
	return map_status(fd, client->status_size, (void *)client->status, &client->status);
}

void memory_fork_lock(bool lock)
{
	if (lock)
		pthread_mutex_lock(&window_lock);
	else
		pthread_mutex_unlock(&window_lock);
}

/* A Free or ExtmemDetach of address got no answer: remembered for the next reconnect. */
static void note_lost_free(mrd_client *client, int body_case, uint64_t address)
{
	pthread_mutex_lock(&client->lost_lock);
	if (client->n_lost_frees < ELEMENTSOF(client->lost_frees))
		client->lost_frees[client->n_lost_frees++] =
			(struct lost_free){ .address = address, .body_case = body_case };
	else
		client->lost_frees_dropped = true;
	pthread_mutex_unlock(&client->lost_lock);
}

static int settle_lost_frees(mrd_client *client, struct conn *conn, unsigned *resumed)
{
	if (client->lost_frees_dropped) {
		/* More went unanswered than were kept: which came back cannot be told. */
		client->n_lost_frees = 0;
		client->lost_frees_dropped = false;
		*resumed = UINT_MAX;
		return 0;
	}
	while (client->n_lost_frees > 0) {
		const struct lost_free *lost = &client->lost_frees[client->n_lost_frees - 1];
		Mrd__Response *resp;
		int r;

		r = address_request(conn, lost->body_case, lost->address, &resp);
		if (r == -ECONNRESET || r == -ETIMEDOUT)
			return r; /* kept for the next try */
		if (r == 0) {
			mrd__response__free_unpacked(resp, NULL);
			/* It came back, and is gone now as asked. */
			if (*resumed > 0)
				(*resumed)--;
			__atomic_sub_fetch(&client->n_held, 1, __ATOMIC_RELEASE);
		} else if (r == -ENOENT || r == -EPERM)
			/* The old mrd had done it: nothing came back. */
			__atomic_sub_fetch(&client->n_held, 1, __ATOMIC_RELEASE);
		/* else it stays the handle's, as after any refused Free (a mempool covers it) */
		client->n_lost_frees--;
	}
	return 0;
}

int memory_settle_lost_frees(mrd_client *client, struct conn *conn, unsigned *resumed)
{
	int r;

	/* A call of another thread that failed on the old connection may note one meanwhile. */
	pthread_mutex_lock(&client->lost_lock);
	r = settle_lost_frees(client, conn, resumed);
	pthread_mutex_unlock(&client->lost_lock);
	return r;
}

void memory_leave(mrd_client *client)
{
	if (client->holds_window) {
		pthread_mutex_lock(&window_lock);
		for (size_t i = 0; i < client->n_arenas; i++) {
			struct mapped_arena *ma = find_mapped(client->arenas[i]);

			if (ma && --ma->refs == 0) {
				unmap_range(ma->base, ma->size);
				*ma = window.arenas[--window.n];
			}
		}
		window_drop();
		pthread_mutex_unlock(&window_lock);
	}
	free(client->arenas);
	client->arenas = NULL;
	client->n_arenas = 0;
	if (client->status)
		munmap((void *)client->status, client->status_size);
	client->status = NULL;
}

/* Alloc, and with ret_keys the keys registered with it (ALLOC_REGISTER); 1 when the reply
 * had none. alias: where this process maps it too (memory_alloc_alias), or 0. */
static int alloc(mrd_client *client, size_t size, size_t align, unsigned flags, uint64_t alias,
		 unsigned alias_access, uint64_t span_offset, uint64_t span_length, void **ret,
		 struct mrd_keys *ret_keys)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest alloc = MRD__ALLOC_REQUEST__INIT;
	Mrd__Response *resp;
	struct conn_fds fds;
	int r;

	if (!client || !ret)
		return set_last_error(-EINVAL, "mrd_mem_alloc: NULL argument");
	if (flags & ~(MRD_MEM_HUGEPAGE | MRD_MEM_ODP | MRD_MEM_READ_ONLY))
		return set_last_error(-EINVAL, "mrd_mem_alloc: unknown flags 0x%x", flags);
	alloc.size = size;
	alloc.align = align;
	alloc.alias = alias;
	alloc.alias_access = alias_access;
	alloc.span_offset = span_offset;
	alloc.span_length = span_length;
	alloc.flags = (flags & MRD_MEM_HUGEPAGE ? MRD__ALLOC_FLAGS__ALLOC_HUGEPAGE : 0) |
		      (flags & MRD_MEM_ODP ? MRD__ALLOC_FLAGS__ALLOC_ODP : 0) |
		      (flags & MRD_MEM_READ_ONLY ? MRD__ALLOC_FLAGS__ALLOC_READ_ONLY : 0) |
		      (ret_keys ? MRD__ALLOC_FLAGS__ALLOC_REGISTER : 0);
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &alloc;
	r = client_call(client, &req, &resp, &fds);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_ALLOC) {
		r = set_last_error(-EBADMSG, "malformed Alloc reply");
		goto out;
	}
	__atomic_add_fetch(&client->n_held, 1, __ATOMIC_RELEASE); /* mrd holds it for us now */
	r = map_arena(client, resp->alloc->arena, &fds);
	if (r == -ENODATA)
		r = mrd_mem_map(client, (void *)(uintptr_t)resp->alloc->address);
	if (r < 0) {
		/* Memory we cannot reach is memory we must not keep. */
		int k = r;
		char why[256];

		snprintf(why, sizeof(why), "%s", mrd_last_error());
		(void)mrd_mem_free(client, (void *)(uintptr_t)resp->alloc->address);
		r = set_last_error(k, "%s", why);
		goto out;
	}
	*ret = (void *)(uintptr_t)resp->alloc->address;
	log_debug("allocated %zu bytes at 0x%" PRIx64 " (flags 0x%x)", size, resp->alloc->address,
		  flags);
	if (ret_keys && resp->alloc->keys) {
		const Mrd__MrEntry *e = resp->alloc->keys;

		*ret_keys = (struct mrd_keys){ (uintptr_t)e->start, (uintptr_t)e->end, e->lkey,
					       e->rkey };
	} else if (ret_keys)
		r = 1;
out:
	for (size_t i = 0; i < fds.n; i++)
		close(fds.fds[i]);
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

int memory_alloc_alias(mrd_client *client, size_t size, uint64_t alias, unsigned access,
		       uint64_t span_offset, uint64_t span_length, void **ret)
{
	return alloc(client, size, 0, 0, alias, access, span_offset, span_length, ret, NULL);
}

int memory_alias_span(mrd_client *client, void *address, uint64_t span_offset,
		      uint64_t span_length, bool drop)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AliasSpanRequest span = MRD__ALIAS_SPAN_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	span.address = (uintptr_t)address;
	span.span_offset = span_offset;
	span.span_length = span_length;
	span.drop = drop;
	req.body_case = MRD__REQUEST__BODY_ALIAS_SPAN;
	req.alias_span = &span;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_ALIAS_SPAN)
		r = set_last_error(-EBADMSG, "malformed AliasSpan reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_mem_alloc(mrd_client *client, size_t size, size_t align, unsigned flags,
			     void **ret)
{
	return alloc(client, size, align, flags, 0, 0, 0, 0, ret, NULL);
}

MRD_EXPORT int mrd_mem_alloc_keys(mrd_client *client, size_t size, size_t align, unsigned flags,
				  void **ret, struct mrd_keys *ret_keys)
{
	int r;

	if (!ret_keys)
		return set_last_error(-EINVAL, "mrd_mem_alloc_keys: NULL argument");
	r = client ? client_pd_stale(client) : 0;
	if (r < 0)
		return r;
	r = alloc(client, size, align, flags, 0, 0, 0, 0, ret, ret_keys);
	if (r == 1) { /* not registered with it: the usual lookup */
		r = mrd_keys_query(client, *ret, ret_keys);
		if (r < 0) {
			int k = r;
			char why[256];

			snprintf(why, sizeof(why), "%s", mrd_last_error());
			(void)mrd_mem_free(client, *ret);
			r = set_last_error(k, "%s", why);
		}
	}
	return r;
}

/* Free or ExtmemDetach of address on conn, with no lock. */
static int address_request(struct conn *conn, int body_case, uint64_t address,
			   Mrd__Response **ret)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FreeRequest free_req = MRD__FREE_REQUEST__INIT;
	Mrd__ExtmemDetachRequest detach = MRD__EXTMEM_DETACH_REQUEST__INIT;

	req.body_case = body_case;
	if (body_case == MRD__REQUEST__BODY_FREE) {
		free_req.address = address;
		req.free = &free_req;
	} else {
		detach.address = address;
		req.extmem_detach = &detach;
	}
	return conn_request(conn, &req, ret, NULL);
}

/* Free and ExtmemDetach: one address, an empty answer. The windows libmrd bound over the
 * memory on the program's own QPs die first, and none is granted over it until mrd answered:
 * mrd lets the pages go once it does. */
static int call_address(mrd_client *client, int body_case, uint64_t address)
{
	bool held = own_windows_before_free(client, address);
	Mrd__Response *resp;
	int r;

	r = client_lock(client);
	if (r == 0) {
		r = address_request(client->conn, body_case, address, &resp);
		client_unlock(client);
	}
	own_windows_after_free(client, address, held);
	if (r == -ECONNRESET)
		/* Done or not, nobody can tell now: a reconnect asks the next mrd. */
		note_lost_free(client, body_case, address);
	if (r < 0)
		return r;
	mrd__response__free_unpacked(resp, NULL);
	__atomic_sub_fetch(&client->n_held, 1, __ATOMIC_RELEASE);
	log_debug("%s 0x%" PRIx64, body_case == MRD__REQUEST__BODY_FREE ? "freed" : "detached",
		  address);
	return 0;
}

MRD_EXPORT int mrd_mem_free(mrd_client *client, void *addr)
{
	if (!client)
		return set_last_error(-EINVAL, "mrd_mem_free: client is NULL");
	if (!addr)
		return 0;
	return call_address(client, MRD__REQUEST__BODY_FREE, (uintptr_t)addr);
}

MRD_EXPORT int mrd_mem_map(mrd_client *client, const void *addr)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MapRequest map = MRD__MAP_REQUEST__INIT;
	Mrd__Response *resp;
	struct conn_fds fds;
	int r;

	if (!client)
		return set_last_error(-EINVAL, "mrd_mem_map: client is NULL");
	map.address = (uintptr_t)addr;
	req.body_case = MRD__REQUEST__BODY_MAP;
	req.map = &map;
	r = client_call(client, &req, &resp, &fds);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_MAP)
		r = set_last_error(-EBADMSG, "malformed Map reply");
	else
		r = map_arena(client, resp->map->arena, &fds);
	for (size_t i = 0; i < fds.n; i++)
		close(fds.fds[i]);
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_extmem_attach(mrd_client *client, int fd, uint64_t offset, size_t length,
				 void **ret)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExtmemAttachRequest attach = MRD__EXTMEM_ATTACH_REQUEST__INIT;
	Mrd__Response *resp;
	struct conn_fds fds;
	uint64_t address;
	int r;

	if (!client || fd < 0 || !ret)
		return set_last_error(-EINVAL, "mrd_extmem_attach: bad argument");
	attach.offset = offset;
	attach.length = length;
	req.body_case = MRD__REQUEST__BODY_EXTMEM_ATTACH;
	req.extmem_attach = &attach;

	/* This request carries the fd, so it is sent by hand. */
	r = client_lock(client);
	if (r < 0)
		return r;
	r = conn_call_with_fds(client->conn, &req, &fd, 1, &resp, &fds);
	client_unlock(client);
	if (r < 0)
		return set_call_error(r);
	r = response_error(resp);
	if (r < 0)
		set_last_error(r, "%s", resp->message && *resp->message ? resp->message : strerror(-r));
	else if (resp->body_case != MRD__RESPONSE__BODY_EXTMEM_ATTACH || !resp->extmem_attach->arena)
		r = set_last_error(-EBADMSG, "malformed ExtmemAttach reply");
	else {
		/* mrd keeps its own copy; we map ours where it mapped its. */
		address = resp->extmem_attach->address;
		__atomic_add_fetch(&client->n_held, 1, __ATOMIC_RELEASE); /* mrd holds it for us now */
		fds.fds[fds.n++] = fcntl(fd, F_DUPFD_CLOEXEC, 3);
		if (fds.fds[fds.n - 1] < 0)
			r = set_last_error(-errno, "dup: %s", strerror(errno));
		else
			r = map_arena(client, resp->extmem_attach->arena, &fds);
		if (r >= 0)
			*ret = (void *)(uintptr_t)address;
		else {
			/* Memory we cannot reach is memory we must not keep. */
			char why[256];
			int k = r;

			snprintf(why, sizeof(why), "%s", mrd_last_error());
			(void)call_address(client, MRD__REQUEST__BODY_EXTMEM_DETACH, address);
			r = set_last_error(k, "%s", why);
		}
	}
	for (size_t i = 0; i < fds.n; i++)
		if (fds.fds[i] >= 0)
			close(fds.fds[i]);
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_extmem_detach(mrd_client *client, void *addr)
{
	if (!client)
		return set_last_error(-EINVAL, "mrd_extmem_detach: client is NULL");
	return call_address(client, MRD__REQUEST__BODY_EXTMEM_DETACH, (uintptr_t)addr);
}
