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

static long read_long(const char *path)
{
	long v = -1;
	FILE *f = fopen(path, "re");

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static int write_long(const char *path, long v)
{
	FILE *f = fopen(path, "we");
	int r;

	if (!f)
		return -errno;
	r = fprintf(f, "%ld\n", v) > 0 ? 0 : -EIO;
	if (fclose(f) != 0)
		r = -errno;
	return r;
}

static void give_back(void)
{
	if (reserved_before >= 0)
		(void)write_long(NR_PATH, reserved_before);
}

/* The page size the kernel uses for the mapping holding p, from /proc/self/smaps. */
static long kernel_page_kb(const void *p)
{
	char line[256];
	unsigned long lo, hi;
	bool inside = false;
	long kb = -1;
	FILE *f = fopen("/proc/self/smaps", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
			inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
		else if (inside && sscanf(line, "KernelPageSize: %ld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
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

int main(void)
{
	Suite *s = suite_create("hugetlb");
	TCase *tc = tcase_create("arenas");

	if (geteuid() == 0 && read_long(FREE_PATH) < 8) {
		reserved_before = read_long(NR_PATH);
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
	suite_add_tcase(s, tc);
	return run_suite(s);
}
