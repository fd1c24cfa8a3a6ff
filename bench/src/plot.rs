//! PNG figures in the layout of the paper's Figure 10 (recall) and Figure 11 (hit
//! ratios): one panel per pool size, skews along the x axis, one bar per policy. Hit
//! bars are stacked: exact (equality) hits in yellow as in the paper, alias hits in a
//! light shade of the policy's colour, approximate hits in its full colour.

use std::path::Path;

use plotters::prelude::*;

use crate::akerd::capacity_label;
use crate::experiment::{Policy, Rule};
use crate::report::{PoolSpec, Row};

const PANEL_W: u32 = 620;
const FIG_H: u32 = 480;
/// Width of the legend column right of the panels (a legend inside a panel hides bars).
const LEGEND_W: u32 = 150;
const EXACT_HIT: RGBColor = RGBColor(242, 197, 0);

/// Colours by policy position, readable on white and distinct in print.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(227, 119, 194),
];

type Plot = Result<(), Box<dyn std::error::Error>>;

/// What one figure shows.
pub struct Figure<'a> {
    pub rows: &'a [Row],
    pub dataset: &'a str,
    pub backend: &'a str,
    pub skews: &'a [f64],
    pub pools: &'a [PoolSpec],
    /// Policy labels in bar order.
    pub policies: &'a [String],
}

impl Figure<'_> {
    fn find(&self, pool: PoolSpec, skew: f64, policy: &str) -> Option<&Row> {
        self.rows.iter().find(|r| {
            r.dataset == self.dataset
                && r.backend == self.backend
                && (r.skew - skew).abs() < 1e-9
                && r.label() == policy
                && r.pool.is_none_or(|(p, _)| p == pool)
        })
    }

    fn pool_budget(&self, pool: PoolSpec) -> Option<shards::Capacity> {
        self.rows
            .iter()
            .filter(|r| r.dataset == self.dataset)
            .find_map(|r| r.pool.filter(|(p, _)| *p == pool))
            .map(|(_, c)| c)
    }

    fn panel_caption(&self, pool: PoolSpec) -> String {
        match self.pool_budget(pool) {
            Some(c) => format!("{} (pool {pool}, {})", self.dataset, capacity_label(c)),
            None => format!("{} (pool {pool})", self.dataset),
        }
    }
}

/// Bar `j` of `n` in the group centred on `x`: its left and right edges.
fn bar_span(x: f64, j: usize, n: usize) -> (f64, f64) {
    const GROUP: f64 = 0.84;
    let w = GROUP / n as f64;
    let left = x - GROUP / 2.0 + j as f64 * w;
    (left + 0.08 * w, left + 0.92 * w)
}

fn skew_axis_label(skews: &[f64], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < skews.len() {
        format!("{:.2}", skews[i as usize])
    } else {
        String::new()
    }
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// A figure's canvas: the whole bitmap, one area per pool, and the legend column.
struct Canvas<'a> {
    root: Area<'a>,
    panels: Vec<Area<'a>>,
    legend: Area<'a>,
}

/// White, titled, and split into one area per pool and a legend column.
fn canvas<'a>(
    path: &'a Path,
    pools: usize,
    title: &str,
) -> Result<Canvas<'a>, Box<dyn std::error::Error>> {
    let root =
        BitMapBackend::new(path, (PANEL_W * pools as u32 + LEGEND_W, FIG_H)).into_drawing_area();
    root.fill(&WHITE)?;
    let titled = root.titled(title, ("sans-serif", 20))?;
    let (plots, legend) = titled.split_horizontally(PANEL_W * pools as u32);
    Ok(Canvas {
        root,
        panels: plots.split_evenly((1, pools)),
        legend,
    })
}

/// Legend entries (swatch colour, label) top-down in the legend column.
fn draw_legend(area: &Area<'_>, entries: &[(RGBAColor, String)]) -> Plot {
    for (i, (color, label)) in entries.iter().enumerate() {
        let y = 60 + 24 * i as i32;
        area.draw(&Rectangle::new([(8, y - 7), (24, y + 7)], color.filled()))?;
        area.draw(&Text::new(
            label.clone(),
            (32, y - 8),
            ("sans-serif", 15).into_font(),
        ))?;
    }
    Ok(())
}

fn solid(c: RGBColor) -> RGBAColor {
    c.to_rgba()
}

/// Figure 10: recall@10 per policy, per skew, one panel per pool.
pub fn recall_figure(fig: &Figure, path: &Path) -> Plot {
    let Canvas {
        root,
        panels,
        legend,
    } = canvas(
        path,
        fig.pools.len(),
        &format!(
            "Recall@10 against exact neighbours ({} backend)",
            fig.backend
        ),
    )?;
    let n_skews = fig.skews.len();
    let label = |x: &f64| skew_axis_label(fig.skews, *x);
    for (panel, &pool) in panels.iter().zip(fig.pools) {
        let mut chart = ChartBuilder::on(panel)
            .caption(fig.panel_caption(pool), ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5f64..(n_skews as f64 - 0.5), 0f64..1.0)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * n_skews + 1)
            .x_label_formatter(&label)
            .y_labels(11)
            .light_line_style(WHITE)
            .y_label_formatter(&|y| format!("{y:.1}"))
            .y_desc("recall@10")
            .x_desc("simZipf skew")
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .draw()?;
        for (j, policy) in fig.policies.iter().enumerate() {
            let color = PALETTE[j % PALETTE.len()];
            let bars: Vec<Rectangle<(f64, f64)>> = fig
                .skews
                .iter()
                .enumerate()
                .filter_map(|(i, &skew)| {
                    let r = fig.find(pool, skew, policy)?;
                    let (x0, x1) = bar_span(i as f64, j, fig.policies.len());
                    Some(Rectangle::new(
                        [(x0, 0.0), (x1, r.result.recall())],
                        color.filled(),
                    ))
                })
                .collect();
            chart.draw_series(bars)?;
        }
    }
    let entries: Vec<(RGBAColor, String)> = fig
        .policies
        .iter()
        .enumerate()
        .map(|(j, p)| (solid(PALETTE[j % PALETTE.len()]), p.clone()))
        .collect();
    draw_legend(&legend, &entries)?;
    root.present()?;
    Ok(())
}

/// Figure 11: hit ratio per policy, per skew, stacked exact / alias / approximate.
pub fn hits_figure(fig: &Figure, path: &Path) -> Plot {
    // (colour index as in the recall figure, label): no-cache has no hits to show.
    let policies: Vec<(usize, &String)> = fig
        .policies
        .iter()
        .enumerate()
        .filter(|(_, p)| p.parse::<Policy>().is_ok_and(|p| p.rule != Rule::NoCache))
        .collect();
    let Canvas {
        root,
        panels,
        legend,
    } = canvas(
        path,
        fig.pools.len(),
        &format!(
            "Hit ratio: exact (yellow) + alias (light) + approximate (dark) ({} backend)",
            fig.backend
        ),
    )?;
    let n_skews = fig.skews.len();
    let label = |x: &f64| skew_axis_label(fig.skews, *x);
    for (panel, &pool) in panels.iter().zip(fig.pools) {
        let mut chart = ChartBuilder::on(panel)
            .caption(fig.panel_caption(pool), ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5f64..(n_skews as f64 - 0.5), 0f64..100.0)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * n_skews + 1)
            .x_label_formatter(&label)
            .y_labels(11)
            .light_line_style(WHITE)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .y_desc("hit ratio (%)")
            .x_desc("simZipf skew")
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .draw()?;
        for (j, &(c, policy)) in policies.iter().enumerate() {
            let color = PALETTE[c % PALETTE.len()];
            let light = color.mix(0.4);
            let mut segments = Vec::new();
            for (i, &skew) in fig.skews.iter().enumerate() {
                let Some(r) = fig.find(pool, skew, policy) else {
                    continue;
                };
                let x = &r.result;
                let (x0, x1) = bar_span(i as f64, j, policies.len());
                let e = 100.0 * x.ratio(x.exact.count);
                let a = e + 100.0 * x.ratio(x.alias.count);
                let t = a + 100.0 * x.ratio(x.approximate.count);
                segments.push(Rectangle::new([(x0, 0.0), (x1, e)], EXACT_HIT.filled()));
                segments.push(Rectangle::new([(x0, e), (x1, a)], light.filled()));
                segments.push(Rectangle::new([(x0, a), (x1, t)], color.filled()));
                segments.push(Rectangle::new([(x0, 0.0), (x1, t)], BLACK.stroke_width(1)));
            }
            chart.draw_series(segments)?;
        }
    }
    let mut entries: Vec<(RGBAColor, String)> = policies
        .iter()
        .map(|&(c, p)| (solid(PALETTE[c % PALETTE.len()]), p.clone()))
        .collect();
    entries.push((solid(EXACT_HIT), "exact hits".into()));
    draw_legend(&legend, &entries)?;
    root.present()?;
    Ok(())
}

/// A policy family of a frontier figure: the rows whose label starts with `prefix`.
fn family_of(label: &str) -> Option<&'static str> {
    let clock = label.contains(":clock");
    if label.contains(":spread=") {
        Some(if clock {
            "guarded + clock"
        } else {
            "guarded, spread"
        })
    } else if label.starts_with("guarded") {
        Some(if clock {
            "guarded + clock"
        } else {
            "guarded, minD/div"
        })
    } else if label == "aker" || label.starts_with("aker:") {
        Some(if clock { "aker + clock" } else { "aker, swept" })
    } else {
        None
    }
}

/// Recall against hit ratio, one panel per skew, each policy family a line through its
/// runs (ascending hit ratio), for one data set, backend and pool.
pub fn frontier_figure(fig: &Figure, pool: PoolSpec, path: &Path) -> Plot {
    let title = format!(
        "{} — {} backend, pool {pool}: recall@k against hit %",
        fig.dataset, fig.backend
    );
    let c = canvas(path, fig.skews.len(), &title)?;
    let families = [
        "aker, swept",
        "guarded, minD/div",
        "guarded, spread",
        "aker + clock",
        "guarded + clock",
    ];
    for (panel, &skew) in c.panels.iter().zip(fig.skews) {
        let mut series: Vec<Vec<(f64, f64)>> = vec![Vec::new(); families.len()];
        for label in fig.policies {
            let (Some(name), Some(r)) = (family_of(label), fig.find(pool, skew, label)) else {
                continue;
            };
            let i = families
                .iter()
                .position(|f| *f == name)
                .expect("a listed family");
            let hits = r.result.hits() as f64 / r.result.requests.max(1) as f64;
            series[i].push((100.0 * hits, r.result.recall()));
        }
        let all: Vec<(f64, f64)> = series.iter().flatten().copied().collect();
        if all.is_empty() {
            continue;
        }
        let (x0, x1) = all
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (y0, y1) = all
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("skew {skew:.2}"), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(
                (x0 - 1.0)..(x1 + 1.0),
                (y0 - 0.005)..(y1 + 0.005).min(1.001),
            )?;
        chart
            .configure_mesh()
            .x_desc("hit %")
            .y_desc("recall@k")
            .draw()?;
        for (i, pts) in series.iter_mut().enumerate() {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = PALETTE[i % PALETTE.len()];
            chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?;
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
    }
    let entries: Vec<(RGBAColor, String)> = families
        .iter()
        .enumerate()
        .map(|(i, f)| (solid(PALETTE[i % PALETTE.len()]), f.to_string()))
        .collect();
    draw_legend(&c.legend, &entries)?;
    c.root.present()?;
    Ok(())
}
