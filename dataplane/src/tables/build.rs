//! [`TableBuilder`]: from a [`TablesSpec`] to a [`Tables`] snapshot, redoing only what
//! changed since the previous build (issue 14 items 1 and 2).
//!
//! A build first finds what changed. The Services of a spec are `Arc`s, and a translator hands
//! the same `Arc` for a Service it did not touch (SYNC-03), so the builder walks the new spec
//! beside the pointers of the previous one: an equal pointer is an unchanged Service and costs
//! one compare; only the others are looked up by name. Everything that is not a Service
//! (ports, neighbours, routes, SNAT, prefixes, the Maglev size) is compared by value; any
//! difference there, a builder without history, or a spec whose order does not line up with
//! the previous one makes a full build, which validates and lays out everything as before.
//!
//! The snapshot itself is persistent ([`super::persist`]): services by id and backend slots
//! in shared chunks, frontends, addresses and steered endpoints in sharded maps. An
//! incremental build clones the previous snapshot (chunk and shard pointers), removes what
//! the removed and changed Services had put in (first, all of it, so a frontend can move from
//! one Service to another within one build), then puts in the new and changed ones. Shared
//! keys (an address carrying frontends of several Services, an endpoint backing two Services)
//! are reference-counted here, off the published tables.
//!
//! A full build starts from an empty snapshot and makes its four sharded maps in one piece
//! each from lists gathered service by service ([`super::persist::KeyMap::extend_absent`]),
//! the steered endpoints (counted and made into their set) on a second thread beside the
//! rest; the Maglev tables on [`TableBuilder::set_build_threads`] threads. An incremental build
//! puts keys in one at a time. Both make the same snapshot (pinned by the tests below).
#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};

use super::{
    Backend, BackendRef, BackendSpec, BuildError, Cidr, ForwardingMode, FrontendEntry, FrontendKind, Hop, KERNEL_PORT,
    KernelRouteSpec, NeighbourSpec, NextHop, PortSpec, RouteIndex, RouteSpec, Scheduler, Service, ServiceSpec, Tables,
    TablesSpec, VipAddrKind, VipKey,
};
use crate::addr::mapped;
use crate::csum::DnatHalf;
use crate::maglev::{self, MaglevBackend, MaglevTable};

/// Keeps what must survive from one build to the next: backend slot and service id
/// assignments, the last Maglev table of each Service, the last snapshot and the reference
/// counts of shared keys. Owned by the control thread.
#[derive(Debug, Default)]
pub struct TableBuilder {
    /// Per Service name: what its last build made.
    records: HashMap<ByName, Record>,
    /// The spec pointer of each record (`Arc::as_ptr` as an address) → its name.
    names_by_ptr: HashMap<usize, Arc<ServiceSpec>>,
    /// The previous spec's Service pointers in spec order (each kept alive by its record).
    order: Vec<usize>,
    /// Non-service fields of the previous spec.
    globals: Option<Globals>,
    /// The last snapshot built (sharing its pieces with the one published).
    last: Option<Tables>,
    free: Vec<BackendRef>,
    next_slot: usize,
    free_ids: Vec<u32>,
    next_id: u32,
    generation: u64,
    /// Backends in the last snapshot (for [`BuildError::TooManyBackends`]).
    total_backends: usize,
    /// Frontends per address and kind ([`VipAddrKind`] as index 0..3).
    addr_kinds: HashMap<[u8; 16], [u32; 3]>,
    /// Services that put each key into [`Tables::endpoints`].
    endpoint_refs: HashMap<VipKey, u32>,
    /// Services that put each entry into [`Tables::kernel_endpoints`].
    kernel_refs: BTreeMap<(IpAddr, u8, u16), u32>,
    /// Backends waiting for each unresolved next hop ([`Tables::unresolved`]).
    unresolved_refs: HashMap<IpAddr, u32>,
    /// Keys of `endpoint_refs` and `unresolved_refs` whose count an incremental build's undo
    /// took to 0. They stay in the counts and in the tables' sets, at 0, until the build's
    /// upserts are done: a changed Service takes most of its keys back, and a key taken out
    /// and put back costs its shard a copy and a reindex for nothing
    /// ([`TableBuilder::drop_unreferenced`]).
    zeroed_endpoints: Vec<VipKey>,
    /// As `zeroed_endpoints`, for `unresolved_refs`.
    zeroed_unresolved: Vec<IpAddr>,
    maglev_stats: MaglevBuildStats,
    last_kind: BuildKind,
    /// Records that hold a Maglev table.
    maglev_tables: usize,
    /// Ids of the services the last incremental build added, changed or removed, sorted.
    changed: Vec<u32>,
    /// Threads that compute Maglev tables (0: `std::thread::available_parallelism`).
    threads: usize,
}

/// What one Service's last build made, to undo it when the Service changes or leaves.
#[derive(Debug)]
struct Record {
    spec: Arc<ServiceSpec>,
    id: u32,
    maglev: Option<MaglevCached>,
    /// The service it built: its frontend keys (in `spec.frontends` order) and the keys it put
    /// into [`Tables::endpoints`] (counted in `endpoint_refs`).
    svc: Arc<Service>,
    /// Entries put into [`Tables::kernel_endpoints`].
    kernel: Box<[(IpAddr, u8, u16)]>,
    /// Next hops of its backends that were unresolved.
    unresolved: Box<[IpAddr]>,
    backends: usize,
}

/// A Service spec as a map key, hashed and compared by its name (`Borrow<str>`): records are
/// keyed without a copy of the name.
#[derive(Debug, Clone)]
struct ByName(Arc<ServiceSpec>);

impl PartialEq for ByName {
    fn eq(&self, o: &Self) -> bool {
        self.0.name == o.0.name
    }
}

impl Eq for ByName {}

impl core::hash::Hash for ByName {
    fn hash<H: core::hash::Hasher>(&self, h: &mut H) {
        // As `str` hashes, so that lookups by `&str` find it (`Borrow`).
        self.0.name.as_str().hash(h);
    }
}

impl core::borrow::Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        &self.0.name
    }
}

/// A Maglev table and the input it was built from (eligible backends in order, and the
/// smallest and largest M allowed).
#[derive(Debug, Clone)]
struct MaglevCached {
    input: Box<[MaglevBackend]>,
    m_range: (u32, u32),
    table: Arc<MaglevTable>,
}

/// The fields of a [`TablesSpec`] that are not Services.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Globals {
    ports: Vec<PortSpec>,
    neighbours: Vec<NeighbourSpec>,
    routes: Vec<RouteSpec>,
    kernel_routes: Vec<KernelRouteSpec>,
    multipath_l4: bool,
    snat_v4: Option<IpAddr>,
    snat_v6: Option<IpAddr>,
    dsr_source_v4: Option<Cidr>,
    dsr_source_v6: Option<Cidr>,
    maglev_max_size: u32,
    maglev_min_size: u32,
    cluster_cidrs: Vec<Cidr>,
}

impl Globals {
    fn of(s: &TablesSpec) -> Self {
        Self {
            ports: s.ports.clone(),
            neighbours: s.neighbours.clone(),
            routes: s.routes.clone(),
            kernel_routes: s.kernel_routes.clone(),
            multipath_l4: s.multipath_l4,
            snat_v4: s.snat_v4,
            snat_v6: s.snat_v6,
            dsr_source_v4: s.dsr_source_v4,
            dsr_source_v6: s.dsr_source_v6,
            maglev_max_size: s.maglev_max_size,
            maglev_min_size: s.maglev_min_size,
            cluster_cidrs: s.cluster_cidrs.clone(),
        }
    }

    /// Equal to `s`'s, without copying.
    fn matches(&self, s: &TablesSpec) -> bool {
        self.ports == s.ports
            && self.neighbours == s.neighbours
            && self.routes == s.routes
            && self.kernel_routes == s.kernel_routes
            && self.multipath_l4 == s.multipath_l4
            && self.snat_v4 == s.snat_v4
            && self.snat_v6 == s.snat_v6
            && self.dsr_source_v4 == s.dsr_source_v4
            && self.dsr_source_v6 == s.dsr_source_v6
            && self.maglev_max_size == s.maglev_max_size
            && self.maglev_min_size == s.maglev_min_size
            && self.cluster_cidrs == s.cluster_cidrs
    }
}

/// How many Maglev tables the last [`TableBuilder::build`] computed and how many it reused.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MaglevBuildStats {
    /// Tables computed (new service, or its eligible backends or weights changed).
    pub built: usize,
    /// Tables shared with the previous snapshot: of a service the build did not redo, or
    /// whose eligible backends and weights did not change.
    pub reused: usize,
    /// Threads that computed the `built` tables (the calling thread included; 1 when few or
    /// none were built). See [`TableBuilder::set_build_threads`].
    pub threads: usize,
}

/// What the last successful [`TableBuilder::build`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum BuildKind {
    /// No build yet.
    #[default]
    None,
    /// Everything laid out again: first build, a non-service field changed, or the spec's
    /// Services did not line up with the previous build's.
    Full,
    /// Only the Services whose `Arc` changed were rebuilt.
    Incremental {
        /// Services added or changed.
        upserted: usize,
        /// Services removed.
        removed: usize,
    },
}

/// Maglev tables a build thread claims at a time (one atomic add per claim).
pub const MAGLEV_JOBS_PER_CLAIM: usize = 16;

/// A build uses another thread only for every this many Maglev tables to compute: a thread
/// costs tens of microseconds to start, a table of 10 backends (M = 1021) about 20 µs.
pub const MAGLEV_JOBS_PER_THREAD: usize = 64;

/// Computes one Maglev table per entry of `jobs` (table size from [`maglev::table_size_within`]
/// with `min_m` and `max_m`), on up to `threads` threads; one result per job, in job order, equal to a
/// one-thread build's, and the number of threads that took part. A helper that cannot be
/// started, or that panicked, leaves its remaining jobs to the calling thread.
fn build_maglev_tables(
    jobs: &[&[MaglevBackend]],
    (min_m, max_m): (u32, u32),
    threads: usize,
) -> (Vec<Result<MaglevTable, maglev::MaglevError>>, usize) {
    let threads = threads.min(jobs.len() / MAGLEV_JOBS_PER_THREAD).max(1);
    crate::par::par_map(
        jobs.len(),
        threads,
        MAGLEV_JOBS_PER_CLAIM,
        "xlb-maglev",
        maglev::MaglevScratch::new,
        |scratch, i| {
            let mb = jobs.get(i).copied().unwrap_or_default();
            maglev::table_size_within(mb.len(), min_m, max_m).and_then(|m| MaglevTable::build_in(mb, m, scratch))
        },
    )
}

/// Number of buckets of the `sh`/`dh` static hash table (IPVS `IP_VS_SH_TAB_SIZE` is 256).
pub const HASH_BUCKETS: usize = 256;

/// The Services a build redoes.
struct Plan<'a> {
    /// New or changed Services, in spec order.
    upserts: Vec<&'a Arc<ServiceSpec>>,
    /// Names of Services that left, sorted.
    removed: Vec<String>,
    full: bool,
}

/// What validation worked out for one upserted Service (nothing committed yet).
struct Prepared {
    maglev: Option<MaglevCached>,
}

fn addr_kind(k: FrontendKind) -> VipAddrKind {
    match k {
        FrontendKind::ClusterIp => VipAddrKind::ClusterIp,
        FrontendKind::NodePort => VipAddrKind::Node,
        FrontendKind::LoadBalancer | FrontendKind::ExternalIp => VipAddrKind::Service,
    }
}

fn kind_index(k: VipAddrKind) -> usize {
    match k {
        VipAddrKind::Node => 0,
        VipAddrKind::Service => 1,
        VipAddrKind::ClusterIp => 2,
    }
}

const KINDS: [VipAddrKind; 3] = [VipAddrKind::Node, VipAddrKind::Service, VipAddrKind::ClusterIp];

/// The kind of an address from how many of its frontends have each kind (in [`KINDS`]'
/// order): [`VipAddrKind::Node`] whenever a NodePort is on it, since the node's own traffic
/// lives there whatever else it serves (an external or LoadBalancer IP that is the node's own
/// address, as k3s's ServiceLB reports node addresses); else the highest. `None` when no
/// frontend is on it.
fn kind_of(counts: [u32; 3]) -> Option<VipAddrKind> {
    if counts.get(kind_index(VipAddrKind::Node)).is_some_and(|n| *n > 0) {
        return Some(VipAddrKind::Node);
    }
    KINDS.iter().zip(counts).filter(|(_, c)| *c > 0).map(|(k, _)| *k).max()
}

/// Per-Service checks that need nothing else: ports not 0, one address family, no backend
/// twice.
fn validate_service(s: &ServiceSpec, seen_b: &mut HashSet<(IpAddr, u16)>) -> Result<(), BuildError> {
    for f in &s.frontends {
        if f.port == 0 {
            return Err(BuildError::ZeroPort { service: s.name.clone(), what: "frontend" });
        }
    }
    let v6 = s.frontends.first().map(|f| f.addr.is_ipv6());
    let addrs = s.frontends.iter().map(|f| f.addr).chain(s.backends.iter().map(|b| b.addr));
    for a in addrs {
        if v6.is_some_and(|v6| v6 != a.is_ipv6()) {
            return Err(BuildError::MixedFamilies { service: s.name.clone(), addr: a });
        }
    }
    seen_b.clear();
    for b in &s.backends {
        if b.port == 0 {
            return Err(BuildError::ZeroPort { service: s.name.clone(), what: "backend" });
        }
        if !seen_b.insert((b.addr, b.port)) {
            return Err(BuildError::DuplicateBackend { service: s.name.clone(), addr: b.addr, port: b.port });
        }
    }
    Ok(())
}

fn frontend_key(f: &super::Frontend) -> VipKey {
    VipKey { addr: mapped(f.addr), port: f.port, proto: f.proto as u8 }
}

impl TableBuilder {
    /// A builder with no history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets how many threads compute the Maglev tables of one build: the calling thread and
    /// `n - 1` scoped helpers (`std::thread::scope`, unpinned, normal priority), each taking
    /// the next [`MAGLEV_JOBS_PER_CLAIM`] tables in turn. 1 builds on the calling thread
    /// only; 0 (the default) means `std::thread::available_parallelism()` (the CPUs this
    /// process may run on). Fewer threads are used when there are fewer than
    /// [`MAGLEV_JOBS_PER_THREAD`] tables per thread to build (a one-Service change builds one
    /// table and starts no thread). The tables are the same whatever `n`: each depends only
    /// on its own input (NSDI'16 §3.4), and results are stitched back in service order.
    pub fn set_build_threads(&mut self, n: usize) {
        self.threads = n;
    }

    /// The thread count [`Self::set_build_threads`] resolves to (≥ 1).
    pub fn build_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        }
    }

    /// Maglev tables computed and reused by the last successful [`TableBuilder::build`].
    pub fn maglev_stats(&self) -> MaglevBuildStats {
        self.maglev_stats
    }

    /// Whether the last successful [`TableBuilder::build`] was full or incremental, and how
    /// many Services it redid.
    pub fn last_build(&self) -> BuildKind {
        self.last_kind
    }

    /// The ids of the services that the last build added, changed or removed (sorted): in
    /// the snapshot before it, the one it made, or both (an id freed and taken again in one
    /// build names both services). `None` when the last build was full (anything may have
    /// changed) or failed to happen.
    pub fn changed_ids(&self) -> Option<&[u32]> {
        matches!(self.last_kind, BuildKind::Incremental { .. }).then_some(self.changed.as_slice())
    }

    /// Number of backend slots in use or free (the length of [`Tables::backends`]).
    pub fn slot_count(&self) -> usize {
        self.next_slot
    }

    /// Number of service ids handed out (the length of [`Tables::services`], which workers
    /// size their per-service counters to).
    pub fn service_id_count(&self) -> u32 {
        self.next_id
    }

    /// Builds a snapshot from `spec`. On error nothing changes (slot and id assignments and
    /// the history are only committed on success), so the caller keeps publishing the last
    /// good tables.
    ///
    /// Cost: a full build (first build, or a non-service field of `spec` changed) is
    /// O(Services + backends); otherwise O(Services) pointer compares plus O(what changed):
    /// Services whose `Arc` is the one of the previous build are not looked at.
    ///
    /// # Errors
    /// [`BuildError`] naming the service, frontend or backend at fault.
    pub fn build(&mut self, spec: &TablesSpec) -> Result<Tables, BuildError> {
        for n in &spec.neighbours {
            if usize::from(n.port) >= spec.ports.len() {
                return Err(BuildError::BadNeighbourPort { addr: n.addr, port: n.port, ports: spec.ports.len() });
            }
        }
        let snat_v4 = match spec.snat_v4 {
            None => None,
            Some(IpAddr::V4(a)) => Some(a.octets()),
            Some(other) => return Err(BuildError::SnatFamily(other)),
        };
        let snat_v6 = match spec.snat_v6 {
            None => None,
            Some(IpAddr::V6(a)) => Some(a.octets()),
            Some(other) => return Err(BuildError::SnatFamily(other)),
        };
        let incremental = self.last.is_some() && self.globals.as_ref().is_some_and(|g| g.matches(spec));
        let plan = match incremental.then(|| self.plan(spec)).flatten() {
            Some(p) => p,
            None => self.full_plan(spec)?,
        };
        let (prepared, stats) = self.validate(spec, &plan)?;

        // Commit (cannot fail from here on).
        // The last snapshot is taken, not copied: its pieces are shared with the published
        // one, so what the commit changes is copied then (and only that).
        let mut t = match (self.last.take(), plan.full) {
            (Some(last), false) => last,
            _ => {
                let mut t = Tables::empty();
                t.ports = spec.ports.clone();
                t.snat_v4 = snat_v4;
                t.snat_v6 = snat_v6;
                t.cluster_cidrs = spec.cluster_cidrs.clone().into_boxed_slice();
                t.multipath_l4 = spec.multipath_l4;
                t.dsr_source_v4 = spec.dsr_source_v4;
                t.dsr_source_v6 = spec.dsr_source_v6;
                self.addr_kinds.clear();
                self.endpoint_refs.clear();
                self.kernel_refs.clear();
                self.unresolved_refs.clear();
                self.total_backends = 0;
                t
            }
        };
        self.commit(spec, &plan, prepared, &mut t);
        self.generation += 1;
        t.generation = self.generation;
        // Every Maglev table of the snapshot not computed by this build was reused, whether the
        // build looked at its service or not.
        self.maglev_stats = MaglevBuildStats { reused: self.maglev_tables.saturating_sub(stats.built), ..stats };
        if plan.full {
            self.globals = Some(Globals::of(spec));
        }
        self.last_kind = if plan.full {
            BuildKind::Full
        } else {
            BuildKind::Incremental { upserted: plan.upserts.len(), removed: plan.removed.len() }
        };
        if plan.full || !plan.upserts.is_empty() || !plan.removed.is_empty() {
            self.order.clear();
            self.order.extend(spec.services.iter().map(|s| Arc::as_ptr(s) as usize));
        }
        self.last = Some(t.clone());
        Ok(t)
    }

    /// The Services that changed since the previous build, found by walking `spec` beside the
    /// previous build's pointers. `None` when they do not line up (a reordered spec, a name
    /// twice): then a full build sorts it out.
    fn plan<'a>(&self, spec: &'a TablesSpec) -> Option<Plan<'a>> {
        let mut upserts = Vec::new();
        // Names met off the fast path, and previous pointers passed over or replaced.
        let mut seen: HashSet<&str> = HashSet::new();
        let mut released: HashSet<usize> = HashSet::new();
        let mut j = 0;
        for s in &spec.services {
            let p = Arc::as_ptr(s) as usize;
            if self.order.get(j) == Some(&p) {
                j += 1;
                continue;
            }
            if !seen.insert(s.name.as_str()) {
                return None;
            }
            match self.records.get(s.name.as_str()) {
                Some(r) if Arc::ptr_eq(&r.spec, s) => {
                    // Unchanged, with Services removed or changed before it: pass over those.
                    let k = self.order.get(j..)?.iter().position(|&q| q == p)?;
                    released.extend(self.order.get(j..j + k)?.iter().copied());
                    j += k + 1;
                }
                Some(r) => {
                    let q = Arc::as_ptr(&r.spec) as usize;
                    if self.order.get(j) == Some(&q) {
                        released.insert(q);
                        j += 1;
                    }
                    upserts.push(s);
                }
                None => upserts.push(s),
            }
        }
        released.extend(self.order.get(j..)?.iter().copied());
        let mut removed = Vec::new();
        for q in &released {
            let name = &self.names_by_ptr.get(q)?.name;
            if !seen.contains(name.as_str()) {
                removed.push(name.clone());
            }
        }
        // A changed Service's previous spec must have been passed over: otherwise it is still
        // in the spec under the same name (the name twice).
        for s in &upserts {
            if let Some(r) = self.records.get(s.name.as_str())
                && !released.contains(&(Arc::as_ptr(&r.spec) as usize))
            {
                return None;
            }
        }
        removed.sort_unstable();
        Some(Plan { upserts, removed, full: false })
    }

    /// Every Service of `spec`, and every recorded one not in it as removed.
    fn full_plan<'a>(&self, spec: &'a TablesSpec) -> Result<Plan<'a>, BuildError> {
        let mut names: HashSet<&str> = HashSet::with_capacity(spec.services.len());
        for s in &spec.services {
            if !names.insert(s.name.as_str()) {
                return Err(BuildError::DuplicateService(s.name.clone()));
            }
        }
        let mut removed: Vec<String> =
            self.records.keys().map(|n| &n.0.name).filter(|n| !names.contains(n.as_str())).cloned().collect();
        removed.sort_unstable();
        Ok(Plan { upserts: spec.services.iter().collect(), removed, full: true })
    }

    /// Checks the upserted Services (alone and against the Services that stay) and computes
    /// their scheduler data, Maglev tables included, without changing `self`.
    fn validate(&self, spec: &TablesSpec, plan: &Plan<'_>) -> Result<(Vec<Prepared>, MaglevBuildStats), BuildError> {
        let mut seen_b = HashSet::new();
        // Frontends claimed by the upserts (first in spec order wins the message).
        let mut claims: HashMap<VipKey, &str> = HashMap::new();
        let mut total = if plan.full { 0 } else { self.total_backends };
        for s in &plan.upserts {
            validate_service(s, &mut seen_b)?;
            for f in &s.frontends {
                if let Some(first) = claims.insert(frontend_key(f), &s.name) {
                    return Err(BuildError::DuplicateFrontend {
                        addr: f.addr,
                        proto: f.proto.as_str(),
                        port: f.port,
                        first: first.to_owned(),
                        second: s.name.clone(),
                    });
                }
            }
            if !plan.full
                && let Some(r) = self.records.get(s.name.as_str())
            {
                total = total.saturating_sub(r.backends);
            }
            total += s.backends.len();
        }
        if !plan.full {
            for n in &plan.removed {
                total = total.saturating_sub(self.records.get(n.as_str()).map_or(0, |r| r.backends));
            }
            // A frontend an upsert claims must not belong to a Service that stays as it is.
            if let Some(last) = &self.last {
                let changing: HashSet<&str> = plan
                    .upserts
                    .iter()
                    .map(|u| u.name.as_str())
                    .chain(plan.removed.iter().map(String::as_str))
                    .collect();
                for s in &plan.upserts {
                    for f in &s.frontends {
                        let Some(owner) = last.vips.get(&frontend_key(f)) else { continue };
                        let Some(o) = last.services.get(owner.service as usize) else { continue };
                        if !changing.contains(&*o.name) {
                            return Err(BuildError::DuplicateFrontend {
                                addr: f.addr,
                                proto: f.proto.as_str(),
                                port: f.port,
                                first: o.name.to_string(),
                                second: s.name.clone(),
                            });
                        }
                    }
                }
            }
        }
        if total > BackendRef::MAX_SLOTS {
            return Err(BuildError::TooManyBackends(total));
        }

        let max_m = if spec.maglev_max_size == 0 { maglev::DEFAULT_MAX_TABLE_SIZE } else { spec.maglev_max_size };
        let min_m = if spec.maglev_min_size == 0 { maglev::DEFAULT_MIN_TABLE_SIZE } else { spec.maglev_min_size };
        let m_range = (min_m, max_m);
        let mut pending = Vec::with_capacity(plan.upserts.len());
        for s in &plan.upserts {
            let eligible: Vec<&BackendSpec> = s.backends.iter().filter(|b| b.eligible && b.weight > 0).collect();
            let maglev = if matches!(s.scheduler, Scheduler::Maglev { .. }) && !eligible.is_empty() {
                let mb: Box<[MaglevBackend]> = eligible
                    .iter()
                    .map(|b| MaglevBackend { key: maglev::backend_key(b.addr, b.port), weight: u32::from(b.weight) })
                    .collect();
                let cached = self
                    .records
                    .get(s.name.as_str())
                    .and_then(|r| r.maglev.as_ref())
                    .filter(|c| c.m_range == m_range && *c.input == *mb)
                    .map(|c| c.table.clone());
                Some((mb, cached))
            } else {
                None
            };
            // The running sum of the weights (`Service::cum_weights`) must fit 32 bits.
            let fits = eligible.iter().try_fold(0u32, |sum, b| sum.checked_add(u32::from(b.weight))).is_some();
            pending.push((maglev, fits));
        }
        let pending_reused = pending.iter().filter(|(m, _)| m.as_ref().is_some_and(|(_, c)| c.is_some())).count();
        let jobs: Vec<&[MaglevBackend]> =
            pending.iter().filter_map(|(m, _)| m.as_ref().filter(|(_, c)| c.is_none()).map(|(mb, _)| &**mb)).collect();
        let (built, threads) = build_maglev_tables(&jobs, m_range, self.build_threads());
        let n_built = jobs.len();
        drop(jobs);
        let mut built = built.into_iter();
        let mut out = Vec::with_capacity(plan.upserts.len());
        for (s, (maglev, fits)) in plan.upserts.iter().zip(pending) {
            let maglev = match maglev {
                None => None,
                Some((input, Some(table))) => Some(MaglevCached { input, m_range, table }),
                Some((input, None)) => match built.next() {
                    Some(Ok(t)) => Some(MaglevCached { input, m_range, table: Arc::new(t) }),
                    Some(Err(source)) => return Err(BuildError::Maglev { service: s.name.clone(), source }),
                    // One result per job, in job order: not reached.
                    None => {
                        return Err(BuildError::Maglev {
                            service: s.name.clone(),
                            source: maglev::MaglevError::NoBackends,
                        });
                    }
                },
            };
            if !fits {
                return Err(BuildError::WeightOverflow(s.name.clone()));
            }
            out.push(Prepared { maglev });
        }
        let reused = pending_reused;
        Ok((out, MaglevBuildStats { built: n_built, reused, threads }))
    }

    /// Applies `plan` to `t` (a fresh snapshot for a full plan, else a clone of the last).
    fn commit(&mut self, spec: &TablesSpec, plan: &Plan<'_>, prepared: Vec<Prepared>, t: &mut Tables) {
        let mut touched_addrs: HashSet<[u8; 16]> = HashSet::new();
        let mut kernel_changed = plan.full;
        let fresh = plan.full;

        self.changed.clear();
        // 1. Undo what removed and changed Services put in; free their slots and ids.
        // Per upsert: its id and, per backend of its new spec, the slot it keeps (a backend of
        // that address and port was in the Service's last build), if it was built before.
        let mut old_slots: Vec<Option<(u32, Vec<Option<BackendRef>>)>> = Vec::with_capacity(plan.upserts.len());
        for name in &plan.removed {
            let Some(r) = self.records.remove(name.as_str()) else { continue };
            self.names_by_ptr.remove(&(Arc::as_ptr(&r.spec) as usize));
            self.maglev_tables -= usize::from(r.maglev.is_some());
            self.changed.push(r.id);
            if !fresh {
                self.undo(&r, t, &mut touched_addrs, &mut kernel_changed);
                if let Some(s) = t.services.slots.get_mut(r.id as usize) {
                    *s = None;
                }
            }
            for &(_, _, b) in &r.svc.by_addr {
                self.free_slot(b, t, fresh);
            }
            self.free_ids.push(r.id);
        }
        for s in &plan.upserts {
            let Some(r) = self.records.remove(s.name.as_str()) else {
                old_slots.push(None);
                continue;
            };
            self.names_by_ptr.remove(&(Arc::as_ptr(&r.spec) as usize));
            self.maglev_tables -= usize::from(r.maglev.is_some());
            if !fresh {
                self.undo(&r, t, &mut touched_addrs, &mut kernel_changed);
            }
            // The last build's slots by (address, port), sorted: each goes to at most one
            // backend of the new spec; the rest are freed.
            let prev = &r.svc.by_addr;
            let mut kept = vec![false; prev.len()];
            let keep = s
                .backends
                .iter()
                .map(|b| {
                    let i = prev.binary_search_by(|&(a, p, _)| (a, p).cmp(&(b.addr, b.port))).ok()?;
                    let k = kept.get_mut(i).filter(|k| !**k)?;
                    *k = true;
                    prev.get(i).map(|&(_, _, r)| r)
                })
                .collect();
            for (&(_, _, b), _) in prev.iter().zip(&kept).filter(|(_, k)| !**k) {
                self.free_slot(b, t, fresh);
            }
            old_slots.push(Some((r.id, keep)));
        }

        // 2. Put in the new and changed Services.
        let neigh: HashMap<IpAddr, &NeighbourSpec> = if plan.upserts.is_empty() {
            HashMap::new()
        } else {
            spec.neighbours.iter().map(|n| (n.addr, n)).collect()
        };
        let idx = RouteIndex::new(&spec.kernel_routes);
        let hop_for = |addr: IpAddr| -> Result<Hop, Option<IpAddr>> {
            let via = match spec.next_hop_in(&idx, addr) {
                NextHop::Via(via) => via,
                NextHop::Kernel => {
                    return Ok(Hop { port: KERNEL_PORT, dst_mac: [0; 6], src_mac: [0; 6], mtu: 0 });
                }
                NextHop::NoRoute => return Err(None),
            };
            let n = neigh.get(&via).ok_or(Some(via))?;
            let p = spec.ports.get(usize::from(n.port)).ok_or(Some(via))?;
            Ok(Hop { port: n.port, dst_mac: n.mac, src_mac: p.mac, mtu: p.mtu })
        };
        let mut ids = Vec::with_capacity(plan.upserts.len());
        let mut refs: Vec<Vec<BackendRef>> = Vec::with_capacity(plan.upserts.len());
        // Ids first (freed ones in name order), then slots, in spec order as before.
        self.free_ids.sort_unstable_by(|a, b| b.cmp(a));
        for (s, old) in plan.upserts.iter().zip(&mut old_slots) {
            let id = match old {
                Some((id, _)) => *id,
                None => self.free_ids.pop().unwrap_or_else(|| {
                    let id = self.next_id;
                    self.next_id += 1;
                    id
                }),
            };
            ids.push(id);
            self.changed.push(id);
            let keep = old.as_mut().map(|(_, k)| core::mem::take(k)).unwrap_or_default();
            let rs = (0..s.backends.len())
                .map(|j| match keep.get(j).copied().flatten() {
                    Some(r) => r,
                    None => match self.free.pop() {
                        Some(r) => r,
                        None => {
                            let r = BackendRef::new(self.next_slot, 0);
                            self.next_slot += 1;
                            r
                        }
                    },
                })
                .collect();
            refs.push(rs);
        }
        t.backends.resize(self.next_slot);
        t.services.slots.resize(self.next_id as usize);
        // A fresh snapshot's maps are built at the end from these lists, shard by shard
        // (`KeyMap::extend_absent`), rather than key by key.
        let (mut new_vips, mut new_endpoints, mut new_unresolved) = (Vec::new(), Vec::new(), Vec::new());
        let frontends: usize = plan.upserts.iter().map(|s| s.frontends.len()).sum();
        let backends: usize = plan.upserts.iter().map(|s| s.backends.len()).sum();
        if fresh {
            // Sized once rather than grown (and rehashed, resharded) key by key.
            new_vips.reserve(frontends);
            new_endpoints.reserve(backends);
            new_unresolved.reserve(backends);
            self.endpoint_refs.reserve(backends);
            self.unresolved_refs.reserve(backends);
            self.addr_kinds.reserve(frontends);
            self.records.reserve(plan.upserts.len());
            self.names_by_ptr.reserve(plan.upserts.len());
        }

        for (((s, p), id), rs) in plan.upserts.iter().zip(prepared).zip(ids).zip(refs) {
            let mut members = Vec::with_capacity(s.backends.len());
            let mut eligible = Vec::with_capacity(s.backends.len());
            let mut weights = Vec::with_capacity(s.backends.len());
            let mut by_addr = Vec::with_capacity(s.backends.len());
            let mut unresolved = Vec::new();
            // Per backend: its next hop is the kernel ([`NextHop::Kernel`]), from the one route lookup.
            let mut via_kernel = Vec::with_capacity(s.backends.len());
            for (b, r) in s.backends.iter().zip(&rs) {
                let r = *r;
                members.push(r);
                by_addr.push((b.addr, b.port, r));
                if b.eligible && b.weight > 0 {
                    eligible.push(r);
                    weights.push(b.weight);
                }
                let first = hop_for(b.addr);
                via_kernel.push(first.as_ref().is_ok_and(|h| h.port == KERNEL_PORT));
                let (mut hop, no_route) = match first {
                    Ok(h) => (Some(h), false),
                    Err(Some(via)) => {
                        unresolved.push(via);
                        (None, false)
                    }
                    Err(None) => (None, true),
                };
                let mut paths = Vec::new();
                for gw in spec.multipath_gateways_in(&idx, b.addr) {
                    match hop_for(*gw) {
                        Ok(h) => paths.push(h),
                        Err(_) => unresolved.push(*gw),
                    }
                }
                // With one gateway resolved, that one is the backend's hop until the others are.
                if let Some(first) = paths.first() {
                    hop = Some(*first);
                }
                if paths.len() < 2 {
                    paths.clear();
                }
                let single_hop = hop.is_some() && !no_route && paths.is_empty();
                if let Some(slot) = t.backends.get_mut(r.index()) {
                    *slot = Some(Backend {
                        this: r,
                        addr: b.addr,
                        port: b.port,
                        weight: b.weight,
                        eligible: b.eligible,
                        service: id,
                        hop,
                        no_route,
                        paths: paths.into(),
                        conditions: b.conditions,
                        node_local: b.node_local,
                        single_hop,
                        dnat: DnatHalf::of_new(&mapped(b.addr), b.port),
                    });
                }
            }
            let mut endpoint_keys = Vec::new();
            let mut kernel = Vec::new();
            if s.mode == ForwardingMode::Nat {
                endpoint_keys.reserve(s.backends.len() * s.frontends.iter().filter(|f| !f.masquerade).count());
                for (b, _) in s.backends.iter().zip(&via_kernel).filter(|(_, k)| **k) {
                    for pr in s.frontends.iter().map(|f| f.proto) {
                        kernel.push((b.addr, pr as u8, b.port));
                        // Flows to it are never masqueraded, so its replies keep the client's
                        // address whatever the frontend: a worker that reads one without
                        // owning the flow must hand it on (`Verdict::Handoff`).
                        endpoint_keys.push(VipKey { addr: mapped(b.addr), port: b.port, proto: pr as u8 });
                    }
                }
                // Only frontends whose flows may keep the client's address: a masqueraded
                // flow's replies come to the SNAT address, which the steering program catches
                // anyway. So direct traffic to pods that back only masqueraded frontends is
                // never caught (issue 10: catch as little as we can).
                for b in &s.backends {
                    for pr in s.frontends.iter().filter(|f| !f.masquerade).map(|f| f.proto) {
                        endpoint_keys.push(VipKey { addr: mapped(b.addr), port: b.port, proto: pr as u8 });
                    }
                }
            }
            if fresh {
                // Counted at the end, beside the other maps (`count_new`).
                new_endpoints.extend_from_slice(&endpoint_keys);
            } else {
                for k in &endpoint_keys {
                    if add_ref(&mut self.endpoint_refs, *k) {
                        // A count at 0 is taken out of the map and the set at once (`undo`).
                        t.endpoints.insert_absent(*k);
                    }
                }
            }
            kernel.sort_unstable();
            kernel.dedup();
            for k in &kernel {
                let c = self.kernel_refs.entry(*k).or_insert(0);
                *c += 1;
                kernel_changed |= *c == 1;
            }
            unresolved.sort_unstable();
            unresolved.dedup();
            if fresh {
                new_unresolved.extend_from_slice(&unresolved);
            } else {
                for a in &unresolved {
                    if add_ref(&mut self.unresolved_refs, *a) {
                        t.unresolved.insert_absent(*a);
                    }
                }
            }
            // Only `sh`/`dh` read the bucket table (1 KiB per service).
            let hash_buckets = if matches!(s.scheduler, Scheduler::SourceHash | Scheduler::DestinationHash) {
                sh_buckets(&weights)
            } else {
                Box::default()
            };
            // The running sum of the weights (validation checked that it fits).
            let cum_weights = weights
                .iter()
                .scan(0u32, |sum, &w| {
                    *sum = sum.saturating_add(u32::from(w));
                    Some(*sum)
                })
                .collect();
            by_addr.sort_unstable_by_key(|&(a, p, _)| (a, p));
            let service = Service {
                id,
                name: s.name.clone().into_boxed_str(),
                scheduler: s.scheduler,
                affinity_timeout_s: s.affinity_timeout_s,
                mode: s.mode,
                when_empty: s.when_empty,
                members: members.into_boxed_slice(),
                by_addr: by_addr.into_boxed_slice(),
                eligible: eligible.into_boxed_slice(),
                weights: weights.into_boxed_slice(),
                cum_weights,
                maglev: p.maglev.as_ref().map(|m| m.table.clone()),
                hash_buckets,
                frontend_keys: s.frontends.iter().map(frontend_key).collect(),
                endpoint_keys: endpoint_keys.into_boxed_slice(),
            };
            let svc = Arc::new(service);
            for f in &s.frontends {
                let k = frontend_key(f);
                let kind = addr_kind(f.kind);
                // Absent: validated unique among the upserts, and every other owner it had was
                // removed or changed, so taken out in step 1.
                let entry = FrontendEntry {
                    service: id,
                    svc: Arc::clone(&svc),
                    kind: f.kind,
                    masquerade: f.masquerade,
                    source_ranges: f.source_ranges.clone().into_boxed_slice(),
                    plain_nat: s.mode == ForwardingMode::Nat
                        && s.affinity_timeout_s.is_none()
                        && !f.masquerade
                        && f.source_ranges.is_empty(),
                    dnat: DnatHalf::of_old(&mapped(f.addr), f.port),
                };
                if fresh {
                    new_vips.push((k, entry));
                } else {
                    t.vips.insert_absent(k, entry);
                }
                if let Some(c) = self.addr_kinds.entry(k.addr).or_insert([0; 3]).get_mut(kind_index(kind)) {
                    *c += 1;
                }
                if !fresh {
                    touched_addrs.insert(k.addr);
                }
            }
            if let Some(slot) = t.services.slots.get_mut(id as usize) {
                *slot = Some(Arc::clone(&svc));
            }
            self.total_backends += s.backends.len();
            let ptr = Arc::as_ptr(s) as usize;
            self.names_by_ptr.insert(ptr, Arc::clone(s));
            self.maglev_tables += usize::from(p.maglev.is_some());
            self.records.insert(
                ByName(Arc::clone(s)),
                Record {
                    spec: Arc::clone(s),
                    id,
                    maglev: p.maglev,
                    svc: Arc::clone(&svc),
                    kernel: kernel.into_boxed_slice(),
                    unresolved: unresolved.into_boxed_slice(),
                    backends: s.backends.len(),
                },
            );
        }

        self.changed.sort_unstable();
        self.changed.dedup();

        // 3. Shared keys whose reference counts crossed zero.
        if fresh {
            // Everything is new: one pass over the counts, no lookups; each map built whole.
            let addrs = self.addr_kinds.iter().filter_map(|(a, counts)| Some((*a, kind_of(*counts)?))).collect();
            // The steered endpoints (counted, then made whole) on one thread, the rest on
            // another when the build may use two: the same maps and counts as one thread's.
            let one_thread = self.build_threads() == 1;
            let (endpoint_refs, unresolved_refs) = (&mut self.endpoint_refs, &mut self.unresolved_refs);
            let (endpoints, unresolved, vips, vip_addrs) =
                (&mut t.endpoints, &mut t.unresolved, &mut t.vips, &mut t.vip_addrs);
            // Taken by whichever thread gets to it first (a helper that could not be started
            // leaves it to this one).
            let job = std::sync::Mutex::new(Some((endpoint_refs, new_endpoints, endpoints)));
            let steered = || {
                let taken = job.lock().ok().and_then(|mut j| j.take());
                if let Some((refs, keys, set)) = taken {
                    let new = count_new(refs, keys);
                    set.extend_absent(new, backends);
                }
            };
            let rest = move || {
                let new = count_new(unresolved_refs, new_unresolved);
                unresolved.extend_absent(new, backends);
                vips.extend_absent(new_vips, frontends);
                vip_addrs.extend_absent(addrs, frontends);
            };
            if one_thread {
                steered();
                rest();
            } else {
                std::thread::scope(|sc| {
                    let helper = std::thread::Builder::new().name("xlb-tables".into()).spawn_scoped(sc, steered);
                    rest();
                    if let Ok(h) = helper
                        && let Err(p) = h.join()
                    {
                        // A bug in the helper: the build must not go on with half a map.
                        std::panic::resume_unwind(p);
                    }
                    steered();
                });
            }
        }
        self.drop_unreferenced(t);
        for a in touched_addrs {
            let counts = self.addr_kinds.get(&a).copied().unwrap_or([0; 3]);
            match kind_of(counts) {
                Some(k) => {
                    t.vip_addrs.insert(a, k);
                }
                None => {
                    self.addr_kinds.remove(&a);
                    t.vip_addrs.remove(&a);
                }
            }
        }
        if kernel_changed {
            self.kernel_refs.retain(|_, c| *c > 0);
            t.kernel_endpoints = Arc::new(self.kernel_refs.keys().copied().collect());
        }
        t.vips.seal();
        t.vip_addrs.seal();
        t.endpoints.seal();
        t.unresolved.seal();
    }

    /// Takes out of `t` and the reference counts what `r`'s build put in (not its slots).
    fn undo(&mut self, r: &Record, t: &mut Tables, touched_addrs: &mut HashSet<[u8; 16]>, kernel_changed: &mut bool) {
        for f in &r.spec.frontends {
            let k = frontend_key(f);
            if t.vips.get(&k).is_some_and(|e| e.service == r.id) {
                t.vips.remove(&k);
            }
            if let Some(c) = self.addr_kinds.get_mut(&k.addr).and_then(|c| c.get_mut(kind_index(addr_kind(f.kind)))) {
                *c = c.saturating_sub(1);
            }
            touched_addrs.insert(k.addr);
        }
        for k in &r.svc.endpoint_keys {
            drop_ref(&mut self.endpoint_refs, *k, &mut self.zeroed_endpoints);
        }
        for k in &r.kernel {
            if let Some(c) = self.kernel_refs.get_mut(k) {
                *c = c.saturating_sub(1);
                *kernel_changed |= *c == 0;
            }
        }
        for a in &r.unresolved {
            drop_ref(&mut self.unresolved_refs, *a, &mut self.zeroed_unresolved);
        }
        self.total_backends = self.total_backends.saturating_sub(r.backends);
    }

    /// Takes out of the counts and of `t` the keys that this build's undo took to 0 and no
    /// upsert took back (`zeroed_endpoints`, `zeroed_unresolved`).
    fn drop_unreferenced(&mut self, t: &mut Tables) {
        take_out_zeroed(&mut self.endpoint_refs, &mut self.zeroed_endpoints, &mut t.endpoints);
        take_out_zeroed(&mut self.unresolved_refs, &mut self.zeroed_unresolved, &mut t.unresolved);
    }

    /// Frees backend slot `b` (its generation bumped, so stale refs to it miss).
    fn free_slot(&mut self, b: BackendRef, t: &mut Tables, fresh: bool) {
        if !fresh && let Some(s) = t.backends.get_mut(b.index()) {
            *s = None;
        }
        self.free.push(BackendRef::new(b.index(), (b.0 >> 20).wrapping_add(1)));
    }
}

/// Adds one reference per entry of `keys` to `refs` and returns the keys new to `refs`
/// ([`add_ref`]), in the order of their first entry (what a map of those keys lacks).
fn count_new<K: Copy + Eq + core::hash::Hash>(refs: &mut HashMap<K, u32>, keys: Vec<K>) -> Vec<K> {
    keys.into_iter().filter(|&k| add_ref(refs, k)).collect()
}

/// Adds one reference to `k` in `refs`; whether `k` is new to `refs`, so that the map or set
/// the counts stand for lacks it. A key at 0 is still in both (put there by an undo, until
/// [`TableBuilder::drop_unreferenced`]): taken back, it is not new.
#[inline]
fn add_ref<K: Eq + core::hash::Hash>(refs: &mut HashMap<K, u32>, k: K) -> bool {
    match refs.entry(k) {
        hashbrown::hash_map::Entry::Occupied(mut e) => {
            *e.get_mut() += 1;
            false
        }
        hashbrown::hash_map::Entry::Vacant(e) => {
            e.insert(1);
            true
        }
    }
}

/// Takes one reference to `k` out of `refs`; a count that reaches 0 stays, and `k` goes to
/// `zeroed` for [`take_out_zeroed`].
fn drop_ref<K: Eq + core::hash::Hash>(refs: &mut HashMap<K, u32>, k: K, zeroed: &mut Vec<K>) {
    if let Some(c) = refs.get_mut(&k) {
        *c = c.saturating_sub(1);
        if *c == 0 {
            zeroed.push(k);
        }
    }
}

/// Takes the keys of `zeroed` whose count is still 0 out of `refs` and `set`; empties `zeroed`.
fn take_out_zeroed<K: super::persist::MapKey + core::hash::Hash>(
    refs: &mut HashMap<K, u32>,
    zeroed: &mut Vec<K>,
    set: &mut super::persist::KeySet<K>,
) {
    for k in zeroed.drain(..) {
        if refs.get(&k) == Some(&0) {
            refs.remove(&k);
            set.remove(&k);
        }
    }
}

/// IPVS `sh`/`dh` bucket fill (`ip_vs_sh_populate`): walk the backends round robin, giving
/// each `weight` consecutive buckets per turn, until all [`HASH_BUCKETS`] are filled. Entries
/// are indices into the eligible list; empty when there is no eligible backend.
pub(super) fn sh_buckets(weights: &[u16]) -> Box<[u32]> {
    if weights.is_empty() {
        return Box::new([]);
    }
    let mut out = Vec::with_capacity(HASH_BUCKETS);
    let mut i = 0usize;
    let mut given = 0u16;
    while out.len() < HASH_BUCKETS {
        let w = weights.get(i).copied().unwrap_or(1).max(1);
        out.push(u32::try_from(i).unwrap_or(0));
        given += 1;
        if given >= w {
            given = 0;
            i = (i + 1) % weights.len();
        }
    }
    out.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use std::collections::BTreeSet;

    use super::super::{EmptyAction, Frontend, L4Proto};
    use super::*;

    /// What a snapshot says, without slot numbers or ids: per service name its settings,
    /// frontends, backends (with hops) and Maglev table (as backend addresses); the address
    /// kinds, steered endpoints, kernel endpoints and unresolved next hops.
    fn describe(t: &Tables) -> String {
        let mut svcs = Vec::new();
        let mut out = Vec::new();
        let name = |id: u32| t.services.get(id as usize).map(|s| s.name.to_string()).unwrap();
        for s in t.services.iter() {
            let b = |r: &BackendRef| {
                let b = t.backend(*r).unwrap();
                assert_eq!(b.service, s.id, "a backend names its service's id");
                format!("{}:{} w{} e{} {:?} {}", b.addr, b.port, b.weight, b.eligible, b.hop, b.no_route)
            };
            let mut members: Vec<String> = s.members.iter().map(b).collect();
            members.sort();
            let eligible: Vec<String> = s.eligible.iter().map(b).collect();
            let maglev: Option<Vec<String>> = s
                .maglev
                .as_ref()
                .map(|m| m.slots().into_iter().map(|i| b(&s.eligible[i as usize])).collect::<Vec<_>>());
            let mut fk = s.frontend_keys.to_vec();
            fk.sort_by_key(|k| (k.addr, k.port, k.proto));
            let mut ek = s.endpoint_keys.to_vec();
            ek.sort_by_key(|k| (k.addr, k.port, k.proto));
            svcs.push(format!(
                "svc {} {:?} {:?} {:?} members {members:?} eligible {eligible:?} w {:?} cum {:?} sh {:?} fk {fk:?} ek {ek:?} maglev {:?}",
                s.name,
                s.scheduler,
                s.mode,
                s.when_empty,
                s.weights,
                s.cum_weights,
                s.hash_buckets,
                maglev.map(|m| m.len())
            ));
            if let Some(m) = &s.maglev {
                svcs.push(format!("maglev {} {}", s.name, m.checksum()));
            }
        }
        svcs.sort();
        out.extend(svcs);
        for (k, e) in t.vips.iter() {
            let held = t.services.slots.get(e.service as usize).and_then(Option::as_ref);
            assert!(held.is_some_and(|s| Arc::ptr_eq(s, &e.svc)), "{k:?}: the entry's service is the table's");
        }
        let mut vips: Vec<String> = t
            .vips
            .iter()
            .map(|(k, e)| {
                format!("vip {k:?} -> {} {:?} {} {:?}", name(e.service), e.kind, e.masquerade, e.source_ranges)
            })
            .collect();
        vips.sort();
        out.extend(vips);
        let mut addrs: Vec<String> = t.vip_addrs.iter().map(|(a, k)| format!("addr {a:?} {k:?}")).collect();
        addrs.sort();
        out.extend(addrs);
        // With the sets' lengths: a key put in twice shows.
        let eps: BTreeSet<String> = t.endpoints.iter().map(|k| format!("{k:?}")).collect();
        out.push(format!("endpoints {} {eps:?}", t.endpoints.len()));
        out.push(format!("kernel {:?}", t.kernel_endpoints));
        let unresolved: BTreeSet<IpAddr> = t.unresolved.iter().copied().collect();
        out.push(format!("unresolved {} {unresolved:?}", t.unresolved.len()));
        let live = t.backends.iter().flatten().count();
        let members: usize = t.services.iter().map(|s| s.members.len()).sum();
        assert_eq!(live, members, "every live slot belongs to a member");
        out.join("\n")
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn service(name: &str, vip: u8, rng: &mut Rng) -> ServiceSpec {
        let scheduler =
            [Scheduler::Maglev { port: true }, Scheduler::Random, Scheduler::SourceHash][rng.next(3) as usize];
        let mode = if rng.next(4) == 0 { ForwardingMode::DsrIpip } else { ForwardingMode::Nat };
        let mut frontends = vec![Frontend::new(
            format!("10.96.0.{vip}").parse().unwrap(),
            L4Proto::Tcp,
            80,
            FrontendKind::ClusterIp,
            rng.next(2) == 0,
        )];
        if rng.next(3) == 0 {
            // A shared node address: NodePorts of several services on one address.
            frontends.push(Frontend::new(
                "192.0.2.1".parse().unwrap(),
                L4Proto::Tcp,
                30000 + u16::from(vip),
                FrontendKind::NodePort,
                true,
            ));
        }
        if rng.next(4) == 0 {
            // An external address two services may claim (a collision when both do).
            frontends.push(Frontend::new(
                "198.51.100.1".parse().unwrap(),
                L4Proto::Tcp,
                443,
                FrontendKind::ExternalIp,
                false,
            ));
        }
        let n = rng.next(6);
        let mut seen = BTreeSet::new();
        let backends = (0..n)
            .filter_map(|_| {
                // Backends from a small pool, so services share endpoints.
                let a = format!("10.244.0.{}", 1 + rng.next(12));
                let gw = rng.next(8) == 0;
                let a = if gw { format!("10.9.0.{}", 1 + rng.next(3)) } else { a };
                seen.insert(a.clone()).then(|| {
                    let mut b = BackendSpec::ready(a.parse().unwrap(), 8080);
                    b.weight = 1 + u16::try_from(rng.next(3)).unwrap();
                    b.eligible = rng.next(5) != 0;
                    b
                })
            })
            .collect();
        ServiceSpec {
            name: name.into(),
            frontends,
            scheduler,
            affinity_timeout_s: None,
            mode,
            when_empty: EmptyAction::Reject,
            backends,
        }
    }

    fn globals(variant: u64) -> TablesSpec {
        let mac = |i: u8| [2, 0, 0, 0, 0, i];
        let mut neighbours: Vec<NeighbourSpec> = (1..=10u8)
            .map(|i| NeighbourSpec { addr: format!("10.244.0.{i}").parse().unwrap(), mac: mac(i), port: 0 })
            .collect();
        if variant == 1 {
            // Two more resolved: hops change for those backends.
            neighbours.push(NeighbourSpec { addr: "10.244.0.11".parse().unwrap(), mac: mac(11), port: 0 });
        }
        TablesSpec {
            ports: vec![PortSpec { name: "eth0".into(), mac: [2, 0, 0, 0, 0, 0xee], mtu: 1500 }],
            neighbours,
            snat_v4: Some("192.0.2.100".parse().unwrap()),
            kernel_routes: vec![
                KernelRouteSpec { dst: "10.244.0.0/16".parse().unwrap(), gateways: vec![], metric: 0, kernel: false },
                KernelRouteSpec { dst: "10.9.0.0/24".parse().unwrap(), gateways: vec![], metric: 0, kernel: true },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn incremental_builds_say_what_a_fresh_full_build_says_through_random_changes() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut b = TableBuilder::new();
        let mut spec = globals(0);
        let mut variant = 0;
        let mut next_name = 0;
        let (mut incremental, mut errors) = (0, 0);
        let mut prev: Option<Tables> = None;
        for step in 0..600 {
            let mut next = spec.clone();
            match rng.next(10) {
                // Add a service (kept in name order, as a translator emits them).
                0 | 1 => {
                    next_name += 1;
                    let s = service(&format!("ns/s{next_name:04}"), u8::try_from(rng.next(200) + 1).unwrap(), &mut rng);
                    let at = next.services.partition_point(|x| x.name < s.name);
                    next.services.insert(at, Arc::new(s));
                }
                // Remove one.
                2 if !next.services.is_empty() => {
                    let i = rng.next(next.services.len() as u64) as usize;
                    next.services.remove(i);
                }
                // Redo one (new backends, weights, frontends, scheduler).
                3..=7 if !next.services.is_empty() => {
                    let i = rng.next(next.services.len() as u64) as usize;
                    let name = next.services[i].name.clone();
                    let vip = u8::try_from(rng.next(200) + 1).unwrap();
                    next.services[i] = Arc::new(service(&name, vip, &mut rng));
                }
                // An equal copy under a new Arc: a change that changes nothing.
                8 if !next.services.is_empty() => {
                    let i = rng.next(next.services.len() as u64) as usize;
                    next.services[i] = Arc::new((*next.services[i]).clone());
                }
                // The neighbours change: a full build.
                _ => {
                    variant = 1 - variant;
                    let g = globals(variant);
                    next.neighbours = g.neighbours;
                }
            }
            let fresh = TableBuilder::new().build(&next);
            let got = b.build(&next);
            match (fresh, got) {
                (Ok(f), Ok(g)) => {
                    assert_eq!(describe(&g), describe(&f), "step {step}: {:?}", b.last_build());
                    if matches!(b.last_build(), BuildKind::Incremental { .. }) {
                        incremental += 1;
                        // Services not redone are the previous snapshot's own.
                        let p = prev.as_ref().unwrap();
                        let changed = b.changed_ids().unwrap();
                        for s in g.services.iter().filter(|s| changed.binary_search(&s.id).is_err()) {
                            let old = p.services.slots.get(s.id as usize).unwrap().as_ref().unwrap();
                            let new = g.services.slots.get(s.id as usize).unwrap().as_ref().unwrap();
                            assert!(Arc::ptr_eq(old, new), "step {step}: {} was not redone", s.name);
                        }
                    }
                    prev = Some(g);
                    spec = next;
                }
                (Err(f), Err(_)) => {
                    // Both refuse (a frontend collision); the builder keeps its last tables.
                    errors += 1;
                    let again = b.build(&spec).unwrap();
                    assert_eq!(describe(&again), describe(prev.as_ref().unwrap()), "step {step}: after {f}");
                }
                (f, g) => panic!("step {step}: fresh {:?}, incremental {:?}", f.map(|_| ()), g.map(|_| ())),
            }
        }
        assert!(incremental > 300, "{incremental} incremental builds");
        assert!(errors > 5, "{errors} refused builds");
    }

    #[test]
    fn a_fresh_build_says_what_inserting_every_service_into_an_empty_snapshot_says() {
        // A full build makes its maps whole (`KeyMap::extend_absent`) and its per-service
        // pieces in one pass; an incremental build from an empty spec puts the same services
        // in one key at a time. 3,000 random services: shared endpoints and node addresses,
        // every scheduler, DSR and NAT, unresolved next hops.
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut spec = globals(0);
        let mut b = TableBuilder::new();
        b.build(&spec).unwrap();
        assert_eq!(b.last_build(), BuildKind::Full);
        let mut used = HashSet::new();
        let mut own = 0u32;
        for i in 0..3000u32 {
            let mut s = service(&format!("ns/s{i:05}"), 1, &mut rng);
            // Unique frontends: the ClusterIP from the service's number.
            s.frontends[0].addr = format!("10.96.{}.{}", i / 250, i % 250 + 1).parse().unwrap();
            s.frontends.retain(|f| f.kind != FrontendKind::ExternalIp || used.insert(f.addr));
            if let Some(f) = s.frontends.get_mut(1).filter(|f| f.kind == FrontendKind::NodePort) {
                f.port = 30000 + u16::try_from(i % 2000).unwrap();
                if !used.insert(IpAddr::from([0, 0, (f.port >> 8) as u8, f.port as u8])) {
                    s.frontends.truncate(1);
                }
            }
            // Half the backends the service's own, with no neighbour entry (the others from the
            // small shared pool).
            for be in s.backends.iter_mut().skip(1).step_by(2) {
                be.addr = format!("10.244.{}.{}", 1 + own / 250, own % 250 + 1).parse().unwrap();
                own += 1;
            }
            spec.services.push(Arc::new(s));
        }
        let incremental = b.build(&spec).unwrap();
        assert_eq!(b.last_build(), BuildKind::Incremental { upserted: 3000, removed: 0 });
        let mut fresh_builder = TableBuilder::new();
        let fresh = fresh_builder.build(&spec).unwrap();
        assert_eq!(fresh_builder.last_build(), BuildKind::Full);
        assert!(
            fresh.endpoints.len() > 1000 && fresh.unresolved.len() > 1000 && fresh.vip_addrs.len() >= 3000,
            "{} endpoints, {} unresolved, {} addresses",
            fresh.endpoints.len(),
            fresh.unresolved.len(),
            fresh.vip_addrs.len()
        );
        assert_eq!(describe(&fresh), describe(&incremental));
        let mut one_thread = TableBuilder::new();
        one_thread.set_build_threads(1);
        assert_eq!(describe(&one_thread.build(&spec).unwrap()), describe(&fresh), "one thread or two: the same");
        // The maps look up the same keys.
        for (k, e) in incremental.vips.iter() {
            assert_eq!(fresh.vips.get(k).map(|f| &*f.svc.name), Some(&*e.svc.name));
        }
        assert!(incremental.endpoints.iter().all(|k| fresh.endpoints.contains(k)));
        assert!(incremental.unresolved.iter().all(|a| fresh.unresolved.contains(a)));
        assert!(incremental.vip_addrs.iter().all(|(a, k)| fresh.vip_addrs.get(a) == Some(k)));
        // And a change after either build comes out the same.
        let s = Arc::make_mut(&mut spec.services[1234]);
        s.backends.clear();
        assert_eq!(describe(&b.build(&spec).unwrap()), describe(&fresh_builder.build(&spec).unwrap()));
        assert!(matches!(fresh_builder.last_build(), BuildKind::Incremental { upserted: 1, .. }));
    }

    #[test]
    fn one_changed_service_leaves_the_rest_of_the_snapshot_shared() {
        let mut rng = Rng(7);
        let services: Vec<Arc<ServiceSpec>> = (0..2000)
            .map(|i| {
                let mut s = service(&format!("ns/s{i:05}"), 1, &mut rng);
                s.frontends = vec![Frontend::new(
                    format!("10.96.{}.{}", i / 250, i % 250).parse().unwrap(),
                    L4Proto::Tcp,
                    80,
                    FrontendKind::ClusterIp,
                    false,
                )];
                s.backends = (0..10)
                    .map(|j| {
                        BackendSpec::ready(format!("10.{}.{}.{}", 100 + i / 250, i % 250, j + 1).parse().unwrap(), 80)
                    })
                    .collect();
                Arc::new(s)
            })
            .collect();
        let mut spec = TablesSpec { services, ..Default::default() };
        let mut b = TableBuilder::new();
        let t1 = b.build(&spec).unwrap();
        assert_eq!(b.last_build(), BuildKind::Full);
        let s = Arc::make_mut(&mut spec.services[1234]);
        s.backends[3].addr = "10.200.0.1".parse().unwrap();
        let t2 = b.build(&spec).unwrap();
        assert_eq!(b.last_build(), BuildKind::Incremental { upserted: 1, removed: 0 });
        assert_eq!(b.changed_ids(), Some(&[t2.services.iter().find(|s| &*s.name == "ns/s01234").unwrap().id][..]));
        assert_eq!(t2.services.shared_with(&t1.services), 1999);
        assert!(t2.backends.shared_chunks(&t1.backends) >= t1.backends.chunk_count() - 2);
        // The changed service's frontend is taken out and put back: its one shard is copied.
        assert!(t2.vips.shared_shards(&t1.vips) >= t1.vips.shard_count() - 1);
        assert!(t2.endpoints.len() == t1.endpoints.len());
        // Of its steered endpoints only the one that changed leaves and comes in: at most the
        // two shards of those keys are copied, not one per backend of the Service.
        let (old, new) = (endpoint_key("10.104.234.4"), endpoint_key("10.200.0.1"));
        assert!(t1.endpoints.contains(&old) && !t2.endpoints.contains(&old) && t2.endpoints.contains(&new));
        assert!(t1.endpoints.shard_count() > 100, "{} shards", t1.endpoints.shard_count());
        assert!(t2.endpoints.shared_shards(&t1.endpoints) >= t1.endpoints.shard_count() - 2);
        // So with the next hops waiting for a neighbour (here every backend's: the spec has none).
        assert!(t1.unresolved.len() == 20_000 && t2.unresolved.len() == 20_000);
        assert!(t2.unresolved.shared_shards(&t1.unresolved) >= t1.unresolved.shard_count() - 2);
        let fresh = TableBuilder::new().build(&spec).unwrap();
        assert_eq!(describe(&t2), describe(&fresh));
        let tuple = |k: &VipKey| (k.addr, k.port, k.proto);
        assert_eq!(sorted(t2.endpoints.iter().map(tuple)), sorted(fresh.endpoints.iter().map(tuple)));
        assert_eq!(sorted(t2.unresolved.iter().copied()), sorted(fresh.unresolved.iter().copied()));
    }

    /// The steered-endpoint key of a backend at `addr` port 80 behind a TCP frontend.
    fn endpoint_key(addr: &str) -> VipKey {
        VipKey { addr: mapped(addr.parse().unwrap()), port: 80, proto: L4Proto::Tcp as u8 }
    }

    fn sorted<T: Ord>(it: impl Iterator<Item = T>) -> Vec<T> {
        let mut v: Vec<T> = it.collect();
        v.sort_unstable();
        v
    }
}
