//! Parsing the raw JSON-lines file that `perf/bench/run.sh` writes.

use serde_json::Value;

/// One line of the raw file, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum RawRecord {
    /// Run settings (`kind: run`): copied verbatim into the report.
    Run(Value),
    /// One packet-rate trial (`kind: trial`).
    Trial(Trial),
    /// One connections-per-second trial (`kind: cps`).
    Cps(CpsTrial),
    /// A no-drop rate search result (`kind: search`).
    Search(SearchResult),
    /// A trial that produced no figure (`kind: failed`).
    Failed(Failure),
}

/// One packet-rate trial.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// Path id, `a`..`d`.
    pub path: String,
    /// Profile name, e.g. `udp64_1k`.
    pub profile: String,
    /// Repeat number (1-based).
    pub repeat: u32,
    /// Which generator drove it (`xlb-pktgen`, `trafgen`).
    pub generator: String,
    /// Offered rate, packets per second (`None` when the generator does not say).
    pub tx_pps: Option<f64>,
    /// Forwarded rate counted at the sink, packets per second: the figure.
    pub rx_pps: f64,
    /// Fraction lost (`None` when unknown).
    pub loss: Option<f64>,
    /// Latency percentiles in ns (`p50`, `p99`, `p999`, `max`) when measured.
    pub latency_ns: Option<Value>,
    /// The host's 1-minute load average at the end of the trial (`host_load1`), when recorded.
    pub host_load1: Option<f64>,
}

/// One connections-per-second trial (wrk with `Connection: close`).
#[derive(Debug, Clone, PartialEq)]
pub struct CpsTrial {
    /// Path id.
    pub path: String,
    /// Repeat number.
    pub repeat: u32,
    /// Requests per second (= connections per second).
    pub requests_per_s: f64,
    /// Socket errors plus non-2xx answers, when reported.
    pub errors: Option<f64>,
    /// The host's 1-minute load average at the end of the trial, when recorded.
    pub host_load1: Option<f64>,
}

/// The highest rate with loss below the threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// Path id.
    pub path: String,
    /// Profile name.
    pub profile: String,
    /// No-drop rate, packets per second.
    pub no_drop_pps: f64,
    /// Latency percentiles (ns; `p50`, `p99`, ...) of one trial run at the no-drop rate, when
    /// one was run after the search.
    pub latency_ns: Option<Value>,
}

/// A trial that failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Path id (may be empty).
    pub path: String,
    /// Profile name (may be empty).
    pub profile: String,
    /// Repeat number (0 when not a repeat).
    pub repeat: u32,
    /// What went wrong.
    pub reason: String,
}

/// Why a raw file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// Line number, 1-based.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

fn s(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(x)) => x.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn f(v: &Value, k: &str) -> Option<f64> {
    match v.get(k)? {
        Value::Number(n) => n.as_f64(),
        Value::String(x) => x.parse().ok(),
        _ => None,
    }
}

fn u(v: &Value, k: &str) -> u32 {
    match v.get(k) {
        Some(Value::Number(n)) => n.as_u64().and_then(|x| u32::try_from(x).ok()).unwrap_or(0),
        Some(Value::String(x)) => x.parse().unwrap_or(0),
        _ => 0,
    }
}

fn need(v: &Value, k: &str) -> Result<String, String> {
    let x = s(v, k);
    if x.is_empty() { Err(format!("missing field {k:?}")) } else { Ok(x) }
}

/// Classifies one parsed JSON object.
///
/// # Errors
/// A message when a required field is missing or the kind is unknown.
pub fn classify(v: &Value) -> Result<RawRecord, String> {
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    let kind = match v.get("kind").and_then(Value::as_str) {
        Some(k) => k.to_string(),
        None if v.get("rx_pps").is_some() => "trial".into(),
        None => return Err("missing field \"kind\"".into()),
    };
    match kind.as_str() {
        "run" => Ok(RawRecord::Run(v.get("settings").cloned().unwrap_or_else(|| v.clone()))),
        "trial" => Ok(RawRecord::Trial(Trial {
            path: need(v, "path")?,
            profile: need(v, "profile")?,
            repeat: u(v, "repeat"),
            generator: Some(s(v, "generator")).filter(|g| !g.is_empty()).unwrap_or_else(|| "xlb-pktgen".into()),
            tx_pps: f(v, "tx_pps"),
            rx_pps: f(v, "rx_pps").ok_or("missing or non-numeric field \"rx_pps\"")?,
            loss: f(v, "loss"),
            latency_ns: v.get("latency_ns").filter(|l| l.is_object()).cloned(),
            host_load1: f(v, "host_load1"),
        })),
        "cps" => Ok(RawRecord::Cps(CpsTrial {
            path: need(v, "path")?,
            repeat: u(v, "repeat"),
            requests_per_s: f(v, "requests_per_s").ok_or("missing or non-numeric field \"requests_per_s\"")?,
            errors: f(v, "errors"),
            host_load1: f(v, "host_load1"),
        })),
        "search" => Ok(RawRecord::Search(SearchResult {
            path: need(v, "path")?,
            profile: need(v, "profile")?,
            no_drop_pps: f(v, "no_drop_pps").ok_or("missing or non-numeric field \"no_drop_pps\"")?,
            latency_ns: v.get("latency_ns").filter(|l| l.is_object()).cloned(),
        })),
        "failed" => Ok(RawRecord::Failed(Failure {
            path: s(v, "path"),
            profile: s(v, "profile"),
            repeat: u(v, "repeat"),
            reason: s(v, "reason"),
        })),
        other => Err(format!("unknown kind {other:?}")),
    }
}

/// Parses JSON-lines text; blank lines and lines starting with `#` are skipped.
///
/// # Errors
/// The first line that is not valid JSON or lacks a required field.
pub fn parse_raw(text: &str) -> Result<Vec<RawRecord>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let v: Value = serde_json::from_str(t).map_err(|e| ParseError { line: i + 1, message: e.to_string() })?;
        out.push(classify(&v).map_err(|message| ParseError { line: i + 1, message })?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind_and_skips_comments() {
        let text = r#"
# comment
{"kind":"run","settings":{"repeats":5}}
{"kind":"trial","path":"b","profile":"udp64_1k","repeat":2,"generator":"xlb-pktgen","tx_pps":500000,"rx_pps":400000,"loss":0.2,"latency_ns":{"p50":1000}}
{"path":"a","profile":"udp64_1k","repeat":1,"rx_pps":"450000.5"}
{"kind":"cps","path":"c","repeat":1,"requests_per_s":12000.5,"errors":0}
{"kind":"search","path":"b","profile":"udp64_1k","no_drop_pps":300000}
{"kind":"failed","path":"d","profile":"syn64","repeat":3,"reason":"timeout"}
"#;
        let r = parse_raw(text).unwrap();
        assert_eq!(r.len(), 6);
        assert!(matches!(&r[0], RawRecord::Run(v) if v["repeats"] == 5));
        let RawRecord::Trial(t) = &r[1] else { panic!("{:?}", r[1]) };
        assert_eq!((t.path.as_str(), t.repeat, t.rx_pps, t.tx_pps), ("b", 2, 400_000.0, Some(500_000.0)));
        let RawRecord::Trial(t) = &r[2] else { panic!("{:?}", r[2]) };
        assert_eq!((t.generator.as_str(), t.rx_pps), ("xlb-pktgen", 450_000.5));
        assert!(matches!(&r[3], RawRecord::Cps(c) if c.requests_per_s == 12000.5));
        assert!(matches!(&r[4], RawRecord::Search(s) if s.no_drop_pps == 300_000.0));
        assert!(matches!(&r[5], RawRecord::Failed(f) if f.reason == "timeout" && f.repeat == 3));
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_raw("{\"kind\":\"run\"}\nnot json\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse_raw("{\"kind\":\"trial\",\"path\":\"a\",\"profile\":\"p\"}").unwrap_err();
        assert!(e.message.contains("rx_pps"), "{e}");
        let e = parse_raw("{\"kind\":\"bogus\"}").unwrap_err();
        assert!(e.message.contains("bogus"), "{e}");
    }
}
