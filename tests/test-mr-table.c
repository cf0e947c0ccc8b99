/* SPDX-License-Identifier: MIT */
/* The sorted MR table and its 16-ary index against a plain model: random inserts and removes
 * across every layout change (1 to 3 index levels and back), lookups at and around every
 * boundary, duplicates, the ceiling and clear. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mr-table.h"
#include "check-run.h"

#define SLOTS 6000 /* possible entries: slot i is [i * 64, i * 64 + 48) */
#define STRIDE 64
#define LEN 48

static bool present[SLOTS];
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static struct mr_entry slot_entry(size_t i)
{
	return (struct mr_entry){ 4096 + i * STRIDE, 4096 + i * STRIDE + LEN, (uint32_t)i,
				  (uint32_t)~i };
}

/* Every address near every slot's edges finds what the model says. (Plain compares and one
 * ck_abort_msg: a ck_assert per probe would cost a write to Check's pipe each.) */
static void check_against_model(const struct mr_table *t, size_t n_present)
{
	ck_assert_uint_eq(t->n, n_present + 1);
	ck_assert(mr_table_lookup(t, 0) == NULL);
	ck_assert(mr_table_lookup(t, 4095) == NULL);
	ck_assert(mr_table_lookup(t, UINT64_MAX) == NULL);
	for (size_t i = 0; i < SLOTS; i++) {
		uint64_t base = 4096 + i * STRIDE;
		const uint64_t probes[] = { base, base + 1, base + LEN - 1, base + LEN,
					    base + STRIDE - 1 };

		for (size_t p = 0; p < 5; p++) {
			const struct mr_entry *e = mr_table_lookup(t, probes[p]);
			bool want = present[i] && probes[p] < base + LEN;

			if (want ? !e || e->lkey != i || e->start != base : e != NULL)
				ck_abort_msg("address 0x%llx (slot %zu, %s): found %s",
					     (unsigned long long)probes[p], i,
					     present[i] ? "present" : "absent",
					     e ? "an entry" : "nothing");
		}
	}
}

START_TEST(test_random_against_model)
{
	struct mr_table t;
	size_t n = 0;

	memset(present, 0, sizeof(present));
	ck_assert_int_eq(mr_table_init(&t, 2, 0), 0);
	check_against_model(&t, 0);
	/* Grow to most slots (through 1, 2 and 3 levels), then shrink back, checking often. */
	for (int phase = 0; phase < 2; phase++)
		for (int step = 0; step < 12000; step++) {
			size_t i = next() % SLOTS;
			bool add = phase == 0 ? next() % 4 != 0 : next() % 4 == 0;
			struct mr_entry e = slot_entry(i);

			if (add) {
				ck_assert_int_eq(mr_table_insert(&t, &e), present[i] ? -EEXIST : 0);
				n += !present[i];
				present[i] = true;
			} else {
				ck_assert_int_eq(mr_table_remove(&t, e.start), present[i] ? 0 : -ENOENT);
				n -= present[i];
				present[i] = false;
			}
			if (step % 1500 == 0)
				check_against_model(&t, n);
		}
	check_against_model(&t, n);
	mr_table_clear(&t);
	memset(present, 0, sizeof(present));
	check_against_model(&t, 0);
	mr_table_done(&t);
}
END_TEST

START_TEST(test_every_size)
{
	struct mr_table t;

	/* Each size from 0 to 300 entries, inserted in descending order: every layout edge. */
	memset(present, 0, sizeof(present));
	ck_assert_int_eq(mr_table_init(&t, 4, 0), 0);
	for (size_t k = 300; k-- > 0;) {
		struct mr_entry e = slot_entry(k);

		ck_assert_int_eq(mr_table_insert(&t, &e), 0);
		present[k] = true;
		check_against_model(&t, 300 - k);
	}
	mr_table_done(&t);
}
END_TEST

START_TEST(test_ceiling)
{
	struct mr_table t;
	struct mr_entry e;

	ck_assert_int_eq(mr_table_init(&t, 2, 8), 0); /* the sentinel and 7 entries */
	for (size_t i = 0; i < 7; i++) {
		e = slot_entry(i);
		ck_assert_int_eq(mr_table_insert(&t, &e), 0);
	}
	e = slot_entry(7);
	ck_assert_int_eq(mr_table_insert(&t, &e), -ENOSPC);
	ck_assert(t.overflow);
	/* What it holds is still right. */
	ck_assert_uint_eq(mr_table_lookup(&t, slot_entry(6).start)->lkey, 6);
	ck_assert_ptr_null(mr_table_lookup(&t, slot_entry(7).start));
	mr_table_clear(&t);
	ck_assert(!t.overflow);
	ck_assert_int_eq(mr_table_insert(&t, &e), 0);
	mr_table_done(&t);
}
END_TEST

/* The top of the address space: a full table (no slack past its entries) and an entry that
 * ends at UINT64_MAX. */
START_TEST(test_address_space_top)
{
	struct mr_table t;
	struct mr_entry e[3] = { slot_entry(0), slot_entry(1),
				 { UINT64_MAX - 8192, UINT64_MAX, 7, 7 } };

	ck_assert_int_eq(mr_table_init(&t, 4, 4), 0);
	ck_assert_int_eq(mr_table_insert_many(&t, e, 3), 0);
	ck_assert_uint_eq(t.n, t.cap);
	ck_assert_uint_eq(mr_table_floor(&t, UINT64_MAX), 3);
	ck_assert_ptr_null(mr_table_lookup(&t, UINT64_MAX));
	ck_assert_uint_eq(mr_table_lookup(&t, UINT64_MAX - 1)->lkey, 7);
	ck_assert_uint_eq(mr_table_lookup(&t, slot_entry(1).start)->lkey, 1);
	ck_assert_ptr_null(mr_table_lookup(&t, UINT64_MAX - 8193));
	mr_table_done(&t);
}
END_TEST

/* Slots for the interleaved test: four clusters far apart (the lowest near 0, the highest at
 * the top of the address space), so that the directory's buckets see crowding, empty
 * stretches, entries below its base and past its span; lengths vary. */
#define MIX_SLOTS 2048
#define MIX_CLUSTER 512

static bool mix_present[MIX_SLOTS];

static uint64_t mix_start(size_t i)
{
	static const uint64_t cluster[4] = { 4096, 1ull << 30, 1ull << 40,
					     UINT64_MAX - (MIX_CLUSTER + 1) * (uint64_t)STRIDE };

	return cluster[i / MIX_CLUSTER] + (i % MIX_CLUSTER) * STRIDE;
}

static uint64_t mix_len(size_t i)
{
	return 1 + (i * 37) % (STRIDE - 1);
}

/* Each edge of slot i and of its neighbours finds what the model says. */
static void mix_probe(const struct mr_table *t, size_t i, size_t step)
{
	for (size_t k = i > 0 ? i - 1 : 0; k <= i + 1 && k < MIX_SLOTS; k++) {
		uint64_t s = mix_start(k), len = mix_len(k);
		const uint64_t probes[] = { s, s + len - 1, s + len, s + STRIDE - 1 };

		for (size_t p = 0; p < 4; p++) {
			const struct mr_entry *e = mr_table_lookup(t, probes[p]);
			bool want = mix_present[k] && probes[p] < s + len;

			if (want ? !e || e->lkey != k || e->start != s || e->end != s + len : e != NULL)
				ck_abort_msg("step %zu: address 0x%llx (slot %zu, %s): found %s", step,
					     (unsigned long long)probes[p], k,
					     mix_present[k] ? "present" : "absent",
					     e ? "an entry" : "nothing");
		}
	}
}

/* Inserts and removes in random, ascending and descending runs, each followed by lookups
 * around it and, every so often, around every slot: a directory updated in place (or left
 * behind) must answer as the model after every change, not only after a rebuild. */
START_TEST(test_interleaved_against_model)
{
	struct mr_table t;
	size_t n = 0, step = 0;

	memset(mix_present, 0, sizeof(mix_present));
	ck_assert_int_eq(mr_table_init(&t, 2, 0), 0);
	for (int round = 0; round < 24; round++) {
		/* 0: random, mostly in; 1: random, mostly out; 2: a run up; 3: a run down */
		int kind = (int)(next() % 4);
		size_t at = next() % MIX_SLOTS, len = 1 + next() % 1500;
		bool in = kind == 0 || (kind >= 2 && next() % 2);

		for (size_t j = 0; j < len; j++, step++) {
			size_t i = kind < 2 ? next() % MIX_SLOTS :
				   kind == 2 ? (at + j) % MIX_SLOTS : (at + MIX_SLOTS - j) % MIX_SLOTS;
			bool add = kind == 0 ? next() % 4 != 0 : kind == 1 ? next() % 4 == 0 : in;
			struct mr_entry e = { mix_start(i), mix_start(i) + mix_len(i), (uint32_t)i,
					      (uint32_t)~i };

			if (add) {
				ck_assert_int_eq(mr_table_insert(&t, &e), mix_present[i] ? -EEXIST : 0);
				n += !mix_present[i];
				mix_present[i] = true;
			} else {
				ck_assert_int_eq(mr_table_remove(&t, e.start),
						 mix_present[i] ? 0 : -ENOENT);
				n -= mix_present[i];
				mix_present[i] = false;
			}
			ck_assert_uint_eq(t.n, n + 1);
			mix_probe(&t, i, step);
			mix_probe(&t, next() % MIX_SLOTS, step);
			if (step % 512 == 0)
				for (size_t k = 0; k < MIX_SLOTS; k += 3)
					mix_probe(&t, k, step);
		}
	}
	ck_assert(mr_table_lookup(&t, 0) == NULL);
	ck_assert(mr_table_lookup(&t, UINT64_MAX) == NULL);
	mr_table_done(&t);
}
END_TEST

/* Inserts one by one, then removes, in random order: the directory is rebuilt once in many
 * changes, not on each (as it was: 1.6 ms an insert at 64 K entries). */
START_TEST(test_rebuilds_amortised)
{
	struct mr_table t;
	size_t order[4096], builds;

	for (size_t i = 0; i < 4096; i++)
		order[i] = i;
	for (size_t i = 4095; i > 0; i--) {
		size_t j = next() % (i + 1), x = order[i];

		order[i] = order[j];
		order[j] = x;
	}
	ck_assert_int_eq(mr_table_init(&t, 2, 0), 0);
	builds = t.builds;
	for (size_t i = 0; i < 4096; i++) {
		struct mr_entry e = slot_entry(order[i]);

		ck_assert_int_eq(mr_table_insert(&t, &e), 0);
	}
	ck_assert_uint_le(t.builds - builds, 4096 / 16);
	builds = t.builds;
	for (size_t i = 0; i < 4096; i++)
		ck_assert_int_eq(mr_table_remove(&t, slot_entry(order[4095 - i]).start), 0);
	ck_assert_uint_le(t.builds - builds, 4096 / 16);
	ck_assert_uint_eq(t.n, 1);
	mr_table_done(&t);
}
END_TEST

/* The two ends of the address space, changed in place (no rebuild between): an entry at 0
 * shares its start with the sentinel, one ending at UINT64_MAX lies past every bucket, and
 * removing either, first or last, leaves the rest found and the end empty again. */
START_TEST(test_address_space_ends_in_place)
{
	struct mr_table t;
	struct mr_entry low = { 0, 4096, 1, 1 }, top = { UINT64_MAX - 4096, UINT64_MAX, 2, 2 };
	struct mr_entry mid = slot_entry(5);
	size_t builds;

	ck_assert_int_eq(mr_table_init(&t, 2, 0), 0);
	builds = t.builds;
	ck_assert_int_eq(mr_table_insert(&t, &mid), 0);
	ck_assert_int_eq(mr_table_insert(&t, &top), 0);
	ck_assert_int_eq(mr_table_insert(&t, &low), 0); /* below the base */
	ck_assert_int_eq(mr_table_insert(&t, &low), -EEXIST);
	ck_assert_uint_eq(t.builds, builds); /* all in place */
	ck_assert_uint_eq(mr_table_lookup(&t, 0)->lkey, 1);
	ck_assert_uint_eq(mr_table_lookup(&t, 4095)->lkey, 1);
	ck_assert_ptr_null(mr_table_lookup(&t, 4096));
	ck_assert_uint_eq(mr_table_lookup(&t, mid.start)->lkey, 5);
	ck_assert_uint_eq(mr_table_lookup(&t, UINT64_MAX - 1)->lkey, 2);
	ck_assert_ptr_null(mr_table_lookup(&t, UINT64_MAX));
	ck_assert_int_eq(mr_table_remove(&t, 0), 0); /* the first */
	ck_assert_int_eq(mr_table_remove(&t, 0), -ENOENT);
	ck_assert_ptr_null(mr_table_lookup(&t, 0));
	ck_assert_uint_eq(mr_table_lookup(&t, mid.end - 1)->lkey, 5);
	ck_assert_int_eq(mr_table_remove(&t, top.start), 0); /* the last */
	ck_assert_ptr_null(mr_table_lookup(&t, UINT64_MAX - 1));
	ck_assert_uint_eq(mr_table_lookup(&t, mid.start)->lkey, 5);
	ck_assert_int_eq(mr_table_remove(&t, mid.start), 0);
	ck_assert_uint_eq(t.builds, builds);
	for (uint64_t a = 0; a < 8192; a += 1024)
		ck_assert_ptr_null(mr_table_lookup(&t, a));
	ck_assert_ptr_null(mr_table_lookup(&t, UINT64_MAX));
	ck_assert_int_eq(mr_table_insert(&t, &top), 0); /* into a table emptied in place */
	ck_assert_uint_eq(mr_table_lookup(&t, UINT64_MAX - 4096)->lkey, 2);
	ck_assert_ptr_null(mr_table_lookup(&t, mid.start));
	mr_table_done(&t);
}
END_TEST

/* Ranges removed against the model: ones that cut into entries at either edge, ones that fall
 * in a gap, ones that take one entry or many (the one-move path), the ends of the space. */
START_TEST(test_remove_range_against_model)
{
	struct mr_table t;
	size_t n = 0;

	memset(present, 0, sizeof(present));
	ck_assert_int_eq(mr_table_init(&t, 2, 0), 0);
	for (size_t i = 0; i < SLOTS; i++)
		if (next() % 3 != 0) {
			struct mr_entry e = slot_entry(i);

			ck_assert_int_eq(mr_table_insert(&t, &e), 0);
			present[i] = true;
			n++;
		}
	for (int step = 0; step < 3000; step++) {
		/* Up to 40 slots long, from anywhere in a slot (the gap after LEN included). */
		uint64_t start = 4096 + (next() % SLOTS) * STRIDE + next() % STRIDE;
		uint64_t end = start + 1 + next() % (step % 2 ? STRIDE : 40 * STRIDE);
		size_t want = 0;

		for (size_t i = 0; i < SLOTS; i++) {
			uint64_t base = 4096 + i * STRIDE;

			if (present[i] && base < end && base + LEN > start) {
				present[i] = false;
				want++;
			}
		}
		ck_assert_uint_eq(mr_table_remove_range(&t, start, end), want);
		n -= want;
		if (step % 300 == 0)
			check_against_model(&t, n);
		/* Some back in, so that it never runs dry. */
		for (int k = 0; k < 4; k++) {
			size_t i = next() % SLOTS;
			struct mr_entry e = slot_entry(i);

			if (!present[i]) {
				ck_assert_int_eq(mr_table_insert(&t, &e), 0);
				present[i] = true;
				n++;
			}
		}
	}
	check_against_model(&t, n);
	/* Exactly at the edges: [start, end) of an entry takes it, one byte off either way
	 * takes it too, the gap between two takes none. */
	memset(present, 0, sizeof(present));
	mr_table_clear(&t);
	for (size_t i = 0; i < 4; i++) {
		struct mr_entry e = slot_entry(i);

		ck_assert_int_eq(mr_table_insert(&t, &e), 0);
	}
	ck_assert_uint_eq(mr_table_remove_range(&t, 4096 + LEN, 4096 + STRIDE), 0);
	ck_assert_uint_eq(mr_table_remove_range(&t, 4096 + STRIDE - 1, 4096 + STRIDE), 0);
	ck_assert_uint_eq(mr_table_remove_range(&t, 4096 + LEN - 1, 4096 + LEN), 1);
	ck_assert_ptr_null(mr_table_lookup(&t, 4096));
	ck_assert_uint_eq(mr_table_remove_range(&t, 4096 + 2 * STRIDE - 1, 4096 + 2 * STRIDE + 1), 1);
	ck_assert_uint_eq(mr_table_lookup(&t, 4096 + STRIDE)->lkey, 1);
	ck_assert_uint_eq(mr_table_remove_range(&t, 0, UINT64_MAX), 2);
	ck_assert_uint_eq(t.n, 1);
	ck_assert_uint_eq(mr_table_remove_range(&t, 0, UINT64_MAX), 0);
	mr_table_done(&t);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mr-table");
	TCase *tc = tcase_create("table");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_random_against_model);
	tcase_add_test(tc, test_every_size);
	tcase_add_test(tc, test_interleaved_against_model);
	tcase_add_test(tc, test_rebuilds_amortised);
	tcase_add_test(tc, test_ceiling);
	tcase_add_test(tc, test_address_space_top);
	tcase_add_test(tc, test_address_space_ends_in_place);
	tcase_add_test(tc, test_remove_range_against_model);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
