//! Memory for the flow table: anonymous `mmap` with `MADV_HUGEPAGE` (memmap2), viewed as a
//! slice of plain-old-data values (bytemuck), so no `unsafe` is needed here.
//!
//! Anonymous mappings are zero-filled on first touch: pages of the record slab that no flow
//! ever used cost no memory, and an IPv6 table that sees no IPv6 traffic costs none either.
//! `MADV_HUGEPAGE` (madvise(2); kernel doc `admin-guide/mm/transhuge.rst`) asks for 2 MiB
//! pages, so a lookup over a table of hundreds of MiB does not also miss the TLB on every
//! packet. Where transparent huge pages are off (`never`) the advice fails and is ignored:
//! the table works the same on 4 KiB pages. Where the mapping itself fails, a heap vector is
//! used instead.

use bytemuck::Pod;
use memmap2::{Advice, MmapMut};

/// `len` values of `T`, zero-initialised, in an anonymous mapping (or on the heap).
pub(crate) struct Region<T: Pod> {
    map: Option<MmapMut>,
    heap: Vec<T>,
    len: usize,
    huge: bool,
}

impl<T: Pod> core::fmt::Debug for Region<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len)
            .field("bytes", &self.bytes())
            .field("mapped", &self.map.is_some())
            .field("huge_pages_advised", &self.huge)
            .finish()
    }
}

impl<T: Pod> Region<T> {
    /// `len` zeroed values (at least one, so indexing code never sees an empty table).
    pub(crate) fn new(len: usize) -> Self {
        let len = len.max(1);
        let bytes = len.saturating_mul(core::mem::size_of::<T>());
        match MmapMut::map_anon(bytes) {
            Ok(map) => {
                let huge = map.advise(Advice::HugePage).is_ok();
                Self { map: Some(map), heap: Vec::new(), len, huge }
            }
            Err(e) => {
                tracing::warn!(bytes, error = %e, "anonymous mapping failed; flow table on the heap");
                Self { map: None, heap: vec![T::zeroed(); len], len, huge: false }
            }
        }
    }

    /// The values.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[T] {
        match &self.map {
            // The mapping is page-aligned and exactly `len * size_of::<T>()` bytes long, so the
            // cast cannot fail; an empty slice would only make every lookup miss.
            Some(m) => bytemuck::try_cast_slice(&m[..]).unwrap_or(&[]),
            None => &self.heap,
        }
    }

    /// The values, mutable.
    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        match &mut self.map {
            Some(m) => bytemuck::try_cast_slice_mut(&mut m[..]).unwrap_or(&mut []),
            None => &mut self.heap,
        }
    }

    /// Bytes reserved (virtual; untouched pages of a mapping cost nothing).
    pub(crate) fn bytes(&self) -> usize {
        self.len * core::mem::size_of::<T>()
    }

    /// Whether the kernel accepted `MADV_HUGEPAGE` for this mapping.
    pub(crate) fn huge_pages_advised(&self) -> bool {
        self.huge
    }

    /// Sets every value to zero (touches every page).
    pub(crate) fn zero(&mut self) {
        self.as_mut_slice().fill(T::zeroed());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, reason = "tests")]
    use super::*;

    #[test]
    fn region_is_zeroed_and_writable() {
        let mut r = Region::<[u32; 16]>::new(1000);
        assert_eq!(r.as_slice().len(), 1000);
        assert!(r.as_slice().iter().all(|x| *x == [0; 16]));
        r.as_mut_slice()[999][3] = 7;
        assert_eq!(r.as_slice()[999][3], 7);
        r.zero();
        assert_eq!(r.as_slice()[999][3], 0);
    }
}
