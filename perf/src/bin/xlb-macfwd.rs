//! `xlb-macfwd`: raw AF_XDP MAC-rewriting forwarder, the I/O ceiling of one xlb worker.
//!
//! ```text
//! xlb-macfwd --in-iface IF [--in-queue 0] --out-iface IF [--out-queue 0] --dst-mac MAC [--cpu N]
//!     [--duration SECONDS (0 = until SIGINT/SIGTERM)] [--busy-poll] [--ring-size 2048]
//!     [--frames 8192] [--json]
//! ```
//! Runs in the caller's network namespace (start it with `ip netns exec NS xlb-macfwd ...`).
//! See `xlb_perf::macfwd`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Parser;
use xlb_perf::macfwd::{self, FwdConfig};
use xlb_perf::sys::{format_mac, iface_mac, parse_mac};

#[derive(Parser, Debug)]
#[command(name = "xlb-macfwd", version, about = "AF_XDP MAC-rewriting forwarder: the I/O ceiling of one xlb worker")]
struct Cli {
    /// Input interface.
    #[arg(long)]
    in_iface: String,
    /// Input queue.
    #[arg(long, default_value_t = 0)]
    in_queue: u32,
    /// Output interface (may be the input one).
    #[arg(long)]
    out_iface: String,
    /// Output queue.
    #[arg(long, default_value_t = 0)]
    out_queue: u32,
    /// New Ethernet destination.
    #[arg(long, value_parser = parse_mac)]
    dst_mac: [u8; 6],
    /// New Ethernet source [default: the output interface's MAC].
    #[arg(long, value_parser = parse_mac)]
    src_mac: Option<[u8; 6]>,
    /// Pin to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Seconds to run; 0 = until SIGINT/SIGTERM.
    #[arg(long, default_value_t = 0.0)]
    duration: f64,
    /// Spin on the rings (need-wakeup off) instead of sleeping in poll(2).
    #[arg(long)]
    busy_poll: bool,
    /// Frames per RX batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// AF_XDP ring size (RX, TX, fill, completion): a power of two from 64 to 16384, as xlb's
    /// `afXdp.ringSize`.
    #[arg(long, default_value_t = 2048, value_parser = parse_ring_size)]
    ring_size: u32,
    /// UMEM frames, as xlb's `afXdp.frames`: at least twice `--ring-size`.
    #[arg(long, default_value_t = 8192)]
    frames: u32,
    /// Print one JSON object on stdout at exit.
    #[arg(long)]
    json: bool,
}

/// `--ring-size`: a power of two in `dataplane::xsk::RING_SIZES`, as xlb's `afXdp.ringSize`.
fn parse_ring_size(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if dataplane::xsk::ring_size_ok(n) {
        Ok(n)
    } else {
        let r = dataplane::xsk::RING_SIZES;
        Err(format!("{n} is not a power of two from {} to {}", r.start(), r.end()))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&stop));
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    let r = (|| {
        anyhow::ensure!(cli.duration.is_finite() && cli.duration >= 0.0, "--duration must be >= 0");
        anyhow::ensure!(
            dataplane::xsk::frames_ok(cli.frames, cli.ring_size),
            "--frames ({}) must be at least twice --ring-size ({})",
            cli.frames,
            cli.ring_size
        );
        anyhow::ensure!(cli.batch > 0, "--batch must be at least 1");
        let src_mac = match cli.src_mac {
            Some(m) => m,
            None => iface_mac(&cli.out_iface)?,
        };
        let cfg = FwdConfig {
            input: (cli.in_iface.clone(), cli.in_queue),
            output: (cli.out_iface.clone(), cli.out_queue),
            dst_mac: cli.dst_mac,
            src_mac,
            cpu: cli.cpu,
            duration: (cli.duration > 0.0).then(|| Duration::from_secs_f64(cli.duration)),
            busy_poll: cli.busy_poll,
            batch: cli.batch,
            ring_size: cli.ring_size,
            frames: cli.frames,
        };
        eprintln!(
            "xlb-macfwd: {}:{} -> {}:{} (src {} dst {}), rings of {}, {} UMEM frames{}",
            cli.in_iface,
            cli.in_queue,
            cli.out_iface,
            cli.out_queue,
            format_mac(&src_mac),
            format_mac(&cli.dst_mac),
            cli.ring_size,
            cli.frames,
            if cli.busy_poll { ", busy polling" } else { "" }
        );
        macfwd::run(&cfg, &stop)
    })();
    match r {
        Ok(r) => {
            if cli.json {
                match serde_json::to_string(&r) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("xlb-macfwd: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                println!(
                    "rx {} tx {} dropped {} rx_out {} in {:.2} s ({:.0} pps rx, {:.0} pps tx)",
                    r.rx, r.tx, r.dropped, r.rx_out, r.elapsed_s, r.rx_pps, r.tx_pps
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xlb-macfwd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_size_is_a_power_of_two_from_64_to_16384() {
        assert_eq!(parse_ring_size("64"), Ok(64));
        assert_eq!(parse_ring_size("4096"), Ok(4096));
        assert_eq!(parse_ring_size("16384"), Ok(16384));
        for bad in ["0", "32", "1000", "32768", "-1", "x"] {
            assert!(parse_ring_size(bad).is_err(), "{bad} accepted");
        }
    }
}
