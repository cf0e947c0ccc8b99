# Middleware through mrd, as its users run it (issue 38): sourced by tests/vm/guest-init.sh,
# whose report, result, serve_mrd and watch_pins it uses. Debian's own rdmacm-utils (rping),
# libfabric (fi_pingpong, tests/vm/fabric-reuse) and UCX (ucx_perftest, tests/vm/ucp-remap),
# each as uid 1000 with RLIMIT_MEMLOCK 64 KiB through libmrd-preload.so, data checked, and each
# once without the shim, where the limit must be what stops it. A program the host lacked is
# not in the VM: its cases are skipped and say why.
#
# rxe's settings, none of them mrd's (README, "make check-rdma"): rdma_cm resolves no route over
# lo, so these programs use rxe1 on the dummy netdev dummy0 (10.9.9.1; rxe loops a packet to its
# own address back); ofi_rxm asks for a CQ beyond rxe's 32,767 unless FI_UNIVERSE_SIZE is small;
# UCX's UD transport drops rxe's packets in a destination-GID check.
MW_DEV=rxe1 MW_ADDR=10.9.9.1
MW_SHIM=/opt/mrd/lib/libmrd-preload.so
MW_AS="preload-check as 1000 65536"
MW_UCX="UCX_UD_VERBS_ETH_DGID_CHECK=n UCX_NET_DEVICES=$MW_DEV:1 UCX_WARN_UNUSED_ENV_VARS=n"
MW_PORT=19000
# Why an ordinary program fails without the shim: its registration hits the memlock limit.
MW_MEMLOCK='reg_mr failed|Cannot allocate memory|ENOMEM|locked memory|ulimit -l|ret=-12'

# rxe1 on dummy0 (guest-init's client-PD section made it; made here where it did not) and an
# mrd that serves it, for uid 1000.
# A resolvable host name, and /dev/shm: libfabric's verbs provider finds its source address by
# resolving the host's name (else rdma_getaddrinfo fails, EAI_AGAIN, and fi_getinfo finds no
# provider: -ENODATA), and UCX's and MPICH's shared memory transports look for /dev/shm.
mw_host() { # name address
	hostname "$1"
	printf '127.0.0.1 localhost\n%s %s\n' "$2" "$1" > /etc/hosts
	mkdir -p /dev/shm
	grep -q ' /dev/shm ' /proc/mounts || mount -t tmpfs -o mode=1777 shm /dev/shm
}
mw_setup() {
	mw_host mrd-vm $MW_ADDR
	{ ip link show dummy0 > /dev/null 2>&1 || ip link add dummy0 type dummy; } &&
		{ ip addr show dummy0 | grep -q "$MW_ADDR/" || ip addr add $MW_ADDR/24 dev dummy0; } &&
		ip link set dummy0 up &&
		{ [ -e /sys/class/infiniband/$MW_DEV ] || rdma link add $MW_DEV type rxe netdev dummy0; }
	result "middleware: $MW_DEV on dummy0 ($MW_ADDR), where rdma_cm finds a route" $?
	printf '[mrd]\nsocket_mode = 0666\n[memory]\nhugepages = no\n' > /tmp/mrd-mw.conf
	serve_mrd "middleware: mrd on $MW_DEV serves its socket" /tmp/mrd-mw.log /run/mrd-mw.sock \
		--provider verbs --device $MW_DEV --config /tmp/mrd-mw.conf || return 1
	MW_MRD=$SERVED
	export MRD_SOCKET=/run/mrd-mw.sock
}

# The words that run a program as uid 1000 with 64 KiB memlock, through the shim or not, under
# timeout. Without the shim, UCX retries its failed registrations for ever (each failure says
# "ibv_reg_mr ... Cannot allocate memory ... ulimit -l" within seconds): 60 s ends it.
mw_pre() { # shim(0|1)
	if [ "$1" = 1 ]; then MW_PRE="timeout 200 env LD_PRELOAD=$MW_SHIM $MW_AS"
	else MW_PRE="timeout 60 $MW_AS"; fi
}
# The verdict of a run: through the shim it must exit 0 and print GOOD (its data check, where
# it prints one; rping's -V says nothing when the data was right); without it, fail for the
# memlock reason.
mw_verdict() { # name shim rc good-regex files...
	mw_name=$1 mw_shim=$2 mw_rc=$3 mw_good=$4
	shift 4
	if [ "$mw_shim" = 1 ]; then
		[ "$mw_rc" = 0 ] && { [ -z "$mw_good" ] || cat "$@" | grep -Eq "$mw_good"; }
		result "middleware: $mw_name through the shim (mrd pinned up to $MAXP bytes for uid 1000)" $? \
			"rc $mw_rc: $(tail -n 4 "$@" | grep -v '^==>')"
	else
		[ "$mw_rc" != 0 ] && cat "$@" | grep -Eq "$MW_MEMLOCK"
		result "middleware: $mw_name without the shim fails on memlock (64 KiB)" $? \
			"rc $mw_rc: $(tail -n 4 "$@" | grep -v '^==>')"
	fi
}
# One program alone.
mw_one() { # name shim good-regex words...
	mw_n=$1 mw_s=$2 mw_g=$3
	shift 3
	mw_pre "$mw_s"
	$MW_PRE "$@" > /tmp/mw-one.txt 2>&1 &
	mw_job=$!
	watch_pins $mw_job
	wait $mw_job
	mw_rc=$?
	tail -n 20 /tmp/mw-one.txt
	mw_verdict "$mw_n" "$mw_s" $mw_rc "$mw_g" /tmp/mw-one.txt
}
# A server and its client on this host; SERVER and CLIENT are word lists (no quoting inside).
# The client is tried again while the server is not listening yet. Through the shim the
# client's verdict is the case's (its data check needs the server's buffers; rping's server
# exits non-zero when its client leaves); without it, either failing on memlock is the limit.
mw_pair() { # name shim good-regex server client
	mw_n=$1 mw_s=$2 mw_g=$3
	mw_pre "$mw_s"
	$MW_PRE $4 > /tmp/mw-srv.txt 2>&1 &
	mw_srv=$!
	sleep 2
	MAXP=0
	for _ in $(seq 20); do
		$MW_PRE $5 > /tmp/mw-cli.txt 2>&1 &
		mw_cli=$!
		watch_pins $mw_cli
		wait $mw_cli
		mw_crc=$?
		[ $mw_crc = 0 ] || ! kill -0 $mw_srv 2> /dev/null || grep -Eq "$MW_MEMLOCK" /tmp/mw-cli.txt ||
			! grep -Eqi 'refused|reject|unreachable' /tmp/mw-cli.txt && break
		sleep 1
	done
	for _ in $(seq 150); do kill -0 $mw_srv 2> /dev/null || break; sleep 0.1; done
	kill $mw_srv 2> /dev/null
	wait $mw_srv
	mw_src=$?
	tail -n 15 /tmp/mw-srv.txt /tmp/mw-cli.txt
	if [ "$mw_s" = 1 ]; then
		mw_verdict "$mw_n" 1 $mw_crc "$mw_g" /tmp/mw-cli.txt
	else
		mw_verdict "$mw_n" 0 $((mw_src | mw_crc)) "$mw_g" /tmp/mw-srv.txt /tmp/mw-cli.txt
	fi
}
mw_port() { MW_PORT=$((MW_PORT + 1)); }

# 1. rdma_cm: rping's two buffers (rping allows up to 64 KiB - 1) and its data check (-V).
# With glibc's mmap threshold under the size, each buffer is a mapping of its own; by default
# both sit on the heap, sharing a page (the heap-neighbour case).
mw_rping() { # name shim env-words
	mw_port
	mw_pair "$1" "$2" '' \
		"env $3 rping -s -a $MW_ADDR -p $MW_PORT -S 65000 -C 50 -V" \
		"env $3 rping -c -a $MW_ADDR -p $MW_PORT -S 65000 -C 50 -V"
}
mw_rdmacm() {
	if ! command -v rping > /dev/null; then
		report SKIP "middleware: rping" "the host had no rping to copy (apt-get install rdmacm-utils)"
		return
	fi
	own=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=32768
	mw_rping "rping -S 65000 -V (each buffer its own mapping)" 0 "$own"
	mw_rping "rping -S 65000 -V (each buffer its own mapping)" 1 "$own"
	mw_rping "rping -S 65000 -V (two heap buffers sharing a page)" 1 ""
}

# 2. libfabric: fi_pingpong msg (verbs) and rdm (verbs;ofi_rxm), 1 MiB, data checked (-c), and
# fabric-reuse (its own MR-cache invalidation), under each of libfabric's MR cache monitors.
mw_fi_pingpong() { # name shim env-words ep provider
	mw_port
	mw_pair "$1" "$2" '^1m +10 +=10 ' \
		"env $3 fi_pingpong -p $5 -e $4 -d $MW_DEV -S 1048576 -I 10 -c -B $MW_PORT" \
		"env $3 fi_pingpong -p $5 -e $4 -d $MW_DEV -S 1048576 -I 10 -c -P $MW_PORT $MW_ADDR"
}
# libfabric 1.17 knows its MR cache monitors as memhooks, userfaultfd and disabled (another
# name, "uffd", leaves its default, memhooks). Its userfaultfd monitor opens a userfaultfd of
# its own, which uid 1000 may only with vm.unprivileged_userfaultfd = 1 (else the cache is off,
# as under disabled): set for that monitor's cases alone. FI_LOG_* shows the cache on, and at
# the domain's close how many unmaps its monitor told it ("notify").
MW_UFFD_SYSCTL=$(cat /proc/sys/vm/unprivileged_userfaultfd 2> /dev/null)
MW_FI_LOG="FI_LOG_LEVEL=info FI_LOG_PROV=verbs FI_LOG_SUBSYS=mr"
mw_monitor() { # monitor
	[ -n "$MW_UFFD_SYSCTL" ] || return 0
	if [ "$1" = userfaultfd ]; then echo 1; else echo "$MW_UFFD_SYSCTL"; fi \
		> /proc/sys/vm/unprivileged_userfaultfd
}
mw_libfabric() {
	if ! command -v fi_pingpong > /dev/null; then
		report SKIP "middleware: libfabric" "the host had no fi_pingpong to copy (apt-get install libfabric-bin)"
	else
		mw_fi_pingpong "fi_pingpong msg (verbs, 1 MiB, -c)" 0 "" msg verbs
		mw_fi_pingpong "fi_pingpong rdm (verbs;ofi_rxm, 1 MiB, -c)" 0 FI_UNIVERSE_SIZE=32 rdm "verbs;ofi_rxm"
		for mon in memhooks userfaultfd disabled; do
			mw_monitor $mon
			mw_fi_pingpong "fi_pingpong msg (verbs, 1 MiB, -c), FI_MR_CACHE_MONITOR=$mon" 1 \
				FI_MR_CACHE_MONITOR=$mon msg verbs
			mw_fi_pingpong "fi_pingpong rdm (verbs;ofi_rxm, 1 MiB, -c), FI_MR_CACHE_MONITOR=$mon" 1 \
				"FI_MR_CACHE_MONITOR=$mon FI_UNIVERSE_SIZE=32" rdm "verbs;ofi_rxm"
		done
		mw_monitor disabled
	fi
	if ! command -v fabric-reuse > /dev/null; then
		report SKIP "middleware: fabric-reuse" "not built: no libfabric headers when mrd was configured (apt-get install libfabric-dev)"
		return
	fi
	good='data checked; addresses reused'
	mw_one "fabric-reuse (verbs;ofi_rxm: 1 MiB buffers freed and reused)" 0 "$good" \
		env FI_UNIVERSE_SIZE=32 fabric-reuse $MW_DEV 4
	for mon in memhooks userfaultfd disabled; do
		# The mmap phase: a buffer mmap'd where one was just unmapped, which the cache must
		# have dropped (the shim's munmap goes on to the C library's, which memhooks hooks).
		mw_monitor $mon
		mw_one "fabric-reuse (verbs;ofi_rxm: 1 MiB buffers malloc'd and mmap'd, freed and unmapped, reused at their addresses), FI_MR_CACHE_MONITOR=$mon" 1 \
			"$good" env FI_MR_CACHE_MONITOR=$mon $MW_FI_LOG FI_UNIVERSE_SIZE=32 fabric-reuse $MW_DEV 6
		[ $mon = disabled ] && continue
		grep -q 'MR cache enabled' /tmp/mw-one.txt &&
			grep -Eq 'MR cache stats: .* notify [1-9]' /tmp/mw-one.txt
		result "middleware: fabric-reuse's MR cache was on under FI_MR_CACHE_MONITOR=$mon and told of unmaps" $? \
			"$(grep -E 'MR cache|userfaultfd|memhooks' /tmp/mw-one.txt | tail -n 3)"
	done
	mw_monitor disabled
	# The heap: the two 1 MiB buffers share a page (the heap-neighbour case).
	mw_one "fabric-reuse heap (verbs;ofi_rxm: two 1 MiB heap buffers sharing a page, freed and reused)" 1 \
		"$good" env FI_UNIVERSE_SIZE=32 fabric-reuse $MW_DEV 6 heap
}

# 3. UCX: ucx_perftest (UCP tag latency and put bandwidth, 1 MiB: rendezvous, zero copy) over
# rc_verbs and ud_verbs, and ucp-remap (map, unmap, remap; data checked).
mw_ucx_perftest() { # name shim tls test iterations
	mw_port
	mw_pair "$1" "$2" '^Final: ' \
		"env $MW_UCX UCX_TLS=$3 ucx_perftest -p $MW_PORT" \
		"env $MW_UCX UCX_TLS=$3 ucx_perftest $MW_ADDR -p $MW_PORT -t $4 -s 1048576 -n $5 -w 2"
}
mw_ucx() {
	if ! command -v ucx_perftest > /dev/null; then
		report SKIP "middleware: ucx_perftest" "the host had no ucx_perftest to copy (apt-get install ucx-utils)"
	else
		mw_ucx_perftest "ucx_perftest tag_lat (rc_verbs,ud_verbs, 1 MiB)" 0 rc_verbs,ud_verbs,self tag_lat 20
		for tls in rc_verbs,ud_verbs,self ud_verbs,self; do
			mw_ucx_perftest "ucx_perftest tag_lat (UCX_TLS=$tls, 1 MiB)" 1 $tls tag_lat 20
			mw_ucx_perftest "ucx_perftest ucp_put_bw (UCX_TLS=$tls, 1 MiB)" 1 $tls ucp_put_bw 50
		done
	fi
	if ! command -v ucp-remap > /dev/null; then
		report SKIP "middleware: ucp-remap" "not built: no UCX headers when mrd was configured (apt-get install libucx-dev)"
		return
	fi
	for shim in 0 1; do
		mw_one "ucp-remap (tag and put, 1 MiB buffers mapped, unmapped, remapped)" $shim \
			'data checked; addresses reused' env $MW_UCX UCX_TLS=rc_verbs,ud_verbs,self ucp-remap 6
	done
}

# 4. MPI across the two hosts (guest-init.sh's pair: rxe0 on eth0, each host its own mrd at
# MRD_SOCKET): MPICH (Debian's is ch4:ucx) under Hydra. No ssh in the guests: "-launcher
# manual" makes mpiexec print each host's proxy command instead of running it; host a runs
# proxy 0 and sends proxy 1's command to host b over busybox nc. Both proxies, and the ranks
# they start, run as uid 1000 with 64 KiB memlock, through the shim or without it. Hydra's
# mpiexec and proxies outlive SIGTERM while a peer is missing: SIGKILL ends them.
mw_mpi() { # role peer shim port
	mw_role=$1 mw_peer=$2 mw_s=$3 mw_p=$4
	mw_pre "$mw_s"
	MW_PRE="timeout -s KILL ${MW_PRE#timeout }"
	case $mw_s in 1) how="through the shim" ;; *) how="without the shim" ;; esac
	if [ "$mw_role" = a ]; then
		timeout -s KILL 400 mpiexec.hydra -launcher manual -iface eth0 -hosts 10.99.0.1,10.99.0.2 -n 2 -ppn 1 \
			-genv UCX_TLS rc_verbs,ud_verbs,self -genv UCX_NET_DEVICES rxe0:1 \
			-genv UCX_UD_VERBS_ETH_DGID_CHECK n -genv UCX_WARN_UNUSED_ENV_VARS n \
			mpi-check 10 > /tmp/mpi.txt 2>&1 &
		mw_mpiexec=$!
		for _ in $(seq 300); do grep -q HYDRA_LAUNCH_END /tmp/mpi.txt && break; sleep 0.1; done
		cmd0=$(sed -n 's/^HYDRA_LAUNCH: \(.*--proxy-id 0\) *$/\1/p' /tmp/mpi.txt)
		cmd1=$(sed -n 's/^HYDRA_LAUNCH: \(.*--proxy-id 1\) *$/\1/p' /tmp/mpi.txt)
		sent=1
		for _ in $(seq 60); do
			echo "$cmd1" | timeout 5 nc "$mw_peer" "$mw_p"
			case $? in 0|124|143) sent=0; break ;; esac
			sleep 1
		done
		[ $sent = 0 ] && $MW_PRE $cmd0 > /tmp/proxy.txt 2>&1
		mw_prc=$?
		for _ in $(seq 300); do kill -0 $mw_mpiexec 2> /dev/null || break; sleep 0.1; done
		kill -9 $mw_mpiexec 2> /dev/null
		wait $mw_mpiexec
		mw_rc=$?
		tail -n 15 /tmp/mpi.txt /tmp/proxy.txt
		if [ "$mw_s" = 1 ]; then
			[ $sent = 0 ] && [ $mw_rc = 0 ] && [ $mw_prc = 0 ] &&
				grep -q 'and an allreduce of .* ints: data checked' /tmp/mpi.txt
			result "host a: middleware: MPICH (ch4:ucx) 2 ranks across hosts, ping-pong 1 MiB and allreduce $how" $? \
				"command to host b sent: $sent; mpiexec rc $mw_rc, proxy rc $mw_prc: $(tail -n 4 /tmp/mpi.txt /tmp/proxy.txt | grep -v '^==>')"
		else
			[ $mw_rc != 0 ] && cat /tmp/mpi.txt /tmp/proxy.txt | grep -Eq "$MW_MEMLOCK"
			result "host a: middleware: MPICH (ch4:ucx) 2 ranks across hosts $how fails on memlock (64 KiB)" $? \
				"mpiexec rc $mw_rc, proxy rc $mw_prc: $(tail -n 4 /tmp/mpi.txt /tmp/proxy.txt | grep -v '^==>')"
		fi
	else
		: > /tmp/launch.txt
		nc -l -p "$mw_p" > /tmp/launch.txt &
		mw_nc=$!
		for _ in $(seq 1200); do grep -q -- '--proxy-id 1' /tmp/launch.txt && break; sleep 0.1; done
		kill $mw_nc 2> /dev/null
		wait $mw_nc
		cmd1=$(head -n 1 /tmp/launch.txt)
		if [ -z "$cmd1" ]; then
			result "host b: middleware: MPICH proxy $how: its command came from host a" 1
			return
		fi
		$MW_PRE $cmd1 > /tmp/proxy.txt 2>&1
		mw_prc=$?
		tail -n 15 /tmp/proxy.txt
		if [ "$mw_s" = 1 ]; then
			result "host b: middleware: MPICH proxy and rank 1 $how exit 0" $mw_prc "$(tail -n 4 /tmp/proxy.txt)"
		else
			[ $mw_prc != 0 ]
			result "host b: middleware: MPICH proxy and rank 1 $how fail" $? "$(tail -n 4 /tmp/proxy.txt)"
		fi
	fi
}

# 5. rping, fi_pingpong and ucx_perftest across the two hosts, as the pair's other cases run:
# host a serves, host b connects (again while the server is not listening yet). Over busybox
# nc, host b sends host a its client's status and whether it met the memlock limit once the
# client is done; host a's server then has 15 s to end (without the shim a server whose client
# failed waits for ever), and host a sends its own back. Without the shim either side may be
# the one that meets the limit (fi_pingpong's rdm server registers before its client does):
# each host's verdict is both failing, one on memlock.
MWX_N=0
mwx_send() { # peer port message
	for _ in $(seq 60); do
		echo "$3" | timeout 5 nc "$1" "$2"
		case $? in 0|124|143) return ;; esac
		sleep 1
	done
}
mwx_recv() { # nc-pid file: waits up to 300 s for the peer's message, into $MWX_PEER_RC, $MWX_PEER_MEM
	for _ in $(seq 3000); do [ -s "$2" ] && break; kill -0 "$1" 2> /dev/null || break; sleep 0.1; done
	kill "$1" 2> /dev/null
	wait "$1"
	set -- $(head -n 1 "$2" | tr -cd '0-9 ')
	MWX_PEER_RC=${1:-none} MWX_PEER_MEM=${2:-0}
}
mw_across() { # role peer name shim good-regex server client (@PEER@: host a's address)
	mwx_role=$1 mwx_peer=$2 mwx_n=$3 mwx_s=$4 mwx_g=$5
	MWX_N=$((MWX_N + 1))
	mwx_port=$((19100 + MWX_N)) mwx_ctl=$((19200 + MWX_N))
	mw_pre "$mwx_s"
	case $mwx_s in 1) how="through the shim" ;; *) how="without the shim" ;; esac
	: > /tmp/mwx-peer.txt
	timeout 600 nc -l -p $mwx_ctl > /tmp/mwx-peer.txt &
	mwx_nc=$!
	if [ "$mwx_role" = a ]; then
		$MW_PRE $(echo "$6" | sed "s/@PORT@/$mwx_port/g; s/@PEER@/10.99.0.1/g") > /tmp/mwx.txt 2>&1 &
		mwx_job=$!
		MAXP=0
		while kill -0 $mwx_job 2> /dev/null && ! [ -s /tmp/mwx-peer.txt ]; do
			read_victims_domain
			[ "${p:-0}" -gt "$MAXP" ] && MAXP=$p
			sleep 0.2
		done
		for _ in $(seq 150); do kill -0 $mwx_job 2> /dev/null || break; sleep 0.1; done
		kill $mwx_job 2> /dev/null
		wait $mwx_job
		mwx_rc=$?
		mwx_recv $mwx_nc /tmp/mwx-peer.txt
		mwx_mem=0
		grep -Eq "$MW_MEMLOCK" /tmp/mwx.txt && mwx_mem=1
		mwx_send "$mwx_peer" $mwx_ctl "$mwx_rc $mwx_mem"
		mwx_what="server, client on host b"
	else
		for _ in $(seq 30); do
			$MW_PRE $(echo "$7" | sed "s/@PORT@/$mwx_port/g; s/@PEER@/$mwx_peer/g") > /tmp/mwx.txt 2>&1 &
			mwx_job=$!
			watch_pins $mwx_job
			wait $mwx_job
			mwx_rc=$?
			[ $mwx_rc = 0 ] || grep -Eq "$MW_MEMLOCK" /tmp/mwx.txt ||
				! grep -Eqi 'refused|reject|unreachable|ADDR_ERROR|ROUTE_ERROR' /tmp/mwx.txt && break
			sleep 1
		done
		mwx_mem=0
		grep -Eq "$MW_MEMLOCK" /tmp/mwx.txt && mwx_mem=1
		mwx_send "$mwx_peer" $mwx_ctl "$mwx_rc $mwx_mem"
		mwx_recv $mwx_nc /tmp/mwx-peer.txt
		mwx_what="client of host a"
	fi
	tail -n 10 /tmp/mwx.txt
	mwx_detail="rc $mwx_rc (memlock met: $mwx_mem), host of the other side: rc $MWX_PEER_RC (memlock met: $MWX_PEER_MEM): $(tail -n 3 /tmp/mwx.txt)"
	echo "host $mwx_role: $mwx_n $how: $mwx_detail"
	if [ "$mwx_s" = 1 ]; then
		# The client's status is the case's (rping's server exits non-zero when its client
		# leaves); the client's data check is its own; neither may meet the memlock limit.
		if [ "$mwx_role" = a ]; then mwx_crc=$MWX_PEER_RC; else mwx_crc=$mwx_rc; fi
		[ "$mwx_crc" = 0 ] && [ $mwx_mem = 0 ] && [ "$MWX_PEER_MEM" = 0 ] &&
			{ [ "$mwx_role" = a ] || [ -z "$mwx_g" ] || grep -Eq "$mwx_g" /tmp/mwx.txt; }
		result "host $mwx_role: middleware: $mwx_n across hosts ($mwx_what) $how (mrd pinned up to $MAXP bytes for uid 1000)" $? "$mwx_detail"
	else
		[ $mwx_rc != 0 ] && [ "$MWX_PEER_RC" != 0 ] && [ "$MWX_PEER_RC" != none ] &&
			[ $((mwx_mem | MWX_PEER_MEM)) = 1 ]
		result "host $mwx_role: middleware: $mwx_n across hosts ($mwx_what) $how fails on memlock (64 KiB, on either host)" $? "$mwx_detail"
	fi
}
mw_pair_cases() { # role peer
	if ! command -v rping > /dev/null; then
		report SKIP "host $1: middleware: rping across hosts" "the host had no rping to copy (apt-get install rdmacm-utils)"
	else
		for shim in 0 1; do
			mw_across "$1" "$2" "rping -S 65000 -V -C 10 (rdma_cm over eth0, two heap buffers sharing a page)" $shim '' \
				"rping -s -a @PEER@ -p @PORT@ -S 65000 -C 10 -V" "rping -c -a @PEER@ -p @PORT@ -S 65000 -C 10 -V"
		done
	fi
	if ! command -v fi_pingpong > /dev/null; then
		report SKIP "host $1: middleware: fi_pingpong across hosts" "the host had no fi_pingpong to copy (apt-get install libfabric-bin)"
	else
		f="fi_pingpong -d rxe0 -S 1048576 -I 10 -c"
		for shim in 0 1; do
			mw_across "$1" "$2" "fi_pingpong msg (verbs, 1 MiB, -c data checked)" $shim '^1m +10 +=10 ' \
				"$f -p verbs -e msg -B @PORT@" "$f -p verbs -e msg -P @PORT@ @PEER@"
			mw_across "$1" "$2" "fi_pingpong rdm (verbs;ofi_rxm, 1 MiB, -c data checked)" $shim '^1m +10 +=10 ' \
				"env FI_UNIVERSE_SIZE=32 $f -p verbs;ofi_rxm -e rdm -B @PORT@" \
				"env FI_UNIVERSE_SIZE=32 $f -p verbs;ofi_rxm -e rdm -P @PORT@ @PEER@"
		done
	fi
	if ! command -v ucx_perftest > /dev/null; then
		report SKIP "host $1: middleware: ucx_perftest across hosts" "the host had no ucx_perftest to copy (apt-get install ucx-utils)"
	else
		u="env UCX_UD_VERBS_ETH_DGID_CHECK=n UCX_NET_DEVICES=rxe0:1 UCX_WARN_UNUSED_ENV_VARS=n UCX_TLS=rc_verbs,ud_verbs,self ucx_perftest"
		for shim in 0 1; do
			mw_across "$1" "$2" "ucx_perftest tag_lat (rc_verbs,ud_verbs, 1 MiB; no data check: ucp-remap's is UCX's)" $shim '^Final: ' \
				"$u -p @PORT@" "$u @PEER@ -p @PORT@ -t tag_lat -s 1048576 -n 20 -w 2"
		done
	fi
}
middleware_pair() { # role peer
	mw_host "host-$1" "$(ip -4 -o addr show eth0 | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p')"
	if ! command -v mpiexec.hydra > /dev/null || ! command -v mpi-check > /dev/null; then
		report SKIP "host $1: middleware: MPICH 2 ranks across hosts" \
			"no mpiexec.hydra or mpi-check in the VM (apt-get install mpich libmpich-dev, then configure again)"
	else
		mw_mpi "$1" "$2" 0 18990
		mw_mpi "$1" "$2" 1 18991
	fi
	mw_pair_cases "$1" "$2"
}

middleware_check() {
	mw_setup || return
	mw_rdmacm
	mw_libfabric
	mw_ucx
	kill "$MW_MRD"
	wait "$MW_MRD"
	result "middleware: mrd on $MW_DEV exits cleanly on SIGTERM" $? "$(tail -n 5 /tmp/mrd-mw.log)"
}

# make bench: each program as users run it (uid 1000, 64 KiB memlock, through the shim) against
# the same user without it, its memlock raised to 1 GiB (so the shim is all that differs; root
# differed in more: UCX's tag_lat was 1.33x root's in one run): reps interleaved, the ratio of
# the medians. Latency: with the shim over without (target <= 1.05); bandwidth: the same
# (>= 0.95).
MW_AS_BIG="preload-check as 1000 1073741824"
mw_bench_one() { # row unit(lat|bw) field-awk server client (@PORT@: a new port each run)
	mw_row=$1 mw_unit=$2 mw_awk=$3 mw_reps=7
	: > /tmp/mwb-without
	: > /tmp/mwb-with
	for _ in $(seq $mw_reps); do
		for mode in without with; do
			mw_port
			pre=$MW_AS_BIG
			[ $mode = with ] && pre="env LD_PRELOAD=$MW_SHIM MRD_PRELOAD_LOG=0 $MW_AS"
			timeout 200 $pre $(echo "$4" | sed "s/@PORT@/$MW_PORT/g") > /tmp/mwb-srv.txt 2>&1 &
			mw_srv=$!
			sleep 2
			timeout 200 $pre $(echo "$5" | sed "s/@PORT@/$MW_PORT/g") > /tmp/mwb-cli.txt 2>&1
			wait $mw_srv
			awk "$mw_awk" /tmp/mwb-cli.txt | head -n 1 >> /tmp/mwb-$mode
		done
	done
	a=$(median < /tmp/mwb-without) b=$(median < /tmp/mwb-with)
	if [ -z "$a" ] || [ -z "$b" ]; then
		echo "$mw_row: not measured: $(tail -n 3 /tmp/mwb-cli.txt | tr '\n' ' ')"
		return
	fi
	awk -v a="$a" -v b="$b" -v row="$mw_row" -v u=$mw_unit -v r=$mw_reps 'BEGIN {
		x = (a > 0) ? b / a : 0
		if (u == "lat")
			printf "%s: ratio=%.3f (case=as uid 1000, 64 KiB memlock, through libmrd-preload.so, %.2f us; baseline=uid 1000, 1 GiB memlock, without it, %.2f us; reps=%d interleaved, median) target <= 1.05: %s\n",
				row, x, b, a, r, (x <= 1.05) ? "met" : "MISSED"
		else
			printf "%s: ratio=%.3f (case=as uid 1000, 64 KiB memlock, through libmrd-preload.so, %.1f MB/s; baseline=uid 1000, 1 GiB memlock, without it, %.1f MB/s; reps=%d interleaved, median) target >= 0.95: %s\n",
				row, x, b, a, r, (x >= 0.95) ? "met" : "MISSED" }'
}
middleware_bench() { # on rxe1 (mw_setup), beside guest-init's own bench mrd
	mw_setup > /dev/null || return
	gid=
	for g in /sys/class/infiniband/$MW_DEV/ports/1/gids/*; do
		case "$(cat "$g" 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*) gid=${g##*/}; break ;; esac
	done
	if command -v fi_pingpong > /dev/null; then
		mw_bench_one "vm-fi_pingpong-msg-lat-4KiB" lat '$1 == "4k" { print $7 }' \
			"fi_pingpong -p verbs -e msg -d $MW_DEV -S 4096 -I 2000 -B @PORT@" \
			"fi_pingpong -p verbs -e msg -d $MW_DEV -S 4096 -I 2000 -P @PORT@ $MW_ADDR"
	else
		echo "vm-fi_pingpong-msg-lat-4KiB: not measured: no fi_pingpong in the VM (apt-get install libfabric-bin)"
	fi
	if command -v ib_send_lat > /dev/null; then
		mw_bench_one "vm-ib_send_lat-4KiB" lat '$1 == 4096 { print $6 }' \
			"ib_send_lat -d $MW_DEV -x $gid -s 4096 -n 2000 -F -p @PORT@" \
			"ib_send_lat -d $MW_DEV -x $gid -s 4096 -n 2000 -F -p @PORT@ $MW_ADDR"
	else
		echo "vm-ib_send_lat-4KiB: not measured: no ib_send_lat in the VM (apt-get install perftest)"
	fi
	if command -v ucx_perftest > /dev/null; then
		u="env $MW_UCX UCX_TLS=rc_verbs,ud_verbs,self ucx_perftest"
		mw_bench_one "vm-ucx_perftest-tag_lat-4KiB" lat '$1 == "Final:" { print $5 }' \
			"$u -p @PORT@" "$u $MW_ADDR -p @PORT@ -t tag_lat -s 4096 -n 2000 -w 100"
		mw_bench_one "vm-ucx_perftest-ucp_put_bw-1MiB" bw '$1 == "Final:" { print $7 }' \
			"$u -p @PORT@" "$u $MW_ADDR -p @PORT@ -t ucp_put_bw -s 1048576 -n 50 -w 5"
	else
		echo "vm-ucx_perftest: not measured: no ucx_perftest in the VM (apt-get install ucx-utils)"
	fi
	kill "$MW_MRD"
	wait "$MW_MRD"
}
