/* SPDX-License-Identifier: MIT */
/* make bench: granting and revoking a memory window over 4 KiB of mrd memory
 * (mrd_window_grant + mrd_window_revoke: two requests, a bind and a local invalidate on the
 * domain's PD) against three baselines in the same run, interleaved rep by rep:
 * - soft-reg: provider_reg + provider_dereg of the same 4 KiB on the soft provider, in-process
 *   (the row is ibv_reg_mr + ibv_dereg_mr on rxe, target <= 0.2x; soft registers
 *   without the kernel's pinning, so this baseline is far cheaper than a device's);
 * - request-reg: what registering and dropping a fresh 4 KiB costs through mrd's request path
 *   (mrd_mem_alloc + mrd_keys_query + mrd_mem_free: a lookup that registers, a free that
 *   deregisters);
 * - 2 pings: two request round trips, what grant + revoke cost beyond mrd's own work. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <mrd/mrd.h>

#include "bench-util.h"
#include "macro.h"
#include "provider/provider.h"

#define REPS 7
#define ITERS 1000 /* per rep and side */
#define SIZE 4096

enum side { GRANT, SOFT_REG, REQUEST_REG, PINGS, N_SIDES };

static int once(enum side s, struct bench_mrd *m, struct provider_pd *pd, uint8_t *local)
{
	struct provider_mr *mr;
	struct mrd_keys k;
	uint32_t rkey;
	void *p;
	int r;

	switch (s) {
	case GRANT:
		r = mrd_window_grant(m->client, NULL, m->buf[0], SIZE,
				     MRD_WINDOW_REMOTE_READ | MRD_WINDOW_REMOTE_WRITE, &rkey);
		return r < 0 ? r : mrd_window_revoke(m->client, NULL, rkey);
	case SOFT_REG:
		r = provider_reg(pd, local, SIZE, (uintptr_t)local,
				 MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE |
				 MRD_ACCESS_REMOTE_READ | MRD_ACCESS_MW_BIND, &mr);
		return r < 0 ? r : provider_dereg(mr);
	case REQUEST_REG:
		r = mrd_mem_alloc(m->client, SIZE, 0, 0, &p);
		if (r >= 0)
			r = mrd_keys_query(m->client, p, &k);
		return r < 0 ? r : mrd_mem_free(m->client, p);
	default:
		r = mrd_client_ping(m->client);
		return r < 0 ? r : mrd_client_ping(m->client);
	}
}

int main(void)
{
	static const char *const names[N_SIDES] = { "grant+revoke", "soft reg+dereg of 4 KiB",
						     "alloc+lookup+free of 4 KiB",
						     "2 pings" };
	struct bench_summary sum[3];
	double ns[N_SIDES][REPS], ratio[3][REPS];
	size_t n_sum = 0;
	struct bench_mrd m = { 0 };
	struct provider *p;
	struct provider_pd *pd;
	uint8_t *local;
	int verbs_error, r;

	r = provider_open("soft", NULL, &p, &verbs_error);
	if (r >= 0)
		r = provider_pd_alloc(p, &pd);
	if (r < 0) {
		fprintf(stderr, "bench-windows: soft provider: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	local = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (local == MAP_FAILED || bench_mrd_start(&m, "bench-windows") < 0)
		return EXIT_FAILURE;
	memset(local, 1, SIZE);
	for (int rep = 0; rep < REPS; rep++)
		for (int s = 0; s < N_SIDES; s++) {
			uint64_t t0 = bench_now_ns();

			for (int i = 0; i < ITERS; i++)
				if ((r = once(s, &m, pd, local)) < 0) {
					fprintf(stderr, "bench-windows: %s: %s (%s)\n", names[s],
						strerror(-r), mrd_last_error());
					return EXIT_FAILURE;
				}
			ns[s][rep] = (double)(bench_now_ns() - t0) / ITERS;
		}
	printf("Memory window grant+revoke of 4 KiB vs registration, soft provider (reps=%d, "
	       "%d each per rep, interleaved)\n", REPS, ITERS);
	for (int s = 0; s < N_SIDES; s++) {
		char label[48];

		snprintf(label, sizeof(label), "  %s ns", names[s]);
		bench_print_doubles(label, ns[s], REPS);
	}
	for (int b = 0; b < 3; b++) {
		static const char *const rows[3] = { "window-4k-vs-soft-reg", "window-4k-vs-request-reg",
						     "window-4k-vs-2-pings" };
		static const double targets[3] = { 0.2, 1.0, 1.5 };

		for (int rep = 0; rep < REPS; rep++)
			ratio[b][rep] = ns[GRANT][rep] / ns[b + 1][rep];
		printf("%s: ratio=%.3f (case=mrd_window_grant+mrd_window_revoke of 4 KiB baseline=%s "
		       "reps=%d)\n", rows[b], bench_median(ratio[b], REPS), names[b + 1],
		       REPS);
		bench_add_summary(sum, &n_sum, rows[b], bench_median(ratio[b], REPS), ratio[b], REPS,
				  targets[b], true);
	}
	bench_print_summary(sum, n_sum);
	bench_mrd_stop(&m);
	(void)provider_pd_free(pd);
	provider_close(p);
	return 0;
}
