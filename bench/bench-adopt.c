/* SPDX-License-Identifier: MIT */
/* mrd_mem_adopt(3) on the soft provider: the first registration of memory the program has
 * (adopt: Alloc, the pages copied and swapped in with writes held off, then the keys: mrd
 * registers it) against what ibv_reg_mr costs the kernel here (mlock() of the same pages: the
 * pinning, with no device to program: the soft provider has no ibv_reg_mr); and the hit of a
 * program registering the same buffer again (mrd_mem_adopt of it, counted, and the keys from
 * the lookup cache) against that first registration. Interleaved, median of reps. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "bench-util.h"
#include "test-util.h"

#define REPS 7

static mrd_client *client;
static mrd_cache *cache;

struct times {
	double fresh, mlock, again; /* ns per registration */
};

static int measure(char *buf, size_t len, unsigned iters, struct times *t, uint64_t *sum)
{
	uint64_t t0;
	struct mrd_keys k;
	int r;

	t->fresh = 0;
	for (unsigned i = 0; i < iters; i++) {
		t0 = bench_now_ns();
		r = mrd_mem_adopt(client, buf, len, 0);
		if (r == 0)
			r = mrd_keys_query(client, buf, &k);
		t->fresh += (double)(bench_now_ns() - t0);
		if (r < 0)
			return r;
		*sum += k.lkey;
		r = mrd_mem_unadopt(client, buf);
		if (r < 0)
			return r;
	}
	t->mlock = 0;
	for (unsigned i = 0; i < iters; i++) {
		t0 = bench_now_ns();
		r = mlock(buf, len);
		t->mlock += (double)(bench_now_ns() - t0);
		if (r < 0)
			return -errno;
		munlock(buf, len);
	}
	r = mrd_mem_adopt(client, buf, len, 0);
	if (r < 0)
		return r;
	r = mrd_cache_keys(cache, buf, &k);
	t0 = bench_now_ns();
	for (unsigned i = 0; i < iters && r == 0; i++) {
		r = mrd_mem_adopt(client, buf, len, 0);
		if (r == 0)
			r = mrd_cache_keys(cache, buf + (i & 63), &k);
		*sum += k.lkey;
	}
	t->again = (double)(bench_now_ns() - t0);
	for (unsigned i = 0; i <= iters && r >= 0; i++)
		r = mrd_mem_unadopt(client, buf);
	t->fresh /= iters;
	t->mlock /= iters;
	t->again /= iters;
	return r < 0 ? r : 0;
}

static void report(struct bench_summary *sum, size_t *n_sum, const char *name, size_t len,
		   const struct times *t, bool hit, double target)
{
	double per_rep[REPS], c[REPS], b[REPS], ratio;

	for (int i = 0; i < REPS; i++) {
		c[i] = hit ? t[i].again : t[i].fresh;
		b[i] = hit ? t[i].fresh : t[i].mlock;
		per_rep[i] = c[i] / b[i];
	}
	ratio = bench_median(per_rep, REPS);
	if (hit)
		printf("%s: ratio=%.4f (case=mrd_mem_adopt of the same %zu KiB buffer again + "
		       "mrd_cache_keys hit baseline=its first registration (mrd_mem_adopt + "
		       "mrd_keys_query of a private buffer), interleaved reps=%d)\n", name, ratio,
		       len >> 10, REPS);
	else
		printf("%s: ratio=%.3f (case=mrd_mem_adopt + mrd_keys_query of %zu KiB of private "
		       "memory baseline=mlock() of the same pages, what ibv_reg_mr pins (soft "
		       "provider: no device, no ibv_reg_mr), interleaved reps=%d)\n", name, ratio,
		       len >> 10, REPS);
	bench_print_doubles("per-rep ratio", per_rep, REPS);
	printf("  raw, median of reps: us per registration, case %.2f, baseline %.2f\n",
	       bench_median(c, REPS) / 1e3, bench_median(b, REPS) / 1e3);
	if (target > 0)
		bench_add_summary(sum, n_sum, name, ratio, per_rep, REPS, target, true);
}

int main(void)
{
	static const char *const mrd_args[] = { "--log-level", "warning", NULL };
	static const struct {
		const char *first, *again;
		size_t len;
		unsigned iters;
	} sizes[] = {
		{ "adopt-first-64k", "adopt-again-64k", 64u << 10, 100 },
		{ "adopt-first-1m", "adopt-again-1m", 1u << 20, 30 },
	};
	struct times t[2][REPS];
	struct bench_summary sum[4];
	static struct mrd_proc mrd;
	char *buf[2] = { NULL, NULL };
	size_t n_sum = 0, held;
	uint64_t keysum = 0;
	int k;

	signal(SIGPIPE, SIG_IGN);
	k = mrd_proc_start(&mrd, "[memory]\nhugepages = no\narena_size = 64M\n", mrd_args);
	if (k == 0)
		k = mrd_client_connect(mrd.socket, &client);
	if (k == 0)
		k = mrd_cache_new(client, &cache);
	for (int s = 0; s < 2 && k == 0; s++) {
		buf[s] = mmap(NULL, sizes[s].len, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (buf[s] == MAP_FAILED)
			k = -errno;
		else
			memset(buf[s], 1, sizes[s].len);
	}
	for (int rep = -1; rep < REPS && k == 0; rep++) /* rep -1 warms up */
		for (int s = 0; s < 2 && k == 0; s++) {
			struct times w;

			k = measure(buf[s], sizes[s].len, sizes[s].iters, rep < 0 ? &w : &t[s][rep],
				    &keysum);
		}
	if (k < 0 && k != -EOPNOTSUPP)
		fprintf(stderr, "bench-adopt: %s (%s)\n", strerror(-k), mrd_last_error());
	if (k == -EOPNOTSUPP)
		printf("bench-adopt: not measured: %s\n", mrd_last_error());
	for (int s = 0; s < 2 && k == 0; s++) {
		report(sum, &n_sum, sizes[s].first, sizes[s].len, t[s], false, 0);
		report(sum, &n_sum, sizes[s].again, sizes[s].len, t[s], true, 0.1);
	}
	cache = mrd_cache_free(cache);
	client = mrd_client_close(client);
	if (mrd.pid > 0)
		mrd_proc_stop(&mrd);
	if (k < 0)
		return k == -EOPNOTSUPP ? EXIT_SUCCESS : EXIT_FAILURE;
	printf("summary (issue 40: a re-registration hit >= 10x faster than a fresh one; keysum "
	       "%llu):\n", (unsigned long long)keysum);
	held = bench_print_summary(sum, n_sum);
	printf("  %zu of %zu targets hold\n", held, n_sum);
	return EXIT_SUCCESS;
}
