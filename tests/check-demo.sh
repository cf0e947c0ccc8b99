#!/bin/sh
# The README's main job: mrd-demo's two processes move bytes by keys, see the generation move,
# have their stale key refused, and memory allocated again gets new keys.
set -u
dir=$(mktemp -d /tmp/mrd-demo-test.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
# No huge pages: test-hugetlb, running beside, counts the free ones.
printf '[memory]\nhugepages = no\n' > "$dir/mrd.conf"
"$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/mrd.conf" --socket "$dir/mrd.sock" \
	--log-level warning > "$dir/log" 2>&1 &
pid=$!
# Waits for mrd are 20 s at most (400 x 0.05 s): a loaded machine starts it slowly.
for _ in $(seq 400); do [ -S "$dir/mrd.sock" ] && break; sleep 0.05; done
out=$("$MRD_BUILDDIR/mrd-demo" "$dir/mrd.sock" 2>&1) || { echo "mrd-demo failed:"; echo "$out"; exit 1; }
for want in 'RDMA write of 64 bytes: done' 'found "hello from pid' 'without asking mrd' \
	'1000000 served by the lookup cache, 2 asked mrd' 'after free: Required key not available' \
	'1 MiB again at'; do
	echo "$out" | grep -q "$want" || { echo "missing: $want"; echo "$out"; exit 1; }
done
# Allocated again, the new buffer got the parked MR handle, with a key other than its last.
keys=$(echo "$out" | sed -n 's/.*1 MiB again at .*: lkey \(0x[0-9a-f]*\) (was \(0x[0-9a-f]*\))/\1 \2/p')
set -- $keys
[ $# -eq 2 ] && [ "$1" != "$2" ] || { echo "the new buffer's key is not a new one: $keys"; exit 1; }
echo "mrd-demo: bytes moved by keys, generation seen, stale key refused, a new key on reuse"
