//! L2 announcement end to end: `xlb run` with `announce.mode: l2` on the testbed's lb node.
//! The client reaches the LoadBalancer ingress IP of `demo/routed` on-link (no route via the
//! lb): it must resolve the VIP by ARP, which xlb's steering program answers with the lb's MAC,
//! and xlb's gratuitous ARP at start must move an entry the client had for another MAC. Only
//! the Service's port answers on the VIP, and nothing answers ARP for its ClusterIP.
//!
//! Needs root and `arping` (iputils-arping, installed by `scripts/install-deps.sh`).
//!
//! veth delivers a frame sent back with `XDP_TX` only to a peer whose receive side runs NAPI:
//! the test puts a pass-everything program (a steering program with empty maps) on the lb's
//! port in the switch namespace; a physical NIC needs nothing of the kind.

#[cfg(test)]
mod l2 {
    use std::time::{Duration, Instant};

    use nic_config::{Steering, XdpMode};
    use xlb_e2e::{Role, Testbed, Xlb, skip_without_root, wait_for, xlb_binary};
    use xlb_testkit::have_tool;

    const CONFIG: &str = include_str!("../../deploy/examples/testbed.yaml");
    /// LoadBalancer ingress IP of `demo/routed` (TCP 80, eTP Cluster).
    const VIP: &str = "10.250.100.23";
    /// ClusterIP of `demo/routed`: on no interface, answered by no host (L2-01).
    const CLUSTER_IP: &str = "10.250.100.20";

    fn config() -> String {
        CONFIG.replace(
            "forwardingMode: nat\n",
            "forwardingMode: nat\nhandleDefaultLoadBalancerClass: true\nannounce: {mode: l2}\n",
        )
    }

    fn mac_of(tb: &Testbed, role: Role, ifname: &str) -> String {
        let out = tb.exec_ok(role, &["ip", "-br", "link", "show", "dev", ifname]).expect("ip link");
        out.split_whitespace().nth(2).expect("MAC").to_owned()
    }

    fn client_neigh(tb: &Testbed) -> String {
        tb.exec_ok(Role::Client, &["ip", "neigh", "show", VIP, "dev", "eth0"]).unwrap_or_default()
    }

    /// `arping -b -c N` from the client (broadcast requests, one a second); (replies,
    /// mean reply time in ms as arping prints it, MACs seen). Panics if arping did not run
    /// (exit status 2), so "no reply" is never a usage error.
    fn arping(tb: &Testbed, target: &str, count: u32) -> (u32, f64, Vec<String>) {
        let n = count.to_string();
        let out = tb.exec(Role::Client, &["arping", "-b", "-c", &n, "-I", "eth0", target]).expect("arping");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            matches!(out.status.code(), Some(0 | 1)) && text.contains("Sent"),
            "arping {target} did not run: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (mut replies, mut total, mut macs) = (0u32, 0.0f64, Vec::new());
        for line in text.lines().filter(|l| l.contains("reply from")) {
            replies += 1;
            if let Some(mac) = line.split('[').nth(1).and_then(|r| r.split(']').next()) {
                let mac = mac.to_lowercase();
                if !macs.contains(&mac) {
                    macs.push(mac);
                }
            }
            if let Some(ms) =
                line.split_whitespace().find_map(|w| w.strip_suffix("ms")).and_then(|v| v.parse::<f64>().ok())
            {
                total += ms;
            }
        }
        println!("arping {target}: {}", text.lines().rev().take(3).collect::<Vec<_>>().join(" | "));
        (replies, if replies > 0 { total / f64::from(replies) } else { f64::NAN }, macs)
    }

    #[test]
    fn the_vip_is_answered_by_arp_after_a_gratuitous_arp_and_only_its_service_port_connects() {
        let name = "the_vip_is_answered_by_arp_after_a_gratuitous_arp_and_only_its_service_port_connects";
        if skip_without_root(name) {
            return;
        }
        if !have_tool("arping", "-V") {
            eprintln!("SKIP {name}: arping missing (iputils-arping): run scripts/install-deps.sh");
            return;
        }
        xlb_binary().expect("xlb binary");
        let tb = Testbed::up().expect("testbed up");
        let _pass = tb
            .in_ns(Role::Switch, || Steering::attach("lb", XdpMode::Native).expect("pass program on the port"))
            .unwrap();
        // The VIP on-link for the client (more specific than the testbed's route via the lb).
        tb.exec_ok(Role::Client, &["ip", "route", "add", &format!("{VIP}/32"), "dev", "eth0"]).unwrap();
        let lb_mac = mac_of(&tb, Role::Lb, "eth0");

        tb.exec_ok(Role::Client, &["ip", "route", "add", &format!("{CLUSTER_IP}/32"), "dev", "eth0"]).unwrap();

        // Without xlb nobody answers for the VIP.
        let (replies, _, _) = arping(&tb, VIP, 2);
        assert_eq!(replies, 0, "no answer for {VIP} before xlb runs");

        // The client believes the VIP lives at another MAC (a previous owner).
        tb.exec_ok(
            Role::Client,
            &["ip", "neigh", "replace", VIP, "lladdr", "02:00:00:00:00:99", "dev", "eth0", "nud", "stale"],
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(1200)); // ARP's locktime (1 s)
        let started = Instant::now();
        let xlb = Xlb::start(&tb, &config()).expect("xlb starts");
        let moved =
            wait_for(Duration::from_secs(10), || client_neigh(&tb).contains(&lb_mac).then(|| started.elapsed()));
        assert!(
            moved.is_some(),
            "the gratuitous ARP moves the client's entry to {lb_mac}: {}; log:\n{}",
            client_neigh(&tb),
            xlb.log()
        );
        println!("client's entry moved to the lb's MAC {:?} after `xlb run` started", moved.unwrap());
        assert!(xlb.log().contains("gratuitous ARP"), "{}", xlb.log());

        // ARP answered by the steering program, with the lb's MAC.
        tb.exec_ok(Role::Client, &["ip", "neigh", "flush", "dev", "eth0"]).unwrap();
        let (replies, avg_ms, macs) = arping(&tb, VIP, 10);
        assert_eq!(macs, vec![lb_mac.clone()], "only the lb answers");
        assert_eq!(replies, 10, "every ARP request answered");
        let (own_replies, own_ms, _) = arping(&tb, "10.250.1.1", 10);
        println!(
            "arping -b -c 10: VIP answered by XDP {replies}/10, mean {avg_ms:.3} ms; the lb's own address \
             answered by the kernel {own_replies}/10, mean {own_ms:.3} ms"
        );
        assert_eq!(own_replies, 10, "the host's own ARP still answered");
        // The same Service's ClusterIP is never answered: no host owns it (L2-01).
        let (replies, _, _) = arping(&tb, CLUSTER_IP, 2);
        assert_eq!(replies, 0, "no answer for the ClusterIP {CLUSTER_IP}");

        // The Service's port connects; nothing else on the VIP does. Worst case: the host
        // holds the VIP itself (as kube-proxy's IPVS mode puts it on kube-ipvs0) and listens
        // on every address, so whatever reaches its kernel would be answered.
        tb.exec_ok(Role::Lb, &["ip", "addr", "add", &format!("{VIP}/32"), "dev", "lo"]).unwrap();
        let body = tb.curl(Role::Client, &format!("http://{VIP}/")).expect("HTTP to the VIP");
        assert!(body.contains("be2") || body.contains("be3"), "{body}");
        let _listener = tb.spawn_in(Role::Lb, "listener", || {
            std::net::TcpListener::bind("0.0.0.0:2222").map(|l| {
                l.set_nonblocking(true).ok();
                std::thread::sleep(Duration::from_secs(6));
            })
        });
        std::thread::sleep(Duration::from_millis(300));
        let host = tb.exec(Role::Client, &["timeout", "3", "bash", "-c", "exec 3<>/dev/tcp/10.250.1.1/2222"]).unwrap();
        assert!(host.status.success(), "the host's listener answers on its own address");
        let vip =
            tb.exec(Role::Client, &["timeout", "3", "bash", "-c", &format!("exec 3<>/dev/tcp/{VIP}/2222")]).unwrap();
        assert!(!vip.status.success(), "the host's listener must not answer on the VIP");
        let ping = tb.exec(Role::Client, &["ping", "-c", "1", "-W", "1", VIP]).unwrap();
        assert!(!ping.status.success(), "echo to the VIP is dropped");

        tb.exec_ok(Role::Lb, &["ip", "addr", "del", &format!("{VIP}/32"), "dev", "lo"]).unwrap();

        // A clean stop withdraws: no more answers.
        xlb.stop().expect("xlb stops");
        let (replies, _, _) = arping(&tb, VIP, 2);
        assert_eq!(replies, 0, "no answer for {VIP} after xlb stopped");
        tb.down().expect("testbed down");
    }
}
