/* SPDX-License-Identifier: MIT */
/* make bench: a registration served from an FRMR-style pool (a parked handle moved to the
 * memory) against a fresh registration of the same size, on the soft provider in-process, the
 * two interleaved in one run (PERF.md: ratio <= 0.2x). Both register the same memory; the
 * release after each (dereg, or park) is timed in a second row, reg + release. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench-util.h"
#include "registration/frmr-pool.h"
#include "macro.h"
#include "provider/provider.h"

#define REPS 7
#define TARGET 0.2

static const struct {
	const char *name;
	size_t bytes;
	unsigned iters; /* per rep and side */
} sizes[] = {
	{ "4k", 4096, 400 },
	{ "64k", 64 << 10, 400 },
	{ "2m", 2 << 20, 100 },
	{ "64m", 64 << 20, 8 },
};

struct side {
	uint64_t reg_ns, cycle_ns; /* sums over a rep */
};

/* One registration and its release, of buf; pooled: through the pools. */
static int once(struct frmr_pools *pools, struct provider_pd *pd, uint8_t *buf, size_t bytes,
		bool pooled, struct side *s)
{
	const unsigned access = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE |
				MRD_ACCESS_REMOTE_READ | MRD_ACCESS_REMOTE_ATOMIC;
	struct provider_mr *mr;
	uint64_t t0, t1, t2;
	int r;

	t0 = bench_now_ns();
	r = pooled ? frmr_pools_reg(pools, buf, bytes, access, false, &mr) :
		     provider_reg(pd, buf, bytes, (uintptr_t)buf, access, &mr);
	t1 = bench_now_ns();
	if (r < 0)
		return r;
	r = pooled ? frmr_pools_dereg(pools, mr) : provider_dereg(mr);
	t2 = bench_now_ns();
	s->reg_ns += t1 - t0;
	s->cycle_ns += t2 - t0;
	return r;
}

int main(void)
{
	const struct frmr_pools_config config = { .enabled = true, .aging_s = 3600,
						  .max_queued = 16 };
	struct bench_summary sum[ELEMENTSOF(sizes)];
	size_t n_sum = 0, span = 2 * sizes[ELEMENTSOF(sizes) - 1].bytes;
	struct provider *p;
	struct provider_pd *pd;
	struct frmr_pools pools;
	uint8_t *mem;
	int verbs_error, r;

	r = provider_open("soft", NULL, &p, &verbs_error);
	if (r >= 0)
		r = provider_pd_alloc(p, &pd);
	if (r < 0) {
		fprintf(stderr, "bench-frmr: soft provider: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	frmr_pools_init(&pools, pd, &config);
	/* Shared memory, as mrd's arenas are, touched once so neither side pays first faults. */
	mem = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		fprintf(stderr, "bench-frmr: mmap: %m\n");
		return EXIT_FAILURE;
	}
	memset(mem, 1, span);

	printf("FRMR pool hit vs fresh registration, soft provider (reps=%d, %s)\n", REPS,
	       "each rep interleaves the two, alternating two buffers so every hit moves a handle");
	for (size_t k = 0; k < ELEMENTSOF(sizes); k++) {
		size_t bytes = sizes[k].bytes;
		double reg[REPS], cycle[REPS], fresh_us[REPS], pool_us[REPS];
		char name[32];

		/* Warm: one handle of the size parked, the pool made. */
		struct side warm = { 0 };

		if (once(&pools, pd, mem, bytes, true, &warm) < 0)
			goto fail;
		for (int rep = 0; rep < REPS; rep++) {
			struct side fresh = { 0 }, pooled = { 0 };

			for (unsigned i = 0; i < sizes[k].iters; i++) {
				uint8_t *buf = mem + (i & 1) * (span / 2);

				if (once(&pools, pd, buf, bytes, false, &fresh) < 0 ||
				    once(&pools, pd, buf, bytes, true, &pooled) < 0)
					goto fail;
			}
			reg[rep] = (double)pooled.reg_ns / (double)fresh.reg_ns;
			cycle[rep] = (double)pooled.cycle_ns / (double)fresh.cycle_ns;
			fresh_us[rep] = (double)fresh.reg_ns / sizes[k].iters / 1000;
			pool_us[rep] = (double)pooled.reg_ns / sizes[k].iters / 1000;
		}
		snprintf(name, sizeof(name), "frmr-hit-%s", sizes[k].name);
		bench_print_doubles("  fresh reg us", fresh_us, REPS);
		bench_print_doubles("  pool hit us ", pool_us, REPS);
		bench_print_doubles("  reg+release ", cycle, REPS);
		printf("%s: ratio=%.3f (case=pool hit: parked handle moved here baseline=fresh "
		       "registration of %zu bytes reps=%d; reg+release ratio=%.3f)\n", name,
		       bench_median(reg, REPS), bytes, REPS, bench_median(cycle, REPS));
		bench_add_summary(sum, &n_sum, name, bench_median(reg, REPS), reg, REPS, TARGET, true);
	}
	{
		struct frmr_pool_stats st[8];
		size_t n = frmr_pools_stats(&pools, st, 8);
		uint64_t misses = 0;

		for (size_t i = 0; i < n && i < 8; i++)
			misses += st[i].misses;
		uint64_t most = 0;

		/* Every pooled registration must have been a hit but the first of each size and
		 * about one per 255 uses of a handle (its soft key index is spent then: retired;
		 * two handles may take turns). */
		for (size_t k = 0; k < ELEMENTSOF(sizes); k++)
			most += 1 + 2 * (1 + (1 + (uint64_t)REPS * sizes[k].iters) / 255);
		if (misses < ELEMENTSOF(sizes) || misses > most) {
			fprintf(stderr, "bench-frmr: %" PRIu64 " misses, expected %zu to %" PRIu64 "\n",
				misses, ELEMENTSOF(sizes), most);
			return EXIT_FAILURE;
		}
		printf("pool misses: %" PRIu64 " (one per size, then about one per 255 uses of a handle)\n",
		       misses);
	}
	printf("summary (target from PERF.md: a pool hit <= %.1fx a fresh registration):\n", TARGET);
	bench_print_summary(sum, n_sum);
	frmr_pools_done(&pools);
	(void)provider_pd_free(pd);
	provider_close(p);
	munmap(mem, span);
	return EXIT_SUCCESS;
fail:
	fprintf(stderr, "bench-frmr: registration failed (is RLIMIT_MEMLOCK too low?)\n");
	return EXIT_FAILURE;
}
