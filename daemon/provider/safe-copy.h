/* SPDX-License-Identifier: MIT */
/* A memmove that survives the memory going away under it. Clients can punch holes in memory
 * mrd copies (their attached memfds, and mrd's own arenas, which they map writable); on
 * hugetlb, touching a hole the kernel cannot fill (no free huge page) is SIGBUS. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Copies n bytes from src to dst as memmove does, except that a SIGBUS on a page of either
 * range ends the copy (part of it may be done): -EFAULT then, with the faulting address in
 * *ret_fault (when not NULL). Thread-safe. The first call installs mrd's SIGBUS handler: it
 * returns into the copy of the thread that faulted, and any other SIGBUS (a fault anywhere
 * else, a kill) gets the action there was before, so that still kills mrd as it should. */
int safe_memmove(void *dst, const void *src, size_t n, uintptr_t *ret_fault);
