//! `xlb-macfwd`: the AF_XDP I/O ceiling of one xlb worker.
//!
//! Receives on one interface, rewrites only the Ethernet destination (given) and source (the
//! output interface's MAC) and transmits on another interface (or the same one), on one
//! pinned core, with `dataplane::xsk::Xsk` and the xlb workers' default ring and frame
//! settings (`XskConfig::default()`), except that libxdp's default program is loaded so the
//! whole input queue is redirected to the socket. No parsing, no tables: whatever rate this
//! reaches bounds what an xlb worker can reach on the same interfaces.
//!
//! Loop: receive a batch (up to 64 frames) on the input port, rewrite MACs, queue them on the
//! output port, kick (copy-mode TX moves ≤ 32 frames per `sendto()`, and [`Xsk::kick`]
//! repeats until the ring has drained), reap completions, refill the input fill ring. With
//! two interfaces, libxdp's program is on the output interface too; frames arriving there are
//! received, counted as `rx_out` and released. Without `--busy-poll` the socket uses
//! `XDP_USE_NEED_WAKEUP` and waits in `poll(2)` (100 ms timeout, so a stop request is seen
//! quickly); with it, need-wakeup is off and the loop spins.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use dataplane::xsk::{OwnedFrame, Xsk, XskConfig};

use crate::sys::{mono_ns, pin_cpu};

/// Forwarder settings.
#[derive(Clone, Debug)]
pub struct FwdConfig {
    /// Input interface and queue.
    pub input: (String, u32),
    /// Output interface and queue.
    pub output: (String, u32),
    /// New Ethernet destination.
    pub dst_mac: [u8; 6],
    /// New Ethernet source (the output interface's MAC).
    pub src_mac: [u8; 6],
    /// CPU to pin to.
    pub cpu: Option<usize>,
    /// Stop after this long (None = until `stop`).
    pub duration: Option<Duration>,
    /// Spin instead of sleeping in `poll(2)`.
    pub busy_poll: bool,
    /// Frames per RX batch.
    pub batch: usize,
    /// AF_XDP ring size (RX, TX, fill, completion; a power of two), as xlb's `afXdp.ringSize`.
    pub ring_size: u32,
    /// UMEM frames, as xlb's `afXdp.frames` (at least twice `ring_size`).
    pub frames: u32,
}

/// Counters at exit (the JSON object printed with `--json`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct FwdReport {
    /// Frames received on the input port.
    pub rx: u64,
    /// Frames queued on the output port.
    pub tx: u64,
    /// Frames received but not queued (TX ring full).
    pub dropped: u64,
    /// Frames received on the output port (released).
    pub rx_out: u64,
    /// Run time, s.
    pub elapsed_s: f64,
    /// `rx / elapsed_s`.
    pub rx_pps: f64,
    /// `tx / elapsed_s`.
    pub tx_pps: f64,
}

/// Rewrites the two MAC addresses of a frame (shorter frames are left alone).
#[inline]
pub fn rewrite_macs(buf: &mut [u8], len: usize, dst: &[u8; 6], src: &[u8; 6]) {
    if len >= 12 && buf.len() >= 12 {
        buf[0..6].copy_from_slice(dst);
        buf[6..12].copy_from_slice(src);
    }
}

/// Opens the sockets and forwards until `stop` is set or the duration has passed.
///
/// # Errors
/// Pinning or socket errors.
pub fn run(cfg: &FwdConfig, stop: &AtomicBool) -> anyhow::Result<FwdReport> {
    if let Some(cpu) = cfg.cpu {
        pin_cpu(cpu)?;
    }
    let xcfg = XskConfig {
        load_default_program: true,
        need_wakeup: !cfg.busy_poll,
        ring_size: cfg.ring_size,
        frame_count: cfg.frames,
        ..XskConfig::default()
    };
    let same = cfg.input == cfg.output;
    let mut ports = vec![cfg.input.clone()];
    if !same {
        ports.push(cfg.output.clone());
    }
    let mut xsk = Xsk::open(&xcfg, &ports).with_context(|| format!("opening AF_XDP sockets on {ports:?}"))?;
    let out = usize::from(!same);
    let timeout = if cfg.busy_poll { 0 } else { 100 };
    let mut batch: Vec<OwnedFrame> = Vec::with_capacity(cfg.batch);
    let mut r = FwdReport::default();
    let start = mono_ns();
    let end = cfg.duration.map(|d| start + d.as_nanos() as u64);
    let mut now = start;
    let mut iter = 0u32;
    while !stop.load(Ordering::Relaxed) && end.is_none_or(|e| now < e) {
        let n = xsk.receive(0, &mut batch, cfg.batch, timeout);
        if n > 0 {
            for f in &mut batch {
                xsk.with_buffer(f, |buf, len| {
                    rewrite_macs(buf, len, &cfg.dst_mac, &cfg.src_mac);
                    (len, ())
                });
            }
            let q = xsk.transmit(out, &mut batch);
            r.rx += n as u64;
            r.tx += q as u64;
            r.dropped += (n - q) as u64;
            xsk.kick(out);
        }
        xsk.complete();
        xsk.refill(0);
        if !same {
            let m = xsk.receive(1, &mut batch, cfg.batch, 0);
            if m > 0 {
                r.rx_out += m as u64;
                for f in batch.drain(..) {
                    let _ = xsk.release(f);
                }
            }
            xsk.refill(1);
        }
        // The clock only every 64 busy iterations, or after every wait.
        iter = iter.wrapping_add(1);
        if n == 0 || iter.is_multiple_of(64) {
            now = mono_ns();
        }
    }
    let now = mono_ns();
    r.elapsed_s = (now - start) as f64 * 1e-9;
    if r.elapsed_s > 0.0 {
        r.rx_pps = r.rx as f64 / r.elapsed_s;
        r.tx_pps = r.tx as f64 / r.elapsed_s;
    }
    drop(xsk);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_the_macs() {
        let mut f: Vec<u8> = (0..64).collect();
        let orig = f.clone();
        rewrite_macs(&mut f, 64, &[1, 2, 3, 4, 5, 6], &[7, 8, 9, 10, 11, 12]);
        assert_eq!(&f[..12], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(&f[12..], &orig[12..]);
        let mut short = vec![0u8; 11];
        rewrite_macs(&mut short, 11, &[1; 6], &[2; 6]);
        assert_eq!(short, vec![0u8; 11]);
    }
}
