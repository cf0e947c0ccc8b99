/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include "connection.h"
#include "macro.h"

const char *conn_socket_path(const char *path)
{
	const char *env;

	if (path && *path)
		return path;
	env = getenv("MRD_SOCKET");
	if (env && *env)
		return env;
	return MRD_SOCKET_DEFAULT;
}

struct conn *conn_free(struct conn *c)
{
	if (!c)
		return NULL;
	safe_close(c->fd);
	free(c->buf);
	free(c);
	return NULL;
}

static int conn_recv_response(struct conn *c, uint64_t id, Mrd__Response **ret,
			      struct conn_fds *ret_fds)
{
	for (;;) {
		struct wire_packet pkt;
		Mrd__Response *resp;
		int r;

		/* Blocking, bounded by SO_RCVTIMEO: no poll() per call on the lookup-miss path. */
		r = wire_recv(c->fd, c->buf, c->buf_size, &pkt, 0);
		if (r == -EAGAIN)
			return -ETIMEDOUT;
		/* A peer that closed with our request unread reports ECONNRESET once, ahead of
		 * what it queued before closing (a refused connection's reason): look again. */
		if (r == -ECONNRESET)
			r = wire_recv(c->fd, c->buf, c->buf_size, &pkt, MSG_DONTWAIT);
		if (r == -EAGAIN || r == -ECONNRESET)
			return -ECONNRESET;
		if (r < 0)
			return r;
		if (r == 0)
			return -ECONNRESET;
		if (pkt.truncated) {
			wire_packet_close_fds(&pkt);
			return -EMSGSIZE;
		}
		resp = mrd__response__unpack(NULL, pkt.len, pkt.data);
		if (!resp) {
			wire_packet_close_fds(&pkt);
			return -EBADMSG;
		}
		/* id 0 is a reply to a frame mrd could not read, or a refused connection. */
		if (resp->id == id || (resp->id == 0 && resp->status != 0)) {
			if (ret_fds) {
				memcpy(ret_fds->fds, pkt.fds, pkt.n_fds * sizeof(int));
				ret_fds->n = pkt.n_fds;
			} else
				wire_packet_close_fds(&pkt);
			*ret = resp;
			return 0;
		}
		wire_packet_close_fds(&pkt);
		mrd__response__free_unpacked(resp, NULL); /* late reply to an abandoned call */
	}
}

int conn_call(struct conn *c, Mrd__Request *req, Mrd__Response **ret, struct conn_fds *ret_fds)
{
	return conn_call_with_fds(c, req, NULL, 0, ret, ret_fds);
}

int conn_call_with_fds(struct conn *c, Mrd__Request *req, const int *fds, size_t n_fds,
		       Mrd__Response **ret, struct conn_fds *ret_fds)
{
	int r;

	if (ret_fds)
		ret_fds->n = 0;
	if (c->broken)
		return -ECONNRESET;
	req->id = ++c->next_id;
	r = wire_send(c->fd, &req->base, WIRE_FRAME_MAX, fds, n_fds, 0);
	/* A peer that hung up may have left its reason queued (a refused connection): read it. */
	if (r < 0 && r != -EPIPE && r != -ECONNRESET)
		return r;
	r = conn_recv_response(c, req->id, ret, ret_fds);
	if (r == -ECONNRESET)
		c->broken = true; /* a SEQPACKET peer that hung up never comes back */
	return r;
}

static _printf_(3, 4) void set_error(char *error, size_t size, const char *fmt, ...)
{
	va_list ap;

	if (!error || !size)
		return;
	va_start(ap, fmt);
	vsnprintf(error, size, fmt, ap);
	va_end(ap);
}

int conn_open(const char *path, const char *client_name, uint64_t capabilities, struct conn **ret,
	      char *error, size_t error_size)
{
	_cleanup_(conn_freep) struct conn *c = NULL;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest hello = MRD__HELLO_REQUEST__INIT;
	Mrd__Response *resp = NULL;
	int r;

	path = conn_socket_path(path);
	if (strlen(path) >= sizeof(sa.sun_path)) {
		set_error(error, error_size, "socket path too long: %s", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	snprintf(c->path, sizeof(c->path), "%s", path);
	c->buf_size = WIRE_FRAME_MAX;
	c->buf = malloc(c->buf_size);
	if (!c->buf)
		return -ENOMEM;
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return negative_errno();
	{
		struct timeval tv = { .tv_sec = CONN_TIMEOUT_MS / 1000 };

		if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
			return negative_errno();
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = negative_errno();
		set_error(error, error_size, "cannot connect to %s: %s (is mrd running?)", path,
			  strerror(-r));
		return r;
	}

	hello.min_version = MRD_PROTOCOL_VERSION_MIN;
	hello.max_version = MRD_PROTOCOL_VERSION_MAX;
	hello.capabilities = capabilities;
	hello.client_name = (char *)(client_name ? client_name : "");
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = conn_call(c, &req, &resp, NULL);
	if (r < 0) {
		set_error(error, error_size, "%s: no answer to Hello: %s", path, strerror(-r));
		return r;
	}
	r = response_error(resp);
	if (r < 0)
		set_error(error, error_size, "%s refused the connection: %s", path,
			  resp->message && *resp->message ? resp->message : strerror(-r));
	else if (resp->body_case != MRD__RESPONSE__BODY_HELLO) {
		set_error(error, error_size, "%s: malformed Hello reply", path);
		r = -EBADMSG;
	} else {
		c->version = resp->hello->version;
		c->capabilities = resp->hello->capabilities;
		c->admin = resp->hello->admin;
		snprintf(c->server_version, sizeof(c->server_version), "%s",
			 resp->hello->server_version ? resp->hello->server_version : "");
	}
	mrd__response__free_unpacked(resp, NULL);
	if (r < 0)
		return r;

	*ret = TAKE_PTR(c);
	return 0;
}
