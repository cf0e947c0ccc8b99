/* SPDX-License-Identifier: MIT */
/* The descriptor list a hand-over collects (base/fd-list.h): descriptors are taken by name, the
 * first still there first; an exec finds them the way systemd passes descriptors (LISTEN_FDS,
 * LISTEN_FDNAMES, LISTEN_PID), each at its position without close-on-exec, none overwritten on
 * the way; what is left is closed at the end. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fd-list.h"
#include "check-run.h"

/* Where the numbering test places its descriptors: far above anything Check holds. */
#define PLACE_AT 600

static int memfd(void)
{
	int fd = memfd_create("test-fd-list", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	return fd;
}

static ino_t inode(int fd)
{
	struct stat st;

	ck_assert_int_eq(fstat(fd, &st), 0);
	return st.st_ino;
}

/* A memfd at at or above (0: anywhere). */
static int memfd_at(int at)
{
	int fd = memfd(), moved;

	if (at == 0)
		return fd;
	moved = fcntl(fd, F_DUPFD_CLOEXEC, at);
	ck_assert_int_ge(moved, 0);
	close(fd);
	return moved;
}

static bool is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

START_TEST(test_take_by_name_and_done_closes_the_rest)
{
	struct fd_list f = {};
	int a = memfd(), b = memfd(), c = memfd();

	ck_assert_int_eq(fd_list_add(&f, a, "mrd-state"), 0);
	ck_assert_int_eq(fd_list_add(&f, b, "mrd-arena-1"), 0);
	ck_assert_int_eq(fd_list_add(&f, c, "mrd-arena-1"), 0);
	ck_assert_uint_eq(f.n, 3);
	ck_assert_int_eq(fd_list_take(&f, "mrd-arena-1"), b);
	ck_assert_int_eq(f.fds[1], -1);
	ck_assert_int_eq(fd_list_take(&f, "mrd-arena-1"), c);
	ck_assert_int_eq(fd_list_take(&f, "mrd-arena-1"), -ENOENT);
	ck_assert_int_eq(fd_list_take(&f, "mrd-arena-2"), -ENOENT);
	ck_assert_str_eq(f.names[2], "mrd-arena-1"); /* names stay */
	fd_list_done(&f);
	ck_assert(!is_open(a));
	ck_assert(is_open(b) && is_open(c)); /* taken: the taker's */
	ck_assert_uint_eq(f.n, 0);
	ck_assert_ptr_null(f.fds);
	close(b);
	close(c);
}
END_TEST

/* What an exec'd mrd reads: as many as were added, their names joined by ':', its own pid. */
START_TEST(test_export_sets_the_listen_variables)
{
	struct fd_list f = {};
	char pid[32];

	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	ck_assert_int_eq(fd_list_add(&f, memfd(), "mrd-state"), 0);
	ck_assert_int_eq(fd_list_export(&f, PLACE_AT), 0);
	ck_assert_str_eq(getenv("LISTEN_FDS"), "1");
	ck_assert_str_eq(getenv("LISTEN_FDNAMES"), "mrd-state");
	ck_assert_int_eq(fd_list_add(&f, memfd(), "mrd-arena-7"), 0);
	ck_assert_int_eq(fd_list_add(&f, memfd(), "mrd-socket"), 0);
	ck_assert_int_eq(fd_list_export(&f, PLACE_AT), 0);
	ck_assert_str_eq(getenv("LISTEN_FDS"), "3");
	ck_assert_str_eq(getenv("LISTEN_FDNAMES"), "mrd-state:mrd-arena-7:mrd-socket");
	ck_assert_str_eq(getenv("LISTEN_PID"), pid);
	fd_list_done(&f);
}
END_TEST

/* Descriptors already sitting where others go: none is overwritten on the way. */
START_TEST(test_place_numbers_without_overwriting)
{
	struct fd_list f = {};
	int lifted[3];
	ino_t ino[3];

	for (int i = 0; i < 3; i++) {
		/* The first two sit at the second and third positions. */
		int fd = memfd_at(i < 2 ? PLACE_AT + 1 + i : 0);

		ino[i] = inode(fd);
		ck_assert_int_eq(fd_list_add(&f, fd, "x"), 0);
	}
	ck_assert_int_eq(fd_list_export(&f, PLACE_AT), 0);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_ge(f.fds[i], PLACE_AT + 3);
		ck_assert_int_eq(fcntl(f.fds[i], F_GETFD), FD_CLOEXEC); /* until the last step */
		ck_assert_uint_eq(inode(f.fds[i]), ino[i]);
	}
	ck_assert(!is_open(PLACE_AT + 1) && !is_open(PLACE_AT + 2));
	for (int i = 0; i < 3; i++)
		lifted[i] = f.fds[i];
	fd_list_place(&f, PLACE_AT);
	for (int i = 0; i < 3; i++)
		ck_assert(!is_open(lifted[i])); /* one copy each, for the exec */
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(f.fds[i], -1);
		ck_assert_uint_eq(inode(PLACE_AT + i), ino[i]);
		ck_assert_int_eq(fcntl(PLACE_AT + i, F_GETFD), 0); /* for the exec */
		close(PLACE_AT + i);
	}
	ck_assert_uint_eq(f.n, 3);
	fd_list_done(&f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fd-list");
	TCase *tc = tcase_create("fd-list");

	tcase_add_test(tc, test_take_by_name_and_done_closes_the_rest);
	tcase_add_test(tc, test_export_sets_the_listen_variables);
	tcase_add_test(tc, test_place_numbers_without_overwriting);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
