//! The BIRD announcer against a stand-in `birdc` (a shell script that records its arguments
//! and prints a reply captured from BIRD 2.0.12); the real BIRD is exercised end to end in
//! `tests/tests/bird.rs`.

use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use super::*;

/// Replies of `birdc -v -s SOCK configure` as BIRD 2.0.12 gave them.
const RECONFIGURED: &str = "0001 BIRD 2.0.12 ready.\n0002-Reading configuration from bird.conf\n0003 Reconfigured\n";
const SYNTAX_ERROR: &str = "0001 BIRD 2.0.12 ready.\n0002-Reading configuration from bird.conf\n8002 bird.conf:6:1 syntax error, unexpected '}', expecting ';' or '{'\n";
const NO_SOCKET: &str = "Unable to connect to server control socket (/nonexistent): No such file or directory\n";

fn set(addrs: &[&str]) -> PrefixSet {
    addrs.iter().map(|a| a.parse::<IpAddr>().expect("an address")).collect()
}

/// A directory with a stand-in birdc that appends its arguments to `calls`, prints `reply`
/// and exits with `status`.
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("birdc");
        let d = dir.path().display();
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"$@\" >> {d}/calls\n[ -f {d}/sleep ] && sleep 10\ncat {d}/reply\nexit $(cat {d}/status)\n"),
        )
        .expect("script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let f = Self { dir };
        f.reply(RECONFIGURED, 0);
        f
    }

    fn reply(&self, text: &str, status: i32) {
        std::fs::write(self.dir.path().join("reply"), text).expect("reply");
        std::fs::write(self.dir.path().join("status"), status.to_string()).expect("status");
    }

    fn cfg(&self) -> BirdConfig {
        BirdConfig {
            ipv4_file: self.dir.path().join("vips4.conf"),
            ipv6_file: self.dir.path().join("vips6.conf"),
            socket: self.dir.path().join("bird.ctl"),
            birdc: self.dir.path().join("birdc"),
            timeout: Duration::from_secs(5),
        }
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls")).unwrap_or_default().lines().map(str::to_owned).collect()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).expect("file")
    }
}

#[test]
fn render_puts_ipv4_and_ipv6_host_routes_in_their_own_files_in_address_order() {
    let (v4, v6) = render(&set(&["10.0.0.2", "2001:db8::1", "10.0.0.1"]));
    assert_eq!(v4, format!("{HEADER}route 10.0.0.1/32 blackhole;\nroute 10.0.0.2/32 blackhole;\n"));
    assert_eq!(v6, format!("{HEADER}route 2001:db8::1/128 blackhole;\n"));
    assert_eq!(render(&set(&[])), (HEADER.to_owned(), HEADER.to_owned()), "withdraw all: header only");
    assert!(HEADER.starts_with('#') && HEADER.ends_with('\n') && HEADER.lines().count() == 1, "a BIRD comment");
}

#[test]
fn replies_succeed_only_with_the_codes_of_a_taken_configuration() {
    assert_eq!(
        parse_reply(RECONFIGURED),
        Reply::Success("0002-Reading configuration from bird.conf\n0003 Reconfigured".into())
    );
    assert!(matches!(parse_reply("0001 BIRD 2.0.12 ready.\n0004 Reconfiguration in progress\n"), Reply::Success(_)));
    assert!(matches!(
        parse_reply("0001 BIRD 2.0.12 ready.\n0005 Reconfiguration already in progress, queueing new config\n"),
        Reply::Success(_)
    ));
    match parse_reply(SYNTAX_ERROR) {
        Reply::Error(r) => assert!(r.contains("8002 bird.conf:6:1 syntax error"), "{r}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        parse_reply("0001 BIRD 2.0.12 ready.\n0006 Reconfiguration ignored, shutting down\n"),
        Reply::Error(_)
    ));
    assert!(matches!(parse_reply("0001 BIRD 2.0.12 ready.\n9001 syntax error\n"), Reply::Error(_)));
    assert_eq!(parse_reply(NO_SOCKET), Reply::None);
    assert_eq!(parse_reply("0001 BIRD 2.0.12 ready.\n"), Reply::None, "welcome only");
    assert_eq!(parse_reply(""), Reply::None);
}

#[test]
fn announce_writes_both_files_and_runs_birdc_configure_on_the_socket() {
    let f = Fake::new();
    let mut b = Bird::new(&f.cfg());
    let r = b.announce(&set(&["10.0.0.1", "2001:db8::1"])).expect("announced");
    assert_eq!(
        r,
        Applied::Reconfigured {
            written: true,
            reply: "0002-Reading configuration from bird.conf\n0003 Reconfigured".into()
        }
    );
    assert_eq!(f.calls(), [format!("-v -s {} configure", f.cfg().socket.display())]);
    assert_eq!(f.read("vips4.conf"), format!("{HEADER}route 10.0.0.1/32 blackhole;\n"));
    assert_eq!(f.read("vips6.conf"), format!("{HEADER}route 2001:db8::1/128 blackhole;\n"));
    let mode = std::fs::metadata(f.dir.path().join("vips4.conf")).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o644, "BIRD's own user reads it");
}

#[test]
fn the_same_set_again_neither_writes_nor_reconfigures() {
    let f = Fake::new();
    let mut b = Bird::new(&f.cfg());
    b.announce(&set(&["10.0.0.1"])).expect("announced");
    let ino = std::fs::metadata(&f.cfg().ipv4_file).expect("meta").ino();
    assert_eq!(b.announce(&set(&["10.0.0.1"])).expect("same"), Applied::Unchanged);
    assert_eq!(f.calls().len(), 1, "one configure");
    assert_eq!(std::fs::metadata(&f.cfg().ipv4_file).expect("meta").ino(), ino, "not rewritten");
    // A changed set: written and reconfigured.
    b.announce(&set(&["10.0.0.2"])).expect("changed");
    assert_eq!(f.calls().len(), 2);
}

#[test]
fn a_new_process_finding_its_set_in_the_files_reconfigures_once_without_rewriting_them() {
    let f = Fake::new();
    Bird::new(&f.cfg()).announce(&set(&["10.0.0.1"])).expect("first process");
    let ino = std::fs::metadata(&f.cfg().ipv4_file).expect("meta").ino();
    let mut second = Bird::new(&f.cfg());
    let r = second.announce(&set(&["10.0.0.1"])).expect("second process");
    assert!(matches!(r, Applied::Reconfigured { written: false, .. }), "{r:?}");
    assert_eq!(std::fs::metadata(&f.cfg().ipv4_file).expect("meta").ino(), ino, "the file was not touched");
    assert_eq!(second.announce(&set(&["10.0.0.1"])).expect("again"), Applied::Unchanged);
    assert_eq!(f.calls().len(), 2);
}

#[test]
fn a_refused_configuration_is_an_error_with_birds_reply_and_is_tried_again() {
    let f = Fake::new();
    let mut b = Bird::new(&f.cfg());
    b.announce(&set(&["10.0.0.1"])).expect("first");
    f.reply(SYNTAX_ERROR, 1);
    let e = b.announce(&set(&["10.0.0.2"])).expect_err("refused");
    let msg = e.to_string();
    assert!(
        msg.contains(&f.cfg().socket.display().to_string()) && msg.contains("8002 bird.conf:6:1 syntax error"),
        "{msg}"
    );
    // Not taken: the same set again runs configure again (the file already holds it).
    f.reply(RECONFIGURED, 0);
    let r = b.announce(&set(&["10.0.0.2"])).expect("retry");
    assert!(matches!(r, Applied::Reconfigured { written: false, .. }), "{r:?}");
    assert_eq!(f.calls().len(), 3);
}

#[test]
fn birdc_that_cannot_connect_is_an_error_with_its_output() {
    let f = Fake::new();
    f.reply(NO_SOCKET, 1);
    let e = Bird::new(&f.cfg()).announce(&set(&["10.0.0.1"])).expect_err("no socket");
    assert!(matches!(e, AnnounceError::NoReply { .. }), "{e:?}");
    assert!(e.to_string().contains("Unable to connect to server control socket"), "{e}");
}

#[test]
fn a_missing_birdc_is_an_error_naming_the_program() {
    let f = Fake::new();
    let mut c = f.cfg();
    c.birdc = f.dir.path().join("no-such-birdc");
    let e = Bird::new(&c).announce(&set(&["10.0.0.1"])).expect_err("no program");
    assert!(matches!(e, AnnounceError::Spawn { .. }) && e.to_string().contains("no-such-birdc"), "{e}");
}

#[test]
fn a_birdc_that_hangs_is_killed_after_the_timeout() {
    let f = Fake::new();
    std::fs::write(f.dir.path().join("sleep"), "").expect("sleep flag");
    let mut c = f.cfg();
    c.timeout = Duration::from_millis(300);
    let t = Instant::now();
    let e = Bird::new(&c).announce(&set(&["10.0.0.1"])).expect_err("timeout");
    assert!(matches!(e, AnnounceError::Timeout { .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn a_write_replaces_the_file_by_rename_so_a_reader_sees_the_old_or_the_new_content_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("vips4.conf");
    assert!(write_if_changed(&p, "old\n").expect("first"));
    let mut reader = std::fs::File::open(&p).expect("open");
    assert!(write_if_changed(&p, "new\n").expect("second"));
    let mut seen = String::new();
    reader.read_to_string(&mut seen).expect("read");
    assert_eq!(seen, "old\n", "an open reader keeps the whole old file (not truncated in place)");
    assert_eq!(std::fs::read_to_string(&p).expect("read"), "new\n");
    assert!(!write_if_changed(&p, "new\n").expect("third"), "same content: not written");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["vips4.conf"], "no temporary file left");
}

#[test]
fn a_file_that_cannot_be_written_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("missing-dir").join("vips4.conf");
    let e = write_if_changed(&p, "x\n").expect_err("no directory");
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    assert!(!Path::new(&p).exists());
}

/// A change whose IPv4 file was written but whose IPv6 file could not be: the files are then
/// neither the set BIRD confirmed nor the one wanted, and going back to the confirmed set must
/// rewrite them (it was answered `Unchanged`, the IPv4 file still announcing the VIP withdrawn).
#[test]
fn a_half_written_change_that_failed_does_not_leave_the_files_out_of_step_with_the_confirmed_set() {
    let f = Fake::new();
    let v6dir = f.dir.path().join("v6");
    std::fs::create_dir(&v6dir).expect("mkdir");
    let mut c = f.cfg();
    c.ipv6_file = v6dir.join("vips6.conf");
    let mut b = Bird::new(&c);
    b.announce(&set(&[])).expect("A taken");
    std::fs::remove_dir_all(&v6dir).expect("rmdir");
    b.announce(&set(&["10.0.0.1", "2001:db8::1"])).expect_err("the IPv6 file cannot be written");
    std::fs::create_dir(&v6dir).expect("mkdir again");
    let r = b.announce(&set(&[])).expect("A again");
    assert_eq!(
        std::fs::read_to_string(&c.ipv4_file).expect("v4 file"),
        HEADER.to_owned(),
        "the IPv4 file still announces B's VIP although xlb wants A ({r:?})"
    );
}
