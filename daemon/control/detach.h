/* SPDX-License-Identifier: MIT */
#pragma once

/* Classic daemon start for hosts without systemd: the parent waits until the child reports
 * that it serves (or failed), and exits with that result. */

/* Forks; returns in the child only. Returns -errno when fork fails. */
int detach_begin(void);

/* In the child: tells the waiting parent the outcome (0 or -errno), then detaches stdio and
 * switches logging to syslog on success. */
void detach_finish(int result);
