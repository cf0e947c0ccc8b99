/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/fd-closer.h"
#include "log.h"
#include "macro.h"
#include "base/worker-pool.h"

/* Bounds on emptying one Unix socket: packets (finite anyway once it is shut down, but a
 * closer thread should not spin for ever on a kernel that differs), pending connections. */
#define DRAIN_MAX (1u << 20)
#define ACCEPT_MAX 4096u

struct closing {
	int fd;
	uid_t uid;
};

struct fd_closer {
	pthread_mutex_t lock;
	pthread_cond_t wake;
	struct closing *queue; /* a ring: n entries from head */
	size_t head, n, cap;
	struct closing busy[FD_CLOSER_THREADS]; /* in a close() now; fd -1: free */
	pthread_t threads[FD_CLOSER_THREADS];
	unsigned n_threads, n_idle;
	bool stopping;
};

/* What fd_closer_free could not wait for: threads still use it until the process exits. */
static struct fd_closer *abandoned;

static int queue_push(struct fd_closer *fc, int fd, uid_t uid)
{
	if (fc->n == fc->cap) {
		size_t cap = fc->cap ? fc->cap * 2 : 64;
		struct closing *q = malloc(cap * sizeof(*q));

		if (!q)
			return -ENOMEM;
		for (size_t i = 0; i < fc->n; i++)
			q[i] = fc->queue[(fc->head + i) % fc->cap];
		free(fc->queue);
		fc->queue = q;
		fc->head = 0;
		fc->cap = cap;
	}
	fc->queue[(fc->head + fc->n) % fc->cap] = (struct closing){ fd, uid };
	fc->n++;
	return 0;
}

static struct closing queue_pop(struct fd_closer *fc)
{
	struct closing e = fc->queue[fc->head];

	fc->head = (fc->head + 1) % fc->cap;
	fc->n--;
	return e;
}

/* Descriptors in flight inside a Unix socket would be released by its close(), on this thread,
 * as they are: each is taken out and queued like any other, so that it is defused too. */
static void take_in_flight(struct fd_closer *fc, int fd, uid_t uid)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(struct ucred)) +
			 CMSG_SPACE(sizeof(int) * WIRE_RECV_FDS_MAX)];
	} control;
	int one = 1, listening = 0;
	socklen_t len = sizeof(listening);
	uint8_t buf[4096];

	/* Nothing more comes in: the peer's sends and connects fail from now on. */
	(void)shutdown(fd, SHUT_RDWR);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening) {
		/* Connections not yet accepted hold what their clients sent. */
		for (unsigned i = 0; i < ACCEPT_MAX; i++) {
			int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

			if (c < 0)
				break;
			fd_closer_consume(fc, c, uid);
		}
		return;
	}
	/* With SO_PASSCRED every packet read brings its sender's credentials, so a read with
	 * no control message is the end, where an empty SEQPACKET packet reads the same. */
	if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0)
		return;
	for (unsigned i = 0; i < DRAIN_MAX; i++) {
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
				     .msg_controllen = sizeof(control.buf) };
		ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || (n == 0 && mh.msg_controllen == 0))
			break;
		for (struct cmsghdr *cmsg = CMSG_FIRSTHDR(&mh); cmsg; cmsg = CMSG_NXTHDR(&mh, cmsg)) {
			size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
				continue;
			for (size_t k = 0; k < count; k++) {
				int rfd;

				memcpy(&rfd, CMSG_DATA(cmsg) + k * sizeof(int), sizeof(int));
				fd_closer_consume(fc, rfd, uid);
			}
		}
	}
}

/* Makes fd's close() quick where the kernel allows: a socket drops what it could not send
 * (SO_LINGER {1, 0}: TCP resets instead of waiting out the linger time the client set), a
 * Unix socket gives up what it holds. getsockopt asks no filesystem, unlike fstat (FUSE). */
static void defuse(struct fd_closer *fc, int fd, uid_t uid)
{
	static const struct linger abort_on_close = { .l_onoff = 1, .l_linger = 0 };
	int domain;
	socklen_t len = sizeof(domain);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0)
		return; /* not a socket */
	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
	if (domain == AF_UNIX)
		take_in_flight(fc, fd, uid);
}

static void *closer_main(void *arg)
{
	struct fd_closer *fc = arg;

	thread_block_loop_signals();
	pthread_mutex_lock(&fc->lock);
	for (;;) {
		struct closing e;
		unsigned slot = 0;

		if (fc->n == 0) {
			if (fc->stopping)
				break;
			fc->n_idle++;
			pthread_cond_wait(&fc->wake, &fc->lock);
			fc->n_idle--;
			continue;
		}
		e = queue_pop(fc);
		while (fc->busy[slot].fd >= 0)
			slot++; /* there are as many slots as threads */
		fc->busy[slot] = e;
		pthread_mutex_unlock(&fc->lock);
		defuse(fc, e.fd, e.uid);
		close(e.fd);
		pthread_mutex_lock(&fc->lock);
		fc->busy[slot].fd = -1;
	}
	pthread_mutex_unlock(&fc->lock);
	return NULL;
}

int fd_closer_new(struct fd_closer **ret)
{
	struct fd_closer *fc = calloc(1, sizeof(*fc));
	int r;

	if (!fc)
		return -ENOMEM;
	pthread_mutex_init(&fc->lock, NULL);
	pthread_cond_init(&fc->wake, NULL);
	for (unsigned i = 0; i < FD_CLOSER_THREADS; i++)
		fc->busy[i].fd = -1;
	/* One thread from the start, so a queued descriptor always has one to close it. */
	r = -pthread_create(&fc->threads[0], NULL, closer_main, fc);
	if (r < 0) {
		fd_closer_free(fc);
		return r;
	}
	fc->n_threads = 1;
	*ret = fc;
	return 0;
}

struct fd_closer *fd_closer_free(struct fd_closer *fc)
{
	struct timespec deadline;
	bool stuck = false;
	unsigned n_threads;

	if (!fc)
		return NULL;
	pthread_mutex_lock(&fc->lock);
	fc->stopping = true; /* no thread starts from now on: n_threads stays */
	pthread_cond_broadcast(&fc->wake);
	n_threads = fc->n_threads;
	pthread_mutex_unlock(&fc->lock);
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 2;
	for (unsigned i = 0; i < n_threads; i++)
		if (pthread_timedjoin_np(fc->threads[i], NULL, &deadline) != 0) {
			pthread_detach(fc->threads[i]);
			stuck = true;
		}
	if (stuck) {
		log_warning("%u descriptor(s) from clients still closing; left to mrd's exit",
			    fd_closer_waiting(fc, (uid_t)-1));
		abandoned = fc;
		return NULL;
	}
	free(fc->queue);
	pthread_cond_destroy(&fc->wake);
	pthread_mutex_destroy(&fc->lock);
	free(fc);
	return NULL;
}

bool fd_closer_quick(int fd)
{
	/* F_GET_SEALS answers for shmem and hugetlbfs files only, asking no filesystem: those
	 * have nothing to flush and no one to wait for. */
	return fcntl(fd, F_GET_SEALS) >= 0;
}

void fd_closer_consume(struct fd_closer *fc, int fd, uid_t uid)
{
	if (fd < 0)
		return;
	if (fd_closer_quick(fd)) {
		close(fd);
		return;
	}
	pthread_mutex_lock(&fc->lock);
	if (queue_push(fc, fd, uid) < 0) {
		pthread_mutex_unlock(&fc->lock);
		log_warning("out of memory queueing a descriptor to close; closing it here");
		close(fd);
		return;
	}
	if (fc->n_idle > 0)
		pthread_cond_signal(&fc->wake);
	else if (fc->n_threads < FD_CLOSER_THREADS && !fc->stopping &&
		 pthread_create(&fc->threads[fc->n_threads], NULL, closer_main, fc) == 0)
		fc->n_threads++; /* else a busy thread takes it when it is done */
	pthread_mutex_unlock(&fc->lock);
}

void fd_closer_consume_packet(struct fd_closer *fc, struct wire_packet *pkt, uid_t uid)
{
	for (size_t i = 0; i < pkt->n_fds; i++)
		fd_closer_consume(fc, pkt->fds[i], uid);
	pkt->n_fds = 0;
}

unsigned fd_closer_waiting(struct fd_closer *fc, uid_t uid)
{
	unsigned n = 0;

	pthread_mutex_lock(&fc->lock);
	for (size_t i = 0; i < fc->n; i++)
		n += uid == (uid_t)-1 || fc->queue[(fc->head + i) % fc->cap].uid == uid;
	for (unsigned i = 0; i < FD_CLOSER_THREADS; i++)
		n += fc->busy[i].fd >= 0 && (uid == (uid_t)-1 || fc->busy[i].uid == uid);
	pthread_mutex_unlock(&fc->lock);
	return n;
}
