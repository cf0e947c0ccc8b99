/* SPDX-License-Identifier: MIT */
/* Keeps a released MR's keys dead on a device that hands a released key out again unchanged
 * (caps.keys_come_back: mlx5's mkey cache gives the key released last to the next
 * registration of its size, DESIGN.md §3). Instead of being destroyed, a released MR is
 * parked (soft: out of the key table; verbs: moved to the parking page), so no key of it
 * reaches memory and its key stays out of the device's cache, and waits here; the oldest is
 * destroyed, its key given back to the device, only when KEY_QUARANTINE_MRS newer ones wait.
 * So a freed allocation's keys stay dead until its domain has released KEY_QUARANTINE_MRS more
 * MRs on that device. Parked MRs pin nothing: the cost is at most KEY_QUARANTINE_MRS device
 * handles per domain and device, whatever the bytes freed. A provider that cannot park
 * (rxe and siw refuse a move, provider-verbs.c probe_rereg; soft with MRD_SOFT_REREG=refuse)
 * gets its MRs destroyed at once, counted in unparked and logged once: there the guarantee
 * does not hold (a device whose keys do come back and that cannot move an MR has no park).
 * An MR without remote rights ([windows] remote = window-only) is destroyed at once, uncounted:
 * no peer holds a key of it (its remote grants were windows, dead before its memory went).
 *
 * Thread-safe: the loop and worker threads release concurrently; provider ops run outside
 * its lock. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct provider_mr;

#define KEY_QUARANTINE_MRS 1024

struct key_quarantine {
	pthread_mutex_t lock;
	bool on;                  /* the device may hand a released key out again */
	struct provider_mr **mrs; /* a ring of KEY_QUARANTINE_MRS, made at the first release */
	unsigned head, n;         /* mrs[head] is the oldest; n wait */
	uint64_t parked;          /* released MRs it kept */
	uint64_t unparked;        /* released MRs destroyed at once: their keys may come back */
};

void key_quarantine_init(struct key_quarantine *q, bool on);
/* Whether mr parks in place (provider.h, park_in_place): on demand, on a device whose move
 * would make it anew and give its keys back. A handle pool (whose reuse is a move) takes none
 * of those either. */
bool key_quarantine_parks_in_place(const struct provider_mr *mr);
/* Releases mr (in place of provider_dereg): kept parked when on, else destroyed. Returns 0 or
 * what destroying it returned. */
int key_quarantine_release(struct key_quarantine *q, struct provider_mr *mr);
/* Counts a released MR whose keys went back to the device unparked: why < 0, the park failed
 * (-EOPNOTSUPP: the device cannot move an MR, caps.rereg_probe says why); why 1, the park made
 * it anew (provider.h). The first one of the quarantine is logged; nothing while it is off. */
void key_quarantine_lost(struct key_quarantine *q, const struct provider_mr *mr, int why);
/* What mrctl pools shows: whether it is on, the MRs waiting, and unparked. */
void key_quarantine_counts(struct key_quarantine *q, bool *ret_on, uint64_t *ret_waiting,
			   uint64_t *ret_unparked);
/* Destroys every MR it keeps (before their PD goes) and turns off: later releases destroy. */
void key_quarantine_done(struct key_quarantine *q);
