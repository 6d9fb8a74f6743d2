//! The drop tap: copies of the frames a worker drops (and, on request, of those it hands to
//! the kernel), for `xlb monitor --drops [--punted]`.
//!
//! Each worker owns one [`DropTap`], made with the worker. While no monitor listens it costs
//! one relaxed atomic load per dropped frame and nothing per forwarded one (the worker checks
//! [`DropTap::is_on`] only in its drop path). While on, each dropped frame (one in every
//! [`DropTap::set_sample`]-th) has its first [`SNAP_LEN`] bytes copied into a preallocated
//! lock-free queue ([`crossbeam::queue::ArrayQueue`], [`QUEUE_LEN`] records) that the
//! monitor drains; a full queue drops the copy, not the frame, and counts it
//! ([`DropTap::missed`]). No allocation, lock or syscall on the worker's side.
#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam::queue::ArrayQueue;

use crate::counters::DropReason;

/// Bytes of each dropped frame kept (Ethernet, IP and transport headers with room for
/// options and an encapsulation; like `tcpdump -s 256`).
pub const SNAP_LEN: usize = 256;

/// Records a tap holds before the monitor drains them: 1,024 (about 280 KiB per worker).
pub const QUEUE_LEN: usize = 1024;

/// One dropped frame as the tap saw it.
#[derive(Clone, Debug)]
pub struct TapRecord {
    /// When the worker dropped it: nanoseconds since the Unix epoch (`CLOCK_REALTIME`, read
    /// once per dropped frame while the tap is on).
    pub time_ns: u64,
    /// Why it was dropped; `None` for a frame handed to the kernel (punted).
    pub reason: Option<DropReason>,
    /// The frame's length on the wire, in bytes.
    pub len: u32,
    /// Bytes of the frame kept in `data`: `min(len, SNAP_LEN)`.
    pub caplen: u16,
    /// The first `caplen` bytes of the frame.
    pub data: [u8; SNAP_LEN],
}

impl TapRecord {
    /// The captured bytes.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        self.data.get(..usize::from(self.caplen)).unwrap_or(&self.data)
    }
}

/// A worker's drop tap (see the module docs). Shared between the worker and the control
/// thread behind an `Arc`.
#[derive(Debug)]
pub struct DropTap {
    /// Monitors listening (the tap copies while this is above 0).
    listeners: AtomicU32,
    /// Of those, the ones that also want punted frames.
    punt_listeners: AtomicU32,
    /// Copy one dropped frame in this many (at least 1).
    sample: AtomicU32,
    /// Dropped frames seen while on, for sampling.
    seen: AtomicU64,
    /// Copies lost to a full queue.
    missed: AtomicU64,
    queue: ArrayQueue<TapRecord>,
}

impl Default for DropTap {
    fn default() -> Self {
        Self {
            listeners: AtomicU32::new(0),
            punt_listeners: AtomicU32::new(0),
            sample: AtomicU32::new(1),
            seen: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            queue: ArrayQueue::new(QUEUE_LEN),
        }
    }
}

impl DropTap {
    /// Whether a monitor listens (one relaxed load).
    #[inline]
    pub fn is_on(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) != 0
    }

    /// Whether a monitor also wants the frames handed to the kernel (one relaxed load).
    #[inline]
    pub fn wants_punted(&self) -> bool {
        self.punt_listeners.load(Ordering::Relaxed) != 0
    }

    /// A monitor starts listening, for punted frames too if `punted`; pair with
    /// [`DropTap::stop`] with the same `punted`.
    pub fn start(&self, punted: bool) {
        self.listeners.fetch_add(1, Ordering::Relaxed);
        if punted {
            self.punt_listeners.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A monitor stops listening; the last one to stop empties the queue.
    pub fn stop(&self, punted: bool) {
        if punted {
            self.punt_listeners.fetch_sub(1, Ordering::Relaxed);
        }
        if self.listeners.fetch_sub(1, Ordering::Relaxed) == 1 {
            while self.queue.pop().is_some() {}
        }
    }

    /// Copies one dropped frame in `n` (0 is taken as 1).
    pub fn set_sample(&self, n: u32) {
        self.sample.store(n.max(1), Ordering::Relaxed);
    }

    /// Called by the worker for a frame it drops (`reason`), when [`DropTap::is_on`], or hands
    /// to the kernel (`None`), when [`DropTap::wants_punted`]: keeps a copy of its first
    /// [`SNAP_LEN`] bytes if the sample says so and the queue has room.
    pub fn offer(&self, reason: Option<DropReason>, frame: &[u8]) {
        let n = u64::from(self.sample.load(Ordering::Relaxed).max(1));
        if !self.seen.fetch_add(1, Ordering::Relaxed).is_multiple_of(n) {
            return;
        }
        if self.queue.is_full() {
            self.missed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let caplen = frame.len().min(SNAP_LEN);
        let mut data = [0u8; SNAP_LEN];
        if let (Some(d), Some(s)) = (data.get_mut(..caplen), frame.get(..caplen)) {
            d.copy_from_slice(s);
        }
        let time_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let rec = TapRecord {
            time_ns,
            reason,
            len: u32::try_from(frame.len()).unwrap_or(u32::MAX),
            caplen: u16::try_from(caplen).unwrap_or(0),
            data,
        };
        if self.queue.push(rec).is_err() {
            self.missed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The next copied frame, oldest first.
    pub fn pop(&self) -> Option<TapRecord> {
        self.queue.pop()
    }

    /// Copies lost because the queue was full (since the worker started).
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
    use super::*;

    #[test]
    fn an_off_tap_keeps_nothing_and_an_on_tap_keeps_the_first_bytes_with_the_reason() {
        let tap = DropTap::default();
        assert!(!tap.is_on());
        let frame: Vec<u8> = (0..400u32).map(|i| (i % 251) as u8).collect();
        tap.start(false);
        assert!(!tap.wants_punted());
        tap.offer(Some(DropReason::TtlExceeded), &frame);
        tap.offer(Some(DropReason::NoNeighbour), &frame[..60]);
        let a = tap.pop().unwrap();
        assert_eq!((a.reason, a.len, a.caplen), (Some(DropReason::TtlExceeded), 400, 256));
        assert_eq!(a.bytes(), &frame[..256]);
        let b = tap.pop().unwrap();
        assert_eq!((b.reason, b.len, b.bytes()), (Some(DropReason::NoNeighbour), 60, &frame[..60]));
        assert!(tap.pop().is_none());
        tap.start(true);
        assert!(tap.wants_punted());
        tap.stop(true);
        assert!(!tap.wants_punted() && tap.is_on());
        tap.stop(false);
        assert!(!tap.is_on());
    }

    #[test]
    fn sampling_keeps_one_in_n_and_a_full_queue_counts_the_missed_copies() {
        let tap = DropTap::default();
        tap.start(false);
        tap.set_sample(10);
        for _ in 0..100 {
            tap.offer(Some(DropReason::MalformedL4), &[0u8; 64]);
        }
        let mut n = 0;
        while tap.pop().is_some() {
            n += 1;
        }
        assert_eq!(n, 10);
        tap.set_sample(1);
        for _ in 0..QUEUE_LEN + 5 {
            tap.offer(Some(DropReason::MalformedL4), &[0u8; 64]);
        }
        assert_eq!(tap.missed(), 5);
        tap.stop(false);
        assert!(tap.pop().is_none(), "the last monitor to stop empties the queue");
    }
}
