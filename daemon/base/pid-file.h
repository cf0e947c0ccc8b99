/* SPDX-License-Identifier: MIT */
/* mrd --pid-file: for hosts without systemd. The file holds mrd's pid and a lock (flock) that
 * mrd holds while it runs: a file nobody locks is stale (mrd was killed) and is replaced, one
 * that is locked belongs to a live mrd and mrd does not start. Written beside itself and
 * renamed over, once mrd serves: a reader sees a whole pid or none. A re-exec (SIGUSR2) keeps
 * the pid; the new image takes the file again. */
#pragma once

#include <sys/types.h>

/* Whether path may be taken: 0 (no file, or a stale one), or -EBUSY, logged with the pid
 * the file holds, when a live mrd holds it. */
int pid_file_check(const char *path);

/* Writes this process's pid to path (atomically) and keeps its lock: *ret_fd, for
 * pid_file_remove. 0 or -errno, logged. */
int pid_file_write(const char *path, int *ret_fd);

/* At exit: removes path when it is still the file fd holds, and closes fd (fd < 0: nothing). */
void pid_file_remove(const char *path, int fd);
