#!/bin/bash
# usage: busyab.sh OUTDIR ROUNDS
out=$1; rounds=$2; mkdir -p $out
cd /work/main
for r in $(seq $rounds); do
  for k in sleep busy; do
    cfg=/work/main/perf/bench/bench.yaml; [ $k = busy ] && cfg=/tmp/bench-busy.yaml
    BENCH_CONFIG=$cfg BENCH_BIN_DIR=/tmp/bins-13e7835 BENCH_BUILD=0 BENCH_PATHS="b" BENCH_PROFILES="tcp64_1k syn64" \
      BENCH_SEARCH_PROFILES="tcp64_1k syn64" BENCH_PLACEMENTS=split BENCH_REPEATS=1 BENCH_SECONDS=3 BENCH_CPS=0 BENCH_TRAFGEN=0 \
      BENCH_OUT=$out/$k-$r bash perf/bench/run.sh > $out/$k-$r.log 2>&1
  done
done
