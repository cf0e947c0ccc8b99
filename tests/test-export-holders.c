/* SPDX-License-Identifier: MIT */
/* Review reproducer: ExportPd records each asking process in its domain (domain_note_export)
 * for the hand-over, and nothing ever forgets one while the domain stays open: short-lived
 * processes that each ask once grow the list (and the linear scan each ExportPd does) without
 * bound, though only running holders are handed over. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/client.h"
#include "control/manager.h"
#include "core/domain.h"
#include "test-daemon.h"
#include "wire.h"
#include "check-run.h"

static void export_pd(int fd, uint64_t id)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExportPdRequest q = MRD__EXPORT_PD_REQUEST__INIT;
	int fds[4];
	size_t n_fds = 4;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_EXPORT_PD;
	req.export_pd = &q;
	td_send_request(fd, &req, NULL, 0);
	mrd__response__free_unpacked(td_expect_fds(fd, id, 0, fds, &n_fds), NULL);
	for (size_t j = 0; j < n_fds; j++)
		close(fds[j]);
}

START_TEST(test_export_holders_bounded)
{
	const char *settings[] = { "mrd.provider=soft", "memory.window_size=4G",
				   "memory.arena_size=64M", "memory.hugepages=no", NULL };
	struct client *keeper;
	int k, n = 3000;

	ck_assert_int_eq(setenv("MRD_SOFT_EXPORT", "1", 1), 0);
	td_start(settings);
	k = td_hello_client(1000, &keeper); /* keeps the domain open */
	(void)td_alloc(k, 2, 4096);
	for (int i = 0; i < n; i++) {
		/* pids no process has (pid_max is at most 4194304): each a process gone */
		int fd = td_hello_client_of(4194304 + 1 + i, 1000, NULL);
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__ExportPdRequest q = MRD__EXPORT_PD_REQUEST__INIT;
		int fds[4];
		size_t n_fds = 4;

		req.id = 2;
		req.body_case = MRD__REQUEST__BODY_EXPORT_PD;
		req.export_pd = &q;
		td_send_request(fd, &req, NULL, 0);
		mrd__response__free_unpacked(td_expect_fds(fd, 2, 0, fds, &n_fds), NULL);
		for (size_t j = 0; j < n_fds; j++)
			close(fds[j]);
		close(fd);
		td_pump();
	}
	fprintf(stderr, "holders recorded: %zu after %d processes that are gone\n",
		keeper->domain->n_exported_to, n);
	ck_assert_msg(keeper->domain->n_exported_to < 100, "%zu holders recorded, none running",
		      keeper->domain->n_exported_to);
	close(k);
	td_stop();
	unsetenv("MRD_SOFT_EXPORT");
}
END_TEST

/* After the device's return the domain's context is a new one: who held the failed one is not
 * a holder of it (a hand-over would keep the new context alive for nobody), and the status
 * page tells importers (pd_epoch). */
START_TEST(test_export_holders_forgotten_at_device_return)
{
	const char *settings[] = { "mrd.provider=soft", "memory.window_size=4G",
				   "memory.arena_size=64M", "memory.hugepages=no", NULL };
	char dir[64] = "/tmp/mrd-test-export-holders.XXXXXX", fifo[96];
	struct client *keeper;
	struct domain *d;
	uint64_t epoch;
	int k, events;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/events", dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	events = open(fifo, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(events, 0);
	ck_assert_int_eq(setenv("MRD_SOFT_EVENTS", fifo, 1), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_EXPORT", "1", 1), 0);
	td_start(settings);
	k = td_hello_client(1000, &keeper); /* this process: running */
	(void)td_alloc(k, 2, 4096);
	export_pd(k, 3);
	d = keeper->domain;
	ck_assert_uint_eq(d->n_exported_to, 1);
	epoch = d->mem.status.page->pd_epoch;
	ck_assert_int_eq(write(events, "F", 1), 1);
	td_pump_until(td_manager->core.device.failed);
	ck_assert(td_manager->core.device.failed);
	ck_assert_uint_eq(d->mem.status.page->pd_epoch, epoch); /* no new PD yet */
	ck_assert_int_eq(write(events, "R", 1), 1);
	td_pump_until(!td_manager->core.device.failed);
	ck_assert(!td_manager->core.device.failed);
	ck_assert_uint_eq(d->mem.status.page->pd_epoch, epoch + 1);
	ck_assert_uint_eq(d->n_exported_to, 0);
	export_pd(k, 4); /* the new context's holder */
	ck_assert_uint_eq(d->n_exported_to, 1);
	close(k);
	td_stop();
	close(events);
	unsetenv("MRD_SOFT_EXPORT");
	unsetenv("MRD_SOFT_EVENTS");
	unlink(fifo);
	rmdir(dir);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("export-holders");
	TCase *tc = tcase_create("holders");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_export_holders_bounded);
	tcase_add_test(tc, test_export_holders_forgotten_at_device_return);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(suite());
}
