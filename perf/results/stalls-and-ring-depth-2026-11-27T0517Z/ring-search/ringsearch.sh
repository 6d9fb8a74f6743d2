#!/bin/bash
out=$1; mkdir -p $out; cd /work/main
for k in r2k r8k; do
  case $k in r2k) ring=2048; cfg=/work/main/perf/bench/bench.yaml; paths="b e" ;; r8k) ring=8192; cfg=/tmp/bench-32k.yaml; paths="b" ;; esac
  XLB_RING=$ring BENCH_CONFIG=$cfg BENCH_BIN_DIR=/tmp/bins-diag BENCH_BUILD=0 BENCH_PATHS="$paths" BENCH_PROFILES="syn64 tcp64_1k" \
    BENCH_SEARCH_PROFILES="syn64 tcp64_1k" BENCH_PLACEMENTS=split BENCH_REPEATS=1 BENCH_SECONDS=5 BENCH_CPS=0 BENCH_TRAFGEN=0 \
    BENCH_OUT=$out/$k bash perf/bench/run.sh > $out/$k.log 2>&1
done
