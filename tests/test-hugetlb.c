/* SPDX-License-Identifier: MIT */
/* Arenas of 2 MiB huge pages. As root the test reserves a few huge pages for itself (and gives
 * back as many); elsewhere it needs free ones, and says so when there are none (exit 77).
 * What it counts are the huge pages in the memfds of the mrd it started, never the host's
 * free count, which other processes (other runs of this test) move. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "macro.h"
#include "test-util.h"
#include "check-run.h"

#define MiB (1ul << 20)
#define HUGE_DIR "/sys/kernel/mm/hugepages/hugepages-2048kB/"
#define NR_PATH HUGE_DIR "nr_hugepages"
#define OVERCOMMIT_PATH HUGE_DIR "nr_overcommit_hugepages"
#define FREE_PATH HUGEPAGES_FREE_PATH
#define HUGETLBFS_MAGIC 0x958458f6

static struct mrd_proc mrd;

/* The 2 MiB pages held by the memfds mrd has open (its arenas), from their allocated blocks;
 * each file once (a reply's copy of a descriptor may still be open beside it). */
static long mrd_huge_pages(void)
{
	char dir[64], path[sizeof(dir) + sizeof(((struct dirent *)0)->d_name)];
	struct stat seen[64];
	size_t n_seen = 0;
	struct dirent *e;
	long blocks = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)mrd.pid);
	d = opendir(dir);
	ck_assert_msg(d != NULL, "%s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		struct statfs fs;
		struct stat st;
		bool dup = false;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		/* Through the descriptor's link, to its file; one closed meanwhile is none. */
		if (statfs(path, &fs) < 0 || fs.f_type != HUGETLBFS_MAGIC || stat(path, &st) < 0)
			continue;
		for (size_t i = 0; i < n_seen; i++)
			dup = dup || (seen[i].st_dev == st.st_dev && seen[i].st_ino == st.st_ino);
		if (dup)
			continue;
		ck_assert_uint_lt(n_seen, ELEMENTSOF(seen));
		seen[n_seen++] = st;
		blocks += st.st_blocks;
	}
	closedir(d);
	return blocks * 512 / (long)(2 * MiB);
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
	long held = mrd_huge_pages();
	uint8_t *p;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 3 * MiB, 0, MRD_MEM_HUGEPAGE, (void **)&p), 0);
	ck_assert_uint_eq((uintptr_t)p % (2 * MiB), 0);
	/* Taken when allocated, before anyone touches them (two pages for 3 MiB)... */
	ck_assert_int_eq(mrd_huge_pages(), held + 2);
	memset(p, 0x11, 3 * MiB);
	ck_assert_int_eq(kernel_page_kb(p), 2048);
	/* ...and given back when freed (the arena's memfd closes on a closer thread, a moment
	 * after the answer). */
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	test_wait_until(mrd_huge_pages() == held, 1000);
	ck_assert_int_eq(mrd_huge_pages(), held);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_huge_pages_run_out)
{
	/* More than the pool can ever hold, with room for other runs adding theirs meanwhile. */
	size_t size = (size_t)(read_long(NR_PATH) + read_long(OVERCOMMIT_PATH) + 64) * 2 * MiB;
	long held = mrd_huge_pages();
	mrd_client *c = NULL;
	void *p, *q;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	/* Refused with a reason when only huge pages will do... */
	ck_assert_int_eq(mrd_mem_alloc(c, size, 0, MRD_MEM_HUGEPAGE, &p), -ENOMEM);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "2 MiB"));
	/* ...and served from 4 KiB pages otherwise. */
	ck_assert_int_eq(mrd_mem_alloc(c, size, 0, 0, &q), 0);
	ck_assert_int_eq(kernel_page_kb(q), 4);
	/* Nothing leaked: the arena that could not be filled goes off the loop, a moment later. */
	test_wait_until(mrd_huge_pages() == held, 1000);
	ck_assert_int_eq(mrd_huge_pages(), held);
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
	mrd_cache *l;
	struct mrd_keys ma, mb;
	uint64_t gen;
	uint8_t *p;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_msg(mrd_mem_alloc(c, 2 * MiB, 0, MRD_MEM_HUGEPAGE, (void **)&p) == 0, "%s",
		      mrd_last_error());
	ck_assert_int_eq(mrd_mempool_create_in(c, "a", p, 64 * 1024, 256, 0, &a), 0);
	ck_assert_int_eq(mrd_mempool_create_in(c, "b", p + 1 * MiB, 64 * 1024, 256, 0, &b), 0);
	ck_assert_int_eq(mrd_mempool_register(a, 0), 0);
	ck_assert_int_eq(mrd_mempool_register(b, 0), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, a, p, &ma), 0);
	mrd_cache_free(l);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, b, p + 1 * MiB, &mb), 0);
	mrd_cache_free(l);
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

	char why[256];

	if (hugepages_reserve(8, why, sizeof(why)) < 0) {
		printf("not run: %s\n", why);
		return 77;
	}
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_huge_arena);
	tcase_add_test(tc, test_huge_pages_run_out);
	tcase_add_test(tc, test_pools_share_a_huge_page);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
