#!/bin/sh
# /init of the systemd VM (tests/vm/systemd-vm.sh): the host's root file system (9p, read-only)
# under mrd as make install put it (9p, read-only), under a tmpfs for writes, becomes the root;
# then systemd runs as PID 1. Results go to the second serial port (/dev/ttyS1).
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() {
	printf '@@ RESULT\tFAIL\tsystemd: the root file system is assembled\t%s\n' "$1" > /dev/ttyS1
	echo "@@ ALL_DONE results=1" > /dev/ttyS1
	poweroff -f
}
for m in $(cat /modules.load); do
	insmod "/modules/$m" || fail "insmod $m"
done
mkdir -p /host /mrd /rw /newroot
opts=trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000
mount -t 9p -o $opts host /host || fail "mount the host's root (9p)"
mount -t 9p -o $opts mrd /mrd || fail "mount the installed tree (9p)"
mount -t tmpfs -o mode=0755 tmpfs /rw && mkdir /rw/upper /rw/work
# The host may be a container: a whiteout hides its marker, or systemd would think it is one.
mknod /rw/upper/.dockerenv c 0 0
mount -t overlay -o lowerdir=/mrd:/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
	fail "overlay"
mount --move /dev /newroot/dev
umount /proc /sys
exec switch_root /newroot /lib/systemd/systemd systemd.unit=mrd-vm.target systemd.show_status=0
