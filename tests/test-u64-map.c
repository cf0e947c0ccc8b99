/* SPDX-License-Identifier: MIT */
/* The address map: puts, gets and removals checked against a plain array. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "u64-map.h"
#include "check-run.h"

START_TEST(test_basic)
{
	struct u64_map m = {};
	int v1, v2;

	ck_assert_ptr_null(u64_map_get(&m, 42));
	ck_assert_ptr_null(u64_map_remove(&m, 42));
	ck_assert_int_eq(u64_map_put(&m, 0, &v1), -EINVAL);
	ck_assert_int_eq(u64_map_put(&m, 42, &v1), 0);
	ck_assert_int_eq(u64_map_put(&m, 42, &v2), -EEXIST);
	ck_assert_ptr_eq(u64_map_get(&m, 42), &v1);
	ck_assert_ptr_eq(u64_map_remove(&m, 42), &v1);
	ck_assert_ptr_null(u64_map_get(&m, 42));
	ck_assert_uint_eq(m.n, 0);
	u64_map_done(&m);
}
END_TEST

START_TEST(test_against_model)
{
	/* Page-aligned keys in a small range collide a lot: removals must keep probe runs. */
	enum { N = 4096 };
	static uintptr_t model[N];
	struct u64_map m = {};

	srand(3);
	for (int step = 0; step < 200000; step++) {
		int k = rand() % N;
		uint64_t key = 0x200000000000ULL + (uint64_t)k * 4096;

		if (rand() % 3) {
			int r = u64_map_put(&m, key, (void *)(uintptr_t)(k + 1));
			ck_assert_int_eq(r, model[k] ? -EEXIST : 0);
			model[k] = (uintptr_t)(k + 1);
		} else {
			void *v = u64_map_remove(&m, key);
			ck_assert_ptr_eq(v, (void *)model[k]);
			model[k] = 0;
		}
	}
	size_t n = 0;
	for (int k = 0; k < N; k++) {
		uint64_t key = 0x200000000000ULL + (uint64_t)k * 4096;
		ck_assert_ptr_eq(u64_map_get(&m, key), (void *)model[k]);
		n += model[k] != 0;
	}
	ck_assert_uint_eq(m.n, n);
	u64_map_done(&m);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("u64-map");
	TCase *tc = tcase_create("map");

	tcase_add_test(tc, test_basic);
	tcase_add_test(tc, test_against_model);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
