#!/bin/sh
# Prints "N passed, N failed, N skipped" for a build tree after make check: a Check suite counts
# its test cases (its "Checks: N, Failures: F, Errors: E" line), any other test counts once.
set -eu
cd "${1:-.}"
passed=0 failed=0 skipped=0

# Why a test skipped: its "SKIP: why" line, else the last line it printed (the test driver's
# own "SKIP tests/x (exit status: 77)" line left out).
skip_reason() {
	why=$(sed -n 's/^SKIP: //p' "$1" | tail -n 1)
	[ -n "$why" ] || why=$(grep -Ev '^SKIP [^ ]+ \(exit status: 77\)$|^[[:space:]]*$' "$1" | tail -n 1)
	echo "${why:-the test printed no reason (a test that exits 77 must say why)}"
}
for trs in $(find tests -name '*.trs' | sort); do
	log=${trs%.trs}.log
	result=$(sed -n 's/^:test-result: //p' "$trs" | head -n 1)
	# Every Check summary in the log (a script may run several suites).
	checks=$(grep -E '^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log" 2>/dev/null || true)
	if [ -n "$checks" ] && [ "$result" != SKIP ]; then
		n=$(echo "$checks" | sed -E 's/.*Checks: ([0-9]+),.*/\1/' | awk '{ s += $1 } END { print s }')
		f=$(echo "$checks" | sed -E 's/.*Failures: ([0-9]+),.*/\1/' | awk '{ s += $1 } END { print s }')
		e=$(echo "$checks" | sed -E 's/.*Errors: ([0-9]+).*/\1/' | awk '{ s += $1 } END { print s }')
		passed=$((passed + n - f - e))
		failed=$((failed + f + e))
		# A suite that crashed after its summary still fails as a whole.
		case $result in FAIL | ERROR) [ $((f + e)) -eq 0 ] && failed=$((failed + 1)) ;; esac
		continue
	fi
	case $result in
	PASS | XFAIL) passed=$((passed + 1)) ;;
	SKIP) skipped=$((skipped + 1)); echo "skipped: ${trs%.trs}: $(skip_reason "$log")" ;;
	*) failed=$((failed + 1)) ;;
	esac
done
if [ $((passed + failed + skipped)) -eq 0 ]; then
	echo "no test results found under $(pwd)/tests" >&2
	echo "0 passed, 1 failed"
	exit 1
fi
echo "$passed passed, $failed failed, $skipped skipped"
