/* SPDX-License-Identifier: MIT */
/* libmrd-preload.so's window binder (preload/window-binder.c) against a fake verbs device that
 * models type-1 windows as rxe does (Linux rxe_mw.c): a bind names the window's current rkey
 * and carries the next key byte; a bind of length 0 unbinds; a peer's access through a window
 * needs its current rkey, a length and the address inside it (rxe_lookup_mw); a failed bind
 * completes in error and leaves the QP in the error state. The real device runs preload-check
 * in the rxe VM; this checks the bookkeeping on the host: every old rkey refused, no rkey
 * twice, windows retired and pooled, and what happens after a failure. */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload/window-binder.h"

static int failures;

#define CHECK(cond, ...)                                                                     \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			failures++;                                                          \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
			printf(__VA_ARGS__);                                                 \
			printf("\n");                                                        \
		}                                                                            \
	} while (0)

/* ---- the fake device ---- */
#define MAX_MW 4096
struct fmw {
	struct ibv_mw mw;
	bool live;
	uint32_t key; /* the device's current rkey */
	uint64_t addr, len;
	unsigned binds;
};
static struct fmw mws[MAX_MW];
static int n_mws, n_live;
static int n_alloc, n_dealloc;
static bool qp_error, fail_next_bind, device_has_mw = true, device_has_type2 = true;
static bool qp_loops = true, binds_fail, deallocs_fail;
static int n_qps, n_cqs, n_qps_made;
static struct ibv_wc pending[8];
static int n_pending;

/* mrd's record of the connection's windows (WindowTrack): a window may be bound only while
 * tracked; track_fail makes the next track fail so. */
static bool tracked[MAX_MW];
static int track_fail, n_bound_untracked;

static int f_track(void *data, uint32_t handle)
{
	(void)data;
	assert(handle < MAX_MW);
	if (track_fail) {
		int r = track_fail;

		track_fail = 0;
		return r;
	}
	tracked[handle] = true;
	return 0;
}

static int f_untrack(void *data, uint32_t handle)
{
	(void)data;
	assert(handle < MAX_MW);
	if (!tracked[handle])
		return -ENOENT;
	tracked[handle] = false;
	return 0;
}

static const struct binder_tracking tracking = { f_track, f_untrack, NULL };

static int n_tracked(void)
{
	int n = 0;

	for (int i = 0; i < MAX_MW; i++)
		n += tracked[i];
	return n;
}

static struct ibv_mw *f_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct fmw *m;

	if (n_mws == MAX_MW) {
		errno = ENOMEM;
		return NULL;
	}
	m = &mws[n_mws];
	memset(m, 0, sizeof(*m));
	m->mw.context = pd->context;
	m->mw.pd = pd;
	m->mw.type = type;
	m->mw.handle = (uint32_t)n_mws;
	m->key = m->mw.rkey = ((uint32_t)n_mws << 8) | 0x37;
	m->live = true;
	n_mws++;
	n_live++;
	n_alloc++;
	return &m->mw;
}

static int f_dealloc_mw(struct ibv_mw *mw)
{
	struct fmw *m = &mws[mw->handle];

	assert(m->live);
	if (deallocs_fail)
		return ENOMEM;
	m->live = false;
	n_live--;
	n_dealloc++;
	return 0;
}

/* As librxe's rxe_bind_mw: the key byte advances at the post, the device checks it. */
static int f_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
	struct fmw *m = &mws[mw->handle];
	uint32_t next = ibv_inc_rkey(mw->rkey);
	struct ibv_wc wc = { .wr_id = b->wr_id, .status = IBV_WC_SUCCESS,
			     .opcode = IBV_WC_BIND_MW };

	(void)qp;
	assert(b->bind_info.mr && b->bind_info.mr->pd == mw->pd); /* librxe reads mr->lkey */
	assert(m->live);
	n_bound_untracked += b->bind_info.length > 0 && !tracked[mw->handle];
	if (qp_error)
		wc.status = IBV_WC_WR_FLUSH_ERR;
	else if (fail_next_bind || binds_fail || mw->rkey != m->key || mw->type != IBV_MW_TYPE_1) {
		fail_next_bind = false;
		wc.status = IBV_WC_MW_BIND_ERR;
		qp_error = true;
	} else {
		m->key = next;
		m->addr = b->bind_info.addr;
		m->len = b->bind_info.length;
		m->binds++;
	}
	mw->rkey = next;
	pending[n_pending++] = wc;
	return 0;
}

static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	(void)cq, (void)n;
	if (n_pending == 0)
		return 0;
	*wc = pending[0];
	memmove(pending, pending + 1, (size_t)--n_pending * sizeof(*pending));
	return 1;
}

/* Whether a peer's access through rkey reaches addr (rxe_lookup_mw, then the range). */
static bool reaches(uint32_t rkey, uint64_t addr)
{
	struct fmw *m;

	if ((rkey >> 8) >= (uint32_t)n_mws)
		return false;
	m = &mws[rkey >> 8];
	return m->live && m->key == rkey && m->len > 0 && addr >= m->addr &&
	       addr < m->addr + m->len;
}

static int f_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	(void)ctx;
	memset(a, 0, sizeof(*a));
	a->phys_port_cnt = 1;
	a->max_mw = device_has_mw ? MAX_MW : 0;
	a->device_cap_flags = device_has_mw ? IBV_DEVICE_MEM_WINDOW : 0;
	if (device_has_type2)
		a->device_cap_flags |= IBV_DEVICE_MEM_WINDOW_TYPE_2B;
	return 0;
}

static int f_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
	(void)ctx, (void)port;
	a->state = IBV_PORT_ACTIVE;
	a->active_mtu = IBV_MTU_1024;
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
	a->gid_tbl_len = 2;
	return 0;
}

static int f_query_gid(struct ibv_context *ctx, uint8_t port, int i, union ibv_gid *g)
{
	(void)ctx, (void)port;
	memset(g, 0, sizeof(*g));
	g->raw[15] = (uint8_t)(i + 1);
	return 0;
}

static struct ibv_cq the_cq;
static struct ibv_qp the_qp;

static struct ibv_cq *f_create_cq(struct ibv_context *ctx, int n, void *c,
				  struct ibv_comp_channel *ch, int v)
{
	(void)n, (void)c, (void)ch, (void)v;
	n_cqs++;
	the_cq.context = ctx;
	return &the_cq;
}

static int f_destroy_cq(struct ibv_cq *cq)
{
	(void)cq;
	n_cqs--;
	return 0;
}

static struct ibv_qp *f_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	assert(init->qp_type == IBV_QPT_RC && init->sq_sig_all);
	n_qps++;
	n_qps_made++;
	qp_error = false; /* a new QP */
	the_qp.context = pd->context;
	the_qp.pd = pd;
	the_qp.qp_num = 0x11;
	return &the_qp;
}

static int f_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	(void)mask;
	if (a->qp_state == IBV_QPS_RTR) {
		assert(a->dest_qp_num == qp->qp_num); /* connected to itself */
		if (!qp_loops)
			return EINVAL;
	}
	return 0;
}

static int f_destroy_qp(struct ibv_qp *qp)
{
	(void)qp;
	n_qps--;
	return 0;
}

static const struct binder_verbs verbs = {
	f_query_device, f_query_port, f_query_gid, f_create_cq, f_destroy_cq,
	f_create_qp,    f_modify_qp,  f_destroy_qp,
};

static struct ibv_device device = { .name = "fake0" };
static struct ibv_context ctx = { .device = &device };
static struct ibv_pd pd = { .context = &ctx };

static void reset(void)
{
	n_mws = n_live = n_alloc = n_dealloc = n_pending = n_qps_made = 0;
	qp_error = fail_next_bind = binds_fail = deallocs_fail = false;
	device_has_mw = device_has_type2 = qp_loops = true;
	memset(tracked, 0, sizeof(tracked));
	track_fail = n_bound_untracked = 0;
}

static struct window_binder *binder(void)
{
	struct window_binder *b = NULL;
	char why[256] = "";
	int k = window_binder_new(&verbs, &tracking, &pd, &b, why, sizeof(why));

	CHECK(k == 0, "window_binder_new: %d (%s)", k, why);
	return b;
}

#define RW (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define BUF 0x10000ull

/* A window reaches its bytes alone; its unbind kills its rkey before it returns; the window
 * goes back to the pool, bound again under a new rkey. */
static void t_bind_unbind(void)
{
	struct window_binder *b = binder();
	struct ibv_mw *mw, *again;
	unsigned bound, pooled, retired;
	uint32_t rkey;
	char why[256];

	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW | IBV_ACCESS_LOCAL_WRITE, &mw,
				 why, sizeof(why)) == 0, "%s", why);
	rkey = mw->rkey;
	CHECK(reaches(rkey, BUF) && reaches(rkey, BUF + 4095), "the window's bytes");
	CHECK(!reaches(rkey, BUF - 1) && !reaches(rkey, BUF + 4096), "beside them");
	window_binder_counts(b, &bound, &pooled, &retired);
	CHECK(bound == 1 && pooled == 0, "%u bound, %u pooled", bound, pooled);
	CHECK(window_binder_unbind(b, mw) == 0, "unbind");
	CHECK(!reaches(rkey, BUF), "the unbound window's rkey 0x%x", rkey);
	window_binder_counts(b, &bound, &pooled, &retired);
	CHECK(bound == 0 && pooled == 1, "%u bound, %u pooled", bound, pooled);
	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &again, why, sizeof(why)) == 0,
	      "%s", why);
	CHECK(again == mw && again->rkey != rkey, "the pooled window, a new rkey");
	CHECK(reaches(again->rkey, BUF) && !reaches(rkey, BUF), "the new rkey alone");
	CHECK(n_alloc == 1, "%d windows allocated", n_alloc);
	CHECK(window_binder_unbind(b, again) == 0, "unbind");
	CHECK(window_binder_unbind(b, again) == -ENOENT, "an unbound window");
	window_binder_free(b);
	CHECK(n_live == 0 && n_qps == 0 && n_cqs == 0, "%d windows, %d QPs, %d CQs left", n_live,
	      n_qps, n_cqs);
}

/* 5000 registrations and deregistrations, 8 buffers at a time: no rkey is ever handed out
 * twice, each is dead after its unbind, and windows are retired at BINDER_BINDS. */
#define CYCLES 5000
#define AT_ONCE 8
static void t_cycles_no_rkey_twice(void)
{
	static uint8_t seen[1u << 20]; /* rkeys are index << 8 | byte: index < 4096 */
	struct window_binder *b = binder();
	struct ibv_mw *live[AT_ONCE] = { 0 };
	unsigned bound, pooled, retired, twice = 0, alive = 0;
	char why[256];

	for (int i = 0; i < CYCLES; i++) {
		int s = i % AT_ONCE;

		if (live[s]) {
			uint32_t old = live[s]->rkey;

			CHECK(window_binder_unbind(b, live[s]) == 0, "cycle %d", i);
			alive += reaches(old, BUF + (uint64_t)s * 4096);
		}
		CHECK(window_binder_bind(b, 0x100, (void *)(BUF + (uint64_t)s * 4096), 4096, RW,
					 &live[s], why, sizeof(why)) == 0, "%s", why);
		twice += seen[live[s]->rkey]++ > 0;
	}
	CHECK(twice == 0, "%u rkeys handed out twice", twice);
	CHECK(alive == 0, "%u unbound rkeys still reach their buffer", alive);
	window_binder_counts(b, &bound, &pooled, &retired);
	CHECK(bound == AT_ONCE, "%u bound", bound);
	/* 2 binds a cycle, BINDER_BINDS a window: about CYCLES * 2 / BINDER_BINDS retired. */
	CHECK(retired >= CYCLES * 2 / BINDER_BINDS - AT_ONCE && retired <= CYCLES * 2 / BINDER_BINDS,
	      "%u retired", retired);
	CHECK(n_dealloc == 0, "%d deallocated: retired windows stay allocated", n_dealloc);
	for (int s = 0; s < AT_ONCE; s++)
		CHECK(window_binder_unbind(b, live[s]) == 0, "unbind %d", s);
	for (int i = 0; i < n_mws; i++)
		CHECK(mws[i].binds <= BINDER_BINDS, "window %d bound %u times", i, mws[i].binds);
	window_binder_free(b);
	CHECK(n_live == 0, "%d windows left", n_live);
}

/* Past BINDER_RETIRED retired windows the oldest is deallocated, one for one. */
static void t_retired_bounded(void)
{
	struct window_binder *b = binder();
	unsigned bound, pooled, retired, more = 5;
	struct ibv_mw *mw;
	char why[256];

	for (unsigned i = 0; i < (BINDER_RETIRED + more) * (BINDER_BINDS / 2); i++) {
		if (window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &mw, why, sizeof(why)) ||
		    window_binder_unbind(b, mw)) {
			CHECK(false, "cycle %u: %s", i, why);
			break;
		}
	}
	window_binder_counts(b, &bound, &pooled, &retired);
	CHECK(retired == BINDER_RETIRED, "%u retired", retired);
	CHECK(n_dealloc == (int)more, "%d deallocated, %u expected", n_dealloc, more);
	CHECK(n_live == BINDER_RETIRED + (int)pooled, "%d live", n_live);
	window_binder_free(b);
	CHECK(n_live == 0, "%d windows left", n_live);
}

/* A bind that fails leaves the QP in error: its window is deallocated (its key dead) and the
 * next bind makes a new QP, on which the windows bound before still unbind (type 1: no QP of
 * their own). A failure that comes back every time: BINDER_REMAKES new QPs, then binds fail at
 * once without allocating, and a window still bound is deallocated at its unbind. */
static void t_failed_bind(void)
{
	struct window_binder *b = binder();
	struct ibv_mw *mw, *other;
	uint32_t rkey;
	char why[256] = "";
	int allocs;

	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &mw, why, sizeof(why)) == 0,
	      "%s", why);
	rkey = mw->rkey;
	fail_next_bind = true;
	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &other, why, sizeof(why)) < 0,
	      "the failed bind");
	CHECK(n_live == 1, "%d windows live: the failed one is deallocated", n_live);
	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &other, why, sizeof(why)) == 0,
	      "a bind on a new QP: %s", why);
	CHECK(n_qps == 1, "%d QPs: the failed one is destroyed", n_qps);
	CHECK(window_binder_unbind(b, other) == 0, "unbind on the new QP");
	CHECK(reaches(rkey, BUF), "the window bound before the failure");
	binds_fail = true;
	for (int i = 0; i < BINDER_REMAKES + 3; i++)
		CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &other, why,
					 sizeof(why)) < 0, "bind %d while binds fail", i);
	CHECK(n_qps_made == 1 + BINDER_REMAKES, "%d QPs made, %d expected", n_qps_made,
	      1 + BINDER_REMAKES);
	allocs = n_alloc;
	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &other, why, sizeof(why)) < 0,
	      "a bind after the remakes");
	CHECK(strstr(why, "QP failed"), "why: %s", why);
	CHECK(n_alloc == allocs, "%d windows allocated after the last remake", n_alloc - allocs);
	CHECK(window_binder_unbind(b, mw) < 0, "the unbind on a failed QP");
	CHECK(!reaches(rkey, BUF), "its rkey after the unbind");
	window_binder_free(b);
	CHECK(n_live == 0 && n_qps == 0, "%d windows, %d QPs left", n_live, n_qps);
}

/* An unbind that fails, and a dealloc that fails after it: the window, still bound, stays the
 * binder's, deallocated at its end. */
static void t_failed_dealloc(void)
{
	struct window_binder *b = binder();
	struct ibv_mw *mw;
	char why[256] = "";

	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &mw, why, sizeof(why)) == 0,
	      "%s", why);
	binds_fail = deallocs_fail = true;
	CHECK(window_binder_unbind(b, mw) < 0, "the unbind");
	deallocs_fail = false;
	window_binder_free(b);
	CHECK(n_live == 0, "%d windows left: the one whose dealloc failed is lost", n_live);
}

/* No type-1 windows, or a QP that cannot connect to itself (iWARP): refused with the reason,
 * nothing left behind. */
static void t_refusals(void)
{
	struct window_binder *b = NULL;
	char why[256] = "";
	int k;

	device_has_mw = false;
	k = window_binder_new(&verbs, &tracking, &pd, &b, why, sizeof(why));
	CHECK(k == -EOPNOTSUPP && strstr(why, "no type-1 memory windows"), "%d: %s", k, why);
	device_has_mw = true;
	device_has_type2 = false; /* mrd's MRs would not take windows: every bind would fail */
	k = window_binder_new(&verbs, &tracking, &pd, &b, why, sizeof(why));
	CHECK(k == -EOPNOTSUPP && strstr(why, "no type-2"), "%d: %s", k, why);
	device_has_type2 = true;
	qp_loops = false;
	k = window_binder_new(&verbs, &tracking, &pd, &b, why, sizeof(why));
	CHECK(k == -EOPNOTSUPP && strstr(why, "connect to itself"), "%d: %s", k, why);
	CHECK(n_qps == 0 && n_cqs == 0, "%d QPs, %d CQs left", n_qps, n_cqs);
}

/* After each case: no window was bound untracked, and a freed binder left none tracked (mrd
 * would deallocate a handle that may be another window's by then). */
static void t_tracked_after(void)
{
	CHECK(n_bound_untracked == 0, "%d binds of untracked windows", n_bound_untracked);
	CHECK(n_tracked() == 0, "%d windows tracked after the binder's end", n_tracked());
}

/* A window mrd does not track is not used: the bind fails with mrd's error, the window is
 * deallocated. Retired windows (unbound for good) are untracked; pooled ones stay tracked; a
 * window whose unbind and dealloc failed (maybe still bound) stays tracked until its end. */
static void t_tracking(void)
{
	struct window_binder *b = binder();
	unsigned bound, pooled, retired;
	struct ibv_mw *mw;
	char why[256] = "";

	track_fail = -ENOSPC;
	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &mw, why, sizeof(why)) == -ENOSPC,
	      "a bind whose window mrd did not track");
	CHECK(strstr(why, "mrd does not track"), "why: %s", why);
	CHECK(n_live == 0 && n_tracked() == 0, "%d live, %d tracked", n_live, n_tracked());
	for (unsigned i = 0; i < BINDER_BINDS / 2 + 1; i++) {
		CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &mw, why, sizeof(why)) == 0,
		      "%s", why);
		CHECK(tracked[mw->handle], "the bound window is tracked");
		CHECK(window_binder_unbind(b, mw) == 0, "unbind");
	}
	window_binder_counts(b, &bound, &pooled, &retired);
	CHECK(retired == 1 && pooled == 1, "%u retired, %u pooled", retired, pooled);
	CHECK(n_tracked() == 1 && tracked[mw->handle] && !tracked[0],
	      "the pooled window alone tracked (%d)", n_tracked());
	CHECK(window_binder_bind(b, 0x100, (void *)BUF, 4096, RW, &mw, why, sizeof(why)) == 0,
	      "%s", why);
	binds_fail = deallocs_fail = true;
	CHECK(window_binder_unbind(b, mw) < 0, "the unbind");
	CHECK(tracked[mw->handle], "a window whose unbind and dealloc failed stays tracked");
	deallocs_fail = false;
	window_binder_free(b);
}

int main(void)
{
	static struct ibv_context_ops ops;

	ops.alloc_mw = f_alloc_mw;
	ops.dealloc_mw = f_dealloc_mw;
	ops.bind_mw = f_bind_mw;
	ops.poll_cq = f_poll_cq;
	ctx.ops = ops;
	the_cq.context = &ctx;
	reset(), t_bind_unbind(), t_tracked_after();
	reset(), t_cycles_no_rkey_twice(), t_tracked_after();
	reset(), t_retired_bounded(), t_tracked_after();
	reset(), t_failed_bind(), t_tracked_after();
	reset(), t_failed_dealloc(), t_tracked_after();
	reset(), t_refusals(), t_tracked_after();
	reset(), t_tracking(), t_tracked_after();
	printf("%s: %d failures\n", failures ? "FAIL" : "PASS", failures);
	return failures ? 1 : 0;
}
