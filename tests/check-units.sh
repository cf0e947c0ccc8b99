#!/bin/sh
# The systemd units pass systemd-analyze verify with no output at all (unknown keys are only
# warnings there, so any output fails). ExecStart is pointed at the built mrd.
set -u
command -v systemd-analyze >/dev/null ||
	{ echo "systemd-analyze not found (Debian: systemd): units not verified"; exit 77; }
d=$(mktemp -d /tmp/mrd-units.XXXXXX)
trap 'rm -rf "$d"' EXIT
sed "s|^ExecStart=[^ ]*/mrd |ExecStart=$MRD_BUILDDIR/mrd |" "$MRD_BUILDDIR/systemd/mrd.service" > "$d/mrd.service"
sed "s|^ExecStart=[^ ]*/mrctl |ExecStart=$MRD_BUILDDIR/mrctl |" "$MRD_BUILDDIR/systemd/mrd-metrics.service" \
	> "$d/mrd-metrics.service"
sed "s#^\(Exec[A-Za-z]*\)=[^ ]*/mrctl #\1=$MRD_BUILDDIR/mrctl #" "$MRD_BUILDDIR/systemd/mrd-cdi.service" \
	> "$d/mrd-cdi.service"
cp "$MRD_SRCDIR/systemd/mrd.socket" "$MRD_SRCDIR/systemd/mrd-metrics.timer" "$d/"
grep -q '^Type=notify$' "$d/mrd.service" || { echo "mrd.service is not Type=notify"; exit 1; }
out=$(systemd-analyze verify --man=no "$d/mrd.socket" "$d/mrd.service" "$d/mrd-metrics.service" \
	"$d/mrd-metrics.timer" "$d/mrd-cdi.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
	echo "systemd-analyze verify (exit $rc):"
	echo "$out"
	exit 1
fi
# systemd-analyze security: the exposure score (README, mrd.service: 1.7 now, 3.8 before the
# hardening of issue 24) and the settings it finds open, each for a reason mrd.service gives
# (PrivateNetwork= would make it 1.2 and hide every RDMA device in exclusive netns mode).
# Any setting lost or loosened adds one.
open="SystemCallFilter=~@privileged RootDirectory=/RootImage= User=/DynamicUser= PrivateDevices= \
CapabilityBoundingSet=~CAP_IPC_LOCK RestrictAddressFamilies=~AF_NETLINK \
RestrictAddressFamilies=~AF_UNIX ProtectProc= PrivateUsers= DeviceAllow= PrivateNetwork="
report=$(systemd-analyze security --offline=yes --no-pager "$d/mrd.service" 2>&1)
score=$(echo "$report" | sed -n 's/.*Overall exposure level for mrd.service: \([0-9.]*\).*/\1/p')
# ✗ marks an open setting, or - where the locale is not UTF-8.
found=$(echo "$report" | sed -n -e 's/^✗ \([^ ]*\) .*/\1/p' -e 's/^- \([^ ]*\) .*/\1/p' | sort | tr '\n' ' ')
want=$(echo $open | tr ' ' '\n' | sort | tr '\n' ' ')
if [ "$score" != 1.7 ] || [ "$found" != "$want" ]; then
	echo "systemd-analyze security: mrd.service scores ${score:-nothing} (want 1.7), open:"
	echo "$report" | grep -E '^(✗|- )'
	exit 1
fi
# mrd-metrics.service: root for mrd's whole view, and nothing else it does not need (0.9).
score=$(systemd-analyze security --offline=yes --no-pager "$d/mrd-metrics.service" 2>&1 |
	sed -n 's/.*Overall exposure level for mrd-metrics.service: \([0-9.]*\).*/\1/p')
[ "$score" = 0.9 ] || { echo "mrd-metrics.service scores ${score:-nothing}, want 0.9"; exit 1; }
grep -q '^OOMScoreAdjust=-900$' "$d/mrd.service" || { echo "mrd.service has no OOMScoreAdjust=-900"; exit 1; }
# mrd-cdi.service: the CDI spec written once mrd is ready and again at each reload of mrd, which
# the udev rule asks for when an RDMA device comes or goes; no capability at all (0.9).
score=$(systemd-analyze security --offline=yes --no-pager "$d/mrd-cdi.service" 2>&1 |
	sed -n 's/.*Overall exposure level for mrd-cdi.service: \([0-9.]*\).*/\1/p')
[ "$score" = 0.9 ] || { echo "mrd-cdi.service scores ${score:-nothing}, want 0.9"; exit 1; }
has() { grep -q "$2" "$d/$1" || { echo "$1 has no line $2"; exit 1; }; }
has mrd.service '^Wants=mrd-cdi.service$'
has mrd-cdi.service '^After=mrd.service$'
has mrd-cdi.service '^PartOf=mrd.service$'
has mrd-cdi.service '^ReloadPropagatedFrom=mrd.service$'
has mrd-cdi.service '^ExecReload=.*/mrctl cdi --output /run/cdi/mrd.yaml$'
grep -Eq '^SUBSYSTEM=="infiniband_verbs", ACTION=="add\|remove", RUN\+="/bin/systemctl --no-block try-reload-or-restart mrd.service"$' \
	"$MRD_SRCDIR/systemd/71-mrd-cdi.rules" || { echo "71-mrd-cdi.rules does not reload mrd when a device comes or goes"; exit 1; }
# The group the socket names, and the folder it lives in, made in a scratch root.
if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
	mkdir -p "$d/root/etc"
	: > "$d/root/etc/group"; : > "$d/root/etc/passwd"
	systemd-sysusers --root="$d/root" "$MRD_SRCDIR/systemd/mrd.sysusers" ||
		{ echo "systemd-sysusers failed"; exit 1; }
	grep -q '^mrd:x:[0-9]*:$' "$d/root/etc/group" || { echo "no group mrd:"; cat "$d/root/etc/group"; exit 1; }
	systemd-tmpfiles --root="$d/root" --create "$MRD_SRCDIR/systemd/mrd.tmpfiles" ||
		{ echo "systemd-tmpfiles failed"; exit 1; }
	gid=$(sed -n 's/^mrd:x:\([0-9]*\):$/\1/p' "$d/root/etc/group")
	[ "$(stat -c '%a %u %g' "$d/root/run/mrd")" = "755 0 $gid" ] ||
		{ echo "/run/mrd: $(stat -c '%a %u %g' "$d/root/run/mrd"), want 755 0 $gid"; exit 1; }
	grep -q '^SocketGroup=mrd$' "$d/mrd.socket" && grep -q '^SocketMode=0660$' "$d/mrd.socket" ||
		{ echo "mrd.socket is not 0660 group mrd"; exit 1; }
fi
echo "mrd.service (exposure 1.7), mrd.socket, mrd-metrics.service (0.9), .timer and mrd-cdi.service (0.9) verify cleanly, a device's coming reloads mrd and the spec; the group mrd and /run/mrd are made as declared"
