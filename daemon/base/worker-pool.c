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

/* One key's jobs: queued in the order submitted, and how many run. */
struct lane {
	const void *key;
	STAILQ_HEAD(, work) todo;
	unsigned running;
	TAILQ_ENTRY(lane) link; /* the pool's, in turn order */
};

struct worker_pool {
	pthread_mutex_t lock;
	pthread_cond_t wake;
	/* Every key with jobs queued or running. A worker serves the first lane that has a job
	 * and fewer than per_key running, and sends it to the back: keys take turns, and one
	 * key's gigabytes never hold every worker while another key's job waits. */
	TAILQ_HEAD(, lane) lanes;
	struct lane shared; /* keys whose lane could not be allocated share it */
	unsigned queued;    /* jobs in lanes, not yet running */
	STAILQ_HEAD(, work) finished;
	bool stopping;
	pthread_t *threads;
	unsigned n_threads;
	unsigned per_key; /* workers one key may hold at once: all but one */
	int event_fd; /* a worker tells the loop that finished jobs wait */
	struct event *event;
	struct loop_turn turn;
	struct event *turn_over; /* made active by a turn's first count: it runs last in the turn */
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

/* Under the lock: the next job a worker may start, its lane counted running and sent to the
 * back; NULL when none may start (none queued, or their keys hold per_key workers). */
static struct work *take(struct worker_pool *p, struct lane **ret)
{
	struct lane *l;

	TAILQ_FOREACH(l, &p->lanes, link) {
		struct work *w = STAILQ_FIRST(&l->todo);

		if (!w || l->running >= p->per_key)
			continue;
		STAILQ_REMOVE_HEAD(&l->todo, link);
		p->queued--;
		l->running++;
		TAILQ_REMOVE(&p->lanes, l, link);
		TAILQ_INSERT_TAIL(&p->lanes, l, link);
		*ret = l;
		return w;
	}
	return NULL;
}

/* Under the lock: a job of l ended. A lane with nothing left goes; a job its key held back
 * may start now. */
static void ended(struct worker_pool *p, struct lane *l)
{
	l->running--;
	if (l->running == 0 && STAILQ_EMPTY(&l->todo)) {
		TAILQ_REMOVE(&p->lanes, l, link);
		if (l != &p->shared)
			free(l);
	}
	if (p->queued > 0)
		pthread_cond_signal(&p->wake);
}

static void *worker_main(void *arg)
{
	struct worker_pool *p = arg;

	/* None interrupts a device command here. */
	thread_block_loop_signals();
	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct lane *l;
		struct work *w = take(p, &l);
		uint64_t one = 1;

		if (!w) {
			/* Queued jobs held back by their key wait for its running ones to end. */
			if (p->stopping && p->queued == 0)
				break;
			pthread_cond_wait(&p->wake, &p->lock);
			continue;
		}
		pthread_mutex_unlock(&p->lock);
		w->run(w);
		pthread_mutex_lock(&p->lock);
		ended(p, l);
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

static void on_turn_over(evutil_socket_t fd, short what, void *userdata)
{
	struct worker_pool *p = userdata;

	p->turn = (struct loop_turn){ 0 };
}

const struct loop_turn *worker_pool_turn(const struct worker_pool *p)
{
	return &p->turn;
}

void worker_pool_turn_add(struct worker_pool *p, uint64_t bytes)
{
	/* Active now, it runs after every callback this turn of the loop queued already. */
	if (p->turn.ops++ == 0)
		event_active(p->turn_over, EV_TIMEOUT, 1);
	p->turn.bytes += bytes;
}

int worker_pool_new(struct event_base *base, unsigned n_threads, struct worker_pool **ret)
{
	struct worker_pool *p = calloc(1, sizeof(*p));
	int r = -ENOMEM;

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	TAILQ_INIT(&p->lanes);
	STAILQ_INIT(&p->shared.todo);
	STAILQ_INIT(&p->finished);
	p->per_key = n_threads > 1 ? n_threads - 1 : 1;
	p->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->event_fd < 0) {
		r = negative_errno();
		goto fail;
	}
	p->event = event_new(base, p->event_fd, EV_READ | EV_PERSIST, on_event, p);
	p->turn_over = event_new(base, -1, 0, on_turn_over, p);
	p->threads = calloc(n_threads, sizeof(*p->threads));
	if (!p->event || !p->turn_over || !p->threads || event_add(p->event, NULL) < 0)
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
	if (p->turn_over)
		event_free(p->turn_over);
	safe_close(p->event_fd);
	free(p->threads);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return NULL;
}

/* Under the lock: key's lane, made (at the back) when it has none. */
static struct lane *lane_of(struct worker_pool *p, const void *key)
{
	struct lane *l;

	TAILQ_FOREACH(l, &p->lanes, link)
		if (l != &p->shared && l->key == key)
			return l;
	l = malloc(sizeof(*l));
	if (!l) {
		/* Out of memory: the job still runs, in turn with the others that share this. */
		l = &p->shared;
		if (l->running > 0 || !STAILQ_EMPTY(&l->todo))
			return l;
	} else {
		*l = (struct lane){ .key = key };
		STAILQ_INIT(&l->todo);
	}
	TAILQ_INSERT_TAIL(&p->lanes, l, link);
	return l;
}

void worker_pool_submit(struct worker_pool *p, struct work *w, const void *key)
{
	struct lane *l;

	pthread_mutex_lock(&p->lock);
	l = lane_of(p, key);
	STAILQ_INSERT_TAIL(&l->todo, w, link);
	p->queued++;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
}
