//! The filter in front of the steering program's `l2_addrs` hash map: a bit array over an
//! `ARRAY` map (`l2_filter`) that says of a frame's destination whether it may be an address
//! this node announces in L2 mode, so that the program asks `l2_addrs` (jhash2 over a 16-byte
//! key and a helper call) only for the addresses whose bit is set. The IPv6 maps `services`,
//! `snat_addrs` and `endpoints` had filters of this kind too (every IPv6 frame of the node's
//! own traffic asked the three of them: 37 ns of the program against 12 for IPv4 at
//! `775ff88`, `make bench-steer`, docs/benchmarks.md) until slot indexes (`index.rs`) replaced
//! them; the hash of an [`Id`] ([`hash_of`]) is what those indexes take their fingerprints
//! and ids from.
//!
//! Layout, shared with `xdp/steer.c` (`key6_hash`, `filter6_has`): 2^bits bits ([`L2_BITS`])
//! in `u64` words, bit `b` being bit `b % 64` of word `b / 64`. What is hashed is a 16-byte
//! address (IPv6, or IPv4 v4-mapped) and, for the keys of `services` and `endpoints`, the
//! port and protocol of the hash map's key ([`Id`]): the bit is the top `bits` bits of
//! `((((lo * MUL) ^ hi) * MUL) ^ x) * MUL`, where `lo` and `hi` are the address's first and
//! last 8 bytes read as native-endian `u64`s (as the program reads them), `x` the key's port
//! bytes (network order, as in the frame) and protocol read the same way (0 for an address
//! alone), and `MUL` is 2^64/φ (Knuth's multiplicative hashing, as in `index.rs`). One bit per
//! key, a Bloom filter with one hash: never a false negative while the words are what xlb
//! wrote, a false positive (the hash map then answers) for about one key in 2^bits / n with n
//! keys. The L2 responder (`l2.rs`) writes `l2_filter` after `l2_addrs` (an address being
//! added is not acted on until its bit is set; a removed one is looked up until its bit is
//! cleared, and the hash map then says no), reading it back whole at every sync
//! ([`KeyFilter::reload`]); only the words that differ are written.

/// log2 of the bits of `l2_filter` (`L2_FILTER_BITS`): 262,144 bits, 32 KiB, one bit per
/// address of `l2_addrs` (16-byte form, IPv4 v4-mapped; one address in 16 a false positive at
/// [`crate::MAX_L2_ADDRS`] addresses).
pub(crate) const L2_BITS: u32 = 18;
/// log2 of the bits of `endpoint_addr_filter` (`ENDPOINT_ADDR_FILTER_BITS`): 262,144 bits,
/// 32 KiB, one bit per address of a NAT backend (the addresses of `endpoints4` and `endpoints`,
/// 16-byte form): the program asks it of a fragment's source, since a later fragment of a
/// backend's reply carries no port to look up `endpoints4` / `endpoints` by. A false positive
/// (about one address in 26 at 10,000 backend addresses) sends a fragment to xlb, which hands
/// back to the kernel what is none of its own.
pub(crate) const ENDPOINT_ADDR_BITS: u32 = 18;
/// Multiplier of the bit hash: 2^64 / φ (Knuth, TAOCP vol. 3 §6.4, multiplicative hashing).
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// What a filter or an IPv6 slot index hashes: a 16-byte address, and the port (2 bytes,
/// network order) and protocol of a `services` / `endpoints` key as a native-endian `u64` of
/// the bytes `[port, port, proto, 0, 0, 0, 0, 0]` ([`port_proto`]; 0 for an address alone).
pub(crate) type Id = ([u8; 16], u64);

/// The `x` of an [`Id`] for port bytes `port` (network order) and protocol `proto`.
pub(crate) fn port_proto(port: [u8; 2], proto: u8) -> u64 {
    let [p, q] = port;
    u64::from_ne_bytes([p, q, proto, 0, 0, 0, 0, 0])
}

/// The 64-bit hash of `id`: `((((lo * MUL) ^ hi) * MUL) ^ x) * MUL` (xdp/steer.c `key6_hash`).
pub(crate) fn hash_of(id: &Id) -> u64 {
    let (addr, x) = id;
    let (lo, hi) = addr.split_at(8);
    let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
    (((word(lo).wrapping_mul(MUL) ^ word(hi)).wrapping_mul(MUL)) ^ x).wrapping_mul(MUL)
}

/// The bit of `id` in a filter of 2^`bits` bits: the top `bits` of [`hash_of`].
pub(crate) fn bit_of(id: &Id, bits: u32) -> usize {
    // The top `bits` (at most 20) bits: fits any usize.
    (hash_of(id) >> (64 - bits)) as usize
}

/// Which bit of `l2_filter` an address has (IPv4 in its v4-mapped form): for diagnostics and
/// tests.
#[must_use]
pub fn l2_filter_bit(addr: std::net::IpAddr) -> u32 {
    // Below 2^L2_BITS.
    u32::try_from(bit_of(&(crate::maps::addr_bytes(addr), 0), L2_BITS)).unwrap_or(u32::MAX)
}

/// The [`Id`] of a `services` / `endpoints` key (its 20 bytes: address, port, protocol, pad).
pub(crate) fn key_id(k: &[u8; crate::maps::ServiceMapKey::LEN]) -> Id {
    let (addr, rest) = k.split_at(16);
    let addr: [u8; 16] = addr.try_into().unwrap_or([0; 16]);
    let (p, q, proto) = (rest.first(), rest.get(1), rest.get(2));
    (addr, port_proto([p.copied().unwrap_or(0), q.copied().unwrap_or(0)], proto.copied().unwrap_or(0)))
}

/// A filter as written to the kernel's array: its words (what the array holds, changed only by
/// writes that succeeded, or by a read-back).
pub(crate) struct KeyFilter {
    bits: u32,
    words: Vec<u64>,
    /// Words a read-back could not read: the next [`KeyFilter::apply`] writes them whatever
    /// they are taken to hold.
    unread: Vec<bool>,
}

impl std::fmt::Debug for KeyFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set: u32 = self.words.iter().map(|w| w.count_ones()).sum();
        f.debug_struct("KeyFilter").field("bits", &(1u64 << self.bits)).field("set", &set).finish()
    }
}

impl KeyFilter {
    /// The filter of 2^`bits` bits (`bits` 6 to 30) of a freshly loaded program (an `ARRAY`
    /// map starts zeroed): no bit set.
    pub(crate) fn new(bits: u32) -> Self {
        Self { bits, words: vec![0; 1 << (bits - 6)], unread: vec![false; 1 << (bits - 6)] }
    }

    /// Words of the filter (the `ARRAY` map's `max_entries`).
    pub(crate) fn len(&self) -> usize {
        self.words.len()
    }

    /// Brings the filter to the bits of `ids` (duplicates are fine): writes each word that
    /// differs with `write(word index, value)`; returns how many it wrote.
    ///
    /// # Errors
    /// The first error of `write`; the words written before it are kept, the rest are written
    /// by the next call.
    pub(crate) fn apply<E>(
        &mut self,
        ids: impl IntoIterator<Item = Id>,
        mut write: impl FnMut(u32, u64) -> Result<(), E>,
    ) -> Result<usize, E> {
        let mut want = vec![0u64; self.words.len()];
        for id in ids {
            let b = bit_of(&id, self.bits);
            if let Some(w) = want.get_mut(b / 64) {
                *w |= 1 << (b % 64);
            }
        }
        let mut written = 0;
        for (i, ((have, unread), want)) in self.words.iter_mut().zip(self.unread.iter_mut()).zip(want).enumerate() {
            if *have != want || *unread {
                // Below 2^24 words.
                write(i as u32, want)?;
                (*have, *unread) = (want, false);
                written += 1;
            }
        }
        Ok(written)
    }

    /// Reads back `n` words from word `start` on (wrapping) with `read(word index)` and takes
    /// what the kernel holds as what the filter holds, so the next [`KeyFilter::apply`]
    /// rewrites every word that differed from what xlb wrote, and every word that could not be
    /// read (`None`). Returns how many differed or could not be read.
    pub(crate) fn reload(&mut self, start: usize, n: usize, mut read: impl FnMut(u32) -> Option<u64>) -> usize {
        let len = self.words.len();
        let mut differed = 0;
        for k in 0..n.min(len) {
            let i = (start + k) % len;
            let (Some(w), Some(unread)) = (self.words.get_mut(i), self.unread.get_mut(i)) else { continue };
            // Below 2^24 words.
            match read(i as u32) {
                Some(v) if v == *w => {}
                Some(v) => {
                    *w = v;
                    differed += 1;
                }
                None => {
                    *unread = true;
                    differed += 1;
                }
            }
        }
        differed
    }

    /// Whether the filter as written says `id` may be listed (as the program computes it).
    #[cfg(test)]
    fn has(&self, id: &Id) -> bool {
        let b = bit_of(id, self.bits);
        self.words.get(b / 64).is_some_and(|w| w >> (b % 64) & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    /// A filter of keys with ports, of the size `services6_filter` had (2^20 bits).
    const KEY_BITS: u32 = 20;
    /// A filter of addresses, of the size `snat6_filter` had (2^16 bits).
    const ADDR_BITS: u32 = 16;

    /// The [`Id`] of address `s` with port 80/TCP (`port`), or of the address alone.
    fn id(s: &str, port: bool) -> Id {
        let a = s.parse::<Ipv6Addr>().unwrap().octets();
        (a, if port { port_proto(80u16.to_be_bytes(), 6) } else { 0 })
    }

    /// Writes into `kernel` (the array as the kernel would hold it), failing the writes whose
    /// word is in `fail`.
    fn into<'k>(kernel: &'k mut [u64], fail: &'k [u32]) -> impl FnMut(u32, u64) -> Result<(), u32> + 'k {
        move |i, v| {
            if fail.contains(&i) {
                return Err(i);
            }
            kernel[i as usize] = v;
            Ok(())
        }
    }

    /// The program's answer for `id`: its bit in the kernel's words.
    fn kernel_has(kernel: &[u64], id: &Id, bits: u32) -> bool {
        let b = bit_of(id, bits);
        kernel[b / 64] >> (b % 64) & 1 == 1
    }

    #[test]
    fn listed_keys_have_their_bit_and_a_removed_one_is_cleared() {
        let mut f = KeyFilter::new(KEY_BITS);
        let mut kernel = vec![0u64; f.len()];
        let (x, y) = (id("fd00::10", true), id("2001:db8::1", true));
        assert_eq!(f.apply([x, y, x], into(&mut kernel, &[])), Ok(2));
        assert!(f.has(&x) && f.has(&y));
        assert!(kernel_has(&kernel, &x, KEY_BITS) && kernel_has(&kernel, &y, KEY_BITS));
        assert_eq!(f.apply([y], into(&mut kernel, &[])), Ok(1));
        assert!(!kernel_has(&kernel, &x, KEY_BITS) && kernel_has(&kernel, &y, KEY_BITS));
        // Nothing changed: nothing written.
        assert_eq!(f.apply([y], into(&mut kernel, &[])), Ok(0));
        assert_eq!(kernel.iter().map(|w| w.count_ones()).sum::<u32>(), 1);
    }

    #[test]
    fn two_keys_of_one_bit_keep_it_while_either_is_listed() {
        let x = id("fd00::1", false);
        let bx = bit_of(&x, ADDR_BITS);
        let y = (2u32..)
            .map(|i| id(&format!("fd00::{:x}:{:x}", i >> 16, i & 0xffff), false))
            .find(|y| bit_of(y, ADDR_BITS) == bx)
            .expect("65,536 bits: a collision within a few hundred thousand addresses");
        let mut f = KeyFilter::new(ADDR_BITS);
        let mut kernel = vec![0u64; f.len()];
        f.apply([x, y], into(&mut kernel, &[])).unwrap();
        f.apply([y], into(&mut kernel, &[])).unwrap();
        assert!(f.has(&y), "removing one key of a shared bit must not lose the other");
        assert!(kernel_has(&kernel, &y, ADDR_BITS));
    }

    #[test]
    fn a_failed_write_is_written_by_the_next_apply() {
        let mut f = KeyFilter::new(KEY_BITS);
        let mut kernel = vec![0u64; f.len()];
        let x = id("fd00::10", true);
        let w = (bit_of(&x, KEY_BITS) / 64) as u32;
        assert_eq!(f.apply([x], into(&mut kernel, &[w])), Err(w));
        assert!(!f.has(&x), "the filter holds what the kernel holds");
        assert_eq!(f.apply([x], into(&mut kernel, &[])), Ok(1));
        assert!(f.has(&x) && kernel_has(&kernel, &x, KEY_BITS));
    }

    #[test]
    fn a_word_changed_behind_xlbs_back_is_rewritten_after_a_read_back() {
        let mut f = KeyFilter::new(KEY_BITS);
        let mut kernel = vec![0u64; f.len()];
        let x = id("fd01::5", true);
        f.apply([x], into(&mut kernel, &[])).unwrap();
        let w = bit_of(&x, KEY_BITS) / 64;
        kernel[w] = 0; // an outside write: the program would now pass the backend's replies
        // A read-back of another share finds nothing.
        let other = (w + f.len() / 2) % f.len();
        assert_eq!(f.reload(other, f.len() / 8, |i| Some(kernel[i as usize])), 0);
        assert_eq!(f.apply([x], into(&mut kernel, &[])), Ok(0), "not known to differ yet");
        assert_eq!(f.reload(w, 1, |i| Some(kernel[i as usize])), 1);
        assert_eq!(f.apply([x], into(&mut kernel, &[])), Ok(1));
        assert!(kernel_has(&kernel, &x, KEY_BITS));
        // A word that cannot be read back is written again, whatever it is taken to hold.
        kernel[w] = 0;
        assert_eq!(f.reload(w, 1, |_| None), 1);
        assert_eq!(f.apply([x], into(&mut kernel, &[])), Ok(1));
        assert!(kernel_has(&kernel, &x, KEY_BITS));
        assert_eq!(f.apply([x], into(&mut kernel, &[])), Ok(0), "once");
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn the_bit_is_the_top_bits_of_the_address_halves_and_port_hashed() {
        // The formula of xdp/steer.c's key6_hash() and filter6_has(), written out for one key (little-endian
        // halves, as the program reads them on this host).
        let (a, x) = id("fd00::10", true);
        assert_eq!(
            x,
            u64::from(u16::from_le_bytes([0, 80])) | 6 << 16,
            "port bytes as in the frame, then the protocol"
        );
        let lo = u64::from_le_bytes(a[..8].try_into().unwrap());
        let hi = u64::from_le_bytes(a[8..].try_into().unwrap());
        let h = ((lo.wrapping_mul(MUL) ^ hi).wrapping_mul(MUL) ^ x).wrapping_mul(MUL);
        assert_eq!(bit_of(&(a, x), KEY_BITS), (h >> 44) as usize);
        assert_eq!(bit_of(&(a, x), ADDR_BITS), (h >> 48) as usize);
        // The key's 20 bytes give the same id.
        let k = crate::maps::ServiceMapKey { addr: a, port_be: 80u16.to_be_bytes(), proto: 6, pad: 0 }.to_bytes();
        assert_eq!(key_id(&k), (a, x));
        // Addresses that differ in their last byte alone (pods of one node) get distinct bits.
        let bits: std::collections::HashSet<usize> =
            (0u8..=255).map(|i| bit_of(&id(&format!("fd01::{i:x}"), true), KEY_BITS)).collect();
        assert_eq!(bits.len(), 256);
    }
}
