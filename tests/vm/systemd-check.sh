#!/bin/sh
# The checks of the systemd VM (tests/vm/systemd-vm.sh), run by mrd-vm-check.service under
# systemd as PID 1, with mrd installed by make install from the make dist tarball
# (--prefix=/usr). Every check prints "@@ RESULT<TAB>PASS|FAIL|SKIP<TAB>systemd: NAME<TAB>detail"
# (the container checks: "container: NAME", tests/vm/container-check.sh) to the second serial
# port; "@@ ALL_DONE results=N" ends the run; then the VM powers off. With mrd_vm=bench on the
# kernel's command line (make bench) only the container benchmark runs: "@@ BENCH" lines.
VMDIR=/usr/lib/mrd-vm
N=0
RESULT_PREFIX="systemd: "
report() { # verdict name [detail]
	N=$((N + 1))
	printf '@@ RESULT\t%s\t%s%s\t%s\n' "$1" "$RESULT_PREFIX" "$2" \
		"$(printf '%s' "${3:-}" | tr '\t\n' '  ' | cut -c 1-600)" | tee /dev/ttyS1
}
result() { # name rc [detail]
	if [ "$2" = 0 ]; then report PASS "$1"; else report FAIL "$1" "${3:-rc=$2}"; fi
}
finish() {
	echo "@@ ALL_DONE results=$N" | tee /dev/ttyS1
	systemctl poweroff --no-block
	exit 0
}
as() { # user command...: as that user, with the groups /etc/group gives it now
	u=$1
	shift
	setpriv --reuid="$u" --regid="$u" --init-groups env HOME=/tmp USER="$u" "$@"
}
# Waits until mrd answers (after a restart or re-exec): mrctl status succeeds.
mrd_answers() {
	for _ in $(seq 100); do mrctl status > /dev/null 2>&1 && return 0; sleep 0.2; done
	return 1
}
main_pid() { systemctl show -P MainPID mrd.service; }

if grep -q 'mrd_vm=bench' /proc/cmdline; then # make bench: mrd as installed, for alice too
	systemd-sysusers && systemd-tmpfiles --create mrd.conf && useradd -m alice &&
		usermod -aG mrd alice && systemctl enable --now mrd.socket > /dev/null 2>&1
	. $VMDIR/container-check.sh
	container_bench 2>&1 | sed 's/^/@@ BENCH /' | tee /dev/ttyS1
	finish
fi

# ---- the system as make install left it, and the steps README's "Install" gives after it
[ "$(cat /proc/1/comm)" = systemd ]
result "systemd is PID 1" $? "PID 1 is $(cat /proc/1/comm)"
systemd-sysusers && systemd-tmpfiles --create mrd.conf
result "systemd-sysusers and systemd-tmpfiles --create mrd.conf (README: Install)" $?
getent group mrd > /dev/null
result "sysusers.d/mrd.conf made the group mrd" $? "$(getent group mrd)"
[ "$(stat -c '%a %U %G' /run/mrd 2> /dev/null)" = "755 root mrd" ]
result "tmpfiles.d/mrd.conf made /run/mrd 0755 root:mrd" $? "$(stat -c '%a %U %G' /run/mrd 2>&1)"
useradd -m alice && useradd -m bob
result "users alice and bob exist" $?

# ---- README's "Running" block, line by line, as root (each line one result)
n=0
while IFS= read -r line; do
	cmd=${line%%#*}
	cmd=$(echo "$cmd" | sed 's/[[:space:]]*$//')
	[ -n "$cmd" ] || continue
	n=$((n + 1))
	out=$(sh -c "$cmd" 2>&1)
	rc=$?
	result "README Running line $n: $cmd" $rc "$(echo "$out" | tail -n 3)"
	case "$cmd" in # the unit's settings come back before the next line
	*restart*|*USR2*|*reload*) sleep 1; mrd_answers ;;
	esac
done < $VMDIR/readme-running
[ $n -gt 0 ]
result "README's Running block has commands" $? "none read"

# ---- socket activation: the socket is systemd's, mrd starts at the first connection
[ "$(systemctl is-enabled mrd.socket)" = enabled ]
result "mrd.socket is enabled" $? "$(systemctl is-enabled mrd.socket 2>&1)"
[ "$(stat -c '%a %U %G %F' /run/mrd/mrd.sock)" = "660 root mrd socket" ]
result "the socket is 0660 root:mrd" $? "$(stat -c '%a %U %G %F' /run/mrd/mrd.sock 2>&1)"
systemctl stop mrd.service
state=$(systemctl is-active mrd.service)
out=$(as alice mrd-demo 2>&1)
rc=$?
[ $rc = 0 ] && echo "$out" | grep -q 'RDMA write of 64 bytes: done' &&
	echo "$out" | grep -q 'served by the lookup cache' && [ "$state" = inactive ] &&
	[ "$(systemctl is-active mrd.service)" = active ]
result "alice (group mrd) runs mrd-demo with lookups: mrd.service socket-activated" $? \
	"rc=$rc, mrd was $state before, $(systemctl is-active mrd.service) after: $(echo "$out" | tail -n 3)"
out=$(as alice $VMDIR/mrd-hello 2>&1)
result "alice runs mrd-hello (connect, ping, memory)" $? "$(echo "$out" | tail -n 3)"
out=$(as bob $VMDIR/mrd-hello 2>&1)
rc=$?
[ $rc != 0 ] && echo "$out" | grep -qi 'permission denied'
result "bob (not in group mrd) is refused" $? "rc=$rc: $out"

# ---- Type=notify: mrd's own status line reaches systemd only through sd_notify
status=$(systemctl show -P StatusText mrd.service)
[ "$(systemctl show -P Type mrd.service)" = notify ] && echo "$status" | grep -q '^serving'
result "Type=notify: systemd shows mrd's status" $? "Type $(systemctl show -P Type mrd.service), StatusText '$status'"

# ---- reload: a drop-in makes the group mrd administrators; alice's view widens
view() { as alice mrctl --json status | grep -o '"view":[^,]*'; }
before=$(view)
mkdir -p /etc/mrd/mrd.conf.d
printf '[mrd]\nadmin_group = mrd\n' > /etc/mrd/mrd.conf.d/50-vm.conf
systemctl reload mrd
after=$(view)
status=$(systemctl show -P StatusText mrd.service)
[ "$before" != '"view":null' ] && [ "$after" = '"view":null' ] &&
	echo "$status" | grep -q '^configuration reloaded'
result "systemctl reload mrd: admin_group = mrd seen" $? "alice's view $before, then $after; StatusText '$status'"
rm /etc/mrd/mrd.conf.d/50-vm.conf
systemctl reload mrd

# ---- warm restart with the FD store: alice's memory comes back, same address, same bytes
restart_check() { # expected-line
	as alice $VMDIR/mrd-restart /run/mrd/mrd.sock 60 > /tmp/restart.out 2>&1 &
	client=$!
	for _ in $(seq 100); do grep -q '^ready' /tmp/restart.out && break; sleep 0.1; done
	old=$(main_pid)
	systemctl restart mrd
	wait $client
	rc=$?
	[ $rc = 0 ] && grep -q "$1" /tmp/restart.out && [ "$(main_pid)" != "$old" ]
	restart_rc=$?
}
restart_check 'with its content'
result "systemctl restart mrd: mrd_client_reconnect() gives alice's 4 MiB back with its content" \
	$restart_rc "$(cat /tmp/restart.out)"
# The check fails where the FD store is off: a cold start, and the client told -ESTALE.
mkdir -p /run/systemd/system/mrd.service.d
printf '[Service]\nFileDescriptorStoreMax=0\n' > /run/systemd/system/mrd.service.d/no-store.conf
systemctl daemon-reload
restart_check 'with its content'
cold=$restart_rc
[ $cold != 0 ] && grep -q 'Stale file handle' /tmp/restart.out
result "without FileDescriptorStoreMax= the same check fails (cold start, -ESTALE)" $? \
	"$(cat /tmp/restart.out)"
rm /run/systemd/system/mrd.service.d/no-store.conf
systemctl daemon-reload
systemctl restart mrd
mrd_answers

# ---- the journal
journalctl -u mrd.service -o cat --no-pager | grep -q 'SIGHUP: configuration reloaded'
result "journalctl -u mrd shows mrd's lines" $? "$(journalctl -u mrd.service -o cat --no-pager | tail -n 3)"

# ---- D-Bus on the system bus, with the installed policy
out=$(busctl introspect org.mrd.Mrd1 /org/mrd/Mrd1 2>&1)
echo "$out" | grep -q '^\.Dump'
result "busctl introspect org.mrd.Mrd1 /org/mrd/Mrd1 (root)" $? "$(echo "$out" | head -n 5)"
out=$(busctl call org.mrd.Mrd1 /org/mrd/Mrd1 org.mrd.Mrd1 Dump 2>&1)
echo "$out" | grep -q '\\"domains\\":\['
result "busctl call ... Dump (root)" $? "$(echo "$out" | cut -c 1-200)"
out=$(as alice busctl get-property org.mrd.Mrd1 /org/mrd/Mrd1 org.mrd.Mrd1 Version 2>&1)
result "alice reads a property (the policy lets anyone)" $? "$out"
out=$(as alice busctl call org.mrd.Mrd1 /org/mrd/Mrd1 org.mrd.Mrd1 Dump 2>&1)
rc=$?
[ $rc != 0 ] && echo "$out" | grep -qi 'access denied'
result "alice's Dump is refused by the policy" $? "rc=$rc: $out"

# ---- hardening: the score, and the verbs provider working inside it (rxe). ib_uverbs is loaded
# before mrd starts: DeviceAllow=char-infiniband_verbs resolves the group of /proc/devices then,
# and rdma_rxe alone does not pull it in. ib_core keeps each device to one network namespace
# (ib_core.netns_mode=0 on the kernel's command line: exclusive), the hardest setting a host may
# have: mrd must be in the host's.
score=$(systemd-analyze security --no-pager mrd.service 2>&1 |
	sed -n 's/.*Overall exposure level for mrd.service: \([0-9.]*\).*/\1/p')
echo "@@ SCORE $score" | tee /dev/ttyS1
[ -n "$score" ] && [ "$(awk "BEGIN { print ($score <= 1.7) }")" = 1 ]
result "systemd-analyze security mrd.service: $score" $? "exposure ${score:-unknown}, want at most 1.7"
modprobe -a ib_uverbs rdma_rxe &&
	rdma link add rxe0 type rxe netdev lo && rdma system show | grep -q 'netns exclusive'
rxe=$?
result "rdma_rxe and ib_uverbs loaded, rxe0 on lo, RDMA netns exclusive" $rxe "$(rdma system show 2>&1)"
if [ $rxe = 0 ]; then
	printf '[mrd]\nprovider = verbs\ndevice = rxe0\n' > /etc/mrd/mrd.conf.d/60-verbs.conf
	systemctl restart mrd && mrd_answers
	st=$(mrctl --json status)
	echo "$st" | grep -q '"provider":"verbs"' && echo "$st" | grep -q '"device":"rxe0"'
	result "the hardened mrd serves rxe0 with the verbs provider" $? \
		"$(echo "$st" | cut -c 1-300) $(journalctl -u mrd.service -o cat --no-pager | grep -v 'mrd.service' | tail -n 6)"
	out=$(as alice mrd-demo 2>&1)
	echo "$out" | grep -q 'RDMA write of 64 bytes: done'
	result "mrd-demo on rxe0: the device writes by keys" $? "$(echo "$out" | tail -n 4)"
	restart_check 'with its content'
	result "warm restart on rxe0" $restart_rc "$(cat /tmp/restart.out)"
	# mrd-cdi.service (mrd.service wants it) wrote the CDI spec once mrd was ready; a device
	# that comes is in it after systemctl reload mrd (what 71-mrd-cdi.rules runs; no udevd
	# here), one that goes is out. Polled: the reload of mrd-cdi.service follows mrd's.
	spec=/run/cdi/mrd.yaml
	grep -q '^- name: "rxe0"$' $spec && grep -q '^    - path: "/dev/infiniband/uverbs0"$' $spec
	result "mrd-cdi.service wrote $spec with rxe0 and its uverbs node" $? \
		"$(cat $spec 2>&1 | grep -v '^#' | tail -n 8) $(systemctl status --no-pager mrd-cdi.service 2>&1 | tail -n 3)"
	add=$( (modprobe dummy && ip link add mrdcdi0 type dummy && ip link set mrdcdi0 up &&
		rdma link add rxe1 type rxe netdev mrdcdi0 && systemctl reload mrd) 2>&1)
	rc=$?
	for _ in $(seq 100); do grep -q '^- name: "rxe1"$' $spec && break; sleep 0.1; done
	grep -q '^- name: "rxe1"$' $spec
	result "a device that comes: systemctl reload mrd puts rxe1 in the spec" $? \
		"rc=$rc $add; $(grep -v '^#' $spec 2>&1 | tail -n 6) $(journalctl -u mrd-cdi.service -o cat --no-pager | tail -n 3) $(journalctl -u mrd.service -o cat --no-pager | tail -n 3)"
	[ $rc = 0 ] && rdma link delete rxe1 && systemctl reload mrd
	for _ in $(seq 100); do grep -q '^- name: "rxe1"$' $spec || break; sleep 0.1; done
	[ $rc = 0 ] && ! grep -q '^- name: "rxe1"$' $spec && grep -q '^- name: "rxe0"$' $spec &&
		[ "$(systemctl is-active mrd-cdi.service)" = active ]
	result "a device that goes: out of the spec, rxe0 stays, mrd-cdi.service active" $? \
		"$(grep -v '^#' $spec 2>&1 | tail -n 6) $(journalctl -u mrd-cdi.service -o cat --no-pager | tail -n 3)"
	ip link delete mrdcdi0 2> /dev/null
fi
refused=$(journalctl -u mrd.service -o cat --no-pager | grep -c 'Operation not permitted')
result "the system-call filter refused mrd nothing" $([ "$refused" = 0 ]; echo $?) \
	"$(journalctl -u mrd.service -o cat --no-pager | grep 'Operation not permitted' | tail -n 3)"
if [ $rxe = 0 ]; then
	# Why mrd.service has no PrivateNetwork=: in a namespace of its own mrd finds no device, and
	# says why.
	mkdir -p /etc/systemd/system/mrd.service.d
	printf '[Service]\nPrivateNetwork=yes\nRestart=no\n' > /etc/systemd/system/mrd.service.d/60-netns.conf
	systemctl daemon-reload
	hint='RDMA device(s) hidden from mrd'
	before=$(journalctl -u mrd.service -o cat --no-pager | grep -c "$hint")
	systemctl restart mrd > /dev/null 2>&1
	rc=$?
	for _ in $(seq 50); do # the journal catches up
		log=$(journalctl -u mrd.service -o cat --no-pager)
		[ "$(echo "$log" | grep -c "$hint")" -gt "$before" ] && break
		sleep 0.2
	done
	[ $rc != 0 ] && [ "$(echo "$log" | grep -c "$hint")" -gt "$before" ]
	result "with PrivateNetwork=yes mrd finds no device in exclusive mode, and says why" $? \
		"restart rc=$rc: $(echo "$log" | tail -n 4)"
	rm /etc/systemd/system/mrd.service.d/60-netns.conf
	systemctl daemon-reload
	systemctl reset-failed mrd.service
	rm /etc/mrd/mrd.conf.d/60-verbs.conf
	systemctl start mrd && mrd_answers
	result "mrd serves again without the drop-in" $?
fi

# ---- metrics: mrd-metrics.timer's service writes the file node-exporter's textfile collector
# reads, root's whole view, in its own sandbox
f=/var/lib/prometheus/node-exporter/mrd.prom
systemctl start mrd-metrics.service
cond=$(systemctl show -P ConditionResult mrd-metrics.service)
[ "$cond" = no ] && [ ! -e $f ] && [ "$(systemctl is-failed mrd-metrics.service)" != failed ]
result "without node-exporter's folder mrd-metrics.service is skipped, not failed" $? \
	"ConditionResult $cond, $(systemctl is-failed mrd-metrics.service)"
# README's Running block enabled the timer: without the folder it did not start.
[ "$(systemctl show -P ConditionResult mrd-metrics.timer)" = no ] &&
	[ "$(systemctl show -P ConditionTimestampMonotonic mrd-metrics.timer)" != 0 ] &&
	[ "$(systemctl is-active mrd-metrics.timer)" != active ]
result "without node-exporter's folder mrd-metrics.timer does not tick" $? \
	"$(systemctl status --no-pager mrd-metrics.timer 2>&1 | head -n 4)"
mkdir -p /var/lib/prometheus/node-exporter
as alice $VMDIR/mrd-restart /run/mrd/mrd.sock 60 > /tmp/holder.out 2>&1 &
holder=$!
for _ in $(seq 100); do grep -q '^ready' /tmp/holder.out && break; sleep 0.1; done
systemctl enable --now mrd-metrics.timer
for _ in $(seq 150); do [ -s $f ] && break; sleep 0.2; done
out=$(promtool check metrics < $f 2>&1)
result "mrd-metrics.timer runs mrd-metrics.service: $f passes promtool check metrics" $? \
	"$out $(systemctl status --no-pager mrd-metrics.service 2>&1 | tail -n 4)"
grep -q '^mrd_domain_pinned_bytes{domain="[^"]*"} 4194304$' $f && [ "$(stat -c %a $f)" = 644 ]
result "the file (0644) holds alice's 4 MiB pinned" $? "$(stat -c %a $f 2>&1): $(grep '^mrd_domain_pinned' $f)"
kill $holder 2> /dev/null
wait $holder 2> /dev/null

# ---- RDMA in unprivileged containers, through mrd's CDI device (podman, rootful and rootless)
. $VMDIR/container-check.sh
container_checks
finish
