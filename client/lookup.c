/* SPDX-License-Identifier: MIT */
/* libmrd's side of the datapath: asking mrd for keys, and the two-level key cache (DPDK's
 * per-queue MR control): 8 recent entries with an MRU index and a round-robin victim, then a
 * sorted array. When the domain's generation moves, both drop the entries overlapping what the
 * status page's ring says went (everything when the ring cannot tell). */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "call.h"
#include "log.h"
#include "mr-table.h"
#include "mrd/mrd.h"

#define BOTTOM_FIRST 256
#define BOTTOM_MAX 65536

struct mrd_cache {
	struct mrd_cache_hot hot; /* first: mrd_cache_lkey() reads it through the cache pointer */
	struct mr_table bottom;
	mrd_client *client;
	const struct mrd_status_page *status; /* its ring; stays at this address (call.h) */
	unsigned long adopt_gone; /* the handle's when the cache was filled (handle.h) */
	uint64_t n_asked; /* lookups that had to ask mrd */
	int error;	  /* the last ask()'s, hits leave it: mrd_cache_error() */
};
_Static_assert(offsetof(struct mrd_cache, hot) == 0, "mrd_cache_lkey() casts the cache to it");

/* Whether keys hold [a, a + len) whole: a inside, and no more than the rest after it (a range
 * that wraps has more). */
static inline bool covers(const struct mrd_keys *k, uintptr_t a, size_t len)
{
	return a - k->start < k->end - k->start && len <= k->end - a;
}

static const struct mrd_keys failed_keys = { 0, 0, MRD_KEY_INVALID, MRD_KEY_INVALID };

/* One MrLookup of n addresses (lens NULL: each alone). errors NULL: the first failure fails the
 * request, and is returned; else each address's is in errors[i] and the count of those that
 * got keys is returned. */
static int lookup_request(mrd_client *client, const uint64_t *addrs, const uint64_t *lens,
			  size_t n, struct mrd_keys *keys, int *errors)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;
	const Mrd__MrLookupResponse *body;
	uint64_t window[MRD_KEYS_BATCH_MAX], delta[MRD_KEYS_BATCH_MAX];
	Mrd__Response *resp;
	int r, good = 0;

	if (n > MRD_KEYS_BATCH_MAX)
		return set_last_error(-E2BIG, "at most %u addresses in one lookup", MRD_KEYS_BATCH_MAX);
	/* An adopted buffer: mrd knows it at its place in the window. */
	for (size_t i = 0; i < n; i++) {
		delta[i] = adopt_window_delta(client, (uintptr_t)addrs[i]);
		window[i] = addrs[i] + delta[i];
	}
	r = client_pd_stale(client);
	if (r < 0)
		return r;
	q.addresses = window;
	q.n_addresses = n;
	q.lengths = (uint64_t *)lens;
	q.n_lengths = lens ? n : 0;
	q.each_error = errors != NULL;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	/* Again: a device that came back while the call was in flight answered for its new PD. */
	r = client_pd_stale(client);
	body = resp->body_case == MRD__RESPONSE__BODY_MR_LOOKUP ? resp->mr_lookup : NULL;
	if (r == 0 && (!body || body->n_entries != n ||
		       (errors && body->n_errors != n && body->n_errors != 0)))
		r = set_last_error(-EBADMSG, "malformed MrLookup reply");
	for (size_t i = 0; r == 0 && i < n; i++) {
		const Mrd__MrEntry *e = body->entries[i];
		int k = errors && body->n_errors ? body->errors[i] : 0;

		if (k > 0)
			k = -EBADMSG;
		if (k == 0 && (window[i] < e->start || window[i] >= e->end))
			k = set_last_error(-EBADMSG, "malformed MrLookup reply");
		else if (k == 0 && lens && (lens[i] > e->end - window[i]))
			/* An mrd before range lookups answered for the address alone. */
			k = set_last_error(-EOPNOTSUPP, "this mrd answers no range lookup (it "
					   "predates them)");
		if (k < 0 && !errors) {
			r = k;
			break;
		}
		if (errors)
			errors[i] = k;
		if (k < 0) {
			keys[i] = failed_keys;
			continue;
		}
		keys[i] = (struct mrd_keys){ (uintptr_t)(e->start - delta[i]),
					     (uintptr_t)(e->end - delta[i]), e->lkey, e->rkey };
		good++;
		log_debug("lookup of 0x%" PRIx64 " asked mrd: [0x%" PRIx64 ", 0x%" PRIx64
			  ") lkey 0x%08x rkey 0x%08x", addrs[i], e->start, e->end, e->lkey, e->rkey);
	}
	mrd__response__free_unpacked(resp, NULL);
	return r < 0 ? r : good;
}

MRD_EXPORT int mrd_keys_query(mrd_client *client, const void *addr, struct mrd_keys *ret)
{
	uint64_t address = (uintptr_t)addr;
	int r;

	if (!client || !ret)
		return set_last_error(-EINVAL, "mrd_keys_query: NULL argument");
	r = lookup_request(client, &address, NULL, 1, ret, NULL);
	return r < 0 ? r : 0;
}

/* -EINVAL unless [addr, addr + len) is a range: not empty, not past the address space. */
static int check_range(const char *who, const void *addr, size_t len)
{
	if (len == 0 || (uintptr_t)addr + len < (uintptr_t)addr)
		return set_last_error(-EINVAL, "%s: [%p, +%zu) is empty or wraps", who, addr, len);
	return 0;
}

MRD_EXPORT int mrd_keys_query_range(mrd_client *client, const void *addr, size_t len,
				    struct mrd_keys *ret)
{
	uint64_t address = (uintptr_t)addr, length = len;
	int r;

	if (!client || !ret)
		return set_last_error(-EINVAL, "mrd_keys_query_range: NULL argument");
	r = check_range("mrd_keys_query_range", addr, len);
	if (r == 0)
		r = lookup_request(client, &address, &length, 1, ret, NULL);
	return r < 0 ? r : 0;
}

MRD_EXPORT int mrd_keys_query_batch(mrd_client *client, const void *const addrs[],
				    const size_t lens[], size_t n, struct mrd_keys keys[],
				    int errors[])
{
	uint64_t address[MRD_KEYS_BATCH_MAX], length[MRD_KEYS_BATCH_MAX];
	int each[MRD_KEYS_BATCH_MAX];
	int r;

	if (!client || !addrs || !keys || n == 0)
		return set_last_error(-EINVAL, "mrd_keys_query_batch: NULL argument or no address");
	if (n > MRD_KEYS_BATCH_MAX)
		return set_last_error(-E2BIG, "mrd_keys_query_batch: %zu addresses, at most %u in "
				      "one request: split the batch", n, MRD_KEYS_BATCH_MAX);
	for (size_t i = 0; i < n; i++) {
		address[i] = (uintptr_t)addrs[i];
		length[i] = lens ? lens[i] : 0;
		if (lens && (r = check_range("mrd_keys_query_batch", addrs[i], lens[i])) < 0)
			return r;
	}
	r = lookup_request(client, address, lens ? length : NULL, n, keys, each);
	if (r >= 0 && errors)
		memcpy(errors, each, n * sizeof(*errors));
	return r;
}

static void flush(mrd_cache *c)
{
	memset(c->hot.top, 0, sizeof(c->hot.top));
	c->hot.mru = c->hot.head = 0;
	mr_table_clear(&c->bottom);
}

MRD_EXPORT int mrd_cache_new(mrd_client *client, mrd_cache **ret)
{
	mrd_cache *c;
	int r;

	if (!client || !ret)
		return set_last_error(-EINVAL, "mrd_cache_new: NULL argument");
	/* On a cache line of its own, wherever the heap stands: the hot part's place decided
	 * whether a top-half hit ran 1.2x or 2.2x the plain scan (lookup-top-random8). */
	c = aligned_alloc(64, (sizeof(*c) + 63) & ~(size_t)63);
	if (!c)
		return set_last_error(-ENOMEM, "out of memory");
	memset(c, 0, sizeof(*c));
	r = mr_table_init(&c->bottom, BOTTOM_FIRST, BOTTOM_MAX);
	if (r < 0) {
		free(c);
		return set_last_error(r, "out of memory");
	}
	c->client = client;
	c->status = client->status;
	c->hot.generation_ptr = &client->status->generation;
	c->hot.generation = *c->hot.generation_ptr;
	c->adopt_gone = __atomic_load_n(&client->adopt_gone, __ATOMIC_ACQUIRE);
	*ret = c;
	return 0;
}

MRD_EXPORT mrd_cache *mrd_cache_free(mrd_cache *c)
{
	if (!c)
		return NULL;
	mr_table_done(&c->bottom);
	free(c);
	return NULL;
}

MRD_EXPORT uint64_t mrd_cache_asked(const mrd_cache *c)
{
	return c ? c->n_asked : 0;
}

static void top_insert(mrd_cache *c, const struct mrd_keys *keys)
{
	c->hot.top[c->hot.head] = *keys;
	c->hot.mru = c->hot.head;
	c->hot.head = (c->hot.head + 1) % MRD_CACHE_TOP;
}

/* Drops every cached entry overlapping [start, end). */
static void drop_range(mrd_cache *c, uint64_t start, uint64_t end)
{
	for (unsigned i = 0; i < MRD_CACHE_TOP; i++)
		if (c->hot.top[i].start < end && c->hot.top[i].end > start)
			c->hot.top[i] = (struct mrd_keys){ 0 };
	(void)mr_table_remove_range(&c->bottom, start, end);
}

/* Reads the record of generation g from the ring: false when it is not there any more (the
 * ring lapped it, or it is being written over). */
static bool read_freed(const struct mrd_status_page *page, uint64_t g, uint64_t *ret_start,
		       uint64_t *ret_end)
{
	const struct mrd_status_freed *f = &page->freed[g % MRD_STATUS_FREED];

	if (__atomic_load_n(&f->generation, __ATOMIC_ACQUIRE) != g)
		return false;
	/* Acquired: a bound being written over shows its mark in the second look at whose the
	 * record is, which cannot come first (mrd's seqlock, status-page.h). */
	*ret_start = __atomic_load_n(&f->start, __ATOMIC_ACQUIRE);
	*ret_end = __atomic_load_n(&f->end, __ATOMIC_ACQUIRE);
	return __atomic_load_n(&f->generation, __ATOMIC_RELAXED) == g;
}

/* The domain moved from the cache's generation to now: drops only what the frees in between
 * made stale when the ring still holds each, everything otherwise. Dropping a record's range
 * before finding a later one gone costs nothing: all goes then. Out of line and cold: inlined
 * into the top half's scan it made that scan's hit twice as slow (make bench:
 * lookup-top-random8 2.2x the plain scan against 1.2x). */
static __attribute__((noinline, cold)) void catch_up(mrd_cache *c, uint64_t now)
{
	const struct mrd_status_page *page = c->status;
	uint64_t from = c->hot.generation, start, end;

	c->hot.generation = now;
	if (__atomic_load_n(&c->client->adopt_gone, __ATOMIC_ACQUIRE) != c->adopt_gone) {
		/* An adopted buffer went: the ring names it at mrd's address, not ours. */
		c->adopt_gone = __atomic_load_n(&c->client->adopt_gone, __ATOMIC_ACQUIRE);
		flush(c);
		return;
	}
	/* Below from: a poisoned page's, or a page before it (a reconnect). */
	if (page->layout_version < 2 || now < from || now - from > MRD_STATUS_FREED) {
		flush(c);
		return;
	}
	for (uint64_t g = from + 1; g <= now; g++) {
		if (!read_freed(page, g, &start, &end) || (start == 0 && end == UINT64_MAX)) {
			flush(c);
			return;
		}
		drop_range(c, start, end);
	}
}

/* The top half, after the generation check: most lookups that miss the MRU end here. */
static inline bool top_find(mrd_cache *c, uintptr_t a, struct mrd_keys *ret)
{
	uint64_t generation = __atomic_load_n(c->hot.generation_ptr, __ATOMIC_ACQUIRE);

	/* Keys of the domain died since we cached: those overlapping what went go. */
	if (generation != c->hot.generation)
		catch_up(c, generation);
	for (unsigned i = 0; i < MRD_CACHE_TOP; i++)
		if (a >= c->hot.top[i].start && a < c->hot.top[i].end) {
			c->hot.mru = i;
			*ret = c->hot.top[i];
			return true;
		}
	return false;
}

/* The bottom half, which refills the top on a hit. */
static int bottom_find(mrd_cache *c, uintptr_t a, struct mrd_keys *ret)
{
	const struct mr_entry *e = mr_table_lookup(&c->bottom, a);

	if (!e)
		return -ENOENT;
	*ret = (struct mrd_keys){ (uintptr_t)e->start, (uintptr_t)e->end, e->lkey, e->rkey };
	top_insert(c, ret);
	return 0;
}

int cache_find(mrd_cache *c, uintptr_t a, struct mrd_keys *ret)
{
	return top_find(c, a, ret) ? 0 : bottom_find(c, a, ret);
}

void cache_insert(mrd_cache *c, const struct mrd_keys *keys, bool top)
{
	struct mr_entry fresh = { keys->start, keys->end, keys->lkey, keys->rkey };
	int r;

	/* A range's MR may overlap entries (policy page's pages): they go, the table stays
	 * disjoint and its search exact. */
	(void)mr_table_remove_range(&c->bottom, keys->start, keys->end);
	r = mr_table_insert(&c->bottom, &fresh);

	if (r == -ENOSPC) {
		/* Full at its ceiling: a cache may forget everything and start over. */
		mr_table_clear(&c->bottom);
		(void)mr_table_insert(&c->bottom, &fresh);
	}
	if (top)
		top_insert(c, keys);
}

/* Nothing cached holds addr: mrd answers, and both halves keep it. */
static int ask(mrd_cache *c, const void *addr, struct mrd_keys *ret)
{
	int r;

	c->n_asked++;
	r = mrd_keys_query(c->client, addr, ret);
	if (r >= 0)
		cache_insert(c, ret, true);
	return r;
}

MRD_EXPORT int mrd_cache_keys(mrd_cache *c, const void *addr, struct mrd_keys *ret)
{
	return cache_find(c, (uintptr_t)addr, ret) == 0 ? 0 : (c->error = ask(c, addr, ret));
}

MRD_EXPORT int mrd_cache_error(const mrd_cache *c)
{
	return c ? c->error : set_last_error(-EINVAL, "mrd_cache_error: NULL cache");
}

/* The top half's entry covering [a, a + len), after the generation check (as top_find). */
static inline bool top_find_range(mrd_cache *c, uintptr_t a, size_t len, struct mrd_keys *ret)
{
	uint64_t generation = __atomic_load_n(c->hot.generation_ptr, __ATOMIC_ACQUIRE);

	if (generation != c->hot.generation)
		catch_up(c, generation);
	for (unsigned i = 0; i < MRD_CACHE_TOP; i++)
		if (covers(&c->hot.top[i], a, len)) {
			c->hot.mru = i;
			*ret = c->hot.top[i];
			return true;
		}
	return false;
}

/* A miss: mrd registers the range when no MR covers it, and both halves keep the answer (the
 * bottom half without the entries it overlaps, which stays a table of disjoint ranges). */
static __attribute__((noinline)) int ask_range(mrd_cache *c, const void *addr, size_t len,
					       struct mrd_keys *ret)
{
	const struct mr_entry *e = mr_table_lookup(&c->bottom, (uintptr_t)addr);
	struct mrd_keys k;
	int r = check_range("mrd_cache_keys_range", addr, len);

	if (r < 0)
		return r;
	if (e) {
		k = (struct mrd_keys){ (uintptr_t)e->start, (uintptr_t)e->end, e->lkey, e->rkey };
		if (covers(&k, (uintptr_t)addr, len)) {
			*ret = k;
			top_insert(c, ret);
			return 0;
		}
	}
	c->n_asked++;
	r = mrd_keys_query_range(c->client, addr, len, ret);
	if (r >= 0)
		cache_insert(c, ret, true);
	return r;
}

MRD_EXPORT int mrd_cache_keys_range(mrd_cache *c, const void *addr, size_t len,
				    struct mrd_keys *ret)
{
	/* len 0 goes to the miss path, which refuses it. */
	return len && top_find_range(c, (uintptr_t)addr, len, ret) ? 0 :
	       ask_range(c, addr, len, ret);
}

MRD_EXPORT uint32_t mrd_cache_lkey_slow(mrd_cache *c, const void *addr)
{
	struct mrd_keys keys;

	/* The top half inline, with no call: most lookups that miss the MRU end there. */
	if (top_find(c, (uintptr_t)addr, &keys) || bottom_find(c, (uintptr_t)addr, &keys) == 0 ||
	    (c->error = ask(c, addr, &keys)) == 0)
		return keys.lkey;
	return MRD_KEY_INVALID;
}

/* mrd queues at most 4 Dma requests per domain and refuses more with -EBUSY, not done. Those
 * are other callers' (threads of this or other handles, processes of the same user), and the
 * caller could only ask again: libmrd does, backing off from 1 ms to
 * 16 ms (short, or callers that never stop asking take every slot first), until it has waited
 * DMA_BUSY_WAIT_USEC in all. */
#define DMA_BUSY_WAIT_USEC (10 * 1000000u)

MRD_EXPORT int mrd_dma(mrd_client *client, int op, uint32_t lkey, const void *laddr,
		       uint32_t rkey, const void *raddr, size_t length)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DmaRequest q = MRD__DMA_REQUEST__INIT;
	unsigned waited = 0, backoff = 1000;
	Mrd__Response *resp;
	int r;

	if (!client || (op != MRD_DMA_WRITE && op != MRD_DMA_READ))
		return set_last_error(-EINVAL, "mrd_dma: bad argument");
	q.op = (uint32_t)op;
	q.lkey = lkey;
	q.laddr = (uintptr_t)laddr;
	q.rkey = rkey;
	q.raddr = (uintptr_t)raddr;
	q.length = length;
	req.body_case = MRD__REQUEST__BODY_DMA;
	req.dma = &q;
	while ((r = client_call(client, &req, &resp, NULL)) == -EBUSY &&
	       waited < DMA_BUSY_WAIT_USEC) {
		usleep(backoff);
		waited += backoff;
		backoff = backoff < 16000 ? backoff * 2 : backoff;
	}
	if (r == -EBUSY)
		return set_last_error(r, "mrd_dma: 4 mrd_dma() calls of the domain (other handles') "
				      "kept waiting for %u s: not done", DMA_BUSY_WAIT_USEC / 1000000);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_DMA)
		r = set_last_error(-EBADMSG, "malformed Dma reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_prefetch(mrd_client *client, const void *addr, size_t length, int advice,
			    unsigned flags)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PrefetchRequest q = MRD__PREFETCH_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	if (!client || advice < MRD_PREFETCH || advice > MRD_PREFETCH_NO_FAULT ||
	    (flags & ~MRD_PREFETCH_FLUSH))
		return set_last_error(-EINVAL, "mrd_prefetch: bad argument");
	q.address = (uintptr_t)addr;
	q.length = length;
	q.advice = (uint32_t)advice;
	q.flush = flags & MRD_PREFETCH_FLUSH;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_PREFETCH)
		r = set_last_error(-EBADMSG, "malformed Prefetch reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}
