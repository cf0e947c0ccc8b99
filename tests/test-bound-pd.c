/* SPDX-License-Identifier: MIT */
/* A client's own PD bound to mrd (registration/bound-pd.h), in-process: the client's lookups
 * get keys of MRs in that PD, not the domain's; the domain's policy, quota and pinned union
 * hold for them; a free deregisters them before its pages go back; the client's end
 * deregisters the rest and closes the PD's context, also while a worker registers for it. The
 * "client's context" here is a second soft provider, whose DMA checks the keys; BindPd's
 * checks of a real uverbs fd are in test-client-context and, on rxe, test-client-pd and the
 * VM test. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "control/client.h"
#include "control/handover.h"
#include "control/manager.h"
#include "core/domain.h"
#include "provider/provider.h"
#include "registration/bound-pd.h"
#include "registration/reg-base.h"
#include "check-run.h"
#include "raw-client.h"
#include "test-daemon.h"
#include "test-util.h"

#define MiB (1ull << 20)

static void setup(void) { td_start_small(NULL); }
static void teardown(void) { td_stop(); }

/* The bound PD's provider, counted closed: the context mrd held is let go exactly once. */
static unsigned closed;
static struct provider_ops counted_ops;

static void counted_close(struct provider *p)
{
	closed++;
	provider_soft_ops.close(p);
}

/* Runs the loop until the bound PD's provider closed. */
static void pump_until_closed(void)
{
	td_pump_until(closed != 0);
	ck_assert_msg(closed == 1, "the bound PD's context was closed %u times", closed);
}

/* Binds c (joined) to a PD of a soft provider of its own; returns that provider. */
static struct provider *bind_soft(struct client *c)
{
	struct provider *p;
	struct provider_pd *pd;

	counted_ops = provider_soft_ops;
	counted_ops.close = counted_close;
	closed = 0;
	ck_assert_ptr_nonnull(c->domain);
	ck_assert_int_eq(provider_soft_ops.open(NULL, &p), 0);
	p->ops = &counted_ops;
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	ck_assert_int_eq(bound_pd_adopt(&c->domain->reg.cache, p, pd, "soft", 7, getpid(),
					&c->bound), 0);
	return p;
}


/* A dereg the bound PD refuses (the kernel's EBUSY while the client holds the MR's
 * uobject, or any driver error): counted, and the MRs still live when the context closes. */
static unsigned fail_deregs, live_at_close;

/* Workers call it: the count is atomic. */
static int failing_dereg(struct provider_mr *mr)
{
	unsigned n = __atomic_load_n(&fail_deregs, __ATOMIC_ACQUIRE);

	while (n > 0)
		if (__atomic_compare_exchange_n(&fail_deregs, &n, n - 1, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			return -EBUSY;
	return provider_soft_ops.dereg(mr);
}

static unsigned fails_left(void)
{
	return __atomic_load_n(&fail_deregs, __ATOMIC_ACQUIRE);
}

static void counting_close(struct provider *p)
{
	struct provider_stats ps;

	p->ops->stats(p, &ps);
	live_at_close = (unsigned)ps.mrs;
	counted_close(p);
}

static struct provider *bind_failing(struct client *c)
{
	struct provider *p = bind_soft(c);

	counted_ops.dereg = failing_dereg;
	counted_ops.close = counting_close;
	live_at_close = 0;
	return p;
}

/* A registration that pins for long (a GiB takes seconds), under the provider's lock
 * as PROVIDER_LIVE holds it: held until the test clears slow_reg_held (TEST_WAIT_S at most). */
static int slow_reg_held;
static int in_slow_reg;

static int slow_reg(struct provider_pd *pd, void *addr, size_t length, uint64_t iova,
		    unsigned access, struct provider_mr **ret)
{
	if (__atomic_load_n(&slow_reg_held, __ATOMIC_ACQUIRE) && length >= MiB) {
		__atomic_store_n(&in_slow_reg, 1, __ATOMIC_RELEASE);
		test_wait_until(!__atomic_load_n(&slow_reg_held, __ATOMIC_ACQUIRE), 1000);
	}
	return provider_soft_ops.reg(pd, addr, length, iova, access, ret);
}

/* What a loop that did not wait for the held registration may take for one td_pump: far
 * below TEST_WAIT_S, which one that waited takes; far above a loaded machine's stall. */
#define NOT_WAITED_S 5.0

/* The test's clients go (-1: none), every domain closes, and the bound PD's context with it. */
static void finish(int fd, int ofd)
{
	if (ofd >= 0)
		close(ofd);
	close(fd);
	td_wait_domains_closed();
	ck_assert_uint_eq(closed, 1);
}

static bool readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) > 0;
}

/* Lookup id of addr, whose registration (slow_reg) a worker holds, begun. */
static void start_slow_registration(int fd, uint64_t id, uint64_t addr)
{
	__atomic_store_n(&slow_reg_held, 1, __ATOMIC_RELEASE);
	in_slow_reg = 0;
	td_send_lookup(fd, id, addr);
	td_pump_until(__atomic_load_n(&in_slow_reg, __ATOMIC_ACQUIRE));
	ck_assert(in_slow_reg);
}

static uint64_t pinned(const struct client *c)
{
	return c->domain->reg.cache.charges.pinned_bytes;
}

static uint64_t mrs_of(struct provider *p)
{
	struct provider_stats ps;

	provider_stats(p, &ps);
	return ps.mrs;
}

START_TEST(test_keys_are_of_the_bound_pd)
{
	struct client *c, *other;
	int fd = td_hello_client(1000, &c), ofd = td_hello_client(1000, &other);
	uint64_t a = td_alloc(fd, 2, 3 * MiB), b = td_alloc(fd, 3, 1 * MiB);
	Mrd__MrEntry ea, eb, ed;
	struct provider *p = bind_soft(c);
	struct bound_pd *bound = c->bound;

	td_lookup(fd, 4, a + 5, 0, &ea);
	td_lookup(fd, 5, b + 4096, 0, &eb);
	/* The domain's policy (contig): the whole allocation, once, in the bound PD alone. */
	ck_assert_uint_eq(ea.start, a);
	ck_assert_uint_eq(ea.end, a + 3 * MiB);
	ck_assert_uint_eq(eb.start, b);
	ck_assert_uint_eq(mrs_of(p), 2);
	ck_assert_uint_eq(bound->cache.n_mrs, 2);
	ck_assert_uint_eq(c->domain->reg.cache.n_mrs, 0);
	ck_assert_uint_eq(pinned(c), 4 * MiB);

	/* The keys move bytes in the bound PD, exactly as far as they reach. */
	memcpy((void *)(uintptr_t)(a + 100), "through the bound keys", 23);
	ck_assert_int_eq(provider_dma(bound->pd, PROVIDER_DMA_WRITE, ea.lkey, a + 100, eb.rkey,
				      b + 4000, 23), 0);
	ck_assert_str_eq((char *)(uintptr_t)(b + 4000), "through the bound keys");
	ck_assert_int_lt(provider_dma(bound->pd, PROVIDER_DMA_WRITE, ea.lkey, a, eb.rkey,
				      b + MiB - 8, 23), 0);

	/* Another client of the domain gets the domain's PD's keys for the same memory; its pages
	 * are pinned once, whichever PD's MRs cover them. */
	td_lookup(ofd, 6, a + 5, 0, &ed);
	ck_assert_uint_eq(c->domain->reg.cache.n_mrs, 1);
	ck_assert_uint_eq(pinned(c), 4 * MiB);
	/* A bound key is nothing in the domain's PD. */
	ck_assert_int_lt(provider_dma(c->domain->reg.base.pd, PROVIDER_DMA_WRITE, ed.lkey, a,
				      eb.rkey, b, 8), 0);
	finish(fd, ofd);
}
END_TEST

/* WindowGrant for the client's own QP (the client-PD model, client_pd): the answer of one. */
static Mrd__Response *window_mr(int fd, uint64_t id, uint64_t addr, uint64_t len, int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowGrantRequest q = MRD__WINDOW_GRANT_REQUEST__INIT;

	q.address = addr;
	q.length = len;
	q.access = 2; /* remote write */
	q.client_pd = true;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_WINDOW_GRANT;
	req.window_grant = &q;
	td_send_request(fd, &req, NULL, 0);
	return td_expect(fd, id, error);
}

/* The client-PD model's request: mrd binds nothing and counts nothing; it answers the bound
 * PD's MR over the range (made on a miss), which takes windows (MW_BIND), and the allocation
 * holding it (what libmrd kills the windows of before it frees); with the domain model's
 * checks: the caller's own memory, inside one allocation, and a bound PD. */
START_TEST(test_window_mr_is_the_bound_pds)
{
	struct client *c, *stranger;
	int fd = td_hello_client(1000, &c), sfd = td_hello_client_of(getpid() + 1, 1000, &stranger);
	uint64_t a = td_alloc(fd, 2, 3 * MiB), b = td_alloc(fd, 3, 1 * MiB), s;
	struct provider_mw *mw;
	struct cached_mr *m;
	Mrd__Response *resp;
	Mrd__MrEntry eb;
	uint32_t rkey;

	resp = window_mr(fd, 4, a, 4096, ENXIO);
	ck_assert_ptr_nonnull(strstr(resp->message, "mrd_client_bind_pd"));
	mrd__response__free_unpacked(resp, NULL);
	bind_soft(c);

	resp = window_mr(fd, 5, a + 8192, 4096, 0);
	ck_assert_uint_eq(resp->window_grant->rkey, 0); /* no window of mrd's */
	ck_assert_ptr_nonnull(resp->window_grant->mr);
	ck_assert_uint_eq(resp->window_grant->mr->start, a);
	ck_assert_uint_eq(resp->window_grant->mr->end, a + 3 * MiB);
	ck_assert_uint_eq(resp->window_grant->allocation_start, a);
	ck_assert_uint_eq(resp->window_grant->allocation_end, a + 3 * MiB);
	m = u64_map_get(&c->bound->cache.by_lkey, (uint64_t)resp->window_grant->mr->lkey + 1);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_ptr_nonnull(m); /* the bound PD's MR, not the domain's */
	ck_assert_uint_eq(c->domain->reg.cache.n_mrs, 0);
	ck_assert_uint_eq(mw_grants_live(&c->domain->reg.windows), 0);

	/* The client binds over it in its PD; the window moves exactly its bytes. */
	ck_assert_int_eq(provider_mw_alloc(c->bound->pd, &mw), 0);
	ck_assert_int_eq(provider_mw_bind(mw, m->pmr, a + 8192, 4096, MRD_ACCESS_REMOTE_WRITE,
					  &rkey), 0);
	td_lookup(fd, 6, b, 0, &eb);
	memcpy((void *)(uintptr_t)b, "through the client's window", 28);
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, eb.lkey, b, rkey, a + 8192,
				      28), 0);
	ck_assert_str_eq((char *)(uintptr_t)(a + 8192), "through the client's window");
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, eb.lkey, b, rkey,
				      a + 8191, 28), 0);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);

	/* The domain model's checks. */
	resp = window_mr(fd, 7, a + 3 * MiB - 4096, 8192, ERANGE);
	mrd__response__free_unpacked(resp, NULL);
	resp = window_mr(fd, 8, 4096, 4096, ENOENT);
	mrd__response__free_unpacked(resp, NULL);
	s = td_alloc(sfd, 9, 1 * MiB);
	resp = window_mr(fd, 10, s, 4096, EACCES);
	ck_assert_ptr_nonnull(strstr(resp->message, "only it grants"));
	mrd__response__free_unpacked(resp, NULL);
	finish(fd, sfd);
}
END_TEST

/* Another handle of the same process: libmrd kills a handle's windows at its own frees, so a
 * bound handle grants over the memory it allocated alone (the review's case). */
START_TEST(test_window_mr_refuses_another_handles_memory)
{
	struct client *c, *c2;
	int fd = td_hello_client(1000, &c), fd2 = td_hello_client(1000, &c2);
	uint64_t a2 = td_alloc(fd2, 2, 1 * MiB);
	Mrd__Response *resp;

	ck_assert_int_eq(c->owner.mem.pid, c2->owner.mem.pid);
	(void)td_alloc(fd, 4, 4096); /* joins the domain */
	bind_soft(c);
	resp = window_mr(fd, 3, a2, 4096, EPERM);
	ck_assert_ptr_nonnull(strstr(resp->message, "another handle"));
	mrd__response__free_unpacked(resp, NULL);
	finish(fd, fd2);
}
END_TEST

/* [windows] remote = window-only holds for a client PD's pinned MRs too: their own rkey
 * reaches nothing remote, a window the client binds over them does. */
START_TEST(test_window_only_in_the_bound_pd)
{
	struct client *c;
	int fd;
	uint64_t a, b;
	struct provider_mw *mw;
	struct cached_mr *m;
	Mrd__MrEntry ea, eb;
	uint32_t rkey;

	td_stop();
	td_start_small("windows.remote=window-only");
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 1 * MiB);
	b = td_alloc(fd, 3, 1 * MiB);
	bind_soft(c);
	td_lookup(fd, 4, a, 0, &ea);
	td_lookup(fd, 5, b, 0, &eb);
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, ea.lkey, a, eb.rkey, b, 8),
			 0);
	m = u64_map_get(&c->bound->cache.by_lkey, (uint64_t)eb.lkey + 1);
	ck_assert_ptr_nonnull(m);
	ck_assert_int_eq(provider_mw_alloc(c->bound->pd, &mw), 0);
	ck_assert_int_eq(provider_mw_bind(mw, m->pmr, b, 4096, MRD_ACCESS_REMOTE_WRITE, &rkey), 0);
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, ea.lkey, a, rkey, b, 8), 0);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	finish(fd, -1);
}
END_TEST

/* The MR over a program's buffer (libmrd-preload.so's aliased memory) takes windows, which
 * the shim binds as the program's rkeys (preload/window-binder.h); with window-only too, its
 * own rkey keeps the rights the program asked: the shim hands it out where it binds no window
 * (no type-1 windows, MRD_PRELOAD_WINDOWS off). _i 1: window-only. */
START_TEST(test_alias_mr_takes_windows)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c, *mem;
	int fd, mfd;
	Mrd__Response *resp;
	Mrd__MrEntry e;
	struct provider_mw *mw;
	struct cached_mr *m;
	uint64_t w;
	uint32_t rkey;

	if (_i) {
		td_stop();
		td_start_small("windows.remote=window-only");
	}
	fd = td_hello_client(1000, &c);
	mfd = td_hello_client(1000, &mem);
	resp = td_alloc_alias(mfd, 2, 64 * 1024, 0, alias, RW, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	td_alloc(fd, 3, 4096); /* joins */
	bind_soft(c);
	td_lookup(fd, 4, w, 0, &e);
	strcpy((char *)(uintptr_t)(w + 100), "through the MR");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, alias + 100, e.rkey,
				      alias + 200, 15), 0);
	m = u64_map_get(&c->bound->cache.by_lkey, (uint64_t)e.lkey + 1);
	ck_assert_ptr_nonnull(m);
	ck_assert_int_eq(provider_mw_alloc(c->bound->pd, &mw), 0);
	ck_assert_int_eq(provider_mw_bind(mw, m->pmr, alias + 4096, 4096, MRD_ACCESS_REMOTE_WRITE,
					  &rkey), 0);
	strcpy((char *)(uintptr_t)(w + 300), "through the window");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, alias + 300, rkey,
				      alias + 4096, 19), 0);
	ck_assert_str_eq((char *)(uintptr_t)(w + 4096), "through the window");
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	finish(fd, mfd);
}
END_TEST

/* The domain's MRs and its mempools' are another PD's: they neither cut the bound PD's runs
 * nor answer its lookups. */
START_TEST(test_domain_mrs_are_not_the_pds)
{
	struct client *c, *other;
	int ofd = td_hello_client(1000, &other), fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(ofd, 2, 2 * MiB), b = td_alloc(ofd, 3, 1 * MiB);
	uint64_t starts[1] = { b + 64 * 1024 }, lengths[1] = { 64 * 1024 };
	Mrd__MrEntry ed, eb, ep;
	struct provider *p;

	td_lookup(ofd, 4, a + MiB, 0, &ed); /* the domain's MR over a, whole */
	td_send_mempool_register(ofd, 5, "pool", starts, lengths, 1, false);
	mrd__response__free_unpacked(td_expect(ofd, 5, 0), NULL);
	td_lookup(ofd, 6, b + 64 * 1024, 0, &ep); /* the pool's MR */
	ck_assert_uint_eq(ep.end - ep.start, 64 * 1024);
	td_lookup(ofd, 11, b, 0, &ed); /* the domain's run beside the pool's MR */
	ck_assert_uint_eq(ed.end, b + 64 * 1024);
	td_alloc(fd, 10, 4096); /* joins its domain */
	p = bind_soft(c);
	td_lookup(fd, 7, a + MiB, 0, &eb);
	ck_assert_uint_eq(eb.start, a);
	ck_assert_uint_eq(eb.end, a + 2 * MiB);
	td_lookup(fd, 8, b + 64 * 1024, 0, &eb);
	ck_assert_uint_eq(eb.start, b); /* the whole allocation, in the bound PD */
	ck_assert_uint_eq(eb.end, b + MiB);
	ck_assert_uint_eq(mrs_of(p), 2);
	/* The bound keys reach their bytes in the bound PD alone. */
	strcpy((char *)(uintptr_t)(a + 8), "bound");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, eb.lkey, a + 8, eb.rkey,
				      b + 100, 6), -EFAULT); /* eb's lkey does not cover a */
	td_lookup(fd, 9, a, 0, &ed);
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, ed.lkey, a + 8, eb.rkey,
				      b + 100, 6), 0);
	ck_assert_str_eq((char *)(uintptr_t)(b + 100), "bound");
	finish(fd, ofd);
}
END_TEST

START_TEST(test_free_deregisters_before_the_pages_go)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 512 * 1024), b = td_alloc(fd, 3, 512 * 1024), gen;
	Mrd__MrEntry ea, eb;
	struct provider *p = bind_soft(c);
	struct bound_pd *bound = c->bound;

	td_lookup(fd, 4, a, 0, &ea);
	td_lookup(fd, 5, b, 0, &eb);
	gen = c->domain->mem.status.page->generation;
	td_free(fd, 6, a, 0);
	/* Answered: the bound MR is gone, its key refused, its pages uncharged. */
	ck_assert_uint_eq(mrs_of(p), 1);
	ck_assert_uint_eq(bound->cache.n_mrs, 1);
	ck_assert_uint_eq(bound->cache.deregistrations, 1);
	ck_assert_uint_eq(pinned(c), 512 * 1024);
	ck_assert_uint_gt(c->domain->mem.status.page->generation, gen);
	ck_assert_int_lt(provider_dma(bound->pd, PROVIDER_DMA_WRITE, eb.lkey, b, ea.rkey, a, 8), 0);
	/* The same address, allocated again, gets a new MR. */
	ck_assert_uint_eq(td_alloc(fd, 7, 512 * 1024), a);
	td_lookup(fd, 8, a, 0, &eb);
	ck_assert_uint_ne(eb.rkey, ea.rkey);
	finish(fd, -1);
}
END_TEST

/* The bound client looked up another client's memory: when it goes, those MRs go (the
 * other's memory stays), and so does the context. */
struct gone_listener {
	struct mr_gone_listener base;
	unsigned calls;
	uint64_t start;
};

static void on_gone(struct mr_gone_listener *l, const struct mr_entry *mr)
{
	struct gone_listener *g = container_of(l, struct gone_listener, base);

	g->calls++;
	g->start = mr->start;
}

START_TEST(test_end_drops_every_mr)
{
	struct client *c, *owner;
	int ofd = td_hello_client(1000, &owner), fd = td_hello_client(1000, &c);
	uint64_t theirs = td_alloc(ofd, 2, 2 * MiB), mine;
	struct gone_listener gone = { .base.gone = on_gone };
	Mrd__MrEntry e;
	struct provider *p;

	mine = td_alloc(fd, 3, 64 * 1024);
	p = bind_soft(c);
	td_lookup(fd, 4, theirs, 0, &e);
	td_lookup(fd, 5, mine, 0, &e);
	ck_assert_uint_eq(mrs_of(p), 2);
	ck_assert_uint_eq(pinned(c), 2 * MiB + 64 * 1024);
	/* What is bound to the PD's MR over the owner's memory hears once that it went. */
	ck_assert_int_eq(mr_cache_listen_gone(&c->bound->cache, theirs, &gone.base), 0);
	close(fd);
	/* 2 MiB: [cache] async_bytes or more, deregistered on a worker. */
	pump_until_closed();
	ck_assert_uint_eq(gone.calls, 1);
	ck_assert_uint_eq(gone.start, theirs);
	ck_assert_uint_eq(td_manager->n_clients, 1);
	ck_assert_uint_eq(pinned(owner), 0);
	ck_assert_uint_eq(owner->domain->reg.cache.charges.pinned_bytes, 0);
	td_lookup(ofd, 6, theirs, 0, &e); /* the owner's memory serves on */
	ck_assert_uint_eq(e.start, theirs);
	close(ofd);
	td_wait_domains_closed();
	ck_assert_uint_eq(closed, 1);
}
END_TEST

/* One worker, held by blk; an owner's 8 MiB, which the bound client (request 4) looks up
 * on that worker. Returns the bound PD's provider. */
static struct provider *bound_lookup_held(struct td_blocker *blk, struct client **c,
					  struct client **owner, int *fd, int *ofd, uint64_t *big)
{
	struct provider *p;

	td_start_one_worker();
	*ofd = td_hello_client(1000, owner);
	*fd = td_hello_client(1000, c);
	*big = td_alloc(*ofd, 2, 8 * MiB);
	td_alloc(*fd, 3, 4096);
	p = bind_soft(*c);
	td_block_worker(blk);
	td_send_lookup(*fd, 4, *big + 4096);
	td_pump();
	return p;
}

/* A big registration on a worker while its client goes: the MR it makes is dropped when the
 * job ends, uncharged, and only then is the context let go. */
START_TEST(test_end_while_a_worker_registers)
{
	struct td_blocker blk;
	struct client *c, *owner;
	int ofd, fd;
	uint64_t big;
	struct provider *p = bound_lookup_held(&blk, &c, &owner, &fd, &ofd, &big);

	ck_assert_uint_eq(c->bound->cache.pending_bytes, 8 * MiB);
	ck_assert_uint_eq(pinned(owner), 8 * MiB); /* charged while it is made */
	close(fd);
	td_pump();
	ck_assert_uint_eq(td_manager->n_clients, 1);
	ck_assert_uint_eq(closed, 0); /* the job holds the PD */
	td_unblock_worker(&blk);
	pump_until_closed();
	ck_assert_uint_eq(pinned(owner), 0);
	(void)p;
	close(ofd);
	td_wait_domains_closed();
}
END_TEST

/* The memory is freed while a worker registers it in the bound PD: the free waits for the
 * worker (the MR it makes is invisible to the free until then, and the client could make its
 * dereg fail), then deregisters it, and only then are the pages back and the Free answered. */
START_TEST(test_free_while_a_worker_registers)
{
	struct td_blocker blk;
	struct client *c, *owner;
	int ofd, fd;
	uint64_t big;
	struct provider *p = bound_lookup_held(&blk, &c, &owner, &fd, &ofd, &big);
	Mrd__Response *resp;

	td_send_free(ofd, 5, big);
	for (int i = 0; i < 50; i++)
		td_pump();
	ck_assert(!readable(ofd)); /* the free waits for the registration */
	td_unblock_worker(&blk);
	resp = td_expect(fd, 4, ENOENT);
	mrd__response__free_unpacked(resp, NULL);
	td_expect_free(ofd, 5, 0);
	ck_assert_uint_eq(mrs_of(p), 0);
	ck_assert_uint_eq(pinned(owner), 0);
	ck_assert_uint_eq(c->bound->cache.n_mrs, 0);
	finish(fd, ofd);
}
END_TEST

/* Two lookups inside one run a worker registers: the second waits for it, both get its
 * keys, and the run is registered once. */
START_TEST(test_lookups_wait_for_the_run)
{
	struct client *c;
	int fd;
	uint64_t big;
	Mrd__Response *r1, *r2;
	struct provider *p;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	big = td_alloc(fd, 2, 4 * MiB);
	p = bind_soft(c);
	td_send_lookup(fd, 3, big);
	td_send_lookup(fd, 4, big + 3 * MiB);
	r1 = td_expect(fd, 3, 0);
	r2 = td_expect(fd, 4, 0);
	ck_assert_uint_eq(r1->mr_lookup->entries[0]->rkey, r2->mr_lookup->entries[0]->rkey);
	ck_assert_uint_eq(r2->mr_lookup->entries[0]->end, big + 4 * MiB);
	ck_assert_uint_eq(mrs_of(p), 1);
	ck_assert_uint_eq(pinned(c), 4 * MiB);
	mrd__response__free_unpacked(r1, NULL);
	mrd__response__free_unpacked(r2, NULL);
	finish(fd, -1);
}
END_TEST

START_TEST(test_quota_holds)
{
	struct client *c;
	int fd, k;
	uint64_t a;
	Mrd__Response *resp;

	td_stop();
	td_start_small("quota.pinned_bytes=2M");
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 3 * MiB);
	bind_soft(c);
	td_send_lookup(fd, 3, a);
	resp = td_expect(fd, 3, EDQUOT);
	ck_assert_msg(strcmp(resp->message, "quota.pinned_bytes (2097152) would be exceeded in "
		      "domain uid-1000: 0 in use, tried to pin 3145728 more; raise "
		      "[quota] pinned_bytes in mrd.conf and reload mrd") == 0, "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	k = (int)pinned(c);
	ck_assert_int_eq(k, 0);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* What works on the domain's PD is refused to a bound connection, with the reason. */
START_TEST(test_domain_pd_requests_refused)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 64 * 1024);
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExportPdRequest x = MRD__EXPORT_PD_REQUEST__INIT;
	Mrd__PrefetchRequest pf = MRD__PREFETCH_REQUEST__INIT;
	Mrd__Response *resp;
	Mrd__MrEntry e;

	bind_soft(c);
	td_lookup(fd, 3, a, 0, &e);
	req.id = 4;
	req.body_case = MRD__REQUEST__BODY_EXPORT_PD;
	req.export_pd = &x;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect(fd, 4, EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(resp->message, "bound to a PD of its own"));
	mrd__response__free_unpacked(resp, NULL);
	td_dma(fd, 5, PROVIDER_DMA_WRITE, &e, a, &e, a + 4096, 8, EOPNOTSUPP);
	pf.address = a;
	pf.length = 4096;
	req.id = 6;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &pf;
	td_send_request(fd, &req, NULL, 0);
	mrd__response__free_unpacked(td_expect(fd, 6, EOPNOTSUPP), NULL);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

static Mrd__Response *bind_request(int fd, uint64_t id, const int *fds, size_t n, int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__BindPdRequest q = MRD__BIND_PD_REQUEST__INIT;

	q.pd_handle = 1;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_BIND_PD;
	req.bind_pd = &q;
	td_send_request(fd, &req, fds, n);
	return td_expect(fd, id, error);
}

static void refused_with(int fd, uint64_t id, int hostile, int error, const char *words)
{
	Mrd__Response *resp = bind_request(fd, id, &hostile, 1, error);

	ck_assert_msg(strstr(resp->message, words), "BindPd: \"%s\", expected \"%s\"",
		      resp->message, words);
	mrd__response__free_unpacked(resp, NULL);
}

/* On-demand memory (policy odp): one on-demand MR over the run in the bound PD, pinning
 * nothing and charged nothing; the device faults its pages in (soft's DMA here). */
START_TEST(test_on_demand_in_the_bound_pd)
{
	struct client *c;
	int fd;
	uint64_t a;
	struct provider *p;
	struct provider_stats ps;
	Mrd__MrEntry e;

	td_stop();
	td_start_small("cache.policy=odp");
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 2 * MiB);
	p = bind_soft(c);
	td_lookup(fd, 3, a + 4096, 0, &e);
	ck_assert_uint_eq(e.start, a);
	ck_assert_uint_eq(e.end, a + 2 * MiB);
	ck_assert_uint_eq(pinned(c), 0);
	ck_assert_uint_eq(c->domain->reg.odp.children, 0); /* no children: one MR of the PD's */
	provider_stats(p, &ps);
	ck_assert_uint_eq(ps.pinned_bytes, 0);
	strcpy((char *)(uintptr_t)a, "faulted in");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, a, e.rkey,
				      a + MiB, 11), 0);
	ck_assert_str_eq((char *)(uintptr_t)(a + MiB), "faulted in");
	provider_stats(p, &ps);
	ck_assert_uint_gt(ps.odp_faults, 0);
	td_free(fd, 4, a, 0);
	ck_assert_uint_eq(mrs_of(p), 0);
	ck_assert_uint_eq(pinned(c), 0);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* DomainDump: a client PD's MRs are shown to an admin, as client-pd, never to the domain's
 * other clients (their keys are that client's). */
static unsigned dump_count(int fd, uint64_t id, uint32_t kind)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DomainDumpRequest q = MRD__DOMAIN_DUMP_REQUEST__INIT;
	Mrd__Response *resp;
	unsigned n = 0;

	q.domain = (char *)"uid-1000";
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
	req.domain_dump = &q;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect(fd, id, 0);
	for (size_t i = 0; i < resp->domain_dump->n_mrs; i++)
		n += resp->domain_dump->mrs[i]->kind == kind;
	mrd__response__free_unpacked(resp, NULL);
	return n;
}

START_TEST(test_dump_shows_client_pds_to_admins)
{
	struct client *c, *other, *root;
	int fd = td_hello_client(1000, &c), ofd = td_hello_client(1000, &other);
	int rfd = td_hello_client(0, &root);
	uint64_t a = td_alloc(fd, 2, 64 * 1024);

	bind_soft(c);
	td_lookup(fd, 3, a, 0, NULL);
	td_lookup(ofd, 4, a, 0, NULL);
	ck_assert_uint_eq(dump_count(ofd, 5, MRD__DUMP_MR_KIND__DUMP_MR_CLIENT_PD), 0);
	ck_assert_uint_eq(dump_count(ofd, 6, MRD__DUMP_MR_KIND__DUMP_MR_CACHE), 1);
	ck_assert_uint_eq(dump_count(rfd, 7, MRD__DUMP_MR_KIND__DUMP_MR_CLIENT_PD), 1);
	close(rfd);
	finish(fd, ofd);
}
END_TEST

/* Clients (mrctl clients): the MRs of its clients' own PDs show in the domain's row, beside the
 * domain's PD's, and each client's in its row, with the bytes they cover. */
START_TEST(test_clients_view_counts_client_pd_mrs)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ClientsRequest q = MRD__CLIENTS_REQUEST__INIT;
	struct client *c, *other, *third;
	int fd = td_hello_client(1000, &c), ofd = td_hello_client(1000, &other);
	int tfd = td_hello_client(1000, &third);
	uint64_t a = td_alloc(fd, 2, 3 * MiB), b = td_alloc(fd, 3, 1 * MiB);
	const Mrd__DomainInfo *d;
	Mrd__Response *resp;
	bool seen = false;

	bind_soft(c);
	td_lookup(fd, 4, a, 0, NULL);
	td_lookup(fd, 5, b, 0, NULL);
	td_lookup(ofd, 6, b, 0, NULL); /* one of the domain's PD */
	td_alloc(tfd, 2, 4096); /* joins the domain */
	bind_soft(third);
	td_lookup(tfd, 3, a, 0, NULL); /* the same memory, in a second client's PD */
	req.id = 7;
	req.body_case = MRD__REQUEST__BODY_CLIENTS;
	req.clients = &q;
	td_send_request(ofd, &req, NULL, 0);
	resp = td_expect(ofd, 7, 0);
	ck_assert_uint_eq(resp->clients->n_domains, 1);
	d = resp->clients->domains[0];
	ck_assert_uint_eq(d->mrs, 1);
	ck_assert_uint_eq(d->client_pd_mrs, 3);
	ck_assert_uint_eq(d->client_pd_mr_bytes, 7 * MiB);
	for (size_t i = 0; i < resp->clients->n_clients; i++) {
		const Mrd__ClientInfo *ci = resp->clients->clients[i];

		if (ci->id != c->id)
			continue;
		seen = true;
		ck_assert_uint_eq(ci->bound_mrs, 2);
		ck_assert_uint_eq(ci->bound_mr_bytes, 4 * MiB);
	}
	ck_assert(seen);
	mrd__response__free_unpacked(resp, NULL);
	close(tfd);
	pump_until_closed(); /* the third's PD */
	closed = 0;
	finish(fd, ofd);
}
END_TEST

/* ALLOC_REGISTER: an Alloc answers the keys of its memory, registered in the connection's PD,
 * when that is quick; a big one (a worker's job) comes without, and a lookup registers it. */
static Mrd__Response *alloc_register(int fd, uint64_t id, uint64_t size)
{
	return td_alloc_reply(fd, id, size, MRD__ALLOC_FLAGS__ALLOC_REGISTER);
}

START_TEST(test_alloc_registers_at_once)
{
	struct client *c, *plain;
	int fd = td_hello_client(1000, &c), pfd = td_hello_client(1000, &plain);
	Mrd__Response *resp;
	struct provider *p;
	Mrd__MrEntry e;
	uint64_t a;

	td_alloc(fd, 2, 4096);
	p = bind_soft(c);
	resp = alloc_register(fd, 3, 64 * 1024);
	a = resp->alloc->address;
	ck_assert_ptr_nonnull(resp->alloc->keys);
	ck_assert_uint_eq(resp->alloc->keys->start, a);
	ck_assert_uint_eq(resp->alloc->keys->end, a + 64 * 1024);
	ck_assert_uint_eq(mrs_of(p), 1); /* in the bound PD */
	td_lookup(fd, 4, a, 0, &e); /* the same MR: a hit */
	ck_assert_uint_eq(e.rkey, resp->alloc->keys->rkey);
	ck_assert_uint_eq(mrs_of(p), 1);
	mrd__response__free_unpacked(resp, NULL);
	resp = alloc_register(fd, 5, 4 * MiB); /* [cache] async_bytes: not now */
	ck_assert_ptr_null(resp->alloc->keys);
	ck_assert_uint_eq(mrs_of(p), 1);
	mrd__response__free_unpacked(resp, NULL);
	/* Unbound: the domain's PD, and from then on too late to bind. */
	resp = alloc_register(pfd, 6, 64 * 1024);
	ck_assert_ptr_nonnull(resp->alloc->keys);
	ck_assert_uint_eq(plain->domain->reg.cache.n_mrs, 1);
	ck_assert(plain->keys_out);
	mrd__response__free_unpacked(resp, NULL);
	finish(fd, pfd);
}
END_TEST

/* Memory a process aliased (libmrd-preload.so's moved buffers): that process's bound PD
 * registers it at the alias, and no other PD at all. */
START_TEST(test_alias_registers_at_the_alias)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull, other_alias = 0x7e0000100000ull;
	const uint64_t big_alias = 0x7e0000400000ull;
	struct client *c, *mem, *stranger;
	int fd = td_hello_client(1000, &c), mfd = td_hello_client(1000, &mem);
	int sfd = td_hello_client_of(getpid() + 1, 1000, &stranger);
	Mrd__Response *resp;
	Mrd__MrEntry e;
	struct provider *p;
	uint64_t w, w2;

	resp = td_alloc_alias(mfd, 2, 64 * 1024, 0, alias, RW, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	td_alloc(fd, 3, 4096); /* joins */
	p = bind_soft(c);
	td_lookup(fd, 4, w + 5, 0, &e);
	ck_assert_uint_eq(e.start, w); /* keys answer in mrd's addresses: the caller maps them */
	ck_assert_uint_eq(e.end, w + 64 * 1024);
	ck_assert_uint_eq(mrs_of(p), 1);
	/* The MR's addresses are the alias's: the device reaches w's pages through them... */
	strcpy((char *)(uintptr_t)(w + 100), "at the alias");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, alias + 100, e.rkey,
				      alias + 200, 13), 0);
	ck_assert_str_eq((char *)(uintptr_t)(w + 200), "at the alias");
	/* ... and through nothing else. */
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, w + 100, e.rkey,
				      w + 300, 13), 0);
	/* The domain's PD: keys for the process that moved it (mrd_mem_adopt, issue 40), at its
	 * addresses; another process is refused (test-adopt test_other_process_gets_no_keys:
	 * here every connection is this process). */
	td_lookup(mfd, 5, w, 0, NULL);
	ck_assert_uint_eq(c->domain->reg.cache.n_mrs, 1);
	/* A second allocation aliased elsewhere gets its own MR there; a plain one is plain. */
	resp = td_alloc_alias(mfd, 7, 8192, 0, other_alias, MRD_ACCESS_LOCAL_WRITE, 0);
	w2 = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	td_lookup(fd, 8, w2, 0, &e);
	strcpy((char *)(uintptr_t)w2, "second");
	/* It grants what was asked: local write, no remote access. */
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, other_alias, e.rkey,
				      other_alias + 4096, 7), 0);
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_READ, e.lkey, other_alias, e.rkey,
				      other_alias + 4096, 7), 0);
	/* A big one ([cache] async_bytes) is registered on a worker, at the alias too. */
	resp = td_alloc_alias(mfd, 13, 4 * MiB, 0, big_alias, RW, 0);
	w2 = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	td_lookup(fd, 14, w2, 0, &e);
	strcpy((char *)(uintptr_t)w2, "big");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, big_alias, e.rkey,
				      big_alias + 3 * MiB, 4), 0);
	ck_assert_str_eq((char *)(uintptr_t)(w2 + 3 * MiB), "big");
	/* Refused: not page-aligned, with huge pages, past the end of the address space. */
	ck_assert_ptr_null(td_alloc_alias(mfd, 9, 4096, 0, alias + 1, RW, EINVAL));
	ck_assert_ptr_null(td_alloc_alias(mfd, 15, 4096, 0, alias, MRD_ACCESS_REMOTE_WRITE, EINVAL));
	ck_assert_ptr_null(td_alloc_alias(mfd, 16, 4096, 0, alias, 0x10, EINVAL));
	ck_assert_ptr_null(td_alloc_alias(mfd, 17, 4096, 0, 0, RW, EINVAL));
	ck_assert_ptr_null(td_alloc_alias(mfd, 10, 4096, MRD__ALLOC_FLAGS__ALLOC_HUGEPAGE, alias,
					  RW, EINVAL));
	ck_assert_ptr_null(td_alloc_alias(mfd, 11, 8192, 0, UINT64_MAX - 4095, RW, EINVAL));
	ck_assert_ptr_null(td_alloc_alias(mfd, 18, 4096, MRD__ALLOC_FLAGS__ALLOC_ODP, alias, RW,
					  EINVAL));
	ck_assert_ptr_null(td_alloc_alias(mfd, 19, 1, 0, UINT64_MAX - 4095, RW, EINVAL));
	/* No pool of the domain's PD registers it either. */
	{
		uint64_t starts[1] = { w }, lengths[1] = { 4096 };

		td_send_mempool_register(mfd, 20, "pool", starts, lengths, 1, false);
		mrd__response__free_unpacked(td_expect(mfd, 20, EACCES), NULL);
	}
	/* A free takes the aliased MRs with it. */
	td_free(mfd, 12, w, 0);
	ck_assert_uint_eq(mrs_of(p), 2);
	close(sfd);
	finish(fd, mfd);
}
END_TEST

/* A span: the MRs cover the program's buffer to the byte, not its pages. */
START_TEST(test_alias_span_is_all_the_mrs_cover)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c, *mem;
	int fd = td_hello_client(1000, &c), mfd = td_hello_client(1000, &mem);
	Mrd__Response *resp;
	Mrd__MrEntry e;
	uint64_t w;

	resp = td_alloc_span(mfd, 2, 3 * 4096, 0, alias, RW, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	td_alloc(fd, 3, 4096);
	bind_soft(c);
	td_lookup(fd, 4, w + 4096, 0, &e);
	ck_assert_uint_eq(e.start, w + 100);
	ck_assert_uint_eq(e.end, w + 5100);
	strcpy((char *)(uintptr_t)(w + 200), "in the span");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, alias + 200, e.rkey,
				      alias + 5000, 12), 0);
	ck_assert_str_eq((char *)(uintptr_t)(w + 5000), "in the span");
	/* A byte before the span, and past it: the keys reach neither. */
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, alias + 200, e.rkey,
				      alias + 99, 1), 0);
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e.lkey, alias + 200, e.rkey,
				      alias + 5099, 2), 0);
	td_lookup(fd, 5, w + 50, ENOENT, NULL);
	td_lookup(fd, 6, w + 5100, ENOENT, NULL);
	/* The device pins the span's pages whole: quota.pinned_bytes counts them whole (from the
	 * second review). */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 2 * 4096);
	/* A span needs an alias, and lies inside the size. */
	ck_assert_ptr_null(td_alloc_span(mfd, 7, 4096, 0, 0, 0, 1, 10, EINVAL));
	ck_assert_ptr_null(td_alloc_span(mfd, 8, 4096, 0, alias, RW, 4000, 200, EINVAL));
	ck_assert_ptr_null(td_alloc_span(mfd, 9, 4096, 0, alias, RW, UINT64_MAX, 2, EINVAL));
	ck_assert_ptr_null(td_alloc_span(mfd, 10, 4096, 0, alias, RW, 100, 0, EINVAL));
	finish(fd, mfd);
}
END_TEST

/* AliasSpan (drop: its drop) on the connection fd, its reply left for the test to take. */
static void alias_span_req_send(int fd, uint64_t id, uint64_t address, uint64_t offset,
				uint64_t length, bool drop)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AliasSpanRequest q = MRD__ALIAS_SPAN_REQUEST__INIT;

	q.address = address;
	q.span_offset = offset;
	q.span_length = length;
	q.drop = drop;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_ALIAS_SPAN;
	req.alias_span = &q;
	td_send_request(fd, &req, NULL, 0);
}

/* The same, answered with error (the reply's message, for a look). */
static void alias_span_req(int fd, uint64_t id, uint64_t address, uint64_t offset,
			   uint64_t length, bool drop, int error, const char *says)
{
	Mrd__Response *resp;

	alias_span_req_send(fd, id, address, offset, length, drop);
	resp = td_expect(fd, id, error);
	if (says)
		ck_assert_msg(strstr(resp->message, says), "\"%s\" does not say \"%s\"",
			      resp->message, says);
	mrd__response__free_unpacked(resp, NULL);
}

static void alias_span(int fd, uint64_t id, uint64_t address, uint64_t offset, uint64_t length,
		       int error, const char *says)
{
	alias_span_req(fd, id, address, offset, length, false, error, says);
}

static void alias_span_drop(int fd, uint64_t id, uint64_t address, uint64_t offset,
			    uint64_t length, int error, const char *says)
{
	alias_span_req(fd, id, address, offset, length, true, error, says);
}

/* Heap neighbours: a second buffer on the same moved pages is a span of its own, an MR of its
 * own over its bytes alone; the page the two share is pinned and charged once. */
START_TEST(test_alias_second_span_has_its_own_mr)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c, *mem, *other;
	int fd = td_hello_client(1000, &c), mfd = td_hello_client(1000, &mem);
	int ofd = td_hello_client(1000, &other);
	uint64_t w, plain, allocated;
	Mrd__Response *resp;
	Mrd__MrEntry e1, e2;

	resp = td_alloc_span(mfd, 2, 3 * 4096, 0, alias, RW, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	allocated = mem->domain->mem.allocated_bytes;
	alias_span(mfd, 3, w, 5200, 6000, 0, NULL);
	ck_assert_uint_eq(mem->domain->mem.allocated_bytes, allocated); /* no page more */
	td_alloc(fd, 40, 4096); /* joins the domain */
	bind_soft(c);
	td_lookup(fd, 4, w + 200, 0, &e1);
	td_lookup(fd, 5, w + 11000, 0, &e2);
	ck_assert_uint_eq(e1.start, w + 100);
	ck_assert_uint_eq(e1.end, w + 5100);
	ck_assert_uint_eq(e2.start, w + 5200);
	ck_assert_uint_eq(e2.end, w + 11200);
	ck_assert_uint_ne(e1.rkey, e2.rkey);
	strcpy((char *)(uintptr_t)(w + 200), "neighbour");
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e1.lkey, alias + 200,
				      e2.rkey, alias + 5200, 10), 0);
	ck_assert_str_eq((char *)(uintptr_t)(w + 5200), "neighbour");
	/* Each rkey reaches its own buffer alone: not the bytes between, nor the other's. */
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e1.lkey, alias + 200,
				      e2.rkey, alias + 5150, 1), 0);
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e1.lkey, alias + 200,
				      e2.rkey, alias + 5000, 1), 0);
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e2.lkey, alias + 5200,
				      e1.rkey, alias + 5200, 1), 0);
	td_lookup(fd, 6, w + 5150, ENOENT, NULL);
	/* Pages 0-1 and 1-2: three pinned, the shared one once. */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 3 * 4096);

	/* Bad input: overlapping a span, past the allocation, empty, someone else's allocation,
	 * an unaliased one, not an allocation. */
	alias_span(mfd, 7, w, 5000, 300, EINVAL, "overlaps");
	alias_span(mfd, 8, w, 11000, 300, EINVAL, "overlaps");
	alias_span(mfd, 9, w, 11300, 1000, EINVAL, "past its");
	alias_span(mfd, 10, w, UINT64_MAX, 2, EINVAL, "past its");
	alias_span(mfd, 11, w, 11300, 0, EINVAL, "empty");
	alias_span(ofd, 12, w, 11300, 100, EPERM, "another client");
	plain = td_alloc(ofd, 13, 4096);
	alias_span(ofd, 14, plain, 0, 100, EINVAL, "no alias");
	alias_span(mfd, 15, w + 4096, 11300, 100, ENOENT, "not the start");
	/* An alias without a span: its MRs cover all of it already. */
	resp = td_alloc_alias(mfd, 16, 4096, 0, alias + 0x100000, RW, 0);
	alias_span(mfd, 17, resp->alloc->address, 0, 100, EINVAL, "all of it");
	mrd__response__free_unpacked(resp, NULL);
	/* Eight spans at most. */
	for (uint64_t i = 0; i < 6; i++)
		alias_span(mfd, 18 + i, w, 11300 + 100 * i, 50, 0, NULL);
	alias_span(mfd, 30, w, 11900, 50, ENOSPC, "most");
	td_lookup(fd, 31, w + 11820, 0, &e1);
	ck_assert_uint_eq(e1.start, w + 11800);
	ck_assert_uint_eq(e1.end, w + 11850);
	close(ofd);
	finish(fd, mfd);
}
END_TEST

/* A neighbour deregistered and freed while the buffer beside it stays: its span goes (its MR
 * with it, so its old rkey reaches nothing), and a later buffer inside its old bytes is a span
 * of its own, an MR over its bytes alone (issue 38's review: it got the old span's keys). */
START_TEST(test_alias_span_dropped)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c, *mem, *other;
	int fd = td_hello_client(1000, &c), mfd = td_hello_client(1000, &mem);
	int ofd = td_hello_client(1000, &other);
	Mrd__Response *resp;
	Mrd__MrEntry e1, e2, e3;
	uint64_t w;

	resp = td_alloc_span(mfd, 2, 3 * 4096, 0, alias, RW, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	alias_span(mfd, 3, w, 5200, 6000, 0, NULL);
	td_alloc(fd, 40, 4096); /* joins the domain */
	bind_soft(c);
	td_lookup(fd, 4, w + 200, 0, &e1);
	td_lookup(fd, 5, w + 11000, 0, &e2);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 3 * 4096);

	/* Bad input: not exactly a span, someone else's, not the allocation's start. */
	alias_span_drop(mfd, 6, w, 5300, 100, EINVAL, "no span");
	alias_span_drop(mfd, 7, w, 5200, 5999, EINVAL, "no span");
	alias_span_drop(ofd, 8, w, 5200, 6000, EPERM, "another client");
	alias_span_drop(mfd, 9, w + 4096, 5200, 6000, ENOENT, "not the start");

	alias_span_drop(mfd, 10, w, 5200, 6000, 0, NULL);
	/* Its rkey reaches nothing; the other span's still works. */
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e1.lkey, alias + 200,
				      e2.rkey, alias + 5200, 1), 0);
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e1.lkey, alias + 200,
				      e1.rkey, alias + 300, 1), 0);
	td_lookup(fd, 11, w + 5300, ENOENT, NULL);
	/* Page 2 was the dropped span's alone; page 1 stays, the first span's. */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 2 * 4096);
	alias_span_drop(mfd, 12, w, 5200, 6000, EINVAL, "no span");

	/* A buffer inside its old bytes: a span of its own, to the byte. */
	alias_span(mfd, 13, w, 5300, 100, 0, NULL);
	td_lookup(fd, 14, w + 5350, 0, &e3);
	ck_assert_uint_eq(e3.start, w + 5300);
	ck_assert_uint_eq(e3.end, w + 5400);
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e1.lkey, alias + 200,
				      e3.rkey, alias + 5250, 1), 0);
	ck_assert_int_eq(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e1.lkey, alias + 200,
				      e3.rkey, alias + 5300, 1), 0);

	/* The first span goes too (the buffer moved first freed before its neighbour). */
	alias_span_drop(mfd, 15, w, 100, 5000, 0, NULL);
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e3.lkey, alias + 5300,
				      e1.rkey, alias + 200, 1), 0);
	td_lookup(fd, 16, w + 200, ENOENT, NULL);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 4096);
	/* The last span is not dropped: the allocation is freed instead. */
	alias_span_drop(mfd, 17, w, 5300, 100, EINVAL, "only span");
	td_lookup(fd, 18, w + 5310, 0, &e2);
	ck_assert_uint_eq(e2.rkey, e3.rkey);
	close(ofd);
	finish(fd, mfd);
}
END_TEST

/* A span dropped while a worker registers it: the drop is answered at once, and what the
 * worker made is let go when it ends (no MR, nothing pinned, over a span that is no more). */
START_TEST(test_alias_span_dropped_while_registering)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct td_blocker blk;
	struct client *c, *mem;
	int fd, mfd;
	Mrd__Response *resp;
	struct provider *p;
	uint64_t w;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	mfd = td_hello_client(1000, &mem);
	resp = td_alloc_span(mfd, 2, 6 * MiB, 0, alias, RW, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	alias_span(mfd, 3, w, 8192, 5 * MiB, 0, NULL);
	td_alloc(fd, 40, 4096); /* joins the domain */
	p = bind_soft(c);
	td_lookup(fd, 4, w + 200, 0, NULL);
	td_block_worker(&blk);
	td_send_lookup(fd, 5, w + 8192 + 10); /* 5 MiB: on the worker, behind the blocker */
	td_pump();
	alias_span_drop(mfd, 6, w, 8192, 5 * MiB, 0, NULL);
	ck_assert_int_eq(write(blk.fd[1], "x", 1), 1);
	resp = td_expect(fd, 5, ENOENT);
	ck_assert_msg(strstr(resp->message, "outside"), "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	/* Its dereg may be a worker's too (5 MiB). */
	td_pump_until_zero(&reg_allocation_of(domain_find_allocation(c->domain, w))->bound_jobs);
	ck_assert_uint_eq(mrs_of(p), 1);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 2 * 4096);
	close(blk.fd[0]);
	close(blk.fd[1]);
	finish(fd, mfd);
}
END_TEST

/* A span dropped while a worker registers another span in the client's PD (the provider's
 * lock held): the drop's dereg waits for that lock, so it goes to a worker as a Free's does;
 * the loop answers another client meanwhile, and the drop is answered once its MR is gone. */
START_TEST(test_alias_span_drop_never_waits_on_the_loop)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c, *mem, *other;
	int fd, mfd, ofd;
	Mrd__Response *resp;
	Mrd__MrEntry e0;
	uint64_t w;
	double t0, waited;
	bool dropped_early;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	mfd = td_hello_client(1000, &mem);
	ofd = td_hello_client(1001, &other);
	resp = td_alloc_span(mfd, 2, 6 * MiB, 0, alias, RW, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	alias_span(mfd, 3, w, 8192, 5 * MiB, 0, NULL);
	td_alloc(fd, 40, 4096); /* joins the domain */
	bind_soft(c);
	counted_ops.reg = slow_reg;
	td_lookup(fd, 4, w + 200, 0, &e0); /* a few KiB: on the loop */
	start_slow_registration(fd, 5, w + 8192 + 10);
	alias_span_req_send(mfd, 6, w, 100, 5000, true);
	ck_assert_int_eq(raw_send_ping(ofd, 7, NULL, 0, 0), 0); /* its reply left to take */
	t0 = test_now_s();
	mrd__response__free_unpacked(td_expect(ofd, 7, 0), NULL);
	waited = test_now_s() - t0;
	dropped_early = readable(mfd);
	__atomic_store_n(&slow_reg_held, 0, __ATOMIC_RELEASE);
	ck_assert_msg(waited < NOT_WAITED_S, "the loop was stuck %.2f s in an AliasSpan drop's "
		      "dereg, waiting for a worker's registration in the client's PD", waited);
	ck_assert_msg(!dropped_early, "the drop was answered before its MR was deregistered");
	mrd__response__free_unpacked(td_expect(mfd, 6, 0), NULL);
	/* Answered once its rkey reaches nothing. */
	ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, e0.lkey, alias + 200,
				      e0.rkey, alias + 300, 1), 0);
	mrd__response__free_unpacked(td_expect(fd, 5, 0), NULL);
	ck_assert_uint_eq(pinned(c), 5 * MiB);
	close(ofd);
	finish(fd, mfd);
}
END_TEST

static pthread_t loop_thread;
static unsigned loop_deregs;

static int loop_counting_dereg(struct provider_mr *mr)
{
	if (pthread_equal(pthread_self(), loop_thread))
		__atomic_add_fetch(&loop_deregs, 1, __ATOMIC_RELAXED);
	return provider_soft_ops.dereg(mr);
}

/* A drop's deregistrations take the loop's share as registrations do: a span of eight page
 * MRs (policy page) is not deregistered all in one turn of the loop (with async_bytes 1 MiB
 * that was up to 256), past REGISTRAR_LOOP_PER_REQUEST a worker does it. */
START_TEST(test_alias_span_drop_takes_the_loops_share)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c, *mem;
	Mrd__MrEntry e[8], first;
	Mrd__Response *resp;
	int fd, mfd;
	uint64_t w;

	td_stop();
	td_start_small("cache.policy=page");
	fd = td_hello_client(1000, &c);
	mfd = td_hello_client(1000, &mem);
	resp = td_alloc_span(mfd, 2, 16 * 4096, 0, alias, RW, 100, 3000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	alias_span(mfd, 3, w, 4096, 8 * 4096, 0, NULL);
	td_alloc(fd, 40, 4096);
	bind_soft(c);
	td_lookup(fd, 4, w + 200, 0, &first);
	for (unsigned i = 0; i < 8; i++) {
		td_lookup(fd, 10 + i, w + 4096 * (i + 1) + 10, 0, &e[i]);
		ck_assert_uint_eq(e[i].start, w + 4096 * (i + 1)); /* a page MR each */
	}
	loop_thread = pthread_self();
	loop_deregs = 0;
	counted_ops.dereg = loop_counting_dereg;
	alias_span_drop(mfd, 30, w, 4096, 8 * 4096, 0, NULL);
	ck_assert_msg(loop_deregs <= REGISTRAR_LOOP_PER_REQUEST, "the loop deregistered %u MRs "
		      "of one drop", loop_deregs);
	for (unsigned i = 0; i < 8; i++)
		ck_assert_int_lt(provider_dma(c->bound->pd, PROVIDER_DMA_WRITE, first.lkey,
					      alias + 200, e[i].rkey, alias + 4096 * (i + 1), 1), 0);
	td_free(mfd, 50, w, 0);
	finish(fd, mfd);
}
END_TEST

/* A span with an MR another PD of the process let go of (the PD went) and the device kept:
 * the drop still takes the span and deregisters its MR in the process's other PD, so the
 * freed buffer's rkey there reaches nothing; it answers EBUSY, naming the kept one, and a
 * second drop finds no span (the shim's drop is its last word; once it answered "try again"
 * with nothing done, and the other PD's rkey stayed live for good). */
START_TEST(test_alias_span_drop_beside_an_mr_let_go_before)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c1, *c2, *mem;
	int fd1, fd2, mfd;
	Mrd__Response *resp;
	Mrd__MrEntry a2, s2;
	struct provider *p2;
	unsigned removed;
	uint64_t w;
	int k1, k2;

	fd1 = td_hello_client(1000, &c1);
	fd2 = td_hello_client(1000, &c2);
	mfd = td_hello_client(1000, &mem);
	resp = td_alloc_span(mfd, 2, 3 * 4096, 0, alias, RW, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	alias_span(mfd, 3, w, 5200, 6000, 0, NULL);
	td_alloc(fd1, 40, 4096); /* join the domain */
	td_alloc(fd2, 41, 4096);
	bind_failing(c1);
	p2 = bind_soft(c2);
	counted_ops.dereg = failing_dereg; /* one ops for both PDs: fail_deregs says when */
	(void)p2;
	td_lookup(fd1, 4, w + 5300, 0, NULL);
	td_lookup(fd2, 5, w + 200, 0, &a2);
	td_lookup(fd2, 6, w + 5300, 0, &s2);
	/* PD 1 goes; the device keeps its MR over the span. */
	__atomic_store_n(&fail_deregs, 1, __ATOMIC_RELEASE);
	close(fd1);
	td_pump_until(td_manager->n_clients <= 2);
	td_pump_until(fails_left() == 0);
	ck_assert_uint_eq(fails_left(), 0);
	/* The buffer of span 2 is freed: the shim drops it (and would not again). */
	alias_span_req_send(mfd, 7, w, 5200, 6000, true);
	resp = td_recv_reply(mfd, NULL, NULL);
	ck_assert_ptr_nonnull(resp);
	k1 = resp->status;
	ck_assert_msg(k1 == EBUSY && strstr(resp->message, "other MRs are gone"), "drop: %d %s",
		      k1, resp->message);
	mrd__response__free_unpacked(resp, NULL);
	alias_span_req_send(mfd, 8, w, 5200, 6000, true);
	resp = td_recv_reply(mfd, NULL, NULL);
	ck_assert_ptr_nonnull(resp);
	k2 = resp->status;
	ck_assert_msg(k2 == EINVAL, "drop again: %d %s", k2, resp->message);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_msg(provider_dma(c2->bound->pd, PROVIDER_DMA_WRITE, a2.lkey, alias + 200,
				   s2.rkey, alias + 5200, 1) < 0,
		      "after the drop, PD 2's rkey of the dropped span still reaches its bytes");
	td_free(mfd, 9, w, 0);
	(void)domain_flush(c2->domain, false, false, &removed);
	close(fd2);
	close(mfd);
	td_wait_domains_closed();
}
END_TEST

/* Each drop whose dereg the device refuses (the client bound a memory window to the MR)
 * leaves a kept MR on the allocation and frees the span's slot: a client that adds a 1-byte
 * span beside it, registers it and drops it again would grow mrd's MRs over one allocation
 * without bound, every one on the same page (the pinned quota counts that page once). Eight
 * kept: a new span is refused. */
START_TEST(test_kept_mrs_bound_the_spans)
{
	const uint32_t RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	const uint64_t alias = 0x7e0000000000ull;
	struct client *c, *mem;
	int fd, mfd;
	Mrd__Response *resp;
	const struct cached_mr *mr;
	struct reg_allocation *ra;
	unsigned n = 0, removed;
	uint64_t w;

	fd = td_hello_client(1000, &c);
	mfd = td_hello_client(1000, &mem);
	resp = td_alloc_span(mfd, 2, 3 * 4096, 0, alias, RW, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	td_alloc(fd, 40, 4096);
	bind_failing(c);
	for (unsigned i = 0; i < ALLOCATION_SPANS_MAX; i++) {
		alias_span(mfd, 100 + 4 * i, w, 5200 + i, 1, 0, NULL);
		td_lookup(fd, 101 + 4 * i, w + 5200 + i, 0, NULL);
		__atomic_store_n(&fail_deregs, 1, __ATOMIC_RELEASE);
		alias_span_drop(mfd, 102 + 4 * i, w, 5200 + i, 1, EBUSY, "kept");
	}
	alias_span(mfd, 399, w, 5300, 1, EBUSY, "8 MRs of this allocation are kept");
	ra = reg_allocation_of(domain_find_allocation(c->domain, w));
	LIST_FOREACH(mr, &ra->mrs, alloc_link)
		n++;
	ck_assert_msg(n <= ALLOCATION_SPANS_MAX, "%u MRs kept over one allocation of %u spans at "
		      "most", n, ALLOCATION_SPANS_MAX);
	td_free(mfd, 400, w, 0);
	(void)domain_flush(c->domain, false, false, &removed);
	finish(fd, mfd);
}
END_TEST

/* Read-only memory stays the domain PD's: a client may rereg its own MR to add write access,
 * which the kernel does not check against the pages (Linux 6.12 ib_uverbs_rereg_mr). */
START_TEST(test_read_only_refused)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t ro = td_alloc_flags(fd, 2, 64 * 1024, MRD__ALLOC_FLAGS__ALLOC_READ_ONLY);
	Mrd__Response *resp;

	bind_soft(c);
	td_send_lookup(fd, 3, ro);
	resp = td_expect(fd, 3, EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(resp->message, "read-only memory"));
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(c->bound->cache.n_mrs, 0);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* Hostile descriptors: each a clear error; mrd keeps none of them and serves on. */
START_TEST(test_bind_refuses_what_is_no_uverbs_fd)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), pipefd[2], sv[2], memfd, null;
	unsigned base;
	Mrd__Response *resp;

	ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	memfd = memfd_create("not-uverbs", MFD_CLOEXEC);
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(memfd, 0);
	ck_assert_int_ge(null, 0);
	td_alloc(fd, 7, 4096); /* the domain open: its status page is one more fd */
	base = count_open_fds(getpid());
	refused_with(fd, 2, pipefd[0], ENOTTY, "not a character device");
	refused_with(fd, 3, memfd, ENOTTY, "not a character device");
	refused_with(fd, 4, sv[0], ENOTTY, "not a character device");
	refused_with(fd, 5, null, ENOTTY, "no uverbs device");
	/* No descriptor at all: the table's count refuses it. */
	resp = bind_request(fd, 6, NULL, 0, EBADMSG);
	mrd__response__free_unpacked(resp, NULL);
	/* The received copies went to the closer: none is left once it ran, which on a loaded
	 * machine is hundreds of milliseconds later (its threads wait for a CPU). */
	td_pump_until(count_open_fds(getpid()) <= base);
	ck_assert_uint_eq(count_open_fds(getpid()), base);
	ck_assert_ptr_null(c->bound);
	/* Once bound, a second bind is EALREADY; after a lookup, an unbound one is EBUSY. */
	bind_soft(c);
	refused_with(fd, 8, null, EALREADY, "bound to a PD already");
	{
		struct client *c2;
		int fd2 = td_hello_client(1000, &c2);
		uint64_t a = td_alloc(fd2, 9, 4096);

		td_lookup(fd2, 10, a, 0, NULL);
		refused_with(fd2, 11, null, EBUSY, "before the handle's first key lookup");
		close(fd2);
	}
	close(pipefd[0]);
	close(pipefd[1]);
	close(sv[0]);
	close(sv[1]);
	close(memfd);
	close(null);
	close(fd);
	td_wait_domains_closed();
}
END_TEST


/* Found in review: the bound client goes, and its PD refuses the dereg (a client can make it:
 * a memory window bound to the MR, rxe_dereg_mr's EINVAL). The MR is live in the client's
 * context, its keys working, its pages pinned: mrd keeps counting them, keeps the PD, and the
 * owner's free tries again — quarantining the run while the dereg fails, giving it back (and
 * the PD) once it works. */
static void kept_at_the_end(uint64_t size)
{
	struct client *c, *owner;
	int ofd = td_hello_client(1000, &owner), fd = td_hello_client(1000, &c);
	uint64_t theirs = td_alloc(ofd, 2, size);
	struct domain *d = owner->domain;
	unsigned removed;
	Mrd__MrEntry e;

	struct bound_pd *b;

	td_alloc(fd, 3, 4096);
	bind_failing(c);
	b = c->bound;
	td_lookup(fd, 4, theirs, 0, &e);
	ck_assert_uint_eq(pinned(owner), size);
	__atomic_store_n(&fail_deregs, 2, __ATOMIC_RELEASE); /* at the end, and at the free */
	close(fd);
	td_pump_until(td_manager->n_clients <= 1);
	td_pump_until(fails_left() <= 1); /* a worker's dereg, when big */
	ck_assert_uint_eq(fails_left(), 1);
	ck_assert_uint_eq(closed, 0); /* the kept MR holds the PD */
	ck_assert_uint_eq(pinned(owner), size);
	ck_assert_uint_eq(b->cache.n_mrs, 0); /* out of its table, on the allocation alone */
	td_free(ofd, 5, theirs, 0);
	ck_assert_uint_eq(b->cache.n_mrs, 0); /* the free found it out of the table already */
	ck_assert_uint_eq(d->reg.quarantine.n, 1);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, size);
	(void)domain_flush(d, false, false, &removed); /* the dereg works now */
	ck_assert_uint_eq(d->reg.quarantine.n, 0);
	pump_until_closed();
	ck_assert_uint_eq(live_at_close, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(ofd);
	td_wait_domains_closed();
}

START_TEST(test_kept_at_the_end)
{
	kept_at_the_end(64 * 1024); /* deregistered on the loop */
}
END_TEST

START_TEST(test_kept_at_the_end_big)
{
	td_start_one_worker();
	kept_at_the_end(4 * MiB); /* on a worker */
}
END_TEST

/* The client's windows (WindowTrack), as rxe keeps them: a dereg is refused while a window is
 * bound over the MR (rxe_mr.c, num_mw: here any live one of fake_window_bound), and
 * DEALLOC_MW of a handle that is no window is refused. dereg_refused counts the refusals. */
#define FAKE_WINDOWS 2048
static bool fake_window_live[FAKE_WINDOWS], fake_window_bound[FAKE_WINDOWS];
static unsigned dereg_refused, windows_deallocated;

static int fake_client_mw_dealloc(struct provider *p, uint32_t handle)
{
	(void)p;
	if (handle >= FAKE_WINDOWS || !fake_window_live[handle])
		return -EINVAL;
	fake_window_live[handle] = false;
	windows_deallocated++;
	return 0;
}

static int windowed_dereg(struct provider_mr *mr)
{
	for (unsigned i = 0; i < FAKE_WINDOWS; i++)
		if (fake_window_live[i] && fake_window_bound[i]) {
			dereg_refused++;
			return -EINVAL;
		}
	return provider_soft_ops.dereg(mr);
}

static struct provider *bind_windowed(struct client *c)
{
	struct provider *p = bind_soft(c);

	counted_ops.dereg = windowed_dereg;
	counted_ops.client_mw_dealloc = fake_client_mw_dealloc;
	memset(fake_window_live, 0, sizeof(fake_window_live));
	memset(fake_window_bound, 0, sizeof(fake_window_bound));
	dereg_refused = windows_deallocated = 0;
	return p;
}

/* WindowTrack: adds and removes handles; the count comes back. */
static Mrd__Response *track_clear(int fd, uint64_t id, bool clear, const uint32_t *add,
				  size_t n_add, const uint32_t *remove, size_t n_remove, int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowTrackRequest q = MRD__WINDOW_TRACK_REQUEST__INIT;

	q.clear = clear;

	q.add = (uint32_t *)add;
	q.n_add = n_add;
	q.remove = (uint32_t *)remove;
	q.n_remove = n_remove;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_WINDOW_TRACK;
	req.window_track = &q;
	td_send_request(fd, &req, NULL, 0);
	return td_expect(fd, id, error);
}

static Mrd__Response *track(int fd, uint64_t id, const uint32_t *add, size_t n_add,
			    const uint32_t *remove, size_t n_remove, int error)
{
	return track_clear(fd, id, false, add, n_add, remove, n_remove, error);
}

static unsigned tracked_now(int fd, uint64_t id)
{
	Mrd__Response *resp = track(fd, id, NULL, 0, NULL, 0, 0);
	unsigned n;

	ck_assert_int_eq(resp->body_case, MRD__RESPONSE__BODY_WINDOW_TRACK);
	n = resp->window_track->tracked;
	mrd__response__free_unpacked(resp, NULL);
	return n;
}

/* A program killed with windows of its PD bound over mrd's MRs there (its windows outlive it in
 * the context mrd's copy of the fd keeps): mrd deallocates the windows it tracked before it
 * deregisters, so nothing is kept, quarantined or left pinned, and the context goes. A window it
 * untracked is left alone. */
START_TEST(test_left_windows_go_before_the_mrs)
{
	static const uint32_t first[] = { 5, 9 }, gone[] = { 9 }, again[] = { 9, 11, 5 };
	struct client *c, *other;
	int ofd = td_hello_client(1000, &other), fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 64 * 1024);
	Mrd__MrEntry e;
	struct domain *d = c->domain;

	td_alloc(ofd, 3, 4096); /* the domain outlives the client */
	bind_windowed(c);
	td_lookup(fd, 4, a, 0, &e);
	for (unsigned i = 5; i <= 12; i++)
		fake_window_live[i] = true;
	fake_window_bound[5] = fake_window_bound[11] = true; /* over mrd's MR */
	mrd__response__free_unpacked(track(fd, 5, first, 2, NULL, 0, 0), NULL);
	mrd__response__free_unpacked(track(fd, 6, NULL, 0, gone, 1, 0), NULL);
	ck_assert_uint_eq(tracked_now(fd, 7), 1);
	mrd__response__free_unpacked(track(fd, 8, again, 3, NULL, 0, 0), NULL);
	ck_assert_uint_eq(tracked_now(fd, 9), 3);
	mrd__response__free_unpacked(track_clear(fd, 10, true, NULL, 0, NULL, 0, 0), NULL);
	ck_assert_uint_eq(tracked_now(fd, 11), 0);
	mrd__response__free_unpacked(track(fd, 12, again, 2, NULL, 0, 0), NULL); /* 9, 11 */
	mrd__response__free_unpacked(track_clear(fd, 13, true, &first[0], 1, NULL, 0, 0), NULL);
	ck_assert_uint_eq(tracked_now(fd, 14), 1); /* 5 alone */
	mrd__response__free_unpacked(track(fd, 15, again, 2, NULL, 0, 0), NULL);
	ck_assert_uint_eq(tracked_now(fd, 16), 3);
	close(fd);
	pump_until_closed();
	ck_assert_uint_eq(windows_deallocated, 3);
	ck_assert(!fake_window_live[5] && !fake_window_live[9] && !fake_window_live[11]);
	for (unsigned i = 6; i <= 12; i++) /* the program's own, never tracked: left alone */
		ck_assert_msg(i == 9 || i == 11 || fake_window_live[i], "window %u deallocated", i);
	ck_assert_uint_eq(dereg_refused, 0);
	ck_assert_uint_eq(d->reg.quarantine.n, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(ofd);
	td_wait_domains_closed();
}
END_TEST

/* The same when the memory is the process's other connection's (the preload shim's), which
 * goes first: its free finds the window still bound, and the run is quarantined; once the
 * bound connection goes, mrd deallocates the window and the run goes back at once. */
START_TEST(test_left_windows_free_a_quarantined_run)
{
	static const uint32_t handle = 5;
	struct client *c, *mem, *other;
	int xfd = td_hello_client(1000, &other), mfd = td_hello_client(1000, &mem);
	int fd = td_hello_client(1000, &c);
	uint64_t theirs = td_alloc(mfd, 2, 64 * 1024);
	Mrd__MrEntry e;
	struct domain *d;

	td_alloc(xfd, 3, 4096); /* the domain outlives the process */
	td_alloc(fd, 6, 4096);
	d = c->domain;
	bind_windowed(c);
	td_lookup(fd, 4, theirs, 0, &e);
	fake_window_live[handle] = fake_window_bound[handle] = true;
	mrd__response__free_unpacked(track(fd, 5, &handle, 1, NULL, 0, 0), NULL);
	close(mfd);
	td_pump_until(d->reg.quarantine.n > 0);
	ck_assert_uint_eq(d->reg.quarantine.n, 1);
	ck_assert_uint_ge(dereg_refused, 1);
	close(fd);
	pump_until_closed();
	ck_assert_uint_eq(windows_deallocated, 1);
	ck_assert_uint_eq(d->reg.quarantine.n, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(xfd);
	td_wait_domains_closed();
}
END_TEST

/* A user's connections may leave 1,024 tracked windows each: their deallocations take the
 * loop's share a turn, as deregistrations do, not one turn for all while other clients wait. */
START_TEST(test_left_windows_go_a_share_a_turn)
{
	static uint32_t many[BOUND_PD_WINDOWS_MAX];
	struct client *c, *other;
	int ofd, fd;
	unsigned first;

	td_start_one_worker();
	ofd = td_hello_client(1000, &other);
	fd = td_hello_client(1000, &c);
	td_alloc(ofd, 2, 4096);
	td_alloc(fd, 3, 4096);
	bind_windowed(c);
	for (uint32_t i = 0; i < BOUND_PD_WINDOWS_MAX; i++) {
		many[i] = i;
		fake_window_live[i] = fake_window_bound[i] = true;
	}
	mrd__response__free_unpacked(track(fd, 4, many, BOUND_PD_WINDOWS_MAX, NULL, 0, 0), NULL);
	close(fd);
	/* One turn of the loop at a time (td_pump runs many), until the leave's first share. */
	for (double t0 = test_now_s(); windows_deallocated == 0 && test_now_s() - t0 < TEST_WAIT_S;) {
		event_base_loop(td_manager->core.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
		usleep(1000);
	}
	first = windows_deallocated;
	ck_assert_uint_gt(first, 0);
	ck_assert_uint_le(first, 8); /* REGISTRAR_LOOP_PER_TURN */
	pump_until_closed();
	ck_assert_uint_eq(windows_deallocated, BOUND_PD_WINDOWS_MAX);
	ck_assert_uint_eq(dereg_refused, 0);
	close(ofd);
	td_wait_domains_closed();
}
END_TEST

/* While a worker registers in the client's PD (holding its provider for seconds where the
 * registration is big), a leave does not make the loop wait for it to deallocate windows: the
 * windows go once the registration is done. */
START_TEST(test_left_windows_wait_for_a_bound_registration)
{
	static const uint32_t handle = 7;
	struct client *c, *other;
	int ofd, fd;
	uint64_t big;

	td_start_one_worker();
	ofd = td_hello_client(1000, &other);
	fd = td_hello_client(1000, &c);
	td_alloc(ofd, 2, 4096);
	big = td_alloc(fd, 3, 4 * MiB);
	bind_windowed(c);
	counted_ops.reg = slow_reg;
	fake_window_live[handle] = true; /* over no MR of these: the loop's wait is the point */
	mrd__response__free_unpacked(track(fd, 4, &handle, 1, NULL, 0, 0), NULL);
	start_slow_registration(fd, 5, big);
	close(fd);
	td_pump();
	/* The loop came back while the registration is held (else it would have waited in
	 * the dealloc for the provider until slow_reg gave up, and deallocated then). */
	ck_assert_uint_eq(windows_deallocated, 0);
	ck_assert(__atomic_load_n(&slow_reg_held, __ATOMIC_ACQUIRE));
	__atomic_store_n(&slow_reg_held, 0, __ATOMIC_RELEASE);
	pump_until_closed();
	ck_assert_uint_eq(windows_deallocated, 1);
	close(ofd);
	td_wait_domains_closed();
}
END_TEST

/* WindowTrack's refusals: no PD bound (ENXIO); past BOUND_PD_WINDOWS_MAX a connection's
 * request changes nothing (ENOSPC), whether in one request or by adding to a full set; a
 * removal makes room. */
START_TEST(test_window_track_bounded)
{
	static uint32_t many[BOUND_PD_WINDOWS_MAX + 1];
	uint32_t one = BOUND_PD_WINDOWS_MAX + 7, first = 0;
	struct client *c;
	int fd = td_hello_client(1000, &c);
	Mrd__Response *resp;

	td_alloc(fd, 2, 4096);
	resp = track(fd, 3, &one, 1, NULL, 0, ENXIO);
	ck_assert_str_eq(resp->message, "WindowTrack: this connection has no PD of its own bound "
			 "(mrd_client_bind_pd)");
	mrd__response__free_unpacked(resp, NULL);
	bind_windowed(c);
	for (uint32_t i = 0; i <= BOUND_PD_WINDOWS_MAX; i++)
		many[i] = 3 * i + 1;
	mrd__response__free_unpacked(track(fd, 4, many, BOUND_PD_WINDOWS_MAX + 1, NULL, 0,
					   ENOSPC), NULL);
	ck_assert_uint_eq(tracked_now(fd, 5), 0);
	mrd__response__free_unpacked(track(fd, 6, many, BOUND_PD_WINDOWS_MAX, NULL, 0, 0), NULL);
	resp = track(fd, 7, &one, 1, NULL, 0, ENOSPC);
	ck_assert_ptr_nonnull(strstr(resp->message, "1024 windows at most"));
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(tracked_now(fd, 8), BOUND_PD_WINDOWS_MAX);
	/* Tracked already: no room needed. */
	mrd__response__free_unpacked(track(fd, 9, many, 3, NULL, 0, 0), NULL);
	first = many[0];
	mrd__response__free_unpacked(track(fd, 10, &one, 1, &first, 1, 0), NULL);
	ck_assert_uint_eq(tracked_now(fd, 11), BOUND_PD_WINDOWS_MAX);
	close(fd);
	pump_until_closed();
	td_wait_domains_closed();
}
END_TEST

/* Found in review: a free whose bound-MR dereg fails quarantines the run; the bound client goes
 * meanwhile; a flush (dereg now succeeding) gives the run back and lets the PD go. */
START_TEST(test_quarantine_outlives_the_client)
{
	struct client *c, *other;
	int ofd = td_hello_client(1000, &other), fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 64 * 1024);
	Mrd__MrEntry e;
	struct domain *d;
	unsigned removed;

	td_alloc(ofd, 3, 4096);
	d = c->domain;
	bind_failing(c);
	td_lookup(fd, 4, a, 0, &e);
	__atomic_store_n(&fail_deregs, 1, __ATOMIC_RELEASE);
	td_free(fd, 5, a, 0);
	ck_assert_uint_eq(d->reg.quarantine.n, 1);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 64 * 1024);
	close(fd);
	td_pump_until(td_manager->n_clients <= 1);
	ck_assert_uint_eq(td_manager->n_clients, 1);
	ck_assert_uint_eq(closed, 0); /* the quarantined MR holds the PD */
	(void)domain_flush(d, false, false, &removed);
	ck_assert_uint_eq(d->reg.quarantine.n, 0);
	pump_until_closed();
	ck_assert_uint_eq(live_at_close, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(ofd);
	td_wait_domains_closed();
}
END_TEST

/* Found in review: while a worker registers a big run in the bound PD (the provider's lock held), a
 * Free of a small allocation with a bound MR is deregistered on the loop: registrar_busy()
 * counts neither the bound cache's pending_bytes nor its reg jobs (busy=false), so the loop
 * waits on the client provider's lock for the whole registration, and every client with it. */
START_TEST(test_loop_never_waits_for_a_bound_registration)
{
	struct client *c;
	int fd;
	uint64_t big, small;
	Mrd__MrEntry e;
	Mrd__Response *r1, *r2;
	struct timespec t0, t1;
	double waited;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	big = td_alloc(fd, 2, 4 * MiB);
	small = td_alloc(fd, 3, 64 * 1024);
	bind_failing(c);
	counted_ops.reg = slow_reg;
	td_lookup(fd, 4, small, 0, &e); /* 64 KiB: on the loop */
	start_slow_registration(fd, 5, big);
	td_send_free(fd, 6, small);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	td_pump();
	clock_gettime(CLOCK_MONOTONIC, &t1);
	waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	__atomic_store_n(&slow_reg_held, 0, __ATOMIC_RELEASE);
	r1 = td_recv_reply(fd, NULL, NULL);
	r2 = td_recv_reply(fd, NULL, NULL); /* the free waited behind it */
	ck_assert_ptr_nonnull(r1);
	ck_assert_ptr_nonnull(r2);
	mrd__response__free_unpacked(r1, NULL);
	mrd__response__free_unpacked(r2, NULL);
	ck_assert_msg(waited < NOT_WAITED_S, "the loop was stuck %.2f s in a Free's dereg, waiting "
		      "for a worker's registration in the client's PD", waited);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* A warm re-exec (SIGUSR2) execs with the clients connected: MRs mrd made in a client's own
 * context would outlive it there (the client's fd keeps the context), pinning pages the next
 * mrd knows nothing of. handover_unbind_clients, the re-exec's last step before execv,
 * deregisters them, after the workers end (a registration under way lands first). */
START_TEST(test_reexec_unbinds_first)
{
	struct td_blocker blk;
	struct client *c;
	int fd;
	uint64_t a, big;
	struct provider *p;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 64 * 1024);
	big = td_alloc(fd, 3, 4 * MiB);
	p = bind_soft(c);
	td_lookup(fd, 4, a, 0, NULL);
	td_block_worker(&blk);
	td_send_lookup(fd, 5, big); /* on the worker, behind the blocker */
	td_pump();
	ck_assert_uint_eq(mrs_of(p), 1);
	ck_assert_int_eq(write(blk.fd[1], "x", 1), 1); /* let it go, as the drain would */
	handover_unbind_clients(td_manager);
	ck_assert_ptr_null(c->bound);
	ck_assert_uint_eq(closed, 1); /* every MR gone, the 4 MiB one made meanwhile too */
	ck_assert_uint_eq(pinned(c), 0);
	close(blk.fd[0]);
	close(blk.fd[1]);
	close(fd);
	td_wait_domains_closed();
}
END_TEST


/* Found in review: a client PD's MR the device keeps at the unbind before a hand-over (the
 * client made the dereg fail) would outlive mrd in the client's context, over pages the next
 * mrd hands out again: the unbind says so, and the hand-over does not happen. The
 * connection gets no key after, of either PD. */
START_TEST(test_handover_refused_over_a_kept_mr)
{
	struct client *c;
	int fd;
	uint64_t a;
	struct provider *p;
	Mrd__Response *resp;

	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 64 * 1024);
	p = bind_failing(c);
	td_lookup(fd, 4, a, 0, NULL);
	__atomic_store_n(&fail_deregs, 1, __ATOMIC_RELEASE);
	ck_assert_uint_eq(handover_unbind_clients(td_manager), 1);
	ck_assert_ptr_null(c->bound);
	ck_assert_uint_eq(mrs_of(p), 1); /* kept, counted, held */
	ck_assert_uint_eq(pinned(c), 64 * 1024);
	td_send_lookup(fd, 5, a);
	resp = td_expect(fd, 5, ESTALE);
	mrd__response__free_unpacked(resp, NULL);
	td_free(fd, 6, a, 0); /* the dereg works now */
	ck_assert_uint_eq(handover_unbind_clients(td_manager), 0);
	finish(fd, -1);
}
END_TEST

/* A hand-over lets go of live clients' PDs: the windows they tracked are theirs, not mrd's to
 * deallocate (libmrd would bind a dead window again, and its handle number may be another
 * window's). One bound over mrd's MR keeps that MR, and the hand-over is refused, as above. */
START_TEST(test_handover_keeps_live_windows)
{
	static const uint32_t handle = 3;
	struct client *c;
	int fd;
	uint64_t a;

	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 64 * 1024);
	bind_windowed(c);
	td_lookup(fd, 4, a, 0, NULL);
	fake_window_live[handle] = fake_window_bound[handle] = true;
	mrd__response__free_unpacked(track(fd, 5, &handle, 1, NULL, 0, 0), NULL);
	ck_assert_uint_eq(handover_unbind_clients(td_manager), 1);
	ck_assert_uint_eq(windows_deallocated, 0);
	ck_assert(fake_window_live[handle]);
	fake_window_live[handle] = false; /* the client deallocates it */
	td_free(fd, 6, a, 0);
	ck_assert_uint_eq(handover_unbind_clients(td_manager), 0);
	finish(fd, -1);
}
END_TEST

/* Found in review: the same for a run quarantined because a client PD's MR over it was kept,
 * also once that client is gone: the quarantine is not handed over (save_arena walks the
 * arena's live runs), so the next mrd would hand the pages out again. */
START_TEST(test_handover_refused_over_a_quarantined_client_mr)
{
	struct client *c, *other;
	int ofd = td_hello_client(1000, &other), fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 64 * 1024);
	struct domain *d;
	unsigned removed;

	td_alloc(ofd, 3, 4096);
	d = c->domain;
	bind_failing(c);
	td_lookup(fd, 4, a, 0, NULL);
	__atomic_store_n(&fail_deregs, 1, __ATOMIC_RELEASE);
	td_free(fd, 5, a, 0);
	ck_assert_uint_eq(d->reg.quarantine.n, 1);
	close(fd);
	td_pump_until(td_manager->n_clients <= 1);
	ck_assert_uint_eq(handover_unbind_clients(td_manager), 1);
	(void)domain_flush(d, false, false, &removed); /* the dereg works now */
	ck_assert_uint_eq(d->reg.quarantine.n, 0);
	ck_assert_uint_eq(handover_unbind_clients(td_manager), 0);
	close(ofd);
	td_wait_domains_closed();
	ck_assert_uint_eq(closed, 1);
}
END_TEST

/* Found in review: a failure of the domains' device makes every bound client's lookups ENODEV, also
 * those of a client bound on another served device whose PD is fine (mr_cache_lookup checks
 * home(c)->keys_stale first, before its own table). Simulated: the domain's keys_stale set as
 * lose_domain sets it; the bound PD (a second soft provider) is not lost. */
START_TEST(test_domain_failure_spares_other_devices)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 64 * 1024);
	Mrd__Response *resp;

	bind_soft(c);
	td_lookup(fd, 3, a, 0, NULL);
	ck_assert(!provider_lost(c->bound->provider));
	c->domain->reg.cache.keys_stale = true;
	td_send_lookup(fd, 4, a);
	resp = td_recv_reply(fd, NULL, NULL);
	c->domain->reg.cache.keys_stale = false;
	ck_assert_ptr_nonnull(resp);
	ck_assert_msg(resp->status == 0, "a lookup in a healthy bound PD, cached already, got "
		      "error %d: \"%s\"", (int)resp->status, resp->message);
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* Found in review: BindPd is refused (EBUSY) once an MrLookup handed out domain-PD keys, but not
 * after a MempoolRegister, which hands out domain-PD keys as well (c->looked_up is set by
 * MrLookup alone). /dev/null reaches past the EBUSY check only when it did not apply. */
/* A client leaving with thousands of MRs in its own PD holds the loop for none of them: mrd
 * deregisters them a share of the loop's budget a turn (core/domain.h), and lets the PD's
 * context go only once the last is gone. BOUND_LEAVER_MRS page allocations, each with its MR
 * in the PD, a page of another client's between them (so that no two MRs' pages merge in the
 * pin map, whose rebuild makes each unpin cost more the more are left). Their deregistration
 * in one go held the loop 0.6-1 s here (client_free); a share is a few MRs, under a
 * millisecond. The loop's hold is measured in-process, so no scheduling is in it: 400 ms (the
 * bound of tests/test-leave.c) is far above a share and under the old hold. */
#define BOUND_LEAVER_MRS 16000 /* 4,000 under a sanitizer (minutes there; the plain build
				* checks the hold) */
#define BOUND_HOLD_MS 400
START_TEST(test_leaver_of_thousands_of_bound_mrs)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), other = td_hello_client(1000, NULL);
	static uint64_t at[BOUND_LEAVER_MRS];
	const unsigned n = test_under_sanitizer() ? 4000 : BOUND_LEAVER_MRS;
	struct domain *d;
	double t0, held;

	for (unsigned i = 0; i < n; i++) {
		at[i] = td_alloc(fd, 10 + (uint64_t)i, 4096);
		(void)td_alloc(other, 10 + (uint64_t)i, 4096);
	}
	d = c->domain;
	bind_failing(c); /* fails none: it counts the MRs still live at close */
	for (unsigned i = 0; i < n; i++)
		td_lookup(fd, 100000 + (uint64_t)i, at[i], 0, NULL);
	ck_assert_uint_eq(c->bound->cache.n_mrs, n);
	t0 = test_now_s();
	client_free(c);
	held = test_now_s() - t0;
	close(fd);
	printf("a client leaving with %u MRs in its own PD held the loop %.1f ms\n",
	       n, held * 1e3);
	ck_assert_msg(held < BOUND_HOLD_MS / 1e3, "a client leaving with %u MRs in its PD held the "
		      "loop %.1f ms", n, held * 1e3);
	/* The rest goes turn by turn; the PD's context closes after its last MR. */
	ck_assert_uint_eq(closed, 0);
	td_pump_until(closed != 0);
	ck_assert_uint_eq(closed, 1);
	ck_assert_uint_eq(live_at_close, 0);
	ck_assert_uint_eq(d->mem.allocations.n, n);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(other);
	td_wait_domains_closed();
}
END_TEST

/* c binds its PD, has MRs of its own made over the 64 pages at, and leaves (fd closes too):
 * the cache its MRs were in, which lives on while they go. */
static struct mr_cache *bind_64_and_leave(struct client *c, int fd, const uint64_t *at)
{
	struct mr_cache *left;

	bind_failing(c);
	for (unsigned i = 0; i < 64; i++)
		td_lookup(fd, 100 + i, at[i], 0, NULL);
	left = &c->bound->cache;
	client_free(c);
	close(fd);
	return left;
}

/* A client with 64 MRs in its PD leaves: a share goes, the rest and the PD stay. */
static void leave_bound(void)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t at[64];
	struct mr_cache *left;

	for (unsigned i = 0; i < 64; i++)
		at[i] = td_alloc(fd, 10 + i, 4096);
	left = bind_64_and_leave(c, fd, at);
	ck_assert_uint_gt(left->n_mrs, 0);
	ck_assert_uint_lt(left->n_mrs, 64);
	ck_assert_uint_eq(closed, 0);
}

/* A client whose PD's MRs are all over another client's memory leaves: they go all the same,
 * then the PD, though it owns nothing else. */
START_TEST(test_bound_client_owning_nothing_leaves)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), other = td_hello_client(1000, NULL);
	uint64_t at[64];
	struct mr_cache *left;

	td_free(fd, 2, td_alloc(fd, 1, 4096), 0); /* joined, owning nothing */
	for (unsigned i = 0; i < 64; i++)
		at[i] = td_alloc(other, 10 + i, 4096);
	left = bind_64_and_leave(c, fd, at);
	ck_assert_uint_gt(left->n_mrs, 0);
	td_pump_until(closed != 0);
	ck_assert_uint_eq(closed, 1);
	ck_assert_uint_eq(live_at_close, 0);
	close(other);
	td_wait_domains_closed();
}
END_TEST

/* A re-execution, and a stop, in the middle of it let the rest go first, then the PD. */
START_TEST(test_reexec_and_stop_while_a_bound_client_leaves)
{
	leave_bound();
	td_stop();
	ck_assert_uint_eq(closed, 1);
	ck_assert_uint_eq(live_at_close, 0);
	td_start_small(NULL);
	leave_bound();
	ck_assert_uint_eq(handover_unbind_clients(td_manager), 0);
	ck_assert_uint_eq(closed, 1);
	ck_assert_uint_eq(live_at_close, 0);
}
END_TEST

START_TEST(test_bind_after_mempool_register_refused)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), null = open("/dev/null", O_RDWR | O_CLOEXEC);
	uint64_t a = td_alloc(fd, 2, 128 * 1024);
	uint64_t starts[1] = { a }, lengths[1] = { 64 * 1024 };
	Mrd__Response *resp;

	td_send_mempool_register(fd, 3, "pool", starts, lengths, 1, false);
	resp = td_expect(fd, 3, 0);
	mrd__response__free_unpacked(resp, NULL);
	{
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__BindPdRequest q = MRD__BIND_PD_REQUEST__INIT;

		q.pd_handle = 1;
		req.id = 4;
		req.body_case = MRD__REQUEST__BODY_BIND_PD;
		req.bind_pd = &q;
		td_send_request(fd, &req, &null, 1);
		resp = td_recv_reply(fd, NULL, NULL);
	}
	ck_assert_ptr_nonnull(resp);
	ck_assert_msg(resp->status == EBUSY, "BindPd after a MempoolRegister: status %d \"%s\", "
		      "not EBUSY", (int)resp->status, resp->message);
	mrd__response__free_unpacked(resp, NULL);
	close(null);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* Found in review: a run quarantined with a bound client's kept MR; that client then has a worker
 * register a big run in its PD (the client provider's lock held for the whole pin). A flush
 * (registrar_retry_quarantine: mr_cache_deregister on the loop, unconditionally) waits on
 * that lock: the loop stalls for the client-chosen duration of its registration. */
START_TEST(test_flush_never_waits_for_a_bound_registration)
{
	struct client *c;
	int fd;
	uint64_t big, small;
	unsigned removed;
	Mrd__Response *r1;
	struct timespec t0, t1;
	double waited;
	struct domain *d;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	big = td_alloc(fd, 2, 4 * MiB);
	small = td_alloc(fd, 3, 64 * 1024);
	d = c->domain;
	bind_failing(c);
	counted_ops.reg = slow_reg;
	td_lookup(fd, 4, small, 0, NULL);
	__atomic_store_n(&fail_deregs, 2, __ATOMIC_RELEASE); /* the free's, and the flush's */
	td_free(fd, 5, small, 0);
	ck_assert_uint_eq(d->reg.quarantine.n, 1);
	start_slow_registration(fd, 6, big);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	(void)domain_flush(d, false, false, &removed);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	__atomic_store_n(&slow_reg_held, 0, __ATOMIC_RELEASE);
	r1 = td_recv_reply(fd, NULL, NULL);
	ck_assert_ptr_nonnull(r1);
	mrd__response__free_unpacked(r1, NULL);
	ck_assert_msg(waited < NOT_WAITED_S, "the loop was stuck %.2f s in a flush's quarantine "
		      "retry, waiting for a worker's registration in the client's PD", waited);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("bound-pd");
	TCase *tc = tcase_create("bound-pd");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_keys_are_of_the_bound_pd);
	tcase_add_test(tc, test_domain_mrs_are_not_the_pds);
	tcase_add_test(tc, test_window_mr_is_the_bound_pds);
	tcase_add_test(tc, test_window_mr_refuses_another_handles_memory);
	tcase_add_test(tc, test_window_only_in_the_bound_pd);
	tcase_add_loop_test(tc, test_alias_mr_takes_windows, 0, 2);
	tcase_add_test(tc, test_free_deregisters_before_the_pages_go);
	tcase_add_test(tc, test_end_drops_every_mr);
	tcase_add_test(tc, test_end_while_a_worker_registers);
	tcase_add_test(tc, test_lookups_wait_for_the_run);
	tcase_add_test(tc, test_free_while_a_worker_registers);
	tcase_add_test(tc, test_quota_holds);
	tcase_add_test(tc, test_domain_pd_requests_refused);
	tcase_add_test(tc, test_read_only_refused);
	tcase_add_test(tc, test_alias_registers_at_the_alias);
	tcase_add_test(tc, test_alias_span_is_all_the_mrs_cover);
	tcase_add_test(tc, test_alias_second_span_has_its_own_mr);
	tcase_add_test(tc, test_alias_span_dropped);
	tcase_add_test(tc, test_alias_span_dropped_while_registering);
	tcase_add_test(tc, test_alias_span_drop_never_waits_on_the_loop);
	tcase_add_test(tc, test_alias_span_drop_beside_an_mr_let_go_before);
	tcase_add_test(tc, test_alias_span_drop_takes_the_loops_share);
	tcase_add_test(tc, test_kept_mrs_bound_the_spans);
	tcase_add_test(tc, test_alloc_registers_at_once);
	tcase_add_test(tc, test_dump_shows_client_pds_to_admins);
	tcase_add_test(tc, test_clients_view_counts_client_pd_mrs);
	tcase_add_test(tc, test_on_demand_in_the_bound_pd);
	tcase_add_test(tc, test_bind_refuses_what_is_no_uverbs_fd);
	tcase_add_test(tc, test_kept_at_the_end);
	tcase_add_test(tc, test_kept_at_the_end_big);
	tcase_add_test(tc, test_quarantine_outlives_the_client);
	tcase_add_test(tc, test_left_windows_go_before_the_mrs);
	tcase_add_test(tc, test_left_windows_free_a_quarantined_run);
	tcase_add_test(tc, test_left_windows_go_a_share_a_turn);
	tcase_add_test(tc, test_left_windows_wait_for_a_bound_registration);
	tcase_add_test(tc, test_window_track_bounded);
	tcase_add_test(tc, test_loop_never_waits_for_a_bound_registration);
	tcase_add_test(tc, test_reexec_unbinds_first);
	tcase_add_test(tc, test_handover_refused_over_a_kept_mr);
	tcase_add_test(tc, test_handover_keeps_live_windows);
	tcase_add_test(tc, test_handover_refused_over_a_quarantined_client_mr);
	tcase_add_test(tc, test_domain_failure_spares_other_devices);
	tcase_add_test(tc, test_bind_after_mempool_register_refused);
	tcase_add_test(tc, test_flush_never_waits_for_a_bound_registration);
	suite_add_tcase(s, tc);
	/* 32,000 requests to set it up: seconds, more under the sanitizers. */
	tc = tcase_create("leave");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_leaver_of_thousands_of_bound_mrs);
	tcase_add_test(tc, test_reexec_and_stop_while_a_bound_client_leaves);
	tcase_add_test(tc, test_bound_client_owning_nothing_leaves);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
