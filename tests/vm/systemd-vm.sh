# Sourced by rdma-vm.sh (bash), after its other guests: the systemd VM. mrd is built from the
# make dist tarball (./configure --prefix=/usr, make install DESTDIR=...), and the same kernel
# boots with systemd as PID 1 on the host's own root file system (9p, read-only) under that
# install and a tmpfs (tests/vm/systemd-init.sh); mrd-vm-check.service runs
# tests/vm/systemd-check.sh there. Its results come over a second serial port, into
# $SD_RESULTS, which joins LOGS (make bench: its "@@ BENCH" lines are printed). 3 GiB: two
# containers' ib_*_bw pin 256 MiB each through mrd, beside the copies they are moved from.
# MRD_VM_SYSTEMD=0 skips it.
SD=$VM/systemd
SD_RESULTS=$VM/systemd-results.log
sd_skip() { # why: the whole VM as one skipped result
	printf '@@ RESULT\tSKIP\tsystemd: the systemd VM\t%s\n@@ ALL_DONE results=1\n' "$1" > "$SD_RESULTS"
}
sd_fail() { # what log
	printf '@@ RESULT\tFAIL\tsystemd: %s\t%s\n@@ ALL_DONE results=1\n' "$1" \
		"$(tail -n 5 "$2" | tr '\t\n' '  ')" > "$SD_RESULTS"
	tail -n 30 "$2"
}
# mrd as a user installs it, from the tarball, plus the VM's own programs and checks.
sd_install() {
	local tarball src
	rm -rf "$SD" && mkdir -p "$SD/src" "$SD/root" "$SD/initramfs"
	(cd "$top_builddir" && rm -f mrd-*.tar.gz && make dist-gzip > "$SD/dist.log" 2>&1) ||
		{ sd_fail "make dist" "$SD/dist.log"; return 1; }
	tarball=$(ls "$top_builddir"/mrd-*.tar.gz)
	tar -xzf "$tarball" -C "$SD/src" && rm -f "$tarball"
	src=$(ls -d "$SD"/src/mrd-*)
	(cd "$src" && ./configure --prefix=/usr --disable-dependency-tracking > "$SD/build.log" 2>&1 &&
		make -j"$(nproc)" >> "$SD/build.log" 2>&1 &&
		make install DESTDIR="$SD/root" >> "$SD/build.log" 2>&1) ||
		{ sd_fail "./configure --prefix=/usr && make && make install (from the tarball)" "$SD/build.log"; return 1; }
	mkdir -p "$SD/root/usr/lib/mrd-vm" "$SD/root/etc/systemd/system"
	cp "$src/examples/.libs/mrd-hello" "$src/examples/.libs/mrd-restart" "$SD/root/usr/lib/mrd-vm/"
	cp "$top_srcdir/tests/vm/systemd-check.sh" "$SD/root/usr/lib/mrd-vm/check.sh"
	cp "$top_srcdir/tests/vm/container-check.sh" "$SD/root/usr/lib/mrd-vm/"
	# README's "Running" block, as a user would type it.
	sed -n '/^## Running/,/^## /p' "$top_srcdir/README.md" | sed -n '/^```sh$/,/^```$/p' |
		sed '1d;$d' > "$SD/root/usr/lib/mrd-vm/readme-running"
	cat > "$SD/root/etc/systemd/system/mrd-vm.target" <<-EOF
	[Unit]
	Description=mrd's systemd VM checks
	Requires=basic.target
	Wants=mrd-vm-check.service
	After=basic.target
	EOF
	cat > "$SD/root/etc/systemd/system/mrd-vm-check.service" <<-EOF
	[Unit]
	Description=mrd's systemd VM checks (tests/vm/systemd-check.sh)
	After=basic.target dbus.socket systemd-journald.socket
	[Service]
	Type=oneshot
	ExecStart=/bin/sh /usr/lib/mrd-vm/check.sh
	StandardOutput=journal
	EOF
	# The host's timers would run their jobs (man-db, apt) in the middle of the checks.
	for t in /etc/systemd/system/timers.target.wants/*.timer; do
		[ -e "$t" ] && ln -sf /dev/null "$SD/root/etc/systemd/system/$(basename "$t")"
	done
	# rdma_rxe and ib_uverbs (no dependency of rdma_rxe's) for modprobe inside (merged /usr:
	# /lib is the host's usr/lib link, kept); dummy: the netdev of a second rxe device (and of
	# the containers' rxe1); rdma_ucm: the containers' rdma_cm.
	ln -s usr/lib "$SD/root/lib"
	mkdir -p "$SD/root/usr/lib/modules/$KVER/kernel" && : > "$SD/rxe.load"
	stage_modules "$SD/root/usr/lib/modules/$KVER/kernel" "$SD/rxe.load" rdma_rxe ib_uverbs dummy rdma_ucm
	cp "$KROOT/usr/lib/modules/$KVER/modules.builtin"* "$KROOT/usr/lib/modules/$KVER/modules.order" \
		"$SD/root/usr/lib/modules/$KVER/" 2> /dev/null || true
	depmod -b "$SD/root" "$KVER"
	# The initramfs: busybox, 9p and overlayfs, /init.
	mkdir -p "$SD/initramfs"/{bin,proc,sys,dev,modules}
	cp /bin/busybox "$SD/initramfs/bin/"
	for a in sh mount umount mkdir mknod cat insmod switch_root poweroff printf; do
		ln -s busybox "$SD/initramfs/bin/$a"
	done
	: > "$SD/initramfs/modules.load"
	stage_modules "$SD/initramfs/modules" "$SD/initramfs/modules.load" 9pnet_virtio 9p overlay
	cp "$top_srcdir/tests/vm/systemd-init.sh" "$SD/initramfs/init"
	chmod +x "$SD/initramfs/init"
	(cd "$SD/initramfs" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$SD/initramfs.cpio.gz"
}
boot_systemd() {
	local t0 missing=
	for tool in /lib/systemd/systemd systemctl busctl dbus-daemon setpriv useradd promtool; do
		command -v "$tool" > /dev/null || missing="$missing $tool"
	done
	[ -e /lib/systemd/system/dbus.service ] || missing="$missing dbus.service"
	[ -z "$missing" ] || { sd_skip "the host lacks$missing (Debian: systemd dbus util-linux passwd prometheus)"; return; }
	t0=$(date +%s)
	sd_install || return 0
	echo "check-rdma: the systemd VM's mrd built from the tarball in $(($(date +%s) - t0)) s"
	for attempt in 1 2 3; do
		t0=$(date +%s)
		: > "$SD_RESULTS"
		set +e
		timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 \
			-accel tcg,thread=multi -cpu max -smp 2 -m 3072 -display none -monitor none \
			-no-reboot -nic none \
			-virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
			-virtfs local,path="$SD/root",mount_tag=mrd,security_model=none,readonly=on,multidevs=remap \
			-serial "file:$VM/console-systemd.log" -serial "file:$SD_RESULTS" \
			-kernel "$KROOT/usr/lib/modules/$KVER/vmlinuz" -initrd "$SD/initramfs.cpio.gz" \
			-append "console=ttyS0 panic=-1 loglevel=3 ib_core.netns_mode=0 systemd.unit=mrd-vm.target systemd.show_status=0 systemd.firstboot=0 mrd_vm=$MODE" \
			< /dev/null > "$VM/qemu-systemd.log" 2>&1
		set -e
		echo "check-rdma: the systemd VM ran $(($(date +%s) - t0)) s (console: $VM/console-systemd.log)"
		grep -q '^@@ ' "$SD_RESULTS" || ! grep -q 'Kernel panic' "$VM/console-systemd.log" && break
		echo "check-rdma: the systemd guest panicked while booting (attempt $attempt): again"
	done
	score=$(tr -d '\r' < "$SD_RESULTS" | sed -n 's/^@@ SCORE //p')
	[ -z "$score" ] || echo "check-rdma: systemd-analyze security mrd.service in the VM: $score"
}
