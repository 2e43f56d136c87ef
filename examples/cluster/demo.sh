#!/usr/bin/env bash
# A cluster of three berth agents on one machine: a local etcd in a temp dir, three
# agents with their own data dirs and sockets, a job of six allocs submitted to one of
# them and spread over the three, then one agent killed and its allocs replaced on the
# other two. Needs root (exec tasks) and etcd (Debian: apt-get install etcd-server).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v etcd >/dev/null || { echo "etcd is not installed (apt-get install etcd-server)" >&2; exit 1; }
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
# A debug build: quick to build; the demo times nothing that needs release.
cargo build -p berth
berth=$PWD/target/debug/berth
demo=$(mktemp -d /tmp/berth-cluster.XXXXXX)

# Two free loopback ports for etcd.
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}
client_port=$(free_port)
peer_port=$(free_port)
etcd --data-dir "$demo/etcd" --name demo \
  --listen-client-urls "http://127.0.0.1:$client_port" \
  --advertise-client-urls "http://127.0.0.1:$client_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "demo=http://127.0.0.1:$peer_port" \
  --log-level error >"$demo/etcd.log" 2>&1 &
etcd_pid=$!

declare -A agents
cleanup() {
  # The job's allocs first (tasks outlive their agent, as in Nomad), then the agents.
  for node in "${!agents[@]}"; do
    if on "$node" job stop web >/dev/null 2>&1; then
      for _ in $(seq 50); do
        [ "$(running "$node")" -eq 0 ] && break
        sleep 0.2
      done
      break
    fi
  done
  for node in "${!agents[@]}"; do kill "${agents[$node]}" 2>/dev/null || true; done
  sleep 0.5
  kill "$etcd_pid" 2>/dev/null || true
  echo "(logs and state kept in $demo)"
}
trap cleanup EXIT

start_agent() {
  local node=$1
  mkdir -p "$demo/$node"
  cat >"$demo/$node/agent.hcl" <<HCL
name     = "$node"
data_dir = "$demo/$node/data"
cluster {
  store         = "etcd"
  endpoints     = ["http://127.0.0.1:$client_port"]
  prefix        = "/demo"
  heartbeat_ttl = "3s"
}
HCL
  "$berth" --config "$demo/$node/agent.hcl" agent >>"$demo/$node/agent.log" 2>&1 &
  agents[$node]=$!
  until "$berth" --config "$demo/$node/agent.hcl" node status >/dev/null 2>&1; do sleep 0.2; done
}
on() { local node=$1; shift; "$berth" --config "$demo/$node/agent.hcl" "$@"; }

until (exec 3<>"/dev/tcp/127.0.0.1/$client_port") 2>/dev/null; do sleep 0.1; done
for node in node-a node-b node-c; do start_agent "$node"; done
echo "==> three agents, one cluster (asked of node-b)"
on node-b node status
echo

cat >"$demo/web.hcl" <<'HCL'
job "web" {
  group "web" {
    count = 6
    task "sleep" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
HCL
echo "==> a job of six allocs, submitted to node-a"
on node-a job run -detach "$demo/web.hcl"
allocs() { on "$1" job status web | sed -n '/^Allocations/,$p'; }
running() { on "$1" job status web | grep -c ' running' || true; }
until [ "$(running node-c)" -ge 6 ]; do sleep 0.2; done
echo "==> spread over the three nodes (asked of node-c)"
allocs node-c
echo

echo "==> node-c's agent is killed; within its heartbeat TTL (3 s) its allocs are lost"
echo "    and replaced on node-a and node-b"
kill -9 "${agents[node-c]}"
unset 'agents[node-c]'
started=$(date +%s%N)
until [ "$(on node-a job status web | grep -c ' lost')" -ge 2 ] && [ "$(running node-a)" -ge 6 ]; do sleep 0.2; done
echo "    replaced after $(( ($(date +%s%N) - started) / 1000000 )) ms"
allocs node-a
echo
echo "==> node-c's agent comes back and stops the allocs it no longer holds"
start_agent node-c
sleep 2
on node-a node status
echo
allocs node-c
