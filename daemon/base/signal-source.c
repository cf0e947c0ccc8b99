/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "macro.h"
#include "base/signal-source.h"

struct signal_source {
	sigset_t old_mask; /* the calling thread's, given back at the free */
	bool blocked;
	int fd;
	struct event *event;
	signal_source_fn fn;
	void *userdata;
};

static void on_readable(evutil_socket_t fd, short what, void *userdata)
{
	struct signal_source *s = userdata;
	struct signalfd_siginfo si;

	(void)what;
	/* All that came: a SIGTERM behind a SIGHUP is not left for the next turn. */
	while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		s->fn((int)si.ssi_signo, s->userdata);
}

int signal_source_new(struct event_base *base, const sigset_t *set, signal_source_fn fn,
		      void *userdata, struct signal_source **ret)
{
	struct signal_source *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->fd = -1;
	s->fn = fn;
	s->userdata = userdata;
	r = -pthread_sigmask(SIG_BLOCK, set, &s->old_mask);
	s->blocked = r == 0;
	if (r == 0) {
		s->fd = signalfd(-1, set, SFD_NONBLOCK | SFD_CLOEXEC);
		r = s->fd < 0 ? negative_errno() : 0;
	}
	if (r == 0) {
		s->event = event_new(base, s->fd, EV_READ | EV_PERSIST, on_readable, s);
		r = !s->event ? -ENOMEM : event_add(s->event, NULL) < 0 ? -EIO : 0;
	}
	if (r < 0) {
		signal_source_free(s);
		return r;
	}
	*ret = s;
	return 0;
}

struct signal_source *signal_source_free(struct signal_source *s)
{
	if (!s)
		return NULL;
	if (s->event)
		event_free(s->event);
	safe_close(s->fd);
	/* mrd's main() blocked them before: they stay so; a test's process gets them back. */
	if (s->blocked)
		(void)pthread_sigmask(SIG_SETMASK, &s->old_mask, NULL);
	free(s);
	return NULL;
}
