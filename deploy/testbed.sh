#!/usr/bin/env bash
# xlb namespace testbed: one client, one load-balancer node and three backends on one
# Linux bridge (one-armed, like Katran). Topology, addresses and traps: docs/testbed.md.
#
# Usage: deploy/testbed.sh up|down|status [PREFIX]      (PREFIX defaults to xlbtb)
#   up      create namespaces $PREFIX-{sw,client,lb,be1,be2,be3}, start nginx and socat
#           servers in the backends and wait until every one answers. On any failure it
#           tears down what it made and exits non-zero.
#   down    kill every process in the testbed (and every pid it recorded) and delete the
#           namespaces and the run directory. Idempotent; never fails.
#   status  print namespaces, addresses, DSR decap mode and server pids.
#
# Environment: XLB_TESTBED_RUNDIR (default /run/xlb-testbed) holds one directory per
# testbed with configs, logs and pid files: $XLB_TESTBED_RUNDIR/$PREFIX.
# XLB_TESTBED_WAIT: seconds `up` waits for the servers (default 10).
# XLB_TESTBED_KEEP_ON_FAIL=1: a failed `up` leaves everything in place for inspection.
# Needs root, iproute2, ethtool, curl, nginx (nginx-light), socat; clang for the BPF
# IPIP decap fallback (kernels without CONFIG_NET_IPIP / CONFIG_IPV6_TUNNEL).
set -euo pipefail

cmd=${1:-}
P=${2:-xlbtb}
RUNBASE=${XLB_TESTBED_RUNDIR:-/run/xlb-testbed}
D=$RUNBASE/$P
ROLES=(sw client lb be1 be2 be3 be4)
BACKENDS=(1 2 3)
VIP4=10.250.100.10
VIP6=fd00:250:100::10
WAIT_SECS=${XLB_TESTBED_WAIT:-10}

say() { printf 'testbed %s: %s\n' "$P" "$*"; }
die() { printf 'testbed %s: error: %s\n' "$P" "$*" >&2; exit 1; }
ns() { printf '%s-%s' "$P" "$1"; }
# nsx ROLE CMD...: run CMD inside the role's namespace
nsx() { local r=$1; shift; ip netns exec "$(ns "$r")" "$@"; }
ns_exists() { [ -e "/run/netns/$(ns "$1")" ]; }

usage() {
  echo "usage: $0 up|down|status [PREFIX]   (PREFIX: 1-32 chars of [A-Za-z0-9], default xlbtb)" >&2
  exit 2
}

# ---------------------------------------------------------------------------------------
# down: idempotent, never fails, also on a half-created testbed
# ---------------------------------------------------------------------------------------

# pids recorded by `up` that still look like ours (their command line names this testbed's
# run directory: nginx -c $D/..., socat ... EXEC:$D/reply.sh)
recorded_pids() {
  local f pid
  for f in "$D"/*.pid "$D"/*/*.pid; do
    if [ ! -f "$f" ]; then continue; fi
    while read -r pid; do
      [[ $pid =~ ^[0-9]+$ ]] || continue
      [ -r "/proc/$pid/cmdline" ] || continue
      if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -e "$D/"; then
        echo "$pid"
      fi
    done <"$f"
  done
}

# every process in the testbed: the processes inside our namespaces plus recorded pids
testbed_pids() {
  local r
  for r in "${ROLES[@]}"; do
    if ns_exists "$r"; then ip netns pids "$(ns "$r")" 2>/dev/null || true; fi
  done
  recorded_pids
  return 0
}

do_down() {
  local pids r i
  pids=$(testbed_pids | sort -un | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    say "stopping processes: $pids"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
      pids=$(testbed_pids | sort -un | tr '\n' ' ')
      if [ -z "${pids// /}" ]; then break; fi
      sleep 0.05
    done
    if [ -n "${pids// /}" ]; then
      say "killing stubborn processes: $pids"
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
    fi
  fi
  local deleted=()
  for r in "${ROLES[@]}"; do
    if ns_exists "$r"; then
      ip netns del "$(ns "$r")" 2>/dev/null || true
      deleted+=("$(ns "$r")")
    fi
  done
  if [ ${#deleted[@]} -gt 0 ]; then say "deleted namespaces: ${deleted[*]}"; fi
  rm -rf -- "$D" 2>/dev/null || true
  return 0
}

# ---------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------
do_status() {
  local r any=0 f
  for r in "${ROLES[@]}"; do
    if ns_exists "$r"; then
      any=1
      printf '%-16s pids: %s\n' "$(ns "$r")" "$(ip netns pids "$(ns "$r")" 2>/dev/null | tr '\n' ' ')"
      if [ "$r" != sw ]; then
        nsx "$r" ip -br addr show dev eth0 2>/dev/null | sed 's/^/    /' || true
      fi
    else
      printf '%-16s (absent)\n' "$(ns "$r")"
    fi
  done
  if [ -d "$D" ]; then
    echo "run dir: $D"
    if [ -f "$D/dsr-mode" ]; then echo "dsr decap: $(cat "$D/dsr-mode")"; fi
    for f in "$D"/*/*.pid; do
      if [ ! -f "$f" ]; then continue; fi
      printf '    %s: %s\n' "${f#"$D"/}" "$(tr '\n' ' ' <"$f")"
    done
  fi
  if [ "$any" = 0 ]; then
    echo "testbed $P is down"
    return 3
  fi
}

# ---------------------------------------------------------------------------------------
# up
# ---------------------------------------------------------------------------------------

on_up_error() {
  local rc=$? line=$1 what=$2
  trap - ERR INT TERM
  set +e
  if [ "$line" = signal ]; then
    printf 'testbed %s: error: interrupted by %s; cleaning up\n' "$P" "$what" >&2
  else
    printf 'testbed %s: error: "%s" failed (exit %s, line %s); cleaning up\n' "$P" "$what" "$rc" "$line" >&2
  fi
  if [ "${XLB_TESTBED_KEEP_ON_FAIL:-0}" = 1 ]; then
    echo "testbed $P: XLB_TESTBED_KEEP_ON_FAIL=1: left as is for inspection; run: $0 down $P" >&2
  else
    do_down >&2
  fi
  exit 1
}

# Source of the tc ingress program used for DSR when the kernel has no ipip/ip6_tunnel
# driver: strips an outer IPv4/IPv6 header that carries IPIP (4) or IPv6 (41) so that the
# inner packet to the VIP is delivered locally. Only standard uapi headers are needed.
decap_bpf_source() {
  cat <<'EOF'
// IPIP / IP6IP6 / 4in6 / 6in4 decapsulation at tc ingress (xlb testbed, DSR fallback).
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#define SEC(n) __attribute__((section(n), used))
#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif

static long (*bpf_skb_load_bytes)(const void *skb, __u32 off, void *to, __u32 len) =
    (void *)BPF_FUNC_skb_load_bytes;
static long (*bpf_skb_store_bytes)(void *skb, __u32 off, const void *from, __u32 len,
                                   __u64 flags) = (void *)BPF_FUNC_skb_store_bytes;
static long (*bpf_skb_adjust_room)(void *skb, __s32 len_diff, __u32 mode, __u64 flags) =
    (void *)BPF_FUNC_skb_adjust_room;

SEC("tc")
int ipip_decap(struct __sk_buff *skb)
{
	__u8 proto;
	__s32 outer_len;
	__u16 outer_eth = skb->protocol, inner_eth;
	__u64 flags = 0;

	if (outer_eth == __builtin_bswap16(ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return TC_ACT_OK;
		/* no options, no fragments */
		if (ip.ihl != 5 || (ip.frag_off & __builtin_bswap16(0x3fff)))
			return TC_ACT_OK;
		proto = ip.protocol;
		outer_len = sizeof(ip);
	} else if (outer_eth == __builtin_bswap16(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return TC_ACT_OK;
		proto = ip6.nexthdr;
		outer_len = sizeof(ip6);
	} else {
		return TC_ACT_OK;
	}
	if (proto == IPPROTO_IPIP)
		inner_eth = __builtin_bswap16(ETH_P_IP);
	else if (proto == IPPROTO_IPV6)
		inner_eth = __builtin_bswap16(ETH_P_IPV6);
	else
		return TC_ACT_OK;
	if (inner_eth != outer_eth)
		flags = proto == IPPROTO_IPIP ? BPF_F_ADJ_ROOM_DECAP_L3_IPV4
					      : BPF_F_ADJ_ROOM_DECAP_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -outer_len, BPF_ADJ_ROOM_MAC, flags))
		return TC_ACT_SHOT;
	if (inner_eth != outer_eth &&
	    bpf_skb_store_bytes(skb, 12, &inner_eth, sizeof(inner_eth), 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char _license[] SEC("license") = "Dual MIT/GPL";
EOF
}

# Builds (once, cached by source hash) the decap object; prints its path.
build_decap_bpf() {
  local src hash obj tmp arch
  command -v clang >/dev/null || return 1
  src=$(decap_bpf_source)
  hash=$(printf '%s' "$src" | sha256sum | cut -c1-16)
  obj=$RUNBASE/.cache/ipip-decap-$hash.o
  if [ ! -s "$obj" ]; then
    mkdir -p "$RUNBASE/.cache"
    arch=$(gcc -dumpmachine 2>/dev/null || echo "$(uname -m)-linux-gnu")
    tmp=$(mktemp "$RUNBASE/.cache/ipip-decap.XXXXXX")
    printf '%s\n' "$src" >"$tmp.c"
    if ! clang -O2 -g -target bpf -I"/usr/include/$arch" -c "$tmp.c" -o "$tmp" >"$tmp.log" 2>&1; then
      cat "$tmp.log" >&2
      rm -f "$tmp" "$tmp.c" "$tmp.log"
      return 1
    fi
    mv -f "$tmp" "$obj"
    rm -f "$tmp.c" "$tmp.log"
  fi
  echo "$obj"
}

# The UDP/TCP services answer "<name> <peer address>" (IPv6 in its compressed form).
write_reply_script() {
  cat >"$D/reply.sh" <<'EOF'
#!/bin/sh
# socat EXEC target: prints "<name> <peer address>"; socat passes the peer in SOCAT_PEERADDR
# (IPv6 as [0000:...:0002], compressed here to the usual form).
# With "udp" it first consumes the datagram socat writes to its stdin: exiting before that
# write makes socat fail with EPIPE and drop the answer.
if [ "${2:-}" = udp ]; then timeout 1 dd bs=65536 count=1 of=/dev/null 2>/dev/null || true; fi
a=${SOCAT_PEERADDR:-?}
a=${a#[}
a=${a%]}
case $a in
*:*) a=$(printf '%s\n' "$a" | sed -E 's/(^|:)0{1,3}([0-9a-f])/\1\2/g; s/(^|:)0(:0)+(:|$)/::/') ;;
esac
printf '%s %s\n' "$1" "$a"
EOF
  chmod 755 "$D/reply.sh"
}

write_nginx_conf() {
  local i=$1 dir=$D/be$1
  mkdir -p "$dir/tmp"
  cat >"$dir/nginx.conf" <<EOF
# xlb testbed $P, backend be$i
daemon on;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 512; }
http {
    log_format xlb '\$remote_addr \$remote_port \$server_addr \$server_port "\$request" \$status';
    access_log $dir/access.log xlb;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    keepalive_timeout 5s;
    server {
        listen 80 default_server;
        listen [::]:80 default_server ipv6only=on;
        default_type text/plain;
        location / { return 200 "be$i\n"; }
    }
}
EOF
}

# start ROLE NAME CMD...: runs a server in the background inside ROLE's namespace,
# logs to $D/ROLE/NAME.log and records its pid in $D/ROLE/servers.pid.
start_bg() {
  local r=$1 name=$2
  shift 2
  ip netns exec "$(ns "$r")" "$@" </dev/null >>"$D/$r/$name.log" 2>&1 &
  echo $! >>"$D/$r/servers.pid"
}

start_backend_servers() {
  local i=$1 r=be$1 a4=10.250.2.1$1 a6=fd00:250:2::1$1
  # (no socat -lp: it renames the SOCAT_PEERADDR variable that reply.sh reads)
  # nginx daemonizes; its master pid lands in nginx.pid
  nsx "$r" nginx -c "$D/$r/nginx.conf" -p "$D/$r/" -e "$D/$r/error.log" </dev/null >>"$D/$r/nginx.log" 2>&1
  # UDP 5353: one socket per address so that replies leave from the address the query was
  # sent to (the VIP for DSR, the backend's own address otherwise).
  start_bg "$r" udp4 socat "UDP4-RECVFROM:5353,bind=$a4,fork" "EXEC:$D/reply.sh be$i udp"
  start_bg "$r" udp4vip socat "UDP4-RECVFROM:5353,bind=$VIP4,fork" "EXEC:$D/reply.sh be$i udp"
  start_bg "$r" udp6 socat "UDP6-RECVFROM:5353,bind=[$a6],fork" "EXEC:$D/reply.sh be$i udp"
  start_bg "$r" udp6vip socat "UDP6-RECVFROM:5353,bind=[$VIP6],fork" "EXEC:$D/reply.sh be$i udp"
  # TCP 9000: answers "be$i <peer>" and closes
  start_bg "$r" tcp4 socat "TCP4-LISTEN:9000,fork,reuseaddr" "EXEC:$D/reply.sh be$i"
  start_bg "$r" tcp6 socat "TCP6-LISTEN:9000,fork,reuseaddr,ipv6only=1" "EXEC:$D/reply.sh be$i"
}

# 0 when every server of backend i answers from the lb namespace
backend_ready() {
  local i=$1 body n
  body=$(nsx lb curl -sf --noproxy '*' --max-time 1 "http://10.250.2.1$i/" 2>/dev/null) || return 1
  [ "$body" = "be$i" ] || return 1
  body=$(nsx lb curl -sf --noproxy '*' --max-time 1 -g "http://[fd00:250:2::1$i]/" 2>/dev/null) || return 1
  [ "$body" = "be$i" ] || return 1
  n=$(nsx "be$i" ss -Hlnu 'sport = :5353' 2>/dev/null | wc -l) || return 1
  [ "$n" -ge 4 ] || return 1
  n=$(nsx "be$i" ss -Hlnt 'sport = :9000' 2>/dev/null | wc -l) || return 1
  [ "$n" -ge 2 ] || return 1
  body=$(nsx lb socat -T 1 -u "TCP4:10.250.2.1$i:9000,connect-timeout=1" - 2>/dev/null) || return 1
  [ "$body" = "be$i 10.250.2.1" ]
}

do_up() {
  local r i t0 obj dsr ready
  for r in "${ROLES[@]}"; do
    if ns_exists "$r"; then die "namespace $(ns "$r") already exists (run: $0 down $P)"; fi
  done
  if [ "$(id -u)" -ne 0 ]; then die "needs root"; fi
  for t in ip ethtool curl nginx socat ss sysctl tc; do
    if ! command -v "$t" >/dev/null; then die "missing tool: $t (run scripts/install-deps.sh test)"; fi
  done
  set -E
  trap 'on_up_error $LINENO "$BASH_COMMAND"' ERR
  trap 'on_up_error signal SIGINT' INT
  trap 'on_up_error signal SIGTERM' TERM
  t0=$(date +%s%N)

  rm -rf -- "$D"
  mkdir -p "$D"
  for r in "${ROLES[@]}"; do mkdir -p "$D/$r"; done
  echo "$P" >"$D/prefix"

  say "namespaces $(ns '{sw,client,lb,be1,be2,be3}')"
  for r in "${ROLES[@]}"; do
    ip netns add "$(ns "$r")"
    ip -n "$(ns "$r")" link set lo up
  done

  say "bridge br0 in $(ns sw), veth eth0 in each host"
  # the switch is pure L2: no IPv6 (no link-local noise), no netfilter on bridged frames
  nsx sw sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
    net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 \
    net.bridge.bridge-nf-call-arptables=0
  ip -n "$(ns sw)" link add br0 type bridge stp_state 0 mcast_snooping 0
  ip -n "$(ns sw)" link set br0 up
  # eth0 MACs are fixed so that tests can build frames and static neighbours
  ip link add eth0 netns "$(ns client)" address 02:00:0a:fa:01:02 \
    type veth peer name client netns "$(ns sw)"
  ip link add eth0 netns "$(ns lb)" address 02:00:0a:fa:01:01 numrxqueues 2 numtxqueues 2 \
    type veth peer name lb netns "$(ns sw)" numrxqueues 2 numtxqueues 2
  for i in "${BACKENDS[@]}"; do
    ip link add eth0 netns "$(ns "be$i")" address "02:00:0a:fa:02:1$i" \
      type veth peer name "be$i" netns "$(ns sw)"
  done
  for r in client lb be1 be2 be3; do
    ip -n "$(ns sw)" link set "$r" master br0 up
  done
  # be4: a pod on the lb node itself, behind a veth (as a CNI bridge/ptp plugin makes it)
  ip link add vpod netns "$(ns lb)" type veth peer name eth0 netns "$(ns be4)" address 02:00:0a:fa:28:02

  say "sysctls: no DAD, no redirects, rp_filter off, no txrehash; forwarding on in $(ns lb)"
  for r in client lb be1 be2 be3 be4; do
    nsx "$r" sysctl -qw \
      net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 net.ipv6.conf.eth0.accept_dad=0 \
      net.ipv6.conf.all.accept_redirects=0 net.ipv6.conf.eth0.accept_redirects=0 \
      net.ipv6.conf.eth0.accept_ra=0 \
      net.ipv4.conf.all.accept_redirects=0 net.ipv4.conf.eth0.accept_redirects=0 \
      net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0
    # A veth's receive queue is the sender's transmit queue, which Linux picks again after a
    # retransmission timeout (txrehash): a flow would move to another xlb worker. A NIC's RSS
    # hashes the tuple and never moves a flow, so the testbed keeps each socket on its queue.
    nsx "$r" sysctl -qw net.core.txrehash=0
  done
  # one-armed: client and backends share the segment, so the lb's kernel would send ICMP
  # redirects and the hosts would start talking to each other directly
  nsx lb sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
    net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.default.send_redirects=0 \
    net.ipv4.conf.eth0.send_redirects=0
  for i in "${BACKENDS[@]}"; do
    # the VIP may sit on lo (DSR fallback): never answer ARP for it on eth0
    nsx "be$i" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.eth0.arp_ignore=1 \
      net.ipv4.conf.all.arp_announce=2 net.ipv4.conf.eth0.arp_announce=2
  done

  say "addresses and routes"
  ip -n "$(ns client)" addr add 10.250.1.2/24 dev eth0
  ip -n "$(ns client)" addr add fd00:250:1::2/64 dev eth0 nodad
  ip -n "$(ns lb)" addr add 10.250.1.1/24 dev eth0
  ip -n "$(ns lb)" addr add 10.250.2.1/24 dev eth0
  ip -n "$(ns lb)" addr add fd00:250:1::1/64 dev eth0 nodad
  ip -n "$(ns lb)" addr add fd00:250:2::1/64 dev eth0 nodad
  for i in "${BACKENDS[@]}"; do
    ip -n "$(ns "be$i")" addr add "10.250.2.1$i/24" dev eth0
    ip -n "$(ns "be$i")" addr add "fd00:250:2::1$i/64" dev eth0 nodad
  done
  ip -n "$(ns lb)" addr add 10.250.40.1/24 dev vpod
  ip -n "$(ns be4)" addr add 10.250.40.2/24 dev eth0
  nsx lb sysctl -qw net.ipv4.conf.vpod.rp_filter=0
  ip -n "$(ns lb)" link set vpod up
  for r in client lb be1 be2 be3 be4; do ip -n "$(ns "$r")" link set eth0 up; done
  ip -n "$(ns be4)" route add default via 10.250.40.1
  ip -n "$(ns client)" route add 10.250.0.0/16 via 10.250.1.1
  ip -n "$(ns client)" route add 10.250.100.0/24 via 10.250.1.1
  ip -n "$(ns client)" -6 route add fd00:250::/32 via fd00:250:1::1
  ip -n "$(ns client)" -6 route add fd00:250:100::/64 via fd00:250:1::1
  for i in "${BACKENDS[@]}"; do
    ip -n "$(ns "be$i")" route add default via 10.250.2.1
    ip -n "$(ns "be$i")" -6 route add default via fd00:250:2::1
  done

  # Routed pod networks, as on a gateway node of a cluster with a routed pod network: the
  # "pods" are addresses on lo of the backend hosts (the "nodes"), reached only through routes
  # in the lb's kernel. xlb has no `routes:` for them; it follows the lb's routing table.
  say "routed pod CIDRs: 10.250.32.0/24 via be2, 10.250.33.0/24 via be3, 10.250.34.0/24 multipath via be2+be3, 10.250.35.0/24 via be3 (pod 10.250.35.5 on both)"
  nsx be2 ip addr add 10.250.32.2/32 dev lo
  nsx be3 ip addr add 10.250.33.3/32 dev lo
  for i in 2 3; do
    for k in 1 2 3 4 5 6 7 8; do nsx "be$i" ip addr add "10.250.34.$k/32" dev lo; done
    nsx "be$i" ip addr add 10.250.35.5/32 dev lo
  done
  ip -n "$(ns lb)" route add 10.250.32.0/24 via 10.250.2.12
  ip -n "$(ns lb)" route add 10.250.33.0/24 via 10.250.2.13
  ip -n "$(ns lb)" route add 10.250.34.0/24 nexthop via 10.250.2.12 nexthop via 10.250.2.13
  ip -n "$(ns lb)" route add 10.250.35.0/24 via 10.250.2.13

  say "offloads: tx checksum off on the client and backends"
  for r in client be1 be2 be3; do nsx "$r" ethtool -K eth0 tx off >/dev/null; done

  # DSR: the backends hold the VIPs and decapsulate IPIP (v4) / IP6IP6 (v6) themselves
  if ip -n "$(ns be1)" link show tunl0 >/dev/null 2>&1 && ip -n "$(ns be1)" link show ip6tnl0 >/dev/null 2>&1; then
    dsr=ipip
    say "DSR decap: kernel tunl0/ip6tnl0 hold $VIP4 and $VIP6"
    for i in "${BACKENDS[@]}"; do
      ip -n "$(ns "be$i")" addr add "$VIP4/32" dev tunl0
      ip -n "$(ns "be$i")" addr add "$VIP6/128" dev ip6tnl0 nodad
      ip -n "$(ns "be$i")" link set tunl0 up
      ip -n "$(ns "be$i")" link set ip6tnl0 up
      nsx "be$i" sysctl -qw net.ipv4.conf.tunl0.rp_filter=0
    done
  elif obj=$(build_decap_bpf); then
    dsr=bpf
    say "DSR decap: no ipip/ip6_tunnel in this kernel; tc BPF decap on eth0 ingress, VIPs on lo"
    for i in "${BACKENDS[@]}"; do
      ip -n "$(ns "be$i")" addr add "$VIP4/32" dev lo
      ip -n "$(ns "be$i")" addr add "$VIP6/128" dev lo nodad
      nsx "be$i" tc qdisc add dev eth0 clsact
      nsx "be$i" tc filter add dev eth0 ingress bpf direct-action object-file "$obj" section tc
    done
  else
    dsr=none
    say "warning: no ipip/ip6_tunnel in this kernel and clang is missing: DSR decap unavailable"
    for i in "${BACKENDS[@]}"; do
      ip -n "$(ns "be$i")" addr add "$VIP4/32" dev lo
      ip -n "$(ns "be$i")" addr add "$VIP6/128" dev lo nodad
    done
  fi
  echo "$dsr" >"$D/dsr-mode"

  say "servers: nginx :80, socat udp :5353 and tcp :9000 in each backend"
  write_reply_script
  for i in "${BACKENDS[@]}"; do
    write_nginx_conf "$i"
    start_backend_servers "$i"
  done

  say "pod be4 on the lb node: nginx :80 on 10.250.40.2 (behind the lb's veth vpod)"
  write_nginx_conf 4
  nsx be4 nginx -c "$D/be4/nginx.conf" -p "$D/be4/" -e "$D/be4/error.log" </dev/null >>"$D/be4/nginx.log" 2>&1

  ready=()
  local deadline=$((SECONDS + WAIT_SECS))
  while :; do
    ready=()
    for i in "${BACKENDS[@]}"; do
      if backend_ready "$i"; then ready+=("be$i"); fi
    done
    if nsx lb curl -sf --noproxy '*' --max-time 1 http://10.250.40.2/ 2>/dev/null | grep -qx be4; then ready+=(be4); fi
    if [ ${#ready[@]} -eq $((${#BACKENDS[@]} + 1)) ] || [ $SECONDS -ge $deadline ]; then break; fi
    sleep 0.05
  done
  if [ ${#ready[@]} -ne $((${#BACKENDS[@]} + 1)) ]; then
    for i in "${BACKENDS[@]}" 4; do
      if [[ " ${ready[*]} " == *" be$i "* ]]; then continue; fi
      echo "testbed $P: be$i did not answer within ${WAIT_SECS}s; its logs:" >&2
      tail -n 5 "$D/be$i"/*.log >&2 2>/dev/null || true
    done
    false
  fi
  trap - ERR INT TERM
  say "up in $((($(date +%s%N) - t0) / 1000000)) ms (run dir $D, dsr decap $dsr)"
}

case "$cmd" in
  up | down | status) ;;
  *) usage ;;
esac
[[ $P =~ ^[A-Za-z0-9]{1,32}$ ]] || usage

case "$cmd" in
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
esac
