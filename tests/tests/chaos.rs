//! The reliability suite of issue 11 (`make chaos`; docs/reliability.md): real clients stream
//! through xlb on the namespace testbed while faults are injected, and each scenario prints
//! one `chaos:` line — the load held, the faults, connections broken and requests failed,
//! frames lost (TCP retransmissions counted by the client's and the backends' kernels), and
//! xlb's memory before and after — then asserts what the issue asks.
//!
//! Two sizes: `XLB_CHAOS=full` (what `make chaos` runs: 20 hand-overs, 200 connections, 60 s
//! of churn, a 60 s SYN flood, a 10-minute soak ...) and, without it, a short form of every
//! scenario that the
//! test suite (CI) runs. The scenarios share the machine's two cores, so they take turns
//! ([`serial`]).

#[path = "../../control/tests/support/mod.rs"]
mod support;

#[cfg(test)]
mod chaos {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::sync::{Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    use xlb_e2e::load::{EchoServer, StreamReport, Streams, SynFlood, Wrk, WrkReport, rss_kib, tcp_retransmissions};
    use xlb_e2e::{BACKENDS, LB_CLIENT_SIDE_V4, Role, Testbed, Xlb, XlbStats, skip_without_root, xlb_binary};

    /// The testbed's XlbConfiguration (first document of the demo config).
    const DEMO: &str = include_str!("../../deploy/examples/testbed.yaml");
    /// `chaos/stream`'s ClusterIP: echo 9100, HTTP 80, UDP 53 (the echo service's UDP side).
    const STREAM_VIP: Ipv4Addr = Ipv4Addr::new(10, 250, 100, 30);
    /// `chaos/stream-mh`'s ClusterIP (Maglev): echo 9100.
    const MH_VIP: Ipv4Addr = Ipv4Addr::new(10, 250, 100, 33);
    /// The echo port on the VIPs and the backends.
    const ECHO_PORT: u16 = 9100;
    /// `chaos/stream`'s node port for echo (masqueraded: eTP Cluster).
    const ECHO_NODE_PORT: u16 = 30910;
    /// Pause between two messages of a stream.
    const PAUSE: Duration = Duration::from_millis(20);

    /// The two sizes of the suite.
    #[derive(Debug, Clone, Copy)]
    struct Size {
        full: bool,
    }

    impl Size {
        fn get() -> Self {
            Self { full: std::env::var("XLB_CHAOS").is_ok_and(|v| v == "full") }
        }
        /// `short` in the test suite, `full` under `make chaos`.
        fn pick<T>(self, short: T, full: T) -> T {
            if self.full { full } else { short }
        }
        fn name(self) -> &'static str {
            self.pick("short", "full")
        }
    }

    /// One scenario at a time: they measure gaps and losses on a 2-core machine.
    fn serial() -> MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the generated config may vary.
    #[derive(Debug, Clone, Copy)]
    struct Opts {
        /// Scheduler of `chaos/stream`.
        scheduler: &'static str,
        /// Whether be3 is in `chaos/stream`'s EndpointSlice.
        be3: bool,
        /// `conntrack.maxPerCore`.
        max_per_core: u32,
    }

    impl Default for Opts {
        fn default() -> Self {
            Self { scheduler: "rr", be3: true, max_per_core: 65_536 }
        }
    }

    /// The demo's XlbConfiguration with `chaos/stream` (NodePort, eTP Cluster: echo, HTTP and
    /// UDP on be1..be3), `chaos/flood` (ClusterIP: TCP 9999 on be1..be3) and `chaos/stream-mh`
    /// (ClusterIP, `mh`: echo).
    fn config(o: Opts) -> String {
        let first = DEMO.split("\n---").next().expect("a first document");
        assert!(first.contains("maxPerCore: 65536"), "the demo config changed: update chaos.rs");
        let first = first.replace("maxPerCore: 65536", &format!("maxPerCore: {}", o.max_per_core));
        let endpoints = |be3: bool| {
            (1..=BACKENDS)
                .filter(|&i| be3 || i != 3)
                .map(|i| {
                    format!("- {{addresses: [10.250.2.1{i}], conditions: {{ready: true}}, nodeName: node-b{i}}}\n")
                })
                .collect::<String>()
        };
        format!(
            "{first}
---
apiVersion: v1
kind: Service
metadata: {{name: stream, namespace: chaos, annotations: {{xlb.dev/scheduler: {sched}}}}}
spec:
  type: NodePort
  clusterIP: {STREAM_VIP}
  clusterIPs: [{STREAM_VIP}]
  externalTrafficPolicy: Cluster
  ports:
  - {{name: echo, port: {ECHO_PORT}, protocol: TCP, targetPort: {ECHO_PORT}, nodePort: {ECHO_NODE_PORT}}}
  - {{name: http, port: 80, protocol: TCP, targetPort: 80, nodePort: 30911}}
  - {{name: dns, port: 53, protocol: UDP, targetPort: {ECHO_PORT}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: stream-1, namespace: chaos, labels: {{kubernetes.io/service-name: stream}}}}
addressType: IPv4
endpoints:
{eps}ports:
- {{name: echo, port: {ECHO_PORT}, protocol: TCP}}
- {{name: http, port: 80, protocol: TCP}}
- {{name: dns, port: {ECHO_PORT}, protocol: UDP}}
---
apiVersion: v1
kind: Service
metadata: {{name: flood, namespace: chaos}}
spec:
  clusterIP: {FLOOD_VIP}
  clusterIPs: [{FLOOD_VIP}]
  ports:
  - {{name: flood, port: {FLOOD_PORT}, protocol: TCP, targetPort: {FLOOD_PORT}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: flood-1, namespace: chaos, labels: {{kubernetes.io/service-name: flood}}}}
addressType: IPv4
endpoints:
{all}ports:
- {{name: flood, port: {FLOOD_PORT}, protocol: TCP}}
---
apiVersion: v1
kind: Service
metadata: {{name: stream-mh, namespace: chaos, annotations: {{xlb.dev/scheduler: mh}}}}
spec:
  clusterIP: {MH_VIP}
  clusterIPs: [{MH_VIP}]
  ports:
  - {{name: echo, port: {ECHO_PORT}, protocol: TCP, targetPort: {ECHO_PORT}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: stream-mh-1, namespace: chaos, labels: {{kubernetes.io/service-name: stream-mh}}}}
addressType: IPv4
endpoints:
{all}ports:
- {{name: echo, port: {ECHO_PORT}, protocol: TCP}}
",
            sched = o.scheduler,
            eps = endpoints(o.be3),
            all = endpoints(true),
        )
    }

    /// The binary first (so no build runs while a testbed waits), then a testbed (twice if
    /// the first try fails on a starved machine: setup, not behaviour under test), with the
    /// echo service on every backend.
    fn testbed() -> (Testbed, EchoServer) {
        xlb_binary().expect("xlb binary");
        let tb = Testbed::up().unwrap_or_else(|e| {
            eprintln!("testbed up failed, trying once more: {e}");
            Testbed::up().expect("testbed up (second try)")
        });
        let echo = EchoServer::start(&tb, ECHO_PORT).expect("echo service on the backends");
        (tb, echo)
    }

    /// TCP segments sent again by the client's and the backends' kernels so far.
    fn retransmissions(tb: &Testbed) -> u64 {
        std::iter::once(Role::Client)
            .chain((1..=BACKENDS).map(Role::Backend))
            .map(|r| tcp_retransmissions(tb, r).expect("read /proc/net/snmp"))
            .sum()
    }

    /// TCP's loss-recovery counters (`/proc/net/netstat`, `TcpExt:`), summed over the client
    /// and the backends: what kind of retransmissions [`retransmissions`] counts.
    fn tcp_recovery(tb: &Testbed) -> BTreeMap<String, u64> {
        const KEYS: [&str; 5] = ["TCPTimeouts", "TCPSpuriousRTOs", "TCPLossProbes", "TCPFastRetrans", "TCPDSACKRecv"];
        let mut m = BTreeMap::new();
        for r in std::iter::once(Role::Client).chain((1..=BACKENDS).map(Role::Backend)) {
            let text = tb.exec_ok(r, &["cat", "/proc/net/netstat"]).unwrap_or_default();
            let mut ext = text.lines().filter(|l| l.starts_with("TcpExt:"));
            let (names, values) = (ext.next().unwrap_or_default(), ext.next().unwrap_or_default());
            for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
                if KEYS.contains(&n) {
                    *m.entry(n.to_owned()).or_default() += v.parse::<u64>().unwrap_or(0);
                }
            }
        }
        m
    }

    /// xlb's resident memory in MiB.
    fn rss_mib(xlb: &Xlb) -> f64 {
        let pid = xlb.pid().expect("xlb runs");
        #[expect(clippy::cast_precision_loss, reason = "KiB of a process fit an f64 exactly")]
        let mib = rss_kib(pid).expect("VmRSS") as f64 / 1024.0;
        mib
    }

    /// Broken streams, one line each.
    fn broken(reports: &[StreamReport]) -> Vec<String> {
        reports
            .iter()
            .filter_map(|r| {
                let (at, why) = r.broken.as_ref()?;
                Some(format!("stream {} to {} from :{} (be{}): {why} at {at:?}", r.id, r.dest, r.local_port, r.backend))
            })
            .collect()
    }

    fn longest_gap(reports: &[StreamReport]) -> Duration {
        reports.iter().map(|r| r.max_gap).max().unwrap_or_default()
    }

    /// How many streams went to each backend.
    fn spread(reports: &[StreamReport]) -> BTreeMap<u8, usize> {
        let mut m = BTreeMap::new();
        for r in reports {
            *m.entry(r.backend).or_default() += 1;
        }
        m
    }

    fn evidence(xlb: &Xlb) -> String {
        format!("\n--- xlb stats ---\n{}\n--- xlb log ---\n{}", xlb.stats().unwrap_or_default(), xlb.log())
    }

    fn echo_vip() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(STREAM_VIP), ECHO_PORT)
    }

    fn echo_node_port() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(LB_CLIENT_SIDE_V4), ECHO_NODE_PORT)
    }

    /// Where a frame through xlb can be lost, as cumulative counters: the AF_XDP sockets'
    /// `XDP_STATISTICS` and xlb's own TX and hand-off drops (`xlb stats`: the sockets outlive
    /// a hand-over, so these count across processes; each worker reads them once a second),
    /// and the lb's veth (`ethtool -S eth0` in the lb namespace: the XDP receive path's drops,
    /// summed over queues).
    fn loss_counters(tb: &Testbed, xlb: &Xlb) -> BTreeMap<String, u64> {
        let stats = XlbStats::parse(&xlb.stats().unwrap_or_default());
        let mut m: BTreeMap<String, u64> = [
            "socket_rx_dropped",
            "socket_rx_ring_full",
            "socket_rx_fill_ring_empty",
            "socket_tx_ring_empty",
            "tx_ring_full",
            "handoff_dropped",
        ]
        .into_iter()
        .map(|n| (n.to_owned(), stats.xsk(n)))
        .collect();
        let ethtool = tb.exec_ok(Role::Lb, &["ethtool", "-S", "eth0"]).unwrap_or_default();
        for line in ethtool.lines() {
            let Some((k, v)) = line.trim().split_once(':') else { continue };
            let Ok(v) = v.trim().parse::<u64>() else { continue };
            // rx_queue_0_xdp_drops -> veth_xdp_drops; rx_queue_1_drops -> veth_drops; ...
            let name = k.strip_prefix("rx_queue_").and_then(|r| r.split_once('_')).map(|(_, n)| n);
            if let Some(n) = name.filter(|n| n.contains("drops") || n.contains("errors")) {
                *m.entry(format!("veth_{n}")).or_default() += v;
            }
        }
        // The lb's eth0: RX/TX dropped (`ip -s -o link`: RX bytes packets errors dropped ...,
        // TX bytes packets errors dropped ...).
        let link = tb.exec_ok(Role::Lb, &["ip", "-s", "-o", "link", "show", "eth0"]).unwrap_or_default();
        let words: Vec<&str> = link.split_whitespace().collect();
        for (dir, key) in [("RX:", "eth0_rx_dropped"), ("TX:", "eth0_tx_dropped")] {
            if let Some(i) = words.iter().position(|w| *w == dir) {
                // After the header words (bytes packets errors dropped ... up to `\`), the values.
                let vals: Vec<u64> = words[i..].iter().filter_map(|w| w.parse().ok()).collect();
                m.insert(key.to_owned(), vals.get(3).copied().unwrap_or(0));
            }
        }
        m
    }

    /// The value of field `key` (`key=VALUE`) on the last log line holding `message`.
    fn log_field(log: &str, message: &str, key: &str) -> String {
        let prefix = format!("{key}=");
        log.lines()
            .rev()
            .find(|l| l.contains(message))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix(prefix.as_str())))
            .unwrap_or("?")
            .to_owned()
    }

    /// `after - before` for the counters that grew, as `name +delta` words.
    fn grown(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> String {
        let words: Vec<String> = after
            .iter()
            .filter_map(|(k, v)| {
                let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
                (d > 0).then(|| format!("{k} +{d}"))
            })
            .collect();
        if words.is_empty() { "no loss counted".to_owned() } else { words.join(", ") }
    }

    fn wrk_line(w: &WrkReport) -> String {
        format!("wrk {} requests, {} failed", w.requests, w.failed())
    }

    /// Hand-over restarts under load: `n` long-lived connections stream through the
    /// ClusterIP (DNAT, `rr`: a flow that lost its state would be picked up on another
    /// backend and reset) and through the node port (SNAT: the backend would see another
    /// port and reset), while wrk makes HTTP requests through the ClusterIP; xlb is replaced
    /// by `xlb run --takeover` again and again. No connection breaks, no request fails.
    #[test]
    fn hand_over_restarts_under_streams_and_wrk_break_no_connection_and_fail_no_request() {
        if skip_without_root("hand_over_restarts_under_streams_and_wrk_break_no_connection_and_fail_no_request") {
            return;
        }
        let _turn = serial();
        let size = Size::get();
        let (restarts, streams, every) = size.pick((3, 40, Duration::from_secs(1)), (20, 200, Duration::from_secs(2)));
        // `XLB_CHAOS_HANDOVERS=N`: the same load with N hand-overs (a shorter reproduction).
        let restarts = std::env::var("XLB_CHAOS_HANDOVERS").ok().and_then(|v| v.parse().ok()).unwrap_or(restarts);
        let (tb, _echo) = testbed();
        let mut xlb = Xlb::start(&tb, &config(Opts::default())).expect("xlb start");
        let (rss_before, retrans_before) = (rss_mib(&xlb), retransmissions(&tb));
        let dnat = Streams::open(&tb, echo_vip(), streams / 2, PAUSE).expect("DNAT streams");
        let snat = Streams::open(&tb, echo_node_port(), streams / 2, PAUSE).expect("SNAT streams");
        let snat_started = snat.started();
        // Long enough for every hand-over (each takes a second or two in a debug build);
        // stopped early once they are done.
        let wrk = Wrk::start(&tb, &format!("http://{STREAM_VIP}/"), 4, (every + Duration::from_secs(5)) * restarts)
            .expect("wrk");
        std::thread::sleep(Duration::from_secs(1));
        let started = Instant::now();
        let mut imported = Vec::new();
        // The same time without a hand-over, for comparison.
        let (retrans, recovery) = (retransmissions(&tb), tcp_recovery(&tb));
        std::thread::sleep(every);
        println!(
            "before the hand-overs, {every:?} without one: {} TCP retransmissions ({})",
            retransmissions(&tb) - retrans,
            grown(&recovery, &tcp_recovery(&tb))
        );
        let origin = dnat.started();
        let mut windows = Vec::new();
        let first_counters = loss_counters(&tb, &xlb);
        let mut counters = first_counters.clone();
        for k in 0..restarts {
            let (retrans, recovery) = (retransmissions(&tb), tcp_recovery(&tb));
            let from = origin.elapsed();
            let (new, status) = xlb.take_over(&tb).unwrap_or_else(|e| panic!("hand-over {k}: {e}"));
            windows.push((from, origin.elapsed()));
            assert!(status.success(), "hand-over {k}: the old xlb exited with {status}\n{}", xlb.log());
            // The new xlb carries on with the old one's AF_XDP sockets (no bind, no gap).
            assert!(
                new.log().contains("AF_XDP socket adopted"),
                "hand-over {k}: the new xlb bound new sockets instead of adopting the old ones:\n{}",
                new.log()
            );
            let old_log = xlb.log();
            xlb = new;
            std::thread::sleep(every);
            let drops = XlbStats::parse(&xlb.stats().expect("stats")).all_drops();
            let left = log_field(&old_log, "hand-off frames left in their inboxes", "frames");
            imported.push(XlbStats::parse(&xlb.stats().expect("stats")).event("flow_imported"));
            // Counted since the previous line (the workers refresh the socket counters once a
            // second, so a loss can show one hand-over late).
            let now = loss_counters(&tb, &xlb);
            let done = "hand-over: workers stopped and flows sent";
            println!(
                "hand-over {k}: {} TCP retransmissions ({}); {}; old: stop -> sent {} ms, -> released {} ms; \
                 new: flows in -> forwarding {} ms; new xlb's drops {drops:?}; hand-offs left in the old inboxes: {left}; load {}",
                retransmissions(&tb) - retrans,
                grown(&recovery, &tcp_recovery(&tb)),
                grown(&counters, &now),
                log_field(&old_log, done, "sent_ms"),
                log_field(&old_log, done, "released_ms"),
                log_field(&xlb.log(), "forwarding again after the flows arrived", "ms"),
                std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
            );
            counters = now;
            // A stopping worker carries out the replies other workers handed it (else they
            // were lost with the inboxes: 0 to 32 per hand-over before, each a TCP loss).
            assert_eq!(left, "0", "hand-over {k}: the old xlb's workers left hand-offs behind:\n{old_log}");
        }
        println!("over all hand-overs: {}", grown(&first_counters, &counters));
        let took = started.elapsed();
        let w = wrk.finish().expect("wrk report");
        let (dnat, snat) = (dnat.finish(), snat.finish());
        let all: Vec<StreamReport> = dnat.iter().chain(&snat).cloned().collect();
        let (rss_after, lost) = (rss_mib(&xlb), retransmissions(&tb) - retrans_before);
        let bad = broken(&all);
        // Each gap longer than LONG_GAP, placed by the hand-over it ended in or after (a
        // take-over from its request to the new xlb's admin socket, plus 1 s for the echo).
        let (snat_origin, mut placed) = (snat_started, BTreeMap::<String, Vec<u128>>::new());
        for r in &all {
            let shift = if r.dest == echo_vip() { Duration::ZERO } else { snat_origin.duration_since(origin) };
            for &(end, len) in &r.long_gaps {
                let end = end + shift;
                let at = windows
                    .iter()
                    .position(|&(a, b)| end >= a && end <= b + Duration::from_secs(1))
                    .map_or_else(|| "outside any hand-over".to_owned(), |k| format!("hand-over {k}"));
                placed.entry(at).or_default().push(len.as_millis());
            }
        }
        println!("gaps over {:?} (ms): {placed:?}", xlb_e2e::load::LONG_GAP);
        println!(
            "chaos: hand-over restarts ({}) | load: {} streams ({} DNAT rr spread {:?}, {} SNAT node port), wrk 4 connections | \
             faults: {restarts} hand-overs in {took:.1?} | broken: {} of {} connections, {} | lost: {lost} TCP retransmissions | \
             longest gap: {:.0?} | memory: {rss_before:.1} -> {rss_after:.1} MiB",
            size.name(),
            all.len(),
            dnat.len(),
            spread(&dnat),
            snat.len(),
            bad.len(),
            all.len(),
            wrk_line(&w),
            longest_gap(&all),
        );
        println!("flows imported by each new xlb: {imported:?}");
        assert!(bad.is_empty(), "connections broken by hand-overs: {bad:#?}{}", evidence(&xlb));
        assert!(w.requests > 0, "wrk made no request: {}", w.text);
        assert_eq!(w.failed(), 0, "requests failed during the hand-overs: {}", w.text);
        assert!(all.iter().all(|r| r.echoes > 0), "a stream never got an echo");
        assert!(
            imported.iter().all(|&n| n >= u64::try_from(streams).unwrap_or(0)),
            "every new xlb imports the streams' flows: {imported:?}"
        );
    }

    /// The backend (`ADDR:PORT`) and SNAT port of the flow from client port `sport` to
    /// `dst`, from an `xlb conntrack` dump.
    fn flow_of(conntrack: &str, sport: u16, dst: SocketAddr) -> Option<(String, Option<u16>)> {
        let want = [format!("sport={sport}"), format!("dst={}", dst.ip()), format!("dport={}", dst.port())];
        let line = conntrack.lines().find(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            want.iter().all(|w| fields.contains(&w.as_str()))
        })?;
        let field = |name: &str| line.split_whitespace().find_map(|f| f.strip_prefix(name)).map(str::to_owned);
        Some((field("backend=")?, field("snat_port=").and_then(|p| p.parse().ok())))
    }

    /// Whether a stream's flow, as the restarted xlb tracks it, still reaches the connection
    /// the stream opened: the same backend and, when masqueraded, the same SNAT port.
    fn same_connection(r: &StreamReport, conntrack: &str) -> bool {
        let Some((backend, snat_port)) = flow_of(conntrack, r.local_port, r.dest) else { return false };
        let same_backend = backend == format!("10.250.2.1{}:{ECHO_PORT}", r.backend);
        let same_source = match snat_port {
            None => r.seen_as.ends_with(&format!(":{}", r.local_port)),
            Some(p) => r.seen_as == format!("10.250.2.1:{p}"),
        };
        same_backend && same_source
    }

    /// Crash under load: `kill -9` while connections stream through a Maglev ClusterIP (`mh`,
    /// DNAT), an `rr` ClusterIP (DNAT) and the `rr` node port (SNAT), then a fresh start. The
    /// `mh` flows are picked up on their backends and all survive. Of the others, exactly those
    /// break whose picked-up flow (`xlb conntrack` of the new process) reaches another
    /// backend or, masqueraded, comes from another SNAT port than before.
    #[test]
    fn kill_9_under_streams_keeps_mh_flows_and_breaks_exactly_the_rr_and_snat_flows_that_moved() {
        if skip_without_root("kill_9_under_streams_keeps_mh_flows_and_breaks_exactly_the_rr_and_snat_flows_that_moved")
        {
            return;
        }
        let _turn = serial();
        let size = Size::get();
        let n = size.pick(12, 50);
        let (tb, _echo) = testbed();
        let cfg = config(Opts::default());
        let xlb = Xlb::start(&tb, &cfg).expect("xlb start");
        let (rss_before, retrans_before) = (rss_mib(&xlb), retransmissions(&tb));
        let mh = Streams::open(&tb, SocketAddr::new(IpAddr::V4(MH_VIP), ECHO_PORT), n, PAUSE).expect("mh streams");
        let rr = Streams::open(&tb, echo_vip(), n, PAUSE).expect("rr streams");
        let snat = Streams::open(&tb, echo_node_port(), n, PAUSE).expect("SNAT streams");
        std::thread::sleep(Duration::from_secs(1));
        let t = Instant::now();
        let status = xlb.kill().expect("kill -9");
        assert!(!status.success(), "killed: {status}");
        let fresh = Xlb::start(&tb, &cfg).expect("xlb restart");
        let outage = t.elapsed();
        // Every stream sends about 100 messages after the restart: a moved flow is reset.
        std::thread::sleep(Duration::from_secs(2));
        let conntrack = fresh.conntrack().expect("conntrack");
        let (mh, rr, snat) = (mh.finish(), rr.finish(), snat.finish());
        let (rss_after, lost) = (rss_mib(&fresh), retransmissions(&tb) - retrans_before);
        let stats = XlbStats::parse(&fresh.stats().expect("stats"));
        let ids = |rs: &[StreamReport], broken: bool| -> Vec<usize> {
            rs.iter().filter(|r| r.broken.is_some() == broken).map(|r| r.id).collect()
        };
        let moved = |rs: &[StreamReport]| -> Vec<usize> {
            rs.iter().filter(|r| r.broken.is_some() || !same_connection(r, &conntrack)).map(|r| r.id).collect()
        };
        println!(
            "chaos: kill -9 ({}) | load: {} streams each through mh DNAT, rr DNAT, rr SNAT node port | faults: kill -9, \
             restarted and attached {outage:.0?} later | broken: mh {} of {n}, rr {} of {n} (predicted {}), SNAT {} of {n} \
             (predicted {}) | lost: {lost} TCP retransmissions | picked up: {} | memory: {rss_before:.1} -> {rss_after:.1} MiB",
            size.name(),
            n,
            ids(&mh, true).len(),
            ids(&rr, true).len(),
            rr.iter().filter(|r| !same_connection(r, &conntrack)).count(),
            ids(&snat, true).len(),
            snat.iter().filter(|r| !same_connection(r, &conntrack)).count(),
            stats.event("flow_picked_up"),
        );
        for r in mh.iter().chain(&rr).chain(&snat) {
            println!(
                "  {} :{} be{} seen as {} broken {:?} -> {:?}",
                r.dest,
                r.local_port,
                r.backend,
                r.seen_as,
                r.broken,
                flow_of(&conntrack, r.local_port, r.dest)
            );
        }
        assert!(ids(&mh, true).is_empty(), "mh flows broken by the crash: {:#?}{}", broken(&mh), evidence(&fresh));
        // A flow that survived is tracked on its old backend and source; one that broke is not.
        assert_eq!(ids(&rr, true), moved(&rr), "rr: the broken flows are the moved ones\n{conntrack}");
        assert_eq!(ids(&snat, true), moved(&snat), "SNAT: the broken flows are the moved ones\n{conntrack}");
    }

    /// One UDP reply: when it arrived and which backend sent it.
    type UdpReply = (Instant, u8);

    /// `clients` UDP clients send a datagram to `dest` every 20 ms until `stop` and record who
    /// answered (the echo service's UDP side: `be<i> <peer>`). With `rotate`, each client moves
    /// to a fresh socket (a new source port: a new flow) that often, from a pool of `pool`
    /// sockets made in the client namespace beforehand.
    fn udp_clients(
        tb: &Testbed,
        dest: SocketAddr,
        clients: usize,
        pool: usize,
        rotate: Option<Duration>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Vec<Vec<UdpReply>> {
        let sockets: Vec<Vec<std::net::UdpSocket>> = tb
            .in_ns(Role::Client, move || {
                (0..clients)
                    .map(|_| {
                        (0..pool.max(1))
                            .map(|_| {
                                let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind udp");
                                s.set_read_timeout(Some(Duration::from_millis(20))).expect("timeout");
                                s
                            })
                            .collect()
                    })
                    .collect()
            })
            .expect("client namespace");
        std::thread::scope(|sc| {
            let hs: Vec<_> = sockets
                .into_iter()
                .map(|pool| {
                    sc.spawn(move || {
                        let mut got = Vec::new();
                        let mut buf = [0u8; 256];
                        let (mut k, mut since) = (0usize, Instant::now());
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            if rotate.is_some_and(|r| since.elapsed() >= r) && k + 1 < pool.len() {
                                k += 1;
                                since = Instant::now();
                            }
                            let s = &pool[k];
                            let _ = s.send_to(b"who", dest);
                            if let Ok((n, _)) = s.recv_from(&mut buf) {
                                let text = String::from_utf8_lossy(&buf[..n]);
                                if let Some(b) = text.split_whitespace().next().and_then(xlb_e2e::backend_of) {
                                    got.push((Instant::now(), b));
                                }
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("udp client")).collect()
        })
    }

    /// Endpoint churn: be3 leaves `chaos/stream`'s EndpointSlice and comes back every second
    /// (file rewrite + SIGHUP) while connections stream through the ClusterIP and UDP clients
    /// query it. No connection to a surviving backend (be1, be2) breaks; a connection to be3
    /// is reset when be3 leaves (xlb's CT-03 behaviour, counted apart); a UDP flow on be3 is
    /// answered by another backend at once: within 200 ms of the new table being live
    /// (measured from the rewrite, with the reload's own time reported beside it).
    #[test]
    fn endpoint_churn_breaks_no_connection_to_a_surviving_backend_and_moves_udp_at_once() {
        if skip_without_root("endpoint_churn_breaks_no_connection_to_a_surviving_backend_and_moves_udp_at_once") {
            return;
        }
        let _turn = serial();
        let size = Size::get();
        let cycles = size.pick(4, 30);
        let (tb, _echo) = testbed();
        let with = config(Opts::default());
        let without = config(Opts { be3: false, ..Opts::default() });
        let xlb = Xlb::start(&tb, &with).expect("xlb start");
        let (rss_before, retrans_before) = (rss_mib(&xlb), retransmissions(&tb));
        let streams = Streams::open(&tb, echo_vip(), 30, PAUSE).expect("streams");
        let stop = std::sync::atomic::AtomicBool::new(false);
        let udp_dest = SocketAddr::new(IpAddr::V4(STREAM_VIP), 53);
        let (removals, udp) = std::thread::scope(|sc| {
            let udp =
                sc.spawn(|| udp_clients(&tb, udp_dest, 6, 2 * cycles + 4, Some(Duration::from_millis(700)), &stop));
            std::thread::sleep(Duration::from_secs(1));
            // (rewrite, live, re-added): when be3 left the file, when `xlb services` first
            // showed the table without it (an upper bound of when the new table went live),
            // and when it was written back.
            let be3 = format!("10.250.2.13:{ECHO_PORT}");
            let listed = || {
                let t = xlb.services().unwrap_or_default();
                let table = t.split(&format!("TCP  {STREAM_VIP}:{ECHO_PORT} ")).nth(1).unwrap_or_default().to_owned();
                let table = table.split("\nTCP ").next().unwrap_or_default().to_owned();
                table.contains(&be3)
            };
            let mut removals = Vec::new();
            for _ in 0..cycles {
                let t = Instant::now();
                xlb.rewrite_config(&without).expect("rewrite");
                let live = xlb_e2e::wait_for(Duration::from_secs(5), || (!listed()).then(Instant::now))
                    .unwrap_or_else(|| panic!("be3 never left the table{}", evidence(&xlb)));
                std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
                removals.push((t, live, Instant::now()));
                xlb.rewrite_config(&with).expect("rewrite");
                std::thread::sleep(Duration::from_secs(1));
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            (removals, udp.join().expect("udp clients"))
        });
        let reports = streams.finish();
        let (rss_after, lost) = (rss_mib(&xlb), retransmissions(&tb) - retrans_before);
        let (to_be3, survivors): (Vec<&StreamReport>, Vec<&StreamReport>) =
            reports.iter().partition(|r| r.backend == 3);
        let broken_survivors: Vec<String> = broken(&survivors.iter().map(|r| (*r).clone()).collect::<Vec<_>>());
        // UDP: for each removal and each socket that was on be3 when the file was rewritten,
        // the time from the rewrite to its first answer from another backend, which must come
        // within 200 ms of the new table being live (`xlb services` shows it, an upper bound);
        // and any answer from be3 later than 50 ms (a datagram on its way) after that, until
        // be3 is written back.
        let mut moved_after = Vec::new();
        let mut slow_moves = Vec::new();
        let mut late_be3 = Vec::new();
        let mut reload = Duration::ZERO;
        for &(t, live, readded) in &removals {
            reload = reload.max(live - t);
            for replies in &udp {
                let before = replies.iter().rev().find(|(at, _)| *at < t);
                if before.is_some_and(|(_, b)| *b == 3)
                    && let Some((at, _)) = replies.iter().find(|(at, b)| *at > t && *b != 3)
                {
                    moved_after.push(*at - t);
                    if *at > live + Duration::from_millis(200) {
                        slow_moves.push((live - t, *at - t));
                    }
                }
                late_be3.extend(
                    replies
                        .iter()
                        .filter(|(at, b)| *b == 3 && *at > live + Duration::from_millis(50) && *at < readded)
                        .map(|(at, _)| *at - live),
                );
            }
        }
        let udp_replies: usize = udp.iter().map(Vec::len).sum();
        let slowest_move = moved_after.iter().max().copied().unwrap_or_default();
        println!(
            "chaos: endpoint churn ({}) | load: {} streams (DNAT rr), 6 UDP clients every 20 ms, a new source port every 0.7 s ({udp_replies} answers) | \
             faults: be3 removed and re-added {cycles} times, 1 s apart | broken: {} of {} connections to be1/be2, \
             {} of {} to be3 (reset when it leaves, by design) | UDP on be3 moved {} times, slowest {slowest_move:.0?} after \
             the rewrite (the reload itself took up to {reload:.0?}) | lost: {lost} TCP retransmissions | memory: {rss_before:.1} -> {rss_after:.1} MiB",
            size.name(),
            reports.len(),
            broken_survivors.len(),
            survivors.len(),
            to_be3.iter().filter(|r| r.broken.is_some()).count(),
            to_be3.len(),
            moved_after.len(),
        );
        assert!(broken_survivors.is_empty(), "{broken_survivors:#?}{}", evidence(&xlb));
        assert!(!to_be3.is_empty() && !survivors.is_empty(), "setup: rr spreads the streams: {:?}", spread(&reports));
        assert!(late_be3.is_empty(), "be3 answered UDP while out of the tables: {late_be3:?}");
        assert!(!moved_after.is_empty(), "no UDP flow was on be3 at a removal: the test proves nothing");
        assert!(
            slow_moves.is_empty(),
            "UDP flows stayed on be3 (reload, move) after the rewrite: {slow_moves:?}{}",
            evidence(&xlb)
        );
        assert!(xlb.log().matches("configuration reloaded").count() >= 2 * cycles, "{}", xlb.log());
    }

    /// Soak: mixed traffic for a while (streams through the ClusterIP and the node port, wrk,
    /// UDP clients). Every 5 s: xlb's resident memory and its frame accounting (every UMEM
    /// frame found in the free list or a ring, `umem_frames_accounted == umem_frames`).
    /// Memory must be flat over the second half (within 5% + 2 MiB: the first half includes
    /// the flow tables' pages being touched for the first time).
    #[test]
    fn soak_of_mixed_traffic_keeps_memory_flat_and_every_umem_frame_accounted() {
        if skip_without_root("soak_of_mixed_traffic_keeps_memory_flat_and_every_umem_frame_accounted") {
            return;
        }
        let _turn = serial();
        let size = Size::get();
        let duration = size.pick(Duration::from_secs(20), Duration::from_secs(600));
        let (tb, _echo) = testbed();
        let xlb = Xlb::start(&tb, &config(Opts::default())).expect("xlb start");
        let retrans_before = retransmissions(&tb);
        let dnat = Streams::open(&tb, echo_vip(), 20, PAUSE).expect("DNAT streams");
        let snat = Streams::open(&tb, echo_node_port(), 20, PAUSE).expect("SNAT streams");
        let wrk = Wrk::start(&tb, &format!("http://{STREAM_VIP}/"), 4, duration).expect("wrk");
        let stop = std::sync::atomic::AtomicBool::new(false);
        let udp_dest = SocketAddr::new(IpAddr::V4(STREAM_VIP), 53);
        let start = Instant::now();
        let (samples, udp) = std::thread::scope(|sc| {
            let udp = sc.spawn(|| udp_clients(&tb, udp_dest, 4, 1, None, &stop));
            let mut samples = Vec::new();
            while start.elapsed() < duration {
                std::thread::sleep(Duration::from_secs(5));
                let st = XlbStats::parse(&xlb.stats().expect("stats"));
                samples.push((
                    start.elapsed(),
                    rss_mib(&xlb),
                    st.xsk("umem_frames"),
                    st.xsk("umem_frames_accounted"),
                    st.event("new_flow"),
                ));
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            (samples, udp.join().expect("udp clients"))
        });
        let w = wrk.finish().expect("wrk report");
        let all: Vec<StreamReport> = dnat.finish().into_iter().chain(snat.finish()).collect();
        let lost = retransmissions(&tb) - retrans_before;
        let bad = broken(&all);
        let mid = samples.get(samples.len() / 2).map_or(0.0, |s| s.1);
        let (first, last) = (samples.first().map_or(0.0, |s| s.1), samples.last().map_or(0.0, |s| s.1));
        let peak = samples.iter().map(|s| s.1).fold(0.0, f64::max);
        println!(
            "chaos: soak ({}) | load: {} streams (20 DNAT, 20 SNAT), wrk 4 connections, 4 UDP clients ({} answers) for {duration:?} | \
             faults: none | broken: {} of {} connections, {} | lost: {lost} TCP retransmissions | \
             memory: {first:.1} (5 s) -> {mid:.1} (half) -> {last:.1} MiB (end), peak {peak:.1} | UMEM frames accounted at every sample: {}",
            size.name(),
            all.len(),
            udp.iter().map(Vec::len).sum::<usize>(),
            bad.len(),
            all.len(),
            wrk_line(&w),
            samples.iter().all(|s| s.2 > 0 && s.2 == s.3),
        );
        for s in &samples {
            println!("  t={:.0?} rss={:.1} MiB umem_frames={} accounted={} new_flows={}", s.0, s.1, s.2, s.3, s.4);
        }
        assert!(bad.is_empty(), "{bad:#?}{}", evidence(&xlb));
        assert!(w.requests > 0, "wrk made no request: {}", w.text);
        assert_eq!(w.failed(), 0, "{}", w.text);
        for s in &samples {
            assert!(s.2 > 0 && s.2 == s.3, "frames leaked at {:?}: {} of {} accounted", s.0, s.3, s.2);
        }
        assert!(last <= mid * 1.05 + 2.0, "memory grew in the second half: {mid:.1} -> {last:.1} MiB");
    }

    /// `chaos/flood`'s ClusterIP: TCP 9999 on be1..be3, where an nftables rule in each
    /// backend drops it (the flood's SYNs cost the backends' kernels nothing more).
    const FLOOD_VIP: Ipv4Addr = Ipv4Addr::new(10, 250, 100, 34);
    /// `chaos/flood`'s port.
    const FLOOD_PORT: u16 = 9999;
    /// Silence after which a stream counts as broken under the SYN flood: longer than TCP's
    /// longest retransmission backoff (`TCP_RTO_MAX`, 120 s).
    const FLOOD_STREAM_TIMEOUT: Duration = Duration::from_secs(150);

    /// SYN flood into a full conntrack table (issue 11): streams are established first (half
    /// DNAT, half SNAT), then `xlb-pktgen --proto syn` sends at its maximum rate, every frame
    /// a new flow to `chaos/flood`, with `maxPerCore` small (4,096) so the table of the
    /// flood's worker is full within a second. A new flow in a full table takes the place of
    /// the oldest not-yet-established flow of its bucket (`conntrack_evicted`), never an
    /// established one: no stream breaks, and no stream's flow is tracked anew (each backend's
    /// `new_flows` for the echo service stays the number of streams it got). xlb's memory is
    /// sampled every 2 s and must not grow in the second half.
    ///
    /// On this 2-core machine the flood saturates both cores (generator, xlb's workers, 200
    /// streams, the backends), so the workers' receive rings overflow and streams lose
    /// segments; TCP then backs off, up to 120 s between retransmissions (`TCP_RTO_MAX`). A
    /// stream is therefore broken here when it is reset, echoes wrong bytes, or stays silent
    /// for [`FLOOD_STREAM_TIMEOUT`]; after the flood every stream must echo again within it
    /// (the longest silence is printed).
    #[test]
    fn syn_flood_into_a_full_conntrack_table_breaks_no_established_connection_and_keeps_memory_flat() {
        if skip_without_root(
            "syn_flood_into_a_full_conntrack_table_breaks_no_established_connection_and_keeps_memory_flat",
        ) {
            return;
        }
        let _turn = serial();
        let size = Size::get();
        let (streams, duration) = size.pick((40, Duration::from_secs(10)), (200, Duration::from_secs(60)));
        let max_per_core = 4096;
        let (tb, _echo) = testbed();
        for i in 1..=BACKENDS {
            let role = Role::Backend(i);
            let nft = format!(
                "add table ip xlbflood\nadd chain ip xlbflood pre {{ type filter hook prerouting priority -400; }}\n\
                 add rule ip xlbflood pre tcp dport {FLOOD_PORT} drop\n"
            );
            tb.exec_with_input(role, &["nft", "-f", "-"], nft.as_bytes()).expect("nft drop rule in a backend");
        }
        let xlb = Xlb::start(&tb, &config(Opts { max_per_core, ..Opts::default() })).expect("xlb start");
        let retrans_before = retransmissions(&tb);
        let open = |dest| Streams::open_with_timeout(&tb, dest, streams / 2, PAUSE, FLOOD_STREAM_TIMEOUT);
        let dnat = open(echo_vip()).expect("DNAT streams");
        let snat = open(echo_node_port()).expect("SNAT streams");
        std::thread::sleep(Duration::from_secs(1));
        let before = XlbStats::parse(&xlb.stats().expect("stats"));
        let rss_before = rss_mib(&xlb);
        let flood = SynFlood::start(
            &tb,
            Ipv4Addr::new(10, 251, 0, 1),
            SocketAddr::new(IpAddr::V4(FLOOD_VIP), FLOOD_PORT),
            duration,
            None,
        )
        .expect("xlb-pktgen");
        let start = Instant::now();
        let mut samples = Vec::new();
        while start.elapsed() < duration {
            std::thread::sleep(Duration::from_secs(2));
            let st = XlbStats::parse(&xlb.stats().expect("stats"));
            samples.push((start.elapsed(), rss_mib(&xlb), st.conntrack_entries(), st.event("conntrack_evicted")));
        }
        let sent = flood.finish(false).expect("flood report");
        // Every stream must echo again after the flood (or break): TCP may be backing off.
        let flood_end = (dnat.echoes(), snat.echoes());
        let recovered = |s: &Streams, at_end: &[u64]| s.echoes().iter().zip(at_end).all(|(now, then)| now > then);
        let waiting = Instant::now();
        while !(recovered(&dnat, &flood_end.0) && recovered(&snat, &flood_end.1))
            && dnat.broken() + snat.broken() == 0
            && waiting.elapsed() < FLOOD_STREAM_TIMEOUT
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let recovery = waiting.elapsed();
        let after = XlbStats::parse(&xlb.stats().expect("stats"));
        let all: Vec<StreamReport> = dnat.finish().into_iter().chain(snat.finish()).collect();
        let lost = retransmissions(&tb) - retrans_before;
        let bad = broken(&all);
        let evicted = after.event("conntrack_evicted") - before.event("conntrack_evicted");
        let new_flows = after.event("new_flow") - before.event("new_flow");
        let full = after.drops("conntrack_full") - before.drops("conntrack_full");
        let fullest = samples.iter().flat_map(|s| s.2.iter().copied()).max().unwrap_or(0);
        let mid = samples.get(samples.len() / 2).map_or(0.0, |s| s.1);
        let last = samples.last().map_or(0.0, |s| s.1);
        println!(
            "chaos: SYN flood ({}) | load: {} streams ({} DNAT, {} SNAT node port) | faults: xlb-pktgen --proto syn at its maximum rate, \
             {} SYNs in {:.1} s ({:.0} pps), maxPerCore {max_per_core} | broken: {} of {} connections | lost: {lost} TCP retransmissions | \
             conntrack: fullest worker {fullest} entries, {new_flows} new flows, {evicted} evicted, {full} dropped as full | \
             longest silence of a stream: {:.1?}, all echoing again {recovery:.1?} after the flood | \
             memory: {rss_before:.1} -> {mid:.1} (half) -> {last:.1} MiB",
            size.name(),
            all.len(),
            streams / 2,
            streams / 2,
            sent.packets,
            sent.seconds,
            sent.pps(),
            bad.len(),
            all.len(),
            longest_gap(&all),
        );
        for s in &samples {
            println!("  t={:.0?} rss={:.1} MiB conntrack_entries={:?} evicted={}", s.0, s.1, s.2, s.3);
        }
        let tracked_anew: u64 = ["10.250.2.11:9100", "10.250.2.12:9100", "10.250.2.13:9100"]
            .iter()
            .filter_map(|b| after.backend("chaos/stream:echo", b))
            .map(|b| b.new_flows)
            .sum::<u64>()
            .saturating_sub(u64::try_from(all.len()).unwrap_or(0));
        assert!(bad.is_empty(), "connections broken by the SYN flood: {bad:#?}{}", evidence(&xlb));
        assert!(all.iter().all(|r| r.echoes > 0), "a stream never got an echo");
        assert_eq!(tracked_anew, 0, "stream flows tracked anew (evicted, then picked up){}", evidence(&xlb));
        assert_eq!(after.event("flow_picked_up"), 0, "{}", evidence(&xlb));
        assert!(
            fullest * 10 >= u64::from(max_per_core) * 9,
            "the flood did not fill a worker's table (fullest {fullest} of {max_per_core}){}",
            evidence(&xlb)
        );
        assert!(evicted > 0, "a full table evicted nothing{}", evidence(&xlb));
        assert!(last <= mid * 1.05 + 2.0, "memory grew in the second half: {mid:.1} -> {last:.1} MiB");
    }

    /// Runs a fake API server in the lb namespace on a thread with its own runtime, holding
    /// `chaos/stream` (echo 9100 and HTTP 80 on be1..be3) and the node, until `down` says so;
    /// dropping the runtime closes every connection, as a dead API server would. Sends its
    /// address and resourceVersion on `up` once it serves, keeps `lists` at the number of
    /// EndpointSlice lists it answered, and returns that and its watch count when it ends.
    fn api_server(
        tb: &Testbed,
        at: SocketAddr,
        first_rv: u64,
        up: std::sync::mpsc::Sender<(SocketAddr, u64)>,
        down: std::sync::mpsc::Receiver<()>,
        lists: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> std::thread::JoinHandle<(usize, usize)> {
        use crate::support::fake_apiserver::{FakeApiServer, Res};
        tb.spawn_in(Role::Lb, "fake-apiserver", move || {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            let api = rt.block_on(FakeApiServer::start_at(at, first_rv));
            api.apply(Res::Nodes, crate::support::node("xlb-node", "10.250.1.1"));
            let svc = crate::support::service(
                "chaos",
                "stream",
                &STREAM_VIP.to_string(),
                &[("echo", 9100, 9100), ("http", 80, 80)],
            );
            api.apply(Res::Services, svc);
            let eps: Vec<(String, bool, &str)> =
                (1..=BACKENDS).map(|i| (format!("10.250.2.1{i}"), true, "node-b")).collect();
            let eps: Vec<(&str, bool, &str)> = eps.iter().map(|(a, r, n)| (a.as_str(), *r, *n)).collect();
            api.apply(
                Res::EndpointSlices,
                crate::support::slice("chaos", "stream-1", "stream", &eps, &[("echo", 9100), ("http", 80)]),
            );
            up.send((api.addr(), api.resource_version())).expect("send address");
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = down.recv_timeout(Duration::from_millis(100)) {
                lists.store(api.list_count(Res::EndpointSlices), std::sync::atomic::Ordering::Relaxed);
            }
            let counts = (api.list_count(Res::EndpointSlices), api.watch_count(Res::EndpointSlices));
            drop(api);
            drop(rt);
            counts
        })
        .expect("API server thread")
    }

    /// API server loss: xlb watches a fake API server (`--kubeconfig`); while streams and wrk
    /// run through `chaos/stream`, the API server dies for a while, then comes back on the same
    /// address with a new resourceVersion history, so xlb's watches get 410 Expired and it
    /// lists again. The tables never go empty (`xlb services`, polled every 200 ms), no
    /// connection breaks, no request fails.
    #[test]
    fn api_server_loss_and_a_new_history_keep_the_tables_and_every_connection() {
        if skip_without_root("api_server_loss_and_a_new_history_keep_the_tables_and_every_connection") {
            return;
        }
        let _turn = serial();
        let size = Size::get();
        let outage = size.pick(Duration::from_secs(5), Duration::from_secs(30));
        let (tb, _echo) = testbed();
        let (up_tx, up_rx) = std::sync::mpsc::channel();
        let (down_tx, down_rx) = std::sync::mpsc::channel();
        let lists = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let first = api_server(&tb, "127.0.0.1:0".parse().expect("addr"), 1, up_tx.clone(), down_rx, lists.clone());
        let (addr, rv) = up_rx.recv_timeout(Duration::from_secs(20)).expect("API server up");
        let kubeconfig = tb.run_dir().join("kubeconfig.yaml");
        std::fs::write(&kubeconfig, crate::support::kubeconfig(&format!("http://{addr}"))).expect("kubeconfig");
        let first_doc = DEMO.split("\n---").next().expect("a first document");
        let xlb = Xlb::start_with_args(&tb, first_doc, &["--kubeconfig", kubeconfig.to_str().expect("utf-8")])
            .expect("xlb start");
        let has_table = || {
            xlb.services().ok().is_some_and(|t| {
                t.contains(&format!("{STREAM_VIP}:{ECHO_PORT}")) && t.matches(&format!(":{ECHO_PORT} ")).count() >= 3
            })
        };
        assert!(
            xlb_e2e::wait_for(Duration::from_secs(20), || has_table().then_some(())).is_some(),
            "{}",
            evidence(&xlb)
        );
        let (rss_before, retrans_before) = (rss_mib(&xlb), retransmissions(&tb));
        let streams = Streams::open(&tb, echo_vip(), 30, PAUSE).expect("streams");
        let wrk = Wrk::start(&tb, &format!("http://{STREAM_VIP}/"), 4, Duration::from_secs(600)).expect("wrk");
        let (mut polls, mut empty) = (0u32, 0u32);
        let mut poll_for = |d: Duration| {
            let end = Instant::now() + d;
            while Instant::now() < end {
                polls += 1;
                if !has_table() {
                    empty += 1;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        poll_for(Duration::from_secs(1));
        down_tx.send(()).expect("stop the API server");
        let (lists_1, _) = first.join().expect("first API server");
        poll_for(outage);
        let (down2_tx, down2_rx) = std::sync::mpsc::channel();
        lists.store(0, std::sync::atomic::Ordering::Relaxed);
        let second = api_server(&tb, addr, rv + 1000, up_tx, down2_rx, lists.clone());
        let _ = up_rx.recv_timeout(Duration::from_secs(20)).expect("second API server up");
        // kube's watcher resumes a broken watch from its resourceVersion; only the 410 of the
        // new history makes it list again.
        let back = Instant::now();
        let relisted = xlb_e2e::wait_for(Duration::from_secs(90), || {
            poll_for(Duration::from_millis(200));
            (lists.load(std::sync::atomic::Ordering::Relaxed) > 0).then(|| back.elapsed())
        });
        poll_for(Duration::from_secs(2));
        down2_tx.send(()).expect("stop the second API server");
        let (lists_2, watches_2) = second.join().expect("second API server");
        let w = wrk.finish().expect("wrk report");
        let reports = streams.finish();
        let (rss_after, lost) = (rss_mib(&xlb), retransmissions(&tb) - retrans_before);
        let bad = broken(&reports);
        println!(
            "chaos: API server loss ({}) | load: {} streams (DNAT rr), wrk 4 connections | faults: API server down {outage:?}, \
             back with resourceVersions from {} (410 for xlb's watches), relisted {:.1?} later | broken: {} of {} connections, {} | tables empty in {empty} \
             of {polls} polls | EndpointSlice lists: {lists_1} before, {lists_2} after (watches after: {watches_2}) | \
             lost: {lost} TCP retransmissions | memory: {rss_before:.1} -> {rss_after:.1} MiB",
            size.name(),
            reports.len(),
            rv + 1000,
            relisted.unwrap_or_default(),
            bad.len(),
            reports.len(),
            wrk_line(&w),
        );
        assert!(relisted.is_some(), "xlb never listed the new API server{}", evidence(&xlb));
        assert!(lists_2 >= 1, "xlb did not list the new API server again");
        assert_eq!(empty, 0, "the tables went empty in {empty} of {polls} polls{}", evidence(&xlb));
        assert!(bad.is_empty(), "{bad:#?}{}", evidence(&xlb));
        assert!(w.requests > 0, "wrk made no request: {}", w.text);
        assert_eq!(w.failed(), 0, "{}", w.text);
    }

    /// `xlb services` without the connection counts: the frontends and their backends, with
    /// forwarding method, weight and state.
    fn tables(xlb: &Xlb) -> Vec<String> {
        let text = xlb.services().expect("services");
        text.lines()
            .map(|l| {
                if l.trim_start().starts_with("->") {
                    l.split_whitespace().take(5).collect::<Vec<_>>().join(" ")
                } else {
                    l.to_owned()
                }
            })
            .collect()
    }

    /// Config files that must be refused as a whole, each with the field its error must name.
    fn bad_configs(good: &str) -> Vec<(String, &'static str)> {
        let edit = |from: &str, to: &str| {
            assert!(good.contains(from), "the chaos config changed: {from:?}");
            good.replacen(from, to, 1)
        };
        vec![
            (edit("scheduler: rr", "scheduler: fastest"), "ipvs.scheduler"),
            (edit("- name: eth0", "- name: \"\""), "interfaces[0].name"),
            (edit("maxPerCore: 65536", "maxPerCore: lots"), "conntrack.maxPerCore"),
            (edit("tcpEstablishedTimeout: 900s", "tcpEstablishedTimeout: forever"), "conntrack.tcpEstablishedTimeout"),
            (edit("snatAddresses:", "snatAdresses:"), "snatAdresses"),
            (edit("forwardingMode: nat", "forwardingMode: teleport"), "forwardingMode"),
            (edit("kind: XlbConfiguration", "kind: XlbConfig"), "field kind"),
            (edit("{name: echo, port: 9100,", "{name: echo, port: ninety,"), "spec.ports[0].port"),
            (edit("addressType: IPv4", "addressType: IPv5"), "addressType"),
            (format!("{good}---\nkind: [unterminated\n"), "line"),
        ]
    }

    /// Bad config reloads in a row (SIGHUP after each rewrite) under load: each one is
    /// logged as an error naming what is wrong, the running tables stay, no connection
    /// breaks and no request fails; then the good file is loaded again.
    #[test]
    fn bad_config_reloads_are_refused_one_by_one_and_the_last_good_tables_stay() {
        if skip_without_root("bad_config_reloads_are_refused_one_by_one_and_the_last_good_tables_stay") {
            return;
        }
        let _turn = serial();
        let size = Size::get();
        let reloads = size.pick(12, 100);
        let (tb, _echo) = testbed();
        let good = config(Opts::default());
        let xlb = Xlb::start(&tb, &good).expect("xlb start");
        let services_before = tables(&xlb);
        let (rss_before, retrans_before) = (rss_mib(&xlb), retransmissions(&tb));
        let streams = Streams::open(&tb, echo_vip(), 20, PAUSE).expect("streams");
        let wrk = Wrk::start(&tb, &format!("http://{STREAM_VIP}/"), 4, Duration::from_secs(600)).expect("wrk");
        let bad = bad_configs(&good);
        let started = Instant::now();
        let errors = |log: &str| log.lines().filter(|l| l.contains("keeping the running tables")).count();
        for k in 0..reloads {
            let (text, field) = &bad[k % bad.len()];
            let before = errors(&xlb.log());
            xlb.rewrite_config(text).expect("rewrite config");
            let line = xlb_e2e::wait_for(Duration::from_secs(5), || {
                let log = xlb.log();
                (errors(&log) > before).then(|| {
                    log.lines().rfind(|l| l.contains("keeping the running tables")).unwrap_or_default().to_owned()
                })
            })
            .unwrap_or_else(|| panic!("bad reload {k} ({field}) was not reported{}", evidence(&xlb)));
            assert!(
                line.to_lowercase().contains(&field.to_lowercase()),
                "bad reload {k}: the error does not name {field:?}: {line}"
            );
            assert_eq!(tables(&xlb), services_before, "bad reload {k} changed the tables");
        }
        let took = started.elapsed();
        xlb.rewrite_config(&good).expect("rewrite the good config");
        let reloaded = xlb_e2e::wait_for(Duration::from_secs(5), || {
            xlb.log().lines().last().is_some_and(|l| l.contains("configuration reloaded")).then_some(())
        });
        let w = wrk.finish().expect("wrk report");
        let reports = streams.finish();
        let (rss_after, lost) = (rss_mib(&xlb), retransmissions(&tb) - retrans_before);
        let bad_streams = broken(&reports);
        println!(
            "chaos: bad reloads ({}) | load: {} streams (DNAT rr), wrk 4 connections | faults: {reloads} bad files + SIGHUP in {took:.1?} \
             | broken: {} of {} connections, {} | lost: {lost} TCP retransmissions | memory: {rss_before:.1} -> {rss_after:.1} MiB",
            size.name(),
            reports.len(),
            bad_streams.len(),
            reports.len(),
            wrk_line(&w)
        );
        assert!(reloaded.is_some(), "the good file was not loaded again{}", evidence(&xlb));
        assert!(bad_streams.is_empty(), "{bad_streams:#?}{}", evidence(&xlb));
        assert!(w.requests > 0, "wrk made no request: {}", w.text);
        assert_eq!(w.failed(), 0, "requests failed during bad reloads: {}", w.text);
    }
}
