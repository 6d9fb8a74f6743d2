//! The one error type of this crate.

use std::io;

/// Everything that can go wrong while setting up an interface for xlb.
///
/// Each variant names what it was working on: the interface, the BPF map, the field, or the
/// external tool, so a log line is enough to find the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NicError {
    /// The embedded steering object could not be parsed or loaded into the kernel
    /// (`bpf(BPF_PROG_LOAD)` / `bpf(BPF_MAP_CREATE)`; needs root or CAP_BPF + CAP_NET_ADMIN).
    #[error("loading the XDP steering object: {detail}")]
    Load {
        /// The whole error chain as text, down to the errno.
        detail: String,
        /// aya's error.
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// The steering object lacks a program or map it must have (a build problem).
    #[error("the XDP steering object has no {kind} named `{name}`")]
    MissingObject {
        /// `"program"` or `"map"`.
        kind: &'static str,
        /// The name looked for.
        name: &'static str,
    },
    /// Verifying or attaching the program failed.
    #[error("XDP program on interface `{ifname}` ({mode}): {detail}")]
    Program {
        /// The whole error chain as text, down to the errno.
        detail: String,
        /// Interface the program was meant for.
        ifname: String,
        /// Attach mode tried.
        mode: crate::XdpMode,
        /// aya's error.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Attaching the program to (or detaching it from) the interface through netlink failed
    /// (`RTM_SETLINK` with `IFLA_XDP`; `EBUSY`/`EEXIST`: another program is attached).
    #[error("XDP program on interface `{ifname}` ({mode}): {op}: {source}")]
    Attach {
        /// Interface the program was meant for.
        ifname: String,
        /// Attach mode tried.
        mode: crate::XdpMode,
        /// `attach`, `replace` or `detach`.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// A BPF map operation failed.
    #[error("BPF map `{map}` on interface `{ifname}`: {op}: {detail}")]
    Map {
        /// The whole error chain as text, down to the errno.
        detail: String,
        /// Interface of the [`crate::Steering`] the map belongs to.
        ifname: String,
        /// Map name as in `xdp/steer.c` (`xsks`, `services`, `vip_addrs`, `snat_addrs`, `stats`).
        map: &'static str,
        /// What was being done, e.g. `insert` or `delete`.
        op: &'static str,
        /// aya's error.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// No interface with this name (or index) exists in the calling thread's network namespace.
    #[error("no interface `{ifname}` in this network namespace")]
    UnknownInterface {
        /// Name (or `#index`) looked up.
        ifname: String,
    },
    /// The packet socket that sends gratuitous ARP and unsolicited Neighbor Advertisements
    /// (`AF_PACKET`, packet(7)) could not be opened or sent on.
    #[error("packet socket on interface `{ifname}`: {op}: {source}")]
    Packet {
        /// The interface.
        ifname: String,
        /// `socket`, `getifaddrs` or `sendto`.
        op: &'static str,
        /// The system error.
        #[source]
        source: io::Error,
    },
    /// An argument is out of range.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The field or parameter, e.g. `ServiceKey.proto`.
        field: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A netlink socket call failed, or the kernel answered a request with an error
    /// (the `io::Error` then carries the kernel's errno).
    #[error("netlink {op}: {source}")]
    Netlink {
        /// The request, e.g. `RTM_GETNEIGH dump`.
        op: &'static str,
        /// The socket error or the kernel's errno.
        #[source]
        source: io::Error,
    },
    /// A netlink message could not be decoded.
    #[error("netlink {op}: cannot decode the kernel's answer: {detail}")]
    NetlinkDecode {
        /// The request.
        op: &'static str,
        /// Decoder message.
        detail: String,
    },
    /// The punt (exception path) TUN device could not be created or set up
    /// (`/dev/net/tun`, `TUNSETIFF`, link up, or its sysctls; needs CAP_NET_ADMIN).
    #[error("punt device `{name}`: {op}: {source}")]
    Punt {
        /// Device name asked for.
        name: String,
        /// The step, e.g. `create` or `rp_filter`.
        op: &'static str,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// An external tool (`ethtool`) could not be run or reported a failure.
    #[error("`{command}` on interface `{ifname}` failed: {detail}")]
    Tool {
        /// Interface it was run for.
        ifname: String,
        /// The command line.
        command: String,
        /// Exit status and stderr, or why it could not start (with the install hint).
        detail: String,
    },
}

/// `outer: inner: ... : errno text`, skipping links whose text repeats the previous one.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let text = err.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = err.source();
    }
    out
}

impl NicError {
    pub(crate) fn map(ifname: &str, map: &'static str, op: &'static str, source: aya::maps::MapError) -> Self {
        Self::Map { detail: chain(&source), ifname: ifname.to_owned(), map, op, source: Box::new(source) }
    }

    pub(crate) fn load(source: aya::EbpfError) -> Self {
        Self::Load { detail: chain(&source), source: Box::new(source) }
    }

    pub(crate) fn program(ifname: &str, mode: crate::XdpMode, source: aya::programs::ProgramError) -> Self {
        Self::Program { detail: chain(&source), ifname: ifname.to_owned(), mode, source: Box::new(source) }
    }

    pub(crate) fn netlink(op: &'static str, source: io::Error) -> Self {
        Self::Netlink { op, source }
    }

    /// The kernel's errno, when the error came from a netlink request or socket call.
    #[must_use]
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::Netlink { source, .. } | Self::Attach { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
