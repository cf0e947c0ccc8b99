/* SPDX-License-Identifier: MIT */
/* The windows a handle tracked (mrd_window_track(3)): what a reconnect tells the next mrd. */
#pragma once

struct mrd_client;

/* After a reconnect bound the new connection: every tracked window, in one WindowTrack. */
int window_track_resend(struct mrd_client *client);
/* At mrd_client_close(), before libmrd deallocates its own windows: mrd forgets every window
 * tracked (a program that closes its handle lives on with its windows; mrd deallocates those of
 * a connection that ends without a close, the process's death). */
void window_track_clear(struct mrd_client *client);
/* At mrd_client_close(), last. */
void window_track_done(struct mrd_client *client);
