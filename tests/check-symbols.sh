#!/bin/sh
# libmrd.so exports exactly the names in client/libmrd.map, and nothing else; each is declared
# in <mrd/mrd.h> and documented in libmrd(3) (named by a .B, .BR or .BI line).
set -eu
lib="$MRD_BUILDDIR/.libs/libmrd.so"
map="$MRD_SRCDIR/client/libmrd.map"
[ -f "$lib" ] || { echo "no $lib (built with --disable-shared?)"; exit 77; }

exported=$(${NM:-nm} -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ { sub(/@.*/, "", $3); print $3 }' |
	grep -v '^MRD_' | sort -u)
listed=$(sed -n 's/^[[:space:]]*\([a-z_][a-z0-9_]*\);.*/\1/p' "$map" | sort -u)

if [ "$exported" != "$listed" ]; then
	echo "exported symbols differ from $map:"
	printf '%s\n' "$exported" > exported.tmp.$$
	printf '%s\n' "$listed" > listed.tmp.$$
	diff -u listed.tmp.$$ exported.tmp.$$ || true
	rm -f exported.tmp.$$ listed.tmp.$$
	exit 1
fi
# Every listed name must also be declared in the public header.
for sym in $listed; do
	grep -q "\b$sym(" "$MRD_SRCDIR/include/mrd/mrd.h" || { echo "$sym is not in mrd.h"; exit 1; }
done
# man mrd_x finds it: make install links each name to libmrd(3), whose NAME lists them all.
names=$(sed -n '/^\.SH NAME/,/^\.SH/p' "$MRD_SRCDIR/man/libmrd.3")
for sym in $listed; do
	grep -Eq "^\.(B|BR|BI) \"?$sym\b" "$MRD_SRCDIR/man/libmrd.3" ||
		{ echo "$sym is not documented in man/libmrd.3"; exit 1; }
	echo "$names" | grep -q "\b$sym\b" || { echo "$sym is not in libmrd(3)'s NAME"; exit 1; }
done
echo "libmrd exports $(echo "$listed" | wc -l) symbols, exactly those of libmrd.map, each in mrd.h and libmrd(3)"
