/* SPDX-License-Identifier: MIT */
/* libmrd mempools against a real mrd: objects from chunks, get/put from threads, registration
 * and its errors, populate, mempool-aware lookups (no request to mrd) with keys checked by
 * emulated DMA, extmem pools registering only the pages their objects use, and what a client
 * that dies leaves behind. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define KiB (1ul << 10)
#define MiB (1ul << 20)

static struct mrd_proc mrd;
static char out[65536];

static void setup(void)
{
	ck_assert_int_eq(mrd_proc_start(&mrd, "[memory]\nhugepages = no\narena_size = 64M\n", NULL),
			 0);
}

static void teardown(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}

static mrd_client *connect_ok(void)
{
	mrd_client *c = NULL;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	return c;
}

/* mrctl's output for args (text or --json). */
static const char *mrctl(const char *what, bool json)
{
	char path[512];
	const char *argv[] = { test_build_path("mrctl", path, sizeof(path)), "--socket", mrd.socket,
			       json ? "--json" : what, json ? what : NULL, NULL };

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	return out;
}

static unsigned long json_number(const char *json, const char *key)
{
	const char *p = strstr(json, key);

	ck_assert_msg(p != NULL, "no %s in %s", key, json);
	return strtoul(p + strlen(key), NULL, 10);
}

START_TEST(test_objects)
{
	mrd_client *c = connect_ok();
	mrd_mempool *p = NULL;
	void *objs[100];

	/* 100 objects of 100 bytes aligned to 64, 16 to a 2 KiB chunk: 7 chunks. */
	ck_assert_int_eq(mrd_mempool_create(c, "objs", 100, 100, 64, 2 * KiB, 0, &p), 0);
	ck_assert_uint_eq(mrd_mempool_size(p), 100);
	for (int i = 0; i < 100; i++) {
		objs[i] = mrd_mempool_get(p);
		ck_assert_ptr_nonnull(objs[i]);
		ck_assert_uint_eq((uintptr_t)objs[i] % 64, 0);
		memset(objs[i], i, 100);
	}
	ck_assert_ptr_null(mrd_mempool_get(p));
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "all 100 objects are out"));
	/* No two objects overlap: each still holds its own bytes. */
	for (int i = 0; i < 100; i++)
		for (int k = 0; k < 100; k++)
			ck_assert_uint_eq(((uint8_t *)objs[i])[k], (uint8_t)i);
	for (int i = 0; i < 100; i++)
		mrd_mempool_put(p, objs[i]);
	ck_assert_uint_eq(mrd_mempool_available(p), 100);
	mrd_mempool_free(p);

	ck_assert_int_eq(mrd_mempool_create(c, "", 1, 8, 0, 0, 0, &p), -EINVAL);
	ck_assert_int_eq(mrd_mempool_create(c, "rx\x1b[2J", 1, 8, 0, 0, 0, &p), -EINVAL);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "printable ASCII"));
	ck_assert_int_eq(mrd_mempool_create(c, "x", 1, 8, 3, 0, 0, &p), -EINVAL);
	ck_assert_int_eq(mrd_mempool_create(c, "x", 4, 64, 0, 32, 0, &p), -EINVAL);
	mrd_client_close(c);
}
END_TEST

struct churn {
	mrd_mempool *pool;
	int fails;
};

static void *churn_thread(void *arg)
{
	struct churn *ch = arg;
	void *mine[16];

	for (int round = 0; round < 2000; round++) {
		for (int i = 0; i < 16; i++) {
			mine[i] = mrd_mempool_get(ch->pool);
			if (!mine[i]) {
				ch->fails++;
				return NULL;
			}
			*(volatile uint64_t *)mine[i] = (uintptr_t)mine[i];
		}
		for (int i = 0; i < 16; i++) {
			if (*(volatile uint64_t *)mine[i] != (uintptr_t)mine[i])
				ch->fails++; /* another thread held the same object */
			mrd_mempool_put(ch->pool, mine[i]);
		}
	}
	return NULL;
}

START_TEST(test_threads)
{
	mrd_client *c = connect_ok();
	struct churn ch[4];
	pthread_t t[4];
	mrd_mempool *p;

	ck_assert_int_eq(mrd_mempool_create(c, "threads", 64, 64, 0, 0, 0, &p), 0);
	for (int i = 0; i < 4; i++) {
		ch[i] = (struct churn){ .pool = p };
		ck_assert_int_eq(pthread_create(&t[i], NULL, churn_thread, &ch[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(pthread_join(t[i], NULL), 0);
		ck_assert_int_eq(ch[i].fails, 0);
	}
	ck_assert_uint_eq(mrd_mempool_available(p), 64);
	mrd_mempool_free(p);
	mrd_client_close(c);
}
END_TEST

/* Threads mixing single and bulk get/put through their caches, some exiting with objects
 * cached: each object is held by one thread at a time (a mark in it says whose), and when all
 * are joined every object is back, once. */
#define STRESS_OBJS 512
#define STRESS_THREADS 4

struct stress {
	mrd_mempool *pool;
	unsigned id, rounds;
	int fails;
};

static void *stress_thread(void *arg)
{
	struct stress *st = arg;
	void *mine[48];

	for (unsigned round = 0; round < st->rounds; round++) {
		unsigned n = 1 + round % 48, got = 0;

		if (round % 3 == 0) {
			if (mrd_mempool_get_bulk(st->pool, mine, n) == 0)
				got = n;
		} else
			while (got < n && (mine[got] = mrd_mempool_get(st->pool)))
				got++;
		for (unsigned i = 0; i < got; i++)
			*(volatile uintptr_t *)mine[i] = (uintptr_t)mine[i] ^ st->id;
		for (unsigned i = 0; i < got; i++)
			if (*(volatile uintptr_t *)mine[i] != ((uintptr_t)mine[i] ^ st->id))
				st->fails++; /* another thread holds it too */
		/* Even rounds give back in one bulk, odd ones one by one. */
		if (round % 2 == 0 ? mrd_mempool_put_bulk(st->pool, mine, got) != 0 : 0)
			st->fails++;
		else if (round % 2)
			for (unsigned i = 0; i < got; i++)
				if (mrd_mempool_put(st->pool, mine[i]) != 0)
					st->fails++;
	}
	return NULL; /* exits with its cache full: given back */
}

static int by_address(const void *a, const void *b)
{
	uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;

	return x < y ? -1 : x > y;
}

struct taker {
	mrd_mempool *pool;
	unsigned n;
	int r;
};

/* Takes n objects at once and puts them back: they sit in its cache as it exits. */
static void *taker_thread(void *arg)
{
	struct taker *tk = arg;
	void *objs[64];

	tk->r = mrd_mempool_get_bulk(tk->pool, objs, tk->n);
	if (tk->r == 0)
		tk->r = mrd_mempool_put_bulk(tk->pool, objs, tk->n);
	return NULL;
}

START_TEST(test_cache_stress)
{
	mrd_client *c = connect_ok();
	struct stress st[STRESS_THREADS];
	pthread_t t[STRESS_THREADS];
	static void *all[STRESS_OBJS + 1];
	mrd_mempool *p;

	ck_assert_int_eq(mrd_mempool_create(c, "stress", STRESS_OBJS, 64, 0, 4 * KiB, 0, &p), 0);
	for (int wave = 0; wave < 3; wave++) {
		for (unsigned i = 0; i < STRESS_THREADS; i++) {
			st[i] = (struct stress){ .pool = p, .id = i + 1, .rounds = 3000 };
			ck_assert_int_eq(pthread_create(&t[i], NULL, stress_thread, &st[i]), 0);
		}
		/* This thread too, its cache kept across waves. */
		{
			struct stress me = { .pool = p, .id = 99, .rounds = 500 };

			stress_thread(&me);
			ck_assert_int_eq(me.fails, 0);
		}
		for (unsigned i = 0; i < STRESS_THREADS; i++) {
			ck_assert_int_eq(pthread_join(t[i], NULL), 0);
			ck_assert_int_eq(st[i].fails, 0);
		}
		ck_assert_uint_eq(mrd_mempool_available(p), STRESS_OBJS);
	}
	/* Every object once: all of them out in one bulk, none twice, then no more. */
	ck_assert_int_eq(mrd_mempool_get_bulk(p, all, STRESS_OBJS), 0);
	ck_assert_ptr_null(mrd_mempool_get(p));
	ck_assert_int_eq(mrd_mempool_get_bulk(p, all + STRESS_OBJS, 1), -ENOBUFS);
	qsort(all, STRESS_OBJS, sizeof(*all), by_address);
	for (unsigned i = 1; i < STRESS_OBJS; i++)
		ck_assert_ptr_ne(all[i], all[i - 1]);
	ck_assert_int_eq(mrd_mempool_put_bulk(p, all, STRESS_OBJS), 0);
	ck_assert_uint_eq(mrd_mempool_available(p), STRESS_OBJS);
	/* Freed with objects in this thread's cache and in no one else's; a new pool at the same
	 * address gets no stale cache. */
	ck_assert_ptr_nonnull(all[0] = mrd_mempool_get(p));
	ck_assert_int_eq(mrd_mempool_put(p, all[0]), 0);
	/* Free objects only in this thread's cache: another thread's get takes them. */
	ck_assert_int_eq(mrd_mempool_get_bulk(p, all, STRESS_OBJS), 0);
	for (unsigned i = 0; i < 8; i++)
		ck_assert_int_eq(mrd_mempool_put(p, all[i]), 0);
	ck_assert_uint_eq(mrd_mempool_available(p), 8);
	{
		struct taker tk = { .pool = p, .n = 8 };
		pthread_t th;

		ck_assert_int_eq(pthread_create(&th, NULL, taker_thread, &tk), 0);
		ck_assert_int_eq(pthread_join(th, NULL), 0);
		ck_assert_int_eq(tk.r, 0);
		ck_assert_uint_eq(mrd_mempool_available(p), 8); /* back, from its exit */
	}
	ck_assert_int_eq(mrd_mempool_put_bulk(p, all + 8, STRESS_OBJS - 8), 0);
	ck_assert_uint_eq(mrd_mempool_available(p), STRESS_OBJS);
	mrd_mempool_free(p);
	ck_assert_int_eq(mrd_mempool_create(c, "again", 64, 64, 0, 0, 0, &p), 0);
	ck_assert_uint_eq(mrd_mempool_available(p), 64);
	ck_assert_int_eq(mrd_mempool_get_bulk(p, all, 64), 0);
	ck_assert_int_eq(mrd_mempool_put_bulk(p, all, 64), 0);
	ck_assert_uint_eq(mrd_mempool_available(p), 64);
	mrd_mempool_free(p);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_register_populate_lookup)
{
	mrd_client *c = connect_ok();
	mrd_cache *l;
	struct mrd_keys mr, first;
	mrd_mempool *rx, *tx;
	unsigned long asked;
	uint8_t *a, *b;

	/* 4 chunks of 64 KiB: each its own allocation, each its own MR. */
	ck_assert_int_eq(mrd_mempool_create(c, "rx", 256, 1 * KiB, 0, 64 * KiB, 0, &rx), 0);
	ck_assert_int_eq(mrd_mempool_create(c, "tx", 64, 1 * KiB, 0, 0, 0, &tx), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_add_mempool(l, rx), -ENOENT);
	ck_assert_int_eq(mrd_mempool_register(rx, 0), 0);
	ck_assert_int_eq(mrd_mempool_register(rx, 0), -EEXIST);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "registered already"));
	ck_assert_int_eq(mrd_mempool_register(tx, 0), 0);
	ck_assert_int_eq(mrd_cache_add_mempool(l, rx), 0);

	asked = json_number(mrctl("clients", true), "\"lookups\":");
	a = mrd_mempool_get(rx);
	b = mrd_mempool_get(tx);
	/* Populated: every object of rx hits without asking anyone. */
	for (int i = 0; i < 256; i++) {
		uint8_t *o = mrd_mempool_get(rx);

		if (!o)
			break;
		ck_assert_int_eq(mrd_cache_keys(l, o, &mr), 0);
		ck_assert_uint_le(mr.start, (uintptr_t)o);
		ck_assert_uint_gt(mr.end, (uintptr_t)o + 1 * KiB - 1);
	}
	/* tx was not populated: the mempool-aware lookup takes its key from the pool. */
	ck_assert_int_eq(mrd_cache_mempool_keys(l, tx, b, &mr), 0);
	ck_assert_uint_eq(mrd_cache_asked(l), 0);
	ck_assert_uint_eq(json_number(mrctl("clients", true), "\"lookups\":"), asked);
	/* The keys move bytes: rx object a to tx object b. */
	memcpy(a, "pool to pool", 13);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, rx, a, &first), 0);
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, first.lkey, a, mr.rkey, b, 13), 0);
	ck_assert_str_eq((char *)b, "pool to pool");
	/* An address of another pool is not this pool's. */
	ck_assert_int_eq(mrd_cache_mempool_keys(l, tx, a, &mr), 0); /* cached: found in l */
	mrd_cache_free(l);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, tx, a, &mr), -ENOENT);

	/* Unregistered: keys dead, the pool's memory free to go. */
	ck_assert_int_eq(mrd_mempool_unregister(rx), 0);
	ck_assert_int_eq(mrd_mempool_unregister(rx), -ENOENT);
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, first.lkey, a, first.rkey, a + 64, 8), -ENOKEY);
	mrd_cache_free(l);
	mrd_mempool_free(rx);
	mrd_mempool_free(tx); /* unregisters too */
	ck_assert_ptr_nonnull(strstr(mrctl("mempools", false), "no mempools"));
	mrd_client_close(c);
}
END_TEST

START_TEST(test_extmem_pool)
{
	mrd_client *c = connect_ok();
	int fd = memfd_create("pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	struct mrd_keys mr;
	mrd_cache *l;
	mrd_mempool *p;
	uint8_t *mem;
	const char *json;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 1 * MiB), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(mrd_extmem_attach(c, fd, 0, 1 * MiB, (void **)&mem), 0);
	/* 32 objects of 256 bytes, one every 32 KiB: 32 of the 256 pages in use. */
	ck_assert_int_eq(mrd_mempool_create_in(c, "ext", mem, 1 * MiB, 256, 32 * KiB, &p), 0);
	ck_assert_uint_eq(mrd_mempool_size(p), 32);
	ck_assert_int_eq(mrd_mempool_register(p, 0), 0); /* the whole chunk first */
	ck_assert_int_eq(mrd_mempool_register(p, MRD_MEMPOOL_EXTMEM), 0); /* replaced */
	ck_assert_int_eq(mrd_mempool_register(p, MRD_MEMPOOL_EXTMEM), -EEXIST);
	json = mrctl("mempools", true);
	ck_assert_msg(strstr(json, "\"extmem\":true") != NULL, "%s", json);
	ck_assert_uint_eq(json_number(mrctl("clients", true), "\"pinned_bytes\":"), 32 * 4 * KiB);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, p, mem + 32 * KiB + 255, &mr), 0);
	ck_assert_uint_eq(mr.start, (uintptr_t)mem + 32 * KiB);
	ck_assert_uint_eq(mr.end, (uintptr_t)mem + 36 * KiB);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, p, mem + 4 * KiB, &mr), -ENOENT);
	/* Attached memory under a registered pool cannot go. */
	ck_assert_int_eq(mrd_extmem_detach(c, mem), -EBUSY);
	mrd_mempool_free(p);
	ck_assert_int_eq(mrd_extmem_detach(c, mem), 0);
	mrd_cache_free(l);
	mrd_client_close(c);
	close(fd);
}
END_TEST

/* Objects on adjacent pages merge into one range before mrd sees them: 2050 objects of 2000
 * bytes make one range, not one a page (which would pass mrd's 1024). */
START_TEST(test_extmem_ranges_merge)
{
	mrd_client *c = connect_ok();
	mrd_cache *l;
	struct mrd_keys mr;
	mrd_mempool *p;
	uint8_t *mem;

	ck_assert_int_eq(mrd_mem_alloc(c, 8 * MiB, 0, 0, (void **)&mem), 0);
	ck_assert_int_eq(mrd_mempool_create_in(c, "dense", mem, 2050 * 2048, 2000, 2048, &p), 0);
	ck_assert_uint_eq(mrd_mempool_size(p), 2050);
	ck_assert_int_eq(mrd_mempool_register(p, MRD_MEMPOOL_EXTMEM), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, p, mem + 2049 * 2048 + 1999, &mr), 0);
	ck_assert_uint_eq(mr.start, (uintptr_t)mem);
	mrd_cache_free(l);
	mrd_mempool_free(p);
	ck_assert_int_eq(mrd_mem_free(c, mem), 0);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_death_releases_pools)
{
	mrd_client *c = connect_ok();
	mrd_mempool *p;
	pid_t pid;
	int status;

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		mrd_client *child = NULL;

		test_fork_child_of_threads();
		if (mrd_client_connect(mrd.socket, &child) < 0 ||
		    mrd_mempool_create(child, "child", 64, 4 * KiB, 0, 0, 0, &p) < 0 ||
		    mrd_mempool_register(p, 0) < 0)
			_exit(1);
		_exit(0); /* dies with its pool registered */
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	/* mrd noticed, and took its registration and memory back. */
	test_wait_until(strstr(mrctl("mempools", false), "no mempools"), 10000);
	ck_assert_ptr_nonnull(strstr(mrctl("mempools", false), "no mempools"));
	ck_assert_uint_eq(json_number(mrctl("clients", true), "\"pinned_bytes\":"), 0);
	mrd_client_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("libmrd-mempool");
	TCase *tc = tcase_create("mempool");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_objects);
	tcase_add_test(tc, test_threads);
	tcase_add_test(tc, test_cache_stress);
	tcase_add_test(tc, test_register_populate_lookup);
	tcase_add_test(tc, test_extmem_pool);
	tcase_add_test(tc, test_extmem_ranges_merge);
	tcase_add_test(tc, test_death_releases_pools);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
