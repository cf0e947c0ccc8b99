/* SPDX-License-Identifier: MIT */
/* Clients of one mrd on a real RDMA device (Soft-RoCE in the VM test, tests/vm/).
 *
 *   rdma-peers pair SOCKET GID_INDEX [VICTIM_PID]
 *     Two client processes of one domain. Each allocates mrd memory and gets its keys through
 *     libmrd's lookup path; the initiator moves bytes into the target's buffer with RDMA WRITE,
 *     reads them back with RDMA READ, writes from a registered mempool, and, after the target
 *     freed and allocated again (a new generation), finds the old key refused and the new one,
 *     looked up afresh, working. The transfers run on RC QPs the clients create on the
 *     domain's PD, imported through mrd_verbs_import_pd(); where the device cannot be
 *     imported (rxe: librxe has no import_context) that check is a SKIP and mrd posts the
 *     same work requests on its own QPs in the domain's PD (mrd_dma), so the device still
 *     judges every key. Between two transfers the initiator SIGKILLs VICTIM_PID.
 *   rdma-peers bound SOCKET GID_INDEX
 *     The same pair, each peer a uid-1000 process with RLIMIT_MEMLOCK 64 KiB (its own
 *     ibv_reg_mr of 1 MiB fails) on its own context and PD, bound to mrd
 *     (mrd_verbs_bind_pd): the keys mrd hands out are of MRs in that PD, and the transfers
 *     run on the peers' own QPs; the mempool is registered in the initiator's own PD.
 *   rdma-peers windows SOCKET GID_INDEX
 *     Memory windows in the client-PD model: two bound peers as above (uid 1000, memlock 64
 *     KiB), the target granting type-2 windows of its own PD on its own QP over its mrd memory
 *     (mrd_window_grant with the QP), the initiator writing and reading through their rkeys:
 *     exactly the window's bytes (one byte before or past refused), a revoked window refused
 *     once a work request after the revoke completed, a freed buffer's window refused and the
 *     memory allocated after the free untouched, 100000 grant+revoke cycles (no rkey handed
 *     out twice) with the first and last cycles' rkeys refused, a QP's windows refused after
 *     mrd_window_qp_gone, and a window the handle still had at its close refused. The target waits for a completion of a later
 *     work request of its QP (a fence) after each grant before it sends the rkey, and before
 *     each free and close (what mrd_window_grant(3) asks of a program).
 *   rdma-peers windows-killed SOCKET GID_INDEX
 *     As windows, the target killed (SIGKILL) once its window is bound and written through.
 *   rdma-peers windows-serve SOCKET GID_INDEX PORT | windows-ask SOCKET GID_INDEX HOST PORT
 *     The same across two hosts (each its own mrd): the target serves on PORT, the
 *     initiator connects to HOST.
 *   rdma-peers bound-hold SOCKET
 *     A bound uid-1000 client with 4 MiB looked up and a QP of its own: "@@ HOLDING", then
 *     holds them until killed.
 *   rdma-peers bound-hostile SOCKET [OTHER_DEVICE]
 *     BindPd refusals, as uid 1000: a pipe, OTHER_DEVICE's command fd, a PD handle the client
 *     does not have, a second bind, a bind after a lookup; then a client that deallocates its
 *     PD and closes its context while mrd registers 64 MiB into it. Each a clear error.
 *   rdma-peers two-devices SOCKET DEVICE DEVICE
 *     One uid-1000 process (RLIMIT_MEMLOCK 64 KiB) with a context and PD on each device and a
 *     handle bound to each: one buffer of mrd's gets keys on both, each working on its own
 *     device (an RDMA WRITE on two QPs of that PD, looped back), and mrctl status lists both
 *     devices with the process bound on each.
 *   rdma-peers victim SOCKET UID
 *     Becomes UID, allocates and registers memory in its domain, prints "@@ VICTIM_READY",
 *     then sends requests (registrations, frees, 2 MiB Dma) in a loop until it is killed.
 *   rdma-peers hold SOCKET UID
 *     Becomes UID, allocates 4 MiB and looks up its keys (in a domain whose policy is odp, mrd
 *     registers on-demand children), prints "@@ HOLDING", and holds them until killed.
 *
 * Prints "@@ RESULT<TAB>PASS|FAIL|SKIP<TAB>name<TAB>detail" lines; exits 0 unless a check
 * failed. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>
#include <mrd/mrd-verbs.h>

#include "provider/verbs-loopback.h"
#include <rdma/ib_user_verbs.h>

#define BUF_SIZE (1u << 20)

struct wire_qp {
	uint32_t qpn, psn;
	union ibv_gid gid;
};

struct peer {
	const char *who;
	mrd_client *client;
	bool own_qp; /* the imported PD's QP, else mrd_dma */
	bool bound;  /* ... or its own context's PD, bound to mrd */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	mrd_cache *l;
	int gid_index;
	int sock; /* to the other peer */
};

static int failures;

static void report(const char *verdict, const char *name, const char *detail)
{
	printf("@@ RESULT\t%s\t%s\t%s\n", verdict, name, detail);
	fflush(stdout);
}

static void result(const char *name, bool ok)
{
	report(ok ? "PASS" : "FAIL", name, "");
	failures += !ok;
}

/* A refusal must be the device's: a timeout or a broken request is no proof of a key check. */
/* r must be the error expected; mrd's words go with the result either way. */
static void refused_as(const char *name, int r, int expected)
{
	char detail[400];

	char want[32] = "";

	if (r != expected)
		snprintf(want, sizeof(want), ", expected %d", expected);
	snprintf(detail, sizeof(detail), "answered %d (%s)%s", r, r < 0 ? mrd_last_error() : "",
		 want);
	report(r == expected ? "PASS" : "FAIL", name, detail);
	failures += r != expected;
}

/* The device refused a key: r comes from a completion (or mrd_dma), not from mrd's words. */
static void refused(const char *name, int r)
{
	char detail[128];

	snprintf(detail, sizeof(detail), "answered %d (%s), not -EKEYREJECTED", r, strerror(-r));
	report(r == -EKEYREJECTED ? "PASS" : "FAIL", name, r == -EKEYREJECTED ? "" : detail);
	failures += r != -EKEYREJECTED;
}

static void die(const char *who, const char *what, int r)
{
	char detail[512];

	snprintf(detail, sizeof(detail), "%s: %s (%s)", what, strerror(r < 0 ? -r : r),
		 mrd_last_error());
	report("FAIL", who, detail);
	exit(2);
}

static void xsend(struct peer *p, const void *buf, size_t n)
{
	if (write(p->sock, buf, n) != (ssize_t)n)
		die(p->who, "write to peer", errno);
}

static void xrecv(struct peer *p, void *buf, size_t n)
{
	if (read(p->sock, buf, n) != (ssize_t)n)
		die(p->who, "read from peer", errno ? errno : EPIPE);
}

/* Does the device let a client import its domain's context and PD? Asked once, by a client
 * of its own, so both peers take the same path. */
static bool probe_import(const char *sock)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	mrd_client *c;
	int r;

	r = mrd_client_connect(sock, &c);
	if (r < 0)
		die("probe", "connect", r);
	r = mrd_verbs_import_pd(c, &ctx, &pd);
	if (r == 0) {
		report("PASS", "a client imports its domain's device and PD", "");
		ibv_unimport_pd(pd);
		ibv_close_device(ctx);
	} else if (r == -EOPNOTSUPP)
		report("SKIP", "a client imports its domain's device and PD",
		       "ibv_import_device: the provider library has no import_context (librxe); "
		       "transfers go through mrd_dma on the domain's PD instead");
	else
		die("probe", "mrd_verbs_import_pd", r);
	mrd_client_close(c);
	return r == 0;
}

/* uid 1000, and RLIMIT_MEMLOCK 64 KiB: what it pins itself is that much at most. */
static void become_small_user(const char *who)
{
	struct rlimit rl = { 65536, 65536 };

	if (setrlimit(RLIMIT_MEMLOCK, &rl) || setresgid(1000, 1000, 1000) ||
	    setresuid(1000, 1000, 1000))
		die(who, "become uid 1000 with RLIMIT_MEMLOCK 64 KiB", -errno);
}

/* Its own context on the device ($MRD_DEVICE, else the first) and a PD there. */
static void open_own(struct peer *p)
{
	const char *want = getenv("MRD_DEVICE");
	struct ibv_device **l = ibv_get_device_list(NULL);

	for (int i = 0; l && l[i] && !p->ctx; i++)
		if (!want || strcmp(ibv_get_device_name(l[i]), want) == 0)
			p->ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	if (!p->ctx)
		die(p->who, "open its own context", -ENODEV);
	p->pd = ibv_alloc_pd(p->ctx);
	if (!p->pd)
		die(p->who, "allocate its own PD", -errno);
}

/* The bound model's premise: the client cannot pin 1 MiB itself. */
static void own_reg_fails(struct peer *p)
{
	char *m = malloc(BUF_SIZE), name[160];
	struct ibv_mr *mr;

	memset(m, 1, BUF_SIZE);
	mr = ibv_reg_mr(p->pd, m, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	snprintf(name, sizeof(name), "%s: its own ibv_reg_mr of 1 MiB fails (uid 1000, "
		 "RLIMIT_MEMLOCK 64 KiB): %s", p->who, mr ? "it worked" : strerror(errno));
	result(name, mr == NULL);
	if (mr)
		ibv_dereg_mr(mr);
	free(m);
}

static void peer_open(struct peer *p)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	int r;

	if (p->bound)
		become_small_user(p->who);
	r = mrd_client_connect(getenv("MRD_SOCKET"), &p->client);
	if (r < 0)
		die(p->who, "connect", r);
	r = mrd_cache_new(p->client, &p->l);
	if (r < 0)
		die(p->who, "lookup init", r);
	if (!p->own_qp)
		return;
	if (p->bound) {
		char name[160];

		open_own(p);
		own_reg_fails(p);
		r = mrd_verbs_bind_pd(p->client, p->pd);
		snprintf(name, sizeof(name), "%s: mrd binds its own PD %u", p->who, p->pd->handle);
		result(name, r == 0);
		if (r < 0)
			die(p->who, mrd_last_error(), r);
	} else {
		r = mrd_verbs_import_pd(p->client, &p->ctx, &p->pd);
		if (r < 0)
			die(p->who, "import PD", r);
	}
	p->cq = ibv_create_cq(p->ctx, 32, NULL, NULL, 0);
	if (!p->cq)
		die(p->who, "create CQ", errno);
	init.send_cq = init.recv_cq = p->cq;
	p->qp = ibv_create_qp(p->pd, &init);
	if (!p->qp)
		die(p->who, "create QP", errno);
}

/* RESET -> INIT -> RTR -> RTS against the other side's QP. */
static void peer_connect(struct peer *p)
{
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct wire_qp mine = { .qpn = p->qp ? p->qp->qp_num : 0, .psn = 1 }, theirs;
	struct ibv_qp_attr a;
	int r;

	if (!p->own_qp)
		return;
	if (ibv_query_gid(p->ctx, 1, p->gid_index, &mine.gid))
		die(p->who, "query GID", errno);
	xsend(p, &mine, sizeof(mine));
	xrecv(p, &theirs, sizeof(theirs));

	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1,
				  .qp_access_flags = access };
	r = ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS);
	if (r)
		die(p->who, "QP to INIT", r);
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = theirs.qpn,
		.rq_psn = theirs.psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = theirs.gid, .sgid_index = (uint8_t)p->gid_index,
				      .hop_limit = 1 } },
	};
	r = ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		die(p->who, "QP to RTR", r);
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				  .rnr_retry = 7, .sq_psn = mine.psn, .max_rd_atomic = 1 };
	r = ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (r)
		die(p->who, "QP to RTS", r);
}

/* One RDMA WRITE (local -> remote) or READ (remote -> local); 0 when the device completed it,
 * else why not (on stderr). */
static int rdma(struct peer *p, bool read, void *local, uint32_t lkey, uint64_t remote,
		uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
				  .opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = remote, .rkey = rkey } }, *bad;
	struct ibv_wc wc;
	int n;

	if (!p->own_qp) {
		n = mrd_dma(p->client, read ? MRD_DMA_READ : MRD_DMA_WRITE, lkey, local, rkey,
			    (const void *)(uintptr_t)remote, len);
		if (n < 0)
			fprintf(stderr, "%s: mrd_dma: %s\n", p->who, mrd_last_error());
		return n;
	}
	if (ibv_post_send(p->qp, &wr, &bad))
		return -EIO;
	while ((n = ibv_poll_cq(p->cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "%s: completion: %s\n", p->who,
			n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
		/* What mrd_dma answers for the same refusal (daemon/provider/verbs-loopback.c). */
		if (n > 0 && (wc.status == IBV_WC_LOC_PROT_ERR || wc.status == IBV_WC_REM_ACCESS_ERR ||
			      wc.status == IBV_WC_REM_INV_REQ_ERR))
			return -EKEYREJECTED;
		return -EIO;
	}
	return 0;
}

/* The target: owns the buffer the initiator writes into and reads from. */
static int target(struct peer *p)
{
	struct mrd_keys mr;
	uint64_t addr, gen;
	char *buf, go;
	int r;

	peer_open(p);
	r = mrd_mem_alloc(p->client, BUF_SIZE, 0, 0, (void **)&buf);
	if (r < 0)
		die(p->who, "alloc", r);
	r = mrd_cache_keys(p->l, buf, &mr); /* registered now, so the peer finds its keys */
	if (r < 0)
		die(p->who, "lookup", r);
	memset(buf, 0, BUF_SIZE);
	strcpy(buf + 8192, "target's own bytes, read back by RDMA READ");
	peer_connect(p);
	addr = (uintptr_t)buf;
	xsend(p, &addr, sizeof(addr));
	xsend(p, &mr.rkey, sizeof(mr.rkey)); /* a bound peer's QP takes its own PD's keys */

	xrecv(p, &go, 1); /* the initiator wrote */
	go = strcmp(buf + 4096, "written by RDMA WRITE through mrd's keys") == 0;
	xsend(p, &go, 1);
	xrecv(p, &go, 1); /* ... then from its mempool */
	go = strcmp(buf + 12288, "from a registered mempool") == 0;
	xsend(p, &go, 1);

	/* Free and allocate again: the generation moves, the initiator must refetch. */
	xrecv(p, &go, 1);
	gen = mrd_client_generation(p->client);
	mrd_mem_free(p->client, buf);
	r = mrd_mem_alloc(p->client, BUF_SIZE, 0, 0, (void **)&buf);
	if (r < 0)
		die(p->who, "alloc again", r);
	memset(buf, 0, BUF_SIZE);
	r = mrd_cache_keys(p->l, buf, &mr);
	if (r < 0)
		die(p->who, "lookup again", r);
	go = mrd_client_generation(p->client) > gen;
	xsend(p, &go, 1);
	addr = (uintptr_t)buf;
	xsend(p, &addr, sizeof(addr));
	xsend(p, &mr.rkey, sizeof(mr.rkey)); /* a bound peer's QP takes its own PD's keys */
	xrecv(p, &go, 1);
	go = strcmp(buf + 4096, "after the generation moved") == 0;
	xsend(p, &go, 1);
	xrecv(p, &go, 1); /* the initiator tried the freed buffer's old key */
	go = buf[16384] == 0; /* the new buffer may lie where the old one did */
	xsend(p, &go, 1);
	xrecv(p, &go, 1); /* done */
	mrd_cache_free(p->l);
	return 0;
}

static int initiator(struct peer *p, pid_t victim)
{
	struct mrd_keys src, dst, obj_mr;
	uint32_t stale_rkey, their_rkey;
	mrd_mempool *pool;
	uint64_t remote, old_remote;
	char *buf, ok, *obj;
	int r;

	peer_open(p);
	r = mrd_mem_alloc(p->client, BUF_SIZE, 0, 0, (void **)&buf);
	if (r < 0)
		die(p->who, "alloc", r);
	peer_connect(p);
	xrecv(p, &remote, sizeof(remote));
	xrecv(p, &their_rkey, sizeof(their_rkey));
	/* The target's buffer is mrd memory of our domain: map it, and its keys come from our
	 * own lookup path, as any address's do. */
	r = mrd_mem_map(p->client, (void *)(uintptr_t)remote);
	if (r < 0)
		die(p->who, "map the target's arena", r);
	if (mrd_cache_keys(p->l, buf, &src) < 0 ||
	    mrd_cache_keys(p->l, (void *)(uintptr_t)remote, &dst) < 0)
		die(p->who, "lookup", -EIO);
	/* Bound: the responder checks the rkey in its own PD, so it is the target's (sent),
	 * while the key looked up here is of this peer's PD. Shared: the two are one. */
	if (p->bound)
		dst.rkey = their_rkey;

	strcpy(buf, "written by RDMA WRITE through mrd's keys");
	r = rdma(p, false, buf, src.lkey, remote + 4096, dst.rkey, (uint32_t)strlen(buf) + 1);
	result("RDMA WRITE from mrd memory into another client's", r == 0);
	ok = 1;
	xsend(p, &ok, 1);
	xrecv(p, &ok, 1);
	result("the target reads what was written", ok);

	if (victim > 0) {
		/* The victim is mid-request: mrd must go on serving us (the next checks), and
		 * release all it held (the guest script checks mrd's accounting). */
		result("another client killed with SIGKILL mid-run", kill(victim, SIGKILL) == 0);
	}

	memset(buf + 65536, 0, 128);
	r = rdma(p, true, buf + 65536, src.lkey, remote + 8192, dst.rkey, 64);
	result("RDMA READ back", r == 0 &&
				     strcmp(buf + 65536, "target's own bytes, read back by RDMA READ") == 0);
	/* Across the registration's end: the device must refuse it. (On a client's own QP only
	 * at the end, as a refusal leaves the QP in error.) */
	if (!p->own_qp) {
		r = rdma(p, true, buf, src.lkey, remote + BUF_SIZE - 64, dst.rkey, 128);
		refused("RDMA READ across the registration's end is refused by the device", r);
	}

	/* A registered mempool as the source: a bound handle's registers in its own PD (by
	 * lookups of its chunks: mrd's mempool registry is the domain PD's). */
	r = mrd_mempool_create(p->client, "vm-src", 64, 4096, 64, 0, 0, &pool);
	if (r >= 0)
		r = mrd_mempool_register(pool, 0);
	obj = r >= 0 ? mrd_mempool_get(pool) : NULL;
	if (obj) {
		strcpy(obj, "from a registered mempool");
		r = mrd_cache_mempool_keys(p->l, pool, obj, &obj_mr);
		if (r >= 0)
			r = rdma(p, false, obj, obj_mr.lkey, remote + 12288, dst.rkey, 64);
	}
	result("RDMA WRITE from a registered mempool", obj && r == 0);
	ok = 1;
	xsend(p, &ok, 1);
	xrecv(p, &ok, 1);
	result("the target reads the mempool's bytes", ok);

	/* The target frees and allocates again. */
	stale_rkey = dst.rkey;
	old_remote = remote;
	xsend(p, &ok, 1);
	xrecv(p, &ok, 1);
	result("the target's free moved the generation", ok);
	xrecv(p, &remote, sizeof(remote));
	xrecv(p, &their_rkey, sizeof(their_rkey));
	r = mrd_mem_map(p->client, (void *)(uintptr_t)remote);
	if (r < 0 && r != -EEXIST)
		die(p->who, "map again", r);
	r = mrd_cache_keys(p->l, (void *)(uintptr_t)remote, &dst); /* the cache saw the move */
	if (p->bound)
		dst.rkey = their_rkey;
	result("the peer's lookup refetched new keys", r == 0);
	strcpy(buf, "after the generation moved");
	r = r < 0 ? r : rdma(p, false, buf, src.lkey, remote + 4096, dst.rkey, 64);
	result("RDMA WRITE with keys looked up again after the generation moved", r == 0);
	ok = 1;
	xsend(p, &ok, 1);
	xrecv(p, &ok, 1);
	result("the target reads them", ok);
	/* Last, as a refusal leaves a QP in error: the freed buffer's rkey reaches nothing. */
	strcpy(buf, "never written");
	r = rdma(p, false, buf, src.lkey, old_remote + 16384, stale_rkey, 64);
	refused("the freed buffer's old rkey is refused by the device", r);
	xsend(p, &ok, 1);
	xrecv(p, &ok, 1);
	result("nothing was written through the old rkey", ok);
	xsend(p, &ok, 1);
	mrd_mempool_put(pool, obj);
	mrd_mempool_free(pool);
	mrd_cache_free(p->l);
	return failures ? 1 : 0;
}

static int pair(const char *sock, int gid_index, pid_t victim, bool bound)
{
	bool own_qp = bound || probe_import(sock);
	int sv[2], status, rc;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return 2;
	pid = fork();
	if (pid == 0) {
		struct peer p = { .who = "target", .own_qp = own_qp, .bound = bound,
				  .gid_index = gid_index, .sock = sv[1] };

		close(sv[0]);
		_exit(target(&p));
	}
	close(sv[1]);
	{
		struct peer p = { .who = "initiator", .own_qp = own_qp, .bound = bound,
				  .gid_index = gid_index, .sock = sv[0] };

		rc = initiator(&p, victim);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		rc = 1;
	return rc;
}

/* Memory windows in the client-PD model (mrd_window_grant with the program's own QP): the
 * target grants type-2 windows over its mrd memory on its own QP, the initiator (another
 * process, on this host or the other) reaches them through its QP connected to that one. */
#define WIN_OFF 4096u
#define WIN_LEN 4096u
#define WIN_RW (MRD_WINDOW_REMOTE_READ | MRD_WINDOW_REMOTE_WRITE)
#define WIN_CYCLES 100000

static int rkey_order(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* After a refused access both QPs are in the error state: each side resets its own and they
 * connect again (the target's windows stay bound: rxe_qp_reset leaves mw->qp). */
static void reconnect(struct peer *p)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
	struct ibv_wc wc;

	while (ibv_poll_cq(p->cq, 1, &wc) > 0)
		; /* what the error flushed */
	if (ibv_modify_qp(p->qp, &a, IBV_QP_STATE))
		die(p->who, "QP to RESET", errno);
	peer_connect(p);
}

/* The target's fence: a signaled RDMA READ of one byte of the initiator's memory, awaited; the
 * work requests libmrd posted before it on the QP (unsignaled) have run once it completes. */
static void fence(struct peer *p, void *local, uint32_t lkey, uint64_t remote, uint32_t rkey)
{
	int r = rdma(p, true, local, lkey, remote, rkey, 1);

	if (r < 0)
		die(p->who, "fence (an RDMA READ after the window's work requests)", r);
}

/* Whether the device checks a window's range against its MR's rather than the window's: rxe
 * does (Linux rxe_resp.c check_rkey: mr_check_range(mr, ...) after rxe_lookup_mw; vendor
 * 0xffffff, rxe_param.h RXE_VENDOR_ID), as mrd's caps.mw_wide says too. */
static bool windows_wide(struct peer *p)
{
	struct ibv_device_attr attr;

	return ibv_query_device(p->ctx, &attr) == 0 && attr.vendor_id == 0xffffff;
}

static void say(struct peer *p, char c)
{
	xsend(p, &c, 1);
}

static char heard(struct peer *p)
{
	char c;

	xrecv(p, &c, 1);
	return c;
}

struct win_msg {
	uint64_t addr;
	uint32_t rkey;
};

static int windows_target(struct peer *p)
{
	struct win_msg theirs, msg;
	uint32_t first = 0, last = 0, rkey;
	struct mrd_keys k;
	char *buf, *buf2, *buf3, name[200];
	bool ok;
	int r;

	peer_open(p);
	if (mrd_mem_alloc(p->client, BUF_SIZE, 0, 0, (void **)&buf) < 0 ||
	    mrd_mem_alloc(p->client, 64u << 10, 0, 0, (void **)&buf2) < 0)
		die(p->who, "alloc", -ENOMEM);
	memset(buf, 0, BUF_SIZE);
	memset(buf2, 0, 64u << 10);
	if ((r = mrd_cache_keys(p->l, buf, &k)) < 0)
		die(p->who, "lookup", r);
	peer_connect(p);
	xrecv(p, &theirs, sizeof(theirs)); /* the initiator's memory, for the fences */

	/* Exactly its bytes. */
	r = mrd_window_grant(p->client, p->qp, buf + WIN_OFF, WIN_LEN, WIN_RW, &rkey);
	snprintf(name, sizeof(name), "target: grants a window over 4 KiB on its own QP (%d: %s)",
		 r, r < 0 ? mrd_last_error() : "");
	result(name, r == 0);
	if (r < 0)
		die(p->who, "mrd_window_grant", r);
	/* The bind runs before any later work request of the QP, not before a message on the
	 * socket: the rkey goes out once a later one completed. */
	fence(p, buf + BUF_SIZE - 1, k.lkey, theirs.addr, theirs.rkey);
	msg = (struct win_msg){ (uintptr_t)buf, rkey };
	xsend(p, &msg, sizeof(msg));
	heard(p); /* written */
	ok = buf[WIN_OFF] == 'w' && buf[WIN_OFF + WIN_LEN - 1] == 'w';
	say(p, ok);
	if (!windows_wide(p))
		for (int i = 0; i < 2; i++) { /* one byte before, one byte past: refused */
			heard(p);
			reconnect(p);
		}
	heard(p);
	if (windows_wide(p)) /* reached, as the device allows */
		say(p, buf[WIN_OFF - 1] == 'w' && buf[WIN_OFF + WIN_LEN] == 'w');
	else
		say(p, buf[WIN_OFF - 1] == 0 && buf[WIN_OFF + WIN_LEN] == 0);

	/* Revoked: refused once a work request after the revoke completed. */
	heard(p);
	r = mrd_window_revoke(p->client, p->qp, rkey);
	result("target: revokes the window on its own QP", r == 0);
	fence(p, buf + BUF_SIZE - 1, k.lkey, theirs.addr, theirs.rkey);
	say(p, 1);
	heard(p); /* refused */
	reconnect(p);
	say(p, buf[WIN_OFF] == 'w'); /* the revoked window wrote nothing more */

	/* Freed: the window dies before the pages go back. */
	r = mrd_window_grant(p->client, p->qp, buf2, WIN_LEN, WIN_RW, &rkey);
	if (r < 0)
		die(p->who, "mrd_window_grant over the second buffer", r);
	fence(p, buf + BUF_SIZE - 1, k.lkey, theirs.addr, theirs.rkey);
	msg = (struct win_msg){ (uintptr_t)buf2, rkey };
	xsend(p, &msg, sizeof(msg));
	heard(p); /* written */
	ok = buf2[0] == 'f';
	r = mrd_mem_free(p->client, buf2);
	if (r == 0)
		r = mrd_mem_alloc(p->client, 64u << 10, 0, 0, (void **)&buf3);
	if (r < 0)
		die(p->who, "free and alloc again", r);
	memset(buf3, 0, 64u << 10);
	snprintf(name, sizeof(name), "target: the freed buffer's pages came back %s",
		 buf3 == buf2 ? "at the same address" : "elsewhere");
	report("PASS", name, "");
	say(p, ok);
	heard(p); /* refused */
	reconnect(p);
	say(p, buf3[0] == 0);

	/* Cycles: the pool's windows, each bind a new key byte, none of them coming back: no
	 * rkey is handed out twice, so each revoked one stays dead (the first and last tried). */
	uint32_t *granted = malloc(WIN_CYCLES * sizeof(*granted));
	unsigned twice = 0;

	if (!granted)
		die(p->who, "rkeys of the cycles", -ENOMEM);
	for (int i = 0; i < WIN_CYCLES; i++) {
		r = mrd_window_grant(p->client, p->qp, buf, WIN_LEN, WIN_RW, &rkey);
		if (r == 0)
			r = mrd_window_revoke(p->client, p->qp, rkey);
		if (r < 0)
			die(p->who, "grant+revoke cycle", r);
		granted[i] = rkey;
		if (i == 0)
			first = rkey;
		last = rkey;
		if (i % 4 == 3) /* the QP's send queue: the cycles' requests complete */
			fence(p, buf + BUF_SIZE - 1, k.lkey, theirs.addr, theirs.rkey);
	}
	qsort(granted, WIN_CYCLES, sizeof(*granted), rkey_order);
	for (int i = 1; i < WIN_CYCLES; i++)
		twice += granted[i] == granted[i - 1];
	free(granted);
	result("target: 100000 grant+revoke cycles handed out no rkey twice", twice == 0);
	fence(p, buf + BUF_SIZE - 1, k.lkey, theirs.addr, theirs.rkey);
	r = mrd_window_grant(p->client, p->qp, buf, WIN_LEN, WIN_RW, &rkey);
	if (r < 0)
		die(p->who, "grant after the cycles", r);
	fence(p, buf + BUF_SIZE - 1, k.lkey, theirs.addr, theirs.rkey);
	msg = (struct win_msg){ (uintptr_t)buf, rkey };
	xsend(p, &msg, sizeof(msg));
	msg.rkey = first;
	xsend(p, &msg, sizeof(msg));
	msg.rkey = last;
	xsend(p, &msg, sizeof(msg));
	for (int i = 0; i < 2; i++) {
		heard(p); /* an old key refused */
		reconnect(p);
	}
	say(p, buf[0] == 'n'); /* the live window wrote; the old keys did not */

	/* The QP is let go of: its windows, bound and pooled, are deallocated. */
	heard(p);
	r = mrd_window_qp_gone(p->client, p->qp);
	snprintf(name, sizeof(name), "target: mrd_window_qp_gone ends the QP's windows, the "
		 "granted one and the pooled ones (%d)", r);
	result(name, r >= 2);
	say(p, 1);
	heard(p); /* refused */
	reconnect(p);

	/* The handle closes: libmrd deallocates what is still bound. */
	r = mrd_window_grant(p->client, p->qp, buf + WIN_OFF, WIN_LEN, WIN_RW, &rkey);
	if (r < 0)
		die(p->who, "grant before the close", r);
	fence(p, buf + BUF_SIZE - 1, k.lkey, theirs.addr, theirs.rkey);
	msg = (struct win_msg){ (uintptr_t)buf, rkey };
	xsend(p, &msg, sizeof(msg));
	heard(p);
	mrd_cache_free(p->l);
	p->l = NULL;
	mrd_client_close(p->client);
	say(p, 1);
	heard(p); /* refused */
	reconnect(p);
	heard(p); /* done */
	return failures ? 1 : 0;
}

static int windows_initiator(struct peer *p)
{
	struct win_msg mine, w, first, last;
	struct mrd_keys src;
	char *buf;
	int r;

	peer_open(p);
	if ((r = mrd_mem_alloc(p->client, BUF_SIZE, 0, 0, (void **)&buf)) < 0)
		die(p->who, "alloc", r);
	memset(buf, 'w', BUF_SIZE);
	if ((r = mrd_cache_keys(p->l, buf, &src)) < 0)
		die(p->who, "lookup", r);
	peer_connect(p);
	mine = (struct win_msg){ (uintptr_t)buf + BUF_SIZE - 64, src.rkey };
	xsend(p, &mine, sizeof(mine));

	xrecv(p, &w, sizeof(w));
	r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF, w.rkey, WIN_LEN);
	result("RDMA WRITE of the window's 4 KiB by its rkey", r == 0);
	say(p, 1);
	result("the target finds exactly the window's bytes written", heard(p));
	r = rdma(p, true, buf + 8192, src.lkey, w.addr + WIN_OFF, w.rkey, WIN_LEN);
	result("RDMA READ of the window's 4 KiB by its rkey", r == 0);
	if (windows_wide(p)) {
		/* What the device does: the MR's range bounds the window's rkey. */
		r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF - 1, w.rkey, 1);
		result("rxe: one byte before the window is reached (rxe checks a window's range "
		       "against its MR's, rxe_resp.c check_rkey)", r == 0);
		r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF + WIN_LEN - 1, w.rkey, 2);
		result("rxe: a WRITE one byte past the window's end is reached as well", r == 0);
		say(p, 1);
		result("the target finds those bytes written, as rxe allows", heard(p));
	} else {
		r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF - 1, w.rkey, 1);
		refused("one byte before the window is refused by the device", r);
		say(p, 1);
		reconnect(p);
		r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF + WIN_LEN - 1, w.rkey, 2);
		refused("a WRITE one byte past the window's end is refused by the device", r);
		say(p, 1);
		reconnect(p);
		say(p, 1);
		result("the target's bytes beside the window are untouched", heard(p));
	}

	say(p, 1); /* revoke it */
	heard(p);
	memset(buf, 'x', 64);
	r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF, w.rkey, 64);
	refused("the revoked window's rkey is refused by the device", r);
	say(p, 1);
	reconnect(p);
	result("nothing was written through the revoked rkey", heard(p));

	xrecv(p, &w, sizeof(w));
	memset(buf, 'f', 64);
	r = rdma(p, false, buf, src.lkey, w.addr, w.rkey, 64);
	result("RDMA WRITE through a window over a second buffer", r == 0);
	say(p, 1);
	result("the target read it", heard(p));
	memset(buf, 'x', 64);
	r = rdma(p, false, buf, src.lkey, w.addr, w.rkey, 64);
	refused("the freed buffer's window is refused by the device", r);
	say(p, 1);
	reconnect(p);
	result("the memory allocated after the free got nothing through the old window", heard(p));

	xrecv(p, &w, sizeof(w));
	xrecv(p, &first, sizeof(first));
	xrecv(p, &last, sizeof(last));
	memset(buf, 'n', 64);
	r = rdma(p, false, buf, src.lkey, w.addr, w.rkey, 64);
	result("after 100000 grant+revoke cycles a new window works", r == 0);
	memset(buf, 'o', 64);
	r = rdma(p, false, buf, src.lkey, first.addr, first.rkey, 64);
	refused("the first cycle's rkey is refused by the device", r);
	say(p, 1);
	reconnect(p);
	r = rdma(p, false, buf, src.lkey, last.addr, last.rkey, 64);
	refused("the last cycle's rkey is refused by the device", r);
	say(p, 1);
	reconnect(p);
	result("the old rkeys wrote nothing", heard(p));

	say(p, 1); /* let go of the QP's windows */
	heard(p);
	r = rdma(p, false, buf, src.lkey, w.addr, w.rkey, 64);
	refused("a window granted on a QP mrd_window_qp_gone let go of is refused by the device",
		r);
	say(p, 1);
	reconnect(p);

	xrecv(p, &w, sizeof(w));
	r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF, w.rkey, 64);
	result("a window granted after that works", r == 0);
	say(p, 1); /* close the handle */
	heard(p);
	r = rdma(p, false, buf, src.lkey, w.addr + WIN_OFF, w.rkey, 64);
	refused("a window still granted when its handle closed is refused by the device", r);
	say(p, 1);
	reconnect(p);
	say(p, 1);
	mrd_cache_free(p->l);
	return failures ? 1 : 0;
}

/* One side over TCP (across the hosts): serve on port, or ask host. */
static int tcp_socket(const char *host, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd, one = 1;

	if (!host) {
		int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		sa.sin_addr.s_addr = htonl(INADDR_ANY);
		if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
		    bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, 1))
			die("windows", "listen", errno);
		fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		close(l);
		return fd;
	}
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("windows", "host address", EINVAL);
	for (int i = 0; i < 1500; i++) { /* 150 s for the server to come up */
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		if (fd >= 0)
			close(fd);
		usleep(100000);
	}
	die("windows", "connect to the serving host", ETIMEDOUT);
	return -1;
}

static int windows(int gid_index, const char *host, int port, bool serve)
{
	struct peer p = { .own_qp = true, .bound = true, .gid_index = gid_index };
	int sv[2], status, rc;
	pid_t pid;

	if (port) {
		p.sock = tcp_socket(serve ? NULL : host, port);
		if (p.sock < 0)
			die("windows", "socket", errno);
		p.who = serve ? "target" : "initiator";
		return serve ? windows_target(&p) : windows_initiator(&p);
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return 2;
	pid = fork();
	if (pid == 0) {
		p.who = "target";
		p.sock = sv[1];
		close(sv[0]);
		_exit(windows_target(&p));
	}
	close(sv[1]);
	p.who = "initiator";
	p.sock = sv[0];
	rc = windows_initiator(&p);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		rc = 1;
	return rc;
}

/* The target killed with a window bound: it grants one on its own QP, has a work request after
 * it complete (the bind ran), writes through it once, and raises SIGKILL. The window outlives it
 * in its context, which mrd's copy of the command fd keeps; mrd deallocates it (libmrd tracked
 * it: mrd_window_track) before it deregisters the MR under it, which rxe would refuse. */
static int windows_killed(int gid_index)
{
	struct peer p = { .own_qp = true, .bound = true, .gid_index = gid_index };
	struct win_msg mine, w;
	struct mrd_keys k;
	int sv[2], status, r;
	char *buf;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return 2;
	pid = fork();
	if (pid == 0) {
		p.who = "target";
		p.sock = sv[1];
		close(sv[0]);
		peer_open(&p);
		if ((r = mrd_mem_alloc(p.client, BUF_SIZE, 0, 0, (void **)&buf)) < 0 ||
		    (r = mrd_cache_keys(p.l, buf, &k)) < 0)
			die(p.who, "alloc and lookup", r);
		memset(buf, 0, BUF_SIZE);
		peer_connect(&p);
		xrecv(&p, &mine, sizeof(mine));
		r = mrd_window_grant(p.client, p.qp, buf + WIN_OFF, WIN_LEN, WIN_RW, &w.rkey);
		if (r < 0)
			die(p.who, "mrd_window_grant", r);
		fence(&p, buf + BUF_SIZE - 1, k.lkey, mine.addr, mine.rkey);
		w.addr = (uintptr_t)buf;
		xsend(&p, &w, sizeof(w));
		heard(&p); /* written */
		printf("target: window bound and written through; killed now\n");
		fflush(stdout);
		raise(SIGKILL);
	}
	close(sv[1]);
	p.who = "initiator";
	p.sock = sv[0];
	peer_open(&p);
	if ((r = mrd_mem_alloc(p.client, BUF_SIZE, 0, 0, (void **)&buf)) < 0 ||
	    (r = mrd_cache_keys(p.l, buf, &k)) < 0)
		die(p.who, "alloc and lookup", r);
	memset(buf, 'w', BUF_SIZE);
	peer_connect(&p);
	mine = (struct win_msg){ (uintptr_t)buf + BUF_SIZE - 64, k.rkey };
	xsend(&p, &mine, sizeof(mine));
	xrecv(&p, &w, sizeof(w));
	r = rdma(&p, false, buf, k.lkey, w.addr + WIN_OFF, w.rkey, WIN_LEN);
	result("the killed target's window: an RDMA WRITE through it before its death", r == 0);
	say(&p, 1);
	result("the target died of SIGKILL with its window bound",
	       waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	return 0;
}

/* A client in a domain of its own, killed mid-request by the pair's initiator. */
_Noreturn static void victim(const char *sock, uid_t uid)
{
	mrd_cache *l;
	mrd_client *c;
	struct mrd_keys mr;
	void *mem[4];
	int r;

	if (setgid(uid) < 0 || setuid(uid) < 0)
		die("victim", "setuid", errno);
	r = mrd_client_connect(sock, &c);
	if (r < 0)
		die("victim", "connect", r);
	r = mrd_cache_new(c, &l);
	for (int i = 0; i < 4 && r >= 0; i++) {
		r = mrd_mem_alloc(c, 2u << 20, 0, 0, &mem[i]);
		if (r >= 0)
			r = mrd_cache_keys(l, mem[i], &mr);
	}
	if (r < 0)
		die("victim", "alloc and register", r);
	printf("@@ VICTIM_READY pid %d domain %s\n", (int)getpid(), mrd_client_domain(c));
	fflush(stdout);
	/* Killed in any of these: a registration, a free, or a Dma the device is doing. */
	for (;;) {
		struct mrd_keys a, b;
		void *p;

		if (mrd_mem_alloc(c, 64u << 10, 0, 0, &p) >= 0) {
			(void)mrd_cache_keys(l, p, &mr);
			(void)mrd_mem_free(c, p);
		}
		if (mrd_cache_keys(l, mem[0], &a) >= 0 && mrd_cache_keys(l, mem[1], &b) >= 0)
			(void)mrd_dma(c, MRD_DMA_WRITE, a.lkey, mem[0], b.rkey, mem[1], 2u << 20);
	}
}

/* Memory looked up and held, so the guest script can read mrd's view of the domain. */
_Noreturn static void hold(const char *sock, uid_t uid)
{
	mrd_cache *l;
	struct mrd_keys mr;
	mrd_client *c;
	void *mem;
	int r;

	if (setgid(uid) < 0 || setuid(uid) < 0)
		die("hold", "setuid", errno);
	r = mrd_client_connect(sock, &c);
	if (r >= 0)
		r = mrd_cache_new(c, &l);
	if (r >= 0)
		r = mrd_mem_alloc(c, 4u << 20, 0, 0, &mem);
	if (r >= 0)
		r = mrd_cache_keys(l, (char *)mem + (3u << 20), &mr);
	{
		char name[128];

		snprintf(name, sizeof(name), "a holder has keys for its 4 MiB (domain %s)",
			 r >= 0 ? mrd_client_domain(c) : "?");
		result(name, r >= 0);
	}
	printf("@@ HOLDING\n");
	fflush(stdout);
	for (;;)
		pause();
}

/* A bound client with keys for 4 MiB and a QP of its own, held until killed: the guest
 * script counts its objects (rdma resource) before and after SIGKILL. */
_Noreturn static void bound_hold(const char *sock)
{
	struct peer p = { .who = "bound holder", .own_qp = true, .bound = true };
	struct mrd_keys mr;
	void *mem;
	int r;

	setenv("MRD_SOCKET", sock, 1);
	peer_open(&p);
	r = mrd_mem_alloc(p.client, 4u << 20, 0, 0, &mem);
	if (r >= 0)
		r = mrd_cache_keys(p.l, (char *)mem + (3u << 20), &mr);
	result("a bound holder has keys of its own PD for 4 MiB", r >= 0);
	printf("@@ HOLDING pid %d qpn %u\n", (int)getpid(), p.qp->qp_num);
	fflush(stdout);
	for (;;)
		pause();
}

struct closer {
	struct peer *p;
	int result;
};

/* The client lets go of its PD and context while mrd registers into them. */
static void *close_own(void *arg)
{
	struct closer *c = arg;

	usleep(1000);
	c->result = ibv_dealloc_pd(c->p->pd); /* EBUSY once mrd's MR is there */
	(void)ibv_close_device(c->p->ctx);    /* mrd's copy of the fd keeps the context */
	return NULL;
}

static int bound_hostile(const char *sock, const char *other)
{
	struct peer p = { .who = "hostile" };
	mrd_client *c;
	struct mrd_keys keys;
	void *mem;
	int pipefd[2], r;

	setenv("MRD_SOCKET", sock, 1);
	become_small_user(p.who);
	open_own(&p);
	if (mrd_client_connect(sock, &c) < 0 || pipe2(pipefd, O_CLOEXEC) < 0)
		die(p.who, "connect", -EIO);
	refused_as("BindPd of a pipe: ENOTTY", mrd_client_bind_pd(c, pipefd[0], p.pd->handle),
		   -ENOTTY);
	if (other) {
		struct peer o = { .who = "other device" };
		const char *was = getenv("MRD_DEVICE");
		char name[128];

		setenv("MRD_DEVICE", other, 1);
		open_own(&o);
		if (was)
			setenv("MRD_DEVICE", was, 1);
		else
			unsetenv("MRD_DEVICE");
		snprintf(name, sizeof(name), "BindPd of a %s command fd: EXDEV", other);
		refused_as(name, mrd_verbs_bind_pd(c, o.pd), -EXDEV);
		ibv_dealloc_pd(o.pd);
		ibv_close_device(o.ctx);
	} else
		report("SKIP", "BindPd of another device's command fd: EXDEV", "one device only");
	refused_as("BindPd of a PD handle the client does not have: EINVAL",
		   mrd_client_bind_pd(c, p.ctx->cmd_fd, p.pd->handle + 1000), -EINVAL);
	r = mrd_verbs_bind_pd(c, p.pd);
	result("BindPd of the client's own PD after those", r == 0);
	refused_as("a second BindPd: EALREADY", mrd_verbs_bind_pd(c, p.pd), -EALREADY);
	/* The MR is the client's object: it destroys it itself, by handle (it made none of its
	 * own, so every MR handle of its context is mrd's). The free then finds it gone, which
	 * is no failure to quarantine the run for (the guest script reads the count). */
	if (mrd_mem_alloc(c, 65536, 0, 0, &mem) < 0 || mrd_keys_query(c, mem, &keys) < 0)
		die(p.who, "a bound lookup", -EIO);
	{
		unsigned gone = 0;

		for (uint32_t h = 0; h < 64; h++) {
			struct {
				struct ib_uverbs_cmd_hdr hdr;
				struct ib_uverbs_dereg_mr cmd;
			} w = { { IB_USER_VERBS_CMD_DEREG_MR, sizeof(w) / 4, 0 }, { h } };

			gone += write(p.ctx->cmd_fd, &w, sizeof(w)) == (ssize_t)sizeof(w);
		}
		result("the client destroys mrd's MR in its own context itself", gone == 1);
	}
	r = mrd_mem_free(c, mem);
	refused_as("... and mrd's free of that memory still works", r, 0);
	{ /* while the domain is open: its close would let a quarantined run go */
		FILE *f = popen("mrctl --json status", "r");
		char out[8192] = "";
		size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;

		out[n] = '\0';
		if (f)
			pclose(f);
		result("... and left no quarantined run (mrctl status, the domain still open)",
		       strstr(out, "\"quarantined_runs\":0,") != NULL);
	}
	mrd_client_close(c);

	/* A lookup first: then it is too late to bind (the keys handed out were the domain's). */
	if (mrd_client_connect(sock, &c) < 0 || mrd_mem_alloc(c, 65536, 0, 0, &mem) < 0 ||
	    mrd_keys_query(c, mem, &keys) < 0)
		die(p.who, "a lookup", -EIO);
	refused_as("BindPd after a lookup: EBUSY", mrd_verbs_bind_pd(c, p.pd), -EBUSY);
	mrd_client_close(c);

	/* The context closed under mrd's registration of 64 MiB: either order is a clean answer. */
	{
		struct closer cl = { &p, 0 };
		pthread_t t;
		char name[200];

		if (mrd_client_connect(sock, &c) < 0 || mrd_verbs_bind_pd(c, p.pd) < 0 ||
		    mrd_mem_alloc(c, 64u << 20, 0, 0, &mem) < 0)
			die(p.who, "bind and allocate 64 MiB", -EIO);
		pthread_create(&t, NULL, close_own, &cl);
		r = mrd_keys_query(c, mem, &keys);
		pthread_join(t, NULL);
		snprintf(name, sizeof(name), "the client deallocates its PD (%s) and closes its "
			 "context while mrd registers 64 MiB: the lookup answers %d (%s)",
			 cl.result ? strerror(cl.result) : "done", r, r < 0 ? mrd_last_error() : "keys");
		result(name, r == 0 ? cl.result == EBUSY : r == -EINVAL || r == -ENOENT);
		result("mrd still answers that client", mrd_client_ping(c) == 0);
		mrd_client_close(c);
	}
	close(pipefd[0]);
	close(pipefd[1]);
	return failures ? 1 : 0;
}

/* The same mrd buffer, bound on two devices: keys per device, each moving bytes there. */
static int two_devices(const char *sock, const char *dev_a, const char *dev_b)
{
	struct peer p[2] = { { .who = "device A" }, { .who = "device B" } };
	const char *devs[2] = { dev_a, dev_b };
	struct mrd_keys keys[2];
	char *buf, name[256];
	int r;

	setenv("MRD_SOCKET", sock, 1);
	become_small_user("two devices");
	for (int i = 0; i < 2; i++) {
		setenv("MRD_DEVICE", devs[i], 1);
		open_own(&p[i]);
		if (mrd_client_connect(sock, &p[i].client) < 0)
			die(p[i].who, "connect", -EIO);
		r = mrd_verbs_bind_pd(p[i].client, p[i].pd);
		snprintf(name, sizeof(name), "one process binds a PD on %s (%s)", devs[i],
			 r < 0 ? mrd_last_error() : "bound");
		result(name, r == 0);
		if (r < 0)
			return 1;
	}
	if (mrd_mem_alloc(p[0].client, 1u << 20, 0, 0, (void **)&buf) < 0)
		die("two devices", "alloc", -EIO);
	for (int i = 0; i < 2; i++) {
		struct verbs_loopback *lb;

		r = mrd_keys_query(p[i].client, buf, &keys[i]);
		snprintf(name, sizeof(name), "keys for the buffer on %s: lkey 0x%x rkey 0x%x", devs[i],
			 r < 0 ? 0 : keys[i].lkey, r < 0 ? 0 : keys[i].rkey);
		result(name, r == 0);
		if (r < 0)
			return 1;
		memset(buf + 4096, 0, 4096);
		snprintf(buf, 64, "moved on %s by its own keys", devs[i]);
		r = verbs_loopback_new(p[i].pd, &lb);
		if (r == 0)
			r = verbs_loopback_transfer(lb, false, keys[i].lkey, (uintptr_t)buf,
						    keys[i].rkey, (uintptr_t)buf + 4096, 64);
		snprintf(name, sizeof(name), "RDMA WRITE on %s with its keys: %s", devs[i],
			 r < 0 ? strerror(-r) : buf + 4096);
		result(name, r == 0 && strcmp(buf + 4096, buf) == 0);
		verbs_loopback_free(lb);
	}
	{
		FILE *f = popen("mrctl --json status", "r");
		char out[16384] = "", want[2][96];
		size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;

		out[n] = '\0';
		if (f)
			pclose(f);
		for (int i = 0; i < 2; i++)
			snprintf(want[i], sizeof(want[i]), "{\"name\":\"%s\"", devs[i]);
		result("mrctl status --json lists both devices", strstr(out, want[0]) &&
								strstr(out, want[1]));
		printf("@@ INFO %s\n", out);
	}
	mrd_mem_free(p[0].client, buf);
	for (int i = 0; i < 2; i++) {
		mrd_client_close(p[i].client);
		ibv_dealloc_pd(p[i].pd);
		ibv_close_device(p[i].ctx);
	}
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && strcmp(argv[1], "pair") == 0) {
		setenv("MRD_SOCKET", argv[2], 1);
		return pair(argv[2], atoi(argv[3]), argc > 4 ? (pid_t)atoi(argv[4]) : 0, false);
	}
	if (argc == 4 && strcmp(argv[1], "bound") == 0) {
		setenv("MRD_SOCKET", argv[2], 1);
		return pair(argv[2], atoi(argv[3]), 0, true);
	}
	if (argc == 4 && strcmp(argv[1], "windows-killed") == 0) {
		setenv("MRD_SOCKET", argv[2], 1);
		return windows_killed(atoi(argv[3]));
	}
	if (argc == 4 && strcmp(argv[1], "windows") == 0) {
		setenv("MRD_SOCKET", argv[2], 1);
		return windows(atoi(argv[3]), NULL, 0, false);
	}
	if (argc == 5 && strcmp(argv[1], "windows-serve") == 0) {
		setenv("MRD_SOCKET", argv[2], 1);
		return windows(atoi(argv[3]), NULL, atoi(argv[4]), true);
	}
	if (argc == 6 && strcmp(argv[1], "windows-ask") == 0) {
		setenv("MRD_SOCKET", argv[2], 1);
		return windows(atoi(argv[3]), argv[4], atoi(argv[5]), false);
	}
	if (argc == 3 && strcmp(argv[1], "bound-hold") == 0)
		bound_hold(argv[2]);
	if (argc == 5 && strcmp(argv[1], "two-devices") == 0)
		return two_devices(argv[2], argv[3], argv[4]);
	if (argc >= 3 && strcmp(argv[1], "bound-hostile") == 0)
		return bound_hostile(argv[2], argc > 3 ? argv[3] : NULL);
	if (argc == 4 && strcmp(argv[1], "victim") == 0)
		victim(argv[2], (uid_t)atoi(argv[3]));
	if (argc == 4 && strcmp(argv[1], "hold") == 0)
		hold(argv[2], (uid_t)atoi(argv[3]));
	fprintf(stderr, "usage: rdma-peers pair SOCKET GID_INDEX [VICTIM_PID]\n"
			"       rdma-peers bound SOCKET GID_INDEX\n"
			"       rdma-peers windows SOCKET GID_INDEX\n"
			"       rdma-peers windows-serve SOCKET GID_INDEX PORT\n"
			"       rdma-peers windows-ask SOCKET GID_INDEX HOST PORT\n"
			"       rdma-peers bound-hold SOCKET\n"
			"       rdma-peers bound-hostile SOCKET [OTHER_DEVICE]\n"
			"       rdma-peers two-devices SOCKET DEVICE DEVICE\n"
			"       rdma-peers victim SOCKET UID\n"
			"       rdma-peers hold SOCKET UID\n");
	return 2;
}
