/* SPDX-License-Identifier: MIT */
/* mrd_mem_adopt(3) against a real mrd: heap memory (malloc'd, page-aligned or not) moved onto
 * mrd's memory at its own address keeps its bytes and gets keys at the program's addresses
 * (mrd_keys_query, mrd_cache_keys, an mrd_dma between two adopted buffers); a writer thread
 * writing a counter sequence while its pages move (either way) loses no write; another
 * process gets no keys of it; close and fork leave the program private memory with its bytes;
 * the errors (NULL, length 0, unmapped, mrd's memory already, inside an adopted buffer, not
 * private memory, the quota). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "client/handle.h"
#include "client/write-hold.h"
#include "check-run.h"
#include "test-util.h"

#define PAGE 4096ul
#define MiB (1ul << 20)

static struct mrd_proc mrd;
static mrd_client *c;

static void setup(void)
{
	int r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\narena_size = 64M\n"
				     "[quota]\nallocated_bytes = 48M\n", NULL);

	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
	r = mrd_client_connect(mrd.socket, &c);
	ck_assert_msg(r == 0, "connect: %s (%s)", strerror(-r), mrd_last_error());
}

static void teardown(void)
{
	c = mrd_client_close(c);
	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}

static void fill(char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)(i * 7 + seed);
}

static bool same(const char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (char)(i * 7 + seed))
			return false;
	return true;
}

static void adopt_ok(void *p, size_t n)
{
	int r = mrd_mem_adopt(c, p, n, 0);

	ck_assert_msg(r == 0, "adopt %p +%zu: %s (%s)", p, n, strerror(-r), mrd_last_error());
}

/* Whether the page holding p is a shared mapping (mrd's memory) in this process. */
static bool shared_page(const void *p)
{
	char line[512];
	uintptr_t a = (uintptr_t)p, lo, hi;
	char perms[8] = "";
	bool shared = false;
	FILE *f = fopen("/proc/self/maps", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= a && a < hi)
			shared = perms[3] == 's';
	fclose(f);
	return shared;
}

START_TEST(test_heap_gets_keys_and_dma)
{
	size_t n = 10000, m = 64 * 1024;
	char *src = malloc(n), *dst = NULL;
	struct mrd_keys ks, kd, kc;
	mrd_cache *cache;

	ck_assert_ptr_nonnull(src);
	ck_assert_int_eq(posix_memalign((void **)&dst, PAGE, m), 0);
	fill(src, n, 1);
	memset(dst, 0, m);
	adopt_ok(src, n); /* not page-aligned: its pages move, its bytes alone get MRs */
	adopt_ok(dst, m);
	ck_assert(same(src, n, 1));
	ck_assert(shared_page(src) && shared_page(dst));

	ck_assert_msg(mrd_keys_query(c, src, &ks) == 0, "%s", mrd_last_error());
	ck_assert_msg(ks.start <= (uintptr_t)src && ks.end >= (uintptr_t)src + n,
		      "keys [%#lx, %#lx) do not cover the buffer at %p", ks.start, ks.end, src);
	ck_assert_int_eq(mrd_keys_query(c, src + n - 1, &kc), 0);
	ck_assert_uint_eq(kc.lkey, ks.lkey);
	ck_assert_msg(mrd_keys_query(c, dst, &kd) == 0, "%s", mrd_last_error());
	/* Keys at the program's addresses: a DMA between the two buffers by them. */
	ck_assert_msg(mrd_dma(c, MRD_DMA_WRITE, ks.lkey, src, kd.rkey, dst + 100, n) == 0, "dma: %s",
		      mrd_last_error());
	ck_assert(same(dst + 100, n, 1));
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_READ, ks.lkey, src, kd.rkey, dst + 50000, 64), 0);
	for (int i = 0; i < 64; i++) /* dst[50000..] is 0 */
		ck_assert_int_eq(src[i], 0);

	/* The cache: a miss asks mrd (at mrd's address), a hit is the program's. */
	ck_assert_int_eq(mrd_cache_new(c, &cache), 0);
	ck_assert_int_eq(mrd_cache_keys(cache, dst + 10, &kc), 0);
	ck_assert_uint_eq(kc.rkey, kd.rkey);
	ck_assert_int_eq(mrd_cache_keys(cache, dst + 20, &kc), 0);
	ck_assert_uint_eq(mrd_cache_asked(cache), 1);
	ck_assert_uint_eq(mrd_cache_lkey(cache, dst + 30), kd.lkey);
	/* Range and batched lookups at the program's addresses too. */
	{
		char *in = dst + 4 * PAGE; /* past what dst + 100 holds */
		const void *addrs[2] = { src, in };
		const size_t lens[2] = { n, m - 4 * PAGE };
		struct mrd_keys kb[2], kr;
		int errs[2];

		ck_assert_msg(mrd_keys_query_range(c, in, 8 * PAGE, &kr) == 0, "%s",
			      mrd_last_error());
		ck_assert(kr.start <= (uintptr_t)in && kr.end >= (uintptr_t)in + 8 * PAGE);
		ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, ks.lkey, src, kr.rkey, in, n), 0);
		ck_assert(in[0] == 0 && same(in + 64, n - 64, 1 + 64 * 7)); /* src[0, 64) read 0s */
		ck_assert_int_eq(mrd_cache_keys_range(cache, in, 8 * PAGE, &kc), 0);
		ck_assert(kc.start <= (uintptr_t)in && kc.end >= (uintptr_t)in + 8 * PAGE);
		ck_assert_int_eq(mrd_keys_query_batch(c, addrs, lens, 2, kb, errs), 2);
		ck_assert(kb[0].start <= (uintptr_t)src && kb[0].end >= (uintptr_t)src + n);
		ck_assert(kb[1].start <= (uintptr_t)in && kb[1].end >= (uintptr_t)dst + m);
	}

	/* The same buffer again: counted, nothing moves; given back twice. */
	adopt_ok(dst, m);
	ck_assert_int_eq(mrd_mem_unadopt(c, dst), 0);
	ck_assert_int_eq(mrd_keys_query(c, dst, &kc), 0);
	ck_assert_int_eq(mrd_mem_unadopt(c, dst), 0);
	ck_assert_int_eq(mrd_mem_unadopt(c, dst), -ENOENT);
	/* Given back: private memory with its bytes, no keys, none cached either. */
	ck_assert(!shared_page(dst));
	ck_assert(same(dst + 100, n, 1));
	ck_assert_int_eq(mrd_keys_query(c, dst, &kc), -ENOENT);
	ck_assert_uint_eq(mrd_cache_lkey(cache, dst + 30), MRD_KEY_INVALID);
	ck_assert_int_eq(mrd_mem_unadopt(c, src), 0);
	ck_assert(src[0] == 0 && same(src + 64, n - 64, 1 + 64 * 7));
	mrd_cache_free(cache);
	free(src);
	free(dst);
}
END_TEST

/* Two malloc'd buffers on one page (heap neighbours): each its own span, its own MR. */
START_TEST(test_heap_neighbours)
{
	char *page = NULL, *a, *b;
	struct mrd_keys ka, kb;

	ck_assert_int_eq(posix_memalign((void **)&page, PAGE, 4 * PAGE), 0);
	a = page + 16;
	b = page + 2 * PAGE + 64;
	fill(page, 4 * PAGE, 3);
	adopt_ok(a, 2 * PAGE);
	adopt_ok(b, 1000);
	ck_assert(same(page, 4 * PAGE, 3));
	ck_assert_int_eq(mrd_keys_query(c, a, &ka), 0);
	ck_assert_int_eq(mrd_keys_query(c, b, &kb), 0);
	ck_assert_uint_ne(ka.rkey, kb.rkey);
	ck_assert(ka.end <= (uintptr_t)b);
	ck_assert_int_eq(mrd_mem_adopt(c, b + 10, 10, 0), -EEXIST);
	ck_assert_int_eq(mrd_mem_unadopt(c, a), 0);
	ck_assert_int_eq(mrd_keys_query(c, b, &kb), 0);
	ck_assert_int_eq(mrd_mem_unadopt(c, b), 0);
	ck_assert(same(page, 4 * PAGE, 3));
	free(page);
}
END_TEST

START_TEST(test_errors)
{
	char *p = malloc(3 * PAGE), stack[64];
	void *mine, *hole;
	int fd;

	ck_assert_int_eq(mrd_mem_adopt(NULL, p, 10, 0), -EINVAL);
	ck_assert_int_eq(mrd_mem_adopt(c, NULL, 10, 0), -EINVAL);
	ck_assert_int_eq(mrd_mem_adopt(c, p, 0, 0), -EINVAL);
	ck_assert_int_eq(mrd_mem_adopt(c, p, 10, 0x100), -EINVAL);
	ck_assert_int_eq(mrd_mem_adopt(c, p, SIZE_MAX, 0), -EINVAL);
	ck_assert_int_eq(mrd_mem_unadopt(NULL, p), -EINVAL);
	ck_assert_int_eq(mrd_mem_unadopt(c, p), -ENOENT);
	/* Not owned: nothing mapped there. */
	hole = mmap(NULL, 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(hole, MAP_FAILED);
	munmap(hole, 2 * PAGE);
	ck_assert_int_eq(mrd_mem_adopt(c, hole, PAGE, 0), -EFAULT);
	ck_assert_msg(strstr(mrd_last_error(), "not all mapped"), "%s", mrd_last_error());
	/* mrd's memory already. */
	ck_assert_int_eq(mrd_mem_alloc(c, PAGE, 0, 0, &mine), 0);
	ck_assert_int_eq(mrd_mem_adopt(c, mine, 100, 0), -EEXIST);
	ck_assert_msg(strstr(mrd_last_error(), "mrd's memory already"), "%s", mrd_last_error());
	ck_assert_int_eq(mrd_mem_free(c, mine), 0);
	/* Adopted already: a part of it. */
	adopt_ok(p, 3 * PAGE);
	ck_assert_int_eq(mrd_mem_adopt(c, p + 10, 10, 0), -EEXIST);
	ck_assert_int_eq(mrd_mem_unadopt(c, p + 10), -ENOENT);
	ck_assert_int_eq(mrd_mem_unadopt(c, p), 0);
	/* No private anonymous memory: a file's pages, the caller's own stack. */
	fd = memfd_create("adopt-shared", MFD_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, PAGE), 0);
	hole = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(hole, MAP_FAILED);
	ck_assert_int_eq(mrd_mem_adopt(c, hole, PAGE, 0), -EOPNOTSUPP);
	munmap(hole, PAGE);
	close(fd);
	ck_assert_int_eq(mrd_mem_adopt(c, stack, sizeof(stack), 0), -EOPNOTSUPP);
	free(p);
}
END_TEST

START_TEST(test_quota)
{
	size_t n = 56 * MiB; /* [quota] allocated_bytes = 48M */
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert_ptr_ne(p, MAP_FAILED);
	p[0] = 'q';
	ck_assert_int_eq(mrd_mem_adopt(c, p, n, 0), -EDQUOT);
	ck_assert_msg(strstr(mrd_last_error(), "allocated_bytes"), "%s", mrd_last_error());
	ck_assert(!shared_page(p) && p[0] == 'q'); /* left as it was */
	munmap(p, n);
}
END_TEST

/* Closing the handle (or mrd going away with it) gives the pages back: the program keeps its
 * memory and its bytes, private again. */
START_TEST(test_close_gives_back)
{
	char *p = malloc(5 * PAGE);

	fill(p, 5 * PAGE, 9);
	adopt_ok(p, 5 * PAGE);
	c = mrd_client_close(c);
	ck_assert(!shared_page(p + PAGE));
	ck_assert(same(p, 5 * PAGE, 9));
	p[7] = 1; /* writable, no SIGBUS */
	free(p);
}
END_TEST

/* A child of fork() gets its own copy; the parent's pages stay mrd's and its. */
START_TEST(test_fork_child_copy)
{
	char *p = malloc(2 * PAGE);
	struct mrd_keys k;
	int status;
	pid_t pid;

	fill(p, 2 * PAGE, 5);
	adopt_ok(p, 2 * PAGE);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		bool ok = same(p, 2 * PAGE, 5) && !shared_page(p);

		memset(p, 0, 2 * PAGE);
		_exit(ok ? 0 : 1);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
	ck_assert(same(p, 2 * PAGE, 5));
	ck_assert_int_eq(mrd_keys_query(c, p, &k), 0);
	ck_assert_int_eq(mrd_mem_unadopt(c, p), 0);
	free(p);
}
END_TEST

/* Another process of the domain gets no keys of an adopted buffer: they use addresses only
 * its owner maps. */
START_TEST(test_other_process_gets_no_keys)
{
	char *p = malloc(PAGE);
	struct mrd_keys k;
	uintptr_t window;
	int status;
	pid_t pid;

	adopt_ok(p, PAGE);
	ck_assert_int_eq(mrd_keys_query(c, p, &k), 0);
	window = c->adopted.v[0]->window + ((uintptr_t)p - c->adopted.v[0]->start);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		mrd_client *o = NULL;
		int r = mrd_client_connect(mrd.socket, &o);

		if (r == 0)
			r = mrd_mem_map(o, (void *)window);
		if (r == 0)
			r = mrd_keys_query(o, (void *)window, &k);
		fprintf(stderr, "another process's lookup: %s (%s)\n", strerror(-r),
			mrd_last_error());
		if (r != -EACCES || !strstr(mrd_last_error(), "mrd_mem_adopt"))
			_exit(1);
		/* A range lookup is refused alike. */
		r = mrd_keys_query_range(o, (void *)window, 64, &k);
		fprintf(stderr, "another process's range lookup: %s (%s)\n", strerror(-r),
			mrd_last_error());
		_exit(r == -EACCES && strstr(mrd_last_error(), "mrd_mem_adopt") ? 0 : 2);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	ck_assert_int_eq(mrd_mem_unadopt(c, p), 0);
	free(p);
}
END_TEST

/* A writer thread writes 1, 2, 3, ... into consecutive slots of the buffer while its pages
 * move onto mrd's (or back): every value must be there after. Big enough that the copy and
 * the writer overlap on a loaded 2-core machine. */
#define SLOTS (24 * MiB / sizeof(uint64_t))
#define TRIES 6

struct writer {
	uint64_t *slots;
	size_t done; /* atomic: slots written */
};

static void *write_counter(void *arg)
{
	struct writer *w = arg;

	for (size_t i = 0; i < SLOTS; i++) {
		__atomic_store_n(&w->slots[i], i + 1, __ATOMIC_RELAXED);
		__atomic_store_n(&w->done, i + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static void wait_past(struct writer *w, size_t n)
{
	while (__atomic_load_n(&w->done, __ATOMIC_ACQUIRE) < n)
		sched_yield();
}

/* One try: back true to move back under the writer, else to move there. How many slots
 * lost their value; *raced whether the writer was still writing when the move began. */
static size_t race(bool back, bool *raced)
{
	uint64_t *slots = NULL;
	struct writer w;
	pthread_t t;
	size_t lost = 0, at;

	ck_assert_int_eq(posix_memalign((void **)&slots, PAGE, SLOTS * sizeof(uint64_t)), 0);
	memset(slots, 0, SLOTS * sizeof(uint64_t));
	w = (struct writer){ slots, 0 };
	if (back)
		adopt_ok(slots, SLOTS * sizeof(uint64_t));
	ck_assert_int_eq(pthread_create(&t, NULL, write_counter, &w), 0);
	wait_past(&w, SLOTS / 64);
	at = __atomic_load_n(&w.done, __ATOMIC_ACQUIRE);
	if (back)
		ck_assert_int_eq(mrd_mem_unadopt(c, slots), 0);
	else
		adopt_ok(slots, SLOTS * sizeof(uint64_t));
	*raced = __atomic_load_n(&w.done, __ATOMIC_ACQUIRE) > at &&
		 __atomic_load_n(&w.done, __ATOMIC_ACQUIRE) < SLOTS;
	pthread_join(t, NULL);
	for (size_t i = 0; i < SLOTS; i++)
		lost += slots[i] != i + 1;
	if (!back)
		ck_assert_int_eq(mrd_mem_unadopt(c, slots), 0);
	free(slots);
	return lost;
}

START_TEST(test_writer_loses_nothing)
{
	size_t lost_there = 0, lost_back = 0;
	int raced = 0;

	if (write_hold_reach() == WRITE_HOLD_NONE) {
		fprintf(stderr, "skipped: no userfaultfd here can hold writers off\n");
		return;
	}
	for (int i = 0; i < TRIES; i++) {
		bool r1, r2;

		lost_there += race(false, &r1);
		lost_back += race(true, &r2);
		raced += r1 + r2;
	}
	fprintf(stderr, "writer: %d of %d moves raced the writer\n", raced, 2 * TRIES);
	ck_assert_msg(lost_there == 0 && lost_back == 0,
		      "writes lost: %zu slots moving there, %zu moving back", lost_there,
		      lost_back);
}
END_TEST

/* mrctl dump shows no one but the adopting process (and an administrator) an adopted buffer's
 * keys: another process of the domain (here of uid 65534, not admin) sees MRD_KEY_INVALID
 * where MrLookup would refuse it (review of issue 40: it read the buffer with mrd_dma). */
START_TEST(test_dump_hides_adopted_keys)
{
	uid_t uid = geteuid() == 0 ? 65534 : geteuid();
	char tool[512], out[1 << 16], rkey[48];
	int there[2], back[2], status;
	struct mrd_keys k = { 0 };
	pid_t pid;

	ck_assert_int_eq(pipe2(there, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(back, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) { /* the adopting process */
		mrd_client *own = NULL;
		char *p = NULL, go;
		int r = 0;

		if (geteuid() == 0 && (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0))
			_exit(126);
		if (posix_memalign((void **)&p, PAGE, 16 * PAGE) != 0)
			_exit(125);
		memset(p, 'a', 16 * PAGE);
		r = mrd_client_connect(mrd.socket, &own);
		if (r == 0)
			r = mrd_mem_adopt(own, p, 16 * PAGE, 0);
		if (r == 0)
			r = mrd_keys_query(own, p, &k);
		if (write(there[1], &k, sizeof(k)) != (ssize_t)sizeof(k))
			_exit(124);
		(void)read(back[0], &go, 1); /* until the dump was read */
		_exit(r == 0 ? 0 : 1);
	}
	ck_assert_int_eq(read(there[0], &k, sizeof(k)), (ssize_t)sizeof(k));
	ck_assert_uint_ne(k.rkey, 0);
	{
		const char *argv[] = { test_build_path("mrctl", tool, sizeof(tool)), "--socket",
				       mrd.socket, "--json", "dump", NULL };

		ck_assert_int_eq(run_capture(argv, out, sizeof(out), geteuid() == 0 ? uid : (uid_t)-1),
				 0);
	}
	snprintf(rkey, sizeof(rkey), "\"rkey\":%u,", k.rkey);
	ck_assert_msg(!strstr(out, rkey), "another process of the domain sees the adopted "
		      "buffer's rkey %u: %s", k.rkey, out);
	ck_assert_msg(strstr(out, "\"rkey\":4294967295"), "no MR shown: %s", out);
	ck_assert_int_eq(write(back[1], "x", 1), 1);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	close(there[0]), close(there[1]), close(back[0]), close(back[1]);
}
END_TEST

/* File-backed shared memory: a /dev/shm file (no seal possible) is refused, as is a memfd not
 * sealed against shrinking and a file elsewhere than tmpfs or hugetlbfs; mrd lives on. */
START_TEST(test_shm_file_attach)
{
	char name[64], *w;
	struct statfs sfs;
	int fd, r;

	snprintf(name, sizeof(name), "/mrd-adopt-test-%d", (int)getpid());
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	shm_unlink(name);
	ck_assert_int_eq(ftruncate(fd, (off_t)MiB), 0);
	/* It can never be sealed: one shrunk under mrd would be lost, with every domain's
	 * memory, at mrd's next warm restart (its size no longer fits the hand-over). */
	r = mrd_extmem_attach(c, fd, 0, MiB, (void **)&w);
	ck_assert_msg(r == -EPERM, "attach of a /dev/shm file: %s (%s)", strerror(-r),
		      mrd_last_error());
	ck_assert_msg(strstr(mrd_last_error(), "F_SEAL_SHRINK"), "%s", mrd_last_error());
	ck_assert_int_eq(mrd_client_ping(c), 0);
	close(fd);

	fd = memfd_create("adopt-sealable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)MiB), 0);
	ck_assert_int_eq(mrd_extmem_attach(c, fd, 0, MiB, (void **)&w), -EPERM);
	ck_assert_msg(strstr(mrd_last_error(), "F_SEAL_SHRINK"), "%s", mrd_last_error());
	close(fd);

	fd = open("adopt-plain-file", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	unlink("adopt-plain-file");
	ck_assert_int_eq(ftruncate(fd, (off_t)MiB), 0);
	ck_assert_int_eq(fstatfs(fd, &sfs), 0);
	if (sfs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
		ck_assert_int_eq(mrd_extmem_attach(c, fd, 0, MiB, (void **)&w), -EBADF);
		ck_assert_msg(strstr(mrd_last_error(), "tmpfs or hugetlbfs"), "%s",
			      mrd_last_error());
	}
	close(fd);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("adopt");
	TCase *tc = tcase_create("adopt");

	signal(SIGPIPE, SIG_IGN);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_heap_gets_keys_and_dma);
	tcase_add_test(tc, test_heap_neighbours);
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, test_quota);
	tcase_add_test(tc, test_close_gives_back);
	tcase_add_test(tc, test_fork_child_copy);
	tcase_add_test(tc, test_other_process_gets_no_keys);
	tcase_add_test(tc, test_dump_hides_adopted_keys);
	tcase_add_test(tc, test_writer_loses_nothing);
	tcase_add_test(tc, test_shm_file_attach);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
