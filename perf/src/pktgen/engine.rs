//! The generator and receiver loops on `dataplane::xsk::Xsk`.
//!
//! One thread does everything for a `run`: it opens the TX socket after `setns` into the TX
//! namespace and the RX socket after `setns` into the RX namespace (an AF_XDP socket binds to
//! an ifindex of its opener's namespace), then alternates sending and receiving. On a 2-core
//! box a second thread would compete with the device under test for the other core.
//!
//! **TX.** With separate TX and RX sockets the TX socket never receives (libxdp's program is
//! not loaded on its interface), so every UMEM frame cycles free list → TX ring → completion
//! ring → free list at its own address and keeps its contents. The generator therefore writes
//! the template into every free frame once ("priming") and afterwards only patches the
//! per-packet fields ([`Template::patch`]: address, port, stamp, two incremental checksums).
//! When TX and RX share one socket (same namespace, interface and queue), received frames
//! enter the free list too, so each frame gets a full template copy before the patch.
//! Copy-mode TX moves at most 32 frames per `sendto()`; [`Xsk::kick`] repeats until the ring
//! has drained, reaping the completion ring as it goes. The generator never queues more than
//! the ring has room for (ring size minus frames still in flight), so nothing is refused.
//!
//! **Stamps and phases.** Each trial uses two run ids: one for warmup, one for the measured
//! phase. Frames are stamped once per batch (one clock read per ≤ `batch` frames, all queued
//! and kicked together). The receiver counts a frame as measured only if it carries the
//! measured run id; warmup frames and stragglers of earlier trials are counted apart, and
//! frames without the stamp (ARP, IPv6, other traffic) are `rx_other`. After the measured
//! phase the RX side keeps receiving for a drain period (200 ms by default) before the
//! counts are final.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use dataplane::xsk::{OwnedFrame, Xsk, XskConfig};
use hdrhistogram::Histogram;

use super::frame::{FlowCursor, FlowSpace, FrameSpec, Proto, SYN_SPACE, Stamp, Template, parse_stamp, tag};
use super::rate::TokenBucket;
use crate::sys::{enter_netns, enter_netns_file, mono_ns, pin_cpu};

/// Where a socket goes: namespace (None = the caller's), interface, queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `ip netns` name, or None for the current namespace.
    pub netns: Option<String>,
    /// Interface name.
    pub iface: String,
    /// Queue id.
    pub queue: u32,
}

/// AF_XDP settings of the generator.
#[derive(Clone, Debug)]
pub struct SocketOpts {
    /// UMEM frames.
    pub frame_count: u32,
    /// Ring sizes (RX, TX, fill, completion).
    pub ring_size: u32,
    /// `XDP_USE_NEED_WAKEUP`.
    pub need_wakeup: bool,
    /// Attach libxdp's program in SKB mode instead of native mode (RX socket).
    pub skb_mode: bool,
}

impl Default for SocketOpts {
    fn default() -> Self {
        let d = XskConfig::default();
        Self { frame_count: d.frame_count, ring_size: d.ring_size, need_wakeup: d.need_wakeup, skb_mode: d.skb_mode }
    }
}

/// Everything `run` and `search` need besides the per-trial rate and times.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// TX socket.
    pub tx: Endpoint,
    /// RX socket; None = transmit only (no loss or latency figures).
    pub rx: Option<Endpoint>,
    /// CPU to pin the thread to.
    pub cpu: Option<usize>,
    /// What to send.
    pub frame: FrameSpec,
    /// Distinct 5-tuples (ignored for `syn`, which uses [`SYN_SPACE`] or more).
    pub flows: u64,
    /// Frames per TX batch.
    pub batch: usize,
    /// Socket settings.
    pub sockets: SocketOpts,
}

impl GenConfig {
    /// The size of the tuple space actually cycled: `flows`, or for `syn` at least
    /// [`SYN_SPACE`] so that every packet is a new flow.
    pub fn flow_space(&self) -> u64 {
        if self.frame.proto == Proto::Syn { self.flows.max(SYN_SPACE) } else { self.flows }
    }
}

/// Times and rate of one trial.
#[derive(Clone, Debug)]
pub struct TrialParams {
    /// Target rate in packets per second; 0 = as fast as possible.
    pub rate_pps: f64,
    /// Warmup (sent, not counted as measured).
    pub warmup: Duration,
    /// Measured phase.
    pub duration: Duration,
    /// How long RX keeps going after the last measured frame was sent.
    pub drain: Duration,
    /// Print a progress line on stderr each second.
    pub progress: bool,
}

/// Receive-side counts.
#[derive(Clone, Debug)]
pub struct RxTally {
    /// Frames with the measured run id.
    pub measured: u64,
    /// Frames with the warmup run id.
    pub warmup: u64,
    /// Stamped frames of another run id (earlier trials).
    pub stale: u64,
    /// Frames without a stamp.
    pub other: u64,
    /// One-way latency of measured frames, ns.
    pub latency: Histogram<u64>,
}

impl Default for RxTally {
    fn default() -> Self {
        Self::new()
    }
}

impl RxTally {
    /// Empty counts; the histogram covers 1 ns .. 100 s at 3 significant digits.
    pub fn new() -> Self {
        let latency = Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("constant, valid histogram bounds");
        Self { measured: 0, warmup: 0, stale: 0, other: 0, latency }
    }

    /// Every frame seen.
    pub fn total(&self) -> u64 {
        self.measured + self.warmup + self.stale + self.other
    }

    /// Counts one received frame, given its stamp (if any), the run ids of the current
    /// trial, and the receive time.
    #[inline]
    pub fn count(&mut self, stamp: Option<Stamp>, warmup_id: u8, measured_id: u8, now_ns: u64) {
        match stamp {
            None => self.other += 1,
            Some(s) if s.run == measured_id => {
                self.measured += 1;
                if now_ns >= s.ts_ns {
                    self.latency.saturating_record((now_ns - s.ts_ns).max(1));
                }
            }
            Some(s) if s.run == warmup_id => self.warmup += 1,
            Some(_) => self.stale += 1,
        }
    }
}

/// Outcome of one trial.
#[derive(Clone, Debug)]
pub struct TrialStats {
    /// Target rate (0 = as fast as possible).
    pub rate_pps: f64,
    /// Frames queued for TX in the measured phase.
    pub tx_packets: u64,
    /// Frames queued during warmup.
    pub tx_warmup: u64,
    /// Length of the measured phase, ns.
    pub elapsed_ns: u64,
    /// RX counts (all zero without an RX socket).
    pub rx: RxTally,
    /// Whether an RX socket counted anything.
    pub has_rx: bool,
}

impl TrialStats {
    /// Measured phase in seconds.
    pub fn duration_s(&self) -> f64 {
        self.elapsed_ns as f64 * 1e-9
    }

    /// TX rate of the measured phase.
    pub fn tx_pps(&self) -> f64 {
        rate(self.tx_packets, self.elapsed_ns)
    }

    /// RX rate of the measured frames over the measured phase.
    pub fn rx_pps(&self) -> f64 {
        rate(self.rx.measured, self.elapsed_ns)
    }

    /// Loss fraction: measured frames sent but not received (0 if nothing was sent; None
    /// without an RX socket). Duplicates cannot make it negative.
    pub fn loss(&self) -> Option<f64> {
        if !self.has_rx {
            return None;
        }
        if self.tx_packets == 0 {
            return Some(0.0);
        }
        Some(self.tx_packets.saturating_sub(self.rx.measured) as f64 / self.tx_packets as f64)
    }
}

/// Packets per second.
pub fn rate(n: u64, ns: u64) -> f64 {
    if ns == 0 { 0.0 } else { n as f64 * 1e9 / ns as f64 }
}

enum RxSock {
    None,
    Shared,
    Own(Xsk),
}

/// The generator: sockets, template and flow state. Create it on the thread that uses it.
/// Dropping it closes the sockets (libxdp detaches its program from the RX interface); the
/// thread is then in the RX namespace, where that program was attached.
pub struct Generator {
    // Field order is drop order: TX (no program) first, then RX.
    tx: Xsk,
    rx: RxSock,
    primed: bool,
    template: Template,
    flows: FlowCursor,
    flow_space: u64,
    seq: u64,
    next_run: u8,
    batch: usize,
    ring_size: usize,
    txbuf: Vec<OwnedFrame>,
    rxbuf: Vec<OwnedFrame>,
    stop: Arc<AtomicBool>,
}

impl core::fmt::Debug for Generator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Generator")
            .field("primed", &self.primed)
            .field("flow_space", &self.flow_space)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

fn xsk_config(o: &SocketOpts, load_default_program: bool) -> XskConfig {
    XskConfig {
        frame_count: o.frame_count,
        ring_size: o.ring_size,
        need_wakeup: o.need_wakeup,
        load_default_program,
        skb_mode: o.skb_mode,
        ..XskConfig::default()
    }
}

/// Enters `ns`, or back into the thread's original namespace (`orig`) for None.
fn enter(ns: Option<&str>, orig: &File) -> anyhow::Result<()> {
    match ns {
        Some(ns) => enter_netns(ns),
        None => enter_netns_file(orig),
    }
}

/// Opens a receive socket (libxdp's default program redirects the whole queue to it).
///
/// # Errors
/// Namespace or socket errors.
pub fn open_rx(ep: &Endpoint, o: &SocketOpts) -> anyhow::Result<Xsk> {
    if let Some(ns) = &ep.netns {
        enter_netns(ns)?;
    }
    Xsk::open(&xsk_config(o, true), &[(ep.iface.clone(), ep.queue)])
        .with_context(|| format!("RX socket on {} queue {}", ep.iface, ep.queue))
}

impl Generator {
    /// Pins the calling thread, enters the namespaces and opens the sockets.
    ///
    /// # Errors
    /// Bad frame or flow settings, namespace or socket errors.
    pub fn open(cfg: &GenConfig, stop: Arc<AtomicBool>) -> anyhow::Result<Self> {
        let template = Template::new(&cfg.frame).map_err(anyhow::Error::msg)?;
        let flow_space = cfg.flow_space();
        let flows = FlowSpace::new(cfg.frame.src_ip, flow_space).map_err(anyhow::Error::msg)?.cursor();
        anyhow::ensure!(cfg.batch > 0, "--batch must be at least 1");
        if let Some(cpu) = cfg.cpu {
            pin_cpu(cpu)?;
        }
        let orig = File::open("/proc/thread-self/ns/net").context("opening /proc/thread-self/ns/net")?;
        let shared = cfg.rx.as_ref() == Some(&cfg.tx);
        enter(cfg.tx.netns.as_deref(), &orig)?;
        let tx = Xsk::open(&xsk_config(&cfg.sockets, shared), &[(cfg.tx.iface.clone(), cfg.tx.queue)])
            .with_context(|| format!("TX socket on {} queue {}", cfg.tx.iface, cfg.tx.queue))?;
        let rx = match &cfg.rx {
            None => RxSock::None,
            Some(_) if shared => RxSock::Shared,
            Some(ep) => {
                enter(ep.netns.as_deref(), &orig)?;
                RxSock::Own(open_rx(&Endpoint { netns: None, ..ep.clone() }, &cfg.sockets)?)
            }
        };
        let mut g = Self {
            tx,
            rx,
            primed: false,
            template,
            flows,
            flow_space,
            seq: 0,
            next_run: (mono_ns() >> 20) as u8 & 0xfe,
            batch: cfg.batch,
            ring_size: cfg.sockets.ring_size as usize,
            txbuf: Vec::with_capacity(cfg.batch),
            rxbuf: Vec::with_capacity(256),
            stop,
        };
        if !shared {
            g.prime();
        }
        Ok(g)
    }

    /// Writes the template into every free frame (TX-only socket: those are the only frames
    /// TX will ever use, see the module doc).
    fn prime(&mut self) {
        let mut all = Vec::new();
        while let Some(f) = self.tx.frame_from(self.template.bytes()) {
            all.push(f);
        }
        for f in all {
            let _ = self.tx.release(f);
        }
        self.primed = true;
    }

    /// Size of the tuple space cycled.
    pub fn flow_space(&self) -> u64 {
        self.flow_space
    }

    /// Frame length.
    pub fn frame_len(&self) -> usize {
        self.template.len()
    }

    /// Queues up to `n` frames stamped with `run` and `now`, kicks, and returns how many
    /// the ring took.
    fn send(&mut self, n: usize, run: u8, now: u64) -> usize {
        let len = self.template.len();
        for _ in 0..n {
            let f = if self.primed { self.tx.frame_from(&[]) } else { self.tx.frame_from(self.template.bytes()) };
            let Some(mut f) = f else { break };
            let (ip, port) = self.flows.next_tuple();
            let tg = tag(run, self.seq);
            self.seq += 1;
            let t = &self.template;
            self.tx.with_buffer(&mut f, |buf, _| {
                t.patch(buf, ip, port, tg, now);
                (len, ())
            });
            self.txbuf.push(f);
        }
        let q = self.tx.transmit(0, &mut self.txbuf);
        self.tx.kick(0);
        q
    }

    /// Frames TX could queue now without the ring refusing any.
    fn tx_room(&mut self) -> usize {
        self.tx.complete();
        let a = self.tx.account();
        self.ring_size.saturating_sub(a.in_tx).min(a.free)
    }

    /// Receives what is there (waiting up to `timeout_ms` if nothing is) and counts it.
    fn poll_rx(&mut self, tally: &mut RxTally, ids: (u8, u8), timeout_ms: i32) -> usize {
        let xsk = match &mut self.rx {
            RxSock::None => return 0,
            RxSock::Shared => &mut self.tx,
            RxSock::Own(x) => x,
        };
        receive_into(xsk, &mut self.rxbuf, tally, ids, timeout_ms)
    }

    fn has_rx(&self) -> bool {
        !matches!(self.rx, RxSock::None)
    }

    /// Runs one trial: warmup, measured phase, drain.
    pub fn trial(&mut self, p: &TrialParams) -> TrialStats {
        let warm_id = self.next_run;
        let meas_id = self.next_run.wrapping_add(1);
        self.next_run = self.next_run.wrapping_add(2);
        let ids = (warm_id, meas_id);
        let mut tally = RxTally::new();
        let start = mono_ns();
        let warm_ns = p.warmup.as_nanos() as u64;
        let dur_ns = p.duration.as_nanos() as u64;
        let mut warm = warm_ns > 0;
        let (mut meas_start, mut end) = if warm { (0, start + warm_ns) } else { (start, start + dur_ns) };
        let mut bucket = TokenBucket::new(p.rate_pps, self.batch, start);
        let (mut tx_warm, mut tx_meas) = (0u64, 0u64);
        let mut prog = Progress::new(start, p.progress, true, self.has_rx());
        let mut now = start;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            if now >= end {
                if warm {
                    warm = false;
                    meas_start = now;
                    end = now + dur_ns;
                } else {
                    break;
                }
            }
            let room = self.tx_room();
            let want = bucket.available(now, self.batch.min(room));
            let mut sent = 0;
            if want > 0 {
                sent = self.send(want, if warm { warm_id } else { meas_id }, now);
                bucket.spend(sent);
                if warm {
                    tx_warm += sent as u64;
                } else {
                    tx_meas += sent as u64;
                }
            }
            // Empty the RX ring (a full one drops frames the device under test delivered).
            let mut got = 0;
            for _ in 0..16 {
                let n = self.poll_rx(&mut tally, ids, 0);
                got += n;
                if n < RX_BATCH {
                    break;
                }
            }
            now = mono_ns();
            if sent == 0 && got == 0 && !bucket.unlimited() {
                // Nothing to do until the next chunk of tokens: sleep in poll(2) on the RX
                // socket when that is more than 2 ms away (woken early by a frame, so receive
                // times stay exact), else spin.
                if bucket.wait_ns(now) > 2_000_000 {
                    if self.has_rx() {
                        self.poll_rx(&mut tally, ids, 1);
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    now = mono_ns();
                } else {
                    std::hint::spin_loop();
                }
            }
            prog.tick(now, tx_warm + tx_meas, tally.total(), warm);
        }
        let meas_end = now.max(meas_start);
        // Drain: in-flight frames of the measured phase.
        let drain_end = mono_ns() + p.drain.as_nanos() as u64;
        while mono_ns() < drain_end && !self.stop.load(Ordering::Relaxed) {
            self.tx.kick(0);
            self.tx.complete();
            if self.poll_rx(&mut tally, ids, 1) == 0 && !self.has_rx() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        TrialStats {
            rate_pps: p.rate_pps,
            tx_packets: tx_meas,
            tx_warmup: tx_warm,
            elapsed_ns: if meas_start == 0 { 0 } else { meas_end - meas_start },
            rx: tally,
            has_rx: self.has_rx(),
        }
    }
}

/// Frames per `receive` call.
const RX_BATCH: usize = 256;

/// Receives up to `RX_BATCH` frames from port 0 of `xsk`, counts them into `tally`, gives the frames
/// back and refills the fill ring. `ids` = (warmup, measured) run ids.
pub fn receive_into(
    xsk: &mut Xsk,
    buf: &mut Vec<OwnedFrame>,
    tally: &mut RxTally,
    ids: (u8, u8),
    timeout_ms: i32,
) -> usize {
    let n = xsk.receive(0, buf, RX_BATCH, timeout_ms);
    if n > 0 {
        let now = mono_ns();
        for mut f in buf.drain(..) {
            let st = xsk.with_buffer(&mut f, |b, len| (len, parse_stamp(&b[..len.min(b.len())]))).flatten();
            let _ = xsk.release(f);
            tally.count(st, ids.0, ids.1, now);
        }
    }
    xsk.refill(0);
    n
}

/// Once-a-second progress line on stderr.
#[derive(Debug)]
pub struct Progress {
    on: bool,
    tx: bool,
    rx: bool,
    next: u64,
    start: u64,
    last: (u64, u64, u64),
}

impl Progress {
    /// Starts at `now`; `on` = print at all; `tx`/`rx` = which columns mean something.
    pub fn new(now: u64, on: bool, tx: bool, rx: bool) -> Self {
        Self { on, tx, rx, next: now + 1_000_000_000, start: now, last: (now, 0, 0) }
    }

    /// Prints a line if a second has passed: TX and RX rates and the interval's loss.
    pub fn tick(&mut self, now: u64, tx: u64, rx: u64, warm: bool) {
        if !self.on || now < self.next {
            return;
        }
        let (t0, tx0, rx0) = self.last;
        let dt = now - t0;
        let (dtx, drx) = (tx - tx0, rx - rx0);
        let mut line = format!("[{:5.1}s]{}", (now - self.start) as f64 * 1e-9, if warm { " warmup" } else { "" });
        if self.tx {
            line += &format!("  tx {:>9.0} pps", rate(dtx, dt));
        }
        if self.rx {
            line += &format!("  rx {:>9.0} pps", rate(drx, dt));
        }
        if self.tx && self.rx {
            // Per interval, so frames in flight at its edges blur it a little.
            let loss = if dtx > 0 { dtx.saturating_sub(drx) as f64 / dtx as f64 * 100.0 } else { 0.0 };
            line += &format!("  loss {loss:5.2} %");
        }
        eprintln!("{line}");
        self.last = (now, tx, rx);
        self.next = now + 1_000_000_000;
    }
}

/// `recv` result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RecvReport {
    /// Every frame received.
    pub rx_packets: u64,
    /// `rx_packets` per second.
    pub rx_pps: f64,
    /// Receive time, s.
    pub duration_s: f64,
    /// Frames carrying an xlb-pktgen stamp (any run).
    pub rx_tagged: u64,
    /// Frames without one.
    pub rx_other: u64,
}

/// Receives on `ep` for `duration` (or until `stop`) and counts frames. Call on a thread of
/// its own (it enters the namespace).
///
/// # Errors
/// Namespace or socket errors.
pub fn recv(
    ep: &Endpoint,
    o: &SocketOpts,
    cpu: Option<usize>,
    duration: Duration,
    progress: bool,
    stop: &AtomicBool,
) -> anyhow::Result<RecvReport> {
    if let Some(cpu) = cpu {
        pin_cpu(cpu)?;
    }
    let mut xsk = open_rx(ep, o)?;
    let mut buf = Vec::with_capacity(256);
    let mut tally = RxTally::new();
    let start = mono_ns();
    let end = start + duration.as_nanos() as u64;
    let mut prog = Progress::new(start, progress, false, true);
    let mut now = start;
    while now < end && !stop.load(Ordering::Relaxed) {
        // Run ids never match (0/0 vs real ones happen only by chance and are still
        // counted as tagged).
        receive_into(&mut xsk, &mut buf, &mut tally, (0, 0), 100);
        now = mono_ns();
        prog.tick(now, 0, tally.total(), false);
    }
    let elapsed = now - start;
    drop(xsk);
    let tagged = tally.measured + tally.warmup + tally.stale;
    Ok(RecvReport {
        rx_packets: tally.total(),
        rx_pps: rate(tally.total(), elapsed),
        duration_s: elapsed as f64 * 1e-9,
        rx_tagged: tagged,
        rx_other: tally.other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_classifies_and_records_latency() {
        let mut t = RxTally::new();
        let s = |run, ts| Some(Stamp { run, seq: 0, ts_ns: ts });
        t.count(s(5, 1_000), 4, 5, 11_000);
        t.count(s(5, 1_000), 4, 5, 2_001_000);
        t.count(s(4, 1_000), 4, 5, 2_000);
        t.count(s(9, 1_000), 4, 5, 2_000);
        t.count(None, 4, 5, 2_000);
        // A send time in the future (clock skew impossible with one CLOCK_MONOTONIC, but a
        // corrupted stamp) is counted, not recorded.
        t.count(s(5, 10_000), 4, 5, 2_000);
        assert_eq!((t.measured, t.warmup, t.stale, t.other, t.total()), (3, 1, 1, 1, 6));
        assert_eq!(t.latency.len(), 2);
        assert!(t.latency.min().abs_diff(10_000) <= 10);
        assert!(t.latency.max().abs_diff(2_000_000) <= 2_000);
    }

    #[test]
    fn trial_rates_and_loss() {
        let mut st = TrialStats {
            rate_pps: 0.0,
            tx_packets: 1_000,
            tx_warmup: 10,
            elapsed_ns: 2_000_000_000,
            rx: RxTally::new(),
            has_rx: true,
        };
        st.rx.measured = 990;
        assert_eq!(st.tx_pps(), 500.0);
        assert_eq!(st.rx_pps(), 495.0);
        assert_eq!(st.loss(), Some(0.01));
        st.rx.measured = 1_005; // duplicates
        assert_eq!(st.loss(), Some(0.0));
        st.has_rx = false;
        assert_eq!(st.loss(), None);
        st.has_rx = true;
        st.tx_packets = 0;
        assert_eq!(st.loss(), Some(0.0));
        assert_eq!(rate(5, 0), 0.0);
    }
}
