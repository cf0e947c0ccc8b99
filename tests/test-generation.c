/* SPDX-License-Identifier: MIT */
/* The generation rule, checked at random: a key's death is published (the status page's
 * generation moves over its range) before the key dies. Several clients of one domain pipeline
 * Alloc (pinned and on demand), MrLookup (of anyone's memory), Prefetch, Dma, Free, mempool
 * register, replacement (extmem) and unregister, and leave and come back, with [cache]
 * async_bytes at one page, so that deregistrations run on the worker. Every key a reply hands out is kept with the
 * generation read before its request went (a client's cache holds at most that). After each
 * client's replies the worker is made to finish what it was given (a job of the test's own
 * behind it, FIFO on one worker) while the loop stands still, and each kept key is probed
 * through the provider: a dead key whose range no record after its generation names is a
 * violation — a client would hand it out to a work request. Seeded ($MRD_TEST_SEED), bounded
 * rounds, no clock: the count must be 0. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/client.h"
#include "control/manager.h"
#include "core/domain.h"
#include "provider/provider.h"
#include "registration/bound-pd.h"
#include "status-page.h"
#include "base/worker-pool.h"
#include "test-daemon.h"
#include "check-run.h"

#define PAGE 4096ull
#define CLIENTS 4
#define ROUNDS 1000
#define PIPELINE 4   /* requests a client has in flight at once */
#define ALLOCS 64    /* the domain's, all clients' together */
#define KEYS 512
#define POOLS 4      /* a client's */

struct held {
	uint32_t key;
	uint64_t start, end, generation;
	struct provider_pd *pd; /* whose keys: the domain's, or a bound client's */
	int client;
};

struct galloc {
	uint64_t addr, len;
	int owner;
	bool odp;
};

enum kind { ALLOC, LOOKUP, PREFETCH, DMA, FREE, POOL_REG, POOL_UNREG };

struct pending {
	uint64_t id;
	enum kind kind;
	uint64_t generation; /* read before it was sent */
	uint64_t addr;       /* FREE: what; ALLOC: its size; POOL_REG: the pool's state before */
	int pool;            /* POOL_*: which; ALLOC: on demand */
	uint32_t key;        /* DMA: through which */
};

struct gclient {
	int fd;
	struct client *c;
	struct provider *bound; /* its own PD's provider, or NULL */
	uint64_t next_id;
	struct pending pending[PIPELINE];
	size_t n_pending;
	int pools[POOLS]; /* 0: none; 1: registered; 2: replaced by one in attached memory */
};

static struct gclient cl[CLIENTS];
static struct galloc allocs[ALLOCS];
static size_t n_allocs;
static struct held keys[KEYS];
static size_t n_keys;
static uint64_t rng, violations, deaths, probes, replaced;

static uint64_t next_random(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static unsigned pick(unsigned n) { return (unsigned)(next_random() % n); }

/* The domain, held open by a client of the test's that sends nothing (anchor), so that it
 * outlives every other client's leaving. */
static struct domain *dom;
static int anchor;

static struct domain *domain(void) { return dom; }

static uint64_t generation(void)
{
	return status_page_generation(&domain()->mem.status);
}

/* Whether a client that cached [start, end) at generation from and now reads now drops it
 * (client/lookup.c, catch_up): the ring lapped, or a record after from names the range. */
static bool stale(uint64_t from, uint64_t now, uint64_t start, uint64_t end)
{
	const struct mrd_status_page *page = domain()->mem.status.page;

	if (now - from > MRD_STATUS_FREED)
		return true;
	for (uint64_t g = from + 1; g <= now; g++) {
		const struct mrd_status_freed *f = &page->freed[g % MRD_STATUS_FREED];

		if (__atomic_load_n(&f->generation, __ATOMIC_ACQUIRE) != g)
			return true;
		if (f->start < end && f->end > start)
			return true;
	}
	return false;
}

static void keep(uint32_t key, uint64_t start, uint64_t end, uint64_t gen, int client)
{
	if (n_keys == KEYS) /* the oldest goes */
		memmove(keys, keys + 1, --n_keys * sizeof(*keys));
	keys[n_keys++] = (struct held){ key, start, end, gen,
					cl[client].c->bound ? cl[client].c->bound->pd :
							      domain()->reg.base.pd,
					client };
}

static void forget(size_t i) { keys[i] = keys[--n_keys]; }

/* A key seen dead: its death must have been published already. The generation is read after
 * the death was seen, so a bump made before the key died is in it. */
static void dead(size_t i)
{
	uint64_t now = generation();

	deaths++;
	if (!stale(keys[i].generation, now, keys[i].start, keys[i].end)) {
		violations++;
		if (violations <= 5)
			fprintf(stderr, "violation: client %d%s: key 0x%08x of [0x%" PRIx64 ", 0x%" PRIx64
				") dead, generation %" PRIu64 " still says current (now %" PRIu64
				")\n", keys[i].client,
				keys[i].pd == domain()->reg.base.pd ? "" : " (own PD)", keys[i].key,
				keys[i].start, keys[i].end, keys[i].generation, now);
	}
	forget(i);
}

/* Every kept key through the provider, as a NIC would take it: ENOKEY, it is dead. */
static void probe_all(void)
{
	for (size_t i = 0; i < n_keys;) {
		int k = provider_dma(keys[i].pd, PROVIDER_DMA_WRITE, keys[i].key, keys[i].start,
				     keys[i].key, keys[i].start, 8);

		probes++;
		if (k == -ENOKEY)
			dead(i);
		else
			i++;
	}
}

/* The worker finishes what it was given, the loop standing still meanwhile (what it has to
 * complete waits): then every key probed. One worker runs its queue in order, so once the
 * test's job runs, every dereg submitted before it ran. */
static void probe_behind_the_worker(void)
{
	struct td_blocker b;

	td_block_worker(&b);
	while (!__atomic_load_n(&b.entered, __ATOMIC_ACQUIRE))
		sched_yield();
	probe_all();
	/* Its completion runs with the others: up to 60 s, so that a loaded machine never
	 * fails it, and a lost completion does not hang. */
	ck_assert_int_eq(write(b.fd[1], "x", 1), 1);
	for (int i = 0; i < 60000 && !b.done; i++) {
		td_pump();
		if (!b.done)
			usleep(1000);
	}
	ck_assert(b.done);
	close(b.fd[0]);
	close(b.fd[1]);
}

/* The next reply of fd, its descriptors closed: the loop runs until it comes (60 s at most,
 * as above). */
static Mrd__Response *recv_reply(int fd)
{
	int fds[WIRE_FDS_MAX];
	size_t n_fds = 0;

	for (int i = 0; i < 60000; i++) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };

		td_pump();
		if (poll(&pfd, 1, 1) > 0)
			break;
	}
	{
		Mrd__Response *resp = td_recv_reply(fd, fds, &n_fds);

		for (size_t i = 0; i < n_fds; i++)
			close(fds[i]);
		ck_assert_ptr_nonnull(resp);
		return resp;
	}
}

static struct galloc *random_allocation(int owner)
{
	size_t mine[ALLOCS], n = 0;

	for (size_t i = 0; i < n_allocs; i++)
		if (owner < 0 || allocs[i].owner == owner)
			mine[n++] = i;
	return n ? &allocs[mine[pick((unsigned)n)]] : NULL;
}

static void send_prefetch(int fd, uint64_t id, uint64_t addr, uint64_t len)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PrefetchRequest q = MRD__PREFETCH_REQUEST__INIT;

	q.address = addr;
	q.length = len;
	q.advice = MRD__PREFETCH_ADVICE__PREFETCH_WRITE;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &q;
	td_send_request(fd, &req, NULL, 0);
}

static void send_alloc(int fd, uint64_t id, uint64_t size, bool odp)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest a = MRD__ALLOC_REQUEST__INIT;

	a.size = size;
	a.flags = odp ? MRD__ALLOC_FLAGS__ALLOC_ODP : 0;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &a;
	td_send_request(fd, &req, NULL, 0);
}


/* One random request of client i, pipelined behind what it has in flight. */
static void send_one(int i)
{
	struct gclient *g = &cl[i];
	struct pending *p = &g->pending[g->n_pending];
	const struct held *h;
	struct galloc *a;
	char name[16];
	unsigned what = pick(100);

	*p = (struct pending){ .id = g->next_id++, .generation = generation() };
	if (what < 12 || n_allocs == 0) {
		if (n_allocs >= ALLOCS - CLIENTS * PIPELINE) {
			p->kind = LOOKUP;
			goto lookup;
		}
		p->kind = ALLOC;
		p->addr = (1 + pick(16)) * PAGE;
		p->pool = pick(4) == 0;
		send_alloc(g->fd, p->id, p->addr, p->pool);
	} else if (what < 45) {
		p->kind = LOOKUP;
lookup:
		a = random_allocation(-1);
		if (!a) {
			p->kind = ALLOC;
			p->addr = PAGE;
			send_alloc(g->fd, p->id, p->addr, false);
		} else
			td_send_lookup(g->fd, p->id, a->addr + pick((unsigned)a->len));
	} else if (what < 52 && (a = random_allocation(-1)) && a->odp) {
		p->kind = PREFETCH;
		send_prefetch(g->fd, p->id, a->addr, a->len);
	} else if (what < 62 && n_keys > 0 &&
		   (h = &keys[pick((unsigned)n_keys)])->pd == domain()->reg.base.pd) {
		Mrd__MrEntry e = MRD__MR_ENTRY__INIT; /* a key of the domain's PD: what Dma takes */

		p->kind = DMA;
		e.start = h->start;
		e.end = h->end;
		e.lkey = e.rkey = h->key;
		p->addr = h->start;
		p->key = h->key;
		td_send_dma(g->fd, p->id, PROVIDER_DMA_WRITE, &e, h->start, &e, h->start, 8);
	} else if (what < 76 && (a = random_allocation(i))) {
		p->kind = FREE;
		p->addr = a->addr;
		/* Gone from the test's view now: nobody looks it up after its Free went. */
		*a = allocs[--n_allocs];
		td_send_free(g->fd, p->id, p->addr);
	} else if (what < 90) {
		int k = pick(POOLS);
		uint64_t starts[2], lengths[2];
		size_t n = 0;

		snprintf(name, sizeof(name), "pool%d", k);
		if (g->pools[k] && (g->pools[k] == 2 || pick(2) == 0)) {
			p->kind = POOL_UNREG;
			p->pool = k;
			g->pools[k] = 0;
			td_send_mempool_unregister(g->fd, p->id, name);
		} else if ((a = random_allocation(i)) && !a->odp) {
			struct galloc *b = random_allocation(i);

			starts[n] = a->addr + pick((unsigned)(a->len / PAGE)) * PAGE;
			lengths[n++] = 1 + pick((unsigned)(a->addr + a->len - starts[0]));
			if (b && b != a && !b->odp) {
				starts[n] = b->addr;
				lengths[n++] = b->len;
			}
			/* Again, with extmem: the replacement drops the old pool's MRs. */
			p->kind = POOL_REG;
			p->pool = k;
			p->addr = (uint64_t)g->pools[k]; /* what a refusal leaves */
			g->pools[k]++;
			td_send_mempool_register(g->fd, p->id, name, starts, lengths, n,
						 g->pools[k] == 2);
		} else {
			p->kind = LOOKUP;
			goto lookup;
		}
	} else {
		p->kind = LOOKUP;
		goto lookup;
	}
	g->n_pending++;
}

static void take_reply(int i, Mrd__Response *resp)
{
	struct gclient *g = &cl[i];
	struct pending p;
	size_t k;

	for (k = 0; k < g->n_pending && g->pending[k].id != resp->id; k++)
		;
	ck_assert_msg(k < g->n_pending, "reply %" PRIu64 " to nothing sent", resp->id);
	p = g->pending[k];
	g->pending[k] = g->pending[--g->n_pending];
	switch (p.kind) {
	case ALLOC:
		if (resp->status == 0 && n_allocs < ALLOCS)
			allocs[n_allocs++] = (struct galloc){ resp->alloc->address, p.addr, i,
								  p.pool };
		break;
	case LOOKUP:
		if (resp->status == 0)
			for (size_t e = 0; e < resp->mr_lookup->n_entries; e++) {
				const Mrd__MrEntry *m = resp->mr_lookup->entries[e];

				keep(m->lkey, m->start, m->end, p.generation, i);
			}
		break;
	case POOL_REG:
		replaced += resp->status == 0 && p.addr == 1;
		if (resp->status == 0)
			for (size_t e = 0; e < resp->mempool_register->n_entries; e++) {
				const Mrd__MrEntry *m = resp->mempool_register->entries[e];

				keep(m->lkey, m->start, m->end, p.generation, i);
			}
		else
			g->pools[p.pool] = (int)p.addr;
		break;
	case DMA:
		/* A Dma that found its key dead: the key died before the reply, so its death
		 * must show in the generation read now. */
		if (resp->status == ENOKEY)
			for (size_t h = 0; h < n_keys; h++)
				if (keys[h].key == p.key && keys[h].start == p.addr &&
				    keys[h].pd == domain()->reg.base.pd) {
					dead(h);
					break;
				}
		break;
	case FREE:
		/* Memory under a pool stays (EBUSY): the test forgot it, as a client that lost
		 * track would; its keys die when the pool goes. */
	case PREFETCH:
	case POOL_UNREG:
		break;
	}
	mrd__response__free_unpacked(resp, NULL);
}

/* Binds client i to a PD of a soft provider of its own (tests/test-bound-pd.c). */
static void bind_soft(int i)
{
	struct provider_pd *pd;

	ck_assert_int_eq(provider_soft_ops.open(NULL, &cl[i].bound), 0);
	ck_assert_int_eq(provider_pd_alloc(cl[i].bound, &pd), 0);
	ck_assert_int_eq(bound_pd_adopt(&cl[i].c->domain->reg.cache, cl[i].bound, pd, "soft", 7,
					getpid(), &cl[i].c->bound),
			 0);
}

static void join(int i, bool bound)
{
	cl[i].fd = td_hello_client(1000, &cl[i].c);
	cl[i].next_id = 2;
	cl[i].n_pending = 0;
	memset(cl[i].pools, 0, sizeof(cl[i].pools));
	/* The first request of a client makes it join: an Alloc, answered at once. */
	td_alloc(cl[i].fd, 1, PAGE);
	cl[i].bound = NULL;
	if (bound)
		bind_soft(i);
}

/* Client i leaves, its pools and memory with it. Its keys of its own PD went with its PD
 * (that connection's cache alone held them): forgotten, not checked. */
static void leave(int i)
{
	while (cl[i].n_pending > 0)
		take_reply(i, recv_reply(cl[i].fd));
	close(cl[i].fd);
	for (size_t k = 0; k < n_allocs;)
		if (allocs[k].owner == i)
			allocs[k] = allocs[--n_allocs];
		else
			k++;
	for (size_t k = 0; k < n_keys;)
		if (keys[k].client == i && keys[k].pd != domain()->reg.base.pd)
			forget(k);
		else
			k++;
}

static void run(bool with_bound_pd)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.workers=1",
				   "cache.async_bytes=4K", "quota.mempools=64", NULL };
	const char *seed = getenv("MRD_TEST_SEED");

	rng = seed ? strtoull(seed, NULL, 0) : 0x9e3779b97f4a7c15ull;
	if (!rng)
		rng = 1;
	fprintf(stderr, "seed 0x%" PRIx64 "%s\n", rng, with_bound_pd ? ", client 0 bound" : "");
	n_allocs = n_keys = 0;
	violations = deaths = probes = replaced = 0;
	td_start(settings);
	{
		struct client *c;

		anchor = td_hello_client(1000, &c);
		td_alloc(anchor, 1, PAGE); /* joins the domain */
		dom = c->domain;
	}
	for (int i = 0; i < CLIENTS; i++)
		join(i, with_bound_pd && i == 0);
	for (unsigned round = 0; round < ROUNDS; round++) {
		for (int i = 0; i < CLIENTS; i++)
			while (cl[i].n_pending < PIPELINE)
				send_one(i);
		/* Replies come in any order; between clients the worker catches up. */
		for (int i = 0; i < CLIENTS; i++) {
			unsigned n = 1 + pick(PIPELINE);

			for (unsigned k = 0; k < n && cl[i].n_pending > 0; k++)
				take_reply(i, recv_reply(cl[i].fd));
			probe_behind_the_worker();
		}
		if (pick(8) == 0) {
			int i = (int)pick(CLIENTS);

			leave(i); /* and another comes in its place */
			join(i, with_bound_pd && i == 0);
			probe_behind_the_worker();
		}
	}
	for (int i = 0; i < CLIENTS; i++) {
		leave(i);
		probe_behind_the_worker();
	}
	fprintf(stderr, "%" PRIu64 " probes, %" PRIu64 " keys seen dead (%" PRIu64 " pools "
		"replaced), %" PRIu64 " dead while their generation said current\n", probes, deaths,
		replaced, violations);
	close(anchor);
	td_wait_domains_closed();
	td_stop();
	ck_assert_uint_gt(deaths, 0);
	ck_assert_uint_gt(replaced, 0);
	ck_assert_uint_eq(violations, 0);
}

START_TEST(test_generation_rule) { run(false); }
END_TEST

START_TEST(test_generation_rule_bound_pd) { run(true); }
END_TEST

int main(void)
{
	Suite *s = suite_create("generation");
	TCase *tc = tcase_create("generation");

	/* Bounded rounds, not time; the timeout only keeps a loaded machine from failing it. */
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_generation_rule);
	tcase_add_test(tc, test_generation_rule_bound_pd);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
