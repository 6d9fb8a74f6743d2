//! What the steering programs' maps hold for a tables snapshot, and the difference between two
//! snapshots when a change touched only some Services (issue 14: the sync costs what the
//! change touched).
//!
//! [`steer_sets`] walks the whole snapshot (the full sync, compared with the maps' shadows or
//! with the kernel's maps). [`steer_delta`] reads only the touched Services' keys in the old
//! and the new snapshot, found through [`dataplane::tables::Service::frontend_keys`] and
//! [`dataplane::tables::Service::endpoint_keys`], and checks every key against the other
//! snapshot's whole-table sets, so a key that another Service still wants (a shared endpoint
//! or address) is never deleted.

use std::net::IpAddr;

use dataplane::tables::{Tables, VipAddrKind, VipKey};
use nic_config::ServiceKey;

/// The steering maps' contents for a tables snapshot.
#[derive(Debug, Default)]
pub struct SteerSets {
    /// `services` map: (address, protocol, port) of every frontend.
    pub services: Vec<ServiceKey>,
    /// `vip_addrs` map: addresses wholly owned by xlb ([`VipAddrKind::Service`] and above).
    pub vip_addrs: Vec<IpAddr>,
    /// `snat_addrs` map: (address, first port, last port).
    pub snat: Vec<(IpAddr, u16, u16)>,
    /// `endpoints` map: backends whose replies keep the client's address.
    pub endpoints: Vec<ServiceKey>,
}

/// A 16-byte (v4-mapped) address back to an [`IpAddr`].
pub fn unmap(a: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(a);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn service_key(k: &VipKey) -> ServiceKey {
    ServiceKey { addr: unmap(k.addr), proto: k.proto, port: k.port }
}

/// Every steering map's wanted contents for `t` (walks the whole snapshot); SNAT addresses get
/// the port range `snat_ports`.
pub fn steer_sets(t: &Tables, snat_ports: (u16, u16)) -> SteerSets {
    let services = t.vips.keys().map(service_key).collect();
    let vip_addrs =
        t.vip_addrs.iter().filter(|(_, kind)| **kind >= VipAddrKind::Service).map(|(a, _)| unmap(*a)).collect();
    let mut snat = Vec::new();
    if let Some(a) = t.snat_v4 {
        snat.push((IpAddr::from(a), snat_ports.0, snat_ports.1));
    }
    if let Some(a) = t.snat_v6 {
        snat.push((IpAddr::from(a), snat_ports.0, snat_ports.1));
    }
    let endpoints = t.endpoints.iter().map(service_key).collect();
    SteerSets { services, vip_addrs, snat, endpoints }
}

/// What to insert into and delete from each steering map to go from one snapshot to the next.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SteerDelta {
    /// `services` keys to insert.
    pub services_insert: Vec<ServiceKey>,
    /// `services` keys to delete.
    pub services_remove: Vec<ServiceKey>,
    /// `vip_addrs` entries to insert.
    pub vip_addrs_insert: Vec<IpAddr>,
    /// `vip_addrs` entries to delete.
    pub vip_addrs_remove: Vec<IpAddr>,
    /// `endpoints` keys to insert.
    pub endpoints_insert: Vec<ServiceKey>,
    /// `endpoints` keys to delete.
    pub endpoints_remove: Vec<ServiceKey>,
}

impl SteerDelta {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The namespace and name in a table service name `namespace/name:port[/…]`.
#[cfg(test)]
fn object_of(name: &str) -> (&str, &str) {
    let (ns, rest) = name.split_once('/').unwrap_or(("", name));
    (ns, rest.split_once(':').map_or(rest, |(n, _)| n))
}

/// The ids, in `t` or `u`, of the table services of the Services `refs` (by namespace and
/// name): what [`steer_delta`] takes when only the Kubernetes change set is known. O(services).
#[cfg(test)]
fn ids_of(t: &Tables, u: &Tables, refs: &std::collections::BTreeSet<crate::cluster::ServiceRef>) -> Vec<u32> {
    let mut ids: Vec<u32> = t
        .services
        .iter()
        .chain(u.services.iter())
        .filter(|s| {
            let (ns, name) = object_of(&s.name);
            refs.contains(&crate::cluster::ServiceRef::new(ns, name))
        })
        .map(|s| s.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The steering maps' difference between `old` and `new` when only the services with the
/// ids in `changed` (sorted; [`dataplane::tables::TableBuilder::changed_ids`]) were added,
/// changed or removed, and every other input of the build (configuration, routes, node
/// addresses) is the same: costs what those services hold, not what the tables hold.
///
/// A key is inserted when a changed service wants it in `new` and `old` did not hold it, and
/// deleted when a changed service held it in `old` and nothing in `new` wants it (a key that
/// another service shares stays). `None` when the change reaches beyond `changed`: a
/// frontend of a changed service that another service owns in the other snapshot, or a
/// changed SNAT address; the caller then compares the whole sets ([`steer_sets`]).
pub fn steer_delta(old: &Tables, new: &Tables, changed: &[u32]) -> Option<SteerDelta> {
    if old.snat_v4 != new.snat_v4 || old.snat_v6 != new.snat_v6 {
        return None;
    }
    let is_changed = |id: u32| changed.binary_search(&id).is_ok();
    let mut d = SteerDelta::default();
    let mut addrs: Vec<[u8; 16]> = Vec::new();
    for &id in changed {
        if let Some(s) = old.services.get(id as usize) {
            for k in &s.frontend_keys {
                match new.vips.get(k) {
                    Some(e) if !is_changed(e.service) => return None,
                    Some(_) => {}
                    None => d.services_remove.push(service_key(k)),
                }
                addrs.push(k.addr);
            }
            for k in &s.endpoint_keys {
                if !new.endpoints.contains(k) {
                    d.endpoints_remove.push(service_key(k));
                }
            }
        }
        if let Some(s) = new.services.get(id as usize) {
            for k in &s.frontend_keys {
                match old.vips.get(k) {
                    Some(e) if !is_changed(e.service) => return None,
                    Some(_) => {}
                    None => d.services_insert.push(service_key(k)),
                }
                addrs.push(k.addr);
            }
            for k in &s.endpoint_keys {
                if !old.endpoints.contains(k) {
                    d.endpoints_insert.push(service_key(k));
                }
            }
        }
    }
    addrs.sort_unstable();
    addrs.dedup();
    let owned = |t: &Tables, a: &[u8; 16]| t.vip_addrs.get(a).is_some_and(|k| *k >= VipAddrKind::Service);
    for a in &addrs {
        match (owned(old, a), owned(new, a)) {
            (false, true) => d.vip_addrs_insert.push(unmap(*a)),
            (true, false) => d.vip_addrs_remove.push(unmap(*a)),
            _ => {}
        }
    }
    for v in [&mut d.services_insert, &mut d.services_remove, &mut d.endpoints_insert, &mut d.endpoints_remove] {
        v.sort_unstable_by_key(|k| (k.addr, k.proto, k.port));
        v.dedup();
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use dataplane::tables::{TableBuilder, Tables};

    use crate::cluster::ServiceRef;

    use super::*;
    use crate::test_support::*;

    const PORTS: (u16, u16) = (40000, 50000);

    /// Tables built from these objects, as the running process builds them.
    fn tables(b: &mut TableBuilder, svcs: Vec<Svc>, slices: Vec<Slice>) -> Tables {
        let (spec, _) = crate::translate::build_spec(&state(svcs, slices, Some(our_node())), &cfg()).unwrap();
        b.build(&spec).unwrap()
    }

    fn touched(names: &[&str]) -> BTreeSet<ServiceRef> {
        names.iter().map(|n| ServiceRef::new("default", *n)).collect()
    }

    /// The steering maps' contents as sets.
    type Sets = (BTreeSet<ServiceKey>, BTreeSet<IpAddr>, BTreeSet<ServiceKey>);

    fn sets(t: &Tables) -> Sets {
        let s = steer_sets(t, PORTS);
        (s.services.into_iter().collect(), s.vip_addrs.into_iter().collect(), s.endpoints.into_iter().collect())
    }

    /// `old`'s contents with `d` applied (inserts first, then deletes, as the maps are written).
    fn apply(old: &Sets, d: &SteerDelta) -> Sets {
        let (mut s, mut a, mut e) = old.clone();
        s.extend(d.services_insert.iter().copied());
        a.extend(d.vip_addrs_insert.iter().copied());
        e.extend(d.endpoints_insert.iter().copied());
        d.services_remove.iter().for_each(|k| assert!(s.remove(k), "deletes only what is there: {k:?}"));
        d.vip_addrs_remove.iter().for_each(|k| assert!(a.remove(k), "deletes only what is there: {k:?}"));
        d.endpoints_remove.iter().for_each(|k| assert!(e.remove(k), "deletes only what is there: {k:?}"));
        (s, a, e)
    }

    fn key(addr: &str, port: u16) -> ServiceKey {
        ServiceKey { addr: addr.parse().unwrap(), proto: 6, port }
    }

    fn a() -> Svc {
        svc("default/a", "10.96.0.1").port("http", 80, 8080).external_ips(&["192.0.2.1"])
    }

    fn b() -> Svc {
        svc("default/b", "10.96.0.2").port("http", 81, 8080).external_ips(&["192.0.2.1"])
    }

    fn slice_of(name: &str, addrs: &[&str]) -> Slice {
        let mut s = slice(&format!("default/{name}-1"), name, "IPv4").port("http", 8080);
        for a in addrs {
            s = s.ep(ep(a));
        }
        s
    }

    #[test]
    fn a_service_that_goes_takes_only_its_own_keys_and_shared_ones_stay() {
        let mut b_ = TableBuilder::new();
        // a and b share the endpoint 10.244.0.1:8080 and the external address 192.0.2.1.
        let old = tables(
            &mut b_,
            vec![a(), b()],
            vec![slice_of("a", &["10.244.0.1", "10.244.0.2"]), slice_of("b", &["10.244.0.1"])],
        );
        let (s, addrs, eps) = sets(&old);
        assert!(eps.contains(&key("10.244.0.1", 8080)) && eps.contains(&key("10.244.0.2", 8080)), "{eps:?}");
        assert!(addrs.contains(&"192.0.2.1".parse().unwrap()) && s.contains(&key("192.0.2.1", 80)), "{s:?}");

        let new = tables(&mut b_, vec![b()], vec![slice_of("b", &["10.244.0.1"])]);
        let d = steer_delta(&old, &new, &ids_of(&old, &new, &touched(&["a"]))).expect("the change stays within a");
        assert!(d.services_insert.is_empty());
        assert_eq!(d.services_remove, vec![key("10.96.0.1", 80), key("192.0.2.1", 80)]);
        assert!(d.vip_addrs_insert.is_empty());
        assert_eq!(d.vip_addrs_remove, vec!["10.96.0.1".parse::<IpAddr>().unwrap()]);
        assert!(d.endpoints_insert.is_empty());
        assert_eq!(d.endpoints_remove, vec![key("10.244.0.2", 8080)], "the shared endpoint stays");
        assert_eq!(apply(&sets(&old), &d), sets(&new));

        // And back: a returns, with an endpoint b also has.
        let d = steer_delta(&new, &old, &ids_of(&new, &old, &touched(&["a"]))).unwrap();
        assert_eq!(d.services_insert, vec![key("10.96.0.1", 80), key("192.0.2.1", 80)]);
        assert_eq!(d.endpoints_insert, vec![key("10.244.0.2", 8080)]);
        assert!(d.services_remove.is_empty() && d.endpoints_remove.is_empty() && d.vip_addrs_remove.is_empty());
        assert_eq!(apply(&sets(&new), &d), sets(&old));
    }

    #[test]
    fn an_endpoint_change_writes_only_that_services_difference() {
        let mut b_ = TableBuilder::new();
        let old = tables(&mut b_, vec![a(), b()], vec![slice_of("a", &["10.244.0.1"]), slice_of("b", &["10.244.0.1"])]);
        let new = tables(
            &mut b_,
            vec![a(), b()],
            vec![slice_of("a", &["10.244.0.1"]), slice_of("b", &["10.244.0.3", "10.244.0.4"])],
        );
        let d = steer_delta(&old, &new, &ids_of(&old, &new, &touched(&["b"]))).unwrap();
        assert_eq!(d.endpoints_insert, vec![key("10.244.0.3", 8080), key("10.244.0.4", 8080)]);
        assert!(d.endpoints_remove.is_empty(), "a still has 10.244.0.1");
        assert!(d.services_insert.is_empty() && d.services_remove.is_empty());
        assert!(d.vip_addrs_insert.is_empty() && d.vip_addrs_remove.is_empty());
        assert_eq!(apply(&sets(&old), &d), sets(&new));
        // Nothing touched, nothing to write.
        assert!(steer_delta(&old, &old, &ids_of(&old, &old, &touched(&[]))).unwrap().is_empty());
        // A touched name that has no table services (never valid) is harmless.
        assert!(steer_delta(&old, &old, &ids_of(&old, &old, &touched(&["nothing"]))).unwrap().is_empty());
    }

    #[test]
    fn a_frontend_another_service_owns_asks_for_the_full_comparison() {
        let mut b_ = TableBuilder::new();
        let claim = |name: &str, ip: &str| {
            svc(&format!("default/{name}"), ip).port("http", 81, 8080).external_ips(&["192.0.2.1"])
        };
        let old = tables(&mut b_, vec![b()], vec![slice_of("b", &["10.244.0.1"])]);
        // c claims b's external frontend 192.0.2.1:81 and loses it (b comes first): c's own
        // keys are the whole difference.
        let new = tables(&mut b_, vec![b(), claim("c", "10.96.0.3")], vec![slice_of("b", &["10.244.0.1"])]);
        let d = steer_delta(&old, &new, &ids_of(&old, &new, &touched(&["c"]))).unwrap();
        assert_eq!(d.services_insert, vec![key("10.96.0.3", 81)]);
        assert_eq!(apply(&sets(&old), &d), sets(&new));
        // a0 claims it and takes it from b: b's keys may change although only a0 was touched,
        // so the full comparison is asked for.
        let new = tables(&mut b_, vec![claim("a0", "10.96.0.4"), b()], vec![slice_of("b", &["10.244.0.1"])]);
        let ext = VipKey {
            addr: "192.0.2.1".parse::<std::net::Ipv4Addr>().unwrap().to_ipv6_mapped().octets(),
            port: 81,
            proto: 6,
        };
        assert_eq!(&*new.services[new.vips.get(&ext).unwrap().service as usize].name, "default/a0:http");
        assert_eq!(steer_delta(&old, &new, &ids_of(&old, &new, &touched(&["a0"]))), None);
        // With both touched, the difference is exact.
        let d = steer_delta(&old, &new, &ids_of(&old, &new, &touched(&["a0", "b"]))).unwrap();
        assert_eq!(apply(&sets(&old), &d), sets(&new));
    }

    #[test]
    fn table_names_map_back_to_their_service() {
        assert_eq!(object_of("ns/web:http"), ("ns", "web"));
        assert_eq!(object_of("ns/web:80/ipv6/external"), ("ns", "web"));
        assert_eq!(object_of("a-b/x:1"), ("a-b", "x"));
    }

    /// The cost of the full sets against the targeted difference at 10,000 Services × 10
    /// endpoints, one Service's endpoints changed. A measurement, not a check: run it with
    /// `cargo test --release -p xlb --lib steer::tests::measure -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement; run in release mode"]
    fn measure_full_sets_against_the_targeted_difference_at_10000_services() {
        let n = 10_000;
        let objects = |changed: usize| {
            let svcs: Vec<Svc> = (0..n)
                .map(|i| {
                    let ip = format!("10.{}.{}.{}", 96 + i / 65536, (i / 256) % 256, i % 256);
                    svc(&format!("default/s{i:05}"), &ip).port("http", 80, 8080)
                })
                .collect();
            let slices: Vec<Slice> = (0..n)
                .map(|i| {
                    let base = if i == changed { 500_000 } else { i * 10 };
                    let addrs: Vec<String> = (base..base + 10)
                        .map(|e| format!("10.{}.{}.{}", 160 + e / 65536, (e / 256) % 256, e % 256))
                        .collect();
                    slice_of(&format!("s{i:05}"), &addrs.iter().map(String::as_str).collect::<Vec<_>>())
                })
                .collect();
            (svcs, slices)
        };
        let mut b_ = TableBuilder::new();
        let (s0, e0) = objects(usize::MAX);
        let old = tables(&mut b_, s0, e0);
        let (s1, e1) = objects(1234);
        let new = tables(&mut b_, s1, e1);
        assert_eq!(new.services.len(), n);
        let t = ids_of(&old, &new, &touched(&["s01234"]));
        assert_eq!(b_.changed_ids(), Some(&t[..]), "the builder names the one changed service");
        let rounds = 50u32;
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            std::hint::black_box(steer_sets(std::hint::black_box(&new), PORTS));
        }
        let full = started.elapsed() / rounds;
        let started = std::time::Instant::now();
        let mut d = None;
        for _ in 0..rounds {
            d = std::hint::black_box(steer_delta(std::hint::black_box(&old), &new, &t));
        }
        let targeted = started.elapsed() / rounds;
        let d = d.unwrap();
        assert_eq!(apply(&sets(&old), &d), sets(&new));
        assert_eq!((d.endpoints_insert.len(), d.endpoints_remove.len()), (10, 10));
        eprintln!(
            "{n} Services x 10 endpoints ({} endpoint keys): steer_sets {full:?}, steer_delta for one touched Service {targeted:?}",
            new.endpoints.len()
        );
    }
}
