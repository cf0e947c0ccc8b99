#!/bin/sh
# mrctl stats --prometheus and --openmetrics on a live mrd: promtool check metrics passes on the
# one, prometheus_client's OpenMetrics parser takes the other, both say what mrctl --json says,
# and --output replaces its file whole or leaves it be.
set -u
command -v promtool > /dev/null || { echo "SKIP: no promtool (Debian: prometheus)"; exit 77; }
py=/usr/bin/python3 # Debian's, with python3-prometheus-client
$py -c 'import prometheus_client.openmetrics.parser' 2> /dev/null ||
	{ echo "SKIP: no prometheus_client for $py (Debian: python3-prometheus-client)"; exit 77; }
dir=$(mktemp -d /tmp/mrd-metrics-test.XXXXXX) && chmod 0755 "$dir" # nobody connects too
trap 'kill $holder $pid 2>/dev/null; wait $holder $pid 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# The test's user administers this mrd (root does anyway); anyone may connect, for the view of
# one who does not.
printf '[mrd]\nadmin_group = %s\nsocket_mode = 0666\n[memory]\nhugepages = no\n' "$(id -gn)" \
	> "$dir/mrd.conf"
"$MRD_BUILDDIR/mrd" --foreground --no-bus --config "$dir/mrd.conf" --socket "$dir/mrd.sock" \
	--log-level warning > "$dir/log" 2>&1 &
pid=$!
holder=
# Waits for mrd are 20 s at most (400 x 0.05 s): a loaded machine starts it slowly.
for _ in $(seq 400); do [ -S "$dir/mrd.sock" ] && break; sleep 0.05; done
mrctl() { "$MRD_BUILDDIR/mrctl" -s "$dir/mrd.sock" "$@"; }
# A client that keeps 4 MiB registered (its domain stays open), and the demo's lookups.
"$MRD_BUILDDIR/examples/mrd-restart" "$dir/mrd.sock" 60 > "$dir/holder" 2>&1 &
holder=$!
for _ in $(seq 400); do grep -q '^ready' "$dir/holder" && break; sleep 0.05; done
grep -q '^ready' "$dir/holder" || fail "mrd-restart: $(cat "$dir/holder")"
"$MRD_BUILDDIR/mrd-demo" "$dir/mrd.sock" > "$dir/demo" 2>&1 || fail "mrd-demo: $(cat "$dir/demo")"

mrctl stats --prometheus > "$dir/prom" || fail "mrctl stats --prometheus"
out=$(promtool check metrics < "$dir/prom" 2>&1) || fail "promtool check metrics: $out"
mrctl stats --openmetrics > "$dir/om" || fail "mrctl stats --openmetrics"
mrctl --json clients > "$dir/clients.json" || fail "mrctl --json clients"
# Both parsed; every family of one is in the other; the figures are those of --json.
$py - "$dir/om" "$dir/prom" "$dir/clients.json" <<'PY' || fail "the parsed metrics (above)"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as prom_parse

om = {f.name: f for f in om_parse(open(sys.argv[1]).read())}  # raises without "# EOF"
prom = {f.name: f for f in prom_parse(open(sys.argv[2]).read())}
domain = json.load(open(sys.argv[3]))["domains"][0]
bad = []
def value(fams, name, **labels):
    for s in fams[name].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created"):
            return s.value
    bad.append("no sample of %s %s" % (name, labels))
for name in ("mrd_requests", "mrd_domain_lookups", "mrd_pool_hits"):
    if om[name].type != "counter" or not om[name].samples[0].name.endswith("_total"):
        bad.append("%s is not a counter sampled as _total" % name)
if om["mrd_domain_pinned_bytes"].unit != "bytes":
    bad.append("mrd_domain_pinned_bytes has no unit bytes")
if om["mrd_build"].type != "info":
    bad.append("mrd_build is not an info metric")
# Prometheus 0.0.4 has no info type: the family is the gauge mrd_build_info.
prom_names = {n[:-5] if n == "mrd_build_info" else n for n in prom}
if set(om) != prom_names:
    bad.append("the formats' families differ: %s" % sorted(set(om) ^ prom_names))
d = domain["name"]
for name, key in (("mrd_domain_allocated_bytes", "allocated_bytes"),
                  ("mrd_domain_pinned_bytes", "pinned_bytes"), ("mrd_domain_mrs", "mrs"),
                  ("mrd_domain_lookups", "lookups"), ("mrd_domain_lookup_misses", "misses"),
                  ("mrd_domain_quota_pinned_bytes", "quota"), ("mrd_domain_clients", "clients")):
    want = domain["quota"]["pinned_bytes"] if key == "quota" else domain[key]
    for fams in (om, prom):
        got = value(fams, name, domain=d)
        if got != want:
            bad.append("%s{domain=%s} is %s, mrctl --json says %s" % (name, d, got, want))
if domain["pinned_bytes"] < 4 << 20 or domain["lookups"] == 0:
    bad.append("the domain shows no pinned memory or lookups: %s" % domain)
if sum(s.value for s in om["mrd_pool_hits"].samples if s.name.endswith("_total")) < 1:
    bad.append("no pool hit although mrd-demo's second 1 MiB took a parked handle")
if bad:
    print("\n".join(bad))
sys.exit(1 if bad else 0)
PY

# One who is neither root nor in the admin group: no daemon-wide counters, no other domain.
nobody() { setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$@"; }
if [ "$(id -u)" != 0 ] || ! command -v setpriv > /dev/null || ! getent passwd nobody > /dev/null; then
	echo "not root, or no setpriv or user nobody: the view of one who is not an administrator is not checked"
elif cp "$MRD_BUILDDIR/mrctl" "$dir/mrctl" && ! nobody "$dir/mrctl" --help > /dev/null 2>&1; then
	echo "nobody cannot run mrctl from $dir: the view of one who is not an administrator is not checked"
else
	nobody "$dir/mrctl" -s "$dir/mrd.sock" stats --openmetrics > "$dir/om-nobody" 2> "$dir/err" ||
		fail "mrctl stats --openmetrics as nobody: $(cat "$dir/err")"
	grep -q '^mrd_clients ' "$dir/om-nobody" || fail "nobody sees no mrd_clients: $(head "$dir/om-nobody")"
	grep -q '^mrd_requests_total' "$dir/om-nobody" && fail "nobody sees the daemon-wide requests"
	grep -q 'domain="' "$dir/om-nobody" && fail "nobody sees a domain: $(grep 'domain="' "$dir/om-nobody" | head -n 3)"
	$py -c 'import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as p
list(p(open(sys.argv[1]).read()))' "$dir/om-nobody" || fail "nobody's view does not parse"
fi

# --output: replaced whole, 0644, nothing left beside it; a failure leaves the old file.
mkdir "$dir/textfile"
mrctl stats --prometheus --output "$dir/textfile/mrd.prom" || fail "--output"
[ "$(stat -c %a "$dir/textfile/mrd.prom")" = 644 ] || fail "mode $(stat -c %a "$dir/textfile/mrd.prom")"
[ "$(ls "$dir/textfile")" = mrd.prom ] || fail "left beside it: $(ls "$dir/textfile")"
promtool check metrics < "$dir/textfile/mrd.prom" > /dev/null 2>&1 || fail "the file fails promtool"
cp "$dir/textfile/mrd.prom" "$dir/before"
"$MRD_BUILDDIR/mrctl" -s "$dir/absent.sock" stats --prometheus --output "$dir/textfile/mrd.prom" \
	2> "$dir/err" && fail "--output with mrd away succeeded"
cmp -s "$dir/before" "$dir/textfile/mrd.prom" || fail "a failed run changed the file"
[ "$(ls "$dir/textfile")" = mrd.prom ] || fail "a failed run left: $(ls "$dir/textfile")"
mrctl stats --openmetrics --output "$dir/no-such-dir/mrd.prom" 2> "$dir/err" &&
	fail "--output into a missing folder succeeded"
grep -q 'No such file or directory' "$dir/err" || fail "the error does not say why: $(cat "$dir/err")"
# A write that fails (the file size limit: its words go through a pipe, which has none) leaves
# the old file and nothing beside it.
(ulimit -f 0; trap '' XFSZ; mrctl stats --prometheus --output "$dir/textfile/mrd.prom" 2>&1
	echo "rc=$?") | cat > "$dir/err"
grep -q '^rc=0' "$dir/err" && fail "--output past the file size limit succeeded"
grep -Eq 'mrd.prom: (File too large|Input/output error)' "$dir/err" || fail "the failed write does not say so: $(cat "$dir/err")"
cmp -s "$dir/before" "$dir/textfile/mrd.prom" || fail "a failed write changed the file"
[ "$(ls "$dir/textfile")" = mrd.prom ] || fail "a failed write left: $(ls "$dir/textfile")"
# A target that is not a regular file is refused, not replaced.
ln -s "$dir/before" "$dir/textfile/link.prom"
mrctl stats --prometheus --output "$dir/textfile/link.prom" 2> "$dir/err" &&
	fail "--output over a symbolic link succeeded"
grep -q 'not a regular file' "$dir/err" || fail "the error does not say why: $(cat "$dir/err")"
[ -L "$dir/textfile/link.prom" ] && cmp -s "$dir/textfile/mrd.prom" "$dir/before" ||
	fail "the link or its file changed"
mrctl stats --prometheus --output "$dir/textfile" 2> "$dir/err" && fail "--output onto a folder succeeded"
grep -q 'Is a directory' "$dir/err" || fail "the error does not say why: $(cat "$dir/err")"
[ "$(ls "$dir/textfile" | tr '\n' ' ')" = "link.prom mrd.prom " ] && ! ls "$dir" | grep -q '^textfile\.' ||
	fail "the refusals left: $(ls "$dir/textfile" "$dir")"
mrctl stats --json --prometheus 2> /dev/null && fail "--json with --prometheus accepted"
mrctl status --prometheus 2> /dev/null && fail "--prometheus accepted outside stats"
echo "metrics: promtool and the OpenMetrics parser pass, figures match mrctl --json, --output atomic"
