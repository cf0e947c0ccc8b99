/* SPDX-License-Identifier: MIT */
/* libmrd's memory API against a real mrd: the same bytes at the same address in two
 * processes, the generation seen without a request, the window collision, quotas, attached
 * memfds, and what a client's death gives back. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define MiB (1ul << 20)

static struct mrd_proc mrd;
static char out[65536];

static void setup(void)
{
	int r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\narena_size = 64M\n"
				     "[quota]\nallocated_bytes = 512M\n", NULL);

	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
}

static void teardown(void)
{
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}

static mrd_client *connect_ok(void)
{
	mrd_client *c = NULL;
	int r = mrd_client_connect(mrd.socket, &c);

	ck_assert_msg(r == 0, "connect: %s (%s)", strerror(-r), mrd_last_error());
	return c;
}

/* mrctl clients --json, for what mrd itself counts. */
static const char *mrctl_clients(void)
{
	char mrctl[512];
	const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket",
			       mrd.socket, "--json", "clients", NULL };

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	return out;
}

START_TEST(test_alloc_write_free)
{
	mrd_client *c = connect_ok();
	char expect[32];
	uint8_t *p = NULL;

	snprintf(expect, sizeof(expect), "uid-%u", (unsigned)getuid());
	ck_assert_str_eq(mrd_client_domain(c), expect);
	ck_assert_uint_ge(mrd_client_generation(c), 1);
	ck_assert_int_eq(mrd_mem_alloc(c, 3 * MiB + 5, 0, 0, (void **)&p), 0);
	ck_assert_uint_eq((uintptr_t)p % 4096, 0);
	memset(p, 0xab, 3 * MiB + 5); /* mapped, writable, all of it */
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	ck_assert_int_eq(mrd_mem_free(c, p), -ENOENT);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "not the start of an allocation"));
	ck_assert_int_eq(mrd_mem_free(c, NULL), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0x80, (void **)&p), -EINVAL);
	ck_assert_int_eq(mrd_mem_alloc(NULL, 4096, 0, 0, (void **)&p), -EINVAL);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, NULL), -EINVAL);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 1 * MiB, 0, (void **)&p), 0);
	ck_assert_uint_eq((uintptr_t)p % MiB, 0);
	mrd_client_close(c);
}
END_TEST

/* Two processes of one uid: one writes, the other reads the same address. */
/* mrd_mem_alloc_keys: the memory and its keys, as mrd_keys_query gives them, small (with the
 * Alloc) or big (asked for after it). */
START_TEST(test_alloc_keys)
{
	struct mrd_keys k, q;
	mrd_client *c;
	void *p;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_mem_alloc_keys(c, 64 * 1024, 0, 0, &p, &k), 0);
	ck_assert_int_eq(mrd_keys_query(c, p, &q), 0);
	ck_assert_uint_eq(k.start, (uintptr_t)p);
	ck_assert_uint_eq(k.rkey, q.rkey);
	ck_assert_uint_eq(k.end, q.end);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	ck_assert_int_eq(mrd_mem_alloc_keys(c, 4u << 20, 0, 0, &p, &k), 0);
	ck_assert_int_eq(mrd_keys_query(c, p, &q), 0);
	ck_assert_uint_eq(k.rkey, q.rkey);
	ck_assert_uint_eq(k.end - k.start, 4u << 20);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	ck_assert_int_eq(mrd_mem_alloc_keys(c, 4096, 0, 0, &p, NULL), -EINVAL);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_two_processes_share)
{
	int to_parent[2], to_child[2];
	uint64_t addr = 0, gen;
	mrd_client *c;
	pid_t pid;
	char go;
	int status;

	ck_assert_int_eq(pipe(to_parent), 0);
	ck_assert_int_eq(pipe(to_child), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct mrd_keys keys;
		uint8_t *p;

		c = NULL;
		if (mrd_client_connect(mrd.socket, &c) < 0 ||
		    mrd_mem_alloc(c, 2 * MiB, 0, 0, (void **)&p) < 0 ||
		    mrd_keys_query(c, p, &keys) < 0) /* registered: its free moves the generation */
			_exit(1);
		for (size_t i = 0; i < 2 * MiB; i++)
			p[i] = (uint8_t)(i * 31 + 7);
		addr = (uintptr_t)p;
		if (write(to_parent[1], &addr, sizeof(addr)) != sizeof(addr) ||
		    read(to_child[0], &go, 1) != 1)
			_exit(2);
		_exit(mrd_mem_free(c, p) == 0 ? 0 : 3);
	}

	c = connect_ok();
	ck_assert_int_eq(read(to_parent[0], &addr, sizeof(addr)), sizeof(addr));
	ck_assert_int_eq(mrd_mem_map(c, (void *)(uintptr_t)(addr + 4096)), 0);
	for (size_t i = 0; i < 2 * MiB; i++)
		ck_assert_int_eq(((uint8_t *)(uintptr_t)addr)[i], (uint8_t)(i * 31 + 7));

	/* The child frees; we see the generation move without asking mrd anything. */
	gen = mrd_client_generation(c);
	ck_assert_int_eq(write(to_child[1], "x", 1), 1);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	ck_assert_uint_gt(mrd_client_generation(c), gen);
	ck_assert_int_eq(((uint8_t *)(uintptr_t)addr)[1], 0); /* its pages went to the kernel */
	mrd_client_close(c);
}
END_TEST

START_TEST(test_death_gives_back)
{
	mrd_client *c = connect_ok();
	uint64_t gen = mrd_client_generation(c);
	pid_t pid = fork();
	int status;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct mrd_keys keys;
		mrd_client *d = NULL;
		void *p;

		if (mrd_client_connect(mrd.socket, &d) < 0 ||
		    mrd_mem_alloc(d, 64 * MiB, 0, 0, &p) < 0 ||
		    mrd_mem_alloc(d, 4096, 0, 0, &p) < 0 ||
		    mrd_keys_query(d, p, &keys) < 0) /* registered: its free moves the generation */
			_exit(1);
		memset(p, 1, 4096);
		kill(getpid(), SIGKILL); /* no free, no close */
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFSIGNALED(status));
	/* mrd noticed and gave everything back. */
	test_wait_until(mrd_client_generation(c) != gen, 10000);
	ck_assert_uint_gt(mrd_client_generation(c), gen);
	mrctl_clients();
	ck_assert_msg(strstr(out, "\"allocated_bytes\":0,\"allocations\":0,\"arenas\""), "%s",
		      out);
	mrd_client_close(c);
}
END_TEST

/* mrd killed under a client: the next request fails clearly, and the memory stays. */
START_TEST(test_mrd_killed)
{
	mrd_client *c = connect_ok();
	mrd_cache *l;
	struct mrd_keys mr;
	uint8_t *p;
	void *q;

	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, (void **)&p), 0);
	for (size_t i = 0; i < 1 << 20; i++)
		p[i] = (uint8_t)(i * 13);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &mr), 0);

	ck_assert_int_eq(mrd_proc_signal(&mrd, SIGKILL), 128 + SIGKILL);
	ck_assert_int_eq(mrd_client_ping(c), -ECONNRESET);
	ck_assert_msg(strstr(mrd_last_error(), "mrd closed the connection"), "%s", mrd_last_error());
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &q), -ECONNRESET);
	ck_assert_int_eq(mrd_mem_free(c, p), -ECONNRESET);
	for (size_t i = 0; i < 1 << 20; i++)
		ck_assert_uint_eq(p[i], (uint8_t)(i * 13));
	p[0] = 1; /* still writable */
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_quota_message)
{
	mrd_client *c = connect_ok();
	void *p = NULL;

	ck_assert_int_eq(mrd_mem_alloc(c, 600 * MiB, 0, 0, &p), -EDQUOT);
	ck_assert_ptr_null(p);
	ck_assert_msg(strstr(mrd_last_error(), "quota.allocated_bytes (536870912) would be exceeded in "
		      "domain "), "%s", mrd_last_error());
	ck_assert_msg(strstr(mrd_last_error(), ": 0 in use, tried to allocate 629145600 "
		      "more; raise [quota] allocated_bytes in mrd.conf and reload mrd"), "%s", mrd_last_error());
	ck_assert_int_eq(mrd_mem_alloc(c, 200 * MiB, 0, 0, &p), 0); /* under it: fine */
	mrd_client_close(c);
}
END_TEST

START_TEST(test_window_collision)
{
	/* Something of ours sits where mrd's window goes. */
	void *squat = mmap((void *)0x200000000000ul, 4096, PROT_READ,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	mrd_client *c = NULL;

	ck_assert_ptr_eq(squat, (void *)0x200000000000ul);
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), -EADDRINUSE);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(mrd_last_error(), "[memory] window_base"), "%s", mrd_last_error());
	munmap(squat, 4096);
	c = connect_ok();
	mrd_client_close(c);
}
END_TEST

/* MRD_WINDOW=lazy: connecting reserves nothing; an arena whose range the process took fails
 * its allocation with -EADDRINUSE naming the setting, and nothing of the process is replaced. */
START_TEST(test_window_lazy_collision)
{
	void *squat = mmap((void *)0x200000000000ul, 4096, PROT_READ,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	mrd_client *c = NULL;
	void *p;

	ck_assert_ptr_eq(squat, (void *)0x200000000000ul);
	setenv("MRD_WINDOW", "lazy", 1);
	c = connect_ok();
	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, &p), -EADDRINUSE);
	ck_assert_msg(strstr(mrd_last_error(), "[memory] window_base"), "%s", mrd_last_error());
	ck_assert_msg(strstr(mrd_last_error(), "MRD_WINDOW"), "%s", mrd_last_error());
	ck_assert_int_eq(mprotect(squat, 4096, PROT_READ), 0); /* still ours, not replaced */
	munmap(squat, 4096);
	ck_assert_int_eq(mrd_mem_alloc(c, 1 << 20, 0, 0, &p), 0);
	memset(p, 1, 1 << 20);
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	mrd_client_close(c);
	/* Closed: the arena's range is no longer mapped (nothing reserved stays behind). */
	squat = mmap((void *)0x200000000000ul, 4096, PROT_READ,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	ck_assert_ptr_eq(squat, (void *)0x200000000000ul);
	munmap(squat, 4096);
	unsetenv("MRD_WINDOW");
}
END_TEST

START_TEST(test_window_taken_in_mrd)
{
	/* Without address randomisation (inherited by mrd) its executable is at 0x555555554000
	 * for sure; with it, mrd's mappings could miss any window and the test would wait for an
	 * mrd that serves. A socket that cannot be bound makes mrd exit either way. */
	char mrd_bin[512], conf[160];
	const char *argv[] = { test_build_path("mrd", mrd_bin, sizeof(mrd_bin)), "--foreground",
			       "--config", conf, "--socket", "/proc/mrd-test.sock", NULL };
	FILE *f;

	ck_assert_int_ge(personality(ADDR_NO_RANDOMIZE), 0);
	snprintf(conf, sizeof(conf), "%s/taken.conf", mrd.dir);
	f = fopen(conf, "we");
	ck_assert_ptr_nonnull(f);
	fputs("[memory]\nwindow_base = 0x555540000000\nwindow_size = 4G\narena_size = 1G\n", f);
	fclose(f);
	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 1);
	ck_assert_msg(strstr(out, "is taken in mrd; move it with [memory] window_base"), "%s", out);
}
END_TEST

START_TEST(test_two_handles_one_window)
{
	mrd_client *a = connect_ok(), *b = connect_ok();
	uint8_t *p, *q;

	ck_assert_int_eq(mrd_mem_alloc(a, 8192, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_mem_alloc(b, 8192, 0, 0, (void **)&q), 0);
	p[0] = 1;
	q[0] = 2;
	ck_assert_int_eq(mrd_mem_map(b, p), 0);
	mrd_client_close(a);
	/* b's memory is still mapped: the arena is shared and refcounted. */
	ck_assert_int_eq(q[0], 2);
	ck_assert_int_eq(mrd_mem_free(b, q), 0);
	mrd_client_close(b);
}
END_TEST

/* Arena ids are window slots and come back; a handle closing must never unmap a newer arena
 * that reuses its old slots. */
START_TEST(test_reused_slots_survive_close)
{
	mrd_client *a = connect_ok(), *b = connect_ok();
	uint8_t *small, *big1, *big2, *q;

	ck_assert_int_eq(mrd_mem_alloc(a, 4096, 0, 0, (void **)&small), 0);
	ck_assert_int_eq(mrd_mem_alloc(a, 128 * MiB, 0, 0, (void **)&big1), 0); /* 2 slots */
	ck_assert_int_eq(mrd_mem_alloc(a, 128 * MiB, 0, 0, (void **)&big2), 0); /* 2 more */
	ck_assert_int_eq(mrd_mem_free(a, big1), 0);
	ck_assert_int_eq(mrd_mem_free(a, big2), 0);
	/* B's arena takes the four freed slots at once. */
	ck_assert_int_eq(mrd_mem_alloc(b, 256 * MiB, 0, 0, (void **)&q), 0);
	ck_assert_ptr_eq(q, big1);
	mrd_client_close(a);
	q[255 * MiB] = 7; /* still B's, still mapped */
	ck_assert_int_eq(q[255 * MiB], 7);
	mrd_client_close(b);
}
END_TEST

START_TEST(test_extmem_attach)
{
	mrd_client *c = connect_ok();
	int fd = memfd_create("app-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint8_t *mine, *there = NULL;

	ck_assert_int_eq(ftruncate(fd, 4 * 4096), 0);
	mine = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	strcpy((char *)mine + 4096, "hello window");
	ck_assert_int_eq(mrd_extmem_attach(c, fd, 4096, 2 * 4096, (void **)&there), -EPERM);
	ck_assert_ptr_nonnull(strstr(mrd_last_error(), "F_SEAL_SHRINK"));
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(mrd_extmem_attach(c, fd, 4096, 2 * 4096, (void **)&there), 0);
	ck_assert_str_eq((char *)there, "hello window");
	there[100] = 'x';
	ck_assert_int_eq(mine[4096 + 100], 'x');
	ck_assert_int_eq(mrd_mem_free(c, there), -EINVAL);
	ck_assert_int_eq(mrd_extmem_detach(c, there), 0);
	ck_assert_int_eq(mine[4096 + 100], 'x'); /* the client's data is its own */
	munmap(mine, 4 * 4096);
	close(fd);
	mrd_client_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("libmrd-memory");
	TCase *tc = tcase_create("memory");

	signal(SIGPIPE, SIG_IGN);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_alloc_write_free);
	tcase_add_test(tc, test_alloc_keys);
	tcase_add_test(tc, test_two_processes_share);
	tcase_add_test(tc, test_death_gives_back);
	tcase_add_test(tc, test_quota_message);
	tcase_add_test(tc, test_mrd_killed);
	tcase_add_test(tc, test_window_collision);
	tcase_add_test(tc, test_window_lazy_collision);
	tcase_add_test(tc, test_window_taken_in_mrd);
	tcase_add_test(tc, test_two_handles_one_window);
	tcase_add_test(tc, test_reused_slots_survive_close);
	tcase_add_test(tc, test_extmem_attach);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
