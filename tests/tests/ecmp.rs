//! The scale-out testbed (`deploy/testbed-ecmp.sh`, docs/testbed.md): three xlb nodes, each
//! announcing one VIP through its own BIRD 2, and a router that spreads a client's flows over
//! them with ECMP. Pins what `make demo-ecmp` shows: the router's multipath route has one next
//! hop per node, every node takes flows, and a node whose xlb stops withdraws its path first
//! while the others keep serving.
//!
//! Needs root, `bird2`, `nginx-light` (scripts/install-deps.sh) and the xlb binary (built if
//! missing, as the other end-to-end tests do).

#[cfg(test)]
mod ecmp {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::Duration;

    use xlb_testkit::{have_tool, run, sh, skip_without_root, wait_for};

    const VIP: &str = "10.251.100.1";

    /// A testbed brought up by the script; `down` when dropped (also on a failed assertion).
    struct Ecmp {
        prefix: String,
        run_base: tempfile::TempDir,
        script: PathBuf,
        xlb: PathBuf,
    }

    impl Ecmp {
        fn up() -> Self {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned();
            let t = Self {
                prefix: format!("ecmp{}", std::process::id()),
                run_base: tempfile::tempdir().expect("tempdir"),
                script: root.join("deploy").join("testbed-ecmp.sh"),
                xlb: xlb_e2e::xlb_binary().expect("xlb binary"),
            };
            let out = t.script("up");
            assert!(
                out.status.success(),
                "testbed-ecmp.sh up failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            t
        }

        fn script(&self, cmd: &str) -> std::process::Output {
            Command::new("bash")
                .arg(&self.script)
                .args([cmd, &self.prefix])
                .env("XLB_BIN", &self.xlb)
                .env("XLB_ECMP_RUNDIR", self.run_base.path())
                .output()
                .expect("bash runs")
        }

        fn dir(&self) -> PathBuf {
            self.run_base.path().join(&self.prefix)
        }

        fn ns(&self, role: &str) -> String {
            format!("{}-{role}", self.prefix)
        }

        /// The router's next hops for the VIP (`nexthop via A` lines, or the single `via A`).
        fn router_next_hops(&self) -> Vec<String> {
            let out = sh(&["ip", "-n", &self.ns("rt"), "route", "show", VIP]);
            let hops: Vec<String> = out
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .filter(|w| w[0] == "via")
                .map(|w| w[1].to_owned())
                .collect();
            hops
        }

        /// One HTTP request from the client to the VIP; the backend's name.
        fn request(&self) -> Option<String> {
            let out = run(&[
                "ip",
                "netns",
                "exec",
                &self.ns("client"),
                "curl",
                "-s",
                "--noproxy",
                "*",
                "-m",
                "2",
                &format!("http://{VIP}/"),
            ]);
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }

        /// New flows node `k`'s xlb scheduled so far (summed over backends, `xlb stats`).
        fn new_flows(&self, k: u8) -> u64 {
            let sock = self.dir().join(format!("n{k}")).join("admin.sock");
            let s = sh(&[&self.xlb.to_string_lossy(), "stats", "--admin-socket", &sock.to_string_lossy()]);
            s.lines()
                .filter(|l| l.starts_with("backend "))
                .filter_map(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    let i = w.iter().position(|x| *x == "new_flows")?;
                    w.get(i + 1)?.parse::<u64>().ok()
                })
                .sum()
        }

        fn xlb_pid(&self, k: u8) -> String {
            std::fs::read_to_string(self.dir().join(format!("n{k}")).join("xlb.pid")).expect("pid").trim().to_owned()
        }
    }

    impl Drop for Ecmp {
        fn drop(&mut self) {
            let _ = self.script("down");
        }
    }

    #[test]
    fn flows_spread_over_three_announcing_nodes_and_a_stopping_node_withdraws_its_path() {
        let test = "flows_spread_over_three_announcing_nodes_and_a_stopping_node_withdraws_its_path";
        if skip_without_root(test) {
            return;
        }
        assert!(have_tool("bird", "--version"), "{test}: needs bird2 (scripts/install-deps.sh)");
        let t = Ecmp::up();
        let mut hops = t.router_next_hops();
        hops.sort();
        assert_eq!(hops, ["10.251.1.11", "10.251.1.12", "10.251.1.13"], "one next hop per node");

        let before: Vec<u64> = (1..=3).map(|k| t.new_flows(k)).collect();
        let mut answers = std::collections::BTreeMap::<String, u32>::new();
        for _ in 0..60 {
            let be = t.request().expect("every request is answered");
            *answers.entry(be).or_default() += 1;
        }
        let taken: Vec<u64> = (1..=3).map(|k| t.new_flows(k) - before[usize::from(k - 1)]).collect();
        eprintln!("new flows per node {taken:?}, answers per backend {answers:?}");
        assert!(taken.iter().all(|&n| n > 0), "every node takes flows: {taken:?}");
        assert!(taken.iter().sum::<u64>() >= 60, "{taken:?}");
        assert_eq!(answers.keys().cloned().collect::<Vec<_>>(), ["be1", "be2", "be3"], "{answers:?}");

        // n2's xlb stops (SIGTERM; the testbed's shutdownGracePeriod is 0s): it withdraws first.
        let t0 = std::time::Instant::now();
        assert!(run(&["kill", "-TERM", &t.xlb_pid(2)]).status.success());
        let two = wait_for(Duration::from_secs(10), "withdrawn", || {
            let mut h = t.router_next_hops();
            h.sort();
            (h == ["10.251.1.11", "10.251.1.13"]).then_some(())
        });
        assert!(two.is_some(), "n2's path still routed: {:?}", t.router_next_hops());
        eprintln!("n2's path withdrawn {:?} after SIGTERM", t0.elapsed());
        let file = std::fs::read_to_string(t.dir().join("n2").join("vips4.conf")).expect("file");
        assert!(!file.contains("route"), "n2's route file is empty: {file}");
        for _ in 0..20 {
            assert!(t.request().is_some(), "requests keep working through n1 and n3");
        }
    }
}
