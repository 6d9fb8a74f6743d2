//! Figures and ratios computed from the raw records: the content of `latest.json`.

use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::Value;

use crate::raw::RawRecord;
use crate::{MAIN_GENERATOR, PATHS, PROFILES, path_name};

/// Minimum, median and maximum of a set of figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// How many figures.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// Median (mean of the two middle figures when `n` is even).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Stats {
    /// Statistics of `values` (NaNs ignored); `None` when there is none.
    #[must_use]
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Self { n, min: v[0], median, max: v[n - 1] })
    }

    /// The same statistics with every figure multiplied by `k` (e.g. 1e-6 for pps → Mpps).
    #[must_use]
    pub fn scaled(self, k: f64) -> Self {
        Self { n: self.n, min: self.min * k, median: self.median * k, max: self.max * k }
    }
}

/// A JSON object whose keys keep insertion order (paths a..d, profiles in run order).
#[derive(Debug, Clone, PartialEq)]
pub struct OrderedMap<T>(pub Vec<(String, T)>);

impl<T> Default for OrderedMap<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> OrderedMap<T> {
    /// The value under `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&T> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// Whether there is no entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Serialize> Serialize for OrderedMap<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// The machine the figures were measured on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// CPU model name from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Online CPUs.
    pub nproc: usize,
}

impl Machine {
    /// Reads the running machine's facts (empty strings when unreadable).
    #[must_use]
    pub fn detect() -> Self {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_default();
        let nproc = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
        Self { kernel, cpu_model, nproc }
    }
}

/// What the report needs besides the raw records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportInput {
    /// UTC date and time of the run, `YYYY-MM-DDTHH:MMZ`.
    pub date: String,
    /// Short commit of the tree that was measured.
    pub commit: String,
    /// The exact command that produced the run.
    pub command: String,
    /// Machine facts.
    pub machine: Machine,
    /// Raw files read, for reference.
    pub raw_files: Vec<String>,
}

/// One path's figures for one profile (packet rates in Mpps).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathFigures {
    /// Short path name (`xlb`, `nftables`…).
    pub name: String,
    /// Trials.
    pub n: usize,
    /// Smallest forwarded rate, Mpps.
    pub min_mpps: f64,
    /// Median forwarded rate, Mpps: the figure.
    pub median_mpps: f64,
    /// Largest forwarded rate, Mpps.
    pub max_mpps: f64,
    /// Median offered rate, Mpps.
    pub tx_median_mpps: Option<f64>,
    /// Median loss fraction (1 - rx/tx as the generator reports it).
    pub loss_median: Option<f64>,
    /// Median over trials of the p50 latency, ns (at max offered load: queueing included).
    pub latency_p50_ns_median: Option<f64>,
    /// Median over trials of the p99 latency, ns.
    pub latency_p99_ns_median: Option<f64>,
    /// Highest rate with loss under the threshold (`search`), Mpps, when searched.
    pub no_drop_mpps: Option<f64>,
    /// p50 latency, ns, of a trial at the no-drop rate (no queueing to speak of: the
    /// forwarder's own latency, unlike [`PathFigures::latency_p50_ns_median`]).
    pub no_drop_latency_p50_ns: Option<f64>,
    /// p99 latency, ns, of a trial at the no-drop rate.
    pub no_drop_latency_p99_ns: Option<f64>,
}

/// Figures of one profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileSummary {
    /// What the profile sends.
    pub description: String,
    /// Per path (`a`..`d`), from the main generator (xlb-pktgen).
    pub paths: OrderedMap<PathFigures>,
    /// median xlb / median macfwd (path b / path a).
    pub xlb_over_ceiling: Option<f64>,
    /// no-drop rate of xlb / no-drop rate of macfwd (path b / path a), when both were searched.
    pub xlb_over_ceiling_no_drop: Option<f64>,
    /// median xlb / median nftables (path b / path c).
    pub xlb_over_nftables: Option<f64>,
    /// median xlb / median iptables (path b / path d).
    pub xlb_over_iptables: Option<f64>,
    /// median xlb / median DPDK testpmd on the AF_XDP PMD (path b / path e): the ceiling not
    /// written by us.
    pub xlb_over_testpmd: Option<f64>,
    /// The same profile driven by other generators (trafgen): generator → path → Mpps stats.
    pub cross_check: OrderedMap<OrderedMap<Stats>>,
}

/// One path's connections per second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpsFigures {
    /// Short path name.
    pub name: String,
    /// Trials.
    pub n: usize,
    /// Smallest, connections/s.
    pub min: f64,
    /// Median, connections/s.
    pub median: f64,
    /// Largest, connections/s.
    pub max: f64,
    /// Median of socket errors + non-2xx answers per trial, when reported.
    pub errors_median: Option<f64>,
}

/// Connections per second (wrk, one request per connection).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpsSummary {
    /// Per path.
    pub paths: OrderedMap<CpsFigures>,
    /// median xlb / median nftables.
    pub xlb_conn_over_nftables: Option<f64>,
    /// median xlb / median iptables.
    pub xlb_conn_over_iptables: Option<f64>,
}

/// A failed trial as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailureOut {
    /// Path id.
    pub path: String,
    /// Profile.
    pub profile: String,
    /// Repeat.
    pub repeat: u32,
    /// Why.
    pub reason: String,
}

/// Everything `latest.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Format tag of this document.
    pub schema: &'static str,
    /// UTC date and time of the run.
    pub date: String,
    /// Short commit measured.
    pub commit: String,
    /// The command that produced it.
    pub command: String,
    /// Machine facts.
    pub machine: Machine,
    /// Raw files the figures come from.
    pub raw_files: Vec<String>,
    /// Run settings from the raw file's `run` records (the last one wins).
    pub settings: Value,
    /// Units of the figures.
    pub units: OrderedMap<&'static str>,
    /// Path id → name and description.
    pub paths: OrderedMap<OrderedMap<String>>,
    /// Profile names in display order.
    pub profile_order: Vec<String>,
    /// Per profile.
    pub profiles: OrderedMap<ProfileSummary>,
    /// Connections per second.
    pub conn_per_s: CpsSummary,
    /// Trials that produced no figure.
    pub failures: Vec<FailureOut>,
    /// The host's 1-minute load average at the end of each trial (all kinds). The bench alone
    /// keeps it near 2–3 on the 2-CPU VM; well above that, other work shared the CPUs and the
    /// figures are unreliable.
    pub host_load1: Option<Stats>,
}

/// Rounds to `digits` decimals (keeps the JSON readable).
fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(a), Some(b)) if b > 0.0 => Some(round(a / b, 3)),
        _ => None,
    }
}

fn median_of(values: &[f64]) -> Option<f64> {
    Stats::of(values).map(|s| s.median)
}

/// Orders ids: the known ones first in their order, then the others as first seen.
fn ordered(known: &[&str], seen: &[String]) -> Vec<String> {
    let mut out: Vec<String> =
        known.iter().filter(|k| seen.iter().any(|s| s == *k)).map(|k| (*k).to_string()).collect();
    for s in seen {
        if !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

/// A profile's description; `NAME@PLACEMENT` (perf/bench/run.sh `BENCH_PLACEMENTS`) adds
/// where the receive work of the lb's ingress ran.
fn describe(prof: &str) -> String {
    let (base, placement) = prof.split_once('@').unwrap_or((prof, ""));
    let d = PROFILES.iter().find(|p| p.0 == base).map_or_else(String::new, |p| p.1.to_string());
    match placement {
        "" => d,
        "shared" => format!("{d}; ingress NAPI threaded and pinned to the forwarder's core"),
        "shared-rt" => format!(
            "{d}; ingress NAPI threaded and pinned to the forwarder's core, forwarders SCHED_FIFO (xlb realtimeWorkers, macfwd under chrt -f 1)"
        ),
        other => format!("{d}; placement {other}"),
    }
}

fn latency(v: Option<&Value>, key: &str) -> Option<f64> {
    v?.get(key)?.as_f64()
}

/// Computes the report from raw records.
#[must_use]
pub fn build_report(records: &[RawRecord], input: &ReportInput) -> Report {
    let mut settings = Value::Null;
    let mut trials = Vec::new();
    let mut cps = Vec::new();
    let mut searches = Vec::new();
    let mut failures = Vec::new();
    for r in records {
        match r {
            RawRecord::Run(v) => settings = v.clone(),
            RawRecord::Trial(t) => trials.push(t),
            RawRecord::Cps(c) => cps.push(c),
            RawRecord::Search(s) => searches.push(s),
            RawRecord::Failed(f) => failures.push(FailureOut {
                path: f.path.clone(),
                profile: f.profile.clone(),
                repeat: f.repeat,
                reason: f.reason.clone(),
            }),
        }
    }
    let loads: Vec<f64> =
        trials.iter().filter_map(|t| t.host_load1).chain(cps.iter().filter_map(|c| c.host_load1)).collect();
    let host_load1 = Stats::of(&loads).map(|s| Stats {
        n: s.n,
        min: round(s.min, 2),
        median: round(s.median, 2),
        max: round(s.max, 2),
    });
    let path_ids: Vec<&str> = PATHS.iter().map(|p| p.0).collect();
    let profile_ids: Vec<&str> = PROFILES.iter().map(|p| p.0).collect();
    let mut seen_profiles: Vec<String> = Vec::new();
    for p in trials.iter().map(|t| &t.profile).chain(searches.iter().map(|s| &s.profile)) {
        if !seen_profiles.contains(p) {
            seen_profiles.push(p.clone());
        }
    }
    let profile_order = ordered(&profile_ids, &seen_profiles);

    let mut profiles = OrderedMap::default();
    for prof in &profile_order {
        let mine: Vec<_> = trials.iter().filter(|t| &t.profile == prof).collect();
        let seen_paths: Vec<String> = mine.iter().map(|t| t.path.clone()).collect();
        let mut paths = OrderedMap::default();
        let mut cross: OrderedMap<OrderedMap<Stats>> = OrderedMap::default();
        let mut generators: Vec<String> = Vec::new();
        for t in &mine {
            if t.generator != MAIN_GENERATOR && !generators.contains(&t.generator) {
                generators.push(t.generator.clone());
            }
        }
        let search_paths: Vec<String> =
            searches.iter().filter(|s| &s.profile == prof).map(|s| s.path.clone()).collect();
        let all_paths: Vec<String> = seen_paths.iter().chain(search_paths.iter()).cloned().collect();
        for path in ordered(&path_ids, &all_paths) {
            let main: Vec<_> = mine.iter().filter(|t| t.path == path && t.generator == MAIN_GENERATOR).collect();
            // The best search of the path (several runs: the highest), with its latencies.
            let best = searches.iter().filter(|s| &s.profile == prof && s.path == path).fold(
                None,
                |m: Option<&crate::raw::SearchResult>, s| match m {
                    Some(m) if m.no_drop_pps >= s.no_drop_pps => Some(m),
                    _ => Some(s),
                },
            );
            let no_drop = best.map(|s| round(s.no_drop_pps * 1e-6, 6));
            let nd_p50 = best.and_then(|s| latency(s.latency_ns.as_ref(), "p50")).map(|x| round(x, 0));
            let nd_p99 = best.and_then(|s| latency(s.latency_ns.as_ref(), "p99")).map(|x| round(x, 0));
            let rx: Vec<f64> = main.iter().map(|t| t.rx_pps).collect();
            let Some(st) = Stats::of(&rx).map(|s| s.scaled(1e-6)) else {
                if no_drop.is_some() {
                    paths.0.push((
                        path.clone(),
                        PathFigures {
                            name: path_name(&path).to_string(),
                            n: 0,
                            min_mpps: 0.0,
                            median_mpps: 0.0,
                            max_mpps: 0.0,
                            tx_median_mpps: None,
                            loss_median: None,
                            latency_p50_ns_median: None,
                            latency_p99_ns_median: None,
                            no_drop_mpps: no_drop,
                            no_drop_latency_p50_ns: nd_p50,
                            no_drop_latency_p99_ns: nd_p99,
                        },
                    ));
                }
                continue;
            };
            let tx: Vec<f64> = main.iter().filter_map(|t| t.tx_pps).collect();
            let loss: Vec<f64> = main.iter().filter_map(|t| t.loss).collect();
            let p50: Vec<f64> = main.iter().filter_map(|t| latency(t.latency_ns.as_ref(), "p50")).collect();
            let p99: Vec<f64> = main.iter().filter_map(|t| latency(t.latency_ns.as_ref(), "p99")).collect();
            paths.0.push((
                path.clone(),
                PathFigures {
                    name: path_name(&path).to_string(),
                    n: st.n,
                    min_mpps: round(st.min, 6),
                    median_mpps: round(st.median, 6),
                    max_mpps: round(st.max, 6),
                    tx_median_mpps: median_of(&tx).map(|x| round(x * 1e-6, 6)),
                    loss_median: median_of(&loss).map(|x| round(x, 6)),
                    latency_p50_ns_median: median_of(&p50).map(|x| round(x, 0)),
                    latency_p99_ns_median: median_of(&p99).map(|x| round(x, 0)),
                    no_drop_mpps: no_drop,
                    no_drop_latency_p50_ns: nd_p50,
                    no_drop_latency_p99_ns: nd_p99,
                },
            ));
        }
        for g in &generators {
            let mut per = OrderedMap::default();
            for path in ordered(&path_ids, &seen_paths) {
                let rx: Vec<f64> =
                    mine.iter().filter(|t| t.path == path && &t.generator == g).map(|t| t.rx_pps).collect();
                if let Some(st) = Stats::of(&rx).map(|s| s.scaled(1e-6)) {
                    let st =
                        Stats { n: st.n, min: round(st.min, 6), median: round(st.median, 6), max: round(st.max, 6) };
                    per.0.push((path, st));
                }
            }
            cross.0.push((g.clone(), per));
        }
        let med = |id: &str| paths.get(id).filter(|p: &&PathFigures| p.n > 0).map(|p| p.median_mpps);
        let summary = ProfileSummary {
            description: describe(prof),
            xlb_over_ceiling: ratio(med("b"), med("a")),
            xlb_over_ceiling_no_drop: ratio(
                paths.get("b").and_then(|p: &PathFigures| p.no_drop_mpps),
                paths.get("a").and_then(|p: &PathFigures| p.no_drop_mpps),
            ),
            xlb_over_nftables: ratio(med("b"), med("c")),
            xlb_over_iptables: ratio(med("b"), med("d")),
            xlb_over_testpmd: ratio(med("b"), med("e")),
            paths,
            cross_check: cross,
        };
        profiles.0.push((prof.clone(), summary));
    }

    let cps_paths_seen: Vec<String> = cps.iter().map(|c| c.path.clone()).collect();
    let mut cps_paths = OrderedMap::default();
    for path in ordered(&path_ids, &cps_paths_seen) {
        let v: Vec<f64> = cps.iter().filter(|c| c.path == path).map(|c| c.requests_per_s).collect();
        let e: Vec<f64> = cps.iter().filter(|c| c.path == path).filter_map(|c| c.errors).collect();
        if let Some(st) = Stats::of(&v) {
            cps_paths.0.push((
                path.clone(),
                CpsFigures {
                    name: path_name(&path).to_string(),
                    n: st.n,
                    min: round(st.min, 1),
                    median: round(st.median, 1),
                    max: round(st.max, 1),
                    errors_median: median_of(&e),
                },
            ));
        }
    }
    let cmed = |id: &str| cps_paths.get(id).map(|p: &CpsFigures| p.median);
    let conn_per_s = CpsSummary {
        xlb_conn_over_nftables: ratio(cmed("b"), cmed("c")),
        xlb_conn_over_iptables: ratio(cmed("b"), cmed("d")),
        paths: cps_paths,
    };

    Report {
        schema: "xlb-bench-report/1",
        date: input.date.clone(),
        commit: input.commit.clone(),
        command: input.command.clone(),
        machine: input.machine.clone(),
        raw_files: input.raw_files.clone(),
        settings,
        units: OrderedMap(
            vec![
                ("*_mpps", "million packets per second; rx = forwarded frames counted at the sink"),
                ("conn_per_s", "HTTP requests per second with Connection: close = new TCP connections per second"),
                ("latency_*_ns", "nanoseconds, generator TX to sink RX, at maximum offered load"),
                ("xlb_over_*", "ratio of medians (xlb / other path)"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ),
        paths: OrderedMap(
            PATHS
                .iter()
                .map(|(id, name, desc)| {
                    (
                        (*id).to_string(),
                        OrderedMap(vec![("name".into(), (*name).into()), ("description".into(), (*desc).into())]),
                    )
                })
                .collect(),
        ),
        profile_order,
        profiles,
        conn_per_s,
        failures,
        host_load1,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::raw::parse_raw;

    pub(crate) fn input() -> ReportInput {
        ReportInput {
            date: "2025-01-02T03:04Z".into(),
            commit: "abc1234".into(),
            command: "bash perf/bench/run.sh".into(),
            machine: Machine { kernel: "6.1.0".into(), cpu_model: "Test CPU".into(), nproc: 2 },
            raw_files: vec!["raw.jsonl".into()],
        }
    }

    /// A small fixed raw set: udp64_1k on all four paths (3 repeats each, odd and even
    /// counts), trafgen on a and b, conn/s on b and c, one search, one failure.
    pub(crate) const RAW: &str = r#"
{"kind":"run","settings":{"repeats":3,"seconds":5}}
{"kind":"trial","path":"a","profile":"udp64_1k","repeat":1,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":500000,"loss":0.1667,"host_load1":0.5}
{"kind":"trial","path":"b","profile":"udp64_1k","repeat":1,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":400000,"latency_ns":{"p50":2000,"p99":9000}}
{"kind":"trial","path":"c","profile":"udp64_1k","repeat":1,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":200000}
{"kind":"trial","path":"d","profile":"udp64_1k","repeat":1,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":150000}
{"kind":"trial","path":"a","profile":"udp64_1k","repeat":2,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":520000,"loss":0.1333}
{"kind":"trial","path":"b","profile":"udp64_1k","repeat":2,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":380000,"latency_ns":{"p50":4000,"p99":11000}}
{"kind":"trial","path":"c","profile":"udp64_1k","repeat":2,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":210000}
{"kind":"trial","path":"d","profile":"udp64_1k","repeat":2,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":140000}
{"kind":"trial","path":"a","profile":"udp64_1k","repeat":3,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":480000}
{"kind":"trial","path":"b","profile":"udp64_1k","repeat":3,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":420000}
{"kind":"trial","path":"c","profile":"udp64_1k","repeat":3,"generator":"xlb-pktgen","tx_pps":600000,"rx_pps":190000}
{"kind":"trial","path":"a","profile":"udp64_1k","repeat":1,"generator":"trafgen","rx_pps":450000}
{"kind":"trial","path":"b","profile":"udp64_1k","repeat":1,"generator":"trafgen","rx_pps":350000}
{"kind":"trial","path":"b","profile":"syn64","repeat":1,"generator":"xlb-pktgen","tx_pps":500000,"rx_pps":300000}
{"kind":"cps","path":"b","repeat":1,"generator":"wrk","requests_per_s":9000,"errors":0}
{"kind":"cps","path":"b","repeat":2,"generator":"wrk","requests_per_s":11000,"errors":2}
{"kind":"cps","path":"c","repeat":1,"generator":"wrk","requests_per_s":5000,"host_load1":4.0}
{"kind":"cps","path":"c","repeat":2,"generator":"wrk","requests_per_s":4000}
{"kind":"cps","path":"c","repeat":3,"generator":"wrk","requests_per_s":6000}
{"kind":"search","path":"b","profile":"udp64_1k","no_drop_pps":250000}
{"kind":"failed","path":"d","profile":"udp64_1k","repeat":3,"reason":"generator exited 1"}
"#;

    #[test]
    fn the_best_search_of_a_path_keeps_its_latencies_and_gives_the_no_drop_ratio() {
        let raw = r#"
{"kind":"search","path":"a","profile":"udp64_1k@shared","no_drop_pps":400000,"latency_ns":{"p50":30000,"p99":90000}}
{"kind":"search","path":"b","profile":"udp64_1k@shared","no_drop_pps":200000,"latency_ns":{"p50":50000,"p99":70000}}
{"kind":"search","path":"b","profile":"udp64_1k@shared","no_drop_pps":300000,"latency_ns":{"p50":40000,"p99":80000}}
{"kind":"search","path":"c","profile":"udp64_1k@shared","no_drop_pps":100000}
"#;
        let r = build_report(&parse_raw(raw).unwrap(), &input());
        let p = r.profiles.get("udp64_1k@shared").unwrap();
        assert!(p.description.starts_with("UDP, 64 B frames, 1,000 flows; ingress NAPI threaded"), "{}", p.description);
        let b = p.paths.get("b").unwrap();
        assert_eq!(b.no_drop_mpps, Some(0.3), "the higher of two searches");
        assert_eq!((b.no_drop_latency_p50_ns, b.no_drop_latency_p99_ns), (Some(40000.0), Some(80000.0)));
        let c = p.paths.get("c").unwrap();
        assert_eq!((c.no_drop_mpps, c.no_drop_latency_p50_ns), (Some(0.1), None));
        assert_eq!(p.xlb_over_ceiling_no_drop, Some(0.75));
        let md = crate::markdown::render(&r);
        assert!(md.contains("0.300 (40.0 / 80.0)"), "{md}");
    }

    #[test]
    fn stats_min_median_max() {
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(Stats::of(&[3.0]), Some(Stats { n: 1, min: 3.0, median: 3.0, max: 3.0 }));
        assert_eq!(Stats::of(&[5.0, 1.0, 3.0]), Some(Stats { n: 3, min: 1.0, median: 3.0, max: 5.0 }));
        assert_eq!(Stats::of(&[4.0, 1.0, 3.0, 2.0]), Some(Stats { n: 4, min: 1.0, median: 2.5, max: 4.0 }));
        assert_eq!(Stats::of(&[f64::NAN, 2.0]).map(|s| s.n), Some(1));
    }

    #[test]
    fn figures_and_ratios_from_a_fixed_raw_set() {
        let r = build_report(&parse_raw(RAW).unwrap(), &input());
        assert_eq!(r.profile_order, ["udp64_1k", "syn64"]);
        let p = r.profiles.get("udp64_1k").unwrap();
        assert_eq!(p.paths.keys().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
        let a = p.paths.get("a").unwrap();
        assert_eq!((a.n, a.min_mpps, a.median_mpps, a.max_mpps), (3, 0.48, 0.5, 0.52));
        assert_eq!(a.tx_median_mpps, Some(0.6));
        assert_eq!(a.loss_median, Some(0.15)); // mean of the two middle (only two values)
        let b = p.paths.get("b").unwrap();
        assert_eq!((b.min_mpps, b.median_mpps, b.max_mpps), (0.38, 0.4, 0.42));
        assert_eq!(b.latency_p50_ns_median, Some(3000.0));
        assert_eq!(b.latency_p99_ns_median, Some(10000.0));
        assert_eq!(b.no_drop_mpps, Some(0.25));
        let c = p.paths.get("c").unwrap();
        assert_eq!(c.median_mpps, 0.2);
        let d = p.paths.get("d").unwrap();
        assert_eq!((d.n, d.median_mpps), (2, 0.145)); // even count: mean of the middle two
        assert_eq!(p.xlb_over_ceiling, Some(0.8));
        assert_eq!(p.xlb_over_nftables, Some(2.0));
        assert_eq!(p.xlb_over_iptables, Some(2.759));
        let tg = p.cross_check.get("trafgen").unwrap();
        assert_eq!(tg.get("a").unwrap().median, 0.45);
        assert_eq!(tg.get("b").unwrap().median, 0.35);
        assert!(tg.get("c").is_none());
        // a profile with only xlb has no ratios
        let syn = r.profiles.get("syn64").unwrap();
        assert_eq!((syn.xlb_over_ceiling, syn.xlb_over_nftables), (None, None));
        // conn/s
        let cb = r.conn_per_s.paths.get("b").unwrap();
        assert_eq!((cb.n, cb.min, cb.median, cb.max, cb.errors_median), (2, 9000.0, 10000.0, 11000.0, Some(1.0)));
        assert_eq!(r.conn_per_s.paths.get("c").unwrap().median, 5000.0);
        assert_eq!(r.conn_per_s.xlb_conn_over_nftables, Some(2.0));
        assert_eq!(r.conn_per_s.xlb_conn_over_iptables, None);
        assert_eq!(r.failures.len(), 1);
        assert_eq!(r.settings["repeats"], 3);
        assert_eq!(r.host_load1, Some(Stats { n: 2, min: 0.5, median: 2.25, max: 4.0 }));
    }

    #[test]
    fn json_shape() {
        let r = build_report(&parse_raw(RAW).unwrap(), &input());
        let v = serde_json::to_value(&r).unwrap();
        for k in [
            "schema",
            "date",
            "commit",
            "command",
            "machine",
            "settings",
            "paths",
            "profile_order",
            "profiles",
            "conn_per_s",
            "failures",
            "host_load1",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["machine"]["nproc"], 2);
        assert_eq!(v["machine"]["kernel"], "6.1.0");
        assert_eq!(v["machine"]["cpu_model"], "Test CPU");
        assert_eq!(v["commit"], "abc1234");
        let p = &v["profiles"]["udp64_1k"];
        assert_eq!(p["paths"]["b"]["median_mpps"], 0.4);
        assert_eq!(p["paths"]["b"]["min_mpps"], 0.38);
        assert_eq!(p["paths"]["b"]["max_mpps"], 0.42);
        assert_eq!(p["paths"]["b"]["name"], "xlb");
        assert_eq!(p["xlb_over_ceiling"], 0.8);
        assert_eq!(p["xlb_over_nftables"], 2.0);
        assert_eq!(p["cross_check"]["trafgen"]["a"]["median"], 0.45);
        assert!(v["profiles"]["syn64"]["xlb_over_nftables"].is_null());
        assert_eq!(v["conn_per_s"]["paths"]["b"]["median"], 10000.0);
        assert_eq!(v["conn_per_s"]["xlb_conn_over_nftables"], 2.0);
        assert_eq!(v["paths"]["c"]["name"], "nftables");
        // key order follows the paths, not the alphabet of the raw file
        let text = serde_json::to_string(&r).unwrap();
        let (ia, id) = (text.find("\"udp64_1k\":{").unwrap(), text.find("\"syn64\":{").unwrap());
        assert!(ia < id);
    }
}
