/* SPDX-License-Identifier: MIT */
/*
 * make bench, figure set "lookup-hit-under-frees" (shared/PERF.md): client B's cached lookups
 * while client A, another process of B's uid, allocates and frees memory it never registers,
 * or memory it registered (looked up through its own cache) before each free, against the
 * same lookups while A sleeps; one run, interleaved, the order swapped each rep.
 *
 *   B looks up random addresses over 64 buffers of its own, each registered and cached once:
 *   8 in the top half, 56 hit in the bottom half (mrd_cache_lkey(), inline then out of line).
 *   A frees at ~5,000 frees/s (PERF.md's row), and as fast as it can [informational]; then
 *   at ~5,000 frees/s and flat out [informational] again, each allocation registered first:
 *   each free moves the generation, and B's next lookup drops what overlaps it (nothing of
 *   B's). A free that
 *   empties B's cache makes B's next lookups ask mrd again (a round trip each): B's asks per
 *   loaded phase say whether that happened.
 *
 * B runs pinned to one CPU; A and mrd share another where there is one, so that what B pays
 * is its cache's, not the scheduler's. Each phase runs batches of lookups for PHASE_NS and
 * divides by the lookups done; every batch sums its keys and checks the sum.
 */
#include <errno.h>
#include <stdbool.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"
#include "macro.h"
#include "mrd/mrd.h"
#include "test-util.h"

#define N_BUFS 64
#define BUF_SIZE (64u << 10)
#define N_ADDRS 4096u /* addresses cycled through, at random over the buffers */
#define BATCH N_ADDRS
#define PHASE_NS (60ull * 1000000) /* per phase: thousands of A's frees at 5,000/s */
#define REPS 9
#define PACED_NS 200000ull /* 5,000 frees/s */
#define TARGET 1.5

enum mode { A_SLEEPS, A_PACED, A_FLAT_OUT, A_PACED_REGISTERED, A_FLAT_OUT_REGISTERED, A_QUITS };

static bool registers(uint32_t mode)
{
	return mode == A_PACED_REGISTERED || mode == A_FLAT_OUT_REGISTERED;
}

/* Shared between B (this process) and A (its child), in a MAP_SHARED page. */
struct shared {
	uint32_t mode;  /* B: enum mode */
	uint64_t frees; /* A: frees so far */
	int error;      /* A: -errno of its failure; it stops then */
};

struct load_row {
	double ns_case[REPS], ns_base[REPS]; /* per lookup */
	double frees_per_s[REPS];
	double asks[REPS]; /* B's lookups that asked mrd during the loaded phase */
};

static uint32_t load_mode(const struct shared *sh)
{
	return __atomic_load_n(&sh->mode, __ATOMIC_ACQUIRE);
}

static _Noreturn void client_a(const char *socket, struct shared *sh)
{
	uint64_t next = 0;
	mrd_client *c = NULL;
	mrd_cache *l = NULL;
	int r;

	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
	r = mrd_client_connect(socket, &c);
	if (r >= 0)
		r = mrd_cache_new(c, &l);
	while (r >= 0) {
		uint32_t mode = load_mode(sh);
		void *p;

		if (mode == A_QUITS)
			break;
		if (mode == A_SLEEPS) {
			usleep(1000);
			next = 0;
			continue;
		}
		r = mrd_mem_alloc(c, 4096, 0, 0, &p);
		if (r >= 0 && registers(mode) && mrd_cache_lkey(l, p) == MRD_KEY_INVALID)
			r = -EIO; /* registered: a key of it is cached, here at least */
		if (r >= 0)
			r = mrd_mem_free(c, p);
		__atomic_add_fetch(&sh->frees, 1, __ATOMIC_RELEASE);
		if (mode == A_PACED || mode == A_PACED_REGISTERED) {
			uint64_t now = bench_now_ns();
			struct timespec ts;

			/* Behind by more than a few slots: start again from now, no burst. */
			next = next && now < next + 10 * PACED_NS ? next + PACED_NS : now + PACED_NS;
			ts = (struct timespec){ (time_t)(next / 1000000000), (long)(next % 1000000000) };
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		}
	}
	if (r < 0) {
		fprintf(stderr, "bench-lookup-frees: client A: %s\n", mrd_last_error());
		sh->error = r;
	}
	mrd_cache_free(l);
	mrd_client_close(c);
	_exit(r < 0 ? EXIT_FAILURE : EXIT_SUCCESS);
}

struct bench {
	struct mrd_proc mrd;
	struct shared *sh;
	pid_t a_pid;
	const char *placement;
	mrd_client *client;
	mrd_cache *l;
	void *buf[N_BUFS];
	uint32_t lkey[N_BUFS];
	uintptr_t addrs[N_ADDRS];
	uint64_t want; /* the keys of one batch, summed */
	struct load_row paced, flat_out, registered, registered_flat_out;
};

static TIMED uint64_t loop_lkey(mrd_cache *l, const uintptr_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		RELOAD_BARRIER(l);
		sum += mrd_cache_lkey(l, (const void *)addrs[i & (N_ADDRS - 1)]);
	}
	return sum;
}

/* Batches for PHASE_NS: ns per lookup. */
static int phase(const struct bench *b, double *ret_ns)
{
	uint64_t t0 = bench_now_ns(), t, ops = 0;

	do {
		if (loop_lkey(b->l, b->addrs, BATCH) != b->want)
			return bench_check_sum("bench-lookup-frees", "lookup-hit-under-frees", 0, 1);
		ops += BATCH;
		t = bench_now_ns();
	} while (t - t0 < PHASE_NS);
	*ret_ns = (double)(t - t0) / (double)ops;
	return 0;
}

static int set_mode(const struct bench *b, enum mode mode)
{
	uint64_t frees = __atomic_load_n(&b->sh->frees, __ATOMIC_ACQUIRE);
	uint64_t t0 = bench_now_ns();

	__atomic_store_n(&b->sh->mode, mode, __ATOMIC_RELEASE);
	if (mode == A_SLEEPS || mode == A_QUITS)
		return 0;
	/* A is at it once it freed a few. */
	while (__atomic_load_n(&b->sh->frees, __ATOMIC_ACQUIRE) < frees + 3) {
		if (b->sh->error)
			return b->sh->error;
		if (bench_now_ns() - t0 > 10000000000ull)
			return -ETIMEDOUT;
		usleep(100);
	}
	return 0;
}

static int loaded(const struct bench *b, enum mode mode, struct load_row *row, int rep)
{
	uint64_t f0, t0, asked = mrd_cache_asked(b->l);
	int r = set_mode(b, mode);

	f0 = __atomic_load_n(&b->sh->frees, __ATOMIC_ACQUIRE);
	t0 = bench_now_ns();
	if (r >= 0)
		r = phase(b, &row->ns_case[rep]);
	row->frees_per_s[rep] = (double)(__atomic_load_n(&b->sh->frees, __ATOMIC_ACQUIRE) - f0) *
				1e9 / (double)(bench_now_ns() - t0);
	row->asks[rep] = (double)(mrd_cache_asked(b->l) - asked);
	if (r >= 0)
		r = set_mode(b, A_SLEEPS);
	return r < 0 ? r : b->sh->error;
}

static int measure(struct bench *b, enum mode mode, struct load_row *row)
{
	int r = 0;

	for (int rep = 0; rep < REPS && r >= 0; rep++)
		for (int j = 0; j < 2 && r >= 0; j++) {
			if ((rep + j) % 2 == 0)
				r = phase(b, &row->ns_base[rep]);
			else
				r = loaded(b, mode, row, rep);
		}
	return r;
}

/* The CPUs B, and A with mrd (its loop and workers), run on: the first two of ours, or one. */
static int pick_cpus(struct bench *b, int *ret_b, int *ret_others)
{
	cpu_set_t set;
	int cpu[2], n = 0;

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return negative_errno();
	for (int i = 0; i < CPU_SETSIZE && n < 2; i++)
		if (CPU_ISSET(i, &set))
			cpu[n++] = i;
	if (n == 0)
		return -ENODEV;
	*ret_b = cpu[0];
	*ret_others = cpu[n - 1];
	b->placement = n == 2 ? "B on one CPU, A and mrd on the other" :
				"one CPU: B, A and mrd share it";
	return 0;
}

static int setup(struct bench *b)
{
	static const char *const mrd_args[] = { "--log-level", "warning", NULL };
	uint64_t s = 0x9e3779b97f4a7c15ull;
	int cpu_b = -1, cpu_others = -1, r;

	b->sh = mmap(NULL, sizeof(*b->sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
		     0);
	if (b->sh == MAP_FAILED) {
		b->sh = NULL;
		return negative_errno();
	}
	r = pick_cpus(b, &cpu_b, &cpu_others);
	/* mrd's threads and A inherit the CPU they are forked on. */
	if (r >= 0)
		r = bench_pin(0, cpu_others);
	if (r >= 0)
		r = mrd_proc_start(&b->mrd, "[memory]\nhugepages = no\n", mrd_args);
	if (r < 0)
		return r;
	/* A forks before B connects: it must inherit no libmrd handle (nor its window). */
	fflush(NULL);
	b->a_pid = fork();
	if (b->a_pid < 0)
		return negative_errno();
	if (b->a_pid == 0)
		client_a(b->mrd.socket, b->sh);
	r = bench_pin(0, cpu_b);
	if (r >= 0)
		r = mrd_client_connect(b->mrd.socket, &b->client);
	if (r >= 0)
		r = mrd_cache_new(b->client, &b->l);
	for (int i = 0; i < N_BUFS && r >= 0; i++) {
		struct mrd_keys mr = { 0 };

		r = mrd_mem_alloc(b->client, BUF_SIZE, 0, 0, &b->buf[i]);
		if (r >= 0)
			r = mrd_cache_keys(b->l, b->buf[i], &mr); /* registered, cached */
		b->lkey[i] = mr.lkey;
	}
	if (r < 0) {
		fprintf(stderr, "bench-lookup-frees: client B: %s\n", mrd_last_error());
		return r;
	}
	for (size_t i = 0; i < N_ADDRS; i++) {
		unsigned k = (unsigned)(bench_rng_next(&s) % N_BUFS);

		b->addrs[i] = (uintptr_t)b->buf[k] + bench_rng_next(&s) % BUF_SIZE;
		b->want += b->lkey[k];
	}
	r = set_mode(b, A_FLAT_OUT); /* warm-up: A's arena made, kept by mrd */
	if (r >= 0) {
		double ns;

		r = phase(b, &ns);
	}
	return r < 0 ? r : set_mode(b, A_SLEEPS);
}

static void teardown(struct bench *b)
{
	if (b->sh)
		__atomic_store_n(&b->sh->mode, A_QUITS, __ATOMIC_RELEASE);
	if (b->a_pid > 0)
		(void)waitpid(b->a_pid, NULL, 0);
	mrd_cache_free(b->l);
	for (int i = 0; i < N_BUFS; i++)
		if (b->buf[i])
			(void)mrd_mem_free(b->client, b->buf[i]);
	mrd_client_close(b->client);
	if (b->mrd.pid > 0)
		mrd_proc_stop(&b->mrd);
	if (b->sh)
		munmap(b->sh, sizeof(*b->sh));
}

static double median_copy(const double *v, size_t n)
{
	double d[REPS];

	memcpy(d, v, n * sizeof(*d));
	return bench_median(d, n);
}

static double report_row(const char *name, const struct load_row *row, const char *load,
			 const char *tag, double *per_rep)
{
	double ratio;

	for (int i = 0; i < REPS; i++)
		per_rep[i] = row->ns_case[i] / row->ns_base[i];
	ratio = median_copy(per_rep, REPS);
	printf("%s: ratio=%.3f (case=B's mrd_cache_lkey() over 64 cached MRs (8 in the top half, "
	       "56 in the bottom) while A (another process, B's uid) allocates and frees 4 KiB %s "
	       "baseline=the same lookups while A sleeps reps=%d)%s\n", name, ratio, load, REPS,
	       tag);
	bench_print_doubles("per-rep ratio", per_rep, REPS);
	printf("  raw, median of reps: ns per lookup case %.2f, baseline %.2f; A's frees/s %.0f; "
	       "B's lookups that asked mrd per loaded phase %.0f\n", median_copy(row->ns_case, REPS),
	       median_copy(row->ns_base, REPS), median_copy(row->frees_per_s, REPS),
	       median_copy(row->asks, REPS));
	return ratio;
}

int main(int argc, char **argv)
{
	static struct bench b = { .a_pid = -1 };
	struct bench_summary sum[2];
	double per_rep[REPS], ratio;
	size_t n_sum = 0, held;
	int r;

	if (argc > 1) {
		fprintf(stderr, "usage: bench-lookup-frees\n");
		return EXIT_FAILURE;
	}
	signal(SIGPIPE, SIG_IGN);
	r = setup(&b);
	if (r >= 0)
		r = measure(&b, A_PACED, &b.paced);
	if (r >= 0)
		r = measure(&b, A_FLAT_OUT, &b.flat_out);
	if (r >= 0)
		r = measure(&b, A_PACED_REGISTERED, &b.registered);
	if (r >= 0)
		r = measure(&b, A_FLAT_OUT_REGISTERED, &b.registered_flat_out);
	teardown(&b);
	if (r < 0) {
		fprintf(stderr, "bench-lookup-frees: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	printf("lookup-hit-under-frees: %s; phases of %llu ms, idle and loaded interleaved\n",
	       b.placement, PHASE_NS / 1000000);
	ratio = report_row("lookup-hit-under-frees", &b.paced,
			   "it never registers at ~5,000 frees/s", "", per_rep);
	bench_add_summary(sum, &n_sum, "lookup-hit-under-frees", ratio, per_rep, REPS, TARGET,
			  true);
	(void)report_row("lookup-hit-under-frees-flat-out", &b.flat_out,
			 "it never registers as fast as it can", " [informational]", per_rep);
	ratio = report_row("lookup-hit-under-registered-frees", &b.registered,
			   "it registered (looked up) first at ~5,000 frees/s", "", per_rep);
	bench_add_summary(sum, &n_sum, "lookup-hit-under-registered-frees", ratio, per_rep, REPS,
			  TARGET, true);
	(void)report_row("lookup-hit-under-registered-frees-flat-out", &b.registered_flat_out,
			 "it registered (looked up) first, as fast as it can", " [informational]",
			 per_rep);
	printf("summary (target from PERF.md: B's cached lookup while another process of its uid "
	       "frees 5,000 allocations/s, registered or not, <= %.1fx the same idle):\n", TARGET);
	held = bench_print_summary(sum, n_sum);
	printf("  %zu of %zu targets hold\n", held, n_sum);
	return EXIT_SUCCESS;
}
