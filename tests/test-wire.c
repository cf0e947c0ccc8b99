/* SPDX-License-Identifier: MIT */
/* Framing: packets, descriptors, truncation and end of stream. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "macro.h"
#include "wire.h"
#include "check-run.h"

static int sv[2];

static void setup(void)
{
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void teardown(void)
{
	safe_close(sv[0]);
	safe_close(sv[1]);
}

START_TEST(test_roundtrip_with_fds)
{
	Mrd__Request req = MRD__REQUEST__INIT, *got;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	uint8_t buf[256];
	struct wire_packet pkt;
	int p[2], fds[3];

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	fds[0] = p[0];
	fds[1] = p[1];
	fds[2] = p[1];
	ping.payload.data = (uint8_t *)"xyz";
	ping.payload.len = 3;
	req.id = 42;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	ck_assert_int_eq(wire_send(sv[0], &req.base, WIRE_FRAME_MAX, fds, 3, 0), 0);

	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), &pkt, 0), 1);
	ck_assert(!pkt.truncated && !pkt.fds_truncated);
	ck_assert_uint_eq(pkt.n_fds, 3);
	for (size_t i = 0; i < pkt.n_fds; i++)
		ck_assert_int_eq(fcntl(pkt.fds[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	/* The received write end reaches the same pipe. */
	ck_assert_int_eq(write(pkt.fds[1], "!", 1), 1);
	ck_assert_int_eq(read(p[0], buf + 200, 1), 1);
	ck_assert_int_eq(buf[200], '!');

	got = mrd__request__unpack(NULL, pkt.len, pkt.data);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(got->id, 42);
	ck_assert_int_eq(got->body_case, MRD__REQUEST__BODY_PING);
	ck_assert_uint_eq(got->ping->payload.len, 3);
	mrd__request__free_unpacked(got, NULL);

	wire_packet_close_fds(&pkt);
	ck_assert_uint_eq(pkt.n_fds, 0);
	close(p[0]);
	close(p[1]);
}
END_TEST

START_TEST(test_truncated_packet)
{
	uint8_t big[300], buf[100];
	struct wire_packet pkt;

	memset(big, 'a', sizeof(big));
	ck_assert_int_eq(wire_send_raw(sv[0], big, sizeof(big), NULL, 0, 0), 0);
	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), &pkt, 0), 1);
	ck_assert(pkt.truncated);
	ck_assert_uint_eq(pkt.len, sizeof(big)); /* the real size, for the error message */

	/* The rest of the packet is gone; the next packet arrives whole. */
	ck_assert_int_eq(wire_send_raw(sv[0], "ok", 2, NULL, 0, 0), 0);
	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), &pkt, 0), 1);
	ck_assert(!pkt.truncated);
	ck_assert_uint_eq(pkt.len, 2);
}
END_TEST

START_TEST(test_too_many_fds)
{
	/* All one packet can carry, far more than mrd takes: every one is handed over (the
	 * caller refuses the excess and chooses how to close it), none dropped by the kernel,
	 * whose own release of what does not fit would run in the receiver's thread. */
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * WIRE_RECV_FDS_MAX)];
	} control;
	struct iovec iov = { .iov_base = (void *)"x", .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = sizeof(control.buf) };
	struct cmsghdr *cmsg;
	struct wire_packet pkt;
	uint8_t buf[16];
	int p[2], fds[WIRE_RECV_FDS_MAX];

	ck_assert_int_eq(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
	for (size_t i = 0; i < WIRE_RECV_FDS_MAX; i++)
		fds[i] = p[1];
	memset(&control, 0, sizeof(control));
	cmsg = CMSG_FIRSTHDR(&mh);
	cmsg->cmsg_level = SOL_SOCKET;
	cmsg->cmsg_type = SCM_RIGHTS;
	cmsg->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(cmsg), fds, sizeof(fds));
	ck_assert_int_eq(sendmsg(sv[0], &mh, 0), 1);
	close(p[1]);

	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), &pkt, 0), 1);
	ck_assert(!pkt.fds_truncated);
	ck_assert_uint_eq(pkt.n_fds, WIRE_RECV_FDS_MAX);
	/* Not one closed yet: the write end is still open here. */
	ck_assert_int_eq(read(p[0], buf, 1), -1);
	ck_assert_int_eq(errno, EAGAIN);
	wire_packet_close_fds(&pkt);
	ck_assert_int_eq(read(p[0], buf, 1), 0);
	close(p[0]);
}
END_TEST

START_TEST(test_end_of_stream)
{
	struct wire_packet pkt;
	uint8_t buf[16];

	sv[0] = safe_close(sv[0]);
	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), &pkt, 0), 0);
	ck_assert_int_eq(wire_send_raw(sv[1], "x", 1, NULL, 0, 0), -EPIPE);
}
END_TEST

START_TEST(test_nonblocking_empty)
{
	struct wire_packet pkt;
	uint8_t buf[16];

	ck_assert_int_eq(wire_recv(sv[1], buf, sizeof(buf), &pkt, MSG_DONTWAIT), -EAGAIN);
}
END_TEST

START_TEST(test_pack_limit)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	uint8_t payload[600] = { 0 }, *buf;
	size_t len;

	ping.payload.data = payload;
	ping.payload.len = sizeof(payload);
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	ck_assert_int_eq(wire_pack(&req.base, 512, &buf, &len), -EMSGSIZE);
	ck_assert_int_eq(wire_send(sv[0], &req.base, 512, NULL, 0, 0), -EMSGSIZE);
	ck_assert_int_eq(wire_pack(&req.base, 1024, &buf, &len), 0);
	ck_assert_uint_gt(len, 600);
	free(buf);
	ck_assert_int_eq(wire_send_raw(sv[0], "x", 1, NULL, WIRE_FDS_MAX + 1, 0), -EINVAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("wire");
	TCase *tc = tcase_create("framing");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_roundtrip_with_fds);
	tcase_add_test(tc, test_truncated_packet);
	tcase_add_test(tc, test_too_many_fds);
	tcase_add_test(tc, test_end_of_stream);
	tcase_add_test(tc, test_nonblocking_empty);
	tcase_add_test(tc, test_pack_limit);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
