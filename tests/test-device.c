/* SPDX-License-Identifier: MIT */
/* The device's lifecycle (daemon/core/device.h), on the soft device driven through
 * $MRD_SOFT_EVENTS: a failure refuses what needs the device with a clear error while Ping and
 * Status go on, drops the MRs and moves the generation; the device's return serves again;
 * an event of an object that is not mrd's only counts. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "control/manager.h"
#include "core/domain.h"
#include "provider/provider.h"
#include "test-daemon.h"
#include "control/client.h"
#include "core/domain.h"
#include "registration/bound-pd.h"
#include "wire.h"
#include "check-run.h"

static char dir[64], fifo[96];
static int events_fd = -1;

static void setup_with(const char *setting)
{
	const char *settings[] = { "mrd.provider=soft", "memory.window_size=4G",
				   "memory.arena_size=64M", "memory.hugepages=no", setting, NULL };

	snprintf(dir, sizeof(dir), "/tmp/mrd-test-device.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/events", dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_EVENTS", fifo, 1), 0);
	events_fd = open(fifo, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(events_fd, 0);
	td_start(settings);
}

static void setup(void) { setup_with(NULL); }

static void teardown(void)
{
	td_stop();
	close(events_fd);
	unsetenv("MRD_SOFT_EVENTS");
	unlink(fifo);
	rmdir(dir);
}

static void inject(char c)
{
	ck_assert_int_eq(write(events_fd, &c, 1), 1);
}

/* Runs the loop until *flag is want (the reopen timer ticks each second). */
static void pump_until(const bool *flag, bool want)
{
	td_pump_until(*flag == want);
	ck_assert(*flag == want);
}

/* The device failed and every domain's context let go: its lose job runs on a worker, so the
 * flag alone says nothing yet of the MRs. */
static void pump_until_let_go(void)
{
	pump_until(&td_manager->core.device.failed, true);
	td_pump_until_zero(&td_manager->core.device.losing);
}

static void send_simple(int fd, uint64_t id, int body_case)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	Mrd__StatusRequest status = MRD__STATUS_REQUEST__INIT;

	req.id = id;
	req.body_case = body_case;
	if (body_case == MRD__REQUEST__BODY_PING)
		req.ping = &ping;
	else
		req.status = &status;
	td_send_request(fd, &req, NULL, 0);
}

static struct domain *domain_with_memory(void)
{
	struct domain *d;

	LIST_FOREACH(d, &td_manager->core.domains, link)
		if (d->mem.allocated_bytes > 0)
			return d;
	ck_abort_msg("no domain holds memory");
	return NULL;
}

static uint64_t generation(const struct domain *d)
{
	return __atomic_load_n(&d->mem.status.page->generation, __ATOMIC_ACQUIRE);
}

static uint64_t live_mrs(const struct domain *d)
{
	struct provider_stats st;

	provider_stats(d->reg.base.provider, &st);
	return st.mrs;
}

START_TEST(test_fatal_then_back)
{
	int a = td_hello_client(1000, NULL), b = td_hello_client(1001, NULL);
	Mrd__MrEntry before = MRD__MR_ENTRY__INIT, after = MRD__MR_ENTRY__INIT;
	uint64_t addr = td_alloc(a, 1, 1 << 20), g0, g1;
	struct domain *d;
	Mrd__Response *resp;

	td_lookup(a, 2, addr, 0, &before);
	d = domain_with_memory();
	ck_assert_uint_eq(live_mrs(d), 1);
	g0 = generation(d);

	inject('F');
	pump_until_let_go();
	ck_assert_uint_eq(td_manager->core.device.failures, 1);
	/* The MRs are gone, and every cached key is stale. */
	ck_assert_uint_eq(live_mrs(d), 0);
	g1 = generation(d);
	ck_assert_uint_gt(g1, g0);

	/* What needs the device: a clear error, not EIO. */
	td_send_lookup(a, 3, addr);
	resp = td_expect(a, 3, ENODEV);
	ck_assert_str_eq(resp->message,
			 "device soft failed (DEVICE_FATAL); mrd reopens it when it returns");
	mrd__response__free_unpacked(resp, NULL);
	td_send_lookup(a, 4, addr + 4096);
	mrd__response__free_unpacked(td_expect(a, 4, ENODEV), NULL);

	/* Another client is served meanwhile, and Status says why. */
	send_simple(b, 5, MRD__REQUEST__BODY_PING);
	mrd__response__free_unpacked(td_expect(b, 5, 0), NULL);
	send_simple(b, 6, MRD__REQUEST__BODY_STATUS);
	resp = td_expect(b, 6, 0);
	ck_assert_str_eq(resp->status_reply->device_state, "failed");
	ck_assert_str_eq(resp->status_reply->device_failure, "DEVICE_FATAL");
	ck_assert_uint_gt(resp->status_reply->device_failed_since, 0);
	mrd__response__free_unpacked(resp, NULL);

	/* Back: the same memory is registered again, with new keys. */
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	ck_assert_uint_eq(td_manager->core.device.returns, 1);
	ck_assert_uint_gt(generation(d), g1);
	ck_assert_uint_eq(live_mrs(d), 1);
	td_lookup(a, 7, addr, 0, &after);
	ck_assert_uint_ne(after.rkey, before.rkey);
	ck_assert_uint_eq(td_alloc(a, 8, 1 << 20) != 0, 1);
	close(a);
	close(b);
}
END_TEST

/* A client bound to its own PD on the failed device: its context died with the device, so its
 * cache answers no key, during the failure or after the return (the domain's do again). */
START_TEST(test_bound_pd_lost_with_the_device)
{
	struct client *c;
	int a = td_hello_client(1000, &c);
	uint64_t addr = td_alloc(a, 1, 1 << 20), other = td_alloc(a, 2, 1 << 20);
	struct provider *p;
	struct provider_pd *pd;
	Mrd__Response *resp;
	Mrd__MrEntry e;

	ck_assert_int_eq(provider_soft_ops.open(NULL, &p), 0);
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	ck_assert_int_eq(bound_pd_adopt(&c->domain->reg.cache, p, pd, "soft", 3, getpid(),
					&c->bound), 0);
	td_lookup(a, 3, addr, 0, &e);
	inject('F');
	pump_until_let_go();
	td_send_lookup(a, 4, addr);
	mrd__response__free_unpacked(td_expect(a, 4, ENODEV), NULL);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	/* Back, but not the client's context: the key in the bound table is refused too. */
	td_send_lookup(a, 5, addr);
	resp = td_expect(a, 5, ENODEV);
	ck_assert_msg(strstr(resp->message, "bind a new one"), "refused: %s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	td_send_lookup(a, 7, other);
	mrd__response__free_unpacked(td_expect(a, 7, ENODEV), NULL);
	td_free(a, 6, addr, 0); /* its MR goes all the same */
	ck_assert_uint_eq(c->bound->cache.n_mrs, 0);
	close(a);
}
END_TEST

START_TEST(test_alloc_refused_while_failed)
{
	int a = td_hello_client(1000, NULL);
	Mrd__Response *resp;
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest alloc = MRD__ALLOC_REQUEST__INIT;

	inject('F');
	pump_until(&td_manager->core.device.failed, true);
	alloc.size = 1 << 20;
	req.id = 1;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &alloc;
	td_send_request(a, &req, NULL, 0);
	resp = td_expect(a, 1, ENODEV);
	ck_assert_ptr_nonnull(strstr(resp->message, "device soft failed (DEVICE_FATAL)"));
	mrd__response__free_unpacked(resp, NULL);
	/* A request that needs no device but the domain, which cannot open now: the same. */
	td_send_free(a, 2, 1 << 30);
	resp = td_expect(a, 2, ENODEV);
	ck_assert_ptr_nonnull(strstr(resp->message, "device soft failed (DEVICE_FATAL)"));
	mrd__response__free_unpacked(resp, NULL);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	close(a);
}
END_TEST

START_TEST(test_port_and_foreign_events)
{
	int a = td_hello_client(1000, NULL);
	uint64_t addr = td_alloc(a, 1, 1 << 20);

	td_lookup(a, 2, addr, 0, NULL);
	ck_assert(td_manager->core.device.port_active);
	inject('D');
	td_pump_until(!td_manager->core.device.port_active);
	ck_assert(!td_manager->core.device.port_active);
	inject('U');
	td_pump_until(td_manager->core.device.port_active);
	ck_assert(td_manager->core.device.port_active);

	/* Counted, and nothing else. */
	inject('Q');
	td_pump_until(td_manager->core.device.foreign_events);
	ck_assert_uint_eq(td_manager->core.device.foreign_events, 1);
	ck_assert(!td_manager->core.device.failed);
	ck_assert_uint_eq(live_mrs(domain_with_memory()), 1);
	td_lookup(a, 3, addr, 0, NULL);
	close(a);
}
END_TEST

/* On-demand children and a mempool's MR live through the failure: made again, new keys. */
START_TEST(test_odp_and_mempool_come_back)
{
	int a;
	Mrd__MrEntry odp0 = MRD__MR_ENTRY__INIT, odp1 = MRD__MR_ENTRY__INIT;
	Mrd__MrEntry pool0 = MRD__MR_ENTRY__INIT, pool1 = MRD__MR_ENTRY__INIT;
	uint64_t odp_addr, pool_addr, start, length = 1 << 20, mrs;

	td_stop();
	setup_with("policies.uid-1000=odp");
	a = td_hello_client(1000, NULL);
	odp_addr = td_alloc(a, 1, 1 << 20);
	td_lookup(a, 2, odp_addr, 0, &odp0);
	pool_addr = td_alloc(a, 3, 1 << 20);
	start = pool_addr;
	td_send_mempool_register(a, 4, "pool", &start, &length, 1, false);
	mrd__response__free_unpacked(td_expect(a, 4, 0), NULL);
	td_lookup(a, 5, pool_addr, 0, &pool0);
	mrs = live_mrs(domain_with_memory());
	ck_assert_uint_ge(mrs, 2);

	inject('F');
	pump_until_let_go();
	ck_assert_uint_eq(live_mrs(domain_with_memory()), 0);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	ck_assert_uint_eq(live_mrs(domain_with_memory()), mrs);
	td_lookup(a, 6, odp_addr, 0, &odp1);
	td_lookup(a, 7, pool_addr, 0, &pool1);
	ck_assert_uint_ne(odp1.lkey, odp0.lkey);
	ck_assert_uint_ne(pool1.lkey, pool0.lkey);
	td_mempool_unregister(a, 8, "pool", 0);
	td_free(a, 9, odp_addr, 0);
	td_free(a, 10, pool_addr, 0);
	close(a);
}
END_TEST

/* rxe, siw, efa: a removal sends nothing; the check each second finds it. */
START_TEST(test_removed_found)
{
	int a = td_hello_client(1000, NULL);
	uint64_t addr = td_alloc(a, 1, 1 << 20);
	Mrd__Response *resp;

	td_lookup(a, 2, addr, 0, NULL);
	inject('G');
	pump_until_let_go();
	ck_assert_str_eq(td_manager->core.device.reason, "removed");
	ck_assert_uint_eq(live_mrs(domain_with_memory()), 0);
	td_send_lookup(a, 3, addr);
	resp = td_expect(a, 3, ENODEV);
	ck_assert_str_eq(resp->message,
			 "device soft failed (removed); mrd reopens it when it returns");
	mrd__response__free_unpacked(resp, NULL);
	inject('R');
	pump_until(&td_manager->core.device.failed, false);
	td_lookup(a, 4, addr, 0, NULL);
	close(a);
}
END_TEST

/* The soft device as a failed verbs device is: every op -EIO, a destroy too unless
 * RDMAV_ALLOW_DISASSOC_DESTROY; once lost, no key reaches memory; revived, new keys. */
START_TEST(test_soft_provider_failure)
{
	struct provider *p, *q, *gone;
	struct provider_pd *pd, *qpd;
	struct provider_mr *mr, *qmr, *other;
	struct provider_event ev;
	struct provider_stats st;
	static char buf[2][4096] __attribute__((aligned(4096)));
	uint32_t old_key;

	unsetenv("RDMAV_ALLOW_DISASSOC_DESTROY");
	ck_assert_int_eq(provider_soft_ops.open(NULL, &p), 0);
	ck_assert_int_eq(setenv("RDMAV_ALLOW_DISASSOC_DESTROY", "1", 1), 0);
	ck_assert_int_eq(provider_soft_ops.open(NULL, &q), 0);
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	ck_assert_int_eq(provider_pd_alloc(q, &qpd), 0);
	ck_assert_int_eq(provider_reg(pd, buf[0], 4096, (uintptr_t)buf[0], MRD_ACCESS_ALL & ~MRD_ACCESS_ON_DEMAND, &mr), 0);
	ck_assert_int_eq(provider_reg(qpd, buf[1], 4096, (uintptr_t)buf[1], MRD_ACCESS_LOCAL_WRITE, &qmr), 0);
	ck_assert_int_ge(provider_event_fd(p), 0);
	ck_assert_int_eq(provider_read_event(p, &ev), -EAGAIN);

	inject('F');
	ck_assert_int_eq(provider_read_event(p, &ev), 0);
	ck_assert_int_eq(ev.kind, PROVIDER_EVENT_DEVICE_FATAL);
	ck_assert_int_eq(provider_reg(pd, buf[1], 4096, (uintptr_t)buf[1], MRD_ACCESS_LOCAL_WRITE, &other), -EIO);
	ck_assert_int_eq(provider_soft_ops.open(NULL, &gone), -ENODEV);
	ck_assert_int_eq(provider_dereg(qmr), 0); /* RDMAV_ALLOW_DISASSOC_DESTROY */
	old_key = mr->rkey;
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, mr->lkey, (uintptr_t)buf[0], mr->rkey,
				      (uintptr_t)buf[0], 8), -EIO);

	provider_lose(p);
	provider_stats(p, &st);
	ck_assert_uint_eq(st.mrs, 0);
	ck_assert_int_eq(provider_event_fd(p), -1);
	ck_assert_int_eq(provider_revive(p), -ENODEV);
	inject('R');
	ck_assert_int_eq(provider_revive(p), 0);
	provider_stats(p, &st);
	ck_assert_uint_eq(st.mrs, 1);
	ck_assert_uint_ne(mr->rkey, old_key);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, mr->lkey, (uintptr_t)buf[0], old_key,
				      (uintptr_t)buf[0], 8), -ENOKEY); /* soft: no such key */
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, mr->lkey, (uintptr_t)buf[0], mr->rkey,
				      (uintptr_t)buf[0], 8), 0);

	/* Without RDMAV_ALLOW_DISASSOC_DESTROY a destroy on the failed device is EIO, as
	 * libibverbs' is; once lost, it succeeds. */
	inject('F');
	ck_assert_int_eq(provider_read_event(p, &ev), 0);
	ck_assert_int_eq(provider_dereg(mr), -EIO);
	provider_lose(p);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_pd_free(pd), 0);
	inject('R');
	ck_assert_int_eq(provider_revive(q), 0);
	ck_assert_int_eq(provider_pd_free(qpd), 0);
	provider_close(p);
	provider_close(q);
	unsetenv("RDMAV_ALLOW_DISASSOC_DESTROY");
}
END_TEST

static Suite *device_suite(void)
{
	Suite *s = suite_create("device");
	TCase *tc = tcase_create("lifecycle");

	tcase_add_checked_fixture(tc, setup, teardown);
	/* A minute: its waits are TEST_WAIT_S each; sanitizers on a busy machine are slow. */
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_fatal_then_back);
	tcase_add_test(tc, test_alloc_refused_while_failed);
	tcase_add_test(tc, test_bound_pd_lost_with_the_device);
	tcase_add_test(tc, test_port_and_foreign_events);
	tcase_add_test(tc, test_removed_found);
	tcase_add_test(tc, test_odp_and_mempool_come_back);
	tcase_add_test(tc, test_soft_provider_failure);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(device_suite());
}
