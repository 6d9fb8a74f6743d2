#!/usr/bin/env python3
"""Summary of `make bench-pipeline` (issue 2): one `NAME VALUE UNIT` line per figure.

Usage: summary.py CRITERION_DIR BENCH_LOG CALLGRIND_TXT

- CRITERION_DIR: criterion's output directory (`<target>/criterion`); the time of each
  benchmark is the median of criterion's per-sample means
  (`<group>/<bench>/new/estimates.json`, `median.point_estimate`, in ns), which is robust
  against the other tenants of a shared 2-core VM.
- BENCH_LOG: the output of `cargo bench --bench pipeline`; its `fact: NAME VALUE UNIT`
  lines are copied (conntrack entry sizes, bytes per flow, allocations).
- CALLGRIND_TXT: the output of `perf/callgrind/run.sh` (already `NAME VALUE UNIT`).

Packet figures: `X_ns_per_packet` is the pipeline alone, i.e. criterion's `X` loop minus
its `X_copy_only` baseline (the 64-byte template copy every measured packet starts with);
`X_with_copy_ns_per_packet` and `X_copy_ns_per_packet` are the two measured loops.
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


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    crit, log, cg = sys.argv[1:]
    lines = []

    for name in ("established", "established_hot", "new_flow"):
        full = median_ns(crit, "pipeline", name)
        copy = median_ns(crit, "pipeline", f"{name}_copy_only")
        if full is None or copy is None:
            continue
        lines.append(f"{name}_ns_per_packet {fmt(full - copy)} ns")
        lines.append(f"{name}_with_copy_ns_per_packet {fmt(full)} ns")
        lines.append(f"{name}_copy_ns_per_packet {fmt(copy)} ns")

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

    # The sweep runs once per sweep interval: its share of one worker's time.
    facts = {l.split()[0]: l.split()[1] for l in lines}
    if "conntrack_sweep_step_ms" in facts and "conntrack_sweep_interval_ms" in facts:
        share = 100 * float(facts["conntrack_sweep_step_ms"]) / float(facts["conntrack_sweep_interval_ms"])
        lines.append(f"conntrack_sweep_worker_time_pct {fmt(share)} %")

    for l in lines:
        print(l)
    return 0


if __name__ == "__main__":
    sys.exit(main())
