/* SPDX-License-Identifier: MIT */
/* The behaviour every provider owes mrd, run against soft always and against verbs where a
 * device exists (CONTRACT_PROVIDER picks; exit 77 with the reason otherwise). Cases that need
 * a capability the device lacks (ODP, moving an MR) are listed as not run. DMA runs on both:
 * soft emulates it, verbs has the device do it on loopback QPs, so there the kernel's own
 * RDMA stack judges the keys. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/provider.h"
#include "check-run.h"
#include "test-util.h"

#ifndef CONTRACT_PROVIDER
#error "build with -DCONTRACT_PROVIDER=\"soft\" or \"verbs\""
#endif

#define NPAGES 16

/* $MRD_CONTRACT_DEVICE names the device (the VM test runs rxe0 and siw0); unset: the first. */
static const char *device;
static struct provider *p;
static struct provider_pd *pd;
static uint8_t *buf_a, *buf_b;
static size_t ps;

static uint8_t *map_pages(size_t n)
{
	void *m = mmap(NULL, n * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert_ptr_ne(m, MAP_FAILED);
	memset(m, 0, n * ps);
	return m;
}

static void setup(void)
{
	int verbs_error;

	ps = (size_t)sysconf(_SC_PAGESIZE);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, device, &p, &verbs_error), 0);
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	buf_a = map_pages(NPAGES);
	buf_b = map_pages(NPAGES);
}

static void teardown(void)
{
	ck_assert_int_eq(provider_pd_free(pd), 0); /* every test deregisters what it registered */
	provider_close(p);
	munmap(buf_a, NPAGES * ps);
	munmap(buf_b, NPAGES * ps);
}

/* Soft says why it refused a DMA; a device's completion says only that it did. */
#define ck_assert_refused(got, want)                                                      \
	do {                                                                              \
		int _got = (got);                                                         \
		if (p->caps.dma_emulated)                                                 \
			ck_assert_int_eq(_got, (want));                                   \
		else                                                                      \
			ck_assert_msg(_got == (want) || _got == -EKEYREJECTED,            \
				      "DMA answered %d, not %d or -EKEYREJECTED", _got, (want)); \
	} while (0)

static struct provider_mr *reg(void *addr, size_t len, unsigned access)
{
	struct provider_mr *mr = NULL;

	ck_assert_int_eq(provider_reg(pd, addr, len, (uintptr_t)addr, access, &mr), 0);
	ck_assert_ptr_nonnull(mr);
	ck_assert_uint_eq(mr->addr, (uintptr_t)addr);
	ck_assert_uint_eq(mr->length, len);
	ck_assert_uint_eq(mr->access, access);
	return mr;
}

static uint64_t stat_pinned(void)
{
	struct provider_stats s;

	provider_stats(p, &s);
	return s.pinned_bytes;
}

#if defined(__SANITIZE_ADDRESS__)
#define MLOCK_IS_REAL false /* ASan turns mlock into a no-op */
#else
#define MLOCK_IS_REAL true
#endif

/* Locked memory of this process, from the kernel's own count. */
static uint64_t vm_locked_bytes(void)
{
	char line[256];
	unsigned long kb = 0;
	FILE *f = fopen("/proc/self/status", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %lu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

START_TEST(test_access_rules)
{
	static const unsigned bad[] = {
		MRD_ACCESS_REMOTE_WRITE,
		MRD_ACCESS_REMOTE_ATOMIC,
		MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ,
		1u << 9,
	};
	static const unsigned good[] = {
		0,
		MRD_ACCESS_LOCAL_WRITE,
		MRD_ACCESS_REMOTE_READ,
		MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ,
	};
	struct provider_mr *mr = NULL;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(provider_reg(pd, buf_a, ps, (uintptr_t)buf_a, bad[i], &mr), -EINVAL);
	ck_assert_ptr_null(mr);
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		ck_assert_int_eq(provider_dereg(reg(buf_a, ps, good[i])), 0);
}
END_TEST

START_TEST(test_lengths)
{
	struct provider_mr *mr = NULL;

	ck_assert_int_eq(provider_reg(pd, buf_a, 0, (uintptr_t)buf_a, 0, &mr), -EINVAL);
	if (p->caps.max_mr_size < UINT64_MAX / 2)
		ck_assert_int_eq(provider_reg(pd, buf_a, (size_t)p->caps.max_mr_size + 1,
					      (uintptr_t)buf_a, 0, &mr), -EINVAL);
	ck_assert_ptr_null(mr);
	/* Odd sizes and offsets are fine: the MR covers exactly what was asked. */
	mr = reg(buf_a + 100, 3 * ps + 17, MRD_ACCESS_LOCAL_WRITE);
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

START_TEST(test_keys_differ_on_reuse)
{
	uint32_t keys[16];

	for (int i = 0; i < 16; i++) {
		struct provider_mr *mr = reg(buf_a, ps, MRD_ACCESS_LOCAL_WRITE);

		keys[i] = mr->lkey;
		for (int j = 0; j < i; j++)
			ck_assert_msg(keys[j] != keys[i], "key 0x%x handed out twice", keys[i]);
		ck_assert_int_eq(provider_dereg(mr), 0);
	}
	if (strcmp(provider_name(p), "soft") == 0)
		for (int i = 1; i < 16; i++) {
			/* The same index came back, with the next variant. */
			ck_assert_uint_eq(keys[i] >> 8, keys[0] >> 8);
			ck_assert_uint_eq((uint8_t)keys[i], (uint8_t)(keys[i - 1] + 1));
		}
}
END_TEST

START_TEST(test_pinning_accounted)
{
	uint64_t before = stat_pinned(), vm_before = vm_locked_bytes();
	bool soft = strcmp(provider_name(p), "soft") == 0;
	bool vm = soft && MLOCK_IS_REAL;
	struct provider_mr *a, *b;

	a = reg(buf_a, 4 * ps, MRD_ACCESS_LOCAL_WRITE);
	ck_assert_uint_eq(stat_pinned(), before + 4 * ps);
	b = reg(buf_a + 2 * ps, 4 * ps, MRD_ACCESS_LOCAL_WRITE);
	if (soft) {
		/* Overlapping pages are pinned once, and really locked. */
		ck_assert_uint_eq(stat_pinned(), before + 6 * ps);
		if (vm)
			ck_assert_uint_eq(vm_locked_bytes(), vm_before + 6 * ps);
	} else
		ck_assert_uint_eq(stat_pinned(), before + 8 * ps); /* the kernel pins per MR */
	ck_assert_int_eq(provider_dereg(a), 0);
	if (soft) {
		ck_assert_uint_eq(stat_pinned(), before + 4 * ps); /* b's pages stay locked */
		if (vm)
			ck_assert_uint_eq(vm_locked_bytes(), vm_before + 4 * ps);
	}
	ck_assert_int_eq(provider_dereg(b), 0);
	ck_assert_uint_eq(stat_pinned(), before);
	if (vm)
		ck_assert_uint_eq(vm_locked_bytes(), vm_before);
}
END_TEST

START_TEST(test_stats_count_mrs)
{
	struct provider_stats s0, s1;
	struct provider_mr *mr;

	provider_stats(p, &s0);
	mr = reg(buf_a, ps, 0);
	provider_stats(p, &s1);
	ck_assert_uint_eq(s1.mrs, s0.mrs + 1);
	ck_assert_uint_eq(s1.registrations, s0.registrations + 1);
	ck_assert_int_eq(provider_dereg(mr), 0);
	provider_stats(p, &s1);
	ck_assert_uint_eq(s1.mrs, s0.mrs);
}
END_TEST

START_TEST(test_pd_busy)
{
	struct provider_mr *mr = reg(buf_a, ps, 0);

	ck_assert_int_eq(provider_pd_free(pd), -EBUSY);
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

START_TEST(test_unmapped_memory)
{
	uint8_t *hole = map_pages(2);
	struct provider_mr *mr = NULL;

	munmap(hole, 2 * ps);
	ck_assert_int_lt(provider_reg(pd, hole, 2 * ps, (uintptr_t)hole, 0, &mr), 0);
	ck_assert_ptr_null(mr);
}
END_TEST

START_TEST(test_readonly_memory)
{
	struct provider_mr *mr = NULL;

	ck_assert_int_eq(mprotect(buf_b, 2 * ps, PROT_READ), 0);
	/* Writable access to read-only pages is refused up front, as get_user_pages would. */
	ck_assert_int_lt(provider_reg(pd, buf_b, 2 * ps, (uintptr_t)buf_b, MRD_ACCESS_LOCAL_WRITE,
				      &mr), 0);
	ck_assert_ptr_null(mr);
	mr = reg(buf_b, 2 * ps, 0); /* reading is fine */
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(mprotect(buf_b, 2 * ps, PROT_READ | PROT_WRITE), 0);
}
END_TEST

START_TEST(test_rereg_access)
{
	struct provider_mr *mr = reg(buf_a, ps, MRD_ACCESS_LOCAL_WRITE);
	uint32_t key = mr->lkey;
	int r;

	ck_assert_int_eq(provider_rereg(mr, 0, NULL, 0, 0, 0), -EINVAL);
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_ACCESS, NULL, 0, 0,
					MRD_ACCESS_REMOTE_WRITE), -EINVAL);
	ck_assert_uint_eq(mr->access, MRD_ACCESS_LOCAL_WRITE); /* unchanged by the failures */
	r = provider_rereg(mr, PROVIDER_REREG_ACCESS, NULL, 0, 0,
			   MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_READ);
	if (r == -ESTALE && strcmp(provider_name(p), "soft") != 0) {
		/* The device refused the command (rdma_rxe has no rereg): libibverbs says the MR
		 * must not be used any more, and dereg is all that is left. */
		printf("note: %s cannot rereg access: the MR is gone, as documented\n",
		       p->caps.device);
		ck_assert_int_eq(provider_dereg(mr), 0);
		return;
	}
	ck_assert_int_eq(r, 0);
	ck_assert_uint_eq(mr->access, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_READ);
	ck_assert_uint_eq(mr->addr, (uintptr_t)buf_a);
	if (strcmp(provider_name(p), "soft") == 0)
		ck_assert_uint_eq(mr->lkey, key); /* same memory: same key */
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

START_TEST(test_export_pd)
{
	uint32_t handle;
	int fd = -1, r = provider_export_pd(pd, &fd, &handle);

	if (!p->caps.export_pd) {
		ck_assert_int_eq(r, -EOPNOTSUPP);
		ck_assert_int_eq(fd, -1);
		return;
	}
	ck_assert_int_eq(r, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	close(fd);
}
END_TEST

/* ---- DMA through keys (caps.dma) ---- */

/* A rereg of access; where the device cannot (test_rereg_access), a new MR over the same
 * memory. */
static void change_access(struct provider_mr **mr, unsigned access)
{
	struct provider_mr *m = *mr;
	int r = provider_rereg(m, PROVIDER_REREG_ACCESS, NULL, 0, 0, access);

	if (r == -ESTALE && strcmp(provider_name(p), "soft") != 0) {
		void *addr = (void *)(uintptr_t)m->addr;
		size_t length = m->length;

		ck_assert_int_eq(provider_dereg(m), 0);
		*mr = reg(addr, length, access);
		return;
	}
	ck_assert_int_eq(r, 0);
}

START_TEST(test_dma_reaches_exact_bytes)
{
	struct provider_mr *src = reg(buf_a, NPAGES * ps, 0);
	struct provider_mr *dst = reg(buf_b, NPAGES * ps,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	const size_t off = ps - 40, len = 100; /* crosses a page boundary on both sides */

	for (size_t i = 0; i < NPAGES * ps; i++)
		buf_a[i] = (uint8_t)(i * 7 + 1);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova + off, dst->rkey,
				      dst->iova + 2 * ps + off, len), 0);
	ck_assert(memcmp(buf_b + 2 * ps + off, buf_a + off, len) == 0);
	for (size_t i = 0; i < NPAGES * ps; i++)
		if (i < 2 * ps + off || i >= 2 * ps + off + len)
			ck_assert_msg(buf_b[i] == 0, "byte %zu outside the DMA changed", i);

	/* And back: an RDMA read into local memory. */
	memset(buf_a, 0, NPAGES * ps);
	change_access(&dst, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_READ);
	change_access(&src, MRD_ACCESS_LOCAL_WRITE);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_READ, src->lkey, src->iova, dst->rkey,
				      dst->iova + 2 * ps + off, len), 0);
	ck_assert(memcmp(buf_a, buf_b + 2 * ps + off, len) == 0);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_dereg(dst), 0);
}
END_TEST

START_TEST(test_dma_access_checks)
{
	struct provider_mr *local_ro = reg(buf_a, ps, 0);
	struct provider_mr *local_rw = reg(buf_a + ps, ps, MRD_ACCESS_LOCAL_WRITE);
	struct provider_mr *remote_plain = reg(buf_b, ps, MRD_ACCESS_LOCAL_WRITE);
	struct provider_mr *remote_read = reg(buf_b + ps, ps, MRD_ACCESS_REMOTE_READ);

	buf_b[0] = 0x55;
	/* Writing where remote write was not granted. */
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, local_ro->lkey, local_ro->iova,
				      remote_plain->rkey, remote_plain->iova, 8), -EACCES);
	ck_assert_int_eq(buf_b[0], 0x55);
	/* Reading where remote read was not granted. */
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_READ, local_rw->lkey, local_rw->iova,
				      remote_plain->rkey, remote_plain->iova, 8), -EACCES);
	/* Reading into local memory registered without local write. */
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_READ, local_ro->lkey, local_ro->iova,
				      remote_read->rkey, remote_read->iova, 8), -EACCES);
	/* Granted: remote read into writable local memory. */
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_READ, local_rw->lkey, local_rw->iova,
				      remote_read->rkey, remote_read->iova, 8), 0);
	ck_assert_int_eq(provider_dma(pd, 77, local_rw->lkey, local_rw->iova, remote_read->rkey,
				      remote_read->iova, 8), -EINVAL);
	ck_assert_int_eq(provider_dereg(local_ro), 0);
	ck_assert_int_eq(provider_dereg(local_rw), 0);
	ck_assert_int_eq(provider_dereg(remote_plain), 0);
	ck_assert_int_eq(provider_dereg(remote_read), 0);
}
END_TEST

START_TEST(test_dma_bounds)
{
	struct provider_mr *src = reg(buf_a, 2 * ps, 0);
	struct provider_mr *dst = reg(buf_b + ps, 2 * ps,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);

	memset(buf_a, 0xaa, 2 * ps);
	/* One byte past the end, one byte before the start, and a length that wraps. */
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, dst->rkey,
				      dst->iova + 2 * ps - 8, 9), -EFAULT);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, dst->rkey,
				      dst->iova - 1, 8), -EFAULT);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova + 8, dst->rkey,
				      dst->iova, SIZE_MAX - 4), -EFAULT);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova + 2 * ps - 4,
				      dst->rkey, dst->iova, 8), -EFAULT);
	for (size_t i = 0; i < NPAGES * ps; i++)
		ck_assert_msg(buf_b[i] == 0, "a refused DMA wrote byte %zu", i);
	/* Exactly to the end is fine. */
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, dst->rkey,
				      dst->iova + 2 * ps - 8, 8), 0);
	ck_assert_int_eq(buf_b[3 * ps - 1], 0xaa);
	ck_assert_int_eq(buf_b[3 * ps], 0);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_dereg(dst), 0);
}
END_TEST

START_TEST(test_stale_key_rejected)
{
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *old = reg(buf_b, ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	struct provider_mr *fresh;
	uint32_t stale = old->rkey;

	ck_assert_int_eq(provider_dereg(old), 0);
	fresh = reg(buf_b + ps, ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	ck_assert_uint_ne(fresh->rkey, stale);
	buf_a[0] = 0x42;
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, stale,
				      fresh->iova, 1), -ENOKEY);
	ck_assert_int_eq(buf_b[ps], 0);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, 0, fresh->iova,
				      1), -ENOKEY);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, 0xffffff00u,
				      fresh->iova, 1), -ENOKEY);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, fresh->rkey,
				      fresh->iova, 1), 0);
	ck_assert_int_eq(buf_b[ps], 0x42);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_dereg(fresh), 0);
}
END_TEST

/* Soft keys are an index and an 8-bit variant: 300 registrations of one index, and one MR
 * moved 300 times, go past 256 variants, and still no key comes back while one may be held. */
#define REVISIT_ROUNDS 300
START_TEST(test_keys_never_revisit)
{
	static uint32_t keys[2 * REVISIT_ROUNDS];
	struct provider_mr *src = reg(buf_a, ps, 0), *mr, *live;
	size_t n = 0;

	for (int i = 0; i < REVISIT_ROUNDS; i++) {
		mr = reg(buf_b, ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
		keys[n++] = mr->rkey;
		ck_assert_int_eq(provider_dereg(mr), 0);
	}
	mr = reg(buf_b, ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	for (int i = 0; i < REVISIT_ROUNDS; i++) {
		uint8_t *target = buf_b + (size_t)(i % 2) * ps;
		int r;

		keys[n++] = mr->rkey;
		r = provider_rereg(mr, PROVIDER_REREG_TRANSLATION, target, ps, (uintptr_t)target, 0);
		if (r == -EKEYEXPIRED) { /* its variants are used up: only dereg remains */
			ck_assert_int_eq(provider_dereg(mr), 0);
			mr = reg(target, ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
		} else
			ck_assert_int_eq(r, 0);
	}
	live = mr;
	buf_a[0] = 0x42;
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(keys[i] != live->rkey, "key 0x%x of round %zu handed out again",
			      keys[i], i);
		ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, keys[i],
					      live->iova, 1), -ENOKEY);
	}
	ck_assert_int_eq(buf_b[0] | buf_b[ps], 0);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, live->rkey,
				      live->iova, 1), 0);
	ck_assert_int_eq(provider_dereg(live), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

START_TEST(test_other_pd_keys_refused)
{
	struct provider_pd *pd2;
	struct provider_mr *mine = reg(buf_a, ps, 0), *theirs = NULL;

	ck_assert_int_eq(provider_pd_alloc(p, &pd2), 0);
	ck_assert_int_eq(provider_reg(pd2, buf_b, ps, (uintptr_t)buf_b,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE, &theirs), 0);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, mine->lkey, mine->iova, theirs->rkey,
				      theirs->iova, 8), -EACCES);
	ck_assert_refused(provider_dma(pd2, PROVIDER_DMA_WRITE, mine->lkey, mine->iova, theirs->rkey,
				      theirs->iova, 8), -EACCES);
	ck_assert_int_eq(provider_dereg(theirs), 0);
	ck_assert_int_eq(provider_pd_free(pd2), 0);
	ck_assert_int_eq(provider_dereg(mine), 0);
}
END_TEST

START_TEST(test_iova_addressing)
{
	/* Keys address the MR by its iova, whatever the host address. */
	const uint64_t iova = 0x7000000000ull + ((uintptr_t)buf_b & (ps - 1));
	struct provider_mr *src = reg(buf_a, ps, 0), *dst = NULL;

	ck_assert_int_eq(provider_reg(pd, buf_b, 2 * ps, iova,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE, &dst), 0);
	ck_assert_uint_eq(dst->iova, iova);
	buf_a[0] = 0x99;
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, dst->rkey,
				      iova + ps, 1), 0);
	ck_assert_int_eq(buf_b[ps], 0x99);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, dst->rkey,
				      (uintptr_t)buf_b + ps, 1), -EFAULT); /* the host address is no iova */
	ck_assert_int_eq(provider_dereg(dst), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* ---- moving an MR (caps.rereg_translation) ---- */

START_TEST(test_rereg_translation)
{
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *mr = reg(buf_b, ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	uint8_t *target = buf_b + 4 * ps;
	uint32_t old_key = mr->rkey;
	uint64_t pinned = stat_pinned();

	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, target, 2 * ps,
					(uintptr_t)target, 0), 0);
	ck_assert_uint_eq(mr->addr, (uintptr_t)target);
	ck_assert_uint_eq(mr->length, 2 * ps);
	ck_assert_uint_eq(mr->access, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	ck_assert_uint_eq(stat_pinned(), pinned + ps); /* old page released, two new pinned */
	if (p->caps.dma && !p->caps.rereg_new_keys) /* mlx5's UMR: pools stay off for it */
		printf("note: %s: a move keeps the MR's keys (%s)\n", p->caps.device,
		       p->caps.rereg_probe);
	else if (p->caps.dma) {
		/* A key to the old memory must not reach the new memory. */
		ck_assert_uint_ne(mr->rkey, old_key);
		buf_a[0] = 0x77;
		ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, old_key,
					      (uintptr_t)target, 1), -ENOKEY);
		ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, mr->rkey,
					      mr->iova + ps, 1), 0);
		ck_assert_int_eq(target[ps], 0x77);
		ck_assert_int_eq(buf_b[0], 0); /* the old memory untouched */
	}
	/* A bad move leaves the MR where it was. */
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, target, 0,
					(uintptr_t)target, 0), -EINVAL);
	ck_assert_uint_eq(mr->addr, (uintptr_t)target);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* The rereg probe answered (caps.rereg_probe, which mrctl pools repeats), and where a move
 * cannot happen neither a move nor a park is tried (rxe, siw; soft's MRD_SOFT_REREG=refuse). */
START_TEST(test_rereg_probe_answered)
{
	struct provider_mr *mr;

	ck_assert_msg(p->caps.rereg_probe[0], "no answer from the rereg probe");
	ck_assert(p->caps.rereg_translation || !p->caps.rereg_new_keys);
	if (p->caps.rereg_translation)
		return;
	mr = reg(buf_a, ps, MRD_ACCESS_LOCAL_WRITE);
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, buf_b, ps,
					(uintptr_t)buf_b, 0), -EOPNOTSUPP);
	ck_assert_int_eq(provider_park(mr), -EOPNOTSUPP);
	ck_assert_uint_eq(mr->addr, (uintptr_t)buf_a);
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

/* ---- parking a handle for a pool (ops.park, caps.rereg_new_keys) ---- */

START_TEST(test_park_then_move)
{
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *mr = reg(buf_b, 2 * ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	uint32_t old_lkey = mr->lkey, old_rkey = mr->rkey;
	uint8_t *target = buf_b + 8 * ps;
	struct provider_stats s;
	uint64_t pinned = stat_pinned();

	ck_assert_int_eq(provider_park(mr), 0);
	provider_stats(p, &s);
	ck_assert_uint_eq(s.mrs, 1); /* src alone has memory */
	ck_assert_uint_eq(s.parked, 1);
	ck_assert_uint_le(stat_pinned(), pinned - 2 * ps + ps); /* at most a parking page */
	if (p->caps.dma) /* dead at once, though nobody moved it yet */
		ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova,
					      old_rkey, (uintptr_t)buf_b, 1), -ENOKEY);

	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, target, 3 * ps,
					(uintptr_t)target, 0), 0);
	ck_assert_uint_eq(mr->addr, (uintptr_t)target);
	ck_assert_uint_eq(mr->length, 3 * ps);
	ck_assert_uint_eq(mr->access, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	ck_assert_uint_ne(mr->lkey, old_lkey);
	ck_assert_uint_ne(mr->rkey, old_rkey);
	provider_stats(p, &s);
	ck_assert_uint_eq(s.mrs, 2);
	ck_assert_uint_eq(s.parked, 0);
	ck_assert_uint_eq(stat_pinned(), pinned - 2 * ps + 3 * ps);
	if (p->caps.dma) {
		buf_a[0] = 0x3c;
		ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova,
					      old_rkey, (uintptr_t)target, 1), -ENOKEY);
		ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova,
					      mr->rkey, (uintptr_t)target + 2 * ps, 1), 0);
		ck_assert_int_eq(target[2 * ps], 0x3c);
		ck_assert_int_eq(target[0], 0);
	}
	/* Parked again, a handle goes with a plain dereg. */
	ck_assert_int_eq(provider_park(mr), 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
	provider_stats(p, &s);
	ck_assert_uint_eq(s.parked, 0);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_uint_eq(stat_pinned(), pinned - 2 * ps - ps);
}
END_TEST

/* ---- on-demand paging (caps.odp) ---- */

/* rxe has ODP but no prefetch (ibv_advise_mr: EOPNOTSUPP); soft must have it. */
static bool advice_supported(struct provider_mr *odp)
{
	int r = provider_advise(odp, PROVIDER_ADVISE_PREFETCH, odp->iova, ps);

	if (r == -EOPNOTSUPP && strcmp(provider_name(p), "soft") != 0) {
		printf("note: %s has ODP but no prefetch advice\n", p->caps.device);
		return false;
	}
	ck_assert_int_eq(r, 0);
	return true;
}

START_TEST(test_odp_pins_nothing_and_faults)
{
	struct provider_stats s0, s1;
	struct provider_mr *odp, *src;
	uint64_t pinned = stat_pinned();

	odp = reg(buf_b, NPAGES * ps,
		  MRD_ACCESS_ON_DEMAND | MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	ck_assert_uint_eq(stat_pinned(), pinned);
	/* Advice: only for ODP MRs; write prefetch only where writable. */
	src = reg(buf_a, NPAGES * ps, 0);
	ck_assert_int_lt(provider_advise(src, PROVIDER_ADVISE_PREFETCH, src->iova, ps), 0);
	if (!advice_supported(odp)) {
		ck_assert_uint_eq(stat_pinned(), pinned + NPAGES * ps); /* only src pinned */
		ck_assert_int_eq(provider_dereg(src), 0);
		ck_assert_int_eq(provider_dereg(odp), 0);
		return;
	}
	ck_assert_int_eq(provider_advise(odp, PROVIDER_ADVISE_PREFETCH, odp->iova, 2 * ps), 0);

	if (p->caps.dma_emulated) { /* a device counts no faults for mrd */
		provider_stats(p, &s0);
		/* Pages 0-1 are present; a write over pages 1-3 faults pages 2 and 3. */
		ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova,
					      odp->rkey, odp->iova + ps + 10, 2 * ps), 0);
		provider_stats(p, &s1);
		ck_assert_uint_eq(s1.odp_faults - s0.odp_faults, 2);
		ck_assert_uint_eq(s0.odp_prefetched_pages, 2);

		/* Invalidation zaps present pages (0-3); the next touch faults again. */
		ck_assert_int_eq(provider_invalidate(odp, odp->iova, NPAGES * ps), 0);
		provider_stats(p, &s0);
		ck_assert_uint_eq(s0.odp_invalidations - s1.odp_invalidations, 4);
		ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova,
					      odp->rkey, odp->iova, 1), 0);
		provider_stats(p, &s1);
		ck_assert_uint_eq(s1.odp_faults - s0.odp_faults, 1);
		ck_assert_int_lt(provider_invalidate(src, src->iova, ps), 0); /* pinned: no */
	}
	ck_assert_uint_eq(stat_pinned(), pinned + NPAGES * ps); /* only src pinned */
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_dereg(odp), 0);
}
END_TEST

START_TEST(test_odp_write_prefetch_needs_write)
{
	struct provider_mr *ro = reg(buf_b, 2 * ps, MRD_ACCESS_ON_DEMAND);

	ck_assert_int_lt(provider_advise(ro, PROVIDER_ADVISE_PREFETCH_WRITE, ro->iova, ps), 0);
	if (!advice_supported(ro)) {
		ck_assert_int_eq(provider_dereg(ro), 0);
		return;
	}
	ck_assert_int_eq(provider_advise(ro, PROVIDER_ADVISE_PREFETCH, ro->iova, ps), 0);
	ck_assert_int_lt(provider_advise(ro, PROVIDER_ADVISE_PREFETCH, ro->iova + ps, 2 * ps), 0);
	ck_assert_int_eq(provider_dereg(ro), 0);
}
END_TEST

START_TEST(test_odp_readonly_faults_safely)
{
	struct provider_mr *src = reg(buf_a, ps, 0), *odp = NULL;

	ck_assert_int_eq(provider_reg(pd, buf_b, 2 * ps, (uintptr_t)buf_b,
				      MRD_ACCESS_ON_DEMAND | MRD_ACCESS_LOCAL_WRITE |
					      MRD_ACCESS_REMOTE_WRITE, &odp), 0);
	ck_assert_int_eq(mprotect(buf_b, 2 * ps, PROT_READ), 0);
	/* A write fault on a read-only page fails the DMA; mrd survives. */
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, odp->rkey,
				      odp->iova, 8), -EFAULT);
	ck_assert_int_lt(provider_advise(odp, PROVIDER_ADVISE_PREFETCH_WRITE, odp->iova, ps), 0);
	ck_assert_int_eq(mprotect(buf_b, 2 * ps, PROT_READ | PROT_WRITE), 0);
	ck_assert_int_eq(provider_dereg(odp), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

START_TEST(test_odp_unmapped_faults_safely)
{
	uint8_t *hole = map_pages(2);
	struct provider_mr *src = reg(buf_a, ps, 0), *odp = NULL;

	/* ODP registers address space, not pages: unmapped memory only fails when touched. */
	ck_assert_int_eq(provider_reg(pd, hole, 2 * ps, (uintptr_t)hole,
				      MRD_ACCESS_ON_DEMAND | MRD_ACCESS_LOCAL_WRITE |
					      MRD_ACCESS_REMOTE_WRITE, &odp), 0);
	munmap(hole, 2 * ps);
	ck_assert_refused(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, odp->rkey,
				      odp->iova, 8), -EFAULT);
	ck_assert_int_eq(provider_dereg(odp), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* A context's keys run out (soft: $MRD_SOFT_KEY_BITS makes that quick) with -EKEYEXPIRED after
 * caps.max_keys, none handed out twice, and its spent indexes cost next to nothing; another
 * context (mrd opens one per domain) registers as before, and the first one's keys never
 * reach its MRs nor its keys the first one's memory. */
#define SMALL_KEY_BITS 12
#define STR(x) #x
#define XSTR(x) STR(x)
START_TEST(test_keys_used_up_per_context)
{
	static uint8_t seen[1u << (SMALL_KEY_BITS + 8)];
	struct provider *small, *other;
	struct provider_pd *spd, *opd;
	struct provider_mr *mr, *keep = NULL, *src, *dst;
	uint64_t n = 0;
	uint32_t spent = 0;
	size_t heap;
	int verbs_error, r;

	ck_assert_int_eq(setenv("MRD_SOFT_KEY_BITS", XSTR(SMALL_KEY_BITS), 1), 0);
	r = provider_open(CONTRACT_PROVIDER, device, &small, &verbs_error);
	ck_assert_int_eq(unsetenv("MRD_SOFT_KEY_BITS"), 0);
	ck_assert_int_eq(r, 0);
	ck_assert_uint_eq(small->caps.max_keys, ((1u << SMALL_KEY_BITS) - 2) * 255);
	ck_assert_int_eq(provider_pd_alloc(small, &spd), 0);
	heap = mallinfo2().uordblks;
	for (;;) {
		/* On demand: nothing checked or pinned, so a million take a second either way. */
		r = provider_reg(spd, buf_a, ps, (uintptr_t)buf_a, MRD_ACCESS_ON_DEMAND |
				 MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE, &mr);
		if (r < 0)
			break;
		ck_assert_uint_lt(mr->lkey, sizeof(seen));
		ck_assert_msg(!seen[mr->lkey], "key 0x%x handed out again", mr->lkey);
		seen[mr->lkey] = 1;
		if (n == 100000) /* an index of a chunk that will be spent whole */
			spent = mr->rkey;
		if (++n == 300) { /* an index past the other context's first keys */
			keep = mr;
			continue;
		}
		ck_assert_int_eq(provider_dereg(mr), 0);
	}
	ck_assert_int_eq(r, -EKEYEXPIRED);
	/* All made but the variants keep's index has still to give. */
	ck_assert_uint_eq(n + 255 - (keep->lkey & 0xff), small->caps.max_keys);
	ck_assert_int_eq(provider_dma(spd, PROVIDER_DMA_WRITE, keep->lkey, keep->iova, spent,
				      keep->iova, 1), -ENOKEY); /* a spent index's key */
	/* The old table kept 20 bytes an index, spent or not: 80 KiB here. What malloc caches
	 * for reuse counts as in use (~15 KiB). */
	ck_assert_msg(mallinfo2().uordblks < heap + 32 * 1024, "key table grew by %zu bytes",
		      mallinfo2().uordblks - heap);

	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, device, &other, &verbs_error), 0);
	ck_assert_int_eq(provider_pd_alloc(other, &opd), 0);
	ck_assert_int_eq(provider_reg(opd, buf_b, ps, (uintptr_t)buf_b, 0, &src), 0);
	ck_assert_int_eq(provider_reg(opd, buf_b + ps, ps, (uintptr_t)buf_b + ps,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE, &dst), 0);
	buf_b[0] = 0x42;
	ck_assert_int_eq(provider_dma(opd, PROVIDER_DMA_WRITE, src->lkey, src->iova, keep->rkey,
				      keep->iova, 1), -ENOKEY);
	ck_assert_int_eq(provider_dma(spd, PROVIDER_DMA_WRITE, keep->lkey, keep->iova, dst->rkey,
				      dst->iova, 1), -ENOKEY);
	ck_assert_int_eq(buf_a[0] | buf_b[ps], 0);
	ck_assert_int_eq(provider_dma(opd, PROVIDER_DMA_WRITE, src->lkey, src->iova, dst->rkey,
				      dst->iova, 1), 0);
	ck_assert_int_eq(buf_b[ps], 0x42);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_dereg(dst), 0);
	ck_assert_int_eq(provider_pd_free(opd), 0);
	provider_close(other);
	ck_assert_int_eq(provider_dereg(keep), 0);
	ck_assert_int_eq(provider_pd_free(spd), 0);
	provider_close(small);
}
END_TEST

/* Soft's $MRD_SOFT_DMA=iwarp is a device without DMA through keys, as iWARP is: caps say so
 * and why, and a Dma is refused before any provider code runs; another value fails the open. */
START_TEST(test_soft_dma_iwarp)
{
	struct provider *np;
	struct provider_pd *npd;
	struct provider_mr *a, *b;
	int verbs_error, r;

	ck_assert_int_eq(setenv("MRD_SOFT_DMA", "rdma_cm", 1), 0);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &np, &verbs_error), -EINVAL);
	ck_assert_int_eq(setenv("MRD_SOFT_DMA", "iwarp", 1), 0);
	r = provider_open(CONTRACT_PROVIDER, NULL, &np, &verbs_error);
	ck_assert_int_eq(unsetenv("MRD_SOFT_DMA"), 0);
	ck_assert_int_eq(r, 0);
	ck_assert(!np->caps.dma);
	ck_assert_ptr_nonnull(strstr(np->caps.no_dma, "rdma_cm"));
	ck_assert_ptr_null(p->caps.no_dma); /* the default emulates */
	ck_assert_int_eq(provider_pd_alloc(np, &npd), 0);
	ck_assert_int_eq(provider_reg(npd, buf_a, ps, (uintptr_t)buf_a, 0, &a), 0);
	ck_assert_int_eq(provider_reg(npd, buf_b, ps, (uintptr_t)buf_b,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE, &b), 0);
	ck_assert_int_eq(provider_dma(npd, PROVIDER_DMA_WRITE, a->lkey, a->iova, b->rkey, b->iova,
				      1), -EOPNOTSUPP);
	ck_assert_int_eq(provider_dereg(a), 0);
	ck_assert_int_eq(provider_dereg(b), 0);
	ck_assert_int_eq(provider_pd_free(npd), 0);
	provider_close(np);
}
END_TEST

/* A soft provider opened with one test knob set to value (NULL: all unset). */
static int open_soft_with(const char *knob, const char *value, struct provider **ret)
{
	int verbs_error, r;

	if (knob)
		ck_assert_int_eq(setenv(knob, value, 1), 0);
	r = provider_open("soft", NULL, ret, &verbs_error);
	if (knob)
		ck_assert_int_eq(unsetenv(knob), 0);
	return r;
}

/* Soft models what a device may lack: bad values fail the open; $MRD_SOFT_ATOMIC=none refuses
 * remote atomics as EFA does (reg and rereg: EOPNOTSUPP); $MRD_SOFT_ODP_RC without read fails
 * a read that would fault an on-demand MR's pages in, as a NIC's failed fault. */
START_TEST(test_soft_caps_knobs)
{
	const unsigned rw = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ;
	struct provider *q;
	struct provider_pd *qpd;
	struct provider_mr *mr, *odp, *src;

	ck_assert_int_eq(open_soft_with("MRD_SOFT_ATOMIC", "maybe", &q), -EINVAL);
	ck_assert_int_eq(open_soft_with("MRD_SOFT_ODP_RC", "send,fly", &q), -EINVAL);
	ck_assert_int_eq(open_soft_with("MRD_SOFT_ODP_RC", "send,", &q), -EINVAL);
	ck_assert_int_eq(open_soft_with("MRD_SOFT_ADVISE_MAX", "4097", &q), -EINVAL);
	ck_assert_int_eq(open_soft_with("MRD_SOFT_ADVISE_MAX", "0", &q), -EINVAL);
	ck_assert_int_eq(open_soft_with(NULL, NULL, &q), 0);
	ck_assert(q->caps.atomic && q->caps.odp_rc_caps == 0x3f);
	ck_assert_uint_eq(q->caps.advise_max, 1ull << 31); /* as verbs */
	provider_close(q);

	ck_assert_int_eq(open_soft_with("MRD_SOFT_ATOMIC", "none", &q), 0);
	ck_assert(!q->caps.atomic);
	ck_assert_uint_eq(provider_grantable_access(&q->caps, rw | MRD_ACCESS_REMOTE_ATOMIC), rw);
	ck_assert_int_eq(provider_pd_alloc(q, &qpd), 0);
	ck_assert_int_eq(provider_reg(qpd, buf_a, ps, (uintptr_t)buf_a,
				      rw | MRD_ACCESS_REMOTE_ATOMIC, &mr), -EOPNOTSUPP);
	ck_assert_int_eq(provider_reg(qpd, buf_a, ps, (uintptr_t)buf_a, rw, &mr), 0);
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_ACCESS, NULL, 0, 0,
					rw | MRD_ACCESS_REMOTE_ATOMIC), -EOPNOTSUPP);
	ck_assert_uint_eq(mr->access, rw);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_pd_free(qpd), 0);
	provider_close(q);

	ck_assert_int_eq(open_soft_with("MRD_SOFT_ODP_RC", "send,recv,write", &q), 0);
	ck_assert_uint_eq(q->caps.odp_rc_caps,
			  PROVIDER_ODP_SEND | PROVIDER_ODP_RECV | PROVIDER_ODP_WRITE);
	ck_assert(!provider_odp_covers(&q->caps, rw));
	ck_assert_int_eq(provider_pd_alloc(q, &qpd), 0);
	ck_assert_int_eq(provider_reg(qpd, buf_a, ps, (uintptr_t)buf_a, MRD_ACCESS_LOCAL_WRITE,
				      &src), 0);
	ck_assert_int_eq(provider_reg(qpd, buf_b, 2 * ps, (uintptr_t)buf_b,
				      MRD_ACCESS_ON_DEMAND | rw, &odp), 0);
	ck_assert_int_eq(provider_dma(qpd, PROVIDER_DMA_READ, src->lkey, src->iova, odp->rkey,
				      odp->iova, 8), -EFAULT); /* no read bit: its fault fails */
	ck_assert_int_eq(provider_dma(qpd, PROVIDER_DMA_WRITE, src->lkey, src->iova, odp->rkey,
				      odp->iova, 8), 0); /* the write bit: it faults in */
	ck_assert_int_eq(provider_dma(qpd, PROVIDER_DMA_READ, src->lkey, src->iova, odp->rkey,
				      odp->iova, 8), 0); /* present now: no fault */
	ck_assert_int_eq(provider_dereg(odp), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_pd_free(qpd), 0);
	provider_close(q);
}
END_TEST

/* An advise op takes at most caps.advise_max bytes (verbs: ibv_sge.length is 32-bit; soft:
 * $MRD_SOFT_ADVISE_MAX); provider_advise cuts longer ranges at its multiples. */
START_TEST(test_soft_advise_split)
{
	struct provider *q;
	struct provider_pd *qpd;
	struct provider_mr *odp;
	struct provider_stats s0, s1;
	char max[32];

	snprintf(max, sizeof(max), "%zu", 2 * ps);
	ck_assert_int_eq(open_soft_with("MRD_SOFT_ADVISE_MAX", max, &q), 0);
	ck_assert_uint_eq(q->caps.advise_max, 2 * ps);
	ck_assert_int_eq(provider_pd_alloc(q, &qpd), 0);
	ck_assert_int_eq(provider_reg(qpd, buf_b, NPAGES * ps, (uintptr_t)buf_b,
				      MRD_ACCESS_ON_DEMAND | MRD_ACCESS_LOCAL_WRITE, &odp), 0);
	ck_assert_int_eq(q->ops->advise(odp, PROVIDER_ADVISE_PREFETCH, odp->iova + ps, 5 * ps),
			 -EINVAL); /* the op alone: too long */
	provider_stats(q, &s0);
	/* Pages 1-5 in pieces [1], [2-3], [4-5]; then 7-12 from the middle of page 7. */
	ck_assert_int_eq(provider_advise(odp, PROVIDER_ADVISE_PREFETCH, odp->iova + ps, 5 * ps), 0);
	ck_assert_int_eq(provider_advise(odp, PROVIDER_ADVISE_PREFETCH_WRITE,
					 odp->iova + 7 * ps + 100, 5 * ps), 0);
	provider_stats(q, &s1);
	ck_assert_uint_eq(s1.odp_prefetched_pages - s0.odp_prefetched_pages, 5 + 6);
	ck_assert_int_eq(provider_dereg(odp), 0);
	ck_assert_int_eq(provider_pd_free(qpd), 0);
	provider_close(q);
}
END_TEST

/* PREFETCH_NO_FAULT installs the translations of pages present in the page tables alone (a
 * device's snapshot), faulting none in: a Dma then faults exactly the others. */
START_TEST(test_soft_prefetch_no_fault)
{
	uint8_t *m = mmap(NULL, 8 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct provider_mr *odp, *src;
	struct provider_stats s0, s1;

	ck_assert_ptr_ne(m, MAP_FAILED);
	m[0] = m[2 * ps] = m[5 * ps] = 1; /* pages 0, 2 and 5 present */
	odp = reg(m, 8 * ps, MRD_ACCESS_ON_DEMAND | MRD_ACCESS_LOCAL_WRITE |
				     MRD_ACCESS_REMOTE_WRITE);
	src = reg(buf_a, ps, 0);
	provider_stats(p, &s0);
	ck_assert_int_eq(provider_advise(odp, PROVIDER_ADVISE_PREFETCH_NO_FAULT, odp->iova,
					 8 * ps), 0);
	provider_stats(p, &s1);
	ck_assert_uint_eq(s1.odp_prefetched_pages - s0.odp_prefetched_pages, 3);
	ck_assert_uint_eq(s1.odp_faults, s0.odp_faults);
	/* Page 2 has its translation; page 3 faults. */
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, odp->rkey,
				      odp->iova + 2 * ps, 8), 0);
	provider_stats(p, &s0);
	ck_assert_uint_eq(s0.odp_faults, s1.odp_faults);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, odp->rkey,
				      odp->iova + 3 * ps, 8), 0);
	provider_stats(p, &s1);
	ck_assert_uint_eq(s1.odp_faults - s0.odp_faults, 1);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_dereg(odp), 0);
	munmap(m, 8 * ps);
}
END_TEST

/* Soft's $MRD_SOFT_KEYS=mlx5 behaves as mlx5's mkey cache: a released key comes back unchanged
 * to the next registration of its size, last released first, parked or not, and a move keeps
 * keys; another value fails the open. The hazard mrd's key quarantine exists for: the old key
 * reaches the new memory. */
START_TEST(test_soft_mlx5_keys_come_back)
{
	struct provider *cached;
	struct provider_pd *kpd;
	struct provider_mr *a, *b, *c, *src;
	uint32_t ka, kb;
	int verbs_error, r;
	const unsigned rw = MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE;

	ck_assert_int_eq(setenv("MRD_SOFT_KEYS", "mlx6", 1), 0);
	ck_assert_int_eq(provider_open("soft", NULL, &cached, &verbs_error), -EINVAL);
	ck_assert_int_eq(setenv("MRD_SOFT_KEYS", "mlx5", 1), 0);
	r = provider_open("soft", NULL, &cached, &verbs_error);
	ck_assert_int_eq(unsetenv("MRD_SOFT_KEYS"), 0);
	ck_assert_int_eq(r, 0);
	ck_assert(cached->caps.keys_come_back && !cached->caps.rereg_new_keys);
	ck_assert_int_eq(provider_pd_alloc(cached, &kpd), 0);
	ck_assert_int_eq(provider_reg(kpd, buf_b, ps, (uintptr_t)buf_b, 0, &src), 0);
	ck_assert_int_eq(provider_reg(kpd, buf_a, ps, (uintptr_t)buf_a, rw, &a), 0);
	ck_assert_int_eq(provider_reg(kpd, buf_a, 2 * ps, (uintptr_t)buf_a, rw, &b), 0);
	ka = a->rkey, kb = b->rkey;
	ck_assert_int_eq(provider_park(a), 0);
	ck_assert_uint_eq(a->rkey, ka); /* parked as mlx5 parks: moved, keys kept */
	ck_assert_int_eq(provider_dma(kpd, PROVIDER_DMA_WRITE, src->lkey, src->iova, ka,
				      (uintptr_t)buf_a, 1), -ENOKEY);
	ck_assert_int_eq(provider_dereg(b), 0);
	ck_assert_int_eq(provider_dereg(a), 0);
	/* Two pages: b's key, though a's was released after it. */
	ck_assert_int_eq(provider_reg(kpd, buf_a + ps, 2 * ps, (uintptr_t)buf_a + ps, rw, &c), 0);
	ck_assert_uint_eq(c->rkey, kb);
	ck_assert_uint_eq(c->lkey, kb);
	buf_b[0] = 0x42;
	ck_assert_int_eq(provider_dma(kpd, PROVIDER_DMA_WRITE, src->lkey, src->iova, kb,
				      (uintptr_t)buf_a + ps, 1), 0); /* the old key reaches new memory */
	ck_assert_int_eq(buf_a[ps], 0x42);
	ck_assert_int_eq(provider_rereg(c, PROVIDER_REREG_TRANSLATION, buf_a, 2 * ps,
					(uintptr_t)buf_a, 0), 0);
	ck_assert_uint_eq(c->rkey, kb); /* UMR moves keep keys */
	ck_assert_int_eq(provider_dereg(c), 0);
	ck_assert_int_eq(provider_reg(kpd, buf_a, ps, (uintptr_t)buf_a, rw, &a), 0);
	ck_assert_uint_eq(a->rkey, ka); /* one page: a's, parked when it went */
	ck_assert_int_eq(provider_dereg(a), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_pd_free(kpd), 0);
	provider_close(cached);
}
END_TEST

/* Soft's gate ($MRD_SOFT_GATE): an op of $MRD_SOFT_GATE_BYTES or more says it entered and waits
 * for the test, holding the provider (its lock) meanwhile; a smaller one goes straight on. */
struct gated_op {
	struct provider_pd *pd;
	struct provider_mr *mr;
	void *addr;
	size_t length;
	int r;
};

static void *gated_reg(void *arg)
{
	struct gated_op *op = arg;

	op->r = provider_reg(op->pd, op->addr, op->length, (uintptr_t)op->addr,
			     MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_ON_DEMAND, &op->mr);
	return NULL;
}

static void *gated_advise(void *arg)
{
	struct gated_op *op = arg;

	op->r = provider_advise(op->mr, PROVIDER_ADVISE_PREFETCH_WRITE, op->mr->iova, op->length);
	return NULL;
}

START_TEST(test_soft_gate_holds_big_ops)
{
	struct provider *gp;
	struct provider_pd *gpd;
	struct provider_mr *small;
	struct gated_op op;
	pthread_t t;
	char dir[64];
	int verbs_error;

	ck_assert_int_eq(soft_gate_setenv(dir, sizeof(dir), 4 * ps), 0);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &gp, &verbs_error), 0);
	ck_assert_int_eq(provider_pd_alloc(gp, &gpd), 0);

	/* Under the threshold: no waiting, nothing entered. */
	ck_assert_int_eq(provider_reg(gpd, buf_b, 3 * ps, (uintptr_t)buf_b, MRD_ACCESS_LOCAL_WRITE,
				      &small), 0);
	ck_assert_int_eq(soft_gate_wait(dir, 0), -ETIMEDOUT);

	op = (struct gated_op){ .pd = gpd, .addr = buf_a, .length = NPAGES * ps, .r = 1 };
	ck_assert_int_eq(pthread_create(&t, NULL, gated_reg, &op), 0);
	ck_assert_int_eq(soft_gate_wait(dir, 10000), 'r');
	ck_assert_int_eq(op.r, 1); /* held: it cannot have returned before the release */
	soft_gate_release(dir, 1);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(op.r, 0);

	op.r = 1;
	ck_assert_int_eq(pthread_create(&t, NULL, gated_advise, &op), 0);
	ck_assert_int_eq(soft_gate_wait(dir, 10000), 'a');
	ck_assert_int_eq(op.r, 1);
	soft_gate_release(dir, 1);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(op.r, 0);
	ck_assert_int_eq(soft_gate_wait(dir, 0), -ETIMEDOUT);

	ck_assert_int_eq(provider_dereg(op.mr), 0);
	ck_assert_int_eq(provider_dereg(small), 0);
	ck_assert_int_eq(provider_pd_free(gpd), 0);
	provider_close(gp);
	soft_gate_cleanup(dir);
}
END_TEST

/* A gate whose paths are not FIFOs would not hold (a file) or hold forever: the soft
 * provider refuses to open with one, or with a threshold that is not a number. */
START_TEST(test_soft_gate_refuses_non_fifos)
{
	struct provider *gp;
	char dir[] = "/tmp/mrd-gate-bad.XXXXXX", path[PATH_MAX];
	int verbs_error, fd;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_eq(setenv("MRD_SOFT_GATE", dir, 1), 0);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &gp, &verbs_error), -EINVAL);
	snprintf(path, sizeof(path), "%s/entered", dir);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	snprintf(path, sizeof(path), "%s/release", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600); /* a plain file */
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &gp, &verbs_error), -EINVAL);
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	ck_assert_int_eq(setenv("MRD_SOFT_GATE_BYTES", "4k", 1), 0);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &gp, &verbs_error), -EINVAL);
	ck_assert_int_eq(setenv("MRD_SOFT_GATE_BYTES", "4096", 1), 0);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &gp, &verbs_error), 0);
	provider_close(gp);
	soft_gate_cleanup(dir);
}
END_TEST

struct gated_dma {
	struct provider_pd *pd;
	struct provider_mr *src, *dst;
	int r;
};

static void *gated_dma(void *arg)
{
	struct gated_dma *op = arg;

	op->r = provider_dma(op->pd, PROVIDER_DMA_WRITE, op->src->lkey, op->src->iova,
			     op->dst->rkey, op->dst->iova, op->src->length);
	return NULL;
}

struct done_op {
	struct gated_op op;
	bool done;
};

static void *small_reg(void *arg)
{
	struct done_op *d = arg;

	d->op.r = provider_reg(d->op.pd, d->op.addr, d->op.length, (uintptr_t)d->op.addr, 0,
			       &d->op.mr);
	__atomic_store_n(&d->done, true, __ATOMIC_RELEASE);
	return NULL;
}

static void *invalidate_all(void *arg)
{
	struct done_op *d = arg;

	d->op.r = provider_invalidate(d->op.mr, d->op.mr->iova, d->op.mr->length);
	__atomic_store_n(&d->done, true, __ATOMIC_RELEASE);
	return NULL;
}

/* A DMA that faults an on-demand MR's pages in populates them without the provider's lock
 * (held at the gate meanwhile: 'f'), so a registration on the same context completes; the
 * MR stays held (an invalidate waits, then zaps what the DMA installed), and the faults
 * count when the pages are installed. */
START_TEST(test_soft_dma_faults_outside_the_lock)
{
	struct provider *gp;
	struct provider_pd *gpd;
	struct provider_stats s;
	struct gated_dma dma;
	struct done_op small = { 0 }, inval = { 0 };
	pthread_t td, tr, ti;
	char dir[64];
	int verbs_error;

	ck_assert_int_eq(soft_gate_setenv(dir, sizeof(dir), NPAGES * ps), 0);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &gp, &verbs_error), 0);
	ck_assert_int_eq(provider_pd_alloc(gp, &gpd), 0);
	dma = (struct gated_dma){ .pd = gpd, .r = 1 };
	soft_gate_release(dir, 2); /* the two registrations are as big: they go on */
	ck_assert_int_eq(provider_reg(gpd, buf_a, NPAGES * ps, (uintptr_t)buf_a,
				      MRD_ACCESS_ON_DEMAND, &dma.src), 0);
	ck_assert_int_eq(provider_reg(gpd, buf_b, NPAGES * ps, (uintptr_t)buf_b,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE, &dma.dst), 0);
	for (size_t i = 0; i < NPAGES * ps; i++)
		buf_a[i] = (uint8_t)(i * 7 + 1);
	ck_assert_int_eq(soft_gate_wait(dir, 0), 'r');
	ck_assert_int_eq(soft_gate_wait(dir, 0), 'r');

	ck_assert_int_eq(pthread_create(&td, NULL, gated_dma, &dma), 0);
	ck_assert_int_eq(soft_gate_wait(dir, 10000), 'f');
	small.op = (struct gated_op){ .pd = gpd, .addr = buf_b, .length = ps, .r = 1 };
	ck_assert_int_eq(pthread_create(&tr, NULL, small_reg, &small), 0);
	/* A registration that waits for the DMA waits until the gate opens: forever. */
	test_wait_until(__atomic_load_n(&small.done, __ATOMIC_ACQUIRE), 1000);
	if (!__atomic_load_n(&small.done, __ATOMIC_ACQUIRE)) {
		soft_gate_release(dir, 1); /* so the threads end before the test does */
		pthread_join(td, NULL);
		pthread_join(tr, NULL);
		ck_abort_msg("a registration waited %d s for a DMA's page faults", TEST_WAIT_S);
	}
	provider_stats(gp, &s);
	ck_assert_uint_eq(s.odp_faults, 0); /* nothing installed before the pages are present */
	inval.op = (struct gated_op){ .mr = dma.src, .r = 1 };
	ck_assert_int_eq(pthread_create(&ti, NULL, invalidate_all, &inval), 0);
	usleep(50000);
	ck_assert_msg(!__atomic_load_n(&inval.done, __ATOMIC_ACQUIRE),
		      "an invalidate went on while the DMA populated its MR");
	ck_assert_int_eq(dma.r, 1); /* held: it cannot have returned before the release */
	soft_gate_release(dir, 1);
	ck_assert_int_eq(pthread_join(td, NULL), 0);
	ck_assert_int_eq(pthread_join(tr, NULL), 0);
	ck_assert_int_eq(pthread_join(ti, NULL), 0);
	ck_assert_int_eq(small.op.r, 0);
	ck_assert_int_eq(dma.r, 0);
	ck_assert_int_eq(inval.op.r, 0);
	ck_assert_int_eq(memcmp(buf_a, buf_b, NPAGES * ps), 0);
	provider_stats(gp, &s);
	ck_assert_uint_eq(s.odp_faults, NPAGES);
	ck_assert_uint_eq(s.odp_invalidations, NPAGES); /* it waited for the DMA's pages */
	ck_assert_int_eq(soft_gate_wait(dir, 0), -ETIMEDOUT);

	ck_assert_int_eq(provider_dereg(small.op.mr), 0);
	ck_assert_int_eq(provider_dereg(dma.src), 0);
	ck_assert_int_eq(provider_dereg(dma.dst), 0);
	ck_assert_int_eq(provider_pd_free(gpd), 0);
	provider_close(gp);
	soft_gate_cleanup(dir);
}
END_TEST

/* Memory windows (type 2). Soft models the rules of rxe, the strictest device (provider.h,
 * provider_mw_bind); on a device without windows every op refuses, saying why. On verbs a
 * refused DMA replaces the loopback's QPs, and a window bound on the old pair reaches nothing
 * (rxe_lookup_mw: mw->qp): the cases rebind after each refusal (mw_rebind). */
#define MW_RW (MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ)
#define MR_MW (MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_MW_BIND)

static struct provider_mw *mw_alloc(void)
{
	struct provider_mw *mw = NULL;

	ck_assert_int_eq(provider_mw_alloc(pd, &mw), 0);
	ck_assert_ptr_nonnull(mw);
	ck_assert_ptr_null(mw->mr);
	return mw;
}

static uint32_t mw_bind(struct provider_mw *mw, struct provider_mr *mr, uint64_t addr,
			uint64_t len, unsigned access)
{
	uint32_t rkey = 0;
	int r = provider_mw_bind(mw, mr, addr, len, access, &rkey);

	/* No Check record unless it fails: the cycles case binds 10^5 times. */
	if (r != 0 || rkey != mw->rkey || mw->mr != mr || rkey == mr->rkey || rkey == mr->lkey)
		ck_abort_msg("bind: %d, rkey 0x%x (window's 0x%x, MR's 0x%x/0x%x), on the MR: %d", r,
			     rkey, mw->rkey, mr->rkey, mr->lkey, mw->mr == mr);
	return rkey;
}

/* After a refused DMA: soft keeps the window; verbs' loopback took it off (see above). */
static uint32_t mw_rebind(struct provider_mw *mw)
{
	struct provider_mw was = *mw;

	if (p->caps.dma_emulated)
		return mw->rkey;
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	return mw_bind(mw, was.mr, was.addr, was.length, was.access);
}

static int dma_to(struct provider_mr *src, uint32_t rkey, uint64_t raddr, size_t len)
{
	return provider_dma(pd, PROVIDER_DMA_WRITE, src->lkey, src->iova, rkey, raddr, len);
}

/* Without windows every op refuses with -EOPNOTSUPP, and caps says why. */
static void check_mw_caps(void)
{
	struct provider_mr *mr = NULL;
	struct provider_mw *mw = NULL;
	struct provider_stats s;

	if (!p->caps.mw) {
		printf("windows refused: %s\n", p->caps.no_mw);
		ck_assert_ptr_nonnull(p->caps.no_mw);
		ck_assert_int_gt(strlen(p->caps.no_mw), 0);
		ck_assert_int_eq(provider_mw_alloc(pd, &mw), -EOPNOTSUPP);
		ck_assert_ptr_null(mw);
		ck_assert_int_eq(provider_reg(pd, buf_a, ps, (uintptr_t)buf_a, MR_MW, &mr),
				 -EOPNOTSUPP);
		mr = reg(buf_a, ps, MRD_ACCESS_LOCAL_WRITE);
		ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_ACCESS, NULL, 0, 0, MR_MW),
				 -EOPNOTSUPP);
		ck_assert_int_eq(provider_dereg(mr), 0);
		return;
	}
	ck_assert_ptr_null(p->caps.no_mw);
	mw = mw_alloc();
	provider_stats(p, &s);
	ck_assert_uint_eq(s.mws, 1);
	ck_assert_int_eq(provider_pd_free(pd), -EBUSY); /* a window holds its PD */
	ck_assert_int_eq(provider_mw_invalidate(mw), -EINVAL); /* not bound */
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	provider_stats(p, &s);
	ck_assert_uint_eq(s.mws, 0);
}

START_TEST(test_mw_caps)
{
	if (strcmp(CONTRACT_PROVIDER, "soft") == 0)
		ck_assert(p->caps.mw);
	check_mw_caps();
}
END_TEST

/* The window's rkey reaches exactly [addr, addr + len) with the access bound, though the MR's
 * own rkey grants no remote access at all; a byte before or after is refused (where the
 * device checks a window's own range: caps.mw_wide), and so is anything outside the MR. */
START_TEST(test_mw_reaches_exact_bytes)
{
	struct provider_mr *src = reg(buf_a, NPAGES * ps, MRD_ACCESS_LOCAL_WRITE);
	struct provider_mr *mr = reg(buf_b + ps, 4 * ps, MR_MW);
	struct provider_mw *mw = mw_alloc();
	const uint64_t off = ps - 10, len = 100; /* crosses a page boundary */
	uint64_t at = mr->iova + off;
	uint32_t rkey = mw_bind(mw, mr, at, len, MW_RW);

	for (size_t i = 0; i < NPAGES * ps; i++)
		buf_a[i] = (uint8_t)(i * 7 + 1);
	ck_assert_int_eq(dma_to(src, rkey, at, len), 0);
	ck_assert(memcmp(buf_b + ps + off, buf_a, len) == 0);
	for (size_t i = 0; i < NPAGES * ps; i++)
		if (i < ps + off || i >= ps + off + len)
			ck_assert_msg(buf_b[i] == 0, "byte %zu outside the window changed", i);
	ck_assert_int_eq(dma_to(src, rkey, at + len - 1, 1), 0); /* its last byte */
	memset(buf_a, 0, ps);
	ck_assert_int_eq(provider_dma(pd, PROVIDER_DMA_READ, src->lkey, src->iova, rkey, at, len),
			 0);
	ck_assert(memcmp(buf_a, buf_b + ps + off, len) == 0);

	/* The MR's own rkey: no remote access. */
	ck_assert_refused(dma_to(src, mr->rkey, at, 1), -EACCES);
	rkey = mw_rebind(mw);
	memset(buf_b, 0, NPAGES * ps);
	if (!p->caps.mw_wide) {
		ck_assert_refused(dma_to(src, rkey, at - 1, 1), -EFAULT);
		rkey = mw_rebind(mw);
		ck_assert_refused(dma_to(src, rkey, at + len, 1), -EFAULT);
		rkey = mw_rebind(mw);
		ck_assert_refused(dma_to(src, rkey, at, len + 1), -EFAULT);
		rkey = mw_rebind(mw);
	} else {
		/* What caps.mw_wide says, seen: the byte before the window (in the MR) is
		 * reached; a device that checks windows now fails here, to be told apart. */
		ck_assert_int_eq(dma_to(src, rkey, at - 1, 1), 0);
		ck_assert_uint_eq(buf_b[ps + off - 1], buf_a[0]);
		buf_b[ps + off - 1] = 0;
		printf("note: window bounds within the MR not checked: %s\n", p->caps.mw_wide);
	}
	ck_assert_refused(dma_to(src, rkey, mr->iova - 1, 1), -EFAULT);
	rkey = mw_rebind(mw);
	ck_assert_refused(dma_to(src, rkey, mr->iova + mr->length, 1), -EFAULT);
	for (size_t i = 0; i < NPAGES * ps; i++)
		ck_assert_msg(buf_b[i] == 0, "a refused DMA wrote byte %zu", i);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);

	/* A read-only window refuses a write. */
	rkey = mw_bind(mw, mr, at, len, MRD_ACCESS_REMOTE_READ);
	ck_assert_refused(dma_to(src, rkey, at, 1), -EACCES);
	ck_assert_int_eq(buf_b[ps + off], 0);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0); /* bound: the MR is free again */
	ck_assert_uint_eq(mr->n_mws, 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* Invalidated, the rkey is refused at once; a second invalidate is refused (rxe would oops). */
START_TEST(test_mw_invalidate_refuses_at_once)
{
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *mr = reg(buf_b, ps, MR_MW);
	struct provider_mw *mw = mw_alloc();
	uint32_t rkey = mw_bind(mw, mr, mr->iova, ps, MW_RW);

	buf_a[0] = 0x42;
	ck_assert_int_eq(dma_to(src, rkey, mr->iova, 1), 0);
	ck_assert_int_eq(buf_b[0], 0x42);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	ck_assert_ptr_null(mw->mr);
	ck_assert_uint_eq(mr->n_mws, 0);
	buf_a[0] = 0x43;
	ck_assert_refused(dma_to(src, rkey, mr->iova, 1), -ENOKEY);
	ck_assert_int_eq(buf_b[0], 0x42);
	ck_assert_int_eq(provider_mw_invalidate(mw), -EINVAL);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* A bound window does not bind again (rxe: only a free type-2 window binds); bound anew after
 * an invalidate, its key byte is advanced (or, soft, its index is new) and the old rkey is
 * refused. */
START_TEST(test_mw_rebind_advances_key)
{
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *mr = reg(buf_b, 2 * ps, MR_MW);
	struct provider_mw *mw = mw_alloc();
	uint32_t k1 = mw_bind(mw, mr, mr->iova, ps, MW_RW), k2, dummy = 0;

	ck_assert_int_eq(provider_mw_bind(mw, mr, mr->iova + ps, ps, MW_RW, &dummy), -EINVAL);
	ck_assert_ptr_eq(mw->mr, mr);
	ck_assert_uint_eq(mw->rkey, k1);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	k2 = mw_bind(mw, mr, mr->iova + ps, ps, MW_RW);
	ck_assert_uint_ne(k1, k2);
	ck_assert_msg((k2 & 0xff) == ((k1 + 1) & 0xff) || (k2 >> 8) != (k1 >> 8),
		      "0x%x after 0x%x: key byte not advanced", k2, k1);
	buf_a[0] = 0x42;
	ck_assert_refused(dma_to(src, k1, mr->iova + ps, 1), -ENOKEY);
	ck_assert_int_eq(buf_b[ps], 0);
	k2 = mw_rebind(mw);
	ck_assert_int_eq(dma_to(src, k2, mr->iova + ps, 1), 0);
	ck_assert_int_eq(buf_b[ps], 0x42);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* 10^5 bind/invalidate cycles of one window: no key repeats within caps.mw_fresh_binds binds
 * (0: ever); every MW_SAMPLE_EVERY cycles the live key works, MW_SAMPLE - 1 old keys drawn at
 * random are refused while the window is bound anew, and the live one once invalidated (100
 * granted DMAs and 1,000 refused in all). */
#define MW_CYCLES 100000
#define MW_SAMPLE_EVERY 1000
#define MW_SAMPLE 10
static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Whether a DMA's answer is a refusal of the key (as ck_assert_refused, which would record
 * its line each time: 10^7 of them filled the VM's Check file). */
static bool refused(int got, int want)
{
	return got == want || (!p->caps.dma_emulated && got == -EKEYREJECTED);
}

/* 10^5 binds, each checked without a Check record per step (a record per ck_assert: the
 * 2.5 x 10^7 of the fresh-key check filled the rxe VM's RAM disk, and Check's runner died
 * with "Error in call to get_result"); the first fault fails the case. */
START_TEST(test_mw_cycles_never_revive_keys)
{
	static uint32_t keys[MW_CYCLES], sorted[MW_CYCLES];
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *mr = reg(buf_b, ps, MR_MW);
	struct provider_mw *mw = mw_alloc();
	unsigned fresh = p->caps.mw_fresh_binds;
	unsigned seed = 41;
	int r;

	buf_a[0] = 0x42;
	for (size_t i = 0; i < MW_CYCLES; i++) {
		keys[i] = mw_bind(mw, mr, mr->iova, 8, MRD_ACCESS_REMOTE_WRITE);
		if (i % MW_SAMPLE_EVERY != MW_SAMPLE_EVERY - 1) {
			if ((r = provider_mw_invalidate(mw)) != 0)
				ck_abort_msg("invalidate %zu: %d", i, r);
			continue;
		}
		buf_b[0] = 0;
		ck_assert_int_eq(dma_to(src, keys[i], mr->iova, 1), 0);
		ck_assert_int_eq(buf_b[0], 0x42);
		buf_b[0] = 0;
		/* Old keys while the window is bound anew, then the live one once invalidated. */
		for (int k = 0; k < MW_SAMPLE - 1; k++) {
			size_t j = (size_t)rand_r(&seed) % i;

			if (keys[j] != keys[i] && /* verbs: the key byte's 256 may come round */
			    !refused(r = dma_to(src, keys[j], mr->iova, 1), -ENOKEY))
				ck_abort_msg("bind %zu's key 0x%x at bind %zu: DMA answered %d", j,
					     keys[j], i, r);
		}
		ck_assert_int_eq(provider_mw_invalidate(mw), 0);
		ck_assert_refused(dma_to(src, keys[i], mr->iova, 1), -ENOKEY);
		ck_assert_int_eq(buf_b[0], 0);
	}
	if (fresh == 0) {
		memcpy(sorted, keys, sizeof(keys));
		qsort(sorted, MW_CYCLES, sizeof(sorted[0]), cmp_u32);
		for (size_t i = 1; i < MW_CYCLES; i++)
			if (sorted[i] == sorted[i - 1])
				ck_abort_msg("key 0x%x bound twice", sorted[i]);
	} else
		for (size_t i = 0; i < MW_CYCLES; i++)
			for (size_t j = i > fresh - 1 ? i - (fresh - 1) : 0; j < i; j++)
				if (keys[i] == keys[j])
					ck_abort_msg("key 0x%x of bind %zu again at %zu", keys[i], j,
						     i);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* rxe's bind rules (provider_mw_bind), before any device sees the request. */
START_TEST(test_mw_bind_rules)
{
	struct provider_mr *plain = reg(buf_b, 2 * ps, MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE);
	struct provider_mr *ro = reg(buf_a, 2 * ps, MRD_ACCESS_MW_BIND);
	struct provider_mr *mr = reg(buf_a + 4 * ps, 2 * ps, MR_MW);
	struct provider_mw *mw = mw_alloc();
	struct provider_pd *pd2;
	struct provider_mw *other;
	uint32_t rkey = 0;

	/* C10-73: the MR must allow binding. */
	ck_assert_int_eq(provider_mw_bind(mw, plain, plain->iova, ps, MW_RW, &rkey), -EACCES);
	/* C10-74: writable windows need local write on the MR. */
	ck_assert_int_eq(provider_mw_bind(mw, ro, ro->iova, ps, MRD_ACCESS_REMOTE_WRITE, &rkey),
			 -EACCES);
	ck_assert_int_eq(provider_mw_bind(mw, ro, ro->iova, ps, MRD_ACCESS_REMOTE_ATOMIC, &rkey),
			 -EACCES);
	/* C10-75: inside the MR; o10-37.2.40: not empty; remote bits only. */
	ck_assert_int_eq(provider_mw_bind(mw, mr, mr->iova - 1, ps, MW_RW, &rkey), -EINVAL);
	ck_assert_int_eq(provider_mw_bind(mw, mr, mr->iova + ps, ps + 1, MW_RW, &rkey), -EINVAL);
	ck_assert_int_eq(provider_mw_bind(mw, mr, mr->iova + 1, UINT64_MAX, MW_RW, &rkey), -EINVAL);
	ck_assert_int_eq(provider_mw_bind(mw, mr, mr->iova, 0, MW_RW, &rkey), -EINVAL);
	ck_assert_int_eq(provider_mw_bind(mw, mr, mr->iova, ps, MRD_ACCESS_LOCAL_WRITE, &rkey),
			 -EINVAL);
	ck_assert_int_eq(provider_mw_bind(mw, mr, mr->iova, ps, MRD_ACCESS_MW_BIND, &rkey),
			 -EINVAL);
	ck_assert_ptr_null(mw->mr);
	ck_assert_uint_eq(mr->n_mws + ro->n_mws + plain->n_mws, 0);
	/* C10-72: a window of another PD. */
	ck_assert_int_eq(provider_pd_alloc(p, &pd2), 0);
	ck_assert_int_eq(provider_mw_alloc(pd2, &other), 0);
	ck_assert_int_eq(provider_mw_bind(other, mr, mr->iova, ps, MW_RW, &rkey), -EINVAL);
	ck_assert_int_eq(provider_mw_dealloc(other), 0);
	ck_assert_int_eq(provider_pd_free(pd2), 0);
	/* Granted: read-only over a read-only MR, and exactly the whole MR. */
	mw_bind(mw, ro, ro->iova, 2 * ps, MRD_ACCESS_REMOTE_READ);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	mw_bind(mw, mr, mr->iova, 2 * ps, MW_RW);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_dereg(plain), 0);
	ck_assert_int_eq(provider_dereg(ro), 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

/* As rxe (rxe_dereg_mr: num_mw): an MR with a window bound is not deregistered, parked or
 * moved; once the window is invalidated it is. */
START_TEST(test_mw_dereg_bound_refused)
{
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *mr = reg(buf_b, 2 * ps, MR_MW);
	struct provider_mw *mw = mw_alloc();
	uint32_t rkey = mw_bind(mw, mr, mr->iova, ps, MW_RW);

	ck_assert_int_eq(provider_dereg(mr), -EBUSY);
	ck_assert_int_eq(provider_park(mr), p->ops->park ? -EBUSY : -EOPNOTSUPP);
	ck_assert_int_eq(provider_park_in_place(mr), p->ops->park_in_place ? -EBUSY : -EOPNOTSUPP);
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_ACCESS, NULL, 0, 0,
					MRD_ACCESS_LOCAL_WRITE), -EBUSY);
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, buf_b + 4 * ps, ps,
					(uintptr_t)buf_b + 4 * ps, MR_MW), -EBUSY);
	buf_a[0] = 0x42;
	ck_assert_int_eq(dma_to(src, rkey, mr->iova, 1), 0); /* all of it as it was */
	ck_assert_int_eq(buf_b[0], 0x42);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* A lost device keeps its windows as handles: their keys reach nothing, bind and invalidate
 * fail with -ENODEV, dealloc works; revived, each is free (its binding forgotten, the MR free to
 * go), its old key still refused, and binds anew. */
START_TEST(test_soft_mw_lose_revive)
{
	struct provider_mr *src = reg(buf_a, ps, 0);
	struct provider_mr *mr = reg(buf_b, ps, MR_MW);
	struct provider_mw *mw = mw_alloc(), *spare = mw_alloc();
	uint32_t old = mw_bind(mw, mr, mr->iova, ps, MW_RW), fresh, dummy;

	provider_lose(p);
	ck_assert_int_eq(dma_to(src, old, mr->iova, 1), -ENODEV);
	ck_assert_int_eq(provider_mw_invalidate(mw), -ENODEV);
	ck_assert_int_eq(provider_mw_bind(spare, mr, mr->iova, ps, MW_RW, &dummy), -ENODEV);
	ck_assert_int_eq(provider_mw_dealloc(spare), 0);
	ck_assert_int_eq(provider_revive(p), 0);
	ck_assert_ptr_null(mw->mr);
	ck_assert_uint_eq(mr->n_mws, 0);
	buf_a[0] = 0x42;
	ck_assert_int_eq(dma_to(src, old, mr->iova, 1), -ENOKEY);
	ck_assert_int_eq(buf_b[0], 0);
	fresh = mw_bind(mw, mr, mr->iova, ps, MW_RW);
	ck_assert_uint_ne(fresh, old);
	ck_assert_int_eq(dma_to(src, fresh, mr->iova, 1), 0);
	ck_assert_int_eq(buf_b[0], 0x42);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
}
END_TEST

/* A lost device lets its MRs go though windows were bound over them (lose's contract: dereg
 * and pd_free succeed on its handles), as verbs' lose does (review: soft kept the windows
 * bound, so the dereg was -EBUSY on soft alone). */
START_TEST(test_soft_mw_lost_device_lets_mrs_go)
{
	struct provider_mr *mr = reg(buf_b, ps, MR_MW);
	struct provider_mw *mw = mw_alloc();

	(void)mw_bind(mw, mr, mr->iova, ps, MW_RW);
	provider_lose(p);
	ck_assert_ptr_null(mw->mr);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_revive(p), 0);
}
END_TEST

struct window_dma {
	struct provider_pd *pd;
	struct provider_mr *src;
	struct provider_mw *mw;
	uint32_t rkey;
	int r;
	bool done;
};

static void *window_dma(void *arg)
{
	struct window_dma *op = arg;

	op->r = provider_dma(op->pd, PROVIDER_DMA_WRITE, op->src->lkey, op->src->iova, op->rkey,
			     op->mw->addr, op->mw->length);
	return NULL;
}

static void *window_invalidate(void *arg)
{
	struct window_dma *op = arg;

	op->r = provider_mw_invalidate(op->mw);
	__atomic_store_n(&op->done, true, __ATOMIC_RELEASE);
	return NULL;
}

/* A transfer under way through a window held at the gate (faulting its on-demand source in, or
 * halfway through its copy at the chunk gate) does not hold the invalidate: it returns at once
 * (mrd's loop runs it: a 64 MiB transfer held every client's requests), and from then on no
 * byte lands; the transfer fails -ENOKEY, the bytes it copied before staying, as rxe stops a
 * message whose later packets meet the invalidated key. Before this, the invalidate waited
 * for the whole transfer. */
static void invalidate_under_way(bool halfway)
{
	const size_t pages = halfway ? 64 : NPAGES, len = pages * ps; /* 4 chunks of 64 KiB */
	uint8_t *a = map_pages(pages), *b = map_pages(pages);
	struct provider *gp;
	struct provider_pd *gpd;
	struct provider_mr *dst;
	struct window_dma dma = { .r = 1 }, inval = { .r = 1 };
	pthread_t td, ti;
	size_t landed = 0;
	char dir[64];
	int verbs_error;

	ck_assert_int_eq(soft_gate_setenv(dir, sizeof(dir), len), 0);
	ck_assert_int_eq(provider_open(CONTRACT_PROVIDER, NULL, &gp, &verbs_error), 0);
	ck_assert_int_eq(provider_pd_alloc(gp, &gpd), 0);
	soft_gate_release(dir, 2); /* the two registrations are as big: they go on */
	ck_assert_int_eq(provider_reg(gpd, a, len, (uintptr_t)a,
				      halfway ? MRD_ACCESS_LOCAL_WRITE : MRD_ACCESS_ON_DEMAND,
				      &dma.src), 0);
	ck_assert_int_eq(provider_reg(gpd, b, len, (uintptr_t)b, MR_MW, &dst), 0);
	ck_assert_int_eq(soft_gate_wait(dir, 0), 'r');
	ck_assert_int_eq(soft_gate_wait(dir, 0), 'r');
	memset(a, 0x42, len);
	dma.pd = inval.pd = gpd;
	ck_assert_int_eq(provider_mw_alloc(gpd, &dma.mw), 0);
	inval.mw = dma.mw;
	ck_assert_int_eq(provider_mw_bind(dma.mw, dst, dst->iova, len, MRD_ACCESS_REMOTE_WRITE,
					  &dma.rkey), 0);

	ck_assert_int_eq(pthread_create(&td, NULL, window_dma, &dma), 0);
	ck_assert_int_eq(soft_gate_wait(dir, 60000), halfway ? 'c' : 'f');
	ck_assert_int_eq(pthread_create(&ti, NULL, window_invalidate, &inval), 0);
	/* The event: the invalidate's return, while the gate still holds the transfer. */
	test_wait_until(__atomic_load_n(&inval.done, __ATOMIC_ACQUIRE), 60000);
	ck_assert_msg(__atomic_load_n(&inval.done, __ATOMIC_ACQUIRE),
		      "the invalidate waited for the transfer under way");
	ck_assert_int_eq(pthread_join(ti, NULL), 0);
	ck_assert_int_eq(inval.r, 0);
	ck_assert_int_eq(provider_dma(gpd, PROVIDER_DMA_WRITE, dma.src->lkey, dma.src->iova,
				      dma.rkey, dst->iova, 1), -ENOKEY);
	soft_gate_release(dir, 1);
	ck_assert_int_eq(pthread_join(td, NULL), 0);
	ck_assert_int_eq(dma.r, -ENOKEY);
	while (landed < len && b[landed] == 0x42)
		landed++;
	/* Halfway: the first chunk landed, nothing after; not begun: nothing. */
	ck_assert_uint_eq(landed, halfway ? 64u << 10 : 0);
	for (size_t i = landed; i < len; i++)
		ck_assert_msg(b[i] == 0, "byte %zu landed after the invalidate", i);
	ck_assert_int_eq(provider_mw_dealloc(dma.mw), 0);
	ck_assert_int_eq(provider_dereg(dma.src), 0);
	ck_assert_int_eq(provider_dereg(dst), 0);
	ck_assert_int_eq(provider_pd_free(gpd), 0);
	provider_close(gp);
	soft_gate_cleanup(dir);
	munmap(a, len);
	munmap(b, len);
}

START_TEST(test_soft_mw_invalidate_stops_transfer_not_begun)
{
	invalidate_under_way(false);
}
END_TEST

START_TEST(test_soft_mw_invalidate_stops_transfer_halfway)
{
	invalidate_under_way(true);
}
END_TEST

/* $MRD_SOFT_MW=none is a device without windows (siw): test_mw_caps's other half, run on the
 * host; another value fails the open. */
START_TEST(test_soft_no_windows)
{
	struct provider *saved = p, *none;
	struct provider_pd *saved_pd = pd;

	ck_assert_int_eq(open_soft_with("MRD_SOFT_MW", "type1", &none), -EINVAL);
	ck_assert_int_eq(open_soft_with("MRD_SOFT_MW", "none", &none), 0);
	ck_assert(!none->caps.mw);
	p = none;
	ck_assert_int_eq(provider_pd_alloc(p, &pd), 0);
	check_mw_caps();
	ck_assert_int_eq(provider_pd_free(pd), 0);
	provider_close(none);
	p = saved;
	pd = saved_pd;
}
END_TEST

/* $MRD_SOFT_KEYS=mlx5: an MR's key comes back to the next registration of its size, but a
 * window's key never reaches memory again: not the new MR's under the same MR key, not after
 * the window is bound over it anew. Window keys are never MR keys. */
START_TEST(test_soft_mlx5_window_keys_stay_dead)
{
	struct provider *cached;
	struct provider_pd *kpd;
	struct provider_mr *src, *a, *b;
	struct provider_mw *mw;
	uint32_t ka, w[3];
	int r;

	r = open_soft_with("MRD_SOFT_KEYS", "mlx5", &cached);
	ck_assert_int_eq(r, 0);
	ck_assert(cached->caps.keys_come_back && cached->caps.mw);
	ck_assert_int_eq(provider_pd_alloc(cached, &kpd), 0);
	ck_assert_int_eq(provider_reg(kpd, buf_a, ps, (uintptr_t)buf_a, 0, &src), 0);
	ck_assert_int_eq(provider_reg(kpd, buf_b, ps, (uintptr_t)buf_b, MR_MW, &a), 0);
	ka = a->rkey;
	ck_assert_int_eq(provider_mw_alloc(kpd, &mw), 0);
	ck_assert_int_eq(provider_mw_bind(mw, a, a->iova, ps, MW_RW, &w[0]), 0);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	ck_assert_int_eq(provider_mw_bind(mw, a, a->iova, ps, MW_RW, &w[1]), 0);
	ck_assert_int_eq(provider_mw_invalidate(mw), 0);
	ck_assert_int_eq(provider_dereg(a), 0);
	ck_assert_int_eq(provider_reg(kpd, buf_b + ps, ps, (uintptr_t)buf_b + ps, MR_MW, &b), 0);
	ck_assert_uint_eq(b->rkey, ka); /* the MR key came back */
	buf_a[0] = 0x42;
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(provider_dma(kpd, PROVIDER_DMA_WRITE, src->lkey, src->iova, w[i],
					      b->iova, 1), -ENOKEY);
	ck_assert_int_eq(provider_mw_bind(mw, b, b->iova, ps, MW_RW, &w[2]), 0);
	for (int i = 0; i < 2; i++) {
		ck_assert_uint_ne(w[i], w[2]);
		ck_assert_int_eq(provider_dma(kpd, PROVIDER_DMA_WRITE, src->lkey, src->iova, w[i],
					      b->iova, 1), -ENOKEY);
	}
	ck_assert_int_eq(buf_b[ps], 0);
	ck_assert_int_eq(provider_dma(kpd, PROVIDER_DMA_WRITE, src->lkey, src->iova, w[2], b->iova,
				      1), 0);
	ck_assert_int_eq(buf_b[ps], 0x42);
	for (int i = 0; i < 3; i++)
		ck_assert_uint_ne(w[i] >> 8, ka >> 8); /* another key space */
	ck_assert_int_eq(provider_mw_dealloc(mw), 0);
	ck_assert_int_eq(provider_dma(kpd, PROVIDER_DMA_WRITE, src->lkey, src->iova, w[2], b->iova,
				      1), -ENOKEY);
	ck_assert_int_eq(provider_dereg(b), 0);
	ck_assert_int_eq(provider_dereg(src), 0);
	ck_assert_int_eq(provider_pd_free(kpd), 0);
	provider_close(cached);
}
END_TEST

int main(void)
{
	struct provider *probe;
	Suite *s;
	TCase *tc;
	int verbs_error, r;

	device = getenv("MRD_CONTRACT_DEVICE");
	r = provider_open(CONTRACT_PROVIDER, device, &probe, &verbs_error);
	if (r == -ENODEV) {
		printf("not run: no RDMA device %s for the %s provider (ibv_get_device_list found "
		       "none; real verbs runs in the rxe VM test)\n", device ? device : "",
		       CONTRACT_PROVIDER);
		return 77;
	}
	if (r < 0) {
		printf("cannot open the %s provider: %s\n", CONTRACT_PROVIDER, strerror(-r));
		return EXIT_FAILURE;
	}
	printf("provider %s, device %s, rereg probe: %s\n", provider_name(probe), probe->caps.device,
	       probe->caps.rereg_probe);
	s = suite_create("provider-contract-" CONTRACT_PROVIDER);
	tc = tcase_create("contract");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_access_rules);
	tcase_add_test(tc, test_lengths);
	tcase_add_test(tc, test_keys_differ_on_reuse);
	tcase_add_test(tc, test_pinning_accounted);
	tcase_add_test(tc, test_stats_count_mrs);
	tcase_add_test(tc, test_pd_busy);
	tcase_add_test(tc, test_unmapped_memory);
	tcase_add_test(tc, test_readonly_memory);
	tcase_add_test(tc, test_rereg_access);
	tcase_add_test(tc, test_export_pd);
	tcase_add_test(tc, test_rereg_probe_answered);
	if (probe->caps.dma) {
		tcase_add_test(tc, test_dma_reaches_exact_bytes);
		tcase_add_test(tc, test_dma_access_checks);
		tcase_add_test(tc, test_dma_bounds);
		tcase_add_test(tc, test_stale_key_rejected);
		tcase_add_test(tc, test_other_pd_keys_refused);
		tcase_add_test(tc, test_iova_addressing);
		/* A device's keys are the device's; and soft's moves must give new ones. */
		if (probe->caps.dma_emulated && probe->caps.rereg_new_keys)
			tcase_add_test(tc, test_keys_never_revisit);
		if (probe->caps.max_keys && probe->caps.odp)
			tcase_add_test(tc, test_keys_used_up_per_context);
	} else
		printf("not run: DMA cases (%s)\n", probe->caps.no_dma);
	tcase_add_test(tc, test_mw_caps);
	if (probe->caps.mw && probe->caps.dma) {
		tcase_add_test(tc, test_mw_reaches_exact_bytes);
		tcase_add_test(tc, test_mw_invalidate_refuses_at_once);
		tcase_add_test(tc, test_mw_rebind_advances_key);
		tcase_add_test(tc, test_mw_dereg_bound_refused);
	} else
		printf("not run: window DMA cases (%s)\n",
		       probe->caps.mw ? probe->caps.no_dma : probe->caps.no_mw);
	if (probe->caps.mw)
		tcase_add_test(tc, test_mw_bind_rules);
	if (probe->caps.rereg_translation)
		tcase_add_test(tc, test_rereg_translation);
	else
		printf("not run: rereg with a translation change (the device cannot)\n");
	if (probe->caps.rereg_translation && probe->caps.rereg_new_keys && probe->ops->park)
		tcase_add_test(tc, test_park_then_move);
	else
		printf("not run: parking a handle (moves keep keys or cannot happen: no pools)\n");
	if (probe->caps.odp) {
		tcase_add_test(tc, test_odp_pins_nothing_and_faults);
		tcase_add_test(tc, test_odp_write_prefetch_needs_write);
		/* Faults reported as soft reports them; rxe's ODP copy also misplaces data. */
		if (probe->caps.dma_emulated) {
			tcase_add_test(tc, test_odp_unmapped_faults_safely);
			tcase_add_test(tc, test_odp_readonly_faults_safely);
		}
	} else
		printf("not run: ODP cases (the device has no on-demand paging)\n");
	if (strcmp(CONTRACT_PROVIDER, "soft") == 0) {
		tcase_add_test(tc, test_soft_gate_holds_big_ops);
		tcase_add_test(tc, test_soft_gate_refuses_non_fifos);
		if (probe->caps.rereg_translation) /* it parks */
			tcase_add_test(tc, test_soft_mlx5_keys_come_back);
		tcase_add_test(tc, test_soft_mlx5_window_keys_stay_dead);
		tcase_add_test(tc, test_soft_no_windows);
		tcase_add_test(tc, test_soft_mw_lose_revive);
		tcase_add_test(tc, test_soft_mw_invalidate_stops_transfer_not_begun);
		tcase_add_test(tc, test_soft_mw_invalidate_stops_transfer_halfway);
		tcase_add_test(tc, test_soft_mw_lost_device_lets_mrs_go);
		tcase_add_test(tc, test_soft_dma_iwarp);
		tcase_add_test(tc, test_soft_caps_knobs);
		tcase_add_test(tc, test_soft_advise_split);
		tcase_add_test(tc, test_soft_prefetch_no_fault);
		tcase_add_test(tc, test_soft_dma_faults_outside_the_lock);
	}
	suite_add_tcase(s, tc);
	if (probe->caps.mw && probe->caps.dma) {
		/* 2 x 10^5 work requests awaited one by one on rxe: minutes under emulation. */
		TCase *cycles = tcase_create("window-cycles");

		tcase_add_checked_fixture(cycles, setup, teardown);
		tcase_set_timeout(cycles, 900);
		tcase_add_test(cycles, test_mw_cycles_never_revive_keys);
		suite_add_tcase(s, cycles);
	}
	provider_close(probe);
	return run_suite(s);
}
