#!/usr/bin/env bash
# CSI on a real agent: the hostpath plugin runs as a task, a volume is created through
# its controller, one job writes to it and the next reads it back. Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
cargo build --release -p berth -p berth-csi-hostpath
demo=/tmp/berth-csi
berth=./target/release/berth
# The agent and the CLI read the same config, so the CLI finds the agent's API socket in
# its data dir (/tmp/berth-csi/state/api.sock).
export BERTH_CONFIG=examples/csi/agent.hcl

# A previous run's mounts, if it was interrupted.
{ grep -o " $demo/[^ ]*" /proc/self/mountinfo || true; } | sort -r | xargs -r -n1 umount -l
rm -rf "$demo"
mkdir -p "$demo/bin" "$demo/data"
cp target/release/csi-hostpath "$demo/bin/"

"$berth" agent >"$demo/agent.log" 2>&1 &
agent=$!
cleanup() {
  "$berth" job stop csi-hostpath >/dev/null 2>&1 || true
  sleep 1
  kill "$agent" 2>/dev/null || true
}
trap cleanup EXIT
until "$berth" job status >/dev/null 2>&1; do sleep 0.2; done

wait_dead() {
  until "$berth" job status "$1" | grep -q "^Status *= dead"; do sleep 0.2; done
}

echo "==> the plugin, as a task"
"$berth" job run examples/csi/plugin.hcl
until "$berth" plugin status hostpath 2>/dev/null | grep -q "Nodes Healthy *= 1/1"; do sleep 0.2; done
"$berth" plugin status hostpath
echo
echo "==> a volume, created through the plugin's controller"
"$berth" volume create examples/csi/volume.hcl
echo
echo "==> a job writes to it"
"$berth" job run examples/csi/writer.hcl
wait_dead notes-writer
echo
echo "==> the next job reads it back"
"$berth" job run examples/csi/reader.hcl
wait_dead notes-reader
cat "$demo"/state/allocs/*/alloc/logs/read.stdout.0
echo
"$berth" volume status notes
