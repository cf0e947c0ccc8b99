/* SPDX-License-Identifier: MIT */
/* make bench: what a warm restart costs a client. One restart is SIGUSR2 (mrd saves, re-executes
 * and takes the memory over), READY=1, then mrd_client_reconnect(): the time the process is
 * cut off from mrd. The case holds N allocations of 4 KiB (N = 1,000 and 10,000), the baseline
 * none, interleaved on one mrd in the same run: the ratio is the price of carrying the memory
 * over, on top of re-executing at all (mrd's start: provider, window, socket). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-util.h"

#define REPS 7

/* A restart costs ~10 ms here (a new image: loader, provider, window, socket); each allocation
 * carried adds ~2 us, most of it first touches of the new image's heap (perf: page faults in
 * malloc, the allocation map, protobuf unpack). */
static const struct {
	unsigned n;
	double target;
} counts[] = { { 1000, 2.0 }, { 10000, 4.0 } };

/* One warm restart with client connected; the nanoseconds until it is back. */
static int restart_once(struct mrd_proc *mrd, mrd_client *client, unsigned want,
			uint64_t *ret_ns)
{
	char buf[512];
	uint64_t t0 = bench_now_ns();
	int r;

	if (kill(mrd->pid, SIGUSR2) < 0)
		return -errno;
	r = mrd_proc_notified(mrd, "READY=1", buf, sizeof(buf), 60000);
	if (r < 0)
		return r;
	r = mrd_client_reconnect(client);
	*ret_ns = bench_now_ns() - t0;
	if (r < 0)
		return r;
	return (unsigned)r == want ? 0 : -EBADMSG;
}

/* Allocates n pages' worth of allocations into ptrs. */
static int alloc_n(mrd_client *c, void **ptrs, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		int r = mrd_mem_alloc(c, 4096, 0, 0, &ptrs[i]);

		if (r < 0)
			return r;
	}
	return 0;
}

static int free_n(mrd_client *c, void **ptrs, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		int r = mrd_mem_free(c, ptrs[i]);

		if (r < 0)
			return r;
	}
	return 0;
}

int main(void)
{
	static void *ptrs[10000];
	struct bench_summary sum[2];
	size_t n_sum = 0;
	struct mrd_proc mrd;
	mrd_client *client = NULL;
	int r;

	r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\n[quota]\nallocations = 20000\n", NULL);
	if (r < 0) {
		fprintf(stderr, "bench-restart: mrd did not start: %s\n", strerror(-r));
		return 1;
	}
	if (mrd_client_connect(mrd.socket, &client) < 0) {
		fprintf(stderr, "bench-restart: connect: %s\n", mrd_last_error());
		mrd_proc_stop(&mrd);
		return 1;
	}
	printf("bench-restart: SIGUSR2 until the handle is back, holding N allocations vs none "
	       "(cpu busy before: %.0f%%)\n", 100 * bench_cpu_busy(200));
	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
		double ratio[REPS], sorted[REPS], case_ms[REPS], base_ms[REPS], med, med_base, med_case;
		char name[32];

		for (unsigned rep = 0; rep < REPS; rep++) {
			uint64_t base, with;

			r = alloc_n(client, ptrs, counts[c].n);
			if (r >= 0)
				r = restart_once(&mrd, client, counts[c].n, &with);
			if (r >= 0)
				r = free_n(client, ptrs, counts[c].n);
			if (r >= 0)
				r = restart_once(&mrd, client, 0, &base);
			if (r < 0) {
				fprintf(stderr, "bench-restart: %s (%s)\n", strerror(-r), mrd_last_error());
				goto out;
			}
			base_ms[rep] = (double)base / 1e6;
			case_ms[rep] = (double)with / 1e6;
			ratio[rep] = (double)with / (double)base;
		}
		snprintf(name, sizeof(name), "restart-%u", counts[c].n);
		bench_print_doubles("  baseline ms", base_ms, REPS);
		bench_print_doubles("  case ms", case_ms, REPS);
		bench_print_doubles("  ratio", ratio, REPS);
		med_base = bench_median(base_ms, REPS);
		med_case = bench_median(case_ms, REPS);
		memcpy(sorted, ratio, sizeof(sorted));
		med = bench_median(sorted, REPS);
		bench_add_summary(sum, &n_sum, name, med, ratio, REPS, counts[c].target, true);
		printf("%s: ratio=%.2f (case=%.1f ms holding %u allocations, baseline=%.1f ms holding "
		       "none, reps=%d)\n", name, med, med_case, counts[c].n, med_base, REPS);
	}
	bench_print_summary(sum, n_sum);
	r = 0;
out:
	mrd_client_close(client);
	mrd_proc_stop(&mrd);
	return r < 0 ? 1 : 0;
}
