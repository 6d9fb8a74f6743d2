//! `xlb run --config FILE`: standalone mode.
//!
//! Start-up: load and translate the file → fill in interface MACs/MTUs and the kernel's
//! neighbour table → build and publish the tables → attach the steering program to every
//! interface → start one pinned worker per core → put the workers' sockets into the XSKMAP →
//! sync the steering maps. Then, until SIGINT/SIGTERM: reload on SIGHUP or when the file
//! changes (a bad file is logged with its document, object and field, and the running tables
//! stay), rebuild when a neighbour changes, ask the kernel to resolve unresolved next hops,
//! and answer the admin socket. On exit the workers stop and every program and map is removed
//! (the maps are not pinned, so closing them frees them).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use dataplane::addr::Cidr;
use dataplane::affinity::AffinityTable;
use dataplane::conntrack::Timeouts;
use dataplane::process::PipelineConfig;
use dataplane::tables::{NeighbourSpec, TableBuilder, Tables, TablesHandle, TablesSpec, VipAddrKind};
use dataplane::worker::{self, Fabric, WorkerHandle, WorkerSpec};
use dataplane::xsk::{CopyMode, XskConfig};
use nic_config::{ServiceKey, Steering, XdpMode, neighbours};

use crate::admin;

/// SNAT source ports xlb uses: above Linux's default ephemeral range (32768–60999,
/// `net.ipv4.ip_local_port_range`) and above common listening ports, so replies to the node's
/// own connections never land in xlb when the SNAT address is a node address.
pub(crate) const SNAT_PORTS: (u16, u16) = (61000, 65535);

struct Loaded {
    spec: TablesSpec,
    config: xlb::config::Config,
}

fn load(path: &Path) -> Result<Loaded> {
    let loaded = xlb::config::load_file(path)?;
    let (spec, report) = xlb::translate::build_spec(&loaded.cluster, &loaded.config)?;
    for i in &report.issues {
        tracing::warn!("{i}");
    }
    Ok(Loaded { spec, config: loaded.config })
}

/// Fills in what the file cannot know: interface MACs and MTUs, and the kernel's neighbours.
fn complete_spec(spec: &mut TablesSpec, cfg: &xlb::config::Config) -> Result<()> {
    let mut ifindex_to_port = BTreeMap::new();
    for (i, iface) in cfg.interfaces.iter().enumerate() {
        let info = nic_config::interface_info(&iface.name).with_context(|| format!("interface {}", iface.name))?;
        if let Some(p) = spec.ports.get_mut(i) {
            p.mac = info.mac.unwrap_or([0; 6]);
            p.mtu = u16::try_from(info.mtu).unwrap_or(1500);
        }
        ifindex_to_port.insert(info.ifindex, u8::try_from(i).unwrap_or(0));
    }
    let have: std::collections::HashSet<IpAddr> = spec.neighbours.iter().map(|n| n.addr).collect();
    for (ifindex, port) in &ifindex_to_port {
        for n in neighbours::dump(Some(*ifindex))? {
            if let Some(mac) = n.usable_mac()
                && !have.contains(&n.ip)
            {
                spec.neighbours.push(NeighbourSpec { addr: n.ip, mac, port: *port });
            }
        }
    }
    Ok(())
}

fn pipeline_config(cfg: &xlb::config::Config, id: u16, workers: u16) -> PipelineConfig {
    let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX).max(1);
    PipelineConfig {
        worker_id: id,
        workers,
        conntrack_capacity: cfg.conntrack.max_per_core.max(1024) as usize,
        timeouts: Timeouts {
            tcp_established_s: secs(cfg.conntrack.tcp_established_timeout),
            tcp_fin_s: secs(cfg.conntrack.tcp_fin_timeout),
            udp_s: secs(cfg.conntrack.udp_timeout),
            ..Timeouts::default()
        },
        snat_ports: SNAT_PORTS,
        ..PipelineConfig::default()
    }
}

/// The steering maps' contents for a tables snapshot.
struct SteerSets {
    services: Vec<ServiceKey>,
    vip_addrs: Vec<IpAddr>,
    snat: Vec<(IpAddr, u16, u16)>,
    endpoints: Vec<ServiceKey>,
}

fn unmap(a: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(a);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn steer_sets(t: &Tables) -> SteerSets {
    let services = t.vips.keys().map(|k| ServiceKey { addr: unmap(k.addr), proto: k.proto, port: k.port }).collect();
    let vip_addrs =
        t.vip_addrs.iter().filter(|(_, kind)| **kind >= VipAddrKind::Service).map(|(a, _)| unmap(*a)).collect();
    let mut snat = Vec::new();
    if let Some(a) = t.snat_v4 {
        snat.push((IpAddr::from(a), SNAT_PORTS.0, SNAT_PORTS.1));
    }
    if let Some(a) = t.snat_v6 {
        snat.push((IpAddr::from(a), SNAT_PORTS.0, SNAT_PORTS.1));
    }
    let endpoints =
        t.endpoints.iter().map(|k| ServiceKey { addr: unmap(k.addr), proto: k.proto, port: k.port }).collect();
    SteerSets { services, vip_addrs, snat, endpoints }
}

fn sync_steering(steering: &mut [Steering], t: &Tables) -> Result<()> {
    let s = steer_sets(t);
    for st in steering {
        st.sync_services(&s.services)?;
        st.sync_vip_addrs(&s.vip_addrs)?;
        st.sync_snat(&s.snat)?;
        st.sync_endpoints(&s.endpoints)?;
    }
    Ok(())
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Runs until SIGINT or SIGTERM.
pub(crate) fn run(path: PathBuf, admin_socket: PathBuf) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())?;

    let Loaded { mut spec, config } = load(&path)?;
    if config.interfaces.is_empty() {
        bail!("{}: `interfaces` is empty: xlb needs at least one interface to attach to", path.display());
    }
    complete_spec(&mut spec, &config)?;
    let mut builder = TableBuilder::new();
    let tables =
        builder.build(&spec).map_err(|e| anyhow::anyhow!("{}: the tables cannot be built: {e}", path.display()))?;
    let handle = TablesHandle::new(tables);

    // Cores: read the allowed set before pinning anything (core_affinity reports the calling
    // thread's mask).
    let allowed: Vec<usize> = core_affinity::get_core_ids().unwrap_or_default().into_iter().map(|c| c.id).collect();
    let cores: Vec<usize> = if config.cores.is_empty() { allowed.clone() } else { config.cores.clone() };
    for c in &cores {
        if !allowed.is_empty() && !allowed.contains(c) {
            bail!("{}: field cores: core {c} is not in this process's CPU set {allowed:?}", path.display());
        }
    }
    let queues_per_iface = config.interfaces.iter().map(|i| i.queues.len().max(1)).min().unwrap_or(1);
    let nworkers = cores.len().min(queues_per_iface).max(1);
    let nworkers_u16 = u16::try_from(nworkers).unwrap_or(1);

    let mut steering = Vec::new();
    for iface in &config.interfaces {
        steering.push(Steering::attach(&iface.name, XdpMode::Native)?);
    }
    let fabric = Fabric::new(nworkers);
    let affinity = Arc::new(AffinityTable::new(1 << 16));
    let wstop = Arc::new(AtomicBool::new(false));
    let mut workers: Vec<WorkerHandle> = Vec::new();
    let result = (|| -> Result<()> {
        for w in 0..nworkers {
            let ports: Vec<(String, u32)> = config
                .interfaces
                .iter()
                .map(|i| (i.name.clone(), i.queues.get(w).copied().unwrap_or(u32::try_from(w).unwrap_or(0))))
                .collect();
            let id = u16::try_from(w).unwrap_or(0);
            let spec = WorkerSpec {
                id,
                core: cores.get(w).copied(),
                ports: ports.clone(),
                xsk: XskConfig {
                    frame_count: config.af_xdp.frames,
                    copy_mode: match config.af_xdp.zero_copy.as_str() {
                        "copy" => CopyMode::Copy,
                        "zerocopy" => CopyMode::ZeroCopy,
                        _ => CopyMode::Auto,
                    },
                    need_wakeup: !config.af_xdp.busy_poll,
                    ..XskConfig::default()
                },
                pipeline: pipeline_config(&config, id, nworkers_u16),
                busy_poll: config.af_xdp.busy_poll,
                affinity: affinity.clone(),
            };
            let h = worker::spawn(spec, handle.clone(), fabric.clone(), wstop.clone())?;
            for (st, ((_, queue), fd)) in steering.iter_mut().zip(ports.iter().zip(&h.fds)) {
                st.set_xsk(*queue, fd)?;
            }
            tracing::info!(worker = id, core = ?cores.get(w), ?ports, "worker started");
            workers.push(h);
        }
        sync_steering(&mut steering, &handle.load())?;
        let admin = admin::serve(&admin_socket, handle.clone(), &workers)?;
        tracing::info!(config = %path.display(), workers = nworkers, "xlb running");
        supervise(&path, &config, &mut builder, &handle, &mut steering, &stop, &reload)?;
        drop(admin);
        Ok(())
    })();
    wstop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join();
    }
    for st in steering {
        let name = st.ifname().to_owned();
        if let Err(e) = st.detach() {
            tracing::warn!(interface = name, error = %e, "detach failed");
        }
    }
    let _ = std::fs::remove_file(&admin_socket);
    tracing::info!("xlb stopped; steering programs detached");
    result
}

fn supervise(
    path: &Path,
    config: &xlb::config::Config,
    builder: &mut TableBuilder,
    handle: &TablesHandle,
    steering: &mut [Steering],
    stop: &AtomicBool,
    reload: &AtomicBool,
) -> Result<()> {
    let mut watcher = neighbours::NeighbourWatcher::new()?;
    let mut last_mtime = mtime(path);
    let mut config = config.clone();
    let mut dirty = false;
    let mut last_resolve = Instant::now() - Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) {
        // Neighbour changes (blocks up to 200 ms: this is also the loop's tick).
        match watcher.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(_)) => dirty = true,
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "neighbour watch"),
        }
        let m = mtime(path);
        if reload.swap(false, Ordering::Relaxed) || m != last_mtime {
            last_mtime = m;
            match load(path) {
                Ok(l) => {
                    config = l.config;
                    dirty = true;
                    tracing::info!(config = %path.display(), "configuration reloaded");
                }
                Err(e) => tracing::error!("{e:#}; keeping the running tables"),
            }
        }
        if dirty {
            dirty = false;
            match rebuild(path, &config, builder) {
                Ok(t) => {
                    let unresolved = t.unresolved.clone();
                    handle.publish(t);
                    if let Err(e) = sync_steering(steering, &handle.load()) {
                        tracing::error!(error = %e, "steering maps");
                    }
                    resolve(&config, &unresolved);
                    last_resolve = Instant::now();
                }
                Err(e) => tracing::error!("{e:#}; keeping the running tables"),
            }
        }
        if last_resolve.elapsed() > Duration::from_secs(2) {
            let t = handle.load();
            if !t.unresolved.is_empty() {
                resolve(&config, &t.unresolved);
            }
            last_resolve = Instant::now();
        }
    }
    Ok(())
}

fn rebuild(path: &Path, config: &xlb::config::Config, builder: &mut TableBuilder) -> Result<Tables> {
    let Loaded { mut spec, .. } = load(path)?;
    complete_spec(&mut spec, config)?;
    builder.build(&spec).map_err(|e| anyhow::anyhow!("{}: the tables cannot be built: {e}", path.display()))
}

/// Asks the kernel to resolve next hops xlb could not find (counted `no_neighbour` drops until
/// then). Routes' gateways are resolved instead of off-link backends.
fn resolve(config: &xlb::config::Config, addrs: &[IpAddr]) {
    for a in addrs {
        let via =
            config.routes.iter().filter(|r| Cidr::contains(&r.dst, *a)).max_by_key(|r| r.dst.len).map_or(*a, |r| r.via);
        for iface in &config.interfaces {
            if let Ok(ix) = nic_config::ifindex(&iface.name)
                && let Err(e) = neighbours::resolve(ix, via)
            {
                tracing::debug!(address = %via, error = %e, "neighbour resolve");
            }
        }
    }
}
