//! Load that runs through xlb while faults are injected (`tests/tests/chaos.rs`, issue 11's
//! reliability suite), and what it measures:
//!
//! - [`EchoServer`]: a TCP echo service on every backend; each connection first gets one
//!   greeting line `be<i> <peer>` (which backend, and the client address it sees: the client's
//!   own for DNAT, the SNAT address and port for masqueraded traffic). On the same UDP port,
//!   every datagram is answered at once with that line.
//! - [`Streams`]: long-lived client connections that each send a numbered message every
//!   interval and check that the same bytes come back; a connection that is reset, closed,
//!   silent for [`STREAM_TIMEOUT`] or echoes wrong bytes is broken.
//! - [`Wrk`]: `wrk` in the client namespace, with its request and error counts.
//! - [`rss_kib`] and [`tcp_retransmissions`]: memory of a process and segments a namespace's
//!   TCP had to send again (a frame lost anywhere on the path costs one).

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{BACKENDS, Result, Role, Testbed, TestbedError, backend_of, io_err, netns_path};

/// Runs `f` on a new thread that has joined the network namespace at `ns` (`/run/netns/NAME`)
/// and returns its result; a panic in `f` is raised again here.
///
/// # Errors
/// When the namespace cannot be opened or joined.
pub fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> T + Send) -> Result<T> {
    let file = std::fs::File::open(ns).map_err(io_err(format!("cannot open {}", ns.display())))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| io_err(format!("setns({})", ns.display()))(std::io::Error::from(e)))?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Starts a thread named `name` in the network namespace at `ns` running `f` (a server that
/// outlives the call); its result comes back through the handle.
///
/// # Errors
/// When the namespace cannot be opened or the thread cannot be spawned.
pub fn spawn_in_netns<T, F>(ns: &Path, name: &str, f: F) -> Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let file = std::fs::File::open(ns).map_err(io_err(format!("cannot open {}", ns.display())))?;
    let shown = ns.display().to_string();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if let Err(e) = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET) {
                panic!("setns({shown}): {e}");
            }
            drop(file);
            f()
        })
        .map_err(io_err(format!("cannot spawn {name}")))
}

/// How long a stream waits for its echo before it counts the connection as broken. Longer
/// than any forwarding gap xlb may cause (a few TCP retransmissions), far shorter than the
/// kernel's own give-up time (15 retransmissions, about 15 minutes).
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(20);

/// Bytes of one stream message (newline included).
const MESSAGE_LEN: usize = 64;

/// A TCP echo service on `0.0.0.0:port` of every backend (`be1`..`be3`), and a UDP service on
/// the same port that answers each datagram with `be<i> <peer>`. Stops accepting when
/// dropped; its connections end when their clients close them.
#[derive(Debug)]
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl EchoServer {
    /// Starts the service on every backend and returns once all of them listen.
    ///
    /// # Errors
    /// When a namespace cannot be entered or the port cannot be bound.
    pub fn start(tb: &Testbed, port: u16) -> Result<Self> {
        let backends: Vec<(u8, PathBuf)> =
            (1..=BACKENDS).map(|i| (i, netns_path(&tb.ns_name(Role::Backend(i))))).collect();
        Self::start_in(&backends, port)
    }

    /// As [`EchoServer::start`], on the backends of any testbed: `(i, namespace path)`, where
    /// backend `i` greets as `be<i>`.
    ///
    /// # Errors
    /// As [`EchoServer::start`].
    pub fn start_in(backends: &[(u8, PathBuf)], port: u16) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (i, ns) in backends {
            let i = *i;
            let (tx, rx) = std::sync::mpsc::channel();
            let stop_tcp = stop.clone();
            threads.push(spawn_in_netns(ns, &format!("echo-be{i}"), move || {
                let stop = stop_tcp;
                let listener = match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = listener.set_nonblocking(true);
                let _ = tx.send(Ok(()));
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, peer)) => {
                            let stop = stop.clone();
                            let _ = std::thread::Builder::new()
                                .name(format!("echo-be{i}-conn"))
                                .spawn(move || echo(conn, i, peer, &stop));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })?);
            rx.recv_timeout(Duration::from_secs(5))
                .map_err(|_| TestbedError::Timeout(format!("echo server on be{i} did not start")))?
                .map_err(io_err(format!("echo server on be{i}: bind port {port}")))?;
            let (tx, rx) = std::sync::mpsc::channel();
            let stop_udp = stop.clone();
            threads.push(spawn_in_netns(ns, &format!("udp-echo-be{i}"), move || {
                let sock = match std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
                let _ = tx.send(Ok(()));
                let mut buf = [0u8; 2048];
                while !stop_udp.load(Ordering::Relaxed) {
                    if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                        let _ = sock.send_to(format!("be{i} {peer}\n").as_bytes(), peer);
                    }
                }
            })?);
            rx.recv_timeout(Duration::from_secs(5))
                .map_err(|_| TestbedError::Timeout(format!("UDP echo server on be{i} did not start")))?
                .map_err(io_err(format!("UDP echo server on be{i}: bind port {port}")))?;
        }
        Ok(Self { stop, threads })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One echo connection on backend `i`: the greeting, then every byte back until EOF, an
/// error or `stop`.
fn echo(mut conn: TcpStream, i: u8, peer: SocketAddr, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
    if conn.write_all(format!("be{i} {peer}\n").as_bytes()).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Gaps of a stream longer than this are listed ([`StreamReport::long_gaps`]): above a
/// stream's usual jitter, below TCP's minimum retransmission timeout (200 ms).
pub const LONG_GAP: Duration = Duration::from_millis(100);

/// How one stream went.
#[derive(Debug, Clone)]
pub struct StreamReport {
    /// Index of the connection in its [`Streams`].
    pub id: usize,
    /// Where it connected (a VIP or a node port).
    pub dest: SocketAddr,
    /// The client's local port.
    pub local_port: u16,
    /// The backend that greeted it (1-based).
    pub backend: u8,
    /// The client address the backend saw (`10.250.1.2:PORT` for DNAT; the SNAT address and
    /// port for masqueraded traffic).
    pub seen_as: String,
    /// Messages echoed back intact.
    pub echoes: u64,
    /// Longest time between two echoes, less the pause between messages: the longest
    /// forwarding gap this connection saw.
    pub max_gap: Duration,
    /// Every gap (as [`StreamReport::max_gap`]) longer than [`LONG_GAP`]: when it ended (since
    /// [`Streams::open`], as [`Streams::started`] tells) and how long it was.
    pub long_gaps: Vec<(Duration, Duration)>,
    /// Why and when (since [`Streams::open`]) the connection broke; `None` if it did not.
    pub broken: Option<(Duration, String)>,
}

/// A TCP connection to `dest` from a client port no other socket of the namespace holds: the
/// socket is bound to port 0 before connect(2). An unbound socket's connect(2) may be given a
/// port that connections to other destinations already use (Linux's `__inet_hash_connect`
/// only keeps the 4-tuple unique), and two such connections through two DNAT frontends to one
/// backend meet one reply tuple at the backend: xlb keeps the live flow's and drops the newer
/// one (`reply_tuple_in_use`, as Linux conntrack does; dataplane/tests/fixtures.rs pins it), a
/// collision the streams' tests do not mean to test.
///
/// # Errors
/// The socket, bind or connect error (a timeout after `timeout`).
fn connect_from_own_port(dest: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let sock =
        socket2::Socket::new(socket2::Domain::for_address(dest), socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    let any: SocketAddr = match dest {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    sock.bind(&any.into())?;
    sock.connect_timeout(&dest.into(), timeout)?;
    Ok(sock.into())
}

/// Long-lived TCP connections from the client that stream numbered messages through xlb to
/// an [`EchoServer`] and check every echo. Each has its own thread; [`Streams::finish`]
/// stops them and reports.
#[derive(Debug)]
pub struct Streams {
    stop: Arc<AtomicBool>,
    broken: Arc<AtomicUsize>,
    /// Echoes so far, per connection.
    echoes: Arc<[std::sync::atomic::AtomicU64]>,
    /// The client's local port of each connection.
    local_ports: Vec<u16>,
    /// Where the connections go.
    dest: SocketAddr,
    threads: Vec<JoinHandle<StreamReport>>,
    start: Instant,
}

impl Streams {
    /// Opens `n` connections from the client to `dest`, reads each greeting, and starts
    /// streaming: one `MESSAGE_LEN`-byte message every `pause` per connection.
    ///
    /// # Errors
    /// When the client namespace cannot be entered, a connection cannot be made, or its
    /// greeting is not `be<i> <peer>`.
    pub fn open(tb: &Testbed, dest: SocketAddr, n: usize, pause: Duration) -> Result<Self> {
        Self::open_with_timeout(tb, dest, n, pause, STREAM_TIMEOUT)
    }

    /// [`Streams::open`] with `timeout` instead of [`STREAM_TIMEOUT`] as the silence after
    /// which a connection counts as broken: for faults that saturate the machine, where TCP's
    /// retransmission backoff (up to 120 s between tries, `TCP_RTO_MAX`) can keep a live
    /// connection silent for longer.
    ///
    /// # Errors
    /// As [`Streams::open`].
    pub fn open_with_timeout(
        tb: &Testbed,
        dest: SocketAddr,
        n: usize,
        pause: Duration,
        timeout: Duration,
    ) -> Result<Self> {
        Self::open_from(&netns_path(&tb.ns_name(Role::Client)), dest, n, pause, timeout)
    }

    /// [`Streams::open_with_timeout`] from the network namespace at `client` (any testbed's
    /// client).
    ///
    /// # Errors
    /// As [`Streams::open`].
    pub fn open_from(client: &Path, dest: SocketAddr, n: usize, pause: Duration, timeout: Duration) -> Result<Self> {
        let conns = in_netns(client, move || -> Result<Vec<(TcpStream, u8, String)>> {
            (0..n)
                .map(|k| {
                    let mut c = connect_from_own_port(dest, Duration::from_secs(5))
                        .map_err(io_err(format!("stream {k} to {dest}: connect")))?;
                    c.set_read_timeout(Some(Duration::from_secs(5))).map_err(io_err("set_read_timeout"))?;
                    let line = read_line(&mut c).map_err(io_err(format!("stream {k} to {dest}: greeting")))?;
                    let (who, peer) = line
                        .split_once(' ')
                        .ok_or_else(|| TestbedError::Parse { what: "echo greeting", text: line.clone() })?;
                    let b = backend_of(who)
                        .ok_or_else(|| TestbedError::Parse { what: "echo greeting", text: line.clone() })?;
                    Ok((c, b, peer.to_owned()))
                })
                .collect()
        })??;
        let stop = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(AtomicUsize::new(0));
        let echoes: Arc<[std::sync::atomic::AtomicU64]> =
            (0..conns.len()).map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
        let start = Instant::now();
        let mut threads = Vec::new();
        let mut local_ports = Vec::new();
        for (id, (c, backend, seen_as)) in conns.into_iter().enumerate() {
            let (stop, broken, echoes) = (stop.clone(), broken.clone(), echoes.clone());
            let local_port = c.local_addr().map(|a| a.port()).unwrap_or(0);
            local_ports.push(local_port);
            let report = StreamReport {
                id,
                dest,
                local_port,
                backend,
                seen_as,
                echoes: 0,
                max_gap: Duration::ZERO,
                long_gaps: Vec::new(),
                broken: None,
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("stream-{id}"))
                    .spawn(move || {
                        let live = Live { stop: &stop, broken: &broken, echoes: echoes.get(id), timeout };
                        stream(c, report, pause, start, &live)
                    })
                    .map_err(io_err("spawn a stream thread"))?,
            );
        }
        Ok(Self { stop, broken, echoes, local_ports, dest, threads, start })
    }

    /// When the streams started (the origin of [`StreamReport::long_gaps`]' times).
    #[must_use]
    pub fn started(&self) -> Instant {
        self.start
    }

    /// The client's local port of each connection, in the order they were opened.
    #[must_use]
    pub fn local_ports(&self) -> &[u16] {
        &self.local_ports
    }

    /// Echoes each connection has had so far, in the order they were opened.
    #[must_use]
    pub fn echoes(&self) -> Vec<u64> {
        self.echoes.iter().map(|e| e.load(Ordering::Relaxed)).collect()
    }

    /// Connections broken so far.
    #[must_use]
    pub fn broken(&self) -> usize {
        self.broken.load(Ordering::Relaxed)
    }

    /// Stops streaming (each connection finishes its message and closes) and reports every
    /// connection, in the order they were opened. A connection whose thread panicked is
    /// reported broken ("stream thread panicked"), backend 0.
    #[must_use]
    pub fn finish(mut self) -> Vec<StreamReport> {
        self.stop.store(true, Ordering::Relaxed);
        let threads = std::mem::take(&mut self.threads);
        threads
            .into_iter()
            .enumerate()
            .map(|(id, t)| {
                t.join().unwrap_or_else(|_| StreamReport {
                    id,
                    dest: self.dest,
                    local_port: self.local_ports.get(id).copied().unwrap_or(0),
                    backend: 0,
                    seen_as: String::new(),
                    echoes: self.echoes.get(id).map_or(0, |e| e.load(Ordering::Relaxed)),
                    max_gap: Duration::ZERO,
                    long_gaps: Vec::new(),
                    broken: Some((self.start.elapsed(), "stream thread panicked".to_owned())),
                })
            })
            .collect()
    }
}

impl Drop for Streams {
    /// Stops the streams of a test that failed before [`Streams::finish`]: each thread ends
    /// after its current message (or its timeout).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads one `\n`-terminated line, byte by byte (nothing after it is consumed).
fn read_line(c: &mut TcpStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 256 {
        c.read_exact(&mut b)?;
        if b[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(b[0]);
    }
    Err(std::io::Error::other("greeting longer than 256 bytes"))
}

/// What a stream's thread shares with its [`Streams`].
struct Live<'a> {
    stop: &'a AtomicBool,
    broken: &'a AtomicUsize,
    echoes: Option<&'a std::sync::atomic::AtomicU64>,
    timeout: Duration,
}

/// One stream's thread: message, echo, check, pause, until `stop` or the connection breaks.
fn stream(mut c: TcpStream, mut r: StreamReport, pause: Duration, start: Instant, live: &Live<'_>) -> StreamReport {
    let (stop, broken) = (live.stop, live.broken);
    if let Err(e) = c.set_read_timeout(Some(live.timeout)).and_then(|()| c.set_write_timeout(Some(live.timeout))) {
        r.broken = Some((start.elapsed(), format!("set timeouts: {e}")));
        broken.fetch_add(1, Ordering::Relaxed);
        return r;
    }
    let mut last = Instant::now();
    let mut got = [0u8; MESSAGE_LEN];
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut msg = format!("{} {seq} ", r.id).into_bytes();
        msg.resize(MESSAGE_LEN - 1, b'.');
        msg.push(b'\n');
        let res = c.write_all(&msg).map_err(|e| format!("write: {e}")).and_then(|()| {
            c.read_exact(&mut got).map_err(|e| format!("read: {e}"))?;
            if got == msg.as_slice() {
                Ok(())
            } else {
                Err(format!("echo of message {seq} differs: {:?}", String::from_utf8_lossy(&got)))
            }
        });
        if let Err(e) = res {
            r.broken = Some((start.elapsed(), e));
            broken.fetch_add(1, Ordering::Relaxed);
            return r;
        }
        r.echoes += 1;
        if let Some(e) = live.echoes {
            e.store(r.echoes, Ordering::Relaxed);
        }
        let gap = last.elapsed().saturating_sub(pause);
        r.max_gap = r.max_gap.max(gap);
        if gap > LONG_GAP {
            r.long_gaps.push((start.elapsed(), gap));
        }
        seq += 1;
        std::thread::sleep(pause);
        last = Instant::now();
    }
    let _ = c.shutdown(std::net::Shutdown::Both);
    r
}

/// What `wrk` reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WrkReport {
    /// Completed requests (`N requests in ...`).
    pub requests: u64,
    /// `Socket errors: connect A, read B, write C, timeout D`, summed (0 if the line is absent).
    pub socket_errors: u64,
    /// `Non-2xx or 3xx responses: N` (0 if absent).
    pub non_2xx: u64,
    /// wrk's whole output.
    pub text: String,
}

impl WrkReport {
    /// Requests that failed: socket errors plus non-2xx/3xx answers.
    #[must_use]
    pub fn failed(&self) -> u64 {
        self.socket_errors + self.non_2xx
    }

    /// Parses wrk's summary.
    ///
    /// # Errors
    /// When the `requests in` line is missing.
    pub fn parse(text: &str) -> Result<Self> {
        let requests = text
            .lines()
            .find_map(|l| l.trim().split_once(" requests in ").and_then(|(n, _)| n.trim().parse().ok()))
            .ok_or_else(|| TestbedError::Parse { what: "wrk output", text: text.to_owned() })?;
        let socket_errors = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Socket errors:"))
            .map(|rest| rest.split(',').filter_map(|f| f.split_whitespace().last()?.parse::<u64>().ok()).sum())
            .unwrap_or(0);
        let non_2xx = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:")?.trim().parse().ok())
            .unwrap_or(0);
        Ok(Self { requests, socket_errors, non_2xx, text: text.to_owned() })
    }
}

/// `wrk` running in the client namespace (one thread, `--timeout 10s`).
#[derive(Debug)]
pub struct Wrk(Option<Child>);

impl Wrk {
    /// Starts `wrk -t1 -c<connections> -d<duration> --timeout 10s <url>` in the client
    /// namespace.
    ///
    /// # Errors
    /// When wrk cannot be started.
    pub fn start(tb: &Testbed, url: &str, connections: u32, duration: Duration) -> Result<Self> {
        let child = Command::new("ip")
            .args(["netns", "exec", &tb.ns_name(Role::Client), "wrk", "-t1"])
            .arg(format!("-c{connections}"))
            .arg(format!("-d{}s", duration.as_secs().max(1)))
            .args(["--timeout", "10s", url])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err("cannot run wrk"))?;
        Ok(Self(Some(child)))
    }

    /// Stops wrk if it still runs (SIGINT: it stops and prints its summary as at the end of
    /// its duration), waits for it and parses its report.
    ///
    /// # Errors
    /// When wrk fails or its output has no summary.
    pub fn finish(mut self) -> Result<WrkReport> {
        let Some(mut child) = self.0.take() else {
            return Err(io_err("wrk")(std::io::Error::other("already finished")));
        };
        if child.try_wait().map_err(io_err("wrk"))?.is_none() {
            // `ip netns exec` execs wrk: the child's pid is wrk's.
            Command::new("kill").args(["-INT", &child.id().to_string()]).status().map_err(io_err("kill -INT wrk"))?;
        }
        let out = child.wait_with_output().map_err(io_err("waiting for wrk"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            return Err(TestbedError::Command {
                command: "wrk".into(),
                status: out.status,
                stdout: text,
                stderr: String::new(),
            });
        }
        WrkReport::parse(&text)
    }
}

impl Drop for Wrk {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A SYN flood from the client namespace: `xlb-pktgen run --proto syn --rate 0 --no-rx`
/// on the client's `eth0` (an AF_XDP socket that only transmits: no XDP program on the
/// interface, so the client's own connections are untouched), every frame a new flow from
/// one of 2^24 tuples (source ports of 280 addresses from `src`) to `dst`, as fast as the
/// generator can send.
#[derive(Debug)]
pub struct SynFlood(Option<Child>);

/// What a [`SynFlood`] sent (its JSON report).
#[derive(Debug, Clone, Copy)]
pub struct FloodReport {
    /// Frames sent, warmup included.
    pub packets: u64,
    /// Seconds it sent for.
    pub seconds: f64,
}

impl FloodReport {
    /// Average rate, packets per second.
    #[must_use]
    pub fn pps(&self) -> f64 {
        if self.seconds > 0.0 { self.packets as f64 / self.seconds } else { 0.0 }
    }
}

impl SynFlood {
    /// Starts the flood for `duration` from source addresses at `src` to `dst` (through
    /// the xlb node's `eth0`, [`crate::LB_MAC`]); `cpu` pins the generator.
    ///
    /// # Errors
    /// When xlb-pktgen cannot be found, built or started.
    pub fn start(tb: &Testbed, src: Ipv4Addr, dst: SocketAddr, duration: Duration, cpu: Option<usize>) -> Result<Self> {
        let bin = crate::pktgen_binary()?;
        let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        let mut cmd = Command::new(bin);
        cmd.args(["run", "--tx-netns", &tb.ns_name(Role::Client), "--tx-iface", "eth0", "--no-rx", "--proto", "syn"])
            .args(["--src-mac", &mac(crate::CLIENT_MAC), "--dst-mac", &mac(crate::LB_MAC)])
            .args(["--src-ip", &src.to_string(), "--dst-ip", &dst.ip().to_string()])
            .args(["--dst-port", &dst.port().to_string(), "--rate", "0", "--warmup", "0", "--json"])
            .arg("--duration")
            .arg(format!("{:.1}", duration.as_secs_f64()));
        if let Some(c) = cpu {
            cmd.arg("--cpu").arg(c.to_string());
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err("cannot run xlb-pktgen"))?;
        Ok(Self(Some(child)))
    }

    /// Waits for the flood to end (SIGINT first if `stop`: the generator stops and reports
    /// what it sent) and reads its report.
    ///
    /// # Errors
    /// When it fails or its report cannot be read.
    pub fn finish(mut self, stop: bool) -> Result<FloodReport> {
        let Some(mut child) = self.0.take() else {
            return Err(io_err("xlb-pktgen")(std::io::Error::other("already finished")));
        };
        if stop && child.try_wait().map_err(io_err("xlb-pktgen"))?.is_none() {
            Command::new("kill").args(["-INT", &child.id().to_string()]).status().map_err(io_err("kill -INT"))?;
        }
        let out = child.wait_with_output().map_err(io_err("waiting for xlb-pktgen"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let parse_err = || TestbedError::Command {
            command: "xlb-pktgen run --proto syn".into(),
            status: out.status,
            stdout: text.clone(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|_| parse_err())?;
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        match (n("tx_packets"), n("tx_warmup"), f("duration_s"), f("warmup_s")) {
            (Some(p), Some(w), Some(d), Some(ws)) if out.status.success() => {
                Ok(FloodReport { packets: p + w, seconds: d + ws })
            }
            _ => Err(parse_err()),
        }
    }
}

impl Drop for SynFlood {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Resident memory of process `pid` in KiB (`VmRSS` of /proc/PID/status).
#[must_use]
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// TCP segments retransmitted so far by the kernel of `role`'s namespace (`Tcp: RetransSegs`
/// of /proc/net/snmp read from inside it).
///
/// # Errors
/// When the file cannot be read in the namespace or has no such field.
pub fn tcp_retransmissions(tb: &Testbed, role: Role) -> Result<u64> {
    let snmp = tb.exec_ok(role, &["cat", "/proc/net/snmp"])?;
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap_or_default(), tcp.next().unwrap_or_default());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find_map(|(n, v)| (n == "RetransSegs").then(|| v.parse().ok()).flatten())
        .ok_or_else(|| TestbedError::Parse { what: "/proc/net/snmp", text: snmp.clone() })
}

#[cfg(test)]
mod tests {
    use super::WrkReport;

    #[test]
    fn wrk_report_sums_socket_errors_and_non_2xx() {
        let text = "Running 5s test @ http://10.250.100.31/\n  1 threads and 8 connections\n\
                    \x20 12345 requests in 5.00s, 3.00MB read\n\
                    \x20 Socket errors: connect 1, read 2, write 0, timeout 3\n\
                    \x20 Non-2xx or 3xx responses: 4\nRequests/sec:   2469.00\n";
        let r = WrkReport::parse(text).expect("parse");
        assert_eq!((r.requests, r.socket_errors, r.non_2xx, r.failed()), (12345, 6, 4, 10));
        let clean = WrkReport::parse("  42 requests in 1.00s, 1KB read\n").expect("parse");
        assert_eq!(clean.failed(), 0);
        assert!(WrkReport::parse("wrk: connection refused\n").is_err());
    }
}
