#!/bin/sh
# /init of the rdma test VM (tests/vm/rdma-vm.sh builds it): brings up Soft-RoCE on lo, runs
# mrd on it with the verbs provider and drives it with real clients; then the same, shorter,
# on Soft-iWARP. Every check prints one
# line "@@ RESULT<TAB>PASS|FAIL|SKIP<TAB>name<TAB>detail"; "@@ ALL_DONE results=N" ends the
# run, so the host knows that none was lost. Waits for what must happen poll 20 s and more
# (200 x 0.1 s): the VM runs on a host that may be busy.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin:/opt/mrd/bin LD_LIBRARY_PATH=/opt/mrd/lib
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp /run
: > /tmp/results
echo "@@ INIT kernel $(uname -r)"

TAB=$(printf '\t')
report() { # verdict name [detail]
	printf '@@ RESULT\t%s\t%s\t%s\n' "$1" "$2" "$(printf '%s' "${3:-}" | tr '\t\n' '  ')" |
		tee -a /tmp/results
}
result() { # name rc [detail]
	if [ "$2" = 0 ]; then report PASS "$1"; else report FAIL "$1" "${3:-rc=$2}"; fi
}
# A program's own result lines (rdma-peers): shown, and counted.
collect() {
	cat "$1"
	grep "^@@ RESULT$TAB" "$1" >> /tmp/results
}
finish() {
	echo "@@ ALL_DONE results=$(wc -l < /tmp/results)"
	sync
	poweroff -f
}
# Domain uid-1000's figures now, into $a (allocated), $m (MRs), $p (pinned): "" when it is
# not open; $CLIENTS keeps mrctl's JSON.
read_victims_domain() {
	CLIENTS=$(mrctl --json clients)
	a=$(domain_field "$CLIENTS" uid-1000 allocated_bytes)
	m=$(domain_field "$CLIENTS" uid-1000 mrs)
	p=$(domain_field "$CLIENTS" uid-1000 pinned_bytes)
}
# Starts mrd on socket with the arguments (its pid in SERVED), waits for the socket, and
# reports whether it serves as result name; its status is that result's.
serve_mrd() { # name log socket mrd-args...
	name=$1 log=$2 sock=$3
	shift 3
	mrd --foreground --no-bus "$@" --socket "$sock" > "$log" 2>&1 &
	SERVED=$!
	for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.1; done
	[ -S "$sock" ]
	rc=$?
	result "$name" $rc "$(tail -n 5 "$log")"
	return $rc
}
# The most mrd pinned for uid 1000 while the processes run, into $MAXP.
watch_pins() { # pid...
	MAXP=0
	while kill -0 "$@" 2> /dev/null; do
		read_victims_domain
		[ "${p:-0}" -gt "$MAXP" ] && MAXP=$p
		sleep 0.2
	done
}
# Starts a client in the background (its pid in BG) and waits until its output has MARKER.
start_bg() { # file marker command...
	out=$1 marker=$2
	shift 2
	"$@" > "$out" 2>&1 &
	BG=$!
	for _ in $(seq 200); do grep -q "$marker" "$out" && break; sleep 0.1; done
}
# The first number after "KEY": in mrctl's JSON for domain DOMAIN ("" when it is not there).
domain_field() { # json domain key
	echo "$1" | grep -o "{\"name\":\"$2\"[^]]*" | head -n 1 | grep -o "\"$3\":[0-9]*" |
		head -n 1 | cut -d: -f2
}

for m in $(cat /modules.load); do
	insmod "/lib/modules/$(uname -r)/$m" 2>&1 | grep -v 'File exists'
done
ip link set lo up

# Two hosts (rdma-vm.sh boots two of these, mrd_vm=pair mrd_role=a|b, linked by a qemu socket
# netdev; their addresses live on that link alone): rxe0 on eth0, each host its own mrd; the
# same unmodified programs, uid 1000 with RLIMIT_MEMLOCK 64 KiB, between the hosts, first
# without the shim, then through it; preload-check's data and freed-rkey checks across.
if grep -q 'mrd_vm=pair' /proc/cmdline; then
	ROLE=$(sed -n 's/.*mrd_role=\([ab]\).*/\1/p' /proc/cmdline)
	if [ "$ROLE" = a ]; then ME=10.99.0.1 PEER=10.99.0.2; else ME=10.99.0.2 PEER=10.99.0.1; fi
	ip link set eth0 up && ip addr add $ME/24 dev eth0 && rdma link add rxe0 type rxe netdev eth0
	result "host $ROLE: rxe0 on eth0 ($ME)" $?
	# The peer's MAC is fixed (rdma-vm.sh): no ARP to time out while a burst fills the link.
	if [ "$ROLE" = a ]; then PEER_MAC=52:54:00:12:34:0b; else PEER_MAC=52:54:00:12:34:0a; fi
	arp -i eth0 -s $PEER $PEER_MAC
	# What the link and the kernel say, for the detail of a FAIL.
	link_state() {
		echo "eth0 $(cat /sys/class/net/eth0/operstate); /proc/net/dev: $(grep eth0: /proc/net/dev | tr -s ' ');" \
			"neighbours: $(arp -an | tr '\n' ' ')"
		echo "kernel: $(dmesg | grep -E 'NETDEV WATCHDOG|virtio|rxe|BUG|Oops|WARNING|Call Trace|lockup|hung|Out of memory' |
			grep -v 'rxe_reg_user_mr: returned err = -12' | tail -n 8 | tr '\n' ' ')" # -12: memlock
	}
	# After each case: does the peer still answer? A link that died (CI saw one die during
	# ib_read_bw, stop 47) fails once, with what the link and kernel said, and the cases after
	# it report SKIP at once instead of each waiting out its timeout.
	LINK_DEAD=
	peer_answers() { # the case just run
		[ -z "$LINK_DEAD" ] || return 1
		for _ in $(seq 30); do ping -c 1 -W 1 $PEER > /dev/null 2>&1 && return 0; done
		LINK_DEAD=$1
		result "host $ROLE: the peer still answers on the link after $1" 1 "$(link_state)"
		return 1
	}
	link_dead_skip() { # name
		report SKIP "$1" "not run: the link to the peer died after $LINK_DEAD (its FAIL says how)"
	}
	sleep 1
	GIDX=
	for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
		case "$(cat "$g" 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*) GIDX=${g##*/}; break ;; esac
	done
	SOCK=/run/mrd.sock SHIM=/opt/mrd/lib/libmrd-preload.so AS="preload-check as 1000 65536"
	printf '[mrd]\nsocket_mode = 0666\n[memory]\nhugepages = no\n' > /tmp/mrd.conf
	serve_mrd "host $ROLE: mrd on rxe0 serves its socket" /tmp/mrd.log "$SOCK" \
		--provider verbs --device rxe0 --config /tmp/mrd.conf
	MRD=$SERVED
	export MRD_SOCKET=$SOCK
	up=1
	for _ in $(seq 120); do ping -c 1 -W 1 $PEER > /dev/null 2>&1 && { up=0; break; }; done
	result "host $ROLE: the peer host answers on the link" $up
	# Host a serves, host b connects (again while the server is not up yet); each test has a
	# port of its own, so a client never reaches the previous test's server.
	n=0
	across() { # name shim program args...
		name=$1 shim=$2
		shift 2
		if [ -n "$LINK_DEAD" ]; then
			link_dead_skip "host $ROLE: $name across hosts ($([ "$shim" = 1 ] && echo through || echo without) the shim)"
			return
		fi
		n=$((n + 1))
		port=$((18600 + n))
		pre=
		[ "$shim" = 1 ] && pre="env LD_PRELOAD=$SHIM"
		if [ "$ROLE" = a ]; then
			{ $pre timeout 150 $AS "$@" -p $port > /tmp/o.txt 2>&1; echo $? > /tmp/rc; } &
		else # tries until host a's server is up, 150 s in all, as long as host a's run lasts
			end=$(($(date +%s) + 150))
			while left=$((end - $(date +%s))); [ $left -gt 0 ]; do
				$pre timeout $left $AS "$@" -p $port $PEER > /tmp/o.txt 2>&1
				rc=$?
				echo $rc > /tmp/rc
				[ $rc = 0 ] && break
				grep -qiE "connect|refused|exchange" /tmp/o.txt || break
				sleep 1
			done &
		fi
		job=$!
		watch_pins $job
		wait $job
		rc=$(cat /tmp/rc)
		tail -n 3 /tmp/o.txt
		if [ "$shim" = 0 ]; then
			[ "$rc" != 0 ] && grep -qiE "couldn.t|cannot allocate|failed" /tmp/o.txt
			result "host $ROLE: $name across hosts without the shim fails (memlock 64 KiB)" $? "rc $rc: $(tail -n 2 /tmp/o.txt)"
		else
			[ "$rc" = 0 ] && [ "$MAXP" -ge $((1 << 20)) ]
			result "host $ROLE: $name across hosts through the shim (mrd pinned up to $MAXP bytes for uid 1000)" $? "rc $rc: $(tail -n 3 /tmp/o.txt)"
		fi
		peer_answers "$name"
	}
	for shim in 0 1; do
		across "ibv_rc_pingpong (1 MiB)" $shim ibv_rc_pingpong -d rxe0 -g "$GIDX" -s 1048576 -n 20
		across "ib_write_bw (1 MiB)" $shim ib_write_bw -d rxe0 -x "$GIDX" -s 1048576 -n 50 -F
		across "ib_read_bw (1 MiB)" $shim ib_read_bw -d rxe0 -x "$GIDX" -s 1048576 -n 50 -F
	done
	if [ -n "$LINK_DEAD" ]; then
		link_dead_skip "host $ROLE: preload-check across hosts"
	else
		if [ "$ROLE" = a ]; then
			LD_PRELOAD=$SHIM timeout 150 $AS preload-check serve 18700 "$GIDX" > /tmp/pc.txt 2>&1
		else
			LD_PRELOAD=$SHIM timeout 150 $AS preload-check ask $PEER 18700 "$GIDX" > /tmp/pc.txt 2>&1
		fi
		rc=$?
		sed -i "s/\tpreload: /\thost $ROLE: preload: /" /tmp/pc.txt
		collect /tmp/pc.txt
		result "host $ROLE: preload-check across hosts exits 0" $rc "$(tail -n 3 /tmp/pc.txt)"
		peer_answers "preload-check"
	fi
	# Memory windows across the hosts: host a's program grants them on its own QP (client
	# PD), host b's writes and reads through them.
	if [ -n "$LINK_DEAD" ]; then
		link_dead_skip "host $ROLE: memory windows across hosts"
	else
		if [ "$ROLE" = a ]; then
			timeout 240 rdma-peers windows-serve "$SOCK" "$GIDX" 18750 > /tmp/win.txt 2>&1
		else
			timeout 240 rdma-peers windows-ask "$SOCK" "$GIDX" $PEER 18750 > /tmp/win.txt 2>&1
		fi
		rc=$?
		sed -i "s/^@@ RESULT\t\([A-Z]*\)\t/@@ RESULT\t\1\thost $ROLE: /" /tmp/win.txt
		collect /tmp/win.txt
		result "host $ROLE: memory windows across hosts exit cleanly" $rc "$(tail -n 3 /tmp/win.txt)"
		peer_answers "memory windows"
	fi
	. /opt/mrd/middleware-check.sh # MPI, rping, fi_pingpong and ucx_perftest across the hosts
	if [ -n "$LINK_DEAD" ]; then
		link_dead_skip "host $ROLE: middleware across hosts (MPICH, rping, fi_pingpong, ucx_perftest)"
	else
		middleware_pair "$ROLE" "$PEER"
		peer_answers "the middleware cases"
	fi
	echo "@@ LINK host $ROLE at the end: $(link_state | tr '\n' ' ')"
	kill "$MRD"
	wait "$MRD"
	result "host $ROLE: mrd exits cleanly on SIGTERM" $? "$(tail -n 5 /tmp/mrd.log)"
	finish
fi
rdma link add rxe0 type rxe netdev lo
result "rdma link add rxe0 type rxe netdev lo" $?
if ! [ -e /sys/class/infiniband/rxe0/ports/1 ]; then
	result "rxe0 is there" 1 "$(dmesg | tail -n 5)"
	finish
fi

# The RoCEv2 GID of 127.0.0.1 (or ::1): QPs on lo address each other by it.
GIDX=
for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
	case "$(cat "$g" 2>/dev/null)" in
	0000:0000:0000:0000:0000:ffff:*|0000:0000:0000:0000:0000:0000:0000:0001) GIDX=${g##*/}; break ;;
	esac
done
ibv_devinfo -v > /tmp/devinfo.txt 2>&1
DEV_ODP=false
grep -q ODP_SUPPORT /tmp/devinfo.txt && DEV_ODP=true
echo "@@ INFO GID index $GIDX; device ODP $DEV_ODP"

# make bench (rdma-vm.sh --bench): the VM benchmarks alone, as root (the baseline pins itself).
# make bench's rows for libmrd-preload.so (PERF.md): each figure the median of interleaved
# reps, with the shim against the same program without it, as root (the baseline pins itself).
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
bench_preload() { # socket
	export MRD_SOCKET=$1
	shim=/opt/mrd/lib/libmrd-preload.so reps=5
	for size in 4096 65536 1048576; do
		: > /tmp/without; : > /tmp/with
		for _ in $(seq $reps); do
			preload-check regloop 200 $size | awk '{ print $3 }' >> /tmp/without
			LD_PRELOAD=$shim MRD_PRELOAD_LOG=0 preload-check regloop 200 $size | awk '{ print $3 }' >> /tmp/with
		done
		: > /tmp/with-dereg; : > /tmp/with-off
		for _ in $(seq $reps); do
			LD_PRELOAD=$shim MRD_PRELOAD_LOG=0 MRD_PRELOAD_WINDOWS=dereg preload-check regloop 200 $size |
				awk '{ print $3 }' >> /tmp/with-dereg
			LD_PRELOAD=$shim MRD_PRELOAD_LOG=0 MRD_PRELOAD_WINDOWS=off preload-check regloop 200 $size |
				awk '{ print $3 }' >> /tmp/with-off
		done
		a=$(median < /tmp/without) b=$(median < /tmp/with) c=$(median < /tmp/with-dereg)
		f=$(median < /tmp/with-off)
		awk -v a="$a" -v b="$b" -v s=$size -v r=$reps 'BEGIN { x = a / b;
			printf "preload-reregister-%dKiB: speedup=%.1f (case=ibv_reg_mr+ibv_dereg_mr of one buffer in a loop under libmrd-preload.so, rkeys type-1 windows kept bound while the registration is kept (the default), %.1f us each; baseline=the same without it, %.1f us; reps=%d, median) target >= 10: %s\n",
			s / 1024, x, b / 1e3, a / 1e3, r, (x >= 10) ? "met" : "MISSED" }'
		awk -v a="$a" -v f="$f" -v s=$size -v r=$reps 'BEGIN { x = a / f;
			printf "preload-reregister-mr-rkeys-%dKiB: speedup=%.1f (case=the same with MRD_PRELOAD_WINDOWS=off: the MRs own rkeys, no window, %.1f us each; baseline=without the shim, %.1f us; reps=%d, median) target >= 10: %s\n",
			s / 1024, x, f / 1e3, a / 1e3, r, (x >= 10) ? "met" : "MISSED" }'
		awk -v a="$a" -v c="$c" -v s=$size -v r=$reps 'BEGIN { x = a / c;
			printf "preload-reregister-windows-till-dereg-%dKiB: speedup=%.1f (case=the same with MRD_PRELOAD_WINDOWS=dereg: a window bound and unbound each time, two work requests and their completions, %.1f us each; baseline=without the shim, %.1f us; reps=%d, median)\n",
			s / 1024, x, c / 1e3, a / 1e3, r }'
	done
	if ! command -v ib_write_bw > /dev/null; then
		echo "preload-ib_write_bw: not measured: no perftest in the VM (apt-get install perftest on the host)"
		return
	fi
	for size in 65536 1048576; do
		: > /tmp/without; : > /tmp/with
		for i in $(seq $reps); do
			for mode in without with; do
				pre=
				[ $mode = with ] && pre="env LD_PRELOAD=$shim MRD_PRELOAD_LOG=0"
				port=$((18800 + i * 2 + ${#mode}))
				$pre ib_write_bw -d rxe0 -x "$GIDX" -s $size -D 2 -F -p $port > /tmp/bw-srv.txt 2>&1 &
				sleep 1
				$pre ib_write_bw -d rxe0 -x "$GIDX" -s $size -D 2 -F -p $port 127.0.0.1 > /tmp/bw.txt 2>&1
				wait
				awk -v s=$size '$1 == s { print $4 }' /tmp/bw.txt >> /tmp/$mode
			done
		done
		a=$(median < /tmp/without) b=$(median < /tmp/with)
		awk -v a="$a" -v b="$b" -v s=$size -v r=$reps 'BEGIN { x = (a > 0) ? b / a : 0;
			printf "preload-ib_write_bw-%dKiB: ratio=%.3f (case=ib_write_bw -D 2 on rxe over lo under libmrd-preload.so, %.1f MB/s; baseline=the same without it, %.1f MB/s; reps=%d interleaved, median) target >= 0.95: %s\n",
			s / 1024, x, b, a, r, (x >= 0.95) ? "met" : "MISSED" }'
	done
}
if grep -q 'mrd_vm=bench' /proc/cmdline; then
	printf '[mrd]\nsocket_mode = 0666\n[memory]\nhugepages = no\n' > /tmp/mrd.conf
	mrd --foreground --no-bus --provider verbs --device rxe0 --config /tmp/mrd.conf \
		--socket /run/mrd.sock > /tmp/mrd.log 2>&1 &
	for _ in $(seq 200); do [ -S /run/mrd.sock ] && break; sleep 0.1; done
	bench-client-pd /run/mrd.sock rxe0 2>&1 | sed 's/^/@@ BENCH /'
	bench-windows-verbs /run/mrd.sock rxe0 "$GIDX" 2>&1 | sed 's/^/@@ BENCH /'
	bench_preload /run/mrd.sock 2>&1 | sed 's/^/@@ BENCH /'
	. /opt/mrd/middleware-check.sh
	middleware_bench 2>&1 | sed 's/^/@@ BENCH /'
	sync
	poweroff -f
fi

# The provider contract, on the device itself: each case one result; a failed fixture
# (S: setup or teardown, which checks that nothing leaked) fails its case.
contract() { # device [program label]
	prog=${2:-test-contract-verbs}
	label=${3:-provider contract}
	MRD_CONTRACT_DEVICE=$1 CK_VERBOSITY=verbose CK_FORK=yes $prog > /tmp/contract.txt 2>&1
	rc=$?
	if [ $rc = 0 ]; then grep '^note:' /tmp/contract.txt; else cat /tmp/contract.txt; fi
	sed -n 's/^[^:]*:[0-9]*:\([PFES]\):[^:]*:\([^:]*\):[^:]*: *\(.*\)$/\1 \2 \3/p' \
		/tmp/contract.txt > /tmp/cases
	while read -r v name detail; do
		if [ "$v" = P ]; then result "$label, verbs on $1: $name" 0
		else result "$label, verbs on $1: $name" 1 "$detail"; fi
	done < /tmp/cases
	sed -n 's/^not run: \(.*\) (\(.*\))$/\1|\2/p' /tmp/contract.txt > /tmp/notrun
	while IFS='|' read -r name why; do
		report SKIP "$label, verbs on $1: $name" "$why"
	done < /tmp/notrun
	result "$label on $1 exits 0" $rc
}
# What mrd's rereg probe found on a device (pools need a move that gives new keys): shown.
rereg_probe_info() { # device log
	line=$(grep -m 1 'rereg probe' "$2")
	echo "@@ INFO rereg probe on $1: ${line:-no line with \"rereg probe\" in mrd's log}"
}

# 1. The provider contract on rxe0.
contract rxe0
# 1b. Memory windows through mrd on rxe0 (tests/test-windows.c, its own mrd per case): a window
# reaches its bytes from another process too, a revoked or freed one is refused, 10^4 grants and
# revokes; siw0's refusal is in 10.
export MRD_BUILDDIR=/opt/mrd/bin
contract rxe0 test-windows "windows through mrd"
unset MRD_BUILDDIR

# 2. mrd on the device. Domain uid-1001 registers on demand (ODP children).
SOCK=/run/mrd.sock
# Clients run as uids 1000 and 1001, in no group mrd: a socket anyone may use.
printf '[mrd]\nsocket_mode = 0666\n[memory]\nhugepages = no\n[policies]\nuid-1001 = odp\n' > /tmp/mrd.conf
serve_mrd "mrd --provider verbs --device rxe0 serves its socket" /tmp/mrd.log "$SOCK" \
	--provider verbs --device rxe0 --config /tmp/mrd.conf || finish
MRD=$SERVED
export MRD_SOCKET=$SOCK
STATUS=$(mrctl --json status)
echo "$STATUS"
echo "$STATUS" | grep -q '"provider":"verbs","device":"rxe0"'
result "mrctl status: provider verbs, device rxe0" $?
echo "$STATUS" | grep -q "\"odp\":$DEV_ODP"
result "mrd reports ODP as the kernel's rxe does ($DEV_ODP)" $?
echo "$STATUS" | grep -q '"dma":true'
result "mrd offers DMA through keys on the device" $?
rereg_probe_info rxe0 /tmp/mrd.log
# Root here, mrd had CAP_NET_RAW (bit 13) and CAP_SYS_RAWIO (17): it drops both before it opens
# the device, whose context would pass their rights to importers (mrd(8), PRIVILEGES).
raw=
for set in CapInh CapPrm CapEff CapBnd CapAmb; do
	v=$(sed -n "s/^$set:[[:space:]]*//p" "/proc/$MRD/status")
	[ -n "$v" ] && [ $((0x$v & 0x22000)) = 0 ] || raw="$raw $set=${v:-none}"
done
[ -z "$raw" ]
result "mrd holds neither CAP_NET_RAW nor CAP_SYS_RAWIO" $? "$raw"

# 3. The example clients.
timeout 60 mrd-hello "$SOCK" > /tmp/hello.txt 2>&1
result "mrd-hello" $? "$(tail -n 3 /tmp/hello.txt)"
timeout 120 mrd-demo "$SOCK" > /tmp/demo.txt 2>&1
rc=$?
cat /tmp/demo.txt
result "mrd-demo: two processes, keys from the lookup cache, RDMA by the device" $rc
grep -q '^sender: the same DMA after free: Key was rejected' /tmp/demo.txt
result "mrd-demo: the device refuses the freed buffer's key" $?

# 4. A client killed mid-request while the pair works. A second client of its domain keeps
# the domain open, so its figures must come back to what that one holds alone.
start_bg /tmp/holder.txt HOLDING rdma-peers hold "$SOCK" 1000
HOLDER=$BG
collect /tmp/holder.txt
read_victims_domain
a0=$a m0=$m p0=$p
start_bg /tmp/victim.txt VICTIM_READY rdma-peers victim "$SOCK" 1000
VICTIM=$BG
cat /tmp/victim.txt
read_victims_domain
echo "@@ INFO domain uid-1000: the holder alone: allocated ${a0:-none}, MRs ${m0:-none}, pinned ${p0:-none}; with the victim: allocated ${a:-none}, MRs ${m:-none}"
[ -n "$a0" ] && [ -n "$m0" ] && [ -n "$p0" ] && [ "${a:-0}" -ge $((a0 + (8 << 20))) ] &&
	[ "${m:-0}" -ge $((m0 + 4)) ]
result "the victim holds 8 MiB of mrd memory and its MRs, beside a holder" $?

# 5. Two clients of one domain: RDMA between their buffers, mempool source, refetch.
timeout 240 rdma-peers pair "$SOCK" "$GIDX" "$VICTIM" > /tmp/pair.txt 2>&1
rc=$?
collect /tmp/pair.txt
result "rdma-peers pair exits cleanly" $rc
wait "$VICTIM" 2>/dev/null

# 6. What the killed client held is released (its domain still open), and mrd still serves.
same=1
for _ in $(seq 200); do
	read_victims_domain
	if [ -n "$a" ] && [ "$a" = "$a0" ] && [ "$m" = "$m0" ] && [ "$p" = "$p0" ] &&
		! echo "$CLIENTS" | grep -q "\"pid\":$VICTIM,"; then
		same=0
		break
	fi
	sleep 0.1
done
echo "$CLIENTS"
result "mrd released the killed client's memory, MRs and pins (domain uid-1000: allocated ${a:-gone}, MRs ${m:-gone}, pinned ${p:-gone}; the holder's: $a0, $m0, $p0)" $same
kill "$HOLDER"
wait "$HOLDER" 2>/dev/null
mrd-hello "$SOCK" > /dev/null 2>&1
result "mrd serves a new client after the kill" $?

# 7. ODP: on a kernel whose rxe has it, a domain with policy odp gets on-demand children.
# Registration and counts only: rxe's ODP copy ignores the offset inside a page.
if [ "$DEV_ODP" = true ]; then
	start_bg /tmp/hold.txt HOLDING rdma-peers hold "$SOCK" 1001
	HOLD=$BG
	collect /tmp/hold.txt
	STATS=$(mrctl --json stats)
	echo "$STATS"
	c=$(domain_field "$STATS" uid-1001 odp_children_created)
	[ "${c:-0}" -ge 1 ]
	result "mrd creates on-demand children for policy odp (created: ${c:-none})" $?
	kill "$HOLD"
	wait "$HOLD" 2>/dev/null
else
	report SKIP "mrd creates on-demand children for policy odp" "this kernel's rxe reports no ODP"
fi

# 8. rxe0 removed while mrd serves: its removal waits until every context on it is closed.
# Linux 6.12's rxe cannot disassociate one and sends no event (mrd finds its uverbs node gone:
# "removed"); a kernel that disassociates sends DEVICE_FATAL. Either way mrd lets go of the
# device and keeps serving, then serves again once the device is back.
start_bg /tmp/keep.txt HOLDING rdma-peers hold "$SOCK" 1000
KEEP=$BG
collect /tmp/keep.txt
t0=$(date +%s)
timeout 10 rdma link delete rxe0
rc=$?
echo "@@ INFO rdma link delete rxe0 took $(($(date +%s) - t0)) s; mrd: $(grep 'device rxe0' /tmp/mrd.log | tail -n 2)"
result "rdma link delete rxe0 returns within 10 s while mrd serves" $rc "$(tail -n 3 /tmp/mrd.log)"
STATUS=$(mrctl --json status)
echo "$STATUS"
echo "$STATUS" | grep -Eq '"device_state":"failed","device_failed_since":[0-9]+,"device_failure":"(removed|DEVICE_FATAL)"'
result "mrctl status: device rxe0 failed, mrd still answers" $?
timeout 60 mrd-hello "$SOCK" > /tmp/hello-gone.txt 2>&1
rc=$?
cat /tmp/hello-gone.txt
[ "$rc" != 0 ] && grep -Eq 'device rxe0 failed \((removed|DEVICE_FATAL)\); mrd reopens it when it returns' /tmp/hello-gone.txt
result "a registration while rxe0 is gone fails with a clear error" $? "rc=$rc"
rdma link add rxe0 type rxe netdev lo
result "rdma link add rxe0 again" $?
back=1
for _ in $(seq 200); do
	mrctl --json status | grep -q '"device_state":"ok"' && { back=0; break; }
	sleep 0.1
done
result "mrd reopens rxe0 once it is back" $back "$(tail -n 3 /tmp/mrd.log)"
timeout 60 mrd-hello "$SOCK" > /tmp/hello-back.txt 2>&1
result "mrd-hello once rxe0 is back" $? "$(tail -n 3 /tmp/hello-back.txt)"
kill "$KEEP"
wait "$KEEP" 2>/dev/null

# 9. mrd stops cleanly.
kill "$MRD"
wait "$MRD"
result "mrd exits cleanly on SIGTERM" $? "$(tail -n 5 /tmp/mrd.log)"

# 10. Soft-iWARP (siw.ko, built by rdma-vm.sh: Debian ships none) on lo: the provider contract
# and mrd on it. An iWARP RC QP connects only through rdma_cm, so mrd offers no DMA there.
if [ -e /siw.skip ]; then
	report SKIP "rdma link add siw0 type siw netdev lo" "no siw.ko: $(cat /siw.skip)"
else
	rdma link add siw0 type siw netdev lo > /tmp/siw-link.txt 2>&1
	result "rdma link add siw0 type siw netdev lo" $? \
		"$(cat /tmp/siw-link.txt; dmesg | grep -i siw | tail -n 3)"
fi
if [ -e /sys/class/infiniband/siw0 ]; then
	contract siw0
	export MRD_BUILDDIR=/opt/mrd/bin
	contract siw0 test-windows "windows through mrd"
	unset MRD_BUILDDIR
	SIW_SOCK=/run/mrd-siw.sock
	serve_mrd "mrd --provider verbs --device siw0 serves its socket" /tmp/mrd-siw.log \
		"$SIW_SOCK" --provider verbs --device siw0 --config /tmp/mrd.conf
	MRD_SIW=$SERVED
	STATUS=$(MRD_SOCKET=$SIW_SOCK mrctl --json status)
	echo "$STATUS"
	echo "$STATUS" | grep -q '"provider":"verbs","device":"siw0"'
	result "mrctl status: provider verbs, device siw0" $?
	echo "$STATUS" | grep -q '"dma":false,"no_dma":"iWARP'
	result "mrd offers no DMA through keys on siw0, and says why (iWARP)" $?
	rereg_probe_info siw0 /tmp/mrd-siw.log
	timeout 60 mrd-hello "$SIW_SOCK" > /tmp/hello-siw.txt 2>&1
	result "mrd-hello on siw0" $? "$(tail -n 3 /tmp/hello-siw.txt)"
	kill "$MRD_SIW"
	wait "$MRD_SIW"
	result "mrd on siw0 exits cleanly on SIGTERM" $? "$(tail -n 5 /tmp/mrd-siw.log)"
fi
# 11. The freed buffer's key on the soft provider in both key modes: variant (a reused index
# takes a new key byte, as rxe's random one) and mlx5 (a released key comes back unchanged,
# LIFO per size, as mlx5's mkey cache): mrd's key quarantine keeps it refused in both.
for mode in variant mlx5; do
	SOFT_SOCK=/run/mrd-soft-$mode.sock
	MRD_SOFT_KEYS=$mode mrd --foreground --no-bus --provider soft --config /tmp/mrd.conf \
		--socket "$SOFT_SOCK" > /tmp/mrd-soft-$mode.log 2>&1 &
	MRD_SOFT=$!
	for _ in $(seq 200); do [ -S "$SOFT_SOCK" ] && break; sleep 0.1; done
	timeout 120 mrd-demo "$SOFT_SOCK" > /tmp/demo-soft-$mode.txt 2>&1
	rc=$?
	grep -q '^sender: the same DMA after free: Required key not available' \
		/tmp/demo-soft-$mode.txt
	result "mrd-demo on soft, MRD_SOFT_KEYS=$mode: the freed buffer's key is refused" \
		$((rc | $?)) "$(tail -n 3 /tmp/demo-soft-$mode.txt; tail -n 3 /tmp/mrd-soft-$mode.log)"
	kill "$MRD_SOFT"
	wait "$MRD_SOFT"
done
# 12. Client-PD registration (issue 22, part 1): a root process registers, with mrd's
# client-context.c, a uid-1000 client's memory into the client's own PD through its uverbs fd;
# the client (RLIMIT_MEMLOCK 64 KiB) moves data on its own QPs by those keys; hostile fds and
# PD handles refused. On each device, the other one as the foreign device.
[ -e /sys/class/infiniband/siw0 ] && export MRD_CLIENT_PD_OTHER=siw0
contract rxe0 test-client-pd "client-PD registration"
if [ -e /sys/class/infiniband/siw0 ]; then
	export MRD_CLIENT_PD_OTHER=rxe0
	contract siw0 test-client-pd "client-PD registration"
fi
unset MRD_CLIENT_PD_OTHER

# 13. Client-PD registration through mrd (issue 22): uid-1000 clients (RLIMIT_MEMLOCK 64 KiB)
# bind their own PDs; RDMA WRITE and READ between two of them on their own QPs; BindPd's
# refusals; a bound client killed with SIGKILL leaves no MR, QP or pin behind once mrd noticed.
# A second device, rxe1 on a dummy netdev (rxe loops a packet to its own address back without
# sending it): mrd serves both, siw0 not ([mrd] devices). dummy.ko makes dummy0 as it loads.
{ ip link show dummy0 > /dev/null 2>&1 || ip link add dummy0 type dummy; } && ip addr add 10.9.9.1/24 dev dummy0 && ip link set dummy0 up &&
	rdma link add rxe1 type rxe netdev dummy0
result "rdma link add rxe1 type rxe netdev dummy0" $?
printf '[mrd]\nsocket_mode = 0666\ndevices = rxe0 rxe1\n[memory]\nhugepages = no\n' > /tmp/mrd-bound.conf
SOCK=/run/mrd-bound.sock
serve_mrd "mrd on rxe0 serves its socket again (client PDs)" /tmp/mrd-bound.log "$SOCK" \
	--provider verbs --device rxe0 --config /tmp/mrd-bound.conf
MRD=$SERVED
export MRD_SOCKET=$SOCK MRD_DEVICE=rxe0
fds0=$(ls /proc/$MRD/fd | wc -l)
mrs0=$(rdma resource show mr 2>/dev/null | wc -l)
timeout 240 rdma-peers bound "$SOCK" "$GIDX" > /tmp/bound.txt 2>&1
rc=$?
collect /tmp/bound.txt
result "rdma-peers bound exits cleanly" $rc
# Memory windows in the client-PD model: granted by libmrd on the program's own QP.
timeout 240 rdma-peers windows "$SOCK" "$GIDX" > /tmp/own-windows.txt 2>&1
rc=$?
collect /tmp/own-windows.txt
result "rdma-peers windows exits cleanly" $rc "$(tail -n 3 /tmp/own-windows.txt)"
# Killed with a window of its own PD bound over mrd's MR there: mrd deallocates the window
# libmrd tracked, then deregisters; nothing is kept (rxe refused the dereg before).
n0=$(grep -c "window(s) its client left" /tmp/mrd-bound.log)
timeout 120 rdma-peers windows-killed "$SOCK" "$GIDX" > /tmp/win-killed.txt 2>&1
rc=$?
collect /tmp/win-killed.txt
kept=1
for _ in $(seq 100); do
	n1=$(grep -c "window(s) its client left" /tmp/mrd-bound.log)
	[ "$n1" -gt "$n0" ] && { kept=0; break; }
	sleep 0.1
done
[ $rc = 0 ] && [ $kept = 0 ] && ! grep -q "kept an MR\|kept its MR" /tmp/mrd-bound.log
result "a client-PD program killed with a window bound: mrd deallocates the window, keeps no MR" $? \
	"rc=$rc $(grep -E "kept (an|its) MR|window\(s\)" /tmp/mrd-bound.log | tail -n 2)"
other=
[ -e /sys/class/infiniband/siw0 ] && other=siw0
timeout 120 rdma-peers bound-hostile "$SOCK" $other > /tmp/bound-hostile.txt 2>&1
rc=$?
collect /tmp/bound-hostile.txt
result "rdma-peers bound-hostile exits cleanly" $rc "$(tail -n 3 /tmp/bound-hostile.txt)"
same=1
for _ in $(seq 200); do
	read_victims_domain
	[ "$(ls /proc/$MRD/fd | wc -l)" = "$fds0" ] && [ "${p:-0}" = 0 ] && { same=0; break; }
	sleep 0.1
done
result "after the hostile clients: mrd's fds ($(ls /proc/$MRD/fd | wc -l), $fds0 before) and pins (${p:-none}) back" $same
# A re-exec (SIGUSR2) hands the memory over; MRs in a client's own context would outlive the
# old mrd there, their keys working on pages the next one knows nothing of: it deregisters them
# first. The holder lives on (it never asks again).
if [ -e /sys/class/infiniband/rxe1 ]; then
	timeout 120 rdma-peers two-devices "$SOCK" rxe0 rxe1 > /tmp/two.txt 2>&1
	rc=$?
	collect /tmp/two.txt
	result "rdma-peers two-devices exits cleanly" $rc "$(tail -n 3 /tmp/two.txt)"
fi
start_bg /tmp/bound-hold0.txt HOLDING rdma-peers bound-hold "$SOCK"
HOLDER=$BG
collect /tmp/bound-hold0.txt
held=$(rdma resource show mr 2>/dev/null | wc -l)
kill -USR2 "$MRD"
back=1
for _ in $(seq 200); do
	grep -q 're-executing' /tmp/mrd-bound.log && mrctl --json status > /dev/null 2>&1 &&
		[ "$(rdma resource show mr 2>/dev/null | wc -l)" = "$mrs0" ] && { back=0; break; }
	sleep 0.1
done
result "SIGUSR2 re-exec: mrd deregistered the bound holder's MR ($held MRs before, $(rdma resource show mr 2>/dev/null | wc -l) after, $mrs0 at first) and serves" $back \
	"$(tail -n 3 /tmp/mrd-bound.log)"
kill -9 "$HOLDER"
wait "$HOLDER" 2>/dev/null
for _ in $(seq 200); do
	mrctl --json clients | grep -q "\"pid\":$HOLDER," || break
	sleep 0.1
done
fds0=$(ls /proc/$MRD/fd | wc -l)
start_bg /tmp/bound-hold.txt HOLDING rdma-peers bound-hold "$SOCK"
HOLDER=$BG
collect /tmp/bound-hold.txt
DEVS=$(mrctl --json status | grep -o '"devices":\[[^]]*\]')
echo "@@ INFO $DEVS"
echo "$DEVS" | grep -q '{"name":"rxe0","domains":true,[^}]*"bound":1}' &&
	echo "$DEVS" | grep -q '{"name":"rxe1","domains":false,[^}]*"bound":0}'
result "mrctl status (root): rxe0 and rxe1 served, the holder bound on rxe0" $? "$DEVS"
rdma resource show mr > /tmp/mr-held.txt 2>&1
rdma resource show qp > /tmp/qp-held.txt 2>&1
read_victims_domain
echo "@@ INFO held: MRs on the device $(wc -l < /tmp/mr-held.txt) (before: $mrs0), QPs of the holder $(grep -c "pid $HOLDER " /tmp/qp-held.txt), domain uid-1000 pinned ${p:-none}"
[ "$(wc -l < /tmp/mr-held.txt)" -gt "$mrs0" ] && grep -q "pid $HOLDER " /tmp/qp-held.txt &&
	[ "${p:-0}" -ge $((4 << 20)) ]
result "a bound holder: its MRs (made by mrd) and QP are on the device, its pages pinned by mrd" $? \
	"$(cat /tmp/mr-held.txt /tmp/qp-held.txt | tail -n 6)"
kill -9 "$HOLDER"
wait "$HOLDER" 2>/dev/null
gone=1
for _ in $(seq 200); do
	read_victims_domain
	if ! echo "$CLIENTS" | grep -q "\"pid\":$HOLDER," &&
		[ "$(rdma resource show mr 2>/dev/null | wc -l)" = "$mrs0" ] &&
		! rdma resource show qp 2>/dev/null | grep -q "pid $HOLDER " &&
		[ "$(ls /proc/$MRD/fd | wc -l)" = "$fds0" ] && [ "${p:-0}" = 0 ]; then
		gone=0
		break
	fi
	sleep 0.1
done
result "SIGKILL of a bound client: mrd let go (MRs $(rdma resource show mr 2>/dev/null | wc -l) of $mrs0 before, mrd fds $(ls /proc/$MRD/fd | wc -l) of $fds0, pinned ${p:-gone})" $gone \
	"$(rdma resource show qp 2>/dev/null | grep "pid $HOLDER ")"
mrd-hello "$SOCK" > /dev/null 2>&1
result "mrd serves a new client after that" $?
kill "$MRD"
wait "$MRD"
result "mrd (client PDs) exits cleanly on SIGTERM" $? "$(tail -n 5 /tmp/mrd-bound.log)"
unset MRD_DEVICE

# 14. Unmodified programs on mrd (issue 23): LD_PRELOAD=libmrd-preload.so, as uid 1000 with
# RLIMIT_MEMLOCK 64 KiB. Each program first fails without the shim (it cannot pin its 1 MiB),
# then runs through it; mrctl shows the pages mrd pinned for it meanwhile.
SHIM=/opt/mrd/lib/libmrd-preload.so
SOCK=/run/mrd-preload.sock
printf '[mrd]\nsocket_mode = 0666\n[memory]\nhugepages = no\n' > /tmp/mrd-preload.conf
serve_mrd "mrd on rxe0 serves its socket (preload)" /tmp/mrd-preload.log "$SOCK" \
	--provider verbs --device rxe0 --config /tmp/mrd-preload.conf
MRD=$SERVED
export MRD_SOCKET=$SOCK
AS="preload-check as 1000 65536"
$AS preload-check data "$GIDX" > /tmp/pc-plain.txt 2>&1
rc=$?
[ $rc != 0 ] && grep -q "FAIL.preload: ibv_reg_mr of" /tmp/pc-plain.txt
result "preload-check without the shim: its ibv_reg_mr fails (memlock 64 KiB)" $? "rc=$rc $(tail -n 2 /tmp/pc-plain.txt)"
MRD_PRELOAD_EXPECT=1 LD_PRELOAD=$SHIM timeout 120 $AS preload-check data "$GIDX" > /tmp/pc.txt 2>&1
rc=$?
collect /tmp/pc.txt
result "preload-check through the shim exits 0" $rc "$(tail -n 3 /tmp/pc.txt)"
# The rkeys type-1 windows' (issue 41): kept bound while the registration is kept (the default
# above: the rkey lives until the buffer is freed), unbound at ibv_dereg_mr, or the MRs' own.
for mode in dereg off; do
	MRD_PRELOAD_WINDOWS=$mode MRD_PRELOAD_EXPECT=1 LD_PRELOAD=$SHIM timeout 120 $AS preload-check data "$GIDX" > /tmp/pc-$mode.txt 2>&1
	rc=$?
	sed "s/preload: /preload (windows till $mode): /" /tmp/pc-$mode.txt > /tmp/pc-$mode-named.txt
	collect /tmp/pc-$mode-named.txt
	result "preload-check through the shim with MRD_PRELOAD_WINDOWS=$mode exits 0" $rc "$(tail -n 3 /tmp/pc-$mode.txt)"
done
# Heap neighbours (rping -S 65000: two malloc(65000) sharing a page), then writers racing
# 100 moves and moves back of a registration's pages (issue 38).
$AS preload-check neighbours "$GIDX" > /tmp/pn-plain.txt 2>&1
rc=$?
[ $rc != 0 ] && grep -q "FAIL.preload: neighbours: ibv_reg_mr" /tmp/pn-plain.txt
result "preload-check neighbours without the shim: ibv_reg_mr fails (memlock 64 KiB)" $? "rc=$rc $(tail -n 2 /tmp/pn-plain.txt)"
MRD_PRELOAD_EXPECT=1 LD_PRELOAD=$SHIM timeout 120 $AS preload-check neighbours "$GIDX" > /tmp/pn.txt 2>&1
rc=$?
collect /tmp/pn.txt
result "preload-check neighbours through the shim exits 0" $rc "$(tail -n 3 /tmp/pn.txt)"
MRD_PRELOAD_EXPECT=1 MRD_PRELOAD_KEEP=0 LD_PRELOAD=$SHIM timeout 240 $AS preload-check writers 100 > /tmp/pw.txt 2>&1
rc=$?
collect /tmp/pw.txt
result "preload-check writers through the shim exits 0" $rc "$(tail -n 3 /tmp/pw.txt)"
# One host: the server in the background, the client against 127.0.0.1.
local_pair() { # name shim(0|1) program args...
	name=$1 shim=$2
	shift 2
	pre=
	[ "$shim" = 1 ] && pre="env LD_PRELOAD=$SHIM"
	[ "$shim" = 2 ] && pre="env LD_PRELOAD=$SHIM MRD_PRELOAD_WINDOWS=dereg" name="$name, rkeys windows'"
	$pre timeout 120 $AS "$@" > /tmp/srv.txt 2>&1 &
	srv=$!
	sleep 1
	$pre timeout 120 $AS "$@" 127.0.0.1 > /tmp/cli.txt 2>&1 &
	cli=$!
	watch_pins $srv $cli
	wait $srv
	src=$?
	wait $cli
	crc=$?
	if [ "$shim" = 0 ]; then
		[ $src != 0 ] && [ $crc != 0 ]
		result "$name without the shim fails (memlock 64 KiB): server rc $src, client rc $crc" $? \
			"$(tail -n 2 /tmp/srv.txt)"
	else
		[ $src = 0 ] && [ $crc = 0 ] && [ "$MAXP" -ge $((1 << 20)) ]
		result "$name through the shim: server rc $src, client rc $crc, mrd pinned up to $MAXP bytes for uid 1000" $? \
			"$(tail -n 3 /tmp/srv.txt /tmp/cli.txt)"
	fi
	tail -n 2 /tmp/cli.txt
}
if command -v ib_write_bw > /dev/null; then
	for shim in 0 1 2; do
		local_pair "ibv_rc_pingpong (one host, 1 MiB)" $shim ibv_rc_pingpong -d rxe0 -g "$GIDX" -s 1048576 -n 20
		local_pair "ib_write_bw (one host, 1 MiB)" $shim ib_write_bw -d rxe0 -x "$GIDX" -s 1048576 -n 50 -F
		local_pair "ib_read_bw (one host, 1 MiB)" $shim ib_read_bw -d rxe0 -x "$GIDX" -s 1048576 -n 50 -F
	done
else
	report SKIP "perftest and ibv_rc_pingpong through the shim" "the host had no perftest to copy into the VM (apt-get install perftest)"
fi
same=1
for _ in $(seq 200); do
	read_victims_domain
	[ "${p:-0}" = 0 ] && { same=0; break; }
	sleep 0.1
done
result "once the programs exited, mrd pins nothing for them (uid 1000: ${p:-none})" $same
kill "$MRD"
wait "$MRD"
result "mrd (preload) exits cleanly on SIGTERM" $? "$(tail -n 5 /tmp/mrd-preload.log)"
# preload-check's data again with [windows] remote = window-only and the shim's windows: the
# rkeys the program holds are windows' (issue 41).
printf '[mrd]\nsocket_mode = 0666\n[memory]\nhugepages = no\n[windows]\nremote = window-only\n' > /tmp/mrd-wo.conf
serve_mrd "mrd on rxe0 serves its socket (preload, window-only)" /tmp/mrd-wo.log /run/mrd-wo.sock \
	--provider verbs --device rxe0 --config /tmp/mrd-wo.conf
MRD=$SERVED
MRD_SOCKET=/run/mrd-wo.sock MRD_PRELOAD_WINDOWS=dereg MRD_PRELOAD_EXPECT=1 LD_PRELOAD=$SHIM timeout 120 $AS preload-check data "$GIDX" > /tmp/pc-wo.txt 2>&1
rc=$?
sed 's/preload: /preload (window-only): /' /tmp/pc-wo.txt > /tmp/pc-wo-named.txt
collect /tmp/pc-wo-named.txt
result "preload-check through the shim under window-only exits 0" $rc "$(tail -n 3 /tmp/pc-wo.txt)"
# A program that exits with a registration live: the shim's destructor unbinds its window, so
# mrd deregisters the MR under it (rxe refuses while a window is bound) and quarantines nothing.
export MRD_SOCKET=/run/mrd-wo.sock
MRD_PRELOAD_WINDOWS=dereg LD_PRELOAD=$SHIM timeout 60 $AS preload-check leave-live exit > /tmp/ll.txt 2>&1
rc=$?
for _ in $(seq 100); do
	read_victims_domain
	[ -z "$p" ] && break # the domain closed: its last client's memory went
	sleep 0.1
done
[ $rc = 0 ] && [ -z "$p" ] && ! grep -q "the device kept an MR" /tmp/mrd-wo.log
result "a program that exits with a window bound leaves nothing quarantined (the shim unbinds at exit)" $? \
	"rc=$rc pinned=${p:-none} $(grep "the device kept" /tmp/mrd-wo.log | tail -n 1)"
# Killed with a window bound: the window outlives the program in its context, which mrd's copy
# of the command fd keeps; mrd deallocates the windows the shim tracked (mrd_window_track)
# before it deregisters (before: rxe refused the dereg, and the run stayed pinned until the
# domain closed). The shim's memory is a second connection of the process: where its free comes
# first, the run is quarantined for the moment and goes back once the windows are gone.
for mode in dereg free; do
	l0=$(wc -l < /tmp/mrd-wo.log)
	MRD_PRELOAD_WINDOWS=$mode LD_PRELOAD=$SHIM timeout 60 $AS preload-check leave-live killed > /tmp/ll.txt 2>&1
	rc=$?
	for _ in $(seq 100); do
		read_victims_domain
		[ -z "$p" ] && break
		sleep 0.1
	done
	tail -n +$((l0 + 1)) /tmp/mrd-wo.log > /tmp/ll-mrd.log
	dealloc=$(grep -c "window(s) its client left" /tmp/ll-mrd.log)
	kept=$(grep -c "the device kept an MR" /tmp/ll-mrd.log)
	back=$(grep -c "the quarantined run goes back" /tmp/ll-mrd.log)
	stuck=$(grep -c "still registered on the device" /tmp/ll-mrd.log)
	[ $rc = 137 ] && grep -q registered /tmp/ll.txt && [ -z "$p" ] && [ "$dealloc" -gt 0 ] &&
		[ "$kept" = "$back" ] && [ "$stuck" = 0 ]
	result "a program killed with a window bound ($mode): mrd deallocates its windows, and no run stays quarantined" $? \
		"rc=$rc pinned=${p:-none} windows deallocated $dealloc times, runs quarantined $kept, back $back, dropped at the domain's close $stuck: $(tr '\n' ' ' < /tmp/ll-mrd.log | tail -c 600)"
	echo "@@ INFO killed ($mode): windows deallocated $dealloc times, runs quarantined $kept and back $back"
done
kill "$MRD"
wait "$MRD"
result "mrd (preload, window-only) exits cleanly on SIGTERM" $? "$(tail -n 5 /tmp/mrd-wo.log)"

# 15. Middleware through mrd (rping, libfabric, UCX): tests/vm/middleware-check.sh.
. /opt/mrd/middleware-check.sh
middleware_check
finish
