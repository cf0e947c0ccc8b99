/* SPDX-License-Identifier: MIT */
/* Warm restart in-process: one manager saves its state, a second one in the same window adopts
 * it. The memory stays in place with its content, only the process and session that owned an
 * allocation take it back, what waits for a process that is gone is freed, and a state mrd
 * cannot trust whole is dropped whole without touching the memory. */
#include <check.h>
#include <event2/event.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arena.h"
#include "client.h"
#include "domain.h"
#include "handover.h"
#include "manager.h"
#include "status-page.h"
#include "test-daemon.h"
#include "check-run.h"

#define MiB (1ull << 20)

static const char *const settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
					"memory.hugepages=no", NULL };

static void setup(void) { td_start(settings); }
static void teardown(void) { td_stop(); }

static struct domain *find_domain(const char *name)
{
	struct domain *d;

	LIST_FOREACH(d, &td_manager->domains, link)
		if (strcmp(d->name, name) == 0)
			return d;
	return NULL;
}

/* JoinDomain with a resume; returns how many allocations came back, the session in *session. */
static unsigned join(int fd, uint64_t id, uint64_t instance, uint64_t resume, uint64_t *session)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__JoinDomainRequest q = MRD__JOIN_DOMAIN_REQUEST__INIT;
	Mrd__Response *resp;
	unsigned n;
	int fds[4];
	size_t n_fds;

	q.resume_instance = instance;
	q.resume_session = resume;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_JOIN_DOMAIN;
	req.join_domain = &q;
	td_send_request(fd, &req, NULL, 0);
	resp = td_expect_fds(fd, id, 0, fds, &n_fds);
	for (size_t i = 0; i < n_fds; i++)
		close(fds[i]);
	n = resp->join_domain->resumed;
	if (session)
		*session = resp->join_domain->session;
	mrd__response__free_unpacked(resp, NULL);
	return n;
}

/* A client of another process: pid is what claims are checked against. */
static int client_of_pid(pid_t pid, uid_t uid)
{
	struct ucred cred = { .pid = pid, .uid = uid, .gid = uid };
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__HelloRequest hello = MRD__HELLO_REQUEST__INIT;
	struct client *c;
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	ck_assert_int_eq(manager_add_client(td_manager, sv[0], &cred, &c), 0);
	hello.min_version = hello.max_version = 1;
	req.id = 1;
	req.body_case = MRD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	td_send_request(sv[1], &req, NULL, 0);
	td_expect_free(sv[1], 1, 0);
	return sv[1];
}

static void fill(uint64_t addr, uint64_t len, uint8_t seed)
{
	for (uint64_t i = 0; i < len; i += 4096)
		((uint8_t *)(uintptr_t)addr)[i] = (uint8_t)(seed + i / 4096);
}

static void check_fill(uint64_t addr, uint64_t len, uint8_t seed)
{
	for (uint64_t i = 0; i < len; i += 4096)
		ck_assert_msg(((uint8_t *)(uintptr_t)addr)[i] == (uint8_t)(seed + i / 4096),
			      "content at 0x%llx lost", (unsigned long long)(addr + i));
}

/* Stops td_manager the way a hand-over does and starts the next one on what it saved. */
static void restart(struct handover_fds *saved)
{
	td_manager->keep_content = true;
	td_stop();
	td_start(settings);
	ck_assert_int_eq(handover_adopt(td_manager, saved), 0);
}

/* The grace timer's check, now. */
static void grace_tick(void)
{
	ck_assert_ptr_nonnull(td_manager->grace_timer);
	event_active(td_manager->grace_timer, EV_TIMEOUT, 0);
	td_pump();
}

START_TEST(test_round_trip)
{
	struct client *ca, *cb;
	int a = td_hello_client(1000, &ca), b = td_hello_client(2000, &cb);
	uint64_t a1 = td_alloc(a, 2, 1 * MiB), a2 = td_alloc(a, 3, 3 * MiB);
	uint64_t b1 = td_alloc(b, 2, 2 * MiB), ext;
	uint64_t instance = td_manager->instance, session_a = ca->id, session_b = cb->id;
	uint64_t generation, session;
	struct handover_fds saved;
	unsigned n_allocations;
	Mrd__MrEntry mr;
	Mrd__Response *resp;
	struct domain *d;
	int memfd = memfd_create("ext", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(memfd, 0);
	ck_assert_int_eq(ftruncate(memfd, 8 * 4096), 0);
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	resp = td_attach(a, 4, memfd, 0, 8 * 4096, 0);
	ext = resp->extmem_attach->address;
	mrd__response__free_unpacked(resp, NULL);
	close(memfd);
	fill(a1, 1 * MiB, 1);
	fill(a2, 3 * MiB, 2);
	fill(b1, 2 * MiB, 3);
	fill(ext, 8 * 4096, 4);
	td_lookup(a, 5, a1, 0, NULL);
	generation = find_domain("uid-1000")->status->generation;

	ck_assert_int_eq(handover_save(td_manager, &saved, &n_allocations), 0);
	ck_assert_uint_eq(n_allocations, 4);
	ck_assert_str_eq(saved.names[0], HANDOVER_STATE_NAME);
	ck_assert_uint_eq(saved.n, 4); /* the state, two arenas of uid-1000, one of uid-2000 */
	/* Clients still on the old mrd stop trusting what they cached. */
	ck_assert_uint_gt(find_domain("uid-1000")->status->generation, generation);
	generation = find_domain("uid-1000")->status->generation;
	close(a);
	close(b);
	restart(&saved);
	for (size_t i = 0; i < saved.n; i++)
		ck_assert_int_eq(saved.fds[i], -1); /* all taken */
	handover_fds_done(&saved);

	ck_assert_uint_eq(td_manager->instance, instance);
	ck_assert_uint_eq(td_manager->n_domains, 2);
	d = find_domain("uid-1000");
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_gt(d->status->generation, generation);
	ck_assert_uint_eq(d->allocated_bytes, 4 * MiB + 8 * 4096);
	ck_assert_uint_eq(d->n_orphans, 3);
	check_fill(a1, 1 * MiB, 1);
	check_fill(a2, 3 * MiB, 2);
	check_fill(b1, 2 * MiB, 3);
	check_fill(ext, 8 * 4096, 4);

	/* Not another process, not another uid, not another session, not another instance. */
	b = client_of_pid(getpid() + 1, 1000);
	ck_assert_uint_eq(join(b, 2, instance, session_a, NULL), 0);
	close(b);
	b = td_hello_client(2000, NULL);
	ck_assert_uint_eq(join(b, 2, instance, session_a, NULL), 0);
	a = td_hello_client(1000, NULL);
	ck_assert_uint_eq(join(a, 2, instance, session_b, NULL), 0);
	ck_assert_uint_eq(join(a, 3, instance + 1, session_a, NULL), 0);
	td_free(a, 4, a1, EPERM); /* still nobody's: not this client's to free */
	ck_assert_uint_eq(d->n_orphans, 3);

	/* The owner's process with its session takes them back, once. */
	ck_assert_uint_eq(join(a, 5, instance, session_a, &session), 3);
	ck_assert_uint_gt(session, session_a); /* ids go on from the old mrd's */
	ck_assert_uint_eq(join(a, 6, instance, session_a, NULL), 0);
	ck_assert_uint_eq(d->n_orphans, 0);
	td_lookup(a, 7, a2, 0, &mr);
	ck_assert_uint_eq(mr.start, a2);
	td_free(a, 8, a1, 0);
	td_free(a, 9, a2, 0);
	/* New memory never lands on what the adopted runs still hold. */
	{
		uint64_t n1 = td_alloc(a, 10, 2 * MiB);

		fill(n1, 2 * MiB, 9);
		check_fill(ext, 8 * 4096, 4);
		check_fill(b1, 2 * MiB, 3);
	}

	/* uid 2000's allocation: no process of uid 2000 has this pid, so the next check frees it. */
	d = find_domain("uid-2000");
	ck_assert_uint_eq(d->allocated_bytes, 2 * MiB);
	grace_tick();
	ck_assert_uint_eq(d->allocated_bytes, 0);
	ck_assert_uint_eq(d->n_orphans, 0);
	ck_assert_ptr_null(td_manager->grace_timer); /* nothing waits any more */
	close(a);
	close(b);
	td_pump();
}
END_TEST

/* An allocation waits as long as its process lives, holding its domain open with no client;
 * one whose process is gone goes at the next check, and its domain closes. */
START_TEST(test_waits_for_live_process)
{
	char live[32];
	int a = td_hello_client(getuid(), NULL), b = td_hello_client(4242, NULL);
	struct handover_fds saved;
	unsigned n;

	ck_assert_uint_ne(getuid(), 4242);
	snprintf(live, sizeof(live), "uid-%u", (unsigned)getuid());
	(void)td_alloc(a, 2, 1 * MiB);
	(void)td_alloc(b, 2, 1 * MiB);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	close(a);
	close(b);
	restart(&saved);
	handover_fds_done(&saved);
	td_pump();
	ck_assert_uint_eq(td_manager->n_domains, 2);
	grace_tick();
	grace_tick();
	ck_assert_uint_eq(td_manager->n_domains, 1);
	ck_assert_ptr_null(find_domain("uid-4242"));
	ck_assert_uint_eq(find_domain(live)->n_orphans, 1);
	ck_assert_ptr_nonnull(td_manager->grace_timer);
	handover_end_grace(td_manager); /* at exit: everything */
	ck_assert_uint_eq(td_manager->n_domains, 0);
	ck_assert_ptr_null(td_manager->grace_timer);
}
END_TEST

static int state_fd(const void *data, size_t len)
{
	int fd = memfd_create("state", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
	return fd;
}

/* handover_adopt on copies of saved's descriptors: a failed try closes what it took. */
static void adopt_copy(struct handover_fds *saved)
{
	struct handover_fds copy = { .names = saved->names, .n = saved->n };
	int fds[8];

	ck_assert_uint_le(saved->n, 8);
	for (size_t i = 0; i < saved->n; i++)
		ck_assert_int_ge(fds[i] = fcntl(saved->fds[i], F_DUPFD_CLOEXEC, 3), 0);
	copy.fds = fds;
	ck_assert_int_eq(handover_adopt(td_manager, &copy), 0);
	for (size_t i = 0; i < saved->n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* Garbage, or a state whose arena is missing or whose slots are taken: dropped whole, with
 * the memory untouched. */
START_TEST(test_untrusted_state_dropped)
{
	int a = td_hello_client(1000, NULL), b, fd;
	uint64_t a1 = td_alloc(a, 2, 1 * MiB), b1, instance;
	struct handover_fds saved, garbage = {};
	char *name;
	unsigned n;

	fill(a1, 1 * MiB, 5);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	ck_assert_uint_eq(saved.n, 2);
	close(a);
	td_manager->keep_content = true;
	td_stop();
	td_start(settings);
	instance = td_manager->instance;

	fd = state_fd("not a state", 11);
	garbage.fds = &fd;
	garbage.names = (char *[]){ (char *)HANDOVER_STATE_NAME };
	garbage.n = 1;
	ck_assert_int_eq(handover_adopt(td_manager, &garbage), 0);
	ck_assert_int_eq(fd, -1);
	ck_assert_uint_eq(td_manager->n_domains, 0);

	/* Its arena passed under another name. */
	name = saved.names[1];
	saved.names[1] = (char *)HANDOVER_ARENA_PREFIX "999999";
	adopt_copy(&saved);
	saved.names[1] = name;
	ck_assert_uint_eq(td_manager->n_domains, 0);
	ck_assert_uint_eq(td_manager->instance, instance);

	/* Its slot taken by another domain's arena, which stays unharmed. */
	b = td_hello_client(2000, NULL);
	b1 = td_alloc(b, 2, 1 * MiB);
	ck_assert_uint_eq(b1, a1);
	fill(b1, 1 * MiB, 6);
	adopt_copy(&saved);
	ck_assert_uint_eq(td_manager->n_domains, 1);
	ck_assert_uint_eq(td_manager->instance, instance);
	check_fill(b1, 1 * MiB, 6);
	close(b);
	td_pump();
	ck_assert_uint_eq(td_manager->n_domains, 0);

	/* None of that touched the memfd: with its slot free again, it all comes back. */
	adopt_copy(&saved);
	ck_assert_uint_eq(td_manager->n_domains, 1);
	ck_assert_uint_ne(td_manager->instance, instance);
	check_fill(a1, 1 * MiB, 5);
	handover_fds_done(&saved);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("handover");
	TCase *tc = tcase_create("handover");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_waits_for_live_process);
	tcase_add_test(tc, test_untrusted_state_dropped);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
