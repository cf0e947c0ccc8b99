#!/bin/sh
# The systemd units pass systemd-analyze verify with no output at all (unknown keys are only
# warnings there, so any output fails). ExecStart is pointed at the built mrd.
set -u
command -v systemd-analyze >/dev/null ||
	{ echo "systemd-analyze not found (Debian: systemd): units not verified"; exit 77; }
d=$(mktemp -d /tmp/mrd-units.XXXXXX)
trap 'rm -rf "$d"' EXIT
sed "s|^ExecStart=[^ ]*/mrd |ExecStart=$MRD_BUILDDIR/mrd |" "$MRD_BUILDDIR/systemd/mrd.service" > "$d/mrd.service"
cp "$MRD_SRCDIR/systemd/mrd.socket" "$d/"
grep -q '^Type=notify$' "$d/mrd.service" || { echo "mrd.service is not Type=notify"; exit 1; }
out=$(systemd-analyze verify --man=no "$d/mrd.socket" "$d/mrd.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
	echo "systemd-analyze verify (exit $rc):"
	echo "$out"
	exit 1
fi
echo "mrd.service and mrd.socket verify cleanly"
