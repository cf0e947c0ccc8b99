#!/bin/sh
# The test suite once more under AddressSanitizer and UndefinedBehaviorSanitizer, and the
# threaded paths (worker pool in mrd, lookup threads in libmrd) under ThreadSanitizer.
# Run after tools/check.sh (it reuses its dependencies); prints one PASS/FAIL line per build.
# The ASan+UBSan suites run beside a CPU hog (a busy loop per core): a test that waits on a
# wall-clock bound a busy machine exceeds fails here, before it fails on a developer's machine
# or a shared CI runner. MRD_CHECK_NO_HOG=1 runs them on an idle machine.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/tools/build-tree.sh"
cd "$top"
status=0

hogs=
stop_hogs() {
	for pid in $hogs; do
		kill "$pid" 2> /dev/null
		wait "$pid" 2> /dev/null
	done
	hogs=
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM
# Each loop ends by itself after 30 minutes should this script be killed outright.
start_hogs() {
	[ "${MRD_CHECK_NO_HOG:-0}" = 1 ] && return 0
	for _ in $(seq "$(nproc)"); do
		timeout 1800 sh -c 'while :; do :; done' &
		hogs="$hogs $!"
	done
}

run_build() { # dir, configure flags...
	dir=$1
	shift
	enter_build_tree "$dir" || return 1
	[ -f Makefile ] || "$top/configure" -q "$@" > configure.log 2>&1 || { cat configure.log; return 1; }
	make -j"$(nproc)" > make.log 2>&1 || { tail -n 30 make.log; return 1; }
}

# Not under ASan: the checks of what is built and installed rather than run (headers, layers,
# man pages, symbols, units, manifests, install folders: the plain build's check has them),
# and the valgrind and debugger checks, which cannot run under it.
asan_not="check-deploy.sh check-header.sh check-install-dirs.sh check-layers.sh check-man.sh
check-summary.sh check-symbols.sh check-units.sh valgrind-mrd.sh window-debuggers.sh"
if run_build build-asan --enable-asan --enable-ubsan; then
	asan_tests=
	for t in $(printf 'print-tests:\n\t@echo $(TESTS)\n' | make -s -f Makefile -f - print-tests); do
		case " $(echo $asan_not) " in *" ${t#tests/} "*) continue ;; esac
		asan_tests="$asan_tests $t"
	done
	start_hogs
	t0=$(date +%s)
	make -j"$(nproc)" check TESTS="$asan_tests" > check.log 2>&1
	rc=$?
	stop_hogs
	took="$(($(date +%s) - t0)) s"
	[ "${MRD_CHECK_NO_HOG:-0}" = 1 ] || took="$took, a busy loop per core beside"
	if [ $rc -eq 0 ]; then
		echo "PASS: make check under ASan+UBSan ($(sh ../tools/test-summary.sh . | tail -n 1); $took)"
	else
		grep -E '^(FAIL|ERROR)' check.log
		# What failed, for a CI log that keeps only this output.
		for t in $(sed -n 's/^\(FAIL\|ERROR\): //p' check.log); do
			grep -E ':[FE]:|Sanitizer|runtime error' "$t.log" | head -n 5
		done
		echo "FAIL: make check under ASan+UBSan ($took)"; status=1
	fi
else
	echo "FAIL: ASan+UBSan build"; status=1
fi
cd "$top"

# TSan claims mrd's default window: the tests move it (see tests/test-util.h). A fork child's
# first handle starts libmrd's watcher thread, and the parent has one already: TSan dies on
# threads started after a multi-threaded fork unless told that glibc supports it.
if run_build build-tsan --enable-tsan; then
	if TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}die_after_fork=0" MRD_TEST_CONF="$(printf '[memory]\nwindow_base = 0x4000000000\nwindow_size = 64G')" \
		MRD_TEST_WINDOW_BASE=0x4000000000 make -j"$(nproc)" check \
		TESTS="tests/test-libmrd-lookup tests/test-libmrd-mempool tests/test-libmrd-lifecycle tests/test-mr-cache tests/test-bound-pd tests/test-mempool tests/test-odp tests/test-frmr-pool tests/test-registrar tests/test-allocation tests/test-dispatch tests/test-handover tests/test-memory tests/test-isolation tests/test-device tests/test-device-race tests/test-caps tests/test-fd-closer tests/test-worker-pool tests/test-availability" \
		> check.log 2>&1; then
		echo "PASS: threaded suites under TSan"
	else
		grep -E '^(FAIL|ERROR)' check.log
		# What failed: the check's assertion, or TSan's first report (mrd's and the test's
		# output share the log, so the report may lie far above its end).
		for t in $(sed -n 's/^\(FAIL\|ERROR\): //p' check.log); do
			grep -E ':[FE]:|SUMMARY: ThreadSanitizer' "$t.log" | head -n 5
			grep -m 1 -A 40 'WARNING: ThreadSanitizer' "$t.log"
			tail -n 15 "$t.log"
		done
		echo "FAIL: threaded suites under TSan"; status=1
	fi
else
	echo "FAIL: TSan build"; status=1
fi
exit $status
