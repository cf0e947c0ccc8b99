#!/bin/sh
# The README's mempool block, pasted as printed into a program (with the handle c and the cache
# of the block before it), builds and runs on a host with no free huge pages: it checks its
# errors and asks for none.
set -u
dir=$(mktemp -d /tmp/mrd-readme-test.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
marker='tests/check-readme-mempool.sh compiles and runs this block'
awk -v m="$marker" 'index($0, m) { f = 1; next } f && /^```c/ { g = 1; next } g && /^```/ { exit }
	g' "$MRD_SRCDIR/README.md" > "$dir/snippet.c"
[ -s "$dir/snippet.c" ] || { echo "no block after '$marker' in README.md"; exit 1; }
cat > "$dir/main.c" <<'EOC'
#include <stdio.h>
#include <stdlib.h>
#include <mrd/mrd.h>

int main(void)
{
	mrd_client *c = NULL;
	mrd_cache *cache = NULL;

	if (mrd_client_connect(NULL, &c) < 0 || mrd_cache_new(c, &cache) < 0) {
		fprintf(stderr, "harness: %s\n", mrd_last_error());
		return 2;
	}
	{
#include "snippet.c"
	}
	/* A block that went on past a failure left the failure's reason behind. */
	if (*mrd_last_error()) {
		fprintf(stderr, "a call of the block failed and it went on: %s\n",
			mrd_last_error());
		return 3;
	}
	mrd_cache_free(cache);
	mrd_client_close(c);
	puts("the README's mempool block ran");
	return 0;
}
EOC
${CC:-cc} -std=gnu11 -Wall -Werror -I"$MRD_SRCDIR/include" -I"$dir" -o "$dir/readme" "$dir/main.c" \
	"$MRD_BUILDDIR/.libs/libmrd.so" -Wl,-rpath,"$MRD_BUILDDIR/.libs" ${MRD_SAN_CFLAGS:-} ||
	{ echo "the README's mempool block does not build"; exit 1; }
# No huge pages for mrd, as on a host with none free.
printf '[memory]\nhugepages = no\n' > "$dir/mrd.conf"
"$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/mrd.conf" --socket "$dir/mrd.sock" \
	--log-level warning > "$dir/log" 2>&1 &
pid=$!
for _ in $(seq 400); do [ -S "$dir/mrd.sock" ] && break; sleep 0.05; done
out=$(MRD_SOCKET="$dir/mrd.sock" "$dir/readme" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "the README's mempool block failed (status $rc): $out"; exit 1; }
echo "$out"
