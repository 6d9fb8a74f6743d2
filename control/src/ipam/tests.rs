use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use proptest::prelude::*;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn spec(addresses: &[&str]) -> PoolSpec {
    PoolSpec {
        addresses: addresses.iter().map(|s| (*s).to_owned()).collect(),
        auto_assign: true,
        avoid_buggy_ips: false,
        service_allocation: None,
    }
}

fn set(pools: &[(&str, PoolSpec)]) -> PoolSet {
    let (s, rejected) = PoolSet::build(pools.iter().map(|(n, p)| (*n, p)));
    assert!(rejected.is_empty(), "{rejected:?}");
    s
}

/// A LoadBalancer Service `ns/name` (namespace `default` when not given), IPv4 single-stack.
#[derive(Clone, Debug)]
struct S(Service);

fn lb(ns_name: &str) -> S {
    let (ns, name) = ns_name.split_once('/').unwrap_or(("default", ns_name));
    S(Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ip_families: Some(vec!["IPv4".into()]),
            ..Default::default()
        }),
        status: None,
    })
}

impl S {
    fn families(mut self, f: &[&str]) -> Self {
        self.0.spec.as_mut().unwrap().ip_families = Some(f.iter().map(|s| (*s).to_owned()).collect());
        self
    }
    fn class(mut self, c: &str) -> Self {
        self.0.spec.as_mut().unwrap().load_balancer_class = Some(c.into());
        self
    }
    fn ty(mut self, t: &str) -> Self {
        self.0.spec.as_mut().unwrap().type_ = Some(t.into());
        self
    }
    fn lb_ip(mut self, a: &str) -> Self {
        self.0.spec.as_mut().unwrap().load_balancer_ip = Some(a.into());
        self
    }
    fn ann(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }
    fn label(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.labels.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }
    fn status(mut self, addrs: &[&str]) -> Self {
        apply_to_service(&mut self.0, &addrs.iter().map(|a| ip(a)).collect::<Vec<_>>());
        self
    }
    fn created(mut self, secs: i64) -> Self {
        self.0.metadata.creation_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap()));
        self
    }
    fn arc(self) -> Arc<Service> {
        Arc::new(self.0)
    }
}

fn default_filter() -> ClassFilter {
    ClassFilter { class: Some("xlb.dev/lb".into()), handle_default: true }
}

fn run(pools: &PoolSet, svcs: Vec<S>) -> Assignment {
    let svcs: Vec<Arc<Service>> = svcs.into_iter().map(S::arc).collect();
    assign(pools, &svcs, &default_filter(), Options::default())
}

fn key(ns_name: &str) -> ServiceKey {
    let (ns, name) = ns_name.split_once('/').unwrap_or(("default", ns_name));
    ServiceKey { namespace: ns.into(), name: name.into() }
}

fn addrs(a: &Assignment, ns_name: &str) -> Vec<String> {
    match a.services.get(&key(ns_name)) {
        Some(Outcome::Assigned(x)) => x.addresses.iter().map(ToString::to_string).collect(),
        other => panic!("{ns_name}: {other:?}"),
    }
}

fn failed(a: &Assignment, ns_name: &str) -> AssignError {
    match a.services.get(&key(ns_name)) {
        Some(Outcome::Failed(e)) => e.clone(),
        other => panic!("{ns_name}: expected a failure, got {other:?}"),
    }
}

/// Feeds an assignment back into the Services' status, as the controller's patch does.
fn write_back(svcs: &[S], a: &Assignment) -> Vec<S> {
    svcs.iter()
        .map(|s| {
            let mut s = s.clone();
            if let Some(o) = a.services.get(&ServiceKey::of(&s.0)) {
                apply_to_service(&mut s.0, o.addresses());
            }
            s
        })
        .collect()
}

// ----- pool parsing and validation

#[test]
fn the_whole_ipv6_space_as_a_cidr_parses_into_one_range() {
    let v4 = parse_addresses_entry("0.0.0.0/0").expect("IPv4 /0");
    assert_eq!((v4.first(), v4.last()), (ip("0.0.0.0"), ip("255.255.255.255")));
    let r = std::panic::catch_unwind(|| parse_addresses_entry("::/0"));
    let r = r.expect("parse_addresses_entry panicked on ::/0").expect("IPv6 /0");
    assert_eq!((r.first(), r.last()), (ip("::"), ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")));
}

#[test]
fn cidrs_and_ranges_of_both_families_parse_into_inclusive_ranges() {
    let r = parse_addresses_entry("192.0.2.0/30").unwrap();
    assert_eq!((r.first(), r.last()), (ip("192.0.2.0"), ip("192.0.2.3")));
    let r = parse_addresses_entry(" 192.0.2.10 - 192.0.2.20 ").unwrap();
    assert_eq!((r.first(), r.last()), (ip("192.0.2.10"), ip("192.0.2.20")));
    let r = parse_addresses_entry("2001:db8::/126").unwrap();
    assert_eq!((r.first(), r.last()), (ip("2001:db8::"), ip("2001:db8::3")));
    let r = parse_addresses_entry("2001:db8::5-2001:db8::5").unwrap();
    assert!(r.contains(ip("2001:db8::5")) && !r.contains(ip("2001:db8::6")) && !r.contains(ip("0.0.0.5")));
    let r = parse_addresses_entry("10.0.0.7/32").unwrap();
    assert_eq!(r.first(), r.last());
    let r = parse_addresses_entry("0.0.0.0/0").unwrap();
    assert_eq!(r.last(), ip("255.255.255.255"));
}

#[test]
fn bad_address_entries_say_what_is_wrong() {
    let e = parse_addresses_entry("192.0.2.1/24").unwrap_err();
    assert!(e.contains("host bits") && e.contains("192.0.2.0/24"), "{e}");
    assert!(parse_addresses_entry("192.0.2.9-192.0.2.1").unwrap_err().contains("after"));
    assert!(parse_addresses_entry("192.0.2.1-2001:db8::1").unwrap_err().contains("mixes"));
    assert!(parse_addresses_entry("192.0.2.1").unwrap_err().contains("neither a CIDR"));
    assert!(parse_addresses_entry("192.0.2.0/33").unwrap_err().contains("prefix length"));
    assert!(parse_addresses_entry("foo/24").unwrap_err().contains("not an IP"));
}

#[test]
fn pool_validation_names_the_field() {
    let e = Pool::new("p", &spec(&["10.0.0.0/24", "bad"])).unwrap_err();
    assert_eq!(e.field, "addresses[1]");
    let e = Pool::new("p", &spec(&["10.0.0.0/24", "10.0.0.200-10.0.1.5"])).unwrap_err();
    assert_eq!(e.field, "addresses[1]");
    assert!(e.message.contains("overlaps addresses[0]"), "{e}");
    assert_eq!(Pool::new("p", &spec(&[])).unwrap_err().field, "addresses");
    assert_eq!(Pool::new(" ", &spec(&["10.0.0.0/24"])).unwrap_err().field, "name");
    let mut s = spec(&["10.0.0.0/24"]);
    s.service_allocation = Some(ServiceAllocation {
        service_selectors: vec![LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: SelectorOperator::In,
                values: vec![],
            }],
            ..Default::default()
        }],
        ..Default::default()
    });
    let e = Pool::new("p", &s).unwrap_err();
    assert_eq!(e.field, "serviceAllocation.serviceSelectors[0].matchExpressions[0].values");
}

#[test]
fn overlapping_pools_leave_the_later_name_out_and_keep_the_others() {
    let a = spec(&["10.0.0.0/24"]);
    let b = spec(&["10.1.0.0/24", "10.0.0.128-10.0.0.130"]);
    let c = spec(&["10.2.0.0/24"]);
    let (s, rejected) = PoolSet::build([("b", &b), ("a", &a), ("c", &c)]);
    assert_eq!(s.pools().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "c"]);
    assert_eq!(rejected.len(), 1);
    assert_eq!((rejected[0].pool.as_str(), rejected[0].field.as_str()), ("b", "addresses[1]"));
    assert!(rejected[0].message.contains("pool \"a\""), "{}", rejected[0]);
    let (_, rejected) = PoolSet::build([("a", &a), ("a", &c)]);
    assert_eq!(rejected[0].field, "name");
}

#[test]
fn label_selectors_follow_kubernetes_semantics() {
    let labels: BTreeMap<String, String> = [("tier".to_owned(), "web".to_owned())].into();
    let req = |op, values: &[&str]| LabelSelector {
        match_expressions: vec![LabelSelectorRequirement {
            key: "tier".into(),
            operator: op,
            values: values.iter().map(|s| (*s).to_owned()).collect(),
        }],
        ..Default::default()
    };
    assert!(LabelSelector::default().matches(&labels));
    assert!(req(SelectorOperator::In, &["web", "db"]).matches(&labels));
    assert!(!req(SelectorOperator::NotIn, &["web"]).matches(&labels));
    assert!(req(SelectorOperator::NotIn, &["web"]).matches(&BTreeMap::new()));
    assert!(req(SelectorOperator::Exists, &[]).matches(&labels));
    assert!(!req(SelectorOperator::DoesNotExist, &[]).matches(&labels));
    let ml = LabelSelector { match_labels: [("tier".to_owned(), "db".to_owned())].into(), ..Default::default() };
    assert!(!ml.matches(&labels));
}

// ----- assignment

#[test]
fn services_get_the_lowest_free_addresses_in_name_order() {
    let pools = set(&[("p", spec(&["192.0.2.10-192.0.2.12"]))]);
    let a = run(&pools, vec![lb("b"), lb("a"), lb("ns2/a")]);
    assert_eq!(addrs(&a, "a"), ["192.0.2.10"]);
    assert_eq!(addrs(&a, "b"), ["192.0.2.11"]);
    assert_eq!(addrs(&a, "ns2/a"), ["192.0.2.12"]);
}

#[test]
fn only_load_balancer_services_of_xlbs_class_are_assigned() {
    let pools = set(&[("p", spec(&["192.0.2.0/28"]))]);
    let a = run(
        &pools,
        vec![
            lb("ours"),
            lb("named").class("xlb.dev/lb"),
            lb("other").class("example.com/lb"),
            lb("cip").ty("ClusterIP"),
        ],
    );
    assert_eq!(a.services.keys().map(ToString::to_string).collect::<Vec<_>>(), ["default/named", "default/ours"]);
    let no_default = ClassFilter { class: Some("xlb.dev/lb".into()), handle_default: false };
    let svcs = vec![lb("ours").arc(), lb("named").class("xlb.dev/lb").arc()];
    let a = assign(&pools, &svcs, &no_default, Options::default());
    assert_eq!(a.services.keys().map(ToString::to_string).collect::<Vec<_>>(), ["default/named"]);
    let no_class = ClassFilter { class: None, handle_default: true };
    let a = assign(&pools, &svcs, &no_class, Options::default());
    assert_eq!(a.services.keys().map(ToString::to_string).collect::<Vec<_>>(), ["default/ours"]);
}

#[test]
fn an_existing_status_is_kept_so_a_restart_gives_the_same_assignment() {
    let pools = set(&[("p", spec(&["192.0.2.10-192.0.2.20"]))]);
    // "b" was assigned .15 earlier (say before "a" existed); "a" now takes the lowest free.
    let svcs = vec![lb("a"), lb("b").status(&["192.0.2.15"]), lb("c")];
    let first = run(&pools, svcs.clone());
    assert_eq!(addrs(&first, "b"), ["192.0.2.15"]);
    assert_eq!(addrs(&first, "a"), ["192.0.2.10"]);
    assert_eq!(addrs(&first, "c"), ["192.0.2.11"]);
    assert!(matches!(&first.services[&key("b")], Outcome::Assigned(x) if x.kept));
    // A restart sees the written status and decides the same, all kept, nothing to write.
    let again_svcs = write_back(&svcs, &first);
    let again = run(&pools, again_svcs.clone());
    assert_eq!(
        again.services.values().map(Outcome::addresses).collect::<Vec<_>>(),
        first.services.values().map(Outcome::addresses).collect::<Vec<_>>()
    );
    assert!(again.services.values().all(|o| matches!(o, Outcome::Assigned(x) if x.kept)));
    let arcs: Vec<Arc<Service>> = again_svcs.into_iter().map(S::arc).collect();
    assert!(again.changes(&arcs).is_empty());
}

#[test]
fn the_older_service_keeps_an_address_two_statuses_claim() {
    let pools = set(&[("p", spec(&["192.0.2.10-192.0.2.20"]))]);
    let a = run(&pools, vec![lb("a").status(&["192.0.2.15"]).created(20), lb("b").status(&["192.0.2.15"]).created(10)]);
    assert_eq!(addrs(&a, "b"), ["192.0.2.15"]);
    assert_eq!(addrs(&a, "a"), ["192.0.2.10"]);
}

#[test]
fn spec_load_balancer_ip_and_the_annotations_are_honoured() {
    let pools = set(&[("p", spec(&["192.0.2.0/24", "2001:db8::/120"]))]);
    let a = run(
        &pools,
        vec![
            lb("auto"),
            lb("field").lb_ip("192.0.2.7"),
            lb("xlb").ann(ANNOTATION_LOAD_BALANCER_IPS, "192.0.2.0"),
            lb("metallb").ann(METALLB_LOAD_BALANCER_IPS_OLD, "192.0.2.9"),
            lb("metallb-new").ann(METALLB_LOAD_BALANCER_IPS, "192.0.2.8"),
            lb("ds").families(&["IPv6", "IPv4"]).ann(ANNOTATION_LOAD_BALANCER_IPS, " 192.0.2.44, 2001:db8::44"),
        ],
    );
    assert_eq!(addrs(&a, "field"), ["192.0.2.7"]);
    assert_eq!(addrs(&a, "xlb"), ["192.0.2.0"]);
    assert_eq!(addrs(&a, "metallb"), ["192.0.2.9"]);
    assert_eq!(addrs(&a, "metallb-new"), ["192.0.2.8"]);
    assert_eq!(addrs(&a, "ds"), ["2001:db8::44", "192.0.2.44"], "in the order of spec.ipFamilies");
    assert_eq!(addrs(&a, "auto"), ["192.0.2.1"], "requests are served before automatic choices");
}

#[test]
fn a_request_that_changes_moves_the_service_off_its_old_address() {
    let pools = set(&[("p", spec(&["192.0.2.0/24"]))]);
    let a = run(&pools, vec![lb("a").status(&["192.0.2.1"]).lb_ip("192.0.2.50")]);
    assert_eq!(addrs(&a, "a"), ["192.0.2.50"]);
}

#[test]
fn requests_that_cannot_be_served_say_why() {
    let pools = set(&[("p", spec(&["192.0.2.0/24"])), ("q", spec(&["198.51.100.0/24", "2001:db8::/120"]))]);
    let a = run(
        &pools,
        vec![
            lb("outside").lb_ip("203.0.113.1"),
            lb("holder").status(&["192.0.2.5"]),
            lb("taken").lb_ip("192.0.2.5"),
            lb("v6-on-v4").lb_ip("2001:db8::1"),
            lb("two-v4").ann(ANNOTATION_LOAD_BALANCER_IPS, "192.0.2.1,192.0.2.2"),
            lb("half").families(&["IPv4", "IPv6"]).ann(ANNOTATION_LOAD_BALANCER_IPS, "198.51.100.1"),
            lb("mixed").families(&["IPv4", "IPv6"]).ann(ANNOTATION_LOAD_BALANCER_IPS, "192.0.2.1,2001:db8::1"),
            lb("both").lb_ip("192.0.2.1").ann(ANNOTATION_LOAD_BALANCER_IPS, "192.0.2.1"),
            lb("disagree").ann(ANNOTATION_LOAD_BALANCER_IPS, "192.0.2.1").ann(METALLB_LOAD_BALANCER_IPS, "192.0.2.2"),
            lb("garbage").ann(ANNOTATION_LOAD_BALANCER_IPS, "not-an-ip"),
            lb("fam").families(&["IPv5"]),
        ],
    );
    assert_eq!(failed(&a, "outside"), AssignError::NotInPool { address: ip("203.0.113.1") });
    assert_eq!(failed(&a, "taken"), AssignError::InUse { address: ip("192.0.2.5"), by: key("holder") });
    assert!(matches!(failed(&a, "v6-on-v4"), AssignError::WrongFamily { field, .. } if field == "spec.loadBalancerIP"));
    assert!(matches!(failed(&a, "two-v4"), AssignError::WrongFamily { message, .. } if message.contains("two IPv4")));
    assert!(matches!(failed(&a, "half"), AssignError::WrongFamily { message, .. } if message.contains("no IPv6")));
    assert!(matches!(failed(&a, "mixed"), AssignError::MixedPools { .. }));
    assert!(matches!(failed(&a, "both"), AssignError::BadRequest { field, .. } if field == "spec.loadBalancerIP"));
    assert!(
        matches!(failed(&a, "disagree"), AssignError::BadRequest { field, .. } if field == "metadata.annotations[metallb.io/loadBalancerIPs]")
    );
    assert!(matches!(failed(&a, "garbage"), AssignError::BadRequest { message, .. } if message.contains("not-an-ip")));
    assert!(matches!(failed(&a, "fam"), AssignError::BadRequest { field, .. } if field == "spec.ipFamilies[0]"));
    let msg = failed(&a, "taken").to_string();
    assert_eq!(msg, "requested address 192.0.2.5 is in use by Service default/holder");
}

#[test]
fn an_exhausted_pool_reports_every_pool_tried() {
    let pools = set(&[("p", spec(&["192.0.2.1-192.0.2.2"])), ("q", spec(&["192.0.2.3/32"]))]);
    let a = run(&pools, vec![lb("a"), lb("b"), lb("c"), lb("d")]);
    assert_eq!(addrs(&a, "c"), ["192.0.2.3"]);
    assert_eq!(failed(&a, "d"), AssignError::Exhausted { pools: vec!["p".into(), "q".into()] });
    assert_eq!(failed(&a, "d").to_string(), "no free address in address pool(s) p, q");
}

#[test]
fn dual_stack_takes_both_families_from_one_pool_or_nothing() {
    let pools = set(&[
        ("a-v4only", spec(&["192.0.2.0/30"])),
        ("b-dual", spec(&["198.51.100.0/31", "2001:db8::/127"])),
        ("c-v6only", spec(&["2001:db8:1::/126"])),
    ]);
    let ds = |n: &str| lb(n).families(&["IPv4", "IPv6"]);
    let a = run(&pools, vec![ds("x"), ds("y"), ds("z"), lb("zz-v6").families(&["IPv6"])]);
    assert_eq!(addrs(&a, "x"), ["198.51.100.0", "2001:db8::"]);
    assert_eq!(addrs(&a, "y"), ["198.51.100.1", "2001:db8::1"]);
    assert_eq!(failed(&a, "z"), AssignError::Exhausted { pools: vec!["b-dual".into()] });
    assert_eq!(addrs(&a, "zz-v6"), ["2001:db8:1::"], "a-v4only lacks IPv6, b-dual is full");
    let pools = set(&[("v4", spec(&["192.0.2.0/30"]))]);
    assert_eq!(
        failed(&run(&pools, vec![ds("x")]), "x"),
        AssignError::NoPool { families: vec![Family::V4, Family::V6] }
    );
}

#[test]
fn families_come_from_the_cluster_ips_when_ip_families_is_unset() {
    let pools = set(&[("p", spec(&["192.0.2.0/30", "2001:db8::/126"]))]);
    let mut s = lb("v6");
    let sp = s.0.spec.as_mut().unwrap();
    sp.ip_families = None;
    sp.cluster_ips = Some(vec!["fd00::10".into()]);
    let a = run(&pools, vec![s]);
    assert_eq!(addrs(&a, "v6"), ["2001:db8::"]);
}

#[test]
fn avoid_buggy_ips_skips_dot_0_and_dot_255_unless_asked_for() {
    let mut p = spec(&["192.0.2.255-192.0.3.1"]);
    p.avoid_buggy_ips = true;
    let pools = set(&[("p", p)]);
    let a = run(&pools, vec![lb("a"), lb("b"), lb("asked").lb_ip("192.0.3.0")]);
    assert_eq!(addrs(&a, "a"), ["192.0.3.1"]);
    assert_eq!(failed(&a, "b"), AssignError::Exhausted { pools: vec!["p".into()] });
    assert_eq!(addrs(&a, "asked"), ["192.0.3.0"]);
}

fn restricted(
    addresses: &[&str],
    priority: Option<i32>,
    namespaces: &[&str],
    selector: Option<(&str, &str)>,
) -> PoolSpec {
    let mut p = spec(addresses);
    p.service_allocation = Some(ServiceAllocation {
        priority,
        namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
        service_selectors: selector
            .map(|(k, v)| LabelSelector { match_labels: [(k.to_owned(), v.to_owned())].into(), ..Default::default() })
            .into_iter()
            .collect(),
    });
    p
}

#[test]
fn pools_are_tried_by_priority_then_restricted_first_then_name() {
    let pools = set(&[
        ("a-open", spec(&["10.0.0.0/30"])),
        ("b-shop", restricted(&["10.0.1.0/30"], None, &["shop"], None)),
        ("c-prio", restricted(&["10.0.2.0/30"], Some(5), &[], None)),
        ("d-prio-high", restricted(&["10.0.3.0/30"], Some(1), &["shop"], None)),
        ("e-web", restricted(&["10.0.4.0/30"], None, &[], Some(("tier", "web")))),
    ]);
    let a = run(&pools, vec![lb("shop/x"), lb("default/y"), lb("default/web").label("tier", "web")]);
    assert_eq!(addrs(&a, "shop/x"), ["10.0.3.0"], "priority 1 beats priority 5");
    assert_eq!(addrs(&a, "default/web"), ["10.0.2.0"], "priority before restriction");
    assert_eq!(addrs(&a, "default/y"), ["10.0.2.1"], "d-prio-high does not allow default");
    let pools = set(&[
        ("a-open", spec(&["10.0.0.0/30"])),
        ("b-shop", restricted(&["10.0.1.0/30"], None, &["shop"], None)),
        ("e-web", restricted(&["10.0.4.0/30"], None, &["default"], Some(("tier", "web")))),
    ]);
    let a = run(
        &pools,
        vec![
            lb("shop/x"),
            lb("default/y"),
            lb("default/web").label("tier", "web"),
            lb("other/web").label("tier", "web"),
        ],
    );
    assert_eq!(addrs(&a, "shop/x"), ["10.0.1.0"], "a restricted pool that selects the Service comes first");
    assert_eq!(addrs(&a, "default/y"), ["10.0.0.0"]);
    assert_eq!(addrs(&a, "default/web"), ["10.0.4.0"]);
    assert_eq!(addrs(&a, "other/web"), ["10.0.0.1"], "namespaces and selectors must both hold");
}

#[test]
fn a_pool_without_auto_assign_serves_only_services_that_name_it_or_its_addresses() {
    let mut manual = spec(&["10.9.0.0/30"]);
    manual.auto_assign = false;
    let pools = set(&[("manual", manual), ("open", spec(&["10.0.0.0/30"]))]);
    let a = run(
        &pools,
        vec![
            lb("plain"),
            lb("named").ann(ANNOTATION_ADDRESS_POOL, "manual"),
            lb("metallb-named").ann(METALLB_ADDRESS_POOL_OLD, "manual"),
            lb("asked").lb_ip("10.9.0.3"),
            lb("unknown").ann(ANNOTATION_ADDRESS_POOL, "nope"),
            lb("mismatch").ann(ANNOTATION_ADDRESS_POOL, "open").lb_ip("10.9.0.2"),
        ],
    );
    assert_eq!(addrs(&a, "plain"), ["10.0.0.0"]);
    assert_eq!(addrs(&a, "metallb-named"), ["10.9.0.0"]);
    assert_eq!(addrs(&a, "named"), ["10.9.0.1"]);
    assert_eq!(addrs(&a, "asked"), ["10.9.0.3"]);
    assert_eq!(failed(&a, "unknown"), AssignError::UnknownPool { pool: "nope".into() });
    assert_eq!(failed(&a, "mismatch"), AssignError::NotInNamedPool { address: ip("10.9.0.2"), pool: "open".into() });
}

#[test]
fn a_pool_that_does_not_allow_the_service_refuses_its_requests() {
    let pools = set(&[("shop", restricted(&["10.0.1.0/30"], None, &["shop"], None))]);
    let a = run(
        &pools,
        vec![
            lb("web").lb_ip("10.0.1.1"),
            lb("named").ann(ANNOTATION_ADDRESS_POOL, "shop"),
            lb("shop/ok").lb_ip("10.0.1.1"),
        ],
    );
    assert_eq!(failed(&a, "web"), AssignError::PoolNotAllowed { pool: "shop".into() });
    assert_eq!(failed(&a, "named"), AssignError::PoolNotAllowed { pool: "shop".into() });
    assert_eq!(addrs(&a, "shop/ok"), ["10.0.1.1"]);
}

#[test]
fn a_deleted_or_retyped_or_reclassed_service_frees_its_address() {
    let pools = set(&[("p", spec(&["192.0.2.1/32"]))]);
    for gone in [None, Some(lb("old").ty("ClusterIP")), Some(lb("old").class("example.com/other"))] {
        let mut svcs: Vec<S> = gone.into_iter().map(|s| s.status(&["192.0.2.1"])).collect();
        svcs.push(lb("new"));
        let a = run(&pools, svcs);
        assert_eq!(addrs(&a, "new"), ["192.0.2.1"]);
        assert!(!a.services.contains_key(&key("old")));
    }
}

#[test]
fn a_status_outside_every_pool_is_replaced_in_kubernetes_mode_and_kept_in_standalone_mode() {
    let pools = set(&[("p", spec(&["192.0.2.0/30"]))]);
    let svcs = vec![lb("a").status(&["203.0.113.9"]).arc(), lb("b").arc()];
    let k8s = assign(&pools, &svcs, &default_filter(), Options { keep_addresses_outside_pools: false });
    assert_eq!(addrs(&k8s, "a"), ["192.0.2.0"]);
    assert_eq!(k8s.changes(&svcs).len(), 2);
    let file = assign(&pools, &svcs, &default_filter(), Options { keep_addresses_outside_pools: true });
    assert_eq!(addrs(&file, "a"), ["203.0.113.9"]);
    assert!(matches!(&file.services[&key("a")], Outcome::Assigned(x) if x.pool.is_none() && x.kept));
    // Standalone: a static address outside the pools is still given once only.
    let svcs = vec![lb("x").lb_ip("203.0.113.9").arc(), lb("y").lb_ip("203.0.113.9").arc()];
    let file = assign(&pools, &svcs, &default_filter(), Options { keep_addresses_outside_pools: true });
    assert_eq!(addrs(&file, "x"), ["203.0.113.9"]);
    assert_eq!(failed(&file, "y"), AssignError::InUse { address: ip("203.0.113.9"), by: key("x") });
}

#[test]
fn a_status_in_a_pool_that_no_longer_allows_the_service_is_replaced() {
    let pools = set(&[("shop", restricted(&["10.0.1.0/30"], None, &["shop"], None)), ("open", spec(&["10.0.0.0/30"]))]);
    let a = run(&pools, vec![lb("web").status(&["10.0.1.2"])]);
    assert_eq!(addrs(&a, "web"), ["10.0.0.0"]);
}

#[test]
fn a_dual_stack_status_in_the_wrong_order_is_rewritten_in_family_order() {
    let pools = set(&[("p", spec(&["192.0.2.0/30", "2001:db8::/126"]))]);
    let svcs = vec![lb("d").families(&["IPv4", "IPv6"]).status(&["2001:db8::2", "192.0.2.2"]).arc()];
    let a = assign(&pools, &svcs, &default_filter(), Options::default());
    assert_eq!(addrs(&a, "d"), ["192.0.2.2", "2001:db8::2"]);
    assert_eq!(a.changes(&svcs).len(), 1);
}

#[test]
fn a_service_that_becomes_dual_stack_keeps_the_address_it_holds() {
    let pools = set(&[("public", spec(&["198.51.100.0/30", "2001:db8::/126"]))]);
    let web = lb("web").families(&["IPv4", "IPv6"]).status(&["198.51.100.2"]);
    let a = run(&pools, vec![web]);
    assert_eq!(addrs(&a, "web"), ["198.51.100.2", "2001:db8::"], "the IPv4 VIP moved");
}

#[test]
fn a_service_that_becomes_single_stack_keeps_the_address_of_its_remaining_family() {
    let pools = set(&[("public", spec(&["198.51.100.0/30", "2001:db8::/126"]))]);
    let v4 = lb("v4").families(&["IPv4"]).status(&["198.51.100.2", "2001:db8::2"]);
    let v6 = lb("v6").families(&["IPv6"]).status(&["198.51.100.3", "2001:db8::3"]);
    let a = run(&pools, vec![v4, v6]);
    assert_eq!(addrs(&a, "v4"), ["198.51.100.2"]);
    assert_eq!(addrs(&a, "v6"), ["2001:db8::3"]);
}

#[test]
fn of_two_addresses_of_one_family_the_first_usable_one_listed_is_kept() {
    let pools = set(&[("public", spec(&["198.51.100.0/30", "2001:db8::/126"]))]);
    let a = run(&pools, vec![lb("web").status(&["198.51.100.3", "198.51.100.2"])]);
    assert_eq!(addrs(&a, "web"), ["198.51.100.3"]);
    // An address an older Service holds is skipped for the next one listed.
    let old = lb("old").status(&["198.51.100.3"]).created(0);
    let web = lb("web").status(&["198.51.100.3", "198.51.100.2"]).created(1);
    let a = run(&pools, vec![old, web]);
    assert_eq!(addrs(&a, "old"), ["198.51.100.3"]);
    assert_eq!(addrs(&a, "web"), ["198.51.100.2"]);
    // The dual-stack one keeps one per family, the first listed of each.
    let ds = lb("ds").families(&["IPv4", "IPv6"]).status(&["2001:db8::2", "198.51.100.1", "198.51.100.2"]);
    let a = run(&pools, vec![ds]);
    assert_eq!(addrs(&a, "ds"), ["198.51.100.1", "2001:db8::2"]);
}

#[test]
fn a_kept_address_is_completed_without_taking_an_address_another_service_asks_for() {
    let pools = set(&[("public", spec(&["198.51.100.0/30", "2001:db8::/126"]))]);
    let web = lb("web").families(&["IPv4", "IPv6"]).status(&["198.51.100.2"]);
    let asks = lb("asks").families(&["IPv6"]).ann(ANNOTATION_LOAD_BALANCER_IPS, "2001:db8::");
    let a = run(&pools, vec![web, asks]);
    assert_eq!(addrs(&a, "web"), ["198.51.100.2", "2001:db8::1"]);
    assert_eq!(addrs(&a, "asks"), ["2001:db8::"]);
}

#[test]
fn input_order_does_not_change_the_assignment() {
    let pools = set(&[("p", spec(&["192.0.2.0/29"])), ("q", spec(&["2001:db8::/125"]))]);
    let svcs = vec![lb("c"), lb("a").families(&["IPv6"]), lb("b").status(&["192.0.2.3"]), lb("x/a").lb_ip("192.0.2.0")];
    let fwd = run(&pools, svcs.clone());
    let mut rev = svcs;
    rev.reverse();
    assert_eq!(fwd, run(&pools, rev));
}

#[test]
fn changes_list_only_services_whose_status_must_be_written() {
    let pools = set(&[("p", spec(&["192.0.2.0/30"]))]);
    let svcs: Vec<Arc<Service>> = vec![
        lb("kept").status(&["192.0.2.0"]).arc(),
        lb("new").arc(),
        lb("fails").lb_ip("203.0.113.1").status(&["192.0.2.3"]).arc(),
        lb("other").class("example.com/x").status(&["192.0.2.1"]).arc(),
    ];
    let a = assign(&pools, &svcs, &default_filter(), Options::default());
    let ch: Vec<(String, Vec<String>)> = a
        .changes(&svcs)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.iter().map(ToString::to_string).collect()))
        .collect();
    assert_eq!(
        ch,
        [("default/fails".to_owned(), vec![]), ("default/new".to_owned(), vec!["192.0.2.1".to_owned()])],
        "a failed Service loses its address; another class is never touched"
    );
}

#[test]
fn a_large_pool_assigns_thousands_of_services_quickly() {
    let pools = set(&[("p", spec(&["10.0.0.0/16"]))]);
    let svcs: Vec<Arc<Service>> = (0..5000).map(|i| lb(&format!("s{i:05}")).arc()).collect();
    let t = std::time::Instant::now();
    let a = assign(&pools, &svcs, &default_filter(), Options::default());
    assert_eq!(addrs(&a, "s04999"), ["10.0.19.135"]);
    assert!(t.elapsed() < std::time::Duration::from_secs(5), "{:?}", t.elapsed());
}

// ----- properties

fn arb_service(i: usize) -> impl Strategy<Value = S> {
    let fam =
        prop_oneof![Just(vec!["IPv4"]), Just(vec!["IPv6"]), Just(vec!["IPv4", "IPv6"]), Just(vec!["IPv6", "IPv4"])];
    let v4 = (0u8..12).prop_map(|n| format!("10.0.0.{n}"));
    let v6 = (0u8..12).prop_map(|n| format!("2001:db8::{n:x}"));
    let status = prop::option::of((v4.clone(), v6.clone(), any::<bool>()));
    let req = prop::option::of((v4, v6, any::<bool>()));
    let ns = prop_oneof![Just("default"), Just("shop")];
    (fam, status, req, ns, 0i64..3, 0u8..6).prop_map(move |(fam, status, req, ns, created, kind)| {
        let mut s = lb(&format!("{ns}/s{i}")).families(&fam).created(created);
        let pick = |(a, b, both): (String, String, bool)| -> Vec<String> {
            if both {
                vec![a, b]
            } else if fam[0] == "IPv4" {
                vec![a]
            } else {
                vec![b]
            }
        };
        if let Some(st) = status {
            let v = pick(st);
            s = s.status(&v.iter().map(String::as_str).collect::<Vec<_>>());
        }
        if let Some(r) = req {
            s = s.ann(ANNOTATION_LOAD_BALANCER_IPS, &pick(r).join(","));
        }
        match kind {
            0 => s.class("example.com/other"),
            1 => s.ty("NodePort"),
            2 => s.ann(ANNOTATION_ADDRESS_POOL, "small"),
            _ => s,
        }
    })
}

fn arb_services() -> impl Strategy<Value = Vec<S>> {
    (0usize..14).prop_flat_map(|n| (0..n).map(arb_service).collect::<Vec<_>>())
}

fn prop_pools() -> PoolSet {
    set(&[
        ("big", spec(&["10.0.0.0-10.0.0.5", "2001:db8::-2001:db8::5"])),
        ("small", spec(&["10.0.0.6-10.0.0.8", "2001:db8::6-2001:db8::8"])),
        ("shop", restricted(&["10.0.0.9-10.0.0.10", "2001:db8::9/128"], Some(1), &["shop"], None)),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// No address goes to two Services; each is in a pool allowing the Service, one per
    /// family of spec.ipFamilies, in that order; a request is met exactly or fails.
    #[test]
    fn assignments_are_unique_well_formed_and_match_requests(svcs in arb_services()) {
        let pools = prop_pools();
        let a = run(&pools, svcs.clone());
        let mut seen = std::collections::BTreeSet::new();
        for s in &svcs {
            let k = ServiceKey::of(&s.0);
            let ours = is_ours(&s.0, &default_filter());
            prop_assert_eq!(ours, a.services.contains_key(&k));
            let Some(Outcome::Assigned(x)) = a.services.get(&k) else { continue };
            let fams: Vec<&str> = x.addresses.iter().map(|a| Family::of(*a).name()).collect();
            prop_assert_eq!(Some(fams.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()), s.0.spec.as_ref().unwrap().ip_families.clone());
            let pool = pools.by_name(x.pool.as_deref().unwrap()).unwrap();
            for addr in &x.addresses {
                prop_assert!(seen.insert(*addr), "{} given twice", addr);
                prop_assert!(pool.contains(*addr));
            }
            prop_assert!(pool.allows(&k.namespace, &s.0.metadata.labels.clone().unwrap_or_default()));
            if let Some(r) = s.0.metadata.annotations.as_ref().and_then(|m| m.get(ANNOTATION_LOAD_BALANCER_IPS)) {
                let want: std::collections::BTreeSet<IpAddr> = r.split(',').map(ip).collect();
                let got: std::collections::BTreeSet<IpAddr> = x.addresses.iter().copied().collect();
                prop_assert_eq!(want, got);
            }
        }
        // A case in which nothing was assigned checked only the first assertion: it does
        // not count towards the cases run (so every counted case checked an assignment).
        prop_assume!(!seen.is_empty(), "no Service got an address");
    }

    /// The same Services in another order give the same assignment; writing it into the
    /// Services' status and assigning again changes nothing (a restart is stable).
    #[test]
    fn assignment_is_deterministic_and_stable_across_restarts(svcs in arb_services(), seed in any::<u64>()) {
        let pools = prop_pools();
        let a = run(&pools, svcs.clone());
        let mut shuffled = svcs.clone();
        let mut x = seed;
        for i in (1..shuffled.len()).rev() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, usize::try_from(x >> 33).unwrap() % (i + 1));
        }
        prop_assert_eq!(&a, &run(&pools, shuffled));
        let restarted = write_back(&svcs, &a);
        let b = run(&pools, restarted.clone());
        for (k, o) in &a.services {
            prop_assert_eq!(o.addresses(), b.services[k].addresses(), "{}", k);
        }
        let arcs: Vec<Arc<Service>> = restarted.into_iter().map(S::arc).collect();
        prop_assert!(b.changes(&arcs).is_empty());
    }
}
