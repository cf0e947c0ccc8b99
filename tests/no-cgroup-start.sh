#!/bin/sh
# mrd starts and serves where no cgroup hierarchy is mounted (a minimal initramfs, as the VM's
# guests; a host of cgroup v1 alone): its check for a cgroup namespace of its own once freed
# garbage there, and mrd died before it bound its socket.
set -u
[ "$(id -u)" = 0 ] || { echo "needs root (a mount namespace to hide the cgroup mounts in)"; exit 77; }
command -v unshare > /dev/null || { echo "no unshare (Debian: util-linux)"; exit 77; }
unshare -m true 2> /dev/null || { echo "unshare -m refused here: cannot hide the cgroup mounts"; exit 77; }

dir=$(mktemp -d /tmp/mrd-nocg.XXXXXX)
trap 'rm -rf "$dir"' EXIT
: > "$dir/empty.conf"
# In a mount namespace of its own, every cgroup mount lazily gone, then mrd; mrctl asks it.
unshare -m sh -c '
	grep " - cgroup" /proc/self/mountinfo | cut -d" " -f5 | sort -r | while read -r m; do
		umount -l "$m" 2> /dev/null
	done
	if grep -q " - cgroup" /proc/self/mountinfo; then echo "cgroup mounts stay"; exit 77; fi
	"$1/mrd" --foreground --no-bus --config "$2/empty.conf" --socket "$2/mrd.sock" \
		> "$2/log" 2>&1 &
	pid=$!
	# 60 s at most (1200 x 0.05 s): a loaded machine starts mrd slowly; its exit ends it sooner.
	for i in $(seq 1200); do
		[ -S "$2/mrd.sock" ] && break
		kill -0 $pid 2> /dev/null || break
		sleep 0.05
	done
	"$1/mrctl" --socket "$2/mrd.sock" status > "$2/status" 2>&1
	rc=$?
	kill $pid 2> /dev/null
	wait $pid
	mrd_rc=$?
	[ $rc = 0 ] && [ $mrd_rc = 0 ] && exit 0
	echo "mrctl status rc $rc, mrd rc $mrd_rc (139: SIGSEGV):"
	tail -n 5 "$2/log" "$2/status"
	exit 1
' sh "$MRD_BUILDDIR" "$dir"
rc=$?
[ $rc = 0 ] && echo "PASS: mrd serves with no cgroup mounted"
exit $rc
