#!/bin/sh
# Every man/*.3 page of a call (not a .so link, not the libmrd(3) overview) has an EXAMPLE
# whose program builds with -Wall -Wextra -Werror against the build's headers and libmrd
# (-libverbs too where it includes mrd-verbs.h), and runs against a private mrd on the soft
# provider: exit 0, or 77 with a line on stderr saying what it lacks (a verbs device). Pages
# added later are found by themselves.
set -u
src="$MRD_SRCDIR" build="$MRD_BUILDDIR"
[ -x "$build/mrd" ] || { echo "no $build/mrd (a client-only build): not checked"; exit 77; }
lib=$(ls "$build"/.libs/libmrd.so 2> /dev/null) || { echo "no $build/.libs/libmrd.so: not checked"; exit 77; }
dir=$(mktemp -d /tmp/mrd-man-examples.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2> /dev/null; [ -n "$pid" ] && wait $pid 2> /dev/null; rm -rf "$dir"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

# The program of a page: the first .nf/.fi (or .EX/.EE) block of its EXAMPLE section that holds main(),
# with roff's escapes undone (\- to -, \e to \, \& to nothing).
example_of() {
	sed -n '/^\.SH EXAMPLE/,/^\.SH/p' "$1" | awk '
		/^\.(nf|EX)/ { inblock = 1; text = ""; next }
		/^\.(fi|EE)/ { if (inblock && text ~ /main\(/) { printf "%s", text; exit } inblock = 0; next }
		inblock { text = text $0 "\n" }' |
		sed -e 's/\\-/-/g' -e 's/\\(aq/'"'"'/g' -e 's/\\&//g' -e 's/\\e/\\/g'
}

printf '[memory]\nhugepages = no\n' > "$dir/mrd.conf"
"$build/mrd" --foreground --no-bus --provider soft --config "$dir/mrd.conf" \
	--socket "$dir/mrd.sock" --log-level warning > "$dir/mrd.log" 2>&1 &
pid=$!
# Waits for mrd are 20 s at most (400 x 0.05 s): a loaded machine starts it slowly.
for _ in $(seq 400); do
	[ -S "$dir/mrd.sock" ] && break
	kill -0 $pid 2> /dev/null || break
	sleep 0.05
done
[ -S "$dir/mrd.sock" ] || { echo "mrd did not start:"; cat "$dir/mrd.log"; exit 1; }

verbs_libs=$(pkg-config --libs libibverbs 2> /dev/null || echo -libverbs)
n=0 ran=0 lacked=
for page in "$src"/man/*.3; do
	name=$(basename "$page" .3)
	grep -q '^\.so ' "$page" && continue
	[ "$name" = libmrd ] && continue
	n=$((n + 1))
	example_of "$page" > "$dir/$name.c"
	[ -s "$dir/$name.c" ] || { fail "man/$name.3 has no EXAMPLE with a program (int main)"; continue; }
	libs=
	grep -q 'mrd/mrd-verbs\.h' "$dir/$name.c" && libs=$verbs_libs
	# shellcheck disable=SC2086
	${CC:-cc} -std=gnu11 -Wall -Wextra -Werror ${MRD_SAN_CFLAGS:-} -I"$src/include" \
		-o "$dir/$name" "$dir/$name.c" "$lib" -Wl,-rpath,"$(dirname "$lib")" $libs \
		> "$dir/$name.cc.log" 2>&1 ||
		{ fail "man/$name.3's EXAMPLE does not build:"; cat "$dir/$name.cc.log"; continue; }
	(cd "$dir" && MRD_SOCKET="$dir/mrd.sock" timeout 60 "./$name" > "$name.out" 2> "$name.err")
	rc=$?
	if [ $rc -eq 77 ] && [ -s "$dir/$name.err" ]; then
		lacked="$lacked $name"
	elif [ $rc -ne 0 ]; then
		fail "man/$name.3's EXAMPLE exits $rc:"
		cat "$dir/$name.out" "$dir/$name.err"
	else
		ran=$((ran + 1))
	fi
done
kill -0 $pid 2> /dev/null || { fail "mrd died:"; cat "$dir/mrd.log"; }
[ $status -eq 0 ] || exit 1
echo "the EXAMPLEs of all $n call pages build; $ran ran on the soft provider${lacked:+, and these said what they lack:$lacked}"
