/* SPDX-License-Identifier: MIT */
/* Review reproducers: the device's events and failure while a worker holds a domain's
 * provider in a long op (a registration held at $MRD_SOFT_GATE, as a big ibv_reg_mr pins for
 * seconds). The loop must go on serving meanwhile: that is what the workers are for. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "control/manager.h"
#include "core/domain.h"
#include "provider/provider.h"
#include "test-daemon.h"
#include "test-util.h"
#include "wire.h"
#include "check-run.h"

#define MiB (1ull << 20)

static char dir[64], fifo[96], gate[64];
static int events_fd = -1;

static void start(void)
{
	const char *settings[] = { "mrd.provider=soft", "memory.window_size=4G",
				   "memory.arena_size=64M", "memory.hugepages=no",
				   "cache.policy=contig", "cache.workers=2", NULL };

	snprintf(dir, sizeof(dir), "/tmp/mrd-test-device-race.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/events", dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_EVENTS", fifo, 1), 0);
	events_fd = open(fifo, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(events_fd, 0);
	ck_assert_int_eq(soft_gate_setenv(gate, sizeof(gate), 1 * MiB), 0);
	td_start(settings);
}

static void stop(void)
{
	td_stop();
	soft_gate_cleanup(gate);
	unsetenv("MRD_SOFT_GATE");
	close(events_fd);
	unsetenv("MRD_SOFT_EVENTS");
	unlink(fifo);
	rmdir(dir);
}

static void inject(char c)
{
	ck_assert_int_eq(write(events_fd, &c, 1), 1);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Lets the held op go after 3 s, whatever the loop does (else a stuck loop hangs the test). */
static void *release_later(void *arg)
{
	(void)arg;
	sleep(3);
	soft_gate_release(gate, 1);
	return NULL;
}

/* A port event (PORT_ERR, PORT_ACTIVE, LID/GID change, SM reregister: every context on the
 * device gets them) arrives while a worker registers 2 MiB: the loop reads the domain's
 * context's events under the provider's lock, which the registration holds. */
static void held_registration_then(char event)
{
	int a, b;
	uint64_t addr;
	pthread_t t;
	double t0, waited;
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;

	start();
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1001, NULL);
	addr = td_alloc(a, 1, 2 * MiB);
	td_send_lookup(a, 2, addr);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r'); /* a worker holds the provider */
	ck_assert_int_eq(pthread_create(&t, NULL, release_later, NULL), 0);

	inject(event);
	t0 = now_s();
	for (int i = 0; i < 50; i++) { /* the loop sees the event */
		td_pump();
		usleep(1000);
	}
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	td_send_request(b, &req, NULL, 0);
	mrd__response__free_unpacked(td_expect(b, 3, 0), NULL);
	waited = now_s() - t0;
	pthread_join(t, NULL);
	mrd__response__free_unpacked(td_expect(a, 2, 0), NULL);
	ck_assert_msg(waited < 1.5, "the loop stood still %.1f s behind a worker's registration "
		      "after event '%c' (another client's Ping waited)", waited, event);
	close(a);
	close(b);
	stop();
}

START_TEST(test_port_event_during_registration)
{
	held_registration_then('D');
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("device-race");
	TCase *tc = tcase_create("race");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_port_event_during_registration);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(suite());
}
