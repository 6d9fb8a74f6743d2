#!/bin/bash
out=$1; rounds=$2; mkdir -p $out; cd /work/main
for r in $(seq $rounds); do
  for k in r8k r2k; do
    cfg=/work/main/perf/bench/bench.yaml; [ $k = r8k ] && cfg=/tmp/bench-ring8k.yaml
    for rate in 1100000 0; do
      BENCH_CONFIG=$cfg BENCH_RATE=$rate BENCH_BIN_DIR=/tmp/bins-ring BENCH_BUILD=0 BENCH_PATHS="b" BENCH_PROFILES="syn64 tcp64_1k" \
        BENCH_PLACEMENTS=split BENCH_REPEATS=2 BENCH_SECONDS=5 BENCH_CPS=0 BENCH_TRAFGEN=0 BENCH_SEARCH=0 \
        BENCH_OUT=$out/$k-$rate-$r bash perf/bench/run.sh > $out/$k-$rate-$r.log 2>&1
    done
  done
done
