/* SPDX-License-Identifier: MIT */
/* ODP-style lazy registration in-process, on the soft provider's emulated ODP: children made
 * by lookups and prefetches (chunk cut to allocation), keys checked by DMA, exactly one child
 * when creators race, prefetch racing with free, read-only memory, the bounds, and teardown
 * with work pending. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "domain.h"
#include "manager.h"
#include "provider.h"
#include "status-page.h"
#include "worker-pool.h"
#include "test-daemon.h"
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
	ck_assert_uint_eq(d->odp.children, 2);
	ck_assert_uint_eq(d->odp.stats.children_created, 2);
	ck_assert_uint_eq(d->odp.stats.faults, 2);
	provider_stats(d->provider, &ps);
	ck_assert_uint_eq(ps.mrs, 2);
	ck_assert_uint_eq(ps.pinned_bytes, 0); /* on demand: nothing pinned */
	ck_assert_uint_eq(d->cache.pinned_bytes, 0);

	/* The keys move bytes; the device faults the pages in as it goes. */
	strcpy((char *)(uintptr_t)(a + 64), "on demand");
	td_dma(fd, 6, PROVIDER_DMA_WRITE, &e0, a + 64, &e2, a + 4 * MiB + 8, 10, 0);
	ck_assert_str_eq((char *)(uintptr_t)(a + 4 * MiB + 8), "on demand");
	provider_stats(d->provider, &ps);
	ck_assert_uint_gt(ps.odp_faults, 0);

	/* Freed: children zapped, out of the table, destroyed; their keys are dead. */
	gen = d->status->generation;
	td_free(fd, 7, a, 0);
	ck_assert_uint_gt(d->status->generation, gen);
	ck_assert_uint_eq(d->odp.children, 0);
	ck_assert_uint_eq(d->odp.stats.invalidations, 2);
	ck_assert_uint_eq(d->odp.stats.children_destroyed, 2);
	provider_stats(d->provider, &ps);
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
	ck_assert_uint_eq(d->odp.children, 4);
	ck_assert_uint_eq(d->odp.stats.prefetch_requests, 1);
	ck_assert_uint_eq(d->odp.stats.prefetch_pages, 8 * MiB / 4096);
	provider_stats(d->provider, &ps);
	ck_assert_uint_ge(ps.odp_prefetched_pages, 8 * MiB / 4096);
	/* Their entries went into the table: lookups find them without a miss. */
	misses = d->cache.misses;
	td_lookup(fd, 5, a + 7 * MiB, 0, NULL);
	td_lookup(fd, 6, a + 1, 0, NULL);
	ck_assert_uint_eq(d->cache.misses, misses);

	/* No-fault advice makes the children and faults nothing in. */
	prefetch(fd, 7, b + 1 * MiB, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT, true, 0);
	ck_assert_uint_eq(d->odp.children, 6);
	ck_assert_uint_eq(d->odp.stats.prefetch_pages, 8 * MiB / 4096);
	/* Without flush the answer comes once queued, the work after. */
	prefetch(fd, 8, b, 4 * MiB, MRD__PREFETCH_ADVICE__PREFETCH, false, 0);
	td_pump_until_zero(&d->odp.jobs);
	ck_assert_uint_eq(d->odp.stats.prefetch_pages, 12 * MiB / 4096);
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
	td_pump_until_zero(&c->domain->odp.jobs);
	ck_assert_uint_eq(c->n_prefetches, 0);
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
		uint64_t created = d->odp.stats.children_created;

		send_prefetch(fd, 3, a, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT, false);
		send_prefetch(fd, 4, a + 4096, 4096, MRD__PREFETCH_ADVICE__PREFETCH, false);
		td_expect_free(fd, 3, 0);
		td_expect_free(fd, 4, 0);
		td_lookup(fd, 5, a + 8192, 0, NULL); /* while the workers may still be at it */
		td_pump_until_zero(&d->odp.jobs);
		ck_assert_uint_eq(d->odp.children, 1);
		ck_assert_uint_eq(d->odp.stats.children_created, created + 1);
		provider_stats(d->provider, &ps);
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
	ck_assert_ptr_nonnull(c->pending); /* the Free waits for the held child */
	ck_assert_uint_eq(d->allocations.n, 0);
	ck_assert_uint_eq(d->odp.children, 0); /* out of the index and the table already */
	td_unblock_worker(&b);
	td_expect_free(fd, 5, 0);
	ck_assert_uint_eq(d->odp.stats.children_destroyed, 2);
	provider_stats(d->provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert(LIST_EMPTY(&d->odp.zombies));
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
	ck_assert_uint_eq(td_manager->n_domains, 1); /* the work holds it */
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
	for (int i = 0; i < 2000; i++) {
		size_t ch = (a - d->odp.base) >> d->odp.chunk_shift;
		struct odp_child **leaf = d->odp.leaves[ch / 512];

		if (leaf && __atomic_load_n(&leaf[ch % 512], __ATOMIC_ACQUIRE))
			break; /* installed */
		usleep(1000);
	}
	ck_assert_int_eq(mr_cache_lookup(&d->cache, a, &e, why, sizeof(why), NULL), 0);
	al = domain_allocation_containing(d, a);
	ck_assert_ptr_nonnull(al);
	ck_assert_int_eq(domain_free_allocation(d, al, NULL), 0); /* deferred: work on it */
	ck_assert(!LIST_EMPTY(&d->odp.zombies));
	td_pump_until_zero(&d->odp.jobs);
	ck_assert(b.done);
	close(b.fd[0]);
	close(b.fd[1]);
	ck_assert(LIST_EMPTY(&d->odp.zombies));
	ck_assert_uint_eq(d->odp.stats.children_destroyed, 1);
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
	ck_assert_ptr_nonnull(c->pending); /* the Free waits */
	o = alloc(other, 2, 128 * MiB, 0);
	ck_assert_uint_ne(o, a); /* the pages did not go back */
	td_unblock_worker(&b);
	td_expect_free(fd, 4, 0);
	provider_stats(d->provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0); /* the child the work made for it went too */
	ck_assert_uint_eq(d->odp.stats.children_destroyed, d->odp.stats.children_created);
	close(fd);
	close(other);
}
END_TEST

/* odp_chunk above the device's largest MR: children are cut to it. */
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
	max = c->domain->provider->caps.max_mr_size;
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
	suite_add_tcase(s, tc);
	return run_suite(s);
}
