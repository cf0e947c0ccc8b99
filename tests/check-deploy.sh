#!/bin/sh
# deploy/kubernetes: the manifests parse as Kubernetes objects, the DaemonSet has what mrd needs
# (the host's PID namespace, the unit's capability set, node-critical priority, the host paths
# the CDI spec names), every mount has its volume, the scripts are valid sh, and mrd starts
# with the ConfigMap's mrd.conf.
set -u
python3 -c 'import yaml' 2> /dev/null || { echo "SKIP: no python3-yaml (Debian: python3-yaml)"; exit 77; }
dir=$(mktemp -d /tmp/mrd-deploy-test.XXXXXX)
pid=
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
python3 - "$MRD_SRCDIR/deploy/kubernetes" "$dir" <<'PY' || fail "the manifests (above)"
import os, sys, yaml
src, out = sys.argv[1], sys.argv[2]
bad = []
docs = {}
for f in ("mrd.yaml", "example-pod.yaml"):
    for d in yaml.safe_load_all(open(os.path.join(src, f))):
        for k in ("apiVersion", "kind", "metadata"):
            if k not in d:
                bad.append("%s: an object has no %s" % (f, k))
        docs[d["kind"]] = d
cm, ds, pod = docs["ConfigMap"], docs["DaemonSet"], docs["Pod"]
open(os.path.join(out, "mrd.conf"), "w").write(cm["data"]["mrd.conf"])
spec = ds["spec"]["template"]["spec"]
if ds["spec"]["selector"]["matchLabels"].items() - ds["spec"]["template"]["metadata"]["labels"].items():
    bad.append("the selector does not match the pods' labels")
if spec.get("hostPID") is not True:
    bad.append("no hostPID: mrd cannot read its clients' /proc/PID")
if spec.get("priorityClassName") != "system-node-critical":
    bad.append("not node-critical: no oom_score_adj like the unit's -900")
volumes = {v["name"]: v for v in spec["volumes"]}
host = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
for p in ("/run/mrd", "/var/run/cdi", "/dev/infiniband"):
    if p not in host:
        bad.append("no host path %s" % p)
containers = {c["name"]: c for c in spec["containers"] + spec["initContainers"]}
for c in containers.values():
    for m in c.get("volumeMounts", []):
        if m["name"] not in volumes:
            bad.append("%s mounts %s, which is no volume" % (c["name"], m["name"]))
    if c["command"][0] == "/bin/sh":
        open(os.path.join(out, c["name"] + ".sh"), "w").write(c["command"][-1])
mrd = containers["mrd"]
if mrd["command"][:2] != ["nsenter", "--cgroup=/proc/1/ns/cgroup"]:
    bad.append("mrd does not enter the host's cgroup namespace: pods would read as '/../...'")
if "/host/sys/fs/cgroup" not in [m["mountPath"] for m in mrd.get("volumeMounts", [])]:
    bad.append("mrd does not see the host's cgroup hierarchy")
if "--bounding-set=-all,+ipc_lock" not in mrd["command"]:
    bad.append("mrd keeps more than CAP_IPC_LOCK, the unit's CapabilityBoundingSet")
if "resources" in mrd and "memory" in mrd["resources"].get("limits", {}):
    bad.append("mrd has a memory limit")
# The shim: copied to the host path the cdi sidecar names with --preload.
shim = "/opt/mrd/lib/libmrd-preload.so"
if shim not in containers["install-shim"]["command"][-1] or \
        "--preload %s --output /var/run/cdi/mrd.yaml" % shim not in containers["cdi"]["command"][-1]:
    bad.append("the shim installed and the shim in the spec differ")
if pod["metadata"]["annotations"].get("cdi.k8s.io/mrd") != "mrd/rdma=all":
    bad.append("the example pod does not ask for mrd/rdma=all")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
for s in "$dir"/*.sh; do
	sh -n "$s" || fail "$(basename "$s" .sh)'s script is not valid sh"
done
# The ConfigMap's mrd.conf, as mrd reads it (the socket moved into the test's folder).
"$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/mrd.conf" --socket "$dir/mrd.sock" \
	--log-level warning > "$dir/log" 2>&1 &
pid=$!
# Waits for mrd are 20 s at most (400 x 0.05 s): a loaded machine starts it slowly.
for _ in $(seq 400); do
	[ -S "$dir/mrd.sock" ] && break
	kill -0 $pid 2> /dev/null || break
	sleep 0.05
done
"$MRD_BUILDDIR/mrctl" -s "$dir/mrd.sock" status > /dev/null 2>&1 ||
	fail "mrd does not run with the ConfigMap's mrd.conf: $(cat "$dir/log")"
[ "$(stat -c %a "$dir/mrd.sock")" = 666 ] || fail "the socket is $(stat -c %a "$dir/mrd.sock"), not 0666"
echo "deploy/kubernetes: the manifests parse and hold what mrd needs; mrd runs with the ConfigMap"
