#!/usr/bin/env bash
# xlb-pktgen against trafgen (netsniff-ng) as 64-byte UDP generators on one core.
#
# Usage (root): perf/bench/pktgen-vs-trafgen.sh
# Environment: ROUNDS (3), DUR seconds measured per run (5), CPU (0), PKTGEN (path of an
# xlb-pktgen binary; default: build it with `cargo build --release`), PKTGEN_ARGS (extra
# options for `xlb-pktgen run`, e.g. "--batch 256"), RT_PRIO (50; 0 = off): both generators
# run under SCHED_FIFO at this priority (`chrt -f`), so that other work on a shared machine
# (a build) cannot take CPU $CPU from them half-way through a run and the two get the same
# share of it. The kernel's RT throttling still leaves 5 % of the CPU to other tasks.
#
# Testbed, all in namespaces this script creates and deletes: pvt<pid>g (g0) <-> pvt<pid>p (p0),
# IPv6 off, and a one-instruction XDP_DROP program attached natively to p0 (built here with
# clang). Each generator is pinned to CPU $CPU and sends the same 64-byte frame size to p0
# (xlb-pktgen: `run --no-rx`, as fast as possible, one flow; trafgen: one fixed frame, TX_RING,
# one process). Rate = p0's rx_queue_0_xdp_drops counter over a DUR-second window that opens 1 s
# after the generator started. On veth the peer's XDP runs in softirq on the sender's core, so
# the sink's work is charged to CPU $CPU too, equally for both generators.
# The runs alternate (trafgen, xlb-pktgen, trafgen, ...) ROUNDS times each; the script prints
# every run, the medians, and `pktgen_over_trafgen RATIO` (ratio of the medians).
set -euo pipefail
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-5}
CPU=${CPU:-0}
PKTGEN_ARGS=${PKTGEN_ARGS:-}
RT_PRIO=${RT_PRIO:-50}
root=$(cd "$(dirname "$0")/../.." && pwd)

for t in ip ethtool trafgen clang taskset chrt setsid; do
    command -v "$t" >/dev/null || { echo "$t not found" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
if [ -z "${PKTGEN:-}" ]; then
    (cd "$root" && cargo build --release --quiet -p xlb-perf --bin xlb-pktgen)
    PKTGEN=${CARGO_TARGET_DIR:-$root/target}/release/xlb-pktgen
fi

P=pvt$$
G=${P}g
S=${P}p
tmp=$(mktemp -d)
gen_pid=
cleanup() {
    if [ -n "$gen_pid" ]; then
        kill -INT -- "-$gen_pid" 2>/dev/null || true
        wait "$gen_pid" 2>/dev/null || true
    fi
    ip netns del "$G" 2>/dev/null || true
    ip netns del "$S" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"$tmp/drop.c" <<'C'
#define SEC(n) __attribute__((section(n), used))
struct xdp_md;
SEC("xdp") int xdp_drop_all(struct xdp_md *ctx) { return 1; /* XDP_DROP */ }
char _license[] SEC("license") = "GPL";
C
clang -O2 -g -target bpf -c "$tmp/drop.c" -o "$tmp/drop.o"

echo "testbed: $G (g0) <-> $S (p0, XDP_DROP); generators pinned to CPU $CPU, ${DUR} s per run, RT_PRIO $RT_PRIO" >&2
ip netns add "$G"
ip netns add "$S"
ip link add g0 netns "$G" type veth peer name p0 netns "$S"
for x in "$G g0" "$S p0"; do
    read -r ns ifc <<<"$x"
    ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$ifc.disable_ipv6=1"
    ip -n "$ns" link set "$ifc" up
done
ip -n "$S" link set dev p0 xdpdrv obj "$tmp/drop.o" sec xdp
gmac=$(ip netns exec "$G" cat /sys/class/net/g0/address)
pmac=$(ip netns exec "$S" cat /sys/class/net/p0/address)

# trafgen's frame: the same 64 bytes (Ethernet + IPv4 + UDP + 22 zero bytes) xlb-pktgen sends.
hx() { echo "0x${1//:/, 0x}"; }
cat >"$tmp/udp64.cfg" <<CFG
{
  $(hx "$pmac"),
  $(hx "$gmac"),
  c16(0x0800),
  0x45, 0x00, c16(50), c16(0), 0x40, 0x00, 64, 17, csumip(14, 33),
  10, 1, 0, 1,
  10, 0, 0, 100,
  c16(1024), c16(9), c16(30), csumudp(14, 34),
  fill(0x00, 22)
}
CFG

drops() { ip netns exec "$S" ethtool -S p0 | awk '$1 == "rx_queue_0_xdp_drops:" {print $2}'; }
now() { date +%s.%N; }

# measure NAME CMD...: starts CMD in the background, returns the pps seen at p0.
measure() {
    local name=$1
    shift
    local rt=()
    [ "$RT_PRIO" != 0 ] && rt=(chrt -f "$RT_PRIO")
    # A session of its own: trafgen signals its whole process group when it stops.
    setsid "${rt[@]}" "$@" >"$tmp/$name.out" 2>&1 &
    gen_pid=$!
    sleep 1
    local c1 t1 c2 t2
    c1=$(drops)
    t1=$(now)
    sleep "$DUR"
    c2=$(drops)
    t2=$(now)
    kill -INT -- "-$gen_pid" 2>/dev/null || true
    wait "$gen_pid" 2>/dev/null || true
    gen_pid=
    echo "$c1 $t1 $c2 $t2" | awk '{printf "%.0f\n", ($3 - $1) / ($4 - $2)}'
}

run_trafgen() {
    measure trafgen ip netns exec "$G" taskset -c "$CPU" trafgen --dev g0 --conf "$tmp/udp64.cfg" --cpus 1 --num 0
}
run_pktgen() {
    # shellcheck disable=SC2086
    measure pktgen taskset -c "$CPU" "$PKTGEN" run --tx-netns "$G" --tx-iface g0 --no-rx --cpu "$CPU" \
        --src-mac "$gmac" --dst-mac "$pmac" --src-ip 10.1.0.1 --dst-ip 10.0.0.100 --dst-port 9 \
        --size 64 --duration $((DUR + 5)) --warmup 0 $PKTGEN_ARGS
}

t_all=()
p_all=()
for i in $(seq 1 "$ROUNDS"); do
    t=$(run_trafgen)
    echo "round $i trafgen    $t pps"
    p=$(run_pktgen)
    echo "round $i xlb-pktgen $p pps"
    t_all+=("$t")
    p_all+=("$p")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
tm=$(median "${t_all[@]}")
pm=$(median "${p_all[@]}")
echo "trafgen_pps_median $tm"
echo "pktgen_pps_median $pm"
echo "trafgen_pps_runs ${t_all[*]}"
echo "pktgen_pps_runs ${p_all[*]}"
awk -v p="$pm" -v t="$tm" 'BEGIN {printf "pktgen_over_trafgen %.2f\n", (t > 0) ? p / t : 0}'
