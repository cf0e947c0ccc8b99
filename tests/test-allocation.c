/* SPDX-License-Identifier: MIT */
/* A domain's memory alone: allocations in arenas of the window, the quotas that bound them, the
 * arenas kept or given back, the status page, and the orphans of a warm restart claimed by
 * their process. An owner on the stack; no registrar, provider, manager or socket. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/config.h"
#include "check-run.h"
#include "memory-fixture.h"
#include "memory/allocation.h"
#include "memory/arena.h"
#include "memory/mem-owner.h"
#include "memory/memory.h"
#include "memory/window.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

static struct config cfg;
static struct window window;
static struct memory mem;
static struct mem_owner owner;
static uint32_t gone[8];
static unsigned n_gone;

static void on_arena_gone(void *data, uint32_t arena_id)
{
	if (n_gone < 8)
		gone[n_gone] = arena_id;
	n_gone++;
}

static void setup(void)
{
	memory_fixture_open(&cfg, &window, &mem, 1ull << 30, 4 * MiB, 7);
	mem.arena_gone = on_arena_gone;
	mem_owner_init(&owner, 42, getpid(), getuid());
	n_gone = 0;
}

static void teardown(void)
{
	while (!LIST_EMPTY(&owner.allocations)) {
		struct allocation *a = LIST_FIRST(&owner.allocations);

		allocation_retire(&mem, a);
		allocation_release(&mem, a, NULL, NULL);
		free(a);
	}
	memory_fixture_close(&cfg, &window, &mem);
}

static int try_alloc(uint64_t size, struct allocation **ret, char *why, size_t why_size)
{
	struct allocation *a = calloc(1, sizeof(*a));
	int r;

	ck_assert_ptr_nonnull(a);
	r = allocation_alloc(&mem, a, &owner, size, 0, false, why, why_size);
	if (r < 0) {
		free(a);
		return r;
	}
	*ret = a;
	return 0;
}

static struct allocation *alloc(uint64_t size)
{
	struct allocation *a;
	char why[160];

	ck_assert_int_eq(try_alloc(size, &a, why, sizeof(why)), 0);
	return a;
}

static void free_allocation(struct allocation *a)
{
	allocation_retire(&mem, a);
	allocation_release(&mem, a, NULL, NULL);
	free(a);
}

START_TEST(test_alloc_find_and_free)
{
	struct allocation *a = alloc(5000), *b = alloc(4 * KiB);
	uint64_t at = allocation_address(a);

	ck_assert_uint_eq(a->length, 8 * KiB); /* whole pages */
	ck_assert_ptr_eq(a->arena, b->arena); /* room in the first arena */
	ck_assert_uint_eq(mem.n_arenas, 1);
	ck_assert_uint_ne(a->serial, b->serial);
	ck_assert_ptr_eq(a->owner, &owner);
	ck_assert_uint_eq(owner.allocated_bytes, 12 * KiB);
	ck_assert_uint_eq(mem.allocated_bytes, 12 * KiB);
	ck_assert_ptr_eq(allocation_find(&mem, at), a);
	ck_assert_ptr_null(allocation_find(&mem, at + 4 * KiB)); /* not its start */
	ck_assert_ptr_eq(allocation_containing(&mem, at + 8 * KiB - 1), a);
	ck_assert_ptr_eq(allocation_containing(&mem, allocation_address(b)), b);
	ck_assert_ptr_eq(memory_find_arena(&mem, at), a->arena);

	allocation_retire(&mem, a);
	ck_assert_ptr_null(allocation_containing(&mem, at)); /* nobody finds it from here on */
	ck_assert_ptr_null(a->owner);
	ck_assert_uint_eq(owner.allocated_bytes, 4 * KiB);
	ck_assert_uint_eq(mem.allocated_bytes, 12 * KiB); /* its pages are not back yet */
	ck_assert_uint_eq(mem.status.page->frees, 1);
	allocation_release(&mem, a, NULL, NULL);
	free(a);
	ck_assert_uint_eq(mem.allocated_bytes, 4 * KiB);
	free_allocation(b);
	ck_assert_uint_eq(mem.n_arenas, 1); /* one empty arena stays for the next */
	ck_assert_uint_eq(n_gone, 0);
	ck_assert_uint_eq(status_page_generation(&mem.status), 7);
	status_page_bump(&mem.status);
	ck_assert_uint_eq(status_page_generation(&mem.status), 8);
	/* Each move's record in the ring; one that is no range of memory is all of it. */
	ck_assert_uint_eq(mem.status.page->freed[8 % MRD_STATUS_FREED].generation, 8);
	ck_assert_uint_eq(mem.status.page->freed[8 % MRD_STATUS_FREED].start, 0);
	ck_assert_uint_eq(mem.status.page->freed[8 % MRD_STATUS_FREED].end, UINT64_MAX);
	for (uint64_t g = 9; g < 9 + MRD_STATUS_FREED; g++)
		status_page_bump_range(&mem.status, g << 12, (g + 1) << 12);
	for (uint64_t g = 9; g < 9 + MRD_STATUS_FREED; g++) {
		const struct mrd_status_freed *f = &mem.status.page->freed[g % MRD_STATUS_FREED];

		ck_assert_uint_eq(f->generation, g); /* the ring lapped 8's */
		ck_assert_uint_eq(f->start, g << 12);
		ck_assert_uint_eq(f->end, (g + 1) << 12);
	}
}
END_TEST

START_TEST(test_quotas)
{
	struct allocation *b;
	char why[160] = "";

	cfg.quota.allocations = 1;
	ck_assert_ptr_nonnull(alloc(4 * KiB));
	ck_assert_int_eq(try_alloc(4 * KiB, &b, why, sizeof(why)), -EDQUOT);
	ck_assert_ptr_nonnull(strstr(why, "quota.allocations"));
	cfg.quota.allocations = 16;

	cfg.quota.allocated_bytes = 8 * KiB;
	ck_assert_int_eq(try_alloc(8 * KiB, &b, why, sizeof(why)), -EDQUOT);
	ck_assert_ptr_nonnull(strstr(why, "quota.allocated_bytes"));
	b = alloc(4 * KiB); /* exactly the quota */
	cfg.quota.allocated_bytes = 64 * MiB;

	/* The first arena is full: a second one is past quota.arenas. */
	cfg.quota.arenas = 1;
	ck_assert_int_eq(try_alloc(4 * MiB, &b, why, sizeof(why)), -EDQUOT);
	ck_assert_ptr_nonnull(strstr(why, "quota.arenas"));
	cfg.quota.arenas = 64;

	/* The domain's share of the window: two arenas of 4 MiB. */
	cfg.quota.window_bytes = 8 * MiB;
	ck_assert_ptr_nonnull(alloc(4 * MiB));
	ck_assert_int_eq(try_alloc(4 * MiB, &b, why, sizeof(why)), -EDQUOT);
	ck_assert_ptr_nonnull(strstr(why, "quota.window_bytes"));
	ck_assert_uint_eq(mem.n_arenas, 2);
	ck_assert_uint_eq(mem.window_bytes, 8 * MiB);
}
END_TEST

START_TEST(test_emptied_arenas_go_back)
{
	struct allocation *a = alloc(4 * MiB), *b = alloc(4 * MiB), *big = alloc(8 * MiB);
	uint32_t id_b = b->arena->id, id_big = big->arena->id;

	ck_assert_uint_eq(mem.n_arenas, 3);
	free_allocation(a); /* the one empty arena kept */
	ck_assert_uint_eq(n_gone, 0);
	free_allocation(b); /* a second empty one goes */
	ck_assert_uint_eq(n_gone, 1);
	ck_assert_uint_eq(gone[0], id_b);
	free_allocation(big); /* oversized: made for one allocation */
	ck_assert_uint_eq(n_gone, 2);
	ck_assert_uint_eq(gone[1], id_big);
	ck_assert_uint_eq(mem.n_arenas, 1);
	ck_assert_uint_eq(mem.window_bytes, 4 * MiB);
}
END_TEST

START_TEST(test_orphans_claimed_by_their_process)
{
	struct allocation *run = alloc(64 * KiB), *orphan = calloc(1, sizeof(*orphan));
	struct arena *arena = run->arena;
	struct adopted_allocation saved = {
		.offset = 1 * MiB, .length = 8 * KiB, .serial = 99, .session = 5,
		.pid = getpid(), .uid = getuid(),
	};
	struct mem_owner later, other;

	ck_assert_int_eq(allocation_adopt(&mem, orphan, arena, &saved), 0);
	ck_assert(orphan->orphan);
	ck_assert_uint_eq(mem.n_orphans, 1);
	ck_assert_ptr_eq(allocation_containing(&mem, (uintptr_t)arena->base + 1 * MiB), orphan);
	saved.offset = 1 * MiB + 4 * KiB;
	ck_assert_int_eq(allocation_adopt(&mem, orphan, arena, &saved), -EEXIST); /* overlaps */

	mem_owner_init(&other, 6, getpid(), getuid());
	ck_assert_uint_eq(allocation_claim(&mem, &other, 6), 0); /* another session */
	mem_owner_init(&later, 5, getpid(), getuid());
	later.start_time = mem_owner_start_time(&later) + 1; /* a later process with its pid */
	orphan->claim_start_time = mem_owner_start_time(&owner);
	ck_assert_uint_eq(allocation_claim(&mem, &later, 5), 0);
	ck_assert_uint_eq(allocation_claim(&mem, &owner, 5), 1);
	ck_assert(!orphan->orphan);
	ck_assert_ptr_eq(orphan->owner, &owner);
	ck_assert_uint_eq(owner.allocated_bytes, 64 * KiB + 8 * KiB);
	ck_assert_uint_eq(mem.n_orphans, 0);
	ck_assert_uint_eq(allocation_claim(&mem, &owner, 5), 0); /* once */
	/* Its pages were never the buddy allocator's to give: it leaves with the arena. */
	allocation_retire(&mem, orphan);
	free(orphan);
}
END_TEST

static Suite *allocation_suite(void)
{
	Suite *s = suite_create("allocation");
	TCase *tc = tcase_create("memory");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_alloc_find_and_free);
	tcase_add_test(tc, test_quotas);
	tcase_add_test(tc, test_emptied_arenas_go_back);
	tcase_add_test(tc, test_orphans_claimed_by_their_process);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(allocation_suite());
}
