//! Fragment table: later IP fragments follow their first fragment.
//!
//! Only the first fragment carries the L4 header (RFC 791 §2.3; RFC 8200 §4.5), so it is the
//! one that gets a backend. Its translation is recorded under (source, destination, protocol,
//! identification) for a few seconds; later fragments with the same key get the same L3
//! rewrite, encapsulation and next hop, without reassembly. A later fragment with no record
//! (it arrived first, or the record expired) is a counted drop (`FragmentUntracked`). Like
//! Katran and IPVS, out-of-order fragments are not buffered.
//!
//! A full table forgets its oldest series for a new one (first in, first out) rather than
//! refusing the new one: a series needs its record only until its last fragment, micro- to
//! milliseconds after its first, while a refusal for as long as the table stays full let one
//! source that sends first fragments with fresh identifications at `capacity` per timeout
//! (1,640 a second against 8,192 series and 5 s) deny every other fragmented datagram. To
//! push out a series between its first and last fragment, a flood must now insert `capacity`
//! series in that time. Linux's reassembly refuses instead, past `ipfrag_high_thresh`.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::VecDeque;

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
    /// Each series with the sequence number of its insertion.
    map: HashMap<FragKey<A>, (FragEntry<A>, u32), foldhash::fast::RandomState>,
    /// Series in insertion order with their sequence numbers; a series removed since (expired,
    /// or inserted again under a newer number) is passed over when its turn comes. Never
    /// longer than `capacity`, so the map never holds more.
    order: VecDeque<(FragKey<A>, u32)>,
    next_seq: u32,
    capacity: usize,
}

/// What [`FragTable::insert`] did to make room.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Room {
    /// Nothing: there was room, the series was recorded already, or the oldest record had
    /// expired.
    Free,
    /// The oldest series, not yet expired, was forgotten (its later fragments, if any still
    /// come, count as `FragmentUntracked`).
    EvictedLive,
}

impl<A: Family> FragTable<A> {
    /// A table for at most `capacity` series (at least 1; memory reserved up front).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        // Twice the room, and one more: removed records leave tombstones, and an insert that
        // finds no room left beside them rehashes in place only while the records plus the new
        // one fill at most half the table; past that it would allocate a larger table, on the
        // packet path (hashbrown `reserve_rehash`).
        let room = capacity.saturating_mul(2).saturating_add(2);
        Self {
            map: HashMap::with_capacity_and_hasher(room, foldhash::fast::RandomState::default()),
            order: VecDeque::with_capacity(capacity),
            next_seq: 0,
            capacity,
        }
    }

    /// Records a series (a live series recorded already gets `e` in place and keeps its turn;
    /// an expired one is recorded anew). When `capacity` series are recorded, the oldest is
    /// forgotten first: see the module's documentation. Never allocates.
    pub fn insert(&mut self, k: FragKey<A>, e: FragEntry<A>, now_s: u32) -> Room {
        if let Some((x, _)) = self.map.get_mut(&k) {
            if x.expires_s >= now_s {
                *x = e;
                return Room::Free;
            }
            self.map.remove(&k);
        }
        let mut room = Room::Free;
        if self.order.len() >= self.capacity
            && let Some((old, seq)) = self.order.pop_front()
            && self.map.get(&old).is_some_and(|(_, s)| *s == seq)
            && let Some((gone, _)) = self.map.remove(&old)
            && gone.expires_s >= now_s
        {
            room = Room::EvictedLive;
        }
        let seq = self.next_seq;
        self.next_seq = seq.wrapping_add(1);
        self.order.push_back((k, seq));
        self.map.insert(k, (e, seq));
        room
    }

    /// The live record for `k`.
    #[inline]
    pub fn get(&mut self, k: &FragKey<A>, now_s: u32) -> Option<FragEntry<A>> {
        match self.map.get(k) {
            Some((e, _)) if e.expires_s >= now_s => Some(*e),
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
    fn records_expire_and_a_full_table_forgets_its_oldest_series_for_a_new_one() {
        let mut t = FragTable::<V4>::new(2);
        let k = |id| FragKey { src: V4([1; 4]), dst: V4([2; 4]), id, proto: 17 };
        assert_eq!(t.insert(k(1), entry(10), 0), Room::Free);
        assert_eq!(t.insert(k(2), entry(10), 0), Room::Free);
        assert_eq!(t.insert(k(1), entry(12), 1), Room::Free, "a series recorded again keeps its place");
        assert_eq!(t.insert(k(3), entry(10), 5), Room::EvictedLive, "full: the oldest, live, goes");
        assert!(t.get(&k(1), 5).is_none(), "series 1, the oldest, was forgotten");
        assert!(t.get(&k(2), 5).is_some() && t.get(&k(3), 5).is_some());
        assert!(t.get(&k(2), 11).is_none(), "expired");
        assert_eq!(t.insert(k(4), entry(30), 20), Room::Free, "series 2's turn: removed already");
        assert_eq!(t.insert(k(5), entry(30), 20), Room::Free, "series 3's turn: expired, not live");
        assert_eq!(t.len(), 2);
        assert!(t.get(&k(4), 30).is_some() && t.get(&k(5), 30).is_some());
        assert!(t.get(&k(4), 31).is_none());
    }

    /// A series removed (expired) and recorded again is a new series: the old turn in the
    /// order does not forget the new record.
    #[test]
    fn a_series_recorded_again_after_expiry_is_not_forgotten_for_its_old_turn() {
        let mut t = FragTable::<V4>::new(3);
        let k = |id| FragKey { src: V4([1; 4]), dst: V4([2; 4]), id, proto: 17 };
        t.insert(k(1), entry(1), 0);
        t.insert(k(2), entry(100), 0);
        assert!(t.get(&k(1), 2).is_none(), "expired, removed");
        t.insert(k(1), entry(100), 2);
        // Full: the oldest turn is series 1's first, stale; nothing live goes for series 3.
        assert_eq!(t.insert(k(3), entry(100), 3), Room::Free);
        assert!(t.get(&k(1), 3).is_some(), "series 1's new record stays");
        assert!(t.get(&k(2), 3).is_some() && t.get(&k(3), 3).is_some());
        // An expired record not yet removed, recorded again, takes a new turn: the next
        // insert forgets series 2 (the oldest live turn), not it.
        let mut t = FragTable::<V4>::new(2);
        t.insert(k(1), entry(1), 0);
        t.insert(k(2), entry(100), 0);
        t.insert(k(1), entry(100), 5);
        assert_eq!(t.insert(k(3), entry(100), 6), Room::EvictedLive);
        assert!(t.get(&k(1), 6).is_some() && t.get(&k(2), 6).is_none());
    }

    /// Records come and go (expired ones removed by `get`, the oldest by a full table's
    /// insert): the removals leave tombstones, and the table must absorb them without growing,
    /// since `insert` runs per packet; nor may the order grow.
    #[test]
    fn a_full_table_under_churn_never_reallocates() {
        for cap in [28, 100, 1000] {
            let mut t = FragTable::<V4>::new(cap);
            let reserved = t.map.allocation_size();
            let order_room = t.order.capacity();
            let mut id = 0u32;
            for now in 0..200u32 {
                for _ in 0..cap {
                    id = id.wrapping_add(0x9e37_79b9);
                    let k = |id| FragKey { src: V4([1; 4]), dst: V4([2; 4]), id, proto: 17 };
                    t.insert(k(id), entry(now + 1), now);
                    let _ = t.get(&k(id ^ 1), now);
                }
                assert_eq!(t.map.allocation_size(), reserved, "capacity {cap}, second {now}: the table grew");
                assert!(t.order.len() <= cap && t.order.capacity() == order_room, "capacity {cap}: the order grew");
            }
        }
    }
}
