/* SPDX-License-Identifier: MIT */
/* The pin map locks a page once however many registrations cover it, and unlocks it with the
 * last one; unpinning needs no memory. Lock calls are recorded instead of made. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>

#include "provider/pin-map.h"
#include "check-run.h"

#define P 4096u

static struct pin_map m;
static uint64_t locked_now;   /* bytes our fake mlock holds */
static unsigned lock_calls, unlock_calls;
static int fail_lock_at;      /* fail the n-th lock call (1-based); 0: never */

static int fake_lock(uintptr_t start, size_t len)
{
	if (++lock_calls == (unsigned)fail_lock_at)
		return -ENOMEM;
	locked_now += len;
	return 0;
}

static int fake_unlock(uintptr_t start, size_t len)
{
	unlock_calls++;
	ck_assert_uint_ge(locked_now, len);
	locked_now -= len;
	return 0;
}

static void setup(void)
{
	pin_map_init(&m);
	m.lock = fake_lock;
	m.unlock = fake_unlock;
	locked_now = 0;
	lock_calls = unlock_calls = 0;
	fail_lock_at = 0;
}

static void teardown(void)
{
	pin_map_done(&m);
	ck_assert_uint_eq(locked_now, 0); /* done unlocks whatever was left */
}

START_TEST(test_overlap_counts_once)
{
	ck_assert_int_eq(pin_map_pin(&m, 10 * P, 20 * P), 0);
	ck_assert_int_eq(pin_map_pin(&m, 15 * P, 30 * P), 0);
	ck_assert_uint_eq(m.pinned_bytes, 20 * P);
	ck_assert_uint_eq(locked_now, 20 * P); /* only the new pages 20..30 were locked again */
	ck_assert_uint_eq(lock_calls, 2);
	ck_assert_uint_eq(pin_map_count(&m, 12 * P), 1);
	ck_assert_uint_eq(pin_map_count(&m, 17 * P), 2);
	ck_assert_uint_eq(pin_map_count(&m, 25 * P), 1);
	ck_assert_uint_eq(pin_map_count(&m, 30 * P), 0);

	ck_assert_int_eq(pin_map_unpin(&m, 10 * P, 20 * P), 0);
	ck_assert_uint_eq(m.pinned_bytes, 15 * P); /* 10..15 went; 15..20 is still held */
	ck_assert_uint_eq(locked_now, 15 * P);
	ck_assert_uint_eq(pin_map_count(&m, 17 * P), 1);
	ck_assert_int_eq(pin_map_unpin(&m, 15 * P, 30 * P), 0);
	ck_assert_uint_eq(m.pinned_bytes, 0);
	ck_assert_uint_eq(locked_now, 0);
	ck_assert_uint_eq(m.n, 0);
}
END_TEST

START_TEST(test_fill_gaps)
{
	ck_assert_int_eq(pin_map_pin(&m, 0, 2 * P), 0);
	ck_assert_int_eq(pin_map_pin(&m, 4 * P, 6 * P), 0);
	ck_assert_int_eq(pin_map_pin(&m, 8 * P, 10 * P), 0);
	/* Spanning all three locks only the two holes between them. */
	lock_calls = 0;
	ck_assert_int_eq(pin_map_pin(&m, 0, 10 * P), 0);
	ck_assert_uint_eq(lock_calls, 2);
	ck_assert_uint_eq(m.pinned_bytes, 10 * P);
	ck_assert_uint_eq(pin_map_count(&m, 3 * P), 1);
	ck_assert_uint_eq(pin_map_count(&m, 5 * P), 2);
	ck_assert_int_eq(pin_map_unpin(&m, 0, 10 * P), 0);
	ck_assert_uint_eq(m.pinned_bytes, 6 * P);
	ck_assert_uint_eq(m.n, 3);
}
END_TEST

START_TEST(test_same_range_twice)
{
	ck_assert_int_eq(pin_map_pin(&m, P, 3 * P), 0);
	ck_assert_int_eq(pin_map_pin(&m, P, 3 * P), 0);
	ck_assert_uint_eq(lock_calls, 1);
	ck_assert_int_eq(pin_map_unpin(&m, P, 3 * P), 0);
	ck_assert_uint_eq(unlock_calls, 0);
	ck_assert_int_eq(pin_map_unpin(&m, P, 3 * P), 0);
	ck_assert_uint_eq(unlock_calls, 1);
	ck_assert_uint_eq(m.pinned_bytes, 0);
}
END_TEST

START_TEST(test_unpin_unpinned_refused)
{
	ck_assert_int_eq(pin_map_pin(&m, 0, 2 * P), 0);
	ck_assert_int_eq(pin_map_unpin(&m, P, 3 * P), -EINVAL); /* page 2 was never pinned */
	ck_assert_uint_eq(m.pinned_bytes, 2 * P);                /* and nothing changed */
	ck_assert_uint_eq(pin_map_count(&m, P), 1);
	ck_assert_int_eq(pin_map_unpin(&m, 5 * P, 6 * P), -EINVAL);
	ck_assert_int_eq(pin_map_pin(&m, 3 * P, 3 * P), -EINVAL); /* empty */
}
END_TEST

START_TEST(test_lock_failure_rolls_back)
{
	ck_assert_int_eq(pin_map_pin(&m, 2 * P, 4 * P), 0);
	ck_assert_int_eq(pin_map_pin(&m, 6 * P, 8 * P), 0);
	/* Spanning 0..10 needs three locks (0..2, 4..6, 8..10): the third fails. */
	fail_lock_at = lock_calls + 3;
	ck_assert_int_eq(pin_map_pin(&m, 0, 10 * P), -ENOMEM);
	ck_assert_uint_eq(locked_now, 4 * P); /* the two that worked were undone */
	ck_assert_uint_eq(m.pinned_bytes, 4 * P);
	ck_assert_uint_eq(pin_map_count(&m, 3 * P), 1);
	ck_assert_uint_eq(pin_map_count(&m, 5 * P), 0);
}
END_TEST

START_TEST(test_many_segments)
{
	/* Every other page, then everything: counts stay exact across 1,000 segments. */
	for (uintptr_t i = 0; i < 2000; i += 2)
		ck_assert_int_eq(pin_map_pin(&m, i * P, (i + 1) * P), 0);
	ck_assert_uint_eq(m.n, 1000);
	ck_assert_int_eq(pin_map_pin(&m, 0, 2000 * P), 0);
	ck_assert_uint_eq(m.pinned_bytes, 2000 * P);
	for (uintptr_t i = 0; i < 2000; i += 2)
		ck_assert_int_eq(pin_map_unpin(&m, i * P, (i + 1) * P), 0);
	ck_assert_uint_eq(m.n, 1); /* merged back into one run of count 1 */
	ck_assert_uint_eq(m.pinned_bytes, 2000 * P);
}
END_TEST

/* Adjacent pins merge into one segment; unpinning every other one splits it again, each time
 * without growing the map (an unpin must not fail for want of memory). */
START_TEST(test_unpin_within_room)
{
	size_t cap;

	for (uintptr_t i = 0; i < 1000; i++)
		ck_assert_int_eq(pin_map_pin(&m, i * P, (i + 1) * P), 0);
	ck_assert_uint_eq(m.n, 1);
	cap = m.cap;
	for (uintptr_t i = 0; i < 1000; i += 2)
		ck_assert_int_eq(pin_map_unpin(&m, i * P, (i + 1) * P), 0);
	ck_assert_uint_eq(m.n, 500);
	ck_assert_uint_eq(m.cap, cap);
	ck_assert_uint_eq(m.pinned_bytes, 500 * P);
	for (uintptr_t i = 1; i < 1000; i += 2)
		ck_assert_int_eq(pin_map_unpin(&m, i * P, (i + 1) * P), 0);
	ck_assert_uint_eq(m.n, 0);
	ck_assert_uint_eq(m.pinned_bytes, 0);
}
END_TEST

START_TEST(test_unpinned_bytes)
{
	ck_assert_uint_eq(pin_map_unpinned_bytes(&m, 0, 10 * P), 10 * P);
	ck_assert_int_eq(pin_map_pin(&m, 2 * P, 4 * P), 0);
	ck_assert_int_eq(pin_map_pin(&m, 3 * P, 6 * P), 0);
	ck_assert_int_eq(pin_map_pin(&m, 8 * P, 9 * P), 0);
	ck_assert_uint_eq(pin_map_unpinned_bytes(&m, 0, 10 * P), 5 * P);
	ck_assert_uint_eq(pin_map_unpinned_bytes(&m, 3 * P, 5 * P), 0);
	ck_assert_uint_eq(pin_map_unpinned_bytes(&m, 5 * P, 9 * P), 2 * P);
	ck_assert_uint_eq(pin_map_unpinned_bytes(&m, 9 * P, 12 * P), 3 * P);
	ck_assert_uint_eq(pin_map_unpinned_bytes(&m, P, P + 1), 1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pin-map");
	TCase *tc = tcase_create("counts");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_overlap_counts_once);
	tcase_add_test(tc, test_fill_gaps);
	tcase_add_test(tc, test_same_range_twice);
	tcase_add_test(tc, test_unpin_unpinned_refused);
	tcase_add_test(tc, test_lock_failure_rolls_back);
	tcase_add_test(tc, test_many_segments);
	tcase_add_test(tc, test_unpin_within_room);
	tcase_add_test(tc, test_unpinned_bytes);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
