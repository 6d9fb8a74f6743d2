//! Runs the real `xlb` binary: `--version`, `completions` and `man`, generated from the clap
//! definitions.

use std::process::{Command, Output};

fn xlb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xlb")).args(args).output().expect("xlb runs")
}

fn stdout_of(args: &[&str]) -> String {
    let out = xlb(args);
    assert!(out.status.success(), "xlb {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

#[test]
fn version_names_the_commit_the_binary_was_built_from() {
    let commit = env!("XLB_COMMIT");
    assert_eq!(stdout_of(&["--version"]), format!("xlb {} (commit {commit})\n", env!("CARGO_PKG_VERSION")));
    // Built from a git checkout without an override (build.rs): the commit is HEAD's.
    if env!("XLB_COMMIT_SOURCE") != "git" {
        return;
    }
    let head = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    let head = head.expect("git rev-parse HEAD worked when xlb was built");
    assert_eq!(commit, String::from_utf8_lossy(&head.stdout).trim());
}

/// The subcommands `xlb --help` lists under "Commands:" (without `help`).
fn listed_subcommands() -> Vec<String> {
    stdout_of(&["--help"])
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completion_script_is_valid_bash_and_completes_every_subcommand() {
    let script = stdout_of(&["completions", "bash"]);
    // Every subcommand `xlb --help` lists has its case in the script (`xlb,run)`), as clap's
    // generator writes it: a bare `contains("run")` held for any script.
    let subs = listed_subcommands();
    assert!(subs.len() >= 10 && subs.iter().any(|s| s == "cleanup"), "xlb --help lists {subs:?}");
    for sub in &subs {
        assert!(script.contains(&format!("xlb,{sub})")), "{sub} missing from\n{script}");
    }
    assert!(script.contains("--admin-socket") && script.contains("--takeover"), "{script}");
    let path = std::env::temp_dir().join(format!("xlb-completion-{}.bash", std::process::id()));
    std::fs::write(&path, &script).expect("write script");
    let syntax = Command::new("bash").arg("-n").arg(&path).output().expect("bash runs");
    let _ = std::fs::remove_file(&path);
    assert!(syntax.status.success(), "bash -n: {}", String::from_utf8_lossy(&syntax.stderr));
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        assert!(stdout_of(&["completions", shell]).contains("xlb"), "{shell}");
    }
    assert!(!xlb(&["completions", "tcsh"]).status.success(), "an unknown shell is an error");
}

#[test]
fn man_pages_cover_the_command_and_every_subcommand() {
    let page = stdout_of(&["man"]);
    assert!(page.contains(".TH xlb 1"), "{page}");
    assert!(page.contains(&format!("commit {}", env!("XLB_COMMIT"))), "the version line names the commit: {page}");
    let dir = std::env::temp_dir().join(format!("xlb-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let out = xlb(&["man", "--dir", dir.to_str().expect("utf-8 path")]);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let check = std::fs::read_to_string(dir.join("xlb-check.1")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    names.sort();
    // One page per subcommand that `xlb --help` lists, nested ones included.
    let mut want: Vec<String> = listed_subcommands()
        .iter()
        .map(|c| format!("xlb-{c}.1"))
        .chain(["xlb.1".to_owned(), "xlb-trace-flow.1".to_owned()])
        .collect();
    want.sort();
    assert!(want.len() >= 10, "subcommands from --help: {want:?}");
    assert_eq!(names, want);
    assert!(check.contains("\\-\\-config"), "xlb-check(1) documents --config: {check}");
    let missing = xlb(&["man", "--dir", "/nonexistent/xlb-man"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/xlb-man"));
}
