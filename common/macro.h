/* SPDX-License-Identifier: MIT */
/* Small language helpers every part shares: array size, container_of, cleanup attributes with
 * TAKE_PTR/TAKE_FD (the one idiom for owned pointers and descriptors in new code), branch hints. */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))
/* The object whose member ptr points at. */
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

/* Hand off ownership: return the value and clear the variable so its cleanup does nothing. */
#define TAKE_PTR(p)                          \
	({                                   \
		__typeof__(p) _tp_ = (p);    \
		(p) = NULL;                  \
		_tp_;                        \
	})
#define TAKE_FD(fd)                          \
	({                                   \
		int _tf_ = (fd);             \
		(fd) = -1;                   \
		_tf_;                        \
	})

/* close() that keeps errno and accepts -1; always returns -1 so callers can write fd = safe_close(fd). */
static inline int safe_close(int fd)
{
	if (fd >= 0) {
		int saved = errno;
		close(fd);
		errno = saved;
	}
	return -1;
}

static inline void closep(int *fd) { safe_close(*fd); }
static inline void freep(void *p) { free(*(void **)p); }

#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_free_ _cleanup_(freep)

/* Define a cleanup helper for a NULL-safe destructor "type *name(type *)". */
#define DEFINE_CLEANUP(type, func)                 \
	static inline void func##p(type **p)       \
	{                                          \
		if (*p)                            \
			func(*p);                  \
	}

/* errno as a negative value, never 0 even when a libc call forgot to set it. */
static inline int negative_errno(void) { return errno > 0 ? -errno : -EIO; }
