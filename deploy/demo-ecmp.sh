#!/usr/bin/env bash
# Scale-out demo: one VIP behind three xlb nodes that announce it over BGP through BIRD 2, a
# router spreading flows over them with ECMP (deploy/testbed-ecmp.sh). Shows the routes the
# router's BIRD learned, the multipath kernel route, how a client's connections spread over
# the nodes (each node's own counters) and the backends, and what happens when one node stops
# (its xlb withdraws the VIP before it exits). Run as root: `make demo-ecmp`.
# Everything it starts is torn down on exit, failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${XLB_DEMO_PREFIX:-xlbecmpdemo}
export XLB_BIN=${XLB_BIN:-${CARGO_TARGET_DIR:-target}/release/xlb}
export XLB_ECMP_RUNDIR=${XLB_ECMP_RUNDIR:-/run/xlb-ecmp}
D=$XLB_ECMP_RUNDIR/$P
N=${XLB_DEMO_REQUESTS:-90}
VIP=10.251.100.1

[ "$(id -u)" -eq 0 ] || { echo "demo-ecmp: needs root (network namespaces, XDP)" >&2; exit 1; }
[ -x "$XLB_BIN" ] || { echo "demo-ecmp: $XLB_BIN is missing: run 'make demo-ecmp' (it builds it)" >&2; exit 1; }

cleanup() { bash deploy/testbed-ecmp.sh down "$P" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

C=(ip netns exec "$P-client")
rt_birdc() { birdc -s "$D/rt/bird.ctl" "$@"; }
# node_new_flows K: new flows node nK's xlb scheduled, summed over its backends
node_new_flows() {
  "$XLB_BIN" stats --admin-socket "$D/n$1/admin.sock" 2>/dev/null |
    awk '$1 == "backend" { for (i = 1; i < NF; i++) if ($i == "new_flows") s += $(i + 1) } END { print s + 0 }'
}

echo "== testbed up ($P)"
bash deploy/testbed-ecmp.sh up "$P"

echo
echo "== the router's BIRD: the VIP learned from each node (birdc show route $VIP/32)"
rt_birdc show route "$VIP/32" | sed -n '2,$p' | sed 's/^/   /'
echo
echo "== the router's kernel: one route, three next hops (ip route show $VIP)"
ip netns exec "$P-rt" ip route show "$VIP" | sed 's/^/   /'
echo "   net.ipv4.fib_multipath_hash_policy = $(ip netns exec "$P-rt" sysctl -n net.ipv4.fib_multipath_hash_policy) (L4: ports are hashed too)"
echo
echo "== what each node's xlb wrote for BIRD ($D/n1/vips4.conf)"
sed 's/^/   /' "$D/n1/vips4.conf"

declare -A BE
fails=0
before=()
for k in 1 2 3; do before[k]=$(node_new_flows "$k"); done
echo
echo "== $N HTTP requests from the client to $VIP (a new connection each)"
for _ in $(seq "$N"); do
  if out=$("${C[@]}" curl -s -m 2 "http://$VIP/") && [[ $out =~ ^(be[0-9])$ ]]; then
    BE[${BASH_REMATCH[1]}]=$((${BE[${BASH_REMATCH[1]}]:-0} + 1))
  else
    fails=$((fails + 1))
  fi
done
printf '   %-34s %6s %6s %6s\n' "" n1 n2 n3
printf '   %-34s %6s %6s %6s\n' "new flows per xlb node (xlb stats)" \
  $(($(node_new_flows 1) - before[1])) $(($(node_new_flows 2) - before[2])) $(($(node_new_flows 3) - before[3]))
printf '   %-34s %6s %6s %6s\n' "" be1 be2 be3
printf '   %-34s %6s %6s %6s\n' "answers per backend" "${BE[be1]:-0}" "${BE[be2]:-0}" "${BE[be3]:-0}"
echo "   failed requests: $fails"
spread=0
for k in 1 2 3; do [ $(($(node_new_flows "$k") - before[k])) -gt 0 ] && spread=$((spread + 1)); done

echo
echo "== per-node counters (xlb stats: workers, demo/web's backends)"
for k in 1 2 3; do
  echo "   n$k:"
  "$XLB_BIN" stats --admin-socket "$D/n$k/admin.sock" | grep -E "^worker [0-9]+ rx |^backend demo/web:" | sed 's/^/     /'
done

echo
echo "== stopping xlb on n3 (SIGTERM): it withdraws the VIP, then stops"
t0=$(date +%s%N)
kill -TERM "$(cat "$D/n3/xlb.pid")"
paths=3
for _ in $(seq 100); do
  r=$(ip netns exec "$P-rt" ip route show "$VIP")
  paths=$(grep -c 'nexthop via' <<<"$r" || true)
  [ "$paths" -eq 2 ] && break
  sleep 0.05
done
echo "   the router's route has $paths next hops $((($(date +%s%N) - t0) / 1000000)) ms after the signal:"
ip netns exec "$P-rt" ip route show "$VIP" | sed 's/^/   /'
grep -E "withdrawing|announced VIPs" "$D/n3/xlb.log" | tail -2 | sed 's/^[^ ]* */   n3: /'
fails2=0
for _ in $(seq 30); do "${C[@]}" curl -s -m 2 "http://$VIP/" >/dev/null || fails2=$((fails2 + 1)); done
echo "   30 more requests through n1 and n2: $fails2 failed"

echo
[ "$fails" -eq 0 ] && [ "$fails2" -eq 0 ] || { echo "demo-ecmp: requests failed" >&2; exit 1; }
[ "$spread" -eq 3 ] || { echo "demo-ecmp: flows reached only $spread of 3 nodes" >&2; exit 1; }
[ "$paths" -eq 2 ] || { echo "demo-ecmp: n3's route was not withdrawn" >&2; exit 1; }
echo "demo-ecmp: ok"
