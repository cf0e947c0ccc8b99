/* SPDX-License-Identifier: MIT */
/* The descriptor closers in-process, against closes that never return (a FUSE file whose
 * server never answers FLUSH; tests/fuse-stall.h): many users' stuck closes leave the next
 * user's descriptors a thread, a user whose lane is full adds nothing to mrd's descriptor
 * table with sockets that hold bytes alone, and a lane that becomes ready while the only idle
 * thread is taken still gets one. Every wait is for an event (a pipe's read end closed,
 * a descriptor gone), bounded by TEST_WAIT_S. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/fd-closer.h"
#include "check-run.h"
#include "fuse-stall.h"
#include "test-util.h"
#include "time-util.h"

#define USERS_STUCK (FD_CLOSER_THREADS + 6)
#define LEFT_BEHIND 500u

static struct fuse_stall fuse;
static struct fd_closer *fc;
static int file = -1; /* the FUSE file: each close of a copy of it waits for the server */

static void setup(void)
{
	char why[128];
	struct rlimit rl = { 8192, 8192 };

	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	ck_assert_msg(fuse_stall_start(&fuse, why, sizeof(why)) == 0, "%s", why);
	file = open(fuse.file, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(file, 0);
	ck_assert_int_eq(fd_closer_new(3 * USEC_PER_SEC, &fc), 0);
}

static void teardown(void)
{
	/* The server goes first: the stuck closes return, and fd_closer_free joins every thread. */
	fuse_stall_stop(&fuse);
	fc = fd_closer_free(fc);
	if (file >= 0)
		close(file);
	file = -1;
}

/* A close of uid that does not return until the server goes. */
static void wedge(uid_t uid)
{
	int fd = fcntl(file, F_DUPFD_CLOEXEC, 3);

	ck_assert_int_ge(fd, 0);
	fd_closer_consume(fc, fd, uid);
}

/* uid's lane wedged and full: FD_CLOSER_UID_MAX descriptors wait. */
static void fill_lane(uid_t uid)
{
	wedge(uid);
	for (unsigned i = 1; i < FD_CLOSER_UID_MAX; i++)
		fd_closer_consume(fc, fcntl(file, F_DUPFD_CLOEXEC, 3), uid);
	ck_assert(fd_closer_lane_full(fc, uid));
}

static bool closed(int fd)
{
	return fcntl(fd, F_GETFD) < 0 && errno == EBADF;
}

/* Whether the read end of the pipe whose write end is w is closed everywhere. */
static bool reader_gone(int w)
{
	struct pollfd p = { .fd = w, .events = POLLOUT };

	return poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
}

/* A connection's socket as mrd holds it: the peer sent one packet (with a pipe's read end
 * when w is not NULL: *w gets its write end) and hung up. */
static int left_socket(int *w)
{
	int s[2], p[2];
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} control = { 0 };
	struct iovec iov = { .iov_base = (void *)"x", .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, s), 0);
	if (w) {
		struct cmsghdr *cmsg;

		ck_assert_int_eq(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
		mh.msg_control = control.buf;
		mh.msg_controllen = sizeof(control.buf);
		cmsg = CMSG_FIRSTHDR(&mh);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cmsg), &p[0], sizeof(int));
	}
	ck_assert_int_eq(sendmsg(s[1], &mh, MSG_NOSIGNAL), 1);
	close(s[1]);
	if (w) {
		close(p[0]);
		*w = p[1];
	}
	return s[0];
}

/* Users whose closes never return take a thread each; the closers grow past
 * FD_CLOSER_THREADS once those closes are stuck, so the next user's descriptor closes (once
 * it waited for ever behind 64 stuck users). */
START_TEST(test_stuck_users_leave_a_thread)
{
	int p[2];

	for (uid_t u = 0; u < USERS_STUCK; u++)
		wedge(2000 + u);
	ck_assert_int_eq(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
	fd_closer_consume(fc, p[0], 5000);
	test_wait_until(reader_gone(p[1]), 10000);
	ck_assert_msg(reader_gone(p[1]), "a user's descriptor waited behind %u stuck users",
		      USERS_STUCK);
	close(p[1]);
}
END_TEST

/* A user whose lane is full and stuck leaves sockets behind (each connection it makes and
 * drops): one that holds bytes alone closes at once, since its close releases no file, where
 * each once took one of mrd's descriptors for as long as the lane was stuck; one that holds a
 * descriptor waits in the lane (the kernel charges what it holds to its sender, whose
 * RLIMIT_NOFILE bounds them), and closes with what it holds once the lane drains. */
START_TEST(test_socket_holding_bytes_closes_at_once)
{
	unsigned base;
	int s, w;

	fill_lane(1000);
	base = count_open_fds(getpid());
	for (unsigned i = 0; i < LEFT_BEHIND; i++) {
		s = left_socket(NULL);
		fd_closer_consume_socket(fc, s, 1000);
		ck_assert_msg(closed(s), "a socket holding bytes alone waits in a full lane");
	}
	ck_assert_uint_eq(fd_closer_waiting(fc, 1000), FD_CLOSER_UID_MAX);
	ck_assert_uint_le(count_open_fds(getpid()), base);
	s = left_socket(&w);
	fd_closer_consume_socket(fc, s, 1000);
	ck_assert_uint_eq(fd_closer_waiting(fc, 1000), FD_CLOSER_UID_MAX + 1);
	ck_assert(!reader_gone(w));
	/* The server goes: the lane drains, and what the socket held closes with it. */
	fuse_stall_stop(&fuse);
	test_wait_until(fd_closer_waiting(fc, 1000) == 0, 10000);
	ck_assert_uint_eq(fd_closer_waiting(fc, 1000), 0);
	ck_assert_msg(reader_gone(w), "the socket's descriptor outlived it");
	close(w);
}
END_TEST

/* A lane that becomes ready while the one idle thread was signalled for another lane, whose
 * close then never returns: the thread that takes a lane wakes another for what is left
 * (once two lanes signalled one thread and the second waited for the first's close). No
 * close counts as stuck here, so no thread is added for that; each round leaves one more
 * thread stuck and one idle. */
START_TEST(test_two_lanes_one_idle_thread)
{
	fc = fd_closer_free(fc);
	ck_assert_int_eq(fd_closer_new(UINT64_MAX / 2, &fc), 0);
	for (uid_t u = 0; u < 20; u++) {
		int p[2];

		ck_assert_int_eq(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
		wedge(3000 + u);
		fd_closer_consume(fc, p[0], 4000 + u);
		test_wait_until(reader_gone(p[1]), 1000);
		ck_assert_msg(reader_gone(p[1]), "round %u: a ready lane found no thread", u);
		close(p[1]);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fd-closer");
	TCase *tc = tcase_create("fd-closer");
	struct fuse_stall probe = { 0 };
	char why[128];

	if (fuse_stall_start(&probe, why, sizeof(why)) < 0) {
		printf("SKIP: closes that never return need a FUSE mount: %s\n", why);
		return 77;
	}
	fuse_stall_stop(&probe);
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_stuck_users_leave_a_thread);
	tcase_add_test(tc, test_socket_holding_bytes_closes_at_once);
	tcase_add_test(tc, test_two_lanes_one_idle_thread);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
