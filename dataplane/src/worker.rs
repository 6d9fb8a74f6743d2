//! AF_XDP worker threads: one per configured core, pinned, each owning its UMEM, sockets,
//! pipeline (conntrack, schedulers) and counters.
//!
//! Loop, like DPDK l3fwd: load the tables once per batch → take TX completions → refill the
//! fill rings → receive a batch per port → run the pipeline on each frame → queue TX per port
//! → kick TX until drained. Replies that belong to another worker's flows
//! ([`Verdict::Handoff`]) are copied into that worker's inbox (a bounded lock-free queue of
//! pre-allocated buffers) and transmitted by it; see docs/architecture.md.
#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::queue::ArrayQueue;

use crate::affinity::AffinityTable;
pub use crate::counters::XskCounters;
use crate::counters::{ByteCounter, DropReason, WorkerCounters, XskCounter};
use crate::process::snapshot::FlowSnapshot;
use crate::process::{FlowDump, Pipeline, PipelineConfig, Verdict};
use crate::tables::{BackendRef, KERNEL_PORT, Tables, TablesHandle};
use crate::tap::DropTap;
use crate::wire::ETH_LEN;
use crate::xsk::{OwnedFrame, SocketStats, Xsk, XskConfig, XskError, XskExport};

/// Frames per RX batch.
pub const BATCH: usize = 64;
/// Hand-off buffers per worker.
const HANDOFF_SLOTS: usize = 1024;
/// Largest packet read from the punt queue (bytes): a 2 KiB UMEM frame less the Ethernet
/// header the worker puts in front.
const KERNEL_RX_MAX: usize = 2048 - ETH_LEN;

/// What one worker serves.
#[derive(Debug)]
pub struct WorkerSpec {
    /// Worker number (0-based; also the SNAT port slice).
    pub id: u16,
    /// CPU to pin to (from `core_affinity::get_core_ids()`, read before pinning anything).
    pub core: Option<usize>,
    /// (interface, queue) per port, in the port order of the tables.
    pub ports: Vec<(String, u32)>,
    /// AF_XDP settings.
    pub xsk: XskConfig,
    /// Pipeline settings.
    pub pipeline: PipelineConfig,
    /// Busy-poll (never sleep in `poll(2)`); otherwise, when idle, wait up to 1 ms in `poll(2)`.
    pub busy_poll: bool,
    /// Run the worker thread in the `SCHED_FIFO` class (priority 1): for a worker whose core
    /// also runs its queue's NAPI ([`crate::xsk::set_realtime`]). Failure is logged, not fatal.
    pub realtime: bool,
    /// ClientIP affinity records shared by the node's workers.
    pub affinity: Arc<AffinityTable>,
}

/// What a worker gets when it starts ([`spawn`], [`Parked::start`]): what a hand-over or a
/// crash decides, known only once the previous process answered (a worker can be parked
/// before that, [`park`]).
#[derive(Debug, Default)]
pub struct WorkerStart {
    /// This worker's queue of the exception path: frames that are not xlb's
    /// ([`Verdict::Pass`], and replies no worker has a flow for) go back into the kernel's
    /// stack through it. `None`: they are dropped (counted `punt_failed`).
    pub punt: Option<PuntPort>,
    /// Flows handed over by the previous xlb process for this worker
    /// ([`Pipeline::import_flows`], before the first frame).
    pub restore: Option<FlowSnapshot>,
    /// Until then, a reply no worker has a flow for is dropped (counted `reply_untracked`)
    /// instead of being handed to the kernel. Set after a crash: the established flows will
    /// be picked up by their clients' next segments, and a backend's reply that arrives
    /// before that would otherwise reach the client untranslated, from the backend's own
    /// address, and make the client reset the connection. `None`: no such window.
    pub untracked_replies_dropped_until: Option<Instant>,
    /// Sockets and UMEM handed over by the previous xlb process for this worker
    /// ([`Xsk::adopt`] instead of [`Xsk::open`]; docs/architecture.md "Hand-over"). `None`:
    /// bind new sockets.
    pub adopt: Option<XskExport>,
    /// Until this flag is set, the worker touches no ring: it waits (polling every 100 µs)
    /// after setup. For adopted sockets whose previous owner may still take them back (it
    /// does until the hand-over's `released`). If the stop flag is set first, the worker ends
    /// without having touched them. `None`: start at once.
    pub hold_until: Option<Arc<AtomicBool>>,
}

/// A worker thread that is pinned (and `SCHED_FIFO` if asked) and has its pipeline (the flow
/// tables allocated), waiting for its sockets and flows ([`Parked::start`]). A hand-over parks
/// the new process's workers before it asks the old process to stop its own, so that only
/// adopting the sockets and importing the flows are left between the old workers' stop and
/// the new ones' start. Dropped without a start, the thread ends.
#[derive(Debug)]
pub struct Parked {
    id: u16,
    go: mpsc::Sender<WorkerStart>,
    ready: mpsc::Receiver<Ready>,
    requests: mpsc::Sender<Request>,
    tap: Arc<DropTap>,
    thread: JoinHandle<Option<(Pipeline, XskExport)>>,
}

/// A worker's word once its sockets are open or adopted: their fds, its counters; or why not.
type Ready = Result<(Vec<i32>, Arc<WorkerCounters>, Arc<XskCounters>), XskError>;

/// One queue of the punt device as a worker uses it (implemented by the control side over
/// `nic_config::punt::PuntQueue`). Called from the worker loop, never from the per-packet
/// pipeline; neither call may block.
pub trait KernelQueue: Send + Sync {
    /// Hands one IPv4 or IPv6 packet (from the IP header on, no Ethernet header) to the
    /// kernel, which takes it as received on the punt device.
    ///
    /// # Errors
    /// The kernel's errno; a full queue is an error (counted `punt_failed`).
    fn send(&self, l3: &[u8]) -> std::io::Result<usize>;
    /// Reads one IP packet the kernel routed into the punt device (the replies of backends
    /// reached through the kernel); returns its length in bytes.
    ///
    /// # Errors
    /// `WouldBlock` when there is none.
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize>;
}

/// A worker's way into and out of the kernel's stack: its [`KernelQueue`] (the exception path,
/// and the path to backends behind a veth on this node, [`crate::tables::KERNEL_PORT`]).
#[derive(Clone)]
pub struct PuntPort(Arc<dyn KernelQueue>);

impl PuntPort {
    /// Wraps a queue.
    pub fn new(q: impl KernelQueue + 'static) -> Self {
        Self(Arc::new(q))
    }
}

impl std::fmt::Debug for PuntPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PuntPort")
    }
}

/// Writes the IP packet of frame `f` into the exception path; `true` when the kernel took it.
/// Frames that are not IPv4 or IPv6 (the steering program passes those itself) are refused.
fn punt(xsk: &Xsk, f: &mut OwnedFrame, port: Option<&PuntPort>) -> bool {
    let Some(port) = port else { return false };
    xsk.with_buffer(f, |buf, len| {
        let frame = buf.get(..len).unwrap_or_default();
        let ok = match crate::wire::ethernet(frame) {
            Ok((crate::wire::L3::V4 | crate::wire::L3::V6, at)) => {
                frame.get(at + 2..).is_some_and(|ip| port.0.send(ip).is_ok())
            }
            _ => false,
        };
        (len, ok)
    })
    .unwrap_or(false)
}

/// The process-wide clock origin: every worker measures time from it, so times written into
/// shared tables (affinity expiry) mean the same on every worker.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The workers' clock in seconds, as [`crate::process::Pipeline::begin_batch`] derives it
/// from the process-wide origin: the time base of shared tables (affinity expiry) for code
/// outside the workers, e.g. exporting and importing affinity records at a hand-over.
#[must_use]
pub fn clock_s() -> u32 {
    u32::try_from(epoch().elapsed().as_millis() / 1000).unwrap_or(u32::MAX).saturating_add(1)
}

/// How often a worker reads its sockets' `XDP_STATISTICS` (ms).
const SOCKET_STATS_EVERY_MS: u64 = 1000;

/// Reads and sums the kernel counters of every socket of `xsk` into `c`.
fn refresh_socket_stats(xsk: &Xsk, c: &XskCounters) {
    let s =
        (0..xsk.port_count()).filter_map(|i| xsk.socket_stats(i)?.ok()).fold(SocketStats::default(), SocketStats::sum);
    for (x, v) in [
        (XskCounter::SocketRxDropped, s.rx_dropped),
        (XskCounter::SocketRxRingFull, s.rx_ring_full),
        (XskCounter::SocketRxFillRingEmpty, s.rx_fill_ring_empty),
        (XskCounter::SocketRxInvalidDescs, s.rx_invalid_descs),
        (XskCounter::SocketTxInvalidDescs, s.tx_invalid_descs),
        (XskCounter::SocketTxRingEmpty, s.tx_ring_empty),
    ] {
        c.counter(x).set(v);
    }
}

/// A request from the control thread, answered between batches.
#[derive(Debug)]
pub enum Request {
    /// Dump the conntrack table.
    DumpFlows(mpsc::Sender<Vec<FlowDump>>),
    /// Active/inactive connection counts for these backends.
    Connections(Vec<BackendRef>, mpsc::Sender<Vec<(u32, u32)>>),
}

/// The shared hand-off fabric: one inbox per worker and a pool of buffers.
#[derive(Debug)]
pub struct Fabric {
    inboxes: Vec<ArrayQueue<HandoffBox>>,
    pool: ArrayQueue<HandoffBox>,
    /// Workers that may still take frames from their RX rings (and so hand frames off):
    /// raised by [`spawn`], lowered by each worker when it stops receiving, or when its thread
    /// ends without having received ([`Receiving`]).
    receiving: AtomicUsize,
    /// Hand-offs pushed into an inbox and not yet acted on by their worker (raised before the
    /// push, lowered after the frame's verdict was carried out). With `receiving` at 0 and
    /// this at 0, no hand-off is left anywhere: a stopping worker waits for that before it
    /// exits, so a stop loses none (each hand-off costs two atomic additions for it).
    in_flight: AtomicUsize,
}

/// How long a stopping worker keeps serving its inbox, once no worker receives any more, for
/// hand-offs still in flight ([`Fabric`]): bounded for a hand-off to a worker that was never
/// started (a start that failed half-way). While another worker still receives there is no
/// bound: every worker's thread gives up its place when it ends, also by a panic, and one
/// that is merely slow (a loaded machine: one took over 300 ms to stop) may still hand off.
const DRAIN_MAX: Duration = Duration::from_millis(100);

/// A worker's place in [`Fabric::receiving`]: given up once, when the worker stops taking
/// frames from its RX rings or, failing that, when its thread ends (also by a panic).
struct Receiving(Arc<Fabric>, bool);

impl Receiving {
    /// Takes a place for a worker about to start.
    fn new(fabric: Arc<Fabric>) -> Self {
        fabric.receiving.fetch_add(1, Ordering::AcqRel);
        Self(fabric, false)
    }

    fn done(&mut self) {
        if !std::mem::replace(&mut self.1, true) {
            self.0.receiving.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.done();
    }
}

/// An owned hand-off buffer.
#[derive(Debug)]
pub struct HandoffBox(Box<HandoffInner>);

#[derive(Debug)]
struct HandoffInner {
    bytes: Vec<u8>,
    hops: u16,
    in_port: u8,
}

impl Fabric {
    /// A fabric for `workers` workers with pre-allocated 2 KiB buffers (allocated here, not
    /// per packet).
    pub fn new(workers: usize) -> Arc<Self> {
        let pool = ArrayQueue::new(HANDOFF_SLOTS * workers.max(1));
        for _ in 0..pool.capacity() {
            let _ =
                pool.push(HandoffBox(Box::new(HandoffInner { bytes: Vec::with_capacity(2048), hops: 0, in_port: 0 })));
        }
        Arc::new(Self {
            inboxes: (0..workers).map(|_| ArrayQueue::new(HANDOFF_SLOTS)).collect(),
            pool,
            receiving: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
        })
    }

    /// No worker receives any more and every hand-off was acted on.
    fn quiet(&self) -> bool {
        self.receiving.load(Ordering::Acquire) == 0 && self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Frames waiting in the workers' inboxes (handed off, not yet taken by their worker).
    /// Read after the workers stopped, it counts the frames their stop left behind.
    pub fn waiting(&self) -> usize {
        self.inboxes.iter().map(ArrayQueue::len).sum()
    }
}

/// Handle to a running worker.
#[derive(Debug)]
pub struct WorkerHandle {
    /// Worker number.
    pub id: u16,
    /// Socket fds in port order (insert them into the steering program's XSKMAP at the
    /// port's queue).
    pub fds: Vec<i32>,
    /// Pipeline counters.
    pub counters: Arc<WorkerCounters>,
    /// AF_XDP counters.
    pub xsk: Arc<XskCounters>,
    /// Requests to the worker.
    pub requests: mpsc::Sender<Request>,
    /// Copies of the frames this worker drops, while a monitor listens (`xlb monitor --drops`).
    pub tap: Arc<DropTap>,
    thread: Option<JoinHandle<Option<(Pipeline, XskExport)>>>,
}

impl WorkerHandle {
    /// Waits for the thread to end (after the stop flag was set) and returns its pipeline, with
    /// the worker's flows ([`Pipeline::export_flows`] for a hand-over); `None` if the thread
    /// panicked. Its sockets are closed.
    pub fn join(self) -> Option<Pipeline> {
        self.join_export().map(|(p, _)| p)
    }

    /// As [`WorkerHandle::join`], with the worker's sockets and UMEM still open
    /// ([`Xsk::export`]), for a hand-over that passes them on: the sockets stay bound and in
    /// the steering programs' maps, and frames wait in their RX rings, until the export is
    /// dropped.
    pub fn join_export(mut self) -> Option<(Pipeline, XskExport)> {
        self.thread.take().and_then(|t| t.join().ok().flatten())
    }
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Socket setup failed.
    #[error("worker {id}: {source}")]
    Xsk {
        /// Worker.
        id: u16,
        /// Cause.
        #[source]
        source: XskError,
    },
    /// The thread could not be started or died during setup.
    #[error("worker {0}: thread failed to start")]
    Thread(u16),
}

/// Starts a worker: pins it, opens (or adopts) its sockets on that core, and returns once
/// they are bound ([`park`], then [`Parked::start`] and [`Parked::ready`]).
///
/// # Errors
/// [`WorkerError`] if the thread cannot start or the sockets cannot be bound.
pub fn spawn(
    spec: WorkerSpec,
    start: WorkerStart,
    tables: TablesHandle,
    fabric: Arc<Fabric>,
    stop: Arc<AtomicBool>,
) -> Result<WorkerHandle, WorkerError> {
    let p = park(spec, tables, fabric, stop)?;
    p.start(start);
    p.ready()
}

/// Starts a worker thread and returns once it is pinned and its pipeline is built; it then
/// waits, touching no socket, for [`Parked::start`].
///
/// # Errors
/// [`WorkerError::Thread`] if the thread cannot be started or dies before it is parked.
pub fn park(
    spec: WorkerSpec,
    tables: TablesHandle,
    fabric: Arc<Fabric>,
    stop: Arc<AtomicBool>,
) -> Result<Parked, WorkerError> {
    let id = spec.id;
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<WorkerStart>();
    let (ready_tx, ready_rx) = mpsc::channel::<Ready>();
    let (req_tx, req_rx) = mpsc::channel::<Request>();
    let tap = Arc::new(DropTap::default());
    let worker_tap = tap.clone();
    let mut receiving = Receiving::new(fabric.clone());
    let thread = std::thread::Builder::new()
        .name(format!("xlb-worker-{id}"))
        .spawn(move || {
            if let Some(core) = spec.core
                && !core_affinity::set_for_current(core_affinity::CoreId { id: core })
            {
                tracing::warn!(worker = id, core, "could not pin worker");
            }
            if spec.realtime
                && let Err(e) = crate::xsk::set_realtime(1)
            {
                tracing::warn!(worker = id, error = %e, "could not make the worker SCHED_FIFO; it runs as a normal thread");
            }
            let seed = u64::from(id) ^ std::process::id() as u64 ^ 0x9E37_79B9_7F4A_7C15;
            let mut pipeline = Pipeline::with_affinity(spec.pipeline.clone(), seed, spec.affinity.clone());
            // On the worker's own core (its memory node), before any packet.
            let started = Instant::now();
            let bytes = pipeline.prefault();
            tracing::info!(worker = id, bytes, ms = started.elapsed().as_secs_f64() * 1e3, "flow tables committed");
            let _ = parked_tx.send(());
            // Parked: no CPU until the start (or until the control thread gives up on it).
            let Ok(mut start) = go_rx.recv() else { return None };
            let opened = match start.adopt.take() {
                Some(e) => Xsk::adopt(e, spec.xsk.busy_poll).map(|mut x| {
                    x.set_fill_frames(spec.xsk.fill_frames);
                    x
                }),
                None => Xsk::open(&spec.xsk, &spec.ports),
            };
            let mut xsk = match opened {
                Ok(x) => x,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return None;
                }
            };
            if let Some(snap) = &start.restore {
                let started = Instant::now();
                let now_ms = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
                let r = pipeline.import_flows(&tables.load(), snap, now_ms);
                tracing::info!(
                    worker = id,
                    offered = snap.len(),
                    imported = r.imported,
                    backend_gone = r.gone,
                    snat_changed = r.snat_changed,
                    not_inserted = r.not_inserted,
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "flows taken over"
                );
            }
            let xc = Arc::new(XskCounters::default());
            xc.counter(XskCounter::UmemFrames).set(spec.xsk.frame_count.into());
            xc.counter(XskCounter::ZeroCopy).set(u64::from(xsk.zero_copy(0)));
            xc.counter(XskCounter::UmemHugePages).set(u64::from(xsk.huge_pages()));
            let _ = ready_tx.send(Ok((xsk.fds(), pipeline.counters().clone(), xc.clone())));
            if let Some(hold) = &start.hold_until {
                while !hold.load(Ordering::Acquire) {
                    if stop.load(Ordering::Relaxed) {
                        // Never started: the rings are as the previous owner left them.
                        return Some((pipeline, xsk.export()));
                    }
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
            let pipeline = run(
                spec,
                &start,
                &mut xsk,
                pipeline,
                tables,
                fabric,
                stop,
                req_rx,
                &xc,
                &worker_tap,
                &mut receiving,
            );
            Some((pipeline, xsk.export()))
        })
        .map_err(|_| WorkerError::Thread(id))?;
    match parked_rx.recv() {
        Ok(()) => Ok(Parked { id, go: go_tx, ready: ready_rx, requests: req_tx, tap, thread }),
        Err(_) => {
            let _ = thread.join();
            Err(WorkerError::Thread(id))
        }
    }
}

impl Parked {
    /// The worker's number.
    #[must_use]
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Lets the worker open or adopt its sockets and import its flows; returns at once
    /// ([`Parked::ready`] waits for it), so that several workers do it in parallel.
    pub fn start(&self, start: WorkerStart) {
        let _ = self.go.send(start);
    }

    /// Waits, after [`Parked::start`], until the worker's sockets are open or adopted and its
    /// flows imported.
    ///
    /// # Errors
    /// [`WorkerError::Xsk`] if the sockets cannot be bound or adopted (the thread has ended),
    /// [`WorkerError::Thread`] if the thread died.
    pub fn ready(self) -> Result<WorkerHandle, WorkerError> {
        let Self { id, go, ready, requests, tap, thread } = self;
        drop(go);
        match ready.recv() {
            Ok(Ok((fds, counters, xsk))) => {
                Ok(WorkerHandle { id, fds, counters, xsk, requests, tap, thread: Some(thread) })
            }
            Ok(Err(source)) => {
                let _ = thread.join();
                Err(WorkerError::Xsk { id, source })
            }
            Err(_) => Err(WorkerError::Thread(id)),
        }
    }
}

#[expect(clippy::too_many_arguments, reason = "everything a worker owns, moved in once")]
fn run(
    spec: WorkerSpec,
    start: &WorkerStart,
    xsk: &mut Xsk,
    mut pipeline: Pipeline,
    tables: TablesHandle,
    fabric: Arc<Fabric>,
    stop: Arc<AtomicBool>,
    requests: mpsc::Receiver<Request>,
    xc: &XskCounters,
    tap: &DropTap,
    receiving: &mut Receiving,
) -> Pipeline {
    let id = spec.id;
    let nports = xsk.port_count();
    // Frames a previous owner of adopted sockets left in their TX rings go out now.
    for port in 0..nports {
        xsk.kick(port);
    }
    let epoch = epoch();
    let mut reader = tables.reader();
    let mut rx: Vec<OwnedFrame> = Vec::with_capacity(BATCH);
    let mut verdicts = [Verdict::Pass; BATCH];
    let mut tx: Vec<Vec<OwnedFrame>> = (0..nports).map(|_| Vec::with_capacity(BATCH * 2)).collect();
    let mut scratch = Vec::with_capacity(2048);
    let mut kbuf: Vec<u8> = Vec::with_capacity(ETH_LEN + KERNEL_RX_MAX);
    let mut idle_rounds = 0u32;
    let counters = pipeline.counters().clone();
    let mut busy = BusyClock::default();
    // The loop's counts, added to the shared counters and cleared at the end of every
    // iteration (`Tally::flush`): made once, not per iteration.
    let mut tally = Tally::default();
    let mut next_socket_stats_ms = 0u64;
    // The millisecond whose requests were last looked for.
    let mut requests_ms = u64::MAX;
    // Adopted sockets (a hand-over): the first frames taken are logged, with the time since
    // the worker was let go (the end of the forwarding gap on this worker).
    let mut first_rx = start.hold_until.is_some().then(Instant::now);
    let route = Route {
        fabric: &fabric,
        me: id,
        workers: spec.pipeline.workers,
        punt: start.punt.as_ref(),
        tap,
        quiet_until: start.untracked_replies_dropped_until,
    };
    while !stop.load(Ordering::Relaxed) {
        // One relaxed pointer check per loop; a new snapshot only after a publication.
        let t: &Tables = reader.load();
        let started = epoch.elapsed();
        busy.loop_started(started, &counters);
        let now_ms = u64::try_from(started.as_millis()).unwrap_or(u64::MAX);
        if now_ms >= next_socket_stats_ms {
            next_socket_stats_ms = now_ms.saturating_add(SOCKET_STATS_EVERY_MS);
            refresh_socket_stats(xsk, xc);
            // The loop runs: its clock, for the control side's stall check (at least 1).
            counters.heartbeat_ms.set(now_ms.max(1));
        }
        pipeline.begin_batch(t, now_ms);
        xsk.complete();
        let mut got = 0;
        for port in 0..nports {
            xsk.refill(port);
            rx.clear();
            let n = xsk.receive(port, &mut rx, BATCH, 0);
            if n == 0 {
                continue;
            }
            got += n;
            if let Some(t) = first_rx.take() {
                tracing::info!(
                    worker = id,
                    frames = n,
                    ms = t.elapsed().as_secs_f64() * 1e3,
                    "hand-over phase (new): first frames received"
                );
            }
            // Bytes received, summed before the pipeline rewrites the frames (one pass over
            // the batch's descriptors; no frame data is read).
            tally.rx_bytes(rx.iter().map(OwnedFrame::len).sum());
            let in_port = u8::try_from(port).unwrap_or(0);
            let done = xsk.with_batch(&mut rx, |pkts| {
                pipeline.process_batch(t, pkts, in_port, &mut verdicts);
            });
            if done.is_err() {
                // Cannot happen (the frames came from this `Xsk`); if it did, the frames are
                // dropped, never touched.
                verdicts.fill(Verdict::Drop(DropReason::NoRoom));
            }
            for (f, &v) in rx.drain(..).zip(&verdicts) {
                route.dispatch(v, f, in_port, 0, xsk, &mut tx, &mut scratch, &mut tally);
            }
        }
        // Packets the kernel routed into this worker's punt queue: replies of backends reached
        // through the kernel. Each gets an Ethernet header (MACs zero) in a free UMEM frame.
        // Only read while such backends exist (their reply rules are what route packets
        // there), so the common case pays no read(2) per loop.
        if let Some(k) = start.punt.as_ref().filter(|_| !t.kernel_endpoints.is_empty()) {
            for _ in 0..BATCH {
                kbuf.resize(ETH_LEN + KERNEL_RX_MAX, 0);
                let Some(room) = kbuf.get_mut(ETH_LEN..) else { break };
                let n = match k.0.recv(room) {
                    Ok(n) if n > 0 => n,
                    _ => break,
                };
                got += 1;
                tally.from_kernel += 1;
                let et: u16 = match kbuf.get(ETH_LEN).map(|b| b >> 4) {
                    Some(4) => 0x0800,
                    Some(6) => 0x86DD,
                    _ => {
                        tally.from_kernel_untracked += 1;
                        continue;
                    }
                };
                if let Some(h) = kbuf.get_mut(..ETH_LEN) {
                    h.fill(0);
                    if let Some(t) = h.get_mut(12..14) {
                        t.copy_from_slice(&et.to_be_bytes());
                    }
                }
                let Some(mut f) = kbuf.get(..ETH_LEN + n).and_then(|b| xsk.frame_from(b)) else {
                    tally.punt_failed += 1;
                    continue;
                };
                tally.rx_bytes(f.len());
                let verdict = process_frame(xsk, &mut pipeline, t, &mut f, KERNEL_PORT);
                route.dispatch(verdict, f, KERNEL_PORT, 0, xsk, &mut tx, &mut scratch, &mut tally);
            }
        }
        // Frames handed over by other workers.
        got += route.take_handoffs(xsk, &mut pipeline, t, &mut tx, &mut scratch, &mut tally);
        transmit_all(xsk, &mut tx, &mut tally);
        tally.flush(xc, &counters);
        let acc = xsk.account();
        xc.counter(XskCounter::UmemFramesAccounted).set((acc.free + acc.in_fill + acc.in_tx) as u64);
        // Requests (the admin socket's) are looked for once per millisecond, not per loop: a
        // `try_recv` on an empty channel issues a sequentially consistent fence.
        if now_ms != requests_ms {
            requests_ms = now_ms;
            while let Ok(r) = requests.try_recv() {
                answer(r, &pipeline);
            }
        }
        if got == 0 {
            idle_rounds = idle_rounds.saturating_add(1);
            if !spec.busy_poll && idle_rounds > IDLE_SPINS {
                // Nothing for a while: sleep in one poll(2) over every socket (woken by the
                // first frame on any port; 1 ms bounds the wait for hand-offs and requests).
                // The fill rings get their whole size first: what arrives before the worker
                // runs again must find fill frames.
                for port in 0..nports {
                    xsk.refill_whole(port);
                }
                xsk.wait(1);
            } else {
                std::hint::spin_loop();
            }
        } else {
            idle_rounds = 0;
            busy.found_work(started);
        }
    }
    busy.loop_started(epoch.elapsed(), &counters);
    // Stopped: no more frames from the RX rings (they wait there for the next owner of the
    // sockets). Replies other workers handed off before they stopped are still carried out
    // (else they would be lost with the inboxes), until every worker stopped receiving and
    // every hand-off was acted on.
    receiving.done();
    let mut deadline = None;
    loop {
        let t: &Tables = reader.load();
        pipeline.begin_batch(t, u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX));
        let n = route.take_handoffs(xsk, &mut pipeline, t, &mut tx, &mut scratch, &mut tally);
        transmit_all(xsk, &mut tx, &mut tally);
        tally.flush(xc, &counters);
        if fabric.quiet() {
            break;
        }
        if fabric.receiving.load(Ordering::Acquire) == 0
            && Instant::now() >= *deadline.get_or_insert_with(|| Instant::now() + DRAIN_MAX)
        {
            break;
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
    // Drain what is still queued so nothing is lost at shutdown.
    for port in 0..nports {
        xsk.kick(port);
    }
    xsk.complete();
    pipeline
}

/// Queues every port's frames for TX and kicks every port; frames that found no room are
/// counted `tx_ring_full` and freed. A port with nothing new is kicked too, once
/// ([`Xsk::kick_pending`]): frames an earlier kick could not send (the device refused them for
/// now: its link down, a full driver queue) wait in its TX ring and go out once the device
/// takes them. In copy mode a port whose TX ring is empty costs no system call.
fn transmit_all(xsk: &mut Xsk, tx: &mut [Vec<OwnedFrame>], tally: &mut Tally) {
    for (port, q) in tx.iter_mut().enumerate() {
        if q.is_empty() {
            xsk.kick_pending(port);
            continue;
        }
        let want = q.len();
        let sent = xsk.transmit(port, q);
        tally.tx_ring_full += want - sent;
        xsk.kick(port);
    }
}

/// Empty loops before an idle worker sleeps in `poll(2)`.
const IDLE_SPINS: u32 = 64;

/// The worker's busy time (`xlb_worker_busy_seconds_total`) from the one clock read each loop
/// iteration makes at its start: an iteration that found work is counted from its start to
/// the next one's (the loop goes straight on to it), so a busy iteration costs no second
/// read at its end. Idle iterations count nothing.
#[derive(Debug, Default)]
struct BusyClock {
    /// Start of the last iteration, when it found work.
    pending: Option<Duration>,
}

impl BusyClock {
    /// An iteration starts at `now` (time since the workers' epoch): the previous one, if it
    /// found work, is counted into `counters`' busy time and busy loops.
    #[inline]
    fn loop_started(&mut self, now: Duration, counters: &WorkerCounters) {
        if let Some(s) = self.pending.take() {
            counters.busy_ns.add(u64::try_from(now.saturating_sub(s).as_nanos()).unwrap_or(u64::MAX));
            counters.busy_loops.inc();
        }
    }

    /// The iteration that started at `started` found work.
    #[inline]
    fn found_work(&mut self, started: Duration) {
        self.pending = Some(started);
    }
}

// `Tally::dropped` has a bit per drop reason number.
const _: () = assert!(DropReason::COUNT < 64);

/// The AF_XDP counters and the bytes by verdict of one batch, added to the shared counters
/// once per batch.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    /// Bytes by [`ByteCounter`] (index = its number).
    bytes: [u64; ByteCounter::COUNT],
    /// Bytes dropped by [`DropReason`] number (index 0 unused).
    drop_bytes: [u64; DropReason::COUNT + 1],
    /// Bit `n`: `drop_bytes[n]` may be non-zero (the entries [`Tally::flush`] visits and
    /// clears, instead of every reason's).
    dropped: u64,
    pass_in_userspace: usize,
    punted: usize,
    punt_failed: usize,
    to_kernel: usize,
    from_kernel: usize,
    from_kernel_untracked: usize,
    handed_off: usize,
    handoff_dropped: usize,
    tx_ring_full: usize,
    reply_untracked: usize,
}

impl Tally {
    /// Adds `len` received bytes.
    #[inline]
    fn rx_bytes(&mut self, len: usize) {
        self.add_bytes(ByteCounter::Rx, len);
    }

    #[inline]
    fn add_bytes(&mut self, b: ByteCounter, len: usize) {
        if let Some(n) = self.bytes.get_mut(b as usize) {
            *n += len as u64;
        }
    }

    #[inline]
    fn add_drop_bytes(&mut self, r: DropReason, len: usize) {
        if let Some(n) = self.drop_bytes.get_mut(r as usize) {
            *n += len as u64;
            self.dropped |= 1 << (r as u32 & 63);
        }
    }

    /// Adds the `len` bytes of a frame the pipeline gave verdict `v` to `v`'s class: the
    /// same classes as the pipeline's packet counters (`tx`, `pass`, drops by reason, the
    /// `handed_off` event).
    #[inline]
    fn verdict_bytes(&mut self, v: Verdict, len: usize) {
        match v {
            Verdict::Tx { .. } => self.add_bytes(ByteCounter::Tx, len),
            Verdict::Pass => self.add_bytes(ByteCounter::Pass, len),
            Verdict::Drop(r) => self.add_drop_bytes(r, len),
            Verdict::Handoff { .. } => self.add_bytes(ByteCounter::HandedOff, len),
        }
    }

    /// Counts a reply that no worker has a flow for and that is dropped (`reply_untracked`,
    /// its `len` bytes too).
    #[inline]
    fn reply_untracked(&mut self, len: usize) {
        self.reply_untracked += 1;
        self.add_drop_bytes(DropReason::ReplyUntracked, len);
    }

    fn flush(&mut self, xc: &XskCounters, counters: &WorkerCounters) {
        for (c, n) in [
            (XskCounter::PassInUserspace, &mut self.pass_in_userspace),
            (XskCounter::Punted, &mut self.punted),
            (XskCounter::PuntFailed, &mut self.punt_failed),
            (XskCounter::ToKernel, &mut self.to_kernel),
            (XskCounter::FromKernel, &mut self.from_kernel),
            (XskCounter::FromKernelUntracked, &mut self.from_kernel_untracked),
            (XskCounter::HandedOff, &mut self.handed_off),
            (XskCounter::HandoffDropped, &mut self.handoff_dropped),
            (XskCounter::TxRingFull, &mut self.tx_ring_full),
        ] {
            if *n > 0 {
                xc.counter(c).add(*n as u64);
                *n = 0;
            }
        }
        for _ in 0..core::mem::take(&mut self.reply_untracked) {
            counters.count_drop(DropReason::ReplyUntracked);
        }
        for (b, n) in ByteCounter::ALL.iter().zip(&mut self.bytes) {
            if *n > 0 {
                counters.add_bytes(*b, core::mem::take(n));
            }
        }
        // Only the reasons this batch dropped for (reason numbers are dense from 1, so
        // reason `i` is `ALL[i - 1]`), each entry cleared as it is added: the tally is left
        // as `Tally::default()` without rewriting all of it once per loop.
        let mut rest = core::mem::take(&mut self.dropped);
        while rest != 0 {
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let (Some(n), Some(r)) =
                (self.drop_bytes.get_mut(i), i.checked_sub(1).and_then(|k| DropReason::ALL.get(k)))
            else {
                continue;
            };
            if *n > 0 {
                counters.add_drop_bytes(*r, core::mem::take(n));
            }
        }
    }
}

/// Runs the pipeline on one frame in place (frames handed over by another worker), over its
/// whole UMEM frame as the batch's frames are (`Xsk::with_packet`).
#[inline]
fn process_frame(xsk: &Xsk, pipeline: &mut Pipeline, t: &Tables, f: &mut OwnedFrame, in_port: u8) -> Verdict {
    xsk.with_packet(f, |pkt| pipeline.process(t, pkt, in_port)).unwrap_or(Verdict::Drop(DropReason::NoRoom))
}

/// Offers frame `f` (unchanged) to the drop tap: dropped for `reason`, or punted (`None`).
#[inline]
fn copy_to_tap(xsk: &Xsk, f: &mut OwnedFrame, tap: &DropTap, reason: Option<DropReason>) {
    let _ = xsk.with_buffer(f, |buf, len| {
        tap.offer(reason, buf.get(..len).unwrap_or(buf));
        (len, ())
    });
}

/// Where a worker's verdicts send frames: the parts that stay the same for the whole run.
struct Route<'a> {
    fabric: &'a Fabric,
    /// This worker.
    me: u16,
    /// Workers on the node.
    workers: u16,
    /// This worker's punt queue.
    punt: Option<&'a PuntPort>,
    /// This worker's drop tap.
    tap: &'a DropTap,
    /// [`WorkerSpec::untracked_replies_dropped_until`].
    quiet_until: Option<Instant>,
}

impl Route<'_> {
    /// Runs up to [`BATCH`] frames from this worker's inbox (handed off by other workers)
    /// through the pipeline and acts on their verdicts; returns how many it took.
    fn take_handoffs(
        &self,
        xsk: &mut Xsk,
        pipeline: &mut Pipeline,
        t: &Tables,
        tx: &mut [Vec<OwnedFrame>],
        scratch: &mut Vec<u8>,
        tally: &mut Tally,
    ) -> usize {
        let fabric = self.fabric;
        let Some(inbox) = fabric.inboxes.get(usize::from(self.me)) else { return 0 };
        // Asked first: a pop from an empty queue issues a sequentially consistent fence
        // (crossbeam-queue's `ArrayQueue::pop`), once per loop of every worker, where
        // `is_empty` only loads the two indices. A frame pushed just after is taken next loop.
        if inbox.is_empty() {
            return 0;
        }
        let mut got = 0;
        for _ in 0..BATCH {
            let Some(h) = inbox.pop() else { break };
            got += 1;
            let (hops, in_port) = (h.0.hops, h.0.in_port);
            let f = xsk.frame_from(&h.0.bytes);
            let _ = fabric.pool.push(h);
            match f {
                Some(mut f) => {
                    tally.rx_bytes(f.len());
                    let verdict = process_frame(xsk, pipeline, t, &mut f, in_port);
                    self.dispatch(verdict, f, in_port, hops + 1, xsk, tx, scratch, tally);
                }
                None => tally.handoff_dropped += 1,
            }
            // Acted on (a further hand-off was counted before this).
            fabric.in_flight.fetch_sub(1, Ordering::Release);
        }
        got
    }

    /// Acts on verdict `v` for frame `f`: queue it for TX, punt it to the kernel, hand it to
    /// another worker (`hops` workers have seen it), or release it.
    #[expect(clippy::too_many_arguments, reason = "the worker's borrowed state")]
    fn dispatch(
        &self,
        v: Verdict,
        f: OwnedFrame,
        in_port: u8,
        hops: u16,
        xsk: &mut Xsk,
        tx: &mut [Vec<OwnedFrame>],
        scratch: &mut Vec<u8>,
        tally: &mut Tally,
    ) {
        let Self { fabric, me, workers, punt: punt_port, tap, quiet_until } = *self;
        // `release` refuses only frames of another UMEM, and every frame here came from `xsk`.
        let mut f = f;
        let len = f.len();
        tally.verdict_bytes(v, len);
        if in_port == KERNEL_PORT && v == Verdict::Pass {
            // From the kernel and not ours (a pod on this node answering a direct connection from
            // a Service's target port): handed back, it takes the main table (the bypass rule of
            // the punt device), not the reply rule again.
            tally.from_kernel_untracked += 1;
        }
        match v {
            Verdict::Tx { port: KERNEL_PORT } => {
                if punt(xsk, &mut f, punt_port) {
                    tally.to_kernel += 1;
                } else {
                    tally.punt_failed += 1;
                }
                drop(xsk.release(f));
            }
            Verdict::Tx { port } => match tx.get_mut(usize::from(port)) {
                Some(q) => q.push(f),
                None => drop(xsk.release(f)),
            },
            Verdict::Pass => {
                tally.pass_in_userspace += 1;
                if tap.wants_punted() {
                    copy_to_tap(xsk, &mut f, tap, None);
                }
                if punt(xsk, &mut f, punt_port) {
                    tally.punted += 1;
                } else {
                    tally.punt_failed += 1;
                }
                drop(xsk.release(f));
            }
            Verdict::Drop(reason) => {
                // A monitor listens: a copy of the frame's first bytes (module `tap`).
                if tap.is_on() {
                    copy_to_tap(xsk, &mut f, tap, Some(reason));
                }
                drop(xsk.release(f));
            }
            Verdict::Handoff { worker } => {
                if hops + 1 >= workers || worker == me {
                    // Every worker looked: nobody has a flow for this reply. It is direct traffic
                    // of a pod that also backs a Service (same address and port): the kernel's.
                    if in_port == KERNEL_PORT {
                        tally.from_kernel_untracked += 1;
                    }
                    // Rare (no flow anywhere): the clock is read only here.
                    if quiet_until.is_some_and(|t| Instant::now() < t) {
                        tally.reply_untracked(len);
                    } else {
                        if tap.wants_punted() {
                            copy_to_tap(xsk, &mut f, tap, None);
                        }
                        if punt(xsk, &mut f, punt_port) {
                            tally.punted += 1;
                        } else {
                            tally.reply_untracked(len);
                        }
                    }
                    drop(xsk.release(f));
                    return;
                }
                let target = fabric.inboxes.get(usize::from(worker));
                match (target, fabric.pool.pop()) {
                    (Some(inbox), Some(mut b)) if xsk.copy_out(&mut f, scratch) => {
                        b.0.bytes.clear();
                        b.0.bytes.extend_from_slice(scratch);
                        b.0.hops = hops;
                        b.0.in_port = in_port;
                        fabric.in_flight.fetch_add(1, Ordering::AcqRel);
                        match inbox.push(b) {
                            Ok(()) => tally.handed_off += 1,
                            Err(b) => {
                                fabric.in_flight.fetch_sub(1, Ordering::Release);
                                let _ = fabric.pool.push(b);
                                tally.handoff_dropped += 1;
                            }
                        }
                    }
                    (_, b) => {
                        if let Some(b) = b {
                            let _ = fabric.pool.push(b);
                        }
                        tally.handoff_dropped += 1;
                    }
                }
                drop(xsk.release(f));
            }
        }
    }
}

fn answer(r: Request, p: &Pipeline) {
    match r {
        Request::DumpFlows(tx) => {
            let _ = tx.send(p.dump_flows());
        }
        Request::Connections(refs, tx) => {
            let _ = tx.send(refs.iter().map(|r| p.connections(*r)).collect());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;

    /// A known batch: the bytes by verdict class the worker loop adds to the shared counters
    /// once per batch, and nothing more at the next (empty) batch.
    #[test]
    fn bytes_of_a_batch_are_counted_by_verdict() {
        let counters = WorkerCounters::new(1, 1);
        let xc = XskCounters::default();
        let mut tally = Tally::default();
        // Six frames received: 60 + 74 + 1514 + 98 + 66 + 54 = 1866 bytes.
        tally.rx_bytes([60, 74, 1514, 98, 66, 54].into_iter().sum());
        // Two sent on (one grew by a 20-byte IPIP header), one passed, two dropped for two
        // reasons, one handed off and then dropped as an untracked reply.
        tally.verdict_bytes(Verdict::Tx { port: 0 }, 74);
        tally.verdict_bytes(Verdict::Tx { port: 1 }, 1534);
        tally.verdict_bytes(Verdict::Pass, 98);
        tally.verdict_bytes(Verdict::Drop(DropReason::TtlExceeded), 60);
        tally.verdict_bytes(Verdict::Drop(DropReason::NoNeighbour), 54);
        tally.verdict_bytes(Verdict::Handoff { worker: 1 }, 66);
        tally.reply_untracked(66);
        tally.flush(&xc, &counters);
        let bytes: Vec<(&str, u64)> = ByteCounter::ALL.iter().map(|b| (b.name(), counters.bytes_of(*b))).collect();
        assert_eq!(bytes, [("rx", 1866), ("tx", 1608), ("pass", 98), ("handed_off", 66)]);
        let dropped: Vec<(&str, u64)> =
            DropReason::ALL.iter().map(|r| (r.name(), counters.drop_bytes_of(*r))).filter(|(_, n)| *n > 0).collect();
        assert_eq!(dropped, [("ttl_exceeded", 60), ("no_neighbour", 54), ("reply_untracked", 66)]);
        assert_eq!(counters.drops_of(DropReason::ReplyUntracked), 1);
        // The tally starts the next batch empty: flushing it again adds nothing.
        assert_eq!(tally, Tally::default());
        tally.flush(&xc, &counters);
        assert_eq!(counters.bytes_of(ByteCounter::Rx), 1866);
        assert_eq!(counters.drop_bytes_of(DropReason::ReplyUntracked), 66);
        // A second batch's drops add to their own reasons only.
        tally.verdict_bytes(Verdict::Drop(DropReason::NoNeighbour), 60);
        tally.verdict_bytes(Verdict::Drop(DropReason::MalformedL2), 10);
        tally.tx_ring_full += 2;
        tally.flush(&xc, &counters);
        let dropped: Vec<(&str, u64)> =
            DropReason::ALL.iter().map(|r| (r.name(), counters.drop_bytes_of(*r))).filter(|(_, n)| *n > 0).collect();
        assert_eq!(
            dropped,
            [("malformed_l2", 10), ("ttl_exceeded", 60), ("no_neighbour", 114), ("reply_untracked", 66)]
        );
        assert_eq!(xc.get(XskCounter::TxRingFull), 2);
        assert_eq!(tally, Tally::default());
    }

    /// Busy time: each iteration that found work counts from its start to the next
    /// iteration's start (the one clock read an iteration makes), idle iterations nothing;
    /// the last busy iteration is counted when the loop ends (a last `loop_started`).
    #[test]
    fn busy_time_runs_from_the_start_of_an_iteration_that_found_work_to_the_next_start() {
        let counters = WorkerCounters::new(1, 1);
        let mut busy = BusyClock::default();
        let ms = Duration::from_millis;
        // Iterations start at 0, 3, 10, 11, 20 ms; those at 3 and 11 find work.
        busy.loop_started(ms(0), &counters);
        busy.loop_started(ms(3), &counters);
        busy.found_work(ms(3));
        busy.loop_started(ms(10), &counters);
        assert_eq!((counters.busy_ns.get(), counters.busy_loops.get()), (7_000_000, 1));
        busy.loop_started(ms(11), &counters);
        busy.found_work(ms(11));
        busy.loop_started(ms(20), &counters);
        assert_eq!((counters.busy_ns.get(), counters.busy_loops.get()), (16_000_000, 2));
        // An idle iteration counts nothing, and a busy one is counted once.
        busy.loop_started(ms(30), &counters);
        assert_eq!((counters.busy_ns.get(), counters.busy_loops.get()), (16_000_000, 2));
    }

    /// Frames a kick could not send (the device refused them for now: here its link was
    /// down, on a NIC also a full driver queue) wait in the TX ring; a later loop sends them
    /// once the device takes them, also when that port has no new frames by then.
    #[test]
    fn frames_a_kick_left_in_the_tx_ring_go_out_in_a_later_loop_without_new_frames() {
        if xlb_testkit::skip_without_root("frames_a_kick_left_in_the_tx_ring_go_out_in_a_later_loop_without_new_frames")
        {
            return;
        }
        let ns = xlb_testkit::Netns::new("xwtx");
        ns.ip(&["link", "add", "xa", "type", "veth", "peer", "name", "xb"]);
        ns.ip(&["link", "set", "xb", "up"]);
        let (queued, left) = ns.run_in(|| {
            let cfg = XskConfig {
                frame_count: 1024,
                ring_size: 256,
                copy_mode: crate::xsk::CopyMode::Copy,
                huge_pages: false,
                ..XskConfig::default()
            };
            let mut x = Xsk::open(&cfg, &[("xa".to_owned(), 0)]).expect("AF_XDP socket on xa");
            let mut frame = [0u8; 60];
            frame[..6].fill(0xff);
            frame[12..14].copy_from_slice(&[0x88, 0xb5]);
            let mut tx = vec![(0..4).map(|_| x.frame_from(&frame).unwrap()).collect::<Vec<_>>()];
            let mut tally = Tally::default();
            // xa is down: the kick's sendto() fails (ENETDOWN) and the frames stay queued.
            transmit_all(&mut x, &mut tx, &mut tally);
            let queued = (x.account().in_tx, tally.tx_ring_full);
            ns.ip(&["link", "set", "xa", "up"]);
            let deadline = Instant::now() + Duration::from_secs(2);
            while x.account().in_tx > 0 && Instant::now() < deadline {
                transmit_all(&mut x, &mut tx, &mut tally);
                x.complete();
                std::thread::sleep(Duration::from_millis(5));
            }
            (queued, x.account().in_tx)
        });
        assert_eq!(queued, (4, 0), "queued while the link was down, none dropped");
        assert_eq!(left, 0, "sent once the link is up");
    }

    #[test]
    fn handoff_pool_is_preallocated() {
        let f = Fabric::new(2);
        assert_eq!(f.pool.len(), 2 * HANDOFF_SLOTS);
        assert_eq!(f.inboxes.len(), 2);
    }

    /// A stopping worker waits for the fabric to be quiet: every worker has stopped receiving
    /// (or its thread ended, also by a panic) and no hand-off is in flight.
    #[test]
    fn the_fabric_is_quiet_once_every_worker_stopped_receiving_and_no_hand_off_is_in_flight() {
        let f = Fabric::new(2);
        assert!(f.quiet(), "no worker started");
        let mut a = Receiving::new(f.clone());
        let b = Receiving::new(f.clone());
        assert!(!f.quiet());
        a.done();
        a.done();
        assert!(!f.quiet(), "worker b still receives");
        let panicked = std::thread::spawn(move || {
            let _b = b;
            panic!("worker b dies");
        });
        assert!(panicked.join().is_err());
        assert!(f.quiet(), "a dead worker receives no more");
        f.in_flight.fetch_add(1, Ordering::AcqRel);
        assert!(!f.quiet(), "a hand-off waits in an inbox");
        f.in_flight.fetch_sub(1, Ordering::Release);
        assert!(f.quiet());
        drop(a);
        assert_eq!(f.receiving.load(Ordering::Acquire), 0, "given up once per worker");
    }
}
