/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "log.h"
#include "macro.h"
#include "time-util.h"
#include "provider/verbs-loopback.h"

/* Each part gets this long to complete: ample for a device, and for rxe under emulation. */
#define PART_TIMEOUT_USEC (10 * USEC_PER_SEC)

/* A connected pair. One that windows are bound on is not destroyed while they are: rxe's
 * window holds its QP (rxe_mw.c rxe_do_bind_mw: rxe_get(qp)), and a QP destroyed under it
 * is freed after a timeout all the same (rxe_pool.c __rxe_cleanup), to be put again by the
 * window's invalidate or dealloc. Replaced, it is kept on the retired list until its last
 * window lets go of it. */
struct verbs_loopback_pair {
	struct ibv_qp *qp[2];
	unsigned windows; /* bound on qp[1] */
	bool retired;
	struct verbs_loopback_pair *next; /* on the retired list */
};

struct verbs_loopback {
	struct ibv_pd *pd;
	struct ibv_cq *cq;  /* transfers: qp[0]'s sends (and both QPs' receives, never posted) */
	struct ibv_cq *wcq; /* windows: qp[1]'s sends, so a bind never waits behind a transfer */
	struct ibv_qp *qp[2]; /* [0] posts, [1] answers: lb->pair's, or NULL */
	struct verbs_loopback_pair *pair;
	struct verbs_loopback_pair *retired;
	/* Held while the pairs change after verbs_loopback_new (the owner's event lock: an
	 * event's element is compared against them, verbs_loopback_owns); NULL: none. */
	pthread_mutex_t *elements_lock;
	uint8_t port;
	enum ibv_mtu mtu;
	uint32_t max_msg;
	struct ibv_ah_attr ah; /* the port's own address */
	uint64_t wr_id;        /* of the last part posted */
	uint64_t win_wr_id;    /* of the last window work request posted */
	unsigned generation;   /* pairs made or mended so far */
	/* QPs that reported failures since the pair was made or mended: bit i for qp[i] (atomic:
	 * window ops set bit 1 under the window lock, the Dma thread settles without it). Each
	 * enters the error state on the device's own time (verbs_loopback_settle). */
	unsigned failed;
	uint32_t psn[2];       /* each QP's starting send PSN, random: not guessable off the wire */
};


/* The port's own GID for RoCE: a RoCEv2 IPv4-mapped entry routes on any netdev rxe sits on,
 * loopback included; else any RoCEv2 entry; else the first valid one. */
/* Only InfiniBand and RoCE (IBV_TRANSPORT_IB) connect an RC QP by modify_qp with an address:
 * what verbs_loopback_new does. An iWARP QP reaches RTS only over a TCP connection that the
 * iWARP CM (rdma_cm) hands its driver: siw's modify_qp takes a state and access flags alone,
 * and refuses RTS without that socket (Linux siw_verbs.c siw_verbs_modify_qp, siw_qp.c
 * siw_qp_nextstate_from_idle: "no socket"). libibverbs makes every RNIC IBV_TRANSPORT_IWARP
 * (rdma-core libibverbs/init.c). usNIC and the unspecified kinds (EFA) have no RC QP. */
const char *verbs_loopback_unsupported(enum ibv_node_type node, enum ibv_transport_type transport)
{
	if (node == IBV_NODE_RNIC || transport == IBV_TRANSPORT_IWARP)
		return "iWARP: its RC QPs connect only over a TCP connection made by rdma_cm, "
		       "never on loopback by modify_qp";
	if (transport != IBV_TRANSPORT_IB)
		return "not InfiniBand or RoCE: no RC QP to loop back through";
	return NULL;
}

static int pick_gid(struct ibv_context *ctx, uint8_t port, int tbl_len, struct ibv_ah_attr *ah)
{
	int best = -1, best_rank = 0;
	struct ibv_gid_entry e, chosen;

	for (int i = 0; i < tbl_len; i++) {
		int rank;

		if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0) != 0)
			continue; /* an empty entry */
		rank = 1;
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2) {
			static const uint8_t v4_mapped[12] = { [10] = 0xff, [11] = 0xff };

			rank = memcmp(e.gid.raw, v4_mapped, sizeof(v4_mapped)) == 0 ? 3 : 2;
		}
		if (rank > best_rank) {
			best = i, best_rank = rank;
			chosen = e;
		}
	}
	if (best < 0)
		return -EADDRNOTAVAIL;
	ah->is_global = 1;
	ah->grh.dgid = chosen.gid;
	ah->grh.sgid_index = (uint8_t)best;
	ah->grh.hop_limit = 1;
	return 0;
}

static int pick_port(struct ibv_context *ctx, struct verbs_loopback *lb)
{
	struct ibv_device_attr dev;
	int r;

	r = ibv_query_device(ctx, &dev);
	if (r)
		return -r;
	for (unsigned port = 1; port <= dev.phys_port_cnt; port++) {
		struct ibv_port_attr pa;

		if (ibv_query_port(ctx, (uint8_t)port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
			continue;
		lb->port = (uint8_t)port;
		lb->mtu = pa.active_mtu;
		lb->max_msg = pa.max_msg_sz ? pa.max_msg_sz : 1u << 20;
		memset(&lb->ah, 0, sizeof(lb->ah));
		lb->ah.port_num = port;
		if (pa.link_layer == IBV_LINK_LAYER_ETHERNET)
			return pick_gid(ctx, (uint8_t)port, pa.gid_tbl_len, &lb->ah);
		lb->ah.dlid = pa.lid;
		return 0;
	}
	return -ENETDOWN;
}

/* RESET -> INIT -> RTR -> RTS, aimed at the other QP of the pair. Only the answering QP
 * takes remote access. */
static int connect_qp(struct verbs_loopback *lb, int i)
{
	struct ibv_qp *qp = lb->qp[i];
	uint32_t peer_qpn = lb->qp[!i]->qp_num;
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RESET,
	};
	int r;

	r = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	if (r)
		return -r;
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_INIT,
		.port_num = lb->port,
		.qp_access_flags = i == 1 ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ : 0,
	};
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS);
	if (r)
		return -r;
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR,
		.path_mtu = lb->mtu,
		.dest_qp_num = peer_qpn,
		.rq_psn = lb->psn[!i],
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = lb->ah,
	};
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					  IBV_QP_MIN_RNR_TIMER);
	if (r)
		return -r;
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTS,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.sq_psn = lb->psn[i],
		.max_rd_atomic = 1,
	};
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	return -r;
}

static void pair_free(struct verbs_loopback_pair *pair)
{
	for (int i = 0; i < 2; i++)
		if (pair->qp[i])
			(void)ibv_destroy_qp(pair->qp[i]);
	free(pair);
}

/* The current pair goes: destroyed, or retired while windows are bound on it. */
static void drop_qps(struct verbs_loopback *lb)
{
	struct verbs_loopback_pair *pair = lb->pair;
	struct ibv_wc wc;

	lb->pair = NULL;
	lb->qp[0] = lb->qp[1] = NULL;
	if (pair && pair->windows > 0) {
		pair->retired = true;
		pair->next = lb->retired;
		lb->retired = pair;
	} else if (pair)
		pair_free(pair);
	while (ibv_poll_cq(lb->cq, 1, &wc) > 0)
		; /* what they left behind */
	while (lb->wcq && ibv_poll_cq(lb->wcq, 1, &wc) > 0)
		;
}

static void elements_lock(struct verbs_loopback *lb)
{
	if (lb->elements_lock)
		pthread_mutex_lock(lb->elements_lock);
}

static void elements_unlock(struct verbs_loopback *lb)
{
	if (lb->elements_lock)
		pthread_mutex_unlock(lb->elements_lock);
}

/* A window bound on pair lets go of it (invalidated or deallocated): a retired pair goes with
 * its last. */
static void pair_unbind(struct verbs_loopback *lb, struct verbs_loopback_pair *pair)
{
	struct verbs_loopback_pair **at = &lb->retired;

	if (--pair->windows > 0 || !pair->retired)
		return;
	elements_lock(lb);
	while (*at != pair)
		at = &(*at)->next;
	*at = pair->next;
	pair_free(pair);
	elements_unlock(lb);
}

/* A fresh pair, connected. After a failure the old pair is not reset but replaced: a QP moves
 * to the error state on the device's own time, and might do so after a reset. */
static int make_qps(struct verbs_loopback *lb)
{
	int r = 0;

	drop_qps(lb);
	__atomic_store_n(&lb->failed, 0, __ATOMIC_RELAXED);
	lb->pair = calloc(1, sizeof(*lb->pair));
	if (!lb->pair)
		return -ENOMEM;
	for (int i = 0; i < 2 && r == 0; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = i == 1 ? lb->wcq : lb->cq,
			.recv_cq = lb->cq,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = 1,
		};

		lb->qp[i] = lb->pair->qp[i] = ibv_create_qp(lb->pd, &init);
		if (!lb->qp[i])
			r = negative_errno();
	}
	if (r == 0 && getrandom(lb->psn, sizeof(lb->psn), 0) != sizeof(lb->psn))
		r = -EIO;
	lb->psn[0] &= 0xffffff, lb->psn[1] &= 0xffffff; /* PSNs are 24 bits */
	if (r == 0)
		r = connect_qp(lb, 0);
	if (r == 0)
		r = connect_qp(lb, 1);
	if (r < 0)
		drop_qps(lb);
	lb->generation++;
	return r;
}

int verbs_loopback_replace(struct verbs_loopback *lb)
{
	int r;

	elements_lock(lb);
	r = make_qps(lb);
	elements_unlock(lb);
	if (r < 0)
		log_debug("verbs: new loopback QPs: %s", strerror(-r));
	return r;
}

/* How long a QP that reported a failure gets to reach the error state: rxe takes
 * microseconds; past it the pair is replaced rather than reset under a late transition. */
#define SETTLE_USEC (100 * 1000)

/* Waits for qp to reach the error state, SETTLE_USEC at most: 0, or -ETIMEDOUT. */
static int await_error_state(struct ibv_qp *qp)
{
	uint64_t deadline = now_usec(CLOCK_MONOTONIC) + SETTLE_USEC;
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr a;

	for (;;) {
		if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init) == 0 && a.qp_state == IBV_QPS_ERR)
			return 0;
		if (now_usec(CLOCK_MONOTONIC) > deadline)
			return -ETIMEDOUT;
		(void)nanosleep(&(struct timespec){ .tv_nsec = 50000 }, NULL);
	}
}

int verbs_loopback_settle(struct verbs_loopback *lb)
{
	for (int i = 0; i < 2; i++)
		if (lb->pair && (__atomic_load_n(&lb->failed, __ATOMIC_RELAXED) & (1u << i))) {
			int r = await_error_state(lb->qp[i]);

			if (r < 0)
				return r;
			__atomic_and_fetch(&lb->failed, ~(1u << i), __ATOMIC_RELAXED);
		}
	return 0;
}

int verbs_loopback_mend(struct verbs_loopback *lb)
{
	struct ibv_wc wc;
	int r;

	if (!lb->pair || lb->pair->windows == 0)
		return verbs_loopback_replace(lb);
	/* A reset under an error transition still to come would leave the pair broken. */
	r = verbs_loopback_settle(lb);
	if (r == 0 && getrandom(lb->psn, sizeof(lb->psn), 0) != sizeof(lb->psn))
		r = -EIO;
	lb->psn[0] &= 0xffffff, lb->psn[1] &= 0xffffff; /* fresh: nothing old in flight matches */
	if (r == 0)
		r = connect_qp(lb, 0);
	if (r == 0)
		r = connect_qp(lb, 1);
	if (r < 0) {
		log_debug("verbs: loopback QPs reset and connected again: %s; replaced",
			  strerror(-r));
		return verbs_loopback_replace(lb);
	}
	while (ibv_poll_cq(lb->cq, 1, &wc) > 0)
		; /* what the failure flushed */
	while (ibv_poll_cq(lb->wcq, 1, &wc) > 0)
		;
	__atomic_store_n(&lb->failed, 0, __ATOMIC_RELAXED);
	lb->generation++;
	return 0;
}

bool verbs_loopback_ready(const struct verbs_loopback *lb)
{
	return lb->pair != NULL;
}

unsigned verbs_loopback_generation(const struct verbs_loopback *lb)
{
	return lb->generation;
}

void verbs_loopback_set_elements_lock(struct verbs_loopback *lb, pthread_mutex_t *lock)
{
	lb->elements_lock = lock;
}

void verbs_loopback_free(struct verbs_loopback *lb)
{
	if (!lb)
		return;
	if (lb->cq) {
		drop_qps(lb);
		while (lb->retired) { /* their windows are gone (verbs-loopback.h) */
			struct verbs_loopback_pair *pair = lb->retired;

			lb->retired = pair->next;
			pair_free(pair);
		}
		(void)ibv_destroy_cq(lb->cq);
	}
	if (lb->wcq)
		(void)ibv_destroy_cq(lb->wcq);
	free(lb);
}

int verbs_loopback_new(struct ibv_pd *pd, struct verbs_loopback **ret)
{
	struct verbs_loopback *lb = calloc(1, sizeof(*lb));
	int r;

	if (!lb)
		return -ENOMEM;
	lb->pd = pd;
	r = pick_port(pd->context, lb);
	if (r < 0)
		goto fail;
	lb->cq = ibv_create_cq(pd->context, 4, NULL, NULL, 0);
	lb->wcq = ibv_create_cq(pd->context, 2, NULL, NULL, 0);
	if (!lb->cq || !lb->wcq) {
		r = negative_errno();
		goto fail;
	}
	r = make_qps(lb);
	if (r < 0)
		goto fail;
	*ret = lb;
	return 0;
fail:
	verbs_loopback_free(lb);
	return r;
}

/* Waits on cq for the completion of wr_id, the work request posted last there. Another one is
 * what a failure left behind (a QP entering the error state flushes late): it is passed over. */
static int await_completion(struct ibv_cq *cq, uint64_t wr_id, struct ibv_wc *wc)
{
	uint64_t deadline = now_usec(CLOCK_MONOTONIC) + PART_TIMEOUT_USEC;
	struct timespec nap = { 0, 1000 };

	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			return -EIO;
		if (n > 0 && wc->wr_id == wr_id)
			return 0;
		if (n > 0)
			continue;
		if (now_usec(CLOCK_MONOTONIC) > deadline)
			return -ETIMEDOUT;
		nanosleep(&nap, NULL);
		if (nap.tv_nsec < 1000000)
			nap.tv_nsec *= 2; /* a device answers in microseconds; emulation in ms */
	}
}

static int wc_error(struct verbs_loopback *lb, const struct ibv_wc *wc)
{
	/* The posting QP goes to the error state after its error completion (rxe_comp.c posts
	 * the completion, then moves the QP); where the answering QP judged the request, it goes
	 * there as well (rxe_resp.c: do_class_ac_error sets goto_error for an RC rkey violation). */
	if (wc->status != IBV_WC_SUCCESS)
		__atomic_or_fetch(&lb->failed, 1u, __ATOMIC_RELAXED);
	if (wc->status == IBV_WC_REM_ACCESS_ERR || wc->status == IBV_WC_REM_INV_REQ_ERR ||
	    wc->status == IBV_WC_REM_OP_ERR)
		__atomic_or_fetch(&lb->failed, 2u, __ATOMIC_RELAXED);
	switch (wc->status) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
		return -EKEYREJECTED;
	case IBV_WC_WR_FLUSH_ERR:
		/* This part is the pair's only work (one at a time): its own error flushed it. rxe
		 * reports a bad local key or range that way (seen on 7.3). */
		return -EKEYREJECTED;
	default:
		log_debug("verbs: loopback transfer failed: %s (%d)", ibv_wc_status_str(wc->status),
			  (int)wc->status);
		return -EIO;
	}
}

int verbs_loopback_transfer(struct verbs_loopback *lb, bool read, uint32_t lkey, uint64_t laddr,
			    uint32_t rkey, uint64_t raddr, uint64_t length)
{
	int r = 0;

	if (laddr + length < laddr || raddr + length < raddr)
		return -EFAULT;
	if (!lb->qp[0])
		return -ENOTCONN; /* the last replacement failed */
	while (length > 0 && r == 0) {
		uint32_t part = length < lb->max_msg ? (uint32_t)length : lb->max_msg;
		struct ibv_sge sge = { .addr = laddr, .length = part, .lkey = lkey };
		struct ibv_send_wr wr = {
			.wr_id = ++lb->wr_id,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
		}, *bad;
		struct ibv_wc wc;

		r = -ibv_post_send(lb->qp[0], &wr, &bad);
		if (r == 0)
			r = await_completion(lb->cq, lb->wr_id, &wc);
		if (r == 0)
			r = wc_error(lb, &wc);
		laddr += part, raddr += part, length -= part;
	}
	return r;
}

bool verbs_loopback_owns(const struct verbs_loopback *lb, const void *element)
{
	if (!lb || !element)
		return false;
	if (element == lb->qp[0] || element == lb->qp[1] || element == lb->cq || element == lb->wcq)
		return true;
	for (const struct verbs_loopback_pair *r = lb->retired; r; r = r->next)
		if (element == r->qp[0] || element == r->qp[1])
			return true;
	return false;
}

/* One work request on the answering QP, awaited on wcq: 0, or -EIO when it failed (the QP is
 * then in the error state) or -ETIMEDOUT. */
static int post_wait(struct verbs_loopback *lb, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	int r;

	wr->wr_id = ++lb->win_wr_id;
	wr->send_flags |= IBV_SEND_SIGNALED;
	r = -ibv_post_send(lb->pair->qp[1], wr, &bad);
	if (r == 0)
		r = await_completion(lb->wcq, lb->win_wr_id, &wc);
	if (r == 0 && wc.status != IBV_WC_SUCCESS) {
		__atomic_or_fetch(&lb->failed, 2u, __ATOMIC_RELAXED); /* the poster: qp[1] */
		log_debug("verbs: loopback %s failed: %s (%d)",
			  wr->opcode == IBV_WR_BIND_MW ? "window bind" : "local invalidate",
			  ibv_wc_status_str(wc.status), (int)wc.status);
		r = -EIO;
	}
	return r;
}

int verbs_loopback_bind(struct verbs_loopback *lb, struct ibv_mw *mw, struct ibv_mr *mr,
			uint64_t addr, uint64_t length, unsigned ibv_access, uint32_t rkey,
			struct verbs_loopback_pair **ret_pair)
{
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_BIND_MW,
		.bind_mw = {
			.mw = mw,
			.rkey = rkey,
			.bind_info = { .mr = mr, .addr = addr, .length = length,
				       .mw_access_flags = ibv_access },
		},
	};
	struct verbs_loopback_pair *pair = lb->pair;
	int r;

	if (!pair)
		return -ENOTCONN; /* the last replacement failed */
	r = post_wait(lb, &wr);
	if (r < 0)
		return r;
	pair->windows++;
	*ret_pair = pair;
	return 0;
}

int verbs_loopback_invalidate(struct verbs_loopback *lb, uint32_t rkey,
			      struct verbs_loopback_pair *pair)
{
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_LOCAL_INV,
		.invalidate_rkey = rkey,
	};
	int r;

	if (!lb->pair)
		return -ENOTCONN; /* the last replacement failed */
	r = post_wait(lb, &wr);
	if (r == 0)
		pair_unbind(lb, pair);
	return r;
}

void verbs_loopback_unbound(struct verbs_loopback *lb, struct verbs_loopback_pair *pair)
{
	pair_unbind(lb, pair);
}

bool verbs_loopback_has_windows(const struct verbs_loopback *lb)
{
	return lb && (lb->retired || (lb->pair && lb->pair->windows > 0));
}
