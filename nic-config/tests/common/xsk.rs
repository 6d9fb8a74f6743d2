//! A minimal AF_XDP receiver (xsk-rs, copy mode, no libxdp program) for the steering tests.

use std::{num::NonZeroU32, os::fd::AsRawFd, time::Duration};

use xsk_rs::{
    CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem,
    config::{BindFlags, LibxdpFlags, SocketConfig, UmemConfig},
};

const FRAMES: u32 = 64;

/// One AF_XDP socket on (interface, queue) with its own UMEM; all frames start on the fill ring.
pub struct Xsk {
    // Field order: queues before the UMEM they point into.
    rx: RxQueue,
    _tx: TxQueue,
    fq: FillQueue,
    _cq: CompQueue,
    rx_descs: Vec<FrameDesc>,
    umem: Umem,
}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk").field("fd", &self.rx.fd().as_raw_fd()).finish()
    }
}

impl Xsk {
    /// Binds to `ifname`/`queue` in the calling thread's namespace. Copy mode (veth has no
    /// zero-copy) and `XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD`: our steering program feeds it.
    pub fn bind(ifname: &str, queue: u32) -> Self {
        let (umem, descs) =
            Umem::new(UmemConfig::default(), NonZeroU32::new(FRAMES).expect("non-zero"), false).expect("UMEM");
        let config = SocketConfig::builder()
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .bind_flags(BindFlags::XDP_COPY)
            .build();
        // SAFETY: the UMEM is new and used by this one socket only; the queues are dropped
        // before the UMEM (field order of Xsk).
        let (tx, rx, fq_cq) = unsafe { Socket::new(config, &umem, &ifname.parse().expect("interface name"), queue) }
            .unwrap_or_else(|e| panic!("AF_XDP socket on {ifname} queue {queue}: {e}"));
        let (mut fq, cq) = fq_cq.expect("first socket on a UMEM gets fill and completion rings");
        // SAFETY: the descriptors come from this socket's UMEM.
        let n = unsafe { fq.produce(&descs) };
        assert_eq!(n, descs.len(), "fill ring takes every frame");
        Self { rx, _tx: tx, fq, _cq: cq, rx_descs: vec![FrameDesc::default(); descs.len()], umem }
    }

    /// The socket, to put into the steering program's `xsks` map.
    pub fn fd(&self) -> &impl AsRawFd {
        self.rx.fd()
    }

    /// Waits up to `timeout` for frames and returns copies of them; frames go back to the fill
    /// ring.
    pub fn recv(&mut self, timeout: Duration) -> Vec<Vec<u8>> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: rx_descs are plain descriptors this call overwrites with frames of our UMEM.
        let n = unsafe { self.rx.poll_and_consume(&mut self.rx_descs, ms) }.expect("poll RX ring");
        let frames: Vec<Vec<u8>> = self.rx_descs[..n]
            .iter()
            // SAFETY: each descriptor was just consumed from this socket's RX ring, so it names
            // a frame of our UMEM that the kernel no longer writes.
            .map(|d| unsafe { self.umem.data(d) }.contents().to_vec())
            .collect();
        // SAFETY: the frames belong to our UMEM and we are done reading them.
        let back = unsafe { self.fq.produce(&self.rx_descs[..n]) };
        assert_eq!(back, n, "fill ring has room for the frames just received");
        frames
    }

    /// Collects frames for up to `total`, stopping early once `want` arrived.
    pub fn recv_until(&mut self, want: usize, total: Duration) -> Vec<Vec<u8>> {
        let start = std::time::Instant::now();
        let mut all = Vec::new();
        while all.len() < want && start.elapsed() < total {
            all.extend(self.recv(Duration::from_millis(100)));
        }
        all
    }
}
