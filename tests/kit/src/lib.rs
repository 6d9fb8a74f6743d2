//! Test plumbing shared by xlb's tests that need root and network namespaces: the end-to-end
//! harness (`tests/`), `nic-config`'s tests, `perf`'s veth tests and benchmarks, and
//! `control`'s kubeconfig test. One copy of: the root check and skip message, running a
//! command and failing with its output, a uniquely named network namespace deleted on drop
//! (also when the test panics) with a sweep of the ones crashed runs left, a child-process
//! guard, and waiting for a condition.
//!
//! Everything here is for tests: failures panic with the command line and its output.

use std::fs::File;
use std::io::Write as _;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Whether the process runs with effective uid 0.
#[must_use]
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// True (after printing `<test>: skipped: needs root` to stderr) when the process is not root,
/// so a test can `return` early; false when it can run. CI runs as root, so the tests run there.
#[must_use]
pub fn skip_without_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    // straight to the process's stderr: libtest would swallow println! of a passing test
    let _ = writeln!(std::io::stderr(), "{test}: skipped: needs root");
    true
}

/// Whether `tool ARG` runs and exits 0 (e.g. `have_tool("nft", "--version")`).
#[must_use]
pub fn have_tool(tool: &str, arg: &str) -> bool {
    Command::new(tool).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Runs `args[0]` with the rest as arguments and returns its output, whatever its exit status.
///
/// # Panics
/// If `args` is empty or the program cannot be started.
pub fn run(args: &[&str]) -> Output {
    let (prog, rest) = args.split_first().expect("a command");
    Command::new(prog).args(rest).output().unwrap_or_else(|e| panic!("cannot run `{}`: {e}", args.join(" ")))
}

/// Runs a command and returns its standard output.
///
/// # Panics
/// If it cannot start or exits non-zero (the message has the command line, status and output).
pub fn sh(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "`{}` failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip netns exec NS args...`: output whatever the exit status.
pub fn in_ns(ns: &str, args: &[&str]) -> Output {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    run(&v)
}

/// `ip netns exec NS args...`: standard output; panics as [`sh`] does.
pub fn sh_in(ns: &str, args: &[&str]) -> String {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh(&v)
}

/// The names listed by `ip netns list`.
pub fn list_netns() -> Vec<String> {
    sh(&["ip", "netns", "list"]).lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `timeout`; `None` if it never
/// did. `what` names the condition (unused here; [`wait_until`] puts it in its panic).
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let _ = what;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As [`wait_for`], but the condition must become true.
///
/// # Panics
/// After `timeout`, with `what` and the timeout in the message.
pub fn wait_until<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for(timeout, what, f).unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace named `<prefix>-<pid>-<n>`, unique in the process and across
/// processes, deleted on drop (also when the test panics); processes still inside it are
/// killed first.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace (after [`sweep_stale`] of `prefix`, once per process and prefix)
    /// and brings its `lo` up. `prefix`: letters and digits, short (interface and namespace
    /// names are limited; keep `<prefix>-<pid>-<n>` under 32 bytes).
    ///
    /// # Panics
    /// If `ip netns add` fails (not root, `ip` missing).
    pub fn new(prefix: &str) -> Self {
        Self::try_new(prefix).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Netns::new`], for callers that report instead of panicking (benchmarks).
    ///
    /// # Errors
    /// The failing command and its standard error.
    pub fn try_new(prefix: &str) -> Result<Self, String> {
        sweep_stale_once(prefix);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        let out =
            Command::new("ip").args(["netns", "add", &name]).output().map_err(|e| format!("cannot run ip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ip netns add {name} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let ns = Self { name };
        let out = run(&["ip", "-n", &ns.name, "link", "set", "lo", "up"]);
        if !out.status.success() {
            return Err(format!("ip -n {} link set lo up: {}", ns.name, String::from_utf8_lossy(&out.stderr)));
        }
        Ok(ns)
    }

    /// The namespace's name (for `ip netns exec`, `ip -n`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME args...`; panics as [`sh`] does.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut v = vec!["ip", "-n", &self.name];
        v.extend_from_slice(args);
        sh(&v)
    }

    /// `ip netns exec NAME args...`, output whatever the exit status.
    pub fn exec(&self, args: &[&str]) -> Output {
        in_ns(&self.name, args)
    }

    /// `ip netns exec NAME args...`: standard output; panics as [`sh`] does.
    pub fn sh(&self, args: &[&str]) -> String {
        sh_in(&self.name, args)
    }

    /// Runs `f` on a new thread that has joined this namespace (setns(2)) and returns its
    /// result; a panic in `f` is raised again here. Sockets `f` opens live in the namespace.
    ///
    /// # Panics
    /// If the namespace cannot be joined, or `f` panics.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let fd = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
                nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("setns {path}: {e}"));
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete_netns(&self.name);
    }
}

/// Kills what runs in namespace `name` and deletes it; reports (does not panic) on failure.
fn delete_netns(name: &str) {
    let pids = run(&["ip", "netns", "pids", name]);
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let _ = run(&["kill", "-KILL", pid]);
    }
    let out = run(&["ip", "netns", "del", name]);
    if !out.status.success() {
        let _ = writeln!(std::io::stderr(), "cleanup: ip netns del {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Deletes the namespaces `<prefix>-<pid>-*` whose process `<pid>` no longer runs (left by a
/// test process killed before its guards ran). Returns their names.
pub fn sweep_stale(prefix: &str) -> Vec<String> {
    let mut gone = Vec::new();
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return gone };
    let lead = format!("{prefix}-");
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&lead).and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = writeln!(std::io::stderr(), "removing namespace {name} left by a dead test run");
            delete_netns(&name);
            gone.push(name);
        }
    }
    gone
}

fn sweep_stale_once(prefix: &str) {
    static SWEPT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut swept = SWEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !swept.iter().any(|p| p == prefix) {
        swept.push(prefix.to_owned());
        sweep_stale(prefix);
    }
}

/// A child process that is stopped and reaped when the guard is dropped, so a failing test
/// leaves no process behind: SIGKILL at once, or with [`ChildGuard::graceful`] SIGTERM first
/// and SIGKILL after the grace period.
#[derive(Debug)]
pub struct ChildGuard(Option<Child>, Duration);

impl ChildGuard {
    /// Guards `child`; dropping the guard kills it at once.
    pub fn new(child: Child) -> Self {
        Self(Some(child), Duration::ZERO)
    }

    /// Guards `child`; dropping the guard sends SIGTERM and waits up to `grace` before SIGKILL
    /// (for processes that clean up on exit, e.g. detach an XDP program).
    pub fn graceful(child: Child, grace: Duration) -> Self {
        Self(Some(child), grace)
    }

    /// Sends SIGTERM, waits up to `grace` for the exit, then SIGKILL. Returns the exit status
    /// if the child exited by itself within `grace`.
    pub fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let c = self.0.as_mut()?;
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        if let Ok(pid) = i32::try_from(c.id()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// The child, for its pipes and `try_wait`.
    ///
    /// # Panics
    /// Never: the child is only taken by [`ChildGuard::into_inner`], which consumes the guard.
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the guard holds its child until into_inner")
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child().try_wait(), Ok(None))
    }

    /// Takes the child out of the guard (it is no longer killed on drop).
    pub fn into_inner(mut self) -> Child {
        self.0.take().expect("the guard holds its child until into_inner")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.1 > Duration::ZERO {
            self.terminate(self.1);
        } else if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The (frame, packet comment) of each Enhanced Packet Block of the pcapng file at `path`
/// (what `xlb trace --out` and `xlb monitor -w` write, the verdict or drop reason as the
/// comment), in file order.
///
/// # Errors
/// The file cannot be read, has no valid pcapng header, or a block does not parse (the
/// blocks read before it are lost with it).
pub fn read_pcapng(path: &std::path::Path) -> Result<Vec<(Vec<u8>, String)>, String> {
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
    use pcap_file::pcapng::{Block, PcapNgReader};
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = PcapNgReader::new(data.as_slice()).map_err(|e| format!("{}: pcapng header: {e}", path.display()))?;
    let mut out = Vec::new();
    while let Some(b) = r.next_block() {
        if let Block::EnhancedPacket(p) = b.map_err(|e| format!("{}: block: {e}", path.display()))? {
            let comment = p
                .options
                .iter()
                .find_map(|o| match o {
                    EnhancedPacketOption::Comment(c) => Some(c.to_string()),
                    _ => None,
                })
                .unwrap_or_default();
            out.push((p.data.into_owned(), comment));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_namespace_lives_as_long_as_its_guard_even_through_a_panic() {
        if skip_without_root("a_namespace_lives_as_long_as_its_guard_even_through_a_panic") {
            return;
        }
        let ns = Netns::new("xlbkit");
        let name = ns.name().to_owned();
        assert!(list_netns().contains(&name));
        drop(ns);
        assert!(!list_netns().contains(&name), "deleted on drop");

        let leaked = std::panic::catch_unwind(|| {
            let ns = Netns::new("xlbkit");
            let name = ns.name().to_owned();
            assert!(list_netns().contains(&name));
            std::panic::panic_any(name);
        })
        .unwrap_err();
        let name = leaked.downcast_ref::<String>().unwrap();
        assert!(!list_netns().contains(name), "deleted while unwinding");
    }

    #[test]
    fn run_in_runs_inside_the_namespace() {
        if skip_without_root("run_in_runs_inside_the_namespace") {
            return;
        }
        let ns = Netns::new("xlbkit");
        ns.ip(&["link", "add", "kitdummy0", "type", "veth", "peer", "name", "kitdummy1"]);
        let seen = ns.run_in(|| {
            std::path::Path::new("/proc/self/net/dev").exists()
                && std::fs::read_to_string("/proc/thread-self/net/dev").unwrap().contains("kitdummy0")
        });
        assert!(seen, "the thread sees the namespace's interfaces");
        assert!(!std::fs::read_to_string("/proc/self/net/dev").unwrap().contains("kitdummy0"));
    }

    #[test]
    fn sweep_deletes_namespaces_of_dead_processes_only() {
        if skip_without_root("sweep_deletes_namespaces_of_dead_processes_only") {
            return;
        }
        // A pid that does not run: a child that has exited and been reaped.
        let mut c = Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        let dead = format!("xlbkitsw-{}-0", c.id());
        let live = format!("xlbkitsw-{}-7", std::process::id());
        sh(&["ip", "netns", "add", &dead]);
        sh(&["ip", "netns", "add", &live]);
        let gone = sweep_stale("xlbkitsw");
        let left = list_netns();
        delete_netns(&live);
        if left.contains(&dead) {
            delete_netns(&dead);
        }
        assert_eq!(gone, vec![dead.clone()]);
        assert!(!left.contains(&dead) && left.contains(&live), "{left:?}");
    }

    #[test]
    fn wait_for_gives_up_after_the_timeout_and_returns_as_soon_as_the_condition_holds() {
        let t = Instant::now();
        assert_eq!(wait_for(Duration::from_millis(100), "never", || None::<()>), None);
        assert!(t.elapsed() >= Duration::from_millis(100));
        let mut n = 0;
        let t = Instant::now();
        assert_eq!(
            wait_for(Duration::from_secs(10), "third call", || {
                n += 1;
                (n == 3).then_some(n)
            }),
            Some(3)
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        let p = std::panic::catch_unwind(|| wait_until(Duration::from_millis(10), "the moon", || None::<()>));
        let msg = p.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("the moon"), "{msg}");
    }

    #[test]
    fn a_graceful_guard_lets_the_child_exit_on_sigterm() {
        // A shell that exits 7 on SIGTERM: exit status 7 proves it got TERM, not KILL.
        let c = Command::new("sh").args(["-c", "trap 'exit 7' TERM; while :; do sleep 0.05; done"]).spawn().unwrap();
        let mut g = ChildGuard::graceful(c, Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(200)); // let the shell install its trap
        assert_eq!(g.terminate(Duration::from_secs(5)).and_then(|s| s.code()), Some(7));
    }

    #[test]
    fn a_child_guard_kills_and_reaps_its_child() {
        let g = ChildGuard::new(Command::new("sleep").arg("100").spawn().unwrap());
        let pid = g.id();
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        drop(g);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped (no zombie)");
    }
}
