//! BGP announcement through BIRD 2 (Debian's `bird2`, tested with 2.0.12).
//!
//! xlb does not speak BGP. It writes one `route` line per VIP into two files, IPv4 and IPv6,
//! that the operator's BIRD config includes inside two static protocols, and asks BIRD to read
//! its configuration again (`birdc -v -s SOCKET configure`). BIRD's BGP protocols export those
//! static routes to the routers. Recommended config (docs/operations.md, "Announcing VIPs over
//! BGP"):
//!
//! ```text
//! protocol static xlb_vips4 {
//!   ipv4;
//!   include "/run/xlb/bird-vips4.conf";
//! }
//! protocol static xlb_vips6 {
//!   ipv6;
//!   include "/run/xlb/bird-vips6.conf";
//! }
//! ```
//!
//! BIRD's `include` (User's Guide, chapter 3 "Configuration", global option `include`) must
//! start its own line: with BIRD 2.0.12, `protocol static x { ipv4; include "F"; }` on one
//! line is a syntax error. IPv4 and IPv6 routes need a static protocol each: a route of the
//! other family fails with `8002 … Route … incompatible with channel type`.
//!
//! Routes are `blackhole`: if the node's BIRD also exports them to its kernel, a VIP packet
//! that xlb's steering program does not take is dropped instead of being routed back out.
//!
//! `birdc configure` (User's Guide, 4 "Remote control"; reply codes from BIRD's
//! `doc/reply_codes`) re-reads the whole configuration. Protocols whose configuration did not
//! change keep running, so the BGP sessions stay up; the static protocols whose routes changed
//! are reconfigured in place, and BGP sends the difference (updates and withdrawals). A file
//! that does not parse makes BIRD answer `8002 FILE:LINE:COL message` and keep its running
//! configuration, routes included.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{AnnounceError, Announcer, Applied, PrefixSet};
use crate::config::BirdConfig;

/// The first line of every file xlb writes.
pub const HEADER: &str = "# Written by xlb (announce.mode: bgp): the VIPs this node announces. Do not edit.\n";

/// Final reply codes of `configure` that mean BIRD took the configuration (`doc/reply_codes`):
/// 0003 Reconfigured, 0004 Reconfiguration in progress (protocols are being reconfigured),
/// 0005 Reconfiguration already in progress, queueing (BIRD applies it after the running
/// one). Every other final code is an error, among them 0006 (ignored, shutting down), 8xxx
/// (run-time errors: `8002` for a configuration that does not parse or a missing include)
/// and 9xxx (the command did not parse).
pub const SUCCESS_CODES: [u16; 3] = [3, 4, 5];

/// The BIRD 2 [`Announcer`]: writes [`BirdConfig::ipv4_file`] and [`BirdConfig::ipv6_file`]
/// and runs `birdc -v -s SOCKET configure`.
///
/// It remembers the content BIRD last took. The same set again is [`Applied::Unchanged`]
/// without touching anything; a file is only written when its content differs from what it
/// holds. The first set after a start is always followed by one `configure` (even when both
/// files already hold it), so a configuration that an earlier process wrote but BIRD never
/// took is applied; BIRD then finds no protocol changed and no session is touched.
#[derive(Debug)]
pub struct Bird {
    cfg: BirdConfig,
    /// (IPv4 file, IPv6 file) content BIRD took with its last successful `configure`.
    confirmed: Option<(String, String)>,
}

impl Bird {
    /// An announcer for `cfg` (nothing is read or written until [`Announcer::announce`]).
    pub fn new(cfg: &BirdConfig) -> Self {
        Self { cfg: cfg.clone(), confirmed: None }
    }

    /// Runs `birdc -v -s SOCKET configure` (killed after [`BirdConfig::timeout`]) and checks
    /// its final reply code ([`parse_reply`]). Returns the reply without the welcome line.
    ///
    /// # Errors
    /// [`AnnounceError::Spawn`], [`AnnounceError::Timeout`], [`AnnounceError::Refused`] or
    /// [`AnnounceError::NoReply`].
    pub fn configure(&self) -> Result<String, AnnounceError> {
        let (program, socket) = (&self.cfg.birdc, &self.cfg.socket);
        let spawn_err = |source| AnnounceError::Spawn { program: program.clone(), socket: socket.clone(), source };
        let mut child = Command::new(program)
            .arg("-v")
            .arg("-s")
            .arg(socket)
            .arg("configure")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let deadline = Instant::now() + self.cfg.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(AnnounceError::Timeout {
                        program: program.clone(),
                        socket: socket.clone(),
                        timeout: self.cfg.timeout,
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(spawn_err(e));
                }
            }
        };
        // The replies are a few lines: they fit the pipes, so reading after the exit is safe.
        let mut out = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut out);
        }
        match parse_reply(&out) {
            Reply::Success(reply) => Ok(reply),
            Reply::Error(reply) => Err(AnnounceError::Refused { socket: socket.clone(), reply }),
            Reply::None => Err(AnnounceError::NoReply {
                program: program.clone(),
                socket: socket.clone(),
                status,
                output: out.trim().to_owned(),
            }),
        }
    }
}

impl Announcer for Bird {
    fn announce(&mut self, set: &PrefixSet) -> Result<Applied, AnnounceError> {
        let want = render(set);
        if self.confirmed.as_ref() == Some(&want) {
            return Ok(Applied::Unchanged);
        }
        // From the first write on, the files may be neither the confirmed set nor the wanted
        // one (one written, the other not): until BIRD confirms, the next change rewrites both.
        self.confirmed = None;
        let w4 = write_if_changed(&self.cfg.ipv4_file, &want.0)?;
        let w6 = write_if_changed(&self.cfg.ipv6_file, &want.1)?;
        let reply = self.configure()?;
        self.confirmed = Some(want);
        Ok(Applied::Reconfigured { written: w4 || w6, reply })
    }

    fn describe(&self) -> String {
        format!(
            "BIRD at {} (files {} and {})",
            self.cfg.socket.display(),
            self.cfg.ipv4_file.display(),
            self.cfg.ipv6_file.display()
        )
    }
}

/// The two files' content for `set`: ([`HEADER`] + `route A/32 blackhole;` per IPv4 address,
/// [`HEADER`] + `route A/128 blackhole;` per IPv6 address), in address order. The empty set
/// gives the header alone: the static protocols then have no routes, and BGP withdraws them.
pub fn render(set: &PrefixSet) -> (String, String) {
    let (mut v4, mut v6) = (HEADER.to_owned(), HEADER.to_owned());
    for a in set.iter() {
        // Writing into a String cannot fail.
        let _ = match a {
            std::net::IpAddr::V4(a) => writeln!(v4, "route {a}/32 blackhole;"),
            std::net::IpAddr::V6(a) => writeln!(v6, "route {a}/128 blackhole;"),
        };
    }
    (v4, v6)
}

/// A `birdc -v` reply, judged by its final line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The final code is one of [`SUCCESS_CODES`]; the reply's lines after the welcome.
    Success(String),
    /// Another final code; the reply's lines after the welcome.
    Error(String),
    /// No line with a reply code besides the welcome (birdc could not connect, or is not BIRD's).
    None,
}

/// Judges the output of `birdc -v … configure`.
///
/// With `-v`, birdc prints BIRD's control-socket protocol as it is (User's Guide, 4 "Remote
/// control"): each line starts with a four-digit code followed by `-` when more lines of the
/// same reply follow, or by a space on the reply's last line; a line starting with a space
/// continues the previous one. The welcome (`0001 BIRD 2.0.12 ready.`) comes first. The final
/// line is the last one with a code and a space.
pub fn parse_reply(output: &str) -> Reply {
    let mut lines = Vec::new();
    let mut last: Option<u16> = None;
    for line in output.lines() {
        let code = line.get(..4).filter(|c| c.bytes().all(|b| b.is_ascii_digit())).and_then(|c| c.parse::<u16>().ok());
        let sep = line.as_bytes().get(4).copied();
        match (code, sep) {
            (Some(1), Some(b' ')) => continue, // welcome
            (Some(c), Some(b' ')) => {
                last = Some(c);
                lines.push(line);
            }
            (Some(_), Some(b'-')) => lines.push(line),
            _ if line.starts_with(' ') => lines.push(line),
            _ => lines.push(line),
        }
    }
    let text = lines.join("\n");
    match last {
        Some(c) if SUCCESS_CODES.contains(&c) => Reply::Success(text),
        Some(_) => Reply::Error(text),
        None => Reply::None,
    }
}

/// Writes `content` to `path` unless it already holds exactly that; returns whether it wrote.
///
/// Atomic: the content goes to a temporary file in the same directory, which is fsynced and
/// renamed over `path`, and the directory is fsynced; a reader (BIRD) sees the old file or the
/// new one, never a part, also if xlb dies in between. The file is created 0644 (BIRD usually
/// runs as its own user and must read it).
///
/// # Errors
/// [`AnnounceError::Write`] naming `path`; `path` is then unchanged.
pub fn write_if_changed(path: &Path, content: &str) -> Result<bool, AnnounceError> {
    if std::fs::read(path).is_ok_and(|old| old == content.as_bytes()) {
        return Ok(false);
    }
    write_atomic(path, content).map_err(|source| AnnounceError::Write { path: path.to_owned(), source })?;
    Ok(true)
}

fn write_atomic(path: &Path, content: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut tmp = tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(&dir)?;
    tmp.write_all(content.as_bytes())?;
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(&dir)?.sync_all()
}

#[cfg(test)]
mod tests;
