//! [`Translator::update`] against [`build_spec`]: after every change the kept translation
//! must equal a full translation of the same objects, and untouched Services keep their specs'
//! `Arc`s.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::super::build_spec;
use super::*;
use crate::cluster::{Changes, ClusterIndex, ServiceRef};
use crate::test_support::*;
use crate::translate::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};

/// xorshift64* (deterministic, no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const NAMESPACES: [&str; 2] = ["a", "b"];
/// `s0:x` with port `http` and `s0` with port `x:http` both make table name `NS/s0:x:http`.
const SERVICES: [&str; 6] = ["s0", "s1", "s2", "s3", "s0:x", "s4"];
const SLICES: [&str; 6] = ["e0", "e1", "e2", "e3", "e4", "e5"];
const CLUSTER_IPS: [&str; 3] = ["10.96.0.1", "10.96.0.2", "10.96.0.3"];
const POD_IPS: [&str; 6] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"];

/// A random Service `ns/name`: cluster IPs from a small pool (collisions are frequent),
/// sometimes NodePort (colliding node ports), external IPs, `Local` policy, dual stack, a
/// port name that collides with another Service's table name, or an invalid field.
fn random_service(rng: &mut Rng, ns: &str, name: &str, rv: &mut u64) -> Service {
    let ip = *rng.pick(&CLUSTER_IPS);
    let port = *rng.pick(&[80, 81]);
    let pname = if rng.chance(15) { "x:http" } else { "http" };
    let mut s = svc(&format!("{ns}/{name}"), ip).port(pname, port, 8080);
    if rng.chance(30) {
        s = s.port("https", 443, 8443);
    }
    if rng.chance(10) {
        s = s.port("http/ipv6", 82, 8080);
    }
    let node_port = rng.chance(30).then(|| *rng.pick(&[30001, 30002]));
    let external = rng.chance(20);
    let local = rng.chance(30);
    let dual = rng.chance(10);
    let broken = rng.chance(5);
    s = s.with(|spec| {
        if let Some(np) = node_port {
            spec.type_ = Some("NodePort".into());
            for p in spec.ports.iter_mut().flatten() {
                p.node_port = Some(np);
            }
            if local {
                spec.external_traffic_policy = Some("Local".into());
            }
        }
        if external {
            spec.external_ips = Some(vec!["1.1.1.1".into()]);
        }
        if dual {
            spec.cluster_ips = Some(vec![ip.into(), "fd00::1".into()]);
        }
        if broken {
            spec.session_affinity = Some("Sometimes".into());
        }
    });
    // Sometimes not xlb's (kube-proxy's label selector).
    if rng.chance(8) {
        let label = *rng.pick(&[LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS]);
        s = s.label(label, "");
    }
    let mut s = s.0;
    // Mostly versioned (as from the API server); a few without (always translated).
    if rng.chance(90) {
        *rv += 1;
        s.metadata.resource_version = Some(rv.to_string());
    }
    s
}

/// A random EndpointSlice `ns/name` for a random Service of the pool (or none).
fn random_slice(rng: &mut Rng, ns: &str, name: &str, rv: &mut u64) -> EndpointSlice {
    let owner = *rng.pick(&SERVICES);
    let fam = if rng.chance(90) { "IPv4" } else { "IPv6" };
    let mut sl = slice(&format!("{ns}/{name}"), owner, fam).port("http", 8080);
    if rng.chance(30) {
        sl = sl.port("https", 8443);
    }
    for _ in 0..rng.below(4) {
        let addr = if fam == "IPv4" { (*rng.pick(&POD_IPS)).to_owned() } else { format!("fd00:2::{}", rng.below(4)) };
        let mut e = ep(&addr).on(if rng.chance(50) { NODE } else { "node-b" });
        if rng.chance(25) {
            e = e.not_ready();
        } else if rng.chance(10) {
            e = e.terminating(true);
        }
        sl = sl.ep(e);
    }
    // Sometimes not xlb's (kube-proxy's label selector).
    if rng.chance(8) {
        let label = *rng.pick(&[LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS]);
        sl = sl.label(label, "other");
    }
    let mut sl = sl.0;
    if rng.chance(10) {
        sl.metadata.labels = None;
    }
    if rng.chance(90) {
        *rv += 1;
        sl.metadata.resource_version = Some(rv.to_string());
    }
    sl
}

/// What happened over a run, so the test can show it did not pass vacuously.
#[derive(Debug, Default)]
struct Seen {
    partial: usize,
    full: usize,
    frontend_collisions: usize,
    name_collisions: usize,
    moves: usize,
    collision_resolved: usize,
    pointer_checks: usize,
    cross_assembled: usize,
}

/// Applies one random change to `ix`; returns the Services it touches (as the Kubernetes
/// source reports them).
fn random_change(rng: &mut Rng, ix: &mut ClusterIndex, rv: &mut u64, seen: &mut Seen) -> BTreeSet<ServiceRef> {
    let mut touched = BTreeSet::new();
    let ns = *rng.pick(&NAMESPACES);
    match rng.below(7) {
        0 | 1 => {
            let name = rng_name(rng);
            let s = random_service(rng, ns, name, rv);
            touched.insert(ix.set_service(Arc::new(s)));
        }
        2 => {
            let r = ServiceRef::new(ns, rng_name(rng));
            ix.remove_service(&r);
            touched.insert(r);
        }
        3 => {
            let name = *rng.pick(&SLICES);
            let s = random_slice(rng, ns, name, rv);
            let t = ix.set_slice(Arc::new(s));
            if t.len() == 2 {
                seen.moves += 1;
            }
            touched.extend(t);
        }
        4 => {
            touched.extend(ix.remove_slice(ns, SLICES[rng.below(SLICES.len())]));
        }
        5 => {
            // An endpoint of an existing slice made not ready, removed or added.
            let r = ServiceRef::new(ns, rng_name(rng));
            let Some(old) = ix.slices_of(&r).next().cloned() else { return touched };
            let mut s = EndpointSlice::clone(&old);
            match rng.below(3) {
                0 => {
                    if let Some(e) = s.endpoints.first_mut() {
                        e.conditions = ep("10.0.0.9").not_ready().0.conditions;
                    }
                }
                1 => {
                    s.endpoints.pop();
                }
                _ => s.endpoints.push(ep(POD_IPS[rng.below(POD_IPS.len())]).on(NODE).0),
            }
            *rv += 1;
            s.metadata.resource_version = Some(rv.to_string());
            touched.extend(ix.set_slice(Arc::new(s)));
        }
        _ => {
            // A port of an existing Service changes.
            let r = ServiceRef::new(ns, rng_name(rng));
            let Some(old) = ix.service(&r).cloned() else { return touched };
            let mut s = Service::clone(&old);
            if let Some(p) = s.spec.as_mut().and_then(|sp| sp.ports.as_mut()).and_then(|p| p.first_mut()) {
                p.port = if p.port == 80 { 81 } else { 80 };
            }
            *rv += 1;
            s.metadata.resource_version = Some(rv.to_string());
            touched.insert(ix.set_service(Arc::new(s)));
        }
    }
    touched
}

fn rng_name(rng: &mut Rng) -> &'static str {
    SERVICES[rng.below(SERVICES.len())]
}

fn count(report: &TranslateReport, what: &str) -> usize {
    report.issues.iter().filter(|i| i.message.contains(what)).count()
}

/// Runs `steps` random steps (1 to 3 changes each, coalesced as the source does) from seed
/// `seed`, checking every step against `build_spec`.
fn differential(seed: u64, steps: usize) -> Seen {
    let mut rng = Rng(seed);
    let c = cfg();
    let mut ix = ClusterIndex::new();
    ix.node = Some(our_node().0);
    let mut rv = 0;
    let mut seen = Seen::default();
    let mut tr = Translator::new();
    let mut local: Vec<IpAddr> = Vec::new();
    tr.update(&ix, &local, &Changes::Full, &c).expect("valid config");
    for step in 0..steps {
        let before: HashMap<String, Arc<ServiceSpec>> =
            tr.spec().services.iter().map(|s| (s.name.clone(), Arc::clone(s))).collect();
        let before_report = tr.report();
        let mut touched = BTreeSet::new();
        for _ in 0..=rng.below(3) {
            touched.extend(random_change(&mut rng, &mut ix, &mut rv, &mut seen));
        }
        let mut changes = Changes::Services(touched.clone());
        if rng.chance(3) {
            changes = Changes::Full;
        } else if rng.chance(2) {
            // The host's addresses change: NodePorts answer on one more address.
            local = if local.is_empty() { vec!["192.168.9.9".parse().expect("address")] } else { Vec::new() };
        }
        let stats = tr.update(&ix, &local, &changes, &c).expect("valid config");
        let (want, want_report) = build_spec(&ix.to_state(&local), &c).expect("valid config");
        assert_eq!(*tr.spec(), want, "step {step} (seed {seed}): spec differs from build_spec after {changes:?}");
        let got_report = tr.report();
        assert_eq!(got_report, want_report, "step {step} (seed {seed}): report differs after {changes:?}");
        if stats.full {
            seen.full += 1;
            continue;
        }
        seen.partial += 1;
        seen.cross_assembled += stats.assembled.saturating_sub(stats.translated);
        seen.frontend_collisions += count(&got_report, "already a frontend");
        seen.name_collisions += count(&got_report, "is already used");
        if count(&got_report, "already a frontend") < count(&before_report, "already a frontend") {
            seen.collision_resolved += 1;
        }
        // Untouched Services keep their specs' pointers.
        for (s, owner) in tr.spec().services.iter().zip(&tr.incr.owners) {
            if touched.contains(&**owner) {
                continue;
            }
            if let Some(old) = before.get(&s.name)
                && **old == **s
            {
                assert!(Arc::ptr_eq(old, s), "step {step} (seed {seed}): untouched {} was copied", s.name);
                seen.pointer_checks += 1;
            }
        }
    }
    seen
}

#[test]
fn random_changes_through_update_equal_build_spec_after_every_step() {
    let mut total = Seen::default();
    for seed in 1..=8 {
        let s = differential(seed * 0x9e37_79b9, 300);
        total.partial += s.partial;
        total.full += s.full;
        total.frontend_collisions += s.frontend_collisions;
        total.name_collisions += s.name_collisions;
        total.moves += s.moves;
        total.collision_resolved += s.collision_resolved;
        total.pointer_checks += s.pointer_checks;
        total.cross_assembled += s.cross_assembled;
    }
    // The run exercised what it claims to test.
    assert!(total.partial > 1500 && total.full > 30, "{total:?}");
    assert!(total.frontend_collisions > 100 && total.name_collisions > 10, "{total:?}");
    assert!(total.moves > 50 && total.collision_resolved > 20, "{total:?}");
    assert!(total.cross_assembled > 20, "collisions made other Services assemble again: {total:?}");
    assert!(total.pointer_checks > 5000, "{total:?}");
}

/// `a/s1` and `a/s2` share cluster IP and port.
fn colliding() -> (ClusterIndex, ServiceRef, ServiceRef) {
    let mut ix = ClusterIndex::new();
    ix.node = Some(our_node().0);
    let r1 = ix.set_service(Arc::new(svc("a/s1", "10.96.0.1").port("http", 80, 8080).0));
    let r2 = ix.set_service(Arc::new(svc("a/s2", "10.96.0.1").port("http", 80, 8080).0));
    ix.set_service(Arc::new(svc("a/s3", "10.96.0.3").port("http", 80, 8080).0));
    (ix, r1, r2)
}

fn names(t: &TablesSpec) -> Vec<&str> {
    t.services.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn removing_the_earlier_of_two_colliding_services_gives_the_frontend_to_the_later() {
    let (mut ix, r1, r2) = colliding();
    let c = cfg();
    let mut tr = Translator::new();
    tr.update(&ix, &[], &Changes::Full, &c).expect("valid");
    assert_eq!(names(tr.spec()), ["a/s1:http", "a/s3:http"], "a/s2 lost its only frontend");
    assert_eq!(count(&tr.report(), "already a frontend of a/s1:http"), 1);
    let s3 = Arc::clone(&tr.spec().services[1]);

    // a/s1 goes: only a/s1 changed, yet a/s2 wins the frontend.
    ix.remove_service(&r1);
    let stats = tr.update(&ix, &[], &Changes::Services([r1.clone()].into()), &c).expect("valid");
    assert_eq!((stats.full, stats.translated, stats.removed, stats.assembled), (false, 0, 1, 1));
    assert_eq!(names(tr.spec()), ["a/s2:http", "a/s3:http"]);
    assert_eq!(tr.report(), build_spec(&ix.to_state(&[]), &c).expect("valid").1);
    assert!(tr.report().issues.is_empty());
    assert!(Arc::ptr_eq(&s3, &tr.spec().services[1]), "a/s3 untouched");

    // It comes back: a/s2 loses again.
    ix.set_service(Arc::new(svc("a/s1", "10.96.0.1").port("http", 80, 8080).0));
    let stats = tr.update(&ix, &[], &Changes::Services([r1].into()), &c).expect("valid");
    assert_eq!((stats.translated, stats.assembled), (1, 2));
    assert_eq!(names(tr.spec()), ["a/s1:http", "a/s3:http"]);
    assert_eq!(*tr.spec(), build_spec(&ix.to_state(&[]), &c).expect("valid").0);
    assert_eq!(count(&tr.report(), "already a frontend of a/s1:http"), 1);
    let _ = r2;
}

#[test]
fn one_slice_change_translates_and_assembles_one_service_and_shares_the_rest() {
    let mut ix = ClusterIndex::new();
    for i in 0..200 {
        let mut s = svc(&format!("n/s{i:03}"), &format!("10.96.1.{}", i + 1)).port("http", 80, 8080).0;
        s.metadata.resource_version = Some("1".into());
        ix.set_service(Arc::new(s));
        let mut sl = slice(&format!("n/s{i:03}-1"), &format!("s{i:03}"), "IPv4")
            .port("http", 8080)
            .ep(ep(&format!("10.1.{i}.1")))
            .0;
        sl.metadata.resource_version = Some("1".into());
        ix.set_slice(Arc::new(sl));
    }
    let c = cfg();
    let mut tr = Translator::new();
    tr.update(&ix, &[], &Changes::Full, &c).expect("valid");
    let before = tr.spec().services.clone();
    let mut sl = slice("n/s042-1", "s042", "IPv4").port("http", 8080).ep(ep("10.1.42.1")).ep(ep("10.1.42.2")).0;
    sl.metadata.resource_version = Some("2".into());
    let touched = ix.set_slice(Arc::new(sl));
    let stats = tr.update(&ix, &[], &Changes::Services(touched.into_iter().collect()), &c).expect("valid");
    assert_eq!((stats.full, stats.translated, stats.assembled), (false, 1, 1));
    assert_eq!(*tr.spec(), build_spec(&ix.to_state(&[]), &c).expect("valid").0);
    let after = &tr.spec().services;
    let copied: Vec<&str> =
        before.iter().zip(after).filter(|(a, b)| !Arc::ptr_eq(a, b)).map(|(_, b)| b.name.as_str()).collect();
    assert_eq!(copied, ["n/s042:http"]);
    // The same change again (no new resourceVersion): nothing is translated.
    let stats = tr.update(&ix, &[], &Changes::Services([ServiceRef::new("n", "s042")].into()), &c).expect("valid");
    assert_eq!((stats.translated, stats.assembled), (0, 0));
}

#[test]
fn host_facts_are_laid_over_the_translated_host_fields() {
    let (ix, _, _) = colliding();
    let mut c = cfg();
    c.interfaces = vec![crate::config::InterfaceConfig { name: "eth0".into(), queues: vec![] }];
    let mut tr = Translator::new();
    tr.update(&ix, &[], &Changes::Full, &c).expect("valid");
    assert_eq!(tr.spec().ports[0].mtu, super::super::PLACEHOLDER_MTU);
    let n = dataplane::tables::NeighbourSpec { addr: "192.168.1.1".parse().expect("ip"), mac: [2; 6], port: 0 };
    tr.set_host(HostFacts {
        ports: vec![([1; 6], 9000)],
        neighbours: vec![n],
        kernel_routes: vec![],
        multipath_l4: true,
    });
    assert_eq!((tr.spec().ports[0].mac, tr.spec().ports[0].mtu), ([1; 6], 9000));
    assert_eq!(tr.spec().neighbours, [n]);
    assert!(tr.spec().multipath_l4);
    // A full update keeps them.
    tr.update(&ix, &[], &Changes::Full, &c).expect("valid");
    assert_eq!((tr.spec().ports[0].mtu, tr.spec().neighbours.len()), (9000, 1));
}

#[test]
fn a_full_resync_of_the_same_basis_redoes_only_what_changed_including_missed_deletions() {
    let (mut ix, r1, _) = colliding();
    let c = cfg();
    let mut tr = Translator::new();
    assert!(tr.update(&ix, &[], &Changes::Full, &c).expect("valid").full);
    // Nothing changed: a periodic resync translates nothing (the test objects carry no
    // resourceVersion, so every Service counts as changed; give them one).
    let versioned = |s: Svc| {
        let mut s = s.0;
        s.metadata.resource_version = Some("1".into());
        Arc::new(s)
    };
    ix.set_service(versioned(svc("a/s1", "10.96.0.1").port("http", 80, 8080)));
    ix.set_service(versioned(svc("a/s2", "10.96.0.1").port("http", 80, 8080)));
    ix.set_service(versioned(svc("a/s3", "10.96.0.3").port("http", 80, 8080)));
    tr.update(&ix, &[], &Changes::Full, &c).expect("valid");
    let stats = tr.update(&ix, &[], &Changes::Full, &c).expect("valid");
    assert_eq!((stats.full, stats.translated, stats.assembled), (false, 0, 0));
    // A relist after a deletion the watch missed: no change names a/s1, the full resync
    // finds it gone and a/s2 takes the frontend.
    ix.remove_service(&r1);
    let stats = tr.update(&ix, &[], &Changes::Full, &c).expect("valid");
    assert_eq!((stats.full, stats.removed), (false, 1));
    assert_eq!(names(tr.spec()), ["a/s2:http", "a/s3:http"]);
    let (spec, report) = build_spec(&ix.to_state(&[]), &c).expect("valid");
    assert_eq!((tr.spec(), tr.report()), (&spec, report));
}
