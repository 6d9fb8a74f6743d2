//! The admin socket: a Unix stream socket (mode 0600, so only root can open it) that answers
//! one command per connection with text: `services` (the `ipvsadm -Ln` layout with active and
//! inactive connections summed over workers), `conntrack` (the flow table) and `stats`
//! (per-worker counters: rx/tx, drops by reason, events, AF_XDP frame accounting, and packets
//! per backend). `handover V` is the new process's request of a hand-over
//! ([`crate::handover`]). `monitor drops [SAMPLE] [punted]` streams the frames the workers drop (and hand to the kernel)
//! ([`crate::monitor`]) until the client goes away.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};
use dataplane::counters::XskCounters;
use dataplane::counters::{ByteCounter, DropReason, Event, WorkerCounters};
use dataplane::tables::{BackendRef, TablesHandle};
use dataplane::worker::{Request, WorkerHandle};

/// Default admin socket path.
pub(crate) const DEFAULT_SOCKET: &str = "/run/xlb/xlb.sock";

struct WorkerView {
    id: u16,
    counters: Arc<WorkerCounters>,
    xsk: Arc<XskCounters>,
    requests: mpsc::Sender<dataplane::worker::Request>,
    tap: Arc<dataplane::tap::DropTap>,
}

/// The running server; dropping it stops the thread and removes the socket.
pub(crate) struct Admin {
    stop: Arc<AtomicBool>,
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = UnixStream::connect(&self.path); // wake the accept
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts the admin server on `path`. A `handover V` request that this process can serve
/// ([`crate::handover::check_command`]) is passed, connection and all (with the socket
/// layout the new process offers to adopt, if any), to `handover`; the main loop then stops
/// and hands over.
pub(crate) fn serve(
    path: &Path,
    tables: TablesHandle,
    workers: &[WorkerHandle],
    handover: mpsc::Sender<(UnixStream, Option<String>)>,
) -> Result<Admin> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).with_context(|| format!("admin socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let views: Vec<WorkerView> = workers
        .iter()
        .map(|w| WorkerView {
            id: w.id,
            counters: w.counters.clone(),
            xsk: w.xsk.clone(),
            requests: w.requests.clone(),
            tap: w.tap.clone(),
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new().name("xlb-admin".into()).spawn(move || {
        for conn in listener.incoming() {
            if stop2.load(Ordering::Relaxed) {
                break;
            }
            if let Ok(c) = conn {
                let _ = handle(c, &tables, &views, &handover);
            }
        }
    })?;
    Ok(Admin { stop, path: path.to_owned(), thread: Some(thread) })
}

fn handle(
    c: UnixStream,
    tables: &TablesHandle,
    workers: &[WorkerView],
    handover: &mpsc::Sender<(UnixStream, Option<String>)>,
) -> Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line)?;
    match crate::handover::check_command(line.trim()) {
        Some(Ok(layout)) => {
            tracing::info!(sockets_offered = layout.is_some(), "hand-over requested on the admin socket");
            if let Err(e) = handover.send((c, layout)) {
                crate::handover::reply(&(e.0).0, "error: this xlb is stopping\n");
            }
            return Ok(());
        }
        Some(Err(answer)) => {
            tracing::warn!("{}", answer.trim());
            crate::handover::reply(&c, &answer);
            return Ok(());
        }
        None => {}
    }
    if let Some(rest) = line.trim().strip_prefix("monitor drops") {
        let mut words: Vec<&str> = rest.split_whitespace().collect();
        let punted = words.last() == Some(&"punted");
        if punted {
            words.pop();
        }
        let Ok(sample) = (match words.as_slice() {
            [] => Ok(1),
            [n] => n.parse::<u32>(),
            _ => "x".parse::<u32>(),
        }) else {
            (&c).write_all(b"error: monitor drops [SAMPLE] [punted]: SAMPLE is a whole number\n")?;
            return Ok(());
        };
        // Its own thread: the stream lasts until the client goes, and the admin socket must
        // keep answering (a hand-over among others) meanwhile.
        let taps: Vec<_> = workers.iter().map(|w| (w.id, w.tap.clone())).collect();
        c.set_read_timeout(None)?;
        std::thread::Builder::new()
            .name("xlb-monitor".into())
            .spawn(move || crate::monitor::serve(c, &taps, sample, punted))?;
        return Ok(());
    }
    let out = match line.trim() {
        "services" => services(tables, workers),
        "conntrack" => conntrack(tables, workers),
        "stats" => stats(tables, workers),
        other => format!("error: unknown command {other:?} (services, conntrack, stats, monitor drops)\n"),
    };
    (&c).write_all(out.as_bytes())?;
    Ok(())
}

fn services(tables: &TablesHandle, workers: &[WorkerView]) -> String {
    let t = tables.load();
    let refs: Vec<BackendRef> = t.backends.iter().flatten().map(|b| b.this).collect();
    let mut sums: std::collections::HashMap<BackendRef, (u64, u64)> = std::collections::HashMap::new();
    for w in workers {
        let (tx, rx) = mpsc::channel();
        if w.requests.send(Request::Connections(refs.clone(), tx)).is_ok()
            && let Ok(counts) = rx.recv_timeout(Duration::from_secs(2))
        {
            for (r, (a, i)) in refs.iter().zip(counts) {
                let e = sums.entry(*r).or_default();
                e.0 += u64::from(a);
                e.1 += u64::from(i);
            }
        }
    }
    xlb::show::render_with_connections(&t, &|r| sums.get(&r).copied().unwrap_or_default())
}

/// One line per flow; `backend=ADDR:PORT` while the flow's backend is in the running tables,
/// `backend=gone#REF` once it left them.
fn conntrack(tables: &TablesHandle, workers: &[WorkerView]) -> String {
    let t = tables.load();
    let mut out = String::new();
    for w in workers {
        let (tx, rx) = mpsc::channel();
        if w.requests.send(Request::DumpFlows(tx)).is_err() {
            continue;
        }
        let Ok(flows) = rx.recv_timeout(Duration::from_secs(5)) else { continue };
        for f in flows {
            let proto = match f.proto {
                6 => "tcp",
                17 => "udp",
                132 => "sctp",
                _ => "?",
            };
            let _ = writeln!(
                out,
                "worker={} {proto} {} src={} sport={} dst={} dport={} backend={} expires_in={}s{}",
                w.id,
                f.state.name(),
                f.client,
                f.cport,
                f.vip,
                f.vport,
                t.backend(f.backend).map_or_else(
                    || format!("gone#{}", f.backend.0),
                    |b| std::net::SocketAddr::new(b.addr, b.port).to_string()
                ),
                f.expires_in_s,
                f.snat_port.map(|p| format!(" snat_port={p}")).unwrap_or_default()
            );
        }
    }
    out
}

fn stats(tables: &TablesHandle, workers: &[WorkerView]) -> String {
    let t = tables.load();
    let mut out = String::new();
    for w in workers {
        let c = &w.counters;
        let _ = writeln!(
            out,
            "worker {} rx {} tx {} pass {} conntrack_entries {}",
            w.id,
            c.rx.get(),
            c.tx.get(),
            c.pass.get(),
            c.ct_entries.get()
        );
        for &r in DropReason::ALL {
            let n = c.drops_of(r);
            if n > 0 {
                let _ = writeln!(out, "worker {} drop {} {}", w.id, r.name(), n);
            }
        }
        for &e in Event::ALL {
            let n = c.events_of(e);
            if n > 0 {
                let _ = writeln!(out, "worker {} event {} {}", w.id, e.name(), n);
            }
        }
        let _ = write!(out, "worker {} bytes", w.id);
        for &b in ByteCounter::ALL {
            let _ = write!(out, " {} {}", b.name(), c.bytes_of(b));
        }
        out.push('\n');
        for &r in DropReason::ALL {
            let n = c.drop_bytes_of(r);
            if n > 0 {
                let _ = writeln!(out, "worker {} drop_bytes {} {}", w.id, r.name(), n);
            }
        }
        let _ = write!(out, "worker {} xsk", w.id);
        for (c, v) in w.xsk.values() {
            let _ = write!(out, " {} {v}", c.name());
        }
        out.push('\n');
    }
    for b in t.backends.iter().flatten() {
        let pkts: u64 =
            workers.iter().map(|w| w.counters.objects.backend_packets.get(b.this.index()).map_or(0, |c| c.get())).sum();
        let flows: u64 =
            workers.iter().map(|w| w.counters.objects.backend_flows.get(b.this.index()).map_or(0, |c| c.get())).sum();
        let svc = t.services.get(b.service as usize).map_or("?", |s| &s.name);
        let _ = writeln!(out, "backend {svc} {}:{} packets {pkts} new_flows {flows}", b.addr, b.port);
    }
    out
}

/// Client side: sends `cmd` and returns the answer.
pub(crate) fn request(path: &Path, cmd: &str) -> Result<String> {
    let mut c =
        UnixStream::connect(path).with_context(|| format!("connecting to {} (is xlb running?)", path.display()))?;
    c.write_all(format!("{cmd}\n").as_bytes())?;
    c.shutdown(std::net::Shutdown::Write)?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut c, &mut out)?;
    Ok(out)
}
