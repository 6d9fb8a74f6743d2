//! The slot indexes in front of `services4`, `endpoints4`, `snat4`, `services`, `endpoints`
//! and `snat_addrs`: open-addressing hash tables of our own over `ARRAY` maps of the steering
//! program (`services4_index`, `endpoints4_index`, `snat4_index`, `services6_index`,
//! `endpoints6_index`, `snat6_index`), so that a frame to a service, from a NAT backend or to
//! a SNAT address is found by a multiply-shift hash and one or two inlined array reads instead
//! of the kernel's hash map (`htab_map_hash`, jhash2, and a helper call: about 8 of an IPv4
//! service frame's 13 ns above the test runner's floor, `make bench-steer`,
//! docs/benchmarks.md).
//!
//! Layout, shared with `xdp/steer.c` (`index_probe`, `index4_probe`, `index6_probe`,
//! `snat_probe`): 2^bits slots of one `u64` each ([`SERVICES4_BITS`], [`ENDPOINTS4_BITS`],
//! [`SNAT4_BITS`], [`SERVICES6_BITS`], [`ENDPOINTS6_BITS`], [`SNAT6_BITS`]), in one of two
//! [`Form`]s. In `services4_index` and `endpoints4_index` a used slot holds the 8 bytes of the
//! hash map's key (`struct service4_key`) with its pad byte set to [`USED`], read as a
//! native-endian `u64` (the program reads the same bytes the same way); in `services6_index`
//! and `endpoints6_index`, which a 20-byte key would not fit, the key's fingerprint
//! ([`fingerprint6`]: the top 56 bits of its hash with [`USED`] in the top byte, the same
//! [`Form`]); in `snat4_index` the address and its port range (`struct snat4_slot`), compared
//! by address, and in `snat6_index` the same with the IPv6 address's 30-bit id ([`snat6_id`])
//! in place of the address. A fingerprint or an id stands for its key alone but for a collision: an
//! unlisted key whose fingerprint is a listed key's (one in 2^56 per key probed; one in 2^30
//! per SNAT address) has its frames taken to xlb, which passes frames that are none of its own
//! on to the kernel, as for a torn read below; listed keys of one fingerprint share its slot,
//! and listed SNAT addresses of one id share a slot whose range covers all of theirs
//! ([`snat6_entries`]), so that no SNAT reply is ever passed to the kernel. An empty slot is 0
//! ([`EMPTY`]); a slot whose key was removed while another key's probe may still pass it is
//! [`TOMBSTONE`] (all ones: its pad byte is never [`USED`], and 255.255.255.255 is never a SNAT
//! address). A key's home is the top `bits` bits of its identity (the whole value, or the SNAT
//! address) times `MUL` (Knuth's multiplicative hashing with the 64-bit golden ratio); the
//! program probes [`WINDOW`] slots from there: a match is listed, an empty slot is not, and a
//! window with neither asks the hash map itself.
//!
//! Invariant, kept by [`SlotIndex::apply`] (every key of the hash map is reachable): each key
//! is either in a slot of its window, or its window holds no empty slot. So a key is placed in
//! the first empty or tombstone slot of its window, else left to the hash map alone (overflow);
//! a removed key's slot is emptied only when no other key's probe passes it (a key placed
//! further along the window, or an overflow key whose window holds it), else it becomes a
//! tombstone. Each index has at least twice as many slots as its hash map's capacity
//! ([`crate::MAX_SERVICES`], [`crate::MAX_ENDPOINTS`], [`crate::MAX_SNAT_ADDRS`]), so it is
//! at most half full.
//!
//! Every slot is written whole with one map update and read with one 8-byte load. The kernel
//! copies an `ARRAY` value with `memcpy`, which need not be one store, so a probe racing a
//! write may in principle read a mix of the old and the new bytes: such a value is neither
//! empty nor, but by a coincidence of bytes, a key, so the probe goes past it as past a
//! tombstone; the coincidence would take one frame for another listed key's (to xlb, which
//! passes frames that are none of its own on to the kernel). The order of writes keeps every
//! intermediate state correct up to one transient: a key being added is not found until its
//! slot is written (its hash map entry is written first), and a removed one may still be found
//! until its slot is (its frames go to xlb, which passes them on).

use std::collections::HashMap;

/// log2 of the slots of `services4_index` (`max_entries` in xdp/steer.c).
pub(crate) const SERVICES4_BITS: u32 = 17;
/// log2 of the slots of `endpoints4_index`.
pub(crate) const ENDPOINTS4_BITS: u32 = 19;
/// log2 of the slots of `snat4_index`.
pub(crate) const SNAT4_BITS: u32 = 11;
/// log2 of the slots of `services6_index` (`SERVICES6_INDEX_BITS` in xdp/steer.c): 1 MiB.
pub(crate) const SERVICES6_BITS: u32 = 17;
/// log2 of the slots of `endpoints6_index`: 4 MiB.
pub(crate) const ENDPOINTS6_BITS: u32 = 19;
/// log2 of the slots of `snat6_index`.
pub(crate) const SNAT6_BITS: u32 = 11;
/// Slots the program probes from a key's home before it asks the hash map.
pub(crate) const WINDOW: usize = 8;
/// Multiplier of the home hash: 2^64 / φ (Knuth, TAOCP vol. 3 §6.4, multiplicative hashing).
pub(crate) const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// An empty slot.
pub(crate) const EMPTY: u64 = 0;
/// A removed key's slot that a probe must go past.
pub(crate) const TOMBSTONE: u64 = u64::MAX;
/// The pad byte of a key in a used slot (the hash map's key itself has 0 there).
pub(crate) const USED: u8 = 1;

const _: () = assert!(1 << SERVICES4_BITS >= 2 * crate::MAX_SERVICES, "services4_index at most half full");
const _: () = assert!(1 << ENDPOINTS4_BITS >= 2 * crate::MAX_ENDPOINTS, "endpoints4_index at most half full");
const _: () = assert!(1 << SNAT4_BITS >= 2 * crate::MAX_SNAT_ADDRS, "snat4_index at most half full");
const _: () = assert!(1 << SERVICES6_BITS >= 2 * crate::MAX_SERVICES, "services6_index at most half full");
const _: () = assert!(1 << ENDPOINTS6_BITS >= 2 * crate::MAX_ENDPOINTS, "endpoints6_index at most half full");
const _: () = assert!(1 << SNAT6_BITS >= 2 * crate::MAX_SNAT_ADDRS, "snat6_index at most half full");

/// What the slots of an index hold, and so what a probe compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// A hash map key of 8 bytes (`struct service4_key`) with its pad byte [`USED`]
    /// (`services4_index`, `endpoints4_index`), or an IPv6 key's [`fingerprint6`] (top byte
    /// [`USED`]; `services6_index`, `endpoints6_index`): the whole value is what a probe
    /// compares.
    Key8,
    /// An IPv4 SNAT address and its port range (`struct snat4_slot`: the address in network
    /// order, then the first and last port in host order; `snat4_index`), or an IPv6 SNAT
    /// address's [`snat6_id`] and range (`snat6_index`): a probe compares the address (id),
    /// and the address alone gives the home. Neither 0.0.0.0 (an empty slot) nor
    /// 255.255.255.255 (a tombstone) is ever a SNAT address (`Steering::sync_snat`), nor
    /// either an id.
    Snat4,
}

impl Form {
    /// What a probe compares of slot value `v`.
    pub(crate) fn identity(self, v: u64) -> u64 {
        match self {
            Self::Key8 => v,
            Self::Snat4 => {
                let [a, b, c, d, ..] = v.to_ne_bytes();
                u64::from(u32::from_ne_bytes([a, b, c, d]))
            }
        }
    }

    /// Whether `v` is a value this form's index writes for a key (not empty, not a tombstone,
    /// not something else).
    fn is_entry(self, v: u64) -> bool {
        if v == EMPTY || v == TOMBSTONE {
            return false;
        }
        let [a, b, c, d, p, q, r, t] = v.to_ne_bytes();
        match self {
            Self::Key8 => t == USED,
            Self::Snat4 => {
                let addr = [a, b, c, d];
                addr != [0; 4] && addr != [0xff; 4] && u16::from_ne_bytes([p, q]) <= u16::from_ne_bytes([r, t])
            }
        }
    }
}

/// The slot value of SNAT address `addr` (network order) with ports `first..=last`.
pub(crate) fn snat_entry(addr: [u8; 4], first: u16, last: u16) -> u64 {
    let [a, b, c, d] = addr;
    let [p, q] = first.to_ne_bytes();
    let [r, t] = last.to_ne_bytes();
    u64::from_ne_bytes([a, b, c, d, p, q, r, t])
}

/// The key of `services4` / `endpoints4` whose slot value is `entry` (pad byte 0 again).
pub(crate) fn key_of(entry: u64) -> [u8; 8] {
    let mut k = entry.to_ne_bytes();
    k[7] = 0;
    k
}

/// The slot value of hash map key `key` (its 8 bytes, pad last).
pub(crate) fn entry_of(key: [u8; 8]) -> u64 {
    let [a, b, c, d, p, q, proto, _] = key;
    u64::from_ne_bytes([a, b, c, d, p, q, proto, USED])
}

/// The slot value of a `services` / `endpoints` key (its 20 bytes: IPv6 address, port in
/// network order, protocol, pad) in `services6_index` / `endpoints6_index`: the top 56 bits of
/// its hash ([`crate::filter::hash_of`] of its [`crate::filter::key_id`], xdp/steer.c
/// `index6_probe`) with [`USED`] in the top byte, so never [`EMPTY`] nor [`TOMBSTONE`]. The top
/// bits, because a product's low bits depend only on its factors' low bits: the hash's low 56
/// bits do not see the address's last byte (read into the top byte of the second half), so
/// addresses that differ only there (pods of one node) would share a fingerprint.
pub(crate) fn fingerprint6(key: &[u8; crate::maps::ServiceMapKey::LEN]) -> u64 {
    let h = crate::filter::hash_of(&crate::filter::key_id(key));
    h >> 8 | u64::from(USED) << 56
}

/// The id of IPv6 SNAT address `addr` in `snat6_index`: the top 30 bits of its hash
/// ([`crate::filter::hash_of`] with no port, xdp/steer.c `port_in_snat6_range`) with the lowest
/// bit set, so never 0 (an empty slot) nor all ones (a tombstone).
pub(crate) fn snat6_id(addr: &[u8; 16]) -> u32 {
    // 30 bits: fits.
    (crate::filter::hash_of(&(*addr, 0)) >> 34) as u32 | 1
}

/// The slot values of `snat6_index` for the IPv6 SNAT addresses and port ranges of `ranges`
/// (`snat_addrs` as last written): one per id ([`snat6_id`]), with the range from the least
/// first port to the greatest last port of the addresses of that id (almost always one).
pub(crate) fn snat6_entries<'a>(ranges: impl IntoIterator<Item = (&'a [u8; 16], &'a [u16; 2])>) -> Vec<u64> {
    let mut by_id: HashMap<u32, (u16, u16)> = HashMap::new();
    for (addr, &[first, last]) in ranges {
        let r = by_id.entry(snat6_id(addr)).or_insert((first, last));
        *r = (r.0.min(first), r.1.max(last));
    }
    by_id.into_iter().map(|(id, (first, last))| snat_entry(id.to_ne_bytes(), first, last)).collect()
}

/// The home slot of `entry` in an index of 2^`bits` slots.
pub(crate) fn home_of(entry: u64, bits: u32) -> usize {
    // The top `bits` (at most 19) bits: fits any usize.
    (entry.wrapping_mul(MUL) >> (64 - bits)) as usize
}

/// The home slot in `services4_index` of an IPv4 service (IPv4-mapped addresses count as
/// IPv4): the slot from which the steering program probes for it. `None` for an IPv6 key or a
/// protocol the maps do not take. For diagnostics and tests (which services share a window).
#[must_use]
pub fn services4_index_home(key: &crate::ServiceKey) -> Option<u32> {
    home4(key, SERVICES4_BITS)
}

/// [`services4_index_home`] for a NAT backend's (address, protocol, port) in
/// `endpoints4_index`.
#[must_use]
pub fn endpoints4_index_home(key: &crate::ServiceKey) -> Option<u32> {
    home4(key, ENDPOINTS4_BITS)
}

/// [`services4_index_home`] for an IPv6 service in `services6_index`: `None` for an IPv4 (or
/// IPv4-mapped) key or a protocol the maps do not take.
#[must_use]
pub fn services6_index_home(key: &crate::ServiceKey) -> Option<u32> {
    home6(key, SERVICES6_BITS)
}

/// [`services6_index_home`] for a NAT backend's (address, protocol, port) in
/// `endpoints6_index`.
#[must_use]
pub fn endpoints6_index_home(key: &crate::ServiceKey) -> Option<u32> {
    home6(key, ENDPOINTS6_BITS)
}

fn home6(key: &crate::ServiceKey, bits: u32) -> Option<u32> {
    match crate::maps::FamilyKey::try_from(key).ok()? {
        crate::maps::FamilyKey::V4(_) => None,
        crate::maps::FamilyKey::V6(k) => u32::try_from(home_of(fingerprint6(&k), bits)).ok(),
    }
}

/// [`services4_index_home`] for an IPv6 SNAT address in `snat6_index` (IPv4-mapped addresses
/// are IPv4 ones: `snat4_index`).
#[must_use]
pub fn snat6_index_home(addr: std::net::Ipv6Addr) -> u32 {
    let h = home_of(Form::Snat4.identity(snat_entry(snat6_id(&addr.octets()).to_ne_bytes(), 0, 0)), SNAT6_BITS);
    // Below 2^SNAT6_BITS.
    u32::try_from(h).unwrap_or(u32::MAX)
}

/// [`services4_index_home`] for a SNAT address in `snat4_index`.
#[must_use]
pub fn snat4_index_home(addr: std::net::Ipv4Addr) -> u32 {
    let h = home_of(Form::Snat4.identity(snat_entry(addr.octets(), 0, 0)), SNAT4_BITS);
    // Below 2^SNAT4_BITS.
    u32::try_from(h).unwrap_or(u32::MAX)
}

fn home4(key: &crate::ServiceKey, bits: u32) -> Option<u32> {
    match crate::maps::FamilyKey::try_from(key).ok()? {
        crate::maps::FamilyKey::V4(k) => u32::try_from(home_of(entry_of(k), bits)).ok(),
        crate::maps::FamilyKey::V6(_) => None,
    }
}

/// The index as written to the kernel's array: the slots (what the array holds, changed only
/// by writes that succeeded), the slot of each key, and the keys left to the hash map alone.
pub(crate) struct SlotIndex {
    bits: u32,
    form: Form,
    slots: Vec<u64>,
    at: HashMap<u64, usize, foldhash::fast::RandomState>,
    overflow: Vec<u64>,
    /// What some slot that holds no key must hold may have changed (a key left the index or
    /// found a slot after waiting in the hash map, or a read-back differed): the next
    /// [`SlotIndex::apply`] goes over every slot.
    sweep: bool,
    /// A read-back differed: the next sweep also looks at empty slots, since one read back
    /// empty may lie on a key's probe (only this index writes empty slots, and never there).
    repair: bool,
}

impl std::fmt::Debug for SlotIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotIndex")
            .field("slots", &self.slots.len())
            .field("in_slots", &self.at.len())
            .field("overflow", &self.overflow.len())
            .finish()
    }
}

impl SlotIndex {
    /// The index of 2^`bits` slots of a freshly loaded program (an `ARRAY` map starts zeroed):
    /// every slot empty.
    pub(crate) fn new(bits: u32, form: Form) -> Self {
        Self {
            bits,
            form,
            slots: vec![EMPTY; 1 << bits],
            at: HashMap::default(),
            overflow: Vec::new(),
            sweep: false,
            repair: false,
        }
    }

    /// Slot `s + i`, around the end.
    fn next(&self, s: usize, i: usize) -> usize {
        (s + i) & (self.slots.len() - 1)
    }

    /// Distance from slot `from` forward to slot `to`, around the end.
    fn dist(&self, from: usize, to: usize) -> usize {
        to.wrapping_sub(from) & (self.slots.len() - 1)
    }

    fn home(&self, e: u64) -> usize {
        home_of(self.form.identity(e), self.bits)
    }

    /// Number of slots.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Keys left to the hash map alone (their windows are full).
    #[cfg(test)]
    pub(crate) fn overflow(&self) -> usize {
        self.overflow.len()
    }

    /// The slot values of the keys left to the hash map alone.
    pub(crate) fn overflow_entries(&self) -> impl Iterator<Item = u64> + '_ {
        self.overflow.iter().copied()
    }

    /// The slots as written.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> &[u64] {
        &self.slots
    }

    /// Brings the index to the slot values `want` (one per key of its hash map: [`entry_of`]
    /// a key, or [`snat_entry`] an address and range) with `write(slot, value)`, which writes
    /// one slot of the kernel's array: removed keys' slots first (a key whose identity a new
    /// value shares, a SNAT address with a new range, gets the new value in place), then new
    /// keys and the keys left to the hash map whose windows now have room, then, only when
    /// something that decides them changed, the slots that hold no key (tombstones no probe
    /// passes any longer, values found by [`SlotIndex::reload`] that are no key of the index).
    /// Writes only what changes. A failed write stops it with that error; what was written
    /// stays known, so the next call goes on from there.
    ///
    /// # Errors
    /// The first error of `write`.
    pub(crate) fn apply<E>(
        &mut self,
        want: impl IntoIterator<Item = u64>,
        mut write: impl FnMut(u32, u64) -> Result<(), E>,
    ) -> Result<(), E> {
        let want: HashMap<u64, (), foldhash::fast::RandomState> = want.into_iter().map(|e| (e, ())).collect();
        let waiting = self.overflow.len();
        self.overflow.retain(|e| want.contains_key(e));
        let gone: Vec<(u64, usize)> =
            self.at.iter().filter(|(e, _)| !want.contains_key(*e)).map(|(e, s)| (*e, *s)).collect();
        self.sweep |= !gone.is_empty() || self.overflow.len() != waiting;
        // A wanted value that a probe compares like a value going away (a SNAT address whose
        // port range changed) takes that value's slot in one write, so that no probe misses
        // the address in between.
        let form = self.form;
        let mut successor: HashMap<u64, u64, foldhash::fast::RandomState> = want
            .keys()
            .filter(|e| form != Form::Key8 && !self.at.contains_key(*e))
            .map(|e| (form.identity(*e), *e))
            .collect();
        for (e, s) in gone {
            if let Some(n) = successor.remove(&form.identity(e)) {
                self.set(s, n, &mut write)?;
                self.at.remove(&e);
                self.at.insert(n, s);
                self.overflow.retain(|x| *x != n);
                continue;
            }
            // Out of the index before its slot's fate is decided: its own probe no longer
            // matters.
            self.at.remove(&e);
            let v = if self.needed(s) { TOMBSTONE } else { EMPTY };
            self.set(s, v, &mut write).inspect_err(|_| {
                self.at.insert(e, s);
            })?;
        }
        let mut new: Vec<u64> = want.keys().filter(|e| !self.at.contains_key(*e)).copied().collect();
        new.sort_unstable();
        for e in new {
            let home = self.home(e);
            let free = (0..WINDOW).map(|i| self.next(home, i)).find(|&s| self.is_free(s));
            match free {
                Some(s) => {
                    self.set(s, e, &mut write)?;
                    self.at.insert(e, s);
                    if let Some(i) = self.overflow.iter().position(|x| *x == e) {
                        self.overflow.swap_remove(i);
                        self.sweep = true;
                    }
                }
                None if !self.overflow.contains(&e) => self.overflow.push(e),
                None => {}
            }
        }
        if !self.sweep {
            return Ok(());
        }
        for s in 0..self.slots.len() {
            let v = self.slots.get(s).copied().unwrap_or(EMPTY);
            if (v == EMPTY && !self.repair) || self.at.get(&v) == Some(&s) {
                continue;
            }
            let target = if self.needed(s) { TOMBSTONE } else { EMPTY };
            self.set(s, target, &mut write)?;
        }
        self.sweep = false;
        self.repair = false;
        Ok(())
    }

    /// Whether slot `s` may take a key: empty, or holding no key of the index (a tombstone).
    fn is_free(&self, s: usize) -> bool {
        let v = self.slots.get(s).copied().unwrap_or(EMPTY);
        v == EMPTY || self.at.get(&v) != Some(&s)
    }

    /// Whether some key's probe passes slot `s` on its way to the key: a key in one of the
    /// [`WINDOW`] − 1 slots after `s` whose window holds `s`, or a key left to the hash map
    /// whose window holds `s`. Such a slot must not be empty.
    fn needed(&self, s: usize) -> bool {
        let further = (1..WINDOW).any(|i| {
            let p = self.next(s, i);
            let v = self.slots.get(p).copied().unwrap_or(EMPTY);
            let h = self.home(v);
            self.at.get(&v) == Some(&p) && self.dist(h, s) < self.dist(h, p)
        });
        further || self.overflow.iter().any(|e| self.dist(self.home(*e), s) < WINDOW)
    }

    /// Writes `v` into slot `s` (only if it differs) and notes it once written.
    fn set<E>(&mut self, s: usize, v: u64, write: &mut impl FnMut(u32, u64) -> Result<(), E>) -> Result<(), E> {
        let Some(slot) = self.slots.get_mut(s) else { return Ok(()) };
        if *slot == v {
            return Ok(());
        }
        #[expect(clippy::cast_possible_truncation, reason = "s < 2^19 slots")]
        write(s as u32, v)?;
        *slot = v;
        Ok(())
    }

    /// Compares `n` slots from slot `start` (around the end) with `read` (a slot's value as
    /// read back from the kernel's array, `None` if it could not be read), takes what was read
    /// as what each of them holds, and returns how many differed. A slot read holding a key of
    /// the index's form at a slot of its window, not yet in the index, is taken as that key's
    /// place; anything else that differs is overwritten by the next [`SlotIndex::apply`] (as a
    /// tombstone or an empty slot, as probes need), which also places again a key whose slot
    /// was found holding something else. A slot that could not be read is taken to hold
    /// something else.
    pub(crate) fn reload(&mut self, start: usize, n: usize, read: impl Fn(u32) -> Option<u64>) -> usize {
        let mut differed = 0;
        for i in 0..n.min(self.slots.len()) {
            let s = self.next(start, i);
            #[expect(clippy::cast_possible_truncation, reason = "s < 2^19 slots")]
            let v = read(s as u32).unwrap_or(TOMBSTONE - 1);
            let Some(old) = self.slots.get(s).copied() else { continue };
            if old == v {
                continue;
            }
            differed += 1;
            self.sweep = true;
            self.repair = true;
            if self.at.get(&old) == Some(&s) {
                self.at.remove(&old);
            }
            if let Some(x) = self.slots.get_mut(s) {
                *x = v;
            }
            if self.form.is_entry(v) && self.dist(self.home(v), s) < WINDOW && !self.at.contains_key(&v) {
                self.at.insert(v, s);
                self.overflow.retain(|x| *x != v);
            }
        }
        differed
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;

    const BITS: u32 = SERVICES4_BITS;

    /// Model of the program's probe (xdp/steer.c `index4_probe`): `Some(found)` from the
    /// window, `None` when the window is full of other keys (then the hash map answers).
    fn probe(slots: &[u64], key: [u8; 8]) -> Option<bool> {
        let e = entry_of(key);
        let home = home_of(e, slots.len().trailing_zeros());
        for i in 0..WINDOW {
            let v = slots[(home + i) & (slots.len() - 1)];
            if v == e {
                return Some(true);
            }
            if v == EMPTY {
                return Some(false);
            }
        }
        None
    }

    /// What the program answers for `key` with `services4` holding `set`.
    fn steered(ix: &SlotIndex, set: &[[u8; 8]], key: [u8; 8]) -> bool {
        probe(ix.slots(), key).unwrap_or_else(|| set.contains(&key))
    }

    fn key(i: u32) -> [u8; 8] {
        let [a, b, c, d] = (0x0a00_0000 + i).to_be_bytes();
        [a, b, c, d, 0, 80, 6, 0]
    }

    /// Keys that all share one home slot (found by search), so windows fill up.
    fn same_home(n: usize) -> Vec<[u8; 8]> {
        let h = home_of(entry_of(key(0)), BITS);
        (0..u32::MAX).map(key).filter(|k| home_of(entry_of(*k), BITS) == h).take(n).collect()
    }

    fn apply(ix: &mut SlotIndex, set: &[[u8; 8]]) -> usize {
        let mut writes = 0;
        ix.apply(set.iter().map(|k| entry_of(*k)), |_, _| {
            writes += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
        writes
    }

    #[test]
    fn every_key_is_found_and_no_other_through_adds_and_removes() {
        for bits in [SERVICES4_BITS, ENDPOINTS4_BITS] {
            let mut ix = SlotIndex::new(bits, Form::Key8);
            assert_eq!(ix.len(), 1 << bits);
            let mut set: Vec<[u8; 8]> = (0..2000).map(key).collect();
            apply(&mut ix, &set);
            assert!((0..4000).all(|i| steered(&ix, &set, key(i)) == (i < 2000)));
            set.retain(|k| k[3] % 3 != 0);
            set.extend((5000..5500).map(key));
            apply(&mut ix, &set);
            for i in 0..6000 {
                assert_eq!(steered(&ix, &set, key(i)), set.contains(&key(i)), "key {i}, {bits} bits");
            }
        }
    }

    #[test]
    fn a_full_window_leaves_keys_to_the_hash_map_and_they_stay_reachable_when_others_go() {
        let keys = same_home(12);
        let mut ix = SlotIndex::new(BITS, Form::Key8);
        apply(&mut ix, &keys);
        assert_eq!(ix.overflow(), 4, "8 slots in the window, 12 keys of one home");
        assert!(keys.iter().all(|k| steered(&ix, &keys, *k)));
        assert!(probe(ix.slots(), keys[11]).is_none(), "an overflow key is answered by services4");
        // Remove the first key placed: its slot must not become empty while overflow keys wait
        // behind it; here an overflow key takes it over.
        let rest: Vec<[u8; 8]> = keys[1..].to_vec();
        apply(&mut ix, &rest);
        assert_eq!(ix.overflow(), 3);
        assert!(rest.iter().all(|k| steered(&ix, &rest, *k)));
        assert!(!steered(&ix, &rest, keys[0]));
        // Remove keys in the middle of the window one by one: every other key stays found.
        let mut now = rest;
        while now.len() > 1 {
            now.remove(now.len() / 2);
            apply(&mut ix, &now);
            for k in &keys {
                assert_eq!(steered(&ix, &now, *k), now.contains(k));
            }
        }
    }

    #[test]
    fn a_removed_key_leaves_a_tombstone_only_while_a_probe_needs_it_and_none_once_all_are_gone() {
        let keys = same_home(3);
        let mut ix = SlotIndex::new(BITS, Form::Key8);
        apply(&mut ix, &keys);
        // The first of three: the two behind it probe past its slot.
        apply(&mut ix, &keys[1..]);
        assert_eq!(ix.slots().iter().filter(|v| **v == TOMBSTONE).count(), 1);
        assert!(keys[1..].iter().all(|k| steered(&ix, &keys[1..], *k)));
        apply(&mut ix, &[]);
        assert!(ix.slots().iter().all(|v| *v == EMPTY), "an empty set leaves an empty table");
    }

    /// A small index (64 slots) under random adds and removes, failed writes and slots
    /// changed behind its back: after every update that succeeds, the program's answer (the
    /// probe, or the hash map for a full window) is right for every key of the universe.
    #[test]
    fn random_updates_failed_writes_and_outside_changes_never_lose_or_invent_a_key() {
        let mut next = xorshift(0x9e37_79b9);
        let universe: Vec<[u8; 8]> = (0..120).map(key).collect();
        for round in 0..40 {
            let mut ix = SlotIndex::new(6, Form::Key8);
            let mut set: Vec<[u8; 8]> = Vec::new();
            for step in 0..200 {
                // Change the wanted set: up to 6 keys in or out.
                for _ in 0..(next() % 7) {
                    let k = universe[(next() % 120) as usize];
                    if let Some(i) = set.iter().position(|x| *x == k) {
                        set.swap_remove(i);
                    } else if set.len() < 56 {
                        set.push(k);
                    }
                }
                // Now and then something else writes into the array; the index reads it back.
                if next().is_multiple_of(10) {
                    let mut kernel = ix.slots().to_vec();
                    for _ in 0..3 {
                        let s = (next() % 64) as usize;
                        kernel[s] = match next() % 4 {
                            0 => EMPTY,
                            1 => TOMBSTONE,
                            2 => entry_of(universe[(next() % 120) as usize]),
                            _ => next(),
                        };
                    }
                    let start = (next() % 64) as usize;
                    ix.reload(start, 64, |i| Some(kernel[i as usize]));
                }
                // Writes fail now and then; a failed update is retried, as the next sync does.
                let want: Vec<u64> = set.iter().map(|k| entry_of(*k)).collect();
                apply_flaky(&mut ix, &want, &mut next);
                for k in &universe {
                    assert_eq!(steered(&ix, &set, *k), set.contains(k), "round {round} step {step} key {k:?}");
                }
            }
        }
    }

    /// The program's SNAT probe (xdp/steer.c `snat4_probe`): the slot value of the first slot
    /// with `addr`, `None` at a full window (then `snat4` answers).
    fn snat_probe(slots: &[u64], addr: [u8; 4]) -> Option<Option<u64>> {
        let id = Form::Snat4.identity(snat_entry(addr, 0, 0));
        let home = home_of(id, slots.len().trailing_zeros());
        for i in 0..WINDOW {
            let v = slots[(home + i) & (slots.len() - 1)];
            if v == EMPTY {
                return Some(None);
            }
            if Form::Snat4.identity(v) == id {
                return Some(Some(v));
            }
        }
        None
    }

    /// SNAT addresses: found by address with the range of the last update; a range changed in
    /// one write (never absent in between), addresses of one home past the window left to the
    /// hash map, and values read back that are no SNAT entry rewritten.
    #[test]
    fn snat_addresses_are_found_with_their_current_range_and_a_range_changes_in_place() {
        let addr = |i: u32| (0x0a02_0000 + i).to_be_bytes();
        let mut ix = SlotIndex::new(SNAT4_BITS, Form::Snat4);
        let mut want: Vec<u64> = (0..500).map(|i| snat_entry(addr(i), 33_000, 36_863)).collect();
        apply_entries(&mut ix, &want);
        for i in 0..1000 {
            let found = snat_probe(ix.slots(), addr(i)).map(|v| v.is_some());
            assert_eq!(found.unwrap_or(i < 500), i < 500, "address {i}");
        }
        // Address 7's range changes: one write, into its own slot.
        let slot = ix.slots().iter().position(|v| *v == want[7]).unwrap();
        want[7] = snat_entry(addr(7), 40_000, 40_999);
        let mut writes = Vec::new();
        ix.apply(want.iter().copied(), |s, v| {
            writes.push((s, v));
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(writes, vec![(u32::try_from(slot).unwrap(), want[7])]);
        assert_eq!(snat_probe(ix.slots(), addr(7)), Some(Some(want[7])));
        // Twelve addresses of one home: four left to the hash map, all reachable.
        let h = home_of(Form::Snat4.identity(snat_entry(addr(1000), 0, 0)), SNAT4_BITS);
        let same: Vec<u64> = (1000..u32::MAX)
            .map(|i| snat_entry(addr(i), 1, 2))
            .filter(|e| home_of(Form::Snat4.identity(*e), SNAT4_BITS) == h)
            .take(12)
            .collect();
        let mut ix = SlotIndex::new(SNAT4_BITS, Form::Snat4);
        apply_entries(&mut ix, &same);
        assert_eq!(ix.overflow_entries().count(), 4);
        for e in &same {
            let a = e.to_ne_bytes();
            match snat_probe(ix.slots(), [a[0], a[1], a[2], a[3]]) {
                Some(v) => assert_eq!(v, Some(*e)),
                None => assert!(ix.overflow_entries().any(|x| x == *e)),
            }
        }
        // Something else in a slot: read back, then rewritten.
        let mut kernel = ix.slots().to_vec();
        let free = kernel.iter().position(|v| *v == EMPTY).unwrap();
        kernel[free] = snat_entry([0; 4], 1, 2);
        assert_eq!(ix.reload(0, kernel.len(), |i| Some(kernel[i as usize])), 1);
        apply_entries(&mut ix, &same);
        assert_eq!(ix.slots()[free], EMPTY);
    }

    /// [`random_updates_failed_writes_and_outside_changes_never_lose_or_invent_a_key`] for
    /// SNAT addresses, whose ranges also change: after every update that succeeds, each
    /// address of the universe is found with its current range, or not at all.
    #[test]
    fn random_snat_updates_and_range_changes_always_answer_the_current_range() {
        let mut next = xorshift(0x2545_f491);
        let addr = |i: u64| (0x0a02_0000_u32 + u32::try_from(i).unwrap()).to_be_bytes();
        for round in 0..40 {
            let mut ix = SlotIndex::new(6, Form::Snat4);
            // Address number -> (first, last) port.
            let mut set: Vec<(u64, u16, u16)> = Vec::new();
            for step in 0..200 {
                for _ in 0..(next() % 7) {
                    let a = next() % 120;
                    let first = u16::try_from(next() % 60_000).unwrap();
                    let range = (first, first + u16::try_from(next() % 1000).unwrap());
                    match set.iter().position(|x| x.0 == a) {
                        Some(i) if next().is_multiple_of(2) => {
                            set.swap_remove(i);
                        }
                        Some(i) => set[i] = (a, range.0, range.1),
                        None if set.len() < 56 => set.push((a, range.0, range.1)),
                        None => {}
                    }
                }
                if next().is_multiple_of(10) {
                    let mut kernel = ix.slots().to_vec();
                    let s = (next() % 64) as usize;
                    kernel[s] = match next() % 3 {
                        0 => EMPTY,
                        1 => TOMBSTONE,
                        _ => snat_entry(addr(next() % 120), 1, 2),
                    };
                    ix.reload(0, 64, |i| Some(kernel[i as usize]));
                }
                let want: Vec<u64> = set.iter().map(|&(a, f, l)| snat_entry(addr(a), f, l)).collect();
                apply_flaky(&mut ix, &want, &mut next);
                for a in 0..120 {
                    let current = set.iter().find(|x| x.0 == a).map(|&(_, f, l)| snat_entry(addr(a), f, l));
                    let answer = snat_probe(ix.slots(), addr(a)).unwrap_or(current);
                    assert_eq!(answer, current, "round {round} step {step} address {a}");
                }
            }
        }
    }

    /// A xorshift64 generator (Marsaglia 2003) from `seed`: the randomized tests' draws.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Applies `want` as a sync does, writes failing now and then (one update in 20, after a
    /// random number of writes): a failed update is retried, at most four times failing.
    fn apply_flaky(ix: &mut SlotIndex, want: &[u64], next: &mut impl FnMut() -> u64) {
        let mut tries = 0;
        loop {
            tries += 1;
            let fail = next().is_multiple_of(20) && tries < 5;
            let (mut n, at) = (0, next() % 8);
            let r = ix.apply(want.iter().copied(), |_, _| {
                n += 1;
                if fail && n > at { Err(()) } else { Ok(()) }
            });
            if r.is_ok() {
                return;
            }
        }
    }

    fn apply_entries(ix: &mut SlotIndex, want: &[u64]) {
        ix.apply(want.iter().copied(), |_, _| Ok::<(), ()>(())).unwrap();
    }

    #[test]
    fn an_unchanged_set_writes_nothing() {
        let set: Vec<[u8; 8]> = (0..500).map(key).collect();
        let mut ix = SlotIndex::new(BITS, Form::Key8);
        assert_eq!(apply(&mut ix, &set), 500);
        assert_eq!(apply(&mut ix, &set), 0);
    }

    #[test]
    fn a_failed_write_is_taken_up_by_the_next_apply() {
        let set: Vec<[u8; 8]> = (0..100).map(key).collect();
        let mut ix = SlotIndex::new(BITS, Form::Key8);
        let mut n = 0;
        assert!(
            ix.apply(set.iter().map(|k| entry_of(*k)), |_, _| {
                n += 1;
                if n == 50 { Err(()) } else { Ok(()) }
            })
            .is_err()
        );
        apply(&mut ix, &set);
        assert!(set.iter().all(|k| steered(&ix, &set, *k)));
    }

    #[test]
    fn reload_repairs_slots_changed_behind_the_index() {
        let set: Vec<[u8; 8]> = (0..300).map(key).collect();
        let mut ix = SlotIndex::new(BITS, Form::Key8);
        apply(&mut ix, &set);
        let mut kernel = ix.slots().to_vec();
        // One key's slot cleared, one garbage value elsewhere.
        let s = kernel.iter().position(|v| *v == entry_of(key(7))).unwrap();
        kernel[s] = EMPTY;
        let g = kernel.iter().position(|v| *v == EMPTY).unwrap();
        kernel[g] = 0x1234;
        // Read back in two halves, the second starting near the end and wrapping around.
        let n = kernel.len();
        let first = ix.reload(0, n / 2, |i| Some(kernel[i as usize]));
        assert_eq!(first + ix.reload(n / 2, n - n / 2, |i| Some(kernel[i as usize])), 2);
        apply(&mut ix, &set);
        assert!(set.iter().all(|k| steered(&ix, &set, *k)));
        assert!(!ix.slots().contains(&0x1234));
    }

    /// The `services` / `endpoints` key of `[addr]:port` over UDP.
    fn key6(addr: &str, port: u16) -> [u8; crate::maps::ServiceMapKey::LEN] {
        let addr = addr.parse::<std::net::Ipv6Addr>().unwrap().octets();
        crate::maps::ServiceMapKey { addr, port_be: port.to_be_bytes(), proto: 17, pad: 0 }.to_bytes()
    }

    #[test]
    fn ipv6_fingerprints_are_index_entries_and_tell_apart_addresses_of_one_prefix_and_ports() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..4096u32 {
            // Pods of one node differ in the address's last bytes; a service's ports differ.
            let (addr, port) = (format!("fd00:251:b::{:x}:{:x}", i >> 8, i & 0xff), 5353);
            for k in [key6(&addr, port), key6("fd00:251:a::9", u16::try_from(i).unwrap())] {
                let fp = fingerprint6(&k);
                assert!(Form::Key8.is_entry(fp), "{fp:#x} is an entry of the Key8 form");
                seen.insert(fp);
            }
        }
        assert_eq!(seen.len(), 2 * 4096, "one fingerprint per key");
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn an_ipv6_fingerprint_is_the_top_56_bits_of_the_key_hash_with_the_used_byte() {
        // The formula of xdp/steer.c's index6_probe(), written out for one key.
        let k = key6("fd00::10", 80);
        let (lo, hi) =
            (u64::from_le_bytes(k[..8].try_into().unwrap()), u64::from_le_bytes(k[8..16].try_into().unwrap()));
        let x = u64::from(u16::from_le_bytes([0, 80])) | 17 << 16;
        let h = ((lo.wrapping_mul(MUL) ^ hi).wrapping_mul(MUL) ^ x).wrapping_mul(MUL);
        assert_eq!(fingerprint6(&k), h >> 8 | 1 << 56);
    }

    #[test]
    fn ipv6_snat_ids_are_never_the_markers_and_addresses_of_one_id_share_a_slot_covering_their_ranges() {
        // 30-bit ids: among 2^18 random addresses some 32 pairs share one (birthday bound;
        // consecutive addresses do not, the multiplicative hash spreads them).
        let mut next = xorshift(0x5eed_6a7e);
        let mut addr = || {
            let mut a = [0u8; 16];
            a[..8].copy_from_slice(&next().to_ne_bytes());
            a[8..].copy_from_slice(&next().to_ne_bytes());
            a
        };
        let mut seen = HashMap::new();
        let mut pair = None;
        for _ in 0..1 << 18 {
            let a = addr();
            let id = snat6_id(&a);
            assert!(id & 1 == 1 && id != u32::MAX && Form::Snat4.is_entry(snat_entry(id.to_ne_bytes(), 1, 2)));
            if let Some(b) = seen.insert(id, a) {
                pair = Some((b, a));
                break;
            }
        }
        let (a, b) = pair.expect("two addresses of one id");
        let id = snat6_id(&a);
        // One slot for both, its range covering both ranges: neither's SNAT replies pass to the
        // kernel (a port in one range but not the other goes to xlb, which passes it on).
        let e = snat6_entries([(&a, &[40_000, 40_999]), (&b, &[33_000, 33_999])]);
        assert_eq!(e, vec![snat_entry(id.to_ne_bytes(), 33_000, 40_999)]);
        // Distinct ids keep their own ranges.
        let c = addr();
        assert_ne!(snat6_id(&c), id);
        let mut e = snat6_entries([(&a, &[40_000, 40_999]), (&c, &[33_000, 33_999])]);
        e.sort_unstable();
        let mut want =
            vec![snat_entry(id.to_ne_bytes(), 40_000, 40_999), snat_entry(snat6_id(&c).to_ne_bytes(), 33_000, 33_999)];
        want.sort_unstable();
        assert_eq!(e, want);
    }
}
