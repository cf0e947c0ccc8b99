/* SPDX-License-Identifier: MIT */
/* Warm restart against real mrd processes: SIGUSR2 (re-exec with the memory handed over) and
 * systemctl restart with an FD store (emulated as systemd does it). Clients keep their memory
 * at the same addresses with its content, take it back with mrd_client_reconnect(), refetch
 * keys because the generation moved, and must register mempools again; what waits for a
 * process that is gone goes at the next check ([memory] reconnect_grace), what waits for a live
 * one stays; a cold restart says so (-ESTALE). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define MiB (1ul << 20)
#define CONFIG "[memory]\nhugepages = no\narena_size = 64M\nreconnect_grace = 2\n"

static struct mrd_proc mrd;
static char out[65536];

static void start(bool fd_store)
{
	int r;

	if (fd_store)
		setenv("FDSTORE", "64", 1);
	else
		unsetenv("FDSTORE");
	r = mrd_proc_start(&mrd, CONFIG, NULL);
	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
}

static void teardown(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	unsetenv("FDSTORE");
}

static mrd_client *connect_ok(void)
{
	mrd_client *c = NULL;
	int r = mrd_client_connect(mrd.socket, &c);

	ck_assert_msg(r == 0, "connect: %s (%s)", strerror(-r), mrd_last_error());
	return c;
}

static void fill(uint8_t *p, size_t len, uint8_t seed)
{
	for (size_t i = 0; i < len; i += 512)
		p[i] = (uint8_t)(seed + i / 512);
}

static void check_fill(const uint8_t *p, size_t len, uint8_t seed)
{
	for (size_t i = 0; i < len; i += 512)
		ck_assert_msg(p[i] == (uint8_t)(seed + i / 512), "content at %p lost", (void *)(p + i));
}

/* SIGUSR2, and the re-executed mrd's READY=1. */
static void reexec(void)
{
	char buf[512];
	pid_t pid = mrd.pid;

	ck_assert_int_eq(kill(mrd.pid, SIGUSR2), 0);
	ck_assert_int_eq(mrd_proc_notified(&mrd, "READY=1", buf, sizeof(buf), 60000), 0);
	ck_assert_int_eq(waitpid(pid, NULL, WNOHANG), 0); /* the same process, still running */
}

/* What mrctl says of the caller's domain: "waiting" allocations, or allocated bytes. */
static unsigned long long domain_field(const char *field)
{
	char mrctl[512], key[64];
	const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket",
			       mrd.socket, "--json", "clients", NULL };
	const char *d;

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	d = strstr(out, "\"domains\":[{");
	ck_assert_msg(d, "no domain in %s", out);
	snprintf(key, sizeof(key), "\"%s\":", field);
	d = strstr(d, key);
	ck_assert_msg(d, "no %s in %s", field, out);
	return strtoull(d + strlen(key), NULL, 10);
}

/* A memfd of len bytes, sealed against shrinking, attached through c. */
static uint8_t *attach(mrd_client *c, size_t len)
{
	int fd = memfd_create("ext", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(mrd_extmem_attach(c, fd, 0, len, &p), 0);
	close(fd);
	return p;
}

/* A child process that runs work (true: it holds what it made), tells the parent, and
 * sleeps until it is killed. */
static pid_t child_holding(bool (*work)(void))
{
	int pipefd[2];
	char ok = 0;
	pid_t pid;

	ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		ok = work();
		(void)!write(pipefd[1], &ok, 1);
		for (;;)
			pause();
	}
	close(pipefd[1]);
	ck_assert_int_eq(read(pipefd[0], &ok, 1), 1);
	ck_assert(ok);
	close(pipefd[0]);
	return pid;
}

/* 1 MiB of mrd memory. */
static bool hold_memory(void)
{
	mrd_client *c = NULL;
	void *p;

	return mrd_client_connect(mrd.socket, &c) == 0 && mrd_mem_alloc(c, 1 * MiB, 0, 0, &p) == 0;
}

static pid_t child_holding_memory(void)
{
	return child_holding(hold_memory);
}

/* Waits (a few checks of reconnect_grace, TEST_WAIT_S at most) for the count of waiting
 * allocations. */
static void wait_for_waiting(unsigned long long want)
{
	test_wait_until(domain_field("waiting") == want, 100 * 1000);
	ck_assert_uint_eq(domain_field("waiting"), want);
}

START_TEST(test_reexec_hands_memory_over)
{
	mrd_client *c, *other;
	mrd_cache *l, *quiet;
	struct mrd_keys mr, mr2;
	uint64_t generation;
	uint8_t *p, *e, *q;
	pid_t child;
	void *n;

	start(false);
	c = connect_ok();
	other = connect_ok();
	child = child_holding_memory();
	ck_assert_int_eq(mrd_mem_alloc(c, 3 * MiB, 0, 0, (void **)&p), 0);
	e = attach(c, 64 * 1024);
	ck_assert_int_eq(mrd_mem_alloc(other, 1 * MiB, 0, 0, (void **)&q), 0);
	fill(p, 3 * MiB, 1);
	fill(e, 64 * 1024, 2);
	fill(q, 1 * MiB, 3);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &mr), 0);
	/* One that makes no lookup while mrd is gone: it never sees the poisoned page, only the
	 * new mrd's, a few generations on (the ring of the new page cannot tell what went). */
	ck_assert_int_eq(mrd_cache_new(c, &quiet), 0);
	ck_assert_int_eq(mrd_cache_keys(quiet, p, &mr2), 0);
	generation = mrd_client_generation(c);

	reexec();
	/* The old mrd moved the generation on its way out: no cached key is trusted, and the
	 * lookup that would refetch fails clearly instead of handing out a dead key. */
	ck_assert_uint_gt(mrd_client_generation(c), generation);
	ck_assert_int_eq(mrd_cache_keys(l, p, &mr2), -ECONNRESET);
	ck_assert_msg(strstr(mrd_last_error(), "mrd_client_reconnect"), "%s", mrd_last_error());
	check_fill(p, 3 * MiB, 1);
	ck_assert_uint_eq(domain_field("waiting"), 4);

	ck_assert_int_eq(mrd_client_reconnect(c), 2);
	ck_assert_int_eq(mrd_client_reconnect(c), -EISCONN);
	ck_assert_uint_eq(domain_field("waiting"), 2);
	check_fill(p, 3 * MiB, 1);
	check_fill(e, 64 * 1024, 2);
	ck_assert_int_eq(mrd_cache_keys(quiet, p, &mr2), 0);
	ck_assert_uint_eq(mrd_cache_asked(quiet), 2); /* emptied: the old mrd's keys died */
	mrd_cache_free(quiet);
	ck_assert_int_eq(mrd_cache_keys(l, p + 4096, &mr2), 0);
	ck_assert_uint_le(mr2.start, (uintptr_t)p + 4096);
	ck_assert_uint_gt(mr2.end, (uintptr_t)p + 4096);
	/* Its own again: this handle frees it, and new memory never lands on it. */
	ck_assert_int_eq(mrd_mem_alloc(c, 2 * MiB, 0, 0, &n), 0);
	fill(n, 2 * MiB, 4);
	check_fill(p, 3 * MiB, 1);
	check_fill(q, 1 * MiB, 3);
	ck_assert_int_eq(mrd_extmem_detach(c, e), 0);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);

	/* The child dies without coming back: its allocation goes at the next check. The other
	 * handle's process lives: its allocation waits past any number of checks. */
	ck_assert_int_eq(kill(child, SIGKILL), 0);
	ck_assert_int_eq(waitpid(child, NULL, 0), child);
	wait_for_waiting(1);
	ck_assert_uint_eq(domain_field("allocated_bytes"), 2 * MiB + 1 * MiB);
	usleep(2500 * 1000);
	ck_assert_uint_eq(domain_field("waiting"), 1);
	ck_assert_int_eq(mrd_client_reconnect(other), 1);
	check_fill(q, 1 * MiB, 3);
	ck_assert_uint_eq(domain_field("waiting"), 0);
	mrd_cache_free(l);
	mrd_client_close(other);
	mrd_client_close(c);
}
END_TEST

/* Memory goes back to the process that had it: the same handle in a forked child gets nothing
 * (libmrd refuses it there, as any call on a parent's handle) and it waits for the parent. */
START_TEST(test_other_process_gets_nothing)
{
	mrd_client *c;
	uint8_t *p;
	pid_t pid;
	int status;

	start(false);
	c = connect_ok();
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, (void **)&p), 0);
	fill(p, 1 * MiB, 8);
	reexec();
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int r = mrd_client_reconnect(c);

		_exit(r == -ECHILD && strstr(mrd_last_error(), "fork") ? 0 : 1);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's reconnect");
	ck_assert_uint_eq(domain_field("waiting"), 1);
	ck_assert_int_eq(mrd_client_reconnect(c), 1);
	check_fill(p, 1 * MiB, 8);
	mrd_client_close(c);
}
END_TEST

/* A Free that got no answer because mrd went: the reconnect asks again, and counts right. */
START_TEST(test_free_without_answer)
{
	mrd_client *c;
	uint8_t *p, *q;

	start(false);
	c = connect_ok();
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, (void **)&q), 0);
	fill(q, 1 * MiB, 9);
	reexec();
	ck_assert_int_eq(mrd_mem_free(c, p), -ECONNRESET);
	ck_assert_int_eq(mrd_client_reconnect(c), 1);
	ck_assert_uint_eq(domain_field("allocated_bytes"), 1 * MiB);
	check_fill(q, 1 * MiB, 9);
	ck_assert_int_eq(mrd_mem_free(c, q), 0);
	mrd_client_close(c);
}
END_TEST

/* mrctl's JSON of a view (status or clients) into out. */
static void mrctl_json(const char *view)
{
	char mrctl[512];
	const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket",
			       mrd.socket, "--json", view, NULL };

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
}

/* A child that imports the domain's context (mrd_client_get_pd) after registering 1 MiB, and
 * holds the descriptor until it is killed. $MRD_SOFT_EXPORT=1 makes soft export one. */
static bool import_context(void)
{
	mrd_client *c = NULL;
	mrd_cache *l;
	struct mrd_keys k;
	uint32_t handle;
	int fd = -1;
	void *p;

	return mrd_client_connect(mrd.socket, &c) == 0 && mrd_cache_new(c, &l) == 0 &&
	       mrd_mem_alloc(c, 1 * MiB, 0, 0, &p) == 0 && mrd_cache_keys(l, p, &k) == 0 &&
	       mrd_client_get_pd(c, &fd, &handle) == 0;
}

static pid_t child_importing_context(void)
{
	return child_holding(import_context);
}

/* A client that imported the domain's context keeps the old mrd's context after a restart:
 * the new mrd shows it, with what was pinned in it and who holds it, until that process is
 * gone. */
START_TEST(test_imported_context_shown_after_reexec)
{
	char want[128];
	pid_t child;

	ck_assert_int_eq(setenv("MRD_SOFT_EXPORT", "1", 1), 0);
	start(false);
	unsetenv("MRD_SOFT_EXPORT");
	child = child_importing_context();
	mrctl_json("status");
	ck_assert_msg(strstr(out, "\"old_contexts\":[]"), "%s", out);

	reexec();
	mrctl_json("status");
	ck_assert_msg(strstr(out, "\"old_contexts\":[{\"domain\":"), "%s", out);
	ck_assert_msg(strstr(out, "\"device\":\"soft\",\"pinned_bytes\":1048576,\"mrs\":1,"),
		      "%s", out);
	snprintf(want, sizeof(want), "\"holder_pids\":[%d]}]", (int)child);
	ck_assert_msg(strstr(out, want), "%s", out);
	mrctl_json("clients");
	ck_assert_msg(strstr(out, want), "%s", out);
	{
		char mrctl[512];
		const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket",
				       mrd.socket, "status", NULL };

		ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
		snprintf(want, sizeof(want), "on soft, held by pid %d: 1 MRs and 1048576 pinned bytes",
			 (int)child);
		ck_assert_msg(strstr(out, want), "%s", out);
		snprintf(want, sizeof(want), "\"holder_pids\":[%d]}]", (int)child);
	}

	/* Another restart carries it on while its holder lives. */
	reexec();
	mrctl_json("clients");
	ck_assert_msg(strstr(out, want), "%s", out);

	/* Its holder gone, it goes (checked at each view). */
	ck_assert_int_eq(kill(child, SIGKILL), 0);
	ck_assert_int_eq(waitpid(child, NULL, 0), child);
	mrctl_json("status");
	ck_assert_msg(strstr(out, "\"old_contexts\":[]"), "%s", out);
}
END_TEST

/* After a restart, a handle that had imported the PD gets no key for the new mrd's PD until it
 * imports again: -ESTALE, saying so. */
START_TEST(test_importer_told_to_import_again)
{
	mrd_client *c;
	mrd_cache *l;
	struct mrd_keys k;
	uint32_t handle;
	int fd = -1, fd2 = -1;
	void *p;

	ck_assert_int_eq(setenv("MRD_SOFT_EXPORT", "1", 1), 0);
	start(false);
	unsetenv("MRD_SOFT_EXPORT");
	c = connect_ok();
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, &p), 0);
	ck_assert_int_eq(mrd_client_get_pd(c, &fd, &handle), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &k), 0);

	reexec();
	ck_assert_int_eq(mrd_client_reconnect(c), 1);
	ck_assert_int_eq(mrd_cache_keys(l, p, &k), -ESTALE);
	ck_assert_msg(strstr(mrd_last_error(), "mrd_client_get_pd"), "%s", mrd_last_error());
	ck_assert_int_eq(mrd_keys_query(c, p, &k), -ESTALE);
	ck_assert_int_eq(mrd_client_get_pd(c, &fd2, &handle), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &k), 0);
	close(fd);
	close(fd2);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

/* SIGUSR2 and SIGTERM at once: mrd ends cleanly, whichever comes first (a SIGTERM while the
 * new image starts waits for its loop instead of killing it). */
START_TEST(test_term_during_reexec)
{
	start(false);
	ck_assert_int_eq(kill(mrd.pid, SIGUSR2), 0);
	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGTERM), 0);
}
END_TEST

START_TEST(test_mempool_registered_again)
{
	mrd_client *c;
	mrd_mempool *pool;
	mrd_cache *l;
	struct mrd_keys mr;
	void *obj;

	start(false);
	c = connect_ok();
	ck_assert_int_eq(mrd_mempool_create(c, "restart", 64, 256, 0, 0, 0, &pool), 0);
	ck_assert_int_eq(mrd_mempool_register(pool, 0), 0);
	obj = mrd_mempool_get(pool);
	ck_assert_ptr_nonnull(obj);
	memset(obj, 7, 256);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, pool, obj, &mr), 0);

	reexec();
	ck_assert_int_eq(mrd_client_reconnect(c), 1);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, pool, obj, &mr), -ESTALE);
	ck_assert_msg(strstr(mrd_last_error(), "register it again") ||
		      strstr(mrd_last_error(), "mrd_mempool_register"), "%s", mrd_last_error());
	ck_assert_int_eq(mrd_cache_add_mempool(l, pool), -ESTALE);
	ck_assert_int_eq(mrd_mempool_register(pool, 0), 0);
	ck_assert_int_eq(mrd_cache_mempool_keys(l, pool, obj, &mr), 0);
	ck_assert_uint_eq(((uint8_t *)obj)[255], 7);
	mrd_mempool_put(pool, obj);
	mrd_cache_free(l);
	mrd_mempool_free(pool);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_fd_store_restart)
{
	struct mrd_fd_store store;
	mrd_client *c;
	mrd_cache *l;
	struct mrd_keys mr;
	uint8_t *p;
	bool state = false;

	start(true);
	c = connect_ok();
	ck_assert_int_eq(mrd_mem_alloc(c, 5 * MiB, 0, 0, (void **)&p), 0);
	fill(p, 5 * MiB, 5);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &mr), 0);

	ck_assert_int_eq(mrd_proc_restart_fd_store(&mrd, &store), 0);
	ck_assert_uint_eq(store.n, 2); /* the state and one arena */
	ck_assert_uint_eq(store.removed, 2); /* taken out of the store again */
	for (size_t i = 0; i < store.n; i++)
		state |= strcmp(store.names[i], "mrd-state") == 0;
	ck_assert(state);
	ck_assert_int_eq(mrd_client_ping(c), -ECONNRESET);
	ck_assert_int_eq(mrd_client_reconnect(c), 1);
	check_fill(p, 5 * MiB, 5);
	ck_assert_int_eq(mrd_cache_keys(l, p, &mr), 0);
	/* The lookup watches the new status page: a free there moves what it sees. */
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	ck_assert_int_lt(mrd_cache_keys(l, p, &mr), 0);
	ck_assert_uint_eq(domain_field("allocated_bytes"), 0);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

/* Without a hand-over (no FD store, or mrd killed) the next mrd does not know the memory:
 * a reconnect says so, and the memory stays the process's until it closes the handle. */
START_TEST(test_cold_restart_is_stale)
{
	struct mrd_fd_store store;
	mrd_client *c, *again, *empty;
	uint8_t *p;

	start(false);
	c = connect_ok();
	empty = connect_ok();
	ck_assert_int_eq(mrd_mem_alloc(c, 1 * MiB, 0, 0, (void **)&p), 0);
	fill(p, 1 * MiB, 6);
	ck_assert_int_eq(mrd_proc_restart_fd_store(&mrd, &store), 0);
	ck_assert_uint_eq(store.n, 0);
	ck_assert_int_eq(mrd_client_reconnect(c), -ESTALE);
	ck_assert_msg(strstr(mrd_last_error(), "close every handle"), "%s", mrd_last_error());
	/* Even a handle that holds nothing: the window is the old mrd's. */
	ck_assert_int_eq(mrd_client_reconnect(empty), -ESTALE);
	mrd_client_close(empty);
	check_fill(p, 1 * MiB, 6);
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &again), -EADDRINUSE);
	mrd_client_close(c);
	again = connect_ok();
	mrd_client_close(again);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("restart");
	TCase *tc = tcase_create("restart");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_add_test(tc, test_reexec_hands_memory_over);
	tcase_add_test(tc, test_other_process_gets_nothing);
	tcase_add_test(tc, test_free_without_answer);
	tcase_add_test(tc, test_imported_context_shown_after_reexec);
	tcase_add_test(tc, test_importer_told_to_import_again);
	tcase_add_test(tc, test_term_during_reexec);
	tcase_add_test(tc, test_mempool_registered_again);
	tcase_add_test(tc, test_fd_store_restart);
	tcase_add_test(tc, test_cold_restart_is_stale);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
