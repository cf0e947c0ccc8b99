/* SPDX-License-Identifier: MIT */
/* libmrd mempools: fixed-size objects in chunks of mrd memory, a free stack under a mutex, and
 * the pool's registration with mrd (seed 000's mempool registration, client half): the MRs mrd
 * returns stay with the pool, so a lookup of a pool object never has to ask mrd. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "call.h"
#include "mrd/mrd.h"

struct chunk {
	uint8_t *base;
	size_t n_objs;
	bool owned; /* allocated by the pool: freed with it */
};

/* A thread's cache of a pool's free objects (DPDK's per-lcore cache): get and put take its lock
 * alone, which only a get that finds no object anywhere else takes too (steal). */
struct tcache {
	int lock;		     /* a spinlock: its owner's, or a stealer's for a moment */
	unsigned n, cap;	     /* n written under lock, read by available() without it */
	mrd_mempool *pool;	     /* NULL once the pool is freed (caches_lock) */
	struct tcache *prev, *next; /* the pool's caches (caches_lock and the pool's lock) */
	void *objs[];
};

struct mrd_mempool {
	mrd_client *client;
	char name[MRD_MEMPOOL_NAME_MAX];
	size_t obj_size, align, stride, n_objs;
	struct chunk *chunks; /* by address, once created */
	size_t n_chunks;
	uint64_t id;	      /* unique in the process: a thread's slot of a freed pool is stale */
	unsigned cache_size; /* each thread's cache holds at most this many (0: none) */

	pthread_mutex_t lock; /* the free stack and the list of caches */
	void **free_objs;
	size_t n_free;
	struct tcache *caches;

	bool registered;
	bool by_lookups; /* a bound handle's (register_bound): mrd keeps no pool of it */
	unsigned epoch; /* the handle's when registered: a reconnect since means mrd forgot it */
	struct mrd_keys *mrs; /* the registration's MRs, by address */
	size_t n_mrs;
};

/* Each thread's caches, one slot a pool: a thread that uses more pools at once goes to the
 * shared stack for the others. */
#define TCACHE_SLOTS 8
#define TCACHE_MAX 64 /* objects a thread's cache of one pool holds at most */
static __thread struct tslot {
	const mrd_mempool *pool;
	uint64_t id;
	struct tcache *cache;
} tslots[TCACHE_SLOTS];
/* Caches made, given back at thread exit, orphaned by a pool's free: rare, so one lock. */
static pthread_mutex_t caches_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t tslots_key; /* its destructor gives a thread's caches back */
static pthread_once_t tslots_once = PTHREAD_ONCE_INIT;
static uint64_t next_pool_id = 1;

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() __asm__ volatile("" ::: "memory")
#endif

static void tcache_lock(struct tcache *c)
{
	while (__atomic_exchange_n(&c->lock, 1, __ATOMIC_ACQUIRE))
		while (__atomic_load_n(&c->lock, __ATOMIC_RELAXED))
			cpu_relax();
}

static void tcache_unlock(struct tcache *c) { __atomic_store_n(&c->lock, 0, __ATOMIC_RELEASE); }

/* A cache's count is written under its lock, but stealers peek at it without: atomic stores. */
static void tcache_set_n(struct tcache *c, unsigned n)
{
	__atomic_store_n(&c->n, n, __ATOMIC_RELAXED);
}

/* Registered with the mrd the handle talks to now: a warm restart forgets registrations. */
static bool is_registered(const mrd_mempool *p)
{
	return p->registered && p->epoch == __atomic_load_n(&p->client->epoch, __ATOMIC_ACQUIRE);
}

static bool is_pow2(size_t x) { return x && !(x & (x - 1)); }

/* What mrd takes (it shows names to root): printable ASCII. */
static bool name_printable(const char *name, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e)
			return false;
	return true;
}

static int pool_new(mrd_client *client, const char *name, size_t n, size_t obj_size,
		    size_t obj_align, mrd_mempool **ret)
{
	mrd_mempool *p;
	size_t len = name ? strlen(name) : 0;

	if (obj_align == 0)
		obj_align = 8;
	if (!client || len == 0 || len >= MRD_MEMPOOL_NAME_MAX ||
	    !name_printable(name, len) || n == 0 || obj_size == 0 || !is_pow2(obj_align))
		return set_last_error(-EINVAL, "mrd_mempool: bad argument (a name of 1 to %d bytes "
				      "of printable ASCII, n and obj_size above 0, obj_align a power "
				      "of two)", MRD_MEMPOOL_NAME_MAX - 1);
	if (obj_size > SIZE_MAX - obj_align || n > SIZE_MAX / sizeof(void *) ||
	    n > SIZE_MAX / ((obj_size + obj_align - 1) & ~(obj_align - 1)))
		return set_last_error(-ENOMEM, "mrd_mempool: %zu objects of %zu bytes pass the "
				      "address space", n, obj_size);
	p = calloc(1, sizeof(*p));
	if (!p)
		return set_last_error(-ENOMEM, "out of memory");
	p->client = client;
	memcpy(p->name, name, len + 1);
	p->obj_size = obj_size;
	p->align = obj_align;
	p->stride = (obj_size + obj_align - 1) & ~(obj_align - 1);
	p->id = __atomic_fetch_add(&next_pool_id, 1, __ATOMIC_RELAXED);
	p->free_objs = calloc(n, sizeof(void *));
	if (!p->free_objs || pthread_mutex_init(&p->lock, NULL) != 0) {
		free(p->free_objs);
		free(p);
		return set_last_error(-ENOMEM, "out of memory");
	}
	*ret = p;
	return 0;
}

/* Carves a chunk into objects, all free. */
static int add_chunk(mrd_mempool *p, uint8_t *base, size_t n_objs, bool owned)
{
	struct chunk *c = realloc(p->chunks, (p->n_chunks + 1) * sizeof(*c));

	if (!c)
		return set_last_error(-ENOMEM, "out of memory");
	p->chunks = c;
	p->chunks[p->n_chunks++] = (struct chunk){ base, n_objs, owned };
	for (size_t i = 0; i < n_objs; i++)
		p->free_objs[p->n_free++] = base + i * p->stride;
	p->n_objs += n_objs;
	return 0;
}

static int chunk_by_base(const void *a, const void *b)
{
	const struct chunk *x = a, *y = b;

	return x->base < y->base ? -1 : x->base > y->base;
}

/* The pool is whole: its chunks by address (put finds an object's chunk by bisection), and
 * a cache in each thread of at most 1/8 of its objects, so that threads' caches hold few of
 * a small pool's. */
static void pool_ready(mrd_mempool *p)
{
	qsort(p->chunks, p->n_chunks, sizeof(*p->chunks), chunk_by_base);
	p->cache_size = p->n_objs / 8 < TCACHE_MAX ? (unsigned)(p->n_objs / 8) : TCACHE_MAX;
}

/* Takes every cache of the pool off it: objects there go with the pool. Their threads free
 * them (at exit, or when the slot is wanted). */
static void orphan_caches(mrd_mempool *p)
{
	pthread_mutex_lock(&caches_lock);
	pthread_mutex_lock(&p->lock);
	for (struct tcache *c = p->caches, *next; c; c = next) {
		next = c->next;
		tcache_lock(c);
		c->pool = NULL;
		tcache_set_n(c, 0);
		c->prev = c->next = NULL;
		tcache_unlock(c);
	}
	p->caches = NULL;
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&caches_lock);
}

MRD_EXPORT mrd_mempool *mrd_mempool_free(mrd_mempool *p)
{
	if (!p)
		return NULL;
	orphan_caches(p);
	if (p->registered)
		(void)mrd_mempool_unregister(p);
	for (size_t i = 0; i < p->n_chunks; i++)
		if (p->chunks[i].owned)
			(void)mrd_mem_free(p->client, p->chunks[i].base);
	pthread_mutex_destroy(&p->lock);
	free(p->chunks);
	free(p->free_objs);
	free(p->mrs);
	free(p);
	return NULL;
}

MRD_EXPORT int mrd_mempool_create(mrd_client *client, const char *name, size_t n,
				  size_t obj_size, size_t obj_align, size_t chunk_size,
				  unsigned mem_flags, mrd_mempool **ret)
{
	size_t per_chunk;
	mrd_mempool *p;
	int r;

	if (!ret)
		return set_last_error(-EINVAL, "mrd_mempool_create: NULL ret");
	r = pool_new(client, name, n, obj_size, obj_align, &p);
	if (r < 0)
		return r;
	per_chunk = chunk_size ? chunk_size / p->stride : n;
	if (per_chunk == 0) {
		mrd_mempool_free(p);
		return set_last_error(-EINVAL, "mrd_mempool_create: chunk_size holds no object");
	}
	while (p->n_objs < n) {
		size_t k = n - p->n_objs < per_chunk ? n - p->n_objs : per_chunk;
		void *mem;

		r = mrd_mem_alloc(client, k * p->stride, obj_align > 4096 ? obj_align : 0, mem_flags,
				  &mem);
		if (r >= 0)
			r = add_chunk(p, mem, k, true);
		if (r < 0) {
			mrd_mempool_free(p);
			return r;
		}
	}
	pool_ready(p);
	*ret = p;
	return 0;
}

MRD_EXPORT int mrd_mempool_create_in(mrd_client *client, const char *name, void *mem,
				     size_t length, size_t obj_size, size_t obj_align,
				     mrd_mempool **ret)
{
	uintptr_t base = (uintptr_t)mem, first;
	mrd_mempool *p;
	size_t n = 0;
	int r;

	if (!ret)
		return set_last_error(-EINVAL, "mrd_mempool_create_in: NULL ret");
	r = pool_new(client, name, 1, obj_size, obj_align, &p);
	if (r < 0)
		return r;
	first = (base + p->align - 1) & ~(p->align - 1);
	if (mem && first - base <= length && length - (first - base) >= p->obj_size)
		n = (length - (first - base) - p->obj_size) / p->stride + 1;
	if (n == 0) {
		mrd_mempool_free(p);
		return set_last_error(-EINVAL, "mrd_mempool_create_in: %s",
				      mem ? "no room for an object" : "NULL memory");
	}
	free(p->free_objs);
	p->free_objs = calloc(n, sizeof(void *));
	r = p->free_objs ? add_chunk(p, (uint8_t *)first, n, false) :
			   set_last_error(-ENOMEM, "out of memory");
	if (r < 0) {
		mrd_mempool_free(p);
		return r;
	}
	pool_ready(p);
	*ret = p;
	return 0;
}

static int give_locked(mrd_mempool *p, void *const *objs, unsigned n);

/* At thread exit: each cache's objects back to its pool, the caches freed. */
static void tslots_release(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&caches_lock);
	for (unsigned i = 0; i < TCACHE_SLOTS; i++) {
		struct tcache *c = tslots[i].cache;
		mrd_mempool *p;

		if (!c)
			continue;
		p = c->pool;
		if (p) {
			pthread_mutex_lock(&p->lock);
			tcache_lock(c); /* a stealer may be in it */
			(void)give_locked(p, c->objs, c->n);
			tcache_set_n(c, 0);
			tcache_unlock(c);
			if (c->prev)
				c->prev->next = c->next;
			else
				p->caches = c->next;
			if (c->next)
				c->next->prev = c->prev;
			pthread_mutex_unlock(&p->lock);
		}
		free(c);
		tslots[i] = (struct tslot){ 0 };
	}
	pthread_mutex_unlock(&caches_lock);
}

static void tslots_init(void) { (void)pthread_key_create(&tslots_key, tslots_release); }

/* The thread's first call on the pool: a cache for it in a free slot (or one whose pool is
 * gone); NULL when none is free or memory is short: the shared stack serves. */
static __attribute__((noinline)) struct tcache *tcache_attach(mrd_mempool *p)
{
	struct tcache *c = NULL;

	pthread_once(&tslots_once, tslots_init);
	pthread_mutex_lock(&caches_lock);
	for (unsigned i = 0; i < TCACHE_SLOTS; i++) {
		struct tslot *s = &tslots[i];

		if (s->cache && s->cache->pool)
			continue;
		free(s->cache); /* its pool was freed */
		*s = (struct tslot){ 0 };
		c = aligned_alloc(64, (sizeof(*c) + p->cache_size * sizeof(void *) + 63) & ~(size_t)63);
		if (!c)
			break;
		*c = (struct tcache){ .cap = p->cache_size, .pool = p };
		pthread_mutex_lock(&p->lock);
		c->next = p->caches;
		if (c->next)
			c->next->prev = c;
		p->caches = c;
		pthread_mutex_unlock(&p->lock);
		*s = (struct tslot){ p, p->id, c };
		(void)pthread_setspecific(tslots_key, tslots); /* so that exit gives it back */
		break;
	}
	pthread_mutex_unlock(&caches_lock);
	return c;
}

/* This thread's cache of the pool, NULL for none. */
static inline struct tcache *tcache_of(mrd_mempool *p)
{
	if (p->cache_size == 0)
		return NULL;
	for (unsigned i = 0; i < TCACHE_SLOTS; i++)
		if (tslots[i].pool == p && tslots[i].id == p->id)
			return tslots[i].cache;
	return tcache_attach(p);
}

/* Up to want objects from the shared stack into objs, then from other threads' caches when it
 * has none left: how many. Called with the pool's lock. */
static unsigned take_locked(mrd_mempool *p, void **objs, unsigned want, const struct tcache *mine)
{
	unsigned got = 0;

	while (got < want && p->n_free > 0)
		objs[got++] = p->free_objs[--p->n_free];
	for (struct tcache *c = p->caches; got < want && c; c = c->next) {
		if (c == mine || __atomic_load_n(&c->n, __ATOMIC_RELAXED) == 0)
			continue;
		tcache_lock(c);
		while (got < want && c->n > 0) {
			objs[got++] = c->objs[c->n - 1];
			tcache_set_n(c, c->n - 1);
		}
		tcache_unlock(c);
	}
	return got;
}

/* Into the shared stack: -EALREADY, saying so, for objects past the pool's size (each was put
 * more often than got); those are dropped. Called with the pool's lock. */
static int give_locked(mrd_mempool *p, void *const *objs, unsigned n)
{
	unsigned i;

	for (i = 0; i < n && p->n_free < p->n_objs; i++)
		p->free_objs[p->n_free++] = objs[i];
	if (i < n)
		return set_last_error(-EALREADY, "mempool '%s': %u more objects put than got (an "
				      "object put already?): all %zu are in already", p->name, n - i,
				      p->n_objs);
	return 0;
}

static int null_pool(const char *call)
{
	return set_last_error(-EINVAL, "%s: NULL pool or objects", call);
}

/* n objects into objs, all or none. */
static int get_objs(mrd_mempool *p, void **objs, unsigned n)
{
	struct tcache *c = tcache_of(p);
	unsigned got = 0, more;
	void *buf[TCACHE_MAX];

	if (c) {
		tcache_lock(c);
		if (c->n >= n) { /* the fast path: the thread's own cache */
			tcache_set_n(c, c->n - n);
			memcpy(objs, &c->objs[c->n], n * sizeof(*objs));
			tcache_unlock(c);
			return 0;
		}
		got = c->n;
		memcpy(objs, c->objs, got * sizeof(*objs));
		tcache_set_n(c, 0);
		tcache_unlock(c);
	}
	/* The rest, and half a cache more to refill it, from the pool. Not with the cache's lock
	 * held: a stealer takes the pool's lock before a cache's. */
	more = c ? c->cap / 2 : 0;
	pthread_mutex_lock(&p->lock);
	got += take_locked(p, objs + got, n - got, c);
	if (got < n) {
		int r = give_locked(p, objs, got); /* none, then */

		pthread_mutex_unlock(&p->lock);
		(void)r;
		if (n == 1)
			return set_last_error(-ENOBUFS, "mempool '%s': all %zu objects are out",
					      p->name, p->n_objs);
		return set_last_error(-ENOBUFS, "mempool '%s': fewer than %u of its %zu objects "
				      "are free", p->name, n, p->n_objs);
	}
	more = take_locked(p, buf, more, c);
	if (more) {
		/* Still under the pool's lock (a stealer's order: pool, then cache): an object in
		 * flight to the cache would be nowhere a get looks, and that get would fail with
		 * objects free. Only its thread adds to the cache: room for more. */
		tcache_lock(c);
		memcpy(&c->objs[c->n], buf, more * sizeof(*buf));
		tcache_set_n(c, c->n + more);
		tcache_unlock(c);
	}
	pthread_mutex_unlock(&p->lock);
	return 0;
}

/* 0, or -EINVAL (saying why) when obj is not the start of one of the pool's objects. */
static int check_obj(const mrd_mempool *p, const void *obj)
{
	uintptr_t a = (uintptr_t)obj, off;
	size_t lo = 0, hi = p->n_chunks;
	const struct chunk *ch;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if ((uintptr_t)p->chunks[mid].base <= a)
			lo = mid;
		else
			hi = mid;
	}
	ch = &p->chunks[lo];
	off = a - (uintptr_t)ch->base;
	if (!obj || a < (uintptr_t)ch->base || off >= ch->n_objs * p->stride)
		return set_last_error(-EINVAL, "%p is not an object of mempool '%s'", obj, p->name);
	off = is_pow2(p->stride) ? off & (p->stride - 1) : off % p->stride;
	if (off)
		return set_last_error(-EINVAL, "%p is %zu bytes into an object of mempool '%s', not "
				      "its start", obj, (size_t)off, p->name);
	return 0;
}

/* n objects back, checked first: all or none. */
static int put_objs(mrd_mempool *p, void *const *objs, unsigned n)
{
	struct tcache *c;
	unsigned out = 0;
	int r;

	for (unsigned i = 0; i < n; i++) {
		r = check_obj(p, objs[i]);
		if (r < 0)
			return r;
	}
	c = tcache_of(p);
	if (!c) {
		pthread_mutex_lock(&p->lock);
		r = give_locked(p, objs, n);
		pthread_mutex_unlock(&p->lock);
		return r;
	}
	tcache_lock(c);
	/* The same object twice in a row: cheap to see, and the commonest double put. */
	if (c->n > 0 && c->objs[c->n - 1] == objs[0]) {
		tcache_unlock(c);
		return set_last_error(-EALREADY, "%p was put already (mempool '%s')", objs[0],
				      p->name);
	}
	if (c->n + n <= c->cap) { /* the fast path */
		memcpy(&c->objs[c->n], objs, n * sizeof(*objs));
		tcache_set_n(c, c->n + n);
		tcache_unlock(c);
		return 0;
	}
	tcache_unlock(c);
	/* Full: the older half goes to the pool (the newer ones stay warm), and what does not fit
	 * with them; more than a cache goes straight to the pool. Both locks at once, the pool's
	 * first (a stealer's order): objects in flight between the two would be nowhere a get
	 * looks, and that get would fail with objects free. Stealers only take from the cache
	 * meanwhile: it has no less room. */
	pthread_mutex_lock(&p->lock);
	tcache_lock(c);
	out = c->cap / 2 < c->n ? c->cap / 2 : c->n;
	if (n <= c->cap - (c->n - out)) {
		unsigned keep = c->n - out;

		r = give_locked(p, c->objs, out);
		memmove(c->objs, &c->objs[out], keep * sizeof(*c->objs));
		memcpy(&c->objs[keep], objs, n * sizeof(*objs));
		tcache_set_n(c, keep + n);
	} else
		r = give_locked(p, objs, n);
	tcache_unlock(c);
	pthread_mutex_unlock(&p->lock);
	return r;
}

MRD_EXPORT void *mrd_mempool_get(mrd_mempool *p)
{
	void *obj;

	if (!p) {
		(void)null_pool("mrd_mempool_get");
		return NULL;
	}
	return get_objs(p, &obj, 1) == 0 ? obj : NULL;
}

MRD_EXPORT int mrd_mempool_put(mrd_mempool *p, void *obj)
{
	if (!p)
		return null_pool("mrd_mempool_put");
	return put_objs(p, &obj, 1);
}

MRD_EXPORT int mrd_mempool_get_bulk(mrd_mempool *p, void **objs, unsigned n)
{
	if (!p || (!objs && n))
		return null_pool("mrd_mempool_get_bulk");
	if (n > p->n_objs)
		return set_last_error(-ENOBUFS, "mempool '%s' has %zu objects, not %u", p->name,
				      p->n_objs, n);
	return n ? get_objs(p, objs, n) : 0;
}

MRD_EXPORT int mrd_mempool_put_bulk(mrd_mempool *p, void *const *objs, unsigned n)
{
	if (!p || (!objs && n))
		return null_pool("mrd_mempool_put_bulk");
	if (n > p->n_objs)
		return set_last_error(-EINVAL, "mempool '%s' has %zu objects, and %u are put",
				      p->name, p->n_objs, n);
	return n ? put_objs(p, objs, n) : 0;
}

MRD_EXPORT size_t mrd_mempool_size(const mrd_mempool *p) { return p ? p->n_objs : 0; }

MRD_EXPORT size_t mrd_mempool_available(mrd_mempool *p)
{
	size_t n;

	if (!p)
		return 0;
	pthread_mutex_lock(&p->lock);
	n = p->n_free;
	for (const struct tcache *c = p->caches; c; c = c->next)
		n += __atomic_load_n(&c->n, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&p->lock);
	return n;
}

/* The ranges to register: the chunks, or each run of objects that touch (extmem). */
static int collect_ranges(const mrd_mempool *p, bool extmem, uint64_t **ret_starts,
			  uint64_t **ret_lengths, size_t *ret_n)
{
	size_t cap = 0, n = 0;
	uint64_t *starts, *lengths;

	for (size_t i = 0; i < p->n_chunks; i++)
		cap += extmem && p->stride != p->obj_size ? p->chunks[i].n_objs : 1;
	starts = calloc(cap, sizeof(*starts));
	lengths = calloc(cap, sizeof(*lengths));
	if (!starts || !lengths) {
		free(starts);
		free(lengths);
		return set_last_error(-ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < p->n_chunks; i++) {
		const struct chunk *c = &p->chunks[i];

		if (!extmem || p->stride == p->obj_size) {
			starts[n] = (uintptr_t)c->base;
			lengths[n++] = c->n_objs * p->stride;
			continue;
		}
		for (size_t k = 0; k < c->n_objs; k++) {
			uint64_t start = (uintptr_t)c->base + k * p->stride;
			long page = sysconf(_SC_PAGESIZE);

			/* An object on the page where the last range ends, or on the next one, extends
			 * that range: mrd registers whole pages, and merges touching ones anyway. */
			if (n > 0 && start / (uint64_t)page <=
					     (starts[n - 1] + lengths[n - 1] - 1) / (uint64_t)page + 1) {
				lengths[n - 1] = start + p->obj_size - starts[n - 1];
				continue;
			}
			starts[n] = start;
			lengths[n++] = p->obj_size;
		}
	}
	*ret_starts = starts;
	*ret_lengths = lengths;
	*ret_n = n;
	return 0;
}

static int by_start(const void *a, const void *b)
{
	const struct mrd_keys *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/* A handle bound to its own PD (mrd_client_bind_pd) registers in that PD: mrd's mempool
 * registry is the domain PD's. The pool's keys are its lookups' over each range, registered
 * now by the domain's policy, which mrd keeps until the memory under them is freed: the
 * pool's own chunks go only with the pool (and mrd_mempool_create_in()'s memory is the
 * caller's to keep). */
static int register_bound(mrd_mempool *p, const uint64_t *starts, const uint64_t *lengths,
			  size_t n)
{
	struct mrd_keys *mrs = NULL, k;
	size_t n_mrs = 0, cap = 0, kept = 0;
	int r = 0;

	for (size_t i = 0; r >= 0 && i < n; i++)
		for (uint64_t a = starts[i]; r >= 0 && a < starts[i] + lengths[i]; a = k.end) {
			r = mrd_keys_query(p->client, (const void *)(uintptr_t)a, &k);
			if (r < 0)
				break;
			if (n_mrs == cap) {
				struct mrd_keys *more = realloc(mrs, (cap ? 2 * cap : 16) * sizeof(*mrs));

				if (!more) {
					r = set_last_error(-ENOMEM, "out of memory");
					break;
				}
				mrs = more;
				cap = cap ? 2 * cap : 16;
			}
			mrs[n_mrs++] = k;
		}
	if (r < 0) {
		free(mrs);
		return r;
	}
	/* By address, each MR once (ranges of one allocation share its MR). */
	qsort(mrs, n_mrs, sizeof(*mrs), by_start);
	for (size_t i = 0; i < n_mrs; i++)
		if (kept == 0 || mrs[i].start != mrs[kept - 1].start)
			mrs[kept++] = mrs[i];
	free(p->mrs);
	p->mrs = mrs;
	p->n_mrs = kept;
	p->registered = true;
	p->by_lookups = true;
	p->epoch = __atomic_load_n(&p->client->epoch, __ATOMIC_ACQUIRE);
	return 0;
}

MRD_EXPORT int mrd_mempool_register(mrd_mempool *p, unsigned flags)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolRegisterRequest q = MRD__MEMPOOL_REGISTER_REQUEST__INIT;
	Mrd__Response *resp;
	struct mrd_keys *mrs;
	uint64_t *starts = NULL, *lengths = NULL;
	size_t n = 0;
	int r;

	if (!p || (flags & ~MRD_MEMPOOL_EXTMEM))
		return set_last_error(-EINVAL, "mrd_mempool_register: bad argument");
	r = client_pd_stale(p->client);
	if (r < 0)
		return r;
	r = collect_ranges(p, flags & MRD_MEMPOOL_EXTMEM, &starts, &lengths, &n);
	if (r < 0)
		return r;
	if (n > MRD_MEMPOOL_RANGES_MAX) {
		free(starts);
		free(lengths);
		return set_last_error(-E2BIG, "mempool '%s' spans %zu ranges; mrd takes at most %u",
				      p->name, n, MRD_MEMPOOL_RANGES_MAX);
	}
	if (p->client->bound_fd >= 0) {
		r = register_bound(p, starts, lengths, n);
		free(starts);
		free(lengths);
		return r;
	}
	q.name = p->name;
	q.starts = starts;
	q.n_starts = n;
	q.lengths = lengths;
	q.n_lengths = n;
	q.extmem = flags & MRD_MEMPOOL_EXTMEM;
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_REGISTER;
	req.mempool_register = &q;
	r = client_call(p->client, &req, &resp, NULL);
	free(starts);
	free(lengths);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_MEMPOOL_REGISTER ||
	    resp->mempool_register->n_entries == 0) {
		mrd__response__free_unpacked(resp, NULL);
		return set_last_error(-EBADMSG, "malformed MempoolRegister reply");
	}
	mrs = calloc(resp->mempool_register->n_entries, sizeof(*mrs));
	if (!mrs) {
		mrd__response__free_unpacked(resp, NULL);
		(void)mrd_mempool_unregister(p);
		return set_last_error(-ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < resp->mempool_register->n_entries; i++) {
		const Mrd__MrEntry *e = resp->mempool_register->entries[i];

		mrs[i] = (struct mrd_keys){ (uintptr_t)e->start, (uintptr_t)e->end, e->lkey, e->rkey };
	}
	free(p->mrs);
	p->mrs = mrs;
	p->n_mrs = resp->mempool_register->n_entries;
	p->registered = true;
	p->epoch = __atomic_load_n(&p->client->epoch, __ATOMIC_ACQUIRE);
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

MRD_EXPORT int mrd_mempool_unregister(mrd_mempool *p)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolUnregisterRequest q = MRD__MEMPOOL_UNREGISTER_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	if (!p)
		return set_last_error(-EINVAL, "mrd_mempool_unregister: NULL pool");
	if ((p->registered && !is_registered(p)) || p->by_lookups)
		goto forget; /* the mrd that had it is gone, or it never had it */
	q.name = p->name;
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_UNREGISTER;
	req.mempool_unregister = &q;
	r = client_call(p->client, &req, &resp, NULL);
	if (r < 0)
		return r;
	mrd__response__free_unpacked(resp, NULL);
forget:
	free(p->mrs);
	p->mrs = NULL;
	p->n_mrs = 0;
	p->registered = false;
	p->by_lookups = false;
	return 0;
}

/* -ESTALE, saying why, for a pool registered with an mrd that has restarted since. */
static int stale(const mrd_mempool *p)
{
	return set_last_error(-ESTALE, "mempool '%s' was registered with mrd before it restarted: "
			      "its keys are gone; mrd_mempool_register() it again", p->name);
}

MRD_EXPORT int mrd_cache_add_mempool(mrd_cache *cache, const mrd_mempool *p)
{
	struct mrd_keys cached;
	int r;

	if (!cache || !p)
		return set_last_error(-EINVAL, "mrd_cache_add_mempool: NULL argument");
	r = client_usable(p->client);
	if (r < 0)
		return r; /* no keys from an mrd that is gone */
	if (!p->registered)
		return set_last_error(-ENOENT, "mempool '%s' is not registered", p->name);
	if (!is_registered(p))
		return stale(p);
	(void)cache_find(cache, 0, &cached); /* a flush first, if the generation moved */
	for (size_t i = 0; i < p->n_mrs; i++)
		cache_insert(cache, &p->mrs[i], false);
	return 0;
}

MRD_EXPORT int mrd_cache_mempool_keys(mrd_cache *cache, const mrd_mempool *p,
				      const void *addr, struct mrd_keys *ret)
{
	uintptr_t a = (uintptr_t)addr;
	size_t lo = 0, hi;
	int r;

	if (!cache || !p || !ret)
		return set_last_error(-EINVAL, "mrd_cache_mempool_keys: NULL argument");
	r = client_usable(p->client);
	if (r < 0)
		return r; /* no keys from an mrd that is gone */
	if (p->registered && !is_registered(p))
		return stale(p);
	if (cache_find(cache, a, ret) == 0)
		return 0;
	/* The pool's own MRs, by address: the last one starting at or below a. */
	hi = p->n_mrs;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (p->mrs[mid].start <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0 || a >= p->mrs[lo - 1].end)
		return set_last_error(-ENOENT, "%p is not in the registration of mempool '%s'%s",
				      addr, p->name, p->registered ? "" : " (not registered)");
	*ret = p->mrs[lo - 1];
	cache_insert(cache, ret, true);
	return 0;
}
