//! AF_XDP sockets and UMEM: the only module of this crate with `unsafe` code.
//!
//! One [`Xsk`] per worker: a UMEM (xsk-rs) shared by the worker's sockets, one socket per
//! (interface, queue) the worker serves, and a free list. Every frame descriptor is in
//! exactly one place at any time — the free list, a fill ring, an RX batch being processed
//! (as an [`OwnedFrame`]), or a TX ring — which is what makes the safe API sound: only an
//! [`OwnedFrame`], which is neither `Clone` nor `Copy`, gives access to frame memory, and
//! handing it to [`Xsk::transmit`] or [`Xsk::release`] consumes it. Every frame carries the
//! number of the UMEM it came from, and every method that takes one checks it: a frame handed
//! to another worker's [`Xsk`] (whose UMEM does not contain it, and whose fill ring may hold
//! the same offset) is refused, never touched ([`ForeignFrame`]).
//!
//! Kernel documentation: <https://docs.kernel.org/networking/af_xdp.html>. Traps found on
//! veth (shared/docs/feasibility.md): copy-mode TX moves at most 32 frames per `sendto()`, so
//! [`Xsk::kick`] repeats until the TX ring drains; frames from the completion ring have length
//! 0, so lengths are always set before transmit; zero-copy is refused (`EOPNOTSUPP`) and the
//! bind falls back to copy mode.
#![allow(unsafe_code, reason = "AF_XDP rings and UMEM: the crate's one unsafe module")]

use std::ffi::CString;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::nat::Packet;

use xsk_rs::config::{BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

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
    /// Zero-copy policy.
    pub copy_mode: CopyMode,
    /// Use the `XDP_USE_NEED_WAKEUP` protocol (interrupt-driven; kernel ≥ 5.4). With it off,
    /// the worker busy-polls.
    pub need_wakeup: bool,
    /// Let libxdp attach its default program (redirects *all* traffic of the queue). Only
    /// for tests without our steering program; xlb itself sets this to `false`
    /// (`XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD`).
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
    /// Try to back the UMEM with huge pages (`MAP_HUGETLB`; needs reserved pages,
    /// `vm.nr_hugepages`); falls back to normal pages quietly (logged once).
    pub huge_pages: bool,
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
            copy_mode: CopyMode::Auto,
            need_wakeup: true,
            load_default_program: false,
            skb_mode: false,
            busy_poll: None,
            huge_pages: true,
        }
    }
}

/// Why a socket or UMEM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    /// A size in the configuration is not acceptable.
    #[error("bad AF_XDP configuration: {0}")]
    Config(String),
    /// UMEM creation failed.
    #[error("creating the UMEM ({frames} frames of {size} bytes): {source}")]
    Umem {
        /// Frames.
        frames: u32,
        /// Frame size.
        size: u32,
        /// Cause.
        #[source]
        source: xsk_rs::umem::UmemCreateError,
    },
    /// Socket creation or bind failed.
    #[error("binding an AF_XDP socket to {ifname} queue {queue} ({mode}): {source}")]
    Socket {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// Mode tried.
        mode: &'static str,
        /// Cause.
        #[source]
        source: xsk_rs::socket::SocketCreateError,
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
    /// The kernel handed out no fill/completion rings for a new (interface, queue).
    #[error("no fill/completion ring for {ifname} queue {queue}")]
    NoRings {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
    },
}

/// One bound socket.
struct Port {
    ifname: String,
    queue: u32,
    tx: TxQueue,
    rx: RxQueue,
    fill: FillQueue,
    comp: CompQueue,
    zero_copy: bool,
    in_fill: usize,
    in_tx: usize,
}

impl core::fmt::Debug for Port {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Port")
            .field("ifname", &self.ifname)
            .field("queue", &self.queue)
            .field("zero_copy", &self.zero_copy)
            .field("in_fill", &self.in_fill)
            .field("in_tx", &self.in_tx)
            .finish_non_exhaustive()
    }
}

/// A received frame, owned by the worker until transmitted or released. It belongs to the
/// UMEM of the [`Xsk`] that produced it; other `Xsk`s refuse it.
#[derive(Debug)]
pub struct OwnedFrame {
    desc: FrameDesc,
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
        self.desc.lengths().data()
    }
    /// Whether the frame is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

/// A worker's UMEM and sockets.
#[derive(Debug)]
pub struct Xsk {
    umem: Umem,
    ports: Vec<Port>,
    free: Vec<FrameDesc>,
    total: usize,
    scratch: Vec<FrameDesc>,
    ring_size: u32,
    need_wakeup: bool,
    busy_poll: bool,
    id: u32,
    huge_pages: bool,
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

fn qsize(n: u32) -> Result<QueueSize, XskError> {
    QueueSize::new(n).map_err(|e| XskError::Config(e.to_string()))
}

impl Xsk {
    /// Creates the UMEM and binds one socket per `(interface, queue)`, in port order.
    ///
    /// # Errors
    /// [`XskError`] naming the interface and queue (e.g. no such interface, no permission,
    /// `EOPNOTSUPP` for forced zero-copy).
    pub fn open(cfg: &XskConfig, ports: &[(String, u32)]) -> Result<Self, XskError> {
        let frames = NonZeroU32::new(cfg.frame_count).ok_or_else(|| XskError::Config("frame_count 0".into()))?;
        let ucfg = UmemConfig::builder()
            .frame_size(FrameSize::new(cfg.frame_size).map_err(|e| XskError::Config(e.to_string()))?)
            .fill_queue_size(qsize(cfg.ring_size)?)
            .comp_queue_size(qsize(cfg.ring_size)?)
            .build()
            .map_err(|e| XskError::Config(e.to_string()))?;
        let made = if cfg.huge_pages { Umem::new(ucfg, frames, true).ok() } else { None };
        let huge = made.is_some();
        if cfg.huge_pages && !huge {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::info!("no huge pages for the UMEM (vm.nr_hugepages too low?): using normal pages");
            });
        }
        let (umem, descs) = match made {
            Some(m) => m,
            None => Umem::new(ucfg, frames, false).map_err(|source| XskError::Umem {
                frames: cfg.frame_count,
                size: cfg.frame_size,
                source,
            })?,
        };
        let mut out = Self {
            umem,
            ports: Vec::with_capacity(ports.len()),
            total: descs.len(),
            free: descs,
            scratch: Vec::with_capacity(cfg.ring_size as usize),
            ring_size: cfg.ring_size,
            need_wakeup: cfg.need_wakeup,
            busy_poll: cfg.busy_poll.is_some(),
            id: NEXT_UMEM.fetch_add(1, Ordering::Relaxed),
            huge_pages: huge,
        };
        for (ifname, queue) in ports {
            let mut port = out.bind(cfg, ifname, *queue)?;
            if let Some(first) = out.ports.first() {
                // Later sockets share the first one's UMEM: libxdp binds them with
                // XDP_SHARED_UMEM and no mode flags (the kernel refuses flags there), and the
                // kernel gives them the UMEM's mode (`xp_assign_dev_shared`). So the first
                // socket's mode is theirs, whatever the attempt that "succeeded".
                port.zero_copy = first.zero_copy;
            }
            out.ports.push(port);
        }
        for i in 0..out.ports.len() {
            out.refill(i);
        }
        Ok(out)
    }

    fn bind(&self, cfg: &XskConfig, ifname: &str, queue: u32) -> Result<Port, XskError> {
        let name = CString::new(ifname).map_err(|_| XskError::Config(format!("interface name {ifname:?}")))?;
        let iface = Interface::new(name);
        let attempts: &[(BindFlags, &'static str)] = match cfg.copy_mode {
            CopyMode::Auto => &[(BindFlags::XDP_ZEROCOPY, "zero-copy"), (BindFlags::XDP_COPY, "copy")],
            CopyMode::Copy => &[(BindFlags::XDP_COPY, "copy")],
            CopyMode::ZeroCopy => &[(BindFlags::XDP_ZEROCOPY, "zero-copy")],
        };
        let mut last = None;
        for (i, (mode_flag, mode)) in attempts.iter().enumerate() {
            let mut bind = *mode_flag;
            if cfg.need_wakeup {
                bind |= BindFlags::XDP_USE_NEED_WAKEUP;
            }
            let libxdp = if cfg.load_default_program {
                LibxdpFlags::empty()
            } else {
                LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD
            };
            let xdp = if cfg.skb_mode { XdpFlags::XDP_FLAGS_SKB_MODE } else { XdpFlags::XDP_FLAGS_DRV_MODE };
            let scfg = SocketConfig::builder()
                .rx_queue_size(qsize(cfg.ring_size)?)
                .tx_queue_size(qsize(cfg.ring_size)?)
                .libxdp_flags(libxdp)
                .xdp_flags(xdp)
                .bind_flags(bind)
                .build();
            // SAFETY: each (interface, queue) is bound once per UMEM (the caller passes
            // distinct pairs; xlb gives each worker its own queues), and with the default
            // program inhibited no program is detached behind xsk-rs's back (xsk-rs#21).
            match unsafe { Socket::new(scfg, &self.umem, &iface, queue) } {
                Ok((tx, rx, Some((fill, comp)))) => {
                    if let Some(bp) = cfg.busy_poll {
                        set_busy_poll(rx.fd().as_raw_fd(), bp).map_err(|(option, source)| XskError::SocketOption {
                            ifname: ifname.to_owned(),
                            queue,
                            option,
                            source,
                        })?;
                    }
                    if self.ports.is_empty() {
                        tracing::info!(ifname, queue, mode, "AF_XDP socket bound");
                    } else {
                        tracing::info!(ifname, queue, "AF_XDP socket bound on the shared UMEM (its mode)");
                    }
                    return Ok(Port {
                        ifname: ifname.to_owned(),
                        queue,
                        tx,
                        rx,
                        fill,
                        comp,
                        zero_copy: mode_flag.contains(BindFlags::XDP_ZEROCOPY),
                        in_fill: 0,
                        in_tx: 0,
                    });
                }
                Ok((_, _, None)) => return Err(XskError::NoRings { ifname: ifname.to_owned(), queue }),
                Err(source) => {
                    if i + 1 < attempts.len() {
                        tracing::info!(ifname, queue, error = %source, "zero-copy refused, falling back to copy mode");
                    }
                    last = Some(XskError::Socket { ifname: ifname.to_owned(), queue, mode, source });
                }
            }
        }
        Err(last.unwrap_or_else(|| XskError::Config("no bind mode".into())))
    }

    /// Raw socket fds in port order, for the steering program's XSKMAP.
    pub fn fds(&self) -> Vec<RawFd> {
        self.ports.iter().map(|p| p.rx.fd().as_raw_fd()).collect()
    }

    /// The kernel's counters of port `i`'s socket: one `getsockopt` system call, so call it
    /// between batches and rarely (the worker does once a second). `None` for a port that
    /// does not exist.
    ///
    /// # Errors
    /// The `getsockopt` error (not expected on a bound socket).
    pub fn socket_stats(&self, i: usize) -> Option<std::io::Result<SocketStats>> {
        let p = self.ports.get(i)?;
        Some(p.rx.fd().xdp_statistics().map(|s| SocketStats {
            rx_dropped: s.rx_dropped(),
            rx_ring_full: s.rx_ring_full(),
            rx_fill_ring_empty: s.rx_fill_ring_empty_descs(),
            rx_invalid_descs: s.rx_invalid_descs(),
            tx_invalid_descs: s.tx_invalid_descs(),
            tx_ring_empty: s.tx_ring_empty_descs(),
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
        self.huge_pages
    }

    /// Takes completed TX frames back onto the free list, for every port.
    pub fn complete(&mut self) {
        for p in &mut self.ports {
            let n = p.comp.nb_avail(self.ring_size) as usize;
            if n == 0 {
                continue;
            }
            let start = self.free.len();
            self.free.resize(start + n, FrameDesc::default());
            // SAFETY: the completion ring belongs to this UMEM; the consumed descriptors
            // were ours (in TX) and now return to the free list only.
            let got = unsafe { p.comp.consume(&mut self.free[start..]) };
            self.free.truncate(start + got);
            p.in_tx -= got.min(p.in_tx);
        }
    }

    /// Tops up port `i`'s fill ring from the free list (RX frames are reused for TX, so
    /// nothing is held back).
    pub fn refill(&mut self, i: usize) {
        let Some(p) = self.ports.get_mut(i) else { return };
        let want = p.fill.nb_free(self.ring_size) as usize;
        let n = want.min(self.free.len());
        if n == 0 {
            return;
        }
        let start = self.free.len() - n;
        // SAFETY: these descriptors come from the free list, so nothing else references
        // their frames; after `produce` they belong to the kernel until RX hands them back.
        // `produce` takes all `n` or none.
        let done = unsafe { p.fill.produce(&self.free[start..]) };
        if done > 0 {
            self.free.truncate(start);
        }
        p.in_fill += done;
    }

    /// Receives up to `max` frames from port `i` into `out`; returns how many. With the ring
    /// empty: busy-polls the queue's NAPI once ([`XskConfig::busy_poll`]) or, when the kernel
    /// asks for it (`need_wakeup` on the fill ring), wakes it with `recvfrom`; with
    /// `timeout_ms > 0` and need-wakeup on, waits up to that long in `poll(2)` instead.
    pub fn receive(&mut self, i: usize, out: &mut Vec<OwnedFrame>, max: usize, timeout_ms: i32) -> usize {
        let Some(p) = self.ports.get_mut(i) else { return 0 };
        self.scratch.clear();
        self.scratch.resize(max, FrameDesc::default());
        // SAFETY: the RX ring belongs to this UMEM; received descriptors are ours alone
        // and are wrapped in `OwnedFrame` at once.
        let mut n = unsafe { p.rx.consume(&mut self.scratch) };
        if n == 0 {
            if self.busy_poll || (self.need_wakeup && p.fill.needs_wakeup()) {
                recv_wakeup(p.rx.fd().as_raw_fd());
                // SAFETY: as above.
                n = unsafe { p.rx.consume(&mut self.scratch) };
            }
            if n == 0 && timeout_ms > 0 {
                // SAFETY: as above.
                n = unsafe { p.rx.poll_and_consume(&mut self.scratch, timeout_ms).unwrap_or(0) };
            }
        }
        p.in_fill -= n.min(p.in_fill);
        let umem = self.id;
        out.extend(self.scratch.drain(..n).map(|desc| OwnedFrame { desc, umem }));
        n
    }

    /// Waits up to `timeout_ms` in one `poll(2)` over every socket's RX ring (for a worker
    /// with nothing to do: it sleeps instead of spinning, and wakes at the first frame on any
    /// port). Returns whether a socket is readable.
    pub fn wait(&mut self, timeout_ms: i32) -> bool {
        let mut fds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 8];
        let mut n = 0;
        for (slot, p) in fds.iter_mut().zip(&self.ports) {
            *slot = libc::pollfd { fd: p.rx.fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
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

    /// Runs `op` over the frames of `frames` as [`Packet`]s at head 0, each spanning its whole
    /// data segment (the pipeline may grow a frame into its tailroom); afterwards each frame's
    /// length is the packet's `head + len`, clamped to the segment. At most 64 frames are
    /// passed (the worker's batch); the rest are left alone.
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
        let mut lens = [0usize; 64];
        let mut it = frames.iter_mut();
        // SAFETY: every frame is an `OwnedFrame` of this UMEM (checked above): its descriptor
        // is in no ring and on no list, so these are exclusive, disjoint views of frame memory.
        let mut datas: [Option<xsk_rs::umem::frame::DataMut<'_>>; 64] =
            core::array::from_fn(|_| it.next().map(|f| unsafe { self.umem.data_mut(&mut f.desc) }));
        for (d, l) in datas.iter_mut().zip(&mut lens) {
            if let Some(d) = d {
                *l = d.contents().len();
                let mut c = d.cursor();
                let cap = c.buf_len();
                c.set_pos(cap);
            }
        }
        let mut dit = datas.iter_mut().zip(lens);
        let mut pkts: [Packet<'_>; 64] = core::array::from_fn(|_| match dit.next() {
            Some((Some(d), len)) => Packet::new(d.contents_mut(), 0, len),
            _ => Packet::new(&mut [], 0, 0),
        });
        let r = op(pkts.get_mut(..n).unwrap_or_default());
        for (l, p) in lens.iter_mut().zip(&pkts) {
            *l = p.head + p.len;
        }
        // `pkts` (and its borrows of `datas`) ends here.
        for (d, l) in datas.iter_mut().zip(lens) {
            if let Some(d) = d {
                let mut c = d.cursor();
                let cap = c.buf_len();
                c.set_pos(l.min(cap));
            }
        }
        Ok(r)
    }

    /// Runs `op` on the frame's whole data segment (its capacity, not just the current
    /// length) and the current length; `op` returns the new length (clamped to the capacity)
    /// and a result. `None` (and `op` not run) for a frame of another UMEM.
    pub fn with_buffer<R>(&self, f: &mut OwnedFrame, op: impl FnOnce(&mut [u8], usize) -> (usize, R)) -> Option<R> {
        if f.umem != self.id {
            return None;
        }
        let len = f.desc.lengths().data();
        // SAFETY: `OwnedFrame` proves exclusive ownership: the descriptor is in no ring and
        // on no list, and came from this UMEM (checked above).
        let mut data = unsafe { self.umem.data_mut(&mut f.desc) };
        let cap = data.cursor().buf_len();
        data.cursor().set_pos(cap);
        let (new_len, r) = op(data.contents_mut(), len);
        data.cursor().set_pos(new_len.min(cap));
        Some(r)
    }

    /// Queues frames for transmit on port `i`. When the TX ring is full, kicks the kernel,
    /// takes completions and tries again (a bounded number of times) before giving up; frames
    /// that still do not fit go back to the free list (the caller counts them as TX drops).
    /// Frames of another UMEM are left in `frames`; the rest are taken. Returns how many were
    /// queued.
    pub fn transmit(&mut self, i: usize, frames: &mut Vec<OwnedFrame>) -> usize {
        let id = self.id;
        self.scratch.clear();
        let mut k = 0;
        while k < frames.len() {
            if frames.get(k).is_some_and(|f| f.umem == id) {
                self.scratch.push(frames.swap_remove(k).desc);
            } else {
                k += 1;
            }
        }
        if i >= self.ports.len() {
            self.free.append(&mut self.scratch);
            return 0;
        }
        let mut done = 0;
        for attempt in 0..TX_RETRIES {
            let Some(p) = self.ports.get_mut(i) else { break };
            let room = p.tx.nb_free(self.ring_size) as usize;
            let n = room.min(self.scratch.len() - done);
            // SAFETY: the descriptors were owned (`OwnedFrame`, this UMEM) and pass to the
            // kernel here.
            let q = if n > 0 { unsafe { p.tx.produce(&self.scratch[done..done + n]) } } else { 0 };
            p.in_tx += q;
            done += q;
            if done == self.scratch.len() || attempt + 1 == TX_RETRIES {
                break;
            }
            self.kick_port(i, true);
            self.complete();
        }
        self.free.extend(self.scratch.drain(done..));
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
        self.free.push(f.desc);
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

    fn kick_port(&mut self, i: usize, once: bool) {
        let Some(p) = self.ports.get(i) else { return };
        if p.zero_copy {
            if p.in_tx > 0 && (!self.need_wakeup || self.busy_poll || p.tx.needs_wakeup()) {
                let _ = p.tx.wakeup();
            }
            return;
        }
        for _ in 0..if once { 1 } else { 64 } {
            let Some(p) = self.ports.get_mut(i) else { return };
            if p.tx.nb_free(self.ring_size) >= self.ring_size || p.in_tx == 0 {
                return;
            }
            if p.tx.needs_wakeup() || !self.need_wakeup || self.busy_poll {
                let _ = p.tx.wakeup();
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
        let desc = self.free.pop()?;
        let mut f = OwnedFrame { desc, umem: self.id };
        self.with_buffer(&mut f, |buf, _| {
            let n = bytes.len().min(buf.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            (n, ())
        });
        Some(f)
    }

    /// Copies the frame's current contents into `out` (for handing it to another worker).
    /// `false` (and `out` untouched) for a frame of another UMEM.
    pub fn copy_out(&self, f: &mut OwnedFrame, out: &mut Vec<u8>) -> bool {
        self.with_buffer(f, |buf, len| {
            out.clear();
            out.extend_from_slice(&buf[..len.min(buf.len())]);
            (len, ())
        })
        .is_some()
    }
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
    fn with_batch_hands_out_whole_segments_and_keeps_the_lengths_the_op_sets() {
        in_private_netns("with_batch_hands_out_whole_segments_and_keeps_the_lengths_the_op_sets", || {
            let x = open_on_lo();
            let mut x = x;
            let mut frames: Vec<OwnedFrame> = (0..3).map(|i| x.frame_from(&[i; 60]).unwrap()).collect();
            let seen = x
                .with_batch(&mut frames, |pkts| {
                    let seen: Vec<(usize, usize, u8)> = pkts.iter().map(|p| (p.buf.len(), p.len, p.buf[0])).collect();
                    pkts[1].len = 100; // grown into the tailroom
                    pkts[2].len = 14; // shrunk
                    seen
                })
                .unwrap();
            assert_eq!(seen.len(), 3);
            for (i, (cap, len, first)) in seen.into_iter().enumerate() {
                assert!(cap >= 2048 - 256, "the whole data segment, got {cap}");
                assert_eq!((len, usize::from(first)), (60, i));
            }
            let lens: Vec<usize> = frames.iter().map(OwnedFrame::len).collect();
            assert_eq!(lens, vec![60, 100, 14]);
        });
    }
}
