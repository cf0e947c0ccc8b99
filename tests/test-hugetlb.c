/* SPDX-License-Identifier: MIT */
/* Arenas of 2 MiB huge pages. As root the test reserves a few huge pages for itself (and gives
 * them back); elsewhere it needs free ones, and says so when there are none (exit 77). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define MiB (1ul << 20)
#define NR_PATH "/proc/sys/vm/nr_hugepages"
#define FREE_PATH "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"

static struct mrd_proc mrd;
static long reserved_before = -1;
static pid_t reserver; /* Check forks a child per test: only this process gives them back */

static void give_back(void)
{
	if (reserved_before >= 0 && getpid() == reserver)
		(void)write_long(NR_PATH, reserved_before);
}

static void setup(void)
{
	ck_assert_int_eq(mrd_proc_start(&mrd, "[memory]\nhugepages = auto\narena_size = 64M\n",
					NULL), 0);
}

static void teardown(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}

START_TEST(test_huge_arena)
{
	mrd_client *c = NULL;
	long free_before = read_long(FREE_PATH);
	uint8_t *p;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 3 * MiB, 0, MRD_MEM_HUGEPAGE, (void **)&p), 0);
	ck_assert_uint_eq((uintptr_t)p % (2 * MiB), 0);
	memset(p, 0x11, 3 * MiB);
	ck_assert_int_eq(kernel_page_kb(p), 2048);
	/* Taken when allocated (two pages for 3 MiB), given back when freed. */
	ck_assert_int_eq(read_long(FREE_PATH), free_before - 2);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	ck_assert_int_eq(read_long(FREE_PATH), free_before);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_huge_pages_run_out)
{
	long free_pages = read_long(FREE_PATH);
	mrd_client *c = NULL;
	void *p, *q;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	/* More than the host has: refused with a reason when only huge pages will do... */
	ck_assert_int_eq(mrd_mem_alloc(c, (size_t)(free_pages + 1) * 2 * MiB, 0, MRD_MEM_HUGEPAGE,
				       &p), -ENOMEM);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "2 MiB"));
	/* ...and served from 4 KiB pages otherwise. */
	ck_assert_int_eq(mrd_mem_alloc(c, (size_t)(free_pages + 1) * 2 * MiB, 0, 0, &q), 0);
	ck_assert_int_eq(kernel_page_kb(q), 4);
	ck_assert_int_eq(read_long(FREE_PATH), free_pages); /* nothing leaked */
	mrd_client_close(c);
}
END_TEST

static char out[16384];

/* Two pools inside one huge page share its MR, which lasts until the second one goes. */
START_TEST(test_pools_share_a_huge_page)
{
	char mrctl[512];
	const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket",
			       mrd.socket, "--json", "mempools", NULL };
	mrd_client *c = NULL;
	mrd_mempool *a, *b;
	struct mrd_lookup l;
	struct mrd_mr ma, mb;
	uint64_t gen;
	uint8_t *p;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_msg(mrd_mem_alloc(c, 2 * MiB, 0, MRD_MEM_HUGEPAGE, (void **)&p) == 0, "%s",
		      mrd_last_error());
	ck_assert_int_eq(mrd_mempool_create_in(c, "a", p, 64 * 1024, 256, 0, &a), 0);
	ck_assert_int_eq(mrd_mempool_create_in(c, "b", p + 1 * MiB, 64 * 1024, 256, 0, &b), 0);
	ck_assert_int_eq(mrd_mempool_register(a, 0), 0);
	ck_assert_int_eq(mrd_mempool_register(b, 0), 0);
	ck_assert_int_eq(mrd_lookup_init(&l, c), 0);
	ck_assert_int_eq(mrd_mempool_lookup(&l, a, p, &ma), 0);
	mrd_lookup_done(&l);
	ck_assert_int_eq(mrd_lookup_init(&l, c), 0);
	ck_assert_int_eq(mrd_mempool_lookup(&l, b, p + 1 * MiB, &mb), 0);
	mrd_lookup_done(&l);
	/* One MR, the whole huge page, two sharers. */
	ck_assert_uint_eq(ma.lkey, mb.lkey);
	ck_assert_uint_eq(ma.start, (uintptr_t)p);
	ck_assert_uint_eq(ma.end, (uintptr_t)p + 2 * MiB);
	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_msg(strstr(out, "\"sharers\":2,\"hugepage\":true") != NULL, "%s", out);

	/* The first pool goes: the MR stays for the second, and nothing needs flushing. */
	gen = mrd_client_generation(c);
	ck_assert_int_eq(mrd_mempool_unregister(a), 0);
	ck_assert_uint_eq(mrd_client_generation(c), gen);
	strcpy((char *)p + 1 * MiB, "still shared");
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, mb.lkey, p + 1 * MiB, mb.rkey,
				 p + 1 * MiB + 4096, 13), 0);
	ck_assert_str_eq((char *)p + 1 * MiB + 4096, "still shared");
	/* The second goes: so does the MR, and clients are told to flush. */
	ck_assert_int_eq(mrd_mempool_unregister(b), 0);
	ck_assert_uint_gt(mrd_client_generation(c), gen);
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, mb.lkey, p + 1 * MiB, mb.rkey,
				 p + 1 * MiB + 4096, 13), -ENOKEY);
	mrd_mempool_free(a);
	mrd_mempool_free(b);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	mrd_client_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hugetlb");
	TCase *tc = tcase_create("arenas");

	if (geteuid() == 0 && read_long(FREE_PATH) < 8) {
		reserved_before = read_long(NR_PATH);
		reserver = getpid();
		if (reserved_before < 0 || write_long(NR_PATH, reserved_before + 16) < 0)
			reserved_before = -1;
		atexit(give_back);
	}
	if (read_long(FREE_PATH) < 8) {
		printf("not run: fewer than 8 free 2 MiB huge pages (%s) and %s\n", FREE_PATH,
		       geteuid() == 0 ? "the kernel reserved none when asked" :
					"only root may reserve them");
		return 77;
	}
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_huge_arena);
	tcase_add_test(tc, test_huge_pages_run_out);
	tcase_add_test(tc, test_pools_share_a_huge_page);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
