/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "connection.h"
#include "envelope.h"
#include "macro.h"

#define CONN_STACK_FRAME 256 /* bytes of a request packed on the caller's stack */

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
	free(c->poll_buf);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->send_lock);
	free(c);
	return NULL;
}

/* A call sent and waiting for its reply, on its caller's stack. */
struct conn_waiter {
	struct conn_waiter *next; /* older: the list is newest first */
	uint64_t id;
	uint64_t since_ns; /* when it was sent */
	bool done;
	bool wants_read; /* found the socket being read: woken when the reader is through */
	bool leaving;    /* sleeps on its eventfd alone, the socket left to the newest waiter */
	int wake_fd;     /* its thread's eventfd while it sleeps in ppoll(), else -1 */
	int error;       /* a transport error instead of resp */
	Mrd__Response *resp;
	struct conn_fds *fds; /* NULL: the reply's descriptors are closed */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t earlier(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Whether w was sent less than CONN_FRESH_NS ago: its thread is likely running, or soon. */
static bool waiter_fresh(const struct conn_waiter *w, uint64_t now)
{
	return now - w->since_ns < CONN_FRESH_NS;
}

/* Each thread's eventfd, made at its first wait, closed when it exits. A fork() child's copy
 * is its parent's object: the child closes it at once and makes its own. */
static pthread_key_t wake_fd_key;
static pthread_once_t wake_fd_once = PTHREAD_ONCE_INIT;
static bool wake_fd_keyed;
static __thread int wake_fd = -1;

static void wake_fd_destroy(void *fd_plus_one)
{
	close((int)(intptr_t)fd_plus_one - 1);
}

/* In a fork() child, in the forking thread (its only one): the parent's eventfd copy goes
 * now, before the child can reuse its number. */
static void wake_fd_forked(void)
{
	if (wake_fd >= 0) {
		close(wake_fd);
		wake_fd = -1;
		(void)pthread_setspecific(wake_fd_key, NULL);
	}
}

static void wake_fd_key_create(void)
{
	wake_fd_keyed = pthread_key_create(&wake_fd_key, wake_fd_destroy) == 0 &&
			pthread_atfork(NULL, NULL, wake_fd_forked) == 0;
}

/* This thread's eventfd, or -1 when none can be made (its waits then poll in short steps). */
static int thread_wake_fd(void)
{
	if (wake_fd >= 0)
		return wake_fd;
	pthread_once(&wake_fd_once, wake_fd_key_create);
	if (!wake_fd_keyed)
		return -1;
	wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (wake_fd >= 0 && pthread_setspecific(wake_fd_key, (void *)(intptr_t)(wake_fd + 1)) != 0)
		wake_fd = safe_close(wake_fd);
	return wake_fd;
}

static void waiter_wake(struct conn_waiter *w)
{
	if (w->wake_fd >= 0)
		(void)!eventfd_write(w->wake_fd, 1);
}

static void waiter_unlink(struct conn *c, struct conn_waiter *w)
{
	for (struct conn_waiter **p = &c->waiters; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			return;
		}
}

static struct conn_waiter *waiter_find(struct conn *c, uint64_t id)
{
	for (struct conn_waiter *w = c->waiters; w; w = w->next)
		if (w->id == id && !w->done)
			return w;
	return NULL;
}

/* Under c->lock; wakes w when it sleeps: done is set first, so a waiter that checks it, then
 * polls, either sees it or finds its eventfd readable. */
static void waiter_finish(struct conn *c, struct conn_waiter *w, int error, Mrd__Response *resp,
			  struct wire_packet *pkt)
{
	if (resp && w->fds) {
		memcpy(w->fds->fds, pkt->fds, pkt->n_fds * sizeof(int));
		w->fds->n = pkt->n_fds;
	} else if (pkt)
		wire_packet_close_fds(pkt);
	w->error = error;
	w->resp = resp;
	w->done = true;
	waiter_unlink(c, w);
	waiter_wake(w);
}

/* Reads one reply into buf, waiting for it (up to SO_RCVTIMEO: -EAGAIN) or not (-EAGAIN when
 * none is queued), without c->lock. */
static int conn_read_reply(struct conn *c, uint8_t *buf, bool wait, struct wire_packet *pkt,
			   Mrd__Response **ret)
{
	Mrd__Response *resp;
	int r;

	r = wire_recv(c->fd, buf, c->buf_size, pkt, wait ? 0 : MSG_DONTWAIT);
	/* A peer that closed with our request unread reports ECONNRESET once, ahead of what it
	 * queued before closing (a refused connection's reason): look again. */
	if (r == -ECONNRESET) {
		r = wire_recv(c->fd, buf, c->buf_size, pkt, MSG_DONTWAIT);
		if (r == -EAGAIN)
			r = -ECONNRESET;
	}
	if (r == -EAGAIN)
		return r;
	if (r == -ECONNRESET || r == 0)
		return -ECONNRESET;
	if (r < 0)
		return r;
	/* More descriptors than a reply may carry: a caller's conn_fds holds WIRE_FDS_MAX. */
	if (pkt->truncated || pkt->fds_truncated || pkt->n_fds > WIRE_FDS_MAX) {
		wire_packet_close_fds(pkt);
		return -EMSGSIZE;
	}
	resp = envelope_unpack_response(pkt->data, pkt->len);
	if (!resp) {
		wire_packet_close_fds(pkt);
		return -EBADMSG;
	}
	*ret = resp;
	return 0;
}

/* Hands what the reader got to whoever it is for; under c->lock. */
static void conn_deliver(struct conn *c, struct conn_waiter *self, int r, Mrd__Response *resp,
			 struct wire_packet *pkt)
{
	struct conn_waiter *w;

	if (r == -ECONNRESET) {
		/* A SEQPACKET peer that hung up never comes back: nobody's reply will come. */
		__atomic_store_n(&c->broken, true, __ATOMIC_RELEASE);
		while (c->waiters)
			waiter_finish(c, c->waiters, r, NULL, NULL);
		return;
	}
	/* A frame nobody can read is the reader's own, and so is a reply with id 0 (to a frame mrd
	 * could not read, or a refused connection): whose cannot be told. Not when the reader had
	 * its reply already (another waiter read it meanwhile): then it stays as it was. */
	if (r < 0) {
		if (!self->done)
			waiter_finish(c, self, r, NULL, NULL);
		return;
	}
	w = waiter_find(c, resp->id);
	if (!w && resp->id == 0 && resp->status != 0 && !self->done)
		w = self;
	if (w)
		waiter_finish(c, w, 0, resp, pkt);
	else {
		wire_packet_close_fds(pkt);
		mrd__response__free_unpacked(resp, NULL); /* late reply to an abandoned call */
	}
}

/* Those that found the socket being read look again; under c->lock. */
static void wake_wants_read(struct conn *c)
{
	for (struct conn_waiter *w = c->waiters; w; w = w->next)
		if (w->wants_read) {
			w->wants_read = false;
			waiter_wake(w);
		}
}

/* Whether the waiter in recv() has been there CONN_STALLED_NS: its recv() times out sooner
 * unless its thread stalled (a signal handler holds it, it gets no CPU). */
static bool blocker_stalled(const struct conn *c, uint64_t now)
{
	return now - c->blocking_since_ns >= CONN_STALLED_NS;
}

/* The read of a waiter that came newest: it sleeps in recv(), with no poll(), for up to
 * CONN_FRESH_NS (SO_RCVTIMEO, which the kernel rounds up to a jiffy). Meanwhile nobody else
 * reads, since a reply taken from under it could not wake it (it watches no eventfd): a
 * newcomer leaves the socket to it (wants_read), and is woken when it is through; unless it
 * stalled in there, and then the others read, into c->poll_buf. Under c->lock, which it
 * drops. */
static void conn_read_blocking(struct conn *c, struct conn_waiter *self)
{
	struct wire_packet pkt;
	Mrd__Response *resp = NULL;
	int r;

	c->blocking = self;
	c->blocking_since_ns = now_ns();
	pthread_mutex_unlock(&c->lock);
	r = conn_read_reply(c, c->buf, true, &pkt, &resp);
	pthread_mutex_lock(&c->lock);
	c->blocking = NULL;
	if (r != -EAGAIN)
		conn_deliver(c, self, r, resp, &pkt);
	wake_wants_read(c);
}

/* One read of the socket without waiting, if no other waiter's such read is under way (then
 * -EBUSY, and self is woken when it is through). Under c->lock, which it drops meanwhile.
 * Returns 1 when it got a reply (anyone's), 0 when none was queued. */
static int conn_read_once(struct conn *c, struct conn_waiter *self)
{
	struct wire_packet pkt;
	Mrd__Response *resp = NULL;
	int r;

	if (c->reading) {
		self->wants_read = true;
		return -EBUSY;
	}
	if (!c->poll_buf && !(c->poll_buf = malloc(c->buf_size)))
		return -ENOMEM;
	self->wants_read = false;
	c->reading = true;
	pthread_mutex_unlock(&c->lock);
	r = conn_read_reply(c, c->poll_buf, false, &pkt, &resp);
	pthread_mutex_lock(&c->lock);
	c->reading = false;
	if (r != -EAGAIN)
		conn_deliver(c, self, r, resp, &pkt);
	wake_wants_read(c);
	return r == -EAGAIN ? 0 : 1;
}

/* Waits for w's reply, under c->lock. Each reply is read by a waiter whose thread is likely on
 * a CPU, and handed, with its descriptors, to the thread it is for:
 * - the newest waiter reads: when it came, it slept in recv() (conn_read_blocking: one system
 *   call, as for a thread alone on its handle), then it polls the socket and its eventfd;
 * - the others leave the socket to it, which hands them their replies, and sleep on their
 *   eventfds alone; so does the newest when it has waited CONN_FRESH_NS while another thread
 *   called in the last CONN_LONG_NS (that one will read its reply when it calls again). So the thread of a long call is not woken by every reply for another, nor
 *   can it, not yet on a CPU again, hold back another's reply. When the newest leaves, the next
 *   one takes over if it is fresh (sent less than CONN_FRESH_NS ago: woken); one that has
 *   waited longer looks again after a sixteenth of its wait so far (plus CONN_FRESH_NS), in
 *   case its reply came after the newer ones left, or the newest stalled: then it reads once
 *   each time it looks. */
static int conn_wait_locked(struct conn *c, struct conn_waiter *w)
{
	uint64_t deadline = w->since_ns + CONN_TIMEOUT_MS * 1000000ull;
	bool first = true;

	while (!w->done) {
		struct pollfd pfd[2] = { { .fd = -1, .events = POLLIN },
					 { .fd = -1, .events = POLLIN } };
		uint64_t now = now_ns(), until = deadline;
		bool fresh = waiter_fresh(w, now), others_call;
		struct timespec ts;
		int n, read = 0;

		if (now >= deadline) {
			waiter_finish(c, w, -ETIMEDOUT, NULL, NULL);
			break;
		}
		/* Another thread called lately (not w, nor long ago): it will be back soon. */
		others_call = c->last_sent_ns > w->since_ns && now - c->last_sent_ns < CONN_LONG_NS;
		if (c->waiters != w || (!fresh && others_call)) {
			/* The newest may have stalled: when it is not fresh, look once each wake,
			 * unless another waiter reads (then its reply comes by that one). */
			if (!first && !waiter_fresh(c->waiters, now) && !c->reading &&
			    (!c->blocking || blocker_stalled(c, now)) &&
			    (read = conn_read_once(c, w)) > 0)
				continue;
			w->leaving = true;
			until = earlier(until, fresh && waiter_fresh(c->waiters, now) ?
						       c->waiters->since_ns + CONN_FRESH_NS :
						       now + CONN_FRESH_NS + (now - w->since_ns) / 16);
		} else if (c->blocking && !blocker_stalled(c, now)) {
			w->wants_read = true;
			until = earlier(until, c->blocking_since_ns + CONN_STALLED_NS);
		} else if (first && !c->blocking && !c->reading) {
			first = false;
			conn_read_blocking(c, w);
			continue;
		} else {
			/* Its reply cannot be in at once: one poll() first. */
			if (!first && (read = conn_read_once(c, w)) > 0)
				continue;
			/* While another thread reads, the socket stays readable: sleep until it is
			 * through. */
			if (read != -EBUSY)
				pfd[0].fd = c->fd;
		}
		if (read == -ENOMEM) /* no buffer for a read without waiting */
			waiter_finish(c, w, read, NULL, NULL);
		/* A read above dropped the lock: the reply may have come meanwhile, by another
		 * reader, which could not wake this one (no eventfd was set). */
		if (w->done)
			break;
		first = false;
		w->wake_fd = pfd[1].fd = thread_wake_fd();
		if (pfd[1].fd < 0) /* no eventfd: look again now and then */
			until = earlier(until, now + CONN_FRESH_NS);
		pthread_mutex_unlock(&c->lock);
		ts = (struct timespec){ .tv_sec = (until - now) / 1000000000ull,
					.tv_nsec = (until - now) % 1000000000ull };
		n = ppoll(pfd, 2, &ts, NULL);
		if (n > 0 && pfd[1].revents) {
			eventfd_t v;

			(void)!eventfd_read(pfd[1].fd, &v);
		}
		pthread_mutex_lock(&c->lock);
		w->wake_fd = -1;
		w->wants_read = w->leaving = false;
	}
	/* The newest waiter leaves: the next one reads now, if it is fresh and left the socket to
	 * this one (a long one looks again by itself, and is not woken each time). */
	if (c->waiters && c->waiters->leaving && c->waiters->since_ns < w->since_ns &&
	    waiter_fresh(c->waiters, now_ns()))
		waiter_wake(c->waiters);
	return w->error;
}

/* Most requests are a few dozen bytes: packed on the stack, not in a buffer malloc'd and freed
 * each call; the larger ones the generic way. */
static int conn_send(struct conn *c, const Mrd__Request *req, const int *fds, size_t n_fds)
{
	uint8_t frame[CONN_STACK_FRAME];
	size_t len;
	int r;

	r = envelope_pack_request(req, frame, sizeof(frame), &len);
	pthread_mutex_lock(&c->send_lock);
	if (r == 0)
		r = wire_send_raw(c->fd, frame, len, fds, n_fds, 0);
	else
		r = wire_send(c->fd, &req->base, WIRE_FRAME_MAX, fds, n_fds, 0);
	pthread_mutex_unlock(&c->send_lock);
	return r;
}

int conn_call(struct conn *c, Mrd__Request *req, Mrd__Response **ret, struct conn_fds *ret_fds)
{
	return conn_call_with_fds(c, req, NULL, 0, ret, ret_fds);
}

static int conn_call_uncancellable(struct conn *c, Mrd__Request *req, const int *fds,
				   size_t n_fds, Mrd__Response **ret, struct conn_fds *ret_fds)
{
	struct conn_waiter w = { .fds = ret_fds, .wake_fd = -1 };
	int r;

	if (ret_fds)
		ret_fds->n = 0;
	if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE))
		return -ECONNRESET;
	pthread_mutex_lock(&c->lock);
	w.id = ++c->next_id;
	w.since_ns = c->last_sent_ns = now_ns(); /* under the lock: the list stays newest first */
	w.next = c->waiters;
	c->waiters = &w;
	pthread_mutex_unlock(&c->lock);
	req->id = w.id;
	/* The request is on the list before it is sent: whoever reads may find its reply. */
	r = conn_send(c, req, fds, n_fds);
	/* A peer that hung up may have left its reason queued (a refused connection): read it. */
	if (r < 0 && r != -EPIPE && r != -ECONNRESET) {
		pthread_mutex_lock(&c->lock);
		if (!w.done)
			waiter_unlink(c, &w);
		pthread_mutex_unlock(&c->lock);
		return r;
	}
	pthread_mutex_lock(&c->lock);
	r = conn_wait_locked(c, &w);
	pthread_mutex_unlock(&c->lock);
	if (r == 0)
		*ret = w.resp;
	return r;
}

/* A thread cancelled in its wait would leave its waiter, on its stack, in c->waiters (and
 * c->reading or c->blocking set): a call runs to its end whatever pthread_cancel() says. */
int conn_call_with_fds(struct conn *c, Mrd__Request *req, const int *fds, size_t n_fds,
		       Mrd__Response **ret, struct conn_fds *ret_fds)
{
	int r, cancel_state;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	r = conn_call_uncancellable(c, req, fds, n_fds, ret, ret_fds);
	pthread_setcancelstate(cancel_state, NULL);
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

/* connect()'s EACCES: mrd runs, and the socket's mode or its folder's keeps the caller out.
 * Names the socket's group, which mrd's users join ([mrd] socket_group), and how. */
static void eacces_error(const char *path, char *error, size_t error_size)
{
	struct group gr, *g = NULL;
	char gid[32], buf[1024];
	struct stat st;

	if (stat(path, &st) < 0 || !S_ISSOCK(st.st_mode)) {
		set_error(error, error_size, "cannot connect to %s: %s (a folder above it is closed "
			  "to this user)", path, strerror(EACCES));
		return;
	}
	if (getgrgid_r(st.st_gid, &gr, buf, sizeof(buf), &g) != 0)
		g = NULL; /* thread-safe, unlike getgrgid() */
	snprintf(gid, sizeof(gid), "%u", (unsigned)st.st_gid);
	set_error(error, error_size, "cannot connect to %s: %s: the socket is mode %03o, group "
		  "'%s' (gid %u), and this user is not in that group: join it (usermod -aG %s USER, "
		  "then log in again) or ask the administrator to set [mrd] socket_group or "
		  "socket_mode in mrd.conf", path, strerror(EACCES), (unsigned)(st.st_mode & 0777),
		  g ? g->gr_name : gid, (unsigned)st.st_gid, g ? g->gr_name : gid);
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

	/* The receive buffer right behind the connection: a reply lands on the page whose fields
	 * the call just used, not on one more page of its own (each page a call touches costs a
	 * TLB miss once a few hundred threads take turns on a CPU). malloc, not calloc: the
	 * buffer's pages stay untouched until a reply needs them. */
	c = malloc(sizeof(*c) + WIRE_FRAME_MAX);
	if (!c)
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	pthread_mutex_init(&c->send_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	snprintf(c->path, sizeof(c->path), "%s", path);
	c->buf_size = WIRE_FRAME_MAX;
	c->buf = (uint8_t *)(c + 1);
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return negative_errno();
	{
		struct timeval tv = { .tv_usec = CONN_FRESH_NS / 1000 };

		/* Bounds a lone waiter's recv() (conn_read_blocking). */
		if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
			return negative_errno();
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = negative_errno();
		if (r == -EACCES)
			eacces_error(path, error, error_size);
		else
			set_error(error, error_size, "cannot connect to %s: %s (is mrd running?)",
				  path, strerror(-r));
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
