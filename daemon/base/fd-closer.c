/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/fd-closer.h"
#include "log.h"
#include "macro.h"
#include "time-util.h"
#include "base/worker-pool.h"

/* Bounds on emptying one Unix socket that is shut down: reads, bytes read, pending
 * connections. A socket holds at most its receive buffer once nothing more can come in, so
 * these only keep a kernel that differs from costing a thread for long. */
#define DRAIN_READS_MAX 4096u
#define DRAIN_BYTES_MAX (16u << 20)
#define ACCEPT_MAX 4096u

/* One uid's descriptors to close, in the order they came. */
struct lane {
	uid_t uid;
	int *fds; /* a ring: n from head */
	size_t head, n, cap;
	bool busy; /* a thread is in one of its close()s */
	LIST_ENTRY(lane) link;          /* every lane with something waiting or busy */
	TAILQ_ENTRY(lane) ready_link;   /* in ready while n > 0 and !busy */
};

struct fd_closer {
	pthread_mutex_t lock;
	pthread_cond_t wake, idle; /* idle: a close ended (quiesce waits for it) */
	LIST_HEAD(, lane) lanes;
	TAILQ_HEAD(, lane) ready; /* served from the head, back at the tail: in turn */
	unsigned total;           /* queued and in a close(), every lane */
	pthread_t threads[FD_CLOSER_THREADS];
	unsigned n_threads, n_idle;
	bool stopping;
};

/* What fd_closer_free could not wait for: threads still use it until the process exits. */
static struct fd_closer *abandoned;

static struct lane *lane_find(struct fd_closer *fc, uid_t uid)
{
	struct lane *l;

	LIST_FOREACH(l, &fc->lanes, link)
		if (l->uid == uid)
			return l;
	return NULL;
}

static unsigned lane_waiting(const struct lane *l)
{
	return (unsigned)l->n + l->busy;
}

static int lane_push(struct lane *l, int fd)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		int *q = malloc(cap * sizeof(*q));

		if (!q)
			return -ENOMEM;
		for (size_t i = 0; i < l->n; i++)
			q[i] = l->fds[(l->head + i) % l->cap];
		free(l->fds);
		l->fds = q;
		l->head = 0;
		l->cap = cap;
	}
	l->fds[(l->head + l->n) % l->cap] = fd;
	l->n++;
	return 0;
}

static int lane_pop(struct lane *l)
{
	int fd = l->fds[l->head];

	l->head = (l->head + 1) % l->cap;
	l->n--;
	return fd;
}

/* After a change to l: in ready when it has work and no thread, gone when it has neither. */
static void lane_settle(struct fd_closer *fc, struct lane *l, bool in_ready)
{
	bool want = l->n > 0 && !l->busy;

	if (want && !in_ready)
		TAILQ_INSERT_TAIL(&fc->ready, l, ready_link);
	else if (!want && in_ready)
		TAILQ_REMOVE(&fc->ready, l, ready_link);
	if (lane_waiting(l) == 0) {
		LIST_REMOVE(l, link);
		free(l->fds);
		free(l);
	}
}

/* Whether uid may have one more descriptor taken out of a socket it sent (closers only). */
static bool lane_has_room(struct fd_closer *fc, uid_t uid)
{
	struct lane *l;
	bool room;

	pthread_mutex_lock(&fc->lock);
	l = lane_find(fc, uid);
	room = !l || lane_waiting(l) < FD_CLOSER_UID_MAX;
	pthread_mutex_unlock(&fc->lock);
	return room;
}

/* Pulls out what an AF_UNIX socket holds (pending connections, descriptors in flight), which
 * its close() would release on this thread as they are: each is queued in uid's lane like any
 * other, so that it is defused too — while the lane has room; past that the close releases the
 * rest here, on uid's own lane. */
static void take_in_flight(struct fd_closer *fc, int fd, uid_t uid)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(struct ucred)) +
			 CMSG_SPACE(sizeof(int) * WIRE_RECV_FDS_MAX)];
	} control;
	int listening = 0, type = 0, one = 1;
	socklen_t len = sizeof(listening), tlen = sizeof(type);
	uint8_t buf[4096];
	size_t bytes = 0;

	/* Nothing more comes in: the peer's sends and connects fail from now on. */
	(void)shutdown(fd, SHUT_RDWR);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening) {
		/* Connections not yet accepted hold what their clients sent. */
		for (unsigned i = 0; i < ACCEPT_MAX && lane_has_room(fc, uid); i++) {
			int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

			if (c < 0)
				break;
			fd_closer_consume(fc, c, uid);
		}
		return;
	}
	/* A stream socket at its end reads 0; a packet socket reads 0 for an empty packet too,
	 * but with SO_PASSCRED every packet brings its sender's credentials and the end none.
	 * (A stream's end brings them as well: that one stops at 0.) */
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) < 0 ||
	    (type != SOCK_STREAM && setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0))
		return;
	for (unsigned i = 0; i < DRAIN_READS_MAX && bytes < DRAIN_BYTES_MAX; i++) {
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
				     .msg_controllen = sizeof(control.buf) };
		ssize_t n;

		if (!lane_has_room(fc, uid))
			break;
		n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || (n == 0 && (type == SOCK_STREAM || mh.msg_controllen == 0)))
			break;
		bytes += (size_t)n;
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

static void wake_closer(struct fd_closer *fc);

static void *closer_main(void *arg)
{
	struct fd_closer *fc = arg;

	thread_block_loop_signals();
	pthread_mutex_lock(&fc->lock);
	for (;;) {
		struct lane *l = TAILQ_FIRST(&fc->ready);
		uid_t uid;
		int fd;

		if (!l) {
			if (fc->stopping && fc->total == 0)
				break;
			fc->n_idle++;
			pthread_cond_wait(&fc->wake, &fc->lock);
			fc->n_idle--;
			continue;
		}
		fd = lane_pop(l);
		l->busy = true;
		lane_settle(fc, l, true); /* out of ready: one close of a lane at a time */
		uid = l->uid;
		/* Two lanes may have signalled one idle thread: another takes the next, or this
		 * close (which may never return) would leave it waiting. */
		if (!TAILQ_EMPTY(&fc->ready))
			wake_closer(fc);
		pthread_mutex_unlock(&fc->lock);
		defuse(fc, fd, uid);
		close(fd);
		pthread_mutex_lock(&fc->lock);
		l = lane_find(fc, uid); /* still there: busy kept it */
		l->busy = false;
		fc->total--;
		lane_settle(fc, l, false); /* back at the tail: the next lane goes first */
		pthread_cond_broadcast(&fc->idle);
		if (fc->stopping)
			pthread_cond_broadcast(&fc->wake); /* the last one lets the others go */
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
	pthread_cond_init(&fc->idle, NULL);
	LIST_INIT(&fc->lanes);
	TAILQ_INIT(&fc->ready);
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
	pthread_cond_destroy(&fc->idle);
	pthread_cond_destroy(&fc->wake);
	pthread_mutex_destroy(&fc->lock);
	free(fc);
	return NULL;
}

/* With fc->lock held: a thread for a lane that just became ready, if none is free. */
static void wake_closer(struct fd_closer *fc)
{
	if (fc->n_idle > 0)
		pthread_cond_signal(&fc->wake);
	else if (fc->n_threads < FD_CLOSER_THREADS && !fc->stopping &&
		 pthread_create(&fc->threads[fc->n_threads], NULL, closer_main, fc) == 0)
		fc->n_threads++; /* else a busy thread takes it when it is done */
}

void fd_closer_consume(struct fd_closer *fc, int fd, uid_t uid)
{
	struct lane *l;
	bool in_ready;

	if (fd < 0)
		return;
	pthread_mutex_lock(&fc->lock);
	l = lane_find(fc, uid);
	if (!l) {
		l = calloc(1, sizeof(*l));
		if (l) {
			l->uid = uid;
			LIST_INSERT_HEAD(&fc->lanes, l, link);
		}
	}
	if (!l || lane_push(l, fd) < 0) {
		if (l)
			lane_settle(fc, l, l->n > 0 && !l->busy);
		pthread_mutex_unlock(&fc->lock);
		log_warning("out of memory queueing a descriptor to close; closing it here");
		close(fd);
		return;
	}
	fc->total++;
	in_ready = l->n > 1 && !l->busy; /* it was ready already */
	lane_settle(fc, l, in_ready);
	if (!in_ready && !l->busy)
		wake_closer(fc);
	pthread_mutex_unlock(&fc->lock);
}

void fd_closer_consume_socket(struct fd_closer *fc, int fd, uid_t uid)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(struct ucred))];
	} control;
	int one = 1;
	uint8_t byte;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = sizeof(control.buf) };

	if (fd < 0)
		return;
	/* Nothing comes in once it is shut down; with SO_PASSCRED any packet queued, empty
	 * ones too, reads with credentials, and the end with none. A peek takes nothing out
	 * (descriptors in flight stay where they are). */
	(void)shutdown(fd, SHUT_RDWR);
	if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) == 0 &&
	    recvmsg(fd, &mh, MSG_PEEK | MSG_DONTWAIT) == 0 && mh.msg_controllen == 0) {
		close(fd);
		return;
	}
	fd_closer_consume(fc, fd, uid);
}

void fd_closer_consume_packet(struct fd_closer *fc, struct wire_packet *pkt, uid_t uid)
{
	for (size_t i = 0; i < pkt->n_fds; i++)
		fd_closer_consume(fc, pkt->fds[i], uid);
	pkt->n_fds = 0;
}

unsigned fd_closer_waiting(struct fd_closer *fc, uid_t uid)
{
	struct lane *l;
	unsigned n;

	pthread_mutex_lock(&fc->lock);
	if (uid == (uid_t)-1)
		n = fc->total;
	else
		n = (l = lane_find(fc, uid)) ? lane_waiting(l) : 0;
	pthread_mutex_unlock(&fc->lock);
	return n;
}

bool fd_closer_lane_full(struct fd_closer *fc, uid_t uid)
{
	return fd_closer_waiting(fc, uid) >= FD_CLOSER_UID_MAX;
}

int fd_closer_quiesce(struct fd_closer *fc, uint64_t timeout_usec, uid_t *ret_uid,
		      unsigned *ret_waiting)
{
	struct timespec deadline;
	int r = 0;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += (time_t)(timeout_usec / USEC_PER_SEC);
	deadline.tv_nsec += (long)(timeout_usec % USEC_PER_SEC) * 1000;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&fc->lock);
	while (fc->total > 0 && r == 0)
		r = -pthread_cond_timedwait(&fc->idle, &fc->lock, &deadline);
	if (fc->total > 0) {
		struct lane *l = LIST_FIRST(&fc->lanes), *i;

		LIST_FOREACH(i, &fc->lanes, link) /* the one most behind */
			if (lane_waiting(i) > lane_waiting(l))
				l = i;
		*ret_uid = l->uid;
		*ret_waiting = lane_waiting(l);
		r = -EBUSY;
	} else
		r = 0;
	pthread_mutex_unlock(&fc->lock);
	return r;
}
