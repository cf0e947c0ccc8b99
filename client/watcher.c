/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "call.h"
#include "log.h"
#include "watcher.h"

/* One running thread: its wake-up descriptor and stop flag (a thread being joined keeps its
 * own while the next one starts). */
struct watcher_run {
	pthread_t thread;
	int wake_fd;
	bool stop;
	bool running; /* past its start: connect waits for it */
};

struct watched {
	struct mrd_client *client;
	bool quiet; /* found gone: out of the poll set until a reconnect rearms it */
};

/* Guards everything below. The thread never holds it while it waits on a handle's lock. */
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cond = PTHREAD_COND_INITIALIZER;
static struct watched *watched;
static size_t n_watched, cap_watched;
static struct watcher_run *run;
static struct mrd_client *busy; /* the handle the thread is acting on, unlocked */

static void wake(struct watcher_run *w)
{
	uint64_t one = 1;

	(void)!write(w->wake_fd, &one, sizeof(one)); /* EAGAIN: a wake-up is pending already */
}

static struct watched *find(const struct mrd_client *client)
{
	for (size_t i = 0; i < n_watched; i++)
		if (watched[i].client == client)
			return &watched[i];
	return NULL;
}

static bool hung_up(int fd)
{
	struct pollfd pfd = { .fd = fd };

	return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR));
}

/* What mrd_client_check() does, for the program: marks the handle gone (client_unlock then
 * poisons its status page). Checked again under the handle's lock: a reconnect may have put a
 * live connection under the descriptor since poll() answered. */
static bool notice(struct mrd_client *client)
{
	if (client_lock(client) < 0)
		return true; /* gone already */
	if (hung_up(client->fd))
		__atomic_store_n(&client->conn->broken, true, __ATOMIC_RELEASE);
	client_unlock(client);
	return __atomic_load_n(&client->gone, __ATOMIC_ACQUIRE);
}

static void *watch(void *arg)
{
	struct watcher_run *w = arg;
	struct pollfd *pfds = NULL;
	struct mrd_client **clients = NULL;
	size_t cap = 0;

	pthread_mutex_lock(&watch_lock);
	w->running = true;
	pthread_cond_broadcast(&watch_cond);
	while (!w->stop) {
		size_t n = 1;
		uint64_t drained;

		if (cap < n_watched + 1) {
			size_t c = n_watched + 8;
			struct pollfd *p = realloc(pfds, c * sizeof(*p));
			struct mrd_client **q;

			if (p)
				pfds = p;
			q = p ? realloc(clients, c * sizeof(*q)) : NULL;
			if (q)
				clients = q;
			if (!p || !q) {
				/* Out of memory: try again when the next handle comes or goes. */
				pthread_mutex_unlock(&watch_lock);
				(void)poll(&(struct pollfd){ .fd = w->wake_fd, .events = POLLIN }, 1,
					   -1);
				(void)!read(w->wake_fd, &drained, sizeof(drained));
				pthread_mutex_lock(&watch_lock);
				continue;
			}
			cap = c;
		}
		pfds[0] = (struct pollfd){ .fd = w->wake_fd, .events = POLLIN };
		for (size_t i = 0; i < n_watched; i++)
			if (!watched[i].quiet) {
				/* No events asked: POLLHUP and POLLERR come anyway; POLLIN would
				 * wake for every reply to the program's own calls. */
				pfds[n] = (struct pollfd){ .fd = watched[i].client->fd };
				clients[n++] = watched[i].client;
			}
		pthread_mutex_unlock(&watch_lock);
		while (poll(pfds, n, -1) < 0 && errno == EINTR)
			;
		if (pfds[0].revents)
			(void)!read(w->wake_fd, &drained, sizeof(drained));
		pthread_mutex_lock(&watch_lock);
		for (size_t i = 1; i < n && !w->stop; i++) {
			struct watched *e;

			if (!(pfds[i].revents & (POLLHUP | POLLERR | POLLNVAL)))
				continue;
			/* Closed meanwhile (then it is not in the list any more), or another handle
			 * at the same address: notice() looks at the handle itself. */
			e = find(clients[i]);
			if (!e || e->quiet)
				continue;
			busy = clients[i];
			pthread_mutex_unlock(&watch_lock);
			bool gone = notice(clients[i]);
			pthread_mutex_lock(&watch_lock);
			busy = NULL;
			pthread_cond_broadcast(&watch_cond);
			e = find(clients[i]);
			if (e && gone)
				e->quiet = true;
		}
	}
	/* Under the lock, as every allocation of this thread's: fork_prepare takes it. */
	free(pfds);
	free(clients);
	pthread_mutex_unlock(&watch_lock);
	return NULL;
}

static int start(void)
{
	struct watcher_run *w = calloc(1, sizeof(*w));
	sigset_t all, old;
	pthread_attr_t attr;
	int r;

	if (!w)
		return set_last_error(-ENOMEM, "out of memory");
	w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->wake_fd < 0) {
		r = -errno;
		free(w);
		return set_last_error(r, "libmrd's watcher: eventfd: %s", strerror(-r));
	}
	/* The program's signals never land on libmrd's thread. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 * 1024);
	r = -pthread_create(&w->thread, &attr, watch, w);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0) {
		close(w->wake_fd);
		free(w);
		return set_last_error(r, "cannot start libmrd's watcher thread (%s); MRD_WATCH=0 "
				      "connects without it (see libmrd(3))", strerror(-r));
	}
	(void)pthread_setname_np(w->thread, "mrd-watch");
	run = w; /* watcher_add waits until it runs */
	return 0;
}

static bool wanted(void)
{
	const char *s = getenv("MRD_WATCH");

	return !s || strcmp(s, "0") != 0;
}

int watcher_add(struct mrd_client *client)
{
	int r = 0, cancel_state;

	if (!wanted())
		return 0;
	/* The waits below are cancellation points: cancelled there, a thread would end holding
	 * watch_lock (libmrd's calls are not cancellation points, libmrd(3)). */
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	pthread_mutex_lock(&watch_lock);
	/* Connect returns once the thread runs (a handshake of some µs): a fork() right after
	 * never copies its start half done. glibc's malloc forks safely anyway; ASan's of GCC 12
	 * takes no lock around fork(), and a child forked while the start's malloc held one of
	 * its locks hung on its first thread (test_fork_right_after_connect). The thread takes
	 * watch_lock to say it runs; a first connect meanwhile waits for that thread rather than
	 * start its own (test_first_connects_at_once), and one whose thread was stopped
	 * meanwhile (the last handle closed) starts another. The list may have changed during
	 * the wait: room is made after it. */
	for (;;) {
		if (n_watched == cap_watched) {
			size_t cap = cap_watched ? cap_watched * 2 : 4;
			struct watched *a = realloc(watched, cap * sizeof(*a));

			if (!a) {
				r = set_last_error(-ENOMEM, "out of memory");
				goto out;
			}
			watched = a;
			cap_watched = cap;
		}
		if (!run) {
			r = start();
			if (r < 0)
				goto out;
		}
		while (run && !run->running)
			pthread_cond_wait(&watch_cond, &watch_lock);
		if (run && n_watched < cap_watched)
			break;
	}
	watched[n_watched++] = (struct watched){ .client = client };
	wake(run); /* a thread just started has looked at the list already */
out:
	pthread_mutex_unlock(&watch_lock);
	pthread_setcancelstate(cancel_state, NULL);
	return r;
}

void watcher_remove(struct mrd_client *client)
{
	struct watcher_run *w = NULL;
	struct watched *e;
	int cancel_state;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state); /* as watcher_add */
	pthread_mutex_lock(&watch_lock);
	e = find(client);
	if (!e) {
		pthread_mutex_unlock(&watch_lock);
		pthread_setcancelstate(cancel_state, NULL);
		return;
	}
	*e = watched[--n_watched];
	/* The thread may be inside notice() on it: the handle must outlive that. */
	while (busy == client)
		pthread_cond_wait(&watch_cond, &watch_lock);
	if (n_watched == 0) {
		free(watched);
		watched = NULL;
		cap_watched = 0;
		w = run;
		run = NULL;
		w->stop = true;
	}
	wake(w ? w : run);
	pthread_mutex_unlock(&watch_lock);
	if (w) {
		pthread_join(w->thread, NULL);
		close(w->wake_fd);
		free(w);
	}
	pthread_setcancelstate(cancel_state, NULL);
}

void watcher_rearm(struct mrd_client *client)
{
	struct watched *e;

	pthread_mutex_lock(&watch_lock);
	e = find(client);
	if (e) {
		e->quiet = false;
		wake(run);
	}
	pthread_mutex_unlock(&watch_lock);
}

void watcher_fork_prepare(void)
{
	pthread_mutex_lock(&watch_lock);
}

void watcher_fork_parent(void)
{
	pthread_mutex_unlock(&watch_lock);
}

/* Only the forking thread lives on: the parent's watcher is not here, and the handles it
 * watched are the parent's (fork_child marks and poisons them). */
void watcher_fork_child(void)
{
	if (run) {
		close(run->wake_fd);
		free(run);
		run = NULL;
	}
	free(watched);
	watched = NULL;
	n_watched = cap_watched = 0;
	busy = NULL;
	pthread_mutex_unlock(&watch_lock);
}
