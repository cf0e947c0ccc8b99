/* SPDX-License-Identifier: MIT */
/*
 * make bench: the cost of one ODP fault (a lookup miss of an on-demand allocation, which makes
 * its child) with 40,000 allocations' children already in its chunk, against the same fault
 * with 1,000 there (PERF.md: <= 2x). In-process, on the soft provider: two domains' memory
 * and registrars side by side, each with its own window (as the suites below core build them:
 * tests/memory-fixture.c), no loop and no workers, so a fault runs where a lookup miss runs
 * in mrd, on the caller's thread. Every allocation is 4 KiB and [cache] odp_chunk is 1 GiB,
 * the arena size, so all of a domain's children share one chunk. Each rep faults FAULTS fresh
 * allocations in each domain, alternately, and frees them again (untimed), so the chunks hold
 * 1,000 and 40,000 children all along; the domains' tables hold as many entries.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/config.h"
#include "bench-util.h"
#include "macro.h"
#include "memory/allocation.h"
#include "memory/memory.h"
#include "memory/window.h"
#include "provider/provider.h"
#include "registration/reg-allocation.h"
#include "registration/reg-owner.h"
#include "registration/registrar.h"

#define KiB (1ull << 10)
#define GiB (1ull << 30)
#define REPS 7
#define FAULTS 32         /* timed faults per rep and domain */
#define ALLOC_BYTES (4 * KiB)
#define TARGET 2.0

static const size_t children[2] = { 1000, 40000 }; /* baseline, case */

struct odp_domain {
	struct config cfg;
	struct window window;
	struct memory mem;
	struct registrar reg;
	struct provider *device;
	struct reg_owner owner;
	struct worker_pool *workers; /* none: everything on the caller's thread */
	bool stopping;
	uint64_t host_pinned;
	struct reg_allocation *fresh[FAULTS];
	size_t n_fresh;
};

static void on_hold(void *data) {}
static void on_unhold(void *data) {}
static void on_idle(void *data, struct reg_allocation *ra) {}
static void on_changed(void *data) {}

/* As the domain does once the device let go: the pages go back, the wrapper with them. */
static int on_released(void *data, struct reg_allocation *ra, struct waiter *waiter)
{
	struct odp_domain *d = data;

	allocation_release(&d->mem, &ra->mem, NULL, NULL); /* no workers: here */
	free(ra);
	return 0; /* the registrar answers waiter */
}

/* A domain's memory over its own window, and its registrar. */
static int domain_open(struct odp_domain *d, uint64_t window_base)
{
	int verbs_error, r;

	config_init(&d->cfg);
	d->cfg.window_base = window_base;
	d->cfg.window_size = 4 * GiB;
	d->cfg.arena_size = GiB;
	d->cfg.odp_chunk = GiB; /* the arena's size: one chunk holds every child */
	d->cfg.hugepages = HUGEPAGES_NO;
	r = window_reserve(&d->window, d->cfg.window_base, d->cfg.window_size, d->cfg.arena_size);
	if (r < 0)
		return r;
	memory_init(&d->mem, &d->cfg, &d->cfg.quota, &d->window, "bench");
	r = status_page_open(&d->mem.status, "bench", 1);
	if (r < 0)
		return r;
	d->reg = (struct registrar){ .base = {
		.config = &d->cfg, .quota = &d->cfg.quota, .name = "bench", .mem = &d->mem,
		.workers = &d->workers, .stopping = &d->stopping, .host_pinned = &d->host_pinned,
		.events = { .hold = on_hold, .unhold = on_unhold, .allocation_idle = on_idle,
			    .released = on_released, .changed = on_changed },
		.data = d,
	} };
	r = provider_open("soft", NULL, &d->device, &verbs_error);
	if (r < 0)
		return r;
	reg_owner_init(&d->owner, 1, getpid(), getuid());
	return registrar_open(&d->reg, d->device, MR_POLICY_CONTIG, (uintptr_t)d->window.base);
}

static int alloc_on_demand(struct odp_domain *d, struct reg_allocation **ret)
{
	struct reg_allocation *ra = calloc(1, sizeof(*ra));
	char why[160];
	int r;

	if (!ra)
		return -ENOMEM;
	reg_allocation_init(ra);
	r = allocation_alloc(&d->mem, &ra->mem, &d->owner.mem, ALLOC_BYTES, 0, false, why,
			     sizeof(why));
	if (r < 0) {
		fprintf(stderr, "bench-odp: allocation: %s\n", why);
		free(ra);
		return r;
	}
	allocation_set_kind(&ra->mem, registrar_on_demand(&d->reg, true, false), false);
	*ret = ra;
	return ra->mem.odp ? 0 : -EOPNOTSUPP;
}

/* A lookup miss: mrd's path for it, which faults the child in. */
static int fault(struct odp_domain *d, const struct reg_allocation *ra)
{
	struct mr_entry e;
	char why[160];
	int r = registrar_lookup(&d->reg, allocation_address(&ra->mem), &e, why, sizeof(why),
				NULL);

	if (r < 0)
		fprintf(stderr, "bench-odp: fault: %s\n", why);
	return r;
}

static size_t chunk_of(const struct odp_domain *d, const struct reg_allocation *ra)
{
	return (size_t)((allocation_address(&ra->mem) - d->reg.odp.base) >> d->reg.odp.chunk_shift);
}

/* n allocations faulted in, all in the chunk of the first: they stay till the end. */
static int domain_fill(struct odp_domain *d, size_t n)
{
	struct reg_allocation *first = NULL, *ra;
	int r;

	for (size_t i = 0; i < n; i++) {
		r = alloc_on_demand(d, &ra);
		if (r >= 0)
			r = fault(d, ra);
		if (r < 0)
			return r;
		if (!first)
			first = ra;
		if (chunk_of(d, ra) != chunk_of(d, first))
			return -E2BIG; /* the arena left the chunk: odp_chunk too small */
	}
	return d->reg.odp.children == n ? 0 : -EBADMSG;
}

/* FAULTS fresh allocations faulted in, timed one by one: the median, in ns. */
static int timed_faults(struct odp_domain *d, double *ret_ns)
{
	uint64_t ns[FAULTS];
	int r = 0;

	for (d->n_fresh = 0; d->n_fresh < FAULTS && r >= 0; d->n_fresh++)
		r = alloc_on_demand(d, &d->fresh[d->n_fresh]);
	for (size_t i = 0; i < FAULTS && r >= 0; i++) {
		uint64_t t0 = bench_now_ns();

		r = fault(d, d->fresh[i]);
		ns[i] = bench_now_ns() - t0;
	}
	if (r >= 0 && chunk_of(d, d->fresh[FAULTS - 1]) != chunk_of(d, d->fresh[0]))
		r = -E2BIG;
	*ret_ns = r >= 0 ? (double)bench_quantile(ns, FAULTS, 0.50) : 0;
	return r;
}

/* The fresh ones go again, as a Free does: the chunk is back to its n children. */
static void free_fresh(struct odp_domain *d)
{
	for (size_t i = 0; i < d->n_fresh; i++) {
		allocation_retire(&d->mem, &d->fresh[i]->mem);
		(void)registrar_retire(&d->reg, d->fresh[i], NULL);
	}
	d->n_fresh = 0;
}

static void domain_close(struct odp_domain *d)
{
	struct allocation *a;

	free_fresh(d);
	while ((a = LIST_FIRST(&d->owner.mem.allocations))) {
		allocation_retire(&d->mem, a);
		(void)registrar_retire(&d->reg, reg_allocation_of(a), NULL);
	}
	registrar_close(&d->reg);
	if (d->device)
		provider_close(d->device);
	memory_done(&d->mem);
	window_release(&d->window);
	config_done(&d->cfg);
}

int main(void)
{
	static struct odp_domain dom[2];
	double ns[2][REPS], per_rep[REPS], busy = bench_cpu_busy(300), fill_s[2];
	struct bench_summary sum[1];
	size_t n_sum = 0;
	int r = 0;

	/* Two windows, 1 TiB apart, from mrd's default base. */
	for (int k = 0; k < 2 && r >= 0; k++) {
		uint64_t t0 = bench_now_ns();

		r = domain_open(&dom[k], 0x200000000000ull + (uint64_t)k * (1ull << 40));
		if (r >= 0)
			r = domain_fill(&dom[k], children[k]);
		fill_s[k] = (double)(bench_now_ns() - t0) / 1e9;
	}
	for (int rep = 0; rep < REPS && r >= 0; rep++)
		for (int j = 0; j < 2 && r >= 0; j++) {
			int k = (rep + j) % 2; /* the order swapped every rep */

			r = timed_faults(&dom[k], &ns[k][rep]);
			free_fresh(&dom[k]);
			if (r >= 0 && dom[k].reg.odp.children != children[k])
				r = -EBADMSG;
		}
	for (int k = 0; k < 2; k++)
		domain_close(&dom[k]);
	if (r < 0) {
		fprintf(stderr, "bench-odp: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	for (int rep = 0; rep < REPS; rep++)
		per_rep[rep] = ns[1][rep] / ns[0][rep];
	{
		double sorted[REPS], med[2], ratio;

		for (int k = 0; k < 2; k++) {
			memcpy(sorted, ns[k], sizeof(sorted));
			med[k] = bench_median(sorted, REPS);
		}
		memcpy(sorted, per_rep, sizeof(sorted));
		ratio = bench_median(sorted, REPS);
		printf("odp-fault-40k-vs-1k: ratio=%.3f (case=one ODP fault: a lookup miss of a 4 KiB "
		       "on-demand allocation, its child made, with %zu allocations' children in its "
		       "chunk baseline=the same with %zu reps=%d, median of %d faults per rep and "
		       "side)\n", ratio, children[1], children[0], REPS, FAULTS);
		bench_print_doubles("per-rep ratio", per_rep, REPS);
		printf("  raw ns per fault, median of reps: case %.0f; baseline %.0f; filling the "
		       "chunks took %.1f s (%zu) and %.1f s (%zu)\n", med[1], med[0], fill_s[0],
		       children[0], fill_s[1], children[1]);
		bench_add_summary(sum, &n_sum, "odp-fault-40k-vs-1k", ratio, per_rep, REPS, TARGET,
				  true);
	}
	printf("summary (target from PERF.md: an ODP fault with 40 K allocations in one chunk <= "
	       "%.1fx the fault with 1 K):\n", TARGET);
	bench_print_summary(sum, n_sum);
	printf("  %ld CPUs, %.0f%% of them busy with other work just before the run\n",
	       sysconf(_SC_NPROCESSORS_ONLN), 100 * busy);
	return EXIT_SUCCESS;
}
