//! End-to-end tests of `xlb::k8s::Source` and `xlb::http` against an in-process fake API
//! server over HTTP (`support/fake_apiserver.rs`; crates.md §8 layer 3).

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::counters::ByteCounter;
use dataplane::tables::{TableBuilder, TablesSpec};
use serde_json::json;
use support::fake_apiserver::{FakeApiServer, Res};
use support::{NODE, http_get, http_get_with, node, service, slice};
use xlb::cluster::{Changes, ServiceRef};
use xlb::http::{
    BackendStats, DataplaneView, EndpointCounts, HealthCheckServers, ServiceStats, Telemetry, WorkerStats,
};
use xlb::k8s::{Snapshot, Source, SourceConfig, SyncReason};

fn source_cfg(min_sync_ms: u64, sync_ms: u64) -> SourceConfig {
    SourceConfig {
        min_sync_period: Duration::from_millis(min_sync_ms),
        sync_period: Duration::from_millis(sync_ms),
        ..SourceConfig::new(NODE)
    }
}

fn xlb_config() -> xlb::config::Config {
    xlb::config::Config { node_name: Some(NODE.into()), ..Default::default() }
}

/// A server with Service default/web (10.96.0.10:80 → 8080), its slice with one ready
/// endpoint, Service default/db with a slice, and our Node.
async fn seeded() -> FakeApiServer {
    let s = FakeApiServer::start().await;
    s.apply(Res::Services, service("default", "web", "10.96.0.10", &[("http", 80, 8080)]));
    s.apply(Res::EndpointSlices, slice("default", "web-abc", "web", &[("10.244.1.5", true, NODE)], &[("http", 8080)]));
    s.apply(Res::Services, service("default", "db", "10.96.0.20", &[("pg", 5432, 5432)]));
    s.apply(Res::EndpointSlices, slice("default", "db-xyz", "db", &[("10.244.2.9", true, "node-b")], &[("pg", 5432)]));
    s.apply(Res::Nodes, node(NODE, "192.0.2.10"));
    s.apply(Res::Nodes, node("node-b", "192.0.2.11"));
    s
}

async fn next(source: &mut Source, within: Duration) -> Snapshot {
    tokio::time::timeout(within, source.next_snapshot()).await.expect("a snapshot in time")
}

/// Waits for a snapshot that satisfies `pred`, checking `each` on every snapshot seen.
async fn until(
    source: &mut Source,
    within: Duration,
    mut each: impl FnMut(&Snapshot),
    pred: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    let end = Instant::now() + within;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let s = tokio::time::timeout(left, source.next_snapshot()).await.expect("the expected snapshot in time");
        each(&s);
        if pred(&s) {
            return s;
        }
    }
}

/// Polls `cond` every 20 ms until it holds; fails the test naming `what` after `within`.
async fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < within, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn names(s: &Snapshot) -> BTreeSet<String> {
    s.state().services.iter().filter_map(|s| s.metadata.name.clone()).collect()
}

/// `VIP:port` → the addresses of its eligible backends, from a translated spec.
fn backends_of(spec: &TablesSpec, vip: &str, port: u16) -> Vec<String> {
    let vip: IpAddr = vip.parse().expect("ip");
    let svc = spec
        .services
        .iter()
        .find(|s| s.frontends.iter().any(|f| f.addr == vip && f.port == port))
        .unwrap_or_else(|| panic!("no frontend {vip}:{port} in {spec:#?}"));
    let mut v: Vec<String> =
        svc.backends.iter().filter(|b| b.eligible).map(|b| format!("{}:{}", b.addr, b.port)).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_waits_for_every_list_then_yields_the_full_state() {
    let server = seeded().await;
    server.hold_lists(Res::Nodes, true);
    let mut source = Source::start(server.client(), source_cfg(100, 30_000), Telemetry::new(Duration::from_secs(30)));
    // Services and EndpointSlices are listed, the Node list is held: nothing may come out.
    // That nothing happens can only be watched for a while: a bounded wait, 1.5 s.
    assert!(tokio::time::timeout(Duration::from_millis(1500), source.next_snapshot()).await.is_err());
    assert!(!source.is_ready());
    assert!(server.list_count(Res::Services) >= 1 && server.list_count(Res::EndpointSlices) >= 1);
    assert_eq!(server.list_count(Res::Nodes), 0);
    server.hold_lists(Res::Nodes, false);
    let s = next(&mut source, Duration::from_secs(5)).await;
    assert_eq!(s.reason, SyncReason::Initial);
    assert_eq!(s.generation, 1);
    assert!(s.changes.is_full());
    assert_eq!(names(&s), ["db", "web"].into_iter().map(String::from).collect());
    assert_eq!(s.state().endpoint_slices.len(), 2);
    // Only our own Node (field selector metadata.name=node-a).
    assert_eq!(s.state().node.as_ref().and_then(|n| n.metadata.name.as_deref()), Some(NODE));
    let (spec, report) = xlb::translate::build_spec(&s.state(), &xlb_config()).expect("translate");
    assert!(!report.has_errors(), "{:?}", report.issues);
    assert_eq!(backends_of(&spec, "10.96.0.10", 80), ["10.244.1.5:8080"]);
    assert_eq!(backends_of(&spec, "10.96.0.20", 5432), ["10.244.2.9:5432"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_and_slice_changes_reach_the_tables_through_build_spec() {
    let server = seeded().await;
    let mut source = Source::start(server.client(), source_cfg(100, 30_000), Telemetry::new(Duration::from_secs(30)));
    let first = next(&mut source, Duration::from_secs(5)).await;
    assert_eq!(first.reason, SyncReason::Initial);

    // A second ready endpoint for web, and a new Service with its slice.
    server.apply(
        Res::EndpointSlices,
        slice(
            "default",
            "web-abc",
            "web",
            &[("10.244.1.5", true, NODE), ("10.244.3.7", true, "node-b")],
            &[("http", 8080)],
        ),
    );
    server.apply(Res::Services, service("shop", "cart", "10.96.0.30", &[("", 8080, 9000)]));
    server.apply(Res::EndpointSlices, slice("shop", "cart-1", "cart", &[("10.244.4.4", true, NODE)], &[("", 9000)]));
    let s = until(&mut source, Duration::from_secs(5), |_| {}, |s| s.state().endpoint_slices.len() == 3).await;
    assert_eq!(s.reason, SyncReason::Changes);
    let Changes::Services(touched) = &s.changes else { panic!("partial changes expected, got {:?}", s.changes) };
    assert!(touched.contains(&ServiceRef::new("default", "web")));
    assert!(!touched.contains(&ServiceRef::new("default", "db")), "db did not change: {touched:?}");
    let (spec, _) = xlb::translate::build_spec(&s.state(), &xlb_config()).expect("translate");
    assert_eq!(backends_of(&spec, "10.96.0.10", 80), ["10.244.1.5:8080", "10.244.3.7:8080"]);
    assert_eq!(backends_of(&spec, "10.96.0.30", 8080), ["10.244.4.4:9000"]);
    // And the tables build and show the change.
    let tables = TableBuilder::new().build(&spec).expect("build");
    let shown = xlb::show::render(&tables);
    assert!(shown.contains("TCP  10.96.0.10:80 random"), "{shown}");
    assert!(shown.contains("  -> 10.244.3.7:8080"), "{shown}");

    // A deletion: the endpoint goes away, the Service too.
    server.delete(Res::EndpointSlices, "shop", "cart-1");
    server.delete(Res::Services, "shop", "cart");
    let s = until(&mut source, Duration::from_secs(5), |_| {}, |s| !names(s).contains("cart")).await;
    let (spec, _) = xlb::translate::build_spec(&s.state(), &xlb_config()).expect("translate");
    assert!(!spec.services.iter().any(|x| x.name.starts_with("shop/")));
}

/// The snapshots' index and changes drive `Translator::update`; after each snapshot its spec
/// and report equal `build_spec` of the same objects, including a slice that moves to another
/// Service (the one it left must lose its endpoints) and a slice that loses its label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_changes_drive_the_incremental_translation_to_what_build_spec_gives() {
    let server = seeded().await;
    let mut source = Source::start(server.client(), source_cfg(0, 30_000), Telemetry::new(Duration::from_secs(30)));
    let cfg = xlb_config();
    let mut tr = xlb::translate::Translator::new();
    let check = |tr: &mut xlb::translate::Translator, s: &Snapshot| {
        let stats = tr.update(&s.cluster, &[], &s.changes, &cfg).expect("valid config");
        let (spec, report) = xlb::translate::build_spec(&s.state(), &cfg).expect("translate");
        assert_eq!(*tr.spec(), spec, "after {:?}", s.changes);
        assert_eq!(tr.report(), report);
        stats
    };
    let first = next(&mut source, Duration::from_secs(5)).await;
    assert!(check(&mut tr, &first).full);
    drop(first);
    // web's slice moves to db: both Services change, although the event names only db.
    server
        .apply(Res::EndpointSlices, slice("default", "web-abc", "db", &[("10.244.1.5", true, NODE)], &[("pg", 5432)]));
    let s = until(&mut source, Duration::from_secs(5), |_| {}, |s| !s.changes.is_empty()).await;
    let stats = check(&mut tr, &s);
    assert!(!stats.full && stats.translated == 2, "{stats:?} for {:?}", s.changes);
    assert_eq!(backends_of(tr.spec(), "10.96.0.20", 5432), ["10.244.1.5:5432", "10.244.2.9:5432"]);
    assert_eq!(backends_of(tr.spec(), "10.96.0.10", 80), Vec::<String>::new());
    drop(s);
    // The slice loses its label: db loses the endpoint again.
    let mut unlabelled = slice("default", "web-abc", "db", &[("10.244.1.5", true, NODE)], &[("pg", 5432)]);
    if let Some(m) = unlabelled.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        m.remove("labels");
    }
    server.apply(Res::EndpointSlices, unlabelled);
    let s = until(&mut source, Duration::from_secs(5), |_| {}, |s| !s.changes.is_empty()).await;
    assert!(!check(&mut tr, &s).full);
    assert_eq!(backends_of(tr.spec(), "10.96.0.20", 5432), ["10.244.2.9:5432"]);
    drop(s);
    // A Service goes.
    server.delete(Res::Services, "default", "web");
    let s = until(&mut source, Duration::from_secs(5), |_| {}, |s| !s.changes.is_empty()).await;
    assert_eq!(check(&mut tr, &s).removed, 1);
    assert!(!tr.spec().services.iter().any(|x| x.name.starts_with("default/web")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_410_in_stream_relists_and_drops_objects_deleted_in_the_gap() {
    let server = seeded().await;
    let mut source = Source::start(server.client(), source_cfg(100, 30_000), Telemetry::new(Duration::from_secs(30)));
    let first = next(&mut source, Duration::from_secs(5)).await;
    assert!(names(&first).contains("db"));
    assert_eq!(server.list_count(Res::Services), 1);
    // Connections drop, db is deleted without any event, history is compacted: the
    // watcher's resumed watch gets 200 + ERROR 410 Expired and must relist.
    server.delete_during_gap_and_compact(Res::Services, "default", "db");
    let s = until(
        &mut source,
        Duration::from_secs(15),
        |s| assert!(names(s).contains("web"), "the state was never cleared"),
        |s| !names(s).contains("db"),
    )
    .await;
    assert!(s.changes.is_full(), "a relist is a full resync: {:?}", s.changes);
    assert!(server.list_count(Res::Services) >= 2, "relisted");
    // The relisted watcher keeps working.
    server.apply(Res::Services, service("default", "api", "10.96.0.40", &[("http", 80, 8080)]));
    until(&mut source, Duration::from_secs(5), |_| {}, |s| names(s).contains("api")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_keep_the_state_and_the_watch_resumes() {
    let server = seeded().await;
    let telemetry = Telemetry::new(Duration::from_secs(1));
    let mut source = Source::start(server.client(), source_cfg(100, 1_000), telemetry.clone());
    next(&mut source, Duration::from_secs(5)).await;
    let lists_before = server.list_count(Res::Services);

    // The API server goes away: connections drop and every request fails for a while.
    server.set_failing(true);
    server.drop_connections();
    // Changes made meanwhile (kept in the server's history).
    server.delete(Res::Services, "default", "db");
    server.apply(Res::Services, service("default", "api", "10.96.0.40", &[("http", 80, 8080)]));
    // That the state is not lost can only be watched for a while: every snapshot of a bounded
    // 2.5 s is checked (at least one of them periodic, so the loop is not empty).
    let t0 = Instant::now();
    let mut periodic = 0;
    while t0.elapsed() < Duration::from_millis(2500) {
        let s = next(&mut source, Duration::from_secs(3)).await;
        // Periodic resyncs go on with the last good objects.
        assert_eq!(names(&s), ["db", "web"].into_iter().map(String::from).collect());
        assert_eq!(s.state().endpoint_slices.len(), 2);
        assert!(s.state().node.is_some());
        periodic += usize::from(s.reason == SyncReason::Periodic);
    }
    assert!(periodic >= 1);
    let text = telemetry.metrics.encode().expect("metrics");
    assert!(!text.contains("xlb_watch_errors_total{resource=\"services\"} 0"), "{text}");
    assert!(text.contains("xlb_watch_errors_total{resource=\"services\"}"), "{text}");

    server.set_failing(false);
    let s = until(&mut source, Duration::from_secs(40), |_| {}, |s| names(s).contains("api")).await;
    // Resumed from its resourceVersion: the deletion made during the outage arrived as an
    // event, no relist was needed.
    assert!(!names(&s).contains("db"));
    assert_eq!(server.list_count(Res::Services), lists_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_seconds_closes_are_resumed_and_bookmarks_avoid_relists() {
    let server = seeded().await;
    let cfg = SourceConfig { watch_timeout_s: Some(1), ..source_cfg(100, 30_000) };
    let mut source = Source::start(server.client(), cfg, Telemetry::new(Duration::from_secs(30)));
    next(&mut source, Duration::from_secs(5)).await;
    // Slice changes move the global resourceVersion; the Services watch only sees bookmarks.
    for i in 0..3 {
        server.apply(
            Res::EndpointSlices,
            slice("default", "web-abc", "web", &[(&format!("10.244.1.{}", 10 + i), true, NODE)], &[("http", 8080)]),
        );
    }
    // timeoutSeconds=1 closes each watch after a second and the watcher resumes it.
    eventually(Duration::from_secs(10), "three watches of Services", || server.watch_count(Res::Services) >= 3).await;
    // Compaction at the current resourceVersion: every watcher is at it thanks to the
    // bookmarks, so reconnecting needs no relist.
    server.compact();
    let before = [Res::Services, Res::EndpointSlices, Res::Nodes].map(|r| server.watch_count(r));
    server.drop_connections();
    eventually(Duration::from_secs(10), "every kind watched again after the drop", || {
        [Res::Services, Res::EndpointSlices, Res::Nodes].iter().zip(before).all(|(r, b)| server.watch_count(*r) > b)
    })
    .await;
    assert_eq!(server.list_count(Res::Services), 1);
    assert_eq!(server.list_count(Res::Nodes), 1);
    server.apply(Res::Services, service("default", "api", "10.96.0.40", &[("http", 80, 8080)]));
    let s = until(&mut source, Duration::from_secs(8), |_| {}, |s| names(s).contains("api")).await;
    assert_eq!(s.state().endpoint_slices.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_sync_period_coalesces_rapid_changes() {
    const N: usize = 30;
    let server = Arc::new(seeded().await);
    let mut source = Source::start(server.client(), source_cfg(500, 30_000), Telemetry::new(Duration::from_secs(30)));
    let first = next(&mut source, Duration::from_secs(5)).await;
    // The condition awaited is the passing of time itself: the first snapshot older than
    // minSyncPeriod (500 ms), with 100 ms to spare.
    tokio::time::sleep_until((first.started + Duration::from_millis(600)).into()).await;
    drop(first);
    let last = format!("10.244.9.{N}");
    // The writer runs while the sync loop consumes: the first change finds the previous
    // snapshot older than minSyncPeriod and goes out at once, the rest wait for the period.
    let w = server.clone();
    let writer = tokio::spawn(async move {
        let t0 = Instant::now();
        for i in 1..=N {
            let addr = format!("10.244.9.{i}");
            w.apply(Res::EndpointSlices, slice("default", "web-abc", "web", &[(&addr, true, NODE)], &[("http", 8080)]));
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        t0.elapsed()
    });
    let mut syncs = 0;
    let mut changes = 0;
    let mut gaps = Vec::new();
    let mut prev: Option<Instant> = None;
    let done = |s: &Snapshot| {
        s.state().endpoint_slices.iter().any(|sl| sl.endpoints.iter().any(|e| e.addresses.first() == Some(&last)))
    };
    until(
        &mut source,
        Duration::from_secs(5),
        |s| {
            syncs += 1;
            changes += s.change_count();
            if let Some(p) = prev {
                gaps.push(s.started - p);
            }
            prev = Some(s.started);
        },
        done,
    )
    .await;
    let writer = writer.await.expect("writer");
    println!("{N} changes over {writer:?} → {syncs} syncs, gaps {gaps:?}");
    assert!(syncs >= 2, "the first change is synced at once, the rest after minSyncPeriod: {syncs}");
    // One at once, then at most one per minSyncPeriod while the writer runs, plus the last.
    let bound = 2 + usize::try_from(writer.as_millis() / 500).unwrap_or(usize::MAX);
    assert!(
        syncs <= bound && syncs < N / 5,
        "{N} changes in {writer:?} must coalesce into ≤ {bound} syncs, got {syncs}"
    );
    assert_eq!(changes, N, "every change is accounted for");
    for g in gaps {
        assert!(g >= Duration::from_millis(490), "minSyncPeriod respected: {g:?}");
    }
}

/// Consumes snapshots like the real sync loop: translate, build, publish, report.
fn spawn_sync_loop(mut source: Source) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut builder = TableBuilder::new();
        loop {
            let snap = source.next_snapshot().await;
            match xlb::translate::build_spec(&snap.state(), &xlb_config()) {
                Ok((spec, report)) if builder.build(&spec).is_ok() => source.published(&snap, &report),
                _ => source.sync_failed(snap),
            }
        }
    })
}

/// Polls `GET path` every 100 ms until it answers `code`; returns the last answer (code and
/// body) after `within` if it never did, for the caller's assertion to show.
async fn wait_code(addr: SocketAddr, path: &str, code: u16, within: Duration) -> (u16, String) {
    let end = Instant::now() + within;
    loop {
        let (c, _, body) = http_get(addr, path).await.expect("GET");
        if c == code || Instant::now() > end {
            return (c, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_follows_node_deletion_and_sync_age_livez_only_sync_age() {
    let server = seeded().await;
    let sync_period = Duration::from_millis(700);
    let telemetry = Telemetry::new(sync_period);
    let healthz =
        xlb::http::serve_healthz("127.0.0.1:0".parse().expect("addr"), telemetry.clone()).await.expect("bind");
    let addr = healthz.local_addr();
    let source = Source::start(server.client(), source_cfg(100, 700), telemetry.clone());
    let sync = spawn_sync_loop(source);

    let (code, body) = wait_code(addr, "/healthz", 200, Duration::from_secs(5)).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(v["nodeEligible"], json!(true));
    assert!(v["lastUpdated"].as_str().is_some_and(|s| s.ends_with(" +0000 UTC")), "{body}");
    assert!(v["currentTime"].as_str().is_some());
    // Syncs keep going (periodic every 700 ms): still healthy after 2 × syncPeriod. That it
    // does not turn unhealthy can only be watched for a while: /healthz is asked every 100 ms
    // for a bounded 1.6 s, and must answer 200 each time.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1600) {
        let (code, _, body) = http_get(addr, "/healthz").await.expect("GET");
        assert_eq!(code, 200, "unhealthy after {:?} of periodic syncs: {body}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The Node is being deleted: /healthz 503 with nodeEligible false, /livez stays 200.
    let mut n = node(NODE, "192.0.2.10");
    n["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    server.apply(Res::Nodes, n);
    let (code, body) = wait_code(addr, "/healthz", 503, Duration::from_secs(5)).await;
    assert_eq!(code, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(v["nodeEligible"], json!(false));
    let (code, _, body) = http_get(addr, "/livez").await.expect("GET");
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("nodeEligible"));
    server.apply(Res::Nodes, node(NODE, "192.0.2.10"));
    assert_eq!(wait_code(addr, "/healthz", 200, Duration::from_secs(5)).await.0, 200);

    // The sync loop stops: after 2 × syncPeriod both fail.
    sync.abort();
    let (code, body) = wait_code(addr, "/livez", 503, sync_period * 2 + Duration::from_secs(5)).await;
    assert_eq!(code, 503, "/livez never failed after the sync loop stopped: {body}");
    let (code, _, body) = http_get(addr, "/healthz").await.expect("GET");
    assert_eq!(code, 503);
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(v["nodeEligible"], json!(true));
    assert_ne!(v["lastUpdated"], v["currentTime"], "lastUpdated is the last sync when unhealthy");

    let text = telemetry.metrics.encode().expect("metrics");
    assert!(text.contains("kubeproxy_proxy_healthz_total{code=\"503\"}"), "{text}");
    assert!(!text.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 0"), "{text}");
    assert!(!text.contains("kubeproxy_proxy_livez_total{code=\"503\"} 0"), "{text}");
}

#[derive(Debug)]
struct FakeDataplane;

impl DataplaneView for FakeDataplane {
    fn workers(&self) -> Vec<WorkerStats> {
        (0..2)
            .map(|w| WorkerStats {
                worker: w,
                rx_packets: 1000 + u64::from(w),
                tx_packets: 900,
                pass_packets: 7,
                drops: vec![("no_neighbour", 3), ("conntrack_full", 0)],
                bytes: vec![(ByteCounter::Rx, 64_000 + u64::from(w)), (ByteCounter::Tx, 57_600)],
                drop_bytes: vec![("no_neighbour", 222), ("conntrack_full", 0)],
                events: vec![("new_flow", 42)],
                conntrack_entries: 11,
                conntrack_evictions: 2,
                conntrack_capacity: 32768,
                busy_ns: 1_500_000_000,
                busy_loops: 77,
                xsk: None,
            })
            .collect()
    }
    fn services(&self) -> Vec<ServiceStats> {
        vec![ServiceStats {
            service: "default/web:http".into(),
            packets: 555,
            new_flows: 5,
            maglev_checksum: Some(1 << 11),
            endpoints: EndpointCounts { total: 3, ready: 2, serving: 3, terminating: 1, eligible: 2 },
        }]
    }
    fn backends(&self) -> Vec<BackendStats> {
        vec![BackendStats {
            service: "default/web:http".into(),
            backend: "10.244.1.5:8080".into(),
            packets: 444,
            new_flows: 4,
            weight: 1,
        }]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_kube_proxy_names_and_the_dataplane_view() {
    let server = seeded().await;
    let telemetry = Telemetry::new(Duration::from_secs(30));
    telemetry.metrics.set_dataplane(Arc::new(FakeDataplane));
    let metrics =
        xlb::http::serve_metrics("127.0.0.1:0".parse().expect("addr"), telemetry.metrics.clone()).await.expect("bind");
    let mut source = Source::start(server.client(), source_cfg(50, 30_000), telemetry.clone());
    let s = next(&mut source, Duration::from_secs(5)).await;
    let (_, report) = xlb::translate::build_spec(&s.state(), &xlb_config()).expect("translate");
    source.published(&s, &report);
    server.apply(
        Res::EndpointSlices,
        slice("default", "web-abc", "web", &[("10.244.1.6", true, NODE)], &[("http", 8080)]),
    );
    let s = next(&mut source, Duration::from_secs(5)).await;
    assert_eq!(s.change_count(), 1);
    let (_, report) = xlb::translate::build_spec(&s.state(), &xlb_config()).expect("translate");
    source.published(&s, &report);

    let (code, head, text) = http_get(metrics.local_addr(), "/metrics").await.expect("GET");
    assert_eq!(code, 200);
    // Like kube-proxy: Prometheus text 0.0.4 unless OpenMetrics is asked for.
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    for name in [
        "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram",
        "kubeproxy_sync_proxy_rules_duration_seconds_count 2",
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\"}",
        "kubeproxy_network_programming_duration_seconds_count 1",
        "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 1",
        "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge",
        "# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"} 0",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 0",
        "xlb_worker_rx_packets_total{worker=\"0\"} 1000",
        "xlb_worker_rx_packets_total{worker=\"1\"} 1001",
        "xlb_worker_tx_packets_total{worker=\"1\"} 900",
        "xlb_worker_pass_packets_total{worker=\"0\"} 7",
        "xlb_drops_total{worker=\"1\",reason=\"no_neighbour\"} 3",
        "xlb_worker_rx_bytes_total{worker=\"1\"} 64001",
        "xlb_worker_tx_bytes_total{worker=\"0\"} 57600",
        "xlb_worker_pass_bytes_total{worker=\"0\"} 0",
        "xlb_drop_bytes_total{worker=\"1\",reason=\"no_neighbour\"} 222",
        "xlb_events_total{worker=\"0\",event=\"new_flow\"} 42",
        "# TYPE xlb_conntrack_entries gauge",
        "xlb_conntrack_entries{worker=\"0\"} 11",
        "xlb_conntrack_evictions_total{worker=\"1\"} 2",
        "xlb_service_packets_total{service=\"default/web:http\"} 555",
        "xlb_service_new_flows_total{service=\"default/web:http\"} 5",
        "xlb_maglev_table_checksum{service=\"default/web:http\"} 1\n",
        "xlb_backend_packets_total{service=\"default/web:http\",backend=\"10.244.1.5:8080\"} 444",
        "xlb_backend_new_flows_total{service=\"default/web:http\",backend=\"10.244.1.5:8080\"} 4",
        "# TYPE xlb_drops_total counter",
        "# TYPE kubeproxy_proxy_healthz_total counter",
        "# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge",
        "xlb_conntrack_capacity{worker=\"1\"} 32768",
        "# TYPE xlb_worker_busy_seconds_total counter",
        "xlb_worker_busy_seconds_total{worker=\"0\"} 1.5\n",
        "xlb_worker_busy_loops_total{worker=\"1\"} 77",
        "xlb_service_endpoints{service=\"default/web:http\",state=\"total\"} 3",
        "xlb_service_endpoints{service=\"default/web:http\",state=\"terminating\"} 1",
        "xlb_service_endpoints{service=\"default/web:http\",state=\"eligible\"} 2",
        "xlb_backend_weight{service=\"default/web:http\",backend=\"10.244.1.5:8080\"} 1",
        // One EndpointSlice applied after the initial list; no Service changed.
        "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total 1\n",
        "kubeproxy_sync_proxy_rules_service_changes_total 0\n",
        "xlb_watch_errors_total{resource=\"nodes\"} 0",
    ] {
        assert!(text.contains(name), "missing {name:?} in\n{text}");
    }
    assert!(!text.contains("# EOF"));
    let (code, head, om) =
        http_get_with(metrics.local_addr(), "/metrics", "Accept: application/openmetrics-text;version=1.0.0\r\n")
            .await
            .expect("GET");
    assert_eq!(code, 200);
    assert!(head.to_ascii_lowercase().contains("content-type: application/openmetrics-text"), "{head}");
    assert!(om.contains("# TYPE xlb_drops counter") && om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("xlb_drops_total{worker=\"1\",reason=\"no_neighbour\"} 3"), "{om}");
    let last_sync: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("kubeproxy_sync_proxy_rules_last_timestamp_seconds "))
        .and_then(|v| v.trim().parse().ok())
        .expect("last sync timestamp");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    assert!((now - last_sync).abs() < 60.0, "{last_sync} vs {now}");
    assert_eq!(http_get(metrics.local_addr(), "/proxyMode").await.expect("GET").2, "xlb");
    metrics.shutdown().await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_check_node_port_answers_200_with_local_endpoints_else_503() {
    let server = seeded().await;
    let port = free_port();
    let mut lb = service("default", "lb", "10.96.0.50", &[("http", 80, 8080)]);
    lb["spec"]["type"] = json!("LoadBalancer");
    lb["spec"]["externalTrafficPolicy"] = json!("Local");
    lb["spec"]["healthCheckNodePort"] = json!(port);
    lb["spec"]["ports"][0]["nodePort"] = json!(30080);
    server.apply(Res::Services, lb.clone());
    server.apply(
        Res::EndpointSlices,
        slice(
            "default",
            "lb-1",
            "lb",
            &[("10.244.1.8", true, NODE), ("10.244.2.8", true, "node-b")],
            &[("http", 8080)],
        ),
    );
    let telemetry = Telemetry::new(Duration::from_secs(30));
    let mut source = Source::start(server.client(), source_cfg(50, 30_000), telemetry.clone());
    let mut hc = HealthCheckServers::new("127.0.0.1".parse().expect("ip"), telemetry.health.clone());
    let s = next(&mut source, Duration::from_secs(5)).await;
    let (_, report) = xlb::translate::build_spec(&s.state(), &xlb_config()).expect("translate");
    source.published(&s, &report);
    let list = xlb::k8s::health_check_services(&s.state(), NODE);
    assert_eq!(list.len(), 1);
    assert!(hc.sync(&list).await.is_empty());
    assert_eq!(hc.ports(), [port]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (code, head, body) = http_get(addr, "/").await.expect("GET");
    assert_eq!(code, 200, "{body}");
    assert!(
        head.contains("X-Load-Balancing-Endpoint-Weight: 1") || head.contains("x-load-balancing-endpoint-weight: 1"),
        "{head}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["service"], json!({"namespace": "default", "name": "lb"}));
    assert_eq!(v["localEndpoints"], json!(1));

    // The local endpoint is no longer ready: 503 with 0.
    server.apply(
        Res::EndpointSlices,
        slice(
            "default",
            "lb-1",
            "lb",
            &[("10.244.1.8", false, NODE), ("10.244.2.8", true, "node-b")],
            &[("http", 8080)],
        ),
    );
    let s = next(&mut source, Duration::from_secs(5)).await;
    assert!(hc.sync(&xlb::k8s::health_check_services(&s.state(), NODE)).await.is_empty());
    let (code, _, body) = http_get(addr, "/healthz").await.expect("GET");
    assert_eq!(code, 503, "{body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).expect("JSON")["localEndpoints"], json!(0));

    // The Service goes: the port closes.
    server.delete(Res::Services, "default", "lb");
    let s = until(&mut source, Duration::from_secs(5), |_| {}, |s| !names(s).contains("lb")).await;
    assert!(hc.sync(&xlb::k8s::health_check_services(&s.state(), NODE)).await.is_empty());
    assert!(hc.ports().is_empty());
    let t0 = Instant::now();
    while http_get(addr, "/").await.is_ok() {
        assert!(t0.elapsed() < Duration::from_secs(5), "timed out after 5 s waiting for the listener to close");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_file_pointing_at_the_fake_server_loads_and_works() {
    let server = seeded().await;
    let dir = std::env::temp_dir().join(format!("xlb-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("kubeconfig.yaml");
    let yaml = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {}
contexts:
- name: fake
  context:
    cluster: fake
    user: xlb
current-context: fake
users:
- name: xlb
  user: {{}}
",
        server.url()
    );
    std::fs::write(&path, yaml).expect("write kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kubeconfig loads");
    assert_eq!(cfg.cluster_url.to_string().trim_end_matches('/'), server.url());
    let client = xlb::k8s::client(Some(&path), &Default::default()).await.expect("client from kubeconfig");
    let mut source = Source::start(client, source_cfg(100, 30_000), Telemetry::new(Duration::from_secs(30)));
    let s = next(&mut source, Duration::from_secs(5)).await;
    assert_eq!(names(&s), ["db", "web"].into_iter().map(String::from).collect());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(xlb::k8s::client(Some(&dir.join("missing.yaml")), &Default::default()).await.is_err());
}

/// Times a full translation + table build for 1,000 Services with 10 endpoints each (the
/// cost of a full resync). Prints the numbers; the bound only catches pathologies.
#[test]
fn full_rebuild_timing_1000_services() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..1000u32 {
        let name = format!("svc-{i}");
        let vip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        services.push(
            serde_json::from_value::<Service>(service("bench", &name, &vip, &[("http", 80, 8080)])).expect("svc"),
        );
        let eps: Vec<(String, bool, &str)> = (0..10u32)
            .map(|e| {
                (format!("10.{}.{}.{}", 100 + i / 250, i % 250, e + 1), true, if e % 2 == 0 { NODE } else { "node-b" })
            })
            .collect();
        let eps: Vec<(&str, bool, &str)> = eps.iter().map(|(a, r, n)| (a.as_str(), *r, *n)).collect();
        slices.push(
            serde_json::from_value::<EndpointSlice>(slice(
                "bench",
                &format!("{name}-1"),
                &name,
                &eps,
                &[("http", 8080)],
            ))
            .expect("slice"),
        );
    }
    let node = serde_json::from_value(node(NODE, "192.0.2.10")).expect("node");
    let state = xlb::cluster::ClusterState {
        services: services.into_iter().map(std::sync::Arc::new).collect(),
        endpoint_slices: slices.into_iter().map(std::sync::Arc::new).collect(),
        node: Some(node),
        local_addresses: Vec::new(),
    };
    for sched in ["random", "mh"] {
        let mut cfg = xlb_config();
        cfg.ipvs.scheduler = xlb::config::parse_scheduler(sched).expect("scheduler");
        let mut builder = TableBuilder::new();
        let mut line = format!("1000 services × 10 endpoints, scheduler {sched}:");
        for round in 0..3 {
            let t0 = Instant::now();
            let (spec, report) = xlb::translate::build_spec(&state, &cfg).expect("translate");
            let t1 = Instant::now();
            let tables = builder.build(&spec).expect("build");
            let t2 = Instant::now();
            assert!(!report.has_errors());
            assert_eq!(tables.services.len(), 1000);
            line.push_str(&format!(" [round {round}: build_spec {:?}, TableBuilder::build {:?}]", t1 - t0, t2 - t1));
            assert!(t2 - t0 < Duration::from_secs(60), "{line}");
        }
        println!("{line}");
    }
}
