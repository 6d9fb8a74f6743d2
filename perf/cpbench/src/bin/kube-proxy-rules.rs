//! `kube-proxy-rules --config FILE --mode nftables|iptables [--family ipv4|ipv6] [--out FILE]`:
//! prints the ruleset kube-proxy's nftables or iptables mode would program for the Services of
//! an xlb config file (`pkg/proxy/nftables/proxier.go`, `pkg/proxy/iptables/proxier.go`), for
//! `nft -f` or `iptables-restore` / `ip6tables-restore`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use xlb_cpbench::{Mode, iptables::Family};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CliMode {
    /// nftables mode: `table ip kube-proxy` (+ `ip6` if there are IPv6 Services), for `nft -f`.
    Nftables,
    /// iptables mode: `*filter` and `*nat`, for `iptables-restore` (`--family ipv6`:
    /// `ip6tables-restore`).
    Iptables,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CliFamily {
    /// IPv4 Services (iptables-restore).
    Ipv4,
    /// IPv6 Services (ip6tables-restore).
    Ipv6,
}

/// Print kube-proxy's ruleset for the Services of an xlb config file.
#[derive(Debug, Parser)]
#[command(name = "kube-proxy-rules", version)]
struct Args {
    /// xlb config file (XlbConfiguration + Service/EndpointSlice/Node objects).
    #[arg(long)]
    config: PathBuf,
    /// Which kube-proxy mode.
    #[arg(long, value_enum)]
    mode: CliMode,
    /// Address family of the iptables ruleset (nftables mode writes both tables).
    #[arg(long, value_enum, default_value = "ipv4")]
    family: CliFamily,
    /// Write here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let mode = match (a.mode, a.family) {
        (CliMode::Nftables, _) => Mode::Nftables,
        (CliMode::Iptables, CliFamily::Ipv4) => Mode::Iptables(Family::V4),
        (CliMode::Iptables, CliFamily::Ipv6) => Mode::Iptables(Family::V6),
    };
    let (text, report) = xlb_cpbench::ruleset_from_file(&a.config, mode)
        .with_context(|| format!("generating the ruleset for {}", a.config.display()))?;
    for i in &report.issues {
        eprintln!("kube-proxy-rules: {i}");
    }
    match &a.out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}
