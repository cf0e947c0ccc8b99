/* SPDX-License-Identifier: MIT */
/* Every write to a range of pages held off while the shim copies them (a move onto mrd's
 * memory, or back): the pages are write-protected through a userfaultfd, so a thread, a signal
 * handler or the kernel writing them for a system call (read() into them) waits in the kernel
 * until the hold is released, then retries the write against whatever is mapped there by then
 * (the copy, swapped in). Nothing waits on the hold but the writers: the shim never reads the
 * userfaultfd, it wakes them all at the end. */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct write_hold {
	int fd;
	uintptr_t start, end;
	sigset_t mask; /* the caller's, while it holds every signal off */
};

/* Which writers a hold stops in this process: the kernel's and the process's rights decide. */
enum write_hold_reach {
	WRITE_HOLD_NONE,    /* no write-protecting userfaultfd: nothing is held */
	WRITE_HOLD_USER,    /* an unprivileged one (vm.unprivileged_userfaultfd = 0, no
			     * /dev/userfaultfd): threads and signal handlers wait, a system call
			     * writing the pages fails with EFAULT instead */
	WRITE_HOLD_ALL,     /* threads, signal handlers and system calls wait */
};
enum write_hold_reach write_hold_reach(void);

/* Holds writes to [start, end) (page aligned; private anonymous memory, or shared memory where
 * shared) off, and every signal of the calling thread, whose own handlers would wait on it. 0;
 * -EDEADLK where the calling thread's stack lies there (it would wait for itself);
 * -EOPNOTSUPP (why says why) where nothing can hold them: no write-protecting userfaultfd, or
 * the program registered the pages with its own. */
int write_hold_start(struct write_hold *h, uintptr_t start, uintptr_t end, bool shared,
		     char *why, size_t why_size);
/* Lets the writers go. replaced: a mapping took the range's place (its protection went with
 * the old one); else the pages are made writable again. */
void write_hold_release(struct write_hold *h, bool replaced);
