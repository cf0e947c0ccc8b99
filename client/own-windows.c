/* SPDX-License-Identifier: MIT */
/* Memory windows in the client-PD model (own-windows.h). One lock per handle guards it all: a
 * window granted on one thread may be revoked on another, so the rkey's record is shared
 * anyway, and a per-thread pool would save nothing beside that lock. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "cache.h"
#include "handle.h"
#include "own-windows.h"
#include "mrd/mrd.h"

#ifndef HAVE_INFINIBAND_VERBS_H

static int no_verbs(const char *call)
{
	return set_last_error(-EOPNOTSUPP, "%s: this libmrd was built without "
			      "<infiniband/verbs.h>: no windows on the program's own QP", call);
}

int own_window_grant(struct mrd_client *client, void *qp, const void *addr, size_t len,
		     unsigned access, uint32_t *rkey)
{
	(void)client, (void)qp, (void)addr, (void)len, (void)access, (void)rkey;
	return no_verbs("mrd_window_grant");
}

int own_window_revoke(struct mrd_client *client, void *qp, uint32_t rkey)
{
	(void)client, (void)qp, (void)rkey;
	return no_verbs("mrd_window_revoke");
}

int own_windows_qp_gone(struct mrd_client *client, void *qp)
{
	(void)client, (void)qp;
	return no_verbs("mrd_window_qp_gone");
}

bool own_windows_before_free(struct mrd_client *client, uint64_t addr)
{
	(void)client, (void)addr;
	return false;
}

void own_windows_after_free(struct mrd_client *client, uint64_t addr, bool held)
{
	(void)client, (void)addr, (void)held;
}

void own_windows_close(struct mrd_client *client)
{
	(void)client;
}

#else

#include <linux/kcmp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "u64-map.h"

/* A type-2 window's key byte has 256 values: a window is retired after 256 binds, so that no
 * rkey it gave comes back (as mrd's own pool, mw-grants.c). */
#define FRESH_BINDS 256
#define EXTENTS_MAX 4096     /* MRs whose allocation a grant remembers */

struct own_alloc;

/* A window of the program's PD. libmrd cannot see the completions of what it posts (the
 * program's CQ), so it deallocates a window only where the program's rules say nothing it
 * posted for it can still run: at the free of its allocation, at mrd_window_qp_gone() of its
 * QP, at close, or on a QP the program took out of RTS. A dealloc under a queued bind or
 * invalidate would fail that request and the program's QP with it. */
struct own_window {
	struct ibv_mw *mw;
	/* Bound on, or invalidated on last: a bind from the pool goes on the same QP, ordered
	 * after the invalidate (QPs order nothing between them). qp_num tells a QP made later
	 * at the same address. */
	struct ibv_qp *qp;
	uint32_t qp_num;
	uint32_t rkey;     /* bound: the key granted */
	unsigned binds;
	bool bound;
	struct own_qp_pool *pool; /* pooled there, unbound, for the next grant on its QP */
	struct own_alloc *alloc; /* of its last bind (NULL: never bound): its free kills it */
	struct own_window *alloc_prev, *alloc_next;
};

/* The windows whose last bind was over one allocation: bound, pooled, or retired (worn by 256
 * binds, or pooled on a QP that was destroyed without mrd_window_qp_gone(): never bound again,
 * deallocated with the rest). */
struct own_alloc {
	uint64_t start;
	struct own_window *head;
};

/* One QP's unbound windows, invalidated there last: as many as the QP had granted at once,
 * since each revoke puts one back and each grant takes one. */
struct own_qp_pool {
	struct ibv_qp *qp;
	uint32_t qp_num;
	struct own_window **w; /* oldest first */
	size_t n, cap;
};

struct own_windows {
	pthread_mutex_t lock;
	struct mrd_client *client; /* whose tracked set each window is in (mrd_window_track) */
	mrd_cache *keys;         /* the bound PD's MRs that grants found: lkeys to bind over */
	unsigned epoch;          /* the handle's reconnects when keys was filled */
	struct u64_map extents;  /* an MR's start + 1 -> its allocation's start */
	struct u64_map bound;    /* rkey + 1 -> bound window */
	struct u64_map allocs;   /* allocation start + 1 -> struct own_alloc */
	struct u64_map pools;    /* QP address -> struct own_qp_pool */
	struct u64_map freeing;  /* allocation start + 1 -> Frees of it under way (a count) */
};

static unsigned ibv_access_of(unsigned access)
{
	return (access & MRD_WINDOW_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (access & MRD_WINDOW_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (access & MRD_WINDOW_REMOTE_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

/* The allocation's list, made when asked (NULL: out of memory). */
static struct own_alloc *alloc_get(struct own_windows *ow, uint64_t start)
{
	struct own_alloc *a = u64_map_get(&ow->allocs, start + 1);

	if (a)
		return a;
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->start = start;
	if (u64_map_put(&ow->allocs, start + 1, a) < 0) {
		free(a);
		return NULL;
	}
	return a;
}

/* An allocation's list that came out empty goes. */
static void alloc_drop_if_empty(struct own_windows *ow, struct own_alloc *a)
{
	if (a && !a->head) {
		(void)u64_map_remove(&ow->allocs, a->start + 1);
		free(a);
	}
}

/* Off its allocation's list; an emptied list goes unless keep (a walk over the map, which the
 * removal would reshape, drops them after). */
static void alloc_unlink_keep(struct own_windows *ow, struct own_window *w, bool keep)
{
	struct own_alloc *a = w->alloc;

	if (!a)
		return;
	if (w->alloc_next)
		w->alloc_next->alloc_prev = w->alloc_prev;
	if (w->alloc_prev)
		w->alloc_prev->alloc_next = w->alloc_next;
	else
		a->head = w->alloc_next;
	w->alloc = NULL;
	w->alloc_prev = w->alloc_next = NULL;
	if (!keep)
		alloc_drop_if_empty(ow, a);
}

static void alloc_link(struct own_alloc *a, struct own_window *w)
{
	w->alloc = a;
	w->alloc_prev = NULL;
	w->alloc_next = a->head;
	if (a->head)
		a->head->alloc_prev = w;
	a->head = w;
}

static void pool_free(struct own_windows *ow, struct own_qp_pool *p)
{
	(void)u64_map_remove(&ow->pools, (uintptr_t)p->qp);
	free(p->w);
	free(p);
}

/* Out of its QP's pool (retired, unless bound again or killed next); an emptied pool goes. */
static void pool_remove(struct own_windows *ow, struct own_window *w)
{
	struct own_qp_pool *p = w->pool;

	for (size_t i = p->n; i-- > 0;)
		if (p->w[i] == w) {
			memmove(&p->w[i], &p->w[i + 1], (p->n - i - 1) * sizeof(w));
			p->n--;
			break;
		}
	w->pool = NULL;
	if (p->n == 0)
		pool_free(ow, p);
}

/* qp's pool, made when asked (NULL: none, or out of memory). A pool at qp's address of another
 * QP number is a QP destroyed without mrd_window_qp_gone(): its windows are retired. */
static struct own_qp_pool *qp_pool(struct own_windows *ow, struct ibv_qp *qp, bool make)
{
	struct own_qp_pool *p = u64_map_get(&ow->pools, (uintptr_t)qp);

	while (p && p->qp_num != qp->qp_num) {
		pool_remove(ow, p->w[0]); /* the last one frees p */
		p = u64_map_get(&ow->pools, (uintptr_t)qp);
	}
	if (p || !make)
		return p;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->qp = qp;
	p->qp_num = qp->qp_num;
	if (u64_map_put(&ow->pools, (uintptr_t)qp, p) < 0) {
		free(p);
		return NULL;
	}
	return p;
}

/* Deallocated, then untracked (its handle may be another window's now, which mrd must not
 * deallocate when the handle goes); one whose dealloc failed, bound still maybe, stays
 * tracked, for mrd to deallocate should the process die. */
static void dealloc_untracked(struct own_windows *ow, struct ibv_mw *mw)
{
	uint32_t handle = mw->handle;

	if (ibv_dealloc_mw(mw) == 0)
		(void)mrd_window_untrack(ow->client, handle);
}

/* Kills the window at once (the kernel's dealloc: no work request, no wait) and forgets it. */
static void window_kill_keep(struct own_windows *ow, struct own_window *w, bool keep)
{
	if (w->pool)
		pool_remove(ow, w);
	alloc_unlink_keep(ow, w, keep);
	if (w->bound)
		(void)u64_map_remove(&ow->bound, (uint64_t)w->rkey + 1);
	dealloc_untracked(ow, w->mw);
	free(w);
}

static void window_kill(struct own_windows *ow, struct own_window *w)
{
	window_kill_keep(ow, w, false);
}

static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER; /* each handle's, once */

static struct own_windows *windows_of(struct mrd_client *client)
{
	struct own_windows *ow = __atomic_load_n(&client->own_windows, __ATOMIC_ACQUIRE);

	if (ow)
		return ow;
	pthread_mutex_lock(&create_lock);
	ow = client->own_windows;
	if (!ow) {
		ow = calloc(1, sizeof(*ow)); /* keys: at the first grant (find_mr) */
		if (ow) {
			pthread_mutex_init(&ow->lock, NULL);
			ow->client = client;
			ow->epoch = __atomic_load_n(&client->epoch, __ATOMIC_ACQUIRE);
			__atomic_store_n(&client->own_windows, ow, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&create_lock);
	return ow;
}

/* Whether qp is of the PD the handle is bound to: its handle, in the same open device file
 * (kcmp; where the kernel cannot tell, the handle alone, and the device refuses a bind over
 * another PD's MR). */
static int check_qp(struct mrd_client *client, struct ibv_qp *qp, const char *call)
{
	long same;

	if (client->bound_fd < 0)
		return set_last_error(-ENXIO, "%s: a window on the program's own QP needs the handle "
				      "bound to that QP's PD first (mrd_verbs_bind_pd)", call);
	if (!qp->pd || !qp->context || qp->pd->handle != client->bound_pd)
		return set_last_error(-EINVAL, "%s: the QP is not of PD %u, the one the handle is "
				      "bound to", call, client->bound_pd);
	same = syscall(SYS_kcmp, getpid(), getpid(), KCMP_FILE, qp->context->cmd_fd,
		       client->bound_fd);
	if (same > 0)
		return set_last_error(-EINVAL, "%s: the QP is of another device context than the "
				      "PD the handle is bound to", call);
	if (qp->qp_type != IBV_QPT_RC && qp->qp_type != IBV_QPT_UC)
		return set_last_error(-EINVAL, "%s: type-2 windows are bound on RC or UC QPs",
				      call);
	return 0;
}

/* Every MR's keys and allocation forgotten; -ENOMEM leaves none (the next grant tries again). */
static int forget_mrs(struct mrd_client *client, struct own_windows *ow)
{
	ow->keys = mrd_cache_free(ow->keys);
	u64_map_done(&ow->extents);
	return mrd_cache_new(client, &ow->keys);
}

/* The bound PD's MR covering [addr, addr + len) and its allocation: from what earlier grants
 * learned (dropped as a lookup cache's keys are, when the domain frees memory), else by one
 * WindowGrant with client_pd, which checks what mrd checks for its own windows. */
static int find_mr(struct mrd_client *client, struct own_windows *ow, uintptr_t addr, size_t len,
		   unsigned access, struct mrd_keys *ret, uint64_t *ret_alloc)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowGrantRequest q = MRD__WINDOW_GRANT_REQUEST__INIT;
	unsigned epoch = __atomic_load_n(&client->epoch, __ATOMIC_ACQUIRE);
	const Mrd__WindowGrantResponse *a;
	Mrd__Response *resp;
	int r;

	if (ow->epoch != epoch || !ow->keys) { /* another mrd: its keys, its MRs */
		if ((r = forget_mrs(client, ow)) < 0)
			return set_last_error(r, "out of memory");
		ow->epoch = epoch;
	}
	/* An allocation at 0 is none: mrd maps nothing there. */
	if (cache_find(ow->keys, addr, ret) == 0 && addr + len <= ret->end &&
	    (*ret_alloc = (uintptr_t)u64_map_get(&ow->extents, (uint64_t)ret->start + 1)))
		return 0;
	q.address = addr;
	q.length = len;
	q.access = access;
	q.client_pd = true;
	req.body_case = MRD__REQUEST__BODY_WINDOW_GRANT;
	req.window_grant = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	a = resp->window_grant;
	if (resp->body_case != MRD__RESPONSE__BODY_WINDOW_GRANT || !a->mr ||
	    a->mr->start > addr || a->mr->end < addr + len || a->allocation_start == 0 ||
	    a->allocation_start > a->mr->start) {
		mrd__response__free_unpacked(resp, NULL);
		return set_last_error(-EBADMSG, "malformed WindowGrant reply");
	}
	*ret = (struct mrd_keys){ (uintptr_t)a->mr->start, (uintptr_t)a->mr->end, a->mr->lkey,
				  a->mr->rkey };
	*ret_alloc = a->allocation_start;
	mrd__response__free_unpacked(resp, NULL);
	if (ow->extents.n >= EXTENTS_MAX && (r = forget_mrs(client, ow)) < 0)
		return set_last_error(r, "out of memory"); /* the next grants ask again */
	(void)u64_map_remove(&ow->extents, (uint64_t)ret->start + 1);
	if ((r = u64_map_put(&ow->extents, (uint64_t)ret->start + 1,
			     (void *)(uintptr_t)*ret_alloc)) < 0)
		return set_last_error(r, "out of memory");
	cache_insert(ow->keys, ret, true);
	return 0;
}

/* A window for a bind on qp: the pool's last one invalidated on qp, else a new one (with
 * errno on failure). */
/* NULL with errno; *tracked false when the allocation worked and mrd_window_track() did not
 * (its error is mrd_last_error()). */
static struct own_window *take_window(struct own_windows *ow, struct ibv_qp *qp, bool *tracked)
{
	struct own_window *w;
	int r;

	struct own_qp_pool *p = qp_pool(ow, qp, false);

	if (p) { /* the newest: its invalidate was posted last */
		w = p->w[--p->n];
		w->pool = NULL;
		if (p->n == 0)
			pool_free(ow, p);
		return w;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		errno = ENOMEM;
		return NULL;
	}
	w->mw = ibv_alloc_mw(qp->pd, IBV_MW_TYPE_2);
	if (!w->mw) {
		free(w);
		return NULL;
	}
	/* mrd deallocates it should the program die with it bound (mrd_window_track(3)). */
	r = mrd_window_track(ow->client, w->mw->handle);
	if (r < 0) {
		(void)ibv_dealloc_mw(w->mw);
		free(w);
		errno = -r;
		*tracked = false;
		return NULL;
	}
	return w;
}

/* Into its QP's pool (out of memory: retired, which keeps it on its list, killed with it). */
static void pool_put(struct own_windows *ow, struct own_window *w)
{
	struct own_qp_pool *p = qp_pool(ow, w->qp, true);

	if (p && p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 4;
		struct own_window **grown = realloc(p->w, cap * sizeof(*grown));

		if (grown) {
			p->w = grown;
			p->cap = cap;
		}
	}
	if (!p || p->n == p->cap) {
		if (p && p->n == 0)
			pool_free(ow, p);
		return;
	}
	p->w[p->n++] = w;
	w->pool = p;
}

/* A window take_window gave that was not posted: back where it came from. */
static void give_back(struct own_windows *ow, struct own_window *w)
{
	if (w->alloc)
		pool_put(ow, w); /* pooled before (its QP unchanged): its invalidate may be queued */
	else {
		dealloc_untracked(ow, w->mw); /* never posted on: nothing queued */
		free(w);
	}
}

int own_window_grant(struct mrd_client *client, void *qp_arg, const void *addr, size_t len,
		     unsigned access, uint32_t *rkey)
{
	struct ibv_qp *qp = qp_arg;
	struct own_windows *ow;
	struct own_window *w;
	struct own_alloc *a, *old;
	struct ibv_send_wr wr, *bad;
	struct ibv_mr mr;
	struct mrd_keys k;
	uint64_t alloc = 0;
	bool tracked = true;
	uint32_t fresh;
	int r;

	if ((r = client_usable(client)) < 0 || (r = check_qp(client, qp, "mrd_window_grant")) < 0)
		return r;
	ow = windows_of(client);
	if (!ow)
		return set_last_error(-ENOMEM, "out of memory");
	pthread_mutex_lock(&ow->lock);
	r = find_mr(client, ow, (uintptr_t)addr, len, access, &k, &alloc);
	if (r < 0)
		goto out;
	if (u64_map_get(&ow->freeing, alloc + 1)) { /* its windows died, mrd is letting it go */
		r = set_last_error(-ENOENT, "mrd_window_grant: 0x%lx is memory being freed",
				   (unsigned long)(uintptr_t)addr);
		goto out;
	}
	a = alloc_get(ow, alloc);
	if (!a) {
		r = set_last_error(-ENOMEM, "out of memory");
		goto out;
	}
	w = take_window(ow, qp, &tracked);
	if (!w) {
		if (!tracked)
			r = -errno;
		else
			r = set_last_error(-errno, "mrd_window_grant: ibv_alloc_mw of a type-2 "
					   "window: %s", errno == EOPNOTSUPP ?
					   "the device has no memory windows" : strerror(errno));
		alloc_drop_if_empty(ow, a);
		goto out;
	}
	/* libibverbs leaves it to the caller to follow a type-2 bind's key (rxe_bind_mw refuses a
	 * bind whose mw_rkey is not the window's current key); a bind names the MR by its lkey
	 * alone (librxe convert_send_wr, mlx5 set_umr_data_seg), which mrd made in this PD. */
	fresh = ibv_inc_rkey(w->mw->rkey);
	if ((r = u64_map_put(&ow->bound, (uint64_t)fresh + 1, w)) < 0) {
		give_back(ow, w);
		alloc_drop_if_empty(ow, a);
		r = set_last_error(r, "out of memory");
		goto out;
	}
	mr = (struct ibv_mr){ .context = qp->context, .pd = qp->pd, .addr = (void *)k.start,
			      .length = k.end - k.start, .lkey = k.lkey, .rkey = k.rkey };
	wr = (struct ibv_send_wr){
		.wr_id = MRD_WINDOW_WR_ID,
		.opcode = IBV_WR_BIND_MW,
		.bind_mw = { .mw = w->mw, .rkey = fresh,
			     .bind_info = { .mr = &mr, .addr = (uintptr_t)addr, .length = len,
					    .mw_access_flags = ibv_access_of(access) } },
	};
	r = ibv_post_send(qp, &wr, &bad);
	if (r != 0) { /* nothing posted: the window is as it was */
		(void)u64_map_remove(&ow->bound, (uint64_t)fresh + 1);
		give_back(ow, w);
		alloc_drop_if_empty(ow, a);
		r = set_last_error(-r, "mrd_window_grant: posting the bind on the QP: %s%s",
				   strerror(r), r == ENOMEM ? " (its send queue is full)" : "");
		goto out;
	}
	old = w->alloc; /* may be a itself: emptied for a moment, it must not go */
	alloc_unlink_keep(ow, w, true);
	alloc_link(a, w);
	if (old != a)
		alloc_drop_if_empty(ow, old);
	w->mw->rkey = fresh;
	w->rkey = fresh;
	w->qp = qp;
	w->qp_num = qp->qp_num;
	w->binds++;
	w->bound = true;
	*rkey = fresh;
	r = 0;
out:
	pthread_mutex_unlock(&ow->lock);
	return r;
}

int own_window_revoke(struct mrd_client *client, void *qp_arg, uint32_t rkey)
{
	struct ibv_qp *qp = qp_arg;
	struct own_windows *ow = __atomic_load_n(&client->own_windows, __ATOMIC_ACQUIRE);
	struct ibv_send_wr wr = {
		.wr_id = MRD_WINDOW_WR_ID,
		.opcode = IBV_WR_LOCAL_INV,
		.invalidate_rkey = rkey,
	}, *bad;
	struct own_window *w;
	int r;

	if (client->forked)
		return client_forked_error(client);
	if (!ow)
		return set_last_error(-ENOENT, "mrd_window_revoke: rkey 0x%x is no window granted "
				      "on the program's own QP through this handle", rkey);
	pthread_mutex_lock(&ow->lock);
	w = u64_map_get(&ow->bound, (uint64_t)rkey + 1);
	if (!w) {
		r = set_last_error(-ENOENT, "mrd_window_revoke: rkey 0x%x is no window granted on "
				   "the program's own QP through this handle (revoked already, or "
				   "its memory freed)", rkey);
	} else if (w->qp != qp || w->qp_num != qp->qp_num) {
		r = set_last_error(-EINVAL, "mrd_window_revoke: rkey 0x%x was granted on QP %u, not "
				   "on this one", rkey, w->qp_num);
	} else if (qp->state == IBV_QPS_ERR || qp->state == IBV_QPS_SQE ||
		   qp->state == IBV_QPS_RESET) {
		/* The program moved the QP to the error state, or reset it (ibv_modify_qp keeps
		 * qp->state): what was queued on it is flushed, never run, so the window dies by
		 * dealloc, at once. (In SQD or RTR a queued bind may still run: posted after.) */
		window_kill(ow, w);
		r = 0;
	} else if ((r = ibv_post_send(qp, &wr, &bad)) != 0) {
		r = set_last_error(-r, "mrd_window_revoke: posting the invalidate on the QP: %s%s; "
				   "the window is still granted", strerror(r),
				   r == ENOMEM ? " (its send queue is full)" : "");
	} else {
		/* Killed in order on the QP. Worn out, it is retired: on its allocation's list
		 * alone, deallocated with it, at mrd_window_qp_gone() or at close. */
		(void)u64_map_remove(&ow->bound, (uint64_t)rkey + 1);
		w->bound = false;
		if (w->binds < FRESH_BINDS)
			pool_put(ow, w);
		r = 0;
	}
	pthread_mutex_unlock(&ow->lock);
	return r;
}

/* Each window of the handle on qp (with its QP number; NULL: all), killed; how many. Lists
 * emptied stay in the map during the walk, and go after it. */
static int kill_on_qp(struct own_windows *ow, struct ibv_qp *qp)
{
	struct own_window *w, *next;
	struct u64_map kept = {};
	bool failed = false;
	int n = 0;

	for (size_t i = 0; i < ow->allocs.cap; i++) {
		struct own_alloc *a = ow->allocs.keys[i] ? ow->allocs.values[i] : NULL;

		for (w = a ? a->head : NULL; w; w = next) {
			next = w->alloc_next;
			if (!qp || (w->qp == qp && w->qp_num == qp->qp_num)) {
				window_kill_keep(ow, w, true);
				n++;
			}
		}
	}
	/* The lists left, into a map of their own (out of memory: the empty ones stay, which
	 * costs their memory alone). */
	for (size_t i = 0; i < ow->allocs.cap && !failed; i++) {
		struct own_alloc *a = ow->allocs.keys[i] ? ow->allocs.values[i] : NULL;

		if (a && a->head)
			failed = u64_map_put(&kept, a->start + 1, a) < 0;
	}
	if (failed) {
		u64_map_done(&kept);
		return n;
	}
	for (size_t i = 0; i < ow->allocs.cap; i++) {
		struct own_alloc *a = ow->allocs.keys[i] ? ow->allocs.values[i] : NULL;

		if (a && !a->head)
			free(a);
	}
	u64_map_done(&ow->allocs);
	ow->allocs = kept;
	return n;
}

int own_windows_qp_gone(struct mrd_client *client, void *qp_arg)
{
	struct own_windows *ow = __atomic_load_n(&client->own_windows, __ATOMIC_ACQUIRE);
	int n;

	if (client->forked)
		return client_forked_error(client);
	if (!ow || !qp_arg)
		return 0;
	pthread_mutex_lock(&ow->lock);
	n = kill_on_qp(ow, qp_arg);
	pthread_mutex_unlock(&ow->lock);
	return n;
}

bool own_windows_before_free(struct mrd_client *client, uint64_t addr)
{
	struct own_windows *ow;
	struct own_alloc *a;
	uintptr_t n;

	/* A fork() child's copy is its parent's: its free fails before asking (-ECHILD), and a
	 * lock another thread held at the fork would never be let go here. A handle bound to a
	 * PD may grant at any time: its first grant is refused over memory being freed too. */
	if (client->forked || client->bound_fd < 0)
		return false;
	ow = windows_of(client);
	if (!ow)
		return false; /* out of memory: no grant can make it either */
	pthread_mutex_lock(&ow->lock);
	/* Bound, or pooled or retired with an invalidate that ran (the program waited for a
	 * completion after its last grant and revoke over it, mrd_window_grant(3)): all die now,
	 * so that nothing reaches the pages once mrd has them (and mrd's dereg of the MR, which a
	 * bound window would refuse on rxe, goes through). */
	while ((a = u64_map_get(&ow->allocs, addr + 1)) && a->head)
		window_kill(ow, a->head);
	alloc_drop_if_empty(ow, a);
	/* Until mrd answered, grants over the memory are refused: frees of other memory, and
	 * grants, go on meanwhile. Out of memory for the mark: the lock stays held instead. */
	n = (uintptr_t)u64_map_remove(&ow->freeing, addr + 1);
	if (u64_map_put(&ow->freeing, addr + 1, (void *)(n + 1)) < 0)
		return true;
	pthread_mutex_unlock(&ow->lock);
	return false;
}

void own_windows_after_free(struct mrd_client *client, uint64_t addr, bool held)
{
	struct own_windows *ow = __atomic_load_n(&client->own_windows, __ATOMIC_ACQUIRE);
	uintptr_t n;

	if (held) {
		pthread_mutex_unlock(&ow->lock);
		return;
	}
	if (!ow || client->forked || client->bound_fd < 0)
		return;
	pthread_mutex_lock(&ow->lock);
	n = (uintptr_t)u64_map_remove(&ow->freeing, addr + 1);
	if (n > 1) /* another Free of it still under way (a slot was just freed: cannot fail) */
		(void)u64_map_put(&ow->freeing, addr + 1, (void *)(n - 1));
	pthread_mutex_unlock(&ow->lock);
}

void own_windows_close(struct mrd_client *client)
{
	struct own_windows *ow = client->own_windows;

	if (!ow)
		return;
	/* In a fork() child the windows are the parent's, and their records may be half
	 * changed by a thread of the parent: forgotten as they are. */
	if (client->forked) {
		client->own_windows = NULL;
		return;
	}
	(void)kill_on_qp(ow, NULL); /* every window is on a list: bound, pooled, retired (the
				    * last of a pool frees it) */
	for (size_t i = 0; i < ow->allocs.cap; i++)
		if (ow->allocs.keys[i])
			free(ow->allocs.values[i]); /* emptied, kept by an allocation failure */
	u64_map_done(&ow->allocs);
	u64_map_done(&ow->pools);
	u64_map_done(&ow->freeing);
	u64_map_done(&ow->bound);
	u64_map_done(&ow->extents);
	mrd_cache_free(ow->keys);
	pthread_mutex_destroy(&ow->lock);
	free(ow);
	client->own_windows = NULL;
}

#endif
