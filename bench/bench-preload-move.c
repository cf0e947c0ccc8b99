/* SPDX-License-Identifier: MIT */
/* libmrd-preload.so's move of a buffer's pages onto mrd's memory and back, with writes held
 * off while the pages are copied (write-hold.h, issue 38), against the move before it: the
 * same steps (Alloc, copy, swap; copy back, swap, free) without the hold, interleaved in the
 * same run, at 4 KiB and 1 MiB. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "bench-util.h"
#include "client/memory.h"
#include "client/address-space.h"
#include "client/moved-range.h"
#include "client/write-hold.h"
#include "test-util.h"

#define REPS 7
#define RW 7u
#define PIECES 4

static mrd_client *mem;
static struct moved_ranges ranges;

/* The move as it was: Alloc, copy, swap, page tables for the alias. */
static int old_move(uintptr_t start, size_t len, void **window)
{
	char why[128];
	int k = address_space_movable(start, start + len, why, sizeof(why));

	if (k == 0)
		k = memory_alloc_alias(mem, len, start, RW, 0, len, window);
	if (k < 0)
		return k;
	memcpy(*window, (void *)start, len);
	if ((void *)syscall(SYS_mremap, *window, 0, len, MREMAP_MAYMOVE | MREMAP_FIXED,
			    (void *)start) != (void *)start)
		return -errno;
	return madvise((void *)start, len, MADV_POPULATE_READ) < 0 ? -errno : 0;
}

/* And back: copy each piece still mapped aside, swap it in, free mrd's memory. */
static int old_back(uintptr_t start, size_t len, void *window)
{
	struct alias_piece pieces[PIECES];
	int n = address_space_alias_pieces(start, start + len, (uintptr_t)window, pieces, PIECES);

	for (int i = 0; i < n; i++) {
		size_t l = pieces[i].end - pieces[i].start;
		void *tmp = mmap(NULL, l, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (tmp == MAP_FAILED)
			return -errno;
		memcpy(tmp, (void *)pieces[i].start, l);
		if ((void *)syscall(SYS_mremap, tmp, l, l, MREMAP_MAYMOVE | MREMAP_FIXED,
				    (void *)pieces[i].start) == MAP_FAILED)
			return -errno;
	}
	if (n < 0 || address_space_mapped_elsewhere((uintptr_t)window, len) != 0)
		return -EBUSY;
	return mrd_mem_free(mem, window);
}

struct times {
	double there, back; /* ns, summed over a rep */
};

static int cycle_old(char *p, size_t len, struct times *t)
{
	uint64_t t0 = bench_now_ns(), t1;
	void *window;
	int k = old_move((uintptr_t)p, len, &window);

	t1 = bench_now_ns();
	if (k == 0)
		k = old_back((uintptr_t)p, len, window);
	t->there += (double)(t1 - t0);
	t->back += (double)(bench_now_ns() - t1);
	return k;
}

static int cycle_new(char *p, size_t len, struct times *t)
{
	uint64_t t0 = bench_now_ns(), t1;
	struct moved_range *r;
	char why[256] = "";
	int k = moved_range_move(&ranges, mem, (uintptr_t)p, (uintptr_t)p + len, RW, &r, why,
				 sizeof(why));

	t1 = bench_now_ns();
	if (k < 0) {
		fprintf(stderr, "bench-preload-move: move: %s (%s)\n", strerror(-k), why);
		return k;
	}
	moved_range_move_back(&ranges, mem, r);
	t->there += (double)(t1 - t0);
	t->back += (double)(bench_now_ns() - t1);
	return 0;
}

static double median_copy(const double *v, size_t n)
{
	double d[REPS];

	memcpy(d, v, n * sizeof(*d));
	return bench_median(d, n);
}

/* REPS reps of iters cycles each way, alternating which goes first. */
static int measure(size_t len, unsigned iters, struct times *old, struct times *new)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int k = 0;

	if (p == MAP_FAILED)
		return -errno;
	memset(p, 'b', len);
	for (unsigned w = 0; w < 4 && k == 0; w++) /* warm-up */
		k = cycle_old(p, len, &(struct times){ 0 }) ?: cycle_new(p, len, &(struct times){ 0 });
	for (int rep = 0; rep < REPS && k == 0; rep++) {
		old[rep] = new[rep] = (struct times){ 0 };
		for (unsigned i = 0; i < iters && k == 0; i++)
			k = i % 2 ? cycle_old(p, len, &old[rep]) ?: cycle_new(p, len, &new[rep])
				  : cycle_new(p, len, &new[rep]) ?: cycle_old(p, len, &old[rep]);
	}
	munmap(p, len);
	return k;
}

static void report(struct bench_summary *sum, size_t *n_sum, const char *name, size_t len,
		   unsigned iters, const struct times *old, const struct times *new, bool back,
		   double target)
{
	double per_rep[REPS], o[REPS], n[REPS], ratio;

	for (int i = 0; i < REPS; i++) {
		o[i] = (back ? old[i].back : old[i].there) / iters;
		n[i] = (back ? new[i].back : new[i].there) / iters;
		per_rep[i] = n[i] / o[i];
	}
	ratio = median_copy(per_rep, REPS);
	printf("%s: ratio=%.3f (case=%s of %zu KiB with writes held off (userfaultfd reach %d) "
	       "baseline=the same steps without the hold (the move before issue 38), interleaved "
	       "reps=%d)\n", name, ratio, back ? "moved_range_move_back" : "moved_range_move",
	       len >> 10, write_hold_reach(), REPS);
	bench_print_doubles("per-rep ratio", per_rep, REPS);
	printf("  raw, median of reps: us per %s, case %.1f, baseline %.1f\n",
	       back ? "move back" : "move", median_copy(n, REPS) / 1e3, median_copy(o, REPS) / 1e3);
	bench_add_summary(sum, n_sum, name, ratio, per_rep, REPS, target, true);
}

int main(void)
{
	static const char *const mrd_args[] = { "--log-level", "warning", NULL };
	static const struct {
		const char *there, *back;
		size_t len;
		unsigned iters;
		double target;
	} sizes[] = {
		{ "preload-move-4k", "preload-move-back-4k", 4096, 400, 1.5 },
		{ "preload-move-1m", "preload-move-back-1m", 1u << 20, 40, 1.1 },
	};
	struct times old[REPS], new[REPS];
	struct bench_summary sum[4];
	static struct mrd_proc mrd;
	size_t n_sum = 0, held;
	int k;

	signal(SIGPIPE, SIG_IGN);
	if (write_hold_reach() == WRITE_HOLD_NONE) {
		printf("bench-preload-move: not measured: no userfaultfd here can hold writes off\n");
		return EXIT_SUCCESS;
	}
	k = mrd_proc_start(&mrd, "[memory]\nhugepages = no\narena_size = 64M\n", mrd_args);
	if (k == 0)
		k = mrd_client_connect(mrd.socket, &mem);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && k == 0; i++) {
		k = measure(sizes[i].len, sizes[i].iters, old, new);
		if (k == 0) {
			report(sum, &n_sum, sizes[i].there, sizes[i].len, sizes[i].iters, old, new,
			       false, sizes[i].target);
			report(sum, &n_sum, sizes[i].back, sizes[i].len, sizes[i].iters, old, new,
			       true, sizes[i].target);
		}
	}
	mem = mrd_client_close(mem);
	free(ranges.v);
	if (mrd.pid > 0)
		mrd_proc_stop(&mrd);
	if (k < 0) {
		fprintf(stderr, "bench-preload-move: %s\n", strerror(-k));
		return EXIT_FAILURE;
	}
	printf("summary (targets of issue 38's lossless move, not PERF.md's):\n");
	held = bench_print_summary(sum, n_sum);
	printf("  %zu of %zu targets hold\n", held, n_sum);
	return EXIT_SUCCESS;
}
