#!/bin/sh
# Puts each run of adjacent quoted includes under daemon/ in layer order, the order
# tests/check-layers.sh checks: level 0 (common/, proto/, mrd/) first, then base/, provider/,
# memory/, registration/, core/, control/, by path within a level. Rewrites files in place.
set -eu
cd "$(dirname "$0")/../daemon"
layers="base provider memory registration core control"
for f in $(find . -name '*.[ch]' | sed 's|^\./||' | sort); do
	awk -v layers="$layers" '
	BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) lv[l[i]] = i }
	function key(line,   t, d) {
		t = line; sub(/^[^"]*"/, "", t); sub(/".*/, "", t)
		d = t; sub(/\/.*/, "", d)
		return sprintf("%d %s", (t ~ /\// && d in lv) ? lv[d] : 0, t)
	}
	function flush(   i, j, tk, tl) {
		for (i = 2; i <= m; i++) # insertion sort: runs are short
			for (j = i; j > 1 && k[j] < k[j - 1]; j--) {
				tk = k[j]; k[j] = k[j - 1]; k[j - 1] = tk
				tl = r[j]; r[j] = r[j - 1]; r[j - 1] = tl
			}
		for (i = 1; i <= m; i++) print r[i]
		m = 0
	}
	/^[ \t]*#[ \t]*include[ \t]*"/ { m++; r[m] = $0; k[m] = key($0); next }
	{ flush(); print }
	END { flush() }' "$f" > "$f.sorted"
	if cmp -s "$f" "$f.sorted"; then rm "$f.sorted"; else mv "$f.sorted" "$f"; fi
done
