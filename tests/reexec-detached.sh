#!/bin/sh
# A detached mrd (no systemd, no --foreground) started with relative paths re-executes on
# SIGUSR2 and goes on serving from the same process: the paths were made absolute before it
# left its folder for /, and the new image stays detached.
set -u
dir=$(mktemp -d /tmp/mrd-rx.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
cd "$dir" || exit 1
printf '[mrd]\nbus = no\n[memory]\nhugepages = no\n' > mrd.conf
env -u NOTIFY_SOCKET -u LISTEN_FDS "$MRD_BUILDDIR/mrd" --config mrd.conf --socket mrd.sock ||
	{ echo "mrd did not start detached"; exit 1; }
status() { "$MRD_BUILDDIR/mrctl" --socket "$dir/mrd.sock" --json status 2>&1; }
# Waits are 20 s at most: a loaded machine starts and re-executes mrd slowly. The uptime before
# is 3 s and more, so that the new image's, however slow its start, is less.
for i in $(seq 200); do
	before=$(status | sed -n 's/.*"pid":\([0-9]*\).*"uptime_usec":\([0-9]*\).*/\1 \2/p')
	[ -n "$before" ] && [ "${before#* }" -ge 3000000 ] && break
	sleep 0.1
done
pid=${before% *}
[ -n "$pid" ] || { echo "no status: $(status)"; exit 1; }
kill -USR2 "$pid"
for i in $(seq 200); do
	sleep 0.1
	now=$(status | sed -n 's/.*"pid":\([0-9]*\).*"uptime_usec":\([0-9]*\).*/\1 \2/p')
	# The same process, its uptime started again by the new image.
	[ -n "$now" ] && [ "${now% *}" = "$pid" ] && [ "${now#* }" -lt "${before#* }" ] && break
done
kill -0 "$pid" 2>/dev/null || { echo "mrd is gone after SIGUSR2"; exit 1; }
[ -n "$now" ] && [ "${now% *}" = "$pid" ] && [ "${now#* }" -lt "${before#* }" ] ||
	{ echo "mrd (pid $pid) did not re-execute on SIGUSR2: $(status)"; exit 1; }
kill -TERM "$pid"
for i in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { echo "mrd did not exit on SIGTERM"; exit 1; }
pid=
[ ! -e "$dir/mrd.sock" ] || { echo "the re-executed mrd left its socket behind"; exit 1; }
echo "detached mrd re-executed on SIGUSR2 with relative paths, served, exited cleanly"
