#!/bin/sh
# libmrd.so exports exactly the names in client/libmrd.map, each listed once and nothing else,
# and each is declared in <mrd/mrd.h>. (tests/check-man.sh checks that man NAME finds each.)
set -eu
lib="$MRD_BUILDDIR/.libs/libmrd.so"
map="$MRD_SRCDIR/client/libmrd.map"
[ -f "$lib" ] || { echo "no $lib (built with --disable-shared?)"; exit 77; }

exported=$(${NM:-nm} -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ { sub(/@.*/, "", $3); print $3 }' |
	grep -v '^MRD_' | sort -u)
all_listed=$(sed -n 's/^[[:space:]]*\([a-z_][a-z0-9_]*\);.*/\1/p' "$map" | sort)
listed=$(echo "$all_listed" | sort -u)

twice=$(echo "$all_listed" | uniq -d)
[ -z "$twice" ] || { echo "listed more than once in $map:" $twice; exit 1; }
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
echo "libmrd exports $(echo "$listed" | wc -l) symbols, exactly those of libmrd.map (each once), each in mrd.h"
