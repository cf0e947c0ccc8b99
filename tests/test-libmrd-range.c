/* SPDX-License-Identifier: MIT */
/* Length-aware lookups (mrd_keys_query_range, mrd_cache_keys_range) and the batched query
 * (mrd_keys_query_batch) against a real mrd: one MR covers the whole range whatever [cache]
 * policy says, a range past its allocation is refused, a batch answers each address. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define KiB 1024ul

static struct mrd_proc mrd;

static void start(const char *policy)
{
	char conf[256];

	snprintf(conf, sizeof(conf), "[memory]\nhugepages = no\narena_size = 64M\n"
		 "[cache]\npolicy = %s\n", policy);
	ck_assert_int_eq(mrd_proc_start(&mrd, conf, NULL), 0);
}

static void setup_page(void)
{
	start("page");
}

static void setup_contig(void)
{
	start("contig");
}

static void teardown(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}

static mrd_client *connect_ok(void)
{
	mrd_client *c = NULL;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	return c;
}

#define MiB (1ul << 20)

/* Fills src with a pattern and DMAs len bytes of it to dst by the keys given. */
static int dma_by(mrd_client *c, const struct mrd_keys *sk, uint8_t *src,
		  const struct mrd_keys *dk, uint8_t *dst, size_t len)
{
	for (size_t i = 0; i < len; i++)
		src[i] = (uint8_t)(i * 7 + 1);
	memset(dst, 0, len);
	return mrd_dma(c, MRD_DMA_WRITE, sk->lkey, src, dk->rkey, dst, len);
}

/* Under policy page a lookup of the first byte covers its 4 KiB page alone: a DMA of the
 * whole 64 KiB buffer by those keys falls outside the MR. The range's keys cover it all. */
START_TEST(test_page_policy_range_covers_the_buffer)
{
	mrd_client *c = connect_ok();
	struct mrd_keys k, sk, dk;
	uint8_t *src, *dst;
	mrd_cache *l;

	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&src), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&dst), 0);
	ck_assert_int_eq(mrd_keys_query(c, src, &k), 0);
	ck_assert_uint_eq(k.end - k.start, 4 * KiB);
	ck_assert_int_eq(dma_by(c, &k, src, &k, dst, 64 * KiB), -EFAULT);

	ck_assert_int_eq(mrd_keys_query_range(c, src, 64 * KiB, &sk), 0);
	ck_assert_uint_le(sk.start, (uintptr_t)src);
	ck_assert_uint_ge(sk.end, (uintptr_t)src + 64 * KiB);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_keys_range(l, dst, 64 * KiB, &dk), 0);
	ck_assert_uint_ge(dk.end, (uintptr_t)dst + 64 * KiB);
	ck_assert_int_eq(dma_by(c, &sk, src, &dk, dst, 64 * KiB), 0);
	ck_assert_int_eq(memcmp(src, dst, 64 * KiB), 0);
	/* The same range again, and one inside it: the MR mrd made, no new one. */
	ck_assert_int_eq(mrd_keys_query_range(c, src, 64 * KiB, &k), 0);
	ck_assert_uint_eq(k.lkey, sk.lkey);
	ck_assert_int_eq(mrd_keys_query_range(c, src + 100, 8000, &k), 0);
	ck_assert_uint_eq(k.lkey, sk.lkey);
	/* The cache hits the whole range, and parts of it, without asking mrd again. */
	ck_assert_uint_eq(mrd_cache_asked(l), 1);
	ck_assert_int_eq(mrd_cache_keys_range(l, dst + 4 * KiB, 60 * KiB, &k), 0);
	ck_assert_int_eq(mrd_cache_keys_range(l, dst, 64 * KiB, &k), 0);
	ck_assert_uint_eq(k.rkey, dk.rkey);
	ck_assert_uint_eq(mrd_cache_asked(l), 1);
	/* A single address still gets keys (the range's entry holds it). */
	ck_assert_int_eq(mrd_cache_keys(l, dst + 5000, &k), 0);
	mrd_cache_free(l);

	/* Freed: the range's MR goes with the allocation. */
	ck_assert_int_eq(mrd_mem_free(c, src), 0);
	ck_assert_int_eq(dma_by(c, &dk, dst, &sk, src, 16), -ENOKEY);
	ck_assert_int_eq(mrd_keys_query_range(c, src, 64 * KiB, &k), -ENOENT);
	mrd_client_close(c);
}
END_TEST

/* A range past the end of its allocation is refused, clearly; an empty one too. */
START_TEST(test_range_past_the_allocation_refused)
{
	mrd_client *c = connect_ok();
	struct mrd_keys k = { 1, 2, 3, 4 };
	uint8_t *p, *q;
	mrd_cache *l;

	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&q), 0);
	ck_assert_int_eq(mrd_keys_query_range(c, p + 60 * KiB, 4 * KiB + 1, &k), -ERANGE);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "crosses the end of its allocation"));
	ck_assert_uint_eq(k.lkey, 3); /* untouched on failure */
	ck_assert_int_eq(mrd_keys_query_range(c, p + 60 * KiB, 4 * KiB, &k), 0);
	ck_assert_int_eq(mrd_keys_query_range(c, p, 0, &k), -EINVAL);
	ck_assert_int_eq(mrd_keys_query_range(c, p, SIZE_MAX, &k), -EINVAL);
	ck_assert_int_eq(mrd_keys_query_range(NULL, p, 1, &k), -EINVAL);
	ck_assert_int_eq(mrd_keys_query_range(c, (void *)0x1000, 1, &k), -ENOENT);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_keys_range(l, q, 128 * KiB, &k), -ERANGE);
	ck_assert_int_eq(mrd_cache_keys_range(l, q, 0, &k), -EINVAL);
	/* A cached entry covering part of the range is a miss: mrd refuses the rest. */
	ck_assert_int_eq(mrd_cache_keys_range(l, q, 64 * KiB, &k), 0);
	ck_assert_int_eq(mrd_cache_keys_range(l, q + 4 * KiB, 64 * KiB, &k), -ERANGE);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

/* A range bigger than [cache] async_bytes is registered on a worker: its keys cover it. */
START_TEST(test_big_range_on_a_worker)
{
	mrd_client *c = connect_ok();
	struct mrd_keys sk, dk;
	uint8_t *src, *dst;

	ck_assert_int_eq(mrd_mem_alloc(c, 4 * MiB, 0, 0, (void **)&src), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4 * MiB, 0, 0, (void **)&dst), 0);
	ck_assert_int_eq(mrd_keys_query_range(c, src + 5, 3 * MiB, &sk), 0);
	ck_assert_int_eq(mrd_keys_query_range(c, dst + 5, 3 * MiB, &dk), 0);
	ck_assert_uint_ge(sk.end, (uintptr_t)src + 5 + 3 * MiB);
	ck_assert_int_eq(dma_by(c, &sk, src + 5, &dk, dst + 5, 3 * MiB), 0);
	ck_assert_int_eq(memcmp(src + 5, dst + 5, 3 * MiB), 0);
	mrd_client_close(c);
}
END_TEST

/* One request for several addresses: each fails alone. */
START_TEST(test_batch_mixed)
{
	mrd_client *c = connect_ok();
	struct mrd_keys keys[5];
	int errors[5];
	uint8_t *p;

	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&p), 0);
	{
		const void *addrs[5] = { p, (void *)0x1000, p + 4 * KiB, p + 60 * KiB, p + 100 };
		const size_t lens[5] = { 64 * KiB, 1, 8 * KiB, 8 * KiB, 1 };

		ck_assert_int_eq(mrd_keys_query_batch(c, addrs, lens, 5, keys, errors), 3);
		ck_assert_int_eq(errors[0], 0);
		ck_assert_int_eq(errors[1], -ENOENT);
		ck_assert_int_eq(errors[2], 0);
		ck_assert_int_eq(errors[3], -ERANGE);
		ck_assert_int_eq(errors[4], 0);
		ck_assert_uint_ge(keys[0].end, (uintptr_t)p + 64 * KiB);
		ck_assert_uint_ge(keys[2].end, (uintptr_t)p + 12 * KiB);
		ck_assert_uint_eq(keys[1].lkey, MRD_KEY_INVALID);
		ck_assert_uint_eq(keys[1].rkey, MRD_KEY_INVALID);
		ck_assert_uint_eq(keys[3].end, 0);
		/* Without lengths: each address alone (p + 60 KiB too), its page under policy
		 * page. */
		ck_assert_int_eq(mrd_keys_query_batch(c, addrs, NULL, 5, keys, NULL), 4);
		ck_assert_uint_eq(keys[4].end - keys[4].start, 4 * KiB);
		ck_assert_uint_eq(keys[1].lkey, MRD_KEY_INVALID);
	}
	mrd_client_close(c);
}
END_TEST

START_TEST(test_batch_limits)
{
	mrd_client *c = connect_ok();
	const void *addrs[65];
	struct mrd_keys keys[65];
	int errors[65];
	uint8_t *p;

	ck_assert_int_eq(mrd_mem_alloc(c, 65 * 4 * KiB, 0, 0, (void **)&p), 0);
	for (int i = 0; i < 65; i++)
		addrs[i] = p + i * 4 * KiB + 1;
	ck_assert_int_eq(mrd_keys_query_batch(c, addrs, NULL, 64, keys, errors), 64);
	for (int i = 0; i < 64; i++) {
		ck_assert_int_eq(errors[i], 0);
		ck_assert_uint_eq(keys[i].start, (uintptr_t)p + i * 4 * KiB);
	}
	ck_assert_int_eq(mrd_keys_query_batch(c, addrs, NULL, 65, keys, errors), -E2BIG);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "split"));
	ck_assert_int_eq(mrd_keys_query_batch(c, addrs, NULL, 0, keys, errors), -EINVAL);
	ck_assert_int_eq(mrd_keys_query_batch(c, NULL, NULL, 1, keys, errors), -EINVAL);
	{
		const size_t lens[2] = { 1, 0 };

		ck_assert_int_eq(mrd_keys_query_batch(c, addrs, lens, 2, keys, errors), -EINVAL);
	}
	mrd_client_close(c);
}
END_TEST

/* Under policy contig the first lookup registers the allocation: every range inside it hits
 * the cache from then on, without asking mrd. */
START_TEST(test_contig_range_hits_without_asking)
{
	mrd_client *c = connect_ok();
	struct mrd_keys k, first;
	mrd_cache *l;
	uint8_t *p;

	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_keys_range(l, p + 10, 1000, &first), 0);
	ck_assert_uint_eq(first.start, (uintptr_t)p);
	ck_assert_uint_eq(first.end, (uintptr_t)p + MiB);
	ck_assert_uint_eq(mrd_cache_asked(l), 1);
	for (size_t off = 0; off < MiB; off += 4099) {
		ck_assert_int_eq(mrd_cache_keys_range(l, p + off, MiB - off, &k), 0);
		ck_assert_uint_eq(k.lkey, first.lkey);
	}
	ck_assert_uint_eq(mrd_cache_asked(l), 1);
	ck_assert_int_eq(mrd_cache_keys_range(l, p + 1, MiB, &k), -ERANGE);
	ck_assert_uint_eq(mrd_cache_asked(l), 2);
	/* mrd answers a range under contig with the allocation's MR, not one of its own. */
	ck_assert_int_eq(mrd_keys_query_range(c, p + 4096, 8192, &k), 0);
	ck_assert_uint_eq(k.lkey, first.lkey);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

/* Under contig a range in fresh memory gets the policy's MR, which covers it. */
START_TEST(test_contig_range_over_fresh_allocation)
{
	mrd_client *c = connect_ok();
	struct mrd_keys sk, dk;
	uint8_t *src, *dst;

	ck_assert_int_eq(mrd_mem_alloc(c, 256 * KiB, 0, 0, (void **)&src), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 256 * KiB, 0, 0, (void **)&dst), 0);
	ck_assert_int_eq(mrd_keys_query_range(c, src + 1, 200 * KiB, &sk), 0);
	ck_assert_int_eq(mrd_keys_query_range(c, dst + 1, 200 * KiB, &dk), 0);
	ck_assert_int_eq(dma_by(c, &sk, src + 1, &dk, dst + 1, 200 * KiB), 0);
	ck_assert_int_eq(memcmp(src + 1, dst + 1, 200 * KiB), 0);
	mrd_client_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("libmrd-range");
	TCase *page = tcase_create("page"), *contig = tcase_create("contig");

	signal(SIGPIPE, SIG_IGN);
	tcase_add_checked_fixture(page, setup_page, teardown);
	tcase_set_timeout(page, 120);
	tcase_add_test(page, test_page_policy_range_covers_the_buffer);
	tcase_add_test(page, test_range_past_the_allocation_refused);
	tcase_add_test(page, test_big_range_on_a_worker);
	tcase_add_test(page, test_batch_mixed);
	tcase_add_test(page, test_batch_limits);
	suite_add_tcase(s, page);
	tcase_add_checked_fixture(contig, setup_contig, teardown);
	tcase_set_timeout(contig, 120);
	tcase_add_test(contig, test_contig_range_hits_without_asking);
	tcase_add_test(contig, test_contig_range_over_fresh_allocation);
	suite_add_tcase(s, contig);
	return run_suite(s);
}
