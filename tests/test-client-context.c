/* SPDX-License-Identifier: MIT */
/* The checks client-context.c makes of a client's fd before its first ioctl, with no device: a
 * sysfs tree of the test's own names /dev/null (1:3) a uverbs device. Hostile fds get a clear
 * error, no fd of mrd's is left behind, and nothing but fstat, sysfs and (for a fd that passed
 * those) the driver probe touches the fd. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check-run.h"
#include "test-util.h"
#include "provider/client-context.h"

static char root[64];

static void put(const char *rel, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	f = fopen(path, "we");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/* sysfs with uverbs0 = dev (of ibdev rxe0) and uverbs1 = 231:193 (siw0). */
static void sysfs(const char *dev)
{
	char path[256];

	snprintf(root, sizeof(root), "/tmp/mrd-test-client-context.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(path, sizeof(path), "%s/class", root);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/class/infiniband_verbs", root);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/class/infiniband_verbs/uverbs0", root);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/class/infiniband_verbs/uverbs1", root);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	put("class/infiniband_verbs/uverbs0/dev", dev);
	put("class/infiniband_verbs/uverbs0/ibdev", "rxe0\n");
	put("class/infiniband_verbs/uverbs1/dev", "231:193\n");
	put("class/infiniband_verbs/uverbs1/ibdev", "siw0\n");
}

static void sysfs_remove(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}


/* fd refused with error, mrd's own contexts' files being own; why says something with want in
 * it; no fd of mrd's stays. */
static void refused_own(int fd, const int *own, size_t n_own, const char *device, int error,
			const char *want)
{
	struct client_context *ctx = NULL;
	char why[256] = "";
	unsigned n = count_open_fds(0);

	ck_assert_int_eq(client_context_open(fd, device, root, own, n_own, &ctx, why, sizeof(why)),
			 error);
	ck_assert_ptr_null(ctx);
	ck_assert_msg(strstr(why, want), "why \"%s\" lacks \"%s\"", why, want);
	ck_assert_uint_eq(count_open_fds(0), n);
	fprintf(stderr, "fd %d refused: %s\n", fd, why);
}

static void refused(int fd, const char *device, int error, const char *want)
{
	refused_own(fd, NULL, 0, device, error, want);
}

START_TEST(test_not_character_devices)
{
	int p[2], s[2], f;
	char file[128];

	sysfs("1:3\n");
	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s), 0);
	snprintf(file, sizeof(file), "%s/file", root);
	f = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	ck_assert_int_ge(f, 0);
	refused(p[0], "rxe0", -ENOTTY, "not a character device");
	refused(s[0], "rxe0", -ENOTTY, "not a character device");
	refused(f, "rxe0", -ENOTTY, "not a character device");
	refused(1000, "rxe0", -EBADF, "no such file descriptor");
	close(p[0]);
	close(p[1]);
	close(s[0]);
	close(s[1]);
	close(f);
	sysfs_remove();
}
END_TEST

/* A character device that sysfs does not name a uverbs device: /dev/zero (1:5) beside a
 * table with 1:3, a table with a garbled entry, no table at all. */
START_TEST(test_other_character_devices)
{
	int zero = open("/dev/zero", O_RDONLY | O_CLOEXEC), null = open("/dev/null", O_RDONLY | O_CLOEXEC);

	ck_assert_int_ge(zero, 0);
	sysfs("1:3\n");
	refused(zero, "rxe0", -ENOTTY, "1:5 is no uverbs device");
	sysfs_remove();
	sysfs("one:three\n");
	refused(null, "rxe0", -ENOTTY, "1:3 is no uverbs device");
	sysfs_remove();
	snprintf(root, sizeof(root), "/tmp/mrd-test-client-context-none");
	refused(null, "rxe0", -ENOTTY, "no /tmp/mrd-test-client-context-none/class/infiniband_verbs");
	close(zero);
	close(null);
}
END_TEST

/* The sysfs name of fd's device, and a context of another device than mrd's refused. */
START_TEST(test_device_named_and_other_device_refused)
{
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	char ibdev[64], why[256];

	sysfs("1:3\n");
	ck_assert_int_eq(uverbs_fd_device(null, root, ibdev, sizeof(ibdev), why, sizeof(why)), 0);
	ck_assert_str_eq(ibdev, "rxe0");
	refused(null, "siw0", -EXDEV, "a context of device rxe0, not of siw0");
	close(null);
	sysfs_remove();
}
END_TEST

/* Named a uverbs device but not one (a stand-in here; a sysfs mrd cannot trust): the driver
 * probe's ioctl fails and the fd is refused, nothing kept. Also an O_PATH fd, which fstat
 * takes and ioctl refuses. */
START_TEST(test_probe_refuses_what_is_not_uverbs)
{
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC), path = open("/dev/null", O_PATH | O_CLOEXEC);

	ck_assert_int_ge(path, 0);
	sysfs("1:3\n");
	refused(null, "rxe0", -ENOTTY, "answers no driver");
	refused(path, "rxe0", -EBADF, "answers no driver");
	close(null);
	close(path);
	sysfs_remove();
}
END_TEST

/* mrd's own context, whose cmd_fd an importer holds (provider-verbs.c verbs_export_pd) and may
 * send back as its own: the same device node, device and driver, so every check above passes,
 * but an MR made there is mrd's context's (the client's close does not end it, it outlives
 * the memory). Its open file is refused, a dup of it too; another open of the node is not. */
START_TEST(test_own_context_refused)
{
	int own = open("/dev/null", O_RDONLY | O_CLOEXEC), other = open("/dev/null", O_RDONLY | O_CLOEXEC);
	int dup_of_own = fcntl(own, F_DUPFD_CLOEXEC, 3), ours[2] = { other, own };

	ck_assert_int_ge(dup_of_own, 0);
	sysfs("1:3\n");
	refused_own(dup_of_own, ours, 2, "rxe0", -EPERM, "one of mrd's own contexts");
	refused_own(own, ours, 2, "rxe0", -EPERM, "one of mrd's own contexts");
	/* another open file of the node: on to the driver probe, which /dev/null fails */
	refused_own(dup_of_own, &other, 1, "rxe0", -ENOTTY, "answers no driver");
	close(own);
	close(other);
	close(dup_of_own);
	sysfs_remove();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("client-context");
	TCase *tc = tcase_create("fd checks");

	tcase_add_test(tc, test_not_character_devices);
	tcase_add_test(tc, test_other_character_devices);
	tcase_add_test(tc, test_device_named_and_other_device_refused);
	tcase_add_test(tc, test_probe_refuses_what_is_not_uverbs);
	tcase_add_test(tc, test_own_context_refused);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
