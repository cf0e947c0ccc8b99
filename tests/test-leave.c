/* SPDX-License-Identifier: MIT */
/* A client that leaves holding thousands of MRs does not hold mrd's loop: against one real mrd,
 * a leaver (uid 1000) makes LEAVER_MRS small allocations, each with its own MR, and is killed;
 * meanwhile a victim (uid 1001) pings without pause. The victim's worst round trip during the
 * leaver's teardown stays under VICTIM_WORST_MS (VICTIM_WORST_SAN_MS under a sanitizer), and
 * everything of the leaver goes (its domain closes: no allocation, MR or pinned byte left),
 * which the test waits for. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "check-run.h"
#include "test-util.h"
#include "time-util.h"

#define LEAVER 1000
#define VICTIM 1001
/* 16,000 MRs; a quarter under a sanitizer, where the leaver's setup alone took minutes on a
 * loaded machine and one of its pools' registrations (a request registering 1,000 MRs beside
 * 9,000 of them, each pin rebuilding the pin map's segments) passed libmrd's 30 s reply
 * timeout (CI rehearsal). The bound on the victim's wait is checked in the plain build; under
 * a sanitizer the teardown's memory is. */
#define LEAVER_MRS leaver_mrs()
/* The mempool leaver: LEAVER_POOLS pools of POOL_OBJS page-sized objects 8 KiB apart, each
 * registered page by page (extmem: a range per object, at most 1,024), LEAVER_MRS pool MRs in
 * all, none of whose pages touch. */
#define LEAVER_POOLS 16
#define POOL_OBJS (LEAVER_MRS / LEAVER_POOLS)
/* The victim's worst Ping while the leaver's MRs go, counted as mrd's loop held it: the part of
 * the round trip that mrd's loop thread spent on a CPU (its schedstat), not the time a loaded
 * machine kept either process off one. Before mrd sliced a leaving client's teardown it ran on
 * the loop in one go, and its cost per MR grows with the MRs left (each unpin rebuilds the pin
 * map's segments, one per MR here: the allocations are a page each, 8 KiB apart, so no two MRs'
 * pages merge): 3,000 MRs held the loop 54 ms on an idle machine, 16,000 held it 0.96 s (the
 * review saw 1.6-3.1 s for 3,000 on its machine), all of it on a CPU. Sliced, a turn of the
 * loop frees a few allocations (a millisecond). The wall-clock round trip alone flaked: a
 * loaded 2-core machine kept the victim or the loop off its CPU for 765 ms once. 400 ms of
 * the loop's CPU passes any slicing and fails the old hold; under a sanitizer every step is
 * slower (the old hold 3.5 s under ASan): 1,500 ms there. Without schedstat (a kernel built
 * without it) the wall-clock round trip is all there is. */
#define VICTIM_WORST_MS 400
#define VICTIM_WORST_SAN_MS 1500

static int leaver_mrs(void) { return test_under_sanitizer() ? 4000 : 16000; }

static unsigned victim_worst_ms(void)
{
	return test_under_sanitizer() ? VICTIM_WORST_SAN_MS : VICTIM_WORST_MS;
}
static struct mrd_proc mrd;
static char mrctl[512], out[1 << 18];

static void start_mrd(void)
{
	int r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\nwindow_size = 64G\n", NULL);

	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
	test_build_path("mrctl", mrctl, sizeof(mrctl));
}

static void stop_mrd(void)
{
	if (mrd.pid > 0)
		(void)mrd_proc_stop(&mrd);
}

/* This (forked) process as uid, gid uid, and no supplementary group. */
static void become(uid_t uid)
{
	(void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* no child outlives a failed suite */
	if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
		_exit(3);
}

static void mrctl_clients(void)
{
	const char *argv[] = { mrctl, "--socket", mrd.socket, "--json", "clients", NULL };

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
}

/* The number after "key": in uid's domain object of the last mrctl clients output, -1 when
 * that domain is not open. */
static long long domain_number(uid_t uid, const char *key)
{
	char name[32];

	snprintf(name, sizeof(name), "uid-%u", (unsigned)uid);
	return json_domain_number(out, name, key);
}

static bool leaver_domain_closed(void)
{
	mrctl_clients();
	return domain_number(LEAVER, "mrs") < 0;
}

static bool leaver_holds_all(bool pools)
{
	mrctl_clients();
	if (pools) /* pool MRs are not the cache's: their pages say they are there */
		return domain_number(LEAVER, "pinned_bytes") == LEAVER_MRS * 4096ll;
	return domain_number(LEAVER, "mrs") == LEAVER_MRS;
}

/* The leaver: LEAVER_MRS allocations of a page, 8 KiB apart, each registered in the request that
 * makes it (its own MR: an MR never spans two allocations), then a byte on ready, then it waits
 * to be killed. */
static void leaver(int ready)
{
	mrd_client *c;
	struct mrd_keys k;
	void *p;

	become(LEAVER);
	if (mrd_client_connect(mrd.socket, &c) < 0)
		_exit(1);
	for (int i = 0; i < LEAVER_MRS; i++)
		if (mrd_mem_alloc_keys(c, 4096, 8192, 0, &p, &k) < 0) {
			fprintf(stderr, "leaver: allocation %d: %s\n", i, mrd_last_error());
			_exit(2);
		}
	if (write(ready, "r", 1) != 1)
		_exit(4);
	for (;;)
		pause();
}

/* The mempool leaver: LEAVER_POOLS pools (an allocation each) registered object by object. */
static void pool_leaver(int ready)
{
	mrd_client *c;
	mrd_mempool *p;
	char name[32];

	become(LEAVER);
	if (mrd_client_connect(mrd.socket, &c) < 0)
		_exit(1);
	for (int i = 0; i < LEAVER_POOLS; i++) {
		snprintf(name, sizeof(name), "leaver-%d", i);
		if (mrd_mempool_create(c, name, POOL_OBJS, 4096, 8192, 0, 0, &p) < 0 ||
		    mrd_mempool_register(p, MRD_MEMPOOL_EXTMEM) < 0) {
			fprintf(stderr, "leaver: pool %d: %s\n", i, mrd_last_error());
			_exit(2);
		}
	}
	if (write(ready, "r", 1) != 1)
		_exit(4);
	for (;;)
		pause();
}

struct pings {
	unsigned n;
	uint64_t worst_us, p99_us;
	uint64_t worst_held_us; /* the most of one round trip mrd's loop spent on a CPU */
	bool schedstat;         /* worst_held_us was measured (else it is the round trip) */
};

/* The time mrd's loop (its main thread) has spent on a CPU, in µs, from its schedstat (open
 * as fd); 0 when it cannot be read. */
static uint64_t loop_cpu_us(int fd)
{
	char buf[128];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return strtoull(buf, NULL, 10) / 1000;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The victim: pings back to back, a byte on ready after the first, until stop is readable;
 * then its figures on report. */
static void victim(int ready, int stop, int report)
{
	static uint64_t rtt[1 << 20];
	struct pollfd p = { .fd = stop, .events = POLLIN };
	struct pings s = { 0 };
	mrd_client *c;

	char path[64];
	int loop;

	become(VICTIM);
	if (mrd_client_connect(mrd.socket, &c) < 0)
		_exit(1);
	snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)mrd.pid, (int)mrd.pid);
	loop = open(path, O_RDONLY | O_CLOEXEC);
	s.schedstat = loop >= 0 && loop_cpu_us(loop) > 0;
	while (poll(&p, 1, 0) == 0 && s.n < sizeof(rtt) / sizeof(rtt[0])) {
		uint64_t c0 = s.schedstat ? loop_cpu_us(loop) : 0, t0 = now_usec(CLOCK_MONOTONIC);
		uint64_t held;

		if (mrd_client_ping(c) < 0)
			_exit(2);
		rtt[s.n] = now_usec(CLOCK_MONOTONIC) - t0;
		held = s.schedstat ? loop_cpu_us(loop) - c0 : rtt[s.n];
		held = held < rtt[s.n] ? held : rtt[s.n];
		if (held > s.worst_held_us)
			s.worst_held_us = held;
		if (++s.n == 1 && write(ready, "r", 1) != 1)
			_exit(4);
	}
	qsort(rtt, s.n, sizeof(rtt[0]), cmp_u64);
	s.worst_us = rtt[s.n - 1];
	s.p99_us = rtt[s.n * 99 / 100];
	_exit(write(report, &s, sizeof(s)) == sizeof(s) ? 0 : 5);
}

static void wait_byte(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char b;

	ck_assert_msg(poll(&p, 1, TEST_WAIT_S * 1000) == 1, "a child did not get ready");
	ck_assert_int_eq(read(fd, &b, 1), 1);
}

static void wait_child(pid_t pid, int want)
{
	int status;

	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == want,
		      "child exited with status 0x%x, wanted %d", status, want);
}

/* A leaver holding all its MRs (pool MRs with pools), ready to be killed. */
static pid_t start_leaver(const int ready[2], bool pools)
{
	pid_t pid = fork();
	int r, status = 0;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (pools)
			pool_leaver(ready[1]);
		leaver(ready[1]);
	}
	/* Its setup takes seconds, minutes under a sanitizer on a loaded machine (CI saw 2,060 of
	 * its 16,000 allocations in 200 s): it is waited for until it is ready or gone, Check's
	 * timeout the only bound. */
	r = test_wait_ready(ready[0], pid, -1, &status);
	ck_assert_msg(r == 0, "the leaver never got ready: %s (exit status 0x%x)", strerror(-r),
		      status);
	test_wait_until(leaver_holds_all(pools), 10000);
	ck_assert_msg(leaver_holds_all(pools), "the leaver holds %lld MRs, %lld bytes pinned",
		      domain_number(LEAVER, "mrs"), domain_number(LEAVER, "pinned_bytes"));
	ck_assert_int_eq(domain_number(LEAVER, "allocations"), pools ? LEAVER_POOLS : LEAVER_MRS);
	return pid;
}

/* A leaver (of pool MRs with pools) is killed while the victim pings. */
static void leave_under_pings(bool pools)
{
	int ready[2], stop[2], report[2], status;
	pid_t leaver_pid, victim_pid;
	double t0, t_gone;
	struct pings s;

	ck_assert_int_eq(pipe2(ready, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(stop, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(report, O_CLOEXEC), 0);
	leaver_pid = start_leaver(ready, pools);

	victim_pid = fork();
	ck_assert_int_ge(victim_pid, 0);
	if (victim_pid == 0)
		victim(ready[1], stop[0], report[1]);
	wait_byte(ready[0]);

	t0 = test_now_s();
	ck_assert_int_eq(kill(leaver_pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(leaver_pid, &status, 0), leaver_pid);
	test_wait_until(leaver_domain_closed(), 20000);
	t_gone = test_now_s();
	ck_assert_msg(domain_number(LEAVER, "mrs") < 0, "the leaver's domain is still open: %.600s",
		      out);
	ck_assert_int_eq(write(stop[1], "s", 1), 1);
	wait_child(victim_pid, 0);
	ck_assert_int_eq(read(report[0], &s, sizeof(s)), (ssize_t)sizeof(s));
	printf("leaver of %d %sMRs gone in %.0f ms; victim's %u pings meanwhile: worst %.1f ms, "
	       "p99 %.1f ms; the most of one that mrd's loop spent on a CPU: %.1f ms%s\n",
	       LEAVER_MRS, pools ? "pool " : "", (t_gone - t0) * 1e3, s.n, s.worst_us / 1e3,
	       s.p99_us / 1e3, s.worst_held_us / 1e3,
	       s.schedstat ? "" : " (no schedstat: the round trip)");
	ck_assert_msg(s.worst_held_us < victim_worst_ms() * 1000ull,
		      "mrd's loop held a Ping of the victim %.1f ms (on a CPU; round trip %.1f ms) "
		      "while the leaver's %sMRs went",
		      s.worst_held_us / 1e3, s.worst_us / 1e3, pools ? "pool " : "");
	/* Nothing of the leaver is left: no domain is open (the victim's Pings join none). */
	mrctl_clients();
	ck_assert_msg(strstr(out, "\"domains\":[]"), "a domain is still open: %.600s", out);
	for (int i = 0; i < 2; i++) {
		close(ready[i]);
		close(stop[i]);
		close(report[i]);
	}
}

START_TEST(test_leaver_of_thousands_of_mrs)
{
	leave_under_pings(false);
}
END_TEST

/* The same with its MRs in mempools: they go in the same shares. */
START_TEST(test_leaver_of_thousands_of_pool_mrs)
{
	leave_under_pings(true);
}
END_TEST

/* mrd stops while a leaver's memory still goes a share a turn: what is left goes at
 * shutdown, and mrd exits cleanly (under the sanitizers or valgrind, with nothing leaked). */
START_TEST(test_shutdown_while_a_client_leaves)
{
	int ready[2], status;
	pid_t leaver_pid;
	long long mrs;

	ck_assert_int_eq(pipe2(ready, O_CLOEXEC), 0);
	leaver_pid = start_leaver(ready, false);
	ck_assert_int_eq(kill(leaver_pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(leaver_pid, &status, 0), leaver_pid);
	/* Until mrd has begun: a few of its MRs went (at the first share, or later). */
	test_wait_until((mrctl_clients(), domain_number(LEAVER, "mrs") < LEAVER_MRS), 1000);
	mrs = domain_number(LEAVER, "mrs");
	ck_assert_int_lt(mrs, LEAVER_MRS);
	printf("mrd stops with %lld of the leaver's MRs left\n", mrs);
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	close(ready[0]);
	close(ready[1]);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("leave");
	TCase *tc = tcase_create("leave");

	if (geteuid() != 0) {
		printf("SKIP: the leaver and the victim run as uids %u and %u: needs root\n",
		       LEAVER, VICTIM);
		return 77;
	}
	/* One mrd, run in this process (mrd's parent). */
	setenv("CK_FORK", "no", 1);
	tcase_add_unchecked_fixture(tc, start_mrd, stop_mrd);
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_leaver_of_thousands_of_mrs);
	tcase_add_test(tc, test_leaver_of_thousands_of_pool_mrs);
	tcase_add_test(tc, test_shutdown_while_a_client_leaves); /* stops mrd: the last */
	suite_add_tcase(s, tc);
	return run_suite(s);
}
