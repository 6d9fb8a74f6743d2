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

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The environment variable that names the service manager's socket.
pub(crate) const SOCKET_ENV: &str = "NOTIFY_SOCKET";

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
    fn relative_path_or_missing_socket_is_an_error() {
        assert!(send_to(OsStr::new("run/notify"), "READY=1\n").is_err());
        let missing = std::env::temp_dir().join(format!("xlb-notify-missing-{}.sock", std::process::id()));
        assert!(send_to(missing.as_os_str(), "READY=1\n").is_err());
    }
}
