//! BGP announcement through a real BIRD 2 (`xlb::announce::Bird`, called as a library): two
//! namespaces joined by a veth, a "router" BIRD and a "node" BIRD peering over eBGP (one IPv4
//! and one IPv6 session). The announcer writes the node's route files and reconfigures the
//! node's BIRD; the router's BIRD must learn the VIPs and, through its kernel protocol, put
//! them into the router namespace's kernel table, and lose them on withdrawal.
//!
//! Needs root and `bird`/`birdc` (Debian's `bird2`, installed by `scripts/install-deps.sh`).
//! Both daemons run in the test's own namespaces with their own sockets and pid files, in
//! the foreground, and are killed when the test ends; a system `bird` service is not touched.

#[cfg(test)]
mod bird {
    use std::net::IpAddr;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use xlb::announce::{AnnounceError, Announcer as _, Applied, Bird, PrefixSet};
    use xlb::config::BirdConfig;
    use xlb_testkit::{ChildGuard, Netns, have_tool, run, skip_without_root, wait_for};

    const VIP4: &str = "198.51.100.7";
    const VIP6: &str = "2001:db8:7::7";
    const VIP4_B: &str = "198.51.100.8";
    const ROUTER4: &str = "10.99.0.1";
    const NODE4: &str = "10.99.0.2";
    const ROUTER6: &str = "fd99::1";
    const NODE6: &str = "fd99::2";
    /// How long BGP may take to establish and to carry a change (connect delay 1 s).
    const BGP_WAIT: Duration = Duration::from_secs(20);

    fn set(addrs: &[&str]) -> PrefixSet {
        addrs.iter().map(|a| a.parse::<IpAddr>().expect("an address")).collect()
    }

    /// A BIRD running in the foreground inside a namespace, killed on drop.
    struct BirdDaemon {
        socket: PathBuf,
        _child: ChildGuard,
    }

    impl BirdDaemon {
        fn start(ns: &Netns, dir: &Path, name: &str, config: &str) -> Self {
            let conf = dir.join(format!("{name}.conf"));
            std::fs::write(&conf, config).expect("bird config");
            let socket = dir.join(format!("{name}.ctl"));
            let pid = dir.join(format!("{name}.pid"));
            let child = Command::new("ip")
                .args(["netns", "exec", ns.name(), "bird", "-f", "-c"])
                .arg(&conf)
                .arg("-s")
                .arg(&socket)
                .arg("-P")
                .arg(&pid)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("bird starts");
            let mut guard = ChildGuard::new(child);
            let up = wait_for(Duration::from_secs(10), "bird's socket", || {
                birdc(&socket, &["show", "status"]).contains("Daemon is up and running").then_some(())
            });
            if up.is_none() {
                let _ = guard.terminate(Duration::ZERO);
                let mut err = String::new();
                if let Some(mut e) = guard.child().stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                panic!("{name}: bird did not come up: {err}");
            }
            Self { socket, _child: guard }
        }

        fn birdc(&self, args: &[&str]) -> String {
            birdc(&self.socket, args)
        }
    }

    fn birdc(socket: &Path, args: &[&str]) -> String {
        let s = socket.to_string_lossy().into_owned();
        let mut v = vec!["birdc", "-s", &s];
        v.extend_from_slice(args);
        let out = run(&v);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// `show protocols NAME`'s line for `name`: `name BGP --- up SINCE Established`.
    fn protocol_line(d: &BirdDaemon, name: &str) -> String {
        d.birdc(&["show", "protocols", name]).lines().find(|l| l.starts_with(name)).unwrap_or_default().to_owned()
    }

    /// `birdc` output with every `HH:MM:SS.mmm` time replaced by `T`, and those times in ms.
    fn split_times(text: &str) -> (String, Vec<i64>) {
        let mut out = String::new();
        let mut times = Vec::new();
        for (i, word) in text.split(' ').enumerate() {
            if i > 0 {
                out.push(' ');
            }
            let w = word.trim_start_matches('[').trim_end_matches(']');
            let parts: Vec<&str> = w.split([':', '.']).collect();
            let nums: Option<Vec<i64>> = parts.iter().map(|p| p.parse::<i64>().ok()).collect();
            match nums.as_deref() {
                Some([h, m, s, ms]) if parts.get(3).is_some_and(|p| p.len() == 3) => {
                    times.push(((h * 60 + m) * 60 + s) * 1000 + ms);
                    out.push_str(&word.replace(w, "T"));
                }
                _ => out.push_str(word),
            }
        }
        (out, times)
    }

    /// Asserts that two `birdc` outputs are the same but for jitter in their times. BIRD prints
    /// a monotonic time stamp converted to wall-clock time, which moves by a millisecond from
    /// one command to the next; a withdrawal and re-announcement, or a session reset (the
    /// connect delay is 1 s), would move it by far more than 200 ms.
    fn assert_same_but_jitter(a: &str, b: &str, what: &str) {
        let ((sa, ta), (sb, tb)) = (split_times(a), split_times(b));
        assert_eq!(sa, sb, "{what}");
        assert_eq!(ta.len(), tb.len(), "{what}");
        for (x, y) in ta.iter().zip(&tb) {
            assert!((x - y).abs() < 200, "{what}: {a:?} vs {b:?}");
        }
    }

    fn router_config() -> String {
        format!(
            r#"router id {ROUTER4};
timeformat protocol iso long ms;
protocol device {{ scan time 1; }}
protocol kernel k4 {{ ipv4 {{ import none; export all; }}; }}
protocol kernel k6 {{ ipv6 {{ import none; export all; }}; }}
template bgp peer {{
  local as 65000;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
}}
protocol bgp node4 from peer {{
  local {ROUTER4} as 65000;
  neighbor {NODE4} as 65001;
  ipv4 {{ import all; export none; }};
}}
protocol bgp node6 from peer {{
  local {ROUTER6} as 65000;
  neighbor {NODE6} as 65001;
  ipv6 {{ import all; export none; }};
}}
"#
        )
    }

    /// The node's config: the recommended snippet of docs/operations.md around the two files.
    fn node_config(v4: &Path, v6: &Path) -> String {
        format!(
            r#"router id {NODE4};
protocol device {{ scan time 1; }}
protocol static xlb_vips4 {{
  ipv4;
  include "{}";
}}
protocol static xlb_vips6 {{
  ipv6;
  include "{}";
}}
template bgp tor {{
  local as 65001;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
}}
protocol bgp router4 from tor {{
  local {NODE4} as 65001;
  neighbor {ROUTER4} as 65000;
  ipv4 {{ import none; export where proto = "xlb_vips4"; }};
}}
protocol bgp router6 from tor {{
  local {NODE6} as 65001;
  neighbor {ROUTER6} as 65000;
  ipv6 {{ import none; export where proto = "xlb_vips6"; }};
}}
"#,
            v4.display(),
            v6.display()
        )
    }

    /// The router namespace's kernel route to `addr`, if any (`ip route show ADDR`).
    fn kernel_route(router: &Netns, addr: &str) -> String {
        let fam = if addr.contains(':') { "-6" } else { "-4" };
        let out = router.exec(&["ip", fam, "route", "show", addr]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits until the router's BIRD and its kernel both route `addr` via `via`.
    fn wait_learned(router_bird: &BirdDaemon, router: &Netns, addr: &str, via: &str) {
        let len = if addr.contains(':') { 128 } else { 32 };
        let prefix = format!("{addr}/{len}");
        let seen = wait_for(BGP_WAIT, "route learned", || {
            let r = router_bird.birdc(&["show", "route", &prefix]);
            let k = kernel_route(router, addr);
            (r.contains(&prefix) && r.contains(via) && k.contains(&format!("via {via}")) && k.contains("proto bird"))
                .then_some(())
        });
        assert!(
            seen.is_some(),
            "the router did not learn {prefix} via {via}: bird: {} kernel: {:?}",
            router_bird.birdc(&["show", "route", &prefix]),
            kernel_route(router, addr)
        );
    }

    /// Waits until neither the router's BIRD nor its kernel has a route to `addr`.
    fn wait_withdrawn(router_bird: &BirdDaemon, router: &Netns, addr: &str) {
        let len = if addr.contains(':') { 128 } else { 32 };
        let prefix = format!("{addr}/{len}");
        let gone = wait_for(BGP_WAIT, "route withdrawn", || {
            let r = router_bird.birdc(&["show", "route", &prefix]);
            (r.contains("Network not found") && kernel_route(router, addr).is_empty()).then_some(())
        });
        assert!(
            gone.is_some(),
            "{prefix} still routed: bird: {} kernel: {:?}",
            router_bird.birdc(&["show", "route", &prefix]),
            kernel_route(router, addr)
        );
    }

    /// Router and node namespaces on one veth (IPv4 /30 and IPv6 /64), both BIRDs up and both
    /// sessions established.
    struct Pair {
        router: Netns,
        node: Netns,
        dir: tempfile::TempDir,
        router_bird: BirdDaemon,
        node_bird: BirdDaemon,
    }

    impl Pair {
        fn up() -> Self {
            let router = Netns::new("xlbbgpr");
            let node = Netns::new("xlbbgpn");
            router.ip(&["link", "add", "rt0", "type", "veth", "peer", "name", "nd0", "netns", node.name()]);
            router.ip(&["addr", "add", &format!("{ROUTER4}/30"), "dev", "rt0"]);
            router.ip(&["addr", "add", &format!("{ROUTER6}/64"), "dev", "rt0", "nodad"]);
            router.ip(&["link", "set", "rt0", "up"]);
            node.ip(&["addr", "add", &format!("{NODE4}/30"), "dev", "nd0"]);
            node.ip(&["addr", "add", &format!("{NODE6}/64"), "dev", "nd0", "nodad"]);
            node.ip(&["link", "set", "nd0", "up"]);
            let dir = tempfile::tempdir().expect("tempdir");
            let cfg = bird_config(dir.path());
            // BIRD refuses to start when an included file is missing: the operator creates
            // them empty before BIRD starts (docs/operations.md).
            std::fs::write(&cfg.ipv4_file, "").expect("v4 file");
            std::fs::write(&cfg.ipv6_file, "").expect("v6 file");
            let router_bird = BirdDaemon::start(&router, dir.path(), "router", &router_config());
            let node_bird = BirdDaemon::start(&node, dir.path(), "node", &node_config(&cfg.ipv4_file, &cfg.ipv6_file));
            for p in ["node4", "node6"] {
                let ok = wait_for(BGP_WAIT, "session", || {
                    protocol_line(&router_bird, p).contains("Established").then_some(())
                });
                assert!(
                    ok.is_some(),
                    "BGP session {p} not established: {}",
                    router_bird.birdc(&["show", "protocols", "all", p])
                );
            }
            Self { router, node, dir, router_bird, node_bird }
        }

        fn cfg(&self) -> BirdConfig {
            let mut c = bird_config(self.dir.path());
            c.socket.clone_from(&self.node_bird.socket);
            c
        }
    }

    fn bird_config(dir: &Path) -> BirdConfig {
        BirdConfig {
            ipv4_file: dir.join("xlb-vips4.conf"),
            ipv6_file: dir.join("xlb-vips6.conf"),
            socket: dir.join("node.ctl"),
            birdc: "birdc".into(),
            timeout: Duration::from_secs(10),
        }
    }

    fn have_bird(test: &str) -> bool {
        if skip_without_root(test) {
            return false;
        }
        assert!(
            have_tool("bird", "--version"),
            "{test}: bird and birdc are needed (Debian package bird2: scripts/install-deps.sh)"
        );
        true
    }

    #[test]
    fn the_router_learns_announced_vips_into_its_kernel_and_loses_them_on_withdrawal() {
        if !have_bird("the_router_learns_announced_vips_into_its_kernel_and_loses_them_on_withdrawal") {
            return;
        }
        let p = Pair::up();
        let mut a = Bird::new(&p.cfg());

        let r = a.announce(&set(&[VIP4, VIP6])).expect("announced");
        assert!(
            matches!(&r, Applied::Reconfigured { written: true, reply } if reply.contains("0003 Reconfigured")),
            "{r:?}"
        );
        wait_learned(&p.router_bird, &p.router, VIP4, NODE4);
        wait_learned(&p.router_bird, &p.router, VIP6, NODE6);

        // One VIP more, one less: BGP carries the difference.
        a.announce(&set(&[VIP4_B, VIP6])).expect("changed");
        wait_learned(&p.router_bird, &p.router, VIP4_B, NODE4);
        wait_withdrawn(&p.router_bird, &p.router, VIP4);

        // Withdraw everything (what xlb does on drain and stop).
        a.announce(&PrefixSet::new()).expect("withdrawn");
        wait_withdrawn(&p.router_bird, &p.router, VIP4_B);
        wait_withdrawn(&p.router_bird, &p.router, VIP6);
        let files = std::fs::read_to_string(&p.cfg().ipv4_file).expect("file");
        assert!(!files.contains("route"), "{files}");
    }

    #[test]
    fn a_new_announcer_with_the_same_set_keeps_the_bgp_sessions_and_routes() {
        if !have_bird("a_new_announcer_with_the_same_set_keeps_the_bgp_sessions_and_routes") {
            return;
        }
        let p = Pair::up();
        Bird::new(&p.cfg()).announce(&set(&[VIP4, VIP6])).expect("announced");
        wait_learned(&p.router_bird, &p.router, VIP4, NODE4);
        wait_learned(&p.router_bird, &p.router, VIP6, NODE6);
        let before = (protocol_line(&p.router_bird, "node4"), protocol_line(&p.router_bird, "node6"));
        let route_before = p.router_bird.birdc(&["show", "route", &format!("{VIP4}/32")]);

        // xlb restarted (or handed over): a new announcer finds its set in the files.
        let mut second = Bird::new(&p.cfg());
        let r = second.announce(&set(&[VIP4, VIP6])).expect("same set");
        assert!(matches!(r, Applied::Reconfigured { written: false, .. }), "{r:?}");
        assert_eq!(second.announce(&set(&[VIP4, VIP6])).expect("again"), Applied::Unchanged);
        std::thread::sleep(Duration::from_secs(2));
        let after = (protocol_line(&p.router_bird, "node4"), protocol_line(&p.router_bird, "node6"));
        assert_same_but_jitter(&before.0, &after.0, "node4: the session's state and since-time");
        assert_same_but_jitter(&before.1, &after.1, "node6: the session's state and since-time");
        assert!(after.0.contains("Established") && after.1.contains("Established"), "{after:?}");
        // The route's own time stamp ([node4 TIME]) is kept too: it was not withdrawn and sent again.
        let route_after = p.router_bird.birdc(&["show", "route", &format!("{VIP4}/32")]);
        assert_same_but_jitter(&route_before, &route_after, "the route");
    }

    #[test]
    fn a_configuration_bird_refuses_is_an_error_with_its_reply_and_the_old_routes_stay() {
        if !have_bird("a_configuration_bird_refuses_is_an_error_with_its_reply_and_the_old_routes_stay") {
            return;
        }
        let p = Pair::up();
        Bird::new(&p.cfg()).announce(&set(&[VIP4])).expect("announced");
        wait_learned(&p.router_bird, &p.router, VIP4, NODE4);

        // An operator error: the files swapped, so an IPv6 route lands in the ipv4 protocol.
        let mut swapped = p.cfg();
        std::mem::swap(&mut swapped.ipv4_file, &mut swapped.ipv6_file);
        let e = Bird::new(&swapped).announce(&set(&[VIP4, VIP6])).expect_err("refused");
        let msg = e.to_string();
        assert!(matches!(e, AnnounceError::Refused { .. }), "{e:?}");
        assert!(msg.contains("8002") && msg.contains("incompatible with channel type"), "{msg}");
        assert!(msg.contains(&p.node_bird.socket.display().to_string()), "names the socket: {msg}");
        // BIRD kept its running configuration: the old route is still announced and routed.
        std::thread::sleep(Duration::from_secs(2));
        wait_learned(&p.router_bird, &p.router, VIP4, NODE4);
        assert!(p.router_bird.birdc(&["show", "route", &format!("{VIP6}/128")]).contains("Network not found"));

        // The right files again: taken.
        Bird::new(&p.cfg()).announce(&set(&[VIP6])).expect("fixed");
        wait_learned(&p.router_bird, &p.router, VIP6, NODE6);
        wait_withdrawn(&p.router_bird, &p.router, VIP4);
    }

    /// The standalone config for xlb on the node: one LoadBalancer Service with VIP4 and one
    /// endpoint (ready or not), BGP announcement into the pair's BIRD, a 4 s drain.
    fn xlb_config(c: &BirdConfig, ready: bool) -> String {
        format!(
            r#"apiVersion: xlb.dev/v1alpha1
kind: XlbConfiguration
nodeName: node-a
nodeAddresses: [{NODE4}]
shutdownGracePeriod: 4s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
interfaces: [{{name: nd0, queues: [0]}}]
cores: [0]
announce:
  mode: bgp
  bird: {{ipv4File: {}, ipv6File: {}, socket: {}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: demo}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports:
  - {{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}}
status:
  loadBalancer:
    ingress: [{{ip: {VIP4}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- {{addresses: [{ROUTER4}], conditions: {{ready: {ready}, serving: {ready}, terminating: false}}, nodeName: node-b}}
ports:
- {{name: http, port: 8080, protocol: TCP}}
"#,
            c.ipv4_file.display(),
            c.ipv6_file.display(),
            c.socket.display()
        )
    }

    /// `ip netns exec NODE xlb run --config CONFIG --admin-socket DIR/admin.sock EXTRA…`, its
    /// output in `log`; stopped with SIGTERM (then SIGKILL) when the guard drops.
    fn spawn_xlb(p: &Pair, config: &Path, log: &Path, extra: &[&str]) -> ChildGuard {
        let bin = xlb_e2e::xlb_binary().expect("xlb binary");
        let out = std::fs::File::create(log).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", p.node.name()])
            .arg(&bin)
            .arg("run")
            .arg("--config")
            .arg(config)
            .arg("--admin-socket")
            .arg(p.dir.path().join("admin.sock"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("xlb starts");
        ChildGuard::graceful(child, Duration::from_secs(10))
    }

    #[test]
    fn a_hand_over_between_two_xlb_keeps_the_vip_announced_without_a_withdrawal() {
        if !have_bird("a_hand_over_between_two_xlb_keeps_the_vip_announced_without_a_withdrawal") {
            return;
        }
        let p = Pair::up();
        let config = p.dir.path().join("xlb.yaml");
        std::fs::write(&config, xlb_config(&p.cfg(), true)).expect("config");
        let (log_a, log_b) = (p.dir.path().join("a.log"), p.dir.path().join("b.log"));
        let mut a = spawn_xlb(&p, &config, &log_a, &[]);
        wait_learned(&p.router_bird, &p.router, VIP4, NODE4);
        let prefix = format!("{VIP4}/32");
        let before = p.router_bird.birdc(&["show", "route", &prefix]);
        let session = protocol_line(&p.router_bird, "node4");
        let files = std::fs::read_to_string(&p.cfg().ipv4_file).expect("file");

        let mut b = spawn_xlb(&p, &config, &log_b, &["--takeover"]);
        // Watch the route and the file through the whole hand-over: until the old xlb has
        // exited and the new one has announced (its first announcement re-reads the files).
        let mut samples = 0;
        let done = wait_for(Duration::from_secs(30), "hand-over", || {
            samples += 1;
            let r = p.router_bird.birdc(&["show", "route", &prefix]);
            assert_same_but_jitter(&r, &before, "the router's route during the hand-over");
            assert_eq!(std::fs::read_to_string(&p.cfg().ipv4_file).expect("file"), files, "the file changed");
            let b_log = std::fs::read_to_string(&log_b).unwrap_or_default();
            (!a.is_running() && b_log.contains("announced VIPs")).then_some(())
        });
        let text = |l: &Path| std::fs::read_to_string(l).unwrap_or_default();
        assert!(done.is_some(), "old: {}\nnew: {}", text(&log_a), text(&log_b));
        assert!(text(&log_b).contains("hand-over: forwarding again"), "{}", text(&log_b));
        assert!(!text(&log_a).contains("withdrawing"), "{}", text(&log_a));
        assert!(b.is_running());
        assert_same_but_jitter(&protocol_line(&p.router_bird, "node4"), &session, "the session");
        assert_same_but_jitter(&p.router_bird.birdc(&["show", "route", &prefix]), &before, "the route");
        eprintln!("route unchanged in {samples} samples through the hand-over");
    }

    #[test]
    fn xlb_announces_a_vip_only_with_a_ready_endpoint_and_withdraws_it_first_on_sigterm() {
        if !have_bird("xlb_announces_a_vip_only_with_a_ready_endpoint_and_withdraws_it_first_on_sigterm") {
            return;
        }
        let p = Pair::up();
        let c = p.cfg();
        let config = p.dir.path().join("xlb.yaml");
        let log = p.dir.path().join("xlb.log");
        std::fs::write(&config, xlb_config(&c, true)).expect("config");
        let mut xlb = spawn_xlb(&p, &config, &log, &[]);
        let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

        wait_learned(&p.router_bird, &p.router, VIP4, NODE4);
        assert!(xlb.is_running(), "{}", log_text());

        // The endpoint stops being ready: the file reload withdraws the VIP.
        let t = std::time::Instant::now();
        std::fs::write(&config, xlb_config(&c, false)).expect("config");
        wait_withdrawn(&p.router_bird, &p.router, VIP4);
        eprintln!("withdrawn {:?} after the endpoint went unready (kernel route of the router gone)", t.elapsed());
        std::fs::write(&config, xlb_config(&c, true)).expect("config");
        wait_learned(&p.router_bird, &p.router, VIP4, NODE4);

        // SIGTERM: the drain (4 s, forwarding goes on) starts with the withdrawal.
        let t = std::time::Instant::now();
        assert!(run(&["kill", "-TERM", &xlb.id().to_string()]).status.success(), "SIGTERM");
        wait_withdrawn(&p.router_bird, &p.router, VIP4);
        let withdrawn = t.elapsed();
        assert!(xlb.is_running(), "withdrawn while xlb still drains ({withdrawn:?}): {}", log_text());
        eprintln!("withdrawn {withdrawn:?} after SIGTERM, while xlb drained");
        // (Not `terminate`: a second SIGTERM would end the drain at once.)
        let st = wait_for(Duration::from_secs(10), "exit", || xlb.child().try_wait().ok().flatten());
        assert!(st.is_some_and(|s| s.success()), "xlb exits 0 after its drain: {st:?} {}", log_text());
        assert!(t.elapsed() >= Duration::from_secs(4), "the drain ran its 4 s");
        let text = log_text();
        assert!(text.contains("announced VIPs"), "{text}");
        assert!(!text.contains("announcing VIPs failed"), "{text}");
    }

    #[test]
    fn birdc_times_are_compared_with_a_tolerance_and_nothing_else_is() {
        let (a, b) = (
            "node4 BGP --- up 2026-11-25 17:18:18.817  Established",
            "node4 BGP --- up 2026-11-25 17:18:18.816  Established",
        );
        assert_same_but_jitter(a, b, "jitter");
        assert_eq!(split_times("x [node4 17:18:33.470] *").1, [((17 * 60 + 18) * 60 + 33) * 1000 + 470]);
        let moved = std::panic::catch_unwind(|| {
            assert_same_but_jitter(a, "node4 BGP --- up 2026-11-25 17:18:20.100  Established", "reset")
        });
        assert!(moved.is_err(), "a second is not jitter");
        let other = std::panic::catch_unwind(|| {
            assert_same_but_jitter(a, "node4 BGP --- start 2026-11-25 17:18:18.817  Active", "state")
        });
        assert!(other.is_err(), "another state is a difference");
    }
}
