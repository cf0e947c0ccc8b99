#!/bin/sh
# The daemon's layers (README, "Layout"): a file under daemon/ includes headers of its own folder
# and of lower ones only, each named with its folder ("memory/arena.h"), and names no struct
# that a higher folder defines, not even to declare it. Unprefixed includes are common/, proto/
# and the public mrd/ headers (level 0). Fails listing every offending line.
set -eu
cd "${MRD_SRCDIR:-.}/daemon"
tmp=$(mktemp) # not in the source tree, which distcheck makes read-only
trap 'rm -f "$tmp"' EXIT
layers="base provider memory registration core control"

level() { # folder -> its number; main.c sits above every folder
	n=1
	for l in $layers; do
		[ "$l" = "$1" ] && { echo $n; return; }
		n=$((n + 1))
	done
	echo 0
}

bad=0
report() { echo "FAIL: $*"; bad=$((bad + 1)); }

for f in $(find . -name '*.[ch]' | sed 's|^\./||' | sort); do
	case $f in
	*/*) own=${f%%/*}; own_level=$(level "$own") ;;
	*) own=.; own_level=7 ;;
	esac
	[ "$own_level" -gt 0 ] || { report "$f: in no layer folder ($layers)"; continue; }
	grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
		sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1 \2/' > "$tmp" || true
	while read -r line target; do
		case $target in
		mrd/*) continue ;;
		*/*)
			folder=${target%%/*}
			l=$(level "$folder")
			if [ "$l" -eq 0 ]; then
				report "$f:$line: includes \"$target\": no such layer"
			elif [ ! -f "$target" ]; then
				report "$f:$line: includes \"$target\": no such file"
			elif [ "$l" -gt "$own_level" ]; then
				report "$f:$line: includes \"$target\": $folder is above $own"
			fi ;;
		*)
			if [ -f "../common/$target" ] || [ -f "../proto/$target" ] ||
				[ "${target%.pb-c.h}" != "$target" ]; then
				continue
			fi
			report "$f:$line: includes \"$target\" without its folder" ;;
		esac
	done < "$tmp"
done

# Structs a higher folder defines are not named below it.
for upper in $layers; do
	ul=$(level "$upper")
	for s in $(grep -ho '^struct [a-z_][a-z0-9_]* {' "$upper"/*.h 2>/dev/null |
		   sed 's/^struct \([a-z0-9_]*\) {/\1/' | sort -u); do
		for lower in $layers; do
			[ "$(level "$lower")" -lt "$ul" ] || continue
			grep -n "struct $s\\b" "$lower"/*.[ch] 2>/dev/null |
				while IFS= read -r hit; do
					echo "FAIL: $lower/${hit#"$lower"/}: names struct $s of $upper"
				done
		done
	done
done > "$tmp"
n=$(grep -c . "$tmp" || true)
cat "$tmp"
bad=$((bad + n))

# Includes in layer order: in each run of adjacent quoted includes, level 0 (common/, proto/,
# mrd/) first, then base/ up to control/, by path within a level; so an include line that
# reaches up stands out at the end of its run (tools/sort-includes.sh puts them in order).
for f in $(find . -name '*.[ch]' | sed 's|^\./||' | sort); do
	awk -v f="$f" -v layers="$layers" '
	BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) lv[l[i]] = i }
	function key(t,   d) {
		d = t; sub(/\/.*/, "", d)
		return sprintf("%d %s", (t ~ /\// && d in lv) ? lv[d] : 0, t)
	}
	/^[ \t]*#[ \t]*include[ \t]*"/ {
		t = $0; sub(/^[^"]*"/, "", t); sub(/".*/, "", t)
		k = key(t)
		if (prev != "" && k < prev)
			printf "FAIL: %s:%d: includes \"%s\" after \"%s\" (layer order)\n", f, NR, t, prevt
		prev = k; prevt = t; next
	}
	{ prev = "" }' "$f"
done > "$tmp"
n=$(grep -c . "$tmp" || true)
cat "$tmp"
bad=$((bad + n))

if [ $bad -ne 0 ]; then
	echo "$bad line(s) reach up, name no folder or stand out of layer order"
	exit 1
fi
echo "every include under daemon/ points to its own folder or lower, in layer order"
