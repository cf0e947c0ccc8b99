/* SPDX-License-Identifier: MIT */
/* Warm restart in-process: one manager saves its state, a second one in the same window adopts
 * it. The memory stays in place with its content, only the process and session that owned an
 * allocation take it back, what waits for a process that is gone is freed, and a state mrd
 * cannot trust whole is dropped whole without touching the memory. */
#include <check.h>
#include <event2/event.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memory/arena.h"
#include "control/client.h"
#include "core/domain.h"
#include "control/handover.h"
#include "control/manager.h"
#include "base/process.h"
#include "status-page.h"
#include "test-daemon.h"
#include "check-run.h"

#define MiB (1ull << 20)

static const char *const settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
					"memory.hugepages=no", NULL };

static void setup(void) { td_start(settings); }
static void teardown(void) { td_stop(); }

/* JoinDomain with a resume; returns how many allocations came back, the session in *session. */
static unsigned join(int fd, uint64_t id, uint64_t instance, uint64_t resume, uint64_t *session)
{
	Mrd__Response *resp = td_join(fd, id, instance, resume, NULL);
	unsigned n = resp->join_domain->resumed;

	if (session)
		*session = resp->join_domain->session;
	mrd__response__free_unpacked(resp, NULL);
	return n;
}

/* A pid no process has now: its allocations wait for nobody. */
static pid_t dead_pid(void)
{
	for (pid_t pid = 4000000; pid > 1; pid--)
		if (kill(pid, 0) < 0 && errno == ESRCH)
			return pid;
	ck_abort_msg("no free pid");
	return 0;
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
static void restart(struct fd_list *saved)
{
	td_manager->core.window.keep_content = true;
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
	int a = td_hello_client(1000, &ca), b = td_hello_client_of(dead_pid(), 2000, &cb);
	uint64_t a1 = td_alloc(a, 2, 1 * MiB), a2 = td_alloc(a, 3, 3 * MiB);
	uint64_t b1 = td_alloc(b, 2, 2 * MiB), ext;
	uint64_t instance = td_manager->instance, session_a = ca->id, session_b = cb->id;
	uint64_t generation, session, frees;
	unsigned arenas;
	int b2;
	struct fd_list saved;
	unsigned n_allocations;
	Mrd__MrEntry mr;
	struct domain *d;

	close(td_attach_sealed(a, 4, 8 * 4096, &ext));
	fill(a1, 1 * MiB, 1);
	fill(a2, 3 * MiB, 2);
	fill(b1, 2 * MiB, 3);
	fill(ext, 8 * 4096, 4);
	td_lookup(a, 5, a1, 0, NULL);
	td_free(a, 6, td_alloc(a, 7, 4096), 0); /* the page counts frees across the restart */
	frees = td_find_domain("uid-1000")->mem.status.page->frees;
	ck_assert_uint_gt(frees, 0);
	generation = td_find_domain("uid-1000")->mem.status.page->generation;

	ck_assert_int_eq(handover_save(td_manager, &saved, &n_allocations), 0);
	ck_assert_uint_eq(n_allocations, 4);
	ck_assert_str_eq(saved.names[0], HANDOVER_STATE_NAME);
	ck_assert_int_eq(fcntl(saved.fds[0], F_GET_SEALS) & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW),
			 F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW);
	ck_assert_uint_eq(saved.n, 4); /* the state, two arenas of uid-1000, one of uid-2000 */
	/* Clients still on the old mrd stop trusting what they cached. */
	ck_assert_uint_gt(td_find_domain("uid-1000")->mem.status.page->generation, generation);
	generation = td_find_domain("uid-1000")->mem.status.page->generation;
	close(a);
	close(b);
	restart(&saved);
	for (size_t i = 0; i < saved.n; i++)
		ck_assert_int_eq(saved.fds[i], -1); /* all taken */
	fd_list_done(&saved);

	ck_assert_uint_eq(td_manager->instance, instance);
	ck_assert_uint_eq(td_manager->core.n_domains, 2);
	d = td_find_domain("uid-1000");
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_gt(d->mem.status.page->generation, generation);
	ck_assert_uint_eq(d->mem.status.page->frees, frees);
	ck_assert_uint_eq(d->mem.allocated_bytes, 4 * MiB + 8 * 4096);
	ck_assert_uint_eq(d->mem.n_orphans, 3);
	check_fill(a1, 1 * MiB, 1);
	check_fill(a2, 3 * MiB, 2);
	check_fill(b1, 2 * MiB, 3);
	check_fill(ext, 8 * 4096, 4);

	/* Not another process, not another uid, not another session, not another instance, not
	 * a connection's second JoinDomain. */
	b = td_hello_client_of(getpid() + 1, 1000, NULL);
	ck_assert_uint_eq(join(b, 2, instance, session_a, NULL), 0);
	close(b);
	b = td_hello_client(2000, NULL);
	ck_assert_uint_eq(join(b, 2, instance, session_a, NULL), 0);
	a = td_hello_client(1000, NULL);
	ck_assert_uint_eq(join(a, 2, instance, session_b, NULL), 0);
	close(a);
	a = td_hello_client(1000, NULL);
	ck_assert_uint_eq(join(a, 2, instance + 1, session_a, NULL), 0);
	ck_assert_uint_eq(join(a, 3, instance, session_a, NULL), 0);
	td_free(a, 4, a1, EPERM); /* still nobody's: not this client's to free */
	ck_assert_uint_eq(d->mem.n_orphans, 3);
	close(a);
	/* Nor a later process that got the pid (another start time). */
	a = td_hello_client(1000, &ca);
	ca->owner.mem.start_time++;
	ck_assert_uint_eq(join(a, 2, instance, session_a, NULL), 0);
	close(a);

	/* The owner's process with its session takes them back, once. */
	a = td_hello_client(1000, &ca);
	ck_assert_uint_eq(join(a, 5, instance, session_a, &session), 3);
	ck_assert_uint_gt(session, session_a); /* ids go on from the old mrd's */
	ck_assert_uint_eq(ca->owner.mem.allocated_bytes, 4 * MiB + 8 * 4096);
	ck_assert_uint_eq(d->mem.n_orphans, 0);
	b2 = td_hello_client(1000, NULL);
	ck_assert_uint_eq(join(b2, 2, instance, session_a, NULL), 0);
	close(b2);
	/* The adopted arena's free pages serve new allocations: no arena more. */
	arenas = d->mem.n_arenas;
	td_free(a, 6, td_alloc(a, 7, 1 * MiB), 0);
	ck_assert_uint_eq(d->mem.n_arenas, arenas);
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

	/* uid 2000's allocation: its process is gone, so the next check frees it. */
	d = td_find_domain("uid-2000");
	ck_assert_uint_eq(d->mem.allocated_bytes, 2 * MiB);
	grace_tick();
	ck_assert_uint_eq(d->mem.allocated_bytes, 0);
	ck_assert_uint_eq(d->mem.n_orphans, 0);
	ck_assert_ptr_null(td_manager->grace_timer); /* nothing waits any more */
	close(a);
	close(b);
	td_pump();
}
END_TEST

/* Memory a process aliased (libmrd-preload.so's moved buffers) keeps its alias, access and
 * spans across the restart: its next registrations in that process's PDs are where and what
 * they were. */
START_TEST(test_alias_kept)
{
	Mrd__AliasSpanRequest span = MRD__ALIAS_SPAN_REQUEST__INIT;
	Mrd__Request req = MRD__REQUEST__INIT;
	struct fd_list saved;
	unsigned n_allocations;
	struct allocation *al;
	Mrd__Response *resp;
	uint64_t w;
	int a = td_hello_client(1000, NULL);

	resp = td_alloc_span(a, 2, 3 * 4096, 0, 0x7e0000000000ull, 3, 100, 5000, 0);
	w = resp->alloc->address;
	mrd__response__free_unpacked(resp, NULL);
	/* And a heap neighbour's span beside it (AliasSpan). */
	span.address = w;
	span.span_offset = 5200;
	span.span_length = 6000;
	req.id = 3;
	req.body_case = MRD__REQUEST__BODY_ALIAS_SPAN;
	req.alias_span = &span;
	td_send_request(a, &req, NULL, 0);
	mrd__response__free_unpacked(td_expect(a, 3, 0), NULL);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n_allocations), 0);
	close(a);
	restart(&saved);
	fd_list_done(&saved);
	al = domain_find_allocation(td_find_domain("uid-1000"), w);
	ck_assert_ptr_nonnull(al);
	ck_assert_uint_eq(al->alias, 0x7e0000000000ull);
	ck_assert_uint_eq(al->alias_access, 3);
	ck_assert_uint_eq(al->span_offset, 100);
	ck_assert_uint_eq(al->span_length, 5000);
	ck_assert_uint_eq(al->n_more_spans, 1);
	ck_assert_uint_eq(al->more_spans[0].offset, 5200);
	ck_assert_uint_eq(al->more_spans[0].length, 6000);
	td_pump();
}
END_TEST

/* An allocation waits as long as its process lives, holding its domain open with no client;
 * one whose process is gone goes at the next check, and its domain closes. */
START_TEST(test_waits_for_live_process)
{
	char live[32];
	int a = td_hello_client(getuid(), NULL), b = td_hello_client_of(dead_pid(), 4242, NULL);
	struct fd_list saved;
	unsigned n;

	ck_assert_uint_ne(getuid(), 4242);
	snprintf(live, sizeof(live), "uid-%u", (unsigned)getuid());
	(void)td_alloc(a, 2, 1 * MiB);
	(void)td_alloc(b, 2, 1 * MiB);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	close(a);
	close(b);
	restart(&saved);
	fd_list_done(&saved);
	td_pump();
	ck_assert_uint_eq(td_manager->core.n_domains, 2);
	grace_tick();
	grace_tick();
	ck_assert_uint_eq(td_manager->core.n_domains, 1);
	ck_assert_ptr_null(td_find_domain("uid-4242"));
	ck_assert_uint_eq(td_find_domain(live)->mem.n_orphans, 1);
	ck_assert_ptr_nonnull(td_manager->grace_timer);
	handover_end_grace(td_manager); /* at exit: everything */
	ck_assert_uint_eq(td_manager->core.n_domains, 0);
	ck_assert_ptr_null(td_manager->grace_timer);
}
END_TEST

/* Contexts exported to clients are named in the state with the holders that still run (a
 * context none holds is not), the next mrd keeps them, and drops one when its holders go. */
START_TEST(test_exported_contexts_handed_over)
{
	char mine[32];
	int a = td_hello_client(getuid(), NULL), b = td_hello_client_of(dead_pid(), 4242, NULL);
	pid_t child = fork();
	struct fd_list saved;
	struct old_context *o;
	unsigned n;

	ck_assert_int_ge(child, 0);
	if (child == 0) {
		pause();
		_exit(0);
	}
	snprintf(mine, sizeof(mine), "uid-%u", (unsigned)getuid());
	td_lookup(a, 3, td_alloc(a, 2, 1 * MiB), 0, NULL); /* 1 MiB pinned */
	(void)td_alloc(b, 2, 1 * MiB);
	ck_assert_int_eq(domain_note_export(td_find_domain(mine), &(struct context_holder){
			 .pid = child, .uid = getuid(),
			 .start_time = process_start_time(child) }), 0);
	ck_assert_int_eq(domain_note_export(td_find_domain(mine), &(struct context_holder){
			 .pid = dead_pid(), .uid = getuid() }), 0);
	ck_assert_int_eq(domain_note_export(td_find_domain("uid-4242"), &(struct context_holder){
			 .pid = dead_pid(), .uid = 4242 }), 0);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	close(a);
	close(b);
	restart(&saved);
	fd_list_done(&saved);

	o = LIST_FIRST(&td_manager->old_contexts);
	ck_assert_ptr_nonnull(o);
	ck_assert_ptr_null(LIST_NEXT(o, link)); /* uid-4242's: none of its holders runs */
	ck_assert_str_eq(o->domain, mine);
	ck_assert_str_eq(o->device, "soft");
	ck_assert_uint_eq(o->pinned_bytes, 1 * MiB);
	ck_assert_uint_eq(o->mrs, 1);
	ck_assert_uint_eq(o->n_holders, 1);
	ck_assert_int_eq(o->holders[0].pid, child);
	ck_assert_uint_eq(old_contexts_prune(&td_manager->old_contexts), 1);
	ck_assert_int_eq(kill(child, SIGKILL), 0);
	ck_assert_int_eq(waitpid(child, NULL, 0), child);
	ck_assert_uint_eq(old_contexts_prune(&td_manager->old_contexts), 0);
	ck_assert(LIST_EMPTY(&td_manager->old_contexts));
	handover_end_grace(td_manager);
}
END_TEST

/* A domain of two uids: the allocation goes back to the uid that had it, not to the other. */
START_TEST(test_claim_checks_uid)
{
	const char *const lab[] = { "memory.window_size=4G", "memory.arena_size=64M",
				    "memory.hugepages=no", "domains.lab=uid:1000 uid:1001", NULL };
	struct client *c;
	int a, b;
	uint64_t instance, session;
	struct fd_list saved;
	unsigned n;

	td_stop();
	td_start(lab);
	a = td_hello_client(1000, &c);
	(void)td_alloc(a, 2, 1 * MiB);
	instance = td_manager->instance;
	session = c->id;
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	close(a);
	td_manager->core.window.keep_content = true;
	td_stop();
	td_start(lab);
	ck_assert_int_eq(handover_adopt(td_manager, &saved), 0);
	fd_list_done(&saved);
	b = td_hello_client(1001, NULL);
	ck_assert_uint_eq(join(b, 2, instance, session, NULL), 0);
	a = td_hello_client(1000, NULL);
	ck_assert_uint_eq(join(a, 2, instance, session, NULL), 1);
	close(a);
	close(b);
	td_pump();
}
END_TEST

/* Another client's mempool over a waiting allocation: its unregister must not free what waits,
 * and the allocation outlives its waiting while the mempool covers it. */
START_TEST(test_mempool_over_waiting)
{
	int a = td_hello_client_of(dead_pid(), 1000, NULL), b;
	uint64_t a1 = td_alloc(a, 2, 1 * MiB), len = 64 * 1024;
	struct fd_list saved;
	struct domain *d;
	unsigned n;

	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	close(a);
	restart(&saved);
	fd_list_done(&saved);
	d = td_find_domain("uid-1000");
	b = td_hello_client(1000, NULL);
	td_send_mempool_register(b, 2, "p", &a1, &len, 1, false);
	td_expect_free(b, 2, 0);
	td_mempool_unregister(b, 3, "p", 0);
	ck_assert_uint_eq(d->mem.n_orphans, 1);
	ck_assert_ptr_nonnull(domain_find_allocation(d, a1));
	td_send_mempool_register(b, 4, "p", &a1, &len, 1, false);
	td_expect_free(b, 4, 0);
	/* Its process is gone: it leaves the waiting list, but the mempool keeps it until it
	 * goes. */
	grace_tick();
	ck_assert_uint_eq(d->mem.n_orphans, 0);
	ck_assert_uint_eq(d->mem.allocated_bytes, 1 * MiB);
	td_mempool_unregister(b, 5, "p", 0);
	ck_assert_uint_eq(d->mem.allocated_bytes, 0);
	close(b);
	td_pump();
}
END_TEST

/* arena_adopt maps only what mrd would have made; allocations must be page runs that fit. */
START_TEST(test_adopt_checks)
{
	struct arena_place place = { .slot = 2, .size = 64 * MiB, .page_size = 4096, .serial = 9 };
	struct adopted_allocation al = { .offset = 0, .length = 1 * MiB, .session = 1, .pid = 1 };
	struct domain *d;
	struct arena *a;
	int fd = memfd_create("arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 64 * MiB), 0);
	ck_assert_int_eq(domain_adopt(&td_manager->core, "x", 0, 0, &d), 0);
	ck_assert_int_eq(arena_adopt(&d->mem, fd, &place, &a), -EINVAL); /* not sealed */
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK), 0);
	place.size = 32 * MiB;
	ck_assert_int_eq(arena_adopt(&d->mem, fd, &place, &a), -EINVAL); /* not its size */
	place.size = 64 * MiB;
	place.page_size = 2 << 20;
	ck_assert_int_eq(arena_adopt(&d->mem, fd, &place, &a), -EINVAL); /* not its pages */
	place.page_size = 4096;
	place.slot = td_manager->core.window.n_slots;
	ck_assert_int_eq(arena_adopt(&d->mem, fd, &place, &a), -EINVAL); /* outside the window */
	place.slot = 2;
	ck_assert_int_eq(arena_adopt(&d->mem, fd, &place, &a), 0);
	ck_assert_ptr_eq(a->base, window_slot(&td_manager->core.window, 2));
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), 0);
	al.offset = 512 * 1024;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EEXIST); /* overlaps */
	al.offset = 1 * MiB + 100;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EINVAL); /* not a page run */
	al.offset = 63 * MiB;
	al.length = 2 * MiB;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EINVAL); /* past its end */
	/* Spans a tampered record adds (AliasSpan's more_spans): each is checked as AliasSpan
	 * checks it, or the allocation is not taken. */
	al = (struct adopted_allocation){ .offset = 2 * MiB, .length = 4096, .session = 1, .pid = 1,
					  .alias = 0x7e0000000000ull, .alias_access = 3,
					  .span_offset = 100, .span_length = 1000, .n_more_spans = 1,
					  .more_spans = { 1050, 100 } };
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EINVAL); /* over the first */
	al.more_spans[0] = 4000;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EINVAL); /* past its end */
	al.more_spans[0] = UINT64_MAX;
	al.more_spans[1] = 2;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EINVAL); /* offset + length wraps */
	al.more_spans[0] = 2000;
	al.more_spans[1] = 100;
	al.n_more_spans = 2;
	al.more_spans[2] = 2050;
	al.more_spans[3] = 10;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EINVAL); /* over each other */
	al.n_more_spans = 1;
	al.alias = 0;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), -EINVAL); /* no alias */
	al.alias = 0x7e0000000000ull;
	ck_assert_int_eq(domain_adopt_allocation(d, a, &al), 0);
	ck_assert_int_eq(arena_adopt_finish(a), 0);
	ck_assert_uint_eq(a->buddy.free_pages, (63 * MiB - 4096) / 4096);
	handover_end_grace(td_manager);
	ck_assert_uint_eq(td_manager->core.n_domains, 0);
}
END_TEST

/* Which process a pid names: the same one, another one started later, a zombie, none. */
START_TEST(test_process_identity)
{
	uint64_t self = process_start_time(getpid());
	char path[64], state = 0;
	pid_t child;

	ck_assert_uint_ne(self, 0);
	ck_assert(!process_gone(getpid(), getuid(), self));
	ck_assert(process_gone(getpid(), getuid(), self + 1));
	ck_assert(!process_gone(getpid(), getuid(), 0));
	ck_assert(process_gone(getpid(), getuid() + 1, 0));
	ck_assert(!process_gone(0, getuid(), 0)); /* one mrd cannot see: taken as alive */
	ck_assert(process_gone(dead_pid(), getuid(), 0));

	child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0)
		_exit(0);
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)child);
	for (double t0 = test_now_s(); state != 'Z' && test_now_s() - t0 < TEST_WAIT_S;) {
		FILE *f = fopen(path, "re");
		char buf[512], *p = NULL;

		if (f && fgets(buf, sizeof(buf), f))
			p = strrchr(buf, ')');
		if (f)
			fclose(f);
		state = p ? p[2] : 0;
		if (state != 'Z')
			usleep(1000);
	}
	ck_assert_int_eq(state, 'Z');
	ck_assert(process_gone(child, getuid(), 0)); /* a zombie maps nothing */
	ck_assert_int_eq(waitpid(child, NULL, 0), child);
	ck_assert(process_gone(child, getuid(), 0));
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
static void adopt_copy(struct fd_list *saved)
{
	struct fd_list copy = { .names = saved->names, .n = saved->n };
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
/* The first bytes of the memfd's pages, as fill() left them at offset 0 (any seed). */
static void check_memfd_filled(int fd)
{
	uint8_t first = 0, second = 0;

	ck_assert_int_eq(pread(fd, &first, 1, 0), 1);
	ck_assert_int_eq(pread(fd, &second, 1, 4096), 1);
	ck_assert_msg(first != 0 && second == (uint8_t)(first + 1), "memfd content lost");
}

START_TEST(test_untrusted_state_dropped)
{
	int a = td_hello_client(1000, NULL), c = td_hello_client(2000, NULL), b, fd;
	uint64_t a1 = td_alloc(a, 2, 1 * MiB), c1 = td_alloc(c, 2, 1 * MiB), b1, instance;
	struct fd_list saved, garbage = {};
	char *name;
	unsigned n;

	fill(a1, 1 * MiB, 5);
	fill(c1, 1 * MiB, 7);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	ck_assert_uint_eq(saved.n, 3);
	close(a);
	close(c);
	td_manager->core.window.keep_content = true;
	td_stop();
	td_start(settings);
	instance = td_manager->instance;

	fd = state_fd("not a state", 11);
	garbage.fds = &fd;
	garbage.names = (char *[]){ (char *)HANDOVER_STATE_NAME };
	garbage.n = 1;
	ck_assert_int_eq(handover_adopt(td_manager, &garbage), 0);
	ck_assert_int_eq(fd, -1);
	ck_assert_uint_eq(td_manager->core.n_domains, 0);

	/* Its second arena passed under another name: the first one, taken already with its
	 * allocation, goes again untouched. */
	name = saved.names[2];
	saved.names[2] = (char *)HANDOVER_ARENA_PREFIX "999999";
	adopt_copy(&saved);
	saved.names[2] = name;
	ck_assert_uint_eq(td_manager->core.n_domains, 0);
	ck_assert_uint_eq(td_manager->instance, instance);
	check_memfd_filled(saved.fds[1]);
	check_memfd_filled(saved.fds[2]);

	/* A slot taken by another domain's arena, which stays unharmed. */
	b = td_hello_client(3000, NULL);
	b1 = td_alloc(b, 2, 1 * MiB);
	ck_assert_uint_eq(b1, a1);
	fill(b1, 1 * MiB, 6);
	adopt_copy(&saved);
	ck_assert_uint_eq(td_manager->core.n_domains, 1);
	ck_assert_uint_eq(td_manager->instance, instance);
	check_fill(b1, 1 * MiB, 6);
	close(b);
	td_pump();
	ck_assert_uint_eq(td_manager->core.n_domains, 0);

	/* None of that touched the memfds: with the slot free again, it all comes back. */
	adopt_copy(&saved);
	ck_assert_uint_eq(td_manager->core.n_domains, 2);
	ck_assert_uint_ne(td_manager->instance, instance);
	check_fill(a1, 1 * MiB, 5);
	check_fill(c1, 1 * MiB, 7);
	fd_list_done(&saved);
}
END_TEST

/* A state that cannot be taken over still leaves each saved domain's generation as a floor:
 * the previous mrd's clients cached keys under it, so the domain opened anew starts above it
 * (core/domain-handover.c records the floors before it adopts anything). */
START_TEST(test_failed_adoption_keeps_floors)
{
	int a = td_hello_client(1000, NULL);
	struct fd_list saved;
	uint64_t generation;
	char *name;
	unsigned n;

	td_alloc(a, 2, 1 * MiB);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	ck_assert_uint_eq(saved.n, 2);
	generation = td_find_domain("uid-1000")->mem.status.page->generation;
	close(a);
	td_manager->core.window.keep_content = true;
	td_stop();
	td_start(settings);

	/* Its arena passed under another name: nothing is taken over. */
	name = saved.names[1];
	saved.names[1] = (char *)HANDOVER_ARENA_PREFIX "999999";
	adopt_copy(&saved);
	saved.names[1] = name;
	ck_assert_uint_eq(td_manager->core.n_domains, 0);

	a = td_hello_client(1000, NULL);
	td_alloc(a, 2, 4096);
	ck_assert_uint_gt(td_find_domain("uid-1000")->mem.status.page->generation, generation);
	close(a);
	fd_list_done(&saved);
}
END_TEST

/* A client may seal its attached memfd against writes after attaching it (its own file): the
 * next mrd cannot map that one, and drops it alone; everyone else's memory comes back. */
START_TEST(test_sealed_attachment_dropped_alone)
{
	int a = td_hello_client(1000, NULL), b = td_hello_client(2000, NULL);
	uint64_t a1 = td_alloc(a, 2, 1 * MiB), b1 = td_alloc(b, 2, 2 * MiB), ext;
	int memfd = td_attach_sealed(a, 3, 8 * 4096, &ext);
	struct fd_list saved;
	struct domain *d;
	unsigned n;

	fill(a1, 1 * MiB, 1);
	fill(b1, 2 * MiB, 2);
	fill(ext, 8 * 4096, 3);
	/* mrd's mapping stays writable; only new writable mappings are refused from now on. */
	ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	ck_assert_uint_eq(n, 3);
	close(a);
	close(b);
	restart(&saved);
	for (size_t i = 0; i < saved.n; i++)
		ck_assert_int_eq(saved.fds[i], -1); /* the refused one is closed too */
	fd_list_done(&saved);

	ck_assert_uint_eq(td_manager->core.n_domains, 2);
	d = td_find_domain("uid-1000");
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->mem.n_orphans, 1); /* its plain allocation waits; the attachment went */
	ck_assert_uint_eq(d->mem.allocated_bytes, 1 * MiB);
	check_fill(a1, 1 * MiB, 1);
	d = td_find_domain("uid-2000");
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->mem.n_orphans, 1);
	ck_assert_uint_eq(d->mem.allocated_bytes, 2 * MiB);
	check_fill(b1, 2 * MiB, 2);
	/* The attached memfd's content is the client's still. */
	for (uint64_t i = 0; i < 8 * 4096; i += 4096) {
		uint8_t v = 0;

		ck_assert_int_eq(pread(memfd, &v, 1, (off_t)i), 1);
		ck_assert_uint_eq(v, (uint8_t)(3 + i / 4096));
	}
	close(memfd);
	handover_end_grace(td_manager);
	ck_assert_uint_eq(td_manager->core.n_domains, 0);
}
END_TEST

/* A client leaving with many MRs, and a mempool of as many, frees them a share a turn
 * (core/domain.h): a hand-over in the middle saves none of them (they are nobody's to take
 * back), and a shutdown in the middle frees the rest (the sanitizers' leak check sees it). */
static unsigned n_pool_mrs(const struct domain *d)
{
	const struct pool_mr *mr;
	unsigned n = 0;

	LIST_FOREACH(mr, &d->reg.mempools.mrs, link)
		n++;
	return n;
}

static bool leaving_none(const struct domain *d)
{
	return LIST_EMPTY(&d->leaving.pools) && LIST_EMPTY(&d->leaving.mem.allocations);
}

static struct domain *leave_with_mrs(unsigned n, uint64_t *kept, struct client **ret_b,
				     int *ret_b_fd)
{
	struct client *ca;
	int a = td_hello_client(1000, &ca), b = td_hello_client(1000, ret_b);
	uint64_t pool, starts[64], lengths[64];
	struct domain *d;

	ck_assert_uint_le(n, 64);
	for (unsigned i = 0; i < n; i++)
		td_lookup(a, 10 + 2 * i, td_alloc(a, 11 + 2 * i, 4096), 0, NULL);
	/* A pool MR a page, none touching another. */
	pool = td_alloc(a, 3, 2 * n * 4096);
	for (unsigned i = 0; i < n; i++) {
		starts[i] = pool + 2 * i * 4096;
		lengths[i] = 4096;
	}
	td_send_mempool_register(a, 4, "leaver", starts, lengths, n, true);
	mrd__response__free_unpacked(td_expect(a, 4, 0), NULL);
	*kept = td_alloc(b, 2, 4096);
	d = td_find_domain("uid-1000");
	ck_assert_uint_eq(d->reg.cache.n_mrs, n);
	ck_assert_uint_eq(n_pool_mrs(d), n);
	client_free(ca);
	close(a);
	/* A share went at once (pool MRs first); the rest waits for the loop's next turns. */
	ck_assert_uint_gt(n_pool_mrs(d), 0);
	ck_assert_uint_lt(n_pool_mrs(d), n);
	ck_assert_uint_eq(d->mem.allocations.n, n + 2);
	ck_assert(!LIST_EMPTY(&d->leaving.pools));
	ck_assert(!LIST_EMPTY(&d->leaving.mem.allocations));
	if (ret_b_fd)
		*ret_b_fd = b;
	return d;
}

START_TEST(test_save_while_a_client_leaves)
{
	struct fd_list saved;
	uint64_t kept;
	struct domain *d = leave_with_mrs(64, &kept, NULL, NULL);
	unsigned n;

	ck_assert_int_eq(handover_save(td_manager, &saved, &n), 0);
	ck_assert_uint_eq(n, 1); /* b's alone */
	ck_assert(leaving_none(d));
	ck_assert_uint_eq(d->mem.allocations.n, 1);
	ck_assert_uint_eq(d->reg.cache.n_mrs, 0);
	ck_assert_uint_eq(n_pool_mrs(d), 0);
	ck_assert_uint_eq(d->reg.mempools.n_regs, 0);
	ck_assert_ptr_nonnull(domain_find_allocation(d, kept));
	fd_list_done(&saved);
}
END_TEST

START_TEST(test_leaving_ends_on_its_own_or_at_shutdown)
{
	struct client *cb;
	uint64_t kept;
	int b;
	struct domain *d = leave_with_mrs(64, &kept, &cb, &b);
	struct allocation *last = LIST_FIRST(&d->leaving.mem.allocations);
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolsRequest q = MRD__MEMPOOLS_REQUEST__INIT;
	Mrd__Response *resp;

	/* Nobody else frees what is left of it meanwhile (the last to go: turns pass), and its
	 * mempool is still listed, as nobody's (asked at once: the turns end it). */
	while (LIST_NEXT(last, owner_link))
		last = LIST_NEXT(last, owner_link);
	td_send_free(b, 3, allocation_address(last));
	req.id = 5;
	req.body_case = MRD__REQUEST__BODY_MEMPOOLS;
	req.mempools = &q;
	td_send_request(b, &req, NULL, 0);
	resp = td_expect(b, 3, EPERM);
	ck_assert_ptr_nonnull(strstr(resp->message, "belongs to a client that left; it is being "
					"freed"));
	mrd__response__free_unpacked(resp, NULL);
	resp = td_expect(b, 5, 0);
	ck_assert_uint_eq(resp->mempools->n_mempools, 1);
	ck_assert_int_eq(resp->mempools->mempools[0]->pid, 0);
	ck_assert_str_eq(resp->mempools->mempools[0]->client_name, "(left)");
	ck_assert_uint_lt(resp->mempools->mempools[0]->n_mrs, 64);
	mrd__response__free_unpacked(resp, NULL);
	/* The loop works through it, turn by turn. */
	td_pump_until(leaving_none(d));
	ck_assert(leaving_none(d));
	ck_assert_uint_eq(d->mem.allocations.n, 1);
	ck_assert_uint_eq(d->reg.cache.n_mrs, 0);
	ck_assert_uint_eq(n_pool_mrs(d), 0);
	ck_assert_uint_eq(d->reg.mempools.n_regs, 0);
	client_free(cb); /* its one allocation goes at once: a share is one at least */
	ck_assert_ptr_null(td_find_domain("uid-1000"));
	/* Another leaves, and the last client after it: what is left holds the domain open, and
	 * mrd stops in the middle (the fixture's td_stop). */
	d = leave_with_mrs(64, &kept, &cb, NULL);
	client_free(cb);
	ck_assert_ptr_eq(td_find_domain("uid-1000"), d);
	ck_assert_uint_eq(d->n_users, 0);
	ck_assert(!LIST_EMPTY(&d->leaving.pools));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("handover");
	TCase *tc = tcase_create("handover");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_alias_kept);
	tcase_add_test(tc, test_waits_for_live_process);
	tcase_add_test(tc, test_claim_checks_uid);
	tcase_add_test(tc, test_exported_contexts_handed_over);
	tcase_add_test(tc, test_mempool_over_waiting);
	tcase_add_test(tc, test_adopt_checks);
	tcase_add_test(tc, test_process_identity);
	tcase_add_test(tc, test_untrusted_state_dropped);
	tcase_add_test(tc, test_failed_adoption_keeps_floors);
	tcase_add_test(tc, test_sealed_attachment_dropped_alone);
	tcase_add_test(tc, test_save_while_a_client_leaves);
	tcase_add_test(tc, test_leaving_ends_on_its_own_or_at_shutdown);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
