#!/usr/bin/env bash
# `make bench`: what packet rate and connection rate to expect from xlb, and how much better
# than kube-proxy, measured side by side in one run on a namespace testbed
# (perf/bench/testbed.sh). Run as root from anywhere: `bash perf/bench/run.sh`.
#
# Paths (the lb namespace's forwarder):
#   a  xlb-macfwd: raw AF_XDP forwarder that rewrites only MACs (the I/O ceiling)
#   b  xlb run --config perf/bench/bench.yaml (worker pinned to CPU 1)
#   c  kernel + kube-proxy nftables-mode rules (kube-proxy-rules --mode nftables)
#   d  kernel + kube-proxy iptables-mode rules (kube-proxy-rules --mode iptables)
#   e  dpdk-testpmd on DPDK's AF_XDP PMD (net_af_xdp, copy mode on veth), --forward-mode=mac,
#      forwarding lcore on CPU 1: a second AF_XDP ceiling written elsewhere (Debian dpdk-dev,
#      librte-net-af-xdp23; scripts/install-deps.sh bench)
# Profiles (xlb-pktgen, offered load = maximum, generator pinned to CPU 0): udp64_1flow,
# udp64_1k, udp64_100k, tcp64_1k, syn64, udp512_1k. Trials are interleaved: for each repeat,
# for each profile, paths a b c d. Cross-check: trafgen on udp64_1k (paths a b c).
# Connections/s: wrk -c32 with `Connection: close` against nginx in the sink (paths b c d).
#
# Environment:
#   BENCH_REPEATS (5)  BENCH_SECONDS (5)  BENCH_WARMUP (1)  BENCH_QUICK=1 (1 repeat, 2 s,
#   profiles udp64_1k syn64, 3 s conn/s)  BENCH_PROFILES, BENCH_PATHS ("a b c d e"),
#   BENCH_TRAFGEN=0|1 (1), BENCH_TRAFGEN_PATHS ("a b c"), BENCH_CPS=0|1 (1),
#   BENCH_CPS_PATHS ("b c d"), BENCH_CPS_SECONDS (10), BENCH_SEARCH=0|1 (1: no-drop search once
#   per path, placement and search profile, then one trial at the no-drop rate for its p50/p99
#   latency), BENCH_SEARCH_PROFILES ("udp64_1k syn64"; quick: "udp64_1k"), BENCH_SEARCH_TRIALS
#   (8; quick: 5), BENCH_SEARCH_RETRIES (1: a step's rate is tried once more before it is
#   rejected, so that one stall of the host does not move the search below it),
#   BENCH_PLACEMENTS ("split shared shared-rt"; see "placements" below),
#   BENCH_BUILD=0 (use built binaries as they are), BENCH_PERF=1 (each trial also records a
#   cpu-clock profile of the forwarder's CPU with `perf record -g` after the warm-up, into
#   $LOGS/PROFILE-PLACEMENT-PATH-REPEAT.perf.data; this VM has no PMU, cpu-clock needs none),
#   BENCH_PERF_CPU=fwd|gen|both (the CPUs BENCH_PERF records, default fwd; gen is the
#   generator's, where in the split placement the lb's l0 NAPI and its XDP program run),
#   BENCH_PERF_EVENTS (what BENCH_PERF records, default "-e cpu-clock -F 2999 -g"; e.g.
#   "-e sched:sched_switch" for who runs on the CPU and when), BENCH_RATE (the offered load
#   of the packet-rate trials in packets per second, default 0: maximum),
#   BENCH_BIN_DIR (default $CARGO_TARGET_DIR/release or target/release), BENCH_PREFIX
#   (namespace prefix, default xlbbench), BENCH_OUT (perf/results), BENCH_COMMAND (the command
#   line recorded in the report), BENCH_CONFIG (xlb's configuration for path b, default
#   perf/bench/bench.yaml; for A/Bs of `afXdp` settings), BENCH_MACFWD_RING (path a's ring
#   size, `xlb-macfwd --ring-size`, with four times as many UMEM frames; default 2048, as
#   xlb's default `afXdp.ringSize`: set it with a BENCH_CONFIG of deeper rings).
# Placements (where the lb's l0 receive work, its veth NAPI, runs):
#   split      the default: the generator's xmit schedules l0's NAPI on CPU 0, the forwarder
#              has CPU 1 to itself (kernel paths: RPS moves their work to CPU 1).
#   shared     l0's NAPI is threaded and its napi/l0-* thread pinned to CPU 1, the forwarder's
#              core: a NIC queue whose interrupt is on the worker's core. Kernel paths get GRO
#              on l0 so that veth receives through NAPI at all.
#   shared-rt  shared, with the forwarders as SCHED_FIFO threads (xlb `afXdp.realtimeWorkers`,
#              xlb-macfwd under `chrt -f 1`); the kernel paths are not run (nothing differs).
#   Profiles of a non-split placement are reported as PROFILE@PLACEMENT.
# Output: $BENCH_OUT/raw-DATE.jsonl (one JSON line per trial), then xlb-bench-report writes
# $BENCH_OUT/latest.{json,md,png} and DATE-COMMIT.{json,md,png}. Logs: /tmp/xlb-bench-DATE/ (DATE to the second).
# For each xlb trial the logs keep `xlb stats` (PROFILE-PLACEMENT-b-REPEAT.xlb-stats.txt) and the
# worker's frame, busy-loop and busy-time counters from /metrics (...-b-REPEAT.worker-metrics.txt):
# frames per busy loop near 64 means the worker ran behind its RX ring for most of the trial.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD

QUICK=${BENCH_QUICK:-0}
if [ "$QUICK" = 1 ]; then
  REPEATS=${BENCH_REPEATS:-1}
  SECS=${BENCH_SECONDS:-2}
  PROFILES=${BENCH_PROFILES:-"udp64_1k syn64"}
  CPS_SECS=${BENCH_CPS_SECONDS:-3}
  SEARCH_PROFILES=${BENCH_SEARCH_PROFILES:-"udp64_1k"}
  SEARCH_TRIALS=${BENCH_SEARCH_TRIALS:-5}
else
  REPEATS=${BENCH_REPEATS:-5}
  SECS=${BENCH_SECONDS:-5}
  PROFILES=${BENCH_PROFILES:-"udp64_1flow udp64_1k udp64_100k tcp64_1k syn64 udp512_1k"}
  CPS_SECS=${BENCH_CPS_SECONDS:-10}
  SEARCH_PROFILES=${BENCH_SEARCH_PROFILES:-"udp64_1k syn64"}
  SEARCH_TRIALS=${BENCH_SEARCH_TRIALS:-8}
fi
SEARCH_RETRIES=${BENCH_SEARCH_RETRIES:-1}
PLACEMENTS=${BENCH_PLACEMENTS:-"split shared shared-rt"}
WARMUP=${BENCH_WARMUP:-1}
PATHS=${BENCH_PATHS:-"a b c d e"}
TRAFGEN=${BENCH_TRAFGEN:-1}
TRAFGEN_PATHS=${BENCH_TRAFGEN_PATHS:-"a b c"}
CPS=${BENCH_CPS:-1}
CPS_PATHS=${BENCH_CPS_PATHS:-"b c d"}
SEARCH=${BENCH_SEARCH:-1}
PERF=${BENCH_PERF:-0}
PERF_CPU=${BENCH_PERF_CPU:-fwd}
PERF_EVENTS=${BENCH_PERF_EVENTS:-"-e cpu-clock -F 2999 -g"}
RATE=${BENCH_RATE:-0}
BUILD=${BENCH_BUILD:-1}
P=${BENCH_PREFIX:-xlbbench}
OUT=${BENCH_OUT:-$ROOT/perf/results}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BENCH_BIN_DIR:-$TARGET/release}
CFG=${BENCH_CONFIG:-$ROOT/perf/bench/bench.yaml}
MACFWD_RING=${BENCH_MACFWD_RING:-2048}
GEN=$P-gen LB=$P-lb SINK=$P-sink
MAC_G0=02:00:0a:fb:00:02 MAC_L0=02:00:0a:fb:00:01 MAC_S0=02:00:0a:fb:01:0b
VIP=10.251.100.1 SRC_IP=10.252.0.1
GEN_CPU=0 FWD_CPU=1 RPS_MASK=2
TRAFGEN_RATE=${BENCH_TRAFGEN_RATE:-2000000pps}

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# uncommitted changes to tracked files: the binaries may not be exactly that commit
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && COMMIT=$COMMIT-dirty
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
DATE=$(date -u +%Y-%m-%dT%H:%MZ)
RAW=$OUT/raw-$STAMP.jsonl
# to the second: two runs started in one minute must not share (and overwrite) their logs
LOGS=/tmp/xlb-bench-$(date -u +%Y-%m-%dT%H%M%SZ)
T0=$SECONDS

say() { printf '[bench %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, XDP)"
for t in ip jq ethtool nft taskset timeout; do command -v "$t" >/dev/null || die "missing tool: $t"; done
mkdir -p "$OUT" "$LOGS" || die "cannot create $OUT or $LOGS"
# bench.yaml with SCHED_FIFO workers, for the shared-rt placement
CFG_RT=$LOGS/bench-realtime.yaml
sed 's/^forwardingMode: nat$/forwardingMode: nat\nafXdp: {realtimeWorkers: true}/' "$CFG" >"$CFG_RT"
grep -q 'realtimeWorkers: true' "$CFG_RT" || die "could not derive $CFG_RT from $CFG"
PLACEMENT=split NAPI_CPUS=

# ---------------------------------------------------------------------------------------
# binaries
# ---------------------------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
  say "building release binaries (xlb, xlb-perf, xlb-cpbench, xlb-bench-report) into $TARGET"
  for pkg in xlb xlb-perf xlb-cpbench xlb-bench-report; do
    # one package at a time: a package that does not build only costs the paths that need it
    if ! CARGO_TARGET_DIR=$TARGET cargo build --release -q -p "$pkg" >"$LOGS/build-$pkg.log" 2>&1; then
      say "warning: cargo build -p $pkg failed (log $LOGS/build-$pkg.log); its paths will be skipped"
    fi
  done
fi
# snapshot the binaries: a concurrent cargo build must not swap them in the middle of the run
mkdir -p "$LOGS/bin"
for b in xlb-pktgen xlb-macfwd xlb kube-proxy-rules xlb-bench-report; do
  [ -x "$BIN/$b" ] && cp "$BIN/$b" "$LOGS/bin/$b"
done
BIN=$LOGS/bin
PKTGEN=$BIN/xlb-pktgen MACFWD=$BIN/xlb-macfwd XLB=$BIN/xlb KPR=$BIN/kube-proxy-rules REPORT=$BIN/xlb-bench-report
have() { [ -x "$1" ]; }
have "$REPORT" || die "$REPORT is missing (cargo build --release -p xlb-bench-report)"

# ---------------------------------------------------------------------------------------
# testbed and cleanup
# ---------------------------------------------------------------------------------------
FWD_PID=
WHY=
cleanup() {
  stop_forwarder
  bash "$ROOT/perf/bench/testbed.sh" down "$P" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

stop_forwarder() {
  if [ -n "$FWD_PID" ]; then
    kill -TERM "$FWD_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$FWD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$FWD_PID" 2>/dev/null || true
    wait "$FWD_PID" 2>/dev/null || true
    FWD_PID=
  fi
}

if awk '{exit !($1 > 1.0)}' /proc/loadavg; then  # before the bench starts anything
  say "warning: load average $(cut -d' ' -f1-3 /proc/loadavg): other work is using the CPUs; figures will be noisy"
fi
say "testbed $P: $GEN (g0) <-> $LB (l0, l1) <-> $SINK (s0); logs in $LOGS"
bash "$ROOT/perf/bench/testbed.sh" up "$P" || die "testbed up failed"
nsx "$GEN" sysctl -qw net.ipv4.ip_local_port_range="1024 65000"

# kube-proxy's rules for bench.yaml, generated once
declare -A RULES=()
if have "$KPR"; then
  for mode in nftables iptables; do
    if "$KPR" --config "$CFG" --mode "$mode" >"$LOGS/rules.$mode" 2>"$LOGS/rules.$mode.err"; then
      RULES[$mode]=$LOGS/rules.$mode
    else
      say "warning: kube-proxy-rules --mode $mode failed: $(tail -n 2 "$LOGS/rules.$mode.err")"
    fi
  done
fi

# why a path cannot run (empty: it can)
path_missing() {
  case $1 in
    a) have "$MACFWD" || echo "xlb-macfwd not built" ;;
    e) command -v dpdk-testpmd >/dev/null || echo "dpdk-testpmd missing (Debian dpdk-dev: scripts/install-deps.sh bench)"
       ls /usr/lib/*/dpdk/pmds-*/librte_net_af_xdp.so >/dev/null 2>&1 || echo "DPDK's AF_XDP PMD missing (librte-net-af-xdp23)" ;;
    b) have "$XLB" || echo "xlb not built" ;;
    c) [ -n "${RULES[nftables]:-}" ] || echo "no nftables rules (kube-proxy-rules missing or failed)" ;;
    d) [ -n "${RULES[iptables]:-}" ] || echo "no iptables rules (kube-proxy-rules missing or failed)"
       command -v iptables-restore >/dev/null || echo "iptables-restore missing" ;;
    *) echo "unknown path $1" ;;
  esac
}

path_name() { case $1 in a) echo macfwd ;; b) echo xlb ;; c) echo nftables ;; d) echo iptables ;; e) echo testpmd ;; *) echo "$1" ;; esac; }

xdp_attached() { ip -n "$1" -d link show dev "$2" 2>/dev/null | grep -q "prog/xdp"; }

# clean_lb: the lb namespace as the testbed left it (no forwarder, rules, conntrack, RPS, XDP)
clean_lb() {
  # Threaded NAPI off first, while l0 still has its NAPI (XDP or GRO): once veth's NAPI is gone
  # the sysfs write fails (EIO) and the flag would stay on for the next path's NAPI.
  nsx "$LB" sh -c 'echo 0 > /sys/class/net/l0/threaded' 2>/dev/null || true
  stop_forwarder
  # anything else still running in lb (only this script starts processes there)
  local left
  left=$(ip netns pids "$LB" 2>/dev/null | tr '\n' ' ')
  if [ -n "${left// /}" ]; then
    say "  warning: leftover processes in $LB: $left(terminating)"
    # shellcheck disable=SC2086
    kill -TERM $left 2>/dev/null
    sleep 1
    left=$(ip netns pids "$LB" 2>/dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086
    [ -n "${left// /}" ] && kill -KILL $left 2>/dev/null
  fi
  nsx "$LB" nft flush ruleset 2>/dev/null || true
  if command -v iptables >/dev/null; then
    for t in filter nat mangle raw; do
      nsx "$LB" iptables -t "$t" -F 2>/dev/null || true
      nsx "$LB" iptables -t "$t" -X 2>/dev/null || true
    done
  fi
  if command -v conntrack >/dev/null; then nsx "$LB" conntrack -F >/dev/null 2>&1 || true; fi
  nsx "$LB" sh -c 'echo 0 > /sys/class/net/l0/queues/rx-0/rps_cpus' 2>/dev/null || true
  # placement: back to no GRO (the testbed's state); threaded NAPI must be off by now
  nsx "$LB" ethtool -K l0 gro off >/dev/null 2>&1 || true
  if [ "$(nsx "$LB" cat /sys/class/net/l0/threaded 2>/dev/null)" != 0 ]; then
    say "  warning: l0's NAPI is still marked threaded; the next split-placement figures are not split"
  fi
  for i in l0 l1; do
    if xdp_attached "$LB" "$i"; then ip -n "$LB" link set dev "$i" xdp off 2>/dev/null || true; fi
  done
  for x in "$GEN g0" "$SINK s0"; do
    # shellcheck disable=SC2086
    set -- $x
    if xdp_attached "$1" "$2"; then ip -n "$1" link set dev "$2" xdp off 2>/dev/null || true; fi
  done
}

# place_napi: for the shared placements, make l0's NAPI threaded and pin its thread(s) to the
# forwarder's core (call once the path is up: veth has a NAPI only with XDP or GRO on). Sets
# NAPI_CPUS ("napi/l0-N@CPU ..."); non-zero (reason in $WHY) if there is no NAPI thread.
place_napi() {
  NAPI_CPUS=
  [ "$PLACEMENT" = split ] && return 0
  nsx "$LB" sh -c 'echo 1 > /sys/class/net/l0/threaded' 2>"$LOGS/threaded.err" || {
    WHY="cannot make l0's NAPI threaded: $(cat "$LOGS/threaded.err")"; return 1; }
  local pid i
  for i in $(seq 20); do pgrep '^napi/l0-' >/dev/null && break; sleep 0.05; done
  for pid in $(pgrep '^napi/l0-'); do
    taskset -pc "$FWD_CPU" "$pid" >/dev/null || { WHY="cannot pin napi thread $pid"; return 1; }
    NAPI_CPUS="$NAPI_CPUS$(cat "/proc/$pid/comm")@$(taskset -pc "$pid" | awk '{print $NF}') "
  done
  [ -n "$NAPI_CPUS" ] || { WHY="placement $PLACEMENT: no napi/l0-* thread after making l0's NAPI threaded"; return 1; }
}

# path_up PATH LOGPREFIX: start the forwarder / load the rules, then place l0's NAPI. Non-zero
# (reason in $WHY) if it could not. Not in a subshell: it sets FWD_PID.
path_up() {
  path_start "$@" || return 1
  place_napi
}

path_start() {
  local path=$1 lp=$2 i rt=
  [ "$PLACEMENT" = shared-rt ] && rt="chrt -f 1"
  case $path in
    a)
      # shellcheck disable=SC2086
      ip netns exec "$LB" $rt "$MACFWD" --in-iface l0 --out-iface l1 --dst-mac "$MAC_S0" --cpu "$FWD_CPU" \
        --ring-size "$MACFWD_RING" --frames "$((4 * MACFWD_RING))" \
        --duration 0 --json </dev/null >"$lp.macfwd.json" 2>"$lp.macfwd.err" &
      FWD_PID=$!
      for i in $(seq 400); do
        xdp_attached "$LB" l0 && { sleep 0.2; return 0; }
        kill -0 "$FWD_PID" 2>/dev/null || { FWD_PID=; WHY="xlb-macfwd exited: $(tail -n 3 "$lp.macfwd.err" | tr '\n' ' ')"; return 1; }
        sleep 0.05
      done
      WHY="xlb-macfwd attached no XDP program to l0 within 20 s"; return 1 ;;
    e)
      # main lcore on the generator's CPU (it only prints statistics once a minute), the
      # forwarding lcore on the forwarder's CPU; no huge pages needed with --no-huge
      # shellcheck disable=SC2086
      ip netns exec "$LB" $rt dpdk-testpmd -l "$GEN_CPU,$FWD_CPU" --main-lcore "$GEN_CPU" --no-huge -m 1024 \
        --no-pci --file-prefix "$P-testpmd" \
        --vdev net_af_xdp0,iface=l0,start_queue=0,queue_count=1 --vdev net_af_xdp1,iface=l1,start_queue=0,queue_count=1 \
        -- --total-num-mbufs=16384 --forward-mode=mac --eth-peer="1,$MAC_S0" --auto-start --stats-period 60 \
        </dev/null >"$lp.testpmd.log" 2>&1 &
      FWD_PID=$!
      for i in $(seq 400); do
        xdp_attached "$LB" l0 && xdp_attached "$LB" l1 && grep -q "Press enter\|Port statistics\|forwarding packets" "$lp.testpmd.log" 2>/dev/null && { sleep 0.5; return 0; }
        kill -0 "$FWD_PID" 2>/dev/null || { FWD_PID=; WHY="dpdk-testpmd exited: $(grep -v '^EAL: [DMPS]' "$lp.testpmd.log" | tail -n 3 | tr '\n' ' ')"; return 1; }
        sleep 0.05
      done
      WHY="dpdk-testpmd attached no XDP program to l0/l1 within 20 s (log $lp.testpmd.log)"; return 1 ;;
    b)
      local sock=$LOGS/xlb.sock
      rm -f "$sock"
      local cfg=$CFG
      [ "$PLACEMENT" = shared-rt ] && cfg=$CFG_RT
      ip netns exec "$LB" "$XLB" run --config "$cfg" --admin-socket "$sock" </dev/null >"$lp.xlb.log" 2>&1 &
      FWD_PID=$!
      for i in $(seq 600); do
        if [ -S "$sock" ] && "$XLB" services --admin-socket "$sock" 2>/dev/null | grep -q "$VIP"; then
          sleep 0.2; return 0
        fi
        kill -0 "$FWD_PID" 2>/dev/null || { FWD_PID=; WHY="xlb exited: $(tail -n 3 "$lp.xlb.log" | tr '\n' ' ')"; return 1; }
        sleep 0.05
      done
      WHY="xlb did not serve $VIP within 30 s (log $lp.xlb.log)"; return 1 ;;
    c)
      nsx "$LB" nft -f "${RULES[nftables]}" >"$lp.nft.err" 2>&1 || { WHY="nft -f failed: $(head -n 3 "$lp.nft.err" | tr '\n' ' ')"; return 1; }
      [ "$PLACEMENT" = split ] || nsx "$LB" ethtool -K l0 gro on >/dev/null || { WHY="cannot enable GRO on l0"; return 1; }
      nsx "$LB" sh -c "echo $RPS_MASK > /sys/class/net/l0/queues/rx-0/rps_cpus" || { WHY="cannot set RPS on l0"; return 1; } ;;
    d)
      nsx "$LB" iptables-restore <"${RULES[iptables]}" >"$lp.ipt.err" 2>&1 || { WHY="iptables-restore failed: $(head -n 3 "$lp.ipt.err" | tr '\n' ' ')"; return 1; }
      [ "$PLACEMENT" = split ] || nsx "$LB" ethtool -K l0 gro on >/dev/null || { WHY="cannot enable GRO on l0"; return 1; }
      nsx "$LB" sh -c "echo $RPS_MASK > /sys/class/net/l0/queues/rx-0/rps_cpus" || { WHY="cannot set RPS on l0"; return 1; } ;;
  esac
}

# path_down PATH LOGPREFIX: keep what the forwarder says about itself, then clean up
path_down() {
  local path=$1 lp=$2
  case $path in
    b) [ -n "$FWD_PID" ] && "$XLB" stats --admin-socket "$LOGS/xlb.sock" >"$lp.xlb-stats.txt" 2>&1
       # The worker's own counters (frames per busy loop: rx over xlb_worker_busy_loops_total), from
       # the metrics address of perf/bench/bench.yaml (a BENCH_CONFIG with another leaves the file empty).
       [ -n "$FWD_PID" ] && nsx "$LB" curl -sf --noproxy '*' -m 2 http://127.0.0.1:10249/metrics 2>/dev/null \
         | grep -E '^xlb_worker_(rx_packets_total|busy_loops_total|busy_seconds)' >"$lp.worker-metrics.txt" ;;
    c) nsx "$LB" nft list ruleset >"$lp.nft-after.txt" 2>&1 ;;
    d) nsx "$LB" iptables-save -c >"$lp.ipt-after.txt" 2>&1 ;;
  esac
  if [ "$path" = c ] || [ "$path" = d ]; then
    nsx "$LB" sh -c 'cat /proc/net/stat/nf_conntrack 2>/dev/null; conntrack -C 2>/dev/null' >"$lp.conntrack.txt" 2>&1
  fi
  clean_lb
}

# pinning: one JSON object describing where things ran
pinning() {
  local rps=null
  case $1 in c | d) rps="\"$RPS_MASK\"" ;; esac
  printf '{"generator_cpu":%s,"forwarder_cpu":%s,"rps_cpus_l0":%s,"placement":"%s","napi_threads":"%s"}' \
    "$GEN_CPU" "$FWD_CPU" "$rps" "$PLACEMENT" "${NAPI_CPUS% }"
}

emit() { printf '%s\n' "$1" >>"$RAW"; }
load1() { cut -d' ' -f1 /proc/loadavg; }

failed() { # failed PATH PROFILE REPEAT REASON
  say "  FAILED $1 $2 #$3: $4"
  emit "$(jq -cn --arg path "$1" --arg profile "$2" --argjson repeat "$3" --arg reason "$4" \
    '{kind:"failed",path:$path,profile:$profile,repeat:$repeat,reason:$reason}')"
}

# profile_args PROFILE: xlb-pktgen traffic arguments
profile_args() {
  case $1 in
    udp64_1flow) echo "--proto udp --size 64 --flows 1 --dst-port 9" ;;
    udp64_1k) echo "--proto udp --size 64 --flows 1000 --dst-port 9" ;;
    udp64_100k) echo "--proto udp --size 64 --flows 100000 --dst-port 9" ;;
    # TCP frames need 70 B: 54 B of headers plus xlb-pktgen's 16 B stamp
    tcp64_1k) echo "--proto tcp --size 70 --flows 1000 --dst-port 80" ;;
    syn64) echo "--proto syn --size 70 --dst-port 80" ;;
    udp512_1k) echo "--proto udp --size 512 --flows 1000 --dst-port 9" ;;
    *) return 1 ;;
  esac
}

pktgen_common() {
  echo "--tx-netns $GEN --tx-iface g0 --rx-netns $SINK --rx-iface s0 --cpu $GEN_CPU" \
    "--src-mac $MAC_G0 --dst-mac $MAC_L0 --src-ip $SRC_IP --dst-ip $VIP"
}

# trial PATH PROFILE REPEAT: one xlb-pktgen run at maximum rate (or BENCH_RATE)
# label PROFILE: the profile name the report shows (PROFILE@PLACEMENT off the split placement)
label() { if [ "$PLACEMENT" = split ]; then echo "$1"; else echo "$1@$PLACEMENT"; fi; }

trial() {
  local path=$1 prof=$2 rep=$3 lp=$LOGS/$2-$PLACEMENT-$1-$3 why args line
  args=$(profile_args "$prof") || { failed "$path" "$prof" "$rep" "unknown profile"; return; }
  prof=$(label "$prof")
  if ! path_up "$path" "$lp"; then
    path_down "$path" "$lp"
    failed "$path" "$prof" "$rep" "$WHY"; return
  fi
  local perf_pid=
  if [ "$PERF" = 1 ]; then
    local cpus=$FWD_CPU
    case $PERF_CPU in gen) cpus=$GEN_CPU ;; both) cpus="$GEN_CPU,$FWD_CPU" ;; esac
    (sleep "$WARMUP"; exec perf record -q $PERF_EVENTS -C "$cpus" -o "$lp.perf.data" \
      -- sleep "$SECS") >"$lp.perf.err" 2>&1 &
    perf_pid=$!
  fi
  # shellcheck disable=SC2046,SC2086
  timeout $((WARMUP + SECS + 60)) "$PKTGEN" run $(pktgen_common) $args --rate "$RATE" \
    --duration "$SECS" --warmup "$WARMUP" --json >"$lp.pktgen.json" 2>"$lp.pktgen.err"
  local rc=$?
  [ -n "$perf_pid" ] && wait "$perf_pid"
  path_down "$path" "$lp"
  if [ $rc -ne 0 ] || ! jq -e '.rx_pps' "$lp.pktgen.json" >/dev/null 2>&1; then
    failed "$path" "$prof" "$rep" "xlb-pktgen exited $rc: $(tail -n 3 "$lp.pktgen.err" | tr '\n' ' ')"; return
  fi
  local fwd=null
  [ "$path" = a ] && jq -e . "$lp.macfwd.json" >/dev/null 2>&1 && fwd=$(jq -c . "$lp.macfwd.json")
  line=$(jq -c --arg path "$path" --arg name "$(path_name "$path")" --arg profile "$prof" \
    --argjson repeat "$rep" --argjson pin "$(pinning "$path")" --argjson fwd "$fwd" --arg args "$args" \
    --argjson load "$(load1)" \
    '{kind:"trial",path:$path,path_name:$name,profile:$profile,repeat:$repeat,generator:"xlb-pktgen",
      tx_pps:.tx_pps,rx_pps:.rx_pps,loss:.loss,latency_ns:.latency_ns,pinning:$pin,host_load1:$load,
      generator_args:$args,pktgen:.,forwarder:$fwd}' "$lp.pktgen.json")
  emit "$line"
  say "  $prof $path($(path_name "$path")) #$rep [load $(load1)]: rx $(jq -r '.rx_pps/1e6*1000|round/1000' "$lp.pktgen.json") Mpps (tx $(jq -r '.tx_pps/1e6*1000|round/1000' "$lp.pktgen.json"))"
}

# trafgen_trial PATH REPEAT: udp64_1k sent by trafgen (PF_PACKET) on CPU 0, counted at the sink
trafgen_trial() {
  local path=$1 rep=$2 prof=udp64_1k lp=$LOGS/trafgen-$1-$2 why tg rv t0 t1 tx0 tx1
  if ! path_up "$path" "$lp"; then
    path_down "$path" "$lp"; failed "$path" "$prof" "$rep" "trafgen: $WHY"; return
  fi
  # trafgen's fast path (TX_RING, MSG_DONTWAIT) stops at the first EAGAIN, which the kernel
  # paths cause: RPS queues the skbs on CPU 1 while they still count against the socket's
  # send buffer (wmem_default is global, so it is left alone). `-b` selects the blocking
  # per-packet path; 2 Mpps is above anything this VM reaches, so it is still "maximum".
  nsx "$GEN" timeout $((WARMUP + SECS + 2)) taskset -c "$GEN_CPU" trafgen -o g0 \
    -c "$ROOT/perf/bench/trafgen-udp64-1k.cfg" -P 1 -Q --no-sock-mem -C -b "$TRAFGEN_RATE" \
    >"$lp.trafgen.out" 2>&1 &
  tg=$!
  sleep "$WARMUP"
  tx0=$(nsx "$GEN" cat /sys/class/net/g0/statistics/tx_packets)
  t0=$(date +%s%N)
  timeout $((SECS + 30)) "$PKTGEN" recv --netns "$SINK" --iface s0 --duration "$SECS" --json \
    >"$lp.recv.json" 2>"$lp.recv.err"
  rv=$?
  t1=$(date +%s%N)
  tx1=$(nsx "$GEN" cat /sys/class/net/g0/statistics/tx_packets)
  wait "$tg" 2>/dev/null
  local tgrc=$?
  path_down "$path" "$lp"
  if [ $rv -ne 0 ] || ! jq -e '.rx_pps' "$lp.recv.json" >/dev/null 2>&1; then
    failed "$path" "$prof" "$rep" "trafgen: xlb-pktgen recv exited $rv: $(tail -n 3 "$lp.recv.err" | tr '\n' ' ')"; return
  fi
  local txpps
  [ "$tgrc" = 124 ] || say "  warning: trafgen ended early (exit $tgrc): $(tail -n 2 "$lp.trafgen.out" | tr '\n' ' ')"
  txpps=$(( (tx1 - tx0) * 1000000000 / (t1 - t0 > 0 ? t1 - t0 : 1) ))
  emit "$(jq -c --arg path "$path" --arg name "$(path_name "$path")" --arg profile "$prof" \
    --argjson repeat "$rep" --argjson pin "$(pinning "$path")" --argjson tx "$txpps" \
    --argjson tgrc "$tgrc" --arg rate "$TRAFGEN_RATE" --argjson load "$(load1)" \
    '{kind:"trial",path:$path,path_name:$name,profile:$profile,repeat:$repeat,generator:"trafgen",host_load1:$load,
      tx_pps:$tx,rx_pps:.rx_pps,loss:(if $tx > 0 then ((1 - .rx_pps / $tx) * 10000 | round) / 10000 else null end),
      pinning:$pin,recv:.,trafgen_exit:$tgrc,trafgen_rate_arg:$rate,tx_note:"g0 tx_packets delta over the receive window"}' "$lp.recv.json")"
  say "  trafgen $prof $path($(path_name "$path")) #$rep: rx $(jq -r '.rx_pps/1e6*1000|round/1000' "$lp.recv.json") Mpps (tx ~$((txpps / 1000)) kpps)"
}

# search_trial PATH PROFILE: highest rate with loss < 0.1 %, then one trial at that rate for the
# forwarder's latency without overload (the trials at maximum load measure queueing)
search_trial() {
  local path=$1 base=$2 prof lp=$LOGS/search-$2-$PLACEMENT-$1 args nd lat
  prof=$(label "$base")
  args=$(profile_args "$base") || { failed "$path" "$prof" 0 "search: unknown profile"; return; }
  if ! path_up "$path" "$lp"; then
    path_down "$path" "$lp"; failed "$path" "$prof" 0 "search: $WHY"; return
  fi
  # shellcheck disable=SC2046,SC2086
  timeout 1800 "$PKTGEN" search $(pktgen_common) $args --duration "$SECS" --warmup "$WARMUP" \
    --loss-threshold 0.001 --trials "$SEARCH_TRIALS" --retries "$SEARCH_RETRIES" --json >"$lp.json" 2>"$lp.err"
  local rc=$?
  if [ $rc -ne 0 ] || ! jq -e '.no_drop_pps' "$lp.json" >/dev/null 2>&1; then
    path_down "$path" "$lp"
    failed "$path" "$prof" 0 "search: xlb-pktgen exited $rc: $(tail -n 3 "$lp.err" | tr '\n' ' ')"; return
  fi
  nd=$(jq -r '.no_drop_pps | floor' "$lp.json")
  lat=null
  if [ "$nd" -gt 0 ]; then
    # shellcheck disable=SC2046,SC2086
    timeout $((WARMUP + SECS + 60)) "$PKTGEN" run $(pktgen_common) $args --rate "$nd" \
      --duration "$SECS" --warmup "$WARMUP" --json >"$lp.confirm.json" 2>"$lp.confirm.err" &&
      lat=$(jq -c '{latency_ns:.latency_ns,confirm_rx_pps:.rx_pps,confirm_loss:.loss}' "$lp.confirm.json" 2>/dev/null || echo null)
  fi
  path_down "$path" "$lp"
  emit "$(jq -c --arg path "$path" --arg profile "$prof" --argjson pin "$(pinning "$path")" --argjson confirm "$lat" \
    '{kind:"search",path:$path,profile:$profile,no_drop_pps:.no_drop_pps,loss_threshold:0.001,pinning:$pin,
      latency_ns:($confirm.latency_ns // null),confirm_rx_pps:($confirm.confirm_rx_pps // null),
      confirm_loss:($confirm.confirm_loss // null),search:.}' "$lp.json")"
  say "  search $prof $path($(path_name "$path")): no-drop $(jq -r '.no_drop_pps/1e6*1000|round/1000' "$lp.json") Mpps, at that rate p50/p99 $(jq -r '(.latency_ns // {}) | "\(.p50 // "?") / \(.p99 // "?") ns"' <<<"$lat")"
}

# ---------------------------------------------------------------------------------------
# connections per second: nginx on the three backend addresses, wrk from gen
# ---------------------------------------------------------------------------------------
NGINX_DIR=$LOGS/nginx
start_nginx() {
  mkdir -p "$NGINX_DIR/tmp"
  cat >"$NGINX_DIR/nginx.conf" <<EOF
# make bench sink: one server on 10.251.1.11-13:80
daemon on;
worker_processes 1;
pid $NGINX_DIR/nginx.pid;
error_log $NGINX_DIR/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $NGINX_DIR/tmp/body;
    proxy_temp_path $NGINX_DIR/tmp/proxy;
    fastcgi_temp_path $NGINX_DIR/tmp/fastcgi;
    uwsgi_temp_path $NGINX_DIR/tmp/uwsgi;
    scgi_temp_path $NGINX_DIR/tmp/scgi;
    keepalive_timeout 5s;
    server {
        listen 80 default_server backlog=4096;
        default_type text/plain;
        location / { return 200 "ok\n"; }
    }
}
EOF
  nsx "$SINK" sysctl -qw net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096
  nsx "$SINK" nginx -c "$NGINX_DIR/nginx.conf" -p "$NGINX_DIR/" -e "$NGINX_DIR/error.log" </dev/null \
    >"$NGINX_DIR/nginx.out" 2>&1 || return 1
  for _ in $(seq 50); do
    nsx "$SINK" curl -sf --noproxy '*' -m 1 http://10.251.1.11/ >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
stop_nginx() {
  [ -f "$NGINX_DIR/nginx.pid" ] && kill -TERM "$(cat "$NGINX_DIR/nginx.pid")" 2>/dev/null
  sleep 0.3
}

cps_trial() {
  local path=$1 rep=$2 lp=$LOGS/cps-$1-$2 why rps errs
  if ! path_up "$path" "$lp"; then
    path_down "$path" "$lp"; failed "$path" http_close "$rep" "conn/s: $WHY"; return
  fi
  if ! nsx "$GEN" curl -sf --noproxy '*' -m 2 "http://$VIP/" >/dev/null 2>&1; then
    path_down "$path" "$lp"; failed "$path" http_close "$rep" "conn/s: curl http://$VIP/ through the path failed"; return
  fi
  nsx "$GEN" taskset -c "$GEN_CPU" wrk -t1 -c32 -d"${CPS_SECS}s" -H 'Connection: close' "http://$VIP/" \
    >"$lp.wrk.txt" 2>&1
  local rc=$?
  path_down "$path" "$lp"
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$lp.wrk.txt")
  if [ $rc -ne 0 ] || [ -z "$rps" ]; then
    failed "$path" http_close "$rep" "conn/s: wrk exited $rc: $(tail -n 2 "$lp.wrk.txt" | tr '\n' ' ')"; return
  fi
  errs=$(awk '/Socket errors:/ {gsub(",", ""); s += $4 + $6 + $8 + $10} /Non-2xx/ {s += $NF} END {print s + 0}' "$lp.wrk.txt")
  emit "$(jq -cn --arg path "$path" --arg name "$(path_name "$path")" --argjson repeat "$rep" \
    --argjson rps "$rps" --argjson errs "$errs" --argjson pin "$(pinning "$path")" --argjson load "$(load1)" \
    --arg wrk "$(cat "$lp.wrk.txt")" \
    '{kind:"cps",path:$path,path_name:$name,profile:"http_close",repeat:$repeat,generator:"wrk",
      requests_per_s:$rps,errors:$errs,pinning:$pin,host_load1:$load,wrk_output:$wrk}')"
  say "  conn/s $path($(path_name "$path")) #$rep: $rps req/s (errors $errs)"
}

# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------
ENVS=$(env | grep -E '^BENCH_' | sort | tr '\n' ' ')
COMMAND=${BENCH_COMMAND:-"${ENVS}bash perf/bench/run.sh"}
tool_version() { "$@" 2>&1 | head -n 1; }
emit "$(jq -cn --argjson repeats "$REPEATS" --argjson seconds "$SECS" --argjson warmup "$WARMUP" \
  --arg quick "$QUICK" --arg profiles "$PROFILES" --arg paths "$PATHS" --argjson cps_seconds "$CPS_SECS" \
  --arg nft "$(tool_version nft --version)" --arg ipt "$(tool_version iptables --version)" \
  --arg trafgen "$(tool_version trafgen --version)" --arg wrk "$(tool_version wrk --version)" \
  --arg nginx "$(tool_version nginx -v)" --arg ctmax "$(cat /proc/sys/net/netfilter/nf_conntrack_max 2>/dev/null)" \
  --arg rate "$RATE" --argjson macfwd_ring "$MACFWD_RING" --arg command "$COMMAND" --arg logs "$LOGS" --arg commit "$COMMIT" --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" \
  '{kind:"run",settings:{repeats:$repeats,seconds:$seconds,warmup_s:$warmup,quick:($quick=="1"),
    profiles:$profiles,paths:$paths,offered_load:(if $rate == "0" then "maximum (--rate 0)" else "\($rate) pps (--rate \($rate))" end),
    generator_cpu:0,forwarder_cpu:1,rps_l0_kernel_paths:"2 (CPU 1)",
    xlb_cores:"[1]",macfwd_ring_size:$macfwd_ring,cps_seconds:$cps_seconds,cps_connections:32,
    nft:$nft,iptables:$ipt,trafgen:$trafgen,wrk:$wrk,nginx:$nginx,nf_conntrack_max:$ctmax,
    command:$command,logs:$logs,commit:$commit,load_average_at_start:$load}}')"

if ! have "$PKTGEN"; then
  say "xlb-pktgen is not built: no packet-rate trials"
  failed all all 0 "xlb-pktgen not built"
else
  for path in $PATHS; do
    why=$(path_missing "$path")
    [ -z "$why" ] || say "path $path ($(path_name "$path")) will fail: $why"
  done
  n_trials=$(( REPEATS * $(wc -w <<<"$PLACEMENTS") * $(wc -w <<<"$PROFILES") * $(wc -w <<<"$PATHS") ))
  say "packet rate: up to $n_trials trials of ${WARMUP}+${SECS} s (placements: $PLACEMENTS; profiles: $PROFILES; paths: $PATHS)"
  for rep in $(seq "$REPEATS"); do
    for PLACEMENT in $PLACEMENTS; do
      for prof in $PROFILES; do
        for path in $PATHS; do
          # shared-rt changes only the userspace forwarders
          [ "$PLACEMENT" = shared-rt ] && { [ "$path" = c ] || [ "$path" = d ]; } && continue
          why=$(path_missing "$path")
          if [ -n "$why" ]; then failed "$path" "$(label "$prof")" "$rep" "$why"; continue; fi
          trial "$path" "$prof" "$rep"
        done
      done
    done
  done
  PLACEMENT=split
  if [ "$TRAFGEN" = 1 ]; then
    if command -v trafgen >/dev/null; then
      say "cross-check: trafgen udp64_1k on paths $TRAFGEN_PATHS"
      for rep in $(seq "$REPEATS"); do
        for path in $TRAFGEN_PATHS; do
          why=$(path_missing "$path")
          if [ -n "$why" ]; then failed "$path" udp64_1k "$rep" "trafgen: $why"; continue; fi
          trafgen_trial "$path" "$rep"
        done
      done
    else
      say "trafgen (netsniff-ng) missing: no cross-check"
    fi
  fi
  if [ "$SEARCH" = 1 ]; then
    say "no-drop search ($SEARCH_TRIALS bisection steps; a rejected step tried again up to $SEARCH_RETRIES time(s)) and latency at that rate: profiles $SEARCH_PROFILES, placements $PLACEMENTS, paths $PATHS"
    for PLACEMENT in $PLACEMENTS; do
      for prof in $SEARCH_PROFILES; do
        for path in $PATHS; do
          [ "$PLACEMENT" = shared-rt ] && { [ "$path" = c ] || [ "$path" = d ]; } && continue
          why=$(path_missing "$path")
          if [ -n "$why" ]; then failed "$path" "$(label "$prof")" 0 "search: $why"; continue; fi
          search_trial "$path" "$prof"
        done
      done
    done
    PLACEMENT=split
  fi
fi

if [ "$CPS" = 1 ]; then
  if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
    say "wrk or nginx missing: no conn/s"
  elif ! start_nginx; then
    say "nginx did not start in $SINK (see $NGINX_DIR): no conn/s"
    failed all http_close 0 "nginx did not start"
  else
    # wrk with `Connection: close` makes ~10k connections/s and nginx, which closes first,
    # keeps each in TIME_WAIT for 60 s; a new SYN that lands on a TIME_WAIT 4-tuple (3 backend
    # addresses x the client's ports) waits for a retransmit, so after two fast trials every
    # path fell to ~100 conn/s for a minute (first run, 2026-11-22). Benchmark-only settings:
    # the sink keeps no TIME_WAIT sockets and the client reuses its own.
    nsx "$SINK" sysctl -qw net.ipv4.tcp_max_tw_buckets=0
    nsx "$GEN" sysctl -qw net.ipv4.tcp_tw_reuse=1
    say "connections/s: wrk -t1 -c32 -d${CPS_SECS}s, Connection: close, paths $CPS_PATHS"
    for rep in $(seq "$REPEATS"); do
      for path in $CPS_PATHS; do
        why=$(path_missing "$path")
        if [ -n "$why" ]; then failed "$path" http_close "$rep" "conn/s: $why"; continue; fi
        cps_trial "$path" "$rep"
      done
    done
    stop_nginx
  fi
fi

cleanup
trap - EXIT
say "raw trials: $RAW"
"$REPORT" --raw "$RAW" --out-dir "$OUT" --command "$COMMAND" --date "$DATE" --commit "$COMMIT" || die "xlb-bench-report failed"
say "done in $((SECONDS - T0)) s: $OUT/latest.md, latest.json, latest.png (logs $LOGS)"
