/* SPDX-License-Identifier: MIT */
/* What a refusal says, driven in-process as test-dispatch: Response.message is valid UTF-8 (a
 * proto3 string) whatever bytes a request held, those bytes escaped; each refusal names what
 * is wrong (a size near 2^64, a memfd sealed against writes, what BindPd was given); and
 * BindPd asks no filesystem about the descriptor, so a FUSE file whose server never answers
 * stops nobody else's requests. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <linux/fuse.h>

#include "test-daemon.h"
#include "wire.h"
#include "check-run.h"

static void setup(void) { td_start(NULL); }
static void teardown(void) { td_stop(); }

/* Strict UTF-8, as protobuf's other runtimes check a string field: no overlong forms, no
 * surrogates, nothing past U+10FFFF. protobuf-c's unpack checks none of it. */
static bool utf8_valid(const char *str)
{
	const unsigned char *s = (const unsigned char *)str;

	while (*s) {
		uint32_t c;
		unsigned n;

		if (s[0] < 0x80) {
			s++;
			continue;
		}
		if (s[0] >= 0xc2 && s[0] <= 0xdf)
			n = 1, c = s[0] & 0x1f;
		else if (s[0] >= 0xe0 && s[0] <= 0xef)
			n = 2, c = s[0] & 0x0f;
		else if (s[0] >= 0xf0 && s[0] <= 0xf4)
			n = 3, c = s[0] & 0x07;
		else
			return false;
		for (unsigned i = 1; i <= n; i++) {
			if ((s[i] & 0xc0) != 0x80)
				return false;
			c = (c << 6) | (s[i] & 0x3f);
		}
		if ((n == 2 && c < 0x800) || (n == 3 && (c < 0x10000 || c > 0x10ffff)) ||
		    (c >= 0xd800 && c <= 0xdfff))
			return false;
		s += n + 1;
	}
	return true;
}

static bool has_control(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

/* The reply to id must carry error, and a message with these words (in valid UTF-8). */
static void expect_message(int fd, uint64_t id, int error, const char *words)
{
	Mrd__Response *resp = td_expect(fd, id, error);

	ck_assert_msg(utf8_valid(resp->message), "not UTF-8: \"%s\"", resp->message);
	ck_assert_msg(strstr(resp->message, words), "\"%s\": no \"%s\"", resp->message, words);
	mrd__response__free_unpacked(resp, NULL);
}

static void send_domain_dump(int fd, uint64_t id, const char *domain)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DomainDumpRequest q = MRD__DOMAIN_DUMP_REQUEST__INIT;

	q.domain = (char *)domain;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
	req.domain_dump = &q;
	td_send_request(fd, &req, NULL, 0);
}

/* A name that is no UTF-8 (a lone 0xff, an overlong '/', a cut sequence), with controls and a
 * quote, echoed back: escaped, so a strict parser takes the reply; valid UTF-8 stays. */
START_TEST(test_echo_is_utf8)
{
	int fd = td_hello_client(1000, NULL);
	Mrd__Response *resp;

	send_domain_dump(fd, 2, "dom\xff\x01\"\xc0\xaf\n\xe2\x82");
	resp = td_expect(fd, 2, ENOENT);
	ck_assert_msg(utf8_valid(resp->message), "not UTF-8: \"%s\"", resp->message);
	ck_assert_msg(!has_control(resp->message), "a control byte in \"%s\"", resp->message);
	ck_assert_msg(strstr(resp->message, "no domain dom\\xff\\x01\\\"\\xc0\\xaf\\n\\xe2\\x82 is open"),
		      "%s", resp->message);
	mrd__response__free_unpacked(resp, NULL);
	send_domain_dump(fd, 3, "caf\xc3\xa9 \xe2\x82\xac");
	expect_message(fd, 3, ENOENT, "no domain caf\xc3\xa9 \xe2\x82\xac is open");
	/* A long name full of bad bytes: cut whole, still UTF-8. */
	{
		char name[1000];

		memset(name, 0xff, sizeof(name) - 1);
		name[sizeof(name) - 1] = '\0';
		send_domain_dump(fd, 4, name);
		expect_message(fd, 4, ENOENT, "\\xff\\xff...");
	}
	close(fd);
}
END_TEST

static void send_alloc(int fd, uint64_t id, uint64_t size, uint32_t flags, uint64_t alias)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__AllocRequest q = MRD__ALLOC_REQUEST__INIT;

	q.size = size;
	q.flags = flags;
	q.alias = alias;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_ALLOC;
	req.alloc = &q;
	td_send_request(fd, &req, NULL, 0);
}

/* mrd_mem_alloc(SIZE_MAX) is a size problem, not an alias one; each alias refusal names its
 * own reason. */
START_TEST(test_alloc_refusals_say_what)
{
	int fd = td_hello_client(1000, NULL);
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	Mrd__Response *resp;

	send_alloc(fd, 2, UINT64_MAX, 0, 0);
	resp = td_expect(fd, 2, ENOMEM);
	ck_assert_msg(!strstr(resp->message, "alias"), "%s", resp->message);
	ck_assert_msg(strstr(resp->message, "size of 18446744073709551615 bytes"), "%s",
		      resp->message);
	mrd__response__free_unpacked(resp, NULL);
	send_alloc(fd, 3, UINT64_MAX - page + 2, 0, 0);
	expect_message(fd, 3, ENOMEM, "bytes: rounded up to whole pages it passes 2^64");
	send_alloc(fd, 4, page, 0, 0x1001);
	expect_message(fd, 4, EINVAL, "alias 0x1001 is not page-aligned");
	send_alloc(fd, 5, 2 * page, 0, UINT64_MAX - page + 1);
	expect_message(fd, 5, EINVAL, "bytes at alias 0xfffffffffffff000 pass the end of the "
				      "address space");
	send_alloc(fd, 6, page, MRD__ALLOC_FLAGS__ALLOC_HUGEPAGE, 0x10000);
	expect_message(fd, 6, EINVAL, "an alias takes neither huge pages nor on-demand memory");
	close(fd);
}
END_TEST

static int sealed_memfd(unsigned seals)
{
	int m = memfd_create("replies", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(m, 0);
	ck_assert_int_eq(ftruncate(m, 8192), 0);
	ck_assert_int_eq(fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | seals), 0);
	return m;
}

static void attach_refused(int fd, uint64_t id, int memfd, int error, const char *words)
{
	Mrd__Response *resp = td_attach(fd, id, memfd, 0, 8192, error);

	ck_assert_msg(strstr(resp->message, words), "ExtmemAttach: \"%s\", expected \"%s\"",
		      resp->message, words);
	mrd__response__free_unpacked(resp, NULL);
	close(memfd);
}

/* A memfd sealed against writes, or opened read-only, cannot be mapped writable: the refusal
 * says so, not that it lacks F_SEAL_SHRINK. */
START_TEST(test_attach_refusals_say_what)
{
	int fd = td_hello_client(1000, NULL), m;
	char path[64];

	attach_refused(fd, 2, sealed_memfd(F_SEAL_WRITE), EPERM, "sealed against writes");
	attach_refused(fd, 3, sealed_memfd(F_SEAL_FUTURE_WRITE), EPERM, "sealed against writes");
	m = sealed_memfd(0);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", m);
	attach_refused(fd, 4, open(path, O_RDONLY | O_CLOEXEC), EACCES, "opened read-only");
	close(m);
	/* One that could be sealed must be (a file that never can, mrd takes: test-adopt). */
	m = memfd_create("replies", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_eq(ftruncate(m, 8192), 0);
	attach_refused(fd, 5, m, EPERM, "sealed against shrinking");
	close(fd);
}
END_TEST

static void send_bind(int fd, uint64_t id, int hostile)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__BindPdRequest q = MRD__BIND_PD_REQUEST__INIT;

	q.pd_handle = 1;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_BIND_PD;
	req.bind_pd = &q;
	td_send_request(fd, &req, &hostile, 1);
}

static void bind_refused(int fd, uint64_t id, int hostile, const char *words)
{
	send_bind(fd, id, hostile);
	expect_message(fd, id, ENOTTY, words);
	close(hostile);
}

/* BindPd names what it was given instead of a uverbs command file. */
START_TEST(test_bind_names_what_it_got)
{
	int fd = td_hello_client(1000, NULL), p[2], s[2], f;
	char path[] = "/tmp/mrd-replies.XXXXXX";

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s), 0);
	f = mkostemp(path, O_CLOEXEC);
	ck_assert_int_ge(f, 0);
	unlink(path);
	bind_refused(fd, 2, p[0], "a pipe, not a character device");
	bind_refused(fd, 3, s[0], "a socket, not a character device");
	bind_refused(fd, 4, f, "a regular file, not a character device");
	bind_refused(fd, 5, memfd_create("replies", MFD_CLOEXEC), "a regular file, not a character device");
	bind_refused(fd, 6, open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC),
		     "a directory, not a character device");
	bind_refused(fd, 7, open("/dev/null", O_RDWR | O_CLOEXEC), "is no uverbs device");
	close(p[1]);
	close(s[1]);
	close(fd);
}
END_TEST

/* A FUSE file system of one file, served until told to go silent: from then on it reads
 * requests and answers none, as a server that hangs, but for FUSE_RELEASE (which nobody waits
 * for). A request it holds RELEASE_S seconds is answered after all, and released says so: a
 * requester the kernel has handed to the server waits for the answer even when killed, so a
 * loop stuck in the server would wedge this test for good instead of failing it. 20 s: past
 * any delay of an in-process Ping on a loaded machine, below Check's 60 s timeout. */
#define RELEASE_S 20
#define HELD_MAX 64

struct fuse_server {
	int dev, stop[2];
	atomic_bool silent, released;
	pthread_t thread;
	char dir[64];
	struct fuse_in_header held[HELD_MAX];
	size_t n_held;
};

static void fuse_reply(int dev, uint64_t unique, int error, const void *data, size_t len)
{
	struct fuse_out_header h = { .len = (uint32_t)(sizeof(h) + len), .error = error,
				     .unique = unique };
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)data, len } };

	(void)!writev(dev, iov, len ? 2 : 1);
}

static void fuse_fill_attr(struct fuse_attr *a, uint64_t ino)
{
	a->ino = ino;
	a->mode = ino == FUSE_ROOT_ID ? S_IFDIR | 0755 : S_IFREG | 0644;
	a->nlink = 1;
	a->size = ino == FUSE_ROOT_ID ? 0 : 4096;
	a->blksize = 4096;
}

static void *fuse_serve(void *arg)
{
	struct fuse_server *s = arg;
	static char buf[FUSE_MIN_READ_BUFFER + 65536];

	for (;;) {
		struct pollfd p[2] = { { s->dev, POLLIN, 0 }, { s->stop[0], POLLIN, 0 } };
		struct fuse_in_header *in = (struct fuse_in_header *)buf;
		int k = poll(p, 2, s->n_held ? RELEASE_S * 1000 : -1);
		ssize_t n;

		if (k < 0 || p[1].revents)
			break;
		if (k == 0) {
			/* Held RELEASE_S seconds: give in, and say so. */
			for (size_t i = 0; i < s->n_held; i++) {
				struct fuse_attr_out a = { 0 };

				fuse_fill_attr(&a.attr, s->held[i].nodeid);
				if (s->held[i].opcode == FUSE_GETATTR)
					fuse_reply(s->dev, s->held[i].unique, 0, &a, sizeof(a));
				else
					fuse_reply(s->dev, s->held[i].unique, -EIO, NULL, 0);
			}
			s->n_held = 0;
			atomic_store(&s->released, true);
			atomic_store(&s->silent, false);
			continue;
		}
		n = read(s->dev, buf, sizeof(buf));
		if (n < 0 && errno == ENODEV)
			break;
		if (n < (ssize_t)sizeof(*in))
			continue;
		if (atomic_load(&s->silent) && in->opcode != FUSE_RELEASE &&
		    in->opcode != FUSE_FORGET && in->opcode != FUSE_BATCH_FORGET) {
			if (in->opcode != FUSE_INTERRUPT && s->n_held < HELD_MAX)
				s->held[s->n_held++] = *in;
			continue;
		}
		switch (in->opcode) {
		case FUSE_INIT: {
			const struct fuse_init_in *i = (const void *)(in + 1);
			struct fuse_init_out o = { .major = FUSE_KERNEL_VERSION,
						   .minor = FUSE_KERNEL_MINOR_VERSION,
						   .max_readahead = i->max_readahead,
						   .max_write = 65536 };

			fuse_reply(s->dev, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_LOOKUP: {
			struct fuse_entry_out e = { .nodeid = 2, .generation = 1 };

			fuse_fill_attr(&e.attr, 2);
			fuse_reply(s->dev, in->unique, 0, &e, sizeof(e));
			break;
		}
		case FUSE_GETATTR: {
			struct fuse_attr_out a = { 0 };

			fuse_fill_attr(&a.attr, in->nodeid);
			fuse_reply(s->dev, in->unique, 0, &a, sizeof(a));
			break;
		}
		case FUSE_OPEN: {
			/* No flush at close: closing the file waits for nothing. */
			struct fuse_open_out o = { .fh = 1, .open_flags = FOPEN_NOFLUSH };

			fuse_reply(s->dev, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_RELEASE:
			fuse_reply(s->dev, in->unique, 0, NULL, 0);
			break;
		case FUSE_FORGET:
		case FUSE_BATCH_FORGET:
		case FUSE_INTERRUPT:
			break;
		default:
			fuse_reply(s->dev, in->unique, -ENOSYS, NULL, 0);
		}
	}
	return NULL;
}

/* Mounts the server (allow_other: mrd is another process of the same user here, but a real
 * attacker's mount would let mrd in); false, with why, where the kernel does not let us. */
static bool fuse_start(struct fuse_server *s, char *why, size_t size)
{
	char opts[128];

	memset(s, 0, sizeof(*s));
	s->dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (s->dev < 0) {
		snprintf(why, size, "cannot open /dev/fuse: %s", strerror(errno));
		return false;
	}
	/* In a mount namespace of this test's own process: the mount goes with it, pass or fail. */
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
		snprintf(why, size, "cannot make a mount namespace: %s", strerror(errno));
		close(s->dev);
		return false;
	}
	snprintf(s->dir, sizeof(s->dir), "/tmp/mrd-fuse.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(s->dir));
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=%u,group_id=%u,allow_other",
		 s->dev, (unsigned)getuid(), (unsigned)getgid());
	if (mount("mrd-test", s->dir, "fuse", MS_NOSUID | MS_NODEV, opts) < 0) {
		snprintf(why, size, "cannot mount FUSE: %s", strerror(errno));
		close(s->dev);
		rmdir(s->dir);
		return false;
	}
	ck_assert_int_eq(pipe2(s->stop, O_CLOEXEC), 0);
	ck_assert_int_eq(pthread_create(&s->thread, NULL, fuse_serve, s), 0);
	return true;
}

/* Its device closed, the connection is aborted: whatever still waits on it fails. */
static void fuse_stop(struct fuse_server *s)
{
	ck_assert_int_eq(write(s->stop[1], "x", 1), 1);
	pthread_join(s->thread, NULL);
	close(s->dev);
	close(s->stop[0]);
	close(s->stop[1]);
	umount2(s->dir, MNT_DETACH);
	rmdir(s->dir);
}

/* A client sends BindPd with a FUSE file whose server has stopped answering; another's Ping is
 * answered all the same, and the first gets its refusal: mrd asked the file's server
 * nothing. (Before, fstat waited for the server on the loop: every client froze.) */
START_TEST(test_bind_fuse_file_stops_no_one)
{
	struct fuse_server s;
	char why[128], path[96];
	int a = td_hello_client(1000, NULL), b = td_hello_client(1001, NULL), file;
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;

	if (!fuse_start(&s, why, sizeof(why))) {
		printf("test_bind_fuse_file_stops_no_one: not run: %s\n", why);
		close(a);
		close(b);
		return;
	}
	snprintf(path, sizeof(path), "%s/file", s.dir);
	file = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(file, 0);
	atomic_store(&s.silent, true);
	send_bind(a, 2, file);
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_PING;
	req.ping = &ping;
	td_send_request(b, &req, NULL, 0);
	/* Each reply is an event this waits for: a loop stuck in the server sends them only once
	 * the server gives in (RELEASE_S), which released tells. */
	mrd__response__free_unpacked(td_expect(b, 3, 0), NULL);
	ck_assert_msg(!atomic_load(&s.released), "another client's Ping waited %d s, until the "
		      "FUSE server answered what mrd asked it", RELEASE_S);
	expect_message(a, 2, ENOTTY, "a regular file, not a character device");
	fuse_stop(&s);
	close(file);
	close(a);
	close(b);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("replies");
	TCase *tc = tcase_create("replies");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_echo_is_utf8);
	tcase_add_test(tc, test_alloc_refusals_say_what);
	tcase_add_test(tc, test_attach_refusals_say_what);
	tcase_add_test(tc, test_bind_names_what_it_got);
	tcase_add_test(tc, test_bind_fuse_file_stops_no_one);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
