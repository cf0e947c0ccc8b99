/* SPDX-License-Identifier: MIT */
/* Memory windows in the client-PD model: libmrd binds type-2 windows of the program's own PD on
 * the program's own QP, over MRs mrd made in that PD (BindPd), from a pool of allocated windows
 * with the key byte advanced on every bind; no request to mrd once the MR's keys are known.
 * A window over memory that is freed is deallocated by libmrd before the Free goes to mrd, so
 * its rkey is dead before mrd lets the pages go. libmrd never sees the completions of what it
 * posts (they are the program's), so it deallocates a window only where the program's rules
 * (mrd_window_grant(3)) say nothing it posted for the window can still run. Built where <infiniband/verbs.h> is (the calls
 * are its inline ones: libmrd links no libibverbs); elsewhere each says -EOPNOTSUPP. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mrd_client;

int own_window_grant(struct mrd_client *client, void *qp, const void *addr, size_t len,
		     unsigned access, uint32_t *rkey);
int own_window_revoke(struct mrd_client *client, void *qp, uint32_t rkey);
/* mrd_window_qp_gone(): every window on qp deallocated; how many. */
int own_windows_qp_gone(struct mrd_client *client, void *qp);
/* Before mrd_mem_free() or mrd_extmem_detach() of the allocation at addr: its windows die, and
 * grants over it are refused until own_windows_after_free(), called with what this returned
 * (whether it holds the lock: only when memory ran short) once the request was answered. */
bool own_windows_before_free(struct mrd_client *client, uint64_t addr);
void own_windows_after_free(struct mrd_client *client, uint64_t addr, bool held);
/* At mrd_client_close(): every window deallocated (in a fork() child only forgotten). */
void own_windows_close(struct mrd_client *client);
