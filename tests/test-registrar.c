/* SPDX-License-Identifier: MIT */
/* The registrar and what it runs (the MR cache, on-demand children, mempools) over one domain's
 * memory on the soft provider, for an owner on the stack: no manager, no socket, no protobuf.
 * The registrar's events are this file's: it counts the holds of jobs and frees what it is told
 * the device let go of, as the domain would. A case per module (registrar, cache, odp,
 * mempool) names the one a failure is in. */
#include <check.h>
#include <errno.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/config.h"
#include "base/worker-pool.h"
#include "check-run.h"
#include "memory-fixture.h"
#include "test-util.h"
#include "memory/allocation.h"
#include "memory/memory.h"
#include "memory/window.h"
#include "provider/provider.h"
#include "registration/reg-allocation.h"
#include "registration/reg-owner.h"
#include "registration/registrar.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

static struct config cfg;
static struct window window;
static struct memory mem;
static struct registrar reg;
static struct provider *device;
static struct event_base *base;
static bool stopping;
static struct worker_pool *workers;
static uint64_t host_pinned; /* the sum over "every domain": this one alone here */
static struct reg_owner owner;
static unsigned holds, idles, released, changes;

static void on_hold(void *data) { holds++; }
static void on_unhold(void *data) { holds--; }
static void on_idle(void *data, struct reg_allocation *ra) { idles++; }
static void on_changed(void *data) { changes++; }

static int on_released(void *data, struct reg_allocation *ra, struct waiter *waiter)
{
	released++;
	allocation_release(&mem, &ra->mem, NULL, NULL);
	free(ra);
	return 0; /* the registrar answers waiter */
}

struct test_waiter {
	struct waiter base;
	unsigned calls;
	int result;
	struct mr_entry entry;
};

static void resume(struct waiter *w, int result, const struct mr_entry *e, const char *why)
{
	struct test_waiter *t = container_of(w, struct test_waiter, base);

	t->calls++;
	t->result = result;
	if (e)
		t->entry = *e;
}

static struct test_waiter waiter(void)
{
	return (struct test_waiter){ .base.resume = resume };
}

static void open_registrar(enum mr_policy policy)
{
	int verbs_error;

	memory_fixture_open(&cfg, &window, &mem, 4ull << 30, 64 * MiB, 1);
	cfg.odp_chunk = 2 * MiB; /* allocations share a chunk, and big ones span chunks */
	base = event_base_new();
	ck_assert_ptr_nonnull(base);
	reg = (struct registrar){ .base = {
		.config = &cfg, .quota = &cfg.quota, .name = "unit", .mem = &mem,
		.workers = &workers, .stopping = &stopping,
		.host_pinned = &host_pinned,
		.events = { .hold = on_hold, .unhold = on_unhold, .allocation_idle = on_idle,
			    .released = on_released, .changed = on_changed },
	} };
	ck_assert_int_eq(worker_pool_new(base, 1, &workers), 0);
	ck_assert_int_eq(provider_open("soft", NULL, &device, &verbs_error), 0);
	ck_assert_int_eq(registrar_open(&reg, device, policy, (uintptr_t)window.base),
			 0);
	reg_owner_init(&owner, 1, getpid(), getuid());
	host_pinned = 0;
	holds = idles = released = changes = 0;
}

static void setup(void) { open_registrar(MR_POLICY_CONTIG); }

static void pump_until(const unsigned *count, unsigned want)
{
	for (double t0 = test_now_s(); *count != want && test_now_s() - t0 < TEST_WAIT_S;) {
		event_base_loop(base, EVLOOP_NONBLOCK);
		usleep(1000);
	}
	ck_assert_uint_eq(*count, want);
}

/* o leaves: its pools go to a leaving owner, and all of them at once (core/domain.c takes them
 * a share a turn). */
static void pools_leave(struct reg_owner *o)
{
	struct reg_owner gone;
	unsigned made = 0;

	reg_owner_init(&gone, 0, 0, 0);
	mempool_give_all(&reg.mempools, o, &gone);
	ck_assert(mempool_leave_share(&reg.mempools, &gone, true, &made));
	ck_assert(LIST_EMPTY(&gone.pools));
}

static void teardown(void)
{
	pools_leave(&owner); /* as the owner leaves: its pools first */
	pump_until(&holds, 0);
	while (!LIST_EMPTY(&owner.mem.allocations)) {
		struct allocation *a = LIST_FIRST(&owner.mem.allocations);

		allocation_retire(&mem, a);
		(void)registrar_retire(&reg, reg_allocation_of(a), NULL);
	}
	workers = worker_pool_free(workers); /* every job ends, done included */
	ck_assert_uint_eq(holds, 0);
	registrar_close(&reg);
	ck_assert_uint_eq(host_pinned, 0);
	event_base_free(base);
	provider_close(device);
	memory_fixture_close(&cfg, &window, &mem);
}

static struct reg_allocation *alloc(uint64_t size)
{
	struct reg_allocation *ra = calloc(1, sizeof(*ra));
	char why[160];

	ck_assert_ptr_nonnull(ra);
	reg_allocation_init(ra);
	ck_assert_int_eq(allocation_alloc(&mem, &ra->mem, &owner.mem, size, 0, false, why,
					  sizeof(why)), 0);
	return ra;
}

static uint64_t address(const struct reg_allocation *ra)
{
	return allocation_address(&ra->mem);
}

/* As the domain frees: out of memory's sight first, then the registrar's. */
static int free_allocation(struct reg_allocation *ra, struct waiter *w)
{
	allocation_retire(&mem, &ra->mem);
	return registrar_retire(&reg, ra, w);
}

static int lookup(uint64_t addr, struct mr_entry *e, struct waiter *w)
{
	char why[160];

	return registrar_lookup(&reg, addr, e, why, sizeof(why), w);
}

START_TEST(test_lookup_registers_the_run_once)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	struct mr_entry e, again;

	ck_assert_int_eq(lookup(address(ra) + 4 * KiB, &e, NULL), 0);
	ck_assert_uint_eq(e.start, address(ra)); /* contig: the whole run */
	ck_assert_uint_eq(e.end, address(ra) + 64 * KiB);
	ck_assert_uint_eq(reg.cache.charges.pinned_bytes, 64 * KiB);
	ck_assert_uint_eq(host_pinned, 64 * KiB);
	ck_assert_uint_gt(changes, 0); /* the status page hears of the MR */
	ck_assert_int_eq(lookup(address(ra) + 60 * KiB, &again, NULL), 0);
	ck_assert_uint_eq(again.lkey, e.lkey);
	ck_assert_uint_eq(reg.cache.misses, 1);

	ck_assert_int_eq(free_allocation(ra, NULL), 0); /* small: released here and now */
	ck_assert_uint_eq(released, 1);
	ck_assert_uint_eq(reg.cache.charges.pinned_bytes, 0);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_uint_eq(mem.allocated_bytes, 0);
	ck_assert_int_eq(lookup(e.start, &e, NULL), -ENOENT);
}
END_TEST

START_TEST(test_pinned_quota_mine_and_the_hosts)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	struct mr_entry e;
	char why[256] = "";

	cfg.quota.pinned_bytes = 64 * KiB - 1;
	ck_assert_int_eq(registrar_lookup(&reg, address(ra), &e, why, sizeof(why), NULL),
			 -EDQUOT);
	ck_assert_ptr_nonnull(strstr(why, "quota.pinned_bytes"));
	ck_assert_uint_eq(reg.cache.charges.pinned_bytes, 0); /* nothing charged */

	/* Other domains pin all but a page of the host's limit. */
	cfg.quota.pinned_bytes = 64 * KiB;
	cfg.max_pinned_bytes = 1ull << 30;
	host_pinned = cfg.max_pinned_bytes - 4 * KiB;
	ck_assert_int_eq(registrar_lookup(&reg, address(ra), &e, why, sizeof(why), NULL),
			 -EDQUOT);
	ck_assert_msg(strstr(why, "limits.pinned_bytes (1073741824) would be exceeded by all domains: "
			     "1073737728 in use, tried to pin 65536 more; raise [limits] "
			     "pinned_bytes in mrd.conf and reload mrd"), "%s", why);
	host_pinned = 0;
	ck_assert_int_eq(lookup(address(ra), &e, NULL), 0); /* exactly the quota */
	ck_assert_uint_eq(host_pinned, 64 * KiB);
}
END_TEST

START_TEST(test_offload_rule)
{
	ck_assert(!registrar_offload(&reg, cfg.async_bytes - 1));
	ck_assert(registrar_offload(&reg, cfg.async_bytes));
	reg.base.jobs = 1; /* a worker may hold the provider */
	ck_assert(registrar_offload(&reg, 0));
	reg.base.jobs = 0;
	/* A Dma holds MRs and faults pages in: drops wait for its copy, registrations for its
	 * faults (mrd's mmap_lock) */
	reg.base.dma_jobs = 1;
	ck_assert(registrar_offload(&reg, 0));
	reg.base.dma_jobs = 0;
	reg.cache.pending_bytes = 1;
	ck_assert(registrar_offload(&reg, 0));
	reg.cache.pending_bytes = 0;
	{
		struct worker_pool *w = workers;

		workers = NULL; /* no workers (or they drained): everything on the loop */
		ck_assert(!registrar_offload(&reg, UINT64_MAX));
		workers = w;
		/* Nor while they drain: work submitted then would never run. */
		stopping = true;
		ck_assert(!registrar_offload(&reg, UINT64_MAX));
		stopping = false;
	}
}
END_TEST

START_TEST(test_big_registration_and_free_on_a_worker)
{
	struct reg_allocation *ra = alloc(4 * MiB);
	struct test_waiter w = waiter(), f = waiter();
	struct mr_entry e;

	ck_assert_int_eq(lookup(address(ra), &e, &w.base), -EINPROGRESS);
	ck_assert_uint_eq(holds, 1); /* the job holds the domain */
	ck_assert_uint_eq(reg.cache.pending_bytes, 4 * MiB);
	ck_assert_uint_eq(host_pinned, 4 * MiB); /* charged from the start */
	pump_until(&w.calls, 1);
	ck_assert_int_eq(w.result, 0);
	ck_assert_uint_eq(w.entry.start, address(ra));
	ck_assert_uint_eq(w.entry.end, address(ra) + 4 * MiB);
	ck_assert_uint_eq(holds, 0);
	ck_assert_uint_eq(reg.cache.pending_bytes, 0);

	ck_assert_int_eq(free_allocation(ra, &f.base), -EINPROGRESS); /* 4 MiB to unpin */
	ck_assert_uint_eq(reg.base.jobs, 1);
	ck_assert_uint_eq(released, 0);
	pump_until(&f.calls, 1);
	ck_assert_uint_eq(released, 1);
	ck_assert_uint_eq(reg.base.jobs, 0);
	ck_assert_uint_eq(holds, 0);
	ck_assert_uint_eq(host_pinned, 0);
}
END_TEST

struct probe_job {
	struct registrar_work base;
	bool ran;
};

static unsigned probes_done;

static void probe_run(struct registrar_work *w)
{
	((struct probe_job *)w)->ran = true;
}

static void probe_done(struct registrar_work *w)
{
	ck_assert(((struct probe_job *)w)->ran); /* after the worker, on the loop */
	ck_assert_uint_gt(holds, 0); /* the hold goes after done */
	probes_done++;
	free(w);
}

/* A registrar whose device fails its next n deregs and parks ($MRD_SOFT_DEREG_FAIL, read at
 * open). Letting go of an MR takes two here: the pools park it, and when that fails, the key
 * quarantine deregisters it. */
static void reopen_failing_deregs(const char *n)
{
	teardown();
	ck_assert_int_eq(setenv("MRD_SOFT_DEREG_FAIL", n, 1), 0);
	setup();
	unsetenv("MRD_SOFT_DEREG_FAIL");
}

static uint8_t byte_at(uint64_t addr) { return *(volatile uint8_t *)(uintptr_t)addr; }

/* The device kept an MR over ra (its dereg failed): the pages keep what was written (not
 * punched) and the next allocation of that size gets other pages. */
static void assert_run_kept(uint64_t at, uint64_t size)
{
	struct reg_allocation *next;

	ck_assert_uint_eq(released, 0);
	ck_assert_uint_eq(byte_at(at), 0xa5);
	ck_assert_uint_eq(byte_at(at + size - 1), 0xa5);
	next = alloc(size);
	ck_assert_uint_ne(address(next), at);
}

static struct reg_allocation *alloc_on_demand(uint64_t size);

/* 64 KiB allocated by make, registered, written 0xa5 and freed while the device refuses its
 * dereg (the park before it too): where it was. */
static uint64_t free_under_a_failing_dereg(struct reg_allocation *(*make)(uint64_t size))
{
	struct reg_allocation *ra;
	struct mr_entry e;
	uint64_t at;

	reopen_failing_deregs("2");
	ra = make(64 * KiB);
	at = address(ra);
	ck_assert_int_eq(lookup(at, &e, NULL), 0);
	memset((void *)(uintptr_t)at, 0xa5, 64 * KiB);
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	return at;
}

START_TEST(test_failed_dereg_quarantines_the_run)
{
	uint64_t at = free_under_a_failing_dereg(alloc);

	assert_run_kept(at, 64 * KiB);
	ck_assert_uint_eq(reg.quarantine.n, 1);
	ck_assert_uint_eq(reg.quarantine.bytes, 64 * KiB);
	ck_assert_uint_eq(host_pinned, 64 * KiB); /* the device pins it still */
	ck_assert_ptr_null(mr_table_lookup(&reg.cache.table, at)); /* no key of it handed out */
	/* The device takes the MR now: the run goes back. */
	ck_assert_uint_eq(registrar_retry_quarantine(&reg), 1);
	ck_assert_uint_eq(released, 1);
	ck_assert_uint_eq(reg.quarantine.n, 0);
	ck_assert_uint_eq(reg.quarantine.bytes, 0);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_uint_eq(registrar_retry_quarantine(&reg), 0);
}
END_TEST

/* The same when a worker deregisters a big run for a client's Free. */
START_TEST(test_failed_dereg_on_a_worker_quarantines_the_run)
{
	struct test_waiter w = waiter(), f = waiter();
	struct reg_allocation *ra;
	struct mr_entry e;
	uint64_t at;

	reopen_failing_deregs("2");
	ra = alloc(4 * MiB);
	at = address(ra);
	ck_assert_int_eq(lookup(at, &e, &w.base), -EINPROGRESS);
	pump_until(&w.calls, 1);
	ck_assert_int_eq(w.result, 0);
	memset((void *)(uintptr_t)at, 0xa5, 4 * MiB);
	ck_assert_int_eq(free_allocation(ra, &f.base), -EINPROGRESS);
	pump_until(&f.calls, 1);
	ck_assert_int_eq(f.result, 0); /* the client's Free is done: the run is not its any more */
	pump_until(&holds, 0);
	assert_run_kept(at, 4 * MiB);
	ck_assert_uint_eq(reg.quarantine.n, 1);
	ck_assert_uint_eq(reg.quarantine.bytes, 4 * MiB);
	/* Still there at close: dropped with the context, nothing leaks (teardown checks). */
}
END_TEST

/* A run the device still keeps at close goes with the context: nothing stays charged
 * (teardown checks) or leaks (the sanitizers check). */
START_TEST(test_quarantined_run_dropped_at_close)
{
	struct reg_allocation *ra;
	struct mr_entry e;

	reopen_failing_deregs("3"); /* the park and dereg at the free, the dereg at close */
	ra = alloc(64 * KiB);
	ck_assert_int_eq(lookup(address(ra), &e, NULL), 0);
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	ck_assert_uint_eq(reg.quarantine.n, 1);
	ck_assert_uint_eq(released, 0);
	registrar_close(&reg);
	ck_assert_uint_eq(released, 0); /* not given back: the arenas go with the memory */
	ck_assert_uint_eq(reg.quarantine.n, 0);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_int_eq(registrar_open(&reg, device, MR_POLICY_CONTIG, (uintptr_t)window.base),
			 0); /* for teardown */
}
END_TEST

START_TEST(test_job_holds_until_done)
{
	struct probe_job *busy = calloc(1, sizeof(*busy)), *quiet = calloc(1, sizeof(*quiet));

	probes_done = 0;
	registrar_start(&reg, &busy->base, probe_run, probe_done, true);
	ck_assert_uint_eq(holds, 1);
	ck_assert_uint_eq(reg.base.jobs, 1); /* it may hold the provider: the loop offloads */
	ck_assert(registrar_offload(&reg, 0));
	registrar_start(&reg, &quiet->base, probe_run, probe_done, false);
	ck_assert_uint_eq(holds, 2);
	ck_assert_uint_eq(reg.base.jobs, 1);
	pump_until(&probes_done, 2);
	ck_assert_uint_eq(holds, 0);
	ck_assert_uint_eq(reg.base.jobs, 0);
	ck_assert(!registrar_offload(&reg, 0));
}
END_TEST

START_TEST(test_freed_while_a_worker_registers)
{
	struct reg_allocation *ra = alloc(4 * MiB);
	struct test_waiter w = waiter();
	struct mr_entry e;

	uint64_t gen = status_page_generation(&mem.status), at = address(ra);
	struct reg_allocation *next;

	ck_assert_int_eq(lookup(address(ra), &e, &w.base), -EINPROGRESS);
	ck_assert_int_eq(free_allocation(ra, NULL), 0); /* no MR yet: its pages go at once */
	ck_assert_uint_eq(released, 1);
	/* No key of it went out, so the generation stays: the worker's reply must hand none. */
	ck_assert_uint_eq(status_page_generation(&mem.status), gen);
	next = alloc(4 * MiB); /* its memory, someone else's before the worker is done */
	ck_assert_uint_eq(address(next), at);
	pump_until(&w.calls, 1);
	ck_assert_int_eq(w.result, -ENOENT); /* the registration covers nobody's memory */
	ck_assert_ptr_null(mr_table_lookup(&reg.cache.table, at));
	ck_assert_uint_eq(status_page_generation(&mem.status), gen);
	/* It is let go of (on a worker: 4 MiB), and uncharged once the device let go. */
	pump_until(&holds, 0);
	ck_assert_uint_eq(reg.base.jobs, 0);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_uint_eq(reg.cache.n_mrs, 0);
}
END_TEST

/* A registration the device refuses leaves nothing charged (miss()'s unwind). */
START_TEST(test_failed_registration_uncharges)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	struct mr_entry e;

	provider_mark_lost(reg.base.provider); /* every op fails from here on */
	ck_assert_int_lt(lookup(address(ra), &e, NULL), 0);
	ck_assert_uint_eq(reg.cache.charges.pinned_bytes, 0);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_uint_eq(reg.cache.n_mrs, 0);
}
END_TEST

START_TEST(test_page_policy_registers_one_page)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	struct mr_entry e, next;

	reg.cache.policy = MR_POLICY_PAGE;
	ck_assert_int_eq(lookup(address(ra) + 5000, &e, NULL), 0);
	ck_assert_uint_eq(e.start, address(ra) + 4 * KiB);
	ck_assert_uint_eq(e.end, address(ra) + 8 * KiB);
	ck_assert_int_eq(lookup(address(ra) + 9000, &next, NULL), 0);
	ck_assert_uint_eq(next.start, address(ra) + 8 * KiB);
	ck_assert_uint_eq(next.end, address(ra) + 12 * KiB);
	ck_assert_uint_ne(next.lkey, e.lkey);
	ck_assert_uint_eq(reg.cache.n_mrs, 2);
	ck_assert_uint_eq(host_pinned, 8 * KiB);
}
END_TEST

START_TEST(test_contig_registers_the_run_minus_other_mrs)
{
	struct reg_allocation *ra = alloc(64 * KiB), *rb = alloc(64 * KiB);
	uint64_t a = address(ra), b = address(rb), start = b + 16 * KiB, len = 4 * KiB;
	struct test_waiter w = waiter();
	struct pool_reg *pool;
	struct mr_entry e;
	char why[160];

	/* A page MR in the middle: the runs on either side stop at it. */
	reg.cache.policy = MR_POLICY_PAGE;
	ck_assert_int_eq(lookup(a + 32 * KiB, &e, NULL), 0);
	reg.cache.policy = MR_POLICY_CONTIG;
	ck_assert_int_eq(lookup(a + 4 * KiB, &e, NULL), 0);
	ck_assert_uint_eq(e.start, a);
	ck_assert_uint_eq(e.end, a + 32 * KiB);
	ck_assert_int_eq(lookup(a + 48 * KiB, &e, NULL), 0);
	ck_assert_uint_eq(e.start, a + 36 * KiB);
	ck_assert_uint_eq(e.end, a + 64 * KiB);
	ck_assert_uint_eq(host_pinned, 64 * KiB); /* each page once */

	/* A pool's MR bounds the run as well. */
	ck_assert_int_eq(mempool_register(&reg.mempools, &owner, "p", &start, &len, 1, false,
					  &w.base, &pool, why, sizeof(why)), 0);
	ck_assert_int_eq(lookup(b, &e, NULL), 0);
	ck_assert_uint_eq(e.end, b + 16 * KiB);
	ck_assert_int_eq(lookup(b + 40 * KiB, &e, NULL), 0);
	ck_assert_uint_eq(e.start, b + 20 * KiB);
	ck_assert_uint_eq(e.end, b + 64 * KiB);
	ck_assert_uint_eq(host_pinned, 128 * KiB);
	ck_assert_uint_eq(reg.cache.n_mrs, 5);
}
END_TEST

START_TEST(test_lookup_outside_memory_is_enoent)
{
	struct reg_allocation *ra = alloc(4 * KiB);
	struct mr_entry e;
	char why[160] = "";

	ck_assert_int_eq(registrar_lookup(&reg, address(ra) + 4 * KiB, &e, why, sizeof(why),
					 NULL), -ENOENT); /* past its last page */
	ck_assert_ptr_nonnull(strstr(why, "is not in memory allocated in domain unit"));
	ck_assert_int_eq(lookup(0x1000, &e, NULL), -ENOENT); /* outside the window */
	ck_assert_uint_eq(reg.cache.n_mrs, 0);
	ck_assert_uint_eq(host_pinned, 0);
}
END_TEST

START_TEST(test_freed_keys_leave_the_table)
{
	struct reg_allocation *ra = alloc(64 * KiB), *rb = alloc(64 * KiB);
	uint64_t b = address(rb);
	struct mr_entry ea, eb, again;

	ck_assert_int_eq(lookup(address(ra), &ea, NULL), 0);
	ck_assert_int_eq(lookup(b, &eb, NULL), 0);
	ck_assert_ptr_nonnull(mr_table_lookup(&reg.cache.table, b));
	ck_assert_int_eq(free_allocation(rb, NULL), 0);
	ck_assert_ptr_null(mr_table_lookup(&reg.cache.table, b));
	ck_assert_ptr_null(mr_table_lookup(&reg.cache.table, b + 64 * KiB - 1));
	ck_assert_ptr_nonnull(mr_table_lookup(&reg.cache.table, address(ra)));
	ck_assert_uint_eq(reg.cache.n_mrs, 1);
	ck_assert_uint_eq(reg.cache.deregistrations, 1);
	ck_assert_uint_eq(host_pinned, 64 * KiB);
	ck_assert_int_eq(lookup(b, &again, NULL), -ENOENT);
	ck_assert_int_eq(lookup(address(ra), &again, NULL), 0);
	ck_assert_uint_eq(again.lkey, ea.lkey);

	/* The same pages handed out again get a registration of their own, with new keys. */
	rb = alloc(64 * KiB);
	ck_assert_uint_eq(address(rb), b);
	ck_assert_int_eq(lookup(b, &again, NULL), 0);
	ck_assert_uint_ne(again.rkey, eb.rkey);
	ck_assert_uint_eq(reg.cache.registrations, 3);
}
END_TEST

/* The generation moves on a free only when the allocation had an MR (DPDK's rule): no key of
 * memory never registered can be cached anywhere, since no MR spans two allocations. */
/* untouched's free leaves the generation at gen; then used's (whose keys went out) moves it. */
/* The record of the move, in the status page's ring, is used's range. */
static void frees_bump_only_over_keys(struct reg_allocation *untouched,
				      struct reg_allocation *used, uint64_t gen)
{
	const struct mrd_status_freed *f = &mem.status.page->freed[(gen + 1) % MRD_STATUS_FREED];
	uint64_t start = address(used), end = start + used->mem.length;

	ck_assert_int_eq(free_allocation(untouched, NULL), 0);
	ck_assert_uint_eq(status_page_generation(&mem.status), gen);
	ck_assert_int_eq(free_allocation(used, NULL), 0);
	ck_assert_uint_eq(status_page_generation(&mem.status), gen + 1);
	ck_assert_uint_eq(f->generation, gen + 1);
	ck_assert_uint_eq(f->start, start);
	ck_assert_uint_eq(f->end, end);
}

START_TEST(test_free_bumps_only_over_mrs)
{
	struct reg_allocation *plain = alloc(64 * KiB), *registered = alloc(64 * KiB);
	uint64_t gen = status_page_generation(&mem.status);
	struct mr_entry e;

	ck_assert_int_eq(lookup(address(registered), &e, NULL), 0);
	frees_bump_only_over_keys(plain, registered, gen);
}
END_TEST

START_TEST(test_flush_rebuilds_the_table)
{
	struct reg_allocation *ra = alloc(64 * KiB), *rb = alloc(64 * KiB);
	struct mr_entry ea, eb, again;

	ck_assert_int_eq(lookup(address(ra), &ea, NULL), 0);
	ck_assert_int_eq(lookup(address(rb), &eb, NULL), 0);
	/* Room for one entry: the rebuild overflows, and the list serves. */
	mr_table_done(&reg.cache.table);
	ck_assert_int_eq(mr_table_init(&reg.cache.table, 2, 2), 0);
	mr_cache_flush(&reg.cache);
	ck_assert(reg.cache.table.overflow);
	ck_assert_int_eq(lookup(address(ra) + 100, &again, NULL), 0);
	ck_assert_uint_eq(again.lkey, ea.lkey);
	ck_assert_int_eq(lookup(address(rb) + 100, &again, NULL), 0);
	ck_assert_uint_eq(again.lkey, eb.lkey);
	/* Room for both: the flush clears the overflow and the table serves again. */
	mr_table_done(&reg.cache.table);
	ck_assert_int_eq(mr_table_init(&reg.cache.table, 256, 0), 0);
	mr_cache_flush(&reg.cache);
	ck_assert(!reg.cache.table.overflow);
	ck_assert_ptr_nonnull(mr_table_lookup(&reg.cache.table, address(ra)));
	ck_assert_ptr_nonnull(mr_table_lookup(&reg.cache.table, address(rb) + 64 * KiB - 1));
	ck_assert_int_eq(lookup(address(rb), &again, NULL), 0);
	ck_assert_uint_eq(again.lkey, eb.lkey);
	ck_assert_uint_eq(reg.cache.registrations, 2); /* no MR made again */
}
END_TEST

struct gone_listener {
	struct mr_gone_listener base;
	unsigned calls;
	struct mr_entry mr;
};

static void on_gone(struct mr_gone_listener *l, const struct mr_entry *mr)
{
	struct gone_listener *g = container_of(l, struct gone_listener, base);

	g->calls++;
	g->mr = *mr;
}

/* The same, failing at once where a listener would hear more than once. */
static void on_gone_once(struct mr_gone_listener *l, const struct mr_entry *mr)
{
	on_gone(l, mr);
	ck_assert_uint_eq(container_of(l, struct gone_listener, base)->calls, 1);
}

/* What is bound to an MR hears once that it went, and only of its own MR. */
START_TEST(test_mr_gone_heard_once)
{
	struct reg_allocation *ra = alloc(64 * KiB), *rb = alloc(64 * KiB), *rc = alloc(64 * KiB);
	struct gone_listener la = { .base.gone = on_gone }, lb = la, lc = la;
	struct mr_entry ea, eb, ec;

	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(ra), &la.base), -ENOENT);
	ck_assert_int_eq(lookup(address(ra), &ea, NULL), 0);
	ck_assert_int_eq(lookup(address(rb), &eb, NULL), 0);
	ck_assert_int_eq(lookup(address(rc), &ec, NULL), 0);
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(ra) + 100, &la.base), 0);
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(rb), &lb.base), 0);
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(rc), &lc.base), 0);
	mr_cache_flush(&reg.cache); /* the table is rebuilt: every MR stays */
	ck_assert_uint_eq(la.calls + lb.calls + lc.calls, 0);

	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	ck_assert_uint_eq(la.calls, 1);
	ck_assert_uint_eq(la.mr.start, ea.start);
	ck_assert_uint_eq(la.mr.end, ea.end);
	ck_assert_uint_eq(la.mr.lkey, ea.lkey);
	ck_assert_uint_eq(lb.calls, 0);
	mr_cache_unlisten_gone(&lc.base); /* what was bound went first */
	ck_assert_int_eq(free_allocation(rc, NULL), 0);
	ck_assert_uint_eq(lc.calls, 0);
	mr_cache_flush(&reg.cache);
	ck_assert_uint_eq(la.calls, 1); /* once */

	/* The cache closes with rb's MR in it (as the domain closes). */
	registrar_close(&reg);
	ck_assert_uint_eq(lb.calls, 1);
	ck_assert_uint_eq(lb.mr.rkey, eb.rkey);
	ck_assert_uint_eq(la.calls, 1);
	ck_assert_int_eq(registrar_open(&reg, device, MR_POLICY_CONTIG, (uintptr_t)window.base), 0);
	ck_assert_int_eq(free_allocation(rb, NULL), 0);
	ck_assert_uint_eq(lb.calls, 1);
}
END_TEST

/* A listener hung on one MR and then on another (a window bound anew) hears of the second
 * alone: hanging it again takes it off the first, as unlistening would. */
START_TEST(test_mr_gone_listener_hung_anew)
{
	struct reg_allocation *ra = alloc(64 * KiB), *rb = alloc(64 * KiB);
	struct gone_listener l = { .base.gone = on_gone_once };
	struct mr_entry ea, eb;

	ck_assert_int_eq(lookup(address(ra), &ea, NULL), 0);
	ck_assert_int_eq(lookup(address(rb), &eb, NULL), 0);
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(ra), &l.base), 0);
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(ra), &l.base), 0); /* twice */
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(rb), &l.base), 0);
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	ck_assert_uint_eq(l.calls, 0);
	ck_assert_int_eq(free_allocation(rb, NULL), 0);
	ck_assert_uint_eq(l.calls, 1);
	ck_assert_uint_eq(l.mr.lkey, eb.lkey);
}
END_TEST

struct unhanging_listener {
	struct gone_listener g;
	struct mr_gone_listener *other; /* unhung by the callback, with itself */
};

static void on_gone_unhang(struct mr_gone_listener *l, const struct mr_entry *mr)
{
	struct unhanging_listener *u = container_of(l, struct unhanging_listener, g.base);

	on_gone_once(l, mr);
	mr_cache_unlisten_gone(l);
	mr_cache_unlisten_gone(u->other);
}

/* A listener may unhang itself and another of the same MR while it hears: the other hears
 * nothing, and nobody twice. */
START_TEST(test_mr_gone_listener_unhangs_inside)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	struct gone_listener other = { .base.gone = on_gone_once };
	struct unhanging_listener u = { .g.base.gone = on_gone_unhang, .other = &other.base };
	struct mr_entry e;

	ck_assert_int_eq(lookup(address(ra), &e, NULL), 0);
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(ra), &other.base), 0);
	ck_assert_int_eq(mr_cache_listen_gone(&reg.cache, address(ra), &u.g.base), 0); /* first */
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	ck_assert_uint_eq(u.g.calls, 1);
	ck_assert_uint_eq(other.calls, 0);
}
END_TEST

START_TEST(test_big_mempool_on_a_worker)
{
	struct reg_allocation *ra = alloc(4 * MiB);
	struct test_waiter w = waiter(), u = waiter();
	uint64_t start = address(ra), len = 4 * MiB;
	struct pool_reg *pool;
	struct mr_entry e;
	char why[160];

	ck_assert_int_eq(mempool_register(&reg.mempools, &owner, "big", &start, &len, 1, false,
					  &w.base, &pool, why, sizeof(why)), -EINPROGRESS);
	ck_assert_uint_eq(holds, 1);
	ck_assert_uint_eq(reg.base.jobs, 1); /* the provider may be busy: others offload too */
	ck_assert(registrar_offload(&reg, 0));
	ck_assert_int_eq(lookup(address(ra) + 4096, &e, NULL), -EAGAIN); /* being made */
	pump_until(&w.calls, 1);
	ck_assert_int_eq(w.result, 0);
	ck_assert_uint_eq(reg.base.jobs, 0);
	ck_assert_int_eq(lookup(address(ra) + 4096, &e, NULL), 0);
	ck_assert_uint_eq(e.lkey, pool->mrs[0]->pmr->lkey);

	/* 4 MiB to unpin: on a worker. */
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "big", &u.base, why,
					    sizeof(why)), -EINPROGRESS);
	ck_assert_uint_eq(idles, 0);
	pump_until(&u.calls, 1);
	ck_assert_uint_eq(idles, 1);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_uint_eq(holds, 0);
}
END_TEST

START_TEST(test_mempool_mr_serves_lookups_and_idles)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	struct test_waiter w = waiter();
	uint64_t start = address(ra) + 100, len = 8 * KiB, gen;
	struct pool_reg *pool;
	struct mr_entry e;
	char why[160];

	ck_assert_int_eq(mempool_register(&reg.mempools, &owner, "p", &start, &len, 1, false,
					  &w.base, &pool, why, sizeof(why)), 0);
	ck_assert_uint_eq(pool->n_mrs, 1);
	ck_assert_uint_eq(pool->mrs[0]->start, address(ra)); /* rounded out to pages */
	ck_assert_uint_eq(pool->mrs[0]->end, address(ra) + 12 * KiB);
	ck_assert_uint_eq(ra->pool_refs, 1);
	ck_assert_uint_eq(host_pinned, 12 * KiB);
	ck_assert_int_eq(lookup(address(ra) + 4 * KiB, &e, NULL), 0);
	ck_assert_uint_eq(e.lkey, pool->mrs[0]->pmr->lkey); /* its keys: no page pinned twice */
	ck_assert_uint_eq(host_pinned, 12 * KiB);

	gen = status_page_generation(&mem.status);
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "p", NULL, why, sizeof(why)), 0);
	ck_assert_uint_gt(status_page_generation(&mem.status), gen); /* its keys died */
	ck_assert_uint_eq(ra->pool_refs, 0);
	ck_assert_uint_eq(idles, 1);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "p", NULL, why, sizeof(why)),
			 -ENOENT);
}
END_TEST

static int pool(const char *name, const uint64_t *starts, const uint64_t *lengths, size_t n,
		struct pool_reg **ret, char *why, size_t why_size)
{
	static struct test_waiter w;

	w = waiter();
	return mempool_register(&reg.mempools, &owner, name, starts, lengths, n, false, &w.base,
				ret, why, why_size);
}

START_TEST(test_mempool_ranges_rounded_and_merged)
{
	struct reg_allocation *ra = alloc(64 * KiB), *rb = alloc(64 * KiB);
	uint64_t a = address(ra), b = address(rb);
	/* Two that round to touching pages, one alone, and two that touch across allocations. */
	uint64_t starts[] = { a + 4000, a + 100, a + 32 * KiB + 10, a + 60 * KiB, b };
	uint64_t lengths[] = { 200, 200, 10, 4 * KiB, 4 * KiB };
	struct pool_reg *p;
	char why[160];

	ck_assert_uint_eq(b, a + 64 * KiB);
	ck_assert_int_eq(pool("p", starts, lengths, 5, &p, why, sizeof(why)), 0);
	ck_assert_uint_eq(p->n_mrs, 4);
	ck_assert_uint_eq(p->mrs[0]->start, a);
	ck_assert_uint_eq(p->mrs[0]->end, a + 8 * KiB);
	ck_assert_uint_eq(p->mrs[1]->start, a + 32 * KiB);
	ck_assert_uint_eq(p->mrs[1]->end, a + 36 * KiB);
	ck_assert_uint_eq(p->mrs[2]->start, a + 60 * KiB);
	ck_assert_uint_eq(p->mrs[2]->end, a + 64 * KiB);
	ck_assert_ptr_eq(p->mrs[3]->allocation, rb); /* never one MR over two allocations */
	ck_assert_uint_eq(p->mrs[3]->start, b);
	ck_assert_uint_eq(p->mrs[3]->end, b + 4 * KiB);
	ck_assert_uint_eq(ra->pool_refs, 3);
	ck_assert_uint_eq(rb->pool_refs, 1);
	ck_assert_uint_eq(host_pinned, 20 * KiB);
}
END_TEST

START_TEST(test_mempool_name_taken)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	uint64_t start = address(ra), len = 4 * KiB, other_start = start + 8 * KiB;
	struct test_waiter w = waiter();
	struct reg_owner other;
	struct pool_reg *p;
	char why[160] = "";

	ck_assert_int_eq(pool("p", &start, &len, 1, &p, why, sizeof(why)), 0);
	ck_assert_int_eq(pool("p", &other_start, &len, 1, &p, why, sizeof(why)), -EEXIST);
	ck_assert_ptr_nonnull(strstr(why, "mempool 'p' is registered already"));
	ck_assert_uint_eq(reg.mempools.n_regs, 1);
	ck_assert_uint_eq(host_pinned, 4 * KiB); /* the refusal pinned nothing */
	ck_assert_uint_eq(ra->pool_refs, 1);

	/* Names are the owner's: another may take it. */
	reg_owner_init(&other, 2, getpid(), getuid());
	ck_assert_int_eq(mempool_register(&reg.mempools, &other, "p", &other_start, &len, 1,
					  false, &w.base, &p, why, sizeof(why)), 0);
	ck_assert_uint_eq(reg.mempools.n_regs, 2);
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "p", NULL, why, sizeof(why)), 0);
	ck_assert_ptr_eq(LIST_FIRST(&other.pools), p); /* the other's stays */
	pools_leave(&other);
	ck_assert_uint_eq(reg.mempools.n_regs, 0);
	ck_assert_uint_eq(host_pinned, 0);
}
END_TEST

START_TEST(test_mempool_range_outside_memory)
{
	struct reg_allocation *ra = alloc(64 * KiB), *gone = alloc(4 * KiB);
	uint64_t a = address(ra), g = address(gone);
	uint64_t starts[] = { a, a + 60 * KiB }, lengths[] = { 4 * KiB, 8 * KiB };
	uint64_t zero = 0;
	struct pool_reg *p;
	char why[256] = "";

	/* The first range is fine, the second runs past a's end: nothing is registered. */
	ck_assert_int_eq(pool("p", starts, lengths, 2, &p, why, sizeof(why)), -EFAULT);
	ck_assert_ptr_nonnull(strstr(why, "is not inside one allocation of domain unit"));
	ck_assert_int_eq(pool("p", starts, &zero, 1, &p, why, sizeof(why)), -EFAULT);
	ck_assert_int_eq(free_allocation(gone, NULL), 0);
	ck_assert_int_eq(pool("p", &g, lengths, 1, &p, why, sizeof(why)), -EFAULT);
	ck_assert_uint_eq(reg.mempools.n_regs, 0);
	ck_assert_uint_eq(ra->pool_refs, 0);
	ck_assert_uint_eq(host_pinned, 0);
	ck_assert_uint_eq(reg.cache.registrations, 0);
}
END_TEST

START_TEST(test_mempool_quotas)
{
	struct reg_allocation *ra = alloc(16 * KiB), *rb = alloc(4 * KiB);
	uint64_t a = address(ra), b = address(rb), len = 16 * KiB, page = 4 * KiB;
	struct pool_reg *p;
	struct mr_entry e;
	char why[160] = "";

	/* A pool over pages the cache pinned pins nothing more: it fits a full quota. */
	cfg.quota.pinned_bytes = 16 * KiB;
	ck_assert_int_eq(lookup(a, &e, NULL), 0);
	ck_assert_int_eq(pool("p", &a, &len, 1, &p, why, sizeof(why)), 0);
	ck_assert_uint_eq(host_pinned, 16 * KiB);
	ck_assert_int_eq(pool("q", &b, &page, 1, &p, why, sizeof(why)), -EDQUOT);
	ck_assert_ptr_nonnull(strstr(why, "quota.pinned_bytes"));
	ck_assert_uint_eq(rb->pool_refs, 0);

	cfg.quota.pinned_bytes = 64 * KiB;
	cfg.quota.mempools = 1;
	ck_assert_int_eq(pool("q", &b, &page, 1, &p, why, sizeof(why)), -EDQUOT);
	ck_assert_msg(strstr(why, "quota.mempools (1) would be exceeded in domain ") &&
		      strstr(why, ": 1 in use, tried to add 1 more; raise [quota] "
			     "mempools in mrd.conf and reload mrd"), "%s", why);
	ck_assert_uint_eq(reg.mempools.n_regs, 1);
	cfg.quota.mempools = 2;
	ck_assert_int_eq(pool("q", &b, &page, 1, &p, why, sizeof(why)), 0);
	ck_assert_uint_eq(host_pinned, 20 * KiB);
}
END_TEST

START_TEST(test_mempool_unregister_unknown)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	uint64_t start = address(ra), len = 4 * KiB;
	struct reg_owner other;
	struct pool_reg *p;
	char why[160] = "";

	ck_assert_int_eq(pool("p", &start, &len, 1, &p, why, sizeof(why)), 0);
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "nope", NULL, why, sizeof(why)),
			 -ENOENT);
	ck_assert_ptr_nonnull(strstr(why, "no mempool 'nope' is registered"));
	reg_owner_init(&other, 2, getpid(), getuid());
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &other, "p", NULL, why, sizeof(why)),
			 -ENOENT);
	ck_assert_uint_eq(reg.mempools.n_regs, 1); /* the owner's pool is untouched */
	ck_assert_uint_eq(ra->pool_refs, 1);
	ck_assert_uint_eq(host_pinned, 4 * KiB);
}
END_TEST

/* The domain frees no allocation with pool_refs (control's Free answers EBUSY, a leaving
 * owner's stays, ownerless): here, that the count is right and its end is told. */
START_TEST(test_mempools_hold_their_allocation)
{
	struct reg_allocation *ra = alloc(64 * KiB);
	uint64_t p_start = address(ra), q_start = p_start + 4 * KiB, len = 8 * KiB;
	struct pool_reg *p, *q;
	struct mr_entry e;
	char why[160];

	ck_assert_int_eq(pool("p", &p_start, &len, 1, &p, why, sizeof(why)), 0);
	ck_assert_int_eq(pool("q", &q_start, &len, 1, &q, why, sizeof(why)), 0);
	ck_assert_uint_eq(ra->pool_refs, 2);
	ck_assert_uint_eq(host_pinned, 12 * KiB); /* the page both cover counts once */
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "p", NULL, why, sizeof(why)), 0);
	ck_assert_uint_eq(ra->pool_refs, 1);
	ck_assert_uint_eq(idles, 0);
	ck_assert_uint_eq(host_pinned, 8 * KiB); /* q still covers the shared page */
	ck_assert_int_eq(lookup(q_start + 4 * KiB, &e, NULL), 0);
	ck_assert_uint_eq(e.lkey, q->mrs[0]->pmr->lkey);
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "q", NULL, why, sizeof(why)), 0);
	ck_assert_uint_eq(ra->pool_refs, 0);
	ck_assert_uint_eq(idles, 1);
	ck_assert_uint_eq(host_pinned, 0);
}
END_TEST

/* A mempool MR the device kept (its dereg failed) quarantines its allocation once freed. */
START_TEST(test_mempool_failed_dereg_quarantines_the_run)
{
	struct reg_allocation *ra;
	uint64_t at, len = 8 * KiB;
	struct pool_reg *p;
	char why[160];

	reopen_failing_deregs("2");
	ra = alloc(64 * KiB);
	at = address(ra);
	ck_assert_int_eq(pool("p", &at, &len, 1, &p, why, sizeof(why)), 0);
	ck_assert_int_eq(mempool_unregister(&reg.mempools, &owner, "p", NULL, why, sizeof(why)), 0);
	ck_assert_uint_eq(ra->pool_refs, 0);
	ck_assert_uint_eq(host_pinned, 8 * KiB); /* the device pins it still */
	memset((void *)(uintptr_t)at, 0xa5, 64 * KiB);
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	assert_run_kept(at, 64 * KiB);
	ck_assert_uint_eq(reg.quarantine.n, 1);
	ck_assert_uint_eq(registrar_retry_quarantine(&reg), 1);
	ck_assert_uint_eq(released, 1);
	ck_assert_uint_eq(host_pinned, 0);
}
END_TEST

static struct reg_allocation *alloc_on_demand(uint64_t size)
{
	struct reg_allocation *ra = alloc(size);

	ra->mem.odp = registrar_on_demand(&reg, true, false);
	ck_assert(ra->mem.odp); /* soft pages on demand over RC */
	return ra;
}

/* An on-demand child whose dereg failed can still fault its pages in: they stay. */
START_TEST(test_odp_failed_dereg_quarantines_the_run)
{
	uint64_t at = free_under_a_failing_dereg(alloc_on_demand);

	ck_assert_uint_eq(reg.odp.stats.children_destroyed, 0);
	assert_run_kept(at, 64 * KiB);
	ck_assert_uint_eq(reg.quarantine.n, 1);
	ck_assert_uint_eq(reg.quarantine.bytes, 64 * KiB);
	ck_assert_uint_eq(reg.odp.zombies, 0);
	ck_assert_uint_eq(registrar_retry_quarantine(&reg), 1);
	ck_assert_uint_eq(reg.odp.stats.children_destroyed, 1);
	ck_assert_uint_eq(released, 1);
	ck_assert_uint_eq(reg.quarantine.n, 0);
}
END_TEST

/* The same when a worker deregisters the child (a Dma under way makes the domain busy). */
START_TEST(test_odp_failed_dereg_on_a_worker_quarantines_the_run)
{
	struct reg_allocation *ra;
	struct mr_entry e;
	uint64_t at;

	reopen_failing_deregs("2");
	ra = alloc_on_demand(64 * KiB);
	at = address(ra);
	ck_assert_int_eq(lookup(at, &e, NULL), 0);
	memset((void *)(uintptr_t)at, 0xa5, 64 * KiB);
	registrar_dma_start(&reg);
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	ck_assert_uint_eq(reg.base.jobs, 1); /* the child's dereg, on a worker */
	pump_until(&holds, 0);
	registrar_dma_end(&reg);
	ck_assert_uint_eq(reg.odp.stats.children_destroyed, 0);
	assert_run_kept(at, 64 * KiB);
	ck_assert_uint_eq(reg.quarantine.n, 1);
	ck_assert_uint_eq(registrar_retry_quarantine(&reg), 1);
	ck_assert_uint_eq(released, 1);
}
END_TEST

START_TEST(test_odp_child_made_and_retired)
{
	struct reg_allocation *ra = alloc_on_demand(64 * KiB);
	struct mr_entry e, again;

	ck_assert(!registrar_on_demand(&reg, false, false));
	ck_assert_int_eq(lookup(address(ra) + 8 * KiB, &e, NULL), 0);
	ck_assert_uint_eq(reg.odp.children, 1);
	ck_assert_uint_eq(reg.odp.stats.faults, 1);
	ck_assert_uint_eq(e.start, address(ra)); /* its chunk, cut to the allocation */
	ck_assert_uint_eq(e.end, address(ra) + 64 * KiB);
	ck_assert_uint_eq(host_pinned, 0); /* on demand: nothing pinned */
	ck_assert_int_eq(lookup(address(ra), &again, NULL), 0);
	ck_assert_uint_eq(again.lkey, e.lkey);
	ck_assert_uint_eq(reg.odp.stats.faults, 1); /* found in its slot: no fault */

	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	ck_assert_uint_eq(reg.odp.children, 0);
	ck_assert_uint_eq(reg.odp.stats.children_destroyed, 1);
	ck_assert_uint_eq(released, 1); /* no work on it: its pages went at once */
}
END_TEST

/* An on-demand allocation's children are its own (cut to it): its free bumps the generation
 * when one was faulted in, not when none was. */
START_TEST(test_odp_free_bumps_only_with_children)
{
	struct reg_allocation *untouched = alloc_on_demand(64 * KiB);
	struct reg_allocation *faulted = alloc_on_demand(64 * KiB);
	uint64_t gen = status_page_generation(&mem.status);
	struct mr_entry e;

	ck_assert_int_eq(lookup(address(faulted), &e, NULL), 0);
	ck_assert_uint_eq(reg.odp.children, 1);
	ck_assert_ptr_null(mr_table_lookup(&reg.cache.table, address(untouched)));
	frees_bump_only_over_keys(untouched, faulted, gen);
}
END_TEST

START_TEST(test_prefetch_holds_and_delays_the_free)
{
	struct reg_allocation *ra = alloc_on_demand(64 * KiB);
	struct test_waiter flush = waiter();
	char why[160];

	ck_assert_int_eq(odp_prefetch(&reg.odp, &owner, ra, address(ra), 64 * KiB, ODP_PREFETCH,
				      &flush.base, why, sizeof(why)), -EINPROGRESS);
	ck_assert_uint_eq(holds, 1);
	ck_assert_uint_eq(owner.n_prefetches, 1);
	pump_until(&flush.calls, 1);
	ck_assert_int_eq(flush.result, 0);
	ck_assert_uint_eq(holds, 0);
	ck_assert_uint_eq(owner.n_prefetches, 0);
	ck_assert_uint_eq(reg.odp.children, 1); /* the worker made it, the loop linked it */

	/* Work queued on it: the free waits for it, then the pages go. */
	ck_assert_int_eq(odp_prefetch(&reg.odp, &owner, ra, address(ra), 4 * KiB, ODP_PREFETCH,
				      NULL, why, sizeof(why)), 0);
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	pump_until(&released, 1);
	ck_assert_uint_eq(holds, 0);
	ck_assert_uint_eq(reg.odp.children, 0);
}
END_TEST

START_TEST(test_owner_leaving_cancels_a_waiting_flush)
{
	struct reg_allocation *ra = alloc_on_demand(64 * KiB);
	struct test_waiter flush = waiter();
	char why[160];

	/* Room for no prefetch: the flush waits, holding the domain. */
	owner.n_prefetches = ODP_PREFETCH_IN_FLIGHT;
	ck_assert_int_eq(odp_prefetch(&reg.odp, &owner, ra, address(ra), 4 * KiB, ODP_PREFETCH,
				      &flush.base, why, sizeof(why)), -EINPROGRESS);
	ck_assert_uint_eq(holds, 1);
	ck_assert_uint_eq(reg.odp.jobs, 0); /* not submitted */
	odp_forget_owner(&reg.odp, &owner);
	ck_assert_uint_eq(holds, 0);
	ck_assert_uint_eq(owner.n_prefetches, 0);
	ck_assert_uint_eq(ra->odp_jobs, 0);
}
END_TEST

/* ra's children. */
static unsigned children_of(const struct reg_allocation *ra)
{
	const struct odp_child *c;
	unsigned n = 0;

	LIST_FOREACH(c, &ra->odp_children, link)
		n++;
	return n;
}

START_TEST(test_odp_children_cut_to_their_allocation)
{
	struct reg_allocation *ra = alloc_on_demand(64 * KiB), *rb = alloc_on_demand(64 * KiB);
	struct reg_allocation *big = alloc_on_demand(8 * MiB);
	uint64_t a = address(ra), b = address(rb), c = address(big);
	struct mr_entry ea, eb, e;

	/* Two allocations in one chunk: a child each, each no wider than its own. */
	ck_assert_uint_eq(reg.odp.chunk_shift, 21);
	ck_assert_uint_eq((a - reg.odp.base) >> 21, (b - reg.odp.base) >> 21);
	ck_assert_int_eq(lookup(b + 100, &eb, NULL), 0);
	ck_assert_uint_eq(eb.start, b);
	ck_assert_uint_eq(eb.end, b + 64 * KiB);
	ck_assert_int_eq(lookup(a + 64 * KiB - 1, &ea, NULL), 0);
	ck_assert_uint_eq(ea.start, a);
	ck_assert_uint_eq(ea.end, a + 64 * KiB);
	ck_assert_uint_ne(ea.lkey, eb.lkey);
	ck_assert_uint_eq(children_of(ra), 1);
	ck_assert_uint_eq(children_of(rb), 1);

	/* One allocation over chunks: a child per chunk, cut at the chunk's bounds. */
	ck_assert_uint_eq((c - reg.odp.base) % (2 * MiB), 0);
	ck_assert_int_eq(lookup(c + 5 * MiB, &e, NULL), 0);
	ck_assert_uint_eq(e.start, c + 4 * MiB);
	ck_assert_uint_eq(e.end, c + 6 * MiB);
	ck_assert_uint_eq(reg.odp.children, 3);
	ck_assert_uint_eq(reg.odp.stats.children_created, 3);
	ck_assert_uint_eq(host_pinned, 0);
}
END_TEST

START_TEST(test_odp_freed_children_leave_the_index)
{
	struct reg_allocation *ra = alloc_on_demand(64 * KiB), *rb = alloc_on_demand(64 * KiB);
	uint64_t a = address(ra), b = address(rb);
	struct mr_entry ea, eb, again;

	ck_assert_int_eq(lookup(a, &ea, NULL), 0);
	ck_assert_int_eq(lookup(b, &eb, NULL), 0);
	ck_assert_int_eq(free_allocation(ra, NULL), 0);
	ck_assert_uint_eq(released, 1);
	ck_assert_uint_eq(children_of(rb), 1); /* b's alone */
	ck_assert_ptr_null(mr_table_lookup(&reg.cache.table, b)); /* children are in no table */
	ck_assert_uint_eq(reg.odp.children, 1);
	ck_assert_uint_eq(reg.odp.stats.invalidations, 1); /* zapped before it went */
	ck_assert_uint_eq(reg.odp.stats.children_destroyed, 1);
	ck_assert_uint_eq(reg.odp.zombies, 0); /* no work could reach it: freed */
	ck_assert_int_eq(lookup(a, &again, NULL), -ENOENT);
	ck_assert_int_eq(lookup(b, &again, NULL), 0);
	ck_assert_uint_eq(again.lkey, eb.lkey);
	ck_assert_uint_eq(reg.odp.stats.faults, 2); /* b's found in its slot */
}
END_TEST

START_TEST(test_prefetch_bounds)
{
	struct reg_allocation *ra = alloc_on_demand(64 * KiB);
	uint64_t a = address(ra);
	char why[160] = "";

	/* The owner's work in flight is bounded: past it, a prefetch without flush is refused. */
	owner.n_prefetches = ODP_PREFETCH_IN_FLIGHT;
	ck_assert_int_eq(odp_prefetch(&reg.odp, &owner, ra, a, 4 * KiB, ODP_PREFETCH, NULL, why,
				      sizeof(why)), -EAGAIN);
	ck_assert_ptr_nonnull(strstr(why, "16 prefetches are queued already"));
	ck_assert_uint_eq(holds, 0);
	ck_assert_uint_eq(ra->odp_jobs, 0);
	ck_assert_uint_eq(reg.odp.stats.prefetch_requests, 0);
	owner.n_prefetches = ODP_PREFETCH_IN_FLIGHT - 1; /* room for the last one */
	ck_assert_int_eq(odp_prefetch(&reg.odp, &owner, ra, a, 4 * KiB, ODP_PREFETCH, NULL, why,
				      sizeof(why)), 0);
	ck_assert_uint_eq(owner.n_prefetches, ODP_PREFETCH_IN_FLIGHT);
	pump_until(&holds, 0);
	ck_assert_uint_eq(owner.n_prefetches, ODP_PREFETCH_IN_FLIGHT - 1);
	owner.n_prefetches = 0;

	/* And the domain's, whoever asks. */
	reg.odp.jobs = ODP_DOMAIN_JOBS_MAX;
	ck_assert_int_eq(odp_prefetch(&reg.odp, &owner, ra, a, 4 * KiB, ODP_PREFETCH, NULL, why,
				      sizeof(why)), -EAGAIN);
	ck_assert_ptr_nonnull(strstr(why, "256 prefetches are queued already"));
	reg.odp.jobs = 0;

	/* No workers (they drained): nobody to prefetch. */
	{
		struct worker_pool *w = workers;

		workers = NULL;
		ck_assert_int_eq(odp_prefetch(&reg.odp, &owner, ra, a, 4 * KiB, ODP_PREFETCH, NULL,
					      why, sizeof(why)), -ESHUTDOWN);
		workers = w;
	}
	ck_assert_uint_eq(reg.odp.stats.prefetch_requests, 1);
}
END_TEST

/* The registrar anew on a soft device with knob set to value (read at its open). */
static void reopen_with(const char *knob, const char *value)
{
	teardown();
	ck_assert_int_eq(setenv(knob, value, 1), 0);
	open_registrar(MR_POLICY_CONTIG);
	ck_assert_int_eq(unsetenv(knob), 0);
}

/* The device's capabilities decide what is asked: no remote atomics where it has none (its
 * registrations work), and on demand only where its RC ODP bits cover the access. */
START_TEST(test_access_follows_the_device)
{
	const unsigned rw = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	struct reg_allocation *ra;
	struct mr_entry e;

	ck_assert_uint_eq(registration_access(false, &reg.base.provider->caps), MR_CACHE_ACCESS);
	ck_assert(registrar_on_demand(&reg, true, false));
	reopen_with("MRD_SOFT_ATOMIC", "none");
	ck_assert_uint_eq(registration_access(false, &reg.base.provider->caps), rw);
	ck_assert_uint_eq(registration_access(true, &reg.base.provider->caps),
			  MRD_ACCESS_REMOTE_READ);
	ra = alloc(64 * KiB);
	ck_assert_int_eq(lookup(address(ra), &e, NULL), 0);
	ck_assert_uint_eq(LIST_FIRST(&ra->mrs)->pmr->access, rw | MRD_ACCESS_MW_BIND); /* windows */
	ra = alloc_on_demand(64 * KiB);
	ck_assert_int_eq(lookup(address(ra), &e, NULL), 0);
	ck_assert_uint_eq(LIST_FIRST(&ra->odp_children)->pmr->access, rw | MRD_ACCESS_ON_DEMAND);

	reopen_with("MRD_SOFT_ODP_RC", "send,recv,write,read"); /* no atomic bit */
	ck_assert(!registrar_on_demand(&reg, true, false));
	ck_assert(registrar_on_demand(&reg, true, true)); /* read-only: no atomics */
	reopen_with("MRD_SOFT_ODP_RC", "send,recv,write");
	ck_assert(!registrar_on_demand(&reg, true, true));
	ck_assert(!registrar_on_demand(&reg, false, false));
}
END_TEST

/* One case per module, so that a failure names the module it found broken. */
static TCase *module_case(Suite *s, const char *module)
{
	TCase *tc = tcase_create(module);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return tc;
}

static Suite *registrar_suite(void)
{
	Suite *s = suite_create("registrar");
	TCase *tc = module_case(s, "registrar");

	tcase_add_test(tc, test_pinned_quota_mine_and_the_hosts);
	tcase_add_test(tc, test_offload_rule);
	tcase_add_test(tc, test_big_registration_and_free_on_a_worker);
	tcase_add_test(tc, test_job_holds_until_done);
	tcase_add_test(tc, test_access_follows_the_device);
	tcase_add_test(tc, test_failed_dereg_quarantines_the_run);
	tcase_add_test(tc, test_failed_dereg_on_a_worker_quarantines_the_run);
	tcase_add_test(tc, test_quarantined_run_dropped_at_close);

	tc = module_case(s, "cache");
	tcase_add_test(tc, test_lookup_registers_the_run_once);
	tcase_add_test(tc, test_freed_while_a_worker_registers);
	tcase_add_test(tc, test_page_policy_registers_one_page);
	tcase_add_test(tc, test_contig_registers_the_run_minus_other_mrs);
	tcase_add_test(tc, test_lookup_outside_memory_is_enoent);
	tcase_add_test(tc, test_failed_registration_uncharges);
	tcase_add_test(tc, test_freed_keys_leave_the_table);
	tcase_add_test(tc, test_flush_rebuilds_the_table);
	tcase_add_test(tc, test_mr_gone_heard_once);
	tcase_add_test(tc, test_mr_gone_listener_hung_anew);
	tcase_add_test(tc, test_mr_gone_listener_unhangs_inside);
	tcase_add_test(tc, test_free_bumps_only_over_mrs);

	tc = module_case(s, "odp");
	tcase_add_test(tc, test_odp_child_made_and_retired);
	tcase_add_test(tc, test_odp_failed_dereg_quarantines_the_run);
	tcase_add_test(tc, test_odp_failed_dereg_on_a_worker_quarantines_the_run);
	tcase_add_test(tc, test_odp_free_bumps_only_with_children);
	tcase_add_test(tc, test_prefetch_holds_and_delays_the_free);
	tcase_add_test(tc, test_owner_leaving_cancels_a_waiting_flush);
	tcase_add_test(tc, test_odp_children_cut_to_their_allocation);
	tcase_add_test(tc, test_odp_freed_children_leave_the_index);
	tcase_add_test(tc, test_prefetch_bounds);

	tc = module_case(s, "mempool");
	tcase_add_test(tc, test_big_mempool_on_a_worker);
	tcase_add_test(tc, test_mempool_mr_serves_lookups_and_idles);
	tcase_add_test(tc, test_mempool_ranges_rounded_and_merged);
	tcase_add_test(tc, test_mempool_name_taken);
	tcase_add_test(tc, test_mempool_range_outside_memory);
	tcase_add_test(tc, test_mempool_quotas);
	tcase_add_test(tc, test_mempool_unregister_unknown);
	tcase_add_test(tc, test_mempools_hold_their_allocation);
	tcase_add_test(tc, test_mempool_failed_dereg_quarantines_the_run);
	return s;
}

int main(void)
{
	return run_suite(registrar_suite());
}
