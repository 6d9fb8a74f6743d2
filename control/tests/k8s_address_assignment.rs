//! The Kubernetes address assigner and its leader election against the in-process fake API
//! server (`support/fake_apiserver.rs`: XlbIPPool list/watch, Leases, `services/status`
//! merge patches). Every wait is for a condition, with a deadline.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, Res};
use xlb::ipam::ClassFilter;
use xlb::k8s::{Assigner, AssignerConfig, LeaseConfig, LeaseLock};

const NS: &str = "kube-system";
const LEASE: &str = "xlb-address-assignment";

fn lease_cfg(identity: &str, secs: u64) -> LeaseConfig {
    LeaseConfig {
        namespace: NS.into(),
        name: LEASE.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(secs),
        renew_deadline: Duration::from_secs(secs) * 2 / 3,
    }
}

fn assigner_cfg(identity: &str) -> AssignerConfig {
    AssignerConfig {
        lease: lease_cfg(identity, 3),
        filter: ClassFilter { class: Some("xlb.dev/lb".into()), handle_default: true },
        retry_period: Duration::from_millis(200),
    }
}

/// Polls `f` every 20 ms until it holds; panics with `what` after `within`.
async fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lb_service(name: &str, cluster_ip: &str, extra_spec: Value) -> Value {
    let mut spec = json!({
        "type": "LoadBalancer",
        "clusterIP": cluster_ip,
        "clusterIPs": [cluster_ip],
        "ipFamilies": ["IPv4"],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}],
    });
    if let (Some(s), Value::Object(extra)) = (spec.as_object_mut(), extra_spec) {
        s.extend(extra);
    }
    json!({"metadata": {"namespace": "default", "name": name}, "spec": spec})
}

fn ingress(s: &FakeApiServer, name: &str) -> Vec<String> {
    s.get(Res::Services, "default", name)
        .and_then(|o| o["status"]["loadBalancer"]["ingress"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["ip"].as_str().map(str::to_owned))
        .collect()
}

fn holder(s: &FakeApiServer) -> Option<String> {
    s.get(Res::Leases, NS, LEASE).and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn lease_one_candidate_leads_and_another_takes_over_after_release_or_expiry() {
    let s = FakeApiServer::start().await;
    let mut a = LeaseLock::new(s.client(), lease_cfg("node-a/1", 2));
    let mut b = LeaseLock::new(s.client(), lease_cfg("node-b/2", 2));
    assert!(a.try_acquire_or_renew().await.unwrap(), "the first candidate creates the Lease");
    assert!(!b.try_acquire_or_renew().await.unwrap(), "a held Lease is not taken");
    assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");
    assert!(a.is_leader() && !b.is_leader());
    assert_eq!(holder(&s).as_deref(), Some("node-a/1"));

    // A release hands over at once.
    a.release().await.unwrap();
    assert!(!a.is_leader());
    assert_eq!(holder(&s), None);
    assert!(b.try_acquire_or_renew().await.unwrap(), "a released Lease is taken at once");
    let lease = s.get(Res::Leases, NS, LEASE).unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], json!(1));

    // A holder that stops renewing is replaced once the Lease expires (2 s after the other
    // candidate first saw its last renewal), not before.
    // `seen` is taken before the round in which `a` first sees b's record, so the takeover
    // cannot come less than the lease duration after it.
    let seen = Instant::now();
    assert!(!a.try_acquire_or_renew().await.unwrap());
    let end = seen + Duration::from_secs(10);
    while !a.try_acquire_or_renew().await.unwrap() {
        assert!(Instant::now() < end, "the expired Lease was never taken over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waited = seen.elapsed();
    assert!(waited >= Duration::from_secs(2), "taken over after {waited:?}, before the lease duration");
    assert_eq!(holder(&s).as_deref(), Some("node-a/1"));
    // The old holder, acting on its own clock, has stopped leading by then (renew deadline
    // 4/3 s < lease duration 2 s).
    assert!(!b.is_leader());
    assert!(!b.try_acquire_or_renew().await.unwrap(), "and cannot renew what it lost");
}

#[tokio::test]
async fn lease_two_candidates_racing_for_a_free_lease_give_one_leader() {
    for round in 0..5 {
        let s = FakeApiServer::start().await;
        let mut a = LeaseLock::new(s.client(), lease_cfg("a", 5));
        let mut b = LeaseLock::new(s.client(), lease_cfg("b", 5));
        let (ra, rb) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
        assert!(ra.unwrap() ^ rb.unwrap(), "round {round}: exactly one leader (create race)");
        // Released, then raced again: updates with a stale resourceVersion get 409.
        let (mut winner, mut loser) = if a.is_leader() { (a, b) } else { (b, a) };
        winner.release().await.unwrap();
        let mut c = LeaseLock::new(s.client(), lease_cfg("c", 5));
        let (rl, rc) = tokio::join!(loser.try_acquire_or_renew(), c.try_acquire_or_renew());
        assert!(rl.unwrap() ^ rc.unwrap(), "round {round}: exactly one leader (update race)");
    }
}

#[tokio::test]
async fn assigner_writes_pool_addresses_only_while_it_holds_the_lease_and_a_new_leader_agrees() {
    let s = FakeApiServer::start().await;
    s.apply(Res::Pools, json!({"metadata": {"name": "public"}, "spec": {"addresses": ["198.51.100.0/30"]}}));
    s.apply(Res::Pools, json!({"metadata": {"name": "broken"}, "spec": {"addresses": ["198.51.100.1/24"]}}));
    s.apply(Res::Services, lb_service("web", "10.96.0.10", json!({})));
    s.apply(Res::Services, lb_service("other", "10.96.0.11", json!({"loadBalancerClass": "example.com/lb"})));
    s.apply(Res::Services, support::service("default", "cip", "10.96.0.12", &[("http", 80, 8080)]));
    // Someone else holds the Lease, freshly renewed, for an hour.
    let now = "2026-11-25T10:00:00.000000Z";
    s.apply(
        Res::Leases,
        json!({"metadata": {"namespace": NS, "name": LEASE},
               "spec": {"holderIdentity": "elsewhere/1", "leaseDurationSeconds": 3600, "renewTime": now, "acquireTime": now}}),
    );

    let a = Assigner::start(s.client(), assigner_cfg("node-a/1"));
    let stats = a.stats().clone();
    wait_for("three rounds as follower", Duration::from_secs(10), || stats.rounds.load(Ordering::Relaxed) >= 3).await;
    assert!(!stats.leader.load(Ordering::Relaxed));
    assert!(s.status_patches().is_empty(), "a follower writes nothing: {:?}", s.status_patches());

    // The holder goes away (releases): the assigner takes over and writes web's status.
    let mut lease = s.get(Res::Leases, NS, LEASE).unwrap();
    lease["spec"]["holderIdentity"] = Value::Null;
    s.apply(Res::Leases, lease);
    wait_for("web's address", Duration::from_secs(10), || ingress(&s, "web") == ["198.51.100.0"]).await;
    assert!(stats.leader.load(Ordering::Relaxed));
    assert_eq!(holder(&s).as_deref(), Some("node-a/1"));
    assert!(ingress(&s, "other").is_empty(), "a Service of another class is left alone");
    assert!(s.get(Res::Services, "default", "cip").unwrap()["status"].is_null());

    // A requested address; then a deleted Service frees its address for the next one.
    s.apply(Res::Services, lb_service("asked", "10.96.0.13", json!({"loadBalancerIP": "198.51.100.3"})));
    wait_for("asked's address", Duration::from_secs(10), || ingress(&s, "asked") == ["198.51.100.3"]).await;
    s.delete(Res::Services, "default", "web");
    s.apply(Res::Services, lb_service("next", "10.96.0.14", json!({})));
    wait_for("next's address", Duration::from_secs(10), || ingress(&s, "next") == ["198.51.100.0"]).await;
    // A Service that cannot be served keeps no address.
    s.apply(Res::Services, lb_service("outside", "10.96.0.15", json!({"loadBalancerIP": "203.0.113.1"})));
    s.apply(Res::Services, lb_service("late", "10.96.0.16", json!({})));
    wait_for("late's address", Duration::from_secs(10), || ingress(&s, "late") == ["198.51.100.1"]).await;
    assert!(ingress(&s, "outside").is_empty());

    let patches = s.status_patches();
    assert!(!patches.is_empty(), "the addresses above were written by status patches");
    assert!(patches.iter().all(|(_, m, _)| m == xlb::k8s::FIELD_MANAGER), "{patches:?}");
    assert!(
        patches.iter().all(|(_, _, p)| p["metadata"]["resourceVersion"].is_string()),
        "every patch has a precondition"
    );
    let written: Vec<&str> = patches.iter().map(|(k, _, _)| k.as_str()).collect();
    assert!(!written.contains(&"default/other") && !written.contains(&"default/outside"), "{written:?}");

    // Stopping releases the Lease; a new xlb takes over at once, decides the same from the
    // statuses and writes nothing.
    let before = s.status_patches().len();
    a.stop().await;
    assert_eq!(holder(&s), None);
    let b = Assigner::start(s.client(), assigner_cfg("node-b/2"));
    let bs = b.stats().clone();
    wait_for("the new leader's assignment rounds", Duration::from_secs(10), || {
        bs.assignment_rounds.load(Ordering::Relaxed) >= 3
    })
    .await;
    assert_eq!(holder(&s).as_deref(), Some("node-b/2"));
    assert_eq!(s.status_patches().len(), before, "{:?}", &s.status_patches()[before..]);
    assert_eq!(ingress(&s, "next"), ["198.51.100.0"]);
    b.stop().await;
}

#[tokio::test]
async fn status_patch_with_a_stale_resource_version_is_refused_by_the_fake() {
    // The precondition the assigner relies on, checked against the fake itself.
    let s = FakeApiServer::start().await;
    s.apply(Res::Services, lb_service("web", "10.96.0.10", json!({})));
    let api: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::namespaced(s.client(), "default");
    let pp = kube::api::PatchParams { field_manager: Some("t".into()), ..Default::default() };
    let stale =
        json!({"metadata": {"resourceVersion": "0"}, "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}});
    let e = api.patch_status("web", &pp, &kube::api::Patch::Merge(&stale)).await.unwrap_err();
    assert!(matches!(e, kube::Error::Api(ref r) if r.code == 409), "{e:?}");
    let rv = s.resource_version().to_string();
    let fresh = json!({"metadata": {"resourceVersion": rv}, "spec": {"type": "ClusterIP"}, "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}});
    api.patch_status("web", &pp, &kube::api::Patch::Merge(&fresh)).await.unwrap();
    assert_eq!(ingress(&s, "web"), ["192.0.2.1"]);
    assert_eq!(s.get(Res::Services, "default", "web").unwrap()["spec"]["type"], "LoadBalancer", "status only");
}

#[tokio::test]
async fn without_pools_nothing_is_written_and_a_status_outside_the_pools_is_replaced_once_one_exists() {
    let s = FakeApiServer::start().await;
    let mut web = lb_service("web", "10.96.0.10", json!({}));
    web["status"] = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}});
    s.apply(Res::Services, web);
    let a = Assigner::start(s.client(), assigner_cfg("node-a/1"));
    let stats = a.stats().clone();
    wait_for("rounds as leader", Duration::from_secs(10), || stats.assignment_rounds.load(Ordering::Relaxed) >= 3)
        .await;
    assert!(s.status_patches().is_empty(), "no pool: nothing written: {:?}", s.status_patches());
    assert_eq!(ingress(&s, "web"), ["203.0.113.7"]);
    s.apply(Res::Pools, json!({"metadata": {"name": "public"}, "spec": {"addresses": ["198.51.100.8-198.51.100.9"]}}));
    wait_for("web moved into the pool", Duration::from_secs(10), || ingress(&s, "web") == ["198.51.100.8"]).await;
    a.stop().await;
}

#[tokio::test]
async fn assigner_never_gives_an_address_it_just_wrote_to_one_service_to_another() {
    // web gets 198.51.100.0. Just before that patch lands, Service api (older by name order,
    // same creationTimestamp) is created on the server; the watch delivers api's ADDED event
    // before web's MODIFIED one (in resourceVersion order, as a real API server does). A
    // round run on that view still sees web without its address.
    let s = FakeApiServer::start().await;
    s.apply(Res::Pools, json!({"metadata": {"name": "public"}, "spec": {"addresses": ["198.51.100.0/30"]}}));
    let a = Assigner::start(s.client(), assigner_cfg("node-a/1"));
    let stats = a.stats().clone();
    wait_for("rounds as leader", Duration::from_secs(10), || stats.assignment_rounds.load(Ordering::Relaxed) >= 2)
        .await;
    s.before_status_patch("default", "web", Res::Services, lb_service("api", "10.96.0.11", json!({})));
    s.apply(Res::Services, lb_service("web", "10.96.0.10", json!({})));
    wait_for("web's address", Duration::from_secs(10), || ingress(&s, "web") == ["198.51.100.0"]).await;
    wait_for("api's address", Duration::from_secs(10), || !ingress(&s, "api").is_empty()).await;
    let (web, api) = (ingress(&s, "web"), ingress(&s, "api"));
    s.release_watch_events();
    assert_ne!(web, api, "two Services hold one address: web {web:?}, api {api:?}");
    a.stop().await;
}
