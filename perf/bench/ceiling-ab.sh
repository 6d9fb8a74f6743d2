#!/usr/bin/env bash
# A/B of AF_XDP forwarders on the `make bench` testbed: xlb-macfwd (our ceiling, optionally with
# --batch 32) against dpdk-testpmd on DPDK's AF_XDP PMD (with and without its preferred busy
# polling), interleaved, at maximum offered load or at a fixed rate.
#
# Usage: sudo bash perf/bench/ceiling-ab.sh [ROUNDS (4)] [TRIALS_PER_ROUND (3)]
# Environment: AB_RATE (0 = maximum; pps otherwise), AB_SECONDS (3), AB_KINDS
#   ("macfwd testpmd testpmd_nobusy macfwd_b32"). Needs the release binaries (xlb-macfwd,
#   xlb-pktgen: cargo build --release -p xlb-perf) and dpdk-testpmd
#   (scripts/install-deps.sh bench). Prints one line per trial: KIND rx_mpps tx_mpps loss p50_ns
#   p99_ns, then the median per kind. The testbed (namespaces xlbab-*) is deleted on exit.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
ROUNDS=${1:-4} TRIALS=${2:-3}
RATE=${AB_RATE:-0} SECS=${AB_SECONDS:-3}
KINDS=${AB_KINDS:-"macfwd testpmd testpmd_nobusy macfwd_b32"}
P=xlbab GEN=xlbab-gen LB=xlbab-lb SINK=xlbab-sink
MAC_G0=02:00:0a:fb:00:02 MAC_L0=02:00:0a:fb:00:01 MAC_S0=02:00:0a:fb:01:0b
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
LOGS=$(mktemp -d /tmp/xlb-ab.XXXXXX)
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 1; }
for t in "$B/xlb-macfwd" "$B/xlb-pktgen"; do [ -x "$t" ] || { echo "missing $t (cargo build --release -p xlb-perf)" >&2; exit 1; }; done
FWD=
cleanup() {
  [ -n "$FWD" ] && { kill -TERM "$FWD" 2>/dev/null; wait "$FWD" 2>/dev/null; }
  bash "$ROOT/perf/bench/testbed.sh" down "$P" >/dev/null 2>&1
}
trap cleanup EXIT
bash "$ROOT/perf/bench/testbed.sh" up "$P" >/dev/null || { echo "testbed up failed" >&2; exit 1; }

start() {
  case $1 in
    macfwd | macfwd_b32)
      local extra=; [ "$1" = macfwd_b32 ] && extra="--batch 32"
      # shellcheck disable=SC2086
      ip netns exec "$LB" "$B/xlb-macfwd" --in-iface l0 --out-iface l1 --dst-mac "$MAC_S0" --cpu 1 \
        --duration 0 $extra >"$LOGS/$1.log" 2>&1 & ;;
    testpmd | testpmd_nobusy)
      local bb=; [ "$1" = testpmd_nobusy ] && bb=",busy_budget=0"
      ip netns exec "$LB" dpdk-testpmd -l 0,1 --main-lcore 0 --no-huge -m 1024 --no-pci --file-prefix "$P-tp" \
        --vdev "net_af_xdp0,iface=l0,start_queue=0,queue_count=1$bb" \
        --vdev "net_af_xdp1,iface=l1,start_queue=0,queue_count=1$bb" \
        -- --total-num-mbufs=16384 --forward-mode=mac --eth-peer="1,$MAC_S0" --auto-start --stats-period 60 \
        </dev/null >"$LOGS/$1.log" 2>&1 & ;;
    *) echo "unknown kind $1" >&2; return 1 ;;
  esac
  FWD=$!
  sleep 3
}

OUT=$LOGS/trials.txt
for r in $(seq "$ROUNDS"); do
  for k in $KINDS; do
    start "$k" || continue
    for _ in $(seq "$TRIALS"); do
      "$B/xlb-pktgen" run --tx-netns "$GEN" --tx-iface g0 --rx-netns "$SINK" --rx-iface s0 --cpu 0 \
        --src-mac "$MAC_G0" --dst-mac "$MAC_L0" --src-ip 10.252.0.1 --dst-ip 10.251.100.1 \
        --proto udp --size 64 --flows 1000 --dst-port 9 --rate "$RATE" --duration "$SECS" --warmup 1 --json 2>/dev/null |
        jq -r --arg k "$k" '"\($k) \(.rx_pps/1e6) \(.tx_pps/1e6) \(.loss) \(.latency_ns.p50) \(.latency_ns.p99)"' | tee -a "$OUT"
    done
    kill -TERM "$FWD" 2>/dev/null; wait "$FWD" 2>/dev/null; FWD=
  done
done
echo "== median forwarded Mpps per kind (round $ROUNDS x $TRIALS trials, rate ${RATE:-max}) =="
python3 - "$OUT" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    t = line.split()
    d[t[0]].append(float(t[1]))
for k, v in d.items():
    print(f"{k} median {statistics.median(v):.3f} min {min(v):.3f} max {max(v):.3f} trials {len(v)}")
PY
