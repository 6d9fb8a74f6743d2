//! Printing tables in the layout of `ipvsadm -Ln`, for `xlb check` and `xlb services`.
//!
//! ```text
//! Prot LocalAddress:Port Scheduler Flags
//!   -> RemoteAddress:Port           Forward Weight State
//! TCP  10.96.0.10:80 random persistent 10800 (default/web:http ClusterIP)
//!   -> 10.244.1.5:8080              Masq    1      ready
//! ```
//!
//! One line per frontend: protocol, `VIP:port` (IPv6 in brackets), scheduler (IPVS name),
//! then flags: `persistent SECONDS` for ClientIP affinity (as ipvsadm prints IPVS
//! persistence), `snat` when new flows are masqueraded, `drop-when-empty` when a flow with no
//! eligible backend is dropped instead of rejected, `from CIDR,...` for
//! `loadBalancerSourceRanges`; then the table name and frontend kind in parentheses.
//! Under it, one line per backend: forwarding method as ipvsadm names it (`Masq` = NAT,
//! `Tunnel` = DSR over IPIP, `Route` = DSR by MAC rewrite), weight (0 = not eligible for new
//! flows), and state:
//! - `ready`: ready, eligible for new flows;
//! - `terminating`: terminating but serving, eligible because nothing ready is left (TP-06,
//!   TP-08);
//! - `draining`: terminating, kept only for established flows;
//! - `serving`: serving but neither ready nor terminating;
//! - `notready`: not ready, not serving.
//!
//! [`render_with_connections`] adds ipvsadm's `ActiveConn InActConn` columns.

use std::fmt::Write as _;
use std::net::SocketAddr;

use dataplane::tables::{
    Backend, BackendRef, EmptyAction, ForwardingMode, FrontendEntry, FrontendKind, L4Proto, Tables, VipKey,
};

/// ipvsadm's name for a forwarding mode.
pub fn forward_name(mode: ForwardingMode) -> &'static str {
    match mode {
        ForwardingMode::Nat => "Masq",
        ForwardingMode::DsrIpip => "Tunnel",
        ForwardingMode::DsrL2 => "Route",
    }
}

/// The state word of a backend (see the module docs).
pub fn backend_state(b: &Backend) -> &'static str {
    let c = b.conditions;
    if c.ready {
        if b.eligible {
            "ready"
        } else if c.terminating {
            "draining"
        } else {
            "ready"
        }
    } else if c.terminating {
        if b.eligible && c.serving { "terminating" } else { "draining" }
    } else if c.serving {
        "serving"
    } else {
        "notready"
    }
}

fn kind_rank(k: FrontendKind) -> u8 {
    match k {
        FrontendKind::ClusterIp => 0,
        FrontendKind::NodePort => 1,
        FrontendKind::ExternalIp => 2,
        FrontendKind::LoadBalancer => 3,
    }
}

fn vip_socket(k: &VipKey) -> SocketAddr {
    let v6 = std::net::Ipv6Addr::from(k.addr);
    let ip = v6.to_ipv4_mapped().map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4);
    SocketAddr::new(ip, k.port)
}

fn proto_name(p: u8) -> &'static str {
    L4Proto::from_ip_proto(p).map_or("?", L4Proto::as_str)
}

/// Renders `tables` like `ipvsadm -Ln` (see the module docs).
pub fn render(tables: &Tables) -> String {
    render_inner(tables, None)
}

/// Like [`render`], with ipvsadm's `ActiveConn InActConn` columns filled by `conns`
/// (active, inactive flows of a backend).
pub fn render_with_connections(tables: &Tables, conns: &dyn Fn(BackendRef) -> (u64, u64)) -> String {
    render_inner(tables, Some(conns))
}

/// The Maglev lookup tables of `tables`, one line per Service table scheduled with `mh` or
/// `mh-noport` that has one (Service tables without eligible backends have none): name,
/// `M` (slots) and [`dataplane::maglev::MaglevTable::checksum`] in hex, in table-name order,
/// under a header line; an empty string when there are none. `xlb check` prints it after the
/// ipvsadm layout, so the tables two hosts would build from one file can be compared with
/// `diff`; `/metrics` exports the same checksums as `xlb_maglev_table_checksum`.
pub fn render_maglev(tables: &Tables) -> String {
    let mut rows: Vec<(&str, u32, u64)> = tables
        .services
        .iter()
        .filter_map(|s| s.maglev.as_ref().map(|m| (s.name.as_ref(), m.size(), m.checksum())))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_unstable();
    let mut out = String::from("Maglev Table                               Slots   Checksum\n");
    for (name, size, sum) in rows {
        let _ = writeln!(out, "{name:<42} {size:<7} {sum:#018x}");
    }
    out
}

fn render_inner(tables: &Tables, conns: Option<&dyn Fn(BackendRef) -> (u64, u64)>) -> String {
    let mut out = String::new();
    out.push_str("Prot LocalAddress:Port Scheduler Flags\n");
    if conns.is_some() {
        out.push_str("  -> RemoteAddress:Port           Forward Weight State       ActiveConn InActConn\n");
    } else {
        out.push_str("  -> RemoteAddress:Port           Forward Weight State\n");
    }
    let mut vips: Vec<(&VipKey, &FrontendEntry)> = tables.vips.iter().collect();
    vips.sort_by_key(|(k, f)| {
        let s = vip_socket(k);
        (f.service, kind_rank(f.kind), s.ip().is_ipv6(), s.ip(), k.proto, k.port)
    });
    for (k, f) in vips {
        let Some(svc) = usize::try_from(f.service).ok().and_then(|i| tables.services.get(i)) else {
            continue;
        };
        let mut line = format!("{:<4} {} {}", proto_name(k.proto), vip_socket(k), svc.scheduler.name());
        if let Some(t) = svc.affinity_timeout_s {
            let _ = write!(line, " persistent {t}");
        }
        if f.masquerade && svc.mode == ForwardingMode::Nat {
            line.push_str(" snat");
        }
        if svc.when_empty == EmptyAction::Drop {
            line.push_str(" drop-when-empty");
        }
        if !f.source_ranges.is_empty() {
            let r: Vec<String> = f.source_ranges.iter().map(ToString::to_string).collect();
            let _ = write!(line, " from {}", r.join(","));
        }
        let _ = writeln!(line, " ({} {})", svc.name, f.kind.name());
        out.push_str(&line);
        for r in svc.members.iter() {
            let Some(b) = tables.backend(*r) else { continue };
            let remote = format!("  -> {}", SocketAddr::new(b.addr, b.port));
            let _ = write!(out, "{remote:<33} {:<7} {:<6} {}", forward_name(svc.mode), b.weight, backend_state(b));
            if let Some(c) = conns {
                let (active, inactive) = c(*r);
                let _ = write!(out, "{:width$} {active:<10} {inactive}", "", width = 11 - backend_state(b).len());
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::tables::{BackendSpec, Conditions, Frontend, Scheduler, ServiceSpec, TableBuilder, TablesSpec};

    fn spec() -> TablesSpec {
        let be = |a: &str, ready: bool, terminating: bool, eligible: bool| BackendSpec {
            addr: a.parse().unwrap(),
            port: 8080,
            weight: u16::from(eligible),
            eligible,
            conditions: Conditions { ready, serving: ready || terminating, terminating },
            node_local: false,
        };
        TablesSpec {
            services: vec![std::sync::Arc::new(ServiceSpec {
                name: "default/web:http".into(),
                frontends: vec![
                    Frontend {
                        addr: "198.51.100.7".parse().unwrap(),
                        proto: L4Proto::Udp,
                        port: 53,
                        kind: FrontendKind::LoadBalancer,
                        masquerade: true,
                        source_ranges: vec!["192.0.2.0/24".parse().unwrap()],
                    },
                    Frontend {
                        addr: "10.96.0.10".parse().unwrap(),
                        proto: L4Proto::Tcp,
                        port: 80,
                        kind: FrontendKind::ClusterIp,
                        masquerade: false,
                        source_ranges: vec![],
                    },
                ],
                scheduler: Scheduler::RoundRobin,
                affinity_timeout_s: Some(10800),
                mode: ForwardingMode::Nat,
                when_empty: EmptyAction::Drop,
                backends: vec![
                    be("10.0.0.1", true, false, true),
                    be("10.0.0.2", false, true, false),
                    be("10.0.0.3", false, true, true),
                ],
            })],
            ..Default::default()
        }
    }

    #[test]
    fn renders_ipvsadm_layout() {
        let t = TableBuilder::new().build(&spec()).unwrap();
        let s = render(&t);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "Prot LocalAddress:Port Scheduler Flags");
        assert_eq!(lines[2], "TCP  10.96.0.10:80 rr persistent 10800 drop-when-empty (default/web:http ClusterIP)");
        assert_eq!(lines[3], "  -> 10.0.0.1:8080                Masq    1      ready");
        assert_eq!(lines[4], "  -> 10.0.0.2:8080                Masq    0      draining");
        assert_eq!(lines[5], "  -> 10.0.0.3:8080                Masq    1      terminating");
        assert_eq!(
            lines[6],
            "UDP  198.51.100.7:53 rr persistent 10800 snat drop-when-empty from 192.0.2.0/24 (default/web:http LoadBalancer)"
        );
    }

    #[test]
    fn maglev_section_lists_mh_tables_with_size_and_checksum_only() {
        let t = TableBuilder::new().build(&spec()).unwrap();
        assert_eq!(render_maglev(&t), "", "rr has no Maglev table");
        let mut mh = spec();
        let s = std::sync::Arc::get_mut(&mut mh.services[0]).unwrap();
        s.scheduler = Scheduler::Maglev { port: true };
        let t = TableBuilder::new().build(&mh).unwrap();
        let m = t.services[0].maglev.as_ref().expect("mh table");
        let text = render_maglev(&t);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[1], format!("{:<42} {:<7} {:#018x}", "default/web:http", m.size(), m.checksum()));
    }

    #[test]
    fn renders_connection_columns() {
        let t = TableBuilder::new().build(&spec()).unwrap();
        let s = render_with_connections(&t, &|_| (3, 4));
        assert!(s.lines().nth(3).unwrap().ends_with("ready       3          4"), "{s}");
    }
}
