/* SPDX-License-Identifier: MIT */
/* Helpers for make bench: a clock, order statistics, and bare echo servers to measure mrd
 * against (see shared/PERF.md: every figure is a ratio to a baseline in the same run). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "wire.h"

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

/* Shared by both bench programs, which used to carry copies of each. */

/* Pins pid (0: the calling thread) to cpu, or lets it run anywhere when cpu < 0. */
int bench_pin(pid_t pid, int cpu);

/* One recv() of a whole packet, retried on EINTR: -ECONNRESET on EOF, as raw frames need. */
int bench_recv_reply(int fd, uint8_t *buf, size_t cap, size_t *ret_len);

/* Unpacks a reply and turns mrd's status into -errno; the caller frees *ret. */
int bench_unpack_reply(const uint8_t *buf, size_t len, Mrd__Response **ret);

/* Packs req into frame (frame_cap bytes), sends it on a raw connection and unpacks the reply
 * into *ret (the caller frees it); the packed and reply sizes go to *ret_req_len and
 * *ret_reply_len: what a bench's raw-frame rows send and expect. -EMSGSIZE when req does not
 * fit. */
int bench_probe(int fd, const Mrd__Request *req, uint8_t *frame, size_t frame_cap,
		size_t *ret_req_len, size_t *ret_reply_len, Mrd__Response **ret);

/* Sends Hello on a raw connection and checks the reply: mrd answers nothing else before it. */
int bench_raw_hello(int fd, uint64_t capabilities, const char *client_name);

/* Times n round trips of the packed frame req on fd (poll() before recv() when with_poll, as
 * libmrd does) into lat when not NULL; a reply not reply_len bytes long is -EBADMSG, so a server
 * that answered wrongly cannot look fast. */
int bench_lat_frame(int fd, const uint8_t *req, size_t req_len, size_t reply_len, bool with_poll,
		    uint64_t *lat, size_t n);

/* Prints one labelled row of per-rep values, so each figure shows its spread. */
void bench_print_doubles(const char *label, const double *v, size_t n);

/* One line of the closing summary: a figure, its target and the spread of its per-rep ratios. */
struct bench_summary {
	char name[32];
	double ratio, q1, q3, target;
	bool le; /* the target is an upper bound */
};

/* Appends a summary line to sum[*n_sum], the quartiles taken from the n per-rep ratios. */
void bench_add_summary(struct bench_summary *sum, size_t *n_sum, const char *name, double ratio,
		       const double *per_rep, size_t n, double target, bool le);

/* Prints the n summary lines, each saying whether its target holds; returns how many do. */
size_t bench_print_summary(const struct bench_summary *sum, size_t n);

/* A running mrd with BENCH_BUFS buffers of it, each looked up once, and a lookup cache whose
 * top half holds all of them: the common ground of the lookup benches. */
#define BENCH_BUFS MRD_CACHE_TOP
#define BENCH_BUF_SIZE (64u << 10)
struct bench_mrd {
	struct mrd_proc mrd;
	mrd_client *client;
	mrd_cache *l;
	uint8_t *buf[BENCH_BUFS];
	struct mrd_keys mr[BENCH_BUFS]; /* what mrd answered for each buffer */
};

/* prog names the program in messages. Returns 0 or -errno (said on stderr). */
int bench_mrd_start(struct bench_mrd *m, const char *prog);
void bench_mrd_stop(struct bench_mrd *m);

/* A timed loop's key sum must match what the buffers' keys add up to. */
int bench_check_sum(const char *prog, const char *row, uint64_t got, uint64_t want);

/* A small fixed-seed generator: the same addresses every run. */
static inline uint64_t bench_rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* Everything the compiler knows about memory is void here: loaded again after it. Case and
 * baseline loops run it once per lookup, so neither may keep its entries in registers across
 * lookups (a real cache is memory other code writes). */
#define RELOAD_BARRIER(p) __asm__ volatile("" : : "r"(p) : "memory")

/* The timed loops: noinline, so that case and baseline are compiled alone, not merged or
 * specialised together; each on a cache line, so that code added elsewhere cannot move a loop
 * across a line (at ~1 ns a lookup that alone moved a baseline by up to 40% between builds). */
#define TIMED __attribute__((noinline, aligned(64)))
