/* SPDX-License-Identifier: MIT */
/*
 * make bench, figure set "ucx": libmrd's lookups against UCX's own (libucs, Debian libucx-dev),
 * in one run, interleaved (shared/PERF.md). Built only when configure finds pkg-config ucx-ucs.
 *
 *   ucx-pgtable-N  mr_table_lookup() over N synthetic entries (common/mr-table.c: the table of
 *                  libmrd's bottom half), against ucs_pgtable_lookup() over the same N regions
 *                  (UCX's radix page table: what its registration cache searches), the same
 *                  random hit addresses, N = 256 and 4096
 *   ucx-rcache     libmrd's full lookup hit: inline mrd_cache_lkey() on addresses spread at
 *                  random over 8 buffers allocated from a private mrd (as bench-lookup's
 *                  top-random8 case), against ucs_rcache_get() + ucs_rcache_region_put() hits on
 *                  the same 8 buffers in a UCX registration cache whose mem_reg and mem_dereg
 *                  only succeed, populated by one get of each buffer beforehand
 *   ucx-rcache-mr  [informational] the out-of-line mrd_cache_keys() (the full lookup as a
 *                  function call returning the whole MR: generation check, top-half scan) on the
 *                  same addresses, against the same rcache hits. Its hits are top-half hits: a
 *                  bottom-half hit moves the MR into the top half, so random addresses over 8
 *                  buffers cannot keep hitting the bottom half.
 *
 * Every timed batch sums the keys it got, which keeps the compiler from dropping the lookups and
 * checks that case and baseline found the same keys.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ucs/datastruct/pgtable.h>
#include <ucs/memory/rcache.h>
#include <ucs/type/status.h>

#include "bench-util.h"
#include "macro.h"
#include "mr-table.h"
#include "mrd/mrd.h"
#include "test-util.h"

#define KiB 1024u

#define NS_REPS 15
#define BOTTOM_ADDRS 65536u
#define BOTTOM_OPS (16u * BOTTOM_ADDRS)
#define TOP_ADDRS 4096u
#define TOP_OPS (256u * TOP_ADDRS)
#define N_BUFS BENCH_BUFS
#define BUF_SIZE BENCH_BUF_SIZE
#define BOTTOM_STRIDE (64u * KiB) /* synthetic entries: 48 KiB ranges with 16 KiB gaps */
#define BOTTOM_LEN (48u * KiB)
#define BOTTOM_BASE 0x200000000000ull /* mrd's default window_base */
#define RC_LEN 64u /* bytes each rcache get asks for: a small message */

#define TARGET_PGTABLE 1.0
#define TARGET_RCACHE 0.1

static const size_t pgt_sizes[] = { 256, 4096 };
#define N_PGT ELEMENTSOF(pgt_sizes)

struct ns_row {
	double ns_case[NS_REPS], ns_base[NS_REPS];
};

/* UCX's page table holds regions; the key lives beside, as in UCX's own rcache regions. */
struct pgt_entry {
	ucs_pgt_region_t super;
	uint32_t lkey;
};

struct rc_region {
	ucs_rcache_region_t super;
	uint32_t lkey;
};

struct bench {
	struct bench_mrd m; /* mrd and its 8 looked-up buffers */
	ucs_rcache_t *rcache;
	int cpu;
	struct ns_row pgt[N_PGT], rcache_row, rcache_mr;
};


static TIMED uint64_t loop_table(const struct mr_table *t, const uint64_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		const struct mr_entry *e = mr_table_lookup(t, addrs[i & (BOTTOM_ADDRS - 1)]);

		sum += e ? e->lkey : MRD_KEY_INVALID;
	}
	return sum;
}

static TIMED uint64_t loop_pgtable(const ucs_pgtable_t *pgt, const uint64_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		const ucs_pgt_region_t *r = ucs_pgtable_lookup(pgt, addrs[i & (BOTTOM_ADDRS - 1)]);

		sum += r ? ((const struct pgt_entry *)r)->lkey : MRD_KEY_INVALID;
	}
	return sum;
}

static TIMED uint64_t loop_lkey(mrd_cache *l, const uintptr_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		RELOAD_BARRIER(l);
		sum += mrd_cache_lkey(l, (const void *)addrs[i & (TOP_ADDRS - 1)]);
	}
	return sum;
}

/* The out-of-line full lookup, called directly. */
static TIMED uint64_t loop_cache_keys(mrd_cache *l, const uintptr_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		struct mrd_keys mr;

		RELOAD_BARRIER(l);
		sum += mrd_cache_keys(l, (const void *)addrs[i & (TOP_ADDRS - 1)], &mr) < 0 ?
			       MRD_KEY_INVALID : mr.lkey;
	}
	return sum;
}

static TIMED uint64_t loop_rcache(ucs_rcache_t *rc, const uintptr_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		ucs_rcache_region_t *r;

		if (ucs_rcache_get(rc, (void *)addrs[i & (TOP_ADDRS - 1)], RC_LEN,
				   PROT_READ | PROT_WRITE, NULL, &r) != UCS_OK) {
			sum += MRD_KEY_INVALID;
			continue;
		}
		sum += ((struct rc_region *)r)->lkey;
		ucs_rcache_region_put(rc, r);
	}
	return sum;
}

static int pin_cpu(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return negative_errno();
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set)) {
			CPU_ZERO(&set);
			CPU_SET(i, &set);
			return sched_setaffinity(0, sizeof(set), &set) < 0 ? negative_errno() : i;
		}
	return -ENODEV;
}

static int check_sums(const char *row, uint64_t got, uint64_t want)
{
	return bench_check_sum("bench-ucx", row, got, want);
}

typedef uint64_t (*loop_fn)(void *ctx, const void *addrs, size_t ops);

/* Warm-up of both, then NS_REPS interleaved reps, order swapped each rep. */
static int time_pair(const char *row, struct ns_row *out, uint64_t want, size_t ops,
		     const void *addrs, loop_fn fcase, void *ccase, loop_fn fbase, void *cbase)
{
	int r = check_sums(row, fcase(ccase, addrs, ops), want);

	if (r >= 0)
		r = check_sums(row, fbase(cbase, addrs, ops), want);
	for (int rep = 0; rep < NS_REPS && r >= 0; rep++)
		for (int j = 0; j < 2 && r >= 0; j++) {
			uint64_t t0 = bench_now_ns(), got;

			if ((rep + j) % 2 == 0) {
				got = fcase(ccase, addrs, ops);
				out->ns_case[rep] = (double)(bench_now_ns() - t0) / (double)ops;
			} else {
				got = fbase(cbase, addrs, ops);
				out->ns_base[rep] = (double)(bench_now_ns() - t0) / (double)ops;
			}
			r = check_sums(row, got, want);
		}
	return r;
}

static uint64_t w_table(void *c, const void *a, size_t n) { return loop_table(c, a, n); }
static uint64_t w_pgtable(void *c, const void *a, size_t n) { return loop_pgtable(c, a, n); }
static uint64_t w_lkey(void *c, const void *a, size_t n) { return loop_lkey(c, a, n); }
static uint64_t w_cache_keys(void *c, const void *a, size_t n) { return loop_cache_keys(c, a, n); }
static uint64_t w_rcache(void *c, const void *a, size_t n) { return loop_rcache(c, a, n); }

static ucs_pgt_dir_t *pgd_alloc(const ucs_pgtable_t *pgt)
{
	/* UCS_PGT_ENTRY_MIN_ALIGN is 4: malloc's alignment is enough. */
	return malloc(sizeof(ucs_pgt_dir_t));
}

static void pgd_release(const ucs_pgtable_t *pgt, ucs_pgt_dir_t *dir)
{
	free(dir);
}

static int bench_pgtable(struct bench *b)
{
	_cleanup_free_ uint64_t *addrs = malloc(BOTTOM_ADDRS * sizeof(*addrs));
	int r = 0;

	if (!addrs)
		return -ENOMEM;
	for (size_t i = 0; i < N_PGT && r >= 0; i++) {
		size_t n = pgt_sizes[i];
		uint64_t s = 0x2545f4914f6cdd1dull + n, want = 0;
		struct pgt_entry *pe = calloc(n, sizeof(*pe));
		ucs_pgtable_t pgt;
		struct mr_table t;
		char row[32];

		snprintf(row, sizeof(row), "ucx-pgtable-%zu", n);
		if (!pe)
			return -ENOMEM;
		if (ucs_pgtable_init(&pgt, pgd_alloc, pgd_release) != UCS_OK) {
			free(pe);
			return -ENOMEM;
		}
		r = mr_table_init(&t, n + 1, 0);
		for (size_t k = 0; k < n && r >= 0; k++) {
			struct mr_entry e = { BOTTOM_BASE + k * BOTTOM_STRIDE,
					      BOTTOM_BASE + k * BOTTOM_STRIDE + BOTTOM_LEN,
					      (uint32_t)(k * 2654435761u) >> 1, (uint32_t)k };

			r = mr_table_insert(&t, &e);
			pe[k].super.start = e.start;
			pe[k].super.end = e.end;
			pe[k].lkey = e.lkey;
			if (r >= 0 && ucs_pgtable_insert(&pgt, &pe[k].super) != UCS_OK)
				r = -EINVAL;
		}
		for (size_t k = 0; k < BOTTOM_ADDRS && r >= 0; k++) {
			size_t e = bench_rng_next(&s) % n;

			addrs[k] = BOTTOM_BASE + e * BOTTOM_STRIDE + bench_rng_next(&s) % BOTTOM_LEN;
			want += pe[e].lkey;
		}
		want *= BOTTOM_OPS / BOTTOM_ADDRS;
		if (r >= 0)
			r = time_pair(row, &b->pgt[i], want, BOTTOM_OPS, addrs, w_table, &t,
				      w_pgtable, &pgt);
		for (size_t k = 0; k < n; k++)
			if (pe[k].super.end)
				(void)ucs_pgtable_remove(&pgt, &pe[k].super);
		ucs_pgtable_cleanup(&pgt);
		mr_table_done(&t);
		free(pe);
	}
	return r;
}

static ucs_status_t rc_mem_reg(void *context, ucs_rcache_t *rcache, void *arg,
			       ucs_rcache_region_t *region, uint16_t flags)
{
	const struct bench *b = context;
	struct rc_region *rr = (struct rc_region *)region;

	rr->lkey = MRD_KEY_INVALID;
	for (int i = 0; i < N_BUFS; i++)
		if (region->super.start >= b->m.mr[i].start && region->super.start < b->m.mr[i].end)
			rr->lkey = b->m.mr[i].lkey;
	return UCS_OK;
}

static void rc_mem_dereg(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *region)
{
}

static void rc_dump(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *region, char *buf,
		    size_t max)
{
	snprintf(buf, max, "lkey 0x%x", ((struct rc_region *)region)->lkey);
}

static const ucs_rcache_ops_t rc_ops = { rc_mem_reg, rc_mem_dereg, rc_dump };

static int rcache_setup(struct bench *b)
{
	ucs_rcache_params_t p;
	long page = sysconf(_SC_PAGESIZE);

	memset(&p, 0, sizeof(p));
	p.region_struct_size = sizeof(struct rc_region);
	p.alignment = (size_t)page;
	p.max_alignment = (size_t)page;
	p.ucm_events = 0;
	p.ucm_event_priority = 1000;
	p.ops = &rc_ops;
	p.context = b;
	p.flags = 0;
	p.max_regions = (unsigned long)-1;
	p.max_size = (size_t)-1;
	p.max_unreleased = (size_t)-1;
	if (ucs_rcache_create(&p, "mrd-bench", NULL, &b->rcache) != UCS_OK) {
		fprintf(stderr, "bench-ucx: ucs_rcache_create failed\n");
		return -EINVAL;
	}
	/* One get of each whole buffer registers it; the put leaves it cached. */
	for (int i = 0; i < N_BUFS; i++) {
		ucs_rcache_region_t *r;

		if (ucs_rcache_get(b->rcache, b->m.buf[i], BUF_SIZE, PROT_READ | PROT_WRITE, NULL,
				   &r) != UCS_OK)
			return -EINVAL;
		if (((struct rc_region *)r)->lkey != b->m.mr[i].lkey)
			return -EBADMSG;
		ucs_rcache_region_put(b->rcache, r);
	}
	return 0;
}

/* Random addresses over the 8 buffers, each leaving RC_LEN bytes before the buffer's end. */
static void top_addrs(const struct bench *b, uintptr_t *addrs, uint64_t *ret_want)
{
	uint64_t s = 0x9e3779b97f4a7c15ull, want = 0;

	for (size_t i = 0; i < TOP_ADDRS; i++) {
		unsigned k = (unsigned)(bench_rng_next(&s) % N_BUFS);

		addrs[i] = (uintptr_t)b->m.buf[k] + bench_rng_next(&s) % (BUF_SIZE - RC_LEN);
		want += b->m.mr[k].lkey;
	}
	*ret_want = want * (TOP_OPS / TOP_ADDRS);
}

static int bench_rcache(struct bench *b)
{
	_cleanup_free_ uintptr_t *addrs = malloc(TOP_ADDRS * sizeof(*addrs));
	uint64_t want;
	int r;

	if (!addrs)
		return -ENOMEM;
	top_addrs(b, addrs, &want);
	r = time_pair("ucx-rcache", &b->rcache_row, want, TOP_OPS, addrs, w_lkey, b->m.l, w_rcache,
		      b->rcache);
	if (r < 0)
		return r;
	return time_pair("ucx-rcache-mr", &b->rcache_mr, want, TOP_OPS, addrs, w_cache_keys,
			 b->m.l, w_rcache, b->rcache);
}

static int bench_setup(struct bench *b)
{
	int r = bench_mrd_start(&b->m, "bench-ucx");

	return r < 0 ? r : rcache_setup(b);
}

static void bench_teardown(struct bench *b)
{
	if (b->rcache)
		ucs_rcache_destroy(b->rcache);
	bench_mrd_stop(&b->m);
}

static double report_ns(const char *name, const struct ns_row *row, const char *what_case,
			const char *what_base, const char *tag, double target,
			struct bench_summary *sum, size_t *n_sum)
{
	double per_rep[NS_REPS], d[NS_REPS], c[NS_REPS], bs[NS_REPS], ratio;

	for (int i = 0; i < NS_REPS; i++) {
		per_rep[i] = d[i] = row->ns_case[i] / row->ns_base[i];
		c[i] = row->ns_case[i];
		bs[i] = row->ns_base[i];
	}
	ratio = bench_median(d, NS_REPS);
	printf("%s: ratio=%.3f (case=%s baseline=%s reps=%d)%s\n", name, ratio, what_case,
	       what_base, NS_REPS, tag);
	printf("  per-rep ratio:");
	for (int i = 0; i < NS_REPS; i++)
		printf(" %.3f", per_rep[i]);
	printf("\n  raw ns per lookup, median of reps: case %.2f; baseline %.2f\n",
	       bench_median(c, NS_REPS), bench_median(bs, NS_REPS));
	if (sum)
		bench_add_summary(sum, n_sum, name, ratio, per_rep, NS_REPS, target, true);
	return ratio;
}

static void report(const struct bench *b, double busy_before)
{
	struct bench_summary sum[N_PGT + 1];
	size_t n_sum = 0, held;

	printf("ucx: pinned to CPU %d, %d reps, case and baseline alternated; page-table rows %u "
	       "lookups per batch, rcache rows %u\n", b->cpu, NS_REPS, BOTTOM_OPS, TOP_OPS);
	for (size_t i = 0; i < N_PGT; i++) {
		char name[32], what[160], base[160];

		snprintf(name, sizeof(name), "ucx-pgtable-%zu", pgt_sizes[i]);
		snprintf(what, sizeof(what), "mr_table_lookup over %zu synthetic entries (common/"
			 "mr-table.c: the table libmrd's bottom half uses), random hits",
			 pgt_sizes[i]);
		snprintf(base, sizeof(base), "ucs_pgtable_lookup over the same %zu regions, same "
			 "addresses (UCX libucs)", pgt_sizes[i]);
		report_ns(name, &b->pgt[i], what, base, "", TARGET_PGTABLE, sum, &n_sum);
	}
	report_ns("ucx-rcache", &b->rcache_row,
		  "inline mrd_cache_lkey() on random addresses over 8 buffers from mrd (top half)",
		  "ucs_rcache_get(64 bytes)+ucs_rcache_region_put hit on the same 8 buffers, "
		  "pre-registered, dummy mem_reg", "", TARGET_RCACHE, sum, &n_sum);
	report_ns("ucx-rcache-mr", &b->rcache_mr,
		  "out-of-line mrd_cache_keys() (whole MR back) on the same addresses, top-half hits",
		  "as ucx-rcache",
		  " [informational]", 0, NULL, NULL);
	printf("summary (targets from PERF.md: bottom half <= %.1fx ucs_pgtable_lookup; full "
	       "client lookup hit <= %.1fx ucs_rcache_get+ucs_rcache_region_put):\n",
	       TARGET_PGTABLE, TARGET_RCACHE);
	held = bench_print_summary(sum, n_sum);
	printf("  %zu of %zu targets hold; %ld CPUs, %.0f%% of them busy with other work just "
	       "before the run\n", held, n_sum, sysconf(_SC_NPROCESSORS_ONLN), 100 * busy_before);
	if (busy_before > 0.2)
		printf("  WARNING: the machine was busy before the run: run make bench again on an "
		       "idle machine\n");
}

int main(int argc, char **argv)
{
	static struct bench b;
	uint64_t t0 = bench_now_ns();
	double busy_before = bench_cpu_busy(300);
	int r;

	if (argc > 1) {
		fprintf(stderr, "usage: bench-ucx\n");
		return EXIT_FAILURE;
	}
	signal(SIGPIPE, SIG_IGN);
	r = bench_setup(&b);
	if (r < 0)
		fprintf(stderr, "bench-ucx: setup: %s\n", strerror(-r));
	if (r >= 0) {
		b.cpu = pin_cpu();
		r = b.cpu;
	}
	if (r >= 0)
		r = bench_pgtable(&b);
	if (r >= 0)
		r = bench_rcache(&b);
	bench_teardown(&b);
	if (r < 0) {
		fprintf(stderr, "bench-ucx: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	report(&b, busy_before);
	printf("  (bench-ucx took %.1f s)\n", (double)(bench_now_ns() - t0) / 1e9);
	return EXIT_SUCCESS;
}
