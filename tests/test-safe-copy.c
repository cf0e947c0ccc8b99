/* SPDX-License-Identifier: MIT */
/* safe_memmove: copies as memmove does; a SIGBUS on its pages (a memfd shrunk under its mapping
 * stands in for a punched hugetlb page with none free) ends the copy with -EFAULT and the
 * address, in any thread, as often as it happens; every other SIGBUS still kills. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check-run.h"
#include "provider/safe-copy.h"

static size_t ps;
static uint8_t *map; /* two pages of a memfd; the second is gone (beyond its end) */

static void setup(void)
{
	int fd = memfd_create("safe-copy", MFD_CLOEXEC);

	ps = (size_t)sysconf(_SC_PAGESIZE);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)(2 * ps)), 0);
	map = mmap(NULL, 2 * ps, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(map, MAP_FAILED);
	ck_assert_int_eq(ftruncate(fd, (off_t)ps), 0);
	close(fd);
}

static void teardown(void) { munmap(map, 2 * ps); }

START_TEST(test_copies_like_memmove)
{
	uint8_t buf[64];

	for (int i = 0; i < 64; i++)
		buf[i] = (uint8_t)i;
	ck_assert_int_eq(safe_memmove(buf + 8, buf, 32, NULL), 0); /* overlapping */
	for (int i = 0; i < 32; i++)
		ck_assert_int_eq(buf[8 + i], i);
	ck_assert_int_eq(safe_memmove(map, buf, 64, NULL), 0);
	ck_assert_int_eq(memcmp(map, buf, 64), 0);
	ck_assert_int_eq(safe_memmove(buf, map, 0, NULL), 0);
}
END_TEST

START_TEST(test_fault_ends_the_copy)
{
	uint8_t buf[256] = { 1 };
	uintptr_t fault = 0;

	/* Both ways, twice each: the handler stays and SIGBUS is not left blocked. */
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(safe_memmove(map + ps + 16, buf, sizeof(buf), &fault), -EFAULT);
		ck_assert_uint_ge(fault, (uintptr_t)map + ps);
		ck_assert_uint_lt(fault, (uintptr_t)map + 2 * ps);
		fault = 0;
		ck_assert_int_eq(safe_memmove(buf, map + ps - 64, sizeof(buf), &fault), -EFAULT);
		ck_assert_uint_ge(fault, (uintptr_t)map + ps); /* memmove picks its order */
		ck_assert_uint_lt(fault, (uintptr_t)map + ps + sizeof(buf));
	}
	ck_assert_int_eq(safe_memmove(buf, map, 64, NULL), 0); /* and copies go on */
}
END_TEST

static void *fault_in_thread(void *data)
{
	uint8_t buf[64];

	(void)data;
	return (void *)(intptr_t)safe_memmove(buf, map + ps, sizeof(buf), NULL);
}

START_TEST(test_fault_in_another_thread)
{
	pthread_t t;
	void *r;

	ck_assert_int_eq(pthread_create(&t, NULL, fault_in_thread, NULL), 0);
	ck_assert_int_eq(pthread_join(t, &r), 0);
	ck_assert_int_eq((intptr_t)r, -EFAULT);
}
END_TEST

/* In a child: after a guarded copy installed the handler, how a SIGBUS ends it. */
static int child_status(int how)
{
	pid_t pid = fork();
	int status;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		uint8_t buf[64];

		(void)safe_memmove(buf, map, sizeof(buf), NULL);
		if (how == 0)
			*(volatile uint8_t *)(map + ps) = 1; /* a fault outside any copy */
		else
			kill(getpid(), SIGBUS); /* sent, not a fault */
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return status;
}

/* Killed by SIGBUS, as without the handler; under ASan, its own handler was there before
 * and reports the fault, exiting non-zero. */
static bool died_of_sigbus(int status)
{
#if defined(__SANITIZE_ADDRESS__)
	if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
		return true;
#endif
	return WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
}

START_TEST(test_other_sigbus_still_kills)
{
	int status = child_status(0);

	ck_assert_msg(died_of_sigbus(status), "a fault outside a copy: status %#x", status);
	status = child_status(1);
	ck_assert_msg(died_of_sigbus(status), "a SIGBUS sent: status %#x", status);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("safe-copy");
	TCase *tc = tcase_create("copy");

#if defined(__SANITIZE_THREAD__)
	printf("not run: under ThreadSanitizer the handler's siglongjmp does not get out of the "
	       "faulting memmove (TSan wraps both); ASan and valgrind run this\n");
	return 77;
#endif

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_copies_like_memmove);
	tcase_add_test(tc, test_fault_ends_the_copy);
	tcase_add_test(tc, test_fault_in_another_thread);
	tcase_add_test(tc, test_other_sigbus_still_kills);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
