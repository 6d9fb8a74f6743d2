//! The exception ("punt") path: a TUN device xlb owns, through which frames that reached a
//! worker but are not xlb's go back into the kernel's stack, as DPDK's exception path and
//! VPP's punt do.
//!
//! The steering program (`xdp/steer.c`) catches as little as it can, but some frames it must
//! catch are not xlb's: a backend's reply is recognised by its source address and port, which
//! direct traffic to that pod (a StatefulSet peer, a monitoring scrape, a client using the pod
//! IP) shares. AF_XDP cannot hand a frame back to `XDP_PASS`, so a worker writes such a frame's
//! IP packet into its queue of this device: the kernel receives it on the TUN and routes it
//! (forwards it, or delivers it locally) as if it had arrived on the NIC.
//!
//! One multi-queue TUN (`IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE`, kernel doc
//! networking/tuntap.rst), one queue per worker so no worker shares a file descriptor. The
//! device is not persistent: it disappears when the last queue is closed, also when xlb is
//! killed, so nothing is left behind. Its reverse-path filter is turned off
//! (`net/ipv4/conf/DEV/rp_filter = 0`): punted packets carry sources that are routed through
//! the NIC, not the TUN. The kernel uses the larger of `conf/all/rp_filter` and the device's
//! value, so with `conf/all/rp_filter = 1` (strict) punted forwarded packets are dropped by
//! the kernel; [`Punt::strict_rp_filter`] tells.

use std::io;

use tun_rs::{DeviceBuilder, SyncDevice};

use crate::NicError;

/// The TUN's MTU (bytes): the largest packet the kernel routes into the device (a larger
/// reply of a pod on this node gets ICMP "fragmentation needed" and the pod lowers its path
/// MTU), so that it fits, with the Ethernet header the worker adds, into a 2 KiB UMEM frame
/// after its headroom. Packets written into the device are not limited by it.
pub const PUNT_MTU: u16 = 1500;

/// The punt TUN device and its queues.
#[derive(Debug)]
pub struct Punt {
    name: String,
    ifindex: u32,
    queues: Vec<PuntQueue>,
    warnings: Vec<String>,
}

/// One queue of the punt device: IP packets (no Ethernet header, no packet-information
/// prefix) in and out; non-blocking.
pub struct PuntQueue(SyncDevice);

impl std::fmt::Debug for PuntQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::os::fd::AsRawFd;
        f.debug_tuple("PuntQueue").field(&self.0.as_raw_fd()).finish()
    }
}

impl PuntQueue {
    /// Hands one IPv4 or IPv6 packet (`l3`: from the IP header to the end) to the kernel,
    /// which takes it as received on the punt device.
    ///
    /// # Errors
    /// The kernel's errno, e.g. `EINVAL` for a packet that is not IP, `WouldBlock` when the
    /// queue is full.
    pub fn send(&self, l3: &[u8]) -> io::Result<usize> {
        self.0.send(l3)
    }

    /// Reads one IP packet the kernel routed into the punt device into `buf`; returns its
    /// length in bytes.
    ///
    /// # Errors
    /// `WouldBlock` when there is none.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.recv(buf)
    }
}

impl Punt {
    /// Creates the TUN device `name` (at most 15 bytes) with `queues` queues (at least 1),
    /// turns its reverse-path filter and IPv6 address generation off and brings it up with MTU
    /// [`PUNT_MTU`], in the network namespace of the calling thread.
    ///
    /// # Errors
    /// [`NicError::Punt`] naming the step: `create` (no `/dev/net/tun`, no CAP_NET_ADMIN, a
    /// device of that name that is not a multi-queue TUN), `queue`, `nonblocking`, `ifindex`
    /// or `link up`. Sysctls that cannot be written are [`Punt::warnings`], not errors.
    pub fn create(name: &str, queues: usize) -> Result<Self, NicError> {
        let err = |op: &'static str| move |source: io::Error| NicError::Punt { name: name.to_owned(), op, source };
        let first = DeviceBuilder::new()
            .name(name)
            .mtu(PUNT_MTU)
            .packet_information(false)
            .multi_queue(true)
            .enable(false)
            .build_sync()
            .map_err(err("create"))?;
        let ifindex = first.if_index().map_err(err("ifindex"))?;
        let mut qs = vec![first];
        while qs.len() < queues.max(1) {
            let q = qs.first().map(SyncDevice::try_clone).ok_or_else(|| err("queue")(io::ErrorKind::Other.into()))?;
            qs.push(q.map_err(err("queue"))?);
        }
        for q in &qs {
            q.set_nonblocking(true).map_err(err("nonblocking"))?;
        }
        // The sysctls are best effort: a container often has /proc/sys read-only. The device's
        // values then come from `conf/default` (systemd's default rp_filter is 2, loose).
        let mut warnings = Vec::new();
        let mut sysctl = |path: String, value: &str| {
            if let Err(e) = std::fs::write(&path, value) {
                warnings.push(format!("cannot set {path} to {value}: {e}"));
            }
        };
        sysctl(format!("/proc/sys/net/ipv4/conf/{name}/rp_filter"), "0");
        // No IPv6 link-local address, hence no router solicitations or MLD reports sent into
        // the device: what the workers read from it is what the reply rules route there.
        // (IPv6 packets are still received and forwarded without an address.)
        if std::path::Path::new(&format!("/proc/sys/net/ipv6/conf/{name}")).exists() {
            sysctl(format!("/proc/sys/net/ipv6/conf/{name}/addr_gen_mode"), "1");
            sysctl(format!("/proc/sys/net/ipv6/conf/{name}/accept_ra"), "0");
        }
        qs.first().map(|q| q.enabled(true)).transpose().map_err(err("link up"))?;
        Ok(Self { name: name.to_owned(), ifindex, queues: qs.into_iter().map(PuntQueue).collect(), warnings })
    }

    /// The sysctls [`Punt::create`] could not set (each a sentence naming the file); the
    /// device works without them, see the module documentation.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Takes the queues out, one per worker, in order (the device lives as long as one is open).
    pub fn take_queues(&mut self) -> Vec<PuntQueue> {
        std::mem::take(&mut self.queues)
    }

    /// `true` when `net.ipv4.conf.all.rp_filter` is 1 (strict): the kernel then drops punted
    /// packets whose source is not routed through the punt device.
    pub fn strict_rp_filter() -> bool {
        std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter").is_ok_and(|s| s.trim() == "1")
    }
}
