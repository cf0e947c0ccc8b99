/* SPDX-License-Identifier: MIT */
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
