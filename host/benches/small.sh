#!/usr/bin/env bash
# Every bench at a small size, in the test profile (the test build's artifacts, no
# release build of wasmtime), so their assertions and `summary:` lines run on every
# change. The figures are not the ones to quote: host/benches/README.md has the
# full-size runs. Run as root (alloc_start, csi_volume, density and restore mount and
# make cgroups); cluster starts an etcd (Debian's etcd-server, which .ci/test installs).
set -euo pipefail
cd "$(dirname "$0")/../.."
export BERTH_BENCH_SMALL=1
for bench in driver_call alloc_start hook_pipeline csi_volume density restore cluster template_render artifact_fetch image_pull; do
  echo "== bench $bench (small)"
  cargo test -p berth --bench "$bench"
done
