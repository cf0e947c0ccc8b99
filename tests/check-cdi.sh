#!/bin/sh
# mrctl cdi on a live mrd (the soft provider: no RDMA device): the CDI spec mounts the socket's
# folder and the shim read-only, sets LD_PRELOAD and MRD_SOCKET, offers the device "all" (no
# device node here), and holds only what podman 4.3.1's CDI reader (v0.5, strict) accepts;
# --output replaces its file whole or leaves it be; the failures say why.
set -u
dir=$(mktemp -d /tmp/mrd-cdi-test.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
printf '[memory]\nhugepages = no\n' > "$dir/mrd.conf"
"$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/mrd.conf" --socket "$dir/mrd.sock" \
	--log-level warning > "$dir/log" 2>&1 &
pid=$!
# Waits for mrd are 20 s at most (400 x 0.05 s): a loaded machine starts it slowly.
for _ in $(seq 400); do [ -S "$dir/mrd.sock" ] && break; sleep 0.05; done
shim=$MRD_BUILDDIR/.libs/libmrd-preload.so
[ -f "$shim" ] || fail "no $shim: build it first"
mrctl() { "$MRD_BUILDDIR/mrctl" -s "$dir/mrd.sock" "$@"; }

mrctl cdi --preload "$shim" > "$dir/spec" 2> "$dir/err" || fail "mrctl cdi: $(cat "$dir/err")"
# The lines that matter, in order (comments and the rest may come between).
grep -v '^ *#' "$dir/spec" > "$dir/lines"
cat > "$dir/want" <<EOF
cdiVersion: "0.3.0"
kind: "mrd/rdma"
containerEdits:
  env:
  - "LD_PRELOAD=$shim"
  mounts:
  - hostPath: "$dir"
    containerPath: "$dir"
    options:
    - "ro"
    - "nosuid"
    - "nodev"
    - "noexec"
    - "bind"
  - hostPath: "$shim"
    containerPath: "$shim"
    options:
    - "ro"
    - "nosuid"
    - "nodev"
    - "bind"
devices:
- name: "all"
  containerEdits:
    env:
    - "MRD_SOCKET=$dir/mrd.sock"
EOF
diff -u "$dir/want" "$dir/lines" > "$dir/diff" || fail "the spec is not as expected: $(cat "$dir/diff")"

# What podman 4.3.1 (Debian 12) reads: CDI v0.5.x, sigs.k8s.io/yaml UnmarshalStrict (an unknown
# key fails the whole spec: deviceNodes' hostPath broke podman 4.2, additionalGids 4.9), spec
# versions 0.1.0-0.3.0, and a device with no edits is refused ("empty device edits").
if python3 -c 'import yaml' 2> /dev/null; then
	python3 - "$dir/spec" <<'PY' || fail "the spec breaks CDI v0.5's rules (above)"
import re, sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
bad = []
def keys(obj, allowed, where):
    if not isinstance(obj, dict):
        bad.append("%s is not a mapping" % where)
        return {}
    for k in obj:
        if k not in allowed:
            bad.append("%s has %r, which CDI v0.5 does not know" % (where, k))
    return obj
def edits(e, where):
    e = keys(e, {"env", "deviceNodes", "hooks", "mounts"}, where)
    for s in e.get("env", []):
        if not isinstance(s, str) or "=" not in s:
            bad.append("%s: env %r" % (where, s))
    for n in e.get("deviceNodes", []):
        keys(n, {"path", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"},
             where + " deviceNode")
        if not str(n.get("path", "")).startswith("/"):
            bad.append("%s: deviceNode path %r" % (where, n.get("path")))
    for m in e.get("mounts", []):
        keys(m, {"hostPath", "containerPath", "options"}, where + " mount")
        for k in ("hostPath", "containerPath"):
            if not str(m.get(k, "")).startswith("/"):
                bad.append("%s: mount %s %r" % (where, k, m.get(k)))
    return e
keys(spec, {"cdiVersion", "kind", "containerRuntime", "devices", "containerEdits"}, "the spec")
if spec.get("cdiVersion") not in ("0.1.0", "0.2.0", "0.3.0"):
    bad.append("cdiVersion %r: podman 4.3.1 reads 0.1.0 to 0.3.0" % spec.get("cdiVersion"))
if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*", spec.get("kind", "")):
    bad.append("kind %r" % spec.get("kind"))
edits(spec.get("containerEdits", {}), "the spec's containerEdits")
names = set()
for d in spec.get("devices", []):
    keys(d, {"name", "containerEdits"}, "a device")
    name = d.get("name", "")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*", name) or name in names:
        bad.append("device name %r" % name)
    names.add(name)
    if not any(edits(d.get("containerEdits", {}), "device %s" % name).values()):
        bad.append("device %s has empty edits" % name)
if "all" not in names:
    bad.append("no device all")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
else
	echo "no python3-yaml: the spec's structure is checked by its lines alone"
fi

# --output: the same spec, mode 0644, replaced whole (a new inode), nothing left beside it;
# "-" is standard output.
mkdir "$dir/cdi"
mrctl cdi --preload "$shim" --output "$dir/cdi/mrd.yaml" || fail "cdi --output"
cmp -s "$dir/spec" "$dir/cdi/mrd.yaml" || fail "--output wrote another spec"
[ "$(stat -c %a "$dir/cdi/mrd.yaml")" = 644 ] || fail "mode $(stat -c %a "$dir/cdi/mrd.yaml")"
ino=$(stat -c %i "$dir/cdi/mrd.yaml")
mrctl cdi --preload "$shim" --output "$dir/cdi/mrd.yaml" || fail "cdi --output, again"
[ "$(stat -c %i "$dir/cdi/mrd.yaml")" != "$ino" ] || fail "the file was written in place, not replaced"
[ "$(ls "$dir/cdi")" = mrd.yaml ] || fail "left beside it: $(ls "$dir/cdi")"
mrctl cdi --preload "$shim" --output - | cmp -s "$dir/spec" - || fail "--output - is not the spec"

# Failures write nothing and say why: mrd away, no shim, a relative socket path, a link.
"$MRD_BUILDDIR/mrctl" -s "$dir/absent.sock" cdi --preload "$shim" --output "$dir/cdi/mrd.yaml" \
	2> "$dir/err" && fail "cdi with mrd away succeeded"
grep -q 'absent.sock' "$dir/err" || fail "the error does not name the socket: $(cat "$dir/err")"
mrctl cdi --preload "$dir/no-shim.so" --output "$dir/cdi/mrd.yaml" 2> "$dir/err" &&
	fail "cdi with no shim succeeded"
grep -q 'no-shim.so: No such file' "$dir/err" || fail "the error does not say why: $(cat "$dir/err")"
(cd "$dir" && "$MRD_BUILDDIR/mrctl" -s mrd.sock cdi --preload "$shim" > /dev/null 2> "$dir/err") &&
	fail "cdi with a relative socket path succeeded"
grep -q 'absolute' "$dir/err" || fail "the error does not say why: $(cat "$dir/err")"
ln -s "$dir/spec" "$dir/cdi/link.yaml"
mrctl cdi --preload "$shim" --output "$dir/cdi/link.yaml" 2> "$dir/err" &&
	fail "--output over a symbolic link succeeded"
grep -q 'not a regular file' "$dir/err" || fail "the error does not say why: $(cat "$dir/err")"
cmp -s "$dir/spec" "$dir/cdi/mrd.yaml" || fail "a failed run changed the file"
[ "$(ls "$dir/cdi" | tr '\n' ' ')" = "link.yaml mrd.yaml " ] || fail "the failures left: $(ls "$dir/cdi")"
mrctl status --preload "$shim" 2> /dev/null && fail "--preload accepted outside cdi"
echo "cdi: the spec's lines as expected, CDI v0.5's keys only, --output atomic, failures say why"
