#!/usr/bin/env bash
# Nanoseconds per frame of the steering XDP program (nic-config/xdp/steer.c), measured by the
# kernel itself: `bpftool prog run PROG data_in FRAME repeat N` (BPF_PROG_TEST_RUN) runs the
# program N times on one frame and reports the mean duration in ns, which includes the test
# runner's own per-run work (the `non_ip` frame, which returns at once, shows that floor).
#
# Usage: perf/steer/run.sh
# Environment: STEER_BASE=REV also measures the program of git revision REV (its steer.c built
#   the same way), alternated with the working tree's, so both sets of figures come from one
#   run; STEER_REPEAT (runs per measurement, default 2000000), STEER_ROUNDS (measurements per
#   frame and program, default 5; the median is printed), STEER_L2=1 (L2 mode: `l2_self` says
#   addresses are announced and `l2_addrs` holds two VIPs that no frame is sent to, so every
#   passed frame is also checked against them; the figures' names end in `_l2`).
# Needs root (BPF_PROG_LOAD, bpffs), clang and bpftool (scripts/install-deps.sh bench).
#
# Maps are filled as xlb fills them (`services4`, `endpoints4`, `snat4` and, where the program
# has them, their slot indexes) for one IPv4 service 10.96.0.10:80/TCP, one NAT backend
# 10.1.0.5:8080/TCP and the SNAT address 10.2.0.1 with ports 33000-36863, and likewise
# (`services`, `endpoints`, `snat_addrs` and, where the program has them, their filters or slot
# indexes) for the IPv6 ones below; no AF_XDP socket is in `xsks`, so xlb's frames end in
# XDP_DROP (redirect failed) and the others in XDP_PASS.
# Frames (64 bytes, TCP ACK):
#   service     client 10.0.0.1:40000 -> 10.96.0.10:80   (a service's packet: one lookup)
#   snat_reply  10.1.0.5:8080 -> 10.2.0.1:33000          (SNAT reply: two)
#   dnat_reply  10.1.0.5:8080 -> 10.0.0.1:40000          (a backend's reply to a client: three)
#   pass        10.0.0.1:40000 -> 10.2.0.1:22            (the node's own traffic: every lookup misses)
#   non_ip      an LLDP frame                            (passed before any lookup)
#   service6, snat_reply6, dnat_reply6, pass6: the same over IPv6, with the service
#               [fd00::10]:80, the backend [fd01::5]:8080, the SNAT address fd02::1 (ports
#               33000-36863) and the client [2001:db8::1]:40000 (74-byte frames)
# Prints one `steer_FRAME_ns_per_packet VALUE ns` line per frame, and with STEER_BASE one
# `steer_FRAME_ns_per_packet_base VALUE ns` line as well. docs/benchmarks.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
repeat=${STEER_REPEAT:-2000000}
l2=${STEER_L2:-0}
rounds=${STEER_ROUNDS:-5}
[ "$(id -u)" -eq 0 ] || { echo "perf/steer/run.sh needs root (BPF_PROG_LOAD)" >&2; exit 1; }
for t in clang bpftool python3; do
  command -v "$t" >/dev/null || { echo "$t not found: run scripts/install-deps.sh bench" >&2; exit 1; }
done
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
work=$(mktemp -d)
pins=()
cleanup() {
  local p
  for p in "${pins[@]}"; do rm -rf "$p"; done
  rm -rf "$work"
}
trap cleanup EXIT

# build NAME SOURCE: the object as nic-config/build.rs builds it.
build() {
  clang -O2 -g -Wall -Wextra -target bpf "-I/usr/include/$multiarch" -c "$2" -o "$work/$1.o"
}

# index_put MAP BITS "IDENTITY" "VALUE": writes slot value VALUE (8 bytes, decimal) into the
# home slot of a slot index of 2^BITS slots (nic-config/src/index.rs): the top BITS bits of
# IDENTITY (what a probe compares, up to 8 bytes read little-endian as on this host) times
# 2^64/phi.
index_put() {
  bpftool map update pinned "$1" $(python3 -c '
import struct, sys
ident = bytes(int(x) for x in sys.argv[2].split()).ljust(8, b"\0")
home = ((struct.unpack("<Q", ident)[0] * 0x9E3779B97F4A7C15) % 2**64) >> (64 - int(sys.argv[1]))
value = bytes(int(x) for x in sys.argv[3].split())
print("key hex", " ".join("%02x" % b for b in struct.pack("<I", home)), "value hex", " ".join("%02x" % b for b in value))' "$2" "$3" "$4")
}

fd00_10="fd 00 00 00 00 00 00 00 00 00 00 00 00 00 00 10"
fd01_5="fd 01 00 00 00 00 00 00 00 00 00 00 00 00 00 05"
fd02_1="fd 02 00 00 00 00 00 00 00 00 00 00 00 00 00 01"

# Python the IPv6 helpers below start with: key6_hash(ADDR, X), the hash of
# nic-config/src/filter.rs (`hash_of`, xdp/steer.c `key6_hash`) of IPv6 address ADDR (16 hex
# bytes) and X (the key's port bytes as in the frame and its protocol, hex, "" for none):
# ((((lo * M) ^ hi) * M) ^ x) * M, with M = 2^64/phi and lo, hi, x read little-endian as on
# this host.
key6_hash_py='
import struct, sys
M, W = 0x9E3779B97F4A7C15, 2**64
def key6_hash(addr, xs):
    lo, hi = struct.unpack("<QQ", bytes(int(v, 16) for v in addr.split()))
    x = int.from_bytes(bytes(int(v, 16) for v in xs.split()).ljust(8, b"\0"), "little")
    return (((((lo * M) % W ^ hi) * M) % W ^ x) * M) % W
'

# filter_put MAP BITS "ADDR" "X": sets the bit of the IPv6 key (ADDR, X as for key6_hash) in
# a filter of 2^BITS bits (nic-config/src/filter.rs): the top BITS bits of its key6_hash; bit
# b is bit b % 64 of the u64 at index b / 64. Reads the word and writes it back.
filter_put() {
  local word bit cur
  read -r word bit < <(python3 -c "$key6_hash_py"'
b = key6_hash(sys.argv[2], sys.argv[3]) >> (64 - int(sys.argv[1]))
print(b // 64, b % 64)' "$2" "$3" "$4")
  local key
  key=$(python3 -c 'import struct,sys; print(" ".join("%02x" % b for b in struct.pack("<I", int(sys.argv[1]))))' "$word")
  cur=$(bpftool -j map lookup pinned "$1" key hex $key \
    | python3 -c 'import json,sys; print(" ".join(str(int(x, 16)) for x in json.load(sys.stdin)["value"]))')
  bpftool map update pinned "$1" key hex $key value hex $(python3 -c '
import struct, sys
v = struct.unpack("<Q", bytes(int(x) for x in sys.argv[2].split()))[0] | (1 << int(sys.argv[1]))
print(" ".join("%02x" % b for b in struct.pack("<Q", v)))' "$bit" "$cur")
}

# index6_put MAP BITS "ADDR" "X": writes the fingerprint of the IPv6 key (ADDR, X as for
# key6_hash) into its home slot of a slot index of 2^BITS slots (nic-config/src/index.rs
# `fingerprint6`): the top 56 bits of its key6_hash with 1 in the top byte, its home the top
# BITS bits of the fingerprint times 2^64/phi.
index6_put() {
  bpftool map update pinned "$1" $(python3 -c "$key6_hash_py"'
fp = key6_hash(sys.argv[2], sys.argv[3]) >> 8 | 1 << 56
home = ((fp * M) % W) >> (64 - int(sys.argv[1]))
print("key hex", " ".join("%02x" % b for b in struct.pack("<I", home)), "value hex", " ".join("%02x" % b for b in struct.pack("<Q", fp)))' "$2" "$3" "$4")
}

# snat6_put MAP BITS "ADDR" "RANGE": writes the slot of IPv6 SNAT address ADDR (16 hex bytes)
# with port range RANGE (4 hex bytes: first and last port, little-endian) into its home slot
# of a SNAT slot index of 2^BITS slots (nic-config/src/index.rs `snat6_id`): the id is the top
# 30 bits of its key6_hash with no port, its lowest bit set; the slot, the id's 4 bytes then
# the range; the home, the top BITS bits of the id times 2^64/phi.
snat6_put() {
  bpftool map update pinned "$1" $(python3 -c "$key6_hash_py"'
ident = key6_hash(sys.argv[2], "") >> 34 | 1
home = ((ident * M) % W) >> (64 - int(sys.argv[1]))
print("key hex", " ".join("%02x" % b for b in struct.pack("<I", home)), "value hex", " ".join("%02x" % b for b in struct.pack("<I", ident)), sys.argv[3])' "$2" "$3" "$4")
}

# load NAME: pins the program and its maps under /sys/fs/bpf and fills the maps.
load() {
  local pin=/sys/fs/bpf/xlb-steer-bench-$$-$1 m
  pins+=("$pin")
  bpftool prog loadall "$work/$1.o" "$pin" pinmaps "$pin/maps" type xdp
  m=$pin/maps
  if [ -e "$m/services4" ]; then
    # IPv4 maps with short keys: (address, port, protocol, pad) and the address alone.
    bpftool map update pinned "$m/services4" key hex 0a 60 00 0a 00 50 06 00 value hex 00 00 00 00
    bpftool map update pinned "$m/endpoints4" key hex 0a 01 00 05 1f 90 06 00 value hex 00 00 00 00
    bpftool map update pinned "$m/snat4" key hex 0a 02 00 01 value hex e8 80 ff 8f
    # The slot indexes (nic-config/src/index.rs), where the program has them: in front of
    # services4 and endpoints4 the key with pad byte 1 (the whole value is compared); in front
    # of snat4 the address and its range (the address is compared).
    local svc="10 96 0 10 0 80 6 1" ep="10 1 0 5 31 144 6 1"
    if [ -e "$m/services4_index" ]; then index_put "$m/services4_index" 17 "$svc" "$svc"; fi
    if [ -e "$m/endpoints4_index" ]; then index_put "$m/endpoints4_index" 19 "$ep" "$ep"; fi
    if [ -e "$m/snat4_index" ]; then index_put "$m/snat4_index" 11 "10 2 0 1" "10 2 0 1 232 128 255 143"; fi
  else
    # One map per kind for both families, IPv4 as ::ffff:a.b.c.d (before `services4`).
    local mapped="00 00 00 00 00 00 00 00 00 00 ff ff"
    bpftool map update pinned "$m/services" key hex $mapped 0a 60 00 0a 00 50 06 00 value hex 00 00 00 00
    bpftool map update pinned "$m/endpoints" key hex $mapped 0a 01 00 05 1f 90 06 00 value hex 00 00 00 00
    bpftool map update pinned "$m/snat_addrs" key hex $mapped 0a 02 00 01 value hex e8 80 ff 8f
  fi
  # IPv6: the service [fd00::10]:80/TCP, the NAT backend [fd01::5]:8080/TCP and the SNAT
  # address fd02::1 with ports 33000-36863, in the 16-byte maps.
  bpftool map update pinned "$m/services" key hex $fd00_10 00 50 06 00 value hex 00 00 00 00
  bpftool map update pinned "$m/endpoints" key hex $fd01_5 1f 90 06 00 value hex 00 00 00 00
  bpftool map update pinned "$m/snat_addrs" key hex $fd02_1 value hex e8 80 ff 8f
  # The filters and slot indexes in front of them, where the program has them
  # (nic-config/src/filter.rs, index.rs: programs before 2026-11-27 22:50 UTC have filters
  # in front of the three IPv6 maps, later ones slot indexes).
  if [ -e "$m/services6_filter" ]; then filter_put "$m/services6_filter" 20 "$fd00_10" "00 50 06"; fi
  if [ -e "$m/snat6_filter" ]; then filter_put "$m/snat6_filter" 16 "$fd02_1" ""; fi
  if [ -e "$m/endpoints6_filter" ]; then filter_put "$m/endpoints6_filter" 20 "$fd01_5" "1f 90 06"; fi
  if [ -e "$m/services6_index" ]; then index6_put "$m/services6_index" 17 "$fd00_10" "00 50 06"; fi
  if [ -e "$m/endpoints6_index" ]; then index6_put "$m/endpoints6_index" 19 "$fd01_5" "1f 90 06"; fi
  if [ -e "$m/snat6_index" ]; then snat6_put "$m/snat6_index" 11 "$fd02_1" "e8 80 ff 8f"; fi
  if [ "$l2" = 1 ]; then
    # L2 mode: `l2_self` says addresses are announced (its MAC check off), and `l2_addrs`
    # holds two VIPs none of the frames is sent to, behind `l2_filter` where the program has it.
    local mac="02 00 00 00 00 01" v4="00 00 00 00 00 00 00 00 00 00 ff ff 0a fb 01 32"
    local v6="fd 00 02 51 00 01 00 00 00 00 00 00 00 00 00 50"
    bpftool map update pinned "$m/l2_self" key hex 00 00 00 00 value hex $mac 00 01
    bpftool map update pinned "$m/l2_addrs" key hex $v4 value hex $mac 00 00
    bpftool map update pinned "$m/l2_addrs" key hex $v6 value hex $mac 00 00
    if [ -e "$m/l2_filter" ]; then
      filter_put "$m/l2_filter" 18 "$v4" ""
      filter_put "$m/l2_filter" 18 "$v6" ""
    fi
  fi
}

python3 - "$work" <<'EOF'
import struct, sys
out = sys.argv[1]
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
eth = bytes.fromhex('020000000002020000000001')
def tcp(name, src, dst, sport, dport):
    ip = bytearray(struct.pack('!BBHHHBBH4s4s', 0x45, 0, 40, 1, 0, 64, 6, 0, bytes(src), bytes(dst)))
    ip[10:12] = struct.pack('!H', csum(bytes(ip)))
    l4 = struct.pack('!HHIIBBHHH', sport, dport, 1, 0, 0x50, 0x10, 65535, 0, 0)
    open(f'{out}/{name}.bin', 'wb').write(eth + b'\x08\x00' + bytes(ip) + l4 + bytes(6))
tcp('service', [10, 0, 0, 1], [10, 96, 0, 10], 40000, 80)
tcp('snat_reply', [10, 1, 0, 5], [10, 2, 0, 1], 8080, 33000)
tcp('dnat_reply', [10, 1, 0, 5], [10, 0, 0, 1], 8080, 40000)
tcp('pass', [10, 0, 0, 1], [10, 2, 0, 1], 40000, 22)
open(f'{out}/non_ip.bin', 'wb').write(eth + b'\x88\xcc' + bytes(46))
def tcp6(name, src, dst, sport, dport):
    l4 = struct.pack('!HHIIBBHHH', sport, dport, 1, 0, 0x50, 0x10, 65535, 0, 0)
    ip = struct.pack('!IHBB16s16s', 6 << 28, len(l4), 6, 64, bytes.fromhex(src), bytes.fromhex(dst))
    open(f'{out}/{name}.bin', 'wb').write(eth + b'\x86\xdd' + ip + l4)
client6 = '20010db8000000000000000000000001'
tcp6('service6', client6, 'fd000000000000000000000000000010', 40000, 80)
tcp6('snat_reply6', 'fd010000000000000000000000000005', 'fd020000000000000000000000000001', 8080, 33000)
tcp6('dnat_reply6', 'fd010000000000000000000000000005', client6, 8080, 40000)
tcp6('pass6', client6, 'fd020000000000000000000000000001', 40000, 22)
# Checked, not timed: TCP to 0.0.0.0:0 and to 255.255.255.255:65535 (the SNAT index's empty
# and tombstone markers; never a SNAT address).
tcp('to_zero', [10, 0, 0, 1], [0, 0, 0, 0], 40000, 0)
tcp('to_bcast', [10, 0, 0, 1], [255, 255, 255, 255], 40000, 65535)
EOF

progs=(new)
build new "$root/nic-config/xdp/steer.c"
if [ -n "${STEER_BASE:-}" ]; then
  git -C "$root" show "$STEER_BASE:nic-config/xdp/steer.c" >"$work/base.c"
  build base "$work/base.c"
  progs+=(base)
fi
for p in "${progs[@]}"; do load "$p"; done

# The working tree's program passes frames to the SNAT index's markers (run once each).
for f in to_zero to_bcast; do
  rv=$(bpftool prog run pinned "/sys/fs/bpf/xlb-steer-bench-$$-new/xlb_steer" data_in "$work/$f.bin" 2>&1 \
    | sed -n 's/.*[Rr]eturn value: \([0-9]*\).*/\1/p')
  [ "$rv" = 2 ] || { echo "$f: return value '$rv', expected 2 (XDP_PASS)" >&2; exit 1; }
done

frames=(service snat_reply dnat_reply pass non_ip service6 snat_reply6 dnat_reply6 pass6)
# The verdict each frame must get (XDP_DROP = 1: xlb's, its redirect failing without a socket;
# XDP_PASS = 2), so that a map filled wrongly fails the run instead of timing another path.
declare -A want=([service]=1 [snat_reply]=1 [dnat_reply]=1 [pass]=2 [non_ip]=2
  [service6]=1 [snat_reply6]=1 [dnat_reply6]=1 [pass6]=2)
for r in $(seq "$rounds"); do
  for f in "${frames[@]}"; do
    for p in "${progs[@]}"; do
      out=$(bpftool prog run pinned "/sys/fs/bpf/xlb-steer-bench-$$-$p/xlb_steer" data_in "$work/$f.bin" \
        repeat "$repeat" 2>&1)
      ns=$(sed -n 's/.*duration (average): \([0-9]*\)ns.*/\1/p' <<<"$out")
      rv=$(sed -n 's/.*[Rr]eturn value: \([0-9]*\).*/\1/p' <<<"$out")
      [ -n "$ns" ] || { echo "bpftool prog run gave no duration for $f ($p): $out" >&2; exit 1; }
      [ "$rv" = "${want[$f]}" ] || { echo "$f ($p): return value '$rv', expected ${want[$f]}: $out" >&2; exit 1; }
      echo "$f $p $ns" >>"$work/raw"
    done
  done
done
for f in "${frames[@]}"; do
  for p in "${progs[@]}"; do
    med=$(awk -v f="$f" -v p="$p" '$1 == f && $2 == p { print $3 }' "$work/raw" | sort -n \
      | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    suffix=; [ "$l2" = 1 ] && suffix=_l2; [ "$p" = base ] && suffix=${suffix}_base
    echo "steer_${f}_ns_per_packet$suffix $med ns"
  done
done
