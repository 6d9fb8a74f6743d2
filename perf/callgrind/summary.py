#!/usr/bin/env python3
"""Summary of `make bench-pipeline`: one `NAME VALUE UNIT` line per figure.

Usage: summary.py CRITERION_DIR BENCH_LOG CALLGRIND_TXT

- CRITERION_DIR: criterion's output directory (`<target>/criterion`); the time of each
  benchmark is the median of criterion's per-sample means
  (`<group>/<bench>/new/estimates.json`, `median.point_estimate`, in ns), which is robust
  against the other tenants of a shared 2-core VM.
- BENCH_LOG: the output of `cargo bench --bench pipeline`; its `fact: NAME VALUE UNIT`
  lines are copied (conntrack sizes, bytes per flow, allocations).
- CALLGRIND_TXT: the output of `perf/callgrind/run.sh` (already `NAME VALUE UNIT`).

Packet figures: `X_ns_per_packet` is the pipeline alone, i.e. the criterion loop minus its
copy-only baseline (the harness copying each frame into its buffer);
`X_with_copy_ns_per_packet` and `X_copy_ns_per_packet` are the two measured loops. Batch
figures (`batch_MIX_PROFILE_*`) are batches of 64 frames over 4,096 buffers at headroom 0;
the others are the old one-packet loop. Headline figures (issue 9) are printed first under
these exact names: batch_uniform_established_ns_per_packet,
batch_uniform_new_flow_ns_per_packet, batch_uniform_established_instructions_per_packet,
batch_uniform_new_flow_instructions_per_packet, conntrack_nat_flow_bytes.
Everything is printed on stdout; a missing input is reported on stderr and skipped.
"""

import json
import os
import sys


def median_ns(criterion_dir, group, bench):
    path = os.path.join(criterion_dir, group, bench, "new", "estimates.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)["median"]["point_estimate"]
    except (OSError, KeyError, ValueError) as e:
        print(f"summary: no estimate for {group}/{bench}: {e}", file=sys.stderr)
        return None


def fmt(v, digits=1):
    return f"{v:.{digits}f}"


HEADLINE = (
    "batch_uniform_established_ns_per_packet",
    "batch_uniform_new_flow_ns_per_packet",
    "batch_uniform_established_instructions_per_packet",
    "batch_uniform_new_flow_instructions_per_packet",
    "conntrack_nat_flow_bytes",
)


def packet_figures(crit, group, name, copy, prefix=""):
    full = median_ns(crit, group, name)
    base = median_ns(crit, group, copy)
    if full is None or base is None:
        return []
    return [
        f"{prefix}{name}_ns_per_packet {fmt(full - base)} ns",
        f"{prefix}{name}_with_copy_ns_per_packet {fmt(full)} ns",
        f"{prefix}{name}_copy_ns_per_packet {fmt(base)} ns",
    ]


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    crit, log, cg = sys.argv[1:]
    lines = []

    for mix in ("uniform", "zipf", "hot"):
        for profile, copy in (("established", "copy_dnat"), ("snat_reply", "copy_snat"), ("dsr_ipip", "copy_dsr")):
            lines += packet_figures(crit, "batch", f"{mix}_{profile}", copy, "batch_")
    lines += packet_figures(crit, "batch", "uniform_new_flow", "copy_new", "batch_")
    lines += packet_figures(crit, "batch", "uniform_established6", "copy_dnat6", "batch_")
    lines += packet_figures(crit, "batch", "uniform_new_flow6", "copy_new6", "batch_")

    for name in ("established", "established_hot", "new_flow", "uniform_established"):
        lines += packet_figures(crit, "pipeline", name, f"{name}_copy_only", "single_" if name == "uniform_established" else "")

    try:
        with open(cg, encoding="utf-8") as f:
            lines += [l.strip() for l in f if len(l.split()) == 3]
    except OSError as e:
        print(f"summary: no callgrind figures: {e}", file=sys.stderr)

    for bench in ("maglev_build_100", "maglev_build_1000", "table_publish", "conntrack_sweep_step"):
        ns = median_ns(crit, "pipeline_tables", bench)
        if ns is not None:
            lines.append(f"{bench}_ms {fmt(ns / 1e6, 3)} ms")

    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines += [l[len("fact: "):].strip() for l in f if l.startswith("fact: ")]
    except OSError as e:
        print(f"summary: no bench log: {e}", file=sys.stderr)

    facts = {l.split()[0]: l.split()[1] for l in lines}
    # The sweep runs once per sweep interval: its share of one worker's time.
    if "conntrack_sweep_step_ms" in facts and "conntrack_sweep_interval_ms" in facts:
        share = 100 * float(facts["conntrack_sweep_step_ms"]) / float(facts["conntrack_sweep_interval_ms"])
        lines.append(f"conntrack_sweep_worker_time_pct {fmt(share)} %")
    # What batching buys, measured in the same run: the old one-packet loop over the same
    # stream against the batch (wall clock and instructions).
    for a, b, name, unit in (
        ("single_uniform_established_ns_per_packet", "batch_uniform_established_ns_per_packet", "single_over_batch_uniform_established_time_ratio", "x"),
        ("single_uniform_established_instructions_per_packet", "batch_uniform_established_instructions_per_packet", "single_over_batch_uniform_established_instructions_ratio", "x"),
        ("new_flow_ns_per_packet", "batch_uniform_new_flow_ns_per_packet", "single_over_batch_new_flow_time_ratio", "x"),
        ("single_uniform_new_flow_instructions_per_packet", "batch_uniform_new_flow_instructions_per_packet", "single_over_batch_new_flow_instructions_ratio", "x"),
    ):
        if a in facts and b in facts and float(facts[b]) > 0:
            lines.append(f"{name} {fmt(float(facts[a]) / float(facts[b]), 2)} {unit}")

    head = [l for h in HEADLINE for l in lines if l.split()[0] == h]
    for l in head:
        print(l)
    if head:
        print("--")
    for l in lines:
        if l not in head:
            print(l)
    return 0


if __name__ == "__main__":
    sys.exit(main())
