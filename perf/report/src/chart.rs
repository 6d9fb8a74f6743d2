//! `latest.png`: grouped bar chart, profiles on x, one bar per path (median Mpps) with min–max
//! whiskers.
//!
//! Text is drawn with plotters' `ab_glyph` renderer from a TrueType file read at run time
//! (no fontconfig): `$XLB_BENCH_FONT`, else DejaVu Sans from Debian's `fonts-dejavu-core`, else
//! a few other usual places. Without any font the chart is drawn without text.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::summary::Report;
use crate::{PATHS, path_name};

/// Places looked at for a TrueType font, after `$XLB_BENCH_FONT`.
pub const FONT_CANDIDATES: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Colours of paths a..d (colour-blind-safe Okabe–Ito hues).
const COLOURS: [RGBColor; 4] =
    [RGBColor(153, 153, 153), RGBColor(0, 114, 178), RGBColor(230, 159, 0), RGBColor(204, 121, 167)];

/// Registers a font as `sans-serif` once; returns the file used, `None` when none could be
/// loaded (then the chart has no text).
pub fn ensure_font() -> Option<&'static str> {
    static FONT: OnceLock<Option<String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let env = std::env::var("XLB_BENCH_FONT").ok().filter(|s| !s.is_empty());
        for path in env.iter().map(String::as_str).chain(FONT_CANDIDATES) {
            let Ok(bytes) = std::fs::read(path) else { continue };
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Some(path.to_string());
            }
        }
        None
    })
    .as_deref()
}

type DrawResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Draws the chart to `out` (PNG). With `text` false (or no font available) no text is drawn.
///
/// # Errors
/// When the file cannot be written or drawing fails.
pub fn draw(report: &Report, out: &Path, text: bool) -> DrawResult<()> {
    let text = text && ensure_font().is_some();
    let root = BitMapBackend::new(out, (1400, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let profiles: Vec<&str> = report.profile_order.iter().map(String::as_str).collect();
    let n = profiles.len().max(1);
    let mut ymax: f64 = 0.0;
    for (_, p) in &report.profiles.0 {
        for (_, f) in &p.paths.0 {
            ymax = ymax.max(f.max_mpps);
        }
    }
    let ymax = if ymax > 0.0 { ymax * 1.18 } else { 1.0 };

    let (upper, lower) = root.split_vertically(700);
    let mut b = ChartBuilder::on(&upper);
    b.margin(16).margin_left(10);
    if text {
        b.caption(
            format!(
                "Forwarded packet rate, median with min–max (commit {}, {}, {} CPUs)",
                report.commit, report.date, report.machine.nproc
            ),
            ("sans-serif", 22),
        )
        .x_label_area_size(40)
        .y_label_area_size(70);
    } else {
        b.x_label_area_size(10).y_label_area_size(10);
    }
    let xmax = n as f64 - 0.5;
    let mut chart = b.build_cartesian_2d(-0.5f64..xmax, 0f64..ymax)?;
    {
        let mut mesh = chart.configure_mesh();
        mesh.disable_x_mesh().x_labels(n).x_label_formatter(&|_| String::new());
        if text {
            mesh.y_desc("Mpps forwarded").y_label_formatter(&|y| format!("{y:.2}")).label_style(("sans-serif", 16));
        } else {
            mesh.y_labels(0).x_labels(0);
        }
        mesh.draw()?;
    }

    let slots = PATHS.len() as f64;
    let group = 0.84;
    let w = group / slots;
    for (j, (id, _, _)) in PATHS.iter().enumerate() {
        let colour = COLOURS[j % COLOURS.len()];
        let mut bars = Vec::new();
        let mut whiskers = Vec::new();
        let mut labels = Vec::new();
        for (i, prof) in profiles.iter().enumerate() {
            let Some(f) = report.profiles.get(prof).and_then(|p| p.paths.get(id)).filter(|f| f.n > 0) else {
                continue;
            };
            let x0 = i as f64 - group / 2.0 + j as f64 * w;
            let (x1, xc) = (x0 + w * 0.9, x0 + w * 0.45);
            bars.push(Rectangle::new([(x0, 0.0), (x1, f.median_mpps)], colour.filled()));
            let cap = w * 0.2;
            whiskers.push(PathElement::new(vec![(xc, f.min_mpps), (xc, f.max_mpps)], BLACK.stroke_width(2)));
            whiskers
                .push(PathElement::new(vec![(xc - cap, f.min_mpps), (xc + cap, f.min_mpps)], BLACK.stroke_width(2)));
            whiskers
                .push(PathElement::new(vec![(xc - cap, f.max_mpps), (xc + cap, f.max_mpps)], BLACK.stroke_width(2)));
            labels.push((xc, f.max_mpps, f.median_mpps));
        }
        let series = chart.draw_series(bars)?;
        if text {
            series
                .label(format!("{id} {}", path_name(id)))
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled()));
        }
        chart.draw_series(whiskers)?;
        if text {
            let style = TextStyle::from(("sans-serif", 13).into_font()).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Bottom,
            ));
            chart.draw_series(
                labels.into_iter().map(|(x, y, m)| Text::new(format!("{m:.3}"), (x, y + ymax * 0.01), style.clone())),
            )?;
        }
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()?;
        // profile names under their groups
        let style = TextStyle::from(("sans-serif", 16).into_font()).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Top,
        ));
        for (i, prof) in profiles.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(i as f64, 0.0));
            upper.draw(&Text::new((*prof).to_string(), (px, py + 8), style.clone()))?;
        }
        let note = "a = xlb-macfwd (I/O ceiling), b = xlb, c = kube-proxy nftables rules, d = kube-proxy iptables rules; \
                    generator on CPU 0, forwarder on CPU 1 (kernel paths: RPS)";
        lower.draw(&Text::new(note, (20, 20), ("sans-serif", 15).into_font()))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::parse_raw;
    use crate::summary::build_report;
    use crate::summary::tests::{RAW, input};

    fn check_png(text: bool) {
        let r = build_report(&parse_raw(RAW).unwrap(), &input());
        let out = std::env::temp_dir().join(format!("xlb-bench-report-test-{}-{text}.png", std::process::id()));
        draw(&r, &out, text).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        assert!(bytes.len() > 1000, "{} bytes", bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn png_is_written_with_text() {
        check_png(true);
    }

    #[test]
    fn png_is_written_without_text() {
        check_png(false);
    }
}
