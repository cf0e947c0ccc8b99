#!/bin/sh
# make check-rdma with what it needs: the build, and the host tools that boot the Soft-RoCE VM
# (Debian packages, installed as root when missing). The VM's kernel comes from Debian's
# archive at run time and is cached in build/tests/vm/cache (tests/vm/rdma-vm.sh).
set -eu
. "$(dirname "$0")/build.sh"

# Debian package names; docs/testing.md lists the same set.
# gcc, make, binutils (strip) and libelf1 (objtool) build siw.ko, which Debian does not ship;
# the systemd VM boots the host's own systemd, system bus, setpriv, useradd and promtool; the
# middleware cases copy rping, fi_pingpong, ucx_perftest, MPICH's Hydra and build against
# libfabric, UCX and MPICH; its container checks run the host's podman, rootful and rootless.
MRD_VM_DEPS="qemu-system-x86 busybox-static cpio kmod xz-utils iproute2 ibverbs-utils \
ibverbs-providers gcc make binutils libelf1 perftest systemd dbus util-linux passwd prometheus \
rdmacm-utils libfabric-bin libfabric-dev ucx-utils libucx-dev mpich libmpich-dev \
podman crun uidmap dbus-user-session"

have_vm_deps() {
	for tool in qemu-system-x86_64 busybox cpio depmod xz rdma ibv_devinfo gcc make strip ib_write_bw \
		systemctl busctl dbus-daemon setpriv useradd promtool rping fi_pingpong ucx_perftest \
		mpiexec.hydra podman crun newuidmap; do
		command -v "$tool" >/dev/null 2>&1 || return 1
	done
	ls /usr/lib/*/libibverbs/librxe-rdmav*.so /usr/lib/*/libelf.so.1 /lib/systemd/system/dbus.service \
		/usr/include/rdma/fabric.h /usr/include/ucp/api/ucp.h /usr/include/x86_64-linux-gnu/mpich/mpi.h \
		>/dev/null 2>&1
}

install_deps
if ! have_vm_deps; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "check-rdma: not run: the VM's host tools are missing; as root run:"
		echo "  apt-get install -y $MRD_VM_DEPS"
		exit 77
	fi
	echo "== installing the VM's host tools (apt-get)"
	apt-get update -q
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $MRD_VM_DEPS
fi
build
cd "$top/build"
make check-rdma
