/* SPDX-License-Identifier: MIT */
/*
 * make bench, figure set "roundtrip": the full request path of mrd (a libmrd Ping) against a
 * bare SOCK_SEQPACKET echo moving the same bytes, in one run, interleaved (shared/PERF.md).
 *
 * Latency cases, each over its own connection, rotated within every rep:
 *   libmrd  mrd_client_ping() against a real mrd: the figure
 *   frame   a pre-packed Ping frame sent with send() and the reply read with a blocking recv()
 *           (SO_RCVTIMEO standing in for libmrd's 30 s timeout), against the same mrd: the
 *           daemon's share without the client library's
 *   poll    the same frame, but poll() before recv() as libmrd does: that syscall's share
 *   echo    a blocking echo server process: the baseline PERF.md names
 *   epoll   an epoll echo server process: how much an event loop costs by itself
 * Latency runs twice where there are two CPUs, because which CPU each side sleeps on changes
 * the ratio more than anything mrd does: "split" pins the client to CPU 0 and the servers to
 * CPU 1 (a daemon on its own core, as in production), "shared" pins them all to CPU 0 (an
 * oversubscribed machine, and what an unpinned run gets while other work keeps a CPU busy).
 * Throughput: K threads, one connection each, back-to-back pings against mrd and against the
 * epoll echo server; where there are two CPUs the clients are pinned to CPU 0 and the servers
 * to CPU 1, as "split" (unpinned, which CPU a lone client and its server wake on swung the
 * 1-client ratio from 0.07 to 0.8 between reps of one run). The raw clients (frame, echo)
 * receive as libmrd must (tp_recv): same socket setup, as PERF.md asks of the baselines.
 */
#include <errno.h>
#include <sched.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bench-util.h"
#include "macro.h"
#include "mrd/mrd.h"
#include "test-util.h"
#include "wire.h"

#define WARMUP 3000
#define LAT_N 5000 /* round trips per case per rep: 50 samples above p99 */
#define LAT_REPS 11
#define TP_REPS 9
#define TP_PINGS 25600 /* per run, split across its clients (a multiple of each count) */
/* The raw frame's id: a 3-byte varint, as libmrd's ids are for most of the run. */
#define PING_ID 20000
#define FRAME_CAP 256
#define POLL_TIMEOUT_MS 30000 /* libmrd's CONN_TIMEOUT_MS */
#define LIBMRD_RCVTIMEO_US 200 /* libmrd's lone wait in recv() (CONN_FRESH_NS) */

#define TARGET_P50 1.10
#define TARGET_P99 1.25
#define TARGET_TP 0.85

static const uint8_t ping_payload[8] = { 'm', 'r', 'd', '-', 'p', 'i', 'n', 'g' };
static const unsigned tp_clients[] = { 1, 4, 16, 64, 256 };

enum lat_case { LAT_LIBMRD, LAT_POLL, LAT_FRAME, LAT_ECHO, LAT_EPOLL, N_LAT };
static const char *const lat_names[N_LAT] = { "libmrd->mrd", "frame+poll->mrd", "frame->mrd",
					      "blocking-echo", "epoll-echo" };

enum placement { PLACE_SPLIT, PLACE_SHARED, N_PLACE };
static const char *const place_prefixes[N_PLACE] = { "roundtrip", "roundtrip-samecpu" };
static const char *const place_names[N_PLACE] = {
	"client on CPU 0, servers on CPU 1",
	"client and servers all on CPU 0",
};

/* The throughput cases: only the server differs between the last two, only the client between
 * the first two. */
enum tp_case { TP_LIBMRD, TP_FRAME, TP_ECHO, N_TP };
static const char *const tp_names[N_TP] = { "libmrd->mrd", "frame->mrd", "epoll-echo" };

struct bench {
	struct mrd_proc mrd;
	char dir[64];
	struct echo_server echo, epoll;
	uint8_t req[FRAME_CAP];
	size_t req_len, reply_len;
	mrd_client *client; /* LAT_LIBMRD */
	int fd[N_LAT];      /* raw connections of the other cases */

	bool pinned; /* CPUs 0 and 1 are ours: both placements ran */
	uint64_t p50[N_PLACE][N_LAT][LAT_REPS], p99[N_PLACE][N_LAT][LAT_REPS];
	double tp[ELEMENTSOF(tp_clients)][N_TP][TP_REPS]; /* pings/s */
};

/* The Ping frame libmrd sends, packed once; its reply's size is what the echoes answer. */
static int probe_ping(struct bench *b, int fd)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	Mrd__Response *resp = NULL;
	int r;

	ping.payload.data = (uint8_t *)ping_payload;
	ping.payload.len = sizeof(ping_payload);
	req.id = PING_ID;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	r = bench_probe(fd, &req, b->req, sizeof(b->req), &b->req_len, &b->reply_len, &resp);
	if (r < 0)
		return r;
	if (resp->id != PING_ID || resp->body_case != MRD__RESPONSE__BODY_PING ||
	    resp->ping->payload.len != sizeof(ping_payload))
		r = -EBADMSG;
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

/* One timed libmrd ping per sample; lat may be NULL (warm-up). */
static int lat_libmrd(mrd_client *c, uint64_t *lat, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t t0 = bench_now_ns();
		int r = mrd_client_ping(c);
		uint64_t t1 = bench_now_ns();

		if (r < 0)
			return r;
		if (lat)
			lat[i] = t1 - t0;
	}
	return 0;
}

static int lat_run(const struct bench *b, enum lat_case k, uint64_t *lat, size_t n)
{
	if (k == LAT_LIBMRD)
		return lat_libmrd(b->client, lat, n);
	return bench_lat_frame(b->fd[k], b->req, b->req_len, b->reply_len, k == LAT_POLL, lat,
			       n);
}

static int place(const struct bench *b, int client_cpu, int server_cpu)
{
	int r = bench_pin(0, client_cpu);

	if (r >= 0)
		r = bench_pin(b->mrd.pid, server_cpu);
	if (r >= 0)
		r = bench_pin(b->echo.pid, server_cpu);
	if (r >= 0)
		r = bench_pin(b->epoll.pid, server_cpu);
	return r;
}

/* Whether CPUs 0 and 1 are both ours to pin to. */
static bool can_pin(void)
{
	cpu_set_t set;

	return sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_ISSET(0, &set) &&
	       CPU_ISSET(1, &set);
}

/* All reps of one placement; returns -errno naming the failed case on stderr. */
static int bench_latency_placed(struct bench *b, enum placement pl, uint64_t *lat)
{
	int r;

	for (int k = 0; k < N_LAT; k++) {
		r = lat_run(b, k, NULL, WARMUP);
		if (r < 0)
			return r;
	}
	/* Rotate the order every rep so no case always runs first or last. */
	for (int rep = 0; rep < LAT_REPS; rep++)
		for (int j = 0; j < N_LAT; j++) {
			enum lat_case k = (enum lat_case)((rep + j) % N_LAT);

			r = lat_run(b, k, lat, LAT_N);
			if (r < 0) {
				fprintf(stderr, "bench-roundtrip: %s: %s\n", lat_names[k], strerror(-r));
				return r;
			}
			b->p50[pl][k][rep] = bench_quantile(lat, LAT_N, 0.50);
			b->p99[pl][k][rep] = bench_quantile(lat, LAT_N, 0.99);
		}
	return 0;
}

static int bench_latency(struct bench *b)
{
	_cleanup_free_ uint64_t *lat = malloc(LAT_N * sizeof(*lat));
	int r;

	if (!lat)
		return -ENOMEM;
	b->pinned = can_pin();
	if (!b->pinned)
		/* One CPU (or a cpuset without 0 and 1): the scheduler places everything. */
		return bench_latency_placed(b, PLACE_SPLIT, lat);
	r = place(b, 0, 1);
	if (r >= 0)
		r = bench_latency_placed(b, PLACE_SPLIT, lat);
	if (r >= 0)
		r = place(b, 0, 0);
	if (r >= 0)
		r = bench_latency_placed(b, PLACE_SHARED, lat);
	if (r >= 0)
		r = place(b, -1, -1); /* all CPUs again: throughput pins anew */
	return r;
}

struct tp_thread {
	const struct bench *b;
	enum tp_case mode;
	size_t count;
	pthread_barrier_t *barrier;
	uint64_t start, end;
	int error;
	pthread_t tid;
};

/* A receive timeout without a poll() per call, as libmrd's. */
static int set_rcvtimeo(int fd, unsigned us)
{
	struct timeval tv = { .tv_sec = us / 1000000, .tv_usec = us % 1000000 };

	return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ? negative_errno() : 0;
}

/* The raw throughput clients' receive is the one a lone libmrd caller makes: recvmsg() with
 * room for the descriptors a reply may carry (wire_recv), on a socket with libmrd's receive
 * timeout; when that expires, poll() until the reply is in. Plain recv() without a timeout
 * costs a client less than a client of mrd can pay, and at 256 threads the clients' CPU is what
 * runs out. */
static int tp_recv(int fd, uint8_t *buf, size_t cap, size_t *ret_len)
{
	struct wire_packet pkt;
	int r;

	while ((r = wire_recv(fd, buf, cap, &pkt, 0)) == -EAGAIN) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };

		if (poll(&pfd, 1, POLL_TIMEOUT_MS) < 0 && errno != EINTR)
			return negative_errno();
	}
	if (r == 0)
		return -ECONNRESET;
	if (r < 0)
		return r;
	wire_packet_close_fds(&pkt);
	*ret_len = pkt.len;
	return 0;
}

static int tp_connect(const struct tp_thread *t, mrd_client **ret_client, int *ret_fd)
{
	int fd, r;

	if (t->mode == TP_LIBMRD)
		return mrd_client_connect(t->b->mrd.socket, ret_client);
	fd = raw_connect(t->mode == TP_FRAME ? t->b->mrd.socket : t->b->epoll.path);
	if (fd < 0)
		return fd;
	r = t->mode == TP_FRAME ? bench_raw_hello(fd, MRD_CAP_PING, "bench-roundtrip") : 0;
	if (r >= 0)
		r = set_rcvtimeo(fd, LIBMRD_RCVTIMEO_US);
	if (r < 0) {
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

static int tp_loop(const struct tp_thread *t, mrd_client *c, int fd)
{
	uint8_t buf[FRAME_CAP];

	for (size_t i = 0; i < t->count; i++) {
		size_t len = t->b->reply_len;
		int r;

		if (c)
			r = mrd_client_ping(c);
		else if (send(fd, t->b->req, t->b->req_len, MSG_NOSIGNAL) < 0)
			r = negative_errno();
		else
			r = tp_recv(fd, buf, sizeof(buf), &len);
		if (r < 0)
			return r;
		if (len != t->b->reply_len)
			return -EBADMSG;
	}
	return 0;
}

static void *tp_main(void *userdata)
{
	struct tp_thread *t = userdata;
	mrd_client *c = NULL;
	int fd = -1;

	/* Connect before the barrier: only the pings are timed. */
	t->error = tp_connect(t, &c, &fd);
	pthread_barrier_wait(t->barrier); /* even after a failure, or the others would wait forever */
	if (t->error >= 0) {
		t->start = bench_now_ns();
		t->error = tp_loop(t, c, fd);
		t->end = bench_now_ns();
	}
	mrd_client_close(c);
	safe_close(fd);
	return NULL;
}

/* Pings per second of n clients, from the first start to the last finish. */
static int tp_run(const struct bench *b, enum tp_case mode, unsigned n, double *ret)
{
	_cleanup_free_ struct tp_thread *t = calloc(n, sizeof(*t));
	pthread_barrier_t barrier;
	uint64_t start = UINT64_MAX, end = 0;
	int r = 0;

	if (!t)
		return -ENOMEM;
	pthread_barrier_init(&barrier, NULL, n);
	for (unsigned i = 0; i < n; i++) {
		t[i] = (struct tp_thread){ .b = b, .mode = mode, .count = TP_PINGS / n,
					   .barrier = &barrier };
		r = -pthread_create(&t[i].tid, NULL, tp_main, &t[i]);
		if (r < 0) {
			/* The barrier can no longer fill and the started threads wait on it. */
			fprintf(stderr, "bench-roundtrip: pthread_create: %s\n", strerror(-r));
			exit(EXIT_FAILURE);
		}
	}
	for (unsigned i = 0; i < n; i++) {
		pthread_join(t[i].tid, NULL);
		if (t[i].error < 0 && r >= 0)
			r = t[i].error;
		if (t[i].start < start)
			start = t[i].start;
		if (t[i].end > end)
			end = t[i].end;
	}
	pthread_barrier_destroy(&barrier);
	if (r < 0) {
		fprintf(stderr, "bench-roundtrip: %s x%u: %s\n", tp_names[mode], n, strerror(-r));
		return r;
	}
	*ret = (double)(TP_PINGS / n * n) * 1e9 / (double)(end - start);
	return 0;
}

static int bench_throughput(struct bench *b)
{
	double ignored;
	int r = 0;

	b->pinned = can_pin();
	if (b->pinned)
		r = place(b, 0, 1);
	/* Warm-up: the first threads and connections of a process cost more. */
	for (int k = 0; k < N_TP && r >= 0; k++)
		r = tp_run(b, (enum tp_case)k, 4, &ignored);
	for (size_t i = 0; i < ELEMENTSOF(tp_clients) && r >= 0; i++)
		for (int rep = 0; rep < TP_REPS && r >= 0; rep++)
			/* Rotate the order every rep, as for latency. */
			for (int j = 0; j < N_TP && r >= 0; j++) {
				enum tp_case k = (enum tp_case)((rep + j) % N_TP);

				r = tp_run(b, k, tp_clients[i], &b->tp[i][k][rep]);
			}
	return r;
}

static double median_u64(const uint64_t *v, size_t n)
{
	double d[LAT_REPS];

	for (size_t i = 0; i < n; i++)
		d[i] = (double)v[i];
	return bench_median(d, n);
}

static double median_ratio(const uint64_t *num, const uint64_t *den, size_t n, double *per_rep)
{
	double d[LAT_REPS];

	for (size_t i = 0; i < n; i++)
		per_rep[i] = d[i] = (double)num[i] / (double)den[i];
	return bench_median(d, n);
}

static void report_latency(const struct bench *b, enum placement pl, struct bench_summary *sum,
			   size_t *n_sum)
{
	const uint64_t(*p50)[LAT_REPS] = b->p50[pl], (*p99)[LAT_REPS] = b->p99[pl];
	const char *prefix = place_prefixes[pl];
	double per_rep[LAT_REPS], per_rep50[LAT_REPS], per_rep99[LAT_REPS], r50, r99;
	char name[32];

	printf("%s: Ping request %zu B, reply %zu B; %s; %d reps x %d round trips per case, "
	       "%d warm-up, cases rotated each rep\n",
	       prefix, b->req_len, b->reply_len,
	       b->pinned ? place_names[pl] : "placed by the scheduler", LAT_REPS, LAT_N, WARMUP);
	r50 = median_ratio(p50[LAT_LIBMRD], p50[LAT_ECHO], LAT_REPS, per_rep50);
	printf("%s-p50: ratio=%.3f (case=mrd_client_ping via mrd baseline=blocking SEQPACKET echo of "
	       "the same bytes, separate process reps=%d)\n", prefix, r50, LAT_REPS);
	bench_print_doubles("per-rep p50 ratio", per_rep50, LAT_REPS);
	r99 = median_ratio(p99[LAT_LIBMRD], p99[LAT_ECHO], LAT_REPS, per_rep99);
	printf("%s-p99: ratio=%.3f (case=mrd_client_ping via mrd baseline=blocking SEQPACKET echo of "
	       "the same bytes, separate process reps=%d)\n", prefix, r99, LAT_REPS);
	bench_print_doubles("per-rep p99 ratio", per_rep99, LAT_REPS);
	printf("  raw ns, median of reps (p50 / p99):");
	for (int k = 0; k < N_LAT; k++)
		printf(" %s %.0f / %.0f%s", lat_names[k], median_u64(p50[k], LAT_REPS),
		       median_u64(p99[k], LAT_REPS), k + 1 < N_LAT ? ";" : "\n");

	/* Four factors whose product is roughly the p50 ratio: where the time goes. */
	printf("%s-epoll-p50: ratio=%.3f (case=epoll echo baseline=blocking echo reps=%d) "
	       "[informational: an event loop by itself]\n",
	       prefix, median_ratio(p50[LAT_EPOLL], p50[LAT_ECHO], LAT_REPS, per_rep), LAT_REPS);
	printf("%s-daemon-p50: ratio=%.3f (case=pre-packed Ping frame via mrd baseline=epoll echo "
	       "reps=%d) [informational: mrd's share]\n",
	       prefix, median_ratio(p50[LAT_FRAME], p50[LAT_EPOLL], LAT_REPS, per_rep), LAT_REPS);
	printf("%s-poll-p50: ratio=%.3f (case=pre-packed Ping frame via mrd, poll() before recv() "
	       "baseline=the same without poll() reps=%d) [informational: libmrd's poll()]\n",
	       prefix, median_ratio(p50[LAT_POLL], p50[LAT_FRAME], LAT_REPS, per_rep), LAT_REPS);
	printf("%s-client-p50: ratio=%.3f (case=mrd_client_ping via mrd baseline=pre-packed Ping "
	       "frame via mrd with poll() reps=%d) [informational: libmrd's protobuf-c, malloc, "
	       "lock]\n",
	       prefix, median_ratio(p50[LAT_LIBMRD], p50[LAT_POLL], LAT_REPS, per_rep), LAT_REPS);

	/* PERF.md's "bare echo" could mean either server; the blocking one is the stricter. */
	printf("%s-vs-epoll-p50: ratio=%.3f (case=mrd_client_ping via mrd baseline=epoll echo reps=%d) "
	       "[informational: the target read against an event-loop echo]\n",
	       prefix, median_ratio(p50[LAT_LIBMRD], p50[LAT_EPOLL], LAT_REPS, per_rep), LAT_REPS);

	snprintf(name, sizeof(name), "%s-p50", prefix);
	bench_add_summary(sum, n_sum, name, r50, per_rep50, LAT_REPS, TARGET_P50, true);
	snprintf(name, sizeof(name), "%s-p99", prefix);
	bench_add_summary(sum, n_sum, name, r99, per_rep99, LAT_REPS, TARGET_P99, true);
}

/* Median over reps of num/den, with the per-rep ratios printed after the figure line. */
static double tp_ratio(const double *num, const double *den, double *per_rep)
{
	double sorted[TP_REPS];

	for (int rep = 0; rep < TP_REPS; rep++)
		sorted[rep] = per_rep[rep] = num[rep] / den[rep];
	return bench_median(sorted, TP_REPS);
}

static void report_throughput(const struct bench *b, struct bench_summary *sum, size_t *n_sum)
{
	printf("throughput: %d pings per run split across the clients, %d reps, cases rotated each "
	       "rep; %s\n", TP_PINGS, TP_REPS,
	       b->pinned ? "clients on CPU 0, servers on CPU 1" : "placed by the scheduler");
	for (size_t i = 0; i < ELEMENTSOF(tp_clients); i++) {
		const double(*tp)[TP_REPS] = b->tp[i];
		double full[TP_REPS], daemon[TP_REPS], r_full, r_daemon;
		unsigned n = tp_clients[i];
		char name[32];

		r_full = tp_ratio(tp[TP_LIBMRD], tp[TP_ECHO], full);
		r_daemon = tp_ratio(tp[TP_FRAME], tp[TP_ECHO], daemon);
		printf("throughput-%u: ratio=%.3f (case=%u client thread(s), mrd_client_ping via mrd "
		       "baseline=the same threads sending the same bytes to an epoll SEQPACKET echo "
		       "process, received as libmrd does (recvmsg with room for descriptors, its "
		       "receive timeout) reps=%d)\n", n, r_full, n, TP_REPS);
		bench_print_doubles("per-rep ratio", full, TP_REPS);
		printf("throughput-daemon-%u: ratio=%.3f (case=%u client thread(s), pre-packed Ping "
		       "frames via mrd baseline=the same client code against the epoll echo reps=%d)\n",
		       n, r_daemon, n, TP_REPS);
		bench_print_doubles("per-rep ratio", daemon, TP_REPS);
		printf("  raw pings/s, median of reps:");
		for (int k = 0; k < N_TP; k++) {
			double v[TP_REPS];

			memcpy(v, tp[k], sizeof(v));
			printf(" %s %.0f%s", tp_names[k], bench_median(v, TP_REPS),
			       k + 1 < N_TP ? ";" : "\n");
		}
		snprintf(name, sizeof(name), "throughput-%u", n);
		bench_add_summary(sum, n_sum, name, r_full, full, TP_REPS, TARGET_TP, false);
		snprintf(name, sizeof(name), "throughput-daemon-%u", n);
		bench_add_summary(sum, n_sum, name, r_daemon, daemon, TP_REPS, TARGET_TP, false);
	}
}

static void report(const struct bench *b, bool latency, bool throughput, double busy_before)
{
	struct bench_summary sum[2 * N_PLACE + 2 * ELEMENTSOF(tp_clients)];
	long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n_sum = 0, held;

	for (int pl = 0; latency && pl < N_PLACE; pl++)
		if (pl == PLACE_SPLIT || b->pinned)
			report_latency(b, (enum placement)pl, sum, &n_sum);
	if (throughput)
		report_throughput(b, sum, &n_sum);

	printf("summary (targets from PERF.md: miss round trip vs bare echo p50 <= %.2fx, p99 <= "
	       "%.2fx; daemon throughput vs epoll echo >= %.2fx. Ping stands in for the miss round "
	       "trip, which has no cache lookup yet):\n", TARGET_P50, TARGET_P99, TARGET_TP);
	held = bench_print_summary(sum, n_sum);
	printf("  %zu of %zu targets hold; %ld CPUs, %.0f%% of them busy with other work just "
	       "before the run\n", held, n_sum, n_cpus, 100 * busy_before);
	/* The bench needs every CPU for itself: with other work running, p99 and throughput
	 * measure the scheduler, and only the pinned p50 ratios stay meaningful. */
	if (busy_before > 0.2)
		printf("  WARNING: the machine was busy before the run: trust the p50 ratios only, "
		       "and run make bench again on an idle machine\n");
}

/* mrd, the two echo servers (forked before any thread exists) and one connection per case. */
static int bench_setup(struct bench *b)
{
	static const char *const mrd_args[] = { "--log-level", "warning", NULL };
	char path[128];
	int r;

	for (int k = 0; k < N_LAT; k++)
		b->fd[k] = -1;
	snprintf(b->dir, sizeof(b->dir), "/tmp/mrd-bench.XXXXXX");
	if (!mkdtemp(b->dir))
		return negative_errno();
	r = mrd_proc_start(&b->mrd, "[quota]\nclients = 1024\n", mrd_args); /* 256 and the bench's own */
	if (r < 0) {
		fprintf(stderr, "bench-roundtrip: cannot start mrd (MRD_BUILDDIR=%s): %s\n",
			getenv("MRD_BUILDDIR") ?: "(unset)", strerror(-r));
		return r;
	}
	b->fd[LAT_FRAME] = raw_connect(b->mrd.socket);
	if (b->fd[LAT_FRAME] < 0)
		return b->fd[LAT_FRAME];
	r = set_rcvtimeo(b->fd[LAT_FRAME], POLL_TIMEOUT_MS * 1000);
	if (r < 0)
		return r;
	b->fd[LAT_POLL] = raw_connect(b->mrd.socket);
	if (b->fd[LAT_POLL] < 0)
		return b->fd[LAT_POLL];
	r = bench_raw_hello(b->fd[LAT_FRAME], MRD_CAP_PING, "bench-roundtrip");
	if (r >= 0)
		r = bench_raw_hello(b->fd[LAT_POLL], MRD_CAP_PING, "bench-roundtrip");
	if (r >= 0)
		r = probe_ping(b, b->fd[LAT_FRAME]);
	if (r < 0) {
		fprintf(stderr, "bench-roundtrip: Hello/Ping to mrd: %s\n", strerror(-r));
		return r;
	}

	fflush(NULL); /* the children must not print our buffered output again */
	snprintf(path, sizeof(path), "%s/echo.sock", b->dir);
	r = echo_server_start(&b->echo, ECHO_BLOCKING, path, b->reply_len);
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/epoll.sock", b->dir);
	r = echo_server_start(&b->epoll, ECHO_EPOLL, path, b->reply_len);
	if (r < 0)
		return r;

	r = mrd_client_connect(b->mrd.socket, &b->client);
	if (r < 0)
		return r;
	b->fd[LAT_ECHO] = raw_connect(b->echo.path);
	if (b->fd[LAT_ECHO] < 0)
		return b->fd[LAT_ECHO];
	b->fd[LAT_EPOLL] = raw_connect(b->epoll.path);
	return b->fd[LAT_EPOLL] < 0 ? b->fd[LAT_EPOLL] : 0;
}

static void bench_teardown(struct bench *b)
{
	mrd_client_close(b->client);
	for (int k = 0; k < N_LAT; k++)
		safe_close(b->fd[k]);
	echo_server_stop(&b->echo);
	echo_server_stop(&b->epoll);
	if (b->mrd.pid > 0)
		mrd_proc_stop(&b->mrd);
	if (b->dir[0])
		rmdir(b->dir);
}

/* An optional argument runs one half, e.g. to profile mrd over a known number of requests:
 * MRD_TEST_WRAPPER="valgrind --tool=callgrind" bench/bench-roundtrip latency */
int main(int argc, char **argv)
{
	static struct bench b;
	uint64_t t0 = bench_now_ns();
	double busy_before = bench_cpu_busy(300);
	bool latency = true, throughput = true;
	int r;

	if (argc > 2 || (argc == 2 && strcmp(argv[1], "latency") != 0 &&
			 strcmp(argv[1], "throughput") != 0)) {
		fprintf(stderr, "usage: bench-roundtrip [latency|throughput]\n");
		return EXIT_FAILURE;
	}
	if (argc == 2) {
		latency = strcmp(argv[1], "latency") == 0;
		throughput = !latency;
	}
	signal(SIGPIPE, SIG_IGN);
	r = bench_setup(&b);
	if (r < 0)
		fprintf(stderr, "bench-roundtrip: setup: %s\n", strerror(-r));
	if (r >= 0 && latency)
		r = bench_latency(&b);
	if (r >= 0 && throughput)
		r = bench_throughput(&b);
	bench_teardown(&b);
	if (r < 0)
		return EXIT_FAILURE;
	report(&b, latency, throughput, busy_before);
	printf("  (bench-roundtrip took %.1f s)\n", (double)(bench_now_ns() - t0) / 1e9);
	return EXIT_SUCCESS;
}
