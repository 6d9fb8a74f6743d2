//! A node whose two ports differ in MTU, end to end (docs/reliability.md, "The out port's MTU in
//! NAT mode"): xlb two-armed between a client (`c0` ↔ `l0`, port 0) and a backend (`l1` ↔ `b0`,
//! port 1), one side at 1,500 bytes and the other at 1,400, a dual-stack ClusterIP UDP Service
//! (DNAT) in front of the backend. The backend echoes each datagram's length or, asked with
//! `big N`, answers `N` bytes. Each test runs over IPv4 and over IPv6.
//!
//! - Backends' side smaller: a client's datagram that fills the backends' MTU exactly reaches
//!   the backend whole. One of 1,500 bytes (with DF, Linux's default for UDP over IPv4) is
//!   answered with "fragmentation needed" (RFC 1191) or "packet too big" (RFC 8201) carrying
//!   MTU 1,400: the client's kernel records that path MTU for the VIP, and the same datagram
//!   sent again leaves the client in fragments that xlb forwards and the backend reassembles.
//!   Without the check xlb would send the 1,500-byte frame out of `l1` and the kernel would
//!   lose it there: no error, nothing recorded, the datagram lost every time.
//! - Clients' side smaller: the same for the backend's answers (the error goes to the backend,
//!   whose kernel records the path MTU towards the client).
//!
//! Needs root and `ethtool` (scripts/install-deps.sh).

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xlb_e2e::{XlbStats, xlb_binary};
use xlb_testkit::{ChildGuard, Netns, have_tool, skip_without_root};

/// The addresses of one family: client, node on the clients' side, node on the backends'
/// side, backend, VIP; the prefix length of the two links; the IP header's length.
#[derive(Clone, Copy)]
struct Fam {
    client: &'static str,
    lb0: &'static str,
    lb1: &'static str,
    backend: &'static str,
    vip: &'static str,
    len: u8,
    header: usize,
}

const V4: Fam = Fam {
    client: "10.253.0.2",
    lb0: "10.253.0.1",
    lb1: "10.253.1.1",
    backend: "10.253.1.11",
    vip: "10.253.100.1",
    len: 24,
    header: 20,
};
const V6: Fam = Fam {
    client: "fd00:253::2",
    lb0: "fd00:253::1",
    lb1: "fd00:253:1::1",
    backend: "fd00:253:1::11",
    vip: "fd00:253:100::1",
    len: 64,
    header: 40,
};
const PORT: u16 = 9000;
const MAC_C0: &str = "02:00:0a:fd:00:02";
const MAC_L0: &str = "02:00:0a:fd:00:01";
const MAC_L1: &str = "02:00:0a:fd:01:01";
const MAC_B0: &str = "02:00:0a:fd:01:0b";

/// The config: both ports, one worker, the UDP Service to the backend.
fn config() -> String {
    format!(
        r#"apiVersion: xlb.dev/v1alpha1
kind: XlbConfiguration
nodeName: mtu-node
nodeAddresses: [{lb0}, "{lb0_6}"]
shutdownGracePeriod: 0s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
interfaces:
- {{name: l0, queues: [0]}}
- {{name: l1, queues: [0]}}
cores: [0]
forwardingMode: nat
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: mtu}}
spec:
  type: ClusterIP
  clusterIP: {vip}
  clusterIPs: [{vip}, "{vip6}"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports:
  - {{name: echo, port: {PORT}, protocol: UDP, targetPort: {PORT}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: mtu
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
endpoints:
- {{addresses: [{backend}], conditions: {{ready: true, serving: true, terminating: false}}}}
ports:
- {{name: echo, port: {PORT}, protocol: UDP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-2
  namespace: mtu
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv6
endpoints:
- {{addresses: ["{backend6}"], conditions: {{ready: true, serving: true, terminating: false}}}}
ports:
- {{name: echo, port: {PORT}, protocol: UDP}}
"#,
        lb0 = V4.lb0,
        lb0_6 = V6.lb0,
        vip = V4.vip,
        vip6 = V6.vip,
        backend = V4.backend,
        backend6 = V6.backend,
    )
}

/// Client, node and backend namespaces, wired as the module docs say, with the clients' side
/// at `client_mtu` and the backends' at `backend_mtu` (both ends of each link).
struct Net {
    client: Netns,
    lb: Netns,
    backend: Netns,
    /// Set when the network goes: the backend's server ([`serve`]) stops.
    stop: Arc<AtomicBool>,
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Net {
    fn up(client_mtu: u16, backend_mtu: u16) -> Self {
        let (client, lb, backend) = (Netns::new("mtu"), Netns::new("mtu"), Netns::new("mtu"));
        let (c, b) = (client.name(), backend.name());
        lb.ip(&[
            "link", "add", "l0", "address", MAC_L0, "type", "veth", "peer", "name", "c0", "netns", c, "address", MAC_C0,
        ]);
        lb.ip(&[
            "link", "add", "l1", "address", MAC_L1, "type", "veth", "peer", "name", "b0", "netns", b, "address", MAC_B0,
        ]);
        let (cm, bm) = (client_mtu.to_string(), backend_mtu.to_string());
        for (ns, dev, mtu) in [(&client, "c0", &cm), (&lb, "l0", &cm), (&lb, "l1", &bm), (&backend, "b0", &bm)] {
            ns.ip(&["link", "set", dev, "mtu", mtu, "up"]);
        }
        // Frames with complete checksums (veth leaves them to the receiver otherwise, and xlb
        // updates them incrementally), as deploy/testbed.sh does.
        client.sh(&["ethtool", "-K", "c0", "tx", "off"]);
        backend.sh(&["ethtool", "-K", "b0", "tx", "off"]);
        for f in [V4, V6] {
            for (ns, dev, addr) in
                [(&client, "c0", f.client), (&lb, "l0", f.lb0), (&lb, "l1", f.lb1), (&backend, "b0", f.backend)]
            {
                // No duplicate address detection: the addresses are usable at once.
                ns.ip(&["addr", "add", &format!("{addr}/{}", f.len), "dev", dev, "nodad"]);
            }
            client.ip(&["route", "add", f.vip, "via", f.lb0]);
            backend.ip(&["route", "add", "default", "via", f.lb1]);
            for (ns, addr, mac, dev) in [
                (&client, f.lb0, MAC_L0, "c0"),
                (&lb, f.client, MAC_C0, "l0"),
                (&lb, f.backend, MAC_B0, "l1"),
                (&backend, f.lb1, MAC_L1, "b0"),
            ] {
                ns.ip(&["neigh", "replace", addr, "lladdr", mac, "dev", dev, "nud", "permanent"]);
            }
        }
        Self { client, lb, backend, stop: Arc::new(AtomicBool::new(false)) }
    }
}

/// `xlb run` in the node's namespace with [`config`]; its output in `dir/xlb.log`.
fn spawn_xlb(lb: &Netns, dir: &Path) -> ChildGuard {
    let bin = xlb_binary().expect("xlb binary");
    std::fs::write(dir.join("xlb.yaml"), config()).expect("config");
    let log = std::fs::File::create(dir.join("xlb.log")).expect("log");
    let child = Command::new("ip")
        .args(["netns", "exec", lb.name()])
        .arg(&bin)
        .arg("run")
        .arg("--config")
        .arg(dir.join("xlb.yaml"))
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup"))
        .stderr(log)
        .spawn()
        .expect("xlb starts");
    ChildGuard::graceful(child, Duration::from_secs(10))
}

/// xlb's log in `dir`, headed by family `f`'s VIP: the evidence of a failed assertion.
fn log(f: Fam, dir: &Path) -> String {
    format!("{}:\n{}", f.vip, std::fs::read_to_string(dir.join("xlb.log")).unwrap_or_default())
}

fn stats(dir: &Path) -> XlbStats {
    let bin = xlb_binary().expect("xlb binary");
    let out = Command::new(bin).args(["stats", "--admin-socket"]).arg(dir.join("admin.sock")).output().expect("stats");
    XlbStats::parse(&String::from_utf8_lossy(&out.stdout))
}

/// The backend's server: answers each datagram with its length in ASCII, or a datagram of
/// `N` bytes to `big N`. Runs until `net` goes.
fn serve(net: &Net) {
    // Both families on one socket (IPv4 clients as mapped addresses).
    let sock = net.backend.run_in(|| UdpSocket::bind(("::", PORT)).expect("bind"));
    sock.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    let stop = Arc::clone(&net.stop);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
            let msg = &buf[..n];
            let answer = match std::str::from_utf8(msg).ok().and_then(|s| s.strip_prefix("big ")) {
                Some(len) => vec![b'b'; len.parse().unwrap_or(0)],
                None => n.to_string().into_bytes(),
            };
            let _ = sock.send_to(&answer, from);
        }
    });
}

/// Sends `msg` from `sock` (connected to the VIP) until an answer comes, at most `tries`
/// times 300 ms; the answer. A connected UDP socket reports an ICMP error about its datagrams
/// (the "fragmentation needed" this test is about: `EMSGSIZE`) once, on its next call: such
/// an error only costs a try.
fn ask(sock: &UdpSocket, msg: &[u8], tries: u32) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 65536];
    for _ in 0..tries {
        if sock.send(msg).is_err() {
            continue;
        }
        if let Ok(n) = sock.recv(&mut buf) {
            return buf.get(..n).map(<[u8]>::to_vec);
        }
    }
    None
}

/// The path MTU `ip route get ADDR` shows in namespace `ns` (the route cache's `mtu`), if any.
fn path_mtu(ns: &Netns, addr: &str) -> Option<u16> {
    let out = ns.ip(&["route", "get", addr]);
    let mut words = out.split_whitespace();
    words.by_ref().find(|w| *w == "mtu")?;
    words.next()?.parse().ok()
}

/// Waits up to `within` for `f` to give `Some`.
fn wait<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sets up the network and xlb with the two MTUs and returns them with the client's socket
/// of family `f` (connected to the VIP), once a small datagram went through.
fn setup(f: Fam, client_mtu: u16, backend_mtu: u16, dir: &Path) -> (Net, ChildGuard, UdpSocket) {
    let net = Net::up(client_mtu, backend_mtu);
    serve(&net);
    let xlb = spawn_xlb(&net.lb, dir);
    let vip: std::net::IpAddr = f.vip.parse().expect("VIP");
    let sock = net.client.run_in(|| {
        let s = UdpSocket::bind(if vip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).expect("bind");
        s.connect(SocketAddr::new(vip, PORT)).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
        s
    });
    assert_eq!(ask(&sock, b"hi", 100).as_deref(), Some(&b"2"[..]), "xlb forwards {}", log(f, dir));
    (net, xlb, sock)
}

#[test]
fn a_datagram_larger_than_the_backends_smaller_port_is_answered_with_fragmentation_needed_and_then_arrives() {
    if skip_without_root(
        "a_datagram_larger_than_the_backends_smaller_port_is_answered_with_fragmentation_needed_and_then_arrives",
    ) || !have_tool("ethtool", "--version")
    {
        return;
    }
    for f in [V4, V6] {
        let dir = tempfile::tempdir().expect("dir");
        let (net, _xlb, sock) = setup(f, 1500, 1400, dir.path());
        // A 1,400-byte IP packet, the backends' MTU exactly.
        let fits = 1400 - f.header - 8;
        let answer = ask(&sock, &vec![b'a'; fits], 5);
        assert_eq!(answer, Some(fits.to_string().into_bytes()), "fits {}", log(f, dir.path()));
        assert_eq!(path_mtu(&net.client, f.vip), None, "no path MTU recorded yet {}", log(f, dir.path()));
        let before = stats(dir.path()).event("too_big_sent");
        // A 1,500-byte packet (DF over IPv4); xlb answers, the client records 1,400.
        let big = 1500 - f.header - 8;
        sock.send(&vec![b'a'; big]).expect("send");
        let recorded = wait(Duration::from_secs(3), || path_mtu(&net.client, f.vip));
        assert_eq!(recorded, Some(1400), "the client's kernel took xlb's answer {}", log(f, dir.path()));
        assert!(stats(dir.path()).event("too_big_sent") > before, "counted {}", log(f, dir.path()));
        // Sent again: in fragments of at most 1,400 bytes, which reach the backend and are
        // reassembled there.
        let answer = ask(&sock, &vec![b'a'; big], 5);
        assert_eq!(answer, Some(big.to_string().into_bytes()), "arrives in fragments {}", log(f, dir.path()));
    }
}

#[test]
fn an_answer_larger_than_the_clients_smaller_port_is_answered_with_fragmentation_needed_and_then_arrives() {
    if skip_without_root(
        "an_answer_larger_than_the_clients_smaller_port_is_answered_with_fragmentation_needed_and_then_arrives",
    ) || !have_tool("ethtool", "--version")
    {
        return;
    }
    for f in [V4, V6] {
        let dir = tempfile::tempdir().expect("dir");
        let (net, _xlb, sock) = setup(f, 1400, 1500, dir.path());
        // The clients' MTU exactly.
        let fits = 1400 - f.header - 8;
        let answer = ask(&sock, format!("big {fits}").as_bytes(), 5);
        assert_eq!(answer.map(|a| a.len()), Some(fits), "fits {}", log(f, dir.path()));
        let before = stats(dir.path()).event("too_big_sent");
        // A 1,500-byte answer: xlb sends the error to the backend, whose kernel records 1,400
        // towards the client (DNAT keeps the client's address) and fragments the next answer.
        let big = 1500 - f.header - 8;
        let mut buf = [0u8; 2048];
        sock.send(format!("big {big}").as_bytes()).expect("send");
        assert!(sock.recv(&mut buf).is_err(), "the first answer does not leave oversized {}", log(f, dir.path()));
        let recorded = wait(Duration::from_secs(3), || path_mtu(&net.backend, f.client));
        assert_eq!(recorded, Some(1400), "the backend's kernel took xlb's answer {}", log(f, dir.path()));
        assert!(stats(dir.path()).event("too_big_sent") > before, "counted {}", log(f, dir.path()));
        let answer = ask(&sock, format!("big {big}").as_bytes(), 5);
        assert_eq!(answer.map(|a| a.len()), Some(big), "arrives in fragments {}", log(f, dir.path()));
    }
}
