/* SPDX-License-Identifier: MIT */
/* Review reproducers: the device's events and failure while a worker holds a domain's
 * provider in a long op (a registration held at $MRD_SOFT_GATE, as a big ibv_reg_mr pins for
 * seconds). The loop must go on serving meanwhile: that is what the workers are for. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "control/manager.h"
#include "core/domain.h"
#include "provider/provider.h"
#include "registration/registrar.h"
#include "test-daemon.h"
#include "test-util.h"
#include "wire.h"
#include "check-run.h"

#define MiB (1ull << 20)

static char dir[64], fifo[96], gate[64];
static int events_fd = -1;

static void start(void)
{
	const char *settings[] = { "mrd.provider=soft", "memory.window_size=4G",
				   "memory.arena_size=64M", "memory.hugepages=no",
				   "cache.policy=contig", "cache.workers=2", "cache.odp_chunk=2M", NULL };

	snprintf(dir, sizeof(dir), "/tmp/mrd-test-device-race.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/events", dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_EVENTS", fifo, 1), 0);
	events_fd = open(fifo, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(events_fd, 0);
	ck_assert_int_eq(soft_gate_setenv(gate, sizeof(gate), 1 * MiB), 0);
	td_start(settings);
}

static void stop(void)
{
	td_stop();
	soft_gate_cleanup(gate);
	unsetenv("MRD_SOFT_GATE");
	close(events_fd);
	unsetenv("MRD_SOFT_EVENTS");
	unlink(fifo);
	rmdir(dir);
}

static void inject(char c)
{
	ck_assert_int_eq(write(events_fd, &c, 1), 1);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Lets the held op go after 3 s, whatever the loop does (else a stuck loop hangs the test). */
static void *release_later(void *arg)
{
	(void)arg;
	sleep(3);
	soft_gate_release(gate, 1);
	return NULL;
}

/* Lets the held op go once the test says so, or after TEST_WAIT_S whatever the loop does (else
 * a stuck loop hangs the test): a loop that waited for the op waits that long. */
static int release_now;

static void *release_when_told(void *arg)
{
	(void)arg;
	test_wait_until(__atomic_load_n(&release_now, __ATOMIC_ACQUIRE), 1000);
	soft_gate_release(gate, 1);
	return NULL;
}

/* What one client's Ping may take while a worker holds the provider: far below TEST_WAIT_S,
 * which a loop that waited for it takes; far above a loaded machine's stall. */
#define NOT_WAITED_S 5.0

/* A port event (PORT_ERR, PORT_ACTIVE, LID/GID change, SM reregister: every context on the
 * device gets them) arrives while a worker registers 2 MiB: the loop reads the domain's
 * context's events under the provider's lock, which the registration holds. */
static void held_registration_then(char event)
{
	int a, b;
	uint64_t addr;
	pthread_t t;
	double t0, waited;
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;

	start();
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1001, NULL);
	addr = td_alloc(a, 1, 2 * MiB);
	td_send_lookup(a, 2, addr);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r'); /* a worker holds the provider */
	ck_assert_int_eq(pthread_create(&t, NULL, release_when_told, NULL), 0);

	inject(event);
	t0 = now_s();
	for (int i = 0; i < 50; i++) { /* the loop sees the event */
		td_pump();
		usleep(1000);
	}
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	td_send_request(b, &req, NULL, 0);
	mrd__response__free_unpacked(td_expect(b, 3, 0), NULL);
	waited = now_s() - t0;
	__atomic_store_n(&release_now, 1, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	mrd__response__free_unpacked(td_expect(a, 2, 0), NULL);
	ck_assert_msg(waited < NOT_WAITED_S, "the loop stood still %.1f s behind a worker's "
		      "registration after event '%c' (another client's Ping waited)", waited, event);
	close(a);
	close(b);
	stop();
}

START_TEST(test_port_event_during_registration)
{
	held_registration_then('D');
}
END_TEST

static struct domain *domain_of(uint64_t addr)
{
	struct domain *d;

	LIST_FOREACH(d, &td_manager->core.domains, link)
		if (d->mem.allocated_bytes > 0)
			return d;
	(void)addr;
	return NULL;
}

static void pump_until(const bool *flag, bool want)
{
	td_pump_until(*flag == want);
	ck_assert(*flag == want);
}

/* mrd started; a client's first lookup of 2 MiB (request 2) held at the gate in the provider
 * on a worker, and DEVICE_FATAL sent meanwhile. Returns the client, its memory in *ret_addr. */
static int fatal_during_registration(uint64_t *ret_addr)
{
	int a;

	start();
	a = td_hello_client(1000, NULL);
	*ret_addr = td_alloc(a, 1, 2 * MiB);
	td_send_lookup(a, 2, *ret_addr);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r');
	inject('F');
	return a;
}

/* DEVICE_FATAL while a worker registers, then the return: what was pinned and counted adds
 * up to nothing once everything is freed. */
START_TEST(test_fatal_during_registration_accounting)
{
	int a;
	uint64_t addr;
	struct domain *d;
	struct provider_stats ps;
	Mrd__Response *resp;

	a = fatal_during_registration(&addr);
	d = domain_of(addr);
	soft_gate_release(gate, 1);
	pump_until(&td_manager->core.device.failed, true);
	resp = td_expect(a, 2, ENODEV); /* its keys are the failed device's */
	mrd__response__free_unpacked(resp, NULL);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	td_lookup(a, 3, addr, 0, NULL);
	td_free(a, 4, addr, 0);
	td_pump_until(!d->mem.allocated_bytes);
	provider_stats(d->reg.base.provider, &ps);
	fprintf(stderr, "after free: provider mrs %llu pinned %llu, charges pinned %llu, "
		"allocated %llu\n", (unsigned long long)ps.mrs, (unsigned long long)ps.pinned_bytes,
		(unsigned long long)d->reg.cache.charges.pinned_bytes,
		(unsigned long long)d->mem.allocated_bytes);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert_uint_eq(ps.pinned_bytes, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(a);
	stop();
}
END_TEST

/* A second lookup inside the held run waits for the registration (mr-cache.c pending_run);
 * DEVICE_FATAL meanwhile: the first is refused with ENODEV since its keys are the failed
 * device's, and so must the one that waited, which reg_job_done runs again against the table
 * the failed MR was just put in. */
START_TEST(test_fatal_during_registration_waiter_refused)
{
	int a;
	uint64_t addr;
	Mrd__Response *resp;

	start();
	a = td_hello_client(1000, NULL);
	addr = td_alloc(a, 1, 2 * MiB);
	td_send_lookup(a, 2, addr);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r');
	td_send_lookup(a, 3, addr + MiB);
	for (int i = 0; i < 50; i++) { /* the loop reads it: it waits for request 2's MR */
		td_pump();
		usleep(1000);
	}
	inject('F');
	soft_gate_release(gate, 1);
	pump_until(&td_manager->core.device.failed, true);
	mrd__response__free_unpacked(td_expect(a, 2, ENODEV), NULL);
	resp = td_recv_reply(a, NULL, NULL);
	ck_assert_ptr_nonnull(resp);
	ck_assert_uint_eq(resp->id, 3);
	ck_assert_msg(resp->status != 0 || !td_manager->core.device.failed,
		      "the lookup that waited was answered (%s) with keys 0x%x/0x%x while the "
		      "device was failed", resp->message,
		      resp->mr_lookup ? resp->mr_lookup->entries[0]->lkey : 0,
		      resp->mr_lookup ? resp->mr_lookup->entries[0]->rkey : 0);
	mrd__response__free_unpacked(resp, NULL);
	td_pump_until_zero(&td_manager->core.device.losing);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	td_free(a, 4, addr, 0);
	close(a);
	stop();
}
END_TEST

/* DEVICE_FATAL while a worker's registration is held in the provider: the loop marks the
 * context lost and goes on serving (another client's Ping answered, its Lookup refused at
 * once with ENODEV), the context lets go once the registration ends (device.losing back to
 * 0), and the device's return waits for that; then everything adds up to nothing. */
START_TEST(test_fatal_during_registration_loop_serves)
{
	int a, b;
	uint64_t addr, small;
	pthread_t t;
	double t0, waited;
	struct domain *d;
	struct provider_stats ps;
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	Mrd__MrEntry now = MRD__MR_ENTRY__INIT;
	Mrd__Response *held;

	start();
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1000, NULL);
	addr = td_alloc(a, 1, 2 * MiB);
	small = td_alloc(b, 1, 64 * 1024);
	d = domain_of(addr);
	td_send_lookup(a, 2, addr);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r'); /* a worker holds the provider */
	ck_assert_int_eq(pthread_create(&t, NULL, release_when_told, NULL), 0);

	inject('F');
	t0 = now_s();
	pump_until(&td_manager->core.device.failed, true);
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	td_send_request(b, &req, NULL, 0);
	mrd__response__free_unpacked(td_expect(b, 3, 0), NULL);
	td_lookup(b, 4, small, ENODEV, NULL);
	waited = now_s() - t0;
	ck_assert_msg(waited < NOT_WAITED_S, "the loop stood still %.1f s behind a worker's "
		      "registration after DEVICE_FATAL (another client's Ping waited)", waited);
	ck_assert_uint_eq(td_manager->core.device.losing, 1); /* the registration still holds it */
	inject('R');
	for (int i = 0; i < 1200; i++) { /* the timer ticks: no return before the loss ended */
		td_pump();
		usleep(1000);
	}
	ck_assert(td_manager->core.device.failed);
	__atomic_store_n(&release_now, 1, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	held = td_recv_reply(a, NULL, NULL);
	ck_assert_ptr_nonnull(held);
	ck_assert_uint_eq(held->id, 2);
	/* A worker preempted between the registration and its completion lets the lose job and
	 * the device's return (a revive job) pass it: then the answer comes after the return
	 * and must carry the keys the MR has on the returned device, never the failed one's. */
	ck_assert_msg(held->status == ENODEV || (held->status == 0 && !td_manager->core.device.failed),
		      "the held registration answered %d (%s) while the device was failed",
		      held->status, held->message);
	td_pump_until_zero(&td_manager->core.device.losing);
	pump_until(&td_manager->core.device.failed, false);
	td_lookup(a, 5, addr, 0, &now);
	fprintf(stderr, "the held registration was answered %s the device's return\n",
		held->status == 0 ? "after" : "before");
	if (held->status == 0)
		ck_assert_msg(held->mr_lookup->entries[0]->lkey == now.lkey &&
			      held->mr_lookup->entries[0]->rkey == now.rkey,
			      "answered after the return with keys 0x%x/0x%x, the device has 0x%x/0x%x",
			      held->mr_lookup->entries[0]->lkey, held->mr_lookup->entries[0]->rkey,
			      now.lkey, now.rkey);
	mrd__response__free_unpacked(held, NULL);
	td_free(a, 6, addr, 0);
	td_free(b, 7, small, 0);
	td_pump_until(!d->mem.allocated_bytes);
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert_uint_eq(ps.pinned_bytes, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(a);
	close(b);
	stop();
}
END_TEST

/* The domain's only client leaves while its context waits, marked lost, for the held
 * registration: the domain stays until the context let go (its lose job holds it), then
 * closes; the device returns with no domain left (ASan: nothing used after its free). */
START_TEST(test_fatal_during_registration_client_leaves)
{
	int a;
	uint64_t addr;

	a = fatal_during_registration(&addr);
	pump_until(&td_manager->core.device.failed, true);
	close(a);
	for (int i = 0; i < 100; i++) {
		td_pump();
		usleep(1000);
	}
	ck_assert_uint_eq(td_manager->core.device.losing, 1);
	ck_assert_uint_eq(td_manager->core.n_domains, 1); /* held by the lose job */
	soft_gate_release(gate, 1);
	td_pump_until_zero(&td_manager->core.device.losing);
	td_wait_domains_closed();
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	stop();
}
END_TEST

/* mlx5's keys (MRD_SOFT_KEYS=mlx5): after the device's return each MR is made again; a key
 * a peer kept from before the failure must reach nothing, least of all another MR's memory. */
START_TEST(test_revive_old_key_reaches_other_mr)
{
	static char buf[2][4096] __attribute__((aligned(4096)));
	struct provider *p;
	struct provider_pd *pd;
	struct provider_mr *mr[2];
	struct provider_event ev;
	uint32_t old[2];
	unsigned rw = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	int r;

	snprintf(dir, sizeof(dir), "/tmp/mrd-test-device-race.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/events", dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_EVENTS", fifo, 1), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_KEYS", "mlx5", 1), 0);
	events_fd = open(fifo, O_RDWR | O_CLOEXEC);
	ck_assert_int_eq(provider_soft_ops.open(NULL, &p), 0);
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(provider_reg(pd, buf[i], 4096, (uintptr_t)buf[i], rw, &mr[i]), 0);
		old[i] = mr[i]->rkey;
	}
	inject('F');
	ck_assert_int_eq(provider_read_event(p, &ev), 0);
	provider_lose(p);
	inject('R');
	ck_assert_int_eq(provider_revive(p), 0);
	fprintf(stderr, "keys before: %#x %#x, after: %#x %#x\n", old[0], old[1], mr[0]->rkey,
		mr[1]->rkey);
	/* A peer of MR 0's owner writes with MR 0's old rkey, at MR 1's address. */
	strcpy(buf[0], "mine");
	strcpy(buf[1], "theirs");
	r = provider_dma(pd, PROVIDER_DMA_WRITE, mr[0]->lkey, (uintptr_t)buf[0], old[0],
			 (uintptr_t)buf[1], 5);
	ck_assert_msg(r < 0, "MR 0's key from before the failure wrote into MR 1 (\"%s\")", buf[1]);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(provider_dereg(mr[i]), 0);
	ck_assert_int_eq(provider_pd_free(pd), 0);
	provider_close(p);
	unsetenv("MRD_SOFT_KEYS");
	unsetenv("MRD_SOFT_EVENTS");
	close(events_fd);
	unlink(fifo);
	rmdir(dir);
}
END_TEST

/* mlx5's keys: an MR deregistered before the failure leaves its mkey in the cache; after the
 * return (a reset device's cache starts empty) a new MR of that size must not get that key. */
START_TEST(test_revive_cached_key_not_reused)
{
	static char buf[2][4096] __attribute__((aligned(4096)));
	unsigned rw = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	struct provider *p;
	struct provider_pd *pd;
	struct provider_mr *mr, *kept, *again;
	struct provider_event ev;
	uint32_t old, kept_old;

	snprintf(dir, sizeof(dir), "/tmp/mrd-test-device-race.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/events", dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_EVENTS", fifo, 1), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_KEYS", "mlx5", 1), 0);
	events_fd = open(fifo, O_RDWR | O_CLOEXEC);
	ck_assert_int_eq(provider_soft_ops.open(NULL, &p), 0);
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	ck_assert_int_eq(provider_reg(pd, buf[0], 4096, (uintptr_t)buf[0], rw, &mr), 0);
	ck_assert_int_eq(provider_reg(pd, buf[1], 4096, (uintptr_t)buf[1], rw, &kept), 0);
	old = mr->rkey;
	kept_old = kept->rkey;
	ck_assert_int_eq(provider_dereg(mr), 0); /* its mkey goes to the 1-page cache entry */
	inject('F');
	ck_assert_int_eq(provider_read_event(p, &ev), 0);
	provider_lose(p);
	inject('R');
	ck_assert_int_eq(provider_revive(p), 0);
	ck_assert_uint_ne(kept->rkey, kept_old);
	ck_assert_int_eq(provider_reg(pd, buf[0], 4096, (uintptr_t)buf[0], rw, &again), 0);
	ck_assert_msg(again->rkey != old && again->rkey != kept_old, "a key from before the failure "
		      "(%#x) names a new MR after the return", again->rkey);
	ck_assert_int_eq(provider_dereg(again), 0);
	ck_assert_int_eq(provider_dereg(kept), 0);
	ck_assert_int_eq(provider_pd_free(pd), 0);
	provider_close(p);
	unsetenv("MRD_SOFT_KEYS");
	unsetenv("MRD_SOFT_EVENTS");
	close(events_fd);
	unlink(fifo);
	rmdir(dir);
}
END_TEST

/* A prefetch of on-demand memory held in its advice (off the provider's lock) while the device
 * fails and comes back; then everything is freed: nothing stays pinned, counted or alive. */
START_TEST(test_fail_and_return_during_prefetch)
{
	int a;
	uint64_t odp;
	struct domain *d;
	struct provider_stats ps;
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PrefetchRequest q = MRD__PREFETCH_REQUEST__INIT;
	Mrd__Response *resp;

	start();
	a = td_hello_client(1000, NULL);
	odp = td_alloc_flags(a, 1, 2 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	d = domain_of(odp);
	q.address = odp;
	q.length = 2 * MiB;
	q.advice = MRD__PREFETCH_ADVICE__PREFETCH_WRITE;
	q.flush = true;
	req.id = 2;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &q;
	td_send_request(a, &req, NULL, 0);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r'); /* its child */
	soft_gate_release(gate, 1);
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'a'); /* advising, off the lock */
	inject('F');
	pump_until(&td_manager->core.device.failed, true);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	soft_gate_release(gate, 1);
	resp = td_expect(a, 2, 0);
	mrd__response__free_unpacked(resp, NULL);
	td_lookup(a, 3, odp, 0, NULL);
	td_free(a, 4, odp, 0);
	td_pump_until(!d->mem.allocated_bytes && !d->reg.odp.children);
	provider_stats(d->reg.base.provider, &ps);
	fprintf(stderr, "after: mrs %llu pinned %llu children %u allocated %llu\n",
		(unsigned long long)ps.mrs, (unsigned long long)ps.pinned_bytes,
		(unsigned)d->reg.odp.children, (unsigned long long)d->mem.allocated_bytes);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert_uint_eq(d->reg.odp.children, 0);
	ck_assert_uint_eq(d->mem.allocated_bytes, 0);
	close(a);
	stop();
}
END_TEST

/* A run quarantined (its dereg failed) when the device fails and comes back; then the
 * quarantine is retried (as each flush does): nothing stays pinned, counted or alive. */
START_TEST(test_quarantined_run_through_failure)
{
	int a;
	uint64_t addr;
	struct domain *d;
	struct provider_stats ps;

	ck_assert_int_eq(setenv("MRD_SOFT_DEREG_FAIL", "2", 1), 0);
	start();
	a = td_hello_client(1000, NULL);
	addr = td_alloc(a, 1, 64 * 1024); /* the domain's context opens with the knob */
	unsetenv("MRD_SOFT_DEREG_FAIL");
	d = domain_of(addr);
	td_lookup(a, 2, addr, 0, NULL);
	td_free(a, 3, addr, 0);
	td_pump_until(d->reg.quarantine.n != 0);
	ck_assert_uint_eq(d->reg.quarantine.n, 1);
	inject('F');
	pump_until(&td_manager->core.device.failed, true);
	provider_stats(d->reg.base.provider, &ps);
	fprintf(stderr, "failed: mrs %llu pinned %llu quarantine %u/%llu charges %llu\n",
		(unsigned long long)ps.mrs, (unsigned long long)ps.pinned_bytes,
		(unsigned)d->reg.quarantine.n, (unsigned long long)d->reg.quarantine.bytes,
		(unsigned long long)d->reg.cache.charges.pinned_bytes);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	provider_stats(d->reg.base.provider, &ps);
	fprintf(stderr, "back: mrs %llu pinned %llu quarantine %u/%llu charges %llu\n",
		(unsigned long long)ps.mrs, (unsigned long long)ps.pinned_bytes,
		(unsigned)d->reg.quarantine.n, (unsigned long long)d->reg.quarantine.bytes,
		(unsigned long long)d->reg.cache.charges.pinned_bytes);
	/* The lost context's MRs could all be let go (a lost MR's dereg cannot fail); the run was
	 * freed: no MR of it should come back with a working key and pins. */
	ck_assert_msg(ps.mrs == 0 && ps.pinned_bytes == 0, "the device's return made an MR over the "
		      "freed, quarantined run again: %llu MR(s), %llu bytes pinned",
		      (unsigned long long)ps.mrs, (unsigned long long)ps.pinned_bytes);
	(void)registrar_retry_quarantine(&d->reg);
	td_pump_until(!d->mem.allocated_bytes);
	provider_stats(d->reg.base.provider, &ps);
	fprintf(stderr, "retried: mrs %llu pinned %llu quarantine %u/%llu charges %llu alloc %llu\n",
		(unsigned long long)ps.mrs, (unsigned long long)ps.pinned_bytes,
		(unsigned)d->reg.quarantine.n, (unsigned long long)d->reg.quarantine.bytes,
		(unsigned long long)d->reg.cache.charges.pinned_bytes,
		(unsigned long long)d->mem.allocated_bytes);
	ck_assert_uint_eq(d->reg.quarantine.n, 0);
	ck_assert_uint_eq(ps.mrs + ps.parked, 0);
	ck_assert_uint_eq(ps.pinned_bytes, 0);
	ck_assert_uint_eq(d->reg.cache.charges.pinned_bytes, 0);
	close(a);
	stop();
}
END_TEST

static void pump_for(double seconds)
{
	double t0 = now_s();

	while (now_s() - t0 < seconds) {
		td_pump();
		usleep(1000);
	}
}

/* The device returns, but one domain's context cannot be made again (the first two tries):
 * the return is all or nothing, so no other domain's context stays open, its MRs registered
 * again, while the device still counts as failed (a second failure or removal would find it). */
START_TEST(test_partial_return)
{
	int a, b;
	uint64_t addr_a, addr_b;
	struct domain *da, *db = NULL, *d;
	struct provider_stats ps;

	start();
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1001, NULL);
	ck_assert_int_eq(setenv("MRD_SOFT_REVIVE_FAIL", "2", 1), 0);
	addr_a = td_alloc(a, 1, 64 * 1024); /* A's context opens with the knob */
	unsetenv("MRD_SOFT_REVIVE_FAIL");
	da = domain_of(addr_a);
	addr_b = td_alloc(b, 1, 64 * 1024);
	LIST_FOREACH(d, &td_manager->core.domains, link)
		if (d != da && d->mem.allocated_bytes > 0)
			db = d;
	ck_assert_ptr_nonnull(db);
	ck_assert_ptr_eq(LIST_FIRST(&td_manager->core.domains), db); /* revived before A */
	td_lookup(a, 2, addr_a, 0, NULL);
	td_lookup(b, 2, addr_b, 0, NULL);
	inject('F');
	pump_until(&td_manager->core.device.failed, true);
	inject('R');
	pump_for(1.2); /* one or two ticks: A's context refused each */
	/* the revive jobs (on workers) done, and the lose jobs after the refusal */
	td_pump_until_zero(&td_manager->core.device.reviving);
	td_pump_until_zero(&td_manager->core.device.losing);
	ck_assert(td_manager->core.device.failed);
	provider_stats(db->reg.base.provider, &ps);
	ck_assert_msg(ps.mrs == 0 && ps.pinned_bytes == 0, "the device counts as failed, yet "
		      "domain B's context is open again with %llu MR(s) (%llu bytes pinned)",
		      (unsigned long long)ps.mrs, (unsigned long long)ps.pinned_bytes);
	pump_until(&td_manager->core.device.failed, false); /* the third try: all back */
	provider_stats(db->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	provider_stats(da->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	td_lookup(a, 3, addr_a, 0, NULL);
	td_lookup(b, 3, addr_b, 0, NULL);
	td_free(a, 4, addr_a, 0);
	td_free(b, 4, addr_b, 0);
	close(a);
	close(b);
	stop();
}
END_TEST

/* Review 2: the registration a worker held when DEVICE_FATAL came ends after the loop marked
 * the context lost and told every other client ENODEV: its Lookup is answered 0 with the
 * keys of an MR on the failed device (the lose job deregisters it right after). */
START_TEST(test_held_registration_answered_after_failure)
{
	int a;
	uint64_t addr;
	Mrd__Response *resp;

	a = fatal_during_registration(&addr);
	pump_until(&td_manager->core.device.failed, true);
	soft_gate_release(gate, 1);
	resp = td_recv_reply(a, NULL, NULL);
	ck_assert_ptr_nonnull(resp);
	ck_assert_msg(resp->status == ENODEV, "a Lookup answered after the device failed (the "
		      "loop told others ENODEV): status %d, lkey 0x%x", resp->status,
		      resp->body_case == MRD__RESPONSE__BODY_MR_LOOKUP && resp->mr_lookup->n_entries ?
		      resp->mr_lookup->entries[0]->lkey : 0);
	mrd__response__free_unpacked(resp, NULL);
	td_pump_until_zero(&td_manager->core.device.losing);
	close(a);
	stop();
}
END_TEST

/* Review 2: mrd stops (SIGTERM: manager_free) while a domain's lose job waits behind a held
 * registration: no hang once it ends, nothing used after its free (ASan). */
START_TEST(test_stop_while_lose_waits)
{
	int a;
	uint64_t addr;
	pthread_t t;

	a = fatal_during_registration(&addr);
	pump_until(&td_manager->core.device.failed, true);
	ck_assert_uint_eq(td_manager->core.device.losing, 1);
	ck_assert_int_eq(pthread_create(&t, NULL, release_later, NULL), 0);
	close(a);
	stop();
	pthread_join(t, NULL);
}
END_TEST

/* Review 2: the device's return registers every MR again (verbs: one ibv_reg_mr_iova2 each,
 * pinning anew, seconds for GiBs): a revive held at the gate ($MRD_SOFT_GATE_REVIVE) must not
 * hold the loop, which serves another client's Ping meanwhile and refuses what needs the
 * device with its message until every domain is back. */
static int revive_entered;
static bool revive_served, revive_timed_out;

static void *hold_revive(void *arg)
{
	int c;

	(void)arg;
	while ((c = soft_gate_wait(gate, 20000)) == 'r') /* the registration: let it go */
		soft_gate_release(gate, 1);
	__atomic_store_n(&revive_entered, c, __ATOMIC_RELEASE);
	test_wait_until(__atomic_load_n(&revive_served, __ATOMIC_ACQUIRE), 1000);
	__atomic_store_n(&revive_timed_out, !__atomic_load_n(&revive_served, __ATOMIC_ACQUIRE),
			 __ATOMIC_RELEASE);
	soft_gate_release(gate, 1); /* else a stuck loop hangs the test */
	return NULL;
}

START_TEST(test_held_revive_loop_serves)
{
	int a, b;
	uint64_t addr;
	pthread_t t;
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	Mrd__Response *resp;

	ck_assert_int_eq(setenv("MRD_SOFT_GATE_REVIVE", "1", 1), 0);
	start(); /* each domain's context reads it when it opens */
	revive_entered = 0;
	revive_served = revive_timed_out = false;
	ck_assert_int_eq(pthread_create(&t, NULL, hold_revive, NULL), 0);
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1001, NULL);
	addr = td_alloc(a, 1, 2 * MiB);
	td_lookup(a, 2, addr, 0, NULL);
	inject('F');
	pump_until(&td_manager->core.device.failed, true);
	td_pump_until_zero(&td_manager->core.device.losing);
	inject('R');
	td_pump_until(__atomic_load_n(&revive_entered, __ATOMIC_ACQUIRE));
	ck_assert_int_eq(__atomic_load_n(&revive_entered, __ATOMIC_ACQUIRE), 'v');
	ck_assert_msg(!__atomic_load_n(&revive_timed_out, __ATOMIC_ACQUIRE),
		      "the loop stood still while a domain's revive was held");
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	td_send_request(b, &req, NULL, 0);
	mrd__response__free_unpacked(td_expect(b, 3, 0), NULL);
	td_send_lookup(a, 4, addr);
	resp = td_expect(a, 4, ENODEV);
	ck_assert_str_eq(resp->message,
			 "device soft failed (DEVICE_FATAL); mrd reopens it when it returns");
	mrd__response__free_unpacked(resp, NULL);
	ck_assert(td_manager->core.device.failed);
	__atomic_store_n(&revive_served, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	ck_assert(!revive_timed_out);
	pump_until(&td_manager->core.device.failed, false);
	ck_assert_uint_eq(td_manager->core.device.returns, 1);
	td_lookup(a, 5, addr, 0, NULL);
	td_free(a, 6, addr, 0);
	close(a);
	close(b);
	stop();
	unsetenv("MRD_SOFT_GATE_REVIVE");
}
END_TEST

/* Pumps the loop until a gated op enters (its char), or -ETIMEDOUT after TEST_WAIT_S. */
static int pump_until_gated(void)
{
	int c = -ETIMEDOUT;

	td_pump_until((c = soft_gate_wait(gate, 1)) != -ETIMEDOUT);
	return c;
}

/* Review 2: the all-or-none return when one domain cannot come back: B's revive (held at the
 * gate, as a big re-registration) and A's refusal; the loop serves throughout, B lets go
 * again once its revive ends, and the next tick brings both back. */
START_TEST(test_held_revive_partial_failure)
{
	int a, b;
	uint64_t addr_a, addr_b;
	struct domain *db;
	struct provider_stats ps;
	Mrd__Response *resp;

	ck_assert_int_eq(setenv("MRD_SOFT_GATE_REVIVE", "1", 1), 0);
	start();
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1001, NULL);
	ck_assert_int_eq(setenv("MRD_SOFT_REVIVE_FAIL", "1", 1), 0);
	addr_a = td_alloc(a, 1, 64 * 1024); /* A's context opens with the knob: under the gate */
	unsetenv("MRD_SOFT_REVIVE_FAIL");
	addr_b = td_alloc(b, 1, 2 * MiB);
	db = domain_of(addr_b);
	td_lookup(a, 2, addr_a, 0, NULL);
	td_send_lookup(b, 2, addr_b);
	ck_assert_int_eq(pump_until_gated(), 'r');
	soft_gate_release(gate, 1);
	mrd__response__free_unpacked(td_expect(b, 2, 0), NULL);
	inject('F');
	pump_until(&td_manager->core.device.failed, true);
	td_pump_until_zero(&td_manager->core.device.losing);
	inject('R');
	ck_assert_int_eq(pump_until_gated(), 'v'); /* B's revive holds its provider */
	pump_for(1.2); /* a tick meanwhile starts no other revive */
	td_send_lookup(a, 3, addr_a);
	resp = td_expect(a, 3, ENODEV);
	ck_assert_str_eq(resp->message,
			 "device soft failed (DEVICE_FATAL); mrd reopens it when it returns");
	mrd__response__free_unpacked(resp, NULL);
	/* A's refusal comes back from its worker. */
	td_pump_until(td_manager->core.device.reviving == 1);
	ck_assert_uint_eq(td_manager->core.device.reviving, 1);
	soft_gate_release(gate, 1);
	td_pump_until_zero(&td_manager->core.device.reviving); /* A refused: all let go */
	td_pump_until_zero(&td_manager->core.device.losing);
	ck_assert(td_manager->core.device.failed);
	provider_stats(db->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 0);
	ck_assert_int_eq(pump_until_gated(), 'v'); /* the next tick: B's again */
	soft_gate_release(gate, 1);
	pump_until(&td_manager->core.device.failed, false);
	ck_assert_uint_eq(td_manager->core.device.returns, 1);
	provider_stats(db->reg.base.provider, &ps);
	ck_assert_uint_eq(ps.mrs, 1);
	td_lookup(a, 4, addr_a, 0, NULL);
	td_lookup(b, 4, addr_b, 0, NULL);
	td_free(a, 5, addr_a, 0);
	td_free(b, 5, addr_b, 0);
	close(a);
	close(b);
	stop();
	unsetenv("MRD_SOFT_GATE_REVIVE");
}
END_TEST

/* mrd stops while a domain's revive job is held: the pool runs it to its end, and its done
 * neither commits nor starts lose jobs on a pool that is going (no hang, nothing used after
 * its free: ASan). */
START_TEST(test_stop_while_revive_held)
{
	int a, b;
	uint64_t addr;
	pthread_t t;

	ck_assert_int_eq(setenv("MRD_SOFT_GATE_REVIVE", "1", 1), 0);
	start();
	a = td_hello_client(1000, NULL);
	b = td_hello_client(1001, NULL);
	ck_assert_int_eq(setenv("MRD_SOFT_REVIVE_FAIL", "1", 1), 0);
	(void)td_alloc(b, 1, 64 * 1024); /* B's context refuses its revive: all or none fails */
	unsetenv("MRD_SOFT_REVIVE_FAIL");
	addr = td_alloc(a, 1, 2 * MiB);
	td_send_lookup(a, 2, addr);
	ck_assert_int_eq(pump_until_gated(), 'r');
	soft_gate_release(gate, 1);
	mrd__response__free_unpacked(td_expect(a, 2, 0), NULL);
	inject('F');
	pump_until(&td_manager->core.device.failed, true);
	td_pump_until_zero(&td_manager->core.device.losing);
	inject('R');
	ck_assert_int_eq(pump_until_gated(), 'v');
	/* B's refusal comes back from its worker. */
	td_pump_until(td_manager->core.device.reviving == 1);
	ck_assert_uint_eq(td_manager->core.device.reviving, 1);
	ck_assert_int_eq(pthread_create(&t, NULL, release_later, NULL), 0);
	close(a);
	close(b);
	stop();
	pthread_join(t, NULL);
	unsetenv("MRD_SOFT_GATE_REVIVE");
}
END_TEST

/* Nothing of d's is registered, parked or pinned any more. */
static bool all_released(struct domain *d)
{
	struct provider_stats ps;

	provider_stats(d->reg.base.provider, &ps);
	return ps.mrs + ps.parked == 0 && ps.pinned_bytes == 0 &&
	       d->reg.cache.charges.pinned_bytes == 0 && td_manager->core.pinned_bytes == 0;
}

/* Review 2: two failures and returns in a row, with a freed allocation's MR parked in the
 * pools and one live: once everything is freed and flushed nothing stays counted. */
START_TEST(test_two_failures_counters)
{
	int a;
	uint64_t x, y;
	struct domain *d;
	struct provider_stats ps;
	struct flush_counts fc;

	start();
	a = td_hello_client(1000, NULL);
	x = td_alloc(a, 1, 2 * MiB);
	y = td_alloc(a, 2, 64 * 1024);
	d = domain_of(x);
	td_send_lookup(a, 3, x);
	td_pump();
	ck_assert_int_eq(soft_gate_wait(gate, 10000), 'r');
	soft_gate_release(gate, 1);
	mrd__response__free_unpacked(td_expect(a, 3, 0), NULL);
	td_lookup(a, 4, y, 0, NULL);
	td_free(a, 5, y, 0);
	for (int round = 0; round < 2; round++) {
		inject('F');
		pump_until(&td_manager->core.device.failed, true);
		inject('R');
		pump_until(&td_manager->core.device.failed, false);
	}
	provider_stats(d->reg.base.provider, &ps);
	fprintf(stderr, "after F R F R: mrs %llu parked %llu pinned %llu host %llu\n",
		(unsigned long long)ps.mrs, (unsigned long long)ps.parked,
		(unsigned long long)ps.pinned_bytes,
		(unsigned long long)td_manager->core.pinned_bytes);
	td_free(a, 6, x, 0);
	td_pump_until(!d->mem.allocated_bytes);
	(void)domains_flush(&td_manager->core, NULL, true, true, &fc);
	td_pump_until(all_released(d)); /* the flush's deregs run on workers */
	provider_stats(d->reg.base.provider, &ps);
	ck_assert_msg(ps.mrs + ps.parked == 0 && ps.pinned_bytes == 0 &&
		      d->reg.cache.charges.pinned_bytes == 0 && td_manager->core.pinned_bytes == 0,
		      "after two failures, all freed and flushed: mrs %llu parked %llu pinned %llu "
		      "charges %llu host %llu", (unsigned long long)ps.mrs,
		      (unsigned long long)ps.parked, (unsigned long long)ps.pinned_bytes,
		      (unsigned long long)d->reg.cache.charges.pinned_bytes,
		      (unsigned long long)td_manager->core.pinned_bytes);
	close(a);
	stop();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("device-race");
	TCase *tc = tcase_create("race");

	/* A minute: its waits are TEST_WAIT_S each; sanitizers on a busy machine are slow. */
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_port_event_during_registration);
	tcase_add_test(tc, test_fatal_during_registration_accounting);
	tcase_add_test(tc, test_fatal_during_registration_loop_serves);
	tcase_add_test(tc, test_fatal_during_registration_waiter_refused);
	tcase_add_test(tc, test_fatal_during_registration_client_leaves);
	tcase_add_test(tc, test_revive_old_key_reaches_other_mr);
	tcase_add_test(tc, test_revive_cached_key_not_reused);
	tcase_add_test(tc, test_fail_and_return_during_prefetch);
	tcase_add_test(tc, test_quarantined_run_through_failure);
	tcase_add_test(tc, test_partial_return);
	tcase_add_test(tc, test_held_registration_answered_after_failure);
	tcase_add_test(tc, test_stop_while_lose_waits);
	tcase_add_test(tc, test_two_failures_counters);
	tcase_add_test(tc, test_held_revive_loop_serves);
	tcase_add_test(tc, test_held_revive_partial_failure);
	tcase_add_test(tc, test_stop_while_revive_held);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(suite());
}
