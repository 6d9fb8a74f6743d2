//! `xlb-bench-report`: the report step of `make bench` (see the library docs and
//! `perf/bench/run.sh`).
//!
//! ```text
//! xlb-bench-report --raw FILE [--raw FILE]... [--out-dir DIR] [--command CMD]
//!                  [--date YYYY-MM-DDTHH:MMZ] [--commit SHA] [--no-dated] [--quiet]
//! ```
//!
//! Writes `DIR/latest.{json,md,png}` and dated copies `DIR/DATE-COMMIT.{json,md,png}` (DATE is
//! the UTC date to the minute, `2025-01-02T0304Z`), then prints the Markdown.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use xlb_bench_report::{Machine, ReportInput, build_report, chart, markdown, parse_raw};

const USAGE: &str = "usage: xlb-bench-report --raw FILE [--raw FILE]... [--out-dir DIR] [--command CMD] \
                     [--date YYYY-MM-DDTHH:MMZ] [--commit SHA] [--no-dated] [--quiet]";

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn now_utc() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let secs = i64::try_from(secs).unwrap_or(0);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}Z", sod / 3600, (sod % 3600) / 60)
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

struct Args {
    raw: Vec<PathBuf>,
    out_dir: PathBuf,
    command: Option<String>,
    date: Option<String>,
    commit: Option<String>,
    dated: bool,
    quiet: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        raw: Vec::new(),
        out_dir: PathBuf::from("perf/results"),
        command: None,
        date: None,
        commit: None,
        dated: true,
        quiet: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--raw" => a.raw.push(val("--raw")?.into()),
            "--out-dir" => a.out_dir = val("--out-dir")?.into(),
            "--command" => a.command = Some(val("--command")?),
            "--date" => a.date = Some(val("--date")?),
            "--commit" => a.commit = Some(val("--commit")?),
            "--no-dated" => a.dated = false,
            "--quiet" => a.quiet = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if a.raw.is_empty() {
        return Err(format!("no --raw file\n{USAGE}"));
    }
    Ok(a)
}

fn run() -> Result<(), String> {
    let a = parse_args()?;
    let mut records = Vec::new();
    for f in &a.raw {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
        records.extend(parse_raw(&text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    let input = ReportInput {
        date: a.date.unwrap_or_else(now_utc),
        commit: a.commit.unwrap_or_else(git_commit),
        command: a.command.unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" ")),
        machine: Machine::detect(),
        raw_files: a.raw.iter().map(|p| p.display().to_string()).collect(),
    };
    let report = build_report(&records, &input);
    std::fs::create_dir_all(&a.out_dir).map_err(|e| format!("cannot create {}: {e}", a.out_dir.display()))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n";
    let md = markdown::render(&report);
    let write = |name: &str, body: &str| {
        let p = a.out_dir.join(name);
        std::fs::write(&p, body).map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    write("latest.json", &json)?;
    write("latest.md", &md)?;
    let png = a.out_dir.join("latest.png");
    if chart::ensure_font().is_none() {
        eprintln!("xlb-bench-report: no TrueType font found (apt-get install fonts-dejavu-core); chart without text");
    }
    chart::draw(&report, &png, true).map_err(|e| format!("cannot draw {}: {e}", png.display()))?;
    if a.dated {
        let stamp = format!("{}-{}", report.date.replace(':', ""), report.commit);
        write(&format!("{stamp}.json"), &json)?;
        write(&format!("{stamp}.md"), &md)?;
        let dst = a.out_dir.join(format!("{stamp}.png"));
        std::fs::copy(&png, &dst).map_err(|e| format!("cannot write {}: {e}", dst.display()))?;
    }
    if !a.quiet {
        print!("{md}");
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlb-bench-report: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
