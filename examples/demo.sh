#!/usr/bin/env bash
# The README demo: prepares two host volumes under /tmp/berth-demo and runs
# examples/hello.hcl on an embedded agent (`berth run`), streaming its events.
# Needs root (the exec driver creates a mount namespace and pivots into the task dir).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
mkdir -p /tmp/berth-demo/greetings /tmp/berth-demo/scratch
# The exec task runs as nobody (Nomad's default for exec): it may write the scratch volume.
chmod 1777 /tmp/berth-demo/scratch
echo "hello from the host volume" > /tmp/berth-demo/greetings/message.txt
cargo build --release -p berth
exec ./target/release/berth run --config examples/agent.hcl examples/hello.hcl
