//! AF_XDP sockets and UMEM: the only module of this crate with `unsafe` code.
//!
//! One [`Xsk`] per worker: a UMEM (xsk-rs) shared by the worker's sockets, one socket per
//! (interface, queue) the worker serves, and a free list. Every frame descriptor is in
//! exactly one place at any time — the free list, a fill ring, an RX batch being processed
//! (as an [`OwnedFrame`]), or a TX ring — which is what makes the safe API sound: only an
//! [`OwnedFrame`], which is neither `Clone` nor `Copy`, gives access to frame memory, and
//! handing it to [`Xsk::transmit`] or [`Xsk::release`] consumes it.
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

/// A received frame, owned by the worker until transmitted or released.
#[derive(Debug)]
pub struct OwnedFrame {
    desc: FrameDesc,
}

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
        let (umem, descs) = Umem::new(ucfg, frames, false).map_err(|source| XskError::Umem {
            frames: cfg.frame_count,
            size: cfg.frame_size,
            source,
        })?;
        let mut out = Self {
            umem,
            ports: Vec::with_capacity(ports.len()),
            total: descs.len(),
            free: descs,
            scratch: Vec::with_capacity(cfg.ring_size as usize),
            ring_size: cfg.ring_size,
            need_wakeup: cfg.need_wakeup,
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
        if self.need_wakeup && p.fill.needs_wakeup() {
            let fd = p.rx.fd_mut();
            let _ = p.fill.wakeup(fd, 0);
        }
    }

    /// Receives up to `max` frames from port `i` into `out`. With need-wakeup on and the
    /// ring empty, waits up to `timeout_ms` (0 = do not wait) in `poll(2)`.
    pub fn receive(&mut self, i: usize, out: &mut Vec<OwnedFrame>, max: usize, timeout_ms: i32) -> usize {
        let Some(p) = self.ports.get_mut(i) else { return 0 };
        self.scratch.clear();
        self.scratch.resize(max, FrameDesc::default());
        // SAFETY: the RX ring belongs to this UMEM; received descriptors are ours alone
        // and are wrapped in `OwnedFrame` at once.
        let n = unsafe {
            if timeout_ms > 0 {
                p.rx.poll_and_consume(&mut self.scratch, timeout_ms).unwrap_or(0)
            } else {
                p.rx.consume(&mut self.scratch)
            }
        };
        p.in_fill -= n.min(p.in_fill);
        out.extend(self.scratch.drain(..n).map(|desc| OwnedFrame { desc }));
        n
    }

    /// Runs `op` on the frame's whole data segment (its capacity, not just the current
    /// length) and the current length; `op` returns the new length (clamped to the capacity)
    /// and a result. The pipeline rewrites frames in place through this.
    pub fn with_buffer<R>(&self, f: &mut OwnedFrame, op: impl FnOnce(&mut [u8], usize) -> (usize, R)) -> R {
        let len = f.desc.lengths().data();
        // SAFETY: `OwnedFrame` proves exclusive ownership: the descriptor is in no ring and
        // on no list, and came from this UMEM.
        let mut data = unsafe { self.umem.data_mut(&mut f.desc) };
        let cap = data.cursor().buf_len();
        data.cursor().set_pos(cap);
        let (new_len, r) = op(data.contents_mut(), len);
        data.cursor().set_pos(new_len.min(cap));
        r
    }

    /// Queues frames for transmit on port `i`; frames the ring refuses go back to the free
    /// list (counted by the caller as TX drops). Returns how many were queued.
    pub fn transmit(&mut self, i: usize, frames: &mut Vec<OwnedFrame>) -> usize {
        let Some(p) = self.ports.get_mut(i) else {
            self.free.extend(frames.drain(..).map(|f| f.desc));
            return 0;
        };
        self.scratch.clear();
        self.scratch.extend(frames.drain(..).map(|f| f.desc));
        let room = p.tx.nb_free(self.ring_size) as usize;
        let n = room.min(self.scratch.len());
        // SAFETY: the descriptors were owned (`OwnedFrame`) and pass to the kernel here.
        let done = if n > 0 { unsafe { p.tx.produce(&self.scratch[..n]) } } else { 0 };
        p.in_tx += done;
        self.free.extend(self.scratch.drain(done..));
        done
    }

    /// Returns a frame to the free list (dropped packets).
    pub fn release(&mut self, f: OwnedFrame) {
        self.free.push(f.desc);
    }

    /// Makes the kernel send what is in port `i`'s TX ring. Copy mode moves at most 32
    /// frames per `sendto()`, so this repeats (bounded) until the ring is empty, taking
    /// completions as it goes.
    pub fn kick(&mut self, i: usize) {
        for _ in 0..64 {
            let Some(p) = self.ports.get_mut(i) else { return };
            if p.tx.nb_free(self.ring_size) >= self.ring_size || p.in_tx == 0 {
                return;
            }
            if p.tx.needs_wakeup() || !self.need_wakeup {
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
        let mut f = OwnedFrame { desc };
        self.with_buffer(&mut f, |buf, _| {
            let n = bytes.len().min(buf.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            (n, ())
        });
        Some(f)
    }

    /// Copies the frame's current contents into `out` (for handing it to another worker).
    pub fn copy_out(&self, f: &mut OwnedFrame, out: &mut Vec<u8>) {
        self.with_buffer(f, |buf, len| {
            out.clear();
            out.extend_from_slice(&buf[..len.min(buf.len())]);
            (len, ())
        });
    }
}
