/* SPDX-License-Identifier: MIT */
/* A handle's life against a real mrd: inherited by fork() it fails in the child at once (and
 * the parent goes on); once mrd is gone, and libmrd knows, no thread's cached lookup returns an
 * old key; the handle's descriptor wakes poll() when mrd goes; a warm restart brings it back. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define CONFIG "[memory]\nhugepages = no\narena_size = 64M\n"
#define N_THREADS 4

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

static mrd_client *connect_ok(void)
{
	mrd_client *c = NULL;
	int r = mrd_client_connect(mrd.socket, &c);

	ck_assert_msg(r == 0, "connect: %s (%s)", strerror(-r), mrd_last_error());
	return c;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* What the forked child does with its parent's handle; the exit status names the first step
 * that went wrong, and the pipe says how. */
static int child_uses_parent_handle(mrd_client *c, mrd_cache *l, uint8_t *p, int report)
{
	mrd_client *own = NULL;
	void *q;
	int r;

#define FAIL(step, ...)                                         \
	do {                                                    \
		dprintf(report, __VA_ARGS__);                   \
		return step;                                    \
	} while (0)
	/* Each refused at once: not after mrd_client_ping()'s 30 s timeout, as when the child's
	 * requests and the parent's crossed on the one socket. */
	for (int i = 0; i < 50; i++) {
		double t0 = now();

		r = mrd_client_ping(c);
		if (r != -ECHILD)
			FAIL(1, "ping %d in the child: %d (%s)", i, r, mrd_last_error());
		if (now() - t0 > 10)
			FAIL(2, "ping %d in the child took %.1f s", i, now() - t0);
	}
	if (!strstr(mrd_last_error(), "fork"))
		FAIL(3, "ping error: '%s'", mrd_last_error());
	/* The parent's cached key is not handed out here. */
	if (mrd_cache_lkey(l, p) != MRD_KEY_INVALID)
		FAIL(4, "a cached lookup in the child returned the parent's key");
	if (!strstr(mrd_last_error(), "fork") || !strstr(mrd_last_error(), "connect anew"))
		FAIL(5, "lookup error: '%s'", mrd_last_error());
	r = mrd_client_check(c);
	if (r != -ECHILD || mrd_client_fd(c) < 0)
		FAIL(12, "check in the child: %d, fd %d", r, mrd_client_fd(c));
	r = mrd_mem_alloc(c, 4096, 0, 0, &q);
	if (r != -ECHILD)
		FAIL(6, "alloc in the child: %d (%s)", r, mrd_last_error());
	r = mrd_mem_free(c, p);
	if (r != -ECHILD)
		FAIL(7, "free in the child: %d", r);
	r = mrd_client_reconnect(c);
	if (r != -ECHILD)
		FAIL(8, "reconnect in the child: %d", r);
	/* Closing the inherited copy is allowed, and a handle of its own works. */
	mrd_cache_free(l);
	mrd_client_close(c);
	r = mrd_client_connect(mrd.socket, &own);
	if (r < 0)
		FAIL(9, "connect in the child: %s", mrd_last_error());
	r = mrd_mem_alloc(own, 4096, 0, 0, &q);
	if (r < 0)
		FAIL(10, "alloc on the child's own handle: %s", mrd_last_error());
	memset(q, 1, 4096);
	if (mrd_mem_free(own, q) < 0 || mrd_client_ping(own) < 0)
		FAIL(11, "free/ping on the child's own handle: %s", mrd_last_error());
	mrd_client_close(own);
	return 0;
#undef FAIL
}

struct pinger {
	mrd_client *c;
	int stop, n; /* atomic */
	int failures;
	double worst;
};

static void *ping_loop(void *arg)
{
	struct pinger *pg = arg;

	while (!__atomic_load_n(&pg->stop, __ATOMIC_RELAXED)) {
		double t0 = now(), t;

		if (mrd_client_ping(pg->c) != 0)
			pg->failures++;
		t = now() - t0;
		if (t > pg->worst)
			pg->worst = t;
		__atomic_add_fetch(&pg->n, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* The parent pings all along while its child tries the inherited handle. */
START_TEST(test_fork_child_fails_at_once)
{
	mrd_client *c = connect_ok();
	struct pinger pg = { .c = c };
	mrd_cache *l;
	char why[512] = "";
	pthread_t t;
	uint8_t *p;
	uint32_t key;
	int report[2], status;
	ssize_t len;
	pid_t pid;

	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, (void **)&p), 0);
	memset(p, 7, 4096);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	key = mrd_cache_lkey(l, p);
	ck_assert_uint_ne(key, MRD_KEY_INVALID);
	ck_assert_int_eq(pipe(report), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, ping_loop, &pg), 0);
	while (__atomic_load_n(&pg.n, __ATOMIC_RELAXED) < 10)
		usleep(1000);

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		test_fork_child_of_threads();
		close(report[0]);
		signal(SIGALRM, SIG_DFL); /* Check's handler would kill the whole test */
		alarm(90);
		_exit(child_uses_parent_handle(c, l, p, report[1]));
	}
	close(report[1]);
	len = read(report[0], why, sizeof(why) - 1);
	why[len > 0 ? len : 0] = '\0';
	close(report[0]);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	__atomic_store_n(&pg.stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d: %s",
		      status, why);

	/* The parent was never disturbed: every ping answered, none waited long. */
	ck_assert_int_gt(pg.n, 10);
	ck_assert_int_eq(pg.failures, 0);
	ck_assert_msg(pg.worst < 10, "a ping of the parent took %.1f s", pg.worst);
	ck_assert_uint_eq(mrd_cache_lkey(l, p), key);
	ck_assert_uint_eq(p[100], 7);
	ck_assert_int_eq(mrd_client_ping(c), 0);
	mrd_cache_free(l);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	mrd_client_close(c);
}
END_TEST

static void *allocate(void *arg)
{
	free(malloc(152)); /* the size of glibc's thread attributes that each thread's start takes */
	return arg;
}

/* A fork() right after connect, while libmrd's watcher thread starts: the child can start a
 * thread and allocate. ASan of GCC 12 takes no lock of its allocator around fork(): a child
 * forked while the watcher's start (malloc, in the runtime) held one of its locks inherited
 * it held and hung on its first thread (CI's uid-1000 child of test-preload-move). Connect
 * returns once the watcher runs. Under TSan the child makes no thread (it cannot, after a
 * multi-threaded fork). */
START_TEST(test_fork_right_after_connect)
{
	for (int i = 0; i < 300; i++) {
		mrd_client *c = connect_ok();
		int status;
		pid_t pid = fork();

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			pthread_t t;

#if !defined(__SANITIZE_THREAD__)
			if (pthread_create(&t, NULL, allocate, NULL) != 0 ||
			    pthread_join(t, NULL) != 0)
				_exit(2);
#else
			(void)t;
#endif
			_exit(0);
		}
		ck_assert_msg(test_waitpid_or_show(pid, &status, 60) == 0,
			      "fork %d right after connect: the child hung (its threads above)", i);
		ck_assert_int_eq(status, 0);
		mrd_client_close(c);
	}
}
END_TEST

/* Threads each with a warm cache; after mrd dies and libmrd has learnt it, none gets a key. */
struct looker {
	mrd_client *c;
	uint8_t *p;
	pthread_barrier_t *warm, *dead, *done;
	int expect; /* what mrd_cache_keys() returns once mrd is gone */
	int keys_after, errors_after, bad_error;
};

static void *look_up(void *arg)
{
	struct looker *lk = arg;
	mrd_cache *l;
	struct mrd_keys mr;

	if (mrd_cache_new(lk->c, &l) < 0 || mrd_cache_lkey(l, lk->p) == MRD_KEY_INVALID)
		lk->bad_error = 1;
	pthread_barrier_wait(lk->warm);
	pthread_barrier_wait(lk->dead);
	for (int i = 0; i < 10000; i++) {
		if (mrd_cache_lkey(l, lk->p + (i % 64) * 64) != MRD_KEY_INVALID)
			lk->keys_after++;
		else
			lk->errors_after++;
	}
	if (mrd_cache_keys(l, lk->p, &mr) != lk->expect ||
	    (lk->expect == -ECONNRESET && !strstr(mrd_last_error(), "mrd closed the connection")))
		lk->bad_error = 1;
	mrd_cache_free(l);
	pthread_barrier_wait(lk->done);
	return NULL;
}

struct warm_threads {
	pthread_barrier_t warm, dead, done;
	struct looker lk[N_THREADS];
	pthread_t t[N_THREADS];
};

/* N_THREADS threads, each with p's key cached once this returns. */
static void threads_start(struct warm_threads *w, mrd_client *c, uint8_t *p, int expect)
{
	pthread_barrier_init(&w->warm, NULL, N_THREADS + 1);
	pthread_barrier_init(&w->dead, NULL, N_THREADS + 1);
	pthread_barrier_init(&w->done, NULL, N_THREADS + 1);
	for (int i = 0; i < N_THREADS; i++) {
		w->lk[i] = (struct looker){ .c = c, .p = p, .warm = &w->warm, .dead = &w->dead,
					    .done = &w->done, .expect = expect };
		ck_assert_int_eq(pthread_create(&w->t[i], NULL, look_up, &w->lk[i]), 0);
	}
	pthread_barrier_wait(&w->warm);
}

/* Lets them look up again, and checks that each got a key every time (alive) or never. */
static void threads_check(struct warm_threads *w, bool alive)
{
	pthread_barrier_wait(&w->dead);
	pthread_barrier_wait(&w->done);
	for (int i = 0; i < N_THREADS; i++) {
		pthread_join(w->t[i], NULL);
		ck_assert_msg(w->lk[i].keys_after == (alive ? 10000 : 0),
			      "thread %d: %d keys of 10000 (mrd %s)", i, w->lk[i].keys_after,
			      alive ? "alive" : "gone");
		ck_assert_int_eq(w->lk[i].bad_error, 0);
	}
	pthread_barrier_destroy(&w->warm);
	pthread_barrier_destroy(&w->dead);
	pthread_barrier_destroy(&w->done);
}

/* poll() on the handle's descriptor wakes with POLLHUP within timeout_ms. */
static void wait_hangup(mrd_client *c, int timeout_ms)
{
	struct pollfd pfd = { .fd = mrd_client_fd(c) };

	ck_assert_int_ge(pfd.fd, 0);
	ck_assert_int_eq(poll(&pfd, 1, timeout_ms), 1);
	ck_assert_msg(pfd.revents & POLLHUP, "revents 0x%x", pfd.revents);
}

/* A registered mempool, for mrd_cache_mempool_keys() once mrd is gone. */
static mrd_mempool *pool_ok(mrd_client *c)
{
	mrd_mempool *pool = NULL;

	ck_assert_int_eq(mrd_mempool_create(c, "lifecycle", 64, 256, 0, 0, 0, &pool), 0);
	ck_assert_int_eq(mrd_mempool_register(pool, 0), 0);
	return pool;
}

/* mrd SIGKILLed: learnt through poll() and mrd_client_check(), or by any call. */
static void dead_mrd(bool by_poll)
{
	mrd_client *c = connect_ok();
	mrd_mempool *pool = pool_ok(c);
	struct warm_threads w;
	mrd_cache *l;
	struct pollfd pfd;
	struct mrd_keys mr;
	void *obj = mrd_mempool_get(pool);
	uint8_t *p;

	ck_assert_ptr_nonnull(obj);
	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_add_mempool(l, pool), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, pool, obj, &mr), 0);
	threads_start(&w, c, p, -ECONNRESET);
	/* Alive: nothing to report, and replies to other calls do not count. */
	pfd = (struct pollfd){ .fd = mrd_client_fd(c) };
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);
	ck_assert_int_eq(mrd_client_ping(c), 0);
	ck_assert_int_eq(mrd_client_check(c), 0);

	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGKILL), 128 + SIGKILL);
	if (by_poll) {
		wait_hangup(c, TEST_WAIT_S * 1000);
		ck_assert_int_eq(mrd_client_check(c), -ECONNRESET);
	} else
		ck_assert_int_eq(mrd_client_ping(c), -ECONNRESET);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "mrd closed the connection"));
	threads_check(&w, false);
	ck_assert_uint_eq(mrd_cache_lkey(l, obj), MRD_KEY_INVALID);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, pool, obj, &mr), -ECONNRESET);
	ck_assert_int_eq(mrd_cache_add_mempool(l, pool), -ECONNRESET);
	ck_assert_uint_eq(mrd_client_generation(c), UINT64_MAX);
	ck_assert_int_eq(mrd_client_check(c), -ECONNRESET);
	ck_assert_int_eq(mrd_client_ping(c), -ECONNRESET);
	mrd_mempool_put(pool, obj);
	mrd_cache_free(l);
	mrd_mempool_free(pool);
	mrd_client_close(c);
}

START_TEST(test_dead_mrd_noticed_by_poll)
{
	dead_mrd(true);
}
END_TEST

START_TEST(test_dead_mrd_noticed_by_call)
{
	dead_mrd(false);
}
END_TEST

/* A warm restart: the descriptor wakes, cached keys stop, and the reconnect brings it back on
 * the same descriptor number with fresh keys. */
START_TEST(test_warm_restart_brings_back)
{
	mrd_client *c = connect_ok();
	struct warm_threads w;
	mrd_cache *l;
	struct pollfd pfd;
	uint32_t old_key, key;
	char buf[512];
	uint8_t *p;
	int fd = mrd_client_fd(c);

	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, (void **)&p), 0);
	memset(p, 5, 4096);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	old_key = mrd_cache_lkey(l, p);
	ck_assert_uint_ne(old_key, MRD_KEY_INVALID);
	threads_start(&w, c, p, -ECONNRESET);

	ck_assert_int_eq(kill(mrd.pid, SIGUSR2), 0);
	wait_hangup(c, 60000);
	ck_assert_int_eq(mrd_client_check(c), -ECONNRESET);
	threads_check(&w, false);
	ck_assert_int_eq(mrd_proc_notified(&mrd, "READY=1", buf, sizeof(buf), 60000), 0);
	ck_assert_int_eq(mrd_client_reconnect(c), 1);

	ck_assert_int_eq(mrd_client_fd(c), fd);
	pfd = (struct pollfd){ .fd = fd };
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);
	ck_assert_int_eq(mrd_client_check(c), 0);
	ck_assert_uint_ne(mrd_client_generation(c), UINT64_MAX);
	key = mrd_cache_lkey(l, p);
	ck_assert_uint_ne(key, MRD_KEY_INVALID);
	ck_assert_uint_eq(p[100], 5);
	threads_start(&w, c, p, 0);
	threads_check(&w, true);

	/* A cache that adopted the first poisoning, then got a key from the new mrd (its lookup
	 * left the generation check before the reconnect and asked after it), keeps no key when
	 * this mrd dies too: the next poisoning is another value. */
	((struct mrd_cache_hot *)(void *)l)->generation = UINT64_MAX;
	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGKILL), 128 + SIGKILL);
	wait_hangup(c, TEST_WAIT_S * 1000);
	ck_assert_int_eq(mrd_client_check(c), -ECONNRESET);
	ck_assert_uint_eq(mrd_cache_lkey(l, p), MRD_KEY_INVALID);
	ck_assert_uint_eq(mrd_client_generation(c), UINT64_MAX - 1);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("libmrd-lifecycle");
	TCase *tc = tcase_create("lifecycle");

	signal(SIGPIPE, SIG_IGN);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_fork_child_fails_at_once);
	tcase_add_test(tc, test_fork_right_after_connect);
	tcase_add_test(tc, test_dead_mrd_noticed_by_poll);
	tcase_add_test(tc, test_dead_mrd_noticed_by_call);
	tcase_add_test(tc, test_warm_restart_brings_back);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
