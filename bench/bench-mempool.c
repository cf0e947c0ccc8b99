/* SPDX-License-Identifier: MIT */
/* make bench: mempool get/put (issue 40). mempool-bulk32: mrd_mempool_get_bulk() +
 * mrd_mempool_put_bulk() of 32 objects against 32 mrd_mempool_get() + 32 mrd_mempool_put(),
 * interleaved in each rep (PERF.md: <= 0.5x). mempool-2threads: the per-operation cost of
 * get+put with two threads at once, each on its own objects, against one thread alone in the
 * same rep (before the per-thread caches, a mutex: 27-33 ns, 2x one thread). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-util.h"

#define REPS 9
#define BULK 32
#define ROUNDS 20000 /* of BULK objects, per rep and row */
#define OBJS 4096

static mrd_mempool *pool;

/* ns per object of get+put. */
static TIMED double time_bulk(void)
{
	void *objs[BULK];
	uint64_t t0 = bench_now_ns();

	for (unsigned r = 0; r < ROUNDS; r++) {
		if (mrd_mempool_get_bulk(pool, objs, BULK) != 0)
			abort();
		RELOAD_BARRIER(objs);
		if (mrd_mempool_put_bulk(pool, objs, BULK) != 0)
			abort();
	}
	return (double)(bench_now_ns() - t0) / ((double)ROUNDS * BULK);
}

static TIMED double time_single(void)
{
	void *objs[BULK];
	uint64_t t0 = bench_now_ns();

	for (unsigned r = 0; r < ROUNDS; r++) {
		for (unsigned i = 0; i < BULK; i++)
			if (!(objs[i] = mrd_mempool_get(pool)))
				abort();
		RELOAD_BARRIER(objs);
		for (unsigned i = 0; i < BULK; i++)
			if (mrd_mempool_put(pool, objs[i]) != 0)
				abort();
	}
	return (double)(bench_now_ns() - t0) / ((double)ROUNDS * BULK);
}

/* get+put of one object at a time, the commonest datapath use. */
static TIMED double time_pairs(void)
{
	uint64_t t0 = bench_now_ns();

	for (unsigned r = 0; r < ROUNDS * BULK / 4; r++) {
		void *o = mrd_mempool_get(pool);

		if (!o)
			abort();
		RELOAD_BARRIER(o);
		if (mrd_mempool_put(pool, o) != 0)
			abort();
	}
	return (double)(bench_now_ns() - t0) / ((double)ROUNDS * BULK / 4);
}

static pthread_barrier_t start;

static void *pair_thread(void *arg)
{
	double *ns = arg;

	pthread_barrier_wait(&start);
	*ns = time_pairs();
	return NULL;
}

int main(void)
{
	double bulk[REPS], single[REPS], ratio_bulk[REPS], one[REPS], two[REPS], ratio_two[REPS];
	struct bench_summary sum[2];
	size_t n_sum = 0, held;
	struct mrd_proc mrd;
	mrd_client *c = NULL;
	double rb, rt;
	int r;

	r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\n", NULL);
	if (r < 0) {
		fprintf(stderr, "bench-mempool: mrd did not start: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	r = mrd_client_connect(mrd.socket, &c);
	if (r >= 0)
		r = mrd_mempool_create(c, "bench", OBJS, 64, 64, 0, 0, &pool);
	if (r < 0) {
		fprintf(stderr, "bench-mempool: %s (%s)\n", strerror(-r), mrd_last_error());
		mrd_proc_stop(&mrd);
		return EXIT_FAILURE;
	}
	(void)time_bulk(); /* warm up: caches made, pages touched */
	(void)time_single();
	for (int rep = 0; rep < REPS; rep++) {
		pthread_t t[2];

		bulk[rep] = time_bulk();
		single[rep] = time_single();
		ratio_bulk[rep] = bulk[rep] / single[rep];
		one[rep] = time_pairs();
		double ns2[2];

		pthread_barrier_init(&start, NULL, 2);
		for (int i = 0; i < 2; i++)
			if (pthread_create(&t[i], NULL, pair_thread, &ns2[i]) != 0)
				abort();
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&start);
		two[rep] = (ns2[0] + ns2[1]) / 2;
		ratio_two[rep] = two[rep] / one[rep];
	}
	printf("== per object of get+put, ns (median of %d reps)\n", REPS);
	bench_print_doubles("bulk32 ns", bulk, REPS);
	bench_print_doubles("single ns", single, REPS);
	bench_print_doubles("one thread ns", one, REPS);
	bench_print_doubles("two threads ns", two, REPS);
	rb = bench_median(memcpy((double[REPS]){ 0 }, ratio_bulk, sizeof(ratio_bulk)), REPS);
	printf("mempool-bulk32: ratio=%.3f (case=get_bulk+put_bulk of %d baseline=%d get + %d put, "
	       "same pool, interleaved reps=%d)\n", rb, BULK, BULK, BULK, REPS);
	bench_add_summary(sum, &n_sum, "mempool-bulk32", rb, ratio_bulk, REPS, 0.5, true);
	rt = bench_median(memcpy((double[REPS]){ 0 }, ratio_two, sizeof(ratio_two)), REPS);
	printf("mempool-2threads: ratio=%.3f (case=get+put per op, 2 threads at once "
	       "baseline=the same, 1 thread, same rep reps=%d; cpu busy %.0f%%)\n", rt, REPS,
	       100 * bench_cpu_busy(200));
	bench_add_summary(sum, &n_sum, "mempool-2threads", rt, ratio_two, REPS, 1.2, true);
	printf("summary (PERF.md: bulk of 32 <= 0.5x 32 single; 2 threads per op <= 1.2x one, "
	       "this bench's own target):\n");
	held = bench_print_summary(sum, n_sum);
	printf("  %zu of %zu targets hold\n", held, n_sum);
	mrd_mempool_free(pool);
	mrd_client_close(c);
	mrd_proc_stop(&mrd);
	return EXIT_SUCCESS;
}
