//! Internet checksum helpers (RFC 1071) with incremental update (RFC 1624).
//!
//! Rewrites change a few 16-bit words of a header (addresses, ports, TTL); instead of summing
//! the whole packet again, the stored checksum is adjusted with RFC 1624 eqn. 3:
//! `HC' = ~(~HC + ~m + m')`, which, unlike eqn. 2 of RFC 1141, never produces a -0 result
//! from a +0 input. The TCP and UDP pseudo-header (RFC 9293 §3.1, RFC 768, RFC 8200
//! §8.1) covers the IP addresses, so an address change updates the L4 checksum too.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

/// Folds a 32-bit one's-complement accumulator to 16 bits (RFC 1071 §4.1).
#[inline]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    // Two folds suffice for any u32 input: after the first the value is < 0x1_fffe.
    (sum & 0xffff) as u16
}

/// Adds the 16-bit big-endian words of `data` to `sum` (an odd trailing byte is padded with
/// zero, RFC 1071 §4.1). Accumulates in u64 so any frame length is safe.
#[inline]
pub fn add_bytes(sum: u32, data: &[u8]) -> u32 {
    let mut acc = u64::from(sum);
    let (words, rest) = data.as_chunks::<2>();
    for w in words {
        acc += u64::from(u16::from_be_bytes(*w));
    }
    if let [b] = rest {
        acc += u64::from(u16::from_be_bytes([*b, 0]));
    }
    while acc > u64::from(u32::MAX) {
        acc = (acc & 0xffff_ffff) + (acc >> 32);
    }
    u32::try_from(acc).unwrap_or(u32::MAX)
}

/// The one's-complement checksum of `data` (RFC 1071), ready to store.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(add_bytes(0, data))
}

/// RFC 1624 eqn. 3: the checksum after one 16-bit word changed from `old` to `new`.
#[inline]
pub fn update16(hc: u16, old: u16, new: u16) -> u16 {
    let sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
    !fold(sum)
}

/// RFC 1624 eqn. 3 over a run of words: the checksum after the bytes `old` became `new`
/// (equal lengths, even, at an even offset of the checksummed data — true for addresses and
/// ports). Used for 4- and 16-byte addresses.
#[inline]
pub fn update_bytes(hc: u16, old: &[u8], new: &[u8]) -> u16 {
    !fold(delta_add(u32::from(!hc), old, new))
}

/// The RFC 1624 delta of decrementing the TTL (RFC 791 §3.2) in the IPv4 header word
/// `(TTL, protocol)`: `~m + m'` with `m' = m - 0x0100` is `0xffff - 0x0100` whatever the TTL,
/// so it can be folded into a precomputed delta.
pub const TTL_DEC: u16 = 0xfeff;

/// Delta `d` in wire order: the value whose bytes in the machine's order are `d`'s in network
/// order (`d.to_be()`). One's-complement addition commutes with swapping the bytes of every
/// operand (RFC 1071 §2(B): "the sum of 16-bit integers can be computed in either byte
/// order"), so [`apply_delta`] of a wire-order delta to a checksum field read in the machine's
/// order ([`crate::wire::emit::get_u16_ne`]) gives, written back the same way, the bytes that
/// the big-endian computation gives; [`delta`]'s normalisation (`0xffff` to `0`), [`negate`],
/// [`add_deltas`] and [`apply_l4_delta`]'s zero rules commute with the swap too. The flow
/// records keep their deltas this way, so the fast path swaps no checksum's bytes.
#[inline]
pub const fn wire(d: u16) -> u16 {
    d.to_be()
}

/// [`TTL_DEC`] in wire order ([`wire`]).
pub const TTL_DEC_WIRE: u16 = wire(TTL_DEC);

/// Accumulates the RFC 1624 eqn. 3 terms `~m + m'` of the 16-bit words of `old` → `new`
/// (equal lengths, even, at an even offset of the checksummed data) onto `acc`. Fold the
/// result with [`delta`] to get a precomputed delta.
#[inline]
pub fn delta_add(acc: u32, old: &[u8], new: &[u8]) -> u32 {
    let mut sum = acc;
    for (o, n) in old.as_chunks::<2>().0.iter().zip(new.as_chunks::<2>().0) {
        sum += u32::from(!u16::from_be_bytes(*o));
        sum += u32::from(u16::from_be_bytes(*n));
    }
    sum
}

/// Folds an accumulator of [`delta_add`] terms to a 16-bit delta, normalised so that a net
/// change of zero (one's-complement −0, `0xffff`) is `0`: [`apply_delta`] then leaves the
/// checksum exactly as it was, as a rewrite that changes no bytes must.
#[inline]
pub fn delta(acc: u32) -> u16 {
    // The fold's result, 0xffff taken to 0, is the sum's residue modulo 0xffff (2^16 is 1
    // modulo 0xffff, RFC 1071 §2(D)): the compiler's remainder by a constant is a multiply and
    // two shifts, fewer steps than two folds and a compare.
    (acc % 0xffff) as u16
}

/// One side's terms of a DNAT's RFC 1624 eqn. 3 deltas, summed once when the tables are
/// built instead of for every new flow: the terms `~m` of the address and port a DNAT rewrites
/// (a frontend's VIP and port, [`DnatHalf::of_old`]) or `m'` of those it writes (a backend's,
/// [`DnatHalf::of_new`]), in wire order ([`wire`]) and normalised like [`delta`]. A folded
/// delta is its sum modulo `0xffff` (RFC 1071 §2(D)), so a frontend's half and a backend's half
/// give, through [`dnat_deltas`], the deltas that summing all the terms of the flow gives.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DnatHalf {
    /// The address's terms (IPv4: 4 octets; IPv6: 16; an IPv4-mapped IPv6 address's sum is
    /// its IPv4 address's, since `0xffff` is zero modulo `0xffff`).
    pub addr: u16,
    /// The address's and the port's terms (the transport checksum's share: the pseudo-header
    /// covers the address, RFC 9293 §3.1).
    pub addr_port: u16,
}

impl DnatHalf {
    /// The terms `~m` of `addr` (network-order octets, even length) and `port` (host order):
    /// what a DNAT rewrites.
    #[must_use]
    pub fn of_old(addr: &[u8], port: u16) -> Self {
        let a = addr.as_chunks::<2>().0.iter().fold(0u32, |s, w| s + u32::from(!u16::from_ne_bytes(*w)));
        Self::folded(a, u32::from(wire(!port)))
    }

    /// The terms `m'` of `addr` (network-order octets, even length) and `port` (host order):
    /// what a DNAT writes.
    #[must_use]
    pub fn of_new(addr: &[u8], port: u16) -> Self {
        let a = addr.as_chunks::<2>().0.iter().fold(0u32, |s, w| s + u32::from(u16::from_ne_bytes(*w)));
        Self::folded(a, u32::from(wire(port)))
    }

    fn folded(addr: u32, port: u32) -> Self {
        let addr = delta(addr);
        Self { addr, addr_port: delta(u32::from(addr) + port) }
    }
}

/// The deltas of a DNAT from `old` (the frontend's half) to `new` (the backend's), the source
/// staying the client's, in wire order: (forward IPv4 header with the TTL decrement folded in,
/// reply IPv4 header with its TTL decrement, forward transport checksum). The reply's
/// transport delta is the forward one negated ([`negate`]). Equal to summing every term of the
/// rewrite with [`delta_add`]: the client's terms, `~m + m` per word, are one's-complement
/// zeros (RFC 1624 §3), and each result is a sum modulo `0xffff`, normalised, so halves summed
/// apart add up to the whole (`add_deltas(a, b)` is `(a + b) mod 0xffff`, `negate(d)` is
/// `(0xffff - d) mod 0xffff`). Always inlined: left to the compiler it was a call, and a SYN
/// into a full table paid 9 instructions more for it (callgrind, docs/benchmarks.md).
#[inline(always)]
#[must_use]
pub fn dnat_deltas(old: DnatHalf, new: DnatHalf) -> (u16, u16, u16) {
    let acc = u32::from(old.addr) + u32::from(new.addr);
    let ttl = u32::from(TTL_DEC_WIRE);
    let addr = delta(acc);
    (
        delta(acc + ttl),
        delta(0xffff - u32::from(addr) + ttl),
        delta(u32::from(old.addr_port) + u32::from(new.addr_port)),
    )
}

/// The one's-complement negation of a delta (the reverse rewrite), normalised like [`delta`].
#[inline]
pub fn negate(d: u16) -> u16 {
    if d == 0 { 0 } else { !d }
}

/// Adds two deltas (one's-complement sum), normalised like [`delta`].
#[inline]
pub fn add_deltas(a: u16, b: u16) -> u16 {
    delta(u32::from(a) + u32::from(b))
}

/// One's-complement sum of two 16-bit values: add with end-around carry (RFC 1071 §2(C)).
#[inline]
pub fn add16(a: u16, b: u16) -> u16 {
    let (s, carry) = a.overflowing_add(b);
    s + u16::from(carry)
}

/// RFC 1624 eqn. 3 with a precomputed delta: `HC' = ~(~HC + Σ(~m + m'))`. A zero delta leaves
/// `hc` unchanged. Gives the same result as updating the changed words one by one with
/// [`update16`] / [`update_bytes`] (one's-complement addition is associative; a non-zero sum
/// has one representation).
#[inline]
pub fn apply_delta(hc: u16, d: u16) -> u16 {
    !add16(!hc, d)
}

/// [`apply_delta`] under an L4 checksum rule: UDP sends a computed zero as `0xffff` (RFC 768),
/// and over IPv4 keeps a zero checksum zero, as [`update_l4`] does.
#[inline]
pub fn apply_l4_delta(kind: L4Sum, hc: u16, d: u16) -> u16 {
    match kind {
        L4Sum::None => hc,
        L4Sum::Always => apply_delta(hc, d),
        L4Sum::UdpV6 => match apply_delta(hc, d) {
            0 => 0xffff,
            r => r,
        },
        L4Sum::UdpV4 => {
            if hc == 0 || d == 0 {
                hc
            } else {
                let r = apply_delta(hc, d);
                if r == 0 { 0xffff } else { r }
            }
        }
    }
}

/// Which L4 checksum rule applies when updating incrementally.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum L4Sum {
    /// TCP (both families) and ICMPv6: always present.
    Always,
    /// UDP over IPv6: always present, and a computed 0 is sent as 0xFFFF (RFC 768): a zero
    /// field means no checksum, which IPv6 receivers discard (RFC 8200 §8.1).
    UdpV6,
    /// UDP over IPv4: 0 means "no checksum" and stays 0; a computed 0 is sent as 0xFFFF
    /// (RFC 768).
    UdpV4,
    /// No checksum covers the pseudo-header (SCTP uses CRC32c over the payload only, RFC 9260
    /// §6.8; ICMPv4 has no pseudo-header).
    None,
}

/// Applies an incremental update to an L4 checksum field according to `kind`.
#[inline]
pub fn update_l4(kind: L4Sum, hc: u16, old: &[u8], new: &[u8]) -> u16 {
    match kind {
        L4Sum::None => hc,
        L4Sum::Always => update_bytes(hc, old, new),
        L4Sum::UdpV6 => match update_bytes(hc, old, new) {
            0 => 0xffff,
            r => r,
        },
        L4Sum::UdpV4 => {
            if hc == 0 {
                0
            } else {
                let r = update_bytes(hc, old, new);
                if r == 0 { 0xffff } else { r }
            }
        }
    }
}

/// Sum of an IPv4 or IPv6 pseudo-header (RFC 9293 §3.1, RFC 8200 §8.1): source, destination,
/// protocol and upper-layer length.
#[inline]
pub fn pseudo_header(src: &[u8], dst: &[u8], proto: u8, len: u32) -> u32 {
    let mut s = add_bytes(0, src);
    s = add_bytes(s, dst);
    s += u32::from(proto);
    s += len >> 16;
    s += len & 0xffff;
    s
}

/// CRC32c (Castagnoli) of `data` as SCTP uses it (RFC 9260 §6.8, Appendix B). Computed by
/// the `crc32c` crate (SSE4.2 / ARMv8 CRC instructions, software fallback).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// Recomputes the SCTP common-header checksum of `sctp` (header plus chunks) in place after
/// a port rewrite. CRC32c is not updatable with RFC 1624 arithmetic, so the whole packet is
/// summed again (hardware CRC: about 8 bytes per cycle; only when a port changes). The checksum field
/// is at bytes 8..12 and is stored little-endian per RFC 9260 Appendix B.
pub fn sctp_crc_update_ports(sctp: &mut [u8]) {
    let Some(field) = sctp.get_mut(8..12) else { return };
    field.fill(0);
    let c = crc32c(sctp);
    if let Some(field) = sctp.get_mut(8..12) {
        field.copy_from_slice(&c.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc1071_example_sums_to_known_value() {
        // RFC 1071 §3 example bytes: 00 01 f2 03 f4 f5 f6 f7 -> sum 0xddf2 (before complement).
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(add_bytes(0, &d)), 0xddf2);
        assert_eq!(checksum(&d), !0xddf2);
    }

    #[test]
    fn crc32c_matches_rfc3720_test_vector() {
        // RFC 3720 B.4: 32 bytes of zeros -> 0x8A9136AA.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    #[test]
    fn udp_v4_zero_checksum_stays_zero() {
        assert_eq!(update_l4(L4Sum::UdpV4, 0, &[1, 2, 3, 4], &[5, 6, 7, 8]), 0);
    }

    /// The precomputed-delta form of the RFC 768 rule (the fast path's DNAT): a UDP sum that
    /// comes to zero is sent as `0xffff` over either family; a zero UDP/IPv4 field (no
    /// checksum) stays zero; TCP writes the sum as computed.
    #[test]
    fn a_udp_v4_delta_to_a_computed_zero_sends_0xffff() {
        // !(!0x1234 + 0x1234) = !0xffff = 0
        assert_eq!(apply_delta(0x1234, 0x1234), 0);
        assert_eq!(apply_l4_delta(L4Sum::UdpV4, 0x1234, 0x1234), 0xffff);
        assert_eq!(apply_l4_delta(L4Sum::Always, 0x1234, 0x1234), 0);
        assert_eq!(apply_l4_delta(L4Sum::UdpV6, 0x1234, 0x1234), 0xffff);
        assert_eq!(apply_l4_delta(L4Sum::UdpV4, 0, 0x1234), 0);
        assert_eq!(update_l4(L4Sum::UdpV4, 0x1234, &[0, 0], &[0x12, 0x34]), 0xffff);
        assert_eq!(update_l4(L4Sum::UdpV6, 0x1234, &[0, 0], &[0x12, 0x34]), 0xffff);
        assert_eq!(update_l4(L4Sum::Always, 0x1234, &[0, 0], &[0x12, 0x34]), 0);
    }

    proptest! {
        /// A precomputed delta over several changed words (with the TTL decrement folded in)
        /// gives exactly what updating the words one at a time gives, and applying the
        /// negated delta undoes it.
        #[test]
        fn precomputed_delta_equals_word_by_word_updates(
            hc in any::<u16>(), a in any::<[u8; 8]>(), b in any::<[u8; 8]>(), ttl in 2u8.., pr in any::<u8>()) {
            let mut one = hc;
            for (o, n) in a.chunks_exact(2).zip(b.chunks_exact(2)) {
                if o != n {
                    one = update16(one, u16::from_be_bytes([o[0], o[1]]), u16::from_be_bytes([n[0], n[1]]));
                }
            }
            one = update16(one, u16::from_be_bytes([ttl, pr]), u16::from_be_bytes([ttl - 1, pr]));
            let d = delta(delta_add(0, &a, &b));
            let all = apply_delta(hc, add_deltas(d, TTL_DEC));
            prop_assert!(all == one || (hc == 0xffff || hc == 0), "{all:#x} vs {one:#x}");
            if hc != 0xffff && hc != 0 {
                prop_assert_eq!(apply_delta(apply_delta(hc, d), negate(d)), hc);
            }
        }

        /// RFC 1071 §2(B): a delta in wire order applied to a checksum field read in the
        /// machine's order writes the bytes that the big-endian computation writes, under
        /// every L4 rule, and the delta helpers commute with the swap.
        #[test]
        fn a_wire_order_delta_writes_the_bytes_of_the_big_endian_update(
            field in any::<[u8; 2]>(), d in any::<u16>(), e in any::<u16>(), acc in any::<u32>()) {
            let be = u16::from_be_bytes(field);
            for kind in [L4Sum::Always, L4Sum::UdpV4, L4Sum::None] {
                let want = apply_l4_delta(kind, be, d).to_be_bytes();
                let got = apply_l4_delta(kind, u16::from_ne_bytes(field), wire(d)).to_ne_bytes();
                prop_assert_eq!(got, want);
            }
            prop_assert_eq!(apply_delta(u16::from_ne_bytes(field), wire(d)).to_ne_bytes(), apply_delta(be, d).to_be_bytes());
            prop_assert_eq!(wire(negate(d)), negate(wire(d)));
            prop_assert_eq!(wire(add_deltas(d, e)), add_deltas(wire(d), wire(e)));
            prop_assert_eq!(wire(delta(acc)), delta(u32::from(wire((acc & 0xffff) as u16)) + u32::from(wire((acc >> 16) as u16))));
        }

        /// [`delta`] (a remainder by 0xffff) is the accumulator folded (RFC 1071 §4.1) with
        /// one's-complement −0 (`0xffff`) taken to `0`, for every accumulator.
        #[test]
        fn a_delta_is_the_folded_sum_with_minus_zero_taken_to_zero(
            acc in prop_oneof![any::<u32>(), 0u32..0x3_0000, Just(u32::MAX), Just(0xffff), Just(0x1_fffe)]) {
            let folded = fold(acc);
            prop_assert_eq!(delta(acc), if folded == 0xffff { 0 } else { folded });
        }

        /// A frontend's and a backend's halves (summed apart, as the tables keep them) give the
        /// deltas that summing every term of the DNAT with [`delta_add`] gives, as `set_rewrite`
        /// does (forward IPv4 header and reply IPv4 header with the TTL decrement, transport).
        #[test]
        fn dnat_deltas_from_halves_are_the_sum_of_every_term(
            v in any::<[u8; 16]>(), b in any::<[u8; 16]>(), vp in any::<u16>(), bp in any::<u16>(), v4 in any::<bool>()) {
            let n = if v4 { 4 } else { 16 };
            let (v, b) = (&v[..n], &b[..n]);
            let addr = delta(delta_add(0, v, b));
            let l4 = delta(delta_add(delta_add(0, v, b), &vp.to_be_bytes(), &bp.to_be_bytes()));
            let want = (wire(add_deltas(addr, TTL_DEC)), wire(add_deltas(negate(addr), TTL_DEC)), wire(l4));
            prop_assert_eq!(dnat_deltas(DnatHalf::of_old(v, vp), DnatHalf::of_new(b, bp)), want);
        }

        #[test]
        fn incremental_update_equals_full_recompute(
            mut data in proptest::collection::vec(any::<u8>(), 2..200),
            at in 0usize..100, new in any::<[u8; 4]>()) {
            if data.len() % 2 == 1 { data.push(0); }
            let at = (at * 2) % data.len();
            let end = (at + 4).min(data.len());
            let hc = checksum(&data);
            let old = data[at..end].to_vec();
            data[at..end].copy_from_slice(&new[..end - at]);
            let inc = update_bytes(hc, &old, &data[at..end]);
            let full = checksum(&data);
            // One's complement has two zeros; RFC 1624 eqn. 3 never yields 0x0000 from a
            // non-zero sum, but both encodings verify.
            prop_assert!(inc == full || (inc ^ full) == 0xffff && (inc == 0 || full == 0),
                "inc {:#x} full {:#x}", inc, full);
        }
    }
}
