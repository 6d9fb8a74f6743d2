//! ClientIP session affinity, shared by all workers (seed AFF-01..04).
//!
//! RSS spreads one client's connections over several queues, so a per-worker table would let
//! each worker pick its own backend for the same client. The table is a lock-free concurrent
//! map (`papaya`), touched only by new flows of services with `sessionAffinity: ClientIP`:
//! one lookup, and one insert that restarts the timer (AFF-04). Established packets never
//! read it. Two workers racing on a client's first two connections may each pick a backend;
//! the later insert wins, so the client converges after its first connections.
//!
//! Times are seconds on the process-wide clock of [`crate::worker`] (all workers share one
//! epoch), so an expiry written by one worker means the same to another.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::net::IpAddr;

use crate::tables::{BackendRef, Tables};

/// (service id, client address as 16 bytes, IPv4 mapped).
pub type AffinityKey = (u32, [u8; 16]);

/// The shared table. Capacity is a soft bound: when full, expired records are dropped first,
/// and if still full the new record is not kept (affinity is a preference; the flow itself is
/// tracked by conntrack either way).
#[derive(Debug)]
pub struct AffinityTable {
    map: papaya::HashMap<AffinityKey, (BackendRef, u32), foldhash::fast::RandomState>,
    capacity: usize,
    last_reclaim_s: std::sync::atomic::AtomicU32,
}

impl AffinityTable {
    /// A table holding about `capacity` records.
    pub fn new(capacity: usize) -> Self {
        Self {
            map: papaya::HashMap::builder()
                .capacity(capacity.min(1 << 16))
                .hasher(foldhash::fast::RandomState::default())
                .build(),
            capacity,
            last_reclaim_s: std::sync::atomic::AtomicU32::new(u32::MAX),
        }
    }

    /// The backend recorded for (service, client) if its record has not expired at `now_s`.
    #[inline]
    pub fn get(&self, k: &AffinityKey, now_s: u32) -> Option<BackendRef> {
        let m = self.map.pin();
        m.get(k).filter(|(_, exp)| *exp >= now_s).map(|(r, _)| *r)
    }

    /// Records or refreshes (service, client) → backend until `expires_s`.
    pub fn put(&self, k: AffinityKey, r: BackendRef, expires_s: u32, now_s: u32) {
        let m = self.map.pin();
        if m.len() >= self.capacity && !m.contains_key(&k) {
            // Rescan at most once per second (whichever worker gets there first).
            use std::sync::atomic::Ordering::Relaxed;
            if self.last_reclaim_s.swap(now_s, Relaxed) != now_s {
                m.retain(|_, v| v.1 >= now_s);
            }
            if m.len() >= self.capacity {
                return;
            }
        }
        m.insert(k, (r, expires_s));
    }

    /// Number of records (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The live records at `now_s` (worker seconds) under tables `t`, by names and addresses,
    /// for a hand-over to another process (`dataplane::process::snapshot`), whose service ids
    /// and backend slots differ. Records whose service or backend `t` no longer has are left
    /// out. Allocates; O(records).
    #[must_use]
    pub fn export(&self, t: &Tables, now_s: u32) -> Vec<AffinityRecord> {
        let by_id: std::collections::HashMap<u32, &str> = t.services.iter().map(|s| (s.id, &*s.name)).collect();
        let m = self.map.pin();
        m.iter()
            .filter(|(_, (_, exp))| *exp >= now_s)
            .filter_map(|((svc, client), (r, exp))| {
                let b = t.backend(*r)?;
                Some(AffinityRecord {
                    service: (*by_id.get(svc)?).into(),
                    client: *client,
                    backend: b.addr,
                    port: b.port,
                    left_s: exp - now_s + 1,
                })
            })
            .collect()
    }

    /// Takes `records` of another process under tables `t` at `now_s` (worker seconds): each
    /// keeps its client, backend and the time it had left, found again by the service's name
    /// and the backend's address and port. Returns (imported, gone): records whose service or
    /// backend `t` lacks are dropped; the table's capacity applies as to [`Self::put`].
    pub fn import(&self, t: &Tables, records: &[AffinityRecord], now_s: u32) -> (usize, usize) {
        let by_name: std::collections::HashMap<&str, u32> = t.services.iter().map(|s| (&*s.name, s.id)).collect();
        let (mut imported, mut gone) = (0, 0);
        for r in records {
            let found = by_name.get(&*r.service).and_then(|&id| {
                let b = t.member_at(id, r.backend, r.port)?;
                Some((id, b.this))
            });
            match found {
                Some((id, this)) => {
                    self.put((id, r.client), this, now_s.saturating_add(r.left_s.saturating_sub(1)), now_s);
                    imported += 1;
                }
                None => gone += 1,
            }
        }
        (imported, gone)
    }
}

/// A ClientIP affinity record outside its process (a hand-over snapshot): the service by
/// its name ([`crate::tables::Service::name`], e.g. `default/web:http`), the backend by its
/// address and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AffinityRecord {
    /// The service's name.
    pub service: Box<str>,
    /// The client address, 16 bytes (IPv4 mapped).
    pub client: [u8; 16],
    /// The backend's address.
    pub backend: IpAddr,
    /// The backend's port.
    pub port: u16,
    /// Seconds the record had left when exported (≥ 1).
    pub left_s: u32,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;

    #[test]
    fn records_expire_and_a_full_table_recycles_expired_records() {
        let t = AffinityTable::new(1);
        t.put((1, [1; 16]), BackendRef(7), 10, 0);
        assert_eq!(t.get(&(1, [1; 16]), 10), Some(BackendRef(7)));
        assert_eq!(t.get(&(1, [1; 16]), 11), None);
        t.put((1, [2; 16]), BackendRef(8), 30, 5);
        assert_eq!(t.get(&(1, [2; 16]), 5), None, "full: not recorded while the first is live");
        t.put((1, [2; 16]), BackendRef(8), 30, 20);
        assert_eq!(t.get(&(1, [2; 16]), 20), Some(BackendRef(8)), "expired record recycled");
    }

    fn tables(services: &[(&str, &[&str])]) -> Tables {
        use crate::tables::{
            BackendSpec, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, Scheduler, ServiceSpec,
            TableBuilder, TablesSpec,
        };
        let spec = TablesSpec {
            services: services
                .iter()
                .enumerate()
                .map(|(i, (name, backends))| {
                    let vip = std::net::Ipv4Addr::new(10, 96, 0, u8::try_from(i + 1).unwrap());
                    ServiceSpec {
                        name: (*name).into(),
                        frontends: vec![Frontend::new(vip.into(), L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
                        scheduler: Scheduler::RoundRobin,
                        affinity_timeout_s: Some(10_800),
                        mode: ForwardingMode::Nat,
                        when_empty: EmptyAction::Reject,
                        backends: backends.iter().map(|a| BackendSpec::ready(a.parse().unwrap(), 8080)).collect(),
                    }
                    .into()
                })
                .collect(),
            ..Default::default()
        };
        TableBuilder::new().build(&spec).unwrap()
    }

    #[test]
    fn exported_records_come_back_on_the_same_backend_under_another_process_tables() {
        // The old process: services in one order; the new one lists them the other way round
        // and the backends in another order, so ids and slots differ, and drops one backend.
        let old = tables(&[("demo/a:http", &["10.0.0.1", "10.0.0.2"]), ("demo/b:http", &["10.0.1.1", "10.0.1.2"])]);
        let new = tables(&[("demo/b:http", &["10.0.1.2"]), ("demo/a:http", &["10.0.0.2", "10.0.0.1", "10.0.0.3"])]);
        let (a_old, b_old) = (&old.services[0], &old.services[1]);
        let t = AffinityTable::new(16);
        let at = |s: &crate::tables::Service, t: &Tables, addr: &str| {
            s.members.iter().copied().find(|r| t.backend(*r).unwrap().addr == addr.parse::<IpAddr>().unwrap()).unwrap()
        };
        t.put((a_old.id, [1; 16]), at(a_old, &old, "10.0.0.2"), 1_000, 100);
        t.put((b_old.id, [1; 16]), at(b_old, &old, "10.0.1.1"), 1_000, 100); // gone in `new`
        t.put((a_old.id, [2; 16]), at(a_old, &old, "10.0.0.1"), 50, 10); // expired at 100
        let recs = t.export(&old, 100);
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert!(recs.iter().all(|r| r.left_s == 901), "{recs:?}");

        let fresh = AffinityTable::new(16);
        assert_eq!(fresh.import(&new, &recs, 7), (1, 1), "one imported, one whose backend is gone");
        let a_new = new.services.iter().find(|s| &*s.name == "demo/a:http").unwrap();
        let got = fresh.get(&(a_new.id, [1; 16]), 7).unwrap();
        assert_eq!(new.backend(got).unwrap().addr, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(fresh.get(&(a_new.id, [1; 16]), 7 + 900), Some(got), "keeps the time it had left");
        assert_eq!(fresh.get(&(a_new.id, [1; 16]), 7 + 901), None);
    }

    #[test]
    fn two_threads_see_one_record() {
        let t = std::sync::Arc::new(AffinityTable::new(16));
        let t2 = t.clone();
        std::thread::spawn(move || t2.put((3, [9; 16]), BackendRef(5), 100, 0)).join().unwrap();
        assert_eq!(t.get(&(3, [9; 16]), 50), Some(BackendRef(5)));
    }
}
