/* SPDX-License-Identifier: MIT */
/* libmrd's errors on every path (issue 40, item 5), against a real mrd: the inline lookup's
 * errno, NULL and misused mempools, impossible sizes, messages that name the API rather than
 * wire requests, and a refused connect that names the socket's group. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define KiB (1ul << 10)
#define MiB (1ul << 20)

static struct mrd_proc mrd;
static char out[65536];

static void setup(void)
{
	int r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\narena_size = 64M\n"
				     "[quota]\npinned_bytes = 1M\n", NULL);

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

#define ck_assert_error_has(want) \
	ck_assert_msg(strstr(mrd_last_error(), (want)) != NULL, "mrd_last_error(): '%s', not '%s'", \
		      mrd_last_error(), (want))

/* MRD_KEY_INVALID says nothing of why: mrd_cache_error() does, with no second call. */
START_TEST(test_cache_error)
{
	mrd_client *c = connect_ok();
	uint8_t *big, *small;
	mrd_cache *l;
	int on_stack;

	ck_assert_int_eq(mrd_mem_alloc(c, 4 * MiB, 0, 0, (void **)&big), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&small), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_cache_error(l), 0);
	/* 4 MiB to pin against a quota of 1 MiB. */
	ck_assert_uint_eq(mrd_cache_lkey(l, big), MRD_KEY_INVALID);
	ck_assert_int_eq(mrd_cache_error(l), -EDQUOT);
	ck_assert_error_has("pinned_bytes");
	ck_assert_uint_ne(mrd_cache_lkey(l, small), MRD_KEY_INVALID);
	ck_assert_int_eq(mrd_cache_error(l), 0);
	ck_assert_uint_eq(mrd_cache_lkey(l, &on_stack), MRD_KEY_INVALID);
	ck_assert_int_eq(mrd_cache_error(l), -ENOENT);
	/* The inline hit leaves it as the last lookup out of line set it. */
	ck_assert_uint_ne(mrd_cache_lkey(l, small), MRD_KEY_INVALID);
	ck_assert_uint_ne(mrd_cache_lkey(l, small + 1), MRD_KEY_INVALID);
	/* mrd_cache_keys() sets it too. */
	{
		struct mrd_keys k;

		ck_assert_int_eq(mrd_cache_keys(l, big, &k), -EDQUOT);
		ck_assert_int_eq(mrd_cache_error(l), -EDQUOT);
		ck_assert_int_eq(mrd_cache_keys(l, small, &k), 0); /* a hit: left alone */
		ck_assert_int_eq(mrd_cache_error(l), -EDQUOT);
		ck_assert_int_eq(mrd_mem_alloc(c, 64 * KiB, 0, 0, (void **)&small), 0);
		ck_assert_int_eq(mrd_cache_keys(l, small, &k), 0); /* asked mrd */
		ck_assert_int_eq(mrd_cache_error(l), 0);
	}
	ck_assert_int_eq(mrd_cache_error(NULL), -EINVAL);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

/* Every mempool call takes NULL without crashing, and says which argument. */
START_TEST(test_mempool_null)
{
	mrd_client *c = connect_ok();
	mrd_mempool *p;
	void *objs[2];

	ck_assert_ptr_null(mrd_mempool_get(NULL));
	ck_assert_error_has("NULL");
	ck_assert_int_eq(mrd_mempool_put(NULL, objs), -EINVAL);
	ck_assert_uint_eq(mrd_mempool_size(NULL), 0);
	ck_assert_uint_eq(mrd_mempool_available(NULL), 0);
	ck_assert_int_eq(mrd_mempool_register(NULL, 0), -EINVAL);
	ck_assert_int_eq(mrd_mempool_unregister(NULL), -EINVAL);
	ck_assert_ptr_null(mrd_mempool_free(NULL));
	ck_assert_int_eq(mrd_mempool_get_bulk(NULL, objs, 2), -EINVAL);
	ck_assert_int_eq(mrd_mempool_put_bulk(NULL, objs, 2), -EINVAL);
	ck_assert_int_eq(mrd_mempool_create(c, "x", 4, 64, 0, 0, 0, NULL), -EINVAL);
	ck_assert_int_eq(mrd_mempool_create(NULL, "x", 4, 64, 0, 0, 0, &p), -EINVAL);
	ck_assert_int_eq(mrd_mempool_create_in(c, "x", NULL, 4096, 64, 0, &p), -EINVAL);
	ck_assert_int_eq(mrd_mempool_create(c, "x", 4, 64, 0, 0, 0, &p), 0);
	ck_assert_int_eq(mrd_mempool_put(p, NULL), -EINVAL);
	ck_assert_int_eq(mrd_mempool_get_bulk(p, NULL, 2), -EINVAL);
	ck_assert_int_eq(mrd_mempool_put_bulk(p, NULL, 2), -EINVAL);
	ck_assert_uint_eq(mrd_mempool_available(p), 4);
	mrd_mempool_free(p);
	mrd_client_close(c);
}
END_TEST

/* A put of something that is not an object out of the pool is refused, and the pool stays
 * whole. */
START_TEST(test_mempool_put_misuse)
{
	mrd_client *c = connect_ok();
	mrd_mempool *p, *q;
	uint8_t *o, *other, on_stack[64];

	ck_assert_int_eq(mrd_mempool_create(c, "misuse", 4, 64, 0, 0, 0, &p), 0);
	ck_assert_int_eq(mrd_mempool_create(c, "other", 4, 64, 0, 0, 0, &q), 0);
	o = mrd_mempool_get(p);
	other = mrd_mempool_get(q);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(mrd_mempool_put(p, on_stack), -EINVAL);
	ck_assert_error_has("not an object of mempool 'misuse'");
	ck_assert_int_eq(mrd_mempool_put(p, other), -EINVAL);
	ck_assert_int_eq(mrd_mempool_put(p, o + 8), -EINVAL);
	ck_assert_error_has("8 bytes into an object");
	ck_assert_uint_eq(mrd_mempool_available(p), 3);
	ck_assert_int_eq(mrd_mempool_put(p, o), 0);
	ck_assert_uint_eq(mrd_mempool_available(p), 4);
	/* Put twice in a row: the second is refused, and no object is handed out twice. */
	ck_assert_int_eq(mrd_mempool_put(p, o), -EALREADY);
	ck_assert_error_has("put already");
	ck_assert_uint_eq(mrd_mempool_available(p), 4);
	{
		void *all[5];

		for (int i = 0; i < 4; i++)
			ck_assert_ptr_nonnull(all[i] = mrd_mempool_get(p));
		ck_assert_ptr_null(mrd_mempool_get(p));
		for (int i = 0; i < 4; i++)
			for (int k = i + 1; k < 4; k++)
				ck_assert_ptr_ne(all[i], all[k]);
		/* A bulk put with one bad object puts none. */
		all[4] = on_stack;
		ck_assert_int_eq(mrd_mempool_put_bulk(p, all, 5), -EINVAL);
		ck_assert_uint_eq(mrd_mempool_available(p), 0);
		ck_assert_int_eq(mrd_mempool_put_bulk(p, all, 4), 0);
		ck_assert_uint_eq(mrd_mempool_available(p), 4);
	}
	ck_assert_int_eq(mrd_mempool_put(q, other), 0);
	mrd_mempool_free(q);
	/* With a thread cache (64 objects: 8 cached): the same object twice in a row. */
	ck_assert_int_eq(mrd_mempool_create(c, "cached", 64, 64, 0, 0, 0, &q), 0);
	ck_assert_ptr_nonnull(other = mrd_mempool_get(q));
	ck_assert_int_eq(mrd_mempool_put(q, other), 0);
	ck_assert_int_eq(mrd_mempool_put(q, other), -EALREADY);
	ck_assert_error_has("put already");
	ck_assert_uint_eq(mrd_mempool_available(q), 64);
	mrd_mempool_free(q);
	mrd_mempool_free(p);
	mrd_client_close(c);
}
END_TEST

/* Sizes no allocation can have: -ENOMEM, as malloc() and mmap() say, not -EINVAL. */
START_TEST(test_impossible_sizes)
{
	mrd_client *c = connect_ok();
	struct mrd_keys k;
	mrd_mempool *p;
	void *m = NULL;

	ck_assert_int_eq(mrd_mem_alloc(c, SIZE_MAX, 0, 0, &m), -ENOMEM);
	ck_assert_msg(strstr(mrd_last_error(), "alias") == NULL, "%s", mrd_last_error());
	ck_assert_int_eq(mrd_mem_alloc(c, SIZE_MAX - 4095, 0, 0, &m), -ENOMEM);
	ck_assert_int_eq(mrd_mem_alloc(c, SIZE_MAX / 2, 0, 0, &m), -ENOMEM);
	ck_assert_int_eq(mrd_mem_alloc(c, 1ul << 60, 0, 0, &m), -ENOMEM);
	ck_assert_int_eq(mrd_mem_alloc_keys(c, SIZE_MAX, 0, 0, &m, &k), -ENOMEM);
	ck_assert_ptr_null(m);
	ck_assert_int_eq(mrd_mempool_create(c, "huge", SIZE_MAX / 64, 128, 0, 0, 0, &p), -ENOMEM);
	mrd_client_close(c);
}
END_TEST

/* mrd's refusals name the call to make, not the request on the wire. */
START_TEST(test_messages_name_the_api)
{
	mrd_client *c = connect_ok();
	int fd = memfd_create("app-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	char path[512];
	const char *argv[] = { test_build_path("mrctl", path, sizeof(path)), "--socket", mrd.socket,
			       "flush", NULL };
	void *there, *mine;

	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	ck_assert_int_eq(mrd_extmem_attach(c, fd, 0, 4096, &there), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &mine), 0);
	ck_assert_int_eq(mrd_mem_free(c, there), -EINVAL);
	ck_assert_error_has("mrd_extmem_detach()");
	ck_assert_int_eq(mrd_extmem_detach(c, mine), -EINVAL);
	ck_assert_error_has("mrd_mem_free()");
	ck_assert_msg(strstr(mrd_last_error(), "ExtmemDetach") == NULL, "%s", mrd_last_error());
	/* Not root: flush is refused, naming the command. */
	ck_assert_int_ne(run_capture(argv, out, sizeof(out), 1000), 0);
	ck_assert_msg(strstr(out, "mrctl flush needs root") != NULL, "%s", out);
	ck_assert_msg(strstr(out, "Flush needs") == NULL, "%s", out);
	mrd_client_close(c);
	close(fd);
}
END_TEST

/* A socket of mode 0660 in a group the user is not in: connect's -EACCES names that group and
 * how to join it, not "is mrd running?". */
START_TEST(test_eacces_names_group)
{
	struct group *g = getgrgid(65534);
	int pipefd[2], status;
	char why[512] = "";
	ssize_t n;
	pid_t pid;

	if (!g) {
		fprintf(stderr, "SKIP: no group 65534 on this host\n");
		return;
	}
	ck_assert_int_eq(chown(mrd.socket, (uid_t)-1, 65534), 0);
	ck_assert_int_eq(chmod(mrd.socket, 0660), 0);
	ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		mrd_client *c = NULL;
		int r;

		if (setgroups(0, NULL) < 0 || setgid(1000) < 0 || setuid(1000) < 0)
			_exit(2);
		r = mrd_client_connect(mrd.socket, &c);
		(void)!write(pipefd[1], mrd_last_error(), strlen(mrd_last_error()));
		_exit(r == -EACCES ? 0 : 1);
	}
	close(pipefd[1]);
	n = read(pipefd[0], why, sizeof(why) - 1);
	ck_assert_int_ge(n, 0);
	why[n] = '\0';
	close(pipefd[0]);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, why);
	ck_assert_msg(strstr(why, g->gr_name) != NULL, "%s", why);
	ck_assert_msg(strstr(why, "usermod -aG") != NULL, "%s", why);
	ck_assert_msg(strstr(why, "is mrd running") == NULL, "%s", why);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("libmrd-errors");
	TCase *tc = tcase_create("errors");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_cache_error);
	tcase_add_test(tc, test_mempool_null);
	tcase_add_test(tc, test_mempool_put_misuse);
	tcase_add_test(tc, test_impossible_sizes);
	tcase_add_test(tc, test_messages_name_the_api);
	tcase_add_test(tc, test_eacces_names_group);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
