/* SPDX-License-Identifier: MIT */
/* Microsecond clocks and the conversions the waits need. */
#pragma once

#include <stdint.h>
#include <time.h>

#define USEC_PER_SEC 1000000ULL

static inline uint64_t now_usec(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * USEC_PER_SEC + (uint64_t)ts.tv_nsec / 1000;
}

/* usec (of any clock) as a timespec, for the waits that take one. */
static inline struct timespec timespec_from_usec(uint64_t usec)
{
	return (struct timespec){ .tv_sec = (time_t)(usec / USEC_PER_SEC),
				  .tv_nsec = (long)(usec % USEC_PER_SEC) * 1000 };
}
