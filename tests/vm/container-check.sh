# RDMA in unprivileged containers through mrd (issue 39): sourced by tests/vm/systemd-check.sh
# while mrd.service runs, whose report, result and as it uses; its results are named
# "container: ..." (rdma-vm.sh prints "PASS: vm: container: ..."). podman and crun are the
# host's (the VM runs the host's root file system); the containers' root is made here from the
# guest's own /usr (read-only) and a small /etc: no image is pulled. Each container runs as uid
# 1000 with RLIMIT_MEMLOCK 8 MiB (containerd's default) and no added capability, on the host's
# network (rdma_cm and rxe live there; ib_core.netns_mode=0), rootful (podman as root) and
# rootless (podman as alice, her own user namespace and systemd user manager).
#
# rxe1 on dummy0 (10.9.9.1): rdma_cm resolves no route over lo (README, middleware).
CTR_DEV=rxe1 CTR_ADDR=10.9.9.1
CTR_DIR=/run/mrd-ctr
CTR_CDI=/etc/cdi/mrd.yaml
CTR_PORT=19500
# Why a program fails without mrd: perftest's and rdma-core's words for a refused registration.
CTR_MEMLOCK="Couldn't allocate MR|Failed to create MR|failed to create mr|reg_mr failed|Cannot allocate memory|ENOMEM"
RESULT_PREFIX="container: "
ALICE=$(id -u alice)
MRD_GID=$(getent group mrd | cut -d: -f3)

# The rootfs of the containers of one podman (root or alice): what crun mounts over must exist,
# owned by the container's root.
ctr_rootfs() { # dir owner
	mkdir -p "$1" && cd "$1" || return 1
	mkdir -p usr etc proc sys dev tmp run/mrd opt/mrd/lib
	for d in bin lib lib64 sbin; do ln -sfn usr/$d $d; done
	printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/tmp:/bin/sh\n' > etc/passwd
	printf 'root:x:0:\napp:x:1000:\n' > etc/group
	cp -a /etc/ld.so.cache /etc/nsswitch.conf etc/
	cp -a /etc/libibverbs.d etc/ # the providers libibverbs loads
	: > etc/hosts && : > etc/hostname && : > etc/resolv.conf
	chmod 1777 tmp
	chown -R "$2" "$1"
	cd / || return 1
}

# podman as root, or as alice with her session's bus (the cgroup of each container is then a
# scope under her user@.service), under a time limit of CTR_LIMIT seconds. vfs storage: the
# VM's root is an overlay already; root's in a folder of its own, as the host's root file
# system may hold podman's state of another driver.
CTR_LIMIT=400
pod() { # rootful|rootless podman-args...
	ctr_mode=$1
	shift
	if [ "$ctr_mode" = rootful ]; then
		timeout $CTR_LIMIT podman --root $CTR_DIR/storage --runroot $CTR_DIR/runroot \
			--storage-driver vfs --log-level error "$@"
	else
		timeout $CTR_LIMIT setpriv --reuid=alice --regid=alice --init-groups env HOME=/home/alice USER=alice \
			XDG_RUNTIME_DIR=/run/user/$ALICE DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/$ALICE/bus \
			podman --storage-driver vfs --log-level error "$@"
	fi
}
# The words of one container: with mrd through the CDI device (cdi), or with the device nodes
# alone (nodes). mrd's socket is 0660 group mrd: rootful containers are given that group,
# rootless ones keep alice's groups (she is in mrd).
ctr_args() { # rootful|rootless cdi|nodes name [user] (CTR_CID=NAME: --cidfile CTR_DIR/NAME.cid)
	CTR_ARGS="run --rm --name $3 -v /usr:/usr:ro --network host --user ${4:-1000:1000}
		--ulimit memlock=8388608:8388608 --security-opt seccomp=$CTR_DIR/seccomp.json"
	if [ "$1" = rootful ]; then CTR_ARGS="$CTR_ARGS --group-add $MRD_GID"
	else CTR_ARGS="$CTR_ARGS --group-add keep-groups"; fi
	if [ "$2" = cdi ]; then
		CTR_ARGS="$CTR_ARGS --device mrd/rdma=all"
	else
		for n in /dev/infiniband/*; do CTR_ARGS="$CTR_ARGS --device $n"; done
	fi
	# Last: --rootfs takes no value, the first word after the options is the root.
	CTR_ARGS="$CTR_ARGS ${CTR_CID:+--cidfile $CTR_DIR/$CTR_CID.cid} --rootfs $CTR_DIR/root-$1"
}
ctr_port() { CTR_PORT=$((CTR_PORT + 1)); }

# mrd's CDI spec, by mrctl cdi as the brief of an operator says, and the same as the one
# mrd-cdi.service keeps in /run/cdi (which podman prefers: its folder comes later).
ctr_cdi() {
	mkdir -p /etc/cdi
	mrctl cdi --output $CTR_CDI > /tmp/ctr-cdi.out 2>&1 || return 1
	for _ in $(seq 50); do # mrd-cdi.service follows mrd's restart
		diff /run/cdi/mrd.yaml $CTR_CDI > /dev/null 2>&1 && return 0
		sleep 0.2
	done
	diff /run/cdi/mrd.yaml $CTR_CDI >> /tmp/ctr-cdi.out 2>&1
}

ctr_setup() {
	modprobe -a ib_uverbs rdma_rxe rdma_ucm dummy &&
		{ ip link show dummy0 > /dev/null 2>&1 || ip link add dummy0 type dummy; } &&
		{ ip addr show dummy0 | grep -q "$CTR_ADDR/" || ip addr add $CTR_ADDR/24 dev dummy0; } &&
		ip link set dummy0 up &&
		{ [ -e /sys/class/infiniband/$CTR_DEV ] || rdma link add $CTR_DEV type rxe netdev dummy0; }
	result "$CTR_DEV on dummy0 ($CTR_ADDR), rdma_ucm loaded" $? "$(rdma link show 2>&1; ls -l /dev/infiniband 2>&1)"
	CTR_GID=
	for g in /sys/class/infiniband/$CTR_DEV/ports/1/gids/*; do
		case "$(cat "$g" 2> /dev/null)" in 0000:0000:0000:0000:0000:ffff:*) CTR_GID=${g##*/}; break ;; esac
	done
	# mrd on verbs; each container's domain may pin 640 MiB (ib_*_bw below pins 256 MiB a side).
	mkdir -p /etc/mrd/mrd.conf.d
	printf '[mrd]\nprovider = verbs\ndevice = %s\n[limits]\npinned_bytes = 1536M\n[quota]\npinned_bytes = 640M\n' \
		$CTR_DEV > /etc/mrd/mrd.conf.d/70-containers.conf
	systemctl restart mrd && mrd_answers
	result "mrd serves $CTR_DEV for the containers" $? "$(mrctl status 2>&1 | head -n 5)"
	# Rootless podman: alice's subordinate ids, and her systemd user manager (its bus, her scopes).
	grep -q '^alice:' /etc/subuid || usermod --add-subuids 200000-265535 --add-subgids 200000-265535 alice
	systemctl start systemd-logind && loginctl enable-linger alice
	for _ in $(seq 300); do [ -S /run/user/$ALICE/bus ] && break; sleep 0.2; done
	[ -S /run/user/$ALICE/bus ]
	result "alice's user manager runs (loginctl enable-linger), for rootless podman" $? \
		"$(systemctl status --no-pager user@$ALICE.service 2>&1 | tail -n 4)"
	mkdir -p $CTR_DIR && chmod 755 $CTR_DIR
	# podman's default seccomp profile (containers-common's, as moby's and containerd's) denies
	# userfaultfd(2), without which libmrd-preload.so moves no buffer (libmrd-preload(8),
	# WRITES DURING A MOVE): the same profile with userfaultfd allowed, what an operator gives
	# the containers that use mrd. Unprivileged, the kernel lets it handle user faults only.
	python3 -c 'import json, sys
d = json.load(open("/usr/share/containers/seccomp.json"))
for s in d["syscalls"]:
	if s["action"] != "SCMP_ACT_ALLOW" and "userfaultfd" in s["names"]:
		s["names"].remove("userfaultfd")
d["syscalls"].append({"names": ["userfaultfd"], "action": "SCMP_ACT_ALLOW"})
json.dump(d, open(sys.argv[1], "w"))' $CTR_DIR/seccomp.json
	result "podman's seccomp profile with userfaultfd(2) allowed" $?
	ctr_rootfs $CTR_DIR/root-rootful root:root && ctr_rootfs $CTR_DIR/root-rootless alice:alice
	result "the containers' root file systems (the guest's /usr, read-only, and a small /etc)" $?
	ctr_cdi
	result "mrctl cdi --output $CTR_CDI: the spec mrd-cdi.service wrote in /run/cdi" $? \
		"$(cat /tmp/ctr-cdi.out) $(grep -v '^#' $CTR_CDI 2>&1 | tr '\n' ' ')"
}

# podman reads the spec: the device nodes, mrd's socket and the shim, and the environment.
ctr_spec_check() { # rootful|rootless
	ctr_args "$1" cdi ctr-spec
	out=$(pod "$1" $CTR_ARGS /bin/sh -c \
		'ls /dev/infiniband; test -S "$MRD_SOCKET" && echo socket; test -r "$LD_PRELOAD" && echo shim' 2>&1)
	rc=$?
	[ $rc = 0 ] && echo "$out" | grep -qx socket && echo "$out" | grep -qx shim &&
		echo "$out" | grep -qx rdma_cm && echo "$out" | grep -q '^uverbs'
	result "$1: podman run --device mrd/rdma=all (the CDI spec): uverbs and rdma_cm nodes, \$MRD_SOCKET, \$LD_PRELOAD" $? \
		"rc=$rc: $(echo "$out" | tail -n 6) $(grep -v '^#' /run/cdi/mrd.yaml 2>&1 | head -n 40)"
}

# A server container and a client container; the client is tried again while the server is not
# listening yet (a container's output is block-buffered: readiness is the server's TCP port,
# where it has one). Sets CTR_SRC, CTR_CRC; output in /tmp/ctr-srv.txt, /tmp/ctr-cli.txt.
ctr_pair() { # rootful|rootless cdi|nodes tcp-port|- server-words client-words
	ctr_args "$1" "$2" ctr-srv
	pod "$1" $CTR_ARGS $4 > /tmp/ctr-srv.txt 2>&1 &
	ctr_srv=$!
	for _ in $(seq 600); do
		[ "$3" != - ] && [ -n "$(ss -Hltn "sport = :$3")" ] && break
		kill -0 $ctr_srv 2> /dev/null || break
		[ "$3" = - ] && { sleep 3; break; }
		sleep 0.2
	done
	ctr_args "$1" "$2" ctr-cli
	for _ in $(seq 10); do
		pod "$1" $CTR_ARGS $5 > /tmp/ctr-cli.txt 2>&1
		CTR_CRC=$?
		[ $CTR_CRC = 0 ] || ! kill -0 $ctr_srv 2> /dev/null ||
			! grep -Eqi 'refused|reject|unreachable|connect to' /tmp/ctr-cli.txt && break
		sleep 1
	done
	for _ in $(seq 150); do kill -0 $ctr_srv 2> /dev/null || break; sleep 0.2; done
	kill -0 $ctr_srv 2> /dev/null && pod "$1" kill ctr-srv > /dev/null 2>&1
	wait $ctr_srv
	CTR_SRC=$?
}
ctr_detail() {
	echo "server rc $CTR_SRC: $(grep -h 'libmrd-preload' /tmp/ctr-srv.txt | head -n 2) $(tail -n 4 /tmp/ctr-srv.txt)" \
		"| client rc $CTR_CRC: $(grep -h 'libmrd-preload' /tmp/ctr-cli.txt | head -n 2) $(tail -n 6 /tmp/ctr-cli.txt)"
}

# ib_write_bw / ib_read_bw, 128 MiB messages: perftest registers twice that, a 256 MiB buffer
# a side, 32 times what memlock lets the container pin.
ctr_perftest() { # rootful|rootless program
	p="$2 -d $CTR_DEV -x $CTR_GID -s 134217728 -n 5 -F"
	ctr_port
	ctr_pair "$1" cdi $CTR_PORT "$p -p $CTR_PORT" "$p -p $CTR_PORT $CTR_ADDR"
	[ $CTR_CRC = 0 ] && [ $CTR_SRC = 0 ] && awk '$1 == 134217728 { ok = 1 } END { exit !ok }' /tmp/ctr-cli.txt
	result "$1: $2, 256 MiB buffers, between two containers through mrd (uid 1000, memlock 8 MiB)" $? \
		"$(ctr_detail)"
	ctr_port
	ctr_pair "$1" nodes $CTR_PORT "$p -p $CTR_PORT" "$p -p $CTR_PORT $CTR_ADDR"
	[ $CTR_SRC != 0 ] && grep -Eq "$CTR_MEMLOCK" /tmp/ctr-srv.txt
	result "$1: the same $2 containers with the device nodes alone (no mrd) fail on memlock" $? \
		"$(ctr_detail)"
}
ctr_rping() { # rootful|rootless
	ctr_port
	ctr_pair "$1" cdi - "rping -s -a $CTR_ADDR -p $CTR_PORT -S 65000 -C 20 -V" \
		"rping -c -a $CTR_ADDR -p $CTR_PORT -S 65000 -C 20 -V"
	[ $CTR_CRC = 0 ]
	result "$1: rping -V between two containers through mrd" $? "$(ctr_detail)"
}

# mrctl --json clients as the host's root: the domains "NAME PINNED" a line.
ctr_domains() { mrctl --json clients | python3 -c 'import json, sys
for d in json.load(sys.stdin).get("domains", []): print(d["name"], d.get("pinned_bytes", 0))'; }
# A container holding 4 MiB of mrd's memory (examples/mrd-restart: it waits for mrd to go and
# reconnects); its output in /tmp/NAME.txt, its podman's pid in HOLDER.
ctr_hold() { # name
	CTR_CID=$1
	ctr_args rootful cdi "$1"
	CTR_CID=
	pod rootful $CTR_ARGS /usr/lib/mrd-vm/mrd-restart /run/mrd/mrd.sock 900 \
		> /tmp/$1.txt 2>&1 &
	HOLDER=$!
	for _ in $(seq 600); do grep -q '^ready' /tmp/$1.txt && break; kill -0 $HOLDER 2> /dev/null || break; sleep 0.2; done
}
ctr_id() { cut -c 1-12 $CTR_DIR/$1.cid 2> /dev/null; }

ctr_domain_checks() {
	rm -f $CTR_DIR/*.cid
	ctr_hold ctr-a
	hold_a=$HOLDER
	ctr_hold ctr-b
	hold_b=$HOLDER
	# mrd(8) Containers: ctr-ID-uN, the user's (1000) containers.
	a=ctr-$(ctr_id ctr-a)-u1000 b=ctr-$(ctr_id ctr-b)-u1000
	doms=$(ctr_domains 2>&1)
	[ "$a" != "$b" ] && echo "$doms" | grep -qx "$a 4194304" && echo "$doms" | grep -qx "$b 4194304"
	result "two rootful containers of uid 1000: mrctl clients shows two domains ctr-ID-u1000, 4 MiB pinned each" $? \
		"want $a and $b; domains: $(echo "$doms" | tr '\n' ';') $(tail -n 2 /tmp/ctr-a.txt /tmp/ctr-b.txt)"

	# Root in a rootful container is no admin: flush refused, its view its own domain alone.
	CTR_CID=ctr-root
	ctr_args rootful cdi ctr-root 0:0
	CTR_CID=
	out=$(pod rootful $CTR_ARGS mrctl flush 2>&1)
	rc=$?
	[ $rc != 0 ] && echo "$out" | grep -Eqi 'not permitted|EPERM|needs root or the admin group'
	result "root (uid 0) in a rootful container is refused mrctl flush" $? "rc=$rc: $out"
	rm -f $CTR_DIR/ctr-root.cid
	out=$(pod rootful $CTR_ARGS mrctl --json clients 2>&1)
	rc=$?
	own=ctr-$(ctr_id ctr-root)
	seen=$(echo "$out" | python3 -c 'import json, sys
print(" ".join(d["name"] for d in json.load(sys.stdin).get("domains", [])))' 2> /dev/null)
	[ $rc = 0 ] && ! echo " $seen " | grep -q " $a \| $b " &&
		{ [ -z "$seen" ] || [ "$seen" = "$own" ]; }
	result "root in a rootful container: mrctl clients shows its own domain alone" $? \
		"rc=$rc: domains seen '$seen' (own $own, others $a $b): $(echo "$out" | cut -c 1-300)"

	# A quota the holders' 4 MiB passed before (a lower quota takes nothing back): a third
	# container's 4 MiB is refused with the message naming the quota, the holders run on.
	printf '[quota]\npinned_bytes = 2M\nallocated_bytes = 2M\n' > /etc/mrd/mrd.conf.d/71-quota.conf
	systemctl reload mrd
	ctr_args rootful cdi ctr-over
	CTR_LIMIT=120
	pod rootful $CTR_ARGS /usr/lib/mrd-vm/mrd-restart /run/mrd/mrd.sock 1 > /tmp/ctr-over.txt 2>&1
	rc=$?
	CTR_LIMIT=400
	[ $rc != 0 ] && grep -q 'quota\.allocated_bytes (2097152) would be exceeded' /tmp/ctr-over.txt &&
		kill -0 $hold_a && kill -0 $hold_b && ctr_domains | grep -qx "$a 4194304"
	result "over [quota] of 2M: a third container's 4 MiB is refused naming the quota, the holders run on" $? \
		"rc=$rc: $(tail -n 3 /tmp/ctr-over.txt) | mrd: $(journalctl -u mrd.service -o cat --no-pager | grep -v 'mrd.service' | tail -n 3)"
	rm /etc/mrd/mrd.conf.d/71-quota.conf
	systemctl reload mrd

	# A warm restart while both hold their memory: they reconnect to it (README: Warm restart).
	systemctl restart mrd
	wait $hold_a
	rc_a=$?
	wait $hold_b
	rc_b=$?
	[ $rc_a = 0 ] && [ $rc_b = 0 ] && grep -q 'with its content' /tmp/ctr-a.txt &&
		grep -q 'with its content' /tmp/ctr-b.txt
	result "systemctl restart mrd: both containers reconnect to their 4 MiB with its content" $? \
		"rc $rc_a, $rc_b: $(tail -n 3 /tmp/ctr-a.txt /tmp/ctr-b.txt)"
	mrd_answers
}

container_checks() {
	for t in podman crun newuidmap; do
		command -v $t > /dev/null || {
			report SKIP "the container checks" "no $t on the host (apt-get install podman crun uidmap dbus-user-session)"
			return
		}
	done
	ctr_setup
	for m in rootful rootless; do
		ctr_spec_check $m
		ctr_perftest $m ib_write_bw
		ctr_perftest $m ib_read_bw
		ctr_rping $m
	done
	ctr_domain_checks
	rm /etc/mrd/mrd.conf.d/70-containers.conf
	systemctl restart mrd
	mrd_answers
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# make bench: ib_write_bw, 64 KiB messages, between two containers through mrd, against the same
# program between two processes of the VM host without a container (root: it pins itself);
# reps interleaved, the ratio of the medians (target >= 0.95).
container_bench() {
	ctr_setup > /dev/null
	reps=5 n=2000
	: > /tmp/ctrb-host
	: > /tmp/ctrb-ctr
	p="ib_write_bw -d $CTR_DEV -x $CTR_GID -s 65536 -n $n -F"
	for _ in $(seq $reps); do
		ctr_port
		timeout 300 $p -p $CTR_PORT > /tmp/ctrb-srv.txt 2>&1 &
		sleep 1
		timeout 300 $p -p $CTR_PORT $CTR_ADDR > /tmp/ctrb-cli.txt 2>&1
		wait
		awk '$1 == 65536 { print $4 }' /tmp/ctrb-cli.txt >> /tmp/ctrb-host
		ctr_port
		ctr_pair rootful cdi $CTR_PORT "$p -p $CTR_PORT" "$p -p $CTR_PORT $CTR_ADDR"
		awk '$1 == 65536 { print $4 }' /tmp/ctr-cli.txt >> /tmp/ctrb-ctr
	done
	a=$(median < /tmp/ctrb-host) b=$(median < /tmp/ctrb-ctr)
	if [ -z "$a" ] || [ -z "$b" ]; then
		echo "vm-container-ib_write_bw: not measured: $(tail -n 3 /tmp/ctrb-cli.txt /tmp/ctr-cli.txt | tr '\n' ' ')"
		return
	fi
	awk -v a="$a" -v b="$b" -v r=$reps -v n=$n 'BEGIN { x = (a > 0) ? b / a : 0
		printf "vm-container-ib_write_bw: ratio %.3f (case=ib_write_bw -s 64KiB -n %d on rxe between two rootful podman containers, uid 1000, memlock 8 MiB, through mrd (CDI), %.1f MB/s; baseline=the same on the VM host without a container, as root, %.1f MB/s; reps=%d interleaved, median) target >= 0.95: %s\n",
			x, n, b, a, r, (x >= 0.95) ? "met" : "MISSED" }'
}
