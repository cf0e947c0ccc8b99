/* SPDX-License-Identifier: MIT */
/* Two users, uid 1000 (A) and uid 2000 (B), neither an admin: B tries every request against
 * what A holds (memory, attached memory, keys, a mempool, a parked pool handle, its domain's
 * views) and gets nothing of it: no descriptor, no address, no key, no detail. A table names a
 * case per request type, and the suite fails when a request type has none, so a new request
 * cannot arrive without its isolation case. */
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "control/client.h"
#include "core/domain.h"
#include "registration/frmr-pool.h"
#include "macro.h"
#include "control/manager.h"
#include "test-daemon.h"
#include "check-run.h"

struct world {
	int a, b;              /* their connections */
	struct client *ca, *cb;
	uint64_t mem, ext;     /* A's allocation and A's attached memory */
	Mrd__MrEntry keys;     /* A's keys for mem */
	uint64_t own;          /* B's allocation */
	Mrd__MrEntry own_keys; /* B's keys for own */
	uint32_t window;       /* the rkey of a window A granted over mem */
};

static uint64_t next_id = 100;

/* B's request; the reply must carry error and no descriptor. Returned for more checks. */
static Mrd__Response *ask(struct world *w, Mrd__Request *req, int error)
{
	int fds[WIRE_FDS_MAX];
	size_t n = 0;
	Mrd__Response *resp;

	req->id = ++next_id;
	td_send_request(w->b, req, NULL, 0);
	resp = td_expect_fds(w->b, req->id, error, fds, &n);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	ck_assert_msg(error == 0 || n == 0, "a refusal carried %zu descriptors", n);
	return resp;
}

static void ask_free(struct world *w, Mrd__Request *req, int error)
{
	mrd__response__free_unpacked(ask(w, req, error), NULL);
}

static Mrd__MrEntry lookup(int fd, uint64_t addr)
{
	Mrd__MrEntry e;

	td_lookup(fd, ++next_id, addr, 0, &e);
	return e;
}

/* Views name no other domain than the asker's. */
static void names_only_own(const Mrd__Response *resp)
{
	uint8_t buf[65536];
	size_t len = mrd__response__get_packed_size(resp);

	ck_assert_uint_le(len, sizeof(buf));
	mrd__response__pack(resp, buf);
	ck_assert_msg(!memmem(buf, len, "uid-1000", 8), "B's view names A's domain");
}

/* ---- one case per request type ---- */

static void try_hello(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest h = MRD__HELLO_REQUEST__INIT;

	h.min_version = h.max_version = 1;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &h;
	ask_free(w, &req, EALREADY); /* once per connection: nothing to gain by a second */
}

static void try_ping(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest p = MRD__PING_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &p;
	ask_free(w, &req, 0);
}

static void try_status(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__StatusRequest s = MRD__STATUS_REQUEST__INIT;
	Mrd__Response *resp;

	req.body_case = MRD__REQUEST__BODY_STATUS;
	req.status = &s;
	resp = ask(w, &req, 0);
	names_only_own(resp);
	/* Counts of B's own domain alone: nothing tells that A uses mrd, or how much. */
	ck_assert_str_eq(resp->status_reply->view, "uid-2000");
	ck_assert_uint_eq(resp->status_reply->domains, 1);
	ck_assert_uint_eq(resp->status_reply->clients, 1);
	ck_assert_uint_eq(resp->status_reply->requests, 0);
	ck_assert_uint_eq(resp->status_reply->max_clients, td_manager->core.config.quota.clients);
	mrd__response__free_unpacked(resp, NULL);
}

static void try_export_pd(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExportPdRequest e = MRD__EXPORT_PD_REQUEST__INIT;

	/* Soft has no device to share; on verbs each domain has a context and PD of its own
	 * (tests/vm: the contract's test_other_pd_keys_refused). */
	req.body_case = MRD__REQUEST__BODY_EXPORT_PD;
	req.export_pd = &e;
	ask_free(w, &req, EOPNOTSUPP);
}

static void try_bind_pd(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__BindPdRequest b = MRD__BIND_PD_REQUEST__INIT;
	Mrd__Response *resp;
	int p[2];

	/* B, which looked up keys already, names a PD handle with a descriptor that is no command
	 * fd: refused before any ioctl (too late to bind), and nothing of A's could be named
	 * (its domain's context is mrd's alone). */
	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	b.pd_handle = 0;
	req.id = ++next_id;
	req.body_case = MRD__REQUEST__BODY_BIND_PD;
	req.bind_pd = &b;
	td_send_request(w->b, &req, &p[0], 1);
	resp = td_expect(w->b, req.id, EBUSY);
	names_only_own(resp);
	mrd__response__free_unpacked(resp, NULL);
	close(p[0]);
	close(p[1]);
}

static void try_join_domain(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__JoinDomainRequest j = MRD__JOIN_DOMAIN_REQUEST__INIT;
	Mrd__Response *resp;

	req.body_case = MRD__REQUEST__BODY_JOIN_DOMAIN;
	req.join_domain = &j;
	resp = ask(w, &req, 0); /* its own status page only */
	ck_assert_str_eq(resp->join_domain->domain, "uid-2000");
	mrd__response__free_unpacked(resp, NULL);
}

static void try_alloc(struct world *w)
{
	/* B's memory comes from B's arenas, nowhere near A's; its registration of the size of
	 * the handle A's free parked is a miss in B's own pools. */
	uint64_t addr = td_alloc(w->b, ++next_id, 64 * 1024);
	Mrd__MrEntry e = lookup(w->b, addr);
	struct frmr_pool_stats st[16];
	size_t n = frmr_pools_stats(&w->cb->domain->reg.base.pools, st, 16);
	uint64_t queued = 0;

	ck_assert(addr + 64 * 1024 <= w->mem || addr >= w->mem + (1 << 20));
	ck_assert_uint_ne(e.lkey, w->keys.lkey);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(st[i].hits, 0);
	n = frmr_pools_stats(&w->ca->domain->reg.base.pools, st, 16);
	for (size_t i = 0; i < n; i++)
		queued += st[i].queued;
	ck_assert_uint_eq(queued, 1); /* A's parked handle stays A's */
	td_free(w->b, ++next_id, addr, 0);
}

static void try_free(struct world *w)
{
	td_free(w->b, ++next_id, w->mem, ENOENT);
	td_free(w->b, ++next_id, w->ext, ENOENT);
}

static void try_map(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MapRequest m = MRD__MAP_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_MAP;
	req.map = &m;
	m.address = w->mem;
	ask_free(w, &req, ENOENT); /* no arena descriptor */
	m.address = w->ext;
	ask_free(w, &req, ENOENT);
}

static void try_alias_span(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AliasSpanRequest q = MRD__ALIAS_SPAN_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_ALIAS_SPAN;
	req.alias_span = &q;
	q.address = w->mem;
	q.span_length = 4096;
	ask_free(w, &req, ENOENT); /* another domain's memory is no memory at all */
	q.address = w->ext;
	ask_free(w, &req, ENOENT);
}

static void try_extmem_attach(struct world *w)
{
	/* B attaches memory of its own: nothing of A's is named. */
	int memfd = memfd_create("b", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	Mrd__Response *resp;

	ck_assert_int_eq(ftruncate(memfd, 4096), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	resp = td_attach(w->b, ++next_id, memfd, 0, 4096, 0);
	ck_assert(resp->extmem_attach->address != w->ext);
	mrd__response__free_unpacked(resp, NULL);
	close(memfd);
}

static void try_extmem_detach(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ExtmemDetachRequest d = MRD__EXTMEM_DETACH_REQUEST__INIT;

	d.address = w->ext;
	req.body_case = MRD__REQUEST__BODY_EXTMEM_DETACH;
	req.extmem_detach = &d;
	ask_free(w, &req, ENOENT);
}

static void try_clients(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ClientsRequest c = MRD__CLIENTS_REQUEST__INIT;
	Mrd__Response *resp;

	req.body_case = MRD__REQUEST__BODY_CLIENTS;
	req.clients = &c;
	resp = ask(w, &req, 0);
	for (size_t i = 0; i < resp->clients->n_clients; i++)
		ck_assert_uint_ne(resp->clients->clients[i]->uid, 1000);
	names_only_own(resp);
	mrd__response__free_unpacked(resp, NULL);
}

static void try_mr_lookup(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;
	uint64_t addrs[2] = { w->mem, w->ext };

	q.addresses = addrs;
	q.n_addresses = 1;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	ask_free(w, &req, ENOENT);
	q.addresses = &addrs[1];
	ask_free(w, &req, ENOENT);
}

/* Refused: a key of A's is unknown in B's domain, or (each domain numbers its own keys) names
 * an MR of B's own, which does not hold A's addresses. */
static void dma_refused(struct world *w, Mrd__Request *req)
{
	Mrd__Response *resp;
	int fds[WIRE_FDS_MAX];
	size_t n = 0;

	req->id = ++next_id;
	td_send_request(w->b, req, NULL, 0);
	resp = td_recv_reply(w->b, fds, &n);
	ck_assert_ptr_nonnull(resp);
	ck_assert_msg(resp->status == ENOKEY || resp->status == EACCES || resp->status == EFAULT,
		      "Dma with A's keys: status %d (%s)", resp->status, resp->message);
	ck_assert_uint_eq(n, 0);
	mrd__response__free_unpacked(resp, NULL);
}

static void try_dma(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DmaRequest d = MRD__DMA_REQUEST__INIT;
	const uint8_t *own = (const uint8_t *)(uintptr_t)w->own;

	req.body_case = MRD__REQUEST__BODY_DMA;
	req.dma = &d;
	d.length = 8;
	/* A's keys reach nothing of A's from B's domain: not to read A's memory into B's ... */
	d.op = 1;
	d.lkey = w->own_keys.lkey, d.laddr = w->own;
	d.rkey = w->keys.rkey, d.raddr = w->mem;
	dma_refused(w, &req);
	ck_assert_uint_ne(own[0], 0xaa);
	/* ... nor to write B's into A's, nor A's into A's. */
	d.op = 0;
	dma_refused(w, &req);
	d.lkey = w->keys.lkey, d.laddr = w->mem;
	dma_refused(w, &req);
	for (size_t i = 0; i < 16; i++)
		ck_assert_uint_eq(((uint8_t *)(uintptr_t)w->mem)[i], 0xaa); /* untouched */
}

/* Neither a window over A's memory (not memory of B's domain at all) nor the revoke of A's. */
static void try_window_grant(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowGrantRequest g = MRD__WINDOW_GRANT_REQUEST__INIT;
	Mrd__Response *resp;

	req.body_case = MRD__REQUEST__BODY_WINDOW_GRANT;
	req.window_grant = &g;
	g.address = w->mem, g.length = 4096, g.access = 3;
	resp = ask(w, &req, ENOENT);
	ck_assert_ptr_null(resp->window_grant); /* no rkey */
	mrd__response__free_unpacked(resp, NULL);
}

static void try_window_revoke(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowRevokeRequest r = MRD__WINDOW_REVOKE_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_WINDOW_REVOKE;
	req.window_revoke = &r;
	r.rkey = w->window;
	ask_free(w, &req, ENOENT); /* A's window stays: A revokes it at the end */
}

static void try_window_track(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowTrackRequest t = MRD__WINDOW_TRACK_REQUEST__INIT;
	uint32_t handle = 0;

	/* Handles name windows of the connection's own bound context alone: B, bound to none,
	 * can have mrd deallocate nothing (A's windows are mrd's, in its domain's context). */
	req.body_case = MRD__REQUEST__BODY_WINDOW_TRACK;
	req.window_track = &t;
	t.add = &handle;
	t.n_add = 1;
	ask_free(w, &req, ENXIO);
}

/* A grants a window over the first page of mem (rkey 0) and answers its rkey, or revokes the
 * window of rkey; either must succeed. */
static uint32_t a_window(struct world *w, uint32_t rkey)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowGrantRequest g = MRD__WINDOW_GRANT_REQUEST__INIT;
	Mrd__WindowRevokeRequest r = MRD__WINDOW_REVOKE_REQUEST__INIT;
	int fds[WIRE_FDS_MAX];
	Mrd__Response *resp;
	size_t n = 0;

	if (rkey) {
		req.body_case = MRD__REQUEST__BODY_WINDOW_REVOKE;
		req.window_revoke = &r;
		r.rkey = rkey;
	} else {
		req.body_case = MRD__REQUEST__BODY_WINDOW_GRANT;
		req.window_grant = &g;
		g.address = w->mem, g.length = 4096, g.access = 3;
	}
	req.id = ++next_id;
	td_send_request(w->a, &req, NULL, 0);
	resp = td_expect_fds(w->a, req.id, 0, fds, &n);
	if (!rkey) {
		ck_assert_ptr_nonnull(resp->window_grant);
		rkey = resp->window_grant->rkey;
	}
	mrd__response__free_unpacked(resp, NULL);
	return rkey;
}

static void try_mempool_register(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolRegisterRequest q = MRD__MEMPOOL_REGISTER_REQUEST__INIT;
	uint64_t start = w->mem, length = 4096;

	q.name = (char *)"theirs";
	q.starts = &start;
	q.n_starts = 1;
	q.lengths = &length;
	q.n_lengths = 1;
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_REGISTER;
	req.mempool_register = &q;
	ask_free(w, &req, EFAULT);
}

static void try_mempool_unregister(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolUnregisterRequest q = MRD__MEMPOOL_UNREGISTER_REQUEST__INIT;

	q.name = (char *)"a-pool";
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_UNREGISTER;
	req.mempool_unregister = &q;
	ask_free(w, &req, ENOENT);
}

static void try_mempools(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolsRequest q = MRD__MEMPOOLS_REQUEST__INIT;
	Mrd__Response *resp;

	req.body_case = MRD__REQUEST__BODY_MEMPOOLS;
	req.mempools = &q;
	resp = ask(w, &req, 0);
	names_only_own(resp);
	ck_assert_uint_eq(resp->mempools->n_mempools, 0);
	mrd__response__free_unpacked(resp, NULL);
}

static void try_prefetch(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PrefetchRequest q = MRD__PREFETCH_REQUEST__INIT;

	q.address = w->mem;
	q.length = 4096;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &q;
	ask_free(w, &req, EFAULT);
}

static void try_frmr_pools(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FrmrPoolsRequest q = MRD__FRMR_POOLS_REQUEST__INIT;
	Mrd__Response *resp;

	req.body_case = MRD__REQUEST__BODY_FRMR_POOLS;
	req.frmr_pools = &q;
	resp = ask(w, &req, 0);
	names_only_own(resp);
	mrd__response__free_unpacked(resp, NULL);
}

static void try_frmr_pools_set(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FrmrPoolsSetRequest q = MRD__FRMR_POOLS_SET_REQUEST__INIT;

	q.domain = (char *)"uid-1000";
	q.given = MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_AGING; /* valid: only the rights are lacking */
	q.aging_s = 1;
	req.body_case = MRD__REQUEST__BODY_FRMR_POOLS_SET;
	req.frmr_pools_set = &q;
	ask_free(w, &req, EPERM);
}

static void try_flush(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FlushRequest q = MRD__FLUSH_REQUEST__INIT;

	q.domain = (char *)"uid-1000";
	q.gc = true;
	req.body_case = MRD__REQUEST__BODY_FLUSH;
	req.flush = &q;
	ask_free(w, &req, EPERM);
	q.domain = (char *)"";
	q.by_uid = true;
	q.uid = 1000;
	ask_free(w, &req, EPERM);
}

/* mrctl shutdown and reload: an administrator's alone. */
static void try_shutdown(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ShutdownRequest q = MRD__SHUTDOWN_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_SHUTDOWN;
	req.shutdown = &q;
	ask_free(w, &req, EPERM);
}

static void try_reload(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ReloadRequest q = MRD__RELOAD_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_RELOAD;
	req.reload = &q;
	ask_free(w, &req, EPERM);
}

static void try_domain_dump(struct world *w)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DomainDumpRequest q = MRD__DOMAIN_DUMP_REQUEST__INIT;
	Mrd__Response *theirs, *none;
	char same[256], *at;

	req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
	req.domain_dump = &q;
	q.domain = (char *)"uid-1000";
	theirs = ask(w, &req, ENOENT);
	/* Refused as a domain nobody uses is: the words do not tell that A's exists. */
	q.domain = (char *)"uid-3000";
	none = ask(w, &req, ENOENT);
	snprintf(same, sizeof(same), "%s", theirs->message);
	at = strstr(same, "uid-1000");
	ck_assert_ptr_nonnull(at);
	memcpy(at, "uid-3000", 8);
	ck_assert_str_eq(same, none->message);
	mrd__response__free_unpacked(theirs, NULL);
	mrd__response__free_unpacked(none, NULL);
}

static const struct {
	Mrd__Request__BodyCase body;
	void (*run)(struct world *w);
} cases[] = {
	{ MRD__REQUEST__BODY_HELLO, try_hello },
	{ MRD__REQUEST__BODY_PING, try_ping },
	{ MRD__REQUEST__BODY_STATUS, try_status },
	{ MRD__REQUEST__BODY_EXPORT_PD, try_export_pd },
	{ MRD__REQUEST__BODY_JOIN_DOMAIN, try_join_domain },
	{ MRD__REQUEST__BODY_ALLOC, try_alloc },
	{ MRD__REQUEST__BODY_FREE, try_free },
	{ MRD__REQUEST__BODY_MAP, try_map },
	{ MRD__REQUEST__BODY_EXTMEM_ATTACH, try_extmem_attach },
	{ MRD__REQUEST__BODY_EXTMEM_DETACH, try_extmem_detach },
	{ MRD__REQUEST__BODY_CLIENTS, try_clients },
	{ MRD__REQUEST__BODY_MR_LOOKUP, try_mr_lookup },
	{ MRD__REQUEST__BODY_DMA, try_dma },
	{ MRD__REQUEST__BODY_MEMPOOL_REGISTER, try_mempool_register },
	{ MRD__REQUEST__BODY_MEMPOOL_UNREGISTER, try_mempool_unregister },
	{ MRD__REQUEST__BODY_MEMPOOLS, try_mempools },
	{ MRD__REQUEST__BODY_PREFETCH, try_prefetch },
	{ MRD__REQUEST__BODY_FRMR_POOLS, try_frmr_pools },
	{ MRD__REQUEST__BODY_FRMR_POOLS_SET, try_frmr_pools_set },
	{ MRD__REQUEST__BODY_FLUSH, try_flush },
	{ MRD__REQUEST__BODY_DOMAIN_DUMP, try_domain_dump },
	{ MRD__REQUEST__BODY_BIND_PD, try_bind_pd },
	{ MRD__REQUEST__BODY_ALIAS_SPAN, try_alias_span },
	{ MRD__REQUEST__BODY_SHUTDOWN, try_shutdown },
	{ MRD__REQUEST__BODY_RELOAD, try_reload },
	{ MRD__REQUEST__BODY_WINDOW_GRANT, try_window_grant },
	{ MRD__REQUEST__BODY_WINDOW_REVOKE, try_window_revoke },
	{ MRD__REQUEST__BODY_WINDOW_TRACK, try_window_track },
};

/* A's holdings: memory (written), attached memory, keys, a mempool, a parked pool handle. */
static void build_world(struct world *w)
{
	const char *settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
				   "memory.hugepages=no", NULL };
	int memfd = memfd_create("a", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	Mrd__Response *resp;
	uint64_t parked, start, length = 64 * 1024;

	td_start(settings);
	w->a = td_hello_client(1000, &w->ca);
	w->b = td_hello_client(2000, &w->cb);
	ck_assert(!w->ca->admin && !w->cb->admin);

	w->mem = td_alloc(w->a, 2, 1 << 20);
	memset((void *)(uintptr_t)w->mem, 0xaa, 1 << 20);
	w->keys = lookup(w->a, w->mem);

	ck_assert_int_eq(ftruncate(memfd, 4 * 4096), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	resp = td_attach(w->a, 3, memfd, 0, 4 * 4096, 0);
	w->ext = resp->extmem_attach->address;
	mrd__response__free_unpacked(resp, NULL);
	close(memfd);
	(void)lookup(w->a, w->ext);

	start = w->mem;
	td_send_mempool_register(w->a, 4, "a-pool", &start, &length, 1, false);
	td_expect_free(w->a, 4, 0);

	parked = td_alloc(w->a, 5, 64 * 1024); /* registered, then freed: its handle is parked */
	(void)lookup(w->a, parked);
	td_free(w->a, 6, parked, 0);

	w->own = td_alloc(w->b, 2, 64 * 1024);
	w->own_keys = lookup(w->b, w->own);
	w->window = a_window(w, 0);
}

START_TEST(test_every_request_refuses_the_other_user)
{
	const ProtobufCMessageDescriptor *rd = &mrd__request__descriptor;
	struct world w;

	build_world(&w);
	/* Every request type has its case. */
	for (unsigned i = 0; i < rd->n_fields; i++) {
		bool found = false;

		if (!(rd->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		for (size_t k = 0; k < ELEMENTSOF(cases); k++)
			found |= (unsigned)cases[k].body == rd->fields[i].id;
		ck_assert_msg(found, "no isolation case for %s", rd->fields[i].name);
	}
	for (size_t k = 0; k < ELEMENTSOF(cases); k++)
		cases[k].run(&w);

	ck_assert_ptr_ne(w.ca->domain, w.cb->domain);
	/* And A still has all it had. */
	ck_assert_uint_eq(lookup(w.a, w.mem).lkey, w.keys.lkey);
	ck_assert_uint_eq(((uint8_t *)(uintptr_t)w.mem)[4095], 0xaa);
	(void)lookup(w.a, w.ext);
	(void)a_window(&w, w.window); /* still A's: B's revoke left it */
	close(w.a);
	close(w.b);
	td_stop();
}
END_TEST

/* Each domain has its own keys (soft: a context each), so A using up its own, with a small key
 * space ($MRD_SOFT_KEY_BITS), fails A's registrations with a message naming the limit and
 * leaves B registering and moving data as before. */
START_TEST(test_one_domain_uses_up_only_its_keys)
{
	const char *settings[] = { "mrd.provider=soft", "memory.window_size=4G",
				   "memory.arena_size=64M", "memory.hugepages=no", NULL };
	struct client *ca, *cb;
	Mrd__MrEntry own, dst;
	Mrd__Response *resp;
	const uint64_t max_keys = ((1u << 6) - 2) * 255;
	uint64_t made = 0, mem = 0, b_mem;
	int a, b, fds[WIRE_FDS_MAX];
	size_t n_fds;

	ck_assert_int_eq(setenv("MRD_SOFT_KEY_BITS", "6", 1), 0); /* 62 indexes */
	td_start(settings);
	a = td_hello_client(1000, &ca);
	b = td_hello_client(2000, &cb);
	b_mem = td_alloc(b, 2, 64 * 1024);
	own = lookup(b, b_mem);
	for (;; made++) {
		ck_assert_uint_lt(made, max_keys + 1000);
		mem = td_alloc(a, ++next_id, 4096);
		td_send_lookup(a, ++next_id, mem);
		n_fds = 0;
		resp = td_recv_reply(a, fds, &n_fds);
		ck_assert_ptr_nonnull(resp);
		ck_assert_uint_eq(n_fds, 0);
		if (resp->status != 0)
			break;
		mrd__response__free_unpacked(resp, NULL);
		td_free(a, ++next_id, mem, 0);
	}
	ck_assert_msg(resp->status == EKEYEXPIRED && strstr(resp->message, "keys are used up") &&
			      strstr(resp->message, "15810"),
		      "after %" PRIu64 " keys: status %d (%s)", made, resp->status, resp->message);
	ck_assert_uint_le(made, max_keys);
	mrd__response__free_unpacked(resp, NULL);
	td_free(a, ++next_id, mem, 0);

	/* B is untouched: new registrations, and a Dma between them. */
	dst = lookup(b, td_alloc(b, ++next_id, 64 * 1024));
	memset((void *)(uintptr_t)own.start, 0x5a, 8);
	td_dma(b, ++next_id, 0, &own, own.start, &dst, dst.start, 8, 0);
	ck_assert_uint_eq(*(uint8_t *)(uintptr_t)dst.start, 0x5a);
	close(a);
	close(b);
	td_stop();
	ck_assert_int_eq(unsetenv("MRD_SOFT_KEY_BITS"), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("isolation");
	TCase *tc = tcase_create("two users");

	tcase_add_test(tc, test_every_request_refuses_the_other_user);
	tcase_add_test(tc, test_one_domain_uses_up_only_its_keys);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
