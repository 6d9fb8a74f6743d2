//! The steering XDP program on a real veth pair in private network namespaces.
//! Needs root; without it each test prints why and returns.

mod common;

use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    process::Command,
    time::Duration,
};

use common::{CLIENT_V4, CLIENT_V6, LB_IF, LB_V4, LB_V6, Netns, Pair, VIP_V4, VIP_V6, decode, run, wait_for, xsk::Xsk};
use nic_config::{
    IPPROTO_TCP, IPPROTO_UDP, ServiceKey, Steering, XdpMode, endpoints4_index_home, endpoints6_index_home,
    interface_info, l2_filter_bit, services4_index_home, services6_index_home, snat4_index_home, snat6_index_home,
};

const SHORT: Duration = Duration::from_millis(400);
const LONG: Duration = Duration::from_secs(3);

fn bpftool_present() -> bool {
    Command::new("bpftool").arg("version").output().is_ok_and(|o| o.status.success())
}

/// Whether the kernel still has a BPF object of ours: `bpftool prog|map show id N` when bpftool
/// is installed, otherwise aya's enumeration of loaded programs/maps.
fn bpf_object_exists(kind: &str, id: u32) -> bool {
    if bpftool_present() {
        return run(&["bpftool", kind, "show", "id", &id.to_string()]).status.success();
    }
    match kind {
        "prog" => aya::programs::loaded_programs().flatten().any(|p| p.id() == id),
        _ => aya::maps::loaded_maps().flatten().any(|m| m.id() == id),
    }
}

/// Sends one UDP datagram from the client namespace.
fn client_send_udp(client: &Netns, to: SocketAddr, payload: &[u8]) {
    client.run_in(|| {
        let bind: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
        let s = UdpSocket::bind(bind).expect("client UDP socket");
        s.send_to(payload, to).expect("client send");
    });
}

/// Sends one UDP datagram from the client namespace, from source port `from_port`.
fn client_send_udp_from(client: &Netns, from_port: u16, to: SocketAddr, payload: &[u8]) {
    client.run_in(|| {
        let ip: IpAddr = if to.is_ipv4() { CLIENT_V4.into() } else { CLIENT_V6.into() };
        let s = UdpSocket::bind(SocketAddr::new(ip, from_port)).expect("client UDP socket");
        s.send_to(payload, to).expect("client send");
    });
}

/// A UDP socket in the lb namespace bound to `addr`.
fn lb_udp(lb: &Netns, addr: SocketAddr) -> UdpSocket {
    lb.run_in(|| {
        let s = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        s.set_read_timeout(Some(SHORT)).unwrap();
        s
    })
}

fn kernel_got(sock: &UdpSocket) -> Option<Vec<u8>> {
    let mut buf = [0u8; 2048];
    sock.recv_from(&mut buf).ok().map(|(n, _)| buf[..n].to_vec())
}

/// The first eleven of `candidates` whose home slot in a slot index (`home`,
/// nic-config/src/index.rs) is the first candidate's: ten to list, of which the window of 8
/// slots holds eight and leaves two to the hash map, and one not to list.
fn eleven_of_one_home<K>(mut candidates: impl Iterator<Item = K>, home: impl Fn(&K) -> u32) -> Vec<K> {
    let first = candidates.next().expect("a candidate");
    let h = home(&first);
    let same: Vec<K> = std::iter::once(first).chain(candidates.filter(|k| home(k) == h)).take(11).collect();
    assert_eq!(same.len(), 11, "eleven candidates of one home slot");
    same
}

/// The client pings the lb's IPv6 address (neighbour discovery passes the program): the
/// client's neighbour entry for it is made before a test's own IPv6 frames.
fn ping6_lb(pair: &Pair) {
    let ping = pair.client.exec(&["ping", "-6", "-c", "1", "-W", "2", &LB_V6.to_string()]);
    assert!(ping.status.success(), "ping -6: {}", String::from_utf8_lossy(&ping.stdout));
}

/// Lists the client, in both families, as a NAT backend replying from UDP port 5353: a DNAT
/// reply's destination is the client, so only its source marks it as xlb's.
fn list_client_as_backend(steering: &mut Steering) {
    let ep = |addr: IpAddr| ServiceKey { addr, proto: IPPROTO_UDP, port: 5353 };
    steering.sync_endpoints(&[ep(CLIENT_V4.into()), ep(CLIENT_V6.into())]).unwrap();
}

/// Attaches the program to lb0 and binds an AF_XDP socket on queue 0 into `xsks`.
fn attach_with_xsk(pair: &Pair) -> (Steering, Xsk) {
    pair.lb.run_in(|| {
        let mut steering = Steering::attach(LB_IF, XdpMode::Native).expect("attach");
        assert_eq!(steering.mode(), XdpMode::Native, "veth supports native XDP");
        let xsk = Xsk::bind(LB_IF, 0);
        steering.set_xsk(0, xsk.fd()).expect("set_xsk");
        (steering, xsk)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_attaches_to_a_veth_and_detach_leaves_nothing_behind() {
        if !common::can_run("program_attaches_to_a_veth_and_detach_leaves_nothing_behind") {
            return;
        }
        let pair = Pair::new(1);
        for explicit_detach in [true, false] {
            let steering = pair.lb.run_in(|| Steering::attach(LB_IF, XdpMode::Native).expect("attach"));
            let prog_id = steering.prog_id();
            let map_ids = steering.map_ids().to_vec();
            assert_eq!(
                map_ids.len(),
                19,
                "xsks, services4, services4_index, services, vip_addrs, snat4, snat4_index, snat_addrs, endpoints4, endpoints4_index, endpoints, services6_index, snat6_index, endpoints6_index, endpoint_addr_filter, stats, l2_filter, l2_addrs, l2_self"
            );

            let info = pair.lb.run_in(|| interface_info(LB_IF).unwrap());
            assert_eq!(info.xdp_prog_id, Some(prog_id), "rtnetlink shows our program on lb0");
            let link = pair.lb.ip(&["-d", "link", "show", "dev", LB_IF]);
            assert!(link.contains(&format!("prog/xdp id {prog_id}")), "ip -d link: {link}");
            assert!(bpf_object_exists("prog", prog_id));
            if bpftool_present() {
                let show = common::sh(&["bpftool", "prog", "show", "id", &prog_id.to_string()]);
                assert!(show.contains("xdp") && show.contains("xlb_steer"), "bpftool: {show}");
            }
            for id in &map_ids {
                assert!(bpf_object_exists("map", *id), "map {id} exists while attached");
            }

            if explicit_detach {
                steering.detach().expect("detach");
            } else {
                drop(steering);
            }

            let link = pair.lb.ip(&["-d", "link", "show", "dev", LB_IF]);
            assert!(!link.contains("xdp"), "no XDP left on lb0: {link}");
            assert_eq!(pair.lb.run_in(|| interface_info(LB_IF).unwrap()).xdp_prog_id, None);
            // The kernel frees programs and maps after an RCU grace period: poll briefly.
            wait_for(LONG, "the program to be freed", || (!bpf_object_exists("prog", prog_id)).then_some(()));
            for id in map_ids {
                wait_for(LONG, "the maps to be freed", || (!bpf_object_exists("map", id)).then_some(()));
            }
        }
    }

    #[test]
    fn native_attach_falls_back_to_skb_mode_where_the_driver_lacks_it() {
        if !common::can_run("native_attach_falls_back_to_skb_mode_where_the_driver_lacks_it") {
            return;
        }
        // The loopback driver has no native XDP (no ndo_bpf), only generic.
        let ns = Netns::new("xlbnic");
        let steering = ns.run_in(|| Steering::attach("lo", XdpMode::Native).expect("attach"));
        assert_eq!(steering.mode(), XdpMode::Skb);
        let link = ns.ip(&["-d", "link", "show", "dev", "lo"]);
        assert!(link.contains("xdpgeneric"), "generic XDP on lo: {link}");
        steering.detach().unwrap();
        let link = ns.ip(&["-d", "link", "show", "dev", "lo"]);
        assert!(!link.contains("xdp"), "{link}");
    }

    #[test]
    fn attaching_to_an_unknown_interface_names_it() {
        if !common::can_run("attaching_to_an_unknown_interface_names_it") {
            return;
        }
        let ns = Netns::new("xlbnic");
        let err = ns.run_in(|| Steering::attach("nosuch0", XdpMode::Native)).unwrap_err();
        assert!(err.to_string().contains("nosuch0"), "{err}");
    }

    #[test]
    fn frame_to_a_listed_vip_port_reaches_the_xsk_while_ping_to_the_node_is_answered() {
        if !common::can_run("frame_to_a_listed_vip_port_reaches_the_xsk_while_ping_to_the_node_is_answered") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        let svc = ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_UDP, port: 7777 };
        steering.sync_services(&[svc]).unwrap();
        steering.sync_vip_addrs(&[VIP_V4.into()]).unwrap();
        let kernel_listed = lb_udp(&pair.lb, SocketAddr::new(VIP_V4.into(), 7777));

        // Ping to the node's own address: ARP and ICMP echo pass to the kernel, which answers.
        let ping = pair.client.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", &LB_V4.to_string()]);
        assert!(ping.status.success(), "ping: {}", String::from_utf8_lossy(&ping.stdout));

        client_send_udp(&pair.client, SocketAddr::new(VIP_V4.into(), 7777), b"to-the-xsk");
        let frames = xsk.recv_until(1, LONG);
        let seen: Vec<_> = frames.iter().filter_map(|f| decode(f)).collect();
        let hit = seen
            .iter()
            .find(|s| s.dst == IpAddr::from(VIP_V4) && s.proto == IPPROTO_UDP && s.port_or_type == 7777)
            .unwrap_or_else(|| panic!("UDP to VIP:7777 on the XSK; saw {seen:?}"));
        assert_eq!(hit.src, IpAddr::from(CLIENT_V4));
        assert!(frames.iter().any(|f| f.ends_with(b"to-the-xsk")), "payload intact");
        assert_eq!(kernel_got(&kernel_listed), None, "a redirected frame never reaches the kernel");
        // The echo requests were passed, not redirected.
        assert!(seen.iter().all(|s| s.proto != 1), "no ICMP echo on the XSK: {seen:?}");

        let st = steering.stats().unwrap();
        assert!(st.redirected >= 1, "{st:?}");
        assert!(st.passed >= 3, "ARP request + 2 echo requests passed: {st:?}");
        assert_eq!(st.redirect_failed, 0, "{st:?}");

        // Once the service is gone from the map, the same frame goes to the kernel.
        steering.sync_services(&[]).unwrap();
        client_send_udp(&pair.client, SocketAddr::new(VIP_V4.into(), 7777), b"now-kernel");
        assert_eq!(kernel_got(&kernel_listed).as_deref(), Some(&b"now-kernel"[..]));
        assert!(xsk.recv(SHORT).is_empty());

        // No socket in the slot (a hand-over's gap): the frame is dropped and counted, never
        // given to the kernel, which would forward it untranslated.
        steering.sync_services(&[svc]).unwrap();
        steering.clear_xsk(0).unwrap();
        steering.clear_xsk(0).expect("clearing an empty slot is fine");
        client_send_udp(&pair.client, SocketAddr::new(VIP_V4.into(), 7777), b"no-socket");
        assert_eq!(kernel_got(&kernel_listed), None, "an xlb frame without a socket never reaches the kernel");
        assert!(steering.stats().unwrap().redirect_failed >= 1);
        steering.detach().unwrap();
    }

    /// A service index's full window, for either family: `same` holds eleven services of one
    /// home slot ([`eleven_of_one_home`]), routed to the lb; `overflow` counts the services the
    /// index leaves to its hash map. Ten are listed: two of them wait in the hash map, frames
    /// to each of the ten reach the XSK, and a frame to the eleventh passes (a full window,
    /// then the hash map's miss); once they leave, nothing is steered or waits.
    fn services_full_window(
        pair: &Pair,
        steering: &mut Steering,
        xsk: &mut Xsk,
        same: &[ServiceKey],
        overflow: impl Fn(&Steering) -> usize,
    ) {
        let (listed, unlisted) = same.split_at(10);
        steering.sync_services(listed).unwrap();
        assert_eq!(overflow(steering), 2, "a window of 8 slots for 10 keys");
        for k in listed {
            client_send_udp(&pair.client, SocketAddr::new(k.addr, k.port), b"listed");
            let seen: Vec<_> = xsk.recv_until(1, LONG).iter().filter_map(|f| decode(f)).collect();
            assert!(seen.iter().any(|s| s.dst == k.addr && s.port_or_type == k.port), "{k:?} on the XSK; saw {seen:?}");
        }
        let passed = steering.stats().unwrap().passed;
        client_send_udp(&pair.client, SocketAddr::new(unlisted[0].addr, unlisted[0].port), b"unlisted");
        assert!(xsk.recv(SHORT).is_empty(), "an unlisted service of the full window passes");
        assert!(steering.stats().unwrap().passed > passed);
        // Taking the services away leaves nothing steered and nothing to the hash map.
        steering.sync_services(&[]).unwrap();
        assert_eq!(overflow(steering), 0);
        client_send_udp(&pair.client, SocketAddr::new(listed[9].addr, listed[9].port), b"gone");
        assert!(xsk.recv(SHORT).is_empty());
    }

    /// `services4_index` (nic-config/src/index.rs): ten services with one home slot, so that
    /// eight fill its window and the index leaves two to the `services4` hash map
    /// ([`services_full_window`]).
    #[test]
    fn services_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk() {
        if !common::can_run("services_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk") {
            return;
        }
        let pair = Pair::new(1);
        pair.client.ip(&["route", "add", "10.192.0.0/11", "via", &LB_V4.to_string()]);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        let svc = |i: u32, port| ServiceKey {
            addr: IpAddr::from(std::net::Ipv4Addr::from(0x0ac8_0000 + i)),
            proto: IPPROTO_UDP,
            port,
        };
        // (The address's last two octets move the home in steps too regular for eleven in one
        // /16; the second octet too.)
        let same = eleven_of_one_home((1..0x10_0000).map(|i| svc(i, 5000)), |k| services4_index_home(k).unwrap());
        services_full_window(&pair, &mut steering, &mut xsk, &same, |s| s.services4_overflow().len());
        steering.detach().unwrap();
    }

    /// A NAT backend index's full window, for either family: `same` holds eleven backends
    /// (address, UDP, port) of one home slot, whose addresses the client has on its interface
    /// and the lb routes back to it; `overflow` counts the backends the index leaves to its
    /// hash map. Ten are listed, two of them waiting in the hash map; the client plays each,
    /// sending to `to` (the lb's address): every listed one's frames reach the XSK and none
    /// the kernel, the eleventh's reach the kernel; once they leave, so do the tenth's.
    fn backends_full_window(
        pair: &Pair,
        steering: &mut Steering,
        xsk: &mut Xsk,
        same: &[ServiceKey],
        to: SocketAddr,
        overflow: impl Fn(&Steering) -> usize,
    ) {
        let (listed, unlisted) = same.split_at(10);
        steering.sync_endpoints(listed).unwrap();
        assert_eq!(overflow(steering), 2, "a window of 8 slots for 10 keys");
        let kernel = lb_udp(&pair.lb, to);
        let send_from = |k: &ServiceKey, payload: &[u8]| {
            pair.client.run_in(|| {
                let s = UdpSocket::bind(SocketAddr::new(k.addr, k.port)).expect("bind the backend's address");
                s.send_to(payload, to).expect("send");
            });
        };
        for k in listed {
            send_from(k, b"reply");
            let seen: Vec<_> = xsk.recv_until(1, LONG).iter().filter_map(|f| decode(f)).collect();
            assert!(
                seen.iter().any(|s| s.src == k.addr && s.port_or_type == to.port()),
                "{k:?} on the XSK; saw {seen:?}"
            );
        }
        assert_eq!(kernel_got(&kernel), None, "the backends' frames never reach the kernel");
        send_from(&unlisted[0], b"unlisted");
        assert_eq!(kernel_got(&kernel).as_deref(), Some(&b"unlisted"[..]));
        steering.sync_endpoints(&[]).unwrap();
        assert_eq!(overflow(steering), 0);
        send_from(&listed[9], b"gone");
        assert_eq!(kernel_got(&kernel).as_deref(), Some(&b"gone"[..]));
    }

    /// `endpoints4_index`: ten NAT backends (address, UDP, port) of one home slot, two of
    /// them left to the `endpoints4` hash map ([`backends_full_window`]).
    #[test]
    fn backends_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk() {
        if !common::can_run("backends_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        let ep = |i: u32, port| ServiceKey {
            addr: IpAddr::from(std::net::Ipv4Addr::from(0x0ac8_0000 + i)),
            proto: IPPROTO_UDP,
            port,
        };
        // 2^19 slots: over 10.200.0.0-10.215.255.255 a home holds about 2 addresses of one
        // port, so the ports vary too.
        let same = eleven_of_one_home((5353..5369).flat_map(|port| (1..0x10_0000).map(move |i| ep(i, port))), |k| {
            endpoints4_index_home(k).unwrap()
        });
        let mut addrs: Vec<IpAddr> = same.iter().map(|k| k.addr).collect();
        addrs.sort();
        addrs.dedup();
        for a in addrs {
            pair.client.ip(&["addr", "add", &format!("{a}/32"), "dev", common::CLIENT_IF]);
        }
        // The way back, so that the lb's kernel takes the frames that pass (reverse path filter).
        pair.lb.ip(&["route", "add", "10.192.0.0/11", "via", &CLIENT_V4.to_string()]);
        let to = SocketAddr::new(LB_V4.into(), 40_600);
        backends_full_window(&pair, &mut steering, &mut xsk, &same, to, |s| s.endpoints4_overflow().len());
        steering.detach().unwrap();
    }

    /// A SNAT index's full window, for either family: `same` holds eleven addresses of one
    /// home slot ([`eleven_of_one_home`]), `overflow` counts the addresses the index leaves to
    /// its hash map. Ten are listed with ports 33000-33999: frames to each inside the range
    /// reach the XSK and outside it pass, two of the ten wait in the hash map, and a frame to
    /// the eleventh passes; every range then moves to 40000-40999 and the old ports pass; the
    /// addresses then leave, and nothing waits in the hash map.
    fn snat_full_window(
        pair: &Pair,
        steering: &mut Steering,
        xsk: &mut Xsk,
        same: &[IpAddr],
        overflow: impl Fn(&Steering) -> usize,
    ) {
        let (listed, unlisted) = same.split_at(10);
        let ranges: Vec<(IpAddr, u16, u16)> = listed.iter().map(|a| (*a, 33_000, 33_999)).collect();
        steering.sync_snat(&ranges).unwrap();
        assert_eq!(overflow(steering), 2, "a window of 8 slots for 10 addresses");
        let steered = |xsk: &mut Xsk, a: IpAddr, port: u16| {
            client_send_udp(&pair.client, SocketAddr::new(a, port), b"snat");
            let seen: Vec<_> = xsk.recv_until(1, SHORT).iter().filter_map(|f| decode(f)).collect();
            seen.iter().any(|s| s.dst == a && s.port_or_type == port)
        };
        for a in listed {
            assert!(steered(xsk, *a, 33_500), "[{a}]:33500 on the XSK");
            assert!(!steered(xsk, *a, 34_000), "[{a}]:34000 is outside the range");
        }
        assert!(!steered(xsk, unlisted[0], 33_500), "an unlisted address of the full window");
        // Every range moves: the old ports pass, the new ones are xlb's.
        let moved: Vec<(IpAddr, u16, u16)> = listed.iter().map(|a| (*a, 40_000, 40_999)).collect();
        steering.sync_snat(&moved).unwrap();
        for a in listed {
            assert!(steered(xsk, *a, 40_500), "[{a}]:40500 after the change");
            assert!(!steered(xsk, *a, 33_500), "[{a}]:33500 after the change");
        }
        steering.sync_snat(&[]).unwrap();
        assert_eq!(overflow(steering), 0);
        assert!(!steered(xsk, listed[9], 40_500));
    }

    /// `snat4_index`: ten SNAT addresses of one home slot, two of them left to the `snat4`
    /// hash map ([`snat_full_window`]); addresses that cannot be a source are refused.
    #[test]
    fn snat_addresses_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk() {
        if !common::can_run("snat_addresses_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk") {
            return;
        }
        let pair = Pair::new(1);
        pair.client.ip(&["route", "add", "10.192.0.0/11", "via", &LB_V4.to_string()]);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        let addr = |i: u32| std::net::Ipv4Addr::from(0x0ac8_0000 + i);
        let same = eleven_of_one_home((1..0x10_0000).map(addr), |a| snat4_index_home(*a));
        let same: Vec<IpAddr> = same.into_iter().map(IpAddr::from).collect();
        snat_full_window(&pair, &mut steering, &mut xsk, &same, |s| s.snat4_overflow().len());
        // Addresses that cannot be a source are refused, naming the field.
        let err = steering.sync_snat(&[(IpAddr::from([0, 0, 0, 0]), 1, 2)]).unwrap_err();
        assert!(err.to_string().contains("SNAT address"), "{err}");
        assert!(steering.sync_snat(&[(IpAddr::from([255, 255, 255, 255]), 1, 2)]).is_err());
        steering.detach().unwrap();
    }

    /// `snat6_index`: ten IPv6 SNAT addresses of one home slot, two of them left to the
    /// `snat_addrs` hash map ([`snat_full_window`]).
    #[test]
    fn ipv6_snat_addresses_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk() {
        if !common::can_run("ipv6_snat_addresses_left_to_the_hash_map_by_a_full_index_window_still_reach_the_xsk") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        ping6_lb(&pair);
        pair.client.ip(&["-6", "route", "add", "fd00:251:c::/64", "via", &LB_V6.to_string()]);
        let addr = |i: u32| std::net::Ipv6Addr::new(0xfd00, 0x251, 0xc, 0, 0, 0, (i >> 16) as u16, i as u16);
        let same = eleven_of_one_home((1..0x10_0000).map(addr), |a| snat6_index_home(*a));
        let same: Vec<IpAddr> = same.into_iter().map(IpAddr::from).collect();
        snat_full_window(&pair, &mut steering, &mut xsk, &same, |s| s.snat6_overflow().len());
        steering.detach().unwrap();
    }

    /// What a crashed xlb leaves: its program stays attached (netlink attach) and, once its
    /// socket is closed, drops frames that are xlb's while ping to the node passes; a plain
    /// second attach is refused, and `attach_replacing_leftover` swaps it for the new one.
    #[test]
    fn a_program_left_by_a_dead_process_drops_xlb_frames_and_the_next_one_replaces_it() {
        if !common::can_run("a_program_left_by_a_dead_process_drops_xlb_frames_and_the_next_one_replaces_it") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, xsk) = attach_with_xsk(&pair);
        let svc = ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_UDP, port: 7777 };
        steering.sync_services(&[svc]).unwrap();
        steering.sync_vip_addrs(&[VIP_V4.into()]).unwrap();
        let old_id = steering.prog_id();
        // A process that dies runs no Drop: its program stays attached. (Forgetting it here
        // leaks its fds until the test process exits; the socket is closed for real.)
        std::mem::forget(steering);
        drop(xsk);
        let kernel = lb_udp(&pair.lb, SocketAddr::new(VIP_V4.into(), 7777));
        assert_eq!(pair.lb.run_in(|| interface_info(LB_IF).unwrap()).xdp_prog_id, Some(old_id));
        client_send_udp(&pair.client, SocketAddr::new(VIP_V4.into(), 7777), b"while-dead");
        assert_eq!(kernel_got(&kernel), None, "xlb's frames are dropped, not given to the kernel");
        let ping = pair.client.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", &LB_V4.to_string()]);
        assert!(ping.status.success(), "the node answers: {}", String::from_utf8_lossy(&ping.stdout));

        let mut next = pair.lb.run_in(|| Steering::load(LB_IF, XdpMode::Native).expect("load"));
        assert_eq!(pair.lb.run_in(|| next.leftover(None)).unwrap(), Some(old_id), "found by its name");
        assert_eq!(pair.lb.run_in(|| next.leftover(Some(old_id))).unwrap(), Some(old_id), "found by its recorded id");
        let refused = pair.lb.run_in(|| next.attach_loaded());
        assert!(refused.is_err(), "a plain attach does not replace a program");
        let replaced = pair.lb.run_in(|| next.attach_replacing_leftover(Some(old_id))).expect("replace");
        assert_eq!(replaced, Some(old_id));
        assert_eq!(pair.lb.run_in(|| interface_info(LB_IF).unwrap()).xdp_prog_id, Some(next.prog_id()));
        next.detach().unwrap();
        assert_eq!(pair.lb.run_in(|| interface_info(LB_IF).unwrap()).xdp_prog_id, None);
    }

    #[test]
    fn frame_to_a_vip_on_an_unlisted_port_passes_to_the_kernel() {
        if !common::can_run("frame_to_a_vip_on_an_unlisted_port_passes_to_the_kernel") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        steering
            .sync_services(&[
                ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_UDP, port: 7777 },
                // Same port, other protocol: must not match UDP.
                ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_TCP, port: 7778 },
            ])
            .unwrap();
        steering.sync_vip_addrs(&[VIP_V4.into()]).unwrap();
        let kernel = lb_udp(&pair.lb, SocketAddr::new(VIP_V4.into(), 7778));

        client_send_udp(&pair.client, SocketAddr::new(VIP_V4.into(), 7778), b"unlisted");
        assert_eq!(kernel_got(&kernel).as_deref(), Some(&b"unlisted"[..]), "the kernel got it");
        let frames = xsk.recv(SHORT);
        assert!(frames.iter().filter_map(|f| decode(f)).all(|s| s.proto != IPPROTO_UDP), "nothing UDP on the XSK");
        assert_eq!(steering.stats().unwrap().redirected, 0);
    }

    #[test]
    fn snat_replies_and_icmp_errors_about_them_are_redirected_and_the_rest_passes() {
        if !common::can_run("snat_replies_and_icmp_errors_about_them_are_redirected_and_the_rest_passes") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        steering.sync_snat(&[(LB_V4.into(), 40_000, 40_009)]).unwrap();
        let inside = lb_udp(&pair.lb, SocketAddr::new(LB_V4.into(), 40_009));
        let outside = lb_udp(&pair.lb, SocketAddr::new(LB_V4.into(), 40_010));

        client_send_udp(&pair.client, SocketAddr::new(LB_V4.into(), 40_009), b"reply");
        let seen: Vec<_> = xsk.recv_until(1, LONG).iter().filter_map(|f| decode(f)).collect();
        assert!(
            seen.iter().any(|s| s.dst == IpAddr::from(LB_V4) && s.port_or_type == 40_009),
            "SNAT reply on the XSK: {seen:?}"
        );
        assert_eq!(kernel_got(&inside), None);

        client_send_udp(&pair.client, SocketAddr::new(LB_V4.into(), 40_010), b"not-ours");
        assert_eq!(kernel_got(&outside).as_deref(), Some(&b"not-ours"[..]));

        // ICMP errors to the node address: ours only if the quoted packet left from a port in the
        // SNAT range or from a listed service port (NodePort style); the kernel keeps the rest.
        // The client's kernel answers each probe with "port unreachable".
        steering.sync_services(&[ServiceKey { addr: LB_V4.into(), proto: IPPROTO_UDP, port: 30_080 }]).unwrap();
        let (ours, theirs) = pair.lb.run_in(|| {
            let ours: Vec<_> = [40_005, 30_080]
                .into_iter()
                .map(|p| UdpSocket::bind(SocketAddr::new(LB_V4.into(), p)).unwrap())
                .collect();
            let theirs = UdpSocket::bind(SocketAddr::new(LB_V4.into(), 40_100)).unwrap();
            for s in ours.iter().chain([&theirs]) {
                s.connect(SocketAddr::new(CLIENT_V4.into(), 9)).unwrap();
                s.set_read_timeout(Some(LONG)).unwrap();
                s.send(b"probe").unwrap();
            }
            (ours, theirs)
        });
        let seen: Vec<_> = xsk.recv_until(2, LONG).iter().filter_map(|f| decode(f)).collect();
        let icmp: Vec<_> = seen.iter().filter(|s| s.proto == 1 && s.port_or_type == 3).collect();
        assert_eq!(icmp.len(), 2, "the errors about ports 40005 and 30080 on the XSK: {seen:?}");
        let mut buf = [0u8; 64];
        let err = theirs.recv(&mut buf).expect_err("the kernel got the other error");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        for s in &ours {
            s.set_read_timeout(Some(SHORT)).unwrap();
            let err = s.recv(&mut buf).expect_err("no error reaches the kernel socket");
            assert_ne!(err.kind(), std::io::ErrorKind::ConnectionRefused, "its error went to xlb");
        }
        steering.sync_services(&[]).unwrap();

        // Narrowing the range gives the port back to the kernel.
        steering.sync_snat(&[(LB_V4.into(), 40_000, 40_008)]).unwrap();
        client_send_udp(&pair.client, SocketAddr::new(LB_V4.into(), 40_009), b"kernel-again");
        assert_eq!(kernel_got(&inside).as_deref(), Some(&b"kernel-again"[..]));
    }

    #[test]
    fn icmp_errors_and_fragments_to_a_vip_reach_the_xsk() {
        if !common::can_run("icmp_errors_and_fragments_to_a_vip_reach_the_xsk") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        steering.sync_vip_addrs(&[VIP_V4.into()]).unwrap();

        // From the VIP to a closed port of the client: the client's kernel answers with an ICMP
        // port unreachable addressed to the VIP.
        pair.lb.run_in(|| {
            let s = UdpSocket::bind(SocketAddr::new(VIP_V4.into(), 5555)).unwrap();
            s.send_to(b"probe", SocketAddr::new(CLIENT_V4.into(), 9)).unwrap();
        });
        let seen: Vec<_> = xsk.recv_until(1, LONG).iter().filter_map(|f| decode(f)).collect();
        assert!(
            seen.iter().any(|s| s.dst == IpAddr::from(VIP_V4) && s.proto == 1 && s.port_or_type == 3),
            "ICMP destination unreachable to the VIP on the XSK: {seen:?}"
        );

        // A 3000-byte datagram to an unlisted port is fragmented: the first fragment (with the
        // ports) passes, the later ones (no ports, dst = VIP) go to the XSK.
        client_send_udp(&pair.client, SocketAddr::new(VIP_V4.into(), 7000), &[0xab; 3000]);
        let seen: Vec<_> = xsk.recv_until(2, LONG).iter().filter_map(|f| decode(f)).collect();
        let frags: Vec<_> = seen.iter().filter(|s| s.fragment != 0).collect();
        assert_eq!(frags.len(), 2, "two non-first fragments: {seen:?}");
        assert!(frags.iter().all(|s| s.dst == IpAddr::from(VIP_V4)));
        assert!(seen.iter().all(|s| s.fragment != 0 || s.proto != IPPROTO_UDP), "first fragment passed");
    }

    /// An echo request larger than the link, to a VIP: its first fragment passes to the kernel
    /// as an unfragmented one does (the VIP sits on the lb's `lo`, so the kernel answers), and
    /// so must the later ones, in both families, or the kernel never reassembles it.
    #[test]
    fn a_ping_larger_than_the_link_to_a_vip_is_answered_by_the_kernel() {
        if !common::can_run("a_ping_larger_than_the_link_to_a_vip_is_answered_by_the_kernel") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, _xsk) = attach_with_xsk(&pair);
        steering.sync_vip_addrs(&[VIP_V4.into(), VIP_V6.into()]).unwrap();
        for (family, vip) in [("-4", IpAddr::from(VIP_V4)), ("-6", IpAddr::from(VIP_V6))] {
            let ping = pair.client.exec(&["ping", family, "-c", "1", "-W", "2", "-s", "2000", &vip.to_string()]);
            assert!(
                ping.status.success(),
                "ping -s 2000 {vip}: {}{:?}",
                String::from_utf8_lossy(&ping.stdout),
                steering.stats().unwrap()
            );
        }
    }

    /// A Hop-by-Hop Options header (RFC 8200 4.3; a Router Alert, say) comes before the rest of
    /// an IPv6 packet's headers: a service's datagram and a later fragment to a VIP behind one
    /// reach the XSK as they do without it, and an unlisted port behind one passes.
    #[test]
    fn ipv6_frames_behind_a_hop_by_hop_header_are_steered_as_without_it() {
        if !common::can_run("ipv6_frames_behind_a_hop_by_hop_header_are_steered_as_without_it") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        steering.sync_services(&[ServiceKey { addr: VIP_V6.into(), proto: IPPROTO_UDP, port: 7777 }]).unwrap();
        steering.sync_vip_addrs(&[VIP_V6.into()]).unwrap();
        ping6_lb(&pair);
        // Next header 17 (UDP) or 44 (Fragment), length 0 (8 bytes), a PadN option of 4.
        let hbh = |next: u8| [next, 0, 1, 4, 0, 0, 0, 0];
        let udp = |port: u16| {
            let mut u = Vec::from(40_000u16.to_be_bytes());
            u.extend_from_slice(&port.to_be_bytes());
            u.extend_from_slice(&12u16.to_be_bytes());
            u.extend_from_slice(&[0, 0, b'h', b'b', b'h', b'!']);
            u
        };
        // Next header 17, offset 1,480 bytes (185 units), last fragment, identification 7.
        let later_fragment = [17, 0, 0x05, 0xc8, 0, 0, 0, 7].iter().copied().chain([0xab; 16]).collect::<Vec<u8>>();
        let cases: [(&str, Vec<u8>, bool); 3] = [
            ("UDP to the listed port", hbh(17).into_iter().chain(udp(7777)).collect(), true),
            ("a later fragment to the VIP", hbh(44).into_iter().chain(later_fragment).collect(), true),
            ("UDP to an unlisted port", hbh(17).into_iter().chain(udp(7778)).collect(), false),
        ];
        for (what, after_ip, ours) in cases {
            let before = steering.stats().unwrap();
            pair.client.run_in(|| send_raw_ipv6(CLIENT_V6, VIP_V6, 0, &after_ip));
            let seen: Vec<_> = xsk.recv(if ours { LONG } else { SHORT }).iter().filter_map(|f| decode(f)).collect();
            let after = steering.stats().unwrap();
            let on_xsk = seen.iter().filter(|s| s.dst == IpAddr::from(VIP_V6) && s.proto == 0).count();
            if ours {
                assert_eq!(on_xsk, 1, "{what} behind Hop-by-Hop on the XSK: {seen:?}");
                assert_eq!(after.redirected - before.redirected, 1, "{what}: {before:?} -> {after:?}");
            } else {
                assert_eq!(on_xsk, 0, "{what} behind Hop-by-Hop passed: {seen:?}");
                assert!(after.passed > before.passed, "{what}: {before:?} -> {after:?}");
            }
        }
    }

    /// Sends, from the calling thread's namespace, the IPv6 packet from `src` to `dst` whose
    /// first next header is `next` and whose headers after the IPv6 header are `rest`
    /// (`IPPROTO_RAW`: the header is ours, RFC 3542 3.5).
    fn send_raw_ipv6(src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr, next: u8, rest: &[u8]) {
        use nix::sys::socket::{
            AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn6, sendto, socket,
        };
        use std::os::fd::AsRawFd as _;
        let mut pkt = vec![0x60, 0, 0, 0];
        pkt.extend_from_slice(&u16::try_from(rest.len()).unwrap().to_be_bytes());
        pkt.extend_from_slice(&[next, 64]);
        pkt.extend_from_slice(&src.octets());
        pkt.extend_from_slice(&dst.octets());
        pkt.extend_from_slice(rest);
        let fd =
            socket(AddressFamily::Inet6, SockType::Raw, SockFlag::empty(), SockProtocol::Raw).expect("raw IPv6 socket");
        let to = SockaddrIn6::from(std::net::SocketAddrV6::new(dst, 0, 0, 0));
        sendto(fd.as_raw_fd(), &pkt, &to, MsgFlags::empty()).expect("send the IPv6 packet");
    }

    /// A NAT backend's reply too big for the link leaves it in fragments, and only the first
    /// carries the ports `endpoints4` / `endpoints` are keyed by: the later ones are steered by
    /// their source's bit in `endpoint_addr_filter`, in both families, and pass again once the
    /// backend is gone (the kernel then reassembles the datagram).
    #[test]
    fn every_fragment_of_a_listed_nat_backends_datagram_reaches_the_xsk_until_it_is_removed() {
        if !common::can_run("every_fragment_of_a_listed_nat_backends_datagram_reaches_the_xsk_until_it_is_removed") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        // The client plays the backend (the lb's address, its reply's destination, plays the
        // client).
        list_client_as_backend(&mut steering);
        ping6_lb(&pair);
        for lb in [IpAddr::from(LB_V4), IpAddr::from(LB_V6)] {
            let kernel = lb_udp(&pair.lb, SocketAddr::new(lb, 40_700));
            // 2,000 bytes over a 1,500-byte MTU: two fragments.
            client_send_udp_from(&pair.client, 5353, SocketAddr::new(lb, 40_700), &[0xab; 2000]);
            let seen: Vec<_> = xsk.recv_until(2, LONG).iter().filter_map(|f| decode(f)).collect();
            // IPv4: the later fragment has an offset; IPv6: both have a Fragment header.
            let want = if lb.is_ipv4() { 1 } else { 2 };
            let fragments = seen.iter().filter(|s| s.fragment != 0).count();
            assert_eq!(fragments, want, "the fragments to {lb} on the XSK: {seen:?}");
            assert_eq!(seen.len(), 2, "the datagram's two frames: {seen:?}");
            assert_eq!(kernel_got(&kernel), None, "the kernel got nothing of the datagram to {lb}");
        }
        steering.sync_endpoints(&[]).unwrap();
        for lb in [IpAddr::from(LB_V4), IpAddr::from(LB_V6)] {
            let kernel = lb_udp(&pair.lb, SocketAddr::new(lb, 40_701));
            client_send_udp_from(&pair.client, 5353, SocketAddr::new(lb, 40_701), &[0xcd; 2000]);
            assert_eq!(kernel_got(&kernel).map(|d| d.len()), Some(2000), "the kernel reassembled the datagram to {lb}");
        }
    }

    /// An ICMP error a router on the backend side (or the backend itself) sends about a DNAT
    /// flow's packet goes to the client, whose address the flow keeps, and quotes the packet
    /// as it left xlb: client to backend. Only xlb can turn the quote back into the VIP's, so
    /// errors quoting a listed backend's (address, protocol, port) reach the XSK, in both
    /// families; errors quoting another port of it pass.
    #[test]
    fn icmp_errors_to_a_client_quoting_a_packet_to_a_listed_nat_backend_reach_the_xsk() {
        if !common::can_run("icmp_errors_to_a_client_quoting_a_packet_to_a_listed_nat_backend_reach_the_xsk") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        // The backend's addresses: nothing of the test's own sends from or to them.
        let backend4 = IpAddr::from([10, 251, 5, 5]);
        let backend6: IpAddr = "fd00:251:5::5".parse().unwrap();
        let ep = |addr: IpAddr| ServiceKey { addr, proto: IPPROTO_UDP, port: 5353 };
        steering.sync_endpoints(&[ep(backend4), ep(backend6)]).unwrap();
        ping6_lb(&pair);

        // The lb's own address stands for the flow's client (the error's destination): it is
        // no VIP, no service and no SNAT address here.
        for (lb, backend) in [(IpAddr::from(LB_V4), backend4), (IpAddr::from(LB_V6), backend6)] {
            for (port, ours) in [(5353, true), (5354, false)] {
                let before = steering.stats().unwrap();
                pair.client.run_in(|| send_port_unreachable(lb, backend, port));
                let seen: Vec<_> = xsk.recv(if ours { LONG } else { SHORT }).iter().filter_map(|f| decode(f)).collect();
                let icmp = if lb.is_ipv4() { (1, 3) } else { (58, 1) };
                let errors = seen.iter().filter(|s| s.dst == lb && (s.proto, s.port_or_type) == icmp).count();
                let after = steering.stats().unwrap();
                if ours {
                    assert_eq!(errors, 1, "the error quoting {backend}:{port} on the XSK: {seen:?}");
                    assert_eq!(after.redirected - before.redirected, 1, "{before:?} -> {after:?}");
                } else {
                    assert_eq!(errors, 0, "the error quoting {backend}:{port} passed: {seen:?}");
                    assert_eq!(after.redirected, before.redirected, "{before:?} -> {after:?}");
                    assert!(after.passed > before.passed, "{before:?} -> {after:?}");
                }
            }
        }
    }

    /// Sends, from the calling thread's namespace, an ICMP port unreachable (ICMPv6 type 1
    /// code 4) to `to`, quoting a UDP datagram from `to`:40000 to `backend`:`port`.
    fn send_port_unreachable(to: IpAddr, backend: IpAddr, port: u16) {
        use nix::sys::socket::{
            AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6, sendto, socket,
        };
        use std::os::fd::AsRawFd as _;
        let udp = |len: u16| {
            let mut u = Vec::from(40_000u16.to_be_bytes());
            u.extend_from_slice(&port.to_be_bytes());
            u.extend_from_slice(&len.to_be_bytes());
            u.extend_from_slice(&[0, 0]);
            u
        };
        match (to, backend) {
            (IpAddr::V4(to), IpAddr::V4(b)) => {
                // The quoted IPv4 header (RFC 792: the header and 64 bits of the datagram).
                let mut q = vec![0x45, 0, 0, 28, 0, 1, 0x40, 0, 63, 17, 0, 0];
                q.extend_from_slice(&to.octets());
                q.extend_from_slice(&b.octets());
                let cs = inet_checksum(&q);
                q[10..12].copy_from_slice(&cs.to_be_bytes());
                q.extend(udp(8));
                let mut icmp = vec![3, 3, 0, 0, 0, 0, 0, 0];
                icmp.extend(q);
                let cs = inet_checksum(&icmp);
                icmp[2..4].copy_from_slice(&cs.to_be_bytes());
                let fd = socket(AddressFamily::Inet, SockType::Raw, SockFlag::empty(), SockProtocol::Icmp)
                    .expect("raw ICMP socket");
                let dst = SockaddrIn::from(std::net::SocketAddrV4::new(to, 0));
                sendto(fd.as_raw_fd(), &icmp, &dst, MsgFlags::empty()).expect("send the ICMP error");
            }
            (IpAddr::V6(to), IpAddr::V6(b)) => {
                let mut q = vec![0x60, 0, 0, 0, 0, 8, 17, 63];
                q.extend_from_slice(&to.octets());
                q.extend_from_slice(&b.octets());
                q.extend(udp(8));
                let mut icmp = vec![1, 4, 0, 0, 0, 0, 0, 0];
                icmp.extend(q);
                // The kernel fills in an ICMPv6 raw socket's checksum (RFC 3542 3.1).
                let fd = socket(AddressFamily::Inet6, SockType::Raw, SockFlag::empty(), SockProtocol::IcmpV6)
                    .expect("raw ICMPv6 socket");
                let dst = SockaddrIn6::from(std::net::SocketAddrV6::new(to, 0, 0, 0));
                sendto(fd.as_raw_fd(), &icmp, &dst, MsgFlags::empty()).expect("send the ICMPv6 error");
            }
            _ => panic!("one family"),
        }
    }

    /// The Internet checksum (RFC 1071) of `b`.
    fn inet_checksum(b: &[u8]) -> u16 {
        let mut sum: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn frames_from_a_listed_nat_backend_reach_the_xsk_in_both_families_and_its_other_ports_pass() {
        if !common::can_run("frames_from_a_listed_nat_backend_reach_the_xsk_in_both_families_and_its_other_ports_pass")
        {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        list_client_as_backend(&mut steering);
        ping6_lb(&pair);
        for lb in [IpAddr::from(LB_V4), IpAddr::from(LB_V6)] {
            let kernel = lb_udp(&pair.lb, SocketAddr::new(lb, 40_600));
            client_send_udp_from(&pair.client, 5353, SocketAddr::new(lb, 40_600), b"reply");
            let seen: Vec<_> = xsk.recv_until(1, LONG).iter().filter_map(|f| decode(f)).collect();
            assert!(
                seen.iter().any(|s| s.dst == lb && s.proto == IPPROTO_UDP && s.port_or_type == 40_600),
                "the backend's frame to {lb} on the XSK: {seen:?}"
            );
            assert_eq!(kernel_got(&kernel), None, "the kernel did not get the backend's frame to {lb}");
            client_send_udp_from(&pair.client, 5354, SocketAddr::new(lb, 40_600), b"other-port");
            assert_eq!(kernel_got(&kernel).as_deref(), Some(&b"other-port"[..]), "another port of it, to {lb}");
        }
    }

    #[test]
    fn ipv6_service_frames_reach_the_xsk_and_ndp_still_works() {
        if !common::can_run("ipv6_service_frames_reach_the_xsk_and_ndp_still_works") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        steering.sync_services(&[ServiceKey { addr: VIP_V6.into(), proto: IPPROTO_UDP, port: 7777 }]).unwrap();
        let unlisted = lb_udp(&pair.lb, SocketAddr::new(VIP_V6.into(), 7778));

        // Neighbour discovery for the gateway passes; the node answers ping6.
        ping6_lb(&pair);

        client_send_udp(&pair.client, SocketAddr::new(VIP_V6.into(), 7777), b"v6");
        let seen: Vec<_> = xsk.recv_until(1, LONG).iter().filter_map(|f| decode(f)).collect();
        assert!(
            seen.iter().any(|s| s.dst == IpAddr::from(VIP_V6) && s.proto == IPPROTO_UDP && s.port_or_type == 7777),
            "UDP to [VIP6]:7777 on the XSK: {seen:?}"
        );
        client_send_udp(&pair.client, SocketAddr::new(VIP_V6.into(), 7778), b"v6-kernel");
        assert_eq!(kernel_got(&unlisted).as_deref(), Some(&b"v6-kernel"[..]));
    }

    /// The IPv6 filters (nic-config/src/filter.rs) follow every way the maps change: a SNAT
    /// address's replies reach the XSK and its other ports pass; a service and a backend added
    /// by targeted updates are steered, and removed ones pass again.
    #[test]
    fn ipv6_snat_replies_and_keys_of_targeted_updates_are_steered() {
        if !common::can_run("ipv6_snat_replies_and_keys_of_targeted_updates_are_steered") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        let steered = |xsk: &mut Xsk, dst: IpAddr, port: u16| {
            let seen: Vec<_> = xsk.recv_until(1, LONG).iter().filter_map(|f| decode(f)).collect();
            assert!(
                seen.iter().any(|s| s.dst == dst && s.proto == IPPROTO_UDP && s.port_or_type == port),
                "UDP to [{dst}]:{port} on the XSK: {seen:?}"
            );
        };
        let lb6 = IpAddr::from(LB_V6);
        ping6_lb(&pair);

        steering.sync_snat(&[(lb6, 41_000, 41_009)]).unwrap();
        let outside = lb_udp(&pair.lb, SocketAddr::new(lb6, 41_010));
        client_send_udp(&pair.client, SocketAddr::new(lb6, 41_009), b"reply");
        steered(&mut xsk, lb6, 41_009);
        client_send_udp(&pair.client, SocketAddr::new(lb6, 41_010), b"not-ours");
        assert_eq!(kernel_got(&outside).as_deref(), Some(&b"not-ours"[..]));
        steering.sync_snat(&[]).unwrap();
        let inside = lb_udp(&pair.lb, SocketAddr::new(lb6, 41_009));
        client_send_udp(&pair.client, SocketAddr::new(lb6, 41_009), b"kernel-again");
        assert_eq!(kernel_got(&inside).as_deref(), Some(&b"kernel-again"[..]), "the address left the SNAT map");

        // Targeted updates, after a full sync made the maps' contents known.
        let svc = |port| ServiceKey { addr: VIP_V6.into(), proto: IPPROTO_UDP, port };
        steering.sync_services(&[svc(7000)]).unwrap();
        steering.sync_endpoints(&[]).unwrap();
        assert!(steering.update_services(&[svc(7001)], &[svc(7000)]).unwrap());
        client_send_udp(&pair.client, SocketAddr::new(VIP_V6.into(), 7001), b"added");
        steered(&mut xsk, VIP_V6.into(), 7001);
        let removed = lb_udp(&pair.lb, SocketAddr::new(VIP_V6.into(), 7000));
        client_send_udp(&pair.client, SocketAddr::new(VIP_V6.into(), 7000), b"removed");
        assert_eq!(kernel_got(&removed).as_deref(), Some(&b"removed"[..]));
        let ep = ServiceKey { addr: CLIENT_V6.into(), proto: IPPROTO_UDP, port: 5353 };
        assert!(steering.update_endpoints(&[ep], &[]).unwrap());
        client_send_udp_from(&pair.client, 5353, SocketAddr::new(lb6, 40_700), b"backend");
        steered(&mut xsk, lb6, 40_700);
        assert!(steering.update_endpoints(&[], &[ep]).unwrap());
        let kernel = lb_udp(&pair.lb, SocketAddr::new(lb6, 40_700));
        client_send_udp_from(&pair.client, 5353, SocketAddr::new(lb6, 40_700), b"backend-gone");
        assert_eq!(kernel_got(&kernel).as_deref(), Some(&b"backend-gone"[..]));
        steering.detach().unwrap();
    }

    /// A slot of `services6_index` cleared behind xlb's back hides its service from the
    /// program (an empty slot ends the probe), and the verify syncs, each reading back an
    /// eighth of the slots, put it back within eight of them.
    #[test]
    fn an_ipv6_index_slot_cleared_behind_xlbs_back_is_restored_by_the_verify_syncs() {
        if !common::can_run("an_ipv6_index_slot_cleared_behind_xlbs_back_is_restored_by_the_verify_syncs") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        let key = ServiceKey { addr: VIP_V6.into(), proto: IPPROTO_UDP, port: 7777 };
        steering.sync_services(&[key]).unwrap();
        ping6_lb(&pair);
        client_send_udp(&pair.client, SocketAddr::new(VIP_V6.into(), 7777), b"listed");
        assert!(!xsk.recv_until(1, LONG).is_empty(), "the service's frame on the XSK");

        // services6_index: the twelfth map (see program_attaches_to_a_veth_...). The only key
        // sits in its home slot.
        let data = aya::maps::MapData::from_id(steering.map_ids()[11]).unwrap();
        let mut index: aya::maps::Array<_, u64> = aya::maps::Array::try_from(aya::maps::Map::Array(data)).unwrap();
        let slot = services6_index_home(&key).unwrap();
        assert_ne!(index.get(&slot, 0).unwrap(), 0, "xlb wrote the service's slot");
        index.set(slot, 0, 0).unwrap();
        let kernel = lb_udp(&pair.lb, SocketAddr::new(VIP_V6.into(), 7777));
        client_send_udp(&pair.client, SocketAddr::new(VIP_V6.into(), 7777), b"hidden");
        assert_eq!(kernel_got(&kernel).as_deref(), Some(&b"hidden"[..]), "an empty slot passes the frame");
        // A plain sync trusts what it wrote; the verify syncs read the slots back.
        steering.sync_services(&[key]).unwrap();
        assert_eq!(index.get(&slot, 0).unwrap(), 0);
        for _ in 0..8 {
            steering.verify_next_sync();
            steering.sync_services(&[key]).unwrap();
        }
        assert_ne!(index.get(&slot, 0).unwrap(), 0, "repaired");
        client_send_udp(&pair.client, SocketAddr::new(VIP_V6.into(), 7777), b"again");
        assert!(!xsk.recv_until(1, LONG).is_empty(), "the service's frame on the XSK again");
        assert_eq!(kernel_got(&kernel), None);
        steering.detach().unwrap();
    }

    /// `services6_index` and `endpoints6_index`: ten IPv6 services of one home slot, two of
    /// them left to the `services` hash map ([`services_full_window`]), and likewise ten NAT
    /// backends left to `endpoints` ([`backends_full_window`]).
    #[test]
    fn ipv6_keys_left_to_the_hash_maps_by_a_full_index_window_still_reach_the_xsk() {
        if !common::can_run("ipv6_keys_left_to_the_hash_maps_by_a_full_index_window_still_reach_the_xsk") {
            return;
        }
        let pair = Pair::new(1);
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        ping6_lb(&pair);
        let key = |net: u16, i: u32, port| ServiceKey {
            addr: IpAddr::from(std::net::Ipv6Addr::new(0xfd00, 0x251, net, 0, 0, 0, (i >> 16) as u16, i as u16)),
            proto: IPPROTO_UDP,
            port,
        };
        // Fingerprints are well mixed: a home of 2^17 (2^19) slots holds about one key in
        // 131,072 (524,288) candidates.
        let services =
            eleven_of_one_home((1..0x40_0000).map(|i| key(0xa, i, 5000)), |k| services6_index_home(k).unwrap());
        pair.client.ip(&["-6", "route", "add", "fd00:251:a::/64", "via", &LB_V6.to_string()]);
        services_full_window(&pair, &mut steering, &mut xsk, &services, |s| s.services6_overflow().len());

        let backends =
            eleven_of_one_home((1..0x100_0000).map(|i| key(0xb, i, 5353)), |k| endpoints6_index_home(k).unwrap());
        for k in &backends {
            pair.client.ip(&["-6", "addr", "add", &format!("{}/128", k.addr), "dev", common::CLIENT_IF, "nodad"]);
        }
        // The way back, so that the lb's kernel takes the frames that pass.
        pair.lb.ip(&["-6", "route", "add", "fd00:251:b::/64", "via", &CLIENT_V6.to_string()]);
        let to = SocketAddr::new(LB_V6.into(), 40_600);
        backends_full_window(&pair, &mut steering, &mut xsk, &backends, to, |s| s.endpoints6_overflow().len());
        steering.detach().unwrap();
    }

    #[test]
    fn endpoints_map_holds_100k_backends_and_later_syncs_apply_only_the_difference() {
        if !common::can_run("endpoints_map_holds_100k_backends_and_later_syncs_apply_only_the_difference") {
            return;
        }
        let ns = Netns::new("xlbnic");
        ns.ip(&["link", "add", "lb0", "type", "veth", "peer", "name", "lb1"]);
        let mut steering = ns.run_in(|| Steering::attach("lb0", XdpMode::Native).unwrap());
        let ep = |i: u32| ServiceKey {
            addr: std::net::Ipv4Addr::from(0x0af4_0000 + i / 10).into(),
            proto: IPPROTO_TCP,
            port: 8000 + u16::try_from(i % 10).unwrap(),
        };
        let sorted = |mut v: Vec<ServiceKey>| {
            v.sort();
            v
        };
        // 10,000 Services x 10 endpoints (issue 5's scale profile): more than the old 65,536.
        let mut want: Vec<ServiceKey> = (0..100_000).map(ep).collect();
        let t = std::time::Instant::now();
        steering.sync_endpoints(&want).unwrap();
        eprintln!("first sync of 100,000 endpoints (full pass): {:?}", t.elapsed());
        assert_eq!(sorted(steering.endpoints_in_map().unwrap()), sorted(want.clone()));
        // One endpoint replaced: the map follows (written as a difference).
        want[7] = ep(100_000);
        let t = std::time::Instant::now();
        steering.sync_endpoints(&want).unwrap();
        eprintln!("sync of one changed endpoint: {:?}", t.elapsed());
        assert_eq!(sorted(steering.endpoints_in_map().unwrap()), sorted(want.clone()));
        // The same change as a targeted update (only the touched keys are hashed).
        let t = std::time::Instant::now();
        assert!(steering.update_endpoints(&[ep(7)], &[ep(100_000)]).unwrap());
        eprintln!("targeted update of one changed endpoint: {:?}", t.elapsed());
        want[7] = ep(7);
        assert_eq!(sorted(steering.endpoints_in_map().unwrap()), sorted(want.clone()));
        // A verified sync (the periodic resync) gives the same contents.
        want.truncate(10);
        steering.verify_next_sync();
        steering.sync_endpoints(&want).unwrap();
        assert_eq!(sorted(steering.endpoints_in_map().unwrap()), sorted(want.clone()));
        assert!(
            steering.sync_endpoints(&(0..262_145).map(ep).collect::<Vec<_>>()).is_err(),
            "more than MAX_ENDPOINTS is refused"
        );
        assert_eq!(nic_config::MAX_ENDPOINTS, 262_144);
        assert_eq!(sorted(steering.endpoints_in_map().unwrap()), sorted(want), "a refused sync changes nothing");
    }

    #[test]
    fn map_sync_inserts_new_and_removes_stale_keys() {
        if !common::can_run("map_sync_inserts_new_and_removes_stale_keys") {
            return;
        }
        let ns = Netns::new("xlbnic");
        ns.ip(&["link", "add", "lb0", "type", "veth", "peer", "name", "lb1"]);
        let mut steering = ns.run_in(|| Steering::attach("lb0", XdpMode::Native).unwrap());
        let k = |port| ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_TCP, port };
        let k6 = ServiceKey { addr: VIP_V6.into(), proto: IPPROTO_UDP, port: 53 };
        let sorted = |mut v: Vec<ServiceKey>| {
            v.sort();
            v
        };

        steering.sync_services(&[k(80), k(443), k6, k(80)]).unwrap();
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(80), k(443), k6]));
        steering.sync_services(&[k(443), k(8080)]).unwrap();
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(443), k(8080)]));
        steering.sync_services(&[]).unwrap();
        assert!(steering.services_in_map().unwrap().is_empty());

        let bad = ServiceKey { addr: VIP_V4.into(), proto: 1, port: 80 };
        let err = steering.sync_services(&[k(1), bad]).unwrap_err();
        assert!(err.to_string().contains("ServiceKey.proto"), "{err}");
        assert!(steering.services_in_map().unwrap().is_empty(), "a rejected sync changes nothing");

        // A second program on the same interface is refused, naming it; the first stays.
        let err = ns.run_in(|| Steering::attach("lb0", XdpMode::Native)).unwrap_err();
        eprintln!("second attach refused: {err}");
        assert!(err.to_string().contains("lb0") && err.to_string().contains("native"), "{err}");
        let info = ns.run_in(|| interface_info("lb0").unwrap());
        assert_eq!(info.xdp_prog_id, Some(steering.prog_id()));

        steering.sync_vip_addrs(&[VIP_V4.into(), VIP_V6.into()]).unwrap();
        steering.sync_vip_addrs(&[VIP_V6.into()]).unwrap();
        assert_eq!(steering.vip_addrs_in_map().unwrap(), vec![IpAddr::from(VIP_V6)]);

        steering.sync_snat(&[(LB_V4.into(), 1000, 2000), (LB_V6.into(), 3000, 4000)]).unwrap();
        steering.sync_snat(&[(LB_V4.into(), 1000, 1500)]).unwrap();
        assert_eq!(steering.snat_in_map().unwrap(), vec![(IpAddr::from(LB_V4), 1000, 1500)]);
        assert!(steering.sync_snat(&[(LB_V4.into(), 5, 4)]).is_err(), "first > last is rejected");

        assert!(steering.set_xsk(nic_config::MAX_QUEUES, &std::io::stdin()).is_err());
        drop(steering);
    }

    #[test]
    fn targeted_updates_write_only_their_keys_and_a_full_pass_repairs_drift() {
        if !common::can_run("targeted_updates_write_only_their_keys_and_a_full_pass_repairs_drift") {
            return;
        }
        let ns = Netns::new("xlbnic");
        ns.ip(&["link", "add", "lb0", "type", "veth", "peer", "name", "lb1"]);
        let mut steering = ns.run_in(|| Steering::attach("lb0", XdpMode::Native).unwrap());
        let k = |port| ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_TCP, port };
        let sorted = |mut v: Vec<ServiceKey>| {
            v.sort();
            v
        };
        // Before any full sync the contents are unknown: nothing is written.
        assert!(!steering.update_services(&[k(1)], &[]).unwrap());
        assert!(steering.services_in_map().unwrap().is_empty());

        steering.sync_services(&[k(80), k(443), k(8080)]).unwrap();
        // The services4 map (IPv4 services), opened again by id, to change it behind the
        // shadow's back.
        let data = aya::maps::MapData::from_id(steering.map_ids()[1]).unwrap();
        let mut raw: aya::maps::HashMap<_, [u8; 8], u32> =
            aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).unwrap();
        let raw_key = |port: u16| {
            let [a, b, c, d] = VIP_V4.octets();
            let [p, q] = port.to_be_bytes();
            [a, b, c, d, p, q, IPPROTO_TCP, 0]
        };
        // Drift: 443 vanishes and a stray 9999 appears.
        raw.remove(&raw_key(443)).unwrap();
        raw.insert(raw_key(9999), 0, 0).unwrap();
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(80), k(8080), k(9999)]));

        // A targeted update writes only its keys: 81 in, 8080 out; a key in both lists stays,
        // and the drifted keys are left as they are (it does not look at them).
        assert!(steering.update_services(&[k(81), k(80)], &[k(8080), k(80)]).unwrap());
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(80), k(81), k(9999)]));
        // Removing a key already gone, or inserting one already there, is fine.
        assert!(steering.update_services(&[k(81)], &[k(8080)]).unwrap());
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(80), k(81), k(9999)]));

        // The shadow-based sync does not see the drift (it trusts what was written: 443)...
        steering.sync_services(&[k(80), k(81), k(443)]).unwrap();
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(80), k(81), k(9999)]));
        // ...the full pass (the periodic resync) repairs it, and targeted updates are refused
        // until that pass has run.
        steering.verify_next_sync();
        assert!(!steering.update_services(&[k(1)], &[]).unwrap());
        steering.sync_services(&[k(80), k(81), k(443)]).unwrap();
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(80), k(81), k(443)]));
        assert!(steering.update_services(&[k(1)], &[k(443)]).unwrap());
        assert_eq!(sorted(steering.services_in_map().unwrap()), sorted(vec![k(1), k(80), k(81)]));

        // The other maps: vip_addrs and endpoints.
        steering.sync_vip_addrs(&[VIP_V4.into()]).unwrap();
        assert!(steering.update_vip_addrs(&[VIP_V6.into()], &[VIP_V4.into()]).unwrap());
        assert_eq!(steering.vip_addrs_in_map().unwrap(), vec![IpAddr::from(VIP_V6)]);
        let ep = ServiceKey { addr: LB_V4.into(), proto: IPPROTO_UDP, port: 53 };
        steering.sync_endpoints(&[]).unwrap();
        assert!(steering.update_endpoints(&[ep], &[]).unwrap());
        assert_eq!(steering.endpoints_in_map().unwrap(), vec![ep]);
        // A bad key is refused before anything is written.
        let bad = ServiceKey { addr: VIP_V4.into(), proto: 1, port: 80 };
        assert!(steering.update_endpoints(&[bad], &[ep]).is_err());
        assert_eq!(steering.endpoints_in_map().unwrap(), vec![ep]);
    }

    #[test]
    fn each_queue_of_a_two_queue_veth_feeds_its_own_socket() {
        if !common::can_run("each_queue_of_a_two_queue_veth_feeds_its_own_socket") {
            return;
        }
        let pair = Pair::new(2);
        let (mut steering, mut xsk0, mut xsk1) = pair.lb.run_in(|| {
            let mut steering = Steering::attach(LB_IF, XdpMode::Native).expect("attach");
            let xsk0 = Xsk::bind(LB_IF, 0);
            let xsk1 = Xsk::bind(LB_IF, 1);
            steering.set_xsk(0, xsk0.fd()).unwrap();
            steering.set_xsk(1, xsk1.fd()).unwrap();
            (steering, xsk0, xsk1)
        });
        steering.sync_services(&[ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_UDP, port: 7777 }]).unwrap();
        // 32 flows (one socket each, so different source ports): the client's veth spreads
        // them over its TX queues, and veth delivers TX queue i to the peer's RX queue i.
        pair.client.run_in(|| {
            for _ in 0..32 {
                let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                s.send_to(b"flow", SocketAddr::new(VIP_V4.into(), 7777)).unwrap();
            }
        });
        let mut n0 = 0;
        let mut n1 = 0;
        let start = std::time::Instant::now();
        while n0 + n1 < 32 && start.elapsed() < LONG {
            n0 += xsk0.recv(Duration::from_millis(50)).len();
            n1 += xsk1.recv(Duration::from_millis(50)).len();
        }
        eprintln!("queue 0 socket: {n0} frames, queue 1 socket: {n1} frames, {:?}", steering.stats());
        assert_eq!(n0 + n1, 32, "every flow reached a socket");
        assert!(n0 > 0 && n1 > 0, "both queues carried traffic: {n0} / {n1}");
    }
}

/// L2 announcement: the program answers ARP and Neighbor Solicitations for the addresses of
/// `l2_addrs` itself (XDP_TX), leaves the host's own ARP/NDP to the kernel, and lets only the
/// service ports of such an address through.
mod l2 {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    /// On the lb/client segment, on no interface of either namespace.
    const L2_V4: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 50);
    const L2_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x251, 1, 0, 0, 0, 0, 0x50);
    /// On the segment, not owned by anyone.
    const NOBODY_V4: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 77);
    const NOBODY_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x251, 1, 0, 0, 0, 0, 0x77);

    fn mac_text(m: [u8; 6]) -> String {
        m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
    }

    /// veth delivers XDP_TX frames only to a peer whose receive side runs NAPI, which an XDP
    /// program on the peer turns on: a second steering program with empty maps (it passes
    /// everything) on the client's end.
    fn pair_for_xdp_tx() -> (Pair, Steering) {
        let pair = Pair::new(1);
        let peer = pair.client.run_in(|| Steering::attach(common::CLIENT_IF, XdpMode::Native).expect("attach cl0"));
        (pair, peer)
    }

    /// The client's neighbour entry for `addr`: `ip neigh show` output.
    fn neigh(pair: &Pair, addr: IpAddr) -> String {
        pair.client.ip(&["neigh", "show", &addr.to_string(), "dev", common::CLIENT_IF])
    }

    /// Makes the client resolve `addr` (a UDP datagram needs its MAC) and waits for the entry
    /// to settle; returns it.
    fn resolve(pair: &Pair, addr: IpAddr) -> String {
        client_send_udp(&pair.client, SocketAddr::new(addr, 9), b"resolve");
        let mut last = String::new();
        for _ in 0..30 {
            std::thread::sleep(Duration::from_millis(100));
            last = neigh(pair, addr);
            if last.contains("lladdr") || last.contains("FAILED") {
                return last;
            }
        }
        last
    }

    #[test]
    fn owned_addresses_are_answered_with_the_interface_mac_and_others_stay_with_the_kernel() {
        if !common::can_run("owned_addresses_are_answered_with_the_interface_mac_and_others_stay_with_the_kernel") {
            return;
        }
        let (pair, _peer) = pair_for_xdp_tx();
        let (mut steering, xsk) = attach_with_xsk(&pair);
        let mut responder = pair.lb.run_in(|| steering.l2_responder().expect("responder"));
        assert_eq!(responder.mac(), pair.lb_mac);
        responder.sync(&[L2_V4.into(), L2_V6.into()]).unwrap();
        let mut in_map = steering.l2_addrs_in_map().unwrap();
        in_map.sort();
        assert_eq!(in_map, vec![IpAddr::from(L2_V4), IpAddr::from(L2_V6)]);

        let lb_mac = mac_text(pair.lb_mac);
        for a in [IpAddr::from(L2_V4), IpAddr::from(L2_V6)] {
            let n = resolve(&pair, a);
            assert!(
                n.contains(&format!("lladdr {lb_mac}")),
                "{a} resolves to lb0's MAC: {n}; {:?}; {}",
                steering.stats(),
                pair.lb.sh(&["ethtool", "-S", LB_IF])
            );
        }
        let st = steering.stats().unwrap();
        assert!(st.l2_replied >= 2, "one ARP reply and one NA sent by the program: {st:?}");

        // The host's own addresses: ARP and NDP still answered by the kernel.
        for a in [IpAddr::from(LB_V4), IpAddr::from(LB_V6)] {
            let ping = pair.client.exec(&["ping", "-c", "1", "-W", "2", &a.to_string()]);
            assert!(ping.status.success(), "ping {a}: {}", String::from_utf8_lossy(&ping.stdout));
            assert!(neigh(&pair, a).contains(&format!("lladdr {lb_mac}")), "{}", neigh(&pair, a));
        }
        // Addresses nobody owns stay unresolved.
        for a in [IpAddr::from(NOBODY_V4), IpAddr::from(NOBODY_V6)] {
            let n = resolve(&pair, a);
            assert!(!n.contains("lladdr"), "{a} must not resolve: {n}");
        }
        let replied = steering.stats().unwrap().l2_replied;
        assert_eq!(replied, st.l2_replied, "only owned addresses are answered by the program");

        // No xlb socket on the queue (xlb died, its program left attached): not answered, so
        // that another node can take the address over.
        steering.clear_xsk(0).unwrap();
        pair.client.ip(&["neigh", "flush", "dev", common::CLIENT_IF]);
        for a in [IpAddr::from(L2_V4), IpAddr::from(L2_V6)] {
            let n = resolve(&pair, a);
            assert!(!n.contains("lladdr"), "{a} without an xlb socket: {n}");
        }
        steering.set_xsk(0, xsk.fd()).unwrap();

        // Removed from the map: no longer answered.
        responder.sync(&[]).unwrap();
        assert!(steering.l2_addrs_in_map().unwrap().is_empty());
        pair.client.ip(&["neigh", "flush", "dev", common::CLIENT_IF]);
        for a in [IpAddr::from(L2_V4), IpAddr::from(L2_V6)] {
            let n = resolve(&pair, a);
            assert!(!n.contains("lladdr"), "{a} no longer owned: {n}");
        }
        steering.detach().unwrap();
    }

    #[test]
    fn an_owned_address_reaches_only_its_service_ports_never_the_hosts_sockets() {
        if !common::can_run("an_owned_address_reaches_only_its_service_ports_never_the_hosts_sockets") {
            return;
        }
        let (pair, _peer) = pair_for_xdp_tx();
        // Worst case: the host itself has the address (as on kube-ipvs0), with a socket on
        // every address, so whatever reaches its kernel is answered.
        pair.lb.ip(&["addr", "add", "10.251.1.50/32", "dev", "lo"]);
        pair.lb.ip(&["addr", "add", "fd00:251:1::50/128", "dev", "lo"]);
        let (mut steering, _xsk) = attach_with_xsk(&pair);
        let mut responder = pair.lb.run_in(|| steering.l2_responder().expect("responder"));
        let host4 = lb_udp(&pair.lb, "0.0.0.0:7000".parse().unwrap());
        let host6 = lb_udp(&pair.lb, "[fd00:251:1::50]:7000".parse().unwrap());
        let svc = ServiceKey { addr: L2_V4.into(), proto: IPPROTO_UDP, port: 53 };
        steering.sync_services(&[svc]).unwrap();
        steering.sync_vip_addrs(&[L2_V4.into(), L2_V6.into()]).unwrap();
        responder.sync(&[L2_V4.into(), L2_V6.into()]).unwrap();

        for (a, sock) in [(IpAddr::from(L2_V4), &host4), (IpAddr::from(L2_V6), &host6)] {
            client_send_udp(&pair.client, SocketAddr::new(a, 7000), b"host-port");
            assert_eq!(kernel_got(sock), None, "UDP to {a}:7000 must not reach the host's socket");
            let ping = pair.client.exec(&["ping", "-c", "1", "-W", "1", &a.to_string()]);
            assert!(!ping.status.success(), "echo to {a} is not answered: {}", String::from_utf8_lossy(&ping.stdout));
            let tcp = pair.client.exec(&["timeout", "3", "bash", "-c", &format!("exec 3<>/dev/tcp/{a}/22")]);
            assert!(!tcp.status.success(), "TCP to {a}:22 does not connect");
        }
        let st = steering.stats().unwrap();
        assert!(st.l2_dropped >= 4, "UDP and echo for both families dropped: {st:?}");
        // The service port is steered to xlb.
        client_send_udp(&pair.client, SocketAddr::new(L2_V4.into(), 53), b"service");
        wait_for(LONG, "the service frame to be steered", || (steering.stats().unwrap().redirected >= 1).then_some(()));

        // `l2_filter` decides whether `l2_addrs` is asked: with the address's word cleared
        // behind the responder's back its frames reach the host, and the next sync, which
        // reads the filter back, restores it.
        let ids = steering.map_ids();
        let data = aya::maps::MapData::from_id(ids[ids.len() - 3]).unwrap();
        let mut filter: aya::maps::Array<_, u64> = aya::maps::Array::try_from(aya::maps::Map::Array(data)).unwrap();
        let word = l2_filter_bit(L2_V4.into()) / 64;
        assert_ne!(filter.get(&word, 0).unwrap(), 0, "the responder set the address's bit");
        filter.set(word, 0, 0).unwrap();
        client_send_udp(&pair.client, SocketAddr::new(L2_V4.into(), 7000), b"unfiltered");
        assert_eq!(kernel_got(&host4).as_deref(), Some(&b"unfiltered"[..]));
        responder.sync(&[L2_V4.into(), L2_V6.into()]).unwrap();
        client_send_udp(&pair.client, SocketAddr::new(L2_V4.into(), 7000), b"host-port");
        assert_eq!(kernel_got(&host4), None, "dropped again after the sync");

        // The same frames reach the host once the address is not announced: the drop above
        // is the program's doing.
        responder.sync(&[]).unwrap();
        client_send_udp(&pair.client, SocketAddr::new(L2_V4.into(), 7000), b"now-host");
        assert_eq!(kernel_got(&host4).as_deref(), Some(&b"now-host"[..]));
        steering.detach().unwrap();
    }

    #[test]
    fn with_the_destination_mac_check_a_frame_for_another_mac_passes_and_ours_is_steered() {
        if !common::can_run("with_the_destination_mac_check_a_frame_for_another_mac_passes_and_ours_is_steered") {
            return;
        }
        let (pair, _peer) = pair_for_xdp_tx();
        let (mut steering, mut xsk) = attach_with_xsk(&pair);
        let mut responder = pair.lb.run_in(|| steering.l2_responder().expect("responder"));
        let svc = ServiceKey { addr: VIP_V4.into(), proto: IPPROTO_UDP, port: 7777 };
        steering.sync_services(&[svc]).unwrap();
        steering.sync_vip_addrs(&[VIP_V4.into()]).unwrap();
        let to = SocketAddr::new(VIP_V4.into(), 7777);
        // The client sends the VIP's frames (routed via lb0's address) to another node's MAC;
        // veth delivers them to lb0 all the same, as a switch flooding an unknown destination
        // would.
        let gw = LB_V4.to_string();
        let set_mac = |mac: &str| {
            pair.client.ip(&["neigh", "replace", &gw, "lladdr", mac, "dev", common::CLIENT_IF, "nud", "permanent"]);
        };
        set_mac("02:00:00:00:00:99");

        // The check is off by default: the frame is steered whatever its destination MAC.
        client_send_udp(&pair.client, to, b"flooded-unchecked");
        assert!(xsk.recv_until(1, LONG).iter().any(|f| f.ends_with(b"flooded-unchecked")), "{:?}", steering.stats());

        responder.check_destination_mac(true).unwrap();
        client_send_udp(&pair.client, to, b"flooded-checked");
        wait_for(LONG, "the frame for another MAC to be passed", || {
            (steering.stats().unwrap().l2_other_host >= 1).then_some(())
        });
        assert!(xsk.recv(SHORT).is_empty(), "a frame for another MAC is not steered");

        // Addressed to lb0's MAC: steered; ARP (broadcast) still answered by the kernel.
        set_mac(&mac_text(pair.lb_mac));
        client_send_udp(&pair.client, to, b"ours");
        assert!(xsk.recv_until(1, LONG).iter().any(|f| f.ends_with(b"ours")), "{:?}", steering.stats());
        let ping = pair.client.exec(&["ping", "-c", "1", "-W", "2", &LB_V4.to_string()]);
        assert!(ping.status.success(), "ping the node: {}", String::from_utf8_lossy(&ping.stdout));
        let other = steering.stats().unwrap().l2_other_host;

        // Off again: another MAC is steered again.
        responder.check_destination_mac(false).unwrap();
        set_mac("02:00:00:00:00:99");
        client_send_udp(&pair.client, to, b"flooded-off");
        assert!(xsk.recv_until(1, LONG).iter().any(|f| f.ends_with(b"flooded-off")), "{:?}", steering.stats());
        assert_eq!(steering.stats().unwrap().l2_other_host, other, "nothing passed for its MAC once off");
        steering.detach().unwrap();
    }

    #[test]
    fn taking_over_sends_gratuitous_arp_and_unsolicited_na_that_move_the_clients_entry() {
        if !common::can_run("taking_over_sends_gratuitous_arp_and_unsolicited_na_that_move_the_clients_entry") {
            return;
        }
        let pair = Pair::new(1);
        let (steering, responder) = pair.lb.run_in(|| {
            let st = Steering::attach(LB_IF, XdpMode::Native).expect("attach");
            let r = st.l2_responder().expect("responder");
            (st, r)
        });
        // The client believes the addresses live elsewhere (the previous owner).
        for a in [L2_V4.to_string(), L2_V6.to_string()] {
            pair.client.ip(&[
                "neigh",
                "replace",
                &a,
                "lladdr",
                "02:00:00:00:00:99",
                "dev",
                common::CLIENT_IF,
                "nud",
                "stale",
            ]);
        }
        // An ARP request updates an existing entry only after its locktime (1 s by default).
        std::thread::sleep(Duration::from_millis(1200));
        responder.announce(L2_V4.into()).unwrap();
        responder.announce(L2_V6.into()).unwrap();
        let lb_mac = mac_text(pair.lb_mac);
        for a in [IpAddr::from(L2_V4), IpAddr::from(L2_V6)] {
            wait_for(LONG, "the client's entry to move", || neigh(&pair, a).contains(&lb_mac).then_some(()));
        }
        steering.detach().unwrap();
    }
}
