//! Interface facts over rtnetlink, and the two `ethtool` settings xlb needs.
//!
//! Facts (`interface_info`) come from `RTM_GETLINK` and `RTM_GETADDR` (rtnetlink(7)).
//!
//! Settings (`set_channels`, `set_tx_checksum_offload`) run the `ethtool` program
//! (ethtool(8), Debian package `ethtool`, installed by `scripts/install-deps.sh`). Why not a
//! library: the `ethtool` crate (0.3.0) speaks the ethtool generic-netlink family only through
//! an async (tokio) connection, and its feature setter is unimplemented (`todo!()` in
//! `feature_bits_emit`), so `tx` checksum offload cannot be changed with it; hand-building
//! `ETHTOOL_MSG_FEATURES_SET` bitsets was not worth the risk for two settings changed once at
//! start-up. The `ethtool` binary is what operators use, expands `tx` to every
//! `tx-checksum-*` feature, and reports its errors in words, which we pass on.
//!
//! Everything acts in the network namespace of the calling thread; `ethtool` is spawned from
//! that thread and inherits it.

use std::{io, net::IpAddr, process::Command};

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
};

use crate::{NicError, nl::RouteSocket};

/// An address configured on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InterfaceAddress {
    /// The address (`IFA_LOCAL` for IPv4, `IFA_ADDRESS` for IPv6).
    pub addr: IpAddr,
    /// Prefix length in bits (`ifa_prefixlen`).
    pub prefix_len: u8,
}

/// What xlb needs to know about an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceInfo {
    /// Interface name (`IFLA_IFNAME`).
    pub name: String,
    /// Interface index (`ifi_index`), valid in the namespace it was read in.
    pub ifindex: u32,
    /// Hardware address (`IFLA_ADDRESS`), `None` if it is not 6 bytes (e.g. an ipip tunnel).
    pub mac: Option<[u8; 6]>,
    /// MTU in bytes (`IFLA_MTU`): the largest L3 packet, without the Ethernet header.
    pub mtu: u32,
    /// IPv4 and IPv6 addresses (`RTM_GETADDR`), in the kernel's order.
    pub addresses: Vec<InterfaceAddress>,
    /// Receive queues the device was created with (`IFLA_NUM_RX_QUEUES`, the kernel's
    /// `num_rx_queues`): the upper bound for AF_XDP queue ids. The active count can be lower;
    /// see [`channels`].
    pub rx_queues: u32,
    /// Transmit queues the device was created with (`IFLA_NUM_TX_QUEUES`).
    pub tx_queues: u32,
    /// Id of the XDP program attached to the interface, if any (`IFLA_XDP_PROG_ID`).
    pub xdp_prog_id: Option<u32>,
}

fn get_link(ifname: &str) -> Result<LinkMessage, NicError> {
    const OP: &str = "RTM_GETLINK";
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(ifname.to_owned()));
    let mut sock = RouteSocket::new(OP)?;
    let answers = match sock.request(OP, RouteNetlinkMessage::GetLink(msg), 0) {
        Ok(a) => a,
        Err(e) if e.raw_os_error() == Some(nix::libc::ENODEV) => {
            return Err(NicError::UnknownInterface { ifname: ifname.to_owned() });
        }
        Err(e) => return Err(e),
    };
    answers
        .into_iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(l),
            _ => None,
        })
        .ok_or_else(|| NicError::UnknownInterface { ifname: ifname.to_owned() })
}

/// `IFLA_XDP_FLAGS` bits (include/uapi/linux/if_link.h): fail if a program is attached.
pub(crate) const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
/// Generic (SKB) mode.
pub(crate) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// Native (driver) mode.
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// Act only if the program attached is the one `IFLA_XDP_EXPECTED_FD` names.
pub(crate) const XDP_FLAGS_REPLACE: u32 = 1 << 4;

/// An XDP program attached to an interface through netlink or a link (`IFLA_XDP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttachedXdp {
    /// Kernel id of the program.
    pub(crate) prog_id: u32,
    /// Whether it runs in generic (SKB) mode rather than in the driver.
    pub(crate) skb_mode: bool,
}

/// The XDP program attached to `ifindex`, if any.
pub(crate) fn attached_xdp(ifname: &str) -> Result<Option<AttachedXdp>, NicError> {
    let link = get_link(ifname)?;
    let mut prog_id = None;
    let mut skb_mode = false;
    for a in &link.attributes {
        if let LinkAttribute::Xdp(x) = a {
            for x in x {
                match x {
                    LinkXdp::ProgId(id) if *id != 0 => prog_id = Some(*id),
                    LinkXdp::Attached(XdpAttached::SocketBuffer) => skb_mode = true,
                    _ => {}
                }
            }
        }
    }
    Ok(prog_id.map(|prog_id| AttachedXdp { prog_id, skb_mode }))
}

/// Attaches the program `fd` to interface `ifindex` with `flags` through netlink
/// (`RTM_SETLINK` with `IFLA_XDP`, rtnetlink(7)); `fd` -1 detaches. With `expected` the
/// kernel acts only if that program (an fd of it) is the one attached (`XDP_FLAGS_REPLACE`),
/// else fails with `EEXIST`. A program attached this way stays attached when the process
/// that attached it exits, until it is replaced or detached.
///
/// `sock` must be in the interface's network namespace: a netlink socket stays in the one it
/// was created in, whichever thread uses it later.
pub(crate) fn set_xdp(
    sock: &mut RouteSocket,
    ifindex: u32,
    fd: i32,
    flags: u32,
    expected: Option<i32>,
) -> io::Result<()> {
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    let mut xdp = vec![LinkXdp::Fd(fd), LinkXdp::Flags(flags | expected.map_or(0, |_| XDP_FLAGS_REPLACE))];
    if let Some(e) = expected {
        xdp.push(LinkXdp::ExpectedFd(e.cast_unsigned()));
    }
    msg.attributes.push(LinkAttribute::Xdp(xdp));
    match sock.request("RTM_SETLINK IFLA_XDP", RouteNetlinkMessage::SetLink(msg), 0) {
        Ok(_) => Ok(()),
        Err(e) => Err(e.raw_os_error().map_or_else(|| io::Error::other(e.to_string()), io::Error::from_raw_os_error)),
    }
}

/// Index of interface `ifname` in the calling thread's network namespace.
///
/// # Errors
/// [`NicError::UnknownInterface`] if there is none; [`NicError::Netlink`].
pub fn ifindex(ifname: &str) -> Result<u32, NicError> {
    Ok(get_link(ifname)?.header.index)
}

/// Reads name, index, MAC, MTU, addresses, queue counts and attached XDP program of `ifname`.
///
/// # Errors
/// [`NicError::UnknownInterface`] if there is no such interface; [`NicError::Netlink`].
pub fn interface_info(ifname: &str) -> Result<InterfaceInfo, NicError> {
    let link = get_link(ifname)?;
    let mut info = InterfaceInfo {
        name: ifname.to_owned(),
        ifindex: link.header.index,
        mac: None,
        mtu: 0,
        addresses: Vec::new(),
        rx_queues: 1,
        tx_queues: 1,
        xdp_prog_id: None,
    };
    for a in &link.attributes {
        match a {
            LinkAttribute::IfName(n) => info.name.clone_from(n),
            LinkAttribute::Address(m) => info.mac = <[u8; 6]>::try_from(m.as_slice()).ok(),
            LinkAttribute::Mtu(m) => info.mtu = *m,
            LinkAttribute::NumRxQueues(n) => info.rx_queues = *n,
            LinkAttribute::NumTxQueues(n) => info.tx_queues = *n,
            LinkAttribute::Xdp(x) => {
                info.xdp_prog_id = x.iter().find_map(|x| match x {
                    LinkXdp::ProgId(id) if *id != 0 => Some(*id),
                    _ => None,
                });
            }
            _ => {}
        }
    }

    const OP: &str = "RTM_GETADDR dump";
    let mut sock = RouteSocket::new(OP)?;
    for m in sock.request(OP, RouteNetlinkMessage::GetAddress(AddressMessage::default()), NLM_F_DUMP)? {
        let RouteNetlinkMessage::NewAddress(a) = m else {
            continue;
        };
        if a.header.index != info.ifindex {
            continue;
        }
        if let Some(addr) = own_address(&a) {
            info.addresses.push(InterfaceAddress { addr, prefix_len: a.header.prefix_len });
        }
    }
    Ok(info)
}

/// Every address of every interface in the calling thread's network namespace
/// (`RTM_GETADDR` dump): IPv4 `IFA_LOCAL` (else `IFA_ADDRESS`), IPv6 `IFA_ADDRESS`, in the
/// kernel's order, loopback included (the caller filters). xlb serves NodePorts on them when
/// `nodePortAddresses` lets it (kube-proxy's `--dst-type LOCAL`, NPA-02, NPA-04).
///
/// # Errors
/// [`NicError::Netlink`].
pub fn local_addresses() -> Result<Vec<InterfaceAddress>, NicError> {
    const OP: &str = "RTM_GETADDR dump";
    let mut sock = RouteSocket::new(OP)?;
    let mut out = Vec::new();
    for m in sock.request(OP, RouteNetlinkMessage::GetAddress(AddressMessage::default()), NLM_F_DUMP)? {
        let RouteNetlinkMessage::NewAddress(a) = m else {
            continue;
        };
        if let Some(addr) = own_address(&a) {
            out.push(InterfaceAddress { addr, prefix_len: a.header.prefix_len });
        }
    }
    Ok(out)
}

/// The interface's own address in an `RTM_NEWADDR` message. IPv4: `IFA_LOCAL` (`IFA_ADDRESS` is
/// the peer on point-to-point links); IPv6 sends only `IFA_ADDRESS`.
fn own_address(a: &AddressMessage) -> Option<IpAddr> {
    let local = a.attributes.iter().find_map(|x| match x {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let address = a.attributes.iter().find_map(|x| match x {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    local.or(address)
}

/// Channel (queue) counts as `ethtool -l` shows them; `None` where ethtool prints `n/a`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Channels {
    /// Pre-set maximum of RX-only channels.
    pub max_rx: Option<u32>,
    /// Pre-set maximum of TX-only channels.
    pub max_tx: Option<u32>,
    /// Pre-set maximum of combined (RX+TX) channels.
    pub max_combined: Option<u32>,
    /// Current RX-only channels.
    pub rx: Option<u32>,
    /// Current TX-only channels.
    pub tx: Option<u32>,
    /// Current combined channels.
    pub combined: Option<u32>,
}

impl Channels {
    /// Receive queues in use: combined plus RX-only channels.
    #[must_use]
    pub fn rx_queues(&self) -> u32 {
        self.combined.unwrap_or(0) + self.rx.unwrap_or(0)
    }
}

fn run_ethtool(ifname: &str, args: &[&str]) -> Result<String, NicError> {
    let command = format!("ethtool {}", args.join(" "));
    let out = Command::new("ethtool").args(args).output().map_err(|e| NicError::Tool {
        ifname: ifname.to_owned(),
        command: command.clone(),
        detail: if e.kind() == io::ErrorKind::NotFound {
            "`ethtool` is not installed: run `sudo scripts/install-deps.sh` (Debian package \
             ethtool)"
                .to_owned()
        } else {
            format!("cannot start it: {e}")
        },
    })?;
    if !out.status.success() {
        return Err(NicError::Tool {
            ifname: ifname.to_owned(),
            command,
            detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn parse_channels(text: &str) -> Channels {
    let mut c = Channels::default();
    let mut current = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Pre-set maximums") {
            current = false;
        } else if line.starts_with("Current hardware settings") {
            current = true;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().parse::<u32>().ok();
        let slot = match (key.trim(), current) {
            ("RX", false) => &mut c.max_rx,
            ("TX", false) => &mut c.max_tx,
            ("Combined", false) => &mut c.max_combined,
            ("RX", true) => &mut c.rx,
            ("TX", true) => &mut c.tx,
            ("Combined", true) => &mut c.combined,
            _ => continue,
        };
        *slot = value;
    }
    c
}

/// Reads the channel counts of `ifname` (`ethtool -l`, the `ETHTOOL_MSG_CHANNELS_GET` request,
/// <https://docs.kernel.org/networking/ethtool-netlink.html#channels-get>).
///
/// # Errors
/// [`NicError::Tool`] if `ethtool` is missing or fails (e.g. the driver has no channels).
pub fn channels(ifname: &str) -> Result<Channels, NicError> {
    Ok(parse_channels(&run_ethtool(ifname, &["-l", ifname])?))
}

/// Sets the number of queues of `ifname` to `n` (`ethtool -L`): combined channels when the
/// driver has them (most multi-queue NICs), otherwise `n` RX and `n` TX channels (veth). xlb
/// then runs one AF_XDP socket per queue `0..n`.
///
/// # Errors
/// [`NicError::InvalidArgument`] if `n` is 0 or above the driver's maximum; [`NicError::Tool`]
/// if `ethtool` is missing or the driver refuses.
pub fn set_channels(ifname: &str, n: u32) -> Result<(), NicError> {
    let c = channels(ifname)?;
    let n_str = n.to_string();
    let combined = c.max_combined.is_some_and(|m| m > 0);
    let (max, unchanged, args) = if combined {
        (c.max_combined, c.combined == Some(n), vec!["-L", ifname, "combined", &n_str])
    } else {
        (c.max_rx.min(c.max_tx), c.rx == Some(n) && c.tx == Some(n), vec!["-L", ifname, "rx", &n_str, "tx", &n_str])
    };
    if n == 0 || max.is_some_and(|m| n > m) {
        return Err(NicError::InvalidArgument {
            field: "channel count",
            reason: format!("{n} for `{ifname}`: allowed 1..={}", max.unwrap_or(0)),
        });
    }
    if unchanged {
        return Ok(()); // `ethtool -L` exits 1 with "no channel parameters changed"
    }
    run_ethtool(ifname, &args).map(drop)
}

/// Turns TX checksum offload of `ifname` on or off (`ethtool -K IF tx on|off`, which covers
/// every `tx-checksum-*` feature; turning it off also turns off TSO, which needs it).
///
/// Why xlb needs it off on veth endpoints: a veth sends packets with `CHECKSUM_PARTIAL`, so
/// the L4 checksum in the frame AF_XDP sees is incomplete, and AF_XDP TX produces
/// `CHECKSUM_NONE` skbs that the receiver drops (`TcpInCsumErrors`) — trap 1 in
/// `shared/docs/feasibility.md`. On real NICs the wire always carries finished checksums.
///
/// # Errors
/// [`NicError::Tool`] if `ethtool` is missing or the driver refuses (`Could not change any
/// device features`).
pub fn set_tx_checksum_offload(ifname: &str, on: bool) -> Result<(), NicError> {
    run_ethtool(ifname, &["-K", ifname, "tx", if on { "on" } else { "off" }]).map(drop)
}

/// Whether TX checksum offload of `ifname` is on (`tx-checksumming` in `ethtool -k`).
///
/// # Errors
/// [`NicError::Tool`] if `ethtool` is missing, fails, or prints no `tx-checksumming` line.
pub fn tx_checksum_offload(ifname: &str) -> Result<bool, NicError> {
    let out = run_ethtool(ifname, &["-k", ifname])?;
    out.lines().find_map(|l| l.trim().strip_prefix("tx-checksumming:")).map(|v| v.trim().starts_with("on")).ok_or_else(
        || NicError::Tool {
            ifname: ifname.to_owned(),
            command: format!("ethtool -k {ifname}"),
            detail: "no `tx-checksumming` line in the output".to_owned(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ethtool_channel_output() {
        let text = "Channel parameters for a:\nPre-set maximums:\nRX:\t\t4\nTX:\t\t4\nOther:\t\tn/a\n\
                    Combined:\tn/a\nCurrent hardware settings:\nRX:\t\t2\nTX:\t\t3\nOther:\t\tn/a\n\
                    Combined:\tn/a\n";
        let c = parse_channels(text);
        assert_eq!(c.max_rx, Some(4));
        assert_eq!(c.max_combined, None);
        assert_eq!(c.rx, Some(2));
        assert_eq!(c.tx, Some(3));
        assert_eq!(c.rx_queues(), 2);
    }
}
