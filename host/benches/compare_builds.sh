#!/usr/bin/env bash
# Runs one bench of two builds in the same session, alternating, so that a change's cost
# is measured against the build before it on the same machine at the same time (these
# virtual machines drift by up to 2x between periods of a session: two runs made apart
# compare the periods, not the builds).
#
#   bash host/benches/compare_builds.sh BENCH[,BENCH...] BEFORE_REV [ROUNDS] [AFTER_REV]
#
# Several benches (comma-separated) share the two builds; each round runs each of them.
# BEFORE_REV (and AFTER_REV, when given) is built from a detached worktree (in a
# temporary directory, removed at the end) with its own target directory; BEFORE_REV may
# instead be the path of a checkout, built in place with its own target directory and
# kept (a second comparison against it builds nothing again); so may AFTER_REV. Without
# AFTER_REV the working tree is the "after" build. Each round
# runs before then after (odd rounds) or after then before (even rounds). It prints each
# run's summary lines, then the median of every summary figure for both builds and their
# ratio, and the median of the rounds' own ratios (each round's after over its before:
# the machine's drift from round to round cancels out), and ends with
# `summary: <name>_after_over_before = <ratio>` and
# `summary: <name>_paired_after_over_before = <ratio>` lines.
#
# As root for alloc_start (it mounts and creates cgroups), like the bench itself.
set -euo pipefail
bench=${1:?usage: compare_builds.sh BENCH BEFORE_REV [ROUNDS]}
before_rev=${2:?usage: compare_builds.sh BENCH BEFORE_REV [ROUNDS]}
rounds=${3:-5}
after_rev=${4:-}
cd "$(dirname "$0")/../.."
repo=$(pwd)
after_tree=$repo
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}

scratch=$(mktemp -d /tmp/berth-compare.XXXXXX)
cleanup() {
  for tree in before after; do
    git -C "$repo" worktree remove --force "$scratch/$tree" >/dev/null 2>&1 || true
  done
  rm -rf "$scratch"
}
trap cleanup EXIT
if [ -d "$before_rev" ]; then
  before_tree=$(cd "$before_rev" && pwd)
  before_target=$before_tree/target
else
  git worktree add --detach "$scratch/before" "$before_rev" >/dev/null
  before_tree=$scratch/before
  before_target=$scratch/target
fi
after_target=
if [ -d "$after_rev" ]; then
  # A checkout's path, as for BEFORE_REV: the same path for both compares a build with
  # itself (what this machine's noise alone makes of a ratio).
  after_tree=$(cd "$after_rev" && pwd)
  after_target=$after_tree/target
elif [ -n "$after_rev" ]; then
  git worktree add --detach "$scratch/after" "$after_rev" >/dev/null
  after_tree=$scratch/after
  after_target=$scratch/target-after
fi

# The executable of bench $2 of the tree in $1 (built in release, as `cargo bench` does).
build() {
  (cd "$1" && cargo bench -p berth --bench "$2" --no-run --message-format=json 2>/dev/null) |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if message.get("reason") == "compiler-artifact" and message.get("executable") \
            and message["target"]["name"] == sys.argv[1]:
        print(message["executable"])
' "$2" | tail -n 1
}
IFS=, read -r -a benches <<< "$bench"
declare -A before_bins after_bins
for one in "${benches[@]}"; do
  echo "building $one at $before_rev and at ${after_rev:-the working tree}"
  before_bins[$one]=$(CARGO_TARGET_DIR="$before_target" build "$before_tree" "$one")
  if [ -n "$after_target" ]; then
    after_bins[$one]=$(CARGO_TARGET_DIR="$after_target" build "$after_tree" "$one")
  else
    after_bins[$one]=$(build "$after_tree" "$one")
  fi
  [ -x "${before_bins[$one]}" ] && [ -x "${after_bins[$one]}" ] || { echo "a build of $one failed" >&2; exit 1; }
done

run() { # build-name executable
  echo "--- $1"
  "$2" --bench | tee "$scratch/run.out" | grep '^summary:' || true
  sed -n 's/^summary: \([^ ]*\) = \(.*\)$/\1 \2/p' "$scratch/run.out" | sed "s/^/$1 $round /" >> "$scratch/figures"
}
for round in $(seq 1 "$rounds"); do
  for one in "${benches[@]}"; do
    echo "=== $one: round $round of $rounds"
    if [ $((round % 2)) = 1 ]; then
      run before "${before_bins[$one]}"; run after "${after_bins[$one]}"
    else
      run after "${after_bins[$one]}"; run before "${before_bins[$one]}"
    fi
  done
done

python3 - "$scratch/figures" <<'EOF'
import statistics, sys
figures = {}
for line in open(sys.argv[1]):
    build, round_, name, value = line.split()
    figures.setdefault(name, {}).setdefault(build, {})[round_] = float(value)
print()
print(f"{'figure':<36} {'before':>12} {'after':>12} {'after/before':>13} {'paired':>8}  (medians)")
ratios = []
for name, builds in figures.items():
    if "before" not in builds or "after" not in builds:
        continue
    before = statistics.median(builds["before"].values())
    after = statistics.median(builds["after"].values())
    ratio = after / before if before else float("nan")
    rounds = [r for r in builds["before"] if r in builds["after"] and builds["before"][r]]
    paired = statistics.median(builds["after"][r] / builds["before"][r] for r in rounds) \
        if rounds else float("nan")
    print(f"{name:<36} {before:>12.2f} {after:>12.2f} {ratio:>13.3f} {paired:>8.3f}")
    ratios.append((name, ratio, paired))
for name, ratio, paired in ratios:
    print(f"summary: {name}_after_over_before = {ratio:.3f}")
    print(f"summary: {name}_paired_after_over_before = {paired:.3f}")
EOF
