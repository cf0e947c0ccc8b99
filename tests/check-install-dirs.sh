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
	(cd "$b" && "$MRD_SRCDIR/configure" -q --cache-file="$d/config.cache" --prefix=$prefix > configure.log 2>&1 &&
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

# A prefix of its own (/opt/x) keeps every file below it, the D-Bus policy too; the man pages
# name the paths of this prefix, and configure's summary each folder it chose.
prefix=/opt/x b=$d/build-opt r=$d/root-opt
mkdir -p "$b"
if (cd "$b" && "$MRD_SRCDIR/configure" --cache-file="$d/config.cache" --prefix=$prefix > configure.log 2>&1 &&
	nice make -s install-data DESTDIR="$r" > install.log 2>&1); then
	outside=$(cd "$r" && find . ! -type d | sed 's|^\.||' | grep -v "^$prefix/")
	[ -z "$outside" ] || no "make install-data wrote outside $prefix: $outside"
	[ -e "$r$prefix/share/dbus-1/system.d/org.mrd.Mrd1.conf" ] ||
		no "the D-Bus policy is not under $prefix/share/dbus-1/system.d: $(cd "$r" && find . -name org.mrd.Mrd1.conf)"
	for want in "$prefix/etc/mrd/mrd.conf" "$prefix/share/dbus-1/system.d/org.mrd.Mrd1.conf"; do
		grep -q "^\.I $want\$" "$r$prefix/share/man/man8/mrd.8" 2> /dev/null ||
			no "the installed mrd(8) does not name $want in FILES"
	done
	grep -q "^\.I $prefix/etc/mrd/mrd.conf\$" "$r$prefix/share/man/man5/mrd.conf.5" 2> /dev/null ||
		no "the installed mrd.conf(5) does not name $prefix/etc/mrd/mrd.conf"
	grep -h '/etc/mrd/\|/usr/share/dbus-1/system.d/org' "$r$prefix/share/man/man8/mrd.8" \
		"$r$prefix/share/man/man5/mrd.conf.5" | grep -v "$prefix" | grep -q . &&
		no "the installed pages still name /usr's paths"
	for folder in "prefix: *$prefix\$" "mrd.conf: *$prefix/etc/mrd/mrd.conf" \
		"systemd units: *$prefix/lib/systemd/system" "udev rules: *$prefix/lib/udev/rules.d" \
		"D-Bus policy: *$prefix/share/dbus-1/system.d" "man pages: *$prefix/share/man" \
		"socket (default): */run/mrd/mrd.sock" "sysusers.d: *$prefix/" "tmpfiles.d: *$prefix/"; do
		grep -q "^  $folder" "$b/configure.log" || no "configure's summary lacks '$folder'"
	done
	grep -q "link org.mrd.Mrd1.conf into /etc/dbus-1/system.d" "$b/configure.log" ||
		no "configure does not say the bus will not read $prefix's policy"
else
	no "configure or make install-data failed:"; tail -n 20 "$b"/configure.log "$b"/install.log 2> /dev/null
fi

# The client side alone: ./configure --disable-daemon finds no check, libsystemd, libevent or
# libibverbs (a pkg-config that denies them) and installs libmrd, its headers, both .pc files,
# the man pages and mrctl, and nothing of mrd's; a verbs client builds from libmrd-verbs.pc.
b=$d/build-client r=$d/root-client
mkdir -p "$b"
cat > "$d/pkg-config" << EOF
#!/bin/sh
for a; do
	case \$a in check*|libsystemd*|libevent*|libibverbs*) exit 1 ;; esac
done
exec $(command -v pkg-config) "\$@"
EOF
chmod +x "$d/pkg-config"
if (cd "$b" && PKG_CONFIG="$d/pkg-config" "$MRD_SRCDIR/configure" --prefix=$prefix \
	--disable-daemon > configure.log 2>&1 && nice make -s -j2 install DESTDIR="$r" > install.log 2>&1); then
	for f in lib/libmrd.so include/mrd/mrd.h include/mrd/mrd-verbs.h lib/pkgconfig/libmrd.pc \
		lib/pkgconfig/libmrd-verbs.pc share/man/man3/mrd_client_connect.3 share/man/man3/libmrd.3 \
		bin/mrctl; do
		[ -e "$r$prefix/$f" ] || no "--disable-daemon did not install $prefix/$f"
	done
	for f in mrd libmrd-preload.so mrd.service org.mrd.Mrd1.conf 71-mrd-cdi.rules; do
		[ -z "$(cd "$r" && find . ! -type d -name "$f")" ] || no "--disable-daemon installed $f"
	done
	objdump -p "$r$prefix/lib/libmrd.so" 2> /dev/null | grep -q 'NEEDED.*libibverbs' &&
		no "libmrd.so links libibverbs"
	cat > "$d/verbs-client.c" << EOF
#include <mrd/mrd-verbs.h>
int main(void)
{
	mrd_client *c;
	return mrd_client_connect("/nowhere", &c) == 0 && mrd_verbs_bind_pd(c, NULL) == 0;
}
EOF
	flags=$(PKG_CONFIG_PATH="$r$prefix/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$r" \
		pkg-config --cflags --libs libmrd-verbs 2> "$d/pc.err") ||
		no "pkg-config libmrd-verbs: $(cat "$d/pc.err")"
	echo "$flags" | grep -q -- -libverbs || no "libmrd-verbs.pc does not link libibverbs: $flags"
	# shellcheck disable=SC2086
	${CC:-cc} -o "$d/verbs-client" "$d/verbs-client.c" $flags > "$d/cc.log" 2>&1 ||
		{ no "a verbs client does not build with pkg-config --cflags --libs libmrd-verbs:"; cat "$d/cc.log"; }
else
	no "configure --disable-daemon or make install failed:"; tail -n 20 "$b"/configure.log "$b"/install.log 2> /dev/null
fi
[ $fail = 0 ] && echo "prefix /opt/x: every file below it, its paths in the man pages and the summary; --disable-daemon: libmrd without mrd's dependencies, a verbs client from libmrd-verbs.pc"
exit $fail
