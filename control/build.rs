//! Build script of the `xlb` binary: stamps the commit it was built from into
//! `XLB_COMMIT` (`xlb --version`), and into `XLB_COMMIT_SOURCE` where that came from.
//!
//! `$XLB_COMMIT` set in the build environment wins (image builds from a source tarball);
//! otherwise `git rev-parse --short=12 HEAD` in the source tree (the commit checked out when
//! the crate was built; uncommitted changes are not marked); `unknown` without git.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=XLB_COMMIT");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut source = "git";
    let commit = if let Ok(c) = std::env::var("XLB_COMMIT") {
        source = "env";
        c
    } else if let Some(head) = git(dir, &["rev-parse", "--short=12", "HEAD"]) {
        // Rebuild when HEAD moves: a checkout rewrites HEAD, a commit the branch's ref file
        // (packed refs: `packed-refs`). Only existing files are watched: Cargo reruns a build
        // script on every build while a watched file is missing.
        let branch = git(dir, &["symbolic-ref", "-q", "HEAD"]);
        for p in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
            if let Some(path) = git(dir, &["rev-parse", "--git-path", p]).map(|x| dir.join(x))
                && path.exists()
            {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        head
    } else {
        source = "none";
        "unknown".to_owned()
    };
    println!("cargo:rustc-env=XLB_COMMIT={commit}");
    // Where it came from (`env`, `git`, `none`), for the test that checks it against HEAD.
    println!("cargo:rustc-env=XLB_COMMIT_SOURCE={source}");
}
