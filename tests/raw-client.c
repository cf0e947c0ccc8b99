/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include <mrd/mrd.h>

#include "raw-client.h"
#include "wire.h"

int raw_send(int fd, Mrd__Request *req, const int *fds, size_t n_fds)
{
	return wire_send(fd, &req->base, WIRE_FRAME_MAX, fds, n_fds, MSG_NOSIGNAL);
}

/* The next reply within timeout_ms: 0 and *ret, or -ETIMEDOUT, -1 (the stream's end),
 * -EBADMSG. */
static int next_response(int fd, int timeout_ms, Mrd__Response **ret)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct wire_packet pkt;

	if (poll(&p, 1, timeout_ms) != 1)
		return -ETIMEDOUT;
	if (wire_recv(fd, buf, sizeof(buf), &pkt, 0) <= 0)
		return -1;
	wire_packet_close_fds(&pkt);
	*ret = mrd__response__unpack(NULL, pkt.len, pkt.data);
	return *ret ? 0 : -EBADMSG;
}

int raw_reply_within(int fd, int timeout_ms)
{
	Mrd__Response *resp;
	int status = next_response(fd, timeout_ms, &resp);

	if (status < 0)
		return status;
	status = (int)resp->status;
	mrd__response__free_unpacked(resp, NULL);
	return status;
}

Mrd__Response *raw_response_within(int fd, int timeout_ms)
{
	Mrd__Response *resp = NULL;

	return next_response(fd, timeout_ms, &resp) == 0 ? resp : NULL;
}

int raw_send_hello(int fd, const char *name)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest h = MRD__HELLO_REQUEST__INIT;

	h.min_version = h.max_version = MRD_PROTOCOL_VERSION_MAX;
	h.capabilities = MRD_CAPS_SERVED;
	h.client_name = (char *)name;
	req.id = 1;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &h;
	return raw_send(fd, &req, NULL, 0);
}

int raw_send_ping(int fd, uint64_t id, const int *fds, size_t n_fds, size_t payload)
{
	static uint8_t bytes[60 * 1024];
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest p = MRD__PING_REQUEST__INIT;

	p.payload.data = bytes;
	p.payload.len = payload < sizeof(bytes) ? payload : sizeof(bytes);
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &p;
	return raw_send(fd, &req, fds, n_fds);
}

int raw_send_refs(int fd, const int *refs, size_t n)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * WIRE_RECV_FDS_MAX)];
	} control;
	struct iovec iov = { .iov_base = (void *)"x", .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = CMSG_SPACE(sizeof(int) * n) };
	struct cmsghdr *cmsg;

	if (n == 0 || n > WIRE_RECV_FDS_MAX)
		return -EINVAL;
	memset(&control, 0, sizeof(control));
	cmsg = CMSG_FIRSTHDR(&mh);
	cmsg->cmsg_level = SOL_SOCKET;
	cmsg->cmsg_type = SCM_RIGHTS;
	cmsg->cmsg_len = CMSG_LEN(sizeof(int) * n);
	memcpy(CMSG_DATA(cmsg), refs, sizeof(int) * n);
	return sendmsg(fd, &mh, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}
