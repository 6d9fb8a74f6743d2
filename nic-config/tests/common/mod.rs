//! Test fixtures: private network namespaces joined by a veth pair.
//!
//! Each fixture makes its own namespaces named `xlbnic-<pid>-<n>` (`xlb_testkit::Netns`) and
//! deletes them when dropped (also when the test panics). Code runs inside a namespace on a dedicated thread that joins it
//! with setns(2); the root namespace's interfaces are never touched. Addresses used exist only
//! inside these namespaces.

#![allow(dead_code, reason = "each test binary uses a different part of the fixtures")]
#![allow(unreachable_pub, reason = "test helper module")]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub mod xsk;

#[allow(unused_imports, reason = "each test binary uses a different part of the fixtures")]
pub use xlb_testkit::{Netns, run, sh, wait_until as wait_for};

/// True when the tests can create namespaces and load XDP programs. Prints why not otherwise.
pub fn can_run(test: &str) -> bool {
    if xlb_testkit::skip_without_root(test) {
        return false;
    }
    if !xlb_testkit::have_tool("ip", "-V") {
        eprintln!("SKIP {test}: `ip` (iproute2) is missing: run scripts/install-deps.sh");
        return false;
    }
    true
}

/// The node under test ("lb", interface `lb0`) and a client (`cl0`), joined by a veth pair.
///
/// Addresses: lb0 10.251.1.1/24 + fd00:251:1::1/64, cl0 10.251.1.2/24 + fd00:251:1::2/64.
/// The VIPs 10.251.9.9 and fd00:251:9::9 sit on the lb namespace's `lo`, so the kernel there
/// answers for them whenever the steering program passes a frame; the client routes them via
/// lb0.
#[derive(Debug)]
pub struct Pair {
    pub lb: Netns,
    pub client: Netns,
    pub lb_mac: [u8; 6],
    pub client_mac: [u8; 6],
}

pub const LB_IF: &str = "lb0";
pub const CLIENT_IF: &str = "cl0";
pub const LB_V4: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 1);
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 2);
pub const VIP_V4: Ipv4Addr = Ipv4Addr::new(10, 251, 9, 9);
pub const LB_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x251, 1, 0, 0, 0, 0, 1);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x251, 1, 0, 0, 0, 0, 2);
pub const VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x251, 9, 0, 0, 0, 0, 9);

impl Pair {
    /// Creates the pair with `queues` RX and TX queues per end.
    pub fn new(queues: u32) -> Self {
        let lb = Netns::new("xlbnic");
        let client = Netns::new("xlbnic");
        let q = queues.to_string();
        sh(&[
            "ip",
            "link",
            "add",
            LB_IF,
            "netns",
            lb.name(),
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            CLIENT_IF,
            "netns",
            client.name(),
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ]);
        lb.ip(&["addr", "add", "10.251.1.1/24", "dev", LB_IF]);
        lb.ip(&["addr", "add", "fd00:251:1::1/64", "dev", LB_IF, "nodad"]);
        lb.ip(&["addr", "add", "10.251.9.9/32", "dev", "lo"]);
        lb.ip(&["addr", "add", "fd00:251:9::9/128", "dev", "lo"]);
        client.ip(&["addr", "add", "10.251.1.2/24", "dev", CLIENT_IF]);
        client.ip(&["addr", "add", "fd00:251:1::2/64", "dev", CLIENT_IF, "nodad"]);
        lb.ip(&["link", "set", LB_IF, "up"]);
        client.ip(&["link", "set", CLIENT_IF, "up"]);
        client.ip(&["route", "add", "10.251.9.9/32", "via", "10.251.1.1"]);
        client.ip(&["-6", "route", "add", "fd00:251:9::9/128", "via", "fd00:251:1::1"]);
        let lb_mac = mac_of(&lb, LB_IF);
        let client_mac = mac_of(&client, CLIENT_IF);
        Self { lb, client, lb_mac, client_mac }
    }
}

/// MAC of `ifname` in `ns`, read with `ip -br link`.
pub fn mac_of(ns: &Netns, ifname: &str) -> [u8; 6] {
    let out = ns.ip(&["-br", "link", "show", "dev", ifname]);
    let mac = out.split_whitespace().nth(2).expect("ip -br link prints the MAC third");
    let mut b = [0u8; 6];
    for (i, part) in mac.split(':').enumerate() {
        b[i] = u8::from_str_radix(part, 16).expect("hex MAC");
    }
    b
}

/// A decoded frame seen on the AF_XDP socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IPv4 protocol or IPv6 next header.
    pub proto: u8,
    /// TCP/UDP destination port, or ICMP type for ICMP, or 0 for non-first fragments.
    pub port_or_type: u16,
    /// IPv4 fragment offset in 8-byte units, or IPv6 fragment header present (1).
    pub fragment: u16,
    pub len: usize,
}

/// Minimal Ethernet/IPv4/IPv6 decoder for assertions (not the dataplane's parser).
pub fn decode(frame: &[u8]) -> Option<Seen> {
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let l3 = &frame[14..];
    match ethertype {
        0x0800 => {
            let ihl = usize::from(l3[0] & 0x0f) * 4;
            let frag = u16::from_be_bytes([l3[6], l3[7]]) & 0x1fff;
            let proto = l3[9];
            let src = IpAddr::V4(Ipv4Addr::new(l3[12], l3[13], l3[14], l3[15]));
            let dst = IpAddr::V4(Ipv4Addr::new(l3[16], l3[17], l3[18], l3[19]));
            let l4 = &l3[ihl..];
            let port_or_type = if frag != 0 {
                0
            } else if proto == 1 {
                u16::from(l4[0])
            } else {
                u16::from_be_bytes([l4[2], l4[3]])
            };
            Some(Seen { src, dst, proto, port_or_type, fragment: frag, len: frame.len() })
        }
        0x86dd => {
            let mut proto = l3[6];
            let src = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&l3[8..24]).ok()?));
            let dst = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&l3[24..40]).ok()?));
            let mut l4 = &l3[40..];
            let mut fragment = 0;
            if proto == 44 {
                fragment = 1;
                proto = l4[0];
                l4 = &l4[8..];
            }
            let port_or_type = if proto == 58 { u16::from(l4[0]) } else { u16::from_be_bytes([l4[2], l4[3]]) };
            Some(Seen { src, dst, proto, port_or_type, fragment, len: frame.len() })
        }
        _ => None,
    }
}
