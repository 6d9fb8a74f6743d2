//! Scratch network namespaces for loading rulesets into the kernel (`ip netns add`, `ip netns
//! exec NS nft -f FILE`, `ip netns del`), deleted on drop even when a test fails.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
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

pub use xlb_testkit::{have_tool, is_root};

/// A uniquely named network namespace, deleted when dropped.
#[derive(Debug)]
pub struct ScratchNs {
    ns: xlb_testkit::Netns,
}

impl ScratchNs {
    /// Creates `PREFIX-PID-N` (N counts namespaces of this process).
    ///
    /// # Errors
    /// [`NetnsError`] when `ip netns add` fails (not root, no `ip`).
    pub fn new(prefix: &str) -> Result<Self, NetnsError> {
        let ns = xlb_testkit::Netns::try_new(prefix).map_err(|stderr| NetnsError::Failed {
            cmd: format!("ip netns add {prefix}-…"),
            status: "failed".into(),
            stderr,
        })?;
        Ok(Self { ns })
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// Runs `cmd args…` inside the namespace and returns its output.
    ///
    /// # Errors
    /// [`NetnsError`] when it cannot start or exits non-zero.
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Result<Output, NetnsError> {
        let line = format!("ip netns exec {} {cmd} {}", self.name(), args.join(" "));
        check(line, Command::new("ip").args(["netns", "exec", self.name(), cmd]).args(args).output())
    }

    /// Runs `cmd args…` inside the namespace with `stdin` as standard input.
    ///
    /// # Errors
    /// [`NetnsError`] when it cannot start or exits non-zero.
    pub fn exec_stdin(&self, cmd: &str, args: &[&str], stdin: &[u8]) -> Result<Output, NetnsError> {
        let line = format!("ip netns exec {} {cmd} {} < input", self.name(), args.join(" "));
        let child = Command::new("ip")
            .args(["netns", "exec", self.name(), cmd])
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
