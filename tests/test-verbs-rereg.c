/* SPDX-License-Identifier: MIT */
/* The arguments provider-verbs.c gives ibv_rereg_mr, without a device: this file includes
 * provider-verbs.c and defines ibv_alloc_pd, ibv_reg_mr(_iova2), ibv_rereg_mr and ibv_dereg_mr
 * itself (a definition in the program wins over libibverbs'), as a fake that applies
 * libibverbs' own input checks before its fake driver runs, and records the call. The input
 * checks are rdma-core's libibverbs/verbs.c, ibv_rereg_mr:
 *
 *	if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) { errno = EINVAL; return IBV_REREG_MR_ERR_INPUT; }
 *	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) { ... ERR_INPUT; }
 *	if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) { errno = EINVAL; ... ERR_INPUT; }
 *
 * and a failed driver call is IBV_REREG_MR_ERR_CMD with the driver's errno. The fake drivers:
 * rxe and siw refuse (rdma-core's providers have no rereg_mr, and libibverbs/dummy_ops.c's
 * stand-in sets EOPNOTSUPP; Linux 6.12's rxe_rereg_user_mr, sw/rxe/rxe_verbs.c, takes only
 * PD|ACCESS, and siw has no rereg_user_mr at all), mlx5 moves an MR in place and keeps its mkey
 * (hw/mlx5/mr.c, mlx5_ib_rereg_user_mr -> umr_rereg_pas; irdma keeps its stag likewise), and
 * a driver that makes the MR anew (mlx5's create_real_mr) gives new keys. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check-run.h"
#include "provider/provider-verbs.c"

#include "verbs-loopback-stub.h"

enum fake_driver {
	FAKE_NEW_KEYS, /* a move makes the MR anew: new lkey and rkey */
	FAKE_REFUSE,   /* rxe, siw: a translation change is -EOPNOTSUPP */
	FAKE_KEEP,     /* mlx5's UMR, irdma: a move keeps the keys */
	FAKE_KEEP_BIG, /* new keys for a page, kept beyond: one size is not enough to probe */
};

static enum fake_driver driver;
static long ps;
static uint32_t next_key = 0x100;
static struct {
	int calls, input_errors;
	int flags, access;
	struct ibv_pd *pd;
	void *addr;
	size_t length;
} last;

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	static struct ibv_pd pds[2]; /* the domain's, then the parking PD of verbs_park_in_place */
	static unsigned n;
	struct ibv_pd *pd = &pds[n++ % 2];

	pd->context = ctx;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd) { return 0; }

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	struct ibv_mr *mr = calloc(1, sizeof(*mr));

	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->lkey = mr->rkey = next_key++;
	return mr;
}

struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	free(mr);
	return 0;
}

int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
		 int access)
{
	last.calls++;
	last.flags = flags;
	last.access = access;
	last.pd = pd;
	last.addr = addr;
	last.length = length;
	/* libibverbs' input checks (libibverbs/verbs.c, above) */
	if ((flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
		last.input_errors++;
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		if (driver == FAKE_REFUSE) {
			errno = EOPNOTSUPP;
			return IBV_REREG_MR_ERR_CMD;
		}
		if (driver == FAKE_NEW_KEYS || (driver == FAKE_KEEP_BIG && length <= (size_t)ps))
			mr->lkey = mr->rkey = next_key++;
		mr->addr = addr;
		mr->length = length;
	}
	if (flags & IBV_REREG_MR_CHANGE_PD) /* mlx5: a UMR, the mkey kept (hw/mlx5/mr.c) */
		mr->pd = pd;
	return 0;
}

/* Lines with "rereg probe" that f logs at info (mrd's default level), stderr captured. */
static unsigned probe_lines(void (*f)(void))
{
	char out[4096];
	int saved = dup(STDERR_FILENO), cap = memfd_create("log", MFD_CLOEXEC);
	unsigned n = 0;
	ssize_t k;

	ck_assert_int_ge(saved, 0);
	ck_assert_int_ge(cap, 0);
	log_set_level(LOG_LEVEL_INFO);
	ck_assert_int_eq(dup2(cap, STDERR_FILENO), STDERR_FILENO);
	f();
	ck_assert_int_eq(dup2(saved, STDERR_FILENO), STDERR_FILENO);
	close(saved);
	k = pread(cap, out, sizeof(out) - 1, 0);
	close(cap);
	ck_assert_int_ge(k, 0);
	out[k] = '\0';
	for (const char *p = strstr(out, "rereg probe"); p; p = strstr(p + 1, "rereg probe"))
		n++;
	return n;
}

static struct verbs_provider vp;
static struct verbs_pd vpd;
static uint8_t *buf;

static void setup(void)
{
	ps = sysconf(_SC_PAGESIZE);
	memset(&last, 0, sizeof(last));
	memset(&vp, 0, sizeof(vp));
	vp.base.ops = &provider_verbs_ops;
	pthread_mutex_init(&vp.base.lock, NULL);
	pthread_mutex_init(&vp.base.event_lock, NULL);
	vp.base.caps.page_size = (uint32_t)ps;
	vp.base.caps.max_mr_size = 1ull << 40;
	vp.ctx = (struct ibv_context *)&vp; /* never dereferenced by the fake */
	vpd = (struct verbs_pd){ .base.provider = &vp.base, .pd = ibv_alloc_pd(vp.ctx) };
	buf = mmap(NULL, 4 * (size_t)ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(buf, MAP_FAILED);
	vp.parking = buf + 3 * ps;
}

static void teardown(void)
{
	munmap(buf, 4 * (size_t)ps);
	pthread_mutex_destroy(&vp.base.lock);
}

#define RW (MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_REMOTE_WRITE | MRD_ACCESS_REMOTE_READ)

/* The probe under driver: what it records, and that libibverbs took every call. */
static void probe(enum fake_driver d)
{
	driver = d;
	memset(&last, 0, sizeof(last));
	vp.base.caps.rereg_translation = vp.base.caps.rereg_new_keys = true;
	strcpy(vp.base.caps.rereg_probe, "stale");
	probe_rereg(vp.ctx, &vp.base.caps);
	ck_assert_int_eq(last.input_errors, 0);
	ck_assert_int_eq(last.flags, IBV_REREG_MR_CHANGE_TRANSLATION);
	ck_assert_int_eq(last.access, 0);
}

/* The probe on each fake driver: only moves that give new keys at every size turn pools on. */
START_TEST(probe_answers)
{
	probe(FAKE_NEW_KEYS);
	ck_assert(vp.base.caps.rereg_translation && vp.base.caps.rereg_new_keys);
	ck_assert_int_eq(last.calls, 2);
	ck_assert_uint_eq(last.length, 2u << 20); /* the second size: 2 MiB */
	ck_assert_str_eq(vp.base.caps.rereg_probe, "a move gives new lkey and rkey (1 page and 2 MiB)");

	probe(FAKE_KEEP);
	ck_assert(vp.base.caps.rereg_translation && !vp.base.caps.rereg_new_keys);
	ck_assert_int_eq(last.calls, 1);
	ck_assert_str_eq(vp.base.caps.rereg_probe,
			 "a move keeps its keys (in-place update: mlx5's UMR, irdma) (1 page)");

	probe(FAKE_KEEP_BIG);
	ck_assert(vp.base.caps.rereg_translation && !vp.base.caps.rereg_new_keys);
	ck_assert_int_eq(last.calls, 2);
	ck_assert_str_eq(vp.base.caps.rereg_probe,
			 "a move keeps its keys (in-place update: mlx5's UMR, irdma) (2 MiB)");

	probe(FAKE_REFUSE);
	ck_assert(!vp.base.caps.rereg_translation && !vp.base.caps.rereg_new_keys);
	ck_assert_str_eq(vp.base.caps.rereg_probe, "rereg: Operation not supported (1 page)");
}
END_TEST

static struct provider_mr *reg_rw(void)
{
	struct provider_mr *mr;

	ck_assert_int_eq(provider_reg(&vpd.base, buf, (size_t)ps, (uintptr_t)buf, RW, &mr), 0);
	return mr;
}

/* A move keeps the access: access 0, and no IBV_REREG_MR_CHANGE_ACCESS. */
/* What verbs_open does with the device: the probe, then its line. */
static void open_device(void)
{
	probe_rereg(vp.ctx, &vp.base.caps);
	log_probe(&vp.base.caps);
}

static void open_four_times(void)
{
	for (int i = 0; i < 4; i++)
		open_device();
}

/* A domain opens the device for each program that binds a PD (libmrd-preload.so: every run),
 * and the served devices' scan once more: the probe's answer is logged once per device, and
 * again only when it changes (a device lost and back as another, a firmware update). */
START_TEST(probe_logged_once_per_device)
{
	snprintf(vp.base.caps.device, sizeof(vp.base.caps.device), "rxe0");
	driver = FAKE_REFUSE;
	ck_assert_uint_eq(probe_lines(open_four_times), 1);
	ck_assert_uint_eq(probe_lines(open_device), 0);
	driver = FAKE_NEW_KEYS; /* the answer changed */
	ck_assert_uint_eq(probe_lines(open_four_times), 1);
	snprintf(vp.base.caps.device, sizeof(vp.base.caps.device), "rxe1");
	ck_assert_uint_eq(probe_lines(open_four_times), 1);
	snprintf(vp.base.caps.device, sizeof(vp.base.caps.device), "rxe0");
	ck_assert_uint_eq(probe_lines(open_device), 0);
}
END_TEST

START_TEST(move_passes_access_0)
{
	struct provider_mr *mr;

	driver = FAKE_NEW_KEYS;
	vp.base.caps.rereg_translation = vp.base.caps.rereg_new_keys = true;
	mr = reg_rw();
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, buf + ps, (size_t)ps,
					(uintptr_t)(buf + ps), 0), 0);
	ck_assert_int_eq(last.input_errors, 0);
	ck_assert_int_eq(last.flags, IBV_REREG_MR_CHANGE_TRANSLATION);
	ck_assert_int_eq(last.access, 0);
	ck_assert_ptr_eq(last.addr, buf + ps);
	ck_assert_uint_eq(mr->addr, (uintptr_t)(buf + ps));

	/* An access change passes the access, with its flag. */
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_ACCESS, NULL, 0, 0,
					MRD_ACCESS_LOCAL_WRITE), 0);
	ck_assert_int_eq(last.input_errors, 0);
	ck_assert_int_eq(last.flags, IBV_REREG_MR_CHANGE_ACCESS);
	ck_assert_int_eq(last.access, IBV_ACCESS_LOCAL_WRITE);
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

/* A parked MR grants nothing: access 0 with IBV_REREG_MR_CHANGE_ACCESS, on the parking page;
 * the pool's move back gives the access back. Park says 1 when the keys changed. */
START_TEST(park_grants_nothing)
{
	struct provider_mr *mr;
	uint32_t rkey;

	driver = FAKE_KEEP;
	vp.base.caps.rereg_translation = true;
	mr = reg_rw();
	rkey = mr->rkey;
	ck_assert_int_eq(provider_park(mr), 0); /* keys kept: 0 */
	ck_assert_int_eq(last.input_errors, 0);
	ck_assert_int_eq(last.flags, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS);
	ck_assert_int_eq(last.access, 0);
	ck_assert_ptr_eq(last.addr, vp.parking);
	ck_assert_uint_eq(last.length, (size_t)ps);
	ck_assert_uint_eq(mr->rkey, rkey);
	ck_assert_uint_eq(mr->access, RW); /* what it is for, given back by a move */
	ck_assert_int_eq(vp.stats.parked, 1);
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_ACCESS, NULL, 0, 0, RW), -EINVAL);

	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, buf, (size_t)ps,
					(uintptr_t)buf, 0), 0);
	ck_assert_int_eq(last.input_errors, 0);
	ck_assert_int_eq(last.flags, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS);
	ck_assert_int_eq(last.access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					      IBV_ACCESS_REMOTE_READ);
	ck_assert_int_eq(vp.stats.parked, 0);

	driver = FAKE_NEW_KEYS; /* made anew: the old keys went back to the device */
	ck_assert_int_eq(provider_park(mr), 1);
	ck_assert_uint_ne(mr->rkey, rkey);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(vp.stats.parked, 0);

	/* On demand it stays, granting nothing else: a rereg does not make it pinned. */
	vp.base.caps.odp = true;
	ck_assert_int_eq(provider_reg(&vpd.base, buf, (size_t)ps, (uintptr_t)buf,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_ON_DEMAND, &mr), 0);
	ck_assert_int_eq(provider_park(mr), 1);
	ck_assert_int_eq(last.flags, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS);
	ck_assert_int_eq(last.access, IBV_ACCESS_ON_DEMAND);
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

/* An on-demand MR parked in place: the PD alone changes, to one of the provider's own, so
 * that mlx5 keeps the mkey (a move would make the MR anew, hw/mlx5/mr.c:1683); keys kept. */
START_TEST(park_in_place_changes_the_pd_alone)
{
	struct provider_mr *mr;
	uint32_t rkey;

	driver = FAKE_NEW_KEYS; /* what a move of an on-demand MR does on mlx5 */
	vp.base.caps.odp = true;
	ck_assert_int_eq(provider_reg(&vpd.base, buf, (size_t)ps, (uintptr_t)buf,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_ON_DEMAND, &mr), 0);
	rkey = mr->rkey;
	ck_assert_int_eq(provider_park_in_place(mr), 0);
	ck_assert_int_eq(last.input_errors, 0);
	ck_assert_int_eq(last.flags, IBV_REREG_MR_CHANGE_PD);
	ck_assert_int_eq(last.access, 0);
	ck_assert_ptr_nonnull(vp.parking_pd);
	ck_assert_ptr_eq(last.pd, vp.parking_pd);
	ck_assert_ptr_ne(last.pd, vpd.pd);
	ck_assert_uint_eq(mr->rkey, rkey);
	ck_assert_int_eq(vp.stats.parked, 1);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(vp.stats.parked, 0);
	vp.parking_pd = NULL; /* the fake's: nothing to free */
}
END_TEST

/* Where a move is refused, so is parking, before libibverbs is asked. */
START_TEST(park_refused)
{
	struct provider_mr *mr;

	driver = FAKE_REFUSE;
	probe(FAKE_REFUSE);
	mr = reg_rw();
	last.calls = 0;
	ck_assert_int_eq(provider_park(mr), -EOPNOTSUPP);
	ck_assert_int_eq(provider_rereg(mr, PROVIDER_REREG_TRANSLATION, buf + ps, (size_t)ps,
					(uintptr_t)(buf + ps), 0), -EOPNOTSUPP);
	ck_assert_int_eq(last.calls, 0);
	ck_assert_int_eq(provider_dereg(mr), 0);
}
END_TEST

/* Window caps from the device's attributes (window_caps), without a device: siw's (no
 * MEM_WINDOW flags, max_mw 0: siw_verbs.c siw_query_device sets neither) say why none;
 * rxe's (type 2B, vendor 0xffffff) have windows that reach their whole MR; a device that
 * cannot loop back has none for mrd; an mlx5-like one has exact windows. */
START_TEST(window_caps_from_attributes)
{
	struct ibv_device_attr siw = { .max_mw = 0, .vendor_id = 0x626d74 };
	struct ibv_device_attr rxe = { .max_mw = 0x1000, .vendor_id = 0xffffff,
				       .device_cap_flags = IBV_DEVICE_MEM_WINDOW |
							   IBV_DEVICE_MEM_WINDOW_TYPE_2B };
	struct ibv_device_attr mlx5 = { .max_mw = 1 << 24, .vendor_id = 0x02c9,
					.device_cap_flags = IBV_DEVICE_MEM_WINDOW_TYPE_2B };
	struct provider_caps caps = { 0 };

	window_caps(&siw, &caps);
	ck_assert(!caps.mw);
	ck_assert_ptr_nonnull(caps.no_mw);
	ck_assert_ptr_nonnull(strstr(caps.no_mw, "no type-2 memory windows"));
	window_caps(&rxe, &caps);
	ck_assert(caps.mw);
	ck_assert_ptr_null(caps.no_mw);
	ck_assert_ptr_nonnull(caps.mw_wide);
	ck_assert_uint_eq(caps.mw_fresh_binds, 256);
	window_caps(&mlx5, &caps);
	ck_assert(caps.mw && !caps.mw_wide);
	caps.no_dma = "iWARP";
	window_caps(&mlx5, &caps);
	ck_assert(!caps.mw);
	ck_assert_ptr_nonnull(strstr(caps.no_mw, "loopback"));
	ck_assert_uint_eq(to_ibv_access(MRD_ACCESS_MW_BIND), IBV_ACCESS_MW_BIND);
}
END_TEST

static Suite *verbs_rereg_suite(void)
{
	Suite *s = suite_create("verbs-rereg");
	TCase *tc = tcase_create("rereg");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, probe_answers);
	tcase_add_test(tc, probe_logged_once_per_device);
	tcase_add_test(tc, move_passes_access_0);
	tcase_add_test(tc, park_grants_nothing);
	tcase_add_test(tc, park_refused);
	tcase_add_test(tc, park_in_place_changes_the_pd_alone);
	tcase_add_test(tc, window_caps_from_attributes);
	suite_add_tcase(s, tc);
	return s;
}

int main(void) { return run_suite(verbs_rereg_suite()); }
