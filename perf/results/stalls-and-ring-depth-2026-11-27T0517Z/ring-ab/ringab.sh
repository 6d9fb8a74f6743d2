#!/bin/bash
# usage: ringab.sh OUTDIR ROUNDS
out=$1; rounds=$2; mkdir -p $out
cd /work/main
for r in $(seq $rounds); do
  for k in r2k r4k r8k; do
    case $k in r2k) ring=2048; cfg=/work/main/perf/bench/bench.yaml ;; r4k) ring=4096; cfg=/tmp/bench-16k.yaml ;; r8k) ring=8192; cfg=/tmp/bench-32k.yaml ;; esac
    for rate in 1100000 0; do
      XLB_RING=$ring BENCH_CONFIG=$cfg BENCH_RATE=$rate BENCH_BIN_DIR=/tmp/bins-diag BENCH_BUILD=0 BENCH_PATHS="b" BENCH_PROFILES="syn64 tcp64_1k" \
        BENCH_PLACEMENTS=split BENCH_REPEATS=2 BENCH_SECONDS=5 BENCH_CPS=0 BENCH_TRAFGEN=0 BENCH_SEARCH=0 \
        BENCH_OUT=$out/$k-$rate-$r bash perf/bench/run.sh > $out/$k-$rate-$r.log 2>&1
    done
  done
done
