//! The workers' settings from the configuration: which (interface, queue) each worker binds,
//! its AF_XDP and pipeline settings, the socket layout two processes compare at a hand-over,
//! and the configuration a process serves again with after a failed hand-over.

use std::time::Duration;

use dataplane::conntrack::Timeouts;
use dataplane::process::PipelineConfig;
use dataplane::xsk::{BusyPoll, CopyMode, XskConfig};

use crate::config::Config;

/// SNAT source ports xlb uses: above Linux's default ephemeral range (32768–60999,
/// `net.ipv4.ip_local_port_range`) and above common listening ports, so replies to the node's
/// own connections never land in xlb when the SNAT address is a node address.
pub const SNAT_PORTS: (u16, u16) = (61000, 65535);

/// The sockets of worker `w`: one (interface, queue) per interface, the worker's queue in
/// its `queues` list (or queue `w`).
pub fn worker_ports(config: &Config, w: usize) -> Vec<(String, u32)> {
    config
        .interfaces
        .iter()
        .map(|i| (i.name.clone(), i.queues.get(w).copied().unwrap_or(u32::try_from(w).unwrap_or(0))))
        .collect()
}

/// The CPUs the control plane keeps to: those of `allowed` (the process's CPU set) that no
/// worker is pinned to (`worker_cores`, one per worker). Empty when the workers take every
/// allowed CPU: then the control threads share the workers' cores. DPDK keeps its control
/// threads off the lcores the same way (`rte_ctrl_thread_create`).
pub fn control_cpus(allowed: &[usize], worker_cores: &[usize]) -> Vec<usize> {
    allowed.iter().copied().filter(|c| !worker_cores.contains(c)).collect()
}

/// The workers' AF_XDP settings from `afXdp`.
pub fn xsk_config(config: &Config) -> XskConfig {
    XskConfig {
        frame_count: config.af_xdp.frames,
        ring_size: config.af_xdp.ring_size,
        fill_frames: config.af_xdp.fill_frames,
        unaligned_chunks: config.af_xdp.unaligned_chunks,
        copy_mode: match config.af_xdp.zero_copy.as_str() {
            "copy" => CopyMode::Copy,
            "zerocopy" => CopyMode::ZeroCopy,
            _ => CopyMode::Auto,
        },
        need_wakeup: !config.af_xdp.busy_poll,
        busy_poll: config
            .af_xdp
            .prefer_busy_poll
            .then_some(BusyPoll { usecs: config.af_xdp.busy_poll_usecs, budget: config.af_xdp.busy_poll_budget }),
        ..XskConfig::default()
    }
}

/// The AF_XDP socket layout of `nworkers` workers under `config`, as one word (no spaces):
/// what must be equal for a new process to adopt the old one's sockets at a hand-over
/// (frames, frame size, ring size, bind mode, need-wakeup, chunk mode; per worker its
/// interfaces and queues in port order), e.g.
/// `f8192x2048r2048mautow1u1;0=eth0:0,eth1:0;1=eth0:1,eth1:1`.
pub fn xsk_layout(config: &Config, nworkers: usize) -> String {
    let x = xsk_config(config);
    let mode = match x.copy_mode {
        CopyMode::Auto => "auto",
        CopyMode::Copy => "copy",
        CopyMode::ZeroCopy => "zerocopy",
    };
    let mut s = format!(
        "f{}x{}r{}m{}w{}u{}",
        x.frame_count,
        x.frame_size,
        x.ring_size,
        mode,
        u8::from(x.need_wakeup),
        u8::from(x.unaligned_chunks)
    );
    for w in 0..nworkers {
        let ports: Vec<String> = worker_ports(config, w).iter().map(|(i, q)| format!("{i}:{q}")).collect();
        s.push_str(&format!(";{w}={}", ports.join(",")));
    }
    s
}

/// Worker `id`'s pipeline settings (of `workers`): conntrack size and timeouts from
/// `conntrack` (timeouts in whole seconds, at least 1), SNAT ports [`SNAT_PORTS`].
pub fn pipeline_config(cfg: &Config, id: u16, workers: u16) -> PipelineConfig {
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

/// The config a process resumes with after a failed hand-over: `latest` (the last reload),
/// except the settings that take effect only at a start, which stay as `started` (what the
/// workers ran with): a reload accepted them without applying them, and the new xlb may have
/// failed on exactly those (e.g. `afXdp.zeroCopy: zerocopy` on a NIC without it).
pub fn resume_config(latest: Config, started: &Config) -> Config {
    Config {
        interfaces: started.interfaces.clone(),
        cores: started.cores.clone(),
        af_xdp: started.af_xdp.clone(),
        punt_device: started.punt_device.clone(),
        ..latest
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, reason = "tests")]
    use super::*;
    use crate::config::InterfaceConfig;

    fn two_interfaces() -> Config {
        Config {
            interfaces: vec![
                InterfaceConfig { name: "eth0".into(), queues: vec![4, 5] },
                InterfaceConfig { name: "eth1".into(), queues: vec![] },
            ],
            ..Config::default()
        }
    }

    #[test]
    fn the_control_plane_keeps_to_the_cpus_no_worker_is_pinned_to() {
        assert_eq!(control_cpus(&[0, 1], &[1]), [0]);
        assert_eq!(control_cpus(&[0, 1, 2, 3, 4, 5, 6, 7], &[2, 3, 4, 5, 6, 7]), [0, 1]);
        assert_eq!(control_cpus(&[4, 5, 6], &[5]), [4, 6], "a CPU set that does not start at 0");
        assert!(control_cpus(&[0, 1], &[0, 1]).is_empty(), "workers on every CPU: nothing left to keep to");
    }

    #[test]
    fn a_worker_binds_its_queue_of_each_interface_or_the_queue_of_its_number() {
        let c = two_interfaces();
        assert_eq!(worker_ports(&c, 0), [("eth0".to_owned(), 4), ("eth1".to_owned(), 0)]);
        assert_eq!(worker_ports(&c, 1), [("eth0".to_owned(), 5), ("eth1".to_owned(), 1)]);
        assert_eq!(worker_ports(&c, 2), [("eth0".to_owned(), 2), ("eth1".to_owned(), 2)], "past the list: queue w");
    }

    #[test]
    fn the_layout_names_the_socket_settings_and_every_workers_queues() {
        let mut c = two_interfaces();
        let x = xsk_config(&c);
        let want =
            format!("f{}x{}r{}mautow1u1;0=eth0:4,eth1:0;1=eth0:5,eth1:1", c.af_xdp.frames, x.frame_size, x.ring_size);
        assert_eq!(xsk_layout(&c, 2), want);
        assert_eq!(x.ring_size, 2048);
        c.af_xdp.ring_size = 4096;
        assert_eq!(xsk_config(&c).ring_size, 4096, "afXdp.ringSize reaches the sockets");
        assert!(xsk_layout(&c, 2).contains("r4096m"), "a changed ring size changes the layout: {}", xsk_layout(&c, 2));
        c.af_xdp.zero_copy = "zerocopy".into();
        c.af_xdp.busy_poll = true;
        assert!(xsk_layout(&c, 2).contains("mzerocopyw0u1;"), "{}", xsk_layout(&c, 2));
        assert!(xsk_config(&c).unaligned_chunks);
        c.af_xdp.unaligned_chunks = false;
        assert!(!xsk_config(&c).unaligned_chunks, "afXdp.unalignedChunks reaches the sockets");
        assert!(xsk_layout(&c, 2).contains("w0u0;"), "the chunk mode is part of the layout: {}", xsk_layout(&c, 2));
        assert_ne!(xsk_layout(&c, 1), xsk_layout(&c, 2), "the worker count is part of the layout");
    }

    #[test]
    fn timeouts_are_whole_seconds_of_at_least_one_and_snat_uses_the_high_ports() {
        let mut c = Config::default();
        c.conntrack.udp_timeout = Duration::from_millis(300);
        c.conntrack.tcp_established_timeout = Duration::from_secs(86_400);
        let p = pipeline_config(&c, 1, 2);
        assert_eq!((p.worker_id, p.workers), (1, 2));
        assert_eq!(p.timeouts.udp_s, 1);
        assert_eq!(p.timeouts.tcp_established_s, 86_400);
        assert_eq!(p.snat_ports, SNAT_PORTS);
    }

    #[test]
    fn a_resume_keeps_the_start_only_settings_of_the_workers_and_the_rest_of_the_reload() {
        let started = two_interfaces();
        let mut latest = Config { interfaces: vec![], cores: vec![7], punt_device: "xlb9".into(), ..Config::default() };
        latest.af_xdp.zero_copy = "zerocopy".into();
        latest.sync_period = Duration::from_secs(7);
        let r = resume_config(latest, &started);
        assert_eq!(r.interfaces, started.interfaces);
        assert_eq!(r.cores, started.cores);
        assert_eq!(r.af_xdp, started.af_xdp);
        assert_eq!(r.punt_device, started.punt_device);
        assert_eq!(r.sync_period, Duration::from_secs(7), "a reloaded setting that a sync applies stays");
    }
}
