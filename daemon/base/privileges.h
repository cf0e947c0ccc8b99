/* SPDX-License-Identifier: MIT */
/* The capabilities mrd gives up before it opens a device. */
#pragma once

/* Drops CAP_NET_RAW and CAP_SYS_RAWIO from the effective, permitted, inheritable and ambient
 * sets and from the bounding set (so that a re-exec cannot get them back): on mlx5 a context
 * takes the rights of the process that opened it, and every client importing the context
 * shares them (mrd(8), PRIVILEGES). 0, or -errno when the process still holds one in a set it
 * uses. Without CAP_SETPCAP (not root) the bounding set stays as it is: a re-exec that
 * regains a right (file capabilities) drops it again here. */
int privileges_drop_raw(void);
