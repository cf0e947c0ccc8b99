/* SPDX-License-Identifier: MIT */
/* The dispatcher's rules, driven in-process: a manager without a listener, and clients on
 * socketpairs with chosen credentials. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include "control/client.h"
#include "control/dispatch.h"
#include "core/domain.h"
#include "control/manager.h"
#include "base/process.h"
#include "test-daemon.h"
#include "wire.h"
#include "check-run.h"

static void setup_with(const char *setting)
{
	const char *settings[] = { "limits.frame_bytes=1024", "limits.protocol_errors=5", setting,
				   NULL };

	td_start(settings);
}

static void setup(void) { setup_with(NULL); }
static void teardown(void) { td_stop(); }


static void send_hello(int fd, uint64_t id, uint32_t min, uint32_t max)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest hello = MRD__HELLO_REQUEST__INIT;

	hello.min_version = min;
	hello.max_version = max;
	hello.capabilities = ~0ull;
	hello.client_name = (char *)"test\x01name";
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	td_send_request(fd, &req, NULL, 0);
}

static void send_ping_fds(int fd, uint64_t id, const int *fds, size_t n_fds)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;

	ping.payload.data = (uint8_t *)"abc";
	ping.payload.len = 3;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	td_send_request(fd, &req, fds, n_fds);
}

static void send_ping(int fd, uint64_t id) { send_ping_fds(fd, id, NULL, 0); }

static void send_status(int fd, uint64_t id)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__StatusRequest status = MRD__STATUS_REQUEST__INIT;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_STATUS;
	req.status = &status;
	td_send_request(fd, &req, NULL, 0);
}

static void send_flush(int fd, uint64_t id)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FlushRequest flush = MRD__FLUSH_REQUEST__INIT;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_FLUSH;
	req.flush = &flush;
	td_send_request(fd, &req, NULL, 0);
}

START_TEST(test_hello_first)
{
	Mrd__Response *resp;
	struct client *c;
	int fd = td_add_client(1000, 1000, &c);

	send_ping(fd, 5);
	td_expect_free(fd, 5, EPROTO);
	send_status(fd, 6);
	td_expect_free(fd, 6, EPROTO);

	send_hello(fd, 7, 1, 3);
	resp = td_expect(fd, 7, 0);
	ck_assert_int_eq(resp->body_case, MRD__RESPONSE__BODY_HELLO);
	ck_assert_uint_eq(resp->hello->version, 1);
	ck_assert_uint_eq(resp->hello->capabilities, MRD_CAPS_SERVED);
	ck_assert_str_eq(resp->hello->server_version, PACKAGE_VERSION);
	ck_assert_uint_eq(resp->hello->max_frame, 1024);
	ck_assert(!resp->hello->admin);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_str_eq(c->name, "test?name"); /* control characters never reach logs */

	send_ping(fd, 8);
	resp = td_expect(fd, 8, 0);
	ck_assert_int_eq(resp->body_case, MRD__RESPONSE__BODY_PING);
	ck_assert_uint_eq(resp->ping->payload.len, 3);
	ck_assert(memcmp(resp->ping->payload.data, "abc", 3) == 0);
	mrd__response__free_unpacked(resp, NULL);

	send_hello(fd, 9, 1, 1);
	td_expect_free(fd, 9, EALREADY);
	ck_assert_uint_eq(td_manager->n_protocol_errors, 2); /* the two requests before Hello */
	close(fd);
}
END_TEST

START_TEST(test_hello_versions)
{
	int fd = td_add_client(1000, 1000, NULL);

	send_hello(fd, 1, 2, 9); /* only newer versions */
	td_expect_free(fd, 1, EPROTONOSUPPORT);
	send_hello(fd, 2, 1, 0); /* min > max */
	td_expect_free(fd, 2, EPROTONOSUPPORT);
	send_hello(fd, 3, 0, 0);
	td_expect_free(fd, 3, EPROTONOSUPPORT);
	send_ping(fd, 4); /* a failed Hello negotiates nothing */
	td_expect_free(fd, 4, EPROTO);
	send_hello(fd, 5, 0, 1);
	td_expect_free(fd, 5, 0);
	close(fd);
}
END_TEST

START_TEST(test_admin_rule)
{
	Mrd__Response *resp;
	int user = td_hello_client(1000, NULL);
	int root = td_hello_client(0, NULL);
	uint64_t errors = td_manager->n_protocol_errors;

	send_flush(user, 2);
	resp = td_expect(user, 2, EPERM);
	ck_assert_ptr_nonnull(strstr(resp->message, "admin"));
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(td_manager->n_protocol_errors, errors); /* refused, not malformed */
	send_status(user, 3); /* a view: anyone's */
	td_expect_free(user, 3, 0);
	send_flush(root, 4);
	td_expect_free(root, 4, 0);

	send_status(root, 2);
	resp = td_expect(root, 2, 0);
	ck_assert_int_eq(resp->body_case, MRD__RESPONSE__BODY_STATUS_REPLY);
	ck_assert_uint_eq(resp->status_reply->clients, 2);
	ck_assert_uint_eq(resp->status_reply->max_clients, 1024);
	ck_assert_str_eq(resp->status_reply->server_version, PACKAGE_VERSION);
	ck_assert_uint_eq(resp->status_reply->pid, (uint32_t)getpid());
	mrd__response__free_unpacked(resp, NULL);
	close(user);
	close(root);
}
END_TEST

START_TEST(test_admin_group)
{
	int member, other;

	teardown();
	setup_with("mrd.admin_group=4242");
	member = td_add_client(1000, 4242, NULL);
	send_hello(member, 1, 1, 1);
	td_expect_free(member, 1, 0);
	send_flush(member, 2);
	td_expect_free(member, 2, 0);

	other = td_add_client(1000, 1000, NULL);
	send_hello(other, 1, 1, 1);
	td_expect_free(other, 1, 0);
	send_flush(other, 2);
	td_expect_free(other, 2, EPERM);

	/* A reload without the group: the member connected before it is no admin any more. */
	{
		struct config cfg;
		char changed[256];

		config_init(&cfg);
		ck_assert_int_eq(config_finish(&cfg), 0);
		manager_reconfigure(td_manager, &cfg, changed, sizeof(changed));
		config_done(&cfg);
	}
	send_flush(member, 3);
	td_expect_free(member, 3, EPERM);
	close(member);
	close(other);
}
END_TEST

START_TEST(test_garbage_and_truncated)
{
	static const uint8_t garbage[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x13, 0x37 };
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	uint8_t *buf;
	size_t len;
	int fd = td_hello_client(1000, NULL);

	td_send_frame(fd, garbage, sizeof(garbage), NULL, 0);
	td_expect_free(fd, 0, EBADMSG);

	/* A valid Ping cut short inside its payload. */
	ping.payload.data = (uint8_t *)"0123456789";
	ping.payload.len = 10;
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	ck_assert_int_eq(wire_pack(&req.base, WIRE_FRAME_MAX, &buf, &len), 0);
	td_send_frame(fd, buf, len - 4, NULL, 0);
	free(buf);
	td_expect_free(fd, 0, EBADMSG);

	send_ping(fd, 4); /* still served */
	td_expect_free(fd, 4, 0);
	close(fd);
}
END_TEST

START_TEST(test_unknown_body)
{
	/* id = 7, then field 99 (length-delimited, empty): a request from a newer client. */
	static const uint8_t unknown[] = { 0x08, 0x07, 0x9a, 0x06, 0x00 };
	static const uint8_t empty_body[] = { 0x08, 0x09 };
	int fd = td_hello_client(1000, NULL);

	td_send_frame(fd, unknown, sizeof(unknown), NULL, 0);
	td_expect_free(fd, 7, EOPNOTSUPP);
	td_send_frame(fd, empty_body, sizeof(empty_body), NULL, 0);
	td_expect_free(fd, 9, EOPNOTSUPP);
	close(fd);
}
END_TEST

START_TEST(test_oversize)
{
	uint8_t big[1025];
	int fd = td_hello_client(1000, NULL);

	memset(big, 0, sizeof(big));
	td_send_frame(fd, big, sizeof(big), NULL, 0);
	td_expect_free(fd, 0, EMSGSIZE);
	td_send_frame(fd, big, 1024, NULL, 0); /* at the limit: decoded (and rejected as garbage) */
	td_expect_free(fd, 0, EBADMSG);
	send_ping(fd, 2);
	td_expect_free(fd, 2, 0);
	close(fd);
}
END_TEST

/* True when every writer of the pipe whose read end is rfd has closed it within TEST_WAIT_S
 * (mrd closes what it does not keep on a closer thread, not before it replies). */
static bool pipe_closed(int rfd)
{
	struct pollfd p = { .fd = rfd, .events = POLLIN };
	char ch;

	return poll(&p, 1, TEST_WAIT_S * 1000) == 1 && read(rfd, &ch, 1) == 0;
}

START_TEST(test_fd_count)
{
	int fd = td_hello_client(1000, NULL), p[5][2], wfds[5];

	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(pipe2(p[i], O_CLOEXEC | O_NONBLOCK), 0);
		wfds[i] = p[i][1];
	}

	/* Ping takes none: one is refused and closed by mrd; four too. Five is over
	 * limits.fds_per_message (4): refused before decoding. Every copy is closed. */
	send_ping_fds(fd, 2, wfds, 1);
	send_ping_fds(fd, 3, wfds + 1, 4);
	send_ping_fds(fd, 4, wfds, 5);
	for (int i = 0; i < 5; i++)
		safe_close(p[i][1]);
	td_expect_free(fd, 2, EBADMSG);
	td_expect_free(fd, 3, EBADMSG);
	td_expect_free(fd, 0, EBADMSG);
	for (int i = 0; i < 5; i++) {
		ck_assert(pipe_closed(p[i][0]));
		close(p[i][0]);
	}
	close(fd);
}
END_TEST

START_TEST(test_drop_after_protocol_errors)
{
	static const uint8_t garbage[] = { 0xff };
	Mrd__Response *resp;
	struct client *c;
	int fd = td_hello_client(1000, &c), root = td_hello_client(0, NULL);

	ck_assert_uint_eq(td_manager->n_clients, 2);
	for (int i = 0; i < 5; i++) {
		td_send_frame(fd, garbage, sizeof(garbage), NULL, 0);
		td_expect_free(fd, 0, EBADMSG);
	}
	td_send_frame(fd, garbage, sizeof(garbage), NULL, 0); /* the sixth is one too many */
	ck_assert_ptr_null(td_recv_reply(fd, NULL, NULL));
	ck_assert_uint_eq(td_manager->n_clients, 1);
	ck_assert_uint_eq(td_manager->n_clients_dropped, 1);

	send_status(root, 2);
	resp = td_expect(root, 2, 0);
	ck_assert_uint_eq(resp->status_reply->protocol_errors, 6);
	ck_assert_uint_eq(resp->status_reply->clients_dropped, 1);
	mrd__response__free_unpacked(resp, NULL);
	close(fd);
	close(root);
}
END_TEST

START_TEST(test_inflight_bound)
{
	struct client *c;
	int fd, sndbuf = 1;
	const int n = 200;

	teardown();
	setup_with("limits.requests_in_flight=4");
	fd = td_hello_client(1000, &c);
	/* The smallest send buffer makes replies queue in mrd almost at once. */
	ck_assert_int_eq(setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);

	ck_assert_int_eq(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	for (int i = 0; i < n; i++) {
		send_ping(fd, 100 + (uint64_t)i);
		td_pump();
		ck_assert_uint_le(c->n_out, 4);
	}
	ck_assert(!c->reading); /* paused: the client does not take its replies */

	for (int i = 0; i < n; i++)
		td_expect_free(fd, 100 + (uint64_t)i, 0); /* every one answered, in order */
	ck_assert_uint_eq(c->n_out, 0);
	ck_assert(c->reading);
	close(fd);
}
END_TEST

#define KiB (1ull << 10)
#define MiB (1ull << 20)

/* td_start_one_worker()'s settings, with limits.requests_in_flight = n. */
static void start_one_worker_in_flight(unsigned n)
{
	char bound[64];
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.workers=1",
				   "cache.async_bytes=1M", bound, NULL };

	snprintf(bound, sizeof(bound), "limits.requests_in_flight=%u", n);
	td_stop();
	td_start(settings);
}

/* The next n replies, whichever order they come in, must be for ids first .. first + n - 1
 * and succeed. */
static void expect_in_any_order(int fd, uint64_t first, unsigned n)
{
	bool seen[8] = { false };

	ck_assert_uint_le(n, ELEMENTSOF(seen));
	for (unsigned i = 0; i < n; i++) {
		Mrd__Response *resp = td_recv_reply(fd, NULL, NULL);

		ck_assert_ptr_nonnull(resp);
		ck_assert_uint_ge(resp->id, first);
		ck_assert_uint_lt(resp->id, first + n);
		ck_assert(!seen[resp->id - first]);
		seen[resp->id - first] = true;
		ck_assert_msg(resp->status == 0, "%s", resp->message);
		mrd__response__free_unpacked(resp, NULL);
	}
}

/* A lookup that waits for a worker holds up no later request of its own connection: they are
 * read and answered meanwhile, and its answer comes after theirs, with its id. */
START_TEST(test_pending_lets_later_requests_pass)
{
	struct td_blocker b;
	struct client *c;
	uint64_t big, small;
	Mrd__MrEntry e;
	Mrd__Response *resp;
	int fd;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	big = td_alloc(fd, 2, 8 * MiB);
	small = td_alloc(fd, 3, 4096);
	td_lookup(fd, 4, small, 0, &e); /* registered */
	td_block_worker(&b);
	td_send_lookup(fd, 5, big + 100); /* to the worker, which is busy */
	send_ping(fd, 6);
	td_expect_free(fd, 6, 0); /* the second answered first */
	td_lookup(fd, 7, small, 0, &e); /* a hit: answered on the loop */
	ck_assert_uint_eq(e.start, small);
	ck_assert_uint_eq(c->n_pending, 1);
	ck_assert(c->reading);

	td_unblock_worker(&b);
	resp = td_expect(fd, 5, 0);
	ck_assert_uint_eq(resp->mr_lookup->entries[0]->start, big);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(c->n_pending, 0);
	close(fd);
}
END_TEST

/* limits.requests_in_flight bounds the requests of a connection that wait for a worker: at
 * the bound mrd reads no more of them until one is answered. */
START_TEST(test_pending_bound)
{
	struct pollfd pfd = { .events = POLLIN };
	struct td_blocker b;
	struct client *c;
	uint64_t a1, a2;
	int fd;

	start_one_worker_in_flight(2);
	fd = td_hello_client(1000, &c);
	a1 = td_alloc(fd, 2, 2 * MiB);
	a2 = td_alloc(fd, 3, 2 * MiB);
	td_block_worker(&b);
	td_send_lookup(fd, 4, a1);
	td_send_lookup(fd, 5, a2);
	send_ping(fd, 6);
	td_pump();
	ck_assert_uint_eq(c->n_pending, 2);
	ck_assert(!c->reading); /* the Ping stays unread */
	pfd.fd = fd;
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);

	td_unblock_worker(&b);
	expect_in_any_order(fd, 4, 3);
	ck_assert_uint_eq(c->n_pending, 0);
	ck_assert(c->reading);
	close(fd);
}
END_TEST

/* A client that leaves with several requests waiting for workers: each is dropped once, when
 * its worker is done (ASan tells a double free or a leak), and nobody is answered. */
START_TEST(test_pending_client_leaves)
{
	struct td_blocker b;
	struct client *c;
	unsigned clients;
	uint64_t a[3];
	int fd;

	for (unsigned bound = 2; bound <= 64; bound += 62) { /* paused at the bound, or reading */
		start_one_worker_in_flight(bound);
		fd = td_hello_client(1000, &c);
		for (unsigned i = 0; i < 2; i++)
			a[i] = td_alloc(fd, 2 + i, 2 * MiB);
		td_block_worker(&b);
		for (unsigned i = 0; i < 2; i++)
			td_send_lookup(fd, 10 + i, a[i]);
		td_pump();
		ck_assert_uint_eq(c->n_pending, 2);
		ck_assert(c->reading == (bound > 2));
		clients = td_manager->n_clients;
		close(fd);
		td_pump();
		ck_assert_uint_eq(td_manager->n_clients, clients - 1); /* gone at once */
		td_unblock_worker(&b);
		td_wait_domains_closed(); /* the jobs held the domain: all of them ended */
	}
}
END_TEST

/* A client of uid 1000 whose lookup of 8 MiB (id 3) waits for the one worker, which b holds;
 * returns its socket, and the memory's address in *ret_big. */
static int pending_big_lookup(struct td_blocker *b, struct client **ret, uint64_t *ret_big)
{
	int fd;

	td_start_one_worker();
	fd = td_hello_client(1000, ret);
	*ret_big = td_alloc(fd, 2, 8 * MiB);
	td_block_worker(b);
	td_send_lookup(fd, 3, *ret_big);
	return fd;
}

/* The connection frees the memory its own pending lookup is registering: the Free is read
 * and done, and the lookup hands out no key for the freed memory (the registrar drops what
 * the worker made). */
START_TEST(test_free_under_own_pending_lookup)
{
	struct td_blocker b;
	struct client *c;
	Mrd__Response *resp[2];
	uint64_t big;
	int fd;

	fd = pending_big_lookup(&b, &c, &big);
	td_send_free(fd, 4, big);
	td_pump();
	td_unblock_worker(&b);
	for (int i = 0; i < 2; i++) {
		Mrd__Response *r = td_recv_reply(fd, NULL, NULL);

		ck_assert_ptr_nonnull(r);
		ck_assert(r->id == 3 || r->id == 4);
		resp[r->id - 3] = r;
	}
	ck_assert_msg(resp[1]->status == 0, "%s", resp[1]->message);
	ck_assert_int_ne(resp[0]->status, 0); /* no key for memory that is gone */
	mrd__response__free_unpacked(resp[0], NULL);
	mrd__response__free_unpacked(resp[1], NULL);
	td_lookup(fd, 5, big, ENOENT, NULL);
	ck_assert_uint_eq(c->n_pending, 0);
	/* What the worker pinned for it goes too, on a worker (8 MiB). */
	td_pump_until(c->domain->reg.cache.charges.pinned_bytes == 0);
	ck_assert_uint_eq(c->domain->reg.cache.charges.pinned_bytes, 0);
	close(fd);
}
END_TEST

/* A lookup of several addresses that waits for a worker finds again, when it goes on, what it
 * found before the wait once keys died meanwhile: memory freed while it waited is no key in
 * its answer (ENOENT), never that memory's dead key. */
START_TEST(test_batch_lookup_forgets_memory_freed_while_it_waits)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;
	struct td_blocker b;
	struct client *c;
	uint64_t addrs[2];
	int fd;

	td_start_one_worker();
	fd = td_hello_client(1000, &c);
	addrs[0] = td_alloc(fd, 2, 64 * KiB);
	addrs[1] = td_alloc(fd, 3, 8 * MiB);
	td_lookup(fd, 4, addrs[0], 0, NULL); /* registered on the loop, cached */
	td_block_worker(&b);
	q.addresses = addrs;
	q.n_addresses = 2;
	req.id = 5;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	td_send_request(fd, &req, NULL, 0);
	td_pump(); /* the first is found; the second waits for the worker */
	ck_assert_uint_eq(c->n_pending, 1);
	ck_assert_int_eq(domain_free_allocation(c->domain,
						domain_allocation_containing(c->domain, addrs[0]),
						NULL), 0);
	td_unblock_worker(&b);
	td_expect_free(fd, 5, ENOENT);
	td_lookup(fd, 6, addrs[1], 0, NULL); /* the other's registration stays */
	close(fd);
}
END_TEST

/* mrd stops while a big Free, two lookups (pinned and on demand) and a Free of memory being
 * registered wait behind a busy worker, one client gone and one still there: what finishes
 * while the workers drain runs on the loop, since work submitted then would never run and hold
 * its domain for good (LeakSanitizer, under tools/check-sanitizers.sh, saw the domain and its
 * arenas leak). */
START_TEST(test_stop_with_work_queued)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.workers=1", "cache.async_bytes=1M",
				   "cache.odp_chunk=2M", NULL };
	struct td_blocker b;
	uint64_t f, l, o;
	int fd, fd2;

	td_stop();
	td_start(settings);
	fd = td_hello_client(1000, NULL);
	fd2 = td_hello_client(1000, NULL);
	f = td_alloc(fd, 2, 8 * MiB);
	l = td_alloc(fd2, 3, 8 * MiB);
	o = td_alloc_flags(fd2, 4, 4 * MiB, MRD__ALLOC_FLAGS__ALLOC_ODP);
	td_block_worker(&b);
	td_send_free(fd, 10, f);
	td_send_lookup(fd2, 11, l);
	td_send_lookup(fd2, 12, o);
	td_send_free(fd2, 13, l);
	td_pump();
	close(fd);
	td_pump();
	ck_assert_int_eq(write(b.fd[1], "x", 1), 1);
	td_stop(); /* drains the pool with the jobs queued */
	close(fd2);
	close(b.fd[0]);
	close(b.fd[1]);
}
END_TEST

/* JoinDomain (which may resume what an earlier mrd held) is answered only while nothing else
 * of the connection is pending: else EBUSY, and nothing done. */
START_TEST(test_join_waits_for_nothing_pending)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__JoinDomainRequest q = MRD__JOIN_DOMAIN_REQUEST__INIT;
	struct td_blocker b;
	struct client *c;
	uint64_t big;
	int fd;

	fd = pending_big_lookup(&b, &c, &big);
	req.id = 4;
	req.body_case = MRD__REQUEST__BODY_JOIN_DOMAIN;
	req.join_domain = &q;
	td_send_request(fd, &req, NULL, 0);
	td_expect_free(fd, 4, EBUSY);
	ck_assert(!c->joined);
	td_unblock_worker(&b);
	td_expect_free(fd, 3, 0);
	mrd__response__free_unpacked(td_join(fd, 5, 0, 0, NULL), NULL);
	ck_assert(c->joined);
	close(fd);
}
END_TEST

START_TEST(test_client_limit)
{
	struct ucred cred = { .pid = 1, .uid = 1000, .gid = 1000 };
	struct client *c;
	int fds[3];

	teardown();
	setup_with("limits.clients=2");
	fds[0] = td_add_client(1000, 1000, NULL);
	fds[1] = td_add_client(1000, 1000, NULL);
	fds[2] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(manager_add_client(td_manager, fds[2], &cred, cred.uid, NULL, &c), -EUSERS);
	ck_assert_uint_eq(td_manager->n_clients, 2);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
}
END_TEST

/* [limits] clients_per_user counts every connection of a user, Hello or not, its user
 * namespaces' identities included (charged to their owner, in its domain); root has no such
 * limit; a closed connection gives its slot back. */
START_TEST(test_clients_per_user)
{
	struct ucred cred = { .pid = 1, .uid = 1000, .gid = 1000 };
	struct client *c, *nested;
	int fds[7], n = 0;

	teardown();
	setup_with("limits.clients_per_user=2");
	for (int i = 0; i < 7; i++)
		fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(manager_add_client(td_manager, fds[n++], &cred, 1000, NULL, &c), 0);
	/* uid 100005 of a namespace uid 1000 made: uid 1000's second slot, and its domain. */
	cred.uid = cred.gid = 100005;
	ck_assert_int_eq(manager_add_client(td_manager, fds[n++], &cred, 1000, NULL, &nested), 0);
	ck_assert_str_eq(nested->domain_name, "uid-1000");
	ck_assert_uint_eq(nested->owner.mem.uid, 100005);
	ck_assert_int_eq(manager_add_client(td_manager, fds[n], &cred, 1000, NULL, &c), -EUSERS);
	cred.uid = cred.gid = 1000;
	ck_assert_int_eq(manager_add_client(td_manager, fds[n], &cred, 1000, NULL, &c), -EUSERS);
	/* Another user, and root past the limit, are served. */
	cred.uid = cred.gid = 1001;
	ck_assert_int_eq(manager_add_client(td_manager, fds[n++], &cred, 1001, NULL, &c), 0);
	cred.uid = cred.gid = 0;
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(manager_add_client(td_manager, fds[n++], &cred, 0, NULL, &c), 0);
	ck_assert_uint_eq(td_manager->n_clients, 6);
	/* uid 1000 gets its slot back with the namespaced client gone. */
	client_free(nested);
	cred.uid = cred.gid = 1000;
	ck_assert_int_eq(manager_add_client(td_manager, fds[n++], &cred, 1000, NULL, &c), 0);
	ck_assert_uint_eq(td_manager->n_clients, 6);
}
END_TEST

/* Without CAP_SYS_PTRACE mrd cannot read another user's namespaces: /etc/subuid's ranges
 * (what newuidmap maps) still give their uids to their owner, root's aside. */
START_TEST(test_subuid_owner)
{
	char path[] = "/tmp/mrd-subuid.XXXXXX";
	int fd = mkstemp(path);
	FILE *f = fdopen(fd, "w");

	ck_assert_ptr_nonnull(f);
	fputs("garbage\n1001:0:1\nroot:200000:65536\n1000:100000:65536\nnobody:300000:10\n", f);
	fclose(f);
	ck_assert_uint_eq(subuid_owner(path, 100000), 1000);
	ck_assert_uint_eq(subuid_owner(path, 165535), 1000);
	ck_assert_uint_eq(subuid_owner(path, 165536), 165536);
	ck_assert_uint_eq(subuid_owner(path, 300009), 65534); /* by name */
	ck_assert_uint_eq(subuid_owner(path, 200005), 200005); /* root's: its own */
	ck_assert_uint_eq(subuid_owner(path, 1000), 1000);
	ck_assert_uint_eq(subuid_owner(path, 0), 0); /* root is root, whatever a range says */
	unlink(path);
	ck_assert_uint_eq(subuid_owner(path, 100000), 100000); /* no file */
}
END_TEST

/* A process running as a subordinate uid, from mrd's own user namespace (a setuid binary a
 * user made in its namespace, run outside): the namespace walk succeeds and tells nothing, and
 * /etc/subuid still charges it to the range's owner. As root: a child on uid 100005 of uid
 * 1000's range; otherwise this process, on a range made of its own uid. */
START_TEST(test_subuid_charged_after_the_walk)
{
	char path[] = "/tmp/mrd-subuid.XXXXXX";
	int fd = mkstemp(path), go[2];
	uid_t uid = geteuid(), want = 4242, owner = 0;
	pid_t pid = getpid();
	struct stat ns;
	FILE *f = fdopen(fd, "w");

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(stat("/proc/self/ns/user", &ns), 0);
	ck_assert_int_eq(pipe2(go, O_CLOEXEC), 0);
	if (uid == 0) {
		uid = 100005;
		want = 1000;
		pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			char c;

			close(go[1]);
			if (setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
				_exit(1);
			(void)!read(go[0], &c, 1); /* until the parent is done */
			_exit(0);
		}
		/* Until the child runs as uid: the walk answers for that process only. */
		for (uid_t euid = 0; euid != uid;) {
			char p[64];
			struct stat st;

			snprintf(p, sizeof(p), "/proc/%d", (int)pid);
			ck_assert_int_eq(stat(p, &st), 0);
			euid = st.st_uid;
			if (euid != uid)
				usleep(1000);
		}
	}
	fprintf(f, "root:200000:65536\n%u:%u:1\n1000:100000:65536\n", (unsigned)want,
		(unsigned)uid);
	fclose(f);
	ck_assert_int_eq(chmod(path, 0644), 0); /* for the asker below */
	/* The walk itself runs and succeeds: the process is in mrd's namespace. */
	ck_assert_int_eq(process_owner_uid(pid, uid, ns.st_dev, ns.st_ino, &owner), 0);
	ck_assert_uint_eq(owner, uid);
	ck_assert_int_eq(process_charged_uid(pid, uid, ns.st_dev, ns.st_ino, path, &owner), 0);
	ck_assert_uint_eq(owner, want);
	if (pid != getpid()) {
		/* Without CAP_SYS_PTRACE (a process of uid 1000 asks) the walk cannot run: the
		 * same answer. */
		int status;
		pid_t asker = fork();

		ck_assert_int_ge(asker, 0);
		if (asker == 0) {
			uid_t o = 0;

			if (setresgid(1000, 1000, 1000) < 0 || setresuid(1000, 1000, 1000) < 0)
				_exit(2);
			if (process_owner_uid(pid, uid, ns.st_dev, ns.st_ino, &o) != -EACCES)
				_exit(3);
			_exit(process_charged_uid(pid, uid, ns.st_dev, ns.st_ino, path, &o) == 0 &&
			      o == want ? 0 : 4);
		}
		ck_assert_int_eq(waitpid(asker, &status, 0), asker);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "without CAP_SYS_PTRACE: status %d", status);
	}
	/* Without a range, or with the file gone, the uid is its own. */
	unlink(path);
	ck_assert_int_eq(process_charged_uid(pid, uid, ns.st_dev, ns.st_ino, path, &owner), 0);
	ck_assert_uint_eq(owner, uid);
	close(go[1]);
	close(go[0]);
	if (pid != getpid())
		ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
}
END_TEST

static void send_export_pd(int fd, uint64_t id)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExportPdRequest export_pd = MRD__EXPORT_PD_REQUEST__INIT;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_EXPORT_PD;
	req.export_pd = &export_pd;
	td_send_request(fd, &req, NULL, 0);
}

START_TEST(test_status_shows_provider)
{
	Mrd__Response *resp;
	int root = td_hello_client(0, NULL);

	send_status(root, 2);
	resp = td_expect(root, 2, 0);
	/* No RDMA here: auto fell back to the soft provider, and says what it can do. */
	ck_assert_str_eq(resp->status_reply->provider, "soft");
	ck_assert_str_eq(resp->status_reply->device, "soft");
	ck_assert(resp->status_reply->odp);
	ck_assert(resp->status_reply->rereg_translation);
	ck_assert(resp->status_reply->dma);
	ck_assert_uint_gt(resp->status_reply->max_mr_size, 0);
	ck_assert_uint_eq(resp->status_reply->domains, 0);
	mrd__response__free_unpacked(resp, NULL);
	close(root);
}
END_TEST

START_TEST(test_export_pd_domains)
{
	Mrd__Response *resp;
	struct client *a, *b, *other;
	int fa = td_hello_client(1000, &a), fb = td_hello_client(1000, &b), fo = td_hello_client(2000, &other);

	/* The soft provider has no device to share; asking opens the uid's domain anyway. */
	send_export_pd(fa, 5);
	resp = td_expect(fa, 5, EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(resp->message, "soft"));
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_uint_eq(td_manager->core.n_domains, 1);
	send_export_pd(fb, 6);
	td_expect_free(fb, 6, EOPNOTSUPP);
	ck_assert_ptr_eq(a->domain, b->domain); /* same uid, same domain */
	ck_assert_uint_eq(a->domain->n_users, 2);
	send_export_pd(fo, 7);
	td_expect_free(fo, 7, EOPNOTSUPP);
	ck_assert_ptr_ne(other->domain, a->domain);
	/* Its own context each. */
	ck_assert_ptr_ne(other->domain->reg.base.provider, a->domain->reg.base.provider);
	ck_assert_uint_eq(td_manager->core.n_domains, 2);

	/* The last client of a uid closes its domain. */
	close(fa);
	td_pump();
	ck_assert_uint_eq(td_manager->core.n_domains, 2);
	close(fb);
	td_pump();
	ck_assert_uint_eq(td_manager->core.n_domains, 1);
	close(fo);
	td_pump();
	ck_assert_uint_eq(td_manager->core.n_domains, 0);
}
END_TEST

static void send_alloc(int fd, uint64_t id, uint64_t size, uint32_t flags)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest q = MRD__ALLOC_REQUEST__INIT;

	q.size = size;
	q.flags = flags;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &q;
	td_send_request(fd, &req, NULL, 0);
}

/* The reply to id must carry error and a message containing what. */
static void expect_message(int fd, uint64_t id, int error, const char *what)
{
	Mrd__Response *resp = td_expect(fd, id, error);

	ck_assert_msg(strstr(resp->message, what), "'%s' does not say '%s'", resp->message, what);
	mrd__response__free_unpacked(resp, NULL);
}

/* A request's own check comes before its domain (.needs_domain): a malformed one is refused
 * for what it says, and joins no domain; a well-formed one is refused with the quota. */
#define QUOTA_CLIENTS_1                                                                       \
	"quota.clients (1) would be exceeded in domain uid-1000: 1 in use, tried to add 1 " \
	"more; raise [quota] clients in mrd.conf and reload mrd"

START_TEST(test_domain_after_check)
{
	struct client *b, *c;
	int fa, fb, fc;

	td_stop();
	setup_with("quota.clients=1");
	fa = td_hello_client(1000, NULL);
	fb = td_hello_client(1000, &b);
	fc = td_hello_client(2000, &c);
	mrd__response__free_unpacked(td_join(fa, 2, 0, 0, NULL), NULL);
	send_alloc(fb, 3, 4096, 0x80);
	expect_message(fb, 3, EINVAL, "unknown allocation flags 0x80");
	ck_assert_ptr_null(b->domain);
	send_alloc(fb, 4, 4096, 0);
	expect_message(fb, 4, EDQUOT, QUOTA_CLIENTS_1);
	td_send_lookup(fb, 5, 0x1000);
	expect_message(fb, 5, EDQUOT, QUOTA_CLIENTS_1);
	send_export_pd(fb, 6); /* the same words as any other request's */
	expect_message(fb, 6, EDQUOT, QUOTA_CLIENTS_1);
	ck_assert_ptr_null(b->domain);

	send_alloc(fc, 7, 4096, 0x80);
	td_expect_free(fc, 7, EINVAL);
	ck_assert_ptr_null(c->domain);
	ck_assert_uint_eq(td_manager->core.n_domains, 1);
	close(fa);
	close(fb);
	close(fc);
}
END_TEST

/* One Mempools page from first; its reply must succeed and is returned. */
static Mrd__Response *mempools_page(int fd, uint64_t id, uint32_t first)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolsRequest q = MRD__MEMPOOLS_REQUEST__INIT;

	q.first = first;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_MEMPOOLS;
	req.mempools = &q;
	td_send_request(fd, &req, NULL, 0);
	return td_expect(fd, id, 0);
}

/* The requests without .needs_domain (Ping, the views, the admin requests) never join the
 * caller's domain: a client of a domain at quota.clients makes them all, and root's Flush and
 * FrmrPoolsSet open no domain of root's. */
START_TEST(test_no_domain_requests_join_nothing)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ClientsRequest clients = MRD__CLIENTS_REQUEST__INIT;
	Mrd__FrmrPoolsRequest pools = MRD__FRMR_POOLS_REQUEST__INIT;
	Mrd__FrmrPoolsSetRequest set = MRD__FRMR_POOLS_SET_REQUEST__INIT;
	Mrd__DomainDumpRequest dump = MRD__DOMAIN_DUMP_REQUEST__INIT;
	struct client *b, *root;
	int fa, fb, fr;

	td_stop();
	setup_with("quota.clients=1");
	fa = td_hello_client(1000, NULL);
	mrd__response__free_unpacked(td_join(fa, 2, 0, 0, NULL), NULL);
	fb = td_hello_client(1000, &b);
	fr = td_hello_client(0, &root);

	for (int who = 0; who < 2; who++) {
		int fd = who ? fr : fb;
		uint64_t id = who ? 200 : 100;

		send_ping(fd, ++id);
		td_expect_free(fd, id, 0);
		send_status(fd, ++id);
		td_expect_free(fd, id, 0);
		req.body_case = MRD__REQUEST__BODY_CLIENTS;
		req.clients = &clients;
		req.id = ++id;
		td_send_request(fd, &req, NULL, 0);
		td_expect_free(fd, id, 0);
		mrd__response__free_unpacked(mempools_page(fd, ++id, 0), NULL);
		req.body_case = MRD__REQUEST__BODY_FRMR_POOLS;
		req.frmr_pools = &pools;
		req.id = ++id;
		td_send_request(fd, &req, NULL, 0);
		td_expect_free(fd, id, 0);
		dump.domain = (char *)"uid-1000";
		req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
		req.domain_dump = &dump;
		req.id = ++id;
		td_send_request(fd, &req, NULL, 0);
		td_expect_free(fd, id, 0);
		send_flush(fd, ++id); /* every domain: uid-1000's */
		td_expect_free(fd, id, who ? 0 : EPERM);
		req.body_case = MRD__REQUEST__BODY_FRMR_POOLS_SET;
		req.frmr_pools_set = &set; /* sets nothing: refused for that, or as not root */
		req.id = ++id;
		td_send_request(fd, &req, NULL, 0);
		td_expect_free(fd, id, who ? EINVAL : EPERM);
	}
	ck_assert_ptr_null(b->domain);
	ck_assert_ptr_null(root->domain);
	ck_assert_uint_eq(td_manager->core.n_domains, 1);
	close(fa);
	close(fb);
	close(fr);
}
END_TEST

/* A client's socket takes replies up to its send buffer: a view pages itself down to what it
 * takes, and a reply that cannot be cut is answered with an error that says so, never not at
 * all. */
START_TEST(test_reply_beyond_the_socket)
{
	uint64_t starts[400], lengths[400], mem, id = 10;
	unsigned pools = 0, pages = 0;
	uint32_t first = 0;
	struct client *c;
	int fd, sndbuf = 1;
	socklen_t sl = sizeof(sndbuf);
	Mrd__Response *resp;
	char name[16];

	/* 4 KiB pages whatever the host has free: each range an MR of its own. */
	const char *settings[] = { "limits.frame_bytes=65536", "memory.hugepages=no", NULL };

	teardown();
	td_start(settings);
	fd = td_hello_client(1000, &c);
	mem = td_alloc(fd, 2, 800 * 4096);
	for (size_t i = 0; i < 400; i++) {
		starts[i] = mem + 2 * i * 4096;
		lengths[i] = 4096;
	}
	for (int i = 0; i < 20; i++) { /* 20 pools of 20 MRs: some KiB in all */
		snprintf(name, sizeof(name), "p%d", i);
		td_send_mempool_register(fd, ++id, name, starts + 20 * i, lengths, 20, false);
		td_expect_free(fd, id, 0);
	}
	/* The smallest send buffer (the kernel makes it some 4.6 KB). */
	ck_assert_int_eq(setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
	ck_assert_int_eq(getsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &sl), 0);
	do {
		resp = mempools_page(fd, ++id, first);
		ck_assert_uint_le(mrd__response__get_packed_size(resp), (size_t)sndbuf);
		ck_assert_uint_gt(resp->mempools->n_mempools, 0);
		ck_assert_uint_eq(resp->mempools->total, 20);
		pools += resp->mempools->n_mempools;
		pages++;
		first = resp->mempools->next;
		mrd__response__free_unpacked(resp, NULL);
	} while (first);
	ck_assert_uint_eq(pools, 20);
	ck_assert_uint_gt(pages, 1);

	/* 400 MRs in one MempoolRegister reply: more than the socket takes. */
	td_send_mempool_register(fd, ++id, "big", starts, lengths, 400, false);
	resp = td_expect(fd, id, EMSGSIZE);
	ck_assert_msg(strstr(resp->message, "does not fit"), "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	send_ping(fd, ++id);
	td_expect_free(fd, id, 0);

	/* The domain's 800 MRs (it stays registered: the request was done) in dump pages. */
	{
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__DomainDumpRequest q = MRD__DOMAIN_DUMP_REQUEST__INIT;
		uint32_t mrs = 0;

		q.domain = (char *)"uid-1000";
		req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
		req.domain_dump = &q;
		pages = 0;
		do {
			req.id = ++id;
			td_send_request(fd, &req, NULL, 0);
			resp = td_expect(fd, id, 0);
			ck_assert_uint_le(mrd__response__get_packed_size(resp), (size_t)sndbuf);
			ck_assert_uint_gt(resp->domain_dump->n_mrs, 0);
			ck_assert_uint_eq(resp->domain_dump->mrs_total, 800);
			mrs += (uint32_t)resp->domain_dump->n_mrs;
			pages++;
			q.first_mr = resp->domain_dump->next_mr;
			mrd__response__free_unpacked(resp, NULL);
		} while (q.first_mr);
		ck_assert_uint_eq(mrs, 800);
		ck_assert_uint_gt(pages, 2); /* more than 512 a page could hold */
	}
	close(fd);
}
END_TEST

/* A child that waits for EOF on hold, in a new pid namespace (pidns) or user namespace (not);
 * its pid as we see it. 0 where the kernel refuses the namespace. */
static pid_t placed_child(bool pidns, int hold[2])
{
	int pids[2];
	pid_t mid, pid = 0;

	ck_assert_int_eq(pipe2(pids, O_CLOEXEC), 0);
	mid = fork();
	ck_assert_int_ge(mid, 0);
	if (mid == 0) {
		char c;

		close(hold[1]);
		if (unshare(pidns ? CLONE_NEWPID : CLONE_NEWUSER) < 0)
			_exit(write(pids[1], &pid, sizeof(pid)) == sizeof(pid) ? 0 : 1);
		pid = pidns ? fork() : getpid(); /* the pid namespace is its children's */
		if (pid == 0) {
			(void)!read(hold[0], &c, 1);
			_exit(0);
		}
		if (write(pids[1], &pid, sizeof(pid)) != sizeof(pid))
			_exit(1);
		(void)!read(hold[0], &c, 1);
		_exit(0);
	}
	close(pids[1]);
	ck_assert_int_eq(read(pids[0], &pid, sizeof(pid)), (ssize_t)sizeof(pid));
	close(pids[0]);
	return pid;
}

/* A cgroup v2 folder name below own (our cgroup), made, its path in path; false (said on
 * stderr) where there is no writable cgroup v2 mount. */
static bool cgroup_below(const char *own, const char *name, char *path, size_t size)
{
	char line[1024], root[512], point[512] = "";
	FILE *f = fopen("/proc/self/mountinfo", "re");

	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, " - cgroup2 ") &&
		    sscanf(line, "%*s %*s %*s %511s %511s", root, point) == 2 &&
		    strcmp(root, "/") == 0)
			break;
	if (f)
		fclose(f);
	snprintf(path, size, "%s%s/%s", point, own && strcmp(own, "/") ? own : "", name);
	if (!point[0] || !own || (mkdir(path, 0755) < 0 && errno != EEXIST)) {
		fprintf(stderr, "no cgroup v2 folder of our own: the cgroup namespace case skipped\n");
		return false;
	}
	return true;
}

/* Where a process runs, from files any process may read: a process of another uid (as mrd,
 * which keeps no CAP_SYS_PTRACE, reads its clients) is told apart in a pid namespace of its
 * own and in a user namespace of its own; a pid that does not run as the uid is -ESRCH. */
START_TEST(test_process_place)
{
	_cleanup_free_ char *own = process_uid_map("/proc/self"), *cgroup = NULL;
	struct process_place place;
	int hold[2], status;
	char line[512], path[1100];
	pid_t in_pidns, in_userns, asker;
	FILE *f;

	ck_assert_ptr_nonnull(own);
	f = fopen("/proc/self/cgroup", "re");
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, "0::", 3) == 0)
			cgroup = strndup(line + 3, strcspn(line + 3, "\n"));
	if (f)
		fclose(f);
	ck_assert_int_eq(process_place_read(getpid(), geteuid(), own, &place), 0);
	ck_assert(!place.nested_pidns && !place.other_userns);
	ck_assert_str_eq(place.cgroup ? place.cgroup : "(none)", cgroup ? cgroup : "(none)");
	free(place.cgroup);
	ck_assert_int_eq(process_place_read(getpid(), geteuid() + 1, own, &place), -ESRCH);
	ck_assert_int_eq(process_place_read(0, 0, own, &place), -ESRCH);
	ck_assert_int_eq(process_place_read(getpid(), geteuid(), NULL, &place), 0);
	ck_assert(place.other_userns); /* mrd's own map unknown: nobody counts as the host's */
	free(place.cgroup);
	if (geteuid() != 0) {
		fprintf(stderr, "test_process_place: namespaces need root: the rest skipped\n");
		return;
	}
	ck_assert_int_eq(pipe2(hold, O_CLOEXEC), 0);
	in_pidns = placed_child(true, hold);
	in_userns = placed_child(false, hold);
	ck_assert_int_gt(in_pidns, 0);
	ck_assert_int_gt(in_userns, 0);
	/* Read as uid 1000, without CAP_SYS_PTRACE, as mrd reads them. */
	asker = fork();
	ck_assert_int_ge(asker, 0);
	if (asker == 0) {
		struct process_place a, b;

		if (setresgid(1000, 1000, 1000) < 0 || setresuid(1000, 1000, 1000) < 0)
			_exit(2);
		if (process_place_read(in_pidns, 0, own, &a) < 0 || !a.nested_pidns ||
		    a.other_userns)
			_exit(3);
		if (process_place_read(in_userns, 0, own, &b) < 0 || b.nested_pidns ||
		    !b.other_userns)
			_exit(4);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(asker, &status, 0), asker);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "asker: status %d", status);
	close(hold[1]);
	close(hold[0]);
	while (wait(NULL) > 0)
		;
	/* Read from a cgroup namespace of its own (mrd in a pod, as containerd makes them), a
	 * cgroup outside it ("/../x") names nothing: no cgroup. */
	if (cgroup_below(cgroup, "mrd-place-ns", path, sizeof(path))) {
		pid_t reader = fork();

		ck_assert_int_ge(reader, 0);
		if (reader == 0) {
			struct process_place outside;
			char procs[1200];
			int fd;

			snprintf(procs, sizeof(procs), "%s/cgroup.procs", path);
			fd = open(procs, O_WRONLY | O_CLOEXEC);
			if (fd < 0 || write(fd, "0", 1) != 1 || unshare(CLONE_NEWCGROUP) < 0)
				_exit(2);
			if (process_place_read(getppid(), geteuid(), own, &outside) < 0)
				_exit(3);
			_exit(outside.cgroup ? 4 : 0);
		}
		ck_assert_int_eq(waitpid(reader, &status, 0), reader);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "a cgroup outside the reader's namespace: status %d", status);
		ck_assert_int_eq(rmdir(path), 0);
	}
	/* Gone (reaped above: it was our child): -ESRCH */
	ck_assert_int_eq(process_place_read(in_userns, 0, own, &place), -ESRCH);
}
END_TEST

START_TEST(test_request_table)
{
	ck_assert_ptr_null(request_type_lookup(0));
	ck_assert_ptr_null(request_type_lookup(-1));
	ck_assert_ptr_null(request_type_lookup(15));
	ck_assert_ptr_null(request_type_lookup(100000));
	ck_assert(request_type_lookup(MRD__REQUEST__BODY_HELLO)->before_hello);
	ck_assert(!request_type_lookup(MRD__REQUEST__BODY_PING)->before_hello);
	ck_assert(!request_type_lookup(MRD__REQUEST__BODY_STATUS)->admin); /* a view */
	ck_assert(request_type_lookup(MRD__REQUEST__BODY_FLUSH)->admin);
	ck_assert(request_type_lookup(MRD__REQUEST__BODY_FRMR_POOLS_SET)->admin);
	ck_assert(request_type_lookup(MRD__REQUEST__BODY_SHUTDOWN)->admin);
	ck_assert(request_type_lookup(MRD__REQUEST__BODY_RELOAD)->admin);
	ck_assert(!request_type_lookup(MRD__REQUEST__BODY_PING)->admin);
	ck_assert(!request_type_lookup(MRD__REQUEST__BODY_EXPORT_PD)->admin);
	ck_assert_uint_eq(request_type_lookup(MRD__REQUEST__BODY_EXPORT_PD)->n_fds, 0);
	ck_assert(request_type_lookup(MRD__REQUEST__BODY_ALLOC)->needs_domain);
	ck_assert_ptr_nonnull(request_type_lookup(MRD__REQUEST__BODY_ALLOC)->check);
	ck_assert(request_type_lookup(MRD__REQUEST__BODY_JOIN_DOMAIN)->needs_domain);
	ck_assert(!request_type_lookup(MRD__REQUEST__BODY_STATUS)->needs_domain); /* a view */
	ck_assert(!request_type_lookup(MRD__REQUEST__BODY_HELLO)->needs_domain);
}
END_TEST

static Suite *dispatch_suite(void)
{
	Suite *s = suite_create("dispatch");
	TCase *tc = tcase_create("rules");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_hello_first);
	tcase_add_test(tc, test_hello_versions);
	tcase_add_test(tc, test_admin_rule);
	tcase_add_test(tc, test_admin_group);
	tcase_add_test(tc, test_garbage_and_truncated);
	tcase_add_test(tc, test_unknown_body);
	tcase_add_test(tc, test_oversize);
	tcase_add_test(tc, test_fd_count);
	tcase_add_test(tc, test_drop_after_protocol_errors);
	tcase_add_test(tc, test_inflight_bound);
	tcase_add_test(tc, test_pending_lets_later_requests_pass);
	tcase_add_test(tc, test_pending_bound);
	tcase_add_test(tc, test_pending_client_leaves);
	tcase_add_test(tc, test_join_waits_for_nothing_pending);
	tcase_add_test(tc, test_batch_lookup_forgets_memory_freed_while_it_waits);
	tcase_add_test(tc, test_stop_with_work_queued);
	tcase_add_test(tc, test_free_under_own_pending_lookup);
	tcase_add_test(tc, test_client_limit);
	tcase_add_test(tc, test_clients_per_user);
	tcase_add_test(tc, test_subuid_owner);
	tcase_add_test(tc, test_subuid_charged_after_the_walk);
	tcase_add_test(tc, test_status_shows_provider);
	tcase_add_test(tc, test_export_pd_domains);
	tcase_add_test(tc, test_domain_after_check);
	tcase_add_test(tc, test_no_domain_requests_join_nothing);
	tcase_add_test(tc, test_request_table);
	tcase_add_test(tc, test_process_place);
	tcase_add_test(tc, test_reply_beyond_the_socket);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(dispatch_suite());
}
