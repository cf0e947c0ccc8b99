/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "preload/window-binder.h"

/* A bind's completion gets this long: rxe completes it in the post's own system call, a
 * device in microseconds; past it the QP is taken for broken. */
#define COMPLETION_NSEC (10ull * 1000 * 1000 * 1000)

struct pooled {
	struct ibv_mw *mw;
	unsigned binds; /* since it was allocated */
};

struct window_binder {
	const struct binder_verbs *v;
	struct binder_tracking t;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int error;         /* the QP failed: no more binds until it is made anew */
	unsigned remakes;  /* of the QP, after failures: BINDER_REMAKES at most */
	/* Allocated windows: pool[0, n_pooled) unbound and ready, then the bound ones up to
	 * n_windows; the binds of each ride along. */
	struct pooled *windows;
	unsigned n_pooled, n_windows, cap;
	struct ibv_mw **retired; /* a ring of BINDER_RETIRED, oldest at retired_head */
	unsigned retired_head, n_retired;
};

/* libibverbs' struct verbs_mr, and room behind it: a bind names its MR by lkey (librxe's
 * convert_send_wr), and mlx5_bind_mw reads the MR's type and its driver's allocation flags
 * behind it (rdma-core providers/mlx5/qp.c), which must read as a plain MR's. */
struct named_mr {
	struct ibv_mr ibv;
	int mr_type; /* IBV_MR_TYPE_MR */
	int access;
	uint64_t zero[8];
};

static uint64_t now_nsec(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The port and address the QP connects to: the first active port, its own LID, or its own
 * GID (an IPv4-mapped one where there is one: it routes on any netdev). */
static int pick_address(struct window_binder *b, struct ibv_ah_attr *ah, enum ibv_mtu *mtu,
			uint8_t *port_num, char *why, size_t why_size)
{
	struct ibv_context *ctx = b->pd->context;
	struct ibv_device_attr dev;
	int r = b->v->query_device(ctx, &dev);

	if (r) {
		snprintf(why, why_size, "ibv_query_device: %s", strerror(r));
		return -r;
	}
	if (!(dev.device_cap_flags & IBV_DEVICE_MEM_WINDOW) || dev.max_mw <= 0) {
		snprintf(why, why_size, "%s has no type-1 memory windows", ctx->device->name);
		return -EOPNOTSUPP;
	}
	/* mrd gives its MRs the right to take windows where the device has type-2 ones
	 * (provider-verbs.c window_caps): without it every bind would fail. */
	if (!(dev.device_cap_flags &
	      (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B))) {
		snprintf(why, why_size, "%s has no type-2 memory windows, where mrd's MRs take "
			 "windows", ctx->device->name);
		return -EOPNOTSUPP;
	}
	for (unsigned port = 1; port <= dev.phys_port_cnt; port++) {
		struct ibv_port_attr pa = { 0 };
		int best = -1;

		if (b->v->query_port(ctx, (uint8_t)port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
			continue;
		*port_num = (uint8_t)port;
		*mtu = pa.active_mtu;
		*ah = (struct ibv_ah_attr){ .port_num = (uint8_t)port, .dlid = pa.lid };
		if (pa.link_layer != IBV_LINK_LAYER_ETHERNET)
			return 0;
		for (int i = 0; i < pa.gid_tbl_len; i++) {
			static const uint8_t v4_mapped[12] = { [10] = 0xff, [11] = 0xff };
			static const union ibv_gid zero;
			union ibv_gid g;

			if (b->v->query_gid(ctx, (uint8_t)port, i, &g) != 0 ||
			    memcmp(&g, &zero, sizeof(g)) == 0)
				continue;
			if (best < 0 || memcmp(g.raw, v4_mapped, sizeof(v4_mapped)) == 0) {
				best = i;
				ah->grh.dgid = g;
			}
			if (memcmp(g.raw, v4_mapped, sizeof(v4_mapped)) == 0)
				break;
		}
		if (best < 0)
			continue;
		ah->is_global = 1;
		ah->grh.sgid_index = (uint8_t)best;
		ah->grh.hop_limit = 1;
		return 0;
	}
	snprintf(why, why_size, "%s has no active port with an address", ctx->device->name);
	return -ENETDOWN;
}

/* The QP through INIT, RTR and RTS, connected to itself. */
static int connect_self(struct window_binder *b, char *why, size_t why_size)
{
	struct ibv_qp_attr a = { 0 };
	enum ibv_mtu mtu = IBV_MTU_1024;
	uint8_t port = 1;
	int r = pick_address(b, &a.ah_attr, &mtu, &port, why, why_size);
	struct ibv_ah_attr ah = a.ah_attr;

	if (r < 0)
		return r;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = port };
	r = b->v->modify_qp(b->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS);
	if (r == 0) {
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = mtu,
					  .dest_qp_num = b->qp->qp_num, .max_dest_rd_atomic = 1,
					  .min_rnr_timer = 12, .ah_attr = ah };
		r = b->v->modify_qp(b->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						       IBV_QP_MAX_DEST_RD_ATOMIC |
						       IBV_QP_MIN_RNR_TIMER);
	}
	if (r == 0) {
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
					  .rnr_retry = 7, .max_rd_atomic = 1 };
		r = b->v->modify_qp(b->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						       IBV_QP_MAX_QP_RD_ATOMIC);
	}
	if (r) {
		/* iWARP among others: its RC QPs connect only through rdma_cm. */
		snprintf(why, why_size, "its QP cannot connect to itself (ibv_modify_qp: %s)",
			 strerror(r));
		return -EOPNOTSUPP;
	}
	return 0;
}

static void drop_qp(struct window_binder *b)
{
	if (b->qp)
		(void)b->v->destroy_qp(b->qp);
	if (b->cq)
		(void)b->v->destroy_cq(b->cq);
	b->qp = NULL;
	b->cq = NULL;
}

/* A CQ and a QP connected to itself, in place of any before (a type-1 window holds no QP:
 * the bound ones stay bound). */
static int make_qp(struct window_binder *b, char *why, size_t why_size)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 2, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	int r;

	drop_qp(b);
	b->cq = b->v->create_cq(b->pd->context, 4, NULL, NULL, 0);
	if (b->cq) {
		init.send_cq = init.recv_cq = b->cq;
		b->qp = b->v->create_qp(b->pd, &init);
	}
	if (!b->cq || !b->qp) {
		r = errno > 0 ? -errno : -EIO;
		snprintf(why, why_size, "a QP to bind windows on: %s", strerror(-r));
	} else
		r = connect_self(b, why, why_size);
	if (r < 0)
		drop_qp(b);
	return r;
}

int window_binder_new(const struct binder_verbs *v, const struct binder_tracking *t,
		      struct ibv_pd *pd, struct window_binder **ret, char *why, size_t why_size)
{
	struct window_binder *b = calloc(1, sizeof(*b));
	int r;

	if (!b)
		return -ENOMEM;
	b->v = v;
	b->t = *t;
	b->pd = pd;
	r = make_qp(b, why, why_size);
	if (r < 0) {
		window_binder_free(b);
		return r;
	}
	*ret = b;
	return 0;
}

/* Whether b can bind: after a failure its QP is made anew, BINDER_REMAKES times at most (a
 * failure that comes back every time must not cost a QP per registration). */
static int usable(struct window_binder *b)
{
	char why[128];

	if (b->error && b->remakes < BINDER_REMAKES) {
		b->remakes++;
		if (make_qp(b, why, sizeof(why)) == 0)
			b->error = 0;
	}
	return b->error;
}

/* Posts a bind of mw (length 0: an unbind) and waits for its completion. */
static int bind(struct window_binder *b, struct ibv_mw *mw, uint32_t lkey, void *addr,
		size_t length, unsigned access)
{
	struct named_mr mr = { .ibv = { .context = b->pd->context, .pd = b->pd, .lkey = lkey },
			       .mr_type = 0 /* IBV_MR_TYPE_MR */ };
	struct ibv_mw_bind wr = {
		.wr_id = (uintptr_t)mw,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = &mr.ibv, .addr = length ? (uintptr_t)addr : 0,
			       .length = length, .mw_access_flags = access },
	};
	uint64_t deadline = 0;
	struct ibv_wc wc;
	int r, n;

	if (usable(b) < 0)
		return b->error;
	/* librxe's bind_mw reads the MR's lkey even for an unbind: it names one always. */
	r = ibv_bind_mw(b->qp, mw, &wr);
	if (r)
		return -r;
	/* Where the device completes the bind on a kernel worker (rxe's requester task may run
	 * there, rxe_task.c), yield to it: a sleep's timer slack would cost more than the bind. */
	for (unsigned spin = 0;; spin++) {
		n = ibv_poll_cq(b->cq, 1, &wc);
		if (n != 0)
			break;
		if (spin < 100)
			continue;
		if (!deadline)
			deadline = now_nsec() + COMPLETION_NSEC;
		else if (now_nsec() > deadline) {
			n = -1;
			break;
		}
		(void)sched_yield();
	}
	if (n < 0)
		b->error = -ETIMEDOUT;
	else if (wc.status != IBV_WC_SUCCESS)
		b->error = -EREMOTEIO; /* the QP is in the error state now: it binds no more */
	return b->error;
}

/* A tracked window deallocated (as it was: its dealloc failed, 1), then untracked: mrd's record
 * names no window the program may have allocated since under its handle, and a window whose
 * dealloc failed (still bound, maybe) stays tracked. */
static int dealloc(struct window_binder *b, struct ibv_mw *mw)
{
	uint32_t handle = mw->handle;
	int k = ibv_dealloc_mw(mw);

	if (k)
		return -k;
	(void)b->t.untrack(b->t.data, handle);
	return 0;
}

int window_binder_bind(struct window_binder *b, uint32_t lkey, void *addr, size_t length,
		       unsigned access, struct ibv_mw **ret, char *why, size_t why_size)
{
	struct pooled w;
	int r;

	if (usable(b) < 0) {
		snprintf(why, why_size, "its QP failed: %s", strerror(-b->error));
		return b->error;
	}
	if (b->n_windows == b->cap) {
		unsigned cap = b->cap ? 2 * b->cap : 16;
		struct pooled *more = realloc(b->windows, cap * sizeof(*more));

		if (!more)
			return -ENOMEM;
		b->windows = more;
		b->cap = cap;
	}
	if (b->n_pooled > 0) {
		w = b->windows[--b->n_pooled]; /* the newest: the others stay as they lie */
		b->windows[b->n_pooled] = b->windows[--b->n_windows];
	} else {
		w = (struct pooled){ ibv_alloc_mw(b->pd, IBV_MW_TYPE_1), 0 };
		if (!w.mw) {
			r = errno > 0 ? -errno : -ENOMEM;
			snprintf(why, why_size, "ibv_alloc_mw: %s", strerror(-r));
			return r;
		}
		r = b->t.track(b->t.data, w.mw->handle);
		if (r < 0) {
			(void)ibv_dealloc_mw(w.mw);
			snprintf(why, why_size, "mrd does not track the window: %s", strerror(-r));
			return r;
		}
	}
	r = bind(b, w.mw, lkey, addr, length,
		 access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_ATOMIC));
	if (r < 0) {
		/* Whatever became of it, its key must not live on. */
		dealloc(b, w.mw);
		snprintf(why, why_size, "the window's bind failed: %s", strerror(-r));
		return r;
	}
	w.binds++;
	b->windows[b->n_windows++] = w;
	*ret = w.mw;
	return 0;
}

/* mw, unbound for good: kept allocated so its index keeps its keys from the device. Untracked
 * (unbound is all mrd's record is for) unless its unbind failed: then it may be bound still, and
 * stays tracked until it is deallocated. */
static void retire(struct window_binder *b, struct ibv_mw *mw, bool unbound)
{
	if (unbound)
		(void)b->t.untrack(b->t.data, mw->handle);
	if (b->n_retired == BINDER_RETIRED) {
		(void)dealloc(b, b->retired[b->retired_head]);
		b->retired[b->retired_head] = mw;
		b->retired_head = (b->retired_head + 1) % BINDER_RETIRED;
		return;
	}
	if (!b->retired && !(b->retired = calloc(BINDER_RETIRED, sizeof(*b->retired)))) {
		(void)dealloc(b, mw);
		return;
	}
	b->retired[(b->retired_head + b->n_retired++) % BINDER_RETIRED] = mw;
}

int window_binder_unbind(struct window_binder *b, struct ibv_mw *mw)
{
	unsigned i;
	struct pooled w;
	int r;

	for (i = b->n_pooled; i < b->n_windows && b->windows[i].mw != mw; i++)
		;
	if (i == b->n_windows)
		return -ENOENT;
	w = b->windows[i];
	b->windows[i] = b->windows[--b->n_windows];
	r = bind(b, mw, 0, NULL, 0, 0);
	if (r < 0) {
		/* The kernel kills a deallocated window's key before it returns; one it kept
		 * stays on the retired ring, for window_binder_free to try again. */
		int k = dealloc(b, mw);

		if (k)
			retire(b, mw, false);
		return k ? k : r;
	}
	if (++w.binds >= BINDER_BINDS) {
		retire(b, mw, true);
		return 0;
	}
	/* Bound ones move up: the pool ends where they start. */
	b->windows[b->n_windows] = b->windows[b->n_pooled];
	b->windows[b->n_pooled++] = w;
	b->n_windows++;
	return 0;
}

void window_binder_counts(const struct window_binder *b, unsigned *bound, unsigned *pooled,
			  unsigned *retired)
{
	*bound = b->n_windows - b->n_pooled;
	*pooled = b->n_pooled;
	*retired = b->n_retired;
}

void window_binder_free(struct window_binder *b)
{
	if (!b)
		return;
	for (unsigned i = 0; i < b->n_windows; i++)
		(void)dealloc(b, b->windows[i].mw);
	for (unsigned i = 0; i < b->n_retired; i++)
		(void)dealloc(b, b->retired[(b->retired_head + i) % BINDER_RETIRED]);
	drop_qp(b);
	free(b->windows);
	free(b->retired);
	free(b);
}
