/* SPDX-License-Identifier: MIT */
/* Capabilities respected, on a soft provider that lacks what a device may lack (its knobs
 * $MRD_SOFT_ATOMIC, $MRD_SOFT_ODP_RC, $MRD_SOFT_ADVISE_MAX): no remote atomics asked where the
 * device has none, memory pinned where its RC on-demand paging does not cover the access,
 * advice cut to what one advise takes, PREFETCH_NO_FAULT that installs present pages alone;
 * in-process, then through libmrd and mrctl against a real mrd. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "control/client.h"
#include "core/domain.h"
#include "control/manager.h"
#include "provider/provider.h"
#include "registration/reg-allocation.h"
#include "test-daemon.h"
#include "test-util.h"
#include "check-run.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

static const unsigned RW = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE |
			   MRD_ACCESS_REMOTE_READ;

/* td_manager anew with the soft knob set (its providers read it at open: the daemon's now,
 * each domain's at its first client, so it stays set until unset_knob). */
static void start_with(const char *knob, const char *value, const char *policy)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.odp_chunk=2M", "cache.workers=2",
				   policy, NULL };

	td_stop();
	if (knob)
		ck_assert_int_eq(setenv(knob, value, 1), 0);
	td_start(settings);
}

static void setup(void) {}
static void teardown(void)
{
	td_stop();
	unsetenv("MRD_SOFT_ATOMIC");
	unsetenv("MRD_SOFT_ODP_RC");
	unsetenv("MRD_SOFT_ADVISE_MAX");
}

static void prefetch(int fd, uint64_t id, uint64_t addr, uint64_t len, unsigned advice, int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PrefetchRequest q = MRD__PREFETCH_REQUEST__INIT;
	Mrd__Response *resp;

	q.address = addr;
	q.length = len;
	q.advice = advice;
	q.flush = true;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &q;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect(fd, id, error);
	mrd__response__free_unpacked(resp, NULL);
}

static Mrd__Response *status(int fd, uint64_t id)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__StatusRequest q = MRD__STATUS_REQUEST__INIT;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_STATUS;
	req.status = &q;
	td_send_request(fd, &req, NULL, 0);
	return td_expect(fd, id, 0);
}

/* No remote atomics on the device (EFA): every MR mrd makes — the cache's, an on-demand child,
 * a mempool's — asks for all but REMOTE_ATOMIC, and works. */
START_TEST(test_no_atomics_none_asked)
{
	struct client *c;
	int fd;
	uint64_t a, b, p, len = 64 * KiB;
	Mrd__MrEntry ea, eb;
	struct reg_allocation *ra;
	Mrd__Response *resp;

	start_with("MRD_SOFT_ATOMIC", "none", "cache.policy=contig");
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 3 * MiB);
	b = td_alloc_flags(fd, 3, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	p = td_alloc(fd, 4, 1 * MiB);
	td_lookup(fd, 5, a + 5, 0, &ea);
	ra = reg_allocation_of(domain_allocation_containing(c->domain, a));
	ck_assert_uint_eq(LIST_FIRST(&ra->mrs)->pmr->access, RW | MRD_ACCESS_MW_BIND); /* windows */
	td_lookup(fd, 6, b + 4096, 0, &eb);
	ck_assert_uint_eq(c->domain->reg.odp.children, 1);
	ck_assert_uint_eq(LIST_FIRST(&c->domain->reg.odp.all)->pmr->access,
			  RW | MRD_ACCESS_ON_DEMAND);
	td_send_mempool_register(fd, 7, "rx", &p, &len, 1, false);
	td_expect_free(fd, 7, 0);
	ck_assert_uint_eq(LIST_FIRST(&c->domain->reg.mempools.mrs)->pmr->access, RW);
	/* The keys work: a Dma from the pinned MR into the on-demand one. */
	td_dma(fd, 8, PROVIDER_DMA_WRITE, &ea, a, &eb, b + 4096, 64, 0);
	resp = status(fd, 9);
	ck_assert(!resp->status_reply->atomic);
	ck_assert_str_eq(resp->status_reply->odp_pinned, ""); /* ODP needs no atomic bit here */
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
}
END_TEST

/* RC on-demand paging without read (nor atomic): memory asked on demand — by the ODP flag or
 * by [cache] policy = odp — is registered pinned, one MR over the allocation, no child;
 * Status and the refused Prefetch say why. */
START_TEST(test_partial_odp_registers_pinned)
{
	struct client *c;
	int fd;
	uint64_t a, b;
	Mrd__MrEntry e;
	Mrd__Response *resp;
	struct provider_stats ps;

	start_with("MRD_SOFT_ODP_RC", "send,recv,write", "cache.policy=odp");
	fd = td_hello_client(1000, &c);
	a = td_alloc(fd, 2, 4 * MiB);
	b = td_alloc_flags(fd, 3, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	td_lookup(fd, 4, a + 3 * MiB, 0, &e);
	ck_assert_uint_eq(e.start, a);
	ck_assert_uint_eq(e.end, a + 4 * MiB);
	td_lookup(fd, 5, b + 1, 0, &e);
	ck_assert_uint_eq(e.start, b);
	ck_assert_uint_eq(e.end, b + 2 * MiB);
	ck_assert_uint_eq(c->domain->reg.odp.children, 0);
	ck_assert_uint_eq(c->domain->reg.odp.stats.children_created, 0);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 6 * MiB);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.pinned_bytes, 6 * MiB);
	prefetch(fd, 6, b, 4096, MRD__PREFETCH_ADVICE__PREFETCH, EINVAL);
	resp = status(fd, 7);
	ck_assert(resp->status_reply->odp && resp->status_reply->atomic);
	ck_assert_str_eq(resp->status_reply->odp_rc, "send,recv,write");
	ck_assert_str_eq(resp->status_reply->odp_pinned,
			 "the device's RC on-demand paging covers send,recv,write, not read,atomic");
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
}
END_TEST

/* The ODP bits decide with the access: read-only memory needs no atomic bit, and without
 * remote atomics on the device no memory does. */
START_TEST(test_odp_bits_against_access)
{
	struct client *c;
	int fd;
	uint64_t ro, rw;

	start_with("MRD_SOFT_ODP_RC", "send,recv,write,read", "cache.policy=contig");
	fd = td_hello_client(1000, &c);
	ro = td_alloc_flags(fd, 2, 2 * MiB,
			    MRD__ALLOC_FLAGS__ALLOC_ODP | MRD__ALLOC_FLAGS__ALLOC_READ_ONLY);
	rw = td_alloc_flags(fd, 3, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	ck_assert(domain_allocation_containing(c->domain, ro)->odp);
	ck_assert(!domain_allocation_containing(c->domain, rw)->odp); /* atomics need the bit */
	close(fd);

	ck_assert_int_eq(setenv("MRD_SOFT_ATOMIC", "none", 1), 0);
	start_with("MRD_SOFT_ODP_RC", "send,recv,write,read", "cache.policy=contig");
	fd = td_hello_client(1000, &c);
	rw = td_alloc_flags(fd, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	ck_assert(domain_allocation_containing(c->domain, rw)->odp);
	close(fd);
}
END_TEST

/* One advise takes 1 MiB here (a device: 4 GiB, ibv_sge.length's 32 bits), a chunk is 2 MiB:
 * the prefetch of two chunks is cut into four pieces, and faults every page in. */
START_TEST(test_advise_cut_to_the_device)
{
	struct client *c;
	int fd;
	uint64_t a;
	struct provider_stats ps;

	start_with("MRD_SOFT_ADVISE_MAX", "1048576", "cache.policy=contig");
	fd = td_hello_client(1000, &c);
	a = td_alloc_flags(fd, 2, 4 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	prefetch(fd, 3, a, 4 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_WRITE, 0);
	ck_assert_uint_eq(c->domain->reg.odp.children, 2);
	ck_assert_uint_eq(c->domain->reg.odp.stats.prefetch_pages, 4 * MiB / 4096);
	provider_stats(c->domain->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.odp_prefetched_pages, 4 * MiB / 4096);
	close(fd);
}
END_TEST

/* PREFETCH_NO_FAULT makes the children and installs the translations of the pages present in
 * mrd's page tables, faulting none in; PREFETCH faults in the rest. */
START_TEST(test_prefetch_no_fault_installs_present_pages)
{
	struct client *c;
	int fd;
	uint64_t a;
	struct provider_stats s0, s1;

	start_with(NULL, NULL, "cache.policy=contig");
	fd = td_hello_client(1000, &c);
	a = td_alloc_flags(fd, 2, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	((volatile char *)(uintptr_t)a)[0] = 1; /* mrd's mapping: this process's */
	((volatile char *)(uintptr_t)a)[5 * 4096] = 1;
	provider_stats(c->domain->reg.base.provider, &s0);
	prefetch(fd, 3, a, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT, 0);
	provider_stats(c->domain->reg.base.provider, &s1);
	ck_assert_uint_eq(c->domain->reg.odp.children, 1);
	ck_assert_uint_eq(s1.odp_prefetched_pages - s0.odp_prefetched_pages, 2);
	ck_assert_uint_eq(c->domain->reg.odp.stats.prefetch_pages, 0); /* none faulted in */
	prefetch(fd, 4, a, 2 * MiB, MRD__PREFETCH_ADVICE__PREFETCH, 0);
	provider_stats(c->domain->reg.base.provider, &s0);
	ck_assert_uint_eq(s0.odp_prefetched_pages - s1.odp_prefetched_pages, 2 * MiB / 4096 - 2);
	close(fd);
}
END_TEST

/* Through libmrd against a real mrd on a device without atomics and with partial ODP: memory
 * gets keys (every registration failed before), ODP memory is pinned and a prefetch of it says
 * why, and mrctl status shows both. */
START_TEST(test_libmrd_on_a_lesser_device)
{
	struct mrd_proc mrd;
	mrd_client *c = NULL;
	struct mrd_keys k;
	char mrctl[512], out[8192];
	const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket", NULL,
			       "--json", "status", NULL };
	void *p, *q;
	int r;

	ck_assert_int_eq(setenv("MRD_SOFT_ATOMIC", "none", 1), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_ODP_RC", "send,recv,write", 1), 0);
	r = mrd_proc_start(&mrd, "[mrd]\nprovider = soft\n[memory]\nhugepages = no\n"
			   "arena_size = 64M\n", NULL);
	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, &p), 0);
	r = mrd_keys_query(c, p, &k);
	ck_assert_msg(r == 0, "keys: %s (%s)", strerror(-r), mrd_last_error());
	ck_assert_uint_eq(k.start, (uintptr_t)p);
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, MRD_MEM_ODP, &q), 0);
	ck_assert_int_eq(mrd_keys_query(c, q, &k), 0);
	ck_assert_uint_eq(k.end, (uintptr_t)q + 1 * MiB); /* pinned: one MR over it */
	ck_assert_int_eq(mrd_prefetch(c, q, 4096, MRD_PREFETCH, MRD_PREFETCH_FLUSH), -EINVAL);
	ck_assert_msg(strstr(mrd_last_error(), "covers send,recv,write, not read"), "%s",
		      mrd_last_error());
	argv[2] = mrd.socket;
	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_msg(strstr(out, "\"mw\":true,\"atomic\":false,"), "%s", out);
	ck_assert_msg(strstr(out, "\"atomic\":false,\"odp_rc\":\"send,recv,write\","
				  "\"odp_pinned\":\"the device's RC on-demand paging covers "
				  "send,recv,write, not read\""), "%s", out);
	mrd_client_close(c);
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("caps");
	TCase *tc = tcase_create("caps"), *lib = tcase_create("libmrd");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_no_atomics_none_asked);
	tcase_add_test(tc, test_partial_odp_registers_pinned);
	tcase_add_test(tc, test_odp_bits_against_access);
	tcase_add_test(tc, test_advise_cut_to_the_device);
	tcase_add_test(tc, test_prefetch_no_fault_installs_present_pages);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(lib, setup, teardown);
	tcase_add_test(lib, test_libmrd_on_a_lesser_device);
	suite_add_tcase(s, lib);
	return run_suite(s);
}
