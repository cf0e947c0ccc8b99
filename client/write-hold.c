/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "address-space.h"
#include "write-hold.h"

/* How a hold opens its userfaultfd, best first. */
enum how { HOW_SYSCALL, HOW_DEVICE, HOW_USER_ONLY, HOW_NONE };

/* Whether [start, end) lies on the calling thread's stack, which a thread holding writes off
 * would fault on and wait for itself. Its mapping is looked up in the maps (a thread's stack is
 * plain anonymous memory; no allocation: this runs inside free()), once per thread, and again
 * where the frame left it: a stack split in two mappings (mprotect, madvise or mlock of a part)
 * runs on into the other. */
static bool on_own_stack(uintptr_t start, uintptr_t end)
{
	static __thread uintptr_t lo, hi;
	volatile char here;
	uintptr_t frame = (uintptr_t)&here;

	if ((frame < lo || frame >= hi) && address_space_mapping_of(frame, &lo, &hi) < 0) {
		lo = hi = 0;
		return true; /* unknown: as if it were */
	}
	return start < hi && lo < end;
}

static int open_uffd(enum how how)
{
	int flags = O_CLOEXEC | O_NONBLOCK;
	long fd;

	if (how == HOW_DEVICE) {
		/* Access to /dev/userfaultfd is how an administrator lets a process's
		 * userfaultfd hold system calls too (Linux 6.1). */
#ifdef USERFAULTFD_IOC_NEW
		int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);

		if (dev < 0)
			return -errno;
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
		fd = fd < 0 ? -errno : fd;
		close(dev);
		return (int)fd;
#else
		return -ENOSYS;
#endif
	}
	if (how == HOW_USER_ONLY)
		flags |= UFFD_USER_MODE_ONLY;
	fd = syscall(SYS_userfaultfd, flags);
	return fd < 0 ? -errno : (int)fd;
}

/* The first way that gives a userfaultfd able to write-protect both kinds of memory, found
 * once, and again where it fails (the process dropped its rights since: setuid()). */
static int chosen = -1;

static enum how chosen_how(void)
{
	int how = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
	bool short_of = false;

	if (how >= 0)
		return (enum how)how;
	for (how = HOW_SYSCALL; how < HOW_NONE; how++) {
		struct uffdio_api api = { .api = UFFD_API };
		int fd = open_uffd((enum how)how);
		bool wp;

		if (fd < 0) {
			short_of |= fd == -EMFILE || fd == -ENFILE || fd == -ENOMEM;
			continue;
		}
		/* Private memory for the move, mrd's shared memory for the move back. */
		wp = ioctl(fd, UFFDIO_API, &api) == 0 &&
		     (api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP) &&
		     (api.features & UFFD_FEATURE_WP_HUGETLBFS_SHMEM);
		close(fd);
		if (wp)
			break;
	}
	/* Out of descriptors or memory for a moment: no answer for good (none at all would
	 * refuse every later move and leave every move back of a range moved before unheld). */
	if (short_of)
		return (enum how)how;
	__atomic_store_n(&chosen, how, __ATOMIC_RELEASE);
	return (enum how)how;
}

enum write_hold_reach write_hold_reach(void)
{
	switch (chosen_how()) {
	case HOW_SYSCALL:
	case HOW_DEVICE:
		return WRITE_HOLD_ALL;
	case HOW_USER_ONLY:
		return WRITE_HOLD_USER;
	default:
		return WRITE_HOLD_NONE;
	}
}

/* A page never written has no entry in the page table to protect (Debian 12's Linux 6.1 has
 * no UFFD_FEATURE_WP_UNPOPULATED): each gets one first. An atomic add of 0 where madvise
 * cannot, so that a concurrent write is never undone. */
static void populate_write(uintptr_t start, uintptr_t end)
{
#ifdef MADV_POPULATE_WRITE
	if (madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0)
		return;
#endif
	for (uintptr_t p = start; p < end; p += (uintptr_t)sysconf(_SC_PAGESIZE))
		__atomic_fetch_add((char *)p, 0, __ATOMIC_RELAXED);
}

int write_hold_start(struct write_hold *h, uintptr_t start, uintptr_t end, bool shared,
		     char *why, size_t why_size)
{
	enum how how = chosen_how();
	struct uffdio_api api = { .api = UFFD_API,
				  .features = shared ? UFFD_FEATURE_WP_HUGETLBFS_SHMEM : 0 };
	struct uffdio_register reg = { .range = { start, end - start },
				       .mode = UFFDIO_REGISTER_MODE_WP };
	struct uffdio_writeprotect wp = { .range = { start, end - start },
					  .mode = UFFDIO_WRITEPROTECT_MODE_WP };
	const char *what = "UFFDIO_API";
	sigset_t all;
	int k;

	if (on_own_stack(start, end)) {
		snprintf(why, why_size, "it holds the calling thread's stack");
		return -EDEADLK;
	}
	if (how == HOW_NONE) {
		snprintf(why, why_size, "no userfaultfd here can write-protect its pages while "
			 "they move");
		return -EOPNOTSUPP;
	}
	populate_write(start, end);
	h->fd = open_uffd(how);
	if (h->fd < 0) {
		__atomic_store_n(&chosen, -1, __ATOMIC_RELEASE);
		how = chosen_how();
		h->fd = how == HOW_NONE ? h->fd : open_uffd(how);
	}
	h->start = start;
	h->end = end;
	if (h->fd < 0) {
		k = h->fd;
		what = "userfaultfd";
		goto fail;
	}
	if (ioctl(h->fd, UFFDIO_API, &api) < 0)
		goto fail_errno;
	what = "UFFDIO_REGISTER";
	if (ioctl(h->fd, UFFDIO_REGISTER, &reg) < 0)
		goto fail_errno; /* EBUSY: the program's own userfaultfd has them */
	/* A handler of the thread's own signals that wrote the pages would wait for itself. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &h->mask);
	what = "UFFDIO_WRITEPROTECT";
	if (ioctl(h->fd, UFFDIO_WRITEPROTECT, &wp) < 0) {
		k = -errno;
		pthread_sigmask(SIG_SETMASK, &h->mask, NULL);
		goto fail;
	}
	return 0;
fail_errno:
	k = -errno;
fail:
	if (h->fd >= 0)
		close(h->fd);
	snprintf(why, why_size, "%s to hold writes off while its pages move: %s", what,
		 strerror(-k));
	return -EOPNOTSUPP;
}

void write_hold_release(struct write_hold *h, bool replaced)
{
	struct uffdio_range range = { h->start, h->end - h->start };

	if (!replaced) {
		struct uffdio_writeprotect wp = { .range = range };

		(void)ioctl(h->fd, UFFDIO_WRITEPROTECT, &wp);
	} else {
		/* The writers waiting queued themselves before the mapping changed (holding the
		 * mapping's lock to queue) and retry against the new one, once woken: here, not
		 * by the close, which is not the last where a child made without fork handlers
		 * (_Fork(), clone()) during the hold has the userfaultfd too. */
		(void)ioctl(h->fd, UFFDIO_WAKE, &range);
	}
	/* Closing unregisters what is left. Not close(): a cancellation point, where a
	 * pthread_cancel() that came during the hold would end the thread with the descriptor
	 * open. */
	syscall(SYS_close, h->fd);
	pthread_sigmask(SIG_SETMASK, &h->mask, NULL);
}
