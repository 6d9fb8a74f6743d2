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
            // cast cannot fail; an empty slice would only make every lookup miss. The bytes are
            // cut to that length first, so that the cast's length check (a multiple of the
            // value size) is known to pass at compile time and only an alignment test is left:
            // every conntrack call on the packet path borrows its regions (an insert three).
            Some(m) => bytemuck::try_cast_slice(m.get(..self.bytes()).unwrap_or(&[])).unwrap_or(&[]),
            None => &self.heap,
        }
    }

    /// The values, mutable (see [`Region::as_slice`]).
    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        let bytes = self.bytes();
        match &mut self.map {
            Some(m) => bytemuck::try_cast_slice_mut(m.get_mut(..bytes).unwrap_or(&mut [])).unwrap_or(&mut []),
            None => &mut self.heap,
        }
    }

    /// Bytes reserved (virtual; untouched pages of a mapping cost nothing).
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.len * core::mem::size_of::<T>()
    }

    /// Whether the kernel accepted `MADV_HUGEPAGE` for this mapping.
    pub(crate) fn huge_pages_advised(&self) -> bool {
        self.huge
    }

    /// Commits every page of the region now, keeping its contents: `MADV_POPULATE_WRITE`
    /// (madvise(2), Linux 5.14), or where the kernel refuses it, one read and write back of
    /// a value per 4 KiB. Off the per-packet path (a worker calls it before it takes traffic):
    /// otherwise the first write to each page faults there, and a fault on a huge-page region
    /// zeroes 2 MiB and may have to compact memory first (milliseconds, measured with
    /// `callgrind-pipeline jitter`, docs/benchmarks.md). Returns the bytes committed.
    pub(crate) fn prefault(&mut self) -> usize {
        if let Some(m) = &self.map
            && m.advise(Advice::PopulateWrite).is_ok()
        {
            return self.bytes();
        }
        // A mapping the kernel would not populate, or the heap vector (which calloc may have
        // left unwritten): one value per 4 KiB written back.
        let step = (4096 / core::mem::size_of::<T>().max(1)).max(1);
        for v in self.as_mut_slice().iter_mut().step_by(step) {
            *v = core::hint::black_box(*v);
        }
        self.bytes()
    }

    /// Address of the first value (tests find the region's mapping in `/proc/self/smaps`).
    #[cfg(test)]
    pub(crate) fn addr(&self) -> usize {
        self.as_slice().as_ptr() as usize
    }

    /// Sets every value to zero (touches every page).
    pub(crate) fn zero(&mut self) {
        self.as_mut_slice().fill(T::zeroed());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::panic, reason = "tests")]
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

    /// Bytes of `[addr, addr + len)` in memory, from `/proc/self/pagemap` (bit 63 of each
    /// page's entry: present; kernel doc `admin-guide/mm/pagemap.rst`).
    fn resident(addr: usize, len: usize) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let page = 4096;
        let (first, pages) = (addr / page, (addr + len).div_ceil(page) - addr / page);
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        f.seek(SeekFrom::Start((first * 8) as u64)).unwrap();
        let mut buf = vec![0u8; pages * 8];
        f.read_exact(&mut buf).unwrap();
        let present = buf.chunks_exact(8).filter(|&e| u64::from_le_bytes(e.try_into().unwrap()) >> 63 == 1).count();
        present * page
    }

    #[test]
    fn prefault_commits_every_page_and_keeps_the_contents() {
        // 16 MiB: large enough that a lazily faulted region shows almost nothing resident.
        let mut r = Region::<[u64; 8]>::new(1 << 18);
        r.as_mut_slice()[12_345][7] = 42;
        let before = resident(r.addr(), r.bytes());
        assert!(before < r.bytes() / 2, "{before} of {} bytes resident before", r.bytes());
        assert_eq!(r.prefault(), r.bytes());
        let after = resident(r.addr(), r.bytes());
        assert!(after >= r.bytes(), "{after} of {} bytes resident after", r.bytes());
        assert_eq!(r.as_slice()[12_345][7], 42);
        assert!(r.as_slice().iter().enumerate().all(|(i, v)| i == 12_345 || *v == [0; 8]));
    }
}
