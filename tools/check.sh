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
# What failed, for a CI log that keeps only this output: each failing suite's assertions and end.
for t in $(sed -n 's/^\(FAIL\|ERROR\): //p' test-suite.log 2> /dev/null | sort -u); do
	echo "== $t.log"
	grep -E ':[FE]:|Sanitizer|runtime error' "$t.log" | head -n 10
	tail -n 20 "$t.log"
done
"$top/tools/test-summary.sh" "$top/build"
exit $rc
