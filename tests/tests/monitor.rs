//! `xlb monitor --drops` against xlb on the namespace testbed: frames xlb drops show up with
//! their reason, on stdout and in the pcapng file, while the admin socket keeps answering;
//! the workers' taps are turned off when the monitor goes.

#[cfg(test)]
mod monitor {
    use std::ffi::OsStr;
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::time::Duration;

    use xlb_e2e::{DROPPING_SERVICE, Role, Testbed, Xlb, XlbStats, skip_without_root, wait_for, xlb_binary};

    const CONFIG: &str = include_str!("../../deploy/examples/testbed.yaml");

    /// A testbed with xlb running on it (bind them in this order: xlb stops first).
    fn testbed_with_xlb() -> (Testbed, Xlb) {
        xlb_binary().expect("xlb binary");
        let tb = Testbed::up().unwrap_or_else(|e| {
            eprintln!("testbed up failed, trying once more: {e}");
            Testbed::up().expect("testbed up (second try)")
        });
        let xlb = Xlb::start(&tb, &format!("{CONFIG}{DROPPING_SERVICE}")).expect("xlb start");
        (tb, xlb)
    }

    /// Starts `xlb monitor ARGS --admin-socket …` against `xlb` and waits until its server
    /// side runs.
    fn start_monitor<S: AsRef<OsStr>>(xlb: &Xlb, args: &[S]) -> Child {
        let monitor = Command::new(xlb_binary().expect("xlb binary"))
            .arg("monitor")
            .args(args)
            .arg("--admin-socket")
            .arg(xlb.admin_socket())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("xlb monitor runs");
        wait_for(Duration::from_secs(10), || xlb.log().contains("drop monitor started").then_some(()))
            .unwrap_or_else(|| panic!("the monitor never connected:\n{}", xlb.log()));
        monitor
    }

    /// Waits up to 10 s for the monitor to end, killing it otherwise: its exit status if it
    /// ended, its stdout and its stderr.
    fn finish(mut monitor: Child) -> (Option<ExitStatus>, String, String) {
        let done = wait_for(Duration::from_secs(10), || monitor.try_wait().ok().flatten());
        if done.is_none() {
            let _ = monitor.kill();
        }
        let out = monitor.wait_with_output().expect("monitor output");
        (done, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    #[test]
    fn dropped_frames_reach_the_monitor_with_their_reason_and_the_admin_socket_stays_usable() {
        if skip_without_root("dropped_frames_reach_the_monitor_with_their_reason_and_the_admin_socket_stays_usable") {
            return;
        }
        let (tb, xlb) = testbed_with_xlb();
        let pcap = std::env::temp_dir().join(format!("xlb-monitor-{}.pcapng", std::process::id()));
        let monitor = start_monitor(
            &xlb,
            &[
                OsStr::new("--drops"),
                "--count".as_ref(),
                "2".as_ref(),
                "--filter".as_ref(),
                "10.250.100.41/80".as_ref(),
                "-w".as_ref(),
                pcap.as_os_str(),
            ],
        );
        // The admin socket keeps answering while a monitor streams.
        let services = xlb.services().expect("xlb services while a monitor runs");
        assert!(services.contains("10.250.100.41:80"), "{services}");
        // SYNs to the ingress IP of a Service whose endpoints are all on other nodes
        // (`DROPPING_SERVICE`): xlb drops them (no_endpoints_drop). First a drop to another
        // port, which the filter must hide. It comes before the two the monitor is to show
        // (the monitor ends after those two), and xlb has counted it.
        let _ =
            tb.exec(Role::Client, &["curl", "-sS", "--noproxy", "*", "--max-time", "1", "http://10.250.100.41:9000/"]);
        let drops = || XlbStats::parse(&xlb.stats().unwrap_or_default()).drops("no_endpoints_drop");
        wait_for(Duration::from_secs(5), || (drops() > 0).then_some(()))
            .unwrap_or_else(|| panic!("no no_endpoints_drop drop for 10.250.100.41:9000:\n{}", xlb.log()));
        // Then port 80's.
        let _ = tb.exec(Role::Client, &["curl", "-sS", "--noproxy", "*", "--max-time", "3", "http://10.250.100.41/"]);
        let (done, stdout, stderr) = finish(monitor);
        let frames = read_pcapng(&pcap);
        let _ = std::fs::remove_file(&pcap);
        assert!(done.is_some_and(|s| s.success()), "monitor: {stdout}{stderr}");
        print!("xlb monitor printed:\n{stdout}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{stdout}");
        for l in &lines {
            assert!(l.contains(" drop no_endpoints_drop tcp ") && l.contains(" -> 10.250.100.41:80 "), "{l}");
        }
        assert_eq!(frames.len(), 2);
        for (frame, comment) in &frames {
            assert!(comment.starts_with("xlb: drop no_endpoints_drop worker "), "{comment}");
            // IPv4 destination (offset 30) is the ingress IP, TCP destination port (36) 80.
            assert_eq!(&frame[30..34], &[10, 250, 100, 41]);
            assert_eq!(&frame[36..38], &[0, 80]);
        }
        // The client is gone: the server notices (at its next tick) and turns the taps off.
        wait_for(Duration::from_secs(5), || xlb.log().contains("drop monitor stopped").then_some(()))
            .unwrap_or_else(|| panic!("the monitor was not stopped:\n{}", xlb.log()));
    }

    #[test]
    fn with_punted_the_monitor_also_shows_frames_handed_to_the_kernel() {
        if skip_without_root("with_punted_the_monitor_also_shows_frames_handed_to_the_kernel") {
            return;
        }
        let (tb, xlb) = testbed_with_xlb();
        let monitor = start_monitor(&xlb, &["--drops", "--punted", "--count", "1", "--filter", "10.250.1.2"]);
        // A direct request to backend be1's own address (not through a VIP): its replies come
        // from a Service's backend address and port, so the steering program hands them to
        // xlb, which has no flow for them and hands them to the kernel (punted).
        let got = tb.exec(Role::Client, &["curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://10.250.2.11/"]);
        let (done, stdout, stderr) = finish(monitor);
        print!("xlb monitor --punted printed:\n{stdout}");
        assert!(got.is_ok_and(|o| o.status.success()), "the direct request is answered through the kernel");
        assert!(done.is_some_and(|s| s.success()), "monitor: {stdout}{stderr}");
        let l = stdout.lines().next().unwrap_or_default();
        assert!(l.contains(" punted tcp 10.250.2.11:80 -> 10.250.1.2:"), "{stdout}");
    }

    /// (frame, comment) of each Enhanced Packet Block; none if the file is missing or broken
    /// (the callers' assertions on the frames then fail).
    fn read_pcapng(path: &std::path::Path) -> Vec<(Vec<u8>, String)> {
        xlb_testkit::read_pcapng(path).unwrap_or_default()
    }
}
