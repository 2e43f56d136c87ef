#!/usr/bin/env bash
# Times the build of the agent (`cargo build -p berth`: the library crates it stands on,
# its binaries and the guest components its build script compiles) in one checkout:
# once from nothing, in a target directory of its own, then after an edit of each given
# file (an item appended, as an edit of a handler's body would change it), ROUNDS times
# each, with the file restored and rebuilt between rounds.
#
#   bash host/benches/build_times.sh TREE ROUNDS FILE [FILE...]
#
# FILE is relative to TREE (the same handler moves between crates from one commit to the
# next, so each checkout names its own). Run it alone on the machine: two builds side by
# side time each other. Ends with `summary: clean_build_s = …` and, for each file,
# `summary: incremental_<file stem>_s = …` (the median of its rounds).
set -euo pipefail
tree=$(cd "${1:?usage: build_times.sh TREE ROUNDS FILE...}" && pwd)
rounds=${2:?usage: build_times.sh TREE ROUNDS FILE...}
shift 2
[ "$#" -gt 0 ] || { echo "build_times.sh: name at least one file to edit" >&2; exit 2; }
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
export CARGO_TARGET_DIR=$tree/target-build-times
cd "$tree"

seconds_of() {
  local start end
  start=$(date +%s.%N)
  cargo build -p berth --quiet "$@"
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}

median() {
  sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

rm -rf "$CARGO_TARGET_DIR"
clean=$(seconds_of)
echo "clean build: ${clean} s"

declare -A medians
for file in "$@"; do
  saved=$(mktemp)
  cp "$file" "$saved"
  # Restored on any exit, so a failed build never leaves the probe in the tree.
  trap 'cp "$saved" "$file"' EXIT
  times=()
  for round in $(seq 1 "$rounds"); do
    printf '\n#[allow(dead_code, reason = "build_times.sh")]\nfn build_times_probe() -> u64 {\n    %d\n}\n' \
      "$round$RANDOM" >>"$file"
    took=$(seconds_of)
    echo "edit of $file, round $round: ${took} s"
    times+=("$took")
    cp "$saved" "$file"
    seconds_of >/dev/null
  done
  trap - EXIT
  rm -f "$saved"
  medians[$file]=$(printf '%s\n' "${times[@]}" | median)
done

rm -rf "$CARGO_TARGET_DIR"
echo "summary: clean_build_s = $clean"
for file in "$@"; do
  stem=$(basename "$file" .rs)
  echo "summary: incremental_${stem}_s = ${medians[$file]}"
done
