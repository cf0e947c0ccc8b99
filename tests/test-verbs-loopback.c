/* SPDX-License-Identifier: MIT */
/* Which devices mrd's Dma can loop back on (caps.dma): InfiniBand and RoCE, not iWARP. */
#include <check.h>
#include <string.h>

#include "provider/verbs-loopback.h"
#include "check-run.h"

START_TEST(test_ib_and_roce_loop_back)
{
	/* mlx5 and rxe: an IB CA, IB transport (RoCE is the IB transport over Ethernet) */
	ck_assert_ptr_null(verbs_loopback_unsupported(IBV_NODE_CA, IBV_TRANSPORT_IB));
}
END_TEST

START_TEST(test_iwarp_does_not)
{
	const char *why = verbs_loopback_unsupported(IBV_NODE_RNIC, IBV_TRANSPORT_IWARP); /* siw */

	ck_assert_ptr_nonnull(why);
	ck_assert_ptr_nonnull(strstr(why, "iWARP"));
	ck_assert_ptr_nonnull(strstr(why, "rdma_cm"));
	/* Either half says iWARP: libibverbs derives the transport from the node type. */
	why = verbs_loopback_unsupported(IBV_NODE_RNIC, IBV_TRANSPORT_UNKNOWN);
	ck_assert_ptr_nonnull(why);
	ck_assert_ptr_nonnull(strstr(why, "iWARP"));
	why = verbs_loopback_unsupported(IBV_NODE_CA, IBV_TRANSPORT_IWARP);
	ck_assert_ptr_nonnull(why);
	ck_assert_ptr_nonnull(strstr(why, "iWARP"));
}
END_TEST

START_TEST(test_no_rc_transports_do_not)
{
	ck_assert_ptr_nonnull(verbs_loopback_unsupported(IBV_NODE_USNIC_UDP, IBV_TRANSPORT_USNIC_UDP));
	ck_assert_ptr_nonnull(verbs_loopback_unsupported(IBV_NODE_UNSPECIFIED,
							 IBV_TRANSPORT_UNSPECIFIED)); /* EFA */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("verbs-loopback");
	TCase *tc = tcase_create("kinds");

	tcase_add_test(tc, test_ib_and_roce_loop_back);
	tcase_add_test(tc, test_iwarp_does_not);
	tcase_add_test(tc, test_no_rc_transports_do_not);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
