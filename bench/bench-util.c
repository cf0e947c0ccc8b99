/* SPDX-License-Identifier: MIT */
#include <errno.h>
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
