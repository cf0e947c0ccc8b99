#!/bin/sh
# Each public header compiles alone: mrd.h as strict C89, C11 and C++11; mrd-verbs.h as C11 and
# C++11 (libibverbs' own header is not C89).
set -eu
cd "$MRD_SRCDIR/include"
status=0
tmp=hdr.tmp.$$.c
trap 'rm -f "$tmp"' EXIT

have_cxx=yes
${CXX:-c++} --version >/dev/null 2>&1 || have_cxx=no

check() { # header, C standards...
	h=$1
	shift
	printf '#include <%s>\n' "$h" > "$tmp"
	for std in "$@"; do
		${CC:-cc} -std="$std" -pedantic -Wall -Wextra -Werror -I. -fsyntax-only -x c "$tmp" ||
			{ echo "FAIL: $h as $std"; status=1; }
	done
	if [ $have_cxx = yes ]; then
		${CXX:-c++} -std=c++11 -pedantic -Wall -Wextra -Werror -I. -fsyntax-only -x c++ "$tmp" ||
			{ echo "FAIL: $h as C++11"; status=1; }
	fi
}

check mrd/mrd.h c89 c11
check mrd/mrd-verbs.h c11
[ $status -eq 0 ] || exit 1
if [ $have_cxx = no ]; then
	echo "no C++ compiler ($CXX): the C++ half of this check did not run"
	exit 77
fi
echo "mrd.h compiles alone as C89, C11 and C++11; mrd-verbs.h as C11 and C++11"
