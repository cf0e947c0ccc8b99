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

int verbs_loopback_new(struct ibv_pd *pd, struct verbs_loopback **ret) { return -EOPNOTSUPP; }
void verbs_loopback_free(struct verbs_loopback *lb) {}
int verbs_loopback_transfer(struct verbs_loopback *lb, bool read, uint32_t lkey, uint64_t laddr,
			    uint32_t rkey, uint64_t raddr, size_t length)
{
	return -EOPNOTSUPP;
}
const char *verbs_loopback_unsupported(enum ibv_node_type node, enum ibv_transport_type transport)
{
	return NULL;
}
bool verbs_loopback_owns(const struct verbs_loopback *lb, const void *element) { return false; }

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

int ibv_dereg_mr(struct ibv_mr *mr)
{
	free(mr);
	return 0;
}

/* The device came back, but the second PD cannot be made again (ENOMEM, or the device
 * failing again): verbs_revive calls verbs_lose, which deallocs every PD, the NULL one too. */
START_TEST(revive_with_pd_alloc_failure)
{
	struct verbs_provider vp = {};
	struct provider_pd *a, *b;

	ck_assert_int_eq(pipe2(pipe_fds, O_CLOEXEC), 0);
	vp.base.ops = &provider_verbs_ops;
	pthread_mutex_init(&vp.base.lock, NULL);
	pthread_rwlock_init(&vp.live, NULL);
	LIST_INIT(&vp.pds);
	LIST_INIT(&vp.mrs);
	snprintf(vp.base.caps.device, sizeof(vp.base.caps.device), "fake0");
	vp.ctx = ibv_open_device(&fake_dev);
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
	close(pipe_fds[0]);
	close(pipe_fds[1]);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("verbs-revive");
	TCase *tc = tcase_create("revive");

	tcase_add_test(tc, revive_with_pd_alloc_failure);
	suite_add_tcase(s, tc);
	return s;
}

int main(void) { return run_suite(suite()); }
