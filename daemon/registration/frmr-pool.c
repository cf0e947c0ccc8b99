/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include "provider/provider.h"
#include "registration/frmr-pool.h"

struct parked {
	struct provider_mr *mr;
	uint64_t since_ms;
	uint32_t lkey, rkey; /* the keys it had before parking: it must never get them back */
};

/* Handle queues grow and shrink a page at a time. */
#define CHUNK_SIZE 4096
#define CHUNK_ENTRIES ((CHUNK_SIZE - 2 * sizeof(void *) - 2 * sizeof(uint32_t)) / \
		       sizeof(struct parked))

struct chunk {
	TAILQ_ENTRY(chunk) link;
	uint32_t head, tail; /* e[head .. tail) are queued */
	struct parked e[CHUNK_ENTRIES];
};
_Static_assert(sizeof(struct chunk) <= CHUNK_SIZE, "a chunk is a page");

struct frmr_pool {
	struct frmr_key key;
	TAILQ_HEAD(chunk_queue, chunk) chunks; /* oldest first; push and pop at the tail */
	uint64_t queued, in_use, max_in_use, hits, misses, aged;
	unsigned aging_s, pinned;
	bool custom;          /* set by its key: kept even when idle */
	uint64_t last_use_ms; /* of its last registration or release */
};

static uint64_t monotonic_ms(void *data)
{
	struct timespec ts;

	(void)data;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int key_cmp(const struct frmr_key *a, const struct frmr_key *b)
{
#define CMP(f)                        \
	if (a->f != b->f)             \
		return a->f < b->f ? -1 : 1
	CMP(access);
	CMP(odp);
	CMP(internal);
	CMP(vendor);
	CMP(pages);
#undef CMP
	return 0;
}

/* Same key but for the size class. */
static bool same_kind(const struct frmr_key *a, const struct frmr_key *b)
{
	return a->access == b->access && a->odp == b->odp && a->internal == b->internal &&
	       a->vendor == b->vendor;
}

/* The first pool whose key is not below key. */
static size_t lower_bound(const struct frmr_pools *p, const struct frmr_key *key)
{
	size_t lo = 0, hi = p->n_pools;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (key_cmp(&p->pools[mid]->key, key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Why pools are off, with the device's own answer (caps.rereg_probe: verbs' probe). */
static const char *off_because(struct frmr_pools *p, const struct provider *prov,
			       const char *why)
{
	if (!prov->caps.rereg_probe[0])
		return why;
	snprintf(p->off_why, sizeof(p->off_why), "%s (%s: %s)", why, prov->caps.device,
		 prov->caps.rereg_probe);
	return p->off_why;
}

int frmr_pools_init(struct frmr_pools *p, struct provider_pd *pd,
		    const struct frmr_pools_config *config)
{
	const struct provider *prov = pd->provider;

	*p = (struct frmr_pools){ .pd = pd, .page_size = prov->caps.page_size, .config = *config,
				  .clock = monotonic_ms };
	if (!config->enabled)
		p->off = "off in mrd.conf ([pools] enabled = no)";
	else if (!prov->ops->park || !prov->caps.rereg_translation)
		p->off = off_because(p, prov, "the device cannot move an MR to new memory");
	else if (!prov->caps.rereg_new_keys)
		p->off = off_because(p, prov, "the device keeps an MR's keys when it moves: a stale "
					      "key would reach new memory");
	key_quarantine_init(&p->quarantine, prov->caps.keys_come_back);
	pthread_mutex_init(&p->lock, NULL);
	p->ready = true;
	return 0;
}

static void pool_free(struct frmr_pool *pool)
{
	struct chunk *c;

	while ((c = TAILQ_FIRST(&pool->chunks))) {
		for (uint32_t i = c->head; i < c->tail; i++)
			(void)provider_dereg(c->e[i].mr);
		TAILQ_REMOVE(&pool->chunks, c, link);
		free(c);
	}
	free(pool);
}

void frmr_pools_done(struct frmr_pools *p)
{
	if (!p->ready)
		return;
	/* An MR still out there must not come back to a pool that is gone: it sees off. */
	p->off = "closed";
	for (size_t i = 0; i < p->n_pools; i++)
		pool_free(p->pools[i]);
	free(p->pools);
	p->pools = NULL;
	p->n_pools = p->pools_cap = 0;
	p->queued = 0;
	key_quarantine_done(&p->quarantine);
	pthread_mutex_destroy(&p->lock);
	p->ready = false;
}

/* The pool of key, made when missing; NULL at FRMR_POOLS_MAX or without memory. Locked. */
static struct frmr_pool *pool_get(struct frmr_pools *p, const struct frmr_key *key, size_t at)
{
	struct frmr_pool *pool;

	if (at < p->n_pools && key_cmp(&p->pools[at]->key, key) == 0)
		return p->pools[at];
	if (p->n_pools >= FRMR_POOLS_MAX)
		return NULL;
	if (p->n_pools == p->pools_cap) {
		size_t cap = p->pools_cap ? 2 * p->pools_cap : 16;
		struct frmr_pool **pools = realloc(p->pools, cap * sizeof(*pools));

		if (!pools)
			return NULL;
		p->pools = pools;
		p->pools_cap = cap;
	}
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return NULL;
	pool->key = *key;
	TAILQ_INIT(&pool->chunks);
	pool->aging_s = p->config.aging_s;
	pool->pinned = p->config.pinned;
	memmove(p->pools + at + 1, p->pools + at, (p->n_pools - at) * sizeof(*p->pools));
	p->pools[at] = pool;
	p->n_pools++;
	return pool;
}

static bool queue_push(struct frmr_pools *p, struct frmr_pool *pool, const struct parked *e)
{
	struct chunk *c = TAILQ_LAST(&pool->chunks, chunk_queue);

	/* Strictly below, so push after aging emptied a chunk's head still fits. */
	if (!c || c->tail == CHUNK_ENTRIES) {
		c = malloc(sizeof(*c));
		if (!c)
			return false;
		c->head = c->tail = 0;
		TAILQ_INSERT_TAIL(&pool->chunks, c, link);
	}
	c->e[c->tail++] = *e;
	pool->queued++;
	p->queued++;
	return true;
}

/* The newest: it was used last, so its device state is the warmest. */
static struct parked queue_pop(struct frmr_pools *p, struct frmr_pool *pool)
{
	struct chunk *c = TAILQ_LAST(&pool->chunks, chunk_queue);
	struct parked e = c->e[--c->tail];

	if (c->tail == c->head) {
		TAILQ_REMOVE(&pool->chunks, c, link);
		free(c);
	}
	pool->queued--;
	p->queued--;
	return e;
}

static void count_use(struct frmr_pool *pool, uint64_t now)
{
	pool->in_use++;
	if (pool->in_use > pool->max_in_use)
		pool->max_in_use = pool->in_use;
	pool->last_use_ms = now;
}

/* Pop: the smallest size class from the request's up to (not including) twice it that has a
 * handle. Else the request's own pool counts a miss and the caller makes a handle for it. */
static struct frmr_pool *take(struct frmr_pools *p, const struct frmr_key *key,
			      struct parked *ret_hit)
{
	size_t at = lower_bound(p, key);
	struct frmr_pool *pool;
	uint64_t now = p->clock(p->clock_data);

	for (size_t i = at; i < p->n_pools; i++) {
		pool = p->pools[i];
		if (!same_kind(&pool->key, key) || pool->key.pages - key->pages >= key->pages)
			break;
		if (pool->queued > 0) {
			*ret_hit = queue_pop(p, pool);
			pool->hits++;
			count_use(pool, now);
			return pool;
		}
	}
	ret_hit->mr = NULL;
	pool = pool_get(p, key, at);
	if (pool) {
		pool->misses++;
		count_use(pool, now); /* counted before the registration: the pool stays meanwhile */
	}
	return pool;
}

static void untake(struct frmr_pools *p, struct frmr_pool *pool)
{
	pthread_mutex_lock(&p->lock);
	pool->in_use--;
	pthread_mutex_unlock(&p->lock);
}

int frmr_pools_reg(struct frmr_pools *p, void *addr, size_t length, unsigned access,
		   bool internal, struct provider_mr **ret)
{
	uintptr_t a = (uintptr_t)addr, ps = p->page_size;
	struct frmr_key key;
	struct frmr_pool *pool;
	struct parked hit;
	struct provider_mr *mr;
	int r;

	/* An on-demand MR a move would make anew is no pool's: its park, and its reuse, would
	 * give keys back to the device (key-quarantine.h, key_quarantine_parks_in_place). */
	if (p->off || length == 0 || a + length < a ||
	    ((access & MRD_ACCESS_ON_DEMAND) && p->pd->provider->caps.odp_move_recreates))
		return provider_reg(p->pd, addr, length, a, access, ret);
	key = (struct frmr_key){
		.access = access & ~MRD_ACCESS_ON_DEMAND,
		.odp = access & MRD_ACCESS_ON_DEMAND,
		.internal = internal,
		.pages = (((a + length + ps - 1) & ~(ps - 1)) - (a & ~(ps - 1))) / ps,
	};

	pthread_mutex_lock(&p->lock);
	pool = take(p, &key, &hit);
	pthread_mutex_unlock(&p->lock);

	if (hit.mr) {
		struct frmr_pool *home = pool; /* the handle's pool, counting it in use */

		r = provider_rereg(hit.mr, PROVIDER_REREG_TRANSLATION, addr, length, a, 0);
		if (r == 0 && hit.mr->lkey != hit.lkey && hit.mr->rkey != hit.rkey) {
			*ret = hit.mr;
			return 0;
		}
		if (r == 0 || r == -ESTALE || r == -EKEYEXPIRED) {
			/* Back with an old key, gone, or out of keys: that handle must never serve. */
			hit.mr->pool = NULL;
			(void)provider_dereg(hit.mr);
			hit.mr = NULL;
		}
		/* Else it is still parked: the memory may be at fault, or the handle. A fresh
		 * registration tells. Either way the request's own pool counts a miss. */
		pthread_mutex_lock(&p->lock);
		home->hits--;
		if (!hit.mr)
			home->in_use--;
		pool = pool_get(p, &key, lower_bound(p, &key));
		if (pool) {
			pool->misses++;
			count_use(pool, p->clock(p->clock_data));
		}
		pthread_mutex_unlock(&p->lock);
		if (hit.mr) {
			bool kept;

			r = provider_reg(p->pd, addr, length, a, access, &mr);
			pthread_mutex_lock(&p->lock);
			kept = r < 0 && queue_push(p, home, &hit); /* the memory's fault: keep it */
			home->in_use--;
			pthread_mutex_unlock(&p->lock);
			if (!kept) { /* it cannot go where a fresh MR can */
				hit.mr->pool = NULL;
				(void)provider_dereg(hit.mr);
			}
			goto registered;
		}
	}

	r = provider_reg(p->pd, addr, length, a, access, &mr);
registered:
	if (r < 0) {
		if (pool)
			untake(p, pool);
		return r;
	}
	mr->pool = pool;
	*ret = mr;
	return 0;
}

int frmr_pools_dereg(struct frmr_pools *p, struct provider_mr *mr)
{
	struct frmr_pool *pool;
	struct parked e;
	bool kept = false;
	int r;

	if (!mr)
		return 0;
	pool = mr->pool;
	if (!pool || p->off)
		return key_quarantine_release(&p->quarantine, mr);

	e = (struct parked){ .mr = mr, .lkey = mr->lkey, .rkey = mr->rkey };
	r = provider_park(mr); /* its keys die here, before anyone else may get the memory */
	if (r > 0) { /* made anew: its old keys are the device's again, the handle serves */
		key_quarantine_lost(&p->quarantine, mr, r);
		r = 0;
	}
	if (r == 0 && (mr->lkey == e.lkey || mr->rkey == e.rkey))
		r = -EKEYREJECTED; /* parked under its old key (verbs moves it): it keeps keys */

	pthread_mutex_lock(&p->lock);
	e.since_ms = pool->last_use_ms = p->clock(p->clock_data);
	if (r == 0 && p->queued < p->config.max_queued)
		kept = queue_push(p, pool, &e);
	pool->in_use--; /* only now: the pool must not go while mr may still join it */
	pthread_mutex_unlock(&p->lock);
	if (kept)
		return 0;
	mr->pool = NULL;
	return key_quarantine_release(&p->quarantine, mr);
}

/* Appends the oldest parked handle of pool to *doomed; false when out of memory. Locked. */
static bool take_oldest(struct frmr_pools *p, struct frmr_pool *pool, struct provider_mr ***doomed,
			size_t *n, size_t *cap)
{
	struct chunk *c = TAILQ_FIRST(&pool->chunks);

	if (*n == *cap) {
		size_t ncap = *cap ? 2 * *cap : 64;
		struct provider_mr **d = realloc(*doomed, ncap * sizeof(*d));

		if (!d)
			return false;
		*doomed = d;
		*cap = ncap;
	}
	(*doomed)[(*n)++] = c->e[c->head++].mr;
	if (c->head == c->tail) {
		TAILQ_REMOVE(&pool->chunks, c, link);
		free(c);
	}
	pool->queued--;
	p->queued--;
	return true;
}

/* Takes out parked handles, oldest first, down to each pool's pinned minimum (to none with
 * pinned_too) — by_age: only those idle for their pool's aging. Drops the pools left empty,
 * unused and not set by their key: by_age once idle for an aging period, else with
 * pinned_too. Locked; the caller destroys what it got. */
static size_t take_out(struct frmr_pools *p, uint64_t now, bool pinned_too, bool by_age,
		       struct provider_mr ***ret, unsigned *ret_pools_removed)
{
	struct provider_mr **doomed = NULL;
	size_t n = 0, cap = 0, kept = 0;
	unsigned removed = 0;

	for (size_t i = 0; i < p->n_pools; i++) {
		struct frmr_pool *pool = p->pools[i];
		uint64_t aging_ms = (uint64_t)pool->aging_s * 1000, floor = pinned_too ? 0 : pool->pinned;
		bool drop;

		while (pool->queued > floor) {
			struct chunk *c = TAILQ_FIRST(&pool->chunks);

			if (by_age && c->e[c->head].since_ms + aging_ms > now)
				break;
			if (!take_oldest(p, pool, &doomed, &n, &cap))
				break; /* the next round takes the rest */
			if (by_age)
				pool->aged++;
		}
		drop = pool->queued == 0 && pool->in_use == 0 && !pool->custom &&
		       (by_age ? pool->last_use_ms + aging_ms <= now : pinned_too);
		if (drop) {
			pool_free(pool);
			removed++;
			continue;
		}
		p->pools[kept++] = pool;
	}
	p->n_pools = kept;
	for (size_t i = 0; i < n; i++)
		doomed[i]->pool = NULL;
	*ret = doomed;
	if (ret_pools_removed)
		*ret_pools_removed = removed;
	return n;
}

size_t frmr_pools_age(struct frmr_pools *p, struct provider_mr ***ret)
{
	size_t n;

	*ret = NULL;
	if (!p->ready || p->off)
		return 0;
	pthread_mutex_lock(&p->lock);
	n = take_out(p, p->clock(p->clock_data), false, true, ret, NULL);
	pthread_mutex_unlock(&p->lock);
	return n;
}

size_t frmr_pools_drain(struct frmr_pools *p, bool pinned_too, struct provider_mr ***ret,
			unsigned *ret_pools_removed)
{
	size_t n;

	*ret = NULL;
	*ret_pools_removed = 0;
	if (!p->ready || p->off)
		return 0;
	pthread_mutex_lock(&p->lock);
	n = take_out(p, 0, pinned_too, false, ret, ret_pools_removed);
	pthread_mutex_unlock(&p->lock);
	return n;
}

void frmr_pools_destroy(struct provider_mr **handles, size_t n)
{
	for (size_t i = 0; i < n; i++)
		(void)provider_dereg(handles[i]);
	free(handles);
}

static bool matches(const struct frmr_match *m, const struct frmr_key *k)
{
	return (m->access < 0 || m->access == k->access) && (m->odp < 0 || m->odp == k->odp) &&
	       (m->internal < 0 || m->internal == k->internal) &&
	       (m->vendor < 0 || m->vendor == k->vendor) && (m->pages < 0 || (uint64_t)m->pages == k->pages);
}

int frmr_pools_check_settings(int64_t aging_s, int64_t pinned)
{
	if ((aging_s >= 0 && (aging_s < 1 || aging_s > UINT32_MAX)) || pinned > UINT32_MAX)
		return -EINVAL;
	return 0;
}

int frmr_pools_set(struct frmr_pools *p, const struct frmr_match *m, int64_t aging_s,
		   int64_t pinned)
{
	bool every = m->access < 0 && m->odp < 0 && m->internal < 0 && m->vendor < 0 &&
		     m->pages < 0;
	int n = 0;

	if (frmr_pools_check_settings(aging_s, pinned) < 0)
		return -EINVAL;
	if (!p->ready)
		return 0;
	pthread_mutex_lock(&p->lock);
	for (size_t i = 0; i < p->n_pools; i++) {
		struct frmr_pool *pool = p->pools[i];

		if (!matches(m, &pool->key))
			continue;
		if (aging_s >= 0)
			pool->aging_s = (unsigned)aging_s;
		if (pinned >= 0)
			pool->pinned = (unsigned)pinned;
		pool->custom |= !every;
		n++;
	}
	if (every) {
		if (aging_s >= 0)
			p->config.aging_s = (unsigned)aging_s;
		if (pinned >= 0)
			p->config.pinned = (unsigned)pinned;
	}
	pthread_mutex_unlock(&p->lock);
	return n;
}

void frmr_pools_summary(struct frmr_pools *p, struct frmr_pools_config *ret_config,
			uint64_t *ret_queued)
{
	if (!p->ready) {
		*ret_config = p->config;
		*ret_queued = 0;
		return;
	}
	pthread_mutex_lock(&p->lock);
	*ret_config = p->config;
	*ret_queued = p->queued;
	pthread_mutex_unlock(&p->lock);
}

size_t frmr_pools_stats(struct frmr_pools *p, struct frmr_pool_stats *ret, size_t max)
{
	size_t n;

	if (!p->ready)
		return 0;
	pthread_mutex_lock(&p->lock);
	n = p->n_pools;
	for (size_t i = 0; i < n && i < max; i++) {
		const struct frmr_pool *pool = p->pools[i];

		ret[i] = (struct frmr_pool_stats){
			.key = pool->key, .queued = pool->queued, .in_use = pool->in_use,
			.max_in_use = pool->max_in_use, .hits = pool->hits, .misses = pool->misses,
			.aged = pool->aged, .aging_s = pool->aging_s, .pinned = pool->pinned,
		};
	}
	pthread_mutex_unlock(&p->lock);
	return n;
}
