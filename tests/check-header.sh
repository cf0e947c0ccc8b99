#!/bin/sh
# Each public header compiles alone, as strict C89, C11 and C++.
set -eu
cd "$MRD_SRCDIR/include"
status=0
for h in mrd/*.h; do
	printf '#include <%s>\n' "$h" > hdr.tmp.$$.c
	for std in c89 c11; do
		${CC:-cc} -std=$std -pedantic -Wall -Wextra -Werror -I. -fsyntax-only -x c hdr.tmp.$$.c ||
			{ echo "FAIL: $h as $std"; status=1; }
	done
	if ${CXX:-c++} --version >/dev/null 2>&1; then
		${CXX:-c++} -std=c++11 -pedantic -Wall -Wextra -Werror -I. -fsyntax-only -x c++ hdr.tmp.$$.c ||
			{ echo "FAIL: $h as C++"; status=1; }
	else
		echo "no C++ compiler ($CXX): C++ check of $h not run"; status=77
	fi
	rm -f hdr.tmp.$$.c
done
[ $status -eq 0 ] && echo "public headers compile alone as C89, C11 and C++11"
exit $status
