/* SPDX-License-Identifier: MIT */
/* Review reproducer: verbs_revive when a PD cannot be allocated again on the returned device.
 * As test-verbs-rereg does, this file includes provider-verbs.c and defines the libibverbs
 * calls it makes; ibv_dealloc_pd dereferences pd->context as libibverbs' does
 * (rdma-core libibverbs/verbs.c: `return get_ops(pd->context)->dealloc_pd(pd);`). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check-run.h"
#include "provider/provider-verbs.c"
#include "provider/provider.c" /* provider_advise, as it cuts pieces */
const struct provider_ops provider_soft_ops; /* provider.c names it; never used here */

#include "verbs-loopback-stub.h"

static struct ibv_device fake_dev;
static struct ibv_device *fake_list[2] = { &fake_dev, NULL };
static struct ibv_context fake_ctx;
static int pipe_fds[2] = { -1, -1 };
static int pd_allocs_left = 1 << 30; /* then ibv_alloc_pd fails with ENOMEM */
static int bad_deallocs;

struct ibv_device **(ibv_get_device_list)(int *n)
{
	*n = 1;
	return fake_list;
}
void ibv_free_device_list(struct ibv_device **list) {}
const char *ibv_get_device_name(struct ibv_device *dev) { return "fake0"; }

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	fake_ctx.device = dev;
	fake_ctx.async_fd = pipe_fds[0];
	fake_ctx.cmd_fd = pipe_fds[0];
	return &fake_ctx;
}
int ibv_close_device(struct ibv_context *ctx) { return 0; }
int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd;

	if (pd_allocs_left-- <= 0) {
		errno = ENOMEM;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	pd->context = ctx;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd) { /* libibverbs reads pd->context here: SIGSEGV in mrd */
		bad_deallocs++;
		return EINVAL;
	}
	free(pd);
	return 0;
}

static int dereg_fails; /* the next n ibv_dereg_mr fail with EBUSY (an MW bound to the MR) */
static int live_mrs;

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	struct ibv_mr *mr = calloc(1, sizeof(*mr));

	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->lkey = mr->rkey = 0x100 + (uint32_t)live_mrs;
	live_mrs++;
	return mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (dereg_fails > 0) {
		dereg_fails--;
		return EBUSY; /* the MR stays, pinned and reachable */
	}
	live_mrs--;
	free(mr);
	return 0;
}

/* vp as verbs_open leaves it, on the fake device (its async fd one end of pipe_fds). */
static void fake_provider(struct verbs_provider *vp)
{
	ck_assert_int_eq(pipe2(pipe_fds, O_CLOEXEC), 0);
	verbs_provider_init(vp);
	snprintf(vp->base.caps.device, sizeof(vp->base.caps.device), "fake0");
	vp->ctx = ibv_open_device(&fake_dev);
}

/* The device came back, but the second PD cannot be made again (ENOMEM, or the device
 * failing again): verbs_revive calls verbs_lose, which deallocs every PD, the NULL one too. */
START_TEST(revive_with_pd_alloc_failure)
{
	struct verbs_provider vp = {};
	struct provider_pd *a, *b;

	fake_provider(&vp);
	ck_assert_int_eq(provider_pd_alloc(&vp.base, &a), 0);
	ck_assert_int_eq(provider_pd_alloc(&vp.base, &b), 0);

	provider_lose(&vp.base); /* DEVICE_FATAL */
	ck_assert_ptr_null(vp.ctx);

	pd_allocs_left = 1; /* back, but only one PD can be made */
	ck_assert_int_eq(provider_revive(&vp.base), -ENOMEM);
	ck_assert_msg(bad_deallocs == 0, "verbs_lose called ibv_dealloc_pd(NULL) %d time(s)",
		      bad_deallocs);
	ck_assert_ptr_null(vp.ctx);

	pd_allocs_left = 1 << 30; /* the next tick: both come back */
	ck_assert_int_eq(provider_revive(&vp.base), 0);
	ck_assert_int_eq(bad_deallocs, 0);
	ck_assert_int_eq(provider_pd_free(a), 0);
	ck_assert_int_eq(provider_pd_free(b), 0);
	close(pipe_fds[0]);
	close(pipe_fds[1]);
}
END_TEST

/* The device is lost while an MR's dereg fails (EBUSY: a memory window an importer bound to
 * it): verbs_lose forgets the kernel MR, and the later provider_dereg says 0, so mrd's
 * quarantine lets the run go back and be punched while the kernel still holds the MR. */
START_TEST(lose_forgets_a_kept_mr)
{
	struct verbs_provider vp = {};
	struct provider_pd *pd;
	struct provider_mr *mr;
	static char buf[4096] __attribute__((aligned(4096)));

	fake_provider(&vp);
	vp.base.caps.max_mr_size = 1ull << 40;
	pd_allocs_left = 1 << 30;
	ck_assert_int_eq(provider_pd_alloc(&vp.base, &pd), 0);
	ck_assert_int_eq(provider_reg(pd, buf, 4096, (uintptr_t)buf, MRD_ACCESS_LOCAL_WRITE, &mr), 0);
	dereg_fails = 1 << 30; /* the window stays bound */
	ck_assert_int_eq(provider_dereg(mr), -EBUSY); /* mrd quarantines the run */
	provider_lose(&vp.base); /* the device's removal */
	ck_assert_msg(provider_dereg(mr) < 0 || live_mrs == 0,
		      "the dereg of an MR the kernel still holds (%d live) says 0 after the loss: the "
		      "quarantine lets its run be punched and handed out", live_mrs);
	/* The device returns: the MR is made again on the new context (keys to hand out), the
	 * old registration still kept beside it; the dereg goes on failing until the window goes,
	 * then both go, and nothing stays registered or counted. */
	ck_assert_int_eq(provider_revive(&vp.base), 0);
	ck_assert_int_eq(live_mrs, 2);
	ck_assert_uint_eq(vp.stats.mrs, 1);
	ck_assert_int_eq(provider_dereg(mr), -EBUSY);
	dereg_fails = 0;
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(live_mrs, 0);
	ck_assert_ptr_null(LIST_FIRST(&vp.kept)); /* its old context closed with it */
	ck_assert_uint_eq(vp.stats.mrs, 0);
	ck_assert_uint_eq(vp.stats.pinned_bytes, 0);
	ck_assert_int_eq(provider_pd_free(pd), 0);
	close(pipe_fds[0]);
	close(pipe_fds[1]);
}
END_TEST

/* Review 2: the device returns while an MR's dereg was refused at the loss (kept). revive
 * skips it: it stays with lkey = rkey = 0, and revive says 0. Nothing above knows: the
 * domain's table is rebuilt from pmr->lkey/rkey (mr-cache.c entry_of) and lookups of that
 * memory answer 0 with key 0 until it is freed. The MR must come back usable (a new one over
 * the same memory, the old kept for its dereg) or be reported. */
START_TEST(revive_leaves_kept_mr_keyless)
{
	struct verbs_provider vp = {};
	struct provider_pd *pd;
	struct provider_mr *mr;
	static char buf[4096] __attribute__((aligned(4096)));

	fake_provider(&vp);
	vp.base.caps.max_mr_size = 1ull << 40;
	pd_allocs_left = 1 << 30;
	ck_assert_int_eq(provider_pd_alloc(&vp.base, &pd), 0);
	ck_assert_int_eq(provider_reg(pd, buf, 4096, (uintptr_t)buf, MRD_ACCESS_LOCAL_WRITE, &mr), 0);
	dereg_fails = 1; /* an importer's window bound to this live MR at the loss */
	provider_lose(&vp.base);
	ck_assert_int_eq(provider_revive(&vp.base), 0);
	ck_assert_msg(mr->lkey != 0 && mr->rkey != 0,
		      "after a revive that said 0, a live MR (in the domain's cache) has lkey %u "
		      "rkey %u: lookups of its memory hand out key 0", mr->lkey, mr->rkey);
	dereg_fails = 0;
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_pd_free(pd), 0);
	close(pipe_fds[0]);
	close(pipe_fds[1]);
}
END_TEST

/* Review 2: a prefetch in advise_max pieces while the device fails. provider_advise checks
 * the lost flag once, before the first piece: the loop marks the provider lost during piece
 * 1, yet every later piece still takes `live` for reading and runs ibv_advise_mr on the failed
 * context, so the lose job (waiting for `live` for writing, glibc's rwlock preferring readers)
 * waits for the whole prefetch, not for the piece in progress. */
static struct verbs_context fake_vctx;
static int advise_calls;
static struct provider *advise_marks;

static int fake_advise(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
		       struct ibv_sge *sg_list, uint32_t num_sge)
{
	if (advise_calls++ == 0 && advise_marks)
		provider_mark_lost(advise_marks); /* DEVICE_FATAL read by the loop meanwhile */
	return 0;
}

START_TEST(advise_pieces_after_loss)
{
	struct verbs_provider vp = {};
	struct provider_pd *pd;
	struct provider_mr *mr;
	static char buf[4 * 4096] __attribute__((aligned(4096)));
	int r;

	fake_provider(&vp);
	vp.base.caps.max_mr_size = 1ull << 40;
	vp.base.caps.advise_max = 4096; /* four pieces */
	vp.base.caps.odp = true;
	fake_vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	fake_vctx.sz = sizeof(fake_vctx);
	fake_vctx.advise_mr = fake_advise;
	fake_vctx.context.async_fd = pipe_fds[0];
	fake_vctx.context.cmd_fd = pipe_fds[0];
	vp.ctx = &fake_vctx.context;
	pd_allocs_left = 1 << 30;
	ck_assert_int_eq(provider_pd_alloc(&vp.base, &pd), 0);
	ck_assert_int_eq(provider_reg(pd, buf, sizeof(buf), (uintptr_t)buf,
				      MRD_ACCESS_LOCAL_WRITE | MRD_ACCESS_ON_DEMAND, &mr), 0);
	advise_marks = &vp.base;
	r = provider_advise(mr, PROVIDER_ADVISE_PREFETCH, (uintptr_t)buf, sizeof(buf));
	ck_assert_msg(advise_calls == 1, "the provider was marked lost during piece 1 of 4, yet "
		      "ibv_advise_mr ran %d times on the failed context (result %d): the lose job "
		      "waits for the whole prefetch", advise_calls, r);
	advise_marks = NULL;
	provider_lose(&vp.base);
	ck_assert_int_eq(provider_dereg(mr), 0);
	ck_assert_int_eq(provider_pd_free(pd), 0);
	close(pipe_fds[0]);
	close(pipe_fds[1]);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("verbs-revive");
	TCase *tc = tcase_create("revive");

	tcase_add_test(tc, revive_with_pd_alloc_failure);
	tcase_add_test(tc, lose_forgets_a_kept_mr);
	tcase_add_test(tc, revive_leaves_kept_mr_keyless);
	tcase_add_test(tc, advise_pieces_after_loss);
	suite_add_tcase(s, tc);
	return s;
}

int main(void) { return run_suite(suite()); }
