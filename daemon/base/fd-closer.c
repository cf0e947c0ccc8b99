/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"
#include "time-util.h"
#include "base/fd-closer.h"
#include "base/worker-pool.h"

/* Bounds on emptying one Unix socket that is shut down: reads, bytes read, pending
 * connections. A socket holds at most its receive buffer once nothing more can come in, so
 * these only keep a kernel that differs from costing a thread for long. */
#define DRAIN_READS_MAX 4096u
#define DRAIN_BYTES_MAX (16u << 20)
#define ACCEPT_MAX 4096u

/* A closer's stack: it holds one read buffer; a thread stuck in close() keeps it. */
#define CLOSER_STACK_BYTES (256u << 10)

/* Lanes are keyed by uid; mrd's own memory has a key no uid has. */
#define OWN_KEY ((uint64_t)1 << 32)

/* One uid's descriptors to close, in the order they came. */
struct lane {
	uint64_t key;
	int *fds; /* a ring: n from head */
	size_t head, n, cap;
	bool busy; /* a thread is in one of its close()s, since busy_usec */
	uint64_t busy_usec;
	LIST_ENTRY(lane) link;          /* every lane with something waiting or busy */
	TAILQ_ENTRY(lane) ready_link;   /* in ready while n > 0 and !busy */
	bool in_ready;
};

struct fd_closer {
	pthread_mutex_t lock;
	pthread_cond_t wake, idle; /* idle: a close ended (quiesce waits for it) */
	pthread_cond_t watch;      /* the watcher: a lane is ready and no thread was idle */
	LIST_HEAD(, lane) lanes;
	TAILQ_HEAD(, lane) ready; /* served from the head, back at the tail: in turn */
	unsigned total;           /* queued and in a close(), every lane */
	uint64_t stuck_usec;
	pthread_t threads[FD_CLOSER_THREADS_MAX], watcher;
	unsigned n_threads, n_idle;
	bool stopping, has_watcher;
	uint64_t stuck_log_usec;
};

/* What fd_closer_free could not wait for: threads still use it until the process exits. */
static struct fd_closer *abandoned;

static struct lane *lane_find(struct fd_closer *fc, uint64_t key)
{
	struct lane *l;

	LIST_FOREACH(l, &fc->lanes, link)
		if (l->key == key)
			return l;
	return NULL;
}

static struct lane *lane_get(struct fd_closer *fc, uint64_t key)
{
	struct lane *l = lane_find(fc, key);

	if (!l) {
		l = calloc(1, sizeof(*l));
		if (!l)
			return NULL;
		l->key = key;
		LIST_INSERT_HEAD(&fc->lanes, l, link);
	}
	return l;
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
static void lane_settle(struct fd_closer *fc, struct lane *l)
{
	bool want = l->n > 0 && !l->busy;

	if (want && !l->in_ready)
		TAILQ_INSERT_TAIL(&fc->ready, l, ready_link);
	else if (!want && l->in_ready)
		TAILQ_REMOVE(&fc->ready, l, ready_link);
	l->in_ready = want;
	if (lane_waiting(l) == 0) {
		LIST_REMOVE(l, link);
		free(l->fds);
		free(l);
	}
}

/* Whether uid may have one more descriptor taken out of a socket it sent (closers only). */
static bool lane_has_room(struct fd_closer *fc, uint64_t key)
{
	struct lane *l;
	bool room;

	pthread_mutex_lock(&fc->lock);
	l = lane_find(fc, key);
	room = !l || lane_waiting(l) < FD_CLOSER_UID_MAX;
	pthread_mutex_unlock(&fc->lock);
	return room;
}

static void consume_key(struct fd_closer *fc, int fd, uint64_t key);

/* Pulls out what an AF_UNIX socket holds (pending connections, descriptors in flight), which
 * its close() would release on this thread as they are: each is queued in its lane like any
 * other, so that it is defused too — while the lane has room; past that the close releases the
 * rest here, on uid's own lane. */
static void take_in_flight(struct fd_closer *fc, int fd, uint64_t key)
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
		for (unsigned i = 0; i < ACCEPT_MAX && lane_has_room(fc, key); i++) {
			int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

			if (c < 0)
				break;
			consume_key(fc, c, key);
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

		if (!lane_has_room(fc, key))
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
				consume_key(fc, rfd, key);
			}
		}
	}
}

/* Makes fd's close() quick where the kernel allows: a socket drops what it could not send
 * (SO_LINGER {1, 0}: TCP resets instead of waiting out the linger time the client set), a
 * Unix socket gives up what it holds. getsockopt asks no filesystem, unlike fstat (FUSE). */
static void defuse(struct fd_closer *fc, int fd, uint64_t key)
{
	static const struct linger abort_on_close = { .l_onoff = 1, .l_linger = 0 };
	int domain;
	socklen_t len = sizeof(domain);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0)
		return; /* not a socket */
	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
	if (domain == AF_UNIX)
		take_in_flight(fc, fd, key);
}

static void *closer_main(void *arg);

/* With fc->lock held: closes running for longer than the stuck time (one per lane at most). */
static unsigned n_stuck(struct fd_closer *fc, uint64_t now, struct lane **ret_oldest)
{
	struct lane *l, *oldest = NULL;
	unsigned n = 0;

	LIST_FOREACH(l, &fc->lanes, link)
		if (l->busy && now - l->busy_usec >= fc->stuck_usec) {
			n++;
			if (!oldest || l->busy_usec < oldest->busy_usec)
				oldest = l;
		}
	if (ret_oldest)
		*ret_oldest = oldest;
	return n;
}

/* With fc->lock held: a thread for a lane that just became ready, if none is free; one more
 * past FD_CLOSER_THREADS for each close that is stuck. Otherwise the watcher looks again once
 * a running close may have become stuck. */
static void wake_closer(struct fd_closer *fc)
{
	struct lane *oldest;
	unsigned stuck;
	pthread_attr_t attr;
	int r;

	if (fc->n_idle > 0) {
		pthread_cond_signal(&fc->wake);
		return;
	}
	if (fc->stopping || fc->n_threads >= FD_CLOSER_THREADS_MAX)
		return;
	stuck = fc->n_threads < FD_CLOSER_THREADS ? 0 :
		n_stuck(fc, now_usec(CLOCK_MONOTONIC), &oldest);
	if (fc->n_threads - stuck >= FD_CLOSER_THREADS) {
		pthread_cond_signal(&fc->watch);
		return;
	}
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, CLOSER_STACK_BYTES);
	r = pthread_create(&fc->threads[fc->n_threads], &attr, closer_main, fc);
	pthread_attr_destroy(&attr);
	if (r != 0)
		return; /* a busy thread takes it when it is done */
	fc->n_threads++;
	if (stuck > 0 && now_usec(CLOCK_MONOTONIC) - fc->stuck_log_usec >= 10 * USEC_PER_SEC) {
		char who[32] = "mrd's memory";

		if (oldest->key != OWN_KEY)
			snprintf(who, sizeof(who), "uid %u", (unsigned)oldest->key);
		fc->stuck_log_usec = now_usec(CLOCK_MONOTONIC);
		log_warning("%u descriptor close(s) have not returned (the oldest of %s, for %llu "
			    "s): a FUSE file whose server does not answer? "
			    "/sys/fs/fuse/connections/*/abort ends it; %u closer threads now", stuck,
			    who, (unsigned long long)((fc->stuck_log_usec - oldest->busy_usec) /
						      USEC_PER_SEC), fc->n_threads);
	}
}

static void *closer_main(void *arg)
{
	struct fd_closer *fc = arg;

	thread_block_loop_signals();
	pthread_mutex_lock(&fc->lock);
	for (;;) {
		struct lane *l = TAILQ_FIRST(&fc->ready);
		uint64_t key;
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
		l->busy_usec = now_usec(CLOCK_MONOTONIC);
		lane_settle(fc, l); /* out of ready: one close of a lane at a time */
		key = l->key;
		/* Two lanes may have signalled one idle thread: another takes the next, or this
		 * close (which may never return) would leave it waiting. */
		if (!TAILQ_EMPTY(&fc->ready))
			wake_closer(fc);
		pthread_mutex_unlock(&fc->lock);
		defuse(fc, fd, key);
		close(fd);
		pthread_mutex_lock(&fc->lock);
		l = lane_find(fc, key); /* still there: busy kept it */
		l->busy = false;
		fc->total--;
		lane_settle(fc, l); /* back at the tail: the next lane goes first */
		pthread_cond_broadcast(&fc->idle);
		if (fc->stopping)
			pthread_cond_broadcast(&fc->wake); /* the last one lets the others go */
	}
	pthread_mutex_unlock(&fc->lock);
	return NULL;
}

/* While a lane is ready and every thread is busy, looks again each time a running close
 * may have become stuck: nothing else would (no descriptor may come to wake anyone). */
static void *watcher_main(void *arg)
{
	struct fd_closer *fc = arg;

	thread_block_loop_signals();
	pthread_mutex_lock(&fc->lock);
	while (!fc->stopping) {
		struct timespec at;
		uint64_t next = UINT64_MAX, now = now_usec(CLOCK_MONOTONIC);
		struct lane *l;

		if (TAILQ_EMPTY(&fc->ready) || fc->n_idle > 0) {
			pthread_cond_wait(&fc->watch, &fc->lock);
			continue;
		}
		wake_closer(fc);
		LIST_FOREACH(l, &fc->lanes, link) /* the next close to become stuck */
			if (l->busy && l->busy_usec + fc->stuck_usec > now &&
			    l->busy_usec + fc->stuck_usec < next)
				next = l->busy_usec + fc->stuck_usec;
		if (next == UINT64_MAX) {
			pthread_cond_wait(&fc->watch, &fc->lock); /* a close ends, or one comes */
			continue;
		}
		at = timespec_from_usec(next);
		(void)pthread_cond_timedwait(&fc->watch, &fc->lock, &at);
	}
	pthread_mutex_unlock(&fc->lock);
	return NULL;
}

int fd_closer_new(uint64_t stuck_usec, struct fd_closer **ret)
{
	struct fd_closer *fc = calloc(1, sizeof(*fc));
	pthread_condattr_t monotonic;
	int r;

	if (!fc)
		return -ENOMEM;
	pthread_mutex_init(&fc->lock, NULL);
	pthread_cond_init(&fc->wake, NULL);
	pthread_cond_init(&fc->idle, NULL);
	pthread_condattr_init(&monotonic);
	pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
	pthread_cond_init(&fc->watch, &monotonic);
	pthread_condattr_destroy(&monotonic);
	LIST_INIT(&fc->lanes);
	TAILQ_INIT(&fc->ready);
	fc->stuck_usec = stuck_usec;
	/* One thread from the start, so a queued descriptor always has one to close it. */
	r = -pthread_create(&fc->threads[0], NULL, closer_main, fc);
	if (r == 0) {
		fc->n_threads = 1;
		r = -pthread_create(&fc->watcher, NULL, watcher_main, fc);
		fc->has_watcher = r == 0;
	}
	if (r < 0) {
		fd_closer_free(fc);
		return r;
	}
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
	pthread_cond_signal(&fc->watch);
	n_threads = fc->n_threads;
	pthread_mutex_unlock(&fc->lock);
	if (fc->has_watcher)
		pthread_join(fc->watcher, NULL);
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 2;
	for (unsigned i = 0; i < n_threads; i++)
		if (pthread_timedjoin_np(fc->threads[i], NULL, &deadline) != 0) {
			pthread_detach(fc->threads[i]);
			stuck = true;
		}
	if (stuck) {
		log_warning("%u descriptor(s) from clients still closing; left to mrd's exit",
			    fc->total);
		abandoned = fc;
		return NULL;
	}
	pthread_cond_destroy(&fc->watch);
	pthread_cond_destroy(&fc->idle);
	pthread_cond_destroy(&fc->wake);
	pthread_mutex_destroy(&fc->lock);
	free(fc);
	return NULL;
}

static void consume_key(struct fd_closer *fc, int fd, uint64_t key)
{
	struct lane *l;

	if (fd < 0)
		return;
	pthread_mutex_lock(&fc->lock);
	l = lane_get(fc, key);
	if (!l || lane_push(l, fd) < 0) {
		if (l)
			lane_settle(fc, l);
		pthread_mutex_unlock(&fc->lock);
		log_warning("out of memory queueing a descriptor to close; closing it here");
		close(fd);
		return;
	}
	fc->total++;
	if (!l->in_ready && !l->busy) {
		lane_settle(fc, l);
		wake_closer(fc);
	}
	pthread_mutex_unlock(&fc->lock);
}

void fd_closer_consume(struct fd_closer *fc, int fd, uid_t uid)
{
	consume_key(fc, fd, uid);
}

void fd_closer_consume_own(struct fd_closer *fc, int fd)
{
	consume_key(fc, fd, OWN_KEY);
}

/* How many descriptors in flight a Unix socket's queue holds, as the kernel counts them
 * (`scm_fds:` in its fdinfo, Linux 5.7 on): one read, whatever the queue; -1 when it does not
 * say. */
static int queued_descriptors(int fd)
{
	char path[64], buf[512];
	const char *p;
	ssize_t n;
	int f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = open(path, O_RDONLY | O_CLOEXEC);
	if (f < 0)
		return -1;
	n = read(f, buf, sizeof(buf) - 1);
	close(f);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	p = strstr(buf, "scm_fds:");
	return p ? atoi(p + strlen("scm_fds:")) : -1;
}

void fd_closer_consume_socket(struct fd_closer *fc, int fd, uid_t uid)
{
	if (fd < 0)
		return;
	/* Nothing comes in once it is shut down (the kernel checks under the peer's lock). */
	(void)shutdown(fd, SHUT_RDWR);
	if (queued_descriptors(fd) == 0) {
		close(fd); /* frees what bytes it holds, releases no file */
		return;
	}
	consume_key(fc, fd, uid);
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
	n = (l = lane_find(fc, uid)) ? lane_waiting(l) : 0;
	pthread_mutex_unlock(&fc->lock);
	return n;
}

bool fd_closer_lane_full(struct fd_closer *fc, uid_t uid)
{
	return fd_closer_waiting(fc, uid) >= FD_CLOSER_UID_MAX;
}

int fd_closer_quiesce(struct fd_closer *fc, uint64_t timeout_usec, bool *ret_own,
		      uid_t *ret_uid, unsigned *ret_waiting)
{
	struct timespec deadline = timespec_from_usec(now_usec(CLOCK_REALTIME) + timeout_usec);
	int r = 0;

	pthread_mutex_lock(&fc->lock);
	while (fc->total > 0 && r == 0)
		r = -pthread_cond_timedwait(&fc->idle, &fc->lock, &deadline);
	if (fc->total > 0) {
		struct lane *l = LIST_FIRST(&fc->lanes), *i;

		LIST_FOREACH(i, &fc->lanes, link) /* the one most behind */
			if (lane_waiting(i) > lane_waiting(l))
				l = i;
		*ret_own = l->key == OWN_KEY;
		*ret_uid = (uid_t)l->key;
		*ret_waiting = lane_waiting(l);
		r = -EBUSY;
	} else
		r = 0;
	pthread_mutex_unlock(&fc->lock);
	return r;
}
