//! A blocking rtnetlink request/response helper over `netlink-sys`, with the messages encoded
//! and decoded by `netlink-packet-route`. Protocol: netlink(7), rtnetlink(7).

use std::io;

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::NicError;

/// A `NETLINK_ROUTE` socket in the network namespace of the thread that created it.
pub(crate) struct RouteSocket {
    sock: Socket,
    seq: u32,
}

impl RouteSocket {
    pub(crate) fn new(op: &'static str) -> Result<Self, NicError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| NicError::netlink(op, e))?;
        sock.bind_auto().map_err(|e| NicError::netlink(op, e))?;
        // Extended ACKs (NETLINK_EXT_ACK): the kernel may attach a reason to an error; optional.
        let _ = sock.set_ext_ack(true);
        sock.connect(&SocketAddr::new(0, 0)).map_err(|e| NicError::netlink(op, e))?;
        Ok(Self { sock, seq: 0 })
    }

    /// Sends `msg` with `NLM_F_REQUEST | flags` and returns the kernel's answers.
    ///
    /// For a dump (`NLM_F_DUMP` in `flags`) it collects messages until `NLMSG_DONE`; otherwise
    /// it asks for an ACK and returns when it arrives. A netlink error message becomes
    /// [`NicError::Netlink`] carrying the kernel's errno.
    pub(crate) fn request(
        &mut self,
        op: &'static str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NicError> {
        self.seq = self.seq.wrapping_add(1);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags | if dump { 0 } else { NLM_F_ACK };
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.sock.send(&buf, 0).map_err(|e| NicError::netlink(op, e))?;

        let mut out = Vec::new();
        loop {
            let (data, _) = self.sock.recv_from_full().map_err(|e| NicError::netlink(op, e))?;
            let mut offset = 0;
            while offset < data.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                    .map_err(|e| NicError::NetlinkDecode { op, detail: e.to_string() })?;
                let len = usize::try_from(reply.header.length).unwrap_or(usize::MAX);
                if len == 0 {
                    break;
                }
                offset += len.next_multiple_of(4);
                if reply.header.sequence_number != self.seq {
                    continue; // a stale answer to an earlier request
                }
                match reply.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(out), // ACK
                        Some(_) => return Err(NicError::netlink(op, e.to_io())),
                    },
                    // Answers; a non-dump GET gets one, then the ACK.
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    NetlinkPayload::Overrun(_) => {
                        return Err(NicError::netlink(op, io::Error::other("netlink overrun")));
                    }
                    _ => {}
                }
            }
        }
    }
}
