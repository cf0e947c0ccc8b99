#!/bin/sh
# mrd takes its listening socket from systemd (LISTEN_FDS). (READY=1 and STOPPING=1 over
# NOTIFY_SOCKET are checked for every mrd the C suites start: tests/test-util.c.)
set -u
activate=${SOCKET_ACTIVATE:-}
[ -n "$activate" ] && command -v "$activate" >/dev/null ||
	{ echo "systemd-socket-activate not found (Debian: systemd): cannot test socket activation"; exit 77; }

dir=$(mktemp -d /tmp/mrd-sa.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
sock="$dir/mrd.sock"
: > "$dir/empty.conf"

"$activate" --seqpacket -l "$sock" "$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/empty.conf" \
	--socket "$dir/unused.sock" > "$dir/log" 2>&1 &
pid=$!
for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

# The first connection starts mrd, which must serve it on the inherited socket.
out=$("$MRD_BUILDDIR/mrctl" --socket "$sock" status 2>&1) || { echo "mrctl failed: $out"; cat "$dir/log"; exit 1; }
echo "$out" | grep -q '^clients: *1 of' || { echo "unexpected status: $out"; exit 1; }
grep -q 'serving on the socket passed by systemd' "$dir/log" || { echo "mrd did not use LISTEN_FDS:"; cat "$dir/log"; exit 1; }
[ ! -e "$dir/unused.sock" ] || { echo "mrd bound its own socket despite LISTEN_FDS"; exit 1; }

kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || { echo "mrd exited $rc on SIGTERM"; cat "$dir/log"; exit 1; }
[ -S "$sock" ] || { echo "mrd removed the socket systemd owns"; exit 1; }
echo "socket activation: served on the inherited socket, clean exit"
