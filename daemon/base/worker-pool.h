/* SPDX-License-Identifier: MIT */
/* Threads for work too slow for the event loop (registering GiBs). A job runs on a worker;
 * its completion runs back on the loop, so the loop never waits and handlers never race. */
#pragma once

#include <stdint.h>
#include <sys/queue.h>

struct event_base;
struct worker_pool;

struct work {
	void (*run)(struct work *w);  /* on a worker thread */
	void (*done)(struct work *w); /* on the loop, after run */
	STAILQ_ENTRY(work) link;
};

int worker_pool_new(struct event_base *base, unsigned n_threads, struct worker_pool **ret);
/* Runs every job already submitted to its end (done included), then stops. NULL-safe. */
struct worker_pool *worker_pool_free(struct worker_pool *p);
/* key: whose job it is (a domain's; the pool knows no more of it than its address). Jobs of
 * one key start in the order submitted; keys take turns, and one key holds at most all workers
 * but one (the only one, in a pool of one), so that another key's job never waits behind a
 * queue of the first's. */
void worker_pool_submit(struct worker_pool *p, struct work *w, const void *key);

/* What the loop did itself this turn of the loop, of work it could have handed to the pool, as
 * its callers count it (worker_pool_turn_add): zero again once the callbacks this turn had
 * queued have run, so that a budget per turn holds however many requests one turn serves. */
struct loop_turn {
	unsigned ops;
	uint64_t bytes;
};
const struct loop_turn *worker_pool_turn(const struct worker_pool *p);
void worker_pool_turn_add(struct worker_pool *p, uint64_t bytes);

/* For a helper thread of mrd (a worker, the fd closer): signals are the loop's, blocked here
 * (faults still come). */
void thread_block_loop_signals(void);
