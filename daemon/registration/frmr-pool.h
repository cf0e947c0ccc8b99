/* SPDX-License-Identifier: MIT */
/* FRMR-style pools of reusable MR handles (DESIGN.md §8; the kernel's FRMR pools, rebuilt in
 * user space). A domain registers and deregisters through its pools: a released MR is parked
 * in the pool of its key rather than destroyed, and a registration pops a parked handle and
 * moves it to the new memory (a rereg with a translation change), which skips creating a
 * device object. Pools sit in a map ordered by key; each queues its handles in page-sized
 * chunks, newest on top.
 *
 * A key handed out for freed memory does not reach the memory's next user: parking kills the
 * handle's keys at once (soft: the MR leaves the key table; verbs: the MR moves to the
 * provider's parking page), pools run only on providers whose moves give new keys
 * (caps.rereg_new_keys), and both park and pop check it — a handle that keeps or gets back the
 * keys it had is destroyed, never handed out. Keys are an index and an 8-bit variant (soft, as
 * mlx5 mkeys): soft never gives an index's key twice, and a handle whose index is spent fails
 * its move (-EKEYEXPIRED) and is destroyed for a fresh registration.
 *
 * Thread-safe: the loop and worker threads register and release concurrently. Provider ops
 * run outside the pools' lock. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "registration/key-quarantine.h"

struct frmr_pool;
struct provider_mr;
struct provider_pd;

#define FRMR_POOLS_MAX 1024 /* per domain; a handle of a key beyond them is not pooled */

/* What a handle cannot change when it moves. A handle of `pages` pages serves any request of
 * M pages with M <= pages < 2M, and nothing else. */
struct frmr_key {
	unsigned access; /* MRD_ACCESS_* but ON_DEMAND, which is odp */
	bool odp;
	bool internal;   /* its keys never leave the daemon (nothing registers such MRs yet) */
	uint32_t vendor; /* a provider's unchangeable handle property; 0 on soft and verbs */
	uint64_t pages;  /* size class: how many pages it maps */
};

/* Which pools a setting applies to: each field, or -1 for any. */
struct frmr_match {
	int64_t access, odp, internal, vendor, pages;
};
#define FRMR_MATCH_ANY ((struct frmr_match){ -1, -1, -1, -1, -1 })

struct frmr_pool_stats {
	struct frmr_key key;
	uint64_t queued, in_use, max_in_use;
	uint64_t hits;   /* registrations it served with a parked handle */
	uint64_t misses; /* registrations of its size that found no handle and made one */
	uint64_t aged;   /* handles it destroyed for idling longer than aging_s */
	unsigned aging_s, pinned;
};

struct frmr_pools {
	pthread_mutex_t lock;
	bool ready;        /* frmr_pools_init ran: frmr_pools_done is safe either way */
	const char *off;   /* why pools are off, NULL when on */
	char off_why[320]; /* what off points at when the device said why */
	struct provider_pd *pd;
	uint64_t page_size;
	struct frmr_pool **pools; /* ordered by key */
	size_t n_pools, pools_cap;
	uint64_t queued;   /* parked in every pool */
	struct frmr_pools_config config; /* max_queued, and the settings of new pools */
	/* Where a released MR goes when no pool keeps it: on devices whose released keys come
	 * back, it keeps them dead for a while (registration/key-quarantine.h). */
	struct key_quarantine quarantine;
	/* Milliseconds of a monotonic clock; tests set their own. */
	uint64_t (*clock)(void *data);
	void *clock_data;
};

/* Pools for pd's registrations, off (with the reason in off) when the config or the provider
 * says so — a provider that cannot park, or whose moves keep keys. */
int frmr_pools_init(struct frmr_pools *p, struct provider_pd *pd,
		    const struct frmr_pools_config *config);
/* Destroys every parked handle and pool; safe on zeroed pools and twice. MRs still in use
 * keep working and go straight to the provider when released. */
void frmr_pools_done(struct frmr_pools *p);

/* Registers [addr, addr + length) at iova addr with access: a parked handle moved there, else
 * a fresh registration. Returns 0 or the provider's -errno. */
int frmr_pools_reg(struct frmr_pools *p, void *addr, size_t length, unsigned access,
		   bool internal, struct provider_mr **ret);
/* Releases an MR: parked in its pool, else deregistered. NULL-safe. */
int frmr_pools_dereg(struct frmr_pools *p, struct provider_mr *mr);

/* Takes out the handles idle longer than their pool's aging_s (leaving each pool its pinned
 * ones) into *ret (a malloc'd array, NULL when none) and drops pools left empty, unused for
 * their aging period and at the default settings. Cheap: the caller destroys what it got with
 * frmr_pools_destroy, where a slow provider op does not hold anyone up. Returns the count. */
size_t frmr_pools_age(struct frmr_pools *p, struct provider_mr ***ret);
void frmr_pools_destroy(struct provider_mr **handles, size_t n);

/* mrctl flush: takes out every parked handle above each pool's pinned minimum (all of them
 * with pinned_too) into *ret, as frmr_pools_age does; with pinned_too it also drops the pools
 * left with nothing in them, but those set by their key (*ret_pools_removed counts them). */
size_t frmr_pools_drain(struct frmr_pools *p, bool pinned_too, struct provider_mr ***ret,
			unsigned *ret_pools_removed);

/* Whether aging (seconds, >= 1) and pinned (< 0: not set) are values pools take: 0 or -EINVAL. */
int frmr_pools_check_settings(int64_t aging_s, int64_t pinned);

/* Sets aging (seconds, >= 1) and/or the pinned minimum (< 0: keep) of every pool matching m;
 * a match of any key also makes them the settings of pools made later. Returns how many
 * pools changed, -EINVAL for a bad value. */
int frmr_pools_set(struct frmr_pools *p, const struct frmr_match *m, int64_t aging_s,
		   int64_t pinned);

/* The settings new pools get and max_queued, and how many handles are parked now. */
void frmr_pools_summary(struct frmr_pools *p, struct frmr_pools_config *ret_config,
			uint64_t *ret_queued);

/* Copies the stats of up to max pools, in key order; returns how many pools there are. */
size_t frmr_pools_stats(struct frmr_pools *p, struct frmr_pool_stats *ret, size_t max);
