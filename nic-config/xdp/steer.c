// SPDX-License-Identifier: Apache-2.0
//
// xlb steering program: the XDP program attached to every interface xlb serves.
//
// It sends to the AF_XDP socket of the receive queue (XSKMAP `xsks`, key = rx_queue_index)
// only the frames xlb must handle, and gives everything else to the kernel with XDP_PASS:
//   * (dst address, L4 protocol, dst port) listed in `services4` (IPv4) or `services` (IPv6);
//   * SNAT replies: dst address in `snat4` / `snat_addrs` and dst port inside its range
//     (TCP/UDP/SCTP);
//   * frames from a NAT backend (src address, L4 protocol, src port) in `endpoints4` /
//     `endpoints` (replies of DNAT flows, whose destination is the client);
//   * ICMP/ICMPv6 errors (v4 types 3, 11, 12; v6 types 1-4) to an address in `vip_addrs`; to
//     other addresses only if the quoted packet left from a service address:port (NodePort on
//     a node address) or from a SNAT address with its source port in the SNAT range, or went
//     to a NAT backend's (address, protocol, port) in `endpoints4` / `endpoints` (an error
//     about a DNAT flow's packet to its backend, sent to the client). So errors about the
//     node's own connections (PMTU for SSH, kubelet) still reach the kernel;
//   * IPv4 non-first fragments and all IPv6 fragments whose dst address is in `vip_addrs` or
//     whose src address has its bit in `endpoint_addr_filter` (a NAT backend's: a fragmented
//     reply's later fragments carry no ports to find it in `endpoints4` / `endpoints` by),
//     but not an ICMP datagram's (a large echo request goes where a small one goes).
// An IPv6 Hop-by-Hop Options header is skipped and the frame decided on what follows it.
// Everything else (ARP, NDP, echo to a VIP, SSH, traffic to the node's own addresses) passes,
// except for the addresses this node announces in L2 mode (`l2_addrs`, value: this interface's
// MAC): the program answers ARP requests (RFC 826) and Neighbor Solicitations (RFC 4861 7.2.4)
// for them itself with XDP_TX (only while an xlb socket serves the receive queue), and drops whatever else is sent to them that is not a service
// port, an ICMP error or a fragment (so a VIP never reaches the host's own sockets).
// In L2 mode (`l2_self` set) a unicast frame addressed to another MAC than the interface's is
// passed to the kernel (which drops it as another host's) before anything else: a switch that
// floods a frame for another node (its MAC unknown to the switch) does not make this node
// forward that node's VIP traffic.
// A frame of xlb's that finds no socket in its queue's slot is dropped (see steer()).
//
// Map layouts are shared with nic-config/src/maps.rs. Every struct is padding-free on purpose
// (checked by _Static_assert here and by const assertions in Rust), so the byte images match.
// The per-packet lookups of IPv4 TCP/UDP/SCTP frames go to maps of their own with short keys
// (`services4`, `snat4`, `endpoints4`: 8, 4 and 8 bytes), so the kernel hashes and compares 8
// bytes where the 16-byte address form would take 20 (the hash map's jhash2 then runs no
// mixing round; measured with `bpftool prog run ... repeat`, docs/benchmarks.md); `services4`,
// `endpoints4` and `snat4` are probed first through slot indexes of our own over ARRAY maps
// (`services4_index`, `endpoints4_index`, `snat4_index`; see index4_probe() and
// port_in_snat4_range()). Everywhere
// else addresses are 16 bytes: IPv6 as is, IPv4 as the v4-mapped ::ffff:a.b.c.d
// (RFC 4291 2.5.5.2); `services`, `snat_addrs` and `endpoints` hold the IPv6 entries. An IPv6
// TCP/UDP/SCTP frame finds its key in slot indexes of our own too (`services6_index`,
// `endpoints6_index`, `snat6_index`, holding fingerprints of the keys; see index6_probe() and
// port_in_snat6_range()) before it asks `services`, `endpoints` or `snat_addrs`.
//
// Built by nic-config/build.rs with: clang -O2 -g -target bpf -I/usr/include/x86_64-linux-gnu -c
// Only the kernel's UAPI headers (linux-libc-dev) are used; the few libbpf macros needed are
// defined below so libbpf-dev is not required.

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

/* ---- the libbpf conventions this file relies on (see libbpf's bpf_helpers.h) ---- */
#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#undef __always_inline /* <linux/stddef.h> defines it as plain __inline__ */
#define __always_inline inline __attribute__((always_inline))

/* Helper numbers come from enum bpf_func_id in <linux/bpf.h>. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)BPF_FUNC_redirect_map;
static long (*bpf_xdp_adjust_tail)(struct xdp_md *ctx, int delta) = (void *)BPF_FUNC_xdp_adjust_tail;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_ntohs(x) __builtin_bswap16(x)
#define bpf_htonl(x) __builtin_bswap32(x)
#else
#define bpf_htons(x) (x)
#define bpf_ntohs(x) (x)
#define bpf_htonl(x) (x)
#endif

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define IPPROTO_SCTP_ 132
#define IPV6_NEXTHDR_HOP 0
#define IPV6_NEXTHDR_FRAGMENT 44
#define ETH_P_ARP_ 0x0806
#define ARPHRD_ETHER_ 1
#define ARPOP_REQUEST_ 1
#define ARPOP_REPLY_ 2
#define NDISC_NEIGHBOUR_SOLICITATION 135
#define NDISC_NEIGHBOUR_ADVERTISEMENT 136
#define ND_OPT_TARGET_LL_ADDR 2
#define IP_OFFSET_MASK 0x1FFF

/* ICMP (RFC 792) and ICMPv6 (RFC 4443) headers: type, code, checksum, 4 more bytes. Defined here
 * because <linux/icmp.h> drags in glibc headers that need 32-bit multilib stubs. */
struct icmp_hdr {
	__u8 type;
	__u8 code;
	__be16 checksum;
	__be32 rest;
};
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PARAMPROB 4

/* ARP for Ethernet and IPv4 (RFC 826): 28 bytes. */
struct arp_eth {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 oper;
	__u8 sha[6];
	__u8 spa[4];
	__u8 tha[6];
	__u8 tpa[4];
} __attribute__((packed));
_Static_assert(sizeof(struct arp_eth) == 28, "arp_eth must be 28 bytes");

/* Neighbor Solicitation without options (RFC 4861 4.3): 24 bytes. */
struct nd_sol {
	__u8 type;
	__u8 code;
	__be16 checksum;
	__be32 reserved;
	__u8 target[16];
};
_Static_assert(sizeof(struct nd_sol) == 24, "nd_sol must be 24 bytes");

/* Neighbor Advertisement with its Target Link-Layer Address option (RFC 4861 4.4, 4.6.1):
 * 32 bytes. */
struct nd_adv {
	__u8 type;
	__u8 code;
	__be16 checksum;
	__be32 flags; /* R (bit 31), S (30), O (29) */
	__u8 target[16];
	__u8 opt_type;
	__u8 opt_len; /* in units of 8 bytes */
	__u8 mac[6];
};
_Static_assert(sizeof(struct nd_adv) == 32, "nd_adv must be 32 bytes");

/* ---- shared layouts (keep in sync with src/maps.rs) ---- */

/* Key of `services`: 20 bytes, no padding. */
struct service_key {
	__u8 addr[16];  /* dst address, v4-mapped for IPv4 */
	__be16 port;    /* dst port, network byte order */
	__u8 proto;     /* IPPROTO_TCP (6), IPPROTO_UDP (17) or IPPROTO_SCTP (132) */
	__u8 pad;       /* always 0 */
};
_Static_assert(sizeof(struct service_key) == 20, "service_key must be 20 bytes, no padding");

/* Key of `services4` and `endpoints4`: the IPv4 form of service_key, 8 bytes, no padding. */
struct service4_key {
	__be32 addr;    /* IPv4 address, network byte order */
	__be16 port;    /* port, network byte order */
	__u8 proto;     /* IPPROTO_TCP (6), IPPROTO_UDP (17) or IPPROTO_SCTP (132) */
	__u8 pad;       /* always 0 */
};
_Static_assert(sizeof(struct service4_key) == 8, "service4_key must be 8 bytes, no padding");

/* Key of `vip_addrs` and `snat_addrs`: 16 bytes. */
struct addr_key {
	__u8 addr[16];
};
_Static_assert(sizeof(struct addr_key) == 16, "addr_key must be 16 bytes");

/* Value of `snat_addrs`: inclusive port range, host byte order. 4 bytes, no padding. */
struct snat_range {
	__u16 port_min;
	__u16 port_max;
};
_Static_assert(sizeof(struct snat_range) == 4, "snat_range must be 4 bytes, no padding");

/* Value of `l2_addrs`: the MAC of the interface this program is attached to. 8 bytes. */
struct l2_mac {
	__u8 mac[6];
	__u8 pad[2]; /* always 0 */
};
_Static_assert(sizeof(struct l2_mac) == 8, "l2_mac must be 8 bytes, no padding");

/* Value of `l2_self` (key 0): the interface's MAC, whether to pass unicast frames addressed
 * to another MAC, and whether `l2_addrs` may hold addresses. 8 bytes; all zero (the default) =
 * no check and no `l2_addrs` lookup. */
struct l2_self {
	__u8 mac[6];
	__u8 check; /* 1: check the destination MAC */
	__u8 addrs; /* 1: `l2_addrs` may hold addresses (0: it is empty, so no lookup) */
};
_Static_assert(sizeof(struct l2_self) == 8, "l2_self must be 8 bytes, no padding");

/* Indexes of `stats`. Every frame increments exactly one of them. */
enum {
	STAT_REDIRECTED = 0,      /* handed to bpf_redirect_map and a socket was in the slot */
	STAT_PASSED = 1,          /* not ours: XDP_PASS */
	STAT_REDIRECT_FAILED = 2, /* ours, but no socket in xsks[rx_queue_index]: XDP_DROP */
	STAT_PARSE_ERROR = 3,     /* truncated or malformed headers: XDP_PASS */
	STAT_L2_REPLIED = 4,      /* ARP reply or Neighbor Advertisement for an l2_addrs entry: XDP_TX */
	STAT_L2_DROPPED = 5,      /* to an l2_addrs address, not a service port: XDP_DROP */
	STAT_L2_OTHER_HOST = 6,   /* l2_self check on: unicast to another MAC, XDP_PASS */
	STAT_MAX = 7,
};

/* ---- maps ---- */

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

/* IPv4 services: (dst address, dst port, protocol). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct service4_key);
	__type(value, __u32);
} services4 SEC(".maps");

/* The slot indexes in front of `services4` and `endpoints4` (nic-config/src/index.rs has the
 * rules): open-addressing tables of our own over ARRAY maps, whose lookups the verifier
 * inlines, so a frame to a service or from a NAT backend costs a multiply and one or two array
 * reads instead of the hash map's jhash2 and helper call. A used slot holds the 8 bytes of the
 * hash map's key with the pad byte INDEX4_USED, read as one native-endian u64; 0 is an empty
 * slot; any other value (all ones: a removed key's tombstone) is passed over. */
#define SERVICES4_INDEX_BITS 17
#define ENDPOINTS4_INDEX_BITS 19
#define SNAT4_INDEX_BITS 11
#define INDEX4_WINDOW 8
#define INDEX4_MUL 0x9E3779B97F4A7C15ull
#define INDEX4_USED 1
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << SERVICES4_INDEX_BITS);
	__type(key, __u32);
	__type(value, __u64);
} services4_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << ENDPOINTS4_INDEX_BITS);
	__type(key, __u32);
	__type(value, __u64);
} endpoints4_index SEC(".maps");

/* The slot index in front of `snat4`: a slot holds a snat4_slot (address, then its port
 * range), and a probe compares the address, from the address's home. 0.0.0.0 (an empty slot)
 * and 255.255.255.255 (a tombstone) are never SNAT addresses. */
struct snat4_slot {
	__be32 addr;
	struct snat_range range;
};
_Static_assert(sizeof(struct snat4_slot) == 8, "snat4_slot must be 8 bytes");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << SNAT4_INDEX_BITS);
	__type(key, __u32);
	__type(value, struct snat4_slot);
} snat4_index SEC(".maps");

/* The slot indexes in front of `services` and `endpoints` (IPv6 keys; nic-config/src/index.rs
 * has the rules): as `services4_index`, but a used slot holds the key's fingerprint, the top
 * 56 bits of key6_hash() with INDEX4_USED in the top byte (see index6_probe()). Two keys
 * sharing a fingerprint (one pair in 2^56) both find it: a frame taken for another key's goes
 * to xlb, which passes frames that are none of its own on to the kernel. */
#define SERVICES6_INDEX_BITS 17
#define ENDPOINTS6_INDEX_BITS 19
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << SERVICES6_INDEX_BITS);
	__type(key, __u32);
	__type(value, __u64);
} services6_index SEC(".maps");

/* The slot index in front of `snat_addrs`: as `snat4_index`, but a slot's `addr` holds the
 * IPv6 address's 30-bit id, never 0 (an empty slot) nor all ones (a tombstone), and the port
 * range of every listed address with that id (see port_in_snat6_range()). */
#define SNAT6_INDEX_BITS 11
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << SNAT6_INDEX_BITS);
	__type(key, __u32);
	__type(value, struct snat4_slot);
} snat6_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << ENDPOINTS6_INDEX_BITS);
	__type(key, __u32);
	__type(value, __u64);
} endpoints6_index SEC(".maps");

/* IPv6 services. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct service_key);
	__type(value, __u32);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct addr_key);
	__type(value, __u32);
} vip_addrs SEC(".maps");

/* Backends of NAT services by (source address, protocol, source port): their replies to
 * clients (DNAT without SNAT keeps the client address, so the reply's destination is not
 * ours) must reach xlb to be translated back to the VIP. IPv4 backends. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct service4_key);
	__type(value, __u32);
} endpoints4 SEC(".maps");

/* IPv6 backends, as endpoints4. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct service_key);
	__type(value, __u32);
} endpoints SEC(".maps");

/* SNAT addresses with their port ranges: IPv4 (key: the address, network byte order)... */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __be32);
	__type(value, struct snat_range);
} snat4 SEC(".maps");

/* ...and IPv6. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct addr_key);
	__type(value, struct snat_range);
} snat_addrs SEC(".maps");

/* The addresses this node announces in L2 mode, with the MAC to answer with. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct addr_key);
	__type(value, struct l2_mac);
} l2_addrs SEC(".maps");

/* The filter in front of `l2_addrs` (nic-config/src/filter.rs): one bit per address (16-byte
 * form), as the IPv6 filters above; written by the L2 responder with the map. */
#define L2_FILTER_BITS 18
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << (L2_FILTER_BITS - 6));
	__type(key, __u32);
	__type(value, __u64);
} l2_filter SEC(".maps");

/* One bit per NAT backend's address (the addresses of `endpoints4` and `endpoints`, 16-byte
 * form; nic-config/src/filter.rs): a later fragment of a backend's reply carries no port, so
 * its source is asked here instead of `endpoints4` / `endpoints`. Written by
 * Steering::sync_endpoints with the maps. */
#define ENDPOINT_ADDR_FILTER_BITS 18
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << (ENDPOINT_ADDR_FILTER_BITS - 6));
	__type(key, __u32);
	__type(value, __u64);
} endpoint_addr_filter SEC(".maps");

/* L2 mode: this interface's MAC, to pass frames meant for other hosts (see the head comment). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct l2_self);
} l2_self SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* ---- helpers ---- */

static __always_inline int count(__u32 idx, int action)
{
	__u64 *c = bpf_map_lookup_elem(&stats, &idx);
	if (c)
		*c += 1; /* per-CPU slot: no atomics needed */
	return action;
}

static __always_inline int pass(void)
{
	return count(STAT_PASSED, XDP_PASS);
}

static __always_inline int parse_error(void)
{
	return count(STAT_PARSE_ERROR, XDP_PASS);
}

/*
 * The hash of address `a` (16 bytes: IPv6, or IPv4 v4-mapped for `l2_filter`) and `x` (a
 * port's two bytes as in the frame, then the protocol, read as a native-endian u64; 0 for
 * `snat6_index` and `l2_filter`): ((((lo * M) ^ hi) * M) ^ x) * M, lo and hi the address's
 * halves read as native-endian u64s and M INDEX4_MUL (nic-config/src/filter.rs `hash_of`).
 */
static __always_inline __u64 key6_hash(const struct addr_key *a, __u64 x)
{
	__u64 lo, hi;
	__builtin_memcpy(&lo, a->addr, 8);
	__builtin_memcpy(&hi, a->addr + 8, 8);
	return ((((lo * INDEX4_MUL) ^ hi) * INDEX4_MUL) ^ x) * INDEX4_MUL;
}

/*
 * Whether the key of address `a` and `x` (as key6_hash()) has its bit set in filter `filter`
 * of 2^bits bits: the top `bits` bits of key6_hash(); bit b is bit b % 64 of word b / 64.
 * Clear: the key is not in the filter's hash map.
 */
static __always_inline int filter6_has(void *filter, __u32 bits, const struct addr_key *a, __u64 x)
{
	__u64 h = key6_hash(a, x);
	__u32 bit = (__u32)(h >> (64 - bits));
	__u32 word = bit >> 6;
	__u64 *w = bpf_map_lookup_elem(filter, &word);
	return w && ((*w >> (bit & 63)) & 1);
}

/* The `x` of filter6_has() for port `port` (as in the frame) and protocol `proto`. */
static __always_inline __u64 port_proto(__be16 port, __u8 proto)
{
	return (__u64)port | ((__u64)proto << 16);
}

/* Whether a fragment from `src` to `dst` is xlb's: a client's to a VIP (xlb reassembles or
 * follows the first fragment), or a NAT backend's (a reply whose first fragment, with the
 * ports, was steered by `endpoints4` / `endpoints`: DNAT replies go to the client, SNAT
 * replies to the SNAT address). A backend address's bit may be another address's too: xlb
 * hands back to the kernel the fragments it has no series for. */
static __always_inline int fragment_ours(const struct addr_key *src, const struct addr_key *dst)
{
	return bpf_map_lookup_elem(&vip_addrs, (void *)dst) ||
	       filter6_has(&endpoint_addr_filter, ENDPOINT_ADDR_FILTER_BITS, src, 0);
}

/* A frame that is none of xlb's: to the kernel, unless its destination is an address this node
 * announces in L2 mode, which only the Service's ports may answer (kube-proxy's rule for
 * LoadBalancer IPs: the node's own sockets never see them). */
static __always_inline int pass_unless_l2(const struct l2_self *me, const struct addr_key *dst)
{
	/* Without L2 announcement `l2_addrs` is empty and `l2_self.addrs` 0 (`me`: the entry
	 * xlb_steer() read): no hash lookup for every frame of the node's own (6 of its 18 ns,
	 * `make bench-steer`). With it, the hash map is asked only for an address whose bit is
	 * set in `l2_filter`. */
	if (me && me->addrs && filter6_has(&l2_filter, L2_FILTER_BITS, dst, 0) &&
	    bpf_map_lookup_elem(&l2_addrs, (void *)dst))
		return count(STAT_L2_DROPPED, XDP_DROP);
	return pass();
}

static __always_inline int steer(struct xdp_md *ctx)
{
	/* The low bits of flags are the action when the slot is empty (kernel >= 5.3). A frame
	 * of xlb's with no socket to take it (during a hand-over, between the old process's last
	 * batch and the new one's program swap) is dropped: the kernel would forward it
	 * untranslated (a backend's reply reaching the client from the backend's address makes
	 * the client reset the connection), while a dropped segment is retransmitted. */
	long rc = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_DROP);
	if (rc == XDP_REDIRECT)
		return count(STAT_REDIRECTED, XDP_REDIRECT);
	return count(STAT_REDIRECT_FAILED, XDP_DROP);
}

static __always_inline void v4_mapped(__u8 out[16], __be32 a)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(&out[12], &a, 4);
}

/* Whether `port_be` (network byte order) lies in the inclusive range `r` (host order). */
static __always_inline int port_in_range(const struct snat_range *r, __be16 port_be)
{
	__u16 port = bpf_ntohs(port_be);
	return port >= r->port_min && port <= r->port_max;
}

/* `snat_addrs` itself, for an address whose index window is full: out of line, as
 * service4_hashed() below. */
static __attribute__((noinline)) int port_in_snat6_hashed(const struct addr_key *dst, __be16 port_be)
{
	struct snat_range *r = bpf_map_lookup_elem(&snat_addrs, (void *)dst);
	return r && port_in_range(r, port_be);
}

/* Probes SNAT slot index `index` (`snat4_index` or `snat6_index`, 2^bits slots) for the
 * address of id `id` (never 0 nor all ones) from its home (the top `bits` bits of id *
 * INDEX4_MUL): the first slot with the id decides whether `port_be` is in its range, an empty
 * slot says the address is none, and -1 when the window holds neither (the hash map then
 * answers). */
static __always_inline int snat_probe(void *index, __u32 bits, __u32 id, __be16 port_be)
{
	__u32 home = (__u32)(((__u64)id * INDEX4_MUL) >> (64 - bits));
#pragma unroll
	for (__u32 i = 0; i < INDEX4_WINDOW; i++) {
		__u32 slot = (home + i) & ((1u << bits) - 1);
		struct snat4_slot *v = bpf_map_lookup_elem(index, &slot);
		if (!v)
			break;
		if (v->addr == id)
			return port_in_range(&v->range, port_be);
		if (v->addr == 0)
			return 0;
	}
	return -1;
}

/* Whether an IPv6 frame to `dst` with port `port_be` is a SNAT reply: probed in `snat6_index`
 * by the address's id, the top 30 bits of key6_hash(dst, 0) with the lowest bit set
 * (nic-config/src/index.rs `snat6_id`). An unlisted address that shares a listed one's id
 * (one in 2^30 per slot compared) has the frames in that range taken to xlb, which passes
 * frames that are none of its own on to the kernel; listed addresses that share an id share
 * a slot whose range covers all of theirs. */
static __always_inline int port_in_snat6_range(const struct addr_key *dst, __be16 port_be)
{
	__u32 id = (__u32)(key6_hash(dst, 0) >> 34) | 1;
	int r = snat_probe(&snat6_index, SNAT6_INDEX_BITS, id, port_be);
	return r >= 0 ? r : port_in_snat6_hashed(dst, port_be);
}

/* `snat4` itself, for an address whose index window is full: out of line, as
 * service4_hashed() below. */
static __attribute__((noinline)) int port_in_snat4_hashed(__be32 addr, __be16 port_be)
{
	struct snat_range *r = bpf_map_lookup_elem(&snat4, &addr);
	return r && port_in_range(r, port_be);
}

/* Whether an IPv4 frame to `addr` (network byte order) with port `port_be` is a SNAT reply:
 * probed in `snat4_index` by the address itself (its 4 bytes read as a native-endian u32),
 * then, for a full window, in `snat4`. */
static __always_inline int port_in_snat4_range(__be32 addr, __be16 port_be)
{
	/* Never SNAT addresses, and the index's own markers: a frame to one must not match an
	 * empty slot or a tombstone. */
	if (addr == 0 || addr == 0xffffffff)
		return 0;
	int r = snat_probe(&snat4_index, SNAT4_INDEX_BITS, (__u32)addr, port_be);
	return r >= 0 ? r : port_in_snat4_hashed(addr, port_be);
}

/* TCP, UDP and SCTP all start with src port, dst port (16 bits each). */
static __always_inline int is_port_proto(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP_;
}

/*
 * Probes slot index `index` (2^bits slots) for slot value `k` from its home slot (the top
 * `bits` bits of k * INDEX4_MUL): 1 for a match, 0 for an empty slot, -1 when the window
 * holds neither (the hash map then answers).
 */
static __always_inline int index_probe(void *index, __u32 bits, __u64 k)
{
	__u32 home = (__u32)((k * INDEX4_MUL) >> (64 - bits));
#pragma unroll
	for (__u32 i = 0; i < INDEX4_WINDOW; i++) {
		__u32 slot = (home + i) & ((1u << bits) - 1);
		__u64 *v = bpf_map_lookup_elem(index, &slot);
		if (!v)
			break;
		if (*v == k)
			return 1;
		if (*v == 0)
			return 0;
	}
	return -1;
}

/* index_probe() for an IPv4 key: the slot value is the key itself, pad byte INDEX4_USED. */
static __always_inline int index4_probe(void *index, __u32 bits, __be32 addr, __be16 port, __u8 proto)
{
	struct service4_key sk = { .addr = addr, .port = port, .proto = proto, .pad = INDEX4_USED };
	__u64 k;
	__builtin_memcpy(&k, &sk, sizeof(k));
	return index_probe(index, bits, k);
}

/* index_probe() for an IPv6 key (address `a`, port as in the frame, protocol): the slot value
 * is its fingerprint, key6_hash()'s top 56 bits with INDEX4_USED in the top byte (the hash's
 * low bits do not see the address's last byte; nic-config/src/index.rs `fingerprint6`). */
static __always_inline int index6_probe(void *index, __u32 bits, const struct addr_key *a, __be16 port, __u8 proto)
{
	__u64 k = (key6_hash(a, port_proto(port, proto)) >> 8) | ((__u64)INDEX4_USED << 56);
	return index_probe(index, bits, k);
}

/* The hash maps themselves, for a key whose index window is full: out of line (BPF-to-BPF
 * calls), because inlined after the probe the lookup made every IPv4 frame 2 to 7 ns slower,
 * taken or not (`make bench-steer`, docs/benchmarks.md). */
static __attribute__((noinline)) int service4_hashed(__be32 addr, __be16 port, __u8 proto)
{
	struct service4_key sk = { .addr = addr, .port = port, .proto = proto, .pad = 0 };
	return bpf_map_lookup_elem(&services4, &sk) != 0;
}

static __attribute__((noinline)) int endpoint4_hashed(__be32 addr, __be16 port, __u8 proto)
{
	struct service4_key ek = { .addr = addr, .port = port, .proto = proto, .pad = 0 };
	return bpf_map_lookup_elem(&endpoints4, &ek) != 0;
}

/* Whether (address, port, protocol), all as in the frame, is in `services4`. */
static __always_inline int service4_listed(__be32 addr, __be16 port, __u8 proto)
{
	int r = index4_probe(&services4_index, SERVICES4_INDEX_BITS, addr, port, proto);
	return r >= 0 ? r : service4_hashed(addr, port, proto);
}

/* Whether (address, port, protocol), all as in the frame, is in `endpoints4`. */
static __always_inline int endpoint4_listed(__be32 addr, __be16 port, __u8 proto)
{
	int r = index4_probe(&endpoints4_index, ENDPOINTS4_INDEX_BITS, addr, port, proto);
	return r >= 0 ? r : endpoint4_hashed(addr, port, proto);
}

/*
 * Whether an IPv4 TCP/UDP/SCTP frame is xlb's (`ports`: its 4 port bytes, bounds-checked by
 * the caller): to a service, a SNAT reply, or from a NAT backend. Addresses in network order.
 */
static __always_inline int ports4_ours(__be32 daddr, __be32 saddr, __u8 proto, const __be16 *ports)
{
	if (service4_listed(daddr, ports[1], proto))
		return 1;
	if (port_in_snat4_range(daddr, ports[1]))
		return 1;
	return endpoint4_listed(saddr, ports[0], proto);
}

/* Whether (IPv6 address `a`, port as in the frame, protocol) is a key of `map` (`services` or
 * `endpoints`): the hash map itself, for a key whose index window is full (out of line, as
 * service4_hashed()). */
static __attribute__((noinline)) int key6_hashed(void *map, const struct addr_key *a, __be16 port, __u8 proto)
{
	struct service_key k = {};
	__builtin_memcpy(k.addr, a->addr, 16);
	k.port = port;
	k.proto = proto;
	return bpf_map_lookup_elem(map, &k) != 0;
}

/* Whether (IPv6 address `a`, port as in the frame, protocol) is in `services`. */
static __always_inline int service6_listed(const struct addr_key *a, __be16 port, __u8 proto)
{
	int r = index6_probe(&services6_index, SERVICES6_INDEX_BITS, a, port, proto);
	return r >= 0 ? r : key6_hashed(&services, a, port, proto);
}

/* Whether (IPv6 address `a`, port as in the frame, protocol) is in `endpoints`. */
static __always_inline int endpoint6_listed(const struct addr_key *a, __be16 port, __u8 proto)
{
	int r = index6_probe(&endpoints6_index, ENDPOINTS6_INDEX_BITS, a, port, proto);
	return r >= 0 ? r : key6_hashed(&endpoints, a, port, proto);
}

/*
 * Decide for an IPv6 TCP/UDP/SCTP header at `l4` (4 bytes already bounds-checked by the
 * caller): to a service, a SNAT reply, or from a NAT backend.
 */
static __always_inline int ports_verdict(struct xdp_md *ctx, const struct l2_self *me,
					 const struct addr_key *src, const struct addr_key *dst, __u8 proto,
					 const __be16 *ports)
{
	if (service6_listed(dst, ports[1], proto))
		return steer(ctx);
	if (port_in_snat6_range(dst, ports[1]))
		return steer(ctx);
	if (endpoint6_listed(src, ports[0], proto))
		return steer(ctx);
	return pass_unless_l2(me, dst);
}

/*
 * ICMP error whose quoted packet starts at `inner` (after the 8-byte ICMP header).
 * `outer_dst` is the address the error is sent to (`outer_dst4` too for IPv4).
 */
static __always_inline int icmp_error_verdict(struct xdp_md *ctx, void *inner, void *end,
					      const struct addr_key *outer_dst, __be32 outer_dst4, int v6)
{
	if (bpf_map_lookup_elem(&vip_addrs, (void *)outer_dst))
		return steer(ctx);

	/* Otherwise ours only if the quoted packet left from a service address:port (e.g. a
	 * NodePort reply from a node address) or from a SNAT address:port in its range, or went
	 * to a NAT backend's address:port: a DNAT flow's packet on its way to the backend keeps
	 * the client's address, so an error about it (the backend's port unreachable, a router's
	 * too-big or time exceeded on the backend side) is sent to the client and quotes the
	 * backend's address, which only xlb can turn back into the VIP's (RFC 5508 section 7;
	 * netfilter's nf_nat_icmp_reply_translation). */
	__u8 proto;
	__be16 *ports;
	struct addr_key qdst;
	__be32 qdst4 = 0;
	if (!v6) {
		struct iphdr *iph = inner;
		if ((void *)(iph + 1) > end)
			return parse_error();
		__u32 ihl = iph->ihl;
		if (ihl < 5)
			return parse_error();
		/* A quoted later fragment has no transport header: its next 8 bytes are data. */
		if (iph->frag_off & bpf_htons(IP_OFFSET_MASK))
			return pass();
		ports = (void *)iph + ihl * 4;
		proto = iph->protocol;
		qdst4 = iph->daddr;
	} else {
		struct ipv6hdr *ip6 = inner;
		if ((void *)(ip6 + 1) > end)
			return parse_error();
		ports = (void *)(ip6 + 1);
		proto = ip6->nexthdr;
		__builtin_memcpy(qdst.addr, &ip6->daddr, 16);
	}
	if (!is_port_proto(proto))
		return pass();
	if ((void *)(ports + 2) > end)
		return parse_error();
	/* The quoted packet's source is the error's destination: outer_dst and ports[0]; its
	 * destination is qdst and ports[1]. */
	if (!v6) {
		if (service4_listed(outer_dst4, ports[0], proto) || port_in_snat4_range(outer_dst4, ports[0]) ||
		    endpoint4_listed(qdst4, ports[1], proto))
			return steer(ctx);
		return pass();
	}
	if (service6_listed(outer_dst, ports[0], proto) || port_in_snat6_range(outer_dst, ports[0]) ||
	    endpoint6_listed(&qdst, ports[1], proto))
		return steer(ctx);
	return pass();
}

static __always_inline int handle_ipv4(struct xdp_md *ctx, const struct l2_self *me, void *l3, void *end)
{
	struct iphdr *iph = l3;
	if ((void *)(iph + 1) > end)
		return parse_error();
	__u32 ihl = iph->ihl;
	if (iph->version != 4 || ihl < 5)
		return parse_error();
	void *l4 = l3 + ihl * 4;
	if (l4 > end)
		return parse_error();

	__u8 proto = iph->protocol;
	int later_fragment = (iph->frag_off & bpf_htons(IP_OFFSET_MASK)) != 0;
	if (!later_fragment && is_port_proto(proto)) {
		__be16 *ports = l4;
		if ((void *)(ports + 2) > end)
			return parse_error();
		if (ports4_ours(iph->daddr, iph->saddr, proto, ports))
			return steer(ctx);
	}

	struct addr_key dst;
	v4_mapped(dst.addr, iph->daddr);
	if (later_fragment) {
		/* Non-first fragment: no L4 header. An ICMP datagram's (an echo request larger than
		 * the link) goes where its first fragment went: ICMP errors are never this long. */
		if (proto == IPPROTO_ICMP)
			return pass_unless_l2(me, &dst);
		struct addr_key src;
		v4_mapped(src.addr, iph->saddr);
		if (fragment_ours(&src, &dst))
			return steer(ctx);
		return pass();
	}
	if (proto == IPPROTO_ICMP) {
		struct icmp_hdr *icmp = l4;
		if ((void *)(icmp + 1) > end)
			return parse_error();
		__u8 t = icmp->type;
		if (t == ICMP_DEST_UNREACH || t == ICMP_TIME_EXCEEDED || t == ICMP_PARAMETERPROB)
			return icmp_error_verdict(ctx, (void *)(icmp + 1), end, &dst, iph->daddr, 0);
	}
	return pass_unless_l2(me, &dst);
}

/* Whether an xlb socket serves this receive queue. A node whose xlb died (its sockets closed,
 * the program left attached with its maps) must stop answering for the VIPs at once, so that
 * another node can take them over; the kernel removes a closed socket from `xsks`. */
static __always_inline int xlb_alive(struct xdp_md *ctx)
{
	__u32 q = ctx->rx_queue_index;
	return bpf_map_lookup_elem(&xsks, &q) != 0;
}

/* Whether two MAC addresses are equal. */
static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

/* Folds a 32-bit one's complement sum to 16 bits and complements it (RFC 1071). */
static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/*
 * An ARP request (RFC 826) at `l3` for an address in `l2_addrs`: turned into the reply in
 * place (sender and target swapped, our MAC as sender) and sent back out with XDP_TX.
 * Gratuitous requests (sender address = target address, another node announcing) and
 * everything else pass to the kernel.
 */
static __always_inline int handle_arp(struct xdp_md *ctx, struct ethhdr *eth, void *l3, void *end)
{
	struct arp_eth *arp = l3;
	if ((void *)(arp + 1) > end)
		return parse_error();
	if (arp->htype != bpf_htons(ARPHRD_ETHER_) || arp->ptype != bpf_htons(ETH_P_IP) || arp->hlen != 6 ||
	    arp->plen != 4 || arp->oper != bpf_htons(ARPOP_REQUEST_))
		return pass();
	__be32 tpa, spa;
	__builtin_memcpy(&tpa, arp->tpa, 4);
	__builtin_memcpy(&spa, arp->spa, 4);
	if (tpa == spa)
		return pass();
	struct addr_key k;
	v4_mapped(k.addr, tpa);
	struct l2_mac *m = bpf_map_lookup_elem(&l2_addrs, &k);
	if (!m || !xlb_alive(ctx))
		return pass();
	__u8 sha[6];
	__builtin_memcpy(sha, arp->sha, 6);
	arp->oper = bpf_htons(ARPOP_REPLY_);
	__builtin_memcpy(arp->tha, sha, 6);
	__builtin_memcpy(arp->tpa, &spa, 4);
	__builtin_memcpy(arp->sha, m->mac, 6);
	__builtin_memcpy(arp->spa, &tpa, 4);
	__builtin_memcpy(eth->h_dest, sha, 6);
	__builtin_memcpy(eth->h_source, m->mac, 6);
	return count(STAT_L2_REPLIED, XDP_TX);
}

/*
 * A Neighbor Solicitation (IPv6 header at `l3off`) for an address in `l2_addrs`: answered with
 * a solicited Neighbor Advertisement (RFC 4861 7.2.4: to the solicitation's source, flags S and
 * O, Target Link-Layer Address option) built in place, the frame trimmed or grown to fit, and
 * sent back with XDP_TX. Solicitations that fail RFC 4861 7.1.1 validation (hop limit 255, code
 * 0), Duplicate Address Detection probes (unspecified source) and other targets pass.
 */
static __always_inline int handle_ns(struct xdp_md *ctx, __u32 l3off)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (l3off > 18)
		return parse_error();
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = data + l3off;
	if ((void *)(ip6 + 1) > end)
		return parse_error();
	struct nd_sol *ns = (void *)(ip6 + 1);
	if ((void *)(ns + 1) > end)
		return parse_error();
	if (ip6->hop_limit != 255 || ns->code != 0)
		return pass();
	struct addr_key target;
	__builtin_memcpy(target.addr, ns->target, 16);
	struct l2_mac *m = bpf_map_lookup_elem(&l2_addrs, &target);
	if (!m || !xlb_alive(ctx))
		return pass();
	__u16 src[8], tgt[8];
	__builtin_memcpy(src, &ip6->saddr, 16);
	__builtin_memcpy(tgt, target.addr, 16);
	__u16 any = 0;
#pragma unroll
	for (int i = 0; i < 8; i++)
		any |= src[i];
	if (!any)
		return pass(); /* DAD probe */
	__u8 dmac[6];
	__builtin_memcpy(dmac, eth->h_source, 6);

	struct nd_adv na = {};
	na.type = NDISC_NEIGHBOUR_ADVERTISEMENT;
	na.flags = bpf_htonl(0x60000000); /* Solicited, Override */
	__builtin_memcpy(na.target, target.addr, 16);
	na.opt_type = ND_OPT_TARGET_LL_ADDR;
	na.opt_len = 1;
	__builtin_memcpy(na.mac, m->mac, 6);
	/* ICMPv6 checksum (RFC 4443 2.3) over the pseudo-header (RFC 8200 8.1): source (the
	 * target), destination (the solicitation's source), length 32, next header 58. */
	__u32 sum = bpf_htons(sizeof(na)) + bpf_htons(IPPROTO_ICMPV6);
#pragma unroll
	for (int i = 0; i < 8; i++)
		sum += src[i] + tgt[i];
	__u16 w[16];
	__builtin_memcpy(w, &na, sizeof(na));
#pragma unroll
	for (int i = 0; i < 16; i++)
		sum += w[i];
	na.checksum = csum_fold(sum);

	long have = end - data;
	long want = l3off + sizeof(struct ipv6hdr) + sizeof(na);
	if (have != want) {
		if (bpf_xdp_adjust_tail(ctx, (int)(want - have)))
			return pass();
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
	}
	eth = data;
	ip6 = data + l3off;
	if ((void *)(ip6 + 1) + sizeof(na) > end)
		return parse_error();
	__builtin_memcpy(eth->h_dest, dmac, 6);
	__builtin_memcpy(eth->h_source, m->mac, 6);
	__be32 vtcfl = bpf_htonl(0x60000000);
	__builtin_memcpy(ip6, &vtcfl, 4);
	ip6->payload_len = bpf_htons(sizeof(na));
	ip6->nexthdr = IPPROTO_ICMPV6;
	ip6->hop_limit = 255;
	__builtin_memcpy(&ip6->daddr, src, 16);
	__builtin_memcpy(&ip6->saddr, tgt, 16);
	__builtin_memcpy(ip6 + 1, &na, sizeof(na));
	return count(STAT_L2_REPLIED, XDP_TX);
}

static __always_inline int handle_ipv6(struct xdp_md *ctx, const struct l2_self *me, void *l3, void *end,
				       __u32 l3off)
{
	struct ipv6hdr *ip6 = l3;
	if ((void *)(ip6 + 1) > end)
		return parse_error();
	if (ip6->version != 6)
		return parse_error();

	struct addr_key dst, src;
	__builtin_memcpy(dst.addr, &ip6->daddr, 16);
	__builtin_memcpy(src.addr, &ip6->saddr, 16);

	__u8 proto = ip6->nexthdr;
	void *l4 = (void *)(ip6 + 1);
	if (proto == IPV6_NEXTHDR_HOP) {
		/* A Hop-by-Hop Options header comes first when present (RFC 8200 4.1): its length
		 * in 8-octet units, not counting the first 8. What follows is decided as without it
		 * (a fragment behind it, a service's datagram with a Router Alert). */
		__u8 *hbh = l4;
		if ((void *)(hbh + 2) > end)
			return parse_error();
		proto = hbh[0];
		l4 = (void *)hbh + ((__u32)hbh[1] + 1) * 8;
		if (l4 > end)
			return parse_error();
	}
	if (proto == IPV6_NEXTHDR_FRAGMENT) {
		/* Any fragment (first or not) to a VIP or from a NAT backend goes to xlb, which
		 * follows its first fragment or hands it back. */
		if ((void *)((__u8 *)l4 + 8) > end)
			return parse_error();
		/* An ICMPv6 datagram's fragments (an echo request larger than the link) go where an
		 * unfragmented one would: ICMPv6 errors fit in the minimum MTU (RFC 4443 2.4(c)). */
		if (*(__u8 *)l4 == IPPROTO_ICMPV6)
			return pass_unless_l2(me, &dst);
		if (fragment_ours(&src, &dst))
			return steer(ctx);
		return pass();
	}
	if (is_port_proto(proto)) {
		__be16 *ports = l4;
		if ((void *)(ports + 2) > end)
			return parse_error();
		return ports_verdict(ctx, me, &src, &dst, proto, ports);
	}
	if (proto == IPPROTO_ICMPV6) {
		struct icmp_hdr *icmp = l4;
		if ((void *)(icmp + 1) > end)
			return parse_error();
		__u8 t = icmp->type;
		/* 1 dest unreachable, 2 packet too big, 3 time exceeded, 4 parameter problem */
		if (t >= ICMPV6_DEST_UNREACH && t <= ICMPV6_PARAMPROB)
			return icmp_error_verdict(ctx, (void *)(icmp + 1), end, &dst, 0, 1);
		/* handle_ns() reads the solicitation right after the IPv6 header. */
		if (t == NDISC_NEIGHBOUR_SOLICITATION && l4 == (void *)(ip6 + 1))
			return handle_ns(ctx, l3off);
		/* Other NDP (RS, RA, NA, redirect) is link-scoped and never for a service. */
		if (t >= NDISC_NEIGHBOUR_SOLICITATION - 2 && t <= NDISC_NEIGHBOUR_ADVERTISEMENT + 1)
			return pass();
	}
	return pass_unless_l2(me, &dst);
}

SEC("xdp")
int xlb_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return parse_error();
	__be16 h_proto = eth->h_proto;
	void *l3 = (void *)(eth + 1);
	__u32 l3off = sizeof(struct ethhdr);

	/* L2 mode: a unicast frame for another MAC (flooded by a switch) is not this node's. */
	__u32 zero = 0;
	struct l2_self *me = bpf_map_lookup_elem(&l2_self, &zero);
	if (me && me->check && !(eth->h_dest[0] & 1) && !mac_eq(eth->h_dest, me->mac))
		return count(STAT_L2_OTHER_HOST, XDP_PASS);

	/* One optional 802.1Q / 802.1ad tag: TCI then the encapsulated EtherType. */
	if (h_proto == bpf_htons(ETH_P_8021Q_) || h_proto == bpf_htons(ETH_P_8021AD_)) {
		__be16 *vlan = l3;
		if ((void *)(vlan + 2) > end)
			return parse_error();
		h_proto = vlan[1];
		l3 = (void *)(vlan + 2);
		l3off += 4;
	}

	if (h_proto == bpf_htons(ETH_P_IP))
		return handle_ipv4(ctx, me, l3, end);
	if (h_proto == bpf_htons(ETH_P_IPV6))
		return handle_ipv6(ctx, me, l3, end, l3off);
	if (h_proto == bpf_htons(ETH_P_ARP_))
		return handle_arp(ctx, eth, l3, end);
	return pass(); /* LLDP, ... */
}

char _license[] SEC("license") = "Apache-2.0";
