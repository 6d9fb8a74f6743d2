//! `xlb run --takeover --detach`: a hand-over that a service manager can run as a command
//! (`ExecReload=` of `deploy/systemd/xlb.service`). The command cannot itself be the new
//! xlb, because the service manager waits for it to exit; so it starts the new xlb as its
//! child and exits once that one serves:
//!
//! 1. It runs the binary it was started from (`/proc/self/exe`: after an upgrade, the newly
//!    installed one) with the same arguments less `--detach`, stdin from /dev/null, stdout
//!    and stderr inherited (the journal keeps the new process's log), and [`SESSION_ENV`]
//!    set, which makes the child call setsid(2) first: a terminal's hang-up or Ctrl-C does
//!    not reach it.
//! 2. It waits until the admin socket's listener is the child (`SO_PEERCRED` on a connection
//!    to it; the child binds the socket once its programs are attached), then exits 0. If
//!    the child exits first, it exits with an error; the child's own error is in the log
//!    above it.
//!
//! The child tells the service manager its pid itself (`MAINPID=`, [`crate::notify`]).

use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Set (to `1`) in the child's environment: it calls setsid(2) before anything else.
pub(crate) const SESSION_ENV: &str = "XLB_DETACHED";

/// The flag this module implements; left out of the child's arguments.
const FLAG: &str = "--detach";

/// How often the admin socket is asked for its listener.
const POLL: Duration = Duration::from_millis(50);

/// Starts the new xlb (this binary, `args` less `--detach`) and waits until it serves on
/// `admin_socket`. `args` are this process's arguments without the program name.
///
/// # Errors
/// When the binary cannot be found or started, or the child exits before it serves.
pub(crate) fn run(args: impl IntoIterator<Item = OsString>, admin_socket: &Path) -> Result<()> {
    let exe = std::env::current_exe().context("--detach: finding this xlb binary")?;
    let args = child_args(args);
    let started = Instant::now();
    let mut child = Command::new(&exe)
        .args(&args)
        .env(SESSION_ENV, "1")
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("--detach: starting {}", exe.display()))?;
    let pid = child.id();
    tracing::info!(pid, binary = %exe.display(), "--detach: started the new xlb; waiting until it serves");
    loop {
        if let Some(status) = child.try_wait().context("--detach: waiting for the new xlb")? {
            bail!("the new xlb (pid {pid}) exited ({status}) before it served; its log is above");
        }
        if listener_pid(admin_socket) == Some(pid) {
            tracing::info!(
                pid,
                ms = started.elapsed().as_secs_f64() * 1e3,
                socket = %admin_socket.display(),
                "--detach: the new xlb serves"
            );
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
}

/// `args` without `--detach`.
fn child_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter().filter(|a| a.to_str() != Some(FLAG)).collect()
}

/// The pid of the process that listens on `socket` (`SO_PEERCRED` of a connection to it);
/// `None` if nothing listens there. The connection is closed at once: the admin server reads
/// an empty command and answers nothing useful.
fn listener_pid(socket: &Path) -> Option<u32> {
    let c = UnixStream::connect(socket).ok()?;
    let cred = rustix::net::sockopt::socket_peercred(&c).ok()?;
    u32::try_from(cred.pid.as_raw_nonzero().get()).ok()
}

/// In the child started by [`run`] (it sees [`SESSION_ENV`]): leaves the parent's session.
/// Logged, not fatal, when it fails.
pub(crate) fn leave_session_if_detached() {
    if std::env::var_os(SESSION_ENV).is_some_and(|v| v == "1")
        && let Err(e) = rustix::process::setsid()
    {
        tracing::warn!(error = %e, "setsid failed; staying in the parent's session");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_gets_the_same_arguments_without_detach() {
        let args = ["run", "--takeover", "--detach", "--config", "/etc/xlb/xlb.yaml"].map(OsString::from);
        let want = ["run", "--takeover", "--config", "/etc/xlb/xlb.yaml"].map(OsString::from);
        assert_eq!(child_args(args), want);
    }

    #[test]
    fn listener_pid_is_the_process_that_listens() {
        let path = std::env::temp_dir().join(format!("xlb-detach-test-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        assert_eq!(listener_pid(&path), None, "nothing listens yet");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap_or_else(|e| panic!("bind: {e}"));
        let got = listener_pid(&path);
        drop(l);
        let _ = std::fs::remove_file(&path);
        assert_eq!(got, Some(std::process::id()));
    }
}
