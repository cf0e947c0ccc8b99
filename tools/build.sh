#!/bin/sh
# Installs mrd's build dependencies (Debian 12, as root) when any is missing, then configures
# and builds mrd out of tree in ./build. Sourced by demo.sh and check.sh; runs alone too.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/tools/build-tree.sh"

# Debian package names; README.md lists the same set. UCX is the anchor bench-ucx measures
# against: with it every build compiles bench-ucx, so make bench always prints its rows.
MRD_BUILD_DEPS="gcc g++ make autoconf automake libtool pkgconf \
libevent-dev libprotobuf-c-dev protobuf-c-compiler libibverbs-dev libsystemd-dev \
check libsubunit-dev libucx-dev"
MRD_TEST_DEPS="valgrind systemd dbus-daemon prometheus python3-prometheus-client python3-yaml man-db gdb \
podman crun uidmap dbus-user-session"

have_deps() {
	for tool in gcc g++ make autoreconf libtoolize pkg-config protoc-c; do
		command -v "$tool" >/dev/null 2>&1 || return 1
	done
	pkg-config --exists libevent_core libevent_pthreads libprotobuf-c libibverbs libsystemd check \
		ucx-ucs ||
		return 1
	[ "${1:-}" != test ] && return 0
	for tool in valgrind systemd-socket-activate systemd-analyze busctl dbus-daemon promtool \
		manpath gdb podman crun newuidmap; do
		command -v "$tool" >/dev/null 2>&1 || return 1
	done
	/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null
}

install_deps() {
	have_deps "${1:-}" && return 0
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing build dependencies; as root run:" >&2
		echo "  apt-get install -y $MRD_BUILD_DEPS $MRD_TEST_DEPS" >&2
		exit 1
	fi
	echo "== installing dependencies (apt-get)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	# shellcheck disable=SC2086
	apt-get install -y -q --no-install-recommends $MRD_BUILD_DEPS \
		$([ "${1:-}" = test ] && echo "$MRD_TEST_DEPS")
}

build() {
	cd "$top"
	if [ ! -x configure ] || [ configure.ac -nt configure ] || [ ! -f build-config.h.in ]; then
		echo "== autoreconf"
		autoreconf -fi
	fi
	enter_build_tree build
	if [ ! -f Makefile ]; then
		echo "== configure"
		"$top/configure" --enable-werror ${MRD_CONFIGURE_FLAGS:-}
	fi
	echo "== make"
	make -j"$(nproc)"
}

if [ "$(basename "$0")" = build.sh ]; then
	install_deps "${1:-}"
	build
fi
