#!/bin/bash
out=$1; mkdir -p $out; cd /work/main
for k in r8k r2k; do
  case $k in r2k) ring=2048; cfg=/work/main/perf/bench/bench.yaml ;; r8k) ring=8192; cfg=/tmp/bench-32k.yaml ;; esac
  XLB_RING=$ring BENCH_CONFIG=$cfg BENCH_BIN_DIR=/tmp/bins-diag BENCH_BUILD=0 BENCH_PATHS="b" BENCH_PROFILES="syn64" \
    BENCH_SEARCH_PROFILES="syn64" BENCH_PLACEMENTS=split BENCH_REPEATS=1 BENCH_SECONDS=5 BENCH_CPS=0 BENCH_TRAFGEN=0 \
    BENCH_OUT=$out/$k bash perf/bench/run.sh > $out/$k.log 2>&1
done
