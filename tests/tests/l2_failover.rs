//! L2 announcement across three xlb nodes and its failover (issue 12, "How it is proven": the
//! owner is killed, another node answers ARP and sends a gratuitous ARP; the client's
//! connections recover within the measured failover time).
//!
//! One L2 segment (a bridge in a namespace of its own) holds three xlb nodes `n1`..`n3`, two
//! backends, a client and a probe. The nodes run `xlb run --kubeconfig` against one in-process
//! fake API server (listening on the bridge's address), which holds a Maglev (`mh`) DSR-L2
//! LoadBalancer Service with an IPv4 VIP and one with an IPv6 VIP chosen to have the same
//! owner, and the nodes' membership Leases (`announce.l2`: lease 2 s, renewed every 500 ms).
//!
//! - The owner `xlb::announce::l2::owner` computes from the three names is the only node that
//!   answers ARP for the VIP (the probe broadcasts a request every 50 ms) and Neighbor
//!   Solicitations for the IPv6 VIP.
//! - 20 long-lived TCP streams from the client run through the owner; it is killed with
//!   SIGKILL. Measured from the kill (tcpdump time stamps, one clock): the first ARP reply from
//!   another node, the gratuitous ARP and the unsolicited Neighbor Advertisement the client
//!   receives from it, the client's neighbour entry, and the time until every stream echoes
//!   again. Asserted: the new owner is the one `owner` computes over the two left, the first
//!   reply comes within the lease duration + 1 s, no stream breaks, and the new owner picked
//!   the streams up (`flow_picked_up`). The dead owner's bridge port goes down with it, so the
//!   bridge floods the client's frames for its MAC until the gratuitous ARP: the third node
//!   passes them to its kernel (`l2_other_host`) and forwards none.
//! - The new owner then stops cleanly (SIGTERM): its Lease is deleted and the last node
//!   answers within 1 s, far below the lease duration.
//!
//! The probe sends the ARP requests so that the client's neighbour table is changed only by
//! what the nodes send it unasked (the take-over frames), not by replies to the probe.
//!
//! Needs root, `tcpdump` and `ethtool` (scripts/install-deps.sh).

#[path = "../../control/tests/support/mod.rs"]
mod support;

#[cfg(test)]
mod l2_failover {
    use std::collections::BTreeSet;
    use std::net::{IpAddr, SocketAddr};
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex, mpsc};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use nic_config::{Steering, XdpMode};
    use serde_json::{Value, json};
    use xlb_e2e::load::{EchoServer, Streams};
    use xlb_e2e::{XlbStats, netns_path, wait_for, xlb_binary};
    use xlb_testkit::{ChildGuard, Netns, have_tool, skip_without_root};

    use crate::support::fake_apiserver::{FakeApiServer, Res};
    use crate::support::{kubeconfig, node};

    const NODES: [&str; 3] = ["n1", "n2", "n3"];
    const VIP: &str = "10.252.1.100";
    /// Candidates for the IPv6 VIP: the first whose owner among the three nodes is the IPv4
    /// VIP's, so that killing that one owner moves both.
    const VIP6_BASE: u128 = 0xfd00_0252_0000_0000_0000_0000_0000_0100;
    const PORT: u16 = 9100;
    const LEASE: Duration = Duration::from_secs(2);
    const RENEW: Duration = Duration::from_millis(500);
    /// The failover bound asserted: a node that dies is dropped by the others at most the
    /// lease duration after they last saw it renew (so after its death), plus one control-loop
    /// tick (0.2 s), the take-over frame and the probe's 50 ms between requests; 1 s covers
    /// those with room for a loaded machine.
    const BOUND: Duration = Duration::from_secs(LEASE.as_secs() + 1);
    const STREAMS: usize = 20;

    fn node_v4(k: usize) -> String {
        format!("10.252.1.1{k}")
    }

    /// A line of a capture: (time stamp in seconds since the epoch, source MAC, the rest).
    type Line = (f64, String, String);

    /// `tcpdump -l -n -e -tt` on `eth0` of a namespace, its lines collected as they come.
    struct Capture {
        lines: Arc<Mutex<Vec<Line>>>,
        _child: ChildGuard,
    }

    impl Capture {
        fn start(ns: &Netns, filter: &str) -> Self {
            let mut child = ChildGuard::new(
                Command::new("ip")
                    .args(["netns", "exec", ns.name(), "tcpdump", "-l", "-n", "-e", "-tt", "-i", "eth0", filter])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("tcpdump runs"),
            );
            let lines = Arc::new(Mutex::new(Vec::new()));
            let stdout = child.child().stdout.take().expect("stdout");
            let l2 = lines.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                    let mut w = line.splitn(3, ' ');
                    let (Some(ts), Some(mac), Some(rest)) = (w.next(), w.next(), w.next()) else { continue };
                    let Ok(ts) = ts.parse::<f64>() else { continue };
                    l2.lock().unwrap().push((ts, mac.to_owned(), rest.to_owned()));
                }
            });
            // tcpdump says "listening on eth0" on stderr once it captures.
            let stderr = child.child().stderr.take().expect("stderr");
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                let mut tx = Some(tx);
                for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("listening on")
                        && let Some(tx) = tx.take()
                    {
                        let _ = tx.send(());
                    }
                }
            });
            rx.recv_timeout(Duration::from_secs(10)).expect("tcpdump listening");
            Self { lines, _child: child }
        }

        fn lines(&self) -> Vec<Line> {
            self.lines.lock().unwrap().clone()
        }
    }

    /// Broadcasts an ARP request for `VIP` every 50 ms from `eth0` of a namespace (a packet
    /// socket: arping's interval is whole seconds), until dropped.
    struct ArpProbe {
        stop: Arc<std::sync::atomic::AtomicBool>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl ArpProbe {
        fn start(ns: &Netns, sender: std::net::Ipv4Addr) -> Self {
            use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, sendto, socket};
            use std::os::fd::AsRawFd as _;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            let (tx, rx) = mpsc::channel();
            let thread = xlb_e2e::load::spawn_in_netns(&netns_path(ns.name()), "arp-probe", move || {
                let link = nix::ifaddrs::getifaddrs()
                    .expect("getifaddrs")
                    .filter(|a| a.interface_name == "eth0")
                    .find_map(|a| a.address.and_then(|s| s.as_link_addr().copied()))
                    .expect("eth0's link address");
                let mac = link.addr().expect("a MAC");
                let sock = socket(AddressFamily::Packet, SockType::Raw, SockFlag::SOCK_CLOEXEC, None).expect("socket");
                let target: std::net::Ipv4Addr = VIP.parse().unwrap();
                // RFC 826 request: broadcast, htype 1, ptype IPv4, opcode 1, tha zero.
                let mut f = [0u8; 42];
                f[0..6].copy_from_slice(&[0xff; 6]);
                f[6..12].copy_from_slice(&mac);
                f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
                f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
                f[22..28].copy_from_slice(&mac);
                f[28..32].copy_from_slice(&sender.octets());
                f[38..42].copy_from_slice(&target.octets());
                let _ = tx.send(());
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    sendto(sock.as_raw_fd(), &f, &link, MsgFlags::empty()).expect("send an ARP request");
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
            .expect("probe thread");
            rx.recv_timeout(Duration::from_secs(5)).expect("probe sending");
            Self { stop, thread: Some(thread) }
        }
    }

    impl Drop for ArpProbe {
        fn drop(&mut self) {
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn epoch_now() -> f64 {
        SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
    }

    fn mac_of(ns: &Netns) -> String {
        ns.ip(&["-br", "link", "show", "dev", "eth0"]).split_whitespace().nth(2).expect("MAC").to_lowercase()
    }

    /// ARP replies for `VIP` in a capture after `since`: (time stamp, MAC answered with).
    fn arp_replies(c: &Capture, since: f64) -> Vec<(f64, String)> {
        let want = format!("Reply {VIP} is-at ");
        c.lines()
            .into_iter()
            .filter(|(ts, _, _)| *ts > since)
            .filter_map(|(ts, _, rest)| {
                let mac = rest.split(&want).nth(1)?.split([',', ' ']).next()?.to_lowercase();
                Some((ts, mac))
            })
            .collect()
    }

    /// Gratuitous ARP requests for `VIP` (sender address = target address) after `since`:
    /// (time stamp, source MAC). tcpdump prints a non-zero target hardware address in
    /// parentheses after the target address.
    fn garps(c: &Capture, since: f64) -> Vec<(f64, String)> {
        let (who, tell) = (format!("Request who-has {VIP} "), format!(" tell {VIP},"));
        c.lines()
            .into_iter()
            .filter(|(ts, _, rest)| *ts > since && rest.contains(&who) && rest.contains(&tell))
            .map(|(ts, mac, _)| (ts, mac.to_lowercase()))
            .collect()
    }

    /// Neighbor Advertisements for `target` after `since`, to `to` (`ff02::1`: unsolicited,
    /// or the solicitation's source): (time stamp, source MAC).
    fn nas(c: &Capture, since: f64, target: &str, to: &str) -> Vec<(f64, String)> {
        let (adv, dst) = (format!("neighbor advertisement, tgt is {target},"), format!(" > {to}: ICMP6"));
        c.lines()
            .into_iter()
            .filter(|(ts, _, rest)| *ts > since && rest.contains(&adv) && rest.contains(&dst))
            .map(|(ts, mac, _)| (ts, mac.to_lowercase()))
            .collect()
    }

    fn lb_service(name: &str, vip: &str, cluster_ip: &str, family: &str) -> Value {
        json!({
            "metadata": {"namespace": "demo", "name": name,
                         "annotations": {"xlb.dev/scheduler": "mh", "xlb.dev/forwarding-mode": "dsr-l2"}},
            "spec": {"type": "LoadBalancer", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                     "ipFamilies": [family], "externalTrafficPolicy": "Cluster",
                     "ports": [{"name": "echo", "port": PORT, "targetPort": PORT, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": vip}]}},
        })
    }

    fn slice(name: &str, svc: &str, family: &str, addrs: &[String]) -> Value {
        json!({
            "metadata": {"namespace": "demo", "name": name, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": family,
            "endpoints": addrs.iter().enumerate().map(|(i, a)| json!({
                "addresses": [a], "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("be{}", i + 1)})).collect::<Vec<_>>(),
            "ports": [{"name": "echo", "port": PORT, "protocol": "TCP"}],
        })
    }

    fn xlb_config(k: usize) -> String {
        format!(
            "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\nnodeName: n{k}\nnodeAddresses: [{}]\n\
             shutdownGracePeriod: 0s\nminSyncPeriod: 200ms\nhealthzBindAddress: 127.0.0.1:10256\n\
             metricsBindAddress: 127.0.0.1:10249\ninterfaces: [{{name: eth0, queues: [0]}}]\ncores: [{}]\n\
             announce:\n  mode: l2\n  l2: {{leaseDuration: {}s, renewInterval: {}ms}}\n",
            node_v4(k),
            (k + 1) % 2,
            LEASE.as_secs(),
            RENEW.as_millis()
        )
    }

    /// One xlb node's process (`ip netns exec` execs xlb, so the pid is xlb's).
    struct Node {
        ns: Netns,
        mac: String,
        dir: std::path::PathBuf,
        xlb: Option<ChildGuard>,
    }

    impl Node {
        fn log(&self) -> String {
            std::fs::read_to_string(self.dir.join("xlb.log")).unwrap_or_default()
        }

        fn stats(&self, bin: &Path) -> XlbStats {
            let out = Command::new(bin)
                .args(["stats", "--admin-socket"])
                .arg(self.dir.join("admin.sock"))
                .output()
                .expect("xlb stats");
            XlbStats::parse(&String::from_utf8_lossy(&out.stdout))
        }
    }

    fn logs(nodes: &[Node]) -> String {
        nodes.iter().map(|n| format!("--- {} ({}) ---\n{}", n.ns.name(), n.mac, n.log())).collect()
    }

    fn secs(d: f64) -> String {
        format!("{:.3} s", d)
    }

    #[test]
    fn the_owner_alone_answers_and_another_node_takes_over_within_the_lease_when_it_dies() {
        let name = "the_owner_alone_answers_and_another_node_takes_over_within_the_lease_when_it_dies";
        if skip_without_root(name) {
            return;
        }
        for (tool, arg) in [("tcpdump", "--version"), ("ethtool", "--version")] {
            if !have_tool(tool, arg) {
                eprintln!("SKIP {name}: {tool} missing: run scripts/install-deps.sh");
                return;
            }
        }
        let bin = xlb_binary().expect("xlb binary");
        let run = tempfile::tempdir().expect("run dir");
        let vip: IpAddr = VIP.parse().unwrap();
        let owner = xlb::announce::l2::owner(vip, NODES).expect("an owner").to_owned();
        let vip6: IpAddr = (0..256u128)
            .map(|i| IpAddr::from(std::net::Ipv6Addr::from(VIP6_BASE + i)))
            .find(|v| xlb::announce::l2::owner(*v, NODES) == Some(owner.as_str()))
            .expect("an IPv6 VIP with the same owner");
        let vip6_s = vip6.to_string();
        let left: Vec<&str> = NODES.iter().copied().filter(|n| *n != owner).collect();
        let heir = xlb::announce::l2::owner(vip, left.iter().copied()).expect("an heir").to_owned();
        let last = left.iter().copied().find(|n| *n != heir).expect("a third node").to_owned();
        assert_eq!(xlb::announce::l2::owner(vip6, left.iter().copied()), Some(heir.as_str()), "{vip6} moves alike");

        // The segment: a bridge (the API server listens on its address), every other namespace
        // one port of it. Multicast snooping off: Neighbor Solicitations reach every node.
        let sw = Netns::new("l2f");
        sw.sh(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]);
        sw.ip(&["link", "add", "br0", "type", "bridge", "stp_state", "0", "mcast_snooping", "0"]);
        sw.ip(&["addr", "add", "10.252.1.1/24", "dev", "br0"]);
        sw.ip(&["link", "set", "br0", "up"]);
        let attach = |ns: &Netns, port: &str, v4: &str, v6: &str| {
            xlb_testkit::sh(&[
                "ip",
                "link",
                "add",
                "eth0",
                "netns",
                ns.name(),
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                sw.name(),
            ]);
            sw.ip(&["link", "set", port, "master", "br0", "up"]);
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
            ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", "eth0", "nodad"]);
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.sh(&["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]);
        };
        let mut nodes = Vec::new();
        // veth delivers a frame sent with XDP_TX only to a peer whose receive side runs NAPI:
        // a pass-everything program (a steering program with empty maps) on each node's port.
        let mut pass = Vec::new();
        for k in 1..=3 {
            let ns = Netns::new("l2f");
            attach(&ns, &format!("n{k}"), &node_v4(k), &format!("fd00:252::1{k}"));
            pass.push(sw.run_in(|| Steering::attach(&format!("n{k}"), XdpMode::Native).expect("pass program")));
            let dir = run.path().join(format!("n{k}"));
            std::fs::create_dir_all(&dir).unwrap();
            nodes.push(Node { mac: mac_of(&ns), ns, dir, xlb: None });
        }
        let mut backends = Vec::new();
        for i in 1..=2 {
            let ns = Netns::new("l2f");
            attach(&ns, &format!("be{i}"), &format!("10.252.1.2{i}"), &format!("fd00:252::2{i}"));
            // DSR-L2: the backend holds the VIP and never answers ARP for it.
            ns.sh(&[
                "sysctl",
                "-qw",
                "net.ipv4.conf.all.arp_ignore=1",
                "net.ipv4.conf.all.arp_announce=2",
                "net.ipv4.conf.eth0.arp_ignore=1",
                "net.ipv4.conf.eth0.arp_announce=2",
            ]);
            ns.ip(&["addr", "add", &format!("{VIP}/32"), "dev", "lo"]);
            ns.sh(&["ethtool", "-K", "eth0", "tx", "off"]);
            backends.push(ns);
        }
        let client = Netns::new("l2f");
        attach(&client, "client", "10.252.1.2", "fd00:252::2");
        client.sh(&["ethtool", "-K", "eth0", "tx", "off"]);
        let probe = Netns::new("l2f");
        attach(&probe, "probe", "10.252.1.3", "fd00:252::3");
        let echo = EchoServer::start_in(
            &backends
                .iter()
                .enumerate()
                .map(|(i, ns)| (u8::try_from(i + 1).unwrap(), netns_path(ns.name())))
                .collect::<Vec<_>>(),
            PORT,
        )
        .expect("echo servers");

        // The API server, on the bridge's address in the switch namespace.
        let (url_tx, url_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let sw_path = netns_path(sw.name());
        let server = std::thread::spawn(move || {
            let f = std::fs::File::open(&sw_path).expect("netns file");
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            let api = rt.block_on(FakeApiServer::start_at("10.252.1.1:0".parse().unwrap(), 1));
            for k in 1..=3 {
                api.apply(Res::Nodes, node(&format!("n{k}"), &node_v4(k)));
            }
            api.apply(Res::Services, lb_service("echo", VIP, "10.252.200.1", "IPv4"));
            api.apply(
                Res::EndpointSlices,
                slice("echo-1", "echo", "IPv4", &["10.252.1.21".into(), "10.252.1.22".into()]),
            );
            api.apply(Res::Services, lb_service("echo6", &vip6.to_string(), "fd00:252:200::1", "IPv6"));
            api.apply(
                Res::EndpointSlices,
                slice("echo6-1", "echo6", "IPv6", &["fd00:252::21".into(), "fd00:252::22".into()]),
            );
            url_tx.send(api.url()).expect("url");
            let _ = done_rx.recv();
            drop(api);
        });
        let url = url_rx.recv_timeout(Duration::from_secs(20)).expect("API server up");
        let probe_cap = Capture::start(&probe, "arp");
        let client_cap = Capture::start(&client, "arp or icmp6");

        for (k, n) in nodes.iter_mut().enumerate() {
            let k = k + 1;
            std::fs::write(n.dir.join("xlb.yaml"), xlb_config(k)).unwrap();
            std::fs::write(n.dir.join("kubeconfig"), kubeconfig(&url)).unwrap();
            let log = std::fs::File::create(n.dir.join("xlb.log")).unwrap();
            let child = Command::new("ip")
                .args(["netns", "exec", n.ns.name()])
                .arg(&bin)
                .args(["run", "--config"])
                .arg(n.dir.join("xlb.yaml"))
                .arg("--kubeconfig")
                .arg(n.dir.join("kubeconfig"))
                .arg("--admin-socket")
                .arg(n.dir.join("admin.sock"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("xlb starts");
            n.xlb = Some(ChildGuard::graceful(child, Duration::from_secs(5)));
        }
        let mac = |name: &str| nodes[NODES.iter().position(|n| *n == name).unwrap()].mac.clone();
        let (owner_mac, heir_mac, last_mac) = (mac(&owner), mac(&heir), mac(&last));
        println!("owner {owner} {owner_mac}, then {heir} {heir_mac}, then {last} {last_mac}; IPv6 VIP {vip6}");

        // The probe broadcasts an ARP request every 50 ms from now on.
        let _probe = ArpProbe::start(&probe, "10.252.1.3".parse().unwrap());
        let started = Instant::now();
        let settled = wait_for(Duration::from_secs(30), || {
            let r = arp_replies(&probe_cap, 0.0);
            (r.len() >= 10 && r.iter().rev().take(10).all(|(_, m)| *m == owner_mac)).then(|| r.last().unwrap().0)
        })
        .unwrap_or_else(|| {
            panic!("{owner} never answered alone: {:?}\n{}", arp_replies(&probe_cap, 0.0), logs(&nodes))
        });
        println!("the owner answered ARP alone {:?} after the three xlb started", started.elapsed());
        let window = wait_for(Duration::from_secs(10), || {
            let r = arp_replies(&probe_cap, settled);
            (r.len() >= 20).then_some(r)
        })
        .expect("20 more replies");
        let macs: BTreeSet<String> = window.iter().map(|(_, m)| m.clone()).collect();
        assert_eq!(macs, [owner_mac.clone()].into(), "only the owner answers ARP");

        // IPv6: the owner alone answers the client's Neighbor Solicitations.
        let t6 = epoch_now();
        for round in 0..3 {
            client.ip(&["-6", "neigh", "flush", "dev", "eth0"]);
            let _ = client.exec(&["ping", "-6", "-c", "1", "-W", "1", &vip6_s]);
            let resolved = wait_for(Duration::from_secs(3), || {
                let n = client.ip(&["-6", "neigh", "show", &vip6_s, "dev", "eth0"]).to_lowercase();
                n.contains(&owner_mac).then_some(n)
            });
            assert!(resolved.is_some(), "round {round}: the client resolved {vip6_s} to {owner_mac}\n{}", logs(&nodes));
        }
        let answers = wait_for(Duration::from_secs(3), || {
            let a = nas(&client_cap, t6, &vip6_s, "fd00:252::2");
            (a.len() >= 3).then_some(a)
        })
        .expect("three solicited Neighbor Advertisements");
        let macs: BTreeSet<String> = answers.iter().map(|(_, m)| m.clone()).collect();
        assert_eq!(macs, [owner_mac.clone()].into(), "only the owner answers Neighbor Solicitations");

        // Long-lived streams through the owner.
        let dest = SocketAddr::new(vip, PORT);
        let streams = Streams::open_from(
            &netns_path(client.name()),
            dest,
            STREAMS,
            Duration::from_millis(20),
            Duration::from_secs(20),
        )
        .expect("streams open");
        wait_for(Duration::from_secs(10), || streams.echoes().iter().all(|e| *e >= 5).then_some(()))
            .expect("every stream echoes");
        let neigh = client.ip(&["neigh", "show", VIP, "dev", "eth0"]).to_lowercase();
        assert!(neigh.contains(&owner_mac), "the client sends the VIP's traffic to the owner: {neigh}");

        // The owner dies.
        let i_owner = NODES.iter().position(|n| *n == owner).unwrap();
        let before = streams.echoes();
        let killed = epoch_now();
        let killed_at = Instant::now();
        let mut dead = nodes[i_owner].xlb.take().expect("owner running").into_inner();
        dead.kill().expect("kill -9");
        // ... and its link goes down, as with a node that loses power: the bridge forgets its
        // MAC and floods the client's frames for it to every port until the gratuitous ARP.
        sw.ip(&["link", "set", &owner, "down"]);
        let _ = dead.wait();

        let answered = wait_for(BOUND + Duration::from_secs(5), || {
            arp_replies(&probe_cap, killed).into_iter().find(|(_, m)| *m != owner_mac)
        })
        .unwrap_or_else(|| panic!("no other node answered ARP after the kill\n{}", logs(&nodes)));
        assert_eq!(answered.1, heir_mac, "the new owner is {heir}, the owner among the two left");
        let garp = wait_for(Duration::from_secs(3), || garps(&client_cap, killed).into_iter().next())
            .unwrap_or_else(|| panic!("the client saw no gratuitous ARP after the kill\n{}", logs(&nodes)));
        assert_eq!(garp.1, heir_mac, "the gratuitous ARP comes from the new owner");
        let una = wait_for(Duration::from_secs(3), || nas(&client_cap, killed, &vip6_s, "ff02::1").into_iter().next())
            .unwrap_or_else(|| panic!("the client saw no unsolicited NA after the kill\n{}", logs(&nodes)));
        assert_eq!(una.1, heir_mac, "the unsolicited NA comes from the new owner");
        let neigh = wait_for(Duration::from_secs(3), || {
            let n = client.ip(&["neigh", "show", VIP, "dev", "eth0"]).to_lowercase();
            n.contains(&heir_mac).then(|| (killed_at.elapsed(), n))
        })
        .expect("the client's neighbour entry moves to the new owner");
        let recovered = wait_for(Duration::from_secs(20), || {
            let now = streams.echoes();
            now.iter().zip(&before).all(|(n, b)| *n >= b + 3).then(|| killed_at.elapsed())
        });
        let picked_up = nodes[NODES.iter().position(|n| *n == heir).unwrap()].stats(&bin).event("flow_picked_up");
        // The third node got the flooded frames too, addressed to the dead owner's MAC: its
        // steering program passed them to its kernel (which drops them) instead of forwarding.
        let i_last = NODES.iter().position(|n| *n == last).unwrap();
        let series = "xlb_steering_packets_total{interface=\"eth0\",action=\"l2_other_host\"} ";
        let other_host = wait_for(Duration::from_secs(3), || {
            let m = nodes[i_last].ns.sh(&["curl", "-sS", "--max-time", "2", "http://127.0.0.1:10249/metrics"]);
            m.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<u64>().ok()).filter(|v| *v > 0)
        });
        let last_picked_up = nodes[i_last].stats(&bin).event("flow_picked_up");
        let reports = streams.finish();
        let broken: Vec<_> = reports.iter().filter(|r| r.broken.is_some()).collect();
        let max_gap = reports.iter().map(|r| r.max_gap).max().unwrap_or_default();
        let failover = answered.0 - killed;
        println!(
            "kill -9 of {owner}: first ARP reply from {heir} after {}, gratuitous ARP at the client after {}, \
             unsolicited NA after {}, client's neighbour entry seen moved after {:?}, every stream echoing again \
             after {recovered:?}; streams: {} of {STREAMS} broken, longest gap {max_gap:?}; {heir} flow_picked_up {picked_up} \
             (lease {LEASE:?}, renew {RENEW:?}, bound {BOUND:?}); flooded frames passed by {last}: {other_host:?}, \
             picked up by it: {last_picked_up}",
            secs(failover),
            secs(garp.0 - killed),
            secs(una.0 - killed),
            neigh.0,
            broken.len()
        );
        assert!(
            failover >= (LEASE - RENEW).as_secs_f64() - 0.2,
            "taken over after {failover:.3} s: before the lease could expire"
        );
        assert!(failover <= BOUND.as_secs_f64(), "taken over after {failover:.3} s, bound {BOUND:?}\n{}", logs(&nodes));
        assert!(broken.is_empty(), "broken streams: {broken:?}");
        // TCP retransmits a lost segment with exponential backoff from a 200 ms RTO: the first
        // retransmission after the take-over at f comes by 2 f + 0.2 s.
        let recovered = recovered.expect("every stream echoed again");
        assert!(
            recovered <= BOUND * 2 + Duration::from_millis(500),
            "streams recovered after {recovered:?}, beyond TCP's first retransmission after the bound"
        );
        assert!(picked_up > 0, "{heir} picked the moved streams up");
        assert!(other_host.is_some(), "{last} saw the flooded frames and passed them (l2_other_host)");
        assert_eq!(last_picked_up, 0, "{last}, not the owner, forwarded none of the flooded frames");
        drop(echo);

        // A clean stop: the Lease is deleted, the last node takes over at once.
        let i_heir = NODES.iter().position(|n| *n == heir).unwrap();
        let stopped = epoch_now();
        let status = nodes[i_heir].xlb.as_mut().expect("heir running").terminate(Duration::from_secs(5));
        assert!(status.is_some_and(|s| s.success()), "{heir} stops cleanly: {status:?}\n{}", nodes[i_heir].log());
        let answered = wait_for(Duration::from_secs(5), || {
            arp_replies(&probe_cap, stopped).into_iter().find(|(_, m)| *m == last_mac)
        })
        .unwrap_or_else(|| panic!("{last} did not take over after {heir}'s clean stop\n{}", logs(&nodes)));
        let handed = answered.0 - stopped;
        println!("SIGTERM of {heir}: first ARP reply from {last} after {}", secs(handed));
        assert!(handed < 1.0, "a clean stop hands over at once, not after the lease ({handed:.3} s)");
        let others = arp_replies(&probe_cap, answered.0).into_iter().filter(|(_, m)| *m != last_mac).count();
        assert_eq!(others, 0, "only {last} answers now");

        let _ = done_tx.send(());
        server.join().expect("API server thread");
        drop(pass);
    }
}
