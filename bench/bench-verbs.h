/* SPDX-License-Identifier: MIT */
/* What the benches that drive a verbs device themselves share (they run in the rxe VM). */
#pragma once

#include <errno.h>
#include <string.h>

#include <infiniband/verbs.h>

/* The device named device, opened; NULL when there is none (the bench then says why and exits
 * 77). */
static inline struct ibv_context *bench_open_verbs(const char *device)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	for (int i = 0; l && l[i] && !ctx; i++)
		if (strcmp(ibv_get_device_name(l[i]), device) == 0)
			ctx = ibv_open_device(l[i]);
	if (l)
		ibv_free_device_list(l);
	return ctx;
}

/* Two RC QPs of pd on port 1, connected to each other through the port's GID gid_index, both
 * sending to cq: what a program's own connection is. 0, or an errno. */
static inline int bench_qp_pair(struct ibv_pd *pd, struct ibv_cq *cq, int gid_index,
				struct ibv_qp *qp[2])
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 256, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	union ibv_gid gid;
	struct ibv_qp_attr a;

	if (ibv_query_gid(pd->context, 1, gid_index, &gid))
		return errno;
	for (int i = 0; i < 2; i++)
		if (!(qp[i] = ibv_create_qp(pd, &init)))
			return errno;
	for (int i = 0; i < 2; i++) {
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1,
					  .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
							     IBV_ACCESS_REMOTE_READ };
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						     IBV_QP_ACCESS_FLAGS))
			return errno;
		a = (struct ibv_qp_attr){
			.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
			.dest_qp_num = qp[1 - i]->qp_num, .rq_psn = 1, .max_dest_rd_atomic = 1,
			.min_rnr_timer = 12,
			.ah_attr = { .is_global = 1, .port_num = 1,
				     .grh = { .dgid = gid, .sgid_index = (uint8_t)gid_index,
					      .hop_limit = 1 } },
		};
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
			return errno;
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
					  .rnr_retry = 7, .sq_psn = 1, .max_rd_atomic = 1 };
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						     IBV_QP_MAX_QP_RD_ATOMIC))
			return errno;
	}
	return 0;
}
