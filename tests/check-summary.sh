#!/bin/sh
# tools/test-summary.sh on made-up results: a skipped test's reason is shown (its "SKIP: why"
# line, else the last line it printed), and one that printed none is named so.
set -u
summary="$MRD_SRCDIR/tools/test-summary.sh"
dir=$(mktemp -d /tmp/mrd-summary.XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/tests"
result() { # name, result, log text
	printf ':test-result: %s\n' "$2" > "$dir/tests/$1.trs"
	printf '%b' "$3" > "$dir/tests/$1.log"
}
result a-said SKIP 'SKIP: no device here\nSKIP tests/a-said (exit status: 77)\n'
result b-plain SKIP 'not run: needs root\n\nSKIP tests/b-plain (exit status: 77)\n'
result c-silent SKIP 'SKIP tests/c-silent (exit status: 77)\n'
result d-check PASS '100%: Checks: 3, Failures: 0, Errors: 0\n'
out=$(sh "$summary" "$dir") || { echo "test-summary.sh failed: $out"; exit 1; }
want='skipped: tests/a-said: no device here
skipped: tests/b-plain: not run: needs root
skipped: tests/c-silent: the test printed no reason (a test that exits 77 must say why)
3 passed, 0 failed, 3 skipped'
[ "$out" = "$want" ] || { printf 'test-summary.sh said:\n%s\nwanted:\n%s\n' "$out" "$want"; exit 1; }
echo "test-summary.sh: every skipped test with its reason"
