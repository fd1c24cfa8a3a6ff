//! Outputs: the JSON document, `.hgrm` percentile distributions (HdrHistogram's text
//! format, readable by its plotter and by wrk2 tooling), and the latency-versus-
//! throughput PNG.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use aker::protocol::{HelloReply, HitKind};
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;

use crate::stats::{IntervalLine, RunStats, Summary};
use crate::worker::{EngineConfig, Mode, RunResult, StopReason};
use crate::workload::OpKind;

/// What HELLO said about the server.
#[derive(Clone, Debug, Serialize)]
pub struct ServerInfo {
    pub dim: u32,
    pub metric: String,
    pub k_max: u32,
    pub max_inflight: u32,
    pub executors: u32,
    pub shards: u32,
}

impl From<&HelloReply> for ServerInfo {
    fn from(h: &HelloReply) -> Self {
        ServerInfo {
            dim: h.dim,
            metric: h.metric.to_string(),
            k_max: h.k_max,
            max_inflight: h.max_inflight,
            executors: h.executors,
            shards: h.shards,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct OpReport {
    pub op: &'static str,
    pub throughput: f64,
    pub errors: u64,
    pub latency: Summary,
}

#[derive(Clone, Debug, Serialize)]
pub struct HitReport {
    pub kind: &'static str,
    /// Share of successful SEARCH replies.
    pub share: f64,
    pub recall: Option<f64>,
    pub latency: Summary,
}

/// One run (or one sweep step), as written to JSON.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub mode: &'static str,
    /// Target rate (open loop).
    pub rate: Option<f64>,
    pub arrival: Option<&'static str>,
    pub connections: usize,
    pub depth: usize,
    /// Queries per SEARCH_BATCH frame (closed loop `--batch`); absent: one SEARCH per frame.
    pub batch: Option<usize>,
    pub threads: usize,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub measured_s: f64,
    pub stop: StopReason,
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
    pub errors_by_cause: BTreeMap<String, u64>,
    /// Successful replies per counted second.
    pub throughput: f64,
    /// Every successful reply, from the intended send time.
    pub latency: Summary,
    /// The same replies from their actual send time (not corrected).
    pub uncorrected: Summary,
    /// How late requests left against their intended time.
    pub send_lag: Summary,
    pub ops: Vec<OpReport>,
    pub hits: Vec<HitReport>,
    pub hit_ratio: Option<f64>,
    pub recall: Option<f64>,
    pub intervals: Vec<IntervalLine>,
}

impl RunReport {
    pub fn new(cfg: &EngineConfig, r: &RunResult) -> RunReport {
        let s = &r.stats;
        let secs = r.measured_secs.max(1e-9);
        let (mode, rate, arrival) = match cfg.mode {
            Mode::Open { rate, arrival } => (
                "open",
                Some(rate),
                Some(match arrival {
                    crate::schedule::Arrival::Poisson => "poisson",
                    crate::schedule::Arrival::Fixed => "fixed",
                }),
            ),
            Mode::Closed => ("closed", None, None),
        };
        RunReport {
            mode,
            rate,
            arrival,
            connections: cfg.connections,
            depth: cfg.depth,
            batch: cfg.batch,
            threads: cfg.threads.clamp(1, cfg.connections.max(1)),
            warmup_s: cfg.warmup.as_secs_f64(),
            duration_s: cfg.duration.as_secs_f64(),
            measured_s: r.measured_secs,
            stop: r.stop,
            sent: r.sent,
            ok: s.ok(),
            errors: s.total_errors(),
            errors_by_cause: s.errors.clone(),
            throughput: s.ok() as f64 / secs,
            latency: Summary::of(&s.all),
            uncorrected: Summary::of(&s.uncorrected),
            send_lag: Summary::of(&s.send_lag),
            ops: OpKind::ALL
                .iter()
                .filter(|k| !s.ops[k.index()].is_empty() || s.op_errors[k.index()] > 0)
                .map(|&k| OpReport {
                    op: k.name(),
                    throughput: s.ops[k.index()].len() as f64 / secs,
                    errors: s.op_errors[k.index()],
                    latency: Summary::of(&s.ops[k.index()]),
                })
                .collect(),
            hits: HitKind::ALL
                .iter()
                .filter(|h| !s.hits[h.code() as usize].is_empty())
                .map(|&h| HitReport {
                    kind: h.name(),
                    share: s.hit_share(h).unwrap_or(0.0),
                    recall: s.recall_of(h),
                    latency: Summary::of(&s.hits[h.code() as usize]),
                })
                .collect(),
            hit_ratio: s.hit_ratio(),
            recall: s.recall(),
            intervals: r.intervals.clone(),
        }
    }
}

/// A sweep: every step run, and the answer.
#[derive(Clone, Debug, Serialize)]
pub struct SweepReport {
    pub p99_bound_ms: f64,
    /// The highest rate whose step passed (p99 under the bound, no errors).
    pub best_rate: Option<f64>,
    pub steps: Vec<SweepStepReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SweepStepReport {
    pub rate: f64,
    pub pass: bool,
    pub run: RunReport,
}

/// The whole JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct Document {
    pub tool: &'static str,
    pub target: String,
    pub workload: String,
    pub server: ServerInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepReport>,
}

pub fn write_json(path: &Path, doc: &Document) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(doc).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// HdrHistogram's percentile distribution text (the `.hgrm` format of Java's
/// `outputPercentileDistribution`, 5 ticks per half distance), values in milliseconds
/// (the histogram holds µs).
pub fn hgrm(h: &Histogram<u64>) -> String {
    const SCALE: f64 = 1000.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    if !h.is_empty() {
        for v in h.iter_quantiles(5) {
            total += v.count_since_last_iteration();
            let q = v.quantile_iterated_to();
            let value = v.value_iterated_to() as f64 / SCALE;
            if q < 1.0 {
                let _ = writeln!(
                    out,
                    "{value:12.3} {q:2.12} {total:10} {:14.2}",
                    1.0 / (1.0 - q)
                );
            } else {
                let _ = writeln!(out, "{value:12.3} {q:2.12} {total:10}");
            }
        }
    }
    let sub_buckets = 1u64 << (2.0 * 10f64.powi(i32::from(h.sigfig()))).log2().ceil() as u32;
    let _ = writeln!(
        out,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        if h.is_empty() { 0.0 } else { h.mean() / SCALE },
        if h.is_empty() { 0.0 } else { h.stdev() / SCALE }
    );
    let _ = writeln!(
        out,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        h.max() as f64 / SCALE,
        h.len()
    );
    let _ = writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        sub_buckets
    );
    out
}

/// Writes `PREFIX.all.hgrm`, one file per operation sent (`PREFIX.search.hgrm`, ...) and
/// per SEARCH hit kind seen (`PREFIX.search-exact.hgrm`, ...). Returns the paths.
pub fn write_hgrms(prefix: &str, s: &RunStats) -> std::io::Result<Vec<String>> {
    let mut files = vec![(format!("{prefix}.all.hgrm"), &s.all)];
    for k in OpKind::ALL {
        if !s.ops[k.index()].is_empty() {
            files.push((
                format!("{prefix}.{}.hgrm", k.name().to_ascii_lowercase()),
                &s.ops[k.index()],
            ));
        }
    }
    for h in HitKind::ALL {
        let hist = &s.hits[h.code() as usize];
        if !hist.is_empty() {
            files.push((format!("{prefix}.search-{}.hgrm", h.name()), hist));
        }
    }
    files.push((format!("{prefix}.uncorrected.hgrm"), &s.uncorrected));
    let mut written = Vec::new();
    for (path, h) in files {
        std::fs::write(&path, hgrm(h))?;
        written.push(path);
    }
    Ok(written)
}

/// One point of the latency-versus-throughput figure.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub throughput: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

impl Point {
    pub fn of_line(l: &IntervalLine) -> Point {
        Point {
            throughput: l.rate,
            p50_ms: l.p50_ms,
            p99_ms: l.p99_ms,
            p999_ms: l.p999_ms,
        }
    }

    pub fn of_run(r: &RunReport) -> Point {
        Point {
            throughput: r.throughput,
            p50_ms: r.latency.p50_ms,
            p99_ms: r.latency.p99_ms,
            p999_ms: r.latency.p999_ms,
        }
    }
}

type PlotResult = Result<(), Box<dyn std::error::Error>>;
/// Picks one percentile out of a point.
type Getter = fn(&Point) -> f64;

/// Latency (log scale, ms) against achieved throughput: p50, p99 and p99.9, joined by
/// lines when `joined` (sweep steps, in rate order) or as scattered points (the seconds
/// of one run). `bound_ms` draws the sweep's p99 bound.
pub fn plot(
    path: &Path,
    title: &str,
    points: &[Point],
    joined: bool,
    bound_ms: Option<f64>,
) -> PlotResult {
    if points.is_empty() {
        return Err("no points to plot".into());
    }
    // Text needs a system font (plotters' `ttf` feature finds it through fontconfig).
    let floor = 0.001;
    let lat = |v: f64| v.max(floor);
    let x_max = points
        .iter()
        .map(|p| p.throughput)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.05;
    let mut y_min = f64::MAX;
    let mut y_max = floor;
    for p in points {
        for v in [p.p50_ms, p.p99_ms, p.p999_ms] {
            y_min = y_min.min(lat(v));
            y_max = y_max.max(lat(v));
        }
    }
    if let Some(b) = bound_ms {
        y_min = y_min.min(b);
        y_max = y_max.max(b);
    }
    let (y_lo, y_hi) = (y_min / 2.0, y_max * 2.0);

    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..x_max, (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("throughput (successful replies / s)")
        .y_desc("latency (ms, from intended send time)")
        .y_label_formatter(&|v| {
            let t = format!("{v:.3}");
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        })
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let series: [(&str, RGBColor, Getter); 3] = [
        ("p50", RGBColor(31, 119, 180), |p| p.p50_ms),
        ("p99", RGBColor(214, 39, 40), |p| p.p99_ms),
        ("p99.9", RGBColor(148, 103, 189), |p| p.p999_ms),
    ];
    for (name, color, get) in series {
        let pts: Vec<(f64, f64)> = points.iter().map(|p| (p.throughput, lat(get(p)))).collect();
        if joined {
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        } else {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 9, y), 4, color.filled()));
        }
    }
    if let Some(b) = bound_ms {
        let grey = RGBColor(60, 60, 60);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, b), (x_max, b)],
                8,
                6,
                grey.stroke_width(2),
            ))?
            .label(format!("p99 bound {b} ms"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], grey.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::new_hist;

    #[test]
    fn hgrm_has_the_classic_layout() {
        let mut h = new_hist();
        for v in 1..=1000u64 {
            h.record(v * 10).unwrap();
        }
        let text = hgrm(&h);
        let mut lines = text.lines();
        assert!(lines
            .next()
            .unwrap()
            .contains("Value     Percentile TotalCount 1/(1-Percentile)"));
        assert_eq!(lines.next(), Some(""));
        let first: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(first[0], "0.010");
        // Max is the top of its bucket (10 ms within 3 significant digits).
        let max = format!(
            "#[Max     = {:12.3}, Total count    =         1000]",
            h.max() as f64 / 1000.0
        );
        assert!(text.contains(&max), "{text}");
        assert!((h.max() as f64 / 1000.0 - 10.0).abs() < 0.01);
        assert!(text.contains("SubBuckets     =         2048"), "{text}");
        // The last data line is the 100th percentile with the full count.
        let last = text
            .lines()
            .rfind(|l| !l.starts_with('#') && !l.is_empty())
            .unwrap();
        let f: Vec<&str> = last.split_whitespace().collect();
        assert_eq!((f[1], f[2]), ("1.000000000000", "1000"), "{last}");
    }

    #[test]
    fn plot_writes_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lat.png");
        let pts: Vec<Point> = (1..=5)
            .map(|i| Point {
                throughput: 1000.0 * i as f64,
                p50_ms: 0.1 * i as f64,
                p99_ms: 0.5 * i as f64,
                p999_ms: 2.0 * i as f64,
            })
            .collect();
        plot(&path, "test", &pts, true, Some(1.0)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }
}
