/* SPDX-License-Identifier: MIT */
/* Helpers for make bench: a clock, order statistics, and bare echo servers to measure mrd
 * against (see shared/PERF.md: every figure is a ratio to a baseline in the same run). */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

static inline uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Nearest-rank q-quantile (0 < q <= 1) of n samples; sorts v in place. */
uint64_t bench_quantile(uint64_t *v, size_t n, double q);

/* Median of n values; sorts v in place. */
double bench_median(double *v, size_t n);

/* First and third quartiles (nearest rank) of n values, v left as it is: the spread of the
 * per-rep ratios, to tell a missed target from noise. */
void bench_quartiles(const double *v, size_t n, double *ret_q1, double *ret_q3);

/* The share (0..1) of all CPUs that was busy during the next ms milliseconds, or -1: other
 * work on the machine widens every spread. The load average lags by a minute, so it would
 * also count the previous bench run. */
double bench_cpu_busy(unsigned ms);

enum echo_kind {
	ECHO_BLOCKING, /* one connection at a time, blocking recv then send */
	ECHO_EPOLL,    /* many connections, one thread, level-triggered epoll */
};

/* A bare SOCK_SEQPACKET echo server in its own process: each packet received is answered with
 * one packet of reply_len bytes, so a baseline moves the same bytes as an mrd round trip. */
struct echo_server {
	pid_t pid;
	char path[108];
};

/* Binds and listens on path before forking, so the server accepts as soon as this returns.
 * Call it before starting any thread (the child runs on after fork()). */
int echo_server_start(struct echo_server *s, enum echo_kind kind, const char *path,
		      size_t reply_len);
void echo_server_stop(struct echo_server *s);
