//! The recall report: one row per run, written as Markdown tables (per data set, backend
//! and pool, like the panels of the paper's Figures 10 and 11) and as CSV, plus the
//! faithfulness check against ALGORITHM.md's reference figures.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use shards::{Capacity, FilterKind, Metric};

use crate::akerd::{capacity_label, AkerdSettings};
use crate::experiment::{EfPoint, Policy, Rule, RunResult};
use crate::prepare::BasesOrigin;

/// A pool size as `--pools` names it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PoolSpec {
    /// A share of the collection in `(0, 1]`, counted in objects (`1%`, `0.05`).
    Share(f64),
    /// The akerd file's own capacity (`config`): `akerd` rows only.
    Config,
}

/// `1%` or `0.01` (a share of the collection), or `config`.
impl FromStr for PoolSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<PoolSpec, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("config") {
            return Ok(PoolSpec::Config);
        }
        let share = match s.strip_suffix('%') {
            Some(p) => p.parse::<f64>().map(|p| p / 100.0),
            None => s.parse::<f64>(),
        }
        .map_err(|e| format!("pool '{s}': {e} (a share such as 1% or 0.01, or config)"))?;
        if share > 0.0 && share <= 1.0 {
            Ok(PoolSpec::Share(share))
        } else {
            Err(format!("pool '{s}' is not a share in (0, 100%]"))
        }
    }
}

impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolSpec::Share(x) => write!(f, "{}", pct_label(*x)),
            PoolSpec::Config => write!(f, "config"),
        }
    }
}

/// The filter as results.csv names it.
fn filter_name(kind: FilterKind) -> &'static str {
    match kind {
        FilterKind::BruteForce => "brute_force",
        FilterKind::Hnsw { .. } => "hnsw",
        FilterKind::HnswRs { .. } => "hnsw_rs",
    }
}

/// One run of the report.
#[derive(Clone, Debug)]
pub struct Row {
    pub dataset: String,
    /// `exact` (precomputed exact answers) or `hnsw`.
    pub backend: String,
    /// Neighbours per request (recall is recall@k) and the metric, of every row.
    pub k: usize,
    pub metric: shards::Metric,
    pub skew: f64,
    /// The pool as `--pools` named it and the budget the run had (objects for a
    /// share; the akerd file's own for `config`); `None` for no cache.
    pub pool: Option<(PoolSpec, Capacity)>,
    pub policy: Policy,
    /// The query filter the run's cache used; `None` for no cache.
    pub filter: Option<FilterKind>,
    /// The global threshold Proximity+ uses and Potluck+ starts from.
    pub threshold: Option<f32>,
    /// The recall floor the run held (`--recall-floors`); `None`: the plain row.
    pub floor: Option<f64>,
    pub result: RunResult,
}

impl Row {
    pub fn pool_label(&self) -> String {
        match self.pool {
            Some((p, _)) => p.to_string(),
            None => "-".into(),
        }
    }

    /// The policy, with `@floor` for a floor row (`aker@0.95`).
    pub fn label(&self) -> String {
        match self.floor {
            Some(f) => format!("{}@{f}", self.policy),
            None => self.policy.to_string(),
        }
    }
}

/// `0.01` -> `1%`.
pub fn pct_label(fraction: f64) -> String {
    let p = fraction * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{}%", p.round())
    } else {
        format!("{p}%")
    }
}

fn pct(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{:.1}", 100.0 * x)
    }
}

fn num3(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.3}")
    }
}

/// The Markdown table of every row of one data set, backend and pool (no-cache rows,
/// which have no pool, go into every pool's table), ordered by skew then policy.
pub fn table(rows: &[Row], dataset: &str, backend: &str, pool: PoolSpec) -> String {
    let mut sel: Vec<&Row> = rows
        .iter()
        .filter(|r| r.dataset == dataset && r.backend == backend)
        .filter(|r| r.pool.is_none_or(|(p, _)| p == pool))
        .collect();
    sel.sort_by(|a, b| a.skew.total_cmp(&b.skew));
    let mut s = String::new();
    let k = sel.first().map_or(0, |r| r.k);
    let _ = writeln!(
        s,
        "| skew | policy | recall@{k} | hit % | exact % | alias % | approx % | approx-hit recall \
         | approx-hit < 0.8 % | backend calls | entries | aliases | objects | pool MiB | s |"
    );
    s.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in sel {
        let x = &r.result;
        let _ = writeln!(
            s,
            "| {:.2} | {} | {:.3} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
            r.skew,
            r.label(),
            x.recall(),
            pct(x.ratio(x.hits())),
            pct(x.ratio(x.exact.count)),
            pct(x.ratio(x.alias.count)),
            pct(x.ratio(x.approximate.count)),
            num3(x.approximate.mean_recall()),
            pct(x.approximate.share_below_08()),
            x.backend_calls(),
            x.representatives,
            x.aliases,
            x.objects,
            x.bytes as f64 / (1 << 20) as f64,
            x.seconds,
        );
    }
    s
}

pub const CSV_HEADER: &str =
    "dataset,backend,k,metric,skew,pool_pct,pool_objects,pool_budget_bytes,policy,filter,requests,\
recall,hit_ratio,exact_ratio,alias_ratio,approx_ratio,miss_ratio,approx_hit_recall,\
approx_hit_below_0.8,alias_hit_recall,backend_calls,verifications,entries,aliases,objects,\
pool_bytes,evictions,global_threshold,seconds,insert_near_us_p50,insert_near_us_p99,\
insert_near_takers,insert_row_us_p50,insert_row_us_p99,insert_row_takers";

/// The columns results.csv gains when a row ran a recall floor or measured recall
/// against the backend's own answers (`--recall-floors`).
pub const CSV_FLOOR_HEADER: &str = "floor,floor_sample,relative_recall,est_recall,est_low,\
est_high,est_error,final_scale,floor_state,tightened,relaxed,floor_samples,shadow_calls,\
shadow_share,tail_requests,tail_recall,tail_relative_recall";

/// Requests at the end of a run the estimate is also compared with (the shares'
/// half-life in `shards::floor`).
pub const TAIL_REQUESTS: u64 = 20_000;

fn has_floor_columns(rows: &[Row]) -> bool {
    rows.iter()
        .any(|r| r.floor.is_some() || r.result.relative_sum.is_some())
}

/// A row's recall over its last `TAIL_REQUESTS` (from its series).
pub fn tail(r: &Row) -> Option<crate::experiment::WindowPoint> {
    let x = &r.result;
    x.recall_since(x.requests.saturating_sub(TAIL_REQUESTS))
}

/// The recall the floor speaks of: against the backend's answers where measured
/// (an approximate backend), else against exact neighbours.
pub fn floor_recall(r: &Row) -> f64 {
    if r.backend == "exact" {
        r.result.recall()
    } else {
        r.result.relative_recall().unwrap_or(f64::NAN)
    }
}

fn floor_csv(r: &Row, opt: &dyn Fn(f64) -> String) -> String {
    let x = &r.result;
    let rel = x.relative_recall().map_or(String::new(), opt);
    let t = tail(r);
    let (tail_n, tail_recall, tail_rel) = match t {
        Some(w) => (
            w.requests.to_string(),
            opt(w.recall()),
            w.relative().map_or(String::new(), opt),
        ),
        None => (String::new(), String::new(), String::new()),
    };
    match (&x.floor, r.floor) {
        (Some(f), Some(floor)) => {
            let e = &f.estimate;
            format!(
                "{floor},{},{rel},{},{},{},{},{},{},{},{},{},{},{},{tail_n},{tail_recall},{tail_rel}",
                f.sample,
                opt(e.recall),
                opt(e.low),
                opt(e.high),
                opt(e.recall - floor_recall(r)),
                e.scale,
                e.state.name(),
                e.tightened,
                e.relaxed,
                e.samples,
                x.shadow_calls,
                opt(x.shadow_share()),
            )
        }
        _ => format!(",,{rel},,,,,,,,,,,,{tail_n},{tail_recall},{tail_rel}"),
    }
}

/// All rows as CSV (ratios as fractions; empty cells where a value does not apply).
pub fn csv(rows: &[Row]) -> String {
    let opt = |x: f64| {
        if x.is_nan() {
            String::new()
        } else {
            format!("{x:.6}")
        }
    };
    let extra = has_floor_columns(rows);
    let mut s = String::from(CSV_HEADER);
    if extra {
        s.push(',');
        s.push_str(CSV_FLOOR_HEADER);
    }
    s.push('\n');
    for r in rows {
        let x = &r.result;
        let pool_pct = match r.pool {
            Some((PoolSpec::Share(f), _)) => format!("{}", f * 100.0),
            Some((PoolSpec::Config, _)) => "config".into(),
            None => String::new(),
        };
        let (pool_objects, pool_budget_bytes) = match r.pool {
            Some((_, Capacity::Objects(n))) => (n.to_string(), String::new()),
            Some((_, Capacity::Bytes(b))) => (String::new(), b.to_string()),
            None => (String::new(), String::new()),
        };
        let filter = r.filter.map_or("", filter_name);
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{},{},{},{},{},{},{},{},{},{},{},{:.3},{}{}",
            r.dataset,
            r.backend,
            r.k,
            r.metric.name(),
            r.skew,
            pool_pct,
            pool_objects,
            pool_budget_bytes,
            r.label(),
            filter,
            x.requests,
            x.recall(),
            x.ratio(x.hits()),
            x.ratio(x.exact.count),
            x.ratio(x.alias.count),
            x.ratio(x.approximate.count),
            x.ratio(x.miss.count),
            opt(x.approximate.mean_recall()),
            opt(x.approximate.share_below_08()),
            opt(x.alias.mean_recall()),
            x.backend_calls(),
            x.verifications,
            x.representatives,
            x.aliases,
            x.objects,
            x.bytes,
            x.evictions,
            r.threshold.map_or(String::new(), |t| t.to_string()),
            x.seconds,
            inserts_csv(x.inserts),
            if extra {
                format!(",{}", floor_csv(r, &opt))
            } else {
                String::new()
            },
        );
    }
    s
}

/// The insert probe's columns (`experiment::InsertProbe`), empty without a cache.
fn inserts_csv(p: Option<crate::experiment::InsertProbe>) -> String {
    let Some(p) = p else {
        return ",,,,,".into();
    };
    format!(
        "{:.1},{:.1},{:.2},{:.1},{:.1},{:.2}",
        p.near.us_p50,
        p.near.us_p99,
        p.near.takers_mean,
        p.rows.us_p50,
        p.rows.us_p99,
        p.rows.takers_mean,
    )
}

pub const SERIES_HEADER: &str = "dataset,backend,skew,phase_skew,pool_pct,policy,floor,\
window_end,window_requests,recall,relative_recall,hit_ratio,shadow_calls,est_recall,est_low,\
est_high,scale,state";

/// Every row's per-window series (`floor-series.csv`): recall, hit ratio and the
/// floor's estimate at each window's end.
pub fn series_csv(rows: &[Row], phase: Option<f64>) -> String {
    let mut s = String::from(SERIES_HEADER);
    s.push('\n');
    let f6 = |x: f64| format!("{x:.6}");
    for r in rows {
        let pool = match r.pool {
            Some((PoolSpec::Share(f), _)) => format!("{}", f * 100.0),
            Some((PoolSpec::Config, _)) => "config".into(),
            None => String::new(),
        };
        for w in &r.result.series {
            let (e, lo, hi) = match w.estimate {
                Some((e, lo, hi)) => (f6(e), f6(lo), f6(hi)),
                None => Default::default(),
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{pool},{},{},{},{},{:.6},{},{:.6},{},{e},{lo},{hi},{},{}",
                r.dataset,
                r.backend,
                r.skew,
                phase.map_or(String::new(), |p| p.to_string()),
                r.label(),
                r.floor.map_or(String::new(), |f| f.to_string()),
                w.end,
                w.requests,
                w.recall(),
                w.relative().map_or(String::new(), f6),
                w.hit_ratio(),
                w.shadow_calls,
                w.scale,
                w.state.unwrap_or(""),
            );
        }
    }
    s
}

/// Whether and by how much a floor row missed its floor: `yes`, or `no (-x.xxx)`.
fn held(measured: f64, floor: f64) -> String {
    if measured >= floor {
        "yes".into()
    } else {
        format!("**no** ({:+.3})", measured - floor)
    }
}

/// The floor rows of one data set, backend and pool: what was held and what it cost,
/// beside the plain row of the same policy and skew.
pub fn floor_table(rows: &[Row], dataset: &str, backend: &str, pool: PoolSpec) -> String {
    let mut sel: Vec<&Row> = rows
        .iter()
        .filter(|r| r.dataset == dataset && r.backend == backend && r.floor.is_some())
        .filter(|r| r.pool.is_some_and(|(p, _)| p == pool))
        .collect();
    if sel.is_empty() {
        return String::new();
    }
    sel.sort_by(|a, b| a.skew.total_cmp(&b.skew));
    let exact = backend == "exact";
    let k = sel[0].k;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| skew | policy | floor | recall@{k}{} | plain row's | hit % | plain hit % | estimate [low, high] \
         | est − measured | last {}k: measured, est − it | scale | state | tightened / relaxed \
         | shadow calls | shadow share % | held (whole run) |",
        if exact { "" } else { " (relative; exact)" },
        TAIL_REQUESTS / 1000,
    );
    s.push_str("|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---|\n");
    for r in sel {
        let x = &r.result;
        let plain = rows.iter().find(|p| {
            p.floor.is_none()
                && p.dataset == r.dataset
                && p.backend == r.backend
                && p.policy == r.policy
                && p.skew == r.skew
                && p.pool.map(|q| q.0) == r.pool.map(|q| q.0)
        });
        let f = r.floor.expect("a floor row");
        let measured = floor_recall(r);
        let recall = if exact {
            num3(measured)
        } else {
            format!("{} ({})", num3(measured), num3(x.recall()))
        };
        let plain_recall = plain.map_or("-".into(), |p| {
            if exact {
                num3(floor_recall(p))
            } else {
                format!("{} ({})", num3(floor_recall(p)), num3(p.result.recall()))
            }
        });
        let plain_hits = plain.map_or("-".into(), |p| pct(p.result.ratio(p.result.hits())));
        let Some(o) = &x.floor else { continue };
        let e = &o.estimate;
        let tail_cell = tail(r).map_or("-".into(), |w| {
            let m = if exact {
                w.recall()
            } else {
                w.relative().unwrap_or(f64::NAN)
            };
            format!("{} ({:+.3})", num3(m), e.recall - m)
        });
        let _ = writeln!(
            s,
            "| {:.2} | {} | {f} | {recall} | {plain_recall} | {} | {plain_hits} | {:.3} [{:.3}, {:.3}] \
             | {:+.3} | {tail_cell} | {:.4} | {} | {} / {} | {} | {} | {} |",
            r.skew,
            r.policy,
            pct(x.ratio(x.hits())),
            e.recall,
            e.low,
            e.high,
            e.recall - measured,
            e.scale,
            e.state.name(),
            e.tightened,
            e.relaxed,
            x.shadow_calls,
            pct(x.shadow_share()),
            held(measured, f),
        );
    }
    s
}

/// After a workload change at request `switch`: how long the floor's low bound stayed
/// below the floor and what was served meanwhile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reconvergence {
    /// The end of the first window after the change whose low bound was below the floor.
    pub dipped_at: Option<u64>,
    /// The end of the first window after that with the low bound back at or above it;
    /// `None`: not within the run.
    pub back_at: Option<u64>,
    /// Requests from the change to `back_at` (0: it never dipped).
    pub requests: Option<u64>,
    /// Served between the change and `back_at` (or the run's end).
    pub between: crate::experiment::WindowPoint,
    /// Windows after the change whose measured recall was below the floor.
    pub windows_below: usize,
    pub windows_after: usize,
}

/// `r`'s re-convergence after the change at `switch` (a window boundary).
pub fn reconvergence(r: &Row, switch: u64) -> Option<Reconvergence> {
    let floor = r.floor?;
    let after: Vec<&crate::experiment::WindowPoint> =
        r.result.series.iter().filter(|w| w.end > switch).collect();
    let low = |w: &crate::experiment::WindowPoint| w.estimate.map_or(0.0, |e| e.1);
    let dipped = after.iter().position(|w| low(w) < floor);
    let back = dipped.and_then(|d| {
        after[d..]
            .iter()
            .position(|w| low(w) >= floor)
            .map(|b| d + b)
    });
    let until = match (dipped, back) {
        (None, _) => after.first().map_or(switch, |w| w.end),
        (Some(_), Some(b)) => after[b].end,
        (Some(_), None) => after.last().map_or(switch, |w| w.end),
    };
    let mut between = crate::experiment::WindowPoint::default();
    for w in after.iter().filter(|w| w.end <= until) {
        between.requests += w.requests;
        between.recall_sum += w.recall_sum;
        between.relative_sum = w
            .relative_sum
            .map(|s| s + between.relative_sum.unwrap_or(0.0));
        between.hits += w.hits;
        between.shadow_calls += w.shadow_calls;
        between.end = w.end;
    }
    let measure = |w: &crate::experiment::WindowPoint| {
        if r.backend == "exact" {
            w.recall()
        } else {
            w.relative().unwrap_or(f64::NAN)
        }
    };
    Some(Reconvergence {
        dipped_at: dipped.map(|d| after[d].end),
        back_at: back.map(|b| after[b].end),
        requests: match (dipped, back) {
            (None, _) => Some(0),
            (Some(_), Some(b)) => Some(after[b].end - switch),
            (Some(_), None) => None,
        },
        between,
        windows_below: after.iter().filter(|w| measure(w) < floor).count(),
        windows_after: after.len(),
    })
}

/// The re-convergence table of every floor row of a changed workload.
pub fn reconvergence_table(rows: &[Row], switch: u64) -> String {
    let mut s = String::new();
    for r in rows.iter().filter(|r| r.floor.is_some()) {
        let Some(c) = reconvergence(r, switch) else {
            continue;
        };
        if s.is_empty() {
            s.push_str(
                "| data set | backend | pool | skew | policy | floor | low bound first below (request) \
                 | back at/above (request) | requests to re-converge | served meanwhile: recall (exact) \
                 | hit % | windows after the change with measured recall < floor |\n\
                 |---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
            );
        }
        let opt = |x: Option<u64>| x.map_or("-".into(), |v| v.to_string());
        let w = &c.between;
        let served = if w.requests == 0 {
            "-".into()
        } else if r.backend == "exact" {
            num3(w.recall())
        } else {
            format!(
                "{} ({})",
                num3(w.relative().unwrap_or(f64::NAN)),
                num3(w.recall())
            )
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {served} | {} | {} of {} |",
            r.dataset,
            r.backend,
            r.pool_label(),
            r.skew,
            r.policy,
            r.floor.unwrap_or(0.0),
            opt(c.dipped_at),
            opt(c.back_at),
            c.requests
                .map_or("not within the run".into(), |v| v.to_string()),
            if w.requests == 0 {
                "-".into()
            } else {
                pct(w.hit_ratio())
            },
            c.windows_below,
            c.windows_after,
        );
    }
    s
}

/// ALGORITHM.md's reference figures for paper-Aker on GloVe (brute-force filter, exact
/// backend, Δ = 0, k = 10, 100,000 requests): (pool, skew, recall, hit ratio).
pub const GLOVE_REFERENCE: [(f64, f64, f64, f64); 6] = [
    (0.01, 0.30, 0.956, 0.145),
    (0.01, 0.60, 0.951, 0.178),
    (0.01, 0.99, 0.944, 0.355),
    (0.05, 0.30, 0.929, 0.409),
    (0.05, 0.60, 0.932, 0.475),
    (0.05, 0.99, 0.932, 0.694),
];

/// Points by which a faithful implementation may differ from the reference.
pub const TOLERANCE_POINTS: f64 = 2.0;

/// The faithfulness table: paper-Aker with the brute-force filter on the exact backend
/// against [`GLOVE_REFERENCE`], for the rows of `dataset` that match a reference cell;
/// empty when none does. Also shows the HNSW filter beside it, so the difference the
/// filter makes is in view.
pub fn faithfulness(rows: &[Row], dataset: &str) -> String {
    let find = |pool: f64, skew: f64, bf: bool| {
        rows.iter().find(|r| {
            // The reference is squared L2 at k = 10 on raw GloVe.
            r.dataset == dataset
                && r.metric == shards::Metric::L2Sq
                && r.k == 10
                && r.backend == "exact"
                && r.floor.is_none()
                && r.policy.rule == Rule::Aker
                && r.policy.brute_force_filter == bf
                && r.pool.is_some_and(
                    |(p, _)| matches!(p, PoolSpec::Share(f) if (f - pool).abs() < 1e-9),
                )
                && (r.skew - skew).abs() < 1e-9
        })
    };
    let mut s = String::new();
    for &(pool, skew, ref_recall, ref_hits) in &GLOVE_REFERENCE {
        let Some(bf) = find(pool, skew, true) else {
            continue;
        };
        if s.is_empty() {
            s.push_str(
                "| pool | skew | reference recall | aker-bf recall | Δ pts | reference hit % \
                 | aker-bf hit % | Δ pts | within ±2 | aker (HNSW filter) recall / hit % |\n",
            );
            s.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|:-:|---:|\n");
        }
        let x = &bf.result;
        let d_recall = 100.0 * (x.recall() - ref_recall);
        let d_hits = 100.0 * (x.ratio(x.hits()) - ref_hits);
        let ok = d_recall.abs() <= TOLERANCE_POINTS && d_hits.abs() <= TOLERANCE_POINTS;
        let hnsw = find(pool, skew, false).map_or("-".into(), |h| {
            format!(
                "{:.3} / {}",
                h.result.recall(),
                pct(h.result.ratio(h.result.hits()))
            )
        });
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.3} | {:.3} | {:+.1} | {:.1} | {} | {:+.1} | {} | {} |",
            pct_label(pool),
            skew,
            ref_recall,
            x.recall(),
            d_recall,
            100.0 * ref_hits,
            pct(x.ratio(x.hits())),
            d_hits,
            if ok { "yes" } else { "**no**" },
            hnsw,
        );
    }
    s
}

/// The faithfulness table of `d` under its heading, or one sentence saying why there is
/// none: the reference figures exist only for raw GloVe with the 1,000 held-out bases.
fn faithfulness_section(s: &mut String, d: &DatasetSummary, rows: &[Row]) {
    let why_not = if d.name != "glove" {
        "ALGORITHM.md's reference figures exist only for GloVe (raw, 1,000 held-out \
         bases), so this data set has no faithfulness check."
    } else if !d.bases.is_paper() {
        "ALGORITHM.md's reference figures were measured with 1,000 bases held out of \
         GloVe, so with these bases there is no faithfulness check."
    } else {
        let faith = faithfulness(rows, &d.name);
        if !faith.is_empty() {
            let _ = writeln!(
                s,
                "### Faithfulness: paper-Aker against ALGORITHM.md's reference figures\n\n{faith}"
            );
            return;
        }
        "No faithfulness check: no `aker-bf` row on the exact backend matches a reference \
         cell (l2sq, k = 10, pool 1% or 5%, skew 0.30, 0.60 or 0.99)."
    };
    let _ = writeln!(s, "{why_not}\n");
}

/// Per skew: the stream's distinct vectors and the global threshold it calibrated.
#[derive(Clone, Debug)]
pub struct SkewSummary {
    pub skew: f64,
    pub distinct: usize,
    pub threshold: f32,
}

/// How the HNSW backend was tuned for one stream and what its answers cost.
#[derive(Clone, Debug)]
pub struct HnswStream {
    pub skew: f64,
    /// The ef sweep on requests sampled from the stream; the last point is the ef used.
    pub sweep: Vec<EfPoint>,
    /// Distinct vectors searched once, their answers reused by every run.
    pub memoised: usize,
    /// Of those, how many were searched again, and how many came back different.
    pub checked: usize,
    pub disagreements: usize,
}

/// How the HNSW backend was built and tuned.
#[derive(Clone, Debug)]
pub struct HnswSummary {
    pub m: usize,
    pub ef_construction: usize,
    pub build_seconds: f64,
    /// Requests sampled per stream for its ef sweep.
    pub samples: usize,
    pub target: f64,
    pub streams: Vec<HnswStream>,
}

/// What the report says about one data set besides its rows.
#[derive(Clone, Debug)]
pub struct DatasetSummary {
    pub name: String,
    pub description: String,
    /// Where the group bases came from (held out, or `--queries`).
    pub bases: BasesOrigin,
    pub collection: usize,
    pub dim: usize,
    pub metric: Metric,
    pub members: usize,
    pub truth: String,
    pub skews: Vec<SkewSummary>,
    pub hnsw: Option<HnswSummary>,
    /// Query filters checked against a scan: (filter, representatives, share of
    /// look-ups whose first answer was the nearest).
    pub filter_checks: Vec<(shards::FilterKind, usize, f64)>,
    /// (phase, seconds) in order.
    pub phases: Vec<(String, f64)>,
}

/// The run as a whole.
#[derive(Clone, Debug)]
pub struct Header {
    pub command: String,
    pub seeds: String,
    pub k: usize,
    pub delta: usize,
    pub filter_candidates: usize,
    pub standby_search: shards::StandbySearch,
    /// Cache shards (1: one unsharded cache).
    pub shards: usize,
    /// Potluck+'s (grow, shrink).
    pub potluck: (f32, f32),
    pub requests: usize,
    pub pools: Vec<PoolSpec>,
    /// The akerd file's effective settings when `akerd` rows ran.
    pub akerd: Option<AkerdSettings>,
    pub backends: Vec<String>,
    pub threads: usize,
    pub total_seconds: f64,
    /// `--recall-floors` (empty: none), `--floor-sample`, the series' window.
    pub floors: Vec<f64>,
    pub floor_sample: f64,
    pub floor_window: usize,
    /// `--phase-skew` and `--phase-other-groups`: the streams' second half.
    pub phase: Option<(f64, bool)>,
}

/// What the `akerd` rows ran: the file, its effective settings, and where the runner
/// departs from akerd.
fn akerd_header(s: &mut String, a: &AkerdSettings) {
    let _ = writeln!(
        s,
        "The settings above are the paper configuration's (the default, and the faithfulness \
         reference). `akerd` rows run the cache configuration of `{path}` instead, read with \
         akerd's own functions (`aker::config`: `cache.engine_config(dim)`, `cache.policy`, \
         `sharding.shard_count(server.executors)`, `sharding.engine(shards)`), the sharded \
         path even for one shard, with centroids trained on at most `sharding.sample_rows` \
         collection rows as akerd trains them. Their pool follows `--pools` in objects like \
         every other row, so rows compare at the same object count (pool MiB shows what each \
         used); pool `config` keeps the file's own budget. akerd rebalances every \
         `sharding.rebalance_ms` = {ms} ms; the runner has no clock, so it rebalances every \
         {every} searches (`ShardingConfig::default()`). With `store_vectors` the backends \
         return each neighbour's vector, as akerd's embedded stores do. The policy learns \
         once per verification (`OncePerVerification`), as in the other rows.\n\n\
         | akerd file | Δ | k_max | filter_candidates | standby_search | store_vectors | shards | policy | eviction | filter | own pool |\n\
         |---|---:|---:|---:|---|---|---:|---|---|---|---|\n\
         | `{path}` | {} | {} | {} | {:?} | {} | {} ({} centroids) | {} | {:?} | {} | {} |\n",
        a.delta,
        a.k_max,
        a.filter_candidates,
        a.standby_search,
        a.store_vectors,
        a.shards,
        a.centroids,
        crate::akerd::policy_label(&a.policy),
        a.eviction,
        a.filter,
        capacity_label(a.capacity),
        path = a.path.display(),
        ms = a.rebalance_ms,
        every = a.rebalance_every,
    );
}

/// The whole report as Markdown.
pub fn markdown(h: &Header, sets: &[DatasetSummary], rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Recall report (paper §5.2, Figures 10 and 11)\n");
    let _ = writeln!(s, "Regenerate with:\n\n```\n{}\n```\n", h.command);
    let _ = writeln!(
        s,
        "k = {}, Δ = {}, {} requests per stream, simZipf groups of 50 with λ ~ U(0, 0.5) and \
         partners drawn from the group bases themselves (each data set says where they \
         came from), YCSB scrambled Zipfian over groups. \
         Pools (objects, ids only): {}. Filter candidates checked per lookup: {}; filter generations: {:?}; cache shards: {}. Potluck+ factors: grow ×{}, shrink ×{}. Paper-Aker: \
         α_L = 1.1, α_T = 0.25, τ₀ = minD / 4. Seeds: {}. {} worker threads; total wall \
         time {:.0} s.\n",
        h.k,
        h.delta,
        h.requests,
        h.pools.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "),
        h.filter_candidates,
        h.standby_search,
        h.shards,
        h.potluck.0,
        h.potluck.1,
        h.seeds,
        h.threads,
        h.total_seconds,
    );
    s.push_str(
        "Columns: recall@k against exact neighbours over all requests; hit % split into \
         exact (equality), alias and approximate (filter) hits; the mean recall of \
         approximate hits and the share of them below 0.8; backend calls (misses, Potluck+ \
         verifications included); entries (representatives), aliases, objects and the bytes they take (pool MiB) at \
         the end; the run's wall time. Policies: `aker` = paper-Aker with the HNSW filter \
         (m 4, efc 8, efs 16), `-bf` = the brute-force filter, `prx` = Proximity+, `plNN` = \
         Potluck+ with p = NN %, `none` = no cache.\n\n",
    );
    if let Some(a) = &h.akerd {
        akerd_header(&mut s, a);
    }
    if let Some((skew, other)) = h.phase {
        let _ = writeln!(
            s,
            "**Changed workload**: each stream's second half (from request {}) comes from \
             another simZipf stream at skew {skew:.2}{}; a row's skew is its first half's.\n",
            h.requests - h.requests / 2,
            if other {
                ", over other groups (group g -> g + n/2 mod n)"
            } else {
                ", over the same groups"
            }
        );
    }
    if !h.floors.is_empty() {
        let _ = writeln!(
            s,
            "**Recall floors** {} (`shards::floor`, its defaults but the floor and a sample \
             of {}): every cached row also runs once per floor (`policy@floor`). After each \
             hit, with probability `sample_fraction(kind)` ({} of approximate and alias \
             hits, {} of exact ones), a shadow check searches the backend for the same \
             request and records the served answer's recall@k against it; the controller \
             then scales every approximate hit's threshold. Shadow checks are not in \
             backend calls; shadow share = shadow / (backend calls + shadow). The floor's \
             recall is relative to the backend's answer: on the exact backend recall@k \
             itself, on HNSW the loss the cache adds (rows there show it, with recall against \
             exact neighbours in brackets; on HNSW every request is also scored against the \
             backend's answer). The estimate decays (shares over ~{} replies, samples with \
             a half-life of 200 per kind), so it is compared with the whole run and with \
             the last {} requests. Per-window series ({} requests): `floor-series.csv`.\n",
            h.floors
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            h.floor_sample,
            h.floor_sample,
            h.floor_sample / 8.0,
            TAIL_REQUESTS,
            TAIL_REQUESTS,
            h.floor_window,
        );
    }
    for d in sets {
        let _ = writeln!(s, "## {}\n", d.name);
        let _ = writeln!(
            s,
            "{}; {}; collection {} x {}-d ({}), {} group members; ground truth: {}.\n",
            d.description,
            d.bases.describe(),
            d.collection,
            d.dim,
            d.metric.name(),
            d.members,
            d.truth
        );
        s.push_str("| skew | distinct request vectors | global threshold (1st pct of inter-query distances) |\n|---:|---:|---:|\n");
        for k in &d.skews {
            let _ = writeln!(s, "| {:.2} | {} | {} |", k.skew, k.distinct, k.threshold);
        }
        s.push('\n');
        if let Some(hn) = &d.hnsw {
            let _ = writeln!(
                s,
                "HNSW backend: m = {}, ef_construction = {}, built in {:.0} s. As in the paper \
                 (\"for each workload ... 0.9 recall at k = 10 without approximate caches\"), \
                 ef_search is tuned per stream: the smallest ef whose recall@{} over {} \
                 requests sampled from the stream reaches {}. Each distinct vector of a stream \
                 is searched once and its answer reused by every run of that stream.\n",
                hn.m, hn.ef_construction, hn.build_seconds, h.k, hn.samples, hn.target
            );
            let _ = writeln!(
                s,
                "| skew | ef | sampled recall@{} | sweep | vectors searched | searched again: differ |\n\
                 |---:|---:|---:|---|---:|---:|",
                h.k
            );
            for st in &hn.streams {
                let last = st.sweep.last().copied().unwrap_or(EfPoint {
                    ef: 0,
                    recall: f64::NAN,
                });
                let flag = if last.recall < hn.target {
                    " (target not reached)"
                } else {
                    ""
                };
                let _ = writeln!(
                    s,
                    "| {:.2} | {}{flag} | {:.3} | {} | {} | {} of {} |",
                    st.skew,
                    last.ef,
                    last.recall,
                    st.sweep
                        .iter()
                        .map(|p| format!("{}: {:.3}", p.ef, p.recall))
                        .collect::<Vec<_>>()
                        .join(", "),
                    st.memoised,
                    st.disagreements,
                    st.checked
                );
            }
            s.push('\n');
        }
        for &(kind, n, share) in &d.filter_checks {
            let _ = writeln!(
                s,
                "Query filter check: the {kind} filter over {n} \
                 request vectors of the first stream returns the nearest of them first for \
                 **{:.1}%** of {n} other request vectors (the brute-force filter: 100%).\n",
                100.0 * share
            );
        }
        let _ = writeln!(
            s,
            "Phases: {}.\n",
            d.phases
                .iter()
                .map(|(p, t)| format!("{p} {t:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        faithfulness_section(&mut s, d, rows);
        for backend in &h.backends {
            for &pool in &h.pools {
                if !rows.iter().any(|r| {
                    r.dataset == d.name
                        && &r.backend == backend
                        && r.pool.is_some_and(|(p, _)| p == pool)
                }) {
                    continue;
                }
                let budget = rows
                    .iter()
                    .find_map(|r| r.pool.filter(|(p, _)| *p == pool && r.dataset == d.name))
                    .map_or("-".into(), |(_, c)| capacity_label(c));
                let what = match pool {
                    PoolSpec::Share(_) => budget,
                    PoolSpec::Config => format!("the akerd file's own budget, {budget}"),
                };
                let _ = writeln!(
                    s,
                    "### {}, {} backend, pool {pool} ({what})\n\n{}",
                    d.name,
                    backend,
                    table(rows, &d.name, backend, pool)
                );
                let floors = floor_table(rows, &d.name, backend, pool);
                if !floors.is_empty() {
                    let _ = writeln!(
                        s,
                        "Recall floors, {}, {} backend, pool {pool}:\n\n{floors}",
                        d.name, backend
                    );
                }
            }
        }
    }
    if h.phase.is_some() {
        let switch = (h.requests - h.requests / 2) as u64;
        let t = reconvergence_table(rows, switch);
        if !t.is_empty() {
            let _ = writeln!(
                s,
                "## Re-convergence after the change (request {switch})\n\n\
                 From the series (windows of {} requests, so request counts are window ends): \
                 the first window after the change whose end-of-window low bound was below \
                 the floor, the first after it back at or above, and what was served from \
                 the change to then (to the run's end when it never came back; the first \
                 window after the change when it never dipped).\n\n{t}",
                h.floor_window
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::KindTally;

    fn row(policy: &str, pool: Option<(f64, usize)>, skew: f64, hits: u64, recall: f64) -> Row {
        let n = 1000;
        let policy: Policy = policy.parse().unwrap();
        Row {
            dataset: "glove".into(),
            backend: "exact".into(),
            k: 10,
            metric: shards::Metric::L2Sq,
            skew,
            pool: pool.map(|(f, n)| (PoolSpec::Share(f), Capacity::Objects(n))),
            policy,
            filter: (policy.rule != Rule::NoCache).then(|| policy.filter()),
            threshold: None,
            floor: None,
            result: RunResult {
                requests: n,
                exact: KindTally {
                    count: hits,
                    recall_sum: recall * n as f64,
                    below_08: 0,
                },
                miss: KindTally {
                    count: n - hits,
                    recall_sum: 0.0,
                    below_08: 0,
                },
                ..Default::default()
            },
        }
    }

    #[test]
    fn tables_select_their_pool_and_keep_no_cache_rows() {
        let rows = vec![
            row("aker-bf", Some((0.01, 10)), 0.3, 150, 0.956),
            row("aker-bf", Some((0.05, 50)), 0.3, 500, 0.9),
            row("none", None, 0.3, 0, 1.0),
        ];
        let t = table(&rows, "glove", "exact", PoolSpec::Share(0.01));
        assert_eq!(t.lines().count(), 4, "{t}");
        assert!(t.contains("| 0.30 | aker-bf | 0.956 | 15.0 |"), "{t}");
        assert!(t.contains("| none |"));
        let c = csv(&rows);
        assert_eq!(c.lines().count(), 4);
        let fields = |l: &str| l.split(',').count();
        assert!(c.lines().all(|l| fields(l) == fields(CSV_HEADER)), "{c}");
        assert!(c
            .lines()
            .nth(3)
            .unwrap()
            .starts_with("glove,exact,10,l2sq,0.3,,,,none,,1000,"));
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .contains(",1,10,,aker-bf,brute_force,"),
            "{c}"
        );
        assert!(t.starts_with("| skew | policy | recall@10 |"), "{t}");
    }

    /// A floor row of 10 windows of 100 requests: recall 0.9 in the first five, 1.0
    /// after; the low bound below `0.95` in windows 6 and 7 only.
    fn floor_row() -> Row {
        use crate::experiment::{FloorOutcome, WindowPoint};
        let mut r = row("aker", Some((0.01, 10)), 0.99, 300, 0.95);
        r.floor = Some(0.95);
        let mut f = shards::floor::RecallFloor::new(shards::floor::FloorConfig {
            floor: 0.95,
            ..Default::default()
        })
        .unwrap();
        f.observe_served(shards::floor::ServedTotals {
            approximate: 300,
            miss: 700,
            ..Default::default()
        });
        for _ in 0..100 {
            f.record(shards::HitKind::Approximate, 0.9);
        }
        r.result.floor = Some(FloorOutcome {
            config_floor: 0.95,
            sample: 0.05,
            estimate: f.estimate(),
        });
        r.result.shadow_calls = 100;
        r.result.series = (1..=10u64)
            .map(|i| WindowPoint {
                end: 100 * i,
                requests: 100,
                recall_sum: if i <= 5 { 90.0 } else { 100.0 },
                relative_sum: None,
                hits: 30,
                shadow_calls: 10,
                estimate: Some((0.97, if i == 6 || i == 7 { 0.9 } else { 0.96 }, 0.99)),
                scale: 0.5,
                state: Some("holding"),
            })
            .collect();
        r
    }

    #[test]
    fn floor_rows_add_columns_a_table_and_a_series() {
        let plain = vec![row("aker", Some((0.01, 10)), 0.99, 300, 0.95)];
        assert_eq!(
            csv(&plain).lines().next(),
            Some(CSV_HEADER),
            "no floor: as before"
        );
        let rows = vec![plain[0].clone(), floor_row()];
        let c = csv(&rows);
        let header = c.lines().next().unwrap();
        assert!(header.ends_with(CSV_FLOOR_HEADER), "{header}");
        let fields = |l: &str| l.split(',').count();
        assert!(c.lines().all(|l| fields(l) == fields(header)), "{c}");
        let line = c.lines().nth(2).unwrap();
        assert!(
            line.contains(",aker@0.95,") && line.contains(",0.95,0.05,,"),
            "{line}"
        );
        // Shadow share: 100 of 100 shadow + 700 misses.
        assert!(line.contains(",100,0.125000,"), "{line}");
        // The last 20,000 requests: all 1,000 there are.
        assert!(line.ends_with(",1000,0.950000,"), "{line}");
        let t = floor_table(&rows, "glove", "exact", PoolSpec::Share(0.01));
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(
            t.contains("| 0.99 | aker | 0.95 | 0.950 | 0.950 | 30.0 | 30.0 |"),
            "{t}"
        );
        assert!(t.contains("| yes |"), "{t}");
        let mut low = floor_row();
        low.floor = Some(0.96);
        let t = floor_table(&[low], "glove", "exact", PoolSpec::Share(0.01));
        assert!(t.contains("**no** (-0.010)"), "{t}");
        let sc = series_csv(&rows, Some(0.3));
        assert_eq!(sc.lines().count(), 11, "{sc}");
        assert!(sc
            .lines()
            .nth(1)
            .unwrap()
            .contains(",0.3,1,aker@0.95,0.95,100,100,0.900000,"));
        assert!(
            sc.lines().all(|l| fields(l) == fields(SERIES_HEADER)),
            "{sc}"
        );
    }

    #[test]
    fn reconvergence_counts_from_the_change_to_the_bound_s_return() {
        let r = floor_row();
        let c = reconvergence(&r, 500).unwrap();
        assert_eq!(
            (c.dipped_at, c.back_at, c.requests),
            (Some(600), Some(800), Some(300))
        );
        assert_eq!(c.between.requests, 300);
        assert_eq!(c.between.recall(), 1.0);
        assert_eq!((c.windows_below, c.windows_after), (0, 5));
        // From the start: recall 0.9 below the floor in five windows.
        let c = reconvergence(&r, 0).unwrap();
        assert_eq!((c.windows_below, c.requests), (5, Some(800)));
        // After the dip: never below.
        let c = reconvergence(&r, 700).unwrap();
        assert_eq!(
            (c.dipped_at, c.requests, c.between.requests),
            (None, Some(0), 100)
        );
        assert!(reconvergence(&row("aker", None, 0.3, 1, 1.0), 0).is_none());
        assert!(
            reconvergence_table(&[r], 500).contains("| 600 | 800 | 300 | 1.000 | 30.0 | 0 of 5 |")
        );
    }

    #[test]
    fn pools_parse_as_shares_or_config() {
        assert_eq!("1%".parse::<PoolSpec>(), Ok(PoolSpec::Share(0.01)));
        assert_eq!(" 0.05 ".parse::<PoolSpec>(), Ok(PoolSpec::Share(0.05)));
        assert_eq!("100%".parse::<PoolSpec>(), Ok(PoolSpec::Share(1.0)));
        assert_eq!("config".parse::<PoolSpec>(), Ok(PoolSpec::Config));
        assert_eq!("Config".parse::<PoolSpec>(), Ok(PoolSpec::Config));
        for bad in ["0", "0%", "150%", "1.5", "-1%", "configs", ""] {
            assert!(bad.parse::<PoolSpec>().is_err(), "{bad}");
        }
        assert_eq!(PoolSpec::Share(0.05).to_string(), "5%");
        assert_eq!(PoolSpec::Config.to_string(), "config");
    }

    #[test]
    fn config_pool_rows_keep_their_own_table_and_budget() {
        let mut akerd = row("aker", None, 0.3, 400, 0.95);
        akerd.policy = "akerd".parse().unwrap();
        akerd.filter = Some(FilterKind::BruteForce);
        akerd.pool = Some((PoolSpec::Config, Capacity::Bytes(256 << 20)));
        let rows = vec![
            row("aker", Some((0.01, 10)), 0.3, 150, 0.956),
            akerd,
            row("none", None, 0.3, 0, 1.0),
        ];
        let t = table(&rows, "glove", "exact", PoolSpec::Config);
        assert!(t.contains("| 0.30 | akerd | 0.950 |"), "{t}");
        assert!(t.contains("| none |") && !t.contains("| aker |"), "{t}");
        let t = table(&rows, "glove", "exact", PoolSpec::Share(0.01));
        assert!(t.contains("| aker |") && !t.contains("| akerd |"), "{t}");
        let c = csv(&rows);
        let line = c.lines().nth(2).unwrap();
        assert!(
            line.starts_with("glove,exact,10,l2sq,0.3,config,,268435456,akerd,brute_force,1000,"),
            "{line}"
        );
    }

    #[test]
    fn the_header_states_akerd_s_effective_settings() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/akerd.toml");
        let file = crate::akerd::AkerdFile::load(&path, Metric::L2Sq).unwrap();
        let mut h = Header {
            command: "bench recall".into(),
            seeds: "s".into(),
            k: 10,
            delta: 0,
            filter_candidates: 1,
            standby_search: shards::StandbySearch::Nearest,
            shards: 1,
            potluck: (1.1, 0.5),
            requests: 1000,
            pools: vec![PoolSpec::Share(0.01), PoolSpec::Config],
            akerd: None,
            backends: vec!["exact".into()],
            threads: 1,
            total_seconds: 1.0,
            floors: vec![],
            floor_sample: 0.05,
            floor_window: 5000,
            phase: None,
        };
        let plain = markdown(&h, &[], &[]);
        assert!(!plain.contains("akerd"), "{plain}");
        h.akerd = Some(file.settings());
        let md = markdown(&h, &[], &[]);
        let line = md
            .lines()
            .find(|l| l.starts_with("| `") && l.contains("akerd.toml"))
            .unwrap_or_else(|| panic!("{md}"));
        for cell in [
            "| 2 | 100 | 2 | Learned | false | 2 (64 centroids) |",
            "| guarded (α_L = 1.1",
            "| SecondChance | graph HNSW m 4, efc 8, efs 16 | 256 MiB |",
        ] {
            assert!(line.contains(cell), "{cell}: {line}");
        }
        assert!(md.contains("rebalances every 2000 searches"), "{md}");
        assert!(
            md.contains("Pools (objects, ids only): 1%, config."),
            "{md}"
        );
    }

    #[test]
    fn faithfulness_flags_cells_off_by_more_than_two_points() {
        let rows = vec![
            row("aker-bf", Some((0.01, 10)), 0.3, 150, 0.956),
            row("aker-bf", Some((0.05, 50)), 0.99, 600, 0.932),
        ];
        let f = faithfulness(&rows, "glove");
        assert_eq!(f.lines().count(), 4, "{f}");
        assert!(f.lines().nth(2).unwrap().contains("| yes |"), "{f}");
        assert!(f.lines().nth(3).unwrap().contains("**no**"), "{f}");
        assert!(faithfulness(&rows, "other").is_empty());
    }

    fn summary(name: &str, bases: BasesOrigin) -> DatasetSummary {
        DatasetSummary {
            name: name.into(),
            description: "d".into(),
            bases,
            collection: 100,
            dim: 8,
            metric: Metric::L2Sq,
            members: 50,
            truth: "t".into(),
            skews: vec![],
            hnsw: None,
            filter_checks: vec![],
            phases: vec![],
        }
    }

    #[test]
    fn the_report_says_where_the_bases_came_from_and_why_a_set_has_no_faithfulness_check() {
        let rows = vec![row("aker-bf", Some((0.01, 10)), 0.3, 150, 0.956)];
        let paper = BasesOrigin::HeldOut(crate::prepare::HELD_OUT);
        let queries = BasesOrigin::Queries {
            path: "q.fvecs".into(),
            n: 20,
        };
        let section = |d: &DatasetSummary| {
            let mut s = String::new();
            faithfulness_section(&mut s, d, &rows);
            s
        };
        let glove = section(&summary("glove", paper.clone()));
        assert!(
            glove.starts_with("### Faithfulness") && glove.contains("| yes |"),
            "{glove}"
        );
        let other = section(&summary("synthetic", paper.clone()));
        assert!(
            other.contains("only for GloVe") && !other.contains('|'),
            "{other}"
        );
        assert_eq!(other.lines().count(), 2, "one sentence: {other}");
        let own = section(&summary("glove", queries.clone()));
        assert!(
            own.contains("no faithfulness check") && !own.contains('|'),
            "{own}"
        );
        let mut s = String::new();
        faithfulness_section(&mut s, &summary("glove", paper), &[]);
        assert!(s.starts_with("No faithfulness check"), "{s}");

        let h = Header {
            command: "bench recall".into(),
            seeds: "s".into(),
            k: 10,
            delta: 0,
            filter_candidates: 1,
            standby_search: shards::StandbySearch::Nearest,
            shards: 1,
            potluck: (1.1, 0.5),
            requests: 1000,
            pools: vec![PoolSpec::Share(0.01)],
            akerd: None,
            backends: vec!["exact".into()],
            threads: 1,
            total_seconds: 1.0,
            floors: vec![],
            floor_sample: 0.05,
            floor_window: 5000,
            phase: None,
        };
        let md = markdown(
            &h,
            &[
                summary("glove", BasesOrigin::HeldOut(1_000)),
                summary("sift", queries),
            ],
            &rows,
        );
        assert!(
            md.contains("d; group bases: 1,000 rows held out of the data set (the rest is the collection); collection 100 x 8-d"),
            "{md}"
        );
        assert!(
            md.contains("d; group bases: the first 20 rows of q.fvecs (--queries); the whole data set is the collection; collection 100 x 8-d"),
            "{md}"
        );
        assert!(
            md.contains("this data set has no faithfulness check"),
            "{md}"
        );
    }
}
