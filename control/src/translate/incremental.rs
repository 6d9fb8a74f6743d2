//! [`Translator::update`]: the translation kept up to date change by change (SYNC-03), in
//! O(changed Services) instead of O(all Services).
//!
//! The result is always the one [`super::build_spec`] gives for the same objects (pinned by a
//! differential test). What makes that exact across Services is a claims map: every table
//! name and every frontend (address, protocol, port) lists the specs that claim it, in
//! Service order; the first claimant owns it, exactly as the sequential pass of
//! `build_spec` decides. A change updates the claims of the changed Services and assembles
//! again every Service whose outcome may depend on them: the changed ones, those that gain or
//! lose a table name, and all claimants of a frontend whose owner changed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use dataplane::tables::{KernelRouteSpec, L4Proto, NeighbourSpec, ServiceSpec, TablesSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{
    Cached, Ctx, Family, FastMap, Issue, NoLocalEndpoints, NodeInfo, Pending, TranslateError, TranslateReport,
    Translator, Versions, frontend_taken, globals, maglev_overflow, name_taken, needs_snat, par_map, snat_missing,
    translate_service,
};
use crate::cluster::{Changes, ClusterIndex, ServiceRef};
use crate::config::Config;

/// A Service as the claims maps name it (shared, so a claim costs no string copies).
type Key = Arc<ServiceRef>;
/// A frontend: (address, protocol, port), the address canonical ([`fe_key`]).
type FeKey = (IpAddr, L4Proto, u16);
/// A table-name claim: (Service, index of the spec in its translation).
type NamePos = (Key, usize);
/// A frontend claim: (Service, spec index, frontend index).
type FePos = (Key, usize, usize);
/// A Service's new translation: the versions it was made from and the result; `None` when the
/// Service is gone.
type Fresh = Option<(Option<Versions>, Cached)>;

/// What the host (not the cluster) contributes to the tables: filled in by `xlb run` from the
/// kernel, kept by the [`Translator`] and laid over its translated spec, so a change of
/// Services does not read the kernel again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Per port (index into the config's `interfaces`): the interface's MAC and MTU (bytes);
    /// ports without an entry keep the placeholders (MAC zero, MTU
    /// [`super::PLACEHOLDER_MTU`]).
    pub ports: Vec<([u8; 6], u16)>,
    /// The kernel's neighbours on the served interfaces (`RTM_GETNEIGH`); an address the
    /// config's `neighbours` already lists keeps the config's entry.
    pub neighbours: Vec<NeighbourSpec>,
    /// The kernel's routes ([`TablesSpec::kernel_routes`]).
    pub kernel_routes: Vec<KernelRouteSpec>,
    /// `net.ipv4.fib_multipath_hash_policy` is 1 ([`TablesSpec::multipath_l4`]).
    pub multipath_l4: bool,
}

impl HostFacts {
    /// Lays these facts over `spec`'s translated host fields (ports' MAC and MTU, neighbours
    /// after the config's, kernel routes, multipath hashing). `spec.neighbours` must hold the
    /// translation's (config) neighbours only.
    pub fn apply(&self, spec: &mut TablesSpec) {
        for (p, (mac, mtu)) in spec.ports.iter_mut().zip(&self.ports) {
            p.mac = *mac;
            p.mtu = *mtu;
        }
        let have: std::collections::HashSet<IpAddr> = spec.neighbours.iter().map(|n| n.addr).collect();
        spec.neighbours.extend(self.neighbours.iter().filter(|n| !have.contains(&n.addr)).copied());
        spec.kernel_routes.clone_from(&self.kernel_routes);
        spec.multipath_l4 = self.multipath_l4;
    }
}

/// What one [`Translator::update`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// Everything was assembled again: the first update, a change of the config, this node's
    /// Node (name, zone, addresses) or the host's addresses, or a [`Changes::Full`] in which
    /// more than an eighth of the Services (and more than 64) changed; a smaller
    /// [`Changes::Full`] is applied like a change of the Services whose objects' versions
    /// moved.
    pub full: bool,
    /// Services translated from their objects.
    pub translated: usize,
    /// Services whose specs were assembled again (translated ones, and those a frontend or
    /// table-name claim of a changed Service affects; all of them when `full`).
    pub assembled: usize,
    /// Services removed.
    pub removed: usize,
}

/// What a translation depends on besides each Service's own objects.
#[derive(Debug, Clone, PartialEq)]
struct Basis {
    cfg: Config,
    node: NodeInfo,
    node_issues: Vec<Issue>,
    node_port_addrs: Vec<IpAddr>,
}

/// One Service's translation and what its assembly contributed to the report.
#[derive(Debug)]
struct Entry {
    key: Key,
    versions: Option<Versions>,
    cached: Cached,
    /// Issues in the report because of this Service (translation and assembly).
    issues: Vec<Issue>,
    /// Output specs needing a SNAT address, per family (v4, v6).
    snat: [usize; 2],
}

impl Entry {
    fn pendings(&self) -> &[Pending] {
        self.cached.result.as_deref().unwrap_or_default()
    }
}

/// The state of [`Translator::update`].
#[derive(Debug, Default)]
pub(super) struct Incremental {
    basis: Option<Basis>,
    entries: FastMap<ServiceRef, Entry>,
    /// Table name -> claimants in Service order (sorted; usually one).
    names: FastMap<String, Vec<NamePos>>,
    /// Frontend -> claimants in order, from specs that own their table name.
    fronts: FastMap<FeKey, Vec<FePos>>,
    /// Every reported issue with the number of contributions (the report lists each once).
    issues: BTreeMap<Issue, usize>,
    no_local: NoLocalEndpoints,
    snat_need: [usize; 2],
    /// The output; `services` sorted by Service, then as translated.
    spec: TablesSpec,
    /// `owners[i]`: the Service of `spec.services[i]`.
    owners: Vec<Key>,
    /// The translated host fields (before [`HostFacts`]).
    base: TablesSpec,
    host: HostFacts,
}

fn sorted_insert<T: Ord>(v: &mut Vec<T>, x: T) {
    let i = v.partition_point(|y| *y < x);
    v.insert(i, x);
}

fn sorted_remove<T: Ord>(v: &mut Vec<T>, x: &T) {
    if let Ok(i) = v.binary_search(x) {
        v.remove(i);
    }
}

fn add_counts(to: &mut [usize; 2], n: [usize; 2]) {
    for (t, n) in to.iter_mut().zip(n) {
        *t += n;
    }
}

fn sub_counts(from: &mut [usize; 2], n: [usize; 2]) {
    for (t, n) in from.iter_mut().zip(n) {
        *t = t.saturating_sub(n);
    }
}

/// A frontend's claim key, as the dataplane keys frontends: an IPv4-mapped IPv6 address is its
/// IPv4 address.
fn fe_key(f: &dataplane::tables::Frontend) -> FeKey {
    (f.addr.to_canonical(), f.proto, f.port)
}

fn family_index(f: Family) -> usize {
    match f {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

/// The objects of Service `r` and its translation.
fn translate_one(index: &ClusterIndex, r: &ServiceRef, ctx: &Ctx<'_>) -> Option<(Option<Versions>, Cached)> {
    let svc = index.service(r)?;
    let slices: Vec<&EndpointSlice> = index.slices_of(r).map(|s| &**s).collect();
    let mut own = TranslateReport::default();
    let result = translate_service(svc, &slices, ctx, &format!("Service {r}"), &mut own);
    Some((Versions::of(svc, &slices), Cached { result, issues: own.issues, no_local: own.no_local_endpoints }))
}

/// Whether `e` is the translation of Service `r`'s current objects.
fn up_to_date(index: &ClusterIndex, r: &ServiceRef, e: &Entry) -> bool {
    let Some(svc) = index.service(r) else { return false };
    let Some(v) = &e.versions else { return false };
    let slices: Vec<&EndpointSlice> = index.slices_of(r).map(|s| &**s).collect();
    v.matches(svc, &slices)
}

impl Incremental {
    fn name_owner(&self, name: &str) -> Option<&NamePos> {
        self.names.get(name).and_then(|v| v.first())
    }

    fn fe_owner(&self, k: &FeKey) -> Option<&FePos> {
        self.fronts.get(k).and_then(|v| v.first())
    }

    fn add_name(&mut self, name: &str, pos: NamePos) {
        match self.names.get_mut(name) {
            Some(v) => sorted_insert(v, pos),
            None => {
                self.names.insert(name.to_owned(), vec![pos]);
            }
        }
    }

    fn remove_name(&mut self, name: &str, pos: &NamePos) {
        if let Some(v) = self.names.get_mut(name) {
            sorted_remove(v, pos);
            if v.is_empty() {
                self.names.remove(name);
            }
        }
    }

    /// Adds (`add`) or removes the frontend claims of spec `p` at `(key, i)`, noting in
    /// `before` each frontend's owner before its first change.
    fn claim_fronts(
        &mut self,
        p: &ServiceSpec,
        key: &Key,
        i: usize,
        add: bool,
        before: &mut FastMap<FeKey, Option<FePos>>,
    ) {
        for (j, f) in p.frontends.iter().enumerate() {
            let k = fe_key(f);
            if let std::collections::hash_map::Entry::Vacant(v) = before.entry(k) {
                v.insert(self.fe_owner(&k).cloned());
            }
            let pos = (Arc::clone(key), i, j);
            if add {
                sorted_insert(self.fronts.entry(k).or_default(), pos);
            } else if let Some(v) = self.fronts.get_mut(&k) {
                sorted_remove(v, &pos);
                if v.is_empty() {
                    self.fronts.remove(&k);
                }
            }
        }
    }

    /// The specs of Service `key` given the claims, with its issues and SNAT needs: the
    /// per-Service body of `build_spec`'s sequential pass.
    fn assemble_one(&self, key: &Key, cfg: &Config) -> (Vec<Arc<ServiceSpec>>, Vec<Issue>, [usize; 2]) {
        let Some(e) = self.entries.get(&**key) else { return (Vec::new(), Vec::new(), [0; 2]) };
        let mut issues = e.cached.issues.clone();
        let mut out = Vec::new();
        let mut snat = [0; 2];
        let label = || format!("Service {key}");
        let pendings = match &e.cached.result {
            Ok(p) => p,
            Err(issue) => {
                issues.push(issue.clone());
                return (out, issues, snat);
            }
        };
        let off_cluster = !self.base.cluster_cidrs.is_empty();
        for (i, Pending { spec: p, fields }) in pendings.iter().enumerate() {
            if self.name_owner(&p.name).is_none_or(|(k, pi)| !(Arc::ptr_eq(k, key) && *pi == i)) {
                issues.push(name_taken(label(), &p.name));
                continue;
            }
            let mut kept = Vec::with_capacity(p.frontends.len());
            for (j, (f, field)) in p.frontends.iter().zip(fields).enumerate() {
                match self.fe_owner(&fe_key(f)) {
                    Some((k, oi, oj)) if Arc::ptr_eq(k, key) && *oi == i && *oj == j => kept.push(f),
                    Some((k, oi, _)) => {
                        let owner = self
                            .entries
                            .get(&**k)
                            .and_then(|o| o.pendings().get(*oi))
                            .map_or("", |o| o.spec.name.as_str());
                        issues.push(frontend_taken(label(), field, f, owner));
                    }
                    // Every frontend of a name owner is claimed; not reached.
                    None => kept.push(f),
                }
            }
            if kept.is_empty() {
                continue;
            }
            if let Some(issue) = maglev_overflow(p, cfg, label) {
                issues.push(issue);
                continue;
            }
            let spec = if kept.len() == p.frontends.len() {
                Arc::clone(p)
            } else {
                let frontends = kept.into_iter().cloned().collect();
                Arc::new(ServiceSpec { frontends, ..ServiceSpec::clone(p) })
            };
            for fam in [Family::V4, Family::V6] {
                snat[family_index(fam)] += usize::from(needs_snat(&spec, fam, off_cluster));
            }
            out.push(spec);
        }
        (out, issues, snat)
    }

    fn add_issues(&mut self, issues: &[Issue]) {
        for i in issues {
            *self.issues.entry(i.clone()).or_default() += 1;
        }
    }

    fn remove_issues(&mut self, issues: &[Issue]) {
        for i in issues {
            if let Some(n) = self.issues.get_mut(i) {
                *n -= 1;
                if *n == 0 {
                    self.issues.remove(i);
                }
            }
        }
    }

    /// The run of `spec.services` that Service `r` owns.
    fn run_of(&self, r: &ServiceRef) -> std::ops::Range<usize> {
        let start = self.owners.partition_point(|o| **o < *r);
        let len = self.owners.get(start..).map_or(0, |rest| rest.partition_point(|o| **o == *r));
        start..start + len
    }

    /// Assembles Service `key` again and puts the result in place: issues, SNAT counts and its
    /// run of `spec.services` (specs equal to the ones there keep their `Arc`).
    fn reassemble(&mut self, key: &Key, cfg: &Config) {
        let (mut out, issues, snat) = self.assemble_one(key, cfg);
        let run = self.run_of(key);
        if let Some(old) = self.spec.services.get(run.clone()) {
            // Table names are unique in the output: an equal spec of the same name keeps its
            // `Arc` even when an earlier spec of the Service came or went.
            for spec in &mut out {
                if let Some(o) = old.iter().find(|o| o.name == spec.name)
                    && (Arc::ptr_eq(o, spec) || **o == **spec)
                {
                    *spec = Arc::clone(o);
                }
            }
        }
        if out.len() == run.len() {
            if let Some(slots) = self.spec.services.get_mut(run) {
                for (slot, s) in slots.iter_mut().zip(out) {
                    if !Arc::ptr_eq(slot, &s) {
                        *slot = s;
                    }
                }
            }
        } else {
            let n = out.len();
            self.spec.services.splice(run.clone(), out);
            self.owners.splice(run, std::iter::repeat_n(Arc::clone(key), n));
        }
        let old = self.entries.get_mut(&**key).map(|e| {
            let old_issues = std::mem::replace(&mut e.issues, issues.clone());
            let old_snat = std::mem::replace(&mut e.snat, snat);
            (old_issues, old_snat)
        });
        if let Some((old_issues, old_snat)) = old {
            self.remove_issues(&old_issues);
            sub_counts(&mut self.snat_need, old_snat);
        }
        self.add_issues(&issues);
        add_counts(&mut self.snat_need, snat);
    }

    /// Translates and assembles everything (reusing translations whose objects kept their
    /// resourceVersions when the basis is the same).
    fn full(&mut self, index: &ClusterIndex, basis: Basis, threads: usize) -> UpdateStats {
        let mut stats = UpdateStats { full: true, ..UpdateStats::default() };
        if self.basis.as_ref() != Some(&basis) {
            self.entries.clear();
        }
        let ctx = Ctx { cfg: &basis.cfg, node: &basis.node, node_port_addrs: &basis.node_port_addrs };
        let refs: Vec<&ServiceRef> = index.services().map(|(r, _)| r).collect();
        let stale: Vec<&ServiceRef> =
            refs.iter().copied().filter(|r| self.entries.get(*r).is_none_or(|e| !up_to_date(index, r, e))).collect();
        let translated = par_map(stale.len(), threads, |i| stale.get(i).and_then(|r| translate_one(index, r, &ctx)));
        stats.translated = stale.len();
        let mut old = std::mem::take(&mut self.entries);
        stats.removed = old.keys().filter(|r| index.service(r).is_none()).count();
        let mut fresh = stale.iter().zip(translated).peekable();
        let mut entries = FastMap::default();
        entries.reserve(refs.len());
        let mut order: Vec<Key> = Vec::with_capacity(refs.len());
        for r in &refs {
            let new = fresh.next_if(|(s, _)| std::ptr::eq(**s, *r)).and_then(|(_, t)| t);
            let entry = match (new, old.remove(*r)) {
                (Some((versions, cached)), _) => {
                    Entry { key: Arc::new((*r).clone()), versions, cached, issues: Vec::new(), snat: [0; 2] }
                }
                (None, Some(e)) => Entry { issues: Vec::new(), snat: [0; 2], ..e },
                (None, None) => continue, // not reached: every stale Service was translated
            };
            order.push(Arc::clone(&entry.key));
            entries.insert((*r).clone(), entry);
        }
        self.entries = entries;
        self.names.clear();
        self.fronts.clear();
        self.issues.clear();
        self.no_local = NoLocalEndpoints::default();
        self.snat_need = [0; 2];
        self.spec.services.clear();
        self.owners.clear();
        for key in &order {
            let names: Vec<(String, usize)> =
                self.entries[&**key].pendings().iter().enumerate().map(|(i, p)| (p.spec.name.clone(), i)).collect();
            for (name, i) in names {
                // In order: each claim goes at the end.
                self.names.entry(name).or_default().push((Arc::clone(key), i));
            }
        }
        for key in &order {
            let specs: Vec<Arc<ServiceSpec>> =
                self.entries[&**key].pendings().iter().map(|p| Arc::clone(&p.spec)).collect();
            for (i, p) in specs.iter().enumerate() {
                if self.name_owner(&p.name).is_some_and(|(k, pi)| Arc::ptr_eq(k, key) && *pi == i) {
                    for (j, f) in p.frontends.iter().enumerate() {
                        self.fronts.entry(fe_key(f)).or_default().push((Arc::clone(key), i, j));
                    }
                }
            }
        }
        for key in &order {
            let (out, issues, snat) = self.assemble_one(key, &basis.cfg);
            let e = self.entries.get_mut(&**key);
            let no_local = e.as_ref().map(|e| e.cached.no_local).unwrap_or_default();
            if let Some(e) = e {
                e.issues.clone_from(&issues);
                e.snat = snat;
            }
            self.add_issues(&issues);
            self.no_local.internal += no_local.internal;
            self.no_local.external += no_local.external;
            add_counts(&mut self.snat_need, snat);
            self.owners.extend(std::iter::repeat_n(Arc::clone(key), out.len()));
            self.spec.services.extend(out);
        }
        stats.assembled = order.len();
        let node_issues = basis.node_issues.clone();
        self.add_issues(&node_issues);
        self.base = globals(&basis.cfg, &basis.node);
        self.basis = Some(basis);
        self.apply_host();
        stats
    }

    /// The Services whose translation is not that of their current objects (changed,
    /// unversioned, added), and those translated that are gone: what a
    /// [`Changes::Full`] of the same basis must redo. O(Services).
    fn stale(&self, index: &ClusterIndex) -> BTreeSet<ServiceRef> {
        let mut set: BTreeSet<ServiceRef> = index
            .services()
            .filter(|(r, _)| self.entries.get(*r).is_none_or(|e| !up_to_date(index, r, e)))
            .map(|(r, _)| r.clone())
            .collect();
        set.extend(self.entries.keys().filter(|r| index.service(r).is_none()).cloned());
        set
    }

    /// Applies the changes of the Services in `set`.
    fn partial(&mut self, index: &ClusterIndex, set: &BTreeSet<ServiceRef>) -> UpdateStats {
        let mut stats = UpdateStats::default();
        let Some(basis) = self.basis.take() else { return stats };
        let ctx = Ctx { cfg: &basis.cfg, node: &basis.node, node_port_addrs: &basis.node_port_addrs };
        // 1. The new translations (`None`: removed), in Service order.
        let mut changed: Vec<(Key, Fresh)> = Vec::new();
        for r in set {
            let old = self.entries.get(r);
            match index.service(r) {
                None => {
                    if let Some(e) = old {
                        changed.push((Arc::clone(&e.key), None));
                    }
                }
                Some(_) => {
                    if old.is_some_and(|e| up_to_date(index, r, e)) {
                        continue;
                    }
                    let key = old.map_or_else(|| Arc::new(r.clone()), |e| Arc::clone(&e.key));
                    changed.push((key, translate_one(index, r, &ctx)));
                    stats.translated += 1;
                }
            }
        }
        if changed.is_empty() {
            self.basis = Some(basis);
            return stats;
        }
        let changed_keys: Vec<Key> = changed.iter().map(|(k, _)| Arc::clone(k)).collect();
        let is_changed = |r: &ServiceRef| changed_keys.binary_search_by(|k| (**k).cmp(r)).is_ok();
        let new_pendings = |t: &Fresh| -> Vec<Pending> {
            t.as_ref().and_then(|(_, c)| c.result.as_ref().ok()).cloned().unwrap_or_default()
        };
        // 2. Owners of the table names involved, before.
        let mut name_before: FastMap<String, Option<NamePos>> = FastMap::default();
        for (key, new) in &changed {
            let old = self.entries.get(&**key).map(|e| e.pendings().to_vec()).unwrap_or_default();
            for p in old.iter().chain(&new_pendings(new)) {
                if !name_before.contains_key(&p.spec.name) {
                    let owner = self.name_owner(&p.spec.name).cloned();
                    name_before.insert(p.spec.name.clone(), owner);
                }
            }
        }
        // 3. The changed Services' old claims go.
        let mut fe_before: FastMap<FeKey, Option<FePos>> = FastMap::default();
        for (key, _) in &changed {
            let old = self.entries.get(&**key).map(|e| e.pendings().to_vec()).unwrap_or_default();
            for (i, p) in old.iter().enumerate() {
                let owned = name_before
                    .get(&p.spec.name)
                    .and_then(Option::as_ref)
                    .is_some_and(|(k, pi)| Arc::ptr_eq(k, key) && *pi == i);
                if owned {
                    self.claim_fronts(&p.spec, key, i, false, &mut fe_before);
                }
                self.remove_name(&p.spec.name, &(Arc::clone(key), i));
            }
        }
        // 4. Their new table-name claims.
        for (key, new) in &changed {
            for (i, p) in new_pendings(new).iter().enumerate() {
                self.add_name(&p.spec.name, (Arc::clone(key), i));
            }
        }
        // 5. Unchanged Services that lose or win a table name lose or gain its frontends.
        let mut dirty: BTreeSet<Key> = BTreeSet::new();
        for (name, before) in &name_before {
            let after = self.name_owner(name).cloned();
            if *before == after {
                continue;
            }
            for (pos, add) in [(before, false), (&after, true)] {
                let Some((k, i)) = pos else { continue };
                if is_changed(k) {
                    continue;
                }
                let spec = self.entries.get(&**k).and_then(|e| e.pendings().get(*i)).map(|p| Arc::clone(&p.spec));
                if let Some(spec) = spec {
                    self.claim_fronts(&spec, k, *i, add, &mut fe_before);
                }
                dirty.insert(Arc::clone(k));
            }
        }
        // 6. The changed Services' new frontend claims (of the specs that own their name).
        for (key, new) in &changed {
            for (i, p) in new_pendings(new).iter().enumerate() {
                if self.name_owner(&p.spec.name).is_some_and(|(k, pi)| Arc::ptr_eq(k, key) && *pi == i) {
                    self.claim_fronts(&p.spec, key, i, true, &mut fe_before);
                }
            }
        }
        // 7. The new translations replace the old ones; removed Services leave.
        for (key, new) in changed.iter_mut() {
            let old = self.entries.remove(&**key);
            if let Some(e) = &old {
                self.remove_issues(&e.issues);
                self.no_local.internal -= e.cached.no_local.internal;
                self.no_local.external -= e.cached.no_local.external;
                sub_counts(&mut self.snat_need, e.snat);
            }
            match new.take() {
                Some((versions, cached)) => {
                    self.no_local.internal += cached.no_local.internal;
                    self.no_local.external += cached.no_local.external;
                    let e = Entry { key: Arc::clone(key), versions, cached, issues: Vec::new(), snat: [0; 2] };
                    self.entries.insert((**key).clone(), e);
                    dirty.insert(Arc::clone(key));
                }
                None => {
                    stats.removed += 1;
                    let run = self.run_of(key);
                    self.spec.services.drain(run.clone());
                    self.owners.drain(run);
                }
            }
        }
        // 8. Every claimant of a frontend whose owner changed (or whose owner's Service
        // changed: its spec name may be another) is assembled again.
        for (k, before) in &fe_before {
            let after = self.fe_owner(k);
            if before.as_ref() == after && after.is_none_or(|(o, _, _)| !is_changed(o)) {
                continue;
            }
            for (o, _, _) in self.fronts.get(k).into_iter().flatten() {
                dirty.insert(Arc::clone(o));
            }
        }
        // 9. Assemble them again, in place.
        for key in &dirty {
            if self.entries.contains_key(&**key) {
                self.reassemble(key, &basis.cfg);
                stats.assembled += 1;
            }
        }
        self.basis = Some(basis);
        stats
    }

    /// The spec's host fields: the translation's, then the [`HostFacts`].
    fn apply_host(&mut self) {
        self.spec.ports.clone_from(&self.base.ports);
        self.spec.neighbours.clone_from(&self.base.neighbours);
        self.spec.routes.clone_from(&self.base.routes);
        self.spec.kernel_routes.clone_from(&self.base.kernel_routes);
        self.spec.multipath_l4 = self.base.multipath_l4;
        self.spec.snat_v4 = self.base.snat_v4;
        self.spec.snat_v6 = self.base.snat_v6;
        self.spec.dsr_source_v4 = self.base.dsr_source_v4;
        self.spec.dsr_source_v6 = self.base.dsr_source_v6;
        self.spec.maglev_max_size = self.base.maglev_max_size;
        self.spec.maglev_min_size = self.base.maglev_min_size;
        self.spec.cluster_cidrs.clone_from(&self.base.cluster_cidrs);
        self.host.apply(&mut self.spec);
    }

    fn report(&self) -> TranslateReport {
        let mut issues: Vec<Issue> = self.issues.keys().cloned().collect();
        for (fam, have) in [(Family::V4, self.spec.snat_v4.is_some()), (Family::V6, self.spec.snat_v6.is_some())] {
            if !have && self.snat_need[family_index(fam)] > 0 {
                issues.push(snat_missing(fam));
            }
        }
        issues.sort();
        issues.dedup();
        TranslateReport { issues, no_local_endpoints: self.no_local }
    }
}

/// A [`Changes::Full`] with the same config and node is applied as a partial update when at
/// most `1 / FULL_FRACTION` of the Services (or [`FULL_MIN`]) changed; more are translated on
/// several threads and assembled in one pass.
const FULL_FRACTION: usize = 8;
/// See [`FULL_FRACTION`].
const FULL_MIN: usize = 64;

impl Translator {
    /// Brings the translation kept by the translator ([`Translator::spec`]) up to date with
    /// `cluster` after `changes`, translating again only the Services `changes` names (and
    /// whose Service or EndpointSlice `resourceVersion`s differ from the ones translated) and
    /// assembling again only those and the Services whose frontends or table names they
    /// contend for. Every other Service keeps its `Arc<ServiceSpec>` (same pointer, same
    /// position in `spec().services`), so a `TableBuilder` that compares pointers skips it.
    ///
    /// Everything is assembled again ([`UpdateStats::full`]) on the first update and when
    /// `cfg`, this node's name, zone or addresses (from `cluster.node`) or `local_addresses`
    /// (the host's, see [`crate::cluster::ClusterState::local_addresses`]) differ from the previous
    /// update's; even then only Services whose objects' resourceVersions changed are
    /// translated again. [`Changes::Full`] (a relist, a periodic resync) compares every
    /// Service's resourceVersions with the translated ones and redoes those that differ
    /// (and those gone), assembling everything again only when they are many.
    ///
    /// `changes` must name every Service whose objects changed in `cluster` since the previous
    /// update (as [`crate::k8s::Snapshot::changes`] does); the result is then equal to
    /// [`super::build_spec`] of `cluster.to_state(local_addresses)`. Independent of
    /// [`Translator::build`] (whose cache it does not use).
    ///
    /// # Errors
    /// [`TranslateError`] for an invalid `cfg`; the kept translation is then left as it was
    /// and the next update is a full one.
    pub fn update(
        &mut self,
        cluster: &ClusterIndex,
        local_addresses: &[IpAddr],
        changes: &Changes,
        cfg: &Config,
    ) -> Result<UpdateStats, TranslateError> {
        if let Err(e) = cfg.validate() {
            self.incr.basis = None;
            return Err(TranslateError::Config { field: e.field, message: e.message });
        }
        let mut report = TranslateReport::default();
        let node = NodeInfo::new(cluster.node.as_ref(), local_addresses, cfg, &mut report);
        let same =
            self.incr.basis.as_ref().is_some_and(|b| b.cfg == *cfg && b.node == node && b.node_issues == report.issues);
        let stale = match changes {
            Changes::Full if same => Some(self.incr.stale(cluster)),
            _ => None,
        };
        let stats = match (changes, stale) {
            (Changes::Services(set), _) if same => self.incr.partial(cluster, set),
            // A full resync of the same basis (periodic, relist) in which few Services
            // changed: the partial path over them gives the same result without assembling
            // every Service again.
            (_, Some(set)) if set.len() <= (self.incr.entries.len() / FULL_FRACTION).max(FULL_MIN) => {
                self.incr.partial(cluster, &set)
            }
            _ => {
                let node_port_addrs = node.node_port_addresses(cfg);
                let basis = Basis { cfg: cfg.clone(), node, node_issues: report.issues, node_port_addrs };
                let threads = match self.threads {
                    0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
                    n => n,
                };
                self.incr.full(cluster, basis, threads)
            }
        };
        self.stats = super::TranslateStats {
            translated: stats.translated,
            reused: self.incr.entries.len().saturating_sub(stats.translated),
        };
        Ok(stats)
    }

    /// The tables kept by [`Translator::update`], with the [`HostFacts`] of
    /// [`Translator::set_host`] laid over them; empty before the first update.
    pub fn spec(&self) -> &TablesSpec {
        &self.incr.spec
    }

    /// The report of the translation kept by [`Translator::update`] (what [`super::build_spec`]
    /// reports for the same objects). Built on each call: O(issues), not O(Services).
    pub fn report(&self) -> TranslateReport {
        self.incr.report()
    }

    /// MET-04 counts of the kept translation (O(1)).
    pub fn no_local_endpoints(&self) -> NoLocalEndpoints {
        self.incr.no_local
    }

    /// Sets the host's contribution to [`Translator::spec`] (kept for later updates).
    pub fn set_host(&mut self, host: HostFacts) {
        if host != self.incr.host {
            self.incr.host = host;
            if self.incr.basis.is_some() {
                self.incr.apply_host();
            }
        }
    }
}

#[cfg(test)]
mod tests;
