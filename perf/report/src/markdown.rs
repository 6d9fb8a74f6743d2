//! `latest.md`: the report as Markdown tables.

use std::fmt::Write as _;

use crate::summary::Report;
use crate::{PATHS, path_name};

fn mpps(x: f64) -> String {
    format!("{x:.3}")
}

fn ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "–".into(), |r| format!("{r:.2}×"))
}

/// Renders the report as Markdown.
#[must_use]
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# xlb packet rate and connection rate vs kube-proxy ({})\n", r.date);
    let _ = writeln!(
        o,
        "Commit `{}` · kernel {} · {} · {} CPUs · command: `{}`\n",
        r.commit, r.machine.kernel, r.machine.cpu_model, r.machine.nproc, r.command
    );
    if let Some(s) = r.settings.as_object() {
        let items: Vec<String> = s
            .iter()
            .filter(|(_, v)| !v.is_object() && !v.is_array())
            .map(|(k, v)| {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                format!("| {k} | {} |", v.replace('|', "\\|"))
            })
            .collect();
        if !items.is_empty() {
            let _ = writeln!(o, "<details><summary>Settings</summary>\n\n| setting | value |\n|---|---|");
            let _ = writeln!(o, "{}\n\n</details>\n", items.join("\n"));
        }
    }
    if let Some(l) = r.host_load1 {
        // the benchmark itself keeps about 2-3 tasks runnable (generator, forwarder, softirqs)
        let warn = if l.max > 3.5 {
            " **Other work shared the CPUs during some trials (the bench alone keeps the load near 2–3): \
             treat min–max spreads and ratios with care.**"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "Host load (1-min average at the end of each trial): median {:.2}, min {:.2}, max {:.2}.{warn}\n",
            l.median, l.min, l.max
        );
    }
    let _ = writeln!(o, "Paths:\n");
    for (id, name, desc) in PATHS {
        let _ = writeln!(o, "- **{id} = {name}**: {desc}");
    }
    let _ = writeln!(o, "\n## Forwarded packet rate (Mpps, median [min–max] over repeats, offered load = maximum)\n");
    let ids: Vec<&str> = PATHS.iter().map(|p| p.0).collect();
    let _ = write!(o, "| profile |");
    for id in &ids {
        let _ = write!(o, " {id} {} |", path_name(id));
    }
    let _ = writeln!(o, " xlb / ceiling | xlb / testpmd | xlb / nftables | xlb / iptables |");
    let _ = writeln!(o, "|---|{}---|---|---|---|", "---|".repeat(ids.len()));
    for (name, p) in &r.profiles.0 {
        let _ = write!(o, "| `{name}` |");
        for id in &ids {
            match p.paths.get(id).filter(|f| f.n > 0) {
                Some(f) => {
                    let _ = write!(o, " {} [{}–{}] |", mpps(f.median_mpps), mpps(f.min_mpps), mpps(f.max_mpps));
                }
                None => {
                    let _ = write!(o, " – |");
                }
            }
        }
        let _ = writeln!(
            o,
            " {} | {} | {} | {} |",
            ratio(p.xlb_over_ceiling),
            ratio(p.xlb_over_testpmd),
            ratio(p.xlb_over_nftables),
            ratio(p.xlb_over_iptables)
        );
    }

    // offered load and loss, so a reader sees when the generator (not the path) was the limit
    let _ = writeln!(o, "\nOffered (tx) median Mpps / median loss:\n");
    let _ = write!(o, "| profile |");
    for id in &ids {
        let _ = write!(o, " {id} {} |", path_name(id));
    }
    let _ = writeln!(o, "\n|---|{}", "---|".repeat(ids.len()));
    for (name, p) in &r.profiles.0 {
        let _ = write!(o, "| `{name}` |");
        for id in &ids {
            let cell = p.paths.get(id).filter(|f| f.n > 0).map_or_else(
                || "–".to_string(),
                |f| {
                    let tx = f.tx_median_mpps.map_or_else(|| "?".into(), mpps);
                    let loss = f.loss_median.map_or_else(|| "?".into(), |l| format!("{:.1}%", l * 100.0));
                    format!("{tx} / {loss}")
                },
            );
            let _ = write!(o, " {cell} |");
        }
        let _ = writeln!(o);
    }

    let lat: Vec<_> =
        r.profiles.0.iter().filter(|(_, p)| p.paths.0.iter().any(|(_, f)| f.latency_p50_ns_median.is_some())).collect();
    if !lat.is_empty() {
        let _ = writeln!(o, "\nLatency at maximum load (median of per-trial p50 / p99, µs; includes queueing):\n");
        let _ = write!(o, "| profile |");
        for id in &ids {
            let _ = write!(o, " {id} {} |", path_name(id));
        }
        let _ = writeln!(o, "\n|---|{}", "---|".repeat(ids.len()));
        for (name, p) in lat {
            let _ = write!(o, "| `{name}` |");
            for id in &ids {
                let cell = p.paths.get(id).and_then(|f| Some((f.latency_p50_ns_median?, f.latency_p99_ns_median?)));
                match cell {
                    Some((a, b)) => {
                        let _ = write!(o, " {:.1} / {:.1} |", a / 1e3, b / 1e3);
                    }
                    None => {
                        let _ = write!(o, " – |");
                    }
                }
            }
            let _ = writeln!(o);
        }
    }

    let nd: Vec<_> =
        r.profiles.0.iter().filter(|(_, p)| p.paths.0.iter().any(|(_, f)| f.no_drop_mpps.is_some())).collect();
    if !nd.is_empty() {
        let _ = writeln!(
            o,
            "\n## No-drop rate (Mpps, loss < threshold, `xlb-pktgen search`), and p50 / p99 latency (µs) of a trial at that rate\n"
        );
        let _ = write!(o, "| profile |");
        for id in &ids {
            let _ = write!(o, " {id} {} |", path_name(id));
        }
        let _ = writeln!(o, "\n|---|{}", "---|".repeat(ids.len()));
        for (name, p) in nd {
            let _ = write!(o, "| `{name}` |");
            for id in &ids {
                let cell = p.paths.get(id).and_then(|f| {
                    let r = mpps(f.no_drop_mpps?);
                    Some(match (f.no_drop_latency_p50_ns, f.no_drop_latency_p99_ns) {
                        (Some(a), Some(b)) => format!("{r} ({:.1} / {:.1})", a / 1e3, b / 1e3),
                        _ => r,
                    })
                });
                let _ = write!(o, " {} |", cell.unwrap_or_else(|| "–".into()));
            }
            let _ = writeln!(o);
        }
    }

    let cross: Vec<_> = r.profiles.0.iter().filter(|(_, p)| !p.cross_check.is_empty()).collect();
    if !cross.is_empty() {
        let _ = writeln!(o, "\n## Cross-check with another generator (Mpps forwarded, median [min–max])\n");
        let _ = writeln!(o, "| profile | generator | path | other generator | xlb-pktgen |");
        let _ = writeln!(o, "|---|---|---|---|---|");
        for (name, p) in cross {
            for (g, per) in &p.cross_check.0 {
                for (id, st) in &per.0 {
                    let ours = p.paths.get(id).filter(|f| f.n > 0).map_or_else(
                        || "–".into(),
                        |f| format!("{} [{}–{}]", mpps(f.median_mpps), mpps(f.min_mpps), mpps(f.max_mpps)),
                    );
                    let _ = writeln!(
                        o,
                        "| `{name}` | {g} | {id} {} | {} [{}–{}] | {ours} |",
                        path_name(id),
                        mpps(st.median),
                        mpps(st.min),
                        mpps(st.max)
                    );
                }
            }
        }
    }

    let _ = writeln!(o, "\n## Connections per second (wrk, `Connection: close`, 32 connections, nginx backends)\n");
    if r.conn_per_s.paths.is_empty() {
        let _ = writeln!(o, "Not measured in this run.");
    } else {
        let _ = writeln!(o, "| path | median conn/s | min | max | trials | errors (median) |");
        let _ = writeln!(o, "|---|---|---|---|---|---|");
        for (id, c) in &r.conn_per_s.paths.0 {
            let _ = writeln!(
                o,
                "| {id} {} | {:.0} | {:.0} | {:.0} | {} | {} |",
                c.name,
                c.median,
                c.min,
                c.max,
                c.n,
                c.errors_median.map_or_else(|| "–".into(), |e| format!("{e:.0}"))
            );
        }
        let _ = writeln!(
            o,
            "\nxlb / nftables: {} · xlb / iptables: {}",
            ratio(r.conn_per_s.xlb_conn_over_nftables),
            ratio(r.conn_per_s.xlb_conn_over_iptables)
        );
    }

    if !r.failures.is_empty() {
        let _ = writeln!(o, "\n## Trials that produced no figure\n");
        for f in &r.failures {
            let _ = writeln!(o, "- path {} profile {} repeat {}: {}", f.path, f.profile, f.repeat, f.reason);
        }
    }
    let _ = writeln!(
        o,
        "\nHow to read: 2 vCPUs, veth pairs in copy mode (no zero-copy); the generator is pinned to CPU 0 \
         and the forwarder (xlb worker, xlb-macfwd, or the kernel via RPS) to CPU 1, but interrupts, \
         softirqs and the veth peers still share both cores. These figures compare paths on this machine; \
         they are not per-core capacity on a real NIC. On the kernel paths (c, d) the generator's \
         sends are held back by its socket send buffer while the forwarding CPU lags, so offered ≈ \
         forwarded and the figure is the path's capacity; on the AF_XDP paths (a, b) what the \
         forwarder cannot take is dropped at its RX ring, so loss > 0 there is expected. Raw trials: {}.",
        r.raw_files.join(", ")
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::parse_raw;
    use crate::summary::build_report;
    use crate::summary::tests::{RAW, input};

    #[test]
    fn tables_hold_medians_ranges_and_ratios() {
        let md = render(&build_report(&parse_raw(RAW).unwrap(), &input()));
        assert!(md.contains("| `udp64_1k` | 0.500 [0.480–0.520] | 0.400 [0.380–0.420] | 0.200 [0.190–0.210] | 0.145 [0.140–0.150] | – | 0.80× | – | 2.00× | 2.76× |"), "{md}");
        assert!(md.contains("| `syn64` | – | 0.300 [0.300–0.300] | – | – | – | – | – | – | – |"), "{md}");
        assert!(md.contains("| b xlb | 10000 | 9000 | 11000 | 2 | 1 |"), "{md}");
        assert!(md.contains("xlb / nftables: 2.00×"), "{md}");
        assert!(md.contains("| `udp64_1k` | trafgen | a macfwd | 0.450 [0.450–0.450] | 0.500 [0.480–0.520] |"), "{md}");
        assert!(md.contains("generator exited 1"));
        assert!(md.contains("abc1234"));
        assert!(
            md.contains("Host load (1-min average at the end of each trial): median 2.25, min 0.50, max 4.00."),
            "{md}"
        );
        assert!(md.contains("Other work shared the CPUs"));
    }
}
