#!/usr/bin/env bash
# A cluster of three berth agents on one machine: a local etcd in a temp dir, three
# agents with their own data dirs and sockets, a job of six allocs submitted to one of
# them and spread over the three; a single-writer CSI volume claimed on node-a and
# refused to a writer on node-b, with the holder named; then one agent killed and its
# allocs replaced on the other two. Needs root (exec tasks, mounts) and etcd (Debian:
# apt-get install etcd-server).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v etcd >/dev/null || { echo "etcd is not installed (apt-get install etcd-server)" >&2; exit 1; }
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
# A debug build: quick to build; the demo times nothing that needs release.
cargo build -p berth -p berth-csi-hostpath
berth=$PWD/target/debug/berth
demo=$(mktemp -d /tmp/berth-cluster.XXXXXX)
# The reference CSI plugin, and one storage dir every node reaches (as a network
# storage would be).
mkdir -p "$demo/csi-bin" "$demo/storage"
cp target/debug/csi-hostpath "$demo/csi-bin/"

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
# Stops `job` through the first agent that answers and waits until none of its allocs
# runs.
stop_job() {
  local job=$1
  for node in "${!agents[@]}"; do
    if on "$node" job stop "$job" >/dev/null 2>&1; then
      for _ in $(seq 100); do
        [ "$(on "$node" job status "$job" 2>/dev/null | grep -c ' running')" -eq 0 ] && break
        sleep 0.2
      done
      return
    fi
  done
}
cleanup() {
  # The jobs' allocs first (tasks outlive their agent, as in Nomad): the volume's
  # writer, the volume, the plugin; then the agents.
  stop_job web
  stop_job writer-a
  for node in "${!agents[@]}"; do on "$node" volume delete shared >/dev/null 2>&1 && break; done
  stop_job hostpath
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
host_volume "csi-bin" {
  path      = "$demo/csi-bin"
  read_only = true
}
host_volume "csi-data" {
  path = "$demo/storage"
}
csi {
  # The operator lets this job (submitted on the agent's socket) mount volumes.
  privileged_plugin "hostpath" {
    jobs = ["hostpath"]
  }
}
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

cat >"$demo/hostpath.hcl" <<'HCL'
job "hostpath" {
  group "plugin" {
    count = 3
    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }
    volume "bin" {
      type      = "host"
      source    = "csi-bin"
      read_only = true
    }
    volume "data" {
      type   = "host"
      source = "csi-data"
    }
    task "plugin" {
      driver = "exec"
      config {
        command = "/opt/csi/csi-hostpath"
        args = ["--endpoint", "${CSI_ENDPOINT}", "--data-dir", "/data",
                "--node-id", "${node.unique.name}",
                "--reaches", "node-a", "--reaches", "node-b", "--reaches", "node-c"]
      }
      volume_mount {
        volume      = "bin"
        destination = "/opt/csi"
        read_only   = true
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
      csi_plugin {
        id   = "hostpath"
        type = "monolith"
      }
    }
  }
}
HCL
echo "==> a CSI plugin on every node (one job, three allocs)"
on node-a job run -detach "$demo/hostpath.hcl"
until on node-b plugin status hostpath 2>/dev/null | grep -q 'Nodes Healthy       = 3/3'; do sleep 0.2; done
on node-b plugin status hostpath
echo
cat >"$demo/shared.hcl" <<'HCL'
id           = "shared"
name         = "shared"
type         = "csi"
plugin_id    = "hostpath"
capacity_min = "1MiB"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
HCL
echo "==> a single-writer volume, created from node-c"
on node-c volume create "$demo/shared.hcl"
writer() {
  cat <<HCL
job "writer-$1" {
  constraint {
    attribute = "\${node.unique.name}"
    value     = "node-$1"
  }
  group "w" {
    volume "v" {
      type            = "csi"
      source          = "shared"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
    task "w" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo written on node-$1 >> /vol/log; exec sleep 3600"]
      }
      volume_mount {
        volume      = "v"
        destination = "/vol"
      }
    }
  }
}
HCL
}
writer a >"$demo/writer-a.hcl"
writer b >"$demo/writer-b.hcl"
echo "==> a writer on node-a claims it"
on node-a job run -detach "$demo/writer-a.hcl"
until on node-a job status writer-a | grep -q ' running'; do sleep 0.2; done
on node-a volume status shared
echo
echo "==> a second writer, placed on node-b, is refused there, the holder named"
on node-b job run -detach "$demo/writer-b.hcl"
until on node-b job status writer-b | grep -q ' failed'; do sleep 0.2; done
alloc_b=$(on node-b job status writer-b | awk '/ failed/ {print $1; exit}')
on node-b alloc status "$alloc_b" | grep -i 'setup failure' | head -1
on node-b job stop writer-b >/dev/null
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
