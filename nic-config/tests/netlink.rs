//! Neighbours and interface facts/settings, in private network namespaces.
//! Needs root; without it each test prints why and returns.

mod common;

use std::{net::IpAddr, time::Duration};

use common::{CLIENT_IF, CLIENT_V4, CLIENT_V6, LB_IF, LB_V4, LB_V6, Netns, Pair, wait_for};
use nic_config::{
    NeighbourEvent, NeighbourState, NeighbourWatcher, NicError, channels, ifindex, interface_info, local_addresses,
    neighbours, set_channels, set_tx_checksum_offload, tx_checksum_offload,
};

const LONG: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbour_dump_sees_a_static_neighbour() {
        if !common::can_run("neighbour_dump_sees_a_static_neighbour") {
            return;
        }
        let ns = Netns::new("xlbnic");
        ns.ip(&["link", "add", "lb0", "type", "veth", "peer", "name", "lb1"]);
        ns.ip(&["link", "set", "lb0", "up"]);
        ns.ip(&["neigh", "replace", "10.251.1.77", "lladdr", "02:00:00:00:00:77", "dev", "lb0", "nud", "permanent"]);
        ns.ip(&["neigh", "replace", "fd00:251:1::77", "lladdr", "02:00:00:00:06:77", "dev", "lb0", "nud", "permanent"]);

        let (idx, all, only_lb0, only_lo) = ns.run_in(|| {
            let idx = ifindex("lb0").unwrap();
            (
                idx,
                neighbours::dump(None).unwrap(),
                neighbours::dump(Some(idx)).unwrap(),
                neighbours::dump(Some(ifindex("lo").unwrap())).unwrap(),
            )
        });
        let v4 = only_lb0
            .iter()
            .find(|n| n.ip == "10.251.1.77".parse::<IpAddr>().unwrap())
            .unwrap_or_else(|| panic!("static IPv4 neighbour in {only_lb0:?}"));
        assert_eq!(v4.mac, Some([2, 0, 0, 0, 0, 0x77]));
        assert_eq!(v4.state, NeighbourState::PERMANENT);
        assert_eq!(v4.ifindex, idx);
        assert_eq!(v4.usable_mac(), Some([2, 0, 0, 0, 0, 0x77]));
        let v6 = only_lb0
            .iter()
            .find(|n| n.ip == "fd00:251:1::77".parse::<IpAddr>().unwrap())
            .unwrap_or_else(|| panic!("static IPv6 neighbour in {only_lb0:?}"));
        assert_eq!(v6.mac, Some([2, 0, 0, 0, 6, 0x77]));
        assert!(all.contains(v4) && all.contains(v6));
        assert!(only_lo.is_empty(), "the ifindex filter applies: {only_lo:?}");
    }

    #[test]
    fn neighbour_watcher_reports_added_and_removed_entries() {
        if !common::can_run("neighbour_watcher_reports_added_and_removed_entries") {
            return;
        }
        let ns = Netns::new("xlbnic");
        ns.ip(&["link", "add", "lb0", "type", "veth", "peer", "name", "lb1"]);
        ns.ip(&["link", "set", "lb0", "up"]);
        let mut watcher = ns.run_in(|| NeighbourWatcher::new().unwrap());
        assert_eq!(watcher.recv_timeout(Duration::ZERO).unwrap(), None, "quiet before changes");

        let ip: IpAddr = "10.251.1.88".parse().unwrap();
        ns.ip(&["neigh", "replace", "10.251.1.88", "lladdr", "02:00:00:00:00:88", "dev", "lb0", "nud", "permanent"]);
        let added = wait_for(LONG, "RTM_NEWNEIGH", || match watcher.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(NeighbourEvent::Changed(n))) if n.ip == ip => Some(n),
            _ => None,
        });
        assert_eq!(added.mac, Some([2, 0, 0, 0, 0, 0x88]));
        assert_eq!(added.state, NeighbourState::PERMANENT);

        ns.ip(&["neigh", "del", "10.251.1.88", "dev", "lb0"]);
        let removed = wait_for(LONG, "RTM_DELNEIGH", || match watcher.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(NeighbourEvent::Removed(n))) if n.ip == ip => Some(n),
            _ => None,
        });
        assert_eq!(removed.ifindex, added.ifindex);
    }

    #[test]
    fn resolve_makes_the_kernel_learn_the_neighbour() {
        if !common::can_run("resolve_makes_the_kernel_learn_the_neighbour") {
            return;
        }
        let pair = Pair::new(1);
        let idx = pair.lb.run_in(|| ifindex(LB_IF).unwrap());
        for peer in [IpAddr::from(CLIENT_V4), IpAddr::from(CLIENT_V6)] {
            let before = pair.lb.run_in(|| neighbours::dump(Some(idx)).unwrap());
            assert!(before.iter().all(|n| n.ip != peer), "no entry for {peer} yet: {before:?}");

            let mut watcher = pair.lb.run_in(|| NeighbourWatcher::new().unwrap());
            pair.lb.run_in(|| neighbours::resolve(idx, peer)).expect("resolve");
            let n = wait_for(LONG, &format!("the kernel to resolve the client's {peer}"), || {
                let found = pair
                    .lb
                    .run_in(|| neighbours::dump(Some(idx)).unwrap())
                    .into_iter()
                    .find(|n| n.ip == peer && n.usable_mac().is_some());
                if found.is_none() {
                    // Asked again while it is not resolved, as xlb asks again for its unresolved
                    // next hops: the first probes can go out before the fresh veth pair passes
                    // frames, and after its retries the kernel leaves the entry FAILED.
                    pair.lb.run_in(|| neighbours::resolve(idx, peer)).expect("resolve again");
                }
                found
            });
            assert_eq!(n.mac, Some(pair.client_mac), "{peer} resolved to the client's MAC");
            // The watcher saw it too.
            wait_for(LONG, "the resolution event", || match watcher.recv_timeout(Duration::from_millis(200)) {
                Ok(Some(NeighbourEvent::Changed(e))) if e.ip == peer && e.mac == Some(pair.client_mac) => Some(()),
                _ => None,
            });
        }
        // An unknown interface index is the kernel's ENODEV, passed on.
        let err = pair.lb.run_in(|| neighbours::resolve(9999, CLIENT_V4.into())).unwrap_err();
        assert!(matches!(err, NicError::Netlink { .. }), "{err}");
    }

    #[test]
    fn interface_info_reports_mac_mtu_addresses_and_queues() {
        if !common::can_run("interface_info_reports_mac_mtu_addresses_and_queues") {
            return;
        }
        let pair = Pair::new(2);
        let info = pair.lb.run_in(|| interface_info(LB_IF).unwrap());
        assert_eq!(info.name, LB_IF);
        assert_eq!(info.mac, Some(pair.lb_mac));
        assert_eq!(info.mtu, 1500);
        assert_eq!((info.rx_queues, info.tx_queues), (2, 2));
        assert_eq!(info.xdp_prog_id, None);
        let addrs: Vec<_> = info.addresses.iter().map(|a| (a.addr, a.prefix_len)).collect();
        assert!(addrs.contains(&(LB_V4.into(), 24)), "{addrs:?}");
        assert!(addrs.contains(&(LB_V6.into(), 64)), "{addrs:?}");
        assert!(
            !addrs.iter().any(|(a, _)| *a == IpAddr::from(common::VIP_V4)),
            "addresses of other interfaces (lo) are not listed: {addrs:?}"
        );
        let err = pair.lb.run_in(|| interface_info("nosuch0")).unwrap_err();
        assert!(matches!(err, NicError::UnknownInterface { .. }) && err.to_string().contains("nosuch0"), "{err}");
    }

    #[test]
    fn local_addresses_lists_every_interface_and_sees_a_new_address() {
        if !common::can_run("local_addresses_lists_every_interface_and_sees_a_new_address") {
            return;
        }
        let pair = Pair::new(1);
        let addrs = pair.lb.run_in(|| local_addresses().unwrap());
        let has = |list: &[nic_config::InterfaceAddress], a: IpAddr| list.iter().any(|x| x.addr == a);
        assert!(has(&addrs, LB_V4.into()) && has(&addrs, LB_V6.into()), "{addrs:?}");
        assert!(has(&addrs, common::VIP_V4.into()), "addresses on lo are listed too: {addrs:?}");
        let extra: IpAddr = "10.99.0.7".parse().unwrap();
        assert!(!has(&addrs, extra), "{addrs:?}");
        pair.lb.sh(&["ip", "addr", "add", "10.99.0.7/32", "dev", LB_IF]);
        let addrs = pair.lb.run_in(|| local_addresses().unwrap());
        assert!(has(&addrs, extra), "an address added later is seen: {addrs:?}");
    }

    #[test]
    fn routes_lists_connected_gateway_and_multipath_routes_of_the_main_table() {
        if !common::can_run("routes_lists_connected_gateway_and_multipath_routes_of_the_main_table") {
            return;
        }
        use nic_config::routes::{TABLE_MAIN, routes};
        let pair = Pair::new(1);
        // Two gateways on the lb's link (the client side), one single-path and one multipath
        // route through them.
        pair.lb.sh(&["ip", "route", "add", "10.77.1.0/24", "via", "10.251.1.2"]);
        pair.lb.sh(&[
            "ip",
            "route",
            "add",
            "10.77.2.0/24",
            "nexthop",
            "via",
            "10.251.1.2",
            "nexthop",
            "via",
            "10.251.1.4",
        ]);
        pair.lb.sh(&["ip", "route", "add", "table", "100", "10.77.3.0/24", "via", "10.251.1.2"]);
        let list = pair.lb.run_in(|| routes(TABLE_MAIN).unwrap());
        let find =
            |dst: &str, len: u8| list.iter().find(|r| r.dst == dst.parse::<IpAddr>().unwrap() && r.prefix_len == len);
        let connected = find("10.251.1.0", 24).unwrap_or_else(|| panic!("no connected route: {list:?}"));
        assert!(connected.gateways.is_empty() && connected.oif.is_some(), "{connected:?}");
        let via = find("10.77.1.0", 24).unwrap_or_else(|| panic!("{list:?}"));
        assert_eq!(via.gateways, ["10.251.1.2".parse::<IpAddr>().unwrap()]);
        let multi = find("10.77.2.0", 24).unwrap_or_else(|| panic!("{list:?}"));
        assert_eq!(multi.gateways, ["10.251.1.2".parse::<IpAddr>().unwrap(), "10.251.1.4".parse().unwrap()]);
        assert!(find("10.77.3.0", 24).is_none(), "table 100 is not the main table: {list:?}");
        assert!(!list.iter().any(|r| r.dst == IpAddr::from(common::VIP_V4)), "local routes are left out: {list:?}");
        let t100 = pair.lb.run_in(|| routes(100).unwrap());
        assert_eq!(t100.len(), 1, "{t100:?}");
    }

    #[test]
    fn route_watcher_reports_added_and_deleted_routes_once() {
        if !common::can_run("route_watcher_reports_added_and_deleted_routes_once") {
            return;
        }
        use nic_config::routes::RouteWatcher;
        let pair = Pair::new(1);
        let mut w = pair.lb.run_in(|| RouteWatcher::new().unwrap());
        // Whatever the setup announced is drained first.
        let _ = w.changed().unwrap();
        assert!(!w.changed().unwrap(), "nothing changed since the last call");
        pair.lb.ip(&["route", "add", "10.77.5.0/24", "via", "10.251.1.2"]);
        wait_for(LONG, "the added route to be reported", || w.changed().unwrap().then_some(()));
        assert!(!w.changed().unwrap(), "reported once");
        pair.lb.ip(&["route", "del", "10.77.5.0/24"]);
        wait_for(LONG, "the deleted route to be reported", || w.changed().unwrap().then_some(()));
        // Another namespace's routes are not this watcher's business.
        pair.client.ip(&["route", "add", "10.77.6.0/24", "via", "10.251.1.1"]);
        std::thread::sleep(Duration::from_millis(200));
        assert!(!w.changed().unwrap(), "the client namespace's route is not seen");
    }

    #[test]
    fn channels_and_tx_checksum_offload_can_be_set() {
        if !common::can_run("channels_and_tx_checksum_offload_can_be_set") {
            return;
        }
        let pair = Pair::new(2);
        pair.lb.run_in(|| {
            let c = channels(LB_IF).unwrap();
            assert_eq!((c.max_rx, c.max_tx, c.rx_queues()), (Some(2), Some(2), 2), "{c:?}");
            set_channels(LB_IF, 1).unwrap();
            assert_eq!(channels(LB_IF).unwrap().rx_queues(), 1);
            set_channels(LB_IF, 1).expect("setting the current count is a no-op");
            set_channels(LB_IF, 2).unwrap();
            assert_eq!(channels(LB_IF).unwrap().rx_queues(), 2);
            let err = set_channels(LB_IF, 3).unwrap_err();
            assert!(err.to_string().contains("channel count"), "{err}");
        });
        pair.client.run_in(|| {
            assert!(tx_checksum_offload(CLIENT_IF).unwrap(), "veth starts with tx checksumming on");
            set_tx_checksum_offload(CLIENT_IF, false).unwrap();
            assert!(!tx_checksum_offload(CLIENT_IF).unwrap());
            set_tx_checksum_offload(CLIENT_IF, true).unwrap();
            assert!(tx_checksum_offload(CLIENT_IF).unwrap());
            let err = set_tx_checksum_offload("nosuch0", false).unwrap_err();
            assert!(err.to_string().contains("nosuch0"), "{err}");
        });
    }

    /// An IPv4 UDP packet `src:sport -> dst:dport` with `payload` (header checksum set, UDP
    /// checksum 0 = none, RFC 768).
    fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let total = u16::try_from(20 + 8 + payload.len()).unwrap();
        let mut p = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0];
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        let sum = p.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum::<u32>();
        let sum = (sum & 0xffff) + (sum >> 16);
        let sum = !u16::try_from((sum & 0xffff) + (sum >> 16)).unwrap();
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn punt_device_hands_packets_to_the_kernel_for_local_delivery_and_forwarding_and_leaves_nothing() {
        if !common::can_run(
            "punt_device_hands_packets_to_the_kernel_for_local_delivery_and_forwarding_and_leaves_nothing",
        ) {
            return;
        }
        use nic_config::punt::Punt;
        let pair = Pair::new(1);
        pair.lb.sh(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let local = pair.lb.run_in(|| std::net::UdpSocket::bind((LB_V4, 5555)).unwrap());
        let remote = pair.client.run_in(|| std::net::UdpSocket::bind((CLIENT_V4, 5556)).unwrap());
        for s in [&local, &remote] {
            s.set_read_timeout(Some(LONG)).unwrap();
        }
        let mut punt = pair.lb.run_in(|| Punt::create("xlbpunt0", 2).unwrap());
        let queues = punt.take_queues();
        assert_eq!(queues.len(), 2);
        let link = pair.lb.ip(&["-d", "link", "show", "dev", "xlbpunt0"]);
        assert!(link.contains("UP") && link.contains("tun"), "{link}");
        assert_eq!(pair.lb.sh(&["sysctl", "-n", "net.ipv4.conf.xlbpunt0.rp_filter"]).trim(), "0");
        assert!(punt.warnings().is_empty(), "{:?}", punt.warnings());

        // Local delivery through queue 0: a packet to the lb's own address from the client.
        let pkt = udp4(CLIENT_V4.octets(), LB_V4.octets(), 4000, 5555, b"to-local");
        assert_eq!(queues[0].send(&pkt).unwrap(), pkt.len());
        let mut buf = [0u8; 64];
        let (n, from) = local.recv_from(&mut buf).expect("the kernel delivers a punted packet locally");
        assert_eq!((&buf[..n], from), (&b"to-local"[..], (CLIENT_V4, 4000).into()));

        // Forwarding through queue 1: a packet from elsewhere to the client is routed out lb0.
        let pkt = udp4([10, 251, 7, 7], CLIENT_V4.octets(), 4001, 5556, b"forwarded");
        assert_eq!(queues[1].send(&pkt).unwrap(), pkt.len());
        let (n, from) = remote.recv_from(&mut buf).expect("the kernel forwards a punted packet");
        assert_eq!((&buf[..n], from), (&b"forwarded"[..], ([10, 251, 7, 7], 4001).into()));

        // Not IP: refused, not a crash.
        assert!(queues[0].send(&[0u8; 20]).is_err());

        drop(queues);
        drop(punt);
        wait_for(LONG, "the punt device to disappear with its last queue", || {
            (!pair.lb.ip(&["link", "show"]).contains("xlbpunt0")).then_some(())
        });
    }

    #[test]
    fn reply_rules_route_a_backends_replies_into_the_punt_device_and_sync_removes_them() {
        if !common::can_run("reply_rules_route_a_backends_replies_into_the_punt_device_and_sync_removes_them") {
            return;
        }
        use nic_config::punt::Punt;
        use nic_config::rules::{REPLY_TABLE, ReplyRule, reply_rules, route_reply_table_to, sync_reply_rules};
        let pair = Pair::new(1);
        let mut punt = pair.lb.run_in(|| Punt::create("xlbpunt1", 1).unwrap());
        let q = punt.take_queues().pop().unwrap();
        let rule = ReplyRule { src: LB_V4.into(), proto: 17, sport: 7777 };
        let want: std::collections::BTreeSet<ReplyRule> = [rule].into();
        pair.lb.run_in(|| {
            route_reply_table_to(punt.ifindex()).unwrap();
            assert_eq!(sync_reply_rules(&want).unwrap(), (1, 0));
            assert_eq!(sync_reply_rules(&want).unwrap(), (0, 0), "idempotent");
            assert_eq!(reply_rules().unwrap(), want);
        });
        let rules = pair.lb.ip(&["rule", "show"]);
        assert!(rules.contains(&format!("from {LB_V4} ipproto udp sport 7777 lookup {REPLY_TABLE}")), "{rules}");
        let table = pair.lb.ip(&["route", "show", "table", &REPLY_TABLE.to_string()]);
        assert!(table.contains("default dev xlbpunt1"), "{table}");

        // A datagram from the backend's (address, port) is routed into the punt device, not out
        // of lb0; one from another port is not.
        pair.lb.run_in(|| {
            let s = std::net::UdpSocket::bind((LB_V4, 7777)).unwrap();
            s.send_to(b"reply", (CLIENT_V4, 5556)).unwrap();
            let other = std::net::UdpSocket::bind((LB_V4, 7778)).unwrap();
            other.send_to(b"other", (CLIENT_V4, 5556)).unwrap();
        });
        let mut buf = [0u8; 256];
        let n = wait_for(LONG, "the reply in the punt device", || q.recv(&mut buf).ok());
        let pkt = &buf[..n];
        assert_eq!(pkt[9], 17, "UDP");
        assert_eq!(&pkt[12..16], &LB_V4.octets());
        assert_eq!(&pkt[20..22], &7777u16.to_be_bytes());
        assert_eq!(&pkt[n - 5..], b"reply");
        std::thread::sleep(Duration::from_millis(100));
        assert!(q.recv(&mut buf).is_err(), "only the backend's port is caught");

        pair.lb.run_in(|| assert_eq!(sync_reply_rules(&Default::default()).unwrap(), (0, 1)));
        assert!(!pair.lb.ip(&["rule", "show"]).contains("7777"), "rule deleted");

        // The bypass rule of the device: idempotent both ways, one per family.
        use nic_config::rules::set_bypass;
        pair.lb.run_in(|| {
            set_bypass("xlbpunt1", true).unwrap();
            set_bypass("xlbpunt1", true).unwrap();
        });
        for fam in ["-4", "-6"] {
            let rules = pair.lb.ip(&[fam, "rule", "show"]);
            assert_eq!(rules.matches("iif xlbpunt1 lookup main").count(), 1, "{fam}: {rules}");
        }
        pair.lb.run_in(|| {
            set_bypass("xlbpunt1", false).unwrap();
            set_bypass("xlbpunt1", false).unwrap();
        });
        assert!(!pair.lb.ip(&["rule", "show"]).contains("xlbpunt1"), "bypass rule deleted");

        // What an earlier xlb left: the bypass rule of its device (another name) goes, this
        // process's own stays; with no punt device of its own, its reply rules go too.
        use nic_config::rules::{bypass_devices, remove_leftovers};
        pair.lb.run_in(|| {
            set_bypass("xlbold", true).unwrap();
            set_bypass("xlbpunt1", true).unwrap();
            assert_eq!(sync_reply_rules(&want).unwrap(), (1, 0));
            assert_eq!(bypass_devices().unwrap(), ["xlbold".to_owned(), "xlbpunt1".to_owned()].into());
            assert_eq!(remove_leftovers(Some("xlbpunt1")).unwrap(), (1, 0));
            assert_eq!(bypass_devices().unwrap(), ["xlbpunt1".to_owned()].into());
            assert_eq!(reply_rules().unwrap(), want, "reply rules stay while there is a punt device");
            assert_eq!(remove_leftovers(None).unwrap(), (1, 1));
            assert_eq!(remove_leftovers(None).unwrap(), (0, 0), "nothing left the second time");
        });
        let rules = pair.lb.ip(&["rule", "show"]);
        assert!(!rules.contains("xlbold") && !rules.contains("xlbpunt1") && !rules.contains("7777"), "{rules}");
    }
}
