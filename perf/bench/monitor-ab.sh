#!/usr/bin/env bash
# A/B of xlb's forwarding rate with and without `xlb monitor --drops` attached (issue 13: the
# drop monitor must not slow forwarding by more than a few percent), on the `make bench`
# testbed (perf/bench/testbed.sh, perf/bench/bench.yaml: worker on CPU 1), udp64_1k at
# maximum offered load, interleaved rounds.
#
# Usage: sudo bash perf/bench/monitor-ab.sh [ROUNDS (3)] [TRIALS_PER_ROUND (3)]
# Environment: AB_SECONDS (3). Needs the release binaries xlb, xlb-pktgen
# (cargo build --release -p xlb -p xlb-perf). Prints one line per trial: KIND rx_mpps tx_mpps
# loss p50_ns p99_ns, then the median per kind. The testbed (namespaces xlbmon-*) is deleted
# on exit.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
ROUNDS=${1:-3} TRIALS=${2:-3} SECS=${AB_SECONDS:-3}
P=xlbmon GEN=xlbmon-gen LB=xlbmon-lb SINK=xlbmon-sink
MAC_G0=02:00:0a:fb:00:02 MAC_L0=02:00:0a:fb:00:01
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
LOGS=$(mktemp -d /tmp/xlb-monitor-ab.XXXXXX)
SOCK=$LOGS/xlb.sock
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 1; }
for t in "$B/xlb" "$B/xlb-pktgen"; do [ -x "$t" ] || { echo "missing $t (cargo build --release -p xlb -p xlb-perf)" >&2; exit 1; }; done
XLB_PID= MON_PID=
stop() {
  [ -n "$MON_PID" ] && { kill -TERM "$MON_PID" 2>/dev/null; wait "$MON_PID" 2>/dev/null; MON_PID=; }
  [ -n "$XLB_PID" ] && { kill -TERM "$XLB_PID" 2>/dev/null; wait "$XLB_PID" 2>/dev/null; XLB_PID=; }
}
cleanup() { stop; bash "$ROOT/perf/bench/testbed.sh" down "$P" >/dev/null 2>&1; }
trap cleanup EXIT
bash "$ROOT/perf/bench/testbed.sh" up "$P" >/dev/null || { echo "testbed up failed" >&2; exit 1; }

start() { # KIND: xlb, or xlb_monitor (a drop monitor attached for the whole round)
  rm -f "$SOCK"
  ip netns exec "$LB" "$B/xlb" run --config perf/bench/bench.yaml --admin-socket "$SOCK" </dev/null >"$LOGS/$1.log" 2>&1 &
  XLB_PID=$!
  for _ in $(seq 600); do
    "$B/xlb" services --admin-socket "$SOCK" 2>/dev/null | grep -q 10.251.100.1 && break
    sleep 0.05
  done
  if [ "$1" = xlb_monitor ]; then
    "$B/xlb" monitor --drops --admin-socket "$SOCK" >"$LOGS/monitor.out" 2>&1 &
    MON_PID=$!
    for _ in $(seq 100); do grep -q "drop monitor started" "$LOGS/$1.log" && break; sleep 0.05; done
    grep -q "drop monitor started" "$LOGS/$1.log" || { echo "the monitor did not attach" >&2; exit 1; }
  fi
  sleep 0.5
}

OUT=$LOGS/trials.txt
for r in $(seq "$ROUNDS"); do
  for k in xlb xlb_monitor; do
    start "$k"
    for _ in $(seq "$TRIALS"); do
      "$B/xlb-pktgen" run --tx-netns "$GEN" --tx-iface g0 --rx-netns "$SINK" --rx-iface s0 --cpu 0 \
        --src-mac "$MAC_G0" --dst-mac "$MAC_L0" --src-ip 10.252.0.1 --dst-ip 10.251.100.1 \
        --proto udp --size 64 --flows 1000 --dst-port 9 --rate 0 --duration "$SECS" --warmup 1 --json 2>/dev/null |
        jq -r --arg k "$k" '"\($k) \(.rx_pps/1e6) \(.tx_pps/1e6) \(.loss) \(.latency_ns.p50) \(.latency_ns.p99)"' | tee -a "$OUT"
    done
    stop
  done
done
echo "== median forwarded Mpps per kind ($ROUNDS rounds x $TRIALS trials, udp64_1k, maximum rate) =="
python3 - "$OUT" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    t = line.split()
    d[t[0]].append(float(t[1]))
for k, v in d.items():
    print(f"{k} median {statistics.median(v):.3f} min {min(v):.3f} max {max(v):.3f} trials {len(v)}")
if "xlb" in d and "xlb_monitor" in d:
    print(f"xlb_monitor / xlb: {statistics.median(d['xlb_monitor']) / statistics.median(d['xlb']):.3f}")
PY
