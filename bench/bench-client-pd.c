/* SPDX-License-Identifier: MIT */
/* Registration through mrd into the client's own PD (BindPd) against the client's own
 * ibv_reg_mr of the same memory, same size, same run, interleaved (PERF.md: <= 1.5x at 4 KiB,
 * <= 1.05x at 64 MiB): by a first lookup (a round trip of its own), and, at 4 KiB, with the
 * allocation (mrd_mem_alloc_keys: what it adds to the Alloc); then a cached lookup of a bound
 * handle against an unbound one's.
 *
 *   bench-client-pd SOCKET DEVICE
 *
 * Needs a verbs device and the right to pin (root): make bench runs it in the rxe VM
 * (tests/vm/rdma-vm.sh --bench); elsewhere it exits 77 and says why. Each rep allocates fresh
 * mrd memory for both sides, so both pin pages the kernel faults in now: mrd's path is a
 * MrLookup round trip plus mrd's REG_MR through the client's command fd; the baseline the
 * REG_MR alone. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <mrd/mrd.h>
#include <mrd/mrd-verbs.h>

#include "bench-util.h"
#include "bench-verbs.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)

static mrd_client *bound, *plain;
static struct ibv_pd *pd;

static void die(const char *what, int r)
{
	fprintf(stderr, "bench-client-pd: %s: %s (%s)\n", what, strerror(r < 0 ? -r : r),
		mrd_last_error());
	exit(1);
}

static void *alloc(size_t size)
{
	void *p;
	int r = mrd_mem_alloc(bound, size, 0, 0, &p);

	if (r < 0)
		die("mrd_mem_alloc", r);
	return p;
}

/* One registration through mrd: the first lookup of a fresh allocation. */
static uint64_t through_mrd(size_t size)
{
	void *p = alloc(size);
	struct mrd_keys k;
	uint64_t t0 = bench_now_ns(), t;
	int r = mrd_keys_query(bound, p, &k);

	t = bench_now_ns() - t0;
	if (r < 0)
		die("mrd_keys_query", r);
	mrd_mem_free(bound, p);
	return t;
}

/* The client's own: ibv_reg_mr of a fresh allocation of the same size. */
static uint64_t own(size_t size)
{
	void *p = alloc(size);
	uint64_t t0 = bench_now_ns(), t;
	struct ibv_mr *mr = ibv_reg_mr(pd, p, size, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

	t = bench_now_ns() - t0;
	if (!mr)
		die("ibv_reg_mr", errno);
	ibv_dereg_mr(mr);
	mrd_mem_free(bound, p);
	return t;
}

static bool row(const char *name, size_t size, unsigned reps, double target)
{
	uint64_t a[64], b[64];
	double ratio[64], ma, mb, q1, q3;

	(void)through_mrd(size); /* warm: the domain, its arena, the code paths */
	(void)own(size);
	for (unsigned i = 0; i < reps; i++) {
		if (i % 2) {
			b[i] = own(size);
			a[i] = through_mrd(size);
		} else {
			a[i] = through_mrd(size);
			b[i] = own(size);
		}
		ratio[i] = (double)a[i] / (double)b[i];
	}
	bench_quartiles(ratio, reps, &q1, &q3);
	ma = (double)bench_quantile(a, reps, 0.5);
	mb = (double)bench_quantile(b, reps, 0.5);
	printf("%s: ratio=%.2f (case=mrd MrLookup miss into the client's PD %.1f us, "
	       "baseline=own ibv_reg_mr %.1f us, per-rep ratio q1 %.2f q3 %.2f, reps=%u) "
	       "target <= %.2f: %s\n", name, ma / mb, ma / 1e3, mb / 1e3, q1, q3, reps, target,
	       ma / mb <= target ? "met" : "MISSED");
	return ma / mb <= target;
}

/* The registration with the allocation (mrd_mem_alloc_keys): what it adds to the Alloc's
 * round trip, against the client's own ibv_reg_mr of the same memory, interleaved. */
static bool alloc_keys_row(const char *name, size_t size, unsigned reps, double target)
{
	uint64_t with[64], without[64], own_t[64];
	double added, mo;

	for (unsigned i = 0; i <= reps; i++) { /* the first is the warm-up */
		struct mrd_keys k;
		struct ibv_mr *mr;
		uint64_t t0, t1, t2;
		void *p, *q;
		int r;

		t0 = bench_now_ns();
		r = mrd_mem_alloc_keys(bound, size, 0, 0, &p, &k);
		t1 = bench_now_ns();
		if (r < 0)
			die("mrd_mem_alloc_keys", r);
		q = alloc(size);
		t2 = bench_now_ns();
		mr = ibv_reg_mr(pd, q, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_READ);
		if (!mr)
			die("ibv_reg_mr", errno);
		if (i > 0) {
			with[i - 1] = t1 - t0;
			without[i - 1] = t2 - t1;
			own_t[i - 1] = bench_now_ns() - t2;
		}
		ibv_dereg_mr(mr);
		mrd_mem_free(bound, p);
		mrd_mem_free(bound, q);
	}
	added = (double)bench_quantile(with, reps, 0.5) - (double)bench_quantile(without, reps, 0.5);
	mo = (double)bench_quantile(own_t, reps, 0.5);
	printf("%s: ratio=%.2f (case=what registering with the Alloc adds: mrd_mem_alloc_keys "
	       "%.1f us - mrd_mem_alloc %.1f us, baseline=own ibv_reg_mr %.1f us, reps=%u) "
	       "target <= %.2f: %s\n", name, added / mo,
	       (double)bench_quantile(with, reps, 0.5) / 1e3,
	       (double)bench_quantile(without, reps, 0.5) / 1e3, mo / 1e3, reps, target,
	       added / mo <= target ? "met" : "MISSED");
	return added / mo <= target;
}

/* A lookup-cache hit of the bound handle against the same hit of an unbound one. */
static void cached_row(void)
{
	enum { N = 200000, REPS = 7 };
	mrd_cache *cb, *cp;
	void *pb = alloc(64 * KiB), *pp;
	double ratio[REPS];
	uint64_t sink = 0;
	int r = mrd_mem_alloc(plain, 64 * KiB, 0, 0, &pp);

	if (r < 0 || mrd_cache_new(bound, &cb) < 0 || mrd_cache_new(plain, &cp) < 0)
		die("cache", r);
	sink += mrd_cache_lkey(cb, pb) + mrd_cache_lkey(cp, pp);
	for (int rep = 0; rep < REPS; rep++) {
		uint64_t t0 = bench_now_ns(), t1, t2;

		for (int i = 0; i < N; i++)
			sink += mrd_cache_lkey(cb, (char *)pb + (i & 4095));
		t1 = bench_now_ns();
		for (int i = 0; i < N; i++)
			sink += mrd_cache_lkey(cp, (char *)pp + (i & 4095));
		t2 = bench_now_ns();
		ratio[rep] = (double)(t1 - t0) / (double)(t2 - t1);
	}
	printf("client-pd-cached-lookup: ratio=%.2f (case=lookup-cache hit of a bound handle, "
	       "baseline=the same of an unbound handle, reps=%d; sink %" PRIu64 ") target <= 1.10\n",
	       bench_median(ratio, REPS), REPS, sink & 1);
	mrd_cache_free(cb);
	mrd_cache_free(cp);
}

int main(int argc, char **argv)
{
	struct ibv_context *ctx = NULL;
	bool met = true;
	int r;

	if (argc != 3) {
		fprintf(stderr, "usage: bench-client-pd SOCKET DEVICE\n");
		return 2;
	}
	ctx = bench_open_verbs(argv[2]);
	if (!ctx) {
		printf("bench-client-pd: not measured: no verbs device %s here (make bench runs it "
		       "in the rxe VM)\n", argv[2]);
		return 77;
	}
	pd = ibv_alloc_pd(ctx);
	r = pd ? mrd_client_connect(argv[1], &bound) : -errno;
	if (r >= 0)
		r = mrd_verbs_bind_pd(bound, pd);
	if (r >= 0)
		r = mrd_client_connect(argv[1], &plain);
	if (r < 0)
		die("connect and bind", r);
	{ /* raw: what one round trip to mrd costs here, for reading the 4 KiB row */
		uint64_t t[41];

		for (int i = 0; i < 41; i++) {
			uint64_t t0 = bench_now_ns();

			(void)mrd_client_ping(bound);
			t[i] = bench_now_ns() - t0;
		}
		printf("client-pd-ping: %.1f us median (raw: a Ping round trip to mrd, 41 reps)\n",
		       (double)bench_quantile(t, 41, 0.5) / 1e3);
		void *p = alloc(4 * KiB);
		struct mrd_keys k;

		(void)mrd_keys_query(bound, p, &k);
		for (int i = 0; i < 41; i++) {
			uint64_t t0 = bench_now_ns();

			(void)mrd_keys_query(bound, p, &k);
			t[i] = bench_now_ns() - t0;
		}
		printf("client-pd-lookup-hit: %.1f us median (raw: a MrLookup mrd answers from its "
		       "table, 41 reps)\n", (double)bench_quantile(t, 41, 0.5) / 1e3);
		mrd_mem_free(bound, p);
	}
	met &= row("client-pd-reg-4k", 4 * KiB, 41, 1.5);
	met &= row("client-pd-reg-64m", 64 * MiB, 7, 1.05);
	alloc_keys_row("client-pd-alloc-keys-4k", 4 * KiB, 41, 1.5);
	cached_row();
	printf("bench-client-pd: %s\n", met ? "targets met" : "a target MISSED");
	mrd_client_close(plain);
	mrd_client_close(bound);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return 0;
}
