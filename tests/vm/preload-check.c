/* SPDX-License-Identifier: MIT */
/* An ordinary verbs program, with no libmrd in it, for libmrd-preload.so's VM checks:
 *   preload-check as UID MEMLOCK_BYTES PROGRAM [ARGS...]
 *     runs PROGRAM as UID with RLIMIT_MEMLOCK MEMLOCK_BYTES (what an ordinary user has);
 *   preload-check data GID_INDEX
 *     on the first device (or $MRD_DEVICE): registers malloc'd buffers, moves data between
 *     two of its own QPs by RDMA WRITE and READ, and checks what a program relies on: its
 *     bytes and its neighbours' stay; the keys work; registering the same buffer again; rereg;
 *     a child of fork() writing its copy; the old rkey of a freed buffer refused. Each check
 *     prints "@@ RESULT<TAB>PASS|FAIL<TAB>name<TAB>detail"; MRD_PRELOAD_EXPECT=1 also asks
 *     that the buffers were moved onto mrd's memory (the shim served them);
 *   preload-check serve PORT GID_INDEX / preload-check ask HOST PORT GID_INDEX
 *     two hosts: the asker RDMA WRITEs into the server's malloc'd 1 MiB and READs it back,
 *     both check the bytes; then the server frees its buffer and the asker's write with the
 *     old rkey must fail. Addresses, rkeys and QP numbers go over TCP;
 *   preload-check neighbours GID_INDEX
 *     rping -S 65000's buffers: two adjacent malloc(65000) sharing a page, both registered
 *     (the second's pages hold part of the first's): both must be served (MRD_PRELOAD_EXPECT=1:
 *     on mrd's memory), RDMA WRITE and READ between them keep their bytes, and each rkey
 *     reaches its own buffer alone; then the second is freed and a third allocated in its old
 *     bytes and registered: its rkey reaches its bytes alone, the second's old rkey nothing;
 *   preload-check writers TRIES
 *     threads increment counters on a buffer's pages and a read() fills others while the
 *     buffer is registered (moved) and deregistered (moved back, MRD_PRELOAD_KEEP=0): how
 *     many writes were lost (none may be);
 *   preload-check leave-live exit|killed
 *     registers a buffer and exits, or is killed, with the registration live;
 *   preload-check regloop N SIZE
 *     make bench: N registrations and deregistrations of one buffer, the ns each takes. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static int failures;

static void result(const char *name, bool ok, const char *detail)
{
	printf("@@ RESULT\t%s\tpreload: %s\t%s\n", ok ? "PASS" : "FAIL", name, ok ? "" : detail);
	fflush(stdout);
	failures += !ok;
}

static void die(const char *what)
{
	printf("@@ RESULT\tFAIL\tpreload: %s\t%s\n", what, strerror(errno));
	exit(1);
}

struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	int gid_index;
};

static struct ibv_qp *qp_new(struct pair *p)
{
	struct ibv_qp_init_attr init = {
		.send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(p->pd, &init);

	if (!qp)
		die("ibv_create_qp");
	return qp;
}

/* To QP remote at gid (NULL: this device's own). */
static void qp_connect_to(struct pair *p, struct ibv_qp *qp, uint32_t remote,
			  const union ibv_gid *dgid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };
	union ibv_gid gid;

	if (ibv_query_gid(p->ctx, 1, p->gid_index, &gid))
		die("ibv_query_gid");
	if (dgid)
		gid = *dgid;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("QP to INIT");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				  .dest_qp_num = remote, .max_dest_rd_atomic = 1,
				  .min_rnr_timer = 12,
				  .ah_attr = { .is_global = 1, .port_num = 1,
					       .grh = { .dgid = gid, .sgid_index = (uint8_t)p->gid_index,
							.hop_limit = 1 } } };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("QP to RTR");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				  .rnr_retry = 7, .max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("QP to RTS");
}

static void qp_connect(struct pair *p, struct ibv_qp *qp, uint32_t remote)
{
	qp_connect_to(p, qp, remote, NULL);
}

/* A fresh connected pair of QPs (an error puts a QP in the error state for good). */
static void pair_connect(struct pair *p)
{
	if (p->a) {
		ibv_destroy_qp(p->a);
		ibv_destroy_qp(p->b);
	}
	p->a = qp_new(p);
	p->b = qp_new(p);
	qp_connect(p, p->a, p->b->qp_num);
	qp_connect(p, p->b, p->a->qp_num);
}

/* RDMA WRITE (or READ) of len bytes between local (lkey) and remote (rkey) on QP a; the
 * completion's status. */
static int rdma(struct pair *p, bool read, void *local, uint32_t lkey, void *remote,
		uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)local, len, lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
				  .opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { (uintptr_t)remote, rkey } }, *bad;
	struct ibv_wc wc;
	int n;

	if (ibv_post_send(p->a, &wr, &bad))
		return -1;
	for (int i = 0; i < 5000000; i++) {
		n = ibv_poll_cq(p->cq, 1, &wc);
		if (n)
			return n < 0 ? -1 : (int)wc.status;
		if (i > 1000)
			usleep(10);
	}
	return -2;
}

/* Whether addr lies in mrd's memory (the shim moved it there). */
static bool moved(const void *addr)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	bool yes = false;

	while (f && fgets(line, sizeof(line), f)) {
		unsigned long s, e;

		if (sscanf(line, "%lx-%lx", &s, &e) == 2 && s <= (uintptr_t)addr &&
		    (uintptr_t)addr < e)
			yes = strstr(line, "memfd:mrd-arena") != NULL;
	}
	if (f)
		fclose(f);
	return yes;
}

static void fill(char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (char)(i * 13 + seed);
}

static bool same(const char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (char)(i * 13 + seed))
			return false;
	return true;
}

/* The first device (or $MRD_DEVICE), a PD, a CQ and QP a. */
static void net_open(struct pair *p)
{
	const char *want = getenv("MRD_DEVICE");
	struct ibv_device **l = ibv_get_device_list(NULL);

	for (int i = 0; l && l[i] && !p->ctx; i++)
		if (!want || strcmp(ibv_get_device_name(l[i]), want) == 0)
			p->ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	if (!p->ctx)
		die("open a device");
	p->pd = ibv_alloc_pd(p->ctx);
	p->cq = p->pd ? ibv_create_cq(p->ctx, 16, NULL, NULL, 0) : NULL;
	if (!p->cq)
		die("PD and CQ");
	p->a = qp_new(p);
}

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static int data(int gid_index)
{
	bool expect = getenv("MRD_PRELOAD_EXPECT") && atoi(getenv("MRD_PRELOAD_EXPECT"));
	/* Whether the rkey dies with the dereg: libibverbs', and the shim's with
	 * MRD_PRELOAD_WINDOWS=dereg; else the shim keeps it until the buffer is freed. */
	bool dies = !expect || (getenv("MRD_PRELOAD_WINDOWS") &&
				strcmp(getenv("MRD_PRELOAD_WINDOWS"), "dereg") == 0);
	struct pair p = { .gid_index = gid_index };
	size_t len = 3 * 4096 + 123, big = 1 << 20;
	char *before, *buf, *after, *src, *dst, *large, detail[256];
	uintptr_t old;
	struct ibv_mr *mr, *mr2, *msrc, *mdst, *mlarge;
	uint32_t lkey, rkey;
	int st, status;
	pid_t pid;

	net_open(&p);
	ibv_destroy_qp(p.a);
	p.a = NULL;
	pair_connect(&p);

	/* Heap neighbours on the same pages as the buffer, which is not page-aligned. */
	before = malloc(100);
	buf = malloc(len);
	after = malloc(100);
	src = malloc(8192);
	dst = malloc(8192);
	fill(before, 100, 1);
	fill(buf, len, 2);
	fill(after, 100, 3);
	mr = ibv_reg_mr(p.pd, buf + 5, len - 5, ACCESS);
	msrc = ibv_reg_mr(p.pd, src, 8192, ACCESS);
	mdst = ibv_reg_mr(p.pd, dst, 8192, ACCESS);
	if (!mr || !msrc || !mdst)
		die("ibv_reg_mr of malloc'd buffers");
	/* src and dst may share a page with buf's range or each other: they fall through. */
	result("the buffer is on mrd's memory (the shim served it)", !expect || moved(buf + 5), "");
	result("the MR says the buffer: addr, length, PD, context",
	       mr->addr == buf + 5 && mr->length == len - 5 && mr->pd == p.pd &&
	       mr->context == p.ctx, "");
	result("the buffer's bytes and its heap neighbours' stay as they were",
	       same(buf, len, 2) && same(before, 100, 1) && same(after, 100, 3), "");

	strcpy(src, "written by RDMA WRITE into a moved buffer");
	st = rdma(&p, false, src, msrc->lkey, buf + 4096, mr->rkey, 64);
	snprintf(detail, sizeof(detail), "status %d, bytes \"%.40s\"", st, buf + 4096);
	result("RDMA WRITE into the buffer lands in the program's bytes",
	       st == 0 && strcmp(buf + 4096, src) == 0 && same(buf, 4096, 2), detail);
	st = rdma(&p, true, dst, mdst->lkey, buf + 10, mr->rkey, 100);
	result("RDMA READ from the buffer reads the program's bytes",
	       st == 0 && memcmp(dst, buf + 10, 100) == 0, detail);
	/* The program's own writes are what the device sends. */
	strcpy(buf + 2 * 4096, "the program wrote this after registering");
	st = rdma(&p, false, buf + 2 * 4096, mr->lkey, dst, mdst->rkey, 64);
	result("RDMA WRITE from the buffer sends what the program wrote since",
	       st == 0 && strcmp(dst, buf + 2 * 4096) == 0, "");

	/* With MRD_PRELOAD_WINDOWS=dereg the rkey dies with the dereg, as libibverbs' does: the
	 * shim's is a window's, unbound there, though it keeps mrd's MR for the next
	 * registration. Else it lives on while the shim keeps the registration (a window's by
	 * default, the MR's own with =off), and the next registration gets it back. */
	lkey = mr->lkey;
	rkey = mr->rkey;
	if (ibv_dereg_mr(mr))
		die("ibv_dereg_mr");
	strcpy(src, "must not land after the dereg");
	st = rdma(&p, false, src, msrc->lkey, buf + 4096, rkey, 32);
	snprintf(detail, sizeof(detail), "status %d, bytes \"%.32s\"", st, buf + 4096);
	if (!dies)
		result("a kept registration's rkey still reaches it (until the buffer is freed)",
		       st == 0 && strcmp(buf + 4096, src) == 0, detail);
	else
		result("an RDMA WRITE through a deregistered buffer's rkey is refused",
		       st != 0 && strncmp(buf + 4096, "must not land", 13) != 0, detail);
	if (st != 0)
		pair_connect(&p);
	if (dies) {
		st = rdma(&p, true, dst, mdst->lkey, buf + 10, rkey, 100);
		snprintf(detail, sizeof(detail), "status %d", st);
		result("an RDMA READ through a deregistered buffer's rkey is refused", st != 0,
		       detail);
		if (st != 0)
			pair_connect(&p);
	}
	/* Again: the same buffer registers as fast as a lookup. */
	mr = ibv_reg_mr(p.pd, buf + 5, len - 5, ACCESS);
	if (!mr)
		die("ibv_reg_mr again");
	snprintf(detail, sizeof(detail), "keys 0x%x/0x%x then 0x%x/0x%x", lkey, rkey, mr->lkey,
		 mr->rkey);
	if (!dies)
		result("registering the same buffer again gives the kept keys back",
		       mr->lkey == lkey && mr->rkey == rkey, detail);
	else
		result("registering the same buffer again works (the shim: the same lkey, a new "
		       "rkey)", !expect || (mr->lkey == lkey && mr->rkey != rkey), detail);
	strcpy(src, "written through the new rkey");
	st = rdma(&p, false, src, msrc->lkey, buf + 4096, mr->rkey, 32);
	snprintf(detail, sizeof(detail), "status %d, bytes \"%.32s\"", st, buf + 4096);
	result("RDMA WRITE through the new registration's rkey lands",
	       st == 0 && strcmp(buf + 4096, src) == 0, detail);
	if (dies) {
		st = rdma(&p, false, src, msrc->lkey, buf + 4096, rkey, 8);
		snprintf(detail, sizeof(detail), "status %d", st);
		result("the first registration's rkey stays refused", st != 0, detail);
		if (st != 0)
			pair_connect(&p);
	}
	mr2 = ibv_reg_mr(p.pd, buf + 100, 200, ACCESS);
	result("a second registration inside the buffer", mr2 != NULL, strerror(errno));
	if (mr2 && ibv_dereg_mr(mr2))
		die("ibv_dereg_mr of the second");
	/* Less access on the same pages: its rkey must not grant what the first one's does. */
	mr2 = ibv_reg_mr(p.pd, buf + 5, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (mr2) {
		st = rdma(&p, false, src, msrc->lkey, buf + 5, mr2->rkey, 8);
		snprintf(detail, sizeof(detail), "status %d", st);
		result("a local-write registration's rkey takes no remote write", st != 0, detail);
		if (st != 0)
			pair_connect(&p);
		ibv_dereg_mr(mr2);
	} else
		result("a local-write registration inside a registered buffer", false,
		       strerror(errno));
	st = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	snprintf(detail, sizeof(detail), "ibv_rereg_mr: %d (%s)", st, strerror(errno));
	result("ibv_rereg_mr changes its access", st == 0, detail);
	if (st == 0) {
		st = rdma(&p, false, src, msrc->lkey, buf + 4096, mr->rkey, 8);
		snprintf(detail, sizeof(detail), "status %d", st);
		result("after the rereg, remote write is refused", st != 0, detail);
		pair_connect(&p);
	}

	/* A child writes its own copy; the parent's bytes stay (fork makes private copies). */
	pid = fork();
	if (pid == 0) {
		strcpy(buf + 50, "the child's");
		_exit(strcmp(buf + 50, "the child's") == 0 ? 0 : 1);
	}
	waitpid(pid, &status, 0);
	result("a child of fork() writes its own copy of the buffer",
	       WIFEXITED(status) && WEXITSTATUS(status) == 0 && same(buf, 50, 2) &&
	       strcmp(buf + 50, "the child's") != 0, "");

	/* A freed buffer's rkey is refused: dereg, free (1 MiB: glibc unmaps it). */
	large = malloc(big);
	fill(large, big, 4);
	mlarge = ibv_reg_mr(p.pd, large, big, ACCESS);
	if (!mlarge)
		die("ibv_reg_mr of 1 MiB");
	st = rdma(&p, false, src, msrc->lkey, large + 4096, mlarge->rkey, 16);
	result("RDMA WRITE into a 1 MiB buffer", st == 0 && memcmp(large + 4096, src, 16) == 0,
	       "");
	rkey = mlarge->rkey;
	old = (uintptr_t)large;
	if (ibv_dereg_mr(mlarge))
		die("ibv_dereg_mr of 1 MiB");
	free(large);
	large = malloc(big); /* what a program does next; it may reuse the address */
	memset(large, 0, big);
	/* A peer writes where it was told, with the rkey it was given. */
	st = rdma(&p, false, src, msrc->lkey, (void *)(old + 4096), rkey, 16);
	snprintf(detail, sizeof(detail), "completion status %d", st);
	result("the freed buffer's old rkey is refused", st > 0, detail);
	result("...and wrote nothing", (uintptr_t)large != old || large[4096] == 0, "");
	free(large);
	pair_connect(&p); /* the refused write left QP a in the error state */

	/* Two small buffers on one page (from the review). x's registration falls through (an
	 * iova not its address): its MR pins x's page as it is, so y's must not move that page
	 * away under it (it falls through too), and the device's writes by x's rkey land in x. */
	{
		char *x = NULL, *y = NULL, *g = NULL, *h = NULL;
		struct ibv_mr *mx, *my, *mh;
		uint64_t xiova;

		for (int i = 0; i < 64; i++) {
			x = malloc(200);
			y = malloc(200);
			if ((uintptr_t)x >> 12 == (uintptr_t)y >> 12)
				break;
		}
		memset(x, 0, 200);
		xiova = 0x10000 + ((uintptr_t)x & 4095);
		mx = ibv_reg_mr_iova(p.pd, x, 200, xiova, ACCESS);
		my = mx ? ibv_reg_mr(p.pd, y, 200, ACCESS) : NULL;
		if (mx && my) {
			strcpy(dst, "into the fall-through MR");
			st = rdma(&p, false, dst, mdst->lkey, (void *)(uintptr_t)xiova, mx->rkey, 32);
			snprintf(detail, sizeof(detail), "status %d, x \"%.24s\", y moved %d", st, x,
				 moved(y));
			result("a libibverbs MR's writes land in its buffer after a neighbour on its "
			       "page registered", st == 0 && strcmp(x, dst) == 0, detail);
			if (st)
				pair_connect(&p);
		} else
			result("a fall-through MR and its neighbour", false, strerror(errno));
		/* A served MR covers [addr, addr + length), not its pages: a heap neighbour on
		 * the same page is out of its rkey's reach. */
		for (int i = 0; i < 64; i++) {
			g = malloc(64);
			h = malloc(3000);
			if ((uintptr_t)g >> 12 == (uintptr_t)h >> 12)
				break;
		}
		memset(g, 'g', 64);
		mh = ibv_reg_mr(p.pd, h, 3000, ACCESS);
		if (mh) {
			strcpy(dst, "REMOTE");
			st = rdma(&p, false, dst, mdst->lkey, g + 8, mh->rkey, 6);
			snprintf(detail, sizeof(detail), "status %d, g \"%.14s\", h moved %d", st, g,
				 moved(h));
			result("RDMA WRITE by an rkey next to its buffer (a heap neighbour) is refused",
			       st != 0 && g[8] == 'g', detail);
			if (st)
				pair_connect(&p);
			st = rdma(&p, false, dst, mdst->lkey, h + 2990, mh->rkey, 10);
			result("...and its last bytes take it", st == 0 && memcmp(h + 2990, "REMOTE", 6) == 0,
			       detail);
			ibv_dereg_mr(mh);
		} else
			result("ibv_reg_mr of a heap buffer beside another", false, strerror(errno));
		if (mx)
			ibv_dereg_mr(mx);
		if (my)
			ibv_dereg_mr(my);
	}

	ibv_dereg_mr(mr);
	ibv_dereg_mr(msrc);
	ibv_dereg_mr(mdst);
	free(before);
	free(buf);
	free(after);
	free(src);
	free(dst);
	ibv_destroy_qp(p.a);
	ibv_destroy_qp(p.b);
	ibv_destroy_cq(p.cq);
	st = ibv_dealloc_pd(p.pd);
	result("ibv_dealloc_pd once its MRs are gone", st == 0, strerror(st));
	ibv_close_device(p.ctx);
	return failures ? 1 : 0;
}


/* What the two sides tell each other over TCP. */
struct card {
	uint32_t qpn, rkey;
	uint64_t addr;
	union ibv_gid gid;
};

static void xfer(int fd, void *buf, size_t n, bool send_it)
{
	for (size_t done = 0; done < n;) {
		ssize_t k = send_it ? write(fd, (char *)buf + done, n - done) :
				      read(fd, (char *)buf + done, n - done);

		if (k <= 0)
			die(send_it ? "TCP send" : "TCP receive");
		done += (size_t)k;
	}
}

static void say_word(int fd, const char *w)
{
	char b[8] = { 0 };

	strncpy(b, w, sizeof(b) - 1);
	xfer(fd, b, sizeof(b), true);
}

static bool heard(int fd, const char *w)
{
	char b[8];

	xfer(fd, b, sizeof(b), false);
	return strncmp(b, w, sizeof(b)) == 0;
}


#define NET_BYTES (1u << 20)

static int serve(int port, int gid_index)
{
	struct pair p = { .gid_index = gid_index };
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct card mine = { 0 }, theirs;
	char *buf = malloc(NET_BYTES + 3), *b = buf + 3;
	struct ibv_mr *mr;
	int one = 1, ls, fd;
	bool ok;

	net_open(&p);
	fill(b, NET_BYTES, 5);
	mr = ibv_reg_mr(p.pd, b, NET_BYTES, ACCESS);
	if (!mr)
		die("ibv_reg_mr of the server's 1 MiB");
	ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 1))
		die("listen");
	printf("listening on %d\n", port);
	fflush(stdout);
	fd = accept(ls, NULL, NULL);
	if (fd < 0)
		die("accept");
	mine = (struct card){ p.a->qp_num, mr->rkey, (uintptr_t)b };
	ibv_query_gid(p.ctx, 1, gid_index, &mine.gid);
	xfer(fd, &mine, sizeof(mine), true);
	xfer(fd, &theirs, sizeof(theirs), false);
	qp_connect_to(&p, p.a, theirs.qpn, &theirs.gid);
	say_word(fd, "READY");
	ok = heard(fd, "WROTE");
	result("across hosts: the peer's RDMA WRITE landed in the server's moved buffer",
	       ok && strcmp(b + 4096, "written across hosts") == 0 && same(b, 4096, 5) &&
	       same(b + 8192, NET_BYTES - 8192, 5), /* 8192 * 13 is a multiple of 256 */
	       b + 4096);
	heard(fd, "READ");
	/* The buffer is freed: its rkey must die with it. */
	ibv_dereg_mr(mr);
	free(buf);
	say_word(fd, "FREED");
	ok = heard(fd, "REFUSED");
	result("across hosts: the peer found the freed buffer's old rkey refused", ok, "");
	close(fd);
	close(ls);
	ibv_destroy_qp(p.a);
	ibv_destroy_cq(p.cq);
	ibv_dealloc_pd(p.pd);
	ibv_close_device(p.ctx);
	return failures ? 1 : 0;
}

static int ask(const char *host, int port, int gid_index)
{
	struct pair p = { .gid_index = gid_index };
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct card mine = { 0 }, theirs;
	char *buf = malloc(NET_BYTES), detail[128];
	struct ibv_mr *mr;
	int fd = -1, st;

	net_open(&p);
	mr = ibv_reg_mr(p.pd, buf, NET_BYTES, ACCESS);
	if (!mr)
		die("ibv_reg_mr of the asker's 1 MiB");
	inet_pton(AF_INET, host, &sa.sin_addr);
	for (int i = 0; i < 100; i++) { /* the server may not listen yet */
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		close(fd);
		fd = -1;
		usleep(200000);
	}
	if (fd < 0)
		die("connect to the server");
	mine = (struct card){ p.a->qp_num, mr->rkey, (uintptr_t)buf };
	ibv_query_gid(p.ctx, 1, gid_index, &mine.gid);
	xfer(fd, &theirs, sizeof(theirs), false);
	xfer(fd, &mine, sizeof(mine), true);
	qp_connect_to(&p, p.a, theirs.qpn, &theirs.gid);
	if (!heard(fd, "READY"))
		die("the server's READY");
	strcpy(buf, "written across hosts");
	st = rdma(&p, false, buf, mr->lkey, (void *)(uintptr_t)(theirs.addr + 4096), theirs.rkey,
		  32);
	snprintf(detail, sizeof(detail), "completion status %d", st);
	result("across hosts: RDMA WRITE into the peer's buffer completes", st == 0, detail);
	say_word(fd, "WROTE");
	memset(buf, 0, 8192);
	st = rdma(&p, true, buf, mr->lkey, (void *)(uintptr_t)theirs.addr, theirs.rkey, 8192);
	result("across hosts: RDMA READ of the peer's buffer reads its bytes and the write",
	       st == 0 && same(buf, 4096, 5) && strcmp(buf + 4096, "written across hosts") == 0,
	       detail);
	say_word(fd, "READ");
	if (!heard(fd, "FREED"))
		die("the server's FREED");
	st = rdma(&p, false, buf, mr->lkey, (void *)(uintptr_t)(theirs.addr + 4096), theirs.rkey,
		  32);
	snprintf(detail, sizeof(detail), "completion status %d", st);
	result("across hosts: a write with the freed buffer's old rkey fails", st > 0, detail);
	say_word(fd, st > 0 ? "REFUSED" : "TAKEN");
	close(fd);
	ibv_dereg_mr(mr);
	free(buf);
	return failures ? 1 : 0;
}

/* The second neighbour b (n bytes, a span of the first's moved range) deregistered and freed
 * while the first (a, ma) stays: a buffer c the heap hands out inside b's old bytes, then
 * registered, gets an MR of its own, over its bytes alone: not b's span, whose rkey (old_rkey)
 * reached all of b (issue 38 review: the shim handed c b's keys). */
static void freed_neighbour(struct pair *p, char *a, struct ibv_mr *ma, uintptr_t b, size_t n,
			    uint32_t old_rkey)
{
	const size_t cn = n / 2; /* past tcache and small bins: carved out of b's free chunk */
	char *c = malloc(cn), detail[256];
	struct ibv_mr *mc;
	int st;

	if (!c)
		die("neighbours: malloc of the third");
	snprintf(detail, sizeof(detail), "freed 0x%lx+%zu, then %p+%zu", (unsigned long)b, n,
		 (void *)c, cn);
	result("neighbours: a buffer allocated after the second's free lies in its old bytes",
	       b <= (uintptr_t)c && (uintptr_t)c + cn + 256 <= b + n, detail);
	fill(c, cn, 9);
	mc = ibv_reg_mr(p->pd, c, cn, ACCESS);
	if (!mc)
		die("neighbours: ibv_reg_mr of the third");
	result("neighbours: the third's MR says its buffer, with keys of its own",
	       mc->addr == c && mc->length == cn && mc->rkey != old_rkey && mc->rkey != ma->rkey,
	       "");
	pair_connect(p); /* the last check of the pair failed its QPs */
	st = rdma(p, false, a, ma->lkey, c + cn - 100, mc->rkey, 100);
	snprintf(detail, sizeof(detail), "status %d", st);
	result("neighbours: RDMA WRITE by the third's rkey into its last bytes",
	       st == 0 && memcmp(a, c + cn - 100, 100) == 0, detail);
	/* Past its end, inside the freed second's bytes: b's span would take it. */
	strcpy(a + 200, "must not land");
	st = rdma(p, false, a + 200, ma->lkey, c + cn + 200, mc->rkey, 14);
	snprintf(detail, sizeof(detail), "status %d", st);
	result("neighbours: RDMA WRITE by the third's rkey past its end (the freed second's bytes) "
	       "is refused", st > 0 && memcmp(c + cn + 200, "must not land", 14) != 0, detail);
	pair_connect(p);
	st = rdma(p, false, a + 200, ma->lkey, c + 100, old_rkey, 14);
	snprintf(detail, sizeof(detail), "status %d", st);
	result("neighbours: the freed second's old rkey reaches nothing (the third's bytes stay)",
	       st > 0 && same(c + 100, 14, 9 + 100 * 13), detail);
	if (ibv_dereg_mr(mc))
		die("neighbours: ibv_dereg_mr of the third");
	free(c);
}

/* Two adjacent malloc(65000) buffers (rping -S 65000): the second begins in the first's last
 * page. */
static int neighbours(int gid_index)
{
	bool expect = getenv("MRD_PRELOAD_EXPECT") && atoi(getenv("MRD_PRELOAD_EXPECT"));
	struct pair p = { .gid_index = gid_index };
	const size_t n = 65000;
	char *a = malloc(n), *b = malloc(n), detail[256];
	struct ibv_mr *ma, *mb;
	uintptr_t b_was = (uintptr_t)b;
	uint32_t old_rkey;
	int st;

	net_open(&p);
	ibv_destroy_qp(p.a);
	p.a = NULL;
	pair_connect(&p);
	if (!a || !b)
		die("malloc");
	snprintf(detail, sizeof(detail), "%p+%zu and %p", (void *)a, n, (void *)b);
	result("neighbours: the two buffers share a page",
	       ((uintptr_t)a + n - 1) / 4096 == (uintptr_t)b / 4096 ||
	       ((uintptr_t)b + n - 1) / 4096 == (uintptr_t)a / 4096, detail);
	fill(a, n, 7);
	fill(b, n, 8);
	ma = ibv_reg_mr(p.pd, a, n, ACCESS);
	if (!ma)
		die("neighbours: ibv_reg_mr of the first");
	mb = ibv_reg_mr(p.pd, b, n, ACCESS);
	if (!mb)
		die("neighbours: ibv_reg_mr of the second");
	result("neighbours: both on mrd's memory (served, not fallen through)",
	       !expect || (moved(a) && moved(a + n - 1) && moved(b) && moved(b + n - 1)), "");
	result("neighbours: their bytes stay", same(a, n, 7) && same(b, n, 8), "");
	result("neighbours: each MR says its buffer",
	       ma->addr == a && ma->length == n && mb->addr == b && mb->length == n &&
	       ma->rkey != mb->rkey, "");
	/* The first's head into the second's tail, and back into the first's tail by READ. */
	st = rdma(&p, false, a, ma->lkey, b + n - 4000, mb->rkey, 4000);
	snprintf(detail, sizeof(detail), "status %d", st);
	result("neighbours: RDMA WRITE from the first into the second's last bytes",
	       st == 0 && memcmp(a, b + n - 4000, 4000) == 0 && same(a, n, 7), detail);
	st = rdma(&p, true, a + n - 3000, ma->lkey, b, mb->rkey, 3000);
	snprintf(detail, sizeof(detail), "status %d", st);
	result("neighbours: RDMA READ of the second's first bytes into the first's last",
	       st == 0 && memcmp(a + n - 3000, b, 3000) == 0 && same(b, 3000, 8), detail);
	/* The second's rkey reaches nothing of the first (the page they share included): the
	 * completion fails and the QP with it, so last. */
	strcpy(b + 100, "must not land");
	st = rdma(&p, false, b + 100, mb->lkey, a + n - 64, mb->rkey, 14);
	snprintf(detail, sizeof(detail), "status %d", st);
	result("neighbours: the second's rkey does not reach the first's bytes on the shared page",
	       st > 0 && strcmp(a + n - 64, "must not land") != 0, detail);
	old_rkey = mb->rkey;
	if (ibv_dereg_mr(mb))
		die("neighbours: ibv_dereg_mr of the second");
	free(b);
	freed_neighbour(&p, a, ma, b_was, n, old_rkey);
	if (ibv_dereg_mr(ma))
		die("neighbours: ibv_dereg_mr of the first");
	free(a);
	return failures ? 1 : 0;
}

#define WRITERS 2
#define SLOT_PAGES 16
#define SLOTS (SLOT_PAGES * 4096 / 8)

/* What the writers do to a buffer's pages: page 0 holds each writer's counter (and the
 * buffer's first bytes), the reader read()s 8-byte slots into the next SLOT_PAGES pages. */
struct race {
	char *p;
	int pipe[2];
	volatile int stop;
	unsigned long done[WRITERS], reads, efaults;
	long read_err;
};

struct writer {
	struct race *race;
	int i;
};

static void *increment(void *arg)
{
	struct writer *w = arg;
	volatile unsigned long *ctr = (unsigned long *)(w->race->p + 64 * w->i);
	unsigned long n = *ctr;

	while (!__atomic_load_n(&w->race->stop, __ATOMIC_ACQUIRE)) {
		(*ctr)++;
		__atomic_store_n(&w->race->done[w->i], ++n, __ATOMIC_RELEASE);
	}
	return NULL;
}

static void *read_slots(void *arg)
{
	struct race *race = arg;
	uint64_t *slot = (uint64_t *)(race->p + 4096);

	for (unsigned long i = 0; i < SLOTS; i++) {
		ssize_t n = read(race->pipe[0], &slot[i], 8);

		if (n < 0 && errno == EFAULT) {
			/* Unprivileged userfaultfd: the read failed, took nothing; again. */
			race->efaults++;
			i--;
			continue;
		}
		if (n != 8) {
			race->read_err = n < 0 ? -errno : n;
			break;
		}
		__atomic_store_n(&race->reads, i + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static unsigned long progress(struct race *race, int i)
{
	return __atomic_load_n(i < WRITERS ? &race->done[i] : &race->reads, __ATOMIC_ACQUIRE);
}

static void wait_past(struct race *race, int i, unsigned long n)
{
	while (progress(race, i) <= n && !(i == WRITERS && race->read_err))
		sched_yield();
}

/* Runs the writers and the reader while step() moves the pages, each seen writing before
 * and after; the writes lost (increments, and 8-byte slots not there). */
static unsigned long race_step(struct race *race, struct ibv_pd *pd, struct ibv_mr **mr)
{
	static uint64_t seq[SLOTS];
	pthread_t t[WRITERS + 1];
	struct writer w[WRITERS];
	unsigned long before[WRITERS], lost = 0;
	uint64_t *slot = (uint64_t *)(race->p + 4096);

	for (unsigned long i = 0; i < SLOTS; i++)
		seq[i] = i + 1;
	if (write(race->pipe[1], seq, sizeof(seq)) != sizeof(seq))
		die("writers: pipe");
	race->stop = 0;
	race->reads = 0;
	race->read_err = 0;
	memset(slot, 0, SLOT_PAGES * 4096);
	for (int i = 0; i < WRITERS; i++) {
		w[i] = (struct writer){ race, i };
		race->done[i] = 0;
		if (pthread_create(&t[i], NULL, increment, &w[i]))
			die("writers: pthread_create");
	}
	if (pthread_create(&t[WRITERS], NULL, read_slots, race))
		die("writers: pthread_create");
	for (int i = 0; i < WRITERS; i++)
		wait_past(race, i, 1000);
	wait_past(race, WRITERS, 64);
	if (!*mr) {
		/* The buffer begins after the counters: they are its heap neighbours. */
		*mr = ibv_reg_mr(pd, race->p + 64 * WRITERS, (1 + SLOT_PAGES) * 4096 - 64 * WRITERS,
				 ACCESS);
		if (!*mr)
			die("writers: ibv_reg_mr");
	} else {
		if (ibv_dereg_mr(*mr))
			die("writers: ibv_dereg_mr");
		*mr = NULL;
	}
	for (int i = 0; i < WRITERS; i++)
		before[i] = progress(race, i);
	for (int i = 0; i < WRITERS; i++)
		wait_past(race, i, before[i] + 1000);
	pthread_join(t[WRITERS], NULL);
	__atomic_store_n(&race->stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < WRITERS; i++) {
		pthread_join(t[i], NULL);
		lost += race->done[i] - *(unsigned long *)(race->p + 64 * i);
	}
	if (race->read_err)
		die("writers: read() into the moving pages");
	for (unsigned long i = 0; i < race->reads; i++)
		lost += slot[i] != i + 1;
	return lost;
}

static int writers(int tries)
{
	bool expect = getenv("MRD_PRELOAD_EXPECT") && atoi(getenv("MRD_PRELOAD_EXPECT"));
	struct race race = { 0 };
	unsigned long lost_there = 0, lost_back = 0;
	int tries_there = 0, tries_back = 0, served = 0;
	struct pair p = { 0 };
	char detail[256];

	net_open(&p);
	if (pipe2(race.pipe, O_CLOEXEC) || fcntl(race.pipe[1], F_SETPIPE_SZ, 2 * SLOTS * 8) < SLOTS * 8)
		die("writers: pipe");
	for (int t = 0; t < tries; t++) {
		struct ibv_mr *mr = NULL;
		unsigned long l;

		race.p = mmap(NULL, (1 + SLOT_PAGES) * 4096, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (race.p == MAP_FAILED)
			die("writers: mmap");
		memset(race.p, 0, 4096);
		l = race_step(&race, p.pd, &mr);
		tries_there += l > 0;
		lost_there += l;
		served += moved(race.p);
		l = race_step(&race, p.pd, &mr);
		tries_back += l > 0;
		lost_back += l;
		munmap(race.p, (1 + SLOT_PAGES) * 4096);
	}
	snprintf(detail, sizeof(detail), "lost writes: at the move %d of %d tries (%lu), at the "
		 "move back %d tries (%lu); %d moved; read() EFAULT %lu times", tries_there, tries,
		 lost_there, tries_back, lost_back, served, race.efaults);
	printf("%s\n", detail);
	result("writers: no write lost at the move or the move back",
	       tries_there == 0 && tries_back == 0 && (!expect || served == tries), detail);
	return failures ? 1 : 0;
}

/* A program that ends with a registration live: it registers a malloc'd 64 KiB and exits
 * (how 0) or is killed (how 1), without a dereg. */
static int leave_live(int how)
{
	struct pair p = { 0 };
	char *buf = malloc(65536);

	net_open(&p);
	memset(buf, 1, 65536);
	if (!ibv_reg_mr(p.pd, buf, 65536, ACCESS))
		die("ibv_reg_mr");
	printf("registered\n");
	fflush(stdout);
	if (how)
		raise(SIGKILL);
	exit(0);
}

/* make bench: n registrations and deregistrations of one malloc'd buffer; ns each. */
static int regloop(int n, size_t size)
{
	struct pair p = { 0 };
	char *buf = malloc(size);
	struct timespec t0, t1;
	struct ibv_mr *mr;

	net_open(&p);
	memset(buf, 1, size);
	for (int i = 0; i < n + 5; i++) {
		if (i == 5)
			clock_gettime(CLOCK_MONOTONIC, &t0);
		mr = ibv_reg_mr(p.pd, buf, size, ACCESS);
		if (!mr || ibv_dereg_mr(mr))
			die("ibv_reg_mr and ibv_dereg_mr in a loop");
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("regloop %zu %.0f\n", size,
	       ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n);
	free(buf);
	return 0;
}

static int run_as(char **argv)
{
	uid_t uid = (uid_t)strtoul(argv[0], NULL, 10);
	rlim_t bytes = (rlim_t)strtoull(argv[1], NULL, 10);
	struct rlimit rl = { bytes, bytes };

	if (setrlimit(RLIMIT_MEMLOCK, &rl) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) {
		perror("preload-check as");
		return 126;
	}
	execvp(argv[2], argv + 2);
	perror(argv[2]);
	return 127;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && strcmp(argv[1], "as") == 0)
		return run_as(argv + 2);
	if (argc == 3 && strcmp(argv[1], "data") == 0)
		return data(atoi(argv[2]));
	if (argc == 3 && strcmp(argv[1], "neighbours") == 0)
		return neighbours(atoi(argv[2]));
	if (argc == 3 && strcmp(argv[1], "writers") == 0)
		return writers(atoi(argv[2]));
	if (argc == 3 && strcmp(argv[1], "leave-live") == 0)
		return leave_live(strcmp(argv[2], "killed") == 0);
	if (argc == 4 && strcmp(argv[1], "regloop") == 0)
		return regloop(atoi(argv[2]), strtoul(argv[3], NULL, 10));
	if (argc == 4 && strcmp(argv[1], "serve") == 0)
		return serve(atoi(argv[2]), atoi(argv[3]));
	if (argc == 5 && strcmp(argv[1], "ask") == 0)
		return ask(argv[2], atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: preload-check as UID MEMLOCK PROGRAM [ARGS...] | data GID_INDEX |\n"
			"       neighbours GID_INDEX | writers TRIES |\n"
			"       serve PORT GID_INDEX | ask HOST PORT GID_INDEX\n");
	return 2;
}
