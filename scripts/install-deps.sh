#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the demo need.
# Idempotent: packages already present are skipped by apt-get.
# Usage: scripts/install-deps.sh [build|test|demo|bench|image]   (default: test)
set -euo pipefail
what=${1:-test}
export DEBIAN_FRONTEND=noninteractive
# build: clang/llvm compile the XDP program and run bindgen (libxdp-sys);
# libelf/zlib/m4/pkg-config are needed by the vendored libxdp/libbpf build.
pkgs=(clang llvm libelf-dev zlib1g-dev pkg-config m4 make gcc libclang-dev)
# xsk-rs -> libxdp-sys runs xdp-tools' configure, which stops without libpcap headers
pkgs+=(libpcap-dev)
case "$what" in
  build) ;;
  # make image: root filesystems from the Debian mirror, podman to build and run the image
  # (runc: Debian 12's crun refuses hosts with hybrid cgroups)
  image) pkgs+=(mmdebstrap podman runc) ;;
  test|demo|bench)
    # testbed and end-to-end tests: namespaces, veth, offloads, servers and clients
    pkgs+=(iproute2 ethtool iputils-ping curl nftables nginx-light socat wrk valgrind)
    # perf/cpbench's tests load the generated kube-proxy rulesets with nft and iptables-restore
    pkgs+=(iptables)
    # tests/tests/bird.rs and the ECMP testbed: BIRD 2 daemons (bird, birdc) in namespaces.
    # The package also enables a system `bird` service; the tests run their own daemons with
    # their own sockets and never use or stop it.
    pkgs+=(bird2)
    # tests/tests/l2.rs: ARP requests from the client to the VIP (L2 announcement);
    # tests/tests/l2_failover.rs also captures the replies and take-over frames with tcpdump
    pkgs+=(iputils-arping tcpdump) ;;
  *) echo "unknown target: $what" >&2; exit 2 ;;
esac
# tests/tests/dashboard.rs: promtool checks and unit-tests deploy/prometheus/, and the test's
# own prometheus (never the package's service, which it neither needs nor touches) scrapes xlb
[ "$what" = test ] && pkgs+=(prometheus)
# make bench: trafgen (netsniff-ng), jq for the raw results, conntrack -F between paths, the
# report's font (plotters draws its text with DejaVu Sans), perf for profiles
[ "$what" = bench ] && pkgs+=(netsniff-ng linux-perf jq conntrack fonts-dejavu-core)
# make bench path e: a second AF_XDP ceiling not written by us, DPDK's testpmd on the AF_XDP
# PMD (Debian 12: dpdk-testpmd is in dpdk-dev, the PMD in librte-net-af-xdp23)
[ "$what" = bench ] && pkgs+=(dpdk-dev librte-net-af-xdp23)
# nic-config tests: bpftool shows that no XDP program or map of ours remains after detach;
# make bench-steer (perf/steer/run.sh) runs the steering program with `bpftool prog run`
[ "$what" != build ] && [ "$what" != image ] && pkgs+=(bpftool)
# deploy/testbed.sh: sysctl (procps), tc/ss (iproute2), uapi headers for its BPF DSR decap
[ "$what" != build ] && [ "$what" != image ] && pkgs+=(procps linux-libc-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then echo "need root to install: ${missing[*]}" >&2; exit 1; fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
