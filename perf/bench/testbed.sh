#!/usr/bin/env bash
# `make bench` testbed: two-armed, three namespaces, nothing in the root namespace.
#
#   $P-gen                      $P-lb                               $P-sink
#   g0 10.251.0.2/24 <-veth-> l0 10.251.0.1/24   l1 10.251.1.1/24 <-veth-> s0 10.251.1.11/24
#   routes 10.251.1.0/24,        ip_forward=1, rp_filter=0            10.251.1.12/24
#   10.251.100.0/24 via .0.1     static neighbours for all            10.251.1.13/24
#                                                                     default via 10.251.1.1
#
# Usage: perf/bench/testbed.sh up|down|status [PREFIX]    (PREFIX default xlbbench)
#   up     deletes a leftover testbed of the same prefix first, then builds it.
#   down   kills every process inside the namespaces and deletes them; idempotent.
# MACs are fixed (xlb-pktgen, trafgen and bench.yaml use them):
#   g0 02:00:0a:fb:00:02  l0 02:00:0a:fb:00:01  l1 02:00:0a:fb:01:01  s0 02:00:0a:fb:01:0b
set -euo pipefail

cmd=${1:-}
P=${2:-xlbbench}
[[ $P =~ ^[A-Za-z0-9]{1,20}$ ]] || { echo "testbed: bad prefix $P" >&2; exit 2; }
GEN=$P-gen LB=$P-lb SINK=$P-sink

MAC_G0=02:00:0a:fb:00:02
MAC_L0=02:00:0a:fb:00:01
MAC_L1=02:00:0a:fb:01:01
MAC_S0=02:00:0a:fb:01:0b

do_down() {
  local ns pids
  for ns in "$GEN" "$LB" "$SINK"; do
    [ -e "/run/netns/$ns" ] || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
      for _ in $(seq 30); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -z "$pids" ] && break
        sleep 0.1
      done
      # shellcheck disable=SC2086
      [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    fi
    ip netns delete "$ns" 2>/dev/null || true
  done
}

do_up() {
  [ "$(id -u)" -eq 0 ] || { echo "testbed: needs root" >&2; exit 1; }
  do_down
  local ns
  for ns in "$GEN" "$LB" "$SINK"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  ip link add g0 netns "$GEN" address "$MAC_G0" type veth peer name l0 netns "$LB" address "$MAC_L0"
  ip link add l1 netns "$LB" address "$MAC_L1" type veth peer name s0 netns "$SINK" address "$MAC_S0"

  for ns in "$GEN" "$LB" "$SINK"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
      net.ipv4.conf.all.accept_redirects=0 net.ipv6.conf.all.disable_ipv6=1 \
      net.ipv6.conf.default.disable_ipv6=1
  done
  ip netns exec "$LB" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 \
    net.ipv4.conf.default.send_redirects=0
  ip netns exec "$LB" sysctl -qw net.ipv4.conf.l0.rp_filter=0 net.ipv4.conf.l1.rp_filter=0
  ip netns exec "$GEN" sysctl -qw net.ipv4.conf.g0.rp_filter=0
  ip netns exec "$SINK" sysctl -qw net.ipv4.conf.s0.rp_filter=0

  ip -n "$GEN" addr add 10.251.0.2/24 dev g0
  ip -n "$LB" addr add 10.251.0.1/24 dev l0
  ip -n "$LB" addr add 10.251.1.1/24 dev l1
  ip -n "$SINK" addr add 10.251.1.11/24 dev s0
  ip -n "$SINK" addr add 10.251.1.12/24 dev s0
  ip -n "$SINK" addr add 10.251.1.13/24 dev s0
  ip -n "$GEN" link set g0 up
  ip -n "$LB" link set l0 up
  ip -n "$LB" link set l1 up
  ip -n "$SINK" link set s0 up
  ip -n "$GEN" route add 10.251.1.0/24 via 10.251.0.1
  ip -n "$GEN" route add 10.251.100.0/24 via 10.251.0.1
  ip -n "$SINK" route add default via 10.251.1.1
  # xlb-pktgen's source addresses (10.252.0.1 and up) live "behind" the generator
  ip -n "$LB" route add 10.252.0.0/16 via 10.251.0.2

  # static neighbours: the sink's XDP receiver does not answer ARP while it is attached
  ip -n "$GEN" neigh replace 10.251.0.1 lladdr "$MAC_L0" dev g0 nud permanent
  ip -n "$LB" neigh replace 10.251.0.2 lladdr "$MAC_G0" dev l0 nud permanent
  for b in 11 12 13; do
    ip -n "$LB" neigh replace "10.251.1.$b" lladdr "$MAC_S0" dev l1 nud permanent
  done
  ip -n "$SINK" neigh replace 10.251.1.1 lladdr "$MAC_L1" dev s0 nud permanent

  # feasibility trap 1: CHECKSUM_PARTIAL frames pass AF_XDP with an incomplete L4 checksum
  ip netns exec "$GEN" ethtool -K g0 tx off >/dev/null
  ip netns exec "$SINK" ethtool -K s0 tx off >/dev/null
}

do_status() {
  local ns
  for ns in "$GEN" "$LB" "$SINK"; do
    if [ -e "/run/netns/$ns" ]; then
      echo "== $ns"
      ip -n "$ns" -br addr
      ip -n "$ns" -d link show | grep -E "^[0-9]+:|xdp" || true
    else
      echo "== $ns: absent"
    fi
  done
}

case "$cmd" in
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
  *) echo "usage: $0 up|down|status [PREFIX]" >&2; exit 2 ;;
esac
