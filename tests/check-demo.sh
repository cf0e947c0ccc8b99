#!/bin/sh
# The README's main job: mrd-demo's two processes move bytes by keys, see the generation move,
# and have their stale key refused.
set -u
dir=$(mktemp -d /tmp/mrd-demo-test.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
: > "$dir/mrd.conf"
"$MRD_BUILDDIR/mrd" --foreground --config "$dir/mrd.conf" --socket "$dir/mrd.sock" \
	--log-level warning > "$dir/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/mrd.sock" ] && break; sleep 0.05; done
out=$("$MRD_BUILDDIR/mrd-demo" "$dir/mrd.sock" 2>&1) || { echo "mrd-demo failed:"; echo "$out"; exit 1; }
for want in 'RDMA write of 64 bytes: done' 'found "hello from pid' 'without asking mrd' \
	'1000000 served by the lookup cache, 2 asked mrd' 'after free: Required key not available'; do
	echo "$out" | grep -q "$want" || { echo "missing: $want"; echo "$out"; exit 1; }
done
echo "mrd-demo: bytes moved by keys, generation seen, stale key refused"
