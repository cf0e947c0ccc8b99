/* SPDX-License-Identifier: MIT */
/* Running mrd without systemd, and what an administrator reads: refused requests in mrd's log
 * (once per client and reason, bounded whatever a client sends), --pid-file, --log-file, mrctl
 * reload and shutdown (root only), and mrctl's views (human sizes, pretty JSON, a clients table
 * in 100 columns without mrctl itself, one MR count in clients and dump). Against real mrd
 * processes and the real mrctl. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "check-run.h"
#include "raw-client.h"
#include "test-util.h"

static struct mrd_proc mrd;
static char mrctl[512], mrd_bin[512], log_path[256], pid_path[256];
static char out[1 << 20];

static int start(const char *conf)
{
	const char *args[] = { "--log-file", log_path, "--pid-file", pid_path, NULL };
	char dir[] = "/tmp/mrd-ops.XXXXXX";

	/* The log and pid file live beside mrd's own folder: mrd_proc_start makes that one. */
	ck_assert_ptr_nonnull(mkdtemp(dir));
	chmod(dir, 0755);
	snprintf(log_path, sizeof(log_path), "%s/mrd.log", dir);
	snprintf(pid_path, sizeof(pid_path), "%s/mrd.pid", dir);
	return mrd_proc_start(&mrd, conf, args);
}

/* The folder of the log and the pid file, gone. */
static void cleanup_dir(void)
{
	char dir[256];

	unlink(log_path);
	unlink(pid_path);
	snprintf(dir, sizeof(dir), "%s", log_path);
	*strrchr(dir, '/') = '\0';
	rmdir(dir);
}

/* mrd_proc_stop, and the log's folder gone too. */
static void stop(void)
{
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	cleanup_dir();
}

static int mrctl_as(uid_t uid, const char *a, const char *b, const char *c)
{
	const char *argv[] = { mrctl, "--socket", mrd.socket, a, b, c, NULL };

	return run_capture(argv, out, sizeof(out), uid);
}

/* mrd's log as it is now (lines are written before the reply that follows them). */
static char *read_log(void)
{
	static char buf[1 << 20];
	int fd = open(log_path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	ck_assert_int_ge(n, 0);
	buf[n] = '\0';
	return buf;
}

static unsigned count(const char *hay, const char *needle)
{
	unsigned n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* The line of the log holding needle (first), copied to line. */
static bool log_line(const char *needle, char *line, size_t size)
{
	const char *log = read_log(), *at = strstr(log, needle), *b, *e;

	if (!at)
		return false;
	for (b = at; b > log && b[-1] != '\n'; b--)
		;
	e = strchrnul(at, '\n');
	snprintf(line, size, "%.*s", (int)(e - b), b);
	return true;
}

static int raw_hello(void)
{
	int fd = raw_connect(mrd.socket);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(raw_send_hello(fd, "ops-test"), 0);
	ck_assert_int_eq(raw_reply_within(fd, 10000), 0);
	return fd;
}

static int raw_alloc(int fd, uint64_t size)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest q = MRD__ALLOC_REQUEST__INIT;

	q.size = size;
	req.id = 7;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &q;
	ck_assert_int_eq(raw_send(fd, &req, NULL, 0), 0);
	return raw_reply_within(fd, 10000);
}

static int raw_flush(int fd)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FlushRequest q = MRD__FLUSH_REQUEST__INIT;

	req.id = 8;
	req.body_case = MRD__REQUEST__BODY_FLUSH;
	req.flush = &q;
	if (raw_send(fd, &req, NULL, 0) < 0)
		return -EIO;
	return raw_reply_within(fd, 10000);
}

#define QUOTA_1M "[quota]\nallocated_bytes = 1M\n"

START_TEST(test_refusal_logged_once_per_client_and_reason)
{
	char line[1024], want[64];
	int fd;

	ck_assert_int_eq(start(QUOTA_1M), 0);
	fd = raw_hello();
	ck_assert_int_eq(raw_alloc(fd, 4 << 20), EDQUOT);
	/* One line that answers "why EDQUOT": who, which request, the errno and mrd's why. */
	ck_assert_msg(log_line("refused Alloc", line, sizeof(line)), "no line in:\n%s", read_log());
	snprintf(want, sizeof(want), "(pid %d, uid 0, domain uid-0)", (int)getpid());
	ck_assert_msg(strstr(line, want), "%s", line);
	ck_assert_msg(strstr(line, "EDQUOT") && strstr(line, "quota.allocated_bytes") &&
		      strstr(line, "notice"), "%s", line);
	/* A client refused in a loop: still that one line. */
	for (int i = 0; i < 1000; i++)
		ck_assert_int_eq(raw_alloc(fd, 4 << 20), EDQUOT);
	ck_assert_uint_eq(count(read_log(), "refused Alloc"), 1);
	/* Its leaving says how many there were. */
	close(fd);
	test_wait_until(strstr(read_log(), "1001 of its requests refused, 1 of them logged"), 10000);
	ck_assert_msg(strstr(read_log(), "1001 of its requests refused, 1 of them logged"), "%s",
		      read_log());
	stop();
}
END_TEST

/* A client of uid 1000 refused for more reasons than mrd remembers: each request type it
 * is refused is a reason of its own. Nothing asserts here (a forked child). */
static void refuse_many(const char *socket)
{
	static const Mrd__Request__BodyCase admin[] = {
		MRD__REQUEST__BODY_FLUSH, MRD__REQUEST__BODY_FRMR_POOLS_SET,
		MRD__REQUEST__BODY_SHUTDOWN, MRD__REQUEST__BODY_RELOAD,
	};
	Mrd__FlushRequest flush = MRD__FLUSH_REQUEST__INIT;
	Mrd__FrmrPoolsSetRequest set = MRD__FRMR_POOLS_SET_REQUEST__INIT;
	Mrd__ShutdownRequest stop = MRD__SHUTDOWN_REQUEST__INIT;
	Mrd__ReloadRequest reload = MRD__RELOAD_REQUEST__INIT;
	Mrd__DomainDumpRequest dump = MRD__DOMAIN_DUMP_REQUEST__INIT;
	Mrd__AllocRequest alloc = MRD__ALLOC_REQUEST__INIT;
	int fd = raw_connect(socket);

	if (fd < 0 || raw_send_hello(fd, "many") < 0 || raw_reply_within(fd, 10000) != 0)
		_exit(1);
	for (int round = 0; round < 50; round++) {
		for (size_t i = 0; i < 4; i++) {
			Mrd__Request req = MRD__REQUEST__INIT;

			req.body_case = admin[i];
			req.flush = &flush; /* a oneof: one pointer whatever the case */
			if (admin[i] == MRD__REQUEST__BODY_FRMR_POOLS_SET)
				req.frmr_pools_set = &set;
			else if (admin[i] == MRD__REQUEST__BODY_SHUTDOWN)
				req.shutdown = &stop;
			else if (admin[i] == MRD__REQUEST__BODY_RELOAD)
				req.reload = &reload;
			if (raw_send(fd, &req, NULL, 0) < 0 || raw_reply_within(fd, 10000) != EPERM)
				_exit(2);
		}
		/* DomainDump of domains that are not there, Alloc of sizes refused each its way. */
		for (int k = 0; k < 2; k++) {
			Mrd__Request req = MRD__REQUEST__INIT;

			req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
			req.domain_dump = &dump;
			dump.domain = (char *)(k ? "nope" : "");
			if (raw_send(fd, &req, NULL, 0) < 0 || raw_reply_within(fd, 10000) <= 0)
				_exit(3);
		}
		{
			Mrd__FreeRequest fr = MRD__FREE_REQUEST__INIT;
			Mrd__ExtmemDetachRequest ed = MRD__EXTMEM_DETACH_REQUEST__INIT;
			Mrd__MempoolUnregisterRequest mu = MRD__MEMPOOL_UNREGISTER_REQUEST__INIT;
			Mrd__Request a = MRD__REQUEST__INIT, b = MRD__REQUEST__INIT,
				     c = MRD__REQUEST__INIT;

			fr.address = ed.address = 4096;
			mu.name = (char *)"none";
			a.body_case = MRD__REQUEST__BODY_FREE;
			a.free = &fr;
			b.body_case = MRD__REQUEST__BODY_EXTMEM_DETACH;
			b.extmem_detach = &ed;
			c.body_case = MRD__REQUEST__BODY_MEMPOOL_UNREGISTER;
			c.mempool_unregister = &mu;
			if (raw_send(fd, &a, NULL, 0) < 0 || raw_reply_within(fd, 10000) <= 0 ||
			    raw_send(fd, &b, NULL, 0) < 0 || raw_reply_within(fd, 10000) <= 0 ||
			    raw_send(fd, &c, NULL, 0) < 0 || raw_reply_within(fd, 10000) <= 0)
				_exit(6);
		}
		for (int k = 0; k < 3; k++) {
			Mrd__Request req = MRD__REQUEST__INIT;

			req.body_case = MRD__REQUEST__BODY_ALLOC;
			req.alloc = &alloc;
			alloc.size = k == 0 ? 0 : k == 1 ? 4 << 20 : 4096;
			alloc.align = k == 2 ? 3 : 0;
			if (raw_send(fd, &req, NULL, 0) < 0 || raw_reply_within(fd, 10000) <= 0)
				_exit(4);
		}
	}
	_exit(0);
}

static int as_user(uid_t uid, void (*fn)(const char *), const char *arg)
{
	pid_t pid = fork();
	int status;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (setgid(uid) < 0 || setuid(uid) < 0)
			_exit(5);
		fn(arg);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

START_TEST(test_refusals_of_many_reasons_are_bounded)
{
	const char *log;
	unsigned lines;

	if (geteuid() != 0) {
		fprintf(stderr, "test_refusals_of_many_reasons_are_bounded: needs root: skipped\n");
		return;
	}
	ck_assert_int_eq(start(QUOTA_1M), 0);
	ck_assert_int_eq(as_user(1000, refuse_many, mrd.socket), 0);
	test_wait_until(strstr(read_log(), "of its requests refused"), 10000);
	log = read_log();
	/* Ten reasons and more, 600 refusals: 8 lines, one that says the rest are not logged
	 * ("refused for 8 reasons already"), one at leave ("... requests refused"). */
	lines = count(log, "refused ");
	ck_assert_msg(lines == 8 + 1, "%u lines:\n%s", lines, log);
	ck_assert_msg(strstr(log, "further reasons are not logged"), "%s", log);
	ck_assert_msg(strstr(log, "600 of its requests refused, 8 of them logged"), "%s", log);
	stop();
}
END_TEST

static void refuse_once(const char *socket)
{
	int fd = raw_connect(socket);

	if (fd < 0 || raw_send_hello(fd, "once") < 0 || raw_reply_within(fd, 10000) != 0)
		_exit(1);
	_exit(raw_flush(fd) == EPERM ? 0 : 2);
}

/* 50 (the burst) and more clients, each refused once: the log takes the burst and about one
 * a second after it, and a later line says how many it held back. */
START_TEST(test_refusal_lines_are_rate_limited)
{
	double t0;
	unsigned lines, clients = 120;

	if (geteuid() != 0) {
		fprintf(stderr, "test_refusal_lines_are_rate_limited: needs root: skipped\n");
		return;
	}
	ck_assert_int_eq(start(""), 0);
	t0 = test_now_s();
	for (unsigned i = 0; i < clients; i++)
		ck_assert_int_eq(as_user(1000, refuse_once, mrd.socket), 0);
	lines = count(read_log(), "refused Flush");
	ck_assert_msg(lines >= 50 && lines <= 50 + (unsigned)(test_now_s() - t0) + 1,
		      "%u lines in %.1f s", lines, test_now_s() - t0);
	if (lines < clients) {
		/* Once the bucket has a line again, the next says how many were held back. */
		test_wait_until((as_user(1000, refuse_once, mrd.socket),
				 strstr(read_log(), "held back before this")), 100000);
		ck_assert_msg(strstr(read_log(), "held back before this"), "%s", read_log());
	}
	stop();
}
END_TEST

static long pid_in_file(void)
{
	char buf[32] = "";
	int fd = open(pid_path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? strtol(buf, NULL, 10) : -1;
}

/* A second mrd on another socket with the same pid file: its exit status, its words in out. */
static int second_mrd(void)
{
	char sock[300];
	const char *argv[] = { mrd_bin, "--foreground", "--config", mrd.config, "--socket", sock,
			       "--pid-file", pid_path, NULL };

	snprintf(sock, sizeof(sock), "%s.2", mrd.socket);
	return run_capture(argv, out, sizeof(out), (uid_t)-1);
}

START_TEST(test_pid_file)
{
	char buf[64];
	int fd;

	ck_assert_int_eq(start(""), 0);
	ck_assert_int_eq(pid_in_file(), mrd.pid);
	/* A live mrd holds it: another does not start. */
	ck_assert_int_eq(second_mrd(), 1);
	snprintf(buf, sizeof(buf), "another mrd (pid %d) holds", (int)mrd.pid);
	ck_assert_msg(strstr(out, buf), "%s", out);
	/* A re-exec keeps the pid, and the file (taken again by the new image). */
	kill(mrd.pid, SIGUSR2);
	ck_assert_int_eq(mrd_proc_notified(&mrd, "READY=1", buf, sizeof(buf), TEST_WAIT_S * 1000), 0);
	ck_assert_int_eq(pid_in_file(), mrd.pid);
	ck_assert_int_eq(second_mrd(), 1);
	/* Gone at exit. */
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	ck_assert_int_eq(access(pid_path, F_OK), -1);

	/* A stale one (its mrd was killed: nobody holds its lock) is replaced. */
	fd = open(pid_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "999999\n", 7), 7);
	close(fd);
	{
		const char *args[] = { "--pid-file", pid_path, NULL };

		ck_assert_int_eq(mrd_proc_start(&mrd, "", args), 0);
	}
	ck_assert_int_eq(pid_in_file(), mrd.pid);
	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGKILL), 128 + SIGKILL);
	ck_assert_int_eq(pid_in_file() > 0, 1); /* left behind, stale */
	{
		const char *args[] = { "--pid-file", pid_path, NULL };

		ck_assert_int_eq(mrd_proc_start(&mrd, "", args), 0);
	}
	ck_assert_int_eq(pid_in_file(), mrd.pid);
	/* Root follows no link there, nor opens anything but a file (review of issue 40). */
	{
		char odd[300];
		const char *args[] = { "--pid-file", odd, NULL };
		struct mrd_proc other = { 0 };

		snprintf(odd, sizeof(odd), "%s.odd", pid_path);
		ck_assert_int_eq(symlink("/dev/null", odd), 0);
		ck_assert_int_ne(mrd_proc_start(&other, "", args), 0);
		ck_assert_int_eq(unlink(odd), 0);
		ck_assert_int_eq(mkfifo(odd, 0600), 0);
		ck_assert_int_ne(mrd_proc_start(&other, "", args), 0);
		ck_assert_int_eq(unlink(odd), 0);
	}
	stop();
}
END_TEST

START_TEST(test_mrctl_reload_and_shutdown)
{
	int status, fd;
	FILE *f;

	ck_assert_int_eq(start(QUOTA_1M), 0);
	/* Not for everyone. */
	if (geteuid() == 0) {
		ck_assert_int_eq(mrctl_as(1000, "reload", NULL, NULL), 1);
		ck_assert_msg(strstr(out, "needs root or the admin group"), "%s", out);
		ck_assert_int_eq(mrctl_as(1000, "shutdown", NULL, NULL), 1);
		ck_assert_int_eq(kill(mrd.pid, 0), 0);
	}
	/* A reload takes the new quota. */
	fd = raw_hello();
	ck_assert_int_eq(raw_alloc(fd, 4 << 20), EDQUOT);
	f = fopen(mrd.config, "ae");
	ck_assert_ptr_nonnull(f);
	fputs("[quota]\nallocated_bytes = 16M\n", f);
	fclose(f);
	ck_assert_int_eq(mrctl_as((uid_t)-1, "reload", NULL, NULL), 0);
	ck_assert_msg(strstr(out, "configuration reloaded"), "%s", out);
	ck_assert_int_eq(raw_alloc(fd, 4 << 20), 0);
	/* One with errors is refused, and the running one stays. */
	f = fopen(mrd.config, "ae");
	fputs("[quota]\nallocated_bytes = lots\n", f);
	fclose(f);
	ck_assert_int_eq(mrctl_as((uid_t)-1, "reload", NULL, NULL), 1);
	ck_assert_msg(strstr(out, "the running one stays"), "%s", out);
	ck_assert_int_eq(raw_alloc(fd, 4 << 20), 0);
	close(fd);
	/* shutdown returns once mrd has gone, which exits as at SIGTERM. */
	ck_assert_int_eq(mrctl_as((uid_t)-1, "shutdown", NULL, NULL), 0);
	ck_assert_msg(strstr(out, "stopped"), "%s", out);
	ck_assert_int_eq(waitpid(mrd.pid, &status, 0), mrd.pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	mrd.pid = 0;
	ck_assert_int_eq(access(pid_path, F_OK), -1);
	ck_assert_int_eq(access(mrd.socket, F_OK), -1);
	mrd_proc_stop(&mrd); /* the folder */
	cleanup_dir();
}
END_TEST

/* The number in the column headed name of the table row starting with row. */
static long column(const char *text, const char *header_start, const char *name,
		   const char *row)
{
	const char *h = strstr(text, header_start), *r;
	char hdr[512], line[512], *save = NULL;
	int col = -1, i = 0;

	ck_assert_ptr_nonnull(h);
	h += *h == '\n';
	snprintf(hdr, sizeof(hdr), "%.*s", (int)(strchrnul(h, '\n') - h), h);
	r = strstr(h, row);
	ck_assert_ptr_nonnull(r);
	snprintf(line, sizeof(line), "%.*s", (int)(strchrnul(r, '\n') - r), r);
	for (char *t = strtok_r(hdr, " ", &save); t; t = strtok_r(NULL, " ", &save), i++)
		if (strcmp(t, name) == 0)
			col = i;
	ck_assert_int_ge(col, 0);
	save = NULL;
	i = 0;
	for (char *t = strtok_r(line, " ", &save); t; t = strtok_r(NULL, " ", &save), i++)
		if (i == col)
			return strtol(t, NULL, 10);
	return -1;
}

START_TEST(test_mrctl_views)
{
	mrd_client *client;
	mrd_mempool *pool;
	struct mrd_keys keys;
	static char one[sizeof(out)];
	char *p, *q, dump_mrs[64];
	long mrs;
	void *mem;

	ck_assert_int_eq(start(""), 0);
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &client), 0);
	ck_assert_int_eq(mrd_mem_alloc(client, 3 << 20, 0, 0, &mem), 0);
	ck_assert_int_eq(mrd_keys_query(client, mem, &keys), 0);
	ck_assert_int_eq(mrd_mempool_create(client, "ops", 64, 256, 0, 0, 0, &pool), 0);
	ck_assert_int_eq(mrd_mempool_register(pool, 0), 0);

	ck_assert_int_eq(mrctl_as((uid_t)-1, "clients", NULL, NULL), 0);
	/* mrctl is no client worth a row; every line fits in 100 columns. */
	ck_assert_msg(!strstr(out, "mrctl"), "%s", out);
	for (p = out; *p; p = *q ? q + 1 : q) {
		q = strchrnul(p, '\n');
		ck_assert_msg(q - p <= 100, "%d columns: %.*s", (int)(q - p), (int)(q - p), p);
	}
	/* One MR count: the domain's MRs (its cache's and its mempool's), as dump says. */
	mrs = column(out, "\nDOMAIN ", "MRS", "uid-0 ");
	ck_assert_int_ge(mrs, 2);
	ck_assert_int_eq(mrctl_as((uid_t)-1, "dump", NULL, NULL), 0);
	snprintf(dump_mrs, sizeof(dump_mrs), " entries, %ld MRs\n", mrs);
	ck_assert_msg(strstr(out, dump_mrs), "want '%s' in:\n%s", dump_mrs, out);

	/* -h: sizes a person reads; the 3 MiB allocation among them. */
	ck_assert_int_eq(mrctl_as((uid_t)-1, "-h", "clients", NULL), 0);
	ck_assert_msg(strstr(out, "3.0 MiB") || strstr(out, "3.0MiB"), "%s", out);
	/* -w: every column, GID among them. */
	ck_assert_int_eq(mrctl_as((uid_t)-1, "-w", "clients", NULL), 0);
	ck_assert_msg(strstr(out, " GID ") && strstr(out, "GENERATION"), "%s", out);

	/* --json=pretty: the same JSON, indented. */
	ck_assert_int_eq(mrctl_as((uid_t)-1, "--json", "clients", NULL), 0);
	memcpy(one, out, sizeof(out));
	ck_assert_int_eq(mrctl_as((uid_t)-1, "--json=pretty", "clients", NULL), 0);
	ck_assert_msg(strstr(out, "{\n  \"clients\": ["), "%s", out);
	{
		/* Whitespace outside strings removed: the one-line form (no string here holds a
		 * space or a colon-space). */
		char *w = out;
		bool str = false;

		for (char *r = out; *r; r++) {
			if (*r == '"' && (r == out || r[-1] != '\\'))
				str = !str;
			if (!str && (*r == ' ' || *r == '\n'))
				continue;
			*w++ = *r;
		}
		*w = '\0';
		one[strcspn(one, "\n")] = '\0';
		out[strcspn(out, "\n")] = '\0';
		ck_assert_str_eq(out, one);
	}

	mrd_mempool_free(pool);
	mrd_client_close(client);
	stop();
}
END_TEST

/* --help's pools entry reads as one sentence (it once ended in a line of its own, "handles,
 * hits, misses, aging, pinned minimum", after the quarantine's words); -h alone still helps. */
START_TEST(test_mrctl_help)
{
	const char *help[] = { mrctl, "--help", NULL }, *h[] = { mrctl, "-h", NULL };

	ck_assert_int_eq(run_capture(help, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_msg(!strstr(out, "\n                      handles, hits"), "%s", out);
	ck_assert_msg(strstr(out, "  reload ") && strstr(out, "  shutdown ") &&
		      strstr(out, "--human") && strstr(out, "--json[=pretty]"), "%s", out);
	ck_assert_int_eq(run_capture(h, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_msg(strstr(out, "Usage: mrctl"), "%s", out);
}
END_TEST

/* No client, no domain: no table header over nothing. */
START_TEST(test_mrctl_clients_empty)
{
	ck_assert_int_eq(start(""), 0);
	ck_assert_int_eq(mrctl_as((uid_t)-1, "clients", NULL, NULL), 0);
	ck_assert_msg(!strstr(out, "DOMAIN") && !strstr(out, "PID"), "%s", out);
	ck_assert_msg(strstr(out, "no client is connected"), "%s", out);
	stop();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("operations");
	TCase *tc = tcase_create("operations");

	test_build_path("mrctl", mrctl, sizeof(mrctl));
	test_build_path("mrd", mrd_bin, sizeof(mrd_bin));
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_refusal_logged_once_per_client_and_reason);
	tcase_add_test(tc, test_refusals_of_many_reasons_are_bounded);
	tcase_add_test(tc, test_refusal_lines_are_rate_limited);
	tcase_add_test(tc, test_pid_file);
	tcase_add_test(tc, test_mrctl_reload_and_shutdown);
	tcase_add_test(tc, test_mrctl_views);
	tcase_add_test(tc, test_mrctl_clients_empty);
	tcase_add_test(tc, test_mrctl_help);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
