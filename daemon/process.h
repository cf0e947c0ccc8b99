/* SPDX-License-Identifier: MIT */
/* Which process a pid names: its start time tells it from a later process that got the pid. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* When pid started, in clock ticks since boot (/proc/pid/stat); 0 when that cannot be read. */
uint64_t process_start_time(pid_t pid);

/* Whether the process that was pid (started at start_time; 0: unknown, then it must still run
 * as uid) is gone: no such pid, a zombie, or another process under it. Only a certain answer
 * says gone: what cannot be read (and pid 0, a process mrd cannot see) is taken as alive. */
bool process_gone(pid_t pid, uid_t uid, uint64_t start_time);
