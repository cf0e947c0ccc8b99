/* SPDX-License-Identifier: MIT */
/* libmrd notices by itself that mrd went away: a program that never polls mrd_client_fd() nor
 * calls mrd_client_check() stops getting cached keys within the bound libmrd(3) documents. The
 * watcher thread behind it is one per process for all handles, leaves nothing behind once the
 * last handle closes, is not inherited by a fork() child (which starts its own when it
 * connects), and MRD_WATCH=0 turns it off. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define CONFIG "[memory]\nhugepages = no\narena_size = 64M\n"
/* libmrd(3) documents 10 ms on an idle machine; a loaded test machine gets 100 times that. */
#define BOUND_S 1.0

static struct mrd_proc mrd;

static void setup(void)
{
	ck_assert_int_eq(mrd_proc_start(&mrd, CONFIG, NULL), 0);
}

static void teardown(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - (strcmp(dir, "/proc/self/fd") == 0); /* opendir's own */
}

static void show_fds(void)
{
	char path[64], target[256];

	for (int fd = 0; fd < 1024; fd++) {
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = readlink(path, target, sizeof(target) - 1);
		if (n > 0)
			fprintf(stderr, "fd %d: %.*s\n", fd, (int)n, target);
	}
}

static int threads(void)
{
	return count_entries("/proc/self/task");
}

static int fds(void)
{
	return count_entries("/proc/self/fd");
}

static mrd_client *connect_ok(void)
{
	mrd_client *c = NULL;
	int r = mrd_client_connect(mrd.socket, &c);

	ck_assert_msg(r == 0, "connect: %s (%s)", strerror(-r), mrd_last_error());
	return c;
}

/* The program only looks keys up: no poll, no check, no other call. */
START_TEST(test_dead_mrd_noticed_without_polling)
{
	int base_threads = threads();
	mrd_client *c = connect_ok();
	uint32_t key = 0;
	unsigned long hits = 0;
	mrd_cache *l;
	double t0, took;
	uint8_t *p;

	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_uint_ne(mrd_cache_lkey(l, p), MRD_KEY_INVALID);
	ck_assert_uint_ne(mrd_cache_lkey(l, p + 4096), MRD_KEY_INVALID); /* the inline hit */

	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGKILL), 128 + SIGKILL); /* waitpid()ed */
	t0 = test_now_s();
	while ((key = mrd_cache_lkey(l, p)) != MRD_KEY_INVALID && test_now_s() - t0 < TEST_WAIT_S) {
		hits++;
		sched_yield();
	}
	took = test_now_s() - t0;
	fprintf(stderr, "cached keys stopped %.3f ms after mrd's death (%lu dead keys)\n",
		took * 1e3, hits);
	ck_assert_msg(key == MRD_KEY_INVALID, "a dead key still hit %.1f s after mrd died", took);
	ck_assert_msg(took < BOUND_S, "dead keys for %.3f s after mrd died", took);
	/* And from then on, none. */
	for (int i = 0; i < 100000; i++)
		ck_assert_uint_eq(mrd_cache_lkey(l, p + (i % 256) * 4096), MRD_KEY_INVALID);
	ck_assert_uint_eq(mrd_client_generation(c), UINT64_MAX);
	ck_assert_int_eq(mrd_client_check(c), -ECONNRESET);
	mrd_cache_free(l);
	mrd_client_close(c);
	ck_assert_int_eq(threads(), base_threads);
}
END_TEST

/* One thread for all handles of the process, gone with the last; nothing leaks. In a thread
 * of its own, whose reply eventfd (made at a call's first wait) goes when it exits. */
static void *connect_rounds(void *arg)
{
	int base_threads = *(int *)arg;
	mrd_client *c[3];

	for (int round = 0; round < 20; round++) {
		for (int i = 0; i < 3; i++) {
			c[i] = connect_ok();
			ck_assert_int_eq(threads(), base_threads + 1);
		}
		ck_assert_int_eq(mrd_client_ping(c[1]), 0);
		for (int i = 0; i < 3; i++)
			mrd_client_close(c[(i + round) % 3]);
		ck_assert_int_eq(threads(), base_threads);
	}
	return NULL;
}

START_TEST(test_one_thread_no_leak)
{
	int base_fds = fds(), base_threads = threads() + 1;
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, connect_rounds, &base_threads), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	if (fds() != base_fds)
		show_fds();
	ck_assert_int_eq(fds(), base_fds);
	ck_assert_int_eq(threads(), base_threads - 1);
}
END_TEST

#define RACERS 6

struct racer {
	pthread_barrier_t *go;
	mrd_client *c;
	int r;
};

static void *connect_at_once(void *arg)
{
	struct racer *x = arg;

	pthread_barrier_wait(x->go);
	x->r = mrd_client_connect(mrd.socket, &x->c);
	return NULL;
}

/* Threads connecting at once, none connected before: one watcher starts, and none is left once
 * they all closed (the start waits for its thread with the lock released: a second first
 * connect meanwhile must wait for that thread, not start its own). */
START_TEST(test_first_connects_at_once)
{
	int base_threads = threads();

	for (int round = 0; round < 50; round++) {
		pthread_barrier_t go;
		struct racer x[RACERS];
		pthread_t t[RACERS];

		ck_assert_int_eq(pthread_barrier_init(&go, NULL, RACERS), 0);
		for (int i = 0; i < RACERS; i++) {
			x[i] = (struct racer){ .go = &go };
			ck_assert_int_eq(pthread_create(&t[i], NULL, connect_at_once, &x[i]), 0);
		}
		for (int i = 0; i < RACERS; i++)
			ck_assert_int_eq(pthread_join(t[i], NULL), 0);
		pthread_barrier_destroy(&go);
		ck_assert_int_eq(threads(), base_threads + 1); /* the watcher alone */
		for (int i = 0; i < RACERS; i++) {
			ck_assert_int_eq(x[i].r, 0);
			mrd_client_close(x[i].c);
		}
		ck_assert_msg(threads() == base_threads, "round %d: %d threads left, not %d", round,
			      threads(), base_threads);
	}
}
END_TEST

/* MRD_WATCH=0: no thread (the program polls, as before). */
START_TEST(test_watch_off)
{
	int base_threads = threads();
	mrd_client *c;

	setenv("MRD_WATCH", "0", 1);
	c = connect_ok();
	ck_assert_int_eq(threads(), base_threads);
	mrd_client_close(c);
	unsetenv("MRD_WATCH");
	c = connect_ok();
	ck_assert_int_eq(threads(), base_threads + 1);
	mrd_client_close(c);
}
END_TEST

/* The child has no watcher (threads are not inherited); its own handle starts one, which goes
 * with it; the parent's keeps watching. */
START_TEST(test_fork_child)
{
	int base_threads = threads();
	mrd_client *c = connect_ok();
	mrd_cache *l;
	uint8_t *p;
	int status;
	pid_t pid;

	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_uint_ne(mrd_cache_lkey(l, p), MRD_KEY_INVALID);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		mrd_client *own;

		if (threads() != 1)
			_exit(1);
		if (mrd_cache_lkey(l, p) != MRD_KEY_INVALID)
			_exit(2);
		if (mrd_client_connect(mrd.socket, &own) < 0)
			_exit(3);
		if (threads() != 2)
			_exit(4);
		mrd_client_close(own);
		if (threads() != 1)
			_exit(5);
		mrd_cache_free(l);
		mrd_client_close(c); /* the inherited copy: no thread of its own to stop */
		_exit(threads() == 1 ? 0 : 6);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
	ck_assert_int_eq(threads(), base_threads + 1);
	/* The parent's watcher still notices. */
	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGKILL), 128 + SIGKILL);
	test_wait_until(mrd_cache_lkey(l, p) == MRD_KEY_INVALID, 1000);
	ck_assert_uint_eq(mrd_cache_lkey(l, p), MRD_KEY_INVALID);
	mrd_cache_free(l);
	mrd_client_close(c);
	ck_assert_int_eq(threads(), base_threads);
}
END_TEST

/* After a warm restart and mrd_client_reconnect() the watcher watches the new connection (the
 * same descriptor number): the new mrd's death is noticed with no poll either. */
START_TEST(test_rearmed_after_reconnect)
{
	mrd_client *c = connect_ok();
	char buf[512];
	mrd_cache *l;
	uint8_t *p;

	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_uint_ne(mrd_cache_lkey(l, p), MRD_KEY_INVALID);
	ck_assert_int_eq(kill(mrd.pid, SIGUSR2), 0); /* re-exec, warm */
	test_wait_until(mrd_cache_lkey(l, p) == MRD_KEY_INVALID, 1000);
	ck_assert_uint_eq(mrd_cache_lkey(l, p), MRD_KEY_INVALID);
	ck_assert_int_eq(mrd_proc_notified(&mrd, "READY=1", buf, sizeof(buf), 60000), 0);
	ck_assert_int_eq(mrd_client_reconnect(c), 1);
	ck_assert_uint_ne(mrd_cache_lkey(l, p), MRD_KEY_INVALID);

	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGKILL), 128 + SIGKILL);
	test_wait_until(mrd_cache_lkey(l, p) == MRD_KEY_INVALID, 1000);
	ck_assert_uint_eq(mrd_cache_lkey(l, p), MRD_KEY_INVALID);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("libmrd-watch");
	TCase *tc = tcase_create("watch");

	signal(SIGPIPE, SIG_IGN);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_dead_mrd_noticed_without_polling);
	tcase_add_test(tc, test_one_thread_no_leak);
	tcase_add_test(tc, test_first_connects_at_once);
	tcase_add_test(tc, test_watch_off);
	tcase_add_test(tc, test_fork_child);
	tcase_add_test(tc, test_rearmed_after_reconnect);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
