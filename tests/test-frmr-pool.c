/* SPDX-License-Identifier: MIT */
/* FRMR-style handle pools over the soft provider, in-process: key matching with the 2x rule at
 * its edges, aging on a clock the test turns, the pinned minimum, a stale key refused by DMA
 * after its handle moved, pop and push from racing threads, and cleanup in every state. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check-run.h"
#include "registration/frmr-pool.h"
#include "provider/provider.h"

#define NPAGES 64
#define RW (MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ)

static struct provider *p;
static struct provider_pd *pd;
static struct frmr_pools pools;
static uint8_t *buf;
static size_t ps;
static uint64_t now_ms;

static uint64_t test_clock(void *data)
{
	(void)data;
	return __atomic_load_n(&now_ms, __ATOMIC_RELAXED);
}

static const struct frmr_pools_config defaults = {
	.enabled = true, .aging_s = FRMR_AGING_DEFAULT_S, .max_queued = 4096,
};

static void open_pools(const struct frmr_pools_config *config)
{
	ck_assert_int_eq(frmr_pools_init(&pools, pd, config), 0);
	pools.clock = test_clock;
}

static void setup(void)
{
	int verbs_error;

	ps = (size_t)sysconf(_SC_PAGESIZE);
	now_ms = 1000;
	ck_assert_int_eq(provider_open("soft", NULL, &p, &verbs_error), 0);
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	buf = mmap(NULL, NPAGES * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(buf, MAP_FAILED);
	memset(buf, 0, NPAGES * ps);
	open_pools(&defaults);
}

static void teardown(void)
{
	frmr_pools_done(&pools);
	ck_assert_int_eq(provider_pd_free(pd), 0); /* nothing parked or live is left */
	provider_close(p);
	munmap(buf, NPAGES * ps);
}

static struct provider_mr *reg_pages(size_t first, size_t pages, unsigned access)
{
	struct provider_mr *mr = NULL;

	ck_assert_int_eq(frmr_pools_reg(&pools, buf + first * ps, pages * ps, access, false, &mr),
			 0);
	ck_assert_uint_eq(mr->addr, (uintptr_t)(buf + first * ps));
	ck_assert_uint_eq(mr->length, pages * ps);
	return mr;
}

static struct frmr_pool_stats pool_of(uint64_t pages, unsigned access)
{
	struct frmr_pool_stats s[32];
	size_t n = frmr_pools_stats(&pools, s, 32);

	for (size_t i = 0; i < n && i < 32; i++)
		if (s[i].key.pages == pages && s[i].key.access == access)
			return s[i];
	ck_abort_msg("no pool of %llu pages", (unsigned long long)pages);
	return s[0];
}

static struct provider_stats provider_now(void)
{
	struct provider_stats s;

	provider_stats(p, &s);
	return s;
}

/* Parks a handle of n pages and asks for m: served by it, or not. */
static bool serves(size_t n, size_t m)
{
	struct provider_mr *parked = reg_pages(0, n, RW), *mr;
	bool hit;

	ck_assert_int_eq(frmr_pools_dereg(&pools, parked), 0);
	mr = reg_pages(NPAGES / 2, m, RW);
	hit = mr == parked;
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	frmr_pools_done(&pools); /* the next question starts empty */
	open_pools(&defaults);
	return hit;
}

START_TEST(test_twice_rule_boundaries)
{
	/* N pages serve M when M <= N < 2M. */
	ck_assert(serves(4, 4));
	ck_assert(serves(4, 3));
	ck_assert(!serves(4, 2)); /* N - M == M */
	ck_assert(!serves(4, 5)); /* too small */
	ck_assert(serves(5, 3));  /* N = 2M - 1 */
	ck_assert(!serves(6, 3)); /* N = 2M */
	ck_assert(serves(1, 1));
	ck_assert(!serves(2, 1));
}
END_TEST

START_TEST(test_key_parts_must_match)
{
	struct provider_mr *rw = reg_pages(0, 4, RW), *mr;
	struct frmr_pool_stats s;

	ck_assert_int_eq(frmr_pools_dereg(&pools, rw), 0);
	/* Another access, on demand, or internal: other pools, fresh handles. */
	mr = reg_pages(8, 4, MRD_ACCESS_REMOTE_READ);
	ck_assert_ptr_ne(mr, rw);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	mr = reg_pages(8, 4, RW | MRD_ACCESS_ON_DEMAND);
	ck_assert_ptr_ne(mr, rw);
	ck_assert_uint_eq(mr->access, RW | MRD_ACCESS_ON_DEMAND);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	ck_assert_int_eq(frmr_pools_reg(&pools, buf + 8 * ps, 4 * ps, RW, true, &mr), 0);
	ck_assert_ptr_ne(mr, rw);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	ck_assert_uint_eq(frmr_pools_stats(&pools, NULL, 0), 4);

	/* The same key again: a hit, the handle moved, counted once. */
	mr = reg_pages(16, 4, RW);
	ck_assert_ptr_eq(mr, rw);
	s = pool_of(4, RW);
	ck_assert_uint_eq(s.hits, 1);
	ck_assert_uint_eq(s.misses, 1);
	ck_assert_uint_eq(s.in_use, 1);
	ck_assert_uint_eq(s.queued, 0);
	ck_assert_uint_eq(s.max_in_use, 1);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	/* A length that is not whole pages still counts the pages it touches. */
	ck_assert_int_eq(frmr_pools_reg(&pools, buf + 1, 4 * ps - 2, RW, false, &mr), 0);
	ck_assert_ptr_eq(mr, rw);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
}
END_TEST

START_TEST(test_stale_key_refused_after_reuse)
{
	struct provider_mr *src = reg_pages(NPAGES - 1, 1, 0);
	struct provider_mr *old = reg_pages(0, 2, RW), *mr;
	uint32_t old_rkey = old->rkey, old_lkey = old->lkey;
	uint8_t *target = buf + 8 * ps;

	buf[(NPAGES - 1) * ps] = 0x5a;
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, old_rkey,
				      old->iova, 1), 0);
	ck_assert_int_eq(buf[0], 0x5a);
	buf[0] = 0;

	ck_assert_int_eq(frmr_pools_dereg(&pools, old), 0);
	/* Parked: the key dies at once, before anyone else can get the memory. */
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, old_rkey,
				      (uintptr_t)buf, 1), -ENOKEY);
	ck_assert_uint_eq(provider_now().parked, 1);
	ck_assert_uint_eq(provider_now().pinned_bytes, ps); /* src's page alone */

	mr = reg_pages(8, 2, RW);
	ck_assert_ptr_eq(mr, old); /* reused ... */
	ck_assert_uint_ne(mr->rkey, old_rkey); /* ... with new keys */
	ck_assert_uint_ne(mr->lkey, old_lkey);
	/* The stale key reaches neither the old memory nor the new. */
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, old_rkey,
				      (uintptr_t)target, 1), -ENOKEY);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, old_rkey,
				      (uintptr_t)buf, 1), -ENOKEY);
	ck_assert_int_eq(target[0], 0);
	ck_assert_int_eq(buf[0], 0);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, mr->rkey,
				      (uintptr_t)target + ps, 1), 0);
	ck_assert_int_eq(target[ps], 0x5a);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	ck_assert_int_eq(frmr_pools_dereg(&pools, src), 0);
}
END_TEST

/* One pooled handle reused 300 times (past its 256 variants): none of the keys it had reaches
 * its memory again, whichever handle serves now. */
#define REUSE_ROUNDS 300
START_TEST(test_pooled_keys_never_revisit)
{
	static uint32_t rkeys[REUSE_ROUNDS], lkeys[REUSE_ROUNDS];
	struct provider_mr *src = reg_pages(NPAGES - 1, 1, 0), *mr;

	for (int i = 0; i < REUSE_ROUNDS; i++) {
		mr = reg_pages((size_t)(i % 2) * 4, 2, RW);
		rkeys[i] = mr->rkey;
		lkeys[i] = mr->lkey;
		ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	}
	ck_assert_uint_ge(pool_of(2, RW).hits, 255); /* the pool did reuse it */
	mr = reg_pages(0, 2, RW);
	buf[(NPAGES - 1) * ps] = 0x5a;
	for (int i = 0; i < REUSE_ROUNDS; i++) {
		ck_assert_msg(rkeys[i] != mr->rkey && lkeys[i] != mr->lkey,
			      "the keys of use %d are back", i);
		ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, rkeys[i],
					      mr->iova, 1), -ENOKEY);
	}
	ck_assert_int_eq(buf[0], 0);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	ck_assert_int_eq(frmr_pools_dereg(&pools, src), 0);
}
END_TEST

START_TEST(test_aging_and_pinned_minimum)
{
	struct provider_mr *mr[3], **doomed;
	struct frmr_pool_stats s;

	for (int i = 0; i < 3; i++)
		mr[i] = reg_pages((size_t)i * 4, 4, RW);
	for (int i = 0; i < 3; i++) {
		now_ms += 1000; /* parked at 2, 3 and 4 s */
		ck_assert_int_eq(frmr_pools_dereg(&pools, mr[i]), 0);
	}
	ck_assert_uint_eq(pool_of(4, RW).queued, 3);

	/* Idle for less than 60 s: kept. */
	now_ms = 1000 + 1000 + 60 * 1000 - 1;
	ck_assert_uint_eq(frmr_pools_age(&pools, &doomed), 0);
	ck_assert_ptr_null(doomed);
	/* The oldest turns 60 s idle: it goes, the others stay. */
	now_ms++;
	ck_assert_uint_eq(frmr_pools_age(&pools, &doomed), 1);
	ck_assert_ptr_eq(doomed[0], mr[0]);
	frmr_pools_destroy(doomed, 1);
	s = pool_of(4, RW);
	ck_assert_uint_eq(s.queued, 2);
	ck_assert_uint_eq(s.aged, 1);

	/* A pinned minimum of 1 keeps one however long it idles. */
	ck_assert_int_eq(frmr_pools_set(&pools, &FRMR_MATCH_ANY, -1, 1), 1);
	now_ms += 3600 * 1000;
	ck_assert_uint_eq(frmr_pools_age(&pools, &doomed), 1);
	ck_assert_ptr_eq(doomed[0], mr[1]); /* oldest first */
	frmr_pools_destroy(doomed, 1);
	s = pool_of(4, RW);
	ck_assert_uint_eq(s.queued, 1);
	ck_assert_uint_eq(s.pinned, 1);
	ck_assert_uint_eq(provider_now().parked, 1);

	/* Without the minimum the last one goes, and then the idle pool itself. */
	ck_assert_int_eq(frmr_pools_set(&pools, &FRMR_MATCH_ANY, 10, 0), 1);
	ck_assert_uint_eq(frmr_pools_age(&pools, &doomed), 1);
	frmr_pools_destroy(doomed, 1);
	ck_assert_uint_eq(frmr_pools_stats(&pools, NULL, 0), 0);
	ck_assert_uint_eq(provider_now().parked, 0);
}
END_TEST

START_TEST(test_set_per_key)
{
	struct frmr_match m = FRMR_MATCH_ANY;
	struct provider_mr *a = reg_pages(0, 4, RW), *b = reg_pages(8, 8, RW), **doomed;

	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	ck_assert_int_eq(frmr_pools_dereg(&pools, b), 0);
	m.pages = 8;
	ck_assert_int_eq(frmr_pools_set(&pools, &m, 5, -1), 1);
	ck_assert_uint_eq(pool_of(8, RW).aging_s, 5);
	ck_assert_uint_eq(pool_of(4, RW).aging_s, FRMR_AGING_DEFAULT_S);
	m.pages = 3;
	ck_assert_int_eq(frmr_pools_set(&pools, &m, 5, -1), 0); /* matches nothing */
	ck_assert_int_eq(frmr_pools_set(&pools, &m, 0, -1), -EINVAL);

	now_ms += 5000;
	ck_assert_uint_eq(frmr_pools_age(&pools, &doomed), 1);
	ck_assert_ptr_eq(doomed[0], b);
	frmr_pools_destroy(doomed, 1);
	/* Set by its key, the empty pool stays with its setting. */
	now_ms += 3600 * 1000;
	ck_assert_uint_eq(frmr_pools_age(&pools, &doomed), 1);
	frmr_pools_destroy(doomed, 1);
	ck_assert_uint_eq(frmr_pools_stats(&pools, NULL, 0), 1);
	ck_assert_uint_eq(pool_of(8, RW).aging_s, 5);

	/* A setting for every pool also holds for pools made later. */
	ck_assert_int_eq(frmr_pools_set(&pools, &FRMR_MATCH_ANY, 7, 2), 1);
	a = reg_pages(0, 2, RW);
	ck_assert_uint_eq(pool_of(2, RW).aging_s, 7);
	ck_assert_uint_eq(pool_of(2, RW).pinned, 2);
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
}
END_TEST

START_TEST(test_max_queued)
{
	struct frmr_pools_config c = defaults;
	struct provider_mr *a, *b;

	frmr_pools_done(&pools);
	c.max_queued = 1;
	open_pools(&c);
	a = reg_pages(0, 1, RW);
	b = reg_pages(1, 1, RW);
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	ck_assert_int_eq(frmr_pools_dereg(&pools, b), 0); /* no room: destroyed */
	ck_assert_uint_eq(pools.queued, 1);
	ck_assert_uint_eq(provider_now().parked, 1);
	ck_assert_uint_eq(provider_now().mrs, 0);
}
END_TEST

START_TEST(test_bad_memory_keeps_handle)
{
	struct provider_mr *a = reg_pages(0, 2, RW), *mr = NULL;
	uint8_t *hole = mmap(NULL, 2 * ps, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert_ptr_ne(hole, MAP_FAILED);
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	ck_assert_int_eq(frmr_pools_reg(&pools, hole, 2 * ps, RW, false, &mr), -EFAULT);
	ck_assert_ptr_null(mr);
	ck_assert_uint_eq(pool_of(2, RW).queued, 1);
	ck_assert_uint_eq(pool_of(2, RW).in_use, 0);
	ck_assert_uint_eq(pool_of(2, RW).hits, 0);
	mr = reg_pages(4, 2, RW);
	ck_assert_ptr_eq(mr, a);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	munmap(hole, 2 * ps);
}
END_TEST

START_TEST(test_off_when_disabled_or_unsafe)
{
	struct frmr_pools_config c = defaults;
	struct provider_mr *a;

	frmr_pools_done(&pools);
	c.enabled = false;
	open_pools(&c);
	ck_assert_ptr_nonnull(pools.off);
	a = reg_pages(0, 1, RW);
	ck_assert_ptr_null(a->pool);
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	ck_assert_uint_eq(provider_now().parked, 0);
	ck_assert_uint_eq(frmr_pools_stats(&pools, NULL, 0), 0);
	frmr_pools_done(&pools);

	/* A device whose moves keep keys would let a stale key reach new memory. */
	p->caps.rereg_new_keys = false;
	open_pools(&defaults);
	ck_assert_ptr_nonnull(strstr(pools.off, "keys"));
	frmr_pools_done(&pools);
	p->caps.rereg_new_keys = true;
	p->caps.rereg_translation = false;
	open_pools(&defaults);
	ck_assert_ptr_nonnull(strstr(pools.off, "cannot move"));
	p->caps.rereg_translation = true;
}
END_TEST

/* Pools off say why in the device's words (caps.rereg_probe, verbs' probe answer): soft with
 * $MRD_SOFT_REREG moves as rxe and siw (refused: parking too, which on verbs is a move) or as
 * mlx5's UMR (keys kept) would; a bad value fails the open. */
START_TEST(test_off_says_the_devices_reason)
{
	static const struct {
		const char *mode, *off;
	} modes[] = {
		{ "refuse", "the device cannot move an MR to new memory (soft: rereg: Operation not "
			    "supported (MRD_SOFT_REREG=refuse, as rxe and siw))" },
		{ "keep-keys", "the device keeps an MR's keys when it moves: a stale key would reach "
			       "new memory (soft: a move keeps its keys (MRD_SOFT_REREG=keep-keys, as "
			       "mlx5's UMR))" },
		{ "move", NULL },
	};
	struct provider *q;
	struct provider_pd *qpd;
	struct frmr_pools qpools;
	struct provider_mr *mr;
	int verbs_error;

	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		uint32_t rkey;
		int r;

		ck_assert_int_eq(setenv("MRD_SOFT_REREG", modes[i].mode, 1), 0);
		ck_assert_int_eq(provider_open("soft", NULL, &q, &verbs_error), 0);
		ck_assert_int_eq(provider_pd_alloc(q, &qpd), 0);
		ck_assert_int_eq(frmr_pools_init(&qpools, qpd, &defaults), 0);
		if (modes[i].off)
			ck_assert_str_eq(qpools.off, modes[i].off);
		else
			ck_assert_ptr_null(qpools.off);
		ck_assert_int_eq(provider_reg(qpd, buf, ps, (uintptr_t)buf, RW, &mr), 0);
		rkey = mr->rkey;
		r = provider_rereg(mr, PROVIDER_REREG_TRANSLATION, buf + ps, ps,
				   (uintptr_t)(buf + ps), 0);
		ck_assert_int_eq(r, strcmp(modes[i].mode, "refuse") == 0 ? -EOPNOTSUPP : 0);
		if (strcmp(modes[i].mode, "keep-keys") == 0)
			ck_assert_uint_eq(mr->rkey, rkey);
		else
			ck_assert_uint_ne(mr->rkey, r == 0 ? rkey : 0);
		ck_assert_int_eq(provider_park(mr), strcmp(modes[i].mode, "refuse") == 0 ?
							    -EOPNOTSUPP : 0);
		ck_assert_int_eq(provider_dereg(mr), 0);
		frmr_pools_done(&qpools);
		ck_assert_int_eq(provider_pd_free(qpd), 0);
		provider_close(q);
	}
	ck_assert_int_eq(setenv("MRD_SOFT_REREG", "sometimes", 1), 0);
	ck_assert_int_eq(provider_open("soft", NULL, &q, &verbs_error), -EINVAL);
	ck_assert_int_eq(unsetenv("MRD_SOFT_REREG"), 0);
}
END_TEST

/* A device that, against its caps, gives a moved MR its old keys back. */
static uint32_t kept_lkey, kept_rkey;

static int park_remembering(struct provider_mr *mr)
{
	kept_lkey = mr->lkey;
	kept_rkey = mr->rkey;
	return provider_soft_ops.park(mr);
}

static int rereg_keeping_keys(struct provider_mr *mr, unsigned flags, void *addr, size_t length,
			      uint64_t iova, unsigned access)
{
	int r = provider_soft_ops.rereg(mr, flags, addr, length, iova, access);

	if (r == 0) {
		mr->lkey = kept_lkey;
		mr->rkey = kept_rkey;
	}
	return r;
}

START_TEST(test_handle_with_old_key_never_served)
{
	struct provider_ops lying = provider_soft_ops;
	struct provider_mr *a, *mr;

	lying.park = park_remembering;
	lying.rereg = rereg_keeping_keys;
	p->ops = &lying;
	a = reg_pages(0, 2, RW);
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	mr = reg_pages(4, 2, RW);
	ck_assert_uint_ne(mr->rkey, kept_rkey); /* a fresh MR, not the handle */
	ck_assert_uint_eq(pool_of(2, RW).hits, 0);
	ck_assert_uint_eq(pool_of(2, RW).misses, 2);
	ck_assert_uint_eq(pool_of(2, RW).in_use, 1);
	ck_assert_uint_eq(provider_now().parked, 0); /* the handle was destroyed */
	ck_assert_uint_eq(provider_now().mrs, 1);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	p->ops = &provider_soft_ops;
}
END_TEST

static int park_keeping_keys(struct provider_mr *mr)
{
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	int r = provider_soft_ops.park(mr);

	mr->lkey = lkey;
	mr->rkey = rkey;
	return r;
}

/* Parked under the keys it had (as verbs parks: by a move): destroyed at once. */
START_TEST(test_handle_parked_with_old_key_destroyed)
{
	struct provider_ops lying = provider_soft_ops;
	struct provider_mr *a = reg_pages(0, 2, RW);

	lying.park = park_keeping_keys;
	p->ops = &lying;
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	p->ops = &provider_soft_ops;
	ck_assert_uint_eq(provider_now().parked, 0);
	ck_assert_uint_eq(provider_now().mrs, 0);
	ck_assert_uint_eq(pool_of(2, RW).queued, 0);
	ck_assert_uint_eq(pool_of(2, RW).in_use, 0);
}
END_TEST

/* A park that made the MR anew (verbs: new keys after the move, provider.h). */
static int park_made_anew(struct provider_mr *mr)
{
	int r = provider_soft_ops.park(mr);

	return r == 0 ? 1 : r;
}

/* Where released keys come back, a park that made the MR anew gave its old keys back to the
 * device: the pool may keep the handle (its keys are new), but the quarantine counts the old
 * ones in unparked, and a released MR no pool keeps is destroyed, not kept. */
START_TEST(test_park_made_anew_counts_unparked)
{
	struct provider_ops anew = provider_soft_ops;
	struct provider_mr *a, *b;
	bool on;
	uint64_t waiting, unparked;

	frmr_pools_done(&pools);
	p->caps.keys_come_back = true;
	open_pools(&defaults);
	a = reg_pages(0, 2, RW);
	anew.park = park_made_anew;
	p->ops = &anew;
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	ck_assert_uint_eq(pool_of(2, RW).queued, 1); /* under new keys: the pool keeps it */
	key_quarantine_counts(&pools.quarantine, &on, &waiting, &unparked);
	ck_assert(on);
	ck_assert_uint_eq(waiting, 0);
	ck_assert_uint_eq(unparked, 1);

	ck_assert_int_eq(provider_reg(pd, buf, ps, (uintptr_t)buf, RW, &b), 0);
	ck_assert_int_eq(frmr_pools_dereg(&pools, b), 0); /* no pool: the quarantine's */
	key_quarantine_counts(&pools.quarantine, &on, &waiting, &unparked);
	ck_assert_uint_eq(waiting, 0);
	ck_assert_uint_eq(unparked, 2);
	ck_assert_uint_eq(provider_now().parked, 1); /* the pool's handle alone */
	p->ops = &provider_soft_ops;
	p->caps.keys_come_back = false;
}
END_TEST

/* Where a move makes an on-demand MR anew (mlx5): no pool takes one (its park and its reuse
 * would give its keys back), the quarantine parks it in place, keys kept; pinned ones pool. */
START_TEST(test_on_demand_parked_in_place)
{
	struct provider_mr *odp, *pinned;
	uint32_t rkey;
	bool on;
	uint64_t waiting, unparked;

	frmr_pools_done(&pools);
	p->caps.keys_come_back = p->caps.odp_move_recreates = true;
	open_pools(&defaults);
	odp = reg_pages(0, 2, RW | MRD_ACCESS_ON_DEMAND);
	pinned = reg_pages(4, 2, RW);
	ck_assert_ptr_null(odp->pool);
	ck_assert_ptr_nonnull(pinned->pool);
	rkey = odp->rkey;
	ck_assert_int_eq(frmr_pools_dereg(&pools, odp), 0);
	ck_assert_uint_eq(odp->rkey, rkey); /* parked in place, not moved */
	ck_assert_int_eq(frmr_pools_dereg(&pools, pinned), 0);
	ck_assert_uint_eq(pool_of(2, RW).queued, 1);
	key_quarantine_counts(&pools.quarantine, &on, &waiting, &unparked);
	ck_assert_uint_eq(waiting, 1);
	ck_assert_uint_eq(unparked, 0);
	p->caps.keys_come_back = p->caps.odp_move_recreates = false;
}
END_TEST

static int rereg_failing(struct provider_mr *mr, unsigned flags, void *addr, size_t length,
			 uint64_t iova, unsigned access)
{
	return -EIO;
}

/* A handle that cannot move where a fresh MR can is destroyed, and the fresh MR serves. */
START_TEST(test_handle_failing_to_move_destroyed)
{
	struct provider_ops failing = provider_soft_ops;
	struct provider_mr *a, *mr;

	a = reg_pages(0, 2, RW);
	ck_assert_int_eq(frmr_pools_dereg(&pools, a), 0);
	failing.rereg = rereg_failing;
	p->ops = &failing;
	mr = reg_pages(4, 2, RW);
	p->ops = &provider_soft_ops;
	ck_assert_uint_eq(provider_now().parked, 0);
	ck_assert_uint_eq(provider_now().mrs, 1);
	ck_assert_uint_eq(pool_of(2, RW).queued, 0);
	ck_assert_uint_eq(pool_of(2, RW).in_use, 1);
	ck_assert_uint_eq(pool_of(2, RW).hits, 0);
	ck_assert_uint_eq(pool_of(2, RW).misses, 2);
	ck_assert_int_eq(frmr_pools_dereg(&pools, mr), 0);
	ck_assert_uint_eq(pool_of(2, RW).queued, 1);
}
END_TEST

START_TEST(test_cleanup_in_every_state)
{
	struct frmr_pools zeroed;
	struct provider_mr *queued, *in_use;

	memset(&zeroed, 0, sizeof(zeroed));
	frmr_pools_done(&zeroed); /* never initialised */
	frmr_pools_done(&zeroed);

	queued = reg_pages(0, 2, RW);
	in_use = reg_pages(4, 2, RW);
	ck_assert_int_eq(frmr_pools_dereg(&pools, queued), 0);
	frmr_pools_done(&pools); /* one parked, one still out there */
	frmr_pools_done(&pools);
	ck_assert_uint_eq(provider_now().parked, 0);
	ck_assert_uint_eq(provider_now().mrs, 1);
	/* Released after its pool went: straight to the provider. */
	ck_assert_int_eq(frmr_pools_dereg(&pools, in_use), 0);
	ck_assert_uint_eq(provider_now().mrs, 0);
	open_pools(&defaults); /* for teardown */
}
END_TEST

/* ---- threads ---- */

#define THREADS 4
#define ROUNDS 400

static void *churn(void *arg)
{
	size_t slot = (size_t)(uintptr_t)arg * (NPAGES / THREADS);
	unsigned seed = (unsigned)(uintptr_t)arg + 1;
	int failures = 0;

	for (int i = 0; i < ROUNDS; i++) {
		size_t pages = 1 + rand_r(&seed) % (NPAGES / THREADS);
		struct provider_mr *mr = NULL;

		if (frmr_pools_reg(&pools, buf + slot * ps, pages * ps, RW, false, &mr) < 0 ||
		    mr->addr != (uintptr_t)(buf + slot * ps) || mr->length != pages * ps)
			failures++;
		else if (frmr_pools_dereg(&pools, mr) < 0)
			failures++;
		if (i % 64 == 0) { /* aging races with them too */
			struct provider_mr **doomed;
			size_t n = frmr_pools_age(&pools, &doomed);

			frmr_pools_destroy(doomed, n);
			__atomic_add_fetch(&now_ms, 20 * 1000, __ATOMIC_RELAXED);
		}
	}
	return (void *)(uintptr_t)failures;
}

START_TEST(test_concurrent_pop_push)
{
	struct frmr_pool_stats s[64];
	pthread_t t[THREADS];
	uint64_t hits = 0, misses = 0, queued = 0;
	size_t n;

	for (uintptr_t i = 0; i < THREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, churn, (void *)i), 0);
	for (int i = 0; i < THREADS; i++) {
		void *failures;

		ck_assert_int_eq(pthread_join(t[i], &failures), 0);
		ck_assert_ptr_null(failures);
	}
	n = frmr_pools_stats(&pools, s, 64);
	ck_assert_uint_le(n, 64);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_eq(s[i].in_use, 0);
		ck_assert_uint_le(s[i].max_in_use, THREADS);
		hits += s[i].hits;
		misses += s[i].misses;
		queued += s[i].queued;
	}
	/* Pools aged away took their counts along: at most every registration counted once. */
	ck_assert_uint_le(hits + misses, THREADS * ROUNDS);
	ck_assert_uint_gt(hits, 0);
	ck_assert_uint_eq(queued, pools.queued);
	ck_assert_uint_eq(provider_now().parked, queued);
	ck_assert_uint_eq(provider_now().mrs, 0);
	ck_assert_uint_eq(provider_now().pinned_bytes, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frmr-pool");
	TCase *tc = tcase_create("pools");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_twice_rule_boundaries);
	tcase_add_test(tc, test_key_parts_must_match);
	tcase_add_test(tc, test_stale_key_refused_after_reuse);
	tcase_add_test(tc, test_pooled_keys_never_revisit);
	tcase_add_test(tc, test_aging_and_pinned_minimum);
	tcase_add_test(tc, test_set_per_key);
	tcase_add_test(tc, test_max_queued);
	tcase_add_test(tc, test_bad_memory_keeps_handle);
	tcase_add_test(tc, test_off_when_disabled_or_unsafe);
	tcase_add_test(tc, test_off_says_the_devices_reason);
	tcase_add_test(tc, test_handle_with_old_key_never_served);
	tcase_add_test(tc, test_handle_failing_to_move_destroyed);
	tcase_add_test(tc, test_handle_parked_with_old_key_destroyed);
	tcase_add_test(tc, test_park_made_anew_counts_unparked);
	tcase_add_test(tc, test_on_demand_parked_in_place);
	tcase_add_test(tc, test_cleanup_in_every_state);
	tcase_add_test(tc, test_concurrent_pop_push);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
