/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "macro.h"
#include "wire.h"

int wire_pack(const ProtobufCMessage *msg, size_t max_frame, uint8_t **ret, size_t *ret_len)
{
	size_t size = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf;

	if (size > max_frame)
		return -EMSGSIZE;
	buf = malloc(size ? size : 1);
	if (!buf)
		return -ENOMEM;
	protobuf_c_message_pack(msg, buf);
	*ret = buf;
	*ret_len = size;
	return 0;
}

int wire_send_raw(int fd, const void *data, size_t len, const int *fds, size_t n_fds, int flags)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * WIRE_FDS_MAX)];
	} control;
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (n_fds > WIRE_FDS_MAX)
		return -EINVAL;
	if (n_fds > 0) {
		struct cmsghdr *cmsg;

		memset(&control, 0, sizeof(control));
		mh.msg_control = control.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
		cmsg = CMSG_FIRSTHDR(&mh);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
		memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * n_fds);
	}

	for (;;) {
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | flags);
		if (n >= 0)
			return (size_t)n == len ? 0 : -EMSGSIZE;
		if (errno != EINTR)
			return negative_errno();
	}
}

int wire_send(int fd, const ProtobufCMessage *msg, size_t max_frame, const int *fds, size_t n_fds,
	      int flags)
{
	_cleanup_free_ uint8_t *buf = NULL;
	size_t len;
	int r;

	r = wire_pack(msg, max_frame, &buf, &len);
	if (r < 0)
		return r;
	return wire_send_raw(fd, buf, len, fds, n_fds, flags);
}

int wire_recv(int fd, uint8_t *buf, size_t cap, struct wire_packet *pkt, int flags)
{
	/* Room for all a packet can carry: what does not fit the kernel would close here. */
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * WIRE_RECV_FDS_MAX)];
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control.buf,
		.msg_controllen = sizeof(control.buf),
	};
	ssize_t n;

	/* Not the whole packet: zeroing its unused descriptor slots, a kilobyte, cost a hot caller
	 * as much as the rest of its call. */
	pkt->data = NULL;
	pkt->len = 0;
	pkt->truncated = pkt->fds_truncated = false;
	pkt->n_fds = 0;
	for (;;) {
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_TRUNC | flags);
		if (n >= 0)
			break;
		if (errno != EINTR)
			return negative_errno();
	}

	for (struct cmsghdr *cmsg = CMSG_FIRSTHDR(&mh); cmsg; cmsg = CMSG_NXTHDR(&mh, cmsg)) {
		size_t count;

		if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
			continue;
		count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < count; i++) {
			int rfd;

			memcpy(&rfd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
			if (pkt->n_fds < WIRE_RECV_FDS_MAX)
				pkt->fds[pkt->n_fds++] = rfd;
			else { /* never: one packet carries no more */
				safe_close(rfd);
				pkt->fds_truncated = true;
			}
		}
	}
	if (mh.msg_flags & MSG_CTRUNC)
		pkt->fds_truncated = true;

	/* SOCK_SEQPACKET: a zero-length read is the peer's close. */
	if (n == 0 && pkt->n_fds == 0)
		return 0;

	pkt->data = buf;
	pkt->len = (size_t)n;
	pkt->truncated = (mh.msg_flags & MSG_TRUNC) || (size_t)n > cap;
	return 1;
}

void wire_packet_close_fds(struct wire_packet *pkt)
{
	for (size_t i = 0; i < pkt->n_fds; i++)
		safe_close(pkt->fds[i]);
	pkt->n_fds = 0;
}
