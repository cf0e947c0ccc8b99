#!/bin/sh
# The integration suites (and the hostile clients' storm) with every mrd they start running
# under valgrind: no invalid
# access, no leak, clean exit (valgrind's error exit code fails the suites' teardown checks).
set -u
[ -n "${VALGRIND:-}" ] && command -v "$VALGRIND" >/dev/null ||
	{ echo "valgrind not found (Debian: valgrind): mrd not checked for leaks"; exit 77; }
[ -z "${MRD_SAN_CFLAGS:-}" ] ||
	{ echo "sanitizer build ($MRD_SAN_CFLAGS): valgrind cannot run it; ASan checks instead"; exit 77; }
MRD_TEST_WRAPPER="$VALGRIND -q --leak-check=full --show-leak-kinds=definite,indirect,possible --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=99 --track-fds=no"
export MRD_TEST_WRAPPER
"$MRD_BUILDDIR/tests/test-integration" || exit 1
"$MRD_BUILDDIR/tests/test-libmrd-memory" || exit 1
"$MRD_BUILDDIR/tests/test-libmrd-mempool" || exit 1
"$MRD_BUILDDIR/tests/test-hostile" || exit 1
"$MRD_BUILDDIR/tests/test-restart" || exit 1
"$MRD_BUILDDIR/tests/test-views" || exit 1
"$MRD_BUILDDIR/tests/test-libmrd-lifecycle" || exit 1
exec "$MRD_BUILDDIR/tests/test-libmrd-lookup"
