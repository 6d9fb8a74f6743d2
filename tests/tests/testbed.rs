//! The namespace testbed itself, without xlb: the kernel of the xlb node routes between
//! the client and the backends, the servers answer, DSR decapsulation works, and the
//! testbed leaves nothing behind.

#[cfg(test)]
mod testbed {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
    use std::time::Duration;

    use xlb_e2e::{
        BACKENDS, CLIENT_V4, CLIENT_V6, DSR_VIP_V4, DSR_VIP_V6, DsrDecap, HTTP_PORT, Role, ServiceReply, TCP_PORT,
        Testbed, UDP_PORT, backend_v4, backend_v6, list_netns, skip_without_root, wait_for,
    };

    fn url(addr: IpAddr) -> String {
        match addr {
            IpAddr::V4(a) => format!("http://{a}:{HTTP_PORT}/"),
            IpAddr::V6(a) => format!("http://[{a}]:{HTTP_PORT}/"),
        }
    }

    fn namespaces_of(prefix: &str) -> Vec<String> {
        let head = format!("{prefix}-");
        list_netns().into_iter().filter(|n| n.starts_with(&head)).collect()
    }

    /// Asserts that every service of backend `i` answers `from` (client) via `addr`.
    fn assert_backend_serves_client(tb: &Testbed, i: u8, addr: IpAddr, client: IpAddr) {
        let name = format!("be{i}");
        let body = tb.curl(Role::Client, &url(addr)).expect("curl");
        assert_eq!(body, format!("{name}\n"), "http body from {addr}");
        let client_s = client.to_string();
        let seen = wait_for(Duration::from_secs(2), || {
            let seen = tb.backend_seen_clients(i).expect("access log");
            seen.contains(&client_s).then_some(seen)
        });
        assert!(seen.is_some(), "{name}'s nginx never logged client {client}");

        let udp = tb.udp_query(Role::Client, addr, UDP_PORT, b"hello").expect("udp query");
        let udp = ServiceReply::parse(&udp).expect("udp reply");
        assert_eq!(udp, ServiceReply { backend: name.clone(), peer: client }, "udp via {addr}");

        let tcp = tb.tcp_query(Role::Client, addr, TCP_PORT).expect("tcp query");
        let tcp = ServiceReply::parse(&tcp).expect("tcp reply");
        assert_eq!(tcp, ServiceReply { backend: name, peer: client }, "tcp via {addr}");
    }

    #[test]
    fn kernel_forwarding_reaches_every_backend_without_xlb() {
        if skip_without_root("kernel_forwarding_reaches_every_backend_without_xlb") {
            return;
        }
        let tb = Testbed::up().expect("testbed up");
        let prefix = tb.prefix().to_owned();
        assert_eq!(namespaces_of(&prefix).len(), Role::all().len());

        // routed by the lb namespace's kernel: one hop, so TTL/hop limit 64 - 1
        for addr in [IpAddr::V4(backend_v4(1)), IpAddr::V6(backend_v6(1))] {
            let a = addr.to_string();
            let ping = tb.exec_ok(Role::Client, &["ping", "-c1", "-W2", &a]).expect("ping");
            assert!(ping.contains("ttl=63"), "not routed through the lb: {ping}");
        }

        for i in 1..=BACKENDS {
            assert_backend_serves_client(&tb, i, IpAddr::V4(backend_v4(i)), IpAddr::V4(CLIENT_V4));
            assert_backend_serves_client(&tb, i, IpAddr::V6(backend_v6(i)), IpAddr::V6(CLIENT_V6));
            let log = tb.backend_access_log(i).expect("access log");
            assert!(log.iter().any(|e| e.server == IpAddr::V4(backend_v4(i)) && e.status == 200));
        }

        // one-armed segment: no ICMP redirect may have taught the client a direct path
        let neigh = tb.exec_ok(Role::Client, &["ip", "neigh", "show"]).expect("ip neigh");
        for i in 1..=BACKENDS {
            for a in [backend_v4(i).to_string(), backend_v6(i).to_string()] {
                assert!(!neigh.lines().any(|l| l.starts_with(&format!("{a} "))), "{neigh}");
            }
        }

        tb.down().expect("testbed down");
        assert_eq!(namespaces_of(&prefix), Vec::<String>::new(), "namespaces left behind");
    }

    #[test]
    fn two_testbeds_coexist_with_distinct_prefixes() {
        if skip_without_root("two_testbeds_coexist_with_distinct_prefixes") {
            return;
        }
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(Testbed::up);
            let b = s.spawn(Testbed::up);
            (a.join().expect("thread a"), b.join().expect("thread b"))
        });
        let a = a.expect("testbed a up");
        let b = b.expect("testbed b up");
        assert_ne!(a.prefix(), b.prefix());
        assert!(a.prefix().len() <= 15 && b.prefix().len() <= 15);
        for tb in [&a, &b] {
            assert_eq!(namespaces_of(tb.prefix()).len(), Role::all().len());
            let body = tb.curl(Role::Client, &url(IpAddr::V4(backend_v4(2)))).expect("curl");
            assert_eq!(body, "be2\n");
        }
        let b_prefix = b.prefix().to_owned();
        drop(b);
        assert!(namespaces_of(&b_prefix).is_empty());
        // the survivor is untouched
        let body = a.curl(Role::Client, &url(IpAddr::V6(backend_v6(3)))).expect("curl");
        assert_eq!(body, "be3\n");
        let a_prefix = a.prefix().to_owned();
        drop(a);
        assert!(namespaces_of(&a_prefix).is_empty());
    }

    fn checksum(data: &[u8], mut sum: u32) -> u16 {
        for chunk in data.chunks(2) {
            let hi = chunk.first().copied().unwrap_or(0);
            let lo = chunk.get(1).copied().unwrap_or(0);
            sum += u32::from(u16::from_be_bytes([hi, lo]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !u16::try_from(sum).expect("folded")
    }

    fn udp_header(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
        let len = u16::try_from(8 + payload.len()).expect("short payload");
        let mut udp = Vec::new();
        udp.extend(src_port.to_be_bytes());
        udp.extend(dst_port.to_be_bytes());
        udp.extend(len.to_be_bytes());
        udp.extend([0, 0]);
        udp.extend(payload);
        udp
    }

    /// An IPv4 UDP packet (UDP checksum 0: none) to be carried inside IPIP.
    fn inner_v4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let udp = udp_header(sport, dport, payload);
        let total = u16::try_from(20 + udp.len()).expect("short packet");
        let mut ip = vec![0x45, 0];
        ip.extend(total.to_be_bytes());
        ip.extend([0, 1, 0x40, 0, 64, 17, 0, 0]); // id 1, DF, ttl 64, UDP, checksum 0
        ip.extend(src.octets());
        ip.extend(dst.octets());
        let sum = checksum(&ip, 0).to_be_bytes();
        ip[10..12].copy_from_slice(&sum);
        ip.extend(udp);
        ip
    }

    /// An IPv6 UDP packet (checksum mandatory) to be carried inside IP6IP6.
    fn inner_v6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut udp = udp_header(sport, dport, payload);
        let len = u16::try_from(udp.len()).expect("short packet");
        let mut pseudo = Vec::new();
        pseudo.extend(src.octets());
        pseudo.extend(dst.octets());
        pseudo.extend(u32::from(len).to_be_bytes());
        pseudo.extend([0, 0, 0, 17]);
        pseudo.extend(&udp);
        let sum = match checksum(&pseudo, 0) {
            0 => 0xffff,
            s => s,
        };
        udp[6..8].copy_from_slice(&sum.to_be_bytes());
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend(len.to_be_bytes());
        ip.extend([17, 64]);
        ip.extend(src.octets());
        ip.extend(dst.octets());
        ip.extend(udp);
        ip
    }

    /// What a DSR load balancer does: the lb namespace sends an encapsulated query from the
    /// client to the VIP straight to a backend; the backend decapsulates it, answers from the
    /// VIP, and the answer reaches the client (routed by the lb's kernel).
    #[test]
    fn dsr_decap_delivers_encapsulated_queries_to_the_vip() {
        if skip_without_root("dsr_decap_delivers_encapsulated_queries_to_the_vip") {
            return;
        }
        let tb = Testbed::up().expect("testbed up");
        let mode = tb.dsr_decap().expect("dsr mode");
        assert_ne!(mode, DsrDecap::None, "{}", DsrDecap::NONE_IS_A_FAILURE);
        println!("dsr decap mode: {mode:?}");
        let client_port = 40_000;
        for (i, v6) in [(1, false), (2, true), (3, false), (3, true)] {
            let (bind, inner, outer_dst, proto) = if v6 {
                let pkt = inner_v6(CLIENT_V6, DSR_VIP_V6, client_port, UDP_PORT, b"dsr?");
                (IpAddr::V6(CLIENT_V6), pkt, format!("IP6-SENDTO:[{}]:41", backend_v6(i)), "v6")
            } else {
                let pkt = inner_v4(CLIENT_V4, DSR_VIP_V4, client_port, UDP_PORT, b"dsr?");
                (IpAddr::V4(CLIENT_V4), pkt, format!("IP4-SENDTO:{}:4", backend_v4(i)), "v4")
            };
            let sock = tb
                .in_ns(Role::Client, move || UdpSocket::bind((bind, client_port)))
                .expect("enter client ns")
                .expect("bind client socket");
            sock.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
            let mut buf = [0_u8; 512];
            let mut reply = None;
            for _ in 0..3 {
                tb.exec_with_input(Role::Lb, &["socat", "-u", "STDIN", &outer_dst], &inner)
                    .expect("send encapsulated query");
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    reply = Some((String::from_utf8_lossy(&buf[..n]).trim_end().to_owned(), from));
                    break;
                }
            }
            let (text, from) = reply.unwrap_or_else(|| panic!("no DSR reply from be{i} ({proto})"));
            let vip = if v6 { IpAddr::V6(DSR_VIP_V6) } else { IpAddr::V4(DSR_VIP_V4) };
            assert_eq!(from.ip(), vip, "the reply must come from the VIP ({proto})");
            assert_eq!(from.port(), UDP_PORT);
            let r = ServiceReply::parse(&text).expect("reply");
            assert_eq!(r, ServiceReply { backend: format!("be{i}"), peer: bind }, "{proto}");
        }
    }
}
