/* SPDX-License-Identifier: MIT */
/* libmrd's client-PD windows (client/own-windows.c) against a fake verbs device that models
 * type-2 windows as rxe does: a bind needs a FREE window whose current key the work request
 * names; a LOCAL_INV needs a live window with that key; a dealloc is immediate; a failed work
 * request moves the QP to the error state; a window keeps its QP across a reset. Work requests
 * run when the test says the device ran (dev_run), after the post, as on a real device. mrd
 * is stubbed (one MR per 1 MiB allocation). The real device runs rdma-peers windows in the
 * rxe VM; this checks the bookkeeping on the host, under the sanitizers too. First written by
 * the review of the client-PD model (its findings 1, 3, 4, 7, 8), then kept. */
#include <assert.h>
#include <fcntl.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "own-windows.c"

/* ---- stubs for libmrd's other files ---- */
static int n_grant_requests;

int set_last_error(int error, const char *fmt, ...)
{
	(void)fmt;
	return error;
}
int client_forked_error(const struct mrd_client *c)
{
	(void)c;
	return -ECHILD;
}
int client_usable(const struct mrd_client *c)
{
	return c->forked ? -ECHILD : 0;
}

struct mrd_cache {
	struct mrd_keys k[64];
	int n;
};
int mrd_cache_new(mrd_client *client, mrd_cache **ret)
{
	(void)client;
	*ret = calloc(1, sizeof(**ret));
	return *ret ? 0 : -ENOMEM;
}
mrd_cache *mrd_cache_free(mrd_cache *c)
{
	free(c);
	return NULL;
}
int cache_find(mrd_cache *c, uintptr_t a, struct mrd_keys *ret)
{
	for (int i = 0; i < c->n; i++)
		if (a >= c->k[i].start && a < c->k[i].end) {
			*ret = c->k[i];
			return 0;
		}
	return -ENOENT;
}
void cache_insert(mrd_cache *c, const struct mrd_keys *k, bool top)
{
	(void)top;
	if (c->n < 64)
		c->k[c->n++] = *k;
}

/* mrd: one MR per allocation, [alloc, alloc + 1 MiB), lkey 0x100 + slot. */
#define ALLOC_SIZE (1u << 20)
int client_call(struct mrd_client *client, Mrd__Request *req, Mrd__Response **ret,
		struct conn_fds *ret_fds)
{
	Mrd__Response resp = MRD__RESPONSE__INIT;
	Mrd__WindowGrantResponse body = MRD__WINDOW_GRANT_RESPONSE__INIT;
	Mrd__MrEntry e = MRD__MR_ENTRY__INIT;
	uint64_t a = req->window_grant->address & ~(uint64_t)(ALLOC_SIZE - 1);
	uint8_t buf[512];
	size_t n;

	(void)client, (void)ret_fds;
	n_grant_requests++;
	e.start = a;
	e.end = a + ALLOC_SIZE;
	e.lkey = 0x100 + (uint32_t)((a >> 20) & 0xff);
	e.rkey = e.lkey;
	body.mr = &e;
	body.allocation_start = a;
	body.allocation_end = a + ALLOC_SIZE;
	resp.body_case = MRD__RESPONSE__BODY_WINDOW_GRANT;
	resp.window_grant = &body;
	n = mrd__response__pack(&resp, buf);
	*ret = mrd__response__unpack(NULL, n, buf);
	return 0;
}

/* mrd's record of the windows a handle tracked (WindowTrack): every window libmrd allocates is
 * tracked, and untracked once deallocated. track_fail: the next track fails so. */
#define MAX_TRACKED 4096
static bool tracked[MAX_TRACKED];
static int track_fail;

int mrd_window_track(mrd_client *client, uint32_t mw_handle)
{
	(void)client;
	assert(mw_handle < MAX_TRACKED);
	if (track_fail) {
		int r = track_fail;

		track_fail = 0;
		return r;
	}
	tracked[mw_handle] = true;
	return 0;
}

int mrd_window_untrack(mrd_client *client, uint32_t mw_handle)
{
	(void)client;
	assert(mw_handle < MAX_TRACKED);
	if (!tracked[mw_handle])
		return -ENOENT;
	tracked[mw_handle] = false;
	return 0;
}

/* ---- the fake device ---- */
enum { MW_FREE, MW_VALID };
struct fmw {
	struct ibv_mw mw;
	bool live; /* allocated, not deallocated */
	int state;
	uint32_t key; /* the device's current rkey */
	uint64_t addr, len;
	struct ibv_qp *qp;
};
#define MAX_MW 4096
static struct fmw mws[MAX_MW];
static int n_mws, n_alloc_mw, n_dealloc_mw;

struct fwr {
	enum ibv_wr_opcode op;
	uint32_t mw_index, mw_rkey, new_rkey, inv_rkey;
	uint64_t addr, len;
};
struct fqp {
	struct ibv_qp qp;
	bool error; /* the device's state: a failed WR moved it to the error state */
	struct fwr sq[256];
	int n_sq;
	const char *why;
	/* post_send blocks on this while set (to hold ow->lock from a thread), atomic both */
	int block;
	int in_post;
	bool full; /* the send queue takes nothing */
};

static struct ibv_mw *f_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct fmw *m = &mws[n_mws];

	assert(n_mws < MAX_MW);
	memset(m, 0, sizeof(*m));
	m->mw.context = pd->context;
	m->mw.pd = pd;
	m->mw.type = type;
	m->mw.handle = (uint32_t)n_mws;
	m->key = ((uint32_t)(n_mws + 1) << 8) | 0x42;
	m->mw.rkey = m->key;
	m->live = true;
	m->state = MW_FREE;
	n_mws++;
	n_alloc_mw++;
	return &m->mw;
}

static int f_dealloc_mw(struct ibv_mw *mw)
{
	struct fmw *m = (struct fmw *)mw;

	m->live = false;
	n_dealloc_mw++;
	return 0;
}

static struct fmw *by_rkey(uint32_t rkey)
{
	uint32_t i = (rkey >> 8) - 1;

	return i < (uint32_t)n_mws && mws[i].live && mws[i].key == rkey ? &mws[i] : NULL;
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fqp *q = (struct fqp *)qp;
	struct fwr *w = &q->sq[q->n_sq];

	(void)bad;
	__atomic_store_n(&q->in_post, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&q->block, __ATOMIC_ACQUIRE))
		usleep(1000);
	__atomic_store_n(&q->in_post, 0, __ATOMIC_RELEASE);
	if (q->full || q->n_sq == 256)
		return ENOMEM;
	memset(w, 0, sizeof(*w));
	w->op = wr->opcode;
	if (wr->opcode == IBV_WR_BIND_MW) {
		w->mw_index = wr->bind_mw.mw->handle;
		w->mw_rkey = wr->bind_mw.mw->rkey;
		w->new_rkey = wr->bind_mw.rkey;
		w->addr = wr->bind_mw.bind_info.addr;
		w->len = wr->bind_mw.bind_info.length;
	} else {
		w->inv_rkey = wr->invalidate_rkey;
	}
	q->n_sq++;
	return 0;
}

/* The device runs every posted WR of q in order (as rxe's send task does, later). */
static void dev_run(struct fqp *q)
{
	for (int i = 0; i < q->n_sq; i++) {
		struct fwr *w = &q->sq[i];

		if (q->error)
			break; /* flushed */
		if (w->op == IBV_WR_BIND_MW) {
			struct fmw *m = &mws[w->mw_index];

			if (!m->live) {
				q->error = true, q->why = "bind on a deallocated window";
			} else if (m->state != MW_FREE) {
				q->error = true, q->why = "bind on a type-2 window not FREE";
			} else if (m->key != w->mw_rkey) {
				q->error = true, q->why = "bind naming a stale key";
			} else {
				m->state = MW_VALID;
				m->key = w->new_rkey;
				m->addr = w->addr;
				m->len = w->len;
				m->qp = &q->qp;
			}
		} else {
			struct fmw *m = by_rkey(w->inv_rkey);

			if (!m)
				q->error = true, q->why = "LOCAL_INV of an rkey no live window has";
			else
				m->state = MW_FREE;
		}
	}
	q->n_sq = 0;
}

/* The program resets the QP and brings it back to RTS (qp_num kept, windows keep their QP). */
static void qp_recover(struct fqp *q)
{
	q->n_sq = 0; /* flushed */
	q->error = false;
	q->why = NULL;
	q->qp.state = IBV_QPS_RTS;
}

/* A peer's RDMA WRITE through rkey at addr, arriving on q. */
static bool remote_reaches(struct fqp *q, uint32_t rkey, uint64_t addr)
{
	struct fmw *m = by_rkey(rkey);

	return !q->error && m && m->state == MW_VALID && m->qp == &q->qp && addr >= m->addr &&
	       addr < m->addr + m->len;
}

static struct ibv_context ctx;
static struct ibv_pd pd;
static int qpn = 100;

static struct fqp *qp_new(void)
{
	struct fqp *q = calloc(1, sizeof(*q));

	q->qp.context = &ctx;
	q->qp.pd = &pd;
	q->qp.qp_num = (uint32_t)qpn++;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.state = IBV_QPS_RTS;
	return q;
}

static struct mrd_client *client_new(void)
{
	struct mrd_client *c = calloc(1, sizeof(*c));


	c->bound_fd = ctx.cmd_fd;
	c->bound_pd = pd.handle;
	return c;
}

static void reset_device(void)
{
	memset(mws, 0, sizeof(mws));
	memset(tracked, 0, sizeof(tracked));
	n_mws = n_alloc_mw = n_dealloc_mw = 0;
}

#define X ((char *)(uintptr_t)0x7f0000000000ull) /* an allocation of mrd's */
#define Y ((char *)(uintptr_t)0x7f0000100000ull)


static int failures;
static void check(bool ok, const char *name, const char *detail)
{
	printf("%s: %s%s%s\n", ok ? "PASS" : "FAIL", name, detail && !ok ? " -- " : "",
	       detail && !ok ? detail : "");
	failures += !ok;
}

/* The ordinary teardown, as mrd_window_grant(3) asks: revoke, a completion after it (the
 * device ran what was posted), free. The QP stays usable, the key is dead. */
static void t_revoke_then_free(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey;

	reset_device();
	assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
	dev_run(q);
	check(remote_reaches(q, rkey, (uintptr_t)X), "a granted window reaches its bytes", NULL);
	assert(own_window_revoke(c, &q->qp, rkey) == 0);
	dev_run(q);
	check(!remote_reaches(q, rkey, (uintptr_t)X), "a revoked window reaches nothing", NULL);
	own_windows_after_free(c, (uintptr_t)X, own_windows_before_free(c, (uintptr_t)X));
	dev_run(q);
	check(!q->error, "revoke, completion, free: the QP stays usable", q->why);
	check(n_dealloc_mw == 1, "the free deallocated the pooled window", NULL);
	own_windows_close(c);
	free(c);
	free(q);
}

static int live_untracked(void)
{
	int n = 0;

	for (int i = 0; i < n_mws; i++)
		n += mws[i].live && !tracked[mws[i].mw.handle];
	return n;
}

/* Deallocated windows mrd still tracks: their handles may be other windows' by now. */
static int dead_tracked(void)
{
	int n = 0;

	for (int i = 0; i < n_mws; i++)
		n += !mws[i].live && tracked[mws[i].mw.handle];
	return n;
}

/* Every window libmrd allocates is tracked with mrd (which deallocates it should the program
 * die with it bound) and untracked once libmrd deallocated it (its handle may be another
 * window's then); a window mrd would not track is not used. */
static void t_tracking(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey, other;
	int posted, live;

	reset_device();
	assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
	assert(own_window_grant(c, &q->qp, Y, 4096, MRD_WINDOW_REMOTE_WRITE, &other) == 0);
	dev_run(q);
	check(n_mws == 2 && live_untracked() == 0, "each window allocated is tracked", NULL);
	own_windows_after_free(c, (uintptr_t)X, own_windows_before_free(c, (uintptr_t)X));
	check(n_dealloc_mw == 1 && dead_tracked() == 0, "a free deallocates and untracks its window",
	      NULL);
	check(tracked[mws[1].mw.handle], "and leaves the other tracked", NULL);
	posted = q->n_sq;
	live = n_alloc_mw - n_dealloc_mw;
	track_fail = -ENOSPC;
	check(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == -ENOSPC,
	      "a window mrd does not track fails the grant with mrd's error", NULL);
	check(q->n_sq == posted && n_alloc_mw - n_dealloc_mw == live,
	      "and is deallocated, nothing posted", NULL);
	own_windows_close(c);
	check(n_alloc_mw == n_dealloc_mw && dead_tracked() == 0,
	      "close deallocates and untracks each window", NULL);
	free(c);
	free(q);
}

/* A grant and its completion, then a free: the window dies before the Free. */
static void t_grant_then_free(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey, other;

	reset_device();
	assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
	assert(own_window_grant(c, &q->qp, Y, 4096, MRD_WINDOW_REMOTE_WRITE, &other) == 0);
	dev_run(q);
	own_windows_after_free(c, (uintptr_t)X, own_windows_before_free(c, (uintptr_t)X));
	check(!remote_reaches(q, rkey, (uintptr_t)X), "a free kills the window over it", NULL);
	check(remote_reaches(q, other, (uintptr_t)Y), "and no other", NULL);
	check(own_window_revoke(c, &q->qp, rkey) == -ENOENT, "its rkey is no window any more",
	      NULL);
	dev_run(q);
	check(!q->error, "grant, completion, free: the QP stays usable", q->why);
	own_windows_close(c);
	free(c);
	free(q);
}

/* No grant binds over memory between its windows' death and mrd's answer to the Free: such a
 * grant is refused, while frees and grants of other memory go on (the first review's race, and
 * the second's: the handle's first grant, before it had any window record). */
static void t_no_grant_while_freeing(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey;
	bool held;

	reset_device();
	c->bound_fd = -1;
	check(!own_windows_before_free(c, (uintptr_t)X) && !c->own_windows,
	      "a handle bound to no PD marks nothing at a free", NULL);
	c->bound_fd = ctx.cmd_fd;
	held = own_windows_before_free(c, (uintptr_t)X); /* thread 1: mrd_mem_free(X) */
	check(!held, "a free holds no lock while mrd answers", NULL);
	check(own_window_grant(c, &q->qp, X + 4096, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) ==
	      -ENOENT, "the handle's first grant, over memory being freed, is refused", NULL);
	check(own_window_grant(c, &q->qp, Y, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0,
	      "a grant over other memory goes on meanwhile", NULL);
	own_windows_after_free(c, (uintptr_t)X, held); /* mrd answered */
	dev_run(q);
	check(!q->error, "the QP stays usable", q->why);
	check(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0,
	      "once the Free was answered the mark is gone (mrd judges the address again)", NULL);
	dev_run(q);
	own_windows_close(c);
	free(c);
	free(q);
}

/* A revoke on a QP that failed on its own (qp->state still says RTS): the invalidate is
 * flushed; once the program brought the QP back it calls mrd_window_qp_gone, and the
 * revoked rkey is dead, the next grant works. */
static void t_revoke_on_async_error(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey, rkey2;
	int r;

	reset_device();
	assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
	dev_run(q);
	q->error = true; /* e.g. retry exceeded on another request */
	q->why = "async";
	assert(own_window_revoke(c, &q->qp, rkey) == 0);
	dev_run(q); /* flushed */
	qp_recover(q);
	r = own_windows_qp_gone(c, &q->qp);
	check(r == 1, "mrd_window_qp_gone after the QP's reset ends its window", NULL);
	check(!remote_reaches(q, rkey, (uintptr_t)X),
	      "the revoked rkey stays dead after the QP came back", NULL);
	r = own_window_grant(c, &q->qp, Y, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey2);
	dev_run(q);
	check(r == 0 && !q->error && remote_reaches(q, rkey2, (uintptr_t)Y),
	      "the next grant after that works", q->why);
	own_windows_close(c);
	free(c);
	free(q);
}

/* A QP the program took out of RTS: the revoke deallocates at once. */
static void t_revoke_out_of_rts(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey;

	reset_device();
	assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
	dev_run(q);
	q->qp.state = IBV_QPS_ERR; /* ibv_modify_qp to ERR */
	check(own_window_revoke(c, &q->qp, rkey) == 0 && n_dealloc_mw == 1 && q->n_sq == 0,
	      "a revoke on a QP out of RTS deallocates, posting nothing", NULL);
	check(!remote_reaches(q, rkey, (uintptr_t)X), "the rkey is dead at once", NULL);
	own_windows_close(c);
	free(c);
	free(q);
}

/* Windows pooled for QPs the program destroyed (without mrd_window_qp_gone): each QP has a
 * pool of its own, so a live QP's grants keep finding their own window. */
static void t_dead_qps_fill_pool(void)
{
	struct mrd_client *c = client_new();
	struct fqp *b;
	uint32_t rkey;
	char d[96];

	struct fqp *dead[80];

	reset_device();
	for (int i = 0; i < 80; i++) {
		struct fqp *q = dead[i] = qp_new();

		assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
		assert(own_window_revoke(c, &q->qp, rkey) == 0);
		dev_run(q);
	}
	b = qp_new();
	n_alloc_mw = 0;
	for (int i = 0; i < 100; i++) {
		assert(own_window_grant(c, &b->qp, Y, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
		assert(own_window_revoke(c, &b->qp, rkey) == 0);
		dev_run(b);
	}
	snprintf(d, sizeof(d), "%d ibv_alloc_mw for 100 grant+revoke cycles on a live QP",
		 n_alloc_mw);
	check(n_alloc_mw == 1, "the pool serves a live QP after 80 QPs were destroyed", d);
	check(!b->error, "and its QP never failed", b->why);
	own_windows_close(c);
	check(n_dealloc_mw == n_mws, "close deallocates every window, retired ones too", NULL);
	free(c);
	free(b);
	for (int i = 0; i < 80; i++)
		free(dead[i]); /* only now: a QP made later must not take a dead one's address */
}

/* Cycles over one allocation: the pool's window again and again (its list emptied and filled
 * in one grant), retired after 256 binds, no rkey twice, every old one dead. */
static void t_cycles(void)
{
	static uint32_t seen[1000];
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	bool repeat = false, alive = false;
	char d[96];

	reset_device();
	for (int i = 0; i < 1000; i++) {
		assert(own_window_grant(c, &q->qp, X + 64 * (i % 8), 4096, MRD_WINDOW_REMOTE_WRITE,
					&seen[i]) == 0);
		dev_run(q);
		assert(own_window_revoke(c, &q->qp, seen[i]) == 0);
		dev_run(q);
		for (int j = 0; j < i && !repeat; j++)
			repeat = seen[j] == seen[i];
	}
	for (int i = 0; i < 1000; i++)
		alive |= remote_reaches(q, seen[i], (uintptr_t)X + 64 * (i % 8));
	snprintf(d, sizeof(d), "%d windows for 1000 cycles", n_alloc_mw);
	check(!q->error, "1000 grant+revoke cycles leave the QP usable", q->why);
	check(!repeat, "no rkey came twice", NULL);
	check(!alive, "every old rkey is dead", NULL);
	check(n_alloc_mw == 4, "a window serves 256 binds, then another is made", d);
	own_windows_after_free(c, (uintptr_t)X, own_windows_before_free(c, (uintptr_t)X));
	check(n_dealloc_mw == n_mws, "the free deallocated every window over it, worn ones too",
	      NULL);
	own_windows_close(c);
	free(c);
	free(q);
}

/* Many QPs in turn over one long-lived buffer (the second review's case): a window per QP,
 * not one per cycle. */
static void t_many_qps_in_turn(void)
{
	enum { NQP = 80, ROUNDS = 20 };
	struct mrd_client *c = client_new();
	struct fqp *qs[NQP];
	uint32_t rkey;
	char d[128];
	int live;

	reset_device();
	for (int i = 0; i < NQP; i++)
		qs[i] = qp_new();
	for (int r = 0; r < ROUNDS; r++)
		for (int i = 0; i < NQP; i++) {
			assert(own_window_grant(c, &qs[i]->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE,
						&rkey) == 0);
			dev_run(qs[i]);
			assert(own_window_revoke(c, &qs[i]->qp, rkey) == 0);
			dev_run(qs[i]);
		}
	live = n_alloc_mw - n_dealloc_mw;
	snprintf(d, sizeof(d), "%d windows alive after %d grant+revoke cycles on %d QPs", live,
		 NQP * ROUNDS, NQP);
	check(live <= NQP, "windows of a long-lived allocation stay one per QP", d);
	check(own_windows_qp_gone(c, &qs[0]->qp) == 1, "mrd_window_qp_gone ends that QP's one",
	      NULL);
	own_windows_close(c);
	free(c);
	for (int i = 0; i < NQP; i++)
		free(qs[i]);
}

/* A revoke on a QP in SQD (drained, not failed): the grant's bind still queued runs when the
 * QP is back in RTS, so the window is invalidated in order, not deallocated (the second
 * review's case). */
static void t_revoke_in_sqd(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey;

	reset_device();
	assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
	q->qp.state = IBV_QPS_SQD; /* ibv_modify_qp(SQD): queued requests wait, not flushed */
	assert(own_window_revoke(c, &q->qp, rkey) == 0);
	q->qp.state = IBV_QPS_RTS;
	dev_run(q);
	check(!q->error, "a revoke on a QP in SQD leaves the QP usable", q->why);
	check(!remote_reaches(q, rkey, (uintptr_t)X), "and kills the key in order", NULL);
	own_windows_close(c);
	free(c);
	free(q);
}

/* A full send queue: nothing changes, the error says so. */
static void t_full_send_queue(void)
{
	struct mrd_client *c = client_new();
	struct fqp *q = qp_new();
	uint32_t rkey, r2 = 7;

	reset_device();
	assert(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey) == 0);
	dev_run(q);
	q->full = true;
	check(own_window_revoke(c, &q->qp, rkey) == -ENOMEM && remote_reaches(q, rkey, (uintptr_t)X),
	      "a revoke on a full send queue is -ENOMEM, the window still granted", NULL);
	check(own_window_grant(c, &q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &r2) == -ENOMEM &&
	      r2 == 7 && n_dealloc_mw == 1 && n_alloc_mw == 2,
	      "a grant on a full send queue is -ENOMEM; its new window, never posted, goes", NULL);
	q->full = false;
	check(own_window_revoke(c, &q->qp, rkey) == 0, "the revoke goes through later", NULL);
	dev_run(q);
	check(!q->error && !remote_reaches(q, rkey, (uintptr_t)X), "and kills the key", q->why);
	own_windows_close(c);
	free(c);
	free(q);
}

/* fork() while another thread is inside a grant (holding the lock): the child's free does not
 * wait for a lock nobody in it will let go. */
static struct fqp *blocked_q;
static struct mrd_client *blocked_c;
static void *granting(void *arg)
{
	uint32_t rkey;

	(void)arg;
	(void)own_window_grant(blocked_c, &blocked_q->qp, X, 4096, MRD_WINDOW_REMOTE_WRITE, &rkey);
	return NULL;
}

static void t_fork_while_granting(void)
{
	pthread_t t;
	pid_t pid;
	int status;

	reset_device();
	blocked_c = client_new();
	blocked_q = qp_new();
	blocked_q->block = 1;
	pthread_create(&t, NULL, granting, NULL);
	while (!__atomic_load_n(&blocked_q->in_post, __ATOMIC_ACQUIRE))
		usleep(1000); /* an event: the grant is inside, holding the lock */
	pid = fork();
	if (pid == 0) {
		blocked_c->forked = true; /* libmrd's fork handler */
		alarm(60);
		own_windows_after_free(blocked_c, (uintptr_t)Y,
				       own_windows_before_free(blocked_c, (uintptr_t)Y));
		own_windows_close(blocked_c);
		_exit(0);
	}
	waitpid(pid, &status, 0);
	check(WIFEXITED(status), "a free in a fork() child returns",
	      WIFSIGNALED(status) ? "the child hung on the windows' lock" : NULL);
	__atomic_store_n(&blocked_q->block, 0, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	own_windows_close(blocked_c);
	free(blocked_c);
	free(blocked_q);
}

int main(void)
{
	ctx.cmd_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	ctx.ops.alloc_mw = f_alloc_mw;
	ctx.ops.dealloc_mw = f_dealloc_mw;
	ctx.ops.post_send = f_post_send;
	pd.context = &ctx;
	pd.handle = 3;
	t_revoke_then_free();
	t_grant_then_free();
	t_no_grant_while_freeing();
	t_revoke_on_async_error();
	t_revoke_out_of_rts();
	t_dead_qps_fill_pool();
	t_cycles();
	t_full_send_queue();
	t_many_qps_in_turn();
	t_revoke_in_sqd();
	t_fork_while_granting();
	t_tracking();
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
