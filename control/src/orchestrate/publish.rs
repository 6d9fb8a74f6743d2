//! How `xlb run` turns the cluster state into published tables: translate and build
//! ([`Builders::build`]), publish, bring the steering programs' maps along (only the changed
//! services' keys after an incremental build, the whole sets otherwise), sync the reply
//! rules, and ask the kernel for the next hops the new tables lack ([`Publisher::publish`]).
//!
//! What touches the kernel goes through two small traits, [`SteeringMaps`] (implemented by
//! [`nic_config::Steering`]) and [`Kernel`] (implemented by [`LiveKernel`]), so that tests drive
//! the decisions with fakes; the clock is a parameter.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use dataplane::tables::{BuildError, BuildKind, KernelRouteSpec, NeighbourSpec, TableBuilder, Tables, TablesHandle};
use nic_config::{NicError, ServiceKey, Steering, neighbours};

use super::SNAT_PORTS;
use crate::announce::PrefixSet;
use crate::cluster::{Changes, ClusterIndex, ClusterState};
use crate::config::{AnnounceMode, Config};
use crate::steer::{steer_delta, steer_sets};
use crate::translate::{HostFacts, TranslateError, TranslateReport, Translator};

/// Why a build did not happen; the running tables stay.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The configuration is invalid ([`Translator::build`], [`Translator::update`]).
    #[error(transparent)]
    Translate(#[from] TranslateError),
    /// The dataplane refused the translated spec ([`TableBuilder::build`]).
    #[error("the tables cannot be built: {0}")]
    Build(BuildError),
    /// An interface of the configuration could not be read (MAC, MTU, index).
    #[error("interface {interface}: {error}")]
    Interface {
        /// The interface's name.
        interface: String,
        /// What netlink answered.
        error: NicError,
    },
    /// The kernel's neighbour table could not be read.
    #[error("{0}")]
    Neighbours(NicError),
}

/// One steering program's maps as a publish writes them: the operations of
/// [`nic_config::Steering`] this module uses.
pub trait SteeringMaps {
    /// Makes the `services` map hold exactly `keys`.
    ///
    /// # Errors
    /// The kernel refused a map operation.
    fn sync_services(&mut self, keys: &[ServiceKey]) -> Result<(), NicError>;
    /// Makes the `vip_addrs` map hold exactly `addrs`.
    ///
    /// # Errors
    /// The kernel refused a map operation.
    fn sync_vip_addrs(&mut self, addrs: &[IpAddr]) -> Result<(), NicError>;
    /// Makes the `snat_addrs` map hold exactly `ranges` (address, first port, last port).
    ///
    /// # Errors
    /// The kernel refused a map operation.
    fn sync_snat(&mut self, ranges: &[(IpAddr, u16, u16)]) -> Result<(), NicError>;
    /// Makes the `endpoints` map hold exactly `keys`.
    ///
    /// # Errors
    /// The kernel refused a map operation.
    fn sync_endpoints(&mut self, keys: &[ServiceKey]) -> Result<(), NicError>;
    /// Inserts and deletes `services` keys; `Ok(false)` (nothing written) when the map's
    /// contents are not known (first sync, after [`SteeringMaps::verify_next_sync`]).
    ///
    /// # Errors
    /// The kernel refused a map operation.
    fn update_services(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError>;
    /// As [`SteeringMaps::update_services`], for `vip_addrs`.
    ///
    /// # Errors
    /// The kernel refused a map operation.
    fn update_vip_addrs(&mut self, insert: &[IpAddr], remove: &[IpAddr]) -> Result<bool, NicError>;
    /// As [`SteeringMaps::update_services`], for `endpoints`.
    ///
    /// # Errors
    /// The kernel refused a map operation.
    fn update_endpoints(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError>;
    /// The next sync compares with the kernel's maps instead of the last written sets.
    fn verify_next_sync(&mut self);
}

impl SteeringMaps for Steering {
    fn sync_services(&mut self, keys: &[ServiceKey]) -> Result<(), NicError> {
        Self::sync_services(self, keys)
    }
    fn sync_vip_addrs(&mut self, addrs: &[IpAddr]) -> Result<(), NicError> {
        Self::sync_vip_addrs(self, addrs)
    }
    fn sync_snat(&mut self, ranges: &[(IpAddr, u16, u16)]) -> Result<(), NicError> {
        Self::sync_snat(self, ranges)
    }
    fn sync_endpoints(&mut self, keys: &[ServiceKey]) -> Result<(), NicError> {
        Self::sync_endpoints(self, keys)
    }
    fn update_services(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError> {
        Self::update_services(self, insert, remove)
    }
    fn update_vip_addrs(&mut self, insert: &[IpAddr], remove: &[IpAddr]) -> Result<bool, NicError> {
        Self::update_vip_addrs(self, insert, remove)
    }
    fn update_endpoints(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError> {
        Self::update_endpoints(self, insert, remove)
    }
    fn verify_next_sync(&mut self) {
        Self::verify_next_sync(self);
    }
}

/// What a build reads from the host and asks of it, besides the steering maps.
pub trait Kernel {
    /// What the file cannot know: interface MACs and MTUs, the kernel's neighbours on the
    /// served interfaces, `routes` (the kernel's, as last read), and how the kernel hashes
    /// multipath routes.
    ///
    /// # Errors
    /// An interface or the neighbour table could not be read.
    fn host_facts(&mut self, cfg: &Config, routes: &[KernelRouteSpec]) -> Result<HostFacts, PublishError>;
    /// Asks the kernel to resolve the next hops `addrs` (on every interface of `cfg`); failures
    /// are logged, not returned.
    fn resolve(&mut self, cfg: &Config, addrs: &[IpAddr]);
    /// Makes xlb's policy rules match [`Tables::kernel_endpoints`] of `t` (when there is a punt
    /// device); failures are logged.
    fn sync_reply_rules(&mut self, t: &Tables);
}

/// The running host's [`Kernel`]: netlink, `/proc`, the policy rules.
#[derive(Debug, Clone, Copy)]
pub struct LiveKernel {
    /// The punt device exists (so reply rules are kept in sync).
    pub punt: bool,
}

impl Kernel for LiveKernel {
    fn host_facts(&mut self, cfg: &Config, routes: &[KernelRouteSpec]) -> Result<HostFacts, PublishError> {
        // How the kernel spreads flows over multipath routes (ip-sysctl.rst): 1 = L4 (ports).
        let multipath_l4 =
            std::fs::read_to_string("/proc/sys/net/ipv4/fib_multipath_hash_policy").is_ok_and(|v| v.trim() == "1");
        let mut ports = Vec::with_capacity(cfg.interfaces.len());
        let mut ifindex_to_port = BTreeMap::new();
        for (i, iface) in cfg.interfaces.iter().enumerate() {
            let info = nic_config::interface_info(&iface.name)
                .map_err(|error| PublishError::Interface { interface: iface.name.clone(), error })?;
            ports.push((info.mac.unwrap_or([0; 6]), u16::try_from(info.mtu).unwrap_or(1500)));
            ifindex_to_port.insert(info.ifindex, u8::try_from(i).unwrap_or(0));
        }
        let mut neighbours = Vec::new();
        for (ifindex, port) in &ifindex_to_port {
            for n in neighbours::dump(Some(*ifindex)).map_err(PublishError::Neighbours)? {
                if let Some(mac) = n.usable_mac() {
                    neighbours.push(NeighbourSpec { addr: n.ip, mac, port: *port });
                }
            }
        }
        Ok(HostFacts { ports, neighbours, kernel_routes: routes.to_vec(), multipath_l4 })
    }

    fn resolve(&mut self, cfg: &Config, addrs: &[IpAddr]) {
        // `Tables::unresolved` already holds the next hops (backends or their gateways).
        for via in addrs {
            for iface in &cfg.interfaces {
                if let Ok(ix) = nic_config::ifindex(&iface.name)
                    && let Err(e) = neighbours::resolve(ix, *via)
                {
                    tracing::debug!(address = %via, error = %e, "neighbour resolve");
                }
            }
        }
    }

    fn sync_reply_rules(&mut self, t: &Tables) {
        if !self.punt {
            return;
        }
        let want = t
            .kernel_endpoints
            .iter()
            .map(|&(src, proto, sport)| nic_config::rules::ReplyRule { src, proto, sport })
            .collect();
        match nic_config::rules::sync_reply_rules(&want) {
            Ok((0, 0)) => {}
            Ok((added, deleted)) => {
                tracing::info!(added, deleted, "reply rules of backends reached through the kernel")
            }
            Err(e) => tracing::error!(error = %e, "reply rules"),
        }
    }
}

/// What a build translates.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// Standalone: the config file's objects, translated in full ([`Translator::build`]).
    File(&'a ClusterState),
    /// Kubernetes: the source's index and what changed in it since the last build
    /// ([`Translator::update`]), with the host's addresses.
    Cluster {
        /// The source's objects.
        index: &'a ClusterIndex,
        /// The Services changed since the previous build.
        changes: &'a Changes,
        /// The host's addresses ([`ClusterState::local_addresses`]).
        local: &'a [IpAddr],
    },
}

/// What a build gives: the tables, the translation's report and the VIPs this node announces
/// while it is healthy ([`crate::announce::announced`]).
#[derive(Debug)]
pub struct Built {
    /// The tables, not yet published.
    pub tables: Tables,
    /// The translation's issues and counts.
    pub report: TranslateReport,
    /// The VIPs to announce (empty when `announce.mode` is `none`).
    pub vips: PrefixSet,
}

/// What survives from one table build to the next: the translation cache and the builder's
/// backend slots and Maglev tables, so a change redoes only the Services it touches (SYNC-03).
#[derive(Debug, Default)]
pub struct Builders {
    /// The translation, kept.
    pub translator: Translator,
    /// The table builder, kept.
    pub tables: TableBuilder,
    /// The kernel's routes as last read (`routeTables`); reread when a route notification
    /// arrives, on a config reload and every `syncPeriod`, not for every build.
    pub routes: Vec<KernelRouteSpec>,
    /// The interfaces' MACs and MTUs, the kernel's neighbours and `routes` as last read
    /// ([`Kernel::host_facts`]); read again for every build that is not only a change of
    /// Services (a neighbour or route notification, a reload, a periodic resync, the host's
    /// addresses), not for each change.
    host: Option<HostFacts>,
}

impl Builders {
    /// Builders that start from nothing, with the kernel's `routes`.
    pub fn new(routes: Vec<KernelRouteSpec>) -> Self {
        Self { routes, ..Self::default() }
    }

    /// Translates and builds tables. `refresh_host`: read the interfaces, neighbours and
    /// `/proc` again ([`Kernel::host_facts`]); otherwise the last facts are reused (a change of
    /// Services needs none of them). Logs the report's issues.
    ///
    /// # Errors
    /// An invalid `config`, a spec the dataplane refuses, or host facts that cannot be read;
    /// the facts read before the error are not kept.
    pub fn build(
        &mut self,
        input: Input<'_>,
        config: &Config,
        refresh_host: bool,
        kernel: &mut impl Kernel,
    ) -> Result<Built, PublishError> {
        let host = match self.host.take() {
            Some(h) if !refresh_host => h,
            _ => kernel.host_facts(config, &self.routes)?,
        };
        let scope = crate::announce::Scope::from_config(config);
        let announce = config.announce.mode != AnnounceMode::None;
        let (tables, report, vips) = match input {
            Input::File(cluster) => {
                let (mut spec, report) = self.translator.build(cluster, config)?;
                host.apply(&mut spec);
                let vips = if announce { crate::announce::announced(cluster, &spec, &scope) } else { PrefixSet::new() };
                let t = self.tables.build(&spec).map_err(PublishError::Build)?;
                (t, report, vips)
            }
            Input::Cluster { index, changes, local } => {
                self.translator.update(index, local, changes, config)?;
                self.translator.set_host(host.clone());
                let spec = self.translator.spec();
                let vips =
                    if announce { crate::announce::announced_indexed(index, spec, &scope) } else { PrefixSet::new() };
                let t = self.tables.build(spec).map_err(PublishError::Build)?;
                (t, self.translator.report(), vips)
            }
        };
        self.host = Some(host);
        for i in &report.issues {
            tracing::warn!("{i}");
        }
        let (tr, mg) = (self.translator.stats(), self.tables.maglev_stats());
        tracing::debug!(
            translated = tr.translated,
            reused = tr.reused,
            maglev_built = mg.built,
            maglev_reused = mg.reused,
            maglev_threads = mg.threads,
            "tables built"
        );
        Ok(Built { tables, report, vips })
    }
}

/// Makes every steering program's maps match `t` (only the changed entries are written; see
/// [`Steering::verify_next_sync`]). After a failure the next sync compares with the kernel.
///
/// # Errors
/// The first map operation the kernel refused (the programs after it are not synced).
pub fn sync_steering<S: SteeringMaps>(steering: &mut [S], t: &Tables) -> Result<(), NicError> {
    let s = steer_sets(t, SNAT_PORTS);
    for st in steering {
        let r = (|| {
            st.sync_services(&s.services)?;
            st.sync_vip_addrs(&s.vip_addrs)?;
            st.sync_snat(&s.snat)?;
            st.sync_endpoints(&s.endpoints)
        })();
        if let Err(e) = r {
            st.verify_next_sync();
            return Err(e);
        }
    }
    Ok(())
}

/// Brings the steering maps from `old` to `new` when the build from one to the other was
/// incremental and redid only the services with the ids in `changed`
/// ([`TableBuilder::changed_ids`]): writes only those services' keys that differ
/// ([`steer_delta`]). Falls back to [`sync_steering`] when the change reaches further or a
/// program's maps are not known (first sync, after an error, after
/// [`SteeringMaps::verify_next_sync`]).
///
/// # Errors
/// The first map operation the kernel refused.
pub fn sync_steering_touched<S: SteeringMaps>(
    steering: &mut [S],
    old: &Tables,
    new: &Tables,
    changed: &[u32],
) -> Result<(), NicError> {
    let Some(d) = steer_delta(old, new, changed) else {
        return sync_steering(steering, new);
    };
    let mut known = true;
    for st in steering.iter_mut() {
        // Each call writes nothing and returns false when that map's contents are unknown;
        // the maps are known or unknown together (verify_next_sync forgets all of them).
        known &= st.update_services(&d.services_insert, &d.services_remove)?
            && st.update_vip_addrs(&d.vip_addrs_insert, &d.vip_addrs_remove)?
            && st.update_endpoints(&d.endpoints_insert, &d.endpoints_remove)?;
    }
    if known { Ok(()) } else { sync_steering(steering, new) }
}

/// What [`Publisher::publish`] did besides publishing.
#[derive(Debug)]
pub struct Published {
    /// The translation's report.
    pub report: TranslateReport,
    /// The VIPs to announce while healthy.
    pub vips: PrefixSet,
    /// The next hops the kernel was asked to resolve.
    pub resolving: Vec<IpAddr>,
    /// How the steering sync went; after an error the next publish compares the whole sets.
    pub steering: Result<(), NicError>,
}

/// The builders and what the steering sync remembers between publishes.
#[derive(Debug)]
pub struct Publisher {
    /// Translation and table builder, kept between builds.
    pub builders: Builders,
    /// When the steering maps were last compared with the kernel's (once per `syncPeriod`).
    last_verify: Instant,
    /// The next steering sync must compare the whole sets: a build failed since the last
    /// publish (its inputs, such as a reloaded configuration, are not in any change set), or
    /// the last sync failed, or nothing was published yet.
    steer_full: bool,
}

impl Publisher {
    /// A publisher over `builders`; `now` counts as the last comparison with the kernel's
    /// maps (the start-up sync, [`Publisher::start`]).
    pub fn new(builders: Builders, now: Instant) -> Self {
        Self { builders, last_verify: now, steer_full: true }
    }

    /// The first build, before there is anything to publish to: built with fresh host facts,
    /// and the kernel is asked at once for every next hop the tables lack (until they are
    /// known, new flows to those backends are dropped, `NoNeighbour`), rather than at the
    /// first periodic round. The caller publishes the tables and then calls
    /// [`Publisher::start`].
    ///
    /// # Errors
    /// As [`Builders::build`].
    pub fn first(
        &mut self,
        input: Input<'_>,
        config: &Config,
        kernel: &mut impl Kernel,
    ) -> Result<Built, PublishError> {
        let built = self.builders.build(input, config, true, kernel)?;
        let unresolved: Vec<IpAddr> = built.tables.unresolved.iter().copied().collect();
        kernel.resolve(config, &unresolved);
        Ok(built)
    }

    /// Fills every steering program's maps from `t` at start-up ([`sync_steering`]); `now`
    /// starts the `syncPeriod` until the maps are compared with the kernel's. The next
    /// publish compares the whole sets again.
    ///
    /// # Errors
    /// As [`sync_steering`].
    pub fn start<S: SteeringMaps>(&mut self, steering: &mut [S], t: &Tables, now: Instant) -> Result<(), NicError> {
        self.last_verify = now;
        sync_steering(steering, t)
    }

    /// Rebuilds from `input` and publishes through `handle`; on an error nothing is published
    /// (the running tables stay) and the next publish compares the whole steering sets.
    ///
    /// `refresh_host`: read the host facts again (see [`Builders::build`]). After an
    /// incremental build the steering maps get only the keys of the services the builder
    /// redid ([`TableBuilder::changed_ids`]); after a full build, a failed build or sync
    /// since the last publish, and once every `config.sync_period` (SYNC-04: the maps are then
    /// compared with the kernel's, which repairs outside changes) the whole sets are compared.
    /// The kernel is asked for the next hops that became unresolved with this build (the
    /// shards it changed), or for all of them after a full build (a neighbour, route or
    /// interface change may have made them unresolved again).
    ///
    /// # Errors
    /// As [`Builders::build`]. A failed steering sync is not an error: the tables are
    /// published, and [`Published::steering`] says what failed.
    #[allow(clippy::too_many_arguments, reason = "the publish's inputs, each a different thing")]
    pub fn publish<S: SteeringMaps>(
        &mut self,
        input: Input<'_>,
        config: &Config,
        refresh_host: bool,
        handle: &TablesHandle,
        steering: &mut [S],
        kernel: &mut impl Kernel,
        now: Instant,
    ) -> Result<Published, PublishError> {
        let Built { tables: t, report, vips } = match self.builders.build(input, config, refresh_host, kernel) {
            Ok(b) => b,
            Err(e) => {
                self.steer_full = true;
                return Err(e);
            }
        };
        let old = handle.load();
        let resolving: Vec<IpAddr> = match self.builders.tables.last_build() {
            BuildKind::Incremental { .. } => t.unresolved.added_since(&old.unresolved).copied().collect(),
            _ => t.unresolved.iter().copied().collect(),
        };
        handle.publish(t);
        // The services the builder redid (`None` after a full build).
        let mut touched = self.builders.tables.changed_ids().map(<[u32]>::to_vec);
        if now.saturating_duration_since(self.last_verify) >= config.sync_period {
            self.last_verify = now;
            steering.iter_mut().for_each(S::verify_next_sync);
            touched = None;
        }
        if std::mem::take(&mut self.steer_full) {
            touched = None;
        }
        let new = handle.load();
        let synced = match touched {
            Some(s) => sync_steering_touched(steering, &old, &new, &s),
            None => sync_steering(steering, &new),
        };
        drop(old);
        if synced.is_err() {
            self.steer_full = true;
        }
        kernel.sync_reply_rules(&new);
        kernel.resolve(config, &resolving);
        Ok(Published { report, vips, resolving, steering: synced })
    }
}
