//! ClientIP session affinity, shared by all workers (seed AFF-01..04).
//!
//! RSS spreads one client's connections over several queues, so a per-worker table would let
//! each worker pick its own backend for the same client. The table is a lock-free concurrent
//! map (`papaya`), touched only by new flows of services with `sessionAffinity: ClientIP`:
//! one lookup, and one insert that restarts the timer (AFF-04). Established packets never
//! read it. A lookup judges a record's age by the service's current timeout, as kube-proxy's
//! `recent --rcheck --seconds T` does, so a changed `timeoutSeconds` applies at once to the
//! clients already recorded (a record that makes room in a full table is judged by the
//! timeout it was written with). Two workers racing on a client's first two connections may
//! each pick a backend; the later insert wins, so the client converges after its first
//! connections.
//!
//! Times are seconds on the process-wide clock of [`crate::worker`] (all workers share one
//! epoch), so an expiry written by one worker means the same to another.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::net::IpAddr;

use crate::tables::{BackendRef, Tables};

/// (service id, client address as 16 bytes, IPv4 mapped).
pub type AffinityKey = (u32, [u8; 16]);

/// A record: the backend, when the record expires under the timeout it was written with, and
/// that timeout (seconds). `expires_s - timeout_s` is when the client last connected.
#[derive(Clone, Copy, Debug)]
struct Record {
    backend: BackendRef,
    expires_s: u32,
    timeout_s: u32,
}

impl Record {
    /// Whether the record is live at `now_s` under timeout `timeout_s` (seconds): the client
    /// connected at most `timeout_s` ago.
    fn live(&self, now_s: u32, timeout_s: u32) -> bool {
        i64::from(self.expires_s) - i64::from(self.timeout_s) + i64::from(timeout_s) >= i64::from(now_s)
    }
}

/// The shared table. Capacity is a soft bound: when full, expired records are dropped first,
/// and if still full the new record is not kept (affinity is a preference; the flow itself is
/// tracked by conntrack either way).
#[derive(Debug)]
pub struct AffinityTable {
    map: papaya::HashMap<AffinityKey, Record, foldhash::fast::RandomState>,
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

    /// The backend recorded for (service, client) if the client connected at most `timeout_s`
    /// seconds before `now_s`; `timeout_s` is the service's timeout now, whatever it was when
    /// the record was written (AFF-04).
    #[inline]
    pub fn get(&self, k: &AffinityKey, now_s: u32, timeout_s: u32) -> Option<BackendRef> {
        let m = self.map.pin();
        m.get(k).filter(|r| r.live(now_s, timeout_s)).map(|r| r.backend)
    }

    /// Records or refreshes (service, client) → backend until `expires_s`, written under the
    /// service's timeout `timeout_s` (seconds; the client connected at `expires_s - timeout_s`).
    /// When the table is full, records past their `expires_s` make room.
    pub fn put(&self, k: AffinityKey, r: BackendRef, expires_s: u32, timeout_s: u32, now_s: u32) {
        let m = self.map.pin();
        if m.len() >= self.capacity && !m.contains_key(&k) {
            // Rescan at most once per second (whichever worker gets there first).
            use std::sync::atomic::Ordering::Relaxed;
            if self.last_reclaim_s.swap(now_s, Relaxed) != now_s {
                m.retain(|_, v| v.expires_s >= now_s);
            }
            if m.len() >= self.capacity {
                return;
            }
        }
        m.insert(k, Record { backend: r, expires_s, timeout_s });
    }

    /// Number of records (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The live records at `now_s` (worker seconds) under tables `t` (each service's timeout
    /// there), by names and addresses, for a hand-over to another process
    /// (`dataplane::process::snapshot`), whose service ids and backend slots differ. Records
    /// whose service, affinity or backend `t` no longer has are left out. Allocates;
    /// O(records).
    #[must_use]
    pub fn export(&self, t: &Tables, now_s: u32) -> Vec<AffinityRecord> {
        let by_id: std::collections::HashMap<u32, (&str, u32)> =
            t.services.iter().filter_map(|s| Some((s.id, (&*s.name, s.affinity_timeout_s?)))).collect();
        let m = self.map.pin();
        m.iter()
            .filter_map(|((svc, client), rec)| {
                let &(name, timeout_s) = by_id.get(svc)?;
                if !rec.live(now_s, timeout_s) {
                    return None;
                }
                let b = t.backend(rec.backend)?;
                // The time left under the current timeout, at least 1 (the record is live).
                let left =
                    i64::from(rec.expires_s) - i64::from(rec.timeout_s) + i64::from(timeout_s) - i64::from(now_s);
                Some(AffinityRecord {
                    service: name.into(),
                    client: *client,
                    backend: b.addr,
                    port: b.port,
                    left_s: u32::try_from(left.saturating_add(1)).unwrap_or(u32::MAX),
                })
            })
            .collect()
    }

    /// Takes `records` of another process under tables `t` at `now_s` (worker seconds): each
    /// keeps its client, backend and the time it had left, found again by the service's name
    /// and the backend's address and port. Returns (imported, gone): records whose service or
    /// backend `t` lacks are dropped; the table's capacity applies as to [`Self::put`].
    pub fn import(&self, t: &Tables, records: &[AffinityRecord], now_s: u32) -> (usize, usize) {
        let by_name: std::collections::HashMap<&str, (u32, Option<u32>)> =
            t.services.iter().map(|s| (&*s.name, (s.id, s.affinity_timeout_s))).collect();
        let (mut imported, mut gone) = (0, 0);
        for r in records {
            let found = by_name.get(&*r.service).and_then(|&(id, timeout_s)| {
                let b = t.member_at(id, r.backend, r.port)?;
                Some((id, b.this, timeout_s))
            });
            match found {
                Some((id, this, timeout_s)) => {
                    let left = r.left_s.saturating_sub(1);
                    // Written under the service's timeout here, so that a lookup under it
                    // gives the record the time it had left; a timeout shorter than that
                    // counts from now (the client's last connection is not in the record).
                    let timeout_s = timeout_s.map_or(left, |t| t.max(left));
                    self.put((id, r.client), this, now_s.saturating_add(left), timeout_s, now_s);
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
        t.put((1, [1; 16]), BackendRef(7), 10, 10, 0);
        assert_eq!(t.get(&(1, [1; 16]), 10, 10), Some(BackendRef(7)));
        assert_eq!(t.get(&(1, [1; 16]), 11, 10), None);
        t.put((1, [2; 16]), BackendRef(8), 30, 25, 5);
        assert_eq!(t.get(&(1, [2; 16]), 5, 25), None, "full: not recorded while the first is live");
        t.put((1, [2; 16]), BackendRef(8), 30, 10, 20);
        assert_eq!(t.get(&(1, [2; 16]), 20, 10), Some(BackendRef(8)), "expired record recycled");
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
        // Written under the services' timeout (10 800 s) as if the clients connected long ago.
        t.put((a_old.id, [1; 16]), at(a_old, &old, "10.0.0.2"), 1_000, 10_800, 100);
        t.put((b_old.id, [1; 16]), at(b_old, &old, "10.0.1.1"), 1_000, 10_800, 100); // gone in `new`
        t.put((a_old.id, [2; 16]), at(a_old, &old, "10.0.0.1"), 50, 10_800, 10); // expired at 100
        let recs = t.export(&old, 100);
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert!(recs.iter().all(|r| r.left_s == 901), "{recs:?}");

        let fresh = AffinityTable::new(16);
        assert_eq!(fresh.import(&new, &recs, 7), (1, 1), "one imported, one whose backend is gone");
        let a_new = new.services.iter().find(|s| &*s.name == "demo/a:http").unwrap();
        let got = fresh.get(&(a_new.id, [1; 16]), 7, 10_800).unwrap();
        assert_eq!(new.backend(got).unwrap().addr, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(fresh.get(&(a_new.id, [1; 16]), 7 + 900, 10_800), Some(got), "keeps the time it had left");
        assert_eq!(fresh.get(&(a_new.id, [1; 16]), 7 + 901, 10_800), None);
    }

    #[test]
    fn two_threads_see_one_record() {
        let t = std::sync::Arc::new(AffinityTable::new(16));
        let t2 = t.clone();
        std::thread::spawn(move || t2.put((3, [9; 16]), BackendRef(5), 100, 100, 0)).join().unwrap();
        assert_eq!(t.get(&(3, [9; 16]), 50, 100), Some(BackendRef(5)));
    }
}
