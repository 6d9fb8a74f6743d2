//! The real `xlb` binary in Kubernetes mode (`xlb run --kubeconfig`) against the in-process
//! fake API server, inside a network namespace this test creates (the API server, xlb, its
//! XDP program and its HTTP servers all live there; nothing touches the root namespace).
//! Asserts the published tables through `xlb services` and the health and metrics endpoints,
//! across Service and EndpointSlice changes; and, with `addressAssignment` on, that it takes
//! the Lease, writes a pool address into a LoadBalancer Service's status, programs it as the
//! VIP and releases the Lease on stop. Needs root (CI is root); skips with a message
//! otherwise.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, Res};
use support::{NODE, kubeconfig as kubeconfig_for, node, service, slice};
use xlb_testkit::{ChildGuard, Netns, in_ns, sh, skip_without_root};

/// Polls `f` until it returns `Some` (20 s at most).
fn wait_until(what: &str, f: impl FnMut() -> Option<String>) -> String {
    xlb_testkit::wait_until(Duration::from_secs(20), what, f)
}

fn services(ns: &str, sock: &Path) -> String {
    let out = in_ns(ns, &[env!("CARGO_BIN_EXE_xlb"), "services", "--admin-socket", &sock.display().to_string()]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn xlb_with_a_kubeconfig_programs_what_the_api_server_holds_and_follows_changes() {
    if skip_without_root("xlb_with_a_kubeconfig_programs_what_the_api_server_holds_and_follows_changes") {
        return;
    }
    let guard = Netns::new("xk");
    let ns = guard.name().to_owned();
    sh(&["ip", "link", "add", "xk0", "netns", &ns, "type", "veth", "peer", "name", "xk1", "netns", &ns]);
    sh(&["ip", "-n", &ns, "addr", "add", "10.251.0.1/24", "dev", "xk0"]);
    sh(&["ip", "-n", &ns, "link", "set", "xk0", "up"]);
    sh(&["ip", "-n", &ns, "link", "set", "xk1", "up"]);

    // The fake API server runs on threads that entered the namespace before its runtime
    // started, so it listens on the namespace's loopback.
    let (tx, rx) = std::sync::mpsc::channel();
    let (change_tx, change_rx) = std::sync::mpsc::channel::<()>();
    let ns2 = ns.clone();
    let server_thread = std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/run/netns/{ns2}")).expect("netns file");
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let server = rt.block_on(FakeApiServer::start());
        server.apply(Res::Nodes, node(NODE, "10.251.0.1"));
        server.apply(Res::Services, service("shop", "web", "10.96.0.10", &[("http", 80, 8080)]));
        server.apply(
            Res::EndpointSlices,
            slice("shop", "web-1", "web", &[("10.251.0.2", true, NODE)], &[("http", 8080)]),
        );
        tx.send(server.url()).expect("send url");
        // Apply the changes when the test asks; serve until the test drops its sender.
        for () in change_rx {
            server.apply(
                Res::EndpointSlices,
                slice(
                    "shop",
                    "web-1",
                    "web",
                    &[("10.251.0.2", true, NODE), ("10.251.0.3", true, NODE)],
                    &[("http", 8080)],
                ),
            );
            server.apply(Res::Services, service("shop", "db", "10.96.0.20", &[("pg", 5432, 5432)]));
        }
        drop(rt);
    });
    let url = rx.recv_timeout(Duration::from_secs(20)).expect("fake API server url");

    let dir = PathBuf::from(format!("/tmp/xlb-kubeconfig-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let kubeconfig = dir.join("kubeconfig.yaml");
    std::fs::write(&kubeconfig, kubeconfig_for(&url)).expect("write kubeconfig");
    let config = dir.join("xlb.yaml");
    std::fs::write(
        &config,
        "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\nnodeName: node-a\nminSyncPeriod: 200ms\nsyncPeriod: 30s\n\
         shutdownGracePeriod: 2s\n\
         healthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n\
         interfaces: [{name: xk0, queues: [0]}]\ncores: [0]\nsnatAddresses: {ipv4: 10.251.0.1}\n",
    )
    .expect("write config");
    let sock = dir.join("xlb.sock");
    let log = std::fs::File::create(dir.join("xlb.log")).expect("log");
    let child = Command::new("ip")
        .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_xlb"), "run", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--admin-socket")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start xlb");
    let xlb = ChildGuard::graceful(child, Duration::from_secs(5));
    let read_log = || std::fs::read_to_string(dir.join("xlb.log")).unwrap_or_default();

    // The initial state, exactly as the API server holds it.
    let table = wait_until("the initial tables", || {
        let s = services(&ns, &sock);
        s.contains("10.96.0.10:80").then_some(s)
    });
    assert!(table.contains("-> 10.251.0.2:8080"), "{table}\n{}", read_log());
    assert!(!table.contains("10.96.0.20"), "{table}");

    // A changed EndpointSlice and a new Service are published.
    change_tx.send(()).expect("ask for changes");
    let table = wait_until("the changed tables", || {
        let s = services(&ns, &sock);
        (s.contains("-> 10.251.0.3:8080") && s.contains("10.96.0.20:5432")).then_some(s)
    });
    assert!(table.contains("-> 10.251.0.2:8080"), "{table}");

    // Health and metrics, kube-proxy style.
    let health = in_ns(&ns, &["curl", "-s", "-w", " %{http_code}", "http://127.0.0.1:10256/healthz"]);
    let health = String::from_utf8_lossy(&health.stdout).into_owned();
    assert!(health.ends_with(" 200") && health.contains("lastUpdated"), "{health}");
    let metrics = in_ns(&ns, &["curl", "-s", "http://127.0.0.1:10249/metrics"]);
    let metrics = String::from_utf8_lossy(&metrics.stdout).into_owned();
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_network_programming_duration_seconds",
        "xlb_worker_rx_packets_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics:\n{metrics}");
    }

    // LB-06: SIGTERM fails /healthz at once while xlb keeps running (forwarding and
    // answering), then it stops by itself after shutdownGracePeriod (2s) and cleans up.
    let mut xlb = xlb;
    let sigterm = Instant::now();
    sh(&["kill", "-TERM", &xlb.id().to_string()]);
    let draining = wait_until("/healthz 503 after SIGTERM", || {
        let h = in_ns(&ns, &["curl", "-s", "-w", " %{http_code}", "http://127.0.0.1:10256/healthz"]);
        let h = String::from_utf8_lossy(&h.stdout).into_owned();
        h.ends_with(" 503").then_some(h)
    });
    assert!(draining.contains(r#""nodeEligible": true"#), "{draining}");
    assert!(sigterm.elapsed() < Duration::from_secs(2), "503 only after {:?}", sigterm.elapsed());
    assert!(xlb.is_running(), "xlb must keep running during the drain:\n{}", read_log());
    assert!(services(&ns, &sock).contains("10.96.0.10:80"), "still serving its tables during the drain");
    let status = loop {
        if let Some(st) = xlb.child().try_wait().expect("wait") {
            break st;
        }
        assert!(sigterm.elapsed() < Duration::from_secs(8), "xlb did not stop after its grace period:\n{}", read_log());
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = sigterm.elapsed();
    assert!(status.success(), "xlb exited with {status}:\n{}", read_log());
    assert!(took >= Duration::from_millis(1900), "stopped after {took:?}, before its 2s grace period");
    assert!(read_log().contains("SIGTERM: draining"), "{}", read_log());
    drop(change_tx);
    drop(xlb);
    let link = sh(&["ip", "-n", &ns, "-d", "link", "show", "xk0"]);
    assert!(!link.contains("xdp"), "XDP program left on xk0 after xlb stopped:\n{link}");
    let _ = server_thread.join();
    let _ = std::fs::remove_dir_all(&dir);
}

type Query = Box<dyn FnOnce(&FakeApiServer) -> String + Send>;

#[test]
fn xlb_with_address_assignment_writes_a_pool_address_and_programs_it_as_a_vip() {
    if skip_without_root("xlb_with_address_assignment_writes_a_pool_address_and_programs_it_as_a_vip") {
        return;
    }
    let guard = Netns::new("xa");
    let ns = guard.name().to_owned();
    sh(&["ip", "link", "add", "xa0", "netns", &ns, "type", "veth", "peer", "name", "xa1", "netns", &ns]);
    sh(&["ip", "-n", &ns, "addr", "add", "10.251.1.1/24", "dev", "xa0"]);
    sh(&["ip", "-n", &ns, "link", "set", "xa0", "up"]);
    sh(&["ip", "-n", &ns, "link", "set", "xa1", "up"]);

    let (tx, rx) = std::sync::mpsc::channel();
    let (query_tx, query_rx) = std::sync::mpsc::channel::<(Query, std::sync::mpsc::Sender<String>)>();
    let ns2 = ns.clone();
    let server_thread = std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/run/netns/{ns2}")).expect("netns file");
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let server = rt.block_on(FakeApiServer::start());
        server.apply(Res::Nodes, node(NODE, "10.251.1.1"));
        server.apply(
            Res::Pools,
            serde_json::json!({"metadata": {"name": "public"}, "spec": {"addresses": ["198.51.100.8/29"]}}),
        );
        let mut web = service("shop", "web", "10.96.0.10", &[("http", 80, 8080)]);
        web["spec"]["type"] = serde_json::json!("LoadBalancer");
        web["spec"]["ports"][0]["nodePort"] = serde_json::json!(30080);
        server.apply(Res::Services, web);
        server.apply(
            Res::EndpointSlices,
            slice("shop", "web-1", "web", &[("10.251.1.2", true, NODE)], &[("http", 8080)]),
        );
        tx.send(server.url()).expect("send url");
        for (q, reply) in query_rx {
            let _ = reply.send(q(&server));
        }
        drop(rt);
    });
    let url = rx.recv_timeout(Duration::from_secs(20)).expect("fake API server url");
    let ask = |q: Query| {
        let (rtx, rrx) = std::sync::mpsc::channel();
        query_tx.send((q, rtx)).expect("query");
        rrx.recv_timeout(Duration::from_secs(5)).expect("answer")
    };

    let dir = PathBuf::from(format!("/tmp/xlb-assign-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let kubeconfig = dir.join("kubeconfig.yaml");
    std::fs::write(&kubeconfig, kubeconfig_for(&url)).expect("write kubeconfig");
    let config = dir.join("xlb.yaml");
    std::fs::write(
        &config,
        "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\nnodeName: node-a\nminSyncPeriod: 200ms\nsyncPeriod: 30s\n\
         shutdownGracePeriod: 0s\n\
         healthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n\
         interfaces: [{name: xa0, queues: [0]}]\ncores: [0]\nsnatAddresses: {ipv4: 10.251.1.1}\n\
         addressAssignment: {enabled: true, leaseDuration: 3s}\n",
    )
    .expect("write config");
    let sock = dir.join("xlb.sock");
    let log = std::fs::File::create(dir.join("xlb.log")).expect("log");
    let child = Command::new("ip")
        .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_xlb"), "run", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--admin-socket")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start xlb");
    let mut xlb = ChildGuard::graceful(child, Duration::from_secs(5));
    let read_log = || std::fs::read_to_string(dir.join("xlb.log")).unwrap_or_default();

    // xlb takes the Lease, writes the first pool address into the Service's status, sees the
    // status come back through its watch and programs it as the LoadBalancer VIP.
    let table = wait_until("the assigned VIP in the tables", || {
        let s = services(&ns, &sock);
        s.contains("198.51.100.8:80").then_some(s)
    });
    assert!(table.contains("-> 10.251.1.2:8080"), "{table}\n{}", read_log());
    let status = ask(Box::new(|s| s.get(Res::Services, "shop", "web").expect("web")["status"].to_string()));
    assert_eq!(status, r#"{"loadBalancer":{"ingress":[{"ip":"198.51.100.8"}]}}"#);
    let holder = ask(Box::new(|s| {
        s.get(Res::Leases, "kube-system", "xlb-address-assignment").expect("the lease")["spec"]["holderIdentity"]
            .to_string()
    }));
    assert!(holder.starts_with("\"node-a/"), "{holder}");
    assert!(read_log().contains("LoadBalancer status written"), "{}", read_log());

    // A clean stop releases the Lease.
    sh(&["kill", "-TERM", &xlb.id().to_string()]);
    let stopped = Instant::now();
    let status = loop {
        if let Some(st) = xlb.child().try_wait().expect("wait") {
            break st;
        }
        assert!(stopped.elapsed() < Duration::from_secs(10), "xlb did not stop:\n{}", read_log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "xlb exited with {status}:\n{}", read_log());
    let holder = ask(Box::new(|s| {
        s.get(Res::Leases, "kube-system", "xlb-address-assignment").expect("the lease")["spec"]["holderIdentity"]
            .to_string()
    }));
    assert_eq!(holder, "null", "the Lease is released on stop");
    drop(query_tx);
    drop(xlb);
    let _ = server_thread.join();
    let _ = std::fs::remove_dir_all(&dir);
}
