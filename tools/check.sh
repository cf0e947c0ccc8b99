#!/bin/sh
# Quick start, part two: install dependencies, build, and run every test (make check).
# Ends with one line "N passed, N failed, N skipped" counting each Check test case and each
# script test.
set -eu
. "$(dirname "$0")/build.sh"
install_deps test
build

rc=0
make -j"$(nproc)" check || rc=$?
"$top/tools/test-summary.sh" "$top/build"
exit $rc
