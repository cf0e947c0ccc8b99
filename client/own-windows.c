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

int own_window_grant(struct mrd_client *client, void *qp, const void *addr, size_t len,
		     unsigned access, uint32_t *rkey)
{
	(void)client, (void)qp, (void)addr, (void)len, (void)access, (void)rkey;
	return set_last_error(-EOPNOTSUPP, "mrd_window_grant: this libmrd was built without "
			      "<infiniband/verbs.h>: no windows on the program's own QP");
}

int own_window_revoke(struct mrd_client *client, void *qp, uint32_t rkey)
{
	(void)client, (void)qp, (void)rkey;
	return set_last_error(-EOPNOTSUPP, "mrd_window_revoke: this libmrd was built without "
			      "<infiniband/verbs.h>: no windows on the program's own QP");
}

void own_windows_before_free(struct mrd_client *client, uint64_t addr)
{
	(void)client, (void)addr;
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

/* A type-2 window's key byte has 256 values: a window is deallocated after 256 binds, so that
 * no rkey it gave comes back (as mrd's own pool, mw-grants.c). */
#define FRESH_BINDS 256
#define POOL_MAX 64          /* unbound windows kept for the next grants */
#define EXTENTS_MAX 4096     /* MRs whose allocation a grant remembers */

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
	bool linked;       /* on alloc's list */
	uint64_t alloc;    /* the allocation of its last bind: its free deallocates it */
	struct own_window *alloc_prev, *alloc_next;
};

struct own_windows {
	pthread_mutex_t lock;
	mrd_cache *keys;         /* the bound PD's MRs that grants found: lkeys to bind over */
	unsigned epoch;          /* the handle's reconnects when keys was filled */
	struct u64_map extents;  /* an MR's start + 1 -> its allocation's start */
	struct u64_map bound;    /* rkey + 1 -> bound window */
	struct u64_map by_alloc; /* allocation start + 1 -> first window of its list */
	struct own_window *pool[POOL_MAX];
	size_t n_pool;
};

static unsigned ibv_access_of(unsigned access)
{
	return (access & MRD_WINDOW_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (access & MRD_WINDOW_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (access & MRD_WINDOW_REMOTE_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

static void alloc_link(struct own_windows *ow, struct own_window *w, uint64_t alloc)
{
	struct own_window *head = u64_map_remove(&ow->by_alloc, alloc + 1);

	w->alloc = alloc;
	w->linked = true;
	w->alloc_prev = NULL;
	w->alloc_next = head;
	if (head)
		head->alloc_prev = w;
	if (u64_map_put(&ow->by_alloc, alloc + 1, w) < 0)
		abort(); /* a slot was just freed */
}

static void alloc_unlink(struct own_windows *ow, struct own_window *w)
{
	if (!w->linked)
		return;
	w->linked = false;
	if (w->alloc_next)
		w->alloc_next->alloc_prev = w->alloc_prev;
	if (w->alloc_prev) {
		w->alloc_prev->alloc_next = w->alloc_next;
	} else {
		(void)u64_map_remove(&ow->by_alloc, w->alloc + 1);
		if (w->alloc_next && u64_map_put(&ow->by_alloc, w->alloc + 1, w->alloc_next) < 0)
			abort();
	}
	w->alloc_prev = w->alloc_next = NULL;
}

/* Kills the window at once (the kernel's dealloc: no work request, no QP, no wait) and
 * forgets it. */
static void window_kill(struct own_windows *ow, struct own_window *w, bool calls)
{
	alloc_unlink(ow, w);
	if (w->bound)
		(void)u64_map_remove(&ow->bound, (uint64_t)w->rkey + 1);
	if (calls)
		(void)ibv_dealloc_mw(w->mw);
	free(w);
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
		ow = calloc(1, sizeof(*ow));
		if (ow && mrd_cache_new(client, &ow->keys) < 0) {
			free(ow);
			ow = NULL;
		}
		if (ow) {
			pthread_mutex_init(&ow->lock, NULL);
			ow->epoch = client->epoch;
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
	const Mrd__WindowGrantResponse *a;
	Mrd__Response *resp;
	int r;

	if (ow->epoch != client->epoch || !ow->keys) { /* another mrd: its keys, its MRs */
		if ((r = forget_mrs(client, ow)) < 0)
			return r;
		ow->epoch = client->epoch;
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
		return r; /* forgotten: the next grant over them asks again */
	(void)u64_map_remove(&ow->extents, (uint64_t)ret->start + 1);
	if ((r = u64_map_put(&ow->extents, (uint64_t)ret->start + 1,
			     (void *)(uintptr_t)*ret_alloc)) < 0)
		return set_last_error(r, "out of memory");
	cache_insert(ow->keys, ret, true);
	return 0;
}

/* A window for a bind on qp: the pool's last one invalidated on qp, else a new one. */
static struct own_window *take_window(struct own_windows *ow, struct ibv_qp *qp)
{
	struct own_window *w;

	for (size_t i = ow->n_pool; i-- > 0;) {
		w = ow->pool[i];
		if (w->qp == qp && w->qp_num == qp->qp_num) {
			ow->pool[i] = ow->pool[--ow->n_pool];
			alloc_unlink(ow, w);
			return w;
		}
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
	return w;
}

int own_window_grant(struct mrd_client *client, void *qp_arg, const void *addr, size_t len,
		     unsigned access, uint32_t *rkey)
{
	struct ibv_qp *qp = qp_arg;
	struct own_windows *ow;
	struct own_window *w;
	struct ibv_send_wr wr, *bad;
	struct ibv_mr mr;
	struct mrd_keys k;
	uint64_t alloc = 0;
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
	w = take_window(ow, qp);
	if (!w) {
		r = set_last_error(-errno, "mrd_window_grant: ibv_alloc_mw of a type-2 window: %s",
				   errno == EOPNOTSUPP ? "the device has no memory windows" :
				   strerror(errno));
		goto out;
	}
	/* libibverbs leaves it to the caller to follow a type-2 bind's key (rxe_bind_mw refuses a
	 * bind whose mw_rkey is not the window's current key); a bind names the MR by its lkey
	 * alone (librxe convert_send_wr, mlx5 set_umr_data_seg), which mrd made in this PD. */
	fresh = ibv_inc_rkey(w->mw->rkey);
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
	if (r != 0) { /* nothing posted; the window (on no list now) goes */
		(void)ibv_dealloc_mw(w->mw);
		free(w);
		r = set_last_error(-r, "mrd_window_grant: posting the bind on the QP: %s%s",
				   strerror(r), r == ENOMEM ? " (its send queue is full)" : "");
		goto out;
	}
	w->mw->rkey = fresh;
	w->rkey = fresh;
	w->qp = qp;
	w->qp_num = qp->qp_num;
	w->binds++;
	w->bound = true;
	alloc_link(ow, w, alloc);
	if ((r = u64_map_put(&ow->bound, (uint64_t)fresh + 1, w)) < 0) {
		w->bound = false;
		window_kill(ow, w, true);
		r = set_last_error(r, "out of memory");
		goto out;
	}
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
	} else {
		/* A QP in RTS runs the invalidate in order; any other (the program moved it to the
		 * error state, or reset it) would flush it unrun: the window dies by dealloc. A
		 * worn window too, and one the pool has no room for. */
		bool keep = qp->state == IBV_QPS_RTS && w->binds < FRESH_BINDS &&
			    ow->n_pool < POOL_MAX;

		if (keep && ibv_post_send(qp, &wr, &bad) != 0)
			keep = false;
		if (keep) {
			(void)u64_map_remove(&ow->bound, (uint64_t)rkey + 1);
			w->bound = false;
			ow->pool[ow->n_pool++] = w;
		} else {
			window_kill(ow, w, true);
		}
		r = 0;
	}
	pthread_mutex_unlock(&ow->lock);
	return r;
}

void own_windows_before_free(struct mrd_client *client, uint64_t addr)
{
	struct own_windows *ow = __atomic_load_n(&client->own_windows, __ATOMIC_ACQUIRE);
	struct own_window *w;

	if (!ow)
		return;
	pthread_mutex_lock(&ow->lock);
	/* Bound, or in the pool with an invalidate that may not have run yet: both die now, so
	 * that nothing reaches the pages once mrd has them (and mrd's dereg of the MR, which a
	 * bound window would refuse on rxe, goes through). */
	while ((w = u64_map_get(&ow->by_alloc, addr + 1))) {
		if (!w->bound)
			for (size_t i = 0; i < ow->n_pool; i++)
				if (ow->pool[i] == w) {
					ow->pool[i] = ow->pool[--ow->n_pool];
					break;
				}
		window_kill(ow, w, !client->forked);
	}
	pthread_mutex_unlock(&ow->lock);
}

void own_windows_close(struct mrd_client *client)
{
	struct own_windows *ow = client->own_windows;

	struct own_window *w, *next;

	if (!ow)
		return;
	/* Every window is on its allocation's list; the lists are taken out of the map first,
	 * which each kill would reshape. */
	for (size_t i = 0; i < ow->by_alloc.cap; i++) {
		if (!ow->by_alloc.keys[i])
			continue;
		w = ow->by_alloc.values[i];
		ow->by_alloc.values[i] = NULL;
		for (; w; w = next) {
			next = w->alloc_next;
			w->linked = false;
			window_kill(ow, w, !client->forked);
		}
	}
	u64_map_done(&ow->by_alloc);
	u64_map_done(&ow->bound);
	u64_map_done(&ow->extents);
	mrd_cache_free(ow->keys);
	pthread_mutex_destroy(&ow->lock);
	free(ow);
	client->own_windows = NULL;
}

#endif
