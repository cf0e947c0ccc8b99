/* SPDX-License-Identifier: MIT */
/* The global MR cache in-process: keys for allocated memory, registration by policy, keys
 * checked by soft DMA, retirement on free, the pinned quota and the table's overflow path. */
#include <check.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "memory/arena.h"
#include "memory/window.h"

#include "control/client.h"
#include "core/domain.h"
#include "control/manager.h"
#include "provider/provider.h"
#include "status-page.h"
#include "base/worker-pool.h"
#include "test-daemon.h"
#include "check-run.h"

#define MiB (1ull << 20)

static void setup(void) { td_start_small(NULL); }
static void teardown(void) { td_stop(); }

/* MrLookup of n addresses; entries copied to out (when not NULL). Returns the reply status. */
static int lookup(int fd, uint64_t id, const uint64_t *addrs, size_t n, int error,
		  Mrd__MrEntry *out)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;
	Mrd__Response *resp;

	q.addresses = (uint64_t *)addrs;
	q.n_addresses = n;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect(fd, id, error);
	if (!error) {
		ck_assert_uint_eq(resp->mr_lookup->n_entries, n);
		for (size_t i = 0; out && i < n; i++)
			out[i] = *resp->mr_lookup->entries[i];
	}
	mrd__response__free_unpacked(resp, NULL);
	return error;
}

START_TEST(test_contig_lookup_and_dma)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 3 * MiB), b = td_alloc(fd, 3, 1 * MiB), addrs[3];
	Mrd__MrEntry e[3];
	struct mr_cache *cache;

	addrs[0] = a + 5;
	addrs[1] = a + 3 * MiB - 1;
	addrs[2] = b + 4096;
	lookup(fd, 4, addrs, 3, 0, e);
	cache = &c->domain->reg.cache;
	/* contig: the whole allocation, once. */
	ck_assert_uint_eq(e[0].start, a);
	ck_assert_uint_eq(e[0].end, a + 3 * MiB);
	ck_assert_uint_eq(e[1].lkey, e[0].lkey);
	ck_assert_uint_eq(e[2].start, b);
	ck_assert_uint_eq(cache->registrations, 2);
	ck_assert_uint_eq(cache->misses, 2);
	ck_assert_uint_eq(cache->lookups, 3);

	/* The keys reach exactly the bytes they should. */
	memcpy((void *)(uintptr_t)(a + 100), "through the keys", 17);
	td_dma(fd, 5, PROVIDER_DMA_WRITE, &e[0], a + 100, &e[2], b + 4000, 17, 0);
	ck_assert_str_eq((char *)(uintptr_t)(b + 4000), "through the keys");
	td_dma(fd, 6, PROVIDER_DMA_WRITE, &e[0], a + 100, &e[2], b + 1 * MiB - 8, 17, EFAULT);
	td_dma(fd, 7, 9, &e[0], a, &e[2], b, 1, EINVAL);
	close(fd);
}
END_TEST

/* A free moves the generation only when a client may hold keys for what went: memory never
 * registered empties nobody's lookup caches (DPDK's rule). */
START_TEST(test_free_bumps_only_over_registrations)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 1 * MiB), b = td_alloc(fd, 3, 1 * MiB), gen;
	const struct mrd_status_page *page = c->domain->mem.status.page;
	Mrd__MrEntry eb;

	lookup(fd, 4, &b, 1, 0, &eb);
	gen = page->generation;
	td_free(fd, 5, a, 0);
	ck_assert_uint_eq(page->frees, 1);
	ck_assert_uint_eq(page->generation, gen); /* nobody had a key for a */
	td_free(fd, 6, b, 0);
	ck_assert_uint_eq(page->generation, gen + 1); /* b's key died */
	close(fd);
	td_wait_domains_closed();
}
END_TEST

START_TEST(test_free_retires_keys)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 1 * MiB), b = td_alloc(fd, 3, 1 * MiB), gen;
	Mrd__MrEntry ea, eb, again;
	struct provider_stats ps;

	lookup(fd, 4, &a, 1, 0, &ea);
	lookup(fd, 5, &b, 1, 0, &eb);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 2);
	ck_assert_uint_eq(ps.pinned_bytes, 2 * MiB);
	gen = c->domain->mem.status.page->generation;

	td_free(fd, 6, b, 0);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	ck_assert_uint_eq(ps.pinned_bytes, 1 * MiB);
	ck_assert_uint_gt(c->domain->mem.status.page->generation, gen);
	ck_assert_uint_eq(c->domain->reg.cache.deregistrations, 1);
	/* The old key is dead, and the address is nobody's now. */
	td_dma(fd, 7, PROVIDER_DMA_WRITE, &ea, a, &eb, b, 8, ENOKEY);
	lookup(fd, 8, &b, 1, ENOENT, NULL);
	/* Memory handed out again at the same place gets a new registration. */
	ck_assert_uint_eq(td_alloc(fd, 9, 1 * MiB), b);
	lookup(fd, 10, &b, 1, 0, &again);
	ck_assert_uint_ne(again.rkey, eb.rkey);
	close(fd);
	td_wait_domains_closed(); /* 1 MiB MRs: workers deregister them */
}
END_TEST

/* Freed memory and its MR handle both go to the next client of the domain: the handle moves
 * to the new memory (a pool hit) with new keys, and the first client's key reaches nothing.
 * Where moves keep keys (MRD_SOFT_KEYS=mlx5, MRD_SOFT_REREG=keep-keys) or are refused
 * (MRD_SOFT_REREG=refuse) pools are off: a new registration, or the key quarantine, keeps it
 * dead. */
START_TEST(test_handle_reuse_keeps_stale_keys_out)
{
	struct client *ca, *cb;
	int fa = td_hello_client(1000, &ca), fb = td_hello_client(1000, &cb);
	uint64_t a = td_alloc(fa, 2, 256 * 1024), src = td_alloc(fb, 3, 4096), b;
	Mrd__MrEntry ea, eb, esrc;
	struct frmr_pool_stats st[8];
	size_t n;

	ck_assert_ptr_eq(ca->domain, cb->domain);
	ck_assert(!ca->domain->reg.base.pools.off ||
		  !ca->domain->reg.base.provider->caps.rereg_new_keys);
	lookup(fa, 4, &a, 1, 0, &ea);
	lookup(fb, 5, &src, 1, 0, &esrc);
	td_free(fa, 6, a, 0);
	b = td_alloc(fb, 7, 256 * 1024);
	ck_assert_uint_eq(b, a); /* the same pages */
	lookup(fb, 8, &b, 1, 0, &eb);
	ck_assert_uint_ne(eb.rkey, ea.rkey);
	ck_assert_uint_ne(eb.lkey, ea.lkey);

	n = frmr_pools_stats(&ca->domain->reg.base.pools, st, 8);
	if (!ca->domain->reg.base.pools.off) {
		ck_assert_uint_eq(n, 2); /* 1 page and 64 pages */
		ck_assert_uint_eq(st[1].key.pages, 64);
		ck_assert_uint_eq(st[1].hits, 1);
		ck_assert_uint_eq(st[1].misses, 1);
		ck_assert_uint_eq(st[1].in_use, 1);
	}

	memset((void *)(uintptr_t)b, 0, 16);
	memcpy((void *)(uintptr_t)src, "new owner", 10);
	td_dma(fb, 9, PROVIDER_DMA_WRITE, &esrc, src, &ea, b, 10, ENOKEY);
	ck_assert_int_eq(*(char *)(uintptr_t)b, 0);
	td_dma(fb, 10, PROVIDER_DMA_WRITE, &esrc, src, &eb, b, 10, 0);
	ck_assert_str_eq((char *)(uintptr_t)b, "new owner");
	close(fa);
	close(fb);
	td_wait_domains_closed();
}
END_TEST

/* Freed and allocated again at the same address and size, more times than the key quarantine
 * holds: each time the freed allocation's rkey reaches nothing, even on a device that hands a
 * released key out again unchanged (tests/keys-mlx5.sh runs this with MRD_SOFT_KEYS=mlx5, as
 * mlx5's mkey cache does), and the quarantine stays bounded and pins nothing. _i 1: on-demand
 * memory, whose MR mlx5 makes anew on any move (so a park by a move would give its key back). */
START_TEST(test_old_rkey_refused_over_reuse)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint32_t flags = _i ? MRD__ALLOC_FLAGS__ALLOC_ODP : 0;
	uint64_t src = td_alloc(fd, 2, 4096), a = td_alloc_flags(fd, 3, 64 * 1024, flags), id = 4;
	Mrd__MrEntry esrc, old, now;
	struct provider_stats ps;

	/* Every key of the last KEY_WINDOW frees stays dead (the guarantee, key-quarantine.h:
	 * until KEY_QUARANTINE_MRS more are released): the new key is none of them, and each
	 * cycle one of them, the previous first, then older ones, tries a write. */
	enum { KEY_WINDOW = 1000 };
	uint32_t *gone = calloc(KEY_QUARANTINE_MRS + 100, sizeof(*gone));

	ck_assert_ptr_nonnull(gone);
	lookup(fd, id++, &src, 1, 0, &esrc);
	lookup(fd, id++, &a, 1, 0, &old);
	memcpy((void *)(uintptr_t)src, "stale!!", 8);
	for (int i = 0; i < KEY_QUARANTINE_MRS + 100; i++) {
		Mrd__MrEntry dead = old;

		gone[i] = old.rkey;
		td_free(fd, id++, a, 0);
		ck_assert_uint_eq(td_alloc_flags(fd, id++, 64 * 1024, flags), a);
		lookup(fd, id++, &a, 1, 0, &now);
		for (int j = i < KEY_WINDOW ? 0 : i - KEY_WINDOW + 1; j <= i; j++)
			ck_assert_msg(now.rkey != gone[j],
				      "cycle %d: the new rkey 0x%x is that of the allocation freed %d "
				      "cycles ago", i, now.rkey, i - j);
		if (i % 2) /* an older one: the key freed i % KEY_WINDOW / 2 cycles before */
			dead.rkey = gone[i - (i % (i < KEY_WINDOW ? i + 1 : KEY_WINDOW)) / 2];
		memset((void *)(uintptr_t)a, 0, 8);
		td_dma(fd, id++, PROVIDER_DMA_WRITE, &esrc, src, &dead, a, 8, ENOKEY);
		ck_assert_msg(*(char *)(uintptr_t)a == 0, "cycle %d: the old rkey 0x%x wrote", i,
			      dead.rkey);
		td_dma(fd, id++, PROVIDER_DMA_WRITE, &esrc, src, &now, a, 8, 0);
		old = now;
	}
	free(gone);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.parked, c->domain->reg.base.provider->caps.keys_come_back ?
					     KEY_QUARANTINE_MRS : 0);
	ck_assert_uint_eq(ps.pinned_bytes, 4096 + (_i ? 0 : 64 * 1024));
	frmr_pools_done(&c->domain->reg.base.pools); /* as the domain's close does, before its PD */
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.parked, 0);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* FrmrPools (mrctl pools) as fd sees it: one domain, its own. */
static Mrd__Response *frmr_pools(int fd, uint64_t id)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FrmrPoolsRequest q = MRD__FRMR_POOLS_REQUEST__INIT;
	Mrd__Response *resp;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_FRMR_POOLS;
	req.frmr_pools = &q;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect(fd, id, 0);
	ck_assert_uint_eq(resp->frmr_pools->n_domains, 1);
	return resp;
}

/* The key quarantine's counts in FrmrPools (mrctl pools): where released keys come back and
 * MRs park, each freed MR waits, its keys dead; where they come back but the device cannot
 * park (MRD_SOFT_KEYS=mlx5 with MRD_SOFT_REREG=refuse: an mlx5-like device that cannot move
 * an MR), each goes back to the device unparked, counted, and the next registration of its
 * size gets its rkey: the guarantee does not hold there, and the counter says so. Where keys
 * never come back, the quarantine is off. tests/keys-mlx5.sh runs it in every mode. */
START_TEST(test_quarantine_counts_shown)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), cycles = 10;
	uint64_t src = td_alloc(fd, 2, 4096), a = td_alloc(fd, 3, 64 * 1024), id = 4;
	const struct provider_caps *caps = &c->domain->reg.base.provider->caps;
	bool parks = caps->rereg_translation;
	const Mrd__FrmrDomainInfo *d;
	Mrd__MrEntry esrc, old, now;
	Mrd__Response *resp;

	lookup(fd, id++, &src, 1, 0, &esrc);
	lookup(fd, id++, &a, 1, 0, &old);
	for (int i = 0; i < cycles; i++) {
		td_free(fd, id++, a, 0);
		ck_assert_uint_eq(td_alloc(fd, id++, 64 * 1024), a);
		lookup(fd, id++, &a, 1, 0, &now);
		if (caps->keys_come_back && !parks) /* the hazard, as it is */
			ck_assert_uint_eq(now.rkey, old.rkey);
		else
			td_dma(fd, id++, PROVIDER_DMA_WRITE, &esrc, src, &old, a, 8, ENOKEY);
		old = now;
	}
	resp = frmr_pools(fd, id++);
	d = resp->frmr_pools->domains[0];
	ck_assert_int_eq(d->quarantine_on, caps->keys_come_back);
	ck_assert_uint_eq(d->quarantined, caps->keys_come_back && parks ? cycles : 0);
	ck_assert_uint_eq(d->unparked, caps->keys_come_back && !parks ? cycles : 0);
	if (!caps->rereg_new_keys) /* pools off, with the device's reason */
		ck_assert_ptr_nonnull(strstr(d->off, caps->rereg_probe));
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

static void setup_window_only(void) { td_start_small("windows.remote=window-only"); }

/* [windows] remote = window-only: a pinned MR's own rkey grants no peer anything (remote
 * grants are windows, dead at the free: test-windows), so the quarantine keeps none of them:
 * a released MR goes back to the device at once, counted neither as quarantined nor as
 * unparked. A freed allocation's old rkey still reaches nothing: refused for its key (soft's
 * next variant) or, where the device hands it to the next MR unchanged (MRD_SOFT_KEYS=mlx5,
 * tests/keys-mlx5.sh), for that MR's lack of remote rights. */
START_TEST(test_window_only_parks_nothing)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), cycles = 10;
	uint64_t src = td_alloc(fd, 2, 4096), a = td_alloc(fd, 3, 64 * 1024), id = 4;
	const struct provider_caps *caps = &c->domain->reg.base.provider->caps;
	const Mrd__FrmrDomainInfo *d;
	Mrd__MrEntry esrc, old, now;
	Mrd__Response *resp;
	struct provider_stats ps;

	lookup(fd, id++, &src, 1, 0, &esrc);
	lookup(fd, id++, &a, 1, 0, &old);
	for (int i = 0; i < cycles; i++) {
		td_free(fd, id++, a, 0);
		ck_assert_uint_eq(td_alloc(fd, id++, 64 * 1024), a);
		lookup(fd, id++, &a, 1, 0, &now);
		memset((void *)(uintptr_t)a, 0, 8);
		td_dma(fd, id++, PROVIDER_DMA_WRITE, &esrc, src, &old, a, 8,
		       now.rkey == old.rkey ? EACCES : ENOKEY);
		ck_assert_int_eq(*(char *)(uintptr_t)a, 0);
		old = now;
	}
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.parked, 0);
	resp = frmr_pools(fd, id++);
	d = resp->frmr_pools->domains[0];
	ck_assert_int_eq(d->quarantine_on, caps->keys_come_back);
	ck_assert_uint_eq(d->quarantined, 0);
	ck_assert_uint_eq(d->unparked, 0);
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

static void send_pools_set(int fd, uint64_t id, const char *domain, uint32_t given,
			   uint64_t pages, uint32_t aging, uint32_t pinned)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FrmrPoolsSetRequest q = MRD__FRMR_POOLS_SET_REQUEST__INIT;

	q.domain = (char *)domain;
	q.given = given;
	q.pages = pages;
	q.aging_s = aging;
	q.pinned = pinned;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_FRMR_POOLS_SET;
	req.frmr_pools_set = &q;
	td_send_request(fd, &req, NULL, 0);
}

/* FrmrPools and FrmrPoolsSet: admin only, checked values, per domain or all. */
START_TEST(test_frmr_admin_requests)
{
	enum {
		PAGES = MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_PAGES,
		AGING = MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_AGING,
		PINNED = MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_PINNED,
	};
	struct client *c;
	int fd = td_hello_client(1000, &c), admin = td_hello_client(0, NULL);
	int other = td_hello_client(2000, NULL);
	uint64_t a = td_alloc(fd, 2, 8192);
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FrmrPoolsRequest q = MRD__FRMR_POOLS_REQUEST__INIT;
	Mrd__Response *resp;
	Mrd__MrEntry e;

	lookup(fd, 3, &a, 1, 0, &e);
	req.id = 4;
	req.body_case = MRD__REQUEST__BODY_FRMR_POOLS;
	req.frmr_pools = &q;
	/* Anyone may look, at their own domain alone; only admins may change. */
	td_send_request(other, &req, NULL, 0);
	resp = td_expect(other, 4, 0);
	ck_assert_uint_eq(resp->frmr_pools->n_domains, 0);
	mrd__response__free_unpacked(resp, NULL);
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect(fd, 4, 0);
	ck_assert_uint_eq(resp->frmr_pools->n_domains, 1);
	mrd__response__free_unpacked(resp, NULL);
	send_pools_set(fd, 5, "", AGING, 0, 5, 0);
	td_expect_free(fd, 5, EPERM);

	send_pools_set(admin, 6, "", 0, 0, 0, 0);
	td_expect_free(admin, 6, EINVAL); /* nothing to set */
	send_pools_set(admin, 7, "", AGING, 0, 0, 0);
	td_expect_free(admin, 7, EINVAL); /* aging 0 */
	send_pools_set(admin, 8, "nobody", AGING, 0, 5, 0);
	td_expect_free(admin, 8, ENOENT);
	send_pools_set(admin, 9, "uid-1000", PAGES | AGING, 3, 5, 0);
	resp = td_expect(admin, 9, 0);
	ck_assert_uint_eq(resp->frmr_pools_set->changed, 0);
	mrd__response__free_unpacked(resp, NULL);
	send_pools_set(admin, 10, "uid-1000", PAGES | AGING | PINNED, 2, 5, 1);
	resp = td_expect(admin, 10, 0);
	ck_assert_uint_eq(resp->frmr_pools_set->changed, 1);
	mrd__response__free_unpacked(resp, NULL);

	req.id = 11;
	td_send_request(admin, &req, NULL, 0);
	resp = td_expect(admin, 11, 0);
	ck_assert_uint_eq(resp->frmr_pools->n_domains, 1);
	ck_assert_str_eq(resp->frmr_pools->domains[0]->domain, "uid-1000");
	ck_assert_str_eq(resp->frmr_pools->domains[0]->off, "");
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->aging_s, FRMR_AGING_DEFAULT_S);
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->n_pools, 1);
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->pools[0]->pages, 2);
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->pools[0]->in_use, 1);
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->pools[0]->misses, 1);
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->pools[0]->aging_s, 5);
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->pools[0]->pinned, 1);
	/* The cache's pinned MRs take windows where the device has them (soft does). */
	ck_assert_uint_eq(resp->frmr_pools->domains[0]->pools[0]->access,
			  MR_CACHE_ACCESS | MRD_ACCESS_MW_BIND);
	mrd__response__free_unpacked(resp, NULL);

	/* Every pool, every domain: domains opened later start with it. */
	send_pools_set(admin, 12, "", AGING, 0, 9, 0);
	resp = td_expect(admin, 12, 0);
	ck_assert_uint_eq(resp->frmr_pools_set->changed, 1);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(c->domain->reg.base.pools.config.aging_s, 9);
	ck_assert_uint_eq(c->manager->core.config.pools.aging_s, 9);
	c->manager->core.config.pools.aging_s = FRMR_AGING_DEFAULT_S; /* as the next test expects */
	close(fd);
	close(admin);
	close(other);
	td_wait_domains_closed();
}
END_TEST

static Mrd__Response *flush(int fd, uint64_t id, const char *domain, bool by_uid, uint32_t uid,
			    bool pools, bool gc, int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FlushRequest q = MRD__FLUSH_REQUEST__INIT;

	q.domain = (char *)domain;
	q.by_uid = by_uid;
	q.uid = uid;
	q.pools = pools;
	q.gc = gc;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_FLUSH;
	req.flush = &q;
	td_send_request(fd, &req, NULL, 0);
	if (error) {
		td_expect_free(fd, id, error);
		return NULL;
	}
	return td_expect(fd, id, 0);
}

/* Flush: the generation moves and the keys still come from the rebuilt table; --pools takes
 * the idle handles above the pinned minimum, --gc the rest and the empty pools. */
START_TEST(test_flush)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), admin = td_hello_client(0, NULL);
	uint64_t a = td_alloc(fd, 2, 8192), b = td_alloc(fd, 3, 8192), gen;
	struct domain *d = c->domain;
	Mrd__MrEntry ea, again;
	Mrd__Response *resp;

	lookup(fd, 4, &a, 1, 0, &ea);
	lookup(fd, 5, &b, 1, 0, &again);
	td_free(fd, 6, b, 0); /* one handle parked in the 2-page pool */
	ck_assert_uint_eq(d->reg.base.pools.queued, 1);
	flush(fd, 7, "", false, 0, false, false, EPERM);
	flush(admin, 8, "uid-1000", true, 1000, false, false, EINVAL);
	flush(admin, 9, "nobody", false, 0, false, false, ENOENT);
	flush(admin, 10, "", true, 4242, false, false, ENOENT);

	gen = d->mem.status.page->generation;
	resp = flush(admin, 11, "", true, 1000, false, false, 0);
	ck_assert_uint_eq(resp->flush->domains, 1);
	ck_assert_uint_eq(resp->flush->handles, 0);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_gt(d->mem.status.page->generation, gen);
	ck_assert_uint_eq(d->reg.base.pools.queued, 1);
	lookup(fd, 12, &a, 1, 0, &again); /* served from the rebuilt table: no new MR */
	ck_assert_uint_eq(again.lkey, ea.lkey);
	ck_assert_uint_eq(d->reg.cache.registrations, 2);

	/* A pinned minimum of 1: --pools leaves it, --gc takes it and then the empty pool. */
	ck_assert_int_eq(frmr_pools_set(&d->reg.base.pools, &FRMR_MATCH_ANY, -1, 1), 1);
	resp = flush(admin, 13, "uid-1000", false, 0, true, false, 0);
	ck_assert_uint_eq(resp->flush->handles, 0);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(d->reg.base.pools.queued, 1);
	ck_assert_int_eq(frmr_pools_set(&d->reg.base.pools, &FRMR_MATCH_ANY, -1, 0), 1);
	resp = flush(admin, 14, "", false, 0, true, false, 0);
	ck_assert_uint_eq(resp->flush->handles, 1);
	ck_assert_uint_eq(resp->flush->pools_removed, 0);
	mrd__response__free_unpacked(resp, NULL);
	td_pump_until_zero(&d->reg.base.destroy_jobs); /* destroyed on a worker */
	ck_assert_uint_eq(d->reg.base.pools.queued, 0);
	ck_assert_uint_eq(frmr_pools_stats(&d->reg.base.pools, NULL, 0), 1);
	resp = flush(admin, 15, "", false, 0, false, true, 0);
	ck_assert_uint_eq(resp->flush->handles, 0);
	ck_assert_uint_eq(resp->flush->pools_removed, 0); /* the 2-page pool: a's MR is in use */
	mrd__response__free_unpacked(resp, NULL);
	td_free(fd, 16, a, 0);
	resp = flush(admin, 17, "", false, 0, false, true, 0);
	ck_assert_uint_eq(resp->flush->handles, 1);
	ck_assert_uint_eq(resp->flush->pools_removed, 1);
	mrd__response__free_unpacked(resp, NULL);
	td_pump_until_zero(&d->reg.base.destroy_jobs);
	ck_assert_uint_eq(frmr_pools_stats(&d->reg.base.pools, NULL, 0), 0);
	close(fd);
	close(admin);
	td_wait_domains_closed();
}
END_TEST

static Mrd__Response *domain_dump(int fd, uint64_t id, const char *domain, uint32_t first,
				  int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DomainDumpRequest q = MRD__DOMAIN_DUMP_REQUEST__INIT;

	q.domain = (char *)domain;
	q.first_mr = first;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
	req.domain_dump = &q;
	td_send_request(fd, &req, NULL, 0);
	if (error) {
		td_expect_free(fd, id, error);
		return NULL;
	}
	return td_expect(fd, id, 0);
}

/* DomainDump: arenas, the table, every MR with its kind, page by page; one's own domain only. */
START_TEST(test_domain_dump)
{
	int fd = td_hello_client(1000, NULL), other = td_hello_client(2000, NULL);
	int admin = td_hello_client(0, NULL);
	uint64_t a = td_alloc(fd, 2, 8192);
	uint64_t b = td_alloc_flags(fd, 3, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	Mrd__MrEntry ea, eb;
	Mrd__Response *resp;
	const Mrd__DomainDumpResponse *d;

	lookup(fd, 4, &a, 1, 0, &ea);
	lookup(fd, 5, &b, 1, 0, &eb);
	resp = domain_dump(fd, 6, "uid-1000", 0, 0);
	d = resp->domain_dump;
	ck_assert_str_eq(d->domain, "uid-1000");
	ck_assert_uint_ge(d->n_arenas, 1);
	ck_assert_uint_eq(d->arenas[0]->allocations + (d->n_arenas > 1 ? d->arenas[1]->allocations : 0),
			  2);
	ck_assert(!d->table_overflow);
	ck_assert_uint_eq(d->table_entries, 1); /* a's MR: b's child is found through b */
	ck_assert_uint_eq(d->mrs_total, 2);
	ck_assert_uint_eq(d->n_mrs, 2);
	ck_assert_uint_eq(d->next_mr, 0);
	for (size_t i = 0; i < 2; i++) {
		const Mrd__DumpMr *m = d->mrs[i];
		bool odp = m->kind == MRD__DUMP_MR_KIND__DUMP_MR_ODP;

		ck_assert_uint_eq(m->start, odp ? eb.start : ea.start);
		ck_assert_uint_eq(m->end, odp ? eb.end : ea.end);
		ck_assert_uint_eq(m->lkey, odp ? eb.lkey : ea.lkey);
		ck_assert_uint_eq(m->pages, (m->end - m->start) / 4096);
		ck_assert_int_eq(m->owner_pid, (int32_t)getpid());
	}
	ck_assert_uint_ne(d->mrs[0]->kind, d->mrs[1]->kind);
	mrd__response__free_unpacked(resp, NULL);

	/* From the second on: one, and done. */
	resp = domain_dump(fd, 7, "uid-1000", 1, 0);
	ck_assert_uint_eq(resp->domain_dump->n_mrs, 1);
	ck_assert_uint_eq(resp->domain_dump->mrs_total, 2);
	ck_assert_uint_eq(resp->domain_dump->next_mr, 0);
	mrd__response__free_unpacked(resp, NULL);
	resp = domain_dump(fd, 8, "uid-1000", 5, 0);
	ck_assert_uint_eq(resp->domain_dump->n_mrs, 0);
	mrd__response__free_unpacked(resp, NULL);

	domain_dump(other, 9, "uid-1000", 0, ENOENT); /* not theirs */
	domain_dump(admin, 10, "nobody", 0, ENOENT);
	resp = domain_dump(admin, 11, "uid-1000", 0, 0);
	ck_assert_uint_eq(resp->domain_dump->mrs_total, 2);
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
	close(other);
	close(admin);
	td_wait_domains_closed();
}
END_TEST

START_TEST(test_bad_lookups)
{
	int fd = td_hello_client(1000, NULL), other = td_hello_client(2000, NULL);
	uint64_t a = td_alloc(fd, 2, 4096), many[65];
	Mrd__MrEntry e;

	lookup(fd, 3, &many[0], 0, EINVAL, NULL);
	for (int i = 0; i < 65; i++)
		many[i] = a;
	lookup(fd, 4, many, 65, EINVAL, NULL);
	many[0] = 0x1000;
	lookup(fd, 5, many, 1, ENOENT, NULL);
	many[0] = a + 4096; /* past the allocation's last page */
	lookup(fd, 6, many, 1, ENOENT, NULL);
	lookup(other, 2, &a, 1, ENOENT, &e); /* another domain's memory: no key */
	close(fd);
	close(other);
}
END_TEST

START_TEST(test_page_policy)
{
	int fd;
	uint64_t a, addrs[2];
	Mrd__MrEntry e[2];

	td_stop();
	td_start_small("cache.policy=page");
	fd = td_hello_client(1000, NULL);
	a = td_alloc(fd, 2, 64 * 1024);
	addrs[0] = a + 5000;
	addrs[1] = a + 9000;
	lookup(fd, 3, addrs, 2, 0, e);
	ck_assert_uint_eq(e[0].start, a + 4096);
	ck_assert_uint_eq(e[0].end, a + 8192);
	ck_assert_uint_eq(e[1].start, a + 8192);
	ck_assert_uint_ne(e[1].lkey, e[0].lkey);
	close(fd);
}
END_TEST

START_TEST(test_contig_around_existing)
{
	int fd;
	uint64_t a, addrs[1];
	Mrd__MrEntry e;

	/* A page MR in the middle, then contig around it: only the uncovered run. */
	td_stop();
	td_start_small("cache.policy=page");
	fd = td_hello_client(1000, NULL);
	a = td_alloc(fd, 2, 16 * 4096);
	addrs[0] = a + 8 * 4096;
	lookup(fd, 3, addrs, 1, 0, &e);
	td_manager->core.domains.lh_first->reg.cache.policy = MR_POLICY_CONTIG;
	addrs[0] = a + 4096;
	lookup(fd, 4, addrs, 1, 0, &e);
	ck_assert_uint_eq(e.start, a);
	ck_assert_uint_eq(e.end, a + 8 * 4096);
	addrs[0] = a + 12 * 4096;
	lookup(fd, 5, addrs, 1, 0, &e);
	ck_assert_uint_eq(e.start, a + 9 * 4096);
	ck_assert_uint_eq(e.end, a + 16 * 4096);
	close(fd);
}
END_TEST

START_TEST(test_pinned_quota)
{
	struct client *c;
	int fd;
	uint64_t a, b;
	Mrd__MrEntry e;
	Mrd__Response *resp;

	td_stop();
	td_start_small("quota.pinned_bytes=1M");
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 768 * 1024);
	b = td_alloc(fd, 3, 512 * 1024);
	lookup(fd, 4, &a, 1, 0, &e);
	td_send_lookup(fd, 5, b);
	resp = td_expect(fd, 5, EDQUOT);
	ck_assert_msg(strcmp(resp->message, "quota.pinned_bytes (1048576) would be exceeded in domain "
				     "uid-1000: 786432 in use, tried to pin 524288 "
				     "more; raise [quota] pinned_bytes in mrd.conf and reload mrd") == 0,
		      "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	td_free(fd, 6, a, 0); /* unpinned: now it fits */
	lookup(fd, 7, &b, 1, 0, &e);
	/* At the exact boundary: 512 KiB more fills the quota to its last byte, a page more
	 * does not fit, and the refusal pinned nothing. */
	a = td_alloc(fd, 8, 512 * 1024);
	lookup(fd, 9, &a, 1, 0, &e);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1024 * 1024);
	b = td_alloc(fd, 10, 4096);
	lookup(fd, 11, &b, 1, EDQUOT, NULL);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1024 * 1024);
	close(fd);
}
END_TEST

/* [limits] pinned_bytes bounds what all domains pin together: many users cannot pin the host
 * whole, each within its own quota. */
START_TEST(test_host_pinned_limit)
{
	struct client *c1, *c2;
	int fd1, fd2;
	uint64_t a, b;
	Mrd__MrEntry e;
	Mrd__Response *resp;

	td_stop();
	td_start_small("limits.pinned_bytes=1M");
	fd1 = td_hello_client(1000, &c1);
	fd2 = td_hello_client(2000, &c2);
	a = td_alloc(fd1, 2, 768 * 1024);
	lookup(fd1, 3, &a, 1, 0, &e);
	b = td_alloc(fd2, 4, 512 * 1024);
	ck_assert_ptr_ne(c1->domain, c2->domain);
	td_send_lookup(fd2, 5, b);
	resp = td_expect(fd2, 5, EDQUOT);
	ck_assert_msg(strstr(resp->message, "limits.pinned_bytes (1048576)"), "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(c2->domain->reg.cache.charges.pinned_bytes, 0);
	td_free(fd1, 6, a, 0); /* the other domain unpins: now it fits */
	lookup(fd2, 7, &b, 1, 0, &e);
	ck_assert_uint_eq(c2->domain->reg.cache.charges.pinned_bytes, 512 * 1024);
	close(fd1);
	close(fd2);
}
END_TEST

START_TEST(test_table_overflow)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t addr[12];
	Mrd__MrEntry e[12], again;
	struct mr_cache *cache;

	for (int i = 0; i < 12; i++)
		addr[i] = td_alloc(fd, 10 + (uint64_t)i, 4096);
	cache = &c->domain->reg.cache;
	/* A table that cannot grow past 4 entries (the sentinel and 3). */
	mr_table_done(&cache->table);
	ck_assert_int_eq(mr_table_init(&cache->table, 2, 4), 0);
	lookup(fd, 31, addr, 12, 0, e);
	ck_assert(cache->table.overflow);
	/* Every key is still right: the list serves. */
	for (int i = 0; i < 12; i++) {
		ck_assert_uint_eq(e[i].start, addr[i]);
		lookup(fd, 40 + (uint64_t)i, &addr[i], 1, 0, &again);
		ck_assert_uint_eq(again.lkey, e[i].lkey);
	}
	ck_assert_uint_eq(cache->registrations, 12);
	/* Frees rebuild; once it fits, the table serves again. */
	for (int i = 0; i < 10; i++)
		td_free(fd, 60 + (uint64_t)i, addr[i], 0);
	ck_assert(!cache->table.overflow);
	ck_assert_uint_eq(cache->table.n, 3);
	lookup(fd, 80, &addr[11], 1, 0, &again);
	ck_assert_uint_eq(again.lkey, e[11].lkey);
	close(fd);
}
END_TEST

/* A lookup of 64 cold small buffers: the loop registers a few, workers the rest, and every
 * key comes back. */
START_TEST(test_lookup_loop_share_per_request)
{
	struct client *ca;
	uint64_t addrs[64];
	Mrd__MrEntry out[64];
	const struct mr_cache *cache;
	int a = td_hello_client(1000, &ca);

	for (unsigned i = 0; i < 64; i++)
		addrs[i] = td_alloc(a, 2 + i, 4096);
	cache = &ca->domain->reg.cache;
	lookup(a, 100, addrs, 64, 0, out);
	for (unsigned i = 0; i < 64; i++) {
		ck_assert_uint_eq(out[i].start, addrs[i]);
		ck_assert_uint_eq(out[i].end, addrs[i] + 4096);
	}
	ck_assert_uint_eq(cache->registrations, 64);
	ck_assert_uint_le(cache->loop_registrations, REGISTRAR_LOOP_PER_REQUEST);
	ck_assert_uint_gt(cache->loop_registrations, 0); /* a small miss alone needs no worker */
	close(a);
}
END_TEST

/* Three 512 KiB buffers, cold, in one lookup: a turn registers less than async_bytes (1 MiB)
 * on the loop, so the second goes to a worker; the third, in a later turn, may not. */
START_TEST(test_lookup_loop_share_bytes)
{
	struct client *ca;
	uint64_t addrs[3];
	Mrd__MrEntry out[3];
	int a = td_hello_client(1000, &ca);

	for (unsigned i = 0; i < 3; i++)
		addrs[i] = td_alloc(a, 2 + i, 512 * 1024);
	lookup(a, 100, addrs, 3, 0, out);
	for (unsigned i = 0; i < 3; i++)
		ck_assert_uint_eq(out[i].start, addrs[i]);
	ck_assert_uint_eq(ca->domain->reg.cache.registrations, 3);
	ck_assert_uint_le(ca->domain->reg.cache.loop_registrations, 2);
	close(a);
}
END_TEST

/* Four domains' lookups of cold small buffers, read in one turn of the loop: together they
 * register no more than the turn's share there; the rest are answered later all the same, and
 * a later turn has its share again. */
START_TEST(test_lookup_loop_share_per_turn)
{
	enum { N = 4, M = REGISTRAR_LOOP_PER_REQUEST };
	struct client *c[N];
	uint64_t addrs[N][M];
	uint64_t on_loop = 0;
	int fd[N];

	for (unsigned n = 0; n < N; n++) {
		fd[n] = td_hello_client(1000 + n, &c[n]);
		for (unsigned i = 0; i < M; i++)
			addrs[n][i] = td_alloc(fd[n], 2 + i, 4096);
	}
	for (unsigned n = 0; n < N; n++) {
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;

		q.addresses = addrs[n];
		q.n_addresses = M;
		req.id = 100;
		req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
		req.mr_lookup = &q;
		td_send_request(fd[n], &req, NULL, 0);
	}
	(void)event_base_loop(td_manager->core.base, EVLOOP_ONCE | EVLOOP_NONBLOCK); /* a turn */
	for (unsigned n = 0; n < N; n++) {
		ck_assert_uint_gt(c[n]->domain->reg.cache.lookups, 0); /* each was read */
		on_loop += c[n]->domain->reg.cache.loop_registrations;
	}
	ck_assert_uint_le(on_loop, REGISTRAR_LOOP_PER_TURN);
	for (unsigned n = 0; n < N; n++) {
		Mrd__Response *resp = td_expect(fd[n], 100, 0);

		for (unsigned i = 0; i < M; i++)
			ck_assert_uint_eq(resp->mr_lookup->entries[i]->start, addrs[n][i]);
		mrd__response__free_unpacked(resp, NULL);
		close(fd[n]);
	}
	fd[0] = td_hello_client(2000, &c[0]);
	addrs[0][0] = td_alloc(fd[0], 2, 4096);
	td_lookup(fd[0], 3, addrs[0][0], 0, NULL);
	ck_assert_uint_eq(c[0]->domain->reg.cache.loop_registrations, 1);
	close(fd[0]);
}
END_TEST

/* Domain A's big registrations hold a worker and queue behind it; domain B's 2 MiB one (a
 * worker's too) is answered meanwhile, not after A's queue drains. */
START_TEST(test_big_registrations_queue_no_other_domain)
{
	enum { N = 3 };
	struct client *ca[N];
	struct td_blocker b;
	uint64_t big[N], small;
	Mrd__Response *resp;
	int a[N], other;

	for (unsigned i = 0; i < N; i++) {
		a[i] = td_hello_client(1000, &ca[i]);
		big[i] = td_alloc(a[i], 2, 8 * MiB);
	}
	other = td_hello_client(2000, NULL);
	small = td_alloc(other, 2, 2 * MiB);
	td_block_worker_as(&b, &ca[0]->domain->mem); /* one of A's: A's turn, on a worker */
	for (unsigned i = 0; i < N; i++)
		td_send_lookup(a[i], 3, big[i]);
	td_pump();
	ck_assert_uint_eq(ca[0]->domain->reg.cache.pending_bytes, N * 8 * MiB);
	td_send_lookup(other, 3, small);
	resp = td_expect(other, 3, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, small);
	mrd__response__free_unpacked(resp, NULL);
	for (unsigned i = 0; i < N; i++)
		ck_assert_ptr_nonnull(LIST_FIRST(&ca[i]->pending)); /* A's wait yet */
	td_unblock_worker(&b);
	for (unsigned i = 0; i < N; i++) {
		resp = td_expect(a[i], 3, 0);
		ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, big[i]);
		mrd__response__free_unpacked(resp, NULL);
		close(a[i]);
	}
	close(other);
}
END_TEST

START_TEST(test_big_registration_blocks_nobody)
{
	struct client *ca;
	struct td_blocker b;
	int a, other;
	uint64_t big, small;
	Mrd__Response *resp;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	other = td_hello_client(2000, NULL); /* another domain: another provider context */
	big = td_alloc(a, 2, 8 * MiB);
	small = td_alloc(other, 2, 4096);

	td_block_worker(&b);
	td_send_lookup(a, 3, big + 100);   /* to a worker, which is busy */
	td_send_lookup(other, 3, small);   /* small: answered on the loop, now */
	resp = td_expect(other, 3, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, small);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending)); /* A still waits, and only A */
	ck_assert(ca->reading); /* and A's further requests are read meanwhile */

	td_unblock_worker(&b);
	resp = td_expect(a, 3, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, big);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->end, big + 8 * MiB);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_ptr_null(LIST_FIRST(&ca->pending));
	ck_assert(ca->reading);
	close(a);
	close(other);
}
END_TEST

/* Two lookups in one run while a worker registers it: the second waits for the first's
 * registration instead of pinning the run again. */
START_TEST(test_racing_registrations)
{
	struct client *ca;
	struct td_blocker b;
	int a, other;
	uint64_t big;
	Mrd__Response *ra, *rb;
	struct provider_stats ps;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	other = td_hello_client(1000, NULL);
	big = td_alloc(a, 2, 4 * MiB);
	td_block_worker(&b);
	td_send_lookup(a, 3, big);
	td_send_lookup(other, 3, big + 4096); /* the same run, while the first is registered */
	td_pump();
	ck_assert_uint_eq(ca->domain->reg.cache.pending_bytes, 4 * MiB); /* one registration */
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 4 * MiB);
	td_unblock_worker(&b);
	ra = td_expect(a, 3, 0);
	rb = td_expect(other, 3, 0);
	ck_assert_uint_eq(ra->mr_lookup->entries[0]->lkey, rb->mr_lookup->entries[0]->lkey);
	ck_assert_uint_eq(ca->domain->reg.cache.registrations, 1);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	mrd__response__free_unpacked(ra, NULL);
	mrd__response__free_unpacked(rb, NULL);
	close(a);
	close(other);
}
END_TEST

/* Two misses whose runs overlap without either holding the other's address (the device's
 * largest MR cuts each run at its address): both register on a worker, and the second one
 * done must not keep a second MR over pages the first one pinned. */
START_TEST(test_overlapping_registrations)
{
	struct client *ca;
	struct td_blocker b;
	int a, other;
	uint64_t big;
	Mrd__Response *ra, *rb;
	struct provider_stats ps;
	const Mrd__MrEntry *ea, *eb;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	other = td_hello_client(1000, NULL);
	big = td_alloc(a, 2, 3 * MiB);
	ca->domain->reg.base.provider->caps.max_mr_size = 2 * MiB;
	td_block_worker(&b);
	td_send_lookup(other, 3, big + 1 * MiB); /* [1 MiB, 3 MiB): done first */
	td_pump();
	td_send_lookup(a, 3, big);               /* [0, 2 MiB): overlaps it */
	td_pump();
	td_unblock_worker(&b);
	rb = td_expect(other, 3, 0);
	ra = td_expect(a, 3, 0);
	ea = ra->mr_lookup->entries[0];
	eb = rb->mr_lookup->entries[0];
	ck_assert_uint_le(ea->start, big);
	ck_assert_uint_gt(ea->end, big);
	ck_assert_uint_le(eb->start, big + 1 * MiB);
	ck_assert_uint_gt(eb->end, big + 1 * MiB);
	/* Pinned is the union, 3 MiB, in MRs that do not overlap. */
	ck_assert_msg(ea->end <= eb->start || eb->end <= ea->start,
		      "[%#lx, %#lx) and [%#lx, %#lx) overlap", (unsigned long)ea->start,
		      (unsigned long)ea->end, (unsigned long)eb->start, (unsigned long)eb->end);
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 3 * MiB);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.pinned_bytes, 3 * MiB);
	ck_assert_uint_eq(ps.mrs, 2);
	/* The keys reach the bytes at both ends. */
	memcpy((void *)(uintptr_t)big, "first", 6);
	td_dma(a, 4, PROVIDER_DMA_WRITE, ea, big, eb, big + 3 * MiB - 6, 6, 0);
	ck_assert_str_eq((char *)(uintptr_t)(big + 3 * MiB - 6), "first");
	mrd__response__free_unpacked(ra, NULL);
	mrd__response__free_unpacked(rb, NULL);
	close(a);
	close(other);
	td_wait_domains_closed();
}
END_TEST

START_TEST(test_death_while_registering)
{
	struct td_blocker b, later;
	struct domain *d;
	struct client *ca;
	struct provider_stats ps;
	int a;
	uint64_t big;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	big = td_alloc(a, 2, 4 * MiB);
	d = ca->domain; /* joined by the Alloc */
	td_block_worker(&b);
	td_send_lookup(a, 3, big);
	td_pump();
	close(a); /* gone, and its memory with it, while the worker has yet to pin it */
	td_pump();
	ck_assert_uint_eq(td_manager->n_clients, 0);
	ck_assert_uint_eq(td_manager->core.n_domains, 1); /* the job holds it */
	td_block_worker(&later); /* behind the registration */
	td_unblock_worker(&b);
	/* The job found the memory gone: its registration (4 MiB: [cache] async_bytes) is let
	 * go of on a worker, not on the loop, so it is still there while the worker is held... */
	while (td_manager->core.n_domains == 1 && d->reg.cache.pending_bytes > 0)
		td_pump();
	ck_assert_uint_eq(td_manager->core.n_domains, 1); /* the dereg's job holds it */
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 4 * MiB);
	td_unblock_worker(&later);
	/* ...and once it went, nothing is pinned and the domain closed. */
	td_wait_domains_closed();
}
END_TEST

/* Dma with keys on a device (verbs) waits for the device: on a thread of its own. Soft's DMA,
 * made to look like a device's, shows the path: the loop and the registration workers serve
 * others meanwhile, the reply carries the result, and a client that dies while its Dma runs
 * harms nothing. */
START_TEST(test_device_dma_on_worker)
{
	struct client *ca;
	struct td_blocker b;
	Mrd__MrEntry e[2];
	uint64_t buf[2], big;
	int a, other;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	other = td_hello_client(1000, NULL);
	buf[0] = td_alloc(a, 2, 64 * 1024);
	buf[1] = td_alloc(other, 2, 64 * 1024);
	big = td_alloc(other, 3, 4 * MiB);
	lookup(a, 3, buf, 2, 0, e);
	ca->domain->reg.base.provider->caps.dma_emulated = false;
	td_dma(a, 4, PROVIDER_DMA_WRITE, &e[0], buf[0], &e[1], buf[1], 8, 0); /* the thread */
	ck_assert_ptr_nonnull(td_manager->core.dma_worker);

	td_block_pool(&b, td_manager->core.dma_worker);
	td_send_dma(a, 5, PROVIDER_DMA_WRITE, &e[0], buf[0], &e[1], buf[1] + 8, 100);
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending)); /* on the Dma thread, behind the blocker */
	ck_assert(ca->reading); /* A's later requests are read meanwhile */
	/* Meanwhile the loop serves the domain's others, and the registration workers too. */
	lookup(other, 4, &big, 1, 0, NULL);
	td_unblock_worker(&b);
	td_expect_free(a, 5, 0);
	ck_assert_ptr_null(LIST_FIRST(&ca->pending));
	ck_assert(ca->reading);
	/* Its errors come back the same way. */
	td_send_dma(a, 6, PROVIDER_DMA_WRITE, &e[0], buf[0], &e[1], buf[1] + 64 * 1024 - 8, 100);
	td_expect_free(a, 6, EFAULT);
	td_send_dma(a, 7, PROVIDER_DMA_WRITE, &e[0], buf[0], &e[1], buf[1], 0);
	td_expect_free(a, 7, EINVAL); /* no length: nothing a device would check */

	/* A domain has at most 4 Dma waiting: the fifth is refused at once, not queued. */
	{
		int more[5];

		td_block_pool(&b, td_manager->core.dma_worker);
		for (int i = 0; i < 5; i++) {
			more[i] = td_hello_client(1000, NULL);
			td_send_dma(more[i], 20, PROVIDER_DMA_WRITE, &e[0], buf[0], &e[1], buf[1], 8);
			td_pump();
		}
		td_expect_free(more[4], 20, EBUSY);
		ck_assert_uint_eq(ca->domain->reg.base.dma_jobs, 4);
		td_unblock_worker(&b);
		for (int i = 0; i < 4; i++)
			td_expect_free(more[i], 20, 0);
		ck_assert_uint_eq(ca->domain->reg.base.dma_jobs, 0);
		for (int i = 0; i < 5; i++)
			close(more[i]);
	}

	/* Gone while its Dma waits: the job holds the domain, and answers nobody. */
	td_block_pool(&b, td_manager->core.dma_worker);
	td_send_dma(a, 8, PROVIDER_DMA_WRITE, &e[0], buf[0], &e[1], buf[1], 100);
	td_pump();
	close(a);
	close(other);
	td_pump();
	ck_assert_uint_eq(td_manager->n_clients, 0);
	ck_assert_uint_eq(td_manager->core.n_domains, 1);
	td_unblock_worker(&b);
	td_wait_domains_closed();
}
END_TEST

/* A page of mrd's mapping whose first touch blocks until the test lets go (userfaultfd), so a
 * copy into it stays in progress for as long as the test wants. If nobody lets go in 5 s (the
 * copy ran on the test's own thread, the loop), it lets go by itself and says so. */
struct page_hold {
	int uffd;
	uint64_t page;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool faulted, released, timed_out;
};

static void *hold_run(void *data)
{
	struct page_hold *h = data;
	struct pollfd p = { .fd = h->uffd, .events = POLLIN };
	struct uffd_msg msg;
	struct timespec deadline;
	struct uffdio_zeropage z = { .range = { .start = h->page, .len = 4096 } };

	if (poll(&p, 1, 30000) != 1 || read(h->uffd, &msg, sizeof(msg)) != sizeof(msg))
		return NULL;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += TEST_WAIT_S; /* a loop that waits for the copy waits this long */
	pthread_mutex_lock(&h->lock);
	h->faulted = true;
	pthread_cond_broadcast(&h->cond);
	while (!h->released && !h->timed_out)
		h->timed_out = pthread_cond_timedwait(&h->cond, &h->lock, &deadline) == ETIMEDOUT;
	pthread_mutex_unlock(&h->lock);
	(void)ioctl(h->uffd, UFFDIO_ZEROPAGE, &z); /* the copy goes on into a zeroed page */
	return NULL;
}

/* false when the kernel has no userfaultfd for shared memory (the case is not run). */
static bool hold_page(struct page_hold *h, uint64_t page)
{
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .range = { .start = page, .len = 4096 },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };

	*h = (struct page_hold){ .page = page };
	h->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	if (h->uffd < 0)
		h->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (h->uffd < 0 || ioctl(h->uffd, UFFDIO_API, &api) < 0 ||
	    ioctl(h->uffd, UFFDIO_REGISTER, &reg) < 0) {
		printf("not run: userfaultfd on shared memory: %s\n", strerror(errno));
		if (h->uffd >= 0)
			close(h->uffd);
		return false;
	}
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	ck_assert_int_eq(pthread_create(&h->thread, NULL, hold_run, h), 0);
	return true;
}

static bool hold_wait_fault(struct page_hold *h)
{
	struct timespec deadline;
	bool faulted;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 30;
	pthread_mutex_lock(&h->lock);
	while (!h->faulted && pthread_cond_timedwait(&h->cond, &h->lock, &deadline) == 0)
		;
	faulted = h->faulted;
	pthread_mutex_unlock(&h->lock);
	return faulted;
}

static bool hold_timed_out(struct page_hold *h)
{
	bool timed_out;

	pthread_mutex_lock(&h->lock);
	timed_out = h->timed_out;
	pthread_mutex_unlock(&h->lock);
	return timed_out;
}

static void hold_release(struct page_hold *h)
{
	pthread_mutex_lock(&h->lock);
	h->released = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

static void hold_done(struct page_hold *h)
{
	ck_assert_int_eq(pthread_join(h->thread, NULL), 0);
	close(h->uffd);
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
}

/* A soft Dma of 64 KiB from src into dst held mid-way: dst's first page taken away
 * (registering filled it) and its next touch held. false: no userfaultfd (not run). */
static bool copy_held(struct page_hold *h, struct domain *d, int fd, uint64_t id,
		      const Mrd__MrEntry *src_mr, uint64_t src, const Mrd__MrEntry *dst_mr, uint64_t dst)
{
	struct arena *arena = domain_find_arena(d, dst);

	ck_assert_int_eq(fallocate(arena->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				   (off_t)(dst - (uintptr_t)arena->base), 4096), 0);
	if (!hold_page(h, dst))
		return false;
	td_send_dma(fd, id, PROVIDER_DMA_WRITE, src_mr, src, dst_mr, dst, 64 * 1024);
	td_pump();
	ck_assert(hold_wait_fault(h)); /* the copy is in progress, held */
	return true;
}

/* Whether a Ping from fd (another domain's) waited for the held copy; then time for answers
 * that did not wait for it to come. */
static bool ping_waited(struct page_hold *h, int fd, uint64_t id)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	bool waited;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	td_send_request(fd, &req, NULL, 0);
	td_expect_free(fd, id, 0);
	waited = hold_timed_out(h);
	for (int i = 0; i < 20; i++) {
		usleep(10000);
		td_pump();
	}
	return waited;
}

/* Soft's Dma is a copy of up to 64 MiB: it runs on the Dma thread, so the loop serves others
 * while it runs, and the memory it copies into does not go under it: a Free of that memory
 * (by its owner, in the same domain) is answered only once the copy is done. */
START_TEST(test_soft_dma_off_the_loop)
{
	struct client *ca, *cb;
	struct page_hold h;
	Mrd__MrEntry e[2];
	uint64_t addrs[2];
	int a, b, other;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	b = td_hello_client(1000, &cb);      /* the target's owner, in A's domain */
	other = td_hello_client(2000, NULL); /* another domain */
	addrs[0] = td_alloc(a, 2, 64 * 1024);
	addrs[1] = td_alloc(b, 2, 64 * 1024);
	lookup(a, 3, addrs, 2, 0, e);
	if (!copy_held(&h, ca->domain, a, 4, &e[0], addrs[0], &e[1], addrs[1]))
		return;
	td_send_free(b, 5, addrs[1]);
	ck_assert_msg(!ping_waited(&h, other, 6), "the ping waited for the copy: it ran on the loop");
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending)); /* the Dma, */
	ck_assert_ptr_nonnull(LIST_FIRST(&cb->pending)); /* and the Free waiting for it */
	hold_release(&h);
	td_expect_free(a, 4, 0);
	td_expect_free(b, 5, 0);
	hold_done(&h);
	close(a);
	close(b);
	close(other);
}
END_TEST

/* Every deregistration waits for a copy through its MR (soft_dereg), so while a Dma runs a
 * worker does it: here the owner of a pool MR the Dma copies into unregisters its pool;
 * another domain's ping must not wait. */
START_TEST(test_unregister_during_copy)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolUnregisterRequest uq = MRD__MEMPOOL_UNREGISTER_REQUEST__INIT;
	struct client *ca, *cb;
	struct page_hold h;
	Mrd__MrEntry e[1];
	Mrd__Response *resp;
	uint64_t addrs[2], len = 64 * 1024;
	bool blocked, waited;
	int a, b, other;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	b = td_hello_client(1000, &cb);
	other = td_hello_client(2000, NULL);
	addrs[0] = td_alloc(a, 2, 64 * 1024);
	addrs[1] = td_alloc(b, 2, 64 * 1024);
	lookup(a, 3, addrs, 1, 0, e);
	td_send_mempool_register(b, 3, "p", &addrs[1], &len, 1, false);
	resp = td_expect(b, 3, 0);
	if (!copy_held(&h, ca->domain, a, 4, &e[0], addrs[0], resp->mempool_register->entries[0],
		       addrs[1])) {
		mrd__response__free_unpacked(resp, NULL);
		return;
	}
	uq.name = (char *)"p";
	req.id = 5;
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_UNREGISTER;
	req.mempool_unregister = &uq;
	td_send_request(b, &req, NULL, 0);
	blocked = ping_waited(&h, other, 6);
	waited = LIST_FIRST(&cb->pending) != NULL; /* answered once the MR is gone */
	hold_release(&h);
	td_expect_free(a, 4, 0);
	td_expect_free(b, 5, 0);
	hold_done(&h);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_msg(!blocked, "the ping waited for the copy: the unregister's dereg ran on the loop");
	ck_assert_msg(waited, "the unregister was answered before the copy ended");
	close(a);
	close(b);
	close(other);
}
END_TEST

/* The Free of on-demand memory a Dma copies into (_i 0), or its owner leaving (_i 1): its
 * children are not zapped on the loop (provider_invalidate waits for the copy), their MRs go
 * on a worker, and the pages go back (and the Free answers) only after them. */
START_TEST(test_odp_free_during_copy)
{
	struct client *ca, *cb;
	struct page_hold h;
	Mrd__MrEntry e[2];
	uint64_t addrs[2], allocated;
	bool blocked, waited;
	int a, b, other;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	b = td_hello_client(1000, &cb);
	other = td_hello_client(2000, NULL);
	addrs[0] = td_alloc(a, 2, 64 * 1024);
	addrs[1] = td_alloc_flags(b, 2, 64 * 1024, MRD__ALLOC_FLAGS__ALLOC_ODP);
	lookup(a, 3, &addrs[0], 1, 0, &e[0]);
	lookup(b, 3, &addrs[1], 1, 0, &e[1]);
	allocated = ca->domain->mem.allocated_bytes;
	/* Its pages present first (a prefetching copy), then the first one taken away. */
	td_dma(a, 4, PROVIDER_DMA_WRITE, &e[0], addrs[0], &e[1], addrs[1], 64 * 1024, 0);
	if (!copy_held(&h, ca->domain, a, 5, &e[0], addrs[0], &e[1], addrs[1]))
		return;
	if (_i == 0)
		td_send_free(b, 6, addrs[1]);
	else
		close(b);
	blocked = ping_waited(&h, other, 7);
	/* No page goes back while the copy may touch it. */
	waited = ca->domain->mem.allocated_bytes == allocated && (_i == 1 || LIST_FIRST(&cb->pending));
	hold_release(&h);
	td_expect_free(a, 5, 0);
	if (_i == 0)
		td_expect_free(b, 6, 0);
	hold_done(&h);
	ck_assert_msg(!blocked, "the ping waited for the copy: the ODP Free zapped on the loop");
	ck_assert_msg(waited, "the pages went back while the copy could touch them");
	if (_i == 0)
		close(b);
	close(a);
	close(other);
}
END_TEST

START_TEST(test_big_free_on_worker)
{
	struct client *ca;
	struct td_blocker b;
	int a, peer, other;
	uint64_t big, small;
	Mrd__MrEntry e, es;
	struct provider_stats ps;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	peer = td_hello_client(1000, NULL);  /* A's domain */
	other = td_hello_client(2000, NULL); /* another domain */
	big = td_alloc(a, 2, 8 * MiB);
	small = td_alloc(peer, 2, 4096);
	lookup(a, 3, &big, 1, 0, &e);
	lookup(peer, 3, &small, 1, 0, &es);

	td_block_worker(&b);
	td_send_free(a, 4, big); /* 8 MiB of MRs: a worker deregisters them, and it is busy */
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending)); /* A waits for its Free */
	ck_assert(ca->reading); /* and its later requests are read meanwhile */
	/* The job holds the domain open but is no client: quota.clients counts two. */
	ck_assert_uint_eq(ca->domain->n_users, 2);
	ck_assert_uint_eq(ca->domain->n_job_refs, 1);
	ck_assert_uint_eq(ca->domain->mem.status.page->clients, 2);
	/* Retired already: nobody gets a key for it, and the others are served meanwhile. */
	lookup(peer, 4, &big, 1, ENOENT, NULL);
	lookup(peer, 5, &small, 1, 0, NULL);
	lookup(other, 3, &(uint64_t){ td_alloc(other, 2, 4096) }, 1, 0, NULL);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 2); /* the device still holds it */
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 8 * MiB + 4096);

	td_unblock_worker(&b);
	td_expect_free(a, 4, 0);
	ck_assert_ptr_null(LIST_FIRST(&ca->pending));
	ck_assert(ca->reading);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 4096);
	ck_assert_uint_eq(ca->domain->reg.cache.deregistrations, 1);
	/* Once Free answered, the old key is dead and the pages are free to hand out again. */
	td_dma(peer, 6, PROVIDER_DMA_WRITE, &es, small, &e, big, 8, ENOKEY);
	ck_assert_uint_eq(td_alloc(a, 5, 8 * MiB), big);
	close(a);
	close(peer);
	close(other);
}
END_TEST

/* A big free's pages go back on a worker (fallocate punching 1 GiB takes ~100 ms): the loop
 * serves everyone meanwhile, even the domain's other clients, and the Free answers only once
 * the pages are back, with the quota counting them until then. A hand-over keeps the content:
 * nothing to punch, answered at once. */
START_TEST(test_big_free_punches_on_worker)
{
	struct client *ca;
	struct td_blocker b;
	int a, peer, other;
	uint64_t big, small;
	uint8_t *p;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	peer = td_hello_client(1000, NULL);  /* A's domain */
	other = td_hello_client(2000, NULL); /* another domain */
	big = td_alloc(a, 2, 8 * MiB); /* no MR: the device has nothing to let go */
	small = td_alloc(peer, 2, 4096);
	p = (uint8_t *)(uintptr_t)big; /* the window is this process's */
	memset(p, 0x5a, 8 * MiB);

	td_block_worker(&b);
	td_send_free(a, 3, big);
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending)); /* A waits while a worker punches */
	ck_assert_uint_eq(ca->domain->mem.allocated_bytes, 8 * MiB + 4096);
	lookup(peer, 3, &small, 1, 0, NULL);
	lookup(other, 3, &(uint64_t){ td_alloc(other, 2, 4096) }, 1, 0, NULL);
	td_unblock_worker(&b);
	td_expect_free(a, 3, 0);
	ck_assert_ptr_null(LIST_FIRST(&ca->pending));
	ck_assert_uint_eq(ca->domain->mem.allocated_bytes, 4096);
	ck_assert_uint_eq(td_alloc(a, 4, 8 * MiB), big);
	ck_assert_uint_eq(p[0], 0);
	ck_assert_uint_eq(p[8 * MiB - 1], 0);

	/* A hand-over: the content stays, and so the Free needs no worker. */
	memset(p, 0x5a, 8 * MiB);
	window_keep_content(&td_manager->core.window, true);
	td_block_worker(&b);
	td_free(a, 5, big, 0);
	ck_assert_uint_eq(p[4 * MiB], 0x5a);
	td_unblock_worker(&b);
	window_keep_content(&td_manager->core.window, false);
	close(a);
	close(peer);
	close(other);
}
END_TEST

/* A Free's worker punches the run, and the loop punches only the rest of the arena it empties
 * (clients map whole arenas): punching the run again took mrd's loop 0.3 ms per GiB, already
 * empty. The next Alloc still hands the run out empty, and pages touched outside it go back. */
START_TEST(test_emptying_free_punches_the_run_once)
{
	struct td_blocker before, after;
	struct client *ca;
	uint64_t whole, half;
	uint8_t *p;
	int a;

	td_start_one_worker(); /* 64 MiB arenas */
	a = td_hello_client(3000, &ca);
	whole = td_alloc(a, 2, 64 * MiB); /* the arena, alone in its domain */
	p = (uint8_t *)(uintptr_t)whole;

	td_block_worker(&before);
	td_send_free(a, 3, whole);
	td_pump(); /* the punch is queued behind before */
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending));
	td_block_worker(&after);
	ck_assert_int_eq(write(before.fd[1], "x", 1), 1); /* the loop stays still from here */
	test_wait_until(__atomic_load_n(&after.entered, __ATOMIC_ACQUIRE), 1000);
	ck_assert(__atomic_load_n(&after.entered, __ATOMIC_ACQUIRE)); /* the run is punched */
	p[0] = 0x5a; /* A writes into what it freed, before the loop hears of the punch */
	p[64 * MiB - 1] = 0x5a;
	td_unblock_worker(&after);
	close(before.fd[0]);
	close(before.fd[1]);
	td_expect_free(a, 3, 0);
	ck_assert_uint_eq(ca->domain->mem.allocated_bytes, 0);
	ck_assert_uint_eq(p[0], 0x5a); /* the loop left the run alone */
	ck_assert_uint_eq(p[64 * MiB - 1], 0x5a);
	ck_assert_uint_eq(td_alloc(a, 4, 64 * MiB), whole);
	ck_assert_uint_eq(p[0], 0); /* handed out empty all the same */
	ck_assert_uint_eq(p[64 * MiB - 1], 0);

	/* The last run in either half: the other half, touched though nobody had it, goes. */
	td_free(a, 5, whole, 0);
	half = td_alloc(a, 6, 32 * MiB);
	ck_assert_uint_eq(half, whole);
	ck_assert_uint_eq(td_alloc(a, 7, 32 * MiB), whole + 32 * MiB);
	td_free(a, 8, half, 0);
	memset(p, 0x5a, 64 * MiB);
	td_free(a, 9, whole + 32 * MiB, 0);
	ck_assert_uint_eq(p[0], 0);
	ck_assert_uint_eq(p[32 * MiB - 1], 0);
	ck_assert_uint_eq(p[32 * MiB], 0);
	ck_assert_uint_eq(p[64 * MiB - 1], 0);
	ck_assert_uint_eq(td_alloc(a, 10, 32 * MiB), half);
	memset(p, 0x5a, 64 * MiB);
	td_free(a, 11, half, 0);
	ck_assert_uint_eq(p[0], 0);
	ck_assert_uint_eq(p[32 * MiB], 0);
	ck_assert_uint_eq(p[64 * MiB - 1], 0);
	close(a);
}
END_TEST

START_TEST(test_death_while_deregistering)
{
	struct td_blocker b;
	int a;
	uint64_t big;

	td_start_one_worker();
	a = td_hello_client(1000, NULL);
	big = td_alloc(a, 2, 4 * MiB);
	lookup(a, 3, &big, 1, 0, NULL);
	td_block_worker(&b);
	close(a); /* its MRs go to the worker, behind the blocker */
	td_pump();
	ck_assert_uint_eq(td_manager->n_clients, 0);
	ck_assert_uint_eq(td_manager->core.n_domains, 1); /* the job holds it */
	td_unblock_worker(&b);
	td_wait_domains_closed();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mr-cache");
	TCase *tc = tcase_create("cache"), *keys = tcase_create("keys");
	TCase *quarantine = tcase_create("quarantine");
	TCase *quarantine_window_only = tcase_create("quarantine-window-only");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_contig_lookup_and_dma);
	tcase_add_test(tc, test_free_bumps_only_over_registrations);
	tcase_add_test(tc, test_frmr_admin_requests);
	tcase_add_test(tc, test_flush);
	tcase_add_test(tc, test_domain_dump);
	tcase_add_test(tc, test_bad_lookups);
	tcase_add_test(tc, test_page_policy);
	tcase_add_test(tc, test_contig_around_existing);
	tcase_add_test(tc, test_pinned_quota);
	tcase_add_test(tc, test_host_pinned_limit);
	tcase_add_test(tc, test_table_overflow);
	tcase_add_test(tc, test_lookup_loop_share_per_request);
	tcase_add_test(tc, test_lookup_loop_share_per_turn);
	tcase_add_test(tc, test_lookup_loop_share_bytes);
	tcase_add_test(tc, test_big_registrations_queue_no_other_domain);
	tcase_add_test(tc, test_big_registration_blocks_nobody);
	tcase_add_test(tc, test_racing_registrations);
	tcase_add_test(tc, test_overlapping_registrations);
	tcase_add_test(tc, test_death_while_registering);
	tcase_add_test(tc, test_big_free_on_worker);
	tcase_add_test(tc, test_big_free_punches_on_worker);
	tcase_add_test(tc, test_emptying_free_punches_the_run_once);
	tcase_add_test(tc, test_device_dma_on_worker);
	tcase_add_test(tc, test_soft_dma_off_the_loop);
	tcase_add_test(tc, test_unregister_during_copy);
	tcase_add_loop_test(tc, test_odp_free_during_copy, 0, 2);
	tcase_add_test(tc, test_death_while_deregistering);
	suite_add_tcase(s, tc);
	/* Key safety: tests/keys-mlx5.sh runs these again where released keys come back. */
	tcase_add_checked_fixture(keys, setup, teardown);
	tcase_add_test(keys, test_free_retires_keys);
	tcase_add_test(keys, test_handle_reuse_keeps_stale_keys_out);
	tcase_add_loop_test(keys, test_old_rkey_refused_over_reuse, 0, 2);
	suite_add_tcase(s, keys);
	/* What mrctl pools shows of the key quarantine: keys-mlx5.sh runs it in every mode. */
	tcase_add_checked_fixture(quarantine, setup, teardown);
	tcase_add_test(quarantine, test_quarantine_counts_shown);
	suite_add_tcase(s, quarantine);
	tcase_add_checked_fixture(quarantine_window_only, setup_window_only, teardown);
	tcase_add_test(quarantine_window_only, test_window_only_parks_nothing);
	suite_add_tcase(s, quarantine_window_only);
	return run_suite(s);
}
