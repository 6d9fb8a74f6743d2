#!/usr/bin/env bash
# A/B of xlb's forwarding rate with and without `xlb monitor --drops` attached (issue 13: the
# drop monitor must not slow forwarding by more than a few percent), on the `make bench`
# testbed (perf/bench/testbed.sh, perf/bench/bench.yaml: worker on CPU 1), udp64_1k at
# maximum offered load, interleaved rounds.
#
# AB_MODE=drops: most of the offered traffic is dropped by xlb, so an attached monitor
# captures at its rate cap (10,000 lines/s; the workers' taps copy until their queues are
# full). The config gets one more Service, `gate`: a LoadBalancer ingress 10.251.100.2 UDP
# port 9, eTP Local, endpoints the sink's addresses, loadBalancerSourceRanges 10.252.0.1/32.
# xlb-pktgen sends udp64 to it with 240,000 flows: tuple i comes from 10.252.0.(1 + i/60000),
# so a quarter (60,000 flows from 10.252.0.1) is forwarded and three quarters are dropped as
# source_range_denied (slow path: frontend lookup, range check), in runs of 60,000 packets.
#
# Usage: sudo [AB_MODE=drops] bash perf/bench/monitor-ab.sh [ROUNDS (3)] [TRIALS_PER_ROUND (3)]
# Environment: AB_SECONDS (3), AB_MODE (forward: no drops, the default; drops: see above).
# Needs the release binaries xlb, xlb-pktgen (cargo build --release -p xlb -p xlb-perf).
# Prints one line per trial: KIND rx_mpps tx_mpps loss p50_ns p99_ns worker_rx_mpps
# worker_drop_mpps (rx_mpps: forwarded frames at the sink; worker_*: the worker's rx and
# drop counters (`xlb stats`) over the wall time of the xlb-pktgen run, warm-up, start-up and
# drain included, so lower than the rate while sending), then the medians per kind and the
# ratios monitor / no monitor. The testbed (namespaces xlbmon-*) is deleted on exit.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
ROUNDS=${1:-3} TRIALS=${2:-3} SECS=${AB_SECONDS:-3} MODE=${AB_MODE:-forward}
P=xlbmon GEN=xlbmon-gen LB=xlbmon-lb SINK=xlbmon-sink
MAC_G0=02:00:0a:fb:00:02 MAC_L0=02:00:0a:fb:00:01
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
LOGS=$(mktemp -d /tmp/xlb-monitor-ab.XXXXXX)
SOCK=$LOGS/xlb.sock
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 1; }
for t in "$B/xlb" "$B/xlb-pktgen"; do [ -x "$t" ] || { echo "missing $t (cargo build --release -p xlb -p xlb-perf)" >&2; exit 1; }; done
CONFIG=perf/bench/bench.yaml DST=10.251.100.1 FLOWS=1000
case $MODE in
  forward) ;;
  drops)
    CONFIG=$LOGS/bench-drops.yaml DST=10.251.100.2 FLOWS=240000
    cat perf/bench/bench.yaml - >"$CONFIG" <<'YAML'
---
apiVersion: v1
kind: Service
metadata: {name: gate, namespace: bench}
spec:
  type: LoadBalancer
  clusterIP: 10.251.100.3
  clusterIPs: [10.251.100.3]
  externalTrafficPolicy: Local
  loadBalancerSourceRanges: [10.252.0.1/32]
  ports:
  - {name: discard, port: 9, protocol: UDP, targetPort: 9, nodePort: 30009}
  selector: {app: gate}
status:
  loadBalancer:
    ingress:
    - ip: 10.251.100.2
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: gate-1
  namespace: bench
  labels: {kubernetes.io/service-name: gate}
addressType: IPv4
endpoints:
- {addresses: [10.251.1.11], conditions: {ready: true, serving: true, terminating: false}, nodeName: xlb-bench}
- {addresses: [10.251.1.12], conditions: {ready: true, serving: true, terminating: false}, nodeName: xlb-bench}
- {addresses: [10.251.1.13], conditions: {ready: true, serving: true, terminating: false}, nodeName: xlb-bench}
ports:
- {name: discard, port: 9, protocol: UDP}
YAML
    "$B/xlb" check --config "$CONFIG" >"$LOGS/check.txt" 2>&1 || { cat "$LOGS/check.txt" >&2; exit 1; }
    ;;
  *) echo "AB_MODE must be forward or drops" >&2; exit 2 ;;
esac
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
  ip netns exec "$LB" "$B/xlb" run --config "$CONFIG" --admin-socket "$SOCK" </dev/null >"$LOGS/$1.log" 2>&1 &
  XLB_PID=$!
  for _ in $(seq 600); do
    "$B/xlb" services --admin-socket "$SOCK" 2>/dev/null | grep -q "$DST" && break
    sleep 0.05
  done
  if [ "$1" = xlb_monitor ]; then
    "$B/xlb" monitor --drops --admin-socket "$SOCK" >"$LOGS/monitor.out" 2>"$LOGS/monitor.err" &
    MON_PID=$!
    for _ in $(seq 100); do grep -q "drop monitor started" "$LOGS/$1.log" && break; sleep 0.05; done
    grep -q "drop monitor started" "$LOGS/$1.log" || { echo "the monitor did not attach" >&2; exit 1; }
  fi
  sleep 0.5
}

# The worker's counters now: "RX DROPS" (frames received, frames dropped for any reason).
counters() {
  "$B/xlb" stats --admin-socket "$SOCK" 2>/dev/null |
    awk '$1 == "worker" && $3 == "rx" { rx += $4 } $1 == "worker" && $3 == "drop" { d += $5 } END { print rx + 0, d + 0 }'
}

OUT=$LOGS/trials.txt
for r in $(seq "$ROUNDS"); do
  for k in xlb xlb_monitor; do
    start "$k"
    for _ in $(seq "$TRIALS"); do
      read -r rx0 d0 < <(counters)
      t0=$(date +%s.%N)
      res=$("$B/xlb-pktgen" run --tx-netns "$GEN" --tx-iface g0 --rx-netns "$SINK" --rx-iface s0 --cpu 0 \
        --src-mac "$MAC_G0" --dst-mac "$MAC_L0" --src-ip 10.252.0.1 --dst-ip "$DST" \
        --proto udp --size 64 --flows "$FLOWS" --dst-port 9 --rate 0 --duration "$SECS" --warmup 1 --json 2>/dev/null |
        jq -r '"\(.rx_pps/1e6) \(.tx_pps/1e6) \(.loss) \(.latency_ns.p50) \(.latency_ns.p99)"')
      t1=$(date +%s.%N)
      read -r rx1 d1 < <(counters)
      w=$(awk -v a="$rx0" -v b="$rx1" -v c="$d0" -v d="$d1" -v t="$t0" -v u="$t1" \
        'BEGIN { printf "%.4f %.4f", (b - a) / (u - t) / 1e6, (d - c) / (u - t) / 1e6 }')
      echo "$k $res $w" | tee -a "$OUT"
    done
    if [ "$k" = xlb_monitor ]; then
      echo "  monitor: $(wc -l <"$LOGS/monitor.out") lines; $(grep -c 'not copied' "$LOGS/monitor.err") notes of frames not copied, $(grep -o '^note: [0-9]*' "$LOGS/monitor.err" | awk '{ s += $2 } END { print s + 0 }') frames in all"
    fi
    stop
  done
done
echo "== medians per kind ($MODE: $ROUNDS rounds x $TRIALS trials, udp64 $FLOWS flows to $DST, maximum rate) =="
python3 - "$OUT" "$TRIALS" <<'PY'
import collections, statistics, sys
cols = ["forwarded_mpps", "offered_mpps", "loss", "p50_ns", "p99_ns", "worker_rx_mpps", "worker_drop_mpps"]
d = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    t = line.split()
    for c, v in zip(cols, t[1:]):
        d[t[0]][c].append(float(v))
for k, m in d.items():
    print(k, " ".join(f"{c} {statistics.median(m[c]):.3f} ({min(m[c]):.3f}-{max(m[c]):.3f})" for c in cols if c in m),
          f"trials {len(m[cols[0]])}")
if "xlb" in d and "xlb_monitor" in d:
    n = int(sys.argv[2])
    for c in ["forwarded_mpps", "worker_rx_mpps", "worker_drop_mpps"]:
        a, b = d["xlb"][c], d["xlb_monitor"][c]
        if statistics.median(a) > 0:
            # Per round: the medians of its n trials of each kind (rounds run in this order).
            rounds = [statistics.median(b[i:i + n]) / statistics.median(a[i:i + n]) for i in range(0, len(a), n)]
            print(f"xlb_monitor / xlb, {c}: {statistics.median(b) / statistics.median(a):.3f};",
                  "by round", " ".join(f"{x:.3f}" for x in rounds))
PY
