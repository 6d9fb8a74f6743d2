//! What is announced (from cluster states through the real translation) and how the driver
//! calls its announcer.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::*;
use crate::test_support::*;

const VIP: &str = "198.51.100.7";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn lb() -> Svc {
    svc("default/web", "10.96.0.10").port("http", 80, 8080).ty("LoadBalancer").node_port(30080).lb_ingress(&[VIP])
}

fn web_slice() -> Slice {
    slice("default/web-1", "web", "IPv4").port("http", 8080)
}

fn announce(svcs: Vec<Svc>, slices: Vec<Slice>, c: &Config) -> PrefixSet {
    announced_for(&state(svcs, slices, Some(our_node())), c).expect("valid config")
}

fn set(addrs: &[&str]) -> PrefixSet {
    addrs.iter().map(|a| ip(a)).collect()
}

#[test]
fn a_load_balancer_ip_with_a_ready_endpoint_is_announced_and_nothing_else_of_the_service() {
    let got = announce(vec![lb()], vec![web_slice().ep(ep("10.0.0.1"))], &cfg());
    // Not the ClusterIP 10.96.0.10 nor the NodePort address 192.168.1.10.
    assert_eq!(got, set(&[VIP]));
}

#[test]
fn a_load_balancer_ip_without_a_ready_endpoint_is_not_announced() {
    assert_eq!(announce(vec![lb()], vec![web_slice().ep(ep("10.0.0.1").not_ready())], &cfg()), set(&[]));
    assert_eq!(announce(vec![lb()], vec![], &cfg()), set(&[]), "no slice at all");
}

#[test]
fn cluster_policy_counts_a_serving_terminating_endpoint_when_none_is_ready_as_the_translation_does() {
    // TP-08: the translation sends new flows to serving terminating endpoints then.
    let got = announce(vec![lb()], vec![web_slice().ep(ep("10.0.0.1").terminating(true))], &cfg());
    assert_eq!(got, set(&[VIP]));
    let got = announce(vec![lb()], vec![web_slice().ep(ep("10.0.0.1").terminating(false))], &cfg());
    assert_eq!(got, set(&[]), "terminating and not serving");
}

#[test]
fn local_policy_announces_only_with_a_ready_endpoint_on_this_node() {
    let remote = web_slice().ep(ep("10.0.0.1").on("node-b"));
    assert_eq!(announce(vec![lb().etp_local()], vec![remote], &cfg()), set(&[]));
    let local = web_slice().ep(ep("10.0.0.1").on("node-b")).ep(ep("10.0.0.2").on(NODE));
    assert_eq!(announce(vec![lb().etp_local()], vec![local], &cfg()), set(&[VIP]));
    let local_not_ready = web_slice().ep(ep("10.0.0.1").on("node-b")).ep(ep("10.0.0.2").on(NODE).not_ready());
    assert_eq!(announce(vec![lb().etp_local()], vec![local_not_ready], &cfg()), set(&[]));
}

#[test]
fn cluster_policy_announces_with_endpoints_on_other_nodes_only() {
    let remote = web_slice().ep(ep("10.0.0.1").on("node-b"));
    assert_eq!(announce(vec![lb()], vec![remote], &cfg()), set(&[VIP]));
}

#[test]
fn only_services_of_xlbs_load_balancer_class_are_announced() {
    let eps = || vec![web_slice().ep(ep("10.0.0.1"))];
    // Default config: xlb has no class of its own and takes the Services without one.
    assert_eq!(announce(vec![lb().lb_class("example.com/other")], eps(), &cfg()), set(&[]));
    let mut c = cfg();
    c.load_balancer_class = Some("xlb.dev/lb".into());
    assert_eq!(announce(vec![lb().lb_class("xlb.dev/lb")], eps(), &c), set(&[VIP]));
    assert_eq!(announce(vec![lb()], eps(), &c), set(&[VIP]), "no class, handleDefaultLoadBalancerClass");
    c.handle_default_load_balancer_class = false;
    assert_eq!(announce(vec![lb()], eps(), &c), set(&[]));
    assert_eq!(announce(vec![lb().lb_class("xlb.dev/lb")], eps(), &c), set(&[VIP]));
}

#[test]
fn external_ips_are_announced_only_when_the_config_asks_for_them() {
    let s = || svc("default/web", "10.96.0.10").port("http", 80, 8080).external_ips(&["203.0.113.9"]);
    let eps = || vec![web_slice().ep(ep("10.0.0.1"))];
    assert_eq!(announce(vec![s()], eps(), &cfg()), set(&[]));
    let mut c = cfg();
    c.announce.external_ips = true;
    assert_eq!(announce(vec![s()], eps(), &c), set(&["203.0.113.9"]));
    assert_eq!(announce(vec![s()], vec![web_slice().ep(ep("10.0.0.1").not_ready())], &c), set(&[]));
}

#[test]
fn dual_stack_load_balancer_ips_are_announced_per_family_with_that_familys_endpoints() {
    let s = svc("default/web", "10.96.0.10")
        .cluster_ips(&["10.96.0.10", "fd00:96::10"])
        .port("http", 80, 8080)
        .ty("LoadBalancer")
        .node_port(30080)
        .lb_ingress(&[VIP, "2001:db8::7"]);
    let v4 = web_slice().ep(ep("10.0.0.1"));
    let v6 = slice("default/web-6", "web", "IPv6").port("http", 8080).ep(ep("fd00:10::1"));
    assert_eq!(announce(vec![s.clone()], vec![v4.clone(), v6], &cfg()), set(&[VIP, "2001:db8::7"]));
    assert_eq!(announce(vec![s], vec![v4], &cfg()), set(&[VIP]), "no IPv6 endpoint: the IPv6 VIP is not announced");
}

#[test]
fn an_address_shared_by_two_services_is_announced_while_either_has_an_endpoint() {
    let a = lb();
    let b = svc("default/api", "10.96.0.11").port("https", 443, 8443).ty("LoadBalancer").lb_ingress(&[VIP]);
    let a_eps = web_slice().ep(ep("10.0.0.1").not_ready());
    let b_eps = slice("default/api-1", "api", "IPv4").port("https", 8443).ep(ep("10.0.0.2"));
    assert_eq!(announce(vec![a.clone(), b.clone()], vec![a_eps.clone(), b_eps], &cfg()), set(&[VIP]));
    let b_none = slice("default/api-1", "api", "IPv4").port("https", 8443).ep(ep("10.0.0.2").not_ready());
    assert_eq!(announce(vec![a, b], vec![a_eps, b_none], &cfg()), set(&[]));
}

#[test]
fn spec_names_lead_back_to_their_service() {
    assert_eq!(service_of("default/web:http"), Some(("default", "web")));
    assert_eq!(service_of("kube-system/dns:53/ipv6/external"), Some(("kube-system", "dns")));
    assert_eq!(service_of("nonsense"), None);
}

#[test]
fn a_prefix_set_prints_as_host_prefixes() {
    assert_eq!(set(&["2001:db8::1", "10.0.0.2", "10.0.0.1"]).to_string(), "10.0.0.1/32, 10.0.0.2/32, 2001:db8::1/128");
    assert_eq!(set(&[]).to_string(), "none");
}

/// An announcer that records each call and fails while `fail` is set.
#[derive(Debug, Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<PrefixSet>>>,
    fail: Arc<Mutex<bool>>,
}

impl Announcer for Recorder {
    fn announce(&mut self, set: &PrefixSet) -> Result<Applied, AnnounceError> {
        self.calls.lock().expect("lock").push(set.clone());
        if *self.fail.lock().expect("lock") {
            return Err(AnnounceError::Refused { socket: "test.ctl".into(), reply: "8002 no".into() });
        }
        Ok(Applied::Reconfigured { written: true, reply: "0003 Reconfigured".into() })
    }

    fn describe(&self) -> String {
        "recorder".into()
    }
}

#[test]
fn the_driver_calls_the_announcer_only_when_the_set_changes() {
    let r = Recorder::default();
    let mut a = Announcement::new(Box::new(r.clone()), Duration::from_secs(5));
    let t0 = Instant::now();
    assert!(matches!(a.sync(&set(&[VIP]), t0), Some(Ok(_))));
    assert!(a.sync(&set(&[VIP]), t0 + Duration::from_secs(100)).is_none());
    assert!(matches!(a.sync(&set(&[]), t0), Some(Ok(_))), "withdrawal");
    assert_eq!(*r.calls.lock().expect("lock"), vec![set(&[VIP]), set(&[])]);
    assert_eq!(a.applied(), Some(&set(&[])));
}

#[test]
fn the_driver_retries_a_failed_set_after_the_retry_period_and_a_new_set_at_once() {
    let r = Recorder::default();
    *r.fail.lock().expect("lock") = true;
    let mut a = Announcement::new(Box::new(r.clone()), Duration::from_secs(5));
    let t0 = Instant::now();
    assert!(matches!(a.sync(&set(&[VIP]), t0), Some(Err(_))));
    assert_eq!(a.applied(), None);
    assert!(a.sync(&set(&[VIP]), t0 + Duration::from_secs(1)).is_none(), "within the retry period");
    assert!(matches!(a.sync(&set(&[]), t0 + Duration::from_secs(1)), Some(Err(_))), "another set: at once");
    *r.fail.lock().expect("lock") = false;
    assert!(a.sync(&set(&[]), t0 + Duration::from_secs(2)).is_none());
    assert!(matches!(a.sync(&set(&[]), t0 + Duration::from_secs(7)), Some(Ok(_))), "retried");
    assert_eq!(r.calls.lock().expect("lock").len(), 3);
}

#[test]
fn a_withdrawal_at_stop_does_not_wait_for_the_retry_period() {
    let r = Recorder::default();
    *r.fail.lock().expect("lock") = true;
    let mut a = Announcement::new(Box::new(r.clone()), Duration::from_secs(5));
    let t0 = Instant::now();
    assert!(matches!(a.sync(&set(&[]), t0), Some(Err(_))));
    *r.fail.lock().expect("lock") = false;
    assert!(a.sync(&set(&[]), t0).is_none(), "sync waits");
    assert!(matches!(a.sync_now(&set(&[]), t0), Some(Ok(_))), "sync_now does not");
    assert!(a.sync_now(&set(&[]), t0).is_none(), "but skips what is applied");
}

/// The members (of `members`) that answer ARP for `vip`: each announces what its own
/// translation announces and it owns among the members ([`l2::owned`]).
fn l2_answering(
    members: &[&str],
    svcs: &dyn Fn() -> Vec<Svc>,
    eps: &dyn Fn() -> Vec<Slice>,
    vip: IpAddr,
) -> Vec<String> {
    let all: std::collections::BTreeSet<String> = members.iter().map(|m| (*m).to_owned()).collect();
    members
        .iter()
        .filter(|m| {
            let c = Config { node_name: Some((**m).to_owned()), ..Default::default() };
            let st = state(svcs(), eps(), Some(node(m).addr("InternalIP", "192.168.1.10")));
            let announced = announced_for(&st, &c).expect("valid config");
            let local = l2::local_nodes(&crate::cluster::ClusterIndex::from_state(&st), &Scope::from_config(&c));
            l2::owned(&announced, &all, m, &local).contains(&vip)
        })
        .map(|m| (*m).to_owned())
        .collect()
}

#[test]
fn l2_a_local_policy_vip_is_answered_by_a_member_that_has_a_local_endpoint() {
    let members = [NODE, "node-b"];
    let vip = (1..=200u32)
        .map(|i| IpAddr::from(std::net::Ipv4Addr::from(0xc633_6400 + i)))
        .find(|v| l2::owner(*v, members) == Some(NODE))
        .expect("some VIP owned by NODE");
    let vip_s = vip.to_string();
    let service = |local: bool| {
        let s = svc("default/web", "10.96.0.10")
            .port("http", 80, 8080)
            .ty("LoadBalancer")
            .node_port(30080)
            .lb_ingress(&[vip_s.as_str()]);
        if local { s.etp_local() } else { s }
    };
    let eps = || vec![web_slice().ep(ep("10.0.0.1").on("node-b"))];
    assert_eq!(l2_answering(&members, &|| vec![service(true)], &eps, vip), ["node-b"]);
    // Under the Cluster policy the owner among all members answers, with or without an
    // endpoint on its node.
    assert_eq!(l2_answering(&members, &|| vec![service(false)], &eps, vip), [NODE]);
}

#[test]
fn l2_local_nodes_count_only_usable_endpoints_of_the_vips_family_and_leave_out_shared_cluster_vips() {
    let local_nodes = |svcs: Vec<Svc>, slices: Vec<Slice>| {
        let st = state(svcs, slices, Some(our_node()));
        l2::local_nodes(&crate::cluster::ClusterIndex::from_state(&st), &Scope::from_config(&cfg()))
    };
    let v6_slice = slice("default/web-2", "web", "IPv6").port("http", 8080);
    let got = local_nodes(
        vec![lb().etp_local()],
        vec![
            web_slice()
                .ep(ep("10.0.0.1").on("node-b"))
                .ep(ep("10.0.0.2").on("node-c").not_ready())
                .ep(ep("10.0.0.4").on("node-b")),
            v6_slice.ep(ep("fd00::1").on("node-d")),
        ],
    );
    let nodes: Vec<&str> = got.get(&ip(VIP)).map(|n| n.iter().map(|n| &**n).collect()).unwrap_or_default();
    assert_eq!(nodes, ["node-b"], "node-b once; not-ready node-c and IPv6-only node-d would not announce it");
    // A Cluster-policy Service with an endpoint on the same VIP has every node announce it.
    let other = svc("default/api", "10.96.0.11").port("grpc", 81, 9090).ty("LoadBalancer").lb_ingress(&[VIP]);
    let api_slice = slice("default/api-1", "api", "IPv4").port("grpc", 9090).ep(ep("10.0.0.3").on("node-c"));
    let got = local_nodes(vec![lb().etp_local(), other], vec![web_slice().ep(ep("10.0.0.1").on("node-b")), api_slice]);
    assert!(!got.contains_key(&ip(VIP)), "{got:?}");
}

/// A xorshift64* generator for the random edits below (repeatable, no dependency).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[test]
fn l2_local_nodes_kept_across_changes_equal_a_full_walk_after_every_change() {
    // Six Services over three shared VIPs (plus one IPv6), random policies, types, classes and
    // endpoints on three nodes; each step sets or deletes one Service or one slice, and the
    // cache is given the Services the index says changed.
    let vips = ["198.51.100.1", "198.51.100.2", "198.51.100.3", "2001:db8::1"];
    let nodes = ["node-a", "node-b", "node-c"];
    let mut scope_cfg = cfg();
    scope_cfg.announce.external_ips = true;
    let scope = Scope::from_config(&scope_cfg);
    // Steps whose answer lists a VIP with nodes, and steps after which a shared VIP left the
    // answer (a Service of the Cluster policy with a usable endpoint took it).
    let (mut with_nodes, mut left) = (0, 0);
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut ix = crate::cluster::ClusterIndex::new();
        let mut cache = l2::LocalNodesCache::default();
        cache.update(&ix, &crate::cluster::Changes::Full, &scope);
        for step in 0..200 {
            let mut changes = crate::cluster::Changes::default();
            let i = rng.below(6);
            let name = format!("svc-{i}");
            match rng.below(5) {
                0 | 1 => {
                    let mut s = svc(&format!("default/{name}"), "10.96.0.10").port("http", 80, 8080);
                    s = match rng.below(3) {
                        0 => s.ty("LoadBalancer").lb_ingress(&[vips[rng.below(4) as usize]]),
                        1 => s.ty("LoadBalancer").lb_ingress(&[vips[rng.below(4) as usize]]).lb_class("other"),
                        _ => s.external_ips(&[vips[rng.below(4) as usize]]),
                    };
                    if rng.below(2) == 0 {
                        s = s.etp_local();
                    }
                    if rng.below(4) == 0 {
                        s = s.publish_not_ready();
                    }
                    changes.add(ix.set_service(Arc::new(s.0)));
                }
                2 => {
                    let r = crate::cluster::ServiceRef::new("default", name);
                    ix.remove_service(&r);
                    changes.add(r);
                }
                3 => {
                    let family = if rng.below(3) == 0 { "IPv6" } else { "IPv4" };
                    let mut sl = slice(&format!("default/{name}-{}", rng.below(2)), &name, family).port("http", 8080);
                    for k in 0..rng.below(4) {
                        let mut e = ep(&format!("10.0.{i}.{k}")).on(nodes[rng.below(3) as usize]);
                        e = match rng.below(4) {
                            0 => e.not_ready(),
                            1 => e.terminating(rng.below(2) == 0),
                            _ => e,
                        };
                        sl = sl.ep(e);
                    }
                    for r in ix.set_slice(Arc::new(sl.0)) {
                        changes.add(r);
                    }
                }
                _ => {
                    if let Some(r) = ix.remove_slice("default", &format!("{name}-{}", rng.below(2))) {
                        changes.add(r);
                    }
                }
            }
            let before = cache.nodes().clone();
            cache.update(&ix, &changes, &scope);
            assert_eq!(cache.nodes(), &l2::local_nodes(&ix, &scope), "seed {seed} step {step}");
            with_nodes += usize::from(cache.nodes().values().any(|n| !n.is_empty()));
            left += usize::from(before.keys().any(|v| !cache.nodes().contains_key(v)));
        }
    }
    assert!(with_nodes > 100 && left > 100, "the edits reach both cases: {with_nodes}, {left}");
}
