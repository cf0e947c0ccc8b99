/* SPDX-License-Identifier: MIT */
/* libmrd's connection (client/connection.c) against a fake mrd that answers Pings as a test
 * sets it: late, or with descriptors. What a peer or the caller's process can do to it: too
 * many descriptors in a reply, a fork() child that reuses descriptor numbers, a thread
 * cancelled while it waits, a reply handed over while its waiter read. */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <semaphore.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check-run.h"
#include "connection.h"
#include "mrd.pb-c.h"

static struct {
	int listen_fd;
	char path[108];
	unsigned reply_delay_us; /* each reply but Hello's */
	unsigned reply_fds;      /* descriptors (copies of stdin) with each Ping's reply */
	bool defer_first;        /* the first Ping is answered by fake_answer_deferred() */
	uint64_t deferred_id;
	int conn_fd;
	pthread_t thread;
} fake;

static void fake_reply(int fd, uint64_t id, bool hello)
{
	Mrd__Response resp = MRD__RESPONSE__INIT;
	Mrd__HelloResponse h = MRD__HELLO_RESPONSE__INIT;
	Mrd__PingResponse p = MRD__PING_RESPONSE__INIT;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 64)];
	} control;
	uint8_t buf[256];
	struct iovec iov = { .iov_base = buf };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	int fds[64] = { 0 };

	resp.id = id;
	if (hello) {
		h.version = MRD_PROTOCOL_VERSION_MAX;
		h.server_version = (char *)"fake";
		resp.body_case = MRD__RESPONSE__BODY_HELLO;
		resp.hello = &h;
	} else {
		resp.body_case = MRD__RESPONSE__BODY_PING;
		resp.ping = &p;
		usleep(fake.reply_delay_us);
	}
	iov.iov_len = mrd__response__pack(&resp, buf);
	if (!hello && fake.reply_fds) {
		struct cmsghdr *cm;

		mh.msg_control = control.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * fake.reply_fds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * fake.reply_fds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * fake.reply_fds);
	}
	ck_assert_int_ge(sendmsg(fd, &mh, MSG_NOSIGNAL), 0);
}

static void *fake_serve(void *arg)
{
	int fd = accept(fake.listen_fd, NULL, NULL);
	uint8_t buf[4096];
	ssize_t n;

	(void)arg;
	fake.conn_fd = fd;
	while (fd >= 0 && (n = recv(fd, buf, sizeof(buf), 0)) > 0) {
		Mrd__Request *req = mrd__request__unpack(NULL, (size_t)n, buf);
		bool hello;

		ck_assert_ptr_nonnull(req);
		hello = req->body_case == MRD__REQUEST__BODY_HELLO;
		if (!hello && fake.defer_first && !fake.deferred_id)
			fake.deferred_id = req->id;
		else
			fake_reply(fd, req->id, hello);
		mrd__request__free_unpacked(req, NULL);
	}
	if (fd >= 0)
		close(fd);
	return NULL;
}

static void fake_answer_deferred(void)
{
	fake_reply(fake.conn_fd, fake.deferred_id, false);
}

/* A fake mrd (one connection) and a connection to it. */
static struct conn *fake_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct conn *c = NULL;
	char error[256] = "";

	snprintf(fake.path, sizeof(fake.path), "/tmp/mrd-fake.%d.sock", (int)getpid());
	unlink(fake.path);
	strcpy(sa.sun_path, fake.path);
	fake.listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fake.listen_fd, 0);
	ck_assert_int_eq(bind(fake.listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fake.listen_fd, 1), 0);
	ck_assert_int_eq(pthread_create(&fake.thread, NULL, fake_serve, NULL), 0);
	ck_assert_msg(conn_open(fake.path, "test-connection", 0, &c, error, sizeof(error)) == 0,
		      "%s", error);
	return c;
}

static void fake_done(struct conn *c)
{
	conn_free(c);
	pthread_join(fake.thread, NULL);
	close(fake.listen_fd);
	unlink(fake.path);
}

/* recvmsg() as libmrd calls it, held where a test says: a thread that waits in recv() stalls
 * there until another thread's read without waiting lets it go, and that read is held until
 * the stalled one has read. */
static struct {
	int armed; /* 1: the stalling thread's recv() stalls; 2: then the other's read lets it go */
	sem_t go, read;
	pthread_t stalled;
} hold;

ssize_t recvmsg(int fd, struct msghdr *mh, int flags)
{
	static ssize_t (*real)(int, struct msghdr *, int);
	bool stall = false;
	ssize_t n;

	if (!real)
		real = (ssize_t(*)(int, struct msghdr *, int))dlsym(RTLD_NEXT, "recvmsg");
	if (__atomic_load_n(&hold.armed, __ATOMIC_ACQUIRE) && !(flags & MSG_DONTWAIT) &&
	    pthread_equal(pthread_self(), hold.stalled)) {
		sem_wait(&hold.go);
		stall = true;
	} else if (__atomic_load_n(&hold.armed, __ATOMIC_ACQUIRE) == 2 && (flags & MSG_DONTWAIT)) {
		__atomic_store_n(&hold.armed, 0, __ATOMIC_RELEASE);
		sem_post(&hold.go);
		sem_wait(&hold.read);
	}
	n = real(fd, mh, flags);
	if (stall)
		sem_post(&hold.read);
	return n;
}

static int ping(struct conn *c, struct conn_fds *fds)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest p = MRD__PING_REQUEST__INIT;
	Mrd__Response *resp = NULL;
	int r;

	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &p;
	r = conn_call(c, &req, &resp, fds);
	if (r == 0)
		mrd__response__free_unpacked(resp, NULL);
	return r;
}

/* The open descriptors, but a thread's eventfd: libmrd makes it at the thread's first wait
 * for a reply (a reply late on a busy host) and keeps it until the thread exits. */
static unsigned open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	char path[300], target[64];
	struct dirent *e;
	unsigned n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d))) {
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, target, sizeof(target) - 1);
		if (len > 0 && (target[len] = '\0', strstr(target, "eventfd")))
			continue;
		n++;
	}
	closedir(d);
	return n;
}

/* A reply may carry WIRE_FDS_MAX descriptors, which is what a caller's conn_fds holds: one
 * with more is refused and its descriptors closed (copied, they overran the caller's stack). */
START_TEST(test_reply_with_too_many_fds_refused)
{
	struct conn *c = fake_connect();
	struct conn_fds fds;
	unsigned before = open_fds();

	fake.reply_fds = WIRE_FDS_MAX;
	ck_assert_int_eq(ping(c, &fds), 0);
	ck_assert_uint_eq(fds.n, WIRE_FDS_MAX);
	for (size_t i = 0; i < fds.n; i++)
		close(fds.fds[i]);
	fake.reply_fds = WIRE_FDS_MAX + 4;
	fake.reply_delay_us = 30000; /* past the first recv(), as a busy host makes it */
	ck_assert_int_eq(ping(c, &fds), -EMSGSIZE);
	fake.reply_delay_us = 0;
	ck_assert_uint_eq(fds.n, 0);
	ck_assert_uint_eq(open_fds(), before);
	fake_done(c);
}
END_TEST

/* The descriptor of this thread's eventfd, as /proc/self/fd names it; -1 when none. */
static int thread_eventfd(void)
{
	char path[64], target[128];

	for (int fd = 3; fd < 1024; fd++) {
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = readlink(path, target, sizeof(target) - 1);
		if (n > 0 && (target[n] = '\0', strstr(target, "eventfd")))
			return fd;
	}
	return -1;
}

/* A fork() child that closes what it inherited and opens a file under the number of its
 * parent's thread eventfd keeps that file through its own calls (libmrd closed that number,
 * taking it for its parent's eventfd copy). */
START_TEST(test_fork_child_keeps_its_descriptors)
{
	struct conn *c = fake_connect();
	int status, efd;
	pid_t pid;

	fake.reply_delay_us = 30000; /* past the first recv(): the thread makes its eventfd */
	ck_assert_int_eq(ping(c, NULL), 0);
	efd = thread_eventfd();
	ck_assert_int_ge(efd, 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct conn *child;
		int p[2], ok;

		for (int fd = 3; fd < 1024; fd++)
			close(fd);
		if (pipe(p) < 0 || (p[1] != efd && (dup2(p[1], efd) < 0 || close(p[1]) < 0)))
			_exit(2);
		child = fake_connect();
		ok = ping(child, NULL) == 0 && write(efd, "x", 1) == 1;
		_exit(ok ? 0 : 1);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the child lost the pipe it opened as descriptor %d (status 0x%x)", efd, status);
	fake_done(c);
}
END_TEST

static void *ping_thread(void *arg)
{
	(void)ping(arg, NULL);
	return NULL;
}

/* A thread cancelled while it waits: its call runs to its end, so that nothing of its stack
 * stays among the connection's waiters. */
START_TEST(test_cancelled_waiter_leaves_nothing)
{
	struct conn *c = fake_connect();
	pthread_t t;

	fake.reply_delay_us = 200000;
	ck_assert_int_eq(pthread_create(&t, NULL, ping_thread, c), 0);
	usleep(50000);
	ck_assert_int_eq(pthread_cancel(t), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	pthread_mutex_lock(&c->lock);
	ck_assert_ptr_null(c->waiters);
	ck_assert_ptr_null(c->blocking);
	ck_assert(!c->reading);
	pthread_mutex_unlock(&c->lock);
	fake.reply_delay_us = 0;
	ck_assert_int_eq(ping(c, NULL), 0);
	fake_done(c);
}
END_TEST

struct pinger {
	struct conn *c;
	int r;
};

static void *pinger_run(void *arg)
{
	struct pinger *p = arg;

	p->r = ping(p->c, NULL);
	return NULL;
}

static void *stalling_pinger_run(void *arg)
{
	hold.stalled = pthread_self(); /* before its first recvmsg() */
	return pinger_run(arg);
}

/* Thread A sleeps in recv() and stalls there (25 ms and more: the others read then). Thread B
 * calls; while its own read without waiting finds nothing, A takes B's reply and hands it
 * over. B sees that before it sleeps (it slept to its 30 s deadline: no eventfd was set to
 * wake it). A's own reply is held back by the fake mrd till then. */
START_TEST(test_reply_handed_over_while_reading_is_seen)
{
	struct conn *c = fake_connect();
	struct pinger a = { .c = c }, b = { .c = c };
	struct timespec until;
	pthread_t ta, tb;
	int joined;

	ck_assert_int_eq(sem_init(&hold.go, 0, 0), 0);
	ck_assert_int_eq(sem_init(&hold.read, 0, 0), 0);
	fake.defer_first = true;
	__atomic_store_n(&hold.armed, 1, __ATOMIC_RELEASE);
	ck_assert_int_eq(pthread_create(&ta, NULL, stalling_pinger_run, &a), 0);
	usleep(2 * CONN_STALLED_NS / 1000); /* not asserted: A is in recv() by then */
	__atomic_store_n(&hold.armed, 2, __ATOMIC_RELEASE);
	ck_assert_int_eq(pthread_create(&tb, NULL, pinger_run, &b), 0);
	/* Bounded only so that a failure is reported rather than waited for: nothing is timed. */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	joined = pthread_timedjoin_np(tb, NULL, &until);
	fake_answer_deferred();
	if (joined != 0)
		pthread_join(tb, NULL);
	pthread_join(ta, NULL);
	ck_assert_msg(joined == 0, "B's reply, handed over while B read, waited for its deadline");
	ck_assert_int_eq(b.r, 0);
	ck_assert_int_eq(a.r, 0);
	fake_done(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("connection");
	TCase *tc = tcase_create("connection");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_reply_with_too_many_fds_refused);
	tcase_add_test(tc, test_fork_child_keeps_its_descriptors);
	tcase_add_test(tc, test_cancelled_waiter_leaves_nothing);
	tcase_add_test(tc, test_reply_handed_over_while_reading_is_seen);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
