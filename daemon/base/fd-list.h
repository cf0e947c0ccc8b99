/* SPDX-License-Identifier: MIT */
/* Descriptors with their names, the way systemd passes them (LISTEN_FDS, LISTEN_FDNAMES,
 * sd_listen_fds_with_names) and keeps them (its FD store): what a hand-over collects, then
 * numbers for an exec, or takes one by one by name. */
#pragma once

#include <stddef.h>

struct fd_list {
	int *fds; /* -1: taken, or placed for an exec */
	char **names;
	size_t n;
};

void fd_list_done(struct fd_list *f); /* closes what is still open */
/* Adds fd (taken: closed on failure) under a copy of name. */
int fd_list_add(struct fd_list *f, int fd, const char *name);
/* The first descriptor still in f under name, taken out (-1 in its place); -ENOENT: none. */
int fd_list_take(struct fd_list *f, const char *name);
/* Readies f for an exec that passes its descriptors the way systemd does, at start, start + 1,
 * ...: moves each above where the others go (close-on-exec still), and sets LISTEN_FDS,
 * LISTEN_FDNAMES and LISTEN_PID. Fails with nothing set (out of memory or descriptors). */
int fd_list_export(struct fd_list *f, int start);
/* Then, right before the exec: moves the descriptors to start, start + 1, ... without
 * close-on-exec; f keeps only their names. */
void fd_list_place(struct fd_list *f, int start);
