//! `xlb-pktgen`: AF_XDP traffic generator and receiver for veth testbeds.
//!
//! ```text
//! xlb-pktgen run --tx-netns NS --tx-iface IF [--tx-queue 0] --rx-netns NS --rx-iface IF [--rx-queue 0] [--cpu N]
//!     --src-mac MAC --dst-mac MAC --src-ip IPv4 --dst-ip IPv4 --dst-port PORT
//!     [--flows N] [--size BYTES] [--proto udp|syn|tcp] [--rate PPS] [--duration S] [--warmup S] [--json]
//! xlb-pktgen recv --netns NS --iface IF [--queue 0] [--cpu N] --duration S [--json]
//! xlb-pktgen search <every run option> [--loss-threshold 0.001] [--trials 8] [--retries 1] [--json]
//! ```
//! See `xlb_perf::pktgen` for the frame format, the stamp and the accounting.

use std::io::IsTerminal as _;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use xlb_perf::pktgen::engine::{self, Endpoint, GenConfig, Generator, SocketOpts, TrialParams};
use xlb_perf::pktgen::frame::{FrameSpec, Proto};
use xlb_perf::pktgen::search::{Trial, no_drop_search};
use xlb_perf::pktgen::{Latency, RunReport};
use xlb_perf::sys::parse_mac;

#[derive(Parser, Debug)]
#[command(name = "xlb-pktgen", version, about = "AF_XDP traffic generator and receiver for veth testbeds")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Send for --warmup + --duration seconds and count what comes back on the RX socket.
    Run(RunArgs),
    /// Count every frame arriving on one queue for --duration seconds.
    Recv(RecvArgs),
    /// Binary search for the highest rate with loss <= --loss-threshold (RFC 2544 §26.1);
    /// --rate is ignored, --duration and --warmup apply to every trial.
    Search(SearchArgs),
}

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// `ip netns` name of the TX interface (default: the current namespace).
    #[arg(long)]
    tx_netns: Option<String>,
    /// TX interface.
    #[arg(long)]
    tx_iface: String,
    /// TX queue.
    #[arg(long, default_value_t = 0)]
    tx_queue: u32,
    /// `ip netns` name of the RX interface (default: the current namespace).
    #[arg(long)]
    rx_netns: Option<String>,
    /// RX interface (the same namespace/interface/queue as TX means one socket does both).
    #[arg(long, required_unless_present = "no_rx")]
    rx_iface: Option<String>,
    /// RX queue.
    #[arg(long, default_value_t = 0)]
    rx_queue: u32,
    /// Transmit only: no RX socket, no loss or latency (for measuring the generator).
    #[arg(long, conflicts_with_all = ["rx_iface", "rx_netns"])]
    no_rx: bool,
    /// Pin the generator thread to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Ethernet source.
    #[arg(long, value_parser = parse_mac)]
    src_mac: [u8; 6],
    /// Ethernet destination (the next hop: the load balancer's port).
    #[arg(long, value_parser = parse_mac)]
    dst_mac: [u8; 6],
    /// First source address; with more than 60,000 flows the next addresses are used too.
    #[arg(long)]
    src_ip: Ipv4Addr,
    /// Destination address.
    #[arg(long)]
    dst_ip: Ipv4Addr,
    /// Destination port.
    #[arg(long)]
    dst_port: u16,
    /// Distinct 5-tuples (source port, then source address), cycled round-robin. Ignored by
    /// `--proto syn` unless larger than 2^24: SYN mode cycles 2^24 tuples so that every
    /// packet is a new flow.
    #[arg(long, default_value_t = 1)]
    flows: u64,
    /// Ethernet frame length without FCS [default: 64 for udp, 70 for syn/tcp, the smallest
    /// that holds the headers and the 16-byte stamp].
    #[arg(long)]
    size: Option<usize>,
    /// udp; syn = TCP SYN only, every packet a new flow; tcp = ACK-only segments.
    #[arg(long, value_enum, default_value_t = Proto::Udp)]
    proto: Proto,
    /// Packets per second, 0 = as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Measured phase, seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Warmup before it, seconds (sent, not counted).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// How long RX keeps counting after the measured phase, ms.
    #[arg(long, default_value_t = 200)]
    drain_ms: u64,
    /// Frames per TX batch (one clock read and one kick per batch).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// AF_XDP ring size (RX, TX, fill, completion).
    #[arg(long, default_value_t = 2048)]
    ring_size: u32,
    /// UMEM frames per socket.
    #[arg(long, default_value_t = 8192)]
    frame_count: u32,
    /// Do not use XDP_USE_NEED_WAKEUP.
    #[arg(long)]
    no_need_wakeup: bool,
    /// Attach libxdp's program to the RX interface in SKB (generic) mode.
    #[arg(long)]
    skb_mode: bool,
    /// Print one JSON object on stdout instead of the human summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RecvArgs {
    /// `ip netns` name (default: the current namespace).
    #[arg(long)]
    netns: Option<String>,
    /// Interface.
    #[arg(long)]
    iface: String,
    /// Queue.
    #[arg(long, default_value_t = 0)]
    queue: u32,
    /// Pin to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Seconds to count.
    #[arg(long)]
    duration: f64,
    /// Attach libxdp's program in SKB (generic) mode.
    #[arg(long)]
    skb_mode: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct SearchArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Largest loss fraction accepted as "no drop".
    #[arg(long, default_value_t = 0.001)]
    loss_threshold: f64,
    /// Bisection steps after the as-fast-as-possible trial.
    #[arg(long, default_value_t = 8)]
    trials: u32,
    /// Trials run again at a step's rate, while they lose more than the threshold, before the
    /// rate is rejected (a stall of the host then does not reject a rate the forwarder carries).
    #[arg(long, default_value_t = 1)]
    retries: u32,
}

fn secs(s: f64, what: &str) -> anyhow::Result<Duration> {
    anyhow::ensure!(s.is_finite() && s >= 0.0, "--{what} must be a non-negative number of seconds");
    Ok(Duration::from_secs_f64(s))
}

fn gen_config(a: &RunArgs) -> GenConfig {
    GenConfig {
        tx: Endpoint { netns: a.tx_netns.clone(), iface: a.tx_iface.clone(), queue: a.tx_queue },
        rx: a.rx_iface.as_ref().map(|i| Endpoint { netns: a.rx_netns.clone(), iface: i.clone(), queue: a.rx_queue }),
        cpu: a.cpu,
        frame: FrameSpec {
            src_mac: a.src_mac,
            dst_mac: a.dst_mac,
            src_ip: a.src_ip,
            dst_ip: a.dst_ip,
            dst_port: a.dst_port,
            proto: a.proto,
            size: a.size.unwrap_or_else(|| a.proto.min_frame().max(64)),
        },
        flows: a.flows,
        batch: a.batch,
        sockets: SocketOpts {
            frame_count: a.frame_count,
            ring_size: a.ring_size,
            need_wakeup: !a.no_need_wakeup,
            skb_mode: a.skb_mode,
        },
    }
}

fn params(a: &RunArgs, rate: f64) -> anyhow::Result<TrialParams> {
    anyhow::ensure!(rate.is_finite() && rate >= 0.0, "--rate must be >= 0");
    Ok(TrialParams {
        rate_pps: rate,
        warmup: secs(a.warmup, "warmup")?,
        duration: secs(a.duration, "duration")?,
        drain: Duration::from_millis(a.drain_ms),
        progress: std::io::stderr().is_terminal(),
    })
}

/// Runs `f` on a thread of its own: it enters namespaces, which must not leak into main.
fn on_thread<T: Send + 'static>(f: impl FnOnce() -> anyhow::Result<T> + Send + 'static) -> anyhow::Result<T> {
    std::thread::Builder::new()
        .name("xlb-pktgen".into())
        .spawn(f)?
        .join()
        .map_err(|_| anyhow::anyhow!("generator thread panicked"))?
}

fn cmd_run(a: RunArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let cfg = gen_config(&a);
    let p = params(&a, a.rate)?;
    let json = a.json;
    let report = on_thread(move || {
        let mut g = Generator::open(&cfg, stop)?;
        let s = g.trial(&p);
        Ok(RunReport::new(&cfg, &p, &s))
    })?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", report.human());
    }
    Ok(())
}

fn cmd_recv(a: RecvArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let ep = Endpoint { netns: a.netns.clone(), iface: a.iface.clone(), queue: a.queue };
    let o = SocketOpts { skb_mode: a.skb_mode, ..SocketOpts::default() };
    let d = secs(a.duration, "duration")?;
    let cpu = a.cpu;
    let progress = std::io::stderr().is_terminal();
    let r = on_thread(move || engine::recv(&ep, &o, cpu, d, progress, &stop))?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "rx {} frames in {:.2} s = {:.0} pps ({} stamped, {} other)",
            r.rx_packets, r.duration_s, r.rx_pps, r.rx_tagged, r.rx_other
        );
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct SearchJson {
    mode: &'static str,
    proto: Proto,
    flows: u64,
    size: usize,
    duration_s: f64,
    no_drop_pps: f64,
    loss_threshold: f64,
    /// `--retries`: a step's rate is rejected after this many more trials over the threshold.
    retries: u32,
    trials: Vec<TrialJson>,
}

#[derive(serde::Serialize)]
struct TrialJson {
    #[serde(flatten)]
    trial: Trial,
    tx_packets: u64,
    rx_packets: u64,
    latency_ns: Latency,
}

fn cmd_search(a: SearchArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    anyhow::ensure!(!a.run.no_rx, "search needs an RX socket (--rx-iface)");
    anyhow::ensure!((0.0..1.0).contains(&a.loss_threshold), "--loss-threshold must be in [0, 1)");
    let cfg = gen_config(&a.run);
    let base = params(&a.run, 0.0)?;
    let (trials, retries, thr) = (a.trials, a.retries, a.loss_threshold);
    let (outcome, details) = on_thread(move || {
        let mut g = Generator::open(&cfg, Arc::clone(&stop))?;
        let mut details = Vec::new();
        let outcome = no_drop_search(trials, retries, thr, |rate| {
            anyhow::ensure!(!stop.load(std::sync::atomic::Ordering::Relaxed), "interrupted");
            let p = TrialParams { rate_pps: rate, ..base.clone() };
            let s = g.trial(&p);
            let r = RunReport::new(&cfg, &p, &s);
            let loss = r.loss.unwrap_or(1.0);
            eprintln!(
                "trial {:2}: target {:>10.0} pps  tx {:>10.0} pps  rx {:>10.0} pps  loss {:.4} %  {}",
                details.len(),
                rate,
                r.tx_pps,
                r.rx_pps,
                loss * 100.0,
                if loss <= thr { "within the threshold" } else { "over the threshold" }
            );
            details.push((r.tx_packets, r.rx_packets, r.latency_ns.clone()));
            Ok(Trial { rate_pps: rate, tx_pps: r.tx_pps, rx_pps: r.rx_pps, loss })
        })?;
        Ok((outcome, details))
    })?;
    let cfg = gen_config(&a.run);
    if a.run.json {
        let j = SearchJson {
            mode: "search",
            proto: cfg.frame.proto,
            flows: cfg.flow_space(),
            size: cfg.frame.size,
            duration_s: a.run.duration,
            no_drop_pps: outcome.no_drop_pps,
            loss_threshold: outcome.loss_threshold,
            retries,
            trials: outcome
                .trials
                .into_iter()
                .zip(details)
                .map(|(trial, (tx_packets, rx_packets, latency_ns))| TrialJson {
                    trial,
                    tx_packets,
                    rx_packets,
                    latency_ns,
                })
                .collect(),
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        println!(
            "no-drop rate {:.0} pps (loss <= {} %) after {} trials",
            outcome.no_drop_pps,
            outcome.loss_threshold * 100.0,
            outcome.trials.len()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal exits at once; the first stops the loops so the sockets close
        // (and libxdp detaches its program).
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&stop));
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    let r = match cli.cmd {
        Cmd::Run(a) => cmd_run(a, stop),
        Cmd::Recv(a) => cmd_recv(a, stop),
        Cmd::Search(a) => cmd_search(a, stop),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlb-pktgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}
