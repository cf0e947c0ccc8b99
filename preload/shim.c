/* SPDX-License-Identifier: MIT */
/* libmrd-preload.so: LD_PRELOAD=libmrd-preload.so PROGRAM serves an unmodified verbs program's
 * memory registrations through mrd. Each ibv_reg_mr (every form reaches ibv_reg_mr_iova2 in
 * rdma-core 44: the others tail-call it through the PLT) moves the buffer's pages onto mrd's
 * memory at the same address (moved-range.h), and mrd registers them in the program's own PD
 * (BindPd, one mrd connection per PD): the program needs no RLIMIT_MEMLOCK. The MR handed back
 * is the shim's own, in libibverbs' verbs_mr layout; ibv_dereg_mr of it keeps it for a later
 * registration of the same buffer (a hit: no request) until the buffer is freed or unmapped,
 * which free(), realloc(), munmap(), mremap() and mmap() tell. What cannot be moved falls through to
 * the real call, said once on stderr. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <mrd/mrd-verbs.h>
#include <mrd/mrd.h>

#include "client/moved-range.h"
#include "preload/window-binder.h"

#define EXPORT __attribute__((visibility("default")))

/* libibverbs' struct verbs_mr (driver.h): it reads mr_type and access behind the ibv_mr of
 * any MR a program hands it. */
struct shim_mr {
	struct ibv_mr ibv;
	int mr_type; /* IBV_MR_TYPE_MR */
	int verbs_access;
	struct moved_range *range; /* NULL: inner stands in, or it died in a failed rereg */
	unsigned span;             /* its buffer's span of range */
	struct ibv_mr *inner; /* libibverbs' MR in its place, after a rereg mrd could not serve */
	unsigned access; /* as the program asked */
	struct ibv_mw *mw; /* the window whose rkey the program holds, bound while it lives */
	bool kept;       /* deregistered by the program, kept for a hit */
	struct shim_mr *hash_next;
	struct shim_mr *kept_prev, *kept_next; /* newest first */
};

/* An mrd connection bound to one of the program's PDs. */
struct shim_pd {
	struct shim_pd *next;
	struct ibv_pd *pd;
	mrd_client *client;
	int error; /* binding failed: that PD's registrations fall through */
	struct window_binder *binder; /* the PD's windows (window-binder.h), once one was asked */
	int binder_error;             /* none can be had: rkeys are the MRs' own */
};

/* An MR libibverbs made for the program (a fall-through): it pins the pages under it as they
 * are, so the shim neither moves them nor moves them back while it lives. */
struct own_mr {
	struct own_mr *next;
	const struct ibv_mr *mr;
	uintptr_t start, end; /* its pages */
};

#define HASH_SIZE 1024

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* This thread is inside the shim: what it calls (libmrd's free, munmap) passes straight on. */
static __thread unsigned inside __attribute__((tls_model("initial-exec")));
static bool enabled = true;
/* MRD_PRELOAD_WINDOWS: whose rkeys the program gets, and until when (window-binder.h). mrd
 * deallocates the windows of a program killed with them bound (the binder tracks them:
 * mrd_window_track), so none keeps mrd's MR under it. */
static enum {
	WINDOWS_OFF,        /* the MRs' own, alive until the buffer goes */
	WINDOWS_TILL_FREE,  /* windows', bound while the registration is live or kept (default) */
	WINDOWS_TILL_DEREG, /* windows', unbound at ibv_dereg_mr */
} windows = WINDOWS_TILL_FREE;
static bool forked; /* a fork() child: the parent's QPs are not its to post on */
static int log_level = 1;
static unsigned keep_max = 256;
static struct moved_ranges ranges;
static mrd_client *mem; /* the connection that owns the moved memory */
static int mem_error;
static struct shim_pd *pds;
static struct own_mr *own_mrs;
static struct shim_mr *by_address[HASH_SIZE];
static struct shim_mr *kept_head, *kept_tail;
static unsigned n_kept;
static unsigned long n_served, n_hits, n_passed;

static struct ibv_mr *(*real_reg)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int);
static int (*real_dereg)(struct ibv_mr *);
static int (*real_rereg)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
static int (*real_dealloc_pd)(struct ibv_pd *);
static struct binder_verbs binder_verbs;
extern void __libc_free(void *);
extern void *__libc_realloc(void *, size_t);
static void (*real_free)(void *);
static void *(*real_realloc)(void *, size_t);
static size_t (*real_usable_size)(void *);
static bool glibc_malloc;
/* The C library's mmap, munmap and mremap: the program's calls go on to them, not straight to
 * the kernel, because libraries hook them to learn of unmaps (libfabric's memhooks monitor and
 * UCX's UCM patch their code; an MR cache that missed an munmap hands a buffer mapped again at
 * that address its dead registration). The system call itself until the constructor ran. */
static void *(*next_mmap)(void *, size_t, int, int, int, off_t);
static int (*next_munmap)(void *, size_t);
static void *(*next_mremap)(void *, size_t, size_t, int, ...);

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char line[768]; /* a fall-through: the buffer, and why (512) */
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, "libmrd-preload: ", 16);
	(void)!write(STDERR_FILENO, line, (size_t)n);
}

/* Once per call site at the default level, every time at 2. */
#define SAY_ONCE(...)                                                                        \
	do {                                                                                 \
		static bool said_;                                                           \
		if (log_level >= 2 || (log_level == 1 && !said_))                            \
			say(__VA_ARGS__);                                                    \
		said_ = true;                                                                \
	} while (0)

/* A libibverbs function, also where the program loaded libibverbs itself with dlopen() (its
 * local scope is no part of RTLD_NEXT's). */
static void *verbs_symbol(const char *name, const char *version)
{
	void *f = dlvsym(RTLD_NEXT, name, version);

	if (!f) {
		void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);

		if (h) {
			f = dlvsym(h, name, version);
			dlclose(h);
		}
	}
	return f;
}

static void resolve_verbs(void)
{
	if (!real_reg)
		real_reg = verbs_symbol("ibv_reg_mr_iova2", "IBVERBS_1.8");
	if (!real_dereg)
		real_dereg = verbs_symbol("ibv_dereg_mr", "IBVERBS_1.1");
	if (!real_rereg)
		real_rereg = verbs_symbol("ibv_rereg_mr", "IBVERBS_1.1");
	if (!real_dealloc_pd)
		real_dealloc_pd = verbs_symbol("ibv_dealloc_pd", "IBVERBS_1.1");
	if (!binder_verbs.destroy_qp) {
		struct binder_verbs *v = &binder_verbs;

		v->query_device = verbs_symbol("ibv_query_device", "IBVERBS_1.1");
		v->query_port = verbs_symbol("ibv_query_port", "IBVERBS_1.1");
		v->query_gid = verbs_symbol("ibv_query_gid", "IBVERBS_1.1");
		v->create_cq = verbs_symbol("ibv_create_cq", "IBVERBS_1.1");
		v->destroy_cq = verbs_symbol("ibv_destroy_cq", "IBVERBS_1.1");
		v->create_qp = verbs_symbol("ibv_create_qp", "IBVERBS_1.1");
		v->modify_qp = verbs_symbol("ibv_modify_qp", "IBVERBS_1.1");
		v->destroy_qp = verbs_symbol("ibv_destroy_qp", "IBVERBS_1.1");
	}
}

/* A pthread_cancel() acts nowhere inside: the thread would end holding the lock (the shim's
 * reads of /proc and libmrd's socket calls are cancellation points; free() must not become
 * one). The lock is no recursive one: enter() never nests. */
static __thread int cancel_state;

static void enter(void)
{
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	pthread_mutex_lock(&lock);
	inside++;
}

static void leave(void)
{
	inside--;
	pthread_mutex_unlock(&lock);
	pthread_setcancelstate(cancel_state, NULL);
}

/* Whether [start, end) may touch a moved range: a look without the lock. */
static bool near_ranges(uintptr_t start, uintptr_t end)
{
	return start < __atomic_load_n(&ranges.hi, __ATOMIC_ACQUIRE) &&
	       __atomic_load_n(&ranges.lo, __ATOMIC_ACQUIRE) < end;
}

static size_t hash_of(const struct ibv_mr *mr)
{
	return ((uintptr_t)mr >> 4) % HASH_SIZE;
}

static void hash_add(struct shim_mr *m)
{
	size_t h = hash_of(&m->ibv);

	m->hash_next = by_address[h];
	by_address[h] = m;
}

static void hash_remove(struct shim_mr *m)
{
	for (struct shim_mr **p = &by_address[hash_of(&m->ibv)]; *p; p = &(*p)->hash_next)
		if (*p == m) {
			*p = m->hash_next;
			return;
		}
}

static struct shim_mr *ours(const struct ibv_mr *mr)
{
	for (struct shim_mr *m = by_address[hash_of(mr)]; m; m = m->hash_next)
		if (&m->ibv == mr)
			return m;
	return NULL;
}

static void kept_unlink(struct shim_mr *m)
{
	if (m->kept_prev)
		m->kept_prev->kept_next = m->kept_next;
	else
		kept_head = m->kept_next;
	if (m->kept_next)
		m->kept_next->kept_prev = m->kept_prev;
	else
		kept_tail = m->kept_prev;
	m->kept_prev = m->kept_next = NULL;
	m->kept = false;
	n_kept--;
}

static uintptr_t page_down(uintptr_t a)
{
	return a & ~((uintptr_t)sysconf(_SC_PAGESIZE) - 1);
}

static uintptr_t page_up(uintptr_t a)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

	return (a + page - 1) & ~(page - 1);
}

static bool own_pinned(uintptr_t start, uintptr_t end)
{
	for (const struct own_mr *o = own_mrs; o; o = o->next)
		if (o->start < end && start < o->end)
			return true;
	return false;
}

#define REMOTE_ACCESS \
	(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static bool binder_verbs_resolved(void)
{
	const struct binder_verbs *v = &binder_verbs;

	return v->query_device && v->query_port && v->query_gid && v->create_cq &&
	       v->destroy_cq && v->create_qp && v->modify_qp && v->destroy_qp;
}

/* The binder's windows in mrd's record of p's connection (mrd_window_track(3)). */
static int track(void *data, uint32_t handle)
{
	return mrd_window_track(((struct shim_pd *)data)->client, handle);
}

static int untrack(void *data, uint32_t handle)
{
	return mrd_window_untrack(((struct shim_pd *)data)->client, handle);
}

/* m's rkey becomes a window's over its bytes, where p's device has windows: one that dies
 * with ibv_dereg_mr (window-binder.h). Where none can be had, the MR's own stays, which
 * lives until the buffer is freed, and the shim says so once. */
static void give_window(struct shim_pd *p, struct shim_mr *m, uint32_t mr_rkey)
{
	char why[256] = "";
	struct ibv_mw *mw;
	int k;

	m->ibv.rkey = mr_rkey;
	m->mw = NULL;
	if (windows == WINDOWS_OFF || !(m->access & REMOTE_ACCESS) || p->binder_error)
		return;
	if (!p->binder) {
		struct binder_tracking t = { track, untrack, p };

		k = binder_verbs_resolved() ?
			    window_binder_new(&binder_verbs, &t, p->pd, &p->binder, why,
					      sizeof(why)) : -ENOSYS;
		if (k == -ENOSYS)
			snprintf(why, sizeof(why), "libibverbs lacks a call the binder needs");
		if (k < 0) {
			p->binder_error = k;
			SAY_ONCE("PD %p of %s: rkeys are the MRs' own, and live until the buffer is "
				 "freed, not just deregistered: %s", (void *)p->pd,
				 p->pd->context->device->name, why);
			return;
		}
	}
	k = window_binder_bind(p->binder, m->ibv.lkey, m->ibv.addr, m->ibv.length, m->access,
			       &mw, why, sizeof(why));
	if (k < 0) {
		SAY_ONCE("%p+%zu: its rkey is the MR's own, and lives until the buffer is freed: "
			 "%s", m->ibv.addr, m->ibv.length, why);
		return;
	}
	m->mw = mw;
	m->ibv.rkey = mw->rkey;
}

/* m's window's rkey dies before this returns (the program deregistered m, or its pages go). */
static void end_window(struct shim_mr *m)
{
	struct shim_pd *p;
	int k;

	if (!m->mw || forked) {
		m->mw = NULL;
		return;
	}
	for (p = pds; p && p->pd != m->ibv.pd; p = p->next)
		;
	/* A bound window is always its PD's binder's (ibv_dealloc_pd refuses while m lives). */
	k = window_binder_unbind(p->binder, m->mw);
	if (k < 0)
		SAY_ONCE("%p+%zu: its window's unbind failed (%s): deallocated instead",
			 m->ibv.addr, m->ibv.length, strerror(-k));
	m->mw = NULL;
}

/* The live registrations over r lose their windows: r's MRs are about to go. */
static void end_windows_over(const struct moved_range *r)
{
	for (size_t h = 0; h < HASH_SIZE; h++)
		for (struct shim_mr *m = by_address[h]; m; m = m->hash_next)
			if (m->range == r && !m->kept)
				end_window(m);
}

/* Pages go back to private memory unless an MR of the program's own pins them as they are
 * (then they stay mrd's, idle, until it goes). */
static void go_back(struct moved_range *r)
{
	if (!own_pinned(r->start, r->end))
		moved_range_move_back(&ranges, mem, r);
}

/* A range nobody registers any more goes back to the program's private memory, and mrd's
 * memory (with every MR and key over it) with it. */
static void settle(struct moved_range *r)
{
	if (r->gone)
		moved_range_put(r);
	else if (r->live == 0 && r->kept == 0)
		go_back(r);
}

static int own_add(const struct ibv_mr *mr)
{
	struct own_mr *o = malloc(sizeof(*o));

	if (!o)
		return -ENOMEM;
	*o = (struct own_mr){ own_mrs, mr, page_down((uintptr_t)mr->addr),
			      page_up((uintptr_t)mr->addr + mr->length) };
	own_mrs = o;
	return 0;
}

static void settle_one(struct moved_range *r, void *arg)
{
	(void)arg;
	settle(r);
}

/* The program's own MR mr is over other pages now (a rereg): the new ones are held first,
 * then what was idle under the old ones may go back. */
static void own_moved(const struct ibv_mr *mr)
{
	for (struct own_mr *o = own_mrs; o; o = o->next)
		if (o->mr == mr) {
			uintptr_t s = o->start, e = o->end;

			o->start = page_down((uintptr_t)mr->addr);
			o->end = page_up((uintptr_t)mr->addr + mr->length);
			moved_ranges_each_overlapping(&ranges, s, e, settle_one, NULL);
			return;
		}
}

/* The program's own MR mr is gone: idle ranges under it may go back now. */
static void own_remove(const struct ibv_mr *mr)
{
	for (struct own_mr **p = &own_mrs; *p; p = &(*p)->next)
		if ((*p)->mr == mr) {
			struct own_mr *o = *p;

			*p = o->next;
			moved_ranges_each_overlapping(&ranges, o->start, o->end, settle_one, NULL);
			free(o);
			return;
		}
}

/* Span of r lost a registration: with none left, its buffer was freed, and another buffer
 * there must not get its keys (they reach all its bytes): it goes, unless r goes whole. */
static void span_unused(struct moved_range *r, unsigned span)
{
	char why[256] = "";

	/* No connection (a fork()ed child: the parent's is not its to use), or the range goes
	 * back with every MR over it; but one an MR of the program's own holds stays mrd's. */
	if (--r->spans[span].users > 0 || r->gone || !mem ||
	    (r->live == 0 && r->kept == 0 && !own_pinned(r->start, r->end)))
		return;
	if (moved_range_drop_span(mem, r, span, why, sizeof(why)) < 0)
		SAY_ONCE("a freed buffer's span stays in mrd (no buffer there is served): %s", why);
}

/* A kept registration goes: its buffer was freed, or the shim keeps too many. */
static void release_kept(struct shim_mr *m, bool settle_range)
{
	struct moved_range *r = m->range;
	unsigned span = m->span;

	kept_unlink(m);
	hash_remove(m);
	end_window(m); /* MRD_PRELOAD_WINDOWS=free: its rkey dies here, before mrd's MR can */
	free(m);
	r->kept--;
	span_unused(r, span);
	if (settle_range)
		settle(r);
}

static void keep(struct shim_mr *m)
{
	m->kept = true;
	m->kept_prev = NULL;
	m->kept_next = kept_head;
	if (kept_head)
		kept_head->kept_prev = m;
	kept_head = m;
	if (!kept_tail)
		kept_tail = m;
	n_kept++;
	m->range->kept++;
	while (n_kept > keep_max)
		release_kept(kept_tail, true);
}

/* The kept registrations over r (all, or those touching [start, end)) go, without settling
 * r: the caller decides what becomes of it. */
static void release_kept_over(const struct moved_range *r, uintptr_t start, uintptr_t end)
{
	struct shim_mr *m = kept_head, *next;

	for (; m; m = next) {
		uintptr_t s = (uintptr_t)m->ibv.addr, e = s + m->ibv.length;

		next = m->kept_next;
		if (m->range == r && s < end && start < e)
			release_kept(m, false);
	}
}

/* The program no longer maps [start, end) of r as mrd's pages (unmapped, or its page tables
 * show something else): the kept registrations there are dead, and so is the range once it
 * has no registration left; with live ones, what it still maps stays mrd's. */
static void lost(struct moved_range *r, uintptr_t start, uintptr_t end)
{
	release_kept_over(r, start, end);
	if (start <= r->start && r->end <= end) {
		end_windows_over(r); /* a window bound to an MR keeps it from its dereg (rxe) */
		moved_range_forget(&ranges, mem, r);
	} else if (r->live == 0 && r->kept == 0) {
		go_back(r);
	}
}

/* The buffer [start, end) a registration asks for, and the ranges it touches that the program
 * no longer maps as mrd's pages. */
struct overlap_walk {
	uintptr_t start, end;
	unsigned n_unmapped;
};

static bool overlap_intact(struct moved_range *r, const struct overlap_walk *w)
{
	return moved_range_intact(r, w->start > r->start ? w->start : r->start,
				  w->end < r->end ? w->end : r->end);
}

static void let_go_if_unmapped(struct moved_range *r, void *arg)
{
	struct overlap_walk *w = arg;

	if (!overlap_intact(r, w)) {
		w->n_unmapped++;
		lost(r, w->start, w->end);
	}
}

static void count_unmapped(struct moved_range *r, void *arg)
{
	struct overlap_walk *w = arg;

	w->n_unmapped += !overlap_intact(r, w);
}

static struct shim_pd *pd_of(struct ibv_pd *pd)
{
	struct shim_pd *p;
	int k;

	for (p = pds; p; p = p->next)
		if (p->pd == pd)
			return p;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->pd = pd;
	k = mrd_client_connect(NULL, &p->client);
	if (k == 0) {
		k = mrd_verbs_bind_pd(p->client, pd);
		if (k < 0)
			p->client = mrd_client_close(p->client);
	}
	if (k < 0) {
		p->error = k;
		SAY_ONCE("PD %p of %s: registrations fall through to libibverbs: %s",
			 (void *)pd, pd->context->device->name, mrd_last_error());
	}
	p->next = pds;
	pds = p;
	return p;
}

static int keys_of(struct moved_range *r, unsigned span, struct shim_pd *p,
		   struct range_keys **ret, char *why, size_t why_size)
{
	const struct range_span *b = &r->spans[span];
	struct range_keys *k;
	struct mrd_keys keys;
	int e;

	for (k = r->keys; k; k = k->next)
		if (k->pd == p->pd && k->span == span) {
			*ret = k;
			return 0;
		}
	/* The buffer's bytes in mrd's view: all the span's MR covers. */
	uintptr_t lo = r->window + (b->start - r->start), hi = lo + (b->end - b->start);

	e = mrd_keys_query(p->client, (void *)lo, &keys);
	if (e < 0) {
		snprintf(why, why_size, "mrd gave no keys: %s", mrd_last_error());
		return e;
	}
	if (keys.start > lo || keys.end < hi) {
		/* [cache] policy = page: an MR per page, and an ibv_mr needs one over all. */
		snprintf(why, why_size, "mrd's MR covers [0x%" PRIxPTR ", 0x%" PRIxPTR ") of [0x%"
			 PRIxPTR ", 0x%" PRIxPTR ") (policy page?)", keys.start, keys.end, lo, hi);
		return -EOPNOTSUPP;
	}
	k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	*k = (struct range_keys){ r->keys, p->pd, span, keys.lkey, keys.rkey };
	r->keys = k;
	*ret = k;
	return 0;
}

/* A kept registration of exactly this buffer whose pages are still mrd's. */
static struct shim_mr *kept_hit(struct ibv_pd *pd, void *addr, size_t length, unsigned access,
				uintptr_t start, uintptr_t end)
{
	for (struct shim_mr *m = kept_head; m; m = m->kept_next) {
		if (m->ibv.pd != pd || m->ibv.addr != addr || m->ibv.length != length ||
		    m->access != access)
			continue;
		if (!moved_range_intact(m->range, start, end)) {
			lost(m->range, start, end);
			return NULL;
		}
		kept_unlink(m);
		m->range->kept--;
		m->range->live++;
		return m;
	}
	return NULL;
}

/* What mrd registers for a program: its four access bits, no more (no zero-based, MW bind or
 * on-demand: those fall through). Optional bits (relaxed ordering) are hints. */
#define SERVED_ACCESS \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
	 IBV_ACCESS_REMOTE_ATOMIC)

static int serve(struct ibv_pd *pd, void *addr, size_t length, unsigned access,
		 struct shim_mr **ret, char *why, size_t why_size)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start, end;
	struct moved_range *r;
	struct range_keys *keys;
	struct shim_pd *p;
	struct shim_mr *m;
	unsigned n;
	int k, span;

	access &= ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE;
	if (access & ~SERVED_ACCESS) {
		snprintf(why, why_size, "access 0x%x: mrd registers local write, remote write, "
			 "read and atomics alone", access);
		return -EOPNOTSUPP;
	}
	if (!addr || !length || length > UINTPTR_MAX - 2 * page ||
	    (uintptr_t)addr > UINTPTR_MAX - 2 * page - length) {
		snprintf(why, why_size, "no range to register (%p, %zu bytes)", addr, length);
		return -EINVAL;
	}
	start = page_down((uintptr_t)addr);
	end = page_up((uintptr_t)addr + length);
	p = pd_of(pd);
	if (!p)
		return -ENOMEM;
	if (p->error) {
		snprintf(why, why_size, "the PD is not bound to mrd: %s", strerror(-p->error));
		return p->error;
	}
	m = kept_hit(pd, addr, length, access, start, end);
	if (m) {
		struct range_keys *held;

		/* MRD_PRELOAD_WINDOWS=free kept its window bound; else the MR's rkey, or a new
		 * window over it (keys_of: the range's keys for the PD, asked of mrd once). */
		if (!m->mw && keys_of(m->range, m->span, p, &held, why, why_size) == 0)
			give_window(p, m, held->rkey);
		n_hits++;
		*ret = m;
		return 0;
	}
	/* Each range it touches, not just the first: a program can unmap them behind the
	 * shim's back (libfabric's memhooks call the kernel's munmap themselves). */
	struct overlap_walk w = { start, end, 0 };

	moved_ranges_each_overlapping(&ranges, start, end, let_go_if_unmapped, &w);
	if (w.n_unmapped) {
		w.n_unmapped = 0;
		moved_ranges_each_overlapping(&ranges, start, end, count_unmapped, &w);
		if (w.n_unmapped) {
			/* Still there: a live registration holds it. */
			snprintf(why, why_size, "its pages were unmapped or replaced under a live "
				 "registration");
			return -EOPNOTSUPP;
		}
	}
	r = moved_ranges_overlapping(&ranges, start, end, &n);
	if (n > 1) {
		/* Its MR would span two of mrd's allocations. */
		snprintf(why, why_size, "its pages hold parts of %u buffers registered before", n);
		return -EOPNOTSUPP;
	}
	span = r ? moved_range_span_of(r, (uintptr_t)addr, (uintptr_t)addr + length) : 0;
	if ((!r || span < 0) && own_pinned(start, end)) {
		/* Pages it would move: libibverbs pins them as they are. */
		snprintf(why, why_size, "its pages are under an MR libibverbs made for the program");
		return -EOPNOTSUPP;
	}
	if (r && r->access != access) {
		snprintf(why, why_size, "its pages are registered with access 0x%x already",
			 r->access);
		return -EOPNOTSUPP;
	}
	if (span < 0) {
		/* A heap neighbour of r's buffers: a span of its own over r's allocation, which
		 * grows onto its other pages. */
		unsigned u;

		k = moved_range_add_span(&ranges, mem, r, (uintptr_t)addr, (uintptr_t)addr + length,
					 &u, why, why_size);
		if (k < 0)
			return k;
		span = (int)u;
	}
	if (!r) {
		if (!mem && !mem_error) {
			mem_error = mrd_client_connect(NULL, &mem);
			if (mem_error)
				SAY_ONCE("no mrd (%s): registrations fall through to libibverbs",
					 mrd_last_error());
		}
		if (mem_error) {
			snprintf(why, why_size, "no mrd: %s", strerror(-mem_error));
			return mem_error;
		}
		k = moved_range_move(&ranges, mem, (uintptr_t)addr, (uintptr_t)addr + length,
				     access, &r, why, why_size);
		if (k < 0)
			return k;
	}
	m = calloc(1, sizeof(*m));
	k = m ? keys_of(r, (unsigned)span, p, &keys, why, why_size) : -ENOMEM;
	if (k < 0) {
		free(m);
		/* A span nobody registers (just added) goes as a freed buffer's does. */
		if (r->spans[span].users == 0) {
			r->spans[span].users++;
			span_unused(r, (unsigned)span);
		}
		settle(r);
		return k;
	}
	m->ibv = (struct ibv_mr){ .context = pd->context, .pd = pd, .addr = addr,
				  .length = length, .lkey = keys->lkey, .rkey = keys->rkey };
	m->mr_type = 0; /* IBV_MR_TYPE_MR */
	m->verbs_access = (int)access;
	m->range = r;
	m->span = (unsigned)span;
	m->access = access;
	give_window(p, m, keys->rkey);
	r->live++;
	r->spans[span].users++;
	hash_add(m);
	n_served++;
	*ret = m;
	return 0;
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
				       uint64_t iova, unsigned int access)
{
	struct shim_mr *m = NULL;
	struct ibv_mr *real;
	char why[512] = ""; /* mrd's reply (256) and what the shim puts before it */
	int k = -EOPNOTSUPP;

	resolve_verbs();
	if (!real_reg) {
		errno = ENOSYS;
		return NULL;
	}
	if (!enabled || inside || !pd)
		return real_reg(pd, addr, length, iova, access);
	if (iova != (uintptr_t)addr)
		snprintf(why, sizeof(why), "iova 0x%" PRIx64 " is not the address", iova);
	else {
		enter();
		k = serve(pd, addr, length, access, &m, why, sizeof(why));
		leave();
	}
	if (k == 0) {
		if (log_level >= 2)
			say("%p+%zu: lkey 0x%x rkey 0x%x through mrd", addr, length, m->ibv.lkey,
			    m->ibv.rkey);
		return &m->ibv;
	}
	__atomic_add_fetch(&n_passed, 1, __ATOMIC_RELAXED);
	SAY_ONCE("%p+%zu falls through to libibverbs: %s", addr, length, why);
	enter();
	real = real_reg(pd, addr, length, iova, access);
	if (real && own_add(real) < 0) {
		/* Unrecorded, its pages could move under it: none at all rather. */
		real_dereg(real);
		real = NULL;
		errno = ENOMEM;
	}
	leave();
	return real;
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct shim_mr *m;
	struct moved_range *r;

	resolve_verbs();
	if (!real_dereg)
		return ENOSYS;
	if (!mr || inside)
		return real_dereg(mr);
	enter();
	m = ours(mr);
	if (!m) {
		/* libibverbs' own: once it is gone, the pages under it are free to go back. */
		int k = real_dereg(mr);

		if (k == 0)
			own_remove(mr);
		leave();
		return k;
	}
	if (m->kept) {
		leave();
		return EINVAL; /* deregistered twice: libibverbs' answer to a dead MR */
	}
	r = m->range;
	if (!r) { /* libibverbs' MR in its place, or dead since a failed rereg */
		int k = m->inner ? real_dereg(m->inner) : 0;

		if (k == 0) {
			if (m->inner)
				own_remove(m->inner);
			hash_remove(m);
			free(m);
		}
		leave();
		return k;
	}
	r->live--;
	if (enabled && !r->gone && keep_max > 0) {
		if (windows != WINDOWS_TILL_FREE)
			end_window(m); /* its rkey dies here, as libibverbs' would */
		keep(m);
	} else {
		unsigned span = m->span;

		end_window(m);
		hash_remove(m);
		free(m);
		span_unused(r, span);
		settle(r);
	}
	leave();
	return 0;
}

/* What the program sees of m: real's fields (libibverbs' MR standing in for it). */
static void take_fields(struct shim_mr *m, const struct ibv_mr *real, unsigned access)
{
	m->ibv.pd = real->pd;
	m->ibv.addr = real->addr;
	m->ibv.length = real->length;
	m->ibv.handle = real->handle;
	m->ibv.lkey = real->lkey;
	m->ibv.rkey = real->rkey;
	m->verbs_access = (int)access;
	m->access = access;
}

EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
			size_t length, int access)
{
	struct shim_mr *m, *fresh;
	struct moved_range *old;
	char why[512] = ""; /* mrd's reply (256) and what the shim puts before it */
	int k;

	resolve_verbs();
	if (!real_rereg)
		return IBV_REREG_MR_ERR_CMD;
	if (!mr || inside)
		return real_rereg(mr, flags, pd, addr, length, access);
	enter();
	m = ours(mr);
	if (!m || m->inner) {
		/* libibverbs' own, maybe over other pages now. */
		struct ibv_mr *real = m ? m->inner : mr;

		k = real_rereg(real, flags, pd, addr, length, access);
		if (k == 0 && (flags & IBV_REREG_MR_CHANGE_TRANSLATION))
			own_moved(real);
		if (k == 0 && m)
			take_fields(m, real, (flags & IBV_REREG_MR_CHANGE_ACCESS) ? (unsigned)access :
						 m->access);
		leave();
		return k;
	}
	/* libibverbs' own checks (verbs.c ibv_rereg_mr), then a registration of the new
	 * buffer that takes the place of the old one. */
	if (m->kept || !m->range || !flags || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
		leave();
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (!(flags & IBV_REREG_MR_CHANGE_PD))
		pd = m->ibv.pd;
	if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION)) {
		addr = m->ibv.addr;
		length = m->ibv.length;
	}
	if (!(flags & IBV_REREG_MR_CHANGE_ACCESS))
		access = (int)m->access;
	/* The old registration goes first, and the kept ones over its pages: alone there, the
	 * pages go back, and the new one may move them again with other access. Failing, the
	 * old one is made again. */
	old = m->range;
	end_window(m);
	hash_remove(m);
	old->live--;
	span_unused(old, m->span);
	release_kept_over(old, old->start, old->end);
	settle(old);
	k = serve(pd, addr, length, (unsigned)access, &fresh, why, sizeof(why));
	if (k < 0) {
		struct ibv_mr *real;

		/* libibverbs' own MR in its place, where memlock allows; else the old one again. */
		SAY_ONCE("rereg of %p+%zu falls through to libibverbs: %s", m->ibv.addr,
			 m->ibv.length, why);
		real = real_reg(pd, addr, length, (uintptr_t)addr, (unsigned)access);
		if (real && own_add(real) < 0) {
			real_dereg(real);
			real = NULL;
		}
		if (real) {
			m->inner = real;
			m->range = NULL;
			take_fields(m, real, (unsigned)access);
			hash_add(m);
			leave();
			return 0;
		}
		if (serve(m->ibv.pd, m->ibv.addr, m->ibv.length, m->access, &fresh, why,
			  sizeof(why)) < 0) {
			/* Neither: the MR is dead, its keys nothing (as libibverbs may leave one). */
			m->ibv.lkey = m->ibv.rkey = 0;
			m->range = NULL;
			hash_add(m);
			leave();
			errno = -k;
			return IBV_REREG_MR_ERR_CMD;
		}
	}
	hash_remove(fresh);
	take_fields(m, &fresh->ibv, fresh->access);
	m->range = fresh->range;
	m->span = fresh->span;
	m->mw = fresh->mw;
	free(fresh);
	hash_add(m);
	leave();
	if (k < 0) {
		errno = -k;
		return IBV_REREG_MR_ERR_CMD;
	}
	return 0;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct shim_pd **pp, *p;
	bool bound;

	resolve_verbs();
	if (!real_dealloc_pd)
		return ENOSYS;
	if (!pd || inside)
		return real_dealloc_pd(pd);
	enter();
	for (pp = &pds; *pp && (*pp)->pd != pd; pp = &(*pp)->next)
		;
	p = *pp;
	bound = p != NULL;
	for (const struct own_mr *o = own_mrs; o; o = o->next)
		if (o->mr->pd == pd) {
			leave();
			return EBUSY; /* libibverbs' own MRs there: the kernel would say so */
		}
	if (p) {
		for (size_t h = 0; h < HASH_SIZE; h++)
			for (struct shim_mr *m = by_address[h]; m; m = m->hash_next)
				if (m->ibv.pd == pd && !m->kept) {
					leave();
					return EBUSY; /* as the kernel says of a PD with MRs */
				}
		for (struct shim_mr *m = kept_head, *next; m; m = next) {
			next = m->kept_next;
			if (m->ibv.pd == pd)
				release_kept(m, true);
		}
		for (size_t i = 0; i < ranges.n; i++)
			for (struct range_keys **k = &ranges.v[i]->keys; *k;)
				if ((*k)->pd == pd) {
					struct range_keys *dead = *k;

					*k = dead->next;
					free(dead);
				} else
					k = &(*k)->next;
		/* Its windows and QP first: the PD keeps them from the kernel's dealloc. */
		window_binder_free(p->binder);
		/* mrd deregisters its MRs in the PD and lets go of the context. */
		p->client = mrd_client_close(p->client);
		*pp = p->next;
		free(p);
	}
	leave();
	for (int i = 0;; i++) {
		int k = real_dealloc_pd(pd);

		/* mrd lets go of its MRs there once it saw the connection close. */
		if (k != EBUSY || !bound || i == 100)
			return k;
		usleep(10000);
	}
}

struct unmap_walk {
	uintptr_t start, end;
};

static void unmapped_one(struct moved_range *r, void *arg)
{
	const struct unmap_walk *w = arg;

	lost(r, w->start, w->end);
}

/* The program unmapped [start, end): what of its moved ranges lay there is lost. */
static void unmapped(uintptr_t start, uintptr_t end)
{
	struct unmap_walk w = { start, end };

	moved_ranges_each_overlapping(&ranges, start, end, unmapped_one, &w);
}

static void moving_one(struct moved_range *r, void *arg)
{
	const struct unmap_walk *w = arg;

	release_kept_over(r, w->start, w->end);
	if (r->live == 0 && r->kept == 0)
		go_back(r);
}

EXPORT int munmap(void *addr, size_t length)
{
	long r = next_munmap ? next_munmap(addr, length) : syscall(SYS_munmap, addr, length);

	if (r == 0 && !inside && length && near_ranges((uintptr_t)addr, (uintptr_t)addr + length)) {
		enter();
		unmapped((uintptr_t)addr, (uintptr_t)addr + length);
		leave();
	}
	return (int)r;
}

/* A mapping over a moved range (MAP_FIXED, or into a hole a raw munmap left) replaced its
 * pages as munmap() would. */
static void *map(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
	void *r = next_mmap ? next_mmap(addr, length, prot, flags, fd, offset)
			    : (void *)syscall(SYS_mmap, addr, length, prot, flags, fd, offset);

	/* Fixed or not: a mapping that lands on a moved range replaced what was there. */
	if (r != MAP_FAILED && !inside && length &&
	    near_ranges((uintptr_t)r, (uintptr_t)r + length)) {
		enter();
		unmapped((uintptr_t)r, (uintptr_t)r + length);
		leave();
	}
	return r;
}

EXPORT void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
	return map(addr, length, prot, flags, fd, offset);
}

EXPORT void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
	return map(addr, length, prot, flags, fd, offset);
}

struct free_walk {
	uintptr_t start, end;     /* the freed chunk's bytes */
	uintptr_t block, block_end; /* glibc's mapping of it, when it is mmapped: free unmaps it */
	struct moved_range *forget[8];
	int n_forget;
};

/* Before the allocator takes the bytes back: their kept registrations die, and a range left
 * with none goes back to private memory first — the allocator may reuse its pages, or
 * madvise() them away, and must find its own memory there. Where glibc unmaps the whole range
 * with the chunk, no copy: the range is forgotten once it did. */
static void freeing_one(struct moved_range *r, void *arg)
{
	struct free_walk *w = arg;

	release_kept_over(r, w->start, w->end);
	if (r->live > 0 || r->kept > 0)
		return;
	if (w->block && w->block <= r->start && r->end <= w->block_end && w->n_forget < 8) {
		w->forget[w->n_forget++] = r;
		return;
	}
	go_back(r);
}

/* The bytes of the chunk at p; near_ranges() of them tells whether free() must look. */
static uintptr_t chunk_end(void *p)
{
	size_t usable = real_usable_size ? real_usable_size(p) : 0;

	return (uintptr_t)p + (usable ? usable : 1);
}

/* will_unmap: free(), which unmaps an mmapped chunk; realloc() may keep or move it. */
static void before_free(void *p, bool will_unmap, struct free_walk *w)
{
	w->start = (uintptr_t)p;
	w->end = chunk_end(p);
	w->block = w->block_end = 0;
	w->n_forget = 0;
	if (glibc_malloc && will_unmap) {
		/* glibc's chunk header: the size word before p, bit 1 set for an mmapped chunk,
		 * whose mapping starts prev_size bytes before the header. */
		size_t size = ((size_t *)p)[-1], prev = ((size_t *)p)[-2];

		if (size & 2) {
			w->block = w->start - 2 * sizeof(size_t) - prev;
			w->block_end = w->block + prev + (size & ~(size_t)7);
		}
	}
	moved_ranges_each_overlapping(&ranges, w->start, w->end, freeing_one, w);
}

static void after_free(struct free_walk *w)
{
	for (int i = 0; i < w->n_forget; i++)
		moved_range_forget(&ranges, mem, w->forget[i]);
}

static void call_real_free(void *p)
{
	if (real_free)
		real_free(p);
	else
		__libc_free(p);
}

EXPORT void free(void *p)
{
	struct free_walk w;

	if (!p || inside || !__atomic_load_n(&ranges.hi, __ATOMIC_ACQUIRE) ||
	    !near_ranges((uintptr_t)p, chunk_end(p))) {
		call_real_free(p);
		return;
	}
	enter();
	before_free(p, true, &w);
	call_real_free(p);
	after_free(&w);
	leave();
}

EXPORT void *realloc(void *p, size_t size)
{
	struct free_walk w;
	void *q;

	if (!p || inside || !__atomic_load_n(&ranges.hi, __ATOMIC_ACQUIRE) ||
	    !near_ranges((uintptr_t)p, chunk_end(p)))
		return real_realloc ? real_realloc(p, size) : __libc_realloc(p, size);
	enter();
	before_free(p, false, &w); /* copied back, never just forgotten: the block may stay */
	q = real_realloc ? real_realloc(p, size) : __libc_realloc(p, size);
	leave();
	return q;
}

EXPORT void *mremap(void *old, size_t old_length, size_t new_length, int flags, ...)
{
	void *new_address = NULL, *r;
	bool near = false;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		new_address = va_arg(ap, void *);
		va_end(ap);
	}
	if (!inside) {
		near = near_ranges((uintptr_t)old, (uintptr_t)old + old_length + 1) ||
		       (new_address &&
			near_ranges((uintptr_t)new_address, (uintptr_t)new_address + new_length));
	}
	if (near) {
		/* Pages that move: a range there with no live registration goes back to private
		 * memory first, and its kept registrations die. */
		struct unmap_walk w = { (uintptr_t)old, (uintptr_t)old + (old_length ? old_length : 1) };

		enter();
		moved_ranges_each_overlapping(&ranges, w.start, w.end, moving_one, &w);
		leave();
	}
	r = next_mremap ? next_mremap(old, old_length, new_length, flags, new_address)
			: (void *)syscall(SYS_mremap, old, old_length, new_length, flags, new_address);
	if (near && r != MAP_FAILED && new_address) {
		enter();
		unmapped((uintptr_t)new_address, (uintptr_t)new_address + new_length);
		leave();
	}
	return r;
}

/* Held from the prepare handler to the parent's or child's: and inside, so that what the
 * other handlers do meanwhile (libmrd's child handler frees its watcher's records, heap chunks
 * that may lie among moved ranges) passes straight on instead of waiting for the lock. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&lock);
	inside++;
}

static void fork_parent(void)
{
	inside--;
	pthread_mutex_unlock(&lock);
}

/* The child gets its own copy of every moved page first (as fork gives of private memory;
 * mrd's stay the parent's) ... */
static void fork_copy(void)
{
	moved_ranges_fork_copy(&ranges); /* inside since fork_prepare */
}

/* ... and runs on without the shim: its mrd connections are the parent's. */
static void fork_child(void)
{
	forked = true; /* first: kept registrations' windows are forgotten, not unbound */
	mem = NULL; /* first: releasing kept registrations drops nothing in the parent's mrd */
	while (kept_head)
		release_kept(kept_head, false);
	moved_ranges_fork_forget(&ranges);
	enabled = false;
	pds = NULL;
	inside--; /* fork_prepare's */
	pthread_mutex_unlock(&lock);
}

static bool env_off(const char *v)
{
	return v && (strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 ||
		     strcasecmp(v, "no") == 0 || strcasecmp(v, "false") == 0);
}

__attribute__((constructor)) static void shim_init(void)
{
	const char *v;

	inside++;
	real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
	real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	real_usable_size = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
	glibc_malloc = real_free == __libc_free;
	next_mmap = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
	next_munmap = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
	next_mremap = (void *(*)(void *, size_t, size_t, int, ...))dlsym(RTLD_NEXT, "mremap");
	if (env_off(getenv("MRD_PRELOAD")))
		enabled = false;
	v = getenv("MRD_PRELOAD_LOG");
	if (v)
		log_level = atoi(v);
	v = getenv("MRD_PRELOAD_WINDOWS");
	if (v && strcasecmp(v, "dereg") == 0)
		windows = WINDOWS_TILL_DEREG;
	else if (env_off(v))
		windows = WINDOWS_OFF;
	else if (v && *v && strcasecmp(v, "free") != 0)
		SAY_ONCE("MRD_PRELOAD_WINDOWS=%s: not dereg, free or off; free it is", v);
	v = getenv("MRD_PRELOAD_KEEP");
	if (v)
		keep_max = (unsigned)strtoul(v, NULL, 10);
	moved_ranges_atfork(fork_copy, fork_prepare, fork_parent, fork_child);
	inside--;
}

__attribute__((destructor)) static void shim_fini(void)
{
	/* A clean exit with registrations left: their windows go first, or mrd could not
	 * deregister the MRs under them once the program's context is gone (rxe's num_mw). */
	if (windows != WINDOWS_OFF && !forked && !inside && pthread_mutex_trylock(&lock) == 0) {
		inside++; /* not enter(): an exit while another thread holds the lock skips this */
		for (size_t h = 0; h < HASH_SIZE; h++)
			for (struct shim_mr *m = by_address[h]; m; m = m->hash_next)
				end_window(m);
		inside--;
		pthread_mutex_unlock(&lock);
	}
	if (log_level >= 2 || (log_level >= 1 && n_passed > 0 && n_served > 0))
		say("%lu registrations through mrd (%lu kept ones taken again), %lu fell through",
		    n_served + n_hits, n_hits, n_passed);
}
