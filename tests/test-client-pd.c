/* SPDX-License-Identifier: MIT */
/* Client-PD registration on a real device (client-context.c), as mrd does it: a root parent
 * registers its own mapping of a client's memfd into the client's own PD through the client's
 * uverbs fd; the client, an unprivileged child (uid 1000, RLIMIT_MEMLOCK 64 KiB, so its own
 * ibv_reg_mr of 1 MiB fails), moves data by those keys on its own QPs. Needs root and a verbs
 * device ($MRD_CONTRACT_DEVICE, else the first): the rxe VM test runs it (make check-rdma);
 * elsewhere it exits 77 and says why. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check-run.h"
#include "test-util.h"
#include "provider/client-context.h"
#include "provider/verbs-loopback.h"

#define LEN (1024 * 1024)
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static const char *device;
static const char *no_loopback; /* why the device's QPs cannot connect on loopback, or NULL */

/* What the client sends first (with its command fd and memfd), then what each side says. */
struct hello {
	uint32_t pd_handle;
	uint64_t addr;
	int own_reg_errno; /* its own ibv_reg_mr of LEN: 0 if it worked */
};
enum { OP_TRANSFER = 1, OP_STALE, OP_EXIT };
struct order {
	int op;
	uint32_t lkey, rkey;
};

static int send_msg(int s, const void *buf, size_t n, const int *fds, int nfds)
{
	char c[CMSG_SPACE(sizeof(int) * 2)] = { 0 };
	struct iovec iov = { (void *)buf, n };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds) {
		struct cmsghdr *h;

		m.msg_control = c;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		h = CMSG_FIRSTHDR(&m);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(h), fds, sizeof(int) * nfds);
	}
	return sendmsg(s, &m, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

static int recv_msg(int s, void *buf, size_t n, int *fds, int nfds)
{
	char c[CMSG_SPACE(sizeof(int) * 2)];
	struct iovec iov = { buf, n };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c,
			    .msg_controllen = sizeof(c) };
	struct cmsghdr *h;

	if (recvmsg(s, &m, MSG_CMSG_CLOEXEC) != (ssize_t)n)
		return -1;
	h = CMSG_FIRSTHDR(&m);
	if (nfds && (!h || h->cmsg_len != CMSG_LEN(sizeof(int) * nfds)))
		return -1;
	if (nfds)
		memcpy(fds, CMSG_DATA(h), sizeof(int) * nfds);
	return 0;
}

static struct ibv_device *find_device(struct ibv_device **l)
{
	for (int i = 0; l && l[i]; i++)
		if (!device || strcmp(ibv_get_device_name(l[i]), device) == 0)
			return l[i];
	return NULL;
}

/* The client: its own context, PD and QPs; its memory a memfd. Exits with the last result. */
static int client_main(int s)
{
	struct rlimit rl = { 65536, 65536 };
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *own;
	struct verbs_loopback *lb = NULL;
	struct hello h = { 0 };
	struct order o;
	int fds[2], mfd, r = 0;
	uint8_t *m;

	if (setrlimit(RLIMIT_MEMLOCK, &rl) || setresgid(1000, 1000, 1000) ||
	    setresuid(1000, 1000, 1000))
		return 101;
	ctx = find_device(l) ? ibv_open_device(find_device(l)) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	mfd = memfd_create("client-pd", MFD_CLOEXEC);
	if (!pd || mfd < 0 || ftruncate(mfd, LEN) < 0)
		return 102;
	m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (m == MAP_FAILED)
		return 103;
	for (int i = 0; i < 4096; i++)
		m[i] = (uint8_t)(i * 13 + 1);
	own = ibv_reg_mr(pd, m, LEN, RW);
	h.own_reg_errno = own ? 0 : errno;
	h.pd_handle = pd->handle;
	h.addr = (uintptr_t)m;
	fds[0] = ctx->cmd_fd;
	fds[1] = mfd;
	if (send_msg(s, &h, sizeof(h), fds, 2) < 0)
		return 104;
	while (recv_msg(s, &o, sizeof(o), NULL, 0) == 0 && o.op != OP_EXIT) {
		if (!lb && verbs_loopback_new(pd, &lb) < 0)
			return 105;
		if (o.op == OP_TRANSFER) {
			/* WRITE the first 4 KiB to the middle, READ it back to a quarter: data checked */
			memset(m + LEN / 2, 0, 8192);
			memset(m + LEN / 4, 0, 8192);
			r = verbs_loopback_transfer(lb, false, o.lkey, (uintptr_t)m, o.rkey,
						    (uintptr_t)m + LEN / 2, 4096);
			if (r == 0)
				r = verbs_loopback_transfer(lb, true, o.lkey, (uintptr_t)m + LEN / 4,
							    o.rkey, (uintptr_t)m + LEN / 2, 4096);
			if (r == 0 && (memcmp(m, m + LEN / 2, 4096) || memcmp(m, m + LEN / 4, 4096)))
				r = -EILSEQ;
		} else {
			r = verbs_loopback_transfer(lb, false, o.lkey, (uintptr_t)m, o.rkey,
						    (uintptr_t)m + LEN / 2, 4096);
		}
		if (send_msg(s, &r, sizeof(r), NULL, 0) < 0)
			return 106;
	}
	verbs_loopback_free(lb);
	return 0;
}

struct client {
	pid_t pid;
	int s;
	struct hello h;
	int cmd_fd, memfd;
	uint8_t *mine; /* the parent's mapping of the client's memfd */
};

static void client_start(struct client *c)
{
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	c->pid = fork();
	ck_assert_int_ge(c->pid, 0);
	if (c->pid == 0) {
		close(sv[0]);
		_exit(client_main(sv[1]));
	}
	close(sv[1]);
	c->s = sv[0];
	int fds[2];
	ck_assert_int_eq(recv_msg(c->s, &c->h, sizeof(c->h), fds, 2), 0);
	c->cmd_fd = fds[0];
	c->memfd = fds[1];
	c->mine = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd, 0);
	ck_assert_ptr_ne(c->mine, MAP_FAILED);
}

static int client_order(struct client *c, int op, uint32_t lkey, uint32_t rkey)
{
	struct order o = { op, lkey, rkey };
	int r;

	ck_assert_int_eq(send_msg(c->s, &o, sizeof(o), NULL, 0), 0);
	ck_assert_int_eq(recv_msg(c->s, &r, sizeof(r), NULL, 0), 0);
	return r;
}

/* The client exits: its context's files close (all but copies it sent). */
static void client_exit(struct client *c)
{
	struct order o = { OP_EXIT, 0, 0 };
	int st;

	(void)send_msg(c->s, &o, sizeof(o), NULL, 0);
	ck_assert_int_eq(waitpid(c->pid, &st, 0), c->pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the client exited with %d", st);
	close(c->s);
}

static void client_stop(struct client *c)
{
	client_exit(c);
	close(c->cmd_fd);
	close(c->memfd);
	munmap(c->mine, LEN);
}

/* The kernel's count of this process's pinned pages (mm->pinned_vm), in KiB. */
static long vm_pin_kib(void)
{
	return read_status_field("/proc/self/status", "VmPin");
}


/* The whole path: mrd's keys in the client's own PD carry WRITE and READ on its own QPs; the
 * kernel charges mrd's pinned pages; after the dereg the device refuses the old rkey; mrd's
 * close of its copy leaves nothing pinned. */
START_TEST(test_write_read_on_clients_own_qps)
{
	struct client c;
	struct client_context *ctx;
	struct client_mr mr;
	char why[256] = "";
	long pin0 = vm_pin_kib();
	unsigned fds0 = count_open_fds(0);

	client_start(&c);
	ck_assert_msg(c.h.own_reg_errno != 0, "the client's own 1 MiB ibv_reg_mr worked: "
		      "RLIMIT_MEMLOCK did not hold it (the test proves nothing)");
	fprintf(stderr, "note: the client's own ibv_reg_mr of 1 MiB: %s\n",
		strerror(c.h.own_reg_errno));
	ck_assert_msg(client_context_open(c.cmd_fd, device, "/sys", NULL, 0, &ctx, why, sizeof(why)) == 0,
		      "%s", why);
	fprintf(stderr, "note: the client's context: driver %s\n", client_context_driver(ctx));
	ck_assert_msg(client_context_check_pd(ctx, c.h.pd_handle, why, sizeof(why)) == 0, "%s", why);
	ck_assert_int_eq(client_context_reg(ctx, c.h.pd_handle, c.mine, LEN, c.h.addr, RW, &mr), 0);
	ck_assert_int_ge(vm_pin_kib() - pin0, LEN / 1024); /* the kernel charged mrd */
	if (no_loopback)
		fprintf(stderr, "not run: transfers on the client's own QPs (%s)\n", no_loopback);
	else
		ck_assert_int_eq(client_order(&c, OP_TRANSFER, mr.lkey, mr.rkey), 0);
	ck_assert_int_eq(client_context_dereg(ctx, mr.handle), 0);
	ck_assert_int_eq(vm_pin_kib(), pin0);
	if (!no_loopback)
		ck_assert_int_eq(client_order(&c, OP_STALE, mr.lkey, mr.rkey), -EKEYREJECTED);
	client_stop(&c);
	client_context_close(ctx);
	ck_assert_uint_eq(count_open_fds(0), fds0);
}
END_TEST

/* A PD handle the context does not have, and one of a context the client closed before mrd
 * registered: clear errors, nothing pinned. */
START_TEST(test_foreign_pd_handle_refused)
{
	struct client c;
	struct client_context *ctx;
	struct client_mr mr;
	char why[256] = "";
	int r;
	long pin0 = vm_pin_kib();

	client_start(&c);
	ck_assert_int_eq(client_context_open(c.cmd_fd, device, "/sys", NULL, 0, &ctx, why, sizeof(why)), 0);
	r = client_context_check_pd(ctx, c.h.pd_handle + 1000, why, sizeof(why));
	ck_assert_msg(r == -ENOENT || r == -EINVAL, "%d: %s", r, why); /* Linux 7.3: ENOENT */
	fprintf(stderr, "note: a PD handle the context lacks: %s\n", why);
	ck_assert_ptr_nonnull(strstr(why, "no such PD"));
	ck_assert_int_eq(client_context_reg(ctx, c.h.pd_handle + 1000, c.mine, LEN, c.h.addr, RW,
					    &mr), r);
	ck_assert_int_eq(vm_pin_kib(), pin0);
	client_stop(&c);
	client_context_close(ctx);
}
END_TEST

/* The client dies (its copy of the fd closes) while mrd holds its own: mrd's REG_MR still
 * works on the context (the kernel keeps it for mrd's copy), and mrd's close destroys it. */
START_TEST(test_client_gone_mrd_copy_holds)
{
	struct client c;
	struct client_context *ctx;
	struct client_mr mr;
	char why[256] = "";
	long pin0 = vm_pin_kib();

	client_start(&c);
	ck_assert_int_eq(client_context_open(c.cmd_fd, device, "/sys", NULL, 0, &ctx, why, sizeof(why)), 0);
	close(c.cmd_fd);
	client_exit(&c);
	ck_assert_int_eq(client_context_reg(ctx, c.h.pd_handle, c.mine, LEN, c.h.addr, RW, &mr), 0);
	ck_assert_int_ge(vm_pin_kib() - pin0, LEN / 1024);
	client_context_close(ctx); /* the last reference: the kernel destroys the context */
	ck_assert_int_eq(vm_pin_kib(), pin0);
	close(c.memfd);
	munmap(c.mine, LEN);
}
END_TEST

/* A uverbs fd with no context on it (opened, never GET_CONTEXT): refused, nothing done. */
START_TEST(test_bare_uverbs_fd_refused)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_device *d = find_device(l);
	struct client_context *ctx;
	char path[256], why[256] = "";
	int fd, r;

	ck_assert_ptr_nonnull(d);
	snprintf(path, sizeof(path), "/dev/infiniband/%s", d->dev_name);
	fd = open(path, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	r = client_context_open(fd, device, "/sys", NULL, 0, &ctx, why, sizeof(why));
	if (r == 0) {
		r = client_context_check_pd(ctx, 0, why, sizeof(why));
		client_context_close(ctx);
	}
	fprintf(stderr, "note: a uverbs fd without a context: %s\n", why);
	ck_assert_int_lt(r, 0);
	ck_assert_int_ne(why[0], '\0');
	close(fd);
	ibv_free_device_list(l);
}
END_TEST

/* One of mrd's own contexts (an importer holds a dup of its cmd_fd, verbs_export_pd): every
 * other check passes for it, so kcmp must tell, for the fd and for a dup of it. */
START_TEST(test_own_context_refused)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *own = ibv_open_device(find_device(l));
	struct client_context *ctx = NULL;
	char why[256] = "";
	int copy;

	ck_assert_ptr_nonnull(own);
	copy = fcntl(own->cmd_fd, F_DUPFD_CLOEXEC, 3);
	ck_assert_int_ge(copy, 0);
	ck_assert_int_eq(client_context_open(own->cmd_fd, device, "/sys", &own->cmd_fd, 1, &ctx,
					     why, sizeof(why)), -EPERM);
	ck_assert_int_eq(client_context_open(copy, device, "/sys", &own->cmd_fd, 1, &ctx, why,
					     sizeof(why)), -EPERM);
	ck_assert_ptr_null(ctx);
	fprintf(stderr, "note: mrd's own context: %s\n", why);
	/* Without the list, the same fd passes: the check is what refuses it. */
	ck_assert_int_eq(client_context_open(copy, device, "/sys", NULL, 0, &ctx, why, sizeof(why)),
			 0);
	client_context_close(ctx);
	close(copy);
	ibv_close_device(own);
	ibv_free_device_list(l);
}
END_TEST

/* Another device's context ($MRD_CLIENT_PD_OTHER, e.g. siw0 beside rxe0): -EXDEV. */
START_TEST(test_other_device_refused)
{
	const char *other = getenv("MRD_CLIENT_PD_OTHER");
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct client_context *ctx;
	struct ibv_context *oc = NULL;
	char why[256] = "";

	for (int i = 0; other && l && l[i]; i++)
		if (strcmp(ibv_get_device_name(l[i]), other) == 0)
			oc = ibv_open_device(l[i]);
	if (!oc) {
		fprintf(stderr, "not run: another device's fd (no second device; "
			"$MRD_CLIENT_PD_OTHER names one)\n");
		ibv_free_device_list(l);
		return;
	}
	ck_assert_int_eq(client_context_open(oc->cmd_fd, device, "/sys", NULL, 0, &ctx, why, sizeof(why)),
			 -EXDEV);
	fprintf(stderr, "note: another device's fd: %s\n", why);
	ibv_close_device(oc);
	ibv_free_device_list(l);
}
END_TEST

/* A driver whose REG_MR needs driver data (siw: a key byte in, the STag out): refused with
 * the reason before any registration. */
START_TEST(test_driver_needing_data_refused)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *oc = ibv_open_device(find_device(l));
	struct client_context *ctx = NULL;
	char why[256] = "";

	ck_assert_ptr_nonnull(oc);
	ck_assert_int_eq(client_context_open(oc->cmd_fd, device, "/sys", NULL, 0, &ctx, why, sizeof(why)),
			 -EOPNOTSUPP);
	ck_assert_ptr_null(ctx);
	ck_assert_ptr_nonnull(strstr(why, "no driver data"));
	fprintf(stderr, "note: %s\n", why);
	ibv_close_device(oc);
	ibv_free_device_list(l);
}
END_TEST

/* Whether mrd can register for device's driver: -EOPNOTSUPP if not (why says it). */
static int driver_supported(struct ibv_device *d, char *why, size_t why_size)
{
	struct ibv_context *oc = ibv_open_device(d);
	struct client_context *ctx;
	int r;

	if (!oc)
		return -errno;
	r = client_context_open(oc->cmd_fd, ibv_get_device_name(d), "/sys", NULL, 0, &ctx, why, why_size);
	if (r == 0)
		client_context_close(ctx);
	ibv_close_device(oc);
	return r;
}

int main(void)
{
	char why[256] = "";
	struct ibv_device **l;
	Suite *s;
	TCase *tc;

	device = getenv("MRD_CONTRACT_DEVICE");
	if (geteuid() != 0) {
		printf("SKIP: client-PD registration needs root (the parent plays mrd)\n");
		return 77;
	}
	l = ibv_get_device_list(NULL);
	if (!find_device(l)) {
		printf("SKIP: no RDMA device%s%s (ibv_get_device_list); the rxe VM test runs this\n",
		       device ? " named " : "", device ? device : "");
		if (l)
			ibv_free_device_list(l);
		return 77;
	}
	s = suite_create("client-pd");
	tc = tcase_create("verbs");
	no_loopback = verbs_loopback_unsupported(find_device(l)->node_type,
						 find_device(l)->transport_type);
	if (!device)
		device = strdup(ibv_get_device_name(find_device(l)));
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_other_device_refused);
	if (driver_supported(find_device(l), why, sizeof(why)) == -EOPNOTSUPP) {
		printf("not run: registration into the client's PD (%s)\n", why);
		tcase_add_test(tc, test_driver_needing_data_refused);
	} else {
		tcase_add_test(tc, test_write_read_on_clients_own_qps);
		tcase_add_test(tc, test_foreign_pd_handle_refused);
		tcase_add_test(tc, test_client_gone_mrd_copy_holds);
		tcase_add_test(tc, test_bare_uverbs_fd_refused);
		tcase_add_test(tc, test_own_context_refused);
	}
	ibv_free_device_list(l);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
