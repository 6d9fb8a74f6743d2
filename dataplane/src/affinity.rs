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

use crate::tables::BackendRef;

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

    #[test]
    fn two_threads_see_one_record() {
        let t = std::sync::Arc::new(AffinityTable::new(16));
        let t2 = t.clone();
        std::thread::spawn(move || t2.put((3, [9; 16]), BackendRef(5), 100, 0)).join().unwrap();
        assert_eq!(t.get(&(3, [9; 16]), 50), Some(BackendRef(5)));
    }
}
