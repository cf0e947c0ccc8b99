#!/bin/sh
# mrd on a private system bus with the project's policy: properties for anyone; Dump, Flush and
# SetPoolSettings for root alone; errors for bad arguments; no bus or --no-bus: the socket serves.
set -u
for tool in dbus-daemon busctl setpriv; do
	command -v "$tool" >/dev/null 2>&1 || { echo "not run: no $tool (Debian dbus-daemon, systemd, util-linux)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "not run: needs root (the policy gives root the name)"; exit 77; }

dir=$(mktemp -d /tmp/mrd-bus-test.XXXXXX)
chmod 0755 "$dir"
bus_pid= mrd_pid=
cleanup() {
	[ -n "$mrd_pid" ] && kill "$mrd_pid" 2>/dev/null && wait "$mrd_pid" 2>/dev/null
	[ -n "$bus_pid" ] && kill "$bus_pid" 2>/dev/null && wait "$bus_pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/log" ] && cat "$dir/log"; exit 1; }

# The defaults of Debian's system bus (deny method calls unless a policy allows them), and ours.
cat > "$dir/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$dir/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>
  <include>$MRD_SRCDIR/dbus/org.mrd.Mrd1.conf</include>
</busconfig>
CONF
dbus-daemon --config-file="$dir/bus.conf" --nofork > "$dir/bus.log" 2>&1 &
bus_pid=$!
# Waits are 20 s at most (400 x 0.05 s): a loaded machine starts the bus and mrd slowly.
for _ in $(seq 400); do [ -S "$dir/bus" ] && break; sleep 0.05; done
[ -S "$dir/bus" ] || { cat "$dir/bus.log"; fail "dbus-daemon did not start"; }
addr="unix:path=$dir/bus"
export DBUS_SYSTEM_BUS_ADDRESS="$addr"
bctl() { busctl --address="$addr" "$@"; }
obj="org.mrd.Mrd1 /org/mrd/Mrd1 org.mrd.Mrd1"

# nobody runs mrd-demo below: a socket anyone may use.
printf '[mrd]\nsocket_mode = 0666\n[memory]\nhugepages = no\n' > "$dir/mrd.conf"
"$MRD_BUILDDIR/mrd" --foreground --provider soft --config "$dir/mrd.conf" \
	--socket "$dir/mrd.sock" > "$dir/log" 2>&1 &
mrd_pid=$!
for _ in $(seq 400); do
	bctl get-property $obj Version > "$dir/out" 2>/dev/null && break
	sleep 0.05
done
version=$("$MRD_BUILDDIR/mrd" --version | awk '{print $2}')
grep -qx "s \"$version\"" "$dir/out" || fail "Version: $(cat "$dir/out")"
[ "$(bctl get-property $obj Provider)" = 's "soft"' ] || fail "Provider"

# A client frees 1 MiB and allocates it again (mrd-demo); while it is connected, Dump shows its
# domain with the pool hit. mrd-demo runs $MRD_DEMO_MRCTL: here, a Dump over the bus.
cat > "$dir/dump.sh" <<DUMP
#!/bin/sh
case "\$*" in *pools*) busctl --address="$addr" call $obj Dump | sed 's/\\\\"/"/g' > "$dir/dump"
	busctl --address="$addr" get-property $obj Generations > "$dir/generations"
	setpriv --reuid=65534 --regid=65534 --clear-groups busctl --address="$addr" \
		get-property $obj Generations Domains Clients AllocatedBytes PinnedBytes Requests \
		> "$dir/generations-nobody" ;; esac
DUMP
chmod +x "$dir/dump.sh"
MRD_DEMO_MRCTL="$dir/dump.sh" "$MRD_BUILDDIR/mrd-demo" "$dir/mrd.sock" > "$dir/demo" 2>&1 ||
	{ cat "$dir/demo"; fail "mrd-demo"; }
for want in '"domains":[{"name":"uid-0","clients":2' '"pools_off":"","quarantine":{"on":false,"parked":0,"unparked":0}' '"pages":256,"queued":0,"in_use":2,"max_in_use":2,"hits":1,"misses":2'; do
	grep -qF "$want" "$dir/dump" || fail "Dump lacks $want: $(cat "$dir/dump")"
done
[ "$(cat "$dir/generations")" = 'a{st} 1 "uid-0" 2' ] || fail "Generations: $(cat "$dir/generations")"
# Another user does not learn that uid 0 uses mrd, nor how much: its figures are its own.
[ "$(cat "$dir/generations-nobody" | tr '\n' ' ')" = 'a{st} 0 u 0 u 0 t 0 t 0 t 0 ' ] ||
	fail "nobody's properties: $(cat "$dir/generations-nobody")"
[ "$(bctl get-property $obj Generations)" = 'a{st} 0' ] || fail "Generations after the demo"
[ "$(bctl get-property $obj Domains)" = 'u 0' ] || fail "Domains after the demo"

# Root may flush and set; bad arguments are errors that say why.
[ "$(bctl call $obj Flush sbb "" true true)" = 'utu 0 0 0' ] || fail "Flush"
bctl call $obj Flush sbb nobody false false > "$dir/out" 2>&1 && fail "Flush of an unknown domain"
grep -q 'no domain nobody is open' "$dir/out" || fail "Flush error: $(cat "$dir/out")"
for scope in uid:4294967296 uid:0junk 'uid: 0' uid:; do
	bctl call $obj Flush sbb "$scope" false false > "$dir/out" 2>&1 && fail "Flush of $scope"
	grep -q 'bad uid' "$dir/out" || fail "Flush $scope: $(cat "$dir/out")"
done
bctl call $obj Flush sbb uid:0 false false > "$dir/out" 2>&1 # parsed: uid 0's domain, closed
grep -q 'no domain uid-0 is open' "$dir/out" || fail "Flush uid:0: $(cat "$dir/out")"
[ "$(bctl call $obj SetPoolSettings 'sa{sv}a{sv}' "" 0 2 aging u 5 pinned u 1)" = 'u 0' ] ||
	fail "SetPoolSettings"
bctl call $obj SetPoolSettings 'sa{sv}a{sv}' "" 0 0 > "$dir/out" 2>&1 && fail "nothing to set"
grep -q 'nothing to set' "$dir/out" || fail "SetPoolSettings error: $(cat "$dir/out")"
bctl call $obj SetPoolSettings 'sa{sv}a{sv}' "" 1 size u 1 1 aging u 5 > "$dir/out" 2>&1 &&
	fail "an unknown key"
grep -q "unknown key 'size'" "$dir/out" || fail "unknown key: $(cat "$dir/out")"
bctl call $obj SetPoolSettings 'sa{sv}a{sv}' "" 0 1 aging t 5 > "$dir/out" 2>&1 && fail "a t aging"
grep -q "'aging' has the wrong type" "$dir/out" || fail "wrong type: $(cat "$dir/out")"

# Anyone else: properties yes, methods no.
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups busctl --address="$addr" "$@"; }
[ "$(as_nobody get-property $obj Version)" = "s \"$version\"" ] || fail "nobody's Version"
for call in "Dump" "Flush sbb '' false false"; do
	eval as_nobody call $obj $call > "$dir/out" 2>&1 && fail "nobody called $call"
	grep -qi 'denied' "$dir/out" || fail "nobody's $call: $(cat "$dir/out")"
done
# Review: root in a container (a pid namespace of its own) with the bus socket is no admin here
# either: the policy lets uid 0 call, mrd refuses.
for call in "Dump" "Flush sbb '' false false" "SetPoolSettings 'sa{sv}a{sv}' '' 0 1 aging u 5"; do
	# busctl as pid 1 would log its error to the kernel's ring: a shell is pid 1
	eval unshare --pid --fork sh -c "'busctl \"\$@\"; exit \$?'" sh --address="$addr" \
		call $obj $call > "$dir/out" 2>&1 &&
		fail "root in a container called $call: $(cat "$dir/out")"
	grep -qi denied "$dir/out" || fail "root in a container's $call: $(cat "$dir/out")"
done
# ... and Generations shows nobody its own domain, while it has one: mrd-demo run as nobody
# (copied where nobody may run it) reads it through its hook.
mkdir -m 0777 "$dir/nobody"
cp "$MRD_BUILDDIR/.libs/mrd-demo" "$MRD_BUILDDIR/.libs/libmrd.so.0" "$dir/nobody/"
cat > "$dir/nobody/gen.sh" <<GEN
#!/bin/sh
case "\$*" in *pools*) busctl --address="$addr" get-property $obj Generations Domains Clients \
	AllocatedBytes PinnedBytes > "$dir/nobody/gen" ;; esac
GEN
chmod 0755 "$dir/nobody/gen.sh"
setpriv --reuid=65534 --regid=65534 --clear-groups env LD_LIBRARY_PATH="$dir/nobody" \
	MRD_DEMO_MRCTL="$dir/nobody/gen.sh" "$dir/nobody/mrd-demo" "$dir/mrd.sock" > "$dir/out" 2>&1 ||
	fail "mrd-demo as nobody: $(cat "$dir/out")"
[ "$(cat "$dir/nobody/gen" | tr '\n' ' ')" = 'a{st} 1 "uid-65534" 2 u 1 u 2 t 2097152 t 2097152 ' ] ||
	fail "nobody's own Generations: $(cat "$dir/nobody/gen")"
kill "$mrd_pid"; wait "$mrd_pid"; mrd_pid=

# --no-bus: the name stays free. No bus at all: a warning, and the socket serves.
"$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/mrd.conf" --socket "$dir/mrd.sock" \
	> "$dir/log" 2>&1 &
mrd_pid=$!
for _ in $(seq 400); do [ -S "$dir/mrd.sock" ] && break; sleep 0.05; done
bctl get-property $obj Version > /dev/null 2>&1 && fail "--no-bus took the name"
kill "$mrd_pid"; wait "$mrd_pid"; mrd_pid=
DBUS_SYSTEM_BUS_ADDRESS="unix:path=$dir/nothing" "$MRD_BUILDDIR/mrd" --foreground \
	--config "$dir/mrd.conf" --socket "$dir/mrd.sock" > "$dir/log" 2>&1 &
mrd_pid=$!
for _ in $(seq 400); do [ -S "$dir/mrd.sock" ] && break; sleep 0.05; done
"$MRD_BUILDDIR/mrctl" --socket "$dir/mrd.sock" status > "$dir/out" 2>&1 || fail "status without a bus"
grep -q 'bus: no system bus' "$dir/log" || fail "no warning without a bus"
echo "bus: properties, Dump, Flush, SetPoolSettings, policy, --no-bus and no bus all as documented"
