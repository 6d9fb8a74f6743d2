# xlb — see README.md. Every target installs the Debian packages it needs first.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test lint deps

deps:
	bash scripts/install-deps.sh test

## The whole test suite (CI runs this as root: namespace tests run for real).
test: deps lint
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

.PHONY: demo build-release
build-release:
	bash scripts/install-deps.sh demo
	$(CARGO) build --release -p xlb

## The main job: real traffic through xlb on the namespace testbed (needs root).
demo: build-release
	bash deploy/demo.sh

## Scale-out: one VIP behind three xlb nodes, each announcing it over BGP through its own
## BIRD 2; a router spreads the client's flows over them with ECMP (needs root).
.PHONY: demo-ecmp
demo-ecmp: build-release
	bash deploy/demo-ecmp.sh

## Pipeline benchmarks (issue 2): criterion (1,000 VIPs, 10,000 backends, 1,000,000 flows),
## then instructions per packet under callgrind, then the batch times of a SYN flood into a
## full 1,048,576-flow table during an expiry wave (`callgrind-pipeline jitter`); ends with
## one `NAME VALUE UNIT` line per figure. About 5 minutes on the 2-core VM. See
## docs/benchmarks.md.
BENCH_TARGET = $(or $(CARGO_TARGET_DIR),target)
BENCH_OUT = $(BENCH_TARGET)/xlb-bench
.PHONY: bench-pipeline
bench-pipeline:
	bash scripts/install-deps.sh bench
	mkdir -p $(BENCH_OUT)
	set -o pipefail; $(CARGO) bench -p dataplane --bench pipeline 2>&1 | tee $(BENCH_OUT)/criterion.log
	set -o pipefail; bash perf/callgrind/run.sh $(BENCH_OUT) | tee $(BENCH_OUT)/callgrind.txt
	set -o pipefail; JITTER_CAPACITY=1048576 JITTER_START_MS=62500 $(BENCH_TARGET)/release/callgrind-pipeline jitter syn_flood uniform 30000 2>&1 | tee $(BENCH_OUT)/jitter.txt
	@echo "== bench-pipeline summary (commit $$(git rev-parse --short HEAD 2>/dev/null)) =="
	@python3 perf/callgrind/summary.py $(BENCH_TARGET)/criterion $(BENCH_OUT)/criterion.log $(BENCH_OUT)/callgrind.txt
	@grep -E '^syn_flood_' $(BENCH_OUT)/jitter.txt

## The steering XDP program's cost per frame (ns, BPF_PROG_TEST_RUN through `bpftool prog
## run`) for a service's packet, SNAT and DNAT replies, the node's own traffic (IPv4 and IPv6)
## and a non-IP frame; STEER_BASE=REV measures revision REV's program in the same run,
## STEER_L2=1 the same frames in L2 mode. Needs root; seconds.
.PHONY: bench-steer
bench-steer:
	bash scripts/install-deps.sh bench
	bash perf/steer/run.sh

## Side-by-side packet and connection rates (issue 5): the AF_XDP ceiling (xlb-macfwd), xlb,
## kube-proxy's nftables and iptables rulesets for the same Services, driven by xlb-pktgen
## (and trafgen as a cross-check) on the two-armed namespace testbed; then the control-plane
## scale benchmark. Needs root and a quiet machine; about 25 minutes. Results:
## perf/results/latest.{json,md,png} plus dated copies; see docs/benchmarks.md.
.PHONY: bench bench-cp
bench:
	bash scripts/install-deps.sh bench
	BENCH_COMMAND="make bench" bash perf/bench/run.sh
	$(CARGO) build --release -p xlb-perf --bin xlb-pktgen
	set -o pipefail; PKTGEN=$(BENCH_TARGET)/release/xlb-pktgen ROUNDS=5 bash perf/bench/pktgen-vs-trafgen.sh \
		| tee perf/results/pktgen-vs-trafgen-latest.txt
	$(MAKE) bench-cp

## Control-plane scale: 10,000 Services x 10 endpoints and 1,000 x 100 (build time, memory,
## one change to published tables) next to `nft -f` of kube-proxy's ruleset.
bench-cp:
	bash scripts/install-deps.sh bench
	$(CARGO) build --release -p xlb-cpbench
	mkdir -p perf/results
	set -o pipefail; $(BENCH_TARGET)/release/xlb-cpbench --json | tee perf/results/cpbench-latest.json

## The reliability suite (issue 11): every scenario of tests/tests/chaos.rs in its full size
## (20 hand-overs under 200 streams and wrk, kill -9 under streams, 60 s of endpoint churn,
## a 60 s SYN flood from a release build of xlb-pktgen into full conntrack tables, 100 bad
## reloads, a 10-minute soak), one after another; about 17 minutes, needs root. The
## test suite runs the same scenarios in a short form. Each prints one `chaos:` line, collected
## in $(BENCH_TARGET)/xlb-chaos/results.txt (docs/reliability.md).
.PHONY: chaos
chaos:
	bash scripts/install-deps.sh test
	$(CARGO) build -p xlb
	$(CARGO) build --release -p xlb-perf --bin xlb-pktgen
	mkdir -p $(BENCH_TARGET)/xlb-chaos
	set -o pipefail; XLB_CHAOS=full XLB_PKTGEN=$(abspath $(BENCH_TARGET))/release/xlb-pktgen $(CARGO) test -p xlb-e2e --test chaos -- --test-threads=1 --nocapture 2>&1 \
		| tee $(BENCH_TARGET)/xlb-chaos/log.txt
	grep '^chaos:' $(BENCH_TARGET)/xlb-chaos/log.txt | tee $(BENCH_TARGET)/xlb-chaos/results.txt

## Fuzzing (issues 2 and 11): FUZZ_RUNS executions (default 10 million, about 25-50 minutes on
## one core of the 2-core VM) of the `pipeline` target of dataplane/fuzz, which checks the
## pipeline's invariants after every packet (docs/benchmarks.md, "Fuzzing"); new inputs go
## to $(BENCH_TARGET)/xlb-fuzz/pipeline, then the ones that add coverage are merged into the
## checked-in corpus. Installs the nightly toolchain and cargo-fuzz if they are missing.
FUZZ_RUNS ?= 10000000
.PHONY: fuzz
fuzz:
	bash scripts/install-deps.sh test
	rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	$(CARGO) +nightly fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	mkdir -p $(abspath $(BENCH_TARGET))/xlb-fuzz/pipeline
	cd dataplane/fuzz && $(CARGO) +nightly fuzz run -s none pipeline $(abspath $(BENCH_TARGET))/xlb-fuzz/pipeline corpus/pipeline -- \
		-max_len=2048 -runs=$(FUZZ_RUNS) -print_final_stats=1
	cd dataplane/fuzz && $(CARGO) +nightly fuzz run -s none pipeline corpus/pipeline $(abspath $(BENCH_TARGET))/xlb-fuzz/pipeline -- -merge=1 -max_len=2048

## Container image (issue 13): deploy/Containerfile built with podman from Debian 12 root
## filesystems made by mmdebstrap (no registry), then `xlb --version` and `xlb check` run
## inside it. Builds xlb in release inside the build stage: about 10 minutes on the 2-core VM
## the first time (2026-11-25), less later (cache mounts for the registry and target/).
## Tag: $$XLB_IMAGE, default localhost/xlb:<version>. docs/operations.md.
.PHONY: image
image:
	bash scripts/install-deps.sh image
	bash deploy/image/build.sh
