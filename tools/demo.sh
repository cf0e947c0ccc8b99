#!/bin/sh
# Quick start, part one: install dependencies, build, and run mrd's main job. A private mrd
# serves a local socket in the foreground; the example client and mrctl talk to it.
set -eu
. "$(dirname "$0")/build.sh"
install_deps
build

dir=$(mktemp -d /tmp/mrd-demo.XXXXXX)
sock="$dir/mrd.sock"
: > "$dir/mrd.conf"
cleanup() {
	[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM

# --no-bus: run from the build tree, mrd's D-Bus policy is not installed to own its name.
echo "== mrd --foreground --no-bus --socket $sock"
./mrd --foreground --no-bus --config "$dir/mrd.conf" --socket "$sock" &
pid=$!
# Waits for mrd are 20 s at most (400 x 0.05 s): a loaded machine starts it slowly.
for _ in $(seq 400); do [ -S "$sock" ] && break; sleep 0.05; done

echo "== example client (examples/mrd-hello.c)"
./examples/mrd-hello "$sock"
echo "== mrd-demo: two processes, keys and DMA by keys (examples/mrd-demo.c)"
MRD_DEMO_MRCTL=./mrctl ./mrd-demo "$sock"
echo "== mrctl status"
./mrctl --socket "$sock" status
echo "== mrctl --json status"
./mrctl --socket "$sock" --json status
echo "== mrctl clients"
./mrctl --socket "$sock" clients

kill "$pid"
wait "$pid"
pid=
echo "== demo done: mrd stopped cleanly"
