/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "registration/key-quarantine.h"
#include "provider/provider.h"

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

int key_quarantine_release(struct key_quarantine *q, struct provider_mr *mr)
{
	struct provider_mr *out;

	if (!mr)
		return 0;
	if (!__atomic_load_n(&q->on, __ATOMIC_ACQUIRE))
		return provider_dereg(mr);
	/* Parked first: its keys die now, before its memory can go to anyone else. */
	if (provider_park(mr) < 0) {
		pthread_mutex_lock(&q->lock);
		q->unparked++;
		pthread_mutex_unlock(&q->lock);
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
