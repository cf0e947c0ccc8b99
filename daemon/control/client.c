/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "log.h"
#include "time-util.h"
#include "wire.h"
#include "base/fd-closer.h"
#include "base/process.h"
#include "registration/bound-pd.h"
#include "core/domain.h"
#include "core/served-devices.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"
#include "control/refusal-log.h"

static void out_frame_free(struct out_frame *f)
{
	for (size_t i = 0; i < f->n_fds; i++)
		safe_close(f->fds[i]);
	free(f);
}

/* Whether mrd takes no more requests of c for now. Held back by its descriptor budget too
 * (drain_event waits for it to read what it was sent): whatever frees bytes of its user's
 * must not resume it. */
bool client_full(const struct client *c)
{
	return c->n_pending + c->n_out >= c->manager->core.config.max_inflight ||
	       (c->drain_event && event_pending(c->drain_event, EV_TIMEOUT, NULL)) ||
	       c->out_bytes >= CLIENT_OUT_BYTES_MAX ||
	       (c->share && c->share->out_bytes >= USER_OUT_BYTES_MAX);
}

static void out_bytes_add(struct client *c, size_t len)
{
	c->out_bytes += len;
	if (c->share)
		c->share->out_bytes += len;
}

/* A reply left the queue (sent, or its client went): when that takes its user below the
 * bound, the user's other connections it held up are read again. */
static void out_bytes_sub(struct client *c, size_t len)
{
	struct user_share *u = c->share;
	bool was_full = u && u->out_bytes >= USER_OUT_BYTES_MAX;
	struct client *i;

	c->out_bytes -= len;
	if (!u)
		return;
	u->out_bytes -= len;
	if (was_full && u->out_bytes < USER_OUT_BYTES_MAX)
		LIST_FOREACH(i, &c->manager->clients, link)
			if (i != c && i->share == u && !i->reading)
				client_resume(i);
}

/* A client that is not read would have its hang-up wait for its pending answers: EV_CLOSED
 * (epoll's EPOLLRDHUP) tells at once, so that the work goes with it. */
static void client_watch_hangup(struct client *c)
{
	if (!c->reading && c->n_pending > 0)
		(void)event_add(c->hangup_event, NULL);
	else
		event_del(c->hangup_event);
}

static void client_set_reading(struct client *c, bool on)
{
	if (on && client_full(c))
		return;
	if (c->reading != on) {
		if (on)
			event_add(c->read_event, NULL);
		else
			event_del(c->read_event);
		c->reading = on;
	}
	client_watch_hangup(c);
}

/* One packet per wake-up: the socket is level-triggered, so more wake it again, clients are
 * served in turn, and a client with one request in flight (most) costs no recvmsg that finds
 * nothing — a fifth of the loop's system calls per request. */
static void client_on_read(evutil_socket_t fd, short what, void *userdata)
{
	struct client *c = userdata;
	struct manager *m = c->manager;
	struct wire_packet pkt;
	int r;

	if (!c->reading)
		return;
	/* Its user's other connections may have filled the user's byte bound since: then it
	 * waits too, or each connection would add one reply past it. */
	if (client_full(c)) {
		client_set_reading(c, false);
		return;
	}
	/* Each packet may bring 253 descriptors more to close: none is read while its user's
	 * lane is full (what it sent stays in its socket, one descriptor in that lane). */
	if (c->owner_uid != 0 && fd_closer_lane_full(m->closer, c->owner_uid)) {
		client_drop(c, "its user's descriptors still wait to be closed");
		return;
	}
	r = wire_recv(c->fd, m->recv_buf, m->recv_buf_size, &pkt, MSG_DONTWAIT);
	if (r == -EAGAIN)
		return;
	if (r == 0) {
		log_debug("client %" PRIu64 " (pid %d) disconnected", c->id, (int)c->owner.mem.pid);
		client_free(c);
		return;
	}
	if (r < 0) {
		log_debug_errno(r, "client %" PRIu64 " (pid %d): receive failed: %m", c->id,
				(int)c->owner.mem.pid);
		client_free(c);
		return;
	}
	(void)dispatch_packet(c, &pkt); /* < 0: dropped and freed */
}

#define CLIENT_DRAIN_RETRY_USEC 20000

/* Whether n more descriptors may be sent now; forgets the ones the client has read. */
static bool fd_budget_allows(struct client *c, size_t n)
{
	int unread;

	if (n == 0 || c->fds_in_flight + n <= CLIENT_FDS_IN_FLIGHT)
		return true;
	/* SIOCOUTQ: bytes of our replies still waiting in the client's socket. */
	if (ioctl(c->fd, SIOCOUTQ, &unread) == 0 && unread == 0) {
		c->fds_in_flight = 0;
		return n <= CLIENT_FDS_IN_FLIGHT;
	}
	return false;
}

/* Sends queued replies. Returns 1 when blocked by the descriptor budget (retry on a timer:
 * the socket itself stays writable), 0 when blocked by the socket or done, or -errno. */
static int client_flush(struct client *c)
{
	struct out_frame *f;

	while ((f = STAILQ_FIRST(&c->out))) {
		int r;

		if (!fd_budget_allows(c, f->n_fds))
			return 1;
		r = wire_send_raw(c->fd, f->data, f->len, f->fds, f->n_fds, MSG_DONTWAIT);
		if (r == -EAGAIN)
			return 0;
		if (r >= 0)
			c->fds_in_flight += f->n_fds;
		STAILQ_REMOVE_HEAD(&c->out, link);
		c->n_out--;
		out_bytes_sub(c, f->len);
		out_frame_free(f);
		if (r < 0)
			return r;
	}
	return 0;
}

/* After a flush: wait for the socket, for the client to read, or for nothing. */
static void client_after_flush(struct client *c, int r)
{
	if (r < 0) {
		/* The peer went away; the read side sees the hang-up and frees the client. */
		log_debug_errno(r, "client %" PRIu64 ": send failed: %m", c->id);
		client_set_reading(c, true);
	}
	if (r == 1) {
		struct timeval tv = { 0, CLIENT_DRAIN_RETRY_USEC };

		event_del(c->write_event);
		event_add(c->drain_event, &tv);
		client_set_reading(c, false); /* it is not reading its replies: stop taking more */
		return;
	}
	if (STAILQ_EMPTY(&c->out))
		event_del(c->write_event);
	else if (r == 0)
		event_add(c->write_event, NULL);
	client_resume(c);
}

static void client_on_write(evutil_socket_t fd, short what, void *userdata)
{
	struct client *c = userdata;

	client_after_flush(c, client_flush(c));
}

int client_send_frame(struct client *c, const uint8_t *data, size_t len, const int *fds,
		      size_t n_fds)
{
	struct out_frame *f;
	int r;

	if (STAILQ_EMPTY(&c->out) && fd_budget_allows(c, n_fds)) {
		r = wire_send_raw(c->fd, data, len, fds, n_fds, MSG_DONTWAIT);
		if (r >= 0)
			c->fds_in_flight += n_fds;
		if (r != -EAGAIN)
			return r;
	}

	f = malloc(sizeof(*f) + len);
	if (!f)
		return -ENOMEM;
	f->len = len;
	f->n_fds = 0;
	memcpy(f->data, data, len);
	for (size_t i = 0; i < n_fds; i++) {
		f->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
		if (f->fds[i] < 0) {
			r = negative_errno();
			out_frame_free(f);
			return r;
		}
		f->n_fds++;
	}
	STAILQ_INSERT_TAIL(&c->out, f, link);
	c->n_out++;
	out_bytes_add(c, len);
	if (client_full(c))
		client_set_reading(c, false);
	if (!event_pending(c->drain_event, EV_TIMEOUT, NULL))
		client_after_flush(c, fd_budget_allows(c, f->n_fds) ? 0 : 1);
	return 0;
}

static void client_on_hangup(evutil_socket_t fd, short what, void *userdata)
{
	struct client *c = userdata;

	log_debug("client %" PRIu64 " (pid %d) left while paused", c->id, (int)c->owner.mem.pid);
	client_free(c);
}

int client_new(struct manager *m, int fd, pid_t pid, uid_t uid, gid_t gid, bool admin,
	       const char *domain_name, struct client **ret)
{
	_cleanup_(client_freep) struct client *c = NULL;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	STAILQ_INIT(&c->out);
	LIST_INIT(&c->pending);
	c->manager = m;
	c->id = ++m->next_client_id;
	reg_owner_init(&c->owner, c->id, pid, uid);
	c->gid = gid;
	c->admin = admin;
	snprintf(c->domain_name, sizeof(c->domain_name), "%s", domain_name);
	LIST_INSERT_HEAD(&m->clients, c, link);
	m->n_clients++;

	c->read_event = event_new(m->core.base, fd, EV_READ | EV_PERSIST, client_on_read, c);
	c->write_event = event_new(m->core.base, fd, EV_WRITE | EV_PERSIST, client_on_write, c);
	c->drain_event = evtimer_new(m->core.base, client_on_write, c);
	c->hangup_event = event_new(m->core.base, fd, EV_CLOSED, client_on_hangup, c);
	if (!c->read_event || !c->write_event || !c->drain_event || !c->hangup_event)
		return -ENOMEM;
	if (event_add(c->read_event, NULL) < 0)
		return -EIO;
	c->reading = true;
	c->fd = fd;

	*ret = TAKE_PTR(c);
	return 0;
}

struct client *client_free(struct client *c)
{
	struct out_frame *f;

	if (!c)
		return NULL;
	if (c->manager)
		refusal_log_leave(c);
	while ((f = STAILQ_FIRST(&c->out))) {
		STAILQ_REMOVE_HEAD(&c->out, link);
		out_bytes_sub(c, f->len);
		out_frame_free(f);
	}
	if (c->read_event)
		event_free(c->read_event);
	if (c->write_event)
		event_free(c->write_event);
	if (c->drain_event)
		event_free(c->drain_event);
	if (c->hangup_event)
		event_free(c->hangup_event);
	if (c->fd >= 0) {
		/* The peer sees the end now; what it sent and mrd did not read (descriptors too)
		 * goes with the socket, to a closer thread. */
		fd_closer_consume_socket(c->manager->closer, c->fd, c->owner_uid);
	}
	request_abandon(c); /* workers may still finish for it: nobody to answer */
	/* Everything it owns goes; memory of other clients stays, and so does its memory that
	 * other clients' pools still have registered. */
	/* Its PD's MRs go first, before any of their pages may (and the fd once they did), a
	 * share a turn with the rest. */
	served_device_unbind(c->bound_device);
	if (c->domain) {
		domain_windows_drop_owner(c->domain, &c->owner.mem); /* its quota back at once */
		domain_leave(c->domain, &c->owner, TAKE_PTR(c->bound)); /* bound: none without */
	}
	domain_release(c->domain);
	free(c->arenas_sent);
	if (c->manager) {
		LIST_REMOVE(c, link);
		c->manager->n_clients--;
		if (c->share && c->user_container)
			manager_user_container_put(c->share, c->domain_name);
		if (c->share)
			manager_user_share_put(c->manager, c->share);
	}
	free(c);
	return NULL;
}

void client_pause(struct client *c)
{
	client_set_reading(c, false);
}

void client_resume(struct client *c)
{
	client_set_reading(c, true);
}

int client_get_domain(struct client *c, struct domain **ret, char *why, size_t why_size)
{
	int r;

	if (!c->domain) {
		r = domain_acquire(&c->manager->core, c->domain_name, &c->domain, why, why_size);
		if (r < 0)
			return r;
	}
	*ret = c->domain;
	return 0;
}

bool client_has_arena(const struct client *c, uint32_t arena_id)
{
	for (size_t i = 0; i < c->n_arenas_sent; i++)
		if (c->arenas_sent[i] == arena_id)
			return true;
	return false;
}

int client_add_arena(struct client *c, uint32_t arena_id)
{
	if (c->n_arenas_sent == c->arenas_sent_cap) {
		size_t cap = c->arenas_sent_cap ? c->arenas_sent_cap * 2 : 8;
		uint32_t *ids = realloc(c->arenas_sent, cap * sizeof(*ids));

		if (!ids)
			return -ENOMEM;
		c->arenas_sent = ids;
		c->arenas_sent_cap = cap;
	}
	c->arenas_sent[c->n_arenas_sent++] = arena_id;
	return 0;
}

void client_forget_arena_all(struct manager *m, uint32_t arena_id)
{
	struct client *c;

	LIST_FOREACH(c, &m->clients, link)
		for (size_t i = 0; i < c->n_arenas_sent; i++)
			if (c->arenas_sent[i] == arena_id) {
				c->arenas_sent[i] = c->arenas_sent[--c->n_arenas_sent];
				break;
			}
}

/* Drops are logged once per DROPPED_LOG_INTERVAL_USEC, with how many there were since: one
 * user dropped in a loop must not flood the journal (mrctl stats counts every one). */
#define DROPPED_LOG_INTERVAL_USEC (5 * USEC_PER_SEC)

void client_drop(struct client *c, const char *reason)
{
	struct manager *m = c->manager;
	uint64_t now = now_usec(CLOCK_MONOTONIC);

	m->n_clients_dropped++;
	m->dropped_since_log++;
	if (m->dropped_log_usec == 0 || now - m->dropped_log_usec >= DROPPED_LOG_INTERVAL_USEC) {
		log_warning("dropping client %" PRIu64 " (pid %d, uid %u, \"%s\"): %s (%u "
			    "dropped since the last such line)", c->id, (int)c->owner.mem.pid,
			    (unsigned)c->owner.mem.uid, c->name, reason, m->dropped_since_log);
		m->dropped_log_usec = now;
		m->dropped_since_log = 0;
	}
	client_free(c);
}
