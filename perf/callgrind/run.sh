#!/usr/bin/env bash
# Instructions and last-level cache misses per packet of the pipeline under callgrind.
#
# Usage: perf/callgrind/run.sh [OUT_DIR]
#
# Builds `callgrind-pipeline` (perf/callgrind/pipeline.rs) in release and runs it under
# `valgrind --tool=callgrind --cache-sim=yes --instr-atstart=no --collect-atstart=no` once per
# profile: the driver processes 2K packets, K to warm the simulated caches and K measured (it
# switches collection on around them with callgrind client requests), so every figure is per
# measured packet. This VM has no PMU; callgrind's cache simulation models the caches valgrind
# detects on the host (`--cache-sim`) and, like cachegrind, ignores software prefetches, so the
# miss counts say how many cache lines a packet needs from beyond the last level, not how many
# stall the core.
#
# For each profile it prints (`NAME VALUE UNIT`; NAME ends in `_random` for the runs whose
# services use the random scheduler, xlb's default, instead of Maglev):
#   MODE_MIX_PROFILE_instructions_per_packet          Pipeline::process_batch / process + begin_batch
#   MODE_MIX_PROFILE_harness_instructions_per_packet  copying frames into the buffers and the loop
#   MODE_MIX_PROFILE_llc_misses_per_packet            LL misses (ILmr + DLmr + DLmw) of the pipeline
# and, for continuity with earlier figures, `established_instructions_per_packet` and
# `new_flow_instructions_per_packet` (the one-packet loop, harness included, as before).
# `established6` and `new_flow6` are `established` and `new_flow` in the IPv6 DNAT world
# (`batch_uniform_established6_instructions_per_packet`, ...). `dsr_ipip_headroom` is `dsr_ipip`
# in buffers with the 256 bytes of headroom the AF_XDP workers hand the pipeline (the other
# batch profiles run at headroom 0).
# Logs and callgrind.out files go to OUT_DIR (default: $CARGO_TARGET_DIR/xlb-bench or
# target/xlb-bench). CALLGRIND_QUICK=1 runs only batch uniform established and new_flow.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
out=${1:-$target/xlb-bench}
mkdir -p "$out"
command -v valgrind >/dev/null || { echo "valgrind not found: run scripts/install-deps.sh bench" >&2; exit 1; }
(cd "$root" && cargo build --release --quiet -p xlb-perf --bin callgrind-pipeline)
bin=$target/release/callgrind-pipeline

# mode profile mix K [random] (new_flow needs 2K <= 200,000; `random`: CG_SCHEDULER=random).
runs=(
  "batch established uniform 50000"
  "batch new_flow uniform 50000"
  "batch new_flow uniform 50000 random"
  "batch syn_flood uniform 50000 random"
  "batch snat_reply uniform 50000"
  "batch dsr_ipip uniform 50000"
  "batch dsr_ipip_headroom uniform 50000"
  "batch syn_flood uniform 50000"
  "batch established zipf 50000"
  "batch established hot 50000"
  "single established uniform 50000"
  "single new_flow uniform 50000"
  "batch established6 uniform 50000"
  "batch new_flow6 uniform 50000"
)
[ "${CALLGRIND_QUICK:-0}" = 1 ] && runs=("${runs[0]}" "${runs[1]}")

# One run: its figures on stdout.
collect() {
    local mode=$1 profile=$2 mix=$3 k=$4 sched=${5:-}
    local name=${mode}_${mix}_${profile}${sched:+_$sched}
    local file=$out/callgrind.out.$1.$3.$2${sched:+.$sched} log=$out/callgrind.$1.$3.$2${sched:+.$sched}.log
    CG_SCHEDULER=$sched valgrind --tool=callgrind --cache-sim=yes --instr-atstart=no --collect-atstart=no \
        --callgrind-out-file="$file" "$bin" "$mode" "$profile" "$mix" "$k" 2>"$log" || { cat "$log" >&2; return 1; }
    callgrind_annotate --inclusive=yes --show=Ir,ILmr,DLmr,DLmw "$file" >"$file.txt"
    python3 - "$file.txt" "$name" "$k" "$mode" "$profile" <<'EOF'
import re, sys
path, name, k, mode, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
total = None
fn = {}
tok = re.compile(r"\s*(?:([\d,]+)(?:\s+\([^)]*\))?|(\.))(?=\s)")
for line in open(path, encoding="utf-8", errors="replace"):
    vals, pos = [], 0
    for _ in range(4):
        m = tok.match(line, pos)
        if not m:
            break
        vals.append(int(m.group(1).replace(",", "")) if m.group(1) else 0)
        pos = m.end()
    if len(vals) < 4:
        continue
    what = line[pos:].strip()
    if "PROGRAM TOTALS" in what:
        total = vals
        continue
    # A function's inclusive cost is the largest of the lines that name it (the others are
    # code inlined into it from other files).
    name_part = what.split(" [")[0]
    for key in ("Pipeline::process_batch", "Pipeline::begin_batch", "Pipeline::process"):
        if name_part.endswith(key) and vals[0] > fn.get(key, [0])[0]:
            fn[key] = vals
if total is None:
    sys.exit(f"{path}: no totals")
main = fn.get("Pipeline::process") if mode == "single" else fn.get("Pipeline::process_batch")
if main is None:
    main = fn.get("Pipeline::process_batch") or [0, 0, 0, 0]
begin = fn.get("Pipeline::begin_batch", [0, 0, 0, 0])
pipe = [a + b for a, b in zip(main, begin)]
print(f"{name}_instructions_per_packet {pipe[0] / k:.0f} instr")
print(f"{name}_harness_instructions_per_packet {(total[0] - pipe[0]) / k:.0f} instr")
print(f"{name}_llc_misses_per_packet {sum(pipe[1:]) / k:.2f} misses")
if mode == "single" and name.endswith("uniform_established"):
    print(f"established_instructions_per_packet {total[0] / k:.0f} instr")
if mode == "single" and name.endswith("uniform_new_flow"):
    print(f"new_flow_instructions_per_packet {total[0] / k:.0f} instr")
EOF
}

# Two runs at a time (one per core).
i=0
for r in "${runs[@]}"; do
    # shellcheck disable=SC2086
    collect $r >"$out/cg.$i.txt" &
    pids[i]=$!
    i=$((i + 1))
    if [ $((i % 2)) = 0 ]; then wait "${pids[i - 2]}" "${pids[i - 1]}"; fi
done
wait
for j in $(seq 0 $((i - 1))); do cat "$out/cg.$j.txt"; done
