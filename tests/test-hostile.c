/* SPDX-License-Identifier: MIT */
/* Hostile and dying clients against one real mrd, in order: garbage and oversized frames,
 * wrong and excess descriptors and a flood of them, every request before Hello, a client that
 * never reads its replies, 1,000 clients at once, clients killed with SIGKILL mid-request.
 * A well-behaved client holds memory in the same domain throughout: after each case the
 * domain holds exactly what that client holds, so what a hostile client made must have gone
 * with it; after all of them, mrd serves as before, with its descriptors and memory back near
 * the baseline taken before the first. Then, against a second mrd, what one user may take
 * however it comes: a thousand bare connections of one uid, and 64 uids of its user
 * namespaces. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "check-run.h"
#include "test-util.h"
#include "time-util.h"
#include "wire.h"

#define MANY 1000
#define MiB (1u << 20)

#define HELD (2 * MiB)

static struct mrd_proc mrd;
static char mrctl[512], out[1 << 18];
static unsigned base_fds;
static long base_rss_kb;
static mrd_client *holder; /* holds HELD bytes, one MR, for the whole storm */
static char domain[64];    /* its domain, the storm's */

/* Every socket a case opens, closed after it whatever happened, so a failed case leaves the
 * next ones a clean mrd. */
static int socks[MANY + 64];
static size_t n_socks;

static int track(int fd)
{
	ck_assert_int_ge(fd, 0);
	ck_assert_uint_lt(n_socks, sizeof(socks) / sizeof(socks[0]));
	socks[n_socks++] = fd;
	return fd;
}

static void close_tracked(int fd)
{
	for (size_t i = 0; i < n_socks; i++)
		if (socks[i] == fd) {
			socks[i] = socks[--n_socks];
			break;
		}
	close(fd);
}

static void close_all_tracked(void)
{
	while (n_socks)
		close(socks[--n_socks]);
}

static long rss_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static int mrctl_run(const char *a, const char *b)
{
	const char *argv[] = { mrctl, "--socket", mrd.socket, "--json", a, b, NULL };

	return run_capture(argv, out, sizeof(out), (uid_t)-1);
}

/* A number after "key": in the last mrctl output. */
static long long json_number(const char *key)
{
	char pattern[64];
	const char *p;

	snprintf(pattern, sizeof(pattern), "\"%s\":", key);
	p = strstr(out, pattern);
	ck_assert_msg(p, "no %s in %.400s", key, out);
	return strtoll(p + strlen(pattern), NULL, 10);
}

/* The number after "key": in the domain's object of the last mrctl clients output, -1 when
 * there is none. */
static long long domain_number(const char *key)
{
	char pattern[128];
	const char *d, *p;

	snprintf(pattern, sizeof(pattern), "{\"name\":\"%s\",", domain);
	d = strstr(out, pattern);
	if (!d)
		return -1;
	snprintf(pattern, sizeof(pattern), "\"%s\":", key);
	p = strstr(d, pattern);
	return p ? strtoll(p + strlen(pattern), NULL, 10) : -1;
}

static unsigned count_clients(void)
{
	unsigned n = 0;

	for (const char *p = strstr(out, "\"pid\":"); p; p = strstr(p + 1, "\"pid\":"))
		n++;
	return n;
}

/* Until mrd has no client but mrctl and the holder, one domain, and in it exactly what the
 * holder holds: nothing of anyone else is left. */
static void wait_settled(void)
{
	for (int i = 0; i < 500; i++) {
		ck_assert_int_eq(mrctl_run("clients", NULL), 0);
		if (count_clients() == 2 && !strstr(out, "},{\"name\"") &&
		    domain_number("clients") == 1 && domain_number("allocations") == 1 &&
		    domain_number("allocated_bytes") == HELD && domain_number("mrs") == 1 &&
		    domain_number("pinned_bytes") == HELD)
			return;
		usleep(10000);
	}
	ck_abort_msg("mrd holds more than the holder's: %.600s", out);
}

/* mrd's descriptors, once they settle at or below max (mrctl's connection closes a moment
 * after mrctl exits). */
static unsigned fds_at_most(unsigned max)
{
	unsigned n = count_open_fds(mrd.pid);

	for (int i = 0; i < 200 && n > max; i++) {
		usleep(10000);
		n = count_open_fds(mrd.pid);
	}
	return n;
}

static void send_request(int fd, Mrd__Request *req, const int *fds, size_t n_fds)
{
	ck_assert_int_eq(wire_send(fd, &req->base, WIRE_FRAME_MAX, fds, n_fds, MSG_NOSIGNAL), 0);
}

/* The next reply's status (a positive errno), -1 at the end of the stream. */
static int reply_status(int fd)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	struct wire_packet pkt;
	Mrd__Response *resp;
	int r = wire_recv(fd, buf, sizeof(buf), &pkt, 0), status;

	if (r <= 0)
		return -1;
	wire_packet_close_fds(&pkt);
	resp = mrd__response__unpack(NULL, pkt.len, pkt.data);
	ck_assert_ptr_nonnull(resp);
	status = resp->status;
	mrd__response__free_unpacked(resp, NULL);
	return status;
}

static int hello(int fd)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest h = MRD__HELLO_REQUEST__INIT;

	h.min_version = h.max_version = MRD_PROTOCOL_VERSION_MAX;
	h.capabilities = MRD_CAPS_SERVED;
	h.client_name = (char *)"hostile";
	req.id = 1;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &h;
	send_request(fd, &req, NULL, 0);
	return reply_status(fd);
}

static void send_ping(int fd, uint64_t id, const int *fds, size_t n_fds)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest p = MRD__PING_REQUEST__INIT;

	req.id = id;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &p;
	send_request(fd, &req, fds, n_fds);
}

static int connect_raw(void) { return track(raw_connect(mrd.socket)); }

static int connect_hello(void)
{
	int fd = connect_raw();

	ck_assert_int_eq(hello(fd), 0);
	return fd;
}

/* Reads until mrd hangs up (or 5 s pass: then it did not). */
static bool hung_up(int fd)
{
	uint64_t deadline = now_usec(CLOCK_MONOTONIC) + 5 * USEC_PER_SEC;
	uint8_t buf[512];

	while (now_usec(CLOCK_MONOTONIC) < deadline) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
	}
	return false;
}

/* What a well-behaved client does, all of it checked. */
static void good_session(void)
{
	struct mrd_lookup l;
	struct mrd_mr mr;
	mrd_client *c;
	char *p;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_client_ping(c), 0);
	ck_assert_int_eq(mrd_lookup_init(&l, c), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, MiB, 0, 0, (void **)&p), 0);
	memset(p, 0x5a, MiB);
	ck_assert_int_eq(mrd_lookup_mr(&l, p + 4096, &mr), 0);
	ck_assert_uint_le(mr.start, (uintptr_t)p);
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, mr.lkey, p, mr.rkey, p + MiB / 2, 64), 0);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	mrd_lookup_done(&l);
	mrd_client_close(c);
}

static void start_mrd(void)
{
	struct rlimit rl = { 16384, 16384 };
	int r;

	/* MANY clients here, and as many connections in mrd (which raises its soft limit to the
	 * hard one it inherits). */
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
		ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	r = mrd_proc_start(&mrd, "[limits]\nclients = 1100\nprotocol_errors = 4\n"
				 "[quota]\nclients = 1100\n[memory]\nhugepages = no\n", NULL);
	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
	test_build_path("mrctl", mrctl, sizeof(mrctl));
	good_session(); /* what is made once, on first use, is part of the baseline */
	{
		struct mrd_lookup l;
		struct mrd_mr mr;
		void *p;

		ck_assert_int_eq(mrd_client_connect(mrd.socket, &holder), 0);
		ck_assert_int_eq(mrd_mem_alloc(holder, HELD, 0, 0, &p), 0);
		ck_assert_int_eq(mrd_lookup_init(&l, holder), 0);
		ck_assert_int_eq(mrd_lookup_mr(&l, p, &mr), 0);
		mrd_lookup_done(&l);
		snprintf(domain, sizeof(domain), "%s", mrd_client_domain(holder));
	}
	wait_settled();
	base_fds = count_open_fds(mrd.pid);
	for (int i = 0; i < 10; i++) { /* the settled count: mrctl's last connection gone */
		unsigned n = count_open_fds(mrd.pid);

		base_fds = n < base_fds ? n : base_fds;
		usleep(20000);
	}
	ck_assert_uint_gt(base_fds, 0); /* /proc told */
	base_rss_kb = rss_kb(mrd.pid);
	printf("baseline: mrd has %u descriptors and %ld KiB resident\n", base_fds, base_rss_kb);
}

static void stop_mrd(void)
{
	holder = mrd_client_close(holder);
	if (mrd.pid > 0) /* a case failed before the last one stopped it */
		(void)mrd_proc_stop(&mrd);
}

START_TEST(test_garbage_and_oversized_frames)
{
	static uint8_t big[150 * 1024]; /* more than a frame, less than a socket buffer */
	int fd[16];

	srand(1);
	memset(big, 0xab, sizeof(big));
	for (int i = 0; i < 16; i++) {
		fd[i] = i % 2 ? connect_hello() : connect_raw(); /* before Hello, too */
		/* Past [limits] frame_bytes (64 KiB): refused, and counted. */
		ck_assert_int_eq(send(fd[i], big, sizeof(big), MSG_NOSIGNAL), (ssize_t)sizeof(big));
		ck_assert_int_eq(reply_status(fd[i]), EMSGSIZE);
		for (int k = 0; k < 8; k++) {
			uint8_t junk[200];

			for (size_t j = 0; j < sizeof(junk); j++)
				junk[j] = (uint8_t)rand();
			(void)send(fd[i], junk, 1 + (size_t)rand() % sizeof(junk), MSG_NOSIGNAL);
		}
	}
	for (int i = 0; i < 16; i++) {
		ck_assert_msg(hung_up(fd[i]), "mrd kept client %d after 9 bad frames", i);
		close_tracked(fd[i]);
	}
	good_session();
	wait_settled();
}
END_TEST

START_TEST(test_wrong_and_flooded_descriptors)
{
	int pipes[WIRE_FDS_MAX][2], fds[WIRE_FDS_MAX], fd = connect_hello(), sent;
	char ch;

	for (size_t i = 0; i < WIRE_FDS_MAX; i++) {
		ck_assert_int_eq(pipe2(pipes[i], O_CLOEXEC), 0);
		fds[i] = pipes[i][1];
	}
	/* A Ping carries none; more than [limits] fds_per_message (4) is refused too. */
	send_ping(fd, 2, fds, 1);
	ck_assert_int_eq(reply_status(fd), EBADMSG);
	send_ping(fd, 3, fds, WIRE_FDS_MAX);
	ck_assert_int_eq(reply_status(fd), EBADMSG);
	for (size_t i = 0; i < WIRE_FDS_MAX; i++) {
		struct pollfd p = { .fd = pipes[i][0], .events = POLLIN };

		close(pipes[i][1]);
		/* EOF: mrd closed its copy of the write end as well (no EOF: it kept one). */
		ck_assert_msg(poll(&p, 1, 5000) == 1, "mrd kept descriptor %zu of a refused request",
			      i);
		ck_assert_int_eq(read(pipes[i][0], &ch, 1), 0);
		close(pipes[i][0]);
	}
	close_tracked(fd);

	/* A flood: requests that may carry a descriptor (ExtmemAttach with a memfd mrd refuses,
	 * as it is not sealed), never read back, until mrd stops reading and the kernel stops
	 * queueing; then gone with the client. */
	fd = connect_hello();
	ck_assert_int_eq(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	for (sent = 0; sent < 5000; sent++) {
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__ExtmemAttachRequest x = MRD__EXTMEM_ATTACH_REQUEST__INIT;
		int mfd = memfd_create("flood", MFD_CLOEXEC), r;

		ck_assert_int_ge(mfd, 0);
		ck_assert_int_eq(ftruncate(mfd, 4096), 0);
		x.length = 4096;
		req.id = 10 + (uint64_t)sent;
		req.body_case = MRD__REQUEST__BODY_EXTMEM_ATTACH;
		req.extmem_attach = &x;
		r = wire_send(fd, &req.base, WIRE_FRAME_MAX, &mfd, 1, MSG_NOSIGNAL);
		close(mfd);
		if (r == -EAGAIN || r == -ETOOMANYREFS)
			break; /* mrd stopped reading us; the kernel holds the rest */
		ck_assert_msg(r == 0, "sending descriptors: %s", strerror(-r));
	}
	printf("flood: %d requests with a descriptor each before the socket filled\n", sent);
	ck_assert_int_ge(sent, 100);
	ck_assert_uint_le(count_open_fds(mrd.pid), base_fds + 1 + 64); /* the client, 16 in replies */
	good_session(); /* others are served meanwhile */
	close_tracked(fd);
	wait_settled();
	ck_assert_uint_le(fds_at_most(base_fds), base_fds);
}
END_TEST

START_TEST(test_every_request_before_hello)
{
	const ProtobufCMessageDescriptor *rd = &mrd__request__descriptor;
	unsigned tried = 0;

	for (unsigned i = 0; i < rd->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &rd->fields[i];
		Mrd__Request req = MRD__REQUEST__INIT;
		uint8_t body[1024] __attribute__((aligned(16)));
		const ProtobufCMessageDescriptor *bd;
		int fd, status;

		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || f->id == MRD__REQUEST__BODY_HELLO)
			continue;
		/* An empty body of the field's type, set as the oneof's case. */
		bd = f->descriptor;
		ck_assert_uint_le(bd->sizeof_message, sizeof(body));
		protobuf_c_message_init(bd, body);
		req.id = 7;
		*(uint32_t *)((char *)&req + f->quantifier_offset) = f->id;
		*(void **)((char *)&req + f->offset) = body;
		fd = connect_raw();
		send_request(fd, &req, NULL, 0);
		status = reply_status(fd);
		/* ExtmemAttach without its memfd is refused for that first. */
		ck_assert_msg(status == EPROTO || (status == EBADMSG &&
						   f->id == MRD__REQUEST__BODY_EXTMEM_ATTACH),
			      "%s before Hello: status %d", f->name, status);
		close_tracked(fd);
		tried++;
	}
	ck_assert_uint_eq(tried, rd->n_fields - 2); /* all but id and hello */
	wait_settled();
}
END_TEST

START_TEST(test_client_that_never_reads)
{
	int fd = connect_hello(), sent = 0;

	ck_assert_int_eq(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	for (int i = 0; i < 100000; i++) {
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__StatusRequest s = MRD__STATUS_REQUEST__INIT;

		req.id = 2 + (uint64_t)i;
		req.body_case = MRD__REQUEST__BODY_STATUS; /* replies bigger than the requests */
		req.status = &s;
		if (wire_send(fd, &req.base, WIRE_FRAME_MAX, NULL, 0, MSG_NOSIGNAL) < 0)
			break; /* EAGAIN: mrd stopped reading us, and its replies wait */
		sent++;
	}
	ck_assert_int_lt(sent, 100000);
	printf("a client that never reads: %d requests before mrd stopped reading\n", sent);
	/* Others are served promptly meanwhile. */
	for (int i = 0; i < 20; i++) {
		uint64_t t0 = now_usec(CLOCK_MONOTONIC);

		good_session();
		ck_assert_uint_lt(now_usec(CLOCK_MONOTONIC) - t0, USEC_PER_SEC);
	}
	close_tracked(fd);
	wait_settled();
}
END_TEST

START_TEST(test_thousand_clients)
{
	static int fd[MANY];

	for (int i = 0; i < MANY; i++) {
		fd[i] = connect_hello();
		if (i % 10 == 0) { /* some join the domain and hold memory */
			Mrd__Request req = MRD__REQUEST__INIT;
			Mrd__AllocRequest a = MRD__ALLOC_REQUEST__INIT;

			a.size = 64 * 1024;
			req.id = 2;
			req.body_case = MRD__REQUEST__BODY_ALLOC;
			req.alloc = &a;
			send_request(fd[i], &req, NULL, 0);
			ck_assert_int_eq(reply_status(fd[i]), 0);
		}
	}
	ck_assert_int_eq(mrctl_run("status", NULL), 0);
	ck_assert_int_eq(json_number("clients"), MANY + 2); /* and the holder, and mrctl */
	ck_assert_int_eq(mrctl_run("clients", NULL), 0);
	ck_assert_int_eq(domain_number("allocations"), MANY / 10 + 1);
	good_session();
	for (int i = 0; i < MANY; i++)
		close_tracked(fd[i]);
	wait_settled();
}
END_TEST

/* A libmrd client that works until it is killed: registrations, frees, Dma, pings. */
_Noreturn static void busy_client(void)
{
	struct mrd_lookup l;
	struct mrd_mr mr;
	mrd_client *c;
	char *keep, *p;

	if (mrd_client_connect(mrd.socket, &c) < 0 || mrd_lookup_init(&l, c) < 0 ||
	    mrd_mem_alloc(c, 4 * MiB, 0, 0, (void **)&keep) < 0)
		_exit(2);
	for (;;) {
		if (mrd_mem_alloc(c, 256 * 1024, 0, 0, (void **)&p) == 0) {
			if (mrd_lookup_mr(&l, p, &mr) == 0)
				(void)mrd_dma(c, MRD_DMA_WRITE, mr.lkey, p, mr.rkey, p + 4096, 4096);
			(void)mrd_mem_free(c, p);
		}
		(void)mrd_lookup_mr(&l, keep + MiB, &mr);
		(void)mrd_client_ping(c);
	}
}

START_TEST(test_clients_killed_mid_request)
{
	unsigned seed = 7;

	for (int i = 0; i < 60; i++) {
		pid_t pid = fork();
		int status;

		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			busy_client();
		usleep(2000 + (useconds_t)(rand_r(&seed) % 30000));
		ck_assert_int_eq(kill(pid, SIGKILL), 0);
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert_msg(WIFSIGNALED(status), "client %d ended before the kill: %d", i, status);
		if (i % 20 == 0)
			good_session();
	}
	wait_settled(); /* every client's memory, MRs and domain released */
}
END_TEST

START_TEST(test_after_the_storm)
{
	unsigned fds;
	long rss;

	good_session();
	wait_settled();
	fds = fds_at_most(base_fds);
	rss = rss_kb(mrd.pid);
	printf("after the storm: mrd has %u descriptors (baseline %u) and %ld KiB resident "
	       "(baseline %ld)\n", fds, base_fds, rss, base_rss_kb);
	ck_assert_uint_le(fds, base_fds);
	/* Near the baseline: what the allocator keeps for reuse, not what the storm brought.
	 * ASan keeps up to 256 MiB of freed memory in quarantine; under valgrind the figure is
	 * valgrind's, and its leak check (the exit status below) is the stricter test. */
	if (getenv("MRD_TEST_WRAPPER"))
		printf("resident size not compared: mrd runs under %s\n", getenv("MRD_TEST_WRAPPER"));
	else
		ck_assert_int_le(rss, base_rss_kb + (getenv("MRD_SAN_CFLAGS") &&
						     *getenv("MRD_SAN_CFLAGS") ? 300 : 16) * 1024);
	ck_assert_int_eq(mrctl_run("status", NULL), 0);
	ck_assert_int_ge(json_number("clients_dropped"), 16); /* the storm did reach mrd */
	ck_assert_int_ge(json_number("protocol_errors"), 16);
	/* A clean exit on SIGTERM (under valgrind: no leak, no invalid access). */
	holder = mrd_client_close(holder);
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	mrd.pid = 0;
}
END_TEST

/* Slots and quotas per user, against a second mrd: the shipped [limits] and [quota], and a
 * 64 GiB window (64 arena slots of 1 GiB) so that what one user can take shows against the
 * whole. */
static struct mrd_proc users;

#define ATTACKER 1000
#define VICTIM 1001
#define BARE 1024 /* [limits] clients: the shipped default */

static void start_users(void)
{
	struct rlimit rl;
	int r;

	/* The attacker holds BARE connections, and mrd as many (it raises its soft limit). */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < BARE + 64) {
		rl.rlim_cur = rl.rlim_max < BARE + 64 ? rl.rlim_max : BARE + 64;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	r = mrd_proc_start(&users, "[memory]\nhugepages = no\nwindow_size = 64G\n", NULL);
	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
}

static void stop_users(void)
{
	if (users.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&users), 0);
}

/* A case's children hold what they made until the write end of the hold pipe closes; so that a
 * failed case leaves the next one a clean mrd, the teardown closes it and reaps them. */
static int hold_end = -1;
static pid_t kids[4];
static size_t n_kids;

static pid_t kid(pid_t pid)
{
	ck_assert_int_ge(pid, 0);
	if (pid > 0) {
		ck_assert_uint_lt(n_kids, sizeof(kids) / sizeof(kids[0]));
		kids[n_kids++] = pid;
	}
	return pid;
}

/* The exit status of pid (a kid), -1 when it did not exit; it is killed after 10 s. */
static int reap(pid_t pid)
{
	int status = -1;

	for (int i = 0; i < 1000 && waitpid(pid, &status, WNOHANG) == 0; i++)
		usleep(10000);
	if (status == -1) {
		kill(pid, SIGKILL);
		(void)waitpid(pid, &status, 0);
	}
	for (size_t i = 0; i < n_kids; i++)
		if (kids[i] == pid)
			kids[i] = kids[--n_kids];
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void release_children(void)
{
	if (users.pid > 0)
		(void)kill(users.pid, SIGCONT); /* a case that stopped it failed before it went on */
	if (hold_end >= 0)
		close(hold_end);
	hold_end = -1;
	while (n_kids)
		(void)reap(kids[0]);
}

/* The next report on fd, within 60 s. */
static void read_report(int fd, void *buf, size_t size)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	ck_assert_msg(poll(&p, 1, 60000) == 1, "no report within 60 s");
	ck_assert_int_eq(read(fd, buf, size), (ssize_t)size);
}

/* Whether this process (and so the mrd it starts) may read other users' namespaces: without
 * CAP_SYS_PTRACE (a container's root, often) mrd groups by /etc/subuid alone. */
static bool can_read_namespaces(void)
{
	unsigned long long eff = 0;
	char line[256];
	FILE *f = fopen("/proc/self/status", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &eff) == 1)
			break;
	fclose(f);
	return eff & (1ULL << 19); /* CAP_SYS_PTRACE */
}

/* This (forked) process as uid, gid uid, and no supplementary group. */
static bool become(uid_t uid)
{
	return setgroups(0, NULL) == 0 && setresgid(uid, uid, uid) == 0 &&
	       setresuid(uid, uid, uid) == 0;
}

/* Whether uid, in a child of its own, connects, allocates 1 MiB and frees it. */
static bool served_as(uid_t uid)
{
	pid_t pid = fork();
	int status;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		mrd_client *c = NULL;
		void *p;
		int r;

		if (!become(uid))
			_exit(3);
		r = mrd_client_connect(users.socket, &c);
		if (r == 0)
			r = mrd_mem_alloc(c, MiB, 0, 0, &p);
		if (r == 0)
			r = mrd_mem_free(c, p);
		if (r < 0)
			fprintf(stderr, "uid %u not served: %s: %s\n", (unsigned)uid, strerror(-r),
				mrd_last_error());
		mrd_client_close(c);
		_exit(r == 0 ? 0 : 1);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* What the attacker saw of its connections. */
struct bare_report {
	unsigned served, refused;
	char refusal[200]; /* mrd's reason, as the last refused one got it */
};

/* BARE connections as ATTACKER, none saying Hello. Each sends a Ping: answered EPROTO (before
 * Hello) where mrd took the connection, which then holds a slot; EUSERS with mrd's reason where
 * it refused it. Reports on report, then holds them all until hold closes. */
_Noreturn static void bare_attacker(int report, int hold)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	static int fd[BARE];
	struct bare_report rep = { 0 };
	char ch;

	if (!become(ATTACKER))
		_exit(3);
	for (int i = 0; i < BARE; i++) {
		fd[i] = raw_connect(users.socket);
		if (fd[i] < 0)
			_exit(4);
	}
	for (int i = 0; i < BARE; i++) {
		Mrd__Request req = MRD__REQUEST__INIT;
		Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
		struct wire_packet pkt;
		Mrd__Response *resp;

		req.id = 2;
		req.body_case = MRD__REQUEST__BODY_PING;
		req.ping = &ping;
		/* A refused connection may be closed already: its refusal is still there to read. */
		(void)wire_send(fd[i], &req.base, WIRE_FRAME_MAX, NULL, 0, MSG_NOSIGNAL);
		if (wire_recv(fd[i], buf, sizeof(buf), &pkt, 0) <= 0)
			_exit(5);
		resp = mrd__response__unpack(NULL, pkt.len, pkt.data);
		if (!resp)
			_exit(6);
		if (resp->status == EPROTO) {
			rep.served++;
		} else if (resp->status == EUSERS) {
			rep.refused++;
			snprintf(rep.refusal, sizeof(rep.refusal), "%s", resp->message);
			close(fd[i]);
		} else
			_exit(7);
		mrd__response__free_unpacked(resp, NULL);
	}
	if (write(report, &rep, sizeof(rep)) != sizeof(rep))
		_exit(8);
	(void)read(hold, &ch, 1); /* EOF: the test is done looking */
	_exit(0);
}

/* One uid's bare connections (no Hello) take its share of the slots, not everyone's. */
START_TEST(test_bare_connections_of_one_uid)
{
	struct bare_report rep;
	int reports[2], hold[2];
	pid_t pid;

	ck_assert_int_eq(pipe2(reports, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(hold, O_CLOEXEC), 0);
	pid = kid(fork());
	if (pid == 0) {
		close(hold[1]);
		bare_attacker(reports[1], hold[0]);
	}
	close(reports[1]);
	close(hold[0]);
	hold_end = hold[1];
	read_report(reports[0], &rep, sizeof(rep));
	close(reports[0]);
	printf("%u bare connections of uid %u: %u served, %u refused (\"%s\")\n", BARE, ATTACKER,
	       rep.served, rep.refused, rep.refusal);
	/* The shipped [limits] clients_per_user. */
	ck_assert_uint_eq(rep.served, 256);
	ck_assert_uint_eq(rep.refused, BARE - 256);
	ck_assert_str_eq(rep.refusal, "uid 1000 has 256 connections open ([limits] clients_per_user)");
	/* While it holds them, another user is served, and so is root. */
	ck_assert(served_as(VICTIM));
	ck_assert(served_as(0));
	close(hold_end);
	hold_end = -1;
	ck_assert_int_eq(reap(pid), 0);
	/* Its slots come back with it gone (mrd sees the hang-ups a moment later). */
	for (int i = 0; i < 100 && !served_as(ATTACKER); i++)
		usleep(20000);
	ck_assert(served_as(ATTACKER));
}
END_TEST

/* What one namespaced identity saw: its domain, and whether mrd took its 4 KiB memfd into the
 * window (an arena of a whole 1 GiB slot), or why not. */
struct ns_report {
	int attach;
	char domain[64];
	char why[200];
};

/* How the identities inside a namespace run: n of them, uid (and gid) first.. inside; the last
 * one makes a namespace of its own first, as any unprivileged process may. Each reports on out
 * and holds its connection until hold closes. */
struct identities {
	unsigned first, n;
	bool nest_last;
	int out, hold;
};

_Noreturn static void ns_identity(const struct identities *ids, unsigned i)
{
	struct ns_report rep = { 0 };
	uid_t id = ids->first + i;
	mrd_client *c;
	void *p;
	char ch;
	int fd;

	if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0)
		_exit(3);
	if (ids->nest_last && i == ids->n - 1) {
		char map[32];

		snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)id);
		/* The uid change left it undumpable, its /proc files root's: writable again. */
		if (prctl(PR_SET_DUMPABLE, 1) < 0 || unshare(CLONE_NEWUSER) < 0)
			_exit(4);
		fd = open("/proc/self/uid_map", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, map, strlen(map)) != (ssize_t)strlen(map))
			_exit(5);
		close(fd);
	}
	rep.attach = mrd_client_connect(users.socket, &c);
	if (rep.attach == 0) {
		snprintf(rep.domain, sizeof(rep.domain), "%s", mrd_client_domain(c));
		fd = memfd_create("identity", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd < 0 || ftruncate(fd, 4096) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
			_exit(7);
		rep.attach = mrd_extmem_attach(c, fd, 0, 4096, &p);
	}
	snprintf(rep.why, sizeof(rep.why), "%s", rep.attach < 0 ? mrd_last_error() : "");
	if (write(ids->out, &rep, sizeof(rep)) != sizeof(rep))
		_exit(8);
	(void)read(ids->hold, &ch, 1);
	_exit(0);
}

/* A child that makes a user namespace as uid owner (gid owner), whose uids and gids 0.. map to
 * first.. (written from here, as newuidmap does with a user's /etc/subuid range, or as root
 * makes a container's); inside, as uid 0, it runs ids's identities and waits for them.
 * Returns its pid, or -1 with the reason in skip when the kernel refuses the namespace. */
static pid_t identities_in_namespace(uid_t owner, unsigned first, const struct identities *ids,
				     char *skip, size_t skip_size)
{
	int ready[2], mapped[2], err = 0;
	const char *file[] = { "uid_map", "gid_map" };
	char ch = 0;
	pid_t pid;

	ck_assert_int_eq(pipe2(ready, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(mapped, O_CLOEXEC), 0);
	pid = kid(fork());
	if (pid == 0) {
		int status;

		close(ready[0]);
		close(mapped[1]);
		close(hold_end); /* the identities wait for its EOF */
		if (owner != 0 && !become(owner))
			_exit(3);
		err = unshare(CLONE_NEWUSER) < 0 ? errno : 0;
		if (write(ready[1], &err, sizeof(err)) != sizeof(err) || err)
			_exit(77);
		if (read(mapped[0], &ch, 1) != 1 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
			_exit(4);
		for (unsigned i = 0; i < ids->n; i++) {
			pid_t child = fork();

			if (child < 0)
				_exit(5);
			if (child == 0)
				ns_identity(ids, i);
		}
		for (unsigned i = 0; i < ids->n; i++)
			if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
				_exit(6);
		_exit(0);
	}
	close(ready[1]);
	close(mapped[0]);
	ck_assert_int_eq(read(ready[0], &err, sizeof(err)), (ssize_t)sizeof(err));
	close(ready[0]);
	if (err) {
		snprintf(skip, skip_size, "unshare(CLONE_NEWUSER) as uid %u: %s", (unsigned)owner,
			 strerror(err));
		close(mapped[1]);
		(void)reap(pid);
		return -1;
	}
	for (int k = 0; k < 2; k++) {
		char path[64], map[64];
		int fd;

		snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file[k]);
		snprintf(map, sizeof(map), "0 %u 65536\n", first);
		fd = open(path, O_WRONLY | O_CLOEXEC);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(write(fd, map, strlen(map)), (ssize_t)strlen(map));
		close(fd);
	}
	ck_assert_int_eq(write(mapped[1], &ch, 1), 1);
	close(mapped[1]);
	return pid;
}

/* The first reply on fd within 10 s: its status (-1: none), its message in why. */
static int first_reply(int fd, char *why, size_t size)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct wire_packet pkt;
	Mrd__Response *resp;
	int status;

	if (poll(&p, 1, 10000) != 1 || wire_recv(fd, buf, sizeof(buf), &pkt, 0) <= 0)
		return -1;
	wire_packet_close_fds(&pkt);
	resp = mrd__response__unpack(NULL, pkt.len, pkt.data);
	if (!resp)
		return -1;
	status = resp->status;
	snprintf(why, size, "%s", resp->message ? resp->message : "");
	mrd__response__free_unpacked(resp, NULL);
	return status;
}

/* A connection whose process mrd can no longer tell (it changed its uid before mrd took the
 * connection, or it is gone and its pid free for anyone) is refused: its namespace, and so
 * whom it is charged to, cannot be known. mrd is stopped while they connect, so that it takes
 * the connections only after. */
START_TEST(test_peers_that_cannot_be_told)
{
	static uint8_t buf[64];
	struct wire_packet pkt;
	int ready[2], sv[2], gone;
	pid_t changed, exited;
	char why[200], ch;

	ck_assert_int_eq(pipe2(ready, O_CLOEXEC), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(kill(users.pid, SIGSTOP), 0);
	/* One connects as root and then runs as uid 1000; it exits with mrd's answer. (An mrd that
	 * cannot read namespaces charges it by its uid alone, as root: nothing to tell.) */
	changed = can_read_namespaces() ? kid(fork()) : -1;
	if (changed < 0)
		printf("SKIP a process that changed its uid: no CAP_SYS_PTRACE\n");
	if (changed == 0) {
		int fd = raw_connect(users.socket);

		if (fd < 0 || !become(ATTACKER) || write(ready[1], "x", 1) != 1)
			_exit(100);
		_exit(first_reply(fd, why, sizeof(why)) == ESRCH ? 0 : 101);
	}
	/* One connects, hands its socket over and exits. */
	exited = kid(fork());
	if (exited == 0) {
		int fd = raw_connect(users.socket);

		_exit(fd >= 0 && wire_send_raw(sv[1], "x", 1, &fd, 1, 0) == 0 ? 0 : 100);
	}
	ck_assert_int_eq(reap(exited), 0);
	ck_assert_int_eq(wire_recv(sv[0], buf, sizeof(buf), &pkt, 0), 1);
	ck_assert_uint_eq(pkt.n_fds, 1);
	gone = pkt.fds[0];
	ck_assert(changed < 0 || read(ready[0], &ch, 1) == 1);
	ck_assert_int_eq(kill(users.pid, SIGCONT), 0);

	ck_assert_int_eq(first_reply(gone, why, sizeof(why)), ESRCH);
	ck_assert_msg(strstr(why, "cannot tell which user namespace"), "%s", why);
	ck_assert(changed < 0 || reap(changed) == 0);
	close(gone);
	close(sv[0]);
	close(sv[1]);
	close(ready[0]);
	close(ready[1]);
	ck_assert(served_as(0)); /* and mrd serves on */
}
END_TEST

#define IDENTITIES 64

/* One user given /etc/subuid's 65,536 uids is 64 users to the kernel (one of them in a
 * namespace nested in the first). mrd charges them all to that user: one domain, whose share of
 * the window ([quota] window_bytes, an eighth of it by default) leaves room for everyone else.
 * A namespace root made is an administrator's: its uids count as their own. */
START_TEST(test_user_namespace_identities)
{
	struct identities ids = { .first = 0, .n = IDENTITIES, .nest_last = true };
	unsigned attached = 0, refused = 0;
	int reports[2], hold[2];
	struct ns_report rep;
	char skip[160];

	if (!can_read_namespaces()) {
		printf("SKIP user namespaces: without CAP_SYS_PTRACE mrd cannot read another user's "
		       "namespace (it groups by /etc/subuid, which this host need not fill)\n");
		return;
	}
	ck_assert_int_eq(pipe2(reports, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(hold, O_CLOEXEC), 0);
	hold_end = hold[1];
	ids.out = reports[1];
	ids.hold = hold[0];
	if (identities_in_namespace(ATTACKER, 100000, &ids, skip, sizeof(skip)) < 0) {
		printf("SKIP user namespaces: %s\n", skip);
		close(hold[0]);
		close(reports[0]);
		close(reports[1]);
		return;
	}
	for (unsigned i = 0; i < IDENTITIES; i++) {
		read_report(reports[0], &rep, sizeof(rep));
		ck_assert_msg(strcmp(rep.domain, "uid-1000") == 0, "identity %u: domain \"%s\" (%s)",
			      i, rep.domain, rep.attach < 0 ? rep.why : "attached");
		if (rep.attach == 0) {
			attached++;
			continue;
		}
		ck_assert_int_eq(rep.attach, -EDQUOT);
		ck_assert_msg(strstr(rep.why, "quota.window_bytes (8589934592) reached for domain "
					      "uid-1000"), "refused with: %s", rep.why);
		refused++;
	}
	printf("%u identities of uid %u in user namespaces: %u memfds attached, %u refused (%s)\n",
	       IDENTITIES, ATTACKER, attached, refused, rep.why);
	ck_assert_uint_eq(attached, 8); /* 8 GiB of the 64 GiB window: 8 slots */
	/* While they hold their memory, others are served. */
	ck_assert(served_as(VICTIM));
	ck_assert(served_as(0));

	/* Root's namespace, mapping its uids to 200000..: uid 200000 is nobody else's. */
	ids = (struct identities){ .first = 0, .n = 1, .out = reports[1], .hold = hold[0] };
	ck_assert_int_ge(identities_in_namespace(0, 200000, &ids, skip, sizeof(skip)), 0);
	read_report(reports[0], &rep, sizeof(rep));
	ck_assert_str_eq(rep.domain, "uid-200000");
	ck_assert_int_eq(rep.attach, 0);

	close(hold[0]);
	close(reports[1]);
	close(hold_end);
	hold_end = -1;
	while (n_kids)
		ck_assert_int_eq(reap(kids[0]), 0);
	close(reports[0]);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hostile");
	TCase *tc = tcase_create("storm");

	/* One mrd for the whole storm, in order: the last case looks at what the others left
	 * and stops mrd, so the cases run in this process, mrd's parent. */
	setenv("CK_FORK", "no", 1);
	tcase_add_unchecked_fixture(tc, start_mrd, stop_mrd);
	tcase_add_checked_fixture(tc, NULL, close_all_tracked);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_garbage_and_oversized_frames);
	tcase_add_test(tc, test_wrong_and_flooded_descriptors);
	tcase_add_test(tc, test_every_request_before_hello);
	tcase_add_test(tc, test_client_that_never_reads);
	tcase_add_test(tc, test_thousand_clients);
	tcase_add_test(tc, test_clients_killed_mid_request);
	tcase_add_test(tc, test_after_the_storm);
	suite_add_tcase(s, tc);

	tc = tcase_create("users");
	tcase_add_unchecked_fixture(tc, start_users, stop_users);
	tcase_add_checked_fixture(tc, NULL, release_children);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_bare_connections_of_one_uid);
	tcase_add_test(tc, test_peers_that_cannot_be_told);
	tcase_add_test(tc, test_user_namespace_identities);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
