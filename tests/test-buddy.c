/* SPDX-License-Identifier: MIT */
/* The arena page allocator: exact runs, alignment, coalescing, exhaustion, fragmentation. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "memory/buddy.h"
#include "check-run.h"

static struct buddy b;

static void setup(void) { ck_assert_int_eq(buddy_init(&b, 1024), 0); }
static void teardown(void) { buddy_done(&b); }

START_TEST(test_init_rules)
{
	struct buddy x;

	ck_assert_int_eq(buddy_init(&x, 0), -EINVAL);
	ck_assert_int_eq(buddy_init(&x, 1000), -EINVAL); /* not a power of two */
	ck_assert_int_eq(buddy_init(&x, 1), 0);
	ck_assert_int_eq(buddy_alloc(&x, 1, 1), 0);
	ck_assert_int_eq(buddy_alloc(&x, 1, 1), -ENOMEM);
	buddy_done(&x);
}
END_TEST

START_TEST(test_exact_runs)
{
	/* 5 pages cost 5 pages, not 8: the tail goes back. */
	int64_t a = buddy_alloc(&b, 5, 1), c;

	ck_assert_int_eq(a, 0);
	ck_assert_uint_eq(b.free_pages, 1019);
	c = buddy_alloc(&b, 3, 1);
	ck_assert_int_ge(c, 5);
	ck_assert_uint_eq(b.free_pages, 1016);
	buddy_free(&b, (uint32_t)a, 5);
	buddy_free(&b, (uint32_t)c, 3);
	ck_assert_uint_eq(b.free_pages, 1024);
	ck_assert_int_eq(buddy_alloc(&b, 1024, 1), 0); /* fully coalesced */
}
END_TEST

START_TEST(test_alignment)
{
	int64_t one = buddy_alloc(&b, 1, 1), x;

	ck_assert_int_eq(one, 0);
	x = buddy_alloc(&b, 3, 64);
	ck_assert_int_eq(x % 64, 0);
	ck_assert_int_ne(x, 0);
	x = buddy_alloc(&b, 100, 256);
	ck_assert_int_eq(x % 256, 0);
	ck_assert_int_eq(buddy_alloc(&b, 1, 3), -EINVAL); /* not a power of two */
	ck_assert_int_eq(buddy_alloc(&b, 0, 1), -EINVAL);
	ck_assert_int_eq(buddy_alloc(&b, 2048, 1), -EINVAL);
}
END_TEST

START_TEST(test_exhaustion)
{
	for (int i = 0; i < 1024; i++)
		ck_assert_int_eq(buddy_alloc(&b, 1, 1), i);
	ck_assert_int_eq(buddy_alloc(&b, 1, 1), -ENOMEM);
	ck_assert_uint_eq(b.free_pages, 0);
	buddy_free(&b, 517, 1);
	ck_assert_int_eq(buddy_alloc(&b, 1, 1), 517);
}
END_TEST

START_TEST(test_fragmentation)
{
	/* Every other page taken: 512 pages free but no run of two. */
	for (int i = 0; i < 1024; i++)
		ck_assert_int_eq(buddy_alloc(&b, 1, 1), i);
	for (int i = 0; i < 1024; i += 2)
		buddy_free(&b, (uint32_t)i, 1);
	ck_assert_uint_eq(b.free_pages, 512);
	ck_assert_int_eq(buddy_alloc(&b, 2, 1), -ENOMEM);
	/* Freeing the odd pages coalesces everything back. */
	for (int i = 1; i < 1024; i += 2)
		buddy_free(&b, (uint32_t)i, 1);
	ck_assert_int_eq(buddy_alloc(&b, 1024, 1), 0);
}
END_TEST

START_TEST(test_random_against_model)
{
	/* Random runs, checked against a page map: never overlapping, always coalescing. */
	static uint8_t owner[1024];
	struct { int64_t first; uint32_t n; } live[256];
	int n_live = 0;

	memset(owner, 0, sizeof(owner));
	srand(7);
	for (int step = 0; step < 20000; step++) {
		if (n_live < 256 && (rand() & 1)) {
			uint32_t n = 1 + (uint32_t)(rand() % 40), align = 1u << (rand() % 4);
			int64_t first = buddy_alloc(&b, n, align);

			if (first == -ENOMEM)
				continue;
			ck_assert_int_ge(first, 0);
			ck_assert_int_eq(first % align, 0);
			for (uint32_t p = 0; p < n; p++) {
				ck_assert_msg(!owner[first + p], "page %lld handed out twice",
					      (long long)(first + p));
				owner[first + p] = 1;
			}
			live[n_live].first = first;
			live[n_live++].n = n;
		} else if (n_live > 0) {
			int k = rand() % n_live;

			for (uint32_t p = 0; p < live[k].n; p++)
				owner[live[k].first + p] = 0;
			buddy_free(&b, (uint32_t)live[k].first, live[k].n);
			live[k] = live[--n_live];
		}
	}
	while (n_live > 0) {
		n_live--;
		buddy_free(&b, (uint32_t)live[n_live].first, live[n_live].n);
	}
	ck_assert_uint_eq(b.free_pages, 1024);
	ck_assert_int_eq(buddy_alloc(&b, 1024, 1), 0);
}
END_TEST

/* Frees every page that owner does not mark, run by run. */
static void free_gaps(struct buddy *r, const uint8_t *owner)
{
	uint32_t next = 0;

	for (uint32_t p = 0; p <= r->n_pages; p++) {
		if (p < r->n_pages && !owner[p])
			continue;
		if (p > next)
			buddy_free(r, next, p - next);
		next = p + 1;
	}
}

/* A warm restart's rebuild: the gaps between adopted runs freed into an allocator that starts
 * full. It must never hand out an adopted page, and must coalesce back to one block. */
START_TEST(test_rebuild_from_runs)
{
	static uint8_t owner[1024];
	struct { uint32_t first, n; } live[64];
	struct buddy r;
	int n_live = 0;
	int64_t page;

	memset(owner, 0, sizeof(owner));
	srand(11);
	for (int i = 0; i < 64; i++) {
		uint32_t n = 1 + (uint32_t)(rand() % 20);
		int64_t first = buddy_alloc(&b, n, 1u << (rand() % 3));

		if (first < 0)
			break;
		live[n_live].first = (uint32_t)first;
		live[n_live++].n = n;
		for (uint32_t p = 0; p < n; p++)
			owner[first + p] = 1;
	}
	ck_assert_int_gt(n_live, 10);

	ck_assert_int_eq(buddy_init_used(&r, 1024), 0);
	ck_assert_uint_eq(r.free_pages, 0);
	ck_assert_int_eq(buddy_alloc(&r, 1, 1), -ENOMEM);
	free_gaps(&r, owner);
	ck_assert_uint_eq(r.free_pages, b.free_pages);
	while ((page = buddy_alloc(&r, 1, 1)) >= 0)
		ck_assert_msg(!owner[page], "page %lld of an adopted run handed out", (long long)page);
	ck_assert_int_eq(page, -ENOMEM);
	buddy_done(&r);

	/* The same again, then every adopted run freed: one whole block. */
	ck_assert_int_eq(buddy_init_used(&r, 1024), 0);
	free_gaps(&r, owner);
	for (int i = 0; i < n_live; i++)
		buddy_free(&r, live[i].first, live[i].n);
	ck_assert_uint_eq(r.free_pages, 1024);
	ck_assert_int_eq(buddy_alloc(&r, 1024, 1), 0);
	buddy_done(&r);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("buddy");
	TCase *tc = tcase_create("allocator");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_init_rules);
	tcase_add_test(tc, test_exact_runs);
	tcase_add_test(tc, test_alignment);
	tcase_add_test(tc, test_rebuild_from_runs);
	tcase_add_test(tc, test_exhaustion);
	tcase_add_test(tc, test_fragmentation);
	tcase_add_test(tc, test_random_against_model);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
