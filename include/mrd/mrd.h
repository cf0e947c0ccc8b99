/* SPDX-License-Identifier: MIT */
/*
 * libmrd: the client library of mrd, the memory-registration daemon for RDMA.
 *
 * Every function returns 0 (or a non-negative value) on success and a negative errno value on
 * failure. Handles are opaque. Destructors accept NULL and return NULL. See libmrd(3).
 *
 * Each comment says what a call costs: "a request" is a round trip to mrd over the socket
 * (microseconds; more when mrd registers memory for it), "no request" runs in the caller alone.
 * Names are mrd_<object>_<verb>: mrd_client_* the connection, mrd_mem_* and mrd_extmem_* memory,
 * mrd_keys_query() the keys of an address from mrd (always a request), mrd_cache_* the caller's
 * own key cache (a few ns, a request only on a miss), mrd_mempool_* pools of objects.
 */
#ifndef MRD_MRD_H
#define MRD_MRD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where clients look for mrd when neither an argument nor $MRD_SOCKET names a socket. */
#define MRD_SOCKET_DEFAULT "/run/mrd/mrd.sock"

/* A connection to mrd. One handle may be shared by threads, and their calls on it run at once:
 * each request is sent under a short lock and its reply handed to the thread that asked, so one
 * thread's long call does not hold up another's (libmrd(3), NOTES). It belongs to the process
 * that opened it: in a child of fork() every call on it fails with -ECHILD (mrd_client_close()
 * is allowed there and frees only the child's copy); the child connects anew. See libmrd(3),
 * FORK. */
typedef struct mrd_client mrd_client;

/*
 * Connects to mrd at path (NULL or "": $MRD_SOCKET, else MRD_SOCKET_DEFAULT), negotiates the
 * protocol version and joins the caller's domain (two requests). On success *ret is a new handle;
 * on failure *ret is untouched. Errors: -ENOENT or -ECONNREFUSED when mrd is not running,
 * -EPROTONOSUPPORT when no protocol version is shared, -EUSERS when mrd serves its limit of clients
 * (all, or the caller's user's), -ETIMEDOUT, -ENOMEM.
 */
int mrd_client_connect(const char *path, mrd_client **ret);

/* Closes the connection and frees the handle (no request: mrd sees the socket close and frees
 * the handle's memory). Returns NULL. */
mrd_client *mrd_client_close(mrd_client *client);

/* A request that does nothing; the echoed payload is checked. -ECONNRESET when mrd went away. */
int mrd_client_ping(mrd_client *client);

/*
 * A descriptor to poll(2) (events 0 or POLLRDHUP; not POLLIN) or add to an event loop: it
 * reports POLLHUP once mrd went away; then call mrd_client_check(). The same number for the
 * handle's life (after mrd_client_reconnect() it is the new connection's: epoll wants it added
 * again). libmrd's: never read, write or close it. No request. -EINVAL for NULL.
 */
int mrd_client_fd(const mrd_client *client);

/*
 * Whether the handle's connection is alive, with no request: 0, or -ECONNRESET once mrd went
 * away (-ECHILD in a fork() child). Any call that finds mrd gone does the same: from then on
 * every call fails at once and no thread's lookup returns a cached key (each asks libmrd, which
 * refuses), until mrd_client_reconnect() succeeds.
 */
int mrd_client_check(mrd_client *client);

/*
 * After mrd restarted warm (systemctl restart, or SIGUSR2: see mrd(8)), connects the handle again
 * (a few requests): its memory stays where it is, with its content, and is its own again; the
 * generation moves above anything cached, so lookups refetch keys (the old ones died with the old
 * mrd). Mempools must be registered again. Returns how many allocations were taken back (>= 0);
 * -EISCONN when the handle's connection is still alive; -ECONNREFUSED or -ENOENT while no mrd
 * listens (try again); -ESTALE when the mrd there does not hold this memory (it started cold): then
 * close every handle of the process and connect anew.
 */
int mrd_client_reconnect(mrd_client *client);

/*
 * The device context and protection domain of the caller's domain, for a client that creates
 * its own QPs (a request): *ret_cmd_fd is a new O_CLOEXEC descriptor (the caller's, for
 * ibv_import_device()) and *ret_pd_handle the PD's handle (for ibv_import_pd()).
 * <mrd/mrd-verbs.h> does both. -EOPNOTSUPP on the soft provider, which has no device.
 */
int mrd_client_get_pd(mrd_client *client, int *ret_cmd_fd, uint32_t *ret_pd_handle);

/*
 * Binds the handle to a PD of the program's own verbs context, cmd_fd being the context's
 * command fd (ibv_context.cmd_fd) and pd_handle the PD's handle (ibv_pd.handle); libmrd keeps
 * a copy of cmd_fd until mrd_client_close(). From then on every key the handle gets (lookups,
 * lookup caches) is of an MR mrd made in that PD, for the program's own QPs; mrd pins the
 * pages, so the program needs no RLIMIT_MEMLOCK. Call it before the first lookup; once per
 * handle. <mrd/mrd-verbs.h> has mrd_verbs_bind_pd() for a struct ibv_pd *. Errors: -ENOTTY
 * (no uverbs device), -EXDEV (another device than mrd's), -EOPNOTSUPP (the soft provider, or
 * a driver whose REG_MR needs driver data: siw, irdma), -EINVAL (no such PD), -EALREADY,
 * -EBUSY (after a lookup).
 */
int mrd_client_bind_pd(mrd_client *client, int cmd_fd, uint32_t pd_handle);

/* Reason for the last failure of a libmrd call in this thread (mrd's own words when it refused,
 * e.g. which quota was reached); "" before any. Valid until the thread's next failing call. No
 * request: thread-local. */
const char *mrd_last_error(void);

/* The name of the caller's domain (e.g. "uid-1000"); valid while the handle lives. No
 * request. */
const char *mrd_client_domain(const mrd_client *client);

/*
 * The domain's generation: it changes whenever keys of the domain die (memory that had a
 * registration freed, a mempool's MR gone, a flush, a restart), so a client that cached keys
 * compares it with the value it saw then. A free of memory never registered leaves it alone.
 * One load from the status page; no request. 0 for NULL. Once the connection is gone (or in a
 * fork() child): UINT64_MAX less the number of reconnects so far, which nothing can have
 * cached.
 */
uint64_t mrd_client_generation(const mrd_client *client);

/* Memory. mrd allocates from its arenas (memfds mapped at the same address in mrd and in every
 * client of the domain); freed pages go back to the kernel. */

/* mrd_mem_alloc flags. HUGEPAGE: only 2 MiB huge pages (-ENOMEM when the host has none free).
 * ODP: registered lazily and on demand, in chunks, pinning nothing, whatever mrd's [cache]
 * policy (pinned as any other memory where the device's RC ODP does not cover it: mrd(8)).
 * READ_ONLY: its registrations let the device read it only (no local or remote write, no
 * atomics). */
#define MRD_MEM_HUGEPAGE 0x1u
#define MRD_MEM_ODP 0x2u
#define MRD_MEM_READ_ONLY 0x4u

/*
 * Allocates size bytes (rounded up to whole pages) aligned to align (a power of two; 0 for the page
 * size), a request, and stores the address in *ret. Errors: -EINVAL, -EDQUOT when a quota of the
 * domain is reached (mrd_last_error() names it), -ENOMEM.
 */
int mrd_mem_alloc(mrd_client *client, size_t size, size_t align, unsigned flags, void **ret);

/* Frees memory this handle allocated (a request). NULL is a no-op. -ENOENT for an address that is
 * not the start of an allocation, -EPERM for another client's. */
int mrd_mem_free(mrd_client *client, void *addr);

/*
 * Memory the program already has (heap, anonymous mmap: what it would pass to ibv_reg_mr) made
 * mrd's, a request: the pages around [addr, addr + len) move onto mrd's memory at the same
 * address, with their bytes, while every write to them waits in the kernel (no write lost,
 * whichever thread or system call makes it); from then on mrd_keys_query(), mrd_cache_*()
 * and mrd_dma() serve [addr, addr + len) at the program's addresses, its MRs covering those
 * bytes alone (flags: MRD_MEM_READ_ONLY, remote reads alone). The same buffer again counts
 * once more (no request). Errors: -EINVAL, -EFAULT (not all mapped), -EEXIST (mrd's memory
 * already, or inside a buffer adopted before), -EOPNOTSUPP (not private anonymous memory, a
 * stack, or writes cannot be held off here: mrd_last_error() says which), -EDQUOT, -ENOMEM.
 * See mrd_mem_adopt(3): what happens at free(), munmap(), fork() and close.
 */
int mrd_mem_adopt(mrd_client *client, void *addr, size_t len, unsigned flags);
/* Undoes one mrd_mem_adopt() of the buffer starting at addr; the last one copies the pages
 * back onto private memory (writes waiting meanwhile) and frees mrd's (a request): its keys
 * die. Call it before free() or munmap(). -ENOENT for no adopted buffer there. */
int mrd_mem_unadopt(mrd_client *client, void *addr);
/* Maps, in this process, the arena holding addr: memory another client of the same domain
 * allocated (a request). -ENOENT when addr is not memory of the caller's domain. */
int mrd_mem_map(mrd_client *client, const void *addr);

/*
 * Maps [offset, offset + length) of a memfd the caller owns (sealed with F_SEAL_SHRINK) into the
 * window (a request) and stores its address there in *ret. The caller keeps fd. Errors: -EBADF (not
 * a memfd), -EPERM (not sealed), -EINVAL (unaligned or past the end), -EDQUOT.
 * A file that can never be sealed (/dev/shm, a hugetlbfs mount, a memfd made without
 * MFD_ALLOW_SEALING) is refused (-EPERM): shrunk, it would break mrd's warm restart.
 */
int mrd_extmem_attach(mrd_client *client, int fd, uint64_t offset, size_t length, void **ret);

/* Takes attached memory out of the window (a request): mrd unmaps it and forgets it; this process's
 * mapping stays until the handle closes. The memfd and its data stay the caller's. */
int mrd_extmem_detach(mrd_client *client, void *addr);

/* Keys. mrd registers a domain's memory on demand and caches the registrations; a client asks
 * mrd for the keys of an address (mrd_keys_query: a request) or asks its own per-thread cache
 * (mrd_cache_*: a few ns, and a request to mrd only on a miss). */

/* A registered range and its keys: a value, copied out (not a handle, unlike ibv_mr). */
struct mrd_keys {
	uintptr_t start, end; /* [start, end) */
	uint32_t lkey, rkey;
};

/* What mrd_cache_lkey() returns for an address it has no key for. */
#define MRD_KEY_INVALID 0xffffffffu

/*
 * The keys of addr, asking mrd (one request; mrd registers on a miss). Errors: -ENOENT when
 * addr is not in memory allocated in the caller's domain, -EDQUOT when registering would pass
 * the domain's pinned-bytes quota (mrd_last_error() says which).
 */
int mrd_keys_query(mrd_client *client, const void *addr, struct mrd_keys *ret);

/* mrd_mem_alloc(), and the keys of the memory (as mrd_keys_query() gives them) in the same
 * request: mrd registers it at once, in the handle's PD, where that would not hold up its other
 * clients (under [cache] async_bytes); else libmrd asks for the keys itself. On failure nothing
 * is allocated. */
int mrd_mem_alloc_keys(mrd_client *client, size_t size, size_t align, unsigned flags, void **ret,
		       struct mrd_keys *ret_keys);


/*
 * A key cache for one thread (or one queue), allocated by libmrd: 8 recent entries with a
 * most-recently-used index (the "top half"), a sorted array behind them (the "bottom half"),
 * and the domain's generation they were filled at: when registered memory of the domain is
 * freed, the next lookup drops from both the entries overlapping it (everything when more
 * than 64 such frees came since the last lookup). No lock: one thread at a time.
 */
typedef struct mrd_cache mrd_cache;

/* A new cache for lookups through client (which must outlive it). No request. -ENOMEM. */
int mrd_cache_new(mrd_client *client, mrd_cache **ret);
/* Frees the cache. NULL-safe; returns NULL. */
mrd_cache *mrd_cache_free(mrd_cache *cache);

/* The full lookup: top half, bottom half (a few ns), then mrd (a request, as mrd_keys_query(),
 * and its errors). */
int mrd_cache_keys(mrd_cache *cache, const void *addr, struct mrd_keys *ret);

/* How many lookups through the cache had to ask mrd. (Nothing counts hits: a counter on the
 * hit path costs more than the hit.) 0 for NULL. */
uint64_t mrd_cache_asked(const mrd_cache *cache);

/* Why the cache's last lookup that asked mrd failed: after mrd_cache_lkey() returned
 * MRD_KEY_INVALID (or mrd_cache_keys() failed), its negative errno (-ENOENT, -EDQUOT, ...;
 * mrd_last_error() has the words), with no second call; 0 once a lookup that asked mrd got a
 * key (hits leave it alone). No request. -EINVAL for NULL. */
int mrd_cache_error(const mrd_cache *cache);

/* Out-of-line part of mrd_cache_lkey(). */
uint32_t mrd_cache_lkey_slow(mrd_cache *cache, const void *addr);

/*
 * Keys for a range: one MR covering [addr, addr + len) whole, whatever [cache] policy says
 * (page, contig, odp): on a miss mrd registers the page-rounded range (charged to the pinned
 * quota; on-demand memory stays on demand). mrd_keys_query_range asks mrd (a request);
 * mrd_cache_keys_range hits when a cached entry covers the whole range (one that covers part
 * of it is a miss). Errors: -EINVAL for len 0 or a range past the end of the address space;
 * -ERANGE when the range crosses the end of addr's allocation (mrd_mem_alloc, an attached
 * extmem), of a program's buffer (libmrd-preload) or of a mempool's MR, or passes the device's
 * largest MR; -ENOSPC when the domain holds 1024 ranges' own MRs; else as mrd_keys_query().
 */
int mrd_keys_query_range(mrd_client *client, const void *addr, size_t len, struct mrd_keys *ret);
int mrd_cache_keys_range(mrd_cache *cache, const void *addr, size_t len, struct mrd_keys *ret);

/*
 * Keys for n addresses in one request, n from 1 to MRD_KEYS_BATCH_MAX: keys[i] for addrs[i],
 * covering [addrs[i], addrs[i] + lens[i]) whole when lens is not NULL (as
 * mrd_keys_query_range()), else holding addrs[i] (as mrd_keys_query()). Each address fails
 * alone: errors[i] (errors may be NULL) is 0 or its -errno, and a failed keys[i] is zero with
 * both keys MRD_KEY_INVALID. Returns how many addresses got keys (0 to n), or -errno when the
 * request failed whole (keys and errors unwritten): -E2BIG for n > MRD_KEYS_BATCH_MAX (split
 * the batch), -EINVAL for n 0, a NULL array or a lens[i] of 0.
 */
#define MRD_KEYS_BATCH_MAX 64
int mrd_keys_query_batch(mrd_client *client, const void *const addrs[], const size_t lens[],
			 size_t n, struct mrd_keys keys[], int errors[]);

/*
 * Not API: what mrd_cache_lkey() reads inline, the first member of every mrd_cache (so a
 * pointer to the cache points to it). libmrd alone writes it; never touch it. Its layout is
 * part of the ABI: it changes only with libmrd's soname.
 */
#define MRD_CACHE_TOP 8
struct mrd_cache_hot {
	uint64_t generation;			 /* the domain's, when the cache was filled */
	const volatile uint64_t *generation_ptr; /* the domain's now, in the status page */
	unsigned mru, head;			 /* top[mru] hit last; top[head] goes next */
	struct mrd_keys top[MRD_CACHE_TOP];
};

#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L)
#define MRD_INLINE static inline
#else
#define MRD_INLINE static __inline__
#endif

/* The lkey for addr, or MRD_KEY_INVALID (mrd_cache_error() gives the errno, mrd_last_error()
 * the words). The hit on the most
 * recently used entry is inline: a load of the generation and two compares (about a ns);
 * anything else is mrd_cache_keys(). */
MRD_INLINE uint32_t mrd_cache_lkey(mrd_cache *cache, const void *addr)
{
	const struct mrd_cache_hot *h = (const struct mrd_cache_hot *)(void *)cache;
	const struct mrd_keys *e = &h->top[h->mru];
	uintptr_t a = (uintptr_t)addr;

	if (h->generation == *h->generation_ptr && a >= e->start && a < e->end)
		return e->lkey;
	return mrd_cache_lkey_slow(cache, addr);
}

/* An RDMA write (MRD_DMA_WRITE: local -> remote) or read (MRD_DMA_READ: remote -> local) by keys
 * alone, a request: emulated on the soft provider (-ENOKEY for a key that is not valid, -EACCES,
 * -EFAULT), done by the device on verbs, on mrd's queue pairs in the domain's PD (-EKEYREJECTED
 * when the device refused a key, -ETIMEDOUT). mrd queues 4 per domain: while other handles of the
 * domain keep it full, mrd_dma asks again (backing off) for up to 10 s, then fails with -EBUSY, not
 * done. */
#define MRD_DMA_WRITE 0
#define MRD_DMA_READ 1
int mrd_dma(mrd_client *client, int op, uint32_t lkey, const void *laddr, uint32_t rkey,
	    const void *raddr, size_t length);

/* Mempools: named pools of fixed-size objects carved from mrd memory, registered with the
 * device in advance (receive buffers, message slabs). get/put are thread-safe; register,
 * unregister and free must not race with other calls on the same pool. */
typedef struct mrd_mempool mrd_mempool;

/*
 * A pool of n objects of obj_size bytes, each aligned to obj_align (a power of two; 0: 8), in
 * chunks of at most chunk_size bytes (0: one chunk) that libmrd allocates from mrd with mem_flags
 * (MRD_MEM_HUGEPAGE): a request per chunk. name (1 to 63 bytes of printable ASCII) names it to mrd
 * and in mrctl mempools. Errors as mrd_mem_alloc(), and -EINVAL.
 */
int mrd_mempool_create(mrd_client *client, const char *name, size_t n, size_t obj_size,
		       size_t obj_align, size_t chunk_size, unsigned mem_flags, mrd_mempool **ret);

/* A pool carved from memory the caller has: [mem, mem + length) must lie in one allocation of
 * the caller's domain (allocated, mapped or attached). The memory stays the caller's. No
 * request. */
int mrd_mempool_create_in(mrd_client *client, const char *name, void *mem, size_t length,
			  size_t obj_size, size_t obj_align, mrd_mempool **ret);

/* Unregisters it (when registered) and frees the chunks it allocated: a request each.
 * NULL-safe; returns NULL. Objects still out are lost with it. */
mrd_mempool *mrd_mempool_free(mrd_mempool *pool);

/*
 * An object, or NULL when none is free (-ENOBUFS in mrd_last_error()) or pool is NULL. No
 * request, as for every call down to mrd_mempool_available(). Each thread keeps a cache of up to
 * 64 of a pool's free objects (1/8 of a smaller pool's; DPDK's per-lcore cache): get and put
 * take it first, with a lock no other thread takes while it has objects elsewhere to take; a
 * get that finds none free anywhere else takes from other threads' caches, so an object is
 * never out of reach. A thread's cache goes back to the pool when the thread exits; a thread
 * keeps caches for 8 pools at a time (others go to the pool's shared stack, a mutex).
 */
void *mrd_mempool_get(mrd_mempool *pool);
/*
 * Gives back an object that mrd_mempool_get() returned. -EINVAL (the pool is not changed) for
 * NULL, an address that is not an object of the pool, or not an object's start; -EALREADY for an
 * object put twice where that is seen: put right after its own last put in the same thread, or
 * one object more than the pool has (the extra one is dropped). A double put seen neither way
 * hands the object out twice later, as in DPDK: do not.
 */
int mrd_mempool_put(mrd_mempool *pool, void *obj);
/* n objects into objs[0..n), all or none: 0, or -ENOBUFS (none taken) when fewer than n are
 * free, -EINVAL for NULL. A bulk of 32 costs well under 32 gets. */
int mrd_mempool_get_bulk(mrd_mempool *pool, void **objs, unsigned n);
/* n objects back, each checked first: all or none (-EINVAL as mrd_mempool_put(), none put);
 * -EALREADY as there. */
int mrd_mempool_put_bulk(mrd_mempool *pool, void *const *objs, unsigned n);
/* Objects in the pool, and how many of them are not out (threads' caches included). 0 for
 * NULL. */
size_t mrd_mempool_size(const mrd_mempool *pool);
size_t mrd_mempool_available(mrd_mempool *pool);

/* mrd_mempool_register flags: register only the pages the objects use (a pool whose objects
 * live in attached external memory); replaces a registration of the whole chunks. */
#define MRD_MEMPOOL_EXTMEM 0x1u

/*
 * Registers the pool's memory with mrd (a request): its chunks (or, with MRD_MEMPOOL_EXTMEM, the
 * pages its objects use), rounded to pages, touching ranges merged. A pool inside one huge page
 * shares that page's MR with every other such pool of the domain. Errors: -EEXIST (registered
 * already), -EFAULT, -EDQUOT (quota.mempools, quota.pinned_bytes), -E2BIG (more than 1024 ranges).
 */
int mrd_mempool_register(mrd_mempool *pool, unsigned flags);
/* Drops the registration (a request). -ENOENT when it is not registered. Its keys die unless
 * another pool shares its MRs. */
int mrd_mempool_unregister(mrd_mempool *pool);

/* The cache and a mempool (no request to mrd: the pool keeps the keys its registration got).
 * mrd_cache_add_mempool puts all of a registered pool's keys into the cache's bottom half
 * (receive pools: no miss later). */
int mrd_cache_add_mempool(mrd_cache *cache, const mrd_mempool *pool);
/*
 * The keys for addr, an address of the pool's objects: the cache first, then the pool's own
 * registration. -ENOENT when the pool is not registered or addr is not in its registration.
 */
int mrd_cache_mempool_keys(mrd_cache *cache, const mrd_mempool *pool, const void *addr,
			   struct mrd_keys *ret);

/*
 * Advice for on-demand memory (MRD_MEM_ODP, or mrd's [cache] policy = odp), carried out on one of
 * mrd's worker threads (a request): the registrations of [addr, addr + length) are made, and with
 * MRD_PREFETCH or MRD_PREFETCH_WRITE their pages are made present, so that the device's first
 * access does not fault; MRD_PREFETCH_NO_FAULT has the device map the pages present already
 * (-EOPNOTSUPP where it cannot). With MRD_PREFETCH_FLUSH it returns once done, else once
 * queued. At most 16 are queued per handle and 256 per domain: past that a flush waits for
 * room, anything else is -EAGAIN. Errors: -EFAULT (not inside one allocation of the domain),
 * -EINVAL (not on-demand memory; MRD_PREFETCH_WRITE on MRD_MEM_READ_ONLY memory).
 */
#define MRD_PREFETCH 0
#define MRD_PREFETCH_WRITE 1
#define MRD_PREFETCH_NO_FAULT 2
#define MRD_PREFETCH_FLUSH 0x1u
int mrd_prefetch(mrd_client *client, const void *addr, size_t length, int advice,
		 unsigned flags);

/* Memory windows: remote access to [addr, addr + len) of an allocation of the caller's own
 * (mrd_mem_alloc), by the rkey of a type-2 window over exactly those bytes. access:
 * MRD_WINDOW_* bits, at least one. Two models (libmrd(3) "Memory windows"):
 * - qp NULL (the domain-PD model): mrd binds the window over the covering MR of the domain's
 *   PD on its own QP; peers reach it through mrd_dma. The rkey is refused from the moment
 *   mrd_window_revoke() returns. One request each; [quota] memory_windows counts them.
 * - qp a struct ibv_qp * (RC or UC) of the PD the handle is bound to (mrd_verbs_bind_pd): the
 *   client-PD model. libmrd binds a window of that PD, from qp's pool, on qp itself,
 *   over the MR mrd made in the PD (a request only the first time it meets that MR); peers
 *   on any host reach it through qp's connection. Both calls post one unsignaled work request
 *   on qp (wr_id MRD_WINDOW_WR_ID: a QP that signals all sees its completions) and return:
 *   the bind takes effect before any later work request of qp, so a SEND of the rkey posted
 *   after the grant reaches the peer after the window is bound; the revoke's invalidate
 *   likewise, so the rkey is refused once a work request posted after the revoke completed
 *   (on a QP the program moved to the error state or reset, the revoke deallocates the
 *   window: refused at once). Revoke on the QP the window was granted on. libmrd sees none
 *   of these completions: before freeing the memory, closing the handle or
 *   mrd_window_qp_gone(), have a completion of a work request posted on qp after the last
 *   grant and revoke there (libmrd deallocates the windows then, which would fail a bind or
 *   invalidate still queued, and the QP).
 * Either way the window dies when the memory is freed, before mrd lets the pages go (domain-PD:
 * mrd invalidates it first; client-PD: libmrd deallocates it in mrd_mem_free() before the
 * Free goes out, and refuses grants over it until mrd answered). Errors: -EOPNOTSUPP (no
 * windows on the device: the message says why; client-PD: read-only memory), -EACCES
 * (another process's memory), -EPERM (client-PD: another handle's), -ERANGE (past its
 * allocation), -EDQUOT ([quota] memory_windows, domain-PD), -ENOENT (not mrd memory;
 * client-PD: memory whose free is under way, or was freed a moment ago and allocated again
 * before that free returned: try again; revoke: not a window of this handle's), -ENXIO (a qp, but the handle bound to no PD), -EINVAL (a
 * qp of another PD or type; revoke: another QP than the grant's), -ENOMEM (qp's send queue is
 * full: nothing changed). */
#define MRD_WINDOW_REMOTE_READ 0x1u
#define MRD_WINDOW_REMOTE_WRITE 0x2u
#define MRD_WINDOW_REMOTE_ATOMIC 0x4u
#define MRD_WINDOW_WR_ID 0x6d72642d77696e64ull /* "mrd-wind": the client-PD model's requests */
int mrd_window_grant(mrd_client *client, void *qp, const void *addr, size_t len, unsigned access,
		     uint32_t *rkey);
int mrd_window_revoke(mrd_client *client, void *qp, uint32_t rkey);
/* The client-PD model: libmrd deallocates every window it granted or pooled on qp (their rkeys
 * die at once), once nothing it posted there can still run: before destroying qp, and after
 * resetting it, before it goes back to INIT. How many (0 or more), or -EINVAL, -ECHILD,
 * -EOPNOTSUPP (a libmrd built without <infiniband/verbs.h>). */
int mrd_window_qp_gone(mrd_client *client, void *qp);
/* The client-PD model: windows the program allocated in the PD the handle is bound to
 * (mw_handle: ibv_mw.handle), which mrd deallocates, through its copy of the command fd, when
 * the handle's connection ends without mrd_client_close() (the process died), before it
 * deregisters its MRs of that PD. A window left bound over one of them would otherwise keep
 * the MR and its pages: rxe refuses the dereg. Track a window from its allocation, untrack it
 * once deallocated (its handle number may be another window's then). mrd_client_close()
 * untracks them all; a hand-over (mrd's warm restart) deallocates none. libmrd tracks its own
 * (mrd_window_grant) and libmrd-preload its windows. One request each; a reconnect tells the
 * new mrd the set again. At most 1,024 per handle. Errors: -ENXIO (no PD bound), -ENOSPC
 * (1,024 already), -ENOENT (untrack: not tracked), -ECHILD (a fork() child's handle), and the
 * other errors of a call. */
int mrd_window_track(mrd_client *client, uint32_t mw_handle);
int mrd_window_untrack(mrd_client *client, uint32_t mw_handle);

/* The negotiated protocol version (positive), or -EINVAL for a NULL handle. No request, as
 * for the versions below. */
int mrd_client_protocol_version(const mrd_client *client);

/* mrd's package version, e.g. "0.1.0"; valid while the handle lives. NULL for NULL. */
const char *mrd_client_server_version(const mrd_client *client);

/* libmrd's own package version. */
const char *mrd_version(void);

#ifdef __cplusplus
}
#endif

#endif
