//! The xlb configuration document: its schema ([`Config`]), defaults and validation.
//!
//! The document's fields use KubeProxyConfiguration's names wherever one exists
//! (CFG-01..07). Unknown fields are errors naming the field. The file that carries the
//! document, and the Kubernetes objects beside it, is read by [`crate::file_source`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use dataplane::addr::Cidr;
use dataplane::tables::{ForwardingMode, Scheduler};
use serde::Deserialize;

/// `apiVersion` of the xlb configuration document.
pub const API_VERSION: &str = "xlb.dev/v1alpha1";
/// `kind` of the xlb configuration document.
pub const KIND: &str = "XlbConfiguration";

/// The xlb configuration (the `XlbConfiguration` document), validated.
///
/// Every field is optional in YAML; missing fields take the defaults of [`Config::default`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// This node's name: the Node object to watch and the `nodeName` that makes an endpoint
    /// local (TP-05). xlb's own field; see also [`Config::hostname_override`].
    pub node_name: Option<String>,
    /// KubeProxyConfiguration's name for the node name; accepted as an alias of `nodeName`
    /// (both set and different is an error).
    pub hostname_override: Option<String>,
    /// Extra node addresses, placed before the Node object's `status.addresses` and counted
    /// as `InternalIP` (so the first one per family is the "primary" address, NPA-07). For
    /// standalone mode without a Node object.
    pub node_addresses: Vec<IpAddr>,
    /// Which node addresses serve NodePorts (`nodePortAddresses`, CFG-06, NPA-01..03): CIDRs
    /// and/or the word `primary`. Empty = every node address (iptables-mode default, NPA-02).
    #[serde(deserialize_with = "de_node_port_addresses")]
    pub node_port_addresses: Vec<NodePortAddress>,
    /// Minimum time between table rebuilds (`minSyncPeriod`, Go duration; default 1s, CFG-03,
    /// SYNC-01).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub min_sync_period: Duration,
    /// Period of full resyncs (`syncPeriod`, Go duration; default 30s, CFG-03, SYNC-04).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub sync_period: Duration,
    /// How long xlb keeps forwarding after SIGTERM (`shutdownGracePeriod`, Go duration;
    /// default 20s; 0 = stop at once). From the signal on, `/healthz` and the
    /// healthCheckNodePorts answer 503 so that load balancers stop sending new traffic (LB-06),
    /// while the workers forward whatever still arrives and the tables keep syncing; then xlb
    /// stops and cleans up. A second SIGTERM, or SIGINT, ends it at once. Keep it below the
    /// DaemonSet's `terminationGracePeriodSeconds` (30) and systemd's `TimeoutStopSec` (30s).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub shutdown_grace_period: Duration,
    /// Flow-table settings (`conntrack`, CT-04, G-02).
    pub conntrack: ConntrackConfig,
    /// Scheduler settings (`ipvs`, SCHED-02).
    pub ipvs: IpvsConfig,
    /// Masquerade settings (`iptables`, CFG-04).
    pub iptables: IptablesConfig,
    /// Address of `/healthz` and `/livez` (`healthzBindAddress`, default `0.0.0.0:10256`,
    /// CFG-07, HC-01).
    pub healthz_bind_address: SocketAddr,
    /// Address of `/metrics` (`metricsBindAddress`, default `127.0.0.1:10249` as kube-proxy's,
    /// CFG-07, HC-08; set `0.0.0.0:10249` for Prometheus to scrape the node, as the shipped
    /// ConfigMap does).
    pub metrics_bind_address: SocketAddr,
    /// Pod CIDRs (`clusterCIDR`, comma-separated like kube-proxy's `--cluster-cidr`, NAT-06).
    /// When set, ClusterIP traffic from a source outside these prefixes is masqueraded, as
    /// kube-proxy does with `detectLocalMode: ClusterCIDR` (`! -s <clusterCIDR> -j
    /// KUBE-MARK-MASQ`), so that the backend's reply comes back through xlb (G-06 decided).
    #[serde(rename = "clusterCIDR", deserialize_with = "de_cluster_cidr")]
    pub cluster_cidr: Vec<Cidr>,
    /// Interfaces the workers attach to, in port-index order.
    pub interfaces: Vec<InterfaceConfig>,
    /// CPU cores to run one worker each on.
    pub cores: Vec<usize>,
    /// Source addresses for SNAT/masquerade; each defaults to the node's primary address of
    /// its family (NAT-02: kube-proxy masquerades to the node IP).
    pub snat_addresses: SnatAddresses,
    /// Prefixes (at most one per family) from which DSR IPIP outer source addresses are drawn.
    #[serde(deserialize_with = "de_cidrs")]
    pub dsr_source_prefixes: Vec<Cidr>,
    /// Largest Maglev table size M (a prime of `dataplane::maglev::TABLE_SIZES`; default 65537).
    pub maglev_table_size: u32,
    /// Smallest Maglev table size M (a prime of `dataplane::maglev::TABLE_SIZES`; default 1021,
    /// `dataplane::maglev::DEFAULT_MIN_TABLE_SIZE`; above `maglevTableSize`, that wins). M grows
    /// with a Service's backends (100 slots per backend) from this floor; equal to
    /// `maglevTableSize`, every Service has one M, so a change of its backends moves only the
    /// flows the Maglev paper's minimal disruption moves, for every backend count.
    pub maglev_min_table_size: u32,
    /// Default forwarding mode: `nat`, `dsr-ipip` or `dsr-l2` (default `nat`); a Service can
    /// override it with the annotation `xlb.dev/forwarding-mode`.
    #[serde(deserialize_with = "de_forwarding_mode")]
    pub forwarding_mode: ForwardingMode,
    /// The `spec.loadBalancerClass` xlb provisions addresses for (SVC-08; from
    /// [`Config::address_pools`], [`crate::ipam`]) and announces ([`Config::announce`]: only
    /// the ingress IPs of Services of this class and, with
    /// [`Config::handle_default_load_balancer_class`], of Services without one). It does not
    /// limit forwarding: like kube-proxy (`pkg/proxy/serviceport.go`), xlb programs the
    /// `status.loadBalancer.ingress[].ip` of every LoadBalancer Service, whatever its class.
    pub load_balancer_class: Option<String>,
    /// Also provision and announce LoadBalancer Services with no `loadBalancerClass` (default
    /// true). Like [`Config::load_balancer_class`], it does not limit forwarding.
    pub handle_default_load_balancer_class: bool,
    /// Address pools for the LoadBalancer Services of xlb's class (`addressPools`: a list of
    /// `{name, addresses, autoAssign, avoidBuggyIPs, serviceAllocation}`, the fields of
    /// MetalLB's IPAddressPool; see [`crate::ipam`]). In standalone mode the Services of the
    /// file that have no `status.loadBalancer.ingress` get their addresses from these pools
    /// when the file is loaded. Names must be unique and pools must not overlap. Default none.
    pub address_pools: Vec<crate::ipam::AddressPool>,
    /// Kubernetes mode: assign LoadBalancer addresses from the `XlbIPPool` objects and write
    /// the Services' status (`addressAssignment`; off by default). See [`AddressAssignment`].
    pub address_assignment: AddressAssignment,
    /// Static next hops for standalone mode (the kernel's neighbour table replaces them when
    /// running on a real interface).
    pub neighbours: Vec<NeighbourConfig>,
    /// Static routes for backends that are not on-link; they override the kernel's routes.
    pub routes: Vec<RouteConfig>,
    /// The kernel routing tables whose unicast routes give the backends' next hops
    /// (`routeTables`, table ids as in `ip route show table ID`; default `[254]`, main). The
    /// routes of every listed table are merged: longest prefix first, then lowest metric (no
    /// policy rules are evaluated). Empty = none: backends without a `routes` entry are taken
    /// as on-link. Reread when the kernel announces a route change, and every `syncPeriod`.
    pub route_tables: Vec<u32>,
    /// AF_XDP settings of the workers.
    pub af_xdp: AfXdpConfig,
    /// Name of the exception-path TUN device (`puntDevice`, default `xlb0`, at most 15
    /// bytes; empty = none). Frames the steering program hands to xlb that are not xlb's
    /// (direct traffic of a pod that also backs a Service) are written into it, so the kernel
    /// routes them as if they came from the NIC; backends reached through the kernel (pods on
    /// this node) use it too. xlb creates it at start (a change takes effect at the next start,
    /// not on a reload); it disappears when xlb exits. See docs/architecture.md, "Data flow",
    /// steps 6 and 7.
    pub punt_device: String,
    /// How this node tells the network about the VIPs it serves (`announce`; default mode
    /// `none`). See [`AnnounceConfig`] and docs/operations.md, "Announcing VIPs over BGP".
    pub announce: AnnounceConfig,
    /// The Kubernetes API client's client-side rate limit (`clientConnection`, kube-proxy's
    /// field; default qps 5, burst 10). See [`ClientConnectionConfig`].
    pub client_connection: ClientConnectionConfig,
}

/// `clientConnection` block (kube-proxy's `ClientConnectionConfiguration`, the fields xlb
/// uses): the token bucket every request to the API server waits on, as client-go's
/// (`crate::k8s::RateLimit`). Lists, gets, updates and the opening of each watch take one
/// token; the events a watch streams take none.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClientConnectionConfig {
    /// Requests per second (`qps`; default 5). 0 means 5 (client-go's `DefaultQPS`, also
    /// kube-proxy's default); a negative value turns client-side rate limiting off (client-go
    /// `rest.Config.QPS`). Must be finite.
    pub qps: f32,
    /// Requests that may go at once before `qps` paces them (`burst`, the bucket size;
    /// default 10). 0 means 10 (client-go's `DefaultBurst`); negative is an error, as in
    /// kube-proxy's validation.
    pub burst: i32,
}

impl Default for ClientConnectionConfig {
    fn default() -> Self {
        Self { qps: crate::k8s::DEFAULT_QPS, burst: crate::k8s::DEFAULT_BURST }
    }
}

/// `announce` block: which VIPs this node announces to its routers, and through what.
///
/// A LoadBalancer Service's `status.loadBalancer.ingress[].ip` is announced while this node is
/// healthy (`/healthz` would answer 200) and the Service has a usable endpoint for its external
/// traffic (`crate::announce::announced`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AnnounceConfig {
    /// `none` (default: xlb announces nothing), `bgp` (through the BIRD 2 daemon the
    /// operator runs, [`BirdConfig`]) or `l2` (this node answers ARP and Neighbor
    /// Solicitations for the VIPs itself, [`L2Config`]).
    pub mode: AnnounceMode,
    /// Also announce `spec.externalIPs` (of Services of any type; default false). Off by
    /// default because whoever may create a Service may set any external IP (CVE-2020-8554):
    /// announcing them would let them draw any address's traffic to this node.
    #[serde(rename = "externalIPs")]
    pub external_ips: bool,
    /// Where the BGP mode writes the prefixes and which BIRD it reconfigures.
    pub bird: BirdConfig,
    /// Where the L2 mode answers.
    pub l2: L2Config,
}

impl Default for AnnounceConfig {
    fn default() -> Self {
        Self { mode: AnnounceMode::None, external_ips: false, bird: BirdConfig::default(), l2: L2Config::default() }
    }
}

/// `announce.l2` block: the L2 mode (docs/operations.md, "Announcing VIPs on the local network
/// (L2)"). The steering program answers ARP requests (RFC 826) and Neighbor Solicitations (RFC
/// 4861 §7.2.4) for each announced VIP with the MAC of the interface they arrive on; a VIP
/// that becomes announced is told to the segment with a gratuitous ARP request (RFC 5227
/// §2.3) or an unsolicited Neighbor Advertisement (RFC 4861 §7.2.6).
///
/// With several xlb nodes on one segment (Kubernetes mode), each VIP has one owner, chosen by
/// rendezvous hashing (`crate::announce::l2::owner`) among the nodes whose per-node Lease
/// (`coordination.k8s.io/v1`, named `xlb-node-<nodeName>` in [`L2Config::lease_namespace`]) is
/// unexpired ([`crate::k8s::Membership`]) and that would announce it (for a VIP of
/// `externalTrafficPolicy: Local` Services, those with a usable endpoint of it on their node;
/// `crate::announce::l2::owned`). Standalone, this node owns every VIP it announces.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct L2Config {
    /// The interfaces (names from `interfaces`) that answer for the VIPs; empty (default):
    /// all of them.
    pub interfaces: Vec<String>,
    /// Kubernetes mode: namespace of the per-node membership Leases (default `kube-system`,
    /// where the DaemonSet runs; the Role of `deploy/kubernetes/role-lease.yaml` grants it).
    pub lease_namespace: String,
    /// Kubernetes mode: the Lease's `leaseDurationSeconds` (Go duration, whole seconds, at
    /// least 1s; default 10s). Another node takes a dead node's VIPs over this long after it
    /// last saw that node's Lease renewed: the failover time of a node that dies is at most
    /// this, plus one control-loop tick (up to 0.2 s) and the take-over frames.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub lease_duration: Duration,
    /// Kubernetes mode: how often this node renews its Lease while healthy (Go duration,
    /// above 0 and at most a third of `leaseDuration`; default 2s). A node that dies is
    /// replaced no sooner than `leaseDuration - renewInterval` after its death. While this
    /// node's own renewals fail, it stops expiring the others' Leases
    /// ([`crate::k8s::Membership`]); the third leaves room for that.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub renew_interval: Duration,
}

impl Default for L2Config {
    fn default() -> Self {
        Self {
            interfaces: Vec::new(),
            lease_namespace: "kube-system".into(),
            lease_duration: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
        }
    }
}

/// `announce.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnnounceMode {
    /// Announce nothing (another component announces the VIPs, or they are routed statically).
    None,
    /// BGP through BIRD 2: xlb writes `route` lines into the files [`BirdConfig`] names, which
    /// the operator's BIRD config includes, and runs `birdc configure`.
    Bgp,
    /// L2: this node answers ARP / Neighbor Solicitations for the VIPs ([`L2Config`]).
    L2,
}

/// `announce.bird` block (BIRD 2; BIRD User's Guide, chapter 4 "Remote control" and
/// section 3.1 "Global options", `include`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BirdConfig {
    /// The file of IPv4 `route PREFIX/32 blackhole;` lines, included by an `ipv4` static
    /// protocol (default `/run/xlb/bird-vips4.conf`). Absolute path; written atomically
    /// (temporary file in the same directory, fsync, rename).
    pub ipv4_file: PathBuf,
    /// The file of IPv6 `route PREFIX/128 blackhole;` lines, included by an `ipv6` static
    /// protocol (default `/run/xlb/bird-vips6.conf`). Absolute path, not `ipv4File`.
    pub ipv6_file: PathBuf,
    /// BIRD's control socket (`bird -s`; default `/run/bird/bird.ctl`, Debian's).
    pub socket: PathBuf,
    /// The `birdc` program (default `birdc`, found through `$PATH`).
    pub birdc: PathBuf,
    /// How long `birdc configure` may take before it is killed and the change counts as
    /// failed (Go duration; default 10s).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub timeout: Duration,
}

impl Default for BirdConfig {
    fn default() -> Self {
        Self {
            ipv4_file: PathBuf::from("/run/xlb/bird-vips4.conf"),
            ipv6_file: PathBuf::from("/run/xlb/bird-vips6.conf"),
            socket: PathBuf::from("/run/bird/bird.ctl"),
            birdc: PathBuf::from("birdc"),
            timeout: Duration::from_secs(10),
        }
    }
}

/// `afXdp` block: how the workers use AF_XDP (kernel doc networking/af_xdp.rst).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AfXdpConfig {
    /// Busy-poll the rings instead of sleeping in `poll(2)` when idle (default false: the
    /// `XDP_USE_NEED_WAKEUP` interrupt-driven mode).
    pub busy_poll: bool,
    /// `auto` (zero-copy where the driver supports it, else copy; default), `copy` or
    /// `zerocopy` (fail if unsupported).
    pub zero_copy: String,
    /// UMEM frames per worker (default 8192; frames are 2048 bytes). At least twice
    /// [`Self::ring_size`]; with the fill rings whole, each of a worker's sockets holds up to
    /// `ringSize` frames on its receive side, so `2 × ringSize × interfaces` leaves as many for
    /// the transmit side.
    pub frames: u32,
    /// Entries of each AF_XDP ring (RX, TX, fill, completion; `XskConfig::ring_size`): a power
    /// of two, 64..=16384, default 2048. The receive side of a socket holds at most this many
    /// frames, so it bounds how long a worker may stop (preempted, or a slow batch) before the
    /// kernel drops what arrives: 2,048 frames are 1.9 ms at 1.1 Mpps. On the 2-vCPU test
    /// machine, at 1.1 Mpps, rings of 8192 lost nothing in 10 of 16 trials (at most 0.31 %)
    /// where 2048 lost 0.05-0.45 % in every one; in copy mode a deeper ring makes the kernel's
    /// copy into the UMEM dearer (docs/benchmarks.md, "Deeper rings against the worker's
    /// stalls"). Raise `frames` with it.
    pub ring_size: u32,
    /// Frames each socket keeps in its fill ring while the worker runs
    /// (`XskConfig::fill_frames`): 0 (default) for the whole ring, else 64..=`ringSize`. The
    /// depth is how long a worker can stall before the kernel drops
    /// (`xlb_xsk_socket_rx_fill_ring_empty_total`). In copy mode a shallower ring makes the
    /// kernel's copy of each received frame cheaper: 512 forwarded a few percent more at full
    /// load on the test machine but lost frames at every lower rate (docs/benchmarks.md, "The
    /// generator's core"), which is why the default is the whole ring.
    pub fill_frames: u32,
    /// Register each worker's UMEM in unaligned chunk mode (`XskConfig::unaligned_chunks`,
    /// kernel doc af_xdp.rst `XDP_UMEM_UNALIGNED_CHUNK_FLAG`; default true): the kernel then
    /// takes the descriptor of each frame it receives from a stack of free ones instead of
    /// one per UMEM chunk, which in copy mode halved its `xp_alloc` on the receiving core
    /// (docs/benchmarks.md, "Unaligned chunks"). `false` for a NIC driver whose zero-copy
    /// support of unaligned chunks is in doubt.
    pub unaligned_chunks: bool,
    /// Preferred busy polling (kernel doc networking/napi.rst "Busy polling", af_xdp.rst):
    /// sets `SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL` = [`Self::busy_poll_usecs`] and
    /// `SO_BUSY_POLL_BUDGET` = [`Self::busy_poll_budget`] on every socket, and the worker
    /// drives its queue's NAPI itself. Use it when a queue's interrupt (its NAPI) runs on the
    /// worker's own core; see docs/operations.md "Worker and queue on one core". Default false.
    pub prefer_busy_poll: bool,
    /// Run the workers as `SCHED_FIFO` (priority 1) threads: for a worker whose core also runs
    /// its queue's interrupt or NAPI thread. The worker then runs until its rings are empty and
    /// sleeps in `poll(2)`; receive work runs while it sleeps, so the core does not spend
    /// itself receiving frames the worker has no time to forward. Default false. See
    /// docs/operations.md "Worker and queue on one core".
    pub realtime_workers: bool,
    /// `SO_BUSY_POLL` in microseconds (default 20; 1..=1000000).
    pub busy_poll_usecs: u32,
    /// `SO_BUSY_POLL_BUDGET`: packets per busy-poll NAPI run (default 64; 1..=1024).
    pub busy_poll_budget: u16,
}

impl Default for AfXdpConfig {
    fn default() -> Self {
        Self {
            busy_poll: false,
            zero_copy: "auto".into(),
            frames: 8192,
            ring_size: 2048,
            fill_frames: 0,
            unaligned_chunks: true,
            prefer_busy_poll: false,
            realtime_workers: false,
            busy_poll_usecs: 20,
            busy_poll_budget: 64,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_name: None,
            hostname_override: None,
            node_addresses: Vec::new(),
            node_port_addresses: Vec::new(),
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            shutdown_grace_period: Duration::from_secs(20),
            conntrack: ConntrackConfig::default(),
            ipvs: IpvsConfig::default(),
            iptables: IptablesConfig::default(),
            healthz_bind_address: SocketAddr::from(([0, 0, 0, 0], 10256)),
            metrics_bind_address: SocketAddr::from(([127, 0, 0, 1], 10249)),
            cluster_cidr: Vec::new(),
            interfaces: Vec::new(),
            cores: Vec::new(),
            snat_addresses: SnatAddresses::default(),
            dsr_source_prefixes: Vec::new(),
            maglev_table_size: dataplane::maglev::DEFAULT_MAX_TABLE_SIZE,
            maglev_min_table_size: dataplane::maglev::DEFAULT_MIN_TABLE_SIZE,
            forwarding_mode: ForwardingMode::Nat,
            load_balancer_class: None,
            handle_default_load_balancer_class: true,
            address_pools: Vec::new(),
            address_assignment: AddressAssignment::default(),
            neighbours: Vec::new(),
            routes: Vec::new(),
            route_tables: vec![254],
            af_xdp: AfXdpConfig::default(),
            punt_device: "xlb0".into(),
            announce: AnnounceConfig::default(),
            client_connection: ClientConnectionConfig::default(),
        }
    }
}

/// One entry of `nodePortAddresses`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePortAddress {
    /// `primary`: the node's primary address of each family (NPA-02, NPA-03, NPA-07).
    Primary,
    /// Node addresses inside this prefix (NPA-01; `0.0.0.0/0` = every IPv4 address, NPA-03).
    Cidr(Cidr),
}

/// `addressAssignment` block (Kubernetes mode only): one xlb at a time, the holder of a
/// `coordination.k8s.io/v1` Lease, gives the LoadBalancer Services of xlb's class their
/// addresses from the `XlbIPPool` objects and writes `status.loadBalancer.ingress`
/// ([`crate::k8s::Assigner`]). Needs the CRD and the RBAC of `deploy/kubernetes`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AddressAssignment {
    /// Run the assigner (default false: with another LoadBalancer controller, e.g. MetalLB,
    /// for the same class, leave it off).
    pub enabled: bool,
    /// Namespace of the Lease (default `kube-system`, where the DaemonSet runs).
    pub lease_namespace: String,
    /// Name of the Lease (default `xlb-address-assignment`).
    pub lease_name: String,
    /// `leaseDurationSeconds` (Go duration, whole seconds, at least 3s; default 15s, as
    /// client-go's leader election). A holder that dies is replaced within about this long;
    /// the holder stops acting 2/3 of it after its last renewal, and renews every 2/15 of it.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub lease_duration: Duration,
}

impl Default for AddressAssignment {
    fn default() -> Self {
        Self {
            enabled: false,
            lease_namespace: "kube-system".into(),
            lease_name: "xlb-address-assignment".into(),
            lease_duration: Duration::from_secs(15),
        }
    }
}

/// `conntrack` block: flow-table timeouts and size.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConntrackConfig {
    /// Idle timeout of an established TCP flow (Go duration; default 900s, IPVS's
    /// `tcpTimeout` as in seed CT-04; kube-proxy's nf_conntrack default is 24h).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub tcp_established_timeout: Duration,
    /// Timeout of a TCP flow after FIN or RST (Go duration; default 120s, Linux
    /// `nf_conntrack_tcp_timeout_fin_wait`; the IPVS example in CT-04 uses 16s).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub tcp_fin_timeout: Duration,
    /// Idle timeout of a UDP flow (Go duration; default 300s, IPVS's `udpTimeout`, CT-04).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub udp_timeout: Duration,
    /// Flow-table capacity per worker core, in flows (default 32768, kube-proxy's
    /// `conntrack.maxPerCore` default).
    pub max_per_core: u32,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        Self {
            tcp_established_timeout: Duration::from_secs(900),
            tcp_fin_timeout: Duration::from_secs(120),
            udp_timeout: Duration::from_secs(300),
            max_per_core: 32768,
        }
    }
}

/// `ipvs` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IpvsConfig {
    /// Default scheduler by IPVS name: `random` (default, kube-proxy iptables/nftables
    /// behaviour, SCHED-01), `mh`, `mh-noport`, `rr`, `wrr`, `lc`, `wlc`, `sh`, `dh`, `sed`,
    /// `nq` (SCHED-02..10). A Service can override it with the annotation `xlb.dev/scheduler`.
    #[serde(deserialize_with = "de_scheduler")]
    pub scheduler: Scheduler,
}

impl Default for IpvsConfig {
    fn default() -> Self {
        Self { scheduler: Scheduler::Random }
    }
}

/// `iptables` block (only the fields that mean something to xlb).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IptablesConfig {
    /// Masquerade every service flow, ClusterIP included (NAT-04; default false, CFG-04).
    pub masquerade_all: bool,
}

/// One interface the workers attach to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterfaceConfig {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Queue ids to bind AF_XDP sockets on (e.g. `[0, 1]`); empty = queue 0.
    #[serde(default)]
    pub queues: Vec<u32>,
}

/// `snatAddresses` block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SnatAddresses {
    /// IPv4 SNAT source address.
    pub ipv4: Option<Ipv4Addr>,
    /// IPv6 SNAT source address.
    pub ipv6: Option<Ipv6Addr>,
}

/// One static neighbour (`neighbours[]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NeighbourConfig {
    /// Neighbour IP address.
    pub address: IpAddr,
    /// Its MAC address, `aa:bb:cc:dd:ee:ff`.
    #[serde(deserialize_with = "de_mac")]
    pub mac: [u8; 6],
    /// The interface it is reached on: a name from `interfaces`, or an index into it.
    pub port: NeighbourPort,
}

/// How a neighbour names its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeighbourPort {
    /// Index into `interfaces`.
    Index(u8),
    /// Name of an entry of `interfaces`.
    Name(String),
}

/// One static route (`routes[]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteConfig {
    /// Destination prefix.
    #[serde(deserialize_with = "de_cidr")]
    pub dst: Cidr,
    /// Gateway (must be a neighbour).
    pub via: IpAddr,
}

/// A configuration value that parses but is not valid; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigFieldError {
    /// Field path in the xlb document, e.g. `snatAddresses.ipv4`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn field_err(field: impl Into<String>, message: impl Into<String>) -> ConfigFieldError {
    ConfigFieldError { field: field.into(), message: message.into() }
}

impl Config {
    /// This node's name: `nodeName`, else `hostnameOverride` (trimmed); `None` if neither.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref().or(self.hostname_override.as_deref()).map(str::trim).filter(|s| !s.is_empty())
    }

    /// The interface index a neighbour's `port` names.
    pub fn port_index(&self, p: &NeighbourPort) -> Option<u8> {
        match p {
            NeighbourPort::Index(i) => (usize::from(*i) < self.interfaces.len()).then_some(*i),
            NeighbourPort::Name(n) => {
                self.interfaces.iter().position(|i| &i.name == n).and_then(|i| u8::try_from(i).ok())
            }
        }
    }

    /// The DSR source prefix of each family: (IPv4, IPv6).
    pub fn dsr_source_prefixes_by_family(&self) -> (Option<Cidr>, Option<Cidr>) {
        let v4 = self.dsr_source_prefixes.iter().find(|c| c.addr.is_ipv4()).copied();
        let v6 = self.dsr_source_prefixes.iter().find(|c| c.addr.is_ipv6()).copied();
        (v4, v6)
    }

    /// Checks the rules that span fields or that serde cannot express.
    ///
    /// # Errors
    /// The first [`ConfigFieldError`] found, naming the field.
    pub fn validate(&self) -> Result<(), ConfigFieldError> {
        // A SNAT address is the source of masqueraded packets: unicast only (the steering
        // program's `snat4_index` also uses 0.0.0.0 and 255.255.255.255 as markers).
        if let Some(a) = self.snat_addresses.ipv4
            && (a.is_unspecified() || a.is_broadcast() || a.is_multicast())
        {
            return Err(field_err("snatAddresses.ipv4", format!("{a}: want a unicast address")));
        }
        if let Some(a) = self.snat_addresses.ipv6
            && (a.is_unspecified() || a.is_multicast() || a.to_ipv4_mapped().is_some())
        {
            return Err(field_err("snatAddresses.ipv6", format!("{a}: want a unicast IPv6 address (not IPv4-mapped)")));
        }
        if !matches!(self.af_xdp.zero_copy.as_str(), "auto" | "copy" | "zerocopy") {
            return Err(field_err(
                "afXdp.zeroCopy",
                format!("{:?}: want auto, copy or zerocopy", self.af_xdp.zero_copy),
            ));
        }
        if !(1..=1_000_000).contains(&self.af_xdp.busy_poll_usecs) {
            return Err(field_err("afXdp.busyPollUsecs", format!("{}: want 1..=1000000", self.af_xdp.busy_poll_usecs)));
        }
        if !(1..=1024).contains(&self.af_xdp.busy_poll_budget) {
            return Err(field_err("afXdp.busyPollBudget", format!("{}: want 1..=1024", self.af_xdp.busy_poll_budget)));
        }
        let ring = self.af_xdp.ring_size;
        if !dataplane::xsk::ring_size_ok(ring) {
            let r = dataplane::xsk::RING_SIZES;
            return Err(field_err(
                "afXdp.ringSize",
                format!("{ring}: want a power of two in {}..={}", r.start(), r.end()),
            ));
        }
        if self.af_xdp.fill_frames != 0 && !(64..=ring).contains(&self.af_xdp.fill_frames) {
            return Err(field_err(
                "afXdp.fillFrames",
                format!("{}: want 0 (automatic) or 64..={ring} (afXdp.ringSize)", self.af_xdp.fill_frames),
            ));
        }
        if !self.af_xdp.frames.is_power_of_two() || self.af_xdp.frames < 1024 {
            return Err(field_err("afXdp.frames", format!("{}: want a power of two >= 1024", self.af_xdp.frames)));
        }
        if !dataplane::xsk::frames_ok(self.af_xdp.frames, ring) {
            return Err(field_err(
                "afXdp.frames",
                format!("{}: want at least twice afXdp.ringSize ({ring})", self.af_xdp.frames),
            ));
        }
        if let (Some(a), Some(b)) = (&self.node_name, &self.hostname_override)
            && a.trim() != b.trim()
        {
            return Err(field_err("hostnameOverride", format!("{b:?} differs from nodeName {a:?}; set only one")));
        }
        if self.punt_device.len() > 15
            || self.punt_device.contains(['/', ' '])
            || self.punt_device.contains(char::is_control)
        {
            return Err(field_err(
                "puntDevice",
                format!("{:?}: want an interface name of at most 15 bytes, without '/' or spaces", self.punt_device),
            ));
        }
        if !self.punt_device.is_empty() && self.interfaces.iter().any(|i| i.name == self.punt_device) {
            return Err(field_err("puntDevice", format!("{:?} is one of the interfaces", self.punt_device)));
        }
        if self.sync_period.is_zero() {
            return Err(field_err("syncPeriod", "must be greater than 0"));
        }
        match crate::k8s::RateLimit::from_client_connection(&self.client_connection) {
            Err(crate::k8s::RateLimitError::Qps(q)) => {
                return Err(field_err("clientConnection.qps", format!("{q}: want a finite number")));
            }
            Err(crate::k8s::RateLimitError::Burst(b)) => {
                return Err(field_err("clientConnection.burst", format!("{b}: must be non-negative")));
            }
            Ok(_) => {}
        }
        if self.min_sync_period > self.sync_period {
            return Err(field_err(
                "minSyncPeriod",
                format!(
                    "{} is longer than syncPeriod {}",
                    crate::duration::format_go_duration(self.min_sync_period),
                    crate::duration::format_go_duration(self.sync_period)
                ),
            ));
        }
        for (field, size) in
            [("maglevTableSize", self.maglev_table_size), ("maglevMinTableSize", self.maglev_min_table_size)]
        {
            if !dataplane::maglev::TABLE_SIZES.contains(&size) {
                return Err(field_err(
                    field,
                    format!("{size} is not one of the supported primes {:?}", dataplane::maglev::TABLE_SIZES),
                ));
            }
        }
        let mut seen = BTreeMap::new();
        for (i, c) in self.dsr_source_prefixes.iter().enumerate() {
            let fam = if c.addr.is_ipv4() { "IPv4" } else { "IPv6" };
            if let Some(first) = seen.insert(fam, i) {
                return Err(field_err(
                    format!("dsrSourcePrefixes[{i}]"),
                    format!("second {fam} prefix (first is dsrSourcePrefixes[{first}]); give at most one per family"),
                ));
            }
        }
        let mut names = BTreeMap::new();
        for (i, itf) in self.interfaces.iter().enumerate() {
            if itf.name.trim().is_empty() {
                return Err(field_err(format!("interfaces[{i}].name"), "must not be empty"));
            }
            if let Some(first) = names.insert(itf.name.as_str(), i) {
                return Err(field_err(
                    format!("interfaces[{i}].name"),
                    format!("{:?} is already interfaces[{first}]", itf.name),
                ));
            }
        }
        if self.interfaces.len() > 256 {
            return Err(field_err("interfaces", "at most 256 interfaces"));
        }
        let mut cores = BTreeMap::new();
        for (i, c) in self.cores.iter().enumerate() {
            if let Some(first) = cores.insert(*c, i) {
                return Err(field_err(format!("cores[{i}]"), format!("core {c} is already cores[{first}]")));
            }
        }
        for (i, n) in self.neighbours.iter().enumerate() {
            if self.port_index(&n.port).is_none() {
                let what = match &n.port {
                    NeighbourPort::Index(x) => format!("index {x}"),
                    NeighbourPort::Name(s) => format!("{s:?}"),
                };
                return Err(field_err(
                    format!("neighbours[{i}].port"),
                    format!("{what} names no entry of interfaces ({} configured)", self.interfaces.len()),
                ));
            }
        }
        for (i, r) in self.routes.iter().enumerate() {
            if r.dst.addr.is_ipv4() != r.via.is_ipv4() {
                return Err(field_err(
                    format!("routes[{i}].via"),
                    format!("{} is not of the family of {}", r.via, r.dst),
                ));
            }
        }
        if let Some(c) = &self.load_balancer_class
            && c.trim().is_empty()
        {
            return Err(field_err("loadBalancerClass", "must not be empty (omit it instead)"));
        }
        let aa = &self.address_assignment;
        if aa.lease_duration < Duration::from_secs(3) || aa.lease_duration.subsec_nanos() != 0 {
            return Err(field_err("addressAssignment.leaseDuration", "want whole seconds, at least 3s"));
        }
        if aa.lease_namespace.trim().is_empty() {
            return Err(field_err("addressAssignment.leaseNamespace", "must not be empty"));
        }
        if aa.lease_name.trim().is_empty() {
            return Err(field_err("addressAssignment.leaseName", "must not be empty"));
        }
        let mut pools: Vec<(usize, crate::ipam::Pool)> = Vec::new();
        for (i, p) in self.address_pools.iter().enumerate() {
            let pool = crate::ipam::Pool::new(&p.name, &p.spec)
                .map_err(|e| field_err(format!("addressPools[{i}].{}", e.field), e.message))?;
            if let Some((j, _)) = pools.iter().find(|(_, q)| q.name == pool.name) {
                return Err(field_err(
                    format!("addressPools[{i}].name"),
                    format!("{:?} is already addressPools[{j}]", pool.name),
                ));
            }
            for (k, entry) in p.spec.addresses.iter().enumerate() {
                let r = crate::ipam::parse_addresses_entry(entry)
                    .map_err(|m| field_err(format!("addressPools[{i}].addresses[{k}]"), m))?;
                if let Some((j, q)) = pools.iter().find(|(_, q)| q.ranges.iter().any(|o| o.overlaps(&r))) {
                    return Err(field_err(
                        format!("addressPools[{i}].addresses[{k}]"),
                        format!("{r} overlaps pool {:?} (addressPools[{j}])", q.name),
                    ));
                }
            }
            pools.push((i, pool));
        }
        self.announce.validate()?;
        if self.announce.mode == AnnounceMode::L2 {
            let l2 = &self.announce.l2;
            for (i, name) in l2.interfaces.iter().enumerate() {
                if !self.interfaces.iter().any(|f| &f.name == name) {
                    return Err(field_err(
                        format!("announce.l2.interfaces[{i}]"),
                        format!("{name:?} is not one of `interfaces`"),
                    ));
                }
            }
            if l2.lease_duration < Duration::from_secs(1) || l2.lease_duration.subsec_nanos() != 0 {
                return Err(field_err("announce.l2.leaseDuration", "want whole seconds, at least 1s"));
            }
            if l2.renew_interval.is_zero() || l2.renew_interval > l2.lease_duration / 3 {
                return Err(field_err(
                    "announce.l2.renewInterval",
                    format!("want above 0 and at most a third of leaseDuration ({:?})", l2.lease_duration),
                ));
            }
            if l2.lease_namespace.trim().is_empty() {
                return Err(field_err("announce.l2.leaseNamespace", "must not be empty"));
            }
        }
        Ok(())
    }

    /// The pools of [`Config::address_pools`] (valid after [`Config::validate`]; a pool that
    /// is not is left out).
    pub fn pool_set(&self) -> crate::ipam::PoolSet {
        crate::ipam::PoolSet::build(self.address_pools.iter().map(|p| (p.name.as_str(), &p.spec))).0
    }
}

impl AnnounceConfig {
    /// Checks the `announce` block (the `bird` block only matters, and is only checked, in
    /// mode `bgp`).
    ///
    /// # Errors
    /// The first [`ConfigFieldError`] found, naming the field (e.g. `announce.bird.ipv4File`).
    pub fn validate(&self) -> Result<(), ConfigFieldError> {
        if self.mode != AnnounceMode::Bgp {
            return Ok(());
        }
        let b = &self.bird;
        for (field, path) in [("announce.bird.ipv4File", &b.ipv4_file), ("announce.bird.ipv6File", &b.ipv6_file)] {
            if !path.is_absolute() || path.file_name().is_none() {
                return Err(field_err(field, format!("{}: want the absolute path of a file", path.display())));
            }
            // BIRD's include statement takes the name in double quotes, without escapes.
            if path.to_string_lossy().contains(['"', '\n']) {
                return Err(field_err(
                    field,
                    format!("{}: BIRD cannot include a name with '\"' or a newline", path.display()),
                ));
            }
        }
        if b.ipv4_file == b.ipv6_file {
            return Err(field_err(
                "announce.bird.ipv6File",
                format!(
                    "{} is also ipv4File: IPv4 and IPv6 routes go to different static protocols",
                    b.ipv6_file.display()
                ),
            ));
        }
        if b.socket.as_os_str().is_empty() {
            return Err(field_err("announce.bird.socket", "must not be empty"));
        }
        if b.birdc.as_os_str().is_empty() {
            return Err(field_err("announce.bird.birdc", "must not be empty"));
        }
        if b.timeout.is_zero() {
            return Err(field_err("announce.bird.timeout", "must be greater than 0"));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// serde helpers

fn de_scheduler<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Scheduler, D::Error> {
    let s = String::deserialize(d)?;
    parse_scheduler(&s).map_err(serde::de::Error::custom)
}

/// Parses an IPVS scheduler name (`ipvs.scheduler`, annotation `xlb.dev/scheduler`).
///
/// # Errors
/// A message listing the accepted names.
pub fn parse_scheduler(s: &str) -> Result<Scheduler, String> {
    s.parse::<Scheduler>().map_err(|e| e.to_string())
}

fn de_forwarding_mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ForwardingMode, D::Error> {
    let s = String::deserialize(d)?;
    parse_forwarding_mode(&s).map_err(serde::de::Error::custom)
}

/// Parses a forwarding mode name (`forwardingMode`, annotation `xlb.dev/forwarding-mode`).
///
/// # Errors
/// A message listing the accepted names.
pub fn parse_forwarding_mode(s: &str) -> Result<ForwardingMode, String> {
    s.parse::<ForwardingMode>().map_err(|e| e.to_string())
}

fn de_cidr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Cidr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse::<Cidr>().map_err(serde::de::Error::custom)
}

fn de_cidrs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Cidr>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    v.iter().map(|s| s.parse::<Cidr>().map_err(serde::de::Error::custom)).collect()
}

fn de_cluster_cidr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Cidr>, D::Error> {
    let s = String::deserialize(d)?;
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<Cidr>().map_err(serde::de::Error::custom))
        .collect()
}

fn de_node_port_addresses<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<NodePortAddress>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    v.iter()
        .map(|s| {
            if s.trim() == "primary" {
                Ok(NodePortAddress::Primary)
            } else {
                s.parse::<Cidr>()
                    .map(NodePortAddress::Cidr)
                    .map_err(|e| serde::de::Error::custom(format!("{e}; expected a CIDR or \"primary\"")))
            }
        })
        .collect()
}

fn de_mac<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 6], D::Error> {
    let s = String::deserialize(d)?;
    parse_mac(&s)
        .ok_or_else(|| serde::de::Error::custom(format!("invalid MAC address {s:?}; expected aa:bb:cc:dd:ee:ff")))
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-` separators).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.trim().split([':', '-']);
    for b in &mut out {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

impl<'de> Deserialize<'de> for NeighbourPort {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = NeighbourPort;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an interface name or an index into interfaces")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<NeighbourPort, E> {
                u8::try_from(v)
                    .map(NeighbourPort::Index)
                    .map_err(|_| E::custom(format!("interface index {v} is out of range 0..=255")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<NeighbourPort, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("interface index {v} is negative")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<NeighbourPort, E> {
                Ok(NeighbourPort::Name(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_source::tests::{HEAD, errors, load};

    #[test]
    fn cfg_03_04_07_defaults_match_kube_proxy() {
        let l = load(HEAD).unwrap();
        let c = l.config;
        assert_eq!(c.min_sync_period, Duration::from_secs(1));
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert!(!c.iptables.masquerade_all);
        assert_eq!(c.healthz_bind_address.to_string(), "0.0.0.0:10256");
        assert_eq!(c.metrics_bind_address.to_string(), "127.0.0.1:10249");
        assert_eq!(c.ipvs.scheduler, Scheduler::Random);
        assert_eq!(c.maglev_table_size, 65537);
        assert_eq!(c.forwarding_mode, ForwardingMode::Nat);
        assert!(c.handle_default_load_balancer_class);
        assert!(c.node_port_addresses.is_empty());
    }

    /// G-02: the flow-table timeouts and size that apply when the file sets none (IPVS's 900 s
    /// and 300 s, Linux's 120 s after FIN or RST, kube-proxy's 32768 flows per core), and a
    /// `conntrack` block that sets one field keeps the defaults of the others.
    #[test]
    fn g_02_conntrack_timeouts_and_size_default_per_field() {
        let c = load(HEAD).unwrap().config.conntrack;
        assert_eq!(c.tcp_established_timeout, Duration::from_secs(900));
        assert_eq!(c.tcp_fin_timeout, Duration::from_secs(120));
        assert_eq!(c.udp_timeout, Duration::from_secs(300));
        assert_eq!(c.max_per_core, 32768);
        let c = load(&format!("{HEAD}conntrack: {{udpTimeout: 60s}}\n")).unwrap().config.conntrack;
        assert_eq!(c.udp_timeout, Duration::from_secs(60));
        assert_eq!(c.tcp_established_timeout, Duration::from_secs(900));
        assert_eq!(c.tcp_fin_timeout, Duration::from_secs(120));
        assert_eq!(c.max_per_core, 32768);
    }

    #[test]
    fn full_document_parses() {
        let text = format!(
            "{HEAD}nodeName: node-a\nnodePortAddresses: [primary, 192.168.0.0/16]\nminSyncPeriod: 2s\nsyncPeriod: 1m\n\
conntrack: {{tcpEstablishedTimeout: 900s, tcpFinTimeout: 16s, udpTimeout: 300s, maxPerCore: 1000}}\n\
ipvs: {{scheduler: mh}}\niptables: {{masqueradeAll: true}}\nhealthzBindAddress: 127.0.0.1:10256\n\
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56\ninterfaces: [{{name: eth0, queues: [0, 1]}}]\ncores: [0, 1]\n\
nodeAddresses: [192.168.1.10]\nsnatAddresses: {{ipv4: 192.168.1.10}}\ndsrSourcePrefixes: [172.16.0.0/16]\n\
maglevTableSize: 131071\nforwardingMode: dsr-ipip\nloadBalancerClass: xlb.dev/lb\nhandleDefaultLoadBalancerClass: false\n\
neighbours: [{{address: 192.168.1.1, mac: 'aa:bb:cc:dd:ee:ff', port: eth0}}, {{address: 192.168.1.2, mac: '02-00-00-00-00-01', port: 0}}]\n\
routes: [{{dst: 10.0.0.0/8, via: 192.168.1.1}}]\n"
        );
        let c = load(&text).unwrap().config;
        assert_eq!(c.node_name(), Some("node-a"));
        assert_eq!(c.node_port_addresses.len(), 2);
        assert_eq!(c.node_port_addresses[0], NodePortAddress::Primary);
        assert_eq!(c.conntrack.tcp_fin_timeout, Duration::from_secs(16));
        assert_eq!(c.ipvs.scheduler, Scheduler::Maglev { port: true });
        assert!(c.iptables.masquerade_all);
        assert_eq!(c.cluster_cidr.len(), 2);
        assert_eq!(c.neighbours[0].mac, [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
        assert_eq!(c.port_index(&c.neighbours[1].port), Some(0));
        assert_eq!(c.forwarding_mode, ForwardingMode::DsrIpip);
        assert_eq!(c.routes[0].dst.to_string(), "10.0.0.0/8");
    }

    #[test]
    fn unknown_field_is_an_error_naming_the_field() {
        let e = errors(&format!("{HEAD}conntrack:\n  udpTimout: 5s\n"));
        assert_eq!(e.len(), 1);
        let s = e[0].to_string();
        assert!(s.contains("document 1") && s.contains("XlbConfiguration"), "{s}");
        assert!(s.contains("udpTimout"), "{s}");
    }

    #[test]
    fn bad_duration_names_the_field_path() {
        let e = errors(&format!("{HEAD}conntrack:\n  udpTimeout: 5x\n"));
        assert_eq!(e[0].field.as_deref(), Some("conntrack.udpTimeout"), "{}", e[0]);
    }

    #[test]
    fn bad_scheduler_and_cross_field_rules_are_errors() {
        let e = errors(&format!("{HEAD}ipvs: {{scheduler: fastest}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("ipvs.scheduler"));
        let e = errors(&format!("{HEAD}maglevTableSize: 1000\n"));
        assert_eq!(e[0].field.as_deref(), Some("maglevTableSize"));
        let e = errors(&format!("{HEAD}maglevMinTableSize: 1000\n"));
        assert_eq!(e[0].field.as_deref(), Some("maglevMinTableSize"));
        let c = load(&format!("{HEAD}maglevMinTableSize: 65537\n")).unwrap().config;
        assert_eq!((c.maglev_min_table_size, c.maglev_table_size), (65537, 65537));
        assert_eq!(load(HEAD).unwrap().config.maglev_min_table_size, 1021);
        let e = errors(&format!("{HEAD}neighbours: [{{address: 10.0.0.1, mac: '00:00:00:00:00:01', port: eth9}}]\n"));
        assert_eq!(e[0].field.as_deref(), Some("neighbours[0].port"));
        let e = errors(&format!("{HEAD}nodeName: a\nhostnameOverride: b\n"));
        assert_eq!(e[0].field.as_deref(), Some("hostnameOverride"));
        let e = errors(&format!("{HEAD}nodePortAddresses: [10.0.0.1/8]\n"));
        assert_eq!(e[0].field.as_deref(), Some("nodePortAddresses"), "{}", e[0]);
    }

    #[test]
    fn af_xdp_core_sharing_settings_parse_and_bad_values_name_the_field() {
        let c = load(&format!(
            "{HEAD}afXdp: {{realtimeWorkers: true, preferBusyPoll: true, busyPollUsecs: 50, busyPollBudget: 16}}\n"
        ))
        .unwrap()
        .config;
        assert!(c.af_xdp.realtime_workers && c.af_xdp.prefer_busy_poll);
        assert_eq!((c.af_xdp.busy_poll_usecs, c.af_xdp.busy_poll_budget), (50, 16));
        let d = load(HEAD).unwrap().config.af_xdp;
        assert!(!d.realtime_workers && !d.prefer_busy_poll, "both off by default");
        let e = errors(&format!("{HEAD}afXdp: {{busyPollUsecs: 0}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("afXdp.busyPollUsecs"), "{}", e[0]);
        let e = errors(&format!("{HEAD}afXdp: {{busyPollBudget: 5000}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("afXdp.busyPollBudget"), "{}", e[0]);
    }

    #[test]
    fn snat_addresses_must_be_unicast_and_a_bad_one_names_the_field() {
        let c = load(&format!("{HEAD}snatAddresses: {{ipv4: 10.0.0.9, ipv6: \"fd00::9\"}}\n")).unwrap().config;
        assert_eq!(c.snat_addresses.ipv4, Some(Ipv4Addr::new(10, 0, 0, 9)));
        for (yaml, field) in [
            ("ipv4: 0.0.0.0", "snatAddresses.ipv4"),
            ("ipv4: 255.255.255.255", "snatAddresses.ipv4"),
            ("ipv4: 224.0.0.1", "snatAddresses.ipv4"),
            ("ipv6: \"::\"", "snatAddresses.ipv6"),
            ("ipv6: \"ff02::1\"", "snatAddresses.ipv6"),
            ("ipv6: \"::ffff:10.0.0.9\"", "snatAddresses.ipv6"),
        ] {
            let e = errors(&format!("{HEAD}snatAddresses: {{{yaml}}}\n"));
            assert_eq!(e[0].field.as_deref(), Some(field), "{yaml}: {}", e[0]);
        }
    }

    #[test]
    fn unaligned_chunks_default_to_on_and_can_be_turned_off() {
        assert!(load(HEAD).unwrap().config.af_xdp.unaligned_chunks);
        assert!(!load(&format!("{HEAD}afXdp: {{unalignedChunks: false}}\n")).unwrap().config.af_xdp.unaligned_chunks);
        let e = errors(&format!("{HEAD}afXdp: {{unalignedChunks: 3}}\n"));
        assert!(e[0].to_string().contains("unalignedChunks"), "{}", e[0]);
    }

    #[test]
    fn fill_frames_defaults_to_the_whole_ring_and_out_of_range_values_name_the_field() {
        assert_eq!(load(HEAD).unwrap().config.af_xdp.fill_frames, 0);
        assert_eq!(load(&format!("{HEAD}afXdp: {{fillFrames: 1024}}\n")).unwrap().config.af_xdp.fill_frames, 1024);
        for bad in [1, 63, 2049] {
            let e = errors(&format!("{HEAD}afXdp: {{fillFrames: {bad}}}\n"));
            assert_eq!(e[0].field.as_deref(), Some("afXdp.fillFrames"), "{}", e[0]);
        }
    }

    #[test]
    fn ring_size_defaults_to_2048_and_bounds_fill_frames_and_frames() {
        assert_eq!(load(HEAD).unwrap().config.af_xdp.ring_size, 2048);
        let c = load(&format!("{HEAD}afXdp: {{ringSize: 8192, frames: 32768, fillFrames: 4096}}\n")).unwrap().config;
        assert_eq!((c.af_xdp.ring_size, c.af_xdp.frames, c.af_xdp.fill_frames), (8192, 32768, 4096));
        for bad in [0, 32, 3000, 32768] {
            let e = errors(&format!("{HEAD}afXdp: {{ringSize: {bad}, frames: 65536}}\n"));
            assert_eq!(e[0].field.as_deref(), Some("afXdp.ringSize"), "{bad}: {}", e[0]);
        }
        // The default 8192 frames are too few for rings of 8192.
        let e = errors(&format!("{HEAD}afXdp: {{ringSize: 8192}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("afXdp.frames"), "{}", e[0]);
        // A fill ring deeper than the ring is refused; with a larger ring it is not.
        let e = errors(&format!("{HEAD}afXdp: {{ringSize: 1024, fillFrames: 2048}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("afXdp.fillFrames"), "{}", e[0]);
    }

    #[test]
    fn route_tables_default_to_main_and_can_list_others_or_none() {
        assert_eq!(load(HEAD).unwrap().config.route_tables, vec![254]);
        assert_eq!(load(&format!("{HEAD}routeTables: [254, 100]\n")).unwrap().config.route_tables, vec![254, 100]);
        assert!(load(&format!("{HEAD}routeTables: []\n")).unwrap().config.route_tables.is_empty());
        let e = errors(&format!("{HEAD}routeTables: [main]\n"));
        assert_eq!(e[0].field.as_deref(), Some("routeTables[0]"), "{}", e[0]);
    }

    #[test]
    fn punt_device_defaults_to_xlb0_can_be_turned_off_and_bad_names_name_the_field() {
        assert_eq!(load(HEAD).unwrap().config.punt_device, "xlb0");
        assert_eq!(load(&format!("{HEAD}puntDevice: ''\n")).unwrap().config.punt_device, "");
        let e = errors(&format!("{HEAD}puntDevice: a-name-longer-than-15\n"));
        assert_eq!(e[0].field.as_deref(), Some("puntDevice"), "{}", e[0]);
        let e = errors(&format!("{HEAD}puntDevice: a/b\n"));
        assert_eq!(e[0].field.as_deref(), Some("puntDevice"), "{}", e[0]);
    }

    const POOLS: &str = "addressPools:\n\
- name: public\n  addresses: [198.51.100.0/30, \"2001:db8:100::-2001:db8:100::3\"]\n\
- name: shop\n  addresses: [203.0.113.8-203.0.113.9]\n  autoAssign: false\n  avoidBuggyIPs: true\n\x20 \
serviceAllocation: {priority: 1, namespaces: [shop], serviceSelectors: [{matchLabels: {tier: web}, matchExpressions: [{key: env, operator: NotIn, values: [dev]}]}]}\n";

    #[test]
    fn address_pools_parse_with_metallb_field_names() {
        let c = load(&format!("{HEAD}{POOLS}")).unwrap().config;
        assert_eq!(c.address_pools.len(), 2);
        let shop = &c.address_pools[1];
        assert_eq!(shop.name, "shop");
        assert!(!shop.spec.auto_assign && shop.spec.avoid_buggy_ips);
        let sa = shop.spec.service_allocation.as_ref().unwrap();
        assert_eq!((sa.priority, sa.namespaces.as_slice()), (Some(1), ["shop".to_owned()].as_slice()));
        assert_eq!(sa.service_selectors[0].match_expressions[0].operator, crate::ipam::SelectorOperator::NotIn);
        assert!(c.address_pools[0].spec.auto_assign, "autoAssign defaults to true");
        let set = c.pool_set();
        assert_eq!(set.pools().len(), 2);
        assert!(set.by_name("public").unwrap().contains("2001:db8:100::2".parse().unwrap()));
    }

    #[test]
    fn address_assignment_is_off_by_default_and_its_lease_settings_are_checked() {
        let d = load(HEAD).unwrap().config.address_assignment;
        assert!(!d.enabled);
        assert_eq!((d.lease_namespace.as_str(), d.lease_name.as_str()), ("kube-system", "xlb-address-assignment"));
        assert_eq!(d.lease_duration, Duration::from_secs(15));
        let c = load(&format!("{HEAD}addressAssignment: {{enabled: true, leaseName: lb, leaseDuration: 30s}}\n"))
            .unwrap()
            .config;
        assert!(c.address_assignment.enabled);
        assert_eq!(c.address_assignment.lease_name, "lb");
        assert_eq!(c.address_assignment.lease_duration, Duration::from_secs(30));
        let e = errors(&format!("{HEAD}addressAssignment: {{leaseDuration: 1s}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("addressAssignment.leaseDuration"), "{}", e[0]);
        let e = errors(&format!("{HEAD}addressAssignment: {{leaseName: ''}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("addressAssignment.leaseName"), "{}", e[0]);
        let e = errors(&format!("{HEAD}addressAssignment: {{enable: true}}\n"));
        assert!(e[0].message.contains("enable"), "{}", e[0]);
    }

    #[test]
    fn address_pool_errors_name_the_field() {
        let e = errors(&format!("{HEAD}addressPools: [{{name: a, addresses: [10.0.0.1/24]}}]\n"));
        assert_eq!(e[0].field.as_deref(), Some("addressPools[0].addresses[0]"), "{}", e[0]);
        assert!(e[0].message.contains("10.0.0.0/24"), "{}", e[0]);
        let e = errors(&format!(
            "{HEAD}addressPools: [{{name: a, addresses: [10.0.0.0/24]}}, {{name: b, addresses: [10.1.0.0/24, 10.0.0.7-10.0.0.9]}}]\n"
        ));
        assert_eq!(e[0].field.as_deref(), Some("addressPools[1].addresses[1]"), "{}", e[0]);
        assert!(e[0].message.contains("overlaps pool \"a\""), "{}", e[0]);
        let e = errors(&format!(
            "{HEAD}addressPools: [{{name: a, addresses: [10.0.0.0/24]}}, {{name: a, addresses: [10.1.0.0/24]}}]\n"
        ));
        assert_eq!(e[0].field.as_deref(), Some("addressPools[1].name"), "{}", e[0]);
        let e = errors(&format!("{HEAD}addressPools: [{{name: a, adresses: [10.0.0.0/24]}}]\n"));
        assert_eq!(e[0].field.as_deref(), Some("addressPools[0]"), "{}", e[0]);
        assert!(e[0].message.contains("adresses"), "{}", e[0]);
        let e = errors(&format!(
            "{HEAD}addressPools: [{{name: a, addresses: [10.0.0.0/24], serviceAllocation: {{namespace: [x]}}}}]\n"
        ));
        assert!(e[0].message.contains("serviceAllocation") && e[0].message.contains("namespace"), "{}", e[0]);
        let e = errors(&format!("{HEAD}addressPools: [{{addresses: [10.0.0.0/24]}}]\n"));
        assert!(e[0].message.contains("name"), "{}", e[0]);
        let e = errors(&format!("{HEAD}addressPools: [{{name: a, addresses: []}}]\n"));
        assert_eq!(e[0].field.as_deref(), Some("addressPools[0].addresses"), "{}", e[0]);
    }

    #[test]
    fn announce_is_off_by_default_and_the_bgp_block_parses_in_camel_case() {
        let d = load(HEAD).unwrap().config.announce;
        assert_eq!(d.mode, AnnounceMode::None);
        assert!(!d.external_ips);
        assert_eq!(d.bird.ipv4_file, PathBuf::from("/run/xlb/bird-vips4.conf"));
        assert_eq!(d.bird.socket, PathBuf::from("/run/bird/bird.ctl"));
        let c = load(&format!(
            "{HEAD}announce:\n  mode: bgp\n  externalIPs: true\n  bird:\n    ipv4File: /run/x/v4.conf\n    \
             ipv6File: /run/x/v6.conf\n    socket: /run/b.ctl\n    birdc: /usr/sbin/birdc\n    timeout: 3s\n"
        ))
        .unwrap()
        .config
        .announce;
        assert_eq!(c.mode, AnnounceMode::Bgp);
        assert!(c.external_ips);
        assert_eq!(
            c.bird,
            BirdConfig {
                ipv4_file: "/run/x/v4.conf".into(),
                ipv6_file: "/run/x/v6.conf".into(),
                socket: "/run/b.ctl".into(),
                birdc: "/usr/sbin/birdc".into(),
                timeout: Duration::from_secs(3),
            }
        );
    }

    #[test]
    fn bad_announce_settings_are_errors_naming_the_field() {
        let e = errors(&format!("{HEAD}announce: {{mode: ospf}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("announce.mode"), "{}", e[0]);
        let e = errors(&format!("{HEAD}announce: {{mode: bgp, bird: {{file: /run/x.conf}}}}\n"));
        assert!(e[0].to_string().contains("file"), "unknown field: {}", e[0]);
        let e = errors(&format!("{HEAD}announce: {{mode: bgp, bird: {{ipv4File: vips.conf}}}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("announce.bird.ipv4File"), "{}", e[0]);
        let e = errors(&format!("{HEAD}announce: {{mode: bgp, bird: {{ipv6File: /run/xlb/bird-vips4.conf}}}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("announce.bird.ipv6File"), "{}", e[0]);
        let e = errors(&format!("{HEAD}announce: {{mode: bgp, bird: {{timeout: 0s}}}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("announce.bird.timeout"), "{}", e[0]);
        // The bird block is only checked when it is used.
        assert!(load(&format!("{HEAD}announce: {{mode: none, bird: {{timeout: 0s}}}}\n")).is_ok());
    }

    #[test]
    fn l2_mode_parses_and_its_interfaces_must_be_xlbs() {
        let c = load(&format!("{HEAD}announce: {{mode: l2}}\n")).unwrap().config.announce;
        assert_eq!(c.mode, AnnounceMode::L2);
        assert!(c.l2.interfaces.is_empty(), "default: every interface answers");
        let head = format!("{HEAD}interfaces: [{{name: eth0}}, {{name: eth1}}]\n");
        let c = load(&format!("{head}announce: {{mode: l2, l2: {{interfaces: [eth1]}}}}\n")).unwrap().config;
        assert_eq!(c.announce.l2.interfaces, vec!["eth1".to_owned()]);
        let e = errors(&format!("{head}announce: {{mode: l2, l2: {{interfaces: [eth0, nosuch9]}}}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("announce.l2.interfaces[1]"), "{}", e[0]);
        assert!(e[0].to_string().contains("nosuch9"), "{}", e[0]);
        let e = errors(&format!("{HEAD}announce: {{mode: l2, l2: {{iface: [x]}}}}\n"));
        assert!(e[0].to_string().contains("iface"), "unknown field: {}", e[0]);
    }

    #[test]
    fn l2_membership_lease_settings_have_defaults_and_are_checked() {
        let d = load(&format!("{HEAD}announce: {{mode: l2}}\n")).unwrap().config.announce.l2;
        assert_eq!(d.lease_namespace, "kube-system");
        assert_eq!((d.lease_duration, d.renew_interval), (Duration::from_secs(10), Duration::from_secs(2)));
        let c = load(&format!(
            "{HEAD}announce: {{mode: l2, l2: {{leaseNamespace: xlb, leaseDuration: 2s, renewInterval: 500ms}}}}\n"
        ))
        .unwrap()
        .config
        .announce
        .l2;
        assert_eq!(c.lease_namespace, "xlb");
        assert_eq!((c.lease_duration, c.renew_interval), (Duration::from_secs(2), Duration::from_millis(500)));
        for (l2, field) in [
            ("leaseDuration: 1500ms", "announce.l2.leaseDuration"),
            ("leaseDuration: 0s", "announce.l2.leaseDuration"),
            ("leaseDuration: 3s, renewInterval: 1001ms", "announce.l2.renewInterval"),
            ("renewInterval: 0s", "announce.l2.renewInterval"),
            ("leaseNamespace: ' '", "announce.l2.leaseNamespace"),
        ] {
            let e = errors(&format!("{HEAD}announce: {{mode: l2, l2: {{{l2}}}}}\n"));
            assert_eq!(e[0].field.as_deref(), Some(field), "{l2}: {}", e[0]);
        }
        // Checked only when the L2 mode is used.
        assert!(load(&format!("{HEAD}announce: {{mode: none, l2: {{leaseDuration: 0s}}}}\n")).is_ok());
    }
}
