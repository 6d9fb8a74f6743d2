//! A counting global allocator: the system allocator plus atomic counters of live bytes, so
//! the benchmark can say how many heap bytes a built `Tables` keeps alive. The only module of
//! the crate with `unsafe` code.
//!
//! A binary opts in with
//! `#[global_allocator] static A: xlb_cpbench::alloc_count::Counting = xlb_cpbench::alloc_count::Counting;`;
//! without it [`active`] is false and [`live_bytes`] stays 0.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting the bytes it hands out and takes back.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

fn added(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
    if !ACTIVE.load(Ordering::Relaxed) {
        ACTIVE.store(true, Ordering::Relaxed);
    }
}

fn removed(n: usize) {
    LIVE.fetch_sub(n, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract (valid layouts, pointers from this allocator) carries over; the
// counters are plain atomics and never allocate.
#[allow(unsafe_code, reason = "a GlobalAlloc implementation is unsafe by definition")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours: `layout` has non-zero size (caller's duty).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout` (caller's duty).
        unsafe { System.dealloc(ptr, layout) };
        removed(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr`/`layout` came from this allocator and `new_size` is valid (caller's duty).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            removed(layout.size());
            added(new_size);
        }
        p
    }
}

/// Whether the counting allocator is the global allocator of this process (it has counted
/// at least one allocation).
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Heap bytes currently allocated through [`Counting`].
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Largest [`live_bytes`] seen since the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Sets the peak to the current live bytes.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}
