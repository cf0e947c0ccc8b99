/* SPDX-License-Identifier: MIT */
/* Mempool registrations in-process: ranges rounded to pages and merged, EEXIST/ENOENT, the
 * extmem replacement, memory under a pool that cannot be freed, client death, a pool in
 * another client's memory outliving that client, Pools for mrctl, and the quota. Sharing one
 * huge page's MR needs huge pages: tests/test-hugetlb.c. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "memory/arena.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "core/domain.h"
#include "control/manager.h"
#include "provider/provider.h"
#include "status-page.h"
#include "base/worker-pool.h"
#include "test-daemon.h"
#include "check-run.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

static void setup(void)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "quota.mempools=4", NULL };

	td_start(settings);
}

static void teardown(void) { td_stop(); }

/* MempoolRegister of n ranges; the reply must carry error. Returns the reply (free it) or
 * NULL on error. */
static Mrd__Response *reg(int fd, uint64_t id, const char *name, const uint64_t *starts,
			  const uint64_t *lengths, size_t n, bool extmem, int error)
{
	Mrd__Response *resp;

	td_send_mempool_register(fd, id, name, starts, lengths, n, extmem);
	resp = td_expect(fd, id, error);
	if (error) {
		mrd__response__free_unpacked(resp, NULL);
		return NULL;
	}
	ck_assert_int_eq(resp->body_case, MRD__RESPONSE__BODY_MEMPOOL_REGISTER);
	return resp;
}

/* As reg() for a registration that must succeed; returns how many MRs it got. */
static size_t reg_ok(int fd, uint64_t id, const char *name, const uint64_t *starts,
		     const uint64_t *lengths, size_t n)
{
	Mrd__Response *resp = reg(fd, id, name, starts, lengths, n, false, 0);
	size_t n_mrs = resp->mempool_register->n_entries;

	mrd__response__free_unpacked(resp, NULL);
	return n_mrs;
}


static void send_register(int fd, uint64_t id, const char *name, uint64_t start, uint64_t len)
{
	td_send_mempool_register(fd, id, name, &start, &len, 1, false);
}

START_TEST(test_ranges_rounded_and_merged)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 1 * MiB);
	/* Two chunks that touch, and a third one page further on, not page-aligned. */
	uint64_t starts[] = { a + 100, a + 64 * KiB, a + 256 * KiB + 5 };
	uint64_t lengths[] = { 64 * KiB - 100, 8 * KiB, 10 };
	Mrd__Response *resp = reg(fd, 3, "rx", starts, lengths, 3, false, 0);
	struct provider_stats ps;
	uint64_t gen;

	Mrd__MrEntry **e = resp->mempool_register->entries;

	ck_assert_uint_eq(resp->mempool_register->n_entries, 2);
	ck_assert_uint_eq(resp->mempool_register->entries[0]->start, a);
	ck_assert_uint_eq(resp->mempool_register->entries[0]->end, a + 72 * KiB);
	ck_assert_uint_eq(resp->mempool_register->entries[1]->start, a + 256 * KiB);
	ck_assert_uint_eq(resp->mempool_register->entries[1]->end, a + 260 * KiB);
	/* The keys work, and only inside their ranges. */
	td_dma(fd, 4, PROVIDER_DMA_WRITE, e[0], a, e[1], a + 256 * KiB, 8, 0);
	td_dma(fd, 5, PROVIDER_DMA_WRITE, e[0], a + 72 * KiB, e[1], a + 256 * KiB, 8, EFAULT);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 2);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 76 * KiB);

	reg(fd, 6, "rx", starts, lengths, 1, false, EEXIST);
	gen = c->domain->mem.status.page->generation;
	td_mempool_unregister(fd, 7, "rx", 0);
	ck_assert_uint_eq(c->domain->mem.status.page->generation, gen + 2);
	/* One move per MR, each recording that MR's range alone (in either order). */
	{
		const struct mrd_status_freed *f = c->domain->mem.status.page->freed;
		const struct mrd_status_freed *f1 = &f[(gen + 1) % MRD_STATUS_FREED];
		const struct mrd_status_freed *f2 = &f[(gen + 2) % MRD_STATUS_FREED];

		ck_assert_uint_eq(f1->generation, gen + 1);
		ck_assert_uint_eq(f2->generation, gen + 2);
		ck_assert_uint_eq(f1->start + f2->start, a + a + 256 * KiB);
		ck_assert_uint_eq(f1->end + f2->end, a + 72 * KiB + a + 260 * KiB);
		ck_assert_uint_eq(f1->end - f1->start + f2->end - f2->start, 76 * KiB);
	}
	td_dma(fd, 8, PROVIDER_DMA_WRITE, e[0], a, e[1], a + 256 * KiB, 8, ENOKEY);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 0);
	td_mempool_unregister(fd, 9, "rx", ENOENT);
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
}
END_TEST

START_TEST(test_bad_requests)
{
	int fd = td_hello_client(1000, NULL), other = td_hello_client(2000, NULL);
	uint64_t a = td_alloc(fd, 2, 64 * KiB), b = td_alloc(other, 2, 64 * KiB);
	uint64_t len = 4 * KiB, zero = 0, across = 128 * KiB;
	char long_name[80];

	memset(long_name, 'x', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	reg(fd, 3, "", &a, &len, 1, false, EINVAL);
	reg(fd, 4, long_name, &a, &len, 1, false, EINVAL);
	reg(fd, 5, "p", &a, &len, 0, false, EINVAL);
	reg(fd, 6, "p", &a, &zero, 1, false, EFAULT);
	reg(fd, 7, "p", &a, &across, 1, false, EFAULT);  /* runs past the allocation */
	reg(fd, 8, "p", &b, &len, 1, false, EFAULT);     /* another domain's memory */
	reg(fd, 9, "p", &(uint64_t){ 0x1000 }, &len, 1, false, EFAULT);
	td_mempool_unregister(fd, 10, "", EINVAL);
	/* Nothing of it was kept. */
	ck_assert_uint_eq(reg_ok(fd, 11, "p", &a, &len, 1), 1);
	close(fd);
	close(other);
}
END_TEST

START_TEST(test_extmem_replaces)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 1 * MiB);
	uint64_t chunk_len = 1 * MiB, objs[8], lens[8];
	Mrd__Response *whole, *pages;
	struct provider_stats ps;

	whole = reg(fd, 3, "ext", &a, &chunk_len, 1, false, 0);
	ck_assert_uint_eq(whole->mempool_register->n_entries, 1);
	/* Objects of 200 bytes every 16 KiB, each across a page boundary: the two pages each one
	 * touches, and nothing between them. */
	for (int i = 0; i < 8; i++) {
		objs[i] = a + (uint64_t)i * 16 * KiB + 4000;
		lens[i] = 200; /* crosses into the next page */
	}
	pages = reg(fd, 4, "ext", objs, lens, 8, true, 0);
	ck_assert_uint_eq(pages->mempool_register->n_entries, 8);
	for (size_t i = 0; i < 8; i++) {
		ck_assert_uint_eq(pages->mempool_register->entries[i]->start, a + i * 16 * KiB);
		ck_assert_uint_eq(pages->mempool_register->entries[i]->end,
				  a + i * 16 * KiB + 8 * KiB);
	}
	/* Answered once the chunk registration is gone: the replacement's MRs alone are left. */
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 8);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 64 * KiB);
	td_dma(fd, 5, PROVIDER_DMA_WRITE, whole->mempool_register->entries[0], a,
	       pages->mempool_register->entries[0], a, 8, ENOKEY);
	reg(fd, 6, "ext", objs, lens, 8, true, EEXIST);
	reg(fd, 7, "ext", &a, &chunk_len, 1, false, EEXIST);
	mrd__response__free_unpacked(whole, NULL);
	mrd__response__free_unpacked(pages, NULL);
	close(fd);
}
END_TEST

/* The replaced chunk registration is gone when the extmem one is answered: its pinned bytes
 * no longer counted, its MR off the device — even when a worker deregisters it. */
START_TEST(test_extmem_replaced_before_the_reply)
{
	struct client *c;
	struct td_blocker b;
	struct provider_stats ps;
	uint64_t a, chunk_len = 1 * MiB, objs[8], lens[8];
	Mrd__Response *resp;
	int fd;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 1 * MiB);
	resp = reg(fd, 3, "ext", &a, &chunk_len, 1, false, 0); /* 1 MiB: on the worker */
	mrd__response__free_unpacked(resp, NULL);
	for (int i = 0; i < 8; i++) {
		objs[i] = a + (uint64_t)i * 16 * KiB;
		lens[i] = 256;
	}
	td_block_worker(&b);
	/* Small: registered on the loop; the 1 MiB it replaces is deregistered on the worker. */
	td_send_mempool_register(fd, 4, "ext", objs, lens, 8, true);
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&c->pending)); /* no answer while the old MR is still pinned */
	/* The replacement's pages lie inside the old MR's: counted once. */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1 * MiB);
	td_unblock_worker(&b);
	resp = td_expect(fd, 4, 0);
	ck_assert_uint_eq(resp->mempool_register->n_entries, 8);
	/* Right at the reply: only the replacement is counted, and only it is on the device. */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 32 * KiB);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 8);
	ck_assert_uint_eq(ps.pinned_bytes, 32 * KiB);
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
	td_wait_domains_closed();
}
END_TEST

/* A lookup inside a registered pool's pages answers with the pool's MR instead of pinning
 * them a second time; a lookup elsewhere in the allocation registers around the pool. */
START_TEST(test_lookup_uses_the_pool_mr)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 1 * MiB), start, len = 64 * KiB, gen;
	Mrd__MrEntry in, before, after, again;
	const Mrd__MrEntry *pool;
	Mrd__Response *resp;
	struct provider_stats ps;

	start = a + 64 * KiB;
	resp = reg(fd, 3, "p", &start, &len, 1, false, 0);
	pool = resp->mempool_register->entries[0];
	td_lookup(fd, 4, start + 5, 0, &in);
	ck_assert_uint_eq(in.start, pool->start);
	ck_assert_uint_eq(in.end, pool->end);
	ck_assert_uint_eq(in.lkey, pool->lkey);
	ck_assert_uint_eq(in.rkey, pool->rkey);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 64 * KiB);
	/* Around it: the runs on either side, not over it. */
	td_lookup(fd, 5, a, 0, &before);
	ck_assert_uint_eq(before.start, a);
	ck_assert_uint_eq(before.end, start);
	td_lookup(fd, 6, a + 512 * KiB, 0, &after);
	ck_assert_uint_eq(after.start, start + len);
	ck_assert_uint_eq(after.end, a + 1 * MiB);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1 * MiB);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 3);
	ck_assert_uint_eq(ps.pinned_bytes, 1 * MiB);
	/* The keys it gave work. */
	memcpy((void *)(uintptr_t)a, "around", 7);
	td_dma(fd, 7, PROVIDER_DMA_WRITE, &before, a, &in, start + 100, 7, 0);
	ck_assert_str_eq((char *)(uintptr_t)(start + 100), "around");
	/* The pool goes: its pages get a registration of their own at the next lookup. */
	gen = c->domain->mem.status.page->generation;
	td_mempool_unregister(fd, 8, "p", 0);
	ck_assert_uint_gt(c->domain->mem.status.page->generation, gen);
	td_lookup(fd, 9, start + 5, 0, &again);
	ck_assert_uint_eq(again.start, start);
	ck_assert_uint_eq(again.end, start + len);
	ck_assert_uint_ne(again.rkey, in.rkey);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1 * MiB);
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
}
END_TEST

/* A lookup before the pool registers the whole allocation; a pool over part of it pins no
 * new page, so it is not counted again — nor refused with the domain's quota all taken — and
 * the pages stay counted until the last MR over them goes. */
START_TEST(test_pool_after_lookup_counts_once)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 1 * MiB), start, len = 64 * KiB;
	Mrd__MrEntry e;
	Mrd__Response *resp;
	struct provider_stats ps;

	td_lookup(fd, 3, a, 0, &e);
	ck_assert_uint_eq(e.start, a);
	ck_assert_uint_eq(e.end, a + 1 * MiB);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1 * MiB);
	c->domain->quota.pinned_bytes = 1 * MiB;
	start = a + 64 * KiB;
	resp = reg(fd, 4, "p", &start, &len, 1, false, 0);
	mrd__response__free_unpacked(resp, NULL);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.pinned_bytes, 1 * MiB); /* the provider pinned no new page */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1 * MiB);
	td_mempool_unregister(fd, 5, "p", 0);
	/* The lookup's MR stays. */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 1 * MiB);
	td_free(fd, 6, a, 0);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 0);
	close(fd);
}
END_TEST

/* Two lookups in one allocation while the first one's registration waits for a worker: the
 * second, inside the run being registered, waits for it rather than register (and count) the
 * run again, so that 2 MiB under a 3 MiB quota is not refused. */
START_TEST(test_concurrent_lookups_quota)
{
	struct client *ca;
	struct td_blocker b;
	Mrd__Response *resp;
	uint64_t big;
	int a, peer;

	td_start_one_worker();
	td_manager->core.config.quota.pinned_bytes = 3 * MiB;
	a = td_hello_client(1000, &ca);
	peer = td_hello_client(1000, NULL);
	big = td_alloc(a, 2, 2 * MiB);
	td_block_worker(&b);
	td_send_lookup(a, 3, big); /* the whole 2 MiB, on the blocked worker */
	td_pump();
	ck_assert_uint_eq(ca->domain->reg.cache.pending_bytes, 2 * MiB);
	/* Counted from the start. */
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 2 * MiB);
	td_send_lookup(peer, 3, big + 1 * MiB);
	td_pump();
	/* No second registration. */
	ck_assert_uint_eq(ca->domain->reg.cache.pending_bytes, 2 * MiB);
	td_unblock_worker(&b);
	resp = td_expect(a, 3, 0);
	mrd__response__free_unpacked(resp, NULL);
	td_pump_until_zero(&ca->domain->reg.base.jobs);
	resp = td_expect(peer, 3, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, big);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 2 * MiB);
	ck_assert_uint_eq(ca->domain->reg.cache.registrations, 1);
	close(a);
	close(peer);
	td_wait_domains_closed();
}
END_TEST

/* A lookup beside a run a worker is registering (cut at the device's largest MR) registers
 * only up to it: no page is registered, or counted, twice, even for a while — the quota just
 * holds both. */
START_TEST(test_lookup_beside_a_run_being_registered)
{
	struct client *ca;
	struct td_blocker b;
	Mrd__Response *resp;
	uint64_t big;
	int a, peer;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	peer = td_hello_client(1000, NULL);
	big = td_alloc(a, 2, 4 * MiB);
	ca->domain->reg.base.provider->caps.max_mr_size = 1 * MiB;
	ca->domain->quota.pinned_bytes = 1 * MiB + 512 * KiB;
	td_block_worker(&b);
	td_send_lookup(a, 3, big + 2 * MiB); /* [2 MiB, 3 MiB), on the blocked worker */
	td_pump();
	td_send_lookup(peer, 3, big + 1 * MiB + 512 * KiB); /* up to 2 MiB only */
	td_pump();
	ck_assert_uint_eq(ca->domain->reg.cache.pending_bytes, 1 * MiB + 512 * KiB);
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 1 * MiB + 512 * KiB);
	td_unblock_worker(&b);
	resp = td_expect(a, 3, 0);
	mrd__response__free_unpacked(resp, NULL);
	resp = td_expect(peer, 3, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, big + 1 * MiB + 512 * KiB);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->end, big + 2 * MiB);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 1 * MiB + 512 * KiB);
	close(a);
	close(peer);
	td_wait_domains_closed();
}
END_TEST

/* Two pools over partly the same pages (4 KiB pages: an MR each) count the union, in
 * whichever order they go; a pool refused for the quota leaves nothing behind. */
START_TEST(test_overlapping_pools_count_once)
{
	struct client *c;
	int fd = td_hello_client(1000, &c);
	uint64_t a = td_alloc(fd, 2, 64 * KiB), b = td_alloc(fd, 3, 64 * KiB);
	uint64_t len = 48 * KiB, late = a + 16 * KiB, all = 64 * KiB;
	struct provider_stats ps;
	Mrd__Response *resp;

	ck_assert_uint_eq(reg_ok(fd, 4, "p0", &a, &len, 1), 1);
	ck_assert_uint_eq(reg_ok(fd, 5, "p1", &late, &len, 1), 1);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.pinned_bytes, 64 * KiB);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 64 * KiB);
	/* The whole allocation again: no new page, so a full quota still takes it. */
	c->domain->quota.pinned_bytes = 64 * KiB;
	ck_assert_uint_eq(reg_ok(fd, 6, "p2", &a, &all, 1), 1);
	td_send_mempool_register(fd, 7, "p3", &b, &all, 1, false);
	resp = td_expect(fd, 7, EDQUOT);
	ck_assert_msg(strstr(resp->message, ": 65536 in use, tried to pin 65536 more; raise "
				     "[quota] pinned_bytes in mrd.conf and reload mrd"), "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 3);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 64 * KiB);
	td_mempool_unregister(fd, 8, "p2", 0);
	td_mempool_unregister(fd, 9, "p0", 0);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 48 * KiB); /* p1's pages */
	td_mempool_unregister(fd, 10, "p1", 0);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 0);
	close(fd);
}
END_TEST

/* A pool MR made while a lookup's registration of a run around it waits for a worker (as a
 * second worker would, finishing first): that registration goes, and the lookup gets the run
 * beside the pool. */
START_TEST(test_pool_made_while_a_lookup_registers)
{
	struct client *ca;
	struct td_blocker b;
	Mrd__Response *resp;
	struct provider_stats ps;
	uint64_t big, start, len = 64 * KiB, pending;
	int a, peer;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	peer = td_hello_client(1000, NULL);
	big = td_alloc(a, 2, 4 * MiB);
	start = big + 1 * MiB;
	td_block_worker(&b);
	td_send_lookup(a, 3, big); /* the whole 4 MiB, on the blocked worker */
	td_pump();
	ck_assert_uint_eq(ca->domain->reg.cache.pending_bytes, 4 * MiB);
	/* A small pool, registered on the loop right now. */
	pending = ca->domain->reg.cache.pending_bytes;
	ca->domain->reg.cache.pending_bytes = 0;
	resp = reg(peer, 4, "p", &start, &len, 1, false, 0);
	mrd__response__free_unpacked(resp, NULL);
	ca->domain->reg.cache.pending_bytes = pending;
	td_unblock_worker(&b);
	resp = td_expect(a, 3, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, big);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->end, start);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 1 * MiB + 64 * KiB);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 2);
	close(a);
	close(peer);
	td_wait_domains_closed();
}
END_TEST

/* A lookup inside a pool MR a worker is still making waits for it, and gets it. */
START_TEST(test_lookup_waits_for_a_pool_mr)
{
	struct client *ca, *cb;
	struct td_blocker b;
	Mrd__Response *rp, *rl;
	struct provider_stats ps;
	uint64_t big;
	int a, peer;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	peer = td_hello_client(1000, &cb);
	big = td_alloc(a, 2, 4 * MiB);
	td_block_worker(&b);
	send_register(a, 3, "big", big + 1 * MiB, 2 * MiB); /* on the blocked worker */
	td_pump();
	td_send_lookup(peer, 3, big + 2 * MiB);
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&cb->pending));
	ck_assert_uint_eq(cb->domain->reg.cache.pending_bytes, 0); /* it waits, pinning nothing */
	td_unblock_worker(&b);
	rp = td_expect(a, 3, 0);
	rl = td_expect(peer, 3, 0);
	ck_assert_uint_eq(rl->mr_lookup->entries[0]->start, big + 1 * MiB);
	ck_assert_uint_eq(rl->mr_lookup->entries[0]->end, big + 3 * MiB);
	ck_assert_uint_eq(rl->mr_lookup->entries[0]->lkey, rp->mempool_register->entries[0]->lkey);
	ck_assert_uint_eq(ca->domain->reg.cache.charges.pinned_bytes, 2 * MiB);
	provider_stats(ca->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	mrd__response__free_unpacked(rp, NULL);
	mrd__response__free_unpacked(rl, NULL);
	close(a);
	close(peer);
	td_wait_domains_closed();
}
END_TEST

START_TEST(test_memory_under_a_pool_stays)
{
	int fd = td_hello_client(1000, NULL);
	uint64_t a = td_alloc(fd, 2, 64 * KiB), len = 64 * KiB;

	ck_assert_uint_eq(reg_ok(fd, 3, "p", &a, &len, 1), 1);
	td_free(fd, 4, a, EBUSY);
	td_mempool_unregister(fd, 5, "p", 0);
	td_free(fd, 6, a, 0);
	close(fd);
}
END_TEST

START_TEST(test_death_releases_pools)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), peer = td_hello_client(1000, NULL);
	uint64_t a = td_alloc(fd, 2, 1 * MiB), len = 1 * MiB;
	struct domain *d = c->domain;
	struct provider_stats ps;

	(void)td_alloc(peer, 2, 4 * KiB); /* the peer holds the domain open */
	ck_assert_uint_eq(reg_ok(fd, 3, "p", &a, &len, 1), 1);
	close(fd);
	td_pump();
	ck_assert_uint_eq(td_manager->n_clients, 1);
	td_pump_until_zero(&d->reg.base.jobs);
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	ck_assert_uint_eq(d->mem.allocations.n, 1); /* the peer's */
	ck_assert(LIST_EMPTY(&d->reg.mempools.regs));
	close(peer);
}
END_TEST

START_TEST(test_pool_in_memory_of_a_client_that_left)
{
	struct client *cb;
	int a = td_hello_client(1000, NULL), b = td_hello_client(1000, &cb);
	uint64_t mem = td_alloc(a, 2, 64 * KiB), len = 32 * KiB;
	Mrd__Response *resp = reg(b, 3, "in-a", &mem, &len, 1, false, 0);
	struct domain *d = cb->domain;

	close(a);
	td_pump();
	/* A's memory stays, ownerless, for B's pool: its key still works. */
	ck_assert_uint_eq(d->mem.allocations.n, 1);
	td_dma(b, 4, PROVIDER_DMA_WRITE, resp->mempool_register->entries[0], mem,
	       resp->mempool_register->entries[0], mem + 4096, 8, 0);
	td_free(b, 5, mem, EPERM);
	td_mempool_unregister(b, 6, "in-a", 0);
	ck_assert_uint_eq(d->mem.allocations.n, 0); /* the last pool took it with it */
	ck_assert_uint_eq(d->mem.allocated_bytes, 0);
	mrd__response__free_unpacked(resp, NULL);
	close(b);
}
END_TEST

START_TEST(test_pools_and_quota)
{
	struct client *c;
	int fd = td_hello_client(1000, &c), admin = td_hello_client(0, NULL);
	int other = td_hello_client(2000, NULL);
	uint64_t a = td_alloc(fd, 2, 64 * KiB), len = 4 * KiB;
	const char *names[] = { "p0", "p1", "p2", "p3" };
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolsRequest q = MRD__MEMPOOLS_REQUEST__INIT;
	Mrd__Response *resp;

	for (int i = 0; i < 4; i++)
		ck_assert_uint_eq(reg_ok(fd, 3 + (uint64_t)i, names[i], &a, &len, 1), 1);
	reg(fd, 8, "p4", &a, &len, 1, false, EDQUOT);
	/* Four MRs over one page: the page counts once. */
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 4 * KiB);

	req.id = 9;
	req.body_case = MRD__REQUEST__BODY_MEMPOOLS;
	req.mempools = &q;
	/* Another user's domain shows none of them; their own, all four (as root does). */
	td_send_request(other, &req, NULL, 0);
	resp = td_expect(other, 9, 0);
	ck_assert_uint_eq(resp->mempools->n_mempools, 0);
	mrd__response__free_unpacked(resp, NULL);
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect(fd, 9, 0);
	ck_assert_uint_eq(resp->mempools->n_mempools, 4);
	mrd__response__free_unpacked(resp, NULL);
	td_send_request(admin, &req, NULL, 0);
	resp = td_expect(admin, 9, 0);
	ck_assert_uint_eq(resp->mempools->n_mempools, 4);
	for (size_t i = 0; i < 4; i++) {
		ck_assert_str_eq(resp->mempools->mempools[i]->domain, "uid-1000");
		ck_assert_uint_eq(resp->mempools->mempools[i]->n_mrs, 1);
		ck_assert_uint_eq(resp->mempools->mempools[i]->mrs[0]->start, a);
		ck_assert_uint_eq(resp->mempools->mempools[i]->mrs[0]->sharers, 1); /* 4 KiB pages */
	}
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
	close(admin);
	close(other);
}
END_TEST

START_TEST(test_big_pool_on_worker)
{
	struct client *ca;
	struct td_blocker b;
	int a, other;
	uint64_t big, small;
	Mrd__Response *resp;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	other = td_hello_client(2000, NULL);
	big = td_alloc(a, 2, 8 * MiB);
	small = td_alloc(other, 2, 64 * KiB);
	td_block_worker(&b);
	send_register(a, 3, "big", big, 8 * MiB); /* a worker pins it; the worker is busy */
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending));
	/* Meanwhile everyone else is served, small pools included. */
	ck_assert_uint_eq(reg_ok(other, 3, "small", &small, &(uint64_t){ 64 * KiB }, 1), 1);
	/* A Free of the memory the pool is being registered in is read meanwhile, and finds it
	 * under the pool already. */
	td_send_free(a, 4, big);
	td_expect_free(a, 4, EBUSY);
	td_unblock_worker(&b);
	resp = td_expect(a, 3, 0);
	ck_assert_uint_eq(resp->mempool_register->n_entries, 1);
	ck_assert_uint_eq(resp->mempool_register->entries[0]->start, big);
	ck_assert_uint_eq(resp->mempool_register->entries[0]->end, big + 8 * MiB);
	ck_assert_uint_ne(resp->mempool_register->entries[0]->lkey, MRD_KEY_INVALID);
	ck_assert_uint_eq(ca->domain->reg.cache.registrations, 1);
	mrd__response__free_unpacked(resp, NULL);
	close(a);
	close(other);
}
END_TEST

START_TEST(test_death_while_pool_registers)
{
	struct td_blocker b;
	int a;
	uint64_t big;

	td_start_one_worker();
	a = td_hello_client(1000, NULL);
	big = td_alloc(a, 2, 4 * MiB);
	td_block_worker(&b);
	send_register(a, 3, "big", big, 4 * MiB);
	td_pump();
	close(a); /* gone while the worker has yet to pin its pool */
	td_pump();
	ck_assert_uint_eq(td_manager->n_clients, 0);
	ck_assert_uint_eq(td_manager->core.n_domains, 1); /* the job holds it */
	td_unblock_worker(&b);
	/* The job's MR had no pool left: deregistered, memory freed, domain closed. */
	td_wait_domains_closed();
}
END_TEST

/* Unregistering a big pool deregisters on a worker: only that client waits, and when its
 * answer comes the keys are dead. */
START_TEST(test_big_unregister_on_worker)
{
	struct client *ca;
	struct td_blocker b;
	Mrd__Response *resp;
	Mrd__MrEntry e;
	uint64_t big, small;
	int a, other;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	other = td_hello_client(2000, NULL);
	big = td_alloc(a, 2, 8 * MiB);
	small = td_alloc(other, 2, 64 * KiB);
	resp = reg(a, 3, "big", &big, &(uint64_t){ 8 * MiB }, 1, false, 0);
	e = *resp->mempool_register->entries[0];
	mrd__response__free_unpacked(resp, NULL);
	td_block_worker(&b);
	{
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__MempoolUnregisterRequest q = MRD__MEMPOOL_UNREGISTER_REQUEST__INIT;

		q.name = (char *)"big";
		req.id = 4;
		req.body_case = MRD__REQUEST__BODY_MEMPOOL_UNREGISTER;
		req.mempool_unregister = &q;
		td_send_request(a, &req, NULL, 0);
	}
	td_pump();
	ck_assert_ptr_nonnull(LIST_FIRST(&ca->pending)); /* waits for the device to let go */
	ck_assert_uint_eq(reg_ok(other, 3, "small", &small, &(uint64_t){ 64 * KiB }, 1), 1);
	td_unblock_worker(&b);
	td_expect_free(a, 4, 0);
	td_dma(a, 5, PROVIDER_DMA_WRITE, &e, big, &e, big + 4096, 8, ENOKEY);
	td_free(a, 6, big, 0); /* nothing holds it now */
	close(a);
	close(other);
}
END_TEST

/* A replacement (extmem) whose old MRs a worker deregisters waits for them; unregistered
 * meanwhile, it is answered then, ECANCELED, without reading the registration that went (the
 * generation checker's pipelining found a read after free there). */
START_TEST(test_replacement_unregistered_before_its_answer)
{
	struct td_blocker b;
	Mrd__Response *resp;
	struct client *ca;
	uint64_t big;
	int a;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	big = td_alloc(a, 2, 8 * MiB);
	ck_assert_uint_eq(reg_ok(a, 3, "p", &big, &(uint64_t){ 8 * MiB }, 1), 1);
	td_block_worker(&b);
	/* Small: made here; the old 8 MiB MR goes to the worker, behind the blocker. */
	td_send_mempool_register(a, 4, "p", &big, &(uint64_t){ 64 * KiB }, 1, true);
	td_send_mempool_unregister(a, 5, "p"); /* its MR too goes to the worker, which is busy */
	/* Until the unregistration ran, the worker still held (3 s at most: a few turns). */
	for (int i = 0; i < 3000 && !LIST_EMPTY(&ca->owner.pools); i++) {
		td_pump();
		usleep(1000);
	}
	ck_assert(LIST_EMPTY(&ca->owner.pools));
	td_unblock_worker(&b);
	for (int i = 0; i < 2; i++) {
		resp = td_recv_reply(a, NULL, NULL);
		ck_assert_ptr_nonnull(resp);
		if (resp->id == 4) {
			ck_assert_int_eq(resp->status, ECANCELED);
			ck_assert_ptr_nonnull(strstr(resp->message, "unregistered"));
		} else {
			ck_assert_uint_eq(resp->id, 5);
			ck_assert_int_eq(resp->status, 0);
		}
		mrd__response__free_unpacked(resp, NULL);
	}
	td_free(a, 6, big, 0); /* nothing holds it now */
	close(a);
}
END_TEST

/* A client whose requests wait for workers keeps each of them, even when a send to it fails
 * (here: it shut its reading side with replies queued): a second waiting request joins the
 * first, never takes its place, and both go once when the client leaves. */
START_TEST(test_waiting_requests_all_kept)
{
	struct client *ca;
	struct pending_request *first;
	struct td_blocker b;
	uint64_t big1, big2;
	char buf[4096];
	int a;

	td_start_one_worker();
	a = td_hello_client(1000, &ca);
	big1 = td_alloc(a, 2, 4 * MiB);
	big2 = td_alloc(a, 3, 4 * MiB);
	td_block_worker(&b);
	/* Replies left unread until mrd queues some. */
	for (uint64_t i = 0; i < 5000 && ca->n_out < 2; i++) {
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__PingRequest q = MRD__PING_REQUEST__INIT;

		req.id = 100 + i;
		req.body_case = MRD__REQUEST__BODY_PING;
		req.ping = &q;
		td_send_request(a, &req, NULL, 0);
		td_pump();
	}
	ck_assert_uint_ge(ca->n_out, 1);
	send_register(a, 3, "one", big1, 4 * MiB); /* waits for the busy worker */
	td_pump();
	first = LIST_FIRST(&ca->pending);
	ck_assert_ptr_nonnull(first);
	send_register(a, 4, "two", big2, 4 * MiB);
	ck_assert_int_eq(shutdown(a, SHUT_RD), 0);
	while (recv(a, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
	for (int i = 0; i < 50; i++) {
		td_pump();
		usleep(1000);
	}
	ck_assert_uint_eq(ca->n_pending, 2);
	ck_assert_ptr_eq(LIST_NEXT(LIST_FIRST(&ca->pending), link), first);
	close(a);
	td_unblock_worker(&b);
	td_wait_domains_closed();
}
END_TEST

/* A huge page MR whose registration failed is nobody's to share: a later pool in that page
 * makes its own. (One-page "huge pages": the arena is marked hugetlb with 4 KiB pages; the
 * registration fails because the page is made read-only under it.) */
START_TEST(test_failed_shared_mr_not_shared)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.workers=1",
				   "cache.async_bytes=4K", NULL };
	uint64_t mem, p, len = 4 * KiB, ys[2], yl[2] = { 4 * KiB, 4 * KiB };
	struct client *cx;
	struct td_blocker b1, b2;
	Mrd__Response *resp;
	int x, y, z;

	td_stop();
	td_start(settings);
	x = td_hello_client(1000, &cx);
	y = td_hello_client(1000, NULL);
	z = td_hello_client(1000, NULL);
	mem = td_alloc(x, 2, 64 * KiB);
	p = mem;
	domain_allocation_containing(cx->domain, p)->arena->hugetlb = true;
	td_block_worker(&b1);
	send_register(x, 3, "x", p, len); /* the page's MR, on the blocked worker */
	td_pump();
	td_block_worker(&b2);
	ys[0] = p;
	ys[1] = mem + 16 * KiB;
	td_send_mempool_register(y, 3, "y", ys, yl, 2, false); /* shares it, and waits behind b2 */
	td_pump();
	ck_assert_int_eq(mprotect((void *)(uintptr_t)p, 4096, PROT_READ), 0);
	td_unblock_worker(&b1);
	td_expect_free(x, 3, EFAULT); /* X's registration failed */
	ck_assert_int_eq(mprotect((void *)(uintptr_t)p, 4096, PROT_READ | PROT_WRITE), 0);
	send_register(z, 3, "z", p, len); /* its own MR, queued behind b2 */
	td_pump();
	td_unblock_worker(&b2);
	td_expect_free(y, 3, EFAULT); /* Y shared the failed one */
	resp = td_expect(z, 3, 0);
	ck_assert_uint_ne(resp->mempool_register->entries[0]->lkey, MRD_KEY_INVALID);
	mrd__response__free_unpacked(resp, NULL);
	close(x);
	close(y);
	close(z);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mempool");
	TCase *tc = tcase_create("registrations");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_ranges_rounded_and_merged);
	tcase_add_test(tc, test_bad_requests);
	tcase_add_test(tc, test_extmem_replaces);
	tcase_add_test(tc, test_extmem_replaced_before_the_reply);
	tcase_add_test(tc, test_lookup_uses_the_pool_mr);
	tcase_add_test(tc, test_pool_after_lookup_counts_once);
	tcase_add_test(tc, test_concurrent_lookups_quota);
	tcase_add_test(tc, test_lookup_beside_a_run_being_registered);
	tcase_add_test(tc, test_overlapping_pools_count_once);
	tcase_add_test(tc, test_lookup_waits_for_a_pool_mr);
	tcase_add_test(tc, test_pool_made_while_a_lookup_registers);
	tcase_add_test(tc, test_memory_under_a_pool_stays);
	tcase_add_test(tc, test_death_releases_pools);
	tcase_add_test(tc, test_pool_in_memory_of_a_client_that_left);
	tcase_add_test(tc, test_pools_and_quota);
	tcase_add_test(tc, test_big_pool_on_worker);
	tcase_add_test(tc, test_death_while_pool_registers);
	tcase_add_test(tc, test_big_unregister_on_worker);
	tcase_add_test(tc, test_replacement_unregistered_before_its_answer);
	tcase_add_test(tc, test_waiting_requests_all_kept);
	tcase_add_test(tc, test_failed_shared_mr_not_shared);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
