//! The API client's client-side rate limit (`clientConnection.qps`/`burst`, client-go's token
//! bucket; `xlb::k8s::RateLimit`) against the in-process fake API server: from the config file
//! through `xlb::k8s::client` (what `xlb run --kubeconfig` calls) to the requests the server
//! sees. Timing bounds are lower bounds with the bucket's exact arithmetic (a token bucket
//! never lets request `burst + k` go before `k / qps` seconds); the upper bounds only say
//! "much faster than the limited case".

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use support::fake_apiserver::{FakeApiServer, Res};
use support::{TempDir, kubeconfig, service};

/// Loads `config_text` as a config file and builds the client `xlb run` would build from it
/// and a kubeconfig pointing at `server`.
async fn client_from_files(
    dir: &TempDir,
    server: &FakeApiServer,
    config_text: &str,
) -> (kube::Client, xlb::config::Config) {
    let kc = dir.write("kubeconfig.yaml", &kubeconfig(&server.url()));
    let cfg_path = dir.write("config.yaml", config_text);
    let cfg = xlb::file_source::load_file(&cfg_path).expect("config loads").config;
    let client = xlb::k8s::client(Some(Path::new(&kc)), &cfg.client_connection).await.expect("client");
    (client, cfg)
}

/// Sends `n` list requests one after the other; returns the time they took.
async fn lists(client: &kube::Client, n: usize) -> Duration {
    let api: Api<Service> = Api::all(client.clone());
    let t0 = Instant::now();
    for _ in 0..n {
        api.list(&ListParams::default()).await.expect("list");
    }
    t0.elapsed()
}

fn kube_proxy_configuration(client_connection: &str) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection: {client_connection}\n"
    )
}

#[tokio::test]
async fn kube_proxy_configuration_qps_and_burst_pace_the_api_client() {
    let server = FakeApiServer::start().await;
    server.apply(Res::Services, service("default", "web", "10.96.0.10", &[("http", 80, 8080)]));
    let dir = TempDir::new("ratelimit-pace");

    // qps 20, burst 3: 13 requests need (13 - 3) / 20 = 0.5 s at least.
    let (client, cfg) = client_from_files(&dir, &server, &kube_proxy_configuration("{qps: 20, burst: 3}")).await;
    assert_eq!((cfg.client_connection.qps, cfg.client_connection.burst), (20.0, 3));
    let before = server.list_count(Res::Services);
    let limited = lists(&client, 13).await;
    assert_eq!(server.list_count(Res::Services) - before, 13, "every request reached the server");
    assert!(limited >= Duration::from_millis(495), "13 requests at qps 20 / burst 3 took {limited:?}, want >= 0.5 s");

    // kubeadm writes qps 0 and burst 0: kube-proxy's (and client-go's) defaults, 5 and 10:
    // 12 requests need (12 - 10) / 5 = 0.4 s at least.
    let (client, cfg) = client_from_files(&dir, &server, &kube_proxy_configuration("{qps: 0, burst: 0}")).await;
    assert_eq!((cfg.client_connection.qps, cfg.client_connection.burst), (5.0, 10));
    let defaults = lists(&client, 12).await;
    assert!(defaults >= Duration::from_millis(395), "12 requests at qps 5 / burst 10 took {defaults:?}, want >= 0.4 s");

    // A negative qps turns the limit off (client-go): the same 13 requests go at once.
    let (client, _) = client_from_files(&dir, &server, &kube_proxy_configuration("{qps: -1}")).await;
    let unlimited = lists(&client, 13).await;
    assert!(unlimited < Duration::from_millis(400), "13 unlimited requests took {unlimited:?}");
    eprintln!(
        "13 lists: qps 20/burst 3 {limited:?}; 12 lists: qps 5/burst 10 {defaults:?}; 13 lists: no limit {unlimited:?}"
    );

    // A negative burst is refused at load, naming the field, as kube-proxy's validation does.
    let bad = dir.write("bad.yaml", &kube_proxy_configuration("{qps: 5, burst: -1}"));
    let e = xlb::file_source::load_file(&bad).expect_err("burst -1 refused").to_string();
    assert!(e.contains("clientConnection.burst"), "{e}");
}

/// A watch takes one token when it opens, like client-go's `Request.Watch`: its events stream
/// while the bucket is empty, and the next request still waits for the refill.
#[tokio::test]
async fn a_watch_costs_one_token_and_its_events_none() {
    let server = FakeApiServer::start().await;
    let dir = TempDir::new("ratelimit-watch");
    // One token, refilled every 0.5 s.
    let (client, _) = client_from_files(&dir, &server, &kube_proxy_configuration("{qps: 2, burst: 1}")).await;
    let api: Api<Service> = Api::all(client.clone());
    let t0 = Instant::now();
    let rv = server.resource_version().to_string();
    let stream = api.watch(&WatchParams::default().timeout(30), &rv).await.expect("watch opens");
    let mut stream = stream.boxed();
    for i in 0..5 {
        server.apply(
            Res::Services,
            service("default", &format!("s{i}"), &format!("10.96.0.{}", 10 + i), &[("http", 80, 80)]),
        );
    }
    let mut added = 0;
    while added < 5 {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(_)))) => added += 1,
            Ok(Ok(Some(_))) => {}
            other => panic!("watch ended or failed after {added} events: {other:?}"),
        }
    }
    let events_at = t0.elapsed();
    // Five events in less than one token period: they were not rate limited.
    assert!(events_at < Duration::from_millis(450), "5 watch events took {events_at:?}");
    // The watch took the only token: a list now waits for the next one, 0.5 s after the watch.
    api.list(&ListParams::default()).await.expect("list");
    let list_at = t0.elapsed();
    assert!(list_at >= Duration::from_millis(495), "the list after the watch came at {list_at:?}, want >= 0.5 s");
    assert_eq!(server.watch_count(Res::Services), 1);
}
