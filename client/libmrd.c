/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "call.h"
#include "log.h"
#include "memory.h"
#include "own-windows.h"
#include "mrd/mrd.h"
#include "watcher.h"
#include "window-track.h"

/* The process's open handles: a fork() child marks each one its parent's. */
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static mrd_client *handles;

static void fork_prepare(void)
{
	pthread_mutex_lock(&handles_lock);
	for (mrd_client *c = handles; c; c = c->next)
		adopt_fork_lock(c, true);
	memory_fork_lock(true);
	watcher_fork_prepare();
}

static void fork_parent(void)
{
	watcher_fork_parent();
	memory_fork_lock(false);
	for (mrd_client *c = handles; c; c = c->next)
		adopt_fork_lock(c, false);
	pthread_mutex_unlock(&handles_lock);
}

/* The child shares the parent's socket and memory: it must not talk to mrd in the parent's
 * name (their requests and replies would cross), nor hand out the parent's cached keys. */
static void fork_child(void)
{
	/* First, before anything writes pages that are still the parent's (a handle may lie on
	 * an adopted page of the heap). */
	for (mrd_client *c = handles; c; c = c->next)
		adopt_fork_child(c);
	for (mrd_client *c = handles; c; c = c->next) {
		c->forked = true;
		client_poison_status(c);
	}
	watcher_fork_child();
	memory_fork_lock(false);
	for (mrd_client *c = handles; c; c = c->next)
		adopt_fork_lock(c, false);
	pthread_mutex_unlock(&handles_lock);
}

/* libmrd is silent unless MRD_LOG_LEVEL asks, as libibverbs is with VERBS_LOG_LEVEL. */
static void libmrd_init(void)
{
	int level = log_level_from_string(getenv("MRD_LOG_LEVEL"));

	log_set_ident("libmrd");
	log_set_level(level < 0 ? LOG_LEVEL_SILENT : (enum log_level)level);
	(void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void libmrd_init_once(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, libmrd_init);
}

MRD_EXPORT int mrd_client_connect(const char *path, mrd_client **ret)
{
	char error[256] = "";
	mrd_client *client;
	int r;

	libmrd_init_once();
	if (!ret)
		return set_last_error(-EINVAL, "mrd_client_connect: ret is NULL");
	client = calloc(1, sizeof(*client));
	if (!client)
		return set_last_error(-ENOMEM, "out of memory");
	{
		pthread_rwlockattr_t attr;

		/* A waiting reconnect goes before new calls: a loop of calls failing on a dead
		 * connection cannot starve it (no call takes the lock twice). */
		pthread_rwlockattr_init(&attr);
		pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
		pthread_rwlock_init(&client->lock, &attr);
		pthread_rwlockattr_destroy(&attr);
	}
	pthread_mutex_init(&client->lost_lock, NULL);
	pthread_mutex_init(&client->reconnect_lock, NULL);
	pthread_mutex_init(&client->adopt_lock, NULL);
	pthread_mutex_init(&client->track_lock, NULL);
	client->fd = -1;
	client->bound_fd = -1;
	client->pid = getpid();
	r = conn_open(path, program_invocation_short_name, MRD_CAPS_SERVED, &client->conn, error,
		      sizeof(error));
	if (r < 0) {
		set_last_error(r, "%s", error);
		mrd_client_close(client);
		return r;
	}
	client->fd = client->conn->fd;
	log_debug("connected to %s: mrd %s, protocol %u", client->conn->path,
		  client->conn->server_version, (unsigned)client->conn->version);
	r = memory_join(client);
	if (r < 0) {
		mrd_client_close(client);
		return r;
	}
	pthread_mutex_lock(&handles_lock);
	client->next = handles;
	if (handles)
		handles->prev = client;
	handles = client;
	pthread_mutex_unlock(&handles_lock);
	/* From here on mrd's death stops cached lookups without the program's help. */
	r = watcher_add(client);
	if (r < 0) {
		mrd_client_close(client);
		return r;
	}
	*ret = client;
	return 0;
}

MRD_EXPORT mrd_client *mrd_client_close(mrd_client *client)
{
	if (!client)
		return NULL;
	watcher_remove(client); /* before its descriptor closes */
	pthread_mutex_lock(&handles_lock);
	if (client->prev)
		client->prev->next = client->next;
	else if (handles == client)
		handles = client->next;
	if (client->next)
		client->next->prev = client->prev;
	pthread_mutex_unlock(&handles_lock);
	if (client->conn) /* none when connecting failed */
		log_debug("closing the connection to %s (%lu allocations held)", client->conn->path,
			  __atomic_load_n(&client->n_held, __ATOMIC_ACQUIRE));
	adopt_leave(client); /* before the connection goes: mrd would punch the pages */
	/* Before the connection goes too (mrd frees what it held); after adopt_leave, whose
	 * frees would make the windows' record again (adopted memory has no windows). */
	if (client->conn)
		window_track_clear(client);
	own_windows_close(client);
	memory_leave(client);
	conn_free(client->conn);
	safe_close(client->bound_fd);
	pthread_rwlock_destroy(&client->lock);
	pthread_mutex_destroy(&client->lost_lock);
	pthread_mutex_destroy(&client->reconnect_lock);
	pthread_mutex_destroy(&client->adopt_lock);
	window_track_done(client);
	free(client);
	return NULL;
}

/* BindPd on conn with the program's command fd. */
static int bind_pd_on(struct conn *conn, int cmd_fd, uint32_t pd_handle)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__BindPdRequest bind = MRD__BIND_PD_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	bind.pd_handle = pd_handle;
	req.body_case = MRD__REQUEST__BODY_BIND_PD;
	req.bind_pd = &bind;
	r = conn_request_with_fds(conn, &req, &cmd_fd, 1, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_BIND_PD)
		r = set_last_error(-EBADMSG, "malformed BindPd reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

static int reconnect(mrd_client *client)
{
	char error[256] = "";
	struct conn *conn, *old;
	unsigned long held;
	unsigned resumed;
	int r, fd = -1;

	/* A live connection must not be dropped: mrd would free what this handle holds. */
	r = mrd_client_ping(client);
	if (r == 0)
		return set_last_error(-EISCONN, "the handle is still connected to mrd");
	if (r != -ECONNRESET)
		return r; /* not known to be gone (a timeout): nothing is done */
	r = conn_open(client->conn->path, program_invocation_short_name, MRD_CAPS_SERVED, &conn,
		      error, sizeof(error));
	if (r < 0)
		return set_last_error(r, "%s", error);
	r = memory_rejoin(client, conn, &fd);
	if (r < 0) {
		conn_free(conn); /* nothing came back: the handle keeps its dead connection */
		return r;
	}
	resumed = (unsigned)r;
	log_debug("reconnected to %s: mrd %s gave back %u allocations", conn->path,
		  conn->server_version, resumed);
	/* With the handle's lock held alone no other call runs: the unanswered Frees are settled
	 * on the new connection before anything else can be allocated there (a run freed by the
	 * old mrd may come back to another thread at the same address), and the count is whole. */
	pthread_rwlock_wrlock(&client->lock);
	r = memory_settle_lost_frees(client, conn, &resumed);
	/* Bound before the connection serves a lookup: its keys are of the program's PD. */
	if (r >= 0 && client->bound_fd >= 0)
		r = bind_pd_on(conn, client->bound_fd, client->bound_pd);
	held = __atomic_load_n(&client->n_held, __ATOMIC_ACQUIRE);
	if (r == -ECONNRESET || r == -ETIMEDOUT)
		r = set_call_error(r);
	/* The new connection under the handle's descriptor number (mrd_client_fd). */
	else if (dup3(conn->fd, client->fd, O_CLOEXEC) < 0)
		r = set_last_error(-errno, "dup3: %s", strerror(errno));
	if (r < 0) {
		pthread_rwlock_unlock(&client->lock);
		conn_free(conn); /* gone again: the claims go back to waiting */
		close(fd);
		return r;
	}
	close(conn->fd);
	conn->fd = client->fd;
	/* The new connection first, then the page: a lookup that sees the new generation asks
	 * the new mrd. */
	old = client->conn;
	old->fd = -1; /* dup3 closed it */
	client->conn = conn;
	__atomic_store_n(&client->gone, false, __ATOMIC_RELEASE);
	__atomic_add_fetch(&client->epoch, 1, __ATOMIC_RELEASE);
	r = memory_remap_status(client, fd);
	pthread_rwlock_unlock(&client->lock);
	watcher_rearm(client); /* the live connection under the handle's descriptor */
	conn_free(old);
	close(fd);
	/* The windows the handle tracked, for the new mrd; failing, a window left bound by this
	 * process's death would keep its MR there (the old limit), and the handle serves on. */
	if (r >= 0 && window_track_resend(client) < 0)
		log_debug("the new mrd was not told of this handle's windows: %s", mrd_last_error());
	if (r < 0)
		return r;
	if (resumed == UINT_MAX)
		return set_last_error(-ESTALE, "more Frees went unanswered than libmrd keeps: what "
				      "came back cannot be told; close every handle of this "
				      "process, which unmaps that memory, and connect anew");
	if (resumed != held)
		/* What did not come back is gone (mrd had dropped this handle, or this is not the
		 * process that had it): its pages may be someone else's by now. What did come back
		 * stays the handle's until it closes. */
		return set_last_error(-ESTALE, "mrd gave back %u of the %lu allocations this handle "
				      "had; the others are gone: close every handle of this "
				      "process, which unmaps that memory, and connect anew",
				      resumed, held);
	return (int)resumed;
}

MRD_EXPORT int mrd_client_reconnect(mrd_client *client)
{
	int r;

	if (!client)
		return set_last_error(-EINVAL, "mrd_client_reconnect: client is NULL");
	if (client->forked)
		/* Before the lock: one held at the fork stays held. */
		return client_forked_error(client);
	pthread_mutex_lock(&client->reconnect_lock);
	r = reconnect(client);
	pthread_mutex_unlock(&client->reconnect_lock);
	return r;
}

MRD_EXPORT int mrd_client_ping(mrd_client *client)
{
	static const uint8_t payload[8] = "mrd-ping";
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	if (!client)
		return set_last_error(-EINVAL, "mrd_client_ping: client is NULL");
	ping.payload.data = (uint8_t *)payload;
	ping.payload.len = sizeof(payload);
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_PING || resp->ping->payload.len != sizeof(payload) ||
	    memcmp(resp->ping->payload.data, payload, sizeof(payload)) != 0)
		r = set_last_error(-EBADMSG, "malformed Ping reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_client_fd(const mrd_client *client)
{
	return client ? client->fd : set_last_error(-EINVAL, "mrd_client_fd: client is NULL");
}

/* POLLHUP: mrd hung up (POLLIN alone is only a reply on its way to a caller). */
static bool hung_up(int fd)
{
	struct pollfd pfd = { .fd = fd };

	return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR));
}

MRD_EXPORT int mrd_client_check(mrd_client *client)
{
	int r;

	if (!client)
		return set_last_error(-EINVAL, "mrd_client_check: client is NULL");
	r = client_usable(client);
	if (r < 0 || !hung_up(client->fd))
		return r;
	r = client_lock(client);
	if (r < 0)
		return r;
	/* Again under the lock: a reconnect may have put a new connection there since. */
	if (hung_up(client->fd))
		__atomic_store_n(&client->conn->broken, true, __ATOMIC_RELEASE);
	client_unlock(client);
	return client_usable(client);
}

MRD_EXPORT int mrd_client_get_pd(mrd_client *client, int *ret_cmd_fd, uint32_t *ret_pd_handle)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExportPdRequest export_pd = MRD__EXPORT_PD_REQUEST__INIT;
	Mrd__Response *resp;
	struct conn_fds fds;
	uint64_t device;
	int r;

	if (!client || !ret_cmd_fd || !ret_pd_handle)
		return set_last_error(-EINVAL, "mrd_client_get_pd: NULL argument");
	/* Before the ask: mrd moves it before it hands out a new PD, so a PD replaced since is
	 * told stale (and asked again), never the reverse. */
	device = client_device_epoch(client);
	req.body_case = MRD__REQUEST__BODY_EXPORT_PD;
	req.export_pd = &export_pd;
	r = client_call(client, &req, &resp, &fds);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_EXPORT_PD || fds.n != 1) {
		for (size_t i = 0; i < fds.n; i++)
			safe_close(fds.fds[i]);
		mrd__response__free_unpacked(resp, NULL);
		return set_last_error(-EBADMSG, "malformed ExportPd reply");
	}
	*ret_cmd_fd = fds.fds[0];
	*ret_pd_handle = resp->export_pd->pd_handle;
	mrd__response__free_unpacked(resp, NULL);
	/* Keys from here on are for this PD (until the next restart of mrd, or the device's next
	 * return). */
	__atomic_store_n(&client->pd_epoch, __atomic_load_n(&client->epoch, __ATOMIC_ACQUIRE),
			 __ATOMIC_RELEASE);
	__atomic_store_n(&client->pd_device_epoch, device, __ATOMIC_RELEASE);
	__atomic_store_n(&client->pd_imported, true, __ATOMIC_RELEASE);
	return 0;
}

MRD_EXPORT int mrd_client_bind_pd(mrd_client *client, int cmd_fd, uint32_t pd_handle)
{
	int copy, r;

	if (!client || cmd_fd < 0)
		return set_last_error(-EINVAL, "mrd_client_bind_pd: no handle or no descriptor");
	if (client->bound_fd >= 0)
		return set_last_error(-EALREADY, "this handle is bound to PD %u already",
				      client->bound_pd);
	/* Kept for a reconnect, which binds the new connection before anything else. */
	copy = fcntl(cmd_fd, F_DUPFD_CLOEXEC, 3);
	if (copy < 0)
		return set_last_error(-errno, "dup of the command fd: %s", strerror(errno));
	pthread_rwlock_wrlock(&client->lock); /* no lookup of this handle is under way */
	r = bind_pd_on(client->conn, copy, pd_handle);
	if (r >= 0) {
		client->bound_fd = copy;
		client->bound_pd = pd_handle;
	}
	pthread_rwlock_unlock(&client->lock);
	if (r < 0)
		close(copy);
	return r;
}

MRD_EXPORT int mrd_client_protocol_version(const mrd_client *client)
{
	return client ? (int)client->conn->version : -EINVAL;
}

MRD_EXPORT const char *mrd_client_server_version(const mrd_client *client)
{
	return client ? client->conn->server_version : NULL;
}

MRD_EXPORT const char *mrd_client_domain(const mrd_client *client)
{
	return client ? client->domain : NULL;
}

MRD_EXPORT uint64_t mrd_client_generation(const mrd_client *client)
{
	return client ? __atomic_load_n(&client->status->generation, __ATOMIC_ACQUIRE) : 0;
}

MRD_EXPORT const char *mrd_version(void)
{
	return PACKAGE_VERSION;
}
