/* SPDX-License-Identifier: MIT */
/* Memory requests in-process: arenas and their memfds, ownership, quotas, domains, the status
 * page, and what a client's death releases. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "memory/arena.h"
#include "control/client.h"
#include "core/domain.h"
#include "control/manager.h"
#include "status-page.h"
#include "test-daemon.h"
#include "test-util.h"
#include "check-run.h"

#define MiB (1ull << 20)

static void start_with(const char *a, const char *b)
{
	/* A small window and arenas keep the bookkeeping small. */
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", a, b, NULL };

	td_start(settings);
}

static void setup(void) { start_with(NULL, NULL); }
static void teardown(void) { td_stop(); }

static void close_fds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
}

/* JoinDomain: returns the status page, mapped read-only. */
static const struct mrd_status_page *join(int fd, uint64_t id, Mrd__JoinDomainResponse *out)
{
	Mrd__Response *resp;
	int status_fd;
	void *page;

	resp = td_join(fd, id, 0, 0, &status_fd);
	ck_assert_uint_eq(resp->join_domain->window_size, 4ull << 30);
	if (out) {
		*out = *resp->join_domain;
		out->domain = strdup(resp->join_domain->domain);
	}
	/* Read-only for clients: a writable shared mapping is refused by the seal. */
	ck_assert_ptr_eq(mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
			      status_fd, 0), MAP_FAILED);
	page = mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ, MAP_SHARED, status_fd, 0);
	ck_assert_ptr_ne(page, MAP_FAILED);
	close(status_fd);
	mrd__response__free_unpacked(resp, NULL);
	return page;
}

/* Alloc; fills *info and says whether the arena's memfd came along (closed here). */
static int alloc(int fd, uint64_t id, uint64_t size, uint64_t align, int error, uint64_t *addr,
		 Mrd__ArenaInfo *info)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest a = MRD__ALLOC_REQUEST__INIT;
	Mrd__Response *resp;
	int fds[WIRE_FDS_MAX];
	size_t n = 0;

	a.size = size;
	a.align = align;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &a;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect_fds(fd, id, error, fds, &n);
	if (!error) {
		*addr = resp->alloc->address;
		ck_assert_uint_ge(resp->alloc->length, size);
		if (info)
			*info = *resp->alloc->arena;
		ck_assert_uint_eq(n, resp->alloc->arena->fd_attached ? 1 : 0);
	} else if (addr)
		*addr = (uint64_t)(uintptr_t)strdup(resp->message); /* for message checks */
	close_fds(fds, n);
	mrd__response__free_unpacked(resp, NULL);
	return (int)n;
}


static struct domain *domain_of(struct client *c) { return c->domain; }

START_TEST(test_alloc_in_window)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	const struct manager *m = td_manager;
	Mrd__ArenaInfo info;
	uint64_t a, b;

	join(fd, 2, NULL);
	ck_assert_int_eq(alloc(fd, 3, 10000, 0, 0, &a, &info), 1); /* first time: memfd */
	ck_assert_uint_ge(a, m->core.config.window_base);
	ck_assert_uint_lt(a, m->core.config.window_base + m->core.config.window_size);
	ck_assert_uint_eq(info.address, a); /* first run of a fresh arena */
	ck_assert_uint_eq(info.size, 64 * MiB);
	ck_assert(!info.hugetlb);
	ck_assert_int_eq(alloc(fd, 4, 4096, 1 * MiB, 0, &b, NULL), 0); /* same arena: no memfd */
	ck_assert_uint_eq(b % MiB, 0);
	ck_assert_uint_eq(domain_of(c)->mem.allocated_bytes, 12288 + 4096);
	ck_assert_uint_eq(c->owner.mem.allocated_bytes, 12288 + 4096);

	/* mrd's own mapping is the memory. */
	memset((void *)(uintptr_t)a, 0x5a, 10000);
	td_free(fd, 5, a, 0);
	ck_assert_int_eq(((uint8_t *)(uintptr_t)a)[0], 0); /* punched: back to the kernel */
	td_free(fd, 6, a, ENOENT);                        /* twice */
	td_free(fd, 7, b + 4096, ENOENT);                 /* not a start */
	td_free(fd, 8, 0x1234, ENOENT);
	td_free(fd, 9, b, 0);
	ck_assert_uint_eq(domain_of(c)->mem.allocated_bytes, 0);
	close(fd);
}
END_TEST

/* A punch skips the memfd's hole at the start of the run (SEEK_DATA) but still zeroes every
 * page of the run after it, and nothing beside it. */
START_TEST(test_punch_zeroes_runs_full_of_holes)
{
	const size_t page = 4096, run = 512 * 1024; /* under async_bytes: punched on the loop */
	uint64_t keep, a, again;
	uint8_t *p;
	int fd = td_hello_client(1000, NULL);

	join(fd, 2, NULL);
	alloc(fd, 3, page, 0, 0, &keep, NULL); /* the arena stays: no trim */
	alloc(fd, 4, run, 0, 0, &a, NULL);
	p = (uint8_t *)(uintptr_t)a;
	for (size_t off = 3 * page; off < run; off += 2 * page) /* a hole first, then 62 extents */
		p[off + 7] = 0x5a;
	p[run - 1] = 0x5a;
	p[-1] = 0x77; /* the pages on either side */
	p[run] = 0x77;
	td_free(fd, 5, a, 0);
	for (size_t off = 0; off < run; off += page)
		ck_assert_msg(p[off + 7] == 0 && p[off + page - 1] == 0, "page at %zu kept", off);
	ck_assert_uint_eq(p[-1], 0x77);
	ck_assert_uint_eq(p[run], 0x77);

	/* Written after its Free: the next Alloc of it punches, holes and all, too. */
	for (size_t off = 5 * page; off < run; off += 3 * page)
		p[off] = 0x5a;
	alloc(fd, 6, run, 0, 0, &again, NULL);
	ck_assert_uint_eq(again, a);
	for (size_t off = 0; off < run; off += page)
		ck_assert_msg(p[off] == 0, "page at %zu handed out dirty", off);
	ck_assert_uint_eq(p[-1], 0x77);
	ck_assert_uint_eq(p[run], 0x77);

	/* Nothing in the run at all, the next page written: that page stays. */
	td_free(fd, 7, again, 0);
	alloc(fd, 8, run, 0, 0, &again, NULL);
	ck_assert_uint_eq(again, a);
	ck_assert_uint_eq(p[-1], 0x77);
	ck_assert_uint_eq(p[run], 0x77);
	close(fd);
}
END_TEST

START_TEST(test_bad_alloc_requests)
{
	uint64_t msg;
	int fd = td_hello_client(1000, NULL);

	alloc(fd, 2, 0, 0, EINVAL, &msg, NULL);
	free((void *)(uintptr_t)msg);
	alloc(fd, 3, 4096, 3, EINVAL, &msg, NULL); /* align not a power of two */
	free((void *)(uintptr_t)msg);
	alloc(fd, 4, 4096, 1ull << 40, EINVAL, &msg, NULL); /* align beyond an arena */
	free((void *)(uintptr_t)msg);
	close(fd);
}
END_TEST

START_TEST(test_ownership_and_sharing)
{
	struct client *ca, *cb, *cx;
	int a = td_hello_client(1000, &ca), b = td_hello_client(1000, &cb);
	int x = td_hello_client(2000, &cx);
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MapRequest map = MRD__MAP_REQUEST__INIT;
	Mrd__Response *resp;
	int fds[WIRE_FDS_MAX];
	size_t n;
	uint64_t addr;

	alloc(a, 2, 8192, 0, 0, &addr, NULL);
	ck_assert_ptr_eq(domain_of(ca), domain_of(cb) ? domain_of(cb) : domain_of(ca));

	/* Same domain: B may map A's arena but not free A's memory. */
	map.address = addr + 100;
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_MAP;
	req.map = &map;
	td_send_request(b, &req, NULL, 0);
	resp = td_expect_fds(b, 3, 0, fds, &n);
	ck_assert_uint_eq(n, 1);
	ck_assert(resp->map->arena->fd_attached);
	ck_assert_uint_le(resp->map->arena->address, addr);
	{
		/* B's view of the memfd shows A's bytes. */
		uint8_t *view = mmap(NULL, resp->map->arena->size, PROT_READ, MAP_SHARED, fds[0], 0);

		ck_assert_ptr_ne(view, MAP_FAILED);
		((uint8_t *)(uintptr_t)addr)[7] = 0x42;
		ck_assert_int_eq(view[addr - resp->map->arena->address + 7], 0x42);
		munmap(view, resp->map->arena->size);
	}
	close_fds(fds, n);
	mrd__response__free_unpacked(resp, NULL);
	td_free(b, 4, addr, EPERM);
	ck_assert_ptr_eq(domain_of(ca), domain_of(cb));

	/* Another uid: another domain, which sees nothing of it. */
	td_send_request(x, &req, NULL, 0);
	td_expect_free(x, 3, ENOENT);
	td_free(x, 4, addr, ENOENT);
	ck_assert_ptr_ne(domain_of(cx), domain_of(ca));
	ck_assert_uint_eq(td_manager->core.n_domains, 2);

	td_free(a, 5, addr, 0);
	close(a);
	close(b);
	close(x);
}
END_TEST

START_TEST(test_quota_allocated_bytes)
{
	Mrd__ArenaInfo info;
	struct client *c;
	uint64_t a, msg;
	int fd;

	td_stop();
	start_with("quota.allocated_bytes=1M", NULL);
	fd = td_hello_client(1000, &c);
	alloc(fd, 2, 768 * 1024, 0, 0, &a, &info);
	alloc(fd, 3, 512 * 1024, 0, EDQUOT, &msg, NULL);
	ck_assert_msg(strcmp((char *)(uintptr_t)msg, "quota.allocated_bytes (1048576) would be exceeded in "
		      "domain uid-1000: 786432 in use, tried to allocate 524288 more; "
		      "raise [quota] allocated_bytes in mrd.conf and reload mrd") == 0, "%s", (char *)(uintptr_t)msg);
	free((void *)(uintptr_t)msg);
	/* Nothing half-done: usage is what it was. */
	ck_assert_uint_eq(domain_of(c)->mem.allocated_bytes, 768 * 1024);
	ck_assert_uint_eq(domain_of(c)->mem.allocations.n, 1);
	close(fd);
}
END_TEST

START_TEST(test_quota_allocations_and_arenas)
{
	uint64_t a[3], msg;
	int fd;

	td_stop();
	start_with("quota.allocations=2", "quota.arenas=1");
	fd = td_hello_client(1000, NULL);
	alloc(fd, 2, 4096, 0, 0, &a[0], NULL);
	alloc(fd, 3, 4096, 0, 0, &a[1], NULL);
	alloc(fd, 4, 4096, 0, EDQUOT, &msg, NULL);
	ck_assert_msg(strcmp((char *)(uintptr_t)msg, "quota.allocations (2) would be exceeded in domain "
		      "uid-1000: 2 in use, tried to add 1 more; raise [quota] "
		      "allocations in mrd.conf and reload mrd") == 0, "%s", (char *)(uintptr_t)msg);
	free((void *)(uintptr_t)msg);
	td_free(fd, 5, a[1], 0);
	/* One arena of 64 MiB: a 100 MiB request needs a second one. */
	alloc(fd, 6, 100 * MiB, 0, EDQUOT, &msg, NULL);
	ck_assert_msg(strcmp((char *)(uintptr_t)msg, "quota.arenas (1) would be exceeded in domain "
		      "uid-1000: 1 in use, tried to add 1 more; raise [quota] "
		      "arenas in mrd.conf and reload mrd") == 0, "%s", (char *)(uintptr_t)msg);
	free((void *)(uintptr_t)msg);
	close(fd);
}
END_TEST

START_TEST(test_quota_clients)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__JoinDomainRequest j = MRD__JOIN_DOMAIN_REQUEST__INIT;
	Mrd__Response *resp;
	int a, b;

	td_stop();
	start_with("quota.clients=1", NULL);
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1000, NULL);
	join(a, 2, NULL);
	req.id = 2;
	req.body_case = MRD__REQUEST__BODY_JOIN_DOMAIN;
	req.join_domain = &j;
	td_send_request(b, &req, NULL, 0);
	resp = td_expect(b, 2, EDQUOT);
	ck_assert_msg(strcmp(resp->message, "quota.clients (1) would be exceeded in domain uid-1000: 1 "
		      "in use, tried to add 1 more; raise [quota] clients in mrd.conf and reload mrd") == 0,
		      "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	close(a);
	close(b);
}
END_TEST

START_TEST(test_death_releases)
{
	const struct mrd_status_page *page;
	struct client *ca, *cb;
	int a = td_hello_client(1000, &ca), b = td_hello_client(1000, &cb);
	uint64_t x, y, frees;
	struct domain *d;

	page = join(b, 2, NULL);
	alloc(b, 3, 4096, 0, 0, &x, NULL);
	alloc(a, 2, 3 * MiB, 0, 0, &y, NULL);
	alloc(a, 3, 100 * MiB, 0, 0, &y, NULL); /* its own, bigger arena */
	d = domain_of(ca);
	ck_assert_uint_eq(page->allocations, 3);
	ck_assert_uint_eq(d->mem.n_arenas, 2);
	frees = page->frees;

	/* A dies without freeing: all of A's memory goes, B's stays, B sees it happen. */
	close(a);
	td_pump();
	ck_assert_uint_eq(d->mem.allocated_bytes, 4096);
	ck_assert_uint_eq(d->mem.allocations.n, 1);
	ck_assert_uint_eq(page->allocated_bytes, 4096);
	ck_assert_uint_eq(page->clients, 1);
	ck_assert_uint_eq(page->frees, frees + 2);
	ck_assert_uint_eq(d->mem.n_arenas, 1); /* the oversized arena went back; B's stays */
	td_free(b, 4, x, 0);
	ck_assert_uint_eq(page->allocated_bytes, 0);
	close(b);
	td_pump();
	ck_assert_uint_eq(td_manager->core.n_domains, 0);
}
END_TEST

START_TEST(test_generation_without_request)
{
	int a = td_hello_client(1000, NULL), b = td_hello_client(1000, NULL);
	const struct mrd_status_page *page = join(b, 2, NULL);
	uint64_t x, gen;

	ck_assert_uint_eq(page->magic, MRD_STATUS_MAGIC);
	ck_assert_uint_eq(page->layout_version, MRD_STATUS_LAYOUT);
	/* Before the page's first generation nothing can be told: its record is all of memory. */
	gen = page->generation;
	ck_assert_uint_eq(page->freed[gen % MRD_STATUS_FREED].generation, gen);
	ck_assert_uint_eq(page->freed[gen % MRD_STATUS_FREED].start, 0);
	ck_assert_uint_eq(page->freed[gen % MRD_STATUS_FREED].end, UINT64_MAX);
	alloc(a, 2, 4096, 0, 0, &x, NULL);
	td_lookup(a, 3, x, 0, NULL); /* a free of memory never registered bumps nothing */
	gen = __atomic_load_n(&page->generation, __ATOMIC_ACQUIRE);
	td_free(a, 4, x, 0);
	/* B made no request: one load shows the bump, and its record what went. */
	ck_assert_uint_eq(__atomic_load_n(&page->generation, __ATOMIC_ACQUIRE), gen + 1);
	ck_assert_uint_eq(page->freed[(gen + 1) % MRD_STATUS_FREED].generation, gen + 1);
	ck_assert_uint_eq(page->freed[(gen + 1) % MRD_STATUS_FREED].start, x);
	ck_assert_uint_eq(page->freed[(gen + 1) % MRD_STATUS_FREED].end, x + 4096);
	close(a);
	close(b);
}
END_TEST

START_TEST(test_extmem)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), p[2];
	int sealed = memfd_create("ext", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int loose = memfd_create("loose", MFD_CLOEXEC);
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExtmemDetachRequest det = MRD__EXTMEM_DETACH_REQUEST__INIT;
	Mrd__Response *resp;
	uint8_t *mine;
	uint64_t addr;

	ck_assert_int_eq(ftruncate(sealed, 8 * 4096), 0);
	ck_assert_int_eq(fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(ftruncate(loose, 8 * 4096), 0);
	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);

	mrd__response__free_unpacked(td_attach(fd, 2, loose, 0, 4096, EPERM), NULL);
	mrd__response__free_unpacked(td_attach(fd, 3, p[0], 0, 4096, EBADF), NULL);
	mrd__response__free_unpacked(td_attach(fd, 4, sealed, 100, 4096, EINVAL), NULL);
	mrd__response__free_unpacked(td_attach(fd, 5, sealed, 4096, 8 * 4096, EINVAL), NULL);

	resp = td_attach(fd, 6, sealed, 4096, 4 * 4096, 0);
	addr = resp->extmem_attach->address;
	ck_assert(!resp->extmem_attach->arena->fd_attached); /* the client has it */
	ck_assert_uint_eq(resp->extmem_attach->arena->file_offset, 4096);
	mrd__response__free_unpacked(resp, NULL);
	/* mrd's view at addr is the file from offset 4096 on. */
	mine = mmap(NULL, 8 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, sealed, 0);
	mine[4096 + 3] = 0x33;
	ck_assert_int_eq(((uint8_t *)(uintptr_t)addr)[3], 0x33);
	ck_assert_uint_eq(c->owner.mem.allocated_bytes, 4 * 4096);

	td_free(fd, 7, addr, EINVAL); /* attached memory is detached, not freed */
	det.address = addr;
	req.id = 8;
	req.body_case = MRD__REQUEST__BODY_EXTMEM_DETACH;
	req.extmem_detach = &det;
	td_send_request(fd, &req, NULL, 0);
	td_expect_free(fd, 8, 0);
	ck_assert_uint_eq(c->owner.mem.allocated_bytes, 0);
	ck_assert_int_eq(mine[4096 + 3], 0x33); /* detaching never touches the client's data */
	munmap(mine, 8 * 4096);
	close(sealed);
	close(loose);
	close(p[0]);
	close(p[1]);
	close(fd);
}
END_TEST

/* A client that asks for descriptors and never reads them holds only a few hostage; the
 * others wait in mrd, and nobody else notices. */
static unsigned window_slots_used(void)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < td_manager->core.window.n_slots; i++)
		n += td_manager->core.window.used[i];
	return n;
}

static void free_msg(uint64_t msg) { free((void *)(uintptr_t)msg); }

/* Each memory quota at its exact boundary, allocations and attached memory alike: the last
 * byte, page, allocation or arena allowed is granted, the next refused, and a refusal leaves
 * nothing behind (usage, arenas, window slots, descriptors). */
START_TEST(test_quota_boundaries)
{
	int memfd = memfd_create("ext", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	unsigned fds, slots;
	struct client *c;
	uint64_t a, b, msg;
	int fd;

	td_stop();
	start_with("quota.allocated_bytes=1M", "quota.arenas=2");
	fd = td_hello_client(1000, &c);
	ck_assert_int_eq(ftruncate(memfd, 8 * 4096), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);

	alloc(fd, 2, 1 * MiB, 0, 0, &a, NULL); /* exactly the quota */
	fds = count_open_fds(0);
	ck_assert_uint_gt(fds, 0);
	slots = window_slots_used();
	alloc(fd, 3, 4096, 0, EDQUOT, &msg, NULL); /* one page more */
	free_msg(msg);
	mrd__response__free_unpacked(td_attach(fd, 4, memfd, 0, 4096, EDQUOT), NULL);
	ck_assert_uint_eq(domain_of(c)->mem.allocated_bytes, 1 * MiB);
	ck_assert_uint_eq(domain_of(c)->mem.allocations.n, 1);
	ck_assert_uint_eq(domain_of(c)->mem.n_arenas, 1);
	ck_assert_uint_eq(window_slots_used(), slots);
	/* The refused memfd went back (closed on a closer thread, a moment later), no arena was
	 * made. */
	test_wait_until(count_open_fds(0) <= fds, 1000);
	ck_assert_uint_eq(count_open_fds(0), fds);

	/* Freed, the whole quota is there again; attached memory counts in it. */
	td_free(fd, 5, a, 0);
	mrd__response__free_unpacked(td_attach(fd, 6, memfd, 0, 4096, 0), NULL);
	alloc(fd, 7, 1 * MiB - 4096, 0, 0, &b, NULL);
	ck_assert_uint_eq(domain_of(c)->mem.allocated_bytes, 1 * MiB);
	ck_assert_uint_eq(domain_of(c)->mem.n_arenas, 2); /* the attached one, and one of pages */
	alloc(fd, 8, 4096, 0, EDQUOT, &msg, NULL);
	free_msg(msg);
	td_free(fd, 9, b, 0);
	/* quota.arenas (2) is reached: new memory fits the arena there is, an attach does not. */
	alloc(fd, 10, 4096, 0, 0, &b, NULL);
	mrd__response__free_unpacked(td_attach(fd, 11, memfd, 4096, 4096, EDQUOT), NULL);
	ck_assert_uint_eq(domain_of(c)->mem.n_arenas, 2);
	close(fd);
	td_wait_domains_closed();
	ck_assert_uint_eq(window_slots_used(), 0);
	close(memfd);
}
END_TEST

/* quota.window_bytes: a domain's arenas take at most its share of the window (by default an
 * eighth: 8 of the 64 slots here), however little memory is in them, so others always fit. */
START_TEST(test_quota_window_bytes)
{
	int memfd = memfd_create("ext", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int fd = td_hello_client(1000, NULL), other = td_hello_client(2000, NULL);
	Mrd__Response *resp;
	uint64_t a, msg;

	ck_assert_int_eq(ftruncate(memfd, 16 * 4096), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	/* A page each, a 64 MiB slot each. */
	for (int i = 0; i < 8; i++)
		mrd__response__free_unpacked(td_attach(fd, 2 + (uint64_t)i, memfd,
						       (uint64_t)i * 4096, 4096, 0), NULL);
	ck_assert_uint_eq(window_slots_used(), 8);
	resp = td_attach(fd, 10, memfd, 8 * 4096, 4096, EDQUOT);
	/* An arena takes whole 64 MiB slots, however small. */
	ck_assert_msg(strcmp(resp->message, "quota.window_bytes (536870912) would be exceeded in "
		      "domain uid-1000: 536870912 in use, tried to map 67108864 more; "
		      "raise [quota] window_bytes in mrd.conf and reload mrd") == 0, "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	alloc(fd, 11, 4096, 0, EDQUOT, &msg, NULL); /* a new arena of pages, too */
	ck_assert_ptr_nonnull(strstr((char *)(uintptr_t)msg, "quota.window_bytes"));
	free_msg(msg);
	ck_assert_uint_eq(window_slots_used(), 8);
	/* Another domain has the rest. */
	alloc(other, 2, 100 * MiB, 0, 0, &a, NULL);
	ck_assert_uint_eq(window_slots_used(), 10); /* 128 MiB: two slots */
	close(fd);
	close(other);
	td_wait_domains_closed();
	ck_assert_uint_eq(window_slots_used(), 0);
	close(memfd);
}
END_TEST

START_TEST(test_unread_descriptors_bounded)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MapRequest map = MRD__MAP_REQUEST__INIT;
	struct client *c;
	int greedy = td_hello_client(1000, &c), other = td_hello_client(2000, NULL);
	const int n = 60;
	uint64_t addr, y;

	alloc(greedy, 2, 4096, 0, 0, &addr, NULL);
	fcntl(greedy, F_SETFL, O_NONBLOCK);
	map.address = addr;
	req.body_case = MRD__REQUEST__BODY_MAP;
	req.map = &map;
	for (int i = 0; i < n; i++) {
		req.id = 100 + (uint64_t)i;
		td_send_request(greedy, &req, NULL, 0);
		td_pump();
		ck_assert_uint_le(c->fds_in_flight, 16);
	}
	ck_assert(!c->reading);
	alloc(other, 2, 4096, 0, 0, &y, NULL); /* served meanwhile */

	for (int i = 0; i < n; i++) {
		int fds[WIRE_FDS_MAX];
		size_t nf;
		Mrd__Response *resp = td_expect_fds(greedy, 100 + (uint64_t)i, 0, fds, &nf);

		ck_assert_uint_eq(nf, 1); /* every reply, in order, with its memfd */
		close_fds(fds, nf);
		mrd__response__free_unpacked(resp, NULL);
	}
	ck_assert_uint_eq(c->n_out, 0);
	close(greedy);
	close(other);
}
END_TEST

START_TEST(test_domain_groups)
{
	struct client *a, *b, *c;
	int fa, fb, fc;

	td_stop();
	start_with("domains.lab=uid:1000 uid:1001", NULL);
	fa = td_hello_client(1000, &a);
	fb = td_hello_client(1001, &b);
	fc = td_hello_client(1002, &c);
	ck_assert_str_eq(a->domain_name, "lab");
	ck_assert_str_eq(b->domain_name, "lab");
	ck_assert_str_eq(c->domain_name, "uid-1002");
	join(fa, 2, NULL);
	join(fb, 2, NULL);
	ck_assert_ptr_eq(a->domain, b->domain);
	close(fa);
	close(fb);
	close(fc);
}
END_TEST

/* A reload (SIGHUP) with the settings of start_with plus a and b. */
static void reload_with(const char *a, const char *b)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", a, b, NULL };
	struct config cfg;
	char changed[512];

	config_init(&cfg);
	for (size_t i = 0; settings[i]; i++)
		ck_assert_int_eq(config_set_assignment(&cfg, settings[i]), 0);
	ck_assert_int_eq(config_finish(&cfg), 0);
	manager_reconfigure(td_manager, &cfg, changed, sizeof(changed));
	config_done(&cfg);
}

/* The quota of the domain named name, as mrctl clients (root's view) shows it. */
static uint64_t listed_allocated_quota(int root, uint64_t id, const char *name)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ClientsRequest cl = MRD__CLIENTS_REQUEST__INIT;
	Mrd__Response *resp;
	uint64_t quota = 0;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_CLIENTS;
	req.clients = &cl;
	td_send_request(root, &req, NULL, 0);
	resp = td_expect(root, id, 0);
	for (size_t i = 0; i < resp->clients->n_domains; i++)
		if (strcmp(resp->clients->domains[i]->name, name) == 0)
			quota = resp->clients->domains[i]->quota_allocated_bytes;
	mrd__response__free_unpacked(resp, NULL);
	return quota;
}

/* [quotas]: the domain a line matches (here a [domains] group) is held to the line's
 * allocated_bytes and told to raise it there; a domain no line matches keeps [quota]'s and
 * allocates the same size; a reload changing the line applies to the open domain, and one
 * dropping it gives the domain [quota]'s again. */
START_TEST(test_quotas_per_domain)
{
	int lab, other, root;
	uint64_t a, b, msg;

	td_stop();
	start_with("domains.lab=uid:1000", "quotas.la*=allocated_bytes=1M");
	lab = td_hello_client(1000, NULL);
	other = td_hello_client(2000, NULL);
	root = td_hello_client(0, NULL);
	alloc(lab, 2, 2 * MiB, 0, EDQUOT, &msg, NULL);
	ck_assert_msg(strcmp((char *)(uintptr_t)msg, "quota.allocated_bytes (1048576) would be "
		      "exceeded in domain lab: 0 in use, tried to allocate 2097152 more; raise "
		      "[quotas] la* allocated_bytes and reload mrd") == 0, "%s",
		      (char *)(uintptr_t)msg);
	free_msg(msg);
	alloc(other, 2, 2 * MiB, 0, 0, &b, NULL);
	ck_assert_uint_eq(listed_allocated_quota(root, 2, "lab"), 1 * MiB);
	ck_assert_uint_eq(listed_allocated_quota(root, 3, "uid-2000"),
			  td_manager->core.config.quota.allocated_bytes);

	reload_with("domains.lab=uid:1000", "quotas.la*=allocated_bytes=4M");
	alloc(lab, 3, 2 * MiB, 0, 0, &a, NULL);
	ck_assert_uint_eq(listed_allocated_quota(root, 4, "lab"), 4 * MiB);

	reload_with("domains.lab=uid:1000", "quota.allocated_bytes=3M");
	alloc(lab, 4, 2 * MiB, 0, EDQUOT, &msg, NULL);
	ck_assert_msg(strstr((char *)(uintptr_t)msg, "; raise [quota] allocated_bytes in mrd.conf"),
		      "%s", (char *)(uintptr_t)msg);
	free_msg(msg);
	close(lab);
	close(other);
	close(root);
}
END_TEST

START_TEST(test_clients_listing)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ClientsRequest cl = MRD__CLIENTS_REQUEST__INIT;
	Mrd__Response *resp;
	int user = td_hello_client(1000, NULL), root = td_hello_client(0, NULL);
	uint64_t x;

	alloc(user, 2, 5 * 4096, 0, 0, &x, NULL);
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_CLIENTS;
	req.clients = &cl;
	/* A user sees its own domain: itself, not root (which joined none). */
	td_send_request(user, &req, NULL, 0);
	resp = td_expect(user, 3, 0);
	ck_assert_uint_eq(resp->clients->n_clients, 1);
	ck_assert_uint_eq(resp->clients->clients[0]->uid, 1000);
	ck_assert_uint_eq(resp->clients->n_domains, 1);
	ck_assert_str_eq(resp->clients->domains[0]->name, "uid-1000");
	mrd__response__free_unpacked(resp, NULL);
	td_send_request(root, &req, NULL, 0);
	resp = td_expect(root, 3, 0);
	ck_assert_uint_eq(resp->clients->n_clients, 2);
	ck_assert_uint_eq(resp->clients->n_domains, 1);
	for (size_t i = 0; i < resp->clients->n_clients; i++) {
		const Mrd__ClientInfo *ci = resp->clients->clients[i];

		if (ci->uid == 1000) {
			ck_assert_str_eq(ci->domain, "uid-1000");
			ck_assert_uint_eq(ci->allocated_bytes, 5 * 4096);
			ck_assert_uint_eq(ci->allocations, 1);
		} else
			ck_assert_str_eq(ci->domain, ""); /* root never joined */
	}
	ck_assert_str_eq(resp->clients->domains[0]->name, "uid-1000");
	ck_assert_uint_eq(resp->clients->domains[0]->quota_allocations, 65536);
	mrd__response__free_unpacked(resp, NULL);
	close(user);
	close(root);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("memory");
	TCase *tc = tcase_create("requests");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_alloc_in_window);
	tcase_add_test(tc, test_punch_zeroes_runs_full_of_holes);
	tcase_add_test(tc, test_bad_alloc_requests);
	tcase_add_test(tc, test_ownership_and_sharing);
	tcase_add_test(tc, test_quota_allocated_bytes);
	tcase_add_test(tc, test_quota_allocations_and_arenas);
	tcase_add_test(tc, test_quota_clients);
	tcase_add_test(tc, test_quota_window_bytes);
	tcase_add_test(tc, test_death_releases);
	tcase_add_test(tc, test_generation_without_request);
	tcase_add_test(tc, test_extmem);
	tcase_add_test(tc, test_quota_boundaries);
	tcase_add_test(tc, test_unread_descriptors_bounded);
	tcase_add_test(tc, test_domain_groups);
	tcase_add_test(tc, test_clients_listing);
	tcase_add_test(tc, test_quotas_per_domain);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
