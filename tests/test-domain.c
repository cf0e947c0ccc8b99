/* SPDX-License-Identifier: MIT */
/* Core's face, in-process: the snapshot of a domain's figures that every view encodes
 * (domain_stats) follows its allocations and registrations, and so do its walks; ExportPd and BindPd's entry
 * points (domain_export_pd, domain_bind_pd) refuse as the requests did, and the served
 * devices count their bindings themselves. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "control/client.h"
#include "control/manager.h"
#include "core/domain.h"
#include "core/domain-stats.h"
#include "core/served-devices.h"
#include "check-run.h"
#include "test-daemon.h"
#include "test-util.h"

#define MiB (1ull << 20)

static void setup(void) { td_start_small(NULL); }
static void teardown(void) { td_stop(); }

START_TEST(test_stats_follow_alloc_lookup_free)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 3 * MiB), generation;
	struct domain_stats s;
	struct domain *d = c->domain;
	Mrd__MrEntry e;

	td_lookup(fd, 3, a + 5, 0, &e);
	domain_stats(d, &s);
	ck_assert_uint_eq(s.clients, 1);
	ck_assert_uint_eq(s.allocations, 1);
	ck_assert_uint_eq(s.allocated_bytes, 3 * MiB);
	ck_assert_uint_eq(s.arenas, 1);
	ck_assert_uint_eq(s.waiting, 0);
	ck_assert_uint_eq(s.mrs, 1);
	ck_assert_uint_eq(s.lookups, 1);
	ck_assert_uint_eq(s.misses, 1);
	ck_assert_uint_eq(s.registrations, 1);
	ck_assert_uint_eq(s.deregistrations, 0);
	ck_assert_uint_eq(s.pinned_bytes, e.end - e.start);
	ck_assert(!s.table_overflow);
	ck_assert_uint_eq(s.table_entries, 1);
	ck_assert_uint_ge(s.table_capacity, 1);
	ck_assert_uint_ge(s.generation, 1);
	ck_assert_ptr_nonnull(s.pools_off);
	ck_assert_uint_eq(s.n_pools, domain_pool_stats(d, NULL, 0));
	ck_assert_uint_ge(s.n_pools, 1); /* the MR's handle came out of a pool */
	generation = s.generation;

	td_free(fd, 4, a, 0);
	domain_stats(d, &s);
	ck_assert_uint_eq(s.allocations, 0);
	ck_assert_uint_eq(s.allocated_bytes, 0);
	ck_assert_uint_eq(s.mrs, 0);
	ck_assert_uint_eq(s.deregistrations, 1);
	ck_assert_uint_eq(s.pinned_bytes, 0);
	ck_assert_uint_eq(s.table_entries, 0);
	ck_assert_uint_gt(s.generation, generation); /* its keys died */
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* What domain_walk_mrs saw. */
struct seen {
	unsigned n[DOMAIN_MR_MEMPOOL + 1];
	uint64_t start, end;
};

static void see(void *data, uint64_t start, uint64_t end, const struct provider_mr *pmr,
		enum domain_mr_kind kind, const struct allocation *a, uint32_t sharers)
{
	struct seen *s = data;

	ck_assert_ptr_nonnull(pmr);
	ck_assert_uint_eq(sharers, 0);
	s->n[kind]++;
	s->start = start;
	s->end = end;
}

START_TEST(test_walks)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 3 * MiB);
	const struct arena *arena = NULL;
	struct seen seen = { 0 };
	unsigned arenas = 0;
	Mrd__MrEntry e;

	td_alloc(fd, 3, 80 * MiB); /* no MR, in an arena of its own (64 MiB ones) */
	td_lookup(fd, 4, a, 0, &e);
	domain_walk_mrs(c->domain, true, see, &seen);
	ck_assert_uint_eq(seen.n[DOMAIN_MR_CACHE], 1);
	ck_assert_uint_eq(seen.n[DOMAIN_MR_CLIENT_PD] + seen.n[DOMAIN_MR_ODP] +
				  seen.n[DOMAIN_MR_MEMPOOL], 0);
	ck_assert_uint_eq(seen.start, e.start);
	ck_assert_uint_eq(seen.end, e.end);
	while ((arena = domain_next_arena(c->domain, arena)))
		arenas++;
	ck_assert_uint_eq(arenas, 2);
	ck_assert_ptr_null(domain_next_mempool(c->domain, NULL));
	close(fd);
	td_wait_domains_closed();
}
END_TEST

START_TEST(test_export_pd)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), pd_fd = -1;
	struct context_holder h = { .pid = getpid(), .uid = 1000, .session = 1 };
	uint32_t handle;
	char why[256] = "";

	td_alloc(fd, 2, 4096); /* the domain open */
	/* The soft provider shares nothing unless told to. */
	ck_assert_int_eq(domain_export_pd(c->domain, &h, &pd_fd, &handle, why, sizeof(why)),
			 -EOPNOTSUPP);
	ck_assert_msg(strstr(why, "has no device to share"), "%s", why);
	ck_assert_uint_eq(c->domain->n_exported_to, 0);
	close(fd);
	td_wait_domains_closed();

	setenv("MRD_SOFT_EXPORT", "1", 1);
	td_stop();
	td_start_small(NULL);
	fd = td_hello_client(1000, &c);
	td_alloc(fd, 2, 4096);
	ck_assert_int_eq(domain_export_pd(c->domain, &h, &pd_fd, &handle, why, sizeof(why)), 0);
	ck_assert_int_ge(pd_fd, 0);
	ck_assert_uint_eq(c->domain->n_exported_to, 1); /* recorded for the hand-over */
	close(pd_fd);
	unsetenv("MRD_SOFT_EXPORT");
	close(fd);
	td_wait_domains_closed();
}
END_TEST

START_TEST(test_bind_pd_refused)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), memfd = memfd_create("not-uverbs", MFD_CLOEXEC);
	struct served_device *dev = NULL;
	struct bound_pd *b = NULL;
	char why[256] = "";

	ck_assert_int_ge(memfd, 0);
	td_alloc(fd, 2, 4096);
	ck_assert_int_eq(domain_bind_pd(c->domain, memfd, 1, getpid(), &b, &dev, why,
					sizeof(why)), -ENOTTY);
	ck_assert_msg(strstr(why, "not a character device"), "%s", why);
	ck_assert_ptr_null(b);
	ck_assert_ptr_null(dev);
	ck_assert_int_ge(fcntl(memfd, F_GETFD), 0); /* still the caller's */
	close(memfd);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

START_TEST(test_served_device_counts)
{
	struct served_device dev = { .name = "mlx5_0" };

	served_device_bind(&dev);
	served_device_bind(&dev);
	ck_assert_uint_eq(dev.bound, 2);
	served_device_unbind(&dev);
	ck_assert_uint_eq(dev.bound, 1);
	served_device_unbind(NULL); /* a connection bound to none */
	ck_assert_uint_eq(dev.bound, 1);
}
END_TEST

static Suite *domain_suite(void)
{
	Suite *s = suite_create("domain");
	TCase *tc = tcase_create("face");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_stats_follow_alloc_lookup_free);
	tcase_add_test(tc, test_walks);
	tcase_add_test(tc, test_export_pd);
	tcase_add_test(tc, test_bind_pd_refused);
	tcase_add_test(tc, test_served_device_counts);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(domain_suite());
}
