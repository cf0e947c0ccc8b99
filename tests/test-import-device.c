/* SPDX-License-Identifier: MIT */
/* Review reproducer: a handle that imported the PD (mrd_client_get_pd) before the device
 * failed. When the device is back, mrd's MRs are on a new context and a new PD; the imported
 * context is the failed one. libmrd says -ESTALE after a restart for the same reason
 * (client_pd_stale); after the device's return it hands out the new PD's keys silently. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define MiB (1ul << 20)
#define CONFIG "[memory]\nhugepages = no\narena_size = 64M\n"

static struct mrd_proc mrd;

START_TEST(test_importer_told_after_device_return)
{
	char dir[64] = "/tmp/mrd-test-import-device.XXXXXX", fifo[96];
	mrd_client *c = NULL;
	mrd_cache *l;
	struct mrd_keys before, k;
	uint32_t handle;
	int fd = -1, events, r;
	void *p;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/events", dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	events = open(fifo, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(events, 0);
	setenv("MRD_SOFT_EVENTS", fifo, 1);
	setenv("MRD_SOFT_EXPORT", "1", 1);
	r = mrd_proc_start(&mrd, CONFIG, NULL);
	unsetenv("MRD_SOFT_EXPORT");
	unsetenv("MRD_SOFT_EVENTS");
	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, &p), 0);
	ck_assert_int_eq(mrd_client_get_pd(c, &fd, &handle), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &before), 0);

	ck_assert_int_eq(write(events, "F", 1), 1);
	test_wait_until((r = mrd_keys_query(c, p, &k)) == -ENODEV, 50000);
	ck_assert_int_eq(r, -ENODEV);
	ck_assert_int_eq(write(events, "R", 1), 1);
	test_wait_until((r = mrd_keys_query(c, p, &k)) != -ENODEV, 50000);
	/* The device is back; the keys mrd has now are for its new PD. */
	ck_assert_msg(r == -ESTALE, "after the device's return a handle that imported the failed "
		      "context's PD got keys %#x/%#x (before %#x) for the new PD: %d (%s)",
		      k.lkey, k.rkey, before.rkey, r, r < 0 ? mrd_last_error() : "no error");
	ck_assert_msg(strstr(mrd_last_error(), "came back") &&
			      strstr(mrd_last_error(), "mrd_client_get_pd"),
		      "%s", mrd_last_error());
	/* The cache asks too (its entries went with the generation), and says the same. */
	ck_assert_int_eq(mrd_cache_keys(l, p, &k), -ESTALE);
	ck_assert_int_eq(mrd_keys_query(c, p, &k), -ESTALE); /* until imported again */
	close(fd);
	ck_assert_int_eq(mrd_client_get_pd(c, &fd, &handle), 0);
	ck_assert_int_eq(mrd_keys_query(c, p, &k), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &k), 0);
	/* A second return tells again. */
	ck_assert_int_eq(write(events, "F", 1), 1);
	test_wait_until((r = mrd_keys_query(c, p, &k)) == -ENODEV, 50000);
	ck_assert_int_eq(r, -ENODEV);
	ck_assert_int_eq(write(events, "R", 1), 1);
	test_wait_until((r = mrd_keys_query(c, p, &k)) != -ENODEV, 50000);
	ck_assert_int_eq(r, -ESTALE);
	close(fd);
	mrd_cache_free(l);
	mrd_client_close(c);
	close(events);
	unlink(fifo);
	rmdir(dir);
}
END_TEST

static void teardown(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}

static Suite *suite(void)
{
	Suite *s = suite_create("import-device");
	TCase *tc = tcase_create("import");

	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_importer_told_after_device_return);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(suite());
}
