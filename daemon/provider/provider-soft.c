/* SPDX-License-Identifier: MIT */
/* soft: a software NIC. Keys are a 24-bit index and an 8-bit variant that changes whenever an
 * index is reused or its MR moves, so a stale key is caught, never silently valid (rxe draws
 * a random key byte likewise; mlx5's mkeys come back unchanged: $MRD_SOFT_KEYS=mlx5). It pins with mlock, keeps a translation per page, executes emulated DMA through
 * those translations with the access and bounds checks a NIC makes (fault-safe, outside the
 * lock, holding both MRs), and emulates ODP: an on-demand MR pins nothing and its pages
 * become present on fault or prefetch, populated outside the lock too.
 *
 * Test knobs, read at open: $MRD_SOFT_KEY_BITS (fewer keys), $MRD_SOFT_MAPS=1 (no
 * MADV_POPULATE_*), $MRD_SOFT_KEYS=mlx5 (keys come back unchanged, see keys_cached),
 * $MRD_SOFT_REREG (how a move behaves, see rereg_mode), $MRD_SOFT_DMA=iwarp (no DMA through
 * keys, see dma_mode), $MRD_SOFT_MW=none (no memory windows, see mw_mode), and a gate that holds a device op
 * until the test lets it go, so that a
 * test can show who is served meanwhile without timing anything: $MRD_SOFT_GATE=<dir>, where
 * the test made the FIFOs <dir>/entered and <dir>/release, and $MRD_SOFT_GATE_BYTES=<n>
 * (default 1): only ops of n bytes or more wait. A gated reg (before it pins), rereg with a
 * new translation, advise (before it populates) or DMA that faults n bytes of pages in (before
 * it populates them, holding its MRs but not the lock) writes 'r', 'm', 'a' or 'f' to entered,
 * then reads a byte from release before it goes on, holding whatever its caller holds (a reg:
 * the provider's lock). tests/test-util.h has the helpers (soft_gate_*). With
 * $MRD_SOFT_GATE_REVIVE=1 a revive of n pinned bytes or more (before it registers its MRs
 * again, as verbs_revive pins each anew: seconds for GiBs) writes 'v' and waits too.
 * $MRD_SOFT_DEREG_FAIL=<n>: the next n deregs and parks of the context (the commands that
 * take an MR off its memory) fail with -EIO and leave the MR as it was (live, pinned, its keys
 * working), as a device whose command fails does: the kernel keeps the object ("wait till
 * ucontext will clean it", Linux 6.12 drivers/infiniband/core/rdma_core.c,
 * uverbs_destroy_uobject) and mlx5_dereg_mr keeps the handle (rdma-core
 * providers/mlx5/verbs.c), so the dereg can be tried again.
 * $MRD_SOFT_REVIVE_FAIL=<n>: the context's next n revives fail with -EIO, staying lost (as a
 * returned device may refuse one context: ibv_alloc_pd's ENOMEM), so a partial return is tested.
 * $MRD_SOFT_MW_INVALIDATE_FAIL=<n>: the next n window invalidates fail with -EIO, the window
 * left bound and its key working (a local invalidate whose work request completes in error).
 * $MRD_SOFT_MW_DEALLOC_FAIL=<n>: the next n window deallocations fail with -EIO, the window
 * left as it was (bound windows too: their keys keep working).
 * $MRD_SOFT_MAX_MW=<n>: the device (every soft context together) holds at most n windows
 * (caps.max_mw; default 2^20, the order of rxe's): mw_alloc fails with -ENOMEM past it, as
 * ibv_alloc_mw does.
 * $MRD_SOFT_MW_BIND_LATE=<n>: the next n binds fail with -ETIMEDOUT while the device moved the
 * window's key all the same, as a bind work request that completes after mrd stopped waiting
 * for it (verbs: PART_TIMEOUT_USEC); every later bind of that window then fails with -EINVAL,
 * as rxe_bind_mw refuses a bind that names a key the window no longer has (librxe passes
 * ibv_mw->rkey, which the late completion left behind). The stale binding itself reaches
 * nothing here (the wrapper recorded none).
 * $MRD_SOFT_EXPORT=1: export_pd hands out a dup of a memfd standing for the context's command
 * descriptor (nothing can import it), so that what mrd does for exported contexts is tested.
 *
 * Memory windows (type 2) have keys of their own, in an index range no MR takes (rxe keeps
 * them apart likewise: RXE_MIN_MW_INDEX, rkey_is_mw). A bind advances the key byte, as
 * ibv_inc_rkey does; after 255 binds the window takes an index never used before, and a
 * window's index is never handed out again, in any key mode: an old window key reaches
 * nothing, ever (mlx5's mkey cache does not hold windows). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"
#include "provider/pin-map.h"
#include "provider/provider.h"
#include "provider/safe-copy.h"
#include "provider/soft-device.h"

/* MR indexes 1 .. min(2^bits - 2, 2^23 - 1): 0 is never a key, windows take those from 2^23
 * on, and index 2^24 - 1 could make 0xffffffff, which libmrd reserves for "no key"
 * (MRD_KEY_INVALID). Each context (a domain: mrd opens one per
 * domain) has its own; $MRD_SOFT_KEY_BITS (2..24) makes it smaller, so tests can use it up. */
#define SOFT_INDEX_BITS 24
/* Variants 1 .. 255: an index that gave its last is spent, never taken again, so no key comes
 * back while anyone may hold it (a context makes at most ~2^32 keys; then -EKEYEXPIRED). */
#define SOFT_VARIANT_LAST 255
#define SOFT_MAX_MR_SIZE (1ull << 36)    /* keeps a translation table within 128 MiB */
/* Window indexes: [SOFT_MW_INDEX0, SOFT_MW_INDEX_END), each taken once; MRs stay below. */
#define SOFT_MW_INDEX0 (1u << 23)
#define SOFT_MW_INDEX_END ((1u << 24) - 1)

struct soft_mr;
struct soft_mw;

struct soft_pd {
	struct provider_pd base;
	struct soft_pd *next;
};

struct soft_slot {
	struct soft_mr *mr;  /* NULL: free, or spent */
	uint32_t next_free;  /* while free: the next free index; 0: none */
	uint8_t variant;     /* the last one given; 0: none yet */
};

/* The key table in chunks of indexes: a chunk whose indexes are all spent is freed, so what
 * a context has retired costs a pointer per SOFT_CHUNK indexes (2 MiB for all 2^24). A fresh
 * index is taken only when every index not spent is in use, so the chunks that stay number
 * at most the most MRs the context held at once, plus one. */
#define SOFT_CHUNK 64
struct soft_chunk {
	unsigned spent; /* indexes that will never be a key again (or never were) */
	struct soft_slot slot[SOFT_CHUNK];
};

struct soft_provider {
	struct provider base;
	struct soft_chunk **chunks; /* by index / SOFT_CHUNK; NULL below n_slots: all spent */
	uint32_t n_chunks, chunks_cap;
	uint32_t n_slots;           /* indexes taken so far; fresh ones come from here */
	uint32_t free_head;         /* LIFO, so reuse is immediate and tests see it; none spent */
	uint32_t index_limit;       /* the first index that is never a key */
	unsigned n_pds;
	struct soft_pd *pds; /* those not freed: a PD whose MRs the device kept goes at close */
	struct pin_map pins;
	pthread_cond_t idle; /* an MR's last copy ended (soft_mr.copies) */
	struct provider_stats stats;
	uintptr_t page_size;
	bool populate; /* MADV_POPULATE_* checks mappings (mapped_for) */
	int gate_entered, gate_release; /* $MRD_SOFT_GATE's FIFOs; -1: no gate */
	uint64_t gate_bytes;
	bool gate_revive; /* $MRD_SOFT_GATE_REVIVE=1 */
	/* $MRD_SOFT_KEYS=mlx5: keys behave as mlx5's mkey cache makes them (Linux 6.12,
	 * drivers/infiniband/hw/mlx5/): dereg revokes the mkey keeping its variant (umr.c,
	 * mlx5r_umr_revoke_mr: mkey_7_0 = mlx5_mkey_variant(key)) and stores it in the cache
	 * entry of its exact size (mr.c, mlx5r_handle_mkey_cleanup -> cache_ent_find_and_store ->
	 * push_mkey_locked); the next registration of that size pops the last one stored
	 * (alloc_cacheable_mr -> _mlx5_mr_cache_alloc -> pop_mkey_locked), lkey and rkey
	 * unchanged. A move (UMR) keeps the keys too. Here: one LIFO of indexes per page count;
	 * variants never change; fresh indexes first when a class is empty, then any class's. */
	bool keys_cached;
	bool move_refused, move_keeps_keys; /* $MRD_SOFT_REREG (rereg_mode), or keys_cached */
	/* Its device failed and mrd let go of it (soft_lose; atomic): until soft_revive, only
	 * dereg and pd_free work, and keys reach nothing. */
	bool lost;
	bool destroy_when_failed; /* $RDMAV_ALLOW_DISASSOC_DESTROY, as libibverbs reads it */
	unsigned dereg_fail; /* $MRD_SOFT_DEREG_FAIL: deregs and parks left to fail */
	unsigned mw_invalidate_fail; /* $MRD_SOFT_MW_INVALIDATE_FAIL: invalidates left to fail */
	unsigned mw_dealloc_fail;    /* $MRD_SOFT_MW_DEALLOC_FAIL: deallocs left to fail */
	unsigned mw_bind_late;       /* $MRD_SOFT_MW_BIND_LATE: binds left to complete late */
	unsigned max_mw;             /* $MRD_SOFT_MAX_MW: caps.max_mw */
	unsigned revive_fail; /* $MRD_SOFT_REVIVE_FAIL: revives left to fail */
	bool exports;        /* $MRD_SOFT_EXPORT=1 */
	int export_fd;       /* its stand-in command descriptor, made at the first export; -1 */
	struct soft_key_class *classes;
	unsigned n_classes, classes_cap;
	/* Windows by index - SOFT_MW_INDEX0, in chunks (NULL: all spent); mw_next is the next
	 * fresh index. Each window is on the list too, for revive and close. */
	struct soft_mw_chunk **mw_chunks;
	uint32_t n_mw_chunks, mw_chunks_cap;
	uint32_t mw_next;
	struct soft_mw *mws;
};

struct soft_mw_chunk {
	unsigned spent;
	struct soft_mw *mw[SOFT_CHUNK];
};

struct soft_mw {
	struct provider_mw base;
	struct soft_mw *prev, *next;
	uint32_t index;  /* 0: none (spent at revive): the next bind takes one */
	uint8_t variant; /* the key byte of the last bind (0 at alloc; wraps) */
	unsigned copying; /* chunks of DMA through it under way (window_copy), each after a
			   * look at its key */
	bool stale; /* a late bind moved its key (MRD_SOFT_MW_BIND_LATE): binds fail */
};

/* Windows of every soft context: one device's (MRD_SOFT_MAX_MW). */
static unsigned device_mws;

/* $MRD_SOFT_KEYS=mlx5: the indexes released by MRs of pages pages, last released first. */
struct soft_key_class {
	size_t pages;
	uint32_t head; /* chained through soft_slot.next_free; 0: none */
};

struct soft_mr {
	struct provider_mr base;
	uint32_t index;
	bool on_demand;
	bool parked;                  /* kept by a pool: no key reaches it, it pins nothing */
	uintptr_t pin_start, pin_end; /* pinned page range; empty for ODP */
	uint64_t iova_page0;          /* iova rounded down to a page */
	uint8_t **pages;              /* host address of each page; NULL: not present (ODP) */
	size_t n_pages;
	size_t key_class;             /* keys_cached: n_pages at reg; a park or move keeps it */
	unsigned copies;              /* DMA copies and prefetches through it, run without the lock */
};

static struct soft_provider *to_soft(struct provider *p) { return (struct soft_provider *)p; }

static uint32_t make_key(uint32_t index, uint8_t variant) { return index << 8 | variant; }

/* What a device may lack, modelled (test knobs): $MRD_SOFT_ATOMIC=none (atomic_cap
 * IBV_ATOMIC_NONE: a registration asking for remote atomics fails, as EFA's), $MRD_SOFT_ODP_RC
 * (the RC ODP bits, e.g. "send,recv,write": a Dma that would fault an on-demand MR's pages in
 * for an operation without its bit fails) and $MRD_SOFT_ADVISE_MAX (bytes one advise takes, a
 * multiple of the page size; longer is EINVAL, as ibv_sge.length's 32 bits make it). */
struct soft_caps_knobs {
	bool atomic;
	uint32_t odp_rc;
	uint64_t advise_max;
};

static int atomic_knob(bool *ret)
{
	const char *e = getenv("MRD_SOFT_ATOMIC");

	*ret = !e || !*e || strcmp(e, "hca") == 0;
	if (*ret || strcmp(e, "none") == 0)
		return 0;
	log_error("MRD_SOFT_ATOMIC=%s: hca or none", e);
	return -EINVAL;
}

static int odp_rc_knob(uint32_t *ret)
{
	static const char *const names[] = { "send", "recv", "write", "read", "atomic", "srq" };
	const char *e = getenv("MRD_SOFT_ODP_RC");

	*ret = 0x3f; /* all of them */
	if (!e || !*e)
		return 0;
	*ret = 0;
	if (strcmp(e, "none") == 0)
		return 0;
	for (const char *at = e;; at++) {
		size_t n = strcspn(at, ","), i;

		for (i = 0; i < ELEMENTSOF(names); i++)
			if (strlen(names[i]) == n && strncmp(at, names[i], n) == 0)
				break;
		if (i == ELEMENTSOF(names)) {
			log_error("MRD_SOFT_ODP_RC=%s: a list of send,recv,write,read,atomic,srq, "
				  "or none", e);
			return -EINVAL;
		}
		*ret |= 1u << i;
		at += n;
		if (!*at)
			return 0;
	}
}

static int advise_max_knob(uintptr_t page_size, uint64_t *ret)
{
	const char *e = getenv("MRD_SOFT_ADVISE_MAX");
	char *end;

	*ret = 1ull << 31; /* as verbs: ibv_sge.length's 32 bits, in whole pages */
	if (!e || !*e)
		return 0;
	errno = 0;
	*ret = strtoull(e, &end, 10);
	if (errno || *end || *ret == 0 || *ret % page_size) {
		log_error("MRD_SOFT_ADVISE_MAX=%s: bytes, a multiple of the page size", e);
		return -EINVAL;
	}
	return 0;
}

static int caps_knobs(uintptr_t page_size, struct soft_caps_knobs *ret)
{
	if (atomic_knob(&ret->atomic) < 0 || odp_rc_knob(&ret->odp_rc) < 0)
		return -EINVAL;
	return advise_max_knob(page_size, &ret->advise_max);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#define MADV_POPULATE_WRITE 23
#endif

/* Whether the kernel has MADV_POPULATE_*: tried at open on a page of our own, since EINVAL
 * also means the wrong protection. $MRD_SOFT_MAPS=1 takes the older way (its tests use it). */
static bool populate_works(uintptr_t ps)
{
	const char *maps = getenv("MRD_SOFT_MAPS");
	void *page;
	bool works;

	if (maps && strcmp(maps, "1") == 0)
		return false;
	page = mmap(NULL, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return false;
	works = madvise(page, ps, MADV_POPULATE_WRITE) == 0;
	munmap(page, ps);
	return works;
}

/* $MRD_SOFT_KEY_BITS, a test knob: index bits of each context's keys. */
static int index_bits(unsigned *ret)
{
	const char *e = getenv("MRD_SOFT_KEY_BITS");
	unsigned long bits;
	char *end;

	*ret = SOFT_INDEX_BITS;
	if (!e || !*e)
		return 0;
	errno = 0;
	bits = strtoul(e, &end, 10);
	if (errno || *end || bits < 2 || bits > SOFT_INDEX_BITS)
		return -EINVAL;
	*ret = (unsigned)bits;
	return 0;
}

/* <dir>/<name>, which must be a FIFO: a gate on anything else would not hold (a file) or
 * would hold forever (a terminal). */
static int gate_fifo_open(const char *dir, const char *name)
{
	char path[PATH_MAX];
	struct stat st;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		log_error_errno(-errno, "MRD_SOFT_GATE: cannot open %s: %m", path);
		return -1;
	}
	if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode) ||
	    fcntl(fd, F_SETFL, 0) < 0) { /* blocking from here on */
		log_error("MRD_SOFT_GATE: %s is not a FIFO (mkfifo(3) it)", path);
		close(fd);
		return -1;
	}
	return fd;
}

/* $MRD_SOFT_KEYS, a test knob: "mlx5" (keys_cached) or "variant" (the default). */
static int keys_mode(bool *ret_cached)
{
	const char *e = getenv("MRD_SOFT_KEYS");

	*ret_cached = e && strcmp(e, "mlx5") == 0;
	return !e || !*e || *ret_cached || strcmp(e, "variant") == 0 ? 0 : -EINVAL;
}

/* $MRD_SOFT_REREG, a test knob: how a move (a rereg with a new translation) behaves, as on
 * the real devices (provider-verbs.c, probe_rereg): "move" (the default: new keys, but with
 * MRD_SOFT_KEYS=mlx5), "refuse" (rxe, siw: -EOPNOTSUPP; so is a park, which on verbs is a
 * move) or "keep-keys" (mlx5's UMR, irdma: lkey and rkey stay). Also says it in caps. */
static int rereg_mode(struct soft_provider *sp)
{
	const char *e = getenv("MRD_SOFT_REREG");
	char *why = sp->base.caps.rereg_probe;
	const size_t size = sizeof(sp->base.caps.rereg_probe);

	sp->move_refused = e && strcmp(e, "refuse") == 0;
	sp->move_keeps_keys = sp->keys_cached || (e && strcmp(e, "keep-keys") == 0);
	if (e && *e && !sp->move_refused && strcmp(e, "keep-keys") != 0 && strcmp(e, "move") != 0) {
		log_error("MRD_SOFT_REREG=%s: not move, refuse or keep-keys", e);
		return -EINVAL;
	}
	if (sp->move_refused)
		snprintf(why, size, "rereg: %s (MRD_SOFT_REREG=refuse, as rxe and siw)",
			 strerror(EOPNOTSUPP));
	else if (sp->move_keeps_keys)
		snprintf(why, size, "a move keeps its keys (%s, as mlx5's UMR)",
			 sp->keys_cached ? "MRD_SOFT_KEYS=mlx5" : "MRD_SOFT_REREG=keep-keys");
	else
		snprintf(why, size, "a move gives new lkey and rkey");
	sp->base.caps.rereg_translation = !sp->move_refused;
	sp->base.caps.rereg_new_keys = !sp->move_refused && !sp->move_keeps_keys;
	return 0;
}

/* $MRD_SOFT_DMA, a test knob: "iwarp" makes soft a device that does no DMA through keys, for
 * the reason an iWARP one does none (verbs_loopback_unsupported); "emulated" is the default. */
static int dma_mode(const char **ret_no_dma)
{
	const char *e = getenv("MRD_SOFT_DMA");

	*ret_no_dma = NULL;
	if (e && strcmp(e, "iwarp") == 0)
		*ret_no_dma = "iWARP ($MRD_SOFT_DMA=iwarp): its RC QPs connect only over a TCP "
			      "connection made by rdma_cm, never on loopback by modify_qp";
	else if (e && *e && strcmp(e, "emulated") != 0)
		return log_error_errno(-EINVAL, "MRD_SOFT_DMA=%s: not iwarp or emulated", e);
	return 0;
}

/* $MRD_SOFT_MW, a test knob: "none" makes soft a device without memory windows, as siw is;
 * "rxe" (the default) has type-2 windows with rxe's rules, exact to their bytes. */
static int mw_mode(const char **ret_no_mw)
{
	const char *e = getenv("MRD_SOFT_MW");

	*ret_no_mw = NULL;
	if (e && strcmp(e, "none") == 0)
		*ret_no_mw = "no memory windows ($MRD_SOFT_MW=none, as siw)";
	else if (e && *e && strcmp(e, "rxe") != 0)
		return log_error_errno(-EINVAL, "MRD_SOFT_MW=%s: not none or rxe", e);
	return 0;
}

/* A test knob that counts the next ops to fail ($name=<n>; unset: none). */
static int count_knob(const char *name, const char *what, unsigned *ret)
{
	const char *e = getenv(name);
	unsigned long n;
	char *end;

	*ret = 0;
	if (!e || !*e)
		return 0;
	errno = 0;
	n = strtoul(e, &end, 10);
	if (errno || *end || n > UINT_MAX) {
		log_error("%s=%s: not a count of %s", name, e, what);
		return -EINVAL;
	}
	*ret = (unsigned)n;
	return 0;
}

/* $MRD_SOFT_DEREG_FAIL, a test knob: how many deregs and parks fail (the top comment). */
static int dereg_failures(unsigned *ret)
{
	return count_knob("MRD_SOFT_DEREG_FAIL", "deregs", ret);
}

/* $MRD_SOFT_REVIVE_FAIL, a test knob: how many revives fail (the top comment). */
static int revive_failures(unsigned *ret)
{
	return count_knob("MRD_SOFT_REVIVE_FAIL", "revives", ret);
}

/* $MRD_SOFT_EXPORT, a test knob: "1" exports a stand-in context, "0" or unset none. */
static int export_mode(bool *ret)
{
	const char *e = getenv("MRD_SOFT_EXPORT");

	*ret = e && strcmp(e, "1") == 0;
	if (!e || !*e || *ret || strcmp(e, "0") == 0)
		return 0;
	log_error("MRD_SOFT_EXPORT=%s: 1 or 0", e);
	return -EINVAL;
}

/* $MRD_SOFT_GATE_REVIVE (the top comment): "1" gates revives, "0" or unset not. */
static int gate_revive_mode(bool *ret)
{
	const char *e = getenv("MRD_SOFT_GATE_REVIVE");

	*ret = e && strcmp(e, "1") == 0;
	if (!e || !*e || *ret || strcmp(e, "0") == 0)
		return 0;
	log_error("MRD_SOFT_GATE_REVIVE=%s: 1 or 0", e);
	return -EINVAL;
}

/* $MRD_SOFT_GATE and $MRD_SOFT_GATE_BYTES (the top comment). O_RDWR never blocks on a FIFO,
 * and keeps what the test wrote there while nobody else holds it open. */
static int gate_open(struct soft_provider *sp)
{
	const char *dir = getenv("MRD_SOFT_GATE"), *bytes = getenv("MRD_SOFT_GATE_BYTES");
	char *end;

	sp->gate_entered = sp->gate_release = -1;
	if (gate_revive_mode(&sp->gate_revive) < 0)
		return -EINVAL;
	if (!dir || !*dir)
		return 0;
	sp->gate_bytes = 1;
	if (bytes && *bytes) {
		errno = 0;
		sp->gate_bytes = strtoull(bytes, &end, 10);
		if (errno || *end)
			return -EINVAL;
	}
	sp->gate_entered = gate_fifo_open(dir, "entered");
	sp->gate_release = gate_fifo_open(dir, "release");
	if (sp->gate_entered < 0 || sp->gate_release < 0)
		return -EINVAL;
	return 0;
}

static void gate_close(struct soft_provider *sp)
{
	if (sp->gate_entered >= 0)
		close(sp->gate_entered);
	if (sp->gate_release >= 0)
		close(sp->gate_release);
}

/* An op of bytes says it entered (op), then waits until the test releases it. */
static void gate_pass(struct soft_provider *sp, char op, uint64_t bytes)
{
	char c;

	if (sp->gate_release < 0 || bytes < sp->gate_bytes)
		return;
	while (write(sp->gate_entered, &op, 1) < 0 && errno == EINTR)
		;
	while (read(sp->gate_release, &c, 1) < 0 && errno == EINTR)
		;
}

/* The device's state for an op (soft-device.h): -ENODEV once lost, -EIO while it failed. */
static int soft_dead(struct soft_provider *sp)
{
	if (__atomic_load_n(&sp->lost, __ATOMIC_ACQUIRE))
		return -ENODEV;
	return soft_device_failed() ? -EIO : 0;
}

/* A destroy on a failed device: done once mrd let go of it, or when libibverbs would say so. */
static int soft_destroy_dead(struct soft_provider *sp)
{
	return sp->lost || sp->destroy_when_failed || !soft_device_failed() ? 0 : -EIO;
}

static int soft_open(const char *device, struct provider **ret)
{
	struct soft_provider *sp;
	const char *no_dma, *no_mw;
	unsigned bits, dereg_fail, revive_fail, mw_invalidate_fail, mw_dealloc_fail, mw_bind_late;
	unsigned max_mw;
	bool keys_cached, exports;
	struct soft_caps_knobs knobs;

	if (device && strcmp(device, "soft") != 0)
		return -ENODEV;
	if (index_bits(&bits) < 0 || keys_mode(&keys_cached) < 0 || dma_mode(&no_dma) < 0 ||
	    mw_mode(&no_mw) < 0 ||
	    dereg_failures(&dereg_fail) < 0 || revive_failures(&revive_fail) < 0 ||
	    count_knob("MRD_SOFT_MW_INVALIDATE_FAIL", "invalidates", &mw_invalidate_fail) < 0 ||
	    count_knob("MRD_SOFT_MW_DEALLOC_FAIL", "deallocs", &mw_dealloc_fail) < 0 ||
	    count_knob("MRD_SOFT_MW_BIND_LATE", "binds", &mw_bind_late) < 0 ||
	    count_knob("MRD_SOFT_MAX_MW", "windows", &max_mw) < 0 ||
	    export_mode(&exports) < 0 ||
	    caps_knobs((uintptr_t)sysconf(_SC_PAGESIZE), &knobs) < 0 || soft_device_open() < 0)
		return -EINVAL;
	sp = soft_device_failed() ? NULL : calloc(1, sizeof(*sp));
	if (!sp) {
		soft_device_close();
		return soft_device_failed() ? -ENODEV : -ENOMEM;
	}
	sp->base.ops = &provider_soft_ops;
	pthread_mutex_init(&sp->base.lock, NULL);
	pthread_mutex_init(&sp->base.event_lock, NULL);
	pthread_cond_init(&sp->idle, NULL);
	sp->page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
	sp->populate = populate_works(sp->page_size);
	sp->n_slots = 1;
	sp->index_limit = (1u << bits) - 1;
	if (sp->index_limit > SOFT_MW_INDEX0)
		sp->index_limit = SOFT_MW_INDEX0; /* the windows' indexes are above */
	sp->mw_next = SOFT_MW_INDEX0;
	sp->keys_cached = keys_cached;
	sp->destroy_when_failed = getenv("RDMAV_ALLOW_DISASSOC_DESTROY") != NULL;
	sp->dereg_fail = dereg_fail;
	sp->mw_invalidate_fail = mw_invalidate_fail;
	sp->mw_dealloc_fail = mw_dealloc_fail;
	sp->mw_bind_late = mw_bind_late;
	sp->max_mw = max_mw ? max_mw : 1u << 20;
	sp->revive_fail = revive_fail;
	sp->exports = exports;
	sp->export_fd = -1;
	if (rereg_mode(sp) < 0 || gate_open(sp) < 0) {
		gate_close(sp);
		soft_device_close();
		pthread_cond_destroy(&sp->idle);
		pthread_mutex_destroy(&sp->base.lock);
		pthread_mutex_destroy(&sp->base.event_lock);
		free(sp);
		return -EINVAL;
	}
	pin_map_init(&sp->pins);
	snprintf(sp->base.caps.device, sizeof(sp->base.caps.device), "soft");
	sp->base.caps.port_active = soft_device_port_active();
	sp->base.caps.max_mr_size = SOFT_MAX_MR_SIZE;
	sp->base.caps.page_size = (uint32_t)sp->page_size;
	sp->base.caps.odp = true;
	sp->base.caps.odp_implicit = true;
	sp->base.caps.odp_rc_caps = knobs.odp_rc;
	sp->base.caps.atomic = knobs.atomic;
	sp->base.caps.advise_max = knobs.advise_max;
	sp->base.caps.keys_come_back = keys_cached;
	sp->base.caps.odp_move_recreates = keys_cached; /* move_recreates */
	sp->base.caps.dma = !no_dma;
	sp->base.caps.no_dma = no_dma;
	sp->base.caps.dma_emulated = true;
	sp->base.caps.export_pd = exports;
	sp->base.caps.mw = !no_mw;
	sp->base.caps.no_mw = no_mw;
	/* A bind changes the key byte alone, as on verbs: the 257th bind of a window gives its
	 * first key again (mrd deallocates a window before that, mw-grants.h). */
	sp->base.caps.mw_fresh_binds = 256;
	sp->base.caps.max_mw = no_mw ? 0 : sp->max_mw;
	sp->base.caps.max_keys = keys_cached ? 0 : (uint64_t)(sp->index_limit - 1) * SOFT_VARIANT_LAST;
	*ret = &sp->base;
	return 0;
}

static void soft_mr_free(struct soft_mr *mr)
{
	free(mr->pages);
	free(mr);
}

static void soft_close(struct provider *p)
{
	struct soft_provider *sp = to_soft(p);

	/* Whatever callers left behind goes; the pin map unlocks it all at once. */
	for (uint32_t c = 0; c < sp->n_chunks; c++) {
		if (!sp->chunks[c])
			continue;
		for (unsigned i = 0; i < SOFT_CHUNK; i++)
			if (sp->chunks[c]->slot[i].mr)
				soft_mr_free(sp->chunks[c]->slot[i].mr);
		free(sp->chunks[c]);
	}
	while (sp->mws) {
		struct soft_mw *mw = sp->mws;

		__atomic_sub_fetch(&device_mws, 1, __ATOMIC_RELAXED);

		sp->mws = mw->next;
		free(mw);
	}
	for (uint32_t c = 0; c < sp->n_mw_chunks; c++)
		free(sp->mw_chunks[c]);
	free(sp->mw_chunks);
	while (sp->pds) {
		struct soft_pd *pd = sp->pds;

		sp->pds = pd->next;
		free(pd);
	}
	pin_map_done(&sp->pins);
	gate_close(sp);
	soft_device_close();
	if (sp->export_fd >= 0)
		close(sp->export_fd);
	free(sp->classes);
	free(sp->chunks);
	pthread_cond_destroy(&sp->idle);
	pthread_mutex_destroy(&sp->base.lock);
	pthread_mutex_destroy(&sp->base.event_lock);
	free(sp);
}

static int soft_pd_alloc(struct provider *p, struct provider_pd **ret)
{
	struct soft_pd *pd;
	int r = soft_dead(to_soft(p));

	if (r < 0)
		return r;
	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return -ENOMEM;
	pd->base.provider = p;
	pd->next = to_soft(p)->pds;
	to_soft(p)->pds = pd;
	to_soft(p)->n_pds++;
	*ret = &pd->base;
	return 0;
}

static int soft_pd_free(struct provider_pd *base)
{
	struct soft_provider *sp = to_soft(base->provider);
	struct soft_pd **at = &sp->pds;

	if (base->n_mrs > 0)
		return -EBUSY;
	if (soft_destroy_dead(sp) < 0)
		return -EIO;
	while (&(*at)->base != base)
		at = &(*at)->next;
	*at = (*at)->next;
	sp->n_pds--;
	free(base);
	return 0;
}

static struct soft_slot *slot_of(struct soft_provider *sp, uint32_t index)
{
	return &sp->chunks[index / SOFT_CHUNK]->slot[index % SOFT_CHUNK];
}

/* Makes room for fresh index sp->n_slots. */
static int chunk_add(struct soft_provider *sp)
{
	uint32_t c = sp->n_slots / SOFT_CHUNK;
	struct soft_chunk *chunk;

	if (c < sp->n_chunks)
		return 0;
	if (c >= sp->chunks_cap) {
		uint32_t cap = sp->chunks_cap ? sp->chunks_cap * 2 : 4;
		struct soft_chunk **chunks = realloc(sp->chunks, cap * sizeof(*chunks));

		if (!chunks)
			return -ENOMEM;
		sp->chunks = chunks;
		sp->chunks_cap = cap;
	}
	chunk = calloc(1, sizeof(*chunk));
	if (!chunk)
		return -ENOMEM;
	/* Index 0 and those from index_limit on are never keys: spent from the start. */
	for (uint32_t i = c * SOFT_CHUNK; i < (c + 1) * SOFT_CHUNK; i++)
		if (i == 0 || i >= sp->index_limit)
			chunk->spent++;
	sp->chunks[sp->n_chunks++] = chunk;
	return 0;
}

/* keys_cached: pops the index released last by an MR of pages pages (pages 0: of any). */
static bool class_pop(struct soft_provider *sp, size_t pages, uint32_t *ret)
{
	for (unsigned i = 0; i < sp->n_classes; i++) {
		struct soft_key_class *c = &sp->classes[i];

		if ((pages && c->pages != pages) || !c->head)
			continue;
		*ret = c->head;
		c->head = slot_of(sp, c->head)->next_free;
		return true;
	}
	return false;
}

/* keys_cached: pushes index on its class's LIFO; false when out of memory. */
static bool class_push(struct soft_provider *sp, size_t pages, uint32_t index)
{
	struct soft_key_class *c = NULL;

	for (unsigned i = 0; i < sp->n_classes && !c; i++)
		if (sp->classes[i].pages == pages)
			c = &sp->classes[i];
	if (!c) {
		if (sp->n_classes == sp->classes_cap) {
			unsigned cap = sp->classes_cap ? 2 * sp->classes_cap : 8;
			struct soft_key_class *cs = realloc(sp->classes, cap * sizeof(*cs));

			if (!cs)
				return false;
			sp->classes = cs;
			sp->classes_cap = cap;
		}
		c = &sp->classes[sp->n_classes++];
		*c = (struct soft_key_class){ .pages = pages };
	}
	slot_of(sp, index)->next_free = c->head;
	c->head = index;
	return true;
}

/* Takes a free index (or a fresh one) for mr and gives it its next variant (keys_cached: the
 * index released last by an MR of its size, its key unchanged). */
static int slot_take(struct soft_provider *sp, struct soft_mr *mr)
{
	struct soft_slot *slot;
	uint32_t index;
	int r;

	if (sp->keys_cached && class_pop(sp, mr->key_class, &index))
		;
	else if (sp->free_head) {
		index = sp->free_head;
		sp->free_head = slot_of(sp, index)->next_free;
	} else if (sp->n_slots < sp->index_limit) {
		r = chunk_add(sp);
		if (r < 0)
			return r;
		index = sp->n_slots++;
	} else if (!sp->keys_cached || !class_pop(sp, 0, &index))
		return -EKEYEXPIRED; /* caps.max_keys made, or (mlx5) every index in use */
	slot = slot_of(sp, index);
	slot->mr = mr;
	if (!sp->keys_cached || slot->variant == 0)
		slot->variant++;
	mr->index = index;
	mr->base.lkey = mr->base.rkey = make_key(index, slot->variant);
	return 0;
}

/* index is spent: never a key again (its chunk goes with its last). */
static void slot_retire(struct soft_provider *sp, uint32_t index)
{
	struct soft_chunk **chunk = &sp->chunks[index / SOFT_CHUNK];

	slot_of(sp, index)->mr = NULL;
	if (++(*chunk)->spent == SOFT_CHUNK) {
		free(*chunk);
		*chunk = NULL;
	}
}

static void slot_release(struct soft_provider *sp, struct soft_mr *mr)
{
	struct soft_slot *slot = slot_of(sp, mr->index);

	slot->mr = NULL;
	if (sp->keys_cached && class_push(sp, mr->key_class, mr->index))
		return;
	if (sp->keys_cached || slot->variant != SOFT_VARIANT_LAST) {
		slot->next_free = sp->free_head;
		sp->free_head = mr->index;
	} else
		slot_retire(sp, mr->index);
}

/* keys_cached: a move of an on-demand MR makes it anew, as mlx5's rereg does for every ODP MR
 * (Linux 6.1 drivers/infiniband/hw/mlx5/mr.c:1682-1683, mlx5_ib_rereg_user_mr: "if (!mr->umem
 * || is_odp_mr(mr) || is_dmabuf_mr(mr)) goto recreate;" -> mlx5_ib_reg_user_mr, mr.c:1713).
 * The new mkey comes first, from the cache entry of its new size (alloc_cacheable_mr); then
 * uverbs destroys the old MR (core/uverbs_cmd.c:858, rdma_assign_uobject), whose mkey goes back
 * to the cache entry of its size (mr.c:1829, mlx5_ib_dereg_mr -> push_mkey), unchanged. */
static bool move_recreates(const struct soft_provider *sp, const struct soft_mr *mr)
{
	return sp->keys_cached && mr->on_demand;
}

/* move_recreates: mr takes an index of the class of pages pages, and its old index goes back to
 * its class, to be handed out again by the next MR of that size. Locked. */
static int recreate(struct soft_provider *sp, struct soft_mr *mr, size_t pages)
{
	struct soft_mr old = { .index = mr->index, .key_class = mr->key_class };
	int r;

	mr->key_class = pages;
	r = slot_take(sp, mr);
	if (r < 0) {
		mr->key_class = old.key_class;
		return r;
	}
	slot_release(sp, &old);
	return 0;
}

static struct soft_mr *key_lookup(struct soft_provider *sp, uint32_t key)
{
	uint32_t index = key >> 8;
	struct soft_slot *slot;

	if (index == 0 || index >= sp->n_slots || !sp->chunks[index / SOFT_CHUNK])
		return NULL; /* never handed out, or spent */
	slot = slot_of(sp, index);
	if (!slot->mr || slot->mr->parked || slot->variant != (uint8_t)key)
		return NULL; /* free, parked, or reused since this key was handed out */
	return slot->mr;
}

/* A copy (or a prefetch) runs through mr without the lock: whatever would change what mr maps,
 * or let its memory go, waits for it, as an MMU notifier waits for a device's DMA. Locked. */
static void wait_no_copies(struct soft_provider *sp, struct soft_mr *mr)
{
	while (mr->copies > 0)
		pthread_cond_wait(&sp->idle, &sp->base.lock);
}

/* Whether every page of [start, end) is mapped readable (and writable when write), as the
 * kernel's get_user_pages would insist before a NIC may touch it. MADV_POPULATE_READ/WRITE
 * asks exactly that (a hole is ENOMEM, the wrong protection EINVAL or EFAULT) at a fraction
 * of a microsecond a page; /proc/self/maps answers for any length at ~20 us. So: populate up
 * to POPULATE_MAX_PAGES (4 KiB registrations went from ~24 to ~7 us), the maps beyond, and
 * always on kernels before 5.14. */
#define POPULATE_MAX_PAGES 32
static bool mapped_for(const struct soft_provider *sp, uintptr_t start, uintptr_t end,
		       bool write)
{
	char line[512];
	uintptr_t cursor = start;
	FILE *f;

	if (start >= end)
		return false;
	if (sp->populate && end - start <= POPULATE_MAX_PAGES * sp->page_size)
		return madvise((void *)start, end - start,
			       write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0;
	f = fopen("/proc/self/maps", "re");
	if (!f)
		return false;
	while (cursor < end && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[5];

		if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3)
			break;
		if (hi <= cursor)
			continue;
		if (lo > cursor || perms[0] != 'r' || (write && perms[1] != 'w'))
			break; /* a hole, or the wrong protection */
		cursor = hi;
	}
	fclose(f);
	return cursor >= end;
}

static bool access_writes(unsigned access)
{
	return access & (MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_ATOMIC);
}

/* Checks a translation request and builds its page table (filled unless on demand). */
static int translation_new(struct soft_provider *sp, void *addr, size_t length, uint64_t iova,
			   bool on_demand, struct soft_mr *mr)
{
	uintptr_t a = (uintptr_t)addr, ps = sp->page_size, first;

	/* Whole pages around it must not wrap either. */
	if (length == 0 || length > SOFT_MAX_MR_SIZE || a + length + ps < a ||
	    iova + length + ps < iova)
		return -EINVAL;
	if ((a ^ iova) & (ps - 1)) /* a page maps whole: same offset within it */
		return -EINVAL;

	first = a & ~(ps - 1);
	mr->iova_page0 = iova & ~(uint64_t)(ps - 1);
	mr->n_pages = (size_t)((iova + length - mr->iova_page0 + ps - 1) / ps);
	mr->pages = calloc(mr->n_pages, sizeof(*mr->pages));
	if (!mr->pages)
		return -ENOMEM;
	mr->pin_start = mr->pin_end = 0;
	if (!on_demand) {
		for (size_t i = 0; i < mr->n_pages; i++)
			mr->pages[i] = (uint8_t *)(first + i * ps);
		mr->pin_start = first;
		mr->pin_end = first + mr->n_pages * ps;
	}
	mr->base.addr = a;
	mr->base.length = length;
	mr->base.iova = iova;
	return 0;
}

static int soft_reg(struct provider_pd *pd, void *addr, size_t length, uint64_t iova,
		    unsigned access, struct provider_mr **ret)
{
	struct soft_provider *sp = to_soft(pd->provider);
	struct soft_mr *mr;
	int r = soft_dead(sp);

	if (r < 0)
		return r;
	if ((access & MRD_ACCESS_REMOTE_ATOMIC) && !sp->base.caps.atomic)
		return -EOPNOTSUPP; /* as EFA's reg_mr (efa_alloc_mr) */
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	mr->base.pd = pd;
	mr->base.access = access;
	mr->on_demand = access & MRD_ACCESS_ON_DEMAND;

	r = translation_new(sp, addr, length, iova, mr->on_demand, mr);
	if (r < 0)
		goto fail;
	gate_pass(sp, 'r', length);
	if (!mr->on_demand) {
		if (!mapped_for(sp, mr->pin_start, mr->pin_end, access_writes(access))) {
			r = -EFAULT;
			goto fail;
		}
		r = pin_map_pin(&sp->pins, mr->pin_start, mr->pin_end);
		if (r < 0)
			goto fail;
	}
	mr->key_class = mr->n_pages; /* mlx5: the mkey's cache entry, kept for its life */
	r = slot_take(sp, mr);
	if (r < 0) {
		if (!mr->on_demand)
			(void)pin_map_unpin(&sp->pins, mr->pin_start, mr->pin_end);
		goto fail;
	}
	pd->n_mrs++;
	sp->stats.mrs++;
	sp->stats.registrations++;
	*ret = &mr->base;
	return 0;

fail:
	soft_mr_free(mr);
	return r;
}

/* $MRD_SOFT_DEREG_FAIL: whether this dereg or park fails, the MR left as it was. */
static bool release_fails(struct soft_provider *sp)
{
	if (sp->dereg_fail == 0)
		return false;
	sp->dereg_fail--;
	return true;
}

static int soft_dereg(struct provider_mr *base)
{
	struct soft_mr *mr = (struct soft_mr *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);

	if (soft_destroy_dead(sp) < 0 || release_fails(sp))
		return -EIO;
	wait_no_copies(sp, mr);
	if (mr->pin_end > mr->pin_start)
		(void)pin_map_unpin(&sp->pins, mr->pin_start, mr->pin_end);
	slot_release(sp, mr);
	base->pd->n_mrs--;
	if (mr->parked)
		sp->stats.parked--;
	else
		sp->stats.mrs--;
	soft_mr_free(mr);
	return 0;
}

static int soft_rereg(struct provider_mr *base, unsigned flags, void *addr, size_t length,
		      uint64_t iova, unsigned access)
{
	struct soft_mr *mr = (struct soft_mr *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);
	struct soft_mr moved = { .base = *base };
	int r = soft_dead(sp);

	if (r < 0)
		return r;
	if (mr->parked && !(flags & PROVIDER_REREG_TRANSLATION))
		return -EINVAL; /* it has no memory whose access could change */
	if ((flags & PROVIDER_REREG_TRANSLATION) && sp->move_refused)
		return -EOPNOTSUPP;
	if ((access & MRD_ACCESS_REMOTE_ATOMIC) && !sp->base.caps.atomic)
		return -EOPNOTSUPP;
	if ((flags & PROVIDER_REREG_TRANSLATION) && !sp->move_keeps_keys &&
	    slot_of(sp, mr->index)->variant == SOFT_VARIANT_LAST)
		return -EKEYEXPIRED; /* a move needs a new key, and its index has none left */
	if (flags & PROVIDER_REREG_TRANSLATION) {
		wait_no_copies(sp, mr);
		/* Pin the new memory before letting go of the old: failure leaves mr intact. */
		r = translation_new(sp, addr, length, iova, mr->on_demand, &moved);
		if (r < 0)
			return r;
		gate_pass(sp, 'm', length);
		if (!mr->on_demand) {
			r = mapped_for(sp, moved.pin_start, moved.pin_end, access_writes(access)) ?
				    pin_map_pin(&sp->pins, moved.pin_start, moved.pin_end) :
				    -EFAULT;
			if (r < 0) {
				free(moved.pages);
				return r;
			}
			if (mr->pin_end > mr->pin_start)
				(void)pin_map_unpin(&sp->pins, mr->pin_start, mr->pin_end);
		} else if (move_recreates(sp, mr) && (r = recreate(sp, mr, moved.n_pages)) < 0) {
			free(moved.pages);
			return r;
		}
		free(mr->pages);
		mr->pages = moved.pages;
		mr->n_pages = moved.n_pages;
		mr->iova_page0 = moved.iova_page0;
		mr->pin_start = moved.pin_start;
		mr->pin_end = moved.pin_end;
		base->addr = moved.base.addr;
		base->length = moved.base.length;
		base->iova = moved.base.iova;
		/* Same index, new variant: keys to the old memory die here (mlx5's UMR keeps them). */
		if (!sp->move_keeps_keys)
			slot_of(sp, mr->index)->variant++;
		if (mr->parked) {
			mr->parked = false;
			sp->stats.parked--;
			sp->stats.mrs++;
		}
		base->lkey = base->rkey = make_key(mr->index, slot_of(sp, mr->index)->variant);
	}
	base->access = access;
	return 0;
}

/* Off its memory: no key reaches it (key_lookup refuses a parked MR), nothing stays pinned.
 * Locked. */
static void detach(struct soft_provider *sp, struct soft_mr *mr)
{
	if (mr->pin_end > mr->pin_start)
		(void)pin_map_unpin(&sp->pins, mr->pin_start, mr->pin_end);
	mr->pin_start = mr->pin_end = 0;
	free(mr->pages);
	mr->pages = NULL;
	mr->n_pages = 0;
	if (!mr->parked) {
		mr->parked = true;
		sp->stats.mrs--;
		sp->stats.parked++;
	}
	mr->base.addr = mr->base.length = mr->base.iova = 0;
}

/* Keeps the index, so the next move takes its next variant; drops the memory, so no key
 * reaches it (key_lookup refuses a parked MR) and nothing stays pinned. Refused where moves
 * are: verbs parks by a move, to its one parking page; so an on-demand MR is made anew where a
 * move does that (move_recreates): 1, under new keys, its old ones back in their class. */
static int soft_park(struct provider_mr *base)
{
	struct soft_mr *mr = (struct soft_mr *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);
	bool recreated = false;

	if (soft_dead(sp) < 0)
		return soft_dead(sp);
	if (sp->move_refused)
		return -EOPNOTSUPP;
	if (release_fails(sp))
		return -EIO;
	wait_no_copies(sp, mr);
	if (move_recreates(sp, mr) && !mr->parked) {
		int r = recreate(sp, mr, 1);

		if (r < 0)
			return r;
		recreated = true;
	}
	detach(sp, mr);
	if (!sp->move_keeps_keys) /* mlx5 parks by a move to a parking page: the keys stay */
		base->lkey = base->rkey = 0; /* never a soft key */
	return recreated;
}

/* A PD change, in place: the MR goes to a PD no QP uses, so its keys, unchanged and still its
 * own, reach nothing; what it mapped goes, as nothing could fault it in again. As mlx5 does
 * for any MR, on-demand ones too: a rereg of the PD alone, its access unchanged, is a UMR on
 * the same mkey (Linux 6.1 drivers/infiniband/hw/mlx5/mr.c:1647-1658, can_use_umr_rereg_access
 * -> mlx5r_umr_rereg_pd_access, umr.c:426), before the on-demand check that would make it
 * anew. Not a move: allowed where moves are refused (rxe's rereg takes a PD change). */
static int soft_park_in_place(struct provider_mr *base)
{
	struct soft_mr *mr = (struct soft_mr *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);

	if (soft_dead(sp) < 0)
		return soft_dead(sp);
	if (release_fails(sp))
		return -EIO;
	wait_no_copies(sp, mr);
	detach(sp, mr);
	return 0;
}

/* [iova, iova + length) inside mr? */
static bool in_bounds(const struct soft_mr *mr, uint64_t iova, size_t length)
{
	return iova >= mr->base.iova && iova + length >= iova &&
	       iova + length <= mr->base.iova + mr->base.length;
}

/* Makes pages [first, end) of an on-demand MR present, as a NIC's page faults would, without
 * the lock: mr is held (copies), so what it maps stays, and only other holders install pages
 * meanwhile (pages_install). missing_only skips pages present (a DMA goes through a present
 * translation as it stands; a prefetch asks the kernel again). Returns the first page not
 * mapped there, or not writable (the pages before it are present), or end. */
static size_t pages_populate(const struct soft_provider *sp, struct soft_mr *mr, size_t first,
			     size_t end, bool write, bool missing_only)
{
	uintptr_t host0 = mr->base.addr & ~(sp->page_size - 1);
	size_t i;

	for (i = first; i < end; i++) {
		uintptr_t host = host0 + i * sp->page_size;

		if (missing_only && __atomic_load_n(&mr->pages[i], __ATOMIC_RELAXED))
			continue;
		if (!mapped_for(sp, host, host + sp->page_size, write))
			break;
	}
	return i;
}

/* Installs the translations of pages [first, end), made present, and returns how many were
 * missing. Locked; another holder's pages_populate may read them meanwhile. */
static uint64_t pages_install(struct soft_provider *sp, struct soft_mr *mr, size_t first,
			      size_t end)
{
	uintptr_t host0 = mr->base.addr & ~(sp->page_size - 1);
	uint64_t installed = 0;

	for (size_t i = first; i < end; i++) {
		if (mr->pages[i])
			continue;
		__atomic_store_n(&mr->pages[i], (uint8_t *)(host0 + i * sp->page_size),
				 __ATOMIC_RELAXED);
		installed++;
	}
	return installed;
}

/* Lets go of an MR held for a copy or a prefetch (dereg, park, move, invalidate wait). Locked. */
static void mr_let_go(struct soft_provider *sp, struct soft_mr *mr)
{
	mr->copies--;
	pthread_cond_broadcast(&sp->idle);
}

/* One side of a DMA: the MR it goes through, its pages [first, end) (those before populated
 * are present), and the host address of its first byte. */
struct dma_side {
	struct soft_mr *mr;
	size_t first, end, populated;
	uint8_t *host;
	bool write;
};

/* Soft maps an MR's pages in order, present or not: the host address is the iova's offset;
 * returns how many of the side's pages are not present. */
static size_t dma_side_init(const struct soft_provider *sp, struct dma_side *side,
			    struct soft_mr *mr, uint64_t iova, size_t length, bool write)
{
	size_t missing = 0;

	side->mr = mr;
	side->first = side->populated = (size_t)((iova - mr->iova_page0) / sp->page_size);
	side->end = (size_t)((iova + length + sp->page_size - 1 - mr->iova_page0) / sp->page_size);
	side->host = (uint8_t *)(uintptr_t)(mr->base.addr + (iova - mr->base.iova));
	side->write = write;
	for (size_t i = side->first; i < side->end; i++)
		missing += !mr->pages[i];
	return missing;
}

/* What a remote key reaches: an MR's whole range with its access, or a window's bytes with
 * the window's access (rxe_lookup_mw checks the access against the window's alone). */
struct remote_reach {
	uint64_t iova, length;
	unsigned access;
};

static struct soft_mw *mw_lookup(struct soft_provider *sp, uint32_t key)
{
	uint32_t index = key >> 8, i = index - SOFT_MW_INDEX0;
	struct soft_mw *mw;

	if (index < SOFT_MW_INDEX0 || index >= sp->mw_next || !sp->mw_chunks[i / SOFT_CHUNK])
		return NULL; /* never handed out, or spent */
	mw = sp->mw_chunks[i / SOFT_CHUNK]->mw[i % SOFT_CHUNK];
	if (!mw || !mw->base.mr || mw->variant != (uint8_t)key)
		return NULL; /* deallocated, not bound (the wrapper keeps mr), or bound again since */
	return mw;
}

static struct soft_mr *remote_lookup(struct soft_provider *sp, uint32_t rkey,
				     struct remote_reach *ret)
{
	struct soft_mw *mw = mw_lookup(sp, rkey);
	struct soft_mr *mr;

	if (mw) {
		*ret = (struct remote_reach){ mw->base.addr, mw->base.length, mw->base.access };
		return (struct soft_mr *)mw->base.mr;
	}
	mr = key_lookup(sp, rkey);
	if (mr)
		*ret = (struct remote_reach){ mr->base.iova, mr->base.length, mr->base.access };
	return mr;
}

/* Checks a DMA as a NIC would and, when it may run, holds both MRs for it (their page faults
 * and the copy): nothing moves them, zaps their pages or lets their memory go until dma_end.
 * side[0] is the source, side[1] the destination; *ret_missing: their pages not present.
 * Locked. */
static int dma_begin(struct provider_pd *pd, enum provider_dma_op op, uint32_t lkey,
		     uint64_t laddr, uint32_t rkey, uint64_t raddr, size_t length,
		     struct dma_side side[2], size_t *ret_missing)
{
	struct soft_provider *sp = to_soft(pd->provider);
	struct soft_mr *local = key_lookup(sp, lkey), *remote;
	struct soft_mr *src, *dst;
	uint64_t src_addr, dst_addr;
	struct remote_reach reach;
	size_t missing[2];

	remote = remote_lookup(sp, rkey, &reach);
	if (!local || !remote)
		return -ENOKEY;
	if (local->base.pd != pd || remote->base.pd != pd)
		return -EACCES; /* keys of another protection domain */
	if (!in_bounds(local, laddr, length) ||
	    !(raddr >= reach.iova && raddr + length >= raddr &&
	      raddr + length <= reach.iova + reach.length))
		return -EFAULT;

	if (op == PROVIDER_DMA_WRITE) {
		if (!(reach.access & MRD_ACCESS_REMOTE_WRITE))
			return -EACCES;
		src = local, src_addr = laddr, dst = remote, dst_addr = raddr;
	} else if (op == PROVIDER_DMA_READ) {
		if (!(reach.access & MRD_ACCESS_REMOTE_READ) ||
		    !(local->base.access & MRD_ACCESS_LOCAL_WRITE))
			return -EACCES;
		src = remote, src_addr = raddr, dst = local, dst_addr = laddr;
	} else
		return -EINVAL;

	missing[0] = dma_side_init(sp, &side[0], src, src_addr, length, false);
	missing[1] = dma_side_init(sp, &side[1], dst, dst_addr, length, true);
	/* The responder faults the remote MR's pages in only where RC ODP covers the operation
	 * ($MRD_SOFT_ODP_RC): else the NIC's page fault fails. */
	if (missing[op == PROVIDER_DMA_WRITE] &&
	    !(sp->base.caps.odp_rc_caps &
	      (op == PROVIDER_DMA_WRITE ? PROVIDER_ODP_WRITE : PROVIDER_ODP_READ)))
		return -EFAULT;
	*ret_missing = missing[0] + missing[1];
	src->copies++;
	dst->copies++;
	return 0;
}

/* Faults the missing pages of the source, then of the destination, in, as a NIC's page faults
 * would (ODP): nothing mapped there, or not writable, fails the DMA, not the daemon. Unlocked. */
static int dma_populate(const struct soft_provider *sp, struct dma_side side[2])
{
	for (int k = 0; k < 2; k++) {
		side[k].populated = pages_populate(sp, side[k].mr, side[k].first, side[k].end,
						   side[k].write, true);
		if (side[k].populated < side[k].end)
			return -EFAULT;
	}
	return 0;
}

/* Installs what the DMA's faults made present, counting them, and lets both MRs go. Locked. */
static int dma_end(struct soft_provider *sp, struct dma_side side[2])
{
	for (int k = 0; k < 2; k++) {
		sp->stats.odp_faults +=
			pages_install(sp, side[k].mr, side[k].first, side[k].populated);
		mr_let_go(sp, side[k].mr);
	}
	return 0;
}

/* A DMA through a window copies in chunks of this, each after a look at the window's key. */
#define WINDOW_CHUNK (64u << 10)

/* A transfer through the window of rkey, as rxe carries it out: packet by packet, each checked
 * against the window (rxe_resp.c check_rkey), so an invalidate stops a message under way and
 * returns at once, not when the message ends: it waits for the chunk being copied (copying),
 * and the next chunk meets the dead key (-ENOKEY: what landed before stays, as on the device).
 * A 64 MiB transfer would otherwise hold a revoke, and mrd's loop that runs it, for its whole
 * copy. The gate ('c', after the first chunk) lets a test hold a transfer halfway. Unlocked. */
static int window_copy(struct soft_provider *sp, uint32_t rkey, uint8_t *dst, const uint8_t *src,
		       size_t length)
{
	for (size_t done = 0; done < length;) {
		size_t n = length - done < WINDOW_CHUNK ? length - done : WINDOW_CHUNK;
		struct soft_mw *mw;
		int r;

		if (done == WINDOW_CHUNK)
			gate_pass(sp, 'c', length);
		pthread_mutex_lock(&sp->base.lock);
		mw = mw_lookup(sp, rkey);
		if (mw)
			mw->copying++;
		pthread_mutex_unlock(&sp->base.lock);
		if (!mw)
			return -ENOKEY;
		r = safe_memmove(dst + done, src + done, n, NULL);
		pthread_mutex_lock(&sp->base.lock);
		mw->copying--;
		pthread_cond_broadcast(&sp->idle);
		pthread_mutex_unlock(&sp->base.lock);
		if (r < 0)
			return r;
		done += n;
	}
	return 0;
}

/* Faulting a GiB of an on-demand MR in takes ~0.4 s, and the copy runs up to MRD_DMA_MAX bytes:
 * both run without the provider's lock (registrations of the domain go on meanwhile), the MRs
 * held. The copy is fault-safe: a client may have punched a hole in the memory behind either
 * MR, which on hugetlb is SIGBUS once no huge page is free to fill it. The faults' translations
 * are installed at dma_end: until then nothing but the copy could use them (an invalidate
 * waits for it). */
static int soft_dma(struct provider_pd *pd, enum provider_dma_op op, uint32_t lkey,
		    uint64_t laddr, uint32_t rkey, uint64_t raddr, size_t length)
{
	struct soft_provider *sp = to_soft(pd->provider);
	struct dma_side side[2];
	size_t missing;
	int r = soft_dead(sp);

	if (r < 0)
		return r;
	r = PROVIDER_LOCKED(pd->provider, dma_begin(pd, op, lkey, laddr, rkey, raddr, length,
						    side, &missing));
	if (r < 0)
		return r;
	if (missing) {
		gate_pass(sp, 'f', (uint64_t)missing * sp->page_size);
		r = dma_populate(sp, side);
	}
	if (r == 0) {
		r = rkey >> 8 >= SOFT_MW_INDEX0 ?
			    window_copy(sp, rkey, side[1].host, side[0].host, length) :
			    safe_memmove(side[1].host, side[0].host, length, NULL);
		if (r == -EFAULT)
			r = -ENXIO;
	}
	(void)PROVIDER_LOCKED(pd->provider, dma_end(sp, side));
	return r;
}

/* Checks advice and holds mr as a copy does (dereg, park, move and invalidate wait for it), so
 * its pages can be populated without the lock. Locked. */
static int advise_begin(struct soft_mr *mr, enum provider_advice advice, uint64_t iova,
			size_t length)
{
	if (!mr->on_demand)
		return -EINVAL; /* only ODP MRs take advice */
	if (advice == PROVIDER_ADVISE_PREFETCH_WRITE && !(mr->base.access & MRD_ACCESS_LOCAL_WRITE))
		return -EACCES;
	if (advice != PROVIDER_ADVISE_PREFETCH && advice != PROVIDER_ADVISE_PREFETCH_WRITE &&
	    advice != PROVIDER_ADVISE_PREFETCH_NO_FAULT)
		return -EINVAL;
	if (length > mr->base.pd->provider->caps.advise_max)
		return -EINVAL; /* as verbs: one SGE's 32-bit length (soft always has a limit) */
	if (length == 0 || !in_bounds(mr, iova, length))
		return -EFAULT;
	mr->copies++;
	return 0;
}

/* Installs the translations of pages [first, end) populated (where present[i - first], when
 * present is not NULL), and lets mr go. Locked. */
static int advise_end(struct soft_provider *sp, struct soft_mr *mr, size_t first, size_t end,
		      const uint8_t *present)
{
	for (size_t i = first; i < end; i++)
		if (!present || present[i - first])
			sp->stats.odp_prefetched_pages += pages_install(sp, mr, i, i + 1);
	mr_let_go(sp, mr);
	return 0;
}

/* Which of pages [first, end) of mr are present in mrd's page tables, as a device's snapshot
 * (hmm_range_fault without faulting) sees them: /proc/self/pagemap's bit 63. Unlocked, mr
 * held. NULL when it cannot tell. */
static uint8_t *pages_present(const struct soft_provider *sp, const struct soft_mr *mr,
			      size_t first, size_t end)
{
	uintptr_t host0 = (mr->base.addr & ~(sp->page_size - 1)) / sp->page_size;
	uint8_t *present = calloc(end - first, 1);
	uint64_t entries[512];
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	for (size_t i = first; present && fd >= 0 && i < end;) {
		size_t n = end - i < ELEMENTSOF(entries) ? end - i : ELEMENTSOF(entries);
		ssize_t got = pread(fd, entries, n * sizeof(entries[0]),
				    (off_t)((host0 + i) * sizeof(entries[0])));

		if (got < (ssize_t)sizeof(entries[0])) {
			free(present);
			present = NULL;
			break;
		}
		n = (size_t)got / sizeof(entries[0]);
		for (size_t k = 0; k < n; k++)
			present[i + k - first] = entries[k] >> 63;
		i += n;
	}
	if (fd < 0) {
		free(present);
		present = NULL;
	} else
		close(fd);
	return present;
}

/* Populating a GiB takes ~0.4 s: it runs without the provider's lock (registrations of the
 * domain go on meanwhile), the MR held like a copy's, and only the translations are installed
 * under it. */
static int soft_advise(struct provider_mr *base, enum provider_advice advice, uint64_t iova,
		       size_t length)
{
	struct soft_mr *mr = (struct soft_mr *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);
	size_t first, end, populated;
	uint8_t *present;
	int r = soft_dead(sp);

	if (r < 0)
		return r;
	r = PROVIDER_LOCKED(&sp->base, advise_begin(mr, advice, iova, length));
	if (r < 0)
		return r;
	gate_pass(sp, 'a', length);
	/* Held: what the MR maps stays as it is until advise_end. */
	first = (size_t)((iova - mr->iova_page0) / sp->page_size);
	end = (size_t)((iova + length - 1 - mr->iova_page0) / sp->page_size) + 1;
	if (advice == PROVIDER_ADVISE_PREFETCH_NO_FAULT) {
		present = pages_present(sp, mr, first, end);
		r = present ? 0 : -ENOMEM;
		(void)PROVIDER_LOCKED(&sp->base, advise_end(sp, mr, first, present ? end : first,
							    present));
		free(present);
		return r;
	}
	populated = pages_populate(sp, mr, first, end,
				   advice == PROVIDER_ADVISE_PREFETCH_WRITE, false);
	(void)PROVIDER_LOCKED(&sp->base, advise_end(sp, mr, first, populated, NULL));
	return populated < end ? -EFAULT : 0;
}

static int soft_invalidate(struct provider_mr *base, uint64_t iova, size_t length)
{
	struct soft_mr *mr = (struct soft_mr *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);
	size_t first, last;

	if (soft_dead(sp) < 0)
		return soft_dead(sp);
	if (!mr->on_demand)
		return -EINVAL; /* pinned pages cannot move under a pinned MR */
	if (length == 0 || !in_bounds(mr, iova, length))
		return -EFAULT;
	wait_no_copies(sp, mr);
	first = (size_t)((iova - mr->iova_page0) / sp->page_size);
	last = (size_t)((iova + length - 1 - mr->iova_page0) / sp->page_size);
	for (size_t i = first; i <= last; i++) {
		if (!mr->pages[i])
			continue;
		mr->pages[i] = NULL;
		sp->stats.odp_invalidations++;
	}
	return 0;
}

static struct soft_mw **mw_slot(struct soft_provider *sp, uint32_t index)
{
	uint32_t i = index - SOFT_MW_INDEX0;

	return &sp->mw_chunks[i / SOFT_CHUNK]->mw[i % SOFT_CHUNK];
}

/* A window index never handed out before, for mw (its variant starts at 0). */
static int mw_index_take(struct soft_provider *sp, struct soft_mw *mw)
{
	uint32_t c = (sp->mw_next - SOFT_MW_INDEX0) / SOFT_CHUNK;

	if (sp->mw_next >= SOFT_MW_INDEX_END)
		return -EKEYEXPIRED; /* 2^23 indexes, 255 binds each: 2^31 binds a context */
	if (c == sp->n_mw_chunks) {
		struct soft_mw_chunk *chunk;

		if (c == sp->mw_chunks_cap) {
			uint32_t cap = sp->mw_chunks_cap ? 2 * sp->mw_chunks_cap : 4;
			struct soft_mw_chunk **chunks = realloc(sp->mw_chunks,
								 cap * sizeof(*chunks));

			if (!chunks)
				return -ENOMEM;
			sp->mw_chunks = chunks;
			sp->mw_chunks_cap = cap;
		}
		chunk = calloc(1, sizeof(*chunk));
		if (!chunk)
			return -ENOMEM;
		sp->mw_chunks[sp->n_mw_chunks++] = chunk;
	}
	mw->index = sp->mw_next++;
	mw->variant = 0;
	*mw_slot(sp, mw->index) = mw;
	return 0;
}

/* mw's index is spent: no key of it reaches anything again (its chunk goes with its last). */
static void mw_index_retire(struct soft_provider *sp, struct soft_mw *mw)
{
	struct soft_mw_chunk **chunk;

	if (!mw->index)
		return;
	chunk = &sp->mw_chunks[(mw->index - SOFT_MW_INDEX0) / SOFT_CHUNK];
	*mw_slot(sp, mw->index) = NULL;
	if (++(*chunk)->spent == SOFT_CHUNK) {
		free(*chunk);
		*chunk = NULL;
	}
	mw->index = 0;
}

static int soft_mw_alloc(struct provider_pd *pd, struct provider_mw **ret)
{
	struct soft_provider *sp = to_soft(pd->provider);
	struct soft_mw *mw;
	int r = soft_dead(sp);

	if (r < 0)
		return r;
	/* The device's, all contexts together. */
	if (__atomic_add_fetch(&device_mws, 1, __ATOMIC_RELAXED) > sp->max_mw) {
		__atomic_sub_fetch(&device_mws, 1, __ATOMIC_RELAXED);
		return -ENOMEM;
	}
	mw = calloc(1, sizeof(*mw));
	r = mw ? mw_index_take(sp, mw) : -ENOMEM;
	if (r < 0) {
		__atomic_sub_fetch(&device_mws, 1, __ATOMIC_RELAXED);
		free(mw);
		return r;
	}
	mw->base.pd = pd;
	mw->base.rkey = mw->index << 8; /* variant 0: never bound, so never reaching memory */
	mw->next = sp->mws;
	if (sp->mws)
		sp->mws->prev = mw;
	sp->mws = mw;
	sp->stats.mws++;
	*ret = &mw->base;
	return 0;
}

/* The key byte advances (ibv_inc_rkey); past 255 the window moves to a fresh index, its old
 * one spent. */
static int soft_mw_bind(struct provider_mw *base, struct provider_mr *mr, uint64_t addr,
			uint64_t length, unsigned access, uint32_t *ret_rkey)
{
	struct soft_mw *mw = (struct soft_mw *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);
	int r = soft_dead(sp);

	(void)mr, (void)addr, (void)length, (void)access; /* the wrapper stores them */
	if (r < 0)
		return r;
	if (mw->stale)
		return -EINVAL;
	if (!mw->index) { /* spent at revive */
		struct soft_mw fresh = { .index = 0 };

		r = mw_index_take(sp, &fresh);
		if (r < 0)
			return r;
		mw_index_retire(sp, mw);
		mw->index = fresh.index;
		mw->variant = 0;
		*mw_slot(sp, mw->index) = mw;
	}
	mw->variant++; /* wraps, 0 included, as ibv_inc_rkey's byte does on rxe and mlx5 */
	if (sp->mw_bind_late > 0) {
		sp->mw_bind_late--;
		mw->stale = true;
		return -ETIMEDOUT;
	}
	*ret_rkey = mw->index << 8 | mw->variant;
	return 0;
}

/* The key is refused from the moment the wrapper, locked, cleared base.mr (mw_lookup); a copy
 * through the window's MR that began before is waited for here, as a device completes a local
 * invalidate after the accesses ahead of it (so memory freed after an invalidation is out of
 * every transfer's reach). */
/* Unbound already (the wrapper), so no chunk through mw begins: waits for those under way. A
 * transfer that has not reached its copy, or is between chunks, fails at its next look at the
 * key. Locked. */
static void wait_no_chunks(struct soft_provider *sp, struct soft_mw *mw)
{
	while (mw->copying > 0)
		pthread_cond_wait(&sp->idle, &sp->base.lock);
}

static int soft_mw_invalidate(struct provider_mw *base, struct provider_mr *mr)
{
	struct soft_provider *sp = to_soft(base->pd->provider);
	int r = soft_dead(sp);

	if (r < 0)
		return r;
	(void)mr;
	if (sp->mw_invalidate_fail > 0) { /* the wrapper binds it again */
		sp->mw_invalidate_fail--;
		return -EIO;
	}
	wait_no_chunks(sp, (struct soft_mw *)base);
	return 0;
}

static int soft_mw_dealloc(struct provider_mw *base, struct provider_mr *mr)
{
	struct soft_mw *mw = (struct soft_mw *)base;
	struct soft_provider *sp = to_soft(base->pd->provider);

	(void)mr;
	if (sp->mw_dealloc_fail > 0) { /* the wrapper binds it again */
		sp->mw_dealloc_fail--;
		return -EIO;
	}
	wait_no_chunks(sp, mw);
	mw_index_retire(sp, mw);
	if (mw->prev)
		mw->prev->next = mw->next;
	else
		sp->mws = mw->next;
	if (mw->next)
		mw->next->prev = mw->prev;
	sp->stats.mws--;
	__atomic_sub_fetch(&device_mws, 1, __ATOMIC_RELAXED);
	free(mw);
	return 0;
}

static int soft_export_pd(struct provider_pd *pd, int *ret_cmd_fd, uint32_t *ret_pd_handle)
{
	struct soft_provider *sp = to_soft(pd->provider);
	int fd;

	if (!sp->exports)
		return -EOPNOTSUPP; /* a software NIC has no device file a client could import */
	if (sp->export_fd < 0) {
		sp->export_fd = memfd_create("mrd-soft-context", MFD_CLOEXEC);
		if (sp->export_fd < 0)
			return -errno;
	}
	fd = fcntl(sp->export_fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return -errno;
	*ret_cmd_fd = fd;
	*ret_pd_handle = 1;
	return 0;
}

static void soft_stats(const struct provider *p, struct provider_stats *ret)
{
	const struct soft_provider *sp = (const struct soft_provider *)p;

	*ret = sp->stats;
	ret->pinned_bytes = sp->pins.pinned_bytes;
	if (sp->lost) /* the device let go of them: the handles wait for soft_revive */
		ret->mrs = ret->parked = ret->pinned_bytes = 0;
}

/* The event path (event_lock, not the provider's): the lost flag and the shared device,
 * which has its own lock. */
static int soft_event_fd(struct provider *p)
{
	return __atomic_load_n(&to_soft(p)->lost, __ATOMIC_ACQUIRE) ? -1 : soft_device_fd();
}

static int soft_read_event(struct provider *p, struct provider_event *ret)
{
	return __atomic_load_n(&to_soft(p)->lost, __ATOMIC_ACQUIRE) ? -EAGAIN :
	       soft_device_read_event(ret);
}

static bool soft_gone(struct provider *p)
{
	return !__atomic_load_n(&to_soft(p)->lost, __ATOMIC_ACQUIRE) && soft_device_removed();
}

/* Its keys stop reaching memory (soft_dead refuses every transfer); the pins stay, as the
 * handles do, for soft_revive. */
/* Under the provider's lock. The device forgot its windows' bindings, as verbs' lose frees
 * them: the MRs under them go with dereg, as a lost device's handles do. */
static void soft_lose(struct provider *p)
{
	struct soft_provider *sp = to_soft(p);

	__atomic_store_n(&sp->lost, true, __ATOMIC_RELEASE);
	for (struct soft_mw *mw = sp->mws; mw; mw = mw->next)
		if (mw->base.mr) {
			mw->base.mr->n_mws--;
			mw->base.mr = NULL;
		}
}

/* An index never handed out for mr, its first variant; -EKEYEXPIRED: none left. */
static int slot_take_fresh(struct soft_provider *sp, struct soft_mr *mr)
{
	uint32_t index = sp->n_slots;
	int r;

	if (index >= sp->index_limit)
		return -EKEYEXPIRED;
	r = chunk_add(sp);
	if (r < 0)
		return r;
	sp->n_slots++;
	slot_of(sp, index)->mr = mr;
	slot_of(sp, index)->variant = 1;
	mr->index = index;
	mr->base.lkey = mr->base.rkey = make_key(index, 1);
	return 0;
}

/* keys_cached: the indexes the classes hold are spent, so no key from before comes back (a
 * reset device's mkey cache starts empty). */
static void classes_retire(struct soft_provider *sp)
{
	for (unsigned i = 0; i < sp->n_classes; i++) {
		struct soft_key_class *c = &sp->classes[i];

		while (c->head) {
			uint32_t index = c->head;

			c->head = slot_of(sp, index)->next_free;
			slot_retire(sp, index);
		}
	}
}

/* Each MR takes a fresh index and its old one is spent: no key from before the failure names
 * any MR again (released, they would come back, and same-size mlx5 MRs swap keys). */
static void rekey_fresh(struct soft_provider *sp, struct soft_mr *mr)
{
	uint32_t old = mr->index;
	struct soft_slot *slot = slot_of(sp, old);

	if (slot_take_fresh(sp, mr) == 0) {
		slot_retire(sp, old);
		return;
	}
	/* None left: it keeps its index, so an old key names nothing but itself. */
	log_warning("soft: no fresh key for an MR made again: it keeps its index");
	if (!sp->keys_cached && slot->variant != SOFT_VARIANT_LAST)
		slot->variant++;
	mr->base.lkey = mr->base.rkey = make_key(old, slot->variant);
}

static int soft_revive(struct provider *p)
{
	struct soft_provider *sp = to_soft(p);
	struct soft_mr **mrs = NULL;
	size_t n = 0, cap = 0;

	if (!sp->lost)
		return 0;
	if (soft_device_failed())
		return -ENODEV;
	if (sp->revive_fail) {
		sp->revive_fail--;
		return -EIO;
	}
	if (sp->gate_revive)
		gate_pass(sp, 'v', sp->pins.pinned_bytes);
	for (uint32_t c = 0; c < sp->n_chunks; c++)
		for (unsigned i = 0; sp->chunks[c] && i < SOFT_CHUNK; i++) {
			struct soft_mr *mr = sp->chunks[c]->slot[i].mr;

			if (!mr)
				continue;
			if (n == cap) {
				struct soft_mr **more;

				cap = cap ? 2 * cap : 64;
				more = realloc(mrs, cap * sizeof(*mrs));
				if (!more) {
					free(mrs);
					return -ENOMEM;
				}
				mrs = more;
			}
			mrs[n++] = mr;
		}
	if (sp->keys_cached)
		classes_retire(sp);
	for (size_t i = 0; i < n; i++)
		rekey_fresh(sp, mrs[i]);
	/* The device forgot its windows' bindings: each is free again, its index spent (the
	 * next bind takes a fresh one). */
	for (struct soft_mw *mw = sp->mws; mw; mw = mw->next) {
		if (mw->base.mr) {
			mw->base.mr->n_mws--;
			mw->base.mr = NULL;
		}
		mw_index_retire(sp, mw);
	}
	free(mrs);
	sp->base.caps.port_active = soft_device_port_active();
	__atomic_store_n(&sp->lost, false, __ATOMIC_RELEASE);
	return 0;
}

const struct provider_ops provider_soft_ops = {
	.name = "soft",
	.open = soft_open,
	.close = soft_close,
	.pd_alloc = soft_pd_alloc,
	.pd_free = soft_pd_free,
	.reg = soft_reg,
	.rereg = soft_rereg,
	.dereg = soft_dereg,
	.park = soft_park,
	.park_in_place = soft_park_in_place,
	.advise = soft_advise,
	.export_pd = soft_export_pd,
	.dma = soft_dma,
	.invalidate = soft_invalidate,
	.mw_alloc = soft_mw_alloc,
	.mw_bind = soft_mw_bind,
	.mw_invalidate = soft_mw_invalidate,
	.mw_dealloc = soft_mw_dealloc,
	.stats = soft_stats,
	.event_fd = soft_event_fd,
	.read_event = soft_read_event,
	.gone = soft_gone,
	.lose = soft_lose,
	.revive = soft_revive,
};
