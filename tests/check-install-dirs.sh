#!/bin/sh
# make install puts every file where the system reads it, for a prefix of /usr and for the
# default /usr/local: configure (in a scratch tree) and make install-data into a DESTDIR,
# then ask the readers themselves: systemctl --root finds the units, systemd-analyze
# cat-config the sysusers.d and tmpfiles.d files, the system bus's own configuration names the
# policy's folder, pkg-config's and man's search paths hold libmrd.pc's and the pages'. A
# prefix of /usr reads mrd.conf from /etc.
set -u
for tool in systemctl systemd-analyze; do
	command -v $tool > /dev/null || { echo "$tool not found (Debian: systemd): not checked"; exit 77; }
done
# configure refuses a second build of a source tree configured in place (./configure && make).
if [ -e "$MRD_SRCDIR/config.status" ]; then
	echo "$MRD_SRCDIR is configured in place, and configure builds it nowhere else: not checked (an out-of-tree build checks it: tools/check.sh)"
	exit 77
fi
bus_conf=/usr/share/dbus-1/system.conf
[ -r $bus_conf ] || { echo "no $bus_conf (Debian: dbus-system-bus-common): not checked"; exit 77; }
d=$(mktemp -d /tmp/mrd-install-dirs.XXXXXX)
trap 'rm -rf "$d"' EXIT
fail=0
no() { echo "prefix $prefix: $*"; fail=1; }

# The folders the system bus reads policies from: its <includedir>s, relative to its own.
bus_dirs=$(sed -n 's|.*<includedir>\(.*\)</includedir>.*|\1|p' $bus_conf |
	sed "s|^\([^/]\)|$(dirname $bus_conf)/\1|")

pc_path=$(pkg-config --variable pc_path pkg-config)
man_path=$(manpath -g 2> /dev/null) ||
	echo "manpath not found (Debian: man-db): the man pages' folder is not checked"

for prefix in /usr /usr/local; do
	b=$d/build$prefix r=$d/root$prefix
	mkdir -p "$b"
	(cd "$b" && "$MRD_SRCDIR/configure" -q --prefix=$prefix > configure.log 2>&1 &&
		make -s install-data DESTDIR="$r" > install.log 2>&1) ||
		{ no "configure or make install-data failed:"; tail -n 20 "$b"/*.log; continue; }
	for unit in mrd.service mrd.socket mrd-metrics.service mrd-metrics.timer mrd-cdi.service; do
		systemctl --root="$r" list-unit-files "$unit" 2> /dev/null | grep -q "^$unit " ||
			no "systemd does not find $unit: $(cd "$r" && find . -name "$unit")"
		[ -e "$r$prefix/lib/systemd/system/$unit" ] || # --prefix respected
			no "$unit is not under $prefix/lib/systemd/system: $(cd "$r" && find . -name "$unit")"
	done
	for kind in sysusers.d tmpfiles.d; do
		systemd-analyze --root="$r" cat-config "$kind/mrd.conf" > /dev/null 2>&1 ||
			no "systemd does not read $kind/mrd.conf: $(cd "$r" && find . -path "*$kind/mrd.conf")"
	done
	# udev (systemd 252) reads rules under /etc, /run, /usr/local/lib and /usr/lib.
	rules=$(cd "$r" && find . -name 71-mrd-cdi.rules | sed 's|^\.||')
	case "$rules" in
	/usr/lib/udev/rules.d/*|/usr/local/lib/udev/rules.d/*) ;;
	*) no "udev does not read ${rules:-no 71-mrd-cdi.rules}" ;;
	esac
	policy=$(cd "$r" && find . -name org.mrd.Mrd1.conf | sed 's|^\.||')
	[ -n "$policy" ] || no "no D-Bus policy installed"
	echo "$bus_dirs" | grep -qx "$(dirname "${policy:-/none/x}")" ||
		no "the system bus reads policies from $(echo $bus_dirs), not ${policy:-nothing}"
	# pkg-config's own search path holds libmrd.pc's folder, and the file names the prefix.
	pc=$(cd "$r" && find . -name libmrd.pc | sed 's|^\.||')
	echo ":$pc_path:" | grep -q ":$(dirname "${pc:-/none/x}"):" ||
		no "pkg-config searches $pc_path, not ${pc:-no libmrd.pc}"
	[ -n "$pc" ] && [ "$(PKG_CONFIG_LIBDIR="$r$(dirname "$pc")" pkg-config --variable=prefix libmrd)" = $prefix ] ||
		no "libmrd.pc does not name the prefix $prefix"
	# man's own search path holds the pages' folder (man mrd, man libmrd).
	if [ -n "$man_path" ]; then
		for page in mrd.8 libmrd.3; do
			m=$(cd "$r" && find . -name "$page" | sed 's|^\.||')
			echo ":$man_path:" | grep -q ":$(dirname "$(dirname "${m:-/none/x/y}")"):" ||
				no "man searches $man_path, not ${m:-no $page}"
		done
	fi
	if [ $prefix = /usr ]; then # mrd reads $(sysconfdir)/mrd/mrd.conf, where it is installed
		[ -e "$r/etc/mrd/mrd.conf" ] && grep -q '^sysconfdir = /etc$' "$b/Makefile" ||
			no "mrd.conf is not /etc/mrd/mrd.conf: $(cd "$r" && find . -name mrd.conf -path '*/mrd/*')"
	fi
done
[ $fail = 0 ] && echo "prefixes /usr and /usr/local: units, the udev rule, sysusers.d, tmpfiles.d, the D-Bus policy, libmrd.pc${man_path:+ and the man pages} land where the system reads them"
exit $fail
