/* SPDX-License-Identifier: MIT */
/* What a domain saves for the next mrd and adopts from the last, in plain C
 * (core/domain-handover.h), in-process: each allocation comes back where and of the kind it
 * was, waiting for the process and session that owned it; saved again before they came back
 * it keeps that claim; a domain where nothing waits lets go of its hold, its generation kept
 * as a floor. The protobuf round trip around it is test-handover's. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/client.h"
#include "control/manager.h"
#include "core/domain-handover.h"
#include "core/domain.h"
#include "check-run.h"
#include "test-daemon.h"

#define MiB (1ull << 20)

static const char *const settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
					"memory.hugepages=no", NULL };

static void setup(void) { td_start(settings); }
static void teardown(void) { td_stop(); }

static size_t n_saved_allocations(const struct saved_domain *sd)
{
	size_t n = 0;

	for (size_t i = 0; i < sd->n_arenas; i++)
		n += sd->arenas[i].n_allocations;
	return n;
}

/* Stops td_manager the way a hand-over does and adopts saved (one domain) in the next one:
 * how many allocations wait. What saved borrowed from the old domain goes with it: its name
 * is copied first. */
static unsigned restart(struct saved_domain *saved)
{
	static char name[64];
	unsigned n_allocations;
	char why[256] = "";

	snprintf(name, sizeof(name), "%s", saved->name);
	*saved = (struct saved_domain){ .name = name, .generation = saved->generation,
					.allocation_serial = saved->allocation_serial,
					.frees = saved->frees, .arenas = saved->arenas,
					.n_arenas = saved->n_arenas };
	td_manager->core.window.keep_content = true;
	td_stop();
	td_start(settings);
	ck_assert_int_eq(domains_record_floors(&td_manager->core, saved, 1), 0);
	ck_assert_msg(domains_adopt(&td_manager->core, saved, 1, &n_allocations, why,
				    sizeof(why)) == 0, "%s", why);
	for (size_t i = 0; i < saved->n_arenas; i++)
		ck_assert_int_eq(saved->arenas[i].memfd, -1); /* taken */
	return n_allocations;
}

START_TEST(test_allocations_come_back_as_they_were)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t addr[3] = { td_alloc(fd, 2, 1 * MiB),
			     td_alloc_flags(fd, 3, 64 * 1024, MRD__ALLOC_FLAGS__ALLOC_READ_ONLY),
			     td_alloc(fd, 4, 3 * MiB) };
	struct domain *d = td_find_domain("uid-1000");
	uint64_t generation = d->mem.status.page->generation, session = c->id;
	struct saved_domain *saved;
	struct allocation before[3];
	size_t n;

	for (int i = 0; i < 3; i++)
		before[i] = *domain_find_allocation(d, addr[i]);
	ck_assert(before[1].read_only && !before[0].read_only);
	ck_assert_int_eq(domains_save(&td_manager->core, &saved, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(saved[0].name, "uid-1000");
	/* Its clients stop trusting cached keys; the next mrd starts above. */
	ck_assert_uint_gt(saved[0].generation, generation);
	ck_assert_uint_eq(saved[0].generation, d->mem.status.page->generation);
	ck_assert_uint_eq(n_saved_allocations(&saved[0]), 3);
	for (size_t i = 0; i < saved[0].n_arenas; i++) {
		ck_assert_int_ge(saved[0].arenas[i].memfd, 0);
		for (size_t j = 0; j < saved[0].arenas[i].n_allocations; j++) {
			ck_assert_uint_eq(saved[0].arenas[i].allocations[j].session, session);
			ck_assert_int_eq(saved[0].arenas[i].allocations[j].pid, getpid());
		}
	}
	close(fd);

	ck_assert_uint_eq(restart(&saved[0]), 3);
	d = td_find_domain("uid-1000");
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->mem.n_orphans, 3);
	for (int i = 0; i < 3; i++) {
		const struct allocation *a = domain_find_allocation(d, addr[i]);

		ck_assert_ptr_nonnull(a);
		ck_assert(a->orphan);
		ck_assert_uint_eq(a->claim_session, session);
		ck_assert_int_eq(a->claim_pid, getpid());
		ck_assert_uint_eq(a->offset, before[i].offset);
		ck_assert_uint_eq(a->length, before[i].length);
		ck_assert_uint_eq(a->serial, before[i].serial);
		ck_assert_int_eq(a->odp, before[i].odp);
		ck_assert_int_eq(a->read_only, before[i].read_only);
	}
	saved_domains_free(saved, n);
}
END_TEST

/* A second hand-over before the owner came back: the claim travels on. */
START_TEST(test_an_orphan_saved_again_keeps_its_claim)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t addr = td_alloc(fd, 2, 1 * MiB), session = c->id;
	struct saved_domain *saved;
	size_t n;

	ck_assert_int_eq(domains_save(&td_manager->core, &saved, &n), 0);
	close(fd);
	ck_assert_uint_eq(restart(&saved[0]), 1);
	saved_domains_free(saved, n);

	ck_assert_int_eq(domains_save(&td_manager->core, &saved, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(n_saved_allocations(&saved[0]), 1);
	ck_assert_uint_eq(saved[0].arenas[0].allocations[0].session, session);
	ck_assert_int_eq(saved[0].arenas[0].allocations[0].pid, getpid());
	ck_assert_uint_eq(restart(&saved[0]), 1);
	ck_assert_uint_eq(domain_find_allocation(td_find_domain("uid-1000"), addr)->claim_session,
			  session);
	saved_domains_free(saved, n);
}
END_TEST

START_TEST(test_a_domain_where_nothing_waits_closes)
{
	int fd = td_hello_client(1000, NULL);
	struct saved_domain *saved;
	uint64_t generation;
	size_t n;

	td_free(fd, 3, td_alloc(fd, 2, 1 * MiB), 0);
	ck_assert_int_eq(domains_save(&td_manager->core, &saved, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(n_saved_allocations(&saved[0]), 0);
	generation = saved[0].generation;
	close(fd);

	ck_assert_uint_eq(restart(&saved[0]), 0);
	ck_assert_uint_eq(td_manager->core.n_domains, 0);
	ck_assert_uint_eq(td_manager->core.n_floors, 1);
	ck_assert_str_eq(td_manager->core.floors[0].name, "uid-1000");
	ck_assert_uint_eq(td_manager->core.floors[0].generation, generation);
	saved_domains_free(saved, n);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("domain-handover");
	TCase *tc = tcase_create("domain-handover");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_allocations_come_back_as_they_were);
	tcase_add_test(tc, test_an_orphan_saved_again_keeps_its_claim);
	tcase_add_test(tc, test_a_domain_where_nothing_waits_closes);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
