/* SPDX-License-Identifier: MIT */
#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "control/client.h"
#include "control/manager.h"
#include "test-daemon.h"

struct manager *td_manager;

void td_start_small(const char *setting)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", setting, NULL };

	td_start(settings);
}

void td_start(const char *const *settings)
{
	struct config cfg;

	config_init(&cfg);
	for (size_t i = 0; settings && settings[i]; i++)
		ck_assert_msg(config_set_assignment(&cfg, settings[i]) == 0, "bad setting %s",
			      settings[i]);
	/* TSan claims mrd's default window: its runs move it (tools/check-sanitizers.sh), and
	 * shrink it to what fits below TSan's shadow, unless the test sized it. */
	if (getenv("MRD_TEST_WINDOW_BASE")) {
		bool sized = false;

		for (size_t i = 0; settings && settings[i]; i++)
			sized |= strncmp(settings[i], "memory.window_size=", 19) == 0;
		ck_assert_int_eq(config_set(&cfg, "memory", "window_base",
					    getenv("MRD_TEST_WINDOW_BASE")), 0);
		if (!sized)
			ck_assert_int_eq(config_set(&cfg, "memory", "window_size", "64G"), 0);
	}
	ck_assert_int_eq(config_finish(&cfg), 0);
	ck_assert_int_eq(manager_new(&cfg, &td_manager), 0);
	config_done(&cfg);
}

void td_stop(void)
{
	td_manager = manager_free(td_manager);
}

int td_add_client(uid_t uid, gid_t gid, struct client **ret)
{
	return td_add_client_of(getpid(), uid, gid, ret);
}

int td_add_client_of(pid_t pid, uid_t uid, gid_t gid, struct client **ret)
{
	struct ucred cred = { .pid = pid, .uid = uid, .gid = gid };
	struct client *c;
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	ck_assert_int_eq(manager_add_client(td_manager, sv[0], &cred, cred.uid, NULL, &c), 0);
	if (ret)
		*ret = c;
	return sv[1];
}

int td_hello_client(uid_t uid, struct client **ret)
{
	return td_hello_client_of(getpid(), uid, ret);
}

int td_hello_client_of(pid_t pid, uid_t uid, struct client **ret)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest hello = MRD__HELLO_REQUEST__INIT;
	int fd = td_add_client_of(pid, uid, uid, ret);

	hello.min_version = hello.max_version = 1;
	req.id = 1;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	td_send_request(fd, &req, NULL, 0);
	td_expect_free(fd, 1, 0);
	return fd;
}

void td_pump(void)
{
	for (int i = 0; i < 8; i++)
		event_base_loop(td_manager->core.base, EVLOOP_NONBLOCK);
}

void td_send_frame(int fd, const void *data, size_t len, const int *fds, size_t n_fds)
{
	ck_assert_int_eq(wire_send_raw(fd, data, len, fds, n_fds, 0), 0);
}

void td_send_request(int fd, Mrd__Request *req, const int *fds, size_t n_fds)
{
	uint8_t *buf;
	size_t len;

	ck_assert_int_eq(wire_pack(&req->base, WIRE_FRAME_MAX, &buf, &len), 0);
	td_send_frame(fd, buf, len, fds, n_fds);
	free(buf);
}

Mrd__Response *td_recv_reply(int fd, int *fds, size_t *n_fds)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	struct wire_packet pkt;
	Mrd__Response *resp;
	int r;

	for (double start = test_now_s(); test_now_s() - start < TEST_WAIT_S;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };

		td_pump();
		if (poll(&pfd, 1, 1) > 0)
			break;
	}
	r = wire_recv(fd, buf, sizeof(buf), &pkt, MSG_DONTWAIT);
	if (r == 0)
		return NULL;
	ck_assert_int_eq(r, 1);
	if (fds) {
		memcpy(fds, pkt.fds, pkt.n_fds * sizeof(int));
		*n_fds = pkt.n_fds;
	} else {
		ck_assert_uint_eq(pkt.n_fds, 0);
	}
	resp = mrd__response__unpack(NULL, pkt.len, pkt.data);
	ck_assert_ptr_nonnull(resp);
	return resp;
}

Mrd__Response *td_expect_fds(int fd, uint64_t id, int error, int *fds, size_t *n_fds)
{
	Mrd__Response *resp = td_recv_reply(fd, fds, n_fds);

	ck_assert_ptr_nonnull(resp);
	ck_assert_uint_eq(resp->id, id);
	ck_assert_msg(resp->status == error, "request %llu: status %d (%s), expected %d",
		      (unsigned long long)id, resp->status, resp->message, error);
	if (error)
		ck_assert_msg(resp->message && *resp->message, "error reply without a reason");
	return resp;
}

Mrd__Response *td_expect(int fd, uint64_t id, int error)
{
	return td_expect_fds(fd, id, error, NULL, NULL);
}

void td_expect_free(int fd, uint64_t id, int error)
{
	mrd__response__free_unpacked(td_expect(fd, id, error), NULL);
}

uint64_t td_alloc(int fd, uint64_t id, uint64_t size)
{
	return td_alloc_flags(fd, id, size, 0);
}

Mrd__Response *td_alloc_alias(int fd, uint64_t id, uint64_t size, uint32_t flags, uint64_t alias,
			      uint32_t alias_access, int error)
{
	return td_alloc_span(fd, id, size, flags, alias, alias_access, 0, 0, error);
}

Mrd__Response *td_alloc_span(int fd, uint64_t id, uint64_t size, uint32_t flags, uint64_t alias,
			     uint32_t alias_access, uint64_t span_offset, uint64_t span_length,
			     int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest a = MRD__ALLOC_REQUEST__INIT;
	Mrd__Response *resp;
	int fds[WIRE_FDS_MAX];
	size_t n;

	a.size = size;
	a.flags = flags;
	a.alias = alias;
	a.alias_access = alias_access;
	a.span_offset = span_offset;
	a.span_length = span_length;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &a;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect_fds(fd, id, error, fds, &n);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	if (error) {
		mrd__response__free_unpacked(resp, NULL);
		return NULL;
	}
	return resp;
}

Mrd__Response *td_alloc_reply(int fd, uint64_t id, uint64_t size, uint32_t flags)
{
	return td_alloc_alias(fd, id, size, flags, 0, 0, 0);
}

uint64_t td_alloc_flags(int fd, uint64_t id, uint64_t size, uint32_t flags)
{
	Mrd__Response *resp = td_alloc_reply(fd, id, size, flags);
	uint64_t addr = resp->alloc->address;

	mrd__response__free_unpacked(resp, NULL);
	return addr;
}

void td_free(int fd, uint64_t id, uint64_t addr, int error)
{
	td_send_free(fd, id, addr);
	td_expect_free(fd, id, error);
}

void td_send_free(int fd, uint64_t id, uint64_t addr)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FreeRequest f = MRD__FREE_REQUEST__INIT;

	f.address = addr;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_FREE;
	req.free = &f;
	td_send_request(fd, &req, NULL, 0);
}

void td_start_one_worker(void)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", "cache.workers=1",
				   "cache.async_bytes=1M", NULL };

	td_stop();
	td_start(settings);
}

static void blocker_run(struct work *w)
{
	struct td_blocker *b = (struct td_blocker *)w;
	char ch;

	__atomic_store_n(&b->entered, true, __ATOMIC_RELEASE);
	(void)!read(b->fd[0], &ch, 1);
}

static void blocker_done(struct work *w) { ((struct td_blocker *)w)->done = true; }

static void block_as(struct td_blocker *b, struct worker_pool *pool, const void *key)
{
	*b = (struct td_blocker){ .work = { .run = blocker_run, .done = blocker_done } };
	ck_assert_int_eq(pipe(b->fd), 0);
	worker_pool_submit(pool, &b->work, key);
}

void td_block_pool(struct td_blocker *b, struct worker_pool *pool) { block_as(b, pool, b); }

void td_block_worker_as(struct td_blocker *b, const void *key)
{
	block_as(b, td_manager->core.workers, key);
}

void td_block_worker(struct td_blocker *b) { td_block_pool(b, td_manager->core.workers); }

void td_unblock_worker(struct td_blocker *b)
{
	ck_assert_int_eq(write(b->fd[1], "x", 1), 1);
	td_pump_until(b->done);
	ck_assert(b->done);
	close(b->fd[0]);
	close(b->fd[1]);
}

void td_pump_until_zero(const unsigned *count)
{
	td_pump_until(*count == 0);
	ck_assert_uint_eq(*count, 0);
}

void td_wait_domains_closed(void)
{
	td_pump_until_zero(&td_manager->core.n_domains);
}

void td_send_lookup(int fd, uint64_t id, uint64_t addr)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;

	q.addresses = &addr;
	q.n_addresses = 1;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	td_send_request(fd, &req, NULL, 0);
}

void td_lookup(int fd, uint64_t id, uint64_t addr, int error, Mrd__MrEntry *out)
{
	Mrd__Response *resp;

	td_send_lookup(fd, id, addr);
	resp = td_expect(fd, id, error);
	if (!error && out)
		*out = *resp->mr_lookup->entries[0];
	mrd__response__free_unpacked(resp, NULL);
}

Mrd__Response *td_attach(int fd, uint64_t id, int memfd, uint64_t off, uint64_t len, int error)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExtmemAttachRequest at = MRD__EXTMEM_ATTACH_REQUEST__INIT;

	at.offset = off;
	at.length = len;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_EXTMEM_ATTACH;
	req.extmem_attach = &at;
	td_send_request(fd, &req, &memfd, 1);
	return td_expect(fd, id, error);
}

int td_attach_sealed(int fd, uint64_t id, uint64_t size, uint64_t *ret_address)
{
	int memfd = memfd_create("ext", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	Mrd__Response *resp;

	ck_assert_int_ge(memfd, 0);
	ck_assert_int_eq(ftruncate(memfd, (off_t)size), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	resp = td_attach(fd, id, memfd, 0, size, 0);
	*ret_address = resp->extmem_attach->address;
	mrd__response__free_unpacked(resp, NULL);
	return memfd;
}

void td_send_mempool_register(int fd, uint64_t id, const char *name, const uint64_t *starts,
			      const uint64_t *lengths, size_t n, bool extmem)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolRegisterRequest q = MRD__MEMPOOL_REGISTER_REQUEST__INIT;

	q.name = (char *)name;
	q.starts = (uint64_t *)starts;
	q.n_starts = n;
	q.lengths = (uint64_t *)lengths;
	q.n_lengths = n;
	q.extmem = extmem;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_REGISTER;
	req.mempool_register = &q;
	td_send_request(fd, &req, NULL, 0);
}

void td_send_dma(int fd, uint64_t id, unsigned op, const Mrd__MrEntry *l, uint64_t laddr,
		 const Mrd__MrEntry *rm, uint64_t raddr, uint64_t len)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DmaRequest q = MRD__DMA_REQUEST__INIT;

	q.op = op;
	q.lkey = l->lkey;
	q.laddr = laddr;
	q.rkey = rm->rkey;
	q.raddr = raddr;
	q.length = len;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_DMA;
	req.dma = &q;
	td_send_request(fd, &req, NULL, 0);
}

void td_dma(int fd, uint64_t id, unsigned op, const Mrd__MrEntry *l, uint64_t laddr,
	    const Mrd__MrEntry *rm, uint64_t raddr, uint64_t len, int error)
{
	td_send_dma(fd, id, op, l, laddr, rm, raddr, len);
	td_expect_free(fd, id, error);
}

void td_send_mempool_unregister(int fd, uint64_t id, const char *name)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolUnregisterRequest q = MRD__MEMPOOL_UNREGISTER_REQUEST__INIT;

	q.name = (char *)name;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_UNREGISTER;
	req.mempool_unregister = &q;
	td_send_request(fd, &req, NULL, 0);
}

void td_mempool_unregister(int fd, uint64_t id, const char *name, int error)
{
	td_send_mempool_unregister(fd, id, name);
	td_expect_free(fd, id, error);
}

Mrd__Response *td_join(int fd, uint64_t id, uint64_t resume_instance, uint64_t resume_session,
		       int *status_fd)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__JoinDomainRequest q = MRD__JOIN_DOMAIN_REQUEST__INIT;
	Mrd__Response *resp;
	int fds[WIRE_FDS_MAX];
	size_t n;

	q.resume_instance = resume_instance;
	q.resume_session = resume_session;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_JOIN_DOMAIN;
	req.join_domain = &q;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect_fds(fd, id, 0, fds, &n);
	ck_assert_uint_eq(n, 1);
	if (status_fd)
		*status_fd = fds[0];
	else
		close(fds[0]);
	return resp;
}

struct domain *td_find_domain(const char *name)
{
	struct domain *d;

	LIST_FOREACH(d, &td_manager->core.domains, link)
		if (strcmp(d->name, name) == 0)
			return d;
	return NULL;
}
