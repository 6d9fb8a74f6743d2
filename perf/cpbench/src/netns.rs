//! Scratch network namespaces for loading rulesets into the kernel (`ip netns add`, `ip netns
//! exec NS nft -f FILE`, `ip netns del`), deleted on drop even when a test fails.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A failed command or a missing tool.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The command could not be started (not installed, not in `PATH`).
    #[error("cannot run {cmd}: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The command exited non-zero.
    #[error("{cmd} failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// Exit status.
        status: String,
        /// Its standard error (first 2000 bytes).
        stderr: String,
    },
}

fn check(cmd: String, out: std::io::Result<Output>) -> Result<Output, NetnsError> {
    let out = out.map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    if out.status.success() {
        Ok(out)
    } else {
        let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stderr.truncate(2000);
        Err(NetnsError::Failed { cmd, status: out.status.to_string(), stderr })
    }
}

/// Whether the process runs as root (effective uid 0, read from `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Whether `tool` runs (`tool ARG` exits 0, e.g. `nft --version`, `ip -V`).
pub fn have_tool(tool: &str, arg: &str) -> bool {
    Command::new(tool).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// A uniquely named network namespace, deleted when dropped.
#[derive(Debug)]
pub struct ScratchNs {
    name: String,
}

impl ScratchNs {
    /// Creates `PREFIX-PID-N` (N counts namespaces of this process).
    ///
    /// # Errors
    /// [`NetnsError`] when `ip netns add` fails (not root, no `ip`).
    pub fn new(prefix: &str) -> Result<Self, NetnsError> {
        static SERIAL: AtomicU32 = AtomicU32::new(0);
        let name = format!("{prefix}-{}-{}", std::process::id(), SERIAL.fetch_add(1, Ordering::Relaxed));
        check(format!("ip netns add {name}"), Command::new("ip").args(["netns", "add", &name]).output())?;
        Ok(Self { name })
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `cmd args…` inside the namespace and returns its output.
    ///
    /// # Errors
    /// [`NetnsError`] when it cannot start or exits non-zero.
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Result<Output, NetnsError> {
        let line = format!("ip netns exec {} {cmd} {}", self.name, args.join(" "));
        check(line, Command::new("ip").args(["netns", "exec", &self.name, cmd]).args(args).output())
    }

    /// Runs `cmd args…` inside the namespace with `stdin` as standard input.
    ///
    /// # Errors
    /// [`NetnsError`] when it cannot start or exits non-zero.
    pub fn exec_stdin(&self, cmd: &str, args: &[&str], stdin: &[u8]) -> Result<Output, NetnsError> {
        let line = format!("ip netns exec {} {cmd} {} < input", self.name, args.join(" "));
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name, cmd])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let out = child.and_then(|mut c| {
            if let Some(mut i) = c.stdin.take() {
                i.write_all(stdin)?;
            }
            c.wait_with_output()
        });
        check(line, out)
    }

    /// `nft -f FILE` in the namespace; returns the wall time the command took.
    ///
    /// # Errors
    /// [`NetnsError`] when nft rejects the file.
    pub fn nft_file(&self, file: &Path) -> Result<Duration, NetnsError> {
        let t = Instant::now();
        self.exec("nft", &["-f", &file.display().to_string()])?;
        Ok(t.elapsed())
    }
}

impl Drop for ScratchNs {
    fn drop(&mut self) {
        let _ =
            Command::new("ip").args(["netns", "del", &self.name]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}
