/* SPDX-License-Identifier: MIT */
/* A FUSE file system of one empty file, "f", whose server answers everything but FLUSH and
 * STATFS: each close() of the file (and any fstatfs) waits until the server goes. For tests
 * of descriptors whose close never returns; needs root and /dev/fuse. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

struct fuse_stall {
	pid_t server; /* 0: none */
	char dir[64]; /* the mount point; "" when none */
	char file[96]; /* dir/f */
};

/* Mounts it and starts its server in a child (gone with this process). 0, or -errno with the
 * reason in why (no /dev/fuse, mount refused): the caller says so and skips. */
int fuse_stall_start(struct fuse_stall *fs, char *why, size_t why_size);
/* Kills the server (every close waiting on it returns), then unmounts. Safe to call twice. */
void fuse_stall_stop(struct fuse_stall *fs);
