/* SPDX-License-Identifier: MIT */
/*
 * make bench, figure set "lookup": libmrd's key lookup path against hand-written baselines, in
 * one run, interleaved (shared/PERF.md).
 *
 *   top-mru      mrd_cache_lkey() (the inline fast path) on addresses in the most recently
 *                used entry, against one compare over a single {start, end, lkey} entry
 *   top-random8  mrd_cache_lkey() on addresses spread at random over the 8 entries of the top
 *                half (so 7 in 8 take the out-of-line path), against a branch-free scan of the
 *                same 8 entries
 *   bottom-N     mr_table_lookup() over N synthetic entries (common/mr-table.c: the table of
 *                libmrd's bottom half, and of mrd's cache), against a branch-free binary search
 *                over the same array. Building a bottom half of 65536 real MRs would take 65536
 *                allocations and registrations in mrd, so the data structure is timed alone.
 *                bottom-4096-crowded: the same with one more entry 1 TiB away, which leaves
 *                the table's directory nothing to narrow (its worst case).
 *   table-insert-65536 / table-remove-65536
 *                mr_table_insert() of 65536 synthetic entries one by one, in random order, into
 *                a table growing from empty (and mr_table_remove() of them all again, in another
 *                random order), per call, against the same inserts (removes) in a plain sorted
 *                array of the same entries: a branch-free bisection and a memmove, growing by
 *                doubling as the table does
 *   miss         mrd_keys_query() of an address whose MR mrd has cached (p50 and p99), against
 *                a blocking SOCK_SEQPACKET echo process moving the same bytes
 *   first-touch  [informational, no PERF.md target] the first mrd_keys_query() of a fresh 32 MiB
 *                allocation made with MRD_MEM_ODP (one on-demand child, nothing pinned) against
 *                the same of a plain allocation (contig: the whole 32 MiB pinned, on a worker)
 *   hol          client B's miss round trip (as above, to a second mrd) while client A, another
 *                process, registers 1 GiB, against the same round trip while A is idle: the
 *                registration runs on a worker ([cache] async_bytes), so the loop keeps
 *                answering B. For contrast the same again with a third mrd that registers on its
 *                loop (async_bytes = 2G). Then, each with its own mrd and fewer reps, the same
 *                while A frees a registered 1 GiB (hol-free), ODP-faults 1 GiB (hol-odp-fault:
 *                a lookup miss and emulated RDMA writes into MRD_MEM_ODP memory), write-
 *                prefetches 1 GiB with flush (hol-prefetch), and while another thread of B, on
 *                B's own handle, makes a 1 GiB first lookup (hol-own-handle). The p99 counts
 *                the round trips a stall held back (hol_held()): B's own samples count a stall
 *                once, which hides it (printed as -p99-own).
 *
 * The ns-scale rows time batches of lookups with CLOCK_MONOTONIC on one pinned CPU and divide
 * by the batch; every batch sums the keys it got, which both keeps the compiler from dropping
 * the lookups and checks that case and baseline found the same keys.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-util.h"
#include "macro.h"
#include "mr-table.h"
#include "mrd/mrd.h"
#include "test-util.h"
#include "wire.h"

#define KiB 1024u

/* ns-scale rows */
#define NS_REPS 15
/* lookups per batch: 4..40 ms, far above the clock's grain */
#define TOP_OPS (1024u * TOP_ADDRS)
#define BOTTOM_OPS (16u * BOTTOM_ADDRS)
#define TOP_ADDRS 4096u    /* addresses cycled through; 32 KiB, and random enough that the
			    * branch predictor cannot learn the sequence */
#define BOTTOM_ADDRS 65536u
#define N_BUFS BENCH_BUFS
#define BUF_SIZE BENCH_BUF_SIZE
#define BOTTOM_STRIDE (64u * KiB) /* synthetic entries: 48 KiB ranges with 16 KiB gaps */
#define BOTTOM_LEN (48u * KiB)
#define BOTTOM_BASE 0x200000000000ull /* mrd's default window_base, as real entries would be */

/* miss round trip */
#define WARMUP 3000
#define LAT_N 5000 /* round trips per case per rep: 50 samples above p99 */
#define LAT_REPS 11
#define LOOKUP_ID 20000 /* the raw frame's id: a 3-byte varint, as libmrd's are for most of the
			 * run */
#define FRAME_CAP 256

/* first-touch row */
#define FIRST_TOUCH_REPS 9
#define FIRST_TOUCH_BYTES (32ull << 20) /* within bench_mrd_start()'s quotas */

/* head-of-line row */
#define HOL_BYTES (1ull << 30)
#define HOL_REPS 7        /* idle and loaded phases each, interleaved */
#define HOL_INLINE_REPS 3 /* the contrast: every registration blocks B for its whole length */
#define N_HOL 6           /* rows: hol_specs[] */
#define HOL_NEW_REPS 5    /* the free, ODP-fault, prefetch and own-handle rows: bench-lookup
			   * stays within a few minutes */
#define HOL_LEAD_US 2000  /* ODP-fault and prefetch rows: the device work's head start */
#define HOL_ALONE 2       /* actions timed with B quiet, per row */
#define HOL_IDLE_N 20000  /* B's round trips per idle phase: ~0.1 s, so that a stall by
			   * anything else is about as likely in it as in a loaded phase */
#define HOL_CAP (1u << 20) /* B's samples kept per loaded phase (an action takes < 1 min) */
#define HOL_TIMEOUT_NS (120ull * 1000000000ull) /* a loaded phase that takes longer failed */

#define TARGET_TOP_MRU 2.0
#define TARGET_TOP_RANDOM 1.5
#define TARGET_BOTTOM 1.3
#define TARGET_P50 1.10
#define TARGET_P99 1.25
#define TARGET_HOL_P99 1.5
#define TARGET_TABLE 2.0
#define TARGET_RANGE 1.2

/* table rows: 65536 inserts or removes per rep, alternated with the baseline's */
#define TABLE_N 65536u
#define TABLE_REPS 5

/* The bottom rows: N entries spread evenly, as arenas' allocations are, and the worst case of
 * the table's directory (common/mr-table.h): the same entries crowded into one corner of the
 * span by a single entry far away (1 TiB on), so that its buckets sort out nothing and the
 * search bisects them all. */
static const struct {
	size_t n;
	bool crowded;
} bottom_cases[] = { { 256, false },  { 1024, false },  { 4096, false },
		     { 16384, false }, { 65536, false }, { 4096, true } };
#define N_BOTTOM ELEMENTSOF(bottom_cases)
#define CROWDING_ENTRY (1ull << 40)

enum lat_case { LAT_LIBMRD, LAT_FRAME, LAT_ECHO, LAT_EPOLL, N_LAT };
static const char *const lat_names[N_LAT] = { "mrd_keys_query->mrd", "frame->mrd",
					      "blocking-echo", "epoll-echo" };

/* The baseline's entry: what one cache slot needs, nothing else. */
struct flat_entry {
	uintptr_t start, end;
	uint32_t lkey;
};

struct ns_row {
	double ns_case[NS_REPS], ns_base[NS_REPS]; /* per lookup */
};

/* One head-of-line row (its own mrd): B's round trips with the actor idle and while the
 * actor's 1 GiB action is in flight, per rep. */
struct hol_row {
	int reps;  /* 0: not measured */
	int error; /* why not */
	uint64_t idle50[HOL_REPS], idle99[HOL_REPS], idle99_own[HOL_REPS]; /* as load_* */
	uint64_t load50[HOL_REPS], load99[HOL_REPS]; /* with what stalls held back (hol_held) */
	uint64_t load99_own[HOL_REPS], load_max[HOL_REPS]; /* B's own samples alone */
	size_t load_n[HOL_REPS]; /* B's samples counted while the action was in flight */
	double op_ms[HOL_REPS];  /* the action's timed request(s), as the actor timed them */
	double alone_ms[HOL_ALONE]; /* the same while B sends nothing */
};

/* Shared between B (this process) and the actor (a child process, or a thread), in a
 * MAP_SHARED page. The actor blocks in read() on a pipe between commands, so it takes no CPU
 * while B measures the idle baseline. */
struct hol_shared {
	uint32_t seq;    /* actor: where its action is, 4 steps each (see hol_enter()) */
	uint32_t ack;    /* B: seq as it was when B's latest finished sample began */
	uint32_t done;   /* actor: commands done (1 once connected) */
	int error;       /* actor: -errno of its first failure */
	pid_t tid;       /* actor: its thread, which hol_place() pins */
	uint64_t op_ns;  /* actor: its latest action's timed request(s) */
};

struct bench {
	struct bench_mrd m; /* mrd and its 8 looked-up buffers */
	char dir[64];
	struct echo_server echo, epoll;

	uint8_t req[FRAME_CAP];
	size_t req_len, reply_len;
	int fd[N_LAT]; /* raw connections of the frame and echo cases */

	int cpu;       /* the ns-scale rows run pinned here */
	bool pinned2;  /* CPUs 0 and 1 are ours: the round trip ran client on 0, servers on 1 */
	struct ns_row top_mru, top_random, bottom[N_BOTTOM];
	struct ns_row range_hit; /* mrd_cache_keys_range vs mrd_cache_keys, same addresses */
	double table_ins[TABLE_REPS], table_ins_base[TABLE_REPS]; /* ns per insert */
	double table_rm[TABLE_REPS], table_rm_base[TABLE_REPS];   /* ns per remove */
	double touch_odp[FIRST_TOUCH_REPS], touch_contig[FIRST_TOUCH_REPS];
	uint64_t p50[N_LAT][LAT_REPS], p99[N_LAT][LAT_REPS];

	const char *hol_placement;
	struct hol_row hol[N_HOL]; /* as hol_specs[] */
};

/* The timed loops (TIMED, bench-util.h) each sum the keys, so no lookup is dead code. */
static TIMED uint64_t loop_lkey(mrd_cache *l, const uintptr_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		RELOAD_BARRIER(l);
		sum += mrd_cache_lkey(l, (const void *)addrs[i & (TOP_ADDRS - 1)]);
	}
	return sum;
}

/* The range row's case and baseline: the full lookup's hit, with a length and without. */
static TIMED uint64_t loop_keys_range(mrd_cache *l, const uintptr_t *addrs, const size_t *lens,
				      size_t ops)
{
	uint64_t sum = 0;
	struct mrd_keys k;

	for (size_t i = 0; i < ops; i++) {
		RELOAD_BARRIER(l);
		if (mrd_cache_keys_range(l, (const void *)addrs[i & (TOP_ADDRS - 1)],
					 lens[i & (TOP_ADDRS - 1)], &k) == 0)
			sum += k.lkey;
	}
	return sum;
}

static TIMED uint64_t loop_keys(mrd_cache *l, const uintptr_t *addrs, size_t ops)
{
	uint64_t sum = 0;
	struct mrd_keys k;

	for (size_t i = 0; i < ops; i++) {
		RELOAD_BARRIER(l);
		if (mrd_cache_keys(l, (const void *)addrs[i & (TOP_ADDRS - 1)], &k) == 0)
			sum += k.lkey;
	}
	return sum;
}

/* PERF.md's "one L1 compare loop over a single entry". */
static TIMED uint64_t loop_one_entry(const struct flat_entry *e, const uintptr_t *addrs,
				      size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		uintptr_t a = addrs[i & (TOP_ADDRS - 1)];
		uint32_t key = MRD_KEY_INVALID;

		RELOAD_BARRIER(e);
		for (unsigned j = 0; j < 1; j++)
			if (a >= e[j].start && a < e[j].end) {
				key = e[j].lkey;
				break;
			}
		sum += key;
	}
	return sum;
}

/* A scan with no data-dependent branch: every entry is compared and the hit's key masked in.
 * One unsigned compare per entry (a - start < end - start holds exactly when start <= a < end)
 * keeps it to a few instructions an entry: a strong baseline, not a strawman. The mask, not a
 * ?:, because GCC turns the ?: back into a branch. */
static TIMED uint64_t loop_scan8(const struct mrd_keys *top, const uintptr_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		uintptr_t a = addrs[i & (TOP_ADDRS - 1)];
		uint32_t keys = 0, hits = 0;

		RELOAD_BARRIER(top);
		/* At most one entry hits, so OR-ing the masked keys is the hit's key, and the
		 * entries' compares stay independent of each other. */
#pragma GCC unroll 8
		for (unsigned j = 0; j < MRD_CACHE_TOP; j++) {
			uint32_t hit = -(uint32_t)(a - top[j].start < top[j].end - top[j].start);

			keys |= top[j].lkey & hit;
			hits |= hit;
		}
		sum += keys | ~hits; /* MRD_KEY_INVALID when none hit */
	}
	return sum;
}

/* The classic branch-free lower bound: the half is chosen with a conditional move, so the only
 * branch is the loop's, whose count depends on n alone. Entry 0 is the sentinel, so base never
 * leaves the array. noinline, as mr_table_lookup() is a call from libmrd too. */
static TIMED const struct mr_entry *bsearch_branchfree(const struct mr_table *t, uint64_t addr)
{
	const struct mr_entry *base = t->e;
	size_t n = t->n;

	while (n > 1) {
		size_t half = n / 2;

		base = base[half].start <= addr ? base + half : base;
		n -= half;
	}
	return addr < base->end ? base : NULL;
}

static TIMED uint64_t loop_table(const struct mr_table *t, const uint64_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		const struct mr_entry *e = mr_table_lookup(t, addrs[i & (BOTTOM_ADDRS - 1)]);

		sum += e ? e->lkey : MRD_KEY_INVALID;
	}
	return sum;
}

static TIMED uint64_t loop_bsearch(const struct mr_table *t, const uint64_t *addrs, size_t ops)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < ops; i++) {
		const struct mr_entry *e = bsearch_branchfree(t, addrs[i & (BOTTOM_ADDRS - 1)]);

		sum += e ? e->lkey : MRD_KEY_INVALID;
	}
	return sum;
}

/* CPU 0 when it is ours, else the first that is; sets *ret_both when 0 and 1 are both ours. */
static int pick_cpu(bool *ret_both)
{
	cpu_set_t set;

	*ret_both = false;
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return -1;
	*ret_both = CPU_ISSET(0, &set) && CPU_ISSET(1, &set);
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set))
			return i;
	return -1;
}

static int check_sums(const char *row, uint64_t got, uint64_t want)
{
	return bench_check_sum("bench-lookup", row, got, want);
}

/* Random addresses inside buffer `only` (or inside any of the buffers when only < 0). */
static void top_addrs(const struct bench *b, int only, uintptr_t *addrs, uint64_t *ret_want)
{
	uint64_t s = 0x9e3779b97f4a7c15ull + (uint64_t)(only + 1), want = 0;

	for (size_t i = 0; i < TOP_ADDRS; i++) {
		unsigned k = only >= 0 ? (unsigned)only : (unsigned)(bench_rng_next(&s) % N_BUFS);

		addrs[i] = (uintptr_t)b->m.buf[k] + bench_rng_next(&s) % BUF_SIZE;
		want += b->m.mr[k].lkey;
	}
	/* The loops run ops lookups over the array ops / TOP_ADDRS times. */
	*ret_want = want * (TOP_OPS / TOP_ADDRS);
}

static int bench_top(struct bench *b)
{
	_cleanup_free_ uintptr_t *addrs = malloc(TOP_ADDRS * sizeof(*addrs));
	struct flat_entry one;
	uint64_t want, got;
	int r;

	if (!addrs)
		return -ENOMEM;
	_Static_assert(TOP_OPS % TOP_ADDRS == 0, "whole passes over the addresses");

	/* Row 1: buffer 3 is the MRU entry (its last lookup went through the top half). */
	if (mrd_cache_lkey(b->m.l, b->m.buf[3]) != b->m.mr[3].lkey)
		return -EBADMSG;
	one = (struct flat_entry){ b->m.mr[3].start, b->m.mr[3].end, b->m.mr[3].lkey };
	top_addrs(b, 3, addrs, &want);
	r = check_sums("top-mru", loop_lkey(b->m.l, addrs, TOP_OPS), want); /* warm-up */
	if (r >= 0)
		r = check_sums("top-mru baseline", loop_one_entry(&one, addrs, TOP_OPS), want);
	for (int rep = 0; rep < NS_REPS && r >= 0; rep++)
		/* Alternate which runs first, so neither always follows the other. */
		for (int j = 0; j < 2 && r >= 0; j++) {
			uint64_t t0 = bench_now_ns();

			if ((rep + j) % 2 == 0) {
				got = loop_lkey(b->m.l, addrs, TOP_OPS);
				b->top_mru.ns_case[rep] = (double)(bench_now_ns() - t0) / TOP_OPS;
			} else {
				got = loop_one_entry(&one, addrs, TOP_OPS);
				b->top_mru.ns_base[rep] = (double)(bench_now_ns() - t0) / TOP_OPS;
			}
			r = check_sums("top-mru", got, want);
		}
	if (r < 0)
		return r;

	/* Row 2: all 8 buffers, at random. */
	top_addrs(b, -1, addrs, &want);
	r = check_sums("top-random8", loop_lkey(b->m.l, addrs, TOP_OPS), want);
	if (r >= 0)
		r = check_sums("top-random8 baseline", loop_scan8(b->m.mr, addrs, TOP_OPS), want);
	for (int rep = 0; rep < NS_REPS && r >= 0; rep++)
		for (int j = 0; j < 2 && r >= 0; j++) {
			uint64_t t0 = bench_now_ns();

			if ((rep + j) % 2 == 0) {
				got = loop_lkey(b->m.l, addrs, TOP_OPS);
				b->top_random.ns_case[rep] = (double)(bench_now_ns() - t0) / TOP_OPS;
			} else {
				got = loop_scan8(b->m.mr, addrs, TOP_OPS);
				b->top_random.ns_base[rep] = (double)(bench_now_ns() - t0) / TOP_OPS;
			}
			r = check_sums("top-random8", got, want);
		}
	return r;
}

/* The range row: random addresses over the 8 buffers, each with a random length that stays
 * inside its buffer (so inside its MR: a hit), looked up with mrd_cache_keys_range against
 * mrd_cache_keys of the same addresses, alternated. */
static int bench_range(struct bench *b)
{
	_cleanup_free_ uintptr_t *addrs = malloc(TOP_ADDRS * sizeof(*addrs));
	_cleanup_free_ size_t *lens = malloc(TOP_ADDRS * sizeof(*lens));
	uint64_t s = 0x5851f42d4c957f2dull, want = 0, got;
	int r;

	if (!addrs || !lens)
		return -ENOMEM;
	for (size_t i = 0; i < TOP_ADDRS; i++) {
		unsigned k = (unsigned)(bench_rng_next(&s) % N_BUFS);
		size_t off = bench_rng_next(&s) % BUF_SIZE;

		addrs[i] = (uintptr_t)b->m.buf[k] + off;
		lens[i] = 1 + bench_rng_next(&s) % (BUF_SIZE - off);
		want += b->m.mr[k].lkey;
	}
	want *= TOP_OPS / TOP_ADDRS;
	r = check_sums("lookup-range-hit", loop_keys_range(b->m.l, addrs, lens, TOP_OPS), want);
	if (r >= 0)
		r = check_sums("lookup-range-hit baseline", loop_keys(b->m.l, addrs, TOP_OPS), want);
	for (int rep = 0; rep < NS_REPS && r >= 0; rep++)
		for (int j = 0; j < 2 && r >= 0; j++) {
			uint64_t t0 = bench_now_ns();

			if ((rep + j) % 2 == 0) {
				got = loop_keys_range(b->m.l, addrs, lens, TOP_OPS);
				b->range_hit.ns_case[rep] = (double)(bench_now_ns() - t0) / TOP_OPS;
			} else {
				got = loop_keys(b->m.l, addrs, TOP_OPS);
				b->range_hit.ns_base[rep] = (double)(bench_now_ns() - t0) / TOP_OPS;
			}
			r = check_sums("lookup-range-hit", got, want);
		}
	return r;
}

/* n synthetic entries, inserted in order (so each insert appends), and random addresses that
 * hit them; crowded: one more entry far away, never looked up. */
static int bottom_build(struct mr_table *t, size_t n, bool crowded, uint64_t *addrs,
			uint64_t *ret_want)
{
	uint64_t s = 0x2545f4914f6cdd1dull + n, want = 0;
	int r = mr_table_init(t, n + 2, 0);

	if (crowded && r >= 0) {
		struct mr_entry far = { BOTTOM_BASE + CROWDING_ENTRY,
					BOTTOM_BASE + CROWDING_ENTRY + BOTTOM_LEN, 1, 1 };

		r = mr_table_insert(t, &far);
	}
	for (size_t i = 0; i < n && r >= 0; i++) {
		struct mr_entry e = { BOTTOM_BASE + i * BOTTOM_STRIDE,
				      BOTTOM_BASE + i * BOTTOM_STRIDE + BOTTOM_LEN,
				      (uint32_t)(i * 2654435761u) >> 1, (uint32_t)i };

		r = mr_table_insert(t, &e);
	}
	if (r < 0)
		return r;
	for (size_t i = 0; i < BOTTOM_ADDRS; i++) {
		size_t k = bench_rng_next(&s) % n;

		addrs[i] = BOTTOM_BASE + k * BOTTOM_STRIDE + bench_rng_next(&s) % BOTTOM_LEN;
		want += t->e[k + 1].lkey;
	}
	*ret_want = want * (BOTTOM_OPS / BOTTOM_ADDRS);
	return 0;
}

static int bench_bottom(struct bench *b)
{
	_cleanup_free_ uint64_t *addrs = malloc(BOTTOM_ADDRS * sizeof(*addrs));
	int r = 0;

	if (!addrs)
		return -ENOMEM;
	_Static_assert(BOTTOM_OPS % BOTTOM_ADDRS == 0, "whole passes over the addresses");
	for (size_t i = 0; i < N_BOTTOM && r >= 0; i++) {
		struct mr_table t;
		char row[32];
		uint64_t want, got;

		snprintf(row, sizeof(row), "bottom-%zu%s", bottom_cases[i].n,
			 bottom_cases[i].crowded ? "-crowded" : "");
		r = bottom_build(&t, bottom_cases[i].n, bottom_cases[i].crowded, addrs, &want);
		if (r < 0) {
			mr_table_done(&t);
			return r;
		}
		r = check_sums(row, loop_table(&t, addrs, BOTTOM_OPS), want);
		if (r >= 0)
			r = check_sums(row, loop_bsearch(&t, addrs, BOTTOM_OPS), want);
		for (int rep = 0; rep < NS_REPS && r >= 0; rep++)
			for (int j = 0; j < 2 && r >= 0; j++) {
				uint64_t t0 = bench_now_ns();

				if ((rep + j) % 2 == 0) {
					got = loop_table(&t, addrs, BOTTOM_OPS);
					b->bottom[i].ns_case[rep] =
						(double)(bench_now_ns() - t0) / BOTTOM_OPS;
				} else {
					got = loop_bsearch(&t, addrs, BOTTOM_OPS);
					b->bottom[i].ns_base[rep] =
						(double)(bench_now_ns() - t0) / BOTTOM_OPS;
				}
				r = check_sums(row, got, want);
			}
		mr_table_done(&t);
	}
	return r;
}

/* The table rows' baseline: a sorted array of entries (slot 0 a sentinel, as the table's),
 * grown by doubling, with nothing in front of the search. */
struct flat_table {
	struct mr_entry *e;
	size_t n, cap;
};

static TIMED size_t flat_floor(const struct flat_table *f, uint64_t addr)
{
	size_t lo = 0, n = f->n;

	while (n > 1) {
		size_t half = n / 2;

		lo = f->e[lo + half].start <= addr ? lo + half : lo;
		n -= half;
	}
	return lo;
}

static TIMED int flat_insert(struct flat_table *f, const struct mr_entry *entry)
{
	size_t at;

	if (f->n == f->cap) {
		struct mr_entry *e = realloc(f->e, 2 * f->cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		f->e = e;
		f->cap *= 2;
	}
	at = flat_floor(f, entry->start);
	if (at > 0 && f->e[at].start == entry->start)
		return -EEXIST;
	at++;
	memmove(&f->e[at + 1], &f->e[at], (f->n - at) * sizeof(*f->e));
	f->e[at] = *entry;
	f->n++;
	return 0;
}

static TIMED int flat_remove(struct flat_table *f, uint64_t start)
{
	size_t at = flat_floor(f, start);

	if (at == 0 || f->e[at].start != start)
		return -ENOENT;
	memmove(&f->e[at], &f->e[at + 1], (f->n - at - 1) * sizeof(*f->e));
	f->n--;
	return 0;
}

/* One rep of either row, of case (the table) or baseline: TABLE_N inserts in ins's order, then
 * TABLE_N removes in rm's; ns per call of each. Both end empty, and check it. */
static int table_rep(bool table, const struct mr_entry *ins, const struct mr_entry *rm,
		     double *ret_ins, double *ret_rm)
{
	struct flat_table f = { .n = 1, .cap = 2 };
	struct mr_table t;
	uint64_t t0;
	size_t left;
	int r = 0;

	if (table ? mr_table_init(&t, 2, 0) < 0 : !(f.e = calloc(f.cap, sizeof(*f.e))))
		return -ENOMEM;
	t0 = bench_now_ns();
	for (size_t i = 0; i < TABLE_N && r >= 0; i++)
		r = table ? mr_table_insert(&t, &ins[i]) : flat_insert(&f, &ins[i]);
	*ret_ins = (double)(bench_now_ns() - t0) / TABLE_N;
	t0 = bench_now_ns();
	for (size_t i = 0; i < TABLE_N && r >= 0; i++)
		r = table ? mr_table_remove(&t, rm[i].start) : flat_remove(&f, rm[i].start);
	*ret_rm = (double)(bench_now_ns() - t0) / TABLE_N;
	left = table ? t.n : f.n;
	if (table)
		mr_table_done(&t);
	free(f.e);
	if (r >= 0 && left != 1) {
		fprintf(stderr, "bench-lookup: table rows: %zu entries left\n", left - 1);
		return -EIO;
	}
	return r;
}

/* The bottom rows' entries, shuffled twice (Fisher-Yates, fixed seed). */
static int bench_table(struct bench *b)
{
	_cleanup_free_ struct mr_entry *ins = malloc(TABLE_N * sizeof(*ins));
	_cleanup_free_ struct mr_entry *rm = malloc(TABLE_N * sizeof(*rm));
	uint64_t s = 0x9e3779b97f4a7c15ull;
	int r = 0;

	if (!ins || !rm)
		return -ENOMEM;
	for (size_t i = 0; i < TABLE_N; i++)
		ins[i] = (struct mr_entry){ BOTTOM_BASE + i * BOTTOM_STRIDE,
					    BOTTOM_BASE + i * BOTTOM_STRIDE + BOTTOM_LEN,
					    (uint32_t)i, (uint32_t)i };
	for (size_t i = TABLE_N - 1; i > 0; i--) {
		size_t j = bench_rng_next(&s) % (i + 1);
		struct mr_entry x = ins[i];

		ins[i] = ins[j];
		ins[j] = x;
	}
	memcpy(rm, ins, TABLE_N * sizeof(*rm));
	for (size_t i = TABLE_N - 1; i > 0; i--) {
		size_t j = bench_rng_next(&s) % (i + 1);
		struct mr_entry x = rm[i];

		rm[i] = rm[j];
		rm[j] = x;
	}
	for (int rep = 0; rep < TABLE_REPS && r >= 0; rep++)
		for (int j = 0; j < 2 && r >= 0; j++) {
			if ((rep + j) % 2 == 0)
				r = table_rep(true, ins, rm, &b->table_ins[rep], &b->table_rm[rep]);
			else
				r = table_rep(false, ins, rm, &b->table_ins_base[rep],
					      &b->table_rm_base[rep]);
		}
	return r;
}

/* The MrLookup frame libmrd sends for buffer 0, packed once; its reply's size is what the echoes
 * answer. The raw connection is of the same uid, so of the same domain: mrd answers it from the
 * same cache. */
static int probe_lookup(struct bench *b, int fd)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;
	uint64_t address = (uintptr_t)b->m.buf[0];
	Mrd__Response *resp = NULL;
	int r;

	q.addresses = &address;
	q.n_addresses = 1;
	req.id = LOOKUP_ID;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	r = bench_probe(fd, &req, b->req, sizeof(b->req), &b->req_len, &b->reply_len, &resp);
	if (r < 0)
		return r;
	if (resp->id != LOOKUP_ID || resp->body_case != MRD__RESPONSE__BODY_MR_LOOKUP ||
	    resp->mr_lookup->n_entries != 1 || resp->mr_lookup->entries[0]->lkey != b->m.mr[0].lkey)
		r = -EBADMSG;
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

/* One timed mrd_keys_query() per sample, of an address mrd has the MR of; lat may be NULL
 * (warm-up). */
static int lat_libmrd(const struct bench *b, uint64_t *lat, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct mrd_keys mr;
		uint64_t t0 = bench_now_ns();
		int r = mrd_keys_query(b->m.client, b->m.buf[0], &mr);
		uint64_t t1 = bench_now_ns();

		if (r < 0)
			return r;
		if (mr.lkey != b->m.mr[0].lkey)
			return -EBADMSG;
		if (lat)
			lat[i] = t1 - t0;
	}
	return 0;
}

static int lat_run(const struct bench *b, enum lat_case k, uint64_t *lat, size_t n)
{
	if (k == LAT_LIBMRD)
		return lat_libmrd(b, lat, n);
	return bench_lat_frame(b->fd[k], b->req, b->req_len, b->reply_len, false, lat, n);
}

static int bench_miss(struct bench *b)
{
	_cleanup_free_ uint64_t *lat = malloc(LAT_N * sizeof(*lat));
	int r = 0;

	if (!lat)
		return -ENOMEM;
	/* Client on CPU 0 and every server on CPU 1, as bench-roundtrip's "split" placement: a
	 * daemon on its own core. Otherwise the scheduler places everything. */
	if (b->pinned2) {
		r = bench_pin(0, 0);
		if (r >= 0)
			r = bench_pin(b->m.mrd.pid, 1);
		if (r >= 0)
			r = bench_pin(b->echo.pid, 1);
		if (r >= 0)
			r = bench_pin(b->epoll.pid, 1);
	} else
		r = bench_pin(0, -1);
	for (int k = 0; k < N_LAT && r >= 0; k++)
		r = lat_run(b, (enum lat_case)k, NULL, WARMUP);
	/* Rotate the order every rep so no case always runs first or last. */
	for (int rep = 0; rep < LAT_REPS && r >= 0; rep++)
		for (int j = 0; j < N_LAT && r >= 0; j++) {
			enum lat_case k = (enum lat_case)((rep + j) % N_LAT);

			r = lat_run(b, k, lat, LAT_N);
			if (r < 0) {
				fprintf(stderr, "bench-lookup: %s: %s\n", lat_names[k], strerror(-r));
				break;
			}
			b->p50[k][rep] = bench_quantile(lat, LAT_N, 0.50);
			b->p99[k][rep] = bench_quantile(lat, LAT_N, 0.99);
		}
	return r;
}

/*
 * The head-of-line rows. An actor does one 1 GiB action per loaded phase, each row its own
 * (hol_specs[]: register, free, ODP-fault, write-prefetch): client A, a child process with its
 * own connection, or in the own-handle row a thread of B's on B's handle. B, this process,
 * times mrd_keys_query() of a small buffer whose MR mrd has cached, back to back. The actor
 * moves a counter through four states per action, and waits for B to finish a sample begun
 * in the state before it moves on:
 *   4i+1  ready: what the action needs is done (allocated; registered, for a free), so no
 *         sample begun now waits on it
 *   4i+2  the action's timed request(s) in flight
 *   4i+3  returned: B's samples begun before are over before the actor cleans up (a free
 *         unpins and punches 1 GiB on mrd's loop, which only the free row counts)
 *   4i+4  cleaned up
 * A sample of B counts when it overlaps the timed request: begun in 4i+1 or 4i+2 and over in
 * 4i+2 or 4i+3. So a round trip that waits behind the actor's request is counted even when it
 * was sent just before it.
 */
enum { HOL_READY = 1, HOL_IN_FLIGHT = 2, HOL_RETURNED = 3, HOL_DONE = 0 };

static uint32_t load_u32(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void store_u32(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* The actor's side of one action. */
struct hol_actor {
	mrd_client *c;
	mrd_client *c2; /* client A's second connection (hol_side); NULL on B's thread */
	struct hol_shared *sh;
	bool acks;    /* B samples meanwhile: wait for it at each state (B quiet: for nobody) */
	uint32_t seq; /* sh->seq when the action began (only the actor writes it) */
	uint64_t t0;
};

/* A state change; with acks it waits (yielding, 10 s at most) until B finished a sample begun
 * in it, but for HOL_IN_FLIGHT, whose request follows at once. B samples back to back all
 * through a loaded phase, so this is one round trip. */
static void hol_enter(struct hol_actor *a, uint32_t state)
{
	uint64_t t0 = bench_now_ns();

	store_u32(&a->sh->seq, a->seq + state);
	while (a->acks && state != HOL_IN_FLIGHT && load_u32(&a->sh->ack) != a->seq + state &&
	       bench_now_ns() - t0 < 10000000000ull)
		sched_yield();
}

/* Between them the action's timed request(s), timed into sh->op_ns. */
static void hol_begin(struct hol_actor *a)
{
	hol_enter(a, HOL_READY);
	hol_enter(a, HOL_IN_FLIGHT);
	a->t0 = bench_now_ns();
}

static void hol_end(struct hol_actor *a)
{
	uint64_t t1 = bench_now_ns();

	hol_enter(a, HOL_RETURNED);
	a->sh->op_ns = t1 - a->t0;
}

static bool covers(const struct mrd_keys *mr, const void *p, size_t length)
{
	return mr->start <= (uintptr_t)p && mr->end >= (uintptr_t)p + length;
}

typedef int hol_act_fn(struct hol_actor *a);

/* Registers 1 GiB: its first lookup pins it all (on a worker from [cache] async_bytes on). */
static int hol_act_register(struct hol_actor *a)
{
	struct mrd_keys mr;
	void *p = NULL;
	int r, r2;

	r = mrd_mem_alloc(a->c, HOL_BYTES, 0, 0, &p);
	if (r < 0)
		return r;
	hol_begin(a);
	r = mrd_keys_query(a->c, p, &mr);
	hol_end(a);
	if (r >= 0 && !covers(&mr, p, HOL_BYTES))
		r = -EBADMSG; /* contig: one MR over the whole allocation */
	r2 = mrd_mem_free(a->c, p);
	return r < 0 ? r : r2;
}

/* Frees a registered 1 GiB: its MR goes (on a worker from async_bytes on), then its pages go
 * back to the kernel, and the Free answers. */
static int hol_act_free(struct hol_actor *a)
{
	struct mrd_keys mr;
	void *p = NULL;
	int r;

	r = mrd_mem_alloc(a->c, HOL_BYTES, 0, 0, &p);
	if (r < 0)
		return r;
	r = mrd_keys_query(a->c, p, &mr);
	if (r >= 0 && !covers(&mr, p, HOL_BYTES))
		r = -EBADMSG;
	if (r < 0) {
		(void)mrd_mem_free(a->c, p);
		return r;
	}
	hol_begin(a);
	r = mrd_mem_free(a->c, p);
	hol_end(a);
	return r;
}

/* A request of client A's on its second connection, on a thread: A's next request, on its
 * first, is not queued behind it on the same handle. The ODP-fault and prefetch rows: the
 * device work of one (a fault, an advise) holds the domain's provider lock while mrd's loop
 * makes a child for the other. */
struct hol_side {
	mrd_client *c;
	int (*call)(struct hol_side *s);
	const void *addr, *src; /* src: the write's, from */
	size_t length;
	uint32_t lkey, rkey;
	int result;
	pthread_t thread;
	bool running;
};

static void *hol_side_run(void *arg)
{
	struct hol_side *s = arg;

	s->result = s->call(s);
	return NULL;
}

/* Returns once the request is in the provider, as far as sleeping HOL_LEAD_US tells: else
 * mrd would often have made A's next child before its worker took the lock. */
static int hol_side_start(struct hol_side *s)
{
	int r = -pthread_create(&s->thread, NULL, hol_side_run, s);

	s->running = r >= 0;
	if (s->running)
		usleep(HOL_LEAD_US);
	return r;
}

static int hol_side_wait(struct hol_side *s)
{
	if (!s->running)
		return 0;
	pthread_join(s->thread, NULL);
	s->running = false;
	return s->result;
}

static int side_write(struct hol_side *s)
{
	return mrd_dma(s->c, MRD_DMA_WRITE, s->lkey, s->src, s->rkey, s->addr, s->length);
}

static int side_prefetch(struct hol_side *s)
{
	return mrd_prefetch(s->c, s->addr, s->length, MRD_PREFETCH_WRITE, MRD_PREFETCH_FLUSH);
}

/* ODP-faults 1 GiB of on-demand memory, as a device writing into it would, a chunk ([cache]
 * odp_chunk, the row's 64 MiB) at a time: A's lookup of each chunk misses, which makes its
 * child (on a worker while a Dma is under way), and then an emulated RDMA write from a pinned
 * buffer fills it (mrd's Dma thread: the soft provider faults every page in, then copies, both
 * without the domain's provider lock). A looks the next chunk up while the previous one is
 * being written, as an application hands the device its next buffer. */
static int hol_act_odp_fault(struct hol_actor *a)
{
	struct hol_side w = { .c = a->c2, .call = side_write };
	struct mrd_keys src_mr, mr;
	void *src = NULL, *p = NULL;
	size_t n;
	int r, r2;

	if (!a->c2)
		return -ENOTCONN;
	r = mrd_mem_alloc(a->c, MRD_DMA_MAX, 0, 0, &src);
	if (r >= 0)
		r = mrd_keys_query(a->c, src, &src_mr); /* pinned: the source side faults nothing */
	if (r >= 0)
		r = mrd_mem_alloc(a->c, HOL_BYTES, 0, MRD_MEM_ODP, &p);
	if (r < 0)
		goto out;
	hol_begin(a);
	for (size_t off = 0; off < HOL_BYTES && r >= 0; off += n) {
		uintptr_t at = (uintptr_t)p + off;

		r = mrd_keys_query(a->c, (void *)at, &mr); /* a miss: this chunk's child */
		if (r >= 0 && !covers(&mr, (void *)at, 1))
			r = -EBADMSG;
		n = r >= 0 ? mr.end - at : 0;
		if (n > HOL_BYTES - off)
			n = HOL_BYTES - off;
		if (n > MRD_DMA_MAX)
			n = MRD_DMA_MAX;
		r2 = hol_side_wait(&w); /* the chunk before */
		r = r < 0 ? r : r2;
		if (r < 0)
			break;
		w.lkey = src_mr.lkey;
		w.rkey = mr.rkey;
		w.src = src;
		w.addr = (void *)at;
		w.length = n;
		r = hol_side_start(&w);
	}
	r2 = hol_side_wait(&w);
	r = r < 0 ? r : r2;
	hol_end(a);
out:
	r2 = p ? mrd_mem_free(a->c, p) : 0;
	if (src && mrd_mem_free(a->c, src) < 0 && r2 >= 0)
		r2 = -EIO;
	return r < 0 ? r : r2;
}

/* Write-prefetches 1 GiB of on-demand memory and waits for it (MRD_PREFETCH_FLUSH): on a
 * worker, mrd makes the children and the provider faults every page in (soft: under the
 * domain's provider lock, held across the whole advise). Meanwhile A's lookup of other
 * on-demand memory misses, which makes its child on mrd's loop. */
static int hol_act_prefetch(struct hol_actor *a)
{
	struct hol_side pf = { .c = a->c2, .call = side_prefetch, .length = HOL_BYTES };
	struct mrd_keys mr;
	void *p = NULL, *q = NULL;
	int r, r2;

	if (!a->c2)
		return -ENOTCONN;
	r = mrd_mem_alloc(a->c, HOL_BYTES, 0, MRD_MEM_ODP, &p);
	if (r >= 0)
		r = mrd_mem_alloc(a->c, BUF_SIZE, 0, MRD_MEM_ODP, &q);
	if (r < 0)
		goto out;
	pf.addr = p;
	hol_begin(a);
	r = hol_side_start(&pf);
	if (r >= 0)
		r = mrd_keys_query(a->c, q, &mr); /* a miss: q's child */
	r2 = hol_side_wait(&pf);
	hol_end(a);
	r = r < 0 ? r : r2;
out:
	r2 = p ? mrd_mem_free(a->c, p) : 0;
	if (q && mrd_mem_free(a->c, q) < 0 && r2 >= 0)
		r2 = -EIO;
	return r < 0 ? r : r2;
}

/* 4 KiB pages on any host; the quotas hold the actor's 1 GiB (and the ODP-fault row's 64 MiB
 * source buffer). The default async_bytes (1M) puts 1 GiB of registration on a worker. */
#define HOL_CONFIG "[memory]\nhugepages = no\n[quota]\nallocated_bytes = 4G\npinned_bytes = 4G\n"

/* The rows, in the order they run: each its own mrd. */
static const struct hol_spec {
	const char *name;  /* the row's, and its summary line's */
	const char *does;  /* who does what, in the row's line */
	const char *who;   /* the actor, idle in the baseline */
	const char *timed; /* what the actor times, in the raw figures */
	const char *config;
	hol_act_fn *act;
	int reps;
	bool own_handle;   /* the actor is a thread of B on B's handle, not a process */
	const char *tag;   /* NULL: the row has PERF.md's target; else why it is printed */
} hol_specs[] = {
	{ "lookup-hol", "client A (another process) registers 1 GiB ([cache] async_bytes = 1M: "
	  "on a worker)", "A", "mrd_keys_query (pin)", HOL_CONFIG, hol_act_register, HOL_REPS,
	  false, NULL },
	/* 2G keeps A's registration on the loop, as before the worker pool. */
	{ "lookup-hol-inline", "client A (another process) registers 1 GiB ([cache] async_bytes "
	  "= 2G: on mrd's loop, as without workers)", "A", "mrd_keys_query (pin)",
	  HOL_CONFIG "[cache]\nasync_bytes = 2G\n", hol_act_register, HOL_INLINE_REPS, false,
	  "what the worker pool avoids" },
	{ "lookup-hol-free", "client A (another process) frees a registered 1 GiB allocation",
	  "A", "mrd_mem_free", HOL_CONFIG, hol_act_free, HOL_NEW_REPS, false, NULL },
	{ "lookup-hol-odp-fault", "client A (another process) ODP-faults 1 GiB of MRD_MEM_ODP "
	  "memory ([cache] odp_chunk = 64M): per chunk a lookup miss makes its child (on a worker: "
	  "a Dma is under way) while A's emulated RDMA write into the chunk before faults its "
	  "pages in (mrd's Dma thread, outside the provider lock)", "A", "16 x (lookup + mrd_dma)",
	  HOL_CONFIG "[cache]\nodp_chunk = 64M\n", hol_act_odp_fault, HOL_NEW_REPS, false, NULL },
	{ "lookup-hol-prefetch", "client A (another process) write-prefetches 1 GiB of "
	  "MRD_MEM_ODP memory with MRD_PREFETCH_FLUSH (on a worker, outside the provider lock) "
	  "while its lookup of other MRD_MEM_ODP memory misses (the child made on mrd's loop)",
	  "A", "mrd_prefetch (write, flush) beside a lookup",
	  HOL_CONFIG, hol_act_prefetch, HOL_NEW_REPS, false, NULL },
	{ "lookup-hol-own-handle", "another thread of B, on B's own mrd_client, makes the first "
	  "lookup of a 1 GiB allocation (mrd pins it, on a worker)", "that thread",
	  "mrd_keys_query (pin)", HOL_CONFIG, hol_act_register, HOL_NEW_REPS, true, NULL },
};
_Static_assert(ELEMENTSOF(hol_specs) == N_HOL, "a row per spec");

/* The actor: one action per byte read from cmd_fd ('a': B is quiet), until EOF; r: how its
 * connection went. It blocks in read() between actions, so it takes no CPU while B measures
 * the idle baseline. */
static void hol_actor_loop(mrd_client *c, mrd_client *c2, int r, int cmd_fd,
			   struct hol_shared *sh, hol_act_fn *act)
{
	struct hol_actor a = { .c = c, .c2 = c2, .sh = sh };

	sh->tid = (pid_t)syscall(SYS_gettid);
	for (;;) {
		char cmd;
		ssize_t n;

		if (r < 0 && !sh->error) {
			fprintf(stderr, "bench-lookup: head-of-line actor: %s (%s)\n", strerror(-r),
				mrd_last_error());
			sh->error = r;
		}
		__atomic_add_fetch(&sh->done, 1, __ATOMIC_RELEASE);
		do
			n = read(cmd_fd, &cmd, 1);
		while (n < 0 && errno == EINTR);
		if (n != 1)
			break;
		a.acks = cmd != 'a';
		a.seq = sh->seq;
		r = act(&a);
		store_u32(&sh->seq, a.seq + 4);
	}
}

/* Client A: a process of its own, with its own connection. */
static _Noreturn void hol_client_a(const char *socket, int cmd_fd, struct hol_shared *sh,
				   hol_act_fn *act)
{
	mrd_client *c = NULL, *c2 = NULL;
	int r;

	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
	r = mrd_client_connect(socket, &c);
	if (r >= 0)
		r = mrd_client_connect(socket, &c2);
	hol_actor_loop(c, c2, r, cmd_fd, sh, act);
	mrd_client_close(c2);
	mrd_client_close(c);
	_exit(EXIT_SUCCESS);
}

/* A second (or later) mrd, the actor and B's connection to it. */
struct hol_run {
	const struct hol_spec *spec;
	struct mrd_proc mrd;
	struct hol_shared *sh;
	pid_t a_pid;        /* client A */
	pthread_t a_thread; /* or the own-handle row's thread */
	bool thread_started;
	int cmd_fd;         /* to the actor */
	int cmd_rd;         /* the thread's end */
	uint32_t cmds;      /* the actor's commands so far, the start included */
	mrd_client *client;
	void *buf;
	struct mrd_keys mr; /* what mrd answered for buf */
	uint64_t pace_ns;   /* B's idle round trip (p50 of the warm-up) */
};

static void *hol_thread_a(void *arg)
{
	struct hol_run *h = arg;

	hol_actor_loop(h->client, NULL, 0, h->cmd_rd, h->sh, h->spec->act);
	return NULL;
}

static int hol_wait_done(struct hol_run *h)
{
	uint64_t t0 = bench_now_ns();

	while (load_u32(&h->sh->done) != h->cmds) {
		if (bench_now_ns() - t0 > HOL_TIMEOUT_NS)
			return -ETIMEDOUT;
		usleep(1000);
	}
	return h->sh->error;
}

static int hol_start(struct hol_run *h)
{
	static const char *const mrd_args[] = { "--log-level", "warning", NULL };
	int fds[2], r;

	h->sh = mmap(NULL, sizeof(*h->sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
		     0);
	if (h->sh == MAP_FAILED) {
		h->sh = NULL;
		return negative_errno();
	}
	r = mrd_proc_start(&h->mrd, h->spec->config, mrd_args);
	if (r < 0) {
		fprintf(stderr, "bench-lookup: cannot start mrd for %s: %s\n", h->spec->name,
			strerror(-r));
		return r;
	}
	if (pipe2(fds, O_CLOEXEC) < 0)
		return negative_errno();
	h->cmd_fd = fds[1];
	h->cmd_rd = fds[0];
	if (!h->spec->own_handle) {
		/* A forks before B connects: it must inherit no libmrd handle (nor its window). */
		fflush(NULL);
		h->a_pid = fork();
		if (h->a_pid < 0)
			return negative_errno();
		if (h->a_pid == 0) {
			close(fds[1]);
			hol_client_a(h->mrd.socket, fds[0], h->sh, h->spec->act);
		}
		h->cmd_rd = safe_close(h->cmd_rd);
		h->cmds = 1;
		r = hol_wait_done(h);
		if (r < 0)
			return r;
	}

	r = mrd_client_connect(h->mrd.socket, &h->client);
	if (r >= 0)
		r = mrd_mem_alloc(h->client, BUF_SIZE, 0, 0, &h->buf);
	if (r >= 0)
		r = mrd_keys_query(h->client, h->buf, &h->mr);
	if (r < 0) {
		fprintf(stderr, "bench-lookup: client B: %s\n", mrd_last_error());
		return r;
	}
	if (h->spec->own_handle) {
		r = -pthread_create(&h->a_thread, NULL, hol_thread_a, h);
		if (r < 0)
			return r;
		h->thread_started = true;
		h->cmds = 1;
		r = hol_wait_done(h);
	}
	return r;
}

static void hol_stop(struct hol_run *h)
{
	safe_close(h->cmd_fd); /* the actor ends at EOF */
	if (h->a_pid > 0)
		(void)waitpid(h->a_pid, NULL, 0);
	if (h->thread_started)
		pthread_join(h->a_thread, NULL);
	safe_close(h->cmd_rd);
	if (h->client && h->buf)
		(void)mrd_mem_free(h->client, h->buf);
	mrd_client_close(h->client);
	if (h->mrd.pid > 0)
		mrd_proc_stop(&h->mrd);
	if (h->sh)
		munmap(h->sh, sizeof(*h->sh));
}

/* The threads of mrd but its first (the loop): the workers. */
static int pin_workers(pid_t pid, int cpu)
{
	char path[64];
	struct dirent *de;
	DIR *d;
	int r = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return negative_errno();
	while (r >= 0 && (de = readdir(d))) {
		pid_t tid = (pid_t)atoi(de->d_name);

		if (tid > 0 && tid != pid)
			r = bench_pin(tid, cpu);
	}
	closedir(d);
	return r;
}

/* B, mrd's loop, and mrd's workers with the actor (which sleeps while they work) on a CPU
 * each. With 2 CPUs B and the loop share one: a round trip keeps only one of them running at
 * a time. Left to the scheduler, a worker pinning 1 GiB takes CPU time from the loop or from
 * B, which is not head-of-line blocking (on 2 CPUs it doubles B's p99), and in the idle phases
 * the same placement holds. Run again once the actor has acted: mrd starts its Dma thread on
 * the first Dma, on the loop's CPU. */
static int hol_place(struct hol_run *h, const char **ret_what)
{
	cpu_set_t set;
	int cpu[3], n = 0, r;

	*ret_what = "one CPU: B, mrd's loop and its workers share it";
	r = bench_pin(0, -1); /* placed before: the CPUs we may use, not the one B had */
	if (r < 0)
		return r;
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return negative_errno();
	for (int i = 0; i < CPU_SETSIZE && n < 3; i++)
		if (CPU_ISSET(i, &set))
			cpu[n++] = i;
	if (n < 2)
		return 0;
	if (n == 2) {
		cpu[2] = cpu[1];
		cpu[1] = cpu[0];
		*ret_what = "B and mrd's loop on one CPU, mrd's workers (its Dma thread too) and the "
			    "actor on the other";
	} else
		*ret_what = "B, mrd's loop, and mrd's workers (its Dma thread too) with the actor on "
			    "a CPU each";
	r = bench_pin(0, cpu[0]);
	if (r >= 0)
		r = bench_pin(h->mrd.pid, cpu[1]);
	if (r >= 0)
		r = pin_workers(h->mrd.pid, cpu[2]);
	if (r >= 0)
		r = bench_pin(h->spec->own_handle ? h->sh->tid : h->a_pid, cpu[2]);
	return r;
}

static int hol_sample(const struct hol_run *h, uint64_t *ret_ns)
{
	struct mrd_keys mr;
	uint64_t t0 = bench_now_ns();
	int r = mrd_keys_query(h->client, h->buf, &mr);

	*ret_ns = bench_now_ns() - t0;
	if (r < 0)
		return r;
	return mr.lkey == h->mr.lkey ? 0 : -EBADMSG;
}

/* B samples back to back (a closed loop), so a stall of T ns leaves one sample where a
 * client sending at B's idle pace would have sent T / pace: left so, the p99 of a loaded phase
 * hides a stall of the loop among thousands of fast round trips (coordinated omission). As
 * HdrHistogram's expected-interval correction: a sample of T stands for T, T - pace,
 * T - 2 pace, ... down to pace, into held[]; its *n stops at HOL_CAP. */
static void hol_held(const struct hol_run *h, uint64_t ns, uint64_t *held, size_t *n)
{
	held[(*n)++] = ns;
	for (uint64_t t = ns; t >= 2 * h->pace_ns && *n < HOL_CAP; t -= h->pace_ns)
		held[(*n)++] = t - h->pace_ns;
}

/* B alone, n samples into lat, and with what they held back into held (NULL: the warm-up,
 * which measures the pace), as in a loaded phase, so that the baseline counts a stall of B or
 * of the loop by anything else (the scheduler) the same way. */
static int hol_idle(const struct hol_run *h, uint64_t *lat, size_t n, uint64_t *held,
		    size_t *ret_held)
{
	size_t n_held = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t ns;
		int r = hol_sample(h, &ns);

		if (r < 0)
			return r;
		lat[i] = ns;
		if (held)
			hol_held(h, ns, held, &n_held);
	}
	if (ret_held)
		*ret_held = n_held;
	return n_held == HOL_CAP ? -E2BIG : 0;
}

/* The actor's action with B quiet: B sleeps until it is done. */
static int hol_alone(struct hol_run *h)
{
	if (write(h->cmd_fd, "a", 1) != 1)
		return negative_errno();
	h->cmds++;
	return hol_wait_done(h);
}

/* B for as long as the actor takes over one action; *ret_n gets the samples that overlapped
 * its timed request (they are lat[0..n)), capped at HOL_CAP, and *ret_held those with what
 * they held back (held[], hol_held()). */
static int hol_loaded(struct hol_run *h, uint64_t *lat, size_t *ret_n, uint64_t *held,
		      size_t *ret_held)
{
	uint64_t t_start = bench_now_ns();
	size_t n = 0, n_held = 0;

	if (write(h->cmd_fd, "r", 1) != 1)
		return negative_errno();
	h->cmds++;
	while (load_u32(&h->sh->done) != h->cmds) {
		uint32_t s0 = load_u32(&h->sh->seq), s1;
		uint64_t ns;
		int r = hol_sample(h, &ns);

		s1 = load_u32(&h->sh->seq);
		store_u32(&h->sh->ack, s0);
		if (r < 0)
			return r;
		if ((s0 % 4 == HOL_READY || s0 % 4 == HOL_IN_FLIGHT) &&
		    (s1 % 4 == HOL_IN_FLIGHT || s1 % 4 == HOL_RETURNED) && n < HOL_CAP) {
			lat[n++] = ns;
			hol_held(h, ns, held, &n_held);
		}
		if (bench_now_ns() - t_start > HOL_TIMEOUT_NS)
			return -ETIMEDOUT;
	}
	*ret_n = n;
	*ret_held = n_held;
	return n_held == HOL_CAP ? -E2BIG : h->sh->error ? h->sh->error : n > 0 ? 0 : -ENODATA;
}

/* One row, its own mrd: idle and loaded phases interleaved, the order swapped every rep. */
static int bench_hol_one(struct hol_row *row, const struct hol_spec *spec,
			 const char **ret_placement)
{
	_cleanup_free_ uint64_t *lat = malloc(HOL_CAP * sizeof(*lat));
	_cleanup_free_ uint64_t *held = malloc(HOL_CAP * sizeof(*held));
	struct hol_run h = { .spec = spec, .cmd_fd = -1, .cmd_rd = -1 };
	size_t n, n_held;
	int r;

	if (!lat || !held)
		return -ENOMEM;
	row->reps = spec->reps;
	/* mrd, its workers and the actor start unpinned; hol_place() places them. */
	r = bench_pin(0, -1);
	if (r >= 0)
		r = hol_start(&h);
	if (r >= 0)
		r = hol_place(&h, ret_placement);
	/* Warm-up, and the actor's first allocation makes its arena, which mrd then keeps. */
	if (r >= 0)
		r = hol_idle(&h, lat, WARMUP, NULL, NULL);
	h.pace_ns = bench_quantile(lat, WARMUP, 0.50);
	if (r >= 0)
		r = hol_loaded(&h, lat, &n, held, &n_held);
	if (r >= 0)
		r = hol_place(&h, ret_placement);
	for (int rep = 0; rep < row->reps && r >= 0; rep++)
		for (int j = 0; j < 2 && r >= 0; j++)
			if ((rep + j) % 2 == 0) {
				r = hol_idle(&h, lat, HOL_IDLE_N, held, &n_held);
				if (r < 0)
					break;
				row->idle50[rep] = bench_quantile(held, n_held, 0.50);
				row->idle99[rep] = bench_quantile(held, n_held, 0.99);
				row->idle99_own[rep] = bench_quantile(lat, HOL_IDLE_N, 0.99);
			} else {
				r = hol_loaded(&h, lat, &n, held, &n_held);
				if (r < 0)
					break;
				row->load_n[rep] = n;
				row->op_ms[rep] = (double)h.sh->op_ns / 1e6;
				row->load50[rep] = bench_quantile(held, n_held, 0.50);
				row->load99[rep] = bench_quantile(held, n_held, 0.99);
				row->load99_own[rep] = bench_quantile(lat, n, 0.99);
				row->load_max[rep] = bench_quantile(lat, n, 1.0);
			}
	for (int i = 0; i < HOL_ALONE && r >= 0; i++) {
		r = hol_alone(&h);
		row->alone_ms[i] = (double)h.sh->op_ns / 1e6;
	}
	if (r < 0) {
		fprintf(stderr, "bench-lookup: %s: %s\n", spec->name, strerror(-r));
		row->reps = 0;
	}
	hol_stop(&h);
	return r;
}

/* A row that fails is left out, not the bench: pinning 1 GiB needs root (or as much
 * RLIMIT_MEMLOCK) and the memory. */
static void bench_hol(struct bench *b)
{
	for (size_t i = 0; i < N_HOL; i++)
		b->hol[i].error = bench_hol_one(&b->hol[i], &hol_specs[i], &b->hol_placement);
}

/* Median over reps of num/den; per_rep gets the unsorted ratios. */
static double median_ratio(const double *num, const double *den, size_t n, double *per_rep)
{
	double d[NS_REPS > LAT_REPS ? NS_REPS : LAT_REPS];

	for (size_t i = 0; i < n; i++)
		per_rep[i] = d[i] = num[i] / den[i];
	return bench_median(d, n);
}

static double median_of(const double *v, size_t n)
{
	double d[NS_REPS > LAT_REPS ? NS_REPS : LAT_REPS];

	memcpy(d, v, n * sizeof(*v));
	return bench_median(d, n);
}

static void report_table(const char *name, const double *ns_case, const double *ns_base,
			 const char *what, struct bench_summary *sum, size_t *n_sum)
{
	double per_rep[TABLE_REPS], ratio = median_ratio(ns_case, ns_base, TABLE_REPS, per_rep);

	printf("%s: ratio=%.3f (case=mr_table_%s of %u entries one by one in random order, the "
	       "table from empty to full (remove: back) baseline=the same %ss of a plain sorted "
	       "array: bisection and memmove reps=%d)\n", name, ratio, what, TABLE_N, what,
	       TABLE_REPS);
	bench_print_doubles("per-rep ratio", per_rep, TABLE_REPS);
	printf("  raw ns per %s, median of reps: case %.0f; baseline %.0f\n", what,
	       median_of(ns_case, TABLE_REPS), median_of(ns_base, TABLE_REPS));
	bench_add_summary(sum, n_sum, name, ratio, per_rep, TABLE_REPS, TARGET_TABLE, true);
}

static void report_ns(const char *name, const struct ns_row *row, const char *what_case,
		      const char *what_base, double target, struct bench_summary *sum, size_t *n_sum)
{
	double per_rep[NS_REPS], ratio = median_ratio(row->ns_case, row->ns_base, NS_REPS, per_rep);

	printf("%s: ratio=%.3f (case=%s baseline=%s reps=%d)\n", name, ratio, what_case, what_base,
	       NS_REPS);
	bench_print_doubles("per-rep ratio", per_rep, NS_REPS);
	printf("  raw ns per lookup, median of reps: case %.2f; baseline %.2f\n",
	       median_of(row->ns_case, NS_REPS), median_of(row->ns_base, NS_REPS));
	bench_add_summary(sum, n_sum, name, ratio, per_rep, NS_REPS, target, true);
}

static void report_miss(const struct bench *b, struct bench_summary *sum, size_t *n_sum)
{
	double p50[N_LAT][LAT_REPS], p99[N_LAT][LAT_REPS], per50[LAT_REPS], per99[LAT_REPS];
	double per_rep[LAT_REPS], r50, r99;

	for (int k = 0; k < N_LAT; k++)
		for (int rep = 0; rep < LAT_REPS; rep++) {
			p50[k][rep] = (double)b->p50[k][rep];
			p99[k][rep] = (double)b->p99[k][rep];
		}
	printf("lookup-miss: MrLookup request %zu B, reply %zu B; %s; %d reps x %d round trips "
	       "per case, %d warm-up, cases rotated each rep\n", b->req_len, b->reply_len,
	       b->pinned2 ? "client on CPU 0, servers on CPU 1" : "placed by the scheduler",
	       LAT_REPS, LAT_N, WARMUP);
	r50 = median_ratio(p50[LAT_LIBMRD], p50[LAT_ECHO], LAT_REPS, per50);
	printf("lookup-miss-p50: ratio=%.3f (case=mrd_keys_query of an address whose MR mrd has "
	       "cached baseline=blocking SEQPACKET echo of the same bytes, separate process "
	       "reps=%d)\n", r50, LAT_REPS);
	bench_print_doubles("per-rep p50 ratio", per50, LAT_REPS);
	r99 = median_ratio(p99[LAT_LIBMRD], p99[LAT_ECHO], LAT_REPS, per99);
	printf("lookup-miss-p99: ratio=%.3f (case=mrd_keys_query of an address whose MR mrd has "
	       "cached baseline=blocking SEQPACKET echo of the same bytes, separate process "
	       "reps=%d)\n", r99, LAT_REPS);
	bench_print_doubles("per-rep p99 ratio", per99, LAT_REPS);
	printf("  raw ns, median of reps (p50 / p99):");
	for (int k = 0; k < N_LAT; k++)
		printf(" %s %.0f / %.0f%s", lat_names[k], median_of(p50[k], LAT_REPS),
		       median_of(p99[k], LAT_REPS), k + 1 < N_LAT ? ";" : "\n");
	/* Where the time goes: mrd's share against an event loop, and libmrd's own. */
	printf("lookup-miss-daemon-p50: ratio=%.3f (case=pre-packed MrLookup frame via mrd "
	       "baseline=epoll echo reps=%d) [informational: mrd's share]\n",
	       median_ratio(p50[LAT_FRAME], p50[LAT_EPOLL], LAT_REPS, per_rep), LAT_REPS);
	printf("lookup-miss-client-p50: ratio=%.3f (case=mrd_keys_query via mrd baseline=pre-packed "
	       "MrLookup frame via mrd reps=%d) [informational: libmrd's protobuf-c, malloc, lock, "
	       "poll]\n", median_ratio(p50[LAT_LIBMRD], p50[LAT_FRAME], LAT_REPS, per_rep),
	       LAT_REPS);
	/* PERF.md's "bare echo" could mean either server; the blocking one is the stricter, and
	 * mrd is an epoll server. */
	printf("lookup-miss-vs-epoll-p50: ratio=%.3f (case=mrd_keys_query via mrd baseline=epoll echo "
	       "reps=%d) [informational: the target read against an event-loop echo]\n",
	       median_ratio(p50[LAT_LIBMRD], p50[LAT_EPOLL], LAT_REPS, per_rep), LAT_REPS);
	printf("lookup-miss-vs-epoll-p99: ratio=%.3f (case=mrd_keys_query via mrd baseline=epoll echo "
	       "reps=%d) [informational]\n",
	       median_ratio(p99[LAT_LIBMRD], p99[LAT_EPOLL], LAT_REPS, per_rep), LAT_REPS);
	bench_add_summary(sum, n_sum, "lookup-miss-p50", r50, per50, LAT_REPS, TARGET_P50, true);
	bench_add_summary(sum, n_sum, "lookup-miss-p99", r99, per99, LAT_REPS, TARGET_P99, true);
}

static void u64_to_doubles(const uint64_t *v, double *d, int n)
{
	for (int i = 0; i < n; i++)
		d[i] = (double)v[i];
}

/* One head-of-line row: the p99 and p50 ratios, raw figures. */
static double report_hol_row(const struct hol_spec *s, const struct hol_row *row, double *per99)
{
	double i50[HOL_REPS] = { 0 }, i99[HOL_REPS] = { 0 }, l50[HOL_REPS] = { 0 };
	double l99[HOL_REPS] = { 0 }, lmax[HOL_REPS] = { 0 }, ln[HOL_REPS] = { 0 };
	double own99[HOL_REPS] = { 0 }, idle_own99[HOL_REPS] = { 0 }, per50[HOL_REPS], per_own[HOL_REPS], r50, r99;
	int n = row->reps;

	u64_to_doubles(row->idle50, i50, n);
	u64_to_doubles(row->idle99, i99, n);
	u64_to_doubles(row->load50, l50, n);
	u64_to_doubles(row->load99, l99, n);
	u64_to_doubles(row->load_max, lmax, n);
	u64_to_doubles(row->load99_own, own99, n);
	u64_to_doubles(row->idle99_own, idle_own99, n);
	for (int i = 0; i < n; i++)
		ln[i] = (double)row->load_n[i];
	r99 = median_ratio(l99, i99, (size_t)n, per99);
	printf("%s-p99: ratio=%.3f (case=client B's mrd_keys_query of an address whose MR mrd has "
	       "cached, while %s; each round trip stands for those B would have sent meanwhile at "
	       "its idle pace baseline=the same round trip while %s is idle reps=%d)", s->name,
	       r99, s->does, s->who, n);
	if (s->tag)
		printf(" [informational: %s]", s->tag);
	printf("\n");
	bench_print_doubles("per-rep p99 ratio", per99, (size_t)n);
	/* Inline, only the few round trips around the blocked one overlap A's lookup: no p50. */
	if (!s->tag) {
		r50 = median_ratio(l50, i50, (size_t)n, per50);
		printf("%s-p50: ratio=%.3f (case=as %s-p99 baseline=as %s-p99 reps=%d) "
		       "[informational]\n", s->name, r50, s->name, s->name, n);
		bench_print_doubles("per-rep p50 ratio", per50, (size_t)n);
		printf("%s-p99-own: ratio=%.3f (case=as %s-p99, B's samples alone: a stall counts "
		       "once baseline=as %s-p99 reps=%d) [informational: what a closed loop hides]\n",
		       s->name, median_ratio(own99, idle_own99, (size_t)n, per_own), s->name, s->name, n);
	}
	printf("  raw, median of reps: %s's 1 GiB %s %.1f ms (reps:", s->who, s->timed,
	       median_of(row->op_ms, (size_t)n));
	for (int i = 0; i < n; i++)
		printf(" %.0f", row->op_ms[i]);
	printf("), alone (B quiet) %.0f ms; held back counted, B idle p50 / p99 %.0f / %.0f ns, "
	       "meanwhile %.0f / %.0f ns; B's own samples, idle p99 %.0f ns, meanwhile p99 / max "
	       "%.0f / %.0f ns over %.0f round trips a rep\n", median_of(row->alone_ms, HOL_ALONE),
	       median_of(i50, (size_t)n), median_of(i99, (size_t)n), median_of(l50, (size_t)n),
	       median_of(l99, (size_t)n), median_of(idle_own99, (size_t)n),
	       median_of(own99, (size_t)n), median_of(lmax, (size_t)n), median_of(ln, (size_t)n));
	return r99;
}

static void report_hol(const struct bench *b, struct bench_summary *sum, size_t *n_sum)
{
	double per99[HOL_REPS];
	char name[sizeof(sum->name)];

	printf("lookup-hol: each row's actor does one 1 GiB action (4 KiB pages) per loaded phase; "
	       "B times back-to-back round trips and counts those that overlap the actor's timed "
	       "request(s); idle and loaded phases interleaved, order swapped each rep; %s\n",
	       b->hol_placement ? b->hol_placement : "not placed");
	for (size_t i = 0; i < N_HOL; i++) {
		const struct hol_spec *s = &hol_specs[i];
		double r99;

		if (b->hol[i].reps == 0) {
			printf("%s: not measured: %s (the actor pins or faults 1 GiB: it needs root "
			       "or as much RLIMIT_MEMLOCK, and the memory)\n", s->name,
			       strerror(-b->hol[i].error));
			continue;
		}
		r99 = report_hol_row(s, &b->hol[i], per99);
		snprintf(name, sizeof(name), "%s-p99", s->name);
		if (!s->tag)
			bench_add_summary(sum, n_sum, name, r99, per99, (size_t)b->hol[i].reps,
					  TARGET_HOL_P99, true);
	}
}

/* The top-half and range hit rows. */
static void report_hits(const struct bench *b, struct bench_summary *sum, size_t *n_sum)
{
	report_ns("lookup-top-mru", &b->top_mru,
		  "inline mrd_cache_lkey() on random addresses in the MRU entry",
		  "one L1 compare loop over a single local {start,end,lkey} entry",
		  TARGET_TOP_MRU, sum, n_sum);
	report_ns("lookup-top-random8", &b->top_random,
		  "mrd_cache_lkey() on random addresses over the 8 top-half entries (precomputed "
		  "random array)", "branch-free scan of the same 8-entry array", TARGET_TOP_RANDOM,
		  sum, n_sum);
	report_ns("lookup-range-hit", &b->range_hit,
		  "mrd_cache_keys_range() hit of [addr, addr+len) inside one of 8 cached MRs, random "
		  "addr and len", "mrd_cache_keys() hit of the same addresses, same run",
		  TARGET_RANGE, sum, n_sum);
}

static void report(const struct bench *b, double busy_before)
{
	struct bench_summary sum[2 + N_BOTTOM + 2 + 2 + N_HOL + 1];
	long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n_sum = 0, held;

	printf("lookup: ns-scale rows pinned to CPU %d, %d reps, case and baseline alternated; "
	       "top rows %u lookups per batch, bottom rows %u\n", b->cpu, NS_REPS, TOP_OPS,
	       BOTTOM_OPS);
	report_hits(b, sum, &n_sum);
	for (size_t i = 0; i < N_BOTTOM; i++) {
		char name[48], what[256];

		snprintf(name, sizeof(name), "lookup-bottom-%zu%s", bottom_cases[i].n,
			 bottom_cases[i].crowded ? "-crowded" : "");
		snprintf(what, sizeof(what), "mr_table_lookup over %zu synthetic entries (common/"
			 "mr-table.c: the table libmrd's bottom half uses)%s, random hits",
			 bottom_cases[i].n, bottom_cases[i].crowded ?
			 " plus one 1 TiB away (its directory's worst case)" : "");
		report_ns(name, &b->bottom[i], what,
			  "branch-free binary search over the same sorted array", TARGET_BOTTOM, sum,
			  &n_sum);
	}
	report_table("table-insert-65536", b->table_ins, b->table_ins_base, "insert", sum, &n_sum);
	report_table("table-remove-65536", b->table_rm, b->table_rm_base, "remove", sum, &n_sum);
	report_miss(b, sum, &n_sum);
	{
		double per_rep[FIRST_TOUCH_REPS];
		double ratio = median_ratio(b->touch_odp, b->touch_contig, FIRST_TOUCH_REPS, per_rep);

		printf("lookup-first-touch-odp: ratio=%.3f (case=first mrd_keys_query of a fresh 32 MiB "
		       "MRD_MEM_ODP allocation baseline=the same of a plain one, contig policy "
		       "reps=%d) [informational]\n", ratio, FIRST_TOUCH_REPS);
		bench_print_doubles("per-rep ratio", per_rep, FIRST_TOUCH_REPS);
		printf("  raw us, median of reps: case %.1f; baseline %.1f\n",
		       median_of(b->touch_odp, FIRST_TOUCH_REPS) / 1e3,
		       median_of(b->touch_contig, FIRST_TOUCH_REPS) / 1e3);
	}
	report_hol(b, sum, &n_sum);

	printf("summary (targets from PERF.md: top-half MRU hit <= %.1fx one-entry compare; "
	       "top-half random hit <= %.1fx branch-free scan; bottom half <= %.1fx branch-free "
	       "binary search; table insert/remove at 64 K entries <= %.1fx a sorted array's "
	       "memmove; miss round trip p50 <= %.2fx, p99 <= %.2fx bare echo; B's miss round "
	       "trip p99 <= %.1fx idle while A registers 1 GiB, frees a registered 1 GiB, ODP-faults 1 GiB, "
	       "write-prefetches 1 GiB with flush, and while another thread of B's handle makes a 1 GiB "
	       "first lookup):\n",
	       TARGET_TOP_MRU, TARGET_TOP_RANDOM, TARGET_BOTTOM, TARGET_TABLE, TARGET_P50, TARGET_P99,
	       TARGET_HOL_P99);
	held = bench_print_summary(sum, n_sum);
	printf("  %zu of %zu targets hold; %ld CPUs, %.0f%% of them busy with other work just "
	       "before the run\n", held, n_sum, n_cpus, 100 * busy_before);
	printf("  the UCX rows (bottom half vs ucs_pgtable_lookup, full lookup vs ucs_rcache) are "
	       "bench-ucx's, built where configure finds UCX (Debian libucx-dev)\n");
	if (busy_before > 0.2)
		/* Pinning keeps us on one CPU, not others off it: every row is suspect. */
		printf("  WARNING: the machine was busy before the run: other work shares the pinned "
		       "CPU too, so run make bench again on an idle machine\n");
}

/* The first lookup of fresh memory, on demand and pinned, interleaved. */
static int bench_first_touch(struct bench *b)
{
	for (int rep = 0; rep < FIRST_TOUCH_REPS; rep++)
		for (int j = 0; j < 2; j++) {
			bool odp = (rep + j) % 2 == 0;
			struct mrd_keys mr;
			uint64_t t0;
			void *p;
			int r;

			r = mrd_mem_alloc(b->m.client, FIRST_TOUCH_BYTES, 0, odp ? MRD_MEM_ODP : 0, &p);
			if (r < 0) {
				fprintf(stderr, "bench-lookup: first-touch: %s\n", mrd_last_error());
				return r;
			}
			t0 = bench_now_ns();
			r = mrd_keys_query(b->m.client, (uint8_t *)p + 4096, &mr);
			(odp ? b->touch_odp : b->touch_contig)[rep] = (double)(bench_now_ns() - t0);
			(void)mrd_mem_free(b->m.client, p);
			if (r < 0) {
				fprintf(stderr, "bench-lookup: first-touch: %s\n", mrd_last_error());
				return r;
			}
		}
	return 0;
}

/* mrd, 8 buffers whose MRs fill the top half, and the raw connection that measures the
 * MrLookup frame and its reply. */
static int bench_setup(struct bench *b)
{
	int r;

	for (int k = 0; k < N_LAT; k++)
		b->fd[k] = -1;
	snprintf(b->dir, sizeof(b->dir), "/tmp/mrd-bench.XXXXXX");
	if (!mkdtemp(b->dir))
		return negative_errno();
	r = bench_mrd_start(&b->m, "bench-lookup");
	if (r < 0)
		return r;

	b->fd[LAT_FRAME] = raw_connect(b->m.mrd.socket);
	if (b->fd[LAT_FRAME] < 0)
		return b->fd[LAT_FRAME];
	r = bench_raw_hello(b->fd[LAT_FRAME], MRD_CAP_MR, "bench-lookup");
	if (r >= 0)
		r = probe_lookup(b, b->fd[LAT_FRAME]);
	if (r < 0) {
		fprintf(stderr, "bench-lookup: Hello/MrLookup to mrd: %s\n", strerror(-r));
		return r;
	}
	return 0;
}

/* The echo servers answer with the MrLookup reply's size, known only once mrd answered. The
 * children inherit our connections to mrd and never touch them; no thread exists yet. */
static int bench_setup_echo(struct bench *b)
{
	char path[128];
	int r;

	fflush(NULL); /* the children must not print our buffered output again */
	snprintf(path, sizeof(path), "%s/echo.sock", b->dir);
	r = echo_server_start(&b->echo, ECHO_BLOCKING, path, b->reply_len);
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/epoll.sock", b->dir);
	r = echo_server_start(&b->epoll, ECHO_EPOLL, path, b->reply_len);
	if (r < 0)
		return r;
	b->fd[LAT_ECHO] = raw_connect(b->echo.path);
	if (b->fd[LAT_ECHO] < 0)
		return b->fd[LAT_ECHO];
	b->fd[LAT_EPOLL] = raw_connect(b->epoll.path);
	return b->fd[LAT_EPOLL] < 0 ? b->fd[LAT_EPOLL] : 0;
}

static void bench_teardown(struct bench *b)
{
	bench_mrd_stop(&b->m);
	for (int k = 0; k < N_LAT; k++)
		safe_close(b->fd[k]);
	echo_server_stop(&b->echo);
	echo_server_stop(&b->epoll);
	if (b->dir[0])
		rmdir(b->dir);
}

int main(int argc, char **argv)
{
	static struct bench b;
	uint64_t t0 = bench_now_ns();
	double busy_before = bench_cpu_busy(300);
	const char *rows = getenv("MRD_BENCH_LOOKUP");
	bool only_hits = rows && !strcmp(rows, "hits");
	int r;

	if (argc > 1) {
		fprintf(stderr, "usage: bench-lookup\n");
		return EXIT_FAILURE;
	}
	signal(SIGPIPE, SIG_IGN);
	r = bench_setup(&b);
	if (r >= 0)
		r = bench_setup_echo(&b);
	if (r < 0)
		fprintf(stderr, "bench-lookup: setup: %s\n", strerror(-r));
	if (r >= 0) {
		/* The ns-scale rows: one CPU, so no migration lands inside a batch. */
		b.cpu = pick_cpu(&b.pinned2);
		r = b.cpu >= 0 ? bench_pin(0, b.cpu) : -ENODEV;
	}
	if (r >= 0)
		r = bench_top(&b);
	if (r >= 0)
		r = bench_range(&b);
	if (r >= 0 && only_hits) { /* MRD_BENCH_LOOKUP=hits: the top and range rows alone */
		struct bench_summary sum[3];
		size_t n_sum = 0;

		bench_teardown(&b);
		report_hits(&b, sum, &n_sum);
		bench_print_summary(sum, n_sum);
		return EXIT_SUCCESS;
	}
	if (r >= 0)
		r = bench_bottom(&b);
	if (r >= 0)
		r = bench_table(&b);
	if (r >= 0)
		r = bench_miss(&b);
	if (r >= 0)
		r = bench_first_touch(&b);
	bench_teardown(&b);
	/* Its own mrds, after the others: a process holds one mrd's window at a time. */
	if (r >= 0)
		bench_hol(&b);
	if (r < 0) {
		fprintf(stderr, "bench-lookup: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	report(&b, busy_before);
	printf("  (bench-lookup took %.1f s)\n", (double)(bench_now_ns() - t0) / 1e9);
	return EXIT_SUCCESS;
}
