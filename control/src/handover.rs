//! Hand-over from a running xlb to a new one (`xlb run --takeover`, docs/architecture.md
//! "Hand-over"), over the old process's admin socket:
//!
//! 1. The new process loads its config, builds its tables, loads (does not attach) its
//!    steering programs and fills their maps, and parks its workers (pinned, flow tables
//!    allocated: [`dataplane::worker::park`]), then connects to the admin socket and sends
//!    `handover V xsk2=LAYOUT`
//!    (V = [`snapshot::VERSION`], the flow snapshot format it reads; LAYOUT its AF_XDP socket
//!    layout, [`XSK_OFFER`]).
//! 2. If V is not the old process's version, the old one answers `error …` and keeps serving;
//!    the new process exits with that error. Otherwise the old process closes its HTTP ports
//!    and control runtime, stops its workers (each finishes its batch), exports every
//!    worker's flows and the affinity records, keeps
//!    its AF_XDP sockets and UMEMs open if LAYOUT is its own (else closes them), and at once
//!    writes the snapshot into a memfd and sends
//!    `ok BYTES XSKBYTES` (sockets kept) or `ok BYTES` with the descriptors attached
//!    (`SCM_RIGHTS`, unix(7); [`send`]); its punt device is closed after `released`, and
//!    its reply rules stay for the new process. Its steering programs stay attached: their maps
//!    keep pointing at kept sockets, whose RX rings hold the frames meanwhile; with no socket
//!    in a queue's slot they drop the frames that are xlb's (counted `redirect_failed`)
//!    instead of letting the kernel forward them untranslated.
//! 3. The new process reads and checks the snapshot ([`snapshot::decode`]), binds its HTTP
//!    ports, creates its punt device, and starts its parked workers, which adopt the sockets
//!    (they touch their rings only after `released`) or bind new ones and import their flows
//!    ([`dataplane::process::Pipeline::import_flows`]) in parallel; it puts the sockets into
//!    its programs' maps, then sends `attach`. The old process leaves its programs
//!    attached ([`nic_config::Steering::leave_attached`]), answers `released` and exits; the
//!    new one replaces each of them with its own in one netlink request. (`detached`, from an
//!    old process that detached first, is accepted too.) A snapshot the new
//!    process cannot read is logged and it starts without flows (TCP flows of `mh`/`sh`
//!    services are then picked up mid-stream).
//! 4. If the new process fails after the flows arrived, it frees its ports, sockets and punt
//!    device and sends `abort WHY`. On that, on a closed connection (it crashed) or when no
//!    `attach` comes within [`WAIT`], the old process answers `resumed`, logs why, and serves
//!    again as a start would (its kept sockets or new ones, workers, replacing its own
//!    left-attached programs)
//!    with its flows and its own config (the settings that only a start applies as its
//!    workers ran them); a late new process that reads `resumed` exits without attaching.
//!
//! With the sockets handed over, frames that are xlb's wait in the RX rings from the old
//! workers' last batch to the new workers' first (while the fill rings have frames). Without
//! (an older xlb, another layout), they are dropped from the old workers' last batch to the
//! new program's attach (docs/reliability.md has the gaps as measured); either way they never
//! reach the kernel, which would forward a backend's reply untranslated (a fresh-clone CI run
//! at `285aea1`, when the old process still detached first, had 29 of 40 chaos streams reset
//! that way).

use std::io::{Read as _, Seek as _, Write as _};
use std::mem::MaybeUninit;
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use dataplane::process::snapshot::{self, Snapshot};
use dataplane::xsk::{XskExport, XskState};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// The admin command that starts a hand-over.
pub(crate) const COMMAND: &str = "handover";

/// The request's offer to adopt the old process's AF_XDP sockets and UMEMs: `xsk2=LAYOUT`
/// after the snapshot version, LAYOUT being the new process's [`crate::run`] socket layout
/// (workers, interfaces and queues, frame and ring sizes, bind mode). `2` is the version of
/// the socket hand-over (the [`XskState`] encoding, the descriptor order of [`send`] and how
/// the UMEMs are registered); raised whenever one changes. Version 2: the UMEMs are
/// registered in unaligned chunk mode (`dataplane::xsk`), whose RX addresses a version 1
/// process would misread. A process that does not know the offer refuses the request before
/// stopping (an xlb before the socket hand-over: `error: handover needs the snapshot
/// version…`; a version 1 process: `… takes the snapshot version and xsk1=LAYOUT …`), and
/// [`request`] asks again without it ([`flows_only_retry`]); this process answers a version 1
/// offer so that a version 1 process asks again without it too ([`check_command`]).
pub(crate) const XSK_OFFER: &str = "xsk2=";

/// The offer of socket hand-over version 1 (UMEMs in aligned chunk mode).
const XSK_OFFER_V1: &str = "xsk1=";

/// Most descriptors one hand-over answer carries (`SCM_MAX_FD` is 253): the snapshot, the
/// socket state, and per worker its UMEM and sockets.
const MAX_FDS: usize = 128;

/// Longest the new process waits for the old one to stop and send its flows.
const WAIT: Duration = Duration::from_secs(30);

/// Why [`request`] did not get flows although nothing failed on this side.
#[derive(Debug)]
pub(crate) enum Refused {
    /// No xlb answers on the socket: nothing to take over.
    NoPeer(std::io::Error),
    /// The running xlb refused (and keeps serving): its answer.
    Refused(String),
}

/// The connection to the old process once it has sent its flows: [`Pending::release`] tells
/// it to detach.
#[derive(Debug)]
pub(crate) struct Pending(UnixStream);

impl Pending {
    /// Sends `attach` and waits for `released` (or `detached`): the old process's programs are
    /// no longer its own (or gone) and this process may attach its own, replacing any it left.
    /// A connection closed without an answer means the same: the old process closes it only
    /// after letting go, or it died (e.g. SIGKILL at the end of a pod's termination grace
    /// period), leaving its programs for this process to replace; logged. `Err` if the old
    /// process answers [`RESUMED`] (it gave up waiting and serves again) or anything else.
    pub(crate) fn release(self) -> Result<()> {
        let mut c = self.0;
        let mut line = String::new();
        // A write to a peer that has closed fails, but an answer it wrote before closing
        // (`resumed`) is still there to read.
        let wrote = c.write_all(b"attach\n");
        let answer = std::io::BufRead::read_line(&mut std::io::BufReader::new(&c), &mut line);
        if let Err(e) = &wrote {
            tracing::debug!(error = %e, "hand-over: writing attach");
        }
        match answer {
            Ok(0) => {
                tracing::warn!("hand-over: the previous xlb went away without answering; attaching");
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe || e.kind() == std::io::ErrorKind::ConnectionReset => {
                tracing::warn!(error = %e, "hand-over: the previous xlb went away before attach; attaching");
                return Ok(());
            }
            Err(e) => return Err(e).context("hand-over: asking the previous xlb to let go of its programs"),
            Ok(_) => {}
        }
        if line == RESUMED {
            bail!(
                "hand-over: the previous xlb stopped waiting for this one (after {}s) and serves again; not attaching",
                WAIT.as_secs()
            );
        }
        if line != RELEASED && line != DETACHED {
            bail!("hand-over: the previous xlb answered {:?} instead of released", line.trim());
        }
        Ok(())
    }
}

impl Pending {
    /// Tells the old process that this one failed after the flows arrived (`abort WHY`), so
    /// that it serves again at once with them and logs `why`; the caller has already freed
    /// what the old process will take back (HTTP ports, AF_XDP sockets, punt device). A
    /// connection merely closed has the same effect, without the reason.
    pub(crate) fn abort(self, why: &str) {
        let line = format!("{ABORT} {}\n", why.replace(['\n', '\r'], " "));
        let _ = (&self.0).write_all(line.as_bytes());
    }
}

/// The new process's word when it fails after the flows arrived: `abort WHY`.
const ABORT: &str = "abort";

/// What the old process handed over: every worker's flows, and (when it accepted the
/// offer) its workers' sockets and UMEMs in worker order.
#[derive(Debug)]
pub(crate) struct Handed {
    /// The flow snapshot.
    pub(crate) flows: Snapshot,
    /// The AF_XDP sockets, one export per worker; `None`: bind new ones.
    pub(crate) sockets: Option<Vec<XskExport>>,
}

/// The new process's side: asks the xlb on `admin_socket` to hand over, offering to adopt
/// its sockets when `layout` (this process's socket layout) is `Some`, and returns its
/// workers' flows (and sockets) and the connection to release it with. `Ok(Err(Refused))`
/// before the old process stopped; `Err` after it stopped (then nothing serves until this
/// process starts).
pub(crate) fn request(
    admin_socket: &Path,
    layout: Option<&str>,
) -> Result<std::result::Result<(Handed, Pending), Refused>> {
    let mut offer = layout;
    loop {
        let mut c = match UnixStream::connect(admin_socket) {
            Ok(c) => c,
            Err(e) => return Ok(Err(Refused::NoPeer(e))),
        };
        c.set_read_timeout(Some(WAIT))?;
        let line = match offer {
            Some(l) => format!("{COMMAND} {} {XSK_OFFER}{l}\n", snapshot::VERSION),
            None => format!("{COMMAND} {}\n", snapshot::VERSION),
        };
        c.write_all(line.as_bytes())?;
        match answer(&c)? {
            Ok(h) => return Ok(Ok((h, Pending(c)))),
            // An xlb from before the socket hand-over, or of another version of it: it refused
            // the offer without stopping.
            Err(Refused::Refused(a)) if offer.is_some() && flows_only_retry(&a) => {
                tracing::info!(
                    answer = a.trim(),
                    "hand-over: the running xlb cannot hand over its AF_XDP sockets to this one; asking for the flows only"
                );
                offer = None;
            }
            Err(r) => return Ok(Err(r)),
        }
    }
}

/// Whether the running xlb's answer to an offer of its sockets refused the offer alone, so
/// that asking again without it hands over the flows: an xlb from before the socket
/// hand-over (`needs the snapshot version`, from [`check_command`]'s version error), or one of
/// socket hand-over version 1 (`takes the snapshot version and xsk1=LAYOUT`).
fn flows_only_retry(answer: &str) -> bool {
    answer.contains("needs the snapshot version") || answer.contains("takes the snapshot version and xsk1=")
}

/// Reads the old process's answer to `handover V [xsk2=…]` on `c`: `ok BYTES` with the
/// snapshot's memfd, or `ok BYTES XSKBYTES` with the snapshot's memfd, the socket state's
/// memfd ([`XskState`]s in worker order), then per worker its UMEM memfd and its sockets in
/// port order.
fn answer(c: &UnixStream) -> Result<std::result::Result<Handed, Refused>> {
    let mut buf = [0u8; 256];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = rustix::net::recvmsg(c.as_fd(), &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)
        .context("reading the hand-over answer")?;
    let got = std::time::Instant::now();
    let mut fds = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    let text = String::from_utf8_lossy(buf.get(..msg.bytes).unwrap_or_default()).trim().to_owned();
    let Some(lens) = text.strip_prefix("ok ") else {
        return Ok(Err(Refused::Refused(if text.is_empty() { "no answer".into() } else { text })));
    };
    let mut words = lens.split_whitespace();
    let len: usize = words.next().unwrap_or("").parse().with_context(|| format!("hand-over answer {text:?}"))?;
    let xsk_len: Option<usize> =
        words.next().map(str::parse).transpose().with_context(|| format!("hand-over answer {text:?}"))?;
    let mut fds = fds.into_iter();
    // The announced length is checked against the memfd's size before anything is
    // allocated, and the read stops there: a corrupt `ok` line is an error, not a capacity
    // overflow or an allocation the process cannot survive.
    let read_memfd = |fd: Option<std::os::fd::OwnedFd>, len: usize, what: &str| -> Result<Vec<u8>> {
        let Some(fd) = fd else { bail!("hand-over answer without the {what}'s memfd") };
        let size = rustix::fs::fstat(&fd).with_context(|| format!("fstat of the {what}'s memfd"))?.st_size;
        if usize::try_from(size).ok() != Some(len) {
            bail!("hand-over answer announced {len} bytes of the {what}, its memfd holds {size}");
        }
        let mut bytes = Vec::with_capacity(len);
        std::fs::File::from(fd)
            .take(u64::try_from(len)?)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading the {what}"))?;
        if bytes.len() != len {
            bail!("{what}: {} bytes, announced {len}", bytes.len());
        }
        Ok(bytes)
    };
    let bytes = read_memfd(fds.next(), len, "flow snapshot")?;
    let sockets = match xsk_len {
        None => None,
        Some(n) => {
            let state = read_memfd(fds.next(), n, "AF_XDP socket state")?;
            let mut input = &state[..];
            let mut out = Vec::new();
            while !input.is_empty() {
                let st = XskState::decode(&mut input).context("AF_XDP socket state")?;
                let umem = fds.next().context("hand-over answer: a worker's UMEM memfd missing")?;
                let sockets: Vec<_> = fds.by_ref().take(st.ports.len()).collect();
                if sockets.len() != st.ports.len() {
                    bail!("hand-over answer: {} sockets for {} ports", sockets.len(), st.ports.len());
                }
                out.push(XskExport { state: st, umem, sockets });
            }
            Some(out)
        }
    };
    let started = std::time::Instant::now();
    let flows = snapshot::decode(&bytes).context("flow snapshot")?;
    tracing::info!(
        phase = "received",
        bytes = bytes.len(),
        decode_ms = started.elapsed().as_secs_f64() * 1e3,
        ms = got.elapsed().as_secs_f64() * 1e3,
        "hand-over phase (new): snapshot and descriptors received"
    );
    Ok(Ok(Handed { flows, sockets }))
}

/// Whether an admin command asks for a hand-over in a version this process can give:
/// `Some(Ok(layout))` yes (with the new process's socket layout when it offers to adopt
/// the sockets, [`XSK_OFFER`]), `Some(Err(answer))` a hand-over it must refuse, `None`
/// another command.
pub(crate) fn check_command(line: &str) -> Option<std::result::Result<Option<String>, String>> {
    let rest = line.strip_prefix(COMMAND)?;
    let mut words = rest.split_whitespace();
    let v = words.next().unwrap_or("");
    let offer = words.next();
    if offer.is_some_and(|o| o.starts_with(XSK_OFFER_V1)) {
        // A new process of socket hand-over version 1 (see `XSK_OFFER`): it cannot adopt
        // this process's UMEMs. The words `needs the snapshot version` make it ask again
        // for the flows alone (its `request`), as an xlb from before the socket hand-over
        // would.
        return Some(Err(format!(
            "error: {COMMAND} needs the snapshot version alone from this xlb: its AF_XDP sockets \
             are handed over as {XSK_OFFER}LAYOUT (unaligned chunks), not {XSK_OFFER_V1}\n"
        )));
    }
    if words.next().is_some() || offer.is_some_and(|o| !o.starts_with(XSK_OFFER)) {
        return Some(Err(format!(
            "error: {COMMAND} takes the snapshot version and {XSK_OFFER}LAYOUT, got {:?}\n",
            rest.trim()
        )));
    }
    let layout = offer.and_then(|o| o.strip_prefix(XSK_OFFER)).map(str::to_owned);
    Some(match v.parse::<u32>() {
        Ok(n) if n == snapshot::VERSION => Ok(layout),
        Ok(n) => Err(format!(
            "error: the new xlb reads flow snapshot version {n}, this one writes version {}; not handing over\n",
            snapshot::VERSION
        )),
        Err(_) => Err(format!("error: {COMMAND} needs the snapshot version, got {v:?}\n")),
    })
}

/// A memfd holding `bytes`, at offset 0.
fn memfd_with(name: &str, bytes: &[u8]) -> Result<std::fs::File> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC).context("memfd_create")?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes).with_context(|| format!("writing {name}"))?;
    f.rewind()?;
    Ok(f)
}

/// The old process's side, once its workers stopped: sends `snap` in a memfd, and with
/// `sockets` (one export per worker) the socket state and the descriptors as [`answer`]
/// reads them. The old process keeps its own descriptors until `attach`.
pub(crate) fn send(c: &UnixStream, snap: &Snapshot, sockets: Option<&[XskExport]>) -> Result<()> {
    let started = std::time::Instant::now();
    let bytes = snapshot::encode(snap);
    let encoded = started.elapsed();
    let f = memfd_with("xlb-flows", &bytes)?;
    let mut fds = vec![f.as_fd()];
    let mut line = format!("ok {}\n", bytes.len());
    let state_file;
    if let Some(exports) = sockets {
        let mut state = Vec::new();
        for e in exports {
            e.state.encode(&mut state);
        }
        state_file = memfd_with("xlb-xsk", &state)?;
        fds.push(state_file.as_fd());
        for e in exports {
            fds.push(e.umem.as_fd());
            fds.extend(e.sockets.iter().map(std::os::fd::AsFd::as_fd));
        }
        if fds.len() > MAX_FDS {
            bail!("{} descriptors to hand over, at most {MAX_FDS}", fds.len());
        }
        line = format!("ok {} {}\n", bytes.len(), state.len());
    }
    let iov = [std::io::IoSlice::new(line.as_bytes())];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    cmsg.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(c.as_fd(), &iov, &mut cmsg, SendFlags::empty()).context("sending the flow snapshot")?;
    tracing::info!(
        phase = "sent",
        bytes = bytes.len(),
        encode_ms = encoded.as_secs_f64() * 1e3,
        ms = started.elapsed().as_secs_f64() * 1e3,
        "hand-over phase (old): snapshot encoded, written into a memfd and sent with the descriptors"
    );
    Ok(())
}

/// The old process's side, after [`send`]: waits (up to [`WAIT`]) for the new process's
/// `attach`. `Err` with the new process's reason if it sends `abort WHY`, and `Err` if it
/// goes away or says nothing in time; the caller then serves again with its flows.
pub(crate) fn wait_attach(c: &UnixStream) -> Result<()> {
    c.set_read_timeout(Some(WAIT))?;
    let mut line = String::new();
    let n = std::io::BufRead::read_line(&mut std::io::BufReader::new(c), &mut line)
        .with_context(|| format!("no go-ahead from the new xlb within {}s", WAIT.as_secs()))?;
    let line = line.trim();
    if line == "attach" {
        return Ok(());
    }
    if let Some(why) = line.strip_prefix(ABORT) {
        bail!("the new xlb failed: {}", why.trim());
    }
    if n == 0 {
        bail!("the new xlb went away without a word (it crashed or was killed)");
    }
    bail!("the new xlb sent {line:?} instead of attach");
}

/// The old process's answers that need no descriptor: a refusal (`error …`), or its last
/// word ([`RELEASED`], [`RESUMED`]). A peer that went away is not an error here.
pub(crate) fn reply(mut c: &UnixStream, answer: &str) {
    let _ = c.write_all(answer.as_bytes());
}

/// The answer of an old process that detached its programs before the new one attached (an
/// xlb before [`RELEASED`] existed); accepted by [`Pending::release`].
pub(crate) const DETACHED: &str = "detached\n";

/// The old process's last word when the hand-over failed on the new side (`abort`, closed
/// connection, or no `attach` within [`WAIT`]): it serves again with its flows, and a new
/// process that reads this must not attach.
pub(crate) const RESUMED: &str = "resumed\n";

/// The old process's answer to `attach`: its programs stay attached and the new process
/// replaces them in one netlink request each, so no frame meets neither program. A new
/// process also accepts [`DETACHED`].
pub(crate) const RELEASED: &str = "released\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handover_command_in_another_version_is_refused_with_both_versions() {
        assert_eq!(check_command(&format!("handover {}", snapshot::VERSION)), Some(Ok(None)));
        assert_eq!(
            check_command(&format!("handover {} xsk2=2x2048;0=eth0:0", snapshot::VERSION)),
            Some(Ok(Some("2x2048;0=eth0:0".to_owned())))
        );
        assert!(check_command(&format!("handover {} xsk9=a", snapshot::VERSION)).is_some_and(|r| r.is_err()));
        let e = check_command("handover 999").and_then(Result::err).unwrap_or_default();
        assert!(e.contains("999") && e.contains(&snapshot::VERSION.to_string()), "{e}");
        assert!(check_command("handover x").is_some_and(|r| r.is_err()));
        assert_eq!(check_command("stats"), None);
    }

    #[test]
    fn a_version_1_socket_offer_is_refused_so_that_its_sender_asks_for_the_flows_alone() {
        let e = check_command(&format!("handover {} xsk1=2x2048;0=eth0:0", snapshot::VERSION))
            .and_then(Result::err)
            .unwrap_or_default();
        // What a version 1 process's `request` looks for before asking again without the offer.
        assert!(e.contains("needs the snapshot version"), "{e}");
        assert!(flows_only_retry(&e));
    }

    #[test]
    fn refusals_of_the_offer_alone_are_retried_without_it_and_others_are_not() {
        // The answer of an xlb of socket hand-over version 1 to this version's offer (its
        // `check_command` text), and of an xlb from before the socket hand-over.
        let v1 = "error: handover takes the snapshot version and xsk1=LAYOUT, got \"3 xsk2=1x2048\"\n";
        assert!(flows_only_retry(v1));
        assert!(flows_only_retry("error: handover needs the snapshot version, got \"3 xsk2=1x2048\"\n"));
        // A snapshot version this process does not read: refused, not retried. (A command
        // taken instead of refused would leave no answer to classify: that fails too.)
        let e = check_command("handover 999").and_then(Result::err).expect("handover 999 is refused");
        assert!(!flows_only_retry(&e), "{e}");
        // This process's own answer to a malformed offer of its own version.
        let e = check_command(&format!("handover {} xsk2=a b", snapshot::VERSION))
            .and_then(Result::err)
            .expect("an offer with a word after it is refused");
        assert!(!flows_only_retry(&e), "{e}");
    }

    #[test]
    fn snapshot_sent_in_a_memfd_arrives_whole() {
        let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
        let snaps = Snapshot {
            workers: vec![snapshot::FlowSnapshot {
                worker_id: 3,
                workers: 4,
                snat_ports: (61000, 65535),
                ..Default::default()
            }],
            affinity: vec![],
        };
        let t = std::thread::spawn(move || {
            // The new side's request line, then the answer.
            let mut line = [0u8; 64];
            let n = std::io::Read::read(&mut &b, &mut line).unwrap_or(0);
            assert!(check_command(std::str::from_utf8(&line[..n]).unwrap_or("").trim()).is_some());
            send(&b, &snaps, None).unwrap_or_else(|e| panic!("send: {e:#}"));
        });
        // `request` connects by path; its reading half runs here on the pair.
        let got = read_answer_for_test(a).unwrap_or_else(|e| panic!("request: {e:#}"));
        t.join().unwrap_or_else(|_| panic!("sender thread"));
        assert_eq!(got.workers.len(), 1);
        assert_eq!((got.workers[0].worker_id, got.workers[0].workers), (3, 4));
    }

    /// The old side of `release` over a socket pair: reads `attach`, then answers `answer`
    /// (`None`: closes without a word).
    fn release_against(answer: Option<&'static str>) -> Result<()> {
        let (a, b) = UnixStream::pair()?;
        let old = std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(&b), &mut line);
            assert_eq!(line, "attach\n");
            if let Some(text) = answer {
                reply(&b, text);
            }
        });
        let r = Pending(a).release();
        old.join().unwrap_or_else(|_| panic!("old side"));
        r
    }

    #[test]
    fn release_goes_on_after_released_detached_or_a_closed_connection_and_not_after_another_answer() {
        release_against(Some(RELEASED)).unwrap_or_else(|e| panic!("released: {e:#}"));
        release_against(Some(DETACHED)).unwrap_or_else(|e| panic!("detached: {e:#}"));
        release_against(None).unwrap_or_else(|e| panic!("closed: {e:#}"));
        let e = release_against(Some("error: busy\n")).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("instead of released"), "{e}");
    }

    #[test]
    fn release_refuses_to_attach_when_the_old_process_answered_resumed_before_closing() {
        // The old side gave up waiting, wrote `resumed` and closed before `attach` came.
        let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
        reply(&b, RESUMED);
        drop(b);
        let e = Pending(a).release().err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("serves again"), "{e}");
    }

    /// The old side's `wait_attach` against a new side that does `new` on its end.
    fn wait_attach_against(new: impl FnOnce(UnixStream) + Send + 'static) -> Result<()> {
        let (a, b) = UnixStream::pair()?;
        let t = std::thread::spawn(move || new(b));
        let r = wait_attach(&a);
        t.join().unwrap_or_else(|_| panic!("new side"));
        r
    }

    #[test]
    fn wait_attach_fails_with_the_new_process_reason_on_abort_and_on_a_closed_connection() {
        wait_attach_against(|c| {
            let _ = (&c).write_all(b"attach\n");
        })
        .unwrap_or_else(|e| panic!("attach: {e:#}"));
        let e = wait_attach_against(|c| Pending(c).abort("binding worker 0:\nzero-copy not supported"))
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(e.contains("the new xlb failed: binding worker 0: zero-copy not supported"), "{e}");
        let e = wait_attach_against(drop).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("went away"), "{e}");
    }

    /// The old side's answer as raw text with one memfd per entry of `memfds` attached.
    fn answer_with_memfds(text: &str, memfds: &[&[u8]]) -> Result<std::result::Result<Handed, Refused>> {
        let (a, b) = UnixStream::pair()?;
        let files: Vec<std::fs::File> = memfds.iter().map(|m| memfd_with("test", m)).collect::<Result<_>>()?;
        let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
        let iov = [std::io::IoSlice::new(text.as_bytes())];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        cmsg.push(SendAncillaryMessage::ScmRights(&fds));
        rustix::net::sendmsg(b.as_fd(), &iov, &mut cmsg, SendFlags::empty())?;
        answer(&a)
    }

    #[test]
    fn an_answer_announcing_more_snapshot_bytes_than_can_exist_is_an_error_not_a_panic() {
        // A corrupted (or hostile) `ok BYTES` line: the length was used as a capacity before
        // the memfd was read. It must be refused as an error naming the mismatch.
        let r = std::panic::catch_unwind(|| {
            answer_with_memfds(&format!("ok {}\n", usize::MAX), &[b"XLBFLOWS"]).map(|r| r.is_ok())
        });
        match r {
            Ok(Err(e)) => assert!(format!("{e:#}").contains("announced"), "{e:#}"),
            Ok(Ok(ok)) => panic!("accepted an answer announcing {} bytes for 8 (ok: {ok})", usize::MAX),
            Err(p) => panic!(
                "answer panicked on an announced length of {}: {:?}",
                usize::MAX,
                p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied())
            ),
        }
    }

    #[test]
    fn an_answer_announcing_a_huge_socket_state_is_an_error_not_a_panic() {
        let snap = snapshot::encode(&Snapshot::default());
        let r = std::panic::catch_unwind(|| {
            answer_with_memfds(&format!("ok {} {}\n", snap.len(), usize::MAX), &[&snap, b"state"]).map(|r| r.is_ok())
        });
        match r {
            Ok(Err(e)) => assert!(!format!("{e:#}").is_empty()),
            Ok(Ok(ok)) => panic!("accepted (ok: {ok})"),
            Err(p) => panic!(
                "answer panicked: {:?}",
                p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied())
            ),
        }
    }

    fn read_answer_for_test(mut c: UnixStream) -> Result<Snapshot> {
        c.write_all(format!("{COMMAND} {}\n", snapshot::VERSION).as_bytes())?;
        match answer(&c)? {
            Ok(s) => Ok(s.flows),
            Err(Refused::Refused(a)) => bail!("refused: {a}"),
            Err(Refused::NoPeer(e)) => bail!("no peer: {e}"),
        }
    }
}
