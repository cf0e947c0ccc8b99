/* SPDX-License-Identifier: MIT */
/* make bench, in the rxe VM (tests/vm/guest-init.sh, bench mode): memory windows through a
 * running mrd on a device, against baselines measured in the same run, interleaved rep by rep:
 * - window-4k-vs-ibv-reg: mrd_window_grant + mrd_window_revoke of 4 KiB (two requests: a bind
 *   and a local invalidate on the domain's PD) against ibv_reg_mr + ibv_dereg_mr of a 4 KiB
 *   buffer on the same device in this process (what a program that re-registers per request
 *   pays); target <= 0.2x.
 * - window-own-qp-4k-vs-ibv-reg: the same grant+revoke with the program's own QP (the
 *   client-PD model: libmrd binds a window of the program's PD on that QP, no request to mrd)
 *   against the same baseline; target <= 0.2x. Every 64 cycles a signaled WRITE of 8 bytes
 *   on the QP (counted in): a program's unsignaled work requests need one now and then.
 * - window-write-vs-mr-write: an RDMA WRITE of 256 KiB through mrd_dma into mrd memory by a
 *   window's rkey against the same WRITE by the MR's own rkey, as the time of the MR's over the
 *   window's (a throughput ratio); target >= 0.95x.
 * Usage: bench-windows-verbs SOCKET DEVICE GID_INDEX (exit 77 where the device is not here). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <infiniband/verbs.h>
#include <mrd/mrd.h>
#include <mrd/mrd-verbs.h>

#include "bench-util.h"
#include "bench-verbs.h"

#define REPS 7
#define GRANTS 300 /* per rep and side */
#define WRITES 40
#define SMALL 4096
#define BIG (256u << 10)
#define RW (MRD_WINDOW_REMOTE_READ | MRD_WINDOW_REMOTE_WRITE)

static int die(const char *what, int r)
{
	fprintf(stderr, "bench-windows-verbs: %s: %s (%s)\n", what, strerror(-r), mrd_last_error());
	exit(EXIT_FAILURE);
}

/* A signaled RDMA WRITE of 8 bytes from qp to its peer, awaited. */
static void signaled_write(struct ibv_qp *qp, struct ibv_cq *cq, const struct mrd_keys *k)
{
	struct ibv_sge sge = { .addr = k->start, .length = 8, .lkey = k->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = k->start + 64, .rkey = k->rkey } }, *bad;
	struct ibv_wc wc;
	int n;

	if (ibv_post_send(qp, &wr, &bad))
		die("the signaled WRITE", -EIO);
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		die("the signaled WRITE's completion", -EIO);
}

static double per_op_ns(uint64_t t0, int n)
{
	return (double)(bench_now_ns() - t0) / n;
}

int main(int argc, char **argv)
{
	struct bench_summary sum[2];
	double grant[REPS], own_grant[REPS], reg[REPS], win_w[REPS], mr_w[REPS], ratio[3][REPS];
	struct ibv_context *ctx = NULL;
	struct mrd_keys src_k, dst_k;
	struct ibv_pd *pd;
	size_t n_sum = 0;
	mrd_client *c, *bound;
	struct ibv_qp *qp[2];
	struct ibv_cq *cq;
	struct mrd_keys own_k;
	uint8_t *own_dst;
	uint8_t *own, *dst, *src;
	uint32_t rkey, big_rkey;
	int r;

	if (argc != 4) {
		fprintf(stderr, "usage: bench-windows-verbs SOCKET DEVICE GID_INDEX\n");
		return 2;
	}
	ctx = bench_open_verbs(argv[2]);
	if (!ctx) {
		printf("bench-windows-verbs: not measured: no verbs device %s here (make bench runs "
		       "it in the rxe VM)\n", argv[2]);
		return 77;
	}
	pd = ibv_alloc_pd(ctx);
	own = mmap(NULL, SMALL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!pd || own == MAP_FAILED)
		die("the device's PD and a buffer", -errno);
	memset(own, 1, SMALL);
	if ((r = mrd_client_connect(argv[1], &c)) < 0)
		die("connect", r);
	if ((r = mrd_mem_alloc(c, BIG, 0, 0, (void **)&dst)) < 0 ||
	    (r = mrd_mem_alloc(c, BIG, 0, 0, (void **)&src)) < 0)
		die("mrd_mem_alloc", r);
	memset(dst, 0, BIG);
	memset(src, 7, BIG);
	if ((r = mrd_keys_query_range(c, src, BIG, &src_k)) < 0 ||
	    (r = mrd_keys_query_range(c, dst, BIG, &dst_k)) < 0)
		die("mrd_keys_query_range", r);
	if ((r = mrd_window_grant(c, NULL, dst, BIG, RW, &big_rkey)) < 0)
		die("mrd_window_grant", r);
	/* The client-PD model: a handle bound to the program's PD, a connection of its own. */
	cq = ibv_create_cq(ctx, 512, NULL, NULL, 0);
	if (!cq || (r = bench_qp_pair(pd, cq, atoi(argv[3]), qp)) != 0)
		die("the program's own QPs", -(cq ? r : errno));
	if ((r = mrd_client_connect(argv[1], &bound)) < 0 || (r = mrd_verbs_bind_pd(bound, pd)) < 0)
		die("a handle bound to the program's PD", r);
	if ((r = mrd_mem_alloc(bound, BIG, 0, 0, (void **)&own_dst)) < 0 ||
	    (r = mrd_keys_query_range(bound, own_dst, BIG, &own_k)) < 0)
		die("the bound handle's memory", r);

	for (int rep = 0; rep < REPS; rep++) {
		uint64_t t0 = bench_now_ns();

		for (int i = 0; i < GRANTS; i++)
			if ((r = mrd_window_grant(c, NULL, dst, SMALL, RW, &rkey)) < 0 ||
			    (r = mrd_window_revoke(c, NULL, rkey)) < 0)
				die("grant+revoke", r);
		grant[rep] = per_op_ns(t0, GRANTS);
		t0 = bench_now_ns();
		for (int i = 0; i < GRANTS; i++) {
			if ((r = mrd_window_grant(bound, qp[1], own_dst, SMALL, RW, &rkey)) < 0 ||
			    (r = mrd_window_revoke(bound, qp[1], rkey)) < 0)
				die("grant+revoke on the program's own QP", r);
			if (i % 64 == 63)
				signaled_write(qp[1], cq, &own_k);
		}
		own_grant[rep] = per_op_ns(t0, GRANTS);
		t0 = bench_now_ns();
		for (int i = 0; i < GRANTS; i++) {
			struct ibv_mr *mr = ibv_reg_mr(pd, own, SMALL, IBV_ACCESS_LOCAL_WRITE |
						       IBV_ACCESS_REMOTE_READ |
						       IBV_ACCESS_REMOTE_WRITE);

			if (!mr || ibv_dereg_mr(mr) != 0)
				die("ibv_reg_mr+ibv_dereg_mr", -errno);
		}
		reg[rep] = per_op_ns(t0, GRANTS);
		t0 = bench_now_ns();
		for (int i = 0; i < WRITES; i++)
			if ((r = mrd_dma(c, MRD_DMA_WRITE, src_k.lkey, src, big_rkey, dst, BIG)) < 0)
				die("WRITE through the window", r);
		win_w[rep] = per_op_ns(t0, WRITES);
		t0 = bench_now_ns();
		for (int i = 0; i < WRITES; i++)
			if ((r = mrd_dma(c, MRD_DMA_WRITE, src_k.lkey, src, dst_k.rkey, dst, BIG)) < 0)
				die("WRITE through the MR's rkey", r);
		mr_w[rep] = per_op_ns(t0, WRITES);
		ratio[0][rep] = grant[rep] / reg[rep];
		ratio[1][rep] = mr_w[rep] / win_w[rep];
		ratio[2][rep] = own_grant[rep] / reg[rep];
	}
	if (memcmp(dst, src, BIG) != 0) {
		fprintf(stderr, "bench-windows-verbs: the WRITEs did not land\n");
		return EXIT_FAILURE;
	}
	printf("Memory windows on %s through mrd (reps=%d, interleaved; %d grants, %d WRITEs of "
	       "%u KiB per rep and side)\n", argv[2], REPS, GRANTS, WRITES, BIG >> 10);
	bench_print_doubles("  grant+revoke of 4 KiB ns", grant, REPS);
	bench_print_doubles("  grant+revoke of 4 KiB on the program's own QP ns", own_grant, REPS);
	bench_print_doubles("  ibv_reg_mr+ibv_dereg_mr of 4 KiB ns", reg, REPS);
	bench_print_doubles("  WRITE by the window's rkey ns", win_w, REPS);
	bench_print_doubles("  WRITE by the MR's rkey ns", mr_w, REPS);
	printf("window-4k-vs-ibv-reg: ratio=%.3f (case=mrd_window_grant+mrd_window_revoke of 4 KiB "
	       "baseline=ibv_reg_mr+ibv_dereg_mr of 4 KiB on %s reps=%d)\n",
	       bench_median(ratio[0], REPS), argv[2], REPS);
	printf("window-own-qp-4k-vs-ibv-reg: ratio=%.3f (case=mrd_window_grant+mrd_window_revoke "
	       "of 4 KiB on the program's own QP, client PD; baseline=ibv_reg_mr+ibv_dereg_mr of 4 "
	       "KiB on %s reps=%d)\n", bench_median(ratio[2], REPS), argv[2], REPS);
	printf("window-write-vs-mr-write: ratio=%.3f (time by the MR's rkey / time by the window's: "
	       "mrd_dma WRITE of %u KiB reps=%d)\n", bench_median(ratio[1], REPS), BIG >> 10, REPS);
	bench_add_summary(sum, &n_sum, "window-4k-vs-ibv-reg", bench_median(ratio[0], REPS),
			  ratio[0], REPS, 0.2, true);
	bench_add_summary(sum, &n_sum, "window-own-qp-4k-vs-ibv-reg", bench_median(ratio[2], REPS),
			  ratio[2], REPS, 0.2, true);
	bench_add_summary(sum, &n_sum, "window-write-vs-mr-write", bench_median(ratio[1], REPS),
			  ratio[1], REPS, 0.95, false);
	bench_print_summary(sum, n_sum);
	(void)mrd_window_revoke(c, NULL, big_rkey);
	mrd_client_close(bound); /* its windows go with it, before the QPs and the PD */
	ibv_destroy_qp(qp[0]);
	ibv_destroy_qp(qp[1]);
	ibv_destroy_cq(cq);
	mrd_client_close(c);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return 0;
}
