#!/bin/sh
# Developers' tools against mrd's window (libmrd(3) ENVIRONMENT, README "Debugging with
# valgrind and TSan"):
# - under valgrind a client of an mrd with the default 4 TiB window connects within
#   CONNECT_LIMIT_S (documented: about a second on an idle machine; libmrd reserves only the
#   arenas it maps there, where a whole-window reservation took valgrind 27-52 s);
# - a client built with -fsanitize=thread (whose shadow lies over the default window) gets
#   -EADDRINUSE naming the setting from an mrd with the default window, and connects and gets
#   keys from one whose window is the developer setting.
set -u
case "${MRD_SAN_CFLAGS:-}" in
*sanitize=*)
	# This build's mrd is itself sanitized: ASan's shadow gap holds the developer window and
	# valgrind cannot run a sanitized client.
	echo "not run in a sanitizer build (MRD_SAN_CFLAGS=$MRD_SAN_CFLAGS): its mrd cannot take the developer window"
	exit 77
	;;
esac
CONNECT_LIMIT_S=10 # the documented second, with a loaded test machine's margin
client="$MRD_BUILDDIR/tests/window-client"
dir=$(mktemp -d /tmp/mrd-window.XXXXXX)
pids=
trap 'for p in $pids; do kill $p 2> /dev/null; wait $p; done; rm -rf "$dir"' EXIT
fail=0 ran=0

# mrd NAME CONFIG: an mrd of our own on $dir/NAME.sock, waited for until it serves.
start_mrd() {
	printf '[memory]\nhugepages = no\narena_size = 64M\n%s\n' "$2" > "$dir/$1.conf"
	"$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/$1.conf" --socket "$dir/$1.sock" \
		> "$dir/$1.log" 2>&1 &
	pid=$!
	pids="$pids $pid"
	# Polls for the socket (60 s at most: a loaded machine starts mrd slowly; its exit ends it).
	for i in $(seq 1200); do
		[ -S "$dir/$1.sock" ] && return 0
		kill -0 $pid 2> /dev/null || break
		sleep 0.05
	done
	echo "FAIL: mrd $1 did not serve:"; tail -n 5 "$dir/$1.log"; exit 1
}

start_mrd default ''
start_mrd dev "$(printf 'window_base = 0x4000000000\nwindow_size = 64G')"

if [ -z "${VALGRIND:-}" ] || ! command -v "$VALGRIND" > /dev/null; then
	echo "SKIP: valgrind not found (Debian: valgrind)"
elif [ -n "${MRD_SAN_CFLAGS:-}" ]; then
	echo "SKIP: valgrind cannot run a sanitizer build ($MRD_SAN_CFLAGS)"
else
	ran=1
	out=$("$VALGRIND" -q --error-exitcode=99 "$client" "$dir/default.sock" 2>&1)
	rc=$?
	took=$(printf '%s\n' "$out" | sed -n 's/.*connect_s=\([0-9.]*\).*/\1/p')
	if [ $rc != 0 ] || [ -z "$took" ]; then
		echo "FAIL: the client under valgrind (rc $rc): $out"; fail=1
	elif [ "$(echo "$took < $CONNECT_LIMIT_S" | bc)" != 1 ]; then
		echo "FAIL: connecting under valgrind took $took s (limit $CONNECT_LIMIT_S s)"; fail=1
	else
		echo "PASS: under valgrind the client connected in $took s and got a key"
	fi
fi

tsan="$dir/window-client-tsan"
${CC:-cc} -fsanitize=thread -g -I"$MRD_SRCDIR/include" "$MRD_SRCDIR/tests/window-client.c" \
	-o "$tsan" -L"$MRD_BUILDDIR/.libs" -lmrd -Wl,-rpath,"$MRD_BUILDDIR/.libs" \
	> "$dir/tsan.log" 2>&1 && { "$tsan" >> "$dir/tsan.log" 2>&1; [ $? = 2 ]; } # its usage: it runs
if [ $? != 0 ]; then
	echo "SKIP: this toolchain builds or runs no -fsanitize=thread program:"
	tail -n 3 "$dir/tsan.log"
else
	ran=1
	# Default window: refused, naming what to change.
	out=$("$tsan" "$dir/default.sock" 2>&1)
	case "$out" in
	*"Address already in use"*) ;;
	*) out="no EADDRINUSE: $out" ;;
	esac
	case "$out" in
	*no\ EADDRINUSE*) echo "FAIL: TSan against the default window: $out"; fail=1 ;;
	*window_base*) echo "PASS: TSan, default window: $out" ;;
	*) echo "FAIL: TSan against the default window names no window_base: $out"; fail=1 ;;
	esac
	out=$("$tsan" "$dir/dev.sock" 2>&1)
	rc=$?
	case "$rc $out" in
	"0 connect_s="*lkey=*) echo "PASS: TSan, developer window: $out" ;;
	*) echo "FAIL: TSan against the developer window (rc $rc): $out"; fail=1 ;;
	esac
fi
[ $ran = 1 ] || exit 77
exit $fail
