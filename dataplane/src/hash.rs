//! The mixing step the flow table's keyed hash (`conntrack`) and the tables' maps
//! (`tables::persist::KeyMap`) are built from.
#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

/// The 64×64→128-bit multiply folded to 64 bits (high half XOR low half): the mixing step of
/// foldhash's and wyhash's `folded_multiply`. A multiply by a constant `b` leaves the low bits
/// of the result depending on the low bits of `a` alone: fold twice when one side may be
/// constant for many keys.
#[inline]
pub(crate) fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    // Truncation keeps the low half on purpose; the high half is the shift.
    #[expect(clippy::cast_possible_truncation, reason = "the low 64 bits are wanted")]
    let lo = p as u64;
    lo ^ (p >> 64) as u64
}
