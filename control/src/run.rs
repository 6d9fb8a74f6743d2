//! `xlb run --config FILE [--kubernetes | --kubeconfig PATH]`.
//!
//! FILE always holds the XlbConfiguration. In standalone mode it also holds the Services,
//! EndpointSlices and Node; with `--kubernetes` (in-cluster credentials) or `--kubeconfig`
//! they come from the API server through [`xlb::k8s::Source`] instead, and nothing is
//! programmed until every initial list is complete. Both modes serve `/healthz` and `/livez`
//! (kube-proxy semantics) and `/metrics` on the configured addresses.
//!
//! Start-up: load and translate the file → fill in interface MACs/MTUs and the kernel's
//! neighbour table → build and publish the tables → load the steering program for every
//! interface → park one pinned worker per core (pipeline built, no socket yet) → sync the
//! steering maps → with `--takeover`, take the running xlb's flows ([`crate::handover`]) →
//! bind the HTTP ports → create the punt device → start the workers (bind or adopt their
//! sockets, import their flows) → put the workers' sockets into the XSKMAP → attach the
//! programs (after a hand-over, once the previous xlb has let go of its own). Then, until
//! SIGINT/SIGTERM: reload on SIGHUP or when the file changes (a bad file is logged with its
//! document, object and field, and the running tables stay), rebuild when a neighbour
//! changes, ask the kernel to resolve unresolved next hops, and answer the admin socket. On
//! exit the workers stop and every program and map is removed (the maps are not pinned, so
//! closing them frees them); on a hand-over request the workers stop, their flows go to the
//! new process, and the programs are detached when it is ready; then the process exits, or
//! idles until a signal (`--after-handover wait`). With `$NOTIFY_SOCKET` set, the service
//! manager hears when it forwards and when it stops ([`crate::notify`]).
//!
//! How a build is published (translation, tables, steering maps, next hops) and the workers'
//! settings are decided in the library ([`xlb::orchestrate`]), where they are unit-tested;
//! this module runs them: threads, signals, workers, sockets, the hand-over.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use dataplane::addr::Cidr;
use dataplane::affinity::AffinityTable;
use dataplane::process::snapshot::Snapshot;
use dataplane::tables::{KernelRouteSpec, Tables, TablesHandle};
use dataplane::worker::{self, Fabric, PuntPort, WorkerHandle, WorkerSpec, WorkerStart};
use dataplane::xsk::XskExport;
use nic_config::{Steering, XdpMode, neighbours};
use xlb::announce::{Announcement, Applied, PrefixSet};
use xlb::cluster::ClusterState;
use xlb::orchestrate::{
    Builders, Built, Input, Kernel as _, LiveKernel, Publisher, pipeline_config, worker_ports, xsk_config, xsk_layout,
};

use crate::admin;

/// After a start that finds a dead xlb's steering program, how long replies of no tracked flow
/// are dropped instead of handed to the kernel ([`WorkerSpec::untracked_replies_dropped_until`]):
/// long enough for every established client to send a segment (TCP retransmits within a few
/// RTOs of the outage).
const UNTRACKED_REPLY_QUIET: Duration = Duration::from_secs(5);

/// Where Services, EndpointSlices and the Node come from.
#[derive(Debug, Clone)]
pub(crate) enum StateSource {
    /// The config file itself.
    File,
    /// The API server; `None` = in-cluster credentials.
    Kubernetes {
        /// Kubeconfig path.
        kubeconfig: Option<PathBuf>,
    },
}

/// What `xlb run` does once it has handed over to a new xlb (`--after-handover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AfterHandover {
    /// Exit with status 0.
    Exit,
    /// Stay idle (nothing of the process serves) until SIGTERM or SIGINT, then exit 0.
    Wait,
}

/// How `xlb run` starts and ends, from its flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// `--takeover`: take the running xlb's flows first.
    pub(crate) takeover: bool,
    /// `--after-handover`.
    pub(crate) after_handover: AfterHandover,
}

/// How [`serve`] ended.
#[derive(Debug)]
enum Ended {
    /// Stopped (a signal, and the drain after SIGTERM) or never started forwarding.
    Stopped,
    /// Handed over to a new xlb and left it its programs; `during_drain`: after SIGTERM.
    HandedOver {
        /// The hand-over came while the process drained after SIGTERM.
        during_drain: bool,
    },
    /// The new xlb failed (or went away) after this one had stopped its workers and sent
    /// its flows: serve again with them ([`Start::Resume`]).
    Resume(Box<Resume>),
}

/// How [`serve`] starts.
#[derive(Debug)]
enum Start {
    /// Load the config file; refuse if an xlb answers on the admin socket.
    Fresh,
    /// `--takeover`: load the config file and take the running xlb's flows.
    Takeover,
    /// Serve again after a failed hand-over, with what the stopped incarnation had.
    Resume(Box<Resume>),
}

/// What a process whose hand-over failed serves again with: its own config and cluster state
/// (not the file's: the file may hold the config the new xlb failed with) and the flows its
/// workers exported.
#[derive(Debug)]
struct Resume {
    /// The config last loaded, with the settings that only a start applies (interfaces,
    /// cores, `afXdp`, `puntDevice`) as the stopped workers ran them
    /// ([`xlb::orchestrate::resume_config`]).
    config: xlb::config::Config,
    /// The cluster state last built from (standalone: the file's objects as last loaded).
    cluster: ClusterState,
    /// Every worker's flows and the affinity records, as exported for the new xlb.
    flows: Snapshot,
    /// Every worker's AF_XDP sockets and UMEM, as kept for the new xlb (which never used
    /// them: it touches their rings only after `released`); `None` when they were closed.
    sockets: Option<Vec<XskExport>>,
}

/// How often, and how many times, a resuming process tries to bind its HTTP ports: the
/// failed new xlb may still be closing its listeners.
const RESUME_BIND_TRIES: (u32, Duration) = (25, Duration::from_millis(200));

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// How the process ends: SIGINT stops at once; SIGTERM starts a drain of
/// `shutdownGracePeriod` ([`crate::config::Config::shutdown_grace_period`]): health checks
/// fail at once (LB-06) while the workers keep forwarding and the tables keep syncing, then
/// xlb stops. A second SIGTERM during the drain stops at once.
struct Shutdown {
    /// SIGINT.
    interrupt: Arc<AtomicBool>,
    /// SIGTERM (cleared when the drain starts, so that a second one is seen).
    term: Arc<AtomicBool>,
    /// When the drain started.
    drain_since: std::cell::Cell<Option<Instant>>,
    /// `STOPPING=1` has been sent ([`crate::notify::stopping`]).
    stopping_sent: std::cell::Cell<bool>,
}

impl Shutdown {
    fn register() -> Result<Self> {
        let s = Self {
            interrupt: Arc::new(AtomicBool::new(false)),
            term: Arc::new(AtomicBool::new(false)),
            drain_since: std::cell::Cell::new(None),
            stopping_sent: std::cell::Cell::new(false),
        };
        signal_hook::flag::register(signal_hook::consts::SIGINT, s.interrupt.clone())?;
        signal_hook::flag::register(signal_hook::consts::SIGTERM, s.term.clone())?;
        Ok(s)
    }

    /// Before anything forwards: either signal stops at once.
    fn requested(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed) || self.term.load(Ordering::Relaxed)
    }

    /// Whether to stop now; on the first SIGTERM, starts the drain (health goes 503). The
    /// service manager hears `STOPPING=1` when the drain starts or, without one, when this
    /// first answers yes. `now`: the time of the question (the drain's grace period is
    /// measured with it).
    fn due(&self, health: &xlb::http::ProxyHealth, grace: Duration, now: Instant) -> bool {
        let due = self.check(health, grace, now);
        if (due || self.draining()) && !self.stopping_sent.replace(true) {
            crate::notify::stopping();
        }
        due
    }

    fn check(&self, health: &xlb::http::ProxyHealth, grace: Duration, now: Instant) -> bool {
        if self.interrupt.load(Ordering::Relaxed) {
            return true;
        }
        let term = self.term.swap(false, Ordering::Relaxed);
        match self.drain_since.get() {
            None if term && grace.is_zero() => true,
            None if term => {
                health.begin_drain();
                self.drain_since.set(Some(now));
                tracing::info!(
                    grace = %xlb::duration::format_go_duration(grace),
                    "SIGTERM: draining (healthz and healthCheckNodePorts answer 503, forwarding goes on)"
                );
                false
            }
            None => false,
            Some(_) if term => {
                tracing::info!("second SIGTERM: stopping now");
                true
            }
            Some(t) => now.saturating_duration_since(t) >= grace,
        }
    }

    /// Whether the drain after SIGTERM has started.
    fn draining(&self) -> bool {
        self.drain_since.get().is_some()
    }

    /// Blocks until SIGTERM or SIGINT (one that came before the call counts).
    fn wait_signal(&self) {
        while !self.interrupt.load(Ordering::Relaxed) && !self.term.load(Ordering::Relaxed) {
            std::thread::sleep(IDLE_TICK);
        }
    }
}

/// How often an idle process (`--after-handover wait`) looks for its signal.
const IDLE_TICK: Duration = Duration::from_millis(50);

/// Runs until SIGINT, or SIGTERM and the drain after it, or a hand-over to a new xlb (then,
/// with `--after-handover wait`, idles until a signal).
pub(crate) fn run(path: PathBuf, admin_socket: PathBuf, source: StateSource, opts: Options) -> Result<()> {
    let shutdown = Shutdown::register()?;
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())?;
    let mut start = if opts.takeover { Start::Takeover } else { Start::Fresh };
    // Once per process: a process that resumes after a failed hand-over keeps feeding the
    // watchdog it had (its environment may not name it: a hand-over's new process).
    let watchdog = crate::notify::watchdog_timeout(&admin_socket, opts.takeover);
    let ended = loop {
        // Everything of the serving incarnation is gone when it returns (workers, sockets,
        // runtime, tables); after a failed hand-over only its flows and config remain.
        match serve(&path, &admin_socket, &source, start, &shutdown, &reload, watchdog)? {
            Ended::Resume(r) => start = Start::Resume(r),
            ended => break ended,
        }
    };
    match ended {
        Ended::HandedOver { during_drain: false } if opts.after_handover == AfterHandover::Wait => {
            tracing::info!(
                "hand-over: done; idle until SIGTERM or SIGINT (--after-handover wait): this process serves nothing"
            );
            shutdown.wait_signal();
            tracing::info!("hand-over: signal received while idle; exiting");
        }
        Ended::HandedOver { during_drain } => tracing::info!(during_drain, "hand-over: done; exiting"),
        Ended::Stopped | Ended::Resume(_) => {}
    }
    Ok(())
}

/// Serves until SIGINT, or SIGTERM and the drain after it, or a hand-over; feeds systemd's
/// watchdog of timeout `watchdog` meanwhile.
fn serve(
    path: &Path,
    admin_socket: &Path,
    source: &StateSource,
    start: Start,
    shutdown: &Shutdown,
    reload: &AtomicBool,
    watchdog: Option<Duration>,
) -> Result<Ended> {
    let path = path.to_owned();
    let admin_socket = admin_socket.to_owned();
    let takeover = matches!(start, Start::Takeover);
    let (config, file_cluster, mut restore, resuming, mut adopt) = match start {
        Start::Resume(r) => {
            let Resume { config, cluster, flows, sockets } = *r;
            tracing::info!(
                flows = flows.flows(),
                affinity = flows.affinity.len(),
                sockets_kept = sockets.is_some(),
                "hand-over failed: serving again with this process's config and flows"
            );
            (config, cluster, flows, true, sockets)
        }
        Start::Fresh | Start::Takeover => {
            let loaded = crate::load_config(&path)?;
            for n in &loaded.notes {
                tracing::info!("{n}");
            }
            (loaded.config, loaded.cluster, Snapshot::default(), false, None)
        }
    };
    if config.interfaces.is_empty() {
        bail!("{}: `interfaces` is empty: xlb needs at least one interface to attach to", path.display());
    }
    // The control plane's runtime: HTTP servers and the Kubernetes watchers. One thread; the
    // workers are plain threads pinned to their cores.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("xlb-control")
        .enable_all()
        .build()?;
    let telemetry = xlb::http::Telemetry::new(config.sync_period);
    let mut assigner = None;
    // L2 mode in Kubernetes mode: this node's membership Lease and the others' (which node
    // owns which VIP); the client and node name also serve to start it on a reload.
    let mut membership: Option<xlb::k8s::Membership> = None;
    let mut l2_client: Option<(kube::Client, String)> = None;
    let mut k8s = match &source {
        StateSource::File => None,
        StateSource::Kubernetes { kubeconfig } => {
            if !resuming && (!file_cluster.services.is_empty() || !file_cluster.endpoint_slices.is_empty()) {
                tracing::warn!(config = %path.display(), "Service and EndpointSlice objects in the file are ignored: they come from the API server");
            }
            let client = rt.block_on(xlb::k8s::client(kubeconfig.as_deref(), &config.client_connection))?;
            let scfg = xlb::k8s::SourceConfig::from_config(&config)?;
            let node = scfg.node_name.clone();
            let _guard = rt.enter();
            if config.address_assignment.enabled {
                let acfg = xlb::k8s::AssignerConfig::from_config(&config, &node);
                tracing::info!(lease = %acfg.lease.name, namespace = %acfg.lease.namespace, identity = %acfg.lease.identity, "assigning LoadBalancer addresses while holding the lease");
                assigner = Some(xlb::k8s::Assigner::start(client.clone(), acfg));
            }
            if config.announce.mode == xlb::config::AnnounceMode::L2 {
                membership = Some(start_membership(&client, &config, &node));
            }
            l2_client = Some((client.clone(), node.clone()));
            let src = xlb::k8s::Source::start(client, scfg, telemetry.clone());
            let hc = xlb::http::HealthCheckServers::new(IpAddr::from([0, 0, 0, 0]), telemetry.health.clone());
            Some((src, hc, node))
        }
    };
    // Nothing is programmed before the first consistent state (no empty-table blip).
    let (mut cluster, first) = match &mut k8s {
        None => (file_cluster, None),
        Some((src, _, _)) => {
            let snap = loop {
                if shutdown.requested() {
                    return Ok(Ended::Stopped);
                }
                if let Ok(s) =
                    rt.block_on(async { tokio::time::timeout(Duration::from_millis(500), src.next_snapshot()).await })
                {
                    break s;
                }
                tracing::info!("waiting for the initial lists of Services, EndpointSlices and the Node");
            };
            // The objects come from the source's index; the state keeps the host's addresses.
            (ClusterState::default(), Some(snap))
        }
    };
    cluster.local_addresses = host_addresses().unwrap_or_default();
    let mut publisher = Publisher::new(Builders::new(kernel_routes(&config).unwrap_or_default()), Instant::now());
    let builder = &mut publisher.builders;
    // A full build translates and builds Maglev tables on the CPUs the workers leave (at least
    // the control thread's own); its helper threads keep to those CPUs once the start-up below
    // has restricted the control threads (they inherit the set).
    let cpus = match process_cpus().len() {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    let control_threads = cpus.saturating_sub(config.cores.len()).max(1);
    builder.tables.set_build_threads(control_threads);
    builder.translator.set_threads(control_threads);
    tracing::info!(threads = control_threads, "full builds translate and build Maglev tables on this many threads");
    let input = match &first {
        Some(snap) => Input::Cluster { index: &snap.cluster, changes: &snap.changes, local: &cluster.local_addresses },
        None => Input::File(&cluster),
    };
    // The first build asks the kernel for the next hops' MACs at once rather than at the first
    // periodic round (2 s): until they are known, new flows to those backends are dropped
    // (`NoNeighbour`). The punt device does not exist yet: no reply rules to sync.
    let Built { tables, report, vips } =
        publisher.first(input, &config, &mut LiveKernel { punt: false }).with_context(|| path.display().to_string())?;
    let mut l2_local = xlb::announce::l2::LocalNodesCache::default();
    update_l2_local(&mut l2_local, &config, input);
    // The source updates its index in place only when no snapshot holds it.
    drop(first);
    telemetry.metrics.set_no_local_endpoints(report.no_local_endpoints);
    telemetry.health.updated(SystemTime::now());
    let handle = TablesHandle::new(tables);

    // Cores: the process's CPU set as it was before anything was pinned.
    let allowed = process_cpus();
    let cores: Vec<usize> = if config.cores.is_empty() { allowed.clone() } else { config.cores.clone() };
    for c in &cores {
        if !allowed.is_empty() && !allowed.contains(c) {
            bail!("{}: field cores: core {c} is not in this process's CPU set {allowed:?}", path.display());
        }
    }
    let queues_per_iface = config.interfaces.iter().map(|i| i.queues.len().max(1)).min().unwrap_or(1);
    let nworkers = cores.len().min(queues_per_iface).max(1);
    let nworkers_u16 = u16::try_from(nworkers).unwrap_or(1);
    // The control plane (this thread, the runtime's, and every thread started from them later,
    // which inherit the set) keeps off the cores the workers will be pinned to; each worker
    // pins itself to its core when it starts.
    let control = xlb::orchestrate::control_cpus(&allowed, cores.get(..nworkers).unwrap_or(&cores));
    if !control.is_empty() {
        let threads = pin_control_threads(&control);
        tracing::info!(cpus = ?control, threads, "control threads kept off the worker cores");
    }

    // A hand-over: the running xlb stops its workers and sends their flows; its programs then
    // drop xlb's frames until this process is ready and attaches its own.
    let mut handed_over_at: Option<Instant> = None;
    let mut pending: Option<crate::handover::Pending> = None;
    // Programs are loaded now and attached once their maps and sockets are in place (after a
    // hand-over, once the previous xlb has detached its own).
    let mut steering = Vec::new();
    for iface in &config.interfaces {
        steering.push(Steering::load(&iface.name, XdpMode::Native)?);
    }
    if !takeover && std::os::unix::net::UnixStream::connect(&admin_socket).is_ok() {
        bail!(
            "an xlb is running on admin socket {} (stop it, or start this one with --takeover to take over its flows)",
            admin_socket.display()
        );
    }
    // One network namespace, one xlb (seed ARCH-04): the admin socket finds a running xlb only on the
    // same path. An xlb started on another admin socket would replace the running one's
    // program below, taking its interface, and remove its policy rules. A running process
    // holds its program's fd; a dead xlb's program is held by nobody and is replaced as
    // before. A hand-over (`--takeover`) and a resume replace a live program on purpose.
    if !takeover && !resuming {
        for st in &steering {
            let Some(prog) = nic_config::interface_info(st.ifname())?.xdp_prog_id else { continue };
            if let Some(pid) = nic_config::program_holders(prog).first() {
                bail!(
                    "interface {}: its XDP program {prog} is held by running process {pid} (an xlb on another admin socket?); \
                     stop it, or start this one on its admin socket with --takeover",
                    st.ifname()
                );
            }
        }
        // The policy rules are the network namespace's, whatever the interfaces: a running
        // xlb on other interfaces would lose its own to this one's. Its punt device lives as
        // long as it does (a TUN device goes with its process, even on SIGKILL), so a bypass
        // rule whose device exists belongs to a running xlb.
        for dev in nic_config::rules::bypass_devices()? {
            if nic_config::ifindex(&dev).is_ok() {
                bail!(
                    "punt device {dev} exists: an xlb runs in this network namespace (on another admin socket?); \
                     stop it, or start this one on its admin socket with --takeover"
                );
            }
        }
    }
    // Everything that does not need the previous xlb's workers stopped is done before they
    // stop: the workers are pinned and their flow tables allocated (parked, waiting for their
    // sockets and flows), and the steering programs' maps filled. Between the old workers'
    // stop and these workers' start there are then only the flows and sockets to pass on
    // and adopt (docs/reliability.md, "The switch").
    let fabric = Fabric::new(nworkers);
    let affinity = Arc::new(AffinityTable::new(1 << 16));
    let wstop = Arc::new(AtomicBool::new(false));
    let mut parked = Vec::with_capacity(nworkers);
    for w in 0..nworkers {
        let id = u16::try_from(w).unwrap_or(0);
        let spec = WorkerSpec {
            id,
            core: cores.get(w).copied(),
            ports: worker_ports(&config, w),
            xsk: xsk_config(&config),
            pipeline: pipeline_config(&config, id, nworkers_u16),
            busy_poll: config.af_xdp.busy_poll,
            realtime: config.af_xdp.realtime_workers,
            affinity: affinity.clone(),
        };
        parked.push(worker::park(spec, handle.clone(), fabric.clone(), wstop.clone())?);
    }
    publisher.start(&mut steering, &handle.load(), Instant::now())?;
    if takeover {
        let started = Instant::now();
        match crate::handover::request(&admin_socket, Some(&xsk_layout(&config, nworkers))) {
            Ok(Ok((crate::handover::Handed { flows: s, sockets }, p))) => {
                // The previous xlb has stopped and exits once this one attaches: a service
                // manager must follow this process from now on (before the old one exits).
                crate::notify::main_pid();
                pending = Some(p);
                tracing::info!(
                    workers = s.workers.len(),
                    flows = s.flows(),
                    affinity = s.affinity.len(),
                    sockets = sockets.is_some(),
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "hand-over: the previous xlb stopped and sent its flows"
                );
                if sockets.is_none() {
                    tracing::info!(
                        "hand-over: the previous xlb closed its AF_XDP sockets (its log says why); binding new ones"
                    );
                }
                adopt = sockets;
                restore = s;
                handed_over_at = Some(Instant::now());
            }
            Ok(Err(crate::handover::Refused::NoPeer(e))) => {
                tracing::info!(socket = %admin_socket.display(), error = %e, "hand-over: no xlb to take over from; starting without flows");
            }
            Ok(Err(crate::handover::Refused::Refused(answer))) => {
                bail!("hand-over refused by the running xlb (it keeps serving): {answer}");
            }
            Err(e) => {
                crate::notify::main_pid();
                tracing::error!(error = %format!("{e:#}"), "hand-over failed after the previous xlb stopped; starting without its flows (TCP flows of mh/sh services are picked up)");
            }
        }
    }
    // The HTTP servers and healthCheckNodePorts bind now: before a hand-over the previous
    // xlb held their ports (and after a failed one, the new xlb may still be closing them).
    let mut tries = if resuming { RESUME_BIND_TRIES.0 } else { 1 };
    let phase_ms = || handed_over_at.map(|t| t.elapsed().as_secs_f64() * 1e3);
    let (_healthz, _metrics) = loop {
        tries -= 1;
        let bound = rt.block_on(async {
            let h = xlb::http::serve_healthz(config.healthz_bind_address, telemetry.clone()).await?;
            let m = xlb::http::serve_metrics(config.metrics_bind_address, telemetry.metrics.clone()).await?;
            Ok::<_, xlb::http::HttpError>((h, m))
        });
        match bound {
            Ok(b) => break b,
            Err(e) if tries > 0 => {
                tracing::debug!(error = %e, "HTTP ports still taken; trying again");
                std::thread::sleep(RESUME_BIND_TRIES.1);
            }
            Err(e) => return Err(e.into()),
        }
    };
    if let Some((src, hc, node)) = &mut k8s {
        for e in rt.block_on(hc.sync(&xlb::k8s::health_check_services_indexed(src.cluster(), node))) {
            tracing::warn!("{e}");
        }
    }
    if let Some(ms) = phase_ms() {
        tracing::info!(phase = "http", ms, "hand-over phase (new): HTTP ports bound");
    }
    // The exception path: one TUN queue per worker; the device goes away with the process.
    let punt_queues: Vec<PuntPort> = if config.punt_device.is_empty() {
        Vec::new()
    } else {
        match nic_config::punt::Punt::create(&config.punt_device, nworkers) {
            Ok(mut p) => {
                for w in p.warnings() {
                    tracing::warn!(device = %config.punt_device, "{w}");
                }
                if nic_config::punt::Punt::strict_rp_filter() {
                    tracing::warn!(
                        device = %config.punt_device,
                        "net.ipv4.conf.all.rp_filter is 1 (strict): the kernel drops punted IPv4 packets that it would forward; set it to 2 (loose)"
                    );
                }
                // Replies of backends reached through the kernel: the rules send them to this
                // table, whose routes lead into the device (they go away with it).
                if let Err(e) = nic_config::rules::route_reply_table_to(p.ifindex()) {
                    tracing::warn!(error = %e, "reply table: backends behind the kernel will not work");
                }
                // What xlb hands back to the kernel skips the reply rules (no loop).
                if let Err(e) = nic_config::rules::set_bypass(p.name(), true) {
                    tracing::warn!(error = %e, "bypass rule: untracked packets of pods on this node will be dropped");
                }
                p.take_queues().into_iter().map(|q| PuntPort::new(Tun(q))).collect()
            }
            Err(e) => {
                tracing::warn!(error = %e, "no punt device: frames that are not xlb's are dropped (punt_failed)");
                Vec::new()
            }
        }
    };
    if let Some(ms) = phase_ms() {
        tracing::info!(phase = "punt", ms, "hand-over phase (new): punt device created");
    }
    let mut kernel = LiveKernel { punt: !punt_queues.is_empty() };
    if !restore.affinity.is_empty() {
        let (imported, gone) = affinity.import(&handle.load(), &restore.affinity, worker::clock_s());
        tracing::info!(imported, gone, "hand-over: ClientIP affinity records taken over");
    }
    // A previous xlb that died (its `.xdp` record is left: a clean stop removes it; a
    // hand-over or a resume is not a crash) left clients with established flows this process
    // will pick up from their next segments. Until then, a backend's reply to one of them has
    // no flow; handed to the kernel it would reach the client untranslated and reset the
    // connection, so for a while such replies are dropped instead (they are retransmitted).
    let after_crash = handed_over_at.is_none() && !resuming && admin_socket.with_extension("xdp").exists();
    let untracked_replies_dropped_until = after_crash.then(|| {
        tracing::info!(
            seconds = UNTRACKED_REPLY_QUIET.as_secs(),
            "a previous xlb died: replies of no tracked flow are dropped, not handed to the kernel, while clients' flows are picked up"
        );
        std::time::Instant::now() + UNTRACKED_REPLY_QUIET
    });
    // Adopted sockets may still go back to the previous xlb (until its `released`): the
    // workers touch their rings only once this is set.
    let gate = Arc::new(AtomicBool::new(pending.is_none()));
    let mut adopt: Vec<Option<XskExport>> = adopt.take().map(|v| v.into_iter().map(Some).collect()).unwrap_or_default();
    let mut workers: Vec<WorkerHandle> = Vec::new();
    let (handover_tx, handover_rx) = std::sync::mpsc::channel();
    let result = (|| -> Result<Option<(std::os::unix::net::UnixStream, Option<String>, xlb::config::Config)>> {
        // Every worker adopts (or binds) and imports at once, in parallel; then each one's
        // sockets go into the programs' maps, in worker order.
        for (w, p) in parked.iter().enumerate() {
            let id = p.id();
            let adopted = adopt.get_mut(w).and_then(Option::take);
            p.start(WorkerStart {
                hold_until: (adopted.is_some() && pending.is_some()).then(|| gate.clone()),
                adopt: adopted,
                punt: punt_queues.get(w).cloned(),
                restore: restore.workers.iter().position(|r| r.worker_id == id).map(|i| restore.workers.swap_remove(i)),
                untracked_replies_dropped_until,
            });
        }
        // Every started worker is waited for (and kept, to be joined), also after a failure.
        let mut failed = None;
        for p in parked.drain(..) {
            match p.ready() {
                Ok(h) => workers.push(h),
                Err(e) => _ = failed.get_or_insert(e),
            }
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        for (w, h) in workers.iter().enumerate() {
            let ports = worker_ports(&config, w);
            for (st, ((_, queue), fd)) in steering.iter_mut().zip(ports.iter().zip(&h.fds)) {
                st.set_xsk(*queue, fd)?;
            }
            tracing::info!(worker = h.id, core = ?cores.get(w), ?ports, ms = phase_ms(), "worker started");
        }
        kernel.sync_reply_rules(&handle.load());
        if let Some(ms) = phase_ms() {
            tracing::info!(phase = "steering", ms, "hand-over phase (new): sockets in the maps, reply rules synced");
        }
        if let Some(p) = pending.take() {
            p.release()?;
        }
        // The previous xlb let go: adopted sockets are this process's alone.
        gate.store(true, Ordering::Release);
        if let Some(ms) = phase_ms() {
            tracing::info!(phase = "go", ms, "hand-over phase (new): released; the workers take frames");
        }
        // The rules are this process's alone now: an earlier xlb's punt device under another
        // name (a hand-over to a new `puntDevice`, or a crash) left its bypass rule; and with
        // no punt device here, its reply rules would send pods' replies into its device, which
        // no process reads any more, until the device goes (then the rules fall through).
        let own_punt = (!punt_queues.is_empty()).then_some(config.punt_device.as_str());
        match nic_config::rules::remove_leftovers(own_punt) {
            Ok((0, 0)) => {}
            Ok((bypass, reply)) => tracing::info!(bypass, reply, "policy rules an earlier xlb left removed"),
            Err(e) => tracing::warn!(error = %e, "policy rules an earlier xlb left"),
        }
        // `<admin socket>.xdp`: "IFNAME PROG_ID" per interface, written once attached and
        // removed on a clean stop, so the next start recognises a dead xlb's program even
        // without CAP_SYS_ADMIN (which reading program names needs).
        let record_path = admin_socket.with_extension("xdp");
        let recorded = std::fs::read_to_string(&record_path).unwrap_or_default();
        let recorded_id = |ifname: &str| {
            recorded.lines().find_map(|l| l.strip_prefix(ifname)?.strip_prefix(' ')?.trim().parse::<u32>().ok())
        };
        for st in &mut steering {
            // A program left attached by an xlb that died (kill -9, OOM) is replaced in one
            // step; meanwhile it dropped xlb's frames, so flows retransmit instead of
            // reaching the kernel untranslated. No live xlb owns it: a running one answers
            // on the admin socket, which was checked at start.
            let replaced = st.attach_replacing_leftover(recorded_id(st.ifname()))?;
            if let (Some(old), Some(_)) = (replaced, handed_over_at) {
                tracing::info!(
                    interface = st.ifname(),
                    old_prog_id = old,
                    "hand-over: replaced the previous xlb's steering program in one step"
                );
            } else if let (Some(old), true) = (replaced, resuming) {
                tracing::info!(
                    interface = st.ifname(),
                    old_prog_id = old,
                    "hand-over failed: replaced this process's own steering program, left attached for the new xlb, in one step"
                );
            } else if let Some(old) = replaced {
                tracing::warn!(
                    interface = st.ifname(),
                    old_prog_id = old,
                    "replaced the steering program a previous xlb left attached (it was not stopped cleanly)"
                );
            }
        }
        let record: String = steering.iter().map(|st| format!("{} {}\n", st.ifname(), st.prog_id())).collect();
        if let Err(e) = std::fs::write(&record_path, record) {
            tracing::warn!(path = %record_path.display(), error = %e, "cannot record the attached programs (a crash would leave them for `ip link set dev IF xdp off`)");
        }
        if !restore.workers.is_empty() {
            tracing::warn!(
                workers = restore.workers.len(),
                "hand-over: flows of workers this process does not have are dropped (fewer workers than before)"
            );
        }
        let admin = admin::serve(&admin_socket, handle.clone(), &workers, handover_tx)?;
        let iface_stats = xlb::http::InterfaceStatsCell::default();
        let view =
            xlb::http::CountersView::new(handle.clone(), workers.iter().map(|w| (w.id, w.counters.clone())).collect())
                .with_xsk(workers.iter().map(|w| (w.id, w.xsk.clone())).collect())
                .with_interfaces(iface_stats.clone());
        telemetry.metrics.set_dataplane(Arc::new(view));
        tracing::info!(config = %path.display(), workers = nworkers, source = ?source, "xlb running");
        crate::notify::ready();
        if let Some(t) = handed_over_at {
            // With the old process's stop-to-send time (its log), the forwarding gap.
            tracing::info!(ms = t.elapsed().as_secs_f64() * 1e3, "hand-over: forwarding again after the flows arrived");
        }
        let announcement = announcement(&config, &steering);
        let mut sup = Supervisor {
            path: &path,
            config: config.clone(),
            publisher: &mut publisher,
            handle: &handle,
            steering: &mut steering,
            telemetry: &telemetry,
            rt: &rt,
            iface_stats,
            kernel,
            handover: handover_rx,
            announcement,
            vips,
            l2_local,
            membership: &mut membership,
            l2_client: l2_client.clone(),
            l2_members: None,
            stall_watch: xlb::http::WorkerStallWatch::new(
                workers.iter().map(|w| (w.id, w.counters.clone())).collect(),
                xlb::http::WORKER_STALL_LIMIT,
                Instant::now(),
            ),
            watchdog: watchdog.map(crate::notify::WatchdogFeed::new),
        };
        // A supervisor that takes over from another (a failed hand-over) starts from workers
        // that run.
        telemetry.health.set_stalled_workers(Vec::new());
        telemetry.metrics.set_workers_stalled(0);
        let handover = sup.run(&mut cluster, k8s.as_mut(), shutdown, reload)?;
        drop(admin);
        Ok(handover.map(|(stream, layout)| (stream, layout, sup.config.clone())))
    })();
    let stopping = Instant::now();
    if let Some(a) = assigner.take() {
        // Release the Lease so that another xlb (the new one of a hand-over) takes over at
        // once; an API server that does not answer does not hold the stop up for long.
        let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), a.stop()).await });
    }
    let handing_over = matches!(result, Ok(Some(_)));
    // The sockets go to the new process when it offered to adopt them with this process's
    // own layout; else they close here, before it binds its own.
    let mine = xsk_layout(&config, nworkers);
    let keep_sockets = match &result {
        Ok(Some((_, Some(offered), _))) if *offered == mine => true,
        Ok(Some((_, Some(offered), _))) => {
            tracing::info!(new = %offered, this = %mine, "hand-over: the new xlb's AF_XDP layout differs; closing the sockets for it to bind its own");
            false
        }
        _ => false,
    };
    if let Some(m) = membership.take() {
        // A clean stop deletes this node's Lease, so that the others take its L2 VIPs over at
        // once (they were withdrawn here already); a hand-over leaves it to the new xlb.
        let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), m.stop(!handing_over)).await });
    }
    // The control plane's runtime, HTTP servers and healthCheckNodePorts, while they live.
    let mut control = Some((_healthz, _metrics, k8s, rt));
    if handing_over {
        // The new process binds the same HTTP ports and healthCheckNodePorts as soon as it
        // has the flows: close them now, while the workers still forward (the runtime's drop
        // waits until its tasks, and their listeners, are gone).
        let closing = Instant::now();
        drop(control.take());
        tracing::info!(
            phase = "ports closed",
            ms = closing.elapsed().as_secs_f64() * 1e3,
            "hand-over phase (old): HTTP ports and runtime closed"
        );
        // The switch starts here: from now until the new workers start, frames wait in the
        // RX rings (docs/reliability.md, "The switch").
        tracing::info!(phase = "stop", "hand-over phase (old): telling the workers to stop");
    }
    let quiesce = Instant::now();
    wstop.store(true, Ordering::Relaxed);
    let mut flows = Snapshot::default();
    let mut kept: Option<Vec<XskExport>> = keep_sockets.then(Vec::new);
    for w in workers {
        match w.join_export() {
            Some((p, sockets)) => {
                tracing::debug!(
                    worker = p.config().worker_id,
                    ms = quiesce.elapsed().as_secs_f64() * 1e3,
                    "stop: worker joined"
                );
                if handing_over {
                    flows.workers.push(p.export_flows());
                }
                if let Some(k) = &mut kept {
                    k.push(sockets);
                }
            }
            None => {
                if kept.take().is_some() {
                    tracing::warn!(
                        "hand-over: a worker panicked; closing every AF_XDP socket for the new xlb to bind its own"
                    );
                }
            }
        }
    }
    if handing_over {
        flows.affinity = affinity.export(&handle.load(), worker::clock_s());
    }
    tracing::info!(
        frames = fabric.waiting(),
        ms = quiesce.elapsed().as_secs_f64() * 1e3,
        "workers stopped: hand-off frames left in their inboxes"
    );
    // The switch's end on this side: the flows and sockets go at once; what is left to close
    // (the punt device takes 10-20 ms: the kernel waits for a grace period per queue) is
    // closed while the new process starts.
    let sent = match &result {
        Ok(Some((stream, _, _))) => Some(
            crate::handover::send(stream, &flows, kept.as_deref())
                .context("hand-over: sending the flows")
                .map(|()| stopping.elapsed().as_secs_f64() * 1e3),
        ),
        _ => None,
    };
    // At a hand-over the reply rules stay: they are the new process's too (it syncs them to
    // its own tables), and removing them now would race with it.
    if !punt_queues.is_empty() && !handing_over {
        LiveKernel { punt: true }.sync_reply_rules(&Tables::empty());
        if let Err(e) = nic_config::rules::set_bypass(&config.punt_device, false) {
            tracing::warn!(error = %e, "removing the punt device's bypass rule");
        }
    }
    let _ = std::fs::remove_file(&admin_socket);
    if !handing_over {
        let _ = std::fs::remove_file(admin_socket.with_extension("xdp"));
    }
    // At a hand-over the punt device is closed after `released`: closing it takes 10-20 ms
    // (the kernel waits for a grace period per queue), and the new process waits for that
    // answer. (Its own queues, if it created them meanwhile, keep the device.)
    let punt_queues = if handing_over {
        Some(punt_queues)
    } else {
        drop(punt_queues);
        None
    };
    let detach = |steering: Vec<Steering>| {
        for st in steering {
            let name = st.ifname().to_owned();
            if let Err(e) = st.detach() {
                tracing::warn!(interface = name, error = %e, "detach failed");
            }
        }
    };
    match result {
        Ok(Some((stream, _, latest))) => {
            let (n, n_affinity) = (flows.flows(), flows.affinity.len());
            // The programs stay attached until the new process is ready: meanwhile they drop
            // xlb's frames (no socket), so the kernel does not forward them untranslated.
            let ready = sent
                .unwrap_or_else(|| Err(anyhow::anyhow!("hand-over: the flows were not sent")))
                .and_then(|sent_ms| crate::handover::wait_attach(&stream).map(|()| sent_ms));
            let waited_ms = stopping.elapsed().as_secs_f64() * 1e3;
            // Either way the programs stay: the new process replaces them, or this one does
            // when it serves again (it finds their ids in the `.xdp` record, which stays).
            for st in steering {
                st.leave_attached();
            }
            match ready {
                Ok(sent_ms) => {
                    crate::handover::reply(&stream, crate::handover::RELEASED);
                    // The new process holds its own copies of the sockets now.
                    drop((kept, punt_queues));
                    tracing::info!(
                        flows = n,
                        affinity = n_affinity,
                        sent_ms,
                        released_ms = waited_ms,
                        "hand-over: workers stopped and flows sent, then programs left for the new xlb to replace once it was ready"
                    );
                    Ok(Ended::HandedOver { during_drain: shutdown.draining() })
                }
                Err(e) => {
                    // Tell a new process that is merely late not to attach after all.
                    crate::handover::reply(&stream, crate::handover::RESUMED);
                    tracing::error!(
                        error = %format!("{e:#}"),
                        flows = n,
                        ms = waited_ms,
                        "hand-over failed after this xlb stopped its workers: it serves again with its flows"
                    );
                    Ok(Ended::Resume(Box::new(Resume {
                        config: xlb::orchestrate::resume_config(latest, &config),
                        cluster,
                        flows,
                        sockets: kept,
                    })))
                }
            }
        }
        Ok(None) => {
            detach(steering);
            tracing::info!("xlb stopped; steering programs detached");
            Ok(Ended::Stopped)
        }
        Err(e) => {
            detach(steering);
            if let Some(p) = pending.take() {
                // The previous xlb stopped for this one and serves again once it hears this:
                // free the ports it will bind first.
                drop(control.take());
                p.abort(&format!("{e:#}"));
            }
            Err(e)
        }
    }
}

struct Supervisor<'a> {
    path: &'a Path,
    config: xlb::config::Config,
    publisher: &'a mut Publisher,
    handle: &'a TablesHandle,
    steering: &'a mut [Steering],
    telemetry: &'a xlb::http::Telemetry,
    rt: &'a tokio::runtime::Runtime,
    /// The steering programs' counters for `/metrics`, refreshed once a second.
    iface_stats: xlb::http::InterfaceStatsCell,
    /// The host as the publishes read and ask it (neighbours, reply rules when the punt
    /// device exists).
    kernel: LiveKernel,
    /// Hand-over requests from the admin socket ([`crate::handover`]).
    handover: std::sync::mpsc::Receiver<(std::os::unix::net::UnixStream, Option<String>)>,
    /// The VIP announcer (`announce.mode` other than `none`).
    announcement: Option<Announcement>,
    /// The VIPs to announce while healthy, from the last successful build.
    vips: PrefixSet,
    /// L2 mode, Kubernetes mode: the VIPs of `externalTrafficPolicy: Local` Services with the
    /// nodes that have a usable endpoint of them ([`xlb::announce::l2::local_nodes`]), from
    /// the last successful build.
    l2_local: xlb::announce::l2::LocalNodesCache,
    /// L2 mode, Kubernetes mode: the membership of the xlb nodes (per-node Leases).
    membership: &'a mut Option<xlb::k8s::Membership>,
    /// Kubernetes mode: the client and this node's name, to start the membership when a
    /// reload turns L2 mode on.
    l2_client: Option<(kube::Client, String)>,
    /// The L2 members last logged.
    l2_members: Option<std::collections::BTreeSet<String>>,
    /// The workers' heartbeats, read with the interface counters once a second: a worker
    /// whose loop stands still fails `/livez` and `/healthz`.
    stall_watch: xlb::http::WorkerStallWatch,
    /// systemd's watchdog (`WatchdogSec=`): fed from the loop while no worker stands still.
    watchdog: Option<crate::notify::WatchdogFeed>,
}

type K8s = (xlb::k8s::Source, xlb::http::HealthCheckServers, String);

impl Supervisor<'_> {
    /// Rebuilds from `input` and publishes ([`Publisher::publish`]); on error logs and keeps
    /// the running tables. `changes`: what changed since the tables last published, when only
    /// the source's objects changed (nothing else the build reads): the host's interfaces and
    /// neighbours are then not read again; `None` (or [`xlb::cluster::Changes::Full`]) reads
    /// them again.
    fn rebuild(
        &mut self,
        input: Input<'_>,
        changes: Option<&xlb::cluster::Changes>,
    ) -> Option<xlb::translate::TranslateReport> {
        let started = Instant::now();
        let refresh_host = changes.is_none_or(xlb::cluster::Changes::is_full);
        let published = self.publisher.publish(
            input,
            &self.config,
            refresh_host,
            self.handle,
            self.steering,
            &mut self.kernel,
            started,
        );
        match published {
            Ok(p) => {
                self.vips = p.vips;
                update_l2_local(&mut self.l2_local, &self.config, input);
                if let Err(e) = p.steering {
                    tracing::error!(error = %e, "steering maps");
                }
                self.telemetry.metrics.observe_sync(started.elapsed());
                self.telemetry.metrics.set_no_local_endpoints(p.report.no_local_endpoints);
                self.telemetry.metrics.set_last_sync(SystemTime::now());
                self.telemetry.health.updated(SystemTime::now());
                Some(p.report)
            }
            Err(e) => {
                tracing::error!("{}: {e:#}; keeping the running tables", self.path.display());
                None
            }
        }
    }

    /// Reads the workers' heartbeats; a change in which workers stand still is logged and
    /// given to the health state (`/livez` and `/healthz` fail while any does).
    fn check_workers(&mut self) {
        let stalled = self.stall_watch.stalled(Instant::now());
        let before = self.telemetry.health.stalled_workers();
        if stalled == before {
            return;
        }
        if stalled.is_empty() {
            tracing::info!(workers = ?before, "the stalled workers run again: /livez and /healthz answer 200");
        } else {
            tracing::error!(
                workers = ?stalled,
                limit_s = xlb::http::WORKER_STALL_LIMIT.as_secs(),
                "worker loop stalled (its heartbeat stood still longer than the limit): /livez and /healthz answer 503"
            );
        }
        self.telemetry.metrics.set_workers_stalled(stalled.len());
        self.telemetry.health.set_stalled_workers(stalled);
    }

    /// Reads every steering program's counters (one map lookup per interface) for `/metrics`.
    fn refresh_interface_stats(&self) {
        let stats: Vec<xlb::http::InterfaceStats> = self
            .steering
            .iter()
            .filter_map(|st| match st.stats() {
                Ok(s) => Some(xlb::http::InterfaceStats {
                    interface: st.ifname().to_owned(),
                    redirected: s.redirected,
                    passed: s.passed,
                    redirect_failed: s.redirect_failed,
                    parse_errors: s.parse_errors,
                    l2_replied: s.l2_replied,
                    l2_dropped: s.l2_dropped,
                    l2_other_host: s.l2_other_host,
                }),
                Err(e) => {
                    tracing::debug!(interface = st.ifname(), error = %e, "steering stats");
                    None
                }
            })
            .collect();
        *self.iface_stats.write().unwrap_or_else(std::sync::PoisonError::into_inner) = stats;
    }

    fn run(
        &mut self,
        cluster: &mut ClusterState,
        mut k8s: Option<&mut K8s>,
        shutdown: &Shutdown,
        reload: &AtomicBool,
    ) -> Result<Option<(std::os::unix::net::UnixStream, Option<String>)>> {
        let mut watcher = neighbours::NeighbourWatcher::new()?;
        let mut route_watcher = nic_config::routes::RouteWatcher::new()?;
        let mut last_route_read = Instant::now();
        let mut last_mtime = mtime(self.path);
        let mut dirty = false;
        let mut last_resolve = Instant::now();
        let mut last_periodic = Instant::now();
        let mut last_stats: Option<Instant> = None;
        let mut last_addrs = Instant::now();
        while !shutdown.due(&self.telemetry.health, self.config.shutdown_grace_period, Instant::now()) {
            if let Ok(stream) = self.handover.try_recv() {
                // The prefix files stay as they are: the new xlb announces the same VIPs, and
                // BIRD keeps announcing them meanwhile.
                return Ok(Some(stream));
            }
            // First thing in every tick: the drain after SIGTERM (health 503) withdraws the
            // VIPs at once, before the grace period's forwarding-only time.
            self.sync_announcement();
            // Neighbour changes (blocks up to 100 ms: part of the loop's tick).
            match watcher.recv_timeout(Duration::from_millis(100)) {
                Ok(Some(_)) => dirty = true,
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "neighbour watch"),
            }
            let m = mtime(self.path);
            if reload.swap(false, Ordering::Relaxed) || m != last_mtime {
                last_mtime = m;
                match crate::reload_config(self.path, cluster) {
                    Ok(l) => {
                        for n in &l.notes {
                            tracing::info!("{n}");
                        }
                        if l.config.announce != self.config.announce {
                            // Withdraw through the old settings (other files, another BIRD).
                            self.withdraw("the announce settings changed");
                            self.announcement = announcement(&l.config, self.steering);
                        }
                        self.config = l.config;
                        self.follow_l2_mode();
                        // The interfaces may have changed, and with them which routes lead
                        // through the kernel.
                        if let Some(r) = kernel_routes(&self.config) {
                            self.publisher.builders.routes = r;
                        }
                        if k8s.is_none() {
                            let (services, endpoints) = xlb::orchestrate::take_reloaded(cluster, l.cluster);
                            self.telemetry.metrics.count_service_changes(services);
                            self.telemetry.metrics.count_endpoint_changes(endpoints);
                        }
                        dirty = true;
                        tracing::info!(config = %self.path.display(), "configuration reloaded");
                    }
                    Err(e) => tracing::error!("{e:#}; keeping the running tables"),
                }
            }
            if let Some((src, hc, node)) = k8s.as_deref_mut() {
                let next = self
                    .rt
                    .block_on(async { tokio::time::timeout(Duration::from_millis(100), src.next_snapshot()).await });
                if let Ok(snap) = next {
                    // Something else the build reads changed since the last publish (a
                    // reload, a neighbour): the change set does not cover it (the
                    // translator sees a new config or host address by itself).
                    let changes = (!dirty).then_some(&snap.changes);
                    let input = Input::Cluster {
                        index: &snap.cluster,
                        changes: &snap.changes,
                        local: &cluster.local_addresses,
                    };
                    match self.rebuild(input, changes) {
                        Some(report) => {
                            src.published(&snap, &report);
                            let hcs = xlb::k8s::health_check_services_indexed(&snap.cluster, node);
                            for e in self.rt.block_on(hc.sync(&hcs)) {
                                tracing::warn!("{e}");
                            }
                        }
                        None => src.sync_failed(snap),
                    }
                    dirty = false;
                }
            } else if last_periodic.elapsed() >= self.config.sync_period {
                // Standalone: a periodic full resync repairs outside interference with the
                // steering maps (SYNC-04) and keeps /healthz fresh.
                dirty = true;
            }
            // The kernel's routes (backends' next hops): reread when the kernel announces a
            // change (RTM_NEWROUTE / RTM_DELROUTE), and with every periodic resync.
            let announced = route_watcher.changed().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "route watch");
                true
            });
            if announced || last_route_read.elapsed() >= self.config.sync_period {
                last_route_read = Instant::now();
                if let Some(r) = kernel_routes(&self.config)
                    && r != self.publisher.builders.routes
                {
                    tracing::info!(routes = r.len(), "the kernel's routes changed");
                    self.publisher.builders.routes = r;
                    dirty = true;
                }
            }
            // The host's addresses (NodePorts answer on them, NPA-02), once a second.
            if last_addrs.elapsed() >= Duration::from_secs(1) {
                last_addrs = Instant::now();
                if let Some(a) = host_addresses()
                    && a != cluster.local_addresses
                {
                    tracing::info!(addresses = ?a, "the host's addresses changed");
                    cluster.local_addresses = a;
                    dirty = true;
                }
            }
            if dirty {
                dirty = false;
                last_periodic = Instant::now();
                let none = xlb::cluster::Changes::default();
                let input = match k8s.as_deref() {
                    Some((src, _, _)) => {
                        Input::Cluster { index: src.cluster(), changes: &none, local: &cluster.local_addresses }
                    }
                    None => Input::File(cluster),
                };
                self.rebuild(input, None);
                last_resolve = Instant::now();
            }
            if last_stats.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                last_stats = Some(Instant::now());
                self.refresh_interface_stats();
                self.check_workers();
            }
            if let Some(w) = self.watchdog.as_mut()
                && w.due(Instant::now(), !self.telemetry.health.stalled_workers().is_empty())
            {
                crate::notify::watchdog();
            }
            if last_resolve.elapsed() > Duration::from_secs(2) {
                let t = self.handle.load();
                if !t.unresolved.is_empty() {
                    let all: Vec<IpAddr> = t.unresolved.iter().copied().collect();
                    self.kernel.resolve(&self.config, &all);
                }
                last_resolve = Instant::now();
            }
        }
        // A hand-over asked for while the drain ran out is still served: the new xlb has
        // stopped nothing yet, and stopping now would make it fail instead of taking over.
        let handover = self.handover.try_recv().ok();
        if handover.is_none() {
            // Stopping: withdraw before the workers stop (already done if a drain ran).
            self.withdraw("xlb stops");
        }
        Ok(handover)
    }

    /// Announces [`Supervisor::vips`] while this node is healthy (what `/healthz` answers:
    /// synced recently, Node not being deleted, not draining), nothing otherwise. Calls the
    /// announcer only on a change, or to retry a failure.
    fn sync_announcement(&mut self) {
        let healthy = self.telemetry.health.healthz().healthy;
        if let Some(m) = self.membership.as_ref() {
            m.set_healthy(healthy);
        }
        if self.announcement.is_none() {
            return;
        }
        let want = if healthy { self.owned_vips() } else { PrefixSet::new() };
        let Some(a) = self.announcement.as_mut() else { return };
        if let Some(r) = a.sync(&want, Instant::now()) {
            log_announced(a, &want, healthy, &r);
        }
    }

    /// The VIPs this node announces while healthy: all of [`Supervisor::vips`], except in L2
    /// mode with Kubernetes, where only those whose owner among the members (per-node Leases,
    /// [`xlb::k8s::Membership`]) that would announce them is this node
    /// ([`xlb::announce::l2::owned`]); none before the members are known.
    /// Standalone, a node in L2 mode owns every VIP it serves.
    fn owned_vips(&mut self) -> PrefixSet {
        if self.config.announce.mode != xlb::config::AnnounceMode::L2 || self.l2_client.is_none() {
            return self.vips.clone();
        }
        let Some(m) = self.membership.as_ref() else { return PrefixSet::new() };
        let members = m.members(Instant::now());
        let node = m.config().node.clone();
        if members != self.l2_members {
            let list = members
                .as_ref()
                .map_or_else(|| "unknown".to_owned(), |s| s.iter().cloned().collect::<Vec<_>>().join(","));
            tracing::info!(members = %list, node = %node, "L2 members changed");
            self.l2_members.clone_from(&members);
        }
        let Some(members) = members else { return PrefixSet::new() };
        xlb::announce::l2::owned(&self.vips, &members, &node, self.l2_local.nodes())
    }

    /// Starts or stops the L2 membership after a reload changed `announce.mode` (Kubernetes
    /// mode only; its Lease settings take effect at a start).
    fn follow_l2_mode(&mut self) {
        let l2 = self.config.announce.mode == xlb::config::AnnounceMode::L2;
        match (l2, self.membership.is_some(), &self.l2_client) {
            (true, false, Some((client, node))) => {
                let _g = self.rt.enter();
                *self.membership = Some(start_membership(client, &self.config, node));
            }
            (false, true, _) => {
                if let Some(m) = self.membership.take() {
                    let _ =
                        self.rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), m.stop(true)).await });
                }
                self.l2_members = None;
            }
            _ => {}
        }
    }

    /// Withdraws every VIP now (stop, or a change of the announce settings); logged.
    fn withdraw(&mut self, why: &str) {
        let Some(a) = self.announcement.as_mut() else { return };
        let none = PrefixSet::new();
        if let Some(r) = a.sync_now(&none, Instant::now()) {
            tracing::info!(why, "withdrawing the announced VIPs");
            log_announced(a, &none, false, &r);
        }
    }
}

/// Brings `cache` ([`xlb::announce::l2::local_nodes`]) to a Kubernetes build in L2 mode,
/// reading only the Services the build's snapshot changed (a failed build queues its changes
/// again as a full one, [`xlb::k8s::Source::sync_failed`]); empties it otherwise (standalone,
/// a node owns every VIP it serves).
fn update_l2_local(cache: &mut xlb::announce::l2::LocalNodesCache, config: &xlb::config::Config, input: Input<'_>) {
    match input {
        Input::Cluster { index, changes, .. } if config.announce.mode == xlb::config::AnnounceMode::L2 => {
            cache.update(index, changes, &xlb::announce::Scope::from_config(config));
        }
        _ => cache.clear(),
    }
}

/// Starts the L2 membership of `node` (on the current tokio runtime), logged.
fn start_membership(client: &kube::Client, config: &xlb::config::Config, node: &str) -> xlb::k8s::Membership {
    let mcfg = xlb::k8s::MembershipConfig::from_config(config, node);
    tracing::info!(
        lease = %xlb::k8s::lease_name(node),
        namespace = %mcfg.namespace,
        lease_duration = ?mcfg.lease_duration,
        renew_interval = ?mcfg.renew_interval,
        "L2 mode: one owner per VIP among the nodes with an unexpired lease"
    );
    xlb::k8s::Membership::start(client.clone(), mcfg)
}

/// How long after a failed announcement the same set is tried again.
const ANNOUNCE_RETRY: Duration = Duration::from_secs(5);

/// The announcer `config.announce` asks for; in mode `l2` it answers through the steering
/// programs of `announce.l2.interfaces` (all of `steering` when empty).
fn announcement(config: &xlb::config::Config, steering: &[Steering]) -> Option<Announcement> {
    let mut responders = Vec::new();
    if config.announce.mode == xlb::config::AnnounceMode::L2 {
        let names = &config.announce.l2.interfaces;
        for st in steering.iter().filter(|st| names.is_empty() || names.iter().any(|n| n == st.ifname())) {
            match st.l2_responder() {
                Ok(r) => responders.push(r),
                Err(e) => {
                    tracing::error!(interface = st.ifname(), error = %e, "L2 announcement: this interface will not answer for the VIPs")
                }
            }
        }
    }
    let a = xlb::announce::from_config(config, responders)?;
    tracing::info!(announcer = %a.describe(), "VIPs are announced while this node is healthy and they have endpoints");
    Some(Announcement::new(a, ANNOUNCE_RETRY))
}

fn log_announced(a: &Announcement, want: &PrefixSet, healthy: bool, r: &Result<Applied, xlb::announce::AnnounceError>) {
    match r {
        Ok(Applied::Reconfigured { written, reply }) => tracing::info!(
            vips = %want,
            healthy,
            written,
            reply = %reply.replace('\n', " | "),
            "announced VIPs"
        ),
        Ok(Applied::Unchanged) => tracing::debug!(vips = %want, "announced VIPs unchanged"),
        Err(e) => tracing::error!(
            announcer = %a.announcer().describe(),
            vips = %want,
            error = %e,
            "announcing VIPs failed; the routing daemon keeps what it announced before (retried in 5 s)"
        ),
    }
}

/// The addresses of this host's interfaces, loopback left out, sorted (for
/// [`ClusterState::local_addresses`]); `None` (logged) if netlink fails, so the last ones stay.
fn host_addresses() -> Option<Vec<IpAddr>> {
    match nic_config::local_addresses() {
        Ok(list) => {
            let mut a: Vec<IpAddr> = list.into_iter().map(|x| x.addr).filter(|a| !a.is_loopback()).collect();
            a.sort_unstable();
            a.dedup();
            Some(a)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the host's addresses; keeping the last ones");
            None
        }
    }
}

/// A punt-device queue as the workers use it.
struct Tun(nic_config::punt::PuntQueue);

impl dataplane::worker::KernelQueue for Tun {
    fn send(&self, l3: &[u8]) -> std::io::Result<usize> {
        self.0.send(l3)
    }

    fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.recv(buf)
    }
}

/// The kernel's unicast routes of `cfg.route_tables` (`RTM_GETROUTE`; main by default), for
/// [`TablesSpec::kernel_routes`]; a route whose output interface is not one of `cfg`'s
/// interfaces is marked `kernel` (its backends are reached through the punt device). `None`
/// (logged) if netlink fails.
fn kernel_routes(cfg: &xlb::config::Config) -> Option<Vec<KernelRouteSpec>> {
    let ours: Vec<u32> = cfg.interfaces.iter().filter_map(|i| nic_config::ifindex(&i.name).ok()).collect();
    let punt = !cfg.punt_device.is_empty();
    let mut all = Vec::new();
    for table in &cfg.route_tables {
        match nic_config::routes::routes(*table) {
            Ok(list) => all.extend(list),
            Err(e) => {
                tracing::warn!(table, error = %e, "cannot read the kernel's routes");
                return None;
            }
        }
    }
    let mut v: Vec<KernelRouteSpec> = all
        .into_iter()
        .map(|r| KernelRouteSpec {
            dst: Cidr { addr: r.dst, len: r.prefix_len },
            kernel: punt && r.oif.is_some_and(|o| !ours.contains(&o)),
            gateways: r.gateways,
            metric: r.metric,
        })
        .collect();
    v.sort_by_key(|a| (a.dst.addr, a.dst.len, a.metric));
    Some(v)
}

/// The CPUs this process may run on, read once, the first time (`core_affinity` reports the
/// calling thread's mask): when the process serves again after a failed hand-over its threads
/// are already kept to the control CPUs ([`pin_control_threads`]), so their masks are no longer
/// the process's set. Empty if it cannot be read.
fn process_cpus() -> Vec<usize> {
    static CPUS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    CPUS.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default().into_iter().map(|c| c.id).collect()).clone()
}

/// Restricts every thread of this process to `cpus` (`sched_setaffinity(2)` per thread of
/// `/proc/self/task`); called before any worker exists, so all of them are control threads.
/// Returns how many were set. A thread that cannot be set is logged and left as it is: the
/// process runs either way, only with its control work on the workers' cores.
fn pin_control_threads(cpus: &[usize]) -> usize {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        if let Err(err) = set.set(c) {
            tracing::warn!(cpu = c, %err, "control threads not kept off the worker cores");
            return 0;
        }
    }
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    let mut n = 0;
    for tid in tasks.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()) {
        match nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set) {
            Ok(()) => n += 1,
            // The thread ended since the directory was read.
            Err(nix::errno::Errno::ESRCH) => {}
            Err(err) => tracing::warn!(tid, %err, "could not keep a control thread off the worker cores"),
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shutdown() -> Shutdown {
        Shutdown {
            interrupt: Arc::new(AtomicBool::new(false)),
            term: Arc::new(AtomicBool::new(false)),
            drain_since: std::cell::Cell::new(None),
            stopping_sent: std::cell::Cell::new(false),
        }
    }

    #[test]
    fn lb_06_sigterm_drains_for_the_grace_period_then_stops() {
        let (s, h) = (shutdown(), xlb::http::ProxyHealth::new(Duration::from_secs(30)));
        let (grace, t0) = (Duration::from_secs(30), Instant::now());
        assert!(!s.due(&h, grace, t0), "no signal");
        s.term.store(true, Ordering::Relaxed);
        assert!(!s.due(&h, grace, t0), "SIGTERM starts the drain, it does not stop");
        assert!(h.is_draining() && !h.serving());
        assert!(!s.due(&h, grace, t0 + grace - Duration::from_millis(1)), "still draining");
        assert!(s.due(&h, grace, t0 + grace), "grace period over");
    }

    #[test]
    fn lb_06_second_sigterm_or_sigint_stops_at_once() {
        let (s, h) = (shutdown(), xlb::http::ProxyHealth::new(Duration::from_secs(30)));
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();
        s.term.store(true, Ordering::Relaxed);
        assert!(!s.due(&h, grace, t0));
        s.term.store(true, Ordering::Relaxed);
        assert!(s.due(&h, grace, t0), "second SIGTERM");
        let (s, h) = (shutdown(), xlb::http::ProxyHealth::new(Duration::from_secs(30)));
        s.interrupt.store(true, Ordering::Relaxed);
        assert!(s.due(&h, grace, t0), "SIGINT does not drain");
        assert!(!h.is_draining());
    }

    #[test]
    fn lb_06_zero_grace_period_stops_at_once_on_sigterm() {
        let (s, h) = (shutdown(), xlb::http::ProxyHealth::new(Duration::from_secs(30)));
        s.term.store(true, Ordering::Relaxed);
        assert!(s.due(&h, Duration::ZERO, Instant::now()));
    }
}
