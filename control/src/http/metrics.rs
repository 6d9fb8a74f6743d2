//! `/metrics`: kube-proxy's sync metrics (MET-01..05, `pkg/proxy/metrics/metrics.go`) and the
//! dataplane's `xlb_*` counters, read at scrape time through a [`DataplaneView`].

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dataplane::counters::{
    ByteCounter, DROP_BYTES_HELP, DropReason, Event, Kind, WorkerCounters, XskCounter, XskCounters,
};
use dataplane::tables::TablesHandle;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::translate::NoLocalEndpoints;

/// Content type of [`ProxyMetrics::encode`]'s output (OpenMetrics text 1.0.0).
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of [`ProxyMetrics::encode_prometheus`]'s output (Prometheus text 0.0.4, what
/// kube-proxy serves).
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One worker's counters at scrape time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Worker number (label `worker`).
    pub worker: u16,
    /// Frames received (`xlb_worker_rx_packets_total`).
    pub rx_packets: u64,
    /// Frames transmitted (`xlb_worker_tx_packets_total`).
    pub tx_packets: u64,
    /// Frames passed to the kernel (`xlb_worker_pass_packets_total`).
    pub pass_packets: u64,
    /// Drops by reason name (`xlb_drops_total{reason}`; names of `DropReason::name`).
    pub drops: Vec<(&'static str, u64)>,
    /// Bytes by verdict class, every [`ByteCounter`] in number order
    /// (`xlb_worker_<name>_bytes_total`; names and help from its declaration).
    pub bytes: Vec<(ByteCounter, u64)>,
    /// Bytes dropped by reason name, every reason in number order
    /// (`xlb_drop_bytes_total{reason}`).
    pub drop_bytes: Vec<(&'static str, u64)>,
    /// Events by name (`xlb_events_total{event}`; names of `Event::name`).
    pub events: Vec<(&'static str, u64)>,
    /// Flow-table entries now (`xlb_conntrack_entries`, gauge; MET-10).
    pub conntrack_entries: u64,
    /// Flow-table entries evicted before expiry (`xlb_conntrack_evictions_total`).
    pub conntrack_evictions: u64,
    /// Flows each family's flow table holds at most (`xlb_conntrack_capacity`, gauge):
    /// `conntrack.maxPerCore`; the IPv4 and IPv6 tables each have this capacity.
    pub conntrack_capacity: u64,
    /// Nanoseconds the worker spent in loop iterations that found work
    /// (`xlb_worker_busy_seconds_total`, exported in seconds).
    pub busy_ns: u64,
    /// Loop iterations that found work (`xlb_worker_busy_loops_total`).
    pub busy_loops: u64,
    /// AF_XDP ring and socket counters (`xlb_xsk_*`); `None` when the view has none.
    pub xsk: Option<XskStats>,
}

/// One worker's AF_XDP counters at scrape time: every [`XskCounter`] with its value, in number
/// order (names, help and kinds come from the one declaration in `dataplane::counters`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XskStats(pub Vec<(XskCounter, u64)>);

impl XskStats {
    /// Reads a worker's [`XskCounters`] (relaxed loads).
    pub fn from_counters(c: &XskCounters) -> Self {
        Self(c.values().collect())
    }

    /// The value of `c` (0 if absent).
    pub fn get(&self, c: XskCounter) -> u64 {
        self.0.iter().find(|(x, _)| *x == c).map_or(0, |(_, v)| *v)
    }
}

/// The steering XDP program's counters on one interface (nic-config's `SteeringStats`),
/// summed over CPUs; `xlb_steering_packets_total{interface,action}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceStats {
    /// Interface name (label `interface`).
    pub interface: String,
    /// Frames redirected to an xlb socket (`action="redirected"`).
    pub redirected: u64,
    /// Frames not for xlb, given to the kernel (`action="passed"`).
    pub passed: u64,
    /// Frames for xlb on a queue without a socket, given to the kernel
    /// (`action="redirect_failed"`).
    pub redirect_failed: u64,
    /// Malformed frames given to the kernel (`action="parse_error"`).
    pub parse_errors: u64,
    /// ARP requests and Neighbor Solicitations for an L2-announced VIP answered by the program
    /// (`action="l2_replied"`).
    pub l2_replied: u64,
    /// Frames to an L2-announced VIP outside its service ports, dropped (`action="l2_dropped"`).
    pub l2_dropped: u64,
    /// L2 mode: unicast frames addressed to another MAC than the interface's (flooded by a
    /// switch), given to the kernel (`action="l2_other_host"`).
    pub l2_other_host: u64,
}

/// Where the control thread leaves the latest [`InterfaceStats`] for scrapes to read.
pub type InterfaceStatsCell = Arc<RwLock<Vec<InterfaceStats>>>;

impl WorkerStats {
    /// Reads a worker's [`WorkerCounters`] (relaxed loads; every drop reason and event, zeros
    /// included, so the series always exist).
    pub fn from_counters(worker: u16, c: &WorkerCounters) -> Self {
        Self {
            worker,
            rx_packets: c.rx.get(),
            tx_packets: c.tx.get(),
            pass_packets: c.pass.get(),
            drops: DropReason::ALL.iter().map(|r| (r.name(), c.drops_of(*r))).collect(),
            bytes: ByteCounter::ALL.iter().map(|b| (*b, c.bytes_of(*b))).collect(),
            drop_bytes: DropReason::ALL.iter().map(|r| (r.name(), c.drop_bytes_of(*r))).collect(),
            events: Event::ALL.iter().map(|e| (e.name(), c.events_of(*e))).collect(),
            conntrack_entries: c.ct_entries.get(),
            conntrack_evictions: c.events_of(Event::ConntrackEvicted),
            conntrack_capacity: c.ct_capacity.get(),
            busy_ns: c.busy_ns.get(),
            busy_loops: c.busy_loops.get(),
            xsk: None,
        }
    }
}

/// One Service table's counters, summed over workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// Table name, e.g. `default/web:http` (label `service`).
    pub service: String,
    /// Packets (`xlb_service_packets_total`).
    pub packets: u64,
    /// New flows (`xlb_service_new_flows_total`).
    pub new_flows: u64,
    /// The table's [`dataplane::maglev::MaglevTable::checksum`] for a Service scheduled
    /// with Maglev (`mh`) that has a table; `None` otherwise. Exported as
    /// `xlb_maglev_table_checksum` (its top 53 bits).
    pub maglev_checksum: Option<u64>,
    /// The table's endpoints by state (`xlb_service_endpoints{state}`).
    pub endpoints: EndpointCounts,
}

/// A Service table's endpoints (the backends in the published table: what the translation
/// kept of the EndpointSlices for this table's traffic class), counted by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointCounts {
    /// Every backend in the table (`state="total"`).
    pub total: u64,
    /// With `conditions.ready` (`state="ready"`).
    pub ready: u64,
    /// With `conditions.serving` (`state="serving"`).
    pub serving: u64,
    /// With `conditions.terminating` (`state="terminating"`).
    pub terminating: u64,
    /// Taking new flows: eligible and weight above 0 (`state="eligible"`); the others only
    /// keep their existing flows.
    pub eligible: u64,
}

impl EndpointCounts {
    /// `(state label, count)` for every state, in a fixed order.
    #[must_use]
    pub fn by_state(&self) -> [(&'static str, u64); 5] {
        [
            ("total", self.total),
            ("ready", self.ready),
            ("serving", self.serving),
            ("terminating", self.terminating),
            ("eligible", self.eligible),
        ]
    }
}

/// The value `xlb_maglev_table_checksum` exports for a Maglev table checksum: its top 53
/// bits, an integer a Prometheus sample (an IEEE 754 double) holds exactly, so two nodes'
/// samples are equal exactly when those bits are (a false match between different tables
/// has probability 2^-53).
#[must_use]
pub(super) fn maglev_checksum_value(checksum: u64) -> u64 {
    checksum >> 11
}

/// One backend's counters, summed over workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Table name of its Service (label `service`).
    pub service: String,
    /// `address:port`, IPv6 in brackets (label `backend`).
    pub backend: String,
    /// Packets (`xlb_backend_packets_total`).
    pub packets: u64,
    /// New flows (`xlb_backend_new_flows_total`).
    pub new_flows: u64,
    /// Weight for new flows (`xlb_backend_weight`): the table's weight while the backend is
    /// eligible, 0 while it only keeps its existing flows (draining).
    pub weight: u64,
}

/// What the dataplane shows to `/metrics`; called on every scrape, from a Tokio worker
/// thread, so it must be cheap and must not block on the packet workers.
pub trait DataplaneView: Send + Sync {
    /// Per-worker counters.
    fn workers(&self) -> Vec<WorkerStats>;
    /// Per-Service-table counters.
    fn services(&self) -> Vec<ServiceStats>;
    /// Per-backend counters.
    fn backends(&self) -> Vec<BackendStats>;
    /// Per-interface steering-program counters (none by default).
    fn interfaces(&self) -> Vec<InterfaceStats> {
        Vec::new()
    }
}

/// A [`DataplaneView`] over the published tables and the workers' [`WorkerCounters`].
///
/// Service counters are indexed by the table's stable service id, backend counters by slot;
/// a slot reused by another backend keeps counting from the old value (counters are never
/// reset), which Prometheus' `rate()` tolerates only across a restart, so prefer per-service
/// rates for alerting.
#[derive(Debug, Clone)]
pub struct CountersView {
    tables: TablesHandle,
    workers: Vec<(u16, Arc<WorkerCounters>)>,
    xsk: Vec<(u16, Arc<XskCounters>)>,
    interfaces: InterfaceStatsCell,
}

impl CountersView {
    /// A view of `workers` (id, counters) with names from `tables`.
    pub fn new(tables: TablesHandle, workers: Vec<(u16, Arc<WorkerCounters>)>) -> Self {
        Self { tables, workers, xsk: Vec::new(), interfaces: InterfaceStatsCell::default() }
    }

    /// Adds the workers' AF_XDP counters, by worker id.
    #[must_use]
    pub fn with_xsk(mut self, xsk: Vec<(u16, Arc<XskCounters>)>) -> Self {
        self.xsk = xsk;
        self
    }

    /// Adds the steering counters the control thread stores in `cell`.
    #[must_use]
    pub fn with_interfaces(mut self, cell: InterfaceStatsCell) -> Self {
        self.interfaces = cell;
        self
    }
}

impl DataplaneView for CountersView {
    fn workers(&self) -> Vec<WorkerStats> {
        self.workers
            .iter()
            .map(|(id, c)| {
                let mut s = WorkerStats::from_counters(*id, c);
                s.xsk = self.xsk.iter().find(|(x, _)| x == id).map(|(_, x)| XskStats::from_counters(x));
                s
            })
            .collect()
    }

    fn interfaces(&self) -> Vec<InterfaceStats> {
        self.interfaces.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn services(&self) -> Vec<ServiceStats> {
        let t = self.tables.load();
        t.services
            .iter()
            .map(|s| {
                let i = s.id as usize;
                let sum = |f: fn(&WorkerCounters) -> &[dataplane::counters::Counter]| -> u64 {
                    self.workers.iter().map(|(_, c)| f(c).get(i).map_or(0, |c| c.get())).sum()
                };
                let mut endpoints = EndpointCounts::default();
                for b in s.members.iter().filter_map(|r| t.backends.get(r.index())?.as_ref()) {
                    endpoints.total += 1;
                    endpoints.ready += u64::from(b.conditions.ready);
                    endpoints.serving += u64::from(b.conditions.serving);
                    endpoints.terminating += u64::from(b.conditions.terminating);
                    endpoints.eligible += u64::from(b.eligible && b.weight > 0);
                }
                ServiceStats {
                    service: s.name.to_string(),
                    packets: sum(|c| &c.objects.service_packets),
                    new_flows: sum(|c| &c.objects.service_flows),
                    maglev_checksum: s.maglev.as_ref().map(|m| m.checksum()),
                    endpoints,
                }
            })
            .collect()
    }

    fn backends(&self) -> Vec<BackendStats> {
        let t = self.tables.load();
        t.backends
            .iter()
            .flatten()
            .map(|b| {
                let i = b.this.index();
                let sum = |f: fn(&WorkerCounters) -> &[dataplane::counters::Counter]| -> u64 {
                    self.workers.iter().map(|(_, c)| f(c).get(i).map_or(0, |c| c.get())).sum()
                };
                BackendStats {
                    service: t.services.get(b.service as usize).map_or_else(String::new, |s| s.name.to_string()),
                    backend: std::net::SocketAddr::new(b.addr, b.port).to_string(),
                    packets: sum(|c| &c.objects.backend_packets),
                    new_flows: sum(|c| &c.objects.backend_flows),
                    weight: if b.eligible { u64::from(b.weight) } else { 0 },
                }
            })
            .collect()
    }
}

type SharedView = Arc<RwLock<Option<Arc<dyn DataplaneView>>>>;

/// Encodes the `xlb_*` families from the view at scrape time.
struct DataplaneCollector {
    view: SharedView,
}

impl fmt::Debug for DataplaneCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataplaneCollector").finish_non_exhaustive()
    }
}

fn family<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    ty: MetricType,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> Result<(), fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    for (labels, v) in samples {
        match ty {
            MetricType::Counter => ConstCounter::new(v).encode(m.encode_family(&labels)?)?,
            _ => ConstGauge::new(v).encode(m.encode_family(&labels)?)?,
        }
    }
    Ok(())
}

impl Collector for DataplaneCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let view = self.view.read().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(view) = view else { return Ok(()) };
        let workers = view.workers();
        let w = |s: &WorkerStats| [("worker", s.worker.to_string())];
        use MetricType::{Counter as C, Gauge as G};
        let e = &mut enc;
        family(
            e,
            "xlb_worker_rx_packets",
            "Frames received by the worker.",
            C,
            workers.iter().map(|s| (w(s), s.rx_packets)),
        )?;
        family(
            e,
            "xlb_worker_tx_packets",
            "Frames transmitted by the worker.",
            C,
            workers.iter().map(|s| (w(s), s.tx_packets)),
        )?;
        family(
            e,
            "xlb_worker_pass_packets",
            "Frames the worker passed to the kernel.",
            C,
            workers.iter().map(|s| (w(s), s.pass_packets)),
        )?;
        family(
            e,
            "xlb_drops",
            "Packets dropped, by worker and reason.",
            C,
            workers.iter().flat_map(|s| {
                s.drops.iter().map(|(r, v)| ([("worker", s.worker.to_string()), ("reason", (*r).to_owned())], *v))
            }),
        )?;
        for b in ByteCounter::ALL {
            let name = format!("xlb_worker_{}_bytes", b.name());
            family(
                e,
                &name,
                b.help(),
                C,
                workers.iter().map(|s| (w(s), s.bytes.iter().find(|(x, _)| x == b).map_or(0, |(_, v)| *v))),
            )?;
        }
        family(
            e,
            "xlb_drop_bytes",
            DROP_BYTES_HELP,
            C,
            workers.iter().flat_map(|s| {
                s.drop_bytes.iter().map(|(r, v)| ([("worker", s.worker.to_string()), ("reason", (*r).to_owned())], *v))
            }),
        )?;
        family(
            e,
            "xlb_events",
            "Dataplane events (rejects, resets, new flows, ...), by worker and event.",
            C,
            workers.iter().flat_map(|s| {
                s.events.iter().map(|(n, v)| ([("worker", s.worker.to_string()), ("event", (*n).to_owned())], *v))
            }),
        )?;
        family(
            e,
            "xlb_conntrack_entries",
            "Flow-table entries now.",
            G,
            workers.iter().map(|s| (w(s), s.conntrack_entries)),
        )?;
        family(
            e,
            "xlb_conntrack_evictions",
            "Flow-table entries evicted before expiry to make room.",
            C,
            workers.iter().map(|s| (w(s), s.conntrack_evictions)),
        )?;
        family(
            e,
            "xlb_conntrack_capacity",
            "Flows each family's flow table of the worker holds at most (conntrack.maxPerCore; the IPv4 and IPv6 tables each have this capacity, xlb_conntrack_entries counts both).",
            G,
            workers.iter().map(|s| (w(s), s.conntrack_capacity)),
        )?;
        {
            let mut m = e.encode_descriptor(
                "xlb_worker_busy_seconds",
                "Time the worker spent in loop iterations that found work (frames received, from the punt device or handed over), in seconds; its rate is the busy fraction of the worker's core.",
                None,
                C,
            )?;
            for s in &workers {
                // Exact below 2^53 ns (104 days of busy time); beyond, within 1 ns per 2^53.
                #[expect(clippy::cast_precision_loss, reason = "nanoseconds to seconds for export")]
                let secs = s.busy_ns as f64 / 1e9;
                ConstCounter::new(secs).encode(m.encode_family(&w(s))?)?;
            }
        }
        family(
            e,
            "xlb_worker_busy_loops",
            "Loop iterations of the worker that found work (those xlb_worker_busy_seconds_total counts).",
            C,
            workers.iter().map(|s| (w(s), s.busy_loops)),
        )?;
        let xsk: Vec<(_, &XskStats)> = workers.iter().filter_map(|s| Some((w(s), s.xsk.as_ref()?))).collect();
        if !xsk.is_empty() {
            for c in XskCounter::ALL {
                let ty = match c.kind() {
                    Kind::Counter => C,
                    Kind::Gauge => G,
                };
                let name = format!("xlb_xsk_{}", c.name());
                family(e, &name, c.help(), ty, xsk.iter().map(|(l, x)| (l.clone(), x.get(*c))))?;
            }
        }
        let ifs = view.interfaces();
        if !ifs.is_empty() {
            family(
                e,
                "xlb_steering_packets",
                "Frames seen by the steering XDP program, by interface and action (redirected to xlb, passed to the kernel, redirect_failed: no socket on that queue, dropped; parse_error: malformed, passed; l2_replied: ARP/NDP for an L2-announced VIP answered; l2_dropped: to such a VIP outside its service ports, dropped; l2_other_host: L2 mode, unicast to another MAC, passed).",
                C,
                ifs.iter().flat_map(|i| {
                    [
                        ("redirected", i.redirected),
                        ("passed", i.passed),
                        ("redirect_failed", i.redirect_failed),
                        ("parse_error", i.parse_errors),
                        ("l2_replied", i.l2_replied),
                        ("l2_dropped", i.l2_dropped),
                        ("l2_other_host", i.l2_other_host),
                    ]
                    .map(|(a, v)| ([("interface", i.interface.clone()), ("action", a.to_owned())], v))
                }),
            )?;
        }
        let services = view.services();
        let sl = |s: &ServiceStats| [("service", s.service.clone())];
        family(e, "xlb_service_packets", "Packets per Service table.", C, services.iter().map(|s| (sl(s), s.packets)))?;
        family(
            e,
            "xlb_service_new_flows",
            "New flows per Service table.",
            C,
            services.iter().map(|s| (sl(s), s.new_flows)),
        )?;
        family(
            e,
            "xlb_maglev_table_checksum",
            "Digest (top 53 bits of xxh3-64) of the Service table's Maglev lookup table: backends, weights and the backend of every slot. Every xlb node given the same EndpointSlices exports the same value; a difference between nodes behind one ECMP group means they send some flows to different backends.",
            G,
            services.iter().filter_map(|s| Some((sl(s), maglev_checksum_value(s.maglev_checksum?)))),
        )?;
        family(
            e,
            "xlb_service_endpoints",
            "Endpoints in the Service table's published backends, by state: total, ready, serving, terminating (EndpointSlice conditions), eligible (taking new flows).",
            G,
            services.iter().flat_map(|s| {
                s.endpoints.by_state().map(|(st, v)| ([("service", s.service.clone()), ("state", st.to_owned())], v))
            }),
        )?;
        let backends = view.backends();
        let bl = |b: &BackendStats| [("service", b.service.clone()), ("backend", b.backend.clone())];
        family(e, "xlb_backend_packets", "Packets per backend.", C, backends.iter().map(|b| (bl(b), b.packets)))?;
        family(e, "xlb_backend_new_flows", "New flows per backend.", C, backends.iter().map(|b| (bl(b), b.new_flows)))?;
        family(
            e,
            "xlb_backend_weight",
            "Weight of the backend for new flows in its Service table (1 for Kubernetes endpoints); 0 while it only keeps its existing flows (terminating, draining).",
            G,
            backends.iter().map(|b| (bl(b), b.weight)),
        )?;
        Ok(())
    }
}

type Label1 = [(&'static str, &'static str); 1];

/// The `resource` values of `xlb_watch_errors_total`; each series exists from the start at 0.
pub const WATCHED_RESOURCES: &[&str] = &["services", "endpointslices", "nodes"];

/// kube-proxy's `SyncProxyRulesLatency` buckets: `ExponentialBuckets(0.001, 2, 15)`.
fn sync_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 15)
}

/// kube-proxy's `NetworkProgrammingLatency` buckets: 0.25, 0.5, then 1..59 by 1, 60..115
/// by 5, 120..300 by 30 (seconds).
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The registry behind `/metrics` and the handles the sync loop updates.
///
/// Families (names as kube-proxy's where one exists; a counter's `_total` suffix is added by
/// the encoder):
/// - `kubeproxy_sync_proxy_rules_duration_seconds` histogram (MET-01);
/// - `kubeproxy_network_programming_duration_seconds` histogram (MET-03);
/// - `kubeproxy_sync_proxy_rules_last_timestamp_seconds` gauge;
/// - `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` gauge (MET-02);
/// - `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy}` gauge (MET-04);
/// - `kubeproxy_proxy_healthz_total{code}`, `kubeproxy_proxy_livez_total{code}` (MET-05);
/// - `kubeproxy_sync_proxy_rules_service_changes_total`,
///   `kubeproxy_sync_proxy_rules_endpoint_changes_total` counters;
/// - `xlb_watch_errors_total{resource}` (API watch errors, cf. MET-08);
/// - `xlb_workers_stalled` gauge: workers whose loop stands still
///   ([`crate::http::WorkerStallWatch`]);
/// - the `xlb_*` dataplane families of the [`DataplaneView`], if one is set.
pub struct ProxyMetrics {
    registry: Registry,
    sync_duration: Histogram,
    network_programming: Histogram,
    last_sync: Gauge<f64, AtomicU64>,
    last_queued: Gauge<f64, AtomicU64>,
    no_local: Family<Label1, Gauge>,
    healthz: Family<Label1, Counter>,
    livez: Family<Label1, Counter>,
    watch_errors: Family<[(&'static str, String); 1], Counter>,
    service_changes: Counter,
    endpoint_changes: Counter,
    workers_stalled: Gauge,
    view: SharedView,
}

impl fmt::Debug for ProxyMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyMetrics").finish_non_exhaustive()
    }
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProxyMetrics {
    /// A registry with every family registered (the series of MET-04 and MET-05 start at 0)
    /// and no dataplane view yet.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let sync_duration = Histogram::new(sync_buckets());
        let network_programming = Histogram::new(network_programming_buckets());
        let last_sync = Gauge::<f64, AtomicU64>::default();
        let last_queued = Gauge::<f64, AtomicU64>::default();
        let no_local = Family::<Label1, Gauge>::default();
        let healthz = Family::<Label1, Counter>::default();
        let livez = Family::<Label1, Counter>::default();
        let watch_errors = Family::<[(&'static str, String); 1], Counter>::default();
        let service_changes = Counter::default();
        let endpoint_changes = Counter::default();
        let workers_stalled = Gauge::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds: from taking a snapshot to publishing its tables.",
            sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In-cluster network programming latency in seconds: from a change (the EndpointSlice's last-change-trigger-time, else when xlb saw it) to its tables being published.",
            network_programming.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time tables were successfully published, in Unix seconds.",
            last_sync.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of the tables was queued by a change, in Unix seconds.",
            last_queued.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of Local-policy service ports with endpoints in the cluster but none on this node.",
            no_local.clone(),
        );
        registry.register("kubeproxy_proxy_healthz", "Answers of /healthz by HTTP code.", healthz.clone());
        registry.register("kubeproxy_proxy_livez", "Answers of /livez by HTTP code.", livez.clone());
        registry.register("xlb_watch_errors", "Kubernetes watch errors by resource.", watch_errors.clone());
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes: Service add, update and delete events after the initial list (a config file reload: Services added, changed or removed).",
            service_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes: EndpointSlice add, update and delete events after the initial list (a config file reload: EndpointSlices added, changed or removed).",
            endpoint_changes.clone(),
        );
        registry.register(
            "xlb_workers_stalled",
            "Workers whose loop has stood still for 5 s or more (their heartbeat did not move); /livez and /healthz answer 503 meanwhile.",
            workers_stalled.clone(),
        );
        let view: SharedView = Arc::new(RwLock::new(None));
        registry.register_collector(Box::new(DataplaneCollector { view: view.clone() }));
        for p in ["internal", "external"] {
            let _ = no_local.get_or_create(&[("traffic_policy", p)]);
        }
        for c in ["200", "503"] {
            let _ = healthz.get_or_create(&[("code", c)]);
            let _ = livez.get_or_create(&[("code", c)]);
        }
        for r in WATCHED_RESOURCES {
            let _ = watch_errors.get_or_create(&[("resource", (*r).to_owned())]);
        }
        Self {
            registry,
            sync_duration,
            network_programming,
            last_sync,
            last_queued,
            no_local,
            healthz,
            livez,
            watch_errors,
            service_changes,
            endpoint_changes,
            workers_stalled,
            view,
        }
    }

    /// Sets (or replaces) the dataplane view read at each scrape.
    pub fn set_dataplane(&self, view: Arc<dyn DataplaneView>) {
        *self.view.write().unwrap_or_else(PoisonError::into_inner) = Some(view);
    }

    /// Observes one sync's duration.
    pub fn observe_sync(&self, d: Duration) {
        self.sync_duration.observe(d.as_secs_f64());
    }

    /// Observes one change's network programming latency.
    pub fn observe_network_programming(&self, d: Duration) {
        self.network_programming.observe(d.as_secs_f64());
    }

    /// Sets how many workers stand still ([`crate::http::ProxyHealth::set_stalled_workers`]).
    pub fn set_workers_stalled(&self, n: usize) {
        self.workers_stalled.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets the last successful sync time.
    pub fn set_last_sync(&self, t: SystemTime) {
        self.last_sync.set(unix_seconds(t));
    }

    /// Sets the last queued change time.
    pub fn set_last_queued(&self, t: SystemTime) {
        self.last_queued.set(unix_seconds(t));
    }

    /// Sets the MET-04 gauges from a translation report's counts.
    pub fn set_no_local_endpoints(&self, n: NoLocalEndpoints) {
        let g = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
        self.no_local.get_or_create(&[("traffic_policy", "internal")]).set(g(n.internal));
        self.no_local.get_or_create(&[("traffic_policy", "external")]).set(g(n.external));
    }

    /// Counts one `/healthz` answer (200 or 503).
    pub fn count_healthz(&self, code: u16) {
        self.healthz.get_or_create(&[("code", if code == 200 { "200" } else { "503" })]).inc();
    }

    /// Counts one `/livez` answer (200 or 503).
    pub fn count_livez(&self, code: u16) {
        self.livez.get_or_create(&[("code", if code == 200 { "200" } else { "503" })]).inc();
    }

    /// Counts one watch error of `resource` (`services`, `endpointslices`, `nodes`).
    pub fn count_watch_error(&self, resource: &'static str) {
        self.watch_errors.get_or_create(&[("resource", resource.to_owned())]).inc();
    }

    /// Counts `n` Service changes (`kubeproxy_sync_proxy_rules_service_changes_total`).
    pub fn count_service_changes(&self, n: u64) {
        self.service_changes.inc_by(n);
    }

    /// Counts `n` EndpointSlice changes (`kubeproxy_sync_proxy_rules_endpoint_changes_total`).
    pub fn count_endpoint_changes(&self, n: u64) {
        self.endpoint_changes.inc_by(n);
    }

    /// The whole exposition, OpenMetrics text ([`OPENMETRICS_CONTENT_TYPE`]).
    ///
    /// # Errors
    /// Only if a label value cannot be written (not expected).
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// The whole exposition in the Prometheus text format 0.0.4
    /// ([`PROMETHEUS_CONTENT_TYPE`]), as kube-proxy serves it: [`encode`](Self::encode)'s
    /// output with counters' `# HELP`/`# TYPE` lines named with their `_total` suffix, and
    /// without the `# UNIT` and `# EOF` lines.
    ///
    /// # Errors
    /// As [`encode`](Self::encode).
    pub fn encode_prometheus(&self) -> Result<String, fmt::Error> {
        Ok(openmetrics_to_prometheus(&self.encode()?))
    }
}

/// Converts OpenMetrics text as prometheus-client writes it to the Prometheus text format
/// 0.0.4 (see [`ProxyMetrics::encode_prometheus`]).
pub fn openmetrics_to_prometheus(om: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        om.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(om.len());
    for l in om.lines() {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| l.strip_prefix(p).map(|rest| (p, rest)));
        if let Some((prefix, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str("_total ");
                out.push_str(tail);
                out.push('\n');
                continue;
            }
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_kube_proxy() {
        let b = network_programming_buckets();
        assert_eq!(b.len(), 2 + 59 + 12 + 7);
        assert_eq!(&b[..3], &[0.25, 0.5, 1.0]);
        assert_eq!(b[60], 59.0);
        assert_eq!(b[61], 60.0);
        assert_eq!(b[72], 115.0);
        assert_eq!(b[73], 120.0);
        assert_eq!(b[79], 300.0);
        let s: Vec<f64> = sync_buckets().collect();
        assert_eq!(s.len(), 15);
        assert!((s[14] - 16.384).abs() < 1e-9);
    }

    #[test]
    fn counters_view_counts_endpoints_by_state_and_exports_weights() {
        use dataplane::tables::{
            BackendSpec, Conditions, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, Scheduler,
            ServiceSpec, TableBuilder, TablesSpec,
        };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let mut heavy = BackendSpec::ready(ip("10.0.0.2"), 80);
        heavy.weight = 3;
        let mut draining = BackendSpec::ready(ip("10.0.0.3"), 80);
        draining.eligible = false;
        draining.conditions = Conditions { ready: false, serving: true, terminating: true };
        let spec = TablesSpec {
            services: vec![Arc::new(ServiceSpec {
                name: "default/web:http".into(),
                frontends: vec![Frontend::new(ip("10.96.0.1"), L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
                scheduler: Scheduler::Random,
                affinity_timeout_s: None,
                mode: ForwardingMode::Nat,
                when_empty: EmptyAction::Reject,
                backends: vec![BackendSpec::ready(ip("10.0.0.1"), 80), heavy, draining],
            })],
            ..TablesSpec::default()
        };
        let tables = TableBuilder::new().build(&spec).unwrap();
        let view = CountersView::new(TablesHandle::new(tables), vec![(0, Arc::new(WorkerCounters::new(4, 4)))]);
        let s = view.services();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].endpoints, EndpointCounts { total: 3, ready: 2, serving: 3, terminating: 1, eligible: 2 });
        let mut weights: Vec<(String, u64)> = view.backends().into_iter().map(|b| (b.backend, b.weight)).collect();
        weights.sort();
        assert_eq!(
            weights,
            [("10.0.0.1:80".to_owned(), 1), ("10.0.0.2:80".to_owned(), 3), ("10.0.0.3:80".to_owned(), 0)]
        );
        let m = ProxyMetrics::new();
        m.set_dataplane(Arc::new(view));
        let text = m.encode().unwrap();
        for line in [
            "xlb_service_endpoints{service=\"default/web:http\",state=\"serving\"} 3",
            "xlb_service_endpoints{service=\"default/web:http\",state=\"ready\"} 2",
            "xlb_backend_weight{service=\"default/web:http\",backend=\"10.0.0.2:80\"} 3",
            "xlb_backend_weight{service=\"default/web:http\",backend=\"10.0.0.3:80\"} 0",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn counters_view_reads_worker_counters() {
        let c = WorkerCounters::new(4, 4);
        c.rx.add(5);
        c.add_bytes(ByteCounter::Rx, 370);
        c.add_bytes(ByteCounter::Tx, 296);
        c.add_drop_bytes(DropReason::NoNeighbour, 74);
        c.count_drop(DropReason::NoNeighbour);
        c.event(Event::ConntrackEvicted);
        let s = WorkerStats::from_counters(3, &c);
        assert_eq!(s.worker, 3);
        assert_eq!(s.rx_packets, 5);
        assert_eq!(s.conntrack_evictions, 1);
        assert!(s.drops.contains(&("no_neighbour", 1)));
        assert_eq!(s.drops.len(), DropReason::ALL.len());
        let x = XskCounters::default();
        x.counter(XskCounter::TxRingFull).add(2);
        x.counter(XskCounter::UmemFrames).set(4096);
        x.counter(XskCounter::SocketRxRingFull).set(17);
        let ifs = InterfaceStatsCell::default();
        let view = CountersView::new(TablesHandle::default(), vec![(3, Arc::new(c))])
            .with_xsk(vec![(3, Arc::new(x))])
            .with_interfaces(ifs.clone());
        assert!(view.services().is_empty());
        *ifs.write().unwrap() = vec![InterfaceStats {
            interface: "eth0".into(),
            redirected: 9,
            passed: 8,
            redirect_failed: 0,
            parse_errors: 1,
            l2_replied: 4,
            l2_dropped: 2,
            l2_other_host: 3,
        }];
        let m = ProxyMetrics::new();
        m.set_dataplane(Arc::new(view));
        let text = m.encode().unwrap();
        assert!(text.contains("xlb_worker_rx_packets_total{worker=\"3\"} 5"), "{text}");
        assert!(text.contains("xlb_drops_total{worker=\"3\",reason=\"no_neighbour\"} 1"), "{text}");
        assert!(text.contains("xlb_worker_rx_bytes_total{worker=\"3\"} 370"), "{text}");
        assert!(text.contains("xlb_worker_tx_bytes_total{worker=\"3\"} 296"), "{text}");
        assert!(text.contains("xlb_worker_pass_bytes_total{worker=\"3\"} 0"), "{text}");
        assert!(text.contains("xlb_worker_handed_off_bytes_total{worker=\"3\"} 0"), "{text}");
        assert!(text.contains("xlb_drop_bytes_total{worker=\"3\",reason=\"no_neighbour\"} 74"), "{text}");
        assert!(text.contains("xlb_drop_bytes_total{worker=\"3\",reason=\"ttl_exceeded\"} 0"), "{text}");
        assert!(text.contains("xlb_xsk_tx_ring_full_total{worker=\"3\"} 2"), "{text}");
        assert!(text.contains("xlb_xsk_umem_frames{worker=\"3\"} 4096"), "{text}");
        assert!(text.contains("xlb_xsk_socket_rx_ring_full_total{worker=\"3\"} 17"), "{text}");
        assert!(text.contains("xlb_steering_packets_total{interface=\"eth0\",action=\"redirected\"} 9"), "{text}");
        assert!(text.contains("xlb_steering_packets_total{interface=\"eth0\",action=\"parse_error\"} 1"), "{text}");
        assert!(text.contains("xlb_steering_packets_total{interface=\"eth0\",action=\"l2_replied\"} 4"), "{text}");
        assert!(text.contains("xlb_steering_packets_total{interface=\"eth0\",action=\"l2_dropped\"} 2"), "{text}");
        assert!(text.contains("xlb_steering_packets_total{interface=\"eth0\",action=\"l2_other_host\"} 3"), "{text}");
        assert!(text.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 0"), "{text}");
        assert!(text.contains("\nxlb_workers_stalled 0\n"), "{text}");
        m.set_workers_stalled(2);
        assert!(m.encode().unwrap().contains("\nxlb_workers_stalled 2\n"));
        let classic = m.encode_prometheus().unwrap();
        assert!(classic.contains("# TYPE xlb_worker_rx_packets_total counter\n"), "{classic}");
        assert!(classic.contains("# HELP xlb_worker_rx_packets_total Frames received"), "{classic}");
        // Every declared AF_XDP counter is exported, with its declared help and type.
        for c in XskCounter::ALL {
            let ty = if c.kind() == Kind::Counter { "counter" } else { "gauge" };
            let name = format!("xlb_xsk_{}{}", c.name(), if ty == "counter" { "_total" } else { "" });
            assert!(classic.contains(&format!("# TYPE {name} {ty}\n")), "{name}: {classic}");
            assert!(classic.contains(&format!("# HELP {name} {}", c.help())), "{name}: {classic}");
        }
        // Every declared byte counter is exported, with its declared help.
        for b in ByteCounter::ALL {
            let name = format!("xlb_worker_{}_bytes_total", b.name());
            assert!(classic.contains(&format!("# TYPE {name} counter\n")), "{name}: {classic}");
            assert!(classic.contains(&format!("# HELP {name} {}", b.help())), "{name}: {classic}");
        }
        assert!(classic.contains(&format!("# HELP xlb_drop_bytes_total {DROP_BYTES_HELP}")), "{classic}");
        assert!(classic.contains("# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge\n"), "{classic}");
        assert!(classic.contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n"), "{classic}");
        assert!(!classic.contains("# EOF"), "{classic}");
    }
}
