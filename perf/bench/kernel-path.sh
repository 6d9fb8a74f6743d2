#!/usr/bin/env bash
# HTTP request rate through xlb to a backend reached over the NIC against one reached through
# the kernel (the pod be4 behind the lb's veth: DNAT, write into the punt device, reply read
# back from it), on the namespace testbed (deploy/testbed.sh), interleaved.
#
# Usage: sudo bash perf/bench/kernel-path.sh [ROUNDS (3)] [SECONDS (5)]
# Needs wrk and target/release/xlb (make build-release). Prints one line per trial
# (`PATH requests_per_s`), then the median of each path and
# `kernel_path_over_nic_path_request_rate` (their ratio, from the same run). Both targets are
# single-backend eTP Local LoadBalancer IPs: 10.250.100.32 (be4, through the kernel) and a
# Service added for this run, 10.250.100.40 (be1, over eth0). The testbed is deleted on exit.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
ROUNDS=${1:-3} SECS=${2:-5}
P=xlbkp
XLB=${CARGO_TARGET_DIR:-$ROOT/target}/release/xlb
RUN=$(mktemp -d /tmp/xlb-kp.XXXXXX)
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 1; }
[ -x "$XLB" ] || { echo "missing $XLB (make build-release)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "missing wrk (scripts/install-deps.sh test)" >&2; exit 1; }
XPID=
cleanup() {
  [ -n "$XPID" ] && { kill -INT "$XPID" 2>/dev/null; wait "$XPID" 2>/dev/null; }
  bash "$ROOT/deploy/testbed.sh" down "$P" >/dev/null 2>&1
  rm -rf "$RUN"
}
trap cleanup EXIT
bash "$ROOT/deploy/testbed.sh" up "$P" >/dev/null || { echo "testbed up failed" >&2; exit 1; }
{
  cat deploy/examples/testbed.yaml
  cat <<'YAML'
---
apiVersion: v1
kind: Service
metadata: {name: nicpath, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 10.250.100.41
  clusterIPs: [10.250.100.41]
  externalTrafficPolicy: Local
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 80, nodePort: 30087}
  selector: {app: nicpath}
status:
  loadBalancer:
    ingress:
    - ip: 10.250.100.40
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: nicpath-x1
  namespace: demo
  labels: {kubernetes.io/service-name: nicpath}
addressType: IPv4
endpoints:
- {addresses: [10.250.2.11], conditions: {ready: true}, nodeName: xlb-node}
ports:
- {name: http, port: 80, protocol: TCP}
YAML
} >"$RUN/xlb.yaml"
ip netns exec "$P-lb" "$XLB" run --config "$RUN/xlb.yaml" --admin-socket "$RUN/xlb.sock" >"$RUN/xlb.log" 2>&1 &
XPID=$!
for _ in $(seq 50); do [ -S "$RUN/xlb.sock" ] && break; sleep 0.1; done
[ -S "$RUN/xlb.sock" ] || { cat "$RUN/xlb.log"; echo "xlb did not come up" >&2; exit 1; }
sleep 1
declare -A ALL
for _ in $(seq "$ROUNDS"); do
  for path in nic kernel; do
    url=http://10.250.100.40/; [ $path = kernel ] && url=http://10.250.100.32/
    rps=$(ip netns exec "$P-client" wrk -t1 -c4 -d"${SECS}s" "$url" 2>/dev/null | awk '/Requests\/sec/ {print $2}')
    echo "$path ${rps:-0}"
    ALL[$path]+="${rps:-0} "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
nic=$(echo "${ALL[nic]}" | median) kernel=$(echo "${ALL[kernel]}" | median)
echo "nic_path_request_rate $nic req/s"
echo "kernel_path_request_rate $kernel req/s"
awk -v k="$kernel" -v n="$nic" 'BEGIN {printf "kernel_path_over_nic_path_request_rate %.2f ratio\n", (n > 0 ? k / n : 0)}'
ip netns exec "$P-lb" "$XLB" stats --admin-socket "$RUN/xlb.sock" | grep -E "xsk" | sed 's/^/# /'
