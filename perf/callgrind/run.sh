#!/usr/bin/env bash
# Instructions per packet of the pipeline under callgrind (issue 2).
#
# Usage: perf/callgrind/run.sh [OUT_DIR]
#
# Builds `callgrind-pipeline` (perf/callgrind/pipeline.rs) in release and runs it under
# `valgrind --tool=callgrind --instr-atstart=no` for each profile with K and 2K packets. The
# driver switches instrumentation on around its packet loop only, and the difference
# (I(2K) - I(K)) / K cancels any fixed cost left, so the figure is instructions per packet
# of Pipeline::process (plus begin_batch once per 64 packets and the 64-byte template copy,
# about 10 instructions). Prints `NAME VALUE UNIT` lines; logs and callgrind.out files go
# to OUT_DIR (default: $CARGO_TARGET_DIR/xlb-bench or target/xlb-bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
out=${1:-$target/xlb-bench}
mkdir -p "$out"
command -v valgrind >/dev/null || { echo "valgrind not found: run scripts/install-deps.sh bench" >&2; exit 1; }
(cd "$root" && cargo build --release --quiet -p xlb-perf --bin callgrind-pipeline)
bin=$target/release/callgrind-pipeline

# profile K: established cycles over the 1,000,000 flows; new_flow needs 2K <= 200,000.
profiles=(established:100000 new_flow:50000)

# Instructions collected for one run: the "Collected : N" line of callgrind's log.
collect() {
    local profile=$1 k=$2 log=$out/callgrind.$1.$2.log
    valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$out/callgrind.out.$profile.$k" \
        "$bin" "$profile" "$k" 2>"$log" || { cat "$log" >&2; return 1; }
    grep -oP 'Collected : \K[0-9]+' "$log"
}

# Two runs at a time (one per core), K and 2K of the same profile together.
for p in "${profiles[@]}"; do
    profile=${p%%:*} k=${p##*:}
    collect "$profile" "$k" >"$out/ir.$profile.1" &
    a=$!
    collect "$profile" $((2 * k)) >"$out/ir.$profile.2" &
    b=$!
    wait "$a" "$b"
    i1=$(cat "$out/ir.$profile.1") i2=$(cat "$out/ir.$profile.2")
    python3 -c "import sys; i1, i2, k = map(int, sys.argv[1:]); print(f'${profile}_instructions_per_packet {(i2 - i1) / k:.0f} instr')" "$i1" "$i2" "$k"
done
