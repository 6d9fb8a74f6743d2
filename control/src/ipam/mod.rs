//! Address pools for LoadBalancer Services and the allocator that assigns their addresses
//! (issue 12, part 1).
//!
//! # Where pools come from
//! One spec type, [`PoolSpec`], serves both places a pool can be declared:
//! - the cluster-scoped custom resource [`XlbIPPool`] (`xlb.dev/v1alpha1`, `kubectl get
//!   xlbippools`), what MetalLB users expect (MetalLB's `IPAddressPool`); its CRD YAML is
//!   generated from this type (`xlb crd`) and checked in as
//!   `deploy/kubernetes/crd-xlbippools.yaml`;
//! - the config's `addressPools:` list ([`AddressPool`]: a `name` plus the same fields), for
//!   standalone mode, where there is no API server to hold a custom resource.
//!
//! The spec is the subset of MetalLB's `IPAddressPool` spec (metallb.io/v1beta1,
//! <https://metallb.io/apis/#ipaddresspoolspec>) that means something without MetalLB's
//! announcement objects: `addresses`, `autoAssign`, `avoidBuggyIPs`, and
//! `serviceAllocation.{priority, namespaces, serviceSelectors}`. Left out:
//! `serviceAllocation.namespaceSelectors` (needs the Namespace objects, which xlb does not
//! watch) and MetalLB's sharing key (one address for several Services).
//!
//! # Addresses
//! Each `addresses` entry is a CIDR (`192.0.2.0/28`, `2001:db8::/120`; host bits must be
//! zero) or an inclusive range of one family (`192.0.2.10-192.0.2.20`). Entries of one pool,
//! and the pools of one [`PoolSet`], must not overlap (MetalLB refuses overlapping pools too).
//!
//! The allocator itself is [`assign`] (module `alloc`).

mod alloc;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use alloc::{
    ANNOTATION_ADDRESS_POOL, ANNOTATION_LOAD_BALANCER_IPS, AssignError, Assigned, Assignment, ClassFilter,
    METALLB_ADDRESS_POOL, METALLB_ADDRESS_POOL_OLD, METALLB_LOAD_BALANCER_IPS, METALLB_LOAD_BALANCER_IPS_OLD, Options,
    Outcome, ServiceKey, apply_to_service, assign, ingress_ips, is_ours,
};

/// The spec of an address pool: the body of an `XlbIPPool` custom resource and of each
/// config `addressPools[]` entry (there with a `name` beside it).
///
/// Field names and meanings follow MetalLB's `IPAddressPoolSpec` (metallb.io/v1beta1).
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "xlb.dev",
    version = "v1alpha1",
    kind = "XlbIPPool",
    plural = "xlbippools",
    shortname = "xlbpool",
    doc = "A pool of addresses xlb assigns to LoadBalancer Services of its class (cluster-scoped; MetalLB's IPAddressPool subset)",
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses"}"#,
    printcolumn = r#"{"name":"AutoAssign","type":"boolean","jsonPath":".spec.autoAssign"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    /// The pool's addresses: CIDRs (`192.0.2.0/28`, `2001:db8::/120`, host bits zero) or
    /// inclusive ranges of one family (`192.0.2.10-192.0.2.20`). MetalLB `spec.addresses`.
    pub addresses: Vec<String>,
    /// Whether Services that name neither this pool nor one of its addresses may get an
    /// address from it (default true). With false, only a Service that asks for the pool
    /// (annotation `xlb.dev/address-pool`) or for one of its addresses gets one. MetalLB
    /// `spec.autoAssign`.
    #[serde(default = "default_true")]
    pub auto_assign: bool,
    /// Never hand out IPv4 addresses ending in `.0` or `.255` automatically (some old
    /// firmware drops them; default false). An address asked for explicitly is still given.
    /// MetalLB `spec.avoidBuggyIPs`.
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Which Services may use the pool, and its priority. MetalLB `spec.serviceAllocation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocation>,
}

fn default_true() -> bool {
    true
}

/// `serviceAllocation`: restricts a pool to some Services and orders the pools a Service may
/// use. MetalLB `ServiceAllocation` (without `namespaceSelectors`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAllocation {
    /// Lower numbers are tried first; a pool without a priority comes after every pool with
    /// one. MetalLB `serviceAllocation.priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Only Services in these namespaces (empty: any namespace). MetalLB
    /// `serviceAllocation.namespaces`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Only Services whose labels match at least one of these selectors (empty: any
    /// Service). MetalLB `serviceAllocation.serviceSelectors`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
}

/// A label selector, as Kubernetes' `metav1.LabelSelector`: every `matchLabels` pair and every
/// `matchExpressions` requirement must hold; an empty selector matches every Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels the Service must carry with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements the Service's labels must meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry (`metav1.LabelSelectorRequirement`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: SelectorOperator,
    /// Values for `In` and `NotIn` (non-empty there); empty for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The operator of a [`LabelSelectorRequirement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum SelectorOperator {
    /// The label is present with one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let have = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => have.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => have.is_none_or(|v| !r.values.contains(v)),
                    SelectorOperator::Exists => have.is_some(),
                    SelectorOperator::DoesNotExist => have.is_none(),
                }
            })
    }
}

/// One config `addressPools[]` entry: a pool's `name` and its [`PoolSpec`] fields side by
/// side (`{name: public, addresses: [192.0.2.0/28]}`), as an [`XlbIPPool`] has
/// `metadata.name` and `spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AddressPool {
    /// The pool's name (what the `xlb.dev/address-pool` annotation names).
    pub name: String,
    /// The rest of the entry.
    #[serde(flatten)]
    pub spec: PoolSpec,
}

impl<'de> Deserialize<'de> for AddressPool {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        let name = match map.remove("name") {
            Some(serde_json::Value::String(s)) => s,
            Some(_) => return Err(D::Error::custom("name: must be a string")),
            None => return Err(D::Error::custom("missing field `name`")),
        };
        let spec = serde_path_to_error::deserialize::<_, PoolSpec>(serde_json::Value::Object(map)).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." { D::Error::custom(inner) } else { D::Error::custom(format!("{path}: {inner}")) }
        })?;
        Ok(Self { name, spec })
    }
}

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `a`.
    pub fn of(a: IpAddr) -> Self {
        if a.is_ipv4() { Self::V4 } else { Self::V6 }
    }
    /// `IPv4` or `IPv6`, as in `spec.ipFamilies`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
    fn to_addr(self, n: u128) -> IpAddr {
        match self {
            // Values of an IPv4 range never exceed u32::MAX (they come from IPv4 addresses).
            Self::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
            Self::V6 => IpAddr::V6(Ipv6Addr::from(n)),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn addr_to_u128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddrRange {
    /// Its family.
    pub family: Family,
    /// First address, as a number (IPv4 in the low 32 bits).
    first: u128,
    /// Last address (inclusive).
    last: u128,
}

impl AddrRange {
    /// The range from `first` to `last` inclusive; `None` if the families differ or
    /// `first > last`.
    pub fn new(first: IpAddr, last: IpAddr) -> Option<Self> {
        let (a, b) = (addr_to_u128(first), addr_to_u128(last));
        (Family::of(first) == Family::of(last) && a <= b).then_some(Self {
            family: Family::of(first),
            first: a,
            last: b,
        })
    }
    /// The first address.
    pub fn first(&self) -> IpAddr {
        self.family.to_addr(self.first)
    }
    /// The last address.
    pub fn last(&self) -> IpAddr {
        self.family.to_addr(self.last)
    }
    /// Whether `a` is in the range.
    pub fn contains(&self, a: IpAddr) -> bool {
        Family::of(a) == self.family && (self.first..=self.last).contains(&addr_to_u128(a))
    }
    /// Whether the two ranges share an address.
    pub fn overlaps(&self, o: &Self) -> bool {
        self.family == o.family && self.first <= o.last && o.first <= self.last
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first(), self.last())
    }
}

/// Parses one `addresses` entry: a CIDR with zero host bits or a range `A-B` of one family.
///
/// # Errors
/// A message saying what is wrong with the entry.
pub fn parse_addresses_entry(s: &str) -> Result<AddrRange, String> {
    let t = s.trim();
    if let Some((a, b)) = t.split_once('-') {
        let first: IpAddr = a.trim().parse().map_err(|_| format!("{:?} is not an IP address", a.trim()))?;
        let last: IpAddr = b.trim().parse().map_err(|_| format!("{:?} is not an IP address", b.trim()))?;
        if Family::of(first) != Family::of(last) {
            return Err(format!("{t:?} mixes IPv4 and IPv6"));
        }
        return AddrRange::new(first, last).ok_or_else(|| format!("{t:?}: the first address is after the last"));
    }
    let Some((a, l)) = t.split_once('/') else {
        return Err(format!("{t:?} is neither a CIDR (192.0.2.0/28) nor a range (192.0.2.10-192.0.2.20)"));
    };
    let addr: IpAddr = a.parse().map_err(|_| format!("{a:?} is not an IP address"))?;
    let bits: u32 = if addr.is_ipv4() { 32 } else { 128 };
    let len: u32 =
        l.parse().ok().filter(|&n| n <= bits).ok_or_else(|| format!("{t:?}: prefix length {l:?} is not 0..={bits}"))?;
    let n = addr_to_u128(addr);
    // The host part's mask: `bits - len` low bits (all 128 for `::/0`, where a shift would
    // overflow).
    let host = u128::MAX.checked_shr(128 - (bits - len)).unwrap_or(0);
    if n & host != 0 {
        let net = Family::of(addr).to_addr(n & !host);
        return Err(format!("{t:?} has host bits set; did you mean {net}/{len}?"));
    }
    Ok(AddrRange { family: Family::of(addr), first: n, last: n | host })
}

/// A field of a pool spec that is not valid: the field path inside the pool
/// (`addresses[2]`, `serviceAllocation.serviceSelectors[0].matchExpressions[1].values`) and
/// what is wrong. Config errors prefix the path with `addressPools[i].`, custom-resource
/// errors with `spec.`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PoolFieldError {
    /// Field path inside the pool spec.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn pool_err(field: impl Into<String>, message: impl Into<String>) -> PoolFieldError {
    PoolFieldError { field: field.into(), message: message.into() }
}

/// A validated pool, ready for the allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The pool's name (config `addressPools[].name`, or the XlbIPPool's `metadata.name`).
    pub name: String,
    /// Its address ranges, sorted, not overlapping.
    pub ranges: Vec<AddrRange>,
    /// `autoAssign`.
    pub auto_assign: bool,
    /// `avoidBuggyIPs`.
    pub avoid_buggy_ips: bool,
    /// `serviceAllocation.priority`.
    pub priority: Option<i32>,
    /// `serviceAllocation.namespaces`.
    pub namespaces: Vec<String>,
    /// `serviceAllocation.serviceSelectors`.
    pub selectors: Vec<LabelSelector>,
}

impl Pool {
    /// Validates `spec` as the pool `name`.
    ///
    /// # Errors
    /// [`PoolFieldError`] naming the first bad field (`name`, `addresses[i]`,
    /// `serviceAllocation...`).
    pub fn new(name: &str, spec: &PoolSpec) -> Result<Self, PoolFieldError> {
        if name.trim().is_empty() {
            return Err(pool_err("name", "must not be empty"));
        }
        if spec.addresses.is_empty() {
            return Err(pool_err("addresses", "must list at least one CIDR or range"));
        }
        let mut ranges: Vec<(AddrRange, usize)> = Vec::with_capacity(spec.addresses.len());
        for (i, s) in spec.addresses.iter().enumerate() {
            let r = parse_addresses_entry(s).map_err(|m| pool_err(format!("addresses[{i}]"), m))?;
            if let Some((o, j)) = ranges.iter().find(|(o, _)| o.overlaps(&r)) {
                return Err(pool_err(format!("addresses[{i}]"), format!("{r} overlaps addresses[{j}] ({o})")));
            }
            ranges.push((r, i));
        }
        let mut ranges: Vec<AddrRange> = ranges.into_iter().map(|(r, _)| r).collect();
        ranges.sort();
        let sa = spec.service_allocation.clone().unwrap_or_default();
        for (i, ns) in sa.namespaces.iter().enumerate() {
            if ns.trim().is_empty() {
                return Err(pool_err(format!("serviceAllocation.namespaces[{i}]"), "must not be empty"));
            }
        }
        for (i, sel) in sa.service_selectors.iter().enumerate() {
            for (j, r) in sel.match_expressions.iter().enumerate() {
                let f = format!("serviceAllocation.serviceSelectors[{i}].matchExpressions[{j}].values");
                match r.operator {
                    SelectorOperator::In | SelectorOperator::NotIn if r.values.is_empty() => {
                        return Err(pool_err(f, format!("must not be empty for operator {:?}", r.operator)));
                    }
                    SelectorOperator::Exists | SelectorOperator::DoesNotExist if !r.values.is_empty() => {
                        return Err(pool_err(f, format!("must be empty for operator {:?}", r.operator)));
                    }
                    _ => {}
                }
            }
        }
        Ok(Self {
            name: name.to_owned(),
            ranges,
            auto_assign: spec.auto_assign,
            avoid_buggy_ips: spec.avoid_buggy_ips,
            priority: sa.priority,
            namespaces: sa.namespaces,
            selectors: sa.service_selectors,
        })
    }

    /// Whether the pool holds `a`.
    pub fn contains(&self, a: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(a))
    }

    /// Whether the pool has addresses of family `f`.
    pub fn has_family(&self, f: Family) -> bool {
        self.ranges.iter().any(|r| r.family == f)
    }

    /// Whether a Service in `namespace` with `labels` may use the pool
    /// (`serviceAllocation.namespaces` and `serviceSelectors`; both must hold when both are set).
    pub fn allows(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && (self.selectors.is_empty() || self.selectors.iter().any(|s| s.matches(labels)))
    }

    /// Whether the pool is restricted to some Services.
    pub fn is_restricted(&self) -> bool {
        !self.namespaces.is_empty() || !self.selectors.is_empty()
    }

    /// The order pools are tried in for a Service that names none: by priority (lower first,
    /// none last), then restricted pools before open ones (MetalLB prefers a pool that
    /// selects the Service), then by name.
    fn order_key(&self) -> (i64, bool, &str) {
        (self.priority.map_or(i64::MAX, i64::from), !self.is_restricted(), self.name.as_str())
    }

    /// The lowest address of family `f` at or after `start` (all of them when `None`) for
    /// which `taken` is false and, with `avoidBuggyIPs`, that does not end in `.0` or `.255`;
    /// `None` when there is none.
    fn first_free(&self, f: Family, start: Option<IpAddr>, taken: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
        let from = start.filter(|a| Family::of(*a) == f).map_or(0, addr_to_u128);
        for r in self.ranges.iter().filter(|r| r.family == f && r.last >= from) {
            let mut n = r.first.max(from);
            loop {
                let a = f.to_addr(n);
                let buggy = self.avoid_buggy_ips && is_buggy(a);
                if !buggy && !taken(a) {
                    return Some(a);
                }
                if n == r.last {
                    break;
                }
                n += 1;
            }
        }
        None
    }
}

/// An IPv4 address ending in `.0` or `.255` (MetalLB's `avoidBuggyIPs` rule).
pub fn is_buggy(a: IpAddr) -> bool {
    matches!(a, IpAddr::V4(v) if matches!(v.octets()[3], 0 | 255))
}

/// The pools in force: validated, sorted by name, not overlapping.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSet {
    pools: Vec<Pool>,
}

/// A pool left out of a [`PoolSet`], with why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pool {pool:?}, field {field}: {message}")]
pub struct PoolRejected {
    /// The pool's name.
    pub pool: String,
    /// The field at fault inside the pool (`addresses[1]`, `name`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl PoolSet {
    /// Builds the set from `(name, spec)` pairs (any order). A pool that is invalid, whose
    /// name repeats an earlier one, or whose addresses overlap a pool earlier in name order is
    /// left out and returned in the second list; the others are used.
    pub fn build<'a>(specs: impl IntoIterator<Item = (&'a str, &'a PoolSpec)>) -> (Self, Vec<PoolRejected>) {
        let mut specs: Vec<(&str, &PoolSpec)> = specs.into_iter().collect();
        specs.sort_by(|a, b| a.0.cmp(b.0));
        let mut pools: Vec<Pool> = Vec::new();
        let mut rejected = Vec::new();
        for (name, spec) in specs {
            let reject = |field: String, message: String| PoolRejected { pool: name.to_owned(), field, message };
            if pools.iter().any(|p| p.name == name) {
                rejected.push(reject("name".into(), "a pool of this name is already defined".into()));
                continue;
            }
            let pool = match Pool::new(name, spec) {
                Ok(p) => p,
                Err(e) => {
                    rejected.push(reject(e.field, e.message));
                    continue;
                }
            };
            let clash = pool.ranges.iter().find_map(|r| {
                pools.iter().find_map(|p| p.ranges.iter().find(|o| o.overlaps(r)).map(|o| (r, p.name.as_str(), o)))
            });
            if let Some((r, other, o)) = clash {
                let i = spec.addresses.iter().position(|s| parse_addresses_entry(s).ok() == Some(*r)).unwrap_or(0);
                rejected.push(reject(format!("addresses[{i}]"), format!("{r} overlaps {o} of pool {other:?}")));
                continue;
            }
            pools.push(pool);
        }
        (Self { pools }, rejected)
    }

    /// The pools, sorted by name.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// Whether there are no pools.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// The pool holding `a`, if any.
    pub fn pool_of(&self, a: IpAddr) -> Option<&Pool> {
        self.pools.iter().find(|p| p.contains(a))
    }

    /// The pool named `name`.
    pub fn by_name(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }
}

/// Path of the checked-in CRD, relative to the repository root.
pub const CRD_PATH: &str = "deploy/kubernetes/crd-xlbippools.yaml";

/// The `CustomResourceDefinition` of [`XlbIPPool`] (`xlbippools.xlb.dev`, cluster-scoped,
/// version `v1alpha1`) as YAML, generated from [`PoolSpec`] by kube's `CustomResource`
/// derive (schemars). `xlb crd` prints it; [`CRD_PATH`] holds a copy that a test compares
/// with this.
///
/// # Errors
/// Only if the YAML serialiser fails, which it does not for this fixed object.
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    let body = serde_saphyr::to_string(&XlbIPPool::crd())?;
    Ok(format!(
        "# Generated from control/src/ipam/mod.rs (PoolSpec) by `xlb crd`; do not edit.\n\
         # Regenerate: cargo run -p xlb -- crd > {CRD_PATH}\n{body}"
    ))
}

/// Standalone mode: assigns addresses from the config's pools to the file's LoadBalancer
/// Services of xlb's class and writes them into each Service's in-memory
/// `status.loadBalancer.ingress`, which the translation programs as VIPs. An address the file
/// gives itself (status, `spec.loadBalancerIP`, annotation) is kept even outside the pools
/// ([`Options::keep_addresses_outside_pools`]). A Service that gets no address keeps an empty
/// status. Returns one note per Service assigned afresh or left without an address (with the
/// reason); with no pools configured, Services that ask for nothing are left silently
/// without an address, as before pools existed.
///
/// `previous` is the state the running process built from the file before a reload: a
/// Service that the file gives no status keeps the pool addresses it held there (the file
/// has no status to remember them by), so adding a Service to the file never moves another
/// one's VIP. Addresses outside every pool (static ones the file no longer gives) are not
/// carried over.
pub fn assign_standalone(
    cfg: &crate::config::Config,
    cluster: &mut crate::cluster::ClusterState,
    previous: Option<&crate::cluster::ClusterState>,
) -> Vec<String> {
    let pools = cfg.pool_set();
    let filter = ClassFilter::from_config(cfg);
    if let Some(prev) = previous {
        let before: BTreeMap<ServiceKey, Vec<IpAddr>> = prev
            .services
            .iter()
            .filter(|s| is_ours(s, &filter))
            .map(|s| (ServiceKey::of(s), ingress_ips(s)))
            .filter(|(_, a)| !a.is_empty() && a.iter().all(|a| pools.pool_of(*a).is_some()))
            .collect();
        for svc in &mut cluster.services {
            if is_ours(svc, &filter)
                && ingress_ips(svc).is_empty()
                && let Some(addrs) = before.get(&ServiceKey::of(svc))
            {
                apply_to_service(std::sync::Arc::make_mut(svc), addrs);
            }
        }
    }
    let opts = Options { keep_addresses_outside_pools: true };
    let assignment = assign(&pools, &cluster.services, &filter, opts);
    let mut notes = Vec::new();
    for svc in &mut cluster.services {
        let key = ServiceKey::of(svc);
        let Some(outcome) = assignment.services.get(&key) else { continue };
        match outcome {
            Outcome::Assigned(a) if a.kept => {}
            Outcome::Assigned(a) => {
                let list: Vec<String> = a.addresses.iter().map(ToString::to_string).collect();
                let from = a
                    .pool
                    .as_deref()
                    .map_or_else(|| "as given (outside the pools)".to_owned(), |p| format!("from pool {p:?}"));
                notes.push(format!("Service {key}: LoadBalancer address {} {from}", list.join(", ")));
                apply_to_service(std::sync::Arc::make_mut(svc), &a.addresses);
            }
            Outcome::Failed(AssignError::NoPool { .. }) if pools.is_empty() => {}
            Outcome::Failed(e) => {
                notes.push(format!("Service {key}: no LoadBalancer address: {e}"));
                if !ingress_ips(svc).is_empty() {
                    apply_to_service(std::sync::Arc::make_mut(svc), &[]);
                }
            }
        }
    }
    notes
}
