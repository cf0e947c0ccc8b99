/* SPDX-License-Identifier: MIT */
/* The one way our Check suites run: all cases, normal output (CK_VERBOSITY=verbose in the
 * environment names each case, as the VM test wants), exit status for automake. */
#pragma once

#include <check.h>
#include <stdlib.h>

static inline int run_suite(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
