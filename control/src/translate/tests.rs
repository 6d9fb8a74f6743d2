//! One test per rule of the rule book (`seed-features.md`), named after its ID.

use std::sync::Arc;

use dataplane::tables::{
    EmptyAction, ForwardingMode, FrontendKind, L4Proto, Scheduler, ServiceSpec, TableBuilder, TablesSpec,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use crate::config::{Config, NodePortAddress};
use crate::test_support::*;

/// Builds, and checks that the dataplane accepts the result.
fn run(st: &ClusterState, c: &Config) -> (TablesSpec, TranslateReport) {
    let (spec, report) = build_spec(st, c).expect("config is valid");
    TableBuilder::new().build(&spec).expect("the dataplane accepts every spec we emit");
    (spec, report)
}

fn run1(svcs: Vec<Svc>, slices: Vec<Slice>) -> (TablesSpec, TranslateReport) {
    run(&state(svcs, slices, Some(our_node())), &cfg())
}

fn names(t: &TablesSpec) -> Vec<&str> {
    t.services.iter().map(|s| s.name.as_str()).collect()
}

fn spec<'a>(t: &'a TablesSpec, name: &str) -> &'a ServiceSpec {
    t.services.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no spec {name:?}; have {:?}", names(t)))
}

/// Frontends as `Kind addr PROTO/port` (plus ` masq` when masqueraded).
fn fronts(s: &ServiceSpec) -> Vec<String> {
    s.frontends
        .iter()
        .map(|f| {
            format!(
                "{} {} {}/{}{}",
                f.kind.name(),
                f.addr,
                f.proto.as_str(),
                f.port,
                if f.masquerade { " masq" } else { "" }
            )
        })
        .collect()
}

/// Eligible backends as `addr:port`.
fn eligible(s: &ServiceSpec) -> Vec<String> {
    s.backends.iter().filter(|b| b.eligible).map(|b| format!("{}:{}", b.addr, b.port)).collect()
}

/// All backends as `addr:port`.
fn members(s: &ServiceSpec) -> Vec<String> {
    s.backends.iter().map(|b| format!("{}:{}", b.addr, b.port)).collect()
}

fn web() -> Svc {
    svc("default/web", "10.96.0.10").port("http", 80, 8080)
}

fn web_slice() -> Slice {
    slice("default/web-1", "web", "IPv4").port("http", 8080)
}

fn errors(r: &TranslateReport) -> Vec<String> {
    r.issues.iter().filter(|i| i.severity == Severity::Error).map(ToString::to_string).collect()
}

// ---------------------------------------------------------------------------------- SVC

#[test]
fn svc_01_cluster_ip_is_the_default_type() {
    let (t, r) = run1(vec![web()], vec![web_slice().ep(ep("10.0.0.1")).ep(ep("10.0.0.2"))]);
    assert!(r.issues.is_empty(), "{:?}", r.issues);
    assert_eq!(names(&t), ["default/web:http"]);
    let s = spec(&t, "default/web:http");
    assert_eq!(fronts(s), ["ClusterIP 10.96.0.10 TCP/80"]);
    assert_eq!(eligible(s), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert_eq!(s.when_empty, EmptyAction::Reject);
    assert_eq!(s.scheduler, Scheduler::Random);
    assert_eq!(s.mode, ForwardingMode::Nat);
}

#[test]
fn svc_02_node_port_is_served_on_every_node_address_of_the_family() {
    let n = our_node().addr("ExternalIP", "203.0.113.10");
    let st = state(vec![web().ty("NodePort").node_port(30080)], vec![web_slice().ep(ep("10.0.0.1"))], Some(n));
    let (t, _) = run(&st, &cfg());
    assert_eq!(
        fronts(spec(&t, "default/web:http")),
        ["ClusterIP 10.96.0.10 TCP/80", "NodePort 192.168.1.10 TCP/30080 masq", "NodePort 203.0.113.10 TCP/30080 masq"]
    );
}

#[test]
fn svc_03_node_port_uses_the_service_port_protocol() {
    let s = svc("kube-system/dns", "10.96.0.10")
        .port_full("dns", 53, "UDP", Some(IntOrString::Int(53)))
        .node_port(30053)
        .ty("NodePort");
    let (t, _) = run1(vec![s], vec![]);
    assert_eq!(
        fronts(spec(&t, "kube-system/dns:dns")),
        ["ClusterIP 10.96.0.10 UDP/53", "NodePort 192.168.1.10 UDP/30053 masq"]
    );
}

#[test]
fn svc_04_cluster_policy_node_port_works_without_local_endpoints() {
    let (t, r) = run1(
        vec![web().ty("NodePort").node_port(30080)],
        vec![web_slice().ep(ep("10.0.0.1").on("node-b")).ep(ep("10.0.0.2").on("node-c"))],
    );
    let s = spec(&t, "default/web:http");
    assert!(fronts(s).contains(&"NodePort 192.168.1.10 TCP/30080 masq".to_owned()));
    assert_eq!(eligible(s), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert_eq!(r.no_local_endpoints, NoLocalEndpoints::default());
}

#[test]
fn svc_05_load_balancer_includes_node_port_and_cluster_ip() {
    let s = web().ty("LoadBalancer").node_port(30080).lb_ingress(&["198.51.100.7"]);
    let (t, _) = run1(vec![s], vec![web_slice().ep(ep("10.0.0.1"))]);
    assert_eq!(
        fronts(spec(&t, "default/web:http")),
        [
            "ClusterIP 10.96.0.10 TCP/80",
            "NodePort 192.168.1.10 TCP/30080 masq",
            "LoadBalancer 198.51.100.7 TCP/80 masq"
        ]
    );
}

#[test]
fn svc_06_load_balancer_ingress_ips_are_frontends_and_hostnames_are_ignored() {
    let s = web().ty("LoadBalancer").lb_ingress(&["198.51.100.7", "lb.example.com"]);
    let (t, r) = run1(vec![s], vec![]);
    assert!(r.issues.is_empty(), "{:?}", r.issues);
    assert_eq!(
        fronts(spec(&t, "default/web:http")),
        ["ClusterIP 10.96.0.10 TCP/80", "LoadBalancer 198.51.100.7 TCP/80 masq"]
    );
}

#[test]
fn svc_06_ingress_with_ip_mode_proxy_is_not_programmed() {
    let mut s = web().ty("LoadBalancer").lb_ingress(&["198.51.100.7"]);
    s.0.status.as_mut().unwrap().load_balancer.as_mut().unwrap().ingress.as_mut().unwrap()[0].ip_mode =
        Some("Proxy".into());
    let (t, _) = run1(vec![s], vec![]);
    assert_eq!(fronts(spec(&t, "default/web:http")), ["ClusterIP 10.96.0.10 TCP/80"]);
}

#[test]
fn svc_08_ingress_ips_are_programmed_whatever_the_load_balancer_class() {
    // kube-proxy forwards to every LoadBalancer's ingress IPs (pkg/proxy/serviceport.go does
    // not read the class); the class only picks the controller that provisions and announces
    // the address. So neither xlb's own class nor handleDefaultLoadBalancerClass filters them.
    let lb = || web().ty("LoadBalancer").node_port(30080).lb_ingress(&["198.51.100.7"]);
    let lb_fronts = |svc: Svc, c: &Config| {
        let (t, _) = run(&state(vec![svc], vec![], Some(our_node())), c);
        let f = fronts(spec(&t, "default/web:http"));
        assert!(f.iter().any(|f| f.starts_with("NodePort")), "NodePorts stay whatever the class: {f:?}");
        f.into_iter().filter(|f| f.starts_with("LoadBalancer")).collect::<Vec<_>>()
    };
    let want = ["LoadBalancer 198.51.100.7 TCP/80 masq"];
    let mut c = cfg();
    c.load_balancer_class = Some("xlb.dev/lb".into());
    assert_eq!(lb_fronts(lb().lb_class("xlb.dev/lb"), &c), want, "xlb's class");
    assert_eq!(lb_fronts(lb().lb_class("other.example/lb"), &c), want, "another class");
    assert_eq!(lb_fronts(lb(), &c), want, "no class");
    c.handle_default_load_balancer_class = false;
    assert_eq!(lb_fronts(lb(), &c), want, "no class, handleDefaultLoadBalancerClass false");
    assert_eq!(lb_fronts(lb().lb_class("other.example/lb"), &c), want, "another class, default not handled");
}

#[test]
fn svc_09_allocate_load_balancer_node_ports_false_still_programs_present_node_ports() {
    let with_np = web().ty("LoadBalancer").node_port(30080).allocate_lb_node_ports(false);
    let (t, _) = run1(vec![with_np], vec![]);
    assert!(fronts(spec(&t, "default/web:http")).contains(&"NodePort 192.168.1.10 TCP/30080 masq".to_owned()));
    let without = web().ty("LoadBalancer").allocate_lb_node_ports(false);
    let (t, _) = run1(vec![without], vec![]);
    assert!(!fronts(spec(&t, "default/web:http")).iter().any(|f| f.starts_with("NodePort")));
}

#[test]
fn svc_11_external_ips_work_on_any_service_type() {
    let (t, _) = run1(vec![web().external_ips(&["80.11.12.10"])], vec![web_slice().ep(ep("10.0.0.1"))]);
    let s = spec(&t, "default/web:http");
    assert_eq!(fronts(s), ["ClusterIP 10.96.0.10 TCP/80", "ExternalIP 80.11.12.10 TCP/80 masq"]);
    assert_eq!(eligible(s), ["10.0.0.1:8080"]);
}

#[test]
fn svc_12_external_name_services_are_ignored() {
    let s = svc("default/ext", "").ty("ExternalName").with(|s| {
        s.external_name = Some("db.example.com".into());
        s.cluster_ip = None;
        s.cluster_ips = None;
    });
    let (t, r) = run1(vec![s.port("db", 5432, 5432)], vec![]);
    assert!(t.services.is_empty() && r.issues.is_empty());
}

#[test]
fn svc_13_headless_services_are_ignored() {
    let s = svc("default/db", "None").port("db", 5432, 5432);
    let (t, r) = run1(vec![s], vec![slice("default/db-1", "db", "IPv4").port("db", 5432).ep(ep("10.0.0.1"))]);
    assert!(t.services.is_empty() && r.issues.is_empty());
}

#[test]
fn svc_14_selectorless_service_uses_hand_made_slices() {
    let s = web().with(|s| s.selector = None);
    let hand = web_slice().label("endpointslice.kubernetes.io/managed-by", "staff").ep(ep("192.0.2.42"));
    let (t, _) = run1(vec![s], vec![hand]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["192.0.2.42:8080"]);
}

// --------------------------------------------------------------------------------- PORT

#[test]
fn port_01_protocol_defaults_to_tcp_and_udp_sctp_are_supported() {
    let s = svc("default/multi", "10.96.0.20")
        .port_full("a", 1000, "TCP", None)
        .with(|s| s.ports.as_mut().unwrap()[0].protocol = None)
        .port_full("b", 1001, "UDP", None)
        .port_full("c", 1002, "SCTP", None);
    let (t, _) = run1(vec![s], vec![]);
    assert_eq!(spec(&t, "default/multi:a").frontends[0].proto, L4Proto::Tcp);
    assert_eq!(spec(&t, "default/multi:b").frontends[0].proto, L4Proto::Udp);
    assert_eq!(spec(&t, "default/multi:c").frontends[0].proto, L4Proto::Sctp);
    let bad = svc("default/bad", "10.96.0.21").port_full("a", 1000, "ICMP", None);
    let (t, r) = run1(vec![bad], vec![]);
    assert!(t.services.is_empty());
    assert!(errors(&r)[0].contains("spec.ports[0].protocol"), "{:?}", r.issues);
}

#[test]
fn port_02_multi_port_service_gives_one_table_per_port_and_needs_names() {
    let s = web().port("https", 443, 8443);
    let sl = web_slice().port("https", 8443).ep(ep("10.0.0.1"));
    let (t, _) = run1(vec![s], vec![sl]);
    assert_eq!(names(&t), ["default/web:http", "default/web:https"]);
    assert_eq!(eligible(spec(&t, "default/web:https")), ["10.0.0.1:8443"]);

    let unnamed = svc("default/u", "10.96.0.30").port("", 80, 80).port("", 81, 81);
    let (t, r) = run1(vec![unnamed], vec![]);
    assert!(t.services.is_empty());
    assert!(errors(&r)[0].contains("spec.ports[0].name"), "{:?}", r.issues);
}

#[test]
fn port_03_same_port_number_with_two_protocols_gives_two_frontends() {
    let dns = svc("kube-system/kube-dns", "10.96.0.10")
        .port_full("dns", 53, "UDP", Some(IntOrString::Int(53)))
        .port_full("dns-tcp", 53, "TCP", Some(IntOrString::Int(53)));
    let sl = slice("kube-system/kube-dns-1", "kube-dns", "IPv4")
        .port_full("dns", Some(53), "UDP")
        .port_full("dns-tcp", Some(53), "TCP")
        .ep(ep("10.244.0.5"));
    let (t, _) = run1(vec![dns], vec![sl]);
    assert_eq!(fronts(spec(&t, "kube-system/kube-dns:dns")), ["ClusterIP 10.96.0.10 UDP/53"]);
    assert_eq!(fronts(spec(&t, "kube-system/kube-dns:dns-tcp")), ["ClusterIP 10.96.0.10 TCP/53"]);
    assert_eq!(eligible(spec(&t, "kube-system/kube-dns:dns")), ["10.244.0.5:53"]);
    // A slice port of the wrong protocol does not match (name and protocol both count).
    let udp_only = svc("default/u", "10.96.0.11").port_full("p", 53, "UDP", None);
    let sl = slice("default/u-1", "u", "IPv4").port_full("p", Some(53), "TCP").ep(ep("10.0.0.1"));
    let (t, _) = run1(vec![udp_only], vec![sl]);
    assert!(members(spec(&t, "default/u:p")).is_empty());
}

#[test]
fn port_04_named_target_port_is_resolved_per_slice() {
    let s = svc("default/web", "10.96.0.10").port_full("http", 80, "TCP", Some(IntOrString::String("web".into())));
    let a = slice("default/web-a", "web", "IPv4").port("http", 8080).ep(ep("10.0.0.1"));
    let b = slice("default/web-b", "web", "IPv4").port("http", 9090).ep(ep("10.0.0.2"));
    let (t, _) = run1(vec![s], vec![a, b]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080", "10.0.0.2:9090"]);
}

#[test]
fn port_05_target_port_defaults_to_port_when_the_slice_has_no_number() {
    let s = svc("default/web", "10.96.0.10").port_full("http", 80, "TCP", None);
    let sl = slice("default/web-1", "web", "IPv4").port_full("http", None, "TCP").ep(ep("10.0.0.1"));
    let (t, _) = run1(vec![s], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:80"]);
    // A named targetPort cannot be guessed: the slice is skipped with a warning.
    let named = svc("default/web", "10.96.0.10").port_full("http", 80, "TCP", Some(IntOrString::String("web".into())));
    let sl = slice("default/web-1", "web", "IPv4").port_full("http", None, "TCP").ep(ep("10.0.0.1"));
    let (t, r) = run1(vec![named], vec![sl]);
    assert!(members(spec(&t, "default/web:http")).is_empty());
    assert!(r.issues[0].field.contains("ports[0].port"), "{:?}", r.issues);
}

// ---------------------------------------------------------------------------------- EPS

#[test]
fn eps_01_slices_join_by_service_name_label_in_the_same_namespace() {
    let mut unlabelled = slice("default/web-x", "web", "IPv4").port("http", 8080).ep(ep("10.0.0.9"));
    unlabelled.0.metadata.labels = None;
    let other_ns = slice("shop/web-1", "web", "IPv4").port("http", 8080).ep(ep("10.0.0.8"));
    let other_svc = slice("default/api-1", "api", "IPv4").port("http", 8080).ep(ep("10.0.0.7"));
    let two = slice("default/web-2", "web", "IPv4").port("http", 8080).ep(ep("10.0.0.2"));
    let (t, _) = run1(vec![web()], vec![web_slice().ep(ep("10.0.0.1")), unlabelled, other_ns, other_svc, two]);
    assert_eq!(members(spec(&t, "default/web:http")), ["10.0.0.1:8080", "10.0.0.2:8080"]);
}

#[test]
fn eps_03_fqdn_slices_are_ignored() {
    let fqdn = slice("default/web-f", "web", "FQDN").port("http", 8080).ep(ep("backend.example.com"));
    let (t, r) = run1(vec![web()], vec![fqdn, web_slice().ep(ep("10.0.0.1"))]);
    assert_eq!(members(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
    assert!(r.issues.is_empty(), "{:?}", r.issues);
}

#[test]
fn eps_04_slice_ports_apply_to_every_endpoint_and_empty_name_matches_unnamed_port() {
    let s = svc("default/one", "10.96.0.40").port("", 80, 8080);
    let sl = slice("default/one-1", "one", "IPv4").port("", 8080).ep(ep("10.0.0.1")).ep(ep("10.0.0.2"));
    let (t, _) = run1(vec![s], vec![sl]);
    assert_eq!(names(&t), ["default/one:80"]);
    assert_eq!(eligible(spec(&t, "default/one:80")), ["10.0.0.1:8080", "10.0.0.2:8080"]);
}

#[test]
fn eps_05_publish_not_ready_addresses_makes_every_endpoint_ready() {
    let sl = || web_slice().ep(ep("10.0.0.1").not_ready()).ep(ep("10.0.0.2"));
    let (t, _) = run1(vec![web()], vec![sl()]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.2:8080"]);
    let (t, _) = run1(vec![web().publish_not_ready()], vec![sl()]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080", "10.0.0.2:8080"]);
}

#[test]
fn eps_06_conditions_decide_eligibility_and_all_endpoints_stay_members() {
    let sl = web_slice()
        .ep(ep("10.0.0.1"))
        .ep(ep("10.0.0.2").not_ready())
        .ep(ep("10.0.0.3").terminating(true))
        .ep(ep("10.0.0.4").terminating(false));
    let (t, _) = run1(vec![web()], vec![sl]);
    let s = spec(&t, "default/web:http");
    assert_eq!(eligible(s), ["10.0.0.1:8080"]);
    assert_eq!(members(s).len(), 4, "non-eligible endpoints stay for established flows (CT-03)");
    let b3 = &s.backends[2];
    assert!(!b3.eligible && b3.weight == 0 && b3.conditions.serving && b3.conditions.terminating);
}

#[test]
fn eps_07_nil_conditions_count_as_ready_and_serving() {
    let (t, _) = run1(vec![web()], vec![web_slice().ep(ep("10.0.0.1").no_conditions())]);
    let s = spec(&t, "default/web:http");
    assert_eq!(eligible(s), ["10.0.0.1:8080"]);
    assert!(
        s.backends[0].conditions.ready && s.backends[0].conditions.serving && !s.backends[0].conditions.terminating
    );
}

#[test]
fn eps_09_duplicate_endpoints_across_slices_are_deduplicated_by_address() {
    let a = slice("default/web-a", "web", "IPv4").port("http", 8080).ep(ep("10.0.0.1").not_ready());
    let b = slice("default/web-b", "web", "IPv4").port("http", 8080).ep(ep("10.0.0.1").on(NODE)).ep(ep("10.0.0.2"));
    let (t, _) = run1(vec![web()], vec![b, a]);
    let s = spec(&t, "default/web:http");
    assert_eq!(members(s), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    // The local copy replaced the first (remote) one.
    assert!(s.backends[0].node_local && s.backends[0].eligible);
}

#[test]
fn eps_10_slices_are_used_whatever_their_manager() {
    let sl = web_slice().label("endpointslice.kubernetes.io/managed-by", "my-controller").ep(ep("10.0.0.1"));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
}

#[test]
fn eps_11_only_the_first_address_of_an_endpoint_is_used() {
    let sl = web_slice().ep(ep("10.1.2.3").addresses(&["10.1.2.3", "10.4.5.6"]));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(members(spec(&t, "default/web:http")), ["10.1.2.3:8080"]);
}

#[test]
fn eps_15_orphan_slices_and_services_without_slices_are_tolerated() {
    let orphan = slice("default/gone-1", "gone", "IPv4").port("http", 8080).ep(ep("10.0.0.1"));
    let (t, r) = run1(vec![web()], vec![orphan]);
    assert_eq!(names(&t), ["default/web:http"]);
    assert!(members(spec(&t, "default/web:http")).is_empty());
    assert!(r.issues.is_empty());
}

#[test]
fn eps_bad_endpoint_address_is_a_warning_naming_the_slice_field() {
    let sl = web_slice().ep(ep("10.0.0.300")).ep(ep("fd00::1")).ep(ep("10.0.0.1"));
    let (t, r) = run1(vec![web()], vec![sl]);
    assert_eq!(members(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
    let w: Vec<String> = r.issues.iter().map(ToString::to_string).collect();
    assert!(w[0].contains("EndpointSlice default/web-1, field endpoints[0].addresses[0]"), "{w:?}");
    assert!(w[1].contains("endpoints[1].addresses[0]"), "{w:?}");
}

// ----------------------------------------------------------------------------------- TP

fn spread() -> Slice {
    web_slice()
        .ep(ep("10.0.0.1").on(NODE).zone("z1"))
        .ep(ep("10.0.0.2").on("node-b").zone("z1"))
        .ep(ep("10.0.0.3").on("node-c").zone("z2"))
}

#[test]
fn tp_01_cluster_policy_uses_all_ready_endpoints() {
    let (t, _) = run1(vec![web()], vec![spread()]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"]);
}

#[test]
fn tp_02_internal_local_uses_only_local_ready_endpoints() {
    let (t, r) = run1(vec![web().itp_local()], vec![spread()]);
    let s = spec(&t, "default/web:http");
    assert_eq!(eligible(s), ["10.0.0.1:8080"]);
    assert_eq!(s.when_empty, EmptyAction::Drop);
    assert_eq!(r.no_local_endpoints.internal, 0);
}

#[test]
fn tp_03_external_local_applies_to_node_port_lb_and_external_ips_only() {
    let s = web()
        .ty("LoadBalancer")
        .node_port(30080)
        .lb_ingress(&["198.51.100.7"])
        .external_ips(&["80.11.12.10"])
        .etp_local();
    let (t, _) = run1(vec![s], vec![spread()]);
    assert_eq!(names(&t), ["default/web:http", "default/web:http/external"]);
    let int = spec(&t, "default/web:http");
    assert_eq!(fronts(int), ["ClusterIP 10.96.0.10 TCP/80"]);
    assert_eq!(eligible(int).len(), 3, "internal traffic keeps the Cluster policy");
    let ext = spec(&t, "default/web:http/external");
    assert_eq!(
        fronts(ext),
        ["NodePort 192.168.1.10 TCP/30080", "ExternalIP 80.11.12.10 TCP/80", "LoadBalancer 198.51.100.7 TCP/80"]
    );
    assert_eq!(eligible(ext), ["10.0.0.1:8080"]);
}

#[test]
fn tp_04_external_local_keeps_the_client_ip() {
    let s = web().ty("NodePort").node_port(30080).etp_local();
    let (t, _) = run1(vec![s], vec![spread()]);
    let ext = spec(&t, "default/web:http/external");
    assert_eq!(fronts(ext), ["NodePort 192.168.1.10 TCP/30080"], "the frontends this test is about");
    assert!(ext.frontends.iter().all(|f| !f.masquerade));
}

#[test]
fn tp_05_locality_is_node_name_equality_not_the_hostname_label() {
    let n = our_node().label("kubernetes.io/hostname", "host-a");
    let sl = web_slice().ep(ep("10.0.0.1").on("host-a")).ep(ep("10.0.0.2").on(NODE));
    let (t, _) = run(&state(vec![web().itp_local()], vec![sl], Some(n)), &cfg());
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.2:8080"]);
    // Without a node name nothing is local.
    let sl = web_slice().ep(ep("10.0.0.1").on(NODE));
    let (t, _) = run(&state(vec![web().itp_local()], vec![sl], None), &Config::default());
    assert!(eligible(spec(&t, "default/web:http")).is_empty());
}

#[test]
fn tp_06_local_policy_falls_back_to_serving_terminating_local_endpoints() {
    let sl = web_slice()
        .ep(ep("10.0.0.1").on(NODE).terminating(true))
        .ep(ep("10.0.0.2").on(NODE).terminating(false))
        .ep(ep("10.0.0.3").on("node-b"));
    let (t, r) = run1(vec![web().itp_local()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
    assert_eq!(r.no_local_endpoints.internal, 0);
}

#[test]
fn tp_06_local_policy_prefers_ready_local_endpoints_over_terminating_ones() {
    let sl = web_slice().ep(ep("10.0.0.1").on(NODE).terminating(true)).ep(ep("10.0.0.2").on(NODE));
    let (t, _) = run1(vec![web().itp_local()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.2:8080"]);
}

#[test]
fn tp_08_cluster_policy_falls_back_to_serving_terminating_endpoints() {
    let sl = web_slice()
        .ep(ep("10.0.0.1").terminating(true))
        .ep(ep("10.0.0.2").terminating(false))
        .ep(ep("10.0.0.3").not_ready());
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
    // Once a ready endpoint exists, terminating ones only drain.
    let sl = web_slice().ep(ep("10.0.0.1").terminating(true)).ep(ep("10.0.0.4"));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.4:8080"]);
}

#[test]
fn tp_10_local_policy_overrides_traffic_distribution_and_hints() {
    let sl = web_slice()
        .ep(ep("10.0.0.1").on(NODE).zone("z2").hint_zones(&["z2"]))
        .ep(ep("10.0.0.2").on("node-b").zone("z1").hint_zones(&["z1"]));
    let (t, _) = run1(vec![web().itp_local().traffic_distribution("PreferSameZone")], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
}

// --------------------------------------------------------------------------------- TOPO

fn hinted() -> Slice {
    web_slice()
        .ep(ep("10.0.0.1").on("node-b").zone("z1").hint_zones(&["z1"]))
        .ep(ep("10.0.0.2").on("node-c").zone("z2").hint_zones(&["z2"]))
        .ep(ep("10.0.0.3").on("node-d").zone("z2").hint_zones(&["z2"]))
}

#[test]
fn topo_01_without_hints_traffic_spreads_over_all_endpoints_whatever_the_service_asks() {
    // The endpoints' zone and nodeName fields are not hints: like kube-proxy, xlb does not
    // derive a preference from them, even when the Service asks for one.
    for s in [web(), web().traffic_distribution("PreferSameZone"), web().traffic_distribution("PreferSameNode")] {
        let (t, _) = run1(vec![s], vec![spread()]);
        assert_eq!(eligible(spec(&t, "default/web:http")).len(), 3);
    }
}

#[test]
fn topo_07_zone_hints_are_applied_whatever_the_service_asks() {
    // kube-proxy (pkg/proxy/topology.go) filters by the hints a slice carries; the Service's
    // trafficDistribution or topology-mode annotation only asks the controller to write them.
    for s in [
        web(),
        web().traffic_distribution("PreferSameZone"),
        web().traffic_distribution("PreferClose"),
        web().annotation(ANNOTATION_TOPOLOGY_MODE, "Auto"),
        web().annotation(ANNOTATION_TOPOLOGY_AWARE_HINTS, "auto"),
    ] {
        let (t, _) = run1(vec![s], vec![hinted()]);
        assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
    }
}

#[test]
fn topo_04_node_hints_come_first_then_zone_hints() {
    // Every ready endpoint has node hints and one names this node: same node.
    let sl = web_slice()
        .ep(ep("10.0.0.1").on(NODE).hint_nodes(&["node-x"]).hint_zones(&["z1"]))
        .ep(ep("10.0.0.2").on("node-b").hint_nodes(&[NODE]).hint_zones(&["z2"]));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.2:8080"], "hinted for this node");
    // No endpoint hinted for this node: zone hints.
    let sl = web_slice()
        .ep(ep("10.0.0.1").hint_nodes(&["node-x"]).hint_zones(&["z1"]))
        .ep(ep("10.0.0.2").hint_nodes(&["node-y"]).hint_zones(&["z2"]));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080"], "zone z1");
    // A ready endpoint without node hints: node hints ignored, zone hints still apply.
    let sl =
        web_slice().ep(ep("10.0.0.1").hint_nodes(&[NODE]).hint_zones(&["z2"])).ep(ep("10.0.0.2").hint_zones(&["z1"]));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.2:8080"], "zone z1");
}

#[test]
fn topo_05_hints_narrow_only_the_cluster_policy_per_traffic_class() {
    let s = web().ty("NodePort").node_port(30080).etp_local();
    let sl = web_slice()
        .ep(ep("10.0.0.1").on(NODE).hint_zones(&["z2"]))
        .ep(ep("10.0.0.2").on("node-b").hint_zones(&["z1"]))
        .ep(ep("10.0.0.3").on("node-c").hint_zones(&["z2"]));
    let (t, _) = run1(vec![s], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.2:8080"], "internal: Cluster + zone hints");
    assert_eq!(eligible(spec(&t, "default/web:http/external")), ["10.0.0.1:8080"], "external: Local");
}

#[test]
fn topo_08_any_ready_endpoint_without_a_hint_disables_filtering() {
    let sl = web_slice().ep(ep("10.0.0.1").hint_zones(&["z1"])).ep(ep("10.0.0.2").zone("z1"));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")).len(), 2);
    // A not-ready endpoint without hints does not count.
    let sl = web_slice()
        .ep(ep("10.0.0.1").hint_zones(&["z1"]))
        .ep(ep("10.0.0.2").hint_zones(&["z2"]))
        .ep(ep("10.0.0.3").not_ready());
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
}

#[test]
fn topo_09_no_hint_for_our_zone_uses_all_zones() {
    let sl = web_slice().ep(ep("10.0.0.1").hint_zones(&["z2"])).ep(ep("10.0.0.2").hint_zones(&["z3"]));
    let (t, _) = run1(vec![web()], vec![sl]);
    assert_eq!(eligible(spec(&t, "default/web:http")).len(), 2);
}

#[test]
fn topo_10_unknown_node_zone_disables_zone_filtering() {
    let n = node(NODE).addr("InternalIP", "192.168.1.10");
    let st = state(vec![web()], vec![hinted()], Some(n));
    let (t, _) = run(&st, &cfg());
    assert_eq!(eligible(spec(&t, "default/web:http")).len(), 3);
}

// ---------------------------------------------------------------------------------- AFF

#[test]
fn aff_01_client_ip_affinity_sets_the_timeout_and_none_has_none() {
    let (t, _) = run1(vec![web().affinity(Some(600))], vec![]);
    assert_eq!(spec(&t, "default/web:http").affinity_timeout_s, Some(600));
    let (t, _) = run1(vec![web().with(|s| s.session_affinity = Some("None".into()))], vec![]);
    assert_eq!(spec(&t, "default/web:http").affinity_timeout_s, None);
}

#[test]
fn aff_02_default_timeout_is_10800_seconds() {
    let (t, _) = run1(vec![web().affinity(None)], vec![]);
    assert_eq!(spec(&t, "default/web:http").affinity_timeout_s, Some(10800));
}

#[test]
fn aff_03_timeout_above_86400_seconds_is_an_error_skipping_the_service() {
    let (t, _) = run1(vec![web().affinity(Some(86400))], vec![]);
    assert_eq!(spec(&t, "default/web:http").affinity_timeout_s, Some(86400));
    let (t, r) = run1(vec![web().affinity(Some(86401)), svc("default/ok", "10.96.0.11").port("p", 1, 1)], vec![]);
    assert_eq!(names(&t), ["default/ok:p"]);
    assert!(errors(&r)[0].contains("spec.sessionAffinityConfig.clientIP.timeoutSeconds"), "{:?}", r.issues);
}

// ---------------------------------------------------------------------------------- NAT

#[test]
fn nat_01_cluster_ip_traffic_is_dnat_only() {
    let (t, _) = run1(vec![web().ty("NodePort").node_port(30080)], vec![]);
    let s = spec(&t, "default/web:http");
    let cluster_ip: Vec<_> = s.frontends.iter().filter(|f| f.kind == FrontendKind::ClusterIp).collect();
    assert!(!cluster_ip.is_empty(), "the Service must have a ClusterIP frontend: {:?}", s.frontends);
    assert!(cluster_ip.iter().all(|f| !f.masquerade));
}

#[test]
fn nat_02_external_frontends_masquerade_under_cluster_policy() {
    let s = web().ty("LoadBalancer").node_port(30080).lb_ingress(&["198.51.100.7"]).external_ips(&["80.11.12.10"]);
    let (t, _) = run1(vec![s], vec![]);
    let sp = spec(&t, "default/web:http");
    let external: Vec<_> = sp.frontends.iter().filter(|f| f.kind != FrontendKind::ClusterIp).collect();
    let kinds: Vec<_> = external.iter().map(|f| f.kind).collect();
    assert!(
        [FrontendKind::NodePort, FrontendKind::ExternalIp, FrontendKind::LoadBalancer]
            .iter()
            .all(|k| kinds.contains(k)),
        "the Service must have NodePort, ExternalIP and LoadBalancer frontends: {kinds:?}"
    );
    assert!(external.iter().all(|f| f.masquerade));
    assert_eq!(t.snat_v4, Some("192.168.1.10".parse().unwrap()), "SNAT to the node's primary IP");
}

#[test]
fn nat_04_masquerade_all_masquerades_every_frontend() {
    let mut c = cfg();
    c.iptables.masquerade_all = true;
    let s = web().ty("NodePort").node_port(30080).etp_local();
    let (t, _) = run(&state(vec![s], vec![], Some(our_node())), &c);
    let fronts: Vec<_> = t.services.iter().flat_map(|s| &s.frontends).collect();
    let kinds: Vec<_> = fronts.iter().map(|f| f.kind).collect();
    assert!(
        kinds.contains(&FrontendKind::ClusterIp) && kinds.contains(&FrontendKind::NodePort),
        "the Service must have a ClusterIP and NodePort frontends for this test to mean anything: {kinds:?}"
    );
    assert!(fronts.iter().all(|f| f.masquerade), "{fronts:?}");
}

#[test]
fn nat_06_cluster_cidr_reaches_the_tables_and_masquerade_all_overrides_it() {
    let mut c = cfg();
    c.cluster_cidr = vec!["10.244.0.0/16".parse().unwrap(), "fd44::/48".parse().unwrap()];
    let st = state(vec![web()], vec![], Some(our_node()));
    let (t, r) = run(&st, &c);
    let got: Vec<String> = t.cluster_cidrs.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["10.244.0.0/16", "fd44::/48"]);
    // The ClusterIP frontend itself stays DNAT-only: the dataplane masquerades per source.
    let cluster_ip = spec(&t, "default/web:http");
    assert_eq!(fronts(cluster_ip), ["ClusterIP 10.96.0.10 TCP/80"], "the frontend this test is about");
    assert!(cluster_ip.frontends.iter().all(|f| !f.masquerade));
    assert!(r.issues.is_empty(), "{:?}", r.issues);
    // Without any SNAT address, off-cluster ClusterIP traffic cannot be masqueraded: warned.
    let mut no_snat = c.clone();
    no_snat.node_name = None;
    let (_, r) = run(&state(vec![web()], vec![], None), &no_snat);
    assert!(r.issues.iter().any(|i| i.field == "snatAddresses.ipv4"), "{:?}", r.issues);
    c.iptables.masquerade_all = true;
    let (t, _) = run(&st, &c);
    assert!(t.cluster_cidrs.is_empty(), "masqueradeAll masquerades every flow anyway");
}

// ---------------------------------------------------------------------------------- REJ

#[test]
fn rej_01_internal_local_without_local_endpoints_drops() {
    let sl = web_slice().ep(ep("10.0.0.2").on("node-b"));
    let (t, r) = run1(vec![web().itp_local()], vec![sl]);
    let s = spec(&t, "default/web:http");
    assert!(eligible(s).is_empty());
    assert_eq!(s.when_empty, EmptyAction::Drop);
    assert_eq!(r.no_local_endpoints, NoLocalEndpoints { internal: 1, external: 0 });
}

#[test]
fn rej_02_external_local_without_local_endpoints_drops_and_is_counted() {
    let sl = web_slice().ep(ep("10.0.0.2").on("node-b"));
    let (t, r) = run1(vec![web().ty("NodePort").node_port(30080).etp_local()], vec![sl]);
    let ext = spec(&t, "default/web:http/external");
    assert!(eligible(ext).is_empty());
    assert_eq!(ext.when_empty, EmptyAction::Drop);
    assert_eq!(spec(&t, "default/web:http").when_empty, EmptyAction::Reject);
    assert_eq!(r.no_local_endpoints, NoLocalEndpoints { internal: 0, external: 1 });
}

#[test]
fn rej_03_service_without_usable_endpoints_rejects_even_under_local_policy() {
    let (t, r) = run1(vec![web(), svc("default/loc", "10.96.0.12").port("p", 1, 1).itp_local()], vec![]);
    assert_eq!(spec(&t, "default/web:http").when_empty, EmptyAction::Reject);
    assert_eq!(spec(&t, "default/loc:p").when_empty, EmptyAction::Reject);
    assert_eq!(r.no_local_endpoints, NoLocalEndpoints::default());
}

// ----------------------------------------------------------------------------------- LB

#[test]
fn lb_01_source_ranges_apply_to_load_balancer_frontends_only() {
    let s = web()
        .ty("LoadBalancer")
        .node_port(30080)
        .lb_ingress(&["198.51.100.7"])
        .source_ranges(&["143.231.0.0/16", "10.1.2.3/8"]);
    let (t, r) = run1(vec![s], vec![]);
    assert!(r.issues.is_empty(), "{:?}", r.issues);
    let frontends = &spec(&t, "default/web:http").frontends;
    let kinds: Vec<FrontendKind> = frontends.iter().map(|f| f.kind).collect();
    assert!(
        kinds.contains(&FrontendKind::LoadBalancer) && kinds.contains(&FrontendKind::ClusterIp),
        "a LoadBalancer frontend and another one, or the loop below checks nothing: {kinds:?}"
    );
    for f in frontends {
        let want: Vec<String> = if f.kind == FrontendKind::LoadBalancer {
            vec!["143.231.0.0/16".into(), "10.0.0.0/8".into()]
        } else {
            vec![]
        };
        assert_eq!(f.source_ranges.iter().map(ToString::to_string).collect::<Vec<_>>(), want, "{:?}", f.kind);
    }
}

#[test]
fn lb_01_invalid_source_range_names_the_field_and_fails_closed() {
    let s = web()
        .ty("LoadBalancer")
        .node_port(30080)
        .lb_ingress(&["198.51.100.7"])
        .source_ranges(&["143.231.0.0/16", "everyone"]);
    let (t, r) = run1(vec![s, svc("default/ok", "10.96.0.11").port("p", 1, 1)], vec![]);
    assert_eq!(names(&t), ["default/ok:p", "default/web:http"]);
    let f = fronts(spec(&t, "default/web:http"));
    assert_eq!(f, ["ClusterIP 10.96.0.10 TCP/80", "NodePort 192.168.1.10 TCP/30080 masq"]);
    assert!(errors(&r)[0].contains("spec.loadBalancerSourceRanges[1]"), "{:?}", r.issues);
}

// ----------------------------------------------------------------------------------- DS

fn dual() -> Svc {
    svc("default/web", "10.96.0.10").cluster_ips(&["10.96.0.10", "fd00:96::10"]).port("http", 80, 8080)
}

fn dual_slices() -> Vec<Slice> {
    vec![
        slice("default/web-v4", "web", "IPv4").port("http", 8080).ep(ep("10.0.0.1")),
        slice("default/web-v6", "web", "IPv6").port("http", 8080).ep(ep("fd00:244::1")),
    ]
}

#[test]
fn ds_01_dual_stack_cluster_ips_give_one_frontend_per_family() {
    let (t, _) = run1(vec![dual()], dual_slices());
    assert_eq!(names(&t), ["default/web:http", "default/web:http/ipv6"]);
    assert_eq!(fronts(spec(&t, "default/web:http")), ["ClusterIP 10.96.0.10 TCP/80"]);
    assert_eq!(fronts(spec(&t, "default/web:http/ipv6")), ["ClusterIP fd00:96::10 TCP/80"]);
}

#[test]
fn ds_03_each_family_gets_only_its_own_endpoints() {
    let (t, _) = run1(vec![dual()], dual_slices());
    assert_eq!(members(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
    assert_eq!(members(spec(&t, "default/web:http/ipv6")), ["fd00:244::1:8080"]);
}

#[test]
fn ds_04_single_stack_service_ignores_addresses_of_the_other_family() {
    let s = web().ty("NodePort").node_port(30080).external_ips(&["2001:db8::7"]);
    let (t, r) = run1(vec![s], dual_slices());
    assert_eq!(names(&t), ["default/web:http"]);
    assert_eq!(
        fronts(spec(&t, "default/web:http")),
        ["ClusterIP 10.96.0.10 TCP/80", "NodePort 192.168.1.10 TCP/30080 masq"]
    );
    assert_eq!(r.issues.len(), 1);
    assert_eq!(r.issues[0].field, "spec.externalIPs[0]");
    assert_eq!(r.issues[0].severity, Severity::Warning);
}

/// DS-04: a Service switched from dual-stack to single-stack keeps only `clusterIPs[0]`; the
/// next incremental build drops the other family's table, so its VIP is no longer served, and
/// switching back brings it back. Each step equals a full build.
#[test]
fn ds_04_a_service_switched_to_single_stack_loses_the_vip_of_its_other_family() {
    let c = cfg();
    let mut tr = Translator::new();
    let at = |rv: &str, s: Svc| versioned(state(vec![s], dual_slices(), Some(our_node())), rv);
    let build = |tr: &mut Translator, st: &ClusterState| {
        let got = tr.build(st, &c).expect("valid config").0;
        assert_eq!(got, build_spec(st, &c).expect("valid config").0, "incremental = full");
        got
    };
    let vips = |t: &TablesSpec| -> Vec<String> {
        t.services.iter().flat_map(|s| s.frontends.iter().map(|f| f.addr.to_string())).collect()
    };

    let t = build(&mut tr, &at("1", dual()));
    assert_eq!(names(&t), ["default/web:http", "default/web:http/ipv6"]);
    assert_eq!(vips(&t), ["10.96.0.10", "fd00:96::10"]);

    let single = svc("default/web", "10.96.0.10").cluster_ips(&["10.96.0.10"]).port("http", 80, 8080);
    let t = build(&mut tr, &at("2", single));
    assert_eq!(names(&t), ["default/web:http"], "the IPv6 table is gone");
    assert_eq!(vips(&t), ["10.96.0.10"], "the IPv6 VIP is no longer a frontend");

    let t = build(&mut tr, &at("3", dual()));
    assert_eq!(vips(&t), ["10.96.0.10", "fd00:96::10"], "dual-stack again");
}

#[test]
fn ds_05_dual_stack_load_balancer_programs_both_ingress_ips_and_node_ports() {
    let s = dual().ty("LoadBalancer").node_port(30080).lb_ingress(&["198.51.100.7", "2001:db8::7"]);
    let (t, _) = run1(vec![s], dual_slices());
    assert_eq!(
        fronts(spec(&t, "default/web:http/ipv6")),
        ["ClusterIP fd00:96::10 TCP/80", "NodePort fd00:1::10 TCP/30080 masq", "LoadBalancer 2001:db8::7 TCP/80 masq"]
    );
    assert_eq!(t.snat_v6, Some("fd00:1::10".parse().unwrap()));
}

#[test]
fn ds_primary_family_is_the_first_cluster_ip() {
    let s = svc("default/web", "fd00:96::10").cluster_ips(&["fd00:96::10", "10.96.0.10"]).port("http", 80, 8080);
    let (t, _) = run1(vec![s], dual_slices());
    assert_eq!(names(&t), ["default/web:http", "default/web:http/ipv4"]);
}

// ---------------------------------------------------------------------------------- NPA

fn multi_homed() -> NodeB {
    our_node().addr("InternalIP", "10.20.0.10").addr("ExternalIP", "203.0.113.10").addr("InternalIP", "127.0.0.1")
}

/// The addresses of every NodePort frontend of `t`.
fn node_port_frontend_addrs(t: &TablesSpec) -> Vec<String> {
    t.services
        .iter()
        .flat_map(|s| &s.frontends)
        .filter(|f| f.kind == FrontendKind::NodePort)
        .map(|f| f.addr.to_string())
        .collect()
}

fn node_port_addrs(c: &Config) -> Vec<String> {
    node_port_addrs_with_local(c, &[])
}

#[test]
fn npa_01_cidrs_select_node_addresses() {
    let mut c = cfg();
    c.node_port_addresses = vec![NodePortAddress::Cidr("10.20.0.0/16".parse().unwrap())];
    assert_eq!(node_port_addrs(&c), ["10.20.0.10"]);
}

#[test]
fn npa_02_empty_list_means_every_node_address() {
    assert_eq!(node_port_addrs(&cfg()), ["192.168.1.10", "10.20.0.10", "203.0.113.10", "fd00:1::10"]);
}

#[test]
fn npa_03_primary_and_all_ipv4_special_values() {
    let mut c = cfg();
    c.node_port_addresses = vec![NodePortAddress::Primary];
    assert_eq!(node_port_addrs(&c), ["192.168.1.10", "fd00:1::10"]);
    c.node_port_addresses = vec![NodePortAddress::Cidr("0.0.0.0/0".parse().unwrap())];
    assert_eq!(node_port_addrs(&c), ["192.168.1.10", "10.20.0.10", "203.0.113.10"]);
}

#[test]
fn npa_04_node_ports_match_only_node_addresses() {
    let (t, _) = run1(vec![web().ty("NodePort").node_port(30080)], vec![]);
    let node_addrs = ["192.168.1.10", "fd00:1::10"];
    let node_ports = node_port_frontend_addrs(&t);
    assert!(!node_ports.is_empty(), "no NodePort frontend at all");
    for a in &node_ports {
        assert!(node_addrs.contains(&a.as_str()), "NodePort on {a}, not a node address");
    }
}

/// NodePort addresses with the host's interface addresses `local` known (as `xlb run` reads
/// them over netlink).
fn node_port_addrs_with_local(c: &Config, local: &[&str]) -> Vec<String> {
    let mut st = state(vec![dual().ty("NodePort").node_port(30080)], vec![], Some(multi_homed()));
    st.local_addresses = local.iter().map(|a| a.parse().unwrap()).collect();
    node_port_frontend_addrs(&run(&st, c).0)
}

#[test]
fn npa_02_unset_node_port_addresses_also_answer_on_every_interface_address() {
    // kube-proxy's iptables default matches `--dst-type LOCAL`: any address of the host, not
    // only those the Node object lists. Loopback and IPv6 link-local are left out; an address
    // the Node lists already is not repeated.
    let local = ["192.168.1.10", "172.31.5.5", "fd00:9::5", "fe80::1", "127.0.0.1", "::1"];
    assert_eq!(
        node_port_addrs_with_local(&cfg(), &local),
        ["192.168.1.10", "10.20.0.10", "203.0.113.10", "172.31.5.5", "fd00:1::10", "fd00:9::5"]
    );
}

#[test]
fn npa_01_cidrs_and_primary_filter_interface_addresses_too() {
    let local = ["172.31.5.5", "10.20.9.9"];
    let mut c = cfg();
    c.node_port_addresses = vec![NodePortAddress::Cidr("10.20.0.0/16".parse().unwrap())];
    assert_eq!(node_port_addrs_with_local(&c, &local), ["10.20.0.10", "10.20.9.9"]);
    // An interface address is never the node's primary address (NPA-07).
    c.node_port_addresses = vec![NodePortAddress::Primary];
    assert_eq!(node_port_addrs_with_local(&c, &local), ["192.168.1.10", "fd00:1::10"]);
}

#[test]
fn npa_05_loopback_addresses_never_serve_node_ports() {
    let mut c = cfg();
    c.node_port_addresses = vec![NodePortAddress::Cidr("127.0.0.0/8".parse().unwrap())];
    assert!(node_port_addrs(&c).is_empty());
}

#[test]
fn npa_07_node_addresses_come_from_config_then_node_status() {
    let mut c = cfg();
    c.node_addresses = vec!["172.16.0.5".parse().unwrap()];
    c.node_port_addresses = vec![NodePortAddress::Primary];
    assert_eq!(
        node_port_addrs(&c),
        ["172.16.0.5", "fd00:1::10"],
        "config addresses come first and count as InternalIP"
    );
    // No InternalIP of a family: the first ExternalIP is primary.
    let n = node(NODE).addr("ExternalIP", "203.0.113.10");
    let (t, _) = run(&state(vec![], vec![], Some(n)), &cfg());
    assert_eq!(t.snat_v4, Some("203.0.113.10".parse().unwrap()));
}

#[test]
fn an_ipv4_mapped_node_address_of_the_config_is_its_ipv4_address() {
    let mut c = cfg();
    c.node_addresses = vec!["::ffff:172.16.0.5".parse().unwrap()];
    c.node_port_addresses = vec![NodePortAddress::Primary];
    assert_eq!(node_port_addrs(&c), ["172.16.0.5", "fd00:1::10"], "the IPv4 family's primary address");
}

// ----------------------------------------------------------------------- robustness, misc

#[test]
fn bad_cluster_ip_skips_only_that_service_and_names_the_field() {
    let bad = svc("default/bad", "10.96.0.300").port("p", 80, 80);
    let (t, r) = run1(vec![bad, web()], vec![web_slice().ep(ep("10.0.0.1"))]);
    assert_eq!(names(&t), ["default/web:http"]);
    let e = errors(&r);
    assert_eq!(e.len(), 1);
    assert!(e[0].contains("Service default/bad, field spec.clusterIPs[0]"), "{e:?}");
}

#[test]
fn bad_policy_and_ports_are_errors_naming_the_field() {
    let cases: Vec<(Svc, &str)> = vec![
        (web().with(|s| s.external_traffic_policy = Some("Nearby".into())), "spec.externalTrafficPolicy"),
        (web().with(|s| s.internal_traffic_policy = Some("Nearby".into())), "spec.internalTrafficPolicy"),
        (web().with(|s| s.type_ = Some("Magic".into())), "spec.type"),
        (web().with(|s| s.ports.as_mut().unwrap()[0].port = 70000), "spec.ports[0].port"),
        (web().node_port(-1), "spec.ports[0].nodePort"),
        (web().port("http", 81, 81), "spec.ports[1].name"),
        (web().with(|s| s.session_affinity = Some("Cookie".into())), "spec.sessionAffinity"),
        (
            web().with(|s| {
                s.cluster_ip = None;
                s.cluster_ips = None;
            }),
            "spec.clusterIP",
        ),
        (web().annotation(ANNOTATION_SCHEDULER, "fastest"), "metadata.annotations[xlb.dev/scheduler]"),
        (web().annotation(ANNOTATION_FORWARDING_MODE, "teleport"), "metadata.annotations[xlb.dev/forwarding-mode]"),
    ];
    for (s, field) in cases {
        let (t, r) = run1(vec![s], vec![]);
        assert!(t.services.is_empty(), "{field}");
        let e = errors(&r);
        assert!(e.len() == 1 && e[0].contains(&format!("field {field}:")), "{field}: {e:?}");
    }
}

#[test]
fn frontend_claimed_twice_is_reported_and_the_rest_stays() {
    let a = svc("default/a", "10.96.0.1").port("p", 80, 80).external_ips(&["80.11.12.10"]);
    let b = svc("default/b", "10.96.0.2").port("p", 80, 80).external_ips(&["80.11.12.10"]);
    let (t, r) = run1(vec![b, a], vec![]);
    assert_eq!(fronts(spec(&t, "default/a:p")), ["ClusterIP 10.96.0.1 TCP/80", "ExternalIP 80.11.12.10 TCP/80 masq"]);
    assert_eq!(fronts(spec(&t, "default/b:p")), ["ClusterIP 10.96.0.2 TCP/80"]);
    let e = errors(&r);
    assert!(e[0].contains("Service default/b, field spec.externalIPs[0]") && e[0].contains("default/a:p"), "{e:?}");
}

#[test]
fn sched_02_scheduler_from_config_and_per_service_annotations() {
    let mut c = cfg();
    c.ipvs.scheduler = Scheduler::RoundRobin;
    let s1 = web();
    let s2 = svc("default/mh", "10.96.0.3")
        .port("p", 80, 80)
        .annotation(ANNOTATION_SCHEDULER, "mh")
        .annotation(ANNOTATION_FORWARDING_MODE, "dsr-ipip");
    let (t, _) = run(&state(vec![s1, s2], vec![], Some(our_node())), &c);
    assert_eq!(spec(&t, "default/web:http").scheduler, Scheduler::RoundRobin);
    assert_eq!(spec(&t, "default/mh:p").scheduler, Scheduler::Maglev { port: true });
    assert_eq!(spec(&t, "default/mh:p").mode, ForwardingMode::DsrIpip);
}

#[test]
fn services_handed_to_another_proxy_are_ignored() {
    let s = web().label(LABEL_SERVICE_PROXY_NAME, "other-proxy");
    let (t, r) = run1(vec![s], vec![]);
    assert!(t.services.is_empty() && r.issues.is_empty());
}

#[test]
fn output_is_sorted_and_deterministic() {
    let svcs = || {
        vec![
            svc("zeta/a", "10.96.0.5").port("p", 1, 1),
            svc("alpha/b", "10.96.0.4").port("p", 1, 1),
            svc("alpha/a", "10.96.0.3").port("q", 2, 2).port("p", 1, 1),
        ]
    };
    let sl = slice("alpha/a-1", "a", "IPv4").port("p", 1).ep(ep("10.0.0.9")).ep(ep("10.0.0.2")).ep(ep("10.0.0.10"));
    let (t1, _) = run1(svcs(), vec![sl.clone()]);
    let mut rev = svcs();
    rev.reverse();
    let (t2, _) = run1(rev, vec![sl]);
    assert_eq!(t1, t2);
    assert_eq!(names(&t1), ["alpha/a:q", "alpha/a:p", "alpha/b:p", "zeta/a:p"]);
    assert_eq!(members(spec(&t1, "alpha/a:p")), ["10.0.0.2:1", "10.0.0.9:1", "10.0.0.10:1"]);
}

#[test]
fn static_config_reaches_the_table_spec() {
    use crate::config::{InterfaceConfig, NeighbourConfig, NeighbourPort, RouteConfig};
    let mut c = cfg();
    c.interfaces = vec![InterfaceConfig { name: "eth0".into(), queues: vec![0] }];
    c.neighbours = vec![NeighbourConfig {
        address: "192.168.1.1".parse().unwrap(),
        mac: [2, 0, 0, 0, 0, 1],
        port: NeighbourPort::Name("eth0".into()),
    }];
    c.routes = vec![RouteConfig { dst: "10.0.0.0/8".parse().unwrap(), via: "192.168.1.1".parse().unwrap() }];
    c.snat_addresses.ipv4 = Some("192.168.1.99".parse().unwrap());
    c.dsr_source_prefixes = vec!["172.16.0.0/16".parse().unwrap()];
    let (t, _) = run(&state(vec![], vec![], Some(our_node())), &c);
    assert_eq!(t.ports[0].name, "eth0");
    assert_eq!(t.neighbours[0].port, 0);
    assert_eq!(t.routes.len(), 1);
    assert_eq!(t.snat_v4, Some("192.168.1.99".parse().unwrap()));
    assert_eq!(t.dsr_source_v4.map(|c| c.to_string()).as_deref(), Some("172.16.0.0/16"));
    assert_eq!(t.maglev_max_size, 65537);
    assert_eq!(t.maglev_min_size, 1021);
}

#[test]
fn invalid_config_is_a_translate_error() {
    let mut c = cfg();
    c.maglev_table_size = 7;
    let e = build_spec(&ClusterState::default(), &c).unwrap_err();
    assert!(e.to_string().contains("maglevTableSize"), "{e}");
}

#[test]
fn maglev_service_larger_than_the_table_is_skipped_not_the_whole_table() {
    let mut c = cfg();
    c.maglev_table_size = 251;
    let mut sl = slice("default/big-1", "big", "IPv4").port("p", 80);
    for i in 0..300 {
        sl = sl.ep(ep(&format!("10.1.{}.{}", i / 250, i % 250 + 1)));
    }
    let big = svc("default/big", "10.96.0.50").port("p", 80, 80).annotation(ANNOTATION_SCHEDULER, "mh");
    let (t, r) = run(&state(vec![big, web()], vec![sl], Some(our_node())), &c);
    assert_eq!(names(&t), ["default/web:http"]);
    assert!(errors(&r)[0].contains("maglevTableSize"), "{:?}", r.issues);
}

// ---------------------------------------------------------------------------------- SYNC-03

/// Gives every object a resourceVersion, as the API server does.
fn versioned(mut st: ClusterState, rv: &str) -> ClusterState {
    for s in &mut st.services {
        Arc::make_mut(s).metadata.resource_version.get_or_insert_with(|| rv.to_owned());
    }
    for s in &mut st.endpoint_slices {
        Arc::make_mut(s).metadata.resource_version.get_or_insert_with(|| rv.to_owned());
    }
    st
}

#[test]
fn sync_03_a_change_translates_only_the_services_it_touches_and_equals_a_full_build() {
    let api = svc("default/api", "10.96.0.11").port("http", 80, 8080);
    let api_slice = || slice("default/api-1", "api", "IPv4").port("http", 8080).ep(ep("10.0.1.1"));
    let db = svc("default/db", "10.96.0.12")
        .port("pg", 5432, 5432)
        .etp_local()
        .ty("LoadBalancer")
        .lb_ingress(&["192.0.2.7"]);
    let db_slice = slice("default/db-1", "db", "IPv4").port("pg", 5432).ep(ep("10.0.2.1").on("elsewhere"));
    let base = versioned(
        state(vec![web(), api, db], vec![web_slice().ep(ep("10.0.0.1")), api_slice(), db_slice], Some(our_node())),
        "1",
    );
    let c = cfg();
    let mut tr = Translator::new();
    let check = |tr: &mut Translator, st: &ClusterState| {
        let got = tr.build(st, &c).expect("valid config");
        assert_eq!(got, build_spec(st, &c).expect("valid config"), "incremental = full");
        tr.stats()
    };
    assert_eq!(check(&mut tr, &base), TranslateStats { translated: 3, reused: 0 });
    assert_eq!(check(&mut tr, &base), TranslateStats { translated: 0, reused: 3 });

    // One EndpointSlice changes (new resourceVersion): only its Service is translated again.
    let mut st = base.clone();
    let mut changed = api_slice().ep(ep("10.0.1.2")).0;
    changed.metadata.resource_version = Some("2".into());
    st.endpoint_slices[1] = Arc::new(changed);
    let before = tr.build(&base, &c).unwrap().0;
    assert_eq!(check(&mut tr, &st), TranslateStats { translated: 1, reused: 2 });
    let after = tr.build(&st, &c).unwrap().0;
    assert_eq!(eligible(spec(&after, "default/api:http")), ["10.0.1.1:8080", "10.0.1.2:8080"]);
    // The untouched Services' specs are handed over as they were (shared, not copied).
    let shared = |t: &TablesSpec, name: &str| t.services.iter().find(|s| s.name == name).cloned().unwrap();
    assert!(Arc::ptr_eq(&shared(&before, "default/db:pg"), &shared(&after, "default/db:pg")));
    assert!(!Arc::ptr_eq(&shared(&before, "default/api:http"), &shared(&after, "default/api:http")));

    // The slice moves to another Service (label change): both Services change.
    let mut moved = st.clone();
    let mut relabelled = slice("default/api-1", "web", "IPv4").port("http", 8080).ep(ep("10.0.1.9")).0;
    relabelled.metadata.resource_version = Some("3".into());
    moved.endpoint_slices[1] = Arc::new(relabelled);
    assert_eq!(check(&mut tr, &moved), TranslateStats { translated: 2, reused: 1 });

    // A deleted Service leaves the cache; a deleted slice changes its Service.
    let mut gone = moved.clone();
    gone.services.remove(2);
    gone.endpoint_slices.remove(1);
    assert_eq!(check(&mut tr, &gone), TranslateStats { translated: 1, reused: 1 });
    assert_eq!(tr.cache.len(), 2);

    // A change of this node (its zone) or of the config translates everything again, and the
    // no-local-endpoints counts and issues come back from the cache intact.
    let mut renode = base.clone();
    renode.node = Some(our_node().zone("z2").0);
    assert_eq!(check(&mut tr, &renode), TranslateStats { translated: 3, reused: 0 });
    assert_eq!(check(&mut tr, &renode), TranslateStats { translated: 0, reused: 3 });
    assert_eq!(tr.build(&renode, &c).unwrap().1.no_local_endpoints.external, 1);
    let mut c2 = cfg();
    c2.iptables.masquerade_all = true;
    tr.build(&renode, &c2).unwrap();
    assert_eq!(tr.stats(), TranslateStats { translated: 3, reused: 0 });

    // Objects without a resourceVersion (a config file) are translated every time.
    let file = state(vec![web()], vec![web_slice().ep(ep("10.0.0.1"))], Some(our_node()));
    assert_eq!(check(&mut tr, &file), TranslateStats { translated: 1, reused: 0 });
    assert_eq!(check(&mut tr, &file), TranslateStats { translated: 1, reused: 0 });
}

#[test]
fn par_map_runs_on_several_threads_and_keeps_index_order() {
    let ids = std::sync::Mutex::new(std::collections::HashSet::new());
    let n = 8 * TRANSLATE_PER_THREAD;
    let start = std::time::Instant::now();
    let got = par_map(n, 4, |i| {
        ids.lock().unwrap().insert(std::thread::current().id());
        // Whoever takes item 0 waits (5 s at most) until another thread has taken an item, so
        // the calling thread cannot finish everything before the helpers start.
        while i == 0 && ids.lock().unwrap().len() < 2 && start.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::yield_now();
        }
        i * 3
    });
    assert_eq!(got, (0..n).map(|i| i * 3).collect::<Vec<_>>());
    assert!(ids.lock().unwrap().len() > 1, "helpers took part");
    // Below TRANSLATE_PER_THREAD items per thread, no helper is started.
    let ids = std::sync::Mutex::new(std::collections::HashSet::new());
    par_map(TRANSLATE_PER_THREAD - 1, 4, |_| ids.lock().unwrap().insert(std::thread::current().id()));
    assert_eq!(ids.into_inner().unwrap().len(), 1);
}

#[test]
fn a_translation_on_several_threads_equals_the_one_thread_translation() {
    // 3,000 Services (one in three Maglev, every tenth without a resourceVersion, and every
    // hundredth claiming its neighbour's ClusterIP, so cross-Service errors depend on order).
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..3000u32 {
        let vip = if i % 100 == 99 { i - 1 } else { i };
        let name = format!("default/s{i:04}");
        let mut s = svc(&name, &format!("10.96.{}.{}", vip / 250, vip % 250 + 1)).port("http", 80, 8080);
        if i % 3 == 0 {
            s = s.annotation(ANNOTATION_SCHEDULER, "mh");
        }
        let mut sl = slice(&format!("default/s{i:04}-1"), &format!("s{i:04}"), "IPv4").port("http", 8080);
        for j in 0..4 {
            sl = sl.ep(ep(&format!("10.{}.{}.{}", 1 + i / 250, i % 250, j + 1)));
        }
        let (mut s, mut sl) = (s.0, sl.0);
        if i % 10 != 0 {
            s.metadata.resource_version = Some("1".into());
            sl.metadata.resource_version = Some("1".into());
        }
        services.push(Arc::new(s));
        slices.push(Arc::new(sl));
    }
    let st = ClusterState { services, endpoint_slices: slices, node: Some(our_node().0), ..Default::default() };
    let c = cfg();
    let (mut one, mut four) = (Translator::new(), Translator::new());
    one.set_threads(1);
    four.set_threads(4);
    let (a, b) = (one.build(&st, &c).unwrap(), four.build(&st, &c).unwrap());
    assert_eq!(a, b);
    assert_eq!(four.stats(), TranslateStats { translated: 3000, reused: 0 });
    assert!(a.1.issues.iter().any(|i| i.message.contains("already a frontend")), "collisions reported");
    // The cache filled by the threads serves the next build: only unversioned ones again.
    assert_eq!(four.build(&st, &c).unwrap(), a);
    assert_eq!(four.stats(), TranslateStats { translated: 300, reused: 2700 });
}

// -------------------------------------------- kube-proxy parity, the translator's cache

#[test]
fn ipv4_mapped_external_ip_colliding_with_another_cluster_ip_does_not_fail_the_whole_table() {
    // The dataplane keys frontends by `addr::mapped`, so `::ffff:10.96.0.10` and 10.96.0.10
    // are one frontend. An IPv6 Service whose externalIP is spelled that way must not hand the
    // builder `web`'s ClusterIP frontend a second time (the whole table build fails:
    // DuplicateFrontend). kube-proxy (ParseIPSloppy) reads the address as IPv4: of the other
    // family, ignored with a warning.
    let evil = svc("other/evil", "fd00:96::99").port("p", 80, 80).external_ips(&["::ffff:10.96.0.10"]);
    let (t, r) = run1(vec![web(), evil], vec![web_slice().ep(ep("10.0.0.1"))]);
    assert_eq!(fronts(spec(&t, "default/web:http")), ["ClusterIP 10.96.0.10 TCP/80"]);
    assert_eq!(fronts(spec(&t, "other/evil:p")), ["ClusterIP fd00:96::99 TCP/80"]);
    assert!(
        r.issues.iter().any(|i| i.field == "spec.externalIPs[0]" && i.message.starts_with("10.96.0.10 is IPv4")),
        "{:?}",
        r.issues
    );
}

#[test]
fn services_labelled_headless_are_ignored_like_kube_proxy() {
    // kube-proxy's informers select `!service.kubernetes.io/service-proxy-name,
    // !service.kubernetes.io/headless`: a Service with the headless label is never seen.
    let s = web().label("service.kubernetes.io/headless", "");
    let (t, _) = run1(vec![s], vec![web_slice().ep(ep("10.0.0.1"))]);
    assert!(t.services.is_empty(), "{:?}", names(&t));
}

#[test]
fn endpoint_slices_labelled_for_another_proxy_or_headless_are_ignored_like_kube_proxy() {
    // The same label selector applies to kube-proxy's EndpointSlice informer.
    let other = slice("default/web-x", "web", "IPv4")
        .port("http", 8080)
        .label(LABEL_SERVICE_PROXY_NAME, "other-proxy")
        .ep(ep("10.0.0.9"));
    let headless = slice("default/web-h", "web", "IPv4")
        .port("http", 8080)
        .label("service.kubernetes.io/headless", "")
        .ep(ep("10.0.0.8"));
    let (t, _) = run1(vec![web()], vec![web_slice().ep(ep("10.0.0.1")), other, headless]);
    assert_eq!(members(spec(&t, "default/web:http")), ["10.0.0.1:8080"]);
}

#[test]
fn translator_build_programs_an_edited_file_object_that_kept_its_resource_version() {
    // `xlb run --config FILE` takes objects "exactly as `kubectl get -o yaml` prints them",
    // resourceVersion included; a hand edit of the file keeps it. A reload (the same kept
    // Translator) must program the edit, as build_spec does.
    let node = || Some(our_node());
    let before = versioned(state(vec![web()], vec![web_slice().ep(ep("10.0.0.1"))], node()), "7");
    let edited_svc = svc("default/web", "10.96.0.10").port("http", 8080, 8080);
    let edited = versioned(state(vec![edited_svc], vec![web_slice().ep(ep("10.0.0.1"))], node()), "7");
    let mut tr = Translator::new();
    tr.build(&before, &cfg()).unwrap();
    let (got, _) = tr.build(&edited, &cfg()).unwrap();
    let (want, _) = build_spec(&edited, &cfg()).unwrap();
    assert_eq!(fronts(spec(&want, "default/web:http")), ["ClusterIP 10.96.0.10 TCP/8080"]);
    assert_eq!(fronts(spec(&got, "default/web:http")), fronts(spec(&want, "default/web:http")));
}

#[test]
fn translator_build_follows_a_change_of_the_host_addresses() {
    // `xlb run` (file mode) rebuilds with Input::File when the host's addresses change
    // (NPA-02: NodePorts answer on them); the kept Translator must not reuse NodePort
    // frontends computed for the old addresses.
    let mut st = versioned(state(vec![web().ty("NodePort").node_port(30080)], vec![], Some(our_node())), "7");
    let mut tr = Translator::new();
    tr.build(&st, &cfg()).unwrap();
    st.local_addresses = vec!["172.31.5.5".parse().unwrap()];
    let (got, _) = tr.build(&st, &cfg()).unwrap();
    let (want, _) = build_spec(&st, &cfg()).unwrap();
    assert!(fronts(spec(&want, "default/web:http")).contains(&"NodePort 172.31.5.5 TCP/30080 masq".to_owned()));
    assert_eq!(fronts(spec(&got, "default/web:http")), fronts(spec(&want, "default/web:http")));
}
