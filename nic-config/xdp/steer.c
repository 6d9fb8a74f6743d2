// SPDX-License-Identifier: Apache-2.0
//
// xlb steering program: the XDP program attached to every interface xlb serves.
//
// It sends to the AF_XDP socket of the receive queue (XSKMAP `xsks`, key = rx_queue_index)
// only the frames xlb must handle, and gives everything else to the kernel with XDP_PASS:
//   * (dst address, L4 protocol, dst port) listed in `services`;
//   * SNAT replies: dst address in `snat_addrs` and dst port inside its range (TCP/UDP/SCTP);
//   * ICMP/ICMPv6 errors (v4 types 3, 11, 12; v6 types 1-4) to an address in `vip_addrs`; to
//     other addresses only if the quoted packet left from a `services` address:port (NodePort on
//     a node address) or from a `snat_addrs` address with its source port in the SNAT range. So
//     errors about the node's own connections (PMTU for SSH, kubelet) still reach the kernel;
//   * IPv4 non-first fragments and all IPv6 fragments whose dst address is in `vip_addrs`.
// Everything else (ARP, NDP, echo to a VIP, SSH, traffic to the node's own addresses) passes.
// A frame of xlb's that finds no socket in its queue's slot is dropped (see steer()).
//
// Map layouts are shared with nic-config/src/maps.rs. Every struct is padding-free on purpose
// (checked by _Static_assert here and by const assertions in Rust), so the byte images match.
// Addresses are 16 bytes: IPv6 as is, IPv4 as the v4-mapped ::ffff:a.b.c.d (RFC 4291 2.5.5.2).
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

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_ntohs(x) __builtin_bswap16(x)
#else
#define bpf_htons(x) (x)
#define bpf_ntohs(x) (x)
#endif

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define IPPROTO_SCTP_ 132
#define IPV6_NEXTHDR_FRAGMENT 44
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

/* ---- shared layouts (keep in sync with src/maps.rs) ---- */

/* Key of `services`: 20 bytes, no padding. */
struct service_key {
	__u8 addr[16];  /* dst address, v4-mapped for IPv4 */
	__be16 port;    /* dst port, network byte order */
	__u8 proto;     /* IPPROTO_TCP (6), IPPROTO_UDP (17) or IPPROTO_SCTP (132) */
	__u8 pad;       /* always 0 */
};
_Static_assert(sizeof(struct service_key) == 20, "service_key must be 20 bytes, no padding");

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

/* Indexes of `stats`. Every frame increments exactly one of them. */
enum {
	STAT_REDIRECTED = 0,      /* handed to bpf_redirect_map and a socket was in the slot */
	STAT_PASSED = 1,          /* not ours: XDP_PASS */
	STAT_REDIRECT_FAILED = 2, /* ours, but no socket in xsks[rx_queue_index]: XDP_DROP */
	STAT_PARSE_ERROR = 3,     /* truncated or malformed headers: XDP_PASS */
	STAT_MAX = 4,
};

/* ---- maps ---- */

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

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
 * ours) must reach xlb to be translated back to the VIP. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct service_key);
	__type(value, __u32);
} endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct addr_key);
	__type(value, struct snat_range);
} snat_addrs SEC(".maps");

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

static __always_inline int port_in_snat_range(const struct addr_key *dst, __be16 port_be)
{
	struct snat_range *r = bpf_map_lookup_elem(&snat_addrs, (void *)dst);
	if (!r)
		return 0;
	__u16 port = bpf_ntohs(port_be);
	return port >= r->port_min && port <= r->port_max;
}

/* TCP, UDP and SCTP all start with src port, dst port (16 bits each). */
static __always_inline int is_port_proto(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP_;
}

/*
 * Decide for a TCP/UDP/SCTP header at `l4` (4 bytes already bounds-checked by the caller).
 */
static __always_inline int ports_verdict(struct xdp_md *ctx, const struct addr_key *src,
					 const struct addr_key *dst, __u8 proto, const __be16 *ports)
{
	struct service_key sk = {};
	__builtin_memcpy(sk.addr, dst->addr, 16);
	sk.port = ports[1];
	sk.proto = proto;
	if (bpf_map_lookup_elem(&services, &sk))
		return steer(ctx);
	if (port_in_snat_range(dst, ports[1]))
		return steer(ctx);
	struct service_key ek = {};
	__builtin_memcpy(ek.addr, src->addr, 16);
	ek.port = ports[0];
	ek.proto = proto;
	if (bpf_map_lookup_elem(&endpoints, &ek))
		return steer(ctx);
	return pass();
}

/*
 * ICMP error whose quoted packet starts at `inner` (after the 8-byte ICMP header).
 * `outer_dst` is the address the error is sent to.
 */
static __always_inline int icmp_error_verdict(struct xdp_md *ctx, void *inner, void *end,
					      const struct addr_key *outer_dst, int v6)
{
	if (bpf_map_lookup_elem(&vip_addrs, (void *)outer_dst))
		return steer(ctx);

	/* Otherwise ours only if the quoted packet left from a service address:port (e.g. a
	 * NodePort reply from a node address) or from a SNAT address:port in its range. */
	__u8 proto;
	__be16 *ports;
	if (!v6) {
		struct iphdr *iph = inner;
		if ((void *)(iph + 1) > end)
			return parse_error();
		__u32 ihl = iph->ihl;
		if (ihl < 5)
			return parse_error();
		ports = (void *)iph + ihl * 4;
		proto = iph->protocol;
	} else {
		struct ipv6hdr *ip6 = inner;
		if ((void *)(ip6 + 1) > end)
			return parse_error();
		ports = (void *)(ip6 + 1);
		proto = ip6->nexthdr;
	}
	if (!is_port_proto(proto))
		return pass();
	if ((void *)(ports + 2) > end)
		return parse_error();
	/* The quoted packet's source is the error's destination: outer_dst and ports[0]. */
	struct service_key sk = {};
	__builtin_memcpy(sk.addr, outer_dst->addr, 16);
	sk.port = ports[0];
	sk.proto = proto;
	if (bpf_map_lookup_elem(&services, &sk))
		return steer(ctx);
	if (port_in_snat_range(outer_dst, ports[0]))
		return steer(ctx);
	return pass();
}

static __always_inline int handle_ipv4(struct xdp_md *ctx, void *l3, void *end)
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

	struct addr_key dst, src;
	v4_mapped(dst.addr, iph->daddr);
	v4_mapped(src.addr, iph->saddr);

	if (iph->frag_off & bpf_htons(IP_OFFSET_MASK)) {
		/* Non-first fragment: no L4 header. Ours only if the address is a VIP. */
		if (bpf_map_lookup_elem(&vip_addrs, &dst))
			return steer(ctx);
		return pass();
	}

	__u8 proto = iph->protocol;
	if (is_port_proto(proto)) {
		__be16 *ports = l4;
		if ((void *)(ports + 2) > end)
			return parse_error();
		return ports_verdict(ctx, &src, &dst, proto, ports);
	}
	if (proto == IPPROTO_ICMP) {
		struct icmp_hdr *icmp = l4;
		if ((void *)(icmp + 1) > end)
			return parse_error();
		__u8 t = icmp->type;
		if (t == ICMP_DEST_UNREACH || t == ICMP_TIME_EXCEEDED || t == ICMP_PARAMETERPROB)
			return icmp_error_verdict(ctx, (void *)(icmp + 1), end, &dst, 0);
	}
	return pass();
}

static __always_inline int handle_ipv6(struct xdp_md *ctx, void *l3, void *end)
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
	if (proto == IPV6_NEXTHDR_FRAGMENT) {
		/* Any fragment (first or not) to a VIP goes to xlb, which reassembles or drops. */
		if ((void *)((__u8 *)l4 + 8) > end)
			return parse_error();
		if (bpf_map_lookup_elem(&vip_addrs, &dst))
			return steer(ctx);
		return pass();
	}
	if (is_port_proto(proto)) {
		__be16 *ports = l4;
		if ((void *)(ports + 2) > end)
			return parse_error();
		return ports_verdict(ctx, &src, &dst, proto, ports);
	}
	if (proto == IPPROTO_ICMPV6) {
		struct icmp_hdr *icmp = l4;
		if ((void *)(icmp + 1) > end)
			return parse_error();
		__u8 t = icmp->type;
		/* 1 dest unreachable, 2 packet too big, 3 time exceeded, 4 parameter problem */
		if (t >= ICMPV6_DEST_UNREACH && t <= ICMPV6_PARAMPROB)
			return icmp_error_verdict(ctx, (void *)(icmp + 1), end, &dst, 1);
	}
	return pass();
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

	/* One optional 802.1Q / 802.1ad tag: TCI then the encapsulated EtherType. */
	if (h_proto == bpf_htons(ETH_P_8021Q_) || h_proto == bpf_htons(ETH_P_8021AD_)) {
		__be16 *vlan = l3;
		if ((void *)(vlan + 2) > end)
			return parse_error();
		h_proto = vlan[1];
		l3 = (void *)(vlan + 2);
	}

	if (h_proto == bpf_htons(ETH_P_IP))
		return handle_ipv4(ctx, l3, end);
	if (h_proto == bpf_htons(ETH_P_IPV6))
		return handle_ipv6(ctx, l3, end);
	return pass(); /* ARP, LLDP, ... */
}

char _license[] SEC("license") = "Apache-2.0";
