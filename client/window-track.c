/* SPDX-License-Identifier: MIT */
/* Windows of the program's own PD that mrd deallocates when the handle goes (WindowTrack): the
 * program's, libmrd's own (own-windows.c) and libmrd-preload's. A window left bound over one of
 * mrd's MRs in that PD by a program killed meanwhile would keep the MR, and with it the pages
 * (rxe refuses the dereg), until mrd's copy of the command fd closes. The handle keeps the set
 * too: a reconnect's new mrd is told it again. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "handle.h"
#include "window-track.h"
#include "mrd/mrd.h"

/* As mrd's bound (registration/bound-pd.h BOUND_PD_WINDOWS_MAX): the wire says it too. */
#define TRACK_MAX 1024u

static int track_call(struct mrd_client *client, bool clear, uint32_t *add, size_t n_add,
		      uint32_t *remove, size_t n_remove)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowTrackRequest q = MRD__WINDOW_TRACK_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	q.clear = clear;
	q.add = add;
	q.n_add = n_add;
	q.remove = remove;
	q.n_remove = n_remove;
	req.body_case = MRD__REQUEST__BODY_WINDOW_TRACK;
	req.window_track = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_WINDOW_TRACK)
		r = set_last_error(-EBADMSG, "malformed WindowTrack reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

static size_t find(const struct mrd_client *client, uint32_t handle)
{
	size_t i = 0;

	while (i < client->n_tracked && client->tracked[i] != handle)
		i++;
	return i;
}

MRD_EXPORT int mrd_window_track(mrd_client *client, uint32_t mw_handle)
{
	int r;

	if (!client)
		return set_last_error(-EINVAL, "mrd_window_track: client is NULL");
	/* A fork() child's handle is the parent's: no call, nor its lock (a thread of the
	 * parent may have held it across the fork). */
	if (client->forked)
		return client_forked_error(client);
	pthread_mutex_lock(&client->track_lock);
	if (find(client, mw_handle) < client->n_tracked) {
		pthread_mutex_unlock(&client->track_lock);
		return 0;
	}
	if (client->n_tracked == TRACK_MAX) {
		pthread_mutex_unlock(&client->track_lock);
		return set_last_error(-ENOSPC, "mrd_window_track: a handle tracks %u windows at "
				      "most", TRACK_MAX);
	}
	if (!client->tracked) {
		client->tracked = malloc(TRACK_MAX * sizeof(*client->tracked));
		if (!client->tracked) {
			pthread_mutex_unlock(&client->track_lock);
			return set_last_error(-ENOMEM, "out of memory");
		}
	}
	r = track_call(client, false, &mw_handle, 1, NULL, 0);
	if (r >= 0)
		client->tracked[client->n_tracked++] = mw_handle;
	pthread_mutex_unlock(&client->track_lock);
	return r < 0 ? r : 0;
}

MRD_EXPORT int mrd_window_untrack(mrd_client *client, uint32_t mw_handle)
{
	size_t i;
	int r;

	if (!client)
		return set_last_error(-EINVAL, "mrd_window_untrack: client is NULL");
	if (client->forked)
		return client_forked_error(client);
	pthread_mutex_lock(&client->track_lock);
	i = find(client, mw_handle);
	if (i == client->n_tracked) {
		pthread_mutex_unlock(&client->track_lock);
		return set_last_error(-ENOENT, "mrd_window_untrack: window %u is not tracked",
				      mw_handle);
	}
	/* Forgotten here whatever mrd answers: a handle whose connection is gone tracks
	 * nothing, and the next mrd hears only of what is left. */
	client->tracked[i] = client->tracked[--client->n_tracked];
	r = track_call(client, false, NULL, 0, &mw_handle, 1);
	pthread_mutex_unlock(&client->track_lock);
	return r < 0 ? r : 0;
}

int window_track_resend(struct mrd_client *client)
{
	int r = 0;

	if (client->forked)
		return 0;
	pthread_mutex_lock(&client->track_lock);
	if (client->n_tracked > 0)
		r = track_call(client, false, client->tracked, client->n_tracked, NULL, 0);
	pthread_mutex_unlock(&client->track_lock);
	return r;
}

void window_track_clear(struct mrd_client *client)
{
	if (client->forked) { /* the only thread: the lock may be a dead thread's */
		client->n_tracked = 0;
		return;
	}
	pthread_mutex_lock(&client->track_lock);
	/* All of mrd's record, also what an untrack that failed left there (tracked: this
	 * handle ever tracked a window). */
	if (client->tracked && !__atomic_load_n(&client->gone, __ATOMIC_ACQUIRE))
		(void)track_call(client, true, NULL, 0, NULL, 0);
	client->n_tracked = 0;
	pthread_mutex_unlock(&client->track_lock);
}

void window_track_done(struct mrd_client *client)
{
	free(client->tracked);
	if (!client->forked)
		pthread_mutex_destroy(&client->track_lock);
}
