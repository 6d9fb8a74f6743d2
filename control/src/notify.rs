//! Readiness messages to a service manager, sd_notify(3)'s protocol: when `$NOTIFY_SOCKET`
//! is set (systemd sets it for a `Type=notify` unit), each message is one datagram of
//! `NAME=VALUE` lines sent to that socket: a path, or an abstract socket name when it starts
//! with `@`. Without the variable nothing is sent. A message that cannot be sent is logged
//! and otherwise ignored: xlb serves whether or not its service manager hears it.
//!
//! What xlb sends (`deploy/systemd/xlb.service` relies on each one):
//! - `READY=1` and `MAINPID=<pid>` once it forwards (its programs attached, its admin socket
//!   up), at start and after a hand-over ([`ready`]);
//! - `MAINPID=<pid>` as soon as a previous xlb has stopped for it during a hand-over
//!   ([`main_pid`]), so that systemd follows the new process before the old one exits;
//! - `STOPPING=1` when SIGTERM starts the drain, or when it stops ([`stopping`]). Never on a
//!   hand-over: systemd would take the unit for stopping and ignore the new process's
//!   `READY=1`.
//! - `WATCHDOG=1` every half of the watchdog timeout (`WatchdogSec=`, sd_watchdog_enabled(3);
//!   [`watchdog_timeout`], [`watchdog`]) while no worker's loop stands still: a stalled
//!   worker (the `/livez` check) stops the pings, so that systemd restarts xlb
//!   (`Restart=on-failure`), as the DaemonSet's liveness probe restarts the pod.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::time::Duration;

/// The environment variable that names the service manager's socket.
pub(crate) const SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// The watchdog timeout systemd gives the process it started, in microseconds
/// (sd_watchdog_enabled(3)).
const WATCHDOG_USEC_ENV: &str = "WATCHDOG_USEC";

/// The process [`WATCHDOG_USEC_ENV`] is meant for; another process (a child) ignores it.
const WATCHDOG_PID_ENV: &str = "WATCHDOG_PID";

/// Sends `WATCHDOG=1`: the process is alive and its workers run.
pub(crate) fn watchdog() {
    send("WATCHDOG=1\n");
}

/// The watchdog timeout of this process, `None` without one; keeps `ADMIN.watchdog` (beside
/// the admin socket, as `ADMIN.xdp` is) current. A process that systemd started
/// (`ExecStart=`) has `$WATCHDOG_USEC` for itself: it writes the timeout to that file, or
/// removes the file without one. A hand-over's new process (`takeover`) is started by the
/// unit's `ExecReload=`, which systemd gives no watchdog (`WATCHDOG_PID`, when set, names the
/// old process): it takes the timeout from the file the process it takes over from wrote,
/// and goes on feeding the watchdog once systemd follows it as the main process. A file that
/// cannot be written or read is logged; the process then runs without the watchdog's
/// timeout from it.
pub(crate) fn watchdog_timeout(admin_socket: &Path, takeover: bool) -> Option<Duration> {
    let file = admin_socket.with_extension("watchdog");
    let usec = std::env::var(WATCHDOG_USEC_ENV).ok();
    let pid = std::env::var(WATCHDOG_PID_ENV).ok();
    match timeout_from(usec.as_deref(), pid.as_deref(), std::process::id()) {
        Some(t) => {
            if let Err(e) = std::fs::write(&file, format!("{}\n", t.as_micros())) {
                tracing::warn!(file = %file.display(), error = %e, "cannot record the watchdog timeout for a hand-over");
            }
            Some(t)
        }
        None if takeover => {
            let text = std::fs::read_to_string(&file).ok()?;
            let t = timeout_from(Some(&text), None, std::process::id());
            if t.is_none() {
                tracing::warn!(file = %file.display(), content = text.trim(), "not a watchdog timeout; ignored");
            }
            t
        }
        None => {
            let _ = std::fs::remove_file(&file);
            None
        }
    }
}

/// The watchdog timeout in `usec` (microseconds, a positive decimal number) when it is meant
/// for process `me`: `pid` unset, or `me` (sd_watchdog_enabled(3)). `None` otherwise.
fn timeout_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(p) = pid
        && p.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    let us = usec?.trim().parse::<u64>().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(us))
}

/// When to send `WATCHDOG=1`: every half of the timeout (systemd.service(5) asks for a ping
/// within it; half leaves room for a slow tick of the control loop), and only while no worker
/// stands still.
#[derive(Debug)]
pub(crate) struct WatchdogFeed {
    every: Duration,
    last: Option<std::time::Instant>,
}

impl WatchdogFeed {
    /// A feed for `timeout`.
    pub(crate) fn new(timeout: Duration) -> Self {
        Self { every: timeout / 2, last: None }
    }

    /// Whether to send a ping at `now`, the workers standing still or not (`stalled`);
    /// records the ping when it says yes.
    pub(crate) fn due(&mut self, now: std::time::Instant, stalled: bool) -> bool {
        if stalled || self.last.is_some_and(|t| now.saturating_duration_since(t) < self.every) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// Sends `READY=1` and `MAINPID=<this process>`: it forwards and serves its admin socket.
pub(crate) fn ready() {
    send(&format!("READY=1\nMAINPID={}\n", std::process::id()));
}

/// Sends `MAINPID=<this process>`: this process is now the one that serves (or will).
pub(crate) fn main_pid() {
    send(&format!("MAINPID={}\n", std::process::id()));
}

/// Sends `STOPPING=1`: the process drains or stops.
pub(crate) fn stopping() {
    send("STOPPING=1\n");
}

/// Sends `message` to `$NOTIFY_SOCKET` if it is set; failures are logged.
fn send(message: &str) {
    let Some(socket) = std::env::var_os(SOCKET_ENV).filter(|s| !s.is_empty()) else {
        return;
    };
    match send_to(&socket, message) {
        Ok(()) => tracing::debug!(socket = %socket.display(), message = message.trim_end(), "sd_notify"),
        Err(e) => {
            tracing::warn!(socket = %socket.display(), message = message.trim_end(), error = %e, "sd_notify failed");
        }
    }
}

/// Sends one datagram with `message` to `socket`: a path, or `@name` for the abstract name
/// `name` (unix(7)).
///
/// # Errors
/// When the address is neither, the socket does not exist or refuses the datagram, or the
/// datagram was cut short.
fn send_to(socket: &OsStr, message: &str) -> std::io::Result<()> {
    let bytes = socket.as_bytes();
    let addr = match (bytes.first(), bytes.strip_prefix(b"@")) {
        (_, Some(name)) => SocketAddr::from_abstract_name(name)?,
        (Some(b'/'), None) => SocketAddr::from_pathname(socket)?,
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "neither an absolute path nor an abstract socket name (@…)",
            ));
        }
    };
    let sent = UnixDatagram::unbound()?.send_to_addr(message.as_bytes(), &addr)?;
    if sent != message.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            format!("sent {sent} of {} bytes", message.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap_or_else(|e| panic!("timeout: {e}"));
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("recv: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn message_arrives_whole_on_a_socket_path() {
        let path = std::env::temp_dir().join(format!("xlb-notify-test-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
        let sent = send_to(path.as_os_str(), "READY=1\nMAINPID=42\n");
        let got = sent.as_ref().map(|()| recv(&sock));
        let _ = std::fs::remove_file(&path);
        assert_eq!(got.unwrap_or_else(|e| panic!("send: {e}")), "READY=1\nMAINPID=42\n");
    }

    #[test]
    fn at_sign_names_an_abstract_socket() {
        let name = format!("xlb-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap_or_else(|e| panic!("addr: {e}"));
        let sock = UnixDatagram::bind_addr(&addr).unwrap_or_else(|e| panic!("bind @{name}: {e}"));
        send_to(OsStr::new(&format!("@{name}")), "STOPPING=1\n").unwrap_or_else(|e| panic!("send: {e}"));
        assert_eq!(recv(&sock), "STOPPING=1\n");
    }

    #[test]
    fn watchdog_timeout_is_read_for_this_process_only() {
        assert_eq!(timeout_from(Some("30000000"), None, 7), Some(Duration::from_secs(30)));
        assert_eq!(timeout_from(Some("30000000"), Some("7"), 7), Some(Duration::from_secs(30)));
        assert_eq!(timeout_from(Some("30000000"), Some("8"), 7), None, "meant for another process");
        assert_eq!(timeout_from(Some("0"), None, 7), None);
        assert_eq!(timeout_from(Some("-1"), None, 7), None);
        assert_eq!(timeout_from(Some("soon"), None, 7), None);
        assert_eq!(timeout_from(None, Some("7"), 7), None);
        assert_eq!(timeout_from(Some("500000\n"), None, 7), Some(Duration::from_millis(500)), "the file's form");
    }

    #[test]
    fn watchdog_is_fed_every_half_timeout_while_no_worker_stands_still() {
        let t0 = std::time::Instant::now();
        let mut f = WatchdogFeed::new(Duration::from_secs(10));
        assert!(f.due(t0, false), "at once");
        assert!(!f.due(t0 + Duration::from_secs(4), false));
        assert!(f.due(t0 + Duration::from_secs(5), false));
        assert!(!f.due(t0 + Duration::from_secs(11), true), "not while a worker stands still");
        assert!(!f.due(t0 + Duration::from_secs(20), true));
        assert!(f.due(t0 + Duration::from_secs(21), false), "again once it runs");
    }

    #[test]
    fn relative_path_or_missing_socket_is_an_error() {
        assert!(send_to(OsStr::new("run/notify"), "READY=1\n").is_err());
        let missing = std::env::temp_dir().join(format!("xlb-notify-missing-{}.sock", std::process::id()));
        assert!(send_to(missing.as_os_str(), "READY=1\n").is_err());
    }
}
