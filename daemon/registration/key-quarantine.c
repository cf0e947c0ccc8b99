/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "provider/provider.h"
#include "registration/key-quarantine.h"

void key_quarantine_init(struct key_quarantine *q, bool on)
{
	*q = (struct key_quarantine){ .on = on };
	pthread_mutex_init(&q->lock, NULL);
}

/* Keeps parked mr; returns the MR it pushed out (the oldest, when full), mr itself when it
 * could not keep it, or NULL. Locked. */
static struct provider_mr *keep(struct key_quarantine *q, struct provider_mr *mr)
{
	struct provider_mr *oldest;

	if (!q->on)
		return mr; /* done meanwhile */
	if (!q->mrs && !(q->mrs = calloc(KEY_QUARANTINE_MRS, sizeof(*q->mrs))))
		return mr;
	q->parked++;
	if (q->n < KEY_QUARANTINE_MRS) {
		q->mrs[(q->head + q->n++) % KEY_QUARANTINE_MRS] = mr;
		return NULL;
	}
	oldest = q->mrs[q->head];
	q->mrs[q->head] = mr;
	q->head = (q->head + 1) % KEY_QUARANTINE_MRS;
	return oldest;
}

void key_quarantine_lost(struct key_quarantine *q, const struct provider_mr *mr, int why)
{
	const struct provider *p = mr->pd->provider;
	bool first;

	if (!__atomic_load_n(&q->on, __ATOMIC_ACQUIRE))
		return; /* released keys do not come back here */
	pthread_mutex_lock(&q->lock);
	first = q->unparked++ == 0;
	pthread_mutex_unlock(&q->lock);
	if (!first)
		return;
	if (why > 0)
		log_notice("%s: parking made an MR anew, its old keys went back to the device and may "
			   "come back (mrd(8), Retirement on free); counted in mrctl pools", p->caps.device);
	else
		log_notice("%s: released MRs cannot be parked (%s): their keys may come back "
			   "(mrd(8), Retirement on free); counted in mrctl pools", p->caps.device,
			   why == -EOPNOTSUPP && p->caps.rereg_probe[0] ? p->caps.rereg_probe :
									  strerror(-why));
}

bool key_quarantine_parks_in_place(const struct provider_mr *mr)
{
	return (mr->access & MRD_ACCESS_ON_DEMAND) && mr->pd->provider->caps.odp_move_recreates;
}

int key_quarantine_release(struct key_quarantine *q, struct provider_mr *mr)
{
	struct provider_mr *out;
	int r;

	if (!mr)
		return 0;
	/* An MR whose rkey grants nothing remote ([windows] remote = window-only: the remote
	 * grants are windows, dead before its memory goes, mw-grants.h) has no key a peer could
	 * hold: it goes back to the device now. Its lkey may come back to the domain's next MR,
	 * but only the domain's own clients (who trust each other) post with its lkeys. */
	if (!__atomic_load_n(&q->on, __ATOMIC_ACQUIRE) || !(mr->access & MRD_ACCESS_MW_GRANTS))
		return provider_dereg(mr);
	/* Parked first: its keys die now, before its memory can go to anyone else. Parked
	 * under new keys (1), it was made anew: its old keys are the device's already, and
	 * keeping it would hold nothing back. An on-demand MR is parked in place where a park
	 * (a move) would make it anew (caps.odp_move_recreates: mlx5 always does). */
	r = key_quarantine_parks_in_place(mr) ? provider_park_in_place(mr) :
						provider_park(mr);
	if (r != 0) {
		key_quarantine_lost(q, mr, r);
		return provider_dereg(mr);
	}
	pthread_mutex_lock(&q->lock);
	out = keep(q, mr);
	if (out == mr)
		q->unparked++;
	pthread_mutex_unlock(&q->lock);
	(void)provider_dereg(out); /* parked: nothing of its memory is left to fail on */
	return 0;
}

void key_quarantine_counts(struct key_quarantine *q, bool *ret_on, uint64_t *ret_waiting,
			   uint64_t *ret_unparked)
{
	pthread_mutex_lock(&q->lock);
	*ret_on = q->on;
	*ret_waiting = q->n;
	*ret_unparked = q->unparked;
	pthread_mutex_unlock(&q->lock);
}

void key_quarantine_done(struct key_quarantine *q)
{
	struct provider_mr **mrs;
	unsigned head, n;

	pthread_mutex_lock(&q->lock);
	mrs = q->mrs, head = q->head, n = q->n;
	__atomic_store_n(&q->on, false, __ATOMIC_RELEASE);
	q->mrs = NULL;
	q->head = q->n = 0;
	pthread_mutex_unlock(&q->lock); /* kept: a release that saw it on may still lock it */
	for (unsigned i = 0; i < n; i++)
		(void)provider_dereg(mrs[(head + i) % KEY_QUARANTINE_MRS]);
	free(mrs);
}
