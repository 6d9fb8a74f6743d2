//! Fragment table: later IP fragments follow their first fragment.
//!
//! Only the first fragment carries the L4 header (RFC 791 §2.3; RFC 8200 §4.5), so it is the
//! one that gets a backend. Its translation is recorded under (source, destination, protocol,
//! identification) for a few seconds; later fragments with the same key get the same L3
//! rewrite, encapsulation and next hop, without reassembly. A later fragment with no record
//! (it arrived first, or the record expired) is a counted drop (`FragmentUntracked`). Like
//! Katran and IPVS, out-of-order fragments are not buffered.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use hashbrown::HashMap;

use crate::addr::Family;
use crate::tables::{BackendRef, Hop};

/// Key of a fragment series.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct FragKey<A> {
    /// Source address (as received).
    pub src: A,
    /// Destination address (as received).
    pub dst: A,
    /// IPv4 identification or IPv6 fragment identification.
    pub id: u32,
    /// L4 protocol.
    pub proto: u8,
}

/// What to do with the later fragments of a series.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum FragAction<A> {
    /// Rewrite addresses (NAT, either direction).
    Nat {
        /// New source address.
        src: A,
        /// New destination address.
        dst: A,
    },
    /// Encapsulate (DSR IPIP / IP6IP6).
    Encap {
        /// Outer source.
        outer_src: A,
        /// Outer destination (the backend).
        outer_dst: A,
        /// IPv6 flow label seed.
        flow_hash: u32,
    },
    /// Change only the MACs (L2 DSR).
    L2,
}

/// A recorded series.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct FragEntry<A> {
    /// L3 action.
    pub action: FragAction<A>,
    /// Next hop.
    pub hop: Hop,
    /// Backend, for per-backend counters (default for replies).
    pub backend: BackendRef,
    /// Expiry in worker seconds.
    pub expires_s: u32,
}

/// Per-worker fragment table with bounded capacity and a randomly seeded hasher.
#[derive(Debug)]
pub struct FragTable<A: Family> {
    map: HashMap<FragKey<A>, FragEntry<A>, foldhash::fast::RandomState>,
    capacity: usize,
    last_reclaim_s: u32,
}

impl<A: Family> FragTable<A> {
    /// A table for at most `capacity` series (memory reserved up front).
    pub fn new(capacity: usize) -> Self {
        // Twice the room, and one more: removed records leave tombstones, and an insert that
        // finds no room left beside them rehashes in place only while the records plus the new
        // one fill at most half the table; past that it would allocate a larger table, on the
        // packet path (hashbrown `reserve_rehash`).
        let room = capacity.saturating_mul(2).saturating_add(2);
        Self {
            map: HashMap::with_capacity_and_hasher(room, foldhash::fast::RandomState::default()),
            capacity,
            last_reclaim_s: u32::MAX,
        }
    }

    /// Records a series. When full, expired series are dropped first.
    ///
    /// Returns `false` if the table is still full; the caller then drops the first fragment
    /// (its later fragments could not follow it) as `FragmentTableFull`.
    pub fn insert(&mut self, k: FragKey<A>, e: FragEntry<A>, now_s: u32) -> bool {
        if self.map.len() >= self.capacity && !self.map.contains_key(&k) {
            // Rescan at most once per second, so a full table costs a probe, not a scan.
            if self.last_reclaim_s != now_s {
                self.last_reclaim_s = now_s;
                self.map.retain(|_, v| v.expires_s >= now_s);
            }
            if self.map.len() >= self.capacity {
                return false;
            }
        }
        self.map.insert(k, e);
        true
    }

    /// The live record for `k`.
    #[inline]
    pub fn get(&mut self, k: &FragKey<A>, now_s: u32) -> Option<FragEntry<A>> {
        match self.map.get(k) {
            Some(e) if e.expires_s >= now_s => Some(*e),
            Some(_) => {
                self.map.remove(k);
                None
            }
            None => None,
        }
    }

    /// Number of recorded series.
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
    use crate::addr::V4;

    fn entry(exp: u32) -> FragEntry<V4> {
        FragEntry {
            action: FragAction::L2,
            hop: Hop { port: 0, dst_mac: [0; 6], src_mac: [0; 6], mtu: 1500 },
            backend: BackendRef(0),
            expires_s: exp,
        }
    }

    #[test]
    fn records_expire_and_full_table_recycles_expired_records() {
        let mut t = FragTable::<V4>::new(1);
        let k = |id| FragKey { src: V4([1; 4]), dst: V4([2; 4]), id, proto: 17 };
        assert!(t.insert(k(1), entry(10), 0));
        assert!(!t.insert(k(2), entry(10), 5));
        assert!(t.get(&k(1), 10).is_some());
        assert!(t.get(&k(1), 11).is_none());
        assert!(t.insert(k(3), entry(30), 20));
        assert!(t.insert(k(4), entry(50), 40), "expired record 3 is recycled");
    }

    /// Records come and go (expired ones removed by `get` and by the reclaim of a full table):
    /// the removals leave tombstones, and the table must absorb them without growing, since
    /// `insert` runs per packet.
    #[test]
    fn a_full_table_under_churn_never_reallocates() {
        for cap in [28, 100, 1000] {
            let mut t = FragTable::<V4>::new(cap);
            let reserved = t.map.allocation_size();
            let mut id = 0u32;
            for now in 0..200u32 {
                for _ in 0..cap {
                    id = id.wrapping_add(0x9e37_79b9);
                    let k = |id| FragKey { src: V4([1; 4]), dst: V4([2; 4]), id, proto: 17 };
                    t.insert(k(id), entry(now + 1), now);
                    let _ = t.get(&k(id ^ 1), now);
                }
                assert_eq!(t.map.allocation_size(), reserved, "capacity {cap}, second {now}: the table grew");
            }
        }
    }
}
