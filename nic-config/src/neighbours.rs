//! The kernel's neighbour table (ARP for IPv4, NDP for IPv6) over rtnetlink.
//!
//! Messages: `RTM_GETNEIGH`, `RTM_NEWNEIGH`, `RTM_DELNEIGH` with `struct ndmsg` and `NDA_*`
//! attributes, see rtnetlink(7) and `include/uapi/linux/neighbour.h`. xlb mirrors the table to
//! learn next-hop MAC addresses: [`dump`] once, then [`NeighbourWatcher`] for changes, and
//! [`resolve`] for a next hop the kernel does not know yet.
//!
//! Everything works in the network namespace of the calling thread (of the thread that created
//! the watcher).

use std::{
    fmt,
    net::IpAddr,
    os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd},
    time::Duration,
};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState as NlState},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::{NicError, nl::RouteSocket};

/// `RTNLGRP_NEIGH` from `enum rtnetlink_groups` in `include/uapi/linux/rtnetlink.h`: one group
/// carries neighbour changes of every family (IPv4 ARP, IPv6 NDP, bridge FDB).
const RTNLGRP_NEIGH: u32 = 3;

/// The NUD state of a neighbour entry: the `ndm_state` bits (`NUD_*`) of
/// `include/uapi/linux/neighbour.h`. See also ip-neighbour(8), `nud STATE`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NeighbourState(pub u16);

impl NeighbourState {
    /// `NUD_NONE`: no state.
    pub const NONE: Self = Self(0x00);
    /// `NUD_INCOMPLETE`: resolution in progress, no MAC yet.
    pub const INCOMPLETE: Self = Self(0x01);
    /// `NUD_REACHABLE`: confirmed recently.
    pub const REACHABLE: Self = Self(0x02);
    /// `NUD_STALE`: MAC known but not confirmed recently; still usable.
    pub const STALE: Self = Self(0x04);
    /// `NUD_DELAY`: stale and used; confirmation pending.
    pub const DELAY: Self = Self(0x08);
    /// `NUD_PROBE`: being re-confirmed with unicast probes.
    pub const PROBE: Self = Self(0x10);
    /// `NUD_FAILED`: resolution failed.
    pub const FAILED: Self = Self(0x20);
    /// `NUD_NOARP`: no resolution needed (e.g. point-to-point).
    pub const NOARP: Self = Self(0x40);
    /// `NUD_PERMANENT`: static entry (`ip neigh ... nud permanent`).
    pub const PERMANENT: Self = Self(0x80);

    /// `NUD_VALID` from `include/net/neighbour.h`: the MAC can be used to send
    /// (PERMANENT, NOARP, REACHABLE, PROBE, STALE, DELAY).
    #[must_use]
    pub fn is_valid(self) -> bool {
        self.0 & 0xde != 0
    }
}

impl fmt::Debug for NeighbourState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(u16, &str); 8] = [
            (0x01, "INCOMPLETE"),
            (0x02, "REACHABLE"),
            (0x04, "STALE"),
            (0x08, "DELAY"),
            (0x10, "PROBE"),
            (0x20, "FAILED"),
            (0x40, "NOARP"),
            (0x80, "PERMANENT"),
        ];
        if self.0 == 0 {
            return f.write_str("NONE");
        }
        let mut first = true;
        for (bit, name) in NAMES {
            if self.0 & bit != 0 {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        let rest = self.0 & !0xff;
        if rest != 0 {
            write!(f, "{}{rest:#x}", if first { "" } else { "|" })?;
        }
        Ok(())
    }
}

impl fmt::Display for NeighbourState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One IPv4 (ARP) or IPv6 (NDP) neighbour entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Neighbour {
    /// Protocol address of the neighbour (`NDA_DST`).
    pub ip: IpAddr,
    /// Link-layer address (`NDA_LLADDR`); `None` while unresolved (INCOMPLETE, FAILED) or when
    /// it is not a 6-byte Ethernet address.
    pub mac: Option<[u8; 6]>,
    /// Interface index (`ndm_ifindex`).
    pub ifindex: u32,
    /// NUD state (`ndm_state`).
    pub state: NeighbourState,
}

impl Neighbour {
    /// The MAC address if the entry may be used to send now ([`NeighbourState::is_valid`]).
    #[must_use]
    pub fn usable_mac(&self) -> Option<[u8; 6]> {
        if self.state.is_valid() { self.mac } else { None }
    }

    /// Converts a kernel message; `None` for families other than IPv4/IPv6 (bridge FDB) and
    /// for proxy entries.
    fn from_message(m: &NeighbourMessage) -> Option<Self> {
        if !matches!(m.header.family, AddressFamily::Inet | AddressFamily::Inet6)
            || m.header.flags.contains(NeighbourFlags::Proxy)
        {
            return None;
        }
        let mut ip = None;
        let mut mac = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => ip = Some(IpAddr::V4(*v4)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                    ip = Some(IpAddr::V6(*v6));
                }
                NeighbourAttribute::LinkLayerAddress(ll) => mac = <[u8; 6]>::try_from(ll.as_slice()).ok(),
                _ => {}
            }
        }
        Some(Self { ip: ip?, mac, ifindex: m.header.ifindex, state: NeighbourState(u16::from(m.header.state)) })
    }
}

/// Lists the IPv4 and IPv6 neighbour entries (`RTM_GETNEIGH` dump), of interface `ifindex`
/// only when given.
///
/// # Errors
/// [`NicError::Netlink`] / [`NicError::NetlinkDecode`].
pub fn dump(ifindex: Option<u32>) -> Result<Vec<Neighbour>, NicError> {
    const OP: &str = "RTM_GETNEIGH dump";
    let mut sock = RouteSocket::new(OP)?;
    let msgs = sock.request(OP, RouteNetlinkMessage::GetNeighbour(NeighbourMessage::default()), NLM_F_DUMP)?;
    Ok(msgs
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) => Neighbour::from_message(n),
            _ => None,
        })
        .filter(|n| ifindex.is_none_or(|i| n.ifindex == i))
        .collect())
}

/// Asks the kernel to resolve `ip` on interface `ifindex`, as if it were about to send to it.
///
/// Sends `RTM_NEWNEIGH` with `NLM_F_CREATE` and the `NTF_USE` flag, the same as
/// `ip neigh replace IP dev DEV use` (ip-neighbour(8)). The kernel creates the entry if needed
/// and calls `neigh_event_send()`, which starts ARP/NDP resolution or re-confirms a stale entry
/// (kernel commit 0c5c2d3089068d4aa378f7a40d2b5ad9d4f52ce8, "neigh: Allow for user space users
/// of the neighbour table"; `neigh_add()` in `net/core/neighbour.c`). It returns at once; the
/// result arrives later as an `RTM_NEWNEIGH` event (see [`NeighbourWatcher`]) in state
/// REACHABLE, or FAILED if nobody answers. A permanent entry is left as it is.
///
/// # Errors
/// [`NicError::Netlink`] with the kernel's errno (e.g. `ENODEV` for an unknown index).
pub fn resolve(ifindex: u32, ip: IpAddr) -> Result<(), NicError> {
    const OP: &str = "RTM_NEWNEIGH (NTF_USE)";
    let mut msg = NeighbourMessage::default();
    msg.header.family = match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    msg.header.ifindex = ifindex;
    msg.header.state = NlState::None;
    msg.header.flags = NeighbourFlags::Use;
    msg.attributes.push(NeighbourAttribute::Destination(ip.into()));
    let mut sock = RouteSocket::new(OP)?;
    sock.request(OP, RouteNetlinkMessage::NewNeighbour(msg), NLM_F_CREATE)?;
    Ok(())
}

/// A change of the neighbour table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighbourEvent {
    /// `RTM_NEWNEIGH`: an entry was added or changed (state, MAC).
    Changed(Neighbour),
    /// `RTM_DELNEIGH`: an entry was removed.
    Removed(Neighbour),
    /// The socket's receive buffer overflowed (`ENOBUFS`) and events were lost: call [`dump`]
    /// again and replace the mirror.
    Resync,
}

/// Receives neighbour changes (IPv4 and IPv6) from the `RTNLGRP_NEIGH` multicast group.
///
/// Subscribe first, then [`dump`], so that nothing falls between the two. Use it as a blocking
/// iterator (`for ev in watcher`), with [`NeighbourWatcher::recv_timeout`], or register its fd
/// (it implements [`AsFd`]) with an event loop such as tokio's `AsyncFd` and call
/// `recv_timeout(Duration::ZERO)` when it is readable.
pub struct NeighbourWatcher {
    sock: Socket,
    pending: std::collections::VecDeque<NeighbourEvent>,
}

impl fmt::Debug for NeighbourWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeighbourWatcher")
            .field("fd", &self.sock.as_raw_fd())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl NeighbourWatcher {
    /// Opens a `NETLINK_ROUTE` socket in the calling thread's network namespace and joins
    /// `RTNLGRP_NEIGH`.
    ///
    /// # Errors
    /// [`NicError::Netlink`] if the socket cannot be created or bound.
    pub fn new() -> Result<Self, NicError> {
        const OP: &str = "RTNLGRP_NEIGH subscribe";
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| NicError::netlink(OP, e))?;
        sock.bind(&SocketAddr::new(0, 0)).map_err(|e| NicError::netlink(OP, e))?;
        sock.add_membership(RTNLGRP_NEIGH).map_err(|e| NicError::netlink(OP, e))?;
        // Room for bursts (e.g. a flush of thousands of entries) before ENOBUFS.
        let _ = sock.set_rx_buf_sz(4 * 1024 * 1024);
        Ok(Self { sock, pending: std::collections::VecDeque::new() })
    }

    /// Waits up to `timeout` for the next event. `Ok(None)` when none came in time;
    /// `Duration::ZERO` checks without waiting.
    ///
    /// # Errors
    /// [`NicError::Netlink`] if the socket fails (other than an overflow, which is
    /// [`NeighbourEvent::Resync`]); [`NicError::NetlinkDecode`] for a malformed message.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<NeighbourEvent>, NicError> {
        if let Some(ev) = self.pending.pop_front() {
            return Ok(Some(ev));
        }
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(self.sock.as_fd(), nix::poll::PollFlags::POLLIN)];
        let ready = match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(NicError::netlink("poll", e.into())),
        };
        if ready == 0 {
            return Ok(None);
        }
        self.next_blocking().map(Some)
    }

    /// Blocks until an event arrives.
    fn next_blocking(&mut self) -> Result<NeighbourEvent, NicError> {
        const OP: &str = "RTNLGRP_NEIGH receive";
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Ok(ev);
            }
            let data = match self.sock.recv_from_full() {
                Ok((data, _)) => data,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {
                    return Ok(NeighbourEvent::Resync);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NicError::netlink(OP, e)),
            };
            let mut offset = 0;
            while offset < data.len() {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                    .map_err(|e| NicError::NetlinkDecode { op: OP, detail: e.to_string() })?;
                let len = usize::try_from(msg.header.length).unwrap_or(usize::MAX);
                if len == 0 {
                    break;
                }
                offset += len.next_multiple_of(4);
                let ev = match msg.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) => {
                        Neighbour::from_message(&n).map(NeighbourEvent::Changed)
                    }
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelNeighbour(n)) => {
                        Neighbour::from_message(&n).map(NeighbourEvent::Removed)
                    }
                    NetlinkPayload::Overrun(_) => Some(NeighbourEvent::Resync),
                    _ => None,
                };
                self.pending.extend(ev);
            }
        }
    }
}

impl Iterator for NeighbourWatcher {
    type Item = Result<NeighbourEvent, NicError>;

    /// Blocks until the next event; never returns `None`.
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_blocking())
    }
}

impl AsFd for NeighbourWatcher {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for NeighbourWatcher {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_states_follow_nud_valid() {
        for s in [
            NeighbourState::REACHABLE,
            NeighbourState::STALE,
            NeighbourState::DELAY,
            NeighbourState::PROBE,
            NeighbourState::PERMANENT,
            NeighbourState::NOARP,
        ] {
            assert!(s.is_valid(), "{s}");
        }
        for s in [NeighbourState::NONE, NeighbourState::INCOMPLETE, NeighbourState::FAILED] {
            assert!(!s.is_valid(), "{s}");
        }
        assert_eq!(format!("{}", NeighbourState(0x82)), "REACHABLE|PERMANENT");
    }
}
