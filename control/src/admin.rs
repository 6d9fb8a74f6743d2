//! The admin socket: a Unix stream socket (mode 0600, so only root can open it) that answers
//! one command per connection with text: `services` (the `ipvsadm -Ln` layout with active and
//! inactive connections summed over workers), `conntrack` (the flow table) and `stats`
//! (per-worker counters: rx/tx, drops by reason, events, AF_XDP frame accounting, and packets
//! per backend). `handover V` is the new process's request of a hand-over
//! ([`crate::handover`]). `monitor drops [SAMPLE] [punted]` streams the frames the workers drop (and hand to the kernel)
//! ([`crate::monitor`]) until the client goes away.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// How long a client has to send its whole command line once its connection is taken up: a
/// deadline for the line, not a timeout per read (a timeout per read let a client that sends
/// a byte now and then hold its connection for ever), answered `error: no complete command
/// line …`.
const LINE_DEADLINE: Duration = Duration::from_secs(5);

/// How many connections the admin socket serves at once, each on its own thread; one more is
/// answered `error: … busy` at once and closed. Only root can connect (mode 0600), so this
/// bounds the threads a runaway script makes, not an attack. [`LINE_DEADLINE`] frees a
/// slot that waits for its line; a slot that answers waits for the workers at most a few
/// seconds, and then for the client to read the answer.
const MAX_CONNECTIONS: usize = 16;

/// The running server; dropping it stops the accepting thread and removes the socket
/// (connections being served finish on their own threads).
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
///
/// Each connection is served on its own thread (at most [`MAX_CONNECTIONS`] at once), so a
/// client that is slow to send its line or to read its answer holds up no other, a new
/// xlb's `handover` among them (it gives up after 30 s). Hand-overs need no serialising
/// here: the handler only passes the connection on, and the main loop takes one request
/// and stops; a second one waiting in the channel is closed with it.
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
    let views: Arc<[WorkerView]> = workers
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
    let serving = Arc::new(AtomicUsize::new(0));
    let thread = std::thread::Builder::new().name("xlb-admin".into()).spawn(move || {
        for conn in listener.incoming() {
            if stop2.load(Ordering::Relaxed) {
                break;
            }
            let Ok(c) = conn else { continue };
            let Some(slot) = Slot::take(&serving) else {
                tracing::warn!(connections = MAX_CONNECTIONS, "admin socket: a connection refused, all busy");
                let _ = (&c).write_all(
                    format!("error: this xlb serves {MAX_CONNECTIONS} admin connections already (busy); try again\n")
                        .as_bytes(),
                );
                continue;
            };
            let (tables, views, handover) = (tables.clone(), views.clone(), handover.clone());
            let spawned = std::thread::Builder::new().name("xlb-admin-conn".into()).spawn(move || {
                let _slot = slot;
                let _ = handle(c, &tables, &views, &handover);
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "admin socket: no thread for a connection; closed");
            }
        }
    })?;
    Ok(Admin { stop, path: path.to_owned(), thread: Some(thread) })
}

/// Longest command line the admin socket reads, in bytes, newline included; a longer one is
/// refused with an `error:` answer and not read further. The longest real line is a new
/// xlb's `handover V xsk2=LAYOUT`, whose layout grows with workers × interfaces (some 40
/// bytes per worker with two interfaces, already 5 KB for 128 workers): 64 KiB leaves room
/// for that and bounds what one connection makes this process hold.
const MAX_LINE: usize = 64 * 1024;

/// How much of an unknown command its `error:` answer repeats, in bytes at most (cut at a
/// character boundary, `…` marking the cut).
const ECHO: usize = 64;

/// Reads one command line from `c`: up to its newline, or to the end of the stream.
/// `Ok(Ok(line))` the line (newline included); `Ok(Err(answer))` a line refused, with the
/// `error:` answer for the client: longer than [`MAX_LINE`] bytes, or not UTF-8. `Err` if
/// the read fails (the client reset the connection). A line not complete within
/// [`LINE_DEADLINE`] of `started` is refused too; the read timeout of `c` is left at the
/// time that was left of it.
fn read_command(c: &UnixStream, started: Instant) -> Result<std::result::Result<String, String>> {
    let mut line = Vec::new();
    let reader = ByDeadline { c, deadline: started + LINE_DEADLINE };
    match BufReader::new(reader).take(MAX_LINE as u64).read_until(b'\n', &mut line) {
        Ok(_) => {}
        Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
            return Ok(Err(format!(
                "error: no complete command line within {}s of connecting\n",
                LINE_DEADLINE.as_secs()
            )));
        }
        Err(e) => return Err(e.into()),
    }
    if line.last() != Some(&b'\n') && line.len() >= MAX_LINE {
        return Ok(Err(format!("error: the command line is longer than {MAX_LINE} bytes; not read\n")));
    }
    Ok(String::from_utf8(line).map_err(|e| {
        format!("error: the command line is not UTF-8 text (invalid byte at offset {})\n", e.utf8_error().valid_up_to())
    }))
}

/// At most the first [`ECHO`] bytes of `s` (a prefix ending at a character boundary), with
/// `…` after it if `s` is longer.
fn echo(s: &str) -> String {
    if s.len() <= ECHO {
        return s.to_owned();
    }
    let end = (0..=ECHO).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &s[..end])
}

/// One of the [`MAX_CONNECTIONS`] connections being served; dropping it frees the slot.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A slot of `serving` (the count of connections being served), `None` if all are taken.
    fn take(serving: &Arc<AtomicUsize>) -> Option<Self> {
        serving.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_CONNECTIONS).then_some(n + 1)).ok()?;
        Some(Self(serving.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A read half of a connection whose reads all end by `deadline`: before each read the
/// socket's read timeout is set to the time left, and once none is left a read fails
/// with [`std::io::ErrorKind::TimedOut`].
struct ByDeadline<'a> {
    c: &'a UnixStream,
    deadline: Instant,
}

impl std::io::Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline passed"));
        }
        self.c.set_read_timeout(Some(left))?;
        let mut c = self.c;
        c.read(buf)
    }
}

fn handle(
    c: UnixStream,
    tables: &TablesHandle,
    workers: &[WorkerView],
    handover: &mpsc::Sender<(UnixStream, Option<String>)>,
) -> Result<()> {
    let line = match read_command(&c, Instant::now())? {
        Ok(line) => line,
        Err(answer) => {
            tracing::warn!("admin socket: {}", answer.trim());
            (&c).write_all(answer.as_bytes())?;
            return Ok(());
        }
    };
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
        other => format!("error: unknown command {:?} (services, conntrack, stats, monitor drops)\n", echo(other)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `request` to a fresh admin connection's handler and returns what the client reads.
    fn ask(request: &[u8]) -> (Result<()>, String) {
        let (client, server) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
        let (tx, _rx) = mpsc::channel();
        (&client).write_all(request).unwrap_or_else(|e| panic!("write: {e}"));
        client.shutdown(std::net::Shutdown::Write).unwrap_or_else(|e| panic!("shutdown: {e}"));
        let handled = handle(server, &TablesHandle::default(), &[], &tx);
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut &client, &mut out);
        (handled, out)
    }

    #[test]
    fn a_command_that_is_not_utf8_gets_an_error_answer() {
        let (handled, out) = ask(b"stats\xff\n");
        assert!(
            out.starts_with("error:"),
            "a malformed command must be answered with an error naming it; got {out:?} (handler: {handled:?})"
        );
    }

    #[test]
    fn an_overlong_command_line_is_refused_without_being_read_whole_or_echoed() {
        let (client, server) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
        let (tx, _rx) = mpsc::channel();
        // 16 MiB without a newline, then one: the handler kept all of it in memory (no
        // limit on the line) and echoed it back in its error.
        let writer = {
            let c = client.try_clone().unwrap_or_else(|e| panic!("clone: {e}"));
            std::thread::spawn(move || {
                let chunk = vec![b'a'; 1 << 20];
                for _ in 0..16 {
                    if (&c).write_all(&chunk).is_err() {
                        return;
                    }
                }
                let _ = (&c).write_all(b"\n");
                let _ = c.shutdown(std::net::Shutdown::Write);
            })
        };
        let reader = {
            let c = client.try_clone().unwrap_or_else(|e| panic!("clone: {e}"));
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = std::io::Read::read_to_end(&mut &c, &mut out);
                out
            })
        };
        let _ = handle(server, &TablesHandle::default(), &[], &tx);
        drop(client);
        let _ = writer.join();
        let out = reader.join().unwrap_or_default();
        assert!(out.starts_with(b"error:"), "{:?}", String::from_utf8_lossy(&out[..out.len().min(80)]));
        assert!(
            out.len() <= 4096,
            "a 16 MiB command line was read whole and echoed back: {} bytes of answer",
            out.len()
        );
    }

    #[test]
    fn an_unknown_command_is_repeated_in_its_error_only_as_a_short_prefix() {
        let (handled, out) = ask(format!("{}\n", "é".repeat(1000)).as_bytes());
        assert!(handled.is_ok(), "{handled:?}");
        assert!(out.starts_with("error: unknown command \"éé"), "{out:?}");
        assert!(out.contains("é…\""), "the cut is marked, at a character boundary: {out:?}");
        assert!(out.len() < 200, "{} bytes of answer to an unknown command: {out:?}", out.len());
    }

    #[test]
    fn a_client_that_never_finishes_its_line_does_not_hold_up_other_admin_clients() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("xlb.sock");
        let (tx, _rx) = mpsc::channel();
        let admin = serve(&path, TablesHandle::default(), &[], tx).unwrap_or_else(|e| panic!("serve: {e:#}"));
        // A slow (or stuck) client: one byte every second, never a newline, for 8 s.
        let slow = UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect: {e}"));
        let trickle = std::thread::spawn(move || {
            for _ in 0..8 {
                if (&slow).write_all(b"s").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        // Another client (the operator's `xlb stats`, or a new xlb's `handover`).
        let started = std::time::Instant::now();
        let c = UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect: {e}"));
        c.set_read_timeout(Some(Duration::from_secs(6))).unwrap_or_else(|e| panic!("timeout: {e}"));
        (&c).write_all(b"nosuchcommand\n").unwrap_or_else(|e| panic!("write: {e}"));
        let mut line = String::new();
        let r = BufReader::new(&c).read_line(&mut line);
        let waited = started.elapsed();
        let _ = trickle.join();
        drop(admin);
        assert!(
            r.is_ok() && line.starts_with("error:"),
            "no answer within {waited:?} while another client trickles its line: {r:?} {line:?}"
        );
    }

    #[test]
    fn a_command_line_not_complete_within_the_deadline_is_refused_although_bytes_keep_coming() {
        let (client, server) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
        let (tx, _rx) = mpsc::channel();
        // One byte a second, never a newline: no single read waits long.
        let trickle = {
            let c = client.try_clone().unwrap_or_else(|e| panic!("clone: {e}"));
            std::thread::spawn(move || {
                for _ in 0..8 {
                    if (&c).write_all(b"s").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        };
        let started = Instant::now();
        let handled = handle(server, &TablesHandle::default(), &[], &tx);
        let took = started.elapsed();
        client.set_read_timeout(Some(Duration::from_secs(1))).unwrap_or_else(|e| panic!("timeout: {e}"));
        let mut out = String::new();
        let _ = BufReader::new(&client).read_line(&mut out);
        let _ = trickle.join();
        assert!(handled.is_ok(), "{handled:?}");
        assert!(took < LINE_DEADLINE + Duration::from_secs(1), "the line was waited for {took:?}");
        assert!(out.starts_with("error: no complete command line within 5s"), "{out:?}");
    }

    #[test]
    fn a_connection_beyond_the_bound_is_refused_as_busy_until_another_ends() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("xlb.sock");
        let (tx, _rx) = mpsc::channel();
        let admin = serve(&path, TablesHandle::default(), &[], tx).unwrap_or_else(|e| panic!("serve: {e:#}"));
        let ask = || {
            let c = UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect: {e}"));
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap_or_else(|e| panic!("timeout: {e}"));
            // A refused connection may be closed before this write (broken pipe); its answer
            // is there to read either way.
            let _ = (&c).write_all(b"nosuchcommand\n");
            let mut line = String::new();
            let _ = BufReader::new(&c).read_line(&mut line);
            line
        };
        let idle: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect: {e}")))
            .collect();
        let busy = ask();
        assert!(busy.starts_with("error: this xlb serves 16 admin connections already (busy)"), "{busy:?}");
        drop(idle);
        let started = Instant::now();
        let mut answer = ask();
        while answer.contains("(busy)") && started.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
            answer = ask();
        }
        drop(admin);
        assert!(answer.starts_with("error: unknown command"), "{answer:?}");
    }

    #[test]
    fn a_client_that_sends_nothing_does_not_delay_the_answer_to_another() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("xlb.sock");
        let (tx, _rx) = mpsc::channel();
        let admin = serve(&path, TablesHandle::default(), &[], tx).unwrap_or_else(|e| panic!("serve: {e:#}"));
        let idle = UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect: {e}"));
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let c = UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect: {e}"));
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap_or_else(|e| panic!("timeout: {e}"));
        (&c).write_all(b"nosuchcommand\n").unwrap_or_else(|e| panic!("write: {e}"));
        let mut line = String::new();
        let r = BufReader::new(&c).read_line(&mut line);
        let waited = started.elapsed();
        drop(idle);
        drop(admin);
        assert!(
            r.is_ok() && line.starts_with("error: unknown command"),
            "no answer within {waited:?} while another client is connected and silent: {r:?} {line:?}"
        );
    }
}
