#!/bin/sh
# man NAME finds every name of libmrd's API: each function (static inline ones too) and
# function-like macro of include/mrd/*.h has man/NAME.3, a page or a .so link to one (as in
# rdma-core: one page per group of calls), whose NAME section lists it and whose SYNOPSIS
# declares it; and every man/*.3 is installed (listed in man/include.am).
set -u
src="$MRD_SRCDIR"
status=0
fail() { echo "$*"; status=1; }

# Declarations start in column 0 once comments are gone: the name is the last word before the
# first '(' (calls inside inline bodies are indented; "defined(" is not an mrd_ name).
names=$(for h in "$src"/include/mrd/*.h; do
	awk '{
		out = ""; s = $0
		while (s != "") {
			if (incomment) {
				i = index(s, "*/"); if (!i) { s = ""; break }
				s = substr(s, i + 2); incomment = 0
			} else {
				i = index(s, "/*"); if (!i) { out = out s; break }
				out = out substr(s, 1, i - 1); s = substr(s, i + 2); incomment = 1
			}
		}
		print out
	}' "$h"
done | grep -E '^[#A-Za-z_].*\(' | sed -n 's/^\([^(]*[^A-Za-z0-9_]\)\{0,1\}\(mrd_[a-z0-9_]*\|MRD_[A-Z0-9_]*\)[[:space:]]*(.*/\2/p' |
	sort -u)
[ -n "$names" ] || { echo "no API names found in $src/include/mrd"; exit 1; }

# The page a name resolves to: itself, or the target of its .so line.
page_of() {
	f="$src/man/$1.3"
	[ -f "$f" ] || return 1
	target=$(sed -n 's|^\.so man3/\(.*\)$|\1|p' "$f")
	if [ -n "$target" ]; then
		f="$src/man/$target"
		[ -f "$f" ] || return 1
	fi
	echo "$f"
}

n=0
for name in $names; do
	n=$((n + 1))
	page=$(page_of "$name") || { fail "man $name finds nothing: no man/$name.3 (or its .so target)"; continue; }
	sed -n '/^\.SH NAME/,/^\.SH/p' "$page" | grep -q "\b$name\b" ||
		fail "man/$(basename "$page") does not list $name in its NAME section"
	sed -n '/^\.SH SYNOPSIS/,/^\.SH/p' "$page" | grep -q "\b$name(" ||
		fail "man/$(basename "$page") does not declare $name in its SYNOPSIS"
done

for f in "$src"/man/*.3; do
	grep -q "man/$(basename "$f")\b" "$src/man/include.am" ||
		fail "man/$(basename "$f") is not in man/include.am: make install would leave it out"
done
# mrd(8)'s REQUESTS names every request of the protocol (Request's oneof in proto/mrd.proto).
requests=$(sed -n '/^message Request {/,/^}/s/^ *\([A-Za-z]*\)Request [a-z_]* = [0-9]*;.*/\1/p' \
	"$src/proto/mrd.proto")
[ -n "$requests" ] || fail "no requests found in proto/mrd.proto"
section=$(sed -n '/^\.SH REQUESTS/,/^\.SH/p' "$src/man/mrd.8")
for req in $requests; do
	echo "$section" | grep -q "\b$req\b" || fail "mrd(8)'s REQUESTS does not name the request $req"
done
[ $status -eq 0 ] || exit 1
echo "man NAME finds each of the $n API names of include/mrd/*.h, on a page that lists and declares it; mrd(8) names each of the $(echo $requests | wc -w) requests"
