/* SPDX-License-Identifier: MIT */
/* ODP-style lazy registration in-process, on the soft provider's emulated ODP: children made
 * by lookups and prefetches (chunk cut to allocation), keys checked by DMA, exactly one child
 * when creators race, prefetch racing with free, read-only memory, the bounds, and teardown
 * with work pending; neighbours in a chunk freed under working workers (work reads its own
 * allocation's children alone), flushes that wait for room, and faults off a busy loop. */
#include <check.h>
#include <event2/event.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "control/client.h"
#include "core/domain.h"
#include "control/manager.h"
#include "registration/odp.h"
#include "provider/provider.h"
#include "status-page.h"
#include "time-util.h"
#include "base/worker-pool.h"
#include "test-daemon.h"
#include "test-util.h"
#include "check-run.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

static void start(const char *policy, const char *workers)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.odp_chunk=2M", workers, policy,
				   NULL };

	td_stop();
	td_start(settings);
}

static void setup(void) { start("cache.policy=contig", "cache.workers=2"); }
static void teardown(void) { td_stop(); }

static uint64_t alloc(int fd, uint64_t id, uint64_t size, uint32_t flags)
{
	return td_alloc_flags(fd, id, size, flags);
}

static void send_prefetch(int fd, uint64_t id, uint64_t addr, uint64_t len, unsigned advice,
			  bool flush)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PrefetchRequest q = MRD__PREFETCH_REQUEST__INIT;

	q.address = addr;
	q.length = len;
	q.advice = advice;
	q.flush = flush;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &q;
	td_send_request(fd, &req, NULL, 0);
}

static void prefetch(int fd, uint64_t id, uint64_t addr, uint64_t len, unsigned advice,
		     bool flush, int error)
{
	send_prefetch(fd, id, addr, len, advice, flush);
	td_expect_free(fd, id, error);
}

START_TEST(test_lookups_make_children)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = alloc(fd, 2, 8 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP), gen;
	Mrd__MrEntry e0, e2, again;
	struct provider_stats ps;
	struct domain *d = c->domain;

	ck_assert_uint_eq(a % (2 * MiB), 0);
	td_lookup(fd, 3, a + 100, 0, &e0);
	ck_assert_uint_eq(e0.start, a); /* its chunk, cut to the allocation */
	ck_assert_uint_eq(e0.end, a + 2 * MiB);
	td_lookup(fd, 4, a + 5 * MiB, 0, &e2);
	ck_assert_uint_eq(e2.start, a + 4 * MiB);
	td_lookup(fd, 5, a + 2 * MiB - 1, 0, &again); /* from the table now */
	ck_assert_uint_eq(again.lkey, e0.lkey);
	ck_assert_uint_eq(d->reg.odp.children, 2);
	ck_assert_uint_eq(d->reg.odp.stats.children_created, 2);
	ck_assert_uint_eq(d->reg.odp.stats.faults, 2);
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 2);
	ck_assert_uint_eq(ps.pinned_bytes, 0); /* on demand: nothing pinned */
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);

	/* The keys move bytes; the device faults the pages in as it goes. */
	strcpy((char *)(uintptr_t)(a + 64), "on demand");
	td_dma(fd, 6, PROVIDER_DMA_WRITE, &e0, a + 64, &e2, a + 4 * MiB + 8, 10, 0);
	ck_assert_str_eq((char *)(uintptr_t)(a + 4 * MiB + 8), "on demand");
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_gt(ps.odp_faults, 0);

	/* Freed: children zapped, out of the table, destroyed; their keys are dead. */
	gen = d->mem.status.page->generation;
	td_free(fd, 7, a, 0);
	ck_assert_uint_gt(d->mem.status.page->generation, gen);
	ck_assert_uint_eq(d->reg.odp.children, 0);
	ck_assert_uint_eq(d->reg.odp.stats.invalidations, 2);
	ck_assert_uint_eq(d->reg.odp.stats.children_destroyed, 2);
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0);
	td_dma(fd, 8, PROVIDER_DMA_WRITE, &e0, a + 64, &e2, a + 4 * MiB + 8, 10, ENOKEY);
	td_lookup(fd, 9, a, ENOENT, NULL);
	close(fd);
}
END_TEST

START_TEST(test_policy_per_domain)
{
	struct client *c;
	int fd;
	uint64_t a, b;
	Mrd__MrEntry e;

	start("policies.uid-1000=odp", "cache.workers=2"); /* its domain's policy alone */
	fd = td_hello_client(1000, &c);
	a = alloc(fd, 2, 3 * MiB, 0);
	td_lookup(fd, 3, a + 2 * MiB + 5, 0, &e);
	ck_assert_uint_eq(e.start, a + 2 * MiB);
	ck_assert_uint_eq(e.end, a + 3 * MiB); /* cut to the allocation */
	/* Read-only memory gets read-only children: a write into it is refused. */
	b = alloc(fd, 4, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_READ_ONLY);
	{
		Mrd__MrEntry ro;

		td_lookup(fd, 5, b, 0, &ro);
		td_dma(fd, 6, PROVIDER_DMA_WRITE, &e, a + 2 * MiB, &ro, b, 8, EACCES);
		td_dma(fd, 7, PROVIDER_DMA_WRITE, &e, a + 2 * MiB, &e, a + 2 * MiB + 64, 8, 0);
	}
	/* Another domain keeps [cache] policy: contig, one pinned MR over the allocation. */
	{
		int other = td_hello_client(2000, NULL);
		uint64_t o = alloc(other, 2, 3 * MiB, 0);
		Mrd__MrEntry oe;

		td_lookup(other, 3, o + 2 * MiB + 5, 0, &oe);
		ck_assert_uint_eq(oe.start, o);
		ck_assert_uint_eq(oe.end, o + 3 * MiB);
		close(other);
	}
	close(fd);
}
END_TEST

START_TEST(test_prefetch)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = alloc(fd, 2, 8 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	uint64_t b = alloc(fd, 3, 4 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP), misses;
	struct domain *d = c->domain;
	struct provider_stats ps;

	prefetch(fd, 4, a, 8 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_WRITE, true, 0);
	ck_assert_uint_eq(d->reg.odp.children, 4);
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_requests, 1);
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_pages, 8 * MiB / 4096);
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_ge(ps.odp_prefetched_pages, 8 * MiB / 4096);
	/* Their entries went into the table: lookups find them without a miss. */
	misses = d->reg.cache.misses;
	td_lookup(fd, 5, a + 7 * MiB, 0, NULL);
	td_lookup(fd, 6, a + 1, 0, NULL);
	ck_assert_uint_eq(d->reg.cache.misses, misses);

	/* No-fault advice makes the children and faults nothing in. */
	prefetch(fd, 7, b + 1 * MiB, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT, true, 0);
	ck_assert_uint_eq(d->reg.odp.children, 6);
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_pages, 8 * MiB / 4096);
	/* Without flush the answer comes once queued, the work after. */
	prefetch(fd, 8, b, 4 * MiB, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	td_pump_until_zero(&d->reg.odp.jobs);
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_pages, 12 * MiB / 4096);
	close(fd);
}
END_TEST

START_TEST(test_prefetch_errors)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), other = td_hello_client(2000, NULL);
	uint64_t ro = alloc(fd, 2, 2 * MiB,
			    MRD__ALLOC_FLAGS__ALLOC_ODP | MRD__ALLOC_FLAGS__ALLOC_READ_ONLY);
	uint64_t pinned = alloc(fd, 3, 2 * MiB, 0);
	uint64_t theirs = alloc(other, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	struct td_blocker b1, b2;

	prefetch(fd, 4, ro, 4096, MRD__PREFETCH_ADVICE__PREFETCH_WRITE, true, EINVAL);
	prefetch(fd, 5, ro, 4096, MRD__PREFETCH_ADVICE__PREFETCH, true, 0);
	prefetch(fd, 6, pinned, 4096, MRD__PREFETCH_ADVICE__PREFETCH, true, EINVAL);
	prefetch(fd, 7, ro + 1 * MiB, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH, true, EFAULT);
	prefetch(fd, 8, theirs, 4096, MRD__PREFETCH_ADVICE__PREFETCH, true, EFAULT);
	prefetch(fd, 9, ro, 4096, 3, true, EINVAL);
	prefetch(fd, 10, ro, 0, MRD__PREFETCH_ADVICE__PREFETCH, true, EINVAL);
	/* At most 16 queued per client. */
	td_block_worker(&b1);
	td_block_worker(&b2);
	for (uint64_t i = 0; i < ODP_PREFETCH_IN_FLIGHT; i++)
		prefetch(fd, 20 + i, ro, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	prefetch(fd, 40, ro, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false, EAGAIN);
	td_unblock_worker(&b1);
	td_unblock_worker(&b2);
	td_pump_until_zero(&c->domain->reg.odp.jobs);
	ck_assert_uint_eq(c->owner.n_prefetches, 0);
	close(fd);
	close(other);
}
END_TEST

/* Two prefetches and a lookup race to make the same child: exactly one is installed. */
START_TEST(test_one_child_under_races)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	struct provider_stats ps;

	for (uint64_t round = 0; round < 40; round++) {
		uint64_t a = alloc(fd, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
		struct domain *d = c->domain;
		uint64_t created = d->reg.odp.stats.children_created;

		send_prefetch(fd, 3, a, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT, false);
		send_prefetch(fd, 4, a + 4096, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false);
		td_expect_free(fd, 3, 0);
		td_expect_free(fd, 4, 0);
		td_lookup(fd, 5, a + 8192, 0, NULL); /* while the workers may still be at it */
		td_pump_until_zero(&d->reg.odp.jobs);
		ck_assert_uint_eq(d->reg.odp.children, 1);
		ck_assert_uint_eq(d->reg.odp.stats.children_created, created + 1);
		provider_stats(d->reg.base.provider, &ps);
		ck_assert_uint_eq(ps.mrs, 1);
		td_free(fd, 6, a, 0);
	}
	close(fd);
}
END_TEST

/* A free while prefetch work holds the memory's child: the child outlives the work, the free
 * answers after both, and the child the work made for the freed memory never gets a key. */
START_TEST(test_prefetch_racing_free)
{
	struct client *c;
	struct td_blocker b;
	struct provider_stats ps;
	struct domain *d;
	uint64_t a;
	int fd;

	start("cache.policy=contig", "cache.workers=1");
	fd = td_hello_client(1000, &c);
	a = alloc(fd, 2, 4 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	d = c->domain;
	td_lookup(fd, 3, a, 0, NULL); /* the first chunk's child exists */
	td_block_worker(&b);
	prefetch(fd, 4, a, 4 * MiB, MRD__PREFETCH_ADVICE__PREFETCH, false, 0); /* holds it */
	td_send_free(fd, 5, a);
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&c->pending)); /* the Free waits for the held child */
	ck_assert_uint_eq(d->mem.allocations.n, 0);
	ck_assert_uint_eq(d->reg.odp.children, 0); /* out of the index and the table already */
	td_unblock_worker(&b);
	td_expect_free(fd, 5, 0);
	ck_assert_uint_eq(d->reg.odp.stats.children_destroyed, 2);
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert_uint_eq(d->reg.odp.zombies, 0);
	td_lookup(fd, 6, a, ENOENT, NULL);
	close(fd);
}
END_TEST

START_TEST(test_teardown_with_work_pending)
{
	struct td_blocker b;
	uint64_t a;
	int fd;

	start("cache.policy=contig", "cache.workers=1");
	fd = td_hello_client(1000, NULL);
	a = alloc(fd, 2, 4 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	td_lookup(fd, 3, a + 3 * MiB, 0, NULL);
	td_block_worker(&b);
	prefetch(fd, 4, a, 4 * MiB, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	close(fd); /* gone, and its memory, while the work waits */
	td_pump();
	ck_assert_uint_eq(td_manager->n_clients, 0);
	ck_assert_uint_eq(td_manager->core.n_domains, 1); /* the work holds it */
	td_unblock_worker(&b);
	td_wait_domains_closed();
}
END_TEST

/* A child a worker made is linked by a lookup before the work's completion ran, then its memory
 * is freed: it becomes a zombie once, and goes once. (The loop is driven by hand here, so the
 * order is the test's.) */
START_TEST(test_child_linked_then_freed_before_completion)
{
	struct client *c;
	struct domain *d;
	struct allocation *al;
	struct mr_entry e;
	struct td_blocker b;
	char why[128];
	uint64_t a;
	int fd;

	start("cache.policy=contig", "cache.workers=1");
	fd = td_hello_client(1000, &c);
	a = alloc(fd, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	d = c->domain;
	td_block_worker(&b);
	prefetch(fd, 3, a, 4096, MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT, false, 0);
	ck_assert_int_eq(write(b.fd[1], "x", 1), 1); /* the worker goes; the loop is not run */
	al = domain_allocation_containing(d, a);
	ck_assert_ptr_nonnull(al);
	for (int i = 0; i < 2000; i++) {
		if (__atomic_load_n(&reg_allocation_of(al)->odp_slots->child[0], __ATOMIC_ACQUIRE))
			break; /* installed */
		usleep(1000);
	}
	ck_assert_int_eq(registrar_lookup(&d->reg, a, &e, why, sizeof(why), NULL), 0);
	ck_assert_int_eq(domain_free_allocation(d, al, NULL), 0); /* deferred: work on it */
	ck_assert_uint_eq(d->reg.odp.zombies, 1);
	td_pump_until_zero(&d->reg.odp.jobs);
	ck_assert(b.done);
	close(b.fd[0]);
	close(b.fd[1]);
	ck_assert_uint_eq(d->reg.odp.zombies, 0);
	ck_assert_uint_eq(d->reg.odp.stats.children_destroyed, 1);
	close(fd);
}
END_TEST

/* A Free of memory with prefetch work queued (no child made yet) waits for the work: the
 * pages cannot go to anyone else — another domain — while a worker may still register and
 * fault them in. */
START_TEST(test_free_waits_for_queued_prefetch)
{
	struct client *c;
	struct td_blocker b;
	struct provider_stats ps;
	struct domain *d;
	uint64_t a, o;
	int fd, other;

	start("cache.policy=contig", "cache.workers=1");
	fd = td_hello_client(1000, &c);
	other = td_hello_client(2000, NULL);
	a = alloc(fd, 2, 128 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP); /* an arena of its own */
	d = c->domain;
	td_block_worker(&b);
	prefetch(fd, 3, a, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	td_send_free(fd, 4, a);
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&c->pending)); /* the Free waits */
	o = alloc(other, 2, 128 * MiB, 0);
	ck_assert_uint_ne(o, a); /* the pages did not go back */
	td_unblock_worker(&b);
	td_expect_free(fd, 4, 0);
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0); /* the child the work made for it went too */
	ck_assert_uint_eq(d->reg.odp.stats.children_destroyed, d->reg.odp.stats.children_created);
	close(fd);
	close(other);
}
END_TEST

/* One CPU for the loop and the worker, the worker at SCHED_IDLE (it inherits both from the
 * thread that starts it): it runs only while the loop naps, and the loop, waking, preempts it
 * wherever it is — inside a walk of a slot, most of the time, holding a neighbour's child. The
 * loop's own CPUs go to *ret_cpus. */
static void start_with_idle_worker(cpu_set_t *ret_cpus)
{
	struct sched_param none = { 0 };
	cpu_set_t one;
	int cpu = -1;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(*ret_cpus), ret_cpus), 0);
	for (int i = 0; i < CPU_SETSIZE && cpu < 0; i++)
		if (CPU_ISSET(i, ret_cpus))
			cpu = i;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	ck_assert_int_eq(sched_setscheduler(0, SCHED_IDLE, &none), 0);
	start("cache.policy=contig", "cache.workers=1");
	ck_assert_int_eq(sched_setscheduler(0, SCHED_OTHER, &none), 0);
	ck_assert_int_eq(prctl(PR_SET_TIMERSLACK, 1UL), 0); /* short naps really are short */
}

/* Prefetch workers make and install children while the loop frees other children of the same
 * chunk: 4 KiB allocations of several clients of one domain share one 2 MiB chunk; between naps
 * that let the worker run, the loop frees neighbours (whose allocations have no work) and makes
 * new ones. Work reads its own allocation's slots alone, so each neighbour's child goes at once
 * (no zombie waits for others' work), and nothing the work touches is freed under it (ASan sees
 * it when it is, within the first rounds: the bug of an older chunk-list design). */
START_TEST(test_neighbours_freed_under_prefetch)
{
	enum { CLIENTS = 4, NEIGHBOURS = 384, TARGETS = 4 * ODP_PREFETCH_IN_FLIGHT, BATCH = 96,
	       ROUNDS = 100 };
	/* On a crowded CPU the idle worker gets little: fewer rounds then (the old bug showed
	 * within the first few). */
	uint64_t deadline = now_usec(CLOCK_MONOTONIC) + 10 * USEC_PER_SEC;
	struct allocation *nb[NEIGHBOURS], *tg[TARGETS];
	struct client *cl[CLIENTS];
	int fds[CLIENTS];
	unsigned seed = 1;
	struct domain *d;
	struct mr_entry e;
	cpu_set_t cpus;
	char why[256];

	start_with_idle_worker(&cpus);
	for (int i = 0; i < CLIENTS; i++) {
		fds[i] = td_hello_client(1000, &cl[i]);
		ck_assert_int_eq(client_get_domain(cl[i], &d, (char[256]){ 0 }, 256), 0); /* all in one domain */
	}
	for (int i = 0; i < NEIGHBOURS; i++) {
		ck_assert_int_eq(domain_alloc(d, &cl[i % CLIENTS]->owner, 4 * KiB, 0, false, false,
					      false, &nb[i], why, sizeof(why)), 0);
		nb[i]->odp = true;
		ck_assert_int_eq(odp_fault(&d->reg.odp, reg_allocation_of(nb[i]),
					   allocation_address(nb[i]), &e, why, sizeof(why), NULL),
				 0);
	}
	for (int round = 0; round < ROUNDS && now_usec(CLOCK_MONOTONIC) < deadline; round++) {
		for (int i = 0; i < TARGETS; i++) {
			struct reg_owner *owner = &cl[i % CLIENTS]->owner;

			ck_assert_int_eq(domain_alloc(d, owner, 4 * KiB, 0, false, false, false,
						      &tg[i], why, sizeof(why)), 0);
			tg[i]->odp = true;
			ck_assert_int_eq(odp_prefetch(&d->reg.odp, owner, reg_allocation_of(tg[i]),
						      allocation_address(tg[i]),
						      4 * KiB, ODP_PREFETCH_NO_FAULT, NULL, why,
						      sizeof(why)), 0);
		}
		while (d->reg.odp.jobs > 0) {
			unsigned jobs = d->reg.odp.jobs;

			usleep(20); /* the worker walks */
			for (int i = 0; i < BATCH; i++) {
				int k = (int)(rand_r(&seed) % NEIGHBOURS);
				struct reg_owner *owner =
					container_of(nb[k]->owner, struct reg_owner, mem);

				ck_assert_int_eq(domain_free_allocation(d, nb[k], NULL), 0);
				ck_assert_uint_eq(d->reg.odp.zombies, 0);
				ck_assert_int_eq(domain_alloc(d, owner, 4 * KiB, 0, false, false,
							      false, &nb[k], why, sizeof(why)), 0);
				nb[k]->odp = true;
				ck_assert_int_eq(odp_fault(&d->reg.odp, reg_allocation_of(nb[k]),
							   allocation_address(nb[k]), &e,
							   why, sizeof(why), NULL), 0);
			}
			event_base_loop(td_manager->core.base, EVLOOP_NONBLOCK);
			if (d->reg.odp.jobs == jobs)
				usleep(1000); /* it got nowhere (a sanitizer reporting?): let it run */
		}
		for (int i = 0; i < TARGETS; i++)
			ck_assert_int_eq(domain_free_allocation(d, tg[i], NULL), 0);
	}
	ck_assert_uint_eq(d->reg.odp.zombies, 0);
	for (int i = 0; i < CLIENTS; i++)
		close(fds[i]);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(cpus), &cpus), 0);
}
END_TEST

/* Nothing has come for the test on fd (after the loop ran). */
static void expect_no_reply(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	td_pump();
	ck_assert_int_eq(poll(&p, 1, 0), 0);
}

/* Work on an allocation holds its own children alone: a neighbour's child in the same chunk
 * goes whole (its MR and its memory, the Free answered at once) while the neighbour's work
 * runs, and that work then completes on its own children. */
START_TEST(test_zombie_waits_for_its_own_work_only)
{
	struct client *c1, *c2;
	struct td_blocker b1;
	struct provider_stats ps;
	struct domain *d;
	uint64_t a, b, destroyed;
	int fd1, fd2;

	start("cache.policy=contig", "cache.workers=1");
	fd1 = td_hello_client(1000, &c1);
	fd2 = td_hello_client(1000, &c2);
	a = alloc(fd1, 2, 4 * KiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	b = alloc(fd2, 2, 4 * KiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	d = c1->domain;
	ck_assert_uint_eq((a - d->reg.odp.base) >> d->reg.odp.chunk_shift,
			  (b - d->reg.odp.base) >> d->reg.odp.chunk_shift); /* one chunk */
	td_lookup(fd1, 3, a, 0, NULL);
	td_lookup(fd2, 3, b, 0, NULL);
	td_block_worker(&b1);
	prefetch(fd2, 4, b, 4 * KiB, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	destroyed = d->reg.odp.stats.children_destroyed;
	td_free(fd1, 4, a, 0); /* answered at once: no work on a */
	ck_assert_uint_eq(d->reg.odp.stats.children_destroyed, destroyed + 1);
	ck_assert_uint_eq(d->reg.odp.zombies, 0); /* its memory went too */
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1); /* b's */
	td_unblock_worker(&b1);
	td_pump_until_zero(&d->reg.odp.jobs);
	ck_assert_uint_eq(d->reg.odp.children, 1);
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_pages, 1);
	close(fd1);
	close(fd2);
}
END_TEST

START_TEST(test_flush_waits_for_room)
{
	struct client *c;
	struct td_blocker b;
	struct domain *d;
	uint64_t a, pages;
	int fd, other;

	start("cache.policy=contig", "cache.workers=1");
	fd = td_hello_client(1000, &c);
	other = td_hello_client(1000, NULL);
	a = alloc(fd, 2, 8 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	d = c->domain;
	td_block_worker(&b);
	for (uint64_t i = 0; i < ODP_PREFETCH_IN_FLIGHT; i++)
		prefetch(fd, 10 + i, a, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	prefetch(fd, 30, a, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false, EAGAIN);
	send_prefetch(fd, 31, a + 2 * MiB, 6 * MiB, MRD__PREFETCH_ADVICE__PREFETCH, true);
	td_send_lookup(fd, 32, a); /* read and answered while the flush waits */
	td_expect_free(fd, 32, 0);
	expect_no_reply(fd);
	ck_assert_ptr_nonnull(LIST_FIRST(&c->pending));
	ck_assert_uint_eq(d->reg.odp.jobs, ODP_PREFETCH_IN_FLIGHT); /* it waits, not queued */
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_requests, ODP_PREFETCH_IN_FLIGHT + 1);
	/* Another client of the domain has room of its own. */
	prefetch(other, 2, a, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	pages = d->reg.odp.stats.prefetch_pages;
	td_unblock_worker(&b);
	td_expect_free(fd, 31, 0);
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_pages, pages + ODP_PREFETCH_IN_FLIGHT + 1 +
							  6 * MiB / 4096); /* done */
	td_pump_until_zero(&d->reg.odp.jobs);
	ck_assert_uint_eq(c->owner.n_prefetches, 0);
	close(fd);
	close(other);
}
END_TEST

/* The domain's 256 queued are room for flushes too: one waits behind them and is answered once
 * it ran; a client that leaves while its flush waits drops it (nothing stays of it). */
START_TEST(test_flush_waits_for_domain_room)
{
	enum { FULL = ODP_DOMAIN_JOBS_MAX / ODP_PREFETCH_IN_FLIGHT };
	int fds[FULL], fd, gone;
	struct client *c;
	struct td_blocker b;
	struct domain *d;
	uint64_t a;

	start("cache.policy=contig", "cache.workers=1");
	fd = td_hello_client(1000, &c);
	gone = td_hello_client(1000, NULL);
	a = alloc(fd, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	d = c->domain;
	td_block_worker(&b);
	for (int i = 0; i < FULL; i++) {
		uint64_t mine;

		fds[i] = td_hello_client(1000, NULL);
		mine = alloc(fds[i], 2, 4 * KiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
		for (uint64_t k = 0; k < ODP_PREFETCH_IN_FLIGHT; k++)
			prefetch(fds[i], 10 + k, mine, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false,
				 0);
	}
	ck_assert_uint_eq(d->reg.odp.jobs, ODP_DOMAIN_JOBS_MAX);
	prefetch(fd, 3, a, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false, EAGAIN);
	{
		uint64_t theirs = alloc(gone, 2, 4 * KiB, MRD__ALLOC_FLAGS__ALLOC_ODP);

		send_prefetch(gone, 3, theirs, 4096, MRD__PREFETCH_ADVICE__PREFETCH, true);
	}
	send_prefetch(fd, 4, a, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT, true);
	expect_no_reply(fd);
	ck_assert_ptr_nonnull(LIST_FIRST(&c->pending));
	close(gone); /* its flush goes with it */
	td_pump();
	ck_assert_uint_eq(d->reg.odp.jobs, ODP_DOMAIN_JOBS_MAX);
	ck_assert(!TAILQ_EMPTY(&d->reg.odp.waiting));
	td_unblock_worker(&b);
	td_expect_free(fd, 4, 0);
	td_pump_until_zero(&d->reg.odp.jobs);
	ck_assert(TAILQ_EMPTY(&d->reg.odp.waiting));
	ck_assert_uint_eq(d->reg.odp.stats.prefetch_requests, ODP_DOMAIN_JOBS_MAX + 2);
	/* The dropped one made none. */
	ck_assert_uint_eq(d->reg.odp.stats.children_created, 1 + FULL);
	for (int i = 0; i < FULL; i++)
		close(fds[i]);
	close(fd);
}
END_TEST

/* odp_chunk above the device's largest MR: children are cut to it. */
/* While a worker holds the provider (a big pinned registration, held at soft's gate), an
 * on-demand lookup miss of the same domain makes its child on a worker: on the loop it would
 * wait for the provider's lock, and everyone with it. Its lookup answers once the child is
 * made, with a key that moves bytes. */
START_TEST(test_fault_off_the_loop_while_provider_busy)
{
	struct client *cb;
	char gate[64];
	int a, b, peer, other;
	uint64_t pinned, odp;
	Mrd__Response *resp;
	Mrd__MrEntry ep, eo;

	ck_assert_int_eq(soft_gate_setenv(gate, sizeof(gate), 1 * MiB), 0);
	start("cache.policy=contig", "cache.workers=2"); /* domains open gated soft contexts */
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1000, &cb);
	peer = td_hello_client(1000, NULL);
	other = td_hello_client(2000, NULL);
	pinned = alloc(a, 2, 2 * MiB, 0);
	odp = alloc(b, 2, 64 * KiB, MRD__ALLOC_FLAGS__ALLOC_ODP);

	td_send_lookup(a, 3, pinned);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r'); /* a worker holds the provider */
	td_send_lookup(b, 3, odp + 100);
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&cb->pending)); /* B waits, the loop does not */
	(void)alloc(peer, 2, 4096, 0);
	td_lookup(other, 3, alloc(other, 2, 4096, 0), 0, NULL);

	soft_gate_release(gate, 1);
	resp = td_expect(a, 3, 0);
	ep = *resp->mr_lookup->entries[0];
	mrd__response__free_unpacked(resp, NULL);
	resp = td_expect(b, 3, 0);
	eo = *resp->mr_lookup->entries[0];
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(eo.start, odp);
	ck_assert_uint_eq(eo.end, odp + 64 * KiB);
	ck_assert_uint_eq(cb->domain->reg.odp.children, 1);
	td_lookup(b, 4, odp + 200, 0, NULL); /* in the table now */
	ck_assert_uint_eq(cb->domain->reg.odp.stats.children_created, 1);
	strcpy((char *)(uintptr_t)pinned, "made on a worker");
	td_dma(b, 5, PROVIDER_DMA_WRITE, &ep, pinned, &eo, odp + 8, 17, 0);
	ck_assert_str_eq((char *)(uintptr_t)(odp + 8), "made on a worker");
	soft_gate_cleanup(gate);
	close(a);
	close(b);
	close(peer);
	close(other);
}
END_TEST

/* The same, but B goes while its child is made: its memory is freed then, so the child, made
 * for memory that went, is handed to nobody and goes with it. */
START_TEST(test_fault_on_worker_for_memory_gone)
{
	struct client *ca;
	struct provider_stats ps;
	char gate[64];
	int a, b;
	uint64_t pinned, odp;

	ck_assert_int_eq(soft_gate_setenv(gate, sizeof(gate), 1 * MiB), 0);
	start("cache.policy=contig", "cache.workers=2");
	a = td_hello_client(1000, &ca);
	b = td_hello_client(1000, NULL);
	pinned = alloc(a, 2, 2 * MiB, 0);
	odp = alloc(b, 2, 64 * KiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	td_send_lookup(a, 3, pinned);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r');
	td_send_lookup(b, 3, odp);
	td_pump();
	close(b);
	td_pump();
	ck_assert_uint_eq(ca->domain->n_users, 1);
	soft_gate_release(gate, 1);
	td_expect_free(a, 3, 0);
	td_pump_until_zero(&ca->domain->reg.odp.jobs);
	/* The child's MR goes on a worker (the job that made it still counted as busy). */
	td_pump_until(ca->domain->mem.allocated_bytes == 2 * MiB);
	ck_assert_uint_eq(ca->domain->reg.odp.children, 0);
	ck_assert_uint_eq(ca->domain->reg.odp.zombies, 0);
	ck_assert_uint_eq(ca->domain->mem.allocated_bytes, 2 * MiB);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1); /* A's alone */
	soft_gate_cleanup(gate);
	close(a);
}
END_TEST

/* A mrd whose soft provider holds ops of 1 MiB or more at gate; client a (uid 1000, *ret_a) has
 * 2 MiB on demand (*ret_odp) whose write prefetch with flush (id 3) is held in its advice, off
 * the provider's lock, its child made; client b (uid b_uid, *ret_b) has 64 KiB (*ret_pinned). */
static void prefetch_held_in_advice(char *gate, size_t size, uid_t b_uid, struct client **ret_ca,
				    int *ret_a, int *ret_b, uint64_t *ret_odp, uint64_t *ret_pinned)
{
	ck_assert_int_eq(soft_gate_setenv(gate, size, 1 * MiB), 0);
	start("cache.policy=contig", "cache.workers=2");
	*ret_a = td_hello_client(1000, ret_ca);
	*ret_b = td_hello_client(b_uid, NULL);
	*ret_odp = alloc(*ret_a, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	*ret_pinned = alloc(*ret_b, 2, 64 * KiB, 0);
	send_prefetch(*ret_a, 3, *ret_odp, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_WRITE, true);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r'); /* its child, made on the worker */
	soft_gate_release(gate, 1);
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'a'); /* advising, holding the child */
}

/* A prefetch populates without the provider's lock (soft: 0.4 s a GiB): while one is under way
 * (held at soft's gate on a worker), a lookup miss of the same domain registers on the loop at
 * once; the prefetch then faults its pages in, and its flush answers. */
START_TEST(test_prefetch_leaves_the_provider_free)
{
	struct client *ca;
	struct provider_stats ps;
	char gate[64];
	int a, b;
	uint64_t odp, pinned;
	Mrd__MrEntry e;

	prefetch_held_in_advice(gate, sizeof(gate), 1000, &ca, &a, &b, &odp, &pinned);
	td_lookup(b, 3, pinned, 0, &e); /* small: registered on the loop, the provider is free */
	ck_assert_uint_eq(e.start, pinned);
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending));
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.odp_prefetched_pages, 0);
	soft_gate_release(gate, 1);
	td_expect_free(a, 3, 0);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.odp_prefetched_pages, 2 * MiB / 4096);
	ck_assert_uint_eq(ca->domain->reg.odp.stats.prefetch_pages, 2 * MiB / 4096);
	soft_gate_cleanup(gate);
	close(a);
	close(b);
}
END_TEST

/* Opens the gate after 20 s unless cancelled first, and says whether it had to. */
struct gate_watchdog {
	const char *gate;
	unsigned ops; /* how many held ops it lets go then (0: one) */
	bool cancel, fired; /* atomic */
	pthread_t thread;
};

static void *gate_watchdog_main(void *arg)
{
	struct gate_watchdog *w = arg;

	for (int i = 0; i < 2000 && !__atomic_load_n(&w->cancel, __ATOMIC_ACQUIRE); i++)
		usleep(10000);
	if (!__atomic_load_n(&w->cancel, __ATOMIC_ACQUIRE)) {
		__atomic_store_n(&w->fired, true, __ATOMIC_RELEASE);
		soft_gate_release(w->gate, w->ops ? w->ops : 1);
	}
	return NULL;
}

/* A client frees memory its own prefetch is advising (held at soft's gate, off the provider's
 * lock): the loop does not zap the child under the advice (the zap would wait for it), so it
 * serves another client before the advice ends; the Free answers after the prefetch. */
START_TEST(test_free_under_own_prefetch_leaves_the_loop)
{
	struct gate_watchdog wd = { 0 };
	struct client *ca;
	struct provider_stats ps;
	char gate[64];
	int a, b;
	uint64_t odp, pinned;
	Mrd__Response *r;
	bool freed = false, prefetched = false;

	prefetch_held_in_advice(gate, sizeof(gate), 2000, &ca, &a, &b, &odp, &pinned);
	td_lookup(a, 4, odp, 0, NULL); /* the child is linked */
	wd.gate = gate;
	ck_assert_int_eq(pthread_create(&wd.thread, NULL, gate_watchdog_main, &wd), 0);
	td_send_free(a, 5, odp);
	td_pump();
	td_lookup(b, 3, pinned, 0, NULL);
	ck_assert_msg(!__atomic_load_n(&wd.fired, __ATOMIC_ACQUIRE),
		      "the loop waited for the advice to end before serving anyone");
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending)); /* the prefetch and the Free */
	__atomic_store_n(&wd.cancel, true, __ATOMIC_RELEASE);
	pthread_join(wd.thread, NULL);
	soft_gate_release(gate, 1);
	for (int i = 0; i < 2; i++) {
		r = td_recv_reply(a, NULL, NULL);
		ck_assert_ptr_nonnull(r);
		if (r->id == 5) {
			ck_assert_msg(r->status == 0, "%s", r->message);
			ck_assert(prefetched); /* its pages waited for the advice */
			freed = true;
		} else {
			ck_assert_uint_eq(r->id, 3);
			prefetched = true;
		}
		mrd__response__free_unpacked(r, NULL);
	}
	ck_assert(freed && prefetched);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0); /* the child went (b is another domain) */
	ck_assert_uint_eq(ca->domain->reg.odp.zombies, 0);
	soft_gate_cleanup(gate);
	close(a);
	close(b);
}
END_TEST

/* A lookup whose registration is as big as soft's gate holds, let go beforehand (it may run on
 * the loop, which the test pumps). */
static void lookup_released(int fd, uint64_t id, uint64_t addr, const char *gate,
			    Mrd__MrEntry *ret)
{
	soft_gate_release(gate, 1);
	td_lookup(fd, id, addr, 0, ret);
	ck_assert_int_eq(soft_gate_wait(gate, 0), 'r');
}

/* A Dma through an on-demand key faults its pages in without the provider's lock (soft: 0.4 s
 * a GiB): while one is under way (held at soft's gate on its thread), a lookup miss of the
 * same domain registers at once (on a worker: test_no_child_on_the_loop_while_dma_faults);
 * the Dma then copies, its faults counted. */
START_TEST(test_dma_faults_leave_the_provider_free)
{
	struct client *ca;
	struct provider_stats ps;
	char gate[64];
	int a, b;
	uint64_t odp, dst, pinned;
	Mrd__MrEntry eo, ed, e;

	ck_assert_int_eq(soft_gate_setenv(gate, sizeof(gate), 1 * MiB), 0);
	start("cache.policy=contig", "cache.workers=2");
	a = td_hello_client(1000, &ca);
	b = td_hello_client(1000, NULL);
	odp = alloc(a, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	dst = alloc(a, 3, 1 * MiB, 0);
	pinned = alloc(b, 2, 64 * KiB, 0);
	lookup_released(a, 4, odp, gate, &eo);
	lookup_released(a, 5, dst, gate, &ed);
	strcpy((char *)(uintptr_t)odp, "faulted in off the lock");
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.odp_faults, 0);
	td_send_dma(a, 6, PROVIDER_DMA_WRITE, &eo, odp, &ed, dst, 1 * MiB);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'f'); /* faulting its pages in */
	td_lookup(b, 3, pinned, 0, &e); /* small: registered at once, the provider is free */
	ck_assert_uint_eq(e.start, pinned);
	soft_gate_release(gate, 1);
	td_expect_free(a, 6, 0);
	ck_assert_str_eq((char *)(uintptr_t)dst, "faulted in off the lock");
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.odp_faults, 1 * MiB / 4096);
	soft_gate_cleanup(gate);
	close(a);
	close(b);
}
END_TEST

/* A Dma faulting an on-demand key's pages in holds mrd's mmap_lock for reading, page by page:
 * whatever changes mrd's mappings on the loop meanwhile (a child's page table from malloc,
 * brk or mmap) waits for the Dma thread, for milliseconds when that thread loses its CPU with
 * the lock held. So while one is under way (held at soft's gate), a lookup miss of the same
 * domain makes its child on a worker (held at the gate too), and the loop serves on. */
START_TEST(test_no_child_on_the_loop_while_dma_faults)
{
	struct gate_watchdog wd = { 0 };
	struct client *cb;
	char gate[64];
	int a, b;
	uint64_t odp, dst, odp_b;
	Mrd__MrEntry eo, ed;
	Mrd__Response *resp;

	ck_assert_int_eq(soft_gate_setenv(gate, sizeof(gate), 1 * MiB), 0);
	start("cache.policy=contig", "cache.workers=2");
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1000, &cb);
	odp = alloc(a, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	dst = alloc(a, 3, 1 * MiB, 0);
	odp_b = alloc(b, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	lookup_released(a, 4, odp, gate, &eo);
	lookup_released(a, 5, dst, gate, &ed);
	td_send_dma(a, 6, PROVIDER_DMA_WRITE, &eo, odp, &ed, dst, 1 * MiB);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'f'); /* faulting its pages in */
	wd.gate = gate;
	wd.ops = 2; /* the Dma may take the first */
	ck_assert_int_eq(pthread_create(&wd.thread, NULL, gate_watchdog_main, &wd), 0);
	td_send_lookup(b, 3, odp_b); /* a miss: a 2 MiB child, held at the gate where it is made */
	td_pump();
	ck_assert_msg(!__atomic_load_n(&wd.fired, __ATOMIC_ACQUIRE),
		      "the loop made a child while a Dma faulted pages in");
	ck_assert_ptr_nonnull(LIST_FIRST(&cb->pending)); /* B waits, the loop does not */
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r'); /* on a worker */
	__atomic_store_n(&wd.cancel, true, __ATOMIC_RELEASE);
	pthread_join(wd.thread, NULL);
	soft_gate_release(gate, 2);
	td_expect_free(a, 6, 0);
	resp = td_expect(b, 3, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, odp_b);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->end, odp_b + 2 * MiB);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(cb->domain->reg.odp.stats.children_created, 2);
	soft_gate_cleanup(gate);
	close(a);
	close(b);
}
END_TEST

START_TEST(test_chunk_capped_at_max_mr_size)
{
	const char *settings[] = { "memory.window_size=256G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.odp_chunk=1T", "cache.workers=1",
				   "quota.allocated_bytes=200G", "quota.window_bytes=128G", NULL };
	struct client *c;
	Mrd__MrEntry e;
	uint64_t a, max;
	int fd;

	td_stop();
	td_start(settings);
	fd = td_hello_client(1000, &c);
	a = alloc(fd, 2, 80ull << 30, MRD__ALLOC_FLAGS__ALLOC_ODP);
	max = c->domain->reg.base.provider->caps.max_mr_size;
	td_lookup(fd, 3, a + 4096, 0, &e);
	ck_assert_uint_le(e.end - e.start, max);
	td_lookup(fd, 4, a + (80ull << 30) - 1, 0, NULL); /* the last chunk too */
	close(fd);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("odp");
	TCase *tc = tcase_create("odp");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_lookups_make_children);
	tcase_add_test(tc, test_policy_per_domain);
	tcase_add_test(tc, test_prefetch);
	tcase_add_test(tc, test_prefetch_errors);
	tcase_add_test(tc, test_one_child_under_races);
	tcase_add_test(tc, test_prefetch_racing_free);
	tcase_add_test(tc, test_teardown_with_work_pending);
	tcase_add_test(tc, test_child_linked_then_freed_before_completion);
	tcase_add_test(tc, test_free_waits_for_queued_prefetch);
	tcase_add_test(tc, test_chunk_capped_at_max_mr_size);
	tcase_add_test(tc, test_fault_off_the_loop_while_provider_busy);
	tcase_add_test(tc, test_fault_on_worker_for_memory_gone);
	tcase_add_test(tc, test_prefetch_leaves_the_provider_free);
	tcase_add_test(tc, test_free_under_own_prefetch_leaves_the_loop);
	tcase_add_test(tc, test_dma_faults_leave_the_provider_free);
	tcase_add_test(tc, test_no_child_on_the_loop_while_dma_faults);
	tcase_add_test(tc, test_neighbours_freed_under_prefetch);
	tcase_add_test(tc, test_zombie_waits_for_its_own_work_only);
	tcase_add_test(tc, test_flush_waits_for_room);
	tcase_add_test(tc, test_flush_waits_for_domain_room);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
