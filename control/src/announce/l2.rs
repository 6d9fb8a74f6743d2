//! L2 announcement: this node answers ARP requests (RFC 826) and Neighbor Solicitations (RFC
//! 4861 §7.2.4) for the VIPs it announces, so hosts on the segment send the VIPs' traffic to
//! it, as MetalLB's L2 mode does.
//!
//! The answering is done by the steering program in the driver (`XDP_TX`, see
//! `nic-config/xdp/steer.c`), not here: [`L2`] only fills each interface's `l2_addrs` map
//! ([`nic_config::L2Responder::sync`]) and, for each VIP that was not announced before (this
//! node takes it over: start, health regained, a Service got its first usable endpoint),
//! sends one gratuitous ARP request (RFC 5227 §2.3) or unsolicited Neighbor Advertisement
//! with the Override flag (RFC 4861 §7.2.6) on every answering interface, so neighbours that
//! cached another node's MAC switch at once instead of when their entry goes stale.
//!
//! The same map makes the program drop what is sent to a VIP outside its service ports (and
//! ICMP errors and fragments, which go to xlb): an announced VIP never reaches the host's
//! own sockets.

use std::fmt::Write as _;
use std::net::IpAddr;

use nic_config::L2Responder;

use super::{AnnounceError, Announcer, Applied, PrefixSet};

/// The L2 [`Announcer`]: the `l2_addrs` maps of the steering programs of the answering
/// interfaces, and their packet sockets for the take-over frames.
#[derive(Debug)]
pub struct L2 {
    responders: Vec<L2Responder>,
    /// The set last put into every map with its take-over frames sent; `None` before the
    /// first success and after a failure (the next call writes and announces everything).
    owned: Option<PrefixSet>,
}

impl L2 {
    /// An announcer answering through `responders` (one per interface; nothing is written
    /// until [`Announcer::announce`]).
    pub fn new(responders: Vec<L2Responder>) -> Self {
        Self { responders, owned: None }
    }

    /// The interfaces answering, comma-separated.
    fn interfaces(&self) -> String {
        let names: Vec<&str> = self.responders.iter().map(L2Responder::ifname).collect();
        if names.is_empty() { "no interface".to_owned() } else { names.join(", ") }
    }
}

impl Announcer for L2 {
    fn announce(&mut self, set: &PrefixSet) -> Result<Applied, AnnounceError> {
        if self.owned.as_ref() == Some(set) {
            return Ok(Applied::Unchanged);
        }
        let previous = self.owned.take();
        let addrs: Vec<IpAddr> = set.iter().copied().collect();
        for r in &mut self.responders {
            r.sync(&addrs).map_err(|source| AnnounceError::L2 { source })?;
        }
        let new: Vec<IpAddr> =
            set.iter().filter(|a| !previous.as_ref().is_some_and(|p| p.contains(a))).copied().collect();
        for a in &new {
            for r in &self.responders {
                r.announce(*a).map_err(|source| AnnounceError::L2 { source })?;
            }
        }
        self.owned = Some(set.clone());
        let mut reply = format!("answering ARP/NDP on {} for {set}", self.interfaces());
        if !new.is_empty() {
            let list: Vec<String> = new.iter().map(ToString::to_string).collect();
            let _ = write!(reply, "; gratuitous ARP / unsolicited NA sent for {}", list.join(", "));
        }
        Ok(Applied::Reconfigured { written: true, reply })
    }

    fn describe(&self) -> String {
        format!("ARP/NDP answered by the steering program on {}", self.interfaces())
    }
}
