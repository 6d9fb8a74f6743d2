//! xlb in Kubernetes mode on the namespace testbed (issue 4, "on the testbed, assert that real
//! traffic follows the change"): `xlb run --kubeconfig` against the in-process fake API server
//! (the same one as `control/tests/k8s_fake_apiserver.rs`), real curl requests from the client
//! namespace to a ClusterIP, and the API objects changed underneath.
//!
//! The fake API server runs on a thread that entered the testbed's lb namespace before its
//! runtime started, so it listens on that namespace's loopback, where xlb reaches it (never
//! through a Service VIP, ROLE-13).

#[path = "../../control/tests/support/mod.rs"]
mod support;

#[cfg(test)]
mod kubernetes {
    use std::collections::BTreeSet;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use serde_json::Value;
    use xlb_e2e::{Role, Testbed, Xlb, backend_of, backend_v4, skip_without_root, wait_for, xlb_binary};

    use crate::support::fake_apiserver::{FakeApiServer, Res};
    use crate::support::{node, service, slice};

    /// The testbed's XlbConfiguration (the first document of the demo's config), with a short
    /// `minSyncPeriod` so that changes show up quickly.
    const CONFIG: &str = include_str!("../../deploy/examples/testbed.yaml");
    /// Node name in that configuration.
    const NODE: &str = "xlb-node";
    /// The ClusterIP of the Service the API server holds (inside the testbed's VIP range,
    /// which the client routes to the lb).
    const VIP: &str = "10.250.100.20";

    fn config() -> String {
        let first = CONFIG.split("\n---").next().expect("a first document");
        assert!(first.contains("kind: XlbConfiguration") && first.contains(&format!("nodeName: {NODE}")));
        format!("{first}\nminSyncPeriod: 200ms\n")
    }

    /// `web` (ClusterIP VIP:80 → 80) and its one EndpointSlice with the given backends (1-based
    /// testbed backend numbers), all ready.
    fn web_slice(backends: &[u8]) -> Value {
        let addrs: Vec<String> = backends.iter().map(|&i| backend_v4(i).to_string()).collect();
        let eps: Vec<(&str, bool, &str)> = addrs.iter().map(|a| (a.as_str(), true, "node-b")).collect();
        slice("demo", "web-1", "web", &eps, &[("http", 80)])
    }

    /// [`web_slice`] plus backends that are terminating but still serving (a Pod being deleted:
    /// `ready: false, serving: true, terminating: true`), as the EndpointSlice controller
    /// publishes them before it removes them.
    fn web_slice_terminating(ready: &[u8], terminating: &[u8]) -> Value {
        let mut s = web_slice(ready);
        if let Some(eps) = s["endpoints"].as_array_mut() {
            for &i in terminating {
                eps.push(serde_json::json!({
                    "addresses": [backend_v4(i).to_string()],
                    "conditions": {"ready": false, "serving": true, "terminating": true},
                    "nodeName": "node-b",
                }));
            }
        }
        s
    }

    /// What the API server is asked to do, from the test thread.
    enum Op {
        Apply(Res, Value),
        Delete(Res, &'static str, &'static str),
        DropConnections,
    }

    /// Which backend answered `curl http://VIP/` from the client (`Err` = the request failed).
    fn fetch(tb: &Testbed) -> Result<u8, String> {
        let url = format!("http://{VIP}/");
        let args = ["curl", "-sS", "--fail", "--noproxy", "*", "--max-time", "3", url.as_str()];
        let out = tb.exec(Role::Client, &args).map_err(|e| e.to_string())?;
        let body = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!("{} {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
        }
        backend_of(&body).ok_or_else(|| format!("unexpected body {body:?}"))
    }

    /// Waits until `n` requests in a row were all answered by exactly the backends `want`
    /// (every one of them at least once) and returns how long that took. Requests made while
    /// the change propagates may go to the old set; none may fail.
    fn wait_for_backends(tb: &Testbed, xlb: &Xlb, want: &[u8], n: usize) -> Duration {
        let want: BTreeSet<u8> = want.iter().copied().collect();
        let start = Instant::now();
        loop {
            let got: Vec<u8> = (0..n)
                .map(|k| {
                    fetch(tb).unwrap_or_else(|e| {
                        panic!("request {k} failed: {e}\n{}\n{}", xlb.stats().unwrap_or_default(), xlb.log())
                    })
                })
                .collect();
            let seen: BTreeSet<u8> = got.iter().copied().collect();
            if seen == want {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "traffic did not follow the API server to backends {want:?} in 20 s; last round {got:?}\n{}\n{}",
                xlb.services().unwrap_or_default(),
                xlb.log()
            );
        }
    }

    #[test]
    fn traffic_follows_endpointslice_changes_from_the_api_server_and_survives_a_watch_outage() {
        if skip_without_root("traffic_follows_endpointslice_changes_from_the_api_server_and_survives_a_watch_outage") {
            return;
        }
        xlb_binary().expect("xlb binary");
        let tb = Testbed::up().unwrap_or_else(|e| {
            eprintln!("testbed up failed, trying once more: {e}");
            Testbed::up().expect("testbed up (second try)")
        });

        // The fake API server, inside the lb namespace.
        let (url_tx, url_rx) = mpsc::channel();
        let (op_tx, op_rx) = mpsc::channel::<Op>();
        let lb_ns = format!("/run/netns/{}", tb.ns_name(Role::Lb));
        let server = std::thread::spawn(move || {
            let f = std::fs::File::open(&lb_ns).expect("lb netns file");
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns into the lb namespace");
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            let api = rt.block_on(FakeApiServer::start());
            api.apply(Res::Nodes, node(NODE, "10.250.1.1"));
            api.apply(Res::Services, service("demo", "web", VIP, &[("http", 80, 80)]));
            api.apply(Res::EndpointSlices, web_slice(&[1, 2]));
            url_tx.send(api.url()).expect("send url");
            for op in op_rx {
                match op {
                    Op::Apply(res, obj) => {
                        api.apply(res, obj);
                    }
                    Op::Delete(res, ns, name) => api.delete(res, ns, name),
                    Op::DropConnections => api.drop_connections(),
                }
            }
            drop(api);
            drop(rt);
        });
        let url = url_rx.recv_timeout(Duration::from_secs(20)).expect("fake API server url");
        let kubeconfig = tb.run_dir().join("kubeconfig.yaml");
        std::fs::write(&kubeconfig, crate::support::kubeconfig(&url)).expect("write kubeconfig");
        let kc = kubeconfig.to_str().expect("utf-8 path");
        let xlb = Xlb::start_with_args(&tb, &config(), &["--kubeconfig", kc]).expect("xlb start");
        let op = |o: Op| op_tx.send(o).expect("API server thread is running");

        // The initial state: be1 and be2.
        let t = wait_for_backends(&tb, &xlb, &[1, 2], 12);
        println!("initial tables served after {t:?}");

        // An endpoint leaves the way Kubernetes removes a Pod (terminating first, CT-03) and
        // another joins: new requests move at once and no request fails. (Removing be1 in one
        // step would reset a request that is in flight to it at that moment: xlb sends a RST
        // for a flow whose backend is gone.)
        op(Op::Apply(Res::EndpointSlices, web_slice_terminating(&[2, 3], &[1])));
        let t = wait_for_backends(&tb, &xlb, &[2, 3], 12);
        println!("be1 (terminating) -> be3 followed after {t:?}");
        op(Op::Apply(Res::EndpointSlices, web_slice(&[2, 3])));
        let t = wait_for_backends(&tb, &xlb, &[2, 3], 12);
        println!("be1 removed; still be2+be3 after {t:?}");

        // The watch connections drop: xlb keeps forwarding on the last good tables, then
        // follows a change made after the outage.
        op(Op::DropConnections);
        let t = wait_for_backends(&tb, &xlb, &[2, 3], 12);
        println!("still be2+be3 {t:?} after the watches dropped");
        op(Op::Apply(Res::EndpointSlices, web_slice(&[1, 2, 3])));
        let t = wait_for_backends(&tb, &xlb, &[1, 2, 3], 15);
        println!("be1 back after {t:?}");

        // /metrics shows the traffic at every layer: the steering program redirected it, the
        // AF_XDP rings carried it, and the Service's table counted it. Steering and socket
        // counters are refreshed once a second, so allow a few seconds.
        let scrape = || {
            tb.exec_ok(Role::Lb, &["curl", "-sS", "--max-time", "5", "http://127.0.0.1:10249/metrics"])
                .expect("scrape /metrics")
        };
        // Counters and these gauges are integers in the exposition text.
        let value = |metrics: &str, series: &str| -> Option<u64> {
            metrics.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        };
        let redirected = "xlb_steering_packets_total{interface=\"eth0\",action=\"redirected\"} ";
        let metrics = wait_for(Duration::from_secs(5), || {
            let m = scrape();
            value(&m, redirected).is_some_and(|v| v > 0).then_some(m)
        })
        .unwrap_or_else(|| panic!("steering counters missing or zero:\n{}", scrape()));
        assert!(value(&metrics, "xlb_xsk_umem_frames{worker=\"0\"} ").is_some_and(|v| v > 0), "{metrics}");
        assert!(value(&metrics, "xlb_xsk_socket_rx_ring_full_total{worker=\"0\"} ").is_some(), "{metrics}");
        let web = value(&metrics, "xlb_service_packets_total{service=\"demo/web:http\"} ");
        assert!(web.is_some_and(|v| v > 0), "{metrics}");

        // The EndpointSlice is deleted: the VIP has no endpoints and is rejected (REJ-03): curl
        // fails at once with "connection refused", not after its timeout.
        op(Op::Delete(Res::EndpointSlices, "demo", "web-1"));
        let refused = wait_for(Duration::from_secs(20), || match fetch(&tb) {
            Err(e) if e.contains("refused") || e.contains("Couldn't connect") => Some(e),
            _ => None,
        });
        assert!(refused.is_some(), "the VIP was not rejected after its endpoints went away\n{}", xlb.log());
        let t0 = Instant::now();
        let e = fetch(&tb).expect_err("no endpoints: the request must fail");
        assert!(t0.elapsed() < Duration::from_secs(2), "rejected, not timed out: {e} after {:?}", t0.elapsed());

        // The Service is deleted: xlb no longer programs the VIP.
        op(Op::Delete(Res::Services, "demo", "web"));
        let gone = wait_for(Duration::from_secs(20), || {
            let s = xlb.services().ok()?;
            (!s.contains(VIP)).then_some(s)
        });
        assert!(gone.is_some(), "{VIP} still programmed after the Service was deleted");

        drop(op_tx);
        let status = xlb.stop().expect("xlb stops");
        assert!(status.success(), "xlb exit status {status}");
        server.join().expect("API server thread");
        tb.down().expect("testbed down");
    }
}
