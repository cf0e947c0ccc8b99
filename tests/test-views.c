/* SPDX-License-Identifier: MIT */
/* What clients choose and root's views show, against one real mrd and the real mrctl: names
 * are refused at the door when they hold control bytes and escaped on output anyway; views
 * too big for one reply come in pages (mempools) or cut with a count of what was left out
 * (clients), and mrd never leaves a request unanswered; the status page a client receives
 * cannot be written, reopened for writing or sealed by it. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "check-run.h"
#include "escape.h"
#include "status-page.h"
#include "test-util.h"
#include "wire.h"

#define POOLS 48         /* x 1024 MRs: well over WIRE_FRAME_MAX in one Mempools reply */
#define POOL_RANGES 1024
#define MANY_CLIENTS 3200 /* their Clients view: over a socket's default send buffer */

static struct mrd_proc mrd;
static char mrctl[512];
static char out[16 << 20]; /* mrctl mempools of POOLS x POOL_RANGES MRs: some MiB of text */
static uint64_t next_id = 1;

static int mrctl_run(const char *a, const char *b)
{
	const char *argv[] = { mrctl, "--socket", mrd.socket, a, b, NULL };

	return run_capture(argv, out, sizeof(out), (uid_t)-1);
}

static void send_request(int fd, Mrd__Request *req)
{
	req->id = ++next_id;
	ck_assert_int_eq(wire_send(fd, &req->base, WIRE_FRAME_MAX, NULL, 0, MSG_NOSIGNAL), 0);
}

/* The next reply, NULL when none came within timeout_ms; its size to *len. Descriptors it
 * carried go to *fd (closed when fd is NULL). */
static Mrd__Response *recv_reply(int sock, int timeout_ms, size_t *len, int *fd)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	struct pollfd p = { .fd = sock, .events = POLLIN };
	struct wire_packet pkt;
	Mrd__Response *resp;

	if (poll(&p, 1, timeout_ms) != 1)
		return NULL;
	ck_assert_int_eq(wire_recv(sock, buf, sizeof(buf), &pkt, 0), 1);
	if (fd && pkt.n_fds == 1)
		*fd = pkt.fds[0];
	else
		wire_packet_close_fds(&pkt);
	if (len)
		*len = pkt.len;
	resp = mrd__response__unpack(NULL, pkt.len, pkt.data);
	ck_assert_ptr_nonnull(resp);
	return resp;
}

/* A request that must be answered (within 10 s) with status error. */
static Mrd__Response *call(int fd, Mrd__Request *req, int error)
{
	Mrd__Response *resp;

	send_request(fd, req);
	resp = recv_reply(fd, 10000, NULL, NULL);
	ck_assert_msg(resp, "no answer to request %d in 10 s", (int)req->body_case);
	ck_assert_msg(resp->status == error, "status %d (%s), expected %d", resp->status,
		      resp->message, error);
	return resp;
}

static int hello_as(const char *name)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest h = MRD__HELLO_REQUEST__INIT;
	int fd = raw_connect(mrd.socket);

	ck_assert_int_ge(fd, 0);
	h.min_version = h.max_version = MRD_PROTOCOL_VERSION_MAX;
	h.capabilities = MRD_CAPS_SERVED;
	h.client_name = (char *)name;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &h;
	mrd__response__free_unpacked(call(fd, &req, 0), NULL);
	return fd;
}

static uint64_t alloc(int fd, uint64_t size)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest a = MRD__ALLOC_REQUEST__INIT;
	Mrd__Response *resp;
	uint64_t addr;

	a.size = size;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &a;
	resp = call(fd, &req, 0);
	addr = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	return addr;
}

/* MempoolRegister of n ranges; the reply's status is returned, its message copied to why. */
static int pool_register(int fd, const char *name, uint64_t *starts, uint64_t *lengths,
			 size_t n, char *why, size_t why_size)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolRegisterRequest q = MRD__MEMPOOL_REGISTER_REQUEST__INIT;
	Mrd__Response *resp;
	int status;

	q.name = (char *)name;
	q.starts = starts;
	q.n_starts = n;
	q.lengths = lengths;
	q.n_lengths = n;
	req.body_case = MRD__REQUEST__BODY_MEMPOOL_REGISTER;
	req.mempool_register = &q;
	send_request(fd, &req);
	/* 1,024 MRs under the loop's registration budget: seconds under ASan beside a CPU hog,
	 * where 30 s once did not do (CI); minutes is far above any machine's. */
	resp = recv_reply(fd, 180000, NULL, NULL);
	ck_assert_ptr_nonnull(resp);
	status = resp->status;
	if (why)
		snprintf(why, why_size, "%s", resp->message ? resp->message : "");
	mrd__response__free_unpacked(resp, NULL);
	return status;
}

static unsigned count(const char *hay, const char *needle)
{
	unsigned n = 0;

	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* Nothing but printable ASCII, newlines and (JSON aside) spaces in the last mrctl output. */
static void output_is_clean(void)
{
	for (const char *p = out; *p; p++)
		ck_assert_msg((*p >= 0x20 && *p < 0x7f) || *p == '\n',
			      "byte 0x%02x at %zu of mrctl's output", (unsigned)(unsigned char)*p,
			      (size_t)(p - out));
}

static void start_mrd(void)
{
	int r;

	ck_assert_int_eq(open_files_limit_set(16384), 0);
	r = mrd_proc_start(&mrd, "[limits]\nclients = 4000\n[memory]\nhugepages = no\n"
				 "[quota]\npinned_bytes = 1G\nallocated_bytes = 1G\n", NULL);
	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
	test_build_path("mrctl", mrctl, sizeof(mrctl));
}

static void stop_mrd(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	mrd.pid = 0;
}

START_TEST(test_names_refused_and_escaped)
{
	static const char *const refused[] = {
		"\x1b]0;owned\x07", "ok\nroot pool of pid 1", "tab\there", "del\x7f", "\xc3\xa9t\xc3\xa9",
		"\xff\xfe",
	};
	int fd = hello_as("my app  \\ 1 0 0");
	uint64_t mem = alloc(fd, 64 * 1024), len = 4096;
	char why[256];

	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		ck_assert_int_eq(pool_register(fd, refused[i], &mem, &len, 1, why, sizeof(why)),
				 EINVAL);
		ck_assert_msg(strstr(why, "printable ASCII"), "refusal says: %s", why);
	}
	ck_assert_int_eq(pool_register(fd, "q\"uote\\back slash", &mem, &len, 1, NULL, 0), 0);

	/* Quotes and backslashes, which could forge a field, come escaped; a table cell keeps
	 * its column (no space inside). */
	ck_assert_int_eq(mrctl_run("mempools", NULL), 0);
	output_is_clean();
	ck_assert_msg(strstr(out, "pool \"q\\\"uote\\\\back slash\" of pid"), "%s", out);
	ck_assert_int_eq(mrctl_run("clients", NULL), 0);
	output_is_clean();
	ck_assert_msg(strstr(out, " my\\x20app\\x20\\x20\\\\\\x201\\x200\\x200 "), "%s", out);
	ck_assert_int_eq(mrctl_run("--json", "mempools"), 0);
	output_is_clean();
	ck_assert_msg(strstr(out, "\"name\":\"q\\\"uote\\\\back slash\""), "%s", out);
	ck_assert_int_eq(mrctl_run("--json", "clients"), 0);
	ck_assert_msg(strstr(out, "\"name\":\"my app  \\\\ 1 0 0\""), "%s", out);
	ck_assert_int_eq(mrctl_run("dump", NULL), 0);
	output_is_clean();
	close(fd);
}
END_TEST

/* One Mempools page; returns its reply (NULL: no answer in 10 s), its size to *len. */
static Mrd__Response *mempools_page(int fd, uint32_t first, size_t *len)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolsRequest q = MRD__MEMPOOLS_REQUEST__INIT;

	q.first = first;
	req.body_case = MRD__REQUEST__BODY_MEMPOOLS;
	req.mempools = &q;
	send_request(fd, &req);
	return recv_reply(fd, 10000, len, NULL);
}

START_TEST(test_mempools_beyond_one_reply)
{
	static uint64_t starts[POOL_RANGES], lengths[POOL_RANGES];
	int fd = hello_as("pools"), admin = hello_as("admin");
	uint64_t mem = alloc(fd, 2 * POOL_RANGES * 4096);
	size_t total = 0, len, n_pools = 0, n_mrs = 0;
	uint32_t first = 0;
	char name[32], why[256];
	/* Under valgrind (every page of it a crawl) or a sanitizer (49,152 MRs took 16 minutes
	 * under ASan on a loaded machine) pages enough to need several replies, not more than one
	 * frame could ever hold: the plain build checks that. */
	const char *wrapper = getenv("MRD_TEST_WRAPPER");
	const bool slow = (wrapper && *wrapper) || test_under_sanitizer();
	const int pools = slow ? 8 : POOLS;
	const size_t beyond = slow ? 128 * 1024 : WIRE_FRAME_MAX; /* a page's budget */

	/* Every other page: ranges that never merge, one MR each. */
	for (size_t i = 0; i < POOL_RANGES; i++) {
		starts[i] = mem + 2 * i * 4096;
		lengths[i] = 4096;
	}
	for (int i = 0; i < pools; i++) {
		snprintf(name, sizeof(name), "pool-%02d", i);
		ck_assert_msg(pool_register(fd, name, starts, lengths, POOL_RANGES, why,
					    sizeof(why)) == 0, "%s: %s", name, why);
	}

	/* Page by page, each well inside a socket's default send buffer, all of them together
	 * more than a frame may hold. */
	do {
		Mrd__Response *resp = mempools_page(admin, first, &len);

		ck_assert_msg(resp, "no Mempools reply (from %u) in 10 s", first);
		ck_assert_int_eq(resp->status, 0);
		ck_assert_uint_le(len, 160 * 1024);
		ck_assert_uint_gt(resp->mempools->n_mempools, 0);
		ck_assert_uint_eq(resp->mempools->total, pools);
		for (size_t i = 0; i < resp->mempools->n_mempools; i++)
			n_mrs += resp->mempools->mempools[i]->n_mrs;
		n_pools += resp->mempools->n_mempools;
		total += len;
		first = resp->mempools->next;
		mrd__response__free_unpacked(resp, NULL);
	} while (first);
	printf("Mempools: %zu pools, %zu MRs in %zu bytes of replies\n", n_pools, n_mrs, total);
	ck_assert_uint_eq(n_pools, pools);
	ck_assert_uint_eq(n_mrs, pools * POOL_RANGES);
	ck_assert_uint_gt(total, beyond);

	/* mrctl goes through the pages. */
	ck_assert_int_eq(mrctl_run("mempools", NULL), 0);
	ck_assert_uint_eq(count(out, "\npool \"pool-"), pools - 1);
	ck_assert_uint_eq(count(out, "\n  0x"), pools * POOL_RANGES);
	ck_assert_int_eq(mrctl_run("--json", "mempools"), 0);
	ck_assert_uint_eq(count(out, "\"name\":\"pool-"), pools);
	ck_assert_uint_eq(count(out, "{\"start\":"), pools * POOL_RANGES);
	ck_assert_int_eq(mrctl_run("--json", "dump"), 0);
	ck_assert_uint_eq(count(out, "\"name\":\"pool-"), pools);
	close(fd); /* its pools go with it */
	close(admin);
}
END_TEST

/* How many clients mrd has, as admin's Clients view counts them. */
static size_t clients_counted(int admin)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ClientsRequest q = MRD__CLIENTS_REQUEST__INIT;
	Mrd__Response *resp;
	size_t len, n;

	req.body_case = MRD__REQUEST__BODY_CLIENTS;
	req.clients = &q;
	send_request(admin, &req);
	resp = recv_reply(admin, 10000, &len, NULL);
	ck_assert_msg(resp, "no Clients reply in 10 s");
	ck_assert_int_eq(resp->status, 0);
	ck_assert_uint_le(len, 160 * 1024);
	n = resp->clients->n_clients + resp->clients->clients_omitted;
	if (resp->clients->clients_omitted > 0) /* a page holds many */
		ck_assert_uint_gt(resp->clients->n_clients, 100);
	mrd__response__free_unpacked(resp, NULL);
	return n;
}

START_TEST(test_clients_beyond_one_reply)
{
	static int fds[MANY_CLIENTS];
	char name[65];
	int admin;

	memset(name, 'n', 64);
	name[64] = '\0';
	admin = hello_as("admin");
	/* The earlier cases' clients may still be going: slowly under valgrind, and one with
	 * 49,152 MRs leaves a share of the loop's budget a turn (seconds under ASan beside a CPU
	 * hog). Minutes is far above what any machine takes. */
	for (int i = 0; i < 1800 && clients_counted(admin) > 1; i++)
		usleep(100 * 1000);
	ck_assert_uint_eq(clients_counted(admin), 1);
	for (int i = 0; i < MANY_CLIENTS; i++)
		fds[i] = hello_as(name);
	ck_assert_uint_eq(clients_counted(admin), MANY_CLIENTS + 1);

	ck_assert_int_eq(mrctl_run("clients", NULL), 0);
	ck_assert_msg(strstr(out, " more clients not shown"), "%.300s", out);
	ck_assert_int_eq(mrctl_run("--json", "clients"), 0);
	ck_assert_msg(strstr(out, "\"clients_omitted\":"), "%.300s", out);
	for (int i = 0; i < MANY_CLIENTS; i++)
		close(fds[i]);
	close(admin);
}
END_TEST

/* Whether the earlier cases' clients left nothing behind: no mempool (a departed client's are
 * listed as "(left)") and no allocation in root's domain (pools go first, memory after). */
static bool earlier_pools_gone(void)
{
	return mrctl_run("--json", "mempools") == 0 && count(out, "\"name\":\"pool-") == 0 &&
	       mrctl_run("--json", "clients") == 0 &&
	       json_domain_number(out, "uid-0", "allocations") <= 0;
}

/* In a child that dropped to nobody: every way to write the status page fails. */
static void try_writing_status_page(int fd)
{
	char path[64];
	struct stat st;
	void *p;

	if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
		_exit(10);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (fstat(fd, &st) < 0 || (st.st_mode & 0222))
		_exit(11);
	if (open(path, O_RDWR | O_CLOEXEC) >= 0 || errno != EACCES)
		_exit(12);
	if (open(path, O_WRONLY | O_CLOEXEC) >= 0)
		_exit(13);
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_GROW) == 0)
		_exit(14);
	if (fchmod(fd, 0666) == 0)
		_exit(15);
	if (write(fd, "x", 1) >= 0 || ftruncate(fd, 0) == 0 ||
	    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0)
		_exit(16);
	if (mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) !=
	    MAP_FAILED)
		_exit(17);
	p = mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		_exit(18);
	if (mprotect(p, MRD_STATUS_PAGE_SIZE, PROT_READ | PROT_WRITE) == 0)
		_exit(19);
	_exit(0);
}

START_TEST(test_status_page_read_only)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__JoinDomainRequest j = MRD__JOIN_DOMAIN_REQUEST__INIT;
	int sock = hello_as("status"), fd = -1, rw, status;
	char path[64];
	const struct mrd_status_page *page;
	Mrd__Response *resp;
	uint64_t gen, frees;
	pid_t pid;

	req.body_case = MRD__REQUEST__BODY_JOIN_DOMAIN;
	req.join_domain = &j;
	send_request(sock, &req);
	resp = recv_reply(sock, 10000, NULL, &fd);
	ck_assert_ptr_nonnull(resp);
	ck_assert_int_eq(resp->status, 0);
	mrd__response__free_unpacked(resp, NULL);
	ck_assert_int_ge(fd, 0);
	page = mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(page, MAP_FAILED);
	/* The earlier cases' pools and memory may still be leaving, a share of the loop a turn
	 * (49,152 MRs: minutes under ASan beside a CPU hog), each release moving the generation. */
	for (int i = 0; i < 1800 && !earlier_pools_gone(); i++)
		usleep(100 * 1000);
	ck_assert_msg(earlier_pools_gone(), "the earlier cases' memory is still there: %.300s", out);
	gen = page->generation;
	frees = page->frees;

	/* Not even root, who may reopen it read-write, writes or seals it. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	rw = open(path, O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(rw, 0);
	ck_assert_int_lt(write(rw, "x", 1), 0);
	ck_assert_int_lt(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
	ck_assert_ptr_eq(mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0),
			 MAP_FAILED);
	ck_assert_int_lt(fcntl(rw, F_ADD_SEALS, F_SEAL_GROW), 0); /* F_SEAL_SEAL */
	ck_assert_int_eq(errno, EPERM);
	close(rw);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		try_writing_status_page(fd);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "a client wrote to the status page: step %d", WEXITSTATUS(status));
	ck_assert_uint_eq(page->magic, MRD_STATUS_MAGIC);
	ck_assert_uint_eq(page->generation, gen);

	/* mrd itself still writes it: a free moves the count of frees. */
	{
		Mrd__Request f = MRD__REQUEST__INIT;
		Mrd__FreeRequest fr = MRD__FREE_REQUEST__INIT;

		fr.address = alloc(sock, 4096);
		f.body_case = MRD__REQUEST__BODY_FREE;
		f.free = &fr;
		mrd__response__free_unpacked(call(sock, &f, 0), NULL);
	}
	ck_assert_uint_gt(page->frees, frees);
	munmap((void *)page, MRD_STATUS_PAGE_SIZE);
	close(fd);
	close(sock);
}
END_TEST

static void escapes_to(const char *s, unsigned flags, size_t size, const char *want)
{
	char buf[256];

	ck_assert_uint_le(size, sizeof(buf));
	ck_assert_str_eq(text_escape(s, flags, buf, size), want);
}

START_TEST(test_text_escape)
{
	escapes_to(NULL, 0, 256, "");
	escapes_to("rx-pool_0.1", 0, 256, "rx-pool_0.1");
	escapes_to("a\x1b[2J\n\t\r\\\"b", 0, 256, "a\\x1b[2J\\n\\t\\r\\\\\\\"b");
	escapes_to("\x07\x7f", 0, 256, "\\x07\\x7f");
	escapes_to("a b", 0, 256, "a b");
	escapes_to("a b", ESCAPE_SPACE, 256, "a\\x20b");
	/* UTF-8: shown when valid and harmless; not UTF-8 byte by byte; marks as \u. */
	escapes_to("\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80", 0, 256, "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80");
	escapes_to("\xff\xc0\xaf\xed\xa0\x80\xe2\x80", 0, 256,
		   "\\xff\\xc0\\xaf\\xed\\xa0\\x80\\xe2\\x80");
	escapes_to("\xc2\x9b" "2J", 0, 256, "\\u009b2J"); /* C1 CSI */
	escapes_to("txt\xe2\x80\xae" "exe", 0, 256, "txt\\u202eexe"); /* right-to-left override */
	escapes_to("\xe2\x80\xa8", 0, 256, "\\u2028");
	escapes_to("\xf3\xa0\x81\x81", 0, 256, "\\U000e0041");
	/* What does not fit ends in "...", never in half an escape. */
	escapes_to("abcdefghijklmnop", 0, 10, "abcdef...");
	escapes_to("abcdefghi", 0, 10, "abcdefghi");
	escapes_to("\x01\x01\x01", 0, 10, "\\x01...");
}
END_TEST

START_TEST(test_json_write_string)
{
	char *json = NULL;
	size_t size;
	FILE *f = open_memstream(&json, &size);

	ck_assert_ptr_nonnull(f);
	json_write_string(f, "\x01\"\\\n\xff\xe2\x80\xae\xf3\xa0\x81\x81\xc3\xa9\x7f");
	fputc(' ', f);
	json_write_string(f, NULL);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_str_eq(json, "\"\\u0001\\\"\\\\\\n\\ufffd\\u202e\\udb40\\udc41\xc3\xa9\\u007f\" \"\"");
	free(json);
}
END_TEST

START_TEST(test_label_write_string)
{
	char *label = NULL;
	size_t size;
	FILE *f = open_memstream(&label, &size);

	ck_assert_ptr_nonnull(f);
	/* The text formats' only escapes are \\, \" and \n: \t or \x01 would be refused. */
	label_write_string(f, "\x01\"\\\n\t\xff\xe2\x80\xae\xc3\xa9}");
	fputc(' ', f);
	label_write_string(f, NULL);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_str_eq(label, "\"\xef\xbf\xbd\\\"\\\\\\n\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9}\" \"\"");
	free(label);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("views");
	TCase *tc = tcase_create("real mrd");

	setenv("CK_FORK", "no", 1); /* one mrd for the cases, this process its parent */
	tcase_add_unchecked_fixture(tc, start_mrd, stop_mrd);
	tcase_set_timeout(tc, 900);
	tcase_add_test(tc, test_names_refused_and_escaped);
	tcase_add_test(tc, test_mempools_beyond_one_reply);
	tcase_add_test(tc, test_clients_beyond_one_reply);
	tcase_add_test(tc, test_status_page_read_only);
	suite_add_tcase(s, tc);
	tc = tcase_create("escapes");
	tcase_add_test(tc, test_text_escape);
	tcase_add_test(tc, test_json_write_string);
	tcase_add_test(tc, test_label_write_string);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
