/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-util.h"
#include "macro.h"

#define ECHO_BUF_SIZE (64u * 1024u)
#define ECHO_EVENTS 64

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

uint64_t bench_quantile(uint64_t *v, size_t n, double q)
{
	size_t rank;

	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_u64);
	rank = (size_t)(q * (double)n + 0.999999); /* nearest rank, 1-based */
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

double bench_median(double *v, size_t n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void bench_quartiles(const double *v, size_t n, double *ret_q1, double *ret_q3)
{
	double sorted[64];

	if (n > ELEMENTSOF(sorted))
		n = ELEMENTSOF(sorted);
	if (n == 0) {
		*ret_q1 = *ret_q3 = 0;
		return;
	}
	memcpy(sorted, v, n * sizeof(*v));
	qsort(sorted, n, sizeof(*sorted), cmp_double);
	*ret_q1 = sorted[(n - 1) / 4];
	*ret_q3 = sorted[n - 1 - (n - 1) / 4];
}

/* Busy and total jiffies of all CPUs from /proc/stat's first line. */
static int cpu_jiffies(unsigned long long *ret_busy, unsigned long long *ret_total)
{
	unsigned long long v[8] = { 0 };
	FILE *f = fopen("/proc/stat", "re");
	int n;

	if (!f)
		return negative_errno();
	n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
		   &v[4], &v[5], &v[6], &v[7]);
	fclose(f);
	if (n < 5)
		return -EIO;
	*ret_total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
	*ret_busy = *ret_total - v[3] - v[4]; /* all but idle and iowait */
	return 0;
}

double bench_cpu_busy(unsigned ms)
{
	unsigned long long busy0, total0, busy1, total1;
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	if (cpu_jiffies(&busy0, &total0) < 0)
		return -1;
	nanosleep(&ts, NULL);
	if (cpu_jiffies(&busy1, &total1) < 0 || total1 <= total0)
		return -1;
	return (double)(busy1 - busy0) / (double)(total1 - total0);
}

static int listen_seqpacket(const char *path, int flags)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | flags, 0);
	if (fd < 0)
		return negative_errno();
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, SOMAXCONN) < 0) {
		int r = negative_errno();
		close(fd);
		return r;
	}
	return fd;
}

/* The least an echo can do per request: one recv, one send. */
static _Noreturn void serve_blocking(int lfd, const uint8_t *reply, size_t reply_len, uint8_t *buf)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		ssize_t n;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			_exit(EXIT_FAILURE);
		}
		while ((n = recv(fd, buf, ECHO_BUF_SIZE, 0)) > 0 || (n < 0 && errno == EINTR))
			if (n > 0)
				(void)send(fd, reply, reply_len, MSG_NOSIGNAL);
		close(fd);
	}
}

static void epoll_accept(int epfd, int lfd)
{
	for (;;) {
		struct epoll_event ev = { .events = EPOLLIN };
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0)
			return; /* EAGAIN: the backlog is drained */
		ev.data.fd = fd;
		if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
			close(fd);
	}
}

/* One packet per readiness, as a bare server would: the clients keep one request in flight,
 * so a second recv would only find EAGAIN, and the send never finds the queue full. */
static _Noreturn void serve_epoll(int lfd, const uint8_t *reply, size_t reply_len, uint8_t *buf)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = lfd }, events[ECHO_EVENTS];
	int epfd = epoll_create1(EPOLL_CLOEXEC);

	if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev) < 0)
		_exit(EXIT_FAILURE);
	for (;;) {
		int n = epoll_wait(epfd, events, ECHO_EVENTS, -1);

		if (n < 0 && errno != EINTR)
			_exit(EXIT_FAILURE);
		for (int i = 0; i < n; i++) {
			int fd = events[i].data.fd;
			ssize_t len;

			if (fd == lfd) {
				epoll_accept(epfd, lfd);
				continue;
			}
			len = recv(fd, buf, ECHO_BUF_SIZE, MSG_DONTWAIT);
			if (len > 0)
				(void)send(fd, reply, reply_len, MSG_DONTWAIT | MSG_NOSIGNAL);
			else if (len == 0 || (errno != EAGAIN && errno != EINTR))
				close(fd); /* also leaves the epoll set */
		}
	}
}

static _Noreturn void echo_child(int lfd, enum echo_kind kind, size_t reply_len)
{
	uint8_t *buf = malloc(ECHO_BUF_SIZE), *reply = calloc(1, reply_len ? reply_len : 1);

	/* Never outlive the bench, even when it crashes. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (!buf || !reply)
		_exit(EXIT_FAILURE);
	if (kind == ECHO_EPOLL)
		serve_epoll(lfd, reply, reply_len, buf);
	serve_blocking(lfd, reply, reply_len, buf);
}

int echo_server_start(struct echo_server *s, enum echo_kind kind, const char *path,
		      size_t reply_len)
{
	int lfd;

	memset(s, 0, sizeof(*s));
	if (reply_len > ECHO_BUF_SIZE)
		return -EMSGSIZE;
	if (strlen(path) >= sizeof(s->path))
		return -ENAMETOOLONG;
	strcpy(s->path, path);
	lfd = listen_seqpacket(path, kind == ECHO_EPOLL ? SOCK_NONBLOCK : 0);
	if (lfd < 0)
		return lfd;
	s->pid = fork();
	if (s->pid < 0) {
		int r = negative_errno();
		close(lfd);
		unlink(path);
		return r;
	}
	if (s->pid == 0)
		echo_child(lfd, kind, reply_len);
	close(lfd);
	return 0;
}

void echo_server_stop(struct echo_server *s)
{
	if (s->pid > 0) {
		kill(s->pid, SIGTERM);
		(void)waitpid(s->pid, NULL, 0);
		s->pid = 0;
	}
	if (s->path[0]) {
		unlink(s->path);
		s->path[0] = '\0';
	}
}

int bench_pin(pid_t pid, int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	if (cpu < 0)
		for (int i = 0; i < CPU_SETSIZE; i++)
			CPU_SET(i, &set);
	else
		CPU_SET(cpu, &set);
	return sched_setaffinity(pid, sizeof(set), &set) < 0 ? negative_errno() : 0;
}

int bench_recv_reply(int fd, uint8_t *buf, size_t cap, size_t *ret_len)
{
	ssize_t n;

	do
		n = recv(fd, buf, cap, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return negative_errno();
	if (n == 0)
		return -ECONNRESET;
	*ret_len = (size_t)n;
	return 0;
}

#define BENCH_FRAME_CAP 256 /* the raw frames' replies: small */

int bench_unpack_reply(const uint8_t *buf, size_t len, Mrd__Response **ret)
{
	Mrd__Response *resp = mrd__response__unpack(NULL, len, buf);

	if (!resp)
		return -EBADMSG;
	if (resp->status != 0) {
		int r = -resp->status;
		mrd__response__free_unpacked(resp, NULL);
		return r;
	}
	*ret = resp;
	return 0;
}

int bench_probe(int fd, const Mrd__Request *req, uint8_t *frame, size_t frame_cap,
		size_t *ret_req_len, size_t *ret_reply_len, Mrd__Response **ret)
{
	uint8_t buf[BENCH_FRAME_CAP];
	size_t len = protobuf_c_message_get_packed_size(&req->base);
	int r;

	if (len > frame_cap)
		return -EMSGSIZE;
	protobuf_c_message_pack(&req->base, frame);
	if (send(fd, frame, len, MSG_NOSIGNAL) < 0)
		return negative_errno();
	*ret_req_len = len;
	r = bench_recv_reply(fd, buf, sizeof(buf), ret_reply_len);
	return r < 0 ? r : bench_unpack_reply(buf, *ret_reply_len, ret);
}

int bench_raw_hello(int fd, uint64_t capabilities, const char *client_name)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest hello = MRD__HELLO_REQUEST__INIT;
	Mrd__Response *resp = NULL;
	uint8_t buf[4096];
	size_t len;
	int r;

	hello.min_version = MRD_PROTOCOL_VERSION_MIN;
	hello.max_version = MRD_PROTOCOL_VERSION_MAX;
	hello.capabilities = capabilities;
	hello.client_name = (char *)client_name;
	req.id = 1;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = wire_send(fd, &req.base, WIRE_FRAME_MAX, NULL, 0, 0);
	if (r >= 0)
		r = bench_recv_reply(fd, buf, sizeof(buf), &len);
	if (r >= 0)
		r = bench_unpack_reply(buf, len, &resp);
	if (r < 0)
		return r;
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

#define BENCH_POLL_TIMEOUT_MS 30000 /* libmrd's CONN_TIMEOUT_MS */

int bench_lat_frame(int fd, const uint8_t *req, size_t req_len, size_t reply_len, bool with_poll,
		    uint64_t *lat, size_t n)
{
	uint8_t buf[BENCH_FRAME_CAP];

	for (size_t i = 0; i < n; i++) {
		uint64_t t0 = bench_now_ns(), t1;
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		size_t len;
		int r;

		if (send(fd, req, req_len, MSG_NOSIGNAL) < 0)
			return negative_errno();
		if (with_poll && poll(&pfd, 1, BENCH_POLL_TIMEOUT_MS) <= 0)
			return -ETIMEDOUT;
		r = bench_recv_reply(fd, buf, sizeof(buf), &len);
		t1 = bench_now_ns();
		if (r < 0)
			return r;
		if (len != reply_len)
			return -EBADMSG;
		if (lat)
			lat[i] = t1 - t0;
	}
	return 0;
}

void bench_print_doubles(const char *label, const double *v, size_t n)
{
	printf("  %s:", label);
	for (size_t i = 0; i < n; i++)
		printf(" %.3f", v[i]);
	printf("\n");
}

void bench_add_summary(struct bench_summary *sum, size_t *n_sum, const char *name, double ratio,
		       const double *per_rep, size_t n, double target, bool le)
{
	struct bench_summary *s = &sum[(*n_sum)++];

	snprintf(s->name, sizeof(s->name), "%s", name);
	s->ratio = ratio;
	s->target = target;
	s->le = le;
	bench_quartiles(per_rep, n, &s->q1, &s->q3);
}

size_t bench_print_summary(const struct bench_summary *sum, size_t n)
{
	size_t held = 0;

	for (size_t i = 0; i < n; i++) {
		const struct bench_summary *s = &sum[i];
		bool ok = s->le ? s->ratio <= s->target : s->ratio >= s->target;

		printf("  %-23s %.3f %s %.2f: %-6s (per-rep IQR %.3f..%.3f%s)\n", s->name, s->ratio,
		       s->le ? "<=" : ">=", s->target, ok ? "holds" : "MISSED", s->q1, s->q3,
		       s->q1 <= s->target && s->target <= s->q3 ? ", straddles the target: uncertain" : "");
		held += ok;
	}
	return held;
}

int bench_mrd_start(struct bench_mrd *m, const char *prog)
{
	static const char *const mrd_args[] = { "--log-level", "warning", NULL };
	/* No huge pages, so the buffers are plain 4 KiB-page memory on any host; the quotas hold
	 * the buffers with room to spare. */
	static const char config[] = "[memory]\nhugepages = no\narena_size = 64M\n"
				     "[quota]\nallocated_bytes = 64M\npinned_bytes = 64M\n";
	int r = mrd_proc_start(&m->mrd, config, mrd_args);

	if (r < 0) {
		fprintf(stderr, "%s: cannot start mrd (MRD_BUILDDIR=%s): %s\n", prog,
			getenv("MRD_BUILDDIR") ?: "(unset)", strerror(-r));
		return r;
	}
	r = mrd_client_connect(m->mrd.socket, &m->client);
	if (r < 0)
		return r;
	for (int i = 0; i < BENCH_BUFS; i++) {
		r = mrd_mem_alloc(m->client, BENCH_BUF_SIZE, 0, 0, (void **)&m->buf[i]);
		if (r >= 0)
			r = mrd_keys_query(m->client, m->buf[i], &m->mr[i]);
		if (r < 0) {
			fprintf(stderr, "%s: buffer %d: %s\n", prog, i, mrd_last_error());
			return r;
		}
		/* An MR never spans two allocations (daemon/registration/mr-cache.h): 8 buffers, 8 MRs. */
		if (m->mr[i].start > (uintptr_t)m->buf[i] ||
		    m->mr[i].end < (uintptr_t)m->buf[i] + BENCH_BUF_SIZE)
			return -EBADMSG;
	}
	r = mrd_cache_new(m->client, &m->l);
	if (r < 0)
		return r;
	/* One lookup each fills the 8 top-half slots (round-robin victims, so none is evicted). */
	for (int i = 0; i < BENCH_BUFS; i++)
		if (mrd_cache_lkey(m->l, m->buf[i]) != m->mr[i].lkey)
			return -EBADMSG;
	return 0;
}

void bench_mrd_stop(struct bench_mrd *m)
{
	m->l = mrd_cache_free(m->l);
	m->client = mrd_client_close(m->client);
	if (m->mrd.pid > 0)
		mrd_proc_stop(&m->mrd);
}

int bench_check_sum(const char *prog, const char *row, uint64_t got, uint64_t want)
{
	if (got == want)
		return 0;
	fprintf(stderr, "%s: %s: keys summed to %llu, expected %llu\n", prog, row,
		(unsigned long long)got, (unsigned long long)want);
	return -EBADMSG;
}
