#!/usr/bin/env bash
# xlb scale-out testbed: a router spreading VIPs over three xlb nodes with ECMP, each node
# announcing them over BGP through its own BIRD 2 (announce.mode: bgp), three backends and
# a client. Everything in network namespaces; `make demo-ecmp` drives it (deploy/demo-ecmp.sh).
#
#   client 10.251.0.2 ── 10.251.0.1 router (BIRD, AS 65000; ECMP, fib_multipath_hash_policy=1)
#                                    10.251.1.1
#                                        │ fabric: one bridge (ns $P-sw), 10.251.1.0/24
#            ┌───────────────┬───────────┼────────────┬──────────────┬──────────────┐
#   n1 10.251.1.11   n2 10.251.1.12   n3 10.251.1.13   be1 .21   be2 .22   be3 .23
#   xlb + BIRD (AS 65001 each), one-armed on eth0       nginx on :80 ("beN")
#
# Four LoadBalancer Services, the same on every node (generated config), all Maglev (`mh`):
#   demo/web   VIP 10.251.100.1:80 -> nginx :80. Masqueraded (externalTrafficPolicy:
#              Cluster) to the node's own address, so the backends' replies return to the
#              node that took the flow: a flow the router moves to another node breaks there.
#   demo/echo  VIP 10.251.100.2:9100 -> :9100 (annotation xlb.dev/forwarding-mode: dsr-l2).
#              The node only rewrites the MAC addresses; every backend holds the VIP on `lo`
#              (arp_ignore=1, arp_announce=2 on its eth0, so it never answers ARP for it) and
#              replies to the client directly through the router. A flow the router moves is
#              picked up by the next node (a TCP segment without SYN starts a tracked flow,
#              `flow_picked_up`) and Maglev sends it to the same backend.
#   demo/echo-nat  VIP 10.251.100.3:9100 -> :9100, DNAT only (externalTrafficPolicy: Local;
#              each node's copy of the EndpointSlice names that node as the endpoints' node,
#              so every node keeps the client's address and builds the same Maglev table).
#              The backends see the client's own address and must send each reply to the node
#              that forwarded the request: nftables on every backend marks the connection with
#              the node whose MAC address sent its latest packet (ct mark), and the replies
#              (source port 9100 from the backend's own address) are routed by that mark to
#              that node, which un-DNATs them. A moved flow's next segment comes from the new
#              node, which picks the flow up, and its replies follow.
#   demo/echo-snat VIP 10.251.100.4:9100 -> :9100, masqueraded as demo/web is: the control
#              case, whose moved flows break.
#   Nothing listens on :9100 here: tests/tests/ecmp.rs starts an echo service on the backends.
# The router's BIRD learns both VIPs from all three nodes and installs one multipath route
# each (kernel protocol `merge paths on`); with fib_multipath_hash_policy=1 the router hashes
# each flow's ports too, so the client's connections spread over the nodes. The router's
# BGP sessions use a 3 s hold time, so a node that dies without closing its session (its link
# cut) is dropped from the route after at most 3 s.
#
# Usage: deploy/testbed-ecmp.sh up|down|status [PREFIX]   (PREFIX defaults to xlbecmp)
#   up      namespaces, addresses, backends, the router's BIRD, then on each node its BIRD
#           and xlb (XLB_BIN, default ${CARGO_TARGET_DIR:-target}/release/xlb); waits until
#           the router routes the VIP over all three nodes. Tears down on failure.
#   down    stops every process in the namespaces and deletes them and the run directory.
#   status  namespaces, the router's routes to the VIPs, each node's BGP session.
# Environment: XLB_ECMP_RUNDIR (default /run/xlb-ecmp) holds $PREFIX/ with configs and logs;
# XLB_ECMP_DNAT_RETURN (latest or first) as at backend_return_nft.
# Needs root, iproute2, ethtool, curl, nginx (nginx-light), bird2, nftables.
set -euo pipefail

cmd=${1:-}
P=${2:-xlbecmp}
RUNBASE=${XLB_ECMP_RUNDIR:-/run/xlb-ecmp}
D=$RUNBASE/$P
NODES=(1 2 3)
BACKENDS=(1 2 3)
ROLES=(sw rt client n1 n2 n3 be1 be2 be3)
VIP=10.251.100.1
VIP_DSR=10.251.100.2
VIP_NAT=10.251.100.3
VIP_SNAT=10.251.100.4
XLB=${XLB_BIN:-${CARGO_TARGET_DIR:-target}/release/xlb}
WAIT_SECS=${XLB_ECMP_WAIT:-30}

say() { printf 'testbed-ecmp %s: %s\n' "$P" "$*"; }
die() { printf 'testbed-ecmp %s: error: %s\n' "$P" "$*" >&2; exit 1; }
ns() { printf '%s-%s' "$P" "$1"; }
nsx() { local r=$1; shift; ip netns exec "$(ns "$r")" "$@"; }
ns_exists() { [ -e "/run/netns/$(ns "$1")" ]; }
usage() { echo "usage: $0 up|down|status [PREFIX]   (PREFIX: 1-20 chars of [A-Za-z0-9], default xlbecmp)" >&2; exit 2; }

do_down() {
  local r pids i
  for r in "${ROLES[@]}"; do
    ns_exists "$r" || continue
    pids=$(ip netns pids "$(ns "$r")" 2>/dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -TERM $pids 2>/dev/null || true
  done
  for ((i = 0; i < 60; i++)); do
    pids=""
    for r in "${ROLES[@]}"; do ns_exists "$r" && pids+=$(ip netns pids "$(ns "$r")" 2>/dev/null | tr '\n' ' '); done
    [ -z "${pids// /}" ] && break
    sleep 0.05
  done
  # shellcheck disable=SC2086
  [ -n "${pids// /}" ] && kill -KILL $pids 2>/dev/null || true
  for r in "${ROLES[@]}"; do
    if ns_exists "$r"; then ip netns del "$(ns "$r")" 2>/dev/null || true; fi
  done
  rm -rf -- "$D" 2>/dev/null || true
  say "down"
}

do_status() {
  local r k v
  for r in "${ROLES[@]}"; do
    if ns_exists "$r"; then printf '%-18s pids: %s\n' "$(ns "$r")" "$(ip netns pids "$(ns "$r")" | tr '\n' ' ')"; else printf '%-18s (absent)\n' "$(ns "$r")"; fi
  done
  ns_exists rt || return 3
  for v in "$VIP" "$VIP_DSR" "$VIP_NAT" "$VIP_SNAT"; do
    echo "router: ip route show $v"
    nsx rt ip route show "$v" | sed 's/^/    /'
  done
  for k in "${NODES[@]}"; do
    [ -S "$D/n$k/bird.ctl" ] && birdc -s "$D/n$k/bird.ctl" show protocols tor | sed -n '2,$p' | sed "s/^/    n$k: /"
  done
}

on_up_error() {
  local rc=$? line=$1 what=$2
  trap - ERR INT TERM
  set +e
  printf 'testbed-ecmp %s: error: "%s" failed (exit %s, line %s); cleaning up\n' "$P" "$what" "$rc" "$line" >&2
  for f in "$D"/*/xlb.log "$D"/*/bird.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 8 "$f" >&2; }; done
  do_down >&2
  exit 1
}

router_bird_conf() {
  cat <<EOF
# xlb ECMP testbed $P: the router. One eBGP session per xlb node; the VIP's three routes are
# merged into one multipath kernel route.
router id 10.251.1.1;
log "$D/rt/bird.log" all;
timeformat protocol iso long;
protocol device { scan time 1; }
protocol kernel {
  merge paths on;
  ipv4 { import none; export all; };
}
template bgp node {
  local 10.251.1.1 as 65000;
  connect delay time 1;
  connect retry time 2;
  error wait time 1, 4;
  hold time 3;
  keepalive time 1;
  ipv4 { import all; export none; };
}
EOF
  for k in "${NODES[@]}"; do echo "protocol bgp n$k from node { neighbor 10.251.1.1$k as 65001; }"; done
}

node_bird_conf() {
  local k=$1
  cat <<EOF
# xlb ECMP testbed $P: node n$k. xlb writes $D/n$k/vips4.conf and runs birdc configure.
router id 10.251.1.1$k;
log "$D/n$k/bird.log" all;
timeformat protocol iso long;
protocol device { scan time 1; }
protocol static xlb_vips4 {
  ipv4;
  include "$D/n$k/vips4.conf";
}
protocol static xlb_vips6 {
  ipv6;
  include "$D/n$k/vips6.conf";
}
protocol bgp tor {
  local 10.251.1.1$k as 65001;
  neighbor 10.251.1.1 as 65000;
  connect delay time 1;
  connect retry time 2;
  error wait time 1, 4;
  ipv4 { import none; export where proto = "xlb_vips4"; };
}
EOF
}

xlb_conf() {
  local k=$1
  cat <<EOF
# xlb ECMP testbed $P: node n$k (the same Services on every node; only names and addresses differ)
apiVersion: xlb.dev/v1alpha1
kind: XlbConfiguration
nodeName: n$k
nodeAddresses: [10.251.1.1$k]
shutdownGracePeriod: 0s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
ipvs: {scheduler: mh}
interfaces: [{name: eth0, queues: [0]}]
cores: [0]
snatAddresses: {ipv4: 10.251.1.1$k}
announce:
  mode: bgp
  bird: {ipv4File: $D/n$k/vips4.conf, ipv6File: $D/n$k/vips6.conf, socket: $D/n$k/bird.ctl}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 10.251.200.1
  clusterIPs: [10.251.200.1]
  externalTrafficPolicy: Cluster
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 80, nodePort: 30080}
status:
  loadBalancer:
    ingress: [{ip: $VIP}]
---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: demo
  annotations: {xlb.dev/scheduler: mh, xlb.dev/forwarding-mode: dsr-l2}
spec:
  type: LoadBalancer
  clusterIP: 10.251.200.2
  clusterIPs: [10.251.200.2]
  externalTrafficPolicy: Cluster
  ports:
  - {name: echo, port: 9100, protocol: TCP, targetPort: 9100, nodePort: 30091}
status:
  loadBalancer:
    ingress: [{ip: $VIP_DSR}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
EOF
  for i in "${BACKENDS[@]}"; do
    echo "- {addresses: [10.251.1.2$i], conditions: {ready: true, serving: true, terminating: false}, nodeName: be$i}"
  done
  echo "ports:"
  echo "- {name: http, port: 80, protocol: TCP}"
  cat <<EOF
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: demo
  labels: {kubernetes.io/service-name: echo}
addressType: IPv4
endpoints:
EOF
  for i in "${BACKENDS[@]}"; do
    echo "- {addresses: [10.251.1.2$i], conditions: {ready: true, serving: true, terminating: false}, nodeName: be$i}"
  done
  echo "ports:"
  echo "- {name: echo, port: 9100, protocol: TCP}"
  cat <<EOF
---
apiVersion: v1
kind: Service
metadata:
  name: echo-nat
  namespace: demo
  annotations: {xlb.dev/scheduler: mh, xlb.dev/forwarding-mode: nat}
spec:
  type: LoadBalancer
  clusterIP: 10.251.200.3
  clusterIPs: [10.251.200.3]
  externalTrafficPolicy: Local
  healthCheckNodePort: 30092
  ports:
  - {name: echo, port: 9100, protocol: TCP, targetPort: 9100, nodePort: 30093}
status:
  loadBalancer:
    ingress: [{ip: $VIP_NAT}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-nat-1
  namespace: demo
  labels: {kubernetes.io/service-name: echo-nat}
addressType: IPv4
endpoints:
EOF
  for i in "${BACKENDS[@]}"; do
    echo "- {addresses: [10.251.1.2$i], conditions: {ready: true, serving: true, terminating: false}, nodeName: n$k}"
  done
  echo "ports:"
  echo "- {name: echo, port: 9100, protocol: TCP}"
  cat <<EOF
---
apiVersion: v1
kind: Service
metadata:
  name: echo-snat
  namespace: demo
  annotations: {xlb.dev/scheduler: mh}
spec:
  type: LoadBalancer
  clusterIP: 10.251.200.4
  clusterIPs: [10.251.200.4]
  externalTrafficPolicy: Cluster
  ports:
  - {name: echo, port: 9100, protocol: TCP, targetPort: 9100, nodePort: 30094}
status:
  loadBalancer:
    ingress: [{ip: $VIP_SNAT}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-snat-1
  namespace: demo
  labels: {kubernetes.io/service-name: echo-snat}
addressType: IPv4
endpoints:
EOF
  for i in "${BACKENDS[@]}"; do
    echo "- {addresses: [10.251.1.2$i], conditions: {ready: true, serving: true, terminating: false}, nodeName: be$i}"
  done
  echo "ports:"
  echo "- {name: echo, port: 9100, protocol: TCP}"
}

# nftables of backend $1 for demo/echo-nat: each connection to its own :9100 remembers which
# node sent its latest packet (ct mark 1..3 from the source MAC address) and its replies are
# routed back through that node (ip rule fwmark K -> table 100+K).
backend_return_nft() {
  local i=$1 k entries="" when=""
  # XLB_ECMP_DNAT_RETURN=first: the mark is set by a connection's first packet only, so the
  # replies of a moved flow still go to the node it entered by (what a static return route
  # would do); the default, latest, follows the move.
  case ${XLB_ECMP_DNAT_RETURN:-latest} in
    latest) ;;
    first) when="ct state new " ;;
    *) die "XLB_ECMP_DNAT_RETURN must be latest or first" ;;
  esac
  for k in "${NODES[@]}"; do
    entries+="${entries:+, }$(nsx "n$k" cat /sys/class/net/eth0/address) : $k"
  done
  cat <<EOF
table ip xlb_return {
  chain pre {
    type filter hook prerouting priority mangle; policy accept;
    ip daddr 10.251.1.2$i tcp dport 9100 ${when}ct mark set ether saddr map { $entries }
  }
  chain out {
    type route hook output priority mangle; policy accept;
    ip saddr 10.251.1.2$i tcp sport 9100 ct mark != 0 meta mark set ct mark
  }
}
EOF
}

nginx_conf() {
  local i=$1 dir=$D/be$1
  mkdir -p "$dir/tmp"
  cat <<EOF
daemon on;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 512; }
http {
    access_log $dir/access.log;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    keepalive_timeout 0;
    server { listen 80 default_server; default_type text/plain; location / { return 200 "be$i\n"; } }
}
EOF
}

# The number of next hops of the router's kernel route to VIP $1 (default $VIP; 0 when there
# is none).
router_paths() {
  local r
  r=$(nsx rt ip route show "${1:-$VIP}" 2>/dev/null) || { echo 0; return; }
  if [ -z "$r" ]; then echo 0; elif grep -q nexthop <<<"$r"; then grep -c 'nexthop via' <<<"$r"; else echo 1; fi
}

do_up() {
  local r k i t0
  for r in "${ROLES[@]}"; do ns_exists "$r" && die "namespace $(ns "$r") already exists (run: $0 down $P)"; done
  [ "$(id -u)" -eq 0 ] || die "needs root"
  for t in ip ethtool curl nginx bird birdc sysctl nft; do
    command -v "$t" >/dev/null || die "missing tool: $t (run scripts/install-deps.sh demo)"
  done
  [ -x "$XLB" ] || die "$XLB is missing (build it: cargo build --release -p xlb, or set XLB_BIN)"
  set -E
  trap 'on_up_error $LINENO "$BASH_COMMAND"' ERR
  trap 'on_up_error signal INT' INT
  trap 'on_up_error signal TERM' TERM
  t0=$(date +%s%N)
  rm -rf -- "$D"
  for r in "${ROLES[@]}"; do mkdir -p "$D/$r"; done

  say "namespaces $(ns '{sw,rt,client,n1,n2,n3,be1,be2,be3}')"
  for r in "${ROLES[@]}"; do
    ip netns add "$(ns "$r")"
    ip -n "$(ns "$r")" link set lo up
  done
  nsx sw sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  ip -n "$(ns sw)" link add br0 type bridge stp_state 0
  ip -n "$(ns sw)" link set br0 up
  # client <-> router: a point-to-point veth; the router's fabric leg and every node and
  # backend on the bridge
  ip link add eth0 netns "$(ns client)" type veth peer name eth0 netns "$(ns rt)"
  ip link add eth1 netns "$(ns rt)" type veth peer name rt netns "$(ns sw)"
  for k in "${NODES[@]}"; do ip link add eth0 netns "$(ns "n$k")" type veth peer name "n$k" netns "$(ns sw)"; done
  for i in "${BACKENDS[@]}"; do ip link add eth0 netns "$(ns "be$i")" type veth peer name "be$i" netns "$(ns sw)"; done
  for r in rt n1 n2 n3 be1 be2 be3; do ip -n "$(ns sw)" link set "$r" master br0 up; done

  say "addresses, routes, sysctls (router: forwarding, fib_multipath_hash_policy=1)"
  ip -n "$(ns client)" addr add 10.251.0.2/24 dev eth0
  ip -n "$(ns rt)" addr add 10.251.0.1/24 dev eth0
  ip -n "$(ns rt)" addr add 10.251.1.1/24 dev eth1
  for k in "${NODES[@]}"; do ip -n "$(ns "n$k")" addr add "10.251.1.1$k/24" dev eth0; done
  for i in "${BACKENDS[@]}"; do ip -n "$(ns "be$i")" addr add "10.251.1.2$i/24" dev eth0; done
  for r in client rt n1 n2 n3 be1 be2 be3; do
    ip -n "$(ns "$r")" link set eth0 up
    nsx "$r" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
      net.ipv4.conf.all.accept_redirects=0 net.core.txrehash=0
  done
  ip -n "$(ns rt)" link set eth1 up
  nsx rt sysctl -qw net.ipv4.ip_forward=1 net.ipv4.fib_multipath_hash_policy=1 \
    net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.eth1.send_redirects=0
  ip -n "$(ns client)" route add default via 10.251.0.1
  for i in "${BACKENDS[@]}"; do ip -n "$(ns "be$i")" route add default via 10.251.1.1; done
  # DSR-L2 (demo/echo): every backend holds the VIP on lo and never answers ARP for it
  for i in "${BACKENDS[@]}"; do
    nsx "be$i" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
      net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2
    ip -n "$(ns "be$i")" addr add "$VIP_DSR/32" dev lo
  done
  # DNAT (demo/echo-nat): replies go back through the node that sent the request
  for i in "${BACKENDS[@]}"; do
    backend_return_nft "$i" | nsx "be$i" nft -f -
    for k in "${NODES[@]}"; do
      ip -n "$(ns "be$i")" rule add fwmark "$k" lookup "10$k"
      ip -n "$(ns "be$i")" route add 10.251.0.0/24 via "10.251.1.1$k" table "10$k"
    done
  done
  for k in "${NODES[@]}"; do ip -n "$(ns "n$k")" route add default via 10.251.1.1; done
  # veth checksum trap (docs/operations.md "Checksum offload trap on veth")
  for r in client be1 be2 be3; do nsx "$r" ethtool -K eth0 tx off >/dev/null; done
  nsx rt ethtool -K eth0 tx off >/dev/null
  nsx rt ethtool -K eth1 tx off >/dev/null

  say "backends: nginx :80 answering beN"
  for i in "${BACKENDS[@]}"; do
    nginx_conf "$i" >"$D/be$i/nginx.conf"
    nsx "be$i" nginx -c "$D/be$i/nginx.conf" -p "$D/be$i/" -e "$D/be$i/error.log" </dev/null
  done

  say "router BIRD (AS 65000, three eBGP neighbours, merge paths)"
  router_bird_conf >"$D/rt/bird.conf"
  nsx rt bird -c "$D/rt/bird.conf" -s "$D/rt/bird.ctl" -P "$D/rt/bird.pid"

  for k in "${NODES[@]}"; do
    say "node n$k: BIRD (AS 65001) and xlb ($XLB)"
    # BIRD refuses a missing include: the files exist (empty) before it starts
    : >"$D/n$k/vips4.conf"
    : >"$D/n$k/vips6.conf"
    node_bird_conf "$k" >"$D/n$k/bird.conf"
    nsx "n$k" bird -c "$D/n$k/bird.conf" -s "$D/n$k/bird.ctl" -P "$D/n$k/bird.pid"
    xlb_conf "$k" >"$D/n$k/xlb.yaml"
    # (not through nsx: a backgrounded function is a subshell, and $! would be its pid)
    ip netns exec "$(ns "n$k")" "$XLB" run --config "$D/n$k/xlb.yaml" --admin-socket "$D/n$k/admin.sock" \
      </dev/null >"$D/n$k/xlb.log" 2>&1 &
    echo $! >"$D/n$k/xlb.pid"
  done

  local deadline=$((SECONDS + WAIT_SECS)) n=0
  while [ $SECONDS -lt $deadline ]; do
    n=$(router_paths)
    [ "$n" -eq ${#NODES[@]} ] && [ "$(router_paths "$VIP_DSR")" -eq ${#NODES[@]} ] &&
      [ "$(router_paths "$VIP_NAT")" -eq ${#NODES[@]} ] && [ "$(router_paths "$VIP_SNAT")" -eq ${#NODES[@]} ] && break
    for k in "${NODES[@]}"; do kill -0 "$(cat "$D/n$k/xlb.pid")" 2>/dev/null || { echo "n$k: xlb exited" >&2; false; }; done
    sleep 0.2
  done
  [ "$n" -eq ${#NODES[@]} ] || { echo "the router routes $VIP over $n of ${#NODES[@]} nodes after ${WAIT_SECS}s" >&2; false; }
  trap - ERR INT TERM
  say "up in $((($(date +%s%N) - t0) / 1000000)) ms: the router routes $VIP, $VIP_DSR, $VIP_NAT and $VIP_SNAT over ${#NODES[@]} xlb nodes (run dir $D)"
}

case "$cmd" in
  up | down | status) ;;
  *) usage ;;
esac
[[ $P =~ ^[A-Za-z0-9]{1,20}$ ]] || usage
case "$cmd" in
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
esac
