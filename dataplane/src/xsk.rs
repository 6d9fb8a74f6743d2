//! AF_XDP sockets and UMEM: the only module of this crate with `unsafe` code.
//!
//! One [`Xsk`] per worker: a UMEM shared by the worker's sockets, one socket per
//! (interface, queue) the worker serves, and a free list. Every frame descriptor is in
//! exactly one place at any time — the free list, a fill ring, an RX batch being processed
//! (as an [`OwnedFrame`]), or a TX ring — which is what makes the safe API sound: only an
//! [`OwnedFrame`], which is neither `Clone` nor `Copy`, gives access to frame memory, and
//! handing it to [`Xsk::transmit`] or [`Xsk::release`] consumes it. Every frame carries the
//! number of the UMEM it came from, and every method that takes one checks it: a frame handed
//! to another worker's [`Xsk`] (whose UMEM does not contain it, and whose fill ring may hold
//! the same offset) is refused, never touched ([`ForeignFrame`]).
//!
//! The sockets, rings and UMEM are set up here with the kernel's own interface (kernel doc
//! <https://docs.kernel.org/networking/af_xdp.html>, `linux/if_xdp.h`): `socket(AF_XDP)`,
//! `XDP_UMEM_REG` of a memfd-backed area, the ring sizes, `XDP_MMAP_OFFSETS` and `mmap` of
//! the four rings, `bind`. The ring protocol is libxdp's (`xsk.h`: `xsk_prod_nb_free`,
//! `xsk_cons_nb_avail`, submit and release): the other side's index is read with acquire
//! ordering, our own is published with release ordering after the descriptors are written
//! or read. Because the UMEM is a memfd and every ring is a mapping of the socket, a worker
//! can hand its sockets to another process ([`Xsk::export`], [`Xsk::adopt`]): the sockets
//! stay bound (and in the steering program's `XSKMAP`) throughout, so frames wait in the RX
//! ring instead of being dropped (docs/architecture.md, "Hand-over").
//!
//! The UMEM is registered in unaligned chunk mode (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`;
//! [`XskConfig::unaligned_chunks`], on by default), as
//! DPDK's AF_XDP driver registers its own, although every address handed to the kernel is a
//! chunk start or a frame's data: in aligned mode the kernel ties each chunk to its own
//! `xdp_buff_xsk` (`pool->heads[addr >> chunk_shift]` in `xp_alloc`,
//! `net/xdp/xsk_buff_pool.c`), so every received frame touches the descriptor of a chunk last
//! used a fill ring ago, while in unaligned mode it takes one from a stack of free ones
//! (`pool->free_heads`), which copy mode gives back at once: the same few stay in cache.
//! Measured on the core that receives (docs/benchmarks.md, "Unaligned chunks"): `xp_alloc`
//! 24.6 → 12.9 ns per frame. The one difference it makes here: the kernel writes an RX
//! descriptor's address as the chunk start with the data's offset in its top 16 bits
//! (`XSK_UNALIGNED_BUF_OFFSET_SHIFT`), which [`Xsk::receive`] turns back into the data's
//! address (`rx_addr`).
//!
//! Traps found on veth (shared/docs/feasibility.md): copy-mode TX moves at most 32 frames per
//! `sendto()`, so [`Xsk::kick`] repeats until the TX ring drains; frames from the completion
//! ring carry no length, so lengths are always set before transmit; zero-copy is refused
//! (`EOPNOTSUPP`) and the bind falls back to copy mode.
#![allow(unsafe_code, reason = "AF_XDP rings and UMEM: the crate's one unsafe module")]
#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::ffi::CString;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::nat::Packet;

/// How to bind: zero-copy where the driver supports it, else copy mode.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CopyMode {
    /// Try zero-copy, fall back to copy mode on `EOPNOTSUPP` (logged once per socket).
    Auto,
    /// Copy mode only.
    Copy,
    /// Zero-copy only; fail if unsupported.
    ZeroCopy,
}

/// AF_XDP settings of one worker.
#[derive(Clone, Debug)]
pub struct XskConfig {
    /// UMEM frames (shared by the worker's sockets).
    pub frame_count: u32,
    /// UMEM frame size in bytes: a power of two, 2048 or 4096.
    pub frame_size: u32,
    /// Ring sizes (RX, TX, fill, completion), a power of two.
    pub ring_size: u32,
    /// Frames each socket keeps in its fill ring while the worker runs (counting those the
    /// kernel has filled and the worker not yet taken from the RX ring), at most
    /// [`Self::ring_size`]; 0 (the default): the whole ring. The kernel takes one per frame it
    /// receives, and drops what arrives while the ring is empty (`rx_fill_ring_empty_descs`):
    /// the depth is how long a stalled worker can be before frames are lost. In copy mode the
    /// kernel copies each frame into its fill frame on the core that runs the queue's NAPI;
    /// the fill ring is first in, first out, so a shallower ring means fewer UMEM frames
    /// taking turns, and that copy measured up to three times cheaper with 512 than with the
    /// whole ring, for a few percent more packets at full load, but it made the worker lose
    /// frames at every offered rate on the test machine (docs/benchmarks.md, "The generator's
    /// core"). Before the worker sleeps in `poll(2)` it tops the rings up to their whole size
    /// whatever this says ([`Xsk::refill_whole`]).
    pub fill_frames: u32,
    /// Zero-copy policy.
    pub copy_mode: CopyMode,
    /// Use the `XDP_USE_NEED_WAKEUP` protocol (interrupt-driven; kernel ≥ 5.4). With it off,
    /// the worker busy-polls.
    pub need_wakeup: bool,
    /// Attach a default program to each interface (through a BPF link that goes away with
    /// the [`Xsk`]): it redirects *all* traffic of the sockets' queues to them (an `XSKMAP`
    /// lookup by `rx_queue_index`, passing to the kernel what has no socket), like libxdp's
    /// `xsk_def_xdp_prog`. Only for the benchmark tools without xlb's steering program; xlb
    /// itself sets this to `false`. Fails (`EBUSY`) on an interface that has an XDP program.
    pub load_default_program: bool,
    /// With `load_default_program`, attach in SKB (generic) mode instead of native mode.
    pub skb_mode: bool,
    /// Preferred busy polling (kernel doc af_xdp.rst, "XDP_USE_NEED_WAKEUP" and
    /// Documentation/networking/napi.rst "Busy polling"): sets `SO_PREFER_BUSY_POLL`,
    /// `SO_BUSY_POLL` and `SO_BUSY_POLL_BUDGET` on every socket, and [`Xsk::receive`] /
    /// [`Xsk::kick`] drive the queue's NAPI from the worker with `recvfrom`/`sendto`, so the
    /// worker and its queue's softirq work share a core without starving each other. `None`:
    /// plain sockets.
    pub busy_poll: Option<BusyPoll>,
    /// Try to back the UMEM with huge pages (a `MFD_HUGETLB` memfd, memfd_create(2); needs
    /// reserved pages, `vm.nr_hugepages`); falls back to normal pages quietly (logged once).
    pub huge_pages: bool,
    /// Register the UMEM in unaligned chunk mode (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`, kernel doc
    /// af_xdp.rst; see the module docs for why; default true). `false`: aligned mode, for a
    /// driver whose zero-copy support of unaligned chunks is in doubt. Either way the frames
    /// and addresses are the same; an adopted UMEM keeps the mode it was registered in.
    pub unaligned_chunks: bool,
}

/// The ring sizes (entries of each of RX, TX, fill and completion) that xlb's `afXdp.ringSize`
/// and `xlb-macfwd --ring-size` accept, when a power of two ([`ring_size_ok`]). What a deeper
/// ring buys and costs: docs/benchmarks.md, "Deeper rings against the worker's stalls".
pub const RING_SIZES: core::ops::RangeInclusive<u32> = 64..=16384;

/// Whether `n` is a power of two in [`RING_SIZES`].
#[must_use]
pub fn ring_size_ok(n: u32) -> bool {
    n.is_power_of_two() && RING_SIZES.contains(&n)
}

/// Whether `frames` UMEM frames are enough for rings of `ring_size` entries: at least twice the
/// ring (a full fill ring, and as many again for frames being received, processed or sent).
/// The rule of xlb's `afXdp.frames` and `xlb-macfwd --frames`.
#[must_use]
pub fn frames_ok(frames: u32, ring_size: u32) -> bool {
    u64::from(frames) >= 2 * u64::from(ring_size)
}

/// Frames a fill ring kept at `depth` may lack before [`Xsk::refill`] tops it up: an eighth
/// of the depth, at least 1, at most 64 (one batch); 64 of the default 2,048 is 3 %.
#[must_use]
pub fn refill_slack(depth: usize) -> usize {
    (depth / 8).clamp(1, 64)
}

/// The fill ring depth of a socket with [`XskConfig::fill_frames`] `fill_frames` and rings of
/// `ring_size` entries: `fill_frames`, or the whole ring for 0; never more than the ring.
#[must_use]
pub fn fill_depth(fill_frames: u32, ring_size: u32) -> u32 {
    match fill_frames {
        0 => ring_size,
        n => n.min(ring_size),
    }
}

/// Busy-poll settings of a socket (`socket(7)`: `SO_BUSY_POLL`, `SO_PREFER_BUSY_POLL`,
/// `SO_BUSY_POLL_BUDGET`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BusyPoll {
    /// How long one busy-poll call may spin waiting for packets, in microseconds
    /// (`SO_BUSY_POLL`).
    pub usecs: u32,
    /// Packets one NAPI poll may process (`SO_BUSY_POLL_BUDGET`; the kernel's default is 8).
    pub budget: u16,
}

impl Default for BusyPoll {
    /// 20 µs and a budget of 64, the values the kernel's AF_XDP documentation and xdpsock use.
    fn default() -> Self {
        Self { usecs: 20, budget: 64 }
    }
}

impl Default for XskConfig {
    fn default() -> Self {
        Self {
            frame_count: 8192,
            frame_size: 2048,
            ring_size: 2048,
            fill_frames: 0,
            copy_mode: CopyMode::Auto,
            need_wakeup: true,
            load_default_program: false,
            skb_mode: false,
            busy_poll: None,
            huge_pages: true,
            unaligned_chunks: true,
        }
    }
}

/// Why a socket or UMEM could not be set up, or a handed-over one adopted.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    /// A size in the configuration is not acceptable.
    #[error("bad AF_XDP configuration: {0}")]
    Config(String),
    /// UMEM creation failed (memfd_create(2), ftruncate(2), mmap(2)).
    #[error("creating the UMEM ({frames} frames of {size} bytes): {source}")]
    Umem {
        /// Frames.
        frames: u32,
        /// Frame size in bytes.
        size: u32,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Socket creation, UMEM registration, ring setup or bind failed.
    #[error("binding an AF_XDP socket to {ifname} queue {queue} ({mode}): {step}: {source}")]
    Socket {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// Mode tried.
        mode: &'static str,
        /// The step that failed (`socket`, `XDP_UMEM_REG`, `mmap fill ring`, `bind`, ...).
        step: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A socket option could not be set.
    #[error("setting {option} on the AF_XDP socket of {ifname} queue {queue}: {source}")]
    SocketOption {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// The option (`SO_BUSY_POLL`, ...).
        option: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The default program ([`XskConfig::load_default_program`]) could not be loaded or
    /// attached.
    #[error("default XDP program on {ifname}: {step}: {source}")]
    Program {
        /// Interface.
        ifname: String,
        /// The step that failed (`map`, `load`, `attach`, `map update`).
        step: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A handed-over state ([`XskState`]) or its descriptors do not fit together; nothing
    /// was mapped.
    #[error("adopting handed-over AF_XDP sockets: {0}")]
    Adopt(String),
}

/// One mapping (mmap(2)), unmapped on drop.
struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory; who may touch which bytes is governed by the rings and
// frame ownership of the `Xsk` that holds it, not by the thread it is on.
unsafe impl Send for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` at `offset`, shared, readable and writable.
    fn map(fd: BorrowedFd<'_>, len: usize, offset: u64, flags: libc::c_int) -> std::io::Result<Self> {
        let offset = libc::off_t::try_from(offset).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a fresh mapping at an address the kernel picks: no existing Rust object is
        // aliased; `fd` is open for the duration of the call.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | flags,
                fd.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        NonNull::new(p.cast::<u8>()).map(|ptr| Self { ptr, len }).ok_or_else(std::io::Error::last_os_error)
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly one mapping made by `Mmap::map`; nothing borrows it
        // any more (rings and frames borrow the `Xsk` that owns it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The UMEM: a memfd of `frames * frame_size` bytes mapped once.
struct Umem {
    fd: OwnedFd,
    area: Mmap,
    frame_size: u32,
    frames: u32,
    huge: bool,
}

impl Umem {
    /// A new memfd-backed area (memfd_create(2); `MFD_HUGETLB` first when `huge`).
    fn create(frames: u32, frame_size: u32, huge: bool) -> Result<Self, XskError> {
        let err = |source| XskError::Umem { frames, size: frame_size, source };
        let len = usize::try_from(u64::from(frames) * u64::from(frame_size))
            .map_err(|_| XskError::Config("UMEM larger than the address space".into()))?;
        let attempts: &[bool] = if huge { &[true, false] } else { &[false] };
        let mut last = None;
        for &h in attempts {
            let name = c"xlb-umem";
            let flags = libc::MFD_CLOEXEC | if h { libc::MFD_HUGETLB } else { 0 };
            // SAFETY: `name` is a NUL-terminated string; memfd_create returns a new fd or -1.
            let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
            if raw < 0 {
                last = Some(std::io::Error::last_os_error());
                continue;
            }
            // SAFETY: `raw` is a new descriptor nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // Huge pages: the size must be a multiple of the huge page size (2 MiB here).
            let size = if h { len.next_multiple_of(2 << 20) } else { len };
            let Ok(size_off) = libc::off_t::try_from(size) else {
                return Err(err(std::io::ErrorKind::InvalidInput.into()));
            };
            // SAFETY: plain system call on our descriptor.
            if unsafe { libc::ftruncate(fd.as_raw_fd(), size_off) } != 0 {
                last = Some(std::io::Error::last_os_error());
                continue;
            }
            match Mmap::map(fd.as_fd(), size, 0, libc::MAP_POPULATE) {
                Ok(area) => return Ok(Self { fd, area, frame_size, frames, huge: h }),
                Err(e) => last = Some(e),
            }
        }
        Err(err(last.unwrap_or_else(|| std::io::ErrorKind::Other.into())))
    }

    /// Maps a UMEM memfd handed over by another process (its frames as they are).
    fn adopt(fd: OwnedFd, frames: u32, frame_size: u32, huge: bool) -> Result<Self, XskError> {
        let len = usize::try_from(u64::from(frames) * u64::from(frame_size))
            .map_err(|_| XskError::Adopt("UMEM larger than the address space".into()))?;
        // SAFETY: an all-zero `stat` is a valid value that fstat overwrites.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `st` is a valid, writable stat buffer; the fd is open.
        if unsafe { libc::fstat(fd.as_raw_fd(), &raw mut st) } != 0 {
            return Err(XskError::Adopt(format!("fstat of the UMEM memfd: {}", std::io::Error::last_os_error())));
        }
        let size = usize::try_from(st.st_size).unwrap_or(0);
        if size < len {
            return Err(XskError::Adopt(format!("UMEM memfd holds {size} bytes, the state says {len}")));
        }
        let area = Mmap::map(fd.as_fd(), size, 0, libc::MAP_POPULATE)
            .map_err(|e| XskError::Adopt(format!("mmap of the UMEM memfd: {e}")))?;
        Ok(Self { fd, area, frame_size, frames, huge })
    }

    /// Bytes of the frames (the area may be longer: huge page rounding).
    fn len(&self) -> u64 {
        u64::from(self.frames) * u64::from(self.frame_size)
    }

    /// The offset and length of the segment of frame address `addr`: from `addr` to the end
    /// of its frame. `(0, 0)` for an address outside the UMEM.
    #[inline]
    fn segment(&self, addr: u64) -> (usize, usize) {
        if addr >= self.len() {
            return (0, 0);
        }
        let end = (addr | u64::from(self.frame_size - 1)) + 1;
        (usize::try_from(addr).unwrap_or(0), usize::try_from(end - addr).unwrap_or(0))
    }

    /// The offset and length of the frame (chunk) holding address `addr`, and `addr`'s
    /// offset in it: the whole frame, the headroom before `addr` included. `(0, 0, 0)` for an
    /// address outside the UMEM.
    #[inline]
    fn chunk(&self, addr: u64) -> (usize, usize, usize) {
        if addr >= self.len() {
            return (0, 0, 0);
        }
        let base = self.base(addr);
        let (off, head) = (usize::try_from(base).unwrap_or(0), usize::try_from(addr - base).unwrap_or(0));
        (off, self.frame_size as usize, head)
    }

    /// The frame (chunk) start of `addr`: what the fill ring takes.
    #[inline]
    fn base(&self, addr: u64) -> u64 {
        addr & !u64::from(self.frame_size - 1)
    }
}

/// Where packet `p` lies in its buffer (a whole UMEM frame), as (head, length), both clamped
/// to the buffer, the head to its last byte: a frame's address is its UMEM frame's start plus
/// the head, and a head at the buffer's end would be the next UMEM frame's start (a packet
/// emptied to the end of its buffer is an empty frame at its last byte).
#[inline]
fn span_of(p: &Packet<'_>) -> (usize, usize) {
    let head = p.head.min(p.buf.len().saturating_sub(1));
    (head, p.len.min(p.buf.len().saturating_sub(head)))
}

/// The data address (byte offset into the UMEM) of an RX descriptor's `addr`: in unaligned
/// chunk mode the kernel writes the chunk start in the low 48 bits and the data's offset from
/// it in the top 16 (`XSK_UNALIGNED_BUF_OFFSET_SHIFT`, `xp_get_handle` in
/// `net/xdp/xsk_buff_pool.c`; libxdp's `xsk_umem__add_offset_to_addr`). An address without
/// an offset (aligned mode) is returned as it is.
#[inline]
fn rx_addr(a: u64) -> u64 {
    (a & ((1 << UNALIGNED_OFFSET_SHIFT) - 1)) + (a >> UNALIGNED_OFFSET_SHIFT)
}

/// `XSK_UNALIGNED_BUF_OFFSET_SHIFT` of `linux/if_xdp.h`.
const UNALIGNED_OFFSET_SHIFT: u32 = 48;

/// A ring entry: a frame address (fill, completion) or a descriptor (RX, TX).
trait Entry: Copy + Default {}
impl Entry for u64 {}

/// `struct xdp_desc` of `linux/if_xdp.h`: frame address, length in bytes, options.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
struct Desc {
    addr: u64,
    len: u32,
    options: u32,
}
impl Entry for Desc {}

/// One mapped ring and our side's cached indices (libxdp's `xsk_ring_prod`/`xsk_ring_cons`).
/// We are the only producer of fill and TX rings and the only consumer of RX and completion
/// rings; the kernel is the other side.
struct Ring<T: Entry> {
    map: Mmap,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    entries: NonNull<T>,
    mask: u32,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
    _t: PhantomData<T>,
}

// SAFETY: the ring's memory is a mapping owned by the ring (`map`); the pointers point into
// it. The ring is used by one thread at a time (`&mut self` for every index change).
unsafe impl<T: Entry> Send for Ring<T> {}

impl<T: Entry> Ring<T> {
    /// Maps ring `pgoff` of socket `fd` with `size` entries at the offsets the kernel gave
    /// (`XDP_MMAP_OFFSETS`), and reads its indices as they are (a fresh ring or one another
    /// process used: the same rule, libxdp's `xsk_umem__create`/`xsk_socket__create`).
    fn map(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: u64,
        producer: bool,
    ) -> std::io::Result<Self> {
        let bad = || std::io::Error::from_raw_os_error(libc::EINVAL);
        let desc = usize::try_from(off.desc).map_err(|_| bad())?;
        let len = desc + size as usize * core::mem::size_of::<T>();
        for o in [off.producer, off.consumer, off.flags] {
            if o % 4 != 0 || usize::try_from(o).map_err(|_| bad())? + 4 > len {
                return Err(bad());
            }
        }
        if desc % core::mem::align_of::<T>() != 0 {
            return Err(bad());
        }
        let map = Mmap::map(fd, len, pgoff, libc::MAP_POPULATE)?;
        let at = |o: u64| -> NonNull<AtomicU32> {
            // SAFETY: `o + 4 <= len` and `o` is 4-aligned (checked above), inside the mapping,
            // which is page-aligned.
            unsafe { map.ptr.add(o as usize).cast::<AtomicU32>() }
        };
        let (p, c, f) = (at(off.producer), at(off.consumer), at(off.flags));
        // SAFETY: `desc` plus `size` entries is inside the mapping and aligned (checked above).
        let entries = unsafe { map.ptr.add(desc).cast::<T>() };
        // SAFETY: `p` and `c` point to the ring's live index words (shared with the kernel,
        // only ever accessed atomically).
        let (prod, cons) = unsafe { (p.as_ref().load(Ordering::Acquire), c.as_ref().load(Ordering::Acquire)) };
        Ok(Self {
            map,
            producer: p,
            consumer: c,
            flags: f,
            entries,
            mask: size - 1,
            size,
            cached_prod: prod,
            cached_cons: if producer { cons.wrapping_add(size) } else { cons },
            _t: PhantomData,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into `self.map`, alive as long as `self`; only accessed atomically.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as `producer`.
        unsafe { self.consumer.as_ref() }
    }

    /// Whether the kernel asks to be woken (`XDP_RING_NEED_WAKEUP` in the ring's flags).
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as `producer`.
        unsafe { self.flags.as_ref() }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Producer side: free entries, at least `want` if there are (libxdp `xsk_prod_nb_free`).
    fn nb_free(&mut self, want: u32) -> u32 {
        let free = self.cached_cons.wrapping_sub(self.cached_prod);
        if free >= want {
            return free;
        }
        self.cached_cons = self.consumer().load(Ordering::Acquire).wrapping_add(self.size);
        self.cached_cons.wrapping_sub(self.cached_prod)
    }

    /// Producer side: writes as many of `items` as fit and publishes them (release).
    ///
    /// # Safety
    /// Every item must be a frame of this ring's UMEM that nobody else references (it now
    /// belongs to the kernel until it comes back through the RX or completion ring).
    unsafe fn produce(&mut self, items: &[T]) -> usize {
        let n = self
            .nb_free(u32::try_from(items.len()).unwrap_or(u32::MAX))
            .min(u32::try_from(items.len()).unwrap_or(u32::MAX));
        for (i, it) in items.iter().take(n as usize).enumerate() {
            let idx = self.cached_prod.wrapping_add(i as u32) & self.mask;
            // SAFETY: `idx <= mask < size`: inside the entries of the mapping; the entry is
            // free (between the kernel's consumer and our producer) so the kernel does not
            // read it until we publish.
            unsafe { self.entries.add(idx as usize).as_ptr().write(*it) };
        }
        self.cached_prod = self.cached_prod.wrapping_add(n);
        self.producer().store(self.cached_prod, Ordering::Release);
        n as usize
    }

    /// Consumer side: entries ready, up to `want` (libxdp `xsk_cons_nb_avail`).
    fn nb_avail(&mut self, want: u32) -> u32 {
        let mut avail = self.cached_prod.wrapping_sub(self.cached_cons);
        if avail == 0 {
            self.cached_prod = self.producer().load(Ordering::Acquire);
            avail = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        avail.min(want)
    }

    /// Consumer side: hands up to `want` entries to `take`, in ring order, and releases them
    /// to the kernel (release); returns how many. The RX ring's descriptors become
    /// `OwnedFrame`s and the completion ring's addresses go onto the free list this way, with
    /// no buffer between the ring and where they go.
    ///
    /// # Safety
    /// The caller takes ownership of the frames read (they left the kernel).
    unsafe fn consume(&mut self, want: u32, mut take: impl FnMut(T)) -> usize {
        let n = self.nb_avail(want);
        for i in 0..n {
            let idx = self.cached_cons.wrapping_add(i) & self.mask;
            // SAFETY: `idx < size`: inside the mapping; the entry was published by the kernel
            // (before its producer index, read with acquire) and is not rewritten before we
            // release it below.
            take(unsafe { self.entries.add(idx as usize).as_ptr().read() });
        }
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.consumer().store(self.cached_cons, Ordering::Release);
        n as usize
    }

    /// Entries between the two indices as our side last saw them (for tests and checks).
    fn pending(&self) -> u32 {
        let (p, c) = (self.producer().load(Ordering::Acquire), self.consumer().load(Ordering::Acquire));
        let _ = &self.map;
        p.wrapping_sub(c)
    }
}

/// A new `AF_XDP` socket (`socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0)`).
fn xdp_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain system call; returns a new descriptor or -1.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `setsockopt(fd, SOL_XDP, opt, &value)` for a plain value (`int` ring size, `xdp_umem_reg`).
fn set_xdp_opt<V: Copy>(fd: BorrowedFd<'_>, opt: libc::c_int, value: &V) -> std::io::Result<()> {
    // SAFETY: `value` is a valid `V` for the duration of the call, and its size is passed
    // with it; setsockopt only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            core::ptr::from_ref(value).cast::<libc::c_void>(),
            core::mem::size_of::<V>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// `getsockopt(fd, SOL_XDP, opt)` into a `V`; `Err` unless the kernel wrote exactly
/// `size_of::<V>()` bytes (the current layout of `xdp_mmap_offsets`, `xdp_statistics`,
/// `xdp_options`).
fn get_xdp_opt<V: Copy>(fd: BorrowedFd<'_>, opt: libc::c_int, zero: V) -> std::io::Result<V> {
    let mut v = zero;
    let mut len = core::mem::size_of::<V>() as libc::socklen_t;
    // SAFETY: `v` is a valid, writable `V` of `len` bytes; the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_XDP, opt, core::ptr::from_mut(&mut v).cast(), &raw mut len)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if len as usize != core::mem::size_of::<V>() {
        return Err(std::io::Error::other(format!(
            "getsockopt({opt}) returned {len} bytes, expected {}",
            core::mem::size_of::<V>()
        )));
    }
    Ok(v)
}

/// The four rings of a socket, mapped (after the sizes were set, or on a bound socket).
struct Rings {
    rx: Ring<Desc>,
    tx: Ring<Desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
}

impl Rings {
    fn map(fd: BorrowedFd<'_>, size: u32) -> Result<Self, (&'static str, std::io::Error)> {
        // SAFETY: `xdp_mmap_offsets` is plain integers; all-zero is a valid value.
        let zero: libc::xdp_mmap_offsets = unsafe { core::mem::zeroed() };
        let off = get_xdp_opt(fd, libc::XDP_MMAP_OFFSETS, zero).map_err(|e| ("XDP_MMAP_OFFSETS", e))?;
        Ok(Self {
            rx: Ring::map(fd, &off.rx, size, libc::XDP_PGOFF_RX_RING as u64, false).map_err(|e| ("mmap RX ring", e))?,
            tx: Ring::map(fd, &off.tx, size, libc::XDP_PGOFF_TX_RING as u64, true).map_err(|e| ("mmap TX ring", e))?,
            fill: Ring::map(fd, &off.fr, size, libc::XDP_UMEM_PGOFF_FILL_RING, true)
                .map_err(|e| ("mmap fill ring", e))?,
            comp: Ring::map(fd, &off.cr, size, libc::XDP_UMEM_PGOFF_COMPLETION_RING, false)
                .map_err(|e| ("mmap completion ring", e))?,
        })
    }
}

/// One bound socket. Field order: the rings (mappings of the socket) before the socket.
struct Port {
    ifname: String,
    queue: u32,
    rings: Rings,
    fd: OwnedFd,
    zero_copy: bool,
    in_fill: usize,
    in_tx: usize,
}

impl core::fmt::Debug for Port {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Port")
            .field("ifname", &self.ifname)
            .field("queue", &self.queue)
            .field("fd", &self.fd)
            .field("zero_copy", &self.zero_copy)
            .field("in_fill", &self.in_fill)
            .field("in_tx", &self.in_tx)
            .finish_non_exhaustive()
    }
}

/// `sendto(fd, NULL, 0, MSG_DONTWAIT)`: makes the kernel send what is in the TX ring (copy
/// mode: at most 32 frames per call) or wakes the driver (kernel doc af_xdp.rst,
/// "XDP_USE_NEED_WAKEUP"). Errors (`EAGAIN`, `EBUSY`, `ENOBUFS`) mean "try again later".
fn send_wakeup(fd: RawFd) {
    // SAFETY: a zero-length send with a null buffer and no address: the kernel reads nothing
    // of our memory (xsk_sendmsg ignores the buffer).
    let _ = unsafe { libc::sendto(fd, core::ptr::null(), 0, libc::MSG_DONTWAIT, core::ptr::null(), 0) };
}

/// A default program attached through a BPF link ([`XskConfig::load_default_program`]):
/// detached when the link's descriptor closes.
#[derive(Debug)]
struct DefaultProgram {
    _link: OwnedFd,
    _prog: OwnedFd,
    map: OwnedFd,
}

/// One BPF instruction (`struct bpf_insn`: code, dst/src registers in one byte, offset,
/// immediate).
#[repr(C)]
#[derive(Copy, Clone)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

impl DefaultProgram {
    /// Loads and attaches `r2 = ctx->rx_queue_index; return bpf_redirect_map(&xsks, r2,
    /// XDP_PASS)` on `ifname` (libxdp's `xsk_def_xdp_prog_5.3`; bpf-helpers(7)
    /// `bpf_redirect_map`: the low bits of the flags are the action when the slot is empty).
    fn attach(ifname: &str, ifindex: u32, skb_mode: bool) -> Result<Self, XskError> {
        let err = |step, source| XskError::Program { ifname: ifname.to_owned(), step, source };
        let fd_of = |rc: libc::c_int, step| {
            if rc < 0 {
                Err(err(step, std::io::Error::from_raw_os_error(-rc)))
            } else {
                // SAFETY: libbpf returned a new descriptor nothing else owns.
                Ok(unsafe { OwnedFd::from_raw_fd(rc) })
            }
        };
        // SAFETY: a NUL-terminated name; a null options pointer means defaults.
        let map = fd_of(
            unsafe {
                libbpf_sys::bpf_map_create(
                    libbpf_sys::BPF_MAP_TYPE_XSKMAP,
                    c"xsks_map".as_ptr(),
                    4,
                    4,
                    64,
                    core::ptr::null(),
                )
            },
            "map",
        )?;
        let insns = [
            // r2 = *(u32 *)(r1 + 16): xdp_md.rx_queue_index
            Insn { code: 0x61, regs: 0x12, off: 16, imm: 0 },
            // r1 = map (ld_imm64, BPF_PSEUDO_MAP_FD)
            Insn { code: 0x18, regs: 0x11, off: 0, imm: map.as_raw_fd() },
            Insn { code: 0, regs: 0, off: 0, imm: 0 },
            // r3 = XDP_PASS
            Insn { code: 0xb7, regs: 0x03, off: 0, imm: 2 },
            // call bpf_redirect_map
            Insn { code: 0x85, regs: 0, off: 0, imm: 51 },
            // exit
            Insn { code: 0x95, regs: 0, off: 0, imm: 0 },
        ];
        // SAFETY: `insns` is an array of `struct bpf_insn`-layout instructions whose length
        // is passed with it; the strings are NUL-terminated; null options mean defaults.
        let prog = fd_of(
            unsafe {
                libbpf_sys::bpf_prog_load(
                    libbpf_sys::BPF_PROG_TYPE_XDP,
                    c"xsk_default".as_ptr(),
                    c"GPL".as_ptr(),
                    insns.as_ptr().cast::<libbpf_sys::bpf_insn>(),
                    insns.len() as _,
                    core::ptr::null_mut(),
                )
            },
            "load",
        )?;
        // SAFETY: `bpf_link_create_opts` is plain data; all-zero is its default.
        let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { core::mem::zeroed() };
        opts.sz = core::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
        opts.flags = if skb_mode { libbpf_sys::XDP_FLAGS_SKB_MODE } else { libbpf_sys::XDP_FLAGS_DRV_MODE };
        let target =
            libc::c_int::try_from(ifindex).map_err(|_| err("attach", std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: valid descriptors, and `opts` initialised with its own size.
        let link = fd_of(
            unsafe { libbpf_sys::bpf_link_create(prog.as_raw_fd(), target, libbpf_sys::BPF_XDP, &raw const opts) },
            "attach",
        )?;
        Ok(Self { _link: link, _prog: prog, map })
    }

    /// Puts socket `fd` in the slot of `queue`.
    fn insert(&self, ifname: &str, queue: u32, fd: BorrowedFd<'_>) -> Result<(), XskError> {
        let value: u32 = u32::try_from(fd.as_raw_fd()).unwrap_or(0);
        // SAFETY: key and value point to 4-byte integers, the map's key and value sizes.
        let rc = unsafe {
            libbpf_sys::bpf_map_update_elem(
                self.map.as_raw_fd(),
                core::ptr::from_ref(&queue).cast(),
                core::ptr::from_ref(&value).cast(),
                0,
            )
        };
        if rc < 0 {
            return Err(XskError::Program {
                ifname: ifname.to_owned(),
                step: "map update",
                source: std::io::Error::from_raw_os_error(-rc),
            });
        }
        Ok(())
    }
}

/// A received frame, owned by the worker until transmitted or released. It belongs to the
/// UMEM of the [`Xsk`] that produced it; other `Xsk`s refuse it.
#[derive(Debug)]
pub struct OwnedFrame {
    addr: u64,
    len: u32,
    umem: u32,
}

/// A frame given to an [`Xsk`] that did not produce it (it lives in another UMEM). The frame
/// is handed back untouched; the caller must return it to its own `Xsk`.
#[derive(Debug, thiserror::Error)]
#[error("frame of UMEM {frame_umem} given to the sockets of UMEM {xsk_umem}")]
pub struct ForeignFrame {
    /// The refused frame.
    pub frame: OwnedFrame,
    /// The UMEM the frame belongs to.
    pub frame_umem: u32,
    /// The UMEM of the `Xsk` that refused it.
    pub xsk_umem: u32,
}

/// How often [`Xsk::transmit`] kicks and retries a full TX ring before dropping.
const TX_RETRIES: usize = 4;

/// Which UMEMs a refused batch mixed up ([`Xsk::with_batch`]); the frames stay with the caller.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("frame of UMEM {frame_umem} given to the sockets of UMEM {xsk_umem}")]
pub struct ForeignWitness {
    /// The UMEM of the first foreign frame.
    pub frame_umem: u32,
    /// The UMEM of the `Xsk` that refused it.
    pub xsk_umem: u32,
}

/// Numbers the UMEMs of the process, so that frames can say which one they belong to.
static NEXT_UMEM: AtomicU32 = AtomicU32::new(1);

impl OwnedFrame {
    /// Frame length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// Whether the frame is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The kernel's counters of one AF_XDP socket (`getsockopt(SOL_XDP, XDP_STATISTICS)`,
/// `struct xdp_statistics` of `linux/if_xdp.h`; kernel doc af_xdp.rst "XDP_STATISTICS
/// getsockopt"). Cumulative since the socket was bound, in frames (descriptors).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Frames dropped for other reasons than a full RX ring (`rx_dropped`), e.g. a frame
    /// larger than the UMEM frame.
    pub rx_dropped: u64,
    /// Frames dropped because the RX ring was full (`rx_ring_full`): the worker did not keep up.
    pub rx_ring_full: u64,
    /// Frames dropped because the fill ring was empty (`rx_fill_ring_empty_descs`): no free
    /// UMEM frame to receive into.
    pub rx_fill_ring_empty: u64,
    /// RX descriptors the kernel found invalid (`rx_invalid_descs`).
    pub rx_invalid_descs: u64,
    /// TX descriptors the kernel found invalid (`tx_invalid_descs`).
    pub tx_invalid_descs: u64,
    /// Times the kernel found the TX ring empty when asked to send (`tx_ring_empty_descs`).
    pub tx_ring_empty: u64,
}

impl SocketStats {
    /// Field-wise sum (a worker's sockets together).
    #[must_use]
    pub fn sum(self, o: Self) -> Self {
        Self {
            rx_dropped: self.rx_dropped + o.rx_dropped,
            rx_ring_full: self.rx_ring_full + o.rx_ring_full,
            rx_fill_ring_empty: self.rx_fill_ring_empty + o.rx_fill_ring_empty,
            rx_invalid_descs: self.rx_invalid_descs + o.rx_invalid_descs,
            tx_invalid_descs: self.tx_invalid_descs + o.tx_invalid_descs,
            tx_ring_empty: self.tx_ring_empty + o.tx_ring_empty,
        }
    }
}

/// A worker's UMEM and sockets. Field order: the sockets (whose rings are mappings) before
/// the UMEM.
#[derive(Debug)]
pub struct Xsk {
    ports: Vec<Port>,
    programs: Vec<DefaultProgram>,
    umem: Umem,
    free: Vec<u64>,
    total: usize,
    scratch: Vec<Desc>,
    addrs: Vec<u64>,
    ring_size: u32,
    /// [`XskConfig::fill_frames`].
    fill_frames: u32,
    need_wakeup: bool,
    busy_poll: bool,
    id: u32,
}

impl core::fmt::Debug for Umem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Umem")
            .field("fd", &self.fd)
            .field("frames", &self.frames)
            .field("frame_size", &self.frame_size)
            .field("huge", &self.huge)
            .finish_non_exhaustive()
    }
}

/// One socket of a handed-over [`XskState`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortState {
    /// Interface name.
    pub ifname: String,
    /// Queue id.
    pub queue: u32,
    /// Bound in zero-copy mode.
    pub zero_copy: bool,
    /// Frames the exporting process had given to the fill ring and not yet taken back from
    /// the RX ring.
    pub in_fill: u32,
    /// Frames it had put in the TX ring and not yet taken back from the completion ring.
    pub in_tx: u32,
}

/// What a process needs, besides the descriptors ([`XskExport`]), to carry on with another
/// process's sockets: the UMEM's geometry, the sockets in port order, and the frames that
/// were free (owned by userspace) when the exporter stopped. Every other frame is in a ring,
/// where the rings' indices (shared memory) say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XskState {
    /// UMEM frames.
    pub frame_count: u32,
    /// UMEM frame size in bytes.
    pub frame_size: u32,
    /// Entries of each ring.
    pub ring_size: u32,
    /// The sockets were bound with `XDP_USE_NEED_WAKEUP`.
    pub need_wakeup: bool,
    /// The UMEM memfd has huge pages.
    pub huge_pages: bool,
    /// The sockets, in port order.
    pub ports: Vec<PortState>,
    /// Free frames: addresses (byte offsets into the UMEM).
    pub free: Vec<u64>,
}

/// An exported [`Xsk`]: its state and its descriptors, the UMEM's memfd and the sockets in
/// port order. Dropping it closes them (the sockets then leave the `XSKMAP`s).
#[derive(Debug)]
pub struct XskExport {
    /// Geometry, sockets and free frames.
    pub state: XskState,
    /// The UMEM's memfd.
    pub umem: OwnedFd,
    /// The bound sockets, in port order.
    pub sockets: Vec<OwnedFd>,
}

/// Magic of an encoded [`XskState`] list ("XLBX").
const STATE_MAGIC: u32 = 0x584C_4258;

impl XskState {
    /// Appends the state to `out` (native byte order: both processes are on one machine).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&STATE_MAGIC.to_ne_bytes());
        for v in
            [self.frame_count, self.frame_size, self.ring_size, u32::from(self.need_wakeup), u32::from(self.huge_pages)]
        {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        out.extend_from_slice(&u32::try_from(self.ports.len()).unwrap_or(u32::MAX).to_ne_bytes());
        for p in &self.ports {
            out.extend_from_slice(&u32::try_from(p.ifname.len()).unwrap_or(u32::MAX).to_ne_bytes());
            out.extend_from_slice(p.ifname.as_bytes());
            for v in [p.queue, u32::from(p.zero_copy), p.in_fill, p.in_tx] {
                out.extend_from_slice(&v.to_ne_bytes());
            }
        }
        out.extend_from_slice(&u32::try_from(self.free.len()).unwrap_or(u32::MAX).to_ne_bytes());
        for a in &self.free {
            out.extend_from_slice(&a.to_ne_bytes());
        }
    }

    /// Reads one state from the front of `input` and advances it past.
    ///
    /// # Errors
    /// [`XskError::Adopt`] for a wrong magic or truncated input.
    pub fn decode(input: &mut &[u8]) -> Result<Self, XskError> {
        fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], XskError> {
            if input.len() < n {
                return Err(XskError::Adopt("AF_XDP state truncated".into()));
            }
            let (a, b) = input.split_at(n);
            *input = b;
            Ok(a)
        }
        fn u32_(input: &mut &[u8]) -> Result<u32, XskError> {
            let (b, rest) =
                input.split_first_chunk::<4>().ok_or_else(|| XskError::Adopt("AF_XDP state truncated".into()))?;
            *input = rest;
            Ok(u32::from_ne_bytes(*b))
        }
        if u32_(input)? != STATE_MAGIC {
            return Err(XskError::Adopt("AF_XDP state: wrong magic".into()));
        }
        let (frame_count, frame_size, ring_size) = (u32_(input)?, u32_(input)?, u32_(input)?);
        let (need_wakeup, huge_pages) = (u32_(input)? != 0, u32_(input)? != 0);
        let n = u32_(input)? as usize;
        let mut ports = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let l = u32_(input)? as usize;
            let ifname = String::from_utf8(take(input, l)?.to_vec())
                .map_err(|_| XskError::Adopt("AF_XDP state: interface name not UTF-8".into()))?;
            let (queue, zero_copy, in_fill, in_tx) = (u32_(input)?, u32_(input)? != 0, u32_(input)?, u32_(input)?);
            ports.push(PortState { ifname, queue, zero_copy, in_fill, in_tx });
        }
        let n = u32_(input)? as usize;
        let bytes = take(input, n.checked_mul(8).ok_or_else(|| XskError::Adopt("AF_XDP state: free list".into()))?)?;
        let free = bytes.as_chunks::<8>().0.iter().map(|c| u64::from_ne_bytes(*c)).collect();
        Ok(Self { frame_count, frame_size, ring_size, need_wakeup, huge_pages, ports, free })
    }
}

/// The `ifindex` of `ifname` (if_nametoindex(3)).
fn ifindex(ifname: &str) -> std::io::Result<u32> {
    let name = CString::new(ifname).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated string, only read.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if i == 0 { Err(std::io::Error::last_os_error()) } else { Ok(i) }
}

impl Xsk {
    /// Creates the UMEM (a memfd) and binds one socket per `(interface, queue)`, in port
    /// order: the first registers the UMEM (`XDP_UMEM_REG`), the others share it
    /// (`XDP_SHARED_UMEM`, each with its own fill and completion rings).
    ///
    /// # Errors
    /// [`XskError`] naming the interface, queue and step (e.g. no such interface, no
    /// permission, `EOPNOTSUPP` for forced zero-copy).
    pub fn open(cfg: &XskConfig, ports: &[(String, u32)]) -> Result<Self, XskError> {
        if cfg.frame_count == 0 {
            return Err(XskError::Config("frame_count 0".into()));
        }
        if !matches!(cfg.frame_size, 2048 | 4096) {
            return Err(XskError::Config(format!("frame size {} (2048 or 4096)", cfg.frame_size)));
        }
        if !cfg.ring_size.is_power_of_two() || cfg.ring_size < 2 {
            return Err(XskError::Config(format!("ring size {} is not a power of two", cfg.ring_size)));
        }
        let umem = Umem::create(cfg.frame_count, cfg.frame_size, cfg.huge_pages)?;
        if cfg.huge_pages && !umem.huge {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::info!("no huge pages for the UMEM (vm.nr_hugepages too low?): using normal pages");
            });
        }
        let fs = u64::from(cfg.frame_size);
        let mut out = Self {
            ports: Vec::with_capacity(ports.len()),
            programs: Vec::new(),
            free: (0..u64::from(cfg.frame_count)).rev().map(|i| i * fs).collect(),
            total: cfg.frame_count as usize,
            umem,
            scratch: Vec::with_capacity(cfg.ring_size as usize),
            addrs: Vec::with_capacity(cfg.ring_size as usize),
            ring_size: cfg.ring_size,
            fill_frames: cfg.fill_frames,
            need_wakeup: cfg.need_wakeup,
            busy_poll: cfg.busy_poll.is_some(),
            id: NEXT_UMEM.fetch_add(1, Ordering::Relaxed),
        };
        let mut progs: Vec<(String, DefaultProgram)> = Vec::new();
        for (ifname, queue) in ports {
            let mut port = out.bind(cfg, ifname, *queue)?;
            if let Some(first) = out.ports.first() {
                // Later sockets share the first one's UMEM: bound with XDP_SHARED_UMEM and no
                // mode flags (the kernel refuses flags there), they get the UMEM's mode
                // (`xp_assign_dev_shared`).
                port.zero_copy = first.zero_copy;
            }
            // The fill ring is filled before the socket enters the XSKMAP: a frame redirected
            // to a socket with an empty fill ring is dropped (`rx_fill_ring_empty_descs`,
            // `rx_dropped`), and traffic may already be arriving (IPv6 DAD and MLD right
            // after the link came up, a peer's retries).
            out.ports.push(port);
            let last = out.ports.len() - 1;
            out.refill(last);
            if cfg.load_default_program {
                let at = match progs.iter().position(|(n, _)| n == ifname) {
                    Some(i) => i,
                    None => {
                        let idx = ifindex(ifname).map_err(|source| XskError::Program {
                            ifname: ifname.clone(),
                            step: "if_nametoindex",
                            source,
                        })?;
                        progs.push((ifname.clone(), DefaultProgram::attach(ifname, idx, cfg.skb_mode)?));
                        progs.len() - 1
                    }
                };
                if let (Some((_, p)), Some(port)) = (progs.get(at), out.ports.get(last)) {
                    p.insert(ifname, *queue, port.fd.as_fd())?;
                }
            }
        }
        out.programs = progs.into_iter().map(|(_, p)| p).collect();
        Ok(out)
    }

    fn bind(&self, cfg: &XskConfig, ifname: &str, queue: u32) -> Result<Port, XskError> {
        let attempts: &[(u16, &'static str)] = match cfg.copy_mode {
            CopyMode::Auto => &[(libc::XDP_ZEROCOPY, "zero-copy"), (libc::XDP_COPY, "copy")],
            CopyMode::Copy => &[(libc::XDP_COPY, "copy")],
            CopyMode::ZeroCopy => &[(libc::XDP_ZEROCOPY, "zero-copy")],
        };
        let idx = ifindex(ifname).map_err(|source| XskError::Socket {
            ifname: ifname.to_owned(),
            queue,
            mode: "any",
            step: "if_nametoindex",
            source,
        })?;
        let mut last = None;
        for (i, &(mode_flag, mode)) in attempts.iter().enumerate() {
            match self.bind_once(cfg, idx, queue, mode_flag) {
                Ok((fd, rings)) => {
                    if let Some(bp) = cfg.busy_poll {
                        set_busy_poll(fd.as_raw_fd(), bp).map_err(|(option, source)| XskError::SocketOption {
                            ifname: ifname.to_owned(),
                            queue,
                            option,
                            source,
                        })?;
                    }
                    if self.ports.is_empty() {
                        tracing::info!(ifname, queue, mode, ring = cfg.ring_size, "AF_XDP socket bound");
                    } else {
                        tracing::info!(
                            ifname,
                            queue,
                            ring = cfg.ring_size,
                            "AF_XDP socket bound on the shared UMEM (its mode)"
                        );
                    }
                    return Ok(Port {
                        ifname: ifname.to_owned(),
                        queue,
                        rings,
                        fd,
                        zero_copy: mode_flag == libc::XDP_ZEROCOPY,
                        in_fill: 0,
                        in_tx: 0,
                    });
                }
                Err((step, source)) => {
                    if i + 1 < attempts.len() {
                        tracing::info!(ifname, queue, error = %source, "zero-copy refused, falling back to copy mode");
                    }
                    last = Some(XskError::Socket { ifname: ifname.to_owned(), queue, mode, step, source });
                }
            }
        }
        Err(last.unwrap_or_else(|| XskError::Config("no bind mode".into())))
    }

    /// One attempt: a fresh socket, the UMEM registered (first socket) or shared, ring
    /// sizes, rings mapped, bound (kernel doc af_xdp.rst, "Usage", and `xsk_socket__create`
    /// of libxdp for the order).
    fn bind_once(
        &self,
        cfg: &XskConfig,
        ifindex: u32,
        queue: u32,
        mode_flag: u16,
    ) -> Result<(OwnedFd, Rings), (&'static str, std::io::Error)> {
        let fd = xdp_socket().map_err(|e| ("socket", e))?;
        let shared = self.ports.first().map(|p| p.fd.as_raw_fd());
        if shared.is_none() {
            let reg = libc::xdp_umem_reg {
                addr: self.umem.area.ptr.as_ptr() as u64,
                len: self.umem.len(),
                chunk_size: self.umem.frame_size,
                headroom: 0,
                // See the module docs: the kernel's per-frame descriptors then come from a
                // stack instead of one per chunk.
                flags: if cfg.unaligned_chunks { libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG } else { 0 },
                tx_metadata_len: 0,
            };
            set_xdp_opt(fd.as_fd(), libc::XDP_UMEM_REG, &reg).map_err(|e| ("XDP_UMEM_REG", e))?;
        }
        let size =
            libc::c_int::try_from(cfg.ring_size).map_err(|_| ("ring size", std::io::ErrorKind::InvalidInput.into()))?;
        for (opt, name) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
            (libc::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            set_xdp_opt(fd.as_fd(), opt, &size).map_err(|e| (name, e))?;
        }
        let rings = Rings::map(fd.as_fd(), cfg.ring_size)?;
        let (flags, shared_fd) = match shared {
            Some(s) => (libc::XDP_SHARED_UMEM, u32::try_from(s).unwrap_or(0)),
            None => (mode_flag | if cfg.need_wakeup { libc::XDP_USE_NEED_WAKEUP } else { 0 }, 0),
        };
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: shared_fd,
        };
        // SAFETY: `sa` is a valid sockaddr_xdp whose size is passed with it; bind only reads it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                core::ptr::from_ref(&sa).cast::<libc::sockaddr>(),
                core::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(("bind", std::io::Error::last_os_error()));
        }
        Ok((fd, rings))
    }

    /// Stops using the sockets and hands them out with the UMEM's memfd and the free frames,
    /// for [`Xsk::adopt`] in this or another process (sent with `SCM_RIGHTS`, unix(7)). The
    /// sockets stay bound: frames keep arriving in their RX rings (while fill-ring frames
    /// last) and frames in their TX rings are sent at the next kick. Frames the caller still
    /// holds as [`OwnedFrame`]s are lost to the export (the worker holds none between
    /// batches). Default programs ([`XskConfig::load_default_program`]) are detached.
    pub fn export(self) -> XskExport {
        let Self { ports, umem, free, ring_size, need_wakeup, .. } = self;
        let mut sockets = Vec::with_capacity(ports.len());
        let mut states = Vec::with_capacity(ports.len());
        for p in ports {
            let Port { ifname, queue, rings, fd, zero_copy, in_fill, in_tx } = p;
            drop(rings);
            states.push(PortState {
                ifname,
                queue,
                zero_copy,
                in_fill: u32::try_from(in_fill).unwrap_or(u32::MAX),
                in_tx: u32::try_from(in_tx).unwrap_or(u32::MAX),
            });
            sockets.push(fd);
        }
        let Umem { fd, area, frame_size, frames, huge } = umem;
        drop(area);
        XskExport {
            state: XskState {
                frame_count: frames,
                frame_size,
                ring_size,
                need_wakeup,
                huge_pages: huge,
                ports: states,
                free,
            },
            umem: fd,
            sockets,
        }
    }

    /// Takes over exported sockets ([`Xsk::export`], possibly of another process): maps the
    /// UMEM memfd and each socket's four rings again (`XDP_MMAP_OFFSETS`, mmap at
    /// `XDP_PGOFF_RX_RING`, `XDP_PGOFF_TX_RING`, `XDP_UMEM_PGOFF_FILL_RING`,
    /// `XDP_UMEM_PGOFF_COMPLETION_RING`; kernel ≥ 6.6 maps the rings of a bound socket),
    /// reads the rings' indices where the exporter left them, and takes the free list as
    /// given. Nothing is bound: the sockets keep their place in every `XSKMAP`. `busy_poll`
    /// sets the socket options again ([`XskConfig::busy_poll`]).
    ///
    /// The free list is checked (each frame inside the UMEM, no frame twice, and free plus
    /// in-ring counts equal to the frame count); the rings' contents are the exporter's word,
    /// as the kernel keeps them. Must not be called while another process still uses the
    /// same sockets' rings.
    ///
    /// # Errors
    /// [`XskError::Adopt`] for a state and descriptors that do not fit together (a
    /// descriptor that is no AF_XDP socket, a short memfd, a bad free list);
    /// [`XskError::SocketOption`] for a busy-poll option.
    pub fn adopt(export: XskExport, busy_poll: Option<BusyPoll>) -> Result<Self, XskError> {
        let XskExport { state, umem, sockets } = export;
        let bad = |s: String| Err(XskError::Adopt(s));
        if !matches!(state.frame_size, 2048 | 4096) || state.frame_count == 0 {
            return bad(format!("{} frames of {} bytes", state.frame_count, state.frame_size));
        }
        if !state.ring_size.is_power_of_two() || state.ring_size < 2 {
            return bad(format!("ring size {}", state.ring_size));
        }
        if sockets.len() != state.ports.len() || sockets.is_empty() {
            return bad(format!("{} sockets for {} ports", sockets.len(), state.ports.len()));
        }
        let held: u64 = state.ports.iter().map(|p| u64::from(p.in_fill) + u64::from(p.in_tx)).sum();
        if state.free.len() as u64 + held != u64::from(state.frame_count) {
            return bad(format!(
                "{} free frames and {held} in rings, but the UMEM has {}",
                state.free.len(),
                state.frame_count
            ));
        }
        // The memfd is checked first: it holds the frames the state announces, so what is
        // allocated for them below is bounded by memory the exporter really had.
        let umem = Umem::adopt(umem, state.frame_count, state.frame_size, state.huge_pages)?;
        let mut seen = vec![false; state.frame_count as usize];
        let fs = u64::from(state.frame_size);
        for &a in &state.free {
            let Some(s) = usize::try_from(a / fs).ok().and_then(|i| seen.get_mut(i)) else {
                return bad(format!("free frame {a:#x} outside the UMEM"));
            };
            if std::mem::replace(s, true) {
                return bad(format!("frame {a:#x} twice on the free list"));
            }
        }
        // Room for every frame, as `open` gives it: completions and released frames join the
        // free list in the worker loop, which must not allocate.
        let mut free = state.free;
        free.reserve_exact((state.frame_count as usize).saturating_sub(free.len()));
        let mut ports = Vec::with_capacity(sockets.len());
        for (fd, p) in sockets.into_iter().zip(state.ports) {
            // SAFETY: `xdp_options` is a plain integer; zero is a valid value.
            let zero: libc::xdp_options = unsafe { core::mem::zeroed() };
            let opts = get_xdp_opt(fd.as_fd(), libc::XDP_OPTIONS, zero).map_err(|e| {
                XskError::Adopt(format!("{} queue {}: not a bound AF_XDP socket (XDP_OPTIONS: {e})", p.ifname, p.queue))
            })?;
            let zero_copy = opts.flags & libc::XDP_OPTIONS_ZEROCOPY != 0;
            let rings = Rings::map(fd.as_fd(), state.ring_size)
                .map_err(|(step, e)| XskError::Adopt(format!("{} queue {}: {step}: {e}", p.ifname, p.queue)))?;
            if let Some(bp) = busy_poll {
                set_busy_poll(fd.as_raw_fd(), bp).map_err(|(option, source)| XskError::SocketOption {
                    ifname: p.ifname.clone(),
                    queue: p.queue,
                    option,
                    source,
                })?;
            }
            tracing::info!(ifname = %p.ifname, queue = p.queue, zero_copy, in_fill = p.in_fill, in_tx = p.in_tx, "AF_XDP socket adopted");
            ports.push(Port {
                ifname: p.ifname,
                queue: p.queue,
                rings,
                fd,
                zero_copy,
                in_fill: p.in_fill as usize,
                in_tx: p.in_tx as usize,
            });
        }
        Ok(Self {
            ports,
            programs: Vec::new(),
            total: state.frame_count as usize,
            umem,
            free,
            scratch: Vec::with_capacity(state.ring_size as usize),
            addrs: Vec::with_capacity(state.ring_size as usize),
            ring_size: state.ring_size,
            fill_frames: 0,
            need_wakeup: state.need_wakeup,
            busy_poll: busy_poll.is_some(),
            id: NEXT_UMEM.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Raw socket fds in port order, for the steering program's XSKMAP.
    pub fn fds(&self) -> Vec<RawFd> {
        self.ports.iter().map(|p| p.fd.as_raw_fd()).collect()
    }

    /// The kernel's counters of port `i`'s socket: one `getsockopt` system call, so call it
    /// between batches and rarely (the worker does once a second). `None` for a port that
    /// does not exist.
    ///
    /// # Errors
    /// The `getsockopt` error (not expected on a bound socket).
    pub fn socket_stats(&self, i: usize) -> Option<std::io::Result<SocketStats>> {
        let p = self.ports.get(i)?;
        // SAFETY: `xdp_statistics` is plain integers; all-zero is a valid value.
        let zero: libc::xdp_statistics = unsafe { core::mem::zeroed() };
        Some(get_xdp_opt(p.fd.as_fd(), libc::XDP_STATISTICS, zero).map(|s| SocketStats {
            rx_dropped: s.rx_dropped,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty: s.rx_fill_ring_empty_descs,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            tx_ring_empty: s.tx_ring_empty_descs,
        }))
    }

    /// Whether port `i` is bound in zero-copy mode.
    pub fn zero_copy(&self, i: usize) -> bool {
        self.ports.get(i).is_some_and(|p| p.zero_copy)
    }

    /// Number of ports (sockets).
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// Where the frames are (frames held by the caller are the rest of `total`).
    pub fn account(&self) -> FrameAccount {
        FrameAccount {
            total: self.total,
            free: self.free.len(),
            in_fill: self.ports.iter().map(|p| p.in_fill).sum(),
            in_tx: self.ports.iter().map(|p| p.in_tx).sum(),
        }
    }

    /// This UMEM's number (what its frames carry).
    pub fn umem_id(&self) -> u32 {
        self.id
    }

    /// Whether the UMEM got huge pages ([`XskConfig::huge_pages`]).
    pub fn huge_pages(&self) -> bool {
        self.umem.huge
    }

    /// Takes completed TX frames back onto the free list, for every port.
    pub fn complete(&mut self) {
        let (ports, free) = (&mut self.ports, &mut self.free);
        for p in ports {
            // SAFETY: the completion ring belongs to this UMEM; the consumed addresses were
            // ours (in TX) and now return to the free list only.
            let got = unsafe { p.rings.comp.consume(self.ring_size, |a| free.push(a)) };
            p.in_tx -= got.min(p.in_tx);
        }
    }

    /// Sets [`XskConfig::fill_frames`] (an adopted socket set starts at 0, the whole ring); the
    /// next [`Xsk::refill`] tops up to the new depth, and a fill ring deeper than it drains to
    /// it as frames arrive.
    pub fn set_fill_frames(&mut self, n: u32) {
        self.fill_frames = n;
    }

    /// The depth port `i`'s fill ring is topped up to ([`XskConfig::fill_frames`]); 0 for
    /// no such port.
    pub fn fill_target(&self, i: usize) -> usize {
        if i < self.ports.len() { fill_depth(self.fill_frames, self.ring_size) as usize } else { 0 }
    }

    /// Tops up port `i`'s fill ring from the free list to [`Xsk::fill_target`] frames (RX
    /// frames are reused for TX, so nothing is held back) once it lacks at least
    /// [`refill_slack`] of them: a top-up writes the ring's producer index and may read its
    /// consumer index, both on a line the kernel writes from the core that runs the queue's
    /// NAPI, so a worker taking a few frames per loop tops up every few loops instead of in
    /// every one.
    pub fn refill(&mut self, i: usize) {
        let target = self.fill_target(i);
        self.refill_to(i, target, refill_slack(target));
    }

    /// Tops up port `i`'s fill ring to the whole ring, whatever [`XskConfig::fill_frames`]
    /// says: for a worker about to sleep, so that frames arriving before it wakes find room
    /// (the ring then drains back to its depth as they are received).
    pub fn refill_whole(&mut self, i: usize) {
        self.refill_to(i, self.ring_size as usize, 1);
    }

    /// Tops up port `i`'s fill ring to `target` frames if it lacks at least `slack`.
    fn refill_to(&mut self, i: usize, target: usize, slack: usize) {
        let Some(p) = self.ports.get_mut(i) else { return };
        let lack = target.saturating_sub(p.in_fill);
        if lack < slack {
            return;
        }
        // The ring's room as last seen suffices unless it is short of what is given now; only
        // then is the kernel's consumer index read again (libxdp's `xsk_prod_nb_free`).
        let give = u32::try_from(lack.min(self.free.len())).unwrap_or(u32::MAX);
        let n = p.rings.fill.nb_free(give).min(give) as usize;
        if n == 0 {
            return;
        }
        let start = self.free.len() - n;
        self.addrs.clear();
        self.addrs.extend(self.free.get(start..).unwrap_or(&[]).iter().map(|&a| self.umem.base(a)));
        // SAFETY: these frames come from the free list, so nothing else references them;
        // after `produce` they belong to the kernel until RX hands them back. `n` entries
        // are free, so all are taken.
        let done = unsafe { p.rings.fill.produce(&self.addrs) };
        self.free.truncate(self.free.len() - done);
        p.in_fill += done;
    }

    /// Receives up to `max` frames from port `i` into `out`; returns how many. With the ring
    /// empty: busy-polls the queue's NAPI once ([`XskConfig::busy_poll`]) or, when the kernel
    /// asks for it (`need_wakeup` on the fill ring), wakes it with `recvfrom`; with
    /// `timeout_ms > 0` and need-wakeup on, waits up to that long in `poll(2)` instead.
    pub fn receive(&mut self, i: usize, out: &mut Vec<OwnedFrame>, max: usize, timeout_ms: i32) -> usize {
        let Some(p) = self.ports.get_mut(i) else { return 0 };
        let (umem, want) = (self.id, u32::try_from(max).unwrap_or(u32::MAX));
        let mut take = |d: Desc| out.push(OwnedFrame { addr: rx_addr(d.addr), len: d.len, umem });
        // SAFETY: the RX ring belongs to this UMEM; received descriptors are ours alone
        // and are wrapped in `OwnedFrame` at once.
        let mut n = unsafe { p.rings.rx.consume(want, &mut take) };
        if n == 0 {
            if self.busy_poll || (self.need_wakeup && p.rings.fill.needs_wakeup()) {
                recv_wakeup(p.fd.as_raw_fd());
                // SAFETY: as above.
                n = unsafe { p.rings.rx.consume(want, &mut take) };
            }
            if n == 0 && timeout_ms > 0 {
                let mut fds = [libc::pollfd { fd: p.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }; 1];
                // SAFETY: one initialised pollfd of a socket we own; poll writes `revents`.
                if unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout_ms) } > 0 {
                    // SAFETY: as above.
                    n = unsafe { p.rings.rx.consume(want, &mut take) };
                }
            }
        }
        p.in_fill -= n.min(p.in_fill);
        n
    }

    /// Waits up to `timeout_ms` in one `poll(2)` over every socket's RX ring (for a worker
    /// with nothing to do: it sleeps instead of spinning, and wakes at the first frame on any
    /// port). Returns whether a socket is readable.
    pub fn wait(&mut self, timeout_ms: i32) -> bool {
        let mut fds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 8];
        let mut n = 0;
        for (slot, p) in fds.iter_mut().zip(&self.ports) {
            *slot = libc::pollfd { fd: p.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            n += 1;
        }
        if self.ports.len() > fds.len() {
            // More sockets than the array holds: poll the first ones, with a short timeout so
            // the others are not starved.
            return self.poll_fds(&mut fds, n, timeout_ms.min(1));
        }
        self.poll_fds(&mut fds, n, timeout_ms)
    }

    fn poll_fds(&self, fds: &mut [libc::pollfd; 8], n: usize, timeout_ms: i32) -> bool {
        // SAFETY: `fds` holds `n` initialised pollfd entries (n <= 8) of sockets we own; poll
        // writes only their `revents`.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
        rc > 0
    }

    /// The whole data segment of frame `f` (from its address to the end of its UMEM frame).
    /// The caller has checked that `f` is of this UMEM.
    #[inline]
    fn segment<'a>(&'a self, f: &'a mut OwnedFrame) -> &'a mut [u8] {
        let (off, cap) = self.umem.segment(f.addr);
        // SAFETY: `off + cap` is inside the UMEM mapping (`Umem::segment` bounds it by the
        // frames' length, and the mapping is at least that long). `OwnedFrame` proves
        // exclusive ownership: its frame is in no ring and on no list, and no other
        // `OwnedFrame` has the same frame (every frame descriptor is in one place). The
        // slice's lifetime is tied to the `&mut OwnedFrame` borrow, so it ends before the
        // frame can be handed to the kernel; the mapping lives as long as `self`.
        unsafe { core::slice::from_raw_parts_mut(self.umem.area.ptr.as_ptr().add(off), cap) }
    }

    /// The whole UMEM frame (chunk) of `f` and `f`'s offset in it: the headroom before the
    /// data (`XDP_PACKET_HEADROOM`, 256 bytes, for a received frame: kernel doc af_xdp.rst,
    /// and `xsk_buff_pool.c`), the data and the tailroom. The caller has checked that `f` is
    /// of this UMEM.
    #[inline]
    fn chunk<'a>(&'a self, f: &'a mut OwnedFrame) -> (&'a mut [u8], usize) {
        let (off, cap, head) = self.umem.chunk(f.addr);
        // SAFETY: as for `segment`: `off + cap` is inside the UMEM mapping (`Umem::chunk`
        // bounds `off` by the frames' length and `cap` is one frame), `OwnedFrame` proves
        // exclusive ownership of the whole frame (the kernel gave the chunk to this frame's
        // descriptor, headroom included, and takes it back only through a ring), and the
        // slice's lifetime is tied to the `&mut OwnedFrame` borrow.
        let chunk = unsafe { core::slice::from_raw_parts_mut(self.umem.area.ptr.as_ptr().add(off), cap) };
        (chunk, head)
    }

    /// Runs `op` over the frames of `frames` as [`Packet`]s each spanning its whole UMEM
    /// frame, the frame's data at its offset there (256 for a received frame: a DSR
    /// encapsulation grows into that headroom instead of moving the packet, and the pipeline
    /// may grow a frame into its tailroom too); afterwards each frame starts at the packet's
    /// `head` and is its `len` long, both clamped to the UMEM frame, and transmits from there
    /// (an AF_XDP TX descriptor may start anywhere in its chunk: `xp_aligned_validate_desc`,
    /// `net/xdp/xsk_queue.h`).
    /// At most 64 frames are passed (the worker's batch); the rest are left alone.
    ///
    /// # Errors
    /// [`ForeignFrame`] if a frame belongs to another UMEM; nothing was run or changed then.
    pub fn with_batch<R>(
        &self,
        frames: &mut [OwnedFrame],
        op: impl FnOnce(&mut [Packet<'_>]) -> R,
    ) -> Result<R, ForeignWitness> {
        let frames = match frames.get_mut(..64) {
            Some(f) => f,
            None => frames,
        };
        if let Some(f) = frames.iter().find(|f| f.umem != self.id) {
            return Err(ForeignWitness { frame_umem: f.umem, xsk_umem: self.id });
        }
        let n = frames.len();
        // Each frame's (head, len) in its UMEM frame after `op`.
        let mut spans = [(0usize, 0usize); 64];
        let r = {
            let mut it = frames.iter_mut();
            let mut pkts: [Packet<'_>; 64] = core::array::from_fn(|_| match it.next() {
                Some(f) => {
                    let len = f.len as usize;
                    let (chunk, head) = self.chunk(f);
                    // The kernel wrote the frame, in copy mode on the core that ran the
                    // queue's NAPI: the first read of each header is a miss, and the batch's
                    // misses overlap if every frame is asked for before the first is parsed.
                    if let Some(b) = chunk.get(head) {
                        crate::prefetch(b);
                    }
                    Packet::new(chunk, head, len)
                }
                None => Packet::new(&mut [], 0, 0),
            });
            let pkts = pkts.get_mut(..n).unwrap_or_default();
            let r = op(pkts);
            for (s, p) in spans.iter_mut().zip(pkts.iter()) {
                *s = span_of(p);
            }
            r
        };
        for (f, span) in frames.iter_mut().zip(spans) {
            self.set_span(f, span);
        }
        Ok(r)
    }

    /// Frame `f` now starts `head` bytes into its UMEM frame and is `len` bytes long (a span
    /// from [`span_of`]).
    #[inline]
    fn set_span(&self, f: &mut OwnedFrame, (head, len): (usize, usize)) {
        f.addr = self.umem.base(f.addr) + head as u64;
        f.len = u32::try_from(len).unwrap_or(0);
    }

    /// Runs `op` on frame `f` as a [`Packet`] over its whole UMEM frame, as
    /// [`Xsk::with_batch`] does for a batch (the frame's head and length afterwards are the
    /// packet's). `None` (and `op` not run) for a frame of another UMEM.
    pub fn with_packet<R>(&self, f: &mut OwnedFrame, op: impl FnOnce(&mut Packet<'_>) -> R) -> Option<R> {
        if f.umem != self.id {
            return None;
        }
        let len = f.len as usize;
        let (r, span) = {
            let (chunk, head) = self.chunk(f);
            let mut p = Packet::new(chunk, head, len);
            let r = op(&mut p);
            (r, span_of(&p))
        };
        self.set_span(f, span);
        Some(r)
    }

    /// Runs `op` on the frame's whole data segment (its capacity, not just the current
    /// length) and the current length; `op` returns the new length (clamped to the capacity)
    /// and a result. `None` (and `op` not run) for a frame of another UMEM.
    pub fn with_buffer<R>(&self, f: &mut OwnedFrame, op: impl FnOnce(&mut [u8], usize) -> (usize, R)) -> Option<R> {
        if f.umem != self.id {
            return None;
        }
        let len = f.len as usize;
        let buf = self.segment(f);
        let cap = buf.len();
        let (new_len, r) = op(buf, len.min(cap));
        f.len = u32::try_from(new_len.min(cap)).unwrap_or(0);
        Some(r)
    }

    /// Queues frames for transmit on port `i`. When the TX ring is full, kicks the kernel,
    /// takes completions and tries again (a bounded number of times) before giving up; frames
    /// that still do not fit go back to the free list (the caller counts them as TX drops).
    /// Frames of another UMEM are left in `frames`; the rest are taken and queued in their
    /// order in `frames`. Returns how many were queued.
    pub fn transmit(&mut self, i: usize, frames: &mut Vec<OwnedFrame>) -> usize {
        let id = self.id;
        self.scratch.clear();
        // In the order given (a batch's frames of one flow leave as the pipeline saw them);
        // each frame taken becomes its descriptor, which carries its ownership from here.
        let scratch = &mut self.scratch;
        frames.retain(|f| {
            if f.umem != id {
                return true;
            }
            scratch.push(Desc { addr: f.addr, len: f.len, options: 0 });
            false
        });
        if i >= self.ports.len() {
            self.free.extend(self.scratch.drain(..).map(|d| d.addr));
            return 0;
        }
        let mut done = 0;
        for attempt in 0..TX_RETRIES {
            let Some(p) = self.ports.get_mut(i) else { break };
            // SAFETY: the descriptors were owned (`OwnedFrame`, this UMEM) and pass to the
            // kernel here (as many as fit).
            let q = unsafe { p.rings.tx.produce(self.scratch.get(done..).unwrap_or(&[])) };
            p.in_tx += q;
            done += q;
            if done == self.scratch.len() || attempt + 1 == TX_RETRIES {
                break;
            }
            self.kick_port(i, true);
            self.complete();
        }
        let rest = self.scratch.drain(done..).map(|d| d.addr);
        self.free.extend(rest);
        done
    }

    /// Returns a frame to the free list (dropped packets).
    ///
    /// # Errors
    /// [`ForeignFrame`] (with the frame) if it belongs to another UMEM.
    pub fn release(&mut self, f: OwnedFrame) -> Result<(), ForeignFrame> {
        if f.umem != self.id {
            let frame_umem = f.umem;
            return Err(ForeignFrame { frame: f, frame_umem, xsk_umem: self.id });
        }
        self.free.push(f.addr);
        Ok(())
    }

    /// Makes the kernel send what is in port `i`'s TX ring, when it needs telling: always in
    /// copy mode (the copy happens in `sendto()`, at most 32 frames per call, so this repeats,
    /// bounded, until the ring is empty, taking completions as it goes); in zero-copy mode one
    /// `sendto()` only if the kernel set `need_wakeup` on the TX ring (or the sockets busy-poll,
    /// which `sendto()` drives), else nothing: the driver is already sending.
    pub fn kick(&mut self, i: usize) {
        self.kick_port(i, false);
    }

    /// [`Xsk::kick`] for a port with nothing newly queued: in copy mode at most one
    /// `sendto()`, for frames an earlier kick left in the TX ring (the device refused them for
    /// now: its link down, a full driver queue), so a port that stays down costs one failing
    /// call per worker loop rather than [`Xsk::kick`]'s up to 64; nothing if its TX ring is
    /// empty.
    pub fn kick_pending(&mut self, i: usize) {
        self.kick_port(i, true);
    }

    fn kick_port(&mut self, i: usize, once: bool) {
        let Some(p) = self.ports.get(i) else { return };
        if p.zero_copy {
            if p.in_tx > 0 && (!self.need_wakeup || self.busy_poll || p.rings.tx.needs_wakeup()) {
                send_wakeup(p.fd.as_raw_fd());
            }
            return;
        }
        for _ in 0..if once { 1 } else { 64 } {
            let ring_size = self.ring_size;
            let Some(p) = self.ports.get_mut(i) else { return };
            if p.rings.tx.nb_free(ring_size) >= ring_size || p.in_tx == 0 {
                return;
            }
            if p.rings.tx.needs_wakeup() || !self.need_wakeup || self.busy_poll {
                send_wakeup(p.fd.as_raw_fd());
            }
            self.complete();
            if self.ports.get(i).is_some_and(|p| p.in_tx == 0) {
                return;
            }
        }
    }

    /// Copies `bytes` into a free frame (for frames handed over from another worker).
    /// `None` if no frame is free.
    pub fn frame_from(&mut self, bytes: &[u8]) -> Option<OwnedFrame> {
        let addr = self.free.pop()?;
        let mut f = OwnedFrame { addr: self.umem.base(addr), len: 0, umem: self.id };
        self.with_buffer(&mut f, |buf, _| {
            let n = bytes.len().min(buf.len());
            if let (Some(d), Some(s)) = (buf.get_mut(..n), bytes.get(..n)) {
                d.copy_from_slice(s);
            }
            (n, ())
        });
        Some(f)
    }

    /// Copies the frame's current contents into `out` (for handing it to another worker).
    /// `false` (and `out` untouched) for a frame of another UMEM.
    pub fn copy_out(&self, f: &mut OwnedFrame, out: &mut Vec<u8>) -> bool {
        self.with_buffer(f, |buf, len| {
            out.clear();
            out.extend_from_slice(buf.get(..len).unwrap_or(buf));
            (len, ())
        })
        .is_some()
    }

    /// Frames in port `i`'s RX ring not yet received (kernel and process indices as in
    /// shared memory now). For tests and checks; `None` for a port that does not exist.
    pub fn rx_pending(&self, i: usize) -> Option<u32> {
        self.ports.get(i).map(|p| p.rings.rx.pending())
    }
}

/// Frame accounting: where the worker's frames are. Between batches
/// `free + in_fill + in_tx == total`; a frame is never lost.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct FrameAccount {
    /// Frames in the UMEM.
    pub total: usize,
    /// On the free list.
    pub free: usize,
    /// In fill rings (owned by the kernel for RX).
    pub in_fill: usize,
    /// In TX rings, not yet completed.
    pub in_tx: usize,
}

/// Sets `SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL` and `SO_BUSY_POLL_BUDGET` (socket(7)) on `fd`.
fn set_busy_poll(fd: RawFd, bp: BusyPoll) -> Result<(), (&'static str, std::io::Error)> {
    let opts: [(&'static str, libc::c_int, libc::c_int); 3] = [
        ("SO_PREFER_BUSY_POLL", libc::SO_PREFER_BUSY_POLL, 1),
        ("SO_BUSY_POLL", libc::SO_BUSY_POLL, libc::c_int::try_from(bp.usecs).unwrap_or(libc::c_int::MAX)),
        ("SO_BUSY_POLL_BUDGET", libc::SO_BUSY_POLL_BUDGET, libc::c_int::from(bp.budget)),
    ];
    for (name, opt, val) in opts {
        // SAFETY: `fd` is an open socket owned by the caller; the option value is a c_int on
        // the stack whose size is passed with it; setsockopt only reads it.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&raw const val).cast::<libc::c_void>(),
                core::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err((name, std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// `recvfrom(fd, NULL, 0, MSG_DONTWAIT)`: on an AF_XDP socket this busy-polls the queue's
/// NAPI (with `SO_BUSY_POLL`) and, in zero-copy mode, wakes the driver for RX (kernel doc
/// af_xdp.rst, "XDP_USE_NEED_WAKEUP"). Errors (`EAGAIN`, ...) mean nothing was due.
fn recv_wakeup(fd: RawFd) {
    // SAFETY: a zero-length receive with a null buffer and no address: the kernel writes
    // nothing to our memory (xsk_recvmsg ignores the buffer).
    let _ = unsafe {
        libc::recvfrom(fd, core::ptr::null_mut(), 0, libc::MSG_DONTWAIT, core::ptr::null_mut(), core::ptr::null_mut())
    };
}

/// Puts the calling thread in the `SCHED_FIFO` real-time class at `priority` (1..=99;
/// sched(7)). A worker sharing its core with its queue's NAPI (softirq or threaded NAPI) uses
/// it so that it runs until its rings are empty and then sleeps in `poll(2)`, and the NAPI
/// runs while it sleeps: receive work is done only as fast as the worker can take it (see
/// docs/operations.md "Worker and queue on one core"). Lives here because it is the crate's
/// one module with `unsafe`.
///
/// # Errors
/// The `sched_setscheduler` error (`EPERM` without `CAP_SYS_NICE`).
pub fn set_realtime(priority: i32) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param on the stack that
    // the kernel only reads.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;

    /// Runs `f` on a thread inside a new, private network namespace (`unshare(CLONE_NEWNET)`),
    /// which disappears with the thread: nothing to clean up, nothing of the host touched.
    /// `None` when not root (the test is skipped; CI runs as root).
    fn in_private_netns<T: Send + 'static>(test: &str, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        if xlb_testkit::skip_without_root(test) {
            return None;
        }
        let t = std::thread::spawn(move || {
            // SAFETY: unshare only changes this thread's namespace membership.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
            f()
        });
        Some(t.join().expect("test thread"))
    }

    /// An `Xsk` on queue 0 of `ifname` in the private namespace (`lo`, or a veth that
    /// [`veth_pair`] made there).
    fn open_on(ifname: &str) -> Xsk {
        let cfg = XskConfig { frame_count: 1024, ring_size: 256, copy_mode: CopyMode::Copy, ..XskConfig::default() };
        Xsk::open(&cfg, &[(ifname.to_owned(), 0)]).expect("AF_XDP socket in a private namespace")
    }

    fn open_on_lo() -> Xsk {
        open_on("lo")
    }

    /// Makes the veth pair `xa`/`xb` in the calling thread's (private) namespace.
    fn veth_pair() {
        let out = std::process::Command::new("ip")
            .args(["link", "add", "xa", "type", "veth", "peer", "name", "xb"])
            .output()
            .expect("ip (iproute2; scripts/install-deps.sh)");
        assert!(out.status.success(), "ip link add: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// [`veth_pair`], both ends up.
    fn veth_pair_up() {
        veth_pair();
        for l in ["xa", "xb"] {
            let out = std::process::Command::new("ip").args(["link", "set", l, "up"]).output().expect("ip");
            assert!(out.status.success(), "ip link set {l} up: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    #[test]
    fn an_rx_address_in_unaligned_form_is_the_chunk_start_plus_its_offset() {
        // Chunk 3 of 2,048 bytes, data 256 bytes in (XDP_PACKET_HEADROOM), as the kernel
        // writes it in unaligned chunk mode: offset in the top 16 bits.
        assert_eq!(rx_addr((3 * 2048) | (256 << 48)), 3 * 2048 + 256);
        // An address without an offset (aligned mode, or one already turned back) is kept.
        assert_eq!(rx_addr(3 * 2048 + 256), 3 * 2048 + 256);
        assert_eq!(rx_addr(0), 0);
    }

    #[test]
    fn refill_slack_is_an_eighth_of_the_depth_within_one_and_a_batch() {
        assert_eq!([refill_slack(2048), refill_slack(512), refill_slack(64), refill_slack(4)], [64, 64, 8, 1]);
    }

    #[test]
    fn fill_depth_is_the_whole_ring_by_default_and_never_past_the_ring() {
        assert_eq!(fill_depth(0, 2048), 2048);
        assert_eq!(fill_depth(512, 2048), 512);
        assert_eq!(fill_depth(5000, 2048), 2048);
    }

    #[test]
    fn a_socket_keeps_its_fill_ring_at_its_depth_follows_a_new_one_and_fills_it_whole_before_sleeping() {
        in_private_netns(
            "a_socket_keeps_its_fill_ring_at_its_depth_follows_a_new_one_and_fills_it_whole_before_sleeping",
            || {
                let cfg = XskConfig {
                    frame_count: 4096,
                    ring_size: 2048,
                    fill_frames: 512,
                    copy_mode: CopyMode::Copy,
                    ..XskConfig::default()
                };
                let mut x = Xsk::open(&cfg, &[("lo".to_owned(), 0)]).expect("AF_XDP socket in a private namespace");
                assert_eq!((x.fill_target(0), x.account().in_fill), (512, 512), "filled to its depth");
                x.refill(0);
                assert_eq!(x.account().in_fill, 512, "a ring at its depth takes no more");
                x.set_fill_frames(1000);
                x.refill(0);
                assert_eq!(x.account().in_fill, 1000, "topped up to a deeper setting");
                x.set_fill_frames(1000 + refill_slack(1000) as u32 - 1);
                x.refill(0);
                assert_eq!(x.account().in_fill, 1000, "a ring short of its depth by less than the slack waits");
                x.set_fill_frames(1000 + refill_slack(1000) as u32);
                x.refill(0);
                assert_eq!(x.account().in_fill, 1064, "and is topped up once short by the slack");
                x.set_fill_frames(64);
                x.refill(0);
                assert_eq!(x.account().in_fill, 1064, "a shallower setting takes nothing back; the ring drains to it");
                x.refill_whole(0);
                assert_eq!(x.account().in_fill, 2048, "the whole ring before a sleep");
                let acc = x.account();
                assert_eq!(acc.free + acc.in_fill + acc.in_tx, acc.total);
                assert_eq!(x.fill_target(1), 0, "no such port");
                x.set_fill_frames(0);
                assert_eq!(x.fill_target(0), 2048, "0: the whole ring");
            },
        );
    }

    #[test]
    fn a_frame_of_one_umem_is_refused_by_another() {
        in_private_netns("a_frame_of_one_umem_is_refused_by_another", || {
            veth_pair();
            let mut a = open_on("xa");
            let mut b = open_on("xb");
            assert_ne!(a.umem_id(), b.umem_id());
            let before_b = b.account();
            let mut f = a.frame_from(b"frame of a").expect("a free frame");

            // Reading or writing it through b: refused, op not run.
            assert!(b.with_buffer(&mut f, |_, len| (len, ())).is_none());
            let mut out = Vec::new();
            assert!(!b.copy_out(&mut f, &mut out));
            let mut batch = vec![f];
            let err = b.with_batch(&mut batch, |_| ()).unwrap_err();
            assert_eq!(err, ForeignWitness { frame_umem: a.umem_id(), xsk_umem: b.umem_id() });

            // Transmitting through b: left with the caller, nothing queued.
            assert_eq!(b.transmit(0, &mut batch), 0);
            assert_eq!(batch.len(), 1, "the foreign frame stays with the caller");

            // Releasing to b: handed back, b's free list unchanged.
            let f = batch.pop().unwrap();
            let err = b.release(f).unwrap_err();
            assert_eq!((err.frame_umem, err.xsk_umem), (a.umem_id(), b.umem_id()));
            assert_eq!(b.account(), before_b);

            // The owner takes it back: a's frames are all accounted for again.
            a.release(err.frame).expect("a takes its own frame");
            let acc = a.account();
            assert_eq!(acc.free + acc.in_fill + acc.in_tx, acc.total);
        });
    }

    #[test]
    fn with_batch_hands_out_whole_umem_frames_and_keeps_the_heads_and_lengths_the_op_sets() {
        in_private_netns("with_batch_hands_out_whole_umem_frames_and_keeps_the_heads_and_lengths_the_op_sets", || {
            let x = open_on_lo();
            let mut x = x;
            let mut frames: Vec<OwnedFrame> = (0..3).map(|i| x.frame_from(&[i; 60]).unwrap()).collect();
            let seen = x
                .with_batch(&mut frames, |pkts| {
                    let seen: Vec<(usize, usize, usize, u8)> =
                        pkts.iter().map(|p| (p.buf.len(), p.head, p.len, p.buf[p.head])).collect();
                    pkts[1].len = 100; // grown into the tailroom
                    pkts[2].len = 14; // shrunk
                    pkts[0].buf[100] = 0xee; // grown at the front: starts at 100 now
                    (pkts[0].head, pkts[0].len) = (100, 20);
                    seen
                })
                .unwrap();
            assert_eq!(seen.len(), 3);
            for (i, (cap, head, len, first)) in seen.into_iter().enumerate() {
                // A frame made by `frame_from` starts its UMEM frame.
                assert_eq!((cap, head), (2048, 0), "the whole UMEM frame");
                assert_eq!((len, usize::from(first)), (60, i));
            }
            let lens: Vec<usize> = frames.iter().map(OwnedFrame::len).collect();
            assert_eq!(lens, vec![20, 100, 14]);
            let first = x.with_buffer(&mut frames[0], |b, len| (len, b[0])).unwrap();
            assert_eq!(first, 0xee, "the frame starts where the op moved its head");
        });
    }

    /// A received frame's data starts 256 bytes into its UMEM frame (`XDP_PACKET_HEADROOM`);
    /// `with_batch` hands the pipeline that headroom, and a frame grown into it (as a DSR
    /// encapsulation grows it: a new link-layer header and 20 bytes more in front of the IP
    /// packet) is transmitted from its new start, whole, in either chunk mode.
    #[test]
    fn a_frame_grown_into_its_headroom_is_transmitted_from_its_new_start() {
        for unaligned in [false, true] {
            let test = if unaligned { "xsk_headroom_unaligned_chunks" } else { "xsk_headroom_aligned_chunks" };
            let res = in_private_netns(test, move || {
                veth_pair_up();
                let cfg = XskConfig { unaligned_chunks: unaligned, ..test_cfg(true) };
                let mut a = Xsk::open(&cfg, &[("xa".to_owned(), 0)]).expect("xa");
                let mut b = Xsk::open(&cfg, &[("xb".to_owned(), 0)]).expect("xb");
                // Receives on `x` until a test frame of `kind` comes, within 10 s.
                let recv = |x: &mut Xsk, kind: u8| -> OwnedFrame {
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                    loop {
                        assert!(std::time::Instant::now() < deadline, "no frame of kind {kind} within 10 s");
                        let mut rx = Vec::new();
                        x.complete();
                        x.refill(0);
                        x.receive(0, &mut rx, 64, 1);
                        let mut found = None;
                        for mut f in rx {
                            let k = x.with_buffer(&mut f, |b, len| (len, parse_test_frame(&b[..len])));
                            if found.is_none() && matches!(k, Some(Some((7, k))) if k == kind) {
                                found = Some(f);
                            } else {
                                x.release(f).unwrap();
                            }
                        }
                        if let Some(f) = found {
                            return f;
                        }
                    }
                };
                let mut out = vec![b.frame_from(&test_frame(7, REQ)).unwrap()];
                assert_eq!(b.transmit(0, &mut out), 1);
                b.kick(0);
                let mut got = vec![recv(&mut a, REQ)];
                let head = a
                    .with_batch(&mut got, |pkts| {
                        let p = &mut pkts[0];
                        let head = p.head;
                        // The Ethernet header moved 20 bytes to the front, then the test
                        // frame's sequence number and kind (an echo), then 15 marker bytes
                        // over the old Ethernet header, then the frame's data as it was.
                        let eth: [u8; 14] = p.buf[head..head + 14].try_into().unwrap();
                        p.buf[head - 20..head - 6].copy_from_slice(&eth);
                        p.buf[head - 6..head - 2].copy_from_slice(&7u32.to_be_bytes());
                        p.buf[head - 2] = ECHO;
                        p.buf[head - 1..head + 14].fill(0x5a);
                        (p.head, p.len) = (head - 20, p.len + 20);
                        head
                    })
                    .unwrap();
                assert_eq!(head, 256, "a received frame's data 256 bytes into its UMEM frame");
                assert_eq!(a.transmit(0, &mut got), 1);
                a.kick(0);
                let mut back = recv(&mut b, ECHO);
                let bytes = b.with_buffer(&mut back, |buf, len| (len, buf[..len].to_vec())).unwrap();
                b.release(back).unwrap();
                bytes
            });
            let Some(bytes) = res else { return };
            let sent = test_frame(7, REQ);
            assert_eq!(bytes.len(), 80, "unaligned {unaligned}: 20 bytes longer");
            assert_eq!(bytes[..14], sent[..14], "unaligned {unaligned}: the moved Ethernet header");
            assert_eq!(bytes[14..19], [0, 0, 0, 7, ECHO], "unaligned {unaligned}: the bytes written in front");
            assert_eq!(bytes[19..34], [0x5a; 15], "unaligned {unaligned}");
            assert_eq!(bytes[34..], sent[14..], "unaligned {unaligned}: the frame's data after them");
        }
    }

    /// Receives on port 0 of `x` until `n` test frames of `kind` came (within 10 s); returns
    /// their sequence numbers in the order they were received. Other frames are released.
    fn receive_test_frames(x: &mut Xsk, kind: u8, n: usize) -> Vec<u32> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut seqs = Vec::new();
        while seqs.len() < n {
            assert!(std::time::Instant::now() < deadline, "{} of {n} frames of kind {kind} within 10 s", seqs.len());
            let mut rx = Vec::new();
            x.complete();
            x.refill(0);
            x.receive(0, &mut rx, 64, 1);
            for mut f in rx {
                if let Some(Some((seq, k))) = x.with_buffer(&mut f, |b, len| (len, parse_test_frame(&b[..len])))
                    && k == kind
                {
                    seqs.push(seq);
                }
                x.release(f).unwrap();
            }
        }
        seqs
    }

    /// One `transmit` of a batch puts its frames in the TX ring in the batch's order: frames
    /// of one flow queued in one batch leave in the order the pipeline saw them.
    #[test]
    fn a_batch_is_transmitted_in_the_order_it_was_queued() {
        let res = in_private_netns("a_batch_is_transmitted_in_the_order_it_was_queued", || {
            veth_pair_up();
            let mut a = Xsk::open(&test_cfg(true), &[("xa".to_owned(), 0)]).expect("xa");
            let mut b = Xsk::open(&test_cfg(true), &[("xb".to_owned(), 0)]).expect("xb");
            let mut batch: Vec<OwnedFrame> = (0..8).map(|seq| b.frame_from(&test_frame(seq, REQ)).unwrap()).collect();
            assert_eq!(b.transmit(0, &mut batch), 8);
            assert!(batch.is_empty());
            b.kick(0);
            receive_test_frames(&mut a, REQ, 8)
        });
        let Some(seqs) = res else { return };
        assert_eq!(seqs, (0..8).collect::<Vec<u32>>(), "received in the order queued");
    }

    /// A packet whose head the pipeline moves to the very end of its UMEM frame (nothing left
    /// of it) still names a place in its own frame: the frame's memory afterwards is its own,
    /// not the next frame's, which another `OwnedFrame` may hold.
    #[test]
    fn a_packet_moved_to_the_end_of_its_frame_stays_in_its_own_frame() {
        in_private_netns("a_packet_moved_to_the_end_of_its_frame_stays_in_its_own_frame", || {
            let mut x = open_on_lo();
            let mut f = x.frame_from(&[1; 60]).unwrap();
            let mut next = x.frame_from(&[2; 60]).unwrap();
            assert_eq!(next.addr, f.addr + 2048, "adjacent UMEM frames");
            let mut batch = vec![f];
            x.with_batch(&mut batch, |pkts| {
                let end = pkts[0].buf.len();
                (pkts[0].head, pkts[0].len) = (end, 0);
            })
            .unwrap();
            f = batch.pop().unwrap();
            x.with_buffer(&mut f, |b, len| {
                b.fill(0xee);
                (len, ())
            })
            .unwrap();
            let next_bytes = x.with_buffer(&mut next, |b, len| (len, b[..len].to_vec())).unwrap();
            assert_eq!(next_bytes, [2; 60], "the next frame is untouched");
            x.release(f).unwrap();
            x.release(next).unwrap();
            let mut seen: Vec<u64> = x.free.iter().map(|&a| x.umem.base(a)).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), x.free.len(), "no frame twice on the free list");
        });
    }

    /// Requests from `xb` echoed by a socket on `xa` come back whole and once each, with the
    /// UMEMs in either chunk mode ([`XskConfig::unaligned_chunks`]): in unaligned mode the
    /// kernel's RX addresses carry the data's offset in their top bits ([`rx_addr`]).
    #[test]
    fn frames_round_trip_in_aligned_and_unaligned_chunk_mode() {
        const N: u32 = 600;
        for unaligned in [false, true] {
            let test = if unaligned { "xsk_round_trip_unaligned_chunks" } else { "xsk_round_trip_aligned_chunks" };
            let res = in_private_netns(test, move || {
                veth_pair_up();
                let cfg = XskConfig { unaligned_chunks: unaligned, ..test_cfg(true) };
                let mut a = Xsk::open(&cfg, &[("xa".to_owned(), 0)]).expect("echo side on xa");
                let mut s = Xsk::open(&cfg, &[("xb".to_owned(), 0)]).expect("sender on xb");
                let sender = std::thread::spawn(move || send_and_collect(&mut s, N));
                let seen = echo_until_end(&mut a);
                let echoed = sender.join().expect("sender thread");
                (seen, echoed)
            });
            let Some((seen, echoed)) = res else { return };
            assert_eq!(seen, (0..N).collect::<Vec<u32>>(), "unaligned {unaligned}: every request once, in order");
            assert!(echoed.iter().all(|&n| n == 1), "unaligned {unaligned}: every echo back once");
        }
    }

    /// Ethertype of the hand-over test's frames (IEEE local experimental).
    const ETH_TEST: [u8; 2] = [0x88, 0xB5];
    /// Frame kinds of the hand-over test: a request (sender to xa), its echo (back to xb), and
    /// the end marker after the last request.
    const REQ: u8 = 0;
    const ECHO: u8 = 1;
    const END: u8 = 2;

    fn test_frame(seq: u32, kind: u8) -> [u8; 60] {
        let mut f = [0u8; 60];
        f[..6].fill(0xff);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ETH_TEST);
        f[14..18].copy_from_slice(&seq.to_be_bytes());
        f[18] = kind;
        f
    }

    /// (seq, kind) of a test frame, `None` for other traffic (IPv6 router solicitations...).
    fn parse_test_frame(b: &[u8]) -> Option<(u32, u8)> {
        (b.len() >= 19 && b[12..14] == ETH_TEST).then(|| (u32::from_be_bytes([b[14], b[15], b[16], b[17]]), b[18]))
    }

    fn test_cfg(default_program: bool) -> XskConfig {
        XskConfig {
            frame_count: 1024,
            ring_size: 256,
            copy_mode: CopyMode::Copy,
            load_default_program: default_program,
            huge_pages: false,
            ..XskConfig::default()
        }
    }

    /// One round of the echo side: receives on port 0, turns each request into its echo,
    /// queues the echoes and (with `kick`) sends them. Returns the requests' seqs and whether
    /// the end marker came.
    fn echo_round(x: &mut Xsk, kick: bool, seen: &mut Vec<u32>) -> bool {
        let mut rx = Vec::new();
        x.complete();
        x.refill(0);
        x.receive(0, &mut rx, 64, 1);
        let mut end = false;
        let mut tx = Vec::new();
        for mut f in rx {
            let what = x.with_buffer(&mut f, |b, len| {
                let r = parse_test_frame(&b[..len]);
                if let Some((_, REQ)) = r {
                    b[18] = ECHO;
                }
                (len, r)
            });
            match what.flatten() {
                Some((seq, REQ)) => {
                    seen.push(seq);
                    tx.push(f);
                }
                Some((_, END)) => {
                    end = true;
                    x.release(f).unwrap();
                }
                _ => x.release(f).unwrap(),
            }
        }
        let want = tx.len();
        assert_eq!(x.transmit(0, &mut tx), want, "TX ring full in the echo side");
        if kick {
            x.kick(0);
        }
        end
    }

    /// The echo side after adoption: echoes until the end marker, then sends what is queued.
    fn echo_until_end(x: &mut Xsk) -> Vec<u32> {
        let mut seen = Vec::new();
        // Frames the exporter queued for TX go out at the first kick.
        x.kick(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !echo_round(x, true, &mut seen) {
            assert!(std::time::Instant::now() < deadline, "no end marker within 20 s ({} requests seen)", seen.len());
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while x.account().in_tx > 0 && std::time::Instant::now() < deadline {
            x.kick(0);
            x.complete();
        }
        seen
    }

    /// Sends `n` requests from `s` (on xb), paced (8 frames per 0.5 ms), then the end marker,
    /// while collecting the echoes; returns how often each seq was echoed, once every echo
    /// came back or after 20 s.
    fn send_and_collect(s: &mut Xsk, n: u32) -> Vec<u8> {
        let mut echoed = vec![0u8; n as usize];
        let mut got = 0usize;
        let collect = |s: &mut Xsk, echoed: &mut Vec<u8>, got: &mut usize| {
            let mut rx = Vec::new();
            s.complete();
            s.refill(0);
            s.receive(0, &mut rx, 64, 0);
            for mut f in rx {
                if let Some(Some((seq, ECHO))) = s.with_buffer(&mut f, |b, len| (len, parse_test_frame(&b[..len]))) {
                    echoed[seq as usize] = echoed[seq as usize].saturating_add(1);
                    *got += 1;
                }
                s.release(f).unwrap();
            }
        };
        let mut seq = 0;
        let mut frames = Vec::new();
        // At most WINDOW requests not yet echoed, fewer than the receiver's fill ring holds
        // (~250): the receiver's pauses (the switch itself, a loaded machine) hold the sender
        // back instead of overrunning the rings, so a lost frame means the hand-over lost it.
        const WINDOW: usize = 128;
        while seq <= n {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while seq as usize >= got + WINDOW && std::time::Instant::now() < deadline {
                s.kick(0);
                collect(s, &mut echoed, &mut got);
                s.wait(1);
            }
            let kind = if seq == n { END } else { REQ };
            frames.push(s.frame_from(&test_frame(seq, kind)).expect("a free frame in the sender"));
            if s.transmit(0, &mut frames) == 1 {
                seq += 1;
            }
            frames.clear();
            if seq % 8 == 0 {
                s.kick(0);
                collect(s, &mut echoed, &mut got);
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
        }
        s.kick(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while got < n as usize && std::time::Instant::now() < deadline {
            collect(s, &mut echoed, &mut got);
            s.wait(1);
        }
        echoed
    }

    /// How the exported sockets reach their adopter: a thread of this process, or a child
    /// process (this test binary running [`adopt_child`]) over a Unix socket with
    /// `SCM_RIGHTS`.
    #[derive(Clone, Copy, Debug)]
    enum Adopter {
        Thread,
        ChildProcess,
    }

    /// The hand-over prototype: the sender on `xb` sends numbered requests continuously; `A`
    /// on `xa` echoes the first ones, queues one batch of echoes without sending it, exports
    /// its sockets and UMEM (a memfd); `B` adopts them and echoes the rest. Every request
    /// must reach A or B exactly once, every echo must come back once (including the batch A
    /// had queued), and neither socket may have dropped a frame.
    fn handover_keeps_every_frame(test: &str, how: Adopter) {
        const N: u32 = 3000;
        let res = in_private_netns(test, move || {
            veth_pair_up();
            let mut a = Xsk::open(&test_cfg(true), &[("xa".to_owned(), 0)]).expect("A on xa");
            let mut s = Xsk::open(&test_cfg(true), &[("xb".to_owned(), 0)]).expect("sender on xb");
            // The child (if any) starts first and waits for the sockets, so the switch does
            // not wait for a process start.
            let sock = std::env::temp_dir().join(format!("xlb-xsk-adopt-{}.sock", std::process::id()));
            let _ = std::fs::remove_file(&sock);
            let listener = std::os::unix::net::UnixListener::bind(&sock).expect("listener");
            let mut child = match how {
                Adopter::Thread => None,
                Adopter::ChildProcess => {
                    let exe = std::env::current_exe().expect("test binary");
                    let c = std::process::Command::new(exe)
                        .args(["--ignored", "--exact", "xsk::tests::adopt_child", "--nocapture"])
                        .env("XLB_XSK_ADOPT_SOCKET", &sock)
                        .spawn()
                        .expect("child process");
                    Some(xlb_testkit::ChildGuard::new(c))
                }
            };
            let sender = std::thread::spawn(move || send_and_collect(&mut s, N));
            // A: echoes the first third, then queues one batch without kicking.
            let mut a_seen = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while a_seen.len() < (N / 3) as usize {
                assert!(!echo_round(&mut a, true, &mut a_seen), "end marker before the switch");
                assert!(std::time::Instant::now() < deadline, "A saw {} requests in 20 s", a_seen.len());
            }
            let before = a_seen.len();
            while a_seen.len() == before {
                echo_round(&mut a, false, &mut a_seen);
            }
            let queued_by_a: Vec<u32> = a_seen[before..].to_vec();
            assert!(a.account().in_tx > 0, "A's last echoes wait in its TX ring");
            let a_stats = a.socket_stats(0).unwrap().unwrap();
            // xa's default program stands for xlb's steering program, which outlives the
            // worker's sockets: kept until the end, its map keeps pointing at A's socket.
            let _steering = std::mem::take(&mut a.programs);
            // A has stopped receiving: the switch starts with requests waiting in the RX ring.
            // (Polled without a pause: the fill ring holds only ~250 frames, 15 ms of the
            // sender's rate, and frames beyond it would be dropped by the kernel.)
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while a.rx_pending(0).is_none_or(|n| n < 8) {
                assert!(std::time::Instant::now() < deadline, "no requests waiting in A's RX ring after 10 s");
                std::thread::yield_now();
            }
            let export = a.export();
            let b_seen = match how {
                Adopter::Thread => std::thread::spawn(move || {
                    let mut b = Xsk::adopt(export, None).expect("B adopts");
                    let seen = echo_until_end(&mut b);
                    (seen, b.socket_stats(0).unwrap().unwrap())
                })
                .join()
                .expect("B thread"),
                Adopter::ChildProcess => {
                    let (c, _) = listener.accept().expect("the child connects");
                    send_export(&c, &export);
                    drop(export); // the child holds its own copies now
                    let mut bytes = Vec::new();
                    std::io::Read::read_to_end(&mut &c, &mut bytes).expect("the child's report");
                    let st = child.as_mut().map(|g| g.child().wait().expect("child exit"));
                    assert!(st.is_some_and(|s| s.success()), "child failed: {st:?}");
                    decode_report(&bytes)
                }
            };
            let _ = std::fs::remove_file(&sock);
            let echoed = sender.join().expect("sender");
            (a_seen, queued_by_a, a_stats, b_seen, echoed)
        });
        let Some((a_seen, queued_by_a, a_stats, (b_seen, b_stats), echoed)) = res else { return };
        assert!(!b_seen.is_empty(), "B received nothing");
        let mut times = vec![0u32; N as usize];
        for &q in a_seen.iter().chain(&b_seen) {
            times[q as usize] += 1;
        }
        let lost: Vec<usize> = (0..N as usize).filter(|&i| times[i] == 0).collect();
        let twice: Vec<usize> = (0..N as usize).filter(|&i| times[i] > 1).collect();
        assert!(
            lost.is_empty() && twice.is_empty(),
            "lost {lost:?}, received twice {twice:?} (A {}, B {})",
            a_seen.len(),
            b_seen.len()
        );
        assert!(a_seen.iter().max() < b_seen.iter().min(), "B took over where A stopped");
        let not_echoed: Vec<usize> = (0..N as usize).filter(|&i| echoed[i] != 1).collect();
        assert!(not_echoed.is_empty(), "echoes missing or doubled for {not_echoed:?}");
        assert!(!queued_by_a.is_empty() && queued_by_a.iter().all(|&q| echoed[q as usize] == 1));
        for st in [a_stats, b_stats] {
            assert_eq!((st.rx_ring_full, st.rx_fill_ring_empty, st.rx_dropped), (0, 0, 0), "{st:?}");
        }
    }

    /// Sends `e` over `c`: the encoded state, with the UMEM memfd and the sockets attached.
    fn send_export(c: &std::os::unix::net::UnixStream, e: &XskExport) {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let mut bytes = Vec::new();
        e.state.encode(&mut bytes);
        let mut fds = vec![e.umem.as_fd()];
        fds.extend(e.sockets.iter().map(AsFd::as_fd));
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        assert!(cmsg.push(SendAncillaryMessage::ScmRights(&fds)));
        let len = (bytes.len() as u32).to_ne_bytes();
        let iov = [std::io::IoSlice::new(&len), std::io::IoSlice::new(&bytes)];
        rustix::net::sendmsg(c, &iov, &mut cmsg, SendFlags::empty()).expect("sendmsg");
    }

    /// The adopter's side of [`send_export`].
    fn recv_export(c: &std::os::unix::net::UnixStream) -> XskExport {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        let mut buf = vec![0u8; 1 << 20];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = rustix::net::recvmsg(c, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC).expect("recvmsg");
        let mut fds: Vec<OwnedFd> = Vec::new();
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(f) = m {
                fds.extend(f);
            }
        }
        let mut got = msg.bytes;
        let want = u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize + 4;
        while got < want {
            let n = std::io::Read::read(&mut &*c, &mut buf[got..]).expect("read");
            assert!(n > 0, "state cut short");
            got += n;
        }
        let state = XskState::decode(&mut &buf[4..want]).expect("state");
        let mut fds = fds.into_iter();
        let umem = fds.next().expect("the UMEM memfd");
        XskExport { state, umem, sockets: fds.collect() }
    }

    fn decode_report(b: &[u8]) -> (Vec<u32>, SocketStats) {
        let w: Vec<u64> = b.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
        let st = SocketStats {
            rx_dropped: w[0],
            rx_ring_full: w[1],
            rx_fill_ring_empty: w[2],
            rx_invalid_descs: w[3],
            tx_invalid_descs: w[4],
            tx_ring_empty: w[5],
        };
        (w[6..].iter().map(|&q| q as u32).collect(), st)
    }

    /// The child half of [`handover_keeps_every_frame`] with [`Adopter::ChildProcess`]: run
    /// by that test (with `--ignored --exact`), never on its own: connects to the socket the
    /// parent named, adopts the sockets it receives, echoes until the end marker and reports
    /// the requests it saw and its socket's counters.
    #[test]
    #[ignore = "the child process of handover_to_a_child_process_loses_no_frame; started by it"]
    fn adopt_child() {
        let path =
            std::env::var_os("XLB_XSK_ADOPT_SOCKET").expect("started by handover_to_a_child_process_loses_no_frame");
        let c = std::os::unix::net::UnixStream::connect(path).expect("connect to the parent");
        let mut b = Xsk::adopt(recv_export(&c), None).expect("B adopts");
        let seen = echo_until_end(&mut b);
        let st = b.socket_stats(0).unwrap().unwrap();
        let mut out = Vec::new();
        for v in [
            st.rx_dropped,
            st.rx_ring_full,
            st.rx_fill_ring_empty,
            st.rx_invalid_descs,
            st.tx_invalid_descs,
            st.tx_ring_empty,
        ] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        for q in seen {
            out.extend_from_slice(&u64::from(q).to_ne_bytes());
        }
        std::io::Write::write_all(&mut &c, &out).expect("report");
    }

    #[test]
    fn handover_to_a_thread_loses_no_frame() {
        handover_keeps_every_frame("handover_to_a_thread_loses_no_frame", Adopter::Thread);
    }

    #[test]
    fn handover_to_a_child_process_loses_no_frame() {
        handover_keeps_every_frame("handover_to_a_child_process_loses_no_frame", Adopter::ChildProcess);
    }

    /// The free list of sockets adopted from another process (their state decoded from
    /// bytes) has room for every frame of the UMEM, as a new `Xsk`'s has: completions and
    /// released frames join it without the worker loop allocating.
    #[test]
    fn an_adopted_free_list_has_room_for_every_frame() {
        in_private_netns("an_adopted_free_list_has_room_for_every_frame", || {
            let x = open_on_lo();
            assert!(x.free.capacity() >= x.total, "a new Xsk's");
            let mut e = x.export();
            let mut bytes = Vec::new();
            e.state.encode(&mut bytes);
            e.state = XskState::decode(&mut &bytes[..]).unwrap();
            let y = Xsk::adopt(e, None).expect("adopt");
            assert!(y.free.len() < y.total, "frames in the fill ring");
            assert!(y.free.capacity() >= y.total, "{} of {}", y.free.capacity(), y.total);
        });
    }

    /// A handed-over state whose frame count is corrupt (far more frames than its UMEM memfd
    /// holds) is refused before anything is allocated for it: adopting it must not cost a
    /// byte per announced frame, which a node without that much memory cannot give (the
    /// process would abort). The adoption runs in a child process (this test binary running
    /// [`adopt_corrupt_state_child`]) whose address space is limited to 1 GiB.
    #[test]
    fn a_state_announcing_more_frames_than_its_memfd_holds_is_refused_before_allocating_for_them() {
        let exe = std::env::current_exe().expect("test binary");
        let out = std::process::Command::new(exe)
            .args(["--ignored", "--exact", "xsk::tests::adopt_corrupt_state_child", "--nocapture"])
            .env("XLB_XSK_CORRUPT_STATE_CHILD", "1")
            .output()
            .expect("child process");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "child: {:?}\n{text}", out.status);
    }

    /// The child half of
    /// [`a_state_announcing_more_frames_than_its_memfd_holds_is_refused_before_allocating_for_them`].
    #[test]
    #[ignore = "the child process of a_state_announcing_more_frames_than_its_memfd_holds_is_refused_before_allocating_for_them"]
    fn adopt_corrupt_state_child() {
        assert!(std::env::var_os("XLB_XSK_CORRUPT_STATE_CHILD").is_some(), "started by its parent test");
        let limit = libc::rlimit { rlim_cur: 1 << 30, rlim_max: 1 << 30 };
        // SAFETY: a valid rlimit on the stack, only read; limits this (child) process only.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &raw const limit) }, 0);
        let memfd = || {
            // SAFETY: a NUL-terminated name; returns a new descriptor or -1.
            let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: a new descriptor nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        // Free and in-ring counts add up to the (corrupt) frame count, as the check wants.
        let state = XskState {
            frame_count: u32::MAX,
            frame_size: 2048,
            ring_size: 4,
            need_wakeup: true,
            huge_pages: false,
            ports: vec![PortState {
                ifname: "eth0".into(),
                queue: 0,
                zero_copy: false,
                in_fill: u32::MAX - 1,
                in_tx: 0,
            }],
            free: vec![0],
        };
        // A memfd stands in for the socket: the state is refused before the sockets are used.
        let e = XskExport { state, umem: memfd(), sockets: vec![memfd()] };
        let err = Xsk::adopt(e, None).unwrap_err().to_string();
        assert!(err.contains("memfd holds 0 bytes"), "{err}");
    }

    #[test]
    fn state_encoding_round_trips_and_adopt_refuses_a_bad_free_list() {
        let st = XskState {
            frame_count: 4,
            frame_size: 2048,
            ring_size: 4,
            need_wakeup: true,
            huge_pages: false,
            ports: vec![PortState { ifname: "eth0".into(), queue: 3, zero_copy: false, in_fill: 2, in_tx: 0 }],
            free: vec![0, 2048 + 256],
        };
        let mut b = Vec::new();
        st.encode(&mut b);
        st.encode(&mut b);
        let mut r = &b[..];
        assert_eq!(XskState::decode(&mut r).unwrap(), st);
        assert_eq!(XskState::decode(&mut r).unwrap(), st);
        assert!(r.is_empty());
        assert!(XskState::decode(&mut &b[..b.len() / 2 - 3]).is_err());
        // A memfd of `len` bytes.
        let memfd = |len: libc::off_t| {
            // SAFETY: a NUL-terminated name; returns a new descriptor or -1.
            let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: a new descriptor nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: plain system call on our descriptor.
            assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }, 0);
            fd
        };
        let sock = || xdp_socket().expect("AF_XDP socket");
        if xlb_testkit::skip_without_root("state_encoding_round_trips_and_adopt_refuses_a_bad_free_list") {
            return;
        }
        for (free, why) in [(vec![0, 256], "twice"), (vec![0, 8192], "outside"), (vec![0], "free frames")] {
            // A memfd as long as the state's 4 frames: the free list is what is wrong.
            let e = XskExport { state: XskState { free, ..st.clone() }, umem: memfd(4 * 2048), sockets: vec![sock()] };
            let err = Xsk::adopt(e, None).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        // A consistent state whose descriptor is an unbound socket: refused, not mapped.
        let e = XskExport { state: st.clone(), umem: memfd(0), sockets: vec![sock()] };
        let err = Xsk::adopt(e, None).unwrap_err().to_string();
        assert!(err.contains("memfd holds 0 bytes") || err.contains("not a bound"), "{err}");
    }
}
