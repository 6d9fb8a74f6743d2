//! The publish path against fake steering maps and a fake kernel: which keys are written,
//! which next hops are asked for, what a failed build or sync leaves.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::addr::Cidr;
use dataplane::tables::{BuildKind, KernelRouteSpec, NeighbourSpec, Tables, TablesHandle};
use nic_config::{NicError, ServiceKey};

use super::*;
use crate::cluster::{Changes, ClusterIndex, ServiceRef};
use crate::config::{Config, InterfaceConfig};
use crate::steer::steer_sets;
use crate::test_support::*;
use crate::translate::HostFacts;

/// What a [`FakeMaps`] was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    /// The whole sets (one `sync_*` call of each map).
    Sync,
    /// Keys of the `services` map inserted and removed by an update.
    Update { insert: Vec<ServiceKey>, remove: Vec<ServiceKey> },
    /// `verify_next_sync`.
    Verify,
}

/// One steering program's maps in memory, with the "known" state of the real ones: updates
/// write nothing (and say so) until a sync has written the whole sets.
#[derive(Debug, Default)]
struct FakeMaps {
    known: bool,
    services: BTreeSet<ServiceKey>,
    vip_addrs: BTreeSet<IpAddr>,
    endpoints: BTreeSet<ServiceKey>,
    snat: Vec<(IpAddr, u16, u16)>,
    ops: Vec<Op>,
    /// The next `sync_services` fails.
    fail_next_sync: bool,
}

impl FakeMaps {
    /// Whether the maps hold what [`steer_sets`] wants for `t`.
    fn holds(&self, t: &Tables) -> bool {
        let s = steer_sets(t, SNAT_PORTS);
        self.services == s.services.into_iter().collect()
            && self.vip_addrs == s.vip_addrs.into_iter().collect()
            && self.endpoints == s.endpoints.into_iter().collect()
            && self.snat == s.snat
    }
}

fn apply<T: Ord + Copy>(set: &mut BTreeSet<T>, insert: &[T], remove: &[T]) {
    for k in remove {
        set.remove(k);
    }
    set.extend(insert.iter().copied());
}

impl SteeringMaps for FakeMaps {
    fn sync_services(&mut self, keys: &[ServiceKey]) -> Result<(), NicError> {
        if std::mem::take(&mut self.fail_next_sync) {
            return Err(NicError::InvalidArgument { field: "services", reason: "injected".into() });
        }
        self.ops.push(Op::Sync);
        self.services = keys.iter().copied().collect();
        Ok(())
    }
    fn sync_vip_addrs(&mut self, addrs: &[IpAddr]) -> Result<(), NicError> {
        self.vip_addrs = addrs.iter().copied().collect();
        Ok(())
    }
    fn sync_snat(&mut self, ranges: &[(IpAddr, u16, u16)]) -> Result<(), NicError> {
        self.snat = ranges.to_vec();
        Ok(())
    }
    fn sync_endpoints(&mut self, keys: &[ServiceKey]) -> Result<(), NicError> {
        self.endpoints = keys.iter().copied().collect();
        self.known = true;
        Ok(())
    }
    fn update_services(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError> {
        if !self.known {
            return Ok(false);
        }
        self.ops.push(Op::Update { insert: insert.to_vec(), remove: remove.to_vec() });
        apply(&mut self.services, insert, remove);
        Ok(true)
    }
    fn update_vip_addrs(&mut self, insert: &[IpAddr], remove: &[IpAddr]) -> Result<bool, NicError> {
        if self.known {
            apply(&mut self.vip_addrs, insert, remove);
        }
        Ok(self.known)
    }
    fn update_endpoints(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError> {
        if self.known {
            apply(&mut self.endpoints, insert, remove);
        }
        Ok(self.known)
    }
    fn verify_next_sync(&mut self) {
        self.known = false;
        self.ops.push(Op::Verify);
    }
}

/// A host with one interface, an on-link route to 10.0.0.0/8 (so every backend's next hop is
/// itself) and the neighbours in `neighbours`; remembers what it was asked.
#[derive(Debug, Default)]
struct FakeKernel {
    neighbours: Vec<IpAddr>,
    /// Every `resolve` call's addresses, in order.
    resolved: Vec<Vec<IpAddr>>,
    facts_read: usize,
    reply_syncs: usize,
    /// `host_facts` fails.
    broken: bool,
}

impl Kernel for FakeKernel {
    fn host_facts(&mut self, cfg: &Config, routes: &[KernelRouteSpec]) -> Result<HostFacts, PublishError> {
        if self.broken {
            return Err(PublishError::Interface {
                interface: cfg.interfaces[0].name.clone(),
                error: NicError::UnknownInterface { ifname: cfg.interfaces[0].name.clone() },
            });
        }
        self.facts_read += 1;
        let mut kernel_routes = routes.to_vec();
        kernel_routes.push(KernelRouteSpec {
            dst: Cidr { addr: ip("10.0.0.0"), len: 8 },
            gateways: vec![],
            metric: 0,
            kernel: false,
        });
        Ok(HostFacts {
            ports: vec![([2, 0, 0, 0, 0, 1], 1500)],
            neighbours: self
                .neighbours
                .iter()
                .map(|&addr| NeighbourSpec { addr, mac: [2, 0, 0, 0, 0, 9], port: 0 })
                .collect(),
            kernel_routes,
            multipath_l4: false,
        })
    }
    fn resolve(&mut self, _cfg: &Config, addrs: &[IpAddr]) {
        let mut a = addrs.to_vec();
        a.sort_unstable();
        self.resolved.push(a);
    }
    fn sync_reply_rules(&mut self, _t: &Tables) {
        self.reply_syncs += 1;
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sorted(mut a: Vec<IpAddr>) -> Vec<IpAddr> {
    a.sort_unstable();
    a
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

fn config() -> Config {
    Config { interfaces: vec![InterfaceConfig { name: "eth0".into(), queues: vec![] }], ..cfg() }
}

/// Service `name` on cluster IP `vip`, port 80 → 8080, with one backend per address, and a
/// resourceVersion (so the translation can tell it unchanged).
fn service(name: &str, vip: &str, backends: &[&str], rv: u32) -> (Svc, Slice) {
    let mut s = svc(&format!("default/{name}"), vip).port("http", 80, 8080);
    s.0.metadata.resource_version = Some(rv.to_string());
    let mut sl = slice(&format!("default/{name}-1"), name, "IPv4").port("http", 8080);
    for b in backends {
        sl = sl.ep(ep(b));
    }
    sl.0.metadata.resource_version = Some(rv.to_string());
    (s, sl)
}

/// The index of Services `web` (10.0.0.1, 10.0.0.2) and, with `db`, `db` (10.0.0.3).
fn index(db: bool) -> ClusterIndex {
    let mut list = vec![service("web", "10.96.0.10", &["10.0.0.1", "10.0.0.2"], 1)];
    if db {
        list.push(service("db", "10.96.0.20", &["10.0.0.3"], 1));
    }
    let (svcs, slices) = list.into_iter().unzip();
    ClusterIndex::from_state(&state(svcs, slices, Some(our_node())))
}

fn changed(names: &[&str]) -> Changes {
    Changes::Services(names.iter().map(|n| ServiceRef::new("default", *n)).collect())
}

/// A publisher whose first tables (of `ix`) are published and whose maps are filled, as
/// `xlb run` starts.
fn started(ix: &ClusterIndex, kernel: &mut FakeKernel, now: Instant) -> (Publisher, TablesHandle, Vec<FakeMaps>) {
    let mut p = Publisher::new(Builders::default(), now);
    let input = Input::Cluster { index: ix, changes: &Changes::Full, local: &[] };
    let built = p.first(input, &config(), kernel).expect("valid");
    let handle = TablesHandle::new(built.tables);
    let mut maps = vec![FakeMaps::default(), FakeMaps::default()];
    p.start(&mut maps, &handle.load(), now).expect("fake maps");
    (p, handle, maps)
}

#[test]
fn the_first_publish_asks_for_every_next_hop_of_the_first_tables() {
    let mut k = FakeKernel::default();
    let mut p = Publisher::new(Builders::default(), Instant::now());
    let ix = index(true);
    let built = p.first(Input::Cluster { index: &ix, changes: &Changes::Full, local: &[] }, &config(), &mut k).unwrap();
    assert_eq!(k.resolved, [ips(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])]);
    let mut unresolved: Vec<IpAddr> = built.tables.unresolved.iter().copied().collect();
    unresolved.sort_unstable();
    assert_eq!(unresolved, ips(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]), "no neighbour known: all three wait");
    assert_eq!(k.facts_read, 1);
}

#[test]
fn after_an_incremental_build_only_the_added_next_hops_are_asked_for_after_a_full_one_all() {
    let t0 = Instant::now();
    let mut k = FakeKernel::default();
    let (mut p, handle, mut maps) = started(&index(false), &mut k, t0);
    assert_eq!(k.resolved, [ips(&["10.0.0.1", "10.0.0.2"])]);
    // db is added: an incremental build; only its backend is new.
    let ix = index(true);
    let input = Input::Cluster { index: &ix, changes: &changed(&["db"]), local: &[] };
    let out = p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    assert!(matches!(p.builders.tables.last_build(), BuildKind::Incremental { .. }));
    assert_eq!(out.resolving, ips(&["10.0.0.3"]));
    assert_eq!(k.resolved.last().unwrap(), &ips(&["10.0.0.3"]));
    // The kernel now knows 10.0.0.1: new host facts, a full build; every next hop still
    // missing is asked for again, not only the new ones (there are none).
    k.neighbours = ips(&["10.0.0.1"]);
    let input = Input::Cluster { index: &ix, changes: &Changes::Full, local: &[] };
    let out = p.publish(input, &config(), true, &handle, &mut maps, &mut k, t0).unwrap();
    assert_eq!(p.builders.tables.last_build(), BuildKind::Full);
    assert_eq!(sorted(out.resolving), ips(&["10.0.0.2", "10.0.0.3"]));
    assert_eq!(k.resolved.last().unwrap(), &ips(&["10.0.0.2", "10.0.0.3"]));
}

#[test]
fn an_incremental_publish_writes_only_the_changed_services_steering_keys() {
    let t0 = Instant::now();
    let mut k = FakeKernel::default();
    let (mut p, handle, mut maps) = started(&index(false), &mut k, t0);
    // The first publish after the start compares the whole sets.
    let ix = index(false);
    let input = Input::Cluster { index: &ix, changes: &Changes::default(), local: &[] };
    p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    for m in &maps {
        assert_eq!(m.ops, [Op::Sync, Op::Sync], "start-up, then the first publish");
    }
    maps.iter_mut().for_each(|m| m.ops.clear());
    let ix = index(true);
    let input = Input::Cluster { index: &ix, changes: &changed(&["db"]), local: &[] };
    let out = p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    assert!(out.steering.is_ok());
    let db = ServiceKey { addr: ip("10.96.0.20"), proto: 6, port: 80 };
    for m in &maps {
        assert_eq!(m.ops, [Op::Update { insert: vec![db], remove: vec![] }], "db's key only, no whole-set sync");
        assert!(m.holds(&handle.load()), "and the maps hold what the tables want");
    }
    assert_eq!(k.facts_read, 1, "a change of Services reads no host facts");
    assert_eq!(k.reply_syncs, 2, "reply rules follow every publish");
}

#[test]
fn a_failed_build_keeps_the_running_tables_and_the_next_publish_compares_the_whole_sets() {
    let t0 = Instant::now();
    let mut k = FakeKernel::default();
    let (mut p, handle, mut maps) = started(&index(false), &mut k, t0);
    let ix = index(false);
    let input = Input::Cluster { index: &ix, changes: &Changes::default(), local: &[] };
    p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    maps.iter_mut().for_each(|m| m.ops.clear());
    let running = handle.load();
    // A reload with an invalid configuration (syncPeriod 0).
    let bad = Config { sync_period: Duration::ZERO, ..config() };
    let ix = index(true);
    let input = Input::Cluster { index: &ix, changes: &changed(&["db"]), local: &[] };
    let e = p.publish(input, &bad, false, &handle, &mut maps, &mut k, t0).unwrap_err();
    assert!(matches!(e, PublishError::Translate(_)), "{e}");
    assert!(Arc::ptr_eq(&running, &handle.load()), "the running tables stay");
    assert!(maps.iter().all(|m| m.ops.is_empty()), "nothing written");
    // Host facts that cannot be read fail the build the same way.
    k.broken = true;
    let input = Input::Cluster { index: &ix, changes: &changed(&["db"]), local: &[] };
    let e = p.publish(input, &config(), true, &handle, &mut maps, &mut k, t0).unwrap_err();
    assert_eq!(e.to_string(), "interface eth0: no interface `eth0` in this network namespace");
    assert!(Arc::ptr_eq(&running, &handle.load()));
    // The configuration is good again: published, and the maps compared as a whole (what the
    // failed builds changed is in no change set).
    k.broken = false;
    let input = Input::Cluster { index: &ix, changes: &changed(&["db"]), local: &[] };
    p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    assert!(!Arc::ptr_eq(&running, &handle.load()));
    for m in &maps {
        assert_eq!(m.ops, [Op::Sync]);
        assert!(m.holds(&handle.load()));
    }
}

#[test]
fn a_failed_steering_sync_still_publishes_and_the_next_publish_compares_the_whole_sets() {
    let t0 = Instant::now();
    let mut k = FakeKernel::default();
    let (mut p, handle, mut maps) = started(&index(false), &mut k, t0);
    maps[0].fail_next_sync = true;
    let ix = index(true);
    let input = Input::Cluster { index: &ix, changes: &changed(&["db"]), local: &[] };
    let out = p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    assert!(out.steering.is_err());
    assert_eq!(handle.load().services.iter().filter(|s| s.name.starts_with("default/db")).count(), 1);
    assert!(!maps[0].known, "a failed sync compares with the kernel next time");
    maps.iter_mut().for_each(|m| m.ops.clear());
    let input = Input::Cluster { index: &ix, changes: &Changes::default(), local: &[] };
    let out = p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    assert!(out.steering.is_ok());
    for m in &maps {
        assert_eq!(m.ops, [Op::Sync]);
        assert!(m.holds(&handle.load()));
    }
}

#[test]
fn sync_04_once_every_sync_period_the_maps_are_compared_with_the_kernels() {
    let t0 = Instant::now();
    let mut k = FakeKernel::default();
    let (mut p, handle, mut maps) = started(&index(false), &mut k, t0);
    let period = config().sync_period;
    let ix = index(false);
    let input = Input::Cluster { index: &ix, changes: &Changes::default(), local: &[] };
    p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0).unwrap();
    maps.iter_mut().for_each(|m| m.ops.clear());
    let ix = index(true);
    let input = Input::Cluster { index: &ix, changes: &changed(&["db"]), local: &[] };
    p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0 + period - Duration::from_millis(1)).unwrap();
    assert!(maps.iter().all(|m| matches!(m.ops[..], [Op::Update { .. }])), "not yet: {:?}", maps[0].ops);
    maps.iter_mut().for_each(|m| m.ops.clear());
    let input = Input::Cluster { index: &ix, changes: &Changes::default(), local: &[] };
    p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0 + period).unwrap();
    for m in &maps {
        assert_eq!(m.ops, [Op::Verify, Op::Sync], "a period after the start-up sync");
    }
    maps.iter_mut().for_each(|m| m.ops.clear());
    let input = Input::Cluster { index: &ix, changes: &Changes::default(), local: &[] };
    p.publish(input, &config(), false, &handle, &mut maps, &mut k, t0 + period + period / 2).unwrap();
    assert!(maps.iter().all(|m| !m.ops.contains(&Op::Verify)), "the period counts from the last comparison");
}

#[test]
fn a_standalone_build_reads_the_host_only_when_asked() {
    let mut k = FakeKernel::default();
    let mut b = Builders::default();
    let (s, sl) = service("web", "10.96.0.10", &["10.0.0.1"], 1);
    let st = state(vec![s], vec![sl], Some(our_node()));
    let built = b.build(Input::File(&st), &config(), true, &mut k).unwrap();
    assert_eq!(built.tables.services.iter().filter(|s| s.name.starts_with("default/web")).count(), 1);
    b.build(Input::File(&st), &config(), false, &mut k).unwrap();
    assert_eq!(k.facts_read, 1, "the last facts are reused");
    b.build(Input::File(&st), &config(), true, &mut k).unwrap();
    assert_eq!(k.facts_read, 2);
    assert!(built.vips.is_empty(), "announce.mode none announces nothing");
}

#[test]
fn a_reloaded_file_replaces_the_objects_keeps_the_host_addresses_and_counts_the_changes() {
    let (web, web_sl) = service("web", "10.96.0.10", &["10.0.0.1"], 1);
    let (db, db_sl) = service("db", "10.96.0.20", &["10.0.0.3"], 1);
    let mut running = state(vec![web.clone(), db], vec![web_sl.clone(), db_sl], None);
    running.local_addresses = ips(&["192.168.1.10"]);
    let (web2, _) = service("web", "10.96.0.11", &["10.0.0.1"], 2);
    let reloaded = state(vec![web2], vec![web_sl], Some(our_node()));
    let (services, endpoints) = take_reloaded(&mut running, reloaded);
    assert_eq!((services, endpoints), (2, 1), "web changed and db removed; db's slice removed");
    assert_eq!(running.services.len(), 1);
    assert!(running.node.is_some(), "the file's Node");
    assert_eq!(running.local_addresses, ips(&["192.168.1.10"]), "read from the host, not the file");
}

#[test]
fn a_reloaded_file_whose_edited_service_kept_its_resource_version_is_programmed() {
    // `xlb run --config FILE` takes objects "exactly as `kubectl get -o yaml` prints them",
    // resourceVersion included. An operator edits the port and sends SIGHUP: the reload must
    // program port 8080, not keep serving port 80.
    let doc = |port: u16| {
        format!(
            "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\nnodeName: node-a\n---\n\
             apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\n  resourceVersion: \"4711\"\n\
             spec:\n  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10]\n  ports:\n  - name: http\n    port: {port}\n    targetPort: 8080\n"
        )
    };
    let key = |port: u16| dataplane::tables::VipKey {
        addr: dataplane::addr::mapped("10.96.0.10".parse().unwrap()),
        port,
        proto: 6,
    };
    let mut k = FakeKernel::default();
    let mut b = Builders::default();
    let first = crate::file_source::load_str(&doc(80), "first.yaml").unwrap();
    let built = b.build(Input::File(&first.cluster), &config(), true, &mut k).unwrap();
    assert!(built.tables.vips.get(&key(80)).is_some());
    let edited = crate::file_source::load_str(&doc(8080), "edited.yaml").unwrap();
    let built = b.build(Input::File(&edited.cluster), &config(), true, &mut k).unwrap();
    assert!(built.tables.vips.get(&key(8080)).is_some(), "the edited port is programmed");
    assert!(built.tables.vips.get(&key(80)).is_none(), "the old port is gone");
}
