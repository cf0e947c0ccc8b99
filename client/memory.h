/* SPDX-License-Identifier: MIT */
/* memory.c's part in a handle's life: the domain joined (window, status page) on connect,
 * again on reconnect, and left on close. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "handle.h"

/* Joins the domain (window, status page) on connect; undone by memory_leave(). */
int memory_join(struct mrd_client *client);
/* JoinDomain on conn, a new connection to an mrd that took over from the one this handle had
 * (warm restart): the allocations it handed back, with the new status page's descriptor in
 * *ret_status_fd; -ESTALE when conn's mrd does not hold this memory (nothing handed back). */
int memory_rejoin(struct mrd_client *client, struct conn *conn, int *ret_status_fd);
/* Maps the new status page where the old one was (over a poisoned copy). */
int memory_remap_status(struct mrd_client *client, int fd);
/* Holds (lock) and releases the window's lock across fork(): the child gets it unlocked. */
void memory_fork_lock(bool lock);
/* After a reconnect, asks again on conn what got no answer, with the handle's lock held: each
 * one done now takes one off *resumed and n_held; each one the old mrd had done, off n_held.
 * Too many to have kept: *resumed becomes UINT_MAX (nothing can be told). -ECONNRESET or
 * -ETIMEDOUT: conn failed too; what is left stays for the next try. */
int memory_settle_lost_frees(struct mrd_client *client, struct conn *conn, unsigned *resumed);
void memory_leave(struct mrd_client *client);
/* Whether [start, end) overlaps the process's window (mrd's memory: allocated, mapped or
 * attached). */
bool memory_in_window(uintptr_t start, uintptr_t end);
/* Not exported (libmrd-preload.so links libmrd's objects): size bytes of 4 KiB pages that this
 * process maps at alias too, so that the MRs of its bound PDs over them use addresses there,
 * cover [span_offset, +span_length) of them alone (0: all) and grant access (ibv_access_flags
 * bits) alone (AllocRequest.alias). */
int memory_alloc_alias(struct mrd_client *client, size_t size, uint64_t alias, unsigned access,
		       uint64_t span_offset, uint64_t span_length, void **ret);
/* [span_offset, +span_length) of the aliased allocation at address becomes one more span its
 * MRs cover (another buffer on its pages: AliasSpanRequest); drop: that span goes, its MRs
 * with it. */
int memory_alias_span(struct mrd_client *client, void *address, uint64_t span_offset,
		      uint64_t span_length, bool drop);
