//! The control-plane scale benchmark: full table builds from Kubernetes objects, the
//! one-EndpointSlice-change path, and kube-proxy's nftables mode loading the equivalent
//! ruleset into a scratch namespace.
//!
//! Memory is measured with the counting global allocator of [`crate::alloc_count`] (heap
//! bytes allocated and still live), when the binary installs it; `VmHWM` from
//! `/proc/self/status` is reported too, for the whole process.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::sync::Arc;

use dataplane::tables::{BuildError, TableBuilder, Tables, TablesHandle, TablesSpec};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use xlb::cluster::{Changes, ClusterIndex, ClusterState, ServiceRef, object_order};
use xlb::config::Config;
use xlb::translate::{TranslateError, TranslateReport, Translator, UpdateStats};

use crate::alloc_count;
use crate::netns::{self, NetnsError, ScratchNs};
use crate::nft;
use crate::synth::{self, Profile, Rng};

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The xlb configuration document did not load.
    #[error("benchmark configuration: {0}")]
    Config(#[from] xlb::file_source::LoadError),
    /// `build_spec` refused the configuration.
    #[error(transparent)]
    Translate(#[from] TranslateError),
    /// `TableBuilder::build` refused the spec.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The synthetic objects did not translate cleanly (a bug in [`crate::synth`]).
    #[error("translation reported errors: {0}")]
    Report(String),
    /// A synthetic cluster did not give what a figure needs (a bug in [`crate::synth`]).
    #[error("synthetic cluster: {0}")]
    Synth(String),
    /// The kube-proxy model refused the spec.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// A scratch namespace or `nft` failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Writing a ruleset file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The xlb scheduler a run uses (`ipvs.scheduler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerVariant {
    /// The default (`random`, kube-proxy's behaviour): no per-service tables to build.
    Default,
    /// Maglev (`mh`): one lookup table per service, the expensive part of a build.
    Maglev,
}

impl SchedulerVariant {
    /// Short name used in metric names: `default` or `mh`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Maglev => "mh",
        }
    }
}

/// The xlb configuration of a run: a minimal `XlbConfiguration` document, with `ipvs.scheduler:
/// mh` for [`SchedulerVariant::Maglev`].
///
/// # Errors
/// [`BenchError::Config`] if the document does not load (a bug).
pub fn config(s: SchedulerVariant) -> Result<Config, BenchError> {
    let mut yaml = String::from(
        "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\nnodeName: node-0\nnodeAddresses: [192.168.0.10]\n",
    );
    if s == SchedulerVariant::Maglev {
        yaml.push_str("ipvs: {scheduler: mh}\n");
    }
    Ok(xlb::file_source::load_str(&yaml, "xlb-cpbench")?.config)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Cluster sizes.
    pub profiles: Vec<Profile>,
    /// Scheduler variants.
    pub schedulers: Vec<SchedulerVariant>,
    /// Full builds per profile and scheduler (at least 5 for min/median/max to mean much).
    pub repeats: usize,
    /// One-change samples per profile, for each scheduler of `change_schedulers`.
    pub change_samples: usize,
    /// Scheduler variants whose change path is timed.
    pub change_schedulers: Vec<SchedulerVariant>,
    /// Whether to time kube-proxy's nftables ruleset in a scratch namespace.
    pub nft: bool,
    /// `nft -f` repeats (full load and one-service update each).
    pub nft_repeats: usize,
    /// The nft comparison runs on the profile with its Service count divided by this (1 =
    /// full scale). A full-scale load of profile A takes minutes on a 6.x kernel: the time
    /// grows faster than linearly with the ruleset.
    pub nft_scale_divisor: usize,
    /// PRNG seed for the changes.
    pub seed: u64,
}

impl Options {
    /// The default run: profiles A and B, both schedulers, 5 full builds, 200 changes, 3 nft
    /// loads at 1/10 scale.
    pub fn full() -> Self {
        Self {
            profiles: vec![synth::PROFILE_A, synth::PROFILE_B],
            schedulers: vec![SchedulerVariant::Maglev, SchedulerVariant::Default],
            repeats: 5,
            change_samples: 200,
            change_schedulers: vec![SchedulerVariant::Maglev, SchedulerVariant::Default],
            nft: true,
            nft_repeats: 3,
            nft_scale_divisor: 10,
            seed: 1,
        }
    }

    /// `--quick`: 200 Services × 10 endpoints, every measurement, nft at full scale.
    pub fn quick() -> Self {
        Self { profiles: vec![synth::PROFILE_QUICK], nft_scale_divisor: 1, ..Self::full() }
    }
}

/// One `NAME VALUE UNIT` figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Dotted name, e.g. `A.mh.full_build.total.median`.
    pub name: String,
    /// Value.
    pub value: f64,
    /// Unit: `ms`, `bytes`, `count`.
    pub unit: &'static str,
}

/// What the last full build of a profile and scheduler produced, read from the built
/// [`Tables`] (for sanity checks; timings say nothing about correctness).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildCheck {
    /// Profile name.
    pub profile: &'static str,
    /// Scheduler variant.
    pub scheduler: SchedulerVariant,
    /// `Tables::services.len()`.
    pub services: usize,
    /// Occupied backend slots.
    pub backends: usize,
    /// Sum of `Service::eligible` lengths.
    pub eligible: usize,
    /// Services with a Maglev table.
    pub maglev_tables: usize,
    /// `Tables::vips.len()`.
    pub vips: usize,
    /// After the change samples (`None` when none ran for this scheduler), whether the last
    /// changed Service's new address is a member of its service in the published tables and
    /// the replaced one is gone.
    pub last_change_published: Option<bool>,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Figures in the order measured.
    pub metrics: Vec<Metric>,
    /// Remarks (skipped parts, methods).
    pub notes: Vec<String>,
    /// Sanity data per profile and scheduler.
    pub checks: Vec<BuildCheck>,
}

impl Report {
    fn push(&mut self, name: String, value: f64, unit: &'static str) {
        self.metrics.push(Metric { name, value, unit });
    }

    fn push_ms_summary(&mut self, name: &str, d: &[Duration]) {
        let s = summary(d);
        self.push(format!("{name}.min"), s.min, "ms");
        self.push(format!("{name}.median"), s.median, "ms");
        self.push(format!("{name}.max"), s.max, "ms");
    }

    /// `NAME VALUE UNIT` lines.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for m in &self.metrics {
            let _ = writeln!(s, "{} {} {}", m.name, fmt_value(m.value, m.unit), m.unit);
        }
        for n in &self.notes {
            let _ = writeln!(s, "# {n}");
        }
        s
    }

    /// The JSON object: `{"metrics": {NAME: {"value": V, "unit": U}}, "notes": [...]}`.
    pub fn json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for x in &self.metrics {
            m.insert(x.name.clone(), serde_json::json!({ "value": x.value, "unit": x.unit }));
        }
        serde_json::json!({ "metrics": m, "notes": self.notes })
    }

    /// The value of metric `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|m| m.name == name).map(|m| m.value)
    }
}

fn fmt_value(v: f64, unit: &str) -> String {
    if unit == "ms" { format!("{v:.3}") } else { format!("{v:.0}") }
}

/// min / median / max in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Smallest.
    pub min: f64,
    /// Median (lower middle for an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// min / median / max of `d` in milliseconds (zeros for an empty slice).
pub fn summary(d: &[Duration]) -> Summary {
    let mut v: Vec<f64> = d.iter().copied().map(ms).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return Summary { min: 0.0, median: 0.0, max: 0.0 };
    }
    Summary { min: v[0], median: v[(v.len() - 1) / 2], max: v[v.len() - 1] }
}

/// Nearest-rank percentile `p` (0..=100) of `d` in milliseconds.
pub fn percentile(d: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = d.iter().copied().map(ms).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "sample counts are small; the rank is clamped to the slice"
    )]
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn vm_hwm_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn check_report(report: &TranslateReport) -> Result<(), BenchError> {
    if report.has_errors() {
        let first: Vec<String> = report.issues.iter().take(3).map(ToString::to_string).collect();
        return Err(BenchError::Report(first.join("; ")));
    }
    Ok(())
}

fn translate(state: &ClusterState, cfg: &Config) -> Result<(TablesSpec, TranslateReport), BenchError> {
    let (spec, report) = xlb::translate::build_spec(state, cfg)?;
    check_report(&report)?;
    Ok((spec, report))
}

/// The control thread's rebuild path after a change, as `xlb run` takes it in Kubernetes mode:
/// the watch event's object goes into the source's [`ClusterIndex`] (which names the touched
/// Services), [`Translator::update`] translates and assembles only those, the long-lived
/// [`TableBuilder`] builds from the translator's spec (no copy), publish.
#[derive(Debug)]
pub struct ChangePath {
    index: ClusterIndex,
    local: Vec<IpAddr>,
    translator: Translator,
    builder: TableBuilder,
    handle: TablesHandle,
    stats: UpdateStats,
}

/// How long the steps of one [`ChangePath`] change took.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChangeTimes {
    /// [`Translator::update`] alone.
    pub translate: Duration,
    /// From the watch event's objects to the published tables (index, translate, build,
    /// publish).
    pub total: Duration,
}

/// One watch event for [`ChangePath::apply`].
#[derive(Debug, Clone)]
pub enum Event {
    /// A Service was added or changed.
    Service(Arc<Service>),
    /// A Service was deleted.
    ServiceDeleted(ServiceRef),
    /// An EndpointSlice was added or changed.
    Slice(Arc<EndpointSlice>),
    /// The EndpointSlice (namespace, name) was deleted.
    SliceDeleted(String, String),
}

impl ChangePath {
    /// Builds and publishes the first tables from `state` (a full update).
    ///
    /// # Errors
    /// [`BenchError`] if translation or the build fails.
    pub fn new(state: &ClusterState, cfg: &Config) -> Result<Self, BenchError> {
        let mut p = Self {
            index: ClusterIndex::from_state(state),
            local: state.local_addresses.clone(),
            translator: Translator::new(),
            builder: TableBuilder::new(),
            handle: TablesHandle::default(),
            stats: UpdateStats::default(),
        };
        p.publish(&Changes::Full, cfg)?;
        Ok(p)
    }

    /// Applies the watch events of one sync (coalesced) to the index, as the Kubernetes
    /// source does, then translates, builds and publishes.
    ///
    /// # Errors
    /// [`BenchError`] if translation or the build fails, or the translation reports errors.
    pub fn apply(&mut self, events: Vec<Event>, cfg: &Config) -> Result<ChangeTimes, BenchError> {
        let t0 = Instant::now();
        let mut changes = Changes::default();
        for e in events {
            match e {
                Event::Service(s) => changes.add(self.index.set_service(s)),
                Event::ServiceDeleted(r) => {
                    self.index.remove_service(&r);
                    changes.add(r);
                }
                Event::Slice(s) => self.index.set_slice(s).into_iter().for_each(|r| changes.add(r)),
                Event::SliceDeleted(ns, name) => {
                    if let Some(r) = self.index.remove_slice(&ns, &name) {
                        changes.add(r);
                    }
                }
            }
        }
        let translate = self.publish(&changes, cfg)?;
        Ok(ChangeTimes { translate, total: t0.elapsed() })
    }

    /// [`ChangePath::apply`] without the table build and publish: the index and
    /// `Translator::update` alone; returns the update's time. The published tables fall behind
    /// (the next [`ChangePath::apply`] builds the difference).
    ///
    /// # Errors
    /// [`BenchError`] if translation fails.
    pub fn translate_only(&mut self, events: Vec<Event>, cfg: &Config) -> Result<Duration, BenchError> {
        let mut changes = Changes::default();
        for e in events {
            if let Event::Slice(s) = e {
                self.index.set_slice(s).into_iter().for_each(|r| changes.add(r));
            }
        }
        let t = Instant::now();
        self.stats = self.translator.update(&self.index, &self.local, &changes, cfg)?;
        Ok(t.elapsed())
    }

    /// `Translator::update` + build + publish; returns the update's time.
    fn publish(&mut self, changes: &Changes, cfg: &Config) -> Result<Duration, BenchError> {
        let t = Instant::now();
        self.stats = self.translator.update(&self.index, &self.local, changes, cfg)?;
        let translate = t.elapsed();
        if self.translator.report().has_errors() {
            check_report(&self.translator.report())?;
        }
        let tables = self.builder.build(self.translator.spec())?;
        self.handle.publish(tables);
        Ok(translate)
    }

    /// What the last update did.
    pub fn update_stats(&self) -> UpdateStats {
        self.stats
    }

    /// The published tables.
    pub fn tables(&self) -> std::sync::Arc<Tables> {
        self.handle.load()
    }
}

fn check_of(p: Profile, s: SchedulerVariant, t: &Tables) -> BuildCheck {
    BuildCheck {
        profile: p.name,
        scheduler: s,
        services: t.services.len(),
        backends: t.backends.iter().flatten().count(),
        eligible: t.services.iter().map(|s| s.eligible.len()).sum(),
        maglev_tables: t.services.iter().filter(|s| s.maglev.is_some()).count(),
        vips: t.vips.len(),
        last_change_published: None,
    }
}

/// Full builds from objects: a new [`Translator`]'s build (kept until after the timing, as
/// `xlb run` keeps its own) + `TableBuilder::build` (fresh builder, as at start-up; translation and Maglev tables on `available_parallelism` threads) +
/// `TablesHandle::publish`, `repeats` times with the allocator's counting off; each repeat
/// also translates with a one-thread `Translator` and builds with a one-thread builder
/// (`translate_serial`, `build_serial`, `total_serial`), so serial and parallel are compared
/// within one run, and checks that both made the same spec and the same Maglev tables. Then one more, untimed, inside [`alloc_count::count`] for the
/// memory figures.
fn full_builds(
    r: &mut Report,
    p: Profile,
    s: SchedulerVariant,
    state: &ClusterState,
    cfg: &Config,
    repeats: usize,
) -> Result<BuildCheck, BenchError> {
    let prefix = format!("{}.{}.full_build", p.name, s.name());
    let (mut t_spec, mut t_build, mut t_publish, mut t_total) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut t_spec_serial, mut t_build_serial, mut t_total_serial) = (Vec::new(), Vec::new(), Vec::new());
    let mut check = None;
    let mut threads = 0;
    for _ in 0..repeats.max(1) {
        // As `xlb run`'s first build: a new Translator and TableBuilder, both kept afterwards
        // (dropped after the timing; `build_spec` would also time the drop of its translator's
        // cache, which `xlb run` never pays on its way to publishing).
        let t0 = Instant::now();
        let mut kept = Translator::new();
        let (spec, report) = kept.build(state, cfg)?;
        check_report(&report)?;
        let t1 = Instant::now();
        let mut builder = TableBuilder::new();
        let tables = builder.build(&spec)?;
        let t2 = Instant::now();
        let handle = TablesHandle::default();
        handle.publish(tables);
        let t3 = Instant::now();
        drop(kept);
        t_spec.push(t1 - t0);
        t_build.push(t2 - t1);
        t_publish.push(t3 - t2);
        t_total.push(t3 - t0);
        threads = builder.maglev_stats().threads;
        let mut translator = Translator::new();
        translator.set_threads(1);
        let t4 = Instant::now();
        let (serial_spec, report) = translator.build(state, cfg)?;
        let t5 = Instant::now();
        check_report(&report)?;
        if serial_spec != spec {
            return Err(BenchError::Report("the one-thread translation differs from the parallel one".into()));
        }
        let mut serial = TableBuilder::new();
        serial.set_build_threads(1);
        let t6 = Instant::now();
        let serial_tables = serial.build(&serial_spec)?;
        let t7 = Instant::now();
        t_spec_serial.push(t5 - t4);
        t_build_serial.push(t7 - t6);
        t_total_serial.push(t5 - t4 + (t7 - t6) + (t3 - t2));
        let parallel_tables = handle.load();
        let sums = |t: &Tables| t.services.iter().map(|s| s.maglev.as_ref().map(|m| m.checksum())).collect::<Vec<_>>();
        if sums(&serial_tables) != sums(&parallel_tables) {
            return Err(BenchError::Report(
                "the one-thread build made other Maglev tables than the parallel one".into(),
            ));
        }
        check = Some(check_of(p, s, &parallel_tables));
    }
    r.push(format!("{prefix}.maglev_threads"), threads as f64, "count");
    if alloc_count::active() {
        let (spec_bytes, tables_bytes, builder_bytes) = alloc_count::count(|live| {
            let live0 = live();
            let (spec, _) = translate(state, cfg)?;
            let live_spec = live();
            let mut builder = TableBuilder::new();
            let handle = TablesHandle::default();
            handle.publish(builder.build(&spec)?);
            let live_built = live();
            drop(builder);
            let live_tables = live();
            let out = (live_spec - live0, live_tables - live_spec, live_built - live_tables);
            drop((spec, handle));
            Ok::<_, BenchError>(out)
        })?;
        r.push(format!("{prefix}.memory.spec_bytes"), spec_bytes as f64, "bytes");
        r.push(format!("{prefix}.memory.tables_bytes"), tables_bytes as f64, "bytes");
        r.push(format!("{prefix}.memory.builder_bytes"), builder_bytes as f64, "bytes");
    }
    r.push_ms_summary(&format!("{prefix}.translate"), &t_spec);
    r.push_ms_summary(&format!("{prefix}.translate_serial"), &t_spec_serial);
    r.push_ms_summary(&format!("{prefix}.build"), &t_build);
    r.push_ms_summary(&format!("{prefix}.build_serial"), &t_build_serial);
    r.push_ms_summary(&format!("{prefix}.publish"), &t_publish);
    r.push_ms_summary(&format!("{prefix}.total"), &t_total);
    r.push_ms_summary(&format!("{prefix}.total_serial"), &t_total_serial);
    check.ok_or_else(|| BenchError::Report("no build ran".into()))
}

/// `samples` one-endpoint changes, each rebuilt and published through [`ChangePath`]
/// (`change.*`, and `change.translate.*` for `Translator::update` alone); then `samples`
/// times one Service (with its slices) added and removed again (`add_service.*`,
/// `remove_service.*`); and, with the counting allocator, the heap bytes two consecutive
/// published tables keep alive beyond one (`two_snapshots.memory_bytes`).
fn changes(
    r: &mut Report,
    p: Profile,
    s: SchedulerVariant,
    state: &ClusterState,
    cfg: &Config,
    samples: usize,
    seed: u64,
) -> Result<bool, BenchError> {
    let mut state = state.clone();
    let mut path = ChangePath::new(&state, cfg)?;
    let mut rng = Rng::new(seed);
    let (mut times, mut translate) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    let mut last = None;
    for k in 0..samples {
        let ch = synth::change_one_endpoint(&mut state, p, &mut rng, k);
        let Some(slice) = state.endpoint_slices.get(ch.slice_index).cloned() else {
            return Err(BenchError::Report("the changed slice is not in the state".into()));
        };
        let t = path.apply(vec![Event::Slice(slice)], cfg)?;
        times.push(t.total);
        translate.push(t.translate);
        let st = path.update_stats();
        if st.full || st.translated != 1 || st.assembled != 1 {
            return Err(BenchError::Report(format!(
                "one changed slice made the translator do {st:?} (expected one Service translated and assembled)"
            )));
        }
        last = Some(ch);
    }
    let prefix = format!("{}.{}.change", p.name, s.name());
    r.push(format!("{prefix}.p50"), percentile(&times, 50.0), "ms");
    r.push(format!("{prefix}.p99"), percentile(&times, 99.0), "ms");
    r.push(format!("{prefix}.max"), percentile(&times, 100.0), "ms");
    r.push(format!("{prefix}.samples"), times.len() as f64, "count");
    r.push(format!("{prefix}.translate.p50"), percentile(&translate, 50.0), "ms");
    r.push(format!("{prefix}.translate.p99"), percentile(&translate, 99.0), "ms");

    // One Service added with its slices (one sync), then removed again.
    let (mut adds, mut removes) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for k in 0..samples {
        let i = p.services + k;
        let svc = Arc::new(synth::service(i));
        let slices: Vec<Arc<EndpointSlice>> =
            synth::slices(i, p.endpoints, i * p.endpoints).into_iter().map(Arc::new).collect();
        let mut events = vec![Event::Service(Arc::clone(&svc))];
        events.extend(slices.iter().map(|sl| Event::Slice(Arc::clone(sl))));
        adds.push(path.apply(events, cfg)?.total);
        let added = path.update_stats();
        let r_svc = ServiceRef::of_service(&svc);
        let mut events = vec![Event::ServiceDeleted(r_svc.clone())];
        events.extend(slices.iter().map(|sl| {
            let (ns, name) = object_order(&sl.metadata);
            Event::SliceDeleted(ns.to_owned(), name.to_owned())
        }));
        removes.push(path.apply(events, cfg)?.total);
        let removed = path.update_stats();
        if added.full || added.translated != 1 || removed.full || removed.removed != 1 {
            return Err(BenchError::Report(format!(
                "adding and removing {r_svc} made the translator do {added:?} and {removed:?}"
            )));
        }
    }
    for (name, d) in [("add_service", &adds), ("remove_service", &removes)] {
        r.push(format!("{}.{}.{name}.p50", p.name, s.name()), percentile(d, 50.0), "ms");
        r.push(format!("{}.{}.{name}.p99", p.name, s.name()), percentile(d, 99.0), "ms");
    }

    let Some(ch) = last else { return Ok(false) };
    let t = path.tables();
    let svc_name = format!("{}:http", ch.service_name);
    let Some(svc) = t.services.iter().find(|x| &*x.name == svc_name.as_str()) else { return Ok(false) };
    let addrs: Vec<IpAddr> = svc.members.iter().filter_map(|m| t.backend(*m)).map(|b| b.addr).collect();
    let new_in = addrs.contains(&IpAddr::V4(ch.new_addr));
    let old_out = ch.old_addr.and_then(|o| o.parse::<IpAddr>().ok()).is_some_and(|o| !addrs.contains(&o));
    drop(t);

    if alloc_count::active() {
        // Live heap with one published snapshot, then with it kept alive while one endpoint
        // change publishes the next: what a reader still holding the old tables costs.
        let ch = synth::change_one_endpoint(&mut state, p, &mut rng, samples);
        let slice = state.endpoint_slices.get(ch.slice_index).cloned();
        let bytes = alloc_count::count(|live| {
            let one = live();
            let old = path.tables();
            let applied = slice.map(|sl| path.apply(vec![Event::Slice(sl)], cfg)).transpose();
            let both = live();
            drop(old);
            applied.map(|_| both - one)
        })?;
        r.push(format!("{}.{}.two_snapshots.memory_bytes", p.name, s.name()), bytes as f64, "bytes");
    }

    // Translator::update with no table build in between: `change.translate` above includes
    // the allocator's deferred work left by the builder's frees (glibc consolidates its free
    // lists in the next allocations), which this leaves out.
    // The first update after the last build absorbs that deferred work and is not counted.
    let mut alone = Vec::with_capacity(samples);
    for k in 0..=samples {
        let ch = synth::change_one_endpoint(&mut state, p, &mut rng, samples + 1 + k);
        if let Some(sl) = state.endpoint_slices.get(ch.slice_index).cloned() {
            let d = path.translate_only(vec![Event::Slice(sl)], cfg)?;
            if k > 0 {
                alone.push(d);
            }
        }
    }
    r.push(format!("{prefix}.translate_alone.p50"), percentile(&alone, 50.0), "ms");
    r.push(format!("{prefix}.translate_alone.p99"), percentile(&alone, 99.0), "ms");
    Ok(new_in && old_out)
}

/// What the Kubernetes source did before every sync until it kept its objects indexed (and
/// what [`xlb::k8s::Snapshot::state`] still does): take the watch caches' objects (shared
/// `Arc`s, no copy) and sort them by (namespace, name). Not part of the `change.*` figures.
fn snapshot_copies(state: &ClusterState, repeats: usize) -> Vec<Duration> {
    (0..repeats)
        .map(|_| {
            let t = Instant::now();
            let mut copy = state.clone();
            copy.services.sort_by(|a, b| object_order(&a.metadata).cmp(&object_order(&b.metadata)));
            copy.endpoint_slices.sort_by(|a, b| object_order(&a.metadata).cmp(&object_order(&b.metadata)));
            let d = t.elapsed();
            drop(std::hint::black_box(copy));
            d
        })
        .collect()
}

/// What the Kubernetes source does for a full snapshot (the first, a relist, the periodic
/// resync) since it keeps its objects indexed: index every object. A snapshot after a change
/// updates only the changed objects' entries (part of the `change.*` figures).
fn snapshot_indexes(state: &ClusterState, repeats: usize) -> Vec<Duration> {
    (0..repeats)
        .map(|_| {
            let t = Instant::now();
            let ix = ClusterIndex::from_state(state);
            let d = t.elapsed();
            drop(std::hint::black_box(ix));
            d
        })
        .collect()
}

/// What `xlb run` computes after each publish besides the tables, from the flat state (as
/// before the index) and from the index: the VIPs to announce (`announce::announced`, with
/// `announce.mode` other than none) and the health-check Services (`health_check_services`).
fn per_sync(r: &mut Report, p: Profile, state: &ClusterState, repeats: usize) -> Result<(), BenchError> {
    let cfg = config(SchedulerVariant::Default)?;
    let (spec, _) = translate(state, &cfg)?;
    let ix = ClusterIndex::from_state(state);
    let scope = xlb::announce::Scope::from_config(&cfg);
    let time = |f: &dyn Fn() -> usize| -> Vec<Duration> {
        (0..repeats)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed()
            })
            .collect()
    };
    let node = "node-0";
    let prefix = format!("{}.per_sync", p.name);
    r.push_ms_summary(
        &format!("{prefix}.announced_flat"),
        &time(&|| xlb::announce::announced(state, &spec, &scope).len()),
    );
    r.push_ms_summary(
        &format!("{prefix}.announced_indexed"),
        &time(&|| xlb::announce::announced_indexed(&ix, &spec, &scope).len()),
    );
    r.push_ms_summary(
        &format!("{prefix}.health_checks_flat"),
        &time(&|| xlb::k8s::health_check_services(state, node).len()),
    );
    r.push_ms_summary(
        &format!("{prefix}.health_checks_indexed"),
        &time(&|| xlb::k8s::health_check_services_indexed(&ix, node).len()),
    );
    // In L2 mode, after each publish: the nodes that may own each Local-policy VIP. Measured
    // with every Service made a LoadBalancer of `externalTrafficPolicy: Local` with an
    // ingress IP of its own (the synthetic Services are ClusterIPs, which it skips): the full
    // walk (`l2_local_nodes`: the first snapshot, a relist, a periodic resync), and
    // `xlb run`'s cache after one endpoint of one Service turned not ready or ready again
    // (`l2_local_nodes_one_change`).
    let mut lb = ClusterIndex::from_state(&synth::as_local_load_balancers(state));
    let mut cache = xlb::announce::l2::LocalNodesCache::default();
    cache.update(&lb, &xlb::cluster::Changes::Full, &scope);
    let slice = state.endpoint_slices.first().ok_or_else(|| BenchError::Synth("no EndpointSlice".into()))?;
    let mut one_change = Vec::with_capacity(repeats);
    for i in 0..repeats {
        let mut s = EndpointSlice::clone(slice);
        if let Some(c) = s.endpoints.first_mut().and_then(|e| e.conditions.as_mut()) {
            c.ready = Some(i % 2 == 1);
        }
        let mut changes = xlb::cluster::Changes::default();
        for r in lb.set_slice(Arc::new(s)) {
            changes.add(r);
        }
        let t = Instant::now();
        cache.update(&lb, &changes, &scope);
        one_change.push(t.elapsed());
    }
    if cache.nodes() != &xlb::announce::l2::local_nodes(&lb, &scope) {
        return Err(BenchError::Synth("l2 local_nodes: the cache's answer differs from a full walk".into()));
    }
    r.push_ms_summary(&format!("{prefix}.l2_local_nodes_one_change"), &one_change);
    let local = xlb::announce::l2::local_nodes(&lb, &scope);
    if local.len() != p.services {
        return Err(BenchError::Synth(format!(
            "l2 local_nodes: {} VIPs with nodes, {} Services",
            local.len(),
            p.services
        )));
    }
    r.push_ms_summary(
        &format!("{prefix}.l2_local_nodes"),
        &time(&|| xlb::announce::l2::local_nodes(&lb, &scope).len()),
    );
    Ok(())
}

fn write_file(path: &PathBuf, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Io { path: path.clone(), source })
}

/// kube-proxy nftables mode on the same Services: `nft -f` of the full ruleset into a fresh
/// scratch namespace, and of a one-Service partial-sync transaction on top of it.
fn nft_side(r: &mut Report, p: Profile, state: &ClusterState, repeats: usize, seed: u64) -> Result<(), BenchError> {
    let cfg = config(SchedulerVariant::Default)?;
    let (spec, _) = translate(state, &cfg)?;
    let t = Instant::now();
    let text = nft::nft_ruleset(&spec)?;
    let gen_time = t.elapsed();
    let prefix = format!("{}.nft", p.name);
    r.push(format!("{prefix}.services"), p.services as f64, "count");
    r.push(format!("{prefix}.endpoints"), (p.services * p.endpoints) as f64, "count");
    r.push(format!("{prefix}.generate"), ms(gen_time), "ms");
    r.push(format!("{prefix}.ruleset_bytes"), text.len() as f64, "bytes");
    r.push(format!("{prefix}.chains"), text.lines().filter(|l| l.starts_with("add chain ")).count() as f64, "count");
    let dir = std::env::temp_dir();
    let full = dir.join(format!("xlb-cpbench-{}-{}.nft", std::process::id(), p.name));
    write_file(&full, &text)?;
    let mut loads = Vec::new();
    for _ in 0..repeats.max(1) {
        let ns = ScratchNs::new("cpb")?;
        loads.push(ns.nft_file(&full)?);
    }
    r.push_ms_summary(&format!("{prefix}.full_load"), &loads);

    let ns = ScratchNs::new("cpb")?;
    ns.nft_file(&full)?;
    let mut state = state.clone();
    let mut cur = spec;
    let mut rng = Rng::new(seed ^ 0x6e66_7400);
    let upd_file = dir.join(format!("xlb-cpbench-{}-{}-update.nft", std::process::id(), p.name));
    let del_file = dir.join(format!("xlb-cpbench-{}-{}-deferred.nft", std::process::id(), p.name));
    let mut updates = Vec::new();
    for k in 0..repeats.max(1) {
        let ch = synth::change_one_endpoint(&mut state, p, &mut rng, 100_000 + k);
        let (new, _) = translate(&state, &cfg)?;
        let u = nft::nft_service_update(&cur, &new, &ch.service_name)?;
        write_file(&upd_file, &u.transaction)?;
        updates.push(ns.nft_file(&upd_file)?);
        if !u.deferred.is_empty() {
            write_file(&del_file, &u.deferred)?;
            ns.nft_file(&del_file)?;
        }
        cur = new;
    }
    r.push_ms_summary(&format!("{prefix}.service_update"), &updates);
    if std::env::var_os("XLB_CPBENCH_KEEP").is_none() {
        for f in [&full, &upd_file, &del_file] {
            let _ = std::fs::remove_file(f);
        }
    }
    Ok(())
}

/// Runs everything `o` asks for; `progress` gets a line before each step.
///
/// # Errors
/// [`BenchError`] for a failed build, translation or `nft` load.
pub fn run(o: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report, BenchError> {
    let mut r = Report::default();
    r.notes.push(if alloc_count::active() {
        "memory: heap bytes live after the build, counted by a counting global allocator (alloc_count)".into()
    } else {
        "memory: counting allocator not installed in this binary; only VmHWM is reported".into()
    });
    r.notes.push(
        "change path: the event's object into a ClusterIndex + Translator::update (only the touched Services) + TableBuilder::build (warm builder) + publish; change.translate: Translator::update within that path (after a build: includes the allocator's deferred work from the builder's frees); change.translate_alone: Translator::update with no build in between (after one uncounted update); add_service/remove_service: one Service and its slices in one sync; two_snapshots.memory_bytes: live heap while the tables before and after one endpoint change are both held, minus with the one before alone; full build: a new Translator's build + a new TableBuilder's build + publish (the translator is dropped after the timing, as xlb run keeps its own)".into(),
    );
    let nft_ok = o.nft && netns::is_root() && netns::have_tool("nft", "--version") && netns::have_tool("ip", "-V");
    if nft_ok && o.nft_scale_divisor > 1 {
        r.notes.push(format!(
            "nft comparison at 1/{} of each profile's Services (see PROFILE.nft.services); --nft-full-scale for full scale (minutes per load)",
            o.nft_scale_divisor
        ));
    }
    if o.nft && !nft_ok {
        r.notes.push("nft comparison skipped: needs root and the nft and ip tools".into());
    }
    for &p in &o.profiles {
        progress(&format!("profile {}: generating {} Services x {} endpoints", p.name, p.services, p.endpoints));
        let state = synth::cluster(p);
        r.push(format!("{}.services", p.name), p.services as f64, "count");
        r.push(format!("{}.endpoints", p.name), (p.services * p.endpoints) as f64, "count");
        r.push_ms_summary(&format!("{}.snapshot_copy", p.name), &snapshot_copies(&state, o.repeats.max(1)));
        r.push_ms_summary(&format!("{}.snapshot_index", p.name), &snapshot_indexes(&state, o.repeats.max(1)));
        per_sync(&mut r, p, &state, o.repeats.max(1))?;
        for &s in &o.schedulers {
            let cfg = config(s)?;
            progress(&format!("profile {} scheduler {}: {} full builds", p.name, s.name(), o.repeats));
            let mut check = full_builds(&mut r, p, s, &state, &cfg, o.repeats)?;
            if o.change_schedulers.contains(&s) && o.change_samples > 0 {
                progress(&format!("profile {} scheduler {}: {} changes", p.name, s.name(), o.change_samples));
                check.last_change_published = Some(changes(&mut r, p, s, &state, &cfg, o.change_samples, o.seed)?);
            }
            r.checks.push(check);
        }
        if nft_ok {
            let div = o.nft_scale_divisor.max(1);
            let np = Profile { services: (p.services / div).max(1), ..p };
            progress(&format!(
                "profile {}: kube-proxy nftables ruleset of {} Services x {} endpoints, {} loads",
                p.name, np.services, np.endpoints, o.nft_repeats
            ));
            let nstate = if div == 1 { state } else { synth::cluster(np) };
            nft_side(&mut r, np, &nstate, o.nft_repeats, o.seed)?;
        }
    }
    if let Some(h) = vm_hwm_bytes() {
        r.push("process.vm_hwm".into(), h as f64, "bytes");
    }
    Ok(r)
}
