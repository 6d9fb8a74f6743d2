//! Compiles the steering XDP program `xdp/steer.c` into `$OUT_DIR/steer.o` with clang.
//!
//! Command: `clang -O2 -g -Wall -target bpf -I/usr/include/<multiarch> -c xdp/steer.c`.
//! `-g` keeps BTF, which aya needs for the BTF-defined maps (`SEC(".maps")`).
//! Set `CLANG` to use another clang binary. Packages: clang and linux-libc-dev (Debian), which
//! `scripts/install-deps.sh build` installs.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let src = "xdp/steer.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out_dir.join("steer.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());

    // <asm/types.h> lives in the multiarch include directory on Debian.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        other => panic!("nic-config: no multiarch include directory known for target arch {other}"),
    };

    let output = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-Wextra", "-target", "bpf"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(&obj)
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "nic-config: `{clang}` not found. clang compiles the XDP program {src}. \
             Install the build packages with `sudo scripts/install-deps.sh build` \
             (Debian packages clang and linux-libc-dev), or set CLANG to a clang binary."
        ),
        Err(e) => panic!("nic-config: could not run `{clang}`: {e}"),
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        panic!(
            "nic-config: `{clang} -target bpf` failed on {src} ({}):\n{stderr}\n\
             Missing headers? Run `sudo scripts/install-deps.sh build`.",
            output.status
        );
    }
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo:warning={line}");
    }
}
