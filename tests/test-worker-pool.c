/* SPDX-License-Identifier: MIT */
/* The worker pool in-process: keys take turns, one key never holds every worker, and freeing
 * the pool runs what is queued. Order is read from the jobs' own log (who started when), never
 * from the clock; jobs that must hold a worker wait on a pipe the test writes to. */
#include <check.h>
#include <event2/event.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "base/worker-pool.h"
#include "check-run.h"

struct job {
	struct work work;
	const char *name;
	int gate[2]; /* gated: the job reads a byte from gate[0] before it ends */
	bool gated;
	bool entered; /* set on the worker: read atomically */
	bool done;
};

static struct event_base *base;
static struct worker_pool *pool;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *started[64]; /* job names, in the order workers took them */
static unsigned n_started;

static void job_run(struct work *w)
{
	struct job *j = (struct job *)w;
	char ch;

	pthread_mutex_lock(&log_lock);
	started[n_started++] = j->name;
	pthread_mutex_unlock(&log_lock);
	__atomic_store_n(&j->entered, true, __ATOMIC_RELEASE);
	if (j->gated)
		(void)!read(j->gate[0], &ch, 1);
}

static void job_done(struct work *w) { ((struct job *)w)->done = true; }

static void job_init(struct job *j, const char *name, bool gated)
{
	*j = (struct job){ .work = { .run = job_run, .done = job_done }, .name = name,
			   .gated = gated, .gate = { -1, -1 } };
	if (gated)
		ck_assert_int_eq(pipe2(j->gate, O_CLOEXEC), 0);
}

static void job_release(struct job *j)
{
	ck_assert_int_eq(write(j->gate[1], "x", 1), 1);
}

static void job_close(struct job *j)
{
	if (!j->gated)
		return;
	close(j->gate[0]);
	close(j->gate[1]);
}

static bool entered(struct job *j) { return __atomic_load_n(&j->entered, __ATOMIC_ACQUIRE); }

/* Runs the loop until *a or *b (NULL: never) is true: up to 30 s, for a loaded machine — the
 * event comes in microseconds when nothing is wrong. */
static void pump_until(const bool *a, const bool *b)
{
	for (int i = 0; i < 30000; i++) {
		if (__atomic_load_n(a, __ATOMIC_ACQUIRE) || (b && __atomic_load_n(b, __ATOMIC_ACQUIRE)))
			return;
		event_base_loop(base, EVLOOP_NONBLOCK);
		usleep(1000);
	}
}

static int position(const char *name)
{
	pthread_mutex_lock(&log_lock);
	for (unsigned i = 0; i < n_started; i++)
		if (strcmp(started[i], name) == 0) {
			pthread_mutex_unlock(&log_lock);
			return (int)i;
		}
	pthread_mutex_unlock(&log_lock);
	return -1;
}

static void setup(void)
{
	base = event_base_new();
	ck_assert_ptr_nonnull(base);
	n_started = 0;
}

static void teardown(void)
{
	pool = worker_pool_free(pool);
	event_base_free(base);
}

/* One worker; key A queues eight jobs, then key B one: B's starts after at most one more of
 * A's, not after A's queue drains. */
START_TEST(test_keys_take_turns)
{
	static const char *names[] = { "a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7" };
	struct job a[8], b;
	int key_a, key_b;

	ck_assert_int_eq(worker_pool_new(base, 1, &pool), 0);
	for (unsigned i = 0; i < 8; i++)
		job_init(&a[i], names[i], i == 0);
	job_init(&b, "b0", false);
	worker_pool_submit(pool, &a[0].work, &key_a);
	pump_until(&a[0].entered, NULL); /* the worker holds a0: what follows queues */
	ck_assert(entered(&a[0]));
	for (unsigned i = 1; i < 8; i++)
		worker_pool_submit(pool, &a[i].work, &key_a);
	worker_pool_submit(pool, &b.work, &key_b);
	job_release(&a[0]);
	pump_until(&a[7].done, NULL);
	pump_until(&b.done, NULL);
	ck_assert(a[7].done && b.done);
	ck_assert_int_le(position("b0"), 2);
	for (unsigned i = 0; i < 8; i++) { /* A's own in the order submitted */
		if (i > 0)
			ck_assert_int_gt(position(names[i]), position(names[i - 1]));
		job_close(&a[i]);
	}
}
END_TEST

/* Two workers; key A's first job holds one, its second waits: the other worker stays for other
 * keys, and B's job runs while A's first still holds its worker. Freeing the pool then runs
 * A's second too. */
START_TEST(test_one_key_leaves_a_worker)
{
	struct job a0, a1, b;
	int key_a, key_b;

	ck_assert_int_eq(worker_pool_new(base, 2, &pool), 0);
	job_init(&a0, "a0", true);
	job_init(&a1, "a1", true);
	job_init(&b, "b0", false);
	worker_pool_submit(pool, &a0.work, &key_a);
	worker_pool_submit(pool, &a1.work, &key_a);
	pump_until(&a0.entered, NULL);
	worker_pool_submit(pool, &b.work, &key_b);
	pump_until(&b.done, &a1.entered);
	ck_assert(!entered(&a1));
	ck_assert(b.done);
	ck_assert(!a0.done);
	job_release(&a0);
	job_release(&a1);
	pool = worker_pool_free(pool); /* every job ends, done included */
	ck_assert(a0.done && a1.done);
	ck_assert_int_eq(position("a1"), 2);
	job_close(&a0);
	job_close(&a1);
}
END_TEST

/* With one worker a key alone takes it: work never waits for a worker that is idle. */
START_TEST(test_lone_key_uses_the_pool)
{
	struct job a0, a1;
	int key_a;

	ck_assert_int_eq(worker_pool_new(base, 1, &pool), 0);
	job_init(&a0, "a0", false);
	job_init(&a1, "a1", false);
	worker_pool_submit(pool, &a0.work, &key_a);
	worker_pool_submit(pool, &a1.work, &key_a);
	pump_until(&a1.done, NULL);
	ck_assert(a0.done && a1.done);
	ck_assert_int_eq(position("a0"), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("worker-pool");
	TCase *tc = tcase_create("fairness");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_keys_take_turns);
	tcase_add_test(tc, test_one_key_leaves_a_worker);
	tcase_add_test(tc, test_lone_key_uses_the_pool);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
