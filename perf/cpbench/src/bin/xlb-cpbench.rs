//! `xlb-cpbench [--quick] [--json] [--profile A|B]… [--scheduler mh|default]…`: control-plane
//! scale benchmark (full table builds, one EndpointSlice change, kube-proxy nftables loads);
//! prints `NAME VALUE UNIT` lines, or one JSON object with `--json`.

use std::io::Write as _;

use clap::{Parser, ValueEnum};
use xlb_cpbench::bench::{self, Options, SchedulerVariant};
use xlb_cpbench::synth;

// Heap bytes of the built tables are counted by this allocator (see alloc_count).
#[global_allocator]
static ALLOC: xlb_cpbench::alloc_count::Counting = xlb_cpbench::alloc_count::Counting;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CliProfile {
    /// 10,000 Services x 10 endpoints.
    A,
    /// 1,000 Services x 100 endpoints.
    B,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CliScheduler {
    /// Maglev (`ipvs.scheduler: mh`).
    Mh,
    /// The default scheduler (random).
    Default,
}

/// xlb control-plane scale benchmark.
#[derive(Debug, Parser)]
#[command(name = "xlb-cpbench", version)]
struct Args {
    /// Scaled-down run (200 Services x 10 endpoints).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of NAME VALUE UNIT lines.
    #[arg(long)]
    json: bool,
    /// Profiles to run (default: A and B).
    #[arg(long, value_enum)]
    profile: Vec<CliProfile>,
    /// Scheduler variants (default: both).
    #[arg(long, value_enum)]
    scheduler: Vec<CliScheduler>,
    /// Full builds per profile and scheduler.
    #[arg(long)]
    repeats: Option<usize>,
    /// One-change samples per profile and scheduler.
    #[arg(long)]
    changes: Option<usize>,
    /// nft loads per profile (full ruleset and one-Service update each).
    #[arg(long)]
    nft_repeats: Option<usize>,
    /// A custom profile instead: this many Services (with --endpoints).
    #[arg(long, requires = "endpoints")]
    services: Option<usize>,
    /// Endpoints per Service of the custom profile.
    #[arg(long, requires = "services")]
    endpoints: Option<usize>,
    /// Time the one-change path for these schedulers (default: every scheduler run).
    #[arg(long, value_enum)]
    change_scheduler: Vec<CliScheduler>,
    /// Run the nft comparison at the profiles' full scale (default: 1/10 of the Services).
    #[arg(long)]
    nft_full_scale: bool,
    /// Skip the kube-proxy nftables comparison.
    #[arg(long)]
    no_nft: bool,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let mut o = if a.quick { Options::quick() } else { Options::full() };
    if !a.profile.is_empty() && !a.quick {
        o.profiles = a
            .profile
            .iter()
            .map(|p| match p {
                CliProfile::A => synth::PROFILE_A,
                CliProfile::B => synth::PROFILE_B,
            })
            .collect();
    }
    if let (Some(services), Some(endpoints)) = (a.services, a.endpoints) {
        o.profiles = vec![synth::Profile { name: "custom", services, endpoints }];
    }
    if !a.scheduler.is_empty() {
        o.schedulers = a
            .scheduler
            .iter()
            .map(|s| match s {
                CliScheduler::Mh => SchedulerVariant::Maglev,
                CliScheduler::Default => SchedulerVariant::Default,
            })
            .collect();
        o.change_schedulers.retain(|s| o.schedulers.contains(s));
        if o.change_schedulers.is_empty() {
            o.change_schedulers.clone_from(&o.schedulers);
        }
    }
    let sched = |s: &CliScheduler| match s {
        CliScheduler::Mh => SchedulerVariant::Maglev,
        CliScheduler::Default => SchedulerVariant::Default,
    };
    if !a.change_scheduler.is_empty() {
        o.change_schedulers = a.change_scheduler.iter().map(sched).collect();
    }
    if a.nft_full_scale {
        o.nft_scale_divisor = 1;
    }
    if let Some(r) = a.repeats {
        o.repeats = r;
    }
    if let Some(c) = a.changes {
        o.change_samples = c;
    }
    if let Some(n) = a.nft_repeats {
        o.nft_repeats = n;
    }
    o.nft &= !a.no_nft;
    let report = bench::run(&o, &mut |line| eprintln!("xlb-cpbench: {line}"))?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report.json())?)?;
    } else {
        write!(out, "{}", report.text())?;
    }
    Ok(())
}
