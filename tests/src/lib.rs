//! End-to-end test harness for xlb on network namespaces.
//!
//! [`Testbed::up`] builds the one-armed namespace testbed of `deploy/testbed.sh` (topology
//! and addresses in `docs/testbed.md`) under a prefix unique to this process and test, and
//! dropping the [`Testbed`] tears it down again, also when the test panics. The helpers run
//! commands and sockets inside the testbed's namespaces and read what the backends saw.
//!
//! Every test needs root (namespaces, veth, sysctls). Start each one with
//! [`skip_without_root`], so that an unprivileged `cargo test` reports a skip instead of a
//! failure:
//!
//! ```no_run
//! use xlb_e2e::{Role, Testbed, skip_without_root};
//!
//! if skip_without_root("my_test") {
//!     return;
//! }
//! let tb = Testbed::up().expect("testbed up");
//! let body = tb.curl(Role::Client, "http://10.250.2.11/").expect("curl");
//! assert_eq!(body, "be1\n");
//! ```

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod load;

/// The client's IPv4 address (on its `eth0`).
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 250, 1, 2);
/// The client's IPv6 address (on its `eth0`).
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 2);
/// The xlb node's address on the client subnet; the client's gateway for 10.250.0.0/16.
pub const LB_CLIENT_SIDE_V4: Ipv4Addr = Ipv4Addr::new(10, 250, 1, 1);
/// The xlb node's IPv6 address on the client subnet; the client's gateway for fd00:250::/32.
pub const LB_CLIENT_SIDE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 1);
/// The xlb node's address on the backend subnet; the backends' default gateway.
pub const LB_BACKEND_SIDE_V4: Ipv4Addr = Ipv4Addr::new(10, 250, 2, 1);
/// The xlb node's IPv6 address on the backend subnet; the backends' default gateway.
pub const LB_BACKEND_SIDE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 2, 0, 0, 0, 0, 1);
/// First address of the IPv4 VIP range 10.250.100.0/24 that the client routes via the xlb node.
pub const VIP_NET_V4: Ipv4Addr = Ipv4Addr::new(10, 250, 100, 0);
/// Prefix length of [`VIP_NET_V4`].
pub const VIP_NET_V4_PREFIX_LEN: u8 = 24;
/// First address of the IPv6 VIP range fd00:250:100::/64 that the client routes via the xlb node.
pub const VIP_NET_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0x100, 0, 0, 0, 0, 0);
/// Prefix length of [`VIP_NET_V6`].
pub const VIP_NET_V6_PREFIX_LEN: u8 = 64;
/// The IPv4 VIP that every backend holds locally for DSR (see [`DsrDecap`]).
pub const DSR_VIP_V4: Ipv4Addr = Ipv4Addr::new(10, 250, 100, 10);
/// The IPv6 VIP that every backend holds locally for DSR (see [`DsrDecap`]).
pub const DSR_VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0x100, 0, 0, 0, 0, 0x10);
/// MAC address of the client's `eth0`.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0x00, 0x0a, 0xfa, 0x01, 0x02];
/// MAC address of the xlb node's `eth0`.
pub const LB_MAC: [u8; 6] = [0x02, 0x00, 0x0a, 0xfa, 0x01, 0x01];
/// Number of backends (`be1` ..= `be3`).
pub const BACKENDS: u8 = 3;
/// The ingress IP of [`DROPPING_SERVICE`].
pub const DROPPING_LB_V4: Ipv4Addr = Ipv4Addr::new(10, 250, 100, 41);
/// A LoadBalancer Service to append to the testbed's config (`deploy/examples/testbed.yaml`)
/// in tests that need packets xlb drops whole and every time: `externalTrafficPolicy: Local`
/// with its one endpoint on another node, so each packet to its ingress IP
/// [`DROPPING_LB_V4`] (TCP 80 and 9000, UDP 53) is dropped as `no_endpoints_drop`
/// (kube-proxy's rule for a Local policy without a local endpoint, seed REJ-01).
pub const DROPPING_SERVICE: &str = "
---
apiVersion: v1
kind: Service
metadata: {name: elsewhere, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 10.250.100.40
  clusterIPs: [10.250.100.40]
  externalTrafficPolicy: Local
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 80, nodePort: 30090}
  - {name: echo, port: 9000, protocol: TCP, targetPort: 9000, nodePort: 30091}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30092}
status:
  loadBalancer:
    ingress:
    - ip: 10.250.100.41
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: elsewhere-x1
  namespace: demo
  labels: {kubernetes.io/service-name: elsewhere}
addressType: IPv4
endpoints:
- {addresses: [10.250.2.11], conditions: {ready: true}, nodeName: node-b1}
ports:
- {name: http, port: 80, protocol: TCP}
- {name: echo, port: 9000, protocol: TCP}
- {name: dns, port: 5353, protocol: UDP}
";

/// Which backend answered, from the body every backend server sends (`be<i>`, 1-based, or
/// [`LOCAL_POD`]);
/// `None` for anything else.
#[must_use]
pub fn backend_of(body: &str) -> Option<u8> {
    body.trim().strip_prefix("be")?.parse().ok().filter(|i| (1..=BACKENDS).contains(i) || *i == LOCAL_POD)
}
/// The number in the name of the pod on the lb node (`be4`, [`Role::LocalPod`]).
pub const LOCAL_POD: u8 = 4;
/// Port of nginx in every backend (IPv4 and IPv6); it answers `be<i>\n`.
pub const HTTP_PORT: u16 = 80;
/// UDP port of the backends' reply service: any datagram gets `be<i> <peer address>\n`.
pub const UDP_PORT: u16 = 5353;
/// TCP port of the backends' reply service: it writes `be<i> <peer address>\n` and closes.
pub const TCP_PORT: u16 = 9000;
/// Number of receive (and transmit) queues of the xlb node's `eth0`.
pub const LB_QUEUES: u8 = 2;

/// How long one UDP or TCP query attempt waits for its answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);
/// How many datagrams [`Testbed::udp_query`] sends before it gives up.
const UDP_ATTEMPTS: u32 = 3;
/// `curl --max-time`, in seconds.
const CURL_MAX_TIME_SECS: &str = "5";
/// Default directory of the testbed run directories (see `XLB_TESTBED_RUNDIR`).
const DEFAULT_RUN_BASE: &str = "/run/xlb-testbed";
/// Where `ip netns` keeps its namespace files.
const NETNS_DIR: &str = "/run/netns";

/// The file of the network namespace `name` (`/run/netns/NAME`), for [`load::in_netns`].
#[must_use]
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}
/// Prefix of the testbed names this harness picks (`xe<pid>t<counter>`).
const PREFIX_HEAD: &str = "xe";

/// The IPv4 address of backend `i` (1-based): 10.250.2.1`i`.
#[must_use]
pub const fn backend_v4(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 2, 10 + i)
}

/// The IPv6 address of backend `i` (1-based): fd00:250:2::1`i`.
#[must_use]
pub const fn backend_v6(i: u8) -> Ipv6Addr {
    // fd00:250:2::11 is written in hex digits, so be1 is 0x11
    Ipv6Addr::new(0xfd00, 0x250, 2, 0, 0, 0, 0, 0x10 + i as u16)
}

/// The MAC address of backend `i`'s `eth0` (1-based): 02:00:0a:fa:02:1`i`.
#[must_use]
pub const fn backend_mac(i: u8) -> [u8; 6] {
    [0x02, 0x00, 0x0a, 0xfa, 0x02, 0x10 + i]
}

/// One namespace of the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// `<prefix>-sw`: the Linux bridge `br0` that every host's veth peer is a port of.
    Switch,
    /// `<prefix>-client`: the traffic source.
    Client,
    /// `<prefix>-lb`: the xlb node (kernel forwarding on; xlb runs here).
    Lb,
    /// `<prefix>-be<i>`: backend `i`, 1-based, up to [`BACKENDS`].
    Backend(u8),
    /// `<prefix>-be4`: a pod on the lb node itself, behind the veth `vpod` (10.250.40.2),
    /// reached through the lb's kernel; nginx answers `be4`.
    LocalPod,
}

impl Role {
    /// Every role of a testbed, switch first.
    #[must_use]
    pub fn all() -> Vec<Self> {
        let mut v = vec![Self::Switch, Self::Client, Self::Lb];
        v.extend((1..=BACKENDS).map(Self::Backend));
        v.push(Self::LocalPod);
        v
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Switch => f.write_str("sw"),
            Self::Client => f.write_str("client"),
            Self::Lb => f.write_str("lb"),
            Self::Backend(i) => write!(f, "be{i}"),
            Self::LocalPod => f.write_str("be4"),
        }
    }
}

/// How the backends decapsulate DSR traffic (IPIP for IPv4 VIPs, IP6IP6 for IPv6 VIPs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DsrDecap {
    /// The kernel's fallback tunnel devices `tunl0` / `ip6tnl0` hold the VIPs.
    Ipip,
    /// The kernel has no ipip/ip6_tunnel driver: a tc BPF program on each backend's `eth0`
    /// ingress strips the outer header, and the VIPs sit on `lo` (with `arp_ignore=1`).
    Bpf,
    /// Neither is available: no tunnel driver, and the BPF decap program did not build (no
    /// clang, or a compile error in `deploy/testbed.sh`). A DSR test fails then
    /// ([`DsrDecap::NONE_IS_A_FAILURE`]): the workspace needs clang anyway (nic-config's XDP
    /// program), so this is a broken testbed, not a missing optional tool.
    None,
}

impl DsrDecap {
    /// What a DSR test says when the testbed has no DSR decap ([`DsrDecap::None`]).
    pub const NONE_IS_A_FAILURE: &'static str = "the testbed has no DSR decap: no ipip/ip6_tunnel driver and the tc BPF \
         decap did not build (see the testbed's output; scripts/install-deps.sh installs clang)";
}

/// What went wrong in the harness.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A command ran but exited unsuccessfully.
    #[error("`{command}` failed ({status}){}", fmt_output(.stdout, .stderr))]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stdout.
        stdout: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A reply, log line or file did not have the expected form.
    #[error("cannot parse {what}: {text:?}")]
    Parse {
        /// What was being parsed.
        what: &'static str,
        /// The offending text.
        text: String,
    },
    /// No answer arrived in time.
    #[error("timed out: {0}")]
    Timeout(String),
}

fn fmt_output(stdout: &str, stderr: &str) -> String {
    let mut s = String::new();
    if !stdout.trim().is_empty() {
        s.push_str("\n--- stdout ---\n");
        s.push_str(stdout.trim_end());
    }
    if !stderr.trim().is_empty() {
        s.push_str("\n--- stderr ---\n");
        s.push_str(stderr.trim_end());
    }
    s
}

/// Result type of the harness.
pub type Result<T, E = TestbedError> = std::result::Result<T, E>;

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestbedError {
    let context = context.into();
    move |source| TestbedError::Io { context, source }
}

pub use xlb_testkit::{is_root, list_netns, skip_without_root};

/// Calls `f` every 20 ms until it returns `Some`, for at most `timeout` ([`xlb_testkit::wait_for`]).
/// Use it for things that become true shortly after a reply, such as an nginx access-log line.
pub fn wait_for<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    xlb_testkit::wait_for(timeout, "a condition", f)
}

/// A reply of the backends' UDP or TCP service: `be<i> <peer address>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceReply {
    /// The answering backend's name, `be1` ..= `be3`.
    pub backend: String,
    /// The source address the backend saw.
    pub peer: IpAddr,
}

impl ServiceReply {
    /// Parses `be<i> <address>`.
    ///
    /// # Errors
    /// When the text has another form.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || TestbedError::Parse { what: "service reply", text: text.to_owned() };
        let mut it = text.split_whitespace();
        let backend = it.next().ok_or_else(bad)?.to_owned();
        let peer = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if it.next().is_some() || !backend.starts_with("be") {
            return Err(bad());
        }
        Ok(Self { backend, peer })
    }
}

/// One request in a backend's nginx access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogEntry {
    /// The client address nginx saw (`$remote_addr`).
    pub client: IpAddr,
    /// The client port nginx saw (`$remote_port`).
    pub client_port: u16,
    /// The local address the request arrived on (`$server_addr`).
    pub server: IpAddr,
    /// The local port (`$server_port`).
    pub server_port: u16,
    /// The request line, e.g. `GET / HTTP/1.1`.
    pub request: String,
    /// The response status.
    pub status: u16,
}

impl AccessLogEntry {
    /// Parses one line of the testbed's log format:
    /// `$remote_addr $remote_port $server_addr $server_port "$request" $status`.
    ///
    /// # Errors
    /// When the line has another form.
    pub fn parse(line: &str) -> Result<Self> {
        let bad = || TestbedError::Parse { what: "nginx access log line", text: line.to_owned() };
        let (head, rest) = line.split_once(" \"").ok_or_else(bad)?;
        let (request, tail) = rest.rsplit_once("\" ").ok_or_else(bad)?;
        let f: Vec<&str> = head.split_whitespace().collect();
        let [client, client_port, server, server_port] = f.as_slice() else {
            return Err(bad());
        };
        Ok(Self {
            client: client.parse().map_err(|_| bad())?,
            client_port: client_port.parse().map_err(|_| bad())?,
            server: server.parse().map_err(|_| bad())?,
            server_port: server_port.parse().map_err(|_| bad())?,
            request: request.to_owned(),
            status: tail.trim().parse().map_err(|_| bad())?,
        })
    }
}

/// A running testbed; dropping it tears it down (`deploy/testbed.sh down`).
#[derive(Debug)]
pub struct Testbed {
    prefix: String,
    script: PathBuf,
    run_dir: PathBuf,
    up: bool,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn repo_root() -> PathBuf {
    // tests/ is one level below the workspace root
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

fn run_base() -> PathBuf {
    std::env::var_os("XLB_TESTBED_RUNDIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_RUN_BASE), PathBuf::from)
}

fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(OsStr::to_string_lossy).collect::<Vec<_>>().join(" ")
}

fn run(cmd: &mut Command) -> Result<Output> {
    cmd.output().map_err(io_err(format!("cannot run `{}`", command_line(cmd))))
}

fn check(cmd: &Command, out: Output) -> Result<Output> {
    if out.status.success() {
        Ok(out)
    } else {
        Err(TestbedError::Command {
            command: command_line(cmd),
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

fn run_ok(cmd: &mut Command) -> Result<String> {
    let out = run(cmd)?;
    let out = check(cmd, out)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses a prefix this harness made, `xe<pid>t<counter>`, into the pid.
fn harness_prefix_pid(prefix: &str) -> Option<u32> {
    let rest = prefix.strip_prefix(PREFIX_HEAD)?;
    let (pid, counter) = rest.split_once('t')?;
    if counter.is_empty() || !counter.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

impl Testbed {
    /// Brings up a testbed under a fresh prefix `xe<pid>t<n>` and waits until every
    /// backend server answers. The first call in a process first tears down testbeds left
    /// behind by test processes that no longer exist (killed before their `Drop` ran).
    ///
    /// # Errors
    /// When `deploy/testbed.sh up` fails (it cleans up after itself); the error carries
    /// the script's output.
    pub fn up() -> Result<Self> {
        static REAP: std::sync::Once = std::sync::Once::new();
        REAP.call_once(reap_stale_testbeds);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self::up_with_prefix(&format!("{PREFIX_HEAD}{}t{n}", std::process::id()))
    }

    /// Brings up a testbed under `prefix` (1-32 ASCII letters and digits), which must not
    /// be in use.
    ///
    /// # Errors
    /// When `deploy/testbed.sh up` fails (it cleans up after itself).
    pub fn up_with_prefix(prefix: &str) -> Result<Self> {
        let script = repo_root().join("deploy").join("testbed.sh");
        let mut cmd = Command::new(&script);
        cmd.args(["up", prefix]).stdin(Stdio::null());
        let started = Instant::now();
        let out = run(&mut cmd)?;
        let out = check(&cmd, out)?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        println!("testbed {prefix}: harness saw it up after {:?}", started.elapsed());
        Ok(Self { prefix: prefix.to_owned(), script, run_dir: run_base().join(prefix), up: true })
    }

    /// The testbed's prefix; every namespace is `<prefix>-<role>`.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The namespace name of `role`, e.g. `xe123t0-client`.
    #[must_use]
    pub fn ns_name(&self, role: Role) -> String {
        format!("{}-{role}", self.prefix)
    }

    /// The testbed's run directory (configs, logs and pid files of the servers):
    /// `$XLB_TESTBED_RUNDIR/<prefix>`, by default `/run/xlb-testbed/<prefix>`.
    #[must_use]
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// How the backends decapsulate DSR traffic on this kernel.
    ///
    /// # Errors
    /// When the run directory's `dsr-mode` file is missing or unknown.
    pub fn dsr_decap(&self) -> Result<DsrDecap> {
        let path = self.run_dir.join("dsr-mode");
        let text = std::fs::read_to_string(&path).map_err(io_err(format!("cannot read {}", path.display())))?;
        match text.trim() {
            "ipip" => Ok(DsrDecap::Ipip),
            "bpf" => Ok(DsrDecap::Bpf),
            "none" => Ok(DsrDecap::None),
            other => Err(TestbedError::Parse { what: "dsr-mode", text: other.to_owned() }),
        }
    }

    fn ns_command<S: AsRef<OsStr>>(&self, role: Role, args: &[S]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec"]).arg(self.ns_name(role)).args(args).stdin(Stdio::null());
        cmd
    }

    /// Runs `args` inside `role`'s namespace (`ip netns exec <ns> args...`) and returns
    /// its output whatever the exit status. There is no timeout: bound the command itself.
    ///
    /// # Errors
    /// Only when the command cannot be started.
    pub fn exec<S: AsRef<OsStr>>(&self, role: Role, args: &[S]) -> Result<Output> {
        run(&mut self.ns_command(role, args))
    }

    /// Like [`exec`](Self::exec) but fails unless the command exits with 0; returns stdout.
    ///
    /// # Errors
    /// When the command cannot run or exits unsuccessfully (the error holds its output).
    pub fn exec_ok<S: AsRef<OsStr>>(&self, role: Role, args: &[S]) -> Result<String> {
        run_ok(&mut self.ns_command(role, args))
    }

    /// Like [`exec_ok`](Self::exec_ok), feeding `input` to the command's stdin.
    ///
    /// # Errors
    /// When the command cannot run or exits unsuccessfully (the error holds its output).
    pub fn exec_with_input<S: AsRef<OsStr>>(&self, role: Role, args: &[S], input: &[u8]) -> Result<String> {
        let mut cmd = self.ns_command(role, args);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let line = command_line(&cmd);
        let mut child = cmd.spawn().map_err(io_err(format!("cannot run `{line}`")))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input).map_err(io_err(format!("cannot write to `{line}`")))?;
        }
        let out = child.wait_with_output().map_err(io_err(format!("waiting for `{line}`")))?;
        let out = check(&cmd, out)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `f` on a thread that has entered `role`'s network namespace, and returns its
    /// result. Sockets created in `f` stay in that namespace after it returns, so `f` can
    /// hand back a bound socket for use on the calling thread.
    ///
    /// # Errors
    /// When the namespace cannot be entered. A panic in `f` propagates.
    pub fn in_ns<T, F>(&self, role: Role, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let path = Path::new(NETNS_DIR).join(self.ns_name(role));
        let ns = File::open(&path).map_err(io_err(format!("cannot open {}", path.display())))?;
        std::thread::scope(|s| {
            let handle = s.spawn(move || {
                // SAFETY: `ns` is an open file of a network namespace that outlives the
                // call; setns only moves this (fresh, scoped) thread into it.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    return Err(io_err(format!("setns({})", path.display()))(std::io::Error::last_os_error()));
                }
                Ok(f())
            });
            handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Starts a thread named `name` in `role`'s network namespace running `f` (a server
    /// that outlives the call, e.g. [`load::EchoServer`]); its result comes back through the
    /// handle.
    ///
    /// # Errors
    /// When the namespace file cannot be opened or the thread cannot be spawned; a failing
    /// setns(2) panics the thread (its join returns the panic).
    pub fn spawn_in<T, F>(&self, role: Role, name: &str, f: F) -> Result<std::thread::JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let path = Path::new(NETNS_DIR).join(self.ns_name(role));
        let ns = File::open(&path).map_err(io_err(format!("cannot open {}", path.display())))?;
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // SAFETY: `ns` is an open file of a network namespace, owned by this closure for
                // the call; setns only moves this (fresh) thread into it.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert!(rc == 0, "setns({}): {}", path.display(), std::io::Error::last_os_error());
                drop(ns);
                f()
            })
            .map_err(io_err(format!("cannot spawn {name}")))
    }

    /// Fetches `url` with curl from `from`'s namespace (5 s limit, no proxy, IPv6 literals
    /// allowed: `http://[fd00:250:2::11]/`) and returns the body as received.
    ///
    /// # Errors
    /// When curl fails: connection refused, timeout, HTTP status >= 400 (the error holds
    /// curl's message).
    pub fn curl(&self, from: Role, url: &str) -> Result<String> {
        let args = ["curl", "-sS", "--fail", "-g", "--noproxy", "*", "--max-time", CURL_MAX_TIME_SECS];
        let mut all: Vec<&str> = args.to_vec();
        all.push(url);
        self.exec_ok(from, &all)
    }

    /// Sends `payload` in one UDP datagram from `from`'s namespace to `addr:port` and returns
    /// the first reply, without its trailing newline. Sends up to 3 times, waiting 1 s for
    /// each reply (a load balancer may drop the first packet of a flow while it resolves a
    /// neighbour).
    ///
    /// # Errors
    /// When no reply arrives, or on socket errors (e.g. ICMP port unreachable).
    pub fn udp_query(&self, from: Role, addr: IpAddr, port: u16, payload: &[u8]) -> Result<String> {
        let dest = SocketAddr::new(addr, port);
        self.in_ns(from, || -> Result<String> {
            let ctx = |what: &str| format!("udp {what} {dest}");
            let bind: SocketAddr = match addr {
                IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let sock = UdpSocket::bind(bind).map_err(io_err(ctx("bind for")))?;
            sock.connect(dest).map_err(io_err(ctx("connect to")))?;
            sock.set_read_timeout(Some(QUERY_TIMEOUT)).map_err(io_err(ctx("timeout for")))?;
            let mut buf = [0_u8; 2048];
            for _ in 0..UDP_ATTEMPTS {
                sock.send(payload).map_err(io_err(ctx("send to")))?;
                match sock.recv(&mut buf) {
                    Ok(n) => {
                        let text = String::from_utf8_lossy(buf.get(..n).unwrap_or_default());
                        return Ok(text.trim_end().to_owned());
                    }
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(e) => return Err(io_err(ctx("recv from"))(e)),
                }
            }
            Err(TestbedError::Timeout(format!("no UDP reply from {dest} to {UDP_ATTEMPTS} datagrams")))
        })?
    }

    /// Connects over TCP from `from`'s namespace to `addr:port`, reads until the server
    /// closes, and returns what it sent without the trailing newline (1 s limit for the
    /// connect and for each read).
    ///
    /// # Errors
    /// When the connection is refused or times out, or reading fails.
    pub fn tcp_query(&self, from: Role, addr: IpAddr, port: u16) -> Result<String> {
        let dest = SocketAddr::new(addr, port);
        self.in_ns(from, || -> Result<String> {
            let ctx = |what: &str| format!("tcp {what} {dest}");
            let mut s = TcpStream::connect_timeout(&dest, QUERY_TIMEOUT).map_err(io_err(ctx("connect to")))?;
            s.set_read_timeout(Some(QUERY_TIMEOUT)).map_err(io_err(ctx("timeout for")))?;
            let mut text = String::new();
            s.read_to_string(&mut text).map_err(io_err(ctx("read from")))?;
            Ok(text.trim_end().to_owned())
        })?
    }

    /// The requests in backend `i`'s nginx access log, oldest first.
    ///
    /// # Errors
    /// When the log cannot be read or has a line of another form.
    pub fn backend_access_log(&self, i: u8) -> Result<Vec<AccessLogEntry>> {
        let path = self.run_dir.join(format!("be{i}")).join("access.log");
        let text = std::fs::read_to_string(&path).map_err(io_err(format!("cannot read {}", path.display())))?;
        text.lines().filter(|l| !l.trim().is_empty()).map(AccessLogEntry::parse).collect()
    }

    /// The client address (`$remote_addr`) of every request in backend `i`'s nginx access
    /// log, oldest first, e.g. `["10.250.2.1", "10.250.1.2"]`.
    ///
    /// # Errors
    /// As [`backend_access_log`](Self::backend_access_log).
    pub fn backend_seen_clients(&self, i: u8) -> Result<Vec<String>> {
        Ok(self.backend_access_log(i)?.into_iter().map(|e| e.client.to_string()).collect())
    }

    /// Tears the testbed down now and reports failure (dropping it does the same silently).
    ///
    /// # Errors
    /// When `deploy/testbed.sh down` cannot run or fails.
    pub fn down(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if !self.up {
            return Ok(());
        }
        self.up = false;
        let mut cmd = Command::new(&self.script);
        cmd.args(["down", &self.prefix]).stdin(Stdio::null());
        let out = run_ok(&mut cmd)?;
        print!("{out}");
        Ok(())
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("testbed {}: teardown failed: {e}", self.prefix);
        }
    }
}

/// True when `pid` exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (comm) S ...": the state follows the last ')'
        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|state| state != "Z")
    })
}

/// Tears down testbeds named by this harness (`xe<pid>t<n>`) whose process is gone.
fn reap_stale_testbeds() {
    let names = list_netns();
    let mut stale: Vec<&str> = names
        .iter()
        .filter_map(|n| n.split_once('-').map(|(prefix, _)| prefix))
        .filter(|p| harness_prefix_pid(p).is_some_and(|pid| !process_alive(pid)))
        .collect();
    stale.sort_unstable();
    stale.dedup();
    let script = repo_root().join("deploy").join("testbed.sh");
    for prefix in stale {
        let _ = writeln!(std::io::stderr(), "tearing down stale testbed {prefix} (its test process is gone)");
        let mut cmd = Command::new(&script);
        cmd.args(["down", prefix]).stdin(Stdio::null());
        if let Err(e) = run_ok(&mut cmd) {
            eprintln!("stale testbed {prefix}: {e}");
        }
    }
}

// ---- xlb itself on the testbed ------------------------------------------------------------

use std::os::unix::fs::FileTypeExt as _;
use std::process::{Child, ExitStatus};
use std::sync::OnceLock;

/// How long [`Xlb::start`] waits for the admin socket (it appears once the workers run and
/// the steering program is attached).
const XLB_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`Xlb::stop`] (and dropping an [`Xlb`]) waits after SIGTERM before SIGKILL.
const XLB_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The profile directory of the running test executable (`<target>/<profile>/deps/<test>`
/// → `<target>/<profile>`), where cargo also puts the workspace's binaries.
fn test_profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    (deps.file_name()? == "deps").then(|| deps.parent().map(Path::to_path_buf))?
}

fn xlb_candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(dir) = test_profile_dir() {
        v.push(dir.join("xlb"));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|t| !t.is_empty())
        .map_or_else(|| repo_root().join("target"), |t| repo_root().join(t));
    v.push(target.join("debug").join("xlb"));
    v
}

/// The `xlb` binary the tests run: `$XLB_BIN` if set; otherwise `xlb` next to the test
/// executable's `deps` directory (the same target directory and profile), then
/// `$CARGO_TARGET_DIR/debug/xlb`, or `<workspace>/target/debug/xlb` when `CARGO_TARGET_DIR`
/// is not set. When none exists it
/// runs `cargo build -p xlb` once per process (later callers wait for that build and share
/// its result). It does not rebuild a binary that exists: `cargo test --workspace` builds
/// it anyway.
///
/// # Errors
/// When `$XLB_BIN` names a missing file, or the build fails.
pub fn xlb_binary() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    if let Some(bin) = std::env::var_os("XLB_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(io_err(format!("XLB_BIN={}", bin.display()))(std::io::ErrorKind::NotFound.into()))
        };
    }
    BIN.get_or_init(|| {
        if let Some(bin) = xlb_candidates().into_iter().find(|p| p.is_file()) {
            return Ok(bin);
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "xlb"]).current_dir(repo_root()).stdin(Stdio::null());
        if let Some(target) = test_profile_dir().and_then(|d| d.parent().map(Path::to_path_buf)) {
            cmd.arg("--target-dir").arg(target);
        }
        let _ = writeln!(std::io::stderr(), "xlb binary missing: running `{}`", command_line(&cmd));
        run_ok(&mut cmd).map_err(|e| e.to_string())?;
        xlb_candidates()
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| format!("`cargo build -p xlb` succeeded but none of {:?} exists", xlb_candidates()))
    })
    .clone()
    .map_err(|e| io_err("cannot find or build the xlb binary")(std::io::Error::other(e)))
}

/// The traffic generator (`perf`'s `xlb-pktgen`): `$XLB_PKTGEN` if set (`make chaos` sets a
/// release build: the generator's rate is what a SYN flood scenario offers), else
/// `xlb-pktgen` next to the xlb binary ([`xlb_binary`]), built once with `cargo build -p
/// xlb-perf --bin xlb-pktgen` into the same target directory when missing.
///
/// # Errors
/// When `$XLB_PKTGEN` names a missing file, or the build fails.
pub fn pktgen_binary() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    if let Some(bin) = std::env::var_os("XLB_PKTGEN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(io_err(format!("XLB_PKTGEN={}", bin.display()))(std::io::ErrorKind::NotFound.into()))
        };
    }
    let next_to_xlb = xlb_binary()?.with_file_name("xlb-pktgen");
    BIN.get_or_init(|| {
        if next_to_xlb.is_file() {
            return Ok(next_to_xlb.clone());
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "xlb-perf", "--bin", "xlb-pktgen"]).current_dir(repo_root()).stdin(Stdio::null());
        if let Some(target) = next_to_xlb.parent().and_then(Path::parent) {
            cmd.arg("--target-dir").arg(target);
        }
        if next_to_xlb.parent().and_then(Path::file_name).is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let _ = writeln!(std::io::stderr(), "xlb-pktgen missing: running `{}`", command_line(&cmd));
        run_ok(&mut cmd).map_err(|e| e.to_string())?;
        if next_to_xlb.is_file() {
            Ok(next_to_xlb.clone())
        } else {
            Err(format!(
                "`cargo build -p xlb-perf --bin xlb-pktgen` succeeded but {} does not exist",
                next_to_xlb.display()
            ))
        }
    })
    .clone()
    .map_err(|e| io_err("cannot find or build xlb-pktgen")(std::io::Error::other(e)))
}

/// `xlb run` in a testbed's lb namespace, started by [`Xlb::start`]. Dropping it stops xlb
/// like [`Xlb::stop`] (SIGTERM, SIGKILL after 5 s) without reporting.
///
/// Its files live in `<run dir>/xlb/`: `xlb.yaml` (the config, which the test may rewrite),
/// `xlb.log` (xlb's stdout and stderr) and `admin.sock`.
#[derive(Debug)]
pub struct Xlb {
    child: Option<Child>,
    bin: PathBuf,
    command: String,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl Xlb {
    /// Writes `config_yaml` to `<run dir>/xlb/xlb.yaml`, starts
    /// `ip netns exec <prefix>-lb xlb run --config .. --admin-socket ..` with its output in
    /// `xlb.log`, and waits (up to 10 s) until the admin socket exists, which xlb creates
    /// only after its workers run and its XDP program is attached.
    ///
    /// # Errors
    /// When the binary cannot be found or built, the files cannot be written, xlb cannot be
    /// started, exits early, or does not create its socket in time (the error holds its log).
    pub fn start(tb: &Testbed, config_yaml: &str) -> Result<Self> {
        Self::start_with_args::<&str>(tb, config_yaml, &[])
    }

    /// [`Xlb::start`] with `extra` appended to `xlb run`'s arguments (e.g. `--kubeconfig
    /// PATH`, which makes xlb take Services and EndpointSlices from an API server).
    ///
    /// # Errors
    /// As [`Xlb::start`].
    pub fn start_with_args<S: AsRef<OsStr>>(tb: &Testbed, config_yaml: &str, extra: &[S]) -> Result<Self> {
        let dir = tb.run_dir().join("xlb");
        std::fs::create_dir_all(&dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
        let config = dir.join("xlb.yaml");
        std::fs::write(&config, config_yaml).map_err(io_err(format!("cannot write {}", config.display())))?;
        let socket = dir.join("admin.sock");
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err(format!("cannot remove {}", socket.display()))(e));
            }
            _ => {}
        }
        let mut xlb = Self::spawn(tb, &config, &socket, &dir.join("xlb.log"), extra)?;
        xlb.wait_ready()?;
        Ok(xlb)
    }

    /// Starts a second xlb with `xlb run --takeover` on this one's config and admin socket
    /// (its log in `<run dir>/xlb/xlb.N.log`, N counting from 2): this one hands its flows
    /// over and exits. Waits (up to 10 s each) for this one's exit and for the new one's admin
    /// socket; returns the new xlb and how this one exited.
    ///
    /// # Errors
    /// When the new xlb cannot be started, this one does not exit in time, or the new one
    /// exits early or does not create its socket in time (the error holds its log).
    pub fn take_over(&mut self, tb: &Testbed) -> Result<(Self, ExitStatus)> {
        let dir = tb.run_dir().join("xlb");
        let log = (2..).map(|n| dir.join(format!("xlb.{n}.log"))).find(|p| !p.exists()).unwrap_or_default();
        let (config, socket) = (self.config.clone(), self.socket.clone());
        let mut new = Self::spawn(tb, &config, &socket, &log, &["--takeover"])?;
        let Some(mut old) = self.child.take() else { return Err(not_running()) };
        let Some(status) = wait_exit(&mut old, XLB_READY_TIMEOUT)? else {
            return Err(TestbedError::Timeout(format!(
                "the old xlb did not exit within {XLB_READY_TIMEOUT:?} of the take-over (killed); its log:\n{}\nthe new one's:\n{}",
                self.log(),
                new.log()
            )));
        };
        new.wait_ready()?;
        Ok((new, status))
    }

    /// Spawns `ip netns exec <lb> xlb run --config CONFIG --admin-socket SOCKET EXTRA...`
    /// with its output in `log`.
    fn spawn<S: AsRef<OsStr>>(tb: &Testbed, config: &Path, socket: &Path, log: &Path, extra: &[S]) -> Result<Self> {
        let bin = xlb_binary()?;
        let (config, socket, log) = (config.to_owned(), socket.to_owned(), log.to_owned());
        let out = File::create(&log).map_err(io_err(format!("cannot create {}", log.display())))?;
        let err = out.try_clone().map_err(io_err(format!("cannot dup {}", log.display())))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec"])
            .arg(tb.ns_name(Role::Lb))
            .arg(&bin)
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--admin-socket")
            .arg(&socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let command = command_line(&cmd);
        // `ip netns exec` execs xlb, so the child's pid is xlb's
        let child = cmd.spawn().map_err(io_err(format!("cannot run `{command}`")))?;
        Ok(Self { child: Some(child), bin, command, config, socket, log })
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + XLB_READY_TIMEOUT;
        loop {
            if std::fs::metadata(&self.socket).is_ok_and(|m| m.file_type().is_socket()) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().map_err(io_err("waiting for xlb"))?
            {
                self.child = None;
                return Err(TestbedError::Command {
                    command: self.command.clone(),
                    status,
                    stdout: self.log(),
                    stderr: String::new(),
                });
            }
            if Instant::now() >= deadline {
                return Err(TestbedError::Timeout(format!(
                    "xlb did not create {} within {XLB_READY_TIMEOUT:?}; its log:\n{}",
                    self.socket.display(),
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// xlb's process id (`None` once it has been stopped or has exited early).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The config file xlb watches.
    #[must_use]
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The admin socket.
    #[must_use]
    pub fn admin_socket(&self) -> &Path {
        &self.socket
    }

    /// The file with xlb's stdout and stderr.
    #[must_use]
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything xlb has logged so far (empty if the log cannot be read).
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `xlb <sub> --admin-socket <socket>` and returns its stdout.
    ///
    /// # Errors
    /// When the command fails (e.g. xlb is not running).
    pub fn admin(&self, sub: &str) -> Result<String> {
        run_ok(Command::new(&self.bin).arg(sub).arg("--admin-socket").arg(&self.socket).stdin(Stdio::null()))
    }

    /// `xlb stats`: per-worker counters and packets per backend (parse with [`XlbStats`]).
    ///
    /// # Errors
    /// As [`admin`](Self::admin).
    pub fn stats(&self) -> Result<String> {
        self.admin("stats")
    }

    /// `xlb services`: the running tables in `ipvsadm -Ln` layout (see [`service_backends`]).
    ///
    /// # Errors
    /// As [`admin`](Self::admin).
    pub fn services(&self) -> Result<String> {
        self.admin("services")
    }

    /// `xlb conntrack`: the flow table.
    ///
    /// # Errors
    /// As [`admin`](Self::admin).
    pub fn conntrack(&self) -> Result<String> {
        self.admin("conntrack")
    }

    /// Replaces the config file atomically (writes `xlb.yaml.tmp`, renames it over
    /// `xlb.yaml`) and sends SIGHUP. xlb reloads it shortly after (its loop ticks every
    /// 200 ms); poll [`services`](Self::services) to see when the new tables are live.
    ///
    /// # Errors
    /// When the file cannot be written or xlb is not running.
    pub fn rewrite_config(&self, config_yaml: &str) -> Result<()> {
        let tmp = self.config.with_extension("yaml.tmp");
        std::fs::write(&tmp, config_yaml).map_err(io_err(format!("cannot write {}", tmp.display())))?;
        std::fs::rename(&tmp, &self.config).map_err(io_err(format!("cannot rename {}", tmp.display())))?;
        self.signal(libc::SIGHUP)
    }

    fn signal(&self, sig: libc::c_int) -> Result<()> {
        let Some(child) = &self.child else {
            return Err(not_running());
        };
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| TestbedError::Parse { what: "pid", text: child.id().to_string() })?;
        // SAFETY: kill(2) touches no memory of ours. `pid` is our own child, which has not
        // been reaped (we hold its `Child` and only reap it through that), so the pid cannot
        // have been reused by another process.
        if unsafe { libc::kill(pid, sig) } != 0 {
            return Err(io_err(format!("kill({pid}, {sig})"))(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Kills xlb with SIGKILL (a crash: nothing of its own clean-up runs) and reaps it.
    ///
    /// # Errors
    /// When xlb is not running any more or waiting fails.
    pub fn kill(mut self) -> Result<ExitStatus> {
        self.signal(libc::SIGKILL)?;
        let Some(mut child) = self.child.take() else { return Err(not_running()) };
        child.wait().map_err(io_err("waiting for the killed xlb"))
    }

    /// Sends SIGTERM and waits for xlb to exit (it detaches its XDP program first); after
    /// 5 s it is killed with SIGKILL and this is an error.
    ///
    /// # Errors
    /// When xlb is not running any more, does not exit in time, or waiting fails.
    pub fn stop(mut self) -> Result<ExitStatus> {
        self.terminate()
    }

    fn terminate(&mut self) -> Result<ExitStatus> {
        self.signal(libc::SIGTERM)?;
        let Some(mut child) = self.child.take() else {
            return Err(not_running());
        };
        wait_exit(&mut child, XLB_STOP_TIMEOUT)?.ok_or_else(|| {
            TestbedError::Timeout(format!(
                "xlb did not exit within {XLB_STOP_TIMEOUT:?} of SIGTERM (killed); its log:\n{}",
                self.log()
            ))
        })
    }
}

/// Waits up to `timeout` for `child` to exit; `None` if it did not, after killing and reaping it.
fn wait_exit(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().map_err(io_err("waiting for xlb"))? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Drop for Xlb {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Err(e) = self.terminate()
        {
            eprintln!("xlb: stop failed: {e}");
        }
    }
}

fn not_running() -> TestbedError {
    io_err("xlb")(std::io::Error::other("not running (stopped, or exited early)"))
}

/// Counters of one backend in `xlb stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackendStats {
    /// Packets sent to the backend.
    pub packets: u64,
    /// Flows that xlb assigned to the backend.
    pub new_flows: u64,
}

/// `xlb stats` output, parsed line by line (unknown lines are ignored).
#[derive(Debug, Clone, Default)]
pub struct XlbStats {
    lines: Vec<Vec<String>>,
}

impl XlbStats {
    /// Splits the output of `xlb stats` into lines of words.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        Self { lines: text.lines().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect() }
    }

    fn worker_sum(&self, kind: &str, name: &str) -> u64 {
        self.lines
            .iter()
            .filter_map(|w| match w.as_slice() {
                [worker, _, k, n, v] if worker == "worker" && k == kind && n == name => v.parse::<u64>().ok(),
                _ => None,
            })
            .sum()
    }

    /// Each worker's flow-table entries (`worker N rx .. conntrack_entries V`), in worker order.
    #[must_use]
    pub fn conntrack_entries(&self) -> Vec<u64> {
        self.lines
            .iter()
            .filter(|w| w.first().is_some_and(|x| x == "worker"))
            .filter_map(|w| {
                let i = w.iter().position(|x| x == "conntrack_entries")?;
                w.get(i + 1)?.parse().ok()
            })
            .collect()
    }

    /// The sum over workers of `worker N event <name> V` (0 when no worker reports it).
    #[must_use]
    pub fn event(&self, name: &str) -> u64 {
        self.worker_sum("event", name)
    }

    /// The sum over workers of `worker N drop <reason> V` (0 when no worker reports it).
    #[must_use]
    pub fn drops(&self, reason: &str) -> u64 {
        self.worker_sum("drop", reason)
    }

    /// The sum over workers of counter `name` on the `worker N xsk NAME V NAME V ...` lines
    /// (e.g. `punted`; 0 when no worker reports it).
    #[must_use]
    pub fn xsk(&self, name: &str) -> u64 {
        self.pairs_sum("xsk", name)
    }

    /// The sum over workers of class `name` (`rx`, `tx`, `pass`, `handed_off`) on the
    /// `worker N bytes NAME V NAME V ...` lines: bytes by verdict (0 when no worker reports it).
    #[must_use]
    pub fn bytes(&self, name: &str) -> u64 {
        self.pairs_sum("bytes", name)
    }

    /// The sum over workers of `worker N drop_bytes <reason> V` (0 when no worker reports it).
    #[must_use]
    pub fn drop_bytes(&self, reason: &str) -> u64 {
        self.worker_sum("drop_bytes", reason)
    }

    /// The sum over every reason and worker of the `worker N drop_bytes REASON V` lines.
    #[must_use]
    pub fn all_drop_bytes(&self) -> u64 {
        self.lines
            .iter()
            .filter_map(|w| match w.as_slice() {
                [worker, _, k, _, v] if worker == "worker" && k == "drop_bytes" => v.parse::<u64>().ok(),
                _ => None,
            })
            .sum()
    }

    /// The sum over workers of `name`'s value on the `worker N KIND NAME V NAME V ...` lines.
    fn pairs_sum(&self, kind: &str, name: &str) -> u64 {
        self.lines
            .iter()
            .filter(|w| w.first().is_some_and(|x| x == "worker") && w.get(2).is_some_and(|x| x == kind))
            .filter_map(|w| {
                w.get(3..)?.chunks(2).find(|kv| kv.first().is_some_and(|k| k == name))?.get(1)?.parse::<u64>().ok()
            })
            .sum()
    }

    /// Every `worker N drop REASON V` line with V > 0, as `(worker, reason, V)`.
    #[must_use]
    pub fn all_drops(&self) -> Vec<(String, String, u64)> {
        self.lines
            .iter()
            .filter_map(|w| match w.as_slice() {
                [worker, n, k, reason, v] if worker == "worker" && k == "drop" => {
                    v.parse::<u64>().ok().filter(|v| *v > 0).map(|v| (n.clone(), reason.clone(), v))
                }
                _ => None,
            })
            .collect()
    }

    /// The counters of `backend <service> <addr> packets N new_flows M`, e.g. service
    /// `demo/web:http` and addr `10.250.2.11:80` (IPv6 without brackets: `fd00:250:2::11:80`).
    #[must_use]
    pub fn backend(&self, service: &str, addr: &str) -> Option<BackendStats> {
        self.lines.iter().find_map(|w| match w.as_slice() {
            [b, s, a, p, packets, f, flows]
                if b == "backend" && s == service && a == addr && p == "packets" && f == "new_flows" =>
            {
                Some(BackendStats { packets: packets.parse().ok()?, new_flows: flows.parse().ok()? })
            }
            _ => None,
        })
    }
}

/// The backends (`addr:port`, in table order) that `xlb services` (or `xlb check`) lists
/// under the frontend `proto vip:port`, e.g. `("TCP", "10.250.100.1:80")`; `None` when the
/// frontend is not in the table.
#[must_use]
pub fn service_backends(services: &str, proto: &str, vip_port: &str) -> Option<Vec<String>> {
    let mut lines = services.lines();
    lines.by_ref().find(|l| {
        let mut w = l.split_whitespace();
        w.next() == Some(proto) && w.next() == Some(vip_port)
    })?;
    Some(
        lines
            .map_while(|l| l.trim_start().strip_prefix("->"))
            .filter_map(|rest| rest.split_whitespace().next().map(str::to_owned))
            .collect(),
    )
}

// ---- upgrades: --after-handover, --detach, sd_notify (issue 11) ----------------------------

use std::os::unix::net::UnixDatagram;

/// How long [`Xlb::take_over_detached`] waits for `xlb run --takeover --detach` to exit.
const DETACH_TIMEOUT: Duration = Duration::from_secs(20);

/// A stand-in for systemd's notification socket: a datagram socket at a path in the
/// testbed's run directory, for `NOTIFY_SOCKET`. Dropping it removes the file.
#[derive(Debug)]
pub struct NotifySocket {
    sock: UnixDatagram,
    path: PathBuf,
}

impl NotifySocket {
    /// Binds `<run dir>/xlb/notify.sock`.
    ///
    /// # Errors
    /// When the directory cannot be created or the socket cannot be bound.
    pub fn bind(tb: &Testbed) -> Result<Self> {
        let dir = tb.run_dir().join("xlb");
        std::fs::create_dir_all(&dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).map_err(io_err(format!("cannot bind {}", path.display())))?;
        Ok(Self { sock, path })
    }

    /// The socket's path (the value for `NOTIFY_SOCKET`).
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Receives messages (one datagram each, e.g. `READY=1\nMAINPID=42\n`) until `done`
    /// accepts one or `timeout` passes; returns every message received, the accepted one last.
    ///
    /// # Errors
    /// When none is accepted in time (the error lists what arrived), or receiving fails.
    pub fn recv_until(&self, timeout: Duration, mut done: impl FnMut(&str) -> bool) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TestbedError::Timeout(format!(
                    "no expected message on {} within {timeout:?}; got {got:?}",
                    self.path.display()
                )));
            }
            self.sock.set_read_timeout(Some(left)).map_err(io_err("notify socket timeout"))?;
            match self.sock.recv(&mut buf) {
                Ok(n) => {
                    let m = String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned();
                    let accepted = done(&m);
                    got.push(m);
                    if accepted {
                        return Ok(got);
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(io_err("notify socket recv")(e)),
            }
        }
    }
}

impl NotifySocket {
    /// Whether a `WATCHDOG=1` arrives within `within` (sd_notify(3)); what arrives before it
    /// is read and dropped.
    #[must_use]
    pub fn watchdog_fed(&self, within: Duration) -> bool {
        self.recv_until(within, |m| notify_has(m, "WATCHDOG=1")).is_ok()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether one sd_notify message holds the assignment `line` (e.g. `READY=1`).
#[must_use]
pub fn notify_has(message: &str, line: &str) -> bool {
    message.lines().any(|l| l == line)
}

/// The xlb that `xlb run --takeover --detach` started: not a child of the test, so it is
/// known by pid. Dropping it stops it (SIGINT, SIGKILL after 5 s) if it still runs.
#[derive(Debug)]
pub struct DetachedXlb {
    pid: Option<u32>,
    bin: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl DetachedXlb {
    /// Its pid, from the log line of the `--detach` process that started it (`None` if that
    /// line is missing).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The log both the `--detach` process and the new xlb write (their stderr).
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `xlb <sub> --admin-socket <socket>` and returns its stdout.
    ///
    /// # Errors
    /// When the command fails.
    pub fn admin(&self, sub: &str) -> Result<String> {
        run_ok(Command::new(&self.bin).arg(sub).arg("--admin-socket").arg(&self.socket).stdin(Stdio::null()))
    }

    /// Whether the process runs (exists, not a zombie, and is xlb: a pid is not reused
    /// for something else unnoticed).
    #[must_use]
    pub fn running(&self) -> bool {
        self.pid.is_some_and(|p| {
            process_alive(p)
                && std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a.ends_with(b"xlb")))
        })
    }

    /// Sends SIGINT (stop at once) and waits up to 5 s until it is gone; then SIGKILL and
    /// this is an error.
    ///
    /// # Errors
    /// When the pid is unknown, the process does not run, or it does not stop in time.
    pub fn interrupt(mut self) -> Result<()> {
        let r = self.stop_pid(libc::SIGINT);
        self.pid = None;
        r
    }

    fn stop_pid(&self, sig: libc::c_int) -> Result<()> {
        let Some(pid) = self.pid else { return Err(not_running()) };
        if !self.running() {
            return Err(not_running());
        }
        let raw = libc::pid_t::try_from(pid).map_err(|_| TestbedError::Parse { what: "pid", text: pid.to_string() })?;
        // SAFETY: kill(2) touches no memory of ours. The pid was checked just above to be a
        // running xlb (not a reused pid); it is not our child, so we cannot hold it unreaped.
        if unsafe { libc::kill(raw, sig) } != 0 {
            return Err(io_err(format!("kill({pid}, {sig})"))(std::io::Error::last_os_error()));
        }
        if wait_for(XLB_STOP_TIMEOUT, || (!process_alive(pid)).then_some(())).is_some() {
            return Ok(());
        }
        // SAFETY: as above.
        let _ = unsafe { libc::kill(raw, libc::SIGKILL) };
        Err(TestbedError::Timeout(format!("xlb {pid} still runs {XLB_STOP_TIMEOUT:?} after signal {sig} (killed)")))
    }
}

impl Drop for DetachedXlb {
    fn drop(&mut self) {
        if self.running()
            && let Err(e) = self.stop_pid(libc::SIGINT)
        {
            eprintln!("detached xlb: stop failed: {e}");
        }
    }
}

/// The pid of the process that listens on the Unix stream socket `path` (`SO_PEERCRED` of a
/// connection to it, unix(7)); `None` when nothing listens there.
#[must_use]
pub fn socket_listener_pid(path: &Path) -> Option<u32> {
    let c = std::os::unix::net::UnixStream::connect(path).ok()?;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).ok()?;
    // SAFETY: `cred` and `len` are live locals of the size passed; getsockopt writes at most
    // `len` bytes into `cred` and the new length into `len`. The fd is open for the call.
    let rc = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    u32::try_from(cred.pid).ok().filter(|p| *p > 0)
}

/// The pid in the `--detach` process's log line `--detach: started the new xlb … pid=N`.
fn detached_pid(log: &str) -> Option<u32> {
    let line = log.lines().find(|l| l.contains("started the new xlb"))?;
    line.split_whitespace().find_map(|w| w.strip_prefix("pid=")).and_then(|p| p.parse().ok())
}

impl Xlb {
    /// [`Xlb::start`] as systemd starts a unit with `Type=notify` and `WatchdogSec=`:
    /// `NOTIFY_SOCKET` names `notify`, `WATCHDOG_USEC` is `watchdog` in microseconds.
    ///
    /// # Errors
    /// As [`Xlb::start`].
    pub fn start_under_watchdog(
        tb: &Testbed,
        config_yaml: &str,
        notify: &NotifySocket,
        watchdog: Duration,
    ) -> Result<Self> {
        let usec = watchdog.as_micros().to_string();
        let env = [("NOTIFY_SOCKET", notify.path().as_os_str()), ("WATCHDOG_USEC", OsStr::new(&usec))];
        Self::start_with_env(tb, config_yaml, &[] as &[&str], &env)
    }

    /// [`Xlb::start_with_args`] with `env` added to xlb's environment (e.g. `NOTIFY_SOCKET`).
    ///
    /// # Errors
    /// As [`Xlb::start`].
    pub fn start_with_env<S: AsRef<OsStr>>(
        tb: &Testbed,
        config_yaml: &str,
        extra: &[S],
        env: &[(&str, &OsStr)],
    ) -> Result<Self> {
        let dir = tb.run_dir().join("xlb");
        std::fs::create_dir_all(&dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
        let config = dir.join("xlb.yaml");
        std::fs::write(&config, config_yaml).map_err(io_err(format!("cannot write {}", config.display())))?;
        let socket = dir.join("admin.sock");
        let _ = std::fs::remove_file(&socket);
        let bin = xlb_binary()?;
        let mut cmd = lb_xlb_run(tb, &bin, &config, &socket, extra);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut xlb = Self::spawn_command(cmd, &bin, &config, &socket, &dir.join("xlb.log"))?;
        xlb.wait_ready()?;
        Ok(xlb)
    }

    /// Starts a second xlb with `xlb run --takeover EXTRA...` on this one's config and admin
    /// socket (log `xlb.N.log`) and waits (up to 10 s) until it serves (logs `xlb running`),
    /// without waiting for this one to exit: this one may go on idling
    /// (`--after-handover wait`).
    ///
    /// # Errors
    /// When the new xlb cannot be started, exits early, or does not serve in time (the error
    /// holds both logs).
    pub fn take_over_keeping<S: AsRef<OsStr>>(&self, tb: &Testbed, extra: &[S]) -> Result<Self> {
        let log = self.next_log(tb);
        let mut cmd = lb_xlb_run(tb, &self.bin, &self.config, &self.socket, &["--takeover"]);
        cmd.args(extra);
        let mut new = Self::spawn_command(cmd, &self.bin, &self.config, &self.socket, &log)?;
        let deadline = Instant::now() + XLB_READY_TIMEOUT;
        loop {
            if new.log().contains("xlb running") {
                return Ok(new);
            }
            if let Some(child) = new.child.as_mut()
                && let Some(status) = child.try_wait().map_err(io_err("waiting for xlb"))?
            {
                new.child = None;
                return Err(TestbedError::Command {
                    command: new.command.clone(),
                    status,
                    stdout: new.log(),
                    stderr: self.log(),
                });
            }
            if Instant::now() >= deadline {
                return Err(TestbedError::Timeout(format!(
                    "the new xlb did not serve within {XLB_READY_TIMEOUT:?}; its log:\n{}\nthe old one's:\n{}",
                    new.log(),
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `xlb run --takeover --detach` on this one's config and admin socket with `env`
    /// (log `xlb.N.log`, which the new xlb it starts writes too) and waits up to 20 s for it
    /// to exit. Returns its exit status and the new xlb; dropping that stops it.
    ///
    /// # Errors
    /// When it cannot be started, or does not exit in time (it is killed; the new xlb is
    /// stopped if its pid was logged).
    pub fn take_over_detached(&self, tb: &Testbed, env: &[(&str, &OsStr)]) -> Result<(ExitStatus, DetachedXlb)> {
        let log = self.next_log(tb);
        let mut cmd = lb_xlb_run(tb, &self.bin, &self.config, &self.socket, &["--takeover", "--detach"]);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut parent = Self::spawn_command(cmd, &self.bin, &self.config, &self.socket, &log)?;
        let status = match parent.child.as_mut() {
            Some(c) => wait_exit(c, DETACH_TIMEOUT)?,
            None => None,
        };
        parent.child = None;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let new = DetachedXlb { pid: detached_pid(&text), bin: self.bin.clone(), socket: self.socket.clone(), log };
        let status = status.ok_or_else(|| {
            TestbedError::Timeout(format!(
                "`{}` did not exit within {DETACH_TIMEOUT:?} (killed); its log:\n{text}",
                parent.command
            ))
        })?;
        Ok((status, new))
    }

    /// Sends SIGTERM without waiting (a drain starts when `shutdownGracePeriod` is not 0).
    ///
    /// # Errors
    /// When xlb is not running.
    pub fn send_sigterm(&self) -> Result<()> {
        self.signal(libc::SIGTERM)
    }

    /// Sends SIGINT (stop at once, no drain) and waits up to 5 s for xlb to exit.
    ///
    /// # Errors
    /// When xlb is not running, does not exit in time (then it is killed), or waiting fails.
    pub fn interrupt(mut self) -> Result<ExitStatus> {
        self.signal(libc::SIGINT)?;
        let Some(mut child) = self.child.take() else { return Err(not_running()) };
        wait_exit(&mut child, XLB_STOP_TIMEOUT)?.ok_or_else(|| {
            TestbedError::Timeout(format!("xlb did not exit within {XLB_STOP_TIMEOUT:?} of SIGINT (killed)"))
        })
    }

    /// `Some(status)` once xlb has exited (it is reaped), `None` while it runs.
    ///
    /// # Errors
    /// When xlb was already reaped or waiting fails.
    pub fn try_exit_status(&mut self) -> Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else { return Err(not_running()) };
        let status = child.try_wait().map_err(io_err("waiting for xlb"))?;
        if status.is_some() {
            self.child = None;
        }
        Ok(status)
    }

    /// Waits up to `timeout` for xlb to exit by itself and reaps it.
    ///
    /// # Errors
    /// When xlb was already reaped, or does not exit in time (then it is killed).
    pub fn wait_exit_within(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else { return Err(not_running()) };
        wait_exit(&mut child, timeout)?.ok_or_else(|| {
            TestbedError::Timeout(format!("xlb did not exit within {timeout:?} (killed); its log:\n{}", self.log()))
        })
    }

    /// The next free `<run dir>/xlb/xlb.N.log`, N from 2.
    fn next_log(&self, tb: &Testbed) -> PathBuf {
        let dir = tb.run_dir().join("xlb");
        (2..).map(|n| dir.join(format!("xlb.{n}.log"))).find(|p| !p.exists()).unwrap_or_default()
    }

    /// Spawns `cmd` (an `ip netns exec … xlb run …` from [`lb_xlb_run`]) with its output in
    /// `log`.
    fn spawn_command(mut cmd: Command, bin: &Path, config: &Path, socket: &Path, log: &Path) -> Result<Self> {
        let out = File::create(log).map_err(io_err(format!("cannot create {}", log.display())))?;
        let err = out.try_clone().map_err(io_err(format!("cannot dup {}", log.display())))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let command = command_line(&cmd);
        // `ip netns exec` execs xlb, so the child's pid is xlb's
        let child = cmd.spawn().map_err(io_err(format!("cannot run `{command}`")))?;
        Ok(Self {
            child: Some(child),
            bin: bin.to_owned(),
            command,
            config: config.to_owned(),
            socket: socket.to_owned(),
            log: log.to_owned(),
        })
    }
}

/// `ip netns exec <lb> BIN run --config CONFIG --admin-socket SOCKET EXTRA...`.
fn lb_xlb_run<S: AsRef<OsStr>>(tb: &Testbed, bin: &Path, config: &Path, socket: &Path, extra: &[S]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec"])
        .arg(tb.ns_name(Role::Lb))
        .arg(bin)
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--admin-socket")
        .arg(socket)
        .args(extra);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_access_log_lines() {
        let e =
            AccessLogEntry::parse("fd00:250:1::2 51118 fd00:250:2::11 80 \"GET /a b HTTP/1.1\" 200").expect("parse");
        assert_eq!(e.client, IpAddr::V6(CLIENT_V6));
        assert_eq!(e.client_port, 51118);
        assert_eq!(e.server, IpAddr::V6(backend_v6(1)));
        assert_eq!(e.server_port, HTTP_PORT);
        assert_eq!(e.request, "GET /a b HTTP/1.1");
        assert_eq!(e.status, 200);
        assert!(AccessLogEntry::parse("10.250.1.2 1 2").is_err());
    }

    #[test]
    fn parses_service_replies() {
        let r = ServiceReply::parse("be3 10.250.1.2").expect("parse");
        assert_eq!(r, ServiceReply { backend: "be3".into(), peer: IpAddr::V4(CLIENT_V4) });
        assert!(ServiceReply::parse("be3").is_err());
        assert!(ServiceReply::parse("be3 ?").is_err());
    }

    #[test]
    fn addresses_match_the_script() {
        assert_eq!(backend_v4(2).to_string(), "10.250.2.12");
        assert_eq!(backend_v6(3).to_string(), "fd00:250:2::13");
        assert_eq!(DSR_VIP_V6.to_string(), "fd00:250:100::10");
        assert_eq!(backend_mac(1), [2, 0, 0x0a, 0xfa, 2, 0x11]);
    }

    #[test]
    fn harness_prefixes_round_trip() {
        assert_eq!(harness_prefix_pid("xe4194304t12"), Some(4_194_304));
        assert_eq!(harness_prefix_pid("xlbtb"), None);
        assert_eq!(harness_prefix_pid("xe12t"), None);
        // the longest harness prefix still leaves room in 15-char interface names
        assert!("xe4194304t99999".len() <= 15);
        assert_eq!(Role::Backend(2).to_string(), "be2");
        assert_eq!(Role::all().len(), 7);
    }

    #[test]
    fn finds_the_detached_pid_in_the_log() {
        let log = "2026-11-25T10:00:00Z  INFO xlb::detach: --detach: started the new xlb; waiting until it serves pid=4242 binary=/x/xlb\n";
        assert_eq!(detached_pid(log), Some(4242));
        assert_eq!(detached_pid("nothing"), None);
        assert!(notify_has("READY=1\nMAINPID=7\n", "MAINPID=7"));
        assert!(!notify_has("READY=1\nMAINPID=70\n", "MAINPID=7"));
    }

    #[test]
    fn sees_own_process_alive() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX));
    }
}
