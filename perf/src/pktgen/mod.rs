//! `xlb-pktgen`: an AF_XDP traffic generator and receiver for veth testbeds.
//!
//! - [`frame`]: templates, per-packet patching with incremental checksums, flow cycling and
//!   the 16-byte payload stamp (magic, run id, sequence number, send time);
//! - [`rate`]: token-bucket pacing in batches;
//! - [`engine`]: the send/receive loop on `dataplane::xsk::Xsk` and the `recv` counter;
//! - [`search`]: the RFC 2544-style no-drop-rate binary search;
//! - this module: the JSON and human reports.

pub mod engine;
pub mod frame;
pub mod rate;
pub mod search;

use engine::{GenConfig, TrialParams, TrialStats};
use frame::Proto;

/// One-way latency percentiles, ns (all 0 when no measured frame came back).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Frames measured.
    pub samples: u64,
}

impl Latency {
    /// From a histogram of ns values.
    pub fn from_histogram(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self { p50: 0, p99: 0, p999: 0, max: 0, min: 0, mean: 0.0, samples: 0 };
        }
        Self {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            min: h.min(),
            mean: h.mean(),
            samples: h.len(),
        }
    }
}

/// The result of `xlb-pktgen run` (the JSON object printed with `--json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunReport {
    /// `"run"`.
    pub mode: &'static str,
    /// Transport.
    pub proto: Proto,
    /// Distinct 5-tuples cycled (for `syn`, the tuple space: at least 2^24).
    pub flows: u64,
    /// Ethernet frame length without FCS.
    pub size: usize,
    /// Target rate, 0 = as fast as possible.
    pub rate_target_pps: f64,
    /// Measured phase, s.
    pub duration_s: f64,
    /// Warmup, s (its frames are not in the counts below except `*_warmup`).
    pub warmup_s: f64,
    /// Frames per TX batch.
    pub batch: usize,
    /// Frames sent in the measured phase.
    pub tx_packets: u64,
    /// Frames sent during warmup.
    pub tx_warmup: u64,
    /// Measured frames received.
    pub rx_packets: u64,
    /// Warmup frames received.
    pub rx_warmup: u64,
    /// Stamped frames of earlier trials received.
    pub rx_stale: u64,
    /// Received frames without a stamp (ARP, IPv6, other traffic).
    pub rx_other: u64,
    /// Every frame the RX socket received (the sum of the four above); with the socket
    /// alone on its queue this equals the interface's XDP redirect counter.
    pub rx_frames_total: u64,
    /// `tx_packets / duration_s`.
    pub tx_pps: f64,
    /// `rx_packets / duration_s`.
    pub rx_pps: f64,
    /// `(tx_packets - rx_packets) / tx_packets`; null without an RX socket.
    pub loss: Option<f64>,
    /// One-way latency of the measured frames.
    pub latency_ns: Latency,
}

impl RunReport {
    /// Builds the report of one trial.
    pub fn new(cfg: &GenConfig, p: &TrialParams, s: &TrialStats) -> Self {
        Self {
            mode: "run",
            proto: cfg.frame.proto,
            flows: cfg.flow_space(),
            size: cfg.frame.size,
            rate_target_pps: p.rate_pps,
            duration_s: s.duration_s(),
            warmup_s: p.warmup.as_secs_f64(),
            batch: cfg.batch,
            tx_packets: s.tx_packets,
            tx_warmup: s.tx_warmup,
            rx_packets: s.rx.measured,
            rx_warmup: s.rx.warmup,
            rx_stale: s.rx.stale,
            rx_other: s.rx.other,
            rx_frames_total: s.rx.total(),
            tx_pps: s.tx_pps(),
            rx_pps: s.rx_pps(),
            loss: s.loss(),
            latency_ns: Latency::from_histogram(&s.rx.latency),
        }
    }

    /// A few human-readable lines.
    pub fn human(&self) -> String {
        let l = &self.latency_ns;
        let loss = self.loss.map_or_else(|| "n/a (no RX socket)".to_owned(), |x| format!("{:.4} %", x * 100.0));
        let target = if self.rate_target_pps > 0.0 {
            format!("{:.0} pps", self.rate_target_pps)
        } else {
            "as fast as possible".to_owned()
        };
        format!(
            "{proto} {size} B, {flows} flows, target {target}, {dur:.2} s measured after {warm:.1} s warmup\n\
             tx {tx} frames = {txp:.0} pps (+{txw} warmup)\n\
             rx {rx} frames = {rxp:.0} pps (+{rxw} warmup, {st} stale, {other} other)\n\
             loss {loss}\n\
             latency ns: p50 {p50}  p99 {p99}  p99.9 {p999}  max {max}  ({n} samples)",
            proto = self.proto.name(),
            size = self.size,
            flows = self.flows,
            dur = self.duration_s,
            warm = self.warmup_s,
            tx = self.tx_packets,
            txp = self.tx_pps,
            txw = self.tx_warmup,
            rx = self.rx_packets,
            rxp = self.rx_pps,
            rxw = self.rx_warmup,
            st = self.rx_stale,
            other = self.rx_other,
            p50 = l.p50,
            p99 = l.p99,
            p999 = l.p999,
            max = l.max,
            n = l.samples,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_from_histogram() {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
        assert_eq!(Latency::from_histogram(&h).samples, 0);
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let l = Latency::from_histogram(&h);
        assert_eq!(l.samples, 1000);
        assert!(l.p50.abs_diff(500_000) <= 500, "{}", l.p50);
        assert!(l.p99.abs_diff(990_000) <= 1_000, "{}", l.p99);
        assert!(l.p999.abs_diff(999_000) <= 1_000, "{}", l.p999);
        assert!(l.max.abs_diff(1_000_000) <= 1_000);
        assert!(l.min.abs_diff(1_000) <= 1);
    }
}
