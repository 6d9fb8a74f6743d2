//! `xlb monitor --drops`: the frames the workers drop, live, with their drop reason.
//!
//! Server side ([`serve`], run by the admin socket for `monitor drops [SAMPLE] [punted]`):
//! turns on every worker's [`DropTap`], sends `ok`, then one line per copied frame,
//! `drop WORKER TIME_NS REASON LEN HEX` (HEX: the first `dataplane::tap::SNAP_LEN` bytes), or
//! `punt WORKER TIME_NS punted LEN HEX` for a frame handed to the kernel (with `punted`),
//! and once a second `tick MISSED` (copies lost to full queues so far, and the way a closed
//! client is noticed). At most [`MAX_LINES_PER_S`] frame lines a second go out; the rest are
//! counted as missed. When the client goes, the taps are turned off again.
//!
//! Client side ([`run`]): prints one line per frame (time, worker, reason, 5-tuple, length),
//! optionally only frames to one VIP and port, and writes them to a pcapng file with the
//! reason as the packet comment.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dataplane::tap::DropTap;
use pcap_file::DataLink;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};

/// Frame lines the server sends per second at most (the rest are counted as missed).
pub(crate) const MAX_LINES_PER_S: u64 = 10_000;

/// Serves one `monitor drops` connection (see the module docs) until the client goes.
pub(crate) fn serve(c: UnixStream, taps: &[(u16, Arc<DropTap>)], sample: u32, punted: bool) {
    for (_, t) in taps {
        t.set_sample(sample);
        t.start(punted);
    }
    tracing::info!(sample, punted, "drop monitor started");
    let _ = stream(&c, taps);
    for (_, t) in taps {
        t.stop(punted);
    }
    tracing::info!("drop monitor stopped");
}

fn stream(c: &UnixStream, taps: &[(u16, Arc<DropTap>)]) -> std::io::Result<()> {
    let mut w = BufWriter::new(c);
    w.write_all(b"ok\n")?;
    w.flush()?;
    let (mut second, mut lines, mut suppressed) = (Instant::now(), 0u64, 0u64);
    let mut line = String::with_capacity(16 + 2 * dataplane::tap::SNAP_LEN + 64);
    loop {
        let mut any = false;
        for (id, t) in taps {
            while let Some(r) = t.pop() {
                any = true;
                if lines >= MAX_LINES_PER_S {
                    suppressed += 1;
                    continue;
                }
                lines += 1;
                line.clear();
                let (kind, why) = r.reason.map_or(("punt", "punted"), |d| ("drop", d.name()));
                let _ = write!(line, "{kind} {id} {} {why} {} ", r.time_ns, r.len);
                for b in r.bytes() {
                    let _ = write!(line, "{b:02x}");
                }
                line.push('\n');
                w.write_all(line.as_bytes())?;
            }
        }
        if second.elapsed() >= Duration::from_secs(1) {
            let missed: u64 = taps.iter().map(|(_, t)| t.missed()).sum::<u64>() + suppressed;
            writeln!(w, "tick {missed}")?;
            second = Instant::now();
            lines = 0;
        }
        w.flush()?;
        if !any {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One frame line from the server.
struct Line {
    /// `drop` or `punt`.
    kind: String,
    worker: u16,
    time_ns: u64,
    reason: String,
    len: u32,
    data: Vec<u8>,
}

fn parse_line(l: &str) -> Option<Line> {
    let (kind, rest) = l.split_once(' ')?;
    if kind != "drop" && kind != "punt" {
        return None;
    }
    let mut it = rest.split(' ');
    let worker = it.next()?.parse().ok()?;
    let time_ns = it.next()?.parse().ok()?;
    let reason = it.next()?.to_owned();
    let len = it.next()?.parse().ok()?;
    let hex = it.next().unwrap_or("");
    let data = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(Line { kind: kind.to_owned(), worker, time_ns, reason, len, data })
}

/// What `--filter VIP/PORT` keeps: frames to this address (and port, when given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Filter {
    addr: IpAddr,
    port: Option<u16>,
}

/// Parses `--filter`: `ADDRESS/PORT` or `ADDRESS` (IPv6 without brackets: `fd00::10/80`).
///
/// # Errors
/// Not an address, or a port that is not a number.
pub(crate) fn parse_filter(s: &str) -> Result<Filter, String> {
    let (a, p) = match s.rsplit_once('/') {
        Some((a, p)) => (a, Some(p.parse::<u16>().map_err(|_| format!("{s:?}: {p:?} is not a port"))?)),
        None => (s, None),
    };
    let addr = a
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("{s:?}: {a:?} is not an address"))?;
    Ok(Filter { addr, port: p })
}

/// `xlb monitor --drops`: streams drops from the xlb at `socket` until `count` frames were
/// shown (0: until interrupted or the server goes).
///
/// # Errors
/// The admin socket cannot be reached or refuses; `out` cannot be written.
pub(crate) fn run(
    socket: &Path,
    sample: u32,
    punted: bool,
    filter: Option<Filter>,
    out: Option<&Path>,
    count: u64,
) -> anyhow::Result<()> {
    let mut c =
        UnixStream::connect(socket).with_context(|| format!("connecting to {} (is xlb running?)", socket.display()))?;
    let also = if punted { " punted" } else { "" };
    c.write_all(format!("monitor drops {sample}{also}\n").as_bytes())?;
    let mut r = BufReader::new(c);
    let mut first = String::new();
    r.read_line(&mut first)?;
    if first.trim() != "ok" {
        bail!("{}: {}", socket.display(), first.trim());
    }
    let mut pcap = match out {
        Some(path) => {
            let file = BufWriter::new(std::fs::File::create(path).with_context(|| format!("{}", path.display()))?);
            let mut w = PcapNgWriter::new(file).with_context(|| format!("{}", path.display()))?;
            w.write_pcapng_block(InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: u32::try_from(dataplane::tap::SNAP_LEN).unwrap_or(0),
                options: vec![InterfaceDescriptionOption::IfTsResol(9)],
            })?;
            w.get_mut().flush()?;
            Some(w)
        }
        None => None,
    };
    let stdout = std::io::stdout();
    let (mut shown, mut missed) = (0u64, 0u64);
    for l in r.lines() {
        let l = l?;
        if let Some(m) = l.strip_prefix("tick ") {
            let now: u64 = m.trim().parse().unwrap_or(missed);
            if now > missed {
                eprintln!(
                    "note: {} dropped frame(s) not copied (queues full or over {MAX_LINES_PER_S}/s)",
                    now - missed
                );
                missed = now;
            }
            continue;
        }
        let Some(f) = parse_line(&l) else { continue };
        let (proto, src, dst) = crate::trace::describe(&f.data);
        if let Some(flt) = filter
            && !dst.is_some_and(|d| d.ip() == flt.addr && flt.port.is_none_or(|p| p == d.port()))
        {
            continue;
        }
        let what = if f.kind == "punt" { "punted".to_owned() } else { format!("drop {}", f.reason) };
        let mut text = format!("{:.6} worker {} {what} {proto}", f.time_ns as f64 / 1e9, f.worker);
        if let (Some(s), Some(d)) = (src, dst) {
            let _ = write!(text, " {s} -> {d}");
        }
        let _ = write!(text, " len {}", f.len);
        writeln!(stdout.lock(), "{text}")?;
        if let Some(w) = pcap.as_mut() {
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_nanos(f.time_ns),
                original_len: f.len,
                data: Cow::Borrowed(&f.data),
                options: vec![EnhancedPacketOption::Comment(Cow::Owned(format!("xlb: {what} worker {}", f.worker)))],
            })?;
            w.get_mut().flush()?;
        }
        shown += 1;
        if count > 0 && shown >= count {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_line_round_trips_and_filters_parse() {
        let l = parse_line("drop 1 1764000000000000000 ttl_exceeded 60 0a0bff").unwrap();
        assert_eq!(
            (l.worker, l.reason.as_str(), l.len, l.data.as_slice()),
            (1, "ttl_exceeded", 60, &[10u8, 11, 255][..])
        );
        assert!(parse_line("tick 3").is_none());
        let p = parse_line("punt 0 1764000000000000000 punted 60 0a").unwrap();
        assert_eq!((p.kind.as_str(), p.reason.as_str(), p.data.as_slice()), ("punt", "punted", &[10u8][..]));
        assert!(parse_line("drop 1 x ttl_exceeded 60 00").is_none());
        assert_eq!(parse_filter("10.96.0.10/80"), Ok(Filter { addr: "10.96.0.10".parse().unwrap(), port: Some(80) }));
        assert_eq!(parse_filter("fd00::10/53"), Ok(Filter { addr: "fd00::10".parse().unwrap(), port: Some(53) }));
        assert_eq!(parse_filter("10.96.0.10"), Ok(Filter { addr: "10.96.0.10".parse().unwrap(), port: None }));
        assert!(parse_filter("10.96.0.10/http").is_err());
        assert!(parse_filter("web/80").is_err());
    }
}
