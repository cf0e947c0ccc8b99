#!/bin/sh
# mrd takes its listening socket from systemd (LISTEN_FDS) and reports READY=1 over
# NOTIFY_SOCKET (tests/notify-wait listens there, as systemd would).
set -u
activate=${SOCKET_ACTIVATE:-}
[ -n "$activate" ] && command -v "$activate" >/dev/null ||
	{ echo "systemd-socket-activate not found (Debian: systemd): cannot test socket activation"; exit 77; }

dir=$(mktemp -d /tmp/mrd-sa.XXXXXX)
trap 'kill $pid ${nw:-} 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
sock="$dir/mrd.sock"
: > "$dir/empty.conf"

"$MRD_BUILDDIR/tests/notify-wait" "$dir/notify" 60 READY=1 > "$dir/notified" 2>&1 &
nw=$!
# Waits for mrd are 20 s at most (400 x 0.05 s): a loaded machine starts it slowly.
for i in $(seq 400); do [ -S "$dir/notify" ] && break; sleep 0.05; done
"$activate" --seqpacket -l "$sock" -E NOTIFY_SOCKET="$dir/notify" "$MRD_BUILDDIR/mrd" --foreground \
	--no-bus --config "$dir/empty.conf" --socket "$dir/unused.sock" > "$dir/log" 2>&1 &
pid=$!
for i in $(seq 400); do [ -S "$sock" ] && break; sleep 0.05; done

# The first connection starts mrd, which must serve it on the inherited socket. The socket's
# file appears at bind(), a moment before systemd-socket-activate listens on it: until then a
# connection is refused.
for i in $(seq 200); do
	out=$("$MRD_BUILDDIR/mrctl" --socket "$sock" status 2>&1) && break
	echo "$out" | grep -q 'Connection refused' || break
	sleep 0.1
done
[ -n "${out##*refused*}" ] && echo "$out" | grep -q '^clients:' ||
	{ echo "mrctl failed: $out"; cat "$dir/log"; exit 1; }
echo "$out" | grep -q '^clients: *1 of' || { echo "unexpected status: $out"; exit 1; }
grep -q 'serving on the socket passed by systemd' "$dir/log" || { echo "mrd did not use LISTEN_FDS:"; cat "$dir/log"; exit 1; }
[ ! -e "$dir/unused.sock" ] || { echo "mrd bound its own socket despite LISTEN_FDS"; exit 1; }
wait $nw || { echo "no READY=1 over NOTIFY_SOCKET:"; cat "$dir/notified"; cat "$dir/log"; exit 1; }
grep -q '^MAINPID=' "$dir/notified" || { echo "READY=1 without MAINPID:"; cat "$dir/notified"; exit 1; }

kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || { echo "mrd exited $rc on SIGTERM"; cat "$dir/log"; exit 1; }
[ -S "$sock" ] || { echo "mrd removed the socket systemd owns"; exit 1; }
echo "socket activation: served on the inherited socket, READY=1 over NOTIFY_SOCKET, clean exit"
