//! L2 membership from per-node Leases (`xlb::k8s::Membership`) against the in-process fake API
//! server (`support/fake_apiserver.rs`: Leases with get, create, update, delete, list and watch
//! by label). Three members with a 2 s lease renewed every 500 ms: every node sees the same
//! members and so the same owner per VIP; a node that stops cleanly leaves at once; a node that
//! dies (its task gone without deleting its Lease) is dropped after the lease duration and not
//! before; an unhealthy node deletes its Lease; a node whose API server fails keeps its last
//! member set. Every wait is for a condition, with a deadline.

mod support;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, Res};
use xlb::k8s::{MEMBER_LABEL, Membership, MembershipConfig, lease_name};

const NS: &str = "kube-system";
const DURATION: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(500);

fn cfg(node: &str) -> MembershipConfig {
    MembershipConfig { namespace: NS.into(), node: node.into(), lease_duration: DURATION, renew_interval: RENEW }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// Polls `f` every 20 ms until it returns `Some`; panics with `what` after `within`.
async fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn start(s: &FakeApiServer, node: &str) -> Membership {
    let m = Membership::start(s.client(), cfg(node));
    m.set_healthy(true);
    m
}

#[tokio::test]
async fn members_agree_and_a_clean_stop_leaves_at_once() {
    let s = FakeApiServer::start().await;
    let (a, b, c) = (start(&s, "node-a"), start(&s, "node-b"), start(&s, "node-c"));
    let all = set(&["node-a", "node-b", "node-c"]);
    for m in [&a, &b, &c] {
        let node = m.config().node.clone();
        wait_for(&format!("{node} sees three members"), Duration::from_secs(5), || {
            (m.members(Instant::now()).as_ref() == Some(&all)).then_some(())
        })
        .await;
    }
    // The Lease as the API server holds it: name, label, holder, duration.
    let l = s.get(Res::Leases, NS, &lease_name("node-b")).expect("node-b's lease");
    assert_eq!(l["metadata"]["labels"][MEMBER_LABEL], "true", "{l}");
    assert_eq!(l["spec"]["holderIdentity"], "node-b", "{l}");
    assert_eq!(l["spec"]["leaseDurationSeconds"], 2, "{l}");
    // The same members give every node the same owner per VIP.
    for i in 0..50u32 {
        let vip = IpAddr::from(std::net::Ipv4Addr::from(0xc633_6400 + i));
        let owners: BTreeSet<Option<String>> = [&a, &b, &c]
            .iter()
            .map(|m| {
                let members = m.members(Instant::now()).expect("members known");
                xlb::announce::l2::owner(vip, members.iter().map(String::as_str)).map(str::to_owned)
            })
            .collect();
        assert_eq!(owners.len(), 1, "{vip}: {owners:?}");
    }

    // A clean stop deletes the Lease: the others drop node-b long before its lease would
    // expire (watch latency, not the 2 s duration).
    let stopped = Instant::now();
    b.stop(true).await;
    assert!(s.get(Res::Leases, NS, &lease_name("node-b")).is_none(), "node-b's lease deleted");
    let left = wait_for("node-b gone from a and c", DURATION, || {
        let want = set(&["node-a", "node-c"]);
        (a.members(Instant::now()).as_ref() == Some(&want) && c.members(Instant::now()).as_ref() == Some(&want))
            .then(|| stopped.elapsed())
    })
    .await;
    println!("a clean stop was seen by the others after {left:?}");
    assert!(left < Duration::from_secs(1), "took {left:?}");
    assert!(s.lease_deletes() >= 1);
    a.stop(true).await;
    c.stop(true).await;
}

#[tokio::test]
async fn a_dead_node_is_dropped_after_the_lease_duration_and_not_before() {
    let s = FakeApiServer::start().await;
    let a = start(&s, "node-a");
    let b = start(&s, "node-b");
    wait_for("a sees both", Duration::from_secs(5), || {
        (a.members(Instant::now()) == Some(set(&["node-a", "node-b"]))).then_some(())
    })
    .await;
    // node-b dies: its task ends without deleting the Lease (as a kill -9 leaves it).
    let died = Instant::now();
    b.stop(false).await;
    let last_renewal =
        s.get(Res::Leases, NS, &lease_name("node-b")).expect("the dead node's lease stays")["spec"]["renewTime"]
            .clone();
    let dropped = wait_for("node-b expires for a", DURATION + Duration::from_secs(2), || {
        (a.members(Instant::now()) == Some(set(&["node-a"]))).then(|| died.elapsed())
    })
    .await;
    println!(
        "a dead node was dropped {dropped:?} after its last renewal task ended (lease {DURATION:?}, renew {RENEW:?})"
    );
    // Its last renewal was at most one renew interval before it died.
    assert!(dropped + RENEW >= DURATION, "dropped after {dropped:?}: too early for a {DURATION:?} lease");
    assert!(dropped <= DURATION + Duration::from_millis(300), "dropped after {dropped:?}");
    let now = s.get(Res::Leases, NS, &lease_name("node-b")).expect("lease")["spec"]["renewTime"].clone();
    assert_eq!(now, last_renewal, "nobody renewed the dead node's lease");
    a.stop(true).await;
}

#[tokio::test]
async fn an_unhealthy_node_deletes_its_lease_and_rejoins_when_healthy() {
    let s = FakeApiServer::start().await;
    let a = start(&s, "node-a");
    let b = start(&s, "node-b");
    wait_for("a sees both", Duration::from_secs(5), || {
        (a.members(Instant::now()) == Some(set(&["node-a", "node-b"]))).then_some(())
    })
    .await;
    let t = Instant::now();
    b.set_healthy(false);
    wait_for("b's lease deleted", Duration::from_secs(1), || {
        s.get(Res::Leases, NS, &lease_name("node-b")).is_none().then_some(())
    })
    .await;
    wait_for("a drops b", Duration::from_secs(1), || {
        (a.members(Instant::now()) == Some(set(&["node-a"]))).then_some(())
    })
    .await;
    println!("an unhealthy node was dropped by the others after {:?}", t.elapsed());
    assert!(b.stats().releases >= 1);
    b.set_healthy(true);
    wait_for("b back for a", Duration::from_secs(2), || {
        (a.members(Instant::now()) == Some(set(&["node-a", "node-b"]))).then_some(())
    })
    .await;
    a.stop(true).await;
    b.stop(true).await;
}

#[tokio::test]
async fn nothing_is_known_before_the_first_list_and_an_api_outage_keeps_the_last_members() {
    let s = FakeApiServer::start().await;
    s.hold_lists(Res::Leases, true);
    let a = start(&s, "node-a");
    let b = start(&s, "node-b");
    // The list is held: no member set yet (no VIP is taken before the others are known).
    // That none comes can only be watched for a while: until both nodes' tasks have written
    // their Leases twice (so they run, and renewing is not what makes members known).
    wait_for("two renewals of each node while the list is held", Duration::from_secs(5), || {
        (a.stats().renewals >= 2 && b.stats().renewals >= 2).then_some(())
    })
    .await;
    assert_eq!(a.members(Instant::now()), None, "unknown before the first list");
    assert_eq!(b.members(Instant::now()), None, "unknown before the first list");
    s.hold_lists(Res::Leases, false);
    wait_for("a sees both", Duration::from_secs(5), || {
        (a.members(Instant::now()) == Some(set(&["node-a", "node-b"]))).then_some(())
    })
    .await;
    // The API server fails for longer than a lease: no renewal succeeds anywhere, and every
    // node keeps its members instead of seeing the others expire (and taking every VIP).
    s.set_failing(true);
    let failing = Instant::now();
    wait_for("a's renewals fail", Duration::from_secs(2), || (a.stats().renew_errors > 0).then_some(())).await;
    while failing.elapsed() < DURATION + RENEW * 2 {
        assert_eq!(a.members(Instant::now()), Some(set(&["node-a", "node-b"])), "after {:?}", failing.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.set_failing(false);
    wait_for("renewals again", Duration::from_secs(3), || {
        (a.members(Instant::now()) == Some(set(&["node-a", "node-b"])) && a.stats().renewals > 2).then_some(())
    })
    .await;
    a.stop(true).await;
    b.stop(true).await;
}
