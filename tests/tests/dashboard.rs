//! The Grafana dashboard and the Prometheus rules (`deploy/grafana/xlb.json`,
//! `deploy/prometheus/`) against a real Prometheus (issue 13 part 3).
//!
//! - `rules_pass_promtool` (no root): `promtool check rules` and `promtool test rules`.
//! - `every_dashboard_query_returns_series` (root): xlb on the namespace testbed with traffic
//!   flowing, scraped every second by its own `prometheus` (in the testbed's lb namespace, on
//!   a free loopback port, its TSDB in the testbed's run directory) that loads the rules; every
//!   PromQL expression of the dashboard must return at least one series, the rules must
//!   evaluate without error, and the new metrics must hold the values the testbed implies
//!   (bytes by verdict included: a transmitted frame's mean size is an Ethernet frame's).
//!
//! Both need Debian's `prometheus` package (`scripts/install-deps.sh test`); neither uses or
//! touches a system Prometheus.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

fn require_tool(tool: &str) {
    assert!(
        xlb_testkit::have_tool(tool, "--version"),
        "`{tool}` is missing: install Debian's prometheus package (scripts/install-deps.sh test)"
    );
}

#[test]
fn rules_pass_promtool() {
    require_tool("promtool");
    let dir = repo_root().join("deploy").join("prometheus");
    for args in [["check", "rules", "xlb-rules.yaml"], ["test", "rules", "xlb-rules.test.yaml"]] {
        let out = std::process::Command::new("promtool").args(args).current_dir(&dir).output().expect("run promtool");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("promtool {}:\n{text}", args.join(" "));
        assert!(out.status.success(), "promtool {} failed ({}):\n{text}", args.join(" "), out.status);
        assert!(text.contains("SUCCESS"), "promtool {}: {text}", args.join(" "));
    }
}

/// Every PromQL expression of the dashboard, in panel order, with the panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = repo_root().join("deploy").join("grafana").join("xlb.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    fn walk(panels: &[serde_json::Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_owned()));
                }
            }
            walk(p["panels"].as_array().map_or(&[], Vec::as_slice), out);
        }
    }
    walk(dash["panels"].as_array().expect("panels"), &mut out);
    out
}

/// `expr` with the dashboard's variables replaced by what an operator selecting "All" gets
/// (`$instance`, `$service`: `.+`) and `$__rate_interval` by `window`.
fn substitute(expr: &str, window: &str) -> String {
    expr.replace("$__rate_interval", window).replace("$instance", ".+").replace("$service", ".+")
}

#[test]
fn dashboard_queries_use_only_known_variables() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 40, "{} queries", queries.len());
    // The walk reaches every target: as many queries as `"expr"` keys in the file (the live
    // test below checks each of them against Prometheus).
    let text = std::fs::read_to_string(repo_root().join("deploy").join("grafana").join("xlb.json")).expect("dashboard");
    assert_eq!(queries.len(), text.matches("\"expr\"").count(), "queries the walk found");
    for (panel, q) in &queries {
        let s = substitute(q, "1m");
        assert!(!s.contains('$'), "{panel}: a variable left in {s}");
        assert!(!s.contains("vector("), "{panel}: {s}");
    }
}

#[cfg(test)]
mod live {
    use std::time::{Duration, Instant};

    use serde_json::Value;
    use xlb_e2e::{Role, Testbed, Xlb, skip_without_root, wait_for, xlb_binary};
    use xlb_testkit::ChildGuard;

    use super::{dashboard_queries, repo_root, require_tool, substitute};

    const CONFIG: &str = include_str!("../../deploy/examples/testbed.yaml");
    /// The web Service's ClusterIP (rr over be1..be3) and the sticky one's (Maglev).
    const URLS: [&str; 2] = ["http://10.250.100.1/", "http://10.250.100.4/"];
    /// The rate window put in place of `$__rate_interval` (Grafana's is at least 4 scrape
    /// intervals; Prometheus scrapes every second here).
    const WINDOW: &str = "20s";

    /// The Prometheus HTTP API of the instance the test runs, reached with curl inside the lb
    /// namespace.
    struct Prom<'a> {
        tb: &'a Testbed,
        base: String,
    }

    impl Prom<'_> {
        fn get(&self, path: &str, query: Option<&str>) -> Result<Value, String> {
            let url = format!("{}{path}", self.base);
            let mut args = vec!["curl", "-sS", "--max-time", "10", "-G"];
            let q;
            if let Some(query) = query {
                q = format!("query={query}");
                args.extend(["--data-urlencode", &q]);
            }
            args.push(&url);
            let out = self.tb.exec(Role::Lb, &args).map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("curl {url}: {}", String::from_utf8_lossy(&out.stderr)));
            }
            serde_json::from_slice(&out.stdout)
                .map_err(|e| format!("{url}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
        }

        /// Whether `/-/ready` answers 200 (plain text, not JSON).
        fn ready(&self) -> bool {
            let url = format!("{}/-/ready", self.base);
            self.tb
                .exec(Role::Lb, &["curl", "-sS", "--fail", "--max-time", "5", &url])
                .is_ok_and(|o| o.status.success())
        }

        /// The instant vector of `q`: `(labels, value)` per series.
        fn query(&self, q: &str) -> Result<Vec<(Value, String)>, String> {
            let v = self.get("/api/v1/query", Some(q))?;
            if v["status"] != "success" {
                return Err(format!("{q}: {v}"));
            }
            let data = &v["data"];
            if data["resultType"] != "vector" {
                return Err(format!("{q}: result type {}", data["resultType"]));
            }
            Ok(data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| (s["metric"].clone(), s["value"][1].as_str().unwrap_or_default().to_owned()))
                .collect())
        }

        /// The values of `q`'s series as numbers.
        fn values(&self, q: &str) -> Vec<f64> {
            self.query(q).unwrap_or_else(|e| panic!("{e}")).iter().filter_map(|(_, v)| v.parse().ok()).collect()
        }
    }

    /// Sets its flag when dropped.
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn every_dashboard_query_returns_series() {
        if skip_without_root("every_dashboard_query_returns_series") {
            return;
        }
        require_tool("prometheus");
        let _ = xlb_binary().expect("xlb binary");
        let tb = Testbed::up().unwrap_or_else(|e| {
            eprintln!("testbed up failed, trying once more: {e}");
            Testbed::up().expect("testbed up (second try)")
        });
        let xlb = Xlb::start(&tb, CONFIG).expect("xlb start");

        // Prometheus in the lb namespace, where xlb serves /metrics on 127.0.0.1:10249.
        let port = tb
            .in_ns(Role::Lb, || {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                l.local_addr().expect("addr").port()
            })
            .expect("lb namespace");
        let dir = tb.run_dir().join("prometheus");
        std::fs::create_dir_all(dir.join("data")).expect("prometheus dir");
        let rules = repo_root().join("deploy").join("prometheus").join("xlb-rules.yaml");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n- {}\n\
                 scrape_configs:\n- job_name: xlb\n  static_configs:\n  - targets: ['127.0.0.1:10249']\n",
                rules.display()
            ),
        )
        .expect("write prometheus.yml");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &tb.ns_name(Role::Lb), "prometheus"])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let _prometheus = ChildGuard::new(child);
        let prom = Prom { tb: &tb, base: format!("http://127.0.0.1:{port}") };
        let prom_log = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();

        // Traffic for the whole test: HTTP requests to two ClusterIPs from the client.
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            // Stops the traffic when this closure ends, also by a failed assertion (the scope
            // waits for its threads before the panic goes on).
            let stopper = StopOnDrop(&stop);
            let traffic = s.spawn(|| {
                let (mut ok, mut failed) = (0u32, 0u32);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for url in URLS {
                        match tb.curl(Role::Client, url) {
                            Ok(_) => ok += 1,
                            Err(_) => failed += 1,
                        }
                    }
                }
                (ok, failed)
            });

            // Ready, scraped at least 10 times with xlb up, and traffic forwarded in the window.
            wait_for(Duration::from_secs(30), || prom.ready().then_some(()))
                .unwrap_or_else(|| panic!("prometheus not ready:\n{}", prom_log()));
            let scrapes = "count_over_time(up{job=\"xlb\"}[1m])";
            wait_for(Duration::from_secs(60), || {
                let up = prom.values("up{job=\"xlb\"}");
                let n = prom.values(scrapes);
                (up == [1.0] && n.first().is_some_and(|n| *n >= 10.0)).then_some(())
            })
            .unwrap_or_else(|| {
                panic!("xlb not scraped 10 times: {:?}\n{}", prom.query("up").map(|v| v.len()), prom_log())
            });
            let tx = format!("sum(rate(xlb_worker_tx_packets_total[{WINDOW}]))");
            wait_for(Duration::from_secs(30), || prom.values(&tx).first().is_some_and(|v| *v > 0.0).then_some(()))
                .expect("forwarded frames in the rate window");

            // A change of one EndpointSlice (a label only): one endpoint change, no Service one.
            let changed = CONFIG.replacen(
                "labels: {kubernetes.io/service-name: web}",
                "labels: {kubernetes.io/service-name: web, example.com/revision: \"2\"}",
                1,
            );
            assert_ne!(changed, CONFIG);
            xlb.rewrite_config(&changed).expect("rewrite config");
            let endpoint_changes = "kubeproxy_sync_proxy_rules_endpoint_changes_total{job=\"xlb\"}";
            wait_for(Duration::from_secs(20), || (prom.values(endpoint_changes) == [1.0]).then_some(()))
                .unwrap_or_else(|| panic!("endpoint changes: {:?}\n{}", prom.query(endpoint_changes), xlb.log()));
            assert_eq!(prom.values("kubeproxy_sync_proxy_rules_service_changes_total"), [0.0]);

            // Every rule of the rules file evaluated on these series without error.
            let rules = wait_for(Duration::from_secs(30), || {
                let v = prom.get("/api/v1/rules", None).ok()?;
                let rules: Vec<Value> = v["data"]["groups"]
                    .as_array()?
                    .iter()
                    .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                    .collect();
                rules.iter().all(|r| r["health"] != "unknown").then_some(rules)
            })
            .expect("every rule evaluated");
            assert_eq!(rules.len(), 27, "rules loaded");
            for r in &rules {
                assert_eq!(r["health"], "ok", "rule {}: {}", r["name"], r["lastError"]);
            }
            let firing = prom.query("ALERTS{alertstate=\"firing\"}").expect("ALERTS");
            println!("alerts firing: {firing:?}");

            // Every expression of the dashboard returns series.
            let queries = dashboard_queries();
            let mut empty = Vec::new();
            let mut all_nan = Vec::new();
            for (panel, q) in &queries {
                let q = substitute(q, WINDOW);
                match prom.query(&q) {
                    Ok(series) if !series.is_empty() => {
                        if series.iter().all(|(_, v)| v == "NaN") {
                            all_nan.push(format!("{panel}: {q}"));
                        }
                        let shown: Vec<String> = series.iter().take(3).map(|(m, v)| format!("{m} {v}")).collect();
                        println!("{panel}: {} series, e.g. {}\n    {q}", series.len(), shown.join("; "));
                    }
                    Ok(_) => empty.push(format!("{panel}: no series: {q}")),
                    Err(e) => empty.push(format!("{panel}: {e}")),
                }
            }
            println!("{} dashboard queries, {} without series", queries.len(), empty.len());
            // A ratio or quantile of nothing in the window is NaN (e.g. network programming,
            // which a config file never observes): shown, not hidden.
            println!("{} with only NaN values:\n  {}", all_nan.len(), all_nan.join("\n  "));
            assert!(empty.is_empty(), "queries without series:\n{}", empty.join("\n"));

            // The new metrics hold what the testbed implies.
            let w = WINDOW;
            assert_eq!(prom.values("xlb_conntrack_capacity"), [65536.0, 65536.0], "conntrack.maxPerCore per worker");
            let ready = "xlb_service_endpoints{service=\"demo/web:http\",state=~\"ready|total|eligible\"}";
            assert_eq!(prom.values(ready), [3.0, 3.0, 3.0], "web's three ready endpoints");
            let terminating = "xlb_service_endpoints{service=\"demo/web:http\",state=\"terminating\"}";
            assert_eq!(prom.values(terminating), [0.0]);
            assert_eq!(prom.values("xlb_backend_weight{service=\"demo/web:http\"}"), [1.0, 1.0, 1.0]);
            let busy = prom.values(&format!("sum(rate(xlb_worker_busy_seconds_total[{w}]))"));
            assert!(busy.first().is_some_and(|b| *b > 0.0 && *b < 2.0), "busy cores {busy:?}");
            let batch =
                format!("sum(rate(xlb_worker_rx_packets_total[{w}])) / sum(rate(xlb_worker_busy_loops_total[{w}]))");
            let batch = prom.values(&batch);
            assert!(batch.first().is_some_and(|b| *b > 0.0 && *b <= 128.0), "frames per busy loop {batch:?}");
            let share = prom.values(&format!(
                "sum by (backend) (rate(xlb_backend_new_flows_total{{service=\"demo/web:http\"}}[{w}])) \
                 / ignoring (backend) group_left () sum (rate(xlb_backend_new_flows_total{{service=\"demo/web:http\"}}[{w}]))"
            ));
            assert_eq!(share.len(), 3, "web's backends' shares {share:?}");
            assert!((share.iter().sum::<f64>() - 1.0).abs() < 1e-6, "shares add up to 1: {share:?}");
            assert_eq!(prom.values("count(xlb_maglev_table_checksum{service=\"demo/sticky:http\"})"), [1.0]);
            let recorded = prom.values("instance:xlb_tx_packets:rate5m");
            assert!(recorded.first().is_some_and(|v| *v > 0.0), "recording rule: {recorded:?}");
            let recorded = prom.values("instance:xlb_tx_bytes:rate5m");
            assert!(recorded.first().is_some_and(|v| *v > 0.0), "recording rule: {recorded:?}");
            // Bytes per transmitted frame: an Ethernet frame without FCS, 54 (a bare TCP
            // segment on a veth, no padding) to 1514 bytes.
            let per_frame = prom.values(&format!(
                "sum(rate(xlb_worker_tx_bytes_total[{w}])) / sum(rate(xlb_worker_tx_packets_total[{w}]))"
            ));
            assert!(per_frame.first().is_some_and(|b| (54.0..=1514.0).contains(b)), "bytes per frame {per_frame:?}");

            drop(stopper);
            let (ok, failed) = traffic.join().expect("traffic thread");
            println!("traffic: {ok} requests answered, {failed} failed");
            assert!(ok > 0);
        });
        let started = Instant::now();
        xlb.stop().expect("xlb stop");
        println!("xlb stopped in {:?}", started.elapsed());
    }
}
