#!/usr/bin/env bash
# `make image`: builds the xlb container image from deploy/Containerfile without a registry,
# then runs `xlb --version` and `xlb check --config` inside it.
#
# 1. Two Debian 12 root filesystems made with mmdebstrap from the Debian mirror and imported
#    into podman's local storage: localhost/xlb-runtime-base:bookworm (libc6, libgcc-s1,
#    libelf1, zlib1g, ethtool and their dependencies: about 15 MB) and
#    localhost/xlb-builder-base:bookworm (the build packages of scripts/install-deps.sh).
#    Rebuilt when missing, or always with XLB_IMAGE_REBASE=1.
# 2. `podman build`: the build stage installs the pinned Rust toolchain with rustup and runs
#    `cargo build --release --locked -p xlb` (network: rustup and crates.io); the runtime
#    stage copies the binary, its man pages and its bash completion onto the runtime base.
# 3. `podman run` of `xlb --version` (must name HEAD's commit) and of `xlb check` on
#    deploy/examples/testbed.yaml.
#
# Environment: XLB_IMAGE (default localhost/xlb:<crate version>), DEBIAN_MIRROR (default
# http://deb.debian.org/debian), PODMAN_RUNTIME (default runc: crun 1.8 of Debian 12 refuses
# hosts with hybrid cgroups).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image=${XLB_IMAGE:-localhost/xlb:$version}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
runtime=${PODMAN_RUNTIME:-runc}
commit=$(git rev-parse --short=12 HEAD)
# podman asks the runtime for RLIMIT_NOFILE 1048576 whatever --ulimit host says (podman
# 4.3); a host whose root lacks CAP_SYS_RESOURCE refuses that, so ask for this shell's own
# open-file limit, and for at most 32768 processes (on the 2-core VM the runtime was refused
# anything above 32768, 2026-11-25).
nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
limits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$nproc:$nproc")
pod() { podman --runtime "$(command -v "$runtime" || echo "$runtime")" "$@"; }

work=$(mktemp -d /tmp/xlb-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

base() { # NAME VARIANT PACKAGES [MMDEBSTRAP OPTIONS...]
    local name=$1 variant=$2 pkgs=$3
    shift 3
    if [ "${XLB_IMAGE_REBASE:-0}" != 1 ] && podman image exists "$name"; then
        echo "== $name: present (XLB_IMAGE_REBASE=1 rebuilds it)"
        return
    fi
    echo "== $name: mmdebstrap --variant=$variant bookworm ($pkgs)"
    mmdebstrap --quiet --variant="$variant" --include="$pkgs" "$@" bookworm "$work/rootfs.tar" "$mirror"
    podman import --quiet "$work/rootfs.tar" "$name" >/dev/null
    rm -f "$work/rootfs.tar"
}
base localhost/xlb-runtime-base:bookworm extract libc6,libgcc-s1,libelf1,zlib1g,ethtool
# The build stage downloads rustup and crates over TLS, so the builder trusts the host's CA
# bundle (a host behind a TLS-inspecting proxy has the proxy's CA there; this VM does). Only
# the build stage has it: the runtime stage copies nothing but xlb's files.
base localhost/xlb-builder-base:bookworm apt \
    ca-certificates,curl,clang,llvm,libelf-dev,zlib1g-dev,pkg-config,m4,make,gcc,libc6-dev,libclang-dev,libpcap-dev,linux-libc-dev \
    --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs'

echo "== podman build $image (commit $commit)"
pod build --network=host "${limits[@]}" --build-arg "XLB_COMMIT=$commit" \
    -f deploy/Containerfile -t "$image" .

echo "== prove: xlb --version and xlb check inside $image"
got=$(pod run --rm --network=none "${limits[@]}" "$image" --version)
echo "$got"
[ "$got" = "xlb $version (commit $commit)" ] || { echo "expected: xlb $version (commit $commit)" >&2; exit 1; }
pod run --rm --network=none "${limits[@]}" -v "$root/deploy/examples:/etc/xlb:ro" "$image" \
    check --config /etc/xlb/testbed.yaml >"$work/check.txt"
head -3 "$work/check.txt"
grep -q '^TCP  10.250.100.1:80 ' "$work/check.txt" || { echo "xlb check inside the image printed no table" >&2; exit 1; }
podman image inspect --format '{{.Size}}' "$image" | awk '{printf "== %s: %.1f MB\n", "'"$image"'", $1 / 1e6}'
