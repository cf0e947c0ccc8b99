/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "macro.h"
#include "base/worker-pool.h"

struct worker_pool {
	pthread_mutex_t lock;
	pthread_cond_t wake;
	STAILQ_HEAD(, work) todo, finished;
	bool stopping;
	pthread_t *threads;
	unsigned n_threads;
	int event_fd; /* a worker tells the loop that finished jobs wait */
	struct event *event;
};

void thread_block_loop_signals(void)
{
	sigset_t all;

	sigfillset(&all);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	sigdelset(&all, SIGABRT);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
}

static void *worker_main(void *arg)
{
	struct worker_pool *p = arg;

	/* None interrupts a device command here. */
	thread_block_loop_signals();
	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct work *w = STAILQ_FIRST(&p->todo);
		uint64_t one = 1;

		if (!w) {
			if (p->stopping)
				break;
			pthread_cond_wait(&p->wake, &p->lock);
			continue;
		}
		STAILQ_REMOVE_HEAD(&p->todo, link);
		pthread_mutex_unlock(&p->lock);
		w->run(w);
		pthread_mutex_lock(&p->lock);
		STAILQ_INSERT_TAIL(&p->finished, w, link);
		(void)!write(p->event_fd, &one, sizeof(one));
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* On the loop: completions, in the order the jobs finished. */
static void run_finished(struct worker_pool *p)
{
	for (;;) {
		struct work *w;

		pthread_mutex_lock(&p->lock);
		w = STAILQ_FIRST(&p->finished);
		if (w)
			STAILQ_REMOVE_HEAD(&p->finished, link);
		pthread_mutex_unlock(&p->lock);
		if (!w)
			return;
		w->done(w);
	}
}

static void on_event(evutil_socket_t fd, short what, void *userdata)
{
	uint64_t n;

	(void)!read(fd, &n, sizeof(n));
	run_finished(userdata);
}

int worker_pool_new(struct event_base *base, unsigned n_threads, struct worker_pool **ret)
{
	struct worker_pool *p = calloc(1, sizeof(*p));
	int r = -ENOMEM;

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	STAILQ_INIT(&p->todo);
	STAILQ_INIT(&p->finished);
	p->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->event_fd < 0) {
		r = negative_errno();
		goto fail;
	}
	p->event = event_new(base, p->event_fd, EV_READ | EV_PERSIST, on_event, p);
	p->threads = calloc(n_threads, sizeof(*p->threads));
	if (!p->event || !p->threads || event_add(p->event, NULL) < 0)
		goto fail;
	for (; p->n_threads < n_threads; p->n_threads++) {
		r = -pthread_create(&p->threads[p->n_threads], NULL, worker_main, p);
		if (r < 0)
			goto fail;
	}
	*ret = p;
	return 0;
fail:
	worker_pool_free(p);
	return r;
}

struct worker_pool *worker_pool_free(struct worker_pool *p)
{
	if (!p)
		return NULL;
	pthread_mutex_lock(&p->lock);
	p->stopping = true;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->n_threads; i++)
		pthread_join(p->threads[i], NULL);
	run_finished(p);
	if (p->event)
		event_free(p->event);
	safe_close(p->event_fd);
	free(p->threads);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return NULL;
}

void worker_pool_submit(struct worker_pool *p, struct work *w)
{
	pthread_mutex_lock(&p->lock);
	STAILQ_INSERT_TAIL(&p->todo, w, link);
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
}
