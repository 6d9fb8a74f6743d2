//! A counting global allocator: the system allocator plus an atomic counter of live bytes, so
//! the benchmark can say how many heap bytes a built `Tables` keeps alive. The only module of
//! the crate with `unsafe` code.
//!
//! A binary opts in with
//! `#[global_allocator] static A: xlb_cpbench::alloc_count::Counting = xlb_cpbench::alloc_count::Counting;`;
//! without it [`active`] is false and [`count`]'s probe reads 0. Only allocations made inside
//! [`count`] are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// Bytes allocated minus bytes freed while counting was on.
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// Whether allocations are counted now ([`count`]).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Whether this allocator has served any allocation (is the global allocator).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting the bytes it hands out and takes back while [`count`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

fn added(n: usize) {
    if !ACTIVE.load(Ordering::Relaxed) {
        ACTIVE.store(true, Ordering::Relaxed);
    }
    if COUNTING.load(Ordering::Relaxed) {
        LIVE.fetch_add(n.cast_signed(), Ordering::Relaxed);
    }
}

fn removed(n: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE.fetch_sub(n.cast_signed(), Ordering::Relaxed);
    }
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

/// Whether the counting allocator is the global allocator of this process (it has served at
/// least one allocation).
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Runs `f` with counting on and returns its result. `f` gets a probe that reads the bytes
/// allocated minus the bytes freed since counting started, so differences between two reads
/// are the change of the live heap in between (frees of older blocks count as negative).
/// Outside `count` the allocator only forwards to the system allocator: its atomic counters
/// cost the timed runs about 15 % of a control-plane rebuild, so timings are taken with
/// counting off. Single-threaded use only (one window at a time); a probe reads 0 when the
/// allocator is not installed.
pub fn count<T>(f: impl FnOnce(&dyn Fn() -> isize) -> T) -> T {
    LIVE.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    let out = f(&|| LIVE.load(Ordering::Relaxed));
    COUNTING.store(false, Ordering::Relaxed);
    out
}
