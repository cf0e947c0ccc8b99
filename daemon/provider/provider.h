/* SPDX-License-Identifier: MIT */
/* The device abstraction. Every cache and pool in mrd registers memory through these ops, so
 * all of mrd runs on the soft provider (a software NIC) as well as on rdma-core. All functions
 * return 0 or -errno and never log above debug. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

/* Access bits, with ibv_access_flags' meaning. */
enum {
	MRD_ACCESS_LOCAL_WRITE = 1u << 0,
	MRD_ACCESS_REMOTE_WRITE = 1u << 1,
	MRD_ACCESS_REMOTE_READ = 1u << 2,
	MRD_ACCESS_REMOTE_ATOMIC = 1u << 3,
	MRD_ACCESS_ON_DEMAND = 1u << 4, /* ODP: nothing pinned, pages fault in */
	/* Memory windows may be bound over the MR (IBV_ACCESS_MW_BIND); only where caps.mw. */
	MRD_ACCESS_MW_BIND = 1u << 5,
};
#define MRD_ACCESS_ALL 0x3fu
/* What a window may grant (rxe_mw.c rxe_bind_mw: RXE_ACCESS_SUPPORTED_MW, zero-based apart). */
#define MRD_ACCESS_MW_GRANTS (MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ | MRD_ACCESS_REMOTE_ATOMIC)

enum provider_rereg_flags {
	PROVIDER_REREG_TRANSLATION = 1u << 0, /* new addr/length/iova */
	PROVIDER_REREG_ACCESS = 1u << 1,
};

enum provider_advice {
	PROVIDER_ADVISE_PREFETCH,       /* make pages present for reading */
	PROVIDER_ADVISE_PREFETCH_WRITE, /* ... for writing; needs MRD_ACCESS_LOCAL_WRITE */
	/* Translations for the pages present in mrd's page tables only, faulting none in (mlx5's
	 * snapshot); -EOPNOTSUPP where the device cannot. */
	PROVIDER_ADVISE_PREFETCH_NO_FAULT,
};

/* RC operations that may page-fault on an on-demand MR: IBV_ODP_SUPPORT_*'s bits. */
enum {
	PROVIDER_ODP_SEND = 1u << 0,
	PROVIDER_ODP_RECV = 1u << 1,
	PROVIDER_ODP_WRITE = 1u << 2,
	PROVIDER_ODP_READ = 1u << 3,
	PROVIDER_ODP_ATOMIC = 1u << 4,
	PROVIDER_ODP_SRQ_RECV = 1u << 5,
	PROVIDER_ODP_FLUSH = 1u << 6,        /* Linux 6.13 on (rxe) */
	PROVIDER_ODP_ATOMIC_WRITE = 1u << 7,
};

enum provider_dma_op {
	PROVIDER_DMA_WRITE, /* RDMA write: local (lkey) -> remote (rkey) */
	PROVIDER_DMA_READ,  /* RDMA read: remote (rkey) -> local (lkey) */
};

/* What an event on a context's async fd says, in mrd's terms (read_event). */
enum provider_event_kind {
	PROVIDER_EVENT_DEVICE_FATAL, /* the device is lost: every context of it is dead */
	PROVIDER_EVENT_PORT_ACTIVE,
	PROVIDER_EVENT_PORT_DOWN,
	/* For an object that is not mrd's (a client that imported the context shares its event
	 * queue, and chose the event's element pointer itself): neither read nor acknowledged. */
	PROVIDER_EVENT_FOREIGN,
	PROVIDER_EVENT_OTHER, /* mrd's, or the device's, and of no consequence: acknowledged */
};

struct provider_event {
	enum provider_event_kind kind;
	unsigned port;    /* for port events */
	const char *name; /* the device's name for it, for logs */
};

struct provider_caps {
	char device[64];
	bool port_active;       /* at open: a port of the device is active */
	uint64_t max_mr_size;
	uint32_t page_size;
	bool odp;               /* on-demand paging */
	bool odp_implicit;      /* an implicit (whole address space) ODP MR */
	uint32_t odp_rc_caps;   /* PROVIDER_ODP_* bits for RC */
	/* Remote atomics: atomic_cap is not IBV_ATOMIC_NONE. Without, a device may refuse any MR
	 * asking for MRD_ACCESS_REMOTE_ATOMIC (EFA does: EOPNOTSUPP), so none asks. */
	bool atomic;
	/* Bytes one advise op covers at most (ibv_sge.length is 32-bit): provider_advise splits
	 * longer ranges at multiples of it, a multiple of the page size. 0: no limit. */
	uint64_t advise_max;
	bool rereg_translation; /* rereg may move an MR to new memory */
	bool rereg_new_keys;    /* ... and a moved MR gets keys other than the ones it had */
	/* What a move does, in words, for `mrctl pools` and the log: verbs' rereg probe answer
	 * ("a move gives new lkey and rkey", "rereg: Operation not supported", "a move keeps
	 * its keys ..."), soft's mode. */
	char rereg_probe[128];
	/* A released key may be handed out again unchanged by the next registration (mlx5's
	 * mkey cache; soft with $MRD_SOFT_KEYS=mlx5): mrd's key quarantine must keep it dead. */
	bool keys_come_back;
	/* A move (a rereg with a new translation, so a park) of an on-demand MR makes it anew:
	 * new keys, and the old ones back to the device, to be handed out again where keys come
	 * back (mlx5 does for every ODP MR, Linux 6.1 drivers/infiniband/hw/mlx5/mr.c:1683). The
	 * key quarantine parks those in place (park_in_place). */
	bool odp_move_recreates;
	bool dma;               /* RDMA through keys (provider_dma) */
	const char *no_dma;     /* ... and why not, where dma is false (mrctl status says it) */
	bool dma_emulated;      /* ... by mrd itself (soft): exact errors, counted ODP faults */
	bool export_pd;         /* clients may import context and PD */
	uint64_t max_keys;      /* keys a context makes in its life, then -EKEYEXPIRED; 0: no limit */
	/* Type-2 memory windows: MRs may take MRD_ACCESS_MW_BIND, and the mw_* ops work where the
	 * provider has them (not the client provider: a client binds on its own QPs). no_mw says
	 * why not where mw is false (siw has none). */
	bool mw;
	const char *no_mw;
	/* Where a window's rkey reaches more than its bytes, why; NULL: exactly its bytes. rxe
	 * checks a window's range against its MR's, not the window's (Linux rxe_resp.c,
	 * check_rkey: mr_check_range(mr, ...) after rxe_lookup_mw). */
	const char *mw_wide;
	/* How many binds of one window give keys never seen before: 256 where only the key byte
	 * changes (ibv_inc_rkey), 0 where a key, once dead, never comes back (soft). */
	unsigned mw_fresh_binds;
	/* Windows the device holds at most, all its contexts together (ibv_query_device's
	 * max_mw): Linux 6.1 rxe 2^19 - 1 (rxe_param.h RXE_MAX_MW); mlx5 windows are mkeys, which
	 * its MRs need too. */
	uint32_t max_mw;
};

struct provider_stats {
	uint64_t mrs;                 /* live registrations */
	uint64_t parked;              /* handles parked for a pool: no memory, not in mrs */
	uint64_t registrations;       /* since open */
	uint64_t pinned_bytes;        /* pages pinned now, each counted once */
	uint64_t odp_faults;          /* pages made present by a DMA touching them */
	uint64_t odp_prefetched_pages;
	uint64_t odp_invalidations;   /* pages whose translation was zapped */
	uint64_t mws;                 /* memory windows allocated */
};

struct provider;
struct frmr_pool;

struct provider_pd {
	struct provider *provider;
	unsigned n_mrs;
	unsigned n_mws; /* windows allocated on it: pd_free is -EBUSY while any */
	unsigned n_doomed; /* of those, handed to their MRs (provider_mw_doom), atomic */
};

/* What callers may read of a registration; the provider owns the rest. */
struct provider_mr {
	struct provider_pd *pd;
	uint64_t addr;   /* host virtual address */
	uint64_t length;
	uint64_t iova;   /* address the keys use */
	uint32_t lkey, rkey;
	unsigned access;
	/* The FRMR pools' (daemon/registration/frmr-pool.h): the pool it returns to when released, NULL
	 * when it is not pooled. Providers never touch it. */
	struct frmr_pool *pool;
	/* Windows bound over it (the wrappers count): while any, dereg, park and moves are refused
	 * (-EBUSY), as rxe refuses dereg (rxe_verbs.c rxe_dereg_mr: num_mw, IBA 10.6.7.2.6). */
	unsigned n_mws;
	/* Windows handed to it as its memory was freed (provider_mw_doom): deallocated, their
	 * keys dead, by whatever ends the MR (dereg, park) before it does. */
	struct provider_mw *doomed;
};

/* A type-2 memory window: what callers may read. The wrappers keep the binding. */
struct provider_mw {
	struct provider_pd *pd;
	struct provider_mr *mr; /* bound over it; NULL: not bound (its rkey reaches nothing) */
	uint64_t addr, length;  /* the bytes bound, iova of mr */
	unsigned access;        /* MRD_ACCESS_MW_GRANTS bits bound */
	uint32_t rkey;          /* the last key bound; dead while mr is NULL */
	/* An invalidate or dealloc waits for what of a transfer through the window is under way
	 * (soft: the chunk being copied, the lock released; the transfer's next chunk fails):
	 * the window is unbound already, and every other op on it is refused until it is done. */
	bool busy;
	struct provider_mw *doomed_next; /* on its MR's doomed list */
};

struct provider_ops {
	const char *name;
	/* device NULL: the first. -ENODEV when there is none (or no RDMA support at all). */
	int (*open)(const char *device, struct provider **ret);
	void (*close)(struct provider *p);
	int (*pd_alloc)(struct provider *p, struct provider_pd **ret);
	int (*pd_free)(struct provider_pd *pd); /* -EBUSY while it has MRs */
	int (*reg)(struct provider_pd *pd, void *addr, size_t length, uint64_t iova,
		   unsigned access, struct provider_mr **ret);
	/* flags: provider_rereg_flags; access is the MR's new access (already checked). The MR
	 * keeps its identity; keys may change (read them
	 * again). On failure the MR is unchanged and still valid, except -ESTALE: the device
	 * destroyed it on the way (verbs' IBV_REREG_MR_ERR_CMD) and only dereg remains.
	 * -EKEYEXPIRED: a move would need a key it has none left of (soft: its index gave all its
	 * variants); the MR is unchanged, but will never move. */
	int (*rereg)(struct provider_mr *mr, unsigned flags, void *addr, size_t length,
		     uint64_t iova, unsigned access);
	int (*dereg)(struct provider_mr *mr);
	/* Detaches an MR from its memory so a pool may keep it (daemon/registration/frmr-pool.h): its keys
	 * stop reaching that memory at once, it pins nothing of it, and only a rereg with
	 * PROVIDER_REREG_TRANSLATION (new memory, new keys) or dereg may follow. NULL: the
	 * provider cannot, and pools are off. Returns 0, or 1: parked, but under new keys because
	 * the device made the MR anew and took its old keys back, to hand them out again where
	 * keys come back (verbs: mlx5's rereg falls back to create_real_mr when its UMR cannot
	 * make the change, hw/mlx5/mr.c); -EOPNOTSUPP where a move is refused (rxe, siw). */
	int (*park)(struct provider_mr *mr);
	/* Parks an MR without moving it: it goes to a PD of the provider's own that no QP uses,
	 * so its keys stay its own (the device cannot hand them out again) and reach nothing, and
	 * nothing can fault its pages in; it keeps its translation (for on-demand memory only: a
	 * pinned MR would stay pinned). Returns 0, 1 (parked, but its keys changed) or -errno
	 * (the MR as it was). NULL: the provider cannot. */
	int (*park_in_place)(struct provider_mr *mr);
	/* ODP prefetch. Called without the provider's lock, since it may take long (soft populates
	 * pages: 0.4 s a GiB; a device faults them in): it locks what it needs (soft holds the
	 * MR as a copy does, and takes the lock to check and to install translations; verbs'
	 * ibv_advise_mr is one ioctl on the context, which the kernel serializes itself). The
	 * caller keeps mr alive and unmoved meanwhile (a prefetch counts on its allocation). */
	int (*advise)(struct provider_mr *mr, enum provider_advice advice, uint64_t iova,
		      size_t length);
	/* A dup'd command fd (O_CLOEXEC, the caller's) and the PD handle; -EOPNOTSUPP when the
	 * provider has no device to share. */
	int (*export_pd)(struct provider_pd *pd, int *ret_cmd_fd, uint32_t *ret_pd_handle);
	/* The context's command fd, still the provider's, or -1 (none, or lost): what a client
	 * must not pass as its own (BindPd, provider/client-context.h). NULL: no device. Under
	 * event_lock alone, as the context pointer is (the loop asks while a worker registers). */
	int (*cmd_fd)(struct provider *p);
	/* An RDMA WRITE or READ through keys: soft emulates it through the keys' translations,
	 * verbs has the device do it. Called without the provider's lock: it locks what it
	 * needs, as a device transfer waits (soft locks to check the keys and hold both MRs,
	 * then faults an on-demand MR's missing pages in and copies unlocked, and locks again to
	 * install the faults' translations; a dereg, park, move or invalidate of an MR it goes
	 * through waits for it). Soft: -EFAULT also for a page to fault in not mapped with the access
	 * (a NIC's failed page fault); -ENXIO, a page of a range is gone, a hole in its memfd the
	 * kernel could not fill (hugetlb with no free huge page). NULL when the provider has
	 * none. */
	int (*dma)(struct provider_pd *pd, enum provider_dma_op op, uint32_t lkey, uint64_t laddr,
		   uint32_t rkey, uint64_t raddr, size_t length);
	/* ODP: zaps the translations of [iova, iova + length) as an MMU notifier would; NULL
	 * where the kernel does it. */
	int (*invalidate)(struct provider_mr *mr, uint64_t iova, size_t length);
	void (*stats)(const struct provider *p, struct provider_stats *ret);
	/* Type-2 memory windows (NULL where the provider has none); the wrappers check every
	 * rule below first, so the ops see valid requests only. mw_bind binds a free window over
	 * [addr, addr + length) of mr (an iova range), with a new key (verbs: the key byte
	 * advanced, as ibv_inc_rkey does; soft: a key never handed out before), into *ret_rkey.
	 * mw_invalidate makes it free again: its rkey is refused from then on, at once.
	 * mw_dealloc frees it, bound or not, and also works on a lost device. Both get the MR it
	 * was bound over (NULL: none), the wrapper having unbound it already (mw->mr NULL, busy),
	 * so a key lookup refuses it while they wait for the transfers under way. */
	int (*mw_alloc)(struct provider_pd *pd, struct provider_mw **ret);
	int (*mw_bind)(struct provider_mw *mw, struct provider_mr *mr, uint64_t addr,
		       uint64_t length, unsigned access, uint32_t *ret_rkey);
	int (*mw_invalidate)(struct provider_mw *mw, struct provider_mr *mr);
	int (*mw_dealloc)(struct provider_mw *mw, struct provider_mr *mr);
	/* A client PD's context (provider/provider-client.h): deallocates the window handle of
	 * the client's own (ibv_mw.handle, which it tracked: WindowTrack), bound or not, so the
	 * MRs under it may go. -ENOENT or -EINVAL where handle names no window (any more). NULL:
	 * the windows of this provider are mrd's own (the ops above). */
	int (*client_mw_dealloc)(struct provider *p, uint32_t handle);
	/* The device's lifecycle (mrd(8), DEVICES). The context's async event fd (O_NONBLOCK,
	 * the provider's), -1 when it has none. */
	int (*event_fd)(struct provider *p);
	/* One event, or -EAGAIN when none is pending. event_fd, read_event and gone run under
	 * event_lock alone, never the provider's lock (the loop calls them while a worker may
	 * register for seconds): they touch only what event_lock guards (verbs: the context
	 * pointer and the set of mrd's event elements). */
	int (*read_event)(struct provider *p, struct provider_event *ret);
	/* Whether the device is gone (removed), though no event said so: rxe, siw and efa cannot
	 * disassociate a context, so their removal waits, silently, until mrd closes it. */
	bool (*gone)(struct provider *p);
	/* The device failed: everything of the context is let go and the context closed (its
	 * event fd with it). PDs and MRs stay as handles: dereg and pd_free succeed on them, every
	 * other op fails with -ENODEV, and no key of them reaches memory. It may wait for every op
	 * in progress (verbs: a prefetch, a Dma): never on the loop (provider_lose). */
	void (*lose)(struct provider *p);
	/* After lose: the device opened again by name, each PD made again and each MR registered
	 * again, with new keys (read them again); -ENODEV while the device is not back. */
	int (*revive)(struct provider *p);
};

struct provider {
	const struct provider_ops *ops;
	struct provider_caps caps;
	/* The wrappers below hold it around every op but dma and advise (which take it for what
	 * they need): registrations also run on worker threads (daemon/base/worker-pool.h), and
	 * no provider keeps its state thread-safe by itself. */
	pthread_mutex_t lock;
	/* event_fd, read_event and gone, and what of the provider they read (the ops' comment);
	 * taken under lock, never the other way. */
	pthread_mutex_t event_lock;
	/* Set at once when the device fails (provider_mark_lost; atomic), before lose runs, and
	 * cleared by a revive that worked: every op but dereg and pd_free fails with -ENODEV
	 * from then on, without waiting for the lock, and no event is read. */
	bool lost;
};

extern const struct provider_ops provider_soft_ops;
extern const struct provider_ops provider_verbs_ops;

/* Opens the provider kind names ("auto", "soft", "verbs"); auto takes verbs when a device
 * opens, else soft. *ret_verbs_error tells why auto fell back (0 when it did not). */
int provider_open(const char *kind, const char *device, struct provider **ret,
		  int *ret_verbs_error);

/* The names of the host's RDMA devices (libibverbs' list), up to max: how many there are
 * (more than max when some did not fit); 0 when there is none. */
size_t provider_verbs_devices(char (*names)[64], size_t max);

/* How many of the host's RDMA devices libibverbs does not list because the kernel keeps each
 * to one network namespace (ib_core netns_mode=0, "rdma system set netns exclusive") and this
 * process is in another: the kernel's netlink list leaves them out (so does the sysfs class
 * infiniband, where /sys was mounted in that namespace), and ib_uverbs_open refuses them with
 * EPERM. 0 in shared mode. */
size_t provider_verbs_hidden(void);

static inline void provider_close(struct provider *p)
{
	if (p)
		p->ops->close(p);
}

static inline const char *provider_name(const struct provider *p) { return p->ops->name; }
/* strerror(-r) for a failed registration on p, naming the limit when its keys ran out. */
const char *provider_strerror(const struct provider *p, int r);

/* Access rules shared by every provider, as ibv_reg_mr applies them: known bits only, and
 * remote write or atomic needs local write. */
static inline int provider_check_access(unsigned access)
{
	if (access & ~MRD_ACCESS_ALL)
		return -EINVAL;
	if ((access & (MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & MRD_ACCESS_LOCAL_WRITE))
		return -EINVAL;
	return 0;
}

/* What a registration asking for access gets on a device with caps c: remote atomics only
 * where the device has them. */
static inline unsigned provider_grantable_access(const struct provider_caps *c, unsigned access)
{
	return c->atomic ? access : access & ~MRD_ACCESS_REMOTE_ATOMIC;
}

/* The RC ODP bits on-demand memory of access needs: a client sends from it, receives into it,
 * and peers write and read it (and, with remote atomics, do atomics on it). */
static inline uint32_t provider_odp_needs(unsigned access)
{
	return PROVIDER_ODP_SEND | PROVIDER_ODP_RECV | PROVIDER_ODP_WRITE | PROVIDER_ODP_READ |
	       (access & MRD_ACCESS_REMOTE_ATOMIC ? PROVIDER_ODP_ATOMIC : 0);
}

/* Whether MRs of access may be on demand on a device with caps c: it pages on demand and its
 * RC bits cover every operation the memory takes. Else they are pinned. */
static inline bool provider_odp_covers(const struct provider_caps *c, unsigned access)
{
	return c->odp && !(provider_odp_needs(access) & ~c->odp_rc_caps);
}

/* "send,recv,..." for PROVIDER_ODP_* bits ("none" for 0), into buf. */
const char *provider_odp_bits_name(uint32_t bits, char *buf, size_t size);
/* Why MRs of access are not on demand on a device with caps c, into buf; "" when they are. */
const char *provider_odp_gap(const struct provider_caps *c, unsigned access, char *buf,
			     size_t size);

/* Thin wrappers so callers read naturally; the rules every provider shares are checked here,
 * once, so the ops see only valid arguments, and the provider's lock is held around each op
 * (but dma and advise, long ones that lock for themselves). */
#define PROVIDER_LOCKED(p, expr)                                  \
	({                                                        \
		pthread_mutex_t *_l_ = &(p)->lock;                \
		__typeof__(expr) _r_;                             \
		pthread_mutex_lock(_l_);                          \
		_r_ = (expr);                                     \
		pthread_mutex_unlock(_l_);                        \
		_r_;                                              \
	})

static inline bool provider_lost(const struct provider *p)
{
	return __atomic_load_n(&p->lost, __ATOMIC_ACQUIRE);
}

/* An op that needs the device: -ENODEV once it is lost, checked before and under the lock
 * (an op that waited for the lock while the device failed does not reach it). */
#define PROVIDER_LIVE(p, expr)                                                      \
	(provider_lost(p) ? -ENODEV : PROVIDER_LOCKED(p, provider_lost(p) ? -ENODEV : (expr)))

#define PROVIDER_EVENT_LOCKED(p, expr)                            \
	({                                                        \
		pthread_mutex_t *_l_ = &(p)->event_lock;          \
		__typeof__(expr) _r_;                             \
		pthread_mutex_lock(_l_);                          \
		_r_ = (expr);                                     \
		pthread_mutex_unlock(_l_);                        \
		_r_;                                              \
	})

static inline int provider_pd_alloc(struct provider *p, struct provider_pd **ret)
{
	return PROVIDER_LIVE(p, p->ops->pd_alloc(p, ret));
}

/* Windows allocated on pd now, doomed ones (provider_mw_doom) included: from any thread. */
static inline unsigned provider_pd_windows(const struct provider_pd *pd)
{
	return __atomic_load_n(&pd->n_mws, __ATOMIC_RELAXED);
}

static inline int provider_pd_free(struct provider_pd *pd)
{
	return pd ? PROVIDER_LOCKED(pd->provider,
				    provider_pd_windows(pd) > 0 ? -EBUSY :
				    pd->provider->ops->pd_free(pd)) : 0;
}

static inline int provider_reg(struct provider_pd *pd, void *addr, size_t length, uint64_t iova,
			       unsigned access, struct provider_mr **ret)
{
	struct provider *p = pd->provider;
	int r = provider_check_access(access);

	if (r < 0)
		return r;
	if (length == 0 || length > p->caps.max_mr_size)
		return -EINVAL;
	if ((access & MRD_ACCESS_MW_BIND) && !p->caps.mw)
		return -EOPNOTSUPP;
	return PROVIDER_LIVE(p, p->ops->reg(pd, addr, length, iova, access, ret));
}

/* Without PROVIDER_REREG_ACCESS the MR keeps its access; with it, the same rules as
 * registration apply, and pinned <-> on demand is a new registration, never a rereg. */
static inline int provider_rereg(struct provider_mr *mr, unsigned flags, void *addr,
				 size_t length, uint64_t iova, unsigned access)
{
	struct provider *p = mr->pd->provider;
	int r;

	if (flags == 0 || (flags & ~(PROVIDER_REREG_TRANSLATION | PROVIDER_REREG_ACCESS)))
		return -EINVAL;
	if (!(flags & PROVIDER_REREG_ACCESS))
		access = mr->access;
	r = provider_check_access(access);
	if (r < 0)
		return r;
	if ((access ^ mr->access) & MRD_ACCESS_ON_DEMAND)
		return -EINVAL;
	if ((access & MRD_ACCESS_MW_BIND) && !p->caps.mw)
		return -EOPNOTSUPP;
	if ((flags & PROVIDER_REREG_TRANSLATION) && (length == 0 || length > p->caps.max_mr_size))
		return -EINVAL;
	/* Windows bound over it: invalidate them first. */
	return PROVIDER_LIVE(p, mr->n_mws > 0 ? -EBUSY :
				p->ops->rereg(mr, flags, addr, length, iova, access));
}

static inline int provider_mw_dealloc_locked(struct provider_mw *mw);

/* Deallocates the windows doomed with mr (provider_mw_doom): 0 once no window is bound over
 * it, else -EBUSY (a dealloc failed: that window stays doomed, and mr with it). Locked. */
static inline int provider_mr_unwindowed_locked(struct provider_mr *mr)
{
	while (mr->doomed) {
		struct provider_mw *mw = mr->doomed, *next = mw->doomed_next;

		if (provider_mw_dealloc_locked(mw) < 0)
			break;
		__atomic_sub_fetch(&mr->pd->n_doomed, 1, __ATOMIC_RELAXED);
		mr->doomed = next;
	}
	return mr->n_mws > 0 ? -EBUSY : 0;
}

static inline int provider_dereg(struct provider_mr *mr)
{
	struct provider *p;

	if (!mr)
		return 0;
	p = mr->pd->provider;
	/* As rxe (struct provider_mr, n_mws). */
	return PROVIDER_LOCKED(p, provider_mr_unwindowed_locked(mr) < 0 ? -EBUSY :
				  p->ops->dereg(mr));
}

static inline int provider_client_mw_dealloc(struct provider *p, uint32_t handle)
{
	return p->ops->client_mw_dealloc ?
		       PROVIDER_LOCKED(p, p->ops->client_mw_dealloc(p, handle)) : -EOPNOTSUPP;
}

static inline int provider_park(struct provider_mr *mr)
{
	struct provider *p = mr->pd->provider;

	if (!p->ops->park)
		return -EOPNOTSUPP;
	return PROVIDER_LIVE(p, provider_mr_unwindowed_locked(mr) < 0 ? -EBUSY : p->ops->park(mr));
}

static inline int provider_park_in_place(struct provider_mr *mr)
{
	struct provider *p = mr->pd->provider;

	if (!p->ops->park_in_place)
		return -EOPNOTSUPP;
	return PROVIDER_LIVE(p, provider_mr_unwindowed_locked(mr) < 0 ? -EBUSY :
				  p->ops->park_in_place(mr));
}

/* In pieces of at most caps.advise_max bytes, unlocked: the op locks what it needs. */
int provider_advise(struct provider_mr *mr, enum provider_advice advice, uint64_t iova,
		    size_t length);

static inline int provider_export_pd(struct provider_pd *pd, int *ret_fd, uint32_t *ret_handle)
{
	return PROVIDER_LIVE(pd->provider, pd->provider->ops->export_pd(pd, ret_fd, ret_handle));
}

static inline int provider_cmd_fd(struct provider *p)
{
	return p->ops->cmd_fd ? PROVIDER_EVENT_LOCKED(p, p->ops->cmd_fd(p)) : -1;
}

static inline int provider_dma(struct provider_pd *pd, enum provider_dma_op op, uint32_t lkey,
			       uint64_t laddr, uint32_t rkey, uint64_t raddr, size_t length)
{
	struct provider *p = pd->provider;

	if (!p->ops->dma || !p->caps.dma)
		return -EOPNOTSUPP;
	if (provider_lost(p))
		return -ENODEV;
	return p->ops->dma(pd, op, lkey, laddr, rkey, raddr, length);
}

static inline int provider_invalidate(struct provider_mr *mr, uint64_t iova, size_t length)
{
	struct provider *p = mr->pd->provider;

	if (!p->ops->invalidate)
		return 0;
	return PROVIDER_LOCKED(p, p->ops->invalidate(mr, iova, length));
}

/* Memory windows (provider_ops, mw_*): -EOPNOTSUPP where caps.mw is false. */
static inline int provider_mw_alloc_locked(struct provider_pd *pd, struct provider_mw **ret)
{
	int r = pd->provider->ops->mw_alloc(pd, ret);

	if (r == 0)
		__atomic_add_fetch(&pd->n_mws, 1, __ATOMIC_RELAXED);
	return r;
}

static inline int provider_mw_alloc(struct provider_pd *pd, struct provider_mw **ret)
{
	struct provider *p = pd->provider;

	if (!p->caps.mw || !p->ops->mw_alloc)
		return -EOPNOTSUPP;
	return PROVIDER_LIVE(p, provider_mw_alloc_locked(pd, ret));
}

/* The rules rxe applies to a type-2 bind (Linux rxe_mw.c rxe_check_bind_mw and rxe_bind_mw),
 * checked before any device sees the request: a failed bind work request would put the QP
 * in the error state. A bound window is refused (o10-37.2.30: only a free one binds; so a
 * rebind is invalidate + bind); so is a zero length (o10-37.2.40), an MR of another PD
 * (C10-72 for the QP), an MR without MW_BIND (C10-73: -EACCES), remote write or atomic over
 * an MR without local write (C10-74: -EACCES), and bytes outside the MR (C10-75). Locked. */
static inline int provider_mw_bind_locked(struct provider_mw *mw, struct provider_mr *mr,
					  uint64_t addr, uint64_t length, unsigned access,
					  uint32_t *ret_rkey)
{
	uint32_t rkey;
	int r;

	if (mw->busy)
		return -EBUSY;
	if (mw->mr || length == 0 || mr->pd != mw->pd || (access & ~MRD_ACCESS_MW_GRANTS))
		return -EINVAL;
	if (!(mr->access & MRD_ACCESS_MW_BIND))
		return -EACCES;
	if ((access & (MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_ATOMIC)) &&
	    !(mr->access & MRD_ACCESS_LOCAL_WRITE))
		return -EACCES;
	if (addr < mr->iova || addr + length < addr || addr + length > mr->iova + mr->length)
		return -EINVAL;
	r = mw->pd->provider->ops->mw_bind(mw, mr, addr, length, access, &rkey);
	if (r < 0)
		return r;
	mw->mr = mr;
	mw->addr = addr;
	mw->length = length;
	mw->access = access;
	mw->rkey = rkey;
	mr->n_mws++;
	if (ret_rkey)
		*ret_rkey = rkey;
	return 0;
}

static inline int provider_mw_bind(struct provider_mw *mw, struct provider_mr *mr,
				   uint64_t addr, uint64_t length, unsigned access,
				   uint32_t *ret_rkey)
{
	struct provider *p = mw->pd->provider;

	if (!p->caps.mw || !p->ops->mw_bind)
		return -EOPNOTSUPP;
	return PROVIDER_LIVE(p, provider_mw_bind_locked(mw, mr, addr, length, access, ret_rkey));
}

/* -EINVAL when it is not bound: rxe lets a second invalidation of a type-2 window through
 * rxe_check_invalidate_mw, and rxe_do_invalidate_mw then puts its NULL QP and MR (Linux
 * rxe_mw.c). Locked. */
static inline int provider_mw_invalidate_locked(struct provider_mw *mw)
{
	struct provider_mr *mr = mw->mr;
	int r;

	if (mw->busy)
		return -EBUSY;
	if (!mr)
		return -EINVAL;
	/* Unbound before the op waits (soft releases the lock): a second invalidate, a dealloc
	 * or a lost device's reset finds it unbound, and its key is refused at once. */
	mw->mr = NULL;
	mw->busy = true;
	r = mw->pd->provider->ops->mw_invalidate(mw, mr);
	mw->busy = false;
	if (r < 0) {
		mw->mr = mr;
		return r;
	}
	mr->n_mws--;
	return 0;
}

/* The window's rkey is refused from the moment this returns, and no transfer through it is
 * still under way (soft waits for those; a device completes the invalidation after them). */
static inline int provider_mw_invalidate(struct provider_mw *mw)
{
	struct provider *p = mw->pd->provider;

	if (!p->caps.mw || !p->ops->mw_invalidate)
		return -EOPNOTSUPP;
	return PROVIDER_LIVE(p, provider_mw_invalidate_locked(mw));
}

/* Locked. */
static inline int provider_mw_dealloc_locked(struct provider_mw *mw)
{
	struct provider_pd *pd = mw->pd;
	struct provider_mr *mr = mw->mr;
	int r;

	if (mw->busy)
		return -EBUSY;
	mw->mr = NULL; /* as an invalidate does */
	mw->busy = true;
	r = pd->provider->ops->mw_dealloc(mw, mr); /* frees mw */
	if (r < 0) {
		mw->busy = false;
		mw->mr = mr;
		return r;
	}
	if (mr)
		mr->n_mws--;
	__atomic_sub_fetch(&pd->n_mws, 1, __ATOMIC_RELAXED);
	return 0;
}

/* Bound or not; on a lost device too. -EBUSY while an invalidate of it waits. */
static inline int provider_mw_dealloc(struct provider_mw *mw)
{
	return mw ? PROVIDER_LOCKED(mw->pd->provider, provider_mw_dealloc_locked(mw)) : 0;
}

/* mw, bound over mr, dies with mr: whatever ends mr (dereg, park) deallocates it first. For
 * the owner of mr's memory, as it frees that memory and before mr's end begins (nothing else
 * touches mr's doomed list meanwhile): no lock, so mrd's loop hands a window over without
 * waiting for a worker that holds the provider. */
static inline void provider_mw_doom(struct provider_mw *mw, struct provider_mr *mr)
{
	mw->doomed_next = mr->doomed;
	mr->doomed = mw;
	__atomic_add_fetch(&mw->pd->n_doomed, 1, __ATOMIC_RELAXED);
}

/* Windows handed to their MRs on pd and not deallocated yet (their keys live till then): from
 * any thread. */
static inline unsigned provider_pd_doomed(const struct provider_pd *pd)
{
	return __atomic_load_n(&pd->n_doomed, __ATOMIC_RELAXED);
}

/* The event path takes event_lock only: the loop reads events while a worker holds the
 * provider's lock for seconds (a big registration pins). */
static inline int provider_event_fd(struct provider *p)
{
	return p->ops->event_fd ? PROVIDER_EVENT_LOCKED(p, p->ops->event_fd(p)) : -1;
}

static inline int provider_read_event(struct provider *p, struct provider_event *ret)
{
	if (!p->ops->read_event || provider_lost(p))
		return -EAGAIN;
	return PROVIDER_EVENT_LOCKED(p, p->ops->read_event(p, ret));
}

static inline bool provider_gone(struct provider *p)
{
	return p->ops->gone && !provider_lost(p) && PROVIDER_EVENT_LOCKED(p, p->ops->gone(p));
}

/* The device failed: from now on every op fails fast (struct provider, lost). Never blocks. */
static inline void provider_mark_lost(struct provider *p)
{
	__atomic_store_n(&p->lost, true, __ATOMIC_RELEASE);
}

/* provider_mark_lost, then the context let go (ops->lose) once the op in progress ends: this
 * waits for it, so the loop calls it only where no worker may hold p (core/device.c runs a
 * domain's on a worker). */
static inline void provider_lose(struct provider *p)
{
	provider_mark_lost(p);
	pthread_mutex_lock(&p->lock);
	p->ops->lose(p);
	pthread_mutex_unlock(&p->lock);
}

static inline int provider_revive(struct provider *p)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = p->ops->revive(p);
	if (r == 0)
		__atomic_store_n(&p->lost, false, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&p->lock);
	return r;
}

static inline void provider_stats(const struct provider *p, struct provider_stats *ret)
{
	struct provider *q = (struct provider *)p; /* the lock is not the data */

	pthread_mutex_lock(&q->lock);
	p->ops->stats(p, ret);
	pthread_mutex_unlock(&q->lock);
}
